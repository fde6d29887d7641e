//! Publishes: a `basic.publish` and its content frames put back together, routed through
//! the default exchange, and the broker calls of one read (publishes and settles) gathered
//! and made in batches.

use std::sync::atomic::Ordering;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, AMQPClass, BasicProperties};
use leasemq::{Message, Queue};

use super::answers::Pending;
use super::fault::{exchange_fault, publish_method, Fault};
use super::incoming::{into_message, Content, Incoming};
use super::{code, reply_to, unserved, Connection, Phase};
use crate::content::{self};
use crate::exchange::Refusal;
use crate::names;
use crate::wire::{self, BASIC_CLASS};

/// Why a publish is refused whose properties cannot be written back (a value over its
/// wire limit once rewritten).
pub(super) const PROPERTIES_NOT_STORED: &str =
    "PRECONDITION_FAILED - message properties could not be stored";

/// What is reserved for a message body before its frames arrive.
const FIRST_BODY_RESERVE: usize = 128 * 1024;

/// The most body bytes a connection's publishes in progress may announce, all channels
/// together, counted when a header announces more than [`FIRST_BODY_RESERVE`]: four
/// messages of the largest size at once. Smaller ones are not counted (a sum over the
/// channels with every publish would cost too much), so a connection receives at most
/// this plus 128 KiB per channel at once.
pub(super) const ASSEMBLED_BYTES: u64 = 64 << 20;

impl Connection {
    pub(super) fn handle_header(
        &mut self,
        header: wire::Header<'_>,
        message_id: Option<String>,
        priority: Option<u8>,
        cc: Vec<String>,
        stamp: Option<bool>,
        refused: Option<String>,
    ) -> Result<(), Fault> {
        let ch = header.channel;
        if self.channel_closing(ch) {
            return Ok(());
        }
        let max = self.settings.max_message_bytes;
        // Stamped with its arrival (and whether it has a TTL of its own) where it may expire.
        let stamp = stamp.map(|own_ttl| {
            let arrived = match self.arrived {
                Some(at) => at,
                None => *self.arrived.insert(self.settings.clock.now_ms()),
            };
            (arrived, own_ttl)
        });
        // What the publishes in progress announced, where this one is large.
        let assembling = (header.body_size > FIRST_BODY_RESERVE as u64).then(|| {
            (self.channels.values())
                .filter_map(|c| c.incoming.as_ref()?.content.as_ref())
                .map(|content| content.size)
                .sum::<u64>()
        });
        let refused = refused.or_else(|| too_large(header.body_size, max, assembling));
        let incoming = self.incoming(ch, "content header")?;
        if incoming.content.is_some() || header.class_id != BASIC_CLASS {
            return Err(Fault::connection(
                code::UNEXPECTED_FRAME,
                "unexpected content header",
            ));
        }
        if let Some(text) = refused {
            return Err(self.refuse_publish(ch, header.body_size, text));
        }
        // Room for the first frame only: a header promises a size, the body frames prove
        // it; reserving the whole promise would let a few bytes of input claim 16 MiB.
        let reserve = (header.body_size as usize).min(FIRST_BODY_RESERVE);
        let publish = &incoming.publish;
        let (exchange, routing_key) = (publish.exchange.as_str(), publish.routing_key.as_str());
        let start = match cc.is_empty() {
            true => content::stored_start,
            false => content::stored_start_keeping_key,
        };
        let Some(mut stored) = start(header.properties, exchange, routing_key, reserve) else {
            // Names that came as short strings always fit; kept as an error all the same.
            let text = PROPERTIES_NOT_STORED.to_string();
            return Err(self.refuse_publish(ch, header.body_size, text));
        };
        if let Some((arrived, own_ttl)) = stamp {
            content::stamp(&mut stored, arrived, own_ttl);
        }
        incoming.content = Some(Content {
            size: header.body_size,
            message_id,
            priority,
            payload_start: stored.len(),
            stored,
            cc,
        });
        if header.body_size == 0 {
            self.complete_publish(ch)?;
        }
        Ok(())
    }

