//! The shard thread: a thin loop around one engine [`Shard`].
//!
//! Each turn it waits for a request (or, under the system clock, the next deadline), drains
//! up to [`BATCH`] more without waiting, hands each to the engine, and flushes the effects:
//! deliveries into consumer channels first, then the answers, so that every call returns
//! only once the deliveries it caused are in their channels. Where dead letters and their
//! outcomes go, and when a call that caused them is answered, is decided by [`route`],
//! which the simulator runs too: this loop only supplies the engine calls and the sends.
//! The loop never blocks on a send: consumer channels are unbounded but filled only up to
//! each consumer's prefetch, and a send to a full inbox of another shard waits in a
//! backlog. The requests and answers themselves are in `protocol.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError, TrySendError};
use leasemq_engine::{
    Command, ConsumerKey, Delivered, DeliveryTag, Effects, Error, Message, QueueKey, QueueStats,
    Reply, Shard, Tick, TickLength,
};

mod lead;

pub(crate) use lead::Steering;

use crate::host;
use crate::protocol::{
    number_of, numbered_key, Answer, Deferred, Inbox, QueueCell, ReplyTo, Request, Sink,
};
use crate::route::{self, Backlog, Driver, Hop};
use crate::slice::BusySlice;
use crate::store::{Held, ShardLog};
use crate::turns::{Turn, Turns};
use crate::wait::Sleeper;

/// Requests handled per loop turn before effects are flushed.
pub(crate) const BATCH: usize = 256;

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
    replies: Vec<Deferred>,
    /// The log of this shard's durable queues, when the broker has a data dir.
    log: Option<ShardLog>,
    /// The request (or timer pass) being handled logged a change: what it causes waits.
    logged: bool,
    /// How many deliveries and answers were waiting for the turn's flush when the request
    /// being handled began.
    request_start: (usize, usize),
    /// Requests for other shards whose inboxes were full.
    backlog: Backlog<Request>,
    cross_sent: u64,
    /// The manual clock's time, as the last `Advance` (or dead letter) set it.
    manual_now: Tick,
    stopping: bool,
    /// The thread's time slice, short while the host is busy (`slice.rs`); `None` keeps
    /// whatever slice it has.
    busy_slice: Option<BusySlice>,
    /// In a cluster: the shard's role, and the calls that wait for a leader.
    cluster: Option<Box<Steering>>,
}

impl ShardThread {
    /// A shard thread around `engine` (made by [`new_engine`], restored from `log` if
    /// the broker has a data dir, with `out` what the restore left to route).
    pub fn new(
        index: usize,
        inbox: Receiver<Request>,
        sleeper: Arc<Sleeper>,
        peers: Vec<Inbox>,
        time: TimeSource,
        (engine, log, out): (Shard, Option<ShardLog>, Effects),
    ) -> Self {
        let tick = engine.tick_length().as_duration();
        ShardThread {
            log,
            logged: false,
            request_start: (0, 0),
            engine,
            index,
            inbox,
            sleeper,
            peers,
            time,
            tick: TickLength::new(tick),
            out,
            sinks: Vec::new(),
            cells: Vec::new(),
            replies: Vec::new(),
            backlog: Backlog::default(),
            cross_sent: 0,
            manual_now: 0,
            stopping: false,
            busy_slice: None,
            cluster: None,
        }
    }

    /// The same thread as its node's replica of the shard in a cluster: it serves only
    /// while the node leads the shard.
    pub fn in_cluster(mut self, steering: Steering) -> Self {
        self.cluster = Some(Box::new(steering));
        self
    }

