//! Recovery of the write-ahead log (`leasemq-wal`) from whatever a crash and damage leave.
//!
//! Arbitrary bytes become a log on the fake disk (`MemDisk`) with small segments: records
//! of chosen sizes, one write per submit, syncs (one of which may fail, poisoning the
//! log), snapshots after which the covered segments are removed or set aside and
//! recycled, so that segments hold the old frames of their last use, truncations of the
//! tail, and snapshots installed inside the log or past its end. Then a crash
//! (unsynced sectors kept, lost, or torn, perhaps garbled, and each directory operation
//! kept or lost, with the last write possibly still in its fsync), and perhaps a few
//! overwrites of chosen bytes of chosen files. The target panics when:
//!
//! - recovery fails, or gives back anything but the records appended, with every record
//!   that was durable, after a crash alone; or gives back a record written after a failed
//!   fsync;
//! - recovery after damage gives back records that are not numbered one after another
//!   from the snapshot on;
//! - a log that recovery accepted does not reopen with the same records and no torn
//!   tail, or loses records appended after it.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasemq_sim::fuzz::ByteSource;
use leasemq_wal::{
    latest_snapshot, write_snapshot, Crash, Lsn, MemDisk, Options, RecoveryReport, Storage, Wal,
    WalError,
};
use libfuzzer_sys::fuzz_target;

const DIR: &str = "/log";
/// Steps that build the log, at most.
const MAX_STEPS: usize = 96;

type Records = Vec<(u64, Vec<u8>)>;

fn options(segment_bytes: u64) -> Options {
    Options {
        segment_bytes,
        max_record_bytes: segment_bytes as usize - 24,
        ..Options::default()
    }
}

fn open(disk: &MemDisk, segment_bytes: u64) -> Result<(Wal, Records, RecoveryReport), WalError> {
    let from = latest_snapshot(disk, Path::new(DIR))?.map_or(1, |s| s.lsn.0 + 1);
    let mut records = Vec::new();
    let (wal, report) = Wal::open(
        Arc::new(disk.clone()),
        Path::new(DIR),
        options(segment_bytes),
        Lsn(from),
        |lsn, payload| {
            records.push((lsn.0, payload.to_vec()));
            Ok(())
        },
    )?;
    Ok((wal, records, report))
}

fn files(disk: &MemDisk) -> Vec<PathBuf> {
    let mut names = disk.list(Path::new(DIR)).unwrap_or_default();
    names.sort();
    names.into_iter().map(|n| Path::new(DIR).join(n)).collect()
}

