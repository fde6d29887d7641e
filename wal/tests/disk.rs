//! The log on real files: round trip, the lock, a torn tail, preallocation.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::*;
use leasemq_wal::{DiskStorage, Lsn, Options, WalError};

fn open_disk(
    path: &std::path::Path,
    options: Options,
) -> Result<(leasemq_wal::Wal, Records, leasemq_wal::RecoveryReport), WalError> {
    open_from(Arc::new(DiskStorage), path, options, Lsn(1))
}

#[test]
fn records_survive_a_reopen_on_real_files() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("shard-0");
    let (mut wal, _, _) = open_disk(&path, small(4096)).unwrap();
    append_synced(&mut wal, 1..=300);
    let segments = wal.segments();
    assert!(segments.len() > 1);
    for segment in &segments {
        assert_eq!(
            std::fs::metadata(segment).unwrap().len(),
            4096,
            "preallocated"
        );
    }
    drop(wal);
    let (_wal, records, report) = open_disk(&path, small(4096)).unwrap();
    assert_eq!(records, expected(1..=300));
    assert_eq!(report.segments, segments.len());
}

#[test]
fn a_second_opener_of_a_real_directory_is_locked_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _, _) = open_disk(tmp.path(), small(4096)).unwrap();
    let err = open_disk(tmp.path(), small(4096)).unwrap_err();
    assert!(matches!(err, WalError::Locked { .. }), "{err}");
    drop(wal);
    open_disk(tmp.path(), small(4096)).unwrap();
}

#[test]
fn a_torn_tail_in_a_real_file_is_cut_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut wal, _, _) = open_disk(tmp.path(), small(16384)).unwrap();
    append_synced(&mut wal, 1..=10);
    let segment = wal.segments()[0].clone();
    drop(wal);
    let image = std::fs::read(&segment).unwrap();
    let offsets = frame_offsets(&image);
    let file = OpenOptions::new().write(true).open(&segment).unwrap();
    file.write_all_at(&[0; 3], offsets[9] as u64 + 8).unwrap(); // the lsn of record 10
    let (mut wal, records, report) = open_disk(tmp.path(), small(16384)).unwrap();
    assert_eq!(records, expected(1..=9));
    let torn = report.torn.expect("a torn tail");
    assert_eq!(
        (torn.path, torn.offset),
        (segment.clone(), offsets[9] as u64)
    );
    append_synced(&mut wal, 10..=12);
    drop(wal);
    let (_wal, records, report) = open_disk(tmp.path(), small(16384)).unwrap();
    assert_eq!(records, expected(1..=12));
    assert_eq!(report.torn, None);
}

#[test]
fn damage_before_a_later_write_in_a_real_file_names_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut wal, _, _) = open_disk(tmp.path(), small(4096)).unwrap();
    // One write per record, so that records 6..=10 were written after record 5.
    for n in 1..=10 {
        append_synced(&mut wal, n..=n);
    }
    let segment = wal.segments()[0].clone();
    drop(wal);
    let bytes = std::fs::read(&segment).unwrap();
    let offsets = frame_offsets(&bytes);
    let file = OpenOptions::new().write(true).open(&segment).unwrap();
    // Flipped, not overwritten: the crc is seeded with the log's random identity, and a
    // constant would leave it as it was once in 256 runs.
    let at = offsets[4] + 2;
    file.write_all_at(&[!bytes[at]], at as u64).unwrap();
    let err = open_disk(tmp.path(), small(4096)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&segment.display().to_string()), "{text}");
    assert!(text.contains(&format!("at byte {}", offsets[4])), "{text}");
}

#[test]
fn removed_segments_are_recycled_on_real_files() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path();
    let (mut wal, _, _) = open_disk(path, small(4096)).unwrap();
    append_synced(&mut wal, 1..=300);
    leasemq_wal::write_snapshot(&DiskStorage, path, Lsn(250), b"state up to 250").unwrap();
    wal.remove_before(Lsn(251)).unwrap();
    wal.sync().unwrap();
    assert_eq!(spares_on_disk(path), 2);
    let mut n = 301;
    while spares_on_disk(path) > 0 {
        append_synced(&mut wal, n..=n);
        n += 1;
    }
    for segment in wal.segments() {
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), 4096);
    }
    drop(wal);
    let (_wal, records, report) =
        open_from(Arc::new(DiskStorage), path, small(4096), Lsn(251)).unwrap();
    assert_eq!(records, expected(251..=n - 1));
    assert_eq!(report.torn, None);
}
