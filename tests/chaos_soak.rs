//! A chaos soak of the threaded broker under the system clock.
//!
//! For `LEASEMQ_SOAK_SECS` seconds (default 3) producers put uniquely numbered messages on 24
//! queues across four shards while faulty consumers ack, nack, release, touch, reject, stall
//! past their lease, crash with deliveries unread and leases held, and panic in their
//! handlers (caught, or killing the thread, which a supervisor restarts). Some queues have
//! `max_deliveries` and a dead-letter queue, mostly on another shard. Then production stops,
//! the consumers turn well-behaved and drain everything, and the test checks that every
//! message put was acked exactly once, or dead-lettered and drained exactly once; that the
//! queues' counters agree with what the consumers saw; and that every shard still works.
//!
//! `LEASEMQ_SOAK_SEED` picks the seed (printed at the start); thread timing still varies from
//! run to run. The long soak:
//! `LEASEMQ_SOAK_SECS=30 cargo test --release --test chaos_soak -- --nocapture`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leasemq::{
    Broker, CallerTurns, Consumer, DeathReason, Delivery, Error, Message, PutOutcome, Queue,
    QueueConfig, QueueStats, RetryPolicy, Settle,
};

mod common;
use common::*;

const SHARDS: usize = 4;
const WORK_QUEUES: usize = 24;
/// More consumers than queues: some queues have two.
const WORK_CONSUMERS: usize = 32;
const CONSUMERS_PER_DEAD_QUEUE: usize = 2;
const PRODUCERS: usize = 4;
/// How long a consumer waits for a delivery before it looks at the phase again.
const RECV_WAIT: Duration = Duration::from_millis(5);
/// The drain must finish within this, however slow the machine.
const DRAIN_DEADLINE: Duration = Duration::from_secs(120);

// --- seeded randomness ---------------------------------------------------------------------

/// splitmix64: small, seeded, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A number in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        ms(self.between(lo, hi))
    }
}

// --- the ledger of every message -----------------------------------------------------------

/// One byte per message: whether its put succeeded, and how many times it was acked on its
/// queue and acked (drained) from a dead-letter queue.
const PUT: u8 = 1;
const ACK_ONE: u8 = 1 << 1;
const ACK_MASK: u8 = 0b111 << 1;
const DEAD_ONE: u8 = 1 << 4;
const DEAD_MASK: u8 = 0b111 << 4;

/// Every message of every work queue, by its sequence number on that queue.
struct Ledger {
    queues: Vec<Mutex<Vec<u8>>>,
    /// Messages acked or drained from a dead-letter queue at least once.
    resolved: AtomicU64,
    /// Acks that returned true for a message already resolved.
    duplicates: AtomicU64,
}

impl Ledger {
    fn new() -> Ledger {
        Ledger {
            queues: (0..WORK_QUEUES).map(|_| Mutex::new(Vec::new())).collect(),
            resolved: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
        }
    }

    /// Numbers `n` new messages of queue `q` (not yet put); returns the first.
    fn reserve(&self, q: usize, n: usize) -> u64 {
        let mut entries = self.queues[q].lock().unwrap();
        let first = entries.len() as u64;
        entries.resize(first as usize + n, 0);
        first
    }

    fn mark_put(&self, q: usize, first: u64, n: usize) {
        let mut entries = self.queues[q].lock().unwrap();
        for entry in &mut entries[first as usize..first as usize + n] {
            *entry |= PUT;
        }
    }

    /// Records an ack that returned true (`one` = `ACK_ONE`) or a drained dead letter
    /// (`DEAD_ONE`). A second resolution of one message is a duplicate.
    fn resolve(&self, q: usize, seq: u64, one: u8, mask: u8) {
        let mut entries = self.queues[q].lock().unwrap();
        let entry = entries
            .get_mut(seq as usize)
            .unwrap_or_else(|| panic!("w{q:02}-{seq} was delivered but never numbered"));
        let before = *entry;
        if before & mask != mask {
            *entry += one;
        }
        if before & (ACK_MASK | DEAD_MASK) == 0 {
            self.resolved.fetch_add(1, SeqCst);
        } else {
            self.duplicates.fetch_add(1, SeqCst);
            eprintln!("chaos_soak: w{q:02}-{seq} resolved twice (ledger byte {before:#010b})");
        }
    }

    /// Up to `limit` messages put but neither acked nor drained, for the failure message.
    fn missing(&self, limit: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (q, entries) in self.queues.iter().enumerate() {
            for (seq, &entry) in entries.lock().unwrap().iter().enumerate() {
                if entry & PUT != 0 && entry & (ACK_MASK | DEAD_MASK) == 0 && out.len() < limit {
                    out.push(format!("w{q:02}-{seq}"));
                }
            }
        }
        out
    }
}

fn message_id(q: usize, seq: u64) -> String {
    format!("w{q:02}-{seq}")
}

fn message_body(q: usize, seq: u64) -> String {
    format!("w{q:02}:{seq}")
}

