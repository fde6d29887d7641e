//! The methods that change what the virtual host keeps: `queue.declare`, `purge`,
//! `delete`, `bind` and `unbind`, and the exchange methods. The rules are the virtual
//! host's (`vhost.rs`) and the exchanges' (`exchange.rs`); this turns methods into their
//! calls and their answers into replies.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, queue, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use leasemq::{Queue, QueueConfig};

use super::answers::Then;
use super::fault::{
    broker_fault, exchange_fault, locked, no_queue, refused_fault, unserved_exchange_type, Fault,
};
use super::QUEUES_SWEPT_FROM;
use super::{code, reply_to, Connection};
use crate::exchange::{HeadersBinding, Kind, Refusal, Shape};
use crate::vhost::declare::{DeclareError, QueueDeclare, QueueDeclared};
use crate::{dead_letter, names};

impl Connection {
    pub(super) fn declare(&mut self, ch: u16, declare: queue::Declare) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Declare(declare.clone()));
        // An empty name asks the server to pick one, as RabbitMQ's `amq.gen-…`.
        // The broker's name for it (`names.rs`): a client's name with bytes the broker does
        // not take in names is escaped.
        let name = match declare.queue.as_str() {
            "" if !declare.passive => self.server_named_queue(),
            given => names::engine(given).into_owned(),
        };
        let name = name.as_str();
        if reply_to::is_reply_name(name) {
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
        self.unique_name("amq.gen-")
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
            return Ok(names::engine(given).into_owned());
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
        if reply_to::is_reply_name(name) {
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
        let serial = self.channels.get(&ch).map_or(0, |c| c.serial);
        self.await_call(async move {
            let purged = queue.purge_async().await;
            Box::new(move |conn: &mut Connection| {
                if conn
                    .channels
                    .get(&ch)
                    .is_some_and(|c| c.serial == serial && !c.closing)
                {
                    if let Err(fault) = conn.purged(ch, purged, purge.nowait, &m) {
                        conn.fail(fault);
                    }
                }
            }) as Then
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
        let queue = match reply_to::is_reply_name(name) {
            true => None,
            false => self.queue(name),
        };
        if let Some(queue) = queue {
            let stats = queue.stats();
            // Consumers waiting their turn (`x-single-active-consumer`) count too.
            let consumed = stats.consumers > 0 || self.vhost.consumers.is_consumed(name);
            if delete.if_unused && consumed {
                let name = names::amqp(name);
                let text = format!("PRECONDITION_FAILED - queue '{name}' in vhost '/' in use");
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            // As RabbitMQ, a queue is empty when nothing waits to be delivered: leased
            // messages go with it (their late acks change nothing).
            if delete.if_empty && stats.ready + stats.delayed > 0 {
                let text = format!(
                    "PRECONDITION_FAILED - queue '{}' in vhost '/' is not empty",
                    names::amqp(name)
                );
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            message_count = stats.ready + stats.delayed;
            self.delete_queue(&queue);
        }
        if !delete.nowait {
            let ok = queue::DeleteOk {
                message_count: u32::try_from(message_count).unwrap_or(u32::MAX),
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeleteOk(ok)));
        }
        Ok(())
    }

    /// `exchange.declare` of the types served (and `passive` checks of any exchange), with
    /// `internal` and `alternate-exchange`.
    pub(super) fn exchange_declare(
        &mut self,
        ch: u16,
        declare: exchange::Declare,
    ) -> Result<(), Fault> {
        let m = AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare.clone()));
        let name = declare.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        if declare.passive {
            // As RabbitMQ: the default exchange is not declared, passively or not.
            if name.is_empty() {
                return Err(exchange_fault(ch, Refusal::Reserved, name, &m));
            }
            if !exchanges.exists(name) {
                return Err(exchange_fault(ch, Refusal::NotFound, name, &m));
            }
        } else {
            let kind = declare.kind.as_str();
            let Some(served) = Kind::named(kind) else {
                return Err(unserved_exchange_type(kind, &m));
            };
            let arguments = declare.arguments.inner();
            let alternate = match arguments.get("alternate-exchange") {
                None => None,
                Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes())),
                Some(AMQPValue::ShortString(s)) => Some(s.as_str().into()),
                Some(other) => {
                    let text = format!(
                        "PRECONDITION_FAILED - invalid type '{}' for arg 'alternate-exchange' in exchange '{name}' in vhost '/'",
                        crate::field::type_name(other)
                    );
                    return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
                }
            };
            // RabbitMQ compares no argument of a redeclare but the alternate (it keeps the
            // first declare's); a new exchange with one leasemqd does not serve is a 540.
            let unserved = arguments
                .keys()
                .find(|arg| arg.as_str() != "alternate-exchange");
            if let (Some(arg), false) = (unserved, exchanges.exists(name)) {
                let text = format!("exchange argument '{arg}' is not supported by leasemqd yet");
                return Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m));
            }
            let shape = Shape {
                kind: served,
                durable: declare.durable,
                auto_delete: declare.auto_delete,
                internal: declare.internal,
                alternate: alternate.map(|name| name.into_owned()),
            };
            // Each is checked where exchanges are kept.
            exchanges
                .declare_shaped(name, shape)
                .map_err(|r| exchange_fault(ch, r, name, &m))?;
        }
        drop(exchanges);
        if !declare.nowait {
            let ok = exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {});
            self.send(ch, AMQPClass::Exchange(ok));
        }
        Ok(())
    }

    pub(super) fn exchange_delete(
        &mut self,
        ch: u16,
        delete: exchange::Delete,
    ) -> Result<(), Fault> {
        let m = AMQPClass::Exchange(exchange::AMQPMethod::Delete(delete.clone()));
        let name = delete.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        exchanges
            .delete(name, delete.if_unused)
            .map_err(|r| exchange_fault(ch, r, name, &m))?;
        drop(exchanges);
        if !delete.nowait {
            let ok = exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {});
            self.send(ch, AMQPClass::Exchange(ok));
        }
        Ok(())
    }

    /// `queue.bind` of an existing queue to a direct exchange.
    pub(super) fn bind(&mut self, ch: u16, bind: queue::Bind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Bind(bind.clone()));
        let name = bind.exchange.as_str();
        let kind = (self.vhost.exchanges.lock().expect("never poisoned")).kind(name);
        let key = binding_key(ch, kind, bind.routing_key.as_str(), &bind.arguments, &m)?;
        let queue = self.named_queue(ch, bind.queue.as_str(), &m)?;
        // Kept across a restart only if the queue is: durable, and not exclusive.
        let exclusive =
            (self.vhost.exclusive.lock().expect("never poisoned")).contains_key(queue.name());
        let durable_queue = queue.is_durable() && !exclusive;
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        exchanges
            .bind(name, &key, queue.name(), durable_queue)
            .map_err(|r| exchange_fault(ch, r, name, &m))?;
        drop(exchanges);
        if !bind.nowait {
            let ok = queue::AMQPMethod::BindOk(queue::BindOk {});
            self.send(ch, AMQPClass::Queue(ok));
        }
        Ok(())
    }

    /// `exchange.bind`: `destination` gets what `source` routes with `key` (or, from a
    /// headers exchange, the binding's arguments).
    pub(super) fn bind_exchange(
        &mut self,
        ch: u16,
        (source, key, destination): (&str, &str, &str),
        arguments: &FieldTable,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        // As RabbitMQ: the default exchange first, then the source, then the destination.
        for name in [source, destination] {
            if name.is_empty() {
                return Err(exchange_fault(ch, Refusal::Reserved, name, m));
            }
        }
        for name in [source, destination] {
            if !exchanges.exists(name) {
                return Err(exchange_fault(ch, Refusal::NotFound, name, m));
            }
        }
        let key = binding_key(ch, exchanges.kind(source), key, arguments, m)?;
        (exchanges.bind_exchange(source, &key, destination))
            .map_err(|r| exchange_fault(ch, r, source, m))
    }

    /// `exchange.unbind`: as `queue.unbind`, removing a binding that is not there
    /// succeeds.
    pub(super) fn unbind_exchange(
        &self,
        ch: u16,
        (source, key, destination): (&str, &str, &str),
        arguments: &FieldTable,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        match unbinding_key(exchanges.kind(source), key, arguments) {
            Some(key) => (exchanges.unbind_exchange(source, &key, destination))
                .map_err(|r| exchange_fault(ch, r, source, m)),
            None => Ok(()),
        }
    }

    /// `queue.unbind`: as in RabbitMQ, removing a binding that is not there (its queue or
    /// its exchange missing too) succeeds.
    pub(super) fn unbind(&mut self, ch: u16, unbind: queue::Unbind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Unbind(unbind.clone()));
        let queue = &self.queue_name(ch, unbind.queue.as_str(), &m)?;
        self.check_exclusive(ch, queue, &m)?;
        let name = unbind.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        let kind = exchanges.kind(name);
        if let Some(key) = unbinding_key(kind, unbind.routing_key.as_str(), &unbind.arguments) {
            exchanges
                .unbind(name, &key, queue)
                .map_err(|r| exchange_fault(ch, r, name, &m))?;
        }
        drop(exchanges);
        let ok = queue::AMQPMethod::UnbindOk(queue::UnbindOk {});
        self.send(ch, AMQPClass::Queue(ok));
        Ok(())
    }
}

