//! `redelivery`: keeps N leases outstanding on one queue under the system clock, leaves a
//! fraction of first deliveries to expire, and measures how late their redeliveries arrive
//! and what touch and ack cost while the shard's timer wheel holds N leases.
//!
//! One driver thread does everything, so no lock or channel of the loadgen's own sits
//! between the broker and the clock readings. Each turn it drains every consumer's channel,
//! renews the leases that reached half their `ack_timeout` (a chosen fraction acked and
//! replaced by fresh messages, the rest touched), acks every redelivery, and tops the
//! queue back up to N live messages. The consumers' total prefetch is at least N, so every
//! message is leased the moment it is put.
//!
//! **Lateness** is the time the redelivery was received minus the earliest moment its
//! lease could have ended: the start of the `put` call that enqueued the message (its send
//! time, in the body) plus `ack_timeout`. That bounds the broker's own lateness from above:
//! it also holds the tick rounding of the deadline, the shard's wake-up and the channel hop.
//! Since the shard counts time in whole ticks from the tick its batch started in, a
//! redelivery may arrive up to one tick (1 ms) *before* that bound; those are counted as
//! early and recorded as 0, and one earlier than that would break the contract and fails
//! the run.

use std::time::{Duration, SystemTime};

use leasemq::{Broker, Consumer, ConsumerConfig, Queue, QueueConfig, QueueStats};
use serde_json::json;

use crate::cli::{format_duration, OutputArgs, RedeliveryArgs};
use crate::common::{broker_error, nanos, new_broker, queue_names};
use crate::cpu::CpuTime;
use crate::hist::{Recorder, HGRM_UNIT};
use crate::intervals::{Differ, IntervalClock, IntervalLog};
use crate::progress::Progress;
use crate::report::{
    cpu_now, load_average, rss_bytes, thousands, Accounting, Detail, ProcessStats, Rate, Seen,
    Summary,
};
use crate::Run;

mod driver;

use driver::{Driver, Tally};

/// The most prefetch one consumer may have.
const MAX_PREFETCH: u64 = 65_535;
/// The default ack_timeout: this much per lease, and at least the floor.
const AUTO_TIMEOUT_PER_LEASE: Duration = Duration::from_micros(2);
const AUTO_TIMEOUT_FLOOR: Duration = Duration::from_millis(200);
/// The default duration: ack_timeout + 2 s (so redeliveries fall in it), at least this.
const AUTO_DURATION_FLOOR: Duration = Duration::from_secs(3);
/// How long the drain at the end may take beyond one ack_timeout.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// The histograms, in the order of the summary and of the interval log's slots.
const HISTOGRAMS: [(&str, &str); 6] = [
    ("lateness", "redelivery lateness"),
    ("touch_rtt", "touch round trip"),
    ("ack_rtt", "ack round trip"),
    ("touch_batch_rtt", "touch batch round trip"),
    ("ack_batch_rtt", "ack batch round trip"),
    ("put_batch_rtt", "put batch round trip"),
];

/// The driver's histograms, in the order of [`HISTOGRAMS`].
fn recorders(t: &Tally) -> [&Recorder; 6] {
    [
        &t.lateness,
        &t.touch,
        &t.ack,
        &t.touch_batch,
        &t.ack_batch,
        &t.put_batch,
    ]
}

/// The interval log of the measured window and the drain, taken from the driver's
/// whole-run histograms by difference between turns.
struct Intervals {
    differ: Differ,
    log: IntervalLog,
}

impl Intervals {
    /// The log of a window that starts at `filled_ns` on the driver's clock, whose 0 is
    /// `epoch` on the wall clock; none unless `--out` asked for one.
    fn start(
        output: &OutputArgs,
        epoch: SystemTime,
        filled_ns: u64,
        window: Duration,
    ) -> Option<Intervals> {
        output.out.as_ref().map(|_| {
            let clock = IntervalClock::new(filled_ns, output.hlog_interval);
            let names = HISTOGRAMS.map(|h| h.0);
            Intervals {
                differ: Differ::new(clock, names.len()),
                log: IntervalLog::new(&names, epoch, clock, window),
            }
        })
    }

    /// Between two turns of the driver.
    fn between_turns(this: &mut Option<Intervals>, d: &Driver) {
        if let Some(i) = this {
            let now = d.clock.now_ns();
            if i.differ.due(now) {
                i.differ.take(now, &recorders(&d.t), &mut i.log);
            }
        }
    }

    /// The last interval (everything recorded since the last boundary), and the log.
    fn close(mut self, d: &Driver) -> IntervalLog {
        let now = d.clock.now_ns();
        self.differ.take(now, &recorders(&d.t), &mut self.log);
        self.log.close(now);
        self.log
    }
}

