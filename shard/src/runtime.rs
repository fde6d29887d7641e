//! The shard thread: a thin loop around one engine [`Shard`].
//!
//! Each turn it waits for a request (or, under the system clock, the next deadline), drains
//! up to [`BATCH`] more without waiting, hands each to the engine, and flushes the effects:
//! deliveries into consumer channels first, then the answers, so that every call returns
//! only once the deliveries it caused are in their channels. Dead letters travel to the
//! shard that owns their dead-letter queue through its inbox, and the answer about each
//! travels back the same way; a call that caused dead letters is answered after that
//! round trip, so it is a barrier for them too. The loop never blocks on a send: consumer
//! channels are unbounded but filled only up to each consumer's prefetch, and a send to a
//! full inbox of another shard waits in a backlog.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, SendError, Sender, TryRecvError, TrySendError};
use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, DeadLetter, DeathOutcome, Delivered, Effects, QueueKey,
    QueueStats, Reply, Shard, Tick, TickLength,
};

use crate::reply::{Answer, ReplyTo};
use crate::router::shard_for;
use crate::wait::{Bell, Sleeper};

/// Requests handled per loop turn before effects are flushed.
pub(crate) const BATCH: usize = 256;
/// The capacity of each shard's inbox.
pub(crate) const INBOX_CAPACITY: usize = 8192;

/// The sending side of a shard's inbox: a bounded channel, and the shard thread to wake
/// when it parked waiting for requests.
#[derive(Clone, Debug)]
pub(crate) struct Inbox {
    tx: Sender<Request>,
    shard: Arc<Sleeper>,
}

impl Inbox {
    /// A shard's inbox: its senders' end and the receiver its thread reads, with the
    /// sleeper that thread binds when it starts.
    pub fn new() -> (Inbox, Receiver<Request>, Arc<Sleeper>) {
        let (tx, rx) = crossbeam_channel::bounded(INBOX_CAPACITY);
        let shard = Arc::new(Sleeper::default());
        (
            Inbox {
                tx,
                shard: shard.clone(),
            },
            rx,
            shard,
        )
    }

    /// Sends, waiting while the inbox is full.
    pub fn send(&self, req: Request) -> Result<(), SendError<Request>> {
        self.tx.send(req)?;
        self.shard.wake();
        Ok(())
    }

    /// Sends if there is room.
    pub fn try_send(&self, req: Request) -> Result<(), TrySendError<Request>> {
        self.tx.try_send(req)?;
        self.shard.wake();
        Ok(())
    }
}

/// What every handle of one queue shares: set by the shard when the queue closes.
#[derive(Debug, Default)]
pub struct QueueCell {
    closed: AtomicBool,
    frozen: OnceLock<QueueStats>,
}

impl QueueCell {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The stats frozen at close (or at shutdown).
    pub(crate) fn frozen(&self) -> Option<&QueueStats> {
        self.frozen.get()
    }

    /// Keeps the stats a stopped shard can no longer answer for.
    fn freeze(&self, stats: QueueStats) {
        let _ = self.frozen.set(stats);
    }

