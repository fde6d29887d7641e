//! The results of a run: the summary table on stdout, `summary.json`, the `.hgrm` and `.hlog`
//! files and `latency.svg`; the end-of-run check; and the process figures (CPU time, peak
//! RSS) read from `/proc/self`.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use leasemq::QueueStats;
use serde::Serialize;

use crate::common::Ledger;
use crate::cpu::CpuTime;
use crate::hist::{write_hgrm, HistSummary, Recorder, HGRM_SCALE, HGRM_UNIT};
use crate::intervals::{write_hlogs, IntervalLog};
use crate::plot;

/// Everything a run reports; `summary.json` is this, serialised.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub tool: &'static str,
    pub version: &'static str,
    pub command: &'static str,
    /// One line saying what ran.
    pub title: String,
    pub config: serde_json::Value,
    /// The length of the measured window, in seconds.
    pub measured_seconds: f64,
    pub rates: Vec<Rate>,
    pub histograms: Vec<HistSummary>,
    /// Counts that only this subcommand has.
    pub details: Vec<Detail>,
    pub accounting: Accounting,
    pub process: ProcessStats,
    /// The 1, 5 and 15 minute load averages at the end of the run.
    pub load_average: Option<[f64; 3]>,
    /// How the broker's threads judged the host (`leasemq::host_load`), when they waited.
    pub host: Option<HostSeen>,
    /// The share of requests that blocking callers handled themselves while the shard
    /// thread slept (`leasemq::CallerTurns`), for runs that counted them.
    pub caller_turn_share: Option<f64>,
    /// The unit of the values in the `.hgrm` files (summary.json values are nanoseconds).
    pub hgrm_unit: &'static str,
    /// The plots written beside `summary.json`.
    pub plots: Vec<String>,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Rate {
    pub name: String,
    pub per_second: f64,
    /// How many in the measured window.
    pub total: u64,
}

