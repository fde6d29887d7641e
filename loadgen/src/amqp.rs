//! `throughput --target amqp://…`: the throughput workload against an AMQP 0-9-1 server
//! (leasemqd, RabbitMQ) through the `lapin` client, instead of the embedded broker.
//!
//! Each producer and each consumer is a connection of its own with one channel, as separate
//! client processes would be; all are tasks on one tokio runtime (`--runtime-threads`), and
//! lapin reads and writes each connection's socket on a thread of its own. Producers
//! publish through the default exchange, round robin over the run's queues (fresh names per
//! run, so an earlier run's leftovers never count), with publisher confirms or without
//! (`--confirms`); consumers set `basic.qos` to `--prefetch` and ack each delivery, or
//! every N with `multiple`, or consume with `no_ack` (`--ack`, `--no-ack`).
//!
//! Bodies carry the send time and a sequence number as in the embedded run (`BodyWriter`),
//! so the histograms mean the same: `put_to_deliver` is the publish call → the consumer
//! has the delivery, both on this process's clock. `basic.ack` has no answer in AMQP:
//! `put_to_ack` ends, and `settle_rtt` measures, when lapin has handed the ack to its
//! connection. With confirms, `put_to_confirm` is the publish → its `basic.ack` from the
//! server. The end-of-run check ticks every sequence number off as in the embedded run; the
//! queue counters it holds them against are what the server says (`queue.declare` passive
//! gives the messages still ready), not the broker's own stats.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use crossbeam_utils::CachePadded;
use futures_lite::future::poll_once;
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use leasemq::QueueStats;
use serde_json::json;

use crate::cli::{format_duration, AckMode, ThroughputArgs};
use crate::common::{nanos, read_header, seq_of, BodyWriter, Clock, Ledger};
use crate::cpu::CpuTime;
use crate::hist::{Recorder, HGRM_UNIT};
use crate::intervals::{IntervalClock, IntervalLog, Piece, TimedRecorder};
use crate::progress::Progress;
use crate::report::{cpu_now, load_average, Accounting, Detail, Rate, Seen, Summary};
use crate::report::{thousands, ProcessStats};
use crate::Run;

/// How long connecting (and each setup call) may take before the run gives up.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);
/// How long consumers may take, after producers stop, to receive what is still in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// How long an idle consumer waits for a delivery before it looks whether the run is over.
const IDLE_WAIT: Duration = Duration::from_millis(1);
/// How long a producer pauses while the run has as many messages in flight as it allows.
const FULL_PAUSE: Duration = Duration::from_millis(1);
/// The least bound on messages in flight, as in the embedded closed loop.
const CLOSED_LOOP_IN_FLIGHT: u64 = 65_536;
/// How often the waiting thread looks at the clock, the interval channel and the bar.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The histograms' slots in the interval log.
const DELIVER: usize = 0;
const ACK: usize = 1;
const SETTLE: usize = 2;
const CONFIRM: usize = 3;
const HISTOGRAMS: [(&str, &str); 4] = [
    ("put_to_deliver", "publish→deliver"),
    ("put_to_ack", "publish→ack sent"),
    ("settle_rtt", "basic.ack handed to the connection"),
    ("put_to_confirm", "publish→confirm"),
];

/// The run's settings, as the tasks need them.
#[derive(Clone, Debug)]
struct Plan {
    producers: u64,
    body_bytes: usize,
    prefetch: u16,
    ack: AckMode,
    confirms: bool,
    warm_ns: u64,
    end_ns: u64,
    max_in_flight: u64,
}

impl Plan {
    fn in_window(&self, t: u64) -> bool {
        t >= self.warm_ns && t < self.end_ns
    }

    /// The histograms this run measures, by slot.
    fn slots(&self) -> Vec<usize> {
        let mut slots = vec![DELIVER];
        if self.ack != AckMode::NoAck {
            slots.extend([ACK, SETTLE]);
        }
        if self.confirms {
            slots.push(CONFIRM);
        }
        slots
    }
}

/// What every task sees.
#[derive(Default)]
struct Shared {
    /// Messages handed to `basic_publish` (counted before the call).
    put: CachePadded<AtomicU64>,
    /// Messages acked (with `no_ack`: received).
    acked: CachePadded<AtomicU64>,
    producers_done: AtomicU32,
    abort: AtomicBool,
}

