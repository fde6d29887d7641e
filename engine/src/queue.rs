//! One queue's state and operations: messages, the ready lists, the lease table, consumers'
//! round robin, dedup and retry.

use std::sync::Arc;
use std::time::Duration;

use ahash::RandomState;
use bytes::Bytes;
use slab::Slab;

use crate::chunked::ChunkSlab;
use crate::command::{
    ConsumerKey, DeadLetter, Delivered, Effects, MsgId, Origin, QueueKey, TickLength,
};
use crate::durable::Change;
mod consumers;
mod ready;
mod restore;
mod tags;

use ready::ReadyLists;
use tags::Tags;

use crate::leases::{Lease, LeaseTable};
use crate::types::{
    DeathReason, DeathRecord, DeliveryTag, Error, Message, Overflow, PutOutcome, QueueConfig,
    QueueStats, Settle,
};
use crate::validate;
use crate::wheel::{Tick, TimerKey, Wheel};

/// Fixed seeds, so that hashing (and so any order derived from it) is the same in every run.
pub(crate) fn fixed_state() -> RandomState {
    RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
}

type Map<K, V> = std::collections::HashMap<K, V, RandomState>;

/// Hash tables with less room than this keep it.
const MIN_SHRINK_ROOM: usize = 1024;

/// The room to shrink a hash table of ids to, once no more than an eighth of its room is
/// used: a burst of millions of ids would otherwise leave a table sized for its peak for
/// the life of the queue. The rehash moves what is left, at most an eighth of the room, so
/// it costs a fraction of the growth that made the room; and a table shrunk to twice its
/// entries shrinks again only after three quarters of them left. `room` is the table's
/// `capacity()`, which the markers of removed entries lower until a rehash: with many of
/// them the shrink comes later, never sooner.
fn shrunk_room(len: usize, room: usize) -> Option<usize> {
    (room >= MIN_SHRINK_ROOM && len <= room / 8).then_some(len * 2)
}

/// Shrinks `map` if [`shrunk_room`] says so.
pub(crate) fn shrink_sparse<K: Eq + std::hash::Hash, V>(map: &mut Map<K, V>) {
    if let Some(room) = shrunk_room(map.len(), map.capacity()) {
        map.shrink_to(room);
    }
}

/// The consumer of a priority that got the latest delivery among those of that priority.
#[derive(Debug, Clone, Copy)]
struct Served {
    priority: i64,
    /// Its `order`, which stays true after it has gone.
    order: u64,
    /// Its position in the queue's consumer list then: still its own unless consumers
    /// were listed or cancelled since, which `order` tells.
    pos: usize,
}

/// What a wheel entry stands for.
#[derive(Debug)]
pub(crate) enum Timer {
    /// The lease with this tag runs out.
    Lease { queue: u32, tag: u64 },
    /// A delayed or nacked message becomes ready.
    Ready { queue: u32, msg: u32 },
    /// An id's dedup window ends.
    Dedup { queue: u32, id: Arc<str> },
}

/// A consumer, kept by the shard so that a lease can name it by slot.
#[derive(Debug)]
pub(crate) struct ConsumerState {
    pub queue: u32,
    pub gen: u32,
    pub name: String,
    pub prefetch: u32,
    /// Live leases held.
    pub held: u32,
    /// Tags delivered to this consumer, in order; settled ones dropped lazily.
    pub tags: Tags,
    /// Stopped: gets no more deliveries, keeps its leases until they are settled or it ends.
    pub stopped: bool,
    /// Dispatch serves the queue's consumers of the highest priority with credit first.
    pub priority: i64,
    /// Its place in its queue's registration order (set when the queue lists it).
    pub order: u64,
    /// The length of its leases, where not its queue's (`ConsumeOptions::ack_timeout`).
    pub ack_ticks: Option<Tick>,
}

impl Ctx<'_> {
    /// The deadline `ticks` from now: never sooner than that in real time.
    pub fn after(&self, ticks: Tick) -> Tick {
        self.now + ticks + self.slack
    }
}

impl ConsumerState {
    pub fn new(queue: u32, gen: u32, name: String, prefetch: u32, priority: i64) -> ConsumerState {
        ConsumerState {
            queue,
            gen,
            name,
            prefetch,
            held: 0,
            tags: Tags::default(),
            stopped: false,
            priority,
            order: 0,
            ack_ticks: None,
        }
    }

    fn has_credit(&self) -> bool {
        !self.stopped && self.held < self.prefetch
    }
}