impl Rate {
    /// `total` counted in a window of `seconds`.
    pub fn new(name: &str, total: u64, seconds: f64) -> Rate {
        Rate {
            name: name.into(),
            per_second: total as f64 / seconds,
            total,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Detail {
    pub name: String,
    pub value: serde_json::Value,
}

impl Detail {
    pub fn new(name: &str, value: impl Into<serde_json::Value>) -> Detail {
        Detail {
            name: name.to_string(),
            value: value.into(),
        }
    }
}

/// The end-of-run check: every message put was acked exactly once or is accounted for.
#[derive(Debug, Default, Serialize)]
pub struct Accounting {
    pub put: u64,
    /// Messages acked (each counted once).
    pub acked: u64,
    /// Ready, delayed or leased at the end.
    pub still_queued: u64,
    pub dead_lettered: u64,
    pub dropped: u64,
    /// Deliveries with attempt > 1.
    pub redelivered: u64,
    pub expired: u64,
    /// Settles and touches the broker answered `false` (expected only for expired leases).
    pub stale: u64,
    /// Messages acked more than once.
    pub double_acked: u64,
    /// Put, but neither acked nor anywhere in the broker.
    pub lost: u64,
    pub ok: bool,
    pub problems: Vec<String>,
}

impl Accounting {
    /// Fills `lost` and `ok` from the counts and any problems already noted.
    pub fn conclude(&mut self) {
        let accounted = self.acked + self.still_queued + self.dead_lettered + self.dropped;
        self.lost = self.put.saturating_sub(accounted);
        if self.lost > 0 {
            self.problems.insert(
                0,
                format!(
                    "{} message(s) lost: put {} but acked {} + still queued {} + dead-lettered {} + dropped {}",
                    self.lost, self.put, self.acked, self.still_queued, self.dead_lettered, self.dropped
                ),
            );
        }
        if self.double_acked > 0 {
            self.problems.push(format!(
                "{} message(s) acked more than once",
                self.double_acked
            ));
        }
        self.ok = self.problems.is_empty();
    }

    /// The end-of-run check: ticks every producer's sequence numbers off in the consumers'
    /// ledger, holds both against the queues' counters (`stats`, summed over the run's
    /// queues), and concludes.
    pub fn check(seen: Seen, stats: &QueueStats) -> Accounting {
        let mut problems = seen.problems;
        let mut acked = 0;
        let mut never_put = 0;
        for (producer, &n) in seen.put.iter().enumerate() {
            let (missing, beyond) = seen.ledger.check(producer, n);
            acked += n - missing;
            never_put += beyond;
        }
        let put = seen.put.iter().sum();
        if never_put > 0 {
            problems.push(format!("{never_put} acked message(s) were never put"));
        }
        if stats.enqueued != put {
            problems.push(format!(
                "the queues enqueued {} messages but {put} were put",
                stats.enqueued
            ));
        }
        if stats.acked != seen.acked {
            problems.push(format!(
                "the queues counted {} acks but the consumers saw {} succeed",
                stats.acked, seen.acked
            ));
        }
        let mut accounting = Accounting {
            put,
            acked,
            still_queued: (stats.ready + stats.delayed + stats.leased) as u64,
            dead_lettered: stats.dead_lettered,
            dropped: stats.dropped,
            redelivered: seen.redelivered,
            expired: stats.expired,
            stale: stats.stale,
            double_acked: seen.ledger.doubles,
            problems,
            ..Accounting::default()
        };
        accounting.conclude();
        accounting
    }
}

/// What the producers and consumers of a run saw, for the end-of-run check.
pub struct Seen<'a> {
    /// How many messages each producer put, indexed by the producer number that their
    /// sequence numbers carry.
    pub put: &'a [u64],
    /// Which sequence numbers were acked: every consumer's ledger, merged.
    pub ledger: &'a Ledger,
    /// Acks that succeeded, as the consumers counted them.
    pub acked: u64,
    /// Deliveries with attempt > 1.
    pub redelivered: u64,
    /// What went wrong during the run.
    pub problems: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct ProcessStats {
    /// CPU time of the whole process (broker shards included) during the measured window.
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub cpu_s: f64,
    /// cpu_s / measured_seconds.
    pub cores_busy: f64,
    pub cpu_ns_per_message: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub bytes_per_queued_message: Option<f64>,
}

impl ProcessStats {
    /// The process figures of a window of `seconds` in which `messages` were handled: the
    /// CPU time the process used between `start` and `end`, and the peak RSS so far.
    pub fn over_window(start: CpuTime, end: CpuTime, seconds: f64, messages: u64) -> ProcessStats {
        let cpu_user_s = end.user_s - start.user_s;
        let cpu_sys_s = end.sys_s - start.sys_s;
        let cpu_s = cpu_user_s + cpu_sys_s;
        ProcessStats {
            cpu_user_s,
            cpu_sys_s,
            cpu_s,
            cores_busy: if seconds > 0.0 { cpu_s / seconds } else { 0.0 },
            cpu_ns_per_message: (messages > 0).then(|| cpu_s * 1e9 / messages as f64),
            peak_rss_bytes: status_kib("VmHWM").map(|k| k * 1024),
            bytes_per_queued_message: None,
        }
    }
}

/// The CPU time of this whole process so far (broker shards included); zero when `/proc`
/// cannot be read.
pub fn cpu_now() -> CpuTime {
    CpuTime::of_process(std::process::id()).unwrap_or_default()
}

/// The resident set now (`VmRSS`), in bytes; zero when `/proc` cannot be read.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS").unwrap_or(0) * 1024
}

/// A `kB` field of `/proc/self/status` (VmRSS, VmHWM), in KiB.
fn status_kib(field: &str) -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

pub fn load_average() -> Option<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// What the broker's sampler saw of the host over the process's life: how many of its
/// windows counted the host as busy (the broker's threads then park instead of yielding),
/// and the foreign load and idle cores of the last window.
#[derive(Debug, Serialize)]
pub struct HostSeen {
    pub windows: u64,
    pub busy_windows: u64,
    pub foreign_cores: f64,
    pub idle_cores: f64,
    pub active_participants: usize,
}

/// The broker's view of the host, once its sampler has looked at least once.
pub fn host_seen() -> Option<HostSeen> {
    let load = leasemq::host_load();
    (load.windows > 0).then_some(HostSeen {
        windows: load.windows,
        busy_windows: load.busy_windows,
        foreign_cores: load.foreign_cores,
        idle_cores: load.idle_cores,
        active_participants: load.active_participants,
    })
}

/// The requests handled by shard threads and by callers, over every broker of the run
/// (`leasemq::Broker::turn_stats`), noted before each shuts down.
static TURNS: std::sync::Mutex<leasemq::TurnStats> = std::sync::Mutex::new(leasemq::TurnStats {
    shard_threads: 0,
    callers: 0,
});

/// Adds `broker`'s turn counts to the run's.
pub fn note_turns(broker: &leasemq::Broker) {
    let seen = broker.turn_stats();
    let mut turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    turns.shard_threads += seen.shard_threads;
    turns.callers += seen.callers;
}

/// The share of the run's requests that callers handled in turns they ran for a sleeping
/// shard, once any request was counted.
pub fn caller_turn_share() -> Option<f64> {
    let turns = *TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let all = turns.shard_threads + turns.callers;
    (all > 0).then(|| turns.callers as f64 / all as f64)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    // The first group holds 1 to 3 digits, every later one 3.
    let first = (digits.len() + 2) % 3 + 1;
    for (i, c) in digits.chars().enumerate() {
        if i >= first && (i - first).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn micros(ns: f64) -> String {
    let us = ns / 1_000.0;
    if us >= 100_000.0 {
        format!("{us:.0}")
    } else {
        format!("{us:.1}")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The table printed on stdout.
pub fn table(s: &Summary) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "{}: {}", s.command, s.title);
    let _ = writeln!(t);
    let _ = writeln!(t, "{:<22} {:>14} {:>14}", "rate", "per second", "in window");
    for r in &s.rates {
        let _ = writeln!(
            t,
            "  {:<20} {:>14} {:>14}",
            r.name,
            thousands(r.per_second.round() as u64),
            thousands(r.total)
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<22} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    for h in &s.histograms {
        let _ = writeln!(
            t,
            "  {:<20} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            h.description,
            h.count,
            micros(h.p50 as f64),
            micros(h.p90 as f64),
            micros(h.p99 as f64),
            micros(h.p99_9 as f64),
            micros(h.max as f64),
            micros(h.mean)
        );
    }
    if !s.details.is_empty() {
        let _ = writeln!(t);
        for d in &s.details {
            let _ = writeln!(t, "  {:<38} {}", d.name, d.value);
        }
    }
    write_accounting(&mut t, &s.accounting);
    write_process_and_host(&mut t, s);
    for n in &s.notes {
        let _ = writeln!(t, "note: {n}");
    }
    t
}

/// The accounting lines of the table: where every message put went, and what went wrong.
fn write_accounting(t: &mut String, a: &Accounting) {
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "accounting: put {} = acked {} + still queued {} + dead-lettered {} + dropped {} + lost {}",
        thousands(a.put),
        thousands(a.acked),
        thousands(a.still_queued),
        thousands(a.dead_lettered),
        thousands(a.dropped),
        thousands(a.lost)
    );
    let _ = writeln!(
        t,
        "            redelivered {}, expired {}, stale settles {}, acked twice {}: {}",
        thousands(a.redelivered),
        thousands(a.expired),
        thousands(a.stale),
        thousands(a.double_acked),
        if a.ok { "OK" } else { "FAILED" }
    );
    for p in &a.problems {
        let _ = writeln!(t, "  problem: {p}");
    }
}

/// The process, load average, host and turns lines of the table.
fn write_process_and_host(t: &mut String, s: &Summary) {
    let p = &s.process;
    let mut line = format!(
        "process: cpu {:.2} s (user {:.2}, sys {:.2}) = {:.2} cores",
        p.cpu_s, p.cpu_user_s, p.cpu_sys_s, p.cores_busy
    );
    if let Some(ns) = p.cpu_ns_per_message {
        let _ = write!(line, ", {ns:.0} ns per message");
    }
    if let Some(rss) = p.peak_rss_bytes {
        let _ = write!(line, "; peak RSS {}", mib(rss));
    }
    if let Some(b) = p.bytes_per_queued_message {
        let _ = write!(line, "; {b:.0} bytes per leased message");
    }
    let _ = writeln!(t, "{line}");
    if let Some([a1, a5, a15]) = s.load_average {
        let _ = writeln!(t, "load average: {a1:.2} {a5:.2} {a15:.2}");
    }
    if let Some(h) = &s.host {
        let _ = writeln!(
            t,
            "host: judged busy (waits park, shards on short slices) in {} of {} windows of {} ms; \
             last window: foreign load {:.2} cores, {:.2} idle, {} active threads of the \
             broker's",
            h.busy_windows,
            h.windows,
            leasemq::HOST_SAMPLE_EVERY.as_millis(),
            h.foreign_cores,
            h.idle_cores,
            h.active_participants
        );
    }
    if let Some(share) = s.caller_turn_share {
        let _ = writeln!(
            t,
            "turns: {:.1} % of the requests handled by their callers while the shard slept",
            share * 100.0
        );
    }
}

/// Writes one `.hgrm` per histogram, their interval logs (`.hlog`) when the run kept them,
/// `latency.svg` and `summary.json` into `dir`, naming each file in the summary.
pub fn write_out(
    dir: &Path,
    summary: &mut Summary,
    recorders: &[(String, Recorder)],
    intervals: Option<&IntervalLog>,
) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    for (name, rec) in recorders {
        let file = format!("{name}.hgrm");
        write_hgrm_file(&dir.join(&file), rec)?;
        if let Some(h) = summary.histograms.iter_mut().find(|h| &h.name == name) {
            h.hgrm = Some(file);
        }
    }
    if let Some(log) = intervals {
        for (name, file) in write_hlogs(dir, &[log])? {
            if let Some(h) = summary.histograms.iter_mut().find(|h| h.name == name) {
                h.hlog = Some(file);
            }
        }
    }
    let labelled: Vec<(String, &hdrhistogram::Histogram<u64>)> = recorders
        .iter()
        .map(|(name, rec)| {
            let label = summary
                .histograms
                .iter()
                .find(|h| &h.name == name)
                .map_or(name.as_str(), |h| h.description.as_str());
            (label.to_string(), rec.histogram())
        })
        .collect();
    let title = format!("{}: latency by percentile", summary.command);
    plot::latency(&dir.join("latency.svg"), &title, &labelled).map_err(io::Error::other)?;
    summary.plots = vec!["latency.svg".to_string()];
    summary.hgrm_unit = HGRM_UNIT;
    write_json(&dir.join("summary.json"), summary)
}

/// Writes one histogram's percentile distribution.
pub fn write_hgrm_file(path: &Path, rec: &Recorder) -> io::Result<()> {
    let mut w = BufWriter::new(fs::File::create(path)?);
    write_hgrm(rec.histogram(), HGRM_SCALE, &mut w)?;
    w.flush()
}

/// Writes `value` as pretty JSON with a final newline.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let json = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    fs::write(path, json + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::seq_of;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn accounting_finds_lost_messages() {
        let mut a = Accounting {
            put: 10,
            acked: 7,
            still_queued: 2,
            ..Accounting::default()
        };
        a.conclude();
        assert_eq!(a.lost, 1);
        assert!(!a.ok);
        assert!(a.problems[0].contains("1 message(s) lost"));
        let mut b = Accounting {
            put: 10,
            acked: 10,
            ..Accounting::default()
        };
        b.conclude();
        assert!(b.ok && b.lost == 0);
    }

    #[test]
    fn check_ticks_off_every_producer_and_holds_the_queue_counters() {
        // Producer 0 put 3 and 0 and 1 were acked; producer 1 put 2, 0 was acked twice, and
        // 5, which it never put, once.
        let mut ledger = Ledger::default();
        for (producer, n) in [(0, 0), (0, 1), (1, 0), (1, 0), (1, 5)] {
            ledger.mark(seq_of(producer, n));
        }
        let stats = QueueStats {
            enqueued: 5,
            acked: 4,
            ready: 1,
            ..QueueStats::default()
        };
        let seen = Seen {
            put: &[3, 2],
            ledger: &ledger,
            acked: 5,
            redelivered: 0,
            problems: vec!["a producer stopped early".into()],
        };
        let a = Accounting::check(seen, &stats);
        assert_eq!((a.put, a.acked, a.still_queued), (5, 3, 1));
        assert_eq!((a.double_acked, a.lost), (1, 1));
        assert!(!a.ok);
        let expected = [
            "1 message(s) lost",
            "a producer stopped early",
            "1 acked message(s) were never put",
            "the queues counted 4 acks but the consumers saw 5 succeed",
            "1 message(s) acked more than once",
        ];
        assert_eq!(a.problems.len(), expected.len(), "{:?}", a.problems);
        for (problem, start) in a.problems.iter().zip(expected) {
            assert!(problem.starts_with(start), "{problem}");
        }
    }

    #[test]
    fn proc_readings() {
        let rss = status_kib("VmHWM").expect("VmHWM on Linux");
        assert!(rss > 0);
        assert!(load_average().is_some());
    }
}
