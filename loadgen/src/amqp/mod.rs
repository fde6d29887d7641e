//! `throughput --target amqp://…`: the throughput workload against an AMQP 0-9-1 server
//! (leasemqd, RabbitMQ) through the `lapin` client, instead of the embedded broker; or,
//! with `--client raw`, through the loadgen's own pipelined client (`raw`), with the same
//! topology, histograms and end-of-run check.
//!
//! Each producer and each consumer is a connection of its own with one channel, as separate
//! client processes would be; all are tasks on one tokio runtime (`--runtime-threads`), and
//! lapin reads and writes each connection's socket on a thread of its own. With several
//! `--target`s (the nodes of a cluster) the connections are dealt out over them round
//! robin (`targets`); the queues are declared through the first (`setup`), with the
//! `--queue-arg`s in each declaration's arguments table (`queue_args`). Producers
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

use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use lapin::tcp::OwnedTLSConfig;
use lapin::{Connection, ConnectionProperties};

use crate::cli::{format_duration, AckMode, Client, ThroughputArgs};
use crate::common::{nanos, Clock};
use crate::intervals::{IntervalClock, IntervalLog, Piece, TimedRecorder};
use crate::progress::Progress;
use crate::report::cpu_now;
use crate::Run;
use queue_args::{QueueArg, QueueArgValue};
use setup::Setup;
use summary::{finish_recorders, summarise, Outcome};
use targets::{Target, Targets};
use tls::ClientTls;
use tokio::task::JoinHandle;
use workers::{
    consume, open_consumers, open_producers, produce, ConsumerResult, ProducerResult, Publisher,
    Shared, Subscriber,
};

/// How long connecting (and each setup call) may take before the run gives up.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);
/// The least bound on messages in flight, as in the embedded closed loop.
const CLOSED_LOOP_IN_FLIGHT: u64 = 65_536;
/// How often the waiting thread looks at the clock, the interval channel and the bar.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The histograms' slots in the interval log.
const DELIVER: usize = 0;
const ACK: usize = 1;
const SETTLE: usize = 2;
const CONFIRM: usize = 3;
/// Every histogram's file name and description, by slot.
const HISTOGRAMS: [(&str, &str); 4] = [
    ("put_to_deliver", "publish→deliver"),
    ("put_to_ack", "publish→ack sent"),
    ("settle_rtt", "ack handed over"),
    ("put_to_confirm", "publish→confirm"),
];

/// The run's settings, as the tasks need them.
#[derive(Clone, Debug)]
struct Plan {
    pub(super) producers: u64,
    pub(super) body_bytes: usize,
    pub(super) prefetch: u16,
    pub(super) ack: AckMode,
    pub(super) confirms: bool,
    pub(super) warm_ns: u64,
    pub(super) end_ns: u64,
    pub(super) max_in_flight: u64,
    pub(super) client: Client,
}

impl Plan {
    pub(super) fn in_window(&self, t: u64) -> bool {
        t >= self.warm_ns && t < self.end_ns
    }

    /// The histograms this run measures, by slot.
    pub(super) fn slots(&self) -> Vec<usize> {
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

pub mod queue_args;
mod raw;
mod setup;
mod summary;
mod targets;
mod tls;
mod workers;

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

/// Runs `throughput` against its `--target`s and summarises it as the embedded run is.
///
/// # Errors
///
/// Flags that make no AMQP run, a server that cannot be reached or refuses the setup.
pub fn run(args: &ThroughputArgs) -> Result<Run, String> {
    validate(args)?;
    let plan = plan_of(args);
    let w = &args.workload;
    let tls = match &args.amqp.tls_ca {
        Some(path) => Some(ClientTls::load(path)?),
        None => None,
    };
    let targets = Targets::new(&args.amqp.targets, w.consumers as usize, tls.as_ref());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(w.runtime_threads as usize)
        .thread_name("loadgen-amqp")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))?;
    let queues = queue_names(w.queues);
    let setup = runtime.block_on(Setup::open(
        targets.first(),
        &queues,
        w.storage.durable,
        &args.amqp.queue_args,
    ))?;
    let opening = open_connections(targets, &queues, &plan, w.consumers);
    let (consumers, producers) = runtime.block_on(opening)?;

