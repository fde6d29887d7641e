//! `sweep`: capacity planning. For each shard count, open-loop throughput steps at rising
//! rates ([`Ramp`]): from `--start-rate`, each `--step-factor` times the last, until a step
//! breaks; then `--refine` steps bisect between the last rate that held and the first that
//! broke. A step holds when the latency `--slo-on` names (put→ack by default; from each
//! message's intended send time) meets every `--slo` and the acks completed in its window
//! come within `--max-shortfall` of the
//! offered rate. Each step is a fresh broker and a full `throughput` run
//! ([`run_step`]), end-of-run check included: a step that loses a message ends the sweep,
//! which then fails. With a data dir, each step's broker starts on an empty one.

use std::time::Duration;

use serde::Serialize;

use crate::cli::{format_duration, SweepArgs};
use crate::hist::{HistSummary, Recorder};
use crate::intervals::IntervalLog;
use crate::progress::Progress;
use crate::report::{thousands, Accounting, ProcessStats};
use crate::storage::Storage;
use crate::throughput::step::{self, run_step, Step, StepOutcome, HISTOGRAMS};

mod report;

pub use report::SweepRun;

/// Why a ramp offered a rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Rising by the step factor, looking for the first rate that breaks.
    Rise,
    /// Bisecting between the last rate that held and the first that broke.
    Refine,
}

/// The rates a sweep offers one shard count, given which held.
#[derive(Clone, Debug)]
pub struct Ramp {
    factor: f64,
    max_rate: Option<u64>,
    rises_left: u32,
    refines_left: u32,
    next: Option<(u64, Phase)>,
    /// The highest rate that held.
    pub good: Option<u64>,
    /// The lowest rate that broke.
    pub bad: Option<u64>,
}

/// `x` to three significant digits: rates that read well in a table.
fn round_rate(x: f64) -> u64 {
    if x < 1000.0 {
        return x.round().max(1.0) as u64;
    }
    let scale = 10f64.powi(x.log10().floor() as i32 - 2);
    ((x / scale).round() * scale) as u64
}

impl Ramp {
    pub fn new(
        start: u64,
        factor: f64,
        refine: u32,
        max_steps: u32,
        max_rate: Option<u64>,
    ) -> Ramp {
        assert!(factor > 1.0, "a ramp rises");
        assert!(max_steps > 0, "a ramp has a first step");
        let start = max_rate.map_or(start, |m| start.min(m)).max(1);
        Ramp {
            factor,
            max_rate,
            rises_left: max_steps,
            refines_left: refine,
            next: Some((start, Phase::Rise)),
            good: None,
            bad: None,
        }
    }

    /// The next rate to offer, if any.
    pub fn next(&self) -> Option<(u64, Phase)> {
        self.next
    }

    /// Takes the outcome of the step at the rate `next` gave.
    pub fn record(&mut self, held: bool) {
        let (rate, phase) = self.next.take().expect("a step was due");
        if held {
            self.good = Some(self.good.map_or(rate, |g| g.max(rate)));
        } else {
            self.bad = Some(self.bad.map_or(rate, |b| b.min(rate)));
        }
        match phase {
            Phase::Rise => self.rises_left -= 1,
            Phase::Refine => self.refines_left -= 1,
        }
        if phase == Phase::Rise && held {
            let at_cap = self.max_rate.is_some_and(|m| rate >= m);
            if self.rises_left > 0 && !at_cap {
                let up = round_rate(rate as f64 * self.factor).max(rate + 1);
                self.next = Some((self.max_rate.map_or(up, |m| up.min(m)), Phase::Rise));
            }
            return;
        }
        // Bisect while there is a gap worth a step: more than 1 % of the rate that held.
        if let (Some(good), Some(bad)) = (self.good, self.bad) {
            if self.refines_left > 0 && bad > good + (good / 100).max(1) {
                let mid = round_rate((good + bad) as f64 / 2.0);
                if mid > good && mid < bad {
                    self.next = Some((mid, Phase::Refine));
                }
            }
        }
    }
}

/// A step's verdict on one objective.
#[derive(Clone, Debug, Serialize)]
pub struct SloValue {
    pub label: String,
    pub quantile: f64,
    pub limit_ns: u64,
    pub value_ns: u64,
    pub held: bool,
}

