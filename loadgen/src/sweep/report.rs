//! The sweep's results: its table, `summary.json` with every step, the per-step `.hgrm`
//! files, the `.hlog` interval logs (one per histogram, each step's intervals tagged with
//! the step) and `sweep.svg`.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;

use super::{latency_text, slo_histogram, MaxRate, StepRecord, StepReport};
use crate::cli::{format_duration, SweepArgs};
use crate::hist::HGRM_UNIT;
use crate::intervals::{write_hlogs, IntervalLog};
use crate::plot::{self, SweepLine};
use crate::report::{load_average, thousands, write_hgrm_file, write_json, Accounting};
use crate::storage::Storage;
use crate::throughput::{workload_json, workload_text};

/// An objective, as `summary.json` gives it.
#[derive(Debug, Serialize)]
pub struct SloSpec {
    pub label: String,
    pub quantile: f64,
    pub limit_ns: u64,
}

/// Everything a sweep reports; `summary.json` is this, serialised.
#[derive(Debug, Serialize)]
pub struct SweepSummary {
    pub tool: &'static str,
    pub version: &'static str,
    pub command: &'static str,
    pub title: String,
    pub config: serde_json::Value,
    /// On the latency `config.slo_on` names, from each message's intended send time.
    pub slos: Vec<SloSpec>,
    pub steps: Vec<StepReport>,
    pub max_sustainable: Vec<MaxRate>,
    /// Every step's end-of-run check, added up.
    pub accounting: Accounting,
    pub load_average: Option<[f64; 3]>,
    pub hgrm_unit: &'static str,
    pub plots: Vec<String>,
    pub notes: Vec<String>,
}

/// What `sweep` hands back.
pub struct SweepRun {
    pub summary: SweepSummary,
    recorders: Vec<Vec<(String, crate::hist::Recorder)>>,
    intervals: Vec<IntervalLog>,
    max_shortfall: f64,
    /// The histogram the objectives apply to, and how it reads ("put→ack").
    slo_on: (&'static str, &'static str),
}

/// The sweep's flags, for `summary.json`.
fn sweep_json(args: &SweepArgs, storage: &Storage, slo_on: &str) -> serde_json::Value {
    let mut config = workload_json(&args.workload);
    config["shards"] = serde_json::json!(args.shards);
    config["start_rate"] = serde_json::json!(args.start_rate);
    config["step_factor"] = serde_json::json!(args.step_factor);
    config["refine"] = serde_json::json!(args.refine);
    config["max_steps"] = serde_json::json!(args.max_steps);
    config["max_rate"] = serde_json::json!(args.max_rate);
    config["max_shortfall"] = serde_json::json!(args.max_shortfall);
    config["step_duration_s"] = serde_json::json!(args.step_duration.as_secs_f64());
    config["step_warmup_s"] = serde_json::json!(args.step_warmup.as_secs_f64());
    config["slo_on"] = serde_json::json!(slo_on);
    storage.add_to(&mut config);
    config
}

