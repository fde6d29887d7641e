//! What each command must do, by contract §3: the reply the ledger expects and the changes it
//! records. Deliveries each command causes are checked by `dispatch`.

use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, DeadLetter, DeathOutcome, DeathReason, DeliveryTag,
    Error, Message, PutOutcome, QueueConfig, QueueKey, Reply, Settle, Tick, MAX_DURATION,
    MAX_ID_BYTES, MAX_NAME_BYTES, MAX_PREFETCH,
};

use super::timers::Back;
use super::{IdRec, Ledger, Obs, Place, Q};
use crate::Violation;

impl Ledger {
    /// The reply `cmd` must get; records its changes and checks the deliveries it caused.
    pub(crate) fn command(
        &mut self,
        obs: &Obs,
        now: Tick,
        cmd: &Command,
    ) -> Result<Option<Reply>, Violation> {
        let reply = match cmd {
            Command::Declare { name, config } => Reply::Declared(self.declare(obs, name, config)?),
            Command::Lookup { name } => Reply::Found(self.lookup(obs, name)),
            Command::Put { queue, message } => Reply::Put(self.put(obs, now, *queue, message)?),
            Command::PutBatch { queue, messages } => {
                Reply::PutBatch(self.put_batch(obs, now, *queue, messages)?)
            }
            Command::Settle { queue, tag, op } => {
                let q = self.live_queue(obs.shard, *queue);
                Reply::Settled(self.settle_in(obs, q, now, *tag, *op)?)
            }
            Command::SettleBatch { queue, settles } => {
                let mut results = Vec::with_capacity(settles.len());
                let q = self.live_queue(obs.shard, *queue);
                for &(tag, op) in settles {
                    results.push(self.settle_in(obs, q, now, tag, op)?);
                }
                Reply::SettledBatch(results)
            }
            Command::Consume {
                queue,
                name,
                config,
                ..
            } => Reply::Consumed(self.consume(obs, now, *queue, name, config)?),
            Command::AckUpTo { consumer, tag } => {
                Reply::Count(self.ack_up_to(obs, now, *consumer, *tag)?)
            }
            Command::Cancel { consumer, unread } => {
                self.cancel(obs, now, *consumer, unread)?;
                return Ok(None);
            }
            Command::Stats { queue } => Reply::Stats(
                self.live_queue(obs.shard, *queue)
                    .map(|q| Box::new(self.expected_stats(q))),
            ),
            Command::Close { queue } => Reply::Closed(self.close(obs, *queue).map(Box::new)),
            // The engine's model test covers these; the simulated clients never send them.
            Command::Stop { .. } | Command::Purge { .. } => {
                unreachable!("the simulated workload neither stops consumers nor purges")
            }
            Command::DeadLetters { letters } => {
                for letter in letters {
                    self.accept(obs, now, letter)?;
                }
                return Ok(None);
            }
            Command::Outcomes { outcomes } => {
                self.count_outcomes(obs, outcomes)?;
                return Ok(None);
            }
        };
        self.stats.errors += u64::from(is_error(&reply));
        Ok(Some(reply))
    }

    /// The key a lookup of `name` on `obs.shard` must find: the live queue of that name, if
    /// it is on that shard.
    fn lookup(&self, obs: &Obs, name: &str) -> Option<QueueKey> {
        self.setup
            .name_index(name)
            .and_then(|n| self.by_name[usize::from(n)])
            .filter(|&q| self.queues[q as usize].shard == obs.shard)
            .map(|q| self.queues[q as usize].key)
    }

    /// Settles `tag` with `op` in queue `q` (`None`: no live queue, so nothing settles) and
    /// checks the deliveries the settle causes; whether it took.
    fn settle_in(
        &mut self,
        obs: &Obs,
        q: Option<Q>,
        now: Tick,
        tag: DeliveryTag,
        op: Settle,
    ) -> Result<bool, Violation> {
        Ok(match q {
            Some(q) => {
                let ok = self.settle(q, now, tag, op);
                self.dispatch(obs, q, now, true)?;
                ok
            }
            None => false,
        })
    }