/// What the queue operations borrow from the shard.
pub(crate) struct Ctx<'a> {
    pub now: Tick,
    /// Added to every deadline: 1 where `now` is a real clock rounded down to its tick.
    pub slack: Tick,
    pub shard: u16,
    pub tick: TickLength,
    pub wheel: &'a mut Wheel<Timer>,
    pub consumers: &'a mut Slab<ConsumerState>,
    pub out: &'a mut Effects,
    pub next_auto_id: &'a mut u64,
    /// The shard's next durable message number.
    pub next_seq: &'a mut u64,
    /// Log time at tick 0, in nanoseconds.
    pub log_epoch: u64,
}

impl Ctx<'_> {
    /// `tick` in log time.
    pub fn log_time(&self, tick: Tick) -> u64 {
        self.log_epoch.saturating_add(self.tick.start_of(tick))
    }
}

#[derive(Debug)]
struct Msg {
    /// The message's number in the log; 0 in a queue that is not durable.
    seq: u64,
    id: MsgId,
    body: Bytes,
    /// Deliveries so far.
    attempt: u32,
    /// As put, so that a dead letter keeps it (the queue's `max_priority` caps only its
    /// place in the ready lists); 0 in a queue with neither priorities nor a dead-letter
    /// queue.
    priority: u8,
    death: Option<Box<DeathRecord>>,
    state: MsgState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MsgState {
    Ready,
    Delayed(TimerKey),
    Leased(u64),
}

#[derive(Debug)]
struct DedupEntry {
    /// A live message (ready, delayed or leased) holds this id.
    live: bool,
    /// The window since the id's first enqueue is still open.
    window: Option<TimerKey>,
}

/// How a lease ended, for the bookkeeping that follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Return {
    /// The lease ran out, or its consumer went away after reading the delivery.
    Expired,
    /// Nacked: back after a delay.
    Nacked(Tick),
    /// Released: to the front, costing no attempt.
    Released,
}

pub(crate) struct QueueState {
    pub key: QueueKey,
    pub name: Arc<str>,
    pub config: QueueConfig,
    dead_letter: Option<Arc<str>>,
    ack_ticks: Tick,
    max_lease_ticks: Option<Tick>,
    dedup_ticks: Tick,
    msgs: ChunkSlab<Msg>,
    ready: ReadyLists,
    delayed: usize,
    leases: LeaseTable,
    /// Consumer slots, highest priority first, in registration order within a priority.
    consumers: Vec<u32>,
    /// Whether their priorities differ; while they do not, dispatch is a plain round robin.
    prioritized: bool,
    /// How many of them are stopped.
    stopped: usize,
    /// The `order` the next consumer listed gets.
    next_order: u64,
    /// For each priority some listed consumer has: the consumer of that priority that got
    /// its latest delivery (it may have gone since), where the round robin among them goes
    /// on. One entry in a queue without consumer priorities.
    last_served: Vec<Served>,
    with_credit: usize,
    dedup: Map<Arc<str>, DedupEntry>,
    /// The broker ids live in this queue, kept only once a caller has given this queue an
    /// id of the broker's form (`~<shard>-<seq>`): from then on a given id equal to a live
    /// broker id is a duplicate, and a generated id equal to a given one is skipped. A
    /// queue whose callers never give such ids pays nothing for it.
    auto_live: Option<std::collections::HashSet<u64, RandomState>>,
    rng: u64,
    stats: QueueStats,
    /// The queue's number in the log; `None` for a queue that is not durable.
    pub log: Option<u32>,
    /// Durable messages on their way to the dead-letter queue, by number: logged as removed
    /// only once that queue has taken them (its enqueue is on disk by then), and written
    /// into snapshots until then, so that a crash in between loses none.
    dying: Map<u64, Dying>,
}

/// A durable message sent to the dead-letter queue, not yet taken there.
#[derive(Debug)]
struct Dying {
    id: MsgId,
    body: Bytes,
    attempt: u32,
    priority: u8,
    death: Option<Box<DeathRecord>>,
}

impl QueueState {
    pub fn new(key: QueueKey, name: &str, config: QueueConfig, tick: TickLength) -> QueueState {
        QueueState {
            key,
            name: name.into(),
            dead_letter: config.dead_letter.as_deref().map(Arc::from),
            ack_ticks: tick.ticks(config.ack_timeout),
            max_lease_ticks: config.max_lease.map(|d| tick.ticks(d)),
            dedup_ticks: tick.ticks(config.dedup_window),
            ready: ReadyLists::new(config.max_priority),
            config,
            msgs: ChunkSlab::new(),
            delayed: 0,
            leases: LeaseTable::new(1),
            consumers: Vec::new(),
            prioritized: false,
            stopped: 0,
            next_order: 0,
            last_served: Vec::new(),
            with_credit: 0,
            dedup: Map::with_hasher(fixed_state()),
            auto_live: None,
            rng: fixed_state().hash_one(name) | 1,
            stats: QueueStats::default(),
            log: None,
            dying: Map::with_hasher(fixed_state()),
        }
    }

