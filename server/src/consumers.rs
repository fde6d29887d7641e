//! Which queues have AMQP consumers, and which of them one consumer holds exclusively
//! (`basic.consume` with `exclusive`), shared by every connection of the server.
//!
//! RabbitMQ's rule: an exclusive consumer is refused while its queue has any consumer,
//! and any consumer is refused while the queue has an exclusive one; both refusals are
//! the channel error 403 ACCESS_REFUSED.
//!
//! A queue declared with `x-single-active-consumer` gives its messages to one consumer at
//! a time, as RabbitMQ does: the first to come is active, the others wait their turn in the
//! order they came, each with a `Turn` that is given when the one before it goes. A
//! waiting consumer has no broker consumer yet; its connection makes one when its turn
//! comes (`Connection::poll_delivery`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};

/// The consumers of every queue, by queue name.
#[derive(Debug, Default)]
pub struct QueueConsumers {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_queue: HashMap<String, Entry>,
    /// Numbers each queue's entry as it is made, so that a claim on a queue that was
    /// deleted never counts against a new queue of the same name.
    made: u64,
    /// Numbers the claims.
    claims: u64,
}

#[derive(Debug)]
struct Entry {
    generation: u64,
    count: usize,
    exclusive: bool,
    /// On a queue with a single active consumer: the active one's claim.
    active: Option<u64>,
    /// The claims waiting their turn, first come first.
    waiting: VecDeque<(u64, Arc<Turn>)>,
}

/// One consumer's place among its queue's consumers, given back when dropped (the
/// consumer was cancelled, or its channel or connection ended).
#[derive(Debug)]
pub(crate) struct Claim {
    consumers: Arc<QueueConsumers>,
    queue: String,
    generation: u64,
    number: u64,
}

