//! One run of the throughput workload on a fresh broker: a warm-up, the measured window, a
//! drain, and the end-of-run check. `throughput` is one step; `sweep` is many, each at its
//! own rate and shard count.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime};

use leasemq::{Broker, Consumer, ConsumerConfig, Queue, QueueConfig, QueueStats};

use super::tasks;
use super::workers::{consume, produce, ConsumerResult, Plan, ProducerResult, Shared};
use crate::cli::{Api, WorkloadArgs};
use crate::common::{add_stats, broker_error, nanos, queue_names, Clock, Ledger};
use crate::hist::{HistSummary, Recorder};
use crate::intervals::{IntervalClock, IntervalLog, Piece, TimedRecorder};
use crate::progress::Progress;
use crate::report::{cpu_now, thousands, Accounting, ProcessStats, Seen};
use crate::storage::{StepStorage, Storage};

/// Long enough that no lease runs out during a run: every ack is expected to succeed.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(600);
/// Closed loop: the least bound on messages in flight (a smaller one starves the shards of
/// work while producers wait, and 64 Ki small messages cost little memory).
const CLOSED_LOOP_IN_FLIGHT: u64 = 65_536;
/// Open loop: the most messages in flight before producers wait (their lateness counts).
const OPEN_LOOP_IN_FLIGHT: u64 = 1_000_000;
/// How often the waiting thread looks at the clock, the interval channel and the bar.
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// The histograms of a step, in the order of their interval-log slots.
pub const HISTOGRAMS: [(&str, &str); 4] = [
    ("put_to_deliver", "put→deliver"),
    ("put_to_ack", "put→ack"),
    ("settle_rtt", "settle round trip"),
    ("put_to_confirm", "put→answered"),
];
/// The slot of each histogram in [`HISTOGRAMS`] (and in the interval log).
const DELIVER: usize = 0;
const ACK: usize = 1;
const SETTLE: usize = 2;
const CONFIRM: usize = 3;

/// What one step runs.
pub struct Step<'a> {
    pub workload: &'a WorkloadArgs,
    pub shards: u32,
    /// Open loop at this many messages/s in total; `None`: closed loop.
    pub rate: Option<u64>,
    pub warmup: Duration,
    pub duration: Duration,
    /// Keep an interval log with intervals this long.
    pub hlog_interval: Option<Duration>,
    /// The run's data dir, if any: the step builds its broker on a fresh one inside it.
    pub storage: &'a Storage,
    /// Names the step's data dir.
    pub label: &'a str,
}

/// What one step measured.
pub struct StepOutcome {
    /// One histogram per entry of [`HISTOGRAMS`], in its order.
    pub recorders: [Recorder; HISTOGRAMS.len()],
    /// Messages whose send time (intended, in an open loop) fell in the window.
    pub put_in_window: u64,
    pub delivered_in_window: u64,
    /// Acks that returned in the window.
    pub acked_in_window: u64,
    pub settle_calls: u64,
    pub acked: u64,
    pub max_in_flight: u64,
    pub accounting: Accounting,
    pub process: ProcessStats,
    pub intervals: Option<IntervalLog>,
}

impl StepOutcome {
    /// Acks completed per second of the window: the rate the broker sustained.
    pub fn achieved_rate(&self, window: Duration) -> f64 {
        self.acked_in_window as f64 / window.as_secs_f64()
    }
}

/// Flags that make no run.
pub fn validate(w: &WorkloadArgs, rate: Option<u64>, duration: Duration) -> Result<(), String> {
    if w.queues > w.consumers {
        return Err(format!(
            "every queue needs a consumer: --queues {} is more than --consumers {}",
            w.queues, w.consumers
        ));
    }
    if duration.is_zero() {
        return Err("--duration must be more than zero".into());
    }
    if rate == Some(0) {
        return Err("--rate must be more than zero".into());
    }
    let storage = &w.storage;
    if storage.sync.is_some() && !storage.has_data_dir() {
        return Err(
            "--sync sets when the data dir's log reaches the disk: it needs --durable or \
             --data-dir"
                .into(),
        );
    }
    if rate.is_some() && w.api == Api::Async {
        return Err(
            "--api async runs a closed loop only: an open loop (--rate, sweep) needs \
             --api per-message or --api batched"
                .into(),
        );
    }
    if w.pipeline > 1 && w.api != Api::Async {
        return Err(
            "--pipeline keeps several calls of a task in flight: it needs --api async".into(),
        );
    }
    Ok(())
}

