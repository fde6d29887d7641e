//! Model-based test of one shard: random operations drawn from a seed are carried out by the
//! real [`Shard`] and by a naive model written from contract §3 and §4, and the two are
//! compared after every step (sled's `fuzz_model.rs`, TigerBeetle's VOPR).
//!
//! The model keeps each queue as plainly as it can: a `BTreeMap` of messages, two `VecDeque`s
//! of ready ones (returned, fresh), a `BTreeMap` of leases, consumers in registration order,
//! and its deadlines as plain numbers, scanned for the smallest. It is slow and obviously
//! right; it shares no code with the engine.
//!
//! After every step the test compares the reply, every delivery (consumer, tag, id, body,
//! attempt, death record), every dead letter and its outcome, the consumers that ended, the
//! stats of every queue ever declared, the names in use and the next deadline, then calls
//! `Shard::check_invariants`. A failure names the seed, the step and every step before it.
//!
//! - `LEASEMQ_MODEL_SEED=<n>` runs that seed alone (the failure message says which);
//! - `LEASEMQ_MODEL_SEEDS=<n>` and `LEASEMQ_MODEL_OPS=<n>` change how many seeds and steps;
//! - `LEASEMQ_MODEL_TIES=open` stops a run at a tie described below instead of ordering it.
//!
//! Most runs count time in ticks of 1 ms, some in ticks of 3 or 10 ms. Two timers with the
//! same deadline fire in the order their deadlines were last set, a touch counting as a new
//! insertion, as `engine/src/wheel.rs` documents. Contract §4 Equal deadlines leaves the
//! order of a touched lease against a timer set around the touch open (eager and lazy timer
//! wheels differ there, see [`Model::order_is_open`]); with `LEASEMQ_MODEL_TIES=open` the run
//! stops at such a step rather than assume the eager order, and is counted as cut short.

mod commands;
mod harness;
mod model;
mod ops;
mod rng;

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use leasemq_engine::RetryPolicy;

use crate::harness::Harness;
use crate::model::Coverage;

pub(crate) type Tick = u64;

pub(crate) const SEVEN_DAYS: Duration = Duration::from_secs(7 * 24 * 60 * 60);
pub(crate) const QUEUE_NAMES: [&str; 4] = ["q0", "q1", "q2", "q3"];
pub(crate) const CONSUMER_NAMES: [&str; 3] = ["c0", "c1", "c2"];
pub(crate) const IDS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
pub(crate) const SMALL_BODY_LIMIT: usize = 6;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The length of a tick, in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TickLen(u128);

impl TickLen {
    fn new(tick: Duration) -> TickLen {
        TickLen(tick.as_nanos())
    }

    /// `d` in whole ticks, rounded up: a deadline never comes early (contract §4 Ticks).
    fn of(self, d: Duration) -> Tick {
        self.of_nanos(d.as_nanos())
    }

    fn of_nanos(self, nanos: u128) -> Tick {
        u64::try_from(nanos.div_ceil(self.0)).expect("durations here are short")
    }
}

/// `retry.delay(attempt) = min(initial × multiplier^(attempt−1), max)` in ticks, computed
/// exactly (the multipliers used here are 1, 1.5 and 2); jitter is always 0 here.
pub(crate) fn retry_ticks(tick: TickLen, retry: &RetryPolicy, attempt: u32) -> Tick {
    assert_eq!(retry.jitter, 0.0, "the model has no jitter");
    let m = retry.multiplier;
    let (num, den): (u128, u128) = if m == 1.0 {
        (1, 1)
    } else if m == 1.5 {
        (3, 2)
    } else if m == 2.0 {
        (2, 1)
    } else {
        panic!("the model knows no multiplier {m}")
    };
    let max = retry.max.as_nanos();
    // The delay is `n / d` nanoseconds.
    let (mut n, mut d) = (retry.initial.as_nanos(), 1u128);
    for _ in 1..attempt {
        if n >= max * d {
            break;
        }
        n *= num;
        d *= den;
    }
    if n >= max * d {
        tick.of(retry.max)
    } else {
        tick.of_nanos(n.div_ceil(d))
    }
}