// --- queues and what the consumers saw on them ---------------------------------------------

/// What the test's threads did on one queue, to compare with its stats at the end.
#[derive(Default)]
struct Counts {
    puts: AtomicU64,
    put_refused: AtomicU64,
    seen: AtomicU64,
    acked: AtomicU64,
    nacked: AtomicU64,
    rejected: AtomicU64,
    released: AtomicU64,
    /// Settles and touches that returned false.
    refused: AtomicU64,
    touch_refused: AtomicU64,
    stalls: AtomicU64,
    /// Deliveries received and then dropped unsettled (crash, panic): a cancel may return
    /// them without counting them anywhere.
    abandoned: AtomicU64,
    /// For a work queue: its dead letters drained from the dead-letter queue, by reason.
    dead_rejected: AtomicU64,
    dead_max_deliveries: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, SeqCst);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(SeqCst)
}

struct Target {
    name: String,
    queue: Queue,
    /// For a dead-letter queue: `None`. For a work queue: `Some(its index)`.
    work: Option<usize>,
    ack_timeout: Duration,
    has_max_lease: bool,
    max_deliveries: Option<u32>,
    /// The target index of this work queue's dead-letter queue.
    dead_letter: Option<usize>,
    counts: Counts,
}

/// A delivery checked against the ledger: which message it carries.
#[derive(Clone, Copy)]
struct Seen {
    queue: usize,
    seq: u64,
    death: Option<DeathReason>,
}

#[derive(Default)]
struct Faults {
    stalls: AtomicU64,
    crashes: AtomicU64,
    handler_panics: AtomicU64,
    thread_deaths: AtomicU64,
    /// Acks after a stall past the lease that returned true: must stay 0.
    late_acks_accepted: AtomicU64,
    /// Acks of a crashed consumer's leases, after its cancel, that returned true: must stay 0.
    acks_after_cancel_accepted: AtomicU64,
}

/// The payload of every panic the test injects, so the hook can keep them quiet.
struct InjectedPanic;

const CHAOS: u8 = 0;
const DRAIN: u8 = 1;
const DONE: u8 = 2;

struct Soak {
    seed: u64,
    targets: Vec<Target>,
    ledger: Ledger,
    faults: Faults,
    phase: AtomicU8,
    failure: Mutex<Option<String>>,
}

impl Soak {
    fn phase(&self) -> u8 {
        self.phase.load(SeqCst)
    }

    fn fail(&self, why: String) {
        self.failure.lock().unwrap().get_or_insert(why);
        self.phase.store(DONE, SeqCst);
    }

    fn failed(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }

    /// Checks a delivery against what was put and how the queues are configured.
    fn check(&self, t: &Target, d: &Delivery) -> Seen {
        let e = d.envelope();
        let (q, seq) = parse_id(&e.id);
        assert_eq!(
            &e.body[..],
            message_body(q, seq).as_bytes(),
            "body of {}",
            e.id
        );
        assert!(e.attempt >= 1, "{} delivered with attempt 0", e.id);
        add(&t.counts.seen, 1);
        let origin = &self.targets[q];
        match t.work {
            Some(index) => {
                assert_eq!(q, index, "{} delivered on {}", e.id, t.name);
                assert!(
                    e.death.is_none(),
                    "{} has a death record on {}",
                    e.id,
                    t.name
                );
                if let Some(max) = t.max_deliveries {
                    assert!(e.attempt <= max, "{} delivered {} times", e.id, e.attempt);
                }
                Seen {
                    queue: q,
                    seq,
                    death: None,
                }
            }
            None => {
                let death = e.death.as_ref().expect("a dead letter has a death record");
                assert_eq!(death.queue, origin.name, "death record of {}", e.id);
                let here = self.targets.iter().position(|x| x.name == t.name);
                assert_eq!(
                    origin.dead_letter, here,
                    "{} dead-lettered to {}",
                    e.id, t.name
                );
                assert!(death.attempts >= 1, "{death:?}");
                if death.reason == DeathReason::MaxDeliveries {
                    assert_eq!(Some(death.attempts), origin.max_deliveries, "{death:?}");
                }
                Seen {
                    queue: q,
                    seq,
                    death: Some(death.reason),
                }
            }
        }
    }

    /// Records what one settle of `seen` on `t` returned.
    fn record(&self, t: &Target, seen: &Seen, op: Settle, ok: bool) {
        let c = &t.counts;
        if !ok {
            add(&c.refused, 1);
            if op == Settle::Touch {
                add(&c.touch_refused, 1);
            }
            return;
        }
        match op {
            Settle::Ack => {
                add(&c.acked, 1);
                match seen.death {
                    None => self.ledger.resolve(seen.queue, seen.seq, ACK_ONE, ACK_MASK),
                    Some(reason) => {
                        self.ledger
                            .resolve(seen.queue, seen.seq, DEAD_ONE, DEAD_MASK);
                        let origin = &self.targets[seen.queue].counts;
                        match reason {
                            DeathReason::Rejected => add(&origin.dead_rejected, 1),
                            DeathReason::MaxDeliveries => add(&origin.dead_max_deliveries, 1),
                        }
                    }
                }
            }
            Settle::Nack | Settle::NackWithDelay(_) => add(&c.nacked, 1),
            Settle::Reject => add(&c.rejected, 1),
            Settle::Release => add(&c.released, 1),
            Settle::Touch => {}
        }
    }
}