    /// Refuses the publish on channel `ch` at its content header, as RabbitMQ does: a
    /// channel error with `text`, the body of `size` bytes still to come dropped.
    fn refuse_publish(&mut self, ch: u16, size: u64, text: String) -> Fault {
        self.channels.get_mut(&ch).expect("just seen").incoming = None;
        self.refuse_body(ch, size);
        Fault::channel(ch, code::PRECONDITION_FAILED, text, &publish_method())
    }

    pub(super) fn handle_body(&mut self, ch: u16, body: &[u8]) -> Result<(), Fault> {
        if let Some(i) = self.refused_bodies.iter().position(|(c, _)| *c == ch) {
            let left = &mut self.refused_bodies[i].1;
            *left = left.saturating_sub(body.len() as u64);
            if *left == 0 {
                self.refused_bodies.swap_remove(i);
            }
            return Ok(());
        }
        if self.channel_closing(ch) {
            return Ok(());
        }
        let incoming = self.incoming(ch, "content body")?;
        let Some(content) = &mut incoming.content else {
            return Err(Fault::connection(
                code::UNEXPECTED_FRAME,
                "content body before its header",
            ));
        };
        content.stored.extend_from_slice(body);
        let size = content.size;
        match ((content.stored.len() - content.payload_start) as u64).cmp(&size) {
            std::cmp::Ordering::Less => Ok(()),
            std::cmp::Ordering::Equal => self.complete_publish(ch),
            std::cmp::Ordering::Greater => Err(Fault::connection(
                code::FRAME_ERROR,
                format!("content body longer than the {size} bytes its header announced"),
            )),
        }
    }

    /// The publish on `ch` was refused at its header: the `size` bytes of body that may
    /// follow are dropped as they come (see `refused_bodies`).
    fn refuse_body(&mut self, ch: u16, size: u64) {
        if size > 0 {
            self.refused_bodies.retain(|(c, _)| *c != ch);
            self.refused_bodies.push((ch, size));
        }
    }

    /// Whether we closed `ch` and wait for its `close-ok`: content for it (of a publish sent
    /// before the peer saw our `channel.close`) is dropped quietly.
    fn channel_closing(&self, ch: u16) -> bool {
        self.channels.get(&ch).is_some_and(|s| s.closing)
    }

    /// The channel's publish in progress; content with none is a connection error.
    fn incoming(&mut self, ch: u16, what: &str) -> Result<&mut Incoming, Fault> {
        let unexpected = || {
            let text = format!("unexpected {what} on channel {ch}");
            Fault::connection(code::UNEXPECTED_FRAME, text)
        };
        let state = self.channels.get_mut(&ch).ok_or_else(unexpected)?;
        state.incoming.as_mut().ok_or_else(unexpected)
    }

