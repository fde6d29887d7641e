//! An AMQP run's results, merged and summarised as the embedded run's are.

use leasemq::QueueStats;
use serde_json::json;

use super::targets::Targets;
use super::workers::{ConsumerResult, ProducerResult};
use super::{masked, queue_args, Plan, ACK, CONFIRM, DELIVER, HISTOGRAMS, SETTLE};
use crate::cli::{format_duration, AckMode, Client, ThroughputArgs};
use crate::common::Ledger;
use crate::cpu::CpuTime;
use crate::hist::{Recorder, HGRM_UNIT};
use crate::intervals::IntervalLog;
use crate::report::Summary;
use crate::report::{load_average, thousands, Accounting, Detail, ProcessStats, Rate, Seen};
use crate::Run;

/// What the run measured.
pub(super) struct Outcome {
    pub(super) produced: Vec<ProducerResult>,
    pub(super) consumed: Vec<ConsumerResult>,
    /// The merged histograms, by slot.
    pub(super) recorders: Vec<Recorder>,
    pub(super) still_ready: u64,
    /// The process's CPU time at both ends of the window.
    pub(super) cpu: (CpuTime, CpuTime),
    pub(super) intervals: Option<IntervalLog>,
}

/// Takes every task's histograms out of its result, finished, and merges them by slot.
pub(super) fn finish_recorders(
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

pub(super) fn summarise(
    args: &ThroughputArgs,
    targets: Targets<'_>,
    plan: &Plan,
    out: Outcome,
) -> Run {
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
    let seen = Seen {
        put: &put,
        ledger: &ledger,
        acked,
        redelivered,
        problems,
    };
    let accounting = account(seen, out.still_ready);
    let (cpu_start, cpu_end) = out.cpu;
    let (title, config) = describe(args, targets, plan);
    let slots = plan.slots();
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
        details: settle_details(plan, acked, settle_calls),
        accounting,
        process: ProcessStats::over_window(cpu_start, cpu_end, seconds, acked_in_window),
        load_average: load_average(),
        // The broker runs in the server, not here.
        host: None,
        caller_turn_share: None,
        hgrm_unit: HGRM_UNIT,
        plots: Vec::new(),
        notes: notes(plan),
    };
    Run {
        summary,
        recorders: named_recorders(recorders, &slots),
        intervals: out.intervals,
    }
}

/// The histograms the run measured (`slots`), each with its file name.
fn named_recorders(recorders: Vec<Recorder>, slots: &[usize]) -> Vec<(String, Recorder)> {
    let mut named: Vec<Option<Recorder>> = recorders.into_iter().map(Some).collect();
    slots
        .iter()
        .map(|&i| (HISTOGRAMS[i].0.to_string(), named[i].take().expect("once")))
        .collect()
}

/// The run's title and its flags for `summary.json`. With several targets the title names
/// them all and `config` lists them in `targets` (`target` is the first, which declared
/// the queues); with `--queue-arg` the title gives the arguments after the queue count
/// and `config` has them in `queue_args`.
fn describe(
    args: &ThroughputArgs,
    targets: Targets<'_>,
    plan: &Plan,
) -> (String, serde_json::Value) {
    let w = &args.workload;
    let seconds = args.duration.as_secs_f64();
    let ack_text = plan.ack.text();
    let confirms = if plan.confirms { "on" } else { "off" };
    let queue_args = &args.amqp.queue_args;
    let with_args = if queue_args.is_empty() {
        String::new()
    } else {
        let each: Vec<String> = queue_args.iter().map(|a| a.to_string()).collect();
        format!(" with {}", each.join(", "))
    };
    let title = format!(
        "AMQP {} ({} client): {} producer(s), {} consumer(s), {} queue(s){with_args}; \
         {}-byte bodies; prefetch {}, ack {ack_text}, confirms {confirms}; closed loop, at \
         most {} in flight; {} measured after {} warm-up",
        targets.text(),
        plan.client.text(),
        w.producers,
        w.consumers,
        w.queues,
        w.body_bytes,
        plan.prefetch,
        thousands(plan.max_in_flight),
        format_duration(args.duration),
        format_duration(args.warmup)
    );
    let mut config = json!({
        "target": masked(targets.first().uri), "client": plan.client.text(), "producers": w.producers, "consumers": w.consumers,
        "queues": w.queues, "body_bytes": w.body_bytes, "prefetch": plan.prefetch,
        "ack": ack_text, "confirms": plan.confirms, "durable": w.storage.durable,
        "runtime_threads": w.runtime_threads, "duration_s": seconds,
        "warmup_s": args.warmup.as_secs_f64(), "rate": null,
        "max_in_flight": plan.max_in_flight,
    });
    if targets.len() > 1 {
        config["targets"] = targets.masked().into();
    }
    if !queue_args.is_empty() {
        config["queue_args"] = queue_args::to_json(queue_args);
    }
    (title, config)
}

/// How many settle calls the consumers made, and how many messages each settled.
fn settle_details(plan: &Plan, acked: u64, settle_calls: u64) -> Vec<Detail> {
    let mut details = vec![Detail::new("settle calls", settle_calls)];
    if plan.ack != AckMode::NoAck {
        let per_call = acked as f64 / settle_calls.max(1) as f64;
        details.push(Detail::new(
            "messages per settle call",
            (per_call * 10.0).round() / 10.0,
        ));
    }
    details
}

/// What the summary's figures leave out over AMQP.
fn notes(plan: &Plan) -> Vec<String> {
    let put = match plan.client {
        Client::Lapin => {
            "a publish is counted as put when lapin has taken it, not when the server has"
        }
        Client::Raw => {
            "a publish is counted as put when the client has queued it for its next write, \
             not when the server has taken it"
        }
    };
    vec![
        "process: this load generator's CPU only; the server's is not counted".into(),
        put.into(),
    ]
}

/// The end-of-run check over AMQP: what the consumers saw against the server's side as
/// AMQP shows it, the messages still ready in the queues (`still_ready`).
fn account(seen: Seen<'_>, still_ready: u64) -> Accounting {
    let stats = QueueStats {
        enqueued: seen.put.iter().sum(),
        acked: seen.acked,
        ready: still_ready as usize,
        ..QueueStats::default()
    };
    Accounting::check(seen, &stats)
}
