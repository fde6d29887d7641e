//! The writer: group commit, poisoning, a full disk, the lock, compaction, snapshots.

mod common;

use std::sync::{Arc, Condvar, Mutex};

use common::*;
use leasemq_wal::{latest_snapshot, write_snapshot, Crash, Lsn, MemDisk, Options, WalError};

#[test]
fn appends_during_an_inflight_fsync_ride_the_next_one() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(65536)).unwrap();
    let base = disk.data_syncs();
    disk.hold_syncs();
    wal.append(b"first").unwrap();
    wal.submit().unwrap();
    disk.wait_for_held_sync(); // the fsync of record 1 is in flight
    for n in 2..=20 {
        wal.append(&payload(n)).unwrap();
        wal.submit().unwrap(); // each wakes the syncer, which is busy
    }
    assert_eq!(
        wal.durable(),
        Lsn(0),
        "nothing is durable while the fsync hangs"
    );
    disk.release_syncs();
    assert_eq!(wal.sync().unwrap(), Lsn(20));
    assert_eq!(
        disk.data_syncs() - base,
        2,
        "one fsync for record 1, one for 2..=20"
    );
    drop(wal);
    let (_wal, records, _) = open(&disk, small(65536)).unwrap();
    assert_eq!(records.len(), 20);
}

#[test]
fn the_owner_learns_durability_without_blocking() {
    let disk = MemDisk::new();
    let rounds = Arc::new((Mutex::new(0u64), Condvar::new()));
    let options = Options {
        on_progress: Some({
            let rounds = Arc::clone(&rounds);
            Arc::new(move || {
                *rounds.0.lock().unwrap() += 1;
                rounds.1.notify_all();
            })
        }),
        ..small(4096)
    };
    let (mut wal, _, _) = open(&disk, options).unwrap();
    disk.hold_syncs();
    let lsn = wal.append(b"x").unwrap();
    wal.submit().unwrap();
    disk.wait_for_held_sync();
    // The owner goes on appending while the fsync runs.
    let later = wal.append(b"y").unwrap();
    assert_eq!(wal.durable(), Lsn(0));
    disk.release_syncs();
    let mut n = rounds.0.lock().unwrap();
    while *n == 0 {
        n = rounds.1.wait(n).unwrap();
    }
    drop(n);
    assert_eq!(
        wal.durable(),
        lsn,
        "the first round covers only what was submitted"
    );
    assert_eq!(wal.sync().unwrap(), later);
}

#[test]
fn a_failed_fsync_poisons_the_log_for_good() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=3);
    disk.fail_next_sync();
    wal.append(b"lost").unwrap();
    let err = wal.sync().unwrap_err();
    let WalError::Io { op, ref path, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(op, "fdatasync");
    assert!(path.ends_with("00000000000000000001.wal"));
    assert_eq!(wal.durable(), Lsn(3));
    let lag = wal.probe().lag();
    assert!(lag.failed && !lag.stalled, "{lag:?}");
    assert_eq!(lag.durable, Lsn(3));
    // Every later call answers the same error; the fsync is not tried again.
    let syncs = disk.data_syncs();
    for _ in 0..3 {
        assert_eq!(
            wal.append(b"more").unwrap_err().to_string(),
            err.to_string()
        );
        assert_eq!(wal.submit().unwrap_err().to_string(), err.to_string());
        assert_eq!(wal.sync().unwrap_err().to_string(), err.to_string());
        assert_eq!(
            wal.remove_before(Lsn(2)).unwrap_err().to_string(),
            err.to_string()
        );
        assert!(wal.check().is_err());
    }
    assert_eq!(disk.data_syncs(), syncs);
}

