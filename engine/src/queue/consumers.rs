//! A queue's consumers and its end: registering, cancelling, closing, and the cross-check
//! of its bookkeeping that tests run after every step.

use slab::Slab;

use super::{ConsumerState, Ctx, MsgId, MsgState, QueueState, Return, Timer};
use crate::command::ConsumerKey;
use crate::types::{ConsumerConfig, DeliveryTag, QueueStats};
use crate::wheel::{Tick, Wheel};

impl QueueState {
    pub fn has_consumer(&self, consumers: &Slab<ConsumerState>, name: &str) -> bool {
        self.consumers
            .iter()
            .any(|&slot| consumers[slot as usize].name == name)
    }

    /// Lists a new consumer after those of its priority and above, and hands it what is
    /// ready.
    pub fn add_consumer(&mut self, ctx: &mut Ctx, slot: u32, config: &ConsumerConfig) {
        debug_assert!(config.prefetch > 0);
        let consumer = &mut ctx.consumers[slot as usize];
        consumer.order = self.next_order;
        self.next_order += 1;
        let priority = consumer.priority;
        let pos = self
            .consumers
            .partition_point(|&s| ctx.consumers[s as usize].priority >= priority);
        self.consumers.insert(pos, slot);
        self.prioritized = self.priorities_differ(ctx.consumers);
        self.with_credit += 1;
        self.dispatch(ctx);
    }

    /// Whether the first and last consumers (the highest and lowest priority) differ.
    fn priorities_differ(&self, consumers: &Slab<ConsumerState>) -> bool {
        match (self.consumers.first(), self.consumers.last()) {
            (Some(&a), Some(&b)) => {
                consumers[a as usize].priority != consumers[b as usize].priority
            }
            _ => false,
        }
    }

    /// Ends a consumer: its unread deliveries are released (no attempt spent), the ones it
    /// read come back like an expiry (without counting as one).
    pub fn cancel(&mut self, ctx: &mut Ctx, slot: u32, unread: &[DeliveryTag]) {
        let pos = self
            .consumers
            .iter()
            .position(|&s| s == slot)
            .expect("a live consumer is listed by its queue");
        let unread_msgs = self.take_unread(ctx, slot, unread);
        let read: Vec<u64> = ctx.consumers[slot as usize].tags.take().collect();
        for tag in read {
            if let Some(lease) = self.take_lease(ctx, tag) {
                self.come_back(ctx, lease.msg, Return::Expired);
            }
        }
        self.release_unread(ctx, &unread_msgs);
        if ctx.consumers[slot as usize].stopped {
            self.stopped -= 1;
        }
        self.consumers.remove(pos);
        let consumer = ctx.consumers.remove(slot as usize);
        self.prioritized = self.priorities_differ(ctx.consumers);
        // The round robin of a priority no consumer has any more is forgotten: one
        // registered later starts it afresh, after every consumer gone.
        let priority = consumer.priority;
        if !(self.consumers.iter()).any(|&s| ctx.consumers[s as usize].priority == priority) {
            self.last_served
                .retain(|served| served.priority != priority);
        }
        if consumer.has_credit() {
            self.with_credit -= 1;
        }
        ctx.out.consumers_gone.push(ConsumerKey {
            idx: slot,
            gen: consumer.gen,
        });
        self.dispatch(ctx);
    }

    /// Stops a consumer: it gets no more deliveries, and its unread ones are released (no
    /// attempt spent). The leases it read stay its own until they are settled, run out, or
    /// it is cancelled (AMQP's `basic.cancel`: the work in hand can still be acked).
    pub fn stop(&mut self, ctx: &mut Ctx, slot: u32, unread: &[DeliveryTag]) {
        let unread_msgs = self.take_unread(ctx, slot, unread);
        let consumer = &mut ctx.consumers[slot as usize];
        if !consumer.stopped {
            if consumer.has_credit() {
                self.with_credit -= 1;
            }
            consumer.stopped = true;
            self.stopped += 1;
        }
        self.release_unread(ctx, &unread_msgs);
        self.dispatch(ctx);
    }

    /// Ends the leases of `unread` that `slot` holds; returns their messages, in order.
    fn take_unread(&mut self, ctx: &mut Ctx, slot: u32, unread: &[DeliveryTag]) -> Vec<u32> {
        let mut msgs = Vec::new();
        for tag in unread {
            let ours = self.leases.get(tag.0).is_some_and(|l| l.consumer == slot);
            if ours {
                let lease = self.take_lease(ctx, tag.0).expect("checked live");
                msgs.push(lease.msg);
            }
        }
        msgs
    }

    /// Puts messages a consumer never read back at the front, in their order, without
    /// spending an attempt.
    fn release_unread(&mut self, ctx: &mut Ctx, msgs: &[u32]) {
        self.stats.released += msgs.len() as u64;
        for &msg in msgs.iter().rev() {
            self.requeue(ctx, msg, Return::Released);
        }
    }

    /// Removes every message that is not leased (ready and delayed); returns how many.
    /// Leased ones stay, and so does the dedup window of each id removed.
    pub fn purge(&mut self, ctx: &mut Ctx) -> usize {
        let mut gone = Vec::with_capacity(self.ready.len() + self.delayed);
        while let Some(msg) = self.ready.pop_front() {
            gone.push(msg);
        }
        if self.delayed > 0 {
            for (idx, msg) in self.msgs.iter() {
                if let MsgState::Delayed(timer) = msg.state {
                    ctx.wheel.cancel(timer);
                    gone.push(idx as u32);
                }
            }
            self.delayed = 0;
        }
        for &msg in &gone {
            let m = self.remove_message(msg);
            self.log_removed(ctx, m.seq);
        }
        gone.len()
    }

