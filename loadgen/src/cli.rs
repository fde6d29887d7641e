//! Command-line flags, and the small parsers for durations ("500ms", "2s", "1m") and counts
//! ("200000", "200k", "1.5M").

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Drives an in-process leasemq broker and measures it into HDR histograms.
#[derive(Debug, Parser)]
#[command(name = "leasemq-loadgen", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Producers put, consumers receive and ack, as fast as they can (closed loop) or at a
    /// fixed rate (open loop); measures put→deliver, put→ack and the settle round trip.
    Throughput(ThroughputArgs),
    /// Keeps N leases outstanding, leaves a fraction of deliveries to expire and measures how
    /// late their redeliveries arrive, and what touch and ack cost while the wheel is full.
    Redelivery(RedeliveryArgs),
}

/// Which calls the workers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// `put` and `ack`, one message per round trip.
    PerMessage,
    /// `put_batch` and `Consumer::ack_up_to`, many messages per round trip.
    Batched,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::PerMessage => "per-message",
            Api::Batched => "batched",
        }
    }
}

/// Where the results go; shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Write summary.json and one .hgrm percentile distribution per histogram into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print no summary table (failures still go to stderr).
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ThroughputArgs {
    /// Producer threads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// Consumer threads, each with one consumer; consumer i reads queue i mod Q.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub consumers: u32,
    /// Queues, spread evenly over the shards (at most one per consumer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub queues: u32,
    /// Shard threads of the broker.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: u32,
    /// Body size in bytes (at least 16: a send timestamp and a sequence number).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub body_bytes: u32,
    /// Prefetch of every consumer (1 to 65 535).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub prefetch: u32,
    /// Messages per `put_batch` (batched API).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub put_batch: u32,
    /// Deliveries per `ack_up_to` (batched API); fewer when the consumer's channel runs dry.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub settle_batch: u32,
    /// per-message (`put`, `ack`) or batched (`put_batch`, `ack_up_to`).
    #[arg(long, value_enum, default_value_t = Api::Batched)]
    pub api: Api,
    /// How long to measure, after the warm-up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long to run before measuring (not recorded).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Open loop: put N messages/s in total (suffixes k, M), latency measured from each
    /// message's intended send time. Without it: closed loop, as fast as possible.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub rate: Option<u64>,
    /// Open loop, batched API: the longest a due message waits for its batch to fill.
    #[arg(long, default_value = "100us", value_parser = parse_duration)]
    pub linger: Duration,
    /// Most messages put but not yet acked before producers wait (0: twice the consumers'
    /// total prefetch plus one put batch per producer, at least 65 536; open loop:
    /// 1 000 000).
    #[arg(long, default_value_t = 0, value_parser = parse_count)]
    pub max_in_flight: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RedeliveryArgs {
    /// Leases kept outstanding (tested up to 10 000 000; needs about 100 bytes each, and
    /// leases / (ack_timeout / 2) touches or acks per second to keep them alive).
    #[arg(long, default_value = "100000", value_parser = parse_count)]
    pub leases: u64,
    /// The queue's lease length [default: 200ms, or 2 µs per lease when that is longer, so
    /// that renewing every lease at half its lease stays near a million calls a second].
    #[arg(long, value_parser = parse_duration)]
    pub ack_timeout: Option<Duration>,
    /// Fraction of first deliveries never acked nor touched: left to expire and measured.
    #[arg(long, default_value_t = 0.01, value_parser = parse_fraction)]
    pub never_ack_fraction: f64,
    /// Fraction of the other leases acked (and replaced by a fresh message) when they reach
    /// half their lease; the rest are touched.
    #[arg(long, default_value_t = 0.25, value_parser = parse_fraction)]
    pub ack_fraction: f64,
    /// Shard threads of the broker (the queue lives on one of them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub shards: u32,
    /// How long to measure, counted from the moment all leases are out [default:
    /// ack_timeout + 2s, at least 3s; redeliveries are measured when their deadline falls
    /// in it].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Messages per `put_batch`.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub put_batch: u32,
    /// Settles per `settle_batch` (touches and acks go in separate batches).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub settle_batch: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Parses "500ms", "2s", "1.5s", "1m", "100us", "250ns", "1h": a non-negative number and a
/// unit (ns, us or µs, ms, s, m, h). A bare number is refused, so "5" is never ambiguous.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 500ms, 2s or 1m"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("{text:?} does not start with a number"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let nanos_per_unit = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ns, us, ms, s, m or h"
            ))
        }
    };
    let nanos = (value * nanos_per_unit).round();
    if !nanos.is_finite() || nanos > 1e18 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Parses a count: "250000", "250k", "2M", "1.5M", "10_000_000".
pub fn parse_count(text: &str) -> Result<u64, String> {
    let cleaned: String = text.trim().chars().filter(|&c| c != '_').collect();
    let (number, scale) = match cleaned.chars().last() {
        Some('k' | 'K') => (&cleaned[..cleaned.len() - 1], 1e3),
        Some('M' | 'm') => (&cleaned[..cleaned.len() - 1], 1e6),
        Some('G' | 'g') => (&cleaned[..cleaned.len() - 1], 1e9),
        _ => (cleaned.as_str(), 1.0),
    };
    if scale == 1.0 {
        return number
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number (suffixes k, M, G allowed)"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number (suffixes k, M, G allowed)"))?;
    let scaled = (value * scale).round();
    if !(0.0..1.8e19).contains(&scaled) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(scaled as u64)
}

/// Parses a fraction in [0, 1].
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text:?} is not between 0 and 1"))
    }
}

/// Formats a duration the way the parser reads it back.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    let units = [
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (size, unit) in units {
        if nanos / size * size == nanos {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_every_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("100µs"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("250ns"), Ok(Duration::from_nanos(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 3s "), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0.2ms"), Ok(Duration::from_micros(200)));
    }

    #[test]
    fn durations_refused() {
        for bad in [
            "", "5", "s", "ms", "-1s", "2 weeks", "1.2.3s", "1e3s", "10d", "1e30h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
    }

    #[test]
    fn durations_round_trip_through_format() {
        for text in ["500ms", "2s", "1m", "100us", "250ns", "0s", "90s", "1500ms"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn counts_and_fractions() {
        assert_eq!(parse_count("250000"), Ok(250_000));
        assert_eq!(parse_count("250k"), Ok(250_000));
        assert_eq!(parse_count("2M"), Ok(2_000_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("10_000_000"), Ok(10_000_000));
        assert!(parse_count("ten").is_err());
        assert!(parse_count("-3").is_err());
        assert!(parse_count("1.5").is_err());
        assert_eq!(parse_fraction("0.01"), Ok(0.01));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "leasemq-loadgen",
            "throughput",
            "--shards",
            "2",
            "--api",
            "per-message",
            "--duration",
            "500ms",
            "--rate",
            "100k",
        ])
        .unwrap();
        let Command::Throughput(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.api, Api::PerMessage);
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.rate, Some(100_000));
        assert_eq!(args.warmup, Duration::from_secs(1));
        assert!(
            Cli::try_parse_from(["leasemq-loadgen", "throughput", "--body-bytes", "8"]).is_err()
        );
        let cli = Cli::try_parse_from(["leasemq-loadgen", "redelivery", "--leases", "1M"]).unwrap();
        let Command::Redelivery(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.leases, 1_000_000);
        assert_eq!(args.ack_timeout, None);
    }
}
