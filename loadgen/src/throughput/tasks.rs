//! The producers and consumers of `throughput --api async`: tokio tasks, not threads, each
//! making one call per message through the async forms (`put_async`, `Consumer::next`,
//! `ack_async`). Many calls are in flight per runtime thread, so a caller waiting for its
//! answer costs a task switch, not a thread switch: how a service built on tokio uses the
//! broker.
//!
//! Closed loop only: a runtime's timers tick in milliseconds, too coarse to pace an open
//! loop at hundreds of thousands of messages a second.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use leasemq::{Consumer, Message, Queue};

use super::workers::{on_acked, ConsumerResult, Plan, ProducerResult, Shared};
use crate::cli::format_duration;
use crate::common::{broker_error, nanos, read_header, seq_of, BodyWriter, Clock};

/// How long consumers may take, after producers stop, to ack what is still in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// How long a producer pauses when the bound on messages in flight is reached.
const FULL_PAUSE: Duration = Duration::from_millis(1);
/// How long an idle consumer waits for a delivery before it looks whether the run is over.
const IDLE_WAIT: Duration = Duration::from_millis(1);

/// One producer task: `put_async` until the window ends, round robin over its queues.
pub(super) async fn produce(
    index: u64,
    queues: Vec<Queue>,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ProducerResult {
    let mut result = ProducerResult {
        put: 0,
        put_in_window: 0,
        problem: None,
    };
    let mut bodies = BodyWriter::new(plan.body_bytes);
    let mut local = 0u64;
    let mut turn = 0usize;
    loop {
        let now = clock.now_ns();
        if now >= plan.end_ns || shared.abort.load(Relaxed) {
            break;
        }
        let in_flight = shared
            .put
            .load(Relaxed)
            .saturating_sub(shared.acked.load(Relaxed));
        if in_flight >= plan.max_in_flight {
            // Full: leave the runtime threads to the consumer tasks for a moment (the bound
            // holds far more than a millisecond of acks).
            tokio::time::sleep(FULL_PAUSE).await;
            continue;
        }
        shared.put.fetch_add(1, Relaxed);
        let queue = &queues[turn % queues.len()];
        turn += 1;
        let message = Message::new(bodies.body(now, seq_of(index, local)));
        if let Err(e) = queue.put_async(message).await {
            shared.put.fetch_sub(1, Relaxed);
            result.problem = Some(broker_error("put failed", e));
            shared.abort.store(true, Relaxed);
            break;
        }
        if plan.in_window(now) {
            result.put_in_window += 1;
        }
        local += 1;
    }
    result.put = local;
    shared.producers_done.fetch_add(1, Relaxed);
    result
}

/// One consumer task: `next` and `ack_async` until every producer is done and everything
/// put is acked.
pub(super) async fn consume(
    mut consumer: Consumer,
    queue: Queue,
    mut r: ConsumerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ConsumerResult {
    let deadline = plan.end_ns + nanos(DRAIN_LIMIT);
    loop {
        let delivery = match consumer.try_recv() {
            Ok(Some(d)) => d,
            Ok(None) => {
                let done = u64::from(shared.producers_done.load(Relaxed)) == plan.producers
                    && shared.acked.load(Relaxed) >= shared.put.load(Relaxed);
                if done || shared.abort.load(Relaxed) {
                    break;
                }
                let now = clock.now_ns();
                r.deliver.tick(now);
                r.ack.tick(now);
                r.settle.tick(now);
                if now > deadline {
                    r.problems.push(format!(
                        "{}: gave up waiting for deliveries {} after the run",
                        consumer.name(),
                        format_duration(DRAIN_LIMIT)
                    ));
                    break;
                }
                // `next` is cancel-safe: a timeout loses no delivery.
                match tokio::time::timeout(IDLE_WAIT, consumer.next()).await {
                    Ok(Some(d)) => d,
                    Ok(None) => {
                        r.problems
                            .push(format!("{}: the consumer closed", consumer.name()));
                        break;
                    }
                    Err(_elapsed) => continue,
                }
            }
            Err(e) => {
                r.problems.push(broker_error("receiving", e));
                break;
            }
        };
        let now = clock.now_ns();
        let Some((sent, seq)) = read_header(&delivery.envelope().body) else {
            r.problems
                .push("a delivery without the 16-byte header".into());
            continue;
        };
        if delivery.envelope().attempt > 1 {
            r.redelivered += 1;
        }
        if plan.in_window(now) {
            r.delivered_in_window += 1;
        }
        if plan.in_window(sent) {
            r.deliver.record(now, now.saturating_sub(sent));
        }
        let t0 = clock.now_ns();
        let acked = queue.ack_async(delivery.tag()).await;
        let t1 = clock.now_ns();
        r.settle_calls += 1;
        if plan.in_window(t0) {
            r.settle.record(t1, t1 - t0);
        }
        if acked {
            on_acked(&mut r, &plan, sent, seq, t1);
            shared.acked.fetch_add(1, Relaxed);
        }
    }
    r
}
