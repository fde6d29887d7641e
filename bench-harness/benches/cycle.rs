//! The put → deliver → ack cycle of one engine shard, driven directly (no threads, no
//! clock, no channels), with 100 000 leases outstanding throughout; beside it the
//! single-`Mutex` baseline doing the same cycle.
//!
//! One queue, two consumers (a consumer holds at most 65 535 leases). Before measuring,
//! 100 000 messages are put and delivered; then each iteration puts, takes the delivery
//! and acks the oldest outstanding tag, so the lease table stays at 100 000. The batched
//! variant does the same 64 messages at a time: one `put_batch`, then the 64 oldest
//! tags settled with one `AckUpTo` per consumer (or one `SettleBatch`). Time stands still
//! (leases last 30 s), so no lease expires and the wheel only inserts and cancels. The
//! single cycle runs twice more with consumer priorities, so that each delivery first
//! finds the highest priority with credit: with the two consumers at different
//! priorities, and with 64 consumers at one priority above a 65th (a delivery finds where
//! that priority's consumers begin and end in the queue's list, and its turn among them).

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use leasemq_bench_harness::baseline::{MutexConsumer, MutexQueue};
use leasemq_bench_harness::engine::{self, body, NOW};
use leasemq_engine::{
    Command, ConsumerKey, DeliveryTag, Effects, Message, PutOutcome, QueueConfig, QueueKey, Reply,
    Settle, Shard, MAX_PREFETCH,
};

/// Leases outstanding throughout.
const OUTSTANDING: usize = 100_000;
const CONSUMERS: usize = 2;
/// Consumers of the top priority in the many-consumer variant, above one more.
const MANY: usize = 64;
/// Messages per batch in the batched variant.
const BATCH: usize = 64;

/// One shard with one queue and [`CONSUMERS`] consumers.
struct EngineCycle {
    shard: Shard,
    /// Reused by every call: the benchmark measures the engine, not allocation.
    out: Effects,
    queue: QueueKey,
    consumers: Vec<ConsumerKey>,
    /// The index in `consumers` of the consumer in each slot.
    index_of_slot: Vec<usize>,
    /// Live tags, oldest first, with the index of the consumer holding each.
    outstanding: VecDeque<(DeliveryTag, usize)>,
}

impl EngineCycle {
    /// Holding [`OUTSTANDING`] leases, with consumers of priority 0.
    fn new() -> EngineCycle {
        EngineCycle::with_priorities(&[0; CONSUMERS])
    }

    /// Holding [`OUTSTANDING`] leases, with consumers of these priorities.
    fn with_priorities(priorities: &[i64]) -> EngineCycle {
        let mut shard = Shard::new(0, Duration::from_millis(1));
        let mut out = Effects::new();
        let queue = engine::declare(&mut shard, &mut out, "cycle");
        let consumers = (priorities.iter().enumerate())
            .map(|(i, &priority)| {
                let name = format!("consumer-{i}");
                let (shard, out) = (&mut shard, &mut out);
                engine::consume_with_priority(shard, out, queue, &name, MAX_PREFETCH, priority)
            })
            .collect::<Vec<ConsumerKey>>();
        let slots = consumers.iter().map(|k| k.slot() + 1).max().unwrap_or(0);
        let mut index_of_slot = vec![usize::MAX; slots];
        for (i, key) in consumers.iter().enumerate() {
            index_of_slot[key.slot()] = i;
        }
        let mut cycle = EngineCycle {
            shard,
            out,
            queue,
            consumers,
            index_of_slot,
            outstanding: VecDeque::with_capacity(OUTSTANDING + BATCH),
        };
        for _ in 0..OUTSTANDING {
            cycle.put_one();
        }
        assert_eq!(cycle.outstanding.len(), OUTSTANDING);
        cycle
    }

    /// Moves the deliveries of the last command into `outstanding`.
    fn take_deliveries(&mut self) {
        for (key, delivered) in self.out.deliveries.drain(..) {
            let consumer = self.index_of_slot[key.slot()];
            debug_assert_eq!(self.consumers[consumer], key, "delivered to one of ours");
            self.outstanding.push_back((delivered.tag, consumer));
            black_box(delivered.body);
        }
    }

    fn put_one(&mut self) {
        engine::put(&mut self.shard, &mut self.out, self.queue);
        self.take_deliveries();
    }

    fn ack_oldest(&mut self) {
        let (tag, _) = self.outstanding.pop_front().expect("a lease outstanding");
        let ack = Command::Settle {
            queue: self.queue,
            tag,
            op: Settle::Ack,
        };
        self.shard.handle(NOW, ack, &mut self.out);
        assert_eq!(self.out.reply.take(), Some(Reply::Settled(true)));
    }

    fn cycle(&mut self) {
        self.put_one();
        self.ack_oldest();
    }

    fn put_batch(&mut self) {
        let messages = (0..BATCH).map(|_| Message::new(body())).collect();
        let put = Command::PutBatch {
            queue: self.queue,
            messages,
        };
        self.shard.handle(NOW, put, &mut self.out);
        let reply = self.out.reply.take();
        assert!(matches!(reply, Some(Reply::PutBatch(Ok(v))) if v.len() == BATCH));
        self.take_deliveries();
    }

