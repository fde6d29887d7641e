//! `queue.declare` in a virtual host: RabbitMQ's rules for a new queue and for a
//! redeclare, the queue's holding queue of dead letters, and what the host keeps of it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable};
use leasemq::{Broker, Error, Queue, QueueConfig};

use super::VHost;
use crate::arguments::{self, Refused};
use crate::code;
use crate::declared::Declared;
use crate::{dead_letter, names};

/// A `queue.declare` that may make a queue (not a passive one), as the virtual host
/// takes it.
#[derive(Debug, Clone, Copy)]
pub struct QueueDeclare<'a> {
    /// The broker's name of the queue (`names.rs`).
    pub name: &'a str,
    /// The client gave a name of the server's own, starting `amq.`.
    pub reserved: bool,
    /// The declare's flags.
    pub durable: bool,
    /// Owned by the declaring connection, and deleted when it ends.
    pub exclusive: bool,
    /// Deleted once its last consumer goes.
    pub auto_delete: bool,
    /// Its `x-` arguments.
    pub arguments: &'a FieldTable,
    /// The declaring connection: the owner of an exclusive queue.
    pub owner: u64,
}

/// A queue as a declare left it.
#[derive(Debug)]
pub struct QueueDeclared {
    /// The queue.
    pub queue: Queue,
    /// This declare made it the declaring connection's exclusive queue.
    pub made_exclusive: bool,
}

/// Why a declare was refused.
#[derive(Debug)]
pub enum DeclareError {
    /// As RabbitMQ refuses it: 540 for an argument not served (a connection error), else
    /// a channel error (403, 405, 406).
    Refused(Refused),
    /// The broker refused the queue, or its holding queue.
    Broker(Error),
}

impl From<Refused> for DeclareError {
    fn from(refused: Refused) -> DeclareError {
        DeclareError::Refused(refused)
    }
}

impl VHost {
    /// Declares a queue as `declare` asks, its broker config starting from `base` (lease
    /// length, largest body, whether durable storage is on): checks the declare as
    /// RabbitMQ does (a quorum queue's flags and arguments, the arguments' values, a
    /// redeclare's equivalence, reserved names, another's exclusive queue), makes the
    /// queue if it is new (with its holding queue of dead letters), and keeps its flags,
    /// message TTL and expiry.
    ///
    /// # Errors
    ///
    /// [`DeclareError`]: the refusal RabbitMQ answers with, or the broker's.
    pub fn declare_queue(
        &self,
        broker: &Broker,
        declare: &QueueDeclare<'_>,
        base: QueueConfig,
    ) -> Result<QueueDeclared, DeclareError> {
        let name = declare.name;
        let shown = names::amqp(name);
        let quorum = check_queue_type(declare, &shown)?;
        let refuse = |refused: Refused| match refused.code {
            code::NOT_IMPLEMENTED => refused,
            _ => refused.for_queue(&shown, &self.name),
        };
        // The holding queue's leases are the server's, whatever the queue's own.
        let lease = base.ack_timeout;
        let mut config = arguments::queue_config(declare.arguments, base).map_err(refuse)?;
        let existing = broker.queue(name);
        let existed = existing.is_some();
        let declared = declared(declare, quorum, config.max_priority).map_err(refuse)?;
        if existed {
            self.check_equivalent(name, &declared)?;
        }
        // `amq.` names are the server's (`amq.gen-…`): a client may not declare one,
        // even one that exists (a passive declare may look at it).
        if declare.reserved {
            let text =
                format!("ACCESS_REFUSED - queue name '{shown}' contains reserved prefix 'amq.*'");
            return Err(Refused::new(code::ACCESS_REFUSED, text).into());
        }
        // A queue dead-letters to a holding queue of its own, whose dead letters go on
        // through the exchange; a durable one kept from a build that dead-lettered
        // straight to the queue a default-exchange key named still does.
        let route = declared.dead_letter.clone();
        let direct = (existing.as_ref()).and_then(|q| q.config().dead_letter.clone());
        let direct = direct.filter(|queue| {
            let to = Some(queue.as_str());
            (route.as_ref())
                .is_some_and(|r| r.exchange.is_empty() && r.routing_key.as_deref() == to)
        });
        config.dead_letter.clone_from(&direct);
        let queue = match (route, &direct) {
            (Some(route), None) => self.dead_letters.declare(name, route, || {
                let (holding, made) = holding_queue(broker, name, lease, &config)?;
                config.dead_letter = Some(holding.name().to_string());
                match broker.declare_queue(name, config) {
                    Ok(q) => Ok((q, holding)),
                    Err(e) => {
                        // One made for this declare goes with it.
                        if made {
                            holding.close();
                        }
                        Err(DeclareError::Broker(e))
                    }
                }
            })?,
            _ => broker
                .declare_queue(name, config)
                .map_err(DeclareError::Broker)?,
        };
        let made_exclusive = self.claim_exclusive(declare, existed)?;
        self.keep_declared(&queue, declared, existed);
        Ok(QueueDeclared {
            queue,
            made_exclusive,
        })
    }

