//! A seeded, deterministic simulation of a whole leasemq broker, checked step by step
//! against a ledger of every message put.
//!
//! # What is simulated
//!
//! Two to four engine [`Shard`](leasemq_engine::Shard)s run in one thread on a virtual
//! clock. The simulator does what `leasemq-shard`'s runtime does around them: it hands each
//! command to the shard owning its queue (`leasemq_shard::shard_for`), pushes deliveries into
//! per-consumer channels, sends dead letters to the shard owning the dead-letter queue and
//! the outcome back to the origin. A message between shards carries its sender's time, and
//! the receiver catches up to that time before it handles it; when each one arrives (at
//! once, some steps later, in the middle of a time jump) is the seed's choice, keeping each
//! sender → receiver pair in order, as an inbox does.
//!
//! The workload ([`Op`]), drawn from the seed: producers put (with ids, duplicate ids, no id,
//! invalid ids, delays, bodies too large, batches, through stale handles of closed queues);
//! consumers join, read their channels, ack, nack (with and without a delay), reject,
//! release, touch, `ack_up_to`, settle in batches, go silent so their leases expire, crash
//! (cancel with deliveries still unread); stale tags are settled; queues are closed and
//! declared again, with the same or another config; dead-letter chains cross shards; time
//! jumps by a tick or by days.
//!
//! **Durable runs** ([`run_durable_seed`], `--durable`) add a data dir: a seeded choice of
//! names are durable queues (a durable queue's dead-letter queue is durable too), and
//! each shard writes the changes its engine logs (`Effects::log`) as one record per call
//! through the shipping `leasemq-wal` `Wal` onto its own in-memory disk (`MemDisk`). As
//! under `SyncPolicy::Always`, what a call that logged caused (its answer, its
//! deliveries, its messages to other shards) waits, in order, until the op
//! [`Op::Sync`] fsyncs that shard's log; the `Wal`'s syncer thread runs only inside that
//! call, so a run stays deterministic. [`Op::Crash`] loses everything in memory (queues in
//! memory, consumers, what waited, what was between shards), has the syncer write what
//! was appended without fsyncing it (or, on some disks, has that fsync fail, the page
//! cache keeping what the disk dropped), and crashes each disk so that it keeps, loses or
//! tears (per 512-byte sector, some disks garbling what they do not keep) those writes
//! and each unsynced directory operation; with `flip`, a bit of an old record (synced,
//! with a later write after it) flips first, and some starts meet a read error first,
//! which recovery must refuse without changing the disk. Then the shards come back as
//! `BrokerBuilder::build` brings them back: each log recovered into a fresh `Shard`
//! (`Shard::restore`), broker ids reserved past every restored one, the log epoch moved
//! on by the downtime, `finish_restore`, and the dead letters it made sent on; the
//! workload goes on.
//!
//! # What is checked
//!
//! After every engine call, against the ledger (contract §2 and §3):
//!
//! - **every message is in exactly one place**: ready, delayed, leased to one consumer,
//!   acked, in flight as a dead letter, dead-lettered into a named queue (where it is ready
//!   again), dropped and counted, removed by close, or never enqueued (duplicate, error);
//! - every delivery is of a message the ledger has ready in that queue, to a live consumer
//!   of it with credit; **never while another lease of the message is live**; its **tag is
//!   greater than every tag the queue gave before**; its `attempt` and death record are
//!   right; returned messages go before fresh ones;
//! - a queue with a ready message and a consumer with credit delivers (the engine may not
//!   sit on work); timers fire at their deadlines, each at its own tick within a jump (an
//!   expiry a tick early or late shows as a delivery, a settle answer or a gauge the ledger
//!   did not expect);
//! - every reply is what contract §3 says, errors in their order; **a stale settle returns
//!   `false` and changes nothing but `stale`**; a refused touch or nack changes nothing;
//! - the dead letters (addressee, origin, id, body, **death record**), their outcomes and the
//!   consumers that end are the expected ones;
//!
//! and after every step: `Shard::check_invariants` on each shard; **every live queue's stats
//! (gauges and counters) equal the ledger's counts**, and a closed queue has none; the
//! ledger's own books balance; each shard's `next_deadline()` lies after its `now` and no
//! later than the earliest deadline the ledger knows there. At the end, with every message
//! between shards delivered, no dead letter is left in flight.
//!
//! After each crash (contract §7), against what clients were told (an answer or delivery
//! counts only once the fsync covering it let it out): a flipped bit is refused by
//! recovery with an error naming the file and the damaged record's offset, never
//! accepted; a torn tail is cut, and no fsynced record is lost; every durable queue whose
//! declare was answered and that was not closed is back with its config, and none whose
//! close was answered, and no queue in memory; every message whose put was answered
//! `Enqueued` and that was not settled away is back (a dead letter in its source or its
//! dead-letter queue, or both, never neither), and none in a queue it never entered; none
//! whose ack was answered `true` is back there; a message's attempt is not below that of
//! its last delivery handed over (less one a release gave back); a delay that ends after
//! the restart ends at the same log-time instant; an answered put's id stays a duplicate
//! to the end of its window; the next tag is past every tag handed over; a restored
//! broker id is the message's own and no other's. Then the ledger starts its books again
//! from the restored shards (what a crash may or may not keep, it takes their word for),
//! and every check above goes on from there.
//!
//! What is not simulated: `SyncPolicy::Interval`, snapshots (`Shard::image` is read, not
//! written to disk), a failing fsync and a full disk (`tests/durable_faults.rs` covers
//! those on the threaded runtime).
//!
//! The ledger is not a model of the engine: it does not know the round robin or the order
//! within the ready lists (beyond "returned before fresh"), so it takes the engine's word
//! for which ready message goes to which consumer with credit and checks everything else
//! about it. `engine/tests/model/` pins those orders down on one shard. Retry jitter is
//! zero here, so every nack's wait is known to the tick.
//!
//! **Replicated runs** ([`replicated`], `--replicated`) take one shard to a cluster
//! (contract §9): three replicas of its group on openraft, on openraft's simulated
//! runtime (one thread, virtual time, a seeded random source), under crashes, cuts
//! between replicas and clocks that disagree; the leader's engine is built and its
//! changes proposed as a cluster's shard thread does it. The module says what it checks.
//!
//! # Running it
//!
//! `cargo test -p leasemq-sim` runs 500 seeds × 2 000 steps (`LEASEMQ_SIM_SEEDS`,
//! `LEASEMQ_SIM_STEPS` change that), 500 durable seeds × 1 000 steps with crashes
//! (`LEASEMQ_SIM_DURABLE_SEEDS`, `LEASEMQ_SIM_DURABLE_STEPS`), and shows that planted bugs
//! ([`Fault`]) are caught; `sim/tests/replicated.rs` runs 16 replicated seeds × 300
//! steps. `cargo run -p leasemq-sim --release -- --seeds N [--steps M] [--from S]
//! [--durable | --replicated]` soaks (the replicated runs one seed after another);
//! `--seed S` replays one seed.
//!
//! # Replay and shrinking
//!
//! Everything comes from the seed, so a seed replays exactly. On a violation,
//! [`run_seed`] cuts the trace after the failing step and deletes ops (chunks, then single
//! ops) while the same check still fails, then reports the seed, the setup and the shrunk
//! trace ([`Failure`]). Ops name their targets by index, resolved when they run, so every
//! subsequence of a trace is a trace.
//!
//! ```
//! let stats = leasemq_sim::run_seed(7, 300).expect("no violation");
//! assert_eq!(stats.steps, 300);
//! ```