    /// A publish whose content is complete: routed through the default exchange to the
    /// queue its routing key names, and added to this read's batch for that queue.
    fn complete_publish(&mut self, ch: u16) -> Result<(), Fault> {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let Incoming { publish, content } = state.incoming.take().expect("checked by the caller");
        let content = content.expect("complete content has a header");
        let transactional = state.tx.is_some();
        let number = state.confirm.then(|| {
            // Numbered as the client numbers them: every publish on a confirming channel.
            state.published += 1;
            state.published
        });
        let exchange = publish.exchange.as_str();
        let key = publish.routing_key.as_str();
        // Only in `/` is a plain key its queue's broker name (`names.rs`).
        let plain = exchange.is_empty()
            && content.cc.is_empty()
            && self.vhost.prefix.is_empty()
            && !key.starts_with(names::ESCAPED);
        if plain && !transactional {
            // The common case: one more publish of this read to the queue the last one went
            // to, added to its batch with no lookup. A key equal to that queue's broker name
            // is that name as the client knows it too: broker names that do not start with
            // `names::ESCAPED` are clients' names unchanged.
            if let Some((messages, numbers)) = self.last_put(ch, key) {
                messages.push(into_message(content));
                numbers.extend(number);
                return Ok(());
            }
        }
        let queues: Vec<Queue> = if exchange.is_empty() && content.cc.is_empty() {
            // The common case needs no lock: the default exchange names the queue, by its
            // broker name (`names.rs`).
            let name = names::engine_in(&self.vhost.prefix, key);
            self.queue(&name).into_iter().collect()
        } else {
            // The routing key and each other `CC`/`BCC` key, through the same exchange
            // (and those it passes the message to) at once, as RabbitMQ routes them: a
            // queue more than one of them reaches gets the message once, and an alternate
            // exchange gets it only if none of them routes it.
            let mut keys = vec![key];
            if !content.cc.is_empty() {
                let mut seen = std::collections::HashSet::with_capacity(content.cc.len() + 1);
                seen.insert(key);
                keys.extend((content.cc.iter().map(String::as_str)).filter(|k| seen.insert(k)));
            }
            let exchanges = self.vhost.exchanges.lock().expect("never poisoned");
            if exchanges.is_internal(exchange) {
                let text = format!(
                    "ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost '{}'",
                    self.vhost.name
                );
                let m = publish_method();
                return Err(Fault::channel(ch, code::ACCESS_REFUSED, text, &m));
            }
            // Only a headers exchange asks for the message's headers, parsed then.
            let headers = || content::stored_headers(&content.stored);
            let Some(names) = exchanges.route_keys(exchange, &keys, headers) else {
                let (refusal, m) = (Refusal::NotFound, &publish_method());
                return Err(exchange_fault(ch, refusal, exchange, &self.vhost.name, m));
            };
            drop(exchanges);
            names.iter().filter_map(|name| self.queue(name)).collect()
        };
        if queues.is_empty() {
            // An exchange drops what it cannot route, unless `mandatory` asks for it back.
            if publish.mandatory {
                self.return_unroutable(ch, publish, &content);
            }
            return Ok(());
        }
        let message = into_message(content);
        if transactional {
            return self.hold_publish(ch, queues, message);
        }
        self.put_copies(ch, queues, message, number);
        Ok(())
    }

    /// Adds a publish on `ch` (numbered `number` on a confirming or transactional channel)
    /// to this read's batch for each queue in `queues`.
    pub(super) fn put_copies(
        &mut self,
        ch: u16,
        queues: Vec<Queue>,
        message: Message,
        number: Option<u64>,
    ) {
        let Some(last) = queues.len().checked_sub(1) else {
            return;
        };
        let mut message = Some(message);
        for (i, queue) in queues.into_iter().enumerate() {
            // Each queue but the last gets a copy (sharing the body); the last the message.
            let message = match i == last {
                true => message.take().expect("taken only at the last"),
                false => message.clone().expect("taken only at the last"),
            };
            match self.last_put(ch, queue.name()) {
                Some((messages, numbers)) => {
                    messages.push(message);
                    numbers.extend(number);
                }
                None => self.pending.push(Pending::Put {
                    channel: ch,
                    queue,
                    messages: vec![message],
                    numbers: number.into_iter().collect(),
                }),
            }
        }
    }

    /// The messages and publish numbers of this read's last batch, if it is a run of
    /// publishes on `ch` to the queue called `name`, still open (one deleted and declared
    /// again within the read starts a batch of its own).
    fn last_put(&mut self, ch: u16, name: &str) -> Option<(&mut Vec<Message>, &mut Vec<u64>)> {
        match self.pending.last_mut()? {
            Pending::Put {
                channel,
                queue,
                messages,
                numbers,
            } if *channel == ch && queue.name() == name && !queue.is_closed() => {
                Some((messages, numbers))
            }
            _ => None,
        }
    }

    fn return_unroutable(&mut self, ch: u16, publish: basic::Publish, content: &Content) {
        let ret = basic::Return {
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
            exchange: publish.exchange,
            routing_key: publish.routing_key,
        };
        self.send(ch, AMQPClass::Basic(basic::AMQPMethod::Return(ret)));
        let properties = content::stored_properties(&content.stored);
        let payload = &content.stored[content.payload_start..];
        self.out
            .content_encoded(ch, properties, payload, self.frame_max);
    }
}