/// `requeue=true` is a nack with no delay; `false` a reject (dead letter).
/// RabbitMQ's 404 for a queue that does not exist (or a name that is no queue).
/// The key a binding from an exchange of `kind` is kept under: its routing key, or from a
/// headers exchange (which reads no routing key) its arguments, encoded. Arguments on
/// another exchange's binding are not served (540).
pub(super) fn binding_key(
    ch: u16,
    kind: Option<Kind>,
    key: &str,
    arguments: &FieldTable,
    m: &AMQPClass,
) -> Result<String, Fault> {
    match kind {
        Some(Kind::Headers) => HeadersBinding::from_arguments(arguments)
            .map(|b| b.encode())
            .map_err(|why| {
                let text = format!("PRECONDITION_FAILED - {why}");
                Fault::channel(ch, code::PRECONDITION_FAILED, text, m)
            }),
        _ => match arguments.inner().keys().next() {
            Some(arg) => {
                let text = format!(
                    "binding argument '{arg}' is not supported by leasemqd yet (only on a headers exchange)"
                );
                Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m))
            }
            None => Ok(key.to_string()),
        },
    }
}

/// The key of the binding an unbind names, as [`binding_key`] keeps it; `None` where it
/// names one that was never made (arguments on another exchange's binding), whose removal
/// changes nothing.
pub(super) fn unbinding_key(
    kind: Option<Kind>,
    key: &str,
    arguments: &FieldTable,
) -> Option<String> {
    match kind {
        Some(Kind::Headers) => HeadersBinding::from_arguments(arguments)
            .ok()
            .map(|b| b.encode()),
        _ if arguments.inner().is_empty() => Some(key.to_string()),
        _ => None,
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
            self.delete_queue(queue);
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
        let name = queue.name();
        let closed = queue.close();
        if self.queues.get(name).is_some_and(Queue::is_closed) {
            self.queues.remove(name);
        }
        self.exclusive
            .retain(|q| q.name() != name || !q.is_closed());
        // Closed before (by `x-expires`, another connection's delete): forgotten then.
        if closed {
            let tracked = self.vhost.forget(queue, Some(self.id));
            // A durable queue brought back by a restart with no declaration kept (from a
            // build that kept none) and deleted before it was declared again may have a
            // holding queue of dead letters that nothing forwards (its route was never
            // said): it goes, with what it holds.
            if !tracked && queue.is_durable() {
                let holding = self.broker.queue(&dead_letter::holding_name(name));
                if let Some(holding) = holding {
                    holding.close();
                }
            }
        }
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
