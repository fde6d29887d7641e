//! Message TTL at the head of a queue, as RabbitMQ expires messages.
//!
//! A message whose time is up (`x-message-ttl`, or its own `expiration`, the shorter of
//! the two) leaves its queue once it is at the head, whether or not anyone consumes the
//! queue: dropped or, on a queue with a dead-letter exchange, dead-lettered with the
//! reason `expired`. That is RabbitMQ's delay-queue pattern: a queue nobody consumes, whose
//! messages move on through its dead-letter exchange as their time runs out. As in
//! RabbitMQ only the head is looked at, so a message behind one that expires later waits
//! for it. A consumer or `basic.get` that reaches a message past its time never delivers
//! it either (`connection/channel.rs`); on a queue with a dead-letter exchange the
//! consumer's connection hands such a delivery here ([`MessageExpiry::hand_over`]).
//!
//! Watched are the queues with `x-message-ttl`, any queue a message with an `expiration`
//! is published to, and, after a restart, the durable queues that dead-letter through an
//! exchange (messages with an `expiration` may wait in them). Connections
//! read no clock: after a batch of publishes that may expire (every publish to a queue with
//! `x-message-ttl`, one with an `expiration` to any queue) they poke the queue
//! ([`MessageExpiry::published`]), which arms it unless it is armed already, so a busy
//! queue costs one lookup per batch. One task per virtual host (`VHost::expire_messages`)
//! looks at the head of each armed queue when it is poked and when its time comes:
//! - a queue with a consumer is not looked at, only looked at again after [`RECHECK`]:
//!   its consumers meet what expires as they reach it, and a look would take a message
//!   from under them (one of theirs could overtake it meanwhile);
//! - a head past its time goes (dropped, or dead-lettered), and the next head is looked at;
//! - a head with time left is handed back unseen (`release`: no attempt counted), and the
//!   queue is looked at again when that head is due;
//! - a head that never expires (on a queue with no `x-message-ttl`) is handed back too:
//!   what is behind it waits for it. The queue is looked at again after [`RECHECK`] if
//!   messages with an `expiration` of their own were ever published to it, else disarmed;
//! - nothing ready: the queue is disarmed, or, where messages may expire and some are
//!   leased or delayed, looked at again after [`RECHECK`], since those come back with no
//!   publish (a requeue, a lease that ran out).
//!
//! Each look that hands a head back counts in the queue's `delivered` and `released`. A
//! look holds the messages it took for a moment: a `basic.get` that meets nothing while
//! one is under way takes again once it has ended (`connection/get.rs`), so that a look
//! never makes a get answer `get-empty` on a queue with messages ready.
//!
//! Dead-lettering an expired message of a durable queue is a put to the holding queue,
//! then an ack: a crash in between dead-letters it again after the restart (dead letters
//! go on at least once, `dead_letter.rs`). On a queue in memory the ack comes first, and
//! only a message whose ack took is put: one its consumer's end returned to the queue
//! meanwhile stays there, to expire again, rather than be dead-lettered twice.
//!
//! [`MessageExpiry`] takes the time as an argument, and the look at a head
//! (`VHost::look_at_head`) reads the server's [`WallClock`](crate::WallClock), so tests drive
//! both by hand.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use leasemq::{Delivery, Queue};
use tokio::sync::Notify;

use crate::dead_letter;

/// How long after a look a queue is looked at again when nothing there had a time to wait
/// for: its head never expires, or what it holds is leased or delayed. In milliseconds.
pub const RECHECK: u64 = 1_000;

/// At most this many messages expire in one look, so that a long run of them does not
/// keep the task's thread from the other queues.
pub(crate) const AT_MOST_PER_LOOK: usize = 4_096;

/// The most messages a look takes from a head at once.
pub(crate) const MOST_TAKEN_AT_ONCE: u32 = 256;

/// The name of the consumer a look at a head makes.
pub(crate) const CONSUMER: &str = "leasemqd-message-ttl";

