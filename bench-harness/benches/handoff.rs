//! Deliveries through a consumer's channel: a producer thread `put_batch`es, a consumer
//! thread `recv`s; beside it a plain crossbeam channel carrying the same element type
//! ([`Delivered`], what a shard pushes into a consumer channel) between two threads.
//!
//! - `leasemq`: a 1-shard broker under the system clock; the producer puts [`MESSAGES`]
//!   16-byte messages in batches of [`BATCH`], the consumer (prefetch 65 535, more than a
//!   run delivers) receives every one. The leases are acked after the run, untimed, so the
//!   run measures put → shard → channel → `recv` and nothing else.
//! - `baseline-crossbeam`: the producer builds the same number of `Delivered` and sends each
//!   into an unbounded channel (as the shard does); the consumer receives each and turns it
//!   into an [`Envelope`](leasemq::Envelope), as `Consumer::recv` does.
//!
//! An iteration is one whole run, from the first put to the last receive, timed with
//! `iter_custom`; throughput is deliveries per second.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use crossbeam_channel::{unbounded, Receiver, Sender};
use leasemq::{Broker, Consumer, ConsumerConfig, DeliveryTag, Message, Queue, QueueConfig};
use leasemq_engine::{Delivered, MsgId, MAX_PREFETCH};

/// Messages per `put_batch`.
const BATCH: usize = 256;
/// Messages per run: within the consumer's prefetch, so no ack is needed during a run.
const MESSAGES: usize = 200 * BATCH;
/// Long enough that no lease runs out during a run.
const ACK_TIMEOUT: Duration = Duration::from_secs(600);
const BODY: &[u8; 16] = b"0123456789abcdef";

fn body() -> Bytes {
    Bytes::from_static(BODY)
}

/// Runs `produce` and `consume` on two threads; the time until both are done.
fn two_threads(produce: impl FnOnce() + Send, consume: impl FnOnce() + Send) -> Duration {
    leasemq_bench_harness::two_threads(produce, consume).0
}

/// One timed run through the broker; the acks that give the credit back are not timed.
fn leasemq_run(queue: &Queue, consumer: &Consumer) -> Duration {
    let mut last = DeliveryTag(0);
    let elapsed = two_threads(
        || {
            for _ in 0..MESSAGES / BATCH {
                let batch = (0..BATCH).map(|_| Message::new(body())).collect();
                queue.put_batch(batch).expect("put_batch");
            }
        },
        || {
            for _ in 0..MESSAGES {
                let delivery = consumer.recv().expect("recv");
                last = delivery.tag();
                black_box(delivery.envelope());
            }
        },
    );
    assert_eq!(consumer.ack_up_to(last), MESSAGES);
    elapsed
}

/// One timed run through a plain channel.
fn baseline_run(tx: &Sender<Delivered>, rx: &Receiver<Delivered>, next_tag: &mut u64) -> Duration {
    let first = *next_tag;
    *next_tag += MESSAGES as u64;
    two_threads(
        || {
            for tag in first..first + MESSAGES as u64 {
                let delivered = Delivered {
                    tag: DeliveryTag(tag),
                    id: MsgId::Auto(tag),
                    body: body(),
                    attempt: 1,
                    death: None,
                };
                tx.send(delivered).expect("the receiver is alive");
            }
        },
        || {
            for _ in 0..MESSAGES {
                let delivered = rx.recv().expect("the sender is alive");
                black_box(delivered.into_envelope());
            }
        },
    )
}

fn handoff(c: &mut Criterion) {
    let mut group = c.benchmark_group("consumer_handoff");
    group
        .throughput(Throughput::Elements(MESSAGES as u64))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    let broker = Broker::builder().shards(1).build().expect("broker");
    let config = QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        ..QueueConfig::default()
    };
    let queue = broker.declare_queue("handoff", config).expect("declare");
    let prefetch = ConsumerConfig {
        prefetch: MAX_PREFETCH,
    };
    assert!(MESSAGES <= MAX_PREFETCH as usize);
    let consumer = queue.consume("reader", prefetch).expect("consume");
    group.bench_function("leasemq", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| leasemq_run(&queue, &consumer)).sum())
    });
    drop(consumer);
    broker.shutdown();

    let (tx, rx) = unbounded();
    let mut next_tag = 1;
    group.bench_function("baseline-crossbeam", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| baseline_run(&tx, &rx, &mut next_tag))
                .sum()
        })
    });
    group.finish();
}

criterion_group!(benches, handoff);
criterion_main!(benches);
