//! `x-expires`: a queue deleted once it has gone unused for so many milliseconds, as
//! RabbitMQ deletes it.
//!
//! A queue is in use while it has consumers; a `queue.declare` of it (passive too), a
//! `basic.get` or a `basic.consume`, and its last consumer's going, each start its time
//! again. Publishing to it does not (RabbitMQ's meaning). It is deleted as
//! `queue.delete` would delete it: its messages, leased ones too, and its bindings go.
//!
//! Connections read no clock: they mark a queue used ([`Expiring::touch`]). One task per
//! virtual host (`VHost::expire_queues`) stamps each mark with the time it sees it,
//! keeps one deadline per queue, and deletes each queue whose deadline passed while it had no consumer, unless a
//! use came in between ([`Expiring::still_due`], checked just before the delete). Memory
//! is bounded by the number of queues that expire, whatever the number of uses.
//! [`Expiring`] itself takes the time as an argument, so its tests need no clock.
//!
//! A durable queue brought back by a restart expires again, its time counted from the
//! start (`durable_queues.rs` keeps its `x-expires`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasemq::Queue;

/// The queues that expire, shared by every connection of a server.
#[derive(Debug, Default)]
pub struct Expiring {
    /// How many queues expire: while none does, a touch takes no lock.
    count: AtomicUsize,
    state: Mutex<State>,
    /// Wakes `VHost::expire_queues` when a queue was marked used, or one was added.
    pub(crate) wake: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, Entry>,
    /// Names marked used since the time was last stamped, each once.
    touched: Vec<String>,
    /// The armed deadlines, earliest first: one per queue whose time runs.
    deadlines: BTreeSet<(Instant, String)>,
}

#[derive(Debug)]
struct Entry {
    queue: Queue,
    after: Duration,
    /// Its armed deadline (in `deadlines`); `None` while it has consumers, or while it is
    /// marked used and not yet stamped.
    deadline: Option<Instant>,
    touched: bool,
    /// Its time ran out and [`Expiring::expire`] handed it out: it is deleted unless it
    /// is used first ([`Expiring::still_due`]).
    due: bool,
}

impl State {
    fn disarm(&mut self, name: &str) {
        if let Some(at) = self.queues.get_mut(name).and_then(|e| e.deadline.take()) {
            self.deadlines.remove(&(at, name.to_string()));
        }
    }

    fn mark_touched(&mut self, name: &str) -> bool {
        let Some(entry) = self.queues.get_mut(name) else {
            return false;
        };
        entry.due = false;
        if entry.touched {
            return false;
        }
        entry.touched = true;
        self.touched.push(name.to_string());
        true
    }

    fn remove(&mut self, name: &str) {
        self.disarm(name);
        self.queues.remove(name);
    }
}

