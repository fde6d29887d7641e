//! Recycled segments: the compactor renames removed segments to spares, later rolls
//! reuse them, and the frames of their last use never come back as records.

mod common;

use std::sync::Arc;

use common::*;
use leasemq_wal::{write_snapshot, Lsn, MemDisk, Storage, Wal};

fn spares(disk: &MemDisk) -> Vec<String> {
    disk.list(dir())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".spare"))
        .collect()
}

/// A log of 1.5 KiB segments holding records 1..=120, one write each, the first 100
/// covered by a snapshot and their segments removed.
fn compacted(disk: &MemDisk) -> Wal {
    let (mut wal, _, _) = open(disk, small(1536)).unwrap();
    append_synced(&mut wal, 1..=120);
    write_snapshot(disk, dir(), Lsn(100), b"state up to 100").unwrap();
    assert!(wal.remove_before(Lsn(101)).unwrap() > 2);
    wal.sync().unwrap();
    wal
}

fn reopen(disk: &MemDisk) -> (Wal, Records, leasemq_wal::RecoveryReport) {
    open_from(Arc::new(disk.clone()), dir(), small(1536), Lsn(101)).unwrap()
}

/// Where the frames of a segment image end: at the first all-zero header.
fn records_end(image: &[u8]) -> usize {
    frames_end(image)
}

/// Appends one record per write until a roll took a spare; returns the next lsn.
fn roll_into_a_spare(wal: &mut Wal, disk: &MemDisk, mut n: u64) -> u64 {
    let before = spares(disk).len();
    while spares(disk).len() == before {
        append_synced(wal, n..=n);
        n += 1;
        assert!(n < 400, "no roll took a spare");
    }
    n
}

#[test]
fn removed_segments_become_spares_that_rolls_recycle() {
    let disk = MemDisk::new();
    let mut wal = compacted(&disk);
    // Two are kept; the other removed segments are unlinked.
    assert_eq!(spares(&disk).len(), 2);
    let kept = segment_files(&disk).len();
    let mut n = roll_into_a_spare(&mut wal, &disk, 121);
    n = roll_into_a_spare(&mut wal, &disk, n);
    assert!(spares(&disk).is_empty());
    assert_eq!(segment_files(&disk).len(), kept + 2);
    // A recycled segment still holds its last use's frames past its own records and
    // their end marker.
    let last = segment_files(&disk).last().unwrap().clone();
    let image = disk.contents(&last).unwrap();
    let end = records_end(&image);
    assert!(
        image[end..end + 24].iter().all(|&b| b == 0),
        "the end marker"
    );
    assert!(
        image[end + 24..].iter().any(|&b| b != 0),
        "old frames remain"
    );
    drop(wal);
    let (_wal, records, report) = reopen(&disk);
    assert_eq!(records, expected(101..=n - 1));
    assert_eq!(report.torn, None);
}

#[test]
fn spares_left_by_a_shutdown_are_removed_at_the_next_open() {
    let disk = MemDisk::new();
    drop(compacted(&disk));
    assert_eq!(spares(&disk).len(), 2);
    let (mut wal, records, report) = reopen(&disk);
    assert_eq!(records, expected(101..=120));
    assert_eq!(report.torn, None);
    assert!(spares(&disk).is_empty());
    // With none set aside, rolls create segments again.
    append_synced(&mut wal, 121..=200);
    drop(wal);
    let (_wal, records, _) = reopen(&disk);
    assert_eq!(records, expected(101..=200));
}

#[test]
fn a_torn_tail_in_a_recycled_segment_is_cut_at_every_byte_offset_of_the_last_write() {
    let disk = MemDisk::new();
    let mut wal = compacted(&disk);
    // Appends, unsynced, until a roll takes a spare: record `n` is the recycled
    // segment's first, and its first write carries it and two more.
    let taken = spares(&disk).len();
    let mut n = 121;
    while spares(&disk).len() == taken {
        wal.append(&payload(n)).unwrap();
        n += 1;
    }
    n -= 1;
    let seg = segment_files(&disk).last().unwrap().clone();
    let before = disk.contents(&seg).unwrap();
    // Sectors the crash lost read as they were before the write: the old frames of the
    // segment's last use, not zeros.
    for k in n + 1..n + 3 {
        wal.append(&payload(k)).unwrap();
    }
    assert_eq!(wal.sync().unwrap(), Lsn(n + 2));
    assert_eq!(segment_files(&disk).last(), Some(&seg), "no roll");
    drop(wal);
    let after = disk.contents(&seg).unwrap();
    let offsets = frame_offsets(&after);
    let write = &offsets[offsets.len() - 3..];
    let end = records_end(&after);
    let marker_end = (end + 24).min(after.len());
    assert!(
        before[marker_end..].iter().any(|&b| b != 0),
        "old frames past the write"
    );
    for cut in write[0]..marker_end {
        let damaged = disk.fork();
        damaged.damage(&seg, cut as u64, &before[cut..marker_end]);
        // Records whose header and payload lie wholly before the cut survive, and so
        // does one whose bytes past the cut the old ones happen to match.
        let intact = |at: usize| {
            let end = at + 24 + payload_len(&after, at);
            end <= cut || before[cut..end] == after[cut..end]
        };
        let whole = write.iter().take_while(|&&at| intact(at)).count() as u64;
        let (mut wal, records, report) = reopen(&damaged);
        assert_eq!(records, expected(101..=n - 1 + whole), "cut at byte {cut}");
        if let Some(torn) = &report.torn {
            assert_eq!(&torn.path, &seg, "cut at byte {cut}");
        }
        // The log goes on over the cut, and nothing old comes back.
        let next = n + whole;
        append_synced(&mut wal, next..=next + 2);
        drop(wal);
        let (_wal, records, report) = reopen(&damaged);
        assert_eq!(records, expected(101..=next + 2), "cut at byte {cut}");
        assert_eq!(report.torn, None, "cut at byte {cut}");
    }
}

fn payload_len(image: &[u8], at: usize) -> usize {
    u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize
}
