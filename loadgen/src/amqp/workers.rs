//! The producer and consumer tasks of an AMQP run, each on a connection of its own, and
//! what they share.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use futures_lite::future::poll_once;
use futures_lite::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, PublisherConfirm};

use super::targets::Targets;
use super::{amqp_error, connect, Plan};
use crate::cli::{format_duration, AckMode};
use crate::common::{nanos, read_header, seq_of, BodyWriter, Clock, Ledger};
use crate::intervals::TimedRecorder;

/// How long consumers may take, after producers stop, to receive what is still in flight.
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// How long an idle consumer waits for a delivery before it looks whether the run is over.
pub(super) const IDLE_WAIT: Duration = Duration::from_millis(1);
/// How long a producer pauses while the run has as many messages in flight as it allows.
pub(super) const FULL_PAUSE: Duration = Duration::from_millis(1);
/// Publishes (or `--ack each` acks) a task has handed to lapin and not yet seen written.
/// lapin's `basic_publish` and `ack` return once its I/O loop has written the frames; one
/// at a time, a producer or consumer sends one message per wake-up of that loop and the run
/// measures the client, not the server. With several in flight, one write carries many.
const LAPIN_WINDOW: usize = 64;

/// What every task sees.
#[derive(Default)]
pub(super) struct Shared {
    /// Messages handed to `basic_publish` (counted before the call).
    pub(super) put: CachePadded<AtomicU64>,
    /// Messages acked (with `no_ack`: received).
    pub(super) acked: CachePadded<AtomicU64>,
    pub(super) producers_done: AtomicU32,
    pub(super) abort: AtomicBool,
}

/// What a producer task hands back.
#[derive(Default)]
pub(super) struct ProducerResult {
    pub(super) put: u64,
    pub(super) put_in_window: u64,
    pub(super) confirm: Option<TimedRecorder>,
    pub(super) nacked: u64,
    pub(super) problems: Vec<String>,
}

/// What a consumer task hands back: its histograms (wired to the interval log when the run
/// keeps one), its ledger and its counts.
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

/// A consumer's connection, the channel it consumes on, and its subscription.
pub(super) struct Subscriber {
    pub(super) conn: Connection,
    pub(super) channel: Channel,
    pub(super) consumer: lapin::Consumer,
}

/// Opens `count` consumers, consumer i on queue i mod Q, each on its own connection (to
/// its target, see [`Targets`]) with `basic.qos` set to the prefetch.
pub(super) async fn open_consumers(
    targets: Targets<'_>,
    queues: &[String],
    plan: &Plan,
    count: u32,
) -> Result<Vec<Subscriber>, String> {
    let mut subscribers = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let conn = connect(targets.consumer(i), "consumer").await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(amqp_error("opening a channel"))?;
        channel
            .basic_qos(plan.prefetch, BasicQosOptions::default())
            .await
            .map_err(amqp_error("basic.qos"))?;
        let options = BasicConsumeOptions {
            no_ack: plan.ack == AckMode::NoAck,
            ..BasicConsumeOptions::default()
        };
        let queue = queues[i % queues.len()].as_str();
        let consumer = channel
            .basic_consume(
                queue.into(),
                format!("consumer-{i}").into(),
                options,
                FieldTable::default(),
            )
            .await
            .map_err(amqp_error("basic.consume"))?;
        subscribers.push(Subscriber {
            conn,
            channel,
            consumer,
        });
    }
    Ok(subscribers)
}

/// A producer's connection and channel (in confirm mode with `--confirms`).
pub(super) struct Publisher {
    pub(super) conn: Connection,
    pub(super) channel: Channel,
}

/// Opens one connection (to its target, see [`Targets`]) and channel per producer.
pub(super) async fn open_producers(
    targets: Targets<'_>,
    plan: &Plan,
) -> Result<Vec<Publisher>, String> {
    let mut publishers = Vec::with_capacity(plan.producers as usize);
    for j in 0..plan.producers as usize {
        let conn = connect(targets.producer(j), "producer").await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(amqp_error("opening a channel"))?;
        if plan.confirms {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(amqp_error("confirm.select"))?;
        }
        publishers.push(Publisher { conn, channel });
    }
    Ok(publishers)
}

