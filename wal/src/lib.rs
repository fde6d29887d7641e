//! A per-shard write-ahead log of opaque records.
//!
//! The log knows nothing of queues or messages: a record is a byte string, and the log
//! numbers records with an [`Lsn`] (1, 2, 3, … per log, never reused). That is all a
//! shard's state machine needs to replay, and all a replication layer needs to ship.
//!
//! # The pieces
//!
//! - [`Wal`] is the writer, owned by one thread (the shard's). [`Wal::append`] frames a
//!   record into a buffer and returns its lsn at once; [`Wal::submit`] hands what was
//!   appended to the log's **syncer thread**, which writes it and calls `fdatasync`. The
//!   owner never waits for the disk: it reads [`Wal::durable`] (an atomic) and is woken
//!   by [`Options::on_progress`] after every fsync, so it can release the answers that
//!   waited on it. [`Wal::sync`] blocks, for tests and shutdown.
//! - **Group commit**, as RabbitMQ's Ra WAL and LavinMQ's persister do it: one fsync in
//!   flight; the first submit wakes the syncer; whatever is submitted while it writes
//!   and syncs goes in its next round, whole. No timer: a round is as large as what
//!   arrived during the previous one.
//! - [`Wal::open`] is recovery: it locks the directory, checks every frame of every
//!   segment, hands the records from a given lsn on to a callback, cuts a torn tail
//!   (reported in [`RecoveryReport::torn`], not an error) and refuses, with
//!   [`WalError::Corrupt`] naming file and byte offset, any other damage, and any record
//!   the callback refuses. It plans before it acts: a log it refuses is left on the disk
//!   as it was found. A snapshot past the log's end (a follower's, from its leader)
//!   covers the whole log, which starts again after it.
//! - Compaction: the owner writes a snapshot of its state with [`write_snapshot`] (temp
//!   file, fsync, rename, directory fsync), then [`Wal::remove_before`] removes the
//!   segments it covers; or hands both to the log with [`Wal::submit_snapshot`]. The
//!   log's **compactor thread** writes such snapshots and removes segments once the
//!   syncer made their records durable, so that neither holds up the next fsync. It
//!   keeps up to two removed segments as spares, which later rolls recycle, and unlinks
//!   the rest (see "On disk"). [`latest_snapshot`] reads the snapshot back at the next
//!   start, and replay starts after its lsn. Disk use follows what the snapshot and the
//!   live records hold, plus the spares.
//! - [`Storage`] and [`StorageFile`] are the only way to the disk: [`DiskStorage`] is
//!   `std::fs`; [`MemDisk`] is a fake disk as unkind as the assumptions below allow, for
//!   crash tests: on [`MemDisk::crash`] it keeps what was synced plus any subset of the
//!   unsynced sectors (the others perhaps garbled) and of the unsynced directory
//!   operations, and it fails fsyncs (dropping their dirty data), reads, removes and
//!   writes into a full disk on demand.
//! - **Rewriting the tail**, as a Raft follower must where its log conflicts with its
//!   leader's: [`Wal::truncate_after`] discards every record after an lsn, and
//!   [`Wal::install_snapshot`] writes a leader's snapshot and goes on after it, past the
//!   log's end if need be. Both block until what they did is durable. [`Wal::read`]
//!   reads durable records back, as a leader sends them to a follower that is behind.
//! - A [`Probe`] ([`Wal::probe`]) reads from any thread what the log owes the disk and
//!   whether it refuses changes for it: for metrics and health checks.
//!
//! # On disk
//!
//! A log's directory holds segments named `<first lsn, 20 digits>.wal`, each preallocated
//! to [`Options::segment_bytes`] with `fallocate` (a metadata operation: no zeros are
//! written, and a full disk shows when a segment is created, where the append that needs
//! it can fail whole, rather than in a write after the append was accepted). Frames are
//! described in `frame.rs`: crc32c (Castagnoli, hardware-accelerated on x86-64 and ARMv8)
//! over the length, the lsn, the first lsn of the write, and the payload, seeded with the
//! log's identity and the segment's first lsn; 8-byte aligned. The identity is a random
//! number drawn when the log is made and kept in `wal.id` (see `ident.rs`), so that no
//! bytes a record holds, and no frame of another log or of a segment's last use, check out
//! as a frame of this segment. A log found with segments and no `wal.id` was written by
//! the first format, whose crcs are unseeded, and is read and written as such.
//! A write ends with an all-zero header, which the next write overwrites: it ends the
//! data (in a segment made by the running log, the zeros already there do).
//!
//! **Recycling.** Unlinking a preallocated segment takes milliseconds on ext4 and stalls
//! concurrent fsyncs behind its journal commit; appends into fresh `fallocate`d blocks
//! make each fsync commit metadata too. So the compactor renames up to two removed
//! segments to `<n, 20 digits>.spare` (and syncs the directory), and the next rolls
//! rename a spare to the new segment's name instead of creating one: its appends
//! overwrite blocks its last use wrote, and their fsyncs flush data only. A recycled
//! segment still holds the frames of its last use past its own records; their lsns are
//! all below the segment's first (the compactor took it once they were covered), so a
//! scan stops at them as at damage and never takes one for a record, and recovery
//! tells a torn write from the end of the data by frames with an lsn at or past the one
//! due. Spares found at a start are removed: after a crash one may hold frames of lost
//! writes, whose lsns the log reuses.
//!
//! **Truncation.** A truncation never writes over durable records. It removes the
//! segments that begin after the lsn it keeps (newest first, each removal synced, so that
//! a crash leaves a prefix of the log), then makes a new segment for the next lsn under a
//! temporary name and renames it into place, synced. That segment is the truncation's
//! record: a segment's records are read only up to where the next segment begins, so the
//! discarded records left in the segment before it are never read again, and no record is
//! ever written over them (were one written there, a discarded frame just after it could
//! pass for the next record). Recovery keeps an empty last segment that supersedes
//! records as the segment to append to, and removes a temporary one a crash left.
//!
//! # Durability rules
//!
//! - A record is durable when [`Wal::durable`] is at or past its lsn; never before.
//! - A new segment's directory entry is synced before the first record in it counts as
//!   durable; the previous segment's records are synced before the new one is written,
//!   so only the last segment with data can hold an unsynced write at a crash.
//! - A failed write or fsync **poisons** the log: that error, and nothing else, comes
//!   back from every later call, and nothing is retried (after a failed fsync the page
//!   cache may already have dropped the data: PostgreSQL's "fsyncgate"). The syncer then
//!   leaves a marker, `wal.poisoned`, with the last durable lsn, and the next
//!   [`Wal::open`] cuts every record after it, though the page cache may still show it.
//! - A full disk when a segment must be created fails that append whole, without
//!   poisoning. A segment file left by such a failed creation is made anew by the next
//!   roll into it. A write that a full disk refuses inside a segment's preallocated space
//!   (a copy-on-write file system needs new blocks there too) poisons nothing either: the
//!   syncer makes it again, whole, once there is room, and [`Wal::reserve`] refuses
//!   changes with [`WalError::NoSpace`] meanwhile.
//! - What waits for the disk is bounded: [`Wal::reserve`] refuses a change whole with
//!   [`WalError::Behind`] while more than [`Options::max_unsynced_bytes`] are appended and
//!   not durable, or once an fsync has run past [`Options::stall_after`]; the log is not
//!   poisoned, and takes changes again once the disk catches up.
//! - Dropping the log waits for its threads to finish what was submitted, at most
//!   [`Options::close_wait`]: past it (an fsync that hangs) the log is poisoned, so its
//!   threads write nothing more when the fsync returns, and the drop returns; the
//!   directory stays locked until they end.
//! - Each round's frames end with a filler frame up to the next 512-byte boundary, so no
//!   write rewrites a sector that holds durable data. A piece the owner placed where the
//!   round ended moves past the filler as it is submitted; appends leave room for that at
//!   the end of a segment.
//!
//! # What the log assumes of the disk
//!
//! - `fdatasync` that returns success has made the file's data written before it
//!   durable. One that fails may have lost it, and the page cache may still show it (see
//!   the poison marker above).
//! - `fsync` of a directory makes its entries durable: files and directories created,
//!   renamed or removed in it. Until then a crash may keep or lose each of them. A rename
//!   within a directory is atomic.
//! - A write that a power loss cuts short may leave each 512-byte sector it was writing
//!   old, new or garbled, in any pattern; sectors it was not writing are untouched. A
//!   device whose atomic unit is larger (4 KiB sectors it rewrites whole) must not damage
//!   what lies outside the bytes written, or have power-loss protection.
//! - A read that fails says so: recovery then fails the open with [`WalError::Io`],
//!   changing nothing, and never takes the bytes it could not read for a torn tail.
//! - Data once synced reads back as written. Damage to it is found by its crc and refused
//!   as corruption, naming file and offset, with one exception: damage to the last write
//!   cannot be told from that write torn by a crash, and is cut and reported as a torn
//!   tail (a later write's frames make damage before them corruption).
//! - A write refused for want of space left nothing durable and dropped nothing, so it
//!   can be made again: `fallocate` reserves space on most file systems, and where it
//!   does not (copy-on-write), the write waits for room.
//!
//! ```
//! use std::sync::Arc;
//! use leasemq_wal::{Lsn, MemDisk, Options, Wal};
//!
//! let disk = Arc::new(MemDisk::new());
//! let dir = std::path::Path::new("/data/shard-0");
//! let (mut wal, report) = Wal::open(disk.clone(), dir, Options::default(), Lsn(1), |_, _| Ok(()))?;
//! assert_eq!(report.next_lsn, Lsn(1));
//! let lsn = wal.append(b"put jobs 17")?;
//! wal.submit()?;                 // the syncer writes and fsyncs it
//! wal.sync()?;                   // (or wait for on_progress and read durable())
//! assert!(wal.durable() >= lsn);
//! drop(wal);
//!
//! let mut replayed = Vec::new();
//! let (_wal, _) = Wal::open(disk, dir, Options::default(), Lsn(1), |lsn, payload| {
//!     replayed.push((lsn, payload.to_vec()));
//!     Ok(())
//! })?;
//! assert_eq!(replayed, vec![(Lsn(1), b"put jobs 17".to_vec())]);
//! # Ok::<(), leasemq_wal::WalError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod frame;
mod ident;
mod mem;
mod poison;
mod probe;
mod recover;
mod segment;
mod snapshot;
mod storage;
mod syncer;
mod wal;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use error::WalError;
pub use mem::{Crash, MemDisk, SECTOR};
pub use probe::{Lag, Probe};
pub use recover::{RecoveryReport, TornTail};
pub use snapshot::{latest_snapshot, write_snapshot, Snapshot};
pub use storage::{create_dir_durable, DirLock, DiskStorage, Storage, StorageFile, LOCK_FILE};
pub use wal::Wal;

