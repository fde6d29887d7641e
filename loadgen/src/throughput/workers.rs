//! The producer and consumer threads of `throughput`, and what they share.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use leasemq::{Consumer, Delivery, Error, Message, Queue};

use crate::cli::{format_duration, Api};
use crate::common::{broker_error, nanos, read_header, seq_of, BodyWriter, Clock, Ledger};
use crate::intervals::TimedRecorder;

/// How long consumers may take, after producers stop, to ack what is still in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// How long a producer sleeps at a time while as many messages are in flight as the run
/// allows, once yielding has not helped.
const FULL_PAUSE: Duration = Duration::from_micros(20);
/// The longest a producer yields while full before it sleeps.
const FULL_YIELD_BUDGET_NS: u64 = 200_000;
/// A yield that took longer handed the core to another process's thread for a time slice.
const SLOW_YIELD_NS: u64 = 100_000;

/// A producer's wait while the run has as many messages in flight as it allows: leave the
/// core to the consumers and shards. On an idle machine a yield does that at once and costs
/// no wake-up; beside other busy threads a yield can hand one of them a whole time slice,
/// so after one slow yield, or after the budget, it sleeps instead.
struct FullWait {
    clock: Clock,
    since: Option<u64>,
    yields_slow: bool,
}

impl FullWait {
    fn wait(&mut self, now: u64) {
        let since = *self.since.get_or_insert(now);
        if self.yields_slow || now - since > FULL_YIELD_BUDGET_NS {
            thread::sleep(FULL_PAUSE);
            return;
        }
        thread::yield_now();
        self.yields_slow = self.clock.now_ns() - now > SLOW_YIELD_NS;
    }

    /// Room again: the next wait starts afresh.
    fn clear(&mut self) {
        self.since = None;
        self.yields_slow = false;
    }
}

/// The run's settings, as the threads need them.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) api: Api,
    pub(super) producers: u64,
    pub(super) body_bytes: usize,
    pub(super) put_batch: usize,
    pub(super) settle_batch: usize,
    pub(super) warm_ns: u64,
    pub(super) end_ns: u64,
    /// Open loop: nanoseconds between two messages of one producer.
    pub(super) interval_ns: Option<f64>,
    /// Open loop, batched: the longest a due message waits for its batch to fill.
    pub(super) linger_ns: u64,
    pub(super) max_in_flight: u64,
    /// `--api async`: calls a task keeps in flight.
    pub(super) pipeline: usize,
}

impl Plan {
    pub(super) fn in_window(&self, t: u64) -> bool {
        t >= self.warm_ns && t < self.end_ns
    }
}

/// What every thread sees.
#[derive(Default)]
pub(super) struct Shared {
    /// Messages handed to `put`/`put_batch` (counted before the call).
    pub(super) put: CachePadded<AtomicU64>,
    /// Messages acked.
    pub(super) acked: CachePadded<AtomicU64>,
    pub(super) producers_done: AtomicU32,
    pub(super) abort: AtomicBool,
}

/// A producer's counts, and its histogram of send time → the call's answer.
#[derive(Default)]
pub(super) struct ProducerResult {
    pub(super) put: u64,
    pub(super) put_in_window: u64,
    pub(super) confirm: TimedRecorder,
    pub(super) problem: Option<String>,
}

/// A consumer's histograms and counts. The histograms also hand their intervals to the run's
/// interval log when it keeps one.
#[derive(Default)]
pub(super) struct ConsumerResult {
    pub(super) deliver: TimedRecorder,
    pub(super) ack: TimedRecorder,
    pub(super) settle: TimedRecorder,
    pub(super) ledger: Ledger,
    pub(super) acked: u64,
    pub(super) acked_in_window: u64,
    pub(super) delivered_in_window: u64,
    pub(super) settle_calls: u64,
    pub(super) redelivered: u64,
    pub(super) problems: Vec<String>,
}