/// A run's settings, with the defaults that depend on `--leases` filled in.
struct Plan {
    leases: u64,
    ack_timeout: Duration,
    duration: Duration,
    /// ⌈leases / [`MAX_PREFETCH`]⌉ consumers, whose prefetch adds up to at least `leases`.
    consumers: u64,
    prefetch: u32,
}

impl Plan {
    /// Checks the flags and fills in the defaults.
    fn of(args: &RedeliveryArgs) -> Result<Plan, String> {
        if args.leases == 0 {
            return Err("--leases must be at least 1".into());
        }
        // Renewing N leases every half lease takes 2N / ack_timeout calls a second: by
        // default the lease grows with N so that stays near a million.
        let ack_timeout = args.ack_timeout.unwrap_or_else(|| {
            AUTO_TIMEOUT_FLOOR.max(AUTO_TIMEOUT_PER_LEASE * args.leases.min(u32::MAX as u64) as u32)
        });
        let duration = args
            .duration
            .unwrap_or_else(|| AUTO_DURATION_FLOOR.max(ack_timeout + Duration::from_secs(2)));
        if duration.is_zero() {
            return Err("--duration must be more than zero".into());
        }
        let consumers = args.leases.div_ceil(MAX_PREFETCH);
        Ok(Plan {
            leases: args.leases,
            ack_timeout,
            duration,
            consumers,
            prefetch: args.leases.div_ceil(consumers) as u32,
        })
    }
}

/// What the process looked like the moment every lease was out; all zero if that moment
/// never came.
#[derive(Default)]
struct Filled {
    cpu: CpuTime,
    rss_bytes: u64,
    /// The driver's own memory for its leases then, which is not the broker's.
    bookkeeping_bytes: usize,
}

impl Filled {
    /// What the broker holds per lease: the growth of the resident set from `rss_before`,
    /// less the driver's own share; `None` if the leases were never all out.
    fn bytes_per_lease(&self, rss_before: u64, leases: u64) -> Option<f64> {
        (self.rss_bytes > 0).then(|| {
            let broker_share = self
                .rss_bytes
                .saturating_sub(rss_before + self.bookkeeping_bytes as u64);
            broker_share as f64 / leases as f64
        })
    }
}

pub fn run(args: &RedeliveryArgs) -> Result<Run, String> {
    let plan = Plan::of(args)?;
    let (broker, queue, consumers) = open(args, &plan)?;
    let rss_before = rss_bytes();
    let mut d = Driver::new(
        queue.clone(),
        consumers,
        plan.ack_timeout,
        args.leases,
        args.never_ack_fraction,
        args.ack_fraction,
        args.put_batch as usize,
        args.settle_batch as usize,
    );
    // The wall-clock time of the driver's clock's 0, for the interval log's timestamps.
    let epoch = SystemTime::now() - Duration::from_nanos(d.clock.now_ns());
    let progress = Progress::new(plan.duration, args.output.quiet);

    let filled = fill(&mut d, &broker, &plan, &progress)?;
    let filled_ns = d.filled_ns.unwrap_or(0);
    let mut intervals = Intervals::start(&args.output, epoch, filled_ns, plan.duration);
    measure(&mut d, &broker, &plan, &progress, &mut intervals)?;
    let renewals = d.t.w_acked + d.t.w_touched;
    let seconds = plan.duration.as_secs_f64();
    let mut process = ProcessStats::over_window(filled.cpu, cpu_now(), seconds, renewals);
    drain(&mut d, &plan, &progress, &mut intervals);
    progress.finish();
    let intervals = intervals.map(|i| i.close(&d));
    let stats = queue.stats();
    drop(d.consumers);
    crate::report::note_turns(&broker);
    broker.shutdown();

    let accounting = check(&d.t, d.problems, &stats);
    process.bytes_per_queued_message = filled.bytes_per_lease(rss_before, args.leases);
    let summary = summarise(args, &plan, &d.t, filled_ns, accounting, process);
    Ok(Run {
        summary,
        recorders: HISTOGRAMS
            .iter()
            .zip(recorders(&d.t))
            .map(|(h, r)| (h.0.to_string(), r.clone()))
            .collect(),
        intervals,
    })
}