/// A producer's publishes that wait for their confirm, oldest first.
pub(super) struct Unconfirmed {
    pub(super) waiting: VecDeque<(u64, PublisherConfirm)>,
}

impl Unconfirmed {
    /// Takes the confirms that have come (all of them with `all`, waiting for each).
    pub(super) async fn settle(
        &mut self,
        r: &mut ProducerResult,
        plan: &Plan,
        clock: Clock,
        all: bool,
    ) {
        loop {
            let waited = all || self.waiting.len() as u64 >= plan.max_in_flight;
            let Some((sent, confirm)) = self.waiting.front_mut() else {
                return;
            };
            let sent = *sent;
            let outcome = if waited {
                Some(confirm.await)
            } else {
                poll_once(confirm).await
            };
            let Some(outcome) = outcome else { return };
            self.waiting.pop_front();
            let now = clock.now_ns();
            match outcome {
                Ok(c) if c.is_ack() => {
                    if let (Some(rec), true) = (&mut r.confirm, plan.in_window(sent)) {
                        rec.record(now, now.saturating_sub(sent));
                    }
                }
                Ok(_) => r.nacked += 1,
                Err(e) => {
                    r.problems.push(format!("waiting for a confirm: {e}"));
                    return;
                }
            }
        }
    }
}

/// One producer: publishes until the window ends, round robin over its queues.
pub(super) async fn produce(
    index: u64,
    p: Publisher,
    queues: Vec<String>,
    mut r: ProducerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ProducerResult {
    publish_until_end(index, &p.channel, &queues, &mut r, &plan, clock, &shared).await;
    shared.producers_done.fetch_add(1, Relaxed);
    let _ = p.conn.close(200, "producer done".into()).await;
    if r.nacked > 0 {
        r.problems
            .push(format!("producer {index}: {} publishes nacked", r.nacked));
    }
    r
}

pub(super) async fn publish_until_end(
    index: u64,
    channel: &Channel,
    queues: &[String],
    r: &mut ProducerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) {
    let mut bodies = BodyWriter::new(plan.body_bytes);
    let mut unconfirmed = Unconfirmed {
        waiting: VecDeque::new(),
    };
    let mut local = 0u64;
    // Publishes in flight, each done once lapin has written it. Polled here rather than
    // spawned as tasks: a task each costs more of the client's CPU than lapin's publish.
    let mut publishing = FuturesUnordered::new();
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
            tokio::time::sleep(FULL_PAUSE).await;
            continue;
        }
        if publishing.len() >= LAPIN_WINDOW {
            let done = publishing.next().await.expect("the window is not empty");
            if !published(done, r, &mut unconfirmed, plan, shared) {
                break;
            }
        }
        shared.put.fetch_add(1, Relaxed);
        let queue = queues[local as usize % queues.len()].as_str();
        let body = bodies.body(now, seq_of(index, local));
        publishing.push(async move {
            let result = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default(),
                )
                .await;
            (now, result)
        });
        // One poll hands the new publish to lapin (and takes those already written).
        let mut failed = false;
        while let Some(Some(done)) = poll_once(publishing.next()).await {
            failed |= !published(done, r, &mut unconfirmed, plan, shared);
        }
        if failed {
            break;
        }
        if plan.in_window(now) {
            r.put_in_window += 1;
        }
        local += 1;
        unconfirmed.settle(r, plan, clock, false).await;
    }
    while let Some(done) = publishing.next().await {
        published(done, r, &mut unconfirmed, plan, shared);
    }
    unconfirmed.settle(r, plan, clock, true).await;
    r.put = local;
}

type Publishing = (u64, lapin::Result<PublisherConfirm>);

/// One publish lapin has written (or failed to): its confirm joins those awaited. `false`
/// when it failed, which ends the run.
fn published(
    done: Publishing,
    r: &mut ProducerResult,
    unconfirmed: &mut Unconfirmed,
    plan: &Plan,
    shared: &Shared,
) -> bool {
    let error = match done {
        (sent, Ok(confirm)) => {
            if plan.confirms {
                unconfirmed.waiting.push_back((sent, confirm));
            }
            return true;
        }
        (_, Err(e)) => e.to_string(),
    };
    shared.put.fetch_sub(1, Relaxed);
    r.problems.push(format!("publishing: {error}"));
    shared.abort.store(true, Relaxed);
    false
}

