//! Dead-lettering through an exchange: RabbitMQ's `x-dead-letter-exchange`.
//!
//! The broker dead-letters a queue's messages to one queue (`QueueConfig::dead_letter`),
//! fixed when the queue is declared; an exchange routes by bindings that change after (and
//! a dead letter gains an `x-death` record each time it dies, which the broker's one
//! [`leasemq::DeathRecord`] per message cannot keep). So a queue declared with a
//! dead-letter exchange (the default one `""` too) gets a holding queue of its own,
//! [`holding_name`] (`amq.dead-letters.<queue>`), as its dead-letter queue, and one task
//! per holding queue (`vhost/dead_lettering.rs` starts them) takes each dead letter
//! from it, adds its `x-death` record, routes it through the exchange with the dead-letter routing key (or
//! its own keys) as a publish would be routed, puts a copy to each queue that reaches, and
//! only then acks it. A crash in between puts it through again: dead letters go on at
//! least once (RabbitMQ's classic queues dead-letter at most once). One the exchange
//! routes nowhere, or that a queue refuses (full), is dropped and logged, as RabbitMQ
//! drops it.
//!
//! The broker's dead letters are rejects and delivery limits (`DeathReason`). A message
//! whose TTL runs out is put in the holding queue by the server itself
//! (`message_expiry.rs`), with no death record: that is how its task tells an expiry.
//!
//! Holding queues are the server's: no client reaches one by name (`Connection::queue`).
//! When its queue is deleted, its task sends on what it still holds, then deletes it (a
//! queue of the name declared again meanwhile keeps it, and the task). One is durable
//! when its queue is, so that dead letters wait in it across a restart; they go on after
//! it, as the server keeps where a durable queue's dead letters go (`durable_queues.rs`
//! starts its task again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use leasemq::Queue;
use tokio::sync::Notify;

/// The start of every holding queue's name.
pub const PREFIX: &str = "amq.dead-letters.";

/// The longest name of a queue that dead-letters through an exchange: a queue name is at
/// most 255 bytes (contract §3 Limits), its holding queue's too.
pub const MAX_QUEUE_NAME_BYTES: usize = 255 - PREFIX.len();

/// How many dead letters a holding queue's task holds leased at once.
pub(crate) const PREFETCH: u32 = 64;

/// The name of the holding queue of `queue`.
pub fn holding_name(queue: &str) -> String {
    format!("{PREFIX}{queue}")
}

/// Whether `name` is a holding queue's.
pub fn is_holding(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// Where a queue's dead letters go: `x-dead-letter-exchange`, and
/// `x-dead-letter-routing-key` if the declare gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The exchange they are routed through.
    pub exchange: String,
    /// The routing key they are routed with; without one, their own.
    pub routing_key: Option<String>,
}

/// The queues that dead-letter through an exchange, shared by every connection of a
/// server.
#[derive(Debug, Default)]
pub struct DeadLetters {
    state: Mutex<State>,
    /// Wakes the task that starts the holding queues' tasks (`vhost/dead_lettering.rs`).
    pub(crate) wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// By the name of the queue whose dead letters they are.
    by_queue: HashMap<String, Entry>,
    /// Tasks to start: the queue's name, its holding queue, its drain signal and its
    /// number.
    starting: Vec<(String, Queue, Arc<Notify>, u64)>,
    /// Numbers the tasks, so that one that ends forgets only its own entry.
    tasks: u64,
}

#[derive(Debug)]
struct Entry {
    /// The queue whose dead letters they are: once it is closed (deleted), the task sends
    /// on what the holding queue still has, then closes it.
    source: Queue,
    holding: Queue,
    route: Route,
    /// Wakes the task when its queue is deleted.
    drain: Arc<Notify>,
    task: u64,
}

impl DeadLetters {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; take the state as it is if it did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares the queue called `queue` with `declare` (which declares its holding queue,
    /// then the queue, and gives both), to dead-letter through `route`: its task starts
    /// unless one runs. A task draining the holding queue of a queue of that name just
    /// deleted carries on for the new one. `declare` runs under this table's lock, so that
    /// such a task cannot close the holding queue between its declare and the queue's.
    ///
    /// # Errors
    ///
    /// What `declare` fails with.
    pub fn declare<E>(
        &self,
        queue: &str,
        route: Route,
        declare: impl FnOnce() -> Result<(Queue, Queue), E>,
    ) -> Result<Queue, E> {
        let mut state = self.lock();
        let (source, holding) = declare()?;
        if let Some(entry) = state.by_queue.get_mut(queue) {
            if !entry.holding.is_closed() {
                entry.source = source.clone();
                entry.route = route;
                return Ok(source);
            }
        }
        state.tasks += 1;
        let (task, drain) = (state.tasks, Arc::new(Notify::new()));
        let start = (queue.to_string(), holding.clone(), Arc::clone(&drain), task);
        state.starting.push(start);
        let entry = Entry {
            source: source.clone(),
            holding,
            route,
            drain,
            task,
        };
        state.by_queue.insert(queue.to_string(), entry);
        drop(state);
        self.wake.notify_one();
        Ok(source)
    }

    /// The tasks to start: each one's queue name, holding queue, drain signal and
    /// number.
    pub(crate) fn take_starting(&self) -> Vec<(String, Queue, Arc<Notify>, u64)> {
        std::mem::take(&mut self.lock().starting)
    }

    /// Where the dead letters of `queue` go now (the last route of one deleted and still
    /// draining); `None` once its task is not task `task`.
    pub(crate) fn route(&self, queue: &str, task: u64) -> Option<Route> {
        let state = self.lock();
        let entry = state.by_queue.get(queue).filter(|e| e.task == task)?;
        Some(entry.route.clone())
    }

    /// The route the dead letters of `queue` take now, whichever task sends them on.
    #[cfg(test)]
    pub(crate) fn route_of(&self, queue: &str) -> Option<Route> {
        (self.lock().by_queue.get(queue)).map(|e| e.route.clone())
    }

    /// The queue `closed` was deleted: its task sends on what its holding queue still
    /// holds (as RabbitMQ would have sent it on already), then closes it and ends. Whether
    /// a queue of its name has a holding queue here (the deleted one's, or a new one's).
    pub fn forget(&self, closed: &Queue) -> bool {
        let state = self.lock();
        let Some(entry) = state.by_queue.get(closed.name()) else {
            return false;
        };
        if entry.source.is_closed() {
            entry.drain.notify_one();
        }
        true
    }

    /// Task `task`, for `queue`, ends: its entry goes, so that the queue's next declare
    /// starts another.
    pub(crate) fn ended(&self, queue: &str, task: u64) {
        let mut state = self.lock();
        if state.by_queue.get(queue).is_some_and(|e| e.task == task) {
            state.by_queue.remove(queue);
        }
    }

    /// Closes the holding queue of `queue` and forgets it, if `queue` was deleted and the
    /// holding queue holds nothing more; whether the task is to end (it did, or the entry
    /// is no longer task `task`'s). Under the lock: a declare cannot get the holding queue
    /// as it closes.
    pub(crate) fn close_if_drained(&self, queue: &str, holding: &Queue, task: u64) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.by_queue.get(queue).filter(|e| e.task == task) else {
            return true;
        };
        if !entry.source.is_closed() {
            return false;
        }
        let stats = holding.stats();
        if stats.ready + stats.delayed + stats.leased > 0 {
            return false;
        }
        state.by_queue.remove(queue);
        holding.close();
        true
    }
}
