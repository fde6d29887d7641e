//! One segment file of the log, and how segments and spares are named in its directory.

use std::path::PathBuf;

use crate::storage::StorageFile;

/// One segment file, shared by the owner (which appends to it) and the syncer (which
/// writes and syncs it).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    pub(crate) file: Box<dyn StorageFile>,
    /// The lsn in its name: its first record's, if it has one.
    pub(crate) first_lsn: u64,
    /// Its preallocated size: frames go below it.
    pub(crate) capacity: u64,
    /// What its frames' crcs continue from (`frame::seed`).
    pub(crate) seed: u32,
    /// Made by this log as it runs (`create_segment`): zeros past what it wrote, so its
    /// writes need no end marker. A recycled segment, or one found at recovery, may hold
    /// older bytes there.
    pub(crate) zeroed: bool,
}

/// The file name of the segment whose first lsn is `lsn`.
pub(crate) fn segment_name(lsn: u64) -> String {
    format!("{lsn:020}.wal")
}

/// How a spare segment's name ends: `<number, 20 digits>.spare`.
pub(crate) const SPARE_SUFFIX: &str = ".spare";

/// How the name of a segment a truncation makes ends until it is renamed into place
/// (`Wal::truncate_after`); one found at recovery is a truncation a crash cut short.
pub(crate) const TRUNCATING_SUFFIX: &str = ".truncating";

/// The file name of spare segment number `n`.
pub(crate) fn spare_name(n: u64) -> String {
    format!("{n:020}{SPARE_SUFFIX}")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}
