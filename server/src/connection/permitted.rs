//! Every method checked against the user's permissions in its virtual host, as
//! RabbitMQ's access-control table says (contract §10):
//!
//! | method | permission |
//! |---|---|
//! | `queue.declare` (not passive) | configure on the queue; with `x-dead-letter-exchange` also write on that exchange and read on the queue |
//! | `queue.delete` | configure on the queue |
//! | `queue.purge`, `basic.consume`, `basic.get` | read on the queue |
//! | `queue.bind`, `queue.unbind` | write on the queue, read on the exchange |
//! | `exchange.declare` (not passive) | configure on the exchange; with `alternate-exchange` also write on that exchange and read on this one |
//! | `exchange.delete` | configure on the exchange |
//! | `exchange.bind`, `exchange.unbind` | write on the destination, read on the source |
//! | `basic.publish` | write on the exchange |
//!
//! A queue named "" is the channel's last declared queue, and a server-named queue is
//! checked once it has its name (`queues.rs`). A refusal is a channel error 403 in
//! RabbitMQ's words; the connection and its other channels go on. A user whose three
//! permissions are all `.*` is not checked at all.

use amq_protocol::protocol::{basic, exchange, queue, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};

use super::fault::Fault;
use super::{code, Connection};
use crate::access::{Permission, Resource};
use crate::names;

impl Connection {
    /// Whether the user may do what `method` on channel `ch` does; every permission it
    /// needs, in the order RabbitMQ checks them.
    pub(super) fn permitted(&self, ch: u16, method: &AMQPClass) -> Result<(), Fault> {
        if !self.login.restricted {
            return Ok(());
        }
        use Permission::{Configure, Read, Write};
        use Resource::{Exchange, Queue};
        let queue = |given: &str| -> Result<String, Fault> {
            let broker_name = self.queue_name(ch, given, method)?;
            Ok(names::amqp(&broker_name).into_owned())
        };
        let check =
            |permission, resource, name: &str| self.permit(ch, permission, resource, name, method);
        match method {
            AMQPClass::Queue(queue::AMQPMethod::Declare(d))
                if !d.passive && !d.queue.as_str().is_empty() =>
            {
                self.queue_declare_permitted(ch, d.queue.as_str(), &d.arguments, method)
            }
            AMQPClass::Queue(queue::AMQPMethod::Delete(d)) => {
                check(Configure, Queue, &queue(d.queue.as_str())?)
            }
            AMQPClass::Queue(queue::AMQPMethod::Purge(p)) => {
                check(Read, Queue, &queue(p.queue.as_str())?)
            }
            AMQPClass::Basic(basic::AMQPMethod::Consume(c)) => {
                check(Read, Queue, &queue(c.queue.as_str())?)
            }
            AMQPClass::Basic(basic::AMQPMethod::Get(g)) => {
                check(Read, Queue, &queue(g.queue.as_str())?)
            }
            AMQPClass::Queue(queue::AMQPMethod::Bind(b)) => {
                check(Write, Queue, &queue(b.queue.as_str())?)?;
                check(Read, Exchange, b.exchange.as_str())
            }
            AMQPClass::Queue(queue::AMQPMethod::Unbind(b)) => {
                check(Write, Queue, &queue(b.queue.as_str())?)?;
                check(Read, Exchange, b.exchange.as_str())
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Declare(d)) if !d.passive => {
                let name = d.exchange.as_str();
                check(Configure, Exchange, name)?;
                if let Some(alternate) = text(&d.arguments, "alternate-exchange") {
                    check(Write, Exchange, alternate)?;
                    check(Read, Exchange, name)?;
                }
                Ok(())
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Delete(d)) => {
                check(Configure, Exchange, d.exchange.as_str())
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Bind(b)) => {
                check(Write, Exchange, b.destination.as_str())?;
                check(Read, Exchange, b.source.as_str())
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Unbind(b)) => {
                check(Write, Exchange, b.destination.as_str())?;
                check(Read, Exchange, b.source.as_str())
            }
            AMQPClass::Basic(basic::AMQPMethod::Publish(p)) => {
                check(Write, Exchange, p.exchange.as_str())
            }
            _ => Ok(()),
        }
    }

    /// The permissions a declare of the queue `name` needs (a server-named queue's once
    /// it has its name).
    pub(super) fn queue_declare_permitted(
        &self,
        ch: u16,
        name: &str,
        arguments: &FieldTable,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        if !self.login.restricted {
            return Ok(());
        }
        self.permit(ch, Permission::Configure, Resource::Queue, name, m)?;
        if let Some(dlx) = text(arguments, "x-dead-letter-exchange") {
            self.permit(ch, Permission::Write, Resource::Exchange, dlx, m)?;
            self.permit(ch, Permission::Read, Resource::Queue, name, m)?;
        }
        Ok(())
    }

    /// Whether `permission` on the `resource` called `name` (its AMQP name) is granted,
    /// or the channel error that refuses it.
    fn permit(
        &self,
        ch: u16,
        permission: Permission,
        resource: Resource,
        name: &str,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let login = &self.login;
        let granted =
            (login.permissions.as_ref()).is_some_and(|p| p.allows(permission, resource, name));
        if granted {
            return Ok(());
        }
        let shown = match (resource, name) {
            (Resource::Exchange, "") => "amq.default",
            _ => name,
        };
        let text = format!(
            "ACCESS_REFUSED - access to {} '{shown}' in vhost '{}' refused for user '{}'",
            resource.word(),
            login.vhost,
            login.user_name()
        );
        Err(Fault::channel(ch, code::ACCESS_REFUSED, text, m))
    }
}

/// The text argument `key` of a table, if it has one.
fn text<'a>(table: &'a FieldTable, key: &str) -> Option<&'a str> {
    match table.inner().get(key)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str()),
        _ => None,
    }
}
