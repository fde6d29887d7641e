//! Command-line flags, and the small parsers for durations ("500ms", "2s", "1m") and counts
//! ("200000", "200k", "1.5M").

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use leasemq::SyncPolicy;

use crate::amqp::queue_args::{parse_queue_arg, QueueArg};

/// Drives an in-process leasemq broker and measures it into HDR histograms.
#[derive(Debug, Parser)]
#[command(name = "leasemq-loadgen", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Run N CPU-bound threads (in a child process) for the whole run, as the busy host of
    /// a service that embeds the broker; reported in the summary and summary.json.
    #[arg(long, global = true, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub background_load: u32,
    /// The scheduler time slice each shard thread asks for (Linux 6.12 and later): a
    /// duration from 100us to 100ms, or `system` for the kernel's own. A short slice lets
    /// a woken shard preempt busy threads instead of waiting out their slices.
    #[arg(long, global = true, value_name = "DURATION|system", default_value = "100us",
          value_parser = parse_time_slice)]
    pub shard_time_slice: TimeSlice,
    /// The same for the producer and consumer threads (and tokio workers), which stand for
    /// the service's own threads: by default they keep the system's slice, as a service
    /// that did nothing about it would.
    #[arg(long, global = true, value_name = "DURATION|system", default_value = "system",
          value_parser = parse_time_slice)]
    pub caller_time_slice: TimeSlice,
    /// How long a thread waiting on the broker (a shard for requests, a caller for its
    /// answer or a delivery) yields its core before it parks: a duration up to 10ms, 0 for
    /// none (see `BrokerBuilder::yield_budget`).
    #[arg(long, global = true, value_name = "DURATION",
          default_value = "500us", value_parser = parse_yield_budget)]
    pub yield_budget: Duration,
    /// When a blocking caller handles a sleeping shard's requests on its own thread
    /// instead of waking it (see `BrokerBuilder::caller_turns`).
    #[arg(long, global = true, value_enum, default_value_t = CallerTurnsArg::WhenBusy)]
    pub caller_turns: CallerTurnsArg,
}

/// `--caller-turns`: the values of `leasemq::CallerTurns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CallerTurnsArg {
    Never,
    WhenBusy,
    Always,
}

impl CallerTurnsArg {
    pub fn to_broker(self) -> leasemq::CallerTurns {
        match self {
            CallerTurnsArg::Never => leasemq::CallerTurns::Never,
            CallerTurnsArg::WhenBusy => leasemq::CallerTurns::WhenBusy,
            CallerTurnsArg::Always => leasemq::CallerTurns::Always,
        }
    }
}

/// Parses a yield budget: a duration up to `leasemq::MAX_YIELD_BUDGET`, or 0.
fn parse_yield_budget(text: &str) -> Result<Duration, String> {
    let d = if text.trim() == "0" {
        Duration::ZERO
    } else {
        parse_duration(text)?
    };
    if d <= leasemq::MAX_YIELD_BUDGET {
        Ok(d)
    } else {
        Err(format!("{text:?}: a yield budget is at most 10ms"))
    }
}

/// A scheduler time slice from the command line: `None` keeps the system's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeSlice(pub Option<Duration>);

/// Parses a time slice: `system`, or a duration the kernel grants (100us to 100ms).
fn parse_time_slice(text: &str) -> Result<TimeSlice, String> {
    if text.trim() == "system" {
        return Ok(TimeSlice(None));
    }
    let d = parse_duration(text)?;
    if (leasemq::MIN_TIME_SLICE..=leasemq::MAX_TIME_SLICE).contains(&d) {
        Ok(TimeSlice(Some(d)))
    } else {
        Err(format!(
            "{text:?}: a time slice is from 100us to 100ms, or `system`"
        ))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Producers put, consumers receive and ack, as fast as they can (closed loop) or at a
    /// fixed rate (open loop); measures put→deliver, put→ack, the settle round trip and
    /// put→answered.
    Throughput(ThroughputArgs),
    /// Keeps N leases outstanding, leaves a fraction of deliveries to expire and measures how
    /// late their redeliveries arrive, and what touch and ack cost while the wheel is full.
    Redelivery(RedeliveryArgs),
    /// Capacity planning: for each shard count, raises the open-loop rate step by step until
    /// a latency (put→ack by default, see --slo-on) breaks an objective, and reports the
    /// highest rate that held.
    Sweep(SweepArgs),
    /// Puts N messages into a queue with no consumer, reports the memory each queued message
    /// takes, then drains the queue and checks every message was acked exactly once.
    Fill(FillArgs),
}

/// Which calls the workers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// `put` and `ack`, one message per round trip.
    PerMessage,
    /// `put_batch` and `Consumer::ack_up_to`, many messages per round trip.
    Batched,
    /// `put_async`, `Consumer::next` and `ack_async`, one message per call, from tokio tasks:
    /// many calls in flight per runtime thread (closed loop only).
    Async,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::PerMessage => "per-message",
            Api::Batched => "batched",
            Api::Async => "async",
        }
    }
}