fn plan_of(step: &Step) -> Plan {
    let w = step.workload;
    let (producers, consumers) = (w.producers as usize, w.consumers as usize);
    let batched = w.api == Api::Batched;
    let put_batch = if batched { w.put_batch as usize } else { 1 };
    let max_in_flight = match (w.max_in_flight, step.rate) {
        (0, None) => (2 * u64::from(w.prefetch) * consumers as u64
            + (put_batch * producers) as u64)
            .max(CLOSED_LOOP_IN_FLIGHT),
        (0, Some(_)) => OPEN_LOOP_IN_FLIGHT,
        (n, _) => n,
    };
    let warm_ns = nanos(step.warmup);
    Plan {
        api: w.api,
        producers: producers as u64,
        body_bytes: w.body_bytes as usize,
        put_batch,
        settle_batch: w.settle_batch as usize,
        warm_ns,
        end_ns: warm_ns + nanos(step.duration),
        interval_ns: step.rate.map(|r| 1e9 * producers as f64 / r as f64),
        linger_ns: if batched { nanos(w.linger) } else { 0 },
        max_in_flight,
        pipeline: w.pipeline as usize,
    }
}

/// The broker (on the step's data dir, if it has one), its queues (durable with
/// `--durable`) and one consumer per consumer thread.
fn start_broker(
    w: &WorkloadArgs,
    shards: u32,
    storage: &StepStorage,
) -> Result<(Broker, Vec<Queue>, Vec<Consumer>), String> {
    let broker = storage.broker(shards)?;
    let config = QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        max_body_bytes: (w.body_bytes as usize).max(1024 * 1024),
        durable: storage.durable(),
        ..QueueConfig::default()
    };
    let mut qs = Vec::with_capacity(w.queues as usize);
    for name in queue_names("throughput", w.queues as usize, shards as usize) {
        qs.push(
            broker
                .declare_queue(&name, config.clone())
                .map_err(|e| broker_error("declaring a queue", e))?,
        );
    }
    let mut cs = Vec::with_capacity(w.consumers as usize);
    for i in 0..w.consumers as usize {
        let consumer_config = ConsumerConfig {
            prefetch: w.prefetch,
        };
        cs.push(
            qs[i % qs.len()]
                .consume(&format!("consumer-{i}"), consumer_config)
                .map_err(|e| broker_error("registering a consumer", e))?,
        );
    }
    Ok((broker, qs, cs))
}

/// Runs one step and checks it.
pub fn run_step(step: &Step, progress: &Progress) -> Result<StepOutcome, String> {
    validate(step.workload, step.rate, step.duration)?;
    let plan = plan_of(step);
    // The step's data dir, if it has one: removed below, once the broker is shut down.
    let storage = step.storage.for_step(step.label)?;
    let (broker, qs, cs) = start_broker(step.workload, step.shards, &storage)?;
    let clock = Clock::start();
    let mut watch = Watch::new(step, &plan, clock, SystemTime::now(), progress);
    let runtime = start_runtime(step.workload)?;
    let spawner = Spawner {
        plan: &plan,
        clock,
        shared: Arc::default(),
        runtime: runtime.as_ref(),
    };
    let (producers, consumers) = spawner.start(&qs, cs, &mut watch);

    // The warm-up; the measured window, its CPU time read at both ends; the drain.
    watch.until(plan.warm_ns, "warm-up");
    let cpu_start = cpu_now();
    watch.until(plan.end_ns, "measuring");
    let cpu_end = cpu_now();
    watch.while_running(&producers, &consumers);

    let produced = Produced::join(producers)?;
    let consumed = Consumed::join(consumers)?;
    let intervals = watch.finish();
    drop(runtime);
    let mut stats = QueueStats::default();
    for q in &qs {
        add_stats(&mut stats, &q.stats());
    }
    crate::report::note_turns(&broker);
    broker.shutdown();
    drop(broker);
    drop(storage);

    let accounting = check(&produced, &consumed, &stats);
    let seconds = step.duration.as_secs_f64();
    let process = ProcessStats::over_window(cpu_start, cpu_end, seconds, consumed.acked_in_window);
    Ok(StepOutcome {
        // In the slots' order: DELIVER, ACK, SETTLE, CONFIRM.
        recorders: [
            consumed.deliver,
            consumed.ack,
            consumed.settle,
            produced.confirm,
        ],
        put_in_window: produced.put_in_window,
        delivered_in_window: consumed.delivered_in_window,
        acked_in_window: consumed.acked_in_window,
        settle_calls: consumed.settle_calls,
        acked: consumed.acked,
        max_in_flight: plan.max_in_flight,
        accounting,
        process,
        intervals,
    })
}

