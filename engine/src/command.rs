//! What goes into a [`Shard`](crate::Shard) (commands) and what comes out (replies and effects).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use crate::types::MsgId;
use crate::types::{
    ConsumerConfig, DeathRecord, DeliveryTag, Envelope, Error, Message, PutOutcome, QueueConfig,
    QueueStats, Settle,
};
use crate::wheel::Tick;

/// A queue of one shard: its slot and the generation that tells it from a later queue in the
/// same slot, so that handles of a closed queue never reach its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QueueKey {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

impl QueueKey {
    /// The queue's slot: stable while it lives, reused after. The runtime indexes per-queue
    /// data by it.
    pub fn slot(self) -> usize {
        self.idx as usize
    }

    /// The key as one number, for a runtime that keeps it in an atomic.
    pub fn to_bits(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.idx)
    }

    /// The key [`to_bits`](QueueKey::to_bits) made `bits` from.
    pub fn from_bits(bits: u64) -> QueueKey {
        QueueKey {
            idx: bits as u32,
            gen: (bits >> 32) as u32,
        }
    }
}

/// A consumer of one shard, with a generation like [`QueueKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConsumerKey {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

impl ConsumerKey {
    /// The consumer's slot: stable while it lives, reused after. The runtime indexes its
    /// delivery channels by it.
    pub fn slot(self) -> usize {
        self.idx as usize
    }
}

/// A delivery as it leaves the engine; the consumer turns it into an [`Envelope`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Delivered {
    /// The new lease's tag.
    pub tag: DeliveryTag,
    /// The message's id.
    pub id: MsgId,
    /// The message's body.
    pub body: Bytes,
    /// Deliveries of the message so far, this one included.
    pub attempt: u32,
    /// Set when the message is a dead letter.
    pub death: Option<Box<DeathRecord>>,
}

impl Delivered {
    /// What the consumer sees: the id turned into text, the death record unboxed.
    pub fn into_envelope(self) -> Envelope {
        Envelope {
            id: self.id.to_text(),
            body: self.body,
            attempt: self.attempt,
            death: self.death.map(|d| *d),
        }
    }
}

/// Identifies the queue a dead letter came from, across shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Origin {
    /// The index of the shard the letter came from.
    pub shard: u16,
    /// The queue it died in, on that shard.
    pub queue: QueueKey,
    /// The message's number in that queue's log; 0 when the queue is not durable.
    pub msg: u64,
}

/// A message on its way to a dead-letter queue, which may live on another shard.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeadLetter {
    /// The dead-letter queue's name, looked up when the letter arrives.
    pub to: Arc<str>,
    /// Where it died, so that the outcome can find its way back.
    pub origin: Origin,
    /// The message's id, kept in the dead-letter queue.
    pub id: MsgId,
    /// The message's body.
    pub body: Bytes,
    /// Its priority, kept in the dead-letter queue.
    pub priority: u8,
    /// Where and why it died.
    pub death: DeathRecord,
}

/// Whether a dead-letter queue took a letter; the origin counts it in `dead_lettered` or
/// `dropped`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeathOutcome {
    /// The queue the letter came from.
    pub origin: Origin,
    /// Whether the dead-letter queue took it (else it was dropped).
    pub accepted: bool,
}

/// A request to a shard. Each is answered with exactly one [`Reply`] in
/// [`Effects::reply`], except the ones documented as silent.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Command {
    /// → [`Reply::Declared`]. The caller has checked that the config's dead-letter queue exists.
    Declare {
        /// The queue's name.
        name: String,
        /// Its config (boxed to keep commands small).
        config: Box<QueueConfig>,
    },
    /// → [`Reply::Found`].
    Lookup {
        /// The queue's name.
        name: String,
    },
    /// → [`Reply::Put`].
    Put {
        /// The queue to put on.
        queue: QueueKey,
        /// What to put.
        message: Message,
    },
    /// → [`Reply::PutBatch`].
    PutBatch {
        /// The queue to put on.
        queue: QueueKey,
        /// What to put, in order.
        messages: Vec<Message>,
    },
    /// → [`Reply::Settled`].
    Settle {
        /// The queue that issued the tag.
        queue: QueueKey,
        /// The delivery to settle.
        tag: DeliveryTag,
        /// What to do with it.
        op: Settle,
    },
    /// → [`Reply::SettledBatch`].
    SettleBatch {
        /// The queue that issued the tags.
        queue: QueueKey,
        /// The settles, applied in order.
        settles: Vec<(DeliveryTag, Settle)>,
    },
    /// → [`Reply::Consumed`].
    Consume {
        /// The queue to read.
        queue: QueueKey,
        /// The consumer's name, unique among the queue's live consumers.
        name: String,
        /// Its prefetch.
        config: ConsumerConfig,
        /// Its priority (contract §3 Dispatch): a queue's ready messages go to those of its
        /// consumers with credit that have the highest priority. 0 is the default.
        priority: i64,
        /// The lease of its deliveries, where not the queue's `ack_timeout`
        /// ([`ConsumeOptions::ack_timeout`](crate::ConsumeOptions)).
        ack_timeout: Option<Duration>,
    },
    /// → [`Reply::Count`].
    AckUpTo {
        /// Whose leases to ack.
        consumer: ConsumerKey,
        /// The highest tag to ack.
        tag: DeliveryTag,
    },
    /// Silent. `unread` are the deliveries still in the consumer's channel: released, not
    /// returned.
    Cancel {
        /// The consumer that ends.
        consumer: ConsumerKey,
        /// The tags of its deliveries it never read.
        unread: Vec<DeliveryTag>,
    },
    /// Silent. The consumer gets no more deliveries; `unread` (still in its channel) are
    /// released, and the leases it read stay its own until settled, expired or cancelled.
    Stop {
        /// The consumer that stops.
        consumer: ConsumerKey,
        /// The tags of its deliveries it never read.
        unread: Vec<DeliveryTag>,
    },
    /// → [`Reply::Purged`].
    Purge {
        /// The queue to empty of the messages it is not lending out.
        queue: QueueKey,
    },
    /// → [`Reply::Stats`].
    Stats {
        /// The queue asked about.
        queue: QueueKey,
    },
    /// → [`Reply::Closed`].
    Close {
        /// The queue to close.
        queue: QueueKey,
    },
    /// Silent: dead letters for queues of this shard; answered with [`Effects::outcomes`].
    DeadLetters {
        /// The letters, each naming its dead-letter queue.
        letters: Vec<DeadLetter>,
    },
    /// Silent: what dead-letter queues did with letters from queues of this shard.
    Outcomes {
        /// One per letter, naming the queue it came from.
        outcomes: Vec<DeathOutcome>,
    },
}

