//! The data types of the public API: configs, messages, envelopes, outcomes, stats, errors.
//!
//! They live in the engine because the engine validates and stores them; the `leasemq` crate
//! re-exports them unchanged.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

/// The longest lease, delay or retry wait the broker accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// The shortest `ack_timeout` the broker accepts.
pub const MIN_ACK_TIMEOUT: Duration = Duration::from_millis(1);
/// The largest `max_body_bytes` a queue may be configured with.
pub const MAX_BODY_LIMIT: usize = 64 * 1024 * 1024;
/// The largest prefetch a consumer may ask for.
pub const MAX_PREFETCH: u32 = 65_535;
/// The longest message id, in bytes.
pub const MAX_ID_BYTES: usize = 1024;
/// The longest queue or consumer name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// A delivery's tag: 1, 2, 3, … per queue in delivery order, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeliveryTag(pub u64);

impl fmt::Display for DeliveryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a producer puts: a body, an optional id, an optional delay and a priority.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Message {
    pub(crate) body: Bytes,
    /// In the form the queue keeps it, made by the producer's thread rather than the
    /// shard's.
    pub(crate) id: Option<Arc<str>>,
    pub(crate) delay: Duration,
    pub(crate) priority: u8,
}

// A put crosses to its shard inside a channel slot: a larger message makes every slot of
// every shard's inbox larger.
const _: () = assert!(std::mem::size_of::<Message>() <= 72);

impl Message {
    /// A message with this body, no id (the broker assigns a unique one) and no delay.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Message {
            body: body.into(),
            id: None,
            delay: Duration::ZERO,
            priority: 0,
        }
    }

    /// Sets the id used for de-duplication (1 to 1 024 bytes).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(Arc::from(id.into()));
        self
    }

    /// Makes the message ready only `delay` after it is put (at most 7 days).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the message's priority (default 0). In a queue with
    /// [`QueueConfig::max_priority`] a message of higher priority is delivered before those
    /// of lower priority that wait with it; one above the queue's maximum counts as the
    /// maximum. A queue without priorities ignores it.
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// The body, as given to [`Message::new`].
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The id given with [`Message::with_id`]; `None` when the broker is to assign one.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The delay given with [`Message::with_delay`]; zero when there is none.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The priority given with [`Message::with_priority`]; 0 when there is none.
    pub fn priority(&self) -> u8 {
        self.priority
    }
}

/// What `put` did with a message (contract §3 `put`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PutOutcome {
    /// The message is live in the queue: ready, or delayed.
    Enqueued,
    /// Its id is taken in the queue (contract §3 Deduplication): nothing was added, and
    /// only the queue's `duplicates` counter moved.
    Duplicate,
}

/// Why a message was dead-lettered (contract §3 Dead-lettering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DeathReason {
    /// A consumer rejected it.
    Rejected,
    /// It came back after its `max_deliveries`-th delivery.
    MaxDeliveries,
}

/// Where and why a dead letter died; carried by the envelope in the dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeathRecord {
    /// The queue the message died in.
    pub queue: String,
    /// Why it died there.
    pub reason: DeathReason,
    /// Its `attempt` there when it died: how many times it had been delivered (a release
    /// gives one back).
    pub attempts: u32,
}

/// What a consumer sees of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Envelope {
    /// The message's id: the one its producer gave, or the one the broker assigned.
    pub id: String,
    /// The body, as put.
    pub body: Bytes,
    /// Deliveries of this message so far, this one included (the first is 1).
    pub attempt: u32,
    /// Set when this message is a dead letter.
    pub death: Option<DeathRecord>,
}

impl Envelope {
    /// Whether this message was delivered before (`attempt > 1`).
    pub fn redelivered(&self) -> bool {
        self.attempt > 1
    }
}

/// One settle in a `settle_batch` ([`Command::SettleBatch`](crate::Command::SettleBatch)
/// in the engine): each variant does what the call of the same name does (contract §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Settle {
    /// Finish the delivery: the message is gone (contract §3 `ack`).
    Ack,
    /// Retry after the queue's retry delay (contract §3 `nack`).
    Nack,
    /// Retry after this delay instead, at most 7 days (contract §3 `nack_with_delay`).
    NackWithDelay(Duration),
    /// Dead-letter now (contract §3 `reject`).
    Reject,
    /// Hand back unseen, to the front, costing no attempt (contract §3 `release`).
    Release,
    /// Restart the lease clock (contract §3 `touch`).
    Touch,
}

