//! What handles and shard threads say to each other: the requests in a shard's inbox,
//! the answers that come back and where they go, and what a queue's handles and a
//! consumer's channel share with the shard that owns them.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, SendError, Sender, TrySendError};
use leasemq_engine::{
    Command, ConsumeOptions, ConsumerConfig, ConsumerKey, Delivered, DeliveryTag, Error,
    QueueConfig, QueueKey, QueueStats, Reply,
};
use tokio::sync::oneshot;

use crate::route::Hop;
use crate::turns::Lender;
use crate::wait::{Bell, Sleeper, YieldBudget};

/// The capacity of each shard's inbox.
pub(crate) const INBOX_CAPACITY: usize = 8192;

/// The sending side of a shard's inbox: a bounded channel, and the shard thread to wake
/// when it parked waiting for requests.
#[derive(Clone, Debug)]
pub(crate) struct Inbox {
    tx: Sender<Request>,
    shard: Arc<Sleeper>,
    /// The same channel's receiving end and a flag the shard thread sets when it stops
    /// reading: a request sent after that is dropped by its sender (answering `ShutDown`),
    /// so that no caller waits for a thread that is gone.
    rx: Receiver<Request>,
    stopped: Arc<AtomicBool>,
    /// How long a thread waiting on this shard may yield its core before it parks.
    yields: YieldBudget,
    /// The shard's turns, which a blocking caller may run itself while the thread sleeps.
    turns: Arc<dyn Lender>,
}

impl Inbox {
    /// A shard's inbox: its senders' end and the receiver its thread reads, with the
    /// sleeper that thread binds when it starts, and how long waits on it may yield.
    pub fn new(
        yields: YieldBudget,
        turns: Arc<dyn Lender>,
    ) -> (Inbox, Receiver<Request>, Arc<Sleeper>) {
        let (tx, rx) = crossbeam_channel::bounded(INBOX_CAPACITY);
        let shard = Arc::new(Sleeper::default());
        (
            Inbox {
                tx,
                shard: shard.clone(),
                rx: rx.clone(),
                stopped: Arc::new(AtomicBool::new(false)),
                yields,
                turns,
            },
            rx,
            shard,
        )
    }

    /// How long a thread that waits on this shard (for an answer, a delivery, or as the
    /// shard itself for requests) may yield its core before it parks.
    pub fn yields(&self) -> YieldBudget {
        self.yields
    }

    /// Sends, waiting while the inbox is full. The sending thread is one of the broker's
    /// participants from then on (see `host.rs`): its CPU time is no foreign load.
    pub fn send(&self, req: Request) -> Result<(), SendError<Request>> {
        crate::host::participate();
        self.tx.send(req)?;
        self.shard.wake();
        self.drop_if_stopped();
        Ok(())
    }

    /// Sends for a caller that waits for the answer next: where the shard thread sleeps
    /// and lends its turns, the caller runs the turn on its own thread (see `turns.rs`),
    /// and the answer is there when this returns. Else as [`send`](Self::send).
    pub fn send_and_run(&self, req: Request) -> Result<(), SendError<Request>> {
        crate::host::participate();
        self.tx.send(req)?;
        self.turns.run_or_wake(&self.shard);
        self.drop_if_stopped();
        Ok(())
    }

    /// The shard's turns, as its senders see them.
    pub fn turns(&self) -> &dyn Lender {
        &*self.turns
    }

    /// Sends if there is room; the sender participates as in [`send`](Self::send).
    pub fn try_send(&self, req: Request) -> Result<(), TrySendError<Request>> {
        crate::host::participate();
        self.tx.try_send(req)?;
        self.shard.wake();
        self.drop_if_stopped();
        Ok(())
    }

    /// Called by the shard thread when it stops reading for good: drops what is queued,
    /// and from then on each sender drops what it sends. The flag is set before the last
    /// drain and read by a sender after its send (each behind a full fence), so a request
    /// is seen by one of the two.
    pub fn close(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        while let Ok(req) = self.rx.try_recv() {
            drop(req);
        }
    }

