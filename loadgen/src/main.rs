//! leasemq-loadgen: drives an in-process leasemq broker and measures it.
//!
//! `throughput` measures put→deliver, put→ack, settle round trips and put→answered under a
//! closed or an open loop; `redelivery` measures how late expired leases come back while
//! the timer wheel holds many of them; `sweep` raises the open-loop rate step by step, per
//! shard count, until a latency (put→ack by default) breaks an objective, and reports the
//! highest rate that held.
//! `throughput` and `sweep` run in-memory queues, or durable ones (`--durable`, `--sync`) on
//! a broker with a data dir (`--data-dir`, or a temporary one).
//! Each prints a summary table and, with `--out DIR`, writes `summary.json`, one `.hgrm`
//! percentile distribution and one `.hlog` interval log per histogram, and a plot
//! (`latency.svg`, or `sweep.svg`). Every run checks at the end that every message put was
//! acked exactly once or is still accounted for; if not, it says so and exits with status 1.

mod amqp;
mod background;
mod cli;
mod common;
mod cpu;
mod fill;
mod hist;
mod intervals;
mod plot;
mod progress;
mod redelivery;
mod report;
mod scheduling;
mod storage;
mod sweep;
mod throughput;

use std::io;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use mimalloc::MiMalloc;

use crate::cli::{Cli, Command, OutputArgs};
use crate::hist::Recorder;
use crate::intervals::IntervalLog;
use crate::report::{Accounting, Summary};
use crate::sweep::SweepRun;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// How long mimalloc keeps freed memory before it returns it to the system. Its default
/// (a second for pages) returned the memory of acked messages that new messages needed a
/// moment later, and every page came back through a fault on a shard thread: with a
/// million leases, runs of faults held single puts for up to 28 ms. Ten seconds keeps the
/// memory a running broker churns through, and still gives back what a drained queue
/// held.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = 10_000;
/// `mi_option_purge_delay` in mimalloc.h's `mi_option_t` (the same in v2 and v3); the
/// Rust bindings do not name it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's purge delay; see [`ALLOCATOR_PURGE_DELAY_MS`].
fn tune_allocator() {
    // SAFETY: `mi_option_set` stores one value in mimalloc's option table; it may be called
    // at any time, from any thread, and takes no pointers.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS);
    }
}

/// What `throughput` and `redelivery` hand back: the summary, the histograms by file name,
/// and their interval log when `--out` asked for one.
pub struct Run {
    pub summary: Summary,
    pub recorders: Vec<(String, Recorder)>,
    pub intervals: Option<IntervalLog>,
}

/// What any subcommand hands back (boxed: each is large, and handed around once).
enum Outcome {
    Single(Box<Run>),
    Sweep(Box<SweepRun>),
}

impl Outcome {
    fn write_out(&mut self, dir: &Path) -> io::Result<()> {
        match self {
            Outcome::Single(run) => report::write_out(
                dir,
                &mut run.summary,
                &run.recorders,
                run.intervals.as_ref(),
            ),
            Outcome::Sweep(sweep) => sweep.write_out(dir),
        }
    }

    fn table(&self) -> String {
        match self {
            Outcome::Single(run) => report::table(&run.summary),
            Outcome::Sweep(sweep) => sweep.table(),
        }
    }

    fn command(&self) -> &str {
        match self {
            Outcome::Single(run) => run.summary.command,
            Outcome::Sweep(sweep) => sweep.summary.command,
        }
    }

    /// Says in the title and the config whether the run had busy threads beside it, and
    /// which time slices its threads asked for.
    fn note_host(&mut self, threads: u32, slices: scheduling::Slices) {
        let (title, config) = match self {
            Outcome::Single(run) => (&mut run.summary.title, &mut run.summary.config),
            Outcome::Sweep(sweep) => (&mut sweep.summary.title, &mut sweep.summary.config),
        };
        config["background_load"] = threads.into();
        let micros = |slice: Option<std::time::Duration>| slice.map(|d| d.as_micros() as u64);
        config["shard_time_slice_us"] = micros(slices.shard).into();
        config["caller_time_slice_us"] = micros(slices.caller).into();
        config["yield_budget_us"] = (slices.yield_budget.as_micros() as u64).into();
        config["caller_turns"] = format!("{:?}", slices.caller_turns).into();
        if threads > 0 {
            title.push_str(&format!(
                "; beside {threads} CPU-bound background thread(s)"
            ));
        }
        title.push_str(&format!(
            "; time slice: shards {}, workers {}",
            scheduling::describe(slices.shard),
            scheduling::describe(slices.caller)
        ));
        if slices.caller_turns != leasemq::CallerTurns::default() {
            title.push_str(&format!("; caller turns: {:?}", slices.caller_turns));
        }
        if slices.yield_budget != leasemq::DEFAULT_YIELD_BUDGET {
            title.push_str(&format!(
                "; yield budget {} µs",
                slices.yield_budget.as_micros()
            ));
        }
    }

    fn accounting(&self) -> &Accounting {
        match self {
            Outcome::Single(run) => &run.summary.accounting,
            Outcome::Sweep(sweep) => &sweep.summary.accounting,
        }
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let args: Vec<_> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == background::SUBCOMMAND {
        return background::serve(&args[2].to_string_lossy());
    }
    let cli = Cli::parse();
    scheduling::set(scheduling::Slices {
        shard: cli.shard_time_slice.0,
        caller: cli.caller_time_slice.0,
        yield_budget: cli.yield_budget,
        caller_turns: cli.caller_turns.to_broker(),
    });
    let load = match background::BackgroundLoad::start(cli.background_load) {
        Ok(load) => load,
        Err(e) => {
            eprintln!("leasemq-loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    let (result, output): (Result<Outcome, String>, &OutputArgs) = match &cli.command {
        Command::Throughput(args) => (
            throughput::run(args).map(|run| Outcome::Single(Box::new(run))),
            &args.output,
        ),
        Command::Redelivery(args) => (
            redelivery::run(args).map(|run| Outcome::Single(Box::new(run))),
            &args.output,
        ),
        Command::Sweep(args) => (
            sweep::run(args).map(|run| Outcome::Sweep(Box::new(run))),
            &args.output,
        ),
        Command::Fill(args) => (
            fill::run(args).map(|run| Outcome::Single(Box::new(run))),
            &args.output,
        ),
    };
    drop(load);
    let mut outcome = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("leasemq-loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    outcome.note_host(cli.background_load, scheduling::slices());
    if let Some(dir) = &output.out {
        if let Err(e) = outcome.write_out(dir) {
            eprintln!("leasemq-loadgen: writing {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    if !output.quiet {
        print!("{}", outcome.table());
    }
    let accounting = outcome.accounting();
    if accounting.ok {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "leasemq-loadgen: {} FAILED its end-of-run check:",
            outcome.command()
        );
        for p in &accounting.problems {
            eprintln!("  {p}");
        }
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option number names the purge delay: its documented default (1 000 ms in
    /// mimalloc v3), then the value set.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads one value of mimalloc's option table.
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(before, 1_000);
        tune_allocator();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(after, ALLOCATOR_PURGE_DELAY_MS);
    }
}
