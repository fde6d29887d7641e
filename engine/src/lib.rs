//! The state machine of one leasemq shard: pure, single-threaded and deterministic.
//!
//! A [`Shard`] owns the queues that hash onto it, their lease tables, their consumers'
//! credit and a hierarchical timer [`Wheel`] holding every deadline (leases, delayed
//! messages, dedup windows). It never reads a clock, spawns a thread, touches a channel or
//! does IO: time comes in as a [`Tick`] argument and everything it wants done comes out as
//! [`Effects`]. Its face is three calls, in the shape of quinn-proto's `Connection`:
//!
//! - [`Shard::handle`] carries out one [`Command`] at a time `now` and sets
//!   [`Effects::reply`];
//! - [`Shard::handle_timeout`] fires every timer due by `now`, each at its own deadline;
//! - [`Shard::next_deadline`] says when the runtime should call `handle_timeout` next.
//!
//! The runtime (`leasemq-shard`) turns effects into channel sends: [`Delivered`] messages into
//! consumer channels, [`DeadLetter`]s to the shard owning the dead-letter queue, and
//! [`DeathOutcome`]s back to the shard the letter came from. Because nothing here depends on
//! anything but its inputs, the same commands at the same ticks always give the same effects;
//! tests, simulators and benchmarks drive it directly. What each command means is the
//! contract's (`docs/contract.md` in the repository, cited as "contract §3 `put`").
//!
//! ```
//! use leasemq_engine::{Command, Effects, Message, QueueConfig, Reply, Shard};
//! use std::time::Duration;
//!
//! let mut shard = Shard::new(0, Duration::from_millis(1));
//! let mut out = Effects::new();
//! let config = Box::new(QueueConfig::default());
//! shard.handle(0, Command::Declare { name: "jobs".into(), config }, &mut out);
//! let Some(Reply::Declared(Ok(queue))) = out.reply.take() else { unreachable!() };
//! shard.handle(0, Command::Put { queue, message: Message::new("hello") }, &mut out);
//! assert_eq!(shard.stats(queue).unwrap().ready, 1);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod chunked;
mod command;
mod deque;
pub mod durable;
mod leases;
mod queue;
mod types;
pub mod validate;
pub mod wheel;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ahash::RandomState;
use slab::Slab;

pub use command::{
    Command, ConsumerKey, DeadLetter, DeathOutcome, Delivered, Effects, MsgId, Origin, QueueKey,
    Reply, TickLength,
};
pub use types::{
    ConsumeOptions, ConsumerConfig, DeathReason, DeathRecord, DeliveryTag, Envelope, Error,
    Message, Overflow, PutOutcome, QueueConfig, QueueStats, RetryPolicy, Settle, MAX_BODY_LIMIT,
    MAX_DURATION, MAX_ID_BYTES, MAX_NAME_BYTES, MAX_PREFETCH, MIN_ACK_TIMEOUT,
};
pub use wheel::{Tick, TimerKey, Wheel};

use queue::{fixed_state, ConsumerState, Ctx, QueueState, Timer};

/// Everything one shard owns. See the crate docs.
pub struct Shard {
    index: u16,
    tick: TickLength,
    now: Tick,
    /// One tick added to every deadline under a real clock; see [`Shard::for_real_time`].
    slack: Tick,
    wheel: Wheel<Timer>,
    queues: Slab<QueueState>,
    names: HashMap<Arc<str>, QueueKey, RandomState>,
    /// The live durable queues by their number in the log.
    numbers: HashMap<u32, QueueKey, RandomState>,
    consumers: Slab<ConsumerState>,
    next_gen: u32,
    next_auto_id: u64,
    /// The next durable queue and message numbers (contract §7; see [`durable`]).
    next_log_queue: u32,
    next_seq: u64,
    /// Log time at tick 0, in nanoseconds.
    log_epoch: u64,
    /// Set between the first [`Shard::restore`] and [`Shard::finish_restore`].
    restoring: Option<Box<restore::Restoring>>,
}

/// Splits the shard into its queues and what a queue operation borrows from the rest.
macro_rules! ctx {
    ($shard:ident, $out:expr) => {
        (
            &mut $shard.queues,
            Ctx {
                now: $shard.now,
                slack: $shard.slack,
                shard: $shard.index,
                tick: $shard.tick,
                wheel: &mut $shard.wheel,
                consumers: &mut $shard.consumers,
                out: $out,
                next_auto_id: &mut $shard.next_auto_id,
                next_seq: &mut $shard.next_seq,
                log_epoch: $shard.log_epoch,
            },
        )
    };
}