/// A waiting consumer's turn on a queue with a single active consumer: given once the
/// consumers before it have gone, or when the queue is deleted (the consumer then finds
/// it gone).
#[derive(Debug, Default)]
pub(crate) struct Turn {
    given: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Turn {
    /// Whether the turn was given; if not, `cx` is woken when it is.
    pub(crate) fn has_come(&self, cx: &Context<'_>) -> bool {
        if self.given.load(Ordering::Acquire) {
            return true;
        }
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        // Given between the look and the waker's registration: seen now.
        self.given.load(Ordering::Acquire)
    }

    fn give(&self) {
        self.given.store(true, Ordering::Release);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl QueueConsumers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; take the table as it is if it did.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new consumer of `queue`, `exclusive` or not; `None` when the queue's
    /// consumers refuse it (it has an exclusive one, or this one is exclusive and it has
    /// any). On a queue with a `single_active` consumer, a consumer that comes while
    /// another is active gets the [`Turn`] it waits for.
    pub(crate) fn claim(
        self: &Arc<Self>,
        queue: &str,
        exclusive: bool,
        single_active: bool,
    ) -> Option<(Claim, Option<Arc<Turn>>)> {
        let mut table = self.lock();
        table.claims += 1;
        let number = table.claims;
        if !table.by_queue.contains_key(queue) {
            table.made += 1;
            let entry = Entry {
                generation: table.made,
                count: 0,
                exclusive: false,
                active: None,
                waiting: VecDeque::new(),
            };
            table.by_queue.insert(queue.to_string(), entry);
        }
        // A new entry (no consumer, not exclusive) refuses nothing.
        let entry = table.by_queue.get_mut(queue).expect("just made");
        if entry.exclusive || (exclusive && entry.count > 0) {
            return None;
        }
        entry.count += 1;
        entry.exclusive = exclusive;
        let turn = match (single_active, entry.active) {
            (false, _) => None,
            (true, None) => {
                entry.active = Some(number);
                None
            }
            (true, Some(_)) => {
                let turn = Arc::new(Turn::default());
                entry.waiting.push_back((number, Arc::clone(&turn)));
                Some(turn)
            }
        };
        let claim = Claim {
            consumers: Arc::clone(self),
            queue: queue.to_string(),
            generation: entry.generation,
            number,
        };
        Some((claim, turn))
    }

    /// How many consumers of `queue` wait their turn (`x-single-active-consumer`).
    #[cfg(test)]
    fn waiting(&self, queue: &str) -> usize {
        (self.lock().by_queue.get(queue)).map_or(0, |e| e.waiting.len())
    }

    /// How many AMQP consumers `queue` has, those waiting their turn too.
    pub(crate) fn consumer_count(&self, queue: &str) -> usize {
        (self.lock().by_queue.get(queue)).map_or(0, |e| e.count)
    }

    /// Whether `queue` has a consumer on any connection.
    pub(crate) fn is_consumed(&self, queue: &str) -> bool {
        self.lock().by_queue.contains_key(queue)
    }

    /// Forgets the consumers of `queue`, which was deleted: its consumers' claims no
    /// longer count, whenever they are dropped.
    /// Consumers waiting their turn are given it, to find the queue gone.
    pub(crate) fn forget(&self, queue: &str) {
        let entry = self.lock().by_queue.remove(queue);
        for (_, turn) in entry.into_iter().flat_map(|e| e.waiting) {
            turn.give();
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut table = self.consumers.lock();
        let Some(entry) = table.by_queue.get_mut(&self.queue) else {
            return;
        };
        if entry.generation != self.generation {
            return;
        }
        entry.count -= 1;
        if entry.active == Some(self.number) {
            // The active consumer went: the next in line takes its place.
            entry.active = None;
            if let Some((next, turn)) = entry.waiting.pop_front() {
                entry.active = Some(next);
                turn.give();
            }
        } else {
            entry.waiting.retain(|(number, _)| *number != self.number);
        }
        if entry.count == 0 {
            table.by_queue.remove(&self.queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_active_consumer_is_followed_by_the_next_in_line_as_it_goes() {
        let consumers = Arc::new(QueueConsumers::default());
        let claim = |consumers: &Arc<QueueConsumers>| consumers.claim("jobs", false, true).unwrap();
        let (first, none) = claim(&consumers);
        assert!(none.is_none(), "the first is active at once");
        let (second, second_turn) = claim(&consumers);
        let (third, third_turn) = claim(&consumers);
        let (second_turn, third_turn) = (second_turn.unwrap(), third_turn.unwrap());
        let cx = Context::from_waker(Waker::noop());
        assert!(!second_turn.has_come(&cx) && !third_turn.has_come(&cx));
        assert_eq!(consumers.waiting("jobs"), 2);
        // One waiting that goes leaves the line as it was.
        drop(third);
        assert_eq!(consumers.waiting("jobs"), 1);
        let (fourth, fourth_turn) = claim(&consumers);
        drop(first);
        assert!(second_turn.has_come(&cx), "next in line");
        assert!(!fourth_turn.as_ref().unwrap().has_come(&cx));
        drop(second);
        assert!(fourth_turn.unwrap().has_come(&cx));
        drop(fourth);
        assert!(!consumers.is_consumed("jobs"));
        // A deleted queue gives every waiting consumer its turn, to find the queue gone.
        let (_active, _) = claim(&consumers);
        let (_waiting, turn) = claim(&consumers);
        consumers.forget("jobs");
        assert!(turn.unwrap().has_come(&cx));
    }

    #[test]
    fn an_exclusive_consumer_needs_the_queue_alone_and_keeps_it_alone() {
        let consumers = Arc::new(QueueConsumers::default());
        let first = consumers
            .claim("jobs", false, false)
            .expect("a first consumer");
        assert!(
            consumers.claim("jobs", true, false).is_none(),
            "the queue has one"
        );
        let second = consumers.claim("jobs", false, false).expect("shared use");
        drop((first, second));
        let alone = consumers
            .claim("jobs", true, false)
            .expect("no consumer is left");
        assert!(consumers.claim("jobs", false, false).is_none());
        assert!(consumers.claim("jobs", true, false).is_none());
        assert!(consumers.claim("other", true, false).is_some(), "per queue");
        drop(alone);
        assert!(consumers.claim("jobs", false, false).is_some());
    }

    #[test]
    fn a_claim_on_a_deleted_queue_does_not_count_against_its_successor() {
        let consumers = Arc::new(QueueConsumers::default());
        let old = consumers.claim("jobs", true, false).unwrap();
        consumers.forget("jobs");
        let new = consumers
            .claim("jobs", false, false)
            .expect("a new queue of that name");
        drop(old);
        // The new queue's consumer still counts: an exclusive one is refused.
        assert!(consumers.claim("jobs", true, false).is_none());
        drop(new);
        assert!(consumers.claim("jobs", true, false).is_some());
    }
}