/// A consumer's deliveries received but not yet acked (`--ack multiple:N`): their headers
/// and the delivery tag of the last.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) sent: Vec<(u64, u64)>,
    pub(super) last: Option<u64>,
}

impl Pending {
    /// Holds the delivery of `tag` (its `header`) for the next `basic.ack multiple`; true
    /// once `n` are held, when that ack is due.
    #[inline]
    fn hold(&mut self, header: (u64, u64), tag: u64, n: u32) -> bool {
        self.sent.push(header);
        self.last = Some(tag);
        self.sent.len() >= n as usize
    }
}

/// One consumer: receives and acks until every producer is done and everything put is
/// acked.
///
/// Acks go out with `Channel::basic_ack` and the delivery's tag, not the delivery's
/// `Acker`: lapin's `Acker` hands each ack to the connection's internal task, which spawns
/// a task of its own to send it. That hop cost this client more CPU per message than the
/// server spends on one, and the client shares the machine with the server it measures.
pub(super) async fn consume(
    s: Subscriber,
    mut r: ConsumerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ConsumerResult {
    let Subscriber {
        conn,
        channel,
        mut consumer,
    } = s;
    let mut pending = Pending::default();
    // Acks in flight (`--ack each`), each done once lapin has written it: as for
    // publishes, one at a time would measure lapin's wake-ups, not the server.
    let mut acking = FuturesUnordered::new();
    loop {
        // `next` is cancel-safe: a poll that finds nothing, or a timeout, loses no delivery.
        let item = match poll_once(consumer.next()).await {
            Some(item) => item,
            None if pending.last.is_some() => {
                flush(&channel, &mut pending, &mut r, &plan, clock, &shared).await;
                continue;
            }
            None if !acking.is_empty() => {
                settle_all(&mut acking, &mut r, &plan, &shared).await;
                continue;
            }
            None => {
                if r.idle(&plan, &shared, clock.now_ns()) {
                    break;
                }
                match tokio::time::timeout(IDLE_WAIT, consumer.next()).await {
                    Ok(item) => item,
                    Err(_elapsed) => continue,
                }
            }
        };
        let Some(delivery) = received(item, &mut r) else {
            break;
        };
        if !r.delivered(
            &delivery.data,
            delivery.redelivered,
            &plan,
            clock.now_ns(),
            &shared,
        ) {
            continue;
        }
        let header = read_header(&delivery.data).expect("checked by `delivered`");
        match plan.ack {
            AckMode::NoAck => {}
            AckMode::Each => {
                make_ack_room(&mut acking, &mut r, &plan, &shared).await;
                let t0 = clock.now_ns();
                let (channel, tag) = (&channel, delivery.delivery_tag);
                acking.push(async move {
                    let acked = channel.basic_ack(tag, BasicAckOptions::default()).await;
                    (header, t0, clock.now_ns(), acked)
                });
                // One poll hands the new ack to lapin (and takes those already written).
                settle_written(&mut acking, &mut r, &plan, &shared).await;
            }
            AckMode::Multiple(n) => {
                if pending.hold(header, delivery.delivery_tag, n) {
                    flush(&channel, &mut pending, &mut r, &plan, clock, &shared).await;
                }
            }
        }
    }
    settle_all(&mut acking, &mut r, &plan, &shared).await;
    let _ = conn.close(200, "consumer done".into()).await;
    r
}

/// The delivery a consumer's stream handed over; `None`, noted as a problem, when the
/// stream failed or ended (the server cancelled the consumer).
#[inline]
fn received(item: Option<lapin::Result<Delivery>>, r: &mut ConsumerResult) -> Option<Delivery> {
    match item {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            r.problems.push(format!("receiving: {e}"));
            None
        }
        None => {
            r.problems.push("the server cancelled a consumer".into());
            None
        }
    }
}

type Acking = ((u64, u64), u64, u64, lapin::Result<()>);

/// With `LAPIN_WINDOW` acks in flight, waits for one to be written and settles it, so
/// another may go.
#[inline]
async fn make_ack_room<F: Future<Output = Acking>>(
    acking: &mut FuturesUnordered<F>,
    r: &mut ConsumerResult,
    plan: &Plan,
    shared: &Shared,
) {
    if acking.len() >= LAPIN_WINDOW {
        let done = acking.next().await.expect("the window is not empty");
        acked_each(done, r, plan, shared);
    }
}