/// Where the results go; shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Write summary.json, one .hgrm percentile distribution and one .hlog interval log per
    /// histogram, and the plots into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The length of each interval histogram in the .hlog files.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub hlog_interval: Duration,
    /// Print no summary table and show no progress bar (failures still go to stderr).
    #[arg(long)]
    pub quiet: bool,
}

/// The throughput workload: who puts, who consumes, and through which calls. Shared by
/// `throughput` and `sweep`.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Producer threads (tokio tasks with `--api async`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// Consumer threads (tokio tasks with `--api async`), each with one consumer; consumer i
    /// reads queue i mod Q.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub consumers: u32,
    /// Queues, spread evenly over the shards (at most one per consumer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub queues: u32,
    /// Body size in bytes (at least 16: a send timestamp and a sequence number).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub body_bytes: u32,
    /// Prefetch of every consumer (1 to 65 535).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub prefetch: u32,
    /// Messages per `put_batch` (batched API).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub put_batch: u32,
    /// Deliveries per `ack_up_to` (batched API); fewer when the consumer's channel runs dry.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub settle_batch: u32,
    /// per-message (`put`, `ack`), batched (`put_batch`, `ack_up_to`) or async (`put_async`,
    /// `ack_async` from tokio tasks).
    #[arg(long, value_enum, default_value_t = Api::Batched)]
    pub api: Api,
    /// `--api async`: the tokio runtime's worker threads, which run every producer and
    /// consumer task.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub runtime_threads: u32,
    /// `--api async`: calls each producer and consumer task keeps in flight, sent and not
    /// yet answered (its puts, its acks), as a client that does not await one before the
    /// next. 1: each call is awaited before the next.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub pipeline: u32,
    /// Open loop, batched API: the longest a due message waits for its batch to fill.
    #[arg(long, default_value = "100us", value_parser = parse_duration)]
    pub linger: Duration,
    /// Most messages put but not yet acked before producers wait (0: twice the consumers'
    /// total prefetch plus one put batch per producer, at least 65 536; open loop:
    /// 1 000 000).
    #[arg(long, default_value_t = 0, value_parser = parse_count)]
    pub max_in_flight: u64,
    #[command(flatten)]
    pub storage: StorageArgs,
}

/// Durable queues and the broker's data dir. Shared by `throughput` and `sweep`.
#[derive(Debug, Clone, Args)]
pub struct StorageArgs {
    /// Declare the queues durable: every put and settle is logged in the broker's data dir,
    /// and (with --sync always) answered only once its record is on disk.
    #[arg(long)]
    pub durable: bool,
    /// The broker's data dir: each run (each sweep step) logs into a fresh directory made
    /// inside PATH, removed when it ends; PATH itself is left in place. Without --durable the
    /// queues stay in memory, on a broker that has a data dir [default with --durable: a
    /// temporary directory, removed at the end of the run].
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    /// When the log reaches the disk: always (a put or settle is answered after the fsync
    /// that covers it; fsyncs are shared by what arrives while one runs) or interval:MS
    /// (answered at once, fsynced at least every MS milliseconds; a unit may follow, e.g.
    /// interval:500us). Needs --durable or --data-dir [default: always].
    #[arg(long, value_name = "always|interval:MS", value_parser = parse_sync)]
    pub sync: Option<SyncPolicy>,
}

