//! [`Wal`]: the writer, owned by one thread.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::frame;
use crate::recover::{self, RecoveryReport};
use crate::segment::{self, Segment};
use crate::storage::Storage;
use crate::syncer::{self, Piece, Shared};
use crate::{Lsn, Options, WalError};

/// A write-ahead log, open for appending; see the [crate docs](crate).
///
/// Owned by one thread. Appends are buffered; [`submit`](Wal::submit) hands them to the
/// log's syncer thread, which writes and fsyncs them while the owner goes on. Dropping
/// the log lets the syncer finish what was submitted, then joins it; what was appended
/// but not submitted is dropped.
pub struct Wal {
    shared: Arc<Shared>,
    /// The log's identity, which its new segments' frames are sealed with (see `ident`).
    log: u64,
    syncer: Option<JoinHandle<()>>,
    /// Writes snapshots and removes segments, off the syncer's path (see `syncer`).
    compactor: Option<JoinHandle<()>>,
    max_record_bytes: usize,
    /// Every live segment, oldest first; the last is the one appended to.
    segments: VecDeque<Arc<Segment>>,
    /// Where the next frame goes in the last segment.
    pos: u64,
    /// Appended, not yet submitted.
    pending: Vec<Piece>,
    next_lsn: u64,
    /// The current segment was created and nothing was appended to it yet.
    fresh: bool,
    /// The current segment's preallocated size.
    capacity: u64,
    /// How long a drop waits for the threads ([`Options::close_wait`]).
    close_wait: std::time::Duration,
    /// See [`Options::max_unsynced_bytes`].
    max_unsynced_bytes: u64,
    /// See [`Options::stall_after`].
    stall_after: std::time::Duration,
}