/// A step's recorders named as in [`HISTOGRAMS`], with their summaries.
pub fn named(
    recorders: [Recorder; HISTOGRAMS.len()],
) -> (Vec<(String, Recorder)>, Vec<HistSummary>) {
    let summaries = HISTOGRAMS
        .iter()
        .zip(&recorders)
        .map(|(&(name, description), r)| r.summary(name, description))
        .collect();
    let named = HISTOGRAMS
        .iter()
        .map(|h| h.0.to_string())
        .zip(recorders)
        .collect();
    (named, summaries)
}

/// The end-of-run check: each producer's sequence numbers against the consumers' ledgers,
/// and both against the queues' counters.
fn check(produced: &Produced, consumed: &Consumed, stats: &QueueStats) -> Accounting {
    let problems = produced.problems.iter().chain(&consumed.problems);
    let seen = Seen {
        put: &produced.put,
        ledger: &consumed.ledger,
        acked: consumed.acked,
        redelivered: consumed.redelivered,
        problems: problems.cloned().collect(),
    };
    Accounting::check(seen, stats)
}

/// The tokio runtime that runs the workers as tasks with `--api async`; none otherwise.
fn start_runtime(w: &WorkloadArgs) -> Result<Option<tokio::runtime::Runtime>, String> {
    if w.api != Api::Async {
        return Ok(None);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(w.runtime_threads as usize)
        .thread_name("loadgen-runtime")
        .on_thread_start(crate::scheduling::caller_thread)
        .enable_time()
        .build()
        .map(Some)
        .map_err(|e| format!("starting the tokio runtime: {e}"))
}

/// Starts the step's producers and consumers: threads, or tasks on its tokio runtime.
struct Spawner<'a> {
    plan: &'a Plan,
    clock: Clock,
    shared: Arc<Shared>,
    runtime: Option<&'a tokio::runtime::Runtime>,
}