#[derive(Default)]
struct ProducerResult {
    put: u64,
    put_in_window: u64,
    confirm: Option<TimedRecorder>,
    nacked: u64,
    problems: Vec<String>,
}

#[derive(Default)]
struct ConsumerResult {
    deliver: TimedRecorder,
    ack: TimedRecorder,
    settle: TimedRecorder,
    ledger: Ledger,
    acked: u64,
    acked_in_window: u64,
    delivered_in_window: u64,
    settle_calls: u64,
    redelivered: u64,
    problems: Vec<String>,
}

/// `uri` with its password hidden, for titles and `summary.json`.
pub fn masked(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return uri.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => uri.to_string(),
    }
}

/// Runs `throughput` against `target` and summarises it as the embedded run is.
///
/// # Errors
///
/// Flags that make no AMQP run, a server that cannot be reached or refuses the setup.
pub fn run(args: &ThroughputArgs, target: &str) -> Result<Run, String> {
    validate(args)?;
    let plan = plan_of(args);
    let w = &args.workload;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(w.runtime_threads as usize)
        .thread_name("loadgen-amqp")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))?;
    let queues = queue_names(w.queues);
    let setup = runtime.block_on(Setup::open(target, &queues, w.storage.durable))?;
    let consumers = runtime.block_on(open_consumers(target, &queues, &plan, w.consumers))?;
    let producers = runtime.block_on(open_producers(target, &plan))?;

    let progress = Progress::new(args.warmup + args.duration, args.output.quiet);
    let clock = Clock::start();
    let mut watch = Watch::new(args, &plan, clock, &progress);
    let shared = Arc::new(Shared::default());
    let consumer_tasks: Vec<_> = consumers
        .into_iter()
        .map(|c| {
            let result = watch.consumer_result();
            let task = consume(c, result, plan.clone(), clock, shared.clone());
            runtime.spawn(task)
        })
        .collect();
    let producer_tasks: Vec<_> = producers
        .into_iter()
        .enumerate()
        .map(|(j, p)| {
            let mine = (0..queues.len()).map(|k| queues[(j + k) % queues.len()].clone());
            let result = ProducerResult {
                confirm: plan.confirms.then(|| watch.recorder(CONFIRM)),
                ..ProducerResult::default()
            };
            let (queues, plan) = (mine.collect(), plan.clone());
            runtime.spawn(produce(
                j as u64,
                p,
                queues,
                result,
                plan,
                clock,
                shared.clone(),
            ))
        })
        .collect();
    watch.tx = None;

    watch.until(plan.warm_ns, "warm-up");
    let cpu_start = cpu_now();
    watch.until(plan.end_ns, "measuring");
    let cpu_end = cpu_now();
    watch.while_running(|| {
        consumer_tasks.iter().all(|t| t.is_finished())
            && producer_tasks.iter().all(|t| t.is_finished())
    });
    let mut produced = Vec::new();
    for t in producer_tasks {
        produced.push(runtime.block_on(t).map_err(|_| "a producer panicked")?);
    }
    let mut consumed = Vec::new();
    for t in consumer_tasks {
        consumed.push(runtime.block_on(t).map_err(|_| "a consumer panicked")?);
    }
    // Finishing a recorder hands its last interval to the log: before the log is closed.
    let recorders = finish_recorders(&mut produced, &mut consumed);
    let intervals = watch.finish();
    let still_ready = runtime.block_on(setup.close(&queues))?;
    progress.finish();
    Ok(summarise(
        args,
        target,
        &plan,
        Outcome {
            produced,
            consumed,
            recorders,
            still_ready,
            cpu: (cpu_start, cpu_end),
            intervals,
        },
    ))
}

/// Flags that make no AMQP run.
fn validate(args: &ThroughputArgs) -> Result<(), String> {
    let w = &args.workload;
    if w.queues > w.consumers {
        return Err(format!(
            "every queue needs a consumer: --queues {} is more than --consumers {}",
            w.queues, w.consumers
        ));
    }
    if args.duration.is_zero() {
        return Err("--duration must be more than zero".into());
    }
    if args.rate.is_some() {
        return Err("--target runs a closed loop only: leave out --rate".into());
    }
    if w.storage.data_dir.is_some() || w.storage.sync.is_some() {
        return Err(
            "--data-dir and --sync set up the embedded broker; with --target the server \
             has its own (--durable declares the queues durable)"
                .into(),
        );
    }
    if w.prefetch > u32::from(u16::MAX) {
        return Err("--prefetch is at most 65535 over AMQP".into());
    }
    Ok(())
}