impl Wal {
    /// Opens (or creates) the log in `dir`: takes the directory's lock, recovers, calls
    /// `replay` with every record from lsn `from` on, in order, and starts the syncer.
    ///
    /// Records before `from` (covered by a snapshot, in segments not yet removed) are
    /// checked but not replayed. A torn tail is cut and described in the report. Segments
    /// replay needs nothing of are removed: those before a gap below `from` (a removal a
    /// crash cut short), and all of them when the log ends before `from` (a snapshot past
    /// its end, as a follower installs from its leader), the log then starting again at
    /// `from`. Nothing on the disk changes until every check has passed.
    /// `replay` sees each record as soon as its frame checks out, before later segments
    /// are read: if `open` then fails, the caller discards what it replayed. A record
    /// `replay` refuses (its `Err` says why) is damage too: `open` stops there and fails
    /// with [`WalError::Corrupt`] naming its file and offset.
    ///
    /// # Errors
    ///
    /// [`WalError::Locked`] if another opener holds the directory;
    /// [`WalError::Corrupt`] naming file and offset for a damaged record anywhere but
    /// the torn tail, an lsn gap at or after `from`, or a log that starts after `from`;
    /// [`WalError::InvalidOptions`]; [`WalError::Io`] if the storage fails.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        options: Options,
        from: Lsn,
        mut replay: impl FnMut(Lsn, &[u8]) -> Result<(), String>,
    ) -> Result<(Wal, RecoveryReport), WalError> {
        options.check()?;
        crate::storage::create_dir_durable(&*storage, dir)
            .map_err(|e| WalError::io(dir, "create directory", e))?;
        let lock = storage.lock(dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                WalError::Locked { path: dir.into() }
            } else {
                WalError::io(dir, "lock", e)
            }
        })?;
        let recovered = recover::recover(&*storage, dir, &options, from.0, &mut replay)?;
        let next_lsn = recovered.report.next_lsn.0;
        let shared = Arc::new(Shared::new(
            storage,
            dir.to_path_buf(),
            lock,
            options.segment_bytes,
            next_lsn - 1,
            options.on_progress.clone(),
        ));
        let capacity = recovered
            .segments
            .back()
            .map_or(options.segment_bytes, |s| s.capacity);
        let mut wal = Wal {
            shared,
            log: recovered.log,
            syncer: None,
            compactor: None,
            max_record_bytes: options.max_record_bytes,
            segments: recovered.segments,
            pos: recovered.pos,
            pending: Vec::new(),
            next_lsn,
            fresh: false,
            capacity,
            close_wait: options.close_wait,
            max_unsynced_bytes: options.max_unsynced_bytes,
            stall_after: options.stall_after,
        };
        // On an error here, dropping `wal` stops and joins what was started.
        let compactor = spawn(&wal.shared, "compactor", syncer::run_compactor);
        wal.compactor = Some(compactor.map_err(|e| WalError::io(dir, "spawn the compactor", e))?);
        let syncer = spawn(&wal.shared, "sync", syncer::run);
        wal.syncer = Some(syncer.map_err(|e| WalError::io(dir, "spawn the syncer", e))?);
        Ok((wal, recovered.report))
    }

    /// Appends a record and returns its lsn. Nothing is written yet: the record is
    /// framed into a buffer, which [`submit`](Wal::submit) hands to the syncer.
    ///
    /// When the record does not fit in the current segment, the next one is started here,
    /// on the caller's thread (no fsync: the syncer does that): a spare the compactor set
    /// aside is renamed, or a new segment is created and preallocated. A record larger
    /// than a segment gets a new segment of its own size.
    ///
    /// # Errors
    ///
    /// [`WalError::TooLarge`] for a payload over the limit; [`WalError::NoSpace`] if a
    /// new segment was needed and the disk is full: in both cases nothing was appended
    /// and the log goes on. [`WalError::Io`] if creating a segment failed otherwise; the
    /// poisoning error once the log is poisoned.
    pub fn append(&mut self, payload: &[u8]) -> Result<Lsn, WalError> {
        self.check()?;
        if payload.len() > self.max_record_bytes {
            return Err(WalError::TooLarge {
                len: payload.len(),
                max: self.max_record_bytes,
            });
        }
        let size = frame::frame_len(payload.len()) as u64;
        // Room is left for a filler the last round may have ended with (see `submit`).
        if self.pos + size + frame::MAX_FILLER > self.capacity {
            self.roll(size)?;
        }
        let lsn = self.next_lsn;
        let current = Arc::clone(self.current());
        let piece = match self.pending.last_mut() {
            Some(piece) if Arc::ptr_eq(&piece.segment, &current) => piece,
            _ => {
                let bytes = self.shared.take_buffer();
                self.pending.push(Piece {
                    segment: current,
                    offset: self.pos,
                    bytes,
                    first: lsn,
                    last: lsn,
                    // The first piece of a segment has its directory entry synced.
                    new_segment: std::mem::take(&mut self.fresh),
                });
                self.pending.last_mut().expect("just pushed")
            }
        };
        frame::push_unsealed(&mut piece.bytes, lsn, payload);
        piece.last = lsn;
        self.pos += size;
        self.next_lsn += 1;
        Ok(Lsn(lsn))
    }

    /// Makes room for appends of `bytes` payload bytes in all (as records of any sizes
    /// adding up to it, plus [`RESERVE_SLACK`](crate::RESERVE_SLACK) per record beyond the
    /// first): starts the next segment now if the current one is too full, so that those
    /// appends cannot fail for want of space. Lets an owner refuse a change whole, before
    /// applying it, when the disk is full.
    ///
    /// # Errors
    ///
    /// [`WalError::NoSpace`] when the disk is full (nothing changed, the log goes on); the
    /// poisoning error once the log is poisoned; [`WalError::Io`] if creating the segment
    /// failed otherwise.
    pub fn reserve(&mut self, bytes: usize) -> Result<(), WalError> {
        self.check()?;
        let size = frame::frame_len(bytes) as u64;
        // A write waits for room on a full disk: the change is refused as one would be
        // that needs a new segment.
        let gauges = &self.shared.gauges;
        if gauges.no_space.load(std::sync::atomic::Ordering::Relaxed) {
            let path = self.current().path.clone();
            return Err(WalError::NoSpace { path });
        }
        // A disk that does not keep up refuses the change, rather than let what waits
        // for it grow without bound.
        let (submitted, running) = gauges.backlog();
        let pending: u64 = self.pending.iter().map(|p| p.bytes.len() as u64).sum();
        let unsynced = submitted + pending;
        let stalled = running.filter(|&d| d > self.stall_after);
        if unsynced + size > self.max_unsynced_bytes || stalled.is_some() {
            return Err(WalError::Behind { unsynced, stalled });
        }
        if self.pos + size + frame::MAX_FILLER > self.capacity {
            self.roll(size)?;
        }
        Ok(())
    }

    /// Hands everything appended so far to the syncer, without waiting. If the syncer is
    /// idle it starts a round at once; if an fsync is in flight, these records go in the
    /// next round, with whatever else is submitted before that one starts.
    ///
    /// # Errors
    ///
    /// The poisoning error once the log is poisoned.
    pub fn submit(&mut self) -> Result<(), WalError> {
        self.check()?;
        if !self.pending.is_empty() {
            // Past the filler the last round ended with, if this starts where it did.
            self.pos += self.shared.submit(&mut self.pending, Vec::new());
        }
        Ok(())
    }

    /// Submits, then blocks until everything appended is durable and queued segment
    /// removals are done; returns the durable lsn. For tests and shutdown: the owner's
    /// hot path uses [`submit`](Wal::submit) and [`durable`](Wal::durable).
    ///
    /// # Errors
    ///
    /// The poisoning error, if a write or fsync failed.
    pub fn sync(&mut self) -> Result<Lsn, WalError> {
        self.submit()?;
        self.shared.wait_idle()?;
        Ok(self.durable())
    }

    /// The last lsn known to be on disk: every record up to it is durable. Never blocks.
    pub fn durable(&self) -> Lsn {
        Lsn(self.shared.durable())
    }

    /// The lsn of the last record appended, `Lsn(0)` if none ever was.
    pub fn last_appended(&self) -> Lsn {
        Lsn(self.next_lsn - 1)
    }

    /// `Ok` while the log works; the poisoning error once a write or fsync failed.
    ///
    /// # Errors
    ///
    /// The error that poisoned the log.
    pub fn check(&self) -> Result<(), WalError> {
        match self.shared.error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Removes the segments whose records all lie before `lsn` (the owner has a durable
    /// snapshot covering them) and are durable; the segment appended to is never removed.
    /// The compactor removes the files (setting up to two aside as spares for recycling)
    /// and syncs the directory after the syncer's current round. Returns how many segments
    /// go.
    ///
    /// # Errors
    ///
    /// The poisoning error once the log is poisoned.
    pub fn remove_before(&mut self, lsn: Lsn) -> Result<usize, WalError> {
        self.check()?;
        let bound = lsn.0.min(self.shared.durable() + 1);
        let mut removals = Vec::new();
        while self.segments.len() > 1 && self.segments[1].first_lsn <= bound {
            let segment = self.segments.pop_front().expect("more than one segment");
            removals.push(segment);
        }
        let n = removals.len();
        if n > 0 {
            self.shared.submit(&mut Vec::new(), removals);
        }
        Ok(n)
    }

    /// Submits what was appended, then has the log's compactor write `data` as the
    /// snapshot at the last appended lsn once every record up to it is durable (temp file,
    /// fsync, rename, directory fsync, as [`write_snapshot`](crate::write_snapshot)), and
    /// then remove the segments it covers. Returns that lsn at once: the owner goes on
    /// appending, and the syncer syncing, while the compactor writes. A later call before
    /// the compactor got to it replaces the snapshot.
    ///
    /// # Errors
    ///
    /// The poisoning error once the log is poisoned. A failed snapshot write poisons it,
    /// except one the disk has no room for: that snapshot is left out, and
    /// [`take_skipped_snapshot`](Wal::take_skipped_snapshot) says so.
    pub fn submit_snapshot(&mut self, data: Vec<u8>) -> Result<Lsn, WalError> {
        self.check()?;
        let lsn = self.next_lsn - 1;
        let mut removals = Vec::new();
        while self.segments.len() > 1 && self.segments[1].first_lsn <= lsn + 1 {
            let segment = self.segments.pop_front().expect("more than one segment");
            removals.push(segment);
        }
        let moved = (self.shared).submit_with(&mut self.pending, Some((lsn, data)), removals);
        self.pos += moved;
        Ok(Lsn(lsn))
    }

    /// Why a snapshot handed over by [`submit_snapshot`](Wal::submit_snapshot) was left
    /// out since the last call, if one was: the disk had no room for it
    /// ([`WalError::NoSpace`]). The log goes on, and keeps the segments it would have
    /// covered until a later snapshot is written.
    pub fn take_skipped_snapshot(&self) -> Option<WalError> {
        self.shared.take_skipped_snapshot()
    }

    /// Discards every record after `lsn`: the next append gets `lsn + 1`, as a Raft
    /// follower rewrites the tail of its log where it conflicts with its leader's.
    /// Nothing to discard (`lsn` at or past the last record appended) changes nothing.
    ///
    /// Blocks until the truncation is durable. What was appended is made durable first.
    /// Then the segments that begin after `lsn` are removed, newest first, each removal
    /// synced, so that a crash leaves a prefix of the log; and a new segment for `lsn + 1`
    /// is made and synced into the directory. It marks the truncation: a segment's records
    /// are read only up to where the next segment begins, so those the truncation
    /// discarded in the segment holding `lsn` are never read again, and records are never
    /// again written over them. A snapshot handed over at an lsn after `lsn` must not be
    /// (a log truncates only what no snapshot covers).
    ///
    /// # Errors
    ///
    /// [`WalError::InvalidOptions`] if `lsn` lies before the log's first live record,
    /// whose segment a snapshot let go; [`WalError::NoSpace`] if the new segment found no
    /// room: nothing was discarded, and the log goes on. The poisoning error once the log
    /// is poisoned; an IO error on the way poisons it.
    pub fn truncate_after(&mut self, lsn: Lsn) -> Result<(), WalError> {
        self.check()?;
        if lsn.0 >= self.next_lsn - 1 {
            return Ok(());
        }
        let first = self.segments.front().map_or(1, |s| s.first_lsn);
        if lsn.0 + 1 < first {
            return Err(WalError::InvalidOptions(format!(
                "cannot truncate after lsn {}: the log's first live record is {first}",
                lsn.0
            )));
        }
        self.sync()?;
        // Made first, under a temporary name, so that a full disk discards nothing.
        let mut segment = self.new_segment(lsn.0 + 1, segment::TRUNCATING_SUFFIX)?;
        let shared = Arc::clone(&self.shared);
        let (storage, dir) = (shared.storage(), shared.dir().to_path_buf());
        let step = |what: &'static str, path: &Path, result: std::io::Result<()>| {
            result.map_err(|e| shared.poison_quietly(WalError::io(path, what, e)))
        };
        while self.segments.back().is_some_and(|s| s.first_lsn > lsn.0) {
            let gone = self.segments.pop_back().expect("just looked");
            step("remove", &gone.path, storage.remove(&gone.path))?;
            step("sync", &dir, storage.sync_dir(&dir))?;
        }
        let path = dir.join(segment::segment_name(lsn.0 + 1));
        step(
            "rename",
            &segment.path,
            storage.rename(&segment.path, &path),
        )?;
        step("sync", &dir, storage.sync_dir(&dir))?;
        segment.path = path;
        self.start_at(segment, lsn.0 + 1);
        Ok(())
    }

    /// Writes `data` as the snapshot at `lsn`, as a Raft follower installs its leader's:
    /// once the snapshot is durable, the records it covers go, and the log goes on after
    /// it. When `lsn` is past the last record appended, the next append gets
    /// `lsn + 1`, and every segment goes (a crash before they are gone leaves a snapshot
    /// past the log's end, which [`open`](Wal::open) starts after). When the log holds
    /// records after `lsn`, they stay: a caller whose records there conflict with the
    /// snapshot's truncates them first ([`truncate_after`](Wal::truncate_after)).
    ///
    /// Blocks until the snapshot is durable; what was appended is made durable first.
    ///
    /// # Errors
    ///
    /// [`WalError::NoSpace`] if the snapshot or a new segment found no room: the log goes
    /// on without it. The poisoning error once the log is poisoned; another IO error
    /// poisons it.
    pub fn install_snapshot(&mut self, lsn: Lsn, data: &[u8]) -> Result<(), WalError> {
        self.sync()?;
        let dir = self.shared.dir().to_path_buf();
        match crate::write_snapshot(self.shared.storage(), &dir, lsn, data) {
            Ok(_) => {}
            Err(e @ WalError::NoSpace { .. }) => return Err(e),
            Err(e) => return Err(self.shared.poison_quietly(e)),
        }
        // Past the log's end, it goes on after the snapshot; at its end, as it was.
        if lsn.0 >= self.next_lsn {
            let segment = self.new_segment(lsn.0 + 1, "")?;
            let storage = self.shared.storage();
            let synced = storage.sync_dir(&dir);
            synced.map_err(|e| (self.shared).poison_quietly(WalError::io(&dir, "sync", e)))?;
            self.start_at(segment, lsn.0 + 1);
        }
        self.remove_before(Lsn(lsn.0 + 1))?;
        Ok(())
    }

    /// A new segment, preallocated, for records from `first_lsn` on, in a file named as
    /// that segment's with `suffix`; its directory entry is not synced.
    fn new_segment(&self, first_lsn: u64, suffix: &str) -> Result<Segment, WalError> {
        let storage = self.shared.storage();
        let dir = self.shared.dir();
        let made = recover::create_segment_named(
            storage,
            dir,
            self.log,
            first_lsn,
            self.shared.segment_bytes(),
            suffix,
        );
        made.map_err(|e| match e {
            WalError::NoSpace { .. } => e,
            e => self.shared.poison_quietly(e),
        })
    }

    /// Makes `segment`, synced into the directory, the one appended to, and `next` the
    /// next lsn; every record before `next` is durable.
    fn start_at(&mut self, segment: Segment, next: u64) {
        self.pending.clear();
        self.capacity = segment.capacity;
        self.segments.push_back(Arc::new(segment));
        self.pos = 0;
        self.fresh = false;
        self.next_lsn = next;
        self.shared.restart_at(next);
    }

    /// Reads back the records from `from` up to `to` (not included), in order: what a
    /// Raft leader sends a follower that is behind, or what a follower replays. Every
    /// record asked for must be durable, and not in a segment a snapshot let go.
    ///
    /// It reads the segments that hold them from the disk (the page cache, mostly). A
    /// read marks one record in 64 of those it passes with where it begins, so that later
    /// reads of a segment start and stop within 64 records of what they want; the first
    /// read of a segment scans it from its start. A caller that reads the same records
    /// often keeps them in memory.
    ///
    /// # Errors
    ///
    /// [`WalError::InvalidOptions`] for a range that is not durable yet, or begins before
    /// the first live record; [`WalError::Corrupt`], naming file and offset, for a record
    /// damaged since it was written; [`WalError::Io`] if a read fails (the log goes on).
    pub fn read(&self, from: Lsn, to: Lsn) -> Result<Vec<(Lsn, Vec<u8>)>, WalError> {
        let first = self.segments.front().map_or(1, |s| s.first_lsn);
        let durable = self.durable().0;
        if from.0 < first || to.0 > durable + 1 || from.0 > to.0 {
            return Err(WalError::InvalidOptions(format!(
                "cannot read records {}..{}: the log holds {first}..={durable} durably",
                from.0, to.0
            )));
        }
        let mut records = Vec::with_capacity((to.0 - from.0) as usize);
        // The segment holding `from`, and those after it, while records are wanted.
        let start = self.segments.partition_point(|s| s.first_lsn <= from.0);
        for (i, segment) in self.segments.iter().enumerate().skip(start.max(1) - 1) {
            let next = records
                .last()
                .map_or(from.0, |(lsn, _): &(Lsn, _)| lsn.0 + 1);
            if next >= to.0 {
                break;
            }
            // A segment's records end where the next one begins (a truncation may have
            // left discarded ones after them).
            let ends = (self.segments.get(i + 1)).map_or(to.0, |s| s.first_lsn.min(to.0));
            let len = if i == self.segments.len() - 1 {
                self.pos
            } else {
                segment.extent()
            };
            read_segment(segment, len, (next, ends), &mut records)?;
        }
        Ok(records)
    }

    /// A probe that reads, from any thread, how far the disk is behind this log.
    pub fn probe(&self) -> crate::Probe {
        crate::Probe::new(&self.shared.gauges, self.stall_after)
    }

    /// The paths of the live segments, oldest first.
    pub fn segments(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|s| s.path.clone()).collect()
    }

    fn current(&self) -> &Arc<Segment> {
        self.segments.back().expect("a log has a segment")
    }

    /// Starts a new segment for the next record, whose frame is `frame` bytes: one of
    /// [`Options::segment_bytes`](crate::Options::segment_bytes), or just large enough
    /// for a frame larger than that.
    fn roll(&mut self, frame: u64) -> Result<(), WalError> {
        if self.pos == 0 {
            // Nothing is in the current segment: grow it rather than leave it empty behind
            // a new one, which would be named by the same first lsn.
            let current = self.current();
            return match current.file.allocate(frame) {
                Ok(()) => {
                    current.grown_to.store(frame, Ordering::Relaxed);
                    self.capacity = frame;
                    Ok(())
                }
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => Err(WalError::NoSpace {
                    path: current.path.clone(),
                }),
                Err(e) => Err(WalError::io(&current.path, "fallocate", e)),
            };
        }
        let segment_bytes = self.shared.segment_bytes();
        let spare = (frame <= segment_bytes)
            .then(|| self.shared.take_spare())
            .flatten();
        let segment = match spare {
            Some(spare) => recover::recycle_segment(
                self.shared.storage(),
                self.shared.dir(),
                self.log,
                &spare,
                self.next_lsn,
                segment_bytes,
            )?,
            None => recover::create_segment(
                self.shared.storage(),
                self.shared.dir(),
                self.log,
                self.next_lsn,
                segment_bytes.max(frame),
            )?,
        };
        self.capacity = segment.capacity;
        self.segments.push_back(Arc::new(segment));
        self.pos = 0;
        self.fresh = true;
        Ok(())
    }
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.shared.dir())
            .field("segments", &self.segments.len())
            .field("last_appended", &self.last_appended())
            .field("durable", &self.durable())
            .finish_non_exhaustive()
    }
}