fn parse_id(id: &str) -> (usize, u64) {
    let parsed = id.strip_prefix('w').and_then(|rest| {
        let (q, seq) = rest.split_once('-')?;
        Some((q.parse().ok()?, seq.parse().ok()?))
    });
    parsed.unwrap_or_else(|| panic!("a delivery with an id never put: {id:?}"))
}

// --- setup ---------------------------------------------------------------------------------

fn work_queue_name(i: usize) -> String {
    format!("soak.w{i:02}")
}

/// One dead-letter queue per shard: the first names `soak.dead.{k}` that land on each.
fn dead_queue_names(broker: &Broker) -> Vec<String> {
    let mut names: Vec<Option<String>> = vec![None; SHARDS];
    for k in 0.. {
        let name = format!("soak.dead.{k}");
        names[broker.shard_of(&name)].get_or_insert(name);
        if names.iter().all(Option::is_some) {
            break;
        }
    }
    names.into_iter().map(Option::unwrap).collect()
}

fn declare(broker: &Broker, name: &str, config: QueueConfig) -> Queue {
    broker
        .declare_queue(name, config)
        .unwrap_or_else(|e| panic!("declare {name}: {e}"))
}

/// Work queues first (index = work index), then one dead-letter queue per shard.
fn targets(broker: &Broker, rng: &mut Rng) -> Vec<Target> {
    let dead_names = dead_queue_names(broker);
    let dead_config = QueueConfig {
        ack_timeout: ms(50),
        retry: RetryPolicy {
            initial: ms(2),
            multiplier: 2.0,
            max: ms(10),
            jitter: 0.0,
        },
        ..QueueConfig::default()
    };
    let dead_queues: Vec<Queue> = dead_names
        .iter()
        .map(|name| declare(broker, name, dead_config.clone()))
        .collect();
    let mut targets = Vec::new();
    for i in 0..WORK_QUEUES {
        let name = work_queue_name(i);
        let shard = broker.shard_of(&name);
        let ack_timeout = rng.millis(20, 50);
        // A third plain, a third dead-lettering rejects only, a third also max_deliveries.
        // The dead-letter queue is mostly on the next shard, sometimes on the same one.
        let kind = rng.below(3);
        let dead_shard = if rng.below(4) == 0 {
            shard
        } else {
            (shard + 1) % SHARDS
        };
        let dead_letter = (kind > 0).then_some(dead_shard);
        let max_deliveries = (kind == 2).then(|| rng.between(2, 4) as u32);
        let has_max_lease = rng.below(4) == 0;
        let config = QueueConfig {
            ack_timeout,
            max_lease: has_max_lease.then_some(ack_timeout * 3),
            retry: RetryPolicy {
                initial: rng.millis(1, 5),
                multiplier: 1.0 + rng.below(3) as f64 * 0.5,
                max: ms(20),
                jitter: rng.below(3) as f64 * 0.25,
            },
            max_deliveries,
            dead_letter: dead_letter.map(|s| dead_names[s].clone()),
            max_length: Some(rng.between(64, 256) as usize),
            ..QueueConfig::default()
        };
        targets.push(Target {
            queue: declare(broker, &name, config),
            name,
            work: Some(i),
            ack_timeout,
            has_max_lease,
            max_deliveries,
            dead_letter: dead_letter.map(|s| WORK_QUEUES + s),
            counts: Counts::default(),
        });
    }
    for (name, queue) in dead_names.into_iter().zip(dead_queues) {
        targets.push(Target {
            name,
            queue,
            work: None,
            ack_timeout: dead_config.ack_timeout,
            has_max_lease: false,
            max_deliveries: None,
            dead_letter: None,
            counts: Counts::default(),
        });
    }
    let mut shards_used = [false; SHARDS];
    for t in &targets[..WORK_QUEUES] {
        shards_used[t.queue.shard()] = true;
    }
    assert_eq!(shards_used, [true; SHARDS], "work queues on every shard");
    targets
}

// --- producers -----------------------------------------------------------------------------

