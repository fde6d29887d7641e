//! `fill`: what a deep queue costs. Puts N messages into one queue that has no consumer,
//! reads how much the process's resident memory grew per queued message, then drains the
//! queue with C consumers (acking with `ack_up_to`) and checks that every message came out
//! and was acked exactly once.
//!
//! The memory figure is the growth of `VmRSS` between the moment before the first put and
//! the moment the last put returned, over N: the broker's message slab, its ready list,
//! each body (one allocation per message, as a producer sending distinct buffers would
//! make) and whatever the allocator keeps around them. Nothing else of size grows in the
//! process meanwhile: the producer keeps one batch at a time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use leasemq::{Broker, Consumer, ConsumerConfig, Message, Queue, QueueConfig, QueueStats};
use serde_json::json;

use crate::cli::{format_duration, FillArgs};
use crate::common::{
    broker_error, nanos, new_broker, queue_names, read_header, Clock, Ledger, HEADER_BYTES,
};
use crate::hist::Recorder;
use crate::intervals::{IntervalClock, IntervalLog, Piece, TimedRecorder};
use crate::progress::Progress;
use crate::report::{
    cpu_now, load_average, rss_bytes, thousands, Accounting, Detail, ProcessStats, Rate, Seen,
    Summary,
};
use crate::Run;

/// The longest the drain may take before the run gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// A rough fill and drain speed, for the progress bar's plan only.
const PLANNING_RATE: f64 = 2e6;

/// The histograms, in the order of the interval log's slots.
const HISTOGRAMS: [&str; 2] = ["put_batch_rtt", "settle_rtt"];

/// What one draining consumer saw, or all of them together.
#[derive(Default)]
struct Drained {
    ledger: Ledger,
    /// Acks as `ack_up_to` reported them.
    acked: u64,
    settle: Recorder,
    problems: Vec<String>,
}

impl Drained {
    /// Everything the consumers saw, added up.
    fn merge(all: &[Drained]) -> Drained {
        let mut total = Drained::default();
        for d in all {
            total.ledger.merge(&d.ledger);
            total.settle.merge(&d.settle);
            total.acked += d.acked;
            total.problems.extend(d.problems.iter().cloned());
        }
        total
    }
}

/// Where a thread sends its finished intervals (the run's clock, the channel), when `--out`
/// asked for an interval log.
type LogTo = Option<(IntervalClock, Sender<Piece>)>;

fn timed(log: &LogTo, slot: usize) -> TimedRecorder {
    TimedRecorder::new(log.as_ref().map(|(clock, tx)| (*clock, slot, tx.clone())))
}

/// What the fill and the drain share.
struct Context<'a> {
    args: &'a FillArgs,
    queue: Queue,
    clock: Clock,
    log_to: LogTo,
    progress: Progress,
    /// How long the fill and the drain are expected to take, for the progress bar.
    planned: Duration,
}

/// What the fill left behind.
struct Filled {
    put: u64,
    /// When the first put started, on the run's clock.
    start_ns: u64,
    /// How long the puts took.
    fill_ns: u64,
    rss_before: u64,
    rss_filled: u64,
    /// The process's figures over the fill.
    process: ProcessStats,
    /// Messages ready in the queue once the last put returned.
    ready: u64,
}

impl Filled {
    /// The growth of the resident set per queued message.
    fn bytes_per_message(&self) -> f64 {
        self.rss_filled.saturating_sub(self.rss_before) as f64 / self.put as f64
    }
}

pub fn run(args: &FillArgs) -> Result<Run, String> {
    if args.messages == 0 {
        return Err("--messages must be at least 1".into());
    }
    let (broker, queue) = open(args)?;
    let clock = Clock::start();
    // The wall-clock time of the run clock's 0, for the interval log's timestamps.
    let epoch = SystemTime::now() - Duration::from_nanos(clock.now_ns());
    let (tx, rx) = mpsc::channel();
    let log_to: LogTo = args.output.out.as_ref().map(|_| {
        let iclock = IntervalClock::new(clock.now_ns(), args.output.hlog_interval);
        (iclock, tx)
    });
    let planned = Duration::from_secs_f64(2.0 * args.messages as f64 / PLANNING_RATE);
    let cx = Context {
        args,
        queue,
        clock,
        log_to,
        progress: Progress::new(planned, args.output.quiet),
        planned,
    };

    let (filled, put_rtt) = fill(&cx)?;
    let drain_start = clock.now_ns();
    let drained = drain(&cx, &filled, drain_start);
    let end_ns = clock.now_ns();
    let drain_ns = end_ns - drain_start;
    cx.progress.finish();
    let put_rtt = put_rtt.finish();
    let intervals = cx.log_to.map(|(iclock, _)| {
        let window = Duration::from_nanos(end_ns - filled.start_ns);
        let mut log = IntervalLog::new(&HISTOGRAMS, epoch, iclock, window);
        for piece in rx.try_iter() {
            log.absorb(piece);
        }
        log.close(end_ns);
        log
    });
    let stats = cx.queue.stats();
    crate::report::note_turns(&broker);
    broker.shutdown();

    let drained = Drained::merge(&drained);
    let accounting = check(&filled, &drained, drain_ns, &stats);
    let summary = summarise(args, filled, &put_rtt, &drained, drain_ns, accounting);
    Ok(Run {
        summary,
        recorders: vec![
            (HISTOGRAMS[0].into(), put_rtt),
            (HISTOGRAMS[1].into(), drained.settle),
        ],
        intervals,
    })
}