    /// The consumer slot holding the live lease `tag`.
    pub fn holder(&self, tag: u64) -> Option<u32> {
        self.leases.get(tag).map(|lease| lease.consumer)
    }

    pub fn stats(&self) -> QueueStats {
        QueueStats {
            ready: self.ready.len(),
            delayed: self.delayed,
            leased: self.leases.len(),
            consumers: self.consumers.len() - self.stopped,
            ..self.stats.clone()
        }
    }

    // ----- put -----------------------------------------------------------------------------

    pub fn put(&mut self, ctx: &mut Ctx, message: Message) -> Result<PutOutcome, Error> {
        validate::message(&message, self.config.max_body_bytes)?;
        self.watch_auto_shaped(message.id.as_deref());
        if self.is_duplicate(message.id.as_deref()) {
            self.stats.duplicates += 1;
            return Ok(PutOutcome::Duplicate);
        }
        if self.is_full(1) && !self.drop_head(ctx) {
            return Err(Error::QueueFull);
        }
        self.enqueue_message(ctx, message, &[]);
        self.dispatch(ctx);
        Ok(PutOutcome::Enqueued)
    }

    /// Atomic for errors: every message is checked (in order, each as `put` would) before
    /// any is enqueued.
    pub fn put_batch(
        &mut self,
        ctx: &mut Ctx,
        messages: Vec<Message>,
    ) -> Result<Vec<PutOutcome>, Error> {
        let mut outcomes = Vec::with_capacity(messages.len());
        let mut batch_ids: Option<std::collections::HashSet<&str, RandomState>> = None;
        // What counts for `max_length`, and the ready messages, as the batch would leave
        // them message by message: with `DropHead`, each message that finds the queue full
        // drops the ready head then, which may be one of the batch's own.
        let mut counted = self.counted_for_max_length();
        let mut ready = self.ready.len();
        for message in &messages {
            validate::message(message, self.config.max_body_bytes)?;
            self.watch_auto_shaped(message.id.as_deref());
            let duplicate = match message.id.as_deref() {
                None => false,
                Some(id) => {
                    let seen = batch_ids.get_or_insert_with(|| {
                        std::collections::HashSet::with_hasher(fixed_state())
                    });
                    self.is_duplicate(Some(id)) || !seen.insert(id)
                }
            };
            if duplicate {
                outcomes.push(PutOutcome::Duplicate);
                continue;
            }
            if self.config.max_length.is_some_and(|max| counted >= max) {
                if self.config.overflow != Overflow::DropHead || ready == 0 {
                    return Err(Error::QueueFull);
                }
                counted -= 1;
                ready -= 1;
            }
            counted += 1;
            if ctx.tick.ticks(message.delay) == 0 {
                ready += 1;
            }
            outcomes.push(PutOutcome::Enqueued);
        }
        drop(batch_ids);
        // Ids of the broker's form given in this batch: a message without an id enqueued
        // before them must not be given one of them.
        let reserved: Vec<u64> = match self.auto_live {
            None => Vec::new(),
            Some(_) => messages
                .iter()
                .filter_map(|m| m.id.as_deref().and_then(MsgId::parse_auto))
                .collect(),
        };
        for (message, outcome) in messages.into_iter().zip(&outcomes) {
            match outcome {
                PutOutcome::Enqueued => {
                    if self.is_full(1) {
                        let dropped = self.drop_head(ctx);
                        debug_assert!(dropped, "the checks above found a ready head");
                    }
                    self.enqueue_message(ctx, message, &reserved);
                }
                PutOutcome::Duplicate => self.stats.duplicates += 1,
            }
        }
        self.dispatch(ctx);
        Ok(outcomes)
    }

    /// A given id is a duplicate when it is live or windowed here, or is the text of a
    /// broker id live here.
    fn is_duplicate(&self, id: Option<&str>) -> bool {
        id.is_some_and(|id| {
            self.dedup.contains_key(id)
                || self.auto_live.as_ref().is_some_and(|live| {
                    MsgId::parse_auto(id).is_some_and(|auto| live.contains(&auto))
                })
        })
    }

    /// Starts keeping the broker ids live here the first time a caller gives an id of their
    /// form (see `auto_live`).
    fn watch_auto_shaped(&mut self, id: Option<&str>) {
        if self.auto_live.is_some() || id.is_none_or(|id| MsgId::parse_auto(id).is_none()) {
            return;
        }
        let mut live = std::collections::HashSet::with_hasher(fixed_state());
        for (_, m) in self.msgs.iter() {
            if let MsgId::Auto(n) = m.id {
                live.insert(n);
            }
        }
        self.auto_live = Some(live);
    }

