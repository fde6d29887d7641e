//! `throughput`: P producers put into Q queues on S shards, C consumers receive and ack.
//!
//! Every body carries its send time (nanoseconds since the run's epoch; in an open loop the
//! *intended* send time, so a stalled broker cannot hide its own backlog) and a sequence
//! number. Consumers record put→deliver when a delivery arrives, put→ack when the `ack` (or
//! the `ack_up_to` covering it) returns, and the round trip of every settle call, each in
//! its own per-thread histogram, merged at the end. Only messages sent in the measured
//! window (after the warm-up) are recorded. At the end every producer's sequence numbers
//! are checked off against the consumers' ledgers and the queues' stats.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use leasemq::{Broker, Consumer, ConsumerConfig, Queue, QueueConfig, QueueStats};
use serde_json::json;

use crate::cli::{format_duration, Api, ThroughputArgs};
use crate::common::{add_stats, broker_error, nanos, queue_names, Clock};
use crate::hist::HGRM_UNIT;
use crate::report::{load_average, Accounting, CpuSample, Detail, ProcessStats, Rate, Summary};
use crate::Run;

mod workers;

use workers::{consume, produce, ConsumerResult, Plan, Shared};

/// Long enough that no lease runs out during a run: every ack is expected to succeed.
const ACK_TIMEOUT: Duration = Duration::from_secs(600);
/// Closed loop: the least bound on messages in flight (a smaller one starves the shards of
/// work while producers wait, and 64 Ki small messages cost little memory).
const CLOSED_LOOP_IN_FLIGHT: u64 = 65_536;
/// Open loop: the most messages in flight before producers wait (their lateness counts).
const OPEN_LOOP_IN_FLIGHT: u64 = 1_000_000;