impl StorageArgs {
    /// Whether the broker gets a data dir.
    pub fn has_data_dir(&self) -> bool {
        self.durable || self.data_dir.is_some()
    }

    /// The sync policy the broker is built with.
    pub fn sync_policy(&self) -> SyncPolicy {
        self.sync.unwrap_or(SyncPolicy::Always)
    }
}

/// The longest `--sync interval:` the broker takes (its limit on every duration).
const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Parses `--sync`: "always", or "interval:MS" with MS in milliseconds ("interval:10",
/// "interval:2.5") or a duration with its unit ("interval:500us", "interval:1s").
pub fn parse_sync(text: &str) -> Result<SyncPolicy, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("always") {
        return Ok(SyncPolicy::Always);
    }
    let Some(every) = text.strip_prefix("interval:") else {
        return Err(format!(
            "{text:?}: write always (answer after the fsync), or interval:MS (fsync at least \
             every MS milliseconds, e.g. interval:10)"
        ));
    };
    let every = every.trim();
    let bare_number = !every.is_empty() && every.chars().all(|c| c.is_ascii_digit() || c == '.');
    let interval = if bare_number {
        parse_duration(&format!("{every}ms"))
    } else {
        parse_duration(every)
    }
    .map_err(|e| format!("{text:?}: {e}"))?;
    if interval.is_zero() {
        return Err(format!("{text:?}: the interval must be more than zero"));
    }
    if interval > MAX_SYNC_INTERVAL {
        return Err(format!("{text:?}: the interval must be at most 7 days"));
    }
    Ok(SyncPolicy::Interval(interval))
}

/// Writes a sync policy the way `--sync` reads it back: "always", "interval:10ms".
pub fn sync_text(policy: SyncPolicy) -> String {
    match policy {
        SyncPolicy::Always => "always".to_string(),
        SyncPolicy::Interval(every) => format!("interval:{}", format_duration(every)),
    }
}

#[derive(Debug, Clone, Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Shard threads of the broker.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: u32,
    /// How long to measure, after the warm-up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long to run before measuring (not recorded).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Open loop: put N messages/s in total (suffixes k, M), latency measured from each
    /// message's intended send time. Without it: closed loop, as fast as possible.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub rate: Option<u64>,
    #[command(flatten)]
    pub amqp: AmqpArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `throughput` against an AMQP 0-9-1 server instead of the embedded broker.
#[derive(Debug, Clone, Args)]
pub struct AmqpArgs {
    /// Run the workload over AMQP 0-9-1 against this server (leasemqd, RabbitMQ): each
    /// producer and consumer is a client connection of its own. Closed loop only; --shards,
    /// --api, --put-batch and --settle-batch do not apply [default: the embedded broker].
    /// Repeat it for the nodes of a cluster: the connections are dealt out over the
    /// targets round robin (consumers first, then producers), and the queues are declared
    /// through the first.
    #[arg(long = "target", value_name = "amqp://USER:PASS@HOST:PORT/%2f")]
    pub targets: Vec<String>,
    /// --target: an entry for the arguments table of every `queue.declare`, e.g.
    /// x-queue-type=quorum; repeat it for several. A whole number goes as a signed 64-bit
    /// integer, true or false as a boolean, anything else as a string.
    #[arg(long = "queue-arg", value_name = "KEY=VALUE", value_parser = parse_queue_arg)]
    pub queue_args: Vec<QueueArg>,
    /// --target: publish with publisher confirms (`confirm.select`), at most
    /// --max-in-flight unconfirmed, and measure publish→confirm.
    #[arg(long)]
    pub confirms: bool,
    /// --target: how consumers ack: each (one basic.ack per delivery) or multiple:N (one
    /// basic.ack with `multiple` every N deliveries, or sooner when none is waiting)
    /// [default: each].
    #[arg(long, value_name = "each|multiple:N", value_parser = parse_ack)]
    pub ack: Option<AckMode>,
    /// --target: consume with `no_ack`: the server counts a message acked once sent.
    #[arg(long, conflicts_with = "ack")]
    pub no_ack: bool,
    /// --target: the AMQP client: lapin, or raw (the loadgen's own pipelined client: many
    /// publishes per write, and the acks of one read in one write) [default: lapin].
    #[arg(long, value_enum)]
    pub client: Option<Client>,
    /// --target amqps://…: the CA (PEM) the servers' certificates must chain to. TLS 1.3
    /// or 1.2; the target's host is the name the certificate must hold.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
}