    fn declare(
        &mut self,
        obs: &Obs,
        name: &str,
        config: &QueueConfig,
    ) -> Result<Result<QueueKey, Error>, Violation> {
        let Some(n) = self.setup.name_index(name) else {
            return Ok(Err(Error::InvalidName));
        };
        // A dead-letter queue must be another queue: whether it is depends on the name.
        if !self.setup.is_valid(config) || config.dead_letter.as_deref() == Some(name) {
            return Ok(Err(Error::InvalidConfig(String::new())));
        }
        if let Some(q) = self.by_name[usize::from(n)] {
            let rec = &self.queues[q as usize];
            return Ok(if rec.config == *config {
                Ok(rec.key)
            } else {
                Err(Error::ConfigMismatch)
            });
        }
        match &obs.out.reply {
            Some(Reply::Declared(Ok(key))) => {
                self.new_queue(n, obs.shard, *key, config.clone())?;
                Ok(Ok(*key))
            }
            other => Err(Violation::new(
                "reply",
                format!("declaring a new queue {name:?} answered {other:?}"),
            )),
        }
    }

    /// The error a message gets before the duplicate check, if any.
    fn check_message(&self, q: Q, message: &Message) -> Option<Error> {
        if message
            .id()
            .is_some_and(|id| id.is_empty() || id.len() > MAX_ID_BYTES)
        {
            return Some(Error::InvalidMessage(String::new()));
        }
        if message.delay() > MAX_DURATION {
            return Some(Error::InvalidMessage(String::new()));
        }
        if message.body().len() > self.queues[q as usize].config.max_body_bytes {
            return Some(Error::MessageTooLarge);
        }
        None
    }

    fn is_full(&self, q: Q, adding: usize) -> bool {
        let rec = &self.queues[q as usize];
        rec.config
            .max_length
            .is_some_and(|max| rec.members.len() + adding > max)
    }

    fn put(
        &mut self,
        obs: &Obs,
        now: Tick,
        queue: QueueKey,
        message: &Message,
    ) -> Result<Result<PutOutcome, Error>, Violation> {
        let Some(q) = self.live_queue(obs.shard, queue) else {
            return Ok(Err(Error::QueueClosed));
        };
        if let Some(e) = self.check_message(q, message) {
            return Ok(Err(e));
        }
        let serial = self.serial_of(message.body())?;
        if let IdRec::Given(n) = self.msgs[serial as usize].id {
            if self.is_duplicate(q, n, now) {
                self.queues[q as usize].stats.duplicates += 1;
                self.stats.duplicates += 1;
                return Ok(Ok(PutOutcome::Duplicate));
            }
        }
        if self.is_full(q, 1) {
            return Ok(Err(Error::QueueFull));
        }
        let delay = self.setup.ticks(message.delay());
        self.enqueue(q, serial, now, delay);
        self.stats.puts += 1;
        self.dispatch(obs, q, now, true)?;
        Ok(Ok(PutOutcome::Enqueued))
    }

