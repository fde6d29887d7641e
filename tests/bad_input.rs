//! A catalogue of the ways a caller can misuse the public API, each with the exact answer it
//! gets (contract §3 Limits, §3 `declare_queue`, §3 `close`, §3 `shutdown`, §4 `advance`).
//!
//! Every row runs on a fresh manual-clock fixture, put first into the state the row needs
//! (a live lease, an expired one, a closed queue, a shut-down broker, …). After the call the
//! row checks that nothing changed but what the contract allows (a stale settle counts in
//! `stale`, a duplicate put in `duplicates`): every queue's stats are as they were, no queue
//! was created, and the queues and consumers that should still work do.

use std::time::Duration;

use leasemq::{
    Broker, Consumer, DeliveryTag, Error, Message, PutOutcome, Queue, QueueConfig, QueueStats,
    RetryPolicy, Settle,
};

mod common;
use common::*;

const MIB: usize = 1024 * 1024;
/// `max_body_bytes` of the fixture's main queue.
const BODY_LIMIT: usize = 16;
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
const OVER_SEVEN_DAYS: Duration = SEVEN_DAYS.saturating_add(Duration::from_millis(1));
/// A tag no queue of the fixture has issued.
const NEVER: DeliveryTag = DeliveryTag(99);
/// Tags of the main queue's two leases: `peer` holds 1, `worker` holds 2.
const PEER_TAG: DeliveryTag = DeliveryTag(1);
const WORKER_TAG: DeliveryTag = DeliveryTag(2);
/// A tag issued by `bad.other` but never by `bad.q`.
const OTHER_QUEUES_TAG: DeliveryTag = DeliveryTag(3);
/// A queue on the other shard than `bad.q`.
const OTHER: &str = "bad.other";
/// The name every config row tries to declare.
const NEW: &str = "bad.new";

// --- the fixture ---------------------------------------------------------------------------

/// A manual-clock broker with some state to disturb:
/// - `bad.q` (ack_timeout 10 s, `max_body_bytes` 16, dead letters to `bad.dlq`): `m1`
///   leased to `peer` (tag 1), `m2` leased to `worker` (tag 2), `m3` ready;
/// - `bad.other`, on the other shard: three leases of its own (tags 1 to 3);
/// - `bad.full` (`max_length` 2): one message, room for one more.
struct Fixture {
    broker: Broker,
    q: Queue,
    dlq: Queue,
    other: Queue,
    full: Queue,
    peer: Consumer,
    worker: Option<Consumer>,
    peer_d: leasemq::Delivery,
    worker_d: leasemq::Delivery,
    _other_consumer: Consumer,
    /// After a close and a re-declare of `bad.q`: the new queue, its consumer, its lease.
    renewed: Option<(Queue, Consumer, leasemq::Delivery)>,
}

fn main_config() -> QueueConfig {
    QueueConfig {
        ack_timeout: ACK_TIMEOUT,
        max_body_bytes: BODY_LIMIT,
        dead_letter: Some("bad.dlq".to_string()),
        ..QueueConfig::default()
    }
}

impl Fixture {
    fn new() -> Fixture {
        let broker = broker();
        let dlq = plain(&broker, "bad.dlq");
        let q = queue_with(&broker, "bad.q", main_config());
        let peer = q.consume("peer", prefetch(1)).unwrap();
        let worker = q.consume("worker", prefetch(1)).unwrap();
        for id in ["m1", "m2", "m3"] {
            put(&q, id);
        }
        let peer_d = next(&peer);
        let worker_d = next(&worker);
        assert_eq!((peer_d.tag(), worker_d.tag()), (PEER_TAG, WORKER_TAG));
        let other = plain(&broker, OTHER);
        assert_ne!(
            broker.shard_of(OTHER),
            q.shard(),
            "{OTHER} lives on the other shard"
        );
        let other_consumer = other.consume("o", prefetch(10)).unwrap();
        for id in ["o1", "o2", "o3"] {
            put(&other, id);
        }
        let full = queue_with(
            &broker,
            "bad.full",
            QueueConfig {
                max_length: Some(2),
                ..QueueConfig::default()
            },
        );
        put(&full, "f1");
        Fixture {
            broker,
            q,
            dlq,
            other,
            full,
            peer,
            worker: Some(worker),
            peer_d,
            worker_d,
            _other_consumer: other_consumer,
            renewed: None,
        }
    }

    fn worker(&self) -> &Consumer {
        self.worker.as_ref().expect("the worker was not cancelled")
    }

    fn renewed(&self) -> &Queue {
        &self.renewed.as_ref().expect("set up by Redeclared").0
    }
}

/// The state a row's call finds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Setup {
    Live,
    /// Both leases of `bad.q` ran out (advance past `ack_timeout`); their messages were
    /// delivered again under new tags.
    LeaseExpired,
    /// `worker` acked its delivery once already.
    AckedOnce,
    /// `worker` was cancelled; its lease came back to the queue.
    WorkerCancelled,
    /// `bad.q` was closed.
    QueueClosed,
    /// `bad.q` was closed and declared again; the new one has a lease of tag 1 and a
    /// ready message.
    Redeclared,
    /// `bad.other` was closed.
    OtherClosed,
    /// `bad.full` holds `max_length` messages.
    FullQueueAtLimit,
    /// `broker.shutdown()` returned.
    ShutDown,
}

