//! The queue handle: puts, settles, consumers, stats and close, each one request to the
//! shard that owns the queue.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::unbounded;
use leasemq_engine::{
    validate, Command, ConsumerConfig, DeliveryTag, Error, Message, PutOutcome, QueueKey,
    QueueStats, Reply, Settle,
};

use crate::broker::BrokerInner;
use crate::consumer::Consumer;
use crate::protocol::{Answer, QueueCell, Readers, ReplyTo, Request, Sink, WakeOnDrop};
use crate::reply::{call, call_async};

/// A handle to one queue. Cheap to clone, `Send + Sync`; every clone reaches the same queue,
/// and none reaches a later queue of the same name once this one is closed.
#[derive(Clone)]
pub struct Queue {
    inner: Arc<QueueInner>,
}

pub(crate) struct QueueInner {
    broker: Arc<BrokerInner>,
    name: String,
    shard: usize,
    key: QueueKey,
    cell: Arc<QueueCell>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.inner.name)
            .field("shard", &self.inner.shard)
            .finish()
    }
}

/// What a request came back with, before it is read as one call's result.
enum Outcome {
    Reply(Reply),
    ShutDown,
}

impl Queue {
    pub(crate) fn new(
        broker: Arc<BrokerInner>,
        name: &str,
        shard: usize,
        key: QueueKey,
        cell: Arc<QueueCell>,
    ) -> Queue {
        Queue {
            inner: Arc::new(QueueInner {
                broker,
                name: name.to_string(),
                shard,
                key,
                cell,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The shard that owns this queue.
    pub fn shard(&self) -> usize {
        self.inner.shard
    }

    pub(crate) fn broker(&self) -> &Arc<BrokerInner> {
        &self.inner.broker
    }

    pub(crate) fn cell(&self) -> &QueueCell {
        &self.inner.cell
    }

    fn request(&self, cmd: Command) -> Outcome {
        if self.inner.broker.is_shut_down() {
            return Outcome::ShutDown;
        }
        match call(self.inner.broker.inbox(self.inner.shard), |reply| {
            Request::Engine { cmd, reply }
        }) {
            Answer::Engine(reply) => Outcome::Reply(reply),
            Answer::ShutDown => Outcome::ShutDown,
            other => unreachable!("a queue command answered {other:?}"),
        }
    }

    async fn request_async(&self, cmd: Command) -> Outcome {
        if self.inner.broker.is_shut_down() {
            return Outcome::ShutDown;
        }
        let inbox = self.inner.broker.inbox(self.inner.shard);
        match call_async(inbox, |reply: ReplyTo| Request::Engine { cmd, reply }).await {
            Answer::Engine(reply) => Outcome::Reply(reply),
            Answer::ShutDown => Outcome::ShutDown,
            other => unreachable!("a queue command answered {other:?}"),
        }
    }

    // ----- put -----------------------------------------------------------------------------

    /// Puts a message. When it returns, any delivery it caused is in its consumer's channel.
    pub fn put(&self, message: Message) -> Result<PutOutcome, Error> {
        let cmd = Command::Put {
            queue: self.inner.key,
            message,
        };
        put_result(self.request(cmd))
    }

    /// Puts many messages in one round trip; atomic for errors: if any message would fail,
    /// none is enqueued and that error is returned.
    pub fn put_batch(&self, messages: Vec<Message>) -> Result<Vec<PutOutcome>, Error> {
        let cmd = Command::PutBatch {
            queue: self.inner.key,
            messages,
        };
        put_batch_result(self.request(cmd))
    }

    pub async fn put_async(&self, message: Message) -> Result<PutOutcome, Error> {
        let cmd = Command::Put {
            queue: self.inner.key,
            message,
        };
        put_result(self.request_async(cmd).await)
    }

    pub async fn put_batch_async(&self, messages: Vec<Message>) -> Result<Vec<PutOutcome>, Error> {
        let cmd = Command::PutBatch {
            queue: self.inner.key,
            messages,
        };
        put_batch_result(self.request_async(cmd).await)
    }

    // ----- settle --------------------------------------------------------------------------

    fn settle(&self, tag: DeliveryTag, op: Settle) -> bool {
        if self.inner.cell.is_closed() {
            return false;
        }
        let cmd = Command::Settle {
            queue: self.inner.key,
            tag,
            op,
        };
        settled(self.request(cmd))
    }

    async fn settle_async(&self, tag: DeliveryTag, op: Settle) -> bool {
        if self.inner.cell.is_closed() {
            return false;
        }
        let cmd = Command::Settle {
            queue: self.inner.key,
            tag,
            op,
        };
        settled(self.request_async(cmd).await)
    }

    /// Finishes a delivery: the message is gone. `false` if the tag is stale.
    pub fn ack(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Ack)
    }

    /// Gives the message back to be retried after the queue's retry delay.
    pub fn nack(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Nack)
    }

    /// Gives the message back to be retried after `delay` (zero: at once; at most 7 days).
    pub fn nack_with_delay(&self, tag: DeliveryTag, delay: Duration) -> bool {
        self.settle(tag, Settle::NackWithDelay(delay))
    }

    /// Dead-letters the message now; it is never retried.
    pub fn reject(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Reject)
    }

    /// Hands the message back unseen: to the front, costing no attempt.
    pub fn release(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Release)
    }

