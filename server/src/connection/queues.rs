//! The queue methods: `queue.declare`, `purge` and `delete`, and what a connection keeps
//! of its queues (handles by name, exclusive and auto-deleted queues). The rules are the
//! virtual host's (`vhost.rs`); this turns methods into its calls and their answers into
//! replies. What waits for the disk (a durable queue's declaration, purge or deletion) is
//! awaited, not blocked on. The exchange and binding methods are in `exchanges.rs`.

use std::sync::Arc;

use amq_protocol::protocol::{queue, AMQPClass};
use amq_protocol::types::ShortString;
use leasemq::{Queue, QueueConfig};

use super::fault::{broker_fault, locked, no_queue, refused_fault, Fault};
use super::QUEUES_SWEPT_FROM;
use super::{code, reply_to, unserved, Connection};
use crate::vhost::declare::{DeclareError, QueueDeclare, QueueDeclared};
use crate::{dead_letter, names, offload};

impl Connection {
    pub(super) fn declare(&mut self, ch: u16, declare: queue::Declare) -> Result<(), Fault> {
        if self.settings.cluster {
            if let Some(fault) = unserved::declare(ch, &declare) {
                return Err(fault);
            }
        }
        let m = AMQPClass::Queue(queue::AMQPMethod::Declare(declare.clone()));
        // An empty name asks the server to pick one, as RabbitMQ's `amq.gen-…`.
        // The broker's name for it (`names.rs`): a client's name with bytes the broker does
        // not take in names is escaped.
        let name = match declare.queue.as_str() {
            "" if !declare.passive => {
                let name = self.server_named_queue();
                // Checked by the name the client gets, not its broker name.
                let shown = names::amqp(&name).into_owned();
                self.queue_declare_permitted(ch, &shown, &declare.arguments, &m)?;
                name
            }
            given => self.vhost.broker_name(given).into_owned(),
        };
        let name = name.as_str();
        if reply_to::is_reply_name(declare.queue.as_str()) {
            return self.declare_reply_name(ch, &declare, &m);
        }
        self.check_exclusive(ch, name, &m)?;
        if declare.passive {
            let queue = self.queue(name).ok_or_else(|| no_queue(ch, name, &m))?;
            // A declare is a use, passive or not (RabbitMQ's `x-expires`).
            self.vhost.expiring.touch(name);
            return self.declared(ch, name, &queue, declare.nowait);
        }
        self.declare_in_vhost(ch, name.to_string(), &declare, m)
    }