/// Setup: the broker and the one queue, without a consumer.
fn open(args: &FillArgs) -> Result<(Broker, Queue), String> {
    let broker = new_broker(args.shards)?;
    let name = &queue_names("fill", 1, args.shards as usize)[0];
    let queue = broker
        .declare_queue(name, QueueConfig::default())
        .map_err(|e| broker_error("declaring the queue", e))?;
    Ok((broker, queue))
}

/// Fill: puts every message, a batch at a time, reading the resident set and the CPU time
/// just before the first put and just after the last; and the put batches' round trips.
fn fill(cx: &Context) -> Result<(Filled, TimedRecorder), String> {
    let (args, clock) = (cx.args, cx.clock);
    let rss_before = rss_bytes();
    let cpu_before = cpu_now();
    let mut put_rtt = timed(&cx.log_to, 0);
    let mut put = 0u64;
    let start_ns = clock.now_ns();
    while put < args.messages {
        let n = (args.messages - put).min(u64::from(args.put_batch));
        let sent = clock.now_ns();
        let batch: Vec<Message> = (put..put + n)
            .map(|seq| Message::new(body(args.body_bytes as usize, sent, seq)))
            .collect();
        let t0 = clock.now_ns();
        cx.queue
            .put_batch(batch)
            .map_err(|e| broker_error("put_batch failed", e))?;
        let t1 = clock.now_ns();
        put_rtt.record(t1, t1 - t0);
        put += n;
        let elapsed = Duration::from_nanos(clock.now_ns() - start_ns);
        cx.progress.update("filling", elapsed, cx.planned, || {
            format!(
                ", {} of {} queued",
                thousands(put),
                thousands(args.messages)
            )
        });
    }
    let fill_ns = clock.now_ns() - start_ns;
    let rss_filled = rss_bytes();
    let process = ProcessStats::over_window(cpu_before, cpu_now(), fill_ns as f64 / 1e9, put);
    let filled = Filled {
        put,
        start_ns,
        fill_ns,
        rss_before,
        rss_filled,
        process,
        ready: cx.queue.stats().ready as u64,
    };
    Ok((filled, put_rtt))
}

/// Drain: `--consumers` threads receive and ack until everything put is acked, the drain,
/// begun at `drain_start` on the run's clock, has taken [`DRAIN_LIMIT`], or every one of
/// them has stopped; what each saw.
fn drain(cx: &Context, filled: &Filled, drain_start: u64) -> Vec<Drained> {
    let (args, clock, put) = (cx.args, cx.clock, filled.put);
    let acked_total = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let workers: Vec<_> = (0..args.consumers)
            .map(|i| {
                let consumer = cx.queue.consume(
                    &format!("drain-{i}"),
                    ConsumerConfig {
                        prefetch: args.prefetch,
                    },
                );
                let (acked_total, stop) = (&acked_total, &stop);
                let settle = timed(&cx.log_to, 1);
                s.spawn(move || match consumer {
                    Ok(c) => drain_one(&c, args, put, acked_total, stop, clock, settle),
                    Err(e) => Drained {
                        problems: vec![broker_error("registering a consumer", e)],
                        ..Drained::default()
                    },
                })
            })
            .collect();
        let deadline = drain_start + nanos(DRAIN_LIMIT);
        while acked_total.load(Relaxed) < put && clock.now_ns() < deadline {
            if workers.iter().all(|w| w.is_finished()) {
                break;
            }
            let left = put - acked_total.load(Relaxed).min(put);
            let elapsed = Duration::from_nanos(clock.now_ns() - filled.start_ns);
            cx.progress.update("draining", elapsed, cx.planned, || {
                format!(", {} to ack", thousands(left))
            });
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("a drain thread panicked"))
            .collect()
    })
}

/// The end-of-run check, and the problems only `fill` can have: a queue that did not hold
/// every message after the fill, a drain that ran out of time.
fn check(filled: &Filled, drained: &Drained, drain_ns: u64, stats: &QueueStats) -> Accounting {
    let put = filled.put;
    let mut problems = Vec::new();
    if filled.ready != put {
        problems.push(format!(
            "{} message(s) put but {} ready after the fill",
            put, filled.ready
        ));
    }
    problems.extend(drained.problems.iter().cloned());
    if drain_ns >= nanos(DRAIN_LIMIT) {
        let (missing, _) = drained.ledger.check(0, put);
        if missing > 0 {
            problems.push(format!(
                "{} message(s) not drained within {}",
                thousands(missing),
                format_duration(DRAIN_LIMIT)
            ));
        }
    }
    let seen = Seen {
        put: &[put],
        ledger: &drained.ledger,
        acked: drained.acked,
        redelivered: 0,
        problems,
    };
    Accounting::check(seen, stats)
}