/// Setup: the broker, the queue and the consumers that will hold the leases.
fn open(args: &RedeliveryArgs, plan: &Plan) -> Result<(Broker, Queue, Vec<Consumer>), String> {
    let broker = new_broker(args.shards)?;
    let name = &queue_names("redelivery", 1, args.shards as usize)[0];
    let config = QueueConfig {
        ack_timeout: plan.ack_timeout,
        ..QueueConfig::default()
    };
    let queue = broker
        .declare_queue(name, config)
        .map_err(|e| broker_error("declaring the queue", e))?;
    let mut cs = Vec::with_capacity(plan.consumers as usize);
    for i in 0..plan.consumers {
        let config = ConsumerConfig {
            prefetch: plan.prefetch,
        };
        cs.push(
            queue
                .consume(&format!("holder-{i}"), config)
                .map_err(|e| broker_error("registering a consumer", e))?,
        );
    }
    Ok((broker, queue, cs))
}

/// Fill: turns until every lease is out (or something went wrong), then takes the
/// process's CPU time and memory.
fn fill(
    d: &mut Driver,
    broker: &Broker,
    plan: &Plan,
    progress: &Progress,
) -> Result<Filled, String> {
    let mut filled = Filled::default();
    while d.filled_ns.is_none() && d.problems.is_empty() {
        let out = d.t.put - d.t.acked;
        progress.update("filling", Duration::ZERO, plan.duration, || {
            format!(
                ", {} of {} leases out",
                thousands(out),
                thousands(plan.leases)
            )
        });
        turn_or_stop(d, broker, plan)?;
        if d.filled_ns.is_some() {
            filled = Filled {
                cpu: cpu_now(),
                rss_bytes: rss_bytes(),
                bookkeeping_bytes: d.bookkeeping_bytes(),
            };
        }
    }
    Ok(filled)
}

/// Measure: keeps the leases going for the window that starts once they are all out,
/// taking the interval log between turns.
fn measure(
    d: &mut Driver,
    broker: &Broker,
    plan: &Plan,
    progress: &Progress,
    intervals: &mut Option<Intervals>,
) -> Result<(), String> {
    let filled_ns = d.filled_ns.unwrap_or(0);
    d.end_ns = filled_ns + nanos(plan.duration);
    while d.clock.now_ns() < d.end_ns && d.problems.is_empty() {
        let elapsed = Duration::from_nanos(d.clock.now_ns().saturating_sub(filled_ns));
        progress.update("measuring", elapsed, plan.duration, String::new);
        turn_or_stop(d, broker, plan)?;
        Intervals::between_turns(intervals, d);
    }
    Ok(())
}

/// One turn of the driver; stops the run when it cannot keep its leases alive.
fn turn_or_stop(d: &mut Driver, broker: &Broker, plan: &Plan) -> Result<(), String> {
    d.turn();
    if d.overwhelmed() {
        broker.shutdown();
        return Err(overwhelmed(plan.leases, plan.ack_timeout, d.clock.now_ns()));
    }
    Ok(())
}

/// Drain: acks everything still out and waits for what is expiring; what is not back
/// [`DRAIN_LIMIT`] after one more `ack_timeout` is a problem.
fn drain(d: &mut Driver, plan: &Plan, progress: &Progress, intervals: &mut Option<Intervals>) {
    d.draining = true;
    let drain_until = d.clock.now_ns() + d.timeout_ns + nanos(DRAIN_LIMIT);
    while d.t.acked < d.t.put && d.problems.is_empty() {
        if d.clock.now_ns() > drain_until {
            d.problems.push(format!(
                "{} message(s) not back within ack_timeout + {} after the run",
                d.t.put - d.t.acked,
                format_duration(DRAIN_LIMIT)
            ));
            break;
        }
        let left = d.t.put - d.t.acked;
        progress.update("draining", plan.duration, plan.duration, || {
            format!(", {} message(s) to ack", thousands(left))
        });
        d.turn();
        Intervals::between_turns(intervals, d);
    }
}

/// The end-of-run check, and the one problem only this run can have: a redelivery that
/// came more than a tick before its lease could have ended.
fn check(t: &Tally, mut problems: Vec<String>, stats: &QueueStats) -> Accounting {
    if t.too_early > 0 {
        problems.push(format!(
            "{} redelivery(ies) arrived more than one tick before the lease could have ended",
            t.too_early
        ));
    }
    let seen = Seen {
        put: &[t.put],
        ledger: &t.ledger,
        acked: t.acked,
        redelivered: t.redelivered,
        problems,
    };
    Accounting::check(seen, stats)
}

