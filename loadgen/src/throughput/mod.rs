//! `throughput`: P producers put into Q queues on S shards, C consumers receive and ack.
//!
//! Every body carries its send time (nanoseconds since the run's epoch; in an open loop the
//! *intended* send time, so a stalled broker cannot hide its own backlog) and a sequence
//! number. Consumers record put→deliver when a delivery arrives, put→ack when the `ack` (or
//! the `ack_up_to` covering it) returns, and the round trip of every settle call; producers
//! record put→answered when the `put` (or `put_batch`) carrying a message returns. Each is
//! a per-thread histogram, merged at the end. Only messages sent in the measured
//! window (after the warm-up) are recorded. At the end every producer's sequence numbers
//! are checked off against the consumers' ledgers and the queues' stats.
//!
//! One run is one [`step::Step`]; `sweep` runs many.

use serde_json::json;

use crate::cli::{format_duration, Api, ThroughputArgs, WorkloadArgs};
use crate::hist::HGRM_UNIT;
use crate::progress::Progress;
use crate::report::{load_average, Detail, Rate, Summary};
use crate::storage::Storage;
use crate::Run;

pub mod step;
mod tasks;
mod workers;

use step::{run_step, Step, StepOutcome, ACK_TIMEOUT};

pub fn run(args: &ThroughputArgs) -> Result<Run, String> {
    if !args.amqp.targets.is_empty() {
        return crate::amqp::run(args);
    }
    if let Some(flag) = args.amqp.misplaced_flag() {
        return Err(format!("{flag} applies to an AMQP run: it needs --target"));
    }
    let w = &args.workload;
    step::validate(w, args.rate, args.duration)?;
    let storage = Storage::new(&w.storage)?;
    let progress = Progress::new(args.warmup + args.duration, args.output.quiet);
    let out = run_step(
        &Step {
            workload: w,
            shards: args.shards,
            rate: args.rate,
            warmup: args.warmup,
            duration: args.duration,
            hlog_interval: args.output.out.as_ref().map(|_| args.output.hlog_interval),
            storage: &storage,
            label: "throughput",
        },
        &progress,
    )?;
    progress.finish();
    Ok(summarise(args, &storage, out))
}

/// "1 producer(s), 1 consumer(s), 1 queue(s); 16-byte bodies; batched API (…)".
pub fn workload_text(w: &WorkloadArgs) -> String {
    let api_text = match w.api {
        Api::Batched => format!(
            "batched API (put batch {}, settle batch {}, prefetch {})",
            w.put_batch, w.settle_batch, w.prefetch
        ),
        Api::PerMessage => format!("per-message API (prefetch {})", w.prefetch),
        Api::Async if w.pipeline > 1 => format!(
            "per-message async API on {} runtime thread(s), {} calls in flight per task \
             (prefetch {})",
            w.runtime_threads, w.pipeline, w.prefetch
        ),
        Api::Async => format!(
            "per-message async API on {} runtime thread(s) (prefetch {})",
            w.runtime_threads, w.prefetch
        ),
    };
    let unit = if w.api == Api::Async {
        " task(s)"
    } else {
        "(s)"
    };
    format!(
        "{} producer{unit}, {} consumer{unit}, {} queue(s); {}-byte bodies; {api_text}",
        w.producers, w.consumers, w.queues, w.body_bytes
    )
}

/// The workload's flags, for `summary.json`.
pub fn workload_json(w: &WorkloadArgs) -> serde_json::Value {
    json!({
        "producers": w.producers, "consumers": w.consumers, "queues": w.queues,
        "body_bytes": w.body_bytes, "prefetch": w.prefetch,
        "put_batch": w.put_batch, "settle_batch": w.settle_batch,
        "api": w.api.name(), "runtime_threads": w.runtime_threads, "pipeline": w.pipeline,
        "linger_s": w.linger.as_secs_f64(),
        "ack_timeout_s": ACK_TIMEOUT.as_secs_f64(),
    })
}

fn summarise(args: &ThroughputArgs, storage: &Storage, out: StepOutcome) -> Run {
    let w = &args.workload;
    let seconds = args.duration.as_secs_f64();
    let loop_text = match args.rate {
        Some(r) if w.api == Api::Batched => format!(
            "open loop at {r} messages/s (linger {}), latency from intended send time",
            format_duration(w.linger)
        ),
        Some(r) => format!("open loop at {r} messages/s, latency from intended send time"),
        None => format!("closed loop, at most {} in flight", out.max_in_flight),
    };
    let storage_text = storage.text().map_or(String::new(), |t| format!("; {t}"));
    let title = format!(
        "{} on {} shard(s){storage_text}; {loop_text}; {} measured after {} warm-up",
        workload_text(w),
        args.shards,
        format_duration(args.duration),
        format_duration(args.warmup)
    );
    let mut notes = storage.notes();
    if let Some(r) = args.rate {
        let achieved = out.put_in_window as f64 / seconds;
        if achieved < 0.95 * r as f64 {
            notes.push(format!(
                "the open loop put only {achieved:.0} messages/s of the {r} asked for"
            ));
        }
    }
    let mut config = workload_json(w);
    config["shards"] = json!(args.shards);
    config["duration_s"] = json!(seconds);
    config["warmup_s"] = json!(args.warmup.as_secs_f64());
    config["rate"] = json!(args.rate);
    config["max_in_flight"] = json!(out.max_in_flight);
    storage.add_to(&mut config);
    let (recorders, histograms) = step::named(out.recorders);
    let summary = Summary {
        tool: "leasemq-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        command: "throughput",
        title,
        config,
        measured_seconds: seconds,
        rates: vec![
            Rate::new("put", out.put_in_window, seconds),
            Rate::new("delivered", out.delivered_in_window, seconds),
            Rate::new("acked", out.acked_in_window, seconds),
        ],
        histograms,
        details: vec![
            Detail::new("settle calls", out.settle_calls),
            Detail::new(
                "messages per settle call",
                (out.acked as f64 / out.settle_calls.max(1) as f64 * 10.0).round() / 10.0,
            ),
        ],
        accounting: out.accounting,
        process: out.process,
        load_average: load_average(),
        host: crate::report::host_seen(),
        caller_turn_share: crate::report::caller_turn_share(),
        hgrm_unit: HGRM_UNIT,
        plots: Vec::new(),
        notes,
    };
    Run {
        summary,
        recorders,
        intervals: out.intervals,
    }
}