    /// Marks the queue closed, with its counters as they were at close.
    fn close(&self, stats: QueueStats) {
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
    reply: ReplyTo,
    answer: Answer,
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
        name: String,
        config: ConsumerConfig,
        sink: Sink,
        reply: ReplyTo,
    },
    /// A consumer ends; `rx` is its channel, whose unread deliveries are released. With a
    /// `reply`, answered `Done` once the dead letters it caused have landed.
    Cancel {
        consumer: ConsumerKey,
        rx: Receiver<Delivered>,
        reply: Option<ReplyTo>,
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
    /// Dead letters for queues of this shard, from another one.
    DeadLetters {
        at: Tick,
        letters: Vec<DeadLetter>,
        deferred: Option<Deferred>,
    },
    /// What another shard's dead-letter queues did with letters from here.
    Outcomes {
        at: Tick,
        outcomes: Vec<DeathOutcome>,
        deferred: Option<Deferred>,
    },
    Shutdown,
}

/// Where time comes from.
#[derive(Clone, Debug)]
pub(crate) enum TimeSource {
    System(Instant),
    /// Time moves only by `Advance` requests.
    Manual,
}

pub(crate) struct ShardThread {
    engine: Shard,
    index: usize,
    inbox: Receiver<Request>,
    /// This thread, as the senders to its inbox see it.
    sleeper: Arc<Sleeper>,
    peers: Vec<Inbox>,
    time: TimeSource,
    tick: TickLength,
    out: Effects,
    sinks: Vec<Option<Sink>>,
    cells: Vec<Option<(QueueKey, Arc<QueueCell>)>>,
    replies: Vec<(ReplyTo, Answer)>,
    backlog: VecDeque<(usize, Request)>,
    cross_sent: u64,
    /// The manual clock's time, as the last `Advance` (or dead letter) set it.
    manual_now: Tick,
    stopping: bool,
}

impl ShardThread {
    pub fn new(
        index: usize,
        inbox: Receiver<Request>,
        sleeper: Arc<Sleeper>,
        peers: Vec<Inbox>,
        time: TimeSource,
        tick: Duration,
    ) -> Self {
        let index16 = u16::try_from(index).expect("at most 65 536 shards");
        let engine = match time {
            TimeSource::System(_) => Shard::new(index16, tick).for_real_time(),
            TimeSource::Manual => Shard::new(index16, tick),
        };
        ShardThread {
            engine,
            index,
            inbox,
            sleeper,
            peers,
            time,
            tick: TickLength::new(tick),
            out: Effects::new(),
            sinks: Vec::new(),
            cells: Vec::new(),
            replies: Vec::new(),
            backlog: VecDeque::new(),
            cross_sent: 0,
            manual_now: 0,
            stopping: false,
        }
    }

    /// The shard's time now, never behind what the engine has seen.
    fn now(&self) -> Tick {
        let now = match &self.time {
            TimeSource::System(epoch) => {
                let nanos = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.tick.tick_of(nanos)
            }
            TimeSource::Manual => self.manual_now,
        };
        now.max(self.engine.now())
    }

    pub fn run(mut self) {
        self.sleeper.bind();
        while !self.stopping {
            let first = match self.wait() {
                Some(Ok(req)) => req,
                Some(Err(())) => break,
                None => continue,
            };
            self.process(first);
            for _ in 1..BATCH {
                if self.stopping {
                    break;
                }
                match self.inbox.try_recv() {
                    Ok(req) => self.process(req),
                    Err(_) => break,
                }
            }
            self.flush();
            self.retry_backlog();
        }
        self.stop();
    }

    /// Waits for the next request; under the system clock, fires due timers first and
    /// returns `None` when it woke for a deadline. `Some(Err)` when every sender is gone.
    fn wait(&mut self) -> Option<Result<Request, ()>> {
        let wake_at = match self.time {
            TimeSource::Manual => None,
            TimeSource::System(epoch) => {
                let now = self.now();
                self.engine.handle_timeout(now, &mut self.out);
                self.route_dead_letters(now, None);
                self.flush();
                // Wake when the deadline's tick begins in real time, not a whole number of
                // ticks from now: `now` is rounded down, and counting from it would add up
                // to a tick of lateness to every timer.
                self.engine.next_deadline().map(|deadline| {
                    let nanos = self.tick.start_of(deadline);
                    epoch
                        .checked_add(Duration::from_nanos(nanos))
                        .unwrap_or_else(far_future)
                })
            }
        };
        let wake_at = if self.backlog.is_empty() {
            wake_at
        } else {
            let retry = Instant::now() + Duration::from_micros(100);
            Some(wake_at.map_or(retry, |at| at.min(retry)))
        };
        let inbox = &self.inbox;
        let got = self.sleeper.wait(wake_at, || match inbox.try_recv() {
            Ok(req) => Some(Ok(req)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(())),
        });
        if got.is_none() {
            self.retry_backlog();
        }
        got
    }