/// The queues whose messages expire at the head, shared by every connection of a server.
#[derive(Debug, Default)]
pub struct MessageExpiry {
    /// How many queues are watched: while none is, a publish takes no lock.
    watched: AtomicUsize,
    state: Mutex<State>,
    /// Wakes `VHost::expire_messages` when a queue was poked or a delivery handed over.
    pub(crate) wake: Notify,
    /// Counts each look's beginning and its end: odd while a look holds messages taken
    /// from a head. A `basic.get` that met nothing while it moved looks again.
    looks: AtomicU64,
    /// Signalled when a look ends.
    look_ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, Watched>,
    /// Queues to look at as soon as the task runs: newly watched, or poked by a publish.
    poked: Vec<String>,
    /// Expired deliveries that consumers met, to be dead-lettered.
    handed: Vec<(Queue, Delivery)>,
    /// Handed deliveries whose holding queue refused them, tried again at a time
    /// (milliseconds since the Unix epoch). Kept, not released: a consumer would take
    /// one straight back and hand it over again.
    retry: Vec<(u64, Queue, Delivery)>,
    /// The queue whose head is being looked at, if any.
    looking: Option<String>,
    /// When a queue's head is looked at next (milliseconds since the Unix epoch),
    /// earliest first; one per queue at most.
    deadlines: BTreeSet<(u64, String)>,
    /// How many queues are watched when closed ones are next swept out (a queue deleted
    /// other than through `VHost::forget`, a reply-to queue, leaves its entry).
    sweep_at: usize,
}

#[derive(Debug)]
struct Watched {
    queue: Queue,
    /// Its `x-message-ttl`, in milliseconds.
    ttl: Option<u64>,
    /// A message with an `expiration` of its own was published to it.
    own_ttl: bool,
    /// It will be looked at: poked, given a deadline, or being looked at now. A publish
    /// pokes only a queue that is not.
    armed: bool,
    /// Its entry in `deadlines`.
    deadline: Option<u64>,
}

/// What a look at a queue's head found: when to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// At this time (milliseconds since the Unix epoch), or a publish's poke if sooner.
    At(u64),
    /// When a publish pokes it: the queue holds nothing (or is gone, and
    /// [`looked`](MessageExpiry::looked) forgets it).
    Poked,
}

/// A queue whose head is to be looked at (`VHost::look_at_head`).
#[derive(Debug)]
pub struct Look {
    /// The queue.
    pub queue: Queue,
    /// Its `x-message-ttl`, in milliseconds.
    pub ttl: Option<u64>,
    /// Whether messages with an `expiration` of their own were published to it.
    pub own_ttl: bool,
}

/// What is due at a time: the queues to look at, and the deliveries handed over.
#[derive(Debug, Default)]
pub struct Due {
    /// The queues whose heads to look at.
    pub queues: Vec<Look>,
    /// The deliveries to dead-letter, each with its queue
    /// ([`VHost::expire`](crate::vhost::VHost::expire)).
    pub handed: Vec<(Queue, Delivery)>,
}

impl MessageExpiry {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches `queue`, whose `x-message-ttl` is `ttl`: its head is looked at soon. A
    /// queue watched already keeps its state (a redeclare is no publish).
    pub fn watch(&self, queue: &Queue, ttl: Option<u64>) {
        let mut state = self.lock();
        let name = queue.name();
        if (state.queues.get(name)).is_some_and(|w| !w.queue.is_closed()) {
            return;
        }
        state.insert(queue, ttl, false);
        self.recount(&state);
        drop(state);
        self.wake.notify_one();
    }

    /// Forgets the queue called `name` if the one watched by that name is closed (it was
    /// deleted; one declared since under the name stays).
    pub fn forget_closed(&self, name: &str) {
        if !self.is_watching() {
            return;
        }
        let mut state = self.lock();
        if (state.queues.get(name)).is_some_and(|w| w.queue.is_closed()) {
            state.remove(name);
            self.recount(&state);
        }
    }

    /// Whether any queue is watched: a publish with none need not ask [`published`].
    ///
    /// [`published`]: MessageExpiry::published
    pub fn is_watching(&self) -> bool {
        self.watched.load(Ordering::Relaxed) > 0
    }

