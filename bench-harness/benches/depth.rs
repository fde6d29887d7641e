//! The put → deliver → ack cycle of one engine shard with 1 k, 100 k, 1 M and 10 M messages
//! queued (ready, not leased) in the same queue; beside each size the single-`Mutex`
//! baseline holding the same backlog.
//!
//! One queue and one consumer whose prefetch ([`PREFETCH`]) is always used up, so the
//! backlog cannot drain: every put lands at the back of the deep ready list, and every ack
//! frees one credit, which delivers the message at the front. Each message thus passes
//! through the whole backlog, and the one delivered was put `N` cycles earlier, its memory
//! long out of cache: this is the cost of a deep queue a consumer actually reads, which a
//! backlog parked in a sibling queue would not show. Time stands still (leases last 30 s).
//!
//! Each size is set up once, on its first measurement, and dropped before the next; 10 M
//! messages take about 1 GB in the engine and 0.5 GB in the baseline, one at a time.
//! Outside `cargo bench` (`cargo test --benches`) only the two smaller sizes run.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leasemq_bench_harness::baseline::{MutexConsumer, MutexQueue};
use leasemq_bench_harness::engine::{self, body, NOW};
use leasemq_bench_harness::is_bench_run;
use leasemq_engine::{
    Command, ConsumerKey, DeliveryTag, Effects, Message, PutOutcome, QueueConfig, QueueKey, Reply,
    Settle, Shard,
};

/// Backlogs measured, with their names in the benchmark ids.
const SIZES: [(usize, &str); 4] = [
    (1_000, "1k"),
    (100_000, "100k"),
    (1_000_000, "1M"),
    (10_000_000, "10M"),
];
/// Sizes above this run only under `cargo bench`.
const TEST_MODE_MAX: usize = 100_000;
/// Leases the consumer holds throughout: its whole prefetch.
const PREFETCH: u32 = 64;
/// Messages per `put_batch` while filling the backlog.
const FILL_BATCH: usize = 4_096;

/// One shard, one queue holding a backlog, one consumer with no credit left.
struct EngineDepth {
    shard: Shard,
    /// Reused by every call: the benchmark measures the engine, not allocation.
    out: Effects,
    queue: QueueKey,
    /// Live tags, oldest first.
    outstanding: VecDeque<DeliveryTag>,
}

impl EngineDepth {
    /// `queued` messages ready and [`PREFETCH`] leased.
    fn new(queued: usize) -> EngineDepth {
        let mut shard = Shard::new(0, Duration::from_millis(1));
        let mut out = Effects::new();
        let queue = engine::declare(&mut shard, &mut out, "depth");
        let mut left = queued + PREFETCH as usize;
        while left > 0 {
            let n = left.min(FILL_BATCH);
            let messages = (0..n).map(|_| Message::new(body())).collect();
            shard.handle(NOW, Command::PutBatch { queue, messages }, &mut out);
            let reply = out.reply.take();
            assert!(matches!(reply, Some(Reply::PutBatch(Ok(v))) if v.len() == n));
            left -= n;
        }
        engine::consume(&mut shard, &mut out, queue, "reader", PREFETCH);
        let mut depth = EngineDepth {
            shard,
            out,
            queue,
            outstanding: VecDeque::with_capacity(PREFETCH as usize + 1),
        };
        depth.take_deliveries();
        let stats = depth.shard.stats(queue).expect("the queue is live");
        assert_eq!((stats.ready, stats.leased), (queued, PREFETCH as usize));
        depth
    }

    /// Moves the deliveries of the last command into `outstanding`.
    fn take_deliveries(&mut self) {
        for (key, delivered) in self.out.deliveries.drain(..) {
            black_box::<ConsumerKey>(key);
            self.outstanding.push_back(delivered.tag);
            black_box(delivered.body);
        }
    }

    /// A put to the back of the backlog, then an ack that delivers its front.
    fn cycle(&mut self) {
        engine::put(&mut self.shard, &mut self.out, self.queue);
        assert!(self.out.deliveries.is_empty(), "no credit: the put waits");
        let tag = self.outstanding.pop_front().expect("a lease outstanding");
        let ack = Command::Settle {
            queue: self.queue,
            tag,
            op: Settle::Ack,
        };
        self.shard.handle(NOW, ack, &mut self.out);
        assert_eq!(self.out.reply.take(), Some(Reply::Settled(true)));
        assert_eq!(self.out.deliveries.len(), 1, "the freed credit delivers");
        self.take_deliveries();
    }
}

/// The baseline holding the same backlog, its consumer pulling once per freed credit.
struct BaselineDepth {
    queue: MutexQueue,
    consumer: MutexConsumer,
    outstanding: VecDeque<DeliveryTag>,
    /// The clock reading every call gets: time stands still, as for the engine.
    now: Instant,
}

impl BaselineDepth {
    fn new(queued: usize) -> BaselineDepth {
        let queue = MutexQueue::new(QueueConfig::default().ack_timeout);
        let mut left = queued + PREFETCH as usize;
        while left > 0 {
            let n = left.min(FILL_BATCH);
            assert_eq!(queue.put_batch((0..n).map(|_| body()).collect()).len(), n);
            left -= n;
        }
        let consumer = queue.consume(PREFETCH);
        let now = Instant::now();
        let outstanding = (0..PREFETCH)
            .map(|_| consumer.try_recv_at(now).expect("ready").tag)
            .collect();
        assert!(consumer.try_recv_at(now).is_none(), "no credit left");
        assert_eq!((queue.ready(), queue.leased()), (queued, PREFETCH as usize));
        BaselineDepth {
            queue,
            consumer,
            outstanding,
            now,
        }
    }

    fn cycle(&mut self) {
        assert_eq!(self.queue.put(body()), PutOutcome::Enqueued);
        let tag = self.outstanding.pop_front().expect("a lease outstanding");
        assert!(self.queue.ack_at(tag, self.now));
        let delivery = self.consumer.try_recv_at(self.now).expect("the front");
        self.outstanding.push_back(delivery.tag);
        black_box(delivery.body);
    }
}

fn depth(c: &mut Criterion) {
    let mut group = c.benchmark_group("depth_cycle");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let bench_run = is_bench_run();
    for (queued, name) in SIZES {
        if !bench_run && queued > TEST_MODE_MAX {
            continue;
        }
        // Built on first use, so that a filtered-out size costs nothing.
        let mut engine = None;
        group.bench_function(format!("{name}/leasemq"), |b| {
            let engine = engine.get_or_insert_with(|| EngineDepth::new(queued));
            b.iter(|| engine.cycle())
        });
        drop(engine);
        let mut baseline = None;
        group.bench_function(format!("{name}/baseline-mutex"), |b| {
            let baseline = baseline.get_or_insert_with(|| BaselineDepth::new(queued));
            b.iter(|| baseline.cycle())
        });
        drop(baseline);
    }
    group.finish();
}

criterion_group!(benches, depth);
criterion_main!(benches);