/// Report: the summary of a finished run.
fn summarise(
    args: &RedeliveryArgs,
    plan: &Plan,
    t: &Tally,
    filled_ns: u64,
    accounting: Accounting,
    process: ProcessStats,
) -> Summary {
    let seconds = plan.duration.as_secs_f64();
    Summary {
        tool: "leasemq-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        command: "redelivery",
        title: format!(
            "{} leases on 1 queue ({} consumer(s) × prefetch {}), {} shard(s), ack_timeout {}, \
             {}% never acked, {}% of renewals acked; {} measured after the fill",
            thousands(args.leases),
            plan.consumers,
            plan.prefetch,
            args.shards,
            format_duration(plan.ack_timeout),
            args.never_ack_fraction * 100.0,
            args.ack_fraction * 100.0,
            format_duration(plan.duration)
        ),
        config: json!({
            "leases": args.leases, "ack_timeout_s": plan.ack_timeout.as_secs_f64(),
            "never_ack_fraction": args.never_ack_fraction, "ack_fraction": args.ack_fraction,
            "shards": args.shards, "duration_s": seconds, "put_batch": args.put_batch,
            "settle_batch": args.settle_batch, "consumers": plan.consumers,
            "prefetch": plan.prefetch,
        }),
        measured_seconds: seconds,
        rates: vec![
            Rate::new("put", t.w_put, seconds),
            Rate::new("acked", t.w_acked, seconds),
            Rate::new("touched", t.w_touched, seconds),
            Rate::new("redelivered", t.w_redelivered, seconds),
        ],
        histograms: HISTOGRAMS
            .iter()
            .zip(recorders(t))
            .map(|(&(name, description), r)| r.summary(name, description))
            .collect(),
        details: details(t, filled_ns),
        accounting,
        process,
        load_average: load_average(),
        host: crate::report::host_seen(),
        caller_turn_share: crate::report::caller_turn_share(),
        hgrm_unit: HGRM_UNIT,
        plots: Vec::new(),
        notes: notes(plan, t),
    }
}

/// The table's rows that only `redelivery` has.
fn details(t: &Tally, filled_ns: u64) -> Vec<Detail> {
    let earliest_us = if t.early > 0 {
        (t.earliest_ns as f64 / 100.0).round() / 10.0
    } else {
        0.0
    };
    let ms = |ns: u64| (ns as f64 / 1e4).round() / 100.0;
    vec![
        Detail::new("fill time (s)", (filled_ns as f64 / 1e6).round() / 1e3),
        Detail::new("first deliveries left to expire", t.planned),
        Detail::new("their redeliveries", t.planned_redelivered),
        Detail::new("redeliveries measured", t.lateness.count()),
        Detail::new("of which early (under one tick)", t.early),
        Detail::new("earliest (µs vs put + ack_timeout)", earliest_us),
        Detail::new("leases that ran out unplanned", t.unplanned_redelivered),
        Detail::new("renewal lag, max (ms)", ms(t.renew_lag_max_ns)),
        Detail::new("longest gap between polls (ms)", ms(t.poll_gap_max_ns)),
    ]
}

/// What the reader should know about the run: leases it could not keep, early
/// redeliveries, nothing measured.
fn notes(plan: &Plan, t: &Tally) -> Vec<String> {
    let mut notes = Vec::new();
    if t.unplanned_redelivered > 0 || t.refused > 0 {
        notes.push(format!(
            "{} lease(s) ran out before the driver renewed them ({} touches/acks refused): \
             it cannot keep {} leases alive with ack_timeout {}; try a longer --ack-timeout",
            thousands(t.unplanned_redelivered),
            thousands(t.refused),
            thousands(plan.leases),
            format_duration(plan.ack_timeout)
        ));
    }
    if t.early > 0 {
        notes.push(format!(
            "{} of {} measured redeliveries came up to one tick before put + ack_timeout \
             (recorded as 0): the shard starts a lease at the tick its batch began in, rounded \
             down, while deadlines round up (contract §4 Ticks)",
            thousands(t.early),
            thousands(t.lateness.count())
        ));
    }
    if t.lateness.count() == 0 {
        notes.push(
            "no redelivery was measured: lengthen --duration or raise --never-ack-fraction".into(),
        );
    }
    notes
}

/// Why a run that cannot keep its leases alive stops.
fn overwhelmed(leases: u64, ack_timeout: Duration, after_ns: u64) -> String {
    let needed = 2.0 * leases as f64 / ack_timeout.as_secs_f64();
    format!(
        "cannot keep {} leases alive with ack_timeout {}: after {:.1} s, more than 1% of them \
         had run out before they could be renewed (renewing every lease at half its lease \
         takes about {} touches or acks a second); use a longer --ack-timeout or fewer --leases",
        thousands(leases),
        format_duration(ack_timeout),
        after_ns as f64 / 1e9,
        thousands(needed as u64)
    )
}
