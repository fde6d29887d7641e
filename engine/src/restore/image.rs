//! The snapshot image: the changes that rebuild a shard's durable state, from a live
//! shard or from one in the middle of a restore.

use super::{Map, Restoring, Windows};
use crate::durable::Change;
use crate::queue::QueueState;
use crate::Shard;

/// What a restore under way knows of one durable queue that the queue does not hold
/// yet: the delays and dedup windows it sets only when the restore finishes.
pub(crate) struct Pending<'a> {
    /// Message number → log time it becomes ready, for the delayed ones (of any queue).
    pub ready_at: &'a Map<u64, u64>,
    /// The queue's dedup windows.
    pub windows: Option<&'a Windows>,
    /// The latest log time the restore saw: windows that ended by then are left out.
    pub clock: Option<u64>,
}

impl Pending<'_> {
    /// When the window of `id` ends, unless it has ended.
    pub fn window(&self, id: &str) -> Option<u64> {
        self.windows.and_then(|w| w.get(id, self.clock))
    }

    /// The windows that have not ended: (id, log time it ends).
    pub fn open_windows(&self) -> impl Iterator<Item = (&std::sync::Arc<str>, u64)> {
        self.windows.into_iter().flat_map(|w| w.open(self.clock))
    }
}

impl Restoring {
    /// What this restore knows of the queue numbered `queue` (see [`Pending`]).
    fn pending(&self, queue: Option<u32>) -> Pending<'_> {
        Pending {
            ready_at: &self.ready_at,
            windows: queue.and_then(|q| self.windows.get(&q)),
            clock: self.clock,
        }
    }
}

impl Shard {
    /// The changes that rebuild what this shard's durable queues hold now: a snapshot.
    /// Restoring them into a new shard gives the same queues, messages, attempts, ids,
    /// delays, dedup windows and next tags as restoring the whole log would.
    ///
    /// In the middle of a restore, the image is of the state the restore has reached: a
    /// new shard that restores it, and then whatever changes come after, finishes the
    /// restore as this one would. Its clock is the restore's
    /// ([`Shard::restored_clock`]; none if the log had none), and dedup windows that
    /// ended by that clock are left out.
    pub fn image(&self, mut emit: impl FnMut(Change)) {
        let restoring = self.restoring.as_deref();
        let clock = match restoring {
            Some(r) => r.clock,
            None => Some(self.log_time(self.now)),
        };
        if let Some(now) = clock {
            emit(Change::Clock { now });
        }
        emit(Change::Counters {
            next_queue: self.next_log_queue,
            next_seq: self.next_seq,
            next_auto_id: self.next_auto_id,
        });
        let mut durable: Vec<&QueueState> = self.queues.iter().map(|(_, q)| q).collect();
        durable.retain(|q| q.log.is_some());
        durable.sort_by_key(|q| q.log);
        for queue in durable {
            let pending = restoring.map(|r| r.pending(queue.log));
            let log_time = |tick| self.log_time(tick);
            queue.image(&self.wheel, log_time, pending.as_ref(), &mut emit);
        }
    }
}
