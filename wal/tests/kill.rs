//! The log on real files under `kill -9`: a child process appends, snapshots and recycles
//! segments as fast as it can, printing each durable lsn it sees; the parent kills it at
//! a random moment and reopens the log. Every lsn the child called durable must be back,
//! every record must be the one appended with its lsn, and the log must go on from there
//! in the next child.
//!
//! Segments of 64 KiB and a snapshot every 32 records make each short life roll, compact
//! and recycle many segments. `WAL_KILL_CYCLES=<n>` sets the number of kills (a few by
//! default), `WAL_KILL_SEED=<n>` the seed of the kill times.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::Records;
use leasemq_wal::{latest_snapshot, write_snapshot, DiskStorage, Lsn, Options, Wal};

const DIR_VAR: &str = "WAL_KILL_CHILD_DIR";
const SEGMENT_BYTES: u64 = 64 << 10;

/// The payload of record `lsn`, the same in every life of the log: a lost record's lsn is
/// reused for the same bytes, so what comes back can be checked by its lsn alone.
fn payload(lsn: u64) -> Vec<u8> {
    let len = (lsn * 37 % 300) as usize;
    (0..len)
        .map(|i| (lsn as u8).wrapping_add(i as u8))
        .collect()
}

fn options() -> Options {
    Options {
        segment_bytes: SEGMENT_BYTES,
        ..Options::default()
    }
}

/// Opens the log after its latest snapshot; returns it, the snapshot's lsn and the
/// records replayed.
fn open(dir: &Path) -> (Wal, u64, Records) {
    let storage = Arc::new(DiskStorage);
    let snapshot = latest_snapshot(&*storage, dir)
        .expect("the snapshot reads")
        .map_or(0, |s| s.lsn.0);
    let mut records = Vec::new();
    let (wal, _) = Wal::open(storage, dir, options(), Lsn(snapshot + 1), |lsn, p| {
        records.push((lsn, p.to_vec()));
        Ok(())
    })
    .expect("the log opens");
    (wal, snapshot, records)
}

/// The child: appends in batches until killed, printing `durable <lsn>` whenever the
/// durable lsn moved, and writes a snapshot (of nothing: the records are checked by
/// their lsns) every 32 records, after which the segments it covers are recycled.
#[test]
#[ignore = "the child process of durable_records_survive_kill_9_with_recycled_segments"]
fn kill_child() {
    let dir = std::env::var(DIR_VAR).expect("run by the kill test");
    let dir = Path::new(&dir);
    let (mut wal, mut snapshot, _) = open(dir);
    let mut out = std::io::stdout().lock();
    let mut printed = 0;
    for round in 0u64.. {
        for _ in 0..1 + round % 7 {
            let lsn = wal.last_appended().0 + 1;
            assert_eq!(wal.append(&payload(lsn)).unwrap(), Lsn(lsn));
        }
        if round % 5 == 0 {
            wal.sync().unwrap();
        } else {
            wal.submit().unwrap();
        }
        let durable = wal.durable().0;
        if durable > printed {
            writeln!(out, "durable {durable}").unwrap();
            out.flush().unwrap();
            printed = durable;
        }
        if durable >= snapshot + 32 {
            write_snapshot(&DiskStorage, dir, Lsn(durable), b"").unwrap();
            wal.remove_before(Lsn(durable + 1)).unwrap();
            snapshot = durable;
        }
    }
}

#[test]
fn durable_records_survive_kill_9_with_recycled_segments() {
    let cycles: u64 = std::env::var("WAL_KILL_CYCLES")
        .map_or(4, |n| n.parse().expect("WAL_KILL_CYCLES is a number"));
    let seed: u64 = std::env::var("WAL_KILL_SEED").map_or_else(
        |_| fastrand::u64(..),
        |n| n.parse().expect("WAL_KILL_SEED is a number"),
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut spares_seen = 0;
    let mut last = 0;
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "kill_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_VAR, dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let reader = std::thread::spawn(move || {
            // The kill may cut the last line short: a number cut short is smaller, so
            // taking it would only ask for less.
            stdout
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.strip_prefix("durable ")?.parse::<u64>().ok())
                .max()
                .unwrap_or(0)
        });
        // The kill lands anywhere from the child's recovery to well into its work.
        std::thread::sleep(Duration::from_millis(rng.u64(10..300)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let durable = reader.join().unwrap();
        spares_seen += common::spares_on_disk(dir);

        let (wal, snapshot, records) = open(dir);
        let kept = wal.last_appended().0;
        assert!(
            kept >= durable.max(last),
            "seed {seed} cycle {cycle}: the log ends at {kept}, {durable} was durable"
        );
        for (i, (lsn, bytes)) in records.iter().enumerate() {
            assert_eq!(lsn.0, snapshot + 1 + i as u64, "seed {seed} cycle {cycle}");
            assert_eq!(
                bytes,
                &payload(lsn.0),
                "seed {seed} cycle {cycle}: record {lsn}"
            );
        }
        assert_eq!(
            kept,
            snapshot + records.len() as u64,
            "seed {seed} cycle {cycle}"
        );
        // What recovery found is on disk now: the next life starts from it.
        last = kept;
    }
    eprintln!(
        "seed {seed}: {cycles} kills, log at lsn {last}, {spares_seen} spares found after kills"
    );
    assert!(last > 0 || cycles == 0, "the children appended nothing");
}