/// The AMQP client of a `--target` run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// The `lapin` crate: one publish or ack per call, written by its IO thread.
    #[default]
    Lapin,
    /// Frames from `amq-protocol`'s codec, batched into one write per turn of the task.
    Raw,
}

impl Client {
    /// How `--client` reads it back.
    pub fn text(self) -> &'static str {
        match self {
            Client::Lapin => "lapin",
            Client::Raw => "raw",
        }
    }
}

/// How an AMQP consumer acknowledges its deliveries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    /// One `basic.ack` per delivery.
    Each,
    /// One `basic.ack multiple` per N deliveries (fewer when no delivery is waiting).
    Multiple(u32),
    /// `basic.consume no_ack`: nothing to ack.
    NoAck,
}

impl AckMode {
    /// How `--ack` reads it back: "each", "multiple:64", "no-ack".
    pub fn text(self) -> String {
        match self {
            AckMode::Each => "each".into(),
            AckMode::Multiple(n) => format!("multiple:{n}"),
            AckMode::NoAck => "no-ack".into(),
        }
    }
}

/// Parses `--ack`: "each" or "multiple:N" (N from 1 to 65 536).
pub fn parse_ack(text: &str) -> Result<AckMode, String> {
    let text = text.trim();
    if text == "each" {
        return Ok(AckMode::Each);
    }
    let n = text
        .strip_prefix("multiple:")
        .ok_or_else(|| format!("{text:?}: write each, or multiple:N (e.g. multiple:64)"))?;
    match n.trim().parse::<u32>() {
        Ok(n @ 1..=65_536) => Ok(AckMode::Multiple(n)),
        _ => Err(format!(
            "{text:?}: N must be a whole number from 1 to 65536"
        )),
    }
}

impl AmqpArgs {
    /// How the consumers ack.
    pub fn ack_mode(&self) -> AckMode {
        match (self.no_ack, self.ack) {
            (true, _) => AckMode::NoAck,
            (false, mode) => mode.unwrap_or(AckMode::Each),
        }
    }

    /// A flag that only --target uses, given without it.
    pub fn misplaced_flag(&self) -> Option<&'static str> {
        if !self.targets.is_empty() {
            return None;
        }
        [
            (self.confirms, "--confirms"),
            (self.ack.is_some(), "--ack"),
            (self.no_ack, "--no-ack"),
            (self.client.is_some(), "--client"),
            (!self.queue_args.is_empty(), "--queue-arg"),
            (self.tls_ca.is_some(), "--tls-ca"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Shard counts to sweep, each from --start-rate up (a comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "1,2",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: Vec<u32>,
    /// A latency objective on the histogram --slo-on names, measured from each message's
    /// intended send time: PERCENTILE=LIMIT, e.g. p99=5ms, p99.9=20ms, max=50ms; repeat the
    /// flag for several. A step holds when every one does.
    #[arg(long = "slo", value_name = "pQ=LIMIT", default_value = "p99=5ms", value_parser = parse_slo)]
    pub slos: Vec<Slo>,
    /// Which latency the objectives apply to: put_to_ack (the whole trip), put_to_confirm
    /// (the put's answer: a durable put's confirm under --sync always) or put_to_deliver.
    #[arg(long, value_enum, default_value = "put_to_ack")]
    pub slo_on: SloOn,
    /// The first offered rate, in messages/s (suffixes k, M).
    #[arg(long, default_value = "50k", value_parser = parse_count)]
    pub start_rate: u64,
    /// Each step offers this many times the rate of the one before, until one breaks.
    #[arg(long, default_value_t = 1.5, value_parser = parse_step_factor)]
    pub step_factor: f64,
    /// Steps that bisect between the last rate that held and the first that broke.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub refine: u32,
    /// The most rising steps per shard count (before refining).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_steps: u32,
    /// Stop rising at this rate, even if it holds (suffixes k, M).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub max_rate: Option<u64>,
    /// A step also breaks when the acks completed in its window fall short of the offered
    /// rate by more than this fraction: the broker is not keeping up.
    #[arg(long, default_value_t = 0.05, value_parser = parse_fraction)]
    pub max_shortfall: f64,
    /// How long each step measures, after its warm-up.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub step_duration: Duration,
    /// How long each step runs before measuring (not recorded).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub step_warmup: Duration,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The histogram a sweep's objectives apply to (named as in `summary.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SloOn {
    #[value(name = "put_to_ack")]
    Ack,
    #[value(name = "put_to_confirm")]
    Confirm,
    #[value(name = "put_to_deliver")]
    Deliver,
}

impl SloOn {
    /// The histogram's name.
    pub fn histogram(self) -> &'static str {
        match self {
            SloOn::Ack => "put_to_ack",
            SloOn::Confirm => "put_to_confirm",
            SloOn::Deliver => "put_to_deliver",
        }
    }
}

/// A latency objective: the value at `quantile` must not exceed `limit`.
#[derive(Clone, Debug, PartialEq)]
pub struct Slo {
    /// As written: "p99", "p99.9", "max".
    pub label: String,
    /// In (0, 1]; `max` is 1.
    pub quantile: f64,
    pub limit: Duration,
}

impl std::fmt::Display for Slo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ≤ {}", self.label, format_duration(self.limit))
    }
}