    /// A send to a stopped shard: drop what the channel holds (ours included), answering
    /// `ShutDown`. (`wake` put a full fence between the send and this load.)
    fn drop_if_stopped(&self) {
        if self.stopped.load(Ordering::SeqCst) {
            while let Ok(req) = self.rx.try_recv() {
                drop(req);
            }
        }
    }
}

/// The key that names durable queue `number` in a cluster, whatever engine leads its
/// shard: a generation no engine gives out, and the number as the slot. A cluster's
/// handles name their queues so, and its shard threads find the engine's key by number.
pub(crate) fn numbered_key(number: u32) -> QueueKey {
    QueueKey::from_bits((u64::from(u32::MAX) << 32) | u64::from(number))
}

/// The durable number a [`numbered_key`] names.
pub(crate) fn number_of(key: QueueKey) -> Option<u32> {
    let bits = key.to_bits();
    (bits >> 32 == u64::from(u32::MAX)).then_some(bits as u32)
}

/// What every handle of one queue shares: set by the shard when the queue closes.
#[derive(Debug, Default)]
pub struct QueueCell {
    closed: AtomicBool,
    /// The queue's durable number (contract §7), the same in every engine that restores
    /// its log; `None` for a queue that is not durable.
    number: Option<u32>,
    frozen: OnceLock<QueueStats>,
    /// The config the queue was declared with.
    config: QueueConfig,
}

impl QueueCell {
    /// The cell of a new handle's queue.
    pub(crate) fn new(config: QueueConfig, number: Option<u32>) -> QueueCell {
        QueueCell {
            config,
            number,
            ..QueueCell::default()
        }
    }

    /// The queue's durable number, if it is durable.
    pub(crate) fn number(&self) -> Option<u32> {
        self.number
    }

    pub(crate) fn is_durable(&self) -> bool {
        self.config.durable
    }

    pub(crate) fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The stats frozen at close (or at shutdown).
    pub(crate) fn frozen(&self) -> Option<&QueueStats> {
        self.frozen.get()
    }

    /// Keeps the stats a stopped shard can no longer answer for.
    pub(crate) fn freeze(&self, stats: QueueStats) {
        let _ = self.frozen.set(stats);
    }

    /// Marks the queue closed, with its counters as they were at close.
    pub(crate) fn close(&self, stats: QueueStats) {
        self.freeze(stats);
        self.closed.store(true, Ordering::Release);
    }
}

/// Whoever may wait on a consumer's channel: an async reader's waker, and threads blocked
/// in `recv`.
#[derive(Debug, Default)]
pub(crate) struct Readers {
    pub task: AtomicWaker,
    pub threads: Bell,
    /// Set before the channel closes when the consumer ended because its shard's leader
    /// stood down (contract §9 R3).
    pub unavailable: AtomicBool,
}

impl Readers {
    pub fn wake(&self) {
        self.task.wake();
        self.threads.ring();
    }
}

/// Wakes the readers when dropped: the last field of a [`Sink`], so it runs after the
/// channel's sender is gone and a woken reader sees the disconnect. This covers every way
/// a sink ends, a shard thread unwinding from a panic included.
pub(crate) struct WakeOnDrop(pub Arc<Readers>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.wake();
    }
}

/// The shard's end of a consumer: its channel and whoever waits on it.
pub(crate) struct Sink {
    pub tx: Sender<Delivered>,
    /// The same channel's receiving end, to drop deliveries that ended unread.
    pub rx: Receiver<Delivered>,
    pub prefetch: usize,
    /// Declared last, so dropped last (see [`WakeOnDrop`]).
    pub readers: WakeOnDrop,
}

/// An answer held back until the dead letters its command caused have landed.
pub(crate) struct Deferred {
    pub reply: ReplyTo,
    pub answer: Answer,
    /// The answer is about a durable queue: should its log fail before the answer leaves,
    /// the answer becomes a refusal (see `store.rs`).
    pub durable: bool,
}

