//! A log's tail rewritten, as a Raft follower rewrites where it conflicts with its leader,
//! and snapshots installed past its end.

mod common;
use common::*;

use std::sync::Arc;

use leasemq_wal::{latest_snapshot, Crash, Lsn, MemDisk, WalError};

/// A payload of a rewritten record, unlike any `payload(n)`.
fn rewritten(n: u64) -> Vec<u8> {
    format!("rewritten {n}").into_bytes()
}

/// Opens the log after its latest snapshot, if it has one.
fn reopen(disk: &MemDisk, segment_bytes: u64) -> (leasemq_wal::Wal, Records) {
    let from = latest_snapshot(disk, dir())
        .unwrap()
        .map_or(1, |s| s.lsn.0 + 1);
    let (wal, records, _) = open_from(
        Arc::new(disk.clone()),
        dir(),
        small(segment_bytes),
        Lsn(from),
    )
    .unwrap();
    (wal, records)
}

/// A log of records 1..=`n`, synced, in segments of `segment_bytes`.
fn synced_log(segment_bytes: u64, n: u64) -> (MemDisk, leasemq_wal::Wal) {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(segment_bytes)).unwrap();
    append_synced(&mut wal, 1..=n);
    (disk, wal)
}

#[test]
fn truncated_records_never_come_back_and_the_log_goes_on_after_the_kept_ones() {
    let (disk, mut wal) = synced_log(65536, 10);
    wal.truncate_after(Lsn(5)).unwrap();
    assert_eq!(wal.last_appended(), Lsn(5));
    assert_eq!(wal.durable(), Lsn(5));
    // The discarded records' frames are still in the segment, after record 5.
    drop(wal);
    let (mut wal, records) = reopen(&disk, 65536);
    assert_eq!(
        records,
        expected(1..=5),
        "the truncation held across a reopen"
    );
    for n in 6..=7 {
        assert_eq!(wal.append(&rewritten(n)).unwrap(), Lsn(n));
    }
    wal.sync().unwrap();
    drop(wal);
    let (_wal, records) = reopen(&disk, 65536);
    let mut want = expected(1..=5);
    want.extend((6..=7).map(|n| (Lsn(n), rewritten(n))));
    assert_eq!(records, want);
}

#[test]
fn a_rewritten_record_never_lets_a_discarded_one_after_it_pass_for_the_next() {
    // One record per write: each frame starts a sector, as each write does.
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(65536)).unwrap();
    for n in 1..=10 {
        wal.append(&payload(n)).unwrap();
        wal.sync().unwrap();
    }
    wal.truncate_after(Lsn(5)).unwrap();
    drop(wal);
    // Rewritten where record 6 was, record 6 would end where record 7 begins, with the
    // lsn due next: written anywhere but in a segment of its own, 7 would come back.
    let (mut wal, _) = reopen(&disk, 65536);
    wal.append(&rewritten(6)).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_wal, records) = reopen(&disk, 65536);
    let mut want = expected(1..=5);
    want.push((Lsn(6), rewritten(6)));
    assert_eq!(records, want);
}

#[test]
fn a_truncation_reaches_back_across_segments_and_again() {
    let (disk, mut wal) = synced_log(256, 40);
    let before = segment_files(&disk).len();
    wal.truncate_after(Lsn(12)).unwrap();
    assert!(
        segment_files(&disk).len() < before,
        "the later segments went"
    );
    for n in 13..=20 {
        wal.append(&rewritten(n)).unwrap();
        wal.submit().unwrap();
    }
    // Again, into what the first truncation wrote.
    wal.truncate_after(Lsn(15)).unwrap();
    wal.append(&rewritten(1016)).unwrap();
    wal.sync().unwrap();
    // Nothing to discard: nothing changes.
    wal.truncate_after(Lsn(16)).unwrap();
    assert_eq!(wal.last_appended(), Lsn(16));
    drop(wal);
    let (_wal, records) = reopen(&disk, 256);
    let mut want = expected(1..=12);
    want.extend((13..=15).map(|n| (Lsn(n), rewritten(n))));
    want.push((Lsn(16), rewritten(1016)));
    assert_eq!(records, want);
}