/// Parses "p99=5ms", "p99.9=20ms", "p50=1ms", "max=50ms".
pub fn parse_slo(text: &str) -> Result<Slo, String> {
    let (name, limit) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: write PERCENTILE=LIMIT, e.g. p99=5ms"))?;
    let label = name.trim().to_string();
    let quantile = if label == "max" {
        1.0
    } else {
        let percent: f64 = label
            .strip_prefix('p')
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| {
                format!("{label:?} is not a percentile: write p50, p99, p99.9 or max")
            })?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(format!("{label:?}: the percentile must be in (0, 100]"));
        }
        percent / 100.0
    };
    let limit = parse_duration(limit)?;
    if limit.is_zero() {
        return Err(format!("{text:?}: the limit must be more than zero"));
    }
    Ok(Slo {
        label,
        quantile,
        limit,
    })
}

/// Parses an interval length: a duration of at least a millisecond (the interval log's
/// timestamps have millisecond resolution).
fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_millis(1) {
        return Err(format!("{text:?}: intervals are at least 1ms long"));
    }
    Ok(d)
}

/// Parses the sweep's step factor: a number above 1.
fn parse_step_factor(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if value > 1.0 && value <= 100.0 {
        Ok(value)
    } else {
        Err(format!(
            "{text:?}: the step factor must be above 1 (and at most 100)"
        ))
    }
}