mod restore;

impl Shard {
    /// Shard number `index` (it shows in broker-assigned message ids), counting time in
    /// ticks of `tick`.
    pub fn new(index: u16, tick: Duration) -> Shard {
        Shard {
            index,
            tick: TickLength::new(tick),
            now: 0,
            slack: 0,
            wheel: Wheel::new(),
            queues: Slab::new(),
            names: HashMap::with_hasher(fixed_state()),
            numbers: HashMap::with_hasher(fixed_state()),
            consumers: Slab::new(),
            next_gen: 0,
            next_auto_id: 0,
            next_log_queue: 0,
            next_seq: 0,
            log_epoch: 0,
            restoring: None,
        }
    }

    /// For a runtime whose `now` is a real clock read in whole ticks, rounded down: part of
    /// the current tick has already gone, so every deadline gets one more tick and no lease,
    /// delay or window ends before its full duration has passed in real time. (Under a
    /// manual clock, time moves in whole ticks and no slack is needed.)
    pub fn for_real_time(mut self) -> Shard {
        self.slack = 1;
        self
    }

    /// The same shard, whose queue and consumer keys get generations after `gen`: a
    /// runtime that replaces one engine of a shard by another starts the new one after
    /// the old one's [`next_generation`](Shard::next_generation), so that no key the old
    /// one gave out names anything in the new one.
    pub fn generations_after(mut self, gen: u32) -> Shard {
        self.next_gen = self.next_gen.max(gen);
        self
    }

    /// The generation of the last key given out (see [`Shard::generations_after`]).
    pub fn next_generation(&self) -> u32 {
        self.next_gen
    }

    /// The shard's number, as given to [`Shard::new`].
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The tick of the last command or timer handled.
    pub fn now(&self) -> Tick {
        self.now
    }

    /// The length of this shard's ticks.
    pub fn tick_length(&self) -> TickLength {
        self.tick
    }

    /// When `handle_timeout` has work: no later than the earliest deadline, `None` when no
    /// timer is pending.
    pub fn next_deadline(&self) -> Option<Tick> {
        self.wheel.next_deadline()
    }