    /// Whether a caller gave this queue the text of broker id `id` as an id still live or
    /// windowed here. Only looked up once the queue watches for such ids (`auto_live`).
    fn broker_id_taken(&self, id: &MsgId) -> bool {
        self.auto_live.is_some() && self.dedup.contains_key(&*id.to_text())
    }

    /// The next broker id for this queue: the shard's next sequence number, skipping any
    /// whose text a caller gave as an id still live or windowed here, or in `reserved`.
    fn next_auto_id(&self, ctx: &mut Ctx, reserved: &[u64]) -> MsgId {
        loop {
            *ctx.next_auto_id += 1;
            let n = MsgId::auto_number(ctx.shard, *ctx.next_auto_id);
            let id = MsgId::Auto(n);
            if !(reserved.contains(&n) || self.broker_id_taken(&id)) {
                return id;
            }
        }
    }

    /// Whether `adding` more messages would pass `max_length`: live messages against it, or
    /// with `DropHead` the waiting ones (ready and delayed), as RabbitMQ counts only
    /// messages not yet delivered (the leased are bounded by their consumers' prefetch).
    fn is_full(&self, adding: usize) -> bool {
        self.config
            .max_length
            .is_some_and(|max| self.counted_for_max_length() + adding > max)
    }

    fn counted_for_max_length(&self) -> usize {
        match self.config.overflow {
            Overflow::RejectPublish => self.msgs.len(),
            Overflow::DropHead => self.ready.len() + self.delayed,
        }
    }

    /// Makes room for one message in a full queue that drops its head: the oldest ready
    /// message (the next one dispatch would hand out) is dropped and counted. False, and
    /// nothing changed, where the queue refuses instead or has no ready message.
    fn drop_head(&mut self, ctx: &mut Ctx) -> bool {
        if self.config.overflow != Overflow::DropHead {
            return false;
        }
        let Some(msg) = self.ready.pop_front() else {
            return false;
        };
        let m = self.remove_message(msg);
        self.stats.dropped += 1;
        self.log_removed(ctx, m.seq);
        true
    }

    fn enqueue_message(&mut self, ctx: &mut Ctx, message: Message, reserved: &[u64]) {
        let id = match message.id {
            Some(id) => MsgId::Given(id),
            None => self.next_auto_id(ctx, reserved),
        };
        let delay = ctx.tick.ticks(message.delay);
        self.enqueue(ctx, id, message.body, message.priority, delay, None);
    }

    /// Adds a message that passed every check. Broker-assigned ids stay out of the dedup
    /// index: such a message is never a duplicate.
    fn enqueue(
        &mut self,
        ctx: &mut Ctx,
        id: MsgId,
        body: Bytes,
        priority: u8,
        delay: Tick,
        death: Option<Box<DeathRecord>>,
    ) {
        // Only a queue with priorities, or one whose dead letters may go into such a queue,
        // can tell a message's priority; any other keeps 0, so that its log holds no
        // priorities it never uses.
        let kept = self.config.max_priority.is_some() || self.dead_letter.is_some();
        let priority = if kept { priority } else { 0 };
        if let MsgId::Given(given) = &id {
            let window = (self.dedup_ticks > 0).then(|| {
                ctx.wheel.insert(
                    ctx.after(self.dedup_ticks),
                    Timer::Dedup {
                        queue: self.key.idx,
                        id: given.clone(),
                    },
                )
            });
            let previous = self
                .dedup
                .insert(given.clone(), DedupEntry { live: true, window });
            debug_assert!(
                previous.is_none(),
                "a live or windowed id was enqueued again"
            );
        }
        if let (MsgId::Auto(n), Some(live)) = (&id, &mut self.auto_live) {
            live.insert(*n);
        }
        let seq = match self.log {
            Some(_) => {
                *ctx.next_seq += 1;
                *ctx.next_seq
            }
            None => 0,
        };
        let msg = self.msgs.insert(Msg {
            seq,
            id,
            body,
            attempt: 0,
            priority,
            death,
            state: MsgState::Ready,
        }) as u32;
        self.stats.enqueued += 1;
        let ready_at = if delay == 0 {
            self.ready.push_fresh(msg, priority);
            None
        } else {
            let at = ctx.after(delay);
            self.delay_message(ctx, msg, at);
            Some(at)
        };
        if let Some(queue) = self.log {
            self.log_enqueued(ctx, queue, msg, ready_at);
        }
    }

