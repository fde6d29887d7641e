//! The limits of contract §3 through the public API: arbitrary bytes become a sequence of
//! `declare_queue`, `consume_with_priority`, `put`, `put_batch`, `close` and `queue` calls
//! on a 2-shard broker with a manual clock, with names, configs and messages at and past every limit
//! (zero and huge durations, NaN, infinite and negative multipliers and jitter, prefetch 0
//! and huge, bodies around `max_body_bytes`, ids of 0, 1 024 and 1 025 bytes, dead letters to
//! queues that do or do not exist). A reference written from the contract (`docs/contract.md`) says what each call
//! must answer; the target panics when the broker answers anything else, when an accepted
//! queue cannot be found afterwards, or when a refused one can.
//!
//! The clock never moves and nothing is acked, so every message put stays live: the
//! reference knows each queue's live ids and length exactly, and with them every `put`
//! outcome (`Enqueued`, `Duplicate`, or which error).

#![no_main]

use std::collections::{HashMap, HashSet};
use std::mem::discriminant;
use std::sync::OnceLock;
use std::time::Duration;

use leasemq::{Broker, Consumer, ConsumerConfig, Error, Message, PutOutcome, Queue, QueueConfig};
use leasemq_sim::fuzz::ByteSource;
use libfuzzer_sys::fuzz_target;

const DAY: Duration = Duration::from_secs(24 * 3600);
const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);
const MAX_BODY_LIMIT: usize = 64 * 1024 * 1024;
/// Calls per input, at most: enough to build up queues, consumers and duplicates.
const MAX_CALLS: usize = 64;