impl Setup {
    fn apply(self, f: &mut Fixture) {
        match self {
            Setup::Live => {}
            Setup::LeaseExpired => {
                f.broker.advance(ACK_TIMEOUT).unwrap();
                assert_stats!(f.q, { expired: 2, leased: 2 });
            }
            Setup::AckedOnce => assert!(f.worker_d.ack()),
            Setup::WorkerCancelled => f.worker.take().unwrap().cancel(),
            Setup::QueueClosed => assert!(f.q.close()),
            Setup::Redeclared => {
                assert!(f.q.close());
                let q = queue_with(&f.broker, "bad.q", main_config());
                let c = q.consume("fresh", prefetch(1)).unwrap();
                put(&q, "n1");
                put(&q, "n2");
                let d = next(&c);
                assert_eq!(d.tag(), PEER_TAG, "a new queue's tags start again at 1");
                f.renewed = Some((q, c, d));
            }
            Setup::OtherClosed => assert!(f.other.close()),
            Setup::FullQueueAtLimit => put(&f.full, "f2"),
            Setup::ShutDown => f.broker.shutdown(),
        }
    }
}

/// Everything a misuse must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: Vec<(&'static str, QueueStats)>,
    /// Whether each of these names is a live queue.
    names: Vec<(String, bool)>,
}

fn snapshot(f: &Fixture) -> Snapshot {
    let mut stats = vec![
        ("bad.q", f.q.stats()),
        ("bad.dlq", f.dlq.stats()),
        ("bad.other", f.other.stats()),
        ("bad.full", f.full.stats()),
    ];
    if let Some((q, _, _)) = &f.renewed {
        stats.push(("bad.q (declared again)", q.stats()));
    }
    let probed = [NEW, "bad.q", "bad.nowhere", "q", &"q".repeat(255)];
    let names = probed
        .iter()
        .map(|name| (name.to_string(), f.broker.queue(name).is_some()))
        .collect();
    Snapshot { stats, names }
}

// --- rows ----------------------------------------------------------------------------------

/// What a call gave, reduced to something a row can state.
#[derive(Debug)]
enum Got {
    Err(Error),
    /// `Ok` of a call whose value does not matter here (a declared queue, a consumer).
    Ok,
    Bool(bool),
    Bools(Vec<bool>),
    Count(usize),
    Outcome(PutOutcome),
    Outcomes(Vec<PutOutcome>),
    Found(bool),
}

impl Got {
    /// Errors carrying a reason match on the variant, and the reason must not be empty;
    /// `UnknownQueue` must name the missing queue.
    fn matches(&self, expected: &Got) -> bool {
        match (self, expected) {
            (Got::Err(Error::InvalidConfig(why)), Got::Err(Error::InvalidConfig(_)))
            | (Got::Err(Error::InvalidMessage(why)), Got::Err(Error::InvalidMessage(_))) => {
                !why.is_empty()
            }
            (Got::Err(got), Got::Err(want)) => got == want,
            (Got::Ok, Got::Ok) => true,
            (Got::Bool(a), Got::Bool(b)) | (Got::Found(a), Got::Found(b)) => a == b,
            (Got::Bools(a), Got::Bools(b)) => a == b,
            (Got::Count(a), Got::Count(b)) => a == b,
            (Got::Outcome(a), Got::Outcome(b)) => a == b,
            (Got::Outcomes(a), Got::Outcomes(b)) => a == b,
            _ => false,
        }
    }
}

fn res<T>(result: Result<T, Error>) -> Got {
    result.map_or_else(Got::Err, |_| Got::Ok)
}

fn put_res(result: Result<PutOutcome, Error>) -> Got {
    result.map_or_else(Got::Err, Got::Outcome)
}

fn batch_res(result: Result<Vec<PutOutcome>, Error>) -> Got {
    result.map_or_else(Got::Err, Got::Outcomes)
}

fn invalid_name() -> Got {
    Got::Err(Error::InvalidName)
}

fn invalid_config() -> Got {
    Got::Err(Error::InvalidConfig(String::new()))
}

fn invalid_message() -> Got {
    Got::Err(Error::InvalidMessage(String::new()))
}

fn err(e: Error) -> Got {
    Got::Err(e)
}

/// What a row may change: nothing, or one counter of `bad.q`.
#[derive(Clone, Copy, Debug)]
enum Effect {
    Same,
    Stale(u64),
    Duplicates(u64),
}
use Effect::{Duplicates, Same, Stale};

/// `rows![Setup, Effect, "what" => expected, |f| call; …]`, one row a line: on a fixture in
/// `Setup`, `call` must give `expected` and change nothing but `Effect`.
macro_rules! rows {
    ($($setup:ident, $effect:expr, $what:expr => $expect:expr, |$f:ident| $call:expr;)*) => {
        vec![$(row($what, Setup::$setup, $expect, $effect, move |$f: &Fixture| $call)),*]
    };
}

struct Row {
    what: String,
    setup: Setup,
    call: Box<dyn Fn(&Fixture) -> Got>,
    expect: Got,
    effect: Effect,
}