#[test]
fn a_full_disk_fails_the_append_whole_and_the_log_goes_on() {
    let disk = MemDisk::new();
    disk.set_capacity(Some(1024));
    let (mut wal, _, _) = open(&disk, small(512)).unwrap();
    // Two segments fit; the third cannot be allocated.
    let mut n = 1;
    let err = loop {
        match wal.append(&payload(n)) {
            Ok(lsn) => assert_eq!(lsn, Lsn(n)),
            Err(e) => break e,
        }
        n += 1;
    };
    assert!(matches!(err, WalError::NoSpace { .. }), "{err}");
    assert_eq!(
        wal.last_appended(),
        Lsn(n - 1),
        "nothing of the failed append"
    );
    assert_eq!(wal.sync().unwrap(), Lsn(n - 1), "the log is not poisoned");
    // Space freed: the same append succeeds with the lsn it would have had.
    disk.set_capacity(None);
    assert_eq!(wal.append(&payload(n)).unwrap(), Lsn(n));
    wal.sync().unwrap();
    drop(wal);
    let (_wal, records, _) = open(&disk, small(512)).unwrap();
    assert_eq!(records, expected(1..=n));
}

#[test]
fn a_record_over_the_limit_is_refused_without_harm() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    let err = wal.append(&[0; 233]).unwrap_err();
    assert!(
        matches!(err, WalError::TooLarge { len: 233, max: 232 }),
        "{err}"
    );
    assert_eq!(wal.append(&[7; 232]).unwrap(), Lsn(1));
    assert_eq!(wal.sync().unwrap(), Lsn(1));
}

#[test]
fn options_that_cannot_work_are_refused() {
    let disk = MemDisk::new();
    for bad in [
        small(500),
        Options {
            segment_bytes: 0,
            ..small(64)
        },
    ] {
        assert!(matches!(open(&disk, bad), Err(WalError::InvalidOptions(_))));
    }
}

/// A record larger than a segment gets a segment of its own, and reads back after the
/// records around it.
#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let disk = MemDisk::new();
    let options = Options {
        max_record_bytes: 10_000,
        ..small(512)
    };
    let (mut wal, _, _) = open(&disk, options.clone()).unwrap();
    let records: Vec<Vec<u8>> = vec![vec![1; 100], vec![2; 5_000], vec![3; 100]];
    for r in &records {
        wal.append(r).unwrap();
    }
    assert_eq!(wal.sync().unwrap(), Lsn(3));
    assert_eq!(wal.segments().len(), 3, "before, the large one, after");
    drop(wal);
    let (_, replayed, _) = open(&disk, options).unwrap();
    let replayed: Vec<Vec<u8>> = replayed.into_iter().map(|(_, r)| r).collect();
    assert_eq!(replayed, records);
}

#[test]
fn a_second_opener_gets_locked_until_the_first_is_dropped() {
    let disk = MemDisk::new();
    let (wal, _, _) = open(&disk, small(4096)).unwrap();
    let err = open(&disk, small(4096)).unwrap_err();
    assert!(
        matches!(err, WalError::Locked { ref path } if path == dir()),
        "{err}"
    );
    drop(wal);
    open(&disk, small(4096)).unwrap();
}

#[test]
fn compaction_keeps_exactly_the_records_from_the_cut() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=100);
    let before = wal.segments().len();
    let storage: &dyn leasemq_wal::Storage = &disk;
    write_snapshot(storage, dir(), Lsn(70), b"state up to 70").unwrap();
    let removed = wal.remove_before(Lsn(71)).unwrap();
    assert!(removed > 0 && removed < before, "{removed} of {before}");
    wal.sync().unwrap();
    assert_eq!(segment_files(&disk), wal.segments());
    drop(wal);
    // The first kept segment holds lsn 71; all before it are gone.
    let snap = latest_snapshot(storage, dir()).unwrap().unwrap();
    assert_eq!(
        (snap.lsn, snap.data.as_slice()),
        (Lsn(70), &b"state up to 70"[..])
    );
    let (_wal, records, _) = open_from(Arc::new(disk.clone()), dir(), small(256), Lsn(71)).unwrap();
    assert_eq!(records, expected(71..=100));
    drop(_wal);
    let err = open_from(Arc::new(disk.clone()), dir(), small(256), Lsn(1)).unwrap_err();
    assert!(
        matches!(err, WalError::Corrupt { .. }),
        "replay from 1 is impossible now: {err}"
    );
    // Every record still on disk is at or after the first kept segment's lsn, and that
    // segment starts at or before 71.
    let first: u64 = segment_files(&disk)[0]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        first <= 71 && first > 1,
        "first kept segment starts at {first}"
    );
}

