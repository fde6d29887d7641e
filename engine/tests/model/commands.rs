use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use leasemq_engine::{
    DeathReason, DeathRecord, Error, Overflow, PutOutcome, QueueConfig, QueueStats, Settle,
};

use crate::model::{
    check_config, valid_queue_name, Answer, Coverage, Id, Letter, Model, ModelConsumer,
    ModelEffects, ModelQueue, Msg, State,
};
use crate::ops::{MessageSpec, Op, Step};
use crate::{ms, retry_ticks, Tick, SEVEN_DAYS};

impl Model {
    // ----- commands ----------------------------------------------------------------------

    /// Carries out one step at `step.at`: timers due by then first, then the command, then
    /// the dead letters it caused, then what their queues answered.
    pub(crate) fn apply(&mut self, step: &Step) -> Answer {
        self.fx = ModelEffects::default();
        self.run_timers(step.at);
        let answer = match &step.op {
            Op::Wait => Answer::Silent,
            Op::Declare { name, config } => Answer::Declared(self.declare(name, config)),
            Op::Put { queue, message } => Answer::Put(self.put(*queue, message)),
            Op::PutBatch { queue, messages } => Answer::PutBatch(self.put_batch(*queue, messages)),
            Op::Consume {
                queue,
                name,
                prefetch,
                priority,
                ack_timeout,
            } => Answer::Consumed(self.consume(*queue, name, (*prefetch, *priority, *ack_timeout))),
            Op::Cancel { consumer, unread } => {
                self.cancel(*consumer, unread);
                Answer::Silent
            }
            Op::Stop { consumer, unread } => {
                self.stop(*consumer, unread);
                Answer::Silent
            }
            Op::Purge { queue } => Answer::Purged(self.purge(*queue)),
            Op::Settle { queue, tag, settle } => {
                Answer::Settled(self.settle(*queue, *tag, *settle))
            }
            Op::SettleBatch { queue, settles } => Answer::SettledBatch(
                (settles.iter())
                    .map(|&(tag, settle)| self.settle(*queue, tag, settle))
                    .collect(),
            ),
            Op::AckUpTo { consumer, tag } => Answer::Count(self.ack_up_to(*consumer, *tag)),
            Op::Stats { queue } => {
                Answer::Stats(self.queues[*queue].open.then(|| self.stats(*queue)))
            }
            Op::Lookup { name } => Answer::Found(self.lookup(name)),
            Op::Close { queue } => Answer::Closed(self.close(*queue)),
        };
        self.route_letters();
        answer
    }

    fn declare(&mut self, name: &str, config: &QueueConfig) -> Result<usize, Error> {
        if !valid_queue_name(name) {
            return Err(Error::InvalidName);
        }
        check_config(name, config)?;
        if let Some(q) = self.lookup(name) {
            return if self.queues[q].config == *config {
                Ok(q)
            } else {
                Err(Error::ConfigMismatch)
            };
        }
        self.queues.push(ModelQueue {
            name: name.to_string(),
            config: config.clone(),
            open: true,
            msgs: BTreeMap::new(),
            returned: VecDeque::new(),
            fresh: VecDeque::new(),
            leases: BTreeMap::new(),
            next_tag: 1,
            consumers: Vec::new(),
            last_served: BTreeMap::new(),
            latest: None,
            windows: BTreeMap::new(),
            counters: QueueStats::default(),
        });
        Ok(self.queues.len() - 1)
    }

    fn check_message(&self, q: usize, spec: &MessageSpec) -> Result<(), Error> {
        if spec.id().is_some_and(|id| id.is_empty() || id.len() > 1024) {
            return Err(Error::InvalidMessage(String::new()));
        }
        if spec.delay > SEVEN_DAYS {
            return Err(Error::InvalidMessage(String::new()));
        }
        if spec.body.len() > self.queues[q].config.max_body_bytes {
            return Err(Error::MessageTooLarge);
        }
        Ok(())
    }

    /// Live in the queue, or first enqueued less than `dedup_window` ago.
    fn is_duplicate(&self, q: usize, id: &str) -> bool {
        let queue = &self.queues[q];
        let live = queue
            .msgs
            .values()
            .any(|m| m.id == Id::Given(id.to_string()));
        let windowed = queue.windows.get(id).is_some_and(|&end| self.now < end);
        live || windowed
    }

    /// Live messages count for `max_length`; with `DropHead` only those not leased.
    fn counted(&self, q: usize) -> usize {
        let queue = &self.queues[q];
        let msgs = queue.msgs.values();
        match queue.config.overflow {
            Overflow::RejectPublish => msgs.count(),
            Overflow::DropHead => msgs
                .filter(|m| !matches!(m.state, State::Leased(_)))
                .count(),
        }
    }

