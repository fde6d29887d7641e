//! Which queues have AMQP consumers, and which of them one consumer holds exclusively
//! (`basic.consume` with `exclusive`), shared by every connection of the server.
//!
//! RabbitMQ's rule: an exclusive consumer is refused while its queue has any consumer,
//! and any consumer is refused while the queue has an exclusive one; both refusals are
//! the channel error 403 ACCESS_REFUSED.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
}

#[derive(Debug)]
struct Entry {
    generation: u64,
    count: usize,
    exclusive: bool,
}

/// One consumer's place among its queue's consumers, given back when dropped (the
/// consumer was cancelled, or its channel or connection ended).
#[derive(Debug)]
pub(crate) struct Claim {
    consumers: Arc<QueueConsumers>,
    queue: String,
    generation: u64,
}

impl QueueConsumers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; take the table as it is if it did.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new consumer of `queue`, `exclusive` or not; `None` when the queue's
    /// consumers refuse it (it has an exclusive one, or this one is exclusive and it has
    /// any).
    pub(crate) fn claim(self: &Arc<Self>, queue: &str, exclusive: bool) -> Option<Claim> {
        let mut table = self.lock();
        let generation = match table.by_queue.get_mut(queue) {
            Some(entry) => {
                if entry.exclusive || (exclusive && entry.count > 0) {
                    return None;
                }
                entry.count += 1;
                entry.exclusive = exclusive;
                entry.generation
            }
            None => {
                table.made += 1;
                let generation = table.made;
                let entry = Entry {
                    generation,
                    count: 1,
                    exclusive,
                };
                table.by_queue.insert(queue.to_string(), entry);
                generation
            }
        };
        Some(Claim {
            consumers: Arc::clone(self),
            queue: queue.to_string(),
            generation,
        })
    }

    /// Whether `queue` has a consumer on any connection.
    pub(crate) fn is_consumed(&self, queue: &str) -> bool {
        self.lock().by_queue.contains_key(queue)
    }

    /// Forgets the consumers of `queue`, which was deleted: its consumers' claims no
    /// longer count, whenever they are dropped.
    pub(crate) fn forget(&self, queue: &str) {
        self.lock().by_queue.remove(queue);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut table = self.consumers.lock();
        if let Some(entry) = table.by_queue.get_mut(&self.queue) {
            if entry.generation == self.generation {
                entry.count -= 1;
                if entry.count == 0 {
                    table.by_queue.remove(&self.queue);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_consumer_needs_the_queue_alone_and_keeps_it_alone() {
        let consumers = Arc::new(QueueConsumers::default());
        let first = consumers.claim("jobs", false).expect("a first consumer");
        assert!(consumers.claim("jobs", true).is_none(), "the queue has one");
        let second = consumers.claim("jobs", false).expect("shared use");
        drop((first, second));
        let alone = consumers.claim("jobs", true).expect("no consumer is left");
        assert!(consumers.claim("jobs", false).is_none());
        assert!(consumers.claim("jobs", true).is_none());
        assert!(consumers.claim("other", true).is_some(), "per queue");
        drop(alone);
        assert!(consumers.claim("jobs", false).is_some());
    }

    #[test]
    fn a_claim_on_a_deleted_queue_does_not_count_against_its_successor() {
        let consumers = Arc::new(QueueConsumers::default());
        let old = consumers.claim("jobs", true).unwrap();
        consumers.forget("jobs");
        let new = consumers
            .claim("jobs", false)
            .expect("a new queue of that name");
        drop(old);
        // The new queue's consumer still counts: an exclusive one is refused.
        assert!(consumers.claim("jobs", true).is_none());
        drop(new);
        assert!(consumers.claim("jobs", true).is_some());
    }
}