/// `submit_snapshot` leaves the writing to the syncer: the snapshot lands only after the
/// records it covers are durable, the segments it covers go after it, and a crash at any
/// point after the call leaves a log that opens from the latest snapshot.
#[test]
fn a_submitted_snapshot_is_written_after_its_records_and_before_the_removals() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    for n in 1..=80 {
        wal.append(&payload(n)).unwrap();
    }
    // Nothing submitted yet: the snapshot call submits the records too.
    assert_eq!(
        wal.submit_snapshot(b"state up to 80".to_vec()).unwrap(),
        Lsn(80)
    );
    for n in 81..=90 {
        wal.append(&payload(n)).unwrap();
    }
    assert_eq!(wal.sync().unwrap(), Lsn(90));
    assert_eq!(segment_files(&disk), wal.segments());
    let storage: &dyn leasemq_wal::Storage = &disk;
    let snap = latest_snapshot(storage, dir()).unwrap().unwrap();
    assert_eq!(
        (snap.lsn, &snap.data[..]),
        (Lsn(80), &b"state up to 80"[..])
    );
    drop(wal);
    let (_wal, records, _) = open_from(Arc::new(disk.clone()), dir(), small(256), Lsn(81)).unwrap();
    assert_eq!(records, expected(81..=90));
}

/// Compaction does not hold up the fsyncs: while the removal of the segments a snapshot
/// covers is stuck (unlinking a large preallocated file takes milliseconds on ext4),
/// later records still become durable.
#[test]
fn a_slow_segment_removal_does_not_hold_up_later_records() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=80);
    let before = segment_files(&disk).len();
    disk.hold_removes(".wal");
    wal.submit_snapshot(b"state up to 80".to_vec()).unwrap();
    disk.wait_for_held_remove();
    for n in 81..=90 {
        wal.append(&payload(n)).unwrap();
    }
    wal.submit().unwrap();
    // No sleep: the records' fsync either comes while the removal waits, or not at all.
    let started = std::time::Instant::now();
    while wal.durable() < Lsn(90) && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::yield_now();
    }
    let durable = wal.durable();
    disk.release_removes();
    assert_eq!(durable, Lsn(90), "the fsync waited for the removal");
    assert_eq!(wal.sync().unwrap(), Lsn(90));
    assert!(
        segment_files(&disk).len() < before,
        "the covered segments went"
    );
    assert_eq!(segment_files(&disk), wal.segments());
}

/// A snapshot the disk has no room for is left out: the log is not poisoned, its temporary
/// file is gone, the segments it would have covered stay (replay still needs them), and
/// the next snapshot that fits removes them.
#[test]
fn a_snapshot_the_disk_has_no_room_for_is_left_out_and_the_log_goes_on() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=80);
    let segments = segment_files(&disk);
    assert!(segments.len() > 4);
    let used: u64 = segments
        .iter()
        .map(|p| disk.contents(p).unwrap().len() as u64)
        .sum();
    disk.set_capacity(Some(used + 4096));
    wal.submit_snapshot(vec![7; 64 << 10]).unwrap();
    assert_eq!(wal.sync().unwrap(), Lsn(80), "not poisoned");
    assert!(matches!(
        wal.take_skipped_snapshot(),
        Some(WalError::NoSpace { .. })
    ));
    assert!(wal.take_skipped_snapshot().is_none(), "said once");
    let storage: &dyn leasemq_wal::Storage = &disk;
    assert_eq!(latest_snapshot(storage, dir()).unwrap(), None);
    assert_eq!(segment_files(&disk), segments, "every segment kept");
    let names = storage.list(dir()).unwrap();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    // A copy of the disk as it is now opens by replaying the whole log.
    let copy = disk.fork();
    let (_w, records, _) = open_from(Arc::new(copy), dir(), small(256), Lsn(1)).unwrap();
    assert_eq!(records, expected(1..=80));

    // With room again, the next snapshot lands and the segments before it go.
    disk.set_capacity(None);
    append_synced(&mut wal, 81..=90);
    assert_eq!(
        wal.submit_snapshot(b"state up to 90".to_vec()).unwrap(),
        Lsn(90)
    );
    wal.sync().unwrap();
    assert!(wal.take_skipped_snapshot().is_none());
    assert_eq!(segment_files(&disk), wal.segments());
    assert!(segment_files(&disk).len() < segments.len());
    let snap = latest_snapshot(storage, dir()).unwrap().unwrap();
    assert_eq!(snap.lsn, Lsn(90));
    // The log left behind opens after the snapshot, with nothing to replay.
    let copy = Arc::new(disk.fork());
    let (_w, records, _) = open_from(copy, dir(), small(256), Lsn(91)).unwrap();
    assert!(records.is_empty());
}