fuzz_target!(|data: &[u8]| {
    let mut input = ByteSource::new(data);
    let segment_bytes = [256, 512, 1024][input.take(1) as usize % 3];
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, segment_bytes).expect("a new log opens");
    // Every record appended, by lsn - 1.
    let mut appended: Vec<Vec<u8>> = Vec::new();
    let mut snapshot = 0;
    let mut unsubmitted = false;
    // The durable lsn when an fsync failed: nothing after it may come back.
    let mut poisoned = None;
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        match input.take(1) % 8 {
            0..=3 => {
                let len = input.take(1) as usize % 100;
                let payload = input.bytes(len).to_vec();
                let lsn = wal.append(&payload).expect("an append");
                assert_eq!(lsn.0, appended.len() as u64 + 1);
                appended.push(payload);
                unsubmitted = true;
            }
            4 | 5 => {
                wal.submit().expect("a submit");
                unsubmitted = false;
            }
            6 if unsubmitted && input.take(1).is_multiple_of(8) => {
                disk.fail_next_sync();
                wal.sync().expect_err("the failed fsync poisons the log");
                poisoned = Some(wal.durable().0);
                break;
            }
            6 => {
                wal.sync().expect("a sync");
                unsubmitted = false;
            }
            7 if input.take(1).is_multiple_of(2) => {
                // A truncation, as a Raft follower makes: never of what a snapshot covers.
                let last = appended.len() as u64;
                let keep = snapshot + input.take(1) % (last - snapshot + 1);
                wal.truncate_after(Lsn(keep)).expect("a truncation");
                appended.truncate(keep as usize);
                unsubmitted = false;
            }
            7 if input.take(1).is_multiple_of(2) => {
                // A leader's snapshot, past the log's end or inside it.
                let lsn = snapshot + 1 + input.take(1) % (appended.len() as u64 + 8 - snapshot);
                wal.install_snapshot(Lsn(lsn), &lsn.to_le_bytes())
                    .expect("an installed snapshot");
                if appended.len() < lsn as usize {
                    // Records it covers are never replayed.
                    appended.resize(lsn as usize, Vec::new());
                }
                snapshot = lsn;
                unsubmitted = false;
            }
            _ => {
                let durable = wal.durable().0;
                if durable > snapshot {
                    write_snapshot(&disk, Path::new(DIR), Lsn(durable), &durable.to_le_bytes())
                        .expect("a snapshot");
                    snapshot = durable;
                    wal.remove_before(Lsn(durable + 1)).expect("a removal");
                    wal.sync().expect("a sync");
                    unsubmitted = false;
                }
            }
        }
    }
    // The crash, perhaps with the last write written and its fsync not done.
    if unsubmitted && poisoned.is_none() && input.take(1).is_multiple_of(2) {
        disk.hold_syncs();
        wal.submit().expect("a submit");
        disk.wait_for_held_sync();
    }
    let durable = wal.durable().0;
    let mode = match input.take(1) % 3 {
        0 => Crash::KeepUnsynced,
        1 => Crash::LoseUnsynced,
        _ => Crash::Tear {
            seed: input.take(8),
        },
    };
    if input.take(1).is_multiple_of(2) {
        disk.garble_torn_sectors();
    }
    let crashed = disk.crash(mode);
    drop(wal); // its syncer meets the crashed disk and stops
    let damages = input.take(1) % 4;
    for _ in 0..damages {
        let files = files(&crashed);
        if files.is_empty() {
            break;
        }
        let path = &files[input.take(1) as usize % files.len()];
        let len = crashed.contents(path).map_or(0, |c| c.len());
        if len == 0 {
            continue;
        }
        let at = input.take(4) as usize % len;
        let n = (input.take(1) as usize % 16 + 1).min(len - at);
        let bytes = input.bytes(n).to_vec();
        crashed.damage(path, at as u64, &bytes);
    }

    let (mut wal, records, _) = match open(&crashed, segment_bytes) {
        Ok(opened) => opened,
        Err(e) if damages > 0 => {
            // Damage may be refused; a refusal names where it is.
            let _ = e.to_string();
            return;
        }
        Err(e) => panic!("recovery after a crash alone failed: {e}"),
    };
    let from = records.first().map(|r| r.0);
    for (i, (lsn, _)) in records.iter().enumerate() {
        assert_eq!(Some(*lsn), from.map(|f| f + i as u64), "lsns in order");
    }
    if damages == 0 {
        let kept = records.last().map_or(snapshot, |r| r.0);
        assert!(
            kept >= durable,
            "recovered up to {kept}, durable was {durable}"
        );
        assert!(
            poisoned.is_none_or(|p| kept <= p),
            "a record written after the failed fsync came back"
        );
        assert!(
            from.is_none_or(|f| f == snapshot + 1),
            "replay starts after the snapshot"
        );
        for (lsn, payload) in &records {
            assert_eq!(payload, &appended[*lsn as usize - 1], "record {lsn}");
        }
    }
    // The log goes on: what it accepted comes back as it is, with what is appended next.
    let next = wal.last_appended().0 + 1;
    let more: Vec<Vec<u8>> = (0..2).map(|i| vec![0xC5; 7 + i]).collect();
    for (i, payload) in more.iter().enumerate() {
        assert_eq!(wal.append(payload).expect("an append").0, next + i as u64);
    }
    wal.sync().expect("a sync after recovery");
    drop(wal);
    let (_wal, again, report) = open(&crashed, segment_bytes).expect("a recovered log reopens");
    assert_eq!(report.torn, None, "a torn tail came back");
    let mut want = records;
    want.extend(
        more.into_iter()
            .enumerate()
            .map(|(i, p)| (next + i as u64, p)),
    );
    assert_eq!(again, want, "what came back after the log went on");
});