/// What `summary.json` says about one step.
#[derive(Debug, Serialize)]
pub struct StepReport {
    pub step: usize,
    pub shards: u32,
    pub phase: Phase,
    /// Tags this step's intervals in the `.hlog` files.
    pub tag: String,
    pub offered_rate: u64,
    /// Acks completed in the window, per second.
    pub achieved_rate: f64,
    /// Messages whose intended send time fell in the window, per second.
    pub put_rate: f64,
    pub held: bool,
    /// Why it broke (empty when it held).
    pub broke: Vec<String>,
    pub slos: Vec<SloValue>,
    pub histograms: Vec<HistSummary>,
    pub accounting: Accounting,
    pub process: ProcessStats,
}

/// A step's report, its histograms (by name) and its interval log.
pub struct StepRecord {
    pub report: StepReport,
    pub recorders: Vec<(String, Recorder)>,
    pub intervals: Option<IntervalLog>,
}

/// What the sweep found for one shard count.
#[derive(Debug, Serialize)]
pub struct MaxRate {
    pub shards: u32,
    /// The highest offered rate that held, if any did.
    pub max_sustainable_rate: Option<u64>,
    /// What the broker achieved at that rate.
    pub achieved_rate: Option<f64>,
    /// The lowest offered rate that broke, if any did.
    pub first_broken_rate: Option<u64>,
}

pub fn run(args: &SweepArgs) -> Result<SweepRun, String> {
    step::validate(&args.workload, Some(args.start_rate), args.step_duration)?;
    if args.shards.is_empty() {
        return Err("--shards needs at least one shard count".into());
    }
    let storage = Storage::new(&args.workload.storage)?;
    let per_step = args.step_warmup + args.step_duration;
    let progress = Progress::new(per_step * args.shards.len() as u32, args.output.quiet);
    let mut steps: Vec<StepRecord> = Vec::new();
    let mut found = Vec::new();
    'shard_counts: for &shards in &args.shards {
        let mut ramp = Ramp::new(
            args.start_rate,
            args.step_factor,
            args.refine,
            args.max_steps,
            args.max_rate,
        );
        while let Some((rate, phase)) = ramp.next() {
            let number = steps.len() + 1;
            progress.set_prefix(format!("step {number}: {shards} shard(s) "));
            let tag = step_tag(number, shards, rate);
            let out = run_step(
                &Step {
                    workload: &args.workload,
                    shards,
                    rate: Some(rate),
                    warmup: args.step_warmup,
                    duration: args.step_duration,
                    hlog_interval: args.output.out.as_ref().map(|_| args.output.hlog_interval),
                    storage: &storage,
                    label: &tag,
                },
                &progress,
            )?;
            let record = judge(args, number, tag, shards, rate, phase, out);
            ramp.record(record.report.held);
            let lost = !record.report.accounting.ok;
            steps.push(record);
            if lost {
                break 'shard_counts;
            }
        }
        let achieved_rate = ramp.good.and_then(|good| {
            steps
                .iter()
                .find(|s| s.report.shards == shards && s.report.offered_rate == good)
                .map(|s| s.report.achieved_rate)
        });
        found.push(MaxRate {
            shards,
            max_sustainable_rate: ramp.good,
            achieved_rate,
            first_broken_rate: ramp.bad,
        });
    }
    progress.finish();
    Ok(SweepRun::new(args, &storage, steps, found))
}

/// Tags a step's intervals in the `.hlog` files, names its `.hgrm` files and its data dir.
fn step_tag(number: usize, shards: u32, rate: u64) -> String {
    format!("step{number:02}-shards{shards}-rate{rate}")
}

/// The value of `hist` at an objective's quantile (its max for `max`).
fn value_at(hist: &Recorder, quantile: f64) -> u64 {
    let h = hist.histogram();
    if h.is_empty() {
        0
    } else if quantile >= 1.0 {
        h.max()
    } else {
        h.value_at_quantile(quantile)
    }
}

/// Latency as the table writes it: µs below a millisecond, ms above.
pub fn latency_text(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.1}µs", ns as f64 / 1e3)
    }
}

/// The histogram the objectives apply to: its name and how the table writes it.
pub(crate) fn slo_histogram(args: &SweepArgs) -> (&'static str, &'static str) {
    let name = args.slo_on.histogram();
    let (_, text) = HISTOGRAMS
        .iter()
        .find(|h| h.0 == name)
        .expect("every --slo-on value names a histogram of the step");
    (name, text)
}

/// Each SLO of the sweep held against the judged histogram; one that broke says so in
/// `broke`.
fn judge_slos(args: &SweepArgs, judged: &Recorder, broke: &mut Vec<String>) -> Vec<SloValue> {
    args.slos
        .iter()
        .map(|slo| {
            let value_ns = value_at(judged, slo.quantile);
            let limit_ns = step_nanos(slo.limit);
            let held = value_ns <= limit_ns && judged.count() > 0;
            if !held {
                broke.push(format!(
                    "{} {} > {}",
                    slo.label,
                    latency_text(value_ns),
                    format_duration(slo.limit)
                ));
            }
            SloValue {
                label: slo.label.clone(),
                quantile: slo.quantile,
                limit_ns,
                value_ns,
                held,
            }
        })
        .collect()
}