#[test]
fn compaction_never_removes_what_is_not_durable() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=20);
    disk.hold_syncs();
    for n in 21..=60 {
        wal.append(&payload(n)).unwrap();
    }
    wal.submit().unwrap();
    disk.wait_for_held_sync();
    let durable = wal.durable();
    wal.remove_before(Lsn(61)).unwrap();
    disk.release_syncs();
    wal.sync().unwrap();
    drop(wal);
    // Removal stopped at the durable lsn: the segment holding durable + 1 is still there.
    let (_wal, records, _) = open_from(
        Arc::new(disk.clone()),
        dir(),
        small(256),
        Lsn(durable.0 + 1),
    )
    .unwrap();
    assert_eq!(records, expected(durable.0 + 1..=60));
}

#[test]
fn a_damaged_snapshot_is_an_error_and_an_interrupted_one_is_ignored() {
    let disk = MemDisk::new();
    let storage: &dyn leasemq_wal::Storage = &disk;
    assert_eq!(
        latest_snapshot(storage, dir()).unwrap(),
        None,
        "no directory yet"
    );
    storage.create_dir_all(dir()).unwrap();
    assert_eq!(latest_snapshot(storage, dir()).unwrap(), None);
    write_snapshot(storage, dir(), Lsn(5), b"five").unwrap();
    let path = write_snapshot(storage, dir(), Lsn(9), b"nine").unwrap();
    assert_eq!(
        latest_snapshot(storage, dir()).unwrap().unwrap().lsn,
        Lsn(9)
    );
    assert_eq!(
        storage.list(dir()).unwrap().len(),
        1,
        "the older snapshot is removed"
    );
    // A crash before the rename leaves the old snapshot in force.
    let crashed = {
        let half = disk.fork();
        let tmp = dir().join("snapshot-00000000000000000012.tmp");
        let f = leasemq_wal::Storage::create(&half, &tmp).unwrap();
        f.write_at(b"LMQSNAP1 half written", 0).unwrap();
        half.crash(Crash::KeepUnsynced)
    };
    let storage2: &dyn leasemq_wal::Storage = &crashed;
    assert_eq!(
        latest_snapshot(storage2, dir()).unwrap().unwrap().data,
        b"nine"
    );
    disk.flip_bit(&path, 34, 1);
    match latest_snapshot(storage, dir()) {
        Err(WalError::Corrupt {
            path: p, offset, ..
        }) => {
            assert_eq!(p, path);
            assert_eq!(offset, 24);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_syncer_survives_many_small_rounds_from_another_thread() {
    // The owner can live on any thread: the log moves with it.
    let disk = MemDisk::new();
    let (wal, _, _) = open(&disk, small(1024)).unwrap();
    let handle = std::thread::spawn(move || {
        let mut wal = wal;
        for n in 1..=2000 {
            wal.append(&payload(n)).unwrap();
            if n % 7 == 0 {
                wal.submit().unwrap();
            }
        }
        wal.sync().unwrap()
    });
    assert_eq!(handle.join().unwrap(), Lsn(2000));
    let (_wal, records, _) = open(&disk, small(1024)).unwrap();
    assert_eq!(records, expected(1..=2000));
}

/// A panic in the owner's `on_progress` callback kills the syncer thread; it must poison
/// the log, so that the next `sync` fails instead of waiting for ever.
#[test]
fn a_panicking_progress_callback_poisons_instead_of_hanging() {
    let disk = MemDisk::new();
    let mut options = small(4096);
    options.on_progress = Some(Arc::new(|| panic!("the owner's callback failed")));
    let (mut wal, _, _) = open(&disk, options).unwrap();
    wal.append(b"one").unwrap();
    wal.submit().unwrap();
    // The round itself completes: this sync may see it before the callback panics.
    let _ = wal.sync();
    let next = wal
        .append(b"two")
        .and_then(|_| wal.submit())
        .and_then(|()| wal.sync());
    assert!(next.is_err(), "the log must be poisoned: {next:?}");
    assert!(wal.check().is_err());
}

/// `reserve` starts the next segment early, so that the appends it made room for cannot
/// fail; on a full disk it fails alone, and the log goes on once there is room. An empty
/// segment grows instead of being left behind a new one.
#[test]
fn reserve_makes_room_before_the_append_and_fails_alone_on_a_full_disk() {
    let disk = MemDisk::new();
    let options = Options {
        max_record_bytes: 4096,
        ..small(512)
    };
    let (mut wal, _, _) = open(&disk, options.clone()).unwrap();
    wal.reserve(2000).unwrap(); // the first segment is empty: it grows
    assert_eq!(wal.segments().len(), 1);
    wal.append(&[1; 2000]).unwrap();
    disk.set_capacity(Some(0));
    assert!(matches!(wal.reserve(2000), Err(WalError::NoSpace { .. })));
    disk.set_capacity(None);
    wal.reserve(2000).unwrap();
    let segments = wal.segments().len();
    assert_eq!(segments, 2, "the next segment, made before the append");
    wal.append(&[2; 2000]).unwrap();
    assert_eq!(
        wal.segments().len(),
        segments,
        "the append did not roll again"
    );
    assert_eq!(wal.sync().unwrap(), Lsn(2));
    drop(wal);
    let (_, replayed, _) = open(&disk, options).unwrap();
    let lens: Vec<usize> = replayed.iter().map(|(_, r)| r.len()).collect();
    assert_eq!(lens, [2000, 2000]);
}

#[test]
fn a_segment_left_by_a_failed_creation_does_not_block_the_next_roll() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=3);
    // No room for the next segment, and the half-made one cannot be removed either.
    disk.set_capacity(Some(4096 + 32 + 64));
    disk.fail_next_remove();
    let mut n = 4;
    let err = loop {
        match wal.append(&payload(n)) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, WalError::NoSpace { .. }), "{err}");
    // Room again: the roll makes the segment anew over what was left.
    disk.set_capacity(None);
    assert_eq!(wal.append(&payload(n)).unwrap(), Lsn(n));
    append_synced(&mut wal, n + 1..=n + 3);
    drop(wal);
    let (_wal, records, _) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=n + 3));
}