/// The answer to one command.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Reply {
    /// The queue declared or found, or why not.
    Declared(Result<QueueKey, Error>),
    /// The live queue of that name, if any.
    Found(Option<QueueKey>),
    /// What the put did, or why it failed.
    Put(Result<PutOutcome, Error>),
    /// One outcome per message, or the first failure (then none was enqueued).
    PutBatch(Result<Vec<PutOutcome>, Error>),
    /// Whether the settle took effect: `false` for a stale tag or a refused request.
    Settled(bool),
    /// One result per settle, in order.
    SettledBatch(Vec<bool>),
    /// The new consumer, or why not.
    Consumed(Result<ConsumerKey, Error>),
    /// How many leases `AckUpTo` acked.
    Count(usize),
    /// How many ready and delayed messages `Purge` removed, or why not.
    Purged(Result<usize, Error>),
    /// `None` when the queue is closed.
    Stats(Option<Box<QueueStats>>),
    /// The counters frozen at close the first time; `None` when it was closed already.
    Closed(Option<Box<QueueStats>>),
}

/// What the engine asks its runtime to carry out. The runtime drains it after each call;
/// the vectors keep their capacity so that a warm shard does not allocate.
#[derive(Debug, Default)]
pub struct Effects {
    /// Deliveries to push into consumer channels, in order, by [`ConsumerKey::slot`].
    pub deliveries: Vec<(ConsumerKey, Delivered)>,
    /// Dead letters to route to the shard owning `to`.
    pub dead_letters: Vec<DeadLetter>,
    /// Answers to route back to the shard of each `origin`.
    pub outcomes: Vec<DeathOutcome>,
    /// Consumers that ended (cancelled, or their queue closed): drop their channels.
    pub consumers_gone: Vec<ConsumerKey>,
    /// Changes to durable queues, in order: written to the log, and on disk before any
    /// delivery, answer or outcome that followed them leaves the shard (contract §7).
    pub log: Vec<crate::durable::Change>,
    /// The answer to the command just handled.
    pub reply: Option<Reply>,
}

impl Effects {
    /// Nothing to do yet.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Converts durations to whole ticks, rounding up so that nothing fires early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TickLength {
    nanos: u64,
}

impl TickLength {
    /// Ticks of `tick` (at least 1 ns).
    pub fn new(tick: Duration) -> TickLength {
        let nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        TickLength { nanos }
    }

    /// The length of one tick.
    pub fn as_duration(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// `d` in ticks, rounded up.
    pub fn ticks(self, d: Duration) -> Tick {
        if d.is_zero() {
            return 0;
        }
        match u64::try_from(d.as_nanos()) {
            Ok(nanos) => nanos.div_ceil(self.nanos),
            Err(_) => {
                let ticks = d.as_nanos().div_ceil(u128::from(self.nanos));
                u64::try_from(ticks).unwrap_or(u64::MAX)
            }
        }
    }

    /// `nanos` since the epoch as the tick it falls in (rounded down).
    pub fn tick_of(self, nanos: u64) -> Tick {
        nanos / self.nanos
    }

    /// When `tick` begins, in nanoseconds since the epoch (saturating).
    pub fn start_of(self, tick: Tick) -> u64 {
        tick.saturating_mul(self.nanos)
    }
}
