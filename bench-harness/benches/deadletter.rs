//! `reject` of a leased message whose queue's dead-letter queue is on another shard, beside
//! the same reject with the dead-letter queue on the same shard.
//!
//! Both run on one 2-shard broker under the system clock. The names are chosen with
//! [`Broker::shard_of`]: both source queues are on shard 0, one with its dead-letter queue
//! on shard 1 (`cross-shard/leasemq`) and one with it on shard 0 (`baseline-same-shard`).
//! `reject` returns once the dead letter has landed: across shards that is the caller's
//! request to shard 0, the letter to shard 1, its outcome back to shard 0 and the answer
//! to the caller; on one shard, the request and the answer.
//!
//! Outside the timing, each run of up to [`CHUNK`] rejects first puts and receives that
//! many messages, and afterwards empties the dead-letter queue (a consumer reads and acks
//! every letter, then cancels), so that neither queue grows from run to run. One element
//! is one reject.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use leasemq::{Broker, Consumer, ConsumerConfig, Delivery, Message, Queue, QueueConfig};

/// Rejects per untimed refill: within one consumer's prefetch.
const CHUNK: usize = 4_096;
/// Messages per `put_batch` of a refill.
const PUT_BATCH: usize = 256;
/// Long enough that no lease runs out during a run.
const ACK_TIMEOUT: Duration = Duration::from_secs(600);

/// A queue, its dead-letter queue, and a consumer of the queue.
struct Pair {
    source: Queue,
    dead: Queue,
    consumer: Consumer,
}

impl Pair {
    fn declare(broker: &Broker, source: &str, dead: &str) -> Pair {
        let dead_queue = broker
            .declare_queue(dead, QueueConfig::default())
            .expect("declare the dead-letter queue");
        let config = QueueConfig {
            ack_timeout: ACK_TIMEOUT,
            dead_letter: Some(dead.to_string()),
            ..QueueConfig::default()
        };
        let source = broker.declare_queue(source, config).expect("declare");
        let prefetch = u32::try_from(CHUNK).expect("fits a prefetch");
        let consumer = source
            .consume("rejecter", ConsumerConfig { prefetch })
            .expect("consume");
        Pair {
            source,
            dead: dead_queue,
            consumer,
        }
    }

    /// `n` fresh deliveries to reject.
    fn leased(&self, n: usize) -> Vec<Delivery> {
        let mut left = n;
        while left > 0 {
            let batch = left.min(PUT_BATCH);
            let messages = (0..batch).map(|_| Message::new("doomed")).collect();
            self.source.put_batch(messages).expect("put_batch");
            left -= batch;
        }
        (0..n)
            .map(|_| self.consumer.recv().expect("delivered"))
            .collect()
    }

    /// Reads and acks the `n` dead letters that landed, leaving the dead-letter queue empty.
    fn drain_dead(&self, n: usize) {
        let prefetch = u32::try_from(CHUNK).expect("fits a prefetch");
        let reader = self
            .dead
            .consume("drain", ConsumerConfig { prefetch })
            .expect("consume the dead letters");
        let mut last = None;
        for _ in 0..n {
            last = Some(reader.recv().expect("a dead letter").tag());
        }
        if let Some(last) = last {
            assert_eq!(reader.ack_up_to(last), n);
        }
        reader.cancel();
    }

    /// Rejects `iters` leased messages; returns the time spent in `reject` alone.
    fn time_rejects(&self, iters: u64) -> Duration {
        let mut spent = Duration::ZERO;
        let mut left = usize::try_from(iters).expect("iterations fit usize");
        while left > 0 {
            let n = left.min(CHUNK);
            let deliveries = self.leased(n);
            let start = Instant::now();
            for delivery in &deliveries {
                assert!(delivery.reject());
            }
            spent += start.elapsed();
            self.drain_dead(n);
            left -= n;
        }
        spent
    }
}

/// The first name `prefix-<i>` that lands on `shard`.
fn name_on(broker: &Broker, prefix: &str, shard: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| broker.shard_of(name) == shard)
        .expect("some name lands on every shard")
}

fn bench_pair(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, id: &str, p: Pair) {
    group.bench_function(id, |b| b.iter_custom(|iters| p.time_rejects(iters)));
    let stats = p.dead.stats();
    assert_eq!(
        (stats.ready, stats.leased),
        (0, 0),
        "drained after every run"
    );
}

fn dead_letter(c: &mut Criterion) {
    let mut group = c.benchmark_group("dead_letter_reject");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let broker = Broker::builder().shards(2).build().expect("broker");
    let cross = Pair::declare(
        &broker,
        &name_on(&broker, "work-cross", 0),
        &name_on(&broker, "dead-remote", 1),
    );
    let local = Pair::declare(
        &broker,
        &name_on(&broker, "work-local", 0),
        &name_on(&broker, "dead-local", 0),
    );
    assert_ne!(cross.source.shard(), cross.dead.shard());
    assert_eq!(local.source.shard(), local.dead.shard());
    bench_pair(&mut group, "cross-shard/leasemq", cross);
    bench_pair(&mut group, "baseline-same-shard", local);
    group.finish();
    broker.shutdown();
}

criterion_group!(benches, dead_letter);
criterion_main!(benches);
