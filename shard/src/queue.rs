//! The queue handle: puts, settles, consumers, stats and close, each one request to the
//! shard that owns the queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use leasemq_engine::{
    Command, DeliveryTag, Error, Message, PutOutcome, QueueConfig, QueueKey, QueueStats, Reply,
    Settle,
};
use tokio::sync::oneshot;

use crate::cluster::ClusterInner;
use crate::forward::Call;
use crate::inner::BrokerInner;
use crate::protocol::{Answer, QueueCell, ReplyTo, Request};
use crate::reply::{call, call_async, call_parked};

/// A handle to one queue. Cheap to clone, `Send + Sync`; every clone reaches the same queue,
/// and none reaches a later queue of the same name once this one is closed.
///
/// Each call is one round trip to the thread of the queue's shard, and a barrier for its own
/// effects: when it returns, every delivery it caused is in its consumer's channel (contract
/// §4 Barriers). A settle (`ack`, `nack`, `nack_with_delay`, `reject`, `release`, `touch`)
/// returns `false` for a stale tag and then changes nothing but the `stale` counter
/// (contract §2 G2); it also returns `false`, counting nothing, on a closed queue and after
/// shutdown. The `_async` forms do the same without blocking a tokio worker thread.
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

    /// The queue's name.
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

    /// Whether the queue is durable: its messages survive a restart (contract §7).
    pub fn is_durable(&self) -> bool {
        self.inner.cell.is_durable()
    }

    /// The config the queue was declared with.
    pub fn config(&self) -> &QueueConfig {
        self.inner.cell.config()
    }

    pub(crate) fn cell(&self) -> &QueueCell {
        &self.inner.cell
    }

    /// The queue's key in its shard's engine; in a cluster, the key that names it by its
    /// durable number, whichever engine leads the shard (`protocol::numbered_key`).
    pub(crate) fn key(&self) -> QueueKey {
        self.inner.key
    }

    /// In a cluster, `cmd` as a call for the shard's leader; `Err` gives `cmd` back on a
    /// single broker.
    fn cluster_call(&self, cmd: Command) -> Result<(&Arc<ClusterInner>, Call), Command> {
        match self.inner.broker.cluster.as_ref() {
            Some(cluster) => Ok((cluster, Call::Engine { cmd })),
            None => Err(cmd),
        }
    }

    fn request(&self, cmd: Command) -> Outcome {
        if self.inner.broker.is_shut_down() {
            return Outcome::ShutDown;
        }
        let inbox = self.inner.broker.inbox(self.inner.shard);
        let cmd = match self.cluster_call(cmd) {
            Ok((cluster, call)) => return outcome(cluster.call(inbox, self.inner.shard, call)),
            Err(cmd) => cmd,
        };
        let request = |reply| Request::Engine { cmd, reply };
        // A durable queue answers after an fsync: no point spinning for it.
        let answer = if self.inner.cell.is_durable() {
            call_parked(inbox, request)
        } else {
            call(inbox, request)
        };
        outcome(answer)
    }

    async fn request_async(&self, cmd: Command) -> Outcome {
        if self.inner.broker.is_shut_down() {
            return Outcome::ShutDown;
        }
        let inbox = self.inner.broker.inbox(self.inner.shard);
        let cmd = match self.cluster_call(cmd) {
            Ok((cluster, call)) => {
                let call = Arc::clone(cluster).call_async(inbox.clone(), self.inner.shard, call);
                return outcome(call.await);
            }
            Err(cmd) => cmd,
        };
        outcome(call_async(inbox, |reply: ReplyTo| Request::Engine { cmd, reply }).await)
    }

    // ----- put -----------------------------------------------------------------------------

    /// Puts a message (contract §3 `put`): `Enqueued`, or `Duplicate` when its id is taken in
    /// the queue (contract §3 Deduplication). When it returns, any delivery it caused is in its
    /// consumer's channel.
    ///
    /// # Errors
    ///
    /// Checked in this order; a put that fails changes nothing:
    ///
    /// - [`Error::ShutDown`] after the broker's shutdown;
    /// - [`Error::QueueClosed`] once the queue is closed;
    /// - [`Error::InvalidMessage`] for an id that is empty or over 1 024 bytes, then for a delay
    ///   over 7 days;
    /// - [`Error::MessageTooLarge`] for a body over the queue's `max_body_bytes`;
    /// - (a taken id is then `Ok(PutOutcome::Duplicate)`;)
    /// - [`Error::QueueFull`] when the queue holds `max_length` live messages already.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, PutOutcome, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let resize = || Message::new("resize photo 17").with_id("photo-17");
    /// assert_eq!(jobs.put(resize())?, PutOutcome::Enqueued);
    /// assert_eq!(jobs.put(resize())?, PutOutcome::Duplicate); // the id is live
    ///
    /// let worker = jobs.consume("worker", ConsumerConfig::default())?;
    /// let job = worker.try_recv()?.expect("consume hands out what is ready");
    /// assert_eq!(job.envelope().id, "photo-17");
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn put(&self, message: Message) -> Result<PutOutcome, Error> {
        let cmd = Command::Put {
            queue: self.key(),
            message,
        };
        put_result(self.request(cmd))
    }

    /// Puts many messages, in order, in one round trip (contract §3 `put_batch`): one outcome
    /// per message; an id repeated in the batch is a duplicate the second time.
    ///
    /// # Errors
    ///
    /// Atomic for errors: the messages are checked in order, each as [`put`](Queue::put) checks
    /// it, and if any would fail none is enqueued and the first failure is returned:
    /// [`Error::ShutDown`], [`Error::QueueClosed`], [`Error::InvalidMessage`],
    /// [`Error::MessageTooLarge`], or [`Error::QueueFull`] when the messages that would be
    /// enqueued do not fit under `max_length`.
    pub fn put_batch(&self, messages: Vec<Message>) -> Result<Vec<PutOutcome>, Error> {
        let cmd = Command::PutBatch {
            queue: self.key(),
            messages,
        };
        put_batch_result(self.request(cmd))
    }

    /// [`put_batch`](Queue::put_batch) without waiting for the outcomes (an AMQP publish
    /// without confirms), for a caller that has no use for them. The messages are put in
    /// order, each as `put_batch` puts it, before any later call of this caller to this
    /// queue is answered. Nobody hears what becomes of them: a batch that `put_batch` would
    /// refuse whole (a full queue, a closed one, an invalid or oversized message) is dropped,
    /// and a durable queue's messages are on disk after its next fsync, which nothing waits
    /// for. A caller that must not lose a message silently checks what it can first, or
    /// calls `put_batch`. Blocks only while the shard's inbox is full.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let events = broker.declare_queue("events", QueueConfig::default())?;
    /// events.put_batch_nowait(vec![Message::new("a"), Message::new("b")]);
    /// // Put before this call is answered.
    /// assert_eq!(events.stats().ready, 2);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn put_batch_nowait(&self, messages: Vec<Message>) {
        if messages.is_empty() || self.inner.cell.is_closed() || self.inner.broker.is_shut_down() {
            return;
        }
        // A shard that stopped refuses it; there is no one to tell.
        self.send_put_batch(messages, ReplyTo::nobody());
    }

    /// Sends [`put_batch`](Queue::put_batch) now and hands back its answer to come: for a
    /// caller that goes on with other work meanwhile, such as a server that confirms a
    /// publish once it is put (on a durable queue, once it is on disk) but keeps reading.
    /// The batch is on its way to the shard when this returns, so it is put before any
    /// later call of this caller to this queue is answered, as a blocking call would be;
    /// dropping the [`PendingPutBatch`] drops only the answer. Blocks only while the
    /// shard's inbox is full.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, Message, PutOutcome, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let mut pending = jobs.begin_put_batch(vec![Message::new("a").with_id("a")]);
    /// assert_eq!(jobs.stats().enqueued, 1); // put before this later call is answered
    /// let answer = pending.try_answer().expect("answered before stats was");
    /// assert_eq!(answer?, vec![PutOutcome::Enqueued]);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn begin_put_batch(&self, messages: Vec<Message>) -> PendingPutBatch {
        if self.inner.broker.is_shut_down() {
            return PendingPutBatch::answered(Err(Error::ShutDown));
        }
        let (tx, rx) = oneshot::channel();
        // A request a stopped shard refuses is dropped with its sender: ShutDown.
        self.send_put_batch(messages, ReplyTo::oneshot(tx));
        PendingPutBatch(Pending::Waiting(rx))
    }

    /// Sends a put batch answered to `reply`, blocking only while the inbox is full; one
    /// that a stopped shard refuses is dropped, and `reply` with it.
    fn send_put_batch(&self, messages: Vec<Message>, reply: ReplyTo) {
        let cmd = Command::PutBatch {
            queue: self.key(),
            messages,
        };
        let inbox = self.inner.broker.inbox(self.inner.shard);
        let cmd = match self.cluster_call(cmd) {
            Ok((cluster, call)) => return cluster.send(inbox, self.inner.shard, call, reply),
            Err(cmd) => cmd,
        };
        drop(inbox.send(Request::Engine { cmd, reply }));
    }

    /// [`put`](Queue::put) without blocking: for a tokio task.
    ///
    /// # Errors
    ///
    /// As [`put`](Queue::put).
    pub async fn put_async(&self, message: Message) -> Result<PutOutcome, Error> {
        let cmd = Command::Put {
            queue: self.key(),
            message,
        };
        put_result(self.request_async(cmd).await)
    }

    /// [`put_batch`](Queue::put_batch) without blocking: for a tokio task.
    ///
    /// # Errors
    ///
    /// As [`put_batch`](Queue::put_batch).
    pub async fn put_batch_async(&self, messages: Vec<Message>) -> Result<Vec<PutOutcome>, Error> {
        let cmd = Command::PutBatch {
            queue: self.key(),
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
            queue: self.key(),
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
            queue: self.key(),
            tag,
            op,
        };
        settled(self.request_async(cmd).await)
    }

    /// Finishes a delivery: the message is gone, and the consumer's credit is back (contract §3
    /// `ack`). `false` if the tag is stale: never issued, settled already, or its lease ended.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let worker = jobs.consume("worker", ConsumerConfig::default())?;
    /// jobs.put(Message::new("send invoice 4"))?;
    ///
    /// let job = worker.try_recv()?.unwrap();
    /// assert!(jobs.ack(job.tag())); // done: the message is gone for good
    /// assert!(!jobs.ack(job.tag())); // a second ack is stale and changes nothing
    /// assert_eq!((jobs.stats().acked, jobs.stats().stale), (1, 1));
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn ack(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Ack)
    }

    /// Gives the message back to be retried after the queue's retry delay for this delivery's
    /// attempt (contract §3 `nack`); with [`QueueConfig::max_deliveries`] reached it is
    /// dead-lettered instead. `false` if the tag is stale.
    ///
    /// [`QueueConfig::max_deliveries`]: leasemq_engine::QueueConfig::max_deliveries
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use std::time::Duration;
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig, RetryPolicy};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let retry = RetryPolicy { initial: Duration::from_secs(1), ..RetryPolicy::default() };
    /// let jobs = broker.declare_queue("jobs", QueueConfig { retry, ..QueueConfig::default() })?;
    /// let worker = jobs.consume("worker", ConsumerConfig::default())?;
    /// jobs.put(Message::new("call the flaky API"))?;
    ///
    /// let first = worker.try_recv()?.unwrap();
    /// assert!(jobs.nack(first.tag())); // failed: try again in a second
    /// assert!(worker.try_recv()?.is_none());
    /// broker.advance(Duration::from_secs(1))?;
    /// let second = worker.try_recv()?.expect("retried after the delay");
    /// assert_eq!(second.envelope().attempt, 2);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn nack(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Nack)
    }

    /// Gives the message back to be retried after `delay` instead of the retry policy's (zero:
    /// at once; contract §3 `nack_with_delay`). `false` if the tag is stale, and `false` without
    /// counting it stale for a delay over 7 days.
    pub fn nack_with_delay(&self, tag: DeliveryTag, delay: Duration) -> bool {
        self.settle(tag, Settle::NackWithDelay(delay))
    }

    /// Dead-letters the message now, with reason `Rejected`; it is never retried (contract §3
    /// `reject`, §3 Dead-lettering). Returns once the letter has landed in the dead-letter queue
    /// or been dropped. `false` if the tag is stale.
    pub fn reject(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Reject)
    }

    /// Hands the message back unseen: to the front of the queue, costing no attempt (contract §3
    /// `release`). `false` if the tag is stale.
    pub fn release(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Release)
    }

    /// Restarts the lease clock: the new deadline is now + `ack_timeout` (contract §3 `touch`).
    /// `false` if the tag is stale, and `false` without counting it stale when the lease would
    /// then outlast `max_lease` from its delivery.
    pub fn touch(&self, tag: DeliveryTag) -> bool {
        self.settle(tag, Settle::Touch)
    }

    /// Applies many settles, in order, in one round trip; one result per entry, each what the
    /// single call would return (contract §3 `settle_batch`).
    pub fn settle_batch(&self, settles: &[(DeliveryTag, Settle)]) -> Vec<bool> {
        if self.inner.cell.is_closed() {
            return vec![false; settles.len()];
        }
        let cmd = Command::SettleBatch {
            queue: self.key(),
            settles: settles.to_vec(),
        };
        settled_batch(self.request(cmd), settles.len())
    }

    /// [`settle_batch`](Queue::settle_batch) without waiting for the answers (AMQP's
    /// `nowait`), for a caller that has no use for them, such as a protocol whose acks are
    /// not answered. The settles are applied in order, before any later
    /// call of this caller to this queue is answered; a stale tag is counted stale as ever.
    /// What they cause on another shard (a dead letter) may land after such a later call,
    /// and a durable queue's settles are on disk after its next fsync, which nobody waits
    /// for. Blocks only while the shard's inbox is full.
    pub fn settle_batch_nowait(&self, settles: &[(DeliveryTag, Settle)]) {
        if settles.is_empty() || self.inner.cell.is_closed() || self.inner.broker.is_shut_down() {
            return;
        }
        let cmd = Command::SettleBatch {
            queue: self.key(),
            settles: settles.to_vec(),
        };
        let inbox = self.inner.broker.inbox(self.inner.shard);
        let cmd = match self.cluster_call(cmd) {
            Ok((cluster, call)) => {
                return cluster.send(inbox, self.inner.shard, call, ReplyTo::nobody())
            }
            Err(cmd) => cmd,
        };
        // A shard that stopped refuses it; there is no one to tell.
        drop(inbox.send(Request::Engine {
            cmd,
            reply: ReplyTo::nobody(),
        }));
    }

    /// [`ack`](Queue::ack) without blocking: for a tokio task.
    pub async fn ack_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Ack).await
    }

    /// [`nack`](Queue::nack) without blocking: for a tokio task.
    pub async fn nack_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Nack).await
    }

    /// [`nack_with_delay`](Queue::nack_with_delay) without blocking: for a tokio task.
    pub async fn nack_with_delay_async(&self, tag: DeliveryTag, delay: Duration) -> bool {
        self.settle_async(tag, Settle::NackWithDelay(delay)).await
    }

    /// [`reject`](Queue::reject) without blocking: for a tokio task.
    pub async fn reject_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Reject).await
    }

    /// [`release`](Queue::release) without blocking: for a tokio task.
    pub async fn release_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Release).await
    }

    /// [`touch`](Queue::touch) without blocking: for a tokio task.
    pub async fn touch_async(&self, tag: DeliveryTag) -> bool {
        self.settle_async(tag, Settle::Touch).await
    }

    /// [`settle_batch`](Queue::settle_batch) without blocking: for a tokio task.
    pub async fn settle_batch_async(&self, settles: &[(DeliveryTag, Settle)]) -> Vec<bool> {
        if self.inner.cell.is_closed() {
            return vec![false; settles.len()];
        }
        let cmd = Command::SettleBatch {
            queue: self.key(),
            settles: settles.to_vec(),
        };
        settled_batch(self.request_async(cmd).await, settles.len())
    }

    // ----- stats, close (consumers: `consumer.rs`) -----------------------------------------

    /// The queue's gauges and counters (contract §3 `stats`); after close, the counters as they
    /// were then with every gauge at zero; after the broker's shutdown, everything as it was
    /// when its shard stopped.
    pub fn stats(&self) -> QueueStats {
        if !self.inner.cell.is_closed() {
            if let Outcome::Reply(Reply::Stats(Some(stats))) =
                self.request(Command::Stats { queue: self.key() })
            {
                return *stats;
            }
        }
        match self.inner.cell.frozen() {
            Some(stats) if self.inner.cell.is_closed() => stats.frozen(),
            Some(stats) => stats.clone(),
            None => QueueStats::default(),
        }
    }

    /// Removes every message the queue holds and is not lending out (ready and delayed
    /// ones), as AMQP's `queue.purge` does, and returns how many. Leased messages stay
    /// with their consumers; the dedup window of each id removed stays open. On a durable
    /// queue the answer comes once the removal is on disk.
    ///
    /// # Errors
    ///
    /// [`Error::QueueClosed`] on a closed queue, [`Error::ShutDown`] after the broker's
    /// shutdown, [`Error::Storage`] when a durable queue's log failed or has no room.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// jobs.put_batch((0..5).map(|i| Message::new(format!("job {i}"))).collect())?;
    /// let worker = jobs.consume("worker", ConsumerConfig { prefetch: 2 })?;
    /// assert_eq!(jobs.purge()?, 3); // the two leased to the worker stay
    /// assert_eq!(jobs.stats().leased, 2);
    /// # drop(worker);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn purge(&self) -> Result<usize, Error> {
        if self.inner.cell.is_closed() {
            return Err(Error::QueueClosed);
        }
        match self.request(Command::Purge { queue: self.key() }) {
            Outcome::Reply(Reply::Purged(result)) => result,
            Outcome::ShutDown => Err(Error::ShutDown),
            Outcome::Reply(other) => unreachable!("purge answered {other:?}"),
        }
    }

    /// [`purge`](Queue::purge) without blocking: for a tokio task (or any caller that polls
    /// a future), which a durable queue's purge would otherwise hold until its fsync.
    ///
    /// # Errors
    ///
    /// As [`purge`](Queue::purge).
    pub async fn purge_async(&self) -> Result<usize, Error> {
        if self.inner.cell.is_closed() {
            return Err(Error::QueueClosed);
        }
        let cmd = Command::Purge { queue: self.key() };
        match self.request_async(cmd).await {
            Outcome::Reply(Reply::Purged(result)) => result,
            Outcome::ShutDown => Err(Error::ShutDown),
            Outcome::Reply(other) => unreachable!("purge answered {other:?}"),
        }
    }

    /// Closes the queue: drops its consumers, leases and messages, requeuing and dead-lettering
    /// nothing (contract §3 `close`). `true` the first time, through any handle; `false` after,
    /// and after the broker's shutdown. The name can then be declared again. A durable queue
    /// whose log fails (or whose disk is full) before the close is on disk gives `false`,
    /// and a restart has the queue (contract §7).
    pub fn close(&self) -> bool {
        if self.inner.cell.is_closed() {
            return false;
        }
        let closed = matches!(
            self.request(Command::Close { queue: self.key() }),
            Outcome::Reply(Reply::Closed(Some(_)))
        );
        if closed && self.is_durable() {
            let mut taken = self.inner.broker.durable_dead_letters.lock();
            let taken = taken.as_mut().unwrap_or_else(|e| e.get_mut());
            taken.remove(self.name());
        }
        closed
    }

    /// Whether the queue was closed, through this handle or another.
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