#[derive(Debug, Clone, Args)]
pub struct FillArgs {
    /// Messages to queue (10M take about 1.2 GiB).
    #[arg(long, default_value = "1M", value_parser = parse_count)]
    pub messages: u64,
    /// Body size in bytes (at least 16: a send timestamp and a sequence number).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub body_bytes: u32,
    /// Shard threads of the broker (the queue lives on one of them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: u32,
    /// Messages per `put_batch`.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub put_batch: u32,
    /// Consumer threads that drain the queue.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub consumers: u32,
    /// Prefetch of each draining consumer.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub prefetch: u32,
    /// Deliveries per `ack_up_to` while draining; fewer when the channel runs dry.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub settle_batch: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RedeliveryArgs {
    /// Leases kept outstanding (tested up to 10 000 000; needs about 100 bytes each, and
    /// leases / (ack_timeout / 2) touches or acks per second to keep them alive).
    #[arg(long, default_value = "100000", value_parser = parse_count)]
    pub leases: u64,
    /// The queue's lease length [default: 200ms, or 2 µs per lease when that is longer, so
    /// that renewing every lease at half its lease stays near a million calls a second].
    #[arg(long, value_parser = parse_duration)]
    pub ack_timeout: Option<Duration>,
    /// Fraction of first deliveries never acked nor touched: left to expire and measured.
    #[arg(long, default_value_t = 0.01, value_parser = parse_fraction)]
    pub never_ack_fraction: f64,
    /// Fraction of the other leases acked (and replaced by a fresh message) when they reach
    /// half their lease; the rest are touched.
    #[arg(long, default_value_t = 0.25, value_parser = parse_fraction)]
    pub ack_fraction: f64,
    /// Shard threads of the broker (the queue lives on one of them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: u32,
    /// How long to measure, counted from the moment all leases are out [default:
    /// ack_timeout + 2s, at least 3s; redeliveries are measured when their deadline falls
    /// in it].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Messages per `put_batch`.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub put_batch: u32,
    /// Settles per `settle_batch` (touches and acks go in separate batches).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub settle_batch: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Parses "500ms", "2s", "1.5s", "1m", "100us", "250ns", "1h": a non-negative number and a
/// unit (ns, us or µs, ms, s, m, h). A bare number is refused, so "5" is never ambiguous.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 500ms, 2s or 1m"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("{text:?} does not start with a number"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let nanos_per_unit = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ns, us, ms, s, m or h"
            ))
        }
    };
    let nanos = (value * nanos_per_unit).round();
    if !nanos.is_finite() || nanos > 1e18 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Parses a count: "250000", "250k", "2M", "1.5M", "10_000_000".
pub fn parse_count(text: &str) -> Result<u64, String> {
    let cleaned: String = text.trim().chars().filter(|&c| c != '_').collect();
    let (number, scale) = match cleaned.chars().last() {
        Some('k' | 'K') => (&cleaned[..cleaned.len() - 1], 1e3),
        Some('M' | 'm') => (&cleaned[..cleaned.len() - 1], 1e6),
        Some('G' | 'g') => (&cleaned[..cleaned.len() - 1], 1e9),
        _ => (cleaned.as_str(), 1.0),
    };
    if scale == 1.0 {
        return number
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number (suffixes k, M, G allowed)"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number (suffixes k, M, G allowed)"))?;
    let scaled = (value * scale).round();
    if !(0.0..1.8e19).contains(&scaled) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(scaled as u64)
}

/// Parses a fraction in [0, 1].
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text:?} is not between 0 and 1"))
    }
}