    /// RabbitMQ's check of a redeclare against what the queue was declared with: 405 for
    /// `exclusive` (a queue is not taken over, nor given up, by a declare), 406 naming the
    /// first other flag that differs.
    fn check_equivalent(&self, name: &str, declared: &Declared) -> Result<(), Refused> {
        let flags = self.declared.lock().expect("never poisoned");
        let Some(known) = flags.get(name).cloned() else {
            return Ok(());
        };
        drop(flags);
        if known.exclusive != declared.exclusive {
            return Err(locked(name));
        }
        if let Some((arg, received, current)) = known.inequivalent(declared) {
            let (vhost, name) = (&self.name, names::amqp(name));
            let text = format!(
                "PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{name}' in vhost '{vhost}': received {received} but current is {current}"
            );
            return Err(Refused::new(code::PRECONDITION_FAILED, text));
        }
        Ok(())
    }

    /// Whether another connection than `owner` holds the queue called `name` exclusively.
    pub fn locked_by_another(&self, name: &str, owner: u64) -> bool {
        let owners = self.exclusive.lock().expect("never poisoned");
        owners.get(name).is_some_and(|&held| held != owner)
    }

    /// An exclusive declare makes a new queue its connection's; whether it did. Declaring
    /// an existing queue exclusive does not take it over (RabbitMQ: 405).
    fn claim_exclusive(&self, declare: &QueueDeclare<'_>, existed: bool) -> Result<bool, Refused> {
        let name = declare.name;
        let mut owners = self.exclusive.lock().expect("never poisoned");
        if !declare.exclusive || owners.get(name) == Some(&declare.owner) {
            return Ok(false);
        }
        if existed {
            let (vhost, shown) = (&self.name, names::amqp(name));
            let text = format!(
                "RESOURCE_LOCKED - cannot obtain exclusive access to queue '{shown}' in vhost '{vhost}'"
            );
            return Err(Refused::new(code::RESOURCE_LOCKED, text));
        }
        owners.insert(name.to_string(), declare.owner);
        Ok(true)
    }

    /// Keeps what `queue` was declared with: its flags (a new queue's replace whatever a
    /// queue of its name left behind; an existing queue keeps the first it was declared
    /// with here), on disk too for a durable one, and its message TTL and expiry in force.
    fn keep_declared(&self, queue: &Queue, declared: Declared, existed: bool) {
        let name = queue.name();
        let (durable, message_ttl, expires) =
            (declared.durable, declared.message_ttl, declared.expires);
        let mut flags: MutexGuard<'_, HashMap<String, Declared>> =
            self.declared.lock().expect("never poisoned");
        // Kept on disk (with a data dir) when a durable queue's flags are new here.
        let kept = if existed {
            let known = flags.contains_key(name);
            flags.entry(name.to_string()).or_insert(declared);
            !known
        } else {
            flags.insert(name.to_string(), declared);
            true
        };
        if kept && durable {
            self.keep_durable_queues(flags);
        } else {
            drop(flags);
        }
        if message_ttl.is_some() {
            // Every publish is stamped with its arrival from now on.
            self.message_ttl_used.store(true, Ordering::Relaxed);
        }
        if message_ttl.is_some() {
            // Its messages expire at the head, dead-lettered if it has an exchange for it.
            // (Without a TTL, only messages with an `expiration` of their own do: the first
            // publish of one watches the queue.)
            self.message_expiry.watch(queue, message_ttl);
        }
        if let Some(ms) = expires {
            // Set anew: a redeclare is a use.
            self.expiring.set(queue, Duration::from_millis(ms.into()));
        }
    }
}