    /// Answers a declare of the queue called `name` on channel `ch`: the channel's last
    /// queue from now on, and `declare-ok` unless `nowait`.
    fn declared(&mut self, ch: u16, name: &str, queue: &Queue, nowait: bool) -> Result<(), Fault> {
        if let Some(state) = self.channels.get_mut(&ch) {
            state.last_queue = Some(name.to_string());
        }
        if nowait {
            return Ok(());
        }
        let stats = queue.stats();
        // Those waiting their turn count too, as in RabbitMQ.
        let consumers = (stats.consumers).max(self.vhost.consumers.consumer_count(name));
        let ok = queue::DeclareOk {
            queue: ShortString::from(names::amqp(name).into_owned()),
            message_count: u32::try_from(stats.ready).unwrap_or(u32::MAX),
            consumer_count: u32::try_from(consumers).unwrap_or(u32::MAX),
        };
        self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)));
        Ok(())
    }

    /// A declare that may make the queue, by the virtual host's rules (`VHost::declare_queue`):
    /// at once, or for a durable queue (whose log and kept flags wait for the disk) off this
    /// thread, answered once made. The queue is this connection's to use, and to delete when
    /// it ends if exclusive.
    fn declare_in_vhost(
        &mut self,
        ch: u16,
        name: String,
        declare: &queue::Declare,
        m: AMQPClass,
    ) -> Result<(), Fault> {
        // `durable` makes a durable queue when the server has a data dir; without one
        // every queue is in memory (the startup line says so), and `durable` is accepted
        // as RabbitMQ clients send it by habit.
        let base = QueueConfig {
            ack_timeout: self.settings.ack_timeout,
            max_body_bytes: self.max_stored_bytes(),
            // An exclusive queue goes with its connection, which a crash ends too: kept
            // on disk, it would come back with no owner, and its program's own redeclare
            // would be refused.
            durable: declare.durable && self.settings.durable && !declare.exclusive,
            ..QueueConfig::default()
        };
        let (vhost, broker, owner) = (Arc::clone(&self.vhost), self.broker.clone(), self.id);
        let (queue_name, arguments) = (name.clone(), declare.arguments.clone());
        let reserved = declare.queue.as_str().starts_with("amq.");
        let (durable, exclusive, auto_delete) =
            (declare.durable, declare.exclusive, declare.auto_delete);
        let durable_queue = base.durable;
        let work = move || {
            let request = QueueDeclare {
                name: &queue_name,
                reserved,
                durable,
                exclusive,
                auto_delete,
                arguments: &arguments,
                owner,
            };
            vhost.declare_queue(&broker, &request, base)
        };
        let nowait = declare.nowait;
        let then =
            move |conn: &mut Connection, declared| conn.made(ch, &name, declared, nowait, &m);
        if !durable_queue {
            return then(self, work());
        }
        self.await_offloaded(ch, work, then);
        Ok(())
    }

    /// Takes the queue the virtual host made or found for a declare on channel `ch`, and
    /// answers the declare; or the refusal.
    fn made(
        &mut self,
        ch: u16,
        name: &str,
        declared: Result<QueueDeclared, DeclareError>,
        nowait: bool,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let declared = match declared {
            Ok(declared) => declared,
            Err(DeclareError::Refused(refused)) => return Err(refused_fault(ch, refused, m)),
            Err(DeclareError::Broker(e)) => return Err(broker_fault(ch, &e, m)),
        };
        let queue = declared.queue;
        self.queues.insert(name.to_string(), queue.clone());
        // Exclusive queues of this connection that `x-expires` deleted are gone.
        self.exclusive.retain(|e| !e.is_closed());
        if declared.made_exclusive {
            self.exclusive.push(queue.clone());
        }
        self.declared(ch, name, &queue, nowait)
    }

    /// The largest stored body: the largest payload, plus its properties (which fit one
    /// frame) and the few bytes of the stored layout.
    pub(super) fn max_stored_bytes(&self) -> usize {
        self.settings.max_message_bytes + self.settings.frame_max as usize + 16
    }

    /// A fresh name for a server-named queue: `amq.gen-`, then this server process's
    /// start time, the connection and a count, so that it is new in a data dir too.
    pub(super) fn server_named_queue(&mut self) -> String {
        let name = self.unique_name("amq.gen-");
        self.vhost.broker_name(&name).into_owned()
    }

    /// A name no queue had in this data dir: `prefix`, then this server process's start
    /// time, the connection and a count.
    pub(super) fn unique_name(&mut self, prefix: &str) -> String {
        use std::sync::OnceLock;
        static STARTED: OnceLock<u128> = OnceLock::new();
        let started = STARTED.get_or_init(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(0, |d| d.as_nanos())
        });
        self.next_consumer += 1;
        format!("{prefix}{started:x}-{}-{}", self.id, self.next_consumer)
    }

    /// RabbitMQ's 405 for a queue another connection holds exclusively.
    pub(super) fn check_exclusive(&self, ch: u16, name: &str, m: &AMQPClass) -> Result<(), Fault> {
        if self.locked_by_another(name) {
            return Err(locked(ch, name, m));
        }
        Ok(())
    }

    /// The name a method gives, or for an empty one the queue last declared on the
    /// channel (AMQP's rule, which RabbitMQ keeps).
    /// # Errors
    ///
    /// RabbitMQ's 404 for an empty name where no queue was declared on the channel.
    pub(super) fn queue_name(&self, ch: u16, given: &str, m: &AMQPClass) -> Result<String, Fault> {
        if !given.is_empty() {
            return Ok(self.vhost.broker_name(given).into_owned());
        }
        let last = self.channels.get(&ch).and_then(|c| c.last_queue.clone());
        last.ok_or_else(|| {
            let text = "NOT_FOUND - no previously declared queue";
            Fault::channel(ch, code::NOT_FOUND, text, m)
        })
    }

    /// The queue a method names, or its 404 (405 when another connection holds it
    /// exclusively).
    pub(super) fn named_queue(
        &mut self,
        ch: u16,
        name: &str,
        m: &AMQPClass,
    ) -> Result<Queue, Fault> {
        let name = &self.queue_name(ch, name, m)?;
        if reply_to::is_reply_name(&names::amqp(name)) {
            return Err(no_queue(ch, name, m));
        }
        self.check_exclusive(ch, name, m)?;
        self.queue(name).ok_or_else(|| no_queue(ch, name, m))
    }

    /// `queue.purge`: the ready and delayed messages go; leased ones stay.
    pub(super) fn purge(&mut self, ch: u16, purge: queue::Purge) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Purge(purge.clone()));
        let queue = self.named_queue(ch, purge.queue.as_str(), &m)?;
        if !queue.is_durable() {
            return self.purged(ch, queue.purge(), purge.nowait, &m);
        }
        // Its log waits for the disk: awaited, and answered then.
        let purged = async move { Some(queue.purge_async().await) };
        self.await_answer(ch, purged, move |conn, purged| {
            conn.purged(ch, purged, purge.nowait, &m)
        });
        Ok(())
    }

    /// Answers a purge on channel `ch` with what the broker said: `purge-ok` with the
    /// count of messages it took (none with `nowait`), or its fault.
    fn purged(
        &mut self,
        ch: u16,
        purged: Result<usize, leasemq::Error>,
        nowait: bool,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let purged = purged.map_err(|e| broker_fault(ch, &e, m))?;
        if !nowait {
            let ok = queue::PurgeOk {
                message_count: u32::try_from(purged).unwrap_or(u32::MAX),
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::PurgeOk(ok)));
        }
        Ok(())
    }

    /// `queue.delete`: the queue, its messages and its leases go (the broker's `close`);
    /// its consumers, here and on other connections, are told with `basic.cancel`. As in
    /// RabbitMQ, deleting a queue that does not exist succeeds.
    pub(super) fn delete(&mut self, ch: u16, delete: queue::Delete) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Delete(delete.clone()));
        let name = &self.queue_name(ch, delete.queue.as_str(), &m)?;
        self.check_exclusive(ch, name, &m)?;
        let mut message_count = 0;
        // A reply name is no queue to a client (`reply_to.rs`): deleting it is a no-op.
        let queue = match reply_to::is_reply_name(&names::amqp(name)) {
            true => None,
            false => self.queue(name),
        };
        if let Some(queue) = queue {
            let stats = queue.stats();
            // Consumers waiting their turn (`x-single-active-consumer`) count too.
            let consumed = stats.consumers > 0 || self.vhost.consumers.is_consumed(name);
            if delete.if_unused && consumed {
                let name = names::amqp(name);
                let text = format!(
                    "PRECONDITION_FAILED - queue '{name}' in vhost '{}' in use",
                    self.vhost.name
                );
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            // As RabbitMQ, a queue is empty when nothing waits to be delivered: leased
            // messages go with it (their late acks change nothing).
            if delete.if_empty && stats.ready + stats.delayed > 0 {
                let text = format!(
                    "PRECONDITION_FAILED - queue '{}' in vhost '{}' not empty",
                    names::amqp(name),
                    self.vhost.name
                );
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            message_count = stats.ready + stats.delayed;
            if queue.is_durable() {
                // Its close and what the virtual host keeps of it wait for the disk.
                let nowait = delete.nowait;
                let work = self.deleting(&queue);
                self.await_offloaded(ch, work, move |conn, ()| {
                    conn.deleted(ch, message_count, nowait);
                    Ok(())
                });
                return Ok(());
            }
            self.delete_queue(&queue);
        }
        self.deleted(ch, message_count, delete.nowait);
        Ok(())
    }

    /// Answers a `queue.delete` on channel `ch` that took `message_count` messages with it.
    fn deleted(&mut self, ch: u16, message_count: usize, nowait: bool) {
        if !nowait {
            let ok = queue::DeleteOk {
                message_count: u32::try_from(message_count).unwrap_or(u32::MAX),
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeleteOk(ok)));
        }
    }
}

