//! `leasemq-sim`: runs seeds of the whole-broker simulation and reports what they did.
//!
//! ```text
//! cargo run -p leasemq-sim --release -- --seeds 20000 --steps 2000   # a soak
//! cargo run -p leasemq-sim --release -- --seed 1234 --steps 2000     # replay one seed
//! cargo run -p leasemq-sim --release -- --durable --seeds 2000        # crashes and disks
//! cargo run -p leasemq-sim --release -- --replicated --seeds 200 --steps 500
//! ```
//!
//! `--seeds N` runs seeds `from .. from + N` (`--from`, default 0) on every core; `--seed S`
//! runs that seed alone. `--durable` runs them with a data dir: durable queues logged to
//! simulated disks, crashes, torn and garbled writes, failed fsyncs, read errors and flipped
//! bits (`leasemq_sim::run_durable_seed`). `--replicated` runs one shard's group of three
//! replicas on openraft under crashes, partitions and clocks that disagree
//! (`leasemq_sim::replicated`), one seed after another.
//! A violation prints the seed and its shrunk trace and exits with 1.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use leasemq_sim::{run_durable_seed, run_seed, Failure, Stats};

struct Args {
    from: u64,
    seeds: u64,
    steps: usize,
    threads: usize,
    durable: bool,
    replicated: bool,
}

const USAGE: &str =
    "usage: leasemq-sim [--seeds N] [--from S] [--seed S] [--steps M] [--threads T] [--durable | --replicated]";

fn parse() -> Result<Args, String> {
    let mut args = Args {
        from: 0,
        seeds: 100,
        steps: 2000,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        durable: false,
        replicated: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        if flag == "--durable" {
            args.durable = true;
            continue;
        }
        if flag == "--replicated" {
            args.replicated = true;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: {value:?} is not a number\n{USAGE}"))?;
        match flag.as_str() {
            "--seeds" => args.seeds = number,
            "--from" => args.from = number,
            "--seed" => {
                args.from = number;
                args.seeds = 1;
            }
            "--steps" => args.steps = number as usize,
            "--threads" => args.threads = (number as usize).max(1),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if args.replicated {
        return replicated(&args);
    }
    let started = Instant::now();
    let next = AtomicU64::new(args.from);
    let end = args.from + args.seeds;
    let stop = AtomicBool::new(false);
    let total = Mutex::new(Stats::default());
    let failure: Mutex<Option<Failure>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..args.threads.min(args.seeds.max(1) as usize) {
            scope.spawn(|| {
                let mut mine = Stats::default();
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let run = if args.durable {
                        run_durable_seed(seed, args.steps)
                    } else {
                        run_seed(seed, args.steps)
                    };
                    match run {
                        Ok(stats) => mine.add(&stats),
                        Err(f) => {
                            stop.store(true, Ordering::Relaxed);
                            let mut slot = failure.lock().expect("no panics here");
                            if slot.as_ref().is_none_or(|old| f.seed < old.seed) {
                                *slot = Some(f);
                            }
                        }
                    }
                }
                total.lock().expect("no panics here").add(&mine);
            });
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut total = total.into_inner().expect("no panics here");
    let failure = failure.into_inner().expect("no panics here");
    total.violations = u64::from(failure.is_some());
    println!("{total}");
    println!(
        "{:.0} steps/s ({} steps in {elapsed:.1} s on {} threads)",
        total.steps as f64 / elapsed.max(1e-9),
        total.steps,
        args.threads
    );
    match failure {
        None => ExitCode::SUCCESS,
        Some(f) => {
            eprintln!("{f}");
            ExitCode::FAILURE
        }
    }
}

/// `--replicated`: each seed in turn, its summary printed; the first violation ends it.
fn replicated(args: &Args) -> ExitCode {
    let steps = u32::try_from(args.steps).unwrap_or(u32::MAX);
    for seed in args.from..args.from + args.seeds {
        match leasemq_sim::replicated::run_replicated_seed(seed, steps) {
            Ok(summary) => println!("seed {seed}: {summary:?}"),
            Err(v) => {
                eprintln!("seed {seed}: {}: {}", v.check, v.detail);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