/// One producer: puts until the window ends, round robin over its queues.
pub(super) fn produce(
    index: u64,
    queues: &[Queue],
    mut result: ProducerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> ProducerResult {
    let mut bodies = BodyWriter::new(plan.body_bytes);
    let mut local = 0u64;
    let mut turn = 0usize;
    let mut full = FullWait {
        clock,
        since: None,
        yields_slow: false,
    };
    // Open loop: message k of producer j is due at (k + j / P) × interval.
    let offset = plan
        .interval_ns
        .map_or(0.0, |i| i * index as f64 / plan.producers as f64);
    let due = |k: u64| plan.interval_ns.map(|i| (offset + k as f64 * i) as u64);
    loop {
        let now = clock.now_ns();
        if shared.abort.load(Relaxed) {
            break;
        }
        // How many to put now, and the send time of the first.
        let n = match due(local) {
            None if now >= plan.end_ns => break,
            None => plan.put_batch,
            Some(first) if first >= plan.end_ns => break,
            Some(first) if first > now => {
                clock.wait_until(first);
                continue;
            }
            Some(first) => match due_batch(&due, local, first, now, plan, clock) {
                Some(n) => n,
                None => continue,
            },
        };
        let in_flight = shared
            .put
            .load(Relaxed)
            .saturating_sub(shared.acked.load(Relaxed));
        if in_flight + n as u64 > plan.max_in_flight {
            full.wait(now);
            continue;
        }
        full.clear();
        shared.put.fetch_add(n as u64, Relaxed);
        let queue = &queues[turn % queues.len()];
        turn += 1;
        let sent_at = |k: u64| due(k).unwrap_or(now);
        if let Err(e) = put(queue, &mut bodies, index, local, n, sent_at, plan) {
            shared.put.fetch_sub(n as u64, Relaxed);
            result.problem = Some(broker_error("put failed", e));
            shared.abort.store(true, Relaxed);
            break;
        }
        let answered = clock.now_ns();
        record_answered(&mut result, local, n, answered, sent_at, plan);
        local += n as u64;
    }
    result.put = local;
    shared.producers_done.fetch_add(1, Relaxed);
    result
}

/// Open loop, with message `local` (due at `first`) due by `now`: how many to put in one
/// batch, counting the messages due by now. `None` when the batch waited for more to fall
/// due (then the producer looks again).
#[inline]
fn due_batch(
    due: &impl Fn(u64) -> Option<u64>,
    local: u64,
    first: u64,
    now: u64,
    plan: &Plan,
    clock: Clock,
) -> Option<usize> {
    let mut n = 1;
    while n < plan.put_batch && due(local + n as u64).is_some_and(|t| t <= now && t < plan.end_ns) {
        n += 1;
    }
    // A batch not yet full waits for more, but never holds its first message
    // longer than the linger.
    let linger_end = (first + plan.linger_ns).min(plan.end_ns);
    if n < plan.put_batch && now < linger_end {
        let full_at = due(local + plan.put_batch as u64 - 1).unwrap_or(u64::MAX);
        clock.wait_until(linger_end.min(full_at));
        return None;
    }
    Some(n)
}

/// Puts messages `local` to `local + n` of producer `index` into `queue`, each stamped
/// with its send time: one `put_batch` call with the batched API, else one `put` (`n` is
/// then 1).
#[inline]
fn put(
    queue: &Queue,
    bodies: &mut BodyWriter,
    index: u64,
    local: u64,
    n: usize,
    sent_at: impl Fn(u64) -> u64,
    plan: &Plan,
) -> Result<(), Error> {
    if plan.api == Api::Batched {
        let batch: Vec<Message> = (0..n as u64)
            .map(|k| Message::new(bodies.body(sent_at(local + k), seq_of(index, local + k))))
            .collect();
        queue.put_batch(batch).map(|_| ())
    } else {
        queue
            .put(Message::new(
                bodies.body(sent_at(local), seq_of(index, local)),
            ))
            .map(|_| ())
    }
}

/// Messages `local` to `local + n`, answered at `answered`: each sent within the window
/// counts, and its time from send to answer goes into the confirm histogram.
#[inline]
fn record_answered(
    result: &mut ProducerResult,
    local: u64,
    n: usize,
    answered: u64,
    sent_at: impl Fn(u64) -> u64,
    plan: &Plan,
) {
    for k in local..local + n as u64 {
        let sent = sent_at(k);
        if plan.in_window(sent) {
            result.put_in_window += 1;
            result
                .confirm
                .record(answered, answered.saturating_sub(sent));
        }
    }
}

/// A consumer's deliveries received but not yet acked (batched API).
struct Pending {
    sent: Vec<(u64, u64)>,
    last: Option<Delivery>,
}

/// One consumer: receives and acks until every producer is done and everything put is acked.
pub(super) fn consume(
    consumer: Consumer,
    mut r: ConsumerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> ConsumerResult {
    let mut pending = Pending {
        sent: Vec::with_capacity(plan.settle_batch),
        last: None,
    };
    loop {
        let delivery = match consumer.try_recv() {
            Ok(Some(d)) => d,
            Ok(None) => {
                if pending.last.is_some() {
                    flush(&consumer, &mut pending, &mut r, plan, clock, shared);
                    continue;
                }
                if r.idle(consumer.name(), plan, shared, clock.now_ns()) {
                    break;
                }
                match consumer.recv_timeout(Duration::from_millis(1)) {
                    Ok(Some(d)) => d,
                    Ok(None) => continue,
                    Err(e) => {
                        r.problems.push(broker_error("receiving", e));
                        break;
                    }
                }
            }
            Err(e) => {
                r.problems.push(broker_error("receiving", e));
                break;
            }
        };
        let Some((sent, seq)) = r.delivered(&delivery, plan, clock.now_ns()) else {
            continue;
        };
        match plan.api {
            // Async workers are tasks (`tasks.rs`); one message per call here too.
            Api::PerMessage | Api::Async => {
                let t0 = clock.now_ns();
                let acked = delivery.ack();
                r.settled_one(plan, shared, (sent, seq), t0, clock.now_ns(), acked);
            }
            Api::Batched => {
                pending.sent.push((sent, seq));
                pending.last = Some(delivery);
                if pending.sent.len() >= plan.settle_batch {
                    flush(&consumer, &mut pending, &mut r, plan, clock, shared);
                }
            }
        }
    }
    r
}

impl ConsumerResult {
    /// Nothing to receive at `now`: whether this consumer is done (every producer finished
    /// and everything put acked, the run aborted, or the drain took too long, which is a
    /// problem). Hands finished intervals over now rather than at the next value.
    pub(super) fn idle(&mut self, name: &str, plan: &Plan, shared: &Shared, now: u64) -> bool {
        let done = u64::from(shared.producers_done.load(Relaxed)) == plan.producers
            && shared.acked.load(Relaxed) >= shared.put.load(Relaxed);
        if done || shared.abort.load(Relaxed) {
            return true;
        }
        self.deliver.tick(now);
        self.ack.tick(now);
        self.settle.tick(now);
        if now > plan.end_ns + nanos(DRAIN_LIMIT) {
            self.problems.push(format!(
                "{name}: gave up waiting for deliveries {} after the run",
                format_duration(DRAIN_LIMIT)
            ));
            return true;
        }
        false
    }

    /// A delivery arrived at `now`: records it and returns its send time and sequence
    /// number, or `None` (noted as a problem) when it lacks the header.
    pub(super) fn delivered(
        &mut self,
        delivery: &Delivery,
        plan: &Plan,
        now: u64,
    ) -> Option<(u64, u64)> {
        let Some((sent, seq)) = read_header(&delivery.envelope().body) else {
            self.problems
                .push("a delivery without the 16-byte header".into());
            return None;
        };
        if delivery.envelope().attempt > 1 {
            self.redelivered += 1;
        }
        if plan.in_window(now) {
            self.delivered_in_window += 1;
        }
        if plan.in_window(sent) {
            self.deliver.record(now, now.saturating_sub(sent));
        }
        Some((sent, seq))
    }

    /// A one-message ack call, made at `t0`, answered `acked` at `t1`.
    pub(super) fn settled_one(
        &mut self,
        plan: &Plan,
        shared: &Shared,
        (sent, seq): (u64, u64),
        t0: u64,
        t1: u64,
        acked: bool,
    ) {
        self.settle_calls += 1;
        if plan.in_window(t0) {
            self.settle.record(t1, t1 - t0);
        }
        if acked {
            on_acked(self, plan, sent, seq, t1);
            shared.acked.fetch_add(1, Relaxed);
        }
    }
}

#[inline]
fn on_acked(r: &mut ConsumerResult, plan: &Plan, sent: u64, seq: u64, at: u64) {
    r.ledger.mark(seq);
    r.acked += 1;
    if plan.in_window(at) {
        r.acked_in_window += 1;
    }
    if plan.in_window(sent) {
        r.ack.record(at, at.saturating_sub(sent));
    }
}

/// Acks everything pending with one `ack_up_to`.
fn flush(
    consumer: &Consumer,
    pending: &mut Pending,
    r: &mut ConsumerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) {
    let Some(last) = pending.last.take() else {
        return;
    };
    let t0 = clock.now_ns();
    let n = consumer.ack_up_to(last.tag());
    let t1 = clock.now_ns();
    r.settle_calls += 1;
    if plan.in_window(t0) {
        r.settle.record(t1, t1 - t0);
    }
    if n == pending.sent.len() {
        for &(sent, seq) in &pending.sent {
            on_acked(r, plan, sent, seq, t1);
        }
    } else {
        r.problems.push(format!(
            "{}: ack_up_to acked {n} leases but {} deliveries were pending",
            consumer.name(),
            pending.sent.len()
        ));
        r.acked += n as u64;
    }
    shared.acked.fetch_add(n as u64, Relaxed);
    pending.sent.clear();
}
