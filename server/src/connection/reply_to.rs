//! RabbitMQ's direct reply-to: an RPC client consumes from the pseudo-queue
//! `amq.rabbitmq.reply-to` (with `no_ack`) and publishes its requests with `reply-to:
//! amq.rabbitmq.reply-to`; the server hands the request's consumer a name of the form
//! `amq.rabbitmq.reply-to.…` in its place, and a reply published to that name through the
//! default exchange reaches the client's consumer, with no reply queue for the client to
//! declare.
//!
//! Here the name is that of a queue made for the channel when it starts consuming from the
//! pseudo-queue: in memory, owned by the connection, and deleted with its consumer (a
//! cancel, the channel's close or the connection's end), after which a reply to it is
//! unroutable. As in RabbitMQ, the names are not queues to clients: a `queue.declare`
//! (passive or not) answers whether the consumer is still there, with 0 messages and 1
//! consumer, `queue.delete` is a no-op, and `basic.get`, `basic.consume`, `queue.purge` and
//! `queue.bind` find no queue.

use amq_protocol::protocol::{basic, queue, AMQPClass, BasicProperties};
use amq_protocol::types::ShortString;
use leasemq::{Queue, QueueConfig};

use super::channel::Channel;
use super::fault::{broker_fault, no_queue, Fault};
use super::{code, Connection};
use crate::declared::Declared;

/// The pseudo-queue a client consumes from, and the `reply-to` it publishes with.
pub(super) const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// Whether `name` is the pseudo-queue or a name it hands out.
pub(super) fn is_reply_name(name: &str) -> bool {
    name.strip_prefix(REPLY_TO)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

impl Connection {
    /// `basic.consume` of the pseudo-queue: the channel's reply queue, made now.
    ///
    /// # Errors
    ///
    /// RabbitMQ's 406s: a consumer that would ack, or a channel that has one already.
    pub(super) fn reply_queue(
        &mut self,
        ch: u16,
        consume: &basic::Consume,
        m: &AMQPClass,
    ) -> Result<Queue, Fault> {
        if !consume.no_ack {
            let text = "PRECONDITION_FAILED - reply consumer cannot acknowledge";
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, m));
        }
        let state = self.channels.get(&ch).expect("checked by the caller");
        if state.reply.as_ref().is_some_and(|q| !q.is_closed()) {
            let text = "PRECONDITION_FAILED - reply consumer already set";
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, m));
        }
        let name = self.unique_name(&format!("{REPLY_TO}."));
        let name = self.vhost.broker_name(&name).into_owned();
        let config = QueueConfig {
            ack_timeout: self.settings.ack_timeout,
            max_body_bytes: self.max_stored_bytes(),
            ..QueueConfig::default()
        };
        let queue =
            (self.broker.declare_queue(&name, config)).map_err(|e| broker_fault(ch, &e, m))?;
        // Deleted with its consumer, as an auto-delete queue (a cancel or the channel's
        // close), and with the connection, as an exclusive one.
        let declared = Declared {
            durable: false,
            exclusive: false,
            auto_delete: true,
            quorum: false,
            expires: None,
            dead_letter: None,
            message_ttl: None,
            hints: Default::default(),
            single_active: None,
            max_priority: None,
            arguments: std::sync::Arc::default(),
        };
        (self.vhost.declared.lock().expect("never poisoned")).insert(name.clone(), declared);
        self.queues.insert(name, queue.clone());
        self.exclusive.push(queue.clone());
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        state.reply = Some(queue.clone());
        Ok(queue)
    }

    /// `queue.declare` of a reply name: 0 messages and 1 consumer while its consumer is
    /// there (the pseudo-queue itself always), else a 404.
    pub(super) fn declare_reply_name(
        &mut self,
        ch: u16,
        declare: &queue::Declare,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let name = declare.queue.as_str();
        if name != REPLY_TO && self.queue(&self.vhost.broker_name(name)).is_none() {
            return Err(no_queue(ch, name, m));
        }
        if !declare.nowait {
            let ok = queue::DeclareOk {
                queue: declare.queue.clone(),
                message_count: 0,
                consumer_count: 1,
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)));
        }
        Ok(())
    }
}

/// The reply name a publish on `channel` (looked up only when needed) is stored with in
/// place of its `reply-to` when it asks for replies by direct reply-to; `None` when it
/// does not ask.
///
/// # Errors
///
/// The text of RabbitMQ's 406 when the channel has no reply consumer.
pub(super) fn direct_reply_name<'a>(
    channel: impl FnOnce() -> Option<&'a Channel>,
    properties: &BasicProperties,
) -> Result<Option<ShortString>, String> {
    if properties.reply_to().as_ref().map(ShortString::as_str) != Some(REPLY_TO) {
        return Ok(None);
    }
    let reply = channel().and_then(|c| c.reply.as_ref());
    let Some(queue) = reply.filter(|q| !q.is_closed()) else {
        return Err("PRECONDITION_FAILED - fast reply consumer does not exist".into());
    };
    Ok(Some(crate::names::amqp(queue.name()).as_ref().into()))
}