/// The input as a stream of choices; 0 once it runs out.
struct Input<'a>(ByteSource<'a>);

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next `n` bytes (at most 8) as a little-endian number.
    fn take(&mut self, n: usize) -> u64 {
        self.0.take(n)
    }

    /// In `0..n`, from one byte (`n` is at most 256 everywhere here).
    fn below(&mut self, n: usize) -> usize {
        self.take(1) as usize % n
    }

    fn u32(&mut self) -> u32 {
        self.take(4) as u32
    }

    fn u64(&mut self) -> u64 {
        self.take(8)
    }

    /// Up to `max` raw bytes, as (lossy) UTF-8.
    fn text(&mut self, max: usize) -> String {
        let len = self.below(max + 1);
        String::from_utf8_lossy(self.0.bytes(len)).into_owned()
    }

    fn queue_name(&mut self) -> String {
        const NAMES: [&str; 9] = [
            "a",
            "b",
            "c",
            "jobs.eu-1",
            "x:y_z",
            "",
            "has space",
            "ü",
            "a/b",
        ];
        match self.below(12) {
            i @ 0..=8 => NAMES[i].to_string(),
            9 => "n".repeat(255),
            10 => "n".repeat(256),
            _ => self.text(12),
        }
    }

    fn consumer_name(&mut self) -> String {
        const NAMES: [&str; 5] = ["ann", "bob", "", "ü é", "has space"];
        match self.below(8) {
            i @ 0..=4 => NAMES[i].to_string(),
            5 => "c".repeat(255),
            6 => "c".repeat(256),
            _ => self.text(12),
        }
    }

    fn duration(&mut self) -> Duration {
        match self.below(14) {
            0 => Duration::ZERO,
            1 => Duration::from_nanos(1),
            2 => Duration::from_nanos(999_999),
            3 => Duration::from_millis(1),
            4 => Duration::from_millis(1) + Duration::from_nanos(1),
            5 => Duration::from_secs(30),
            6 => DAY,
            7 => WEEK,
            8 => WEEK + Duration::from_nanos(1),
            9 => Duration::MAX,
            10 => Duration::from_millis(u64::from(self.u32())),
            11 => Duration::from_nanos(self.u64()),
            12 => Duration::new(self.u64(), self.u32() % 1_000_000_000),
            _ => Duration::from_secs(u64::from(self.u32() & 0xf_ffff)),
        }
    }

    fn float(&mut self) -> f64 {
        match self.below(14) {
            0 => 0.0,
            1 => -0.0,
            2 => 1.0,
            3 => 2.0,
            4 => 0.5,
            5 => 1.0 - f64::EPSILON / 2.0,
            6 => 1.0 + f64::EPSILON,
            7 => f64::NAN,
            8 => f64::INFINITY,
            9 => f64::NEG_INFINITY,
            10 => -1.0,
            11 => f64::MAX,
            12 => f64::MIN_POSITIVE,
            _ => f64::from_bits(self.u64()),
        }
    }

    fn config(&mut self) -> QueueConfig {
        let mut c = QueueConfig::default();
        // Which fields differ from the default: one bit each.
        let fields = self.take(2);
        let set = |bit: u32| fields & (1 << bit) != 0;
        if set(0) {
            c.ack_timeout = self.duration();
        }
        if set(1) {
            c.max_lease = Some(self.duration());
        }
        if set(2) {
            c.retry.initial = self.duration();
        }
        if set(3) {
            c.retry.multiplier = self.float();
        }
        if set(4) {
            c.retry.max = self.duration();
        }
        if set(5) {
            c.retry.jitter = self.float();
        }
        if set(6) {
            c.max_deliveries = Some(match self.below(5) {
                0 => 0,
                1 => 1,
                2 => 3,
                3 => u32::MAX,
                _ => self.u32(),
            });
        }
        if set(7) {
            c.dead_letter = Some(self.queue_name());
        }
        if set(8) {
            c.dedup_window = self.duration();
        }
        if set(9) {
            c.max_length = Some(match self.below(6) {
                0 => 0,
                1 => 1,
                2 => 2,
                3 => 5,
                4 => usize::MAX,
                _ => self.u32() as usize,
            });
        }
        if set(10) {
            c.max_body_bytes = match self.below(8) {
                0 => 0,
                1 => 1,
                2 => 8,
                3 => 64,
                4 => MAX_BODY_LIMIT,
                5 => MAX_BODY_LIMIT + 1,
                6 => usize::MAX,
                _ => self.u32() as usize,
            };
        }
        if set(11) {
            c.durable = true;
        }
        if set(12) {
            c.max_priority = Some(self.below(256) as u8);
        }
        c
    }

    fn prefetch(&mut self) -> u32 {
        match self.below(7) {
            0 => 0,
            1 => 1,
            2 => 100,
            3 => 65_535,
            4 => 65_536,
            5 => u32::MAX,
            _ => self.u32(),
        }
    }

    /// A message, and what the reference needs to know of it.
    fn message(&mut self) -> (Message, MsgFacts) {
        let body_len = match self.below(9) {
            0 => 0,
            1 => 1,
            2 => 8,
            3 => 9,
            4 => 64,
            5 => 65,
            6 => 300,
            _ => self.below(256),
        };
        let id = match self.below(9) {
            0 | 1 => None,
            2 => Some(String::new()),
            3 => Some("m1".to_string()),
            4 => Some("m2".to_string()),
            5 => Some("i".repeat(1024)),
            6 => Some("i".repeat(1025)),
            7 => Some("~0-1".to_string()),
            _ => Some(self.text(8)),
        };
        let delay = if self.below(3) == 0 {
            self.duration()
        } else {
            Duration::ZERO
        };
        let mut message = Message::new(vec![b'b'; body_len]);
        if let Some(id) = &id {
            message = message.with_id(id.clone());
        }
        if !delay.is_zero() {
            message = message.with_delay(delay);
        }
        if self.below(4) == 0 {
            message = message.with_priority(self.below(256) as u8);
        }
        let facts = MsgFacts {
            id,
            delay,
            body_len,
        };
        (message, facts)
    }
}

struct MsgFacts {
    id: Option<String>,
    delay: Duration,
    body_len: usize,
}

/// What the reference knows of one queue the broker accepted.
struct ModelQueue {
    name: String,
    config: QueueConfig,
    closed: bool,
    /// Ids given to live messages.
    ids: HashSet<String>,
    /// The text of every broker-assigned id live here: a given id equal to one is a
    /// duplicate (contract §3 Deduplication: the id is live in the queue).
    generated: HashSet<String>,
    live: usize,
    enqueued: u64,
    duplicates: u64,
    consumers: HashSet<String>,
}

/// contract §3 Limits and `declare_queue`: 1–255 bytes of `[A-Za-z0-9._:-]`.
fn valid_queue_name(name: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
    (1..=255).contains(&name.len()) && name.bytes().all(allowed)
}

/// contract §3 Limits: consumer names are 1–255 bytes of UTF-8.
fn valid_consumer_name(name: &str) -> bool {
    (1..=255).contains(&name.len())
}

