//! The methods that change the exchanges and bindings: `exchange.declare`, `delete`,
//! `bind` and `unbind`, and `queue.bind` and `unbind`. The table is the virtual host's
//! (`exchange.rs`); with a data dir a change rewrites its file, so it runs off the
//! connection's thread.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, queue, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};

use super::fault::{exchange_fault, unserved_exchange_type, Fault};
use super::{code, Connection};
use crate::exchange::{Exchanges, HeadersBinding, Kind, Refusal, Shape};

impl Connection {
    /// Runs `op` on the virtual host's exchanges, then `answer`: at once without a data
    /// dir; with one (where a change rewrites the exchanges' file and waits for the disk),
    /// off this thread, awaited before the next frame.
    fn with_exchanges(
        &mut self,
        ch: u16,
        op: impl FnOnce(&mut Exchanges) -> Result<(), Fault> + Send + 'static,
        answer: impl FnOnce(&mut Connection) + Send + 'static,
    ) -> Result<(), Fault> {
        let vhost = Arc::clone(&self.vhost);
        let work = move || op(&mut vhost.exchanges.lock().expect("never poisoned"));
        if !self.settings.durable {
            work()?;
            answer(self);
            return Ok(());
        }
        self.await_offloaded(ch, work, move |conn, done| {
            done?;
            answer(conn);
            Ok(())
        });
        Ok(())
    }

    /// `exchange.declare` of the types served (and `passive` checks of any exchange), with
    /// `internal` and `alternate-exchange`.
    pub(super) fn exchange_declare(
        &mut self,
        ch: u16,
        declare: exchange::Declare,
    ) -> Result<(), Fault> {
        let nowait = declare.nowait;
        let op = move |exchanges: &mut Exchanges| declare_exchange(ch, &declare, exchanges);
        self.with_exchanges(ch, op, move |conn| {
            if !nowait {
                let ok = exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {});
                conn.send(ch, AMQPClass::Exchange(ok));
            }
        })
    }

    pub(super) fn exchange_delete(
        &mut self,
        ch: u16,
        delete: exchange::Delete,
    ) -> Result<(), Fault> {
        let nowait = delete.nowait;
        let op = move |exchanges: &mut Exchanges| {
            let m = AMQPClass::Exchange(exchange::AMQPMethod::Delete(delete.clone()));
            let name = delete.exchange.as_str();
            (exchanges.delete(name, delete.if_unused))
                .map_err(|r| exchange_fault(ch, r, name, exchanges.vhost(), &m))
        };
        self.with_exchanges(ch, op, move |conn| {
            if !nowait {
                let ok = exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {});
                conn.send(ch, AMQPClass::Exchange(ok));
            }
        })
    }

    /// `queue.bind` of an existing queue to an exchange.
    pub(super) fn bind(&mut self, ch: u16, bind: queue::Bind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Bind(bind.clone()));
        let kind =
            (self.vhost.exchanges.lock().expect("never poisoned")).kind(bind.exchange.as_str());
        let key = binding_key(ch, kind, bind.routing_key.as_str(), &bind.arguments, &m)?;
        let queue = self.named_queue(ch, bind.queue.as_str(), &m)?;
        // Kept across a restart only if the queue is: durable, and not exclusive.
        let exclusive =
            (self.vhost.exclusive.lock().expect("never poisoned")).contains_key(queue.name());
        let durable_queue = queue.is_durable() && !exclusive;
        let nowait = bind.nowait;
        let op = move |exchanges: &mut Exchanges| {
            let name = bind.exchange.as_str();
            (exchanges.bind(name, &key, queue.name(), durable_queue))
                .map_err(|r| exchange_fault(ch, r, name, exchanges.vhost(), &m))
        };
        self.with_exchanges(ch, op, move |conn| {
            if !nowait {
                let ok = queue::AMQPMethod::BindOk(queue::BindOk {});
                conn.send(ch, AMQPClass::Queue(ok));
            }
        })
    }

    /// `exchange.bind`: its destination gets what its source routes with its routing key
    /// (or, from a headers exchange, the binding's arguments).
    pub(super) fn bind_exchange(&mut self, ch: u16, bind: exchange::Bind) -> Result<(), Fault> {
        let nowait = bind.nowait;
        let op = move |exchanges: &mut Exchanges| {
            let m = AMQPClass::Exchange(exchange::AMQPMethod::Bind(bind.clone()));
            let (source, destination) = (bind.source.as_str(), bind.destination.as_str());
            // As RabbitMQ: the default exchange first, then the source, then the
            // destination.
            for name in [source, destination] {
                if name.is_empty() {
                    return Err(exchange_fault(
                        ch,
                        Refusal::Reserved,
                        name,
                        exchanges.vhost(),
                        &m,
                    ));
                }
            }
            for name in [source, destination] {
                if !exchanges.exists(name) {
                    return Err(exchange_fault(
                        ch,
                        Refusal::NotFound,
                        name,
                        exchanges.vhost(),
                        &m,
                    ));
                }
            }
            let kind = exchanges.kind(source);
            let key = binding_key(ch, kind, bind.routing_key.as_str(), &bind.arguments, &m)?;
            (exchanges.bind_exchange(source, &key, destination))
                .map_err(|r| exchange_fault(ch, r, source, exchanges.vhost(), &m))
        };
        self.with_exchanges(ch, op, move |conn| {
            if !nowait {
                let ok = exchange::AMQPMethod::BindOk(exchange::BindOk {});
                conn.send(ch, AMQPClass::Exchange(ok));
            }
        })
    }

    /// `exchange.unbind`: as `queue.unbind`, removing a binding that is not there
    /// succeeds.
    pub(super) fn unbind_exchange(
        &mut self,
        ch: u16,
        unbind: exchange::Unbind,
    ) -> Result<(), Fault> {
        let nowait = unbind.nowait;
        let op = move |exchanges: &mut Exchanges| {
            let m = AMQPClass::Exchange(exchange::AMQPMethod::Unbind(unbind.clone()));
            let (source, destination) = (unbind.source.as_str(), unbind.destination.as_str());
            let kind = exchanges.kind(source);
            match unbinding_key(kind, unbind.routing_key.as_str(), &unbind.arguments) {
                Some(key) => (exchanges.unbind_exchange(source, &key, destination))
                    .map_err(|r| exchange_fault(ch, r, source, exchanges.vhost(), &m)),
                None => Ok(()),
            }
        };
        self.with_exchanges(ch, op, move |conn| {
            if !nowait {
                let ok = exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {});
                conn.send(ch, AMQPClass::Exchange(ok));
            }
        })
    }

    /// `queue.unbind`: as in RabbitMQ, removing a binding that is not there (its queue or
    /// its exchange missing too) succeeds.
    pub(super) fn unbind(&mut self, ch: u16, unbind: queue::Unbind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Unbind(unbind.clone()));
        let queue = self.queue_name(ch, unbind.queue.as_str(), &m)?;
        self.check_exclusive(ch, &queue, &m)?;
        let op = move |exchanges: &mut Exchanges| {
            let name = unbind.exchange.as_str();
            let kind = exchanges.kind(name);
            match unbinding_key(kind, unbind.routing_key.as_str(), &unbind.arguments) {
                Some(key) => (exchanges.unbind(name, &key, &queue))
                    .map_err(|r| exchange_fault(ch, r, name, exchanges.vhost(), &m)),
                None => Ok(()),
            }
        };
        self.with_exchanges(ch, op, move |conn| {
            let ok = queue::AMQPMethod::UnbindOk(queue::UnbindOk {});
            conn.send(ch, AMQPClass::Queue(ok));
        })
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