    /// Logs the enqueue of `msg`, with the deadline of its id's dedup window.
    fn log_enqueued(&self, ctx: &mut Ctx, queue: u32, msg: u32, ready_at: Option<Tick>) {
        let m = &self.msgs[msg as usize];
        let dedup_until = self.window_end(ctx.wheel, &m.id).map(|at| ctx.log_time(at));
        let change = Change::Enqueued {
            queue,
            seq: m.seq,
            id: m.id.clone(),
            body: m.body.clone(),
            attempt: m.attempt,
            priority: m.priority,
            ready_at: ready_at.map(|at| ctx.log_time(at)),
            dedup_until,
            death: m.death.clone(),
        };
        ctx.out.log.push(change);
    }

    fn delay_message(&mut self, ctx: &mut Ctx, msg: u32, at: Tick) {
        let timer = ctx.wheel.insert(
            at,
            Timer::Ready {
                queue: self.key.idx,
                msg,
            },
        );
        self.msgs[msg as usize].state = MsgState::Delayed(timer);
        self.delayed += 1;
    }

    /// A dead letter from another queue: enqueued as a fresh message that keeps its id, or
    /// refused (full, duplicate id, too large) so that its origin drops it.
    pub fn accept_dead_letter(&mut self, ctx: &mut Ctx, letter: DeadLetter) -> bool {
        if letter.body.len() > self.config.max_body_bytes {
            return false;
        }
        match &letter.id {
            MsgId::Given(id) => {
                self.watch_auto_shaped(Some(id));
                if self.is_duplicate(Some(id)) {
                    return false;
                }
            }
            // A broker id from another queue: refused where a caller's id of the same text
            // is live or windowed here (broker ids themselves never repeat).
            MsgId::Auto(_) => {
                if self.broker_id_taken(&letter.id) {
                    return false;
                }
            }
        }
        if self.is_full(1) && !self.drop_head(ctx) {
            return false;
        }
        let death = Some(Box::new(letter.death));
        self.enqueue(ctx, letter.id, letter.body, letter.priority, 0, death);
        self.dispatch(ctx);
        true
    }

    // ----- dispatch ------------------------------------------------------------------------

    /// Hands ready messages to consumers with credit: the highest priority first, round robin
    /// in registration order within a priority (`next_consumer`).
    pub fn dispatch(&mut self, ctx: &mut Ctx) {
        while self.with_credit > 0 {
            let Some(msg) = self.ready.pop_front() else {
                return;
            };
            let slot = self.next_consumer(ctx.consumers);
            self.deliver(ctx, msg, slot);
        }
    }

    /// Round robin over the consumers with credit of the highest priority among them, in
    /// registration order, starting after the consumer of that priority that got the
    /// latest delivery among them (even if it has gone since).
    fn next_consumer(&mut self, consumers: &Slab<ConsumerState>) -> u32 {
        let (lo, hi) = if self.prioritized {
            self.top_with_credit(consumers)
        } else {
            (0, self.consumers.len())
        };
        let top = consumers[self.consumers[lo] as usize].priority;
        let last = self.last_served.iter_mut().find(|l| l.priority == top);
        let start = last.as_ref().map_or(lo, |served| {
            let at = |pos: usize| {
                self.consumers
                    .get(pos)
                    .map(|&s| consumers[s as usize].order)
            };
            if at(served.pos) == Some(served.order) {
                served.pos + 1
            } else {
                // Within a priority the list is in registration order.
                let group = &self.consumers[lo..hi];
                lo + group.partition_point(|&s| consumers[s as usize].order <= served.order)
            }
        });
        for pos in (start..hi).chain(lo..start) {
            let slot = self.consumers[pos];
            let consumer = &consumers[slot as usize];
            if consumer.has_credit() {
                let now = Served {
                    priority: top,
                    order: consumer.order,
                    pos,
                };
                match last {
                    Some(served) => *served = now,
                    None => self.last_served.push(now),
                }
                return slot;
            }
        }
        unreachable!("with_credit > 0 but no consumer has credit")
    }

    /// The positions of the consumers whose priority is the highest of those with credit
    /// (they are next to each other: the list is sorted by priority).
    fn top_with_credit(&self, consumers: &Slab<ConsumerState>) -> (usize, usize) {
        let first = (self.consumers.iter())
            .position(|&s| consumers[s as usize].has_credit())
            .expect("with_credit > 0 but no consumer has credit");
        let of = |slot: u32| consumers[slot as usize].priority;
        let top = of(self.consumers[first]);
        let lo = self.consumers[..first].partition_point(|&s| of(s) > top);
        let hi = first + self.consumers[first..].partition_point(|&s| of(s) >= top);
        (lo, hi)
    }

