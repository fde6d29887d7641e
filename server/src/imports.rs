//! The queues, exchanges and bindings of a definitions file, declared at start as a
//! client would declare them (contract §10): through a connection of the server's own,
//! with every permission in each virtual host, so that each goes through the same checks
//! and is kept the same way (a durable queue in the data dir) as a client's. What the
//! server already has is declared again, which changes nothing where it is the same; a
//! declaration the server refuses (an inequivalent redeclare, an argument it does not
//! take) stops the start, naming the entry and RabbitMQ's reply.
//!
//! In RabbitMQ's order: queues, then exchanges, then bindings.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, queue, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};
use leasemq::Broker;
use serde_json::Value;

use crate::access::{BindingDef, Definitions};
use crate::internal::Internal;
use crate::vhost::VHosts;
use crate::Settings;

/// Declares what `definitions` name in their virtual hosts.
///
/// # Errors
///
/// The first declaration refused, named, with the server's reply.
pub fn declare(
    broker: &Broker,
    settings: &Arc<Settings>,
    vhosts: &Arc<VHosts>,
    definitions: &Definitions,
) -> Result<(), String> {
    for (what, vhost, method) in steps(definitions)? {
        let Some(mut conn) = Internal::for_server(broker, settings, vhosts, vhost) else {
            return Err(format!("{what}: no such vhost"));
        };
        if let Err((_, refusal)) = conn.method(method) {
            return Err(format!("{what}: {refusal}"));
        }
    }
    Ok(())
}

/// Each declaration of `definitions`, in order: what it is (for an error), its virtual
/// host, and its method.
fn steps(definitions: &Definitions) -> Result<Vec<(String, &str, AMQPClass)>, String> {
    let mut steps = Vec::new();
    for q in &definitions.queues {
        let declare = queue::Declare {
            queue: q.name.as_str().into(),
            durable: q.durable,
            auto_delete: q.auto_delete,
            arguments: table(&q.arguments),
            ..queue::Declare::default()
        };
        let what = format!("queue {:?} in vhost {:?}", q.name, q.vhost);
        let m = AMQPClass::Queue(queue::AMQPMethod::Declare(declare));
        steps.push((what, q.vhost.as_str(), m));
    }
    for e in &definitions.exchanges {
        let declare = exchange::Declare {
            exchange: e.name.as_str().into(),
            kind: e.kind.as_str().into(),
            durable: e.durable,
            auto_delete: e.auto_delete,
            internal: e.internal,
            arguments: table(&e.arguments),
            ..exchange::Declare::default()
        };
        let what = format!("exchange {:?} in vhost {:?}", e.name, e.vhost);
        let m = AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare));
        steps.push((what, e.vhost.as_str(), m));
    }
    for b in &definitions.bindings {
        steps.push(binding(b)?);
    }
    Ok(steps)
}

/// A binding's declaration, as [`steps`] gives it.
fn binding(b: &BindingDef) -> Result<(String, &str, AMQPClass), String> {
    let what = format!(
        "binding of {} {:?} to exchange {:?} in vhost {:?}",
        b.destination_type, b.destination, b.source, b.vhost
    );
    let m = match b.destination_type.as_str() {
        "queue" => AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
            queue: b.destination.as_str().into(),
            exchange: b.source.as_str().into(),
            routing_key: b.routing_key.as_str().into(),
            nowait: false,
            arguments: table(&b.arguments),
        })),
        "exchange" => AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind {
            destination: b.destination.as_str().into(),
            source: b.source.as_str().into(),
            routing_key: b.routing_key.as_str().into(),
            nowait: false,
            arguments: table(&b.arguments),
        })),
        other => {
            return Err(format!(
                "{what}: destination_type {other:?} is not queue or exchange"
            ))
        }
    };
    Ok((what, b.vhost.as_str(), m))
}

/// A definitions file's arguments as an AMQP table: strings as long strings, whole
/// numbers as signed 64-bit integers, as RabbitMQ reads them from JSON.
pub fn table(arguments: &serde_json::Map<String, Value>) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert(key.as_str().into(), field(value));
    }
    table
}

fn field(value: &Value) -> AMQPValue {
    match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => AMQPValue::LongString(s.as_str().into()),
        Value::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(field).collect::<Vec<_>>(),
        )),
        Value::Object(map) => AMQPValue::FieldTable(table(map)),
    }
}