    fn put_batch(
        &mut self,
        obs: &Obs,
        now: Tick,
        queue: QueueKey,
        messages: &[Message],
    ) -> Result<Result<Vec<PutOutcome>, Error>, Violation> {
        let Some(q) = self.live_queue(obs.shard, queue) else {
            return Ok(Err(Error::QueueClosed));
        };
        let mut outcomes = Vec::with_capacity(messages.len());
        let mut ids = Vec::new();
        let mut accepted = 0;
        for message in messages {
            if let Some(e) = self.check_message(q, message) {
                return Ok(Err(e));
            }
            let serial = self.serial_of(message.body())?;
            let duplicate = match self.msgs[serial as usize].id {
                IdRec::Given(n) => {
                    self.is_duplicate(q, n, now) || ids.contains(&n) || {
                        ids.push(n);
                        false
                    }
                }
                _ => false,
            };
            if duplicate {
                outcomes.push(PutOutcome::Duplicate);
                continue;
            }
            accepted += 1;
            if self.is_full(q, accepted) {
                return Ok(Err(Error::QueueFull));
            }
            outcomes.push(PutOutcome::Enqueued);
        }
        for (message, outcome) in messages.iter().zip(&outcomes) {
            match outcome {
                PutOutcome::Enqueued => {
                    let serial = self.serial_of(message.body())?;
                    let delay = self.setup.ticks(message.delay());
                    self.enqueue(q, serial, now, delay);
                    self.stats.puts += 1;
                }
                PutOutcome::Duplicate => {
                    self.queues[q as usize].stats.duplicates += 1;
                    self.stats.duplicates += 1;
                }
            }
        }
        self.dispatch(obs, q, now, true)?;
        Ok(Ok(outcomes))
    }

    /// One settle on live queue `q`; dispatch is the caller's.
    fn settle(&mut self, q: Q, now: Tick, tag: DeliveryTag, op: Settle) -> bool {
        if let Settle::NackWithDelay(d) = op {
            if d > MAX_DURATION {
                return false;
            }
        }
        let Some(&lease) = self.queues[q as usize].leases.get(&tag.0) else {
            self.queues[q as usize].stats.stale += 1;
            self.stats.stale += 1;
            return false;
        };
        let serial = lease.serial;
        match op {
            Settle::Touch => {
                let rec = &mut self.queues[q as usize];
                let deadline = now + rec.ack;
                if rec
                    .max_lease
                    .is_some_and(|max| deadline > lease.delivered_at + max)
                {
                    return false;
                }
                rec.leases.get_mut(&tag.0).expect("live").deadline = deadline;
                self.schedule(q, deadline, tag.0);
                self.stats.touches += 1;
                return true;
            }
            Settle::Ack => {
                self.end_lease(q, tag.0);
                self.acked(q, serial, now);
            }
            Settle::Nack | Settle::NackWithDelay(_) => {
                self.end_lease(q, tag.0);
                let delay = match op {
                    Settle::NackWithDelay(d) => self.setup.ticks(d),
                    _ => {
                        let attempt = self.msgs[serial as usize].attempt;
                        self.retry_ticks(&self.queues[q as usize].config.retry, attempt)
                    }
                };
                self.queues[q as usize].stats.nacked += 1;
                self.stats.nacks += 1;
                self.come_back(q, serial, now, Back::Nacked(delay));
            }
            Settle::Reject => {
                self.end_lease(q, tag.0);
                self.queues[q as usize].stats.rejected += 1;
                self.stats.rejects += 1;
                self.dead_letter(q, serial, DeathReason::Rejected);
            }
            Settle::Release => {
                self.end_lease(q, tag.0);
                self.release(q, serial);
            }
        }
        true
    }

    fn acked(&mut self, q: Q, serial: u32, now: Tick) {
        self.queues[q as usize].stats.acked += 1;
        self.stats.acks += 1;
        self.leave(q, serial, now);
        self.msgs[serial as usize].place = Place::Acked { q };
    }

    /// Back to the front as if the delivery had not happened: no attempt spent.
    fn release(&mut self, q: Q, serial: u32) {
        self.queues[q as usize].stats.released += 1;
        self.stats.releases += 1;
        let m = &mut self.msgs[serial as usize];
        m.attempt -= 1;
        // The attempt given back may come back after a crash before its change is on disk.
        m.client.floor = m.client.floor.min(m.attempt);
        self.make_ready(q, serial, true);
    }

