//! The threaded broker, put → ack: one producer thread and one consumer thread on a
//! 2-shard broker under the system clock; beside each shape, the single-`Mutex` baseline
//! driven by the same two threads.
//!
//! - `batched`: the producer puts batches of [`BATCH`] 16-byte messages with `put_batch`;
//!   the consumer receives them and settles each batch with one `ack_up_to`.
//! - `per_message`: the producer `put`s one message at a time; the consumer receives and
//!   acks each.
//!
//! An iteration moves a fixed number of messages from the first put to the last ack and
//! is timed whole (`iter_custom`); throughput is messages per second. The baseline's
//! consumer polls with `try_recv`, spinning and then yielding while the queue is empty,
//! as a user of a queue with no blocking receive would.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use crossbeam_utils::Backoff;
use leasemq::{Broker, Consumer, ConsumerConfig, DeliveryTag, Message, Queue, QueueConfig};
use leasemq_bench_harness::baseline::{MutexConsumer, MutexQueue};

/// Messages per batch, and per `ack_up_to`.
const BATCH: usize = 256;
/// Messages per iteration, in either shape: a whole number of batches.
const MESSAGES: usize = 800 * BATCH;
const PREFETCH: u32 = 1_000;
/// Long enough that no lease expires during a run.
const ACK_TIMEOUT: Duration = Duration::from_secs(600);
const BODY: &[u8; 16] = b"0123456789abcdef";

fn body() -> Bytes {
    Bytes::from_static(BODY)
}

/// A 2-shard broker under the system clock, with one queue and its consumer.
fn leasemq_setup(name: &str) -> (Broker, Queue, Consumer) {
    let broker = Broker::builder().shards(2).build().expect("broker");
    let config = QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        ..QueueConfig::default()
    };
    let queue = broker.declare_queue(name, config).expect("declare");
    let consumer = queue
        .consume("bench", ConsumerConfig { prefetch: PREFETCH })
        .expect("consume");
    (broker, queue, consumer)
}

/// Runs `produce` and `consume` on two threads; returns the time from their start until
/// both are done, and the consumer, for the next run.
fn two_threads<C: Send>(
    produce: impl FnOnce() + Send,
    consumer: C,
    consume: impl FnOnce(&C) + Send,
) -> (Duration, C) {
    leasemq_bench_harness::two_threads(produce, move || {
        consume(&consumer);
        consumer
    })
}

/// Times `iters` runs, each on the same queue and consumer.
fn time_runs<C: Send>(
    iters: u64,
    consumer: &mut Option<C>,
    run: impl Fn(C) -> (Duration, C),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let (elapsed, back) = run(consumer.take().expect("consumer between runs"));
        *consumer = Some(back);
        total += elapsed;
    }
    total
}

fn leasemq_batched(queue: &Queue, consumer: Consumer) -> (Duration, Consumer) {
    let produce = || {
        for _ in 0..MESSAGES / BATCH {
            let batch = (0..BATCH).map(|_| Message::new(body())).collect();
            queue.put_batch(batch).expect("put_batch");
        }
    };
    let consume = |consumer: &Consumer| {
        for _ in 0..MESSAGES / BATCH {
            let mut last = DeliveryTag(0);
            for _ in 0..BATCH {
                let delivery = consumer.recv().expect("recv");
                last = delivery.tag();
                black_box(delivery.envelope());
            }
            assert_eq!(consumer.ack_up_to(last), BATCH);
        }
    };
    two_threads(produce, consumer, consume)
}

fn leasemq_per_message(queue: &Queue, consumer: Consumer) -> (Duration, Consumer) {
    let produce = || {
        for _ in 0..MESSAGES {
            queue.put(Message::new(body())).expect("put");
        }
    };
    let consume = |consumer: &Consumer| {
        for _ in 0..MESSAGES {
            let delivery = consumer.recv().expect("recv");
            black_box(delivery.envelope());
            assert!(delivery.ack());
        }
    };
    two_threads(produce, consumer, consume)
}

/// The next delivery, polling until one is there.
fn poll(consumer: &MutexConsumer) -> leasemq_bench_harness::baseline::Delivery {
    let backoff = Backoff::new();
    loop {
        if let Some(delivery) = consumer.try_recv() {
            return delivery;
        }
        backoff.snooze();
    }
}

fn baseline_batched(queue: &MutexQueue, consumer: MutexConsumer) -> (Duration, MutexConsumer) {
    let produce = || {
        for _ in 0..MESSAGES / BATCH {
            queue.put_batch((0..BATCH).map(|_| body()).collect());
        }
    };
    let consume = |consumer: &MutexConsumer| {
        for _ in 0..MESSAGES / BATCH {
            let mut last = DeliveryTag(0);
            for _ in 0..BATCH {
                let delivery = poll(consumer);
                last = delivery.tag;
                black_box(delivery.into_envelope());
            }
            assert_eq!(consumer.ack_up_to(last), BATCH);
        }
    };
    two_threads(produce, consumer, consume)
}

fn baseline_per_message(queue: &MutexQueue, consumer: MutexConsumer) -> (Duration, MutexConsumer) {
    let produce = || {
        for _ in 0..MESSAGES {
            queue.put(body());
        }
    };
    let consume = |consumer: &MutexConsumer| {
        for _ in 0..MESSAGES {
            let delivery = poll(consumer);
            let tag = delivery.tag;
            black_box(delivery.into_envelope());
            assert!(consumer.queue().ack(tag));
        }
    };
    two_threads(produce, consumer, consume)
}

/// Ten samples of at least one iteration each: `seconds` must cover ten of the slowest.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>, seconds: u64) {
    group
        .throughput(Throughput::Elements(MESSAGES as u64))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(seconds));
}

fn batched(c: &mut Criterion) {
    let mut group = c.benchmark_group("broker_batched_256");
    configure(&mut group, 10);
    let (broker, queue, consumer) = leasemq_setup("batched");
    let mut consumer = Some(consumer);
    group.bench_function("leasemq_2_shards", |b| {
        b.iter_custom(|iters| time_runs(iters, &mut consumer, |c| leasemq_batched(&queue, c)))
    });
    drop(consumer);
    broker.shutdown();
    let queue = MutexQueue::new(ACK_TIMEOUT);
    let mut consumer = Some(queue.consume(PREFETCH));
    group.bench_function("mutex_baseline", |b| {
        b.iter_custom(|iters| time_runs(iters, &mut consumer, |c| baseline_batched(&queue, c)))
    });
    group.finish();
}

fn per_message(c: &mut Criterion) {
    let mut group = c.benchmark_group("broker_per_message");
    // Two to three seconds an iteration for leasemq on two busy cores.
    configure(&mut group, 30);
    let (broker, queue, consumer) = leasemq_setup("per-message");
    let mut consumer = Some(consumer);
    group.bench_function("leasemq_2_shards", |b| {
        b.iter_custom(|iters| time_runs(iters, &mut consumer, |c| leasemq_per_message(&queue, c)))
    });
    drop(consumer);
    broker.shutdown();
    let queue = MutexQueue::new(ACK_TIMEOUT);
    let mut consumer = Some(queue.consume(PREFETCH));
    group.bench_function("mutex_baseline", |b| {
        b.iter_custom(|iters| time_runs(iters, &mut consumer, |c| baseline_per_message(&queue, c)))
    });
    group.finish();
}

criterion_group!(benches, batched, per_message);
criterion_main!(benches);
