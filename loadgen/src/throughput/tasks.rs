//! The producers and consumers of `throughput --api async`: tokio tasks, not threads, each
//! making one call per message through the async forms (`put_async`, `Consumer::next`,
//! `ack_async`). Many calls are in flight per runtime thread, so a caller waiting for its
//! answer costs a task switch, not a thread switch: how a service built on tokio uses the
//! broker.
//!
//! With `--pipeline N` a task keeps up to N calls in flight (its puts, or its acks) and
//! takes their answers as they come, as a client that does not await each call before the
//! next: on durable queues a call's answer waits for an fsync, so one call at a time
//! measures the disk's latency, several measure its group commit.
//!
//! Closed loop only: a runtime's timers tick in milliseconds, too coarse to pace an open
//! loop at hundreds of thousands of messages a second.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
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
    mut result: ProducerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ProducerResult {
    let mut bodies = BodyWriter::new(plan.body_bytes);
    let mut local = 0u64;
    let mut turn = 0usize;
    // Puts sent and not yet answered: one is awaited once `pipeline` are.
    let mut putting = FuturesUnordered::new();
    let mut refused = 0u64;
    loop {
        let now = clock.now_ns();
        if now >= plan.end_ns || shared.abort.load(Relaxed) {
            break;
        }
        if putting.len() >= plan.pipeline {
            let answer = putting.next().await.expect("calls are in flight");
            if !put_answered(answer, &mut refused, &mut result, &plan, clock, &shared) {
                break;
            }
            continue;
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
        putting.push(async move { (now, queue.put_async(message).await) });
        if plan.in_window(now) {
            result.put_in_window += 1;
        }
        local += 1;
        // One poll sends the new put (and takes the answers that came).
        let mut failed = false;
        while let Some(Some(answer)) = futures_lite::future::poll_once(putting.next()).await {
            failed |= !put_answered(answer, &mut refused, &mut result, &plan, clock, &shared);
        }
        if failed {
            break;
        }
    }
    while let Some(answer) = putting.next().await {
        put_answered(answer, &mut refused, &mut result, &plan, clock, &shared);
    }
    // A refused put is not counted: it was never in the broker.
    result.put = local - refused;
    shared.producers_done.fetch_add(1, Relaxed);
    result
}

/// Takes one put's answer, to the put sent at `sent`; `false` when the broker refused it,
/// which ends the run.
fn put_answered(
    (sent, answer): (u64, Result<leasemq::PutOutcome, leasemq::Error>),
    refused: &mut u64,
    result: &mut ProducerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> bool {
    let Err(e) = answer else {
        if plan.in_window(sent) {
            let now = clock.now_ns();
            result.confirm.record(now, now - sent);
        }
        return true;
    };
    shared.put.fetch_sub(1, Relaxed);
    *refused += 1;
    result
        .problem
        .get_or_insert_with(|| broker_error("put failed", e));
    shared.abort.store(true, Relaxed);
    false
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
    // Acks sent and not yet answered: one is awaited once `pipeline` are.
    let mut acking = FuturesUnordered::new();
    loop {
        let delivery = match consumer.try_recv() {
            Ok(Some(d)) => d,
            // Nothing to receive: the answers of the acks in flight first.
            Ok(None) if !acking.is_empty() => {
                while let Some((header, t0, acked)) = acking.next().await {
                    r.settled_one(&plan, &shared, header, t0, clock.now_ns(), acked);
                }
                continue;
            }
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
        if acking.len() >= plan.pipeline {
            let (header, t0, acked) = acking.next().await.expect("calls are in flight");
            r.settled_one(&plan, &shared, header, t0, clock.now_ns(), acked);
        }
        let t0 = clock.now_ns();
        let queue = &queue;
        acking.push(async move { (header, t0, queue.ack_async(delivery.tag()).await) });
        // One poll sends the new ack (and takes the answers that came).
        while let Some(Some((header, t0, acked))) =
            futures_lite::future::poll_once(acking.next()).await
        {
            r.settled_one(&plan, &shared, header, t0, clock.now_ns(), acked);
        }
    }
    while let Some((header, t0, acked)) = acking.next().await {
        r.settled_one(&plan, &shared, header, t0, clock.now_ns(), acked);
    }
    r
}