fn plan_of(args: &ThroughputArgs) -> Plan {
    let w = &args.workload;
    let max_in_flight = match w.max_in_flight {
        0 => (2 * u64::from(w.prefetch) * u64::from(w.consumers) + u64::from(w.producers))
            .max(CLOSED_LOOP_IN_FLIGHT),
        n => n,
    };
    let warm_ns = nanos(args.warmup);
    Plan {
        producers: u64::from(w.producers),
        body_bytes: w.body_bytes as usize,
        prefetch: u16::try_from(w.prefetch).unwrap_or(u16::MAX),
        ack: args.amqp.ack_mode(),
        confirms: args.amqp.confirms,
        warm_ns,
        end_ns: warm_ns + nanos(args.duration),
        max_in_flight,
    }
}

/// Queue names no earlier run used: the process id and the start time.
fn queue_names(count: u32) -> Vec<String> {
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let run = format!("{}.{started}", std::process::id());
    (0..count)
        .map(|i| format!("loadgen.throughput.{run}.{i}"))
        .collect()
}

async fn connect(target: &str, role: &str) -> Result<Connection, String> {
    let connecting = Connection::connect(target, ConnectionProperties::default());
    match tokio::time::timeout(CONNECT_LIMIT, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("{role}: connecting to {}: {e}", masked(target))),
        Err(_) => Err(format!(
            "{role}: no connection to {} within {}",
            masked(target),
            format_duration(CONNECT_LIMIT)
        )),
    }
}

fn amqp_error(what: &str) -> impl Fn(lapin::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The connection that declares the run's queues, and at the end counts and deletes them.
struct Setup {
    conn: Connection,
    channel: Channel,
}

impl Setup {
    async fn open(target: &str, queues: &[String], durable: bool) -> Result<Setup, String> {
        let conn = connect(target, "setup").await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(amqp_error("opening a channel"))?;
        let options = QueueDeclareOptions {
            durable,
            ..QueueDeclareOptions::default()
        };
        for q in queues {
            channel
                .queue_declare(q.as_str().into(), options, FieldTable::default())
                .await
                .map_err(amqp_error("declaring a queue"))?;
        }
        Ok(Setup { conn, channel })
    }

    /// The messages still ready in `queues`; then deletes them where the server serves
    /// `queue.delete` (a server that does not may close the connection: nothing is lost).
    async fn close(self, queues: &[String]) -> Result<u64, String> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let mut ready = 0;
        for q in queues {
            let answer = self
                .channel
                .queue_declare(q.as_str().into(), passive, FieldTable::default())
                .await
                .map_err(amqp_error("counting what is left in a queue"))?;
            ready += u64::from(answer.message_count());
        }
        for q in queues {
            let options = QueueDeleteOptions::default();
            if self
                .channel
                .queue_delete(q.as_str().into(), options)
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = self.conn.close(200, "run over".into()).await;
        Ok(ready)
    }
}

/// A consumer's connection, channel and subscription.
struct Subscriber {
    conn: Connection,
    consumer: lapin::Consumer,
}

async fn open_consumers(
    target: &str,
    queues: &[String],
    plan: &Plan,
    count: u32,
) -> Result<Vec<Subscriber>, String> {
    let mut subscribers = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let conn = connect(target, "consumer").await?;
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
        subscribers.push(Subscriber { conn, consumer });
    }
    Ok(subscribers)
}

/// A producer's connection and channel (in confirm mode with `--confirms`).
struct Publisher {
    conn: Connection,
    channel: Channel,
}

