//! One command, one reply, through a real shard thread; beside it the cheapest hand-off
//! that does the same: a request and a reply over two `crossbeam_channel::bounded(1)`
//! channels to a thread that answers at once, and the single-`Mutex` baseline's call.
//!
//! - `stats/leasemq`: `Queue::stats` on a 1-shard broker, an engine call that only copies
//!   the queue's counters.
//! - `touch/leasemq`: `Queue::touch` on a lease the bench holds throughout: one lease-table
//!   lookup and one wheel reset.
//! - `baseline-channel-pair`: a `u64` sent to an echo thread and its answer received.
//! - `baseline-mutex`: `MutexQueue::leased`, one uncontended lock on the calling thread:
//!   what the call costs where there is no thread to hand it to.
//!
//! The shard and channel-pair round trips run twice: `idle/…`, then `busy/…` beside as
//! many CPU-bound threads as the machine has cores ([`BusyThreads`]), the host of a
//! service whose own work keeps the cores busy. The channel pair, whose `recv` spins
//! briefly and then parks, is the anchor for what a hand-off can do there.
//!
//! One element is one round trip; criterion's time per element is the round trip in ns.

use std::hint::black_box;
use std::thread;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use crossbeam_channel::bounded;
use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
use leasemq_bench_harness::baseline::MutexQueue;
use leasemq_bench_harness::BusyThreads;

/// Long enough that the held lease never runs out during a run.
const ACK_TIMEOUT: Duration = Duration::from_secs(600);

/// CPU-bound threads beside the `busy` runs: as many as this machine has cores.
fn busy_threads() -> usize {
    thread::available_parallelism().map_or(2, |n| n.get())
}

fn roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("roundtrip");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    hand_offs(&mut group, "idle");
    {
        let _busy = BusyThreads::start(busy_threads());
        hand_offs(&mut group, "busy");
    }
    let queue = MutexQueue::new(ACK_TIMEOUT);
    group.bench_function("baseline-mutex", |b| b.iter(|| black_box(queue.leased())));
    group.finish();
}

/// The shard round trips and the channel pair, named `{load}/…`.
fn hand_offs(group: &mut BenchmarkGroup<'_, WallTime>, load: &str) {
    let broker = Broker::builder().shards(1).build().expect("broker");
    let config = QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        ..QueueConfig::default()
    };
    let queue = broker.declare_queue("roundtrip", config).expect("declare");
    let consumer = queue
        .consume("holder", ConsumerConfig::default())
        .expect("consume");
    queue.put(Message::new("held")).expect("put");
    let held = consumer.recv().expect("delivered at once");
    group.bench_function(format!("{load}/stats/leasemq"), |b| {
        b.iter(|| black_box(queue.stats()))
    });
    group.bench_function(format!("{load}/touch/leasemq"), |b| {
        b.iter(|| assert!(queue.touch(held.tag())))
    });
    drop((held, consumer, queue));
    broker.shutdown();

    let (request_tx, request_rx) = bounded::<u64>(1);
    let (reply_tx, reply_rx) = bounded::<u64>(1);
    let echo = thread::Builder::new()
        .name("bench-echo".into())
        .spawn(move || {
            for request in request_rx {
                if reply_tx.send(request + 1).is_err() {
                    return;
                }
            }
        })
        .expect("echo thread");
    let mut n = 0u64;
    group.bench_function(format!("{load}/baseline-channel-pair"), |b| {
        b.iter(|| {
            request_tx.send(n).expect("echo is running");
            n = reply_rx.recv().expect("echo answers");
        })
    });
    drop(request_tx);
    echo.join().expect("echo ran");
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