    /// Handles one request at the time read now, after it left the inbox: the thread may
    /// have been off its core since its batch began, and a settle sent after a lease's
    /// deadline must meet the lease expired (the late ack is refused). `now()` is never
    /// behind the engine, which a dead letter from another shard may have moved on.
    fn process(&mut self, req: Request) {
        let now = self.now();
        match req {
            Request::Engine { cmd, reply } => {
                let closing = match &cmd {
                    Command::Close { queue } => Some(*queue),
                    _ => None,
                };
                self.engine.handle(now, cmd, &mut self.out);
                let answer = self.take_reply();
                if let (Some(key), Reply::Closed(Some(stats))) = (closing, &answer) {
                    self.on_closed(key, (**stats).clone());
                }
                // Answered now, or after the dead letters it caused have landed.
                let answer = Answer::Engine(answer);
                self.route_dead_letters(now, Some(Deferred { reply, answer }));
            }
            Request::Declare { cmd, reply } => {
                self.engine.handle(now, cmd, &mut self.out);
                let answer = match self.take_reply() {
                    Reply::Declared(result) => {
                        Answer::Queue(result.map(|key| Some(self.cell(key))))
                    }
                    Reply::Found(found) => Answer::Queue(Ok(found.map(|key| self.cell(key)))),
                    other => unreachable!("declare answered {other:?}"),
                };
                self.replies.push((reply, answer));
            }
            Request::Consume {
                queue,
                name,
                config,
                sink,
                reply,
            } => {
                // Deliveries still held here may name a consumer slot this one reuses.
                self.flush_deliveries();
                let cmd = Command::Consume {
                    queue,
                    name,
                    config,
                };
                self.engine.handle(now, cmd, &mut self.out);
                let reply_value = self.take_reply();
                if let Reply::Consumed(Ok(key)) = &reply_value {
                    if self.sinks.len() <= key.slot() {
                        self.sinks.resize_with(key.slot() + 1, || None);
                    }
                    self.sinks[key.slot()] = Some(sink);
                }
                self.replies.push((reply, Answer::Engine(reply_value)));
            }
            Request::Cancel {
                consumer,
                rx,
                reply,
            } => {
                // What this shard still holds for the consumer counts as unread too.
                self.flush_deliveries();
                let unread = rx.try_iter().map(|d| d.tag).collect();
                self.engine
                    .handle(now, Command::Cancel { consumer, unread }, &mut self.out);
                self.drop_gone_sinks();
                let deferred = reply.map(|reply| Deferred {
                    reply,
                    answer: Answer::Done,
                });
                self.route_dead_letters(now, deferred);
            }
            Request::Advance { nanos, reply } => {
                if let TimeSource::Manual = self.time {
                    self.manual_now = self.manual_now.max(self.tick.tick_of(nanos));
                }
                let now = self.now();
                self.engine.handle_timeout(now, &mut self.out);
                self.route_dead_letters(now, None);
                self.step(reply);
            }
            Request::Barrier { reply } => self.step(reply),
            Request::DeadLetters {
                at,
                letters,
                deferred,
            } => {
                let now = self.catch_up(at);
                self.engine
                    .handle(now, Command::DeadLetters { letters }, &mut self.out);
                self.route_outcomes(now, deferred);
            }
            Request::Outcomes {
                at,
                outcomes,
                deferred,
            } => {
                let now = self.catch_up(at);
                self.engine
                    .handle(now, Command::Outcomes { outcomes }, &mut self.out);
                if let Some(Deferred { reply, answer }) = deferred {
                    self.replies.push((reply, answer));
                }
            }
            Request::Shutdown => self.stopping = true,
        }
        self.drop_gone_sinks();
    }

    fn take_reply(&mut self) -> Reply {
        self.out
            .reply
            .take()
            .expect("the engine answers every command")
    }

    /// A message from another shard carries that shard's time; under the manual clock ours
    /// moves up to it first, so the result does not depend on which arrives first.
    fn catch_up(&mut self, at: Tick) -> Tick {
        if let TimeSource::Manual = self.time {
            self.manual_now = self.manual_now.max(at);
        }
        self.now()
    }