fn produce(soak: &Soak, p: usize) {
    let mut rng = Rng::new(soak.seed, 1_000 + p as u64);
    let mine: Vec<usize> = (0..WORK_QUEUES).filter(|q| q % PRODUCERS == p).collect();
    while soak.phase() == CHAOS {
        let q = mine[rng.below(mine.len() as u64) as usize];
        let t = &soak.targets[q];
        let n = if rng.below(5) == 0 {
            rng.between(2, 8) as usize
        } else {
            1
        };
        let first = soak.ledger.reserve(q, n);
        let mut messages: Vec<Message> = (first..first + n as u64)
            .map(|seq| Message::new(message_body(q, seq)).with_id(message_id(q, seq)))
            .collect();
        if rng.below(10) == 0 {
            let delay = rng.millis(1, 5);
            messages = messages.into_iter().map(|m| m.with_delay(delay)).collect();
        }
        let result = if n == 1 {
            t.queue.put(messages.remove(0)).map(|o| vec![o])
        } else {
            t.queue.put_batch(messages)
        };
        match result {
            Ok(outcomes) => {
                assert_eq!(outcomes, vec![PutOutcome::Enqueued; n], "ids are unique");
                soak.ledger.mark_put(q, first, n);
                add(&t.counts.puts, n as u64);
            }
            // Back-pressure: these numbers stay unput and must never be delivered.
            Err(Error::QueueFull) => {
                add(&t.counts.put_refused, n as u64);
                thread::sleep(ms(1));
            }
            Err(e) => panic!("put on {}: {e}", t.name),
        }
    }
}

// --- consumers -----------------------------------------------------------------------------

fn target_of_slot(slot: usize) -> usize {
    if slot < WORK_CONSUMERS {
        slot % WORK_QUEUES
    } else {
        WORK_QUEUES + (slot - WORK_CONSUMERS) / CONSUMERS_PER_DEAD_QUEUE
    }
}

fn subscribe(t: &Target, name: &str, rng: &mut Rng) -> Consumer {
    let config = prefetch(rng.between(1, 16) as u32);
    t.queue
        .consume(name, config)
        .unwrap_or_else(|e| panic!("consume {name} on {}: {e}", t.name))
}

/// One incarnation of a consumer thread; returns when the soak is done, or dies of an
/// injected panic for its supervisor to restart.
fn consume_loop(soak: &Soak, slot: usize, incarnation: u64) {
    let t = &soak.targets[target_of_slot(slot)];
    let mut rng = Rng::new(soak.seed, ((slot as u64) << 32) | incarnation);
    // The same name every time: a crashed incarnation's cancel has reached the shard before
    // the next one's consume (same thread, or a thread started after the dead one ended).
    let name = format!("c{slot}");
    let mut consumer = subscribe(t, &name, &mut rng);
    loop {
        let phase = soak.phase();
        if phase == DONE {
            consumer.cancel();
            return;
        }
        let Some(d) = consumer.recv_timeout(RECV_WAIT).expect("recv_timeout") else {
            continue;
        };
        let seen = soak.check(t, &d);
        if phase == DRAIN {
            settle_batch(soak, t, &consumer, (d, seen), 64, |_| Settle::Ack);
        } else {
            consumer = chaos_step(soak, t, &mut rng, consumer, &name, d, seen);
        }
    }
}

/// Handles one delivery in the chaos phase: mostly well, sometimes badly. Returns the
/// consumer to go on with (a new one after a crash).
fn chaos_step(
    soak: &Soak,
    t: &Target,
    rng: &mut Rng,
    consumer: Consumer,
    name: &str,
    d: Delivery,
    seen: Seen,
) -> Consumer {
    let c = &t.counts;
    match rng.below(1000) {
        0..=9 => return crash(soak, t, rng, consumer, name, (d, seen)),
        10..=19 => {
            add(&c.abandoned, 1);
            add(&soak.faults.handler_panics, 1);
            let outcome = catch_unwind(AssertUnwindSafe(move || handler_that_panics(d)));
            assert!(outcome.is_err(), "the handler panics");
        }
        20..=21 => {
            add(&c.abandoned, 1);
            add(&soak.faults.thread_deaths, 1);
            // Unwinding drops the consumer and the delivery: the supervisor restarts it.
            std::panic::panic_any(InjectedPanic);
        }
        22..=41 => {
            add(&c.stalls, 1);
            add(&soak.faults.stalls, 1);
            // The fault injected: the lease, counted from before the delivery was received,
            // has run out when the sleep ends, so the late ack must be refused.
            thread::sleep(t.ack_timeout + rng.millis(2, 10));
            let ok = d.ack();
            if ok {
                add(&soak.faults.late_acks_accepted, 1);
            }
            soak.record(t, &seen, Settle::Ack, ok);
        }
        42..=101 => {
            let (op, ok) = if rng.below(2) == 0 {
                (Settle::Nack, d.nack())
            } else {
                let delay = rng.millis(0, 5);
                (Settle::NackWithDelay(delay), d.nack_with_delay(delay))
            };
            soak.record(t, &seen, op, ok);
        }
        102..=151 => soak.record(t, &seen, Settle::Release, t.queue.release(d.tag())),
        152..=231 => {
            soak.record(t, &seen, Settle::Touch, d.touch());
            soak.record(t, &seen, Settle::Ack, t.queue.ack(d.tag()));
        }
        232..=271 if t.dead_letter.is_some() => {
            soak.record(t, &seen, Settle::Reject, d.reject());
        }
        272..=371 => {
            let limit = rng.between(1, 8) as usize;
            let mut pick = Rng::new(rng.next(), 0);
            settle_batch(soak, t, &consumer, (d, seen), limit, |_| {
                match pick.below(10) {
                    0 => Settle::Touch, // followed by an ack of the same tag
                    1 => Settle::Nack,
                    2 => Settle::Release,
                    _ => Settle::Ack,
                }
            });
        }
        _ => soak.record(t, &seen, Settle::Ack, d.ack()),
    }
    consumer
}