    let progress = Progress::new(args.warmup + args.duration, args.output.quiet);
    let clock = Clock::start();
    let mut watch = Watch::new(args, &plan, clock, &progress);
    let started = Started {
        runtime: &runtime,
        plan: &plan,
        clock,
        shared: Arc::default(),
    };
    let consumer_tasks = started.consumers(consumers, &watch);
    let producer_tasks = started.producers(producers, &queues, &watch);
    // Only the tasks hold senders now: the channel closes when the last one finishes.
    watch.tx = None;

    watch.until(plan.warm_ns, "warm-up");
    let cpu_start = cpu_now();
    watch.until(plan.end_ns, "measuring");
    let cpu_end = cpu_now();
    watch.while_running(|| {
        consumer_tasks.iter().all(|t| t.is_finished())
            && producer_tasks.iter().all(|t| t.is_finished())
    });
    let mut produced = started.join(producer_tasks, "a producer panicked")?;
    let mut consumed = started.join(consumer_tasks, "a consumer panicked")?;
    // Finishing a recorder hands its last interval to the log: before the log is closed.
    let recorders = finish_recorders(&mut produced, &mut consumed);
    let intervals = watch.finish();
    let still_ready = runtime.block_on(setup.close(&queues))?;
    progress.finish();
    Ok(summarise(
        args,
        targets,
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

/// Opens the `consumers` consumers' connections, then the producers', through the run's
/// client, each to its target.
async fn open_connections(
    targets: Targets<'_>,
    queues: &[String],
    plan: &Plan,
    consumers: u32,
) -> Result<(Consumers, Producers), String> {
    Ok(match plan.client {
        Client::Lapin => (
            Consumers::Lapin(open_consumers(targets, queues, plan, consumers).await?),
            Producers::Lapin(open_producers(targets, plan).await?),
        ),
        Client::Raw => (
            Consumers::Raw(raw::open_consumers(targets, queues, plan, consumers).await?),
            Producers::Raw(raw::open_producers(targets, plan).await?),
        ),
    })
}

/// The consumers' connections, opened by either client.
enum Consumers {
    Lapin(Vec<Subscriber>),
    Raw(Vec<raw::Conn>),
}

/// The producers' connections, opened by either client.
enum Producers {
    Lapin(Vec<Publisher>),
    Raw(Vec<raw::Conn>),
}

/// Starts the run's tasks on its runtime, and waits for them.
struct Started<'a> {
    runtime: &'a tokio::runtime::Runtime,
    plan: &'a Plan,
    clock: Clock,
    shared: Arc<Shared>,
}

impl Started<'_> {
    /// One task per consumer, its recorders wired to the interval log.
    fn consumers(&self, consumers: Consumers, watch: &Watch) -> Vec<JoinHandle<ConsumerResult>> {
        let (plan, clock) = (self.plan, self.clock);
        match consumers {
            Consumers::Lapin(all) => all
                .into_iter()
                .map(|c| {
                    let (result, shared) = (watch.consumer_result(), self.shared.clone());
                    let task = consume(c, result, plan.clone(), clock, shared);
                    self.runtime.spawn(task)
                })
                .collect(),
            Consumers::Raw(all) => all
                .into_iter()
                .map(|c| {
                    let (result, shared) = (watch.consumer_result(), self.shared.clone());
                    let task = raw::consume(c, result, plan.clone(), clock, shared);
                    self.runtime.spawn(task)
                })
                .collect(),
        }
    }

    /// One task per producer; producer j publishes to its own queue first, then round the
    /// others.
    fn producers(
        &self,
        producers: Producers,
        queues: &[String],
        watch: &Watch,
    ) -> Vec<JoinHandle<ProducerResult>> {
        let mine = |j: usize| -> Vec<String> {
            (0..queues.len())
                .map(|k| queues[(j + k) % queues.len()].clone())
                .collect()
        };
        let result = || ProducerResult {
            confirm: self.plan.confirms.then(|| watch.recorder(CONFIRM)),
            ..ProducerResult::default()
        };
        let (plan, clock) = (self.plan, self.clock);
        match producers {
            Producers::Lapin(all) => all
                .into_iter()
                .enumerate()
                .map(|(j, p)| {
                    let shared = self.shared.clone();
                    let task = produce(j as u64, p, mine(j), result(), plan.clone(), clock, shared);
                    self.runtime.spawn(task)
                })
                .collect(),
            Producers::Raw(all) => all
                .into_iter()
                .enumerate()
                .map(|(j, p)| {
                    let shared = self.shared.clone();
                    let task =
                        raw::produce(j as u64, p, mine(j), result(), plan.clone(), clock, shared);
                    self.runtime.spawn(task)
                })
                .collect(),
        }
    }

    /// Every task's result, in order.
    fn join<T>(&self, tasks: Vec<JoinHandle<T>>, panicked: &str) -> Result<Vec<T>, String> {
        tasks
            .into_iter()
            .map(|t| self.runtime.block_on(t).map_err(|_| panicked.to_string()))
            .collect()
    }
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
    let tls_targets = args
        .amqp
        .targets
        .iter()
        .filter(|t| t.starts_with("amqps://"));
    if args.amqp.tls_ca.is_none() && tls_targets.count() > 0 {
        return Err(
            "an amqps:// --target needs --tls-ca FILE: the CA its certificate chains to".into(),
        );
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
    if w.pipeline > 1 {
        return Err(
            "--pipeline is for --api async on the embedded broker; over AMQP publishes and \
             acks are written without waiting for the server already"
                .into(),
        );
    }
    validate_queue_args(&args.amqp.queue_args, w.storage.durable)
}

/// `--queue-arg`s that make no run: a key given twice; a RabbitMQ queue type that is
/// durable only (quorum, stream), on queues not declared `--durable`.
fn validate_queue_args(queue_args: &[QueueArg], durable: bool) -> Result<(), String> {
    if let Some(key) = queue_args::repeated_key(queue_args) {
        return Err(format!("--queue-arg {key}=… is given more than once"));
    }
    let durable_only = queue_args.iter().find(|a| {
        let durable_type =
            matches!(&a.value, QueueArgValue::Text(t) if t == "quorum" || t == "stream");
        a.key == "x-queue-type" && durable_type
    });
    match durable_only {
        Some(a) if !durable => Err(format!(
            "--queue-arg {a}: RabbitMQ declares such a queue durable only; add --durable"
        )),
        _ => Ok(()),
    }
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
        client: args.amqp.client.unwrap_or_default(),
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

pub(super) async fn connect(target: Target<'_>, role: &str) -> Result<Connection, String> {
    // `--tls-ca` for an amqps:// target; lapin's defaults otherwise.
    let config = OwnedTLSConfig {
        identity: None,
        cert_chain: target.tls.map(|tls| tls.ca_pem.clone()),
    };
    let connecting = async {
        let runtime = lapin::runtime::default_runtime()?;
        Connection::connect_with_config(
            target.uri,
            ConnectionProperties::default(),
            config,
            runtime,
        )
        .await
    };
    match tokio::time::timeout(CONNECT_LIMIT, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("{role}: connecting to {}: {e}", masked(target.uri))),
        Err(_) => Err(format!(
            "{role}: no connection to {} within {}",
            masked(target.uri),
            format_duration(CONNECT_LIMIT)
        )),
    }
}

pub(super) fn amqp_error(what: &str) -> impl Fn(lapin::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_queues_need_durable_and_keys_come_once() {
        let parse = |texts: &[&str]| -> Vec<QueueArg> {
            texts
                .iter()
                .map(|t| queue_args::parse_queue_arg(t).unwrap())
                .collect()
        };
        let quorum = parse(&["x-queue-type=quorum"]);
        let err = validate_queue_args(&quorum, false).unwrap_err();
        assert!(err.contains("add --durable"), "{err}");
        assert_eq!(validate_queue_args(&quorum, true), Ok(()));
        let classic = parse(&["x-queue-type=classic", "x-max-length=10"]);
        assert_eq!(validate_queue_args(&classic, false), Ok(()));
        let twice = parse(&["x-max-length=10", "x-max-length=20"]);
        let err = validate_queue_args(&twice, true).unwrap_err();
        assert!(
            err.contains("x-max-length=… is given more than once"),
            "{err}"
        );
        assert_eq!(validate_queue_args(&[], false), Ok(()));
    }

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