impl SweepRun {
    pub(super) fn new(
        args: &SweepArgs,
        storage: &Storage,
        steps: Vec<StepRecord>,
        found: Vec<MaxRate>,
    ) -> Self {
        let mut reports = Vec::with_capacity(steps.len());
        let mut recorders = Vec::with_capacity(steps.len());
        let mut intervals = Vec::new();
        for s in steps {
            reports.push(s.report);
            recorders.push(s.recorders);
            intervals.extend(s.intervals);
        }
        let accounting = add_up(&reports);
        let slo_text: Vec<String> = args.slos.iter().map(|s| s.to_string()).collect();
        let slo_on = slo_histogram(args);
        let storage_text = storage.text().map_or(String::new(), |t| format!("; {t}"));
        let title = format!(
            "{}{storage_text}; open loop from {}/s, ×{} a step, {} refining step(s); each step \
             {} measured after {} warm-up; SLO on {} from intended send time: {}",
            workload_text(&args.workload),
            thousands(args.start_rate),
            args.step_factor,
            args.refine,
            format_duration(args.step_duration),
            format_duration(args.step_warmup),
            slo_on.1,
            slo_text.join(", ")
        );
        let config = sweep_json(args, storage, slo_on.0);
        let mut notes = storage.notes();
        for m in &found {
            if m.max_sustainable_rate.is_none() && m.first_broken_rate.is_some() {
                notes.push(format!(
                    "{} shard(s): the first step already broke; try a lower --start-rate",
                    m.shards
                ));
            }
        }
        SweepRun {
            summary: SweepSummary {
                tool: "leasemq-loadgen",
                version: env!("CARGO_PKG_VERSION"),
                command: "sweep",
                title,
                config,
                slos: args
                    .slos
                    .iter()
                    .map(|s| SloSpec {
                        label: s.label.clone(),
                        quantile: s.quantile,
                        limit_ns: u64::try_from(s.limit.as_nanos()).unwrap_or(u64::MAX),
                    })
                    .collect(),
                steps: reports,
                max_sustainable: found,
                accounting,
                load_average: load_average(),
                hgrm_unit: HGRM_UNIT,
                plots: Vec::new(),
                notes,
            },
            recorders,
            intervals,
            max_shortfall: args.max_shortfall,
            slo_on,
        }
    }

    /// The table printed on stdout.
    pub fn table(&self) -> String {
        let s = &self.summary;
        let mut t = String::new();
        let _ = writeln!(t, "sweep: {}\n", s.title);
        let _ = writeln!(
            t,
            "{:>4} {:>6} {:>12} {:>12} {:>10} {:>10} {:>10}  held",
            "step", "shards", "offered/s", "achieved/s", "p50 µs", "p99 µs", "p99.9 µs"
        );
        for r in &s.steps {
            let judged = r
                .histograms
                .iter()
                .find(|h| h.name == self.slo_on.0)
                .expect("every step has the judged histogram");
            let held = if r.held {
                "yes".to_string()
            } else {
                format!("no: {}", r.broke.join("; "))
            };
            let _ = writeln!(
                t,
                "{:>4} {:>6} {:>12} {:>12} {:>10.1} {:>10.1} {:>10.1}  {held}",
                r.step,
                r.shards,
                thousands(r.offered_rate),
                thousands(r.achieved_rate.round() as u64),
                judged.p50 as f64 / 1e3,
                judged.p99 as f64 / 1e3,
                judged.p99_9 as f64 / 1e3,
            );
        }
        let _ = writeln!(
            t,
            "\nmax sustainable rate (every SLO held, acks within {:.0}% of the offered rate):",
            self.max_shortfall * 100.0
        );
        for m in &s.max_sustainable {
            let _ = writeln!(t, "  {:>3} shard(s): {}", m.shards, max_rate_text(m));
        }
        let a = &s.accounting;
        let _ = writeln!(
            t,
            "\naccounting, all steps: put {} = acked {} + still queued {} + dead-lettered {} + \
             dropped {} + lost {}; acked twice {}: {}",
            thousands(a.put),
            thousands(a.acked),
            thousands(a.still_queued),
            thousands(a.dead_lettered),
            thousands(a.dropped),
            thousands(a.lost),
            thousands(a.double_acked),
            if a.ok { "OK" } else { "FAILED" }
        );
        for p in &a.problems {
            let _ = writeln!(t, "  problem: {p}");
        }
        if let Some([a1, a5, a15]) = s.load_average {
            let _ = writeln!(t, "load average: {a1:.2} {a5:.2} {a15:.2}");
        }
        for n in &s.notes {
            let _ = writeln!(t, "note: {n}");
        }
        t
    }