impl Deferred {
    /// An answer about a queue that is not durable.
    pub fn plain(reply: ReplyTo, answer: Answer) -> Deferred {
        Deferred {
            reply,
            answer,
            durable: false,
        }
    }

    /// A put to a durable queue: even one that logged nothing (every message a duplicate)
    /// answers only after what the log holds, since what it duplicates may not be on disk
    /// yet.
    pub fn is_durable_put(&self) -> bool {
        self.durable
            && matches!(
                self.answer,
                Answer::Engine(Reply::Put(_) | Reply::PutBatch(_))
            )
    }

    /// Sends the answer; `failed` is the error of a log that failed before it left.
    pub fn send(self, failed: Option<&Error>) {
        let answer = match failed {
            Some(e) if self.durable => refused(self.answer, e),
            _ => self.answer,
        };
        self.reply.send(answer);
    }
}

/// What an answer about a durable queue becomes when the change it reports never reached
/// the disk: a put or declare fails with the storage error, a settle did not happen, a
/// close did not (a restart brings the queue back).
pub(crate) fn refused(answer: Answer, e: &Error) -> Answer {
    match answer {
        Answer::Engine(reply) => Answer::Engine(match reply {
            Reply::Closed(Some(_)) => Reply::Closed(None),
            Reply::Put(Ok(_)) => Reply::Put(Err(e.clone())),
            Reply::PutBatch(Ok(_)) => Reply::PutBatch(Err(e.clone())),
            Reply::Settled(_) => Reply::Settled(false),
            Reply::SettledBatch(results) => Reply::SettledBatch(vec![false; results.len()]),
            Reply::Count(_) => Reply::Count(0),
            Reply::Purged(Ok(_)) => Reply::Purged(Err(e.clone())),
            Reply::Declared(Ok(_)) => Reply::Declared(Err(e.clone())),
            other => other,
        }),
        Answer::Queue(Ok(_)) => Answer::Queue(Err(e.clone())),
        other => other,
    }
}

/// One message in a shard's inbox.
pub(crate) enum Request {
    /// A command answered with the engine's reply.
    Engine {
        cmd: Command,
        reply: ReplyTo,
    },
    /// Declare or look up a queue: answered with the queue and its shared cell.
    Declare {
        cmd: Command,
        reply: ReplyTo,
    },
    Consume {
        queue: QueueKey,
        /// Boxed, as consumes are rare: every inbox slot is the size of the largest request.
        name: Box<str>,
        config: ConsumerConfig,
        /// Boxed too: its lease makes it wider than the other requests.
        options: Box<ConsumeOptions>,
        sink: Sink,
        reply: ReplyTo,
    },
    /// A consumer ends; `rx` is its channel, whose unread deliveries are released. With a
    /// `reply`, answered `Done` once the dead letters it caused have landed.
    Cancel {
        consumer: ConsumerKey,
        rx: Receiver<Delivered>,
        /// Unread deliveries the channel no longer holds, before those it holds: a remote
        /// consumer's (`remote.rs`).
        unread: Vec<DeliveryTag>,
        reply: Option<ReplyTo>,
    },
    /// A consumer stops taking deliveries and keeps its leases; its channel's unread
    /// deliveries are released and the channel is closed. Answered `Done`.
    Stop {
        consumer: ConsumerKey,
        rx: Receiver<Delivered>,
        /// As `Cancel`'s.
        unread: Vec<DeliveryTag>,
        reply: ReplyTo,
    },
    /// Manual clock: fire every timer due by `nanos` since the epoch.
    Advance {
        nanos: u64,
        reply: ReplyTo,
    },
    /// Manual clock: answer once everything sent here before it is handled.
    Barrier {
        reply: ReplyTo,
    },
    /// The names of the shard's live queues: answered `Names`.
    Names {
        reply: ReplyTo,
    },
    /// The names and stats of the shard's live queues: answered `Stats`.
    Stats {
        reply: ReplyTo,
    },
    /// Dead letters or outcomes from another shard (boxed: rare, and large).
    Hop(Box<Hop<Deferred>>),
    Shutdown,
}