    /// Fires every timer due by `now`, in deadline order, each handled at its own deadline:
    /// a redelivery it causes gets a lease counted from that tick, which may itself run out
    /// by `now` and fire in the same call. Spurious calls are no-ops.
    pub fn handle_timeout(&mut self, now: Tick, out: &mut Effects) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        // Every timer due by `self.now` has fired, and every timer set since lies later.
        if now == self.now {
            return;
        }
        while let Some((deadline, timer)) = self.wheel.poll(now) {
            debug_assert!(deadline >= self.now, "a timer fired late");
            self.now = self.now.max(deadline);
            let queue = match &timer {
                Timer::Lease { queue, .. }
                | Timer::Ready { queue, .. }
                | Timer::Dedup { queue, .. } => *queue,
            };
            let (queues, mut ctx) = ctx!(self, out);
            queues[queue as usize].on_timer(&mut ctx, timer);
        }
        self.now = now;
    }

    /// Carries out one command at `now` (after firing the timers due by then) and puts its
    /// answer in `out.reply`.
    pub fn handle(&mut self, now: Tick, cmd: Command, out: &mut Effects) {
        self.handle_timeout(now, out);
        let reply = match cmd {
            Command::Declare { name, config } => {
                Some(Reply::Declared(self.declare(name, *config, out)))
            }
            Command::Lookup { name } => Some(Reply::Found(self.names.get(name.as_str()).copied())),
            Command::Consume {
                queue,
                name,
                config,
                priority,
                ack_timeout,
            } => Some(Reply::Consumed(self.consume(
                queue,
                name,
                (config, priority, ack_timeout),
                out,
            ))),
            Command::Stats { queue } => Some(Reply::Stats(self.stats(queue).map(Box::new))),
            Command::Close { queue } => Some(Reply::Closed(self.close(queue, out).map(Box::new))),
            Command::DeadLetters { letters } => {
                self.accept_dead_letters(letters, out);
                None
            }
            Command::Outcomes { outcomes } => {
                self.count_outcomes(outcomes, out);
                None
            }
            cmd @ (Command::AckUpTo { .. } | Command::Cancel { .. } | Command::Stop { .. }) => {
                self.handle_consumer(cmd, out)
            }
            cmd => self.handle_messages(cmd, out),
        };
        out.reply = reply;
    }

    /// A put, settle or purge on a live queue (a closed one refuses it).
    fn handle_messages(&mut self, cmd: Command, out: &mut Effects) -> Option<Reply> {
        Some(match cmd {
            Command::Put { queue, message } => Reply::Put(match self.live(queue) {
                Some(idx) => {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[idx].put(&mut ctx, message)
                }
                None => Err(Error::QueueClosed),
            }),
            Command::PutBatch { queue, messages } => Reply::PutBatch(match self.live(queue) {
                Some(idx) => {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[idx].put_batch(&mut ctx, messages)
                }
                None => Err(Error::QueueClosed),
            }),
            Command::Settle { queue, tag, op } => Reply::Settled(match self.live(queue) {
                Some(idx) => {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[idx].settle(&mut ctx, tag, op)
                }
                None => false,
            }),
            Command::SettleBatch { queue, settles } => {
                Reply::SettledBatch(match self.live(queue) {
                    Some(idx) => {
                        let (queues, mut ctx) = ctx!(self, out);
                        let q = &mut queues[idx];
                        settles
                            .iter()
                            .map(|&(tag, op)| q.settle(&mut ctx, tag, op))
                            .collect()
                    }
                    None => vec![false; settles.len()],
                })
            }
            Command::Purge { queue } => Reply::Purged(match self.live(queue) {
                Some(idx) => {
                    let (queues, mut ctx) = ctx!(self, out);
                    Ok(queues[idx].purge(&mut ctx))
                }
                None => Err(Error::QueueClosed),
            }),
            // Every other command is `handle`'s own.
            _ => return None,
        })
    }

    /// `ack_up_to`, a cancel or a stop of a live consumer (one that ended has nothing to
    /// do: `ack_up_to` acks nothing).
    fn handle_consumer(&mut self, cmd: Command, out: &mut Effects) -> Option<Reply> {
        match cmd {
            Command::AckUpTo { consumer, tag } => {
                let acked = match self.live_consumer(consumer) {
                    Some(queue) => {
                        let (queues, mut ctx) = ctx!(self, out);
                        queues[queue].ack_up_to(&mut ctx, consumer.idx, tag)
                    }
                    None => 0,
                };
                Some(Reply::Count(acked))
            }
            Command::Cancel { consumer, unread } => {
                if let Some(queue) = self.live_consumer(consumer) {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[queue].cancel(&mut ctx, consumer.idx, &unread);
                }
                None
            }
            Command::Stop { consumer, unread } => {
                if let Some(queue) = self.live_consumer(consumer) {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[queue].stop(&mut ctx, consumer.idx, &unread);
                }
                None
            }
            _ => None,
        }
    }

    /// Dead letters from another shard (or this one): each lands in its queue, if that is
    /// live and takes it, and its outcome goes back to where it came from.
    fn accept_dead_letters(&mut self, letters: Vec<DeadLetter>, out: &mut Effects) {
        for letter in letters {
            let origin = letter.origin;
            let accepted = match self.names.get(&*letter.to).copied() {
                Some(key) => {
                    let (queues, mut ctx) = ctx!(self, out);
                    queues[key.idx as usize].accept_dead_letter(&mut ctx, letter)
                }
                None => false,
            };
            out.outcomes.push(DeathOutcome { origin, accepted });
        }
    }

    /// The outcomes of this shard's dead letters, counted on their source queues.
    fn count_outcomes(&mut self, outcomes: Vec<DeathOutcome>, out: &mut Effects) {
        for outcome in outcomes {
            debug_assert_eq!(outcome.origin.shard, self.index);
            if let Some(idx) = self.live(outcome.origin.queue) {
                let (queues, mut ctx) = ctx!(self, out);
                let msg = outcome.origin.msg;
                queues[idx].count_outcome(&mut ctx, msg, outcome.accepted);
            }
        }
    }

    /// A queue's stats, `None` once it is closed.
    pub fn stats(&self, queue: QueueKey) -> Option<QueueStats> {
        self.live(queue).map(|idx| self.queues[idx].stats())
    }

    /// How many live leases `consumer` holds; `None` once it has ended.
    pub fn leases_held(&self, consumer: ConsumerKey) -> Option<usize> {
        self.consumers
            .get(consumer.idx as usize)
            .filter(|c| c.gen == consumer.gen)
            .map(|c| c.held as usize)
    }

    /// Whether `tag` is a live lease of `consumer`.
    pub fn holds(&self, consumer: ConsumerKey, tag: DeliveryTag) -> bool {
        self.live_consumer(consumer)
            .is_some_and(|q| self.queues[q].holder(tag.0) == Some(consumer.idx))
    }

    /// A delivery to `consumer` that the runtime held back (until the disk covered it) is
    /// handed over now: its lease counts from `now`, so that the wait for the disk does
    /// not eat into `ack_timeout` (nor `max_lease`). `false` when the lease is no longer
    /// live (it ran out meanwhile, or its consumer ended): the delivery is stale, and the
    /// runtime drops it. `now` earlier than the shard's time counts as the shard's time.
    pub fn restart_lease(&mut self, now: Tick, consumer: ConsumerKey, tag: DeliveryTag) -> bool {
        let Some(idx) = self.live_consumer(consumer) else {
            return false;
        };
        // Nothing comes out of it: the effects stay empty.
        let mut out = Effects::new();
        let (queues, mut ctx) = ctx!(self, &mut out);
        ctx.now = ctx.now.max(now);
        queues[idx].restart_lease(&mut ctx, consumer.idx, tag.0)
    }

    /// The config of a live queue.
    pub fn config(&self, queue: QueueKey) -> Option<&QueueConfig> {
        self.live(queue).map(|idx| &self.queues[idx].config)
    }

    /// Whether `queue` is live and durable (its changes come out in [`Effects::log`]).
    pub fn is_durable(&self, queue: QueueKey) -> bool {
        self.live(queue)
            .is_some_and(|idx| self.queues[idx].log.is_some())
    }

    /// The queue `consumer` reads, while both live.
    pub fn queue_of(&self, consumer: ConsumerKey) -> Option<QueueKey> {
        let idx = self.live_consumer(consumer)?;
        Some(self.queues[idx].key)
    }

    /// The live queue of that name.
    pub fn lookup(&self, name: &str) -> Option<QueueKey> {
        self.names.get(name).copied()
    }

    /// The number of a live durable queue in the log (see [`durable`]): given when it was
    /// declared, never reused in a data dir, and the same in every shard that restores
    /// its log, where slots and generations of [`QueueKey`]s are not. `None` for a queue
    /// that is not durable, or not live. Also while a restore is under way.
    pub fn queue_number(&self, queue: QueueKey) -> Option<u32> {
        self.live(queue).and_then(|idx| self.queues[idx].log)
    }

    /// The live durable queue numbered `number` in the log (see [`Shard::queue_number`]).
    pub fn queue_by_number(&self, number: u32) -> Option<QueueKey> {
        self.numbers.get(&number).copied()
    }

    /// The names of the live queues this shard holds, in no particular order.
    pub fn queue_names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(|name| &**name)
    }

    /// Each live queue's name and stats, in no particular order.
    pub fn queue_stats(&self) -> impl Iterator<Item = (&str, QueueStats)> {
        (self.names.iter()).filter_map(|(name, &key)| Some((&**name, self.stats(key)?)))
    }

    /// How many live queues this shard holds.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// How many timers are pending in the wheel.
    pub fn pending_timers(&self) -> usize {
        self.wheel.len()
    }

    fn live(&self, key: QueueKey) -> Option<usize> {
        let idx = key.idx as usize;
        self.queues
            .get(idx)
            .is_some_and(|q| q.key.gen == key.gen)
            .then_some(idx)
    }

    fn live_consumer(&self, key: ConsumerKey) -> Option<usize> {
        self.consumers
            .get(key.idx as usize)
            .filter(|c| c.gen == key.gen)
            .map(|c| c.queue as usize)
    }

    fn bump_gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    fn declare(
        &mut self,
        name: String,
        config: QueueConfig,
        out: &mut Effects,
    ) -> Result<QueueKey, Error> {
        validate::queue_name(&name)?;
        validate::queue_config(&name, &config)?;
        if let Some(&key) = self.names.get(name.as_str()) {
            return if self.queues[key.idx as usize].config == config {
                Ok(key)
            } else {
                Err(Error::ConfigMismatch)
            };
        }
        let gen = self.bump_gen();
        let entry = self.queues.vacant_entry();
        let key = QueueKey {
            idx: u32::try_from(entry.key()).expect("fewer than 2^32 queues"),
            gen,
        };
        let durable = config.durable;
        let queue = entry.insert(QueueState::new(key, &name, config, self.tick));
        if durable {
            self.next_log_queue += 1;
            queue.log = Some(self.next_log_queue);
            self.numbers.insert(self.next_log_queue, key);
            out.log.push(durable::Change::Declared {
                queue: self.next_log_queue,
                name: queue.name.clone(),
                config: Box::new(queue.config.clone()),
            });
        }
        self.names.insert(name.into(), key);
        Ok(key)
    }

    fn consume(
        &mut self,
        queue: QueueKey,
        name: String,
        (config, priority, ack_timeout): (ConsumerConfig, i64, Option<Duration>),
        out: &mut Effects,
    ) -> Result<ConsumerKey, Error> {
        let idx = self.live(queue).ok_or(Error::QueueClosed)?;
        validate::consumer_name(&name)?;
        validate::consumer_config(&config)?;
        if let Some(lease) = ack_timeout {
            validate::consumer_lease(lease, self.queues[idx].config.max_lease)?;
        }
        if self.queues[idx].has_consumer(&self.consumers, &name) {
            return Err(Error::DuplicateConsumer);
        }
        let gen = self.bump_gen();
        let mut state = ConsumerState::new(queue.idx, gen, name, config.prefetch, priority);
        state.ack_ticks = ack_timeout.map(|lease| self.tick.ticks(lease));
        let slot = self.consumers.insert(state);
        let slot = u32::try_from(slot).expect("fewer than 2^32 consumers");
        let (queues, mut ctx) = ctx!(self, out);
        queues[idx].add_consumer(&mut ctx, slot, &config);
        Ok(ConsumerKey { idx: slot, gen })
    }

    fn close(&mut self, queue: QueueKey, out: &mut Effects) -> Option<QueueStats> {
        let idx = self.live(queue)?;
        let state = self.queues.remove(idx);
        self.names.remove(&*state.name);
        if let Some(queue) = state.log {
            self.numbers.remove(&queue);
            out.log.push(durable::Change::Closed { queue });
        }
        let (_, mut ctx) = ctx!(self, out);
        Some(state.close(&mut ctx))
    }

    /// Cross-checks every structure against the others; panics with the broken rule.
    /// Expensive: for tests, after every step.
    pub fn check_invariants(&self) {
        self.wheel.check_invariants();
        let mut timers = 0;
        let mut durable = 0;
        for (idx, queue) in self.queues.iter() {
            assert_eq!(queue.key.idx as usize, idx, "queue key matches its slot");
            assert_eq!(self.names.get(&*queue.name), Some(&queue.key), "name index");
            if let Some(number) = queue.log {
                assert_eq!(self.numbers.get(&number), Some(&queue.key), "number index");
                durable += 1;
            }
            queue.check_invariants(self.now, &self.consumers, &self.wheel);
            timers += queue.timer_count();
        }
        assert_eq!(self.names.len(), self.queues.len(), "no stale names");
        assert_eq!(self.numbers.len(), durable, "no stale numbers");
        for (_, consumer) in self.consumers.iter() {
            assert!(
                self.queues.contains(consumer.queue as usize),
                "consumer of a live queue"
            );
        }
        assert_eq!(timers, self.wheel.len(), "every timer belongs to a queue");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_queue_gives_back_its_message_slots_and_its_id_table() {
        let mut shard = Shard::new(0, std::time::Duration::from_millis(1));
        let mut out = Effects::new();
        let config = Box::new(QueueConfig::default());
        shard.handle(
            0,
            Command::Declare {
                name: "q".into(),
                config,
            },
            &mut out,
        );
        let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
            panic!("declare failed")
        };
        for batch in 0..100 {
            let messages = (0..1000)
                .map(|i| Message::new("m").with_id(format!("{batch}-{i}")))
                .collect();
            shard.handle(0, Command::PutBatch { queue, messages }, &mut out);
            assert!(matches!(out.reply.take(), Some(Reply::PutBatch(Ok(_)))));
        }
        let (slots, ids) = shard.queues[queue.slot()].room();
        assert!(
            slots >= 100_000 && ids >= 100_000,
            "{slots} slots, room for {ids} ids"
        );
        shard.handle(0, Command::Purge { queue }, &mut out);
        assert!(matches!(out.reply.take(), Some(Reply::Purged(Ok(100_000)))));
        let (slots, ids) = shard.queues[queue.slot()].room();
        assert!(slots <= 2 * chunked::CHUNK, "{slots} message slots kept");
        assert!(ids < 2048, "room for {ids} ids kept");
    }
}