/// How long a nacked message waits before it is ready again:
/// `min(initial × multiplier^(attempt−1), max)`, ± `jitter` of that from the queue's seeded
/// generator (contract §5 `RetryPolicy`, §4 Jitter).
///
/// ```
/// use std::time::Duration;
/// use leasemq_engine::RetryPolicy;
///
/// let policy = RetryPolicy::default(); // 1 s, doubling, at most 60 s
/// assert_eq!(policy.base_delay(1), Duration::from_secs(1));
/// assert_eq!(policy.base_delay(3), Duration::from_secs(4));
/// assert_eq!(policy.base_delay(20), Duration::from_secs(60));
/// assert_eq!(RetryPolicy::immediate().base_delay(5), Duration::ZERO);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RetryPolicy {
    /// The delay after the first delivery's nack (default 1 s; at most 7 days).
    pub initial: Duration,
    /// What each further attempt multiplies the delay by (default 2.0; finite, at least 1.0).
    pub multiplier: f64,
    /// The longest delay, before jitter (default 60 s; at most 7 days).
    pub max: Duration,
    /// The fraction by which a delay may be drawn shorter or longer, from 0.0 (default: none)
    /// to 1.0.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max: Duration::from_secs(60),
            jitter: 0.0,
        }
    }
}

impl RetryPolicy {
    /// Every retry delay is zero: a nacked message is ready again at once.
    pub fn immediate() -> Self {
        RetryPolicy {
            initial: Duration::ZERO,
            multiplier: 1.0,
            max: Duration::ZERO,
            jitter: 0.0,
        }
    }

    /// The delay before the retry of a message nacked at `attempt`, before jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(1_000) as i32;
        let scaled = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = scaled.min(self.max.as_secs_f64());
        if capped.is_finite() {
            Duration::from_secs_f64(capped.max(0.0))
        } else {
            self.max
        }
    }
}

/// A queue's settings. Build with `..QueueConfig::default()`; contract §3 Limits lists
/// what each field accepts, and `declare_queue` refuses anything else with
/// `InvalidConfig`.
///
/// ```
/// use std::time::Duration;
/// use leasemq_engine::QueueConfig;
///
/// let config = QueueConfig { ack_timeout: Duration::from_secs(5), ..QueueConfig::default() };
/// assert_eq!(config.max_body_bytes, 1024 * 1024);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QueueConfig {
    /// Lease length, from 1 ms to 7 days (default 30 s).
    pub ack_timeout: Duration,
    /// The longest a lease may be kept alive by `touch`, counted from its delivery; at least
    /// `ack_timeout` (default: no limit).
    pub max_lease: Option<Duration>,
    /// How long a nacked message waits (default: `RetryPolicy::default()`).
    pub retry: RetryPolicy,
    /// Deliveries after which a message that comes back is dead-lettered; at least 1
    /// (default: no limit).
    pub max_deliveries: Option<u32>,
    /// The queue that receives dead letters; must already exist and be another queue
    /// (default: none, dead letters are dropped and counted).
    pub dead_letter: Option<String>,
    /// How long after its first enqueue an id still counts as a duplicate, at most 7 days
    /// (default zero: only while the message is live).
    pub dedup_window: Duration,
    /// The most live messages (ready + delayed + leased), or with `Overflow::DropHead` the
    /// most waiting ones (ready + delayed); at least 1 (default: no limit).
    pub max_length: Option<usize>,
    /// What a put to a full queue does (default: it is refused,
    /// `Overflow::RejectPublish`).
    pub overflow: Overflow,
    /// The largest body a put may carry, from 1 byte to 64 MiB (default 1 MiB).
    pub max_body_bytes: usize,
    /// Whether the queue's messages survive a restart, kept in the broker's data dir
    /// (contract §7, default false). A durable queue needs a broker with a data dir
    /// (`BrokerBuilder::data_dir`), and a dead-letter queue that is durable too.
    pub durable: bool,
    /// Priorities: with `Some(n)` the ready messages are delivered highest priority first
    /// (levels 0 to `n`, a message's priority above `n` counting as `n`), in their usual
    /// order within a level (contract §3 Dispatch); `None` (the default): one level, every
    /// message's priority ignored. RabbitMQ's `x-max-priority`.
    pub max_priority: Option<u8>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            ack_timeout: Duration::from_secs(30),
            max_lease: None,
            retry: RetryPolicy::default(),
            max_deliveries: None,
            dead_letter: None,
            dedup_window: Duration::ZERO,
            max_length: None,
            overflow: Overflow::RejectPublish,
            max_body_bytes: 1024 * 1024,
            durable: false,
            max_priority: None,
        }
    }
}

/// What a put to a full queue (one holding `max_length` live messages) does; contract §3
/// Overflow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Overflow {
    /// The put is refused with `QueueFull` (RabbitMQ's `reject-publish`).
    #[default]
    RejectPublish,
    /// `max_length` bounds the waiting messages (ready and delayed; leased ones do not
    /// count, as in RabbitMQ). A put that finds that many drops the queue's oldest ready
    /// message, the next that dispatch would hand out, to make room (counted in `dropped`,
    /// never dead-lettered; RabbitMQ's `drop-head`). With none ready (every waiting one
    /// delayed) the put is refused with `QueueFull`.
    DropHead,
}