mod client;
mod fault;
pub mod fuzz;
mod gen;
mod hold;
mod ledger;
mod op;
pub mod replicated;
mod restart;
mod rng;
mod setup;
mod shrink;
mod storage;
mod world;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

pub use fault::Fault;
pub use op::{Handle, IdSpec, MsgSpec, Op};
pub use rng::Rng;
pub use setup::Setup;

use fault::FaultState;
use gen::Generator;
use world::World;

/// A broken rule: which check, and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// A short name of the check, e.g. `"lease-overlap"`, `"stats"`, `"reply"`, `"panic"`.
    pub check: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(check: &'static str, detail: impl Into<String>) -> Violation {
        Violation {
            check,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.check, self.detail)
    }
}

/// What runs did, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub seeds: u64,
    pub steps: u64,
    /// Messages enqueued by producers.
    pub puts: u64,
    pub duplicates: u64,
    pub deliveries: u64,
    /// Deliveries with `attempt > 1`.
    pub redeliveries: u64,
    pub acks: u64,
    pub expiries: u64,
    /// Dead letters a dead-letter queue took.
    pub dead_letters: u64,
    /// Dead letters dropped (no dead-letter queue, or it refused them).
    pub dropped: u64,
    pub stale: u64,
    pub nacks: u64,
    pub rejects: u64,
    pub releases: u64,
    /// Touches that renewed a lease.
    pub touches: u64,
    /// Consumers cancelled (crashed), with or without unread deliveries.
    pub cancels: u64,
    pub closes: u64,
    /// Replies that were errors (as expected).
    pub errors: u64,
    /// Messages carried between shards.
    pub hops: u64,
    /// Of those, the ones that reached a shard behind the sender's time.
    pub catch_ups: u64,
    /// Of those, the ones that waited in the sender's backlog for room in a full inbox.
    pub backlogged: u64,
    /// Dead letters that died again in their dead-letter queue and moved on.
    pub chained: u64,
    /// Virtual time simulated, in ticks.
    pub ticks: u64,
    pub violations: u64,
    /// Durable runs: crashes and restarts.
    pub crashes: u64,
    /// Messages the restarts brought back.
    pub restored: u64,
    /// Torn last writes cut by recovery.
    pub torn: u64,
    /// Logs with a flipped bit that recovery refused, as it must.
    pub refusals: u64,
    /// Starts that met a read error, which recovery refused changing nothing, as it must.
    pub read_errors: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.seeds += o.seeds;
        self.steps += o.steps;
        self.puts += o.puts;
        self.duplicates += o.duplicates;
        self.deliveries += o.deliveries;
        self.redeliveries += o.redeliveries;
        self.acks += o.acks;
        self.expiries += o.expiries;
        self.dead_letters += o.dead_letters;
        self.dropped += o.dropped;
        self.stale += o.stale;
        self.nacks += o.nacks;
        self.rejects += o.rejects;
        self.releases += o.releases;
        self.touches += o.touches;
        self.cancels += o.cancels;
        self.closes += o.closes;
        self.errors += o.errors;
        self.hops += o.hops;
        self.catch_ups += o.catch_ups;
        self.backlogged += o.backlogged;
        self.chained += o.chained;
        self.ticks += o.ticks;
        self.violations += o.violations;
        self.crashes += o.crashes;
        self.restored += o.restored;
        self.torn += o.torn;
        self.refusals += o.refusals;
        self.read_errors += o.read_errors;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seeds {}, steps {}, virtual time {} ticks, violations {}",
            self.seeds, self.steps, self.ticks, self.violations
        )?;
        writeln!(
            f,
            "  puts {}, duplicates {}, error replies {}, deliveries {}, redeliveries {}, \
             expiries {}",
            self.puts,
            self.duplicates,
            self.errors,
            self.deliveries,
            self.redeliveries,
            self.expiries
        )?;
        writeln!(
            f,
            "  acks {}, nacks {}, rejects {}, releases {}, touches {}, stale settles {}, \
             cancels {}, closes {}",
            self.acks,
            self.nacks,
            self.rejects,
            self.releases,
            self.touches,
            self.stale,
            self.cancels,
            self.closes
        )?;
        write!(
            f,
            "  dead letters {} (of which chained {}), dropped {}, cross-shard messages {} \
             (of which caught up {}, waited for room {})",
            self.dead_letters,
            self.chained,
            self.dropped,
            self.hops,
            self.catch_ups,
            self.backlogged
        )?;
        if self.crashes > 0 {
            write!(
                f,
                "\n  crashes {}, messages restored {}, torn tails cut {}, damaged logs refused {}, \
                 read errors refused {}",
                self.crashes, self.restored, self.torn, self.refusals, self.read_errors
            )?;
        }
        Ok(())
    }
}