    fn consume(
        &mut self,
        obs: &Obs,
        now: Tick,
        queue: QueueKey,
        name: &str,
        config: &ConsumerConfig,
    ) -> Result<Result<ConsumerKey, Error>, Violation> {
        let Some(q) = self.live_queue(obs.shard, queue) else {
            return Ok(Err(Error::QueueClosed));
        };
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Ok(Err(Error::InvalidName));
        }
        if config.prefetch == 0 || config.prefetch > MAX_PREFETCH {
            return Ok(Err(Error::InvalidConfig(String::new())));
        }
        let rec = &self.queues[q as usize];
        if rec
            .consumers
            .iter()
            .any(|&c| self.consumers[c as usize].name == name)
        {
            return Ok(Err(Error::DuplicateConsumer));
        }
        let key = match &obs.out.reply {
            Some(Reply::Consumed(Ok(key))) => *key,
            other => {
                return Err(Violation::new(
                    "reply",
                    format!("consumer {name:?} should have joined, the engine answered {other:?}"),
                ))
            }
        };
        self.new_consumer(q, key, name.to_string(), config.prefetch)?;
        self.dispatch(obs, q, now, true)?;
        Ok(Ok(key))
    }

    fn ack_up_to(
        &mut self,
        obs: &Obs,
        now: Tick,
        consumer: ConsumerKey,
        up_to: DeliveryTag,
    ) -> Result<usize, Violation> {
        let Some(c) = self.live_consumer(obs.shard, consumer) else {
            return Ok(0);
        };
        let q = self.consumers[c as usize].q;
        let tags: Vec<(u64, u32)> = self.queues[q as usize]
            .leases
            .range(..=up_to.0)
            .filter(|(_, l)| l.consumer == c)
            .map(|(&t, l)| (t, l.serial))
            .collect();
        for &(tag, serial) in &tags {
            self.end_lease(q, tag);
            self.acked(q, serial, now);
        }
        self.dispatch(obs, q, now, true)?;
        Ok(tags.len())
    }

    fn cancel(
        &mut self,
        obs: &Obs,
        now: Tick,
        consumer: ConsumerKey,
        unread: &[DeliveryTag],
    ) -> Result<(), Violation> {
        let Some(c) = self.live_consumer(obs.shard, consumer) else {
            return Ok(());
        };
        let q = self.consumers[c as usize].q;
        for tag in unread {
            let lease = self.queues[q as usize].leases.get(&tag.0).copied();
            if let Some(lease) = lease.filter(|l| l.consumer == c) {
                self.end_lease(q, tag.0);
                self.release(q, lease.serial);
            }
        }
        let read: Vec<(u64, u32)> = self.queues[q as usize]
            .leases
            .iter()
            .filter(|(_, l)| l.consumer == c)
            .map(|(&t, l)| (t, l.serial))
            .collect();
        for (tag, serial) in read {
            self.end_lease(q, tag);
            self.come_back(q, serial, now, Back::Expired);
        }
        self.end_consumer(c);
        self.stats.cancels += 1;
        self.dispatch(obs, q, now, true)
    }

    fn end_consumer(&mut self, c: u32) {
        let rec = &mut self.consumers[c as usize];
        debug_assert_eq!(rec.held, 0);
        rec.live = false;
        self.gone.push(rec.key);
        let q = &mut self.queues[rec.q as usize];
        q.consumers.retain(|&x| x != c);
        q.free -= u64::from(rec.prefetch);
    }

    fn close(&mut self, obs: &Obs, queue: QueueKey) -> Option<leasemq_engine::QueueStats> {
        let q = self.live_queue(obs.shard, queue)?;
        let frozen = self.expected_stats(q).frozen();
        for c in self.queues[q as usize].consumers.clone() {
            let rec = &mut self.consumers[c as usize];
            rec.live = false;
            rec.held = 0;
            self.gone.push(rec.key);
        }
        let rec = &mut self.queues[q as usize];
        rec.live = false;
        rec.consumers.clear();
        rec.free = 0;
        rec.leases.clear();
        rec.events.clear();
        rec.dedup.clear();
        (rec.ready, rec.returned, rec.delayed) = (0, 0, 0);
        for serial in std::mem::take(&mut rec.members) {
            self.msgs[serial as usize].place = Place::Closed { q };
        }
        self.by_name[usize::from(rec.name)] = None;
        self.just_closed.push(q);
        self.stats.closes += 1;
        Some(frozen)
    }

    /// A dead letter arriving at this shard: enqueued in the live queue of its name, or
    /// refused (no such queue, too large, duplicate id, full).
    fn accept(&mut self, obs: &Obs, now: Tick, letter: &DeadLetter) -> Result<(), Violation> {
        let serial = self.letter_serial(letter)?;
        if !matches!(self.msgs[serial as usize].place, Place::InFlight { .. }) {
            return Err(Violation::new(
                "dead-letter",
                format!(
                    "a dead letter arrived for {}, which is not in flight",
                    self.describe(serial)
                ),
            ));
        }
        let target = self
            .setup
            .name_index(&letter.to)
            .and_then(|n| self.by_name[usize::from(n)])
            .filter(|&q| self.queues[q as usize].shard == obs.shard);
        let accepted = target.filter(|&q| {
            let too_large = letter.body.len() > self.queues[q as usize].config.max_body_bytes;
            let duplicate = match self.msgs[serial as usize].id {
                IdRec::Given(n) => self.is_duplicate(q, n, now),
                _ => false,
            };
            !too_large && !duplicate && !self.is_full(q, 1)
        });
        self.outcomes.push(DeathOutcome {
            origin: letter.origin,
            accepted: accepted.is_some(),
        });
        let Place::InFlight { from } = self.msgs[serial as usize].place else {
            unreachable!("checked above")
        };
        match accepted {
            Some(q) => {
                if self.msgs[serial as usize].death.is_some() {
                    self.stats.chained += 1;
                }
                self.msgs[serial as usize].death = Some(letter.death.clone());
                self.enqueue(q, serial, now, 0);
                self.stats.dead_letters += 1;
                self.dispatch(obs, q, now, true)
            }
            None => {
                self.msgs[serial as usize].place = Place::Dropped { from };
                self.stats.dropped += 1;
                Ok(())
            }
        }
    }

    fn count_outcomes(&mut self, obs: &Obs, outcomes: &[DeathOutcome]) -> Result<(), Violation> {
        for outcome in outcomes {
            if outcome.origin.shard != obs.shard {
                return Err(Violation::new(
                    "outcome",
                    format!(
                        "shard {} was handed an outcome for shard {}",
                        obs.shard, outcome.origin.shard
                    ),
                ));
            }
            let dying = self
                .dying
                .remove(&(outcome.origin.shard, outcome.origin.msg));
            if let (Some(q), Some(serial)) =
                (self.live_queue(obs.shard, outcome.origin.queue), dying)
            {
                if let IdRec::Given(n) = self.msgs[serial as usize].id {
                    let now = self.shard_now[usize::from(obs.shard)];
                    let rec = &mut self.queues[q as usize];
                    if let Some(d) = rec.dedup.get_mut(&n) {
                        d.live = false;
                        if d.until <= now {
                            rec.dedup.remove(&n);
                        }
                    }
                }
            }
            if let Some(q) = self.live_queue(obs.shard, outcome.origin.queue) {
                let stats = &mut self.queues[q as usize].stats;
                if outcome.accepted {
                    stats.dead_lettered += 1;
                } else {
                    stats.dropped += 1;
                }
            }
        }
        Ok(())
    }
}

/// Whether `reply` answers with an error, as the run's stats count them.
fn is_error(reply: &Reply) -> bool {
    match reply {
        Reply::Declared(r) => r.is_err(),
        Reply::Put(r) => r.is_err(),
        Reply::PutBatch(r) => r.is_err(),
        Reply::Consumed(r) => r.is_err(),
        _ => false,
    }
}