/// Room [`Wal::reserve`] counts for each record beyond the first: its frame's header and
/// padding.
pub const RESERVE_SLACK: usize = 64;

/// The highest lsn a file name may carry: no log reaches 2^63 records, so a segment or
/// snapshot named past it is damage (and lsn arithmetic on it could overflow).
pub(crate) const MAX_NAMED_LSN: u64 = i64::MAX as u64;

/// A record's log sequence number: 1 for a log's first record, one more for each next.
/// `Lsn(0)` stands for "no record".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How a log is laid out and whom it tells of progress.
#[derive(Clone)]
pub struct Options {
    /// The size of each segment file, preallocated when it is created; a multiple of 8.
    /// Default 64 MiB.
    pub segment_bytes: u64,
    /// The largest payload an append takes. A record whose frame is larger than a
    /// segment gets a segment of its own, of its size. Default 16 MiB.
    pub max_record_bytes: usize,
    /// Called on the syncer thread after each round of fsyncs (when [`Wal::durable`] may
    /// have moved) and when the log is poisoned. Keep it short: wake the owner.
    pub on_progress: Option<Arc<dyn Fn() + Send + Sync>>,
    /// How long dropping the log waits for its threads to finish what was submitted.
    /// Past it (an fsync that hangs) the drop returns: the log is poisoned, so that its
    /// threads write nothing more once the fsync returns, and the directory stays locked
    /// until they end. Default 30 s.
    pub close_wait: Duration,
    /// The most bytes appended and not yet durable: past it, [`Wal::reserve`] refuses with
    /// [`WalError::Behind`] until the syncer catches up, so that a slow or hung disk
    /// bounds what waits in memory. Default 64 MiB.
    pub max_unsynced_bytes: u64,
    /// How long an fsync may run before [`Wal::reserve`] refuses with
    /// [`WalError::Behind`], saying how long it has hung. Default 10 s.
    pub stall_after: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            segment_bytes: 64 << 20,
            max_record_bytes: 16 << 20,
            on_progress: None,
            close_wait: Duration::from_secs(30),
            max_unsynced_bytes: 64 << 20,
            stall_after: Duration::from_secs(10),
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("segment_bytes", &self.segment_bytes)
            .field("max_record_bytes", &self.max_record_bytes)
            .field("on_progress", &self.on_progress.is_some())
            .field("close_wait", &self.close_wait)
            .field("max_unsynced_bytes", &self.max_unsynced_bytes)
            .field("stall_after", &self.stall_after)
            .finish()
    }
}

impl Options {
    fn check(&self) -> Result<(), WalError> {
        let why = if !self.segment_bytes.is_multiple_of(8) {
            "segment_bytes must be a multiple of 8"
        } else if u32::try_from(self.max_record_bytes).is_err() {
            "max_record_bytes must fit in 32 bits"
        } else if self.segment_bytes == 0 {
            "segment_bytes must not be zero"
        } else {
            return Ok(());
        };
        Err(WalError::InvalidOptions(format!(
            "{why} (segment_bytes {}, max_record_bytes {})",
            self.segment_bytes, self.max_record_bytes
        )))
    }
}