fn row(
    what: impl Into<String>,
    setup: Setup,
    expect: Got,
    effect: Effect,
    call: impl Fn(&Fixture) -> Got + 'static,
) -> Row {
    Row {
        what: what.into(),
        setup,
        call: Box::new(call),
        expect,
        effect,
    }
}

/// Runs every row on its own fixture; collects every failure before failing, so one run
/// shows the whole table's state.
fn run(rows: Vec<Row>) {
    let mut failures = Vec::new();
    for r in &rows {
        if let Err(why) = run_row(r) {
            failures.push(format!("[{:?}] {}: {why}", r.setup, r.what));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

fn run_row(r: &Row) -> Result<(), String> {
    let mut f = Fixture::new();
    r.setup.apply(&mut f);
    let mut expected = snapshot(&f);
    let got = (r.call)(&f);
    if !got.matches(&r.expect) {
        return Err(format!("expected {:?}, got {got:?}", r.expect));
    }
    let q = &mut expected.stats[0].1;
    match r.effect {
        Same => {}
        Stale(n) => q.stale += n,
        Duplicates(n) => q.duplicates += n,
    }
    let after = snapshot(&f);
    if after != expected {
        return Err(format!(
            "state changed:\n  expected {expected:?}\n  got      {after:?}"
        ));
    }
    still_works(&f, r.setup)
}

/// The queues and consumers that should still work after the row's call do.
fn still_works(f: &Fixture, setup: Setup) -> Result<(), String> {
    match setup {
        Setup::ShutDown => {
            f.broker.shutdown(); // idempotent: returns again
            Ok(())
        }
        Setup::QueueClosed => fresh_queue_works(&f.broker, "bad.q"),
        Setup::Redeclared => {
            let (q, c, d) = f.renewed.as_ref().unwrap();
            check(d.ack(), "the new queue's lease acks")?;
            let n2 = next(c);
            check(n2.envelope().id == "n2", "the new queue delivers n2")?;
            check(n2.ack(), "n2 acks")?;
            check(q.stats().ready == 0, "the new queue is empty")
        }
        _ => drain_main_queue(f),
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    ok.then_some(())
        .ok_or_else(|| format!("afterwards: {what} failed"))
}

fn fresh_queue_works(broker: &Broker, name: &str) -> Result<(), String> {
    let q = broker
        .declare_queue(name, main_config())
        .map_err(|e| format!("afterwards: declare {name}: {e}"))?;
    let c = q.consume("after", prefetch(1)).map_err(|e| e.to_string())?;
    put(&q, "after");
    check(next(&c).ack(), "a fresh queue acks")
}

/// Puts a probe on `bad.q`, then acks everything its consumers get until it is empty: every
/// ack of a live delivery must succeed, and the probe must come through.
fn drain_main_queue(f: &Fixture) -> Result<(), String> {
    let q = &f.q;
    check(
        q.put(msg("probe")) == Ok(PutOutcome::Enqueued),
        "put of a probe",
    )?;
    // The row may have left these stale; whatever they give, the rest must drain.
    f.peer_d.ack();
    f.worker_d.ack();
    let consumers: Vec<&Consumer> = [Some(&f.peer), f.worker.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let mut probe_seen = false;
    for _ in 0..20 {
        for c in &consumers {
            while let Some(d) = c.try_recv().map_err(|e| e.to_string())? {
                probe_seen |= d.envelope().id == "probe";
                check(
                    d.ack(),
                    &format!("ack of {} by {}", d.envelope().id, c.name()),
                )?;
            }
        }
        let s = q.stats();
        if s.ready + s.delayed + s.leased == 0 {
            return check(probe_seen, "the probe was delivered");
        }
    }
    Err(format!("afterwards: bad.q does not drain: {:?}", q.stats()))
}

// --- helpers for the tables ----------------------------------------------------------------

fn with_config(f: &Fixture, config: QueueConfig) -> Got {
    res(f.broker.declare_queue(NEW, config))
}

fn retry(multiplier: f64, jitter: f64) -> QueueConfig {
    QueueConfig {
        retry: RetryPolicy {
            multiplier,
            jitter,
            ..RetryPolicy::default()
        },
        ..QueueConfig::default()
    }
}

fn body(bytes: usize) -> Message {
    Message::new(vec![b'x'; bytes])
}

fn no(got: bool) -> Got {
    Got::Bool(got)
}

/// The six single settles, each as `(name, call)` on a tag.
type SettleCall = fn(&Queue, DeliveryTag) -> bool;

fn every_settle() -> [(&'static str, SettleCall); 6] {
    [
        ("ack", |q, t| q.ack(t)),
        ("nack", |q, t| q.nack(t)),
        ("nack_with_delay(0)", |q, t| {
            q.nack_with_delay(t, Duration::ZERO)
        }),
        ("reject", |q, t| q.reject(t)),
        ("release", |q, t| q.release(t)),
        ("touch", |q, t| q.touch(t)),
    ]
}

// --- the catalogue -------------------------------------------------------------------------

#[test]
fn bad_queue_names_are_invalid_name_and_create_nothing() {
    let bad = [
        "",
        " ",
        "with space",
        " lead",
        "trail ",
        "tab\tname",
        "line\nbreak",
        "slash/name",
        "back\\slash",
        "star*",
        "ask?",
        "hash#",
        "at@home",
        "comma,",
        "nul\0",
        "é",
        "日本",
        "emoji😀",
        "zero\u{200b}width",
        "ｆｕｌｌ",
    ];
    let mut rows = Vec::new();
    for name in bad.iter().map(|s| s.to_string()).chain(["q".repeat(256)]) {
        let (shown, n) = (format!("{name:?}"), name.clone());
        rows.extend(rows![
            Live, Same, format!("declare_queue({shown})") => invalid_name(), |f| res(f.broker.declare_queue(&n, QueueConfig::default()));
            Live, Same, format!("queue({shown})") => Got::Found(false), |f| Got::Found(f.broker.queue(&name).is_some());
        ]);
    }
    rows.extend(rows![
        Live, Same, "a bad name and a bad config: the name is checked first" => invalid_name(), |f| res(f.broker.declare_queue("bad name", retry(0.0, 2.0)));
        Live, Same, "queue() of a name never declared" => Got::Found(false), |f| Got::Found(f.broker.queue("bad.nowhere").is_some());
    ]);
    run(rows);
}

#[test]
fn bad_consumer_names_and_prefetch_are_refused_and_register_nothing() {
    let mut rows = Vec::new();
    for (name, why) in [
        (String::new(), "empty"),
        ("n".repeat(256), "256 bytes"),
        ("é".repeat(128), "128 two-byte characters (256 bytes)"),
        ("日".repeat(86), "86 three-byte characters (258 bytes)"),
    ] {
        rows.extend(rows![
            Live, Same, format!("consume with a name of {why}") => invalid_name(), |f| res(f.q.consume(&name, prefetch(1)));
        ]);
    }
    for n in [0, 65_536, u32::MAX] {
        rows.extend(rows![
            Live, Same, format!("consume with prefetch {n}") => invalid_config(), |f| res(f.q.consume("new", prefetch(n)));
        ]);
    }
    rows.extend(rows![
        Live, Same, "consume with a live consumer's name" => err(Error::DuplicateConsumer), |f| res(f.q.consume("worker", prefetch(1)));
        Live, Same, "consume with a live consumer's name, another handle" => err(Error::DuplicateConsumer), |f| res(f.broker.queue("bad.q").unwrap().consume("peer", prefetch(5)));
        Live, Same, "an empty name and prefetch 0: the name is checked first" => invalid_name(), |f| res(f.q.consume("", prefetch(0)));
        Live, Same, "a live consumer's name and prefetch 0: the config is checked first" => invalid_config(), |f| res(f.q.consume("worker", prefetch(0)));
    ]);
    run(rows);
}

#[test]
fn bad_queue_configs_are_invalid_config_and_create_nothing() {
    let d = QueueConfig::default;
    let r = RetryPolicy::default;
    let (ten, ns) = (secs(10), Duration::from_nanos(1));
    let lease = |ack_timeout, max_lease| QueueConfig {
        ack_timeout,
        max_lease: Some(max_lease),
        ..d()
    };
    let initial = |initial| QueueConfig {
        retry: RetryPolicy { initial, ..r() },
        ..d()
    };
    let max = |max| QueueConfig {
        retry: RetryPolicy { max, ..r() },
        ..d()
    };
    let window = |dedup_window| QueueConfig {
        dedup_window,
        ..d()
    };
    let body_bytes = |max_body_bytes| QueueConfig {
        max_body_bytes,
        ..d()
    };
    let dead = |name: &str| QueueConfig {
        dead_letter: Some(name.to_string()),
        ..d()
    };
    let invalid: Vec<(&str, QueueConfig)> = vec![
        ("ack_timeout zero", with_ack_timeout(Duration::ZERO)),
        (
            "ack_timeout 1 µs",
            with_ack_timeout(Duration::from_micros(1)),
        ),
        (
            "ack_timeout 999 µs",
            with_ack_timeout(Duration::from_micros(999)),
        ),
        (
            "ack_timeout 7 days + 1 ns",
            with_ack_timeout(SEVEN_DAYS + ns),
        ),
        (
            "ack_timeout 7 days + 1 ms",
            with_ack_timeout(OVER_SEVEN_DAYS),
        ),
        ("ack_timeout Duration::MAX", with_ack_timeout(Duration::MAX)),
        ("max_lease zero", lease(ten, Duration::ZERO)),
        ("max_lease 1 ns under ack_timeout", lease(ten, ten - ns)),
        ("retry.multiplier 0", retry(0.0, 0.0)),
        ("retry.multiplier 0.999", retry(0.999, 0.0)),
        ("retry.multiplier -1", retry(-1.0, 0.0)),
        ("retry.multiplier NaN", retry(f64::NAN, 0.0)),
        ("retry.multiplier +inf", retry(f64::INFINITY, 0.0)),
        ("retry.multiplier -inf", retry(f64::NEG_INFINITY, 0.0)),
        ("retry.jitter -0.01", retry(2.0, -0.01)),
        ("retry.jitter 1.0001", retry(2.0, 1.0001)),
        ("retry.jitter NaN", retry(2.0, f64::NAN)),
        ("retry.jitter +inf", retry(2.0, f64::INFINITY)),
        ("retry.jitter -inf", retry(2.0, f64::NEG_INFINITY)),
        ("retry.initial 7 days + 1 ms", initial(OVER_SEVEN_DAYS)),
        ("retry.initial Duration::MAX", initial(Duration::MAX)),
        ("retry.max 7 days + 1 ms", max(OVER_SEVEN_DAYS)),
        ("retry.max Duration::MAX", max(Duration::MAX)),
        (
            "max_deliveries 0",
            QueueConfig {
                max_deliveries: Some(0),
                ..d()
            },
        ),
        (
            "max_length 0",
            QueueConfig {
                max_length: Some(0),
                ..d()
            },
        ),
        ("max_body_bytes 0", body_bytes(0)),
        ("max_body_bytes 64 MiB + 1", body_bytes(64 * MIB + 1)),
        ("max_body_bytes usize::MAX", body_bytes(usize::MAX)),
        ("dedup_window 7 days + 1 ms", window(OVER_SEVEN_DAYS)),
        ("dedup_window Duration::MAX", window(Duration::MAX)),
        ("dead_letter naming the queue itself", dead(NEW)),
        ("dead_letter empty", dead("")),
        ("dead_letter not a queue name", dead("no such")),
    ];
    let mut rows = Vec::new();
    for (what, config) in invalid {
        rows.extend(
            rows![Live, Same, what => invalid_config(), |f| with_config(f, config.clone());],
        );
    }
    let (unknown, closed, mismatch) =
        (dead("bad.nowhere"), dead(OTHER), err(Error::ConfigMismatch));
    let main = main_config;
    rows.extend(rows![
        Live, Same, "dead_letter naming a queue never declared" => err(Error::UnknownQueue("bad.nowhere".into())), |f| with_config(f, unknown.clone());
        OtherClosed, Same, "dead_letter naming a closed queue" => err(Error::UnknownQueue(OTHER.into())), |f| with_config(f, closed.clone());
        Live, Same, "declare again with another ack_timeout" => mismatch, |f| res(f.broker.declare_queue("bad.q", QueueConfig { ack_timeout: secs(11), ..main() }));
        Live, Same, "declare again without the dead-letter queue" => err(Error::ConfigMismatch), |f| res(f.broker.declare_queue("bad.q", QueueConfig { dead_letter: None, ..main() }));
        Live, Same, "declare again with an invalid config: it is checked first" => invalid_config(), |f| res(f.broker.declare_queue("bad.q", QueueConfig { max_length: Some(0), ..main() }));
    ]);
    run(rows);
}

#[test]
fn bad_messages_are_refused_and_put_batch_enqueues_none_of_them() {
    let id = |id: &str| Message::new("x").with_id(id);
    let (long_id, wide_id) = (|| "i".repeat(1025), || "é".repeat(513));
    let good = || body(BODY_LIMIT).with_id("good");
    let late = |delay| Message::new("x").with_delay(delay);
    let rows = rows![
        Live, Same, "put with an empty id" => invalid_message(), |f| put_res(f.q.put(id("")));
        Live, Same, "put with a 1 025-byte id" => invalid_message(), |f| put_res(f.q.put(id(&long_id())));
        Live, Same, "put with an id of 513 two-byte characters" => invalid_message(), |f| put_res(f.q.put(id(&wide_id())));
        Live, Same, "put with a delay of 7 days + 1 ms" => invalid_message(), |f| put_res(f.q.put(late(OVER_SEVEN_DAYS)));
        Live, Same, "put with a delay of Duration::MAX" => invalid_message(), |f| put_res(f.q.put(late(Duration::MAX)));
        Live, Same, "put of a body one byte over max_body_bytes" => err(Error::MessageTooLarge), |f| put_res(f.q.put(body(BODY_LIMIT + 1)));
        Live, Same, "put of a 1 MiB body" => err(Error::MessageTooLarge), |f| put_res(f.q.put(body(MIB)));
        Live, Same, "put with a bad id and a body too large: the id first" => invalid_message(), |f| put_res(f.q.put(body(BODY_LIMIT + 1).with_id("")));
        Live, Duplicates(1), "put of an id live in the queue" => Got::Outcome(PutOutcome::Duplicate), |f| put_res(f.q.put(msg("m3")));
        FullQueueAtLimit, Same, "put on a queue at max_length" => err(Error::QueueFull), |f| put_res(f.full.put(msg("f3")));
        Live, Same, "put_batch: a good message, then a body too large" => err(Error::MessageTooLarge), |f| batch_res(f.q.put_batch(vec![good(), body(BODY_LIMIT + 1)]));
        Live, Same, "put_batch: a good message, then an empty id" => invalid_message(), |f| batch_res(f.q.put_batch(vec![good(), id("")]));
        Live, Same, "put_batch: a good message, then a delay over 7 days" => invalid_message(), |f| batch_res(f.q.put_batch(vec![good(), late(OVER_SEVEN_DAYS)]));
        Live, Same, "put_batch: a body too large, then a bad id: the first failure" => err(Error::MessageTooLarge), |f| batch_res(f.q.put_batch(vec![body(BODY_LIMIT + 1), id(&long_id())]));
        Live, Same, "put_batch of two with room for one" => err(Error::QueueFull), |f| batch_res(f.full.put_batch(vec![msg("f2"), msg("f3")]));
        Live, Same, "an empty put_batch" => Got::Outcomes(vec![]), |f| batch_res(f.q.put_batch(Vec::new()));
    ];
    run(rows);
}

#[test]
fn settles_of_tags_never_issued_are_stale_and_change_nothing_else() {
    let mut rows = Vec::new();
    for (name, settle) in every_settle() {
        for (tag, which) in [
            (DeliveryTag(0), "tag 0"),
            (NEVER, "a tag never issued"),
            (DeliveryTag(u64::MAX), "tag u64::MAX"),
            (OTHER_QUEUES_TAG, "a tag only another queue issued"),
        ] {
            rows.extend(rows![Live, Stale(1), format!("{name} of {which}") => no(false), |f| no(settle(&f.q, tag));]);
        }
    }
    let never = [
        (DeliveryTag(0), Settle::Ack),
        (NEVER, Settle::Touch),
        (DeliveryTag(u64::MAX), Settle::Release),
    ];
    rows.extend(rows![
        Live, Stale(3), "settle_batch of three tags never issued" => Got::Bools(vec![false; 3]), |f| Got::Bools(f.q.settle_batch(&never));
        Live, Same, "an empty settle_batch" => Got::Bools(vec![]), |f| Got::Bools(f.q.settle_batch(&[]));
        Live, Same, "ack_up_to of another consumer's lower tag: none, nothing stale" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(PEER_TAG));
        Live, Same, "ack_up_to of tag 0" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(DeliveryTag(0)));
    ]);
    run(rows);
}

#[test]
fn nack_delays_over_seven_days_are_refused_without_counting_stale() {
    let mut rows = Vec::new();
    for (delay, which) in [
        (OVER_SEVEN_DAYS, "7 days + 1 ms"),
        (Duration::MAX, "Duration::MAX"),
    ] {
        let batch = [(WORKER_TAG, Settle::NackWithDelay(delay))];
        rows.extend(rows![
            Live, Same, format!("nack_with_delay({which}) of a live lease") => no(false), |f| no(f.worker_d.nack_with_delay(delay));
            Live, Same, format!("nack_with_delay({which}) of a tag never issued") => no(false), |f| no(f.q.nack_with_delay(NEVER, delay));
            Live, Same, format!("settle_batch NackWithDelay({which}) of a live lease") => Got::Bools(vec![false]), |f| Got::Bools(f.q.settle_batch(&batch));
        ]);
    }
    run(rows);
}

#[test]
fn settles_after_the_lease_ended_are_stale() {
    let mut rows = Vec::new();
    for (setup, when) in [
        (Setup::LeaseExpired, "after the lease expired"),
        (Setup::AckedOnce, "after an ack"),
        (Setup::WorkerCancelled, "after its consumer was cancelled"),
    ] {
        for (name, settle) in every_settle() {
            let what = format!("{name} {when}");
            rows.push(row(what, setup, no(false), Stale(1), move |f| {
                no(settle(&f.q, f.worker_d.tag()))
            }));
        }
        let touch_ack = [(WORKER_TAG, Settle::Touch), (WORKER_TAG, Settle::Ack)];
        rows.push(row(
            format!("settle_batch {when}"),
            setup,
            Got::Bools(vec![false; 2]),
            Stale(2),
            move |f| Got::Bools(f.q.settle_batch(&touch_ack)),
        ));
    }
    rows.extend(rows![
        LeaseExpired, Stale(1), "Delivery::ack after the lease expired" => no(false), |f| no(f.peer_d.ack());
        LeaseExpired, Same, "ack_up_to after the leases up to it expired" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(WORKER_TAG));
        AckedOnce, Same, "ack_up_to after that tag was acked" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(WORKER_TAG));
    ]);
    run(rows);
}

#[test]
fn calls_on_a_closed_queue_fail_or_return_false() {
    let both = [(PEER_TAG, Settle::Ack), (WORKER_TAG, Settle::Ack)];
    let mut rows = rows![
        QueueClosed, Same, "put" => err(Error::QueueClosed), |f| put_res(f.q.put(msg("x")));
        QueueClosed, Same, "put with a bad id: QueueClosed first" => err(Error::QueueClosed), |f| put_res(f.q.put(Message::new("x").with_id("")));
        QueueClosed, Same, "put_batch" => err(Error::QueueClosed), |f| batch_res(f.q.put_batch(vec![msg("x"), msg("y")]));
        QueueClosed, Same, "consume" => err(Error::QueueClosed), |f| res(f.q.consume("new", prefetch(1)));
        QueueClosed, Same, "consume with a bad name and prefetch: QueueClosed first" => err(Error::QueueClosed), |f| res(f.q.consume("", prefetch(0)));
        QueueClosed, Same, "settle_batch" => Got::Bools(vec![false; 2]), |f| Got::Bools(f.q.settle_batch(&both));
        QueueClosed, Same, "ack_up_to" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(WORKER_TAG));
        QueueClosed, Same, "close again" => no(false), |f| no(f.q.close());
        QueueClosed, Same, "try_recv" => err(Error::Closed), |f| res(f.worker().try_recv());
        QueueClosed, Same, "recv_timeout" => err(Error::Closed), |f| res(f.worker().recv_timeout(ms(1)));
        QueueClosed, Same, "recv" => err(Error::Closed), |f| res(f.worker().recv());
        QueueClosed, Same, "queue() of its name" => Got::Found(false), |f| Got::Found(f.broker.queue("bad.q").is_some());
    ];
    for (name, settle) in every_settle() {
        rows.extend(rows![QueueClosed, Same, name => no(false), |f| no(settle(&f.q, WORKER_TAG));]);
    }
    run(rows);
}

#[test]
fn an_old_handle_never_reaches_the_queue_declared_again() {
    let first = [(PEER_TAG, Settle::Ack)];
    let mut rows = rows![
        Redeclared, Same, "put on the old handle" => err(Error::QueueClosed), |f| put_res(f.q.put(msg("x")));
        Redeclared, Same, "put_batch on the old handle" => err(Error::QueueClosed), |f| batch_res(f.q.put_batch(vec![msg("x")]));
        Redeclared, Same, "consume on the old handle" => err(Error::QueueClosed), |f| res(f.q.consume("fresh2", prefetch(1)));
        Redeclared, Same, "close of the old handle" => no(false), |f| no(f.q.close());
        Redeclared, Same, "settle_batch of the new queue's tag on the old handle" => Got::Bools(vec![false]), |f| Got::Bools(f.q.settle_batch(&first));
        Redeclared, Same, "the old consumer's try_recv" => err(Error::Closed), |f| res(f.worker().try_recv());
        Redeclared, Same, "the old consumer's ack_up_to" => Got::Count(0), |f| Got::Count(f.peer.ack_up_to(DeliveryTag(u64::MAX)));
        Redeclared, Same, "the old delivery's ack" => no(false), |f| no(f.peer_d.ack());
        Redeclared, Same, "queue() of the name finds the new queue" => Got::Found(true), |f| Got::Found(f.broker.queue("bad.q").is_some_and(|q| q.stats() == f.renewed().stats()));
    ];
    // The new queue has a live lease of tag 1, which the old handle must not reach.
    for (name, settle) in every_settle() {
        let what = format!("{name} of the new queue's tag on the old handle");
        rows.extend(rows![Redeclared, Same, what => no(false), |f| no(settle(&f.q, PEER_TAG));]);
    }
    run(rows);
}

#[test]
fn calls_after_shutdown_give_shut_down_or_false() {
    let both = [(PEER_TAG, Settle::Ack), (WORKER_TAG, Settle::Ack)];
    let mut rows = rows![
        ShutDown, Same, "put" => err(Error::ShutDown), |f| put_res(f.q.put(msg("x")));
        ShutDown, Same, "put with a bad id: ShutDown first" => err(Error::ShutDown), |f| put_res(f.q.put(Message::new("x").with_id("")));
        ShutDown, Same, "put_batch" => err(Error::ShutDown), |f| batch_res(f.q.put_batch(vec![msg("x")]));
        ShutDown, Same, "consume" => err(Error::ShutDown), |f| res(f.q.consume("new", prefetch(1)));
        ShutDown, Same, "declare_queue" => err(Error::ShutDown), |f| res(f.broker.declare_queue(NEW, QueueConfig::default()));
        ShutDown, Same, "declare_queue with a bad name: ShutDown first" => err(Error::ShutDown), |f| res(f.broker.declare_queue("", QueueConfig::default()));
        ShutDown, Same, "advance" => err(Error::ShutDown), |f| res(f.broker.advance(secs(1)));
        ShutDown, Same, "recv" => err(Error::ShutDown), |f| res(f.worker().recv());
        ShutDown, Same, "try_recv" => err(Error::ShutDown), |f| res(f.worker().try_recv());
        ShutDown, Same, "recv_timeout" => err(Error::ShutDown), |f| res(f.worker().recv_timeout(ms(1)));
        ShutDown, Same, "settle_batch" => Got::Bools(vec![false; 2]), |f| Got::Bools(f.q.settle_batch(&both));
        ShutDown, Same, "ack_up_to" => Got::Count(0), |f| Got::Count(f.worker().ack_up_to(WORKER_TAG));
        ShutDown, Same, "close" => no(false), |f| no(f.q.close());
        ShutDown, Same, "queue()" => Got::Found(false), |f| Got::Found(f.broker.queue("bad.q").is_some());
    ];
    for (name, settle) in every_settle() {
        rows.extend(rows![ShutDown, Same, name => no(false), |f| no(settle(&f.q, WORKER_TAG));]);
    }
    run(rows);
}

#[test]
fn advance_needs_a_manual_clock_and_builders_refuse_bad_settings() {
    let system_advance = |_: &Fixture| {
        let system = Broker::builder().shards(1).build().unwrap();
        let got = res(system.advance(secs(1)));
        system.shutdown();
        got
    };
    let build = |b: leasemq::BrokerBuilder| res(b.build());
    let rows = rows![
        Live, Same, "advance on a system-clock broker" => err(Error::NotManualClock), |f| system_advance(f);
        Live, Same, "shards(0)" => invalid_config(), |_f| build(Broker::builder().shards(0));
        Live, Same, "shards(1 025)" => invalid_config(), |_f| build(Broker::builder().shards(1025));
        Live, Same, "tick(0)" => invalid_config(), |_f| build(Broker::builder().tick(Duration::ZERO));
        Live, Same, "tick(999 ns)" => invalid_config(), |_f| build(Broker::builder().tick(Duration::from_nanos(999)));
        Live, Same, "tick(1 s + 1 ns)" => invalid_config(), |_f| build(Broker::builder().tick(secs(1) + Duration::from_nanos(1)));
    ];
    run(rows);
}

/// The other side of each bound: just inside it is accepted, so the rows above fail for
/// the bound and not for something else.
#[test]
fn values_just_inside_each_bound_are_accepted() {
    let f = Fixture::new();
    let d = QueueConfig::default;
    let week = RetryPolicy {
        initial: SEVEN_DAYS,
        max: SEVEN_DAYS,
        ..RetryPolicy::default()
    };
    let configs = [
        with_ack_timeout(ms(1)),
        with_ack_timeout(SEVEN_DAYS),
        QueueConfig {
            ack_timeout: secs(10),
            max_lease: Some(secs(10)),
            ..d()
        },
        QueueConfig {
            max_lease: Some(Duration::MAX),
            ..d()
        },
        retry(1.0, 0.0),
        retry(2.0, 1.0),
        retry(2.0, -0.0),
        QueueConfig { retry: week, ..d() },
        QueueConfig {
            max_deliveries: Some(1),
            ..d()
        },
        QueueConfig {
            max_length: Some(1),
            ..d()
        },
        QueueConfig {
            max_body_bytes: 1,
            ..d()
        },
        QueueConfig {
            max_body_bytes: 64 * MIB,
            ..d()
        },
        QueueConfig {
            dedup_window: SEVEN_DAYS,
            ..d()
        },
        QueueConfig {
            dead_letter: Some("bad.dlq".into()),
            ..d()
        },
    ];
    for (i, config) in configs.into_iter().enumerate() {
        if let Err(e) = f.broker.declare_queue(&format!("ok.{i}"), config.clone()) {
            panic!("{config:?} should be accepted: {e}");
        }
    }
    for name in ["q".repeat(255), "AZaz09._:-".into()] {
        f.broker
            .declare_queue(&name, QueueConfig::default())
            .unwrap();
    }
    let names = [
        "n".repeat(255),
        "é".repeat(127),
        " ".into(),
        "日本 ✓".into(),
    ];
    for (i, name) in names.iter().enumerate() {
        f.q.consume(name, prefetch(1 + i as u32)).unwrap();
    }
    f.q.consume("widest", prefetch(65_535)).unwrap();
    let at_limit = |id: String| body(BODY_LIMIT).with_id(id);
    assert_eq!(
        f.q.put(at_limit("i".repeat(1024))),
        Ok(PutOutcome::Enqueued)
    );
    let batch = vec![at_limit("é".repeat(512)), Message::new("x").with_id("1")];
    assert_eq!(f.q.put_batch(batch), Ok(vec![PutOutcome::Enqueued; 2]));
    let week_late = Message::new("x").with_delay(SEVEN_DAYS);
    assert_eq!(f.q.put(week_late), Ok(PutOutcome::Enqueued));
    assert_eq!(
        f.full.put(msg("f2")),
        Ok(PutOutcome::Enqueued),
        "room for one"
    );
    assert!(
        f.worker_d.nack_with_delay(SEVEN_DAYS),
        "a nack delay of 7 days"
    );
}

/// `advance` by the longest duration there is moves time past every delay and window; the
/// broker goes on working at that time. (No lease is live then: a live one would expire and
/// be delivered again every `ack_timeout` until the end of time.)
#[test]
fn advance_by_duration_max_is_accepted() {
    let broker = broker();
    let config = QueueConfig {
        dedup_window: SEVEN_DAYS,
        ..QueueConfig::default()
    };
    let q = queue_with(&broker, "late", config);
    put(&q, "windowed");
    q.put(msg("in a week").with_delay(SEVEN_DAYS)).unwrap();
    assert_stats!(q, { ready: 1, delayed: 1 });
    broker
        .advance(Duration::MAX)
        .expect("advance by Duration::MAX");
    broker.advance(Duration::MAX).expect("and again");
    assert_stats!(q, { ready: 2, delayed: 0 });
    let c = q.consume("c", prefetch(10)).unwrap();
    let (a, b) = (next(&c), next(&c));
    assert_eq!(
        [&*a.envelope().id, &*b.envelope().id],
        ["windowed", "in a week"]
    );
    assert_eq!(
        q.put(msg("windowed")),
        Ok(PutOutcome::Duplicate),
        "still live"
    );
    assert!(a.touch(), "a lease taken at the end of time can be touched");
    assert_eq!(c.ack_up_to(b.tag()), 2);
    assert_stats!(q, { acked: 2, leased: 0, enqueued: 2, duplicates: 1 });
}