impl Spawner<'_> {
    /// Starts the consumers, one per consumer of `cs` (consumer i reads queue i mod Q), then
    /// the producers.
    fn start(
        &self,
        qs: &[Queue],
        cs: Vec<Consumer>,
        watch: &mut Watch<'_>,
    ) -> (Vec<Worker<ProducerResult>>, Vec<Worker<ConsumerResult>>) {
        let consumers = cs
            .into_iter()
            .enumerate()
            .map(|(i, c)| self.consumer(i, c, &qs[i % qs.len()], watch.consumer_result()))
            .collect();
        let producers = (0..self.plan.producers as usize)
            .map(|j| {
                // Its own queue first, then round the others.
                let mine = (0..qs.len()).map(|k| qs[(j + k) % qs.len()].clone());
                self.producer(j, mine.collect(), watch.producer_result())
            })
            .collect();
        // Only the workers hold senders now: the channel closes when the last one finishes.
        watch.tx = None;
        (producers, consumers)
    }

    /// Consumer `i`, which receives from `queue` through `c` and records into `result`.
    fn consumer(
        &self,
        i: usize,
        c: Consumer,
        queue: &Queue,
        result: ConsumerResult,
    ) -> Worker<ConsumerResult> {
        let (plan, clock, shared) = (self.plan.clone(), self.clock, self.shared.clone());
        match self.runtime {
            Some(rt) => {
                let task = tasks::consume(c, queue.clone(), result, plan, clock, shared);
                Worker::Task(rt.handle().clone(), rt.spawn(task))
            }
            None => Worker::Thread(
                thread::Builder::new()
                    .name(format!("consumer-{i}"))
                    .spawn(move || {
                        crate::scheduling::caller_thread();
                        consume(c, result, &plan, clock, &shared)
                    })
                    .expect("spawn a consumer thread"),
            ),
        }
    }

    /// Producer `j`, which puts into `queues` round robin and records into `result`.
    fn producer(
        &self,
        j: usize,
        queues: Vec<Queue>,
        result: ProducerResult,
    ) -> Worker<ProducerResult> {
        let (plan, clock, shared) = (self.plan.clone(), self.clock, self.shared.clone());
        match self.runtime {
            Some(rt) => {
                let task = tasks::produce(j as u64, queues, result, plan, clock, shared);
                Worker::Task(rt.handle().clone(), rt.spawn(task))
            }
            None => Worker::Thread(
                thread::Builder::new()
                    .name(format!("producer-{j}"))
                    .spawn(move || {
                        crate::scheduling::caller_thread();
                        produce(j as u64, &queues, result, &plan, clock, &shared)
                    })
                    .expect("spawn a producer thread"),
            ),
        }
    }
}

/// What the producers reported, in the order of their numbers.
struct Produced {
    /// Messages each producer put.
    put: Vec<u64>,
    put_in_window: u64,
    confirm: Recorder,
    problems: Vec<String>,
}

impl Produced {
    /// Waits for every producer and adds up what they report.
    fn join(producers: Vec<Worker<ProducerResult>>) -> Result<Produced, String> {
        let mut produced = Produced {
            put: Vec::with_capacity(producers.len()),
            put_in_window: 0,
            confirm: Recorder::new(),
            problems: Vec::new(),
        };
        for t in producers {
            let r = t.join().ok_or_else(|| "a producer panicked".to_string())?;
            produced.put.push(r.put);
            produced.put_in_window += r.put_in_window;
            produced.confirm.merge(&r.confirm.finish());
            produced.problems.extend(r.problem);
        }
        Ok(produced)
    }
}

/// What the consumers reported, merged.
#[derive(Default)]
struct Consumed {
    deliver: Recorder,
    ack: Recorder,
    settle: Recorder,
    ledger: Ledger,
    acked: u64,
    acked_in_window: u64,
    delivered_in_window: u64,
    settle_calls: u64,
    redelivered: u64,
    problems: Vec<String>,
}

impl Consumed {
    /// Waits for every consumer and merges what they report.
    fn join(consumers: Vec<Worker<ConsumerResult>>) -> Result<Consumed, String> {
        let mut c = Consumed::default();
        for t in consumers {
            let r = t.join().ok_or_else(|| "a consumer panicked".to_string())?;
            c.deliver.merge(&r.deliver.finish());
            c.ack.merge(&r.ack.finish());
            c.settle.merge(&r.settle.finish());
            c.ledger.merge(&r.ledger);
            c.acked += r.acked;
            c.acked_in_window += r.acked_in_window;
            c.delivered_in_window += r.delivered_in_window;
            c.settle_calls += r.settle_calls;
            c.redelivered += r.redelivered;
            c.problems.extend(r.problems);
        }
        Ok(c)
    }
}

/// A producer or consumer: a thread, or a task on the run's tokio runtime (`--api async`).
enum Worker<T> {
    Thread(JoinHandle<T>),
    Task(tokio::runtime::Handle, tokio::task::JoinHandle<T>),
}

impl<T> Worker<T> {
    fn is_finished(&self) -> bool {
        match self {
            Worker::Thread(t) => t.is_finished(),
            Worker::Task(_, t) => t.is_finished(),
        }
    }

    /// Its result; `None` if it panicked.
    fn join(self) -> Option<T> {
        match self {
            Worker::Thread(t) => t.join().ok(),
            Worker::Task(rt, t) => rt.block_on(t).ok(),
        }
    }
}