impl Connection {
    /// A consumer of `queue` went. Its `x-expires` time starts again (from its last
    /// consumer's going, as the expiry waits while it has one), and it is deleted if it
    /// was declared `auto_delete` and its last consumer, on any connection, is gone:
    /// RabbitMQ's auto-delete (a queue that never had a consumer stays).
    pub(crate) fn auto_delete(&mut self, queue: &Queue) {
        self.vhost.expiring.touch(queue.name());
        let declared = self.vhost.declared.lock().expect("never poisoned");
        let auto = declared.get(queue.name()).is_some_and(|d| d.auto_delete);
        drop(declared);
        if auto && !queue.is_closed() && !self.vhost.consumers.is_consumed(queue.name()) {
            if queue.is_durable() {
                // Its close waits for the disk: off this thread, awaited before the next
                // frame (and done all the same if the connection is ending).
                let deleted = offload::run(self.deleting(queue));
                self.await_done(deleted);
            } else {
                self.delete_queue(queue);
            }
        }
    }

    /// Deletes the exclusive queues this connection declared (it is ending).
    pub(super) fn drop_exclusive_queues(&mut self) {
        for queue in std::mem::take(&mut self.exclusive) {
            self.delete_queue(&queue);
        }
    }

    /// Closes `queue` and forgets it: its bindings, this connection's handle, and its
    /// exclusive owner when that is this connection.
    pub(super) fn delete_queue(&mut self, queue: &Queue) {
        let work = self.deleting(queue);
        work();
    }

