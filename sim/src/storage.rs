//! The storage layer of a durable run: each shard's log, written through the shipping
//! `leasemq-wal` [`Wal`] onto its own in-memory disk ([`MemDisk`]), crashed, damaged and
//! recovered at the seed's choice.
//!
//! A record is what the runtime appends per turn (`leasemq-shard`'s `ShardLog::append`):
//! a batch of the engine's [`Change`]s that starts with the log time. The `Wal` writes
//! and fsyncs on its own syncer thread; the simulator keeps that deterministic by never
//! leaving a round running behind its back: [`Disks::sync`] submits and waits for the
//! round ([`Wal::sync`]), and nothing else submits except a crash, which first stops the
//! syncer at `MemDisk`'s gate after it wrote and before it fsynced
//! ([`MemDisk::hold_syncs`]), so the written but unsynced sectors are the ones a crash
//! keeps, loses or tears.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use leasemq_engine::durable::{begin_batch, decode_batch, Change};
use leasemq_engine::Shard;
use leasemq_wal::{Crash, Lsn, MemDisk, Options, RecoveryReport, Storage, Wal, WalError};

use crate::rng::Rng;

/// Small segments, so that logs span several and a damaged record may lie in any.
const SEGMENT_BYTES: u64 = 16 << 10;
const MAX_RECORD_BYTES: usize = 1 << 20;

fn options() -> Options {
    Options {
        segment_bytes: SEGMENT_BYTES,
        max_record_bytes: MAX_RECORD_BYTES,
        ..Options::default()
    }
}

/// The directory of shard `index`'s log.
fn shard_dir(index: usize) -> PathBuf {
    PathBuf::from(format!("/data/shard-{index}"))
}

struct ShardDisk {
    disk: MemDisk,
    wal: Wal,
    /// The durable lsn before the last fsync that moved it: every record up to here was
    /// written before some later write that is on disk too, so damage to one of them
    /// cannot pass for a torn write.
    older: Lsn,
}

/// Every shard's log and disk.
pub(crate) struct Disks {
    shards: Vec<ShardDisk>,
    buf: Vec<u8>,
}

/// What a crash left of one shard's disk, before recovery.
pub(crate) struct Crashed {
    pub disk: MemDisk,
    /// The last lsn that was on disk (fsynced) at the crash.
    pub durable: Lsn,
    /// See [`ShardDisk::older`].
    pub older: Lsn,
}

/// A bit flipped in an old record: where, for the error recovery must give.
pub(crate) struct Flipped {
    pub path: PathBuf,
    /// Where the damaged record's frame starts.
    pub frame: u64,
    pub lsn: u64,
}

impl Disks {
    /// Empty logs on fresh disks.
    pub fn new(shards: usize) -> Disks {
        let shards = (0..shards)
            .map(|i| {
                let disk = MemDisk::new();
                let (wal, _) = open(&disk, i, |_, _| Ok(())).expect("a fresh log opens");
                ShardDisk {
                    disk,
                    wal,
                    older: Lsn(0),
                }
            })
            .collect();
        Disks {
            shards,
            buf: Vec::new(),
        }
    }

    /// Appends `changes` (drained) as one record of shard `shard`, stamped `log_time`;
    /// returns its lsn. Nothing reaches the disk before [`Disks::sync`].
    pub fn append(
        &mut self,
        shard: usize,
        log_time: u64,
        changes: &mut Vec<Change>,
    ) -> Result<Lsn, WalError> {
        self.buf.clear();
        begin_batch(&mut self.buf);
        Change::Clock { now: log_time }.encode(&mut self.buf);
        for change in changes.drain(..) {
            change.encode(&mut self.buf);
        }
        self.shards[shard].wal.append(&self.buf)
    }

    /// The lsn of shard `shard`'s last record, `Lsn(0)` if none.
    pub fn last_appended(&self, shard: usize) -> Lsn {
        self.shards[shard].wal.last_appended()
    }

    /// Whether shard `shard` appended records not yet on disk.
    pub fn is_behind(&self, shard: usize) -> bool {
        let wal = &self.shards[shard].wal;
        wal.last_appended() > wal.durable()
    }

    /// Writes and fsyncs what shard `shard` appended; returns the durable lsn.
    pub fn sync(&mut self, shard: usize) -> Result<Lsn, WalError> {
        let d = &mut self.shards[shard];
        let before = d.wal.durable();
        if d.wal.last_appended() == before {
            return Ok(before);
        }
        let durable = d.wal.sync()?;
        d.older = before;
        Ok(durable)
    }

    /// Crashes every disk: what was appended and not synced is written (not fsynced), or
    /// on a quarter of the disks its fsync fails, then each disk keeps all of it, none of
    /// it, or a seeded torn subset of its sectors and of its directory operations; on half
    /// the disks a sector not kept is garbled.
    /// The logs on the old disks are gone with the process.
    pub fn crash(self, seed: u64) -> Vec<Crashed> {
        let mut rng = Rng::new(seed);
        self.shards
            .into_iter()
            .map(|d| {
                let durable = d.wal.durable();
                let mut wal = d.wal;
                if wal.last_appended() > durable {
                    if rng.below(4) == 0 {
                        // Or the fsync fails, and the process stops on it, as a shard does
                        // (PostgreSQL's rule): the page cache keeps what the disk dropped.
                        d.disk.fail_next_sync();
                        wal.sync().expect_err("the failed fsync poisons the log");
                    } else {
                        d.disk.hold_syncs();
                        wal.submit().expect("a working log takes a submit");
                        d.disk.wait_for_held_sync();
                    }
                }
                let mode = match rng.below(4) {
                    0 => Crash::KeepUnsynced,
                    1 => Crash::LoseUnsynced,
                    _ => Crash::Tear {
                        seed: rng.next_u64(),
                    },
                };
                // Half the disks write sectors that a power loss may leave garbled.
                if rng.below(2) == 0 {
                    d.disk.garble_torn_sectors();
                }
                let disk = d.disk.crash(mode);
                // Its syncer, held at the gate, fails on the crashed disk and stops.
                drop(wal);
                Crashed {
                    disk,
                    durable,
                    older: d.older,
                }
            })
            .collect()
    }

