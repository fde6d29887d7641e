//! The data types of the public API: configs, messages, envelopes, outcomes, stats, errors.
//!
//! They live in the engine because the engine validates and stores them; the `leasemq` crate
//! re-exports them unchanged.

use std::fmt;
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
pub struct DeliveryTag(pub u64);

impl fmt::Display for DeliveryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a producer puts: a body, an optional id and an optional delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub(crate) body: Bytes,
    pub(crate) id: Option<String>,
    pub(crate) delay: Duration,
}

impl Message {
    /// A message with this body, no id (the broker assigns a unique one) and no delay.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Message {
            body: body.into(),
            id: None,
            delay: Duration::ZERO,
        }
    }

    /// Sets the id used for de-duplication (1 to 1 024 bytes).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Makes the message ready only `delay` after it is put (at most 7 days).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    pub fn delay(&self) -> Duration {
        self.delay
    }
}

/// What `put` did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PutOutcome {
    Enqueued,
    Duplicate,
}

/// Why a message was dead-lettered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeathReason {
    /// A consumer rejected it.
    Rejected,
    /// It came back after its `max_deliveries`-th delivery.
    MaxDeliveries,
}

/// Where and why a dead letter died; carried by the envelope in the dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeathRecord {
    /// The queue the message died in.
    pub queue: String,
    pub reason: DeathReason,
    /// How many times it was delivered there.
    pub attempts: u32,
}

/// What a consumer sees of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
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

/// One settle in a [`settle_batch`](crate::Command::SettleBatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settle {
    Ack,
    Nack,
    NackWithDelay(Duration),
    Reject,
    Release,
    Touch,
}

/// How long a nacked message waits before it is ready again:
/// `min(initial × multiplier^(attempt−1), max)`, ± `jitter` of that from the queue's seeded
/// generator.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
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

/// A queue's settings. Build with `..QueueConfig::default()`.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig {
    /// Lease length, from 1 ms to 7 days.
    pub ack_timeout: Duration,
    /// The longest a lease may be kept alive by `touch`, counted from its delivery.
    pub max_lease: Option<Duration>,
    pub retry: RetryPolicy,
    /// Deliveries after which a message that comes back is dead-lettered.
    pub max_deliveries: Option<u32>,
    /// The queue that receives dead letters; must already exist.
    pub dead_letter: Option<String>,
    /// How long after its first enqueue an id still counts as a duplicate.
    pub dedup_window: Duration,
    /// The most live messages (ready + delayed + leased).
    pub max_length: Option<usize>,
    pub max_body_bytes: usize,
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
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// A consumer's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// The most live leases this consumer may hold at once (1 to 65 535).
    pub prefetch: u32,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig { prefetch: 100 }
    }
}

/// A queue's gauges and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub ready: usize,
    pub delayed: usize,
    pub leased: usize,
    pub consumers: usize,
    pub enqueued: u64,
    pub duplicates: u64,
    pub delivered: u64,
    pub acked: u64,
    pub nacked: u64,
    pub rejected: u64,
    pub released: u64,
    pub expired: u64,
    pub dead_lettered: u64,
    pub dropped: u64,
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

/// Everything that can go wrong, with a message a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A queue or consumer name is empty, too long or has characters outside the allowed set.
    InvalidName,
    InvalidConfig(String),
    InvalidMessage(String),
    /// The queue exists with a different config.
    ConfigMismatch,
    UnknownQueue(String),
    /// The queue already has a consumer of that name.
    DuplicateConsumer,
    QueueClosed,
    QueueFull,
    MessageTooLarge,
    /// The consumer was cancelled or its queue closed.
    Closed,
    /// `advance` needs a broker built with `manual_clock()`.
    NotManualClock,
    ShutDown,
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
        }
    }
}

impl std::error::Error for Error {}
