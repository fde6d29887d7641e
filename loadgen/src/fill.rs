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
use leasemq::{Consumer, ConsumerConfig, Message, QueueConfig};
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

/// What one draining consumer saw.
#[derive(Default)]
struct Drained {
    ledger: Ledger,
    acked: u64,
    settle: Recorder,
    problems: Vec<String>,
}

/// Where a thread sends its finished intervals (the run's clock, the channel), when `--out`
/// asked for an interval log.
type LogTo = Option<(IntervalClock, Sender<Piece>)>;

fn timed(log: &LogTo, slot: usize) -> TimedRecorder {
    TimedRecorder::new(log.as_ref().map(|(clock, tx)| (*clock, slot, tx.clone())))
}

pub fn run(args: &FillArgs) -> Result<Run, String> {
    if args.messages == 0 {
        return Err("--messages must be at least 1".into());
    }
    let broker = new_broker(args.shards)?;
    let name = &queue_names("fill", 1, args.shards as usize)[0];
    let queue = broker
        .declare_queue(name, QueueConfig::default())
        .map_err(|e| broker_error("declaring the queue", e))?;
    let clock = Clock::start();
    // The wall-clock time of the run clock's 0, for the interval log's timestamps.
    let epoch = SystemTime::now() - Duration::from_nanos(clock.now_ns());
    let (tx, rx) = mpsc::channel();
    let log_to: LogTo = args.output.out.as_ref().map(|_| {
        let iclock = IntervalClock::new(clock.now_ns(), args.output.hlog_interval);
        (iclock, tx)
    });
    let planned = Duration::from_secs_f64(2.0 * args.messages as f64 / PLANNING_RATE);
    let progress = Progress::new(planned, args.output.quiet);

    // Fill.
    let rss_before = rss_bytes();
    let cpu_before = cpu_now();
    let mut put_rtt = timed(&log_to, 0);
    let mut put = 0u64;
    let start_ns = clock.now_ns();
    while put < args.messages {
        let n = (args.messages - put).min(u64::from(args.put_batch));
        let sent = clock.now_ns();
        let batch: Vec<Message> = (put..put + n)
            .map(|seq| Message::new(body(args.body_bytes as usize, sent, seq)))
            .collect();
        let t0 = clock.now_ns();
        queue
            .put_batch(batch)
            .map_err(|e| broker_error("put_batch failed", e))?;
        let t1 = clock.now_ns();
        put_rtt.record(t1, t1 - t0);
        put += n;
        let elapsed = Duration::from_nanos(clock.now_ns() - start_ns);
        progress.update("filling", elapsed, planned, || {
            format!(
                ", {} of {} queued",
                thousands(put),
                thousands(args.messages)
            )
        });
    }
    let fill_ns = clock.now_ns() - start_ns;
    let rss_filled = rss_bytes();
    let mut process = ProcessStats::over_window(cpu_before, cpu_now(), fill_ns as f64 / 1e9, put);
    let filled = queue.stats();
    let mut problems = Vec::new();
    if filled.ready as u64 != put {
        problems.push(format!(
            "{} message(s) put but {} ready after the fill",
            put, filled.ready
        ));
    }

    // Drain.
    let drain_start = clock.now_ns();
    let acked_total = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let drained: Vec<Drained> = thread::scope(|s| {
        let workers: Vec<_> = (0..args.consumers)
            .map(|i| {
                let consumer = queue.consume(
                    &format!("drain-{i}"),
                    ConsumerConfig {
                        prefetch: args.prefetch,
                    },
                );
                let (acked_total, stop) = (&acked_total, &stop);
                let settle = timed(&log_to, 1);
                s.spawn(move || match consumer {
                    Ok(c) => drain(&c, args, put, acked_total, stop, clock, settle),
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
            let elapsed = Duration::from_nanos(clock.now_ns() - start_ns);
            progress.update("draining", elapsed, planned, || {
                format!(", {} to ack", thousands(left))
            });
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("a drain thread panicked"))
            .collect()
    });
    let end_ns = clock.now_ns();
    let drain_ns = end_ns - drain_start;
    progress.finish();
    let put_rtt = put_rtt.finish();
    let intervals = log_to.map(|(iclock, _)| {
        let window = Duration::from_nanos(end_ns - start_ns);
        let mut log = IntervalLog::new(&HISTOGRAMS, epoch, iclock, window);
        for piece in rx.try_iter() {
            log.absorb(piece);
        }
        log.close(end_ns);
        log
    });
    let stats = queue.stats();
    broker.shutdown();

    let mut ledger = Ledger::default();
    let mut settle = Recorder::new();
    let mut acked_calls = 0;
    for d in &drained {
        ledger.merge(&d.ledger);
        settle.merge(&d.settle);
        acked_calls += d.acked;
        problems.extend(d.problems.iter().cloned());
    }
    if drain_ns >= nanos(DRAIN_LIMIT) {
        let (missing, _) = ledger.check(0, put);
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
        ledger: &ledger,
        acked: acked_calls,
        redelivered: 0,
        problems,
    };
    let accounting = Accounting::check(seen, &stats);
    let grown = rss_filled.saturating_sub(rss_before);
    process.bytes_per_queued_message = Some(grown as f64 / put as f64);

    let fill_s = fill_ns as f64 / 1e9;
    let drain_s = drain_ns as f64 / 1e9;
    let summary = Summary {
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
            Rate::new("acked (draining)", acked_calls, drain_s),
        ],
        histograms: vec![
            put_rtt.summary("put_batch_rtt", "put batch round trip"),
            settle.summary("settle_rtt", "ack_up_to round trip"),
        ],
        details: vec![
            Detail::new("queued at the end of the fill", filled.ready as u64),
            Detail::new("RSS before the fill (MiB)", mib(rss_before)),
            Detail::new("RSS with the queue full (MiB)", mib(rss_filled)),
            Detail::new(
                "bytes per queued message",
                (grown as f64 / put as f64).round(),
            ),
            Detail::new("fill time (s)", (fill_s * 1e3).round() / 1e3),
            Detail::new("drain time (s)", (drain_s * 1e3).round() / 1e3),
        ],
        accounting,
        process,
        load_average: load_average(),
        hgrm_unit: crate::hist::HGRM_UNIT,
        plots: Vec::new(),
        notes: vec![
            "process figures (CPU, per message) cover the fill; peak RSS is the whole run's".into(),
        ],
    };
    Ok(Run {
        summary,
        recorders: vec![
            (HISTOGRAMS[0].into(), put_rtt),
            (HISTOGRAMS[1].into(), settle),
        ],
        intervals,
    })
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
fn drain(
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
