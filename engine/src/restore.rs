//! Restoring a shard's durable queues from their log, and the snapshot image that
//! shortens it (see [`crate::durable`]).
//!
//! A restore may last: a follower of a replicated shard stays in restore mode, applying
//! the changes its leader logged, until it leads. So the tables a restore keeps are
//! bounded by what is still pending (dedup windows that ended by the log's clock are
//! pruned as they pile up), and [`Shard::image`] works in the middle of a restore too.

use std::collections::HashMap;
use std::sync::Arc;

use ahash::RandomState;

use crate::durable::{Change, RestoreError};
use crate::queue::{fixed_state, shrink_sparse, Ctx, QueueState};
use crate::{Effects, MsgId, QueueConfig, QueueKey, Shard, Tick};

mod image;
#[cfg(test)]
mod tests;

pub(crate) use image::Pending;

type Map<K, V> = HashMap<K, V, RandomState>;

/// A queue's table of dedup windows is pruned once it holds this many, and after that
/// each time it has doubled since the last prune.
const MIN_PRUNE: usize = 64;

/// What a restore keeps between changes.
pub(crate) struct Restoring {
    /// Durable queue number → slot.
    queues: Map<u32, u32>,
    /// Message number → (queue slot, message slot).
    msgs: Map<u64, (u32, u32)>,
    /// Message number → log time it becomes ready, for the delayed ones.
    ready_at: Map<u64, u64>,
    /// Durable queue number → the dedup windows of its ids.
    windows: Map<u32, Windows>,
    /// The latest [`Change::Clock`]: the highest, should a restart have set the clock back.
    clock: Option<u64>,
    /// The highest broker id sequence seen, by the shard that made it: a dead letter
    /// keeps its id, so ids of one shard can be in another's log.
    auto_ids: Map<u16, u64>,
}

/// The dedup windows a restore has seen for one queue.
pub(crate) struct Windows {
    /// Id → log time its window ends.
    until: Map<Arc<str>, u64>,
    /// The length of `until` at which it is next pruned.
    prune_at: usize,
}

impl Windows {
    fn new() -> Windows {
        Windows {
            until: Map::with_hasher(fixed_state()),
            prune_at: MIN_PRUNE,
        }
    }

    /// Sets the window of `id`. Each time the table has doubled since it was last pruned,
    /// the windows that ended by `clock` go: nothing else would take them out, since a
    /// restore runs no timers. Amortised, that is a constant cost per window set.
    fn insert(&mut self, id: Arc<str>, until: u64, clock: Option<u64>) {
        self.until.insert(id, until);
        if self.until.len() < self.prune_at {
            return;
        }
        if let Some(clock) = clock {
            self.until.retain(|_, until| !ended(*until, Some(clock)));
            shrink_sparse(&mut self.until);
        }
        self.prune_at = (2 * self.until.len()).max(MIN_PRUNE);
    }

    /// When the window of `id` ends, unless it has ended by `clock`.
    pub(crate) fn get(&self, id: &str, clock: Option<u64>) -> Option<u64> {
        let until = *self.until.get(id)?;
        (!ended(until, clock)).then_some(until)
    }

    /// The windows that have not ended by `clock`: (id, log time it ends).
    pub(crate) fn open(&self, clock: Option<u64>) -> impl Iterator<Item = (&Arc<str>, u64)> {
        self.until
            .iter()
            .map(|(id, &until)| (id, until))
            .filter(move |&(_, until)| !ended(until, clock))
    }
}

/// Whether a dedup window ending at log time `until` has ended by the log's `clock`. The
/// shard that logged it fires its timers before it handles anything at a tick, and the
/// clock a batch of changes carries is its time then: what ended by it was over there.
pub(crate) fn ended(until: u64, clock: Option<u64>) -> bool {
    clock.is_some_and(|clock| until <= clock)
}

impl Restoring {
    /// Sets a dedup window of queue number `queue`.
    fn window(&mut self, queue: u32, id: Arc<str>, until: u64) {
        let clock = self.clock;
        let windows = self.windows.entry(queue).or_insert_with(Windows::new);
        windows.insert(id, until, clock);
    }