    /// Restarts the lease clock: the new deadline is now + `ack_timeout`.
    pub fn touch(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Touch)
    }

    /// Applies many settles, in order, in one round trip; one result per entry.
    pub fn settle_batch(&self, settles: &[(DeliveryTag, Settle)]) -> Vec<bool> {
        if self.inner.cell.is_closed() {
            return vec![false; settles.len()];
        }
        let cmd = Command::SettleBatch {
            queue: self.inner.key,
            settles: settles.to_vec(),
        };
        settled_batch(self.request(cmd), settles.len())
    }

    pub async fn ack_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Ack).await
    }

    pub async fn nack_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Nack).await
    }

    pub async fn nack_with_delay_async(&self, tag: DeliveryTag, delay: Duration) -> bool {
        self.settle_async(tag, Settle::NackWithDelay(delay)).await
    }

    pub async fn reject_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Reject).await
    }

    pub async fn release_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Release).await
    }

    pub async fn touch_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Touch).await
    }

    pub async fn settle_batch_async(&self, settles: &[(DeliveryTag, Settle)]) -> Vec<bool> {
        if self.inner.cell.is_closed() {
            return vec![false; settles.len()];
        }
        let cmd = Command::SettleBatch {
            queue: self.inner.key,
            settles: settles.to_vec(),
        };
        settled_batch(self.request_async(cmd).await, settles.len())
    }

    // ----- consumers, stats, close ---------------------------------------------------------

    /// Registers a consumer. Deliveries start at once, up to its prefetch.
    pub fn consume(&self, name: &str, config: ConsumerConfig) -> Result<Consumer, Error> {
        if self.inner.broker.is_shut_down() {
            return Err(Error::ShutDown);
        }
        if self.inner.cell.is_closed() {
            return Err(Error::QueueClosed);
        }
        validate::consumer_name(name)?;
        validate::consumer_config(&config)?;
        let (tx, rx) = unbounded();
        let readers = Arc::new(Readers::default());
        let sink = Sink {
            tx,
            rx: rx.clone(),
            prefetch: config.prefetch as usize,
            readers: WakeOnDrop(readers.clone()),
        };
        let queue = self.inner.key;
        let answer = call(self.inner.broker.inbox(self.inner.shard), |reply| {
            Request::Consume {
                queue,
                name: name.to_string(),
                config,
                sink,
                reply,
            }
        });
        match answer {
            Answer::Engine(Reply::Consumed(Ok(key))) => {
                Ok(Consumer::new(self.clone(), name, key, rx, readers))
            }
            Answer::Engine(Reply::Consumed(Err(e))) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("consume answered {other:?}"),
        }
    }

    /// The queue's gauges and counters; after close, the counters as they were then with
    /// every gauge at zero.
    pub fn stats(&self) -> QueueStats {
        if !self.inner.cell.is_closed() {
            if let Outcome::Reply(Reply::Stats(Some(stats))) = self.request(Command::Stats {
                queue: self.inner.key,
            }) {
                return *stats;
            }
        }
        match self.inner.cell.frozen() {
            Some(stats) if self.inner.cell.is_closed() => stats.frozen(),
            Some(stats) => stats.clone(),
            None => QueueStats::default(),
        }
    }

    /// Closes the queue: drops its consumers, leases and messages. `true` the first time.
    pub fn close(&self) -> bool {
        if self.inner.cell.is_closed() {
            return false;
        }
        matches!(
            self.request(Command::Close {
                queue: self.inner.key
            }),
            Outcome::Reply(Reply::Closed(Some(_)))
        )
    }

    pub fn is_closed(&self) -> bool {
        self.inner.cell.is_closed()
    }
}

fn put_result(outcome: Outcome) -> Result<PutOutcome, Error> {
    match outcome {
        Outcome::Reply(Reply::Put(result)) => result,
        Outcome::ShutDown => Err(Error::ShutDown),
        Outcome::Reply(other) => unreachable!("put answered {other:?}"),
    }
}

fn put_batch_result(outcome: Outcome) -> Result<Vec<PutOutcome>, Error> {
    match outcome {
        Outcome::Reply(Reply::PutBatch(result)) => result,
        Outcome::ShutDown => Err(Error::ShutDown),
        Outcome::Reply(other) => unreachable!("put_batch answered {other:?}"),
    }
}

fn settled(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Reply(Reply::Settled(true)))
}

fn settled_batch(outcome: Outcome, n: usize) -> Vec<bool> {
    match outcome {
        Outcome::Reply(Reply::SettledBatch(results)) => results,
        _ => vec![false; n],
    }
}