/// RabbitMQ's 405 for a queue another connection holds exclusively.
pub fn locked(name: &str) -> Refused {
    let (vhost, name) = (names::vhost_of(name), names::amqp(name));
    let text = format!(
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'"
    );
    Refused::new(code::RESOURCE_LOCKED, text)
}

/// Whether the declare asks for a quorum queue (`x-queue-type`), once its flags and
/// arguments fit the type as RabbitMQ's checks say: a quorum queue is durable and not
/// exclusive, and takes none of a classic queue's priorities, storage hints and master
/// locator; a classic queue none of a quorum queue's leader locator.
fn check_queue_type(declare: &QueueDeclare<'_>, shown: &str) -> Result<bool, Refused> {
    let quorum = declare.arguments.inner().iter().any(|(k, v)| {
        k.as_str() == "x-queue-type"
            && matches!(v, AMQPValue::LongString(s) if s.as_bytes() == b"quorum")
    });
    let precondition = |text: String| Err(Refused::new(code::PRECONDITION_FAILED, text));
    if quorum && declare.exclusive {
        return precondition(format!(
            "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{shown}': a quorum queue is not exclusive"
        ));
    }
    if quorum && !declare.durable {
        return precondition(format!(
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue '{shown}': a quorum queue is durable"
        ));
    }
    let (others, kind) = match quorum {
        true => (
            &[
                "x-max-priority",
                "x-queue-mode",
                "x-queue-version",
                "x-queue-master-locator",
            ][..],
            "rabbit_quorum_queue",
        ),
        false => (
            &["x-queue-leader-locator", "x-dead-letter-strategy"][..],
            "rabbit_classic_queue",
        ),
    };
    if let Some(key) = (others.iter()).find(|k| declare.arguments.inner().contains_key(**k)) {
        return precondition(format!(
            "PRECONDITION_FAILED - invalid arg '{key}' for queue '{shown}' in vhost '{}' of queue type {kind}",
            names::vhost_of(declare.name)
        ));
    }
    Ok(quorum)
}

/// The flags and arguments a declare gives, as kept for the check of a redeclare. As
/// RabbitMQ compares it, an exclusive queue is never durable.
fn declared(
    declare: &QueueDeclare<'_>,
    quorum: bool,
    max_priority: Option<u8>,
) -> Result<Declared, Refused> {
    let args = declare.arguments;
    Ok(Declared {
        durable: declare.durable && !declare.exclusive,
        exclusive: declare.exclusive,
        auto_delete: declare.auto_delete,
        quorum,
        expires: arguments::expires(args)?,
        dead_letter: arguments::dead_letter_route(args),
        message_ttl: arguments::message_ttl(args)?,
        hints: arguments::storage_hints(args)?,
        single_active: arguments::single_active_consumer(args)?,
        max_priority,
        arguments: std::sync::Arc::new(crate::field::table_json(args)),
    })
}

/// The holding queue of the dead letters of the queue called `name`, declared with
/// `config` (`dead_letter.rs`), and whether this call made it. Its leases last `lease`.
fn holding_queue(
    broker: &Broker,
    name: &str,
    lease: Duration,
    config: &QueueConfig,
) -> Result<(Queue, bool), DeclareError> {
    let holding = dead_letter::holding_name(name);
    let existed = broker.queue(&holding).is_some();
    let config = QueueConfig {
        ack_timeout: lease,
        max_body_bytes: config.max_body_bytes,
        durable: config.durable,
        ..QueueConfig::default()
    };
    match broker.declare_queue(&holding, config) {
        Ok(queue) => Ok((queue, !existed)),
        Err(Error::InvalidName) => {
            let most = dead_letter::MAX_QUEUE_NAME_BYTES;
            let name = names::amqp(name);
            let text = format!(
                "PRECONDITION_FAILED - queue name '{name}' is too long to dead-letter through an exchange (at most {most} bytes)"
            );
            Err(Refused::new(code::PRECONDITION_FAILED, text).into())
        }
        Err(e) => Err(DeclareError::Broker(e)),
    }
}

#[cfg(test)]
mod tests {
    use amq_protocol::types::AMQPValue;

    use super::*;

    fn broker() -> Broker {
        Broker::builder().shards(1).manual_clock().build().unwrap()
    }

    fn plain<'a>(name: &'a str, arguments: &'a FieldTable) -> QueueDeclare<'a> {
        QueueDeclare {
            name,
            reserved: false,
            durable: false,
            exclusive: false,
            auto_delete: false,
            arguments,
            owner: 1,
        }
    }

