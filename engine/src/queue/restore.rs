//! Rebuilding a durable queue from its logged changes (see `durable.rs`).
//!
//! While changes are applied the queue is a bag of messages with attempts and live ids:
//! nothing is in a ready list, no timer is set. [`QueueState::finish_restore`] then sets
//! the delays and dedup windows that have not ended and lines the ready messages up:
//! those delivered before (leased or returned at the crash) first, then fresh ones, each
//! in the order they were first enqueued (contract §7 item 3).

use std::sync::Arc;

use bytes::Bytes;

use super::{Ctx, DedupEntry, Msg, MsgId, MsgState, QueueState, Timer};
use crate::durable::{Change, RestoreError};
use crate::leases::LeaseTable;
use crate::restore::{ended, Pending};
use crate::types::{DeathReason, DeathRecord};
use crate::wheel::{Tick, Wheel};

impl QueueState {
    /// Adds a logged message; returns its slot.
    pub fn restore_enqueue(
        &mut self,
        seq: u64,
        id: MsgId,
        body: Bytes,
        attempt: u32,
        priority: u8,
        death: Option<Box<DeathRecord>>,
    ) -> Result<u32, RestoreError> {
        match &id {
            MsgId::Given(given) => {
                self.watch_auto_shaped(Some(given));
                let entry = self.dedup.entry(given.clone()).or_insert(DedupEntry {
                    live: false,
                    window: None,
                });
                if entry.live {
                    return Err(RestoreError(format!(
                        "queue {:?}: id {given:?} enqueued twice while live",
                        &*self.name
                    )));
                }
                entry.live = true;
            }
            MsgId::Auto(n) => {
                if let Some(live) = &mut self.auto_live {
                    live.insert(*n);
                }
            }
        }
        let slot = self.msgs.insert(Msg {
            seq,
            id,
            body,
            attempt,
            priority,
            death,
            state: MsgState::Ready,
        });
        Ok(slot as u32)
    }

    /// A logged delivery or return: the message's attempt now.
    pub fn restore_attempt(&mut self, slot: u32, attempt: u32) {
        self.msgs[slot as usize].attempt = attempt;
    }

    /// Tags handed out after the restart start at `next` or later.
    pub fn restore_next_tag(&mut self, next: u64) {
        debug_assert_eq!(self.leases.len(), 0, "no lease is live while restoring");
        if next > self.leases.next_tag() {
            self.leases = LeaseTable::new(next);
        }
    }

    /// A logged removal (ack, drop, dead letter taken).
    pub fn restore_remove(&mut self, slot: u32) {
        self.remove_message(slot);
    }

    /// Ends the restore: `ready_at` says when a message becomes ready (a tick after now,
    /// or `None` for at once), `windows` the dedup windows still open.
    pub fn finish_restore(
        &mut self,
        ctx: &mut Ctx,
        ready_at: impl Fn(u64) -> Option<Tick>,
        windows: Vec<(Arc<str>, Tick)>,
    ) {
        let mut ready: Vec<(u64, u32, bool)> = Vec::new();
        let mut delayed: Vec<(u64, u32, Tick)> = Vec::new();
        for (slot, msg) in self.msgs.iter() {
            match ready_at(msg.seq) {
                Some(at) => delayed.push((msg.seq, slot as u32, at)),
                None => ready.push((msg.seq, slot as u32, msg.attempt > 0)),
            }
        }
        // Timers of one deadline fire in the order they were set: that of first enqueue,
        // whatever slots the messages landed in.
        delayed.sort_unstable();
        for (_, slot, at) in delayed {
            self.delay_message(ctx, slot, at);
        }
        ready.sort_unstable();
        let spent = |attempt: u32| self.config.max_deliveries.is_some_and(|max| attempt >= max);
        let mut poisoned = Vec::new();
        for &(_, slot, returned) in &ready {
            if returned {
                // Leased at the crash after its last allowed delivery: it came back, as
                // from an expiry, and is dead-lettered (contract §7 item 3).
                if spent(self.msgs[slot as usize].attempt) {
                    poisoned.push(slot);
                } else {
                    self.ready
                        .push_returned(slot, self.msgs[slot as usize].priority);
                }
            }
        }
        for &(_, slot, returned) in &ready {
            if !returned {
                self.ready
                    .push_fresh(slot, self.msgs[slot as usize].priority);
            }
        }
        for (id, until) in windows {
            self.watch_auto_shaped(Some(&id));
            let timer = Timer::Dedup {
                queue: self.key.idx,
                id: id.clone(),
            };
            let timer = ctx.wheel.insert(until, timer);
            let entry = self.dedup.entry(id).or_insert(DedupEntry {
                live: false,
                window: None,
            });
            entry.window = Some(timer);
        }
        self.dedup
            .retain(|_, entry| entry.live || entry.window.is_some());
        for slot in poisoned {
            self.msgs[slot as usize].state = MsgState::Ready;
            self.dead_letter(ctx, slot, DeathReason::MaxDeliveries);
        }
    }

