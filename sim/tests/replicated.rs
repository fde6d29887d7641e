//! The replicated simulation in CI: seeds of one shard's group of three under crashes,
//! partitions and clocks that disagree, with no violation; a seed that replays exactly;
//! and a planted bug the ledger must catch.
//!
//! `LEASEMQ_SIM_REPLICATED_SEEDS` and `LEASEMQ_SIM_REPLICATED_STEPS` change how many seeds
//! and steps `replicated_seeds_lose_nothing_answered` runs (16 × 300 by default).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use leasemq_sim::replicated::{run_replicated_seed, run_replicated_seed_with, Summary};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn replicated_seeds_lose_nothing_answered() {
    let seeds = env("LEASEMQ_SIM_REPLICATED_SEEDS", 16);
    let steps = env("LEASEMQ_SIM_REPLICATED_STEPS", 300) as u32;
    // Each seed on a runtime of its own: the seeds share out the cores.
    let next = AtomicU64::new(0);
    let total = Mutex::new(Summary::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                let run = run_replicated_seed(seed, steps)
                    .unwrap_or_else(|v| panic!("seed {seed}: {}: {}", v.check, v.detail));
                let mut total = total.lock().unwrap();
                total.leads += run.leads;
                total.crashes += run.crashes;
                total.cuts += run.cuts;
                total.puts += run.puts;
                total.deliveries += run.deliveries;
                total.acks += run.acks;
                total.unknown += run.unknown;
            });
        }
    });
    let total = total.into_inner().unwrap();
    eprintln!("{seeds} seeds of {steps} steps: {total:?}");
    // The runs did what they are for: leaders came and went, calls were cut short.
    assert!(total.leads > 2 * seeds as u32, "{total:?}");
    assert!(
        total.crashes > 0 && total.cuts > 0 && total.unknown > 0,
        "{total:?}"
    );
    assert!(total.acks > 0 && total.deliveries > total.acks, "{total:?}");
}

#[test]
fn a_replicated_seed_replays_exactly() {
    let a = run_replicated_seed(7, 300).unwrap_or_else(|v| panic!("{}: {}", v.check, v.detail));
    let b = run_replicated_seed(7, 300).unwrap_or_else(|v| panic!("{}: {}", v.check, v.detail));
    assert_eq!(a, b);
}

/// Puts answered before their commit: a leader that dies with them in its log alone
/// loses them, and the ledger says so.
#[test]
fn puts_answered_before_their_commit_are_caught_lost() {
    let caught = (0..40).find_map(|seed| run_replicated_seed_with(seed, 300, true).err());
    let v = caught.expect("no seed caught a put answered before its commit");
    assert_eq!(v.check, "lost", "{}", v.detail);
}
