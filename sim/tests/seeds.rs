//! The simulator in CI: many seeds of the whole broker with no violation, and planted bugs
//! that the checks must catch.
//!
//! `LEASEMQ_SIM_SEEDS` and `LEASEMQ_SIM_STEPS` change how many seeds and steps
//! `many_seeds_break_no_rule` runs (500 × 2 000 by default); `LEASEMQ_SIM_DURABLE_SEEDS`
//! and `LEASEMQ_SIM_DURABLE_STEPS` those of `durable_seeds_survive_crashes` (500 × 1 000).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use leasemq_sim::Fault;
use leasemq_sim::{run_durable_seed, run_seed, run_seed_with_fault, Failure, Stats};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs seeds `0..seeds` of `run` on every core; panics with the first failure.
fn run_many(seeds: u64, steps: usize, run: fn(u64, usize) -> Result<Stats, Failure>) -> Stats {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let total = Mutex::new(Stats::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                match run(seed, steps) {
                    Ok(stats) => total.lock().unwrap().add(&stats),
                    Err(failure) => panic!("{failure}"),
                }
            });
        }
    });
    let total = total.into_inner().unwrap();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{total}\n{:.0} steps/s over {secs:.1} s",
        total.steps as f64 / secs
    );
    assert_eq!(total.seeds, seeds);
    assert_eq!(total.steps, seeds * steps as u64);
    total
}

/// Durable queues on simulated disks, crashed at random: after each crash the restart is
/// checked against contract §7 (what clients were told survives; acks answered `true`
/// stay done; attempts, delays, dedup windows and tags go on; queues in memory are gone;
/// dead letters are there at least once; a torn tail is cut; a flipped bit in an old
/// record is refused, naming file and offset), then the run goes on.
#[test]
fn durable_seeds_survive_crashes() {
    let seeds = env("LEASEMQ_SIM_DURABLE_SEEDS", 500);
    let steps = env("LEASEMQ_SIM_DURABLE_STEPS", 1000) as usize;
    let total = run_many(seeds, steps, run_durable_seed);
    let reached = [
        ("crashes", total.crashes),
        ("restored messages", total.restored),
        ("torn tails", total.torn),
        ("refused damage", total.refusals),
        ("acks", total.acks),
        ("redeliveries", total.redeliveries),
        ("dead letters", total.dead_letters),
        ("cross-shard messages", total.hops),
    ];
    for (what, n) in reached {
        assert!(n > 0, "no {what} in {seeds} durable seeds: {total}");
    }
}

/// Durable seeds that once broke the ledger's reading of a restart:
/// - in 658 and 953 a message leased at the crash past its last delivery was dead-lettered
///   by the restart while a later put of its id had been lost with the crash; the ledger
///   gave the dying message the lost put's dedup window;
/// - in 7700065 two queues dead-letter into each other, and a crash between a hop's
///   enqueue and its outcome sent the hop again, so one queue held two copies of a message
///   (at least once). The next restart dead-lettered the copy leased past its last delivery
///   and kept the other ready; the ledger matched the letter to both copies by body and
///   counted neither as ready;
/// - in 7701736 a crash lost a dead letter's arrival in a queue with a dedup window (and
///   the window its drop there opened); no client had seen it arrive, and the message was
///   back in its first queue, yet the ledger asked for that window;
/// - in 7705716 a crash lost a reject whose dead letter was on disk in the next queue, and
///   the restart dead-lettered the message again for its last delivery: two copies ready
///   at attempt 0, one rejected, one spent, and the ledger took the delivered one for the
///   other;
/// - in 7711059 a message went round two queues back to its first, and a crash lost that
///   last arrival; the restart brought back the copy of its first stay, dying, and the
///   ledger gave it the window the lost arrival had opened;
/// - in 7719836 two copies of a message died in one turn, each leaving one of two queues
///   that dead-letter into each other, and the ledger paired the letters the wrong way;
/// - in 7741572 a restart sent a dead letter again into a queue that had it: of the two
///   copies, one came back from a cancelled consumer (its attempt given back) while the
///   other was fresh, and the ledger took the delivery of the first for the second;
/// - in 7772905 a message died in a queue that was then closed, and died again in the
///   next queue; the crash kept the close and lost every record of the next queue (no
///   client had seen the message there), and the ledger still asked for the message;
/// - in 7782096 a message went round two queues and back; the crash lost its last arrival,
///   it came back as it was on its first stay, and the ledger compared that stay's death
///   record with the last one's.
#[test]
fn durable_seeds_that_once_broke_the_ledger_run_clean() {
    let seeds = [
        658, 953, 7_700_065, 7_701_736, 7_705_716, 7_711_059, 7_719_836, 7_741_572, 7_772_905,
        7_782_096,
    ];
    for seed in seeds {
        let stats = run_durable_seed(seed, 2500).unwrap_or_else(|f| panic!("{f}"));
        assert!(stats.crashes > 0, "seed {seed}: {stats}");
    }
}