    fn deliver(&mut self, ctx: &mut Ctx, msg: u32, slot: u32) {
        debug_assert!(
            matches!(self.msgs[msg as usize].state, MsgState::Ready),
            "only a ready message is delivered: it is in exactly one place"
        );
        let tag = self.leases.next_tag();
        let deadline = ctx.after(self.lease_ticks(ctx, slot));
        debug_assert!(deadline > ctx.now, "a new lease's deadline is ahead");
        let timer = ctx.wheel.insert(
            deadline,
            Timer::Lease {
                queue: self.key.idx,
                tag,
            },
        );
        let consumer = &mut ctx.consumers[slot as usize];
        debug_assert!(
            consumer.has_credit(),
            "dispatch picks a consumer with credit"
        );
        consumer.tags.push(tag);
        consumer.held += 1;
        debug_assert!(
            consumer.held <= consumer.prefetch,
            "credit never above prefetch"
        );
        if !consumer.has_credit() {
            self.with_credit -= 1;
        }
        let key = ConsumerKey {
            idx: slot,
            gen: consumer.gen,
        };
        self.leases.insert(
            tag,
            Lease {
                msg,
                consumer: slot,
                timer,
                delivered_at: ctx.now,
            },
        );
        let m = &mut self.msgs[msg as usize];
        m.attempt += 1;
        m.state = MsgState::Leased(tag);
        self.stats.delivered += 1;
        if let Some(queue) = self.log {
            ctx.out.log.push(Change::Delivered {
                queue,
                seq: m.seq,
                tag,
                attempt: m.attempt,
            });
        }
        ctx.out.deliveries.push((
            key,
            Delivered {
                tag: DeliveryTag(tag),
                id: m.id.clone(),
                body: m.body.clone(),
                attempt: m.attempt,
                death: m.death.clone(),
            },
        ));
    }

    // ----- leases --------------------------------------------------------------------------

    /// Ends a live lease: out of the table, credit back to its consumer. The caller decides
    /// what happens to the message, and cancels the timer unless it fired.
    fn end_lease(&mut self, consumers: &mut Slab<ConsumerState>, tag: u64) -> Option<Lease> {
        let lease = self.leases.remove(tag)?;
        let consumer = &mut consumers[lease.consumer as usize];
        debug_assert!(
            consumer.held > 0,
            "a consumer holding a lease holds one or more"
        );
        // A full consumer gets its credit back (a stopped one has none to get back).
        if consumer.held == consumer.prefetch && !consumer.stopped {
            self.with_credit += 1;
        }
        consumer.held -= 1;
        let leases = &self.leases;
        consumer
            .tags
            .tidy(consumer.held as usize, |t| leases.contains(t));
        Some(lease)
    }

    fn take_lease(&mut self, ctx: &mut Ctx, tag: u64) -> Option<Lease> {
        let lease = self.end_lease(ctx.consumers, tag)?;
        ctx.wheel.cancel(lease.timer);
        Some(lease)
    }

    /// One settle. `false` when the tag is stale (counted) or the request is refused
    /// (a touch past `max_lease`, a nack delay over 7 days: not counted).
    pub fn settle(&mut self, ctx: &mut Ctx, tag: DeliveryTag, op: Settle) -> bool {
        let tag = tag.0;
        if let Settle::NackWithDelay(delay) = op {
            if !validate::nack_delay(delay) {
                return false;
            }
        }
        if !self.leases.contains(tag) {
            self.stats.stale += 1;
            return false;
        }
        match op {
            Settle::Ack => self.ack(ctx, tag),
            Settle::Nack => {
                let attempt = self.leased_attempt(tag);
                let delay = self.retry_delay(attempt, ctx.tick);
                self.nack(ctx, tag, delay);
            }
            Settle::NackWithDelay(delay) => self.nack(ctx, tag, ctx.tick.ticks(delay)),
            Settle::Reject => {
                let lease = self.take_lease(ctx, tag).expect("checked live");
                self.stats.rejected += 1;
                self.dead_letter(ctx, lease.msg, DeathReason::Rejected);
            }
            Settle::Release => {
                let lease = self.take_lease(ctx, tag).expect("checked live");
                self.stats.released += 1;
                self.requeue(ctx, lease.msg, Return::Released);
            }
            Settle::Touch => return self.touch(ctx, tag),
        }
        self.dispatch(ctx);
        true
    }

    fn leased_attempt(&self, tag: u64) -> u32 {
        let lease = self.leases.get(tag).expect("checked live");
        self.msgs[lease.msg as usize].attempt
    }

    fn ack(&mut self, ctx: &mut Ctx, tag: u64) {
        let lease = self.take_lease(ctx, tag).expect("checked live");
        self.stats.acked += 1;
        let m = self.remove_message(lease.msg);
        self.log_removed(ctx, m.seq);
    }

    fn nack(&mut self, ctx: &mut Ctx, tag: u64, delay: Tick) {
        let lease = self.take_lease(ctx, tag).expect("checked live");
        self.stats.nacked += 1;
        self.come_back(ctx, lease.msg, Return::Nacked(delay));
    }

