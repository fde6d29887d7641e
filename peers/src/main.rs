//! leasemq-peers: the same closed-loop, per-message work-queue workload against leasemq
//! (embedded, in this process) and against Redis, beanstalkd and RabbitMQ over loopback
//! TCP. See `README.md` for what is measured and how to read it.
//!
//! [`harness`] runs the workload and checks the accounting; [`targets`] holds one module per
//! broker behind the `Target` / `Producer` / `Consumer` traits; [`cpu`] reads CPU time;
//! [`report`] prints the table and writes the JSON.

mod cpu;
mod harness;
mod report;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};

use harness::{RunResult, Workload};
use targets::Target;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Runs one per-message work-queue workload against leasemq and peer brokers"
)]
struct Cli {
    /// Which brokers to run, comma separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    broker: Vec<BrokerKind>,
    /// Producer threads, each with its own connection.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Consumer threads, each with its own connection.
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// The measured window (`5s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Run time before the window; nothing is recorded in it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// The most messages put and not yet acked; producers wait above it.
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: u64,
    /// Runs per broker; the table gives the median of each column.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// leasemq's shard threads.
    #[arg(long, default_value_t = 2)]
    shards: usize,
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    #[arg(long, default_value = "127.0.0.1:11300")]
    beanstalkd_addr: String,
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_uri: String,
    /// Also write every run and the medians as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BrokerKind {
    All,
    Leasemq,
    Redis,
    Beanstalkd,
    Rabbitmq,
}

const ALL: [BrokerKind; 4] = [
    BrokerKind::Leasemq,
    BrokerKind::Redis,
    BrokerKind::Beanstalkd,
    BrokerKind::Rabbitmq,
];

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1e-3)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1.0)
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?}"))?;
    if !(value > 0.0 && value * scale <= 3600.0) {
        return Err(format!("duration out of range (0, 1h]: {text:?}"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let workload = Workload {
        producers: cli.producers,
        consumers: cli.consumers,
        warmup: cli.warmup,
        duration: cli.duration,
        max_in_flight: cli.max_in_flight,
        drain_timeout: Duration::from_secs(60),
    };
    let kinds: Vec<BrokerKind> = if cli.broker.contains(&BrokerKind::All) {
        ALL.to_vec()
    } else {
        cli.broker.clone()
    };
    report::print_header(&cli_config(&cli));
    let mut runs = Vec::new();
    let mut failed = false;
    for kind in kinds {
        match run_broker(&cli, kind, &workload) {
            Ok(results) => {
                report::print_median(&results);
                failed |= results.iter().any(|r| r.problem.is_some());
                runs.extend(results);
            }
            Err(error) => {
                println!(
                    "{:<11} error: {error:#}",
                    format!("{kind:?}").to_lowercase()
                );
                failed = true;
            }
        }
    }
    if let Some(path) = &cli.json {
        if let Err(error) = report::write_json(path, &cli_config(&cli), &runs) {
            eprintln!("writing {}: {error:#}", path.display());
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn cli_config(cli: &Cli) -> report::Config {
    report::Config {
        producers: cli.producers,
        consumers: cli.consumers,
        warmup_s: cli.warmup.as_secs_f64(),
        duration_s: cli.duration.as_secs_f64(),
        max_in_flight: cli.max_in_flight,
        runs: cli.runs,
        leasemq_shards: cli.shards,
        prefetch: targets::PREFETCH,
        body_bytes: harness::BODY_BYTES,
    }
}

fn run_broker(cli: &Cli, kind: BrokerKind, workload: &Workload) -> Result<Vec<RunResult>> {
    let mut results = Vec::with_capacity(cli.runs);
    for run in 1..=cli.runs {
        let target = connect(cli, kind)?;
        let outcome = harness::run(target.as_ref(), workload);
        let finished = target.finish();
        let result = outcome?;
        finished?;
        report::print_run(run, &result);
        results.push(result);
    }
    Ok(results)
}

fn connect(cli: &Cli, kind: BrokerKind) -> Result<Box<dyn Target>> {
    Ok(match kind {
        BrokerKind::Leasemq => Box::new(targets::leasemq::Leasemq::start(cli.shards)?),
        BrokerKind::Redis => Box::new(targets::redis::Redis::connect(&cli.redis_url)?),
        BrokerKind::Beanstalkd => Box::new(targets::beanstalkd::Beanstalkd::connect(
            &cli.beanstalkd_addr,
        )?),
        BrokerKind::Rabbitmq => Box::new(targets::rabbitmq::Rabbitmq::connect(&cli.amqp_uri)?),
        BrokerKind::All => bail!("`all` is expanded before connecting"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_and_without_units() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
