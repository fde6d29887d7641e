//! Model-based crash test: random appends, submits, syncs, snapshots, truncations of the
//! tail and crashes on the fake disk, against a plain `Vec` of what was appended; after
//! each sync, what the log reads back.
//!
//! After every crash, recovery must give back a prefix of what was appended that holds
//! every record the log had called durable; the model is cut to that prefix and the run
//! goes on. A failure prints its seed; `WAL_MODEL_SEED=<seed>` replays it alone.

mod common;

use std::sync::Arc;

use common::*;
use leasemq_wal::{latest_snapshot, write_snapshot, Crash, Lsn, MemDisk, Storage, Wal};

/// What the test believes: every record appended, by lsn - 1, and the snapshot's lsn.
struct Model {
    records: Vec<Vec<u8>>,
    snapshot: u64,
}

fn open_model(disk: &MemDisk, options: &leasemq_wal::Options) -> (Wal, Records, u64) {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let snapshot = latest_snapshot(&*storage, dir())
        .unwrap()
        .map_or(0, |s| s.lsn.0);
    let (wal, records, _) = open_from(storage, dir(), options.clone(), Lsn(snapshot + 1)).unwrap();
    (wal, records, snapshot)
}

fn run(seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let segment_bytes = [256, 512, 2048, 8192][rng.u64(..4) as usize];
    let options = small(segment_bytes);
    let mut disk = MemDisk::new();
    // Half the runs on a device whose torn sectors read as garbage.
    let garble = rng.bool();
    if garble {
        disk.garble_torn_sectors();
    }
    let (mut wal, _, _) = open_model(&disk, &options);
    let mut model = Model {
        records: Vec::new(),
        snapshot: 0,
    };
    // While syncs are held at the disk's gate, a submitted round is written but not
    // synced: a crash then meets an fsync in flight, with unsynced sectors to tear.
    let mut held = false;
    let mut unsubmitted = false;
    for step in 0..400 {
        if held && rng.u64(..30) == 0 {
            disk.release_syncs();
            held = false;
        }
        match rng.u64(..100) {
            0..=2 => {
                // A truncation, never of what a snapshot covers; it syncs first.
                disk.release_syncs();
                held = false;
                unsubmitted = false;
                let len = model.records.len() as u64;
                let keep = model.snapshot + rng.u64(..=len - model.snapshot);
                wal.truncate_after(Lsn(keep)).unwrap();
                model.records.truncate(keep as usize);
                if keep < len {
                    assert_eq!(wal.durable().0, keep, "seed {seed} step {step}");
                }
            }
            3..=54 => {
                let max = if rng.u64(..10) == 0 { 200 } else { 40 };
                let len = rng.u64(..max) as usize;
                let payload: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                let lsn = wal.append(&payload).unwrap();
                model.records.push(payload);
                unsubmitted = true;
                assert_eq!(lsn.0, model.records.len() as u64, "seed {seed} step {step}");
            }
            55..=69 => {
                wal.submit().unwrap();
                let fresh = std::mem::take(&mut unsubmitted);
                if held && fresh {
                    disk.wait_for_held_sync();
                }
            }
            70..=74 => {
                disk.hold_syncs();
                held = true;
            }
            75..=82 => {
                disk.release_syncs();
                held = false;
                unsubmitted = false;
                let durable = wal.sync().unwrap();
                assert_eq!(
                    durable.0,
                    model.records.len() as u64,
                    "seed {seed} step {step}"
                );
                let from = model.snapshot + 1;
                let read = wal.read(Lsn(from), Lsn(durable.0 + 1)).unwrap();
                let want: Records = (from..=durable.0)
                    .map(|lsn| (Lsn(lsn), model.records[lsn as usize - 1].clone()))
                    .collect();
                assert_eq!(read, want, "seed {seed} step {step}: read back");
            }
            83..=87 => {
                // A snapshot covers what is durable; then the segments before it go.
                disk.release_syncs();
                held = false;
                let durable = wal.durable().0;
                if durable > model.snapshot {
                    write_snapshot(&disk, dir(), Lsn(durable), &durable.to_le_bytes()).unwrap();
                    model.snapshot = durable;
                    wal.remove_before(Lsn(durable + 1)).unwrap();
                }
            }
            _ => {
                let durable = wal.durable().0;
                let mode = match rng.u64(..4) {
                    0 => Crash::KeepUnsynced,
                    1 => Crash::LoseUnsynced,
                    _ => Crash::Tear { seed: rng.u64(..) },
                };
                let after = disk.crash(mode);
                drop(wal); // its syncer meets the crashed disk and stops
                disk = after;
                if garble {
                    disk.garble_torn_sectors();
                }
                held = false;
                unsubmitted = false;
                let (reopened, records, snapshot) = open_model(&disk, &options);
                wal = reopened;
                assert_eq!(
                    snapshot, model.snapshot,
                    "seed {seed} step {step}: snapshot"
                );
                let kept = snapshot + records.len() as u64;
                assert!(
                    kept >= durable,
                    "seed {seed} step {step} ({mode:?}): recovered up to {kept}, durable was {durable}"
                );
                assert!(
                    kept <= model.records.len() as u64,
                    "seed {seed} step {step}"
                );
                for (lsn, payload) in &records {
                    assert_eq!(
                        payload,
                        &model.records[lsn.0 as usize - 1],
                        "seed {seed} step {step}: record {lsn}"
                    );
                }
                let first = records.first().map_or(kept + 1, |r| r.0 .0);
                assert_eq!(first, snapshot + 1, "seed {seed} step {step}: replay start");
                model.records.truncate(kept as usize);
                assert_eq!(wal.durable().0, kept);
            }
        }
    }
    disk.release_syncs();
    let durable = wal.sync().unwrap();
    drop(wal);
    let (_wal, records, snapshot) = open_model(&disk, &options);
    assert_eq!(durable.0, model.records.len() as u64);
    let want: Records = (snapshot + 1..=durable.0)
        .map(|lsn| (Lsn(lsn), model.records[lsn as usize - 1].clone()))
        .collect();
    assert_eq!(records, want, "seed {seed}: final replay");
}

#[test]
fn recovery_after_random_crashes_keeps_a_prefix_with_everything_durable() {
    if let Ok(seed) = std::env::var("WAL_MODEL_SEED") {
        run(seed.parse().expect("WAL_MODEL_SEED is a number"));
        return;
    }
    let seeds: u64 = std::env::var("WAL_MODEL_SEEDS").map_or(200, |n| n.parse().unwrap());
    for seed in 0..seeds {
        run(seed);
    }
}