    fn is_full(&self, q: usize, adding: usize) -> bool {
        let max_length = self.queues[q].config.max_length;
        max_length.is_some_and(|max| self.counted(q) + adding > max)
    }

    /// Makes room in a full queue that drops its head: its oldest ready message (returned
    /// ones first, as dispatch takes them) is dropped and counted. False where the queue
    /// refuses instead, or has nothing ready.
    fn drop_head(&mut self, q: usize) -> bool {
        if self.queues[q].config.overflow != Overflow::DropHead {
            return false;
        }
        let Some(msg) = self.take_head(q) else {
            return false;
        };
        let queue = &mut self.queues[q];
        queue.msgs.remove(&msg).expect("live");
        queue.counters.dropped += 1;
        self.coverage.heads_dropped += 1;
        true
    }

    fn new_id(&mut self, spec: &MessageSpec) -> Id {
        match spec.id() {
            Some(id) => Id::Given(id),
            None => {
                self.next_auto += 1;
                Id::Auto(self.next_auto)
            }
        }
    }

    fn enqueue(
        &mut self,
        q: usize,
        id: Id,
        body: String,
        priority: u8,
        delay: Tick,
        death: Option<DeathRecord>,
    ) {
        let seq = self.seq();
        let now = self.now;
        let msg = self.next_msg;
        self.next_msg += 1;
        let queue = &mut self.queues[q];
        let window = self.tick.of(queue.config.dedup_window);
        if let (Id::Given(given), true) = (&id, window > 0) {
            queue.windows.insert(given.clone(), now + window);
        }
        let state = if delay == 0 {
            queue.fresh.push_back(msg);
            State::Ready
        } else {
            State::Delayed {
                since: now,
                until: now + delay,
                seq,
                retry: false,
            }
        };
        let m = Msg {
            id,
            body,
            attempt: 0,
            priority,
            death,
            state,
        };
        queue.msgs.insert(msg, m);
        queue.counters.enqueued += 1;
    }

    fn put(&mut self, q: usize, spec: &MessageSpec) -> Result<PutOutcome, Error> {
        if !self.queues[q].open {
            return Err(Error::QueueClosed);
        }
        self.check_message(q, spec)?;
        if spec.id().is_some_and(|id| self.is_duplicate(q, &id)) {
            self.queues[q].counters.duplicates += 1;
            return Ok(PutOutcome::Duplicate);
        }
        if self.is_full(q, 1) && !self.drop_head(q) {
            self.coverage.queue_full += 1;
            return Err(Error::QueueFull);
        }
        let id = self.new_id(spec);
        let delay = self.tick.of(spec.delay);
        self.enqueue(q, id, spec.body.clone(), spec.priority, delay, None);
        self.dispatch(q);
        Ok(PutOutcome::Enqueued)
    }

    /// As if each message were put in turn, except that the first error leaves the queue as
    /// it was.
    fn put_batch(&mut self, q: usize, specs: &[MessageSpec]) -> Result<Vec<PutOutcome>, Error> {
        if !self.queues[q].open {
            return Err(Error::QueueClosed);
        }
        let mut outcomes = Vec::new();
        let mut taken: Vec<String> = Vec::new();
        // Live and ready messages after each message of the batch is put in turn.
        let queue = &self.queues[q];
        let (mut counted, mut ready) = (self.counted(q), queue.returned.len() + queue.fresh.len());
        for spec in specs {
            self.check_message(q, spec)?;
            if let Some(id) = spec.id() {
                if self.is_duplicate(q, &id) || taken.contains(&id) {
                    outcomes.push(PutOutcome::Duplicate);
                    continue;
                }
                taken.push(id);
            }
            let config = &self.queues[q].config;
            if config.max_length.is_some_and(|max| counted + 1 > max) {
                if config.overflow != Overflow::DropHead || ready == 0 {
                    self.coverage.queue_full += 1;
                    return Err(Error::QueueFull);
                }
                (counted, ready) = (counted - 1, ready - 1);
            }
            counted += 1;
            ready += usize::from(self.tick.of(spec.delay) == 0);
            outcomes.push(PutOutcome::Enqueued);
        }
        for (spec, outcome) in specs.iter().zip(&outcomes) {
            match outcome {
                PutOutcome::Enqueued => {
                    if self.is_full(q, 1) {
                        assert!(self.drop_head(q), "the check above left a ready head");
                    }
                    let id = self.new_id(spec);
                    let delay = self.tick.of(spec.delay);
                    self.enqueue(q, id, spec.body.clone(), spec.priority, delay, None);
                }
                PutOutcome::Duplicate => self.queues[q].counters.duplicates += 1,
            }
        }
        self.dispatch(q);
        Ok(outcomes)
    }