/// Appends to `records` the records `from..ends` of `segment`, whose bytes end at `len`:
/// read from the mark before `from` to the mark after `ends` (or `len`), marking the
/// records it passes (see `Segment::marks`).
fn read_segment(
    segment: &Segment,
    len: u64,
    (from, ends): (u64, u64),
    records: &mut Vec<(Lsn, Vec<u8>)>,
) -> Result<(), WalError> {
    let (due, start) = segment.mark_before(from);
    let stop = segment.mark_after(ends).map_or(len, |at| at.min(len));
    let mut buf = vec![0; stop.saturating_sub(start) as usize];
    (segment.file.read_at(&mut buf, start)).map_err(|e| WalError::io(&segment.path, "read", e))?;
    let scan = frame::scan(&buf, due, segment.seed, buf.len(), |lsn, at, payload| {
        if lsn >= ends {
            return Err(String::new());
        }
        segment.mark(lsn, start + at as u64);
        if lsn >= from {
            records.push((Lsn(lsn), payload.to_vec()));
        }
        Ok(())
    });
    if scan.next_lsn < ends {
        let detail = format!(
            "record {} cannot be read back: {:?}",
            scan.next_lsn, scan.stop
        );
        return Err(WalError::corrupt(
            &segment.path,
            start + scan.end as u64,
            detail,
        ));
    }
    Ok(())
}

/// Starts one of the log's threads, `leasemq-wal-<role>`.
fn spawn(
    shared: &Arc<Shared>,
    role: &str,
    body: fn(Arc<Shared>),
) -> std::io::Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(format!("leasemq-wal-{role}"))
        .spawn(move || body(shared))
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.shared.stop();
        // The compactor stops once it did what the syncer's last rounds handed over.
        let threads: Vec<JoinHandle<()>> = (self.syncer.take().into_iter())
            .chain(self.compactor.take())
            .collect();
        let deadline = std::time::Instant::now() + self.close_wait;
        if self.shared.wait_exited(threads.len(), deadline) {
            for thread in threads {
                // A panic would be a bug in this crate; it was printed already.
                let _ = thread.join();
            }
            return;
        }
        // An fsync hangs: the threads are left to end on their own. Poisoned, they write
        // nothing more once it returns, and the directory stays locked until they end.
        let hung = std::io::Error::other(format!(
            "the log was closed while an fsync had hung for over {:?}",
            self.close_wait
        ));
        (self.shared).poison_quietly(WalError::io(self.shared.dir(), "close", hung));
    }
}