    fn touch(&mut self, ctx: &mut Ctx, tag: u64) -> bool {
        let lease = self.leases.get(tag).expect("checked live");
        let ticks = self.lease_ticks(ctx, lease.consumer);
        if let Some(max) = self.max_lease_ticks {
            if ctx.now + ticks > lease.delivered_at + max {
                return false;
            }
        }
        let deadline = ctx.after(ticks);
        debug_assert!(deadline > ctx.now, "a touched lease's deadline is ahead");
        ctx.wheel.reset(lease.timer, deadline);
        true
    }

    /// The lease `tag` of consumer `slot` starts again at `now`: its delivery was held
    /// back (for the disk) and is handed over only now. `false` if it is no longer live.
    pub fn restart_lease(&mut self, ctx: &mut Ctx, slot: u32, tag: u64) -> bool {
        let deadline = ctx.after(self.lease_ticks(ctx, slot));
        let Some(lease) = self.leases.get_mut(tag).filter(|l| l.consumer == slot) else {
            return false;
        };
        lease.delivered_at = ctx.now;
        ctx.wheel.reset(lease.timer, deadline);
        true
    }

    /// How long a lease of consumer `slot` lasts: its own lease, or the queue's.
    fn lease_ticks(&self, ctx: &Ctx, slot: u32) -> Tick {
        ctx.consumers[slot as usize]
            .ack_ticks
            .unwrap_or(self.ack_ticks)
    }

    /// `ack_up_to` on one consumer: every live lease of it with a tag up to `tag`.
    pub fn ack_up_to(&mut self, ctx: &mut Ctx, consumer: u32, tag: DeliveryTag) -> usize {
        let mut acked = 0;
        while let Some(front) = ctx.consumers[consumer as usize].tags.front() {
            if front > tag.0 {
                break;
            }
            ctx.consumers[consumer as usize].tags.pop_front();
            // Tags are unique to a queue: a live lease of a tag from this list is this
            // consumer's.
            if self.leases.contains(front) {
                self.ack(ctx, front);
                acked += 1;
            }
        }
        if acked > 0 {
            self.dispatch(ctx);
        }
        acked
    }

    /// The lease timer fired: the message comes back with its attempt spent.
    fn expire(&mut self, ctx: &mut Ctx, tag: u64) {
        let lease = self
            .end_lease(ctx.consumers, tag)
            .expect("a lease timer outlived its lease");
        self.stats.expired += 1;
        self.come_back(ctx, lease.msg, Return::Expired);
        self.dispatch(ctx);
    }

    /// A message came back from a lease (expiry, nack, cancel): dead-lettered once it has had
    /// `max_deliveries` deliveries, else requeued.
    fn come_back(&mut self, ctx: &mut Ctx, msg: u32, how: Return) {
        let attempt = self.msgs[msg as usize].attempt;
        if self.config.max_deliveries.is_some_and(|max| attempt >= max) {
            self.dead_letter(ctx, msg, DeathReason::MaxDeliveries);
        } else {
            self.requeue(ctx, msg, how);
        }
    }

    /// Puts a message whose lease just ended back among the ready (or delayed) ones.
    fn requeue(&mut self, ctx: &mut Ctx, msg: u32, how: Return) {
        let m = &mut self.msgs[msg as usize];
        debug_assert!(
            matches!(m.state, MsgState::Leased(tag) if !self.leases.contains(tag)),
            "only a message whose lease has ended comes back: it is in exactly one place"
        );
        m.state = MsgState::Ready;
        // An expiry or an immediate nack is not logged: after a restart a message that was
        // leased is ready at once with its attempt kept, which is what they did.
        let ready_at = match how {
            Return::Expired | Return::Nacked(0) => {
                self.ready.push_returned(msg, m.priority);
                return;
            }
            Return::Nacked(delay) => {
                let at = ctx.after(delay);
                self.delay_message(ctx, msg, at);
                Some(ctx.log_time(at))
            }
            Return::Released => {
                m.attempt -= 1;
                self.ready.push_released(msg, m.priority);
                None
            }
        };
        if let Some(queue) = self.log {
            let m = &self.msgs[msg as usize];
            ctx.out.log.push(Change::Returned {
                queue,
                seq: m.seq,
                attempt: m.attempt,
                ready_at,
            });
        }
    }

    /// When the dedup window of a live message's id ends, if it has one.
    pub(crate) fn window_end(&self, wheel: &Wheel<Timer>, id: &MsgId) -> Option<Tick> {
        match id {
            MsgId::Given(id) => self.dedup[&**id].window.map(|timer| wheel.deadline(timer)),
            MsgId::Auto(_) => None,
        }
    }

