//! Records read back from a running log, as a Raft leader sends them to a follower.

mod common;
use common::*;

use leasemq_wal::{Lsn, MemDisk, WalError};

fn rewritten(n: u64) -> Vec<u8> {
    format!("rewritten {n}").into_bytes()
}

#[test]
fn any_durable_range_reads_back_across_segments() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(1024)).unwrap();
    append_synced(&mut wal, 1..=60);
    assert!(segment_files(&disk).len() > 3, "the records span segments");
    for (from, to) in [(1, 61), (1, 2), (17, 44), (60, 61), (30, 30)] {
        let got = wal.read(Lsn(from), Lsn(to)).unwrap();
        let want = if from == to {
            Vec::new()
        } else {
            expected(from..=to - 1)
        };
        assert_eq!(got, want, "{from}..{to}");
    }
}

#[test]
fn a_range_not_yet_durable_or_no_longer_held_is_refused() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=30);
    wal.append(&payload(31)).unwrap();
    for (from, to) in [(25, 32), (5, 3)] {
        let err = wal.read(Lsn(from), Lsn(to)).unwrap_err();
        assert!(matches!(err, WalError::InvalidOptions(_)), "{err}");
    }
    wal.install_snapshot(Lsn(20), b"state at 20").unwrap();
    let err = wal.read(Lsn(2), Lsn(5)).unwrap_err();
    assert!(matches!(err, WalError::InvalidOptions(_)), "{err}");
    assert_eq!(wal.read(Lsn(25), Lsn(32)).unwrap(), expected(25..=31));
}

#[test]
fn what_a_truncation_discarded_is_never_read_back() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(65536)).unwrap();
    append_synced(&mut wal, 1..=10);
    wal.truncate_after(Lsn(4)).unwrap();
    for n in 5..=6 {
        wal.append(&rewritten(n)).unwrap();
    }
    wal.sync().unwrap();
    let mut want = expected(1..=4);
    want.extend((5..=6).map(|n| (Lsn(n), rewritten(n))));
    assert_eq!(wal.read(Lsn(1), Lsn(7)).unwrap(), want);
    // And past a snapshot installed beyond the end.
    wal.install_snapshot(Lsn(50), b"leader").unwrap();
    wal.append(&payload(51)).unwrap();
    wal.sync().unwrap();
    assert_eq!(wal.read(Lsn(51), Lsn(52)).unwrap(), expected(51..=51));
}

#[test]
fn recycled_segments_read_back_their_own_records_only() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(1024)).unwrap();
    append_synced(&mut wal, 1..=60);
    // Compaction sets segments aside as spares, and later rolls recycle them: they hold
    // the frames of their last use past their own records.
    wal.submit_snapshot(b"state at 60".to_vec()).unwrap();
    wal.sync().unwrap();
    append_synced(&mut wal, 61..=140);
    assert_eq!(wal.read(Lsn(61), Lsn(141)).unwrap(), expected(61..=140));
    drop(wal);
    let (wal, _, _) = open_from(
        std::sync::Arc::new(disk.clone()),
        dir(),
        small(1024),
        Lsn(61),
    )
    .unwrap();
    assert_eq!(wal.read(Lsn(90), Lsn(141)).unwrap(), expected(90..=140));
}

#[test]
fn a_record_damaged_since_it_was_written_is_an_error_naming_its_file() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(1024)).unwrap();
    append_synced(&mut wal, 1..=60);
    let segments = segment_files(&disk);
    let image = disk.contents(&segments[1]).unwrap();
    let at = frame_offsets(&image)[1];
    disk.flip_bit(&segments[1], at as u64 + 26, 3);
    let err = wal.read(Lsn(1), Lsn(61)).unwrap_err();
    let WalError::Corrupt { ref path, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(path, &segments[1]);
    // Records before it read as they were.
    let first_of_next = wal.read(Lsn(1), Lsn(2)).unwrap();
    assert_eq!(first_of_next, expected(1..=1));
}

#[test]
fn reads_that_start_and_stop_inside_a_segment_agree_with_whole_ones() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(1 << 20)).unwrap();
    append_synced(&mut wal, 1..=300);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut ranges: Vec<(u64, u64)> = (0..40)
        .map(|_| {
            let a = rng.u64(1..=300);
            (a, rng.u64(a..=301))
        })
        .collect();
    // Before any read marked the segment, after a whole one did, and between.
    ranges.insert(20, (1, 301));
    for (from, to) in ranges {
        let want = if from == to {
            Vec::new()
        } else {
            expected(from..=to - 1)
        };
        assert_eq!(wal.read(Lsn(from), Lsn(to)).unwrap(), want, "{from}..{to}");
    }
    // Marks past a truncation point stop reads at the kept records.
    wal.truncate_after(Lsn(100)).unwrap();
    for n in 101..=150 {
        wal.append(&rewritten(n)).unwrap();
    }
    wal.sync().unwrap();
    let mut want = expected(90..=100);
    want.extend((101..=150).map(|n| (Lsn(n), rewritten(n))));
    assert_eq!(wal.read(Lsn(90), Lsn(151)).unwrap(), want);
}

#[test]
fn a_record_larger_than_a_segment_reads_back_once_later_ones_follow_it() {
    let disk = MemDisk::new();
    let options = leasemq_wal::Options {
        max_record_bytes: 8192,
        ..small(1024)
    };
    let (mut wal, _, _) = open(&disk, options).unwrap();
    // The first record of the empty first segment grows it; the next ones go to a
    // segment of their own size, then to ordinary ones.
    let big = |n: u8| vec![n; 3000];
    let records = [big(1), big(2), b"small".to_vec(), big(4)];
    for record in &records {
        wal.append(record).unwrap();
    }
    wal.sync().unwrap();
    assert!(segment_files(&disk).len() >= 3, "the records span segments");
    let got = wal.read(Lsn(1), Lsn(5)).unwrap();
    let want: Vec<(Lsn, Vec<u8>)> = (1..).map(Lsn).zip(records).collect();
    assert_eq!(got, want);
}
