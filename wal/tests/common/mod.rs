//! Helpers shared by the log's tests.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasemq_wal::{Lsn, MemDisk, Options, RecoveryReport, Storage, Wal, WalError};

pub const DIR: &str = "/log";

pub fn dir() -> &'static Path {
    Path::new(DIR)
}

/// Small segments, so that a few records roll them.
pub fn small(segment_bytes: u64) -> Options {
    Options {
        segment_bytes,
        max_record_bytes: segment_bytes as usize - 24,
        ..Options::default()
    }
}

pub type Records = Vec<(Lsn, Vec<u8>)>;

/// Opens the log and collects what it replays from `from`.
pub fn open_from(
    storage: Arc<dyn Storage>,
    path: &Path,
    options: Options,
    from: Lsn,
) -> Result<(Wal, Records, RecoveryReport), WalError> {
    let mut records = Vec::new();
    let (wal, report) = Wal::open(storage, path, options, from, |lsn, payload| {
        records.push((lsn, payload.to_vec()));
        Ok(())
    })?;
    Ok((wal, records, report))
}

pub fn open(disk: &MemDisk, options: Options) -> Result<(Wal, Records, RecoveryReport), WalError> {
    open_from(Arc::new(disk.clone()), dir(), options, Lsn(1))
}

/// The payload of record `n` in the tests: its length varies so frames pad differently.
pub fn payload(n: u64) -> Vec<u8> {
    let len = (n * 7 % 23) as usize;
    (0..len)
        .map(|i| (n as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

pub fn expected(range: std::ops::RangeInclusive<u64>) -> Records {
    range.map(|n| (Lsn(n), payload(n))).collect()
}

/// Appends records `payload(n)` for `n` in `range`, one submit each, then syncs.
pub fn append_synced(wal: &mut Wal, range: std::ops::RangeInclusive<u64>) {
    for n in range {
        assert_eq!(wal.append(&payload(n)).unwrap(), Lsn(n));
        wal.submit().unwrap();
    }
    wal.sync().unwrap();
}

/// The log's segment files on the disk, oldest first.
pub fn segment_files(disk: &MemDisk) -> Vec<PathBuf> {
    let mut names: Vec<String> = disk
        .list(dir())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names.into_iter().map(|n| dir().join(n)).collect()
}

/// Byte offsets of the records' frames in a segment image (24-byte headers, 8-aligned
/// payloads), past the filler frames (lsn 0) that pad each write to a sector.
pub fn frame_offsets(image: &[u8]) -> Vec<usize> {
    let mut at = 0;
    let mut out = Vec::new();
    while at + 24 <= image.len() && image[at..at + 24].iter().any(|&b| b != 0) {
        let lsn = u64::from_le_bytes(image[at + 8..at + 16].try_into().unwrap());
        if lsn != 0 {
            out.push(at);
        }
        let len = u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize;
        at += 24 + len.next_multiple_of(8);
    }
    out
}

/// Where the frames of a segment image end, filler frames included: at the first
/// all-zero header (the end marker), or where no header fits.
pub fn frames_end(image: &[u8]) -> usize {
    let mut at = 0;
    while at + 24 <= image.len() && image[at..at + 24].iter().any(|&b| b != 0) {
        let len = u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize;
        at += 24 + len.next_multiple_of(8);
    }
    at
}

/// Spare segments (`*.spare`) in a log directory on real files.
pub fn spares_on_disk(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".spare")
        })
        .count()
}