impl Coverage {
    fn add(&mut self, other: &Coverage) {
        macro_rules! add {
            ($($field:ident)*) => { $(self.$field += other.$field;)* };
        }
        add!(runs cut_short steps delivered redelivered expired nacked released rejected
             duplicates stale dead_lettered dropped dead_letters_delivered touch_refused
             queue_full unread_released closes stopped_with_leases purged heads_dropped
             priority_overtakes consumers_passed_over turns_after_a_gone_consumer
             turns_kept_across_priorities);
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// Runs one seed; panics with the full report when the engine and the model part ways or
/// the engine panics.
fn run_seed(seed: u64, ops: usize, eager_ties: bool, coverage: &mut Coverage) {
    let mut harness = Harness::new(seed, eager_ties);
    let result = panic::catch_unwind(AssertUnwindSafe(|| harness.run(ops)));
    match result {
        Ok(Ok(finished)) => coverage.add(&Coverage {
            runs: 1,
            cut_short: u64::from(!finished),
            steps: harness.steps.len() as u64,
            ..harness.model.coverage()
        }),
        Ok(Err(what)) => panic!("{}", harness.report(&what)),
        Err(payload) => {
            let what = (payload.downcast_ref::<String>().cloned())
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{}", harness.report(&format!("panic: {what}")));
        }
    }
}

fn run_seeds(first_seed: u64, default_seeds: u64, default_ops: u64) -> Coverage {
    let ops = env_u64("LEASEMQ_MODEL_OPS").unwrap_or(default_ops) as usize;
    let seeds = match env_u64("LEASEMQ_MODEL_SEED") {
        Some(seed) => seed..seed + 1,
        None => first_seed..first_seed + env_u64("LEASEMQ_MODEL_SEEDS").unwrap_or(default_seeds),
    };
    let eager_ties = std::env::var("LEASEMQ_MODEL_TIES").map_or(true, |v| v != "open");
    let started = Instant::now();
    let mut coverage = Coverage::default();
    for seed in seeds {
        run_seed(seed, ops, eager_ties, &mut coverage);
    }
    eprintln!("model: {coverage:?} in {:.1?}", started.elapsed());
    coverage
}

#[test]
fn shard_agrees_with_the_model_on_random_runs() {
    let c = run_seeds(0, 10_000, 200);
    if c.runs >= 1_000 {
        // The generator still reaches the corners it is meant to.
        for (what, n) in [
            ("redelivered", c.redelivered),
            ("expired", c.expired),
            ("nacked", c.nacked),
            ("released", c.released),
            ("rejected", c.rejected),
            ("duplicates", c.duplicates),
            ("stale", c.stale),
            ("dead_lettered", c.dead_lettered),
            ("dropped", c.dropped),
            ("dead letters delivered", c.dead_letters_delivered),
            ("touches refused by max_lease", c.touch_refused),
            ("QueueFull", c.queue_full),
            ("unread deliveries released by cancel", c.unread_released),
            ("closes", c.closes),
            (
                "stopped consumers still holding leases",
                c.stopped_with_leases,
            ),
            ("messages purged", c.purged),
            ("heads dropped by DropHead", c.heads_dropped),
            (
                "messages taken ahead for their priority",
                c.priority_overtakes,
            ),
            (
                "consumers passed over for a higher priority",
                c.consumers_passed_over,
            ),
            (
                "round robins going on after a consumer gone",
                c.turns_after_a_gone_consumer,
            ),
            (
                "round robins kept across another priority's delivery",
                c.turns_kept_across_priorities,
            ),
        ] {
            assert!(n > 0, "no run reached {what}: {c:?}");
        }
        assert!(
            c.cut_short * 4 < c.runs,
            "too many runs cut short at an open tie: {c:?}"
        );
    }
}

#[test]
#[ignore = "long: minutes"]
fn shard_agrees_with_the_model_on_long_runs() {
    run_seeds(1_000_000, 20_000, 1_000);
}
