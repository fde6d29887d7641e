//! What a cluster's node does not serve yet (contract §9, "Not in the first issue"), refused
//! by name before anything is made. Queues, their arguments and what a publish asks of them
//! that the server keeps on the node a client is connected to (exclusive and auto-deleted
//! queues, dead-lettering, expiry, a single active consumer's turns, direct reply-to) would
//! not follow a queue to another node, so a node refuses them rather than serve them on one.

use amq_protocol::protocol::{basic, queue, AMQPClass, BasicProperties};
use amq_protocol::types::{AMQPValue, ShortString};

use super::fault::Fault;
use super::{code, reply_to};

/// The refusal of a `queue.declare` on channel `ch` that asks for what a cluster does not
/// serve; `None` when a cluster serves it. A passive declare only looks a queue up.
pub(super) fn declare(ch: u16, declare: &queue::Declare) -> Option<Fault> {
    if declare.passive && !reply_to::is_reply_name(declare.queue.as_str()) {
        return None;
    }
    let what = declare_asks(declare)?;
    let m = AMQPClass::Queue(queue::AMQPMethod::Declare(declare.clone()));
    Some(Fault::channel(
        ch,
        code::PRECONDITION_FAILED,
        text(&what),
        &m,
    ))
}

/// What of a declare a cluster does not serve, named as the client asked for it.
fn declare_asks(declare: &queue::Declare) -> Option<String> {
    let name = declare.queue.as_str();
    if reply_to::is_reply_name(name) {
        return Some(format!("direct reply-to ('{name}')"));
    }
    if name.is_empty() {
        return Some("a server-named queue (an empty name)".into());
    }
    let flags = [
        (!declare.durable, "durable=false"),
        (declare.exclusive, "exclusive"),
        (declare.auto_delete, "auto_delete"),
    ];
    if let Some((_, flag)) = flags.iter().find(|(asked, _)| *asked) {
        return Some(format!("{flag} (queue '{name}')"));
    }
    let arguments = declare.arguments.inner();
    let unserved = [
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-message-ttl",
        "x-expires",
    ];
    if let Some(key) = unserved.iter().find(|k| arguments.contains_key(**k)) {
        return Some(format!("the argument {key} (queue '{name}')"));
    }
    // A single active consumer asked for by `false` is what every queue has.
    let single_active = arguments.get("x-single-active-consumer");
    if single_active.is_some_and(|v| !matches!(v, AMQPValue::Boolean(false))) {
        return Some(format!(
            "the argument x-single-active-consumer (queue '{name}')"
        ));
    }
    None
}

/// The refusal of a `basic.consume` on channel `ch` of direct reply-to's pseudo-queue;
/// `None` for every other queue.
pub(super) fn consume(ch: u16, consume: &basic::Consume) -> Option<Fault> {
    let name = consume.queue.as_str();
    if name != reply_to::REPLY_TO {
        return None;
    }
    let m = AMQPClass::Basic(basic::AMQPMethod::Consume(consume.clone()));
    let what = format!("direct reply-to ('{name}')");
    Some(Fault::channel(
        ch,
        code::PRECONDITION_FAILED,
        text(&what),
        &m,
    ))
}

/// Why a publish with these properties is refused by a cluster (a 406 on its channel, as
/// every refused publish): an `expiration`, or a `reply-to` of direct reply-to.
pub(super) fn properties(properties: &BasicProperties) -> Option<String> {
    if properties.expiration().is_some() {
        return Some(text("a publish with an expiration"));
    }
    let reply = properties.reply_to().as_ref().map(ShortString::as_str);
    (reply == Some(reply_to::REPLY_TO)).then(|| text("direct reply-to (a publish's reply_to)"))
}

fn text(what: &str) -> String {
    format!("PRECONDITION_FAILED - {what} is not served by a cluster yet (contract §9)")
}