#[test]
fn a_durable_seed_replays_exactly() {
    let a = run_durable_seed(11, 800).unwrap_or_else(|f| panic!("{f}"));
    assert!(a.crashes > 0, "{a}");
    assert_eq!(a, run_durable_seed(11, 800).unwrap());
}

#[test]
fn many_seeds_break_no_rule() {
    let seeds = env("LEASEMQ_SIM_SEEDS", 500);
    let steps = env("LEASEMQ_SIM_STEPS", 2000) as usize;
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let total = Mutex::new(Stats::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                match run_seed(seed, steps) {
                    Ok(stats) => total.lock().unwrap().add(&stats),
                    Err(failure) => panic!("{failure}"),
                }
            });
        }
    });
    let total = total.into_inner().unwrap();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{total}\n{:.0} steps/s over {secs:.1} s",
        total.steps as f64 / secs
    );
    assert_eq!(total.seeds, seeds);
    assert_eq!(total.steps, seeds * steps as u64);
    // The workload reaches every part of the contract it is meant to.
    let reached = [
        ("redeliveries", total.redeliveries),
        ("expiries", total.expiries),
        ("acks", total.acks),
        ("nacks", total.nacks),
        ("rejects", total.rejects),
        ("releases", total.releases),
        ("touches", total.touches),
        ("stale settles", total.stale),
        ("cancels", total.cancels),
        ("closes", total.closes),
        ("duplicates", total.duplicates),
        ("error replies", total.errors),
        ("dead letters", total.dead_letters),
        ("chained dead letters", total.chained),
        ("dropped dead letters", total.dropped),
        ("cross-shard messages", total.hops),
        ("catch-ups", total.catch_ups),
    ];
    for (what, n) in reached {
        assert!(n > 0, "no {what} in {seeds} seeds: {total}");
    }
}

/// Seeds that once broke the workload or the ledger. 1 019 247 made a week-long time jump
/// while a dead-letter queue with a 2 ms lease was still empty: the jump's bound counted only
/// the messages there when it began, and the dead letters that arrived were redelivered 48
/// million times (2.7 GB of deliveries in one call). 2 017 807 declared a live queue again
/// with a config whose dead-letter queue was the queue itself: the engine rightly answered
/// `InvalidConfig`, the ledger expected `ConfigMismatch`.
#[test]
fn seeds_that_once_broke_the_workload_run_clean() {
    for seed in [1_019_247, 2_017_807] {
        let stats = run_seed(seed, 2000).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(stats.steps, 2000, "seed {seed}: {stats:?}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    assert_eq!(run_seed(42, 1500).unwrap(), run_seed(42, 1500).unwrap());
    assert_ne!(run_seed(42, 1500).unwrap(), run_seed(43, 1500).unwrap());
}

/// Each planted bug is caught by the check meant for it, within a few seeds, and the
/// failure comes with a shrunk trace that still shows it.
#[test]
fn planted_bugs_are_caught() {
    for fault in Fault::ALL {
        let caught = (0..40).find_map(|seed| run_seed_with_fault(seed, 600, fault, 1).err());
        let failure = caught.unwrap_or_else(|| panic!("{fault:?} went unnoticed in 40 seeds"));
        assert!(
            fault.caught_by().contains(&failure.violation.check),
            "{fault:?} was caught by {:?}, not {:?}:\n{failure}",
            failure.violation.check,
            fault.caught_by()
        );
        assert_eq!(failure.shrunk_violation.check, failure.violation.check);
        assert!(failure.trace.len() <= failure.failed_at);
        assert!(
            failure.trace.len() <= 12,
            "{fault:?}: the trace shrank only to {} ops:\n{failure}",
            failure.trace.len()
        );
        assert!(failure.to_string().contains("shrunk trace"));
        // Without the fault, the same seed passes.
        run_seed(failure.seed, 600).unwrap_or_else(|f| panic!("{f}"));
    }
}
