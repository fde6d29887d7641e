//! A virtual host: the queues, exchanges and bindings the server's clients share, what it
//! keeps of each queue by name, and the work it does on them by itself.
//!
//! [`VHost`] owns the registries a client's methods change: each queue's exclusive owner
//! and declared flags (and, with a data dir, their file), its AMQP consumers, the
//! exchanges and bindings, and the queues that expire, dead-letter or drop their expired
//! messages. Connections reach these through it, never through one another. It is the
//! unit the coming virtual hosts multiply; today a server has one, `/`.
//!
//! Its own work runs in tasks (children of this module), each started by
//! [`VHost::forward_dead_letters`], [`VHost::expire_queues`] and
//! [`VHost::expire_messages`]: dead letters sent on through exchanges, queues deleted by
//! `x-expires`, message TTL at the heads of queues. A restart with a data dir brings back
//! its durable queues' flags ([`VHost::restore`]).
//!
//! What it must not know: connections, channels and frames. It answers in plain values
//! and leaves the AMQP replies to the channel.

mod dead_lettering;
pub mod declare;
mod expiring;
mod message_expiring;
mod restore;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use leasemq::{Broker, Queue};

use crate::clock::WallClock;
use crate::consumers::QueueConsumers;
use crate::dead_letter::{self, DeadLetters};
use crate::declared::Declared;
use crate::durable_queues::QueueFile;
use crate::exchange::{Exchanges, Refusal};
use crate::expiry::Expiring;
use crate::message_expiry::MessageExpiry;
use crate::metrics::Metrics;
use crate::settings::Settings;

/// One virtual host's registries; see the module docs.
#[derive(Debug, Default)]
pub struct VHost {
    /// The exclusive queues of every connection, by name, with the id of the connection
    /// that owns each: another connection may publish to one but not use it otherwise.
    pub exclusive: Mutex<HashMap<String, u64>>,
    /// The flags each queue was declared with, by name, for RabbitMQ's check of a
    /// redeclare; a durable queue's are kept in `queue_file` and come back with it after a
    /// restart ([`VHost::restore`]).
    pub declared: Mutex<HashMap<String, Declared>>,
    /// With a data dir: where the durable queues' entries of `declared` are kept.
    pub queue_file: Option<QueueFile>,
    /// The AMQP consumers of every queue, and which queues one holds exclusively.
    pub consumers: Arc<QueueConsumers>,
    /// The exchanges and bindings every connection routes through.
    pub exchanges: Mutex<Exchanges>,
    /// The queues declared with `x-expires`, deleted once unused that long (`expiry.rs`).
    pub expiring: Expiring,
    /// The queues that dead-letter through an exchange (`dead_letter.rs`).
    pub dead_letters: DeadLetters,
    /// The queues whose messages expire at the head (`message_expiry.rs`).
    pub message_expiry: MessageExpiry,
    /// Set once a queue is declared with `x-message-ttl`: from then on every publish is
    /// stamped with its arrival (before it is routed), not only one with an `expiration`.
    /// Until then none needs it, and stamping would cost every message 8 bytes.
    pub message_ttl_used: AtomicBool,
    /// When messages arrive and expire: the server's wall clock.
    pub clock: WallClock,
    /// Where its tasks count what they do (expired and dropped messages).
    pub metrics: Arc<Metrics>,
}

impl VHost {
    /// An empty virtual host on the server's clock and metrics.
    pub fn new(settings: &Settings) -> VHost {
        VHost {
            clock: settings.clock.clone(),
            metrics: Arc::clone(&settings.metrics),
            ..VHost::default()
        }
    }

    /// Deletes `queue` where no connection asked for it (`x-expires`): closes it, and if
    /// that closed it, forgets what the server keeps of it by name.
    pub fn forget_queue(&self, queue: &Queue) {
        // Its owner, if it is exclusive, as it was while the queue was open.
        let owner = (self.exclusive.lock().expect("never poisoned"))
            .get(queue.name())
            .copied();
        if queue.close() {
            self.forget(queue, owner);
        }
    }

    /// Deletes `queue` for the connection `owner` (its delete, or its auto-delete): closes
    /// it, and if that closed it, forgets what the virtual host keeps of it (a queue closed
    /// before, by `x-expires` or another connection, was forgotten then). Waits for the disk
    /// where the queue is durable.
    pub fn delete_queue(&self, broker: &Broker, queue: &Queue, owner: u64) {
        if !queue.close() {
            return;
        }
        let tracked = self.forget(queue, Some(owner));
        // A durable queue brought back by a restart with no declaration kept (from a build
        // that kept none) and deleted before it was declared again may have a holding queue
        // of dead letters that nothing forwards (its route was never said): it goes, with
        // what it holds.
        if !tracked && queue.is_durable() {
            if let Some(holding) = broker.queue(&dead_letter::holding_name(queue.name())) {
                holding.close();
            }
        }
    }

    /// Writes the durable queues' entries of `declared` (the table, whose lock the caller
    /// hands over just after its change) to the data dir, if there is one; the table is
    /// unlocked before the write. A failed write is logged: the queues serve on, and a
    /// restart brings them back as the file last written has them (those missing are as
    /// declared again).
    pub(crate) fn keep_durable_queues(&self, declared: MutexGuard<'_, HashMap<String, Declared>>) {
        let Some(file) = &self.queue_file else {
            return;
        };
        let snapshot = file.snapshot(&declared);
        drop(declared);
        if let Err(why) = file.write(snapshot) {
            tracing::warn!("durable queues' declarations not kept: {why}");
        }
    }

    /// Forgets what the server keeps of the queue called `name`, which was just closed
    /// (by the caller: a queue closed before is forgotten by whoever closed it, and its
    /// name may already be another queue's): its bindings, its declared flags, its
    /// consumers' entry and its expiry, and its exclusive owner if that is `owner`; its
    /// holding queue of dead letters drains and goes. Whether it had one here.
    pub(crate) fn forget(&self, queue: &Queue, owner: Option<u64>) -> bool {
        let name = queue.name();
        let mut owners = self.exclusive.lock().expect("never poisoned");
        if owner.is_some() && owners.get(name) == owner.as_ref() {
            owners.remove(name);
        }
        drop(owners);
        self.consumers.forget(name);
        let mut declared = self.declared.lock().expect("never poisoned");
        if declared.remove(name).is_some_and(|d| d.durable) {
            self.keep_durable_queues(declared);
        } else {
            drop(declared);
        }
        self.expiring.forget_closed(name);
        self.message_expiry.forget_closed(name);
        let dead_letters = self.dead_letters.forget(queue);
        let mut exchanges = self.exchanges.lock().expect("never poisoned");
        if let Err(Refusal::Storage(why)) = exchanges.unbind_queue(name) {
            tracing::warn!("queue {name} was deleted, but its bindings stay on disk: {why}");
        }
        dead_letters
    }
}
