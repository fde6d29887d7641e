//! A quick probe of the log on a real disk: records appended and synced per second in
//! batches, sync rounds per second, the latency of a round carrying one record, and
//! records recovered per second.
//!
//! `cargo run --release -p leasemq-wal --example wal_probe -- [DIR] [RECORDS] [BATCH]`
//! (defaults: a temporary directory under the current one, 2 000 000 records, batches
//! of 1 000, 16-byte payloads). Each batch is appended, then submitted; the syncer's
//! rounds take whatever batches arrived during the previous fsync.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use leasemq_wal::{DiskStorage, Lsn, Options, Wal};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "wal-probe.tmp".into()));
    let records: u64 = args.next().map_or(Ok(2_000_000), |s| s.parse())?;
    let batch: u64 = args.next().map_or(Ok(1_000), |s| s.parse())?;
    if dir.exists() {
        return Err(format!("{} exists: give a directory that does not", dir.display()).into());
    }
    let storage = Arc::new(DiskStorage);
    let payload = [0x5Au8; 16];

    let rounds = Arc::new(AtomicU64::new(0));
    let options = Options {
        on_progress: Some({
            let rounds = Arc::clone(&rounds);
            Arc::new(move || {
                rounds.fetch_add(1, Ordering::Relaxed);
            })
        }),
        ..Options::default()
    };
    let (mut wal, _) = Wal::open(storage.clone(), &dir, options, Lsn(1), |_, _| Ok(()))?;
    let start = Instant::now();
    let mut appended = 0;
    while appended < records {
        for _ in 0..batch.min(records - appended) {
            wal.append(&payload)?;
            appended += 1;
        }
        wal.submit()?;
    }
    let durable = wal.sync()?;
    let elapsed = start.elapsed();
    assert_eq!(durable, Lsn(records));
    let rounds = rounds.load(Ordering::Relaxed);

    // One record at a time, each waited for: the latency of a round (write + fdatasync).
    let mut latencies: Vec<f64> = (0..200)
        .map(|_| {
            let start = Instant::now();
            wal.append(&payload)?;
            wal.sync()?;
            Ok(start.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<Result<_, leasemq_wal::WalError>>()?;
    latencies.sort_by(f64::total_cmp);
    let total = records + latencies.len() as u64;
    let segments = wal.segments().len();
    drop(wal);
    println!(
        "append+sync: {records} records of 16 bytes in batches of {batch}: {:.3} s, \
         {:.0} records/s, {rounds} sync rounds ({:.0}/s, {:.0} records each), {segments} segments",
        elapsed.as_secs_f64(),
        records as f64 / elapsed.as_secs_f64(),
        rounds as f64 / elapsed.as_secs_f64(),
        records as f64 / rounds as f64,
    );

    println!(
        "one record per round: median {:.0} µs, p99 {:.0} µs over {} rounds",
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        latencies.len()
    );

    let start = Instant::now();
    let mut count = 0u64;
    let (_wal, report) = Wal::open(storage, &dir, Options::default(), Lsn(1), |_, p| {
        count += p.len() as u64 / 16;
        Ok(())
    })?;
    let elapsed = start.elapsed();
    assert_eq!(count, total);
    println!(
        "recovery: {} records in {:.3} s, {:.0} records/s",
        report.replayed,
        elapsed.as_secs_f64(),
        report.replayed as f64 / elapsed.as_secs_f64()
    );
    drop(_wal);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