/// Decides whether a step held, and why not.
fn judge(
    args: &SweepArgs,
    number: usize,
    tag: String,
    shards: u32,
    rate: u64,
    phase: Phase,
    out: StepOutcome,
) -> StepRecord {
    let window = args.step_duration;
    let achieved = out.achieved_rate(window);
    let mut broke = Vec::new();
    let (recorders, histograms) = step::named(out.recorders);
    let (slo_name, slo_text) = slo_histogram(args);
    let judged = &recorders
        .iter()
        .find(|(name, _)| name == slo_name)
        .expect("--slo-on names a histogram of the step")
        .1;
    let slos = judge_slos(args, judged, &mut broke);
    if judged.count() == 0 {
        broke.push(format!("no {slo_text} latency measured"));
    }
    let short = 1.0 - achieved / rate as f64;
    if short > args.max_shortfall {
        broke.push(format!(
            "achieved {}/s, {:.0}% short",
            thousands(achieved.round() as u64),
            short * 100.0
        ));
    }
    if !out.accounting.ok {
        broke.push("the end-of-run check failed".into());
    }
    let mut intervals = out.intervals;
    if let Some(log) = &mut intervals {
        log.set_tag(&tag);
    }
    StepRecord {
        report: StepReport {
            step: number,
            shards,
            phase,
            tag,
            offered_rate: rate,
            achieved_rate: achieved,
            put_rate: out.put_in_window as f64 / window.as_secs_f64(),
            held: broke.is_empty(),
            broke,
            slos,
            histograms,
            accounting: out.accounting,
            process: out.process,
        },
        recorders,
        intervals,
    }
}

fn step_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a ramp against a broker that holds every rate up to `capacity`.
    fn offered(mut ramp: Ramp, capacity: u64) -> (Vec<(u64, Phase)>, Ramp) {
        let mut rates = Vec::new();
        while let Some((rate, phase)) = ramp.next() {
            rates.push((rate, phase));
            ramp.record(rate <= capacity);
            assert!(rates.len() < 100, "the ramp never ends");
        }
        (rates, ramp)
    }

    #[test]
    fn rises_until_a_break_then_bisects() {
        let (rates, ramp) = offered(Ramp::new(50_000, 1.5, 2, 20, None), 130_000);
        use Phase::*;
        assert_eq!(
            rates,
            [
                (50_000, Rise),
                (75_000, Rise),
                (113_000, Rise),
                (170_000, Rise),
                (142_000, Refine),
                (128_000, Refine),
            ]
        );
        assert_eq!((ramp.good, ramp.bad), (Some(128_000), Some(142_000)));
    }

    #[test]
    fn stops_at_max_steps_and_max_rate_without_a_break() {
        let (rates, ramp) = offered(Ramp::new(1000, 2.0, 3, 3, None), u64::MAX);
        assert_eq!(
            rates.iter().map(|r| r.0).collect::<Vec<_>>(),
            [1000, 2000, 4000]
        );
        assert_eq!((ramp.good, ramp.bad), (Some(4000), None));
        let (rates, _) = offered(Ramp::new(1000, 2.0, 3, 10, Some(5000)), u64::MAX);
        assert_eq!(
            rates.iter().map(|r| r.0).collect::<Vec<_>>(),
            [1000, 2000, 4000, 5000]
        );
    }

    #[test]
    fn a_first_step_that_breaks_leaves_nothing_sustainable() {
        let (rates, ramp) = offered(Ramp::new(50_000, 1.5, 2, 20, None), 10_000);
        assert_eq!(rates, [(50_000, Phase::Rise)]);
        assert_eq!((ramp.good, ramp.bad), (None, Some(50_000)));
    }

    #[test]
    fn refining_stops_when_the_gap_is_small() {
        let (rates, ramp) = offered(Ramp::new(100_000, 1.01, 10, 20, None), 100_500);
        assert_eq!(rates.len(), 2, "{rates:?}");
        assert_eq!((ramp.good, ramp.bad), (Some(100_000), Some(101_000)));
    }

    #[test]
    fn rates_round_to_three_digits() {
        assert_eq!(round_rate(112_500.0), 113_000);
        assert_eq!(round_rate(1_234_567.0), 1_230_000);
        assert_eq!(round_rate(999.4), 999);
        assert_eq!(round_rate(0.2), 1);
    }
}