async fn open_producers(target: &str, plan: &Plan) -> Result<Vec<Publisher>, String> {
    let mut publishers = Vec::with_capacity(plan.producers as usize);
    for _ in 0..plan.producers {
        let conn = connect(target, "producer").await?;
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
struct Unconfirmed {
    waiting: VecDeque<(u64, PublisherConfirm)>,
}

impl Unconfirmed {
    /// Takes the confirms that have come (all of them with `all`, waiting for each).
    async fn settle(&mut self, r: &mut ProducerResult, plan: &Plan, clock: Clock, all: bool) {
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
async fn produce(
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

async fn publish_until_end(
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
        shared.put.fetch_add(1, Relaxed);
        let queue = queues[local as usize % queues.len()].as_str();
        let body = bodies.body(now, seq_of(index, local));
        let published = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default(),
            )
            .await;
        match published {
            Ok(confirm) if plan.confirms => unconfirmed.waiting.push_back((now, confirm)),
            Ok(_) => {}
            Err(e) => {
                shared.put.fetch_sub(1, Relaxed);
                r.problems.push(format!("publishing: {e}"));
                shared.abort.store(true, Relaxed);
                break;
            }
        }
        if plan.in_window(now) {
            r.put_in_window += 1;
        }
        local += 1;
        unconfirmed.settle(r, plan, clock, false).await;
    }
    unconfirmed.settle(r, plan, clock, true).await;
    r.put = local;
}

/// A consumer's deliveries received but not yet acked (`--ack multiple:N`).
struct Pending {
    sent: Vec<(u64, u64)>,
    last: Option<Acker>,
}

/// One consumer: receives and acks until every producer is done and everything put is
/// acked.
async fn consume(
    s: Subscriber,
    mut r: ConsumerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ConsumerResult {
    let Subscriber { conn, mut consumer } = s;
    let mut pending = Pending {
        sent: Vec::new(),
        last: None,
    };
    loop {
        // `next` is cancel-safe: a poll that finds nothing, or a timeout, loses no delivery.
        let item = match poll_once(consumer.next()).await {
            Some(item) => item,
            None if pending.last.is_some() => {
                flush(&mut pending, &mut r, &plan, clock, &shared).await;
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
        let delivery = match item {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                r.problems.push(format!("receiving: {e}"));
                break;
            }
            None => {
                r.problems.push("the server cancelled a consumer".into());
                break;
            }
        };
        if !r.delivered(&delivery, &plan, clock.now_ns(), &shared) {
            continue;
        }
        let header = read_header(&delivery.data).expect("checked by `delivered`");
        match plan.ack {
            AckMode::NoAck => {}
            AckMode::Each => {
                let t0 = clock.now_ns();
                let acked = delivery.acker.ack(BasicAckOptions::default()).await;
                r.settled(&plan, &shared, &[header], t0, clock.now_ns(), acked);
            }
            AckMode::Multiple(n) => {
                pending.sent.push(header);
                pending.last = Some(delivery.acker);
                if pending.sent.len() >= n as usize {
                    flush(&mut pending, &mut r, &plan, clock, &shared).await;
                }
            }
        }
    }
    let _ = conn.close(200, "consumer done".into()).await;
    r
}

/// Acks everything pending with one `basic.ack multiple`.
async fn flush(
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
    let acked = last.ack(BasicAckOptions { multiple: true }).await;
    r.settled(plan, shared, &pending.sent, t0, clock.now_ns(), acked);
    pending.sent.clear();
}

impl ConsumerResult {
    /// Nothing to receive at `now`: whether this consumer is done (every producer finished
    /// and everything put acked, the run aborted, or the drain took too long).
    fn idle(&mut self, plan: &Plan, shared: &Shared, now: u64) -> bool {
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

    /// A delivery arrived at `now`: records it; with `no_ack` it is settled too. False
    /// (noted as a problem) when it lacks the header.
    fn delivered(
        &mut self,
        delivery: &lapin::message::Delivery,
        plan: &Plan,
        now: u64,
        shared: &Shared,
    ) -> bool {
        let Some((sent, seq)) = read_header(&delivery.data) else {
            self.problems
                .push("a delivery without the 16-byte header".into());
            return false;
        };
        if delivery.redelivered {
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

    /// One `basic.ack` covering `headers`, made at `t0`, handed over at `t1`.
    fn settled(
        &mut self,
        plan: &Plan,
        shared: &Shared,
        headers: &[(u64, u64)],
        t0: u64,
        t1: u64,
        acked: lapin::Result<bool>,
    ) {
        self.settle_calls += 1;
        if plan.in_window(t0) {
            self.settle.record(t1, t1 - t0);
        }
        match acked {
            Ok(true) => {}
            Ok(false) => {
                self.problems
                    .push("an ack was refused by the client (channel closed)".into());
                return;
            }
            Err(e) => {
                self.problems.push(format!("acking: {e}"));
                return;
            }
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

/// The thread that started the run, while the tasks run: folds finished intervals into the
/// interval log and keeps the progress bar moving.
struct Watch<'a> {
    clock: Clock,
    progress: &'a Progress,
    planned: Duration,
    tx: Option<mpsc::Sender<Piece>>,
    rx: Option<mpsc::Receiver<Piece>>,
    log: Option<IntervalLog>,
    /// The histograms measured, in the order of their slots in the interval log.
    slots: Vec<usize>,
}

impl<'a> Watch<'a> {
    fn new(args: &ThroughputArgs, plan: &Plan, clock: Clock, progress: &'a Progress) -> Self {
        let (tx, rx, log) = match args.output.out {
            Some(_) => {
                let names: Vec<&str> = plan.slots().iter().map(|&i| HISTOGRAMS[i].0).collect();
                let interval_clock = IntervalClock::new(plan.warm_ns, args.output.hlog_interval);
                let log =
                    IntervalLog::new(&names, SystemTime::now(), interval_clock, args.duration);
                let (tx, rx) = mpsc::channel();
                (Some(tx), Some(rx), Some(log))
            }
            None => (None, None, None),
        };
        Watch {
            clock,
            progress,
            planned: args.warmup + args.duration,
            tx,
            rx,
            log,
            slots: plan.slots(),
        }
    }

    /// A recorder for histogram `which`, wired to the interval log if there is one and
    /// the run measures it.
    fn recorder(&self, which: usize) -> TimedRecorder {
        let slot = self.slots.iter().position(|&s| s == which);
        TimedRecorder::new(match (&self.tx, &self.log, slot) {
            (Some(tx), Some(log), Some(slot)) => Some((log.clock(), slot, tx.clone())),
            _ => None,
        })
    }

    fn consumer_result(&self) -> ConsumerResult {
        ConsumerResult {
            deliver: self.recorder(DELIVER),
            ack: self.recorder(ACK),
            settle: self.recorder(SETTLE),
            ..ConsumerResult::default()
        }
    }

    fn until(&mut self, at_ns: u64, phase: &str) {
        while self.clock.now_ns() < at_ns {
            let left = Duration::from_nanos(at_ns - self.clock.now_ns());
            self.look(phase, left.min(WATCH_EVERY));
        }
    }

    fn while_running(&mut self, finished: impl Fn() -> bool) {
        while !finished() {
            self.look("draining", WATCH_EVERY);
        }
    }

    fn look(&mut self, phase: &str, nap: Duration) {
        let elapsed = Duration::from_nanos(self.clock.now_ns());
        self.progress
            .update(phase, elapsed, self.planned, String::new);
        match (&self.rx, &mut self.log) {
            (Some(rx), Some(log)) => match rx.recv_timeout(nap) {
                Ok(piece) => log.absorb(piece),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(nap),
            },
            _ => std::thread::sleep(nap),
        }
    }

    fn finish(mut self) -> Option<IntervalLog> {
        let (rx, mut log) = (self.rx.take()?, self.log.take()?);
        for piece in rx.try_iter() {
            log.absorb(piece);
        }
        log.close(self.clock.now_ns());
        Some(log)
    }
}

/// What the run measured.
struct Outcome {
    produced: Vec<ProducerResult>,
    consumed: Vec<ConsumerResult>,
    /// The merged histograms, by slot.
    recorders: Vec<Recorder>,
    still_ready: u64,
    /// The process's CPU time at both ends of the window.
    cpu: (CpuTime, CpuTime),
    intervals: Option<IntervalLog>,
}

/// Takes every task's histograms out of its result, finished, and merges them by slot.
fn finish_recorders(
    produced: &mut [ProducerResult],
    consumed: &mut [ConsumerResult],
) -> Vec<Recorder> {
    let mut recorders: Vec<Recorder> = (0..HISTOGRAMS.len()).map(|_| Recorder::new()).collect();
    for c in consumed {
        recorders[DELIVER].merge(&std::mem::take(&mut c.deliver).finish());
        recorders[ACK].merge(&std::mem::take(&mut c.ack).finish());
        recorders[SETTLE].merge(&std::mem::take(&mut c.settle).finish());
    }
    for p in produced {
        if let Some(rec) = p.confirm.take() {
            recorders[CONFIRM].merge(&rec.finish());
        }
    }
    recorders
}

fn summarise(args: &ThroughputArgs, target: &str, plan: &Plan, out: Outcome) -> Run {
    let w = &args.workload;
    let seconds = args.duration.as_secs_f64();
    let recorders = out.recorders;
    let (mut ledger, mut problems) = (Ledger::default(), Vec::new());
    let (mut acked, mut acked_in_window, mut delivered_in_window) = (0, 0, 0);
    let (mut settle_calls, mut redelivered) = (0, 0);
    for c in out.consumed {
        ledger.merge(&c.ledger);
        acked += c.acked;
        acked_in_window += c.acked_in_window;
        delivered_in_window += c.delivered_in_window;
        settle_calls += c.settle_calls;
        redelivered += c.redelivered;
        problems.extend(c.problems);
    }
    let (mut put, mut put_in_window) = (Vec::new(), 0);
    for p in out.produced {
        put.push(p.put);
        put_in_window += p.put_in_window;
        problems.extend(p.problems);
    }
    // The server's side, as AMQP shows it: what is still ready in the queues.
    let stats = QueueStats {
        enqueued: put.iter().sum(),
        acked,
        ready: out.still_ready as usize,
        ..QueueStats::default()
    };
    let accounting = Accounting::check(
        Seen {
            put: &put,
            ledger: &ledger,
            acked,
            redelivered,
            problems,
        },
        &stats,
    );
    let (cpu_start, cpu_end) = out.cpu;
    let process = ProcessStats::over_window(cpu_start, cpu_end, seconds, acked_in_window);
    let ack_text = plan.ack.text();
    let confirms = if plan.confirms { "on" } else { "off" };
    let title = format!(
        "AMQP {}: {} producer(s), {} consumer(s), {} queue(s); {}-byte bodies; prefetch {}, \
         ack {ack_text}, confirms {confirms}; closed loop, at most {} in flight; {} measured \
         after {} warm-up",
        masked(target),
        w.producers,
        w.consumers,
        w.queues,
        w.body_bytes,
        plan.prefetch,
        thousands(plan.max_in_flight),
        format_duration(args.duration),
        format_duration(args.warmup)
    );
    let config = json!({
        "target": masked(target), "producers": w.producers, "consumers": w.consumers,
        "queues": w.queues, "body_bytes": w.body_bytes, "prefetch": plan.prefetch,
        "ack": ack_text, "confirms": plan.confirms, "durable": w.storage.durable,
        "runtime_threads": w.runtime_threads, "duration_s": seconds,
        "warmup_s": args.warmup.as_secs_f64(), "rate": null,
        "max_in_flight": plan.max_in_flight,
    });
    let slots = plan.slots();
    let mut details = vec![Detail::new("settle calls", settle_calls)];
    if plan.ack != AckMode::NoAck {
        let per_call = acked as f64 / settle_calls.max(1) as f64;
        details.push(Detail::new(
            "messages per settle call",
            (per_call * 10.0).round() / 10.0,
        ));
    }
    let summary = Summary {
        tool: "leasemq-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        command: "throughput",
        title,
        config,
        measured_seconds: seconds,
        rates: vec![
            Rate::new("put", put_in_window, seconds),
            Rate::new("delivered", delivered_in_window, seconds),
            Rate::new("acked", acked_in_window, seconds),
        ],
        histograms: slots
            .iter()
            .map(|&i| recorders[i].summary(HISTOGRAMS[i].0, HISTOGRAMS[i].1))
            .collect(),
        details,
        accounting,
        process,
        load_average: load_average(),
        hgrm_unit: HGRM_UNIT,
        plots: Vec::new(),
        notes: vec![
            "process: this load generator's CPU only; the server's is not counted".into(),
            "a publish is counted as put when lapin has taken it, not when the server has".into(),
        ],
    };
    let mut named: Vec<Option<Recorder>> = recorders.into_iter().map(Some).collect();
    Run {
        summary,
        recorders: slots
            .iter()
            .map(|&i| (HISTOGRAMS[i].0.to_string(), named[i].take().expect("once")))
            .collect(),
        intervals: out.intervals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            masked("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(masked("amqp://127.0.0.1/%2f"), "amqp://127.0.0.1/%2f");
        assert_eq!(masked("amqp://user@host/%2f"), "amqp://user@host/%2f");
    }
}