fn handler_that_panics(d: Delivery) {
    let _ = d.envelope().body.len();
    std::panic::panic_any(InjectedPanic);
}

/// Settles `first` and up to `limit - 1` more deliveries already in the channel in one
/// `settle_batch`, with the op `op_for` picks for each (a touch is followed by an ack).
fn settle_batch(
    soak: &Soak,
    t: &Target,
    consumer: &Consumer,
    first: (Delivery, Seen),
    limit: usize,
    mut op_for: impl FnMut(&Seen) -> Settle,
) {
    let mut batch = vec![first];
    while batch.len() < limit {
        match consumer.try_recv().expect("try_recv") {
            Some(d) => {
                let seen = soak.check(t, &d);
                batch.push((d, seen));
            }
            None => break,
        }
    }
    let mut entries = Vec::new();
    let mut owners = Vec::new();
    for (i, (d, seen)) in batch.iter().enumerate() {
        let op = op_for(seen);
        entries.push((d.tag(), op));
        owners.push(i);
        if op == Settle::Touch {
            entries.push((d.tag(), Settle::Ack));
            owners.push(i);
        }
    }
    let results = t.queue.settle_batch(&entries);
    assert_eq!(results.len(), entries.len(), "one result per settle");
    for ((&(_, op), &i), ok) in entries.iter().zip(&owners).zip(results) {
        soak.record(t, &batch[i].1, op, ok);
    }
}

/// Crashes mid-batch: takes a few more deliveries, settles none, drops the consumer with
/// whatever is still unread in its channel, checks that the dropped leases are gone, and
/// starts again under the same name.
fn crash(
    soak: &Soak,
    t: &Target,
    rng: &mut Rng,
    consumer: Consumer,
    name: &str,
    first: (Delivery, Seen),
) -> Consumer {
    let mut held = vec![first];
    for _ in 0..rng.below(4) {
        if let Some(d) = consumer.try_recv().expect("try_recv") {
            let seen = soak.check(t, &d);
            held.push((d, seen));
        }
    }
    add(&t.counts.abandoned, held.len() as u64);
    add(&soak.faults.crashes, 1);
    drop(consumer);
    // The cancel is ordered before this thread's next call: every held lease is gone.
    for (d, seen) in held.iter().take(rng.below(3) as usize) {
        let ok = d.ack();
        if ok {
            add(&soak.faults.acks_after_cancel_accepted, 1);
        }
        soak.record(t, seen, Settle::Ack, ok);
    }
    subscribe(t, name, rng)
}

/// Runs a consumer slot, restarting it each time it dies of an injected panic.
fn supervise(soak: Arc<Soak>, slot: usize) {
    for incarnation in 0.. {
        let s = soak.clone();
        let worker = thread::Builder::new()
            .name(format!("soak-c{slot}"))
            .spawn(move || consume_loop(&s, slot, incarnation))
            .expect("spawn a consumer");
        match worker.join() {
            Ok(()) => return,
            Err(payload) if payload.is::<InjectedPanic>() => continue,
            Err(payload) => {
                soak.fail(format!("consumer c{slot}: {}", panic_text(&*payload)));
                return;
            }
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Panics of the broker seen by the hook, as "thread: message".
static SHARD_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps injected panics quiet and notes any panic of the broker: on a shard thread, or in
/// the broker's code on a caller's thread (which runs a shard's turn when it sleeps).
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().is::<InjectedPanic>() {
            return;
        }
        let thread = thread::current();
        let name = thread.name().unwrap_or("");
        let in_broker = info.location().is_some_and(|at| {
            let file = at.file();
            file.contains("shard/src") || file.contains("engine/src")
        });
        if name.starts_with("leasemq-shard") || in_broker {
            let mut panics = SHARD_PANICS.lock().unwrap_or_else(|e| e.into_inner());
            panics.push(format!("{name}: {info}"));
        }
        default(info);
    }));
}

fn shard_panic() -> Option<String> {
    let panics = SHARD_PANICS.lock().unwrap_or_else(|e| e.into_inner());
    panics.first().cloned()
}

/// Waits for `threads` to end. A thread blocked on a call to a shard whose thread died never
/// ends, so after `limit` this fails with the reason the soak already knows, if any.
fn join_within(soak: &Soak, threads: Vec<thread::JoinHandle<()>>, limit: Duration, what: &str) {
    // Once the soak has failed, threads stuck on a dead shard are not worth waiting for.
    let limit = if soak.failed() { secs(2) } else { limit };
    let deadline = Instant::now() + limit;
    while threads.iter().any(|t| !t.is_finished()) {
        if Instant::now() > deadline {
            let why = soak.failure.lock().unwrap().clone();
            panic!(
                "chaos soak (seed {}): {what} still running after {limit:?}; {}",
                soak.seed,
                why.unwrap_or_else(|| "no failure recorded".to_string())
            );
        }
        thread::sleep(ms(5));
    }
    for t in threads {
        if let Err(payload) = t.join() {
            soak.fail(format!("{what}: {}", panic_text(&*payload)));
        }
    }
}

