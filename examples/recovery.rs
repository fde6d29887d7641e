//! How long a broker takes to come back with many durable messages queued: puts N messages
//! (16-byte bodies, in batches) on durable queues across the shards, shuts down, and times
//! `build` on the same data dir, which replays every shard's log (in parallel), then
//! counts what came back, twice. The logs are compacted by snapshots as they grow, so a
//! restart reads the latest snapshot and the records after it.
//!
//! ```sh
//! cargo run --release --example recovery -- 1000000
//! ```

use std::time::Instant;

#[path = "support/disk.rs"]
mod disk;
use disk::disk_use;

use leasemq::{Broker, Message, QueueConfig};

fn main() -> Result<(), leasemq::Error> {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.parse().expect("a message count"));
    let shards = 2;
    let dir = tempfile::tempdir().expect("a temp dir");
    let durable = QueueConfig {
        durable: true,
        ..QueueConfig::default()
    };
    let names: Vec<String> = (0..8).map(|i| format!("backlog-{i}")).collect();

    let broker = Broker::builder()
        .shards(shards)
        .data_dir(dir.path())
        .build()?;
    let queues: Vec<_> = names
        .iter()
        .map(|name| broker.declare_queue(name, durable.clone()))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let batch = 1_000;
    for round in 0..n.div_ceil(batch) {
        let messages = (0..batch.min(n - round * batch))
            .map(|_| Message::new(&b"0123456789abcdef"[..]))
            .collect();
        queues[round % queues.len()].put_batch(messages)?;
    }
    let put_secs = started.elapsed().as_secs_f64();
    println!(
        "put {n} durable messages in {put_secs:.2} s ({:.0} msg/s, batches of {batch}, 2 shards)",
        n as f64 / put_secs
    );
    broker.shutdown();
    let on_disk = disk_use(dir.path());
    println!("data dir: {:.1} MiB", on_disk as f64 / (1 << 20) as f64);

    for pass in ["once", "twice"] {
        let started = Instant::now();
        let broker = Broker::builder().data_dir(dir.path()).build()?;
        let secs = started.elapsed().as_secs_f64();
        let back: usize = names
            .iter()
            .map(|name| broker.queue(name).map_or(0, |q| q.stats().ready))
            .sum();
        println!(
            "restart {pass}: build took {secs:.2} s, {back} messages back ({:.0} msg/s)",
            back as f64 / secs
        );
        assert_eq!(back, n, "every durable message is back");
        broker.shutdown();
    }
    Ok(())
}