impl Expiring {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; take the state as it is if it did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, locked, unless no queue expires (then there is nothing to look at).
    fn lock_if_any(&self) -> Option<MutexGuard<'_, State>> {
        (self.count.load(Ordering::Relaxed) > 0).then(|| self.lock())
    }

    /// Keeps `count` at the number of queues known, after a change to them.
    fn recount(&self, state: &State) {
        self.count.store(state.queues.len(), Ordering::Relaxed);
    }

    /// `queue` expires after going unused for `after`, from now on (a declare).
    pub fn set(&self, queue: &Queue, after: Duration) {
        let mut state = self.lock();
        let name = queue.name();
        // A queue of that name that is still open is this one: declared again.
        let known = state.queues.get_mut(name).filter(|e| !e.queue.is_closed());
        match known {
            Some(entry) => entry.after = after,
            None => {
                state.remove(name);
                let entry = Entry {
                    queue: queue.clone(),
                    after,
                    deadline: None,
                    touched: false,
                    due: false,
                };
                state.queues.insert(name.to_string(), entry);
            }
        }
        state.mark_touched(name);
        self.recount(&state);
        drop(state);
        self.wake.notify_one();
    }

    /// The queue called `name`, if it expires, was used now: its time starts again.
    pub fn touch(&self, name: &str) {
        let Some(mut state) = self.lock_if_any() else {
            return;
        };
        let first = state.touched.is_empty();
        if state.mark_touched(name) && first {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Forgets the queue called `name` if the one it knows by that name is closed (it was
    /// deleted; a queue declared since under the name stays).
    pub fn forget_closed(&self, name: &str) {
        let Some(mut state) = self.lock_if_any() else {
            return;
        };
        if state.queues.get(name).is_some_and(|e| e.queue.is_closed()) {
            state.remove(name);
            self.recount(&state);
        }
    }

    /// Starts the time of every queue marked used since the last call at `now`; then
    /// hands out the queues whose time is up at `now` and that `consumed` says have no
    /// consumer (those that have one wait for their last consumer's going), for the
    /// caller to delete each that is [`still_due`](Expiring::still_due). Returns them,
    /// and when to look next.
    pub fn expire(
        &self,
        now: Instant,
        consumed: impl Fn(&str) -> bool,
    ) -> (Vec<Queue>, Option<Instant>) {
        let mut state = self.lock();
        for name in std::mem::take(&mut state.touched) {
            state.disarm(&name);
            let Some(entry) = state.queues.get_mut(&name) else {
                continue;
            };
            entry.touched = false;
            let at = now + entry.after;
            entry.deadline = Some(at);
            state.deadlines.insert((at, name));
        }
        let mut expired = Vec::new();
        while let Some((at, name)) = state.deadlines.first().cloned() {
            if at > now {
                break;
            }
            state.deadlines.pop_first();
            let Some(entry) = state.queues.get_mut(&name) else {
                continue;
            };
            entry.deadline = None;
            if entry.queue.is_closed() {
                state.queues.remove(&name);
            } else if !consumed(&name) {
                entry.due = true;
                expired.push(entry.queue.clone());
            }
        }
        self.recount(&state);
        let next = state.deadlines.first().map(|(at, _)| *at);
        (expired, next)
    }

    /// Whether `queue`, handed out by [`expire`](Expiring::expire), is to be deleted now:
    /// nothing used it since. Forgets it if so; if it was used, its time runs again.
    pub fn still_due(&self, queue: &Queue) -> bool {
        let mut state = self.lock();
        let name = queue.name();
        let due = state
            .queues
            .get(name)
            .is_some_and(|e| e.due && !e.queue.is_closed());
        if due {
            state.remove(name);
            self.recount(&state);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasemq::{Broker, QueueConfig};

    fn broker() -> Broker {
        Broker::builder().shards(1).manual_clock().build().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn names(queues: &[Queue]) -> Vec<&str> {
        queues.iter().map(Queue::name).collect()
    }

    #[test]
    fn a_queue_expires_after_going_unused_for_its_time_from_when_it_was_last_used() {
        let broker = broker();
        let q = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        let idle = |_: &str| false;
        expiring.set(&q, ms(100));
        let (expired, next) = expiring.expire(t0, idle);
        assert!(expired.is_empty());
        assert_eq!(next, Some(t0 + ms(100)));
        // Used at 60 ms: the time starts again from when the use is seen.
        expiring.touch("q");
        let (expired, _) = expiring.expire(t0 + ms(60), idle);
        assert!(expired.is_empty());
        let (expired, next) = expiring.expire(t0 + ms(100), idle);
        assert!(expired.is_empty(), "the first deadline no longer counts");
        assert_eq!(next, Some(t0 + ms(160)));
        let (expired, next) = expiring.expire(t0 + ms(160), idle);
        assert_eq!(names(&expired), ["q"]);
        assert_eq!(next, None);
        assert!(
            expiring.expire(t0 + ms(170), idle).0.is_empty(),
            "handed out once"
        );
        assert!(expiring.still_due(&q));
        // Forgotten once deleted: a touch of it now changes nothing.
        expiring.touch("q");
        assert!(expiring.expire(t0 + ms(1_000), idle).0.is_empty());
        assert!(!expiring.still_due(&q));
    }

    #[test]
    fn a_use_after_the_queue_was_handed_out_keeps_it() {
        let broker = broker();
        let q = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        expiring.set(&q, ms(100));
        expiring.expire(t0, |_| false);
        assert_eq!(names(&expiring.expire(t0 + ms(100), |_| false).0), ["q"]);
        // A declare came before the deleter got to it.
        expiring.set(&q, ms(100));
        assert!(!expiring.still_due(&q));
        let (expired, next) = expiring.expire(t0 + ms(120), |_| false);
        assert!(expired.is_empty());
        assert_eq!(next, Some(t0 + ms(220)), "its time runs from that use");
    }

    #[test]
    fn uses_keep_one_deadline_per_queue() {
        let broker = broker();
        let q = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        expiring.set(&q, ms(86_400_000));
        for i in 0..1_000 {
            expiring.touch("q");
            expiring.set(&q, ms(86_400_000));
            expiring.expire(t0 + ms(i), |_| false);
        }
        let state = expiring.lock();
        assert_eq!((state.deadlines.len(), state.touched.len()), (1, 0));
        assert_eq!(state.queues.len(), 1);
    }

    #[test]
    fn a_queue_with_consumers_waits_for_its_last_consumers_going() {
        let broker = broker();
        let q = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        expiring.set(&q, ms(100));
        expiring.expire(t0, |_| true);
        let (expired, next) = expiring.expire(t0 + ms(100), |_| true);
        assert!(expired.is_empty(), "consumed");
        assert_eq!(next, None, "not armed while consumed");
        // Its last consumer went at 500 ms: 100 ms from then.
        expiring.touch("q");
        expiring.expire(t0 + ms(500), |_| false);
        assert!(expiring.expire(t0 + ms(599), |_| false).0.is_empty());
        assert_eq!(names(&expiring.expire(t0 + ms(600), |_| false).0), ["q"]);
    }

    #[test]
    fn a_deleted_queue_is_forgotten_and_a_new_one_of_its_name_kept() {
        let broker = broker();
        let old = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        expiring.set(&old, ms(100));
        // A new queue of the name only once the old one is closed: `forget_closed` of
        // the old name leaves it alone while it lives.
        expiring.forget_closed("q");
        assert_eq!(expiring.count.load(Ordering::Relaxed), 1);
        assert!(old.close());
        expiring.forget_closed("q");
        assert_eq!(expiring.count.load(Ordering::Relaxed), 0);
        let new = broker.declare_queue("q", QueueConfig::default()).unwrap();
        expiring.set(&new, ms(50));
        expiring.forget_closed("q");
        let (expired, _) = expiring.expire(t0, |_| false);
        assert!(expired.is_empty());
        let (expired, _) = expiring.expire(t0 + ms(50), |_| false);
        assert_eq!(names(&expired), ["q"]);
        assert!(
            !expired[0].is_closed(),
            "the new one, for the caller to delete"
        );
    }

    #[test]
    fn a_queue_closed_by_other_means_is_dropped_not_returned() {
        let broker = broker();
        let q = broker.declare_queue("q", QueueConfig::default()).unwrap();
        let expiring = Expiring::default();
        let t0 = Instant::now();
        expiring.set(&q, ms(10));
        expiring.expire(t0, |_| false);
        q.close();
        let (expired, next) = expiring.expire(t0 + ms(10), |_| false);
        assert!(expired.is_empty());
        assert_eq!(next, None);
        assert_eq!(expiring.count.load(Ordering::Relaxed), 0);
    }
}