pub fn run(args: &ThroughputArgs) -> Result<Run, String> {
    if args.queues > args.consumers {
        return Err(format!(
            "every queue needs a consumer: --queues {} is more than --consumers {}",
            args.queues, args.consumers
        ));
    }
    if args.duration.is_zero() {
        return Err("--duration must be more than zero".into());
    }
    if args.rate == Some(0) {
        return Err("--rate must be more than zero".into());
    }
    let (producers, consumers, queues) = (
        args.producers as usize,
        args.consumers as usize,
        args.queues as usize,
    );
    let batched = args.api == Api::Batched;
    let put_batch = if batched { args.put_batch as usize } else { 1 };
    let max_in_flight = match (args.max_in_flight, args.rate) {
        (0, None) => (2 * u64::from(args.prefetch) * consumers as u64
            + (put_batch * producers) as u64)
            .max(CLOSED_LOOP_IN_FLIGHT),
        (0, Some(_)) => OPEN_LOOP_IN_FLIGHT,
        (n, _) => n,
    };
    let warm_ns = nanos(args.warmup);
    let plan = Plan {
        api: args.api,
        producers: producers as u64,
        body_bytes: args.body_bytes as usize,
        put_batch,
        settle_batch: args.settle_batch as usize,
        warm_ns,
        end_ns: warm_ns + nanos(args.duration),
        interval_ns: args.rate.map(|r| 1e9 * producers as f64 / r as f64),
        linger_ns: if batched { nanos(args.linger) } else { 0 },
        max_in_flight,
    };

    let broker = Broker::builder()
        .shards(args.shards as usize)
        .build()
        .map_err(|e| broker_error("starting the broker", e))?;
    let config = QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        max_body_bytes: (args.body_bytes as usize).max(1024 * 1024),
        ..QueueConfig::default()
    };
    let mut qs: Vec<Queue> = Vec::with_capacity(queues);
    for name in queue_names("throughput", queues, args.shards as usize) {
        qs.push(
            broker
                .declare_queue(&name, config.clone())
                .map_err(|e| broker_error("declaring a queue", e))?,
        );
    }
    let mut cs: Vec<Consumer> = Vec::with_capacity(consumers);
    for i in 0..consumers {
        let consumer_config = ConsumerConfig {
            prefetch: args.prefetch,
        };
        cs.push(
            qs[i % queues]
                .consume(&format!("consumer-{i}"), consumer_config)
                .map_err(|e| broker_error("registering a consumer", e))?,
        );
    }

    let shared = Arc::new(Shared::default());
    let clock = Clock::start();
    let consumer_threads: Vec<_> = cs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (plan, shared) = (plan.clone(), shared.clone());
            thread::Builder::new()
                .name(format!("consumer-{i}"))
                .spawn(move || consume(c, &plan, clock, &shared))
                .expect("spawn a consumer thread")
        })
        .collect();
    let producer_threads: Vec<_> = (0..producers)
        .map(|j| {
            let (plan, shared) = (plan.clone(), shared.clone());
            let mine: Vec<Queue> = (0..queues).map(|k| qs[(j + k) % queues].clone()).collect();
            thread::Builder::new()
                .name(format!("producer-{j}"))
                .spawn(move || produce(j as u64, &mine, &plan, clock, &shared))
                .expect("spawn a producer thread")
        })
        .collect();

    clock.wait_until(plan.warm_ns);
    let cpu = CpuSample::now();
    clock.wait_until(plan.end_ns);
    let seconds = args.duration.as_secs_f64();
    let mut process = ProcessStats::default();
    // CPU is taken over the window; the messages are filled in below.
    let cpu_end = CpuSample::now();

    let mut put = 0u64;
    let mut put_per_producer = Vec::with_capacity(producers);
    let mut put_in_window = 0u64;
    let mut problems = Vec::new();
    for t in producer_threads {
        let r = t
            .join()
            .map_err(|_| "a producer thread panicked".to_string())?;
        put += r.put;
        put_per_producer.push(r.put);
        put_in_window += r.put_in_window;
        problems.extend(r.problem);
    }
    let mut total = ConsumerResult::default();
    for t in consumer_threads {
        let r = t
            .join()
            .map_err(|_| "a consumer thread panicked".to_string())?;
        total.deliver.merge(&r.deliver);
        total.ack.merge(&r.ack);
        total.settle.merge(&r.settle);
        total.ledger.merge(&r.ledger);
        total.acked += r.acked;
        total.acked_in_window += r.acked_in_window;
        total.delivered_in_window += r.delivered_in_window;
        total.settle_calls += r.settle_calls;
        total.redelivered += r.redelivered;
        problems.extend(r.problems);
    }

    let mut stats = QueueStats::default();
    for q in &qs {
        add_stats(&mut stats, &q.stats());
    }
    broker.shutdown();

    let mut accounting = Accounting {
        put,
        redelivered: total.redelivered,
        expired: stats.expired,
        stale: stats.stale,
        still_queued: (stats.ready + stats.delayed + stats.leased) as u64,
        dead_lettered: stats.dead_lettered,
        dropped: stats.dropped,
        double_acked: total.ledger.doubles,
        problems,
        ..Accounting::default()
    };
    let mut never_put = 0;
    for (p, &n) in put_per_producer.iter().enumerate() {
        let (missing, beyond) = total.ledger.check(p, n);
        accounting.acked += n - missing;
        never_put += beyond;
    }
    if never_put > 0 {
        accounting
            .problems
            .push(format!("{never_put} acked message(s) were never put"));
    }
    if stats.enqueued != put {
        accounting.problems.push(format!(
            "the queues enqueued {} messages but the producers put {put}",
            stats.enqueued
        ));
    }
    if stats.acked != total.acked {
        accounting.problems.push(format!(
            "the queues counted {} acks but the consumers saw {} succeed",
            stats.acked, total.acked
        ));
    }
    accounting.conclude();

    process.cpu_user_s = cpu_end.user_s - cpu.user_s;
    process.cpu_sys_s = cpu_end.sys_s - cpu.sys_s;
    process.cpu_s = process.cpu_user_s + process.cpu_sys_s;
    process.cores_busy = process.cpu_s / seconds;
    process.cpu_ns_per_message =
        (total.acked_in_window > 0).then(|| process.cpu_s * 1e9 / total.acked_in_window as f64);
    process.peak_rss_bytes = crate::report::status_kib("VmHWM").map(|k| k * 1024);

    let loop_text = match args.rate {
        Some(r) if batched => format!(
            "open loop at {r} messages/s (linger {}), latency from intended send time",
            format_duration(args.linger)
        ),
        Some(r) => format!("open loop at {r} messages/s, latency from intended send time"),
        None => format!("closed loop, at most {max_in_flight} in flight"),
    };
    let api_text = if batched {
        format!(
            "batched API (put batch {}, settle batch {}, prefetch {})",
            args.put_batch, args.settle_batch, args.prefetch
        )
    } else {
        format!("per-message API (prefetch {})", args.prefetch)
    };
    let title = format!(
        "{producers} producer(s), {consumers} consumer(s), {queues} queue(s) on {} shard(s); \
         {}-byte bodies; {api_text}; {loop_text}; {} measured after {} warm-up",
        args.shards,
        args.body_bytes,
        format_duration(args.duration),
        format_duration(args.warmup)
    );
    let mut notes = Vec::new();
    if let Some(r) = args.rate {
        let achieved = put_in_window as f64 / seconds;
        if achieved < 0.95 * r as f64 {
            notes.push(format!(
                "the open loop put only {achieved:.0} messages/s of the {r} asked for"
            ));
        }
    }
    let summary = Summary {
        tool: "leasemq-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        command: "throughput",
        title,
        config: json!({
            "producers": producers, "consumers": consumers, "queues": queues,
            "shards": args.shards, "body_bytes": args.body_bytes, "prefetch": args.prefetch,
            "put_batch": args.put_batch, "settle_batch": args.settle_batch,
            "api": args.api.name(), "duration_s": args.duration.as_secs_f64(),
            "warmup_s": args.warmup.as_secs_f64(), "rate": args.rate,
            "linger_s": args.linger.as_secs_f64(),
            "max_in_flight": max_in_flight, "ack_timeout_s": ACK_TIMEOUT.as_secs_f64(),
        }),
        measured_seconds: seconds,
        rates: vec![
            Rate {
                name: "put".into(),
                per_second: put_in_window as f64 / seconds,
                total: put_in_window,
            },
            Rate {
                name: "delivered".into(),
                per_second: total.delivered_in_window as f64 / seconds,
                total: total.delivered_in_window,
            },
            Rate {
                name: "acked".into(),
                per_second: total.acked_in_window as f64 / seconds,
                total: total.acked_in_window,
            },
        ],
        histograms: vec![
            total.deliver.summary("put_to_deliver", "put→deliver"),
            total.ack.summary("put_to_ack", "put→ack"),
            total.settle.summary("settle_rtt", "settle round trip"),
        ],
        details: vec![
            Detail::new("settle calls", total.settle_calls),
            Detail::new(
                "messages per settle call",
                (total.acked as f64 / total.settle_calls.max(1) as f64 * 10.0).round() / 10.0,
            ),
        ],
        accounting,
        process,
        load_average: load_average(),
        hgrm_unit: HGRM_UNIT,
        notes,
    };
    Ok(Run {
        summary,
        recorders: vec![
            ("put_to_deliver".into(), total.deliver),
            ("put_to_ack".into(), total.ack),
            ("settle_rtt".into(), total.settle),
        ],
    })
}
