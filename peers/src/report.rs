//! The table on stdout (one line per broker: the median of its runs), a line per run on
//! stderr, and the optional JSON file.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::harness::RunResult;

#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub producers: usize,
    pub consumers: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub max_in_flight: u64,
    pub runs: usize,
    pub leasemq_shards: usize,
    pub prefetch: u16,
    pub body_bytes: usize,
}

/// Each column's median over one broker's runs (taken column by column).
#[derive(Clone, Debug, Serialize)]
pub struct Median {
    pub broker: String,
    pub runs: usize,
    pub acked_per_s: f64,
    pub put_to_ack_p50_us: f64,
    pub put_to_ack_p99_us: f64,
    pub put_to_ack_p999_us: f64,
    pub client_cpu_cores: f64,
    pub broker_cpu_cores: Option<f64>,
    /// Client plus broker CPU per message acked in the window.
    pub cpu_us_per_msg: f64,
    pub runs_failing_check: usize,
}

pub fn print_header(config: &Config) {
    println!(
        "# {}P/{}C, {} B bodies, one message per call, in flight <= {}, warm-up {} s, window {} s, {} run(s), median per column",
        config.producers,
        config.consumers,
        config.body_bytes,
        config.max_in_flight,
        config.warmup_s,
        config.duration_s,
        config.runs,
    );
    println!(
        "{:<11} {:>10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}  check",
        "broker",
        "acked/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "client cpu",
        "broker cpu",
        "cpu µs/msg"
    );
}

pub fn print_run(run: usize, r: &RunResult) {
    eprintln!(
        "  {} run {run}: {:.0} acked/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, client cpu {:.2} s, broker cpu {}, put {} acked {} {}",
        r.broker,
        r.acked_per_s,
        r.put_to_ack_p50_us,
        r.put_to_ack_p99_us,
        r.put_to_ack_p999_us,
        r.client_cpu_s,
        r.broker_cpu_s.map_or("in-process".to_string(), |s| format!("{s:.2} s")),
        r.total_put,
        r.total_acked,
        r.problem.as_deref().unwrap_or("ok"),
    );
}

pub fn print_median(results: &[RunResult]) {
    let m = median(results);
    let check = match m.runs_failing_check {
        0 => "ok: every message put acked exactly once".to_string(),
        n => format!("FAILED in {n} of {} runs", m.runs),
    };
    println!(
        "{:<11} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>10.2} {:>10} {:>9.1}  {check}",
        m.broker,
        m.acked_per_s,
        m.put_to_ack_p50_us,
        m.put_to_ack_p99_us,
        m.put_to_ack_p999_us,
        m.client_cpu_cores,
        m.broker_cpu_cores
            .map_or("in-proc".to_string(), |c| format!("{c:.2}")),
        m.cpu_us_per_msg,
    );
}

pub fn median(results: &[RunResult]) -> Median {
    assert!(!results.is_empty(), "a broker with no runs");
    let of = |f: &dyn Fn(&RunResult) -> f64| median_of(results.iter().map(f).collect());
    let broker_cpu = results[0].broker_cpu_s.is_some();
    Median {
        broker: results[0].broker.clone(),
        runs: results.len(),
        acked_per_s: of(&|r| r.acked_per_s),
        put_to_ack_p50_us: of(&|r| r.put_to_ack_p50_us),
        put_to_ack_p99_us: of(&|r| r.put_to_ack_p99_us),
        put_to_ack_p999_us: of(&|r| r.put_to_ack_p999_us),
        client_cpu_cores: of(&|r| r.client_cpu_s / r.window_s),
        broker_cpu_cores: broker_cpu
            .then(|| of(&|r| r.broker_cpu_s.unwrap_or_default() / r.window_s)),
        cpu_us_per_msg: of(&|r| {
            let cpu_s = r.client_cpu_s + r.broker_cpu_s.unwrap_or_default();
            cpu_s * 1e6 / r.acked_in_window.max(1) as f64
        }),
        runs_failing_check: results.iter().filter(|r| r.problem.is_some()).count(),
    }
}

fn median_of(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

pub fn write_json(path: &Path, config: &Config, runs: &[RunResult]) -> Result<()> {
    let mut brokers: Vec<&str> = runs.iter().map(|r| r.broker.as_str()).collect();
    brokers.dedup();
    let medians: Vec<Median> = brokers
        .iter()
        .map(|b| {
            median(
                &runs
                    .iter()
                    .filter(|r| r.broker == *b)
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let json = serde_json::json!({ "config": config, "runs": runs, "medians": medians });
    std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median_of(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_of(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