/// The thread that started the step, while the workers run: folds finished intervals into
/// the interval log and keeps the progress bar moving.
struct Watch<'a> {
    clock: Clock,
    progress: &'a Progress,
    planned: Duration,
    rate_text: String,
    /// Handed to each worker's recorders; dropped here once they have theirs.
    tx: Option<Sender<Piece>>,
    rx: Option<Receiver<Piece>>,
    log: Option<IntervalLog>,
    packed_before: u64,
}

impl<'a> Watch<'a> {
    fn new(
        step: &Step,
        plan: &Plan,
        clock: Clock,
        epoch: SystemTime,
        progress: &'a Progress,
    ) -> Watch<'a> {
        let (tx, rx, log) = match step.hlog_interval {
            Some(length) => {
                let names: Vec<&str> = HISTOGRAMS.iter().map(|h| h.0).collect();
                let interval_clock = IntervalClock::new(plan.warm_ns, length);
                let log = IntervalLog::new(&names, epoch, interval_clock, step.duration);
                let (tx, rx) = mpsc::channel();
                (Some(tx), Some(rx), Some(log))
            }
            None => (None, None, None),
        };
        Watch {
            clock,
            progress,
            planned: step.warmup + step.duration,
            rate_text: step
                .rate
                .map_or(String::new(), |r| format!(", {}/s offered", thousands(r))),
            tx,
            rx,
            log,
            packed_before: 0,
        }
    }

    /// A recorder for `slot`, wired to the interval log if there is one.
    fn timed(&self, slot: usize) -> TimedRecorder {
        TimedRecorder::new(match (&self.tx, &self.log) {
            (Some(tx), Some(log)) => Some((log.clock(), slot, tx.clone())),
            _ => None,
        })
    }

    /// A consumer's empty result.
    fn consumer_result(&self) -> ConsumerResult {
        ConsumerResult {
            deliver: self.timed(DELIVER),
            ack: self.timed(ACK),
            settle: self.timed(SETTLE),
            ..ConsumerResult::default()
        }
    }

    /// A producer's empty result.
    fn producer_result(&self) -> ProducerResult {
        ProducerResult {
            confirm: self.timed(CONFIRM),
            ..ProducerResult::default()
        }
    }

    /// Waits until `at_ns` on the run's clock.
    fn until(&mut self, at_ns: u64, phase: &str) {
        loop {
            let now = self.clock.now_ns();
            if now >= at_ns {
                return;
            }
            self.look(phase, Duration::from_nanos(at_ns - now).min(WATCH_EVERY));
        }
    }

    /// Waits until every worker has finished (the drain after the window).
    fn while_running<A, B>(&mut self, producers: &[Worker<A>], consumers: &[Worker<B>]) {
        while !(producers.iter().all(|t| t.is_finished())
            && consumers.iter().all(|t| t.is_finished()))
        {
            self.look("draining", WATCH_EVERY);
        }
    }

    /// Waits at most `nap` for a finished interval; updates the bar.
    fn look(&mut self, phase: &str, nap: Duration) {
        let elapsed = Duration::from_nanos(self.clock.now_ns());
        self.progress
            .update(phase, elapsed, self.planned, || self.rate_text.clone());
        let (Some(rx), Some(log)) = (&self.rx, &mut self.log) else {
            thread::sleep(nap);
            return;
        };
        match rx.recv_timeout(nap) {
            Ok(piece) => log.absorb(piece),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(nap),
        }
        // Intervals two behind the clock are complete but for stragglers: compress them.
        let settled = log.index_at(self.clock.now_ns()).saturating_sub(1);
        if settled > self.packed_before {
            log.pack_before(settled);
            self.packed_before = settled;
        }
    }

    /// Takes the last intervals (every worker has finished its recorders) and the log.
    fn finish(mut self) -> Option<IntervalLog> {
        let (rx, mut log) = (self.rx.take()?, self.log.take()?);
        for piece in rx.try_iter() {
            log.absorb(piece);
        }
        log.close(self.clock.now_ns());
        Some(log)
    }
}