fn outcome(answer: Answer) -> Outcome {
    match answer {
        Answer::Engine(reply) => Outcome::Reply(reply),
        Answer::ShutDown => Outcome::ShutDown,
        other => unreachable!("a queue command answered {other:?}"),
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

/// The answer of a [`Queue::begin_put_batch`], once the shard gives it: what
/// [`Queue::put_batch`] would have returned. A future (for a tokio task), or looked at
/// without waiting with [`try_answer`](PendingPutBatch::try_answer).
#[must_use = "the batch is put either way; this is only its answer"]
pub struct PendingPutBatch(Pending);

enum Pending {
    Waiting(oneshot::Receiver<Answer>),
    Answered(Option<Result<Vec<PutOutcome>, Error>>),
}

impl std::fmt::Debug for PendingPutBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.0 {
            Pending::Waiting(_) => "waiting",
            Pending::Answered(Some(_)) => "answered",
            Pending::Answered(None) => "taken",
        };
        f.debug_tuple("PendingPutBatch").field(&state).finish()
    }
}

impl PendingPutBatch {
    fn answered(result: Result<Vec<PutOutcome>, Error>) -> PendingPutBatch {
        PendingPutBatch(Pending::Answered(Some(result)))
    }

    /// The answer if the shard has given it, without waiting; `None` while it has not (and
    /// after the answer was taken).
    pub fn try_answer(&mut self) -> Option<Result<Vec<PutOutcome>, Error>> {
        match &mut self.0 {
            Pending::Waiting(rx) => {
                let answer = match rx.try_recv() {
                    Ok(answer) => answer,
                    Err(oneshot::error::TryRecvError::Empty) => return None,
                    // The request was dropped unanswered: the shard stopped.
                    Err(oneshot::error::TryRecvError::Closed) => Answer::ShutDown,
                };
                self.0 = Pending::Answered(None);
                Some(put_batch_result(outcome(answer)))
            }
            Pending::Answered(result) => result.take(),
        }
    }
}

impl Future for PendingPutBatch {
    type Output = Result<Vec<PutOutcome>, Error>;

    /// Ready with the answer; polled again after that, it stays pending.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = match &mut self.0 {
            Pending::Waiting(rx) => match Pin::new(rx).poll(cx) {
                Poll::Ready(answer) => answer.unwrap_or(Answer::ShutDown),
                Poll::Pending => return Poll::Pending,
            },
            Pending::Answered(result) => return result.take().map_or(Poll::Pending, Poll::Ready),
        };
        self.0 = Pending::Answered(None);
        Poll::Ready(put_batch_result(outcome(answer)))
    }
}