    /// The same thread, switching to a short time slice while the host is busy. Made on the
    /// shard's own thread, whose slice it sets.
    pub fn with_busy_slice(mut self, busy_slice: Option<BusySlice>) -> Self {
        self.busy_slice = busy_slice;
        self
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

    /// Serves until shut down. The state lives in the shard's [`Turns`] from here on: the
    /// thread holds it for each of its turns, and where the shard lends its turns (no log,
    /// not a cluster's, the system clock) releases it while it waits, for a blocking caller to run a turn
    /// itself (see `turns.rs`).
    pub fn run(self, turns: &Turns<ShardThread>) {
        self.sleeper.bind();
        let lends = self.log.is_none()
            && self.cluster.is_none()
            && matches!(self.time, TimeSource::System(_));
        let sleeper = self.sleeper.clone();
        let inbox = self.inbox.clone();
        let yields = self.peers[self.index].yields();
        turns.install(self);
        let mut held = turns.hold();
        // What the restore left: messages it dead-lettered.
        let now = held.now();
        route::dead_letters(&mut *held, now, None);
        held.flush();
        held.pump_log();
        if lends {
            turns.lend();
        }
        while !held.stopping {
            if !lends {
                match held.wait() {
                    Some(Woke::Request(req)) => turns.handled_by_thread(held.turn(Some(req))),
                    Some(Woke::Gone) => break,
                    Some(Woke::Durable) | None => {
                        held.pump_log();
                        held.steer();
                    }
                }
                continue;
            }
            let wake_at = held.before_wait();
            turns.plan_wake(wake_at.map(|at| held.nanos_at(at)));
            drop(held);
            // Requests are taken out of the inbox only with the state held, so that they
            // are handled in the order they were sent, whoever runs the turn.
            let attempt = || (!inbox.is_empty() || turns.look_again()).then_some(());
            let ready = if turns.callers_may_run() {
                sleeper.wait_parked(wake_at, attempt)
            } else {
                sleeper.wait(wake_at, yields, attempt)
            };
            held = turns.hold();
            match ready {
                Some(()) => turns.handled_by_thread(held.turn(None)),
                None => held.retry_backlog(),
            }
        }
        drop(held);
        if let Some(mut shard) = turns.take() {
            shard.stop();
        }
    }

    /// One turn: handles `first` and up to a batch of requests more from the inbox, then
    /// flushes what they caused. Returns how many it handled.
    fn turn(&mut self, first: Option<Request>) -> usize {
        self.steer();
        let mut handled = 0;
        if let Some(req) = first {
            self.process(req);
            handled += 1;
        }
        while handled < BATCH && !self.stopping {
            match self.inbox.try_recv() {
                Ok(req) => self.process(req),
                Err(_) => break,
            }
            handled += 1;
        }
        self.flush();
        self.pump_log();
        self.retry_backlog();
        self.steer();
        handled
    }

    /// Nanoseconds of the shard's clock at `at`.
    fn nanos_at(&self, at: Instant) -> u64 {
        match &self.time {
            TimeSource::System(epoch) => {
                u64::try_from(at.saturating_duration_since(*epoch).as_nanos()).unwrap_or(u64::MAX)
            }
            TimeSource::Manual => u64::MAX,
        }
    }

    /// Hands the turn's records to the log's syncer, lets out what the disk now covers,
    /// and writes a snapshot when the log has grown enough.
    fn pump_log(&mut self) {
        let Some(log) = &mut self.log else {
            return;
        };
        // A shard whose durable queues were quiet this turn has nothing to do here.
        if !log.has_work() {
            return;
        }
        log.submit(Instant::now());
        self.release_held();
        if let Some(log) = &mut self.log {
            log.maybe_snapshot(&self.engine);
        }
        self.release_held();
    }

    /// Sends what the log no longer holds back.
    fn release_held(&mut self) {
        let Some(mut log) = self.log.take() else {
            return;
        };
        let mut woken: Option<usize> = None;
        let now = self.now();
        let replicated = log.is_replicated();
        log.release(|what, failed| match what {
            Held::Delivery(key, delivered) => {
                // Once the log failed, a delivery of a durable queue never leaves: its
                // lease runs out in memory, and after a restart it is back. Else its
                // lease counts from now, when it is handed over; one that ran out while
                // it waited is stale, and dropped.
                if failed.is_none() && self.engine.restart_lease(now, key, delivered.tag) {
                    self.deliver(key, delivered, &mut woken);
                }
            }
            Held::Reply(deferred) => deferred.send(failed),
            // The engine dropped the queue either way: its handles see it closed now, and
            // after a failed log also (the close's answer is then refused: `close` says
            // `false`, and a restart brings the queue back).
            // In a cluster, a close whose commit is unknown may yet happen or not: the
            // handles keep the queue, and learn from the next leader.
            Held::Close(_, cell, frozen, sinks) => {
                if failed.is_none() || !replicated {
                    cell.close(frozen);
                }
                // Dropping each sink closes its channel, then wakes its readers.
                drop(sinks);
            }
            Held::Hop(to, hop) => match failed {
                None => {
                    let peers = &self.peers;
                    self.backlog
                        .send(to, Request::Hop(Box::new(hop)), |shard, req| {
                            try_send(peers, shard, req)
                        });
                }
                // Dead letters or outcomes whose changes never reached the disk: the
                // source keeps its message (it is logged as gone only on an outcome),
                // and the answer riding along is refused.
                Some(e) => {
                    let (Hop::DeadLetters { deferred, .. } | Hop::Outcomes { deferred, .. }) = hop;
                    if let Some(deferred) = deferred {
                        deferred.send(Some(e));
                    }
                }
            },
        });
        wake(&self.sinks, woken);
        self.log = Some(log);
    }

    /// Appends the changes the engine logged so far, stamped with the engine's time, and
    /// notes that the request being handled logged some.
    fn log_pending(&mut self) {
        if self.out.log.is_empty() {
            return;
        }
        let now = self.engine.log_time(self.engine.now());
        match &mut self.log {
            Some(log) => {
                log.append(now, &mut self.out.log);
                self.logged = true;
            }
            // No data dir, no durable queue: nothing can log.
            None => self.out.log.clear(),
        }
    }

    /// Whether what the request being handled causes from now on waits for the disk: it
    /// logged a change, under `Always` (or after the log failed, to be refused).
    fn depends(&mut self) -> bool {
        if self.log.is_none() {
            return false;
        }
        self.log_pending();
        self.logged && self.log.as_ref().is_some_and(ShardLog::holds_back)
    }

    /// At the end of a request that logged: what it left to send waits for the disk.
    fn hold_what_it_caused(&mut self) {
        if !self.depends() {
            return;
        }
        let log = self.log.as_mut().expect("depends needs a log");
        // What earlier requests of the turn left is theirs: it goes out with the turn.
        let (deliveries, replies) = self.request_start;
        let deliveries = deliveries.min(self.out.deliveries.len());
        for (key, delivered) in self.out.deliveries.drain(deliveries..) {
            log.hold(true, Held::Delivery(key, delivered));
        }
        let replies = replies.min(self.replies.len());
        for deferred in self.replies.drain(replies..) {
            log.hold(true, Held::Reply(deferred));
        }
        // All it caused waits; what is left for the turn's flush does not depend on it.
        self.logged = false;
    }

    /// The answer to refuse `cmd` with, when it would change a durable queue whose log
    /// failed, or when the disk has no room for its records: refused whole, before the
    /// engine applies anything.
    fn refuse(&mut self, cmd: &Command) -> Option<Reply> {
        self.log.as_ref()?;
        let config = self.durable_target(cmd)?;
        // The log bytes the command may need; a put whose body is over the queue's limit
        // is refused by the engine anyway, and reserves nothing.
        let fits = |m: &Message| m.body().len() <= config.max_body_bytes;
        let needed = match cmd {
            Command::Put { message, .. } if fits(message) => {
                ShardLog::put_bytes(std::iter::once(message))
            }
            Command::PutBatch { messages, .. } if messages.iter().all(fits) => {
                ShardLog::put_bytes(messages.iter())
            }
            Command::Settle { .. } => ShardLog::settle_bytes(1),
            Command::SettleBatch { settles, .. } => ShardLog::settle_bytes(settles.len()),
            Command::AckUpTo { consumer, .. } => {
                ShardLog::settle_bytes(self.engine.leases_held(*consumer).unwrap_or(0))
            }
            Command::Purge { queue } => {
                let stats = self.engine.stats(*queue).unwrap_or_default();
                ShardLog::settle_bytes(stats.ready + stats.delayed)
            }
            // A close that cannot be logged does not happen: the queue stays.
            Command::Close { .. } => ShardLog::settle_bytes(1),
            _ => return None,
        };
        let log = self.log.as_mut().expect("checked above");
        let e = log.reserve(needed).err()?;
        Some(refusal(cmd, e))
    }

    /// Whether `cmd` is about a durable queue.
    fn about_durable(&self, cmd: &Command) -> bool {
        if self.log.is_none() {
            return false;
        }
        match cmd {
            Command::Declare { config, .. } => config.durable,
            _ => self.durable_target(cmd).is_some(),
        }
    }

    /// The config of the durable queue `cmd` changes, if it changes one.
    fn durable_target(&self, cmd: &Command) -> Option<&leasemq_engine::QueueConfig> {
        let queue = match cmd {
            Command::AckUpTo { consumer, .. } => self.engine.queue_of(*consumer)?,
            _ => changed_queue(cmd)?,
        };
        self.engine.config(queue).filter(|c| c.durable)
    }

    /// Waits for the next request, or for the disk to cover what is held back; under the
    /// system clock, fires due timers first and returns `None` when it woke for a deadline.
    fn wait(&mut self) -> Option<Woke> {
        let wake_at = self.before_wait();
        let inbox = &self.inbox;
        let log = &mut self.log;
        let holding = log.as_ref().is_some_and(ShardLog::is_holding);
        let cluster = &self.cluster;
        let attempt = || match inbox.try_recv() {
            Ok(req) => Some(Woke::Request(req)),
            Err(TryRecvError::Disconnected) => Some(Woke::Gone),
            Err(TryRecvError::Empty) => {
                if log.as_mut().is_some_and(ShardLog::progressed) {
                    Some(Woke::Durable)
                } else {
                    (cluster.as_ref().is_some_and(|c| c.has_news())).then_some(Woke::Durable)
                }
            }
        };
        // While the log holds things back, what comes next is most likely the fsync,
        // a fraction of a millisecond away: park, and leave the core to the syncer.
        let got = if holding {
            self.sleeper.wait_parked(wake_at, attempt)
        } else {
            // Its own inbox says how long a wait on this shard may yield.
            let yields = self.peers[self.index].yields();
            self.sleeper.wait(wake_at, yields, attempt)
        };
        if got.is_none() {
            self.retry_backlog();
        }
        got
    }

    /// What the thread does before it waits: under the system clock, fires due timers and
    /// flushes what they caused; follows the host with its time slice. Returns when the
    /// wait must end on its own: the next timer, a retry of the backlog, a submit of the log.
    fn before_wait(&mut self) -> Option<Instant> {
        let wake_at = match self.time {
            TimeSource::Manual => None,
            TimeSource::System(epoch) => {
                let now = self.now();
                self.logged = false;
                self.engine.handle_timeout(now, &mut self.out);
                route::dead_letters(self, now, None);
                self.flush();
                self.pump_log();
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
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let submit_at = self.log.as_ref().and_then(ShardLog::submit_at);
        let wake_at = earliest(wake_at, submit_at);
        // In a cluster: a held batch or a waiting call that runs out of time.
        let check_at = self.log.as_ref().and_then(ShardLog::check_at);
        let wake_at = earliest(wake_at, check_at);
        let wake_at = earliest(wake_at, self.cluster.as_ref().and_then(|c| c.deadline()));
        if let Some(slice) = &mut self.busy_slice {
            slice.follow(host::busy());
        }
        wake_at
    }

    /// Handles one request at the time read now, after it left the inbox: the thread may
    /// have been off its core since its batch began, and a settle sent after a lease's
    /// deadline must meet the lease expired (the late ack is refused). `now()` is never
    /// behind the engine, which a dead letter from another shard may have moved on.
    fn process(&mut self, req: Request) {
        if self.cluster.as_ref().is_some_and(|c| !c.is_leading()) {
            self.follow_request(req);
            return;
        }
        let now = self.now();
        self.logged = false;
        self.request_start = (self.out.deliveries.len(), self.replies.len());
        // A request refused before the engine saw it changed nothing: it is answered.
        if !self.dispatch(now, req) {
            return;
        }
        // The engine fires due timers before every command, so any request may leave dead
        // letters; none waits for a later one to be routed.
        if !self.out.dead_letters.is_empty() {
            route::dead_letters(self, now, None);
        }
        self.drop_gone_sinks();
        self.hold_what_it_caused();
    }

    /// Hands `req` to what handles its kind; `false` when it was refused before the engine
    /// saw it.
    fn dispatch(&mut self, now: Tick, req: Request) -> bool {
        match req {
            Request::Engine { mut cmd, reply } => {
                // In a cluster, the queue by its number.
                if self.cluster.is_some() {
                    if let Some(queue) = named_queue(&mut cmd) {
                        let Some(found) = self.by_number(*queue) else {
                            return self.gone(reply, refusal(&cmd, Error::QueueClosed));
                        };
                        *queue = found;
                    }
                }
                return self.engine_request(now, cmd, reply);
            }
            Request::Declare { cmd, reply } => return self.declare(now, cmd, reply),
            Request::Consume {
                queue,
                name,
                config,
                options,
                sink,
                reply,
            } => {
                // In a cluster, the queue by its number.
                let Some(queue) = self.by_number(queue) else {
                    return self.gone(reply, Reply::Consumed(Err(Error::QueueClosed)));
                };
                let cmd = Command::Consume {
                    queue,
                    name: name.into_string(),
                    config,
                    priority: options.priority,
                    ack_timeout: options.ack_timeout,
                };
                self.consume(now, cmd, sink, reply);
            }
            Request::Cancel {
                consumer,
                rx,
                unread,
                reply,
            } => {
                self.cancel(now, consumer, (&rx, unread), reply);
            }
            Request::Stop {
                consumer,
                rx,
                unread,
                reply,
            } => {
                self.stop_consumer(now, consumer, (&rx, unread), reply);
            }
            Request::Advance { nanos, reply } => {
                if let TimeSource::Manual = self.time {
                    self.manual_now = self.manual_now.max(self.tick.tick_of(nanos));
                }
                let now = self.now();
                self.engine.handle_timeout(now, &mut self.out);
                route::dead_letters(self, now, None);
                self.step(reply);
            }
            Request::Barrier { reply } => self.step(reply),
            Request::Names { reply } => self.answer_names(reply),
            Request::Stats { reply } => self.answer_stats(reply),
            Request::Hop(hop) => {
                let now = self.catch_up(hop.at());
                route::receive(self, now, *hop);
            }
            Request::Shutdown => self.stopping = true,
        }
        true
    }

    /// Answers the names of the live queues.
    fn answer_names(&mut self, reply: ReplyTo) {
        let names = self.engine.queue_names().map(str::to_string).collect();
        self.replies
            .push(Deferred::plain(reply, Answer::Names(names)));
    }

    /// Answers every live queue's name and stats.
    fn answer_stats(&mut self, reply: ReplyTo) {
        let stats = (self.engine.queue_stats())
            .map(|(name, stats)| (name.to_string(), stats))
            .collect();
        self.replies
            .push(Deferred::plain(reply, Answer::Stats(stats)));
    }

    /// The engine's key of the queue a handle's `key` names: itself, or in a cluster the
    /// live queue of its number, if any.
    fn by_number(&self, key: QueueKey) -> Option<QueueKey> {
        number_of(key).map_or(Some(key), |n| self.engine.queue_by_number(n))
    }

    /// Answers a request about a queue that is gone with `refused`; `false`, as the engine
    /// never saw it.
    fn gone(&mut self, reply: ReplyTo, refused: Reply) -> bool {
        self.replies
            .push(Deferred::plain(reply, Answer::Engine(refused)));
        false
    }

    /// A command answered with the engine's reply, once the dead letters it caused have
    /// landed; `false` when it was refused before the engine saw it (see `refuse`).
    fn engine_request(&mut self, now: Tick, cmd: Command, reply: ReplyTo) -> bool {
        if let Some(refusal) = self.refuse(&cmd) {
            let answer = Answer::Engine(refusal);
            self.replies.push(Deferred::plain(reply, answer));
            return false;
        }
        let closing = match &cmd {
            Command::Close { queue } => Some(*queue),
            _ => None,
        };
        let durable = self.about_durable(&cmd);
        // An answer about a queue whose close waits for the disk waits behind it.
        self.logged = self.behind_a_close(&cmd);
        self.engine.handle(now, cmd, &mut self.out);
        let answer = self.take_reply();
        if let (Some(key), Reply::Closed(Some(stats))) = (closing, &answer) {
            self.on_closed(key, (**stats).clone(), durable);
        }
        // Answered now, or after the dead letters it caused have landed.
        let answer = Answer::Engine(answer);
        let deferred = Deferred {
            reply,
            answer,
            durable,
        };
        route::dead_letters(self, now, Some(deferred));
        true
    }

    /// A declare or lookup, answered with the queue and its shared cell; `false` when a
    /// durable declare was refused because the log failed.
    fn declare(&mut self, now: Tick, cmd: Command, reply: ReplyTo) -> bool {
        let durable = self.about_durable(&cmd);
        if let (true, Some(e)) = (durable, self.log.as_ref().and_then(|l| l.failed())) {
            let answer = Answer::Queue(Err(e.clone()));
            self.replies.push(Deferred::plain(reply, answer));
            return false;
        }
        self.engine.handle(now, cmd, &mut self.out);
        let answer = match self.take_reply() {
            Reply::Declared(result) => Answer::Queue(result.map(|key| Some(self.cell(key)))),
            Reply::Found(found) => Answer::Queue(Ok(found.map(|key| self.cell(key)))),
            other => unreachable!("declare answered {other:?}"),
        };
        self.replies.push(Deferred {
            reply,
            answer,
            durable,
        });
        true
    }

    /// Registers a consumer; its channel's sink is kept under its slot.
    fn consume(&mut self, now: Tick, cmd: Command, sink: Sink, reply: ReplyTo) {
        // Deliveries still held here may name a consumer slot this one reuses.
        self.flush_deliveries();
        self.engine.handle(now, cmd, &mut self.out);
        let reply_value = self.take_reply();
        if let Reply::Consumed(Ok(key)) = &reply_value {
            if self.sinks.len() <= key.slot() {
                self.sinks.resize_with(key.slot() + 1, || None);
            }
            self.sinks[key.slot()] = Some(sink);
        }
        self.replies
            .push(Deferred::plain(reply, Answer::Engine(reply_value)));
    }

    /// The tags a consumer never read: what its channel `rx` still holds, and what this
    /// shard holds back for it.
    fn unread(
        &mut self,
        consumer: ConsumerKey,
        (rx, mut unread): (&Receiver<Delivered>, Vec<DeliveryTag>),
    ) -> Vec<DeliveryTag> {
        // What this shard still holds for the consumer counts as unread too.
        self.flush_deliveries();
        unread.extend(rx.try_iter().map(|d| d.tag));
        if let Some(log) = &mut self.log {
            let held = log.take_deliveries_of(consumer);
            unread.extend(held.into_iter().map(|d| d.tag));
        }
        unread
    }

    /// A consumer ends: its unread deliveries are released, and the answer (if any) waits
    /// for the dead letters the cancel caused.
    fn cancel(
        &mut self,
        now: Tick,
        consumer: ConsumerKey,
        channel: (&Receiver<Delivered>, Vec<DeliveryTag>),
        reply: Option<ReplyTo>,
    ) {
        let unread = self.unread(consumer, channel);
        self.engine
            .handle(now, Command::Cancel { consumer, unread }, &mut self.out);
        self.drop_gone_sinks();
        let deferred = reply.map(|reply| Deferred::plain(reply, Answer::Done));
        route::dead_letters(self, now, deferred);
    }

    /// A consumer stops taking deliveries and keeps its leases; its channel ends.
    fn stop_consumer(
        &mut self,
        now: Tick,
        consumer: ConsumerKey,
        channel: (&Receiver<Delivered>, Vec<DeliveryTag>),
        reply: ReplyTo,
    ) {
        // A consumer that ended already (its slot may serve another by now) has nothing
        // to stop.
        if self.engine.leases_held(consumer).is_some() {
            let unread = self.unread(consumer, channel);
            self.engine
                .handle(now, Command::Stop { consumer, unread }, &mut self.out);
            // Nothing more will come: the channel ends, so a `recv` returns at once.
            drop(self.sinks.get_mut(consumer.slot()).and_then(Option::take));
        }
        self.replies.push(Deferred::plain(reply, Answer::Done));
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

    /// The key handles name a live queue by, and its shared cell, made on first sight. In a
    /// cluster handles name the queue by its number: another engine may lead the shard by
    /// the time they call.
    fn cell(&mut self, key: QueueKey) -> (QueueKey, Arc<QueueCell>) {
        let idx = key.slot();
        if self.cells.len() <= idx {
            self.cells.resize_with(idx + 1, || None);
        }
        let cell = match &self.cells[idx] {
            Some((k, cell)) if *k == key => cell.clone(),
            _ => {
                let config = self.engine.config(key).cloned().unwrap_or_default();
                let number = self.engine.queue_number(key);
                let cell = Arc::new(QueueCell::new(config, number));
                self.cells[idx] = Some((key, cell.clone()));
                cell
            }
        };
        match cell.number() {
            Some(number) if self.cluster.is_some() => (numbered_key(number), cell),
            _ => (key, cell),
        }
    }

    /// Closes the cell of a queue the engine just closed, before anyone hears of it; for a
    /// durable queue whose log holds answers back, once its `Closed` record is on disk.
    fn on_closed(&mut self, key: QueueKey, frozen: QueueStats, durable: bool) {
        let idx = key.slot();
        let Some(Some((k, _))) = self.cells.get(idx) else {
            return;
        };
        if *k != key {
            return;
        }
        let (_, cell) = self.cells[idx].take().expect("looked at it");
        if durable && self.depends() {
            // The consumers the close ended are its own (this request closed nothing
            // else): their channels close with it, once it is on disk.
            let log = self.log.as_mut().expect("depends needs a log");
            let mut sinks = Vec::new();
            for gone in self.out.consumers_gone.drain(..) {
                // A consumer whose queue closed gets none of what was held for it.
                log.take_deliveries_of(gone);
                sinks.extend(self.sinks.get_mut(gone.slot()).and_then(Option::take));
            }
            log.hold_close(key, cell, frozen, sinks);
        } else {
            cell.close(frozen);
        }
    }

    /// Whether `cmd` is about a queue whose close still waits for the disk.
    fn behind_a_close(&self, cmd: &Command) -> bool {
        let Some(log) = &self.log else {
            return false;
        };
        let queue = match cmd {
            Command::Stats { queue } => Some(*queue),
            _ => changed_queue(cmd),
        };
        queue.is_some_and(|queue| log.is_closing(queue))
    }

    fn retry_backlog(&mut self) {
        let peers = &self.peers;
        self.backlog.retry(|shard, req| try_send(peers, shard, req));
    }

    /// Answers an advance or barrier step once everything it caused is flushed.
    fn step(&mut self, reply: ReplyTo) {
        self.flush_deliveries();
        // Messages still in the backlog count as sent: the broker must step again.
        let cross_sent = std::mem::take(&mut self.cross_sent) + self.backlog.len() as u64;
        self.replies
            .push(Deferred::plain(reply, Answer::Step { cross_sent }));
    }

    /// Drops the channels of consumers that ended; a blocked `recv` sees the disconnect,
    /// a pending async `next` is woken to see it.
    fn drop_gone_sinks(&mut self) {
        for key in self.out.consumers_gone.drain(..) {
            // A consumer whose queue closed gets none of what was held for it.
            if let Some(log) = &mut self.log {
                log.take_deliveries_of(key);
            }
            // Dropping the sink closes the channel, then wakes its readers.
            drop(self.sinks.get_mut(key.slot()).and_then(Option::take));
        }
    }

    fn flush(&mut self) {
        self.flush_deliveries();
        let depends = self.depends();
        let Some(log) = self.log.as_mut() else {
            for deferred in self.replies.drain(..) {
                deferred.send(None);
            }
            return;
        };
        for deferred in self.replies.drain(..) {
            // A step of the manual clock answers once everything before it went out, and a
            // put to a durable queue once what it may duplicate is on disk.
            // In a cluster every answer does, reads included: a lookup must not find a
            // queue whose declare may yet be lost with the lead.
            let step = matches!(deferred.answer, Answer::Step { .. });
            let must_follow = deferred.is_durable_put() || log.is_replicated();
            let behind = depends || (must_follow && log.is_behind());
            if behind || (step && log.is_holding()) {
                log.hold(behind, Held::Reply(deferred));
            } else {
                // A log that failed refuses what its durable queues would answer.
                deferred.send(log.failed());
            }
        }
    }

    /// Pushes deliveries into consumer channels, waking each async reader once per run;
    /// what depends on the log, or must stay behind a held delivery to the same consumer,
    /// waits for the disk instead.
    fn flush_deliveries(&mut self) {
        let depends = self.depends();
        let mut last: Option<usize> = None;
        let mut deliveries = std::mem::take(&mut self.out.deliveries);
        for (key, delivered) in deliveries.drain(..) {
            match &mut self.log {
                Some(log) if depends || log.holds_for(key) => {
                    log.hold(depends, Held::Delivery(key, delivered));
                }
                _ => self.deliver(key, delivered, &mut last),
            }
        }
        // Keep the vector's capacity: a warm shard does not allocate.
        self.out.deliveries = deliveries;
        wake(&self.sinks, last);
    }

    /// Pushes one delivery into its consumer's channel; `last` is the consumer of the one
    /// before, woken when the run of deliveries to it ends.
    fn deliver(&mut self, key: ConsumerKey, delivered: Delivered, last: &mut Option<usize>) {
        let slot = key.slot();
        let Some(Some(sink)) = self.sinks.get(slot) else {
            return;
        };
        // Under the manual clock time moves only as far as a caller asks, and what a channel
        // holds after an `advance` must not depend on how it was stepped: no trimming.
        let real_time = matches!(self.time, TimeSource::System(_));
        if real_time && sink.tx.len() >= 2 * sink.prefetch {
            trim(&self.engine, key, sink);
        }
        // Unbounded, but holding at most twice the prefetch: never blocks. A send fails
        // only once the consumer's receiver is gone with its cancel on the way.
        let _ = sink.tx.send(delivered);
        if last.is_some_and(|l| l != slot) {
            wake(&self.sinks, *last);
        }
        *last = Some(slot);
    }

    /// Stops: freezes the stats of every live queue for its handles, answers what is left,
    /// and drops every consumer channel so that blocked receivers wake up.
    fn stop(&mut self) {
        self.flush();
        if let Some(log) = &mut self.log {
            log.close();
        }
        self.release_held();
        for entry in self.cells.iter_mut() {
            if let Some((key, cell)) = entry.take() {
                if let Some(stats) = self.engine.stats(key) {
                    cell.freeze(stats);
                }
            }
        }
        // In a cluster the shard's lead here ends with the node: a consumer another node
        // streams from here ends as at any end of a lead.
        if self.cluster.is_some() {
            self.end_consumers_with_lead();
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

impl Turn for ShardThread {
    /// A turn run by a caller while the thread waits (see `turns.rs`).
    fn run_callers_turn(&mut self, wakes_at: u64) -> (usize, bool) {
        let handled = self.turn(None);
        let look_again = self.stopping
            || !self.backlog.is_empty()
            || !self.inbox.is_empty()
            || self
                .engine
                .next_deadline()
                .is_some_and(|deadline| self.tick.start_of(deadline) < wakes_at);
        (handled, look_again)
    }
}

impl Driver for ShardThread {
    type Deferred = Deferred;

    fn place(&self) -> (usize, usize) {
        (self.index, self.peers.len())
    }

    fn effects(&mut self) -> &mut Effects {
        &mut self.out
    }

    fn handle(&mut self, now: Tick, cmd: Command) {
        self.engine.handle(now, cmd, &mut self.out);
    }

    fn flush_deliveries(&mut self) {
        ShardThread::flush_deliveries(self);
    }

    /// Never blocks: a full inbox leaves the request in the backlog.
    fn send(&mut self, to: usize, hop: Hop<Deferred>) {
        self.cross_sent += 1;
        if self.depends() {
            let log = self.log.as_mut().expect("depends needs a log");
            log.hold(true, Held::Hop(to, hop));
            return;
        }
        let peers = &self.peers;
        self.backlog
            .send(to, Request::Hop(Box::new(hop)), |shard, req| {
                try_send(peers, shard, req)
            });
    }

    fn answer(&mut self, deferred: Deferred) {
        self.replies.push(deferred);
    }
}

/// Sends to a peer's inbox without blocking; gives the request back when the inbox is full.
/// A request for a shard that has stopped (the broker is shutting down) is dropped.
fn try_send(peers: &[Inbox], shard: usize, req: Request) -> Result<(), Request> {
    match peers[shard].try_send(req) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
        Err(TrySendError::Full(req)) => Err(req),
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

/// Why the shard thread stopped waiting.
enum Woke {
    Request(Request),
    /// Every sender is gone.
    Gone,
    /// The disk covers something the log held back, or the log failed.
    Durable,
}

/// A shard's engine: counting time in `tick`s, with a tick of slack under the system clock.
pub(crate) fn new_engine(index: usize, time: &TimeSource, tick: Duration) -> Shard {
    let index16 = u16::try_from(index).expect("at most 65 536 shards");
    match time {
        TimeSource::System(_) => Shard::new(index16, tick).for_real_time(),
        TimeSource::Manual => Shard::new(index16, tick),
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

/// The queue `cmd` names, if it names one.
fn named_queue(cmd: &mut Command) -> Option<&mut QueueKey> {
    match cmd {
        Command::Put { queue, .. }
        | Command::PutBatch { queue, .. }
        | Command::Settle { queue, .. }
        | Command::SettleBatch { queue, .. }
        | Command::Consume { queue, .. }
        | Command::Purge { queue }
        | Command::Stats { queue }
        | Command::Close { queue } => Some(queue),
        _ => None,
    }
}

/// What `cmd` answers when it is refused whole, before the engine saw it, for `e`.
pub(crate) fn refusal(cmd: &Command, e: Error) -> Reply {
    match cmd {
        Command::Put { .. } => Reply::Put(Err(e)),
        Command::PutBatch { .. } => Reply::PutBatch(Err(e)),
        Command::SettleBatch { settles, .. } => Reply::SettledBatch(vec![false; settles.len()]),
        Command::AckUpTo { .. } => Reply::Count(0),
        Command::Purge { .. } => Reply::Purged(Err(e)),
        Command::Close { .. } => Reply::Closed(None),
        Command::Stats { .. } => Reply::Stats(None),
        Command::Declare { .. } => Reply::Declared(Err(e)),
        Command::Lookup { .. } => Reply::Found(None),
        Command::Consume { .. } => Reply::Consumed(Err(e)),
        _ => Reply::Settled(false),
    }
}

/// The queue a command names and may change (a put, settle, purge or close).
fn changed_queue(cmd: &Command) -> Option<QueueKey> {
    match cmd {
        Command::Put { queue, .. }
        | Command::PutBatch { queue, .. }
        | Command::Settle { queue, .. }
        | Command::SettleBatch { queue, .. }
        | Command::Purge { queue }
        | Command::Close { queue } => Some(*queue),
        _ => None,
    }
}