/// A seed that broke a rule, with the shortest trace found that breaks it the same way.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    /// Steps the seed was asked to run.
    pub steps: usize,
    pub setup: Box<Setup>,
    pub fault: Option<Fault>,
    /// At which step (1-based) the full run broke, and how.
    pub failed_at: usize,
    pub violation: Box<Violation>,
    /// The shrunk trace and how it fails.
    pub trace: Vec<Op>,
    pub shrunk_violation: Box<Violation>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "leasemq-sim: seed {} broke a rule at step {}: {}",
            self.seed, self.failed_at, self.violation
        )?;
        if let Some(fault) = self.fault {
            writeln!(f, "(with planted fault {fault:?})")?;
        }
        write!(f, "{}", self.setup)?;
        writeln!(
            f,
            "shrunk trace: {} of {} ops (consumer #n is the n-th live consumer, modulo \
             how many there are; hand[i] likewise):",
            self.trace.len(),
            self.failed_at
        )?;
        for (i, op) in self.trace.iter().enumerate() {
            writeln!(f, "  {:>4}. {op}", i + 1)?;
        }
        writeln!(f, "which fails with: {}", self.shrunk_violation)?;
        write!(
            f,
            "replay: cargo run -p leasemq-sim --release -- --seed {} --steps {}{}",
            self.seed,
            self.steps,
            if self.setup.durable { " --durable" } else { "" }
        )
    }
}

impl std::error::Error for Failure {}

/// Runs `steps` steps of seed `seed`; on a violation, shrinks the trace and returns it.
pub fn run_seed(seed: u64, steps: usize) -> Result<Stats, Failure> {
    run(Setup::from_seed(seed), steps, None)
}