    /// Writes the per-step `.hgrm` files (under `steps/`), the `.hlog` files, `sweep.svg`
    /// and `summary.json` into `dir`.
    pub fn write_out(&mut self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir.join("steps"))?;
        for (report, recorders) in self.summary.steps.iter_mut().zip(&self.recorders) {
            for ((name, rec), h) in recorders.iter().zip(&mut report.histograms) {
                let file = format!("steps/{}.{name}.hgrm", report.tag);
                write_hgrm_file(&dir.join(&file), rec)?;
                h.hgrm = Some(file);
            }
        }
        let logs: Vec<&IntervalLog> = self.intervals.iter().collect();
        for (name, file) in write_hlogs(dir, &logs)? {
            for h in self
                .summary
                .steps
                .iter_mut()
                .flat_map(|r| &mut r.histograms)
            {
                if h.name == name {
                    h.hlog = Some(file.clone());
                }
            }
        }
        let (lines, slos) = self.plot_lines();
        let title = format!("sweep: {} latency against achieved rate", self.slo_on.1);
        plot::sweep(&dir.join("sweep.svg"), &title, self.slo_on.1, &lines, &slos)
            .map_err(io::Error::other)?;
        self.summary.plots = vec!["sweep.svg".to_string()];
        write_json(&dir.join("summary.json"), &self.summary)
    }

    /// One line per shard count and objective, points in the order of offered rate.
    fn plot_lines(&self) -> (Vec<SweepLine>, Vec<(String, f64)>) {
        let s = &self.summary;
        let slos: Vec<(String, f64)> = s
            .slos
            .iter()
            .map(|slo| {
                (
                    format!("{} = {}", slo.label, latency_text(slo.limit_ns)),
                    slo.limit_ns as f64,
                )
            })
            .collect();
        let mut lines = Vec::new();
        for (group, m) in s.max_sustainable.iter().enumerate() {
            let mut steps: Vec<&StepReport> =
                s.steps.iter().filter(|r| r.shards == m.shards).collect();
            steps.sort_by_key(|r| r.offered_rate);
            for (i, slo) in s.slos.iter().enumerate() {
                lines.push(SweepLine {
                    label: format!("{} shard(s), {}", m.shards, slo.label),
                    group,
                    slo: i,
                    points: steps
                        .iter()
                        .map(|r| (r.achieved_rate, r.slos[i].value_ns as f64, r.held))
                        .collect(),
                });
            }
        }
        (lines, slos)
    }
}

fn max_rate_text(m: &MaxRate) -> String {
    match (m.max_sustainable_rate, m.first_broken_rate) {
        (Some(good), bad) => {
            let achieved = m.achieved_rate.map_or(String::new(), |a| {
                format!(" (achieved {}/s)", thousands(a.round() as u64))
            });
            let broke = match bad {
                Some(b) => format!("; first break at {}/s", thousands(b)),
                None => "; no step broke (raise --max-steps or --max-rate)".to_string(),
            };
            format!("{} messages/s{achieved}{broke}", thousands(good))
        }
        (None, Some(bad)) => format!("none: the first step, {}/s, broke", thousands(bad)),
        (None, None) => "none: the sweep stopped before this shard count".to_string(),
    }
}

/// Every step's check, added up; the problems say which step they came from.
fn add_up(steps: &[StepReport]) -> Accounting {
    let mut total = Accounting::default();
    for s in steps {
        let a = &s.accounting;
        total.put += a.put;
        total.acked += a.acked;
        total.still_queued += a.still_queued;
        total.dead_lettered += a.dead_lettered;
        total.dropped += a.dropped;
        total.redelivered += a.redelivered;
        total.expired += a.expired;
        total.stale += a.stale;
        total.double_acked += a.double_acked;
        total.lost += a.lost;
        total
            .problems
            .extend(a.problems.iter().map(|p| format!("step {}: {p}", s.step)));
    }
    total.ok = total.problems.is_empty() && steps.iter().all(|s| s.accounting.ok);
    total
}