/// What a shard answers: the engine's reply, or what the runtime made of it.
#[derive(Debug)]
pub(crate) enum Answer {
    Engine(Reply),
    /// A declare or lookup: the queue and the cell its handles share.
    Queue(Result<Option<(QueueKey, Arc<QueueCell>)>, Error>),
    /// An advance or barrier step: how many messages this shard sent to other shards since
    /// the last step, which the broker needs to know when every dead letter has landed.
    Step {
        cross_sent: u64,
    },
    /// Done, nothing to say.
    Done,
    /// The names of a shard's live queues.
    Names(Vec<String>),
    /// The names and stats of a shard's live queues.
    Stats(Vec<(String, QueueStats)>),
    /// The shard stopped before answering.
    ShutDown,
    /// In a cluster: this node does not lead the shard, and the request did not run; the
    /// node that leads it, if known.
    NotLeader(Option<u64>),
    /// In a cluster: the request failed on its way to the leader, and may have run there.
    Failed(Error),
}

enum Target {
    /// A blocking caller's slot, and the caller to wake once the answer is in it.
    Slot(Sender<Answer>, Arc<Sleeper>),
    /// A channel read by a plain blocking `recv`.
    Sync(Sender<Answer>),
    Async(oneshot::Sender<Answer>),
    /// A call another node forwarded here (`forward.rs`): a `NotLeader` answer goes back
    /// to it, where a call made on this node is taken to the leader by the shard thread.
    Peer(oneshot::Sender<Answer>),
}

/// Where an answer goes. Dropping one unanswered (a shard stopping with requests still in
/// its inbox) answers `ShutDown`, so no caller waits forever.
pub(crate) struct ReplyTo(Option<Target>);

impl Target {
    fn send(self, answer: Answer) {
        match self {
            // The slot holds one answer and its owner waits for exactly one: never full.
            Target::Slot(tx, caller) => {
                drop(tx.try_send(answer));
                caller.wake();
            }
            Target::Sync(tx) => drop(tx.try_send(answer)),
            Target::Async(tx) | Target::Peer(tx) => drop(tx.send(answer)),
        }
    }
}

impl ReplyTo {
    /// An answer for a blocking caller's slot, waking `caller` once it is there.
    pub fn slot(tx: Sender<Answer>, caller: Arc<Sleeper>) -> ReplyTo {
        ReplyTo(Some(Target::Slot(tx, caller)))
    }

    /// An answer for a channel read by a plain blocking `recv`.
    pub fn channel(tx: Sender<Answer>) -> ReplyTo {
        ReplyTo(Some(Target::Sync(tx)))
    }

    /// An answer for an async caller.
    pub fn oneshot(tx: oneshot::Sender<Answer>) -> ReplyTo {
        ReplyTo(Some(Target::Async(tx)))
    }

    /// No one: the answer is dropped (a `nowait` request).
    pub fn nobody() -> ReplyTo {
        ReplyTo(None)
    }

    /// An answer for a call another node forwarded here.
    pub fn peer(tx: oneshot::Sender<Answer>) -> ReplyTo {
        ReplyTo(Some(Target::Peer(tx)))
    }

    /// Whether the call came from another node.
    pub fn is_from_peer(&self) -> bool {
        matches!(self.0, Some(Target::Peer(_)))
    }

    pub fn send(mut self, answer: Answer) {
        if let Some(target) = self.0.take() {
            target.send(answer);
        }
    }
}

impl Drop for ReplyTo {
    fn drop(&mut self) {
        if let Some(target) = self.0.take() {
            target.send(Answer::ShutDown);
        }
    }
}

impl std::fmt::Debug for ReplyTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyTo")
    }
}
