//! A publish as it arrives: its `basic.publish`, then its content header and body frames
//! put back together into the message its queues store, and what such a message costs
//! while it waits for a shard.

use amq_protocol::protocol::basic;
use bytes::Bytes;
use leasemq::Message;

use crate::content::MAX_ID_BYTES;

/// What a message costs beyond its body while it waits in a shard's inbox.
pub(super) const MESSAGE_OVERHEAD: usize = 64;
/// What `messages` hold while they wait for a shard: their bodies and [`MESSAGE_OVERHEAD`]
/// each.
pub(super) fn bytes_held(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| m.body().len() + MESSAGE_OVERHEAD)
        .sum()
}

/// A `basic.publish` waiting for its content header and body.
pub(super) struct Incoming {
    pub(super) publish: basic::Publish,
    /// Set by the content header.
    pub(super) content: Option<Content>,
}

/// The content of a publish as it arrives.
pub(super) struct Content {
    /// The body size its header announced.
    pub(super) size: u64,
    /// The `message-id` among its properties.
    pub(super) message_id: Option<String>,
    /// The `priority` among them.
    pub(super) priority: Option<u8>,
    /// The body as the queue will store it (`content::stored_start`): the properties and
    /// route, then the payload appended frame by frame.
    pub(super) stored: Vec<u8>,
    /// Where the payload starts in `stored`.
    pub(super) payload_start: usize,
    /// Routing keys its `CC` and `BCC` headers add to the publish's own.
    pub(super) cc: Vec<String>,
}

/// The message a complete publish puts.
pub(super) fn into_message(content: Content) -> Message {
    let mut stored = content.stored;
    // A body that grew frame by frame may have room for up to as much again; a queued
    // message keeps at most an eighth more than it holds. One that came in a single frame
    // fits exactly.
    if stored.capacity() - stored.len() > stored.len() / 8 {
        stored.shrink_to_fit();
    }
    // A `priority` orders the message in a queue with `x-max-priority`; none counts as 0,
    // as in RabbitMQ (`content::message` reads it back from a stored body).
    let mut message = Message::new(Bytes::from(stored));
    if let Some(priority) = content.priority {
        message = message.with_priority(priority);
    }
    // `message-id` is the dedup id (contract §3 Deduplication); one the broker could not
    // take as an id (empty, over 1 024 bytes) is kept in the properties only.
    match content.message_id {
        Some(id) if (1..=MAX_ID_BYTES).contains(&id.len()) => message.with_id(id),
        _ => message,
    }
}