impl Connection {
    /// A content header: on a channel of an open connection, the next part of a publish
    /// (its properties checked, and parsed only if they differ from the last ones); else
    /// handled as any other frame. `Err` for properties that do not parse.
    pub(super) fn content_header(&mut self, header: wire::Header<'_>) -> Result<(), ()> {
        if self.phase != Phase::Open || header.channel == 0 {
            self.handle_frame(header.to_frame().ok_or(())?);
            return Ok(());
        }
        let properties = self.seen.input.check(header.properties).ok_or(())?;
        let id = properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        let mut refused = refused_properties(properties, self.login.user_name());
        if self.settings.cluster && refused.is_none() {
            refused = unserved::properties(properties);
        }
        let mut refuse = |text: String| {
            refused.get_or_insert(text);
        };
        let channel = || self.channels.get(&header.channel);
        let reply_name = reply_to::direct_reply_name(channel, properties).unwrap_or_else(|text| {
            refuse(text);
            None
        });
        let routes = content::sender_routes(properties).unwrap_or_else(|text| {
            refuse(text);
            None
        });
        // A message that may expire is stamped with its arrival, and marked where it has
        // an `expiration` of its own (a number of milliseconds, as RabbitMQ reads it); once
        // a queue has a message TTL, every message is stamped.
        let expiration = properties.expiration().as_ref();
        if let Some(Err(text)) = expiration.map(|e| content::parse_expiration(e.as_str())) {
            refuse(text);
        }
        let own_ttl = expiration.is_some();
        let stamp = own_ttl || self.vhost.message_ttl_used.load(Ordering::Relaxed);
        let bcc = routes.as_ref().is_some_and(|r| r.bcc);
        // Stored with other properties than it came with: a direct reply-to's name, or
        // its `BCC` header taken out (recipients a consumer must not see).
        let rewritten = if reply_name.is_some() || bcc {
            let mut stored = properties.clone();
            if let Some(name) = reply_name {
                stored = stored.with_reply_to(name);
            }
            if bcc {
                stored = content::without_bcc(stored);
            }
            let encoded = content::encode_properties(&stored);
            if encoded.is_none() {
                refuse(PROPERTIES_NOT_STORED.into());
            }
            encoded
        } else {
            None
        };
        let header = match &rewritten {
            Some(properties) => wire::Header {
                properties,
                ..header
            },
            None => header,
        };
        let cc = routes.map(|r| r.keys).unwrap_or_default();
        let stamp = stamp.then_some(own_ttl);
        let priority = *properties.priority();
        if let Err(fault) = self.handle_header(header, id, priority, cc, stamp, refused) {
            self.fail(fault);
        }
        Ok(())
    }

    /// A content body frame: on a channel of an open connection, the next part of a
    /// publish, copied once; else handled as any other frame.
    pub(super) fn content_body(&mut self, channel: u16, body: &[u8]) {
        if self.phase != Phase::Open || channel == 0 {
            self.handle_frame(AMQPFrame::Body(channel, body.to_vec()));
        } else if let Err(fault) = self.handle_body(channel, body) {
            self.fail(fault);
        }
    }
}

/// Why a publish with these properties is refused (a 406 on its channel, as RabbitMQ's),
/// if it is: a `user-id` other than the connection's user, which RabbitMQ checks so that
/// a consumer may trust it.
///
/// `expiration` is kept and delivered back, but a message does not expire by it: refusing
/// it would fail a publish that works against RabbitMQ, where keeping the message longer
/// only delivers what RabbitMQ might have dropped (ARCHITECTURE, "AMQP and leases").
pub(super) fn refused_properties(properties: &BasicProperties, user: &str) -> Option<String> {
    let claimed = properties.user_id().as_ref()?;
    (claimed.as_str() != user).then(|| {
        format!(
            "PRECONDITION_FAILED - user_id property set to '{claimed}' but authenticated user was '{user}'"
        )
    })
}

/// Why a publish whose header announces `size` bytes is refused as too large: over the
/// largest message (`max`), or, with the bodies this connection receives at once
/// (`assembling`, counted for a large one), past [`ASSEMBLED_BYTES`].
fn too_large(size: u64, max: usize, assembling: Option<u64>) -> Option<String> {
    if size > max as u64 {
        return Some(format!(
            "PRECONDITION_FAILED - message size {size} is larger than the maximum of {max}"
        ));
    }
    (assembling? + size > ASSEMBLED_BYTES).then(|| {
        format!(
            "PRECONDITION_FAILED - message size {size} would take the bodies this connection receives at once past {} MiB; send large messages fewer at a time",
            ASSEMBLED_BYTES >> 20
        )
    })
}