/// Report: the summary of a finished run.
fn summarise(
    args: &FillArgs,
    filled: Filled,
    put_rtt: &Recorder,
    drained: &Drained,
    drain_ns: u64,
    accounting: Accounting,
) -> Summary {
    let put = filled.put;
    let fill_s = filled.fill_ns as f64 / 1e9;
    let drain_s = drain_ns as f64 / 1e9;
    let bytes_per_message = filled.bytes_per_message();
    let process = ProcessStats {
        bytes_per_queued_message: Some(bytes_per_message),
        ..filled.process
    };
    Summary {
        tool: "leasemq-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        command: "fill",
        title: format!(
            "{} messages of {} bytes into 1 queue on {} shard(s) (put batch {}), then drained \
             by {} consumer(s) (prefetch {}, settle batch {})",
            thousands(put),
            args.body_bytes,
            args.shards,
            args.put_batch,
            args.consumers,
            args.prefetch,
            args.settle_batch
        ),
        config: json!({
            "messages": args.messages, "body_bytes": args.body_bytes, "shards": args.shards,
            "put_batch": args.put_batch, "consumers": args.consumers, "prefetch": args.prefetch,
            "settle_batch": args.settle_batch,
        }),
        measured_seconds: fill_s,
        rates: vec![
            Rate::new("put (filling)", put, fill_s),
            Rate::new("acked (draining)", drained.acked, drain_s),
        ],
        histograms: vec![
            put_rtt.summary("put_batch_rtt", "put batch round trip"),
            drained.settle.summary("settle_rtt", "ack_up_to round trip"),
        ],
        details: vec![
            Detail::new("queued at the end of the fill", filled.ready),
            Detail::new("RSS before the fill (MiB)", mib(filled.rss_before)),
            Detail::new("RSS with the queue full (MiB)", mib(filled.rss_filled)),
            Detail::new("bytes per queued message", bytes_per_message.round()),
            Detail::new("fill time (s)", (fill_s * 1e3).round() / 1e3),
            Detail::new("drain time (s)", (drain_s * 1e3).round() / 1e3),
        ],
        accounting,
        process,
        load_average: load_average(),
        host: crate::report::host_seen(),
        caller_turn_share: crate::report::caller_turn_share(),
        hgrm_unit: crate::hist::HGRM_UNIT,
        plots: Vec::new(),
        notes: vec![
            "process figures (CPU, per message) cover the fill; peak RSS is the whole run's".into(),
        ],
    }
}

/// A body of `size` bytes with the header, in its own allocation.
fn body(size: usize, sent_ns: u64, seq: u64) -> Bytes {
    let mut b = vec![0u8; size.max(HEADER_BYTES)];
    b[0..8].copy_from_slice(&sent_ns.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(b)
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

/// One consumer: receives, and acks with `ack_up_to` every `settle_batch` deliveries or
/// when its channel runs dry, until everything put is acked or it is told to stop.
fn drain_one(
    consumer: &Consumer,
    args: &FillArgs,
    put: u64,
    acked_total: &AtomicU64,
    stop: &AtomicBool,
    clock: Clock,
    mut settle: TimedRecorder,
) -> Drained {
    let mut d = Drained::default();
    let mut pending: Vec<u64> = Vec::with_capacity(args.settle_batch as usize);
    let mut last = None;
    loop {
        let delivery = match consumer.try_recv() {
            Ok(Some(delivery)) => Some(delivery),
            Ok(None) if last.is_none() => {
                if stop.load(Relaxed) || acked_total.load(Relaxed) >= put {
                    break;
                }
                match consumer.recv_timeout(Duration::from_millis(1)) {
                    Ok(delivery) => delivery,
                    Err(e) => {
                        d.problems.push(broker_error("receiving", e));
                        break;
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                d.problems.push(broker_error("receiving", e));
                break;
            }
        };
        if let Some(delivery) = &delivery {
            match read_header(&delivery.envelope().body) {
                Some((_, seq)) => pending.push(seq),
                None => d
                    .problems
                    .push("a delivery without the 16-byte header".into()),
            }
            last = Some(delivery.tag());
        }
        let dry = delivery.is_none();
        if let Some(tag) = last.filter(|_| dry || pending.len() >= args.settle_batch as usize) {
            let t0 = clock.now_ns();
            let acked = consumer.ack_up_to(tag) as u64;
            let t1 = clock.now_ns();
            settle.record(t1, t1 - t0);
            if acked != pending.len() as u64 {
                d.problems.push(format!(
                    "ack_up_to acked {acked} of {} deliveries (leases ran out?)",
                    pending.len()
                ));
            }
            for &seq in &pending {
                d.ledger.mark(seq);
            }
            d.acked += acked;
            acked_total.fetch_add(acked, Relaxed);
            pending.clear();
            last = None;
        }
    }
    d.settle = settle.finish();
    d
}