/// contract §3 Limits on a queue config, without the dead-letter queue's existence: every
/// broken one is `InvalidConfig`.
fn config_breaks_limits(name: &str, c: &QueueConfig) -> bool {
    let ms = Duration::from_millis(1);
    let ack_ok = (ms..=WEEK).contains(&c.ack_timeout);
    let lease_ok = c.max_lease.is_none_or(|l| l >= c.ack_timeout);
    // `>=` is false for NaN, as it must be.
    let multiplier_ok = c.retry.multiplier >= 1.0;
    let jitter_ok = (0.0..=1.0).contains(&c.retry.jitter);
    let counts_ok = c.max_deliveries != Some(0) && c.max_length != Some(0);
    let body_ok = (1..=MAX_BODY_LIMIT).contains(&c.max_body_bytes);
    let dead_letter_ok = c.dead_letter.as_deref() != Some(name);
    // The target's broker has no data dir (contract §7).
    let durable_ok = !c.durable;
    !(ack_ok
        && lease_ok
        && multiplier_ok
        && jitter_ok
        && counts_ok
        && body_ok
        && dead_letter_ok
        && durable_ok)
}

/// Where the broker is stricter than contract §3 says, the reference lets it be (so the target
/// looks past these to other bugs) unless `LEASEMQ_FUZZ_STRICT` is set in the environment;
/// `fuzz/regressions/validation/` holds an input for each, which fails in strict mode:
///
/// - an infinite `retry.multiplier` is `InvalidConfig` (the contract asks only for ≥ 1.0);
/// - `retry.initial`, `retry.max` and `dedup_window` over 7 days are `InvalidConfig` (the
///   contract sets them no limit);
/// - a `dead_letter` that is not a valid queue name is `InvalidConfig` (the contract: such a
///   queue cannot exist, so `UnknownQueue`).
fn strict() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(|| std::env::var_os("LEASEMQ_FUZZ_STRICT").is_some())
}

/// The limits the broker adds to contract §3's (see [`strict`]).
fn broker_only_limits(c: &QueueConfig) -> bool {
    c.retry.multiplier == f64::INFINITY
        || c.retry.initial > WEEK
        || c.retry.max > WEEK
        || c.dedup_window > WEEK
        || c.dead_letter
            .as_deref()
            .is_some_and(|dl| !valid_queue_name(dl))
}

/// The errors contract §3 allows for this call; `Ok` only when it allows none. Where the contract
/// names no order between two broken rules, either error is right.
#[derive(Default)]
struct Allowed(Vec<Error>);

impl Allowed {
    fn add(&mut self, e: Error) {
        self.0.push(e);
    }

    fn check<T: std::fmt::Debug>(&self, call: &str, got: &Result<T, Error>) {
        match got {
            Ok(v) => assert!(
                self.0.is_empty(),
                "{call}: accepted ({v:?}), but the contract refuses it with one of {:?}",
                self.0
            ),
            Err(e) => assert!(
                self.0.iter().any(|a| discriminant(a) == discriminant(e)),
                "{call}: refused with {e:?}, but the contract allows only {:?}",
                self.0
            ),
        }
    }
}

fn same<T: std::fmt::Debug + PartialEq>(
    call: &str,
    got: &Result<T, Error>,
    want: &Result<T, Error>,
) {
    let agree = match (got, want) {
        (Ok(g), Ok(w)) => g == w,
        (Err(g), Err(w)) => discriminant(g) == discriminant(w),
        _ => false,
    };
    assert!(agree, "{call}: got {got:?}, the contract says {want:?}");
}

/// contract §3 `put`: the message's own error, if any, in the contract's order after `QueueClosed`.
fn message_error(m: &MsgFacts, config: &QueueConfig) -> Option<Error> {
    let id_bad =
        m.id.as_ref()
            .is_some_and(|id| !(1..=1024).contains(&id.len()));
    if id_bad || m.delay > WEEK {
        return Some(Error::InvalidMessage(String::new()));
    }
    (m.body_len > config.max_body_bytes).then_some(Error::MessageTooLarge)
}

struct World {
    broker: Broker,
    queues: Vec<ModelQueue>,
    /// Every handle the broker gave, with the queue it names; old ones stay (stale handles).
    handles: Vec<(Queue, usize)>,
    live: HashMap<String, usize>,
    /// Each shard's last broker-assigned id sequence number.
    next_auto: HashMap<usize, u64>,
    /// Kept so their names stay taken: dropping one cancels it.
    consumers: Vec<Consumer>,
}