    /// The shared cell of a live queue, made on first sight.
    fn cell(&mut self, key: QueueKey) -> (QueueKey, Arc<QueueCell>) {
        let idx = key.slot();
        if self.cells.len() <= idx {
            self.cells.resize_with(idx + 1, || None);
        }
        match &self.cells[idx] {
            Some((k, cell)) if *k == key => (key, cell.clone()),
            _ => {
                let cell = Arc::new(QueueCell::default());
                self.cells[idx] = Some((key, cell.clone()));
                (key, cell)
            }
        }
    }

    /// Closes the cell of a queue the engine just closed, before anyone hears of it.
    fn on_closed(&mut self, key: QueueKey, frozen: QueueStats) {
        let idx = key.slot();
        if let Some(Some((k, cell))) = self.cells.get(idx) {
            if *k == key {
                cell.close(frozen);
                self.cells[idx] = None;
            }
        }
    }

    /// Sends dead letters to the shards owning their queues, handling this shard's own at
    /// once. A deferred answer rides with them and comes back with the outcomes.
    fn route_dead_letters(&mut self, now: Tick, mut deferred: Option<Deferred>) {
        while !self.out.dead_letters.is_empty() {
            let n = self.peers.len();
            let mut local = Vec::new();
            let mut remote: Vec<(usize, Vec<DeadLetter>)> = Vec::new();
            for letter in self.out.dead_letters.drain(..) {
                let shard = shard_for(&letter.to, n);
                if shard == self.index {
                    local.push(letter);
                } else if let Some((_, group)) = remote.iter_mut().find(|(s, _)| *s == shard) {
                    group.push(letter);
                } else {
                    remote.push((shard, vec![letter]));
                }
            }
            if !local.is_empty() {
                self.engine
                    .handle(now, Command::DeadLetters { letters: local }, &mut self.out);
                self.route_outcomes(now, None);
            }
            let last = remote.len().saturating_sub(1);
            for (i, (shard, letters)) in remote.into_iter().enumerate() {
                let deferred = if i == last { deferred.take() } else { None };
                self.send_to(
                    shard,
                    Request::DeadLetters {
                        at: now,
                        letters,
                        deferred,
                    },
                );
            }
        }
        if let Some(Deferred { reply, answer }) = deferred {
            self.replies.push((reply, answer));
        }
    }

    /// Sends what dead-letter queues here did back to the shards the letters came from.
    fn route_outcomes(&mut self, now: Tick, mut deferred: Option<Deferred>) {
        let mut remote: Vec<(usize, Vec<DeathOutcome>)> = Vec::new();
        let mut local = Vec::new();
        for outcome in self.out.outcomes.drain(..) {
            let shard = usize::from(outcome.origin.shard);
            if shard == self.index {
                local.push(outcome);
            } else if let Some((_, group)) = remote.iter_mut().find(|(s, _)| *s == shard) {
                group.push(outcome);
            } else {
                remote.push((shard, vec![outcome]));
            }
        }
        if !local.is_empty() {
            self.engine
                .handle(now, Command::Outcomes { outcomes: local }, &mut self.out);
        }
        if !remote.is_empty() {
            // An outcome may release a caller on the other shard, whose call must return
            // only once the deliveries its dead letters caused here are in their channels.
            self.flush_deliveries();
        }
        let last = remote.len().saturating_sub(1);
        for (i, (shard, outcomes)) in remote.into_iter().enumerate() {
            let deferred = if i == last { deferred.take() } else { None };
            self.send_to(
                shard,
                Request::Outcomes {
                    at: now,
                    outcomes,
                    deferred,
                },
            );
        }
        if let Some(Deferred { reply, answer }) = deferred {
            self.replies.push((reply, answer));
        }
    }