    /// The changes that rebuild this durable queue (see `Shard::image`); nothing for a
    /// queue that is not durable. Delays and dedup windows are read from the wheel, and
    /// while a restore is under way from what it has `pending` too.
    pub fn image(
        &self,
        wheel: &Wheel<Timer>,
        log_time: impl Fn(Tick) -> u64,
        pending: Option<&Pending>,
        emit: &mut impl FnMut(Change),
    ) {
        let Some(queue) = self.log else {
            return;
        };
        emit(Change::Declared {
            queue,
            name: self.name.clone(),
            config: Box::new(self.config.clone()),
        });
        emit(Change::Tags {
            queue,
            next: self.leases.next_tag(),
        });
        let window = |id: &MsgId| match id {
            MsgId::Given(id) => self.image_window(wheel, &log_time, pending, id),
            MsgId::Auto(_) => None,
        };
        for (_, m) in self.msgs.iter() {
            // A leased message comes back ready with its attempt kept, as after a crash.
            let ready_at = match m.state {
                MsgState::Delayed(timer) => Some(log_time(wheel.deadline(timer))),
                MsgState::Ready => pending.and_then(|p| p.ready_at.get(&m.seq).copied()),
                MsgState::Leased(_) => None,
            };
            emit(Change::Enqueued {
                queue,
                seq: m.seq,
                id: m.id.clone(),
                body: m.body.clone(),
                attempt: m.attempt,
                priority: m.priority,
                ready_at,
                dedup_until: window(&m.id),
                death: m.death.clone(),
            });
        }
        // A message on its way to the dead-letter queue comes back here after a crash,
        // with its id's window (the id stays taken until the outcome, so the window is
        // not among the `Windowed` ones below).
        for (&seq, d) in &self.dying {
            emit(Change::Enqueued {
                queue,
                seq,
                id: d.id.clone(),
                body: d.body.clone(),
                attempt: d.attempt,
                priority: d.priority,
                ready_at: None,
                dedup_until: window(&d.id),
                death: d.death.clone(),
            });
        }
        self.image_windowed(queue, wheel, &log_time, pending, emit);
    }

    /// When the dedup window of the given id `id` ends, in log time: from its timer, or
    /// else from what a restore has pending; `None` when it has none, or it has ended.
    fn image_window(
        &self,
        wheel: &Wheel<Timer>,
        log_time: impl Fn(Tick) -> u64,
        pending: Option<&Pending>,
        id: &str,
    ) -> Option<u64> {
        let timer = self.dedup.get(id).and_then(|entry| entry.window);
        match (timer, pending) {
            (Some(timer), _) => {
                let until = log_time(wheel.deadline(timer));
                (!pending.is_some_and(|p| ended(until, p.clock))).then_some(until)
            }
            (None, Some(pending)) => pending.window(id),
            (None, None) => None,
        }
    }

    /// The dedup windows of ids no message here holds any more: `Windowed` changes.
    fn image_windowed(
        &self,
        queue: u32,
        wheel: &Wheel<Timer>,
        log_time: impl Fn(Tick) -> u64,
        pending: Option<&Pending>,
        emit: &mut impl FnMut(Change),
    ) {
        for (id, entry) in &self.dedup {
            if entry.live || entry.window.is_none() {
                continue;
            }
            if let Some(until) = self.image_window(wheel, &log_time, pending, id) {
                emit(Change::Windowed {
                    queue,
                    id: id.clone(),
                    until,
                });
            }
        }
        // Those of the restore under way, but for ids with a timer (listed above) or a
        // live message (whose `Enqueued` carries its window).
        for (id, until) in pending.into_iter().flat_map(Pending::open_windows) {
            if !self.dedup.contains_key(&**id) {
                emit(Change::Windowed {
                    queue,
                    id: id.clone(),
                    until,
                });
            }
        }
    }
}