    /// Acks the [`BATCH`] oldest leases with one `AckUpTo` per consumer: they are a prefix
    /// in tag order, so each consumer's share is every tag of it up to its newest there.
    fn ack_up_to_oldest(&mut self) {
        let mut up_to = [None; CONSUMERS];
        for (tag, consumer) in self.outstanding.drain(..BATCH) {
            up_to[consumer] = Some(tag);
        }
        let mut acked = 0;
        for (consumer, tag) in self.consumers.iter().zip(up_to) {
            let Some(tag) = tag else { continue };
            let ack = Command::AckUpTo {
                consumer: *consumer,
                tag,
            };
            self.shard.handle(NOW, ack, &mut self.out);
            let Some(Reply::Count(n)) = self.out.reply.take() else {
                panic!("ack_up_to answered something else");
            };
            acked += n;
        }
        assert_eq!(acked, BATCH);
    }

    /// Acks the [`BATCH`] oldest leases with one `SettleBatch`.
    fn settle_batch_oldest(&mut self) {
        let settles = self
            .outstanding
            .drain(..BATCH)
            .map(|(tag, _)| (tag, Settle::Ack))
            .collect();
        let settle = Command::SettleBatch {
            queue: self.queue,
            settles,
        };
        self.shard.handle(NOW, settle, &mut self.out);
        let reply = self.out.reply.take();
        assert!(matches!(reply, Some(Reply::SettledBatch(v)) if v.iter().all(|&ok| ok)));
    }
}

/// The baseline with one queue and [`CONSUMERS`] consumers, taking turns.
struct BaselineCycle {
    queue: MutexQueue,
    consumers: Vec<MutexConsumer>,
    next: usize,
    outstanding: VecDeque<(DeliveryTag, usize)>,
    /// The clock reading every call gets: time stands still, as for the engine.
    now: Instant,
}

impl BaselineCycle {
    fn new() -> BaselineCycle {
        let queue = MutexQueue::new(QueueConfig::default().ack_timeout);
        let consumers = (0..CONSUMERS)
            .map(|_| queue.consume(MAX_PREFETCH))
            .collect();
        let mut cycle = BaselineCycle {
            queue,
            consumers,
            next: 0,
            outstanding: VecDeque::with_capacity(OUTSTANDING + BATCH),
            now: Instant::now(),
        };
        for _ in 0..OUTSTANDING {
            cycle.put_one();
        }
        cycle
    }

    fn receive(&mut self) {
        let consumer = self.next;
        self.next = (self.next + 1) % CONSUMERS;
        let delivery = self.consumers[consumer]
            .try_recv_at(self.now)
            .expect("a message is ready");
        self.outstanding.push_back((delivery.tag, consumer));
        black_box(delivery.body);
    }

    fn put_one(&mut self) {
        assert_eq!(self.queue.put(body()), PutOutcome::Enqueued);
        self.receive();
    }

    fn ack_oldest(&mut self) {
        let (tag, _) = self.outstanding.pop_front().expect("a lease outstanding");
        assert!(self.queue.ack_at(tag, self.now));
    }

    fn cycle(&mut self) {
        self.put_one();
        self.ack_oldest();
    }

    fn put_batch(&mut self) {
        let outcomes = self.queue.put_batch((0..BATCH).map(|_| body()).collect());
        assert_eq!(outcomes.len(), BATCH);
        for _ in 0..BATCH {
            self.receive();
        }
    }

    fn ack_up_to_oldest(&mut self) {
        let mut up_to = [None; CONSUMERS];
        for (tag, consumer) in self.outstanding.drain(..BATCH) {
            up_to[consumer] = Some(tag);
        }
        let mut acked = 0;
        for (consumer, tag) in self.consumers.iter().zip(up_to) {
            if let Some(tag) = tag {
                acked += consumer.ack_up_to_at(tag, self.now);
            }
        }
        assert_eq!(acked, BATCH);
    }
}

fn configure(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, n: usize) {
    group
        .throughput(Throughput::Elements(n as u64))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
}

fn single(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle_100k_leases");
    configure(&mut group, 1);
    let mut engine = EngineCycle::new();
    group.bench_function("leasemq_engine", |b| b.iter(|| engine.cycle()));
    drop(engine);
    let mut engine = EngineCycle::with_priorities(&[1, 0]);
    group.bench_function("leasemq_engine_consumer_priorities", |b| {
        b.iter(|| engine.cycle())
    });
    drop(engine);
    let mut priorities = vec![0; MANY];
    priorities.push(-1);
    let mut engine = EngineCycle::with_priorities(&priorities);
    group.bench_function("leasemq_engine_65_consumers_two_priorities", |b| {
        b.iter(|| engine.cycle())
    });
    drop(engine);
    let mut baseline = BaselineCycle::new();
    group.bench_function("mutex_baseline", |b| b.iter(|| baseline.cycle()));
    group.finish();
}

fn batched(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle_100k_leases_batch64");
    configure(&mut group, BATCH);
    let mut engine = EngineCycle::new();
    group.bench_function("leasemq_engine_ack_up_to", |b| {
        b.iter(|| {
            engine.put_batch();
            engine.ack_up_to_oldest();
        })
    });
    group.bench_function("leasemq_engine_settle_batch", |b| {
        b.iter(|| {
            engine.put_batch();
            engine.settle_batch_oldest();
        })
    });
    drop(engine);
    let mut baseline = BaselineCycle::new();
    group.bench_function("mutex_baseline_ack_up_to", |b| {
        b.iter(|| {
            baseline.put_batch();
            baseline.ack_up_to_oldest();
        })
    });
    group.finish();
}

criterion_group!(benches, single, batched);
criterion_main!(benches);