/// Sleeps in short steps until `done` or a failure (a shard thread's panic counts as one).
fn wait_for(soak: &Soak, mut done: impl FnMut() -> bool) {
    while !done() && !soak.failed() {
        if let Some(why) = shard_panic() {
            soak.fail(format!("a shard thread panicked: {why}"));
        }
        thread::sleep(ms(5));
    }
}

// --- the end: accounting -------------------------------------------------------------------

/// Every queue's stats, once every dead letter's outcome has reached the queue it came from
/// (the dead-letter queue may hand a letter to a consumer before its origin hears back).
fn settled_stats(soak: &Soak) -> Vec<QueueStats> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats: Vec<QueueStats> = soak.targets.iter().map(|t| t.queue.stats()).collect();
        let landed = soak.targets[..WORK_QUEUES]
            .iter()
            .zip(&stats)
            .all(|(t, s)| {
                let drained = get(&t.counts.dead_rejected) + get(&t.counts.dead_max_deliveries);
                s.dead_lettered + s.dropped >= drained
            });
        if landed || Instant::now() > deadline {
            return stats;
        }
        thread::sleep(ms(1));
    }
}

fn check_ledger(soak: &Soak) {
    for (q, entries) in soak.ledger.queues.iter().enumerate() {
        for (seq, &entry) in entries.lock().unwrap().iter().enumerate() {
            let acks = (entry & ACK_MASK) / ACK_ONE;
            let dead = (entry & DEAD_MASK) / DEAD_ONE;
            let id = message_id(q, seq as u64);
            if entry & PUT == 0 {
                assert_eq!((acks, dead), (0, 0), "{id} was refused but delivered");
            } else {
                assert_eq!(acks + dead, 1, "{id}: acked {acks} times, drained {dead}");
            }
        }
    }
}

/// Compares each queue's counters with what the test's threads did.
fn check_stats(soak: &Soak, stats: &[QueueStats]) {
    for (t, s) in soak.targets.iter().zip(stats) {
        let c = &t.counts;
        let at = |what: &str| format!("{what} on {}: {s:?}", t.name);
        assert_eq!(
            (s.ready, s.delayed, s.leased),
            (0, 0, 0),
            "{}",
            at("gauges")
        );
        assert_eq!(s.consumers, 0, "{}", at("consumers"));
        assert_eq!(s.acked, get(&c.acked), "{}", at("acked"));
        assert_eq!(s.nacked, get(&c.nacked), "{}", at("nacked"));
        assert_eq!(s.rejected, get(&c.rejected), "{}", at("rejected"));
        assert!(s.released >= get(&c.released), "{}", at("released"));
        assert_eq!(
            (s.duplicates, s.dropped),
            (0, 0),
            "{}",
            at("duplicates, dropped")
        );
        assert!(s.expired >= get(&c.stalls), "{}", at("every stall expired"));
        assert!(s.delivered >= get(&c.seen), "{}", at("delivered"));
        // Every delivery ended one way; only a cancel's return of a received lease counts
        // nowhere, and only abandoned deliveries can end that way.
        let ended = s.acked + s.nacked + s.rejected + s.released + s.expired;
        assert!(s.delivered >= ended, "{}", at("delivered >= ended"));
        assert!(
            s.delivered - ended <= get(&c.abandoned),
            "{}",
            at(&format!(
                "uncounted ends <= {} abandoned",
                get(&c.abandoned)
            ))
        );
        // Every refused settle was stale, but for touches that max_lease may have refused.
        let refused = get(&c.refused);
        if t.has_max_lease {
            let range = refused - get(&c.touch_refused)..=refused;
            assert!(
                range.contains(&s.stale),
                "{}",
                at(&format!("stale in {range:?}"))
            );
        } else {
            assert_eq!(s.stale, refused, "{}", at("stale"));
        }
        match t.work {
            Some(_) => {
                assert_eq!(s.enqueued, get(&c.puts), "{}", at("enqueued"));
                assert_eq!(
                    s.dead_lettered,
                    s.rejected + get(&c.dead_max_deliveries),
                    "{}",
                    at("dead letters drained")
                );
                assert_eq!(
                    s.rejected,
                    get(&c.dead_rejected),
                    "{}",
                    at("rejects drained")
                );
                if t.max_deliveries.is_none() {
                    assert_eq!(get(&c.dead_max_deliveries), 0, "{}", at("no max"));
                }
            }
            None => {
                let here = soak.targets.iter().position(|x| x.name == t.name);
                let sent: u64 = soak
                    .targets
                    .iter()
                    .zip(stats)
                    .filter(|(origin, _)| origin.dead_letter == here)
                    .map(|(_, o)| o.dead_lettered)
                    .sum();
                assert_eq!(s.enqueued, sent, "{}", at("dead letters received"));
                assert_eq!((s.rejected, s.dead_lettered), (0, 0), "{}", at("rejects"));
            }
        }
    }
}