/// Like [`run_seed`], with a data dir ([`Setup::durable_from_seed`]): some queues are
/// durable, each shard logs to a simulated disk, and the broker crashes and restarts.
pub fn run_durable_seed(seed: u64, steps: usize) -> Result<Stats, Failure> {
    run(Setup::durable_from_seed(seed), steps, None)
}

/// Like [`run_seed`], with `fault` planted from step `from_step` on: shows that the checks
/// catch that kind of bug.
pub fn run_seed_with_fault(
    seed: u64,
    steps: usize,
    fault: Fault,
    from_step: usize,
) -> Result<Stats, Failure> {
    run(Setup::from_seed(seed), steps, Some((fault, from_step)))
}

fn run(setup: Setup, steps: usize, fault: Option<(Fault, usize)>) -> Result<Stats, Failure> {
    let seed = setup.seed;
    let mut sim = Sim::new(&setup, fault);
    let mut gen = Generator::new(seed);
    let mut trace = Vec::with_capacity(steps);
    for _ in 0..steps {
        let op = quietly(|| gen.next(&sim.world));
        let op = match op {
            Ok(op) => op,
            Err(v) => {
                // The workload itself broke: there is no failing op to shrink to.
                let v = Violation::new("generator", v.detail);
                return Err(Failure {
                    seed,
                    steps,
                    setup: Box::new(setup),
                    fault: fault.map(|(f, _)| f),
                    failed_at: trace.len() + 1,
                    violation: Box::new(v.clone()),
                    trace,
                    shrunk_violation: Box::new(v),
                });
            }
        };
        trace.push(op);
        if let Err(v) = sim.step(trace.last().expect("pushed")) {
            return Err(fail(seed, steps, &setup, fault, trace, v));
        }
    }
    match sim.finish() {
        Ok(stats) => Ok(stats),
        Err(v) => Err(fail(seed, steps, &setup, fault, trace, v)),
    }
}

fn fail(
    seed: u64,
    steps: usize,
    setup: &Setup,
    fault: Option<(Fault, usize)>,
    trace: Vec<Op>,
    violation: Violation,
) -> Failure {
    let failed_at = trace.len();
    let (trace, shrunk_violation) = shrink::shrink(setup, fault, trace, &violation);
    Failure {
        seed,
        steps,
        setup: Box::new(setup.clone()),
        fault: fault.map(|(f, _)| f),
        failed_at,
        violation: Box::new(violation),
        trace,
        shrunk_violation: Box::new(shrunk_violation),
    }
}

/// Runs `ops` under `setup` and checks the end state; the first violation, if any, with
/// the number of ops carried out.
pub fn replay(setup: &Setup, ops: &[Op]) -> Result<Stats, (usize, Violation)> {
    replay_with(setup, None, ops)
}

pub(crate) fn replay_with(
    setup: &Setup,
    fault: Option<(Fault, usize)>,
    ops: &[Op],
) -> Result<Stats, (usize, Violation)> {
    let mut sim = Sim::new(setup, fault);
    for (i, op) in ops.iter().enumerate() {
        sim.step(op).map_err(|v| (i + 1, v))?;
    }
    sim.finish().map_err(|v| (ops.len(), v))
}

/// The world plus the per-step checks.
struct Sim {
    world: World,
}

impl Sim {
    fn new(setup: &Setup, fault: Option<(Fault, usize)>) -> Sim {
        let mut world = World::new(setup);
        world.fault = fault.map(|(f, from)| FaultState::new(f, from));
        Sim { world }
    }

    /// One op, then every check; a panic anywhere is a violation too.
    fn step(&mut self, op: &Op) -> Result<(), Violation> {
        let world = &mut self.world;
        world.step += 1;
        quietly(|| world.run(op))??;
        if world
            .fault
            .as_ref()
            .is_some_and(|f| f.forget_now(world.step))
            && world.ledger.forget_ready()
        {
            world.fault.as_mut().expect("checked").struck = true;
        }
        world.audit()
    }

    /// Delivers everything still in flight, checks, and takes stock.
    fn finish(&mut self) -> Result<Stats, Violation> {
        let world = &mut self.world;
        quietly(|| world.flush())??;
        world.audit()?;
        world.ledger.final_check()?;
        let mut stats = world.ledger.stats;
        stats.seeds = 1;
        stats.steps = world.step as u64;
        stats.ticks = world.now();
        Ok(stats)
    }
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f`, turning a panic into a violation that says where it happened, without the
/// default hook's report (a shrinking run panics many times over).
fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, Violation> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = info.to_string());
            } else {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.map_err(|_| Violation::new("panic", LAST_PANIC.with(|p| p.borrow().clone())))
}