    /// Logs that the message numbered `seq` left a durable queue for good.
    fn log_removed(&self, ctx: &mut Ctx, seq: u64) {
        if let Some(queue) = self.log {
            ctx.out.log.push(Change::Removed { queue, seq });
        }
    }

    fn retry_delay(&mut self, attempt: u32, tick: TickLength) -> Tick {
        let retry = &self.config.retry;
        let base = retry.base_delay(attempt);
        if retry.jitter == 0.0 || base.is_zero() {
            return tick.ticks(base);
        }
        // splitmix64: a small, seeded, reproducible generator.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let factor = 1.0 + retry.jitter * (2.0 * unit - 1.0);
        tick.ticks(Duration::from_secs_f64(base.as_secs_f64() * factor))
    }

    // ----- dead letters --------------------------------------------------------------------

    fn dead_letter(&mut self, ctx: &mut Ctx, msg: u32, reason: DeathReason) {
        let Some(to) = self.dead_letter.clone() else {
            let m = self.remove_message(msg);
            self.stats.dropped += 1;
            self.log_removed(ctx, m.seq);
            return;
        };
        let m = self.msgs.remove(msg as usize);
        if self.log.is_some() {
            // Its id stays live until the outcome: were it put again meanwhile, a crash
            // could bring back both.
            let dying = Dying {
                id: m.id.clone(),
                body: m.body.clone(),
                attempt: m.attempt,
                priority: m.priority,
                death: m.death,
            };
            self.dying.insert(m.seq, dying);
        } else {
            self.release_id(&m.id);
        }
        ctx.out.dead_letters.push(DeadLetter {
            to,
            origin: Origin {
                shard: ctx.shard,
                queue: self.key,
                msg: m.seq,
            },
            id: m.id,
            body: m.body,
            priority: m.priority,
            death: DeathRecord {
                queue: self.name.to_string(),
                reason,
                attempts: m.attempt,
            },
        });
    }

    /// The dead-letter queue's answer for a letter of ours, the message numbered `seq`.
    pub fn count_outcome(&mut self, ctx: &mut Ctx, seq: u64, accepted: bool) {
        if accepted {
            self.stats.dead_lettered += 1;
        } else {
            self.stats.dropped += 1;
        }
        if let Some(dying) = self.dying.remove(&seq) {
            shrink_sparse(&mut self.dying);
            self.release_id(&dying.id);
            self.log_removed(ctx, seq);
        }
    }

    /// Takes a message out of the queue for good (acked or dead-lettered); its id stops
    /// being live.
    fn remove_message(&mut self, msg: u32) -> Msg {
        let m = self.msgs.remove(msg as usize);
        self.release_id(&m.id);
        m
    }

    /// The id of a message that left stops being live (a windowed one stays a duplicate
    /// until its window ends).
    fn release_id(&mut self, id: &MsgId) {
        if let (MsgId::Auto(n), Some(live)) = (id, &mut self.auto_live) {
            live.remove(n);
            if let Some(room) = shrunk_room(live.len(), live.capacity()) {
                live.shrink_to(room);
            }
        }
        if let MsgId::Given(id) = id {
            let entry = self.dedup.get_mut(&**id).expect("a given id is indexed");
            entry.live = false;
            if entry.window.is_none() {
                self.dedup.remove(&**id);
                shrink_sparse(&mut self.dedup);
            }
        }
    }

    /// The room of the queue's tables that grow with its messages: message slots, and
    /// entries of the id table; for tests of what a drained queue keeps.
    #[cfg(test)]
    pub(crate) fn room(&self) -> (usize, usize) {
        (self.msgs.capacity(), self.dedup.capacity())
    }

    // ----- timers --------------------------------------------------------------------------

    pub fn on_timer(&mut self, ctx: &mut Ctx, timer: Timer) {
        match timer {
            Timer::Lease { tag, .. } => self.expire(ctx, tag),
            Timer::Ready { msg, .. } => {
                let m = &mut self.msgs[msg as usize];
                debug_assert!(matches!(m.state, MsgState::Delayed(_)));
                m.state = MsgState::Ready;
                self.delayed -= 1;
                if m.attempt == 0 {
                    self.ready.push_fresh(msg, m.priority);
                } else {
                    self.ready.push_returned(msg, m.priority);
                }
                self.dispatch(ctx);
            }
            Timer::Dedup { id, .. } => {
                let entry = self
                    .dedup
                    .get_mut(&*id)
                    .expect("a dedup timer has its entry");
                entry.window = None;
                if !entry.live {
                    self.dedup.remove(&*id);
                    shrink_sparse(&mut self.dedup);
                }
            }
        }
    }
}