/// Every shard still answers: a fresh queue on each takes a put, delivers and acks it.
fn check_every_shard_works(broker: &Broker) {
    for shard in 0..broker.shard_count() {
        let name = (0..)
            .map(|k| format!("soak.health.{k}"))
            .find(|name| broker.shard_of(name) == shard)
            .expect("a name for every shard");
        let q = declare(broker, &name, with_ack_timeout(secs(60)));
        let c = q.consume("health", prefetch(1)).expect("consume");
        assert_eq!(q.put(msg("probe")).expect("put"), PutOutcome::Enqueued);
        let d = c.recv_timeout(secs(30)).expect("recv").expect("delivered");
        assert_eq!(d.envelope().id, "probe");
        assert!(d.ack(), "shard {shard} acks");
        assert_stats!(q, { acked: 1, enqueued: 1, leased: 0, consumers: 1 });
        c.cancel();
        assert!(q.close(), "shard {shard} closes a queue");
    }
}

/// Shuts the broker down, failing if that does not return.
fn shutdown_within(broker: &Broker, limit: Duration) {
    let (done, finished) = mpsc::channel();
    let b = broker.clone();
    thread::spawn(move || {
        b.shutdown();
        let _ = done.send(());
    });
    finished
        .recv_timeout(limit)
        .expect("broker.shutdown() returns: every shard thread ends");
}

fn soak_duration() -> Duration {
    let secs = std::env::var("LEASEMQ_SOAK_SECS").map_or(3.0, |s| {
        s.parse::<f64>()
            .unwrap_or_else(|_| panic!("LEASEMQ_SOAK_SECS={s:?} is not a number of seconds"))
    });
    Duration::from_secs_f64(secs)
}

fn soak_seed() -> u64 {
    match std::env::var("LEASEMQ_SOAK_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("LEASEMQ_SOAK_SEED={s:?} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

#[test]
fn chaos_soak_loses_nothing_and_acks_nothing_twice() {
    soak(CallerTurns::default());
}

/// The same soak with every blocking call running the shard's turn itself whenever the
/// shard thread sleeps (on an idle host the default leaves every turn to the shard thread).
#[test]
fn chaos_soak_with_callers_running_the_turns_loses_nothing_and_acks_nothing_twice() {
    soak(CallerTurns::Always);
}

fn soak(turns: CallerTurns) {
    install_panic_hook();
    let duration = soak_duration();
    let seed = soak_seed();
    eprintln!(
        "chaos_soak: seed {seed}, {:.1} s of chaos, caller turns {turns:?} \
         (rerun with LEASEMQ_SOAK_SEED={seed})",
        duration.as_secs_f64()
    );
    let broker = Broker::builder()
        .shards(SHARDS)
        .caller_turns(turns)
        .build()
        .expect("broker");
    let soak = Arc::new(Soak {
        seed,
        targets: targets(&broker, &mut Rng::new(seed, 0)),
        ledger: Ledger::new(),
        faults: Faults::default(),
        phase: AtomicU8::new(CHAOS),
        failure: Mutex::new(None),
    });
    let started = Instant::now();
    let slots = WORK_CONSUMERS + SHARDS * CONSUMERS_PER_DEAD_QUEUE;
    let supervisors: Vec<_> = (0..slots)
        .map(|slot| {
            let s = soak.clone();
            thread::spawn(move || supervise(s, slot))
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let s = soak.clone();
            thread::spawn(move || produce(&s, p))
        })
        .collect();

    wait_for(&soak, || started.elapsed() >= duration);
    let _ = soak.phase.compare_exchange(CHAOS, DRAIN, SeqCst, SeqCst);
    join_within(&soak, producers, secs(30), "producers");
    let chaos_time = started.elapsed();
    let put: u64 = soak.targets.iter().map(|t| get(&t.counts.puts)).sum();
    let drain_deadline = Instant::now() + DRAIN_DEADLINE;
    wait_for(&soak, || {
        if Instant::now() > drain_deadline {
            let stats: Vec<_> = (soak.targets.iter())
                .map(|t| (&t.name, t.queue.stats()))
                .collect();
            soak.fail(format!(
                "the drain did not finish in {DRAIN_DEADLINE:?}: {} of {put} messages \
                 resolved; missing (first 20): {:?}; stats: {stats:#?}",
                get(&soak.ledger.resolved),
                soak.ledger.missing(20)
            ));
        }
        get(&soak.ledger.resolved) >= put
    });
    let drain_time = started.elapsed() - chaos_time;
    soak.phase.store(DONE, SeqCst);
    join_within(&soak, supervisors, secs(30), "consumers");
    if let Some(why) = soak.failure.lock().unwrap().take() {
        panic!("chaos soak failed (seed {seed}): {why}");
    }

    let f = &soak.faults;
    assert_eq!(
        get(&f.late_acks_accepted),
        0,
        "acks after the lease ran out"
    );
    assert_eq!(get(&f.acks_after_cancel_accepted), 0, "acks after a cancel");
    assert_eq!(get(&soak.ledger.duplicates), 0, "duplicate acks");
    check_ledger(&soak);
    let stats = settled_stats(&soak);
    check_stats(&soak, &stats);
    check_every_shard_works(&broker);
    let handled = broker.turn_stats();
    if turns == CallerTurns::Always {
        // The soak ran what it is meant to: callers handled some of the shards' requests.
        assert!(handled.callers > 0, "no caller ran a turn: {handled:?}");
    }
    shutdown_within(&broker, secs(30));
    assert_eq!(shard_panic(), None, "no shard thread panicked");
    assert_err!(soak.targets[0].queue.put(msg("late")), Error::ShutDown);

    let sum = |field: fn(&QueueStats) -> u64| stats.iter().map(field).sum::<u64>();
    let resolved = get(&soak.ledger.resolved);
    let dead = sum(|s| s.enqueued) - put;
    eprintln!(
        "chaos_soak: seed {seed}, {:.1} s chaos + {:.2} s drain, {SHARDS} shards, \
         {WORK_QUEUES}+{SHARDS} queues: {put} messages put ({} refused as full), {} acked, \
         {dead} dead-lettered and drained, {} redeliveries ({} expired leases); injected \
         {} stalls, {} crashes, {} handler panics, {} thread deaths; lost {}, duplicate acks {}; \
         requests handled by shard threads {}, by callers {}",
        chaos_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        soak.targets
            .iter()
            .map(|t| get(&t.counts.put_refused))
            .sum::<u64>(),
        resolved - dead,
        sum(|s| s.delivered) - sum(|s| s.enqueued),
        sum(|s| s.expired),
        get(&f.stalls),
        get(&f.crashes),
        get(&f.handler_panics),
        get(&f.thread_deaths),
        put - resolved,
        get(&soak.ledger.duplicates),
        handled.shard_threads,
        handled.callers,
    );
}

/// Names `prefix.{k}` until one lands on `shard`.
fn name_on_shard(broker: &Broker, prefix: &str, shard: usize) -> String {
    (0..)
        .map(|k| format!("{prefix}.{k}"))
        .find(|name| broker.shard_of(name) == shard)
        .expect("a name for every shard")
}

/// Runs `work` on its own thread and fails if it has not returned within `limit`: a call to
/// a shard whose thread died never returns.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(work());
    });
    match finished.recv_timeout(limit) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within {limit:?}: a shard thread died")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