impl World {
    fn declare(&mut self, name: String, config: QueueConfig) {
        let call = format!("declare_queue({name:?}, {config:?})");
        let mut allowed = Allowed::default();
        if !valid_queue_name(&name) {
            allowed.add(Error::InvalidName);
        }
        if config_breaks_limits(&name, &config) || (!strict() && broker_only_limits(&config)) {
            allowed.add(Error::InvalidConfig(String::new()));
        }
        if let Some(dl) = &config.dead_letter {
            if dl != &name && !self.live.contains_key(dl) {
                allowed.add(Error::UnknownQueue(String::new()));
            }
        }
        let existing = self.live.get(&name).copied();
        if existing.is_some_and(|q| self.queues[q].config != config) {
            allowed.add(Error::ConfigMismatch);
        }
        let got = self.broker.declare_queue(&name, config.clone());
        allowed.check(&call, &got);
        if let Ok(queue) = got {
            assert_eq!(queue.name(), name, "{call}: the handle's name");
            let q = existing.unwrap_or_else(|| {
                self.queues.push(ModelQueue {
                    name: name.clone(),
                    config,
                    closed: false,
                    ids: HashSet::new(),
                    generated: HashSet::new(),
                    live: 0,
                    enqueued: 0,
                    duplicates: 0,
                    consumers: HashSet::new(),
                });
                self.live.insert(name.clone(), self.queues.len() - 1);
                self.queues.len() - 1
            });
            self.handles.push((queue, q));
        }
        self.check_lookup(&call, &name);
    }

    /// `broker.queue(name)` finds exactly the live queues.
    fn check_lookup(&self, call: &str, name: &str) {
        let found = self.broker.queue(name);
        assert_eq!(
            found.is_some(),
            self.live.contains_key(name),
            "after {call}: broker.queue({name:?}) is {}",
            if found.is_some() { "Some" } else { "None" }
        );
        if let Some(q) = found {
            assert_eq!(q.name(), name);
        }
    }

    fn consume(&mut self, handle: usize, name: String, prefetch: u32, priority: i64) {
        let (queue, q) = &self.handles[handle];
        let model = &self.queues[*q];
        let call = format!(
            "{}.consume_with_priority({name:?}, prefetch {prefetch}, {priority})",
            model.name
        );
        let mut allowed = Allowed::default();
        if model.closed {
            allowed.add(Error::QueueClosed);
        }
        if !valid_consumer_name(&name) {
            allowed.add(Error::InvalidName);
        }
        if !(1..=65_535).contains(&prefetch) {
            allowed.add(Error::InvalidConfig(String::new()));
        }
        if model.consumers.contains(&name) {
            allowed.add(Error::DuplicateConsumer);
        }
        let got = queue.consume_with_priority(&name, ConsumerConfig { prefetch }, priority);
        allowed.check(&call, &got);
        if let Ok(consumer) = got {
            self.queues[*q].consumers.insert(name);
            self.consumers.push(consumer);
        }
    }

    /// What `put` of these messages must answer, one by one as `put_batch` checks them, and
    /// the ids and count the queue holds if it is accepted.
    fn expect_puts(&self, q: usize, msgs: &[MsgFacts]) -> Result<Vec<PutOutcome>, Error> {
        let model = &self.queues[q];
        if model.closed {
            return Err(Error::QueueClosed);
        }
        let mut ids = model.ids.clone();
        let mut live = model.live;
        let mut outcomes = Vec::new();
        for m in msgs {
            if let Some(e) = message_error(m, &model.config) {
                return Err(e);
            }
            if let Some(id) = &m.id {
                if model.generated.contains(id) || !ids.insert(id.clone()) {
                    outcomes.push(PutOutcome::Duplicate);
                    continue;
                }
            }
            live += 1;
            if model.config.max_length.is_some_and(|max| live > max) {
                return Err(Error::QueueFull);
            }
            outcomes.push(PutOutcome::Enqueued);
        }
        Ok(outcomes)
    }