    fn queue(&self, queue: u32) -> Result<u32, RestoreError> {
        self.queues
            .get(&queue)
            .copied()
            .ok_or_else(|| RestoreError(format!("queue number {queue} was never declared")))
    }

    fn msg(&self, queue: u32, seq: u64) -> Result<(u32, u32), RestoreError> {
        let idx = self.queue(queue)?;
        match self.msgs.get(&seq) {
            Some(&(q, slot)) if q == idx => Ok((q, slot)),
            _ => Err(RestoreError(format!(
                "message {seq} of queue number {queue} was never enqueued"
            ))),
        }
    }
}

impl Shard {
    /// Sets the log time (nanoseconds) of tick 0: what [`Change`]s carry as instants is
    /// `epoch + tick × tick length`. Set it before the first command, and before
    /// [`Shard::finish_restore`].
    pub fn set_log_epoch(&mut self, nanos: u64) {
        self.log_epoch = nanos;
    }

    /// The log time of `tick`.
    pub fn log_time(&self, tick: Tick) -> u64 {
        self.log_epoch.saturating_add(self.tick.start_of(tick))
    }

    /// Applies a batch of logged changes, as [`crate::durable::begin_batch`] and
    /// [`Change::encode`] wrote them: a record of the log, a snapshot, or a replicated
    /// entry.
    ///
    /// # Errors
    ///
    /// Why the batch does not decode, or why a change does not fit (see
    /// [`restore`](Shard::restore)); the changes before it were applied.
    pub fn restore_batch(&mut self, batch: bytes::Bytes) -> Result<(), String> {
        match crate::durable::decode_batch(batch, |change| self.restore(change)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Applies one logged change, in log order, before the shard handles any command.
    ///
    /// # Errors
    ///
    /// [`RestoreError`] when the change does not fit what came before it (a message or
    /// queue the log never named, a queue declared twice): the log is damaged.
    pub fn restore(&mut self, change: Change) -> Result<(), RestoreError> {
        let mut r = self.restoring.take().unwrap_or_else(|| {
            Box::new(Restoring {
                queues: Map::with_hasher(fixed_state()),
                msgs: Map::with_hasher(fixed_state()),
                ready_at: Map::with_hasher(fixed_state()),
                windows: Map::with_hasher(fixed_state()),
                clock: None,
                auto_ids: Map::with_hasher(fixed_state()),
            })
        });
        let applied = self.restore_change(&mut r, change);
        self.restoring = Some(r);
        applied
    }

    /// [`restore`](Self::restore) of one change, with what the restore keeps meanwhile.
    fn restore_change(&mut self, r: &mut Restoring, change: Change) -> Result<(), RestoreError> {
        match change {
            Change::Clock { now } => r.clock = Some(r.clock.map_or(now, |c| c.max(now))),
            Change::Counters {
                next_queue,
                next_seq,
                next_auto_id,
            } => {
                self.next_log_queue = self.next_log_queue.max(next_queue);
                self.next_seq = self.next_seq.max(next_seq);
                self.next_auto_id = self.next_auto_id.max(next_auto_id);
            }
            Change::Declared {
                queue,
                name,
                config,
            } => self.restore_declared(r, queue, name, *config)?,
            Change::Closed { queue } => self.restore_closed(r, queue)?,
            Change::Tags { queue, next } => {
                let idx = r.queue(queue)?;
                self.queues[idx as usize].restore_next_tag(next);
            }
            enqueued @ Change::Enqueued { .. } => self.restore_enqueued(r, enqueued)?,
            Change::Delivered {
                queue,
                seq,
                tag,
                attempt,
            } => self.restore_delivered(r, (queue, seq), tag, attempt)?,
            Change::Returned {
                queue,
                seq,
                attempt,
                ready_at,
            } => {
                let (idx, slot) = r.msg(queue, seq)?;
                self.queues[idx as usize].restore_attempt(slot, attempt);
                match ready_at {
                    Some(at) => r.ready_at.insert(seq, at),
                    None => r.ready_at.remove(&seq),
                };
            }
            Change::Removed { queue, seq } => {
                let (idx, slot) = r.msg(queue, seq)?;
                self.queues[idx as usize].restore_remove(slot);
                r.msgs.remove(&seq);
                r.ready_at.remove(&seq);
            }
            Change::Windowed { queue, id, until } => {
                r.queue(queue)?;
                r.window(queue, id, until);
            }
        }
        Ok(())
    }

    /// A queue declared: checked as a declare checks it, and made under a new key.
    fn restore_declared(
        &mut self,
        r: &mut Restoring,
        queue: u32,
        name: Arc<str>,
        config: QueueConfig,
    ) -> Result<(), RestoreError> {
        let taken = r.queues.contains_key(&queue) || self.numbers.contains_key(&queue);
        if taken || self.names.contains_key(&name) {
            return Err(RestoreError(format!(
                "queue {name:?} (number {queue}) declared twice"
            )));
        }
        // Checked as a declare checks it: the arithmetic of leases, retries and
        // windows relies on their limits, whatever wrote the log.
        let valid = crate::validate::queue_name(&name)
            .and_then(|()| crate::validate::queue_config(&name, &config));
        if let Err(e) = valid {
            return Err(RestoreError(format!(
                "queue {name:?} (number {queue}) declared with {e}"
            )));
        }
        if queue == u32::MAX {
            return Err(RestoreError(format!(
                "queue {name:?} has number {queue}, past the last"
            )));
        }
        let gen = {
            self.next_gen = self.next_gen.wrapping_add(1);
            self.next_gen
        };
        let entry = self.queues.vacant_entry();
        let idx = u32::try_from(entry.key()).expect("fewer than 2^32 queues");
        let key = QueueKey { idx, gen };
        let state = entry.insert(QueueState::new(key, &name, config, self.tick));
        state.log = Some(queue);
        self.names.insert(name, key);
        self.numbers.insert(queue, key);
        r.queues.insert(queue, idx);
        self.next_log_queue = self.next_log_queue.max(queue);
        Ok(())
    }

    /// A queue closed: gone with everything the restore knew of it.
    fn restore_closed(&mut self, r: &mut Restoring, queue: u32) -> Result<(), RestoreError> {
        let idx = r.queue(queue)?;
        let state = self.queues.remove(idx as usize);
        self.names.remove(&*state.name);
        self.numbers.remove(&queue);
        r.queues.remove(&queue);
        r.msgs.retain(|_, (q, _)| *q != idx);
        r.windows.remove(&queue);
        // Nothing is in the wheel yet; the effects of closing are empty.
        let mut out = Effects::new();
        let (_, mut ctx) = ctx!(self, &mut out);
        state.close(&mut ctx);
        Ok(())
    }

    /// A message enqueued (`enqueued` is a [`Change::Enqueued`]).
    fn restore_enqueued(
        &mut self,
        r: &mut Restoring,
        enqueued: Change,
    ) -> Result<(), RestoreError> {
        let Change::Enqueued {
            queue,
            seq,
            id,
            body,
            attempt,
            priority,
            ready_at,
            dedup_until,
            death,
        } = enqueued
        else {
            return Ok(());
        };
        let idx = r.queue(queue)?;
        if r.msgs.contains_key(&seq) {
            return Err(RestoreError(format!("message {seq} enqueued twice")));
        }
        if let MsgId::Auto(n) = id {
            let (shard, seq) = ((n >> 48) as u16, n & ((1 << 48) - 1));
            let max = r.auto_ids.entry(shard).or_default();
            *max = (*max).max(seq);
            if shard == self.index {
                self.next_auto_id = self.next_auto_id.max(seq);
            }
        }
        if let (MsgId::Given(given), Some(until)) = (&id, dedup_until) {
            r.window(queue, given.clone(), until);
        }
        let q = &mut self.queues[idx as usize];
        let slot = q.restore_enqueue(seq, id, body, attempt, priority, death)?;
        r.msgs.insert(seq, (idx, slot));
        if let Some(at) = ready_at {
            r.ready_at.insert(seq, at);
        }
        self.next_seq = self.next_seq.max(seq);
        Ok(())
    }

    /// A message delivered with `tag`, its `attempt`-th delivery.
    fn restore_delivered(
        &mut self,
        r: &mut Restoring,
        (queue, seq): (u32, u64),
        tag: u64,
        attempt: u32,
    ) -> Result<(), RestoreError> {
        let (idx, slot) = r.msg(queue, seq)?;
        let q = &mut self.queues[idx as usize];
        let next = tag.checked_add(1).ok_or_else(|| {
            RestoreError(format!(
                "message {seq} delivered with tag {tag}, past the last"
            ))
        })?;
        q.restore_attempt(slot, attempt);
        q.restore_next_tag(next);
        // Leased at the crash, or returned by an expiry: ready at once.
        r.ready_at.remove(&seq);
        Ok(())
    }

    /// The highest broker id sequence each shard had made, among the restored messages;
    /// pass each shard's to its [`Shard::reserve_auto_ids`], so that no id repeats.
    pub fn restored_auto_ids(&self) -> Vec<(u16, u64)> {
        self.restoring
            .as_ref()
            .map(|r| r.auto_ids.iter().map(|(&s, &n)| (s, n)).collect())
            .unwrap_or_default()
    }

    /// Broker ids of this shard go on after sequence `seq`.
    pub fn reserve_auto_ids(&mut self, seq: u64) {
        self.next_auto_id = self.next_auto_id.max(seq);
    }

    /// The latest log time the restored changes recorded; a manual clock resumes there.
    pub fn restored_clock(&self) -> Option<u64> {
        self.restoring.as_ref().and_then(|r| r.clock)
    }

    /// Ends a restore (a no-op when nothing was restored): sets the delays and dedup
    /// windows that end after now, by the log epoch set with [`Shard::set_log_epoch`], and
    /// lines up the ready messages. A dedup window that ended by the last log time the
    /// restore saw ([`Shard::restored_clock`]) has ended, as it had for the shard that
    /// logged it. A message leased at the crash after its last allowed delivery
    /// (`max_deliveries`) is dead-lettered: the runtime routes `out.dead_letters` and
    /// writes `out.log` as after any command.
    pub fn finish_restore(&mut self, out: &mut Effects) {
        let Some(r) = self.restoring.take() else {
            return;
        };
        let (now, epoch, slack) = (self.now, self.log_epoch, self.slack);
        let tick_nanos = self.tick.start_of(1).max(1);
        let after_now = |nanos: u64| -> Option<Tick> {
            let since = nanos.checked_sub(epoch)?;
            let tick = since.div_ceil(tick_nanos) + slack;
            (tick > now).then_some(tick)
        };
        let mut ready_at: Map<u64, Tick> = Map::with_hasher(fixed_state());
        for (&seq, &nanos) in &r.ready_at {
            if let Some(tick) = after_now(nanos) {
                ready_at.insert(seq, tick);
            }
        }
        // In the order of their numbers, so that what comes out (timers, dead letters)
        // does not depend on the history of a hash table.
        let mut queues: Vec<(u32, u32)> = r.queues.iter().map(|(&q, &idx)| (q, idx)).collect();
        queues.sort_unstable();
        for (queue, idx) in queues {
            let mut windows: Vec<(Arc<str>, Tick)> = match r.windows.get(&queue) {
                Some(windows) => windows
                    .open(r.clock)
                    .filter_map(|(id, until)| Some((id.clone(), after_now(until)?)))
                    .collect(),
                None => Vec::new(),
            };
            windows.sort();
            let (queues, mut ctx) = ctx!(self, out);
            let ready_at = |seq| ready_at.get(&seq).copied();
            queues[idx as usize].finish_restore(&mut ctx, ready_at, windows);
        }
    }
}