    /// Drops everything: consumers, leases, messages, timers. Returns the frozen stats.
    pub fn close(mut self, ctx: &mut Ctx) -> QueueStats {
        for &slot in &self.consumers {
            let consumer = ctx.consumers.remove(slot as usize);
            ctx.out.consumers_gone.push(ConsumerKey {
                idx: slot,
                gen: consumer.gen,
            });
        }
        for (_, lease) in self.leases.iter() {
            ctx.wheel.cancel(lease.timer);
        }
        for (_, msg) in self.msgs.iter() {
            if let MsgState::Delayed(timer) = msg.state {
                ctx.wheel.cancel(timer);
            }
        }
        for (_, entry) in self.dedup.drain() {
            if let Some(timer) = entry.window {
                ctx.wheel.cancel(timer);
            }
        }
        self.stats.frozen()
    }

    /// Timers this queue has in the wheel: one per lease, delayed message and open dedup window.
    pub fn timer_count(&self) -> usize {
        let windows = self.dedup.values().filter(|e| e.window.is_some()).count();
        self.leases.len() + self.delayed + windows
    }

    /// Cross-checks the queue's bookkeeping; tests call it after every step.
    pub fn check_invariants(
        &self,
        now: Tick,
        consumers: &Slab<ConsumerState>,
        wheel: &Wheel<Timer>,
    ) {
        let ready = self.check_messages(wheel);
        let (credit, held_total) = self.check_consumers(now, consumers, wheel);
        assert_eq!(credit, self.with_credit, "consumers with credit");
        assert_eq!(
            held_total,
            self.leases.len(),
            "every lease has its consumer"
        );
        if self.with_credit > 0 {
            assert_eq!(ready, 0, "ready messages wait only when nobody has credit");
        }
        for (id, entry) in &self.dedup {
            assert!(
                entry.live || entry.window.is_some(),
                "dedup entry {id} kept for nothing"
            );
        }
    }

    /// The messages against the ready lists, the wheel and the lease table; the number
    /// of ready ones.
    fn check_messages(&self, wheel: &Wheel<Timer>) -> usize {
        let mut ready = 0;
        let mut delayed = 0;
        let mut leased = 0;
        for (idx, msg) in self.msgs.iter() {
            match msg.state {
                MsgState::Ready => ready += 1,
                MsgState::Delayed(timer) => {
                    delayed += 1;
                    assert!(
                        matches!(wheel.get(timer), Timer::Ready { msg, .. } if *msg as usize == idx),
                        "a delayed message's timer points at it"
                    );
                }
                MsgState::Leased(tag) => {
                    leased += 1;
                    let lease = self.leases.get(tag).expect("a leased message has a lease");
                    assert_eq!(lease.msg as usize, idx, "lease points back");
                }
            }
            if let MsgId::Given(id) = &msg.id {
                assert!(
                    self.dedup.get(&**id).is_some_and(|e| e.live),
                    "live id indexed"
                );
            }
        }
        assert_eq!(ready, self.ready.len(), "ready lists");
        self.ready.check_invariants();
        for (level, msg) in self.ready.iter() {
            let m = &self.msgs[msg as usize];
            assert_eq!(
                m.state,
                MsgState::Ready,
                "a ready list holds a ready message"
            );
            assert_eq!(
                level,
                self.ready.level_of(m.priority),
                "its priority's level"
            );
        }
        assert_eq!(delayed, self.delayed, "delayed count");
        assert_eq!(leased, self.leases.len(), "lease table");
        self.leases.check_invariants();
        ready
    }

    /// The consumers' order, leases, credit and prefetch; how many have credit and how
    /// many leases they hold.
    fn check_consumers(
        &self,
        now: Tick,
        consumers: &Slab<ConsumerState>,
        wheel: &Wheel<Timer>,
    ) -> (usize, usize) {
        let priorities: Vec<i64> = (self.consumers.iter())
            .map(|&slot| consumers[slot as usize].priority)
            .collect();
        assert_eq!(
            self.prioritized,
            priorities.first() != priorities.last(),
            "prioritized when priorities differ"
        );
        for served in &self.last_served {
            assert!(
                priorities.contains(&served.priority),
                "a round robin kept only for a priority listed"
            );
            assert!(served.order < self.next_order, "served one that was listed");
        }
        let orders = (self.consumers.iter()).map(|&slot| {
            let c = &consumers[slot as usize];
            (c.priority, std::cmp::Reverse(c.order))
        });
        assert!(
            orders.collect::<Vec<_>>().is_sorted_by(|a, b| a > b),
            "listed by priority, highest first, and by registration within a priority"
        );
        let mut credit = 0;
        let mut held_total = 0;
        for &slot in &self.consumers {
            let c = &consumers[slot as usize];
            assert_eq!(c.queue, self.key.idx, "consumer's queue");
            let mut held = 0;
            let mut previous = 0;
            for tag in c.tags.iter() {
                assert!(previous < tag, "consumer tags in order");
                previous = tag;
                if let Some(lease) = self.leases.get(tag) {
                    assert_eq!(lease.consumer, slot, "lease in its consumer's list");
                    let deadline = wheel.deadline(lease.timer);
                    assert!(deadline > now, "a live lease's deadline is ahead");
                    held += 1;
                }
            }
            assert_eq!(c.held, held, "held count");
            assert!(c.held <= c.prefetch, "prefetch respected");
            credit += usize::from(c.has_credit());
            held_total += held as usize;
        }
        (credit, held_total)
    }
}