    fn record_puts(&mut self, q: usize, msgs: &[MsgFacts], outcomes: &[PutOutcome]) {
        let model = &mut self.queues[q];
        let shard = self.broker.shard_of(&model.name);
        let next = self.next_auto.entry(shard).or_default();
        let given: HashSet<&str> = msgs.iter().filter_map(|m| m.id.as_deref()).collect();
        for (m, outcome) in msgs.iter().zip(outcomes) {
            if *outcome == PutOutcome::Duplicate {
                model.duplicates += 1;
                continue;
            }
            model.live += 1;
            model.enqueued += 1;
            match &m.id {
                Some(id) => {
                    model.ids.insert(id.clone());
                }
                // The shard's next sequence number whose text no given id of this queue (or
                // of this batch) has taken: the broker's numbering, which the contract leaves
                // open, followed here so that a later given id can be judged.
                None => loop {
                    *next += 1;
                    let text = format!("~{shard}-{next}");
                    if !model.ids.contains(&text) && !given.contains(text.as_str()) {
                        model.generated.insert(text);
                        break;
                    }
                },
            }
        }
    }

    fn put(&mut self, handle: usize, message: Message, facts: MsgFacts) {
        let (queue, q) = (&self.handles[handle].0, self.handles[handle].1);
        let call = format!("{}.put({message:?})", self.queues[q].name);
        let want = self
            .expect_puts(q, std::slice::from_ref(&facts))
            .map(|o| o[0]);
        let got = queue.put(message);
        same(&call, &got, &want);
        if let Ok(outcome) = got {
            self.record_puts(q, &[facts], &[outcome]);
        }
    }

    fn put_batch(&mut self, handle: usize, batch: Vec<(Message, MsgFacts)>) {
        let (queue, q) = (&self.handles[handle].0, self.handles[handle].1);
        let (messages, facts): (Vec<Message>, Vec<MsgFacts>) = batch.into_iter().unzip();
        let call = format!("{}.put_batch({messages:?})", self.queues[q].name);
        let want = self.expect_puts(q, &facts);
        let got = queue.put_batch(messages);
        same(&call, &got, &want);
        if let Ok(outcomes) = got {
            self.record_puts(q, &facts, &outcomes);
        }
    }

    /// A queue's stats agree with what it was given; a closed one's gauges are 0.
    fn stats(&self, handle: usize) {
        let (queue, q) = (&self.handles[handle].0, self.handles[handle].1);
        let model = &self.queues[q];
        let s = queue.stats();
        let (live, consumers) = if model.closed {
            (0, 0)
        } else {
            (model.live, model.consumers.len())
        };
        let call = format!("{}.stats() = {s:?}", model.name);
        assert_eq!(
            s.ready + s.delayed + s.leased,
            live,
            "{call}: live messages"
        );
        assert_eq!(s.consumers, consumers, "{call}: consumers");
        assert_eq!(s.enqueued, model.enqueued, "{call}: enqueued");
        assert_eq!(s.duplicates, model.duplicates, "{call}: duplicates");
    }

    fn close(&mut self, handle: usize) {
        let (queue, q) = (&self.handles[handle].0, self.handles[handle].1);
        let model = &mut self.queues[q];
        let call = format!("{}.close()", model.name);
        assert_eq!(
            queue.close(),
            !model.closed,
            "{call}: true the first time only"
        );
        if !model.closed {
            model.closed = true;
            self.live.remove(&model.name);
        }
        let name = model.name.clone();
        self.check_lookup(&call, &name);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(ByteSource::new(data));
    let broker = Broker::builder()
        .manual_clock()
        .shards(2)
        .build()
        .expect("a broker");
    let mut world = World {
        broker,
        queues: Vec::new(),
        handles: Vec::new(),
        live: HashMap::new(),
        next_auto: HashMap::new(),
        consumers: Vec::new(),
    };
    for _ in 0..MAX_CALLS {
        if input.is_empty() {
            break;
        }
        let kind = input.below(7);
        if kind == 0 || world.handles.is_empty() {
            let name = input.queue_name();
            let config = input.config();
            world.declare(name, config);
            continue;
        }
        let handle = input.below(world.handles.len());
        match kind {
            1 => {
                let name = input.consumer_name();
                let prefetch = input.prefetch();
                // Any priority is valid; a few values keep the consumers mixed.
                let priority = input.below(4) as i64 - 1;
                world.consume(handle, name, prefetch, priority);
            }
            2 => {
                let (message, facts) = input.message();
                world.put(handle, message, facts);
            }
            3 => {
                let n = input.below(5);
                let batch = (0..n).map(|_| input.message()).collect();
                world.put_batch(handle, batch);
            }
            4 => world.close(handle),
            5 => world.stats(handle),
            _ => {
                let name = input.queue_name();
                world.check_lookup("a lookup", &name);
            }
        }
    }
    world.broker.shutdown();
});