/// `exchange.declare` checked and made in `exchanges`, as RabbitMQ checks it: a passive one
/// names an existing exchange (never the default); another a type served, an alternate
/// given as a string, and on a new exchange no argument not served (540).
fn declare_exchange(
    ch: u16,
    declare: &exchange::Declare,
    exchanges: &mut Exchanges,
) -> Result<(), Fault> {
    let m = AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare.clone()));
    let name = declare.exchange.as_str();
    if declare.passive {
        // As RabbitMQ: the default exchange is not declared, passively or not.
        if name.is_empty() {
            return Err(exchange_fault(
                ch,
                Refusal::Reserved,
                name,
                exchanges.vhost(),
                &m,
            ));
        }
        if !exchanges.exists(name) {
            return Err(exchange_fault(
                ch,
                Refusal::NotFound,
                name,
                exchanges.vhost(),
                &m,
            ));
        }
        return Ok(());
    }
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
                "PRECONDITION_FAILED - invalid type '{}' for arg 'alternate-exchange' in exchange '{name}' in vhost '{}'",
                crate::field::type_name(other),
                exchanges.vhost()
            );
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
        }
    };
    // RabbitMQ compares no argument of a redeclare but the alternate (it keeps the first
    // declare's); a new exchange with one leasemqd does not serve is a 540.
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
    // Each is checked where exchanges are kept; an inequivalent redeclare is told what
    // was received and what is there, in RabbitMQ's words.
    let (received, current) = (shape.clone(), exchanges.shape(name));
    (exchanges.declare_shaped(name, shape)).map_err(|r| match (r, current) {
        (Refusal::Inequivalent(what), Some(current)) if what != "alternate-exchange" => {
            let vhost = exchanges.vhost();
            let (received, current) = (received.word(what), current.word(what));
            let text = format!(
                "PRECONDITION_FAILED - inequivalent arg '{what}' for exchange '{name}' in vhost \
                 '{vhost}': received '{received}' but current is '{current}'"
            );
            Fault::channel(ch, code::PRECONDITION_FAILED, text, &m)
        }
        (r, _) => exchange_fault(ch, r, name, exchanges.vhost(), &m),
    })
}
