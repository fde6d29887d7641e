//! Disk use of a durable queue that holds about a thousand messages while many pass
//! through it: the log is compacted by snapshots, so what stays on disk follows what the
//! queue holds, not what passed. Prints the data dir's size as it goes and at the end.
//!
//! ```sh
//! cargo run --release --example compaction -- 10000000
//! ```

use std::time::Instant;

#[path = "support/disk.rs"]
mod disk;
use disk::disk_use;

use leasemq::{Broker, ConsumerConfig, DeliveryTag, Message, QueueConfig};

fn main() -> Result<(), leasemq::Error> {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(10_000_000, |a| a.parse().expect("a message count"));
    let dir = tempfile::tempdir().expect("a temp dir");
    let broker = Broker::builder().shards(2).data_dir(dir.path()).build()?;
    let durable = QueueConfig {
        durable: true,
        ..QueueConfig::default()
    };
    let q = broker.declare_queue("through", durable)?;
    let c = q.consume("worker", ConsumerConfig { prefetch: 2_000 })?;
    let started = Instant::now();
    let (mut put, mut peak) = (0u64, 0u64);
    let mut delivered: Vec<DeliveryTag> = Vec::new();
    while put < n {
        let batch = (0..1_000).map(|_| Message::new(&b"0123456789abcdef"[..]));
        q.put_batch(batch.collect())?;
        put += 1_000;
        while let Some(d) = c.try_recv()? {
            delivered.push(d.tag());
        }
        // Ack all but the last thousand delivered: the queue holds about a thousand.
        if delivered.len() > 1_000 {
            let upto = delivered[delivered.len() - 1_001];
            c.ack_up_to(upto);
            delivered.drain(..delivered.len() - 1_000);
        }
        if put % 1_000_000 == 0 {
            let bytes = disk_use(dir.path());
            peak = peak.max(bytes);
            println!(
                "{:>5.1} M through, {} held, data dir {:.1} MiB",
                put as f64 / 1e6,
                q.stats().leased + q.stats().ready,
                bytes as f64 / (1 << 20) as f64
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let held = q.stats().leased + q.stats().ready;
    broker.shutdown();
    let bytes = disk_use(dir.path());
    println!(
        "{n} messages through in {secs:.1} s ({:.0} msg/s); {held} held at the end; \
         data dir {:.1} MiB at the end, {:.1} MiB at most while running",
        n as f64 / secs,
        bytes as f64 / (1 << 20) as f64,
        peak.max(bytes) as f64 / (1 << 20) as f64
    );
    Ok(())
}