/// A log opened with `options`, holding records 1..=3, whose fsync of record 4 hangs:
/// the disk holds syncs until released.
fn with_a_hung_fsync(options: Options) -> (MemDisk, leasemq_wal::Wal) {
    let disk = MemDisk::new();
    let storage = Arc::new(disk.clone());
    let (mut wal, _, _) = open_from(storage, dir(), options, Lsn(1)).unwrap();
    append_synced(&mut wal, 1..=3);
    disk.hold_syncs();
    wal.append(&payload(4)).unwrap();
    wal.submit().unwrap();
    disk.wait_for_held_sync();
    (disk, wal)
}

#[test]
fn a_close_gives_up_on_a_hung_fsync_and_the_log_then_writes_nothing_more() {
    let (disk, mut wal) = with_a_hung_fsync(Options {
        close_wait: std::time::Duration::from_millis(50),
        ..small(4096)
    });
    wal.append(&payload(5)).unwrap();
    wal.submit().unwrap(); // queued behind it
    let (done, closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(wal);
        done.send(()).unwrap();
    });
    closed
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the close returns though the fsync hangs");
    // The thread left behind keeps the directory.
    let err = open(&disk, small(4096)).unwrap_err();
    assert!(matches!(err, WalError::Locked { .. }), "{err}");
    // The fsync returns: record 4 is on the disk, and nothing more is written.
    disk.release_syncs();
    let started = std::time::Instant::now();
    let records = loop {
        match open(&disk, small(4096)) {
            Ok((_wal, records, _)) => break records,
            Err(WalError::Locked { .. }) if started.elapsed().as_secs() < 20 => {
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(records, expected(1..=4));
}

#[test]
fn a_disk_that_does_not_keep_up_refuses_changes_until_it_catches_up() {
    let (disk, mut wal) = with_a_hung_fsync(Options {
        max_unsynced_bytes: 2048,
        stall_after: std::time::Duration::from_millis(20),
        ..small(65536)
    });
    // What waits for the disk is bounded: past 2 KiB, a change is refused whole.
    let mut n = 5;
    let refused = loop {
        match wal.reserve(100) {
            Ok(()) => {
                wal.append(&payload(n)).unwrap();
                wal.submit().unwrap();
                n += 1;
            }
            Err(e) => break e,
        }
        assert!(n < 100, "no bound");
    };
    let WalError::Behind { unsynced, .. } = refused else {
        panic!("{refused}");
    };
    assert!(unsynced + 100 > 2048, "{unsynced}");
    // And once the fsync has hung past `stall_after`, the refusal says so.
    let started = std::time::Instant::now();
    let stalled = loop {
        if let Err(WalError::Behind {
            stalled: Some(d), ..
        }) = wal.reserve(0)
        {
            break d;
        }
        assert!(started.elapsed().as_secs() < 20, "never reported");
        std::thread::yield_now();
    };
    assert!(stalled >= std::time::Duration::from_millis(20));
    // A probe, from any thread, sees the same.
    let probe = wal.probe();
    let lag = std::thread::spawn(move || probe.lag()).join().unwrap();
    assert!(lag.stalled && !lag.failed && !lag.waits_for_room, "{lag:?}");
    assert!(lag.fsync_running.unwrap() >= stalled, "{lag:?}");
    assert!(lag.unsynced_bytes + 100 > 2048, "{lag:?}");
    assert_eq!(lag.durable, Lsn(3));
    // The disk catches up: changes are taken again, and nothing was lost.
    disk.release_syncs();
    assert_eq!(wal.sync().unwrap(), Lsn(n - 1));
    wal.reserve(100).unwrap();
    let lag = wal.probe().lag();
    assert!(!lag.stalled && lag.fsync_running.is_none(), "{lag:?}");
    assert_eq!((lag.unsynced_bytes, lag.durable), (0, Lsn(n - 1)));
    drop(wal);
    let (_wal, records, _) = open(&disk, small(65536)).unwrap();
    assert_eq!(records, expected(1..=n - 1));
}

#[test]
fn a_full_disk_inside_preallocated_space_refuses_changes_and_the_log_goes_on() {
    let disk = MemDisk::new();
    disk.copy_on_write();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=3);
    // Full: the next write needs room though its segment is preallocated.
    disk.set_capacity(Some(disk.used()));
    wal.append(&payload(4)).unwrap();
    wal.submit().unwrap();
    let started = std::time::Instant::now();
    let refused = loop {
        match wal.reserve(100) {
            Err(e) => break e,
            Ok(()) => assert!(started.elapsed().as_secs() < 20, "never refused"),
        }
        std::thread::yield_now();
    };
    assert!(matches!(refused, WalError::NoSpace { .. }), "{refused}");
    assert!(wal.probe().lag().waits_for_room);
    assert!(wal.check().is_ok(), "not poisoned");
    // Room again: the write is made, and changes are taken.
    disk.set_capacity(None);
    assert_eq!(wal.sync().unwrap(), Lsn(4));
    wal.reserve(100).unwrap();
    append_synced(&mut wal, 5..=6);
    drop(wal);
    let (_wal, records, _) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=6));
}