    fn refused_code(result: Result<QueueDeclared, DeclareError>) -> u16 {
        match result {
            Err(DeclareError::Refused(refused)) => refused.code,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_redeclare_must_say_what_the_queue_was_declared_with() {
        let (vhost, broker) = (VHost::default(), broker());
        let none = FieldTable::default();
        let declared = vhost.declare_queue(&broker, &plain("jobs", &none), QueueConfig::default());
        assert!(!declared.unwrap().made_exclusive);
        let again = vhost.declare_queue(&broker, &plain("jobs", &none), QueueConfig::default());
        assert_eq!(again.unwrap().queue.name(), "jobs", "the same queue");
        let durable = QueueDeclare {
            durable: true,
            ..plain("jobs", &none)
        };
        let result = vhost.declare_queue(&broker, &durable, QueueConfig::default());
        assert_eq!(refused_code(result), code::PRECONDITION_FAILED);
        let mut ttl = FieldTable::default();
        ttl.insert("x-message-ttl".into(), AMQPValue::LongInt(1_000));
        let result = vhost.declare_queue(&broker, &plain("jobs", &ttl), QueueConfig::default());
        assert_eq!(refused_code(result), code::PRECONDITION_FAILED);
        assert!(
            !vhost.message_ttl_used.load(Ordering::Relaxed),
            "a refused declare keeps nothing"
        );
    }

    #[test]
    fn an_exclusive_queue_is_its_owners_alone() {
        let (vhost, broker) = (VHost::default(), broker());
        let none = FieldTable::default();
        let exclusive = QueueDeclare {
            exclusive: true,
            ..plain("mine", &none)
        };
        let declared = vhost.declare_queue(&broker, &exclusive, QueueConfig::default());
        assert!(declared.unwrap().made_exclusive);
        assert!(vhost.locked_by_another("mine", 2));
        assert!(!vhost.locked_by_another("mine", 1));
        // Its owner redeclares it; it stays made once.
        let again = vhost.declare_queue(&broker, &exclusive, QueueConfig::default());
        assert!(!again.unwrap().made_exclusive);
        // An existing queue declared exclusive is not taken over.
        vhost
            .declare_queue(&broker, &plain("shared", &none), QueueConfig::default())
            .unwrap();
        let take = QueueDeclare {
            exclusive: true,
            owner: 2,
            ..plain("shared", &none)
        };
        let result = vhost.declare_queue(&broker, &take, QueueConfig::default());
        assert_eq!(refused_code(result), code::RESOURCE_LOCKED);
        // Once forgotten, its owner goes with it.
        let queue = broker.queue("mine").unwrap();
        vhost.forget_queue(&queue);
        assert!(!vhost.locked_by_another("mine", 2));
    }

    #[test]
    fn the_servers_names_and_a_quorum_queues_flags_are_refused_as_rabbitmq_refuses_them() {
        let (vhost, broker) = (VHost::default(), broker());
        let none = FieldTable::default();
        let reserved = QueueDeclare {
            reserved: true,
            ..plain("amq.mine", &none)
        };
        let result = vhost.declare_queue(&broker, &reserved, QueueConfig::default());
        assert_eq!(refused_code(result), code::ACCESS_REFUSED);
        assert!(broker.queue("amq.mine").is_none(), "not made");
        let mut quorum = FieldTable::default();
        quorum.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let transient = plain("q", &quorum);
        let result = vhost.declare_queue(&broker, &transient, QueueConfig::default());
        assert_eq!(refused_code(result), code::PRECONDITION_FAILED);
        let durable = QueueDeclare {
            durable: true,
            ..plain("q", &quorum)
        };
        assert!(vhost
            .declare_queue(&broker, &durable, QueueConfig::default())
            .is_ok());
        // An argument not served is a 540 whose text names no queue (the connection
        // closes with it).
        let mut unserved = FieldTable::default();
        unserved.insert("x-max-length-bytes".into(), AMQPValue::LongInt(1));
        let result = vhost.declare_queue(&broker, &plain("u", &unserved), QueueConfig::default());
        match result {
            Err(DeclareError::Refused(refused)) => {
                assert_eq!(refused.code, code::NOT_IMPLEMENTED);
                assert!(!refused.text.contains("for queue 'u'"), "{}", refused.text);
            }
            other => panic!("not refused: {other:?}"),
        }
    }
}