/// Formats a duration the way the parser reads it back.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    let units = [
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (size, unit) in units {
        if nanos / size * size == nanos {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_every_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("100µs"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("250ns"), Ok(Duration::from_nanos(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 3s "), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0.2ms"), Ok(Duration::from_micros(200)));
    }

    #[test]
    fn durations_refused() {
        for bad in [
            "", "5", "s", "ms", "-1s", "2 weeks", "1.2.3s", "1e3s", "10d", "1e30h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
    }

    #[test]
    fn durations_round_trip_through_format() {
        for text in ["500ms", "2s", "1m", "100us", "250ns", "0s", "90s", "1500ms"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn counts_and_fractions() {
        assert_eq!(parse_count("250000"), Ok(250_000));
        assert_eq!(parse_count("250k"), Ok(250_000));
        assert_eq!(parse_count("2M"), Ok(2_000_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("10_000_000"), Ok(10_000_000));
        assert!(parse_count("ten").is_err());
        assert!(parse_count("-3").is_err());
        assert!(parse_count("1.5").is_err());
        assert_eq!(parse_fraction("0.01"), Ok(0.01));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "leasemq-loadgen",
            "throughput",
            "--shards",
            "2",
            "--api",
            "per-message",
            "--duration",
            "500ms",
            "--rate",
            "100k",
        ])
        .unwrap();
        let Command::Throughput(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.workload.api, Api::PerMessage);
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.rate, Some(100_000));
        assert_eq!(args.warmup, Duration::from_secs(1));
        assert!(
            Cli::try_parse_from(["leasemq-loadgen", "throughput", "--body-bytes", "8"]).is_err()
        );
        let cli = Cli::try_parse_from(["leasemq-loadgen", "redelivery", "--leases", "1M"]).unwrap();
        let Command::Redelivery(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.leases, 1_000_000);
        assert_eq!(args.ack_timeout, None);
    }

    /// The AMQP flags of a `throughput` command line with `extra`.
    fn amqp_args(extra: &[&str]) -> Result<AmqpArgs, clap::Error> {
        let mut argv = vec!["leasemq-loadgen", "throughput"];
        argv.extend(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Throughput(args) => args.amqp,
            _ => panic!("wrong subcommand"),
        })
    }

    #[test]
    fn amqp_flags_parse() {
        let parse = amqp_args;
        let embedded = parse(&[]).unwrap();
        assert!(embedded.targets.is_empty() && embedded.queue_args.is_empty());
        assert_eq!(embedded.ack_mode(), AckMode::Each);
        assert_eq!(embedded.misplaced_flag(), None);
        let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let a = parse(&["--target", uri, "--confirms", "--ack", "multiple:64"]).unwrap();
        assert_eq!(a.targets, [uri]);
        assert!(a.confirms);
        assert_eq!(a.ack_mode(), AckMode::Multiple(64));
        let a = parse(&["--target", uri, "--no-ack"]).unwrap();
        assert_eq!(a.ack_mode(), AckMode::NoAck);
        assert!(parse(&["--target", uri, "--no-ack", "--ack", "each"]).is_err());
        for bad in [
            "multiple",
            "multiple:0",
            "multiple:x",
            "some",
            "multiple:70000",
        ] {
            assert!(parse(&["--target", uri, "--ack", bad]).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse(&["--confirms"]).unwrap().misplaced_flag(),
            Some("--confirms")
        );
        assert_eq!(
            parse(&["--no-ack"]).unwrap().misplaced_flag(),
            Some("--no-ack")
        );
        assert_eq!(
            parse(&["--client", "raw"]).unwrap().misplaced_flag(),
            Some("--client")
        );
        assert_eq!(embedded.client, None);
        let a = parse(&["--target", uri, "--client", "raw"]).unwrap();
        assert_eq!((a.client, a.misplaced_flag()), (Some(Client::Raw), None));
        assert!(parse(&["--target", uri, "--client", "fast"]).is_err());
        for mode in [AckMode::Each, AckMode::Multiple(8)] {
            assert_eq!(parse_ack(&mode.text()), Ok(mode));
        }
    }

    #[test]
    fn targets_and_queue_args_repeat() {
        let parse = amqp_args;
        let uris = [
            "amqp://a:5672/%2f",
            "amqp://b:5673/%2f",
            "amqp://c:5674/%2f",
        ];
        let a = parse(&[
            "--target",
            uris[0],
            "--target",
            uris[1],
            "--target",
            uris[2],
            "--queue-arg",
            "x-queue-type=quorum",
            "--queue-arg",
            "x-max-length=1000",
        ])
        .unwrap();
        assert_eq!(a.targets, uris);
        let args: Vec<String> = a.queue_args.iter().map(|q| q.to_string()).collect();
        assert_eq!(args, ["x-queue-type=quorum", "x-max-length=1000"]);
        assert_eq!(a.misplaced_flag(), None);
        for bad in ["x-queue-type", "=quorum"] {
            let err = parse(&["--target", uris[0], "--queue-arg", bad]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        assert_eq!(
            parse(&["--queue-arg", "x-queue-type=quorum"])
                .unwrap()
                .misplaced_flag(),
            Some("--queue-arg")
        );
    }

    #[test]
    fn sync_policies_parse() {
        let ms = Duration::from_millis;
        assert_eq!(parse_sync("always"), Ok(SyncPolicy::Always));
        assert_eq!(parse_sync(" Always "), Ok(SyncPolicy::Always));
        assert_eq!(parse_sync("interval:10"), Ok(SyncPolicy::Interval(ms(10))));
        assert_eq!(
            parse_sync("interval:2.5"),
            Ok(SyncPolicy::Interval(Duration::from_micros(2500)))
        );
        assert_eq!(
            parse_sync("interval:500us"),
            Ok(SyncPolicy::Interval(Duration::from_micros(500)))
        );
        assert_eq!(
            parse_sync("interval:1s"),
            Ok(SyncPolicy::Interval(ms(1000)))
        );
        for bad in [
            "",
            "never",
            "interval",
            "interval:",
            "interval:0",
            "interval:0ms",
            "interval:-5",
            "interval:ten",
            "interval:5 weeks",
            "interval:8d",
            "interval:200h",
            "every:10",
        ] {
            assert!(parse_sync(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_sync("never").unwrap_err().contains("interval:MS"));
        assert!(parse_sync("interval:0")
            .unwrap_err()
            .contains("more than zero"));
        for text in ["always", "interval:10ms", "interval:250us", "interval:2s"] {
            assert_eq!(sync_text(parse_sync(text).unwrap()), text);
        }
    }

    #[test]
    fn storage_flags_parse() {
        let cli = Cli::try_parse_from(["leasemq-loadgen", "throughput"]).unwrap();
        let Command::Throughput(args) = cli.command else {
            panic!("wrong subcommand")
        };
        let storage = &args.workload.storage;
        assert!(!storage.durable && !storage.has_data_dir());
        assert_eq!(
            (storage.sync, storage.sync_policy()),
            (None, SyncPolicy::Always)
        );
        let cli = Cli::try_parse_from([
            "leasemq-loadgen",
            "sweep",
            "--durable",
            "--data-dir",
            "/var/tmp/lg",
            "--sync",
            "interval:5",
        ])
        .unwrap();
        let Command::Sweep(args) = cli.command else {
            panic!("wrong subcommand")
        };
        let storage = &args.workload.storage;
        assert!(storage.durable && storage.has_data_dir());
        assert_eq!(
            storage.data_dir.as_deref(),
            Some(std::path::Path::new("/var/tmp/lg"))
        );
        assert_eq!(
            storage.sync_policy(),
            SyncPolicy::Interval(Duration::from_millis(5))
        );
        let err = Cli::try_parse_from(["leasemq-loadgen", "throughput", "--sync", "sometimes"])
            .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(err.to_string().contains("interval:MS"), "{err}");
    }

    #[test]
    fn slos_parse() {
        let slo = parse_slo("p99=5ms").unwrap();
        assert_eq!(slo.label, "p99");
        assert!((slo.quantile - 0.99).abs() < 1e-12);
        assert_eq!(slo.limit, Duration::from_millis(5));
        assert!((parse_slo("p99.9=20ms").unwrap().quantile - 0.999).abs() < 1e-12);
        assert_eq!(parse_slo("max=1s").unwrap().quantile, 1.0);
        assert_eq!(parse_slo("p99=5ms").unwrap().to_string(), "p99 ≤ 5ms");
        for bad in [
            "p99", "99=5ms", "p0=1ms", "p101=1ms", "p99=5", "p99=0ms", "q99=1ms",
        ] {
            assert!(parse_slo(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn sweep_flags_parse() {
        let cli = Cli::try_parse_from([
            "leasemq-loadgen",
            "sweep",
            "--shards",
            "1,2,4",
            "--slo",
            "p99=5ms",
            "--slo",
            "p99.9=20ms",
            "--start-rate",
            "20k",
            "--api",
            "per-message",
        ])
        .unwrap();
        let Command::Sweep(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.shards, [1, 2, 4]);
        assert_eq!(args.slos.len(), 2);
        assert_eq!(args.start_rate, 20_000);
        assert_eq!(args.step_factor, 1.5);
        assert_eq!(args.step_duration, Duration::from_secs(2));
        assert_eq!(args.workload.api, Api::PerMessage);
        let cli = Cli::try_parse_from(["leasemq-loadgen", "sweep"]).unwrap();
        let Command::Sweep(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.shards, [1, 2]);
        assert_eq!(args.slos, [parse_slo("p99=5ms").unwrap()]);
        for bad in [
            ["--step-factor", "1"],
            ["--shards", "0"],
            ["--slo", "p99"],
            ["--hlog-interval", "0s"],
        ] {
            let mut argv = vec!["leasemq-loadgen", "sweep"];
            argv.extend(bad);
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} was accepted");
        }
    }
}