    fn consume(
        &mut self,
        q: usize,
        name: &str,
        (prefetch, priority, ack_timeout): (u32, i64, Option<Duration>),
    ) -> Result<usize, Error> {
        if !self.queues[q].open {
            return Err(Error::QueueClosed);
        }
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidName);
        }
        if prefetch == 0 || prefetch > 65_535 {
            return Err(Error::InvalidConfig(String::new()));
        }
        if let Some(lease) = ack_timeout {
            let max_lease = self.queues[q].config.max_lease;
            if lease < ms(1) || lease > SEVEN_DAYS || max_lease.is_some_and(|m| lease > m) {
                return Err(Error::InvalidConfig(String::new()));
            }
        }
        let consumers = &self.consumers;
        if (self.queues[q].consumers.iter()).any(|&c| consumers[c].name == name) {
            return Err(Error::DuplicateConsumer);
        }
        self.consumers.push(ModelConsumer {
            queue: q,
            name: name.to_string(),
            prefetch,
            priority,
            ack_timeout,
            open: true,
            stopped: false,
            tags: Vec::new(),
        });
        let c = self.consumers.len() - 1;
        self.queues[q].consumers.push(c);
        self.dispatch(q);
        Ok(c)
    }

    /// The read leases come back like an expiry (to the back, in tag order, may die); the
    /// unread ones are released to the front in channel order, costing no attempt.
    fn cancel(&mut self, c: usize, unread: &[u64]) {
        if !self.consumers[c].open {
            return;
        }
        let q = self.consumers[c].queue;
        let leases = &self.queues[q].leases;
        let ours = |tag: &u64| leases.get(tag).is_some_and(|l| l.consumer == c);
        let unread: Vec<u64> = unread.iter().copied().filter(ours).collect();
        let read: Vec<u64> = (leases.iter())
            .filter(|(tag, l)| l.consumer == c && !unread.contains(tag))
            .map(|(&tag, _)| tag)
            .collect();
        for tag in read {
            let lease = self.queues[q].leases.remove(&tag).expect("live");
            self.come_back(q, lease.msg, 0);
        }
        self.queues[q].counters.released += unread.len() as u64;
        self.coverage.unread_released += unread.len() as u64;
        for tag in unread.iter().rev() {
            let lease = self.queues[q].leases.remove(tag).expect("live");
            self.release(q, lease.msg);
        }
        self.queues[q].consumers.retain(|&other| other != c);
        self.consumers[c].open = false;
        self.fx.gone.push(c);
        self.dispatch(q);
    }

    /// No more deliveries to `c`; its unread ones are released, the rest stay leased to it.
    fn stop(&mut self, c: usize, unread: &[u64]) {
        if !self.consumers[c].open {
            return;
        }
        let q = self.consumers[c].queue;
        let leases = &self.queues[q].leases;
        let ours = |tag: &u64| leases.get(tag).is_some_and(|l| l.consumer == c);
        let unread: Vec<u64> = unread.iter().copied().filter(ours).collect();
        self.queues[q].counters.released += unread.len() as u64;
        for tag in unread.iter().rev() {
            let lease = self.queues[q].leases.remove(tag).expect("live");
            self.release(q, lease.msg);
        }
        self.consumers[c].stopped = true;
        let still_held = (self.queues[q].leases.values()).any(|l| l.consumer == c);
        self.coverage.stopped_with_leases += u64::from(still_held);
        self.dispatch(q);
    }

    /// Removes the ready and delayed messages; leased ones stay.
    fn purge(&mut self, q: usize) -> Result<usize, Error> {
        let queue = &mut self.queues[q];
        if !queue.open {
            return Err(Error::QueueClosed);
        }
        let before = queue.msgs.len();
        queue
            .msgs
            .retain(|_, m| matches!(m.state, State::Leased(_)));
        queue.returned.clear();
        queue.fresh.clear();
        let purged = before - queue.msgs.len();
        self.coverage.purged += purged as u64;
        Ok(purged)
    }

    fn settle(&mut self, q: usize, tag: u64, settle: Settle) -> bool {
        if !self.queues[q].open {
            return false;
        }
        if matches!(settle, Settle::NackWithDelay(d) if d > SEVEN_DAYS) {
            return false;
        }
        let queue = &mut self.queues[q];
        if !queue.leases.contains_key(&tag) {
            queue.counters.stale += 1;
            return false;
        }
        if settle == Settle::Touch {
            return self.touch(q, tag);
        }
        let lease = queue.leases.remove(&tag).expect("live");
        match settle {
            Settle::Ack => {
                queue.counters.acked += 1;
                queue.msgs.remove(&lease.msg);
            }
            Settle::Nack => {
                queue.counters.nacked += 1;
                let attempt = queue.msgs[&lease.msg].attempt;
                let delay = retry_ticks(self.tick, &queue.config.retry, attempt);
                self.come_back(q, lease.msg, delay);
            }
            Settle::NackWithDelay(delay) => {
                queue.counters.nacked += 1;
                self.come_back(q, lease.msg, self.tick.of(delay));
            }
            Settle::Reject => {
                queue.counters.rejected += 1;
                self.dead_letter(q, lease.msg, DeathReason::Rejected);
            }
            Settle::Release => {
                queue.counters.released += 1;
                self.release(q, lease.msg);
            }
            Settle::Touch => unreachable!(),
        }
        self.dispatch(q);
        true
    }

    /// The lease clock restarts, unless the lease would then outlast `max_lease`.
    fn touch(&mut self, q: usize, tag: u64) -> bool {
        let seq = self.seq();
        let now = self.now;
        let queue = &mut self.queues[q];
        let consumer = queue.leases[&tag].consumer;
        let lease_length =
            (self.consumers[consumer].ack_timeout).unwrap_or(queue.config.ack_timeout);
        let deadline = now + self.tick.of(lease_length);
        let lease = queue.leases.get_mut(&tag).expect("live");
        if (queue.config.max_lease)
            .is_some_and(|max| deadline > lease.delivered_at + self.tick.of(max))
        {
            self.coverage.touch_refused += 1;
            return false;
        }
        lease.prev_deadline = Some(lease.deadline);
        lease.deadline = deadline;
        lease.seq = seq;
        true
    }

    fn ack_up_to(&mut self, c: usize, up_to: u64) -> usize {
        if !self.consumers[c].open {
            return 0;
        }
        let q = self.consumers[c].queue;
        let queue = &mut self.queues[q];
        let tags: Vec<u64> = (queue.leases.iter())
            .filter(|(&tag, l)| l.consumer == c && tag <= up_to)
            .map(|(&tag, _)| tag)
            .collect();
        for tag in &tags {
            let lease = queue.leases.remove(tag).expect("live");
            queue.msgs.remove(&lease.msg);
            queue.counters.acked += 1;
        }
        if !tags.is_empty() {
            self.dispatch(q);
        }
        tags.len()
    }

    fn close(&mut self, q: usize) -> Option<QueueStats> {
        if !self.queues[q].open {
            return None;
        }
        self.coverage.closes += 1;
        let queue = &mut self.queues[q];
        for &c in &queue.consumers {
            self.consumers[c].open = false;
            self.fx.gone.push(c);
        }
        queue.open = false;
        queue.msgs.clear();
        queue.returned.clear();
        queue.fresh.clear();
        queue.leases.clear();
        queue.consumers.clear();
        queue.windows.clear();
        Some(queue.counters.clone())
    }

    /// The dead-letter queue is looked up by name now; it takes the letter as a fresh message
    /// keeping its id, or refuses it (closed, too large, duplicate id, full). Then each origin
    /// still open counts the letter in `dead_lettered` or `dropped`.
    fn route_letters(&mut self) {
        for letter in self.fx.letters.clone() {
            let accepted = match self.lookup(&letter.to) {
                Some(q) => self.accept(q, &letter),
                None => false,
            };
            self.fx.outcomes.push((letter.origin, accepted));
        }
        for (origin, accepted) in self.fx.outcomes.clone() {
            let queue = &mut self.queues[origin];
            if !queue.open {
                continue;
            }
            if accepted {
                queue.counters.dead_lettered += 1;
            } else {
                queue.counters.dropped += 1;
            }
        }
    }

    fn accept(&mut self, q: usize, letter: &Letter) -> bool {
        if letter.body.len() > self.queues[q].config.max_body_bytes {
            return false;
        }
        if matches!(&letter.id, Id::Given(id) if self.is_duplicate(q, id)) {
            return false;
        }
        if self.is_full(q, 1) && !self.drop_head(q) {
            return false;
        }
        let (id, body, death) = (letter.id.clone(), letter.body.clone(), letter.death.clone());
        self.enqueue(q, id, body, letter.priority, 0, Some(death));
        self.dispatch(q);
        true
    }

    /// What this run went through, the counters of every queue included.
    pub(crate) fn coverage(&self) -> Coverage {
        let mut c = self.coverage.clone();
        for s in self.queues.iter().map(|q| &q.counters) {
            c.expired += s.expired;
            c.nacked += s.nacked;
            c.released += s.released;
            c.rejected += s.rejected;
            c.duplicates += s.duplicates;
            c.stale += s.stale;
            c.dead_lettered += s.dead_lettered;
            c.dropped += s.dropped;
        }
        c
    }
}