/// A consumer's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConsumerConfig {
    /// The most live leases this consumer may hold at once (1 to 65 535).
    pub prefetch: u32,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig { prefetch: 100 }
    }
}

/// How a consumer is served, beyond its [`ConsumerConfig`]: what AMQP's `basic.consume`
/// arguments ask. The default is what `consume` gives.
///
/// ```
/// use std::time::Duration;
/// use leasemq_engine::ConsumeOptions;
///
/// let options = ConsumeOptions::default()
///     .priority(5)
///     .ack_timeout(Duration::from_secs(3600));
/// assert_eq!(options.priority, 5);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ConsumeOptions {
    /// Its priority (contract §3 Dispatch, AMQP's `x-priority`): a queue's ready messages go
    /// to those of its consumers with credit that have the highest priority. 0 by default;
    /// priorities may be negative.
    pub priority: i64,
    /// The lease of its deliveries, in place of the queue's `ack_timeout` (AMQP's
    /// `x-consumer-timeout` on `basic.consume`): 1 ms to 7 days, and at most the queue's
    /// `max_lease`. `None`, the default: the queue's.
    pub ack_timeout: Option<Duration>,
}

impl ConsumeOptions {
    /// These options with priority `priority`.
    #[must_use]
    pub fn priority(mut self, priority: i64) -> ConsumeOptions {
        self.priority = priority;
        self
    }

    /// These options with leases of `ack_timeout`.
    #[must_use]
    pub fn ack_timeout(mut self, ack_timeout: Duration) -> ConsumeOptions {
        self.ack_timeout = Some(ack_timeout);
        self
    }
}

/// A queue's gauges (what it holds now) and counters (what happened since it was declared);
/// contract §3 `stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QueueStats {
    /// Gauge: messages waiting for a consumer with credit.
    pub ready: usize,
    /// Gauge: messages waiting for a delay (from `with_delay` or a nack) to end.
    pub delayed: usize,
    /// Gauge: live leases.
    pub leased: usize,
    /// Gauge: live consumers.
    pub consumers: usize,
    /// Puts answered `Enqueued`, and dead letters taken in from other queues.
    pub enqueued: u64,
    /// Puts answered `Duplicate`.
    pub duplicates: u64,
    /// Deliveries made, first or not.
    pub delivered: u64,
    /// Leases ended by `ack`, `ack_up_to` or an `Ack` in a batch.
    pub acked: u64,
    /// Leases ended by a nack, with or without a delay, also those that became dead letters.
    pub nacked: u64,
    /// Leases ended by `reject`.
    pub rejected: u64,
    /// Leases ended by `release`, and unread deliveries released when their consumer ended.
    pub released: u64,
    /// Leases that reached their deadline.
    pub expired: u64,
    /// Dead letters the dead-letter queue took.
    pub dead_lettered: u64,
    /// Dead letters dropped (no dead-letter queue, or it refused them), and heads dropped
    /// to make room by `Overflow::DropHead`.
    pub dropped: u64,
    /// Settles and touches of stale tags (contract §2 G2).
    pub stale: u64,
}

impl QueueStats {
    /// The same counters with every gauge at zero: what a closed queue reports.
    pub fn frozen(&self) -> QueueStats {
        QueueStats {
            ready: 0,
            delayed: 0,
            leased: 0,
            consumers: 0,
            ..self.clone()
        }
    }
}

