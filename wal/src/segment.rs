//! One segment file of the log, and how segments and spares are named in its directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::storage::StorageFile;

/// One segment file, shared by the owner (which appends to it) and the syncer (which
/// writes and syncs it).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    pub(crate) file: Box<dyn StorageFile>,
    /// The lsn in its name: its first record's, if it has one.
    pub(crate) first_lsn: u64,
    /// Its preallocated size when it was made or found: frames go below it, or below
    /// `grown_to`.
    pub(crate) capacity: u64,
    /// The size the owner grew it to, empty, for a first record larger than `capacity`
    /// (`Wal::roll`); 0 if it never did.
    pub(crate) grown_to: AtomicU64,
    /// What its frames' crcs continue from (`frame::seed`).
    pub(crate) seed: u32,
    /// Made by this log as it runs (`create_segment`): zeros past what it wrote, so its
    /// writes need no end marker. A recycled segment, or one found at recovery, may hold
    /// older bytes there.
    pub(crate) zeroed: bool,
    /// Where some of its durable records begin, by lsn: filled as `Wal::read` scans it,
    /// one record in [`MARK_EVERY`], so that later reads start and stop near the records
    /// they want. Written bytes never move, so a mark stays true.
    pub(crate) marks: Mutex<BTreeMap<u64, u64>>,
}

/// One record in this many gets a mark (`Segment::marks`).
pub(crate) const MARK_EVERY: u64 = 64;

impl Segment {
    /// How far its frames may reach: its capacity, or the size it was grown to.
    pub(crate) fn extent(&self) -> u64 {
        self.capacity.max(self.grown_to.load(Ordering::Relaxed))
    }

    /// The mark at or before record `lsn`, or the segment's start.
    pub(crate) fn mark_before(&self, lsn: u64) -> (u64, u64) {
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        (marks.range(..=lsn).next_back()).map_or((self.first_lsn, 0), |(&l, &at)| (l, at))
    }

    /// Where the first marked record at or after `lsn` begins, if one is marked.
    pub(crate) fn mark_after(&self, lsn: u64) -> Option<u64> {
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        marks.range(lsn..).next().map(|(_, &at)| at)
    }

    /// Marks record `lsn` as beginning at `at`, if it is one that gets a mark.
    pub(crate) fn mark(&self, lsn: u64, at: u64) {
        if (lsn - self.first_lsn).is_multiple_of(MARK_EVERY) {
            let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
            marks.insert(lsn, at);
        }
    }
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
