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

use super::workers::{ConsumerResult, Plan, ProducerResult, Shared};
use crate::common::{broker_error, seq_of, BodyWriter, Clock};

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
    let mut result = ProducerResult::default();
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
    loop {
        let delivery = match consumer.try_recv() {
            Ok(Some(d)) => d,
            Ok(None) => {
                if r.idle(consumer.name(), &plan, &shared, clock.now_ns()) {
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
        let Some(header) = r.delivered(&delivery, &plan, clock.now_ns()) else {
            continue;
        };
        let t0 = clock.now_ns();
        let acked = queue.ack_async(delivery.tag()).await;
        r.settled_one(&plan, &shared, header, t0, clock.now_ns(), acked);
    }
    r
}