#[test]
fn cross_shard_dead_letters_under_the_system_clock_keep_every_shard_alive() {
    // With 1 µs ticks the clock moves between almost any two requests a shard handles.
    let broker = Broker::builder()
        .shards(2)
        .tick(Duration::from_micros(1))
        .build()
        .expect("broker");
    let dead = declare(
        &broker,
        &name_on_shard(&broker, "mini.dead", 1),
        QueueConfig::default(),
    );
    let source = declare(
        &broker,
        &name_on_shard(&broker, "mini.src", 0),
        QueueConfig {
            dead_letter: Some(dead.name().to_string()),
            ..QueueConfig::default()
        },
    );
    let stop = Arc::new(AtomicU8::new(0));
    // Two threads keep both shards' inboxes busy, so that dead letters and outcomes share
    // batches with other requests.
    let busy: Vec<_> = (0..2)
        .map(|shard| {
            let q = declare(
                &broker,
                &name_on_shard(&broker, "mini.busy", shard),
                QueueConfig::default(),
            );
            let stop = stop.clone();
            thread::spawn(move || {
                while stop.load(SeqCst) == 0 {
                    let _ = q.put(Message::new("x"));
                    let _ = q.stats();
                }
            })
        })
        .collect();
    // One thread rejects into the dead-letter queue on the other shard: each reject sends a
    // dead letter to shard 1, and its outcome back to shard 0.
    let rejects = within(secs(20), "rejecting for 2 s", move || {
        let consumer = source.consume("c", prefetch(1)).expect("consume");
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < secs(2) {
            source.put(Message::new("x")).expect("put");
            let d = consumer
                .recv_timeout(secs(5))
                .expect("recv")
                .expect("delivered");
            assert!(
                d.reject(),
                "reject of a live lease #{n} {d:?}: {:?}",
                source.stats()
            );
            n += 1;
        }
        n
    });
    stop.store(1, SeqCst);
    within(secs(20), "the busy threads", move || {
        busy.into_iter()
            .for_each(|t| t.join().expect("busy thread"))
    });
    assert_eq!(
        within(secs(20), "stats", move || dead.stats().enqueued),
        rejects
    );
    check_every_shard_works(&broker);
}