#[test]
fn a_crash_after_a_truncation_keeps_the_kept_records_and_a_prefix_of_the_new_ones() {
    for seed in 0..64 {
        let (disk, mut wal) = synced_log(512, 30);
        wal.truncate_after(Lsn(9)).unwrap();
        for n in 10..=14 {
            wal.append(&rewritten(n)).unwrap();
            wal.submit().unwrap();
        }
        let crashed = disk.crash(Crash::Tear { seed });
        drop(wal);
        let (_wal, records) = reopen(&crashed, 512);
        assert_eq!(records[..9], expected(1..=9)[..], "seed {seed}");
        for (lsn, got) in &records[9..] {
            assert_eq!(
                got,
                &rewritten(lsn.0),
                "seed {seed}: a discarded record came back"
            );
        }
    }
}

#[test]
fn a_crash_in_the_middle_of_a_truncation_leaves_a_prefix_of_the_log() {
    for seed in 0..32 {
        let (disk, mut wal) = synced_log(256, 40);
        // The crash comes as the third segment from the end is removed.
        let segments = segment_files(&disk);
        let third = &segments[segments.len() - 3];
        disk.hold_removes(&third.file_name().unwrap().to_string_lossy());
        let truncating = std::thread::spawn(move || wal.truncate_after(Lsn(3)).map(|_| wal));
        disk.wait_for_held_remove();
        let crashed = disk.crash(Crash::Tear { seed });
        disk.release_removes();
        assert!(
            truncating.join().unwrap().is_err(),
            "the crashed disk fails it"
        );
        let (_wal, records) = reopen(&crashed, 256);
        let n = records.len() as u64;
        assert!((3..40).contains(&n), "seed {seed}: {n} records");
        assert_eq!(records, expected(1..=n), "seed {seed}: a prefix of the log");
    }
}

#[test]
fn a_truncation_before_the_first_live_record_is_refused() {
    let (_disk, mut wal) = synced_log(256, 40);
    wal.install_snapshot(Lsn(30), b"state at 30").unwrap();
    let err = wal.truncate_after(Lsn(2)).unwrap_err();
    assert!(matches!(err, WalError::InvalidOptions(_)), "{err}");
    // The log goes on.
    wal.truncate_after(Lsn(35)).unwrap();
    assert_eq!(wal.append(b"36").unwrap(), Lsn(36));
}

#[test]
fn a_snapshot_installed_past_the_logs_end_starts_the_log_after_it() {
    let installed = || {
        let (disk, mut wal) = synced_log(256, 20);
        wal.install_snapshot(Lsn(100), b"the leader's state")
            .unwrap();
        assert_eq!(wal.durable(), Lsn(100));
        (disk, wal)
    };
    // A crash right after: the snapshot, and the log starting after it.
    let (disk, wal) = installed();
    let crashed = disk.crash(Crash::LoseUnsynced);
    drop(wal);
    let (mut wal, records) = reopen(&crashed, 256);
    assert!(records.is_empty());
    assert_eq!(wal.append(&payload(101)).unwrap(), Lsn(101));
    // Or the log goes on at once.
    let (disk, mut wal) = installed();
    assert_eq!(wal.append(&payload(101)).unwrap(), Lsn(101));
    wal.sync().unwrap();
    drop(wal);
    let (mut wal, records) = reopen(&disk, 256);
    assert_eq!(records, expected(101..=101));
    assert_eq!(wal.append(&payload(102)).unwrap(), Lsn(102));
    let first = segment_files(&disk)[0].clone();
    assert!(
        first.ends_with("00000000000000000101.wal"),
        "the old segments went: {first:?}"
    );
}

#[test]
fn a_snapshot_installed_inside_the_log_keeps_the_records_after_it() {
    let (disk, mut wal) = synced_log(256, 40);
    wal.install_snapshot(Lsn(25), b"state at 25").unwrap();
    assert_eq!(wal.append(&payload(41)).unwrap(), Lsn(41));
    wal.sync().unwrap();
    drop(wal);
    let (_wal, records) = reopen(&disk, 256);
    assert_eq!(records, expected(26..=41));
}

#[test]
fn a_snapshot_installed_where_a_truncation_left_the_log_lets_it_go_on() {
    let (disk, mut wal) = synced_log(256, 6);
    wal.truncate_after(Lsn(1)).unwrap();
    wal.install_snapshot(Lsn(1), b"state at 1").unwrap();
    for n in 2..=4 {
        assert_eq!(wal.append(&rewritten(n)).unwrap(), Lsn(n));
    }
    wal.sync().unwrap();
    drop(wal);
    let (_wal, records) = reopen(&disk, 256);
    let want: Records = (2..=4).map(|n| (Lsn(n), rewritten(n))).collect();
    assert_eq!(records, want);
}