    /// The work of deleting `queue` (`VHost::delete_queue`), which may wait for the disk;
    /// the connection forgets its handle at once (a closed queue is never used again).
    fn deleting(&mut self, queue: &Queue) -> impl FnOnce() + Send + 'static {
        let name = queue.name();
        self.queues.remove(name);
        self.exclusive.retain(|q| q.name() != name);
        let (vhost, broker, queue, owner) = (
            Arc::clone(&self.vhost),
            self.broker.clone(),
            queue.clone(),
            self.id,
        );
        move || vhost.delete_queue(&broker, &queue, owner)
    }

    /// The connection that owns `name` as an exclusive queue, when it is not this one.
    pub(super) fn locked_by_another(&self, name: &str) -> bool {
        self.vhost.locked_by_another(name, self.id)
    }

    /// The queue called `name`, from the cache or the broker; never a holding queue of
    /// dead letters, which are the server's.
    pub(super) fn queue(&mut self, name: &str) -> Option<Queue> {
        if dead_letter::is_holding(name) {
            return None;
        }
        if let Some(q) = self.queues.get(name) {
            if !q.is_closed() {
                return Some(q.clone());
            }
            self.queues.remove(name);
        }
        let q = self.broker.queue(name)?;
        // Handles of queues deleted since are dropped once the map has doubled: a
        // connection that publishes to one queue after another (replies to direct
        // reply-to names, say) keeps only those still open.
        if self.queues.len() >= self.sweep_queues_at {
            self.queues.retain(|_, q| !q.is_closed());
            self.sweep_queues_at = (2 * self.queues.len()).max(QUEUES_SWEPT_FROM);
        }
        self.queues.insert(name.to_string(), q.clone());
        Some(q)
    }
}