/// Polls the acks in flight once, settling those lapin has written, without waiting.
#[inline]
async fn settle_written<F: Future<Output = Acking>>(
    acking: &mut FuturesUnordered<F>,
    r: &mut ConsumerResult,
    plan: &Plan,
    shared: &Shared,
) {
    while let Some(Some(done)) = poll_once(acking.next()).await {
        acked_each(done, r, plan, shared);
    }
}

/// Waits for every ack in flight to be written (or to fail), settling each.
async fn settle_all<F: Future<Output = Acking>>(
    acking: &mut FuturesUnordered<F>,
    r: &mut ConsumerResult,
    plan: &Plan,
    shared: &Shared,
) {
    while let Some(done) = acking.next().await {
        acked_each(done, r, plan, shared);
    }
}

/// One `--ack each` ack that lapin has written (or failed to).
fn acked_each(done: Acking, r: &mut ConsumerResult, plan: &Plan, shared: &Shared) {
    let (header, t0, t1, acked) = done;
    r.settled(plan, shared, &[header], t0, t1, lapin_acked(acked));
}

/// What lapin said of an ack, as [`ConsumerResult::settled`] takes it.
fn lapin_acked(acked: lapin::Result<()>) -> Result<(), String> {
    acked.map_err(|e| format!("acking: {e}"))
}

/// Acks everything pending with one `basic.ack multiple`.
pub(super) async fn flush(
    channel: &Channel,
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
    let acked = channel
        .basic_ack(last, BasicAckOptions { multiple: true })
        .await;
    let acked = lapin_acked(acked);
    r.settled(plan, shared, &pending.sent, t0, clock.now_ns(), acked);
    pending.sent.clear();
}

impl ConsumerResult {
    /// Nothing to receive at `now`: whether this consumer is done (every producer finished
    /// and everything put acked, the run aborted, or the drain took too long).
    pub(super) fn idle(&mut self, plan: &Plan, shared: &Shared, now: u64) -> bool {
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
                "gave up waiting for deliveries {} after the run",
                format_duration(DRAIN_LIMIT)
            ));
            return true;
        }
        false
    }

    /// A delivery (`body`, and whether the server marked it redelivered) arrived at `now`:
    /// records it; with `no_ack` it is settled too. False
    /// (noted as a problem) when it lacks the header.
    pub(super) fn delivered(
        &mut self,
        body: &[u8],
        redelivered: bool,
        plan: &Plan,
        now: u64,
        shared: &Shared,
    ) -> bool {
        let Some((sent, seq)) = read_header(body) else {
            self.problems
                .push("a delivery without the 16-byte header".into());
            return false;
        };
        if redelivered {
            self.redelivered += 1;
        }
        if plan.in_window(now) {
            self.delivered_in_window += 1;
        }
        if plan.in_window(sent) {
            self.deliver.record(now, now.saturating_sub(sent));
        }
        if plan.ack == AckMode::NoAck {
            self.ledger.mark(seq);
            self.acked += 1;
            self.acked_in_window += u64::from(plan.in_window(now));
            shared.acked.fetch_add(1, Relaxed);
        }
        true
    }

    /// One `basic.ack` covering `headers`, made at `t0`, handed over at `t1` (or the
    /// problem that kept it from the server).
    pub(super) fn settled(
        &mut self,
        plan: &Plan,
        shared: &Shared,
        headers: &[(u64, u64)],
        t0: u64,
        t1: u64,
        acked: Result<(), String>,
    ) {
        self.settle_calls += 1;
        if plan.in_window(t0) {
            self.settle.record(t1, t1 - t0);
        }
        if let Err(problem) = acked {
            self.problems.push(problem);
            return;
        }
        for &(sent, seq) in headers {
            self.ledger.mark(seq);
            self.acked += 1;
            if plan.in_window(t1) {
                self.acked_in_window += 1;
            }
            if plan.in_window(sent) {
                self.ack.record(t1, t1.saturating_sub(sent));
            }
        }
        shared.acked.fetch_add(headers.len() as u64, Relaxed);
    }
}