    /// Logs recovered after a crash, each on its disk, with the `older` lsn it had at the
    /// crash (recovery writes no record, so only those are followed by a later write).
    pub fn resume(recovered: Vec<(MemDisk, Wal, Lsn)>) -> Disks {
        let shards = recovered
            .into_iter()
            .map(|(disk, wal, older)| ShardDisk { disk, wal, older })
            .collect();
        Disks {
            shards,
            buf: Vec::new(),
        }
    }
}

/// Opens shard `index`'s log on `disk`, calling `replay` with every record.
///
/// # Errors
///
/// What [`Wal::open`] refuses: a damaged record anywhere but the torn tail, named by file
/// and offset.
pub(crate) fn open(
    disk: &MemDisk,
    index: usize,
    replay: impl FnMut(Lsn, &[u8]) -> Result<(), String>,
) -> Result<(Wal, RecoveryReport), WalError> {
    Wal::open(
        Arc::new(disk.clone()),
        &shard_dir(index),
        options(),
        Lsn(1),
        replay,
    )
}

/// Recovers shard `index`'s log on `disk` into `engine` (fresh), as the runtime's
/// `ShardLog::recover` does.
///
/// # Errors
///
/// The log's refusal, or a record that does not decode or does not fit, as text naming
/// where.
pub(crate) fn recover(
    disk: &MemDisk,
    index: usize,
    engine: &mut Shard,
) -> Result<(Wal, RecoveryReport), String> {
    let opened = open(disk, index, |_, payload| {
        let batch = Bytes::copy_from_slice(payload);
        match decode_batch(batch, |change| engine.restore(change)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    });
    opened.map_err(|e| e.to_string())
}

/// Flips one seeded bit in one record of `crashed` (shard `shard`) at or before its
/// `older` lsn, if it has one: a record that was synced and that a later write follows.
pub(crate) fn flip_old_bit(crashed: &Crashed, shard: usize, rng: &mut Rng) -> Option<Flipped> {
    if crashed.older.0 == 0 {
        return None;
    }
    let lsn = rng.range(1, crashed.older.0);
    for path in segments_of(&crashed.disk, shard) {
        let data = crashed.disk.contents(&path)?;
        if let Some((frame, len)) = find_frame(&data, lsn) {
            let at = frame + rng.below(24 + len);
            crashed.disk.flip_bit(&path, at, rng.below(8) as u8);
            return Some(Flipped { path, frame, lsn });
        }
    }
    None
}

/// Where the frame of `lsn` starts in a segment's bytes, and its payload length (frames
/// as `leasemq-wal`'s `frame.rs` lays them out: a 24-byte header with the length at 4
/// and the lsn at 8, the payload padded to 8 bytes).
fn find_frame(data: &[u8], lsn: u64) -> Option<(u64, u64)> {
    let mut at = 0usize;
    while at + 24 <= data.len() {
        let header = &data[at..at + 24];
        if header.iter().all(|&b| b == 0) {
            return None;
        }
        let len = u64::from(u32::from_le_bytes(header[4..8].try_into().expect("4")));
        let this = u64::from_le_bytes(header[8..16].try_into().expect("8"));
        if this == lsn {
            return Some((at as u64, len));
        }
        at += 24 + (len as usize).next_multiple_of(8);
    }
    None
}

/// The segment files of shard `index`'s log on `disk`, in lsn order.
pub(crate) fn segments_of(disk: &MemDisk, index: usize) -> Vec<PathBuf> {
    let dir = shard_dir(index);
    let mut segments: Vec<PathBuf> = (Storage::list(disk, &dir).unwrap_or_default().into_iter())
        .filter(|name| name.ends_with(".wal"))
        .map(|name| dir.join(name))
        .collect();
    segments.sort();
    segments
}

/// Every file of shard `index`'s log directory on `disk`, with its bytes.
pub(crate) fn image_of(disk: &MemDisk, index: usize) -> Vec<(String, Option<Vec<u8>>)> {
    let dir = shard_dir(index);
    let mut names = Storage::list(disk, &dir).unwrap_or_default();
    names.sort();
    (names.into_iter())
        .map(|name| {
            let bytes = disk.contents(&dir.join(&name));
            (name, bytes)
        })
        .collect()
}

/// The path of shard `index`'s log directory, for messages.
pub(crate) fn dir_of(index: usize) -> PathBuf {
    shard_dir(index)
}

/// Whether an error text names `path` and `offset` as the place of damage.
pub(crate) fn names_place(error: &str, path: &Path, offset: u64) -> bool {
    error.contains(&path.display().to_string()) && error.contains(&format!("at byte {offset}"))
}
