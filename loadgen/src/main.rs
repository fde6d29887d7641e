//! leasemq-loadgen: drives an in-process leasemq broker and measures it.
//!
//! `throughput` measures put→deliver, put→ack and settle round trips under a closed or an
//! open loop; `redelivery` measures how late expired leases come back while the timer
//! wheel holds many of them. Each prints a summary table, can write `summary.json` and one
//! `.hgrm` percentile distribution per histogram (`--out DIR`), and checks at the end that
//! every message put was acked exactly once or is still accounted for; if not, it says so
//! and exits with status 1.

mod cli;
mod common;
mod hist;
mod redelivery;
mod report;
mod throughput;

use std::process::ExitCode;

use clap::Parser;
use mimalloc::MiMalloc;

use crate::cli::{Cli, Command, OutputArgs};
use crate::hist::Recorder;
use crate::report::Summary;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// What a subcommand hands back: its summary and its histograms, by file name.
pub struct Run {
    pub summary: Summary,
    pub recorders: Vec<(String, Recorder)>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (result, output): (Result<Run, String>, &OutputArgs) = match &cli.command {
        Command::Throughput(args) => (throughput::run(args), &args.output),
        Command::Redelivery(args) => (redelivery::run(args), &args.output),
    };
    let mut run = match result {
        Ok(run) => run,
        Err(e) => {
            eprintln!("leasemq-loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &output.out {
        if let Err(e) = report::write_out(dir, &mut run.summary, &run.recorders) {
            eprintln!("leasemq-loadgen: writing {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    if !output.quiet {
        print!("{}", report::table(&run.summary));
    }
    let accounting = &run.summary.accounting;
    if accounting.ok {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "leasemq-loadgen: {} FAILED its end-of-run check:",
            run.summary.command
        );
        for p in &accounting.problems {
            eprintln!("  {p}");
        }
        ExitCode::from(1)
    }
}