    /// Messages were put to `queue` (the put sent to its shard before this call), some
    /// with an `expiration` of their own if `own_ttl`: arms the queue if they may expire
    /// there, watching it from now on if it was not (it has no `x-message-ttl` then).
    pub fn published(&self, queue: &Queue, own_ttl: bool) {
        if !own_ttl && !self.is_watching() {
            return;
        }
        let mut state = self.lock();
        let name = queue.name();
        match state.queues.get_mut(name) {
            Some(watched) if !watched.queue.is_closed() => {
                watched.own_ttl |= own_ttl;
                if watched.armed || !(own_ttl || watched.ttl.is_some()) {
                    return;
                }
                watched.armed = true;
                state.poked.push(name.to_string());
            }
            _ if own_ttl => {
                state.insert(queue, None, true);
                self.recount(&state);
            }
            _ => return,
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Hands over `delivery` of `queue`, which a consumer found past its time on a queue
    /// with a dead-letter exchange: `VHost::expire_messages` dead-letters it.
    pub fn hand_over(&self, queue: Queue, delivery: Delivery) {
        self.lock().handed.push((queue, delivery));
        self.wake.notify_one();
    }

    /// Keeps `delivery` of `queue`, handed over and refused by the holding queue, to be
    /// tried again at `at`.
    pub fn retry_at(&self, at: u64, queue: Queue, delivery: Delivery) {
        self.lock().retry.push((at, queue, delivery));
    }

    /// Arms every watched queue, to be looked at soon: what a look that failed midway had
    /// left armed with no deadline.
    pub fn poke_all(&self) {
        let mut state = self.lock();
        let names: Vec<String> = state.queues.keys().cloned().collect();
        for name in names {
            state.disarm(&name);
            state.queues.get_mut(&name).expect("just listed").armed = true;
            state.poked.push(name);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// What is due at `now`, and when the next deadline is. The queues handed out stay
    /// armed until [`looked`](MessageExpiry::looked) says what was found.
    pub fn due(&self, now: u64) -> (Due, Option<u64>) {
        let mut state = self.lock();
        let mut names: Vec<String> = std::mem::take(&mut state.poked);
        while let Some((at, name)) = state.deadlines.first().cloned() {
            if at > now {
                break;
            }
            state.deadlines.pop_first();
            names.push(name);
        }
        let mut due = Due {
            handed: std::mem::take(&mut state.handed),
            ..Due::default()
        };
        let (retried, waiting) = (std::mem::take(&mut state.retry).into_iter())
            .partition::<Vec<_>, _>(|(at, _, _)| *at <= now);
        state.retry = waiting;
        (due.handed).extend(retried.into_iter().map(|(_, queue, d)| (queue, d)));
        let mut seen = HashSet::new();
        for name in names {
            if !seen.insert(name.clone()) {
                continue;
            }
            let Some(watched) = state.queues.get(&name) else {
                continue;
            };
            if watched.queue.is_closed() {
                state.remove(&name);
                continue;
            }
            let look = Look {
                queue: watched.queue.clone(),
                ttl: watched.ttl,
                own_ttl: watched.own_ttl,
            };
            state.disarm(&name);
            let watched = state.queues.get_mut(&name).expect("just seen");
            watched.armed = true;
            due.queues.push(look);
        }
        self.recount(&state);
        let next = state.deadlines.first().map(|(at, _)| *at);
        let retry = state.retry.iter().map(|(at, _, _)| *at).min();
        (due, next.into_iter().chain(retry).min())
    }

    /// Disarms `queue` just before a look at it finds it holds nothing: a publish from
    /// then on pokes it.
    pub(crate) fn disarm(&self, queue: &Queue) {
        let mut state = self.lock();
        if queue.is_closed() {
            return;
        }
        state.disarm(queue.name());
    }

    /// What a look at `queue`'s head found (`VHost::look_at_head`).
    pub fn looked(&self, queue: &Queue, next: Next) {
        let mut state = self.lock();
        let name = queue.name();
        match next {
            _ if queue.is_closed() => {
                if (state.queues.get(name)).is_some_and(|w| w.queue.is_closed()) {
                    state.remove(name);
                }
            }
            Next::Poked => {}
            Next::At(at) => {
                let Some(watched) = state.queues.get_mut(name) else {
                    return;
                };
                watched.armed = true;
                if watched.deadline.is_some_and(|d| d <= at) {
                    return;
                }
                let earlier = watched.deadline.replace(at);
                if let Some(earlier) = earlier {
                    state.deadlines.remove(&(earlier, name.to_string()));
                }
                state.deadlines.insert((at, name.to_string()));
            }
        }
        self.recount(&state);
    }

    /// Marks a look at `queue`'s head as begun, until the guard it returns is dropped (a
    /// look that panics ends too).
    pub(crate) fn begin_look(&self, queue: &Queue) -> LookGuard<'_> {
        self.lock().looking = Some(queue.name().to_string());
        self.looks.fetch_add(1, Ordering::SeqCst);
        LookGuard { expiry: self }
    }

    /// Where the looks stand now: what [`may_have_hidden`](MessageExpiry::may_have_hidden)
    /// compares with.
    pub fn looks(&self) -> u64 {
        self.looks.load(Ordering::SeqCst)
    }

    /// Whether a look may have held messages of some queue since `looks` was read: one
    /// was under way then, or one began or ended since.
    pub fn may_have_hidden(&self, looks: u64) -> bool {
        looks % 2 == 1 || self.looks() != looks
    }

    /// Waits, at most `timeout`, until no look holds messages of the queue called `name`.
    pub fn wait_for_look(&self, name: &str, timeout: Duration) {
        let state = self.lock();
        let busy = |state: &mut State| state.looking.as_deref() == Some(name);
        let waited = self.look_ended.wait_timeout_while(state, timeout, busy);
        drop(waited.unwrap_or_else(|e| e.into_inner()));
    }

    fn recount(&self, state: &State) {
        self.watched.store(state.queues.len(), Ordering::Relaxed);
    }
}

/// A look under way ([`MessageExpiry::begin_look`]); dropped, it ends.
pub(crate) struct LookGuard<'a> {
    expiry: &'a MessageExpiry,
}

impl Drop for LookGuard<'_> {
    fn drop(&mut self) {
        self.expiry.lock().looking = None;
        self.expiry.looks.fetch_add(1, Ordering::SeqCst);
        self.expiry.look_ended.notify_all();
    }
}

impl State {
    /// Watches `queue` afresh (in place of a closed queue of its name), armed and poked.
    fn insert(&mut self, queue: &Queue, ttl: Option<u64>, own_ttl: bool) {
        let name = queue.name();
        self.remove(name);
        if self.queues.len() >= self.sweep_at {
            // A closed queue's deadline, if it has one, is passed over when it comes.
            self.queues.retain(|_, watched| !watched.queue.is_closed());
            self.sweep_at = (2 * self.queues.len()).max(64);
        }
        let watched = Watched {
            queue: queue.clone(),
            ttl,
            own_ttl,
            armed: true,
            deadline: None,
        };
        self.queues.insert(name.to_string(), watched);
        self.poked.push(name.to_string());
    }