/// Everything that can go wrong, with a message a person can act on. A call that fails
/// changes nothing (contract §3).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Error {
    /// A queue or consumer name is empty, too long or has characters outside the allowed set
    /// (contract §3 Limits).
    InvalidName,
    /// A queue config, a prefetch or a broker setting is outside its limits; says which and
    /// why (contract §3 Limits).
    InvalidConfig(String),
    /// A message's id is empty or over 1 024 bytes, or its delay is over 7 days; says which.
    InvalidMessage(String),
    /// The queue exists with a different config.
    ConfigMismatch,
    /// The named dead-letter queue does not exist (or is closed); carries its name.
    UnknownQueue(String),
    /// The queue already has a consumer of that name.
    DuplicateConsumer,
    /// The queue was closed (through this handle or another).
    QueueClosed,
    /// The queue holds `max_length` live messages already.
    QueueFull,
    /// The body is larger than the queue's `max_body_bytes`.
    MessageTooLarge,
    /// The consumer's queue was closed: no more deliveries will come.
    Closed,
    /// `advance` needs a broker built with `manual_clock()`.
    NotManualClock,
    /// The broker was shut down.
    ShutDown,
    /// The data dir failed: says which file and what went wrong (contract §7).
    Storage(String),
    /// In a cluster, the call found no leader for its shard within the call timeout, or
    /// was at the leader when it lost the lead: its outcome is unknown (a put may have been
    /// taken, a settle applied). Says why (contract §9 R6).
    Unavailable(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidName => f.write_str(
                "invalid name: queue names are 1-255 bytes of [A-Za-z0-9._:-], \
                 consumer names 1-255 bytes of UTF-8",
            ),
            Error::InvalidConfig(why) => write!(f, "invalid config: {why}"),
            Error::InvalidMessage(why) => write!(f, "invalid message: {why}"),
            Error::ConfigMismatch => f.write_str(
                "the queue already exists with a different config; \
                 declare it with the same config or close it first",
            ),
            Error::UnknownQueue(name) => write!(f, "no queue named {name:?}; declare it first"),
            Error::DuplicateConsumer => f.write_str(
                "the queue already has a consumer with this name; cancel it or pick another",
            ),
            Error::QueueClosed => f.write_str("the queue is closed"),
            Error::QueueFull => f.write_str("the queue holds max_length live messages already"),
            Error::MessageTooLarge => {
                f.write_str("the message body is larger than the queue's max_body_bytes")
            }
            Error::Closed => {
                f.write_str("the consumer is closed: it was cancelled or its queue closed")
            }
            Error::NotManualClock => {
                f.write_str("advance needs a broker built with manual_clock()")
            }
            Error::ShutDown => f.write_str("the broker is shut down"),
            Error::Storage(why) => write!(f, "storage failed: {why}"),
            Error::Unavailable(why) => write!(
                f,
                "unavailable: {why}; the outcome is unknown (a put may have been taken, \
                 a settle applied): put again with an id, settle again"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// A message's id as the engine keeps it: a caller's id is shared, never copied; a broker
/// id is a number, turned into text only when a consumer reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum MsgId {
    /// Assigned by the broker: the shard's index in the top 16 bits, a per-shard sequence below.
    Auto(u64),
    /// Given by the producer with `Message::with_id`.
    Given(Arc<str>),
}

impl MsgId {
    /// The number of the broker id with this shard and sequence.
    pub(crate) fn auto_number(shard: u16, seq: u64) -> u64 {
        (u64::from(shard) << 48) | (seq & ((1 << 48) - 1))
    }

    /// The broker id whose text is `text`, if `text` is exactly that form: `~<shard>-<seq>`
    /// in decimal without leading zeros, the shard below 65 536 and the sequence below
    /// 2⁴⁸. A caller may give such an id; the queue then checks generated ids against it.
    pub(crate) fn parse_auto(text: &str) -> Option<u64> {
        let (shard, seq) = text.strip_prefix('~')?.split_once('-')?;
        let number = |digits: &str, below: u64| -> Option<u64> {
            let canonical = !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0'));
            let n: u64 = digits.parse().ok().filter(|_| canonical)?;
            (n < below).then_some(n)
        };
        let shard = number(shard, 1 << 16)?;
        let seq = number(seq, 1 << 48)?;
        Some((shard << 48) | seq)
    }

    /// The id as text: a caller's id as given, a broker id as `~<shard>-<sequence>`.
    /// One allocation of the right size, no formatting machinery: this runs per delivery.
    pub fn to_text(&self) -> String {
        match self {
            MsgId::Given(id) => id.to_string(),
            MsgId::Auto(n) => {
                let (mut shard, mut seq) = (itoa::Buffer::new(), itoa::Buffer::new());
                let (shard, seq) = (shard.format(n >> 48), seq.format(n & ((1 << 48) - 1)));
                let mut text = String::with_capacity(2 + shard.len() + seq.len());
                text.push('~');
                text.push_str(shard);
                text.push('-');
                text.push_str(seq);
                text
            }
        }
    }
}

impl fmt::Display for MsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::MsgId;

    #[test]
    fn only_the_exact_text_of_a_broker_id_parses_as_one() {
        for (shard, seq) in [(0, 1), (1, 7), (65_535, (1 << 48) - 1)] {
            let id = MsgId::Auto(MsgId::auto_number(shard, seq));
            assert_eq!(
                MsgId::parse_auto(&id.to_text()),
                Some(MsgId::auto_number(shard, seq))
            );
        }
        for text in [
            "",
            "~",
            "~0",
            "~0-",
            "~-1",
            "0-1",
            "~00-1",
            "~0-01",
            "~+1-2",
            "~1-2-3",
            "~0-1 ",
            "~65536-1",
            "~0-281474976710656",
            "~a-1",
        ] {
            assert_eq!(MsgId::parse_auto(text), None, "{text:?}");
        }
    }
}
