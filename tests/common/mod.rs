//! Helpers shared by the integration tests: manual-clock brokers, queue declarations,
//! shorthands for messages and deliveries, and assertion macros.
//!
//! Each test file includes this module with `mod common;` and `use common::*;`; not every
//! file uses every helper.

#![allow(dead_code, unused_imports, unused_macros)]

use std::time::Duration;

use leasemq::{Broker, Consumer, ConsumerConfig, Delivery, Message, Queue, QueueConfig};

// --- brokers and durations -----------------------------------------------------------------

/// Whether this kernel lets a normal thread choose its slice (Linux 6.12 and later).
pub fn custom_slices() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 12)
}

/// The longest delay and ack timeout a queue accepts.
pub const SEVEN_DAYS: Duration = Duration::from_secs(7 * 24 * 3600);

/// A manual-clock broker with two shards.
pub fn broker() -> Broker {
    manual_clock_broker(2)
}

/// A manual-clock broker with four shards.
pub fn broker4() -> Broker {
    manual_clock_broker(4)
}

fn manual_clock_broker(shards: usize) -> Broker {
    Broker::builder()
        .shards(shards)
        .manual_clock()
        .build()
        .expect("manual-clock broker")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// --- queues and consumers ------------------------------------------------------------------

pub fn prefetch(n: u32) -> ConsumerConfig {
    ConsumerConfig { prefetch: n }
}

/// The default config with `ack_timeout` in place of the default one.
pub fn with_ack_timeout(ack_timeout: Duration) -> QueueConfig {
    QueueConfig {
        ack_timeout,
        ..QueueConfig::default()
    }
}

/// A queue with the default config.
pub fn plain(broker: &Broker, name: &str) -> Queue {
    broker.declare_queue(name, QueueConfig::default()).unwrap()
}

pub fn queue_with(broker: &Broker, name: &str, config: QueueConfig) -> Queue {
    broker.declare_queue(name, config).unwrap()
}

/// A queue with the default config but for `ack_timeout`.
pub fn timeout_queue(broker: &Broker, name: &str, ack_timeout: Duration) -> Queue {
    queue_with(broker, name, with_ack_timeout(ack_timeout))
}

/// A dead-letter queue `dlq` (declared first, with the default config) and a queue `src`
/// with `config` that dead-letters into it. Returns `(src, dlq)`.
pub fn dead_letter_pair(
    broker: &Broker,
    src: &str,
    dlq: &str,
    config: QueueConfig,
) -> (Queue, Queue) {
    dead_letter_pair_with(broker, src, config, dlq, QueueConfig::default())
}

/// A dead-letter queue `dlq` (declared first, with `dlq_config`) and a queue `src` with
/// `config` that dead-letters into it. Returns `(src, dlq)`.
pub fn dead_letter_pair_with(
    broker: &Broker,
    src: &str,
    config: QueueConfig,
    dlq: &str,
    dlq_config: QueueConfig,
) -> (Queue, Queue) {
    let dead = queue_with(broker, dlq, dlq_config);
    let q = queue_with(
        broker,
        src,
        QueueConfig {
            dead_letter: Some(dlq.to_string()),
            ..config
        },
    );
    (q, dead)
}

// --- messages and deliveries ---------------------------------------------------------------

/// A message with id `id` and the body `"body of {id}"`.
pub fn msg(id: &str) -> Message {
    Message::new(format!("body of {id}")).with_id(id)
}

/// Puts [`msg`]`(id)`, whatever the outcome, as long as it is not an error.
pub fn put(queue: &Queue, id: &str) {
    queue.put(msg(id)).expect("put");
}

/// The next delivery, which must already be in the channel (calls are barriers).
pub fn next(consumer: &Consumer) -> Delivery {
    consumer
        .try_recv()
        .expect("try_recv")
        .expect("a delivery should already be in the consumer's channel")
}

pub fn nothing(consumer: &Consumer) {
    assert!(
        consumer.try_recv().expect("try_recv").is_none(),
        "consumer {} should have no delivery waiting",
        consumer.name()
    );
}

/// (id, tag, attempt) of the next delivery.
pub fn seen(consumer: &Consumer) -> (String, u64, u32) {
    let d = next(consumer);
    let e = d.envelope();
    (e.id.clone(), d.tag().0, e.attempt)
}

/// An expected (id, tag, attempt), to compare with [`seen`].
pub fn s(id: &str, tag: u64, attempt: u32) -> (String, u64, u32) {
    (id.to_string(), tag, attempt)
}

// --- assertions ----------------------------------------------------------------------------

/// A stats field as `u64`, whatever integer type it has.
pub fn count<T: TryInto<u64>>(value: T) -> u64 {
    value
        .try_into()
        .unwrap_or_else(|_| panic!("stats field out of range"))
}

/// Asserts the named fields of a queue's stats: `assert_stats!(q, { ready: 1, leased: 0 })`.
macro_rules! assert_stats {
    ($queue:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let stats = $queue.stats();
        $(assert_eq!(
            $crate::common::count(stats.$field),
            $value,
            "stats.{} in {:?}",
            stringify!($field),
            stats
        );)*
    }};
}
pub(crate) use assert_stats;

/// Asserts that a `Result` is an error matching the pattern.
macro_rules! assert_err {
    ($result:expr, $pattern:pat) => {
        match $result {
            Err($pattern) => {}
            Err(other) => panic!("expected {}, got {:?}", stringify!($pattern), other),
            Ok(_) => panic!("expected {}, got Ok", stringify!($pattern)),
        }
    };
}
pub(crate) use assert_err;

/// Asserts that `result` is an error matching the pattern and leaves the queue's stats as
/// they were.
macro_rules! assert_err_unchanged {
    ($queue:expr, $result:expr, $pattern:pat) => {{
        let before = $queue.stats();
        $crate::common::assert_err!($result, $pattern);
        assert_eq!($queue.stats(), before, "a failed put changes nothing");
    }};
}
pub(crate) use assert_err_unchanged;