    /// Sends to another shard without ever blocking: a full inbox leaves it in the backlog.
    fn send_to(&mut self, shard: usize, req: Request) {
        self.cross_sent += 1;
        if !self.backlog.is_empty() {
            self.backlog.push_back((shard, req));
            return;
        }
        match self.peers[shard].try_send(req) {
            Ok(()) => {}
            Err(TrySendError::Full(req)) => self.backlog.push_back((shard, req)),
            // That shard has stopped: the broker is shutting down.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn retry_backlog(&mut self) {
        while let Some((shard, req)) = self.backlog.pop_front() {
            match self.peers[shard].try_send(req) {
                Ok(()) => {}
                Err(TrySendError::Full(req)) => {
                    self.backlog.push_front((shard, req));
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    /// Answers an advance or barrier step once everything it caused is flushed.
    fn step(&mut self, reply: ReplyTo) {
        self.flush_deliveries();
        // Messages still in the backlog count as sent: the broker must step again.
        let cross_sent = std::mem::take(&mut self.cross_sent) + self.backlog.len() as u64;
        self.replies.push((reply, Answer::Step { cross_sent }));
    }

    /// Drops the channels of consumers that ended; a blocked `recv` sees the disconnect,
    /// a pending async `next` is woken to see it.
    fn drop_gone_sinks(&mut self) {
        for key in self.out.consumers_gone.drain(..) {
            // Dropping the sink closes the channel, then wakes its readers.
            drop(self.sinks.get_mut(key.slot()).and_then(Option::take));
        }
    }

    fn flush(&mut self) {
        self.flush_deliveries();
        for (reply, answer) in self.replies.drain(..) {
            reply.send(answer);
        }
    }

    /// Pushes deliveries into consumer channels, waking each async reader once per run.
    fn flush_deliveries(&mut self) {
        let mut last: Option<usize> = None;
        // Under the manual clock time moves only as far as a caller asks, and what a channel
        // holds after an `advance` must not depend on how it was stepped: no trimming.
        let real_time = matches!(self.time, TimeSource::System(_));
        for (key, delivered) in self.out.deliveries.drain(..) {
            let slot = key.slot();
            let Some(Some(sink)) = self.sinks.get(slot) else {
                continue;
            };
            if real_time && sink.tx.len() >= 2 * sink.prefetch {
                trim(&self.engine, key, sink);
            }
            // Unbounded, but holding at most twice the prefetch: never blocks. A send
            // fails only once the consumer's receiver is gone with its cancel on the way.
            let _ = sink.tx.send(delivered);
            if last.is_some_and(|l| l != slot) {
                wake(&self.sinks, last);
            }
            last = Some(slot);
        }
        wake(&self.sinks, last);
    }

    /// Stops: freezes the stats of every live queue for its handles, answers what is left,
    /// and drops every consumer channel so that blocked receivers wake up.
    fn stop(&mut self) {
        self.flush();
        for entry in self.cells.iter_mut() {
            if let Some((key, cell)) = entry.take() {
                if let Some(stats) = self.engine.stats(key) {
                    cell.freeze(stats);
                }
            }
        }
        // Each sink closes its channel, then wakes its readers.
        self.sinks.clear();
        self.backlog.clear();
        // Requests still queued are dropped with the inbox: each answers ShutDown.
        while let Ok(req) = self.inbox.try_recv() {
            drop(req);
        }
    }
}

/// Drops from the front of a consumer's channel the deliveries whose leases ended unread
/// (expired, or acked by `ack_up_to`), once it holds twice its prefetch. Under the system
/// clock a consumer that stopped reading would otherwise collect one more with every
/// redelivery its credit brings, without end. Unread leases of one queue end in the order they were delivered,
/// so the ended ones are the oldest in the channel: popping until no more remain than the
/// consumer's live leases not counting the one about to be sent takes only those. (Only a
/// caller settling tags it never read can end one out of order.) Should a live one come
/// out all the same, or the consumer read some meanwhile, it goes back, at the end.
fn trim(engine: &Shard, consumer: ConsumerKey, sink: &Sink) {
    let Some(held) = engine.leases_held(consumer) else {
        return;
    };
    while sink.tx.len() > held.saturating_sub(1) {
        match sink.rx.try_recv() {
            Ok(delivered) if engine.holds(consumer, delivered.tag) => {
                let _ = sink.tx.send(delivered);
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// A wake-up time beyond any deadline worth waiting for (a year from now).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

fn wake(sinks: &[Option<Sink>], slot: Option<usize>) {
    if let Some(Some(sink)) = slot.and_then(|s| sinks.get(s)) {
        sink.readers.0.wake();
    }
}