    /// Takes the queue called `name` out of `deadlines`, and marks it not armed.
    fn disarm(&mut self, name: &str) {
        let Some(watched) = self.queues.get_mut(name) else {
            return;
        };
        watched.armed = false;
        if let Some(at) = watched.deadline.take() {
            self.deadlines.remove(&(at, name.to_string()));
        }
    }

    fn remove(&mut self, name: &str) {
        self.disarm(name);
        self.queues.remove(name);
    }
}

/// Whether a delivery from `queue` that is past its time is to be handed over
/// ([`MessageExpiry::hand_over`]) rather than dropped: the queue dead-letters through an
/// exchange.
pub fn dead_letters(queue: &Queue) -> bool {
    (queue.config().dead_letter.as_deref()).is_some_and(dead_letter::is_holding)
}

#[cfg(test)]
mod tests {
    use leasemq::{Broker, QueueConfig};

    use super::*;

    #[test]
    fn queues_closed_behind_its_back_are_swept_out_as_more_are_watched() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let expiry = MessageExpiry::default();
        let declare = |name: &str| broker.declare_queue(name, QueueConfig::default()).unwrap();
        let queues: Vec<Queue> = (0..64).map(|i| declare(&format!("q{i}"))).collect();
        for queue in &queues {
            // A message with an `expiration` of its own watches the queue it went to.
            expiry.published(queue, true);
        }
        assert_eq!(expiry.watched.load(Ordering::Relaxed), 64);
        for queue in &queues[..60] {
            assert!(queue.close());
        }
        expiry.published(&declare("more"), true);
        assert_eq!(
            expiry.watched.load(Ordering::Relaxed),
            5,
            "the closed ones went"
        );
        let (due, _) = expiry.due(0);
        assert_eq!(due.queues.len(), 5, "each open one looked at once");
    }
}
