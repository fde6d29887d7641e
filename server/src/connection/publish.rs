//! Publishes: a `basic.publish` and its content frames put back together, routed through
//! the default exchange, and the broker calls of one read (publishes and settles) gathered
//! and made in batches.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use amq_protocol::protocol::{basic, tx, AMQPClass};
use bytes::Bytes;
use leasemq::{DeliveryTag, Error, Message, PendingPutBatch, Queue, Settle};

use super::channel::{broker_fault, exchange_fault};
use super::{code, Connection, Fault};
use crate::content::{self, MAX_ID_BYTES};
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

/// How many bytes of publishes one connection may have handed to a shard without waiting
/// for its answer (`put_batch_nowait`) before its next put there waits: what a shard that
/// falls behind holds for one connection in its inbox, beyond one read's publishes.
pub(super) const UNANSWERED_PUT_BYTES: usize = 256 * 1024;
/// What a message costs beyond its body while it waits in a shard's inbox.
const MESSAGE_OVERHEAD: usize = 64;
/// The most bytes of awaited puts ([`Awaited`]) a connection holds before it stops
/// reading until answers come.
const AWAITED_BYTES: usize = 1 << 20;
/// The most awaited puts a connection holds before it stops reading (each answer is
/// looked for on every wake-up of the connection).
const AWAITED_PUTS: usize = 256;

/// What `messages` hold while they wait for a shard: their bodies and [`MESSAGE_OVERHEAD`]
/// each.
pub(super) fn bytes_held(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| m.body().len() + MESSAGE_OVERHEAD)
        .sum()
}

/// A put sent with [`Queue::begin_put_batch`] whose answer the connection awaits while it
/// reads on: the puts of confirming channels (confirmed when answered) and of durable
/// queues (answered after an fsync; a failed log is a channel error).
pub(crate) struct Awaited {
    channel: u16,
    /// The channel's `serial`: an answer for an earlier channel of the same number is
    /// dropped.
    serial: u64,
    /// The publish numbers it holds, ascending; empty without confirms.
    numbers: Vec<u64>,
    bytes: usize,
    answer: PendingPutBatch,
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
    size: u64,
    /// The `message-id` among its properties.
    message_id: Option<String>,
    /// The `priority` among them.
    priority: Option<u8>,
    /// The body as the queue will store it (`content::stored_start`): the properties and
    /// route, then the payload appended frame by frame.
    stored: Vec<u8>,
    /// Where the payload starts in `stored`.
    payload_start: usize,
    /// Routing keys its `CC` and `BCC` headers add to the publish's own.
    cc: Vec<String>,
}

/// The message a complete publish puts.
fn into_message(content: Content) -> Message {
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

/// Broker calls gathered from one read, made in order when the read is done (or before a
/// method that must see their effects): a run of publishes to one queue on one channel is
/// one put batch (see `put`), a run of settles of one queue's deliveries one
/// `settle_batch`.
pub(crate) enum Pending {
    Put {
        channel: u16,
        queue: Queue,
        messages: Vec<Message>,
        /// Each message's publish number on a confirming channel; empty on another.
        numbers: Vec<u64>,
    },
    Settle {
        channel: u16,
        queue: Queue,
        settles: Vec<(DeliveryTag, Settle)>,
    },
}

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
        let incoming = self.incoming(ch, "content header")?;
        if incoming.content.is_some() || header.class_id != BASIC_CLASS {
            return Err(Fault::connection(
                code::UNEXPECTED_FRAME,
                "unexpected content header",
            ));
        }
        if let Some(text) = refused {
            self.channels.get_mut(&ch).expect("just seen").incoming = None;
            self.refuse_body(ch, header.body_size);
            return Err(Fault::channel(
                ch,
                code::PRECONDITION_FAILED,
                text,
                &publish_method(),
            ));
        }
        if header.body_size > max as u64 {
            let channel = self.channels.get_mut(&ch).expect("just seen");
            channel.incoming = None;
            self.refuse_body(ch, header.body_size);
            let text = format!(
                "PRECONDITION_FAILED - message size {} is larger than the maximum of {max}",
                header.body_size
            );
            return Err(Fault::channel(
                ch,
                code::PRECONDITION_FAILED,
                text,
                &publish_method(),
            ));
        }
        if let Some(assembling) = assembling {
            if assembling + header.body_size > ASSEMBLED_BYTES {
                let channel = self.channels.get_mut(&ch).expect("just seen");
                channel.incoming = None;
                self.refuse_body(ch, header.body_size);
                let text = format!(
                    "PRECONDITION_FAILED - message size {} would take the bodies this connection receives at once past {} MiB; send large messages fewer at a time",
                    header.body_size,
                    ASSEMBLED_BYTES >> 20
                );
                let m = publish_method();
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
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
            self.channels.get_mut(&ch).expect("just seen").incoming = None;
            self.refuse_body(ch, header.body_size);
            let text = PROPERTIES_NOT_STORED;
            return Err(Fault::channel(
                ch,
                code::PRECONDITION_FAILED,
                text,
                &publish_method(),
            ));
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
        let plain =
            exchange.is_empty() && content.cc.is_empty() && !key.starts_with(names::ESCAPED);
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
            self.queue(&names::engine(key)).into_iter().collect()
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
                    "ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost '/'"
                );
                let m = publish_method();
                return Err(Fault::channel(ch, code::ACCESS_REFUSED, text, &m));
            }
            // Only a headers exchange asks for the message's headers, parsed then.
            let headers = || content::stored_headers(&content.stored);
            let Some(names) = exchanges.route_keys(exchange, &keys, headers) else {
                let (refusal, m) = (Refusal::NotFound, &publish_method());
                return Err(exchange_fault(ch, refusal, exchange, m));
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

    /// One channel's run of publishes to one queue. A full queue (`x-overflow`
    /// `reject-publish`) takes what fits, in order, and refuses the rest; a failed log
    /// refuses them all. A refused publish is nacked on a confirming channel and dropped on
    /// another, as RabbitMQ does; a failed log without confirms is a channel error, so that
    /// the loss is not silent.
    ///
    /// Three ways to the shard: without waiting where no answer could matter
    /// ([`reserve_nowait`](Connection::reserve_nowait)); awaited ([`Awaited`]) where the
    /// answer is confirmed or comes after an fsync, one put per message to a bounded queue;
    /// otherwise (a bounded queue in memory without confirms, or too much unanswered) a
    /// `put_batch` waited for, which is quick. A queue deleted since the publish was routed
    /// took the publish with it, as it took what it held (a confirming channel acks it).
    fn put(&mut self, ch: u16, queue: &Queue, messages: Vec<Message>, numbers: Vec<u64>) {
        let own_ttl = messages.iter().any(|m| content::has_own_ttl(m.body()));
        if !own_ttl && !self.vhost.message_expiry.is_watching() {
            return self.put_now(ch, queue, messages, numbers);
        }
        self.put_now(ch, queue, messages, numbers);
        // After the put went to the shard: a look at the head made from here on sees it.
        (self.vhost.message_expiry).published(queue, own_ttl);
    }

    /// [`put`](Connection::put), without a word to `message_expiry.rs`.
    fn put_now(&mut self, ch: u16, queue: &Queue, messages: Vec<Message>, numbers: Vec<u64>) {
        // Checked here, whichever way the put goes, so that the channel fails before any
        // later publish of it is put, and none of the run is.
        let max = queue.config().max_body_bytes;
        if messages.iter().any(|m| m.body().len() > max) {
            self.fail(broker_fault(ch, &Error::MessageTooLarge, &publish_method()));
            return;
        }
        if numbers.is_empty() && self.reserve_nowait(queue, bytes_held(&messages)) {
            queue.put_batch_nowait(messages);
            return;
        }
        let bounded = queue.config().max_length.is_some();
        if !numbers.is_empty() || queue.is_durable() {
            let serial = self.channels.get(&ch).map_or(0, |s| s.serial);
            if bounded {
                // One put each, so that a full queue refuses only what does not fit.
                for (i, message) in messages.into_iter().enumerate() {
                    let number = numbers.get(i).map(|&n| vec![n]).unwrap_or_default();
                    self.await_put(ch, serial, queue, vec![message], number);
                }
            } else {
                self.await_put(ch, serial, queue, messages, numbers);
            }
            return;
        }
        // Once this call is answered, every put sent before it to this shard is applied.
        if let Some(bytes) = self.unanswered_puts.get_mut(queue.shard()) {
            *bytes = 0;
        }
        // Kept for a second try one by one; only a bounded queue can refuse part.
        let retry = (messages.len() > 1 && bounded).then(|| messages.clone());
        match queue.put_batch(messages) {
            Ok(_) => {}
            Err(Error::QueueFull) => {
                for message in retry.into_iter().flatten() {
                    if queue.put(message).is_err() {
                        break;
                    }
                }
            }
            Err(Error::QueueClosed) => {}
            Err(e) => self.fail(broker_fault(ch, &e, &publish_method())),
        }
    }

    /// Sends a put whose answer is awaited ([`Awaited`]) rather than waited for: the
    /// connection reads on, and confirms (or fails the channel) when the answer comes.
    fn await_put(
        &mut self,
        ch: u16,
        serial: u64,
        queue: &Queue,
        messages: Vec<Message>,
        numbers: Vec<u64>,
    ) {
        let bytes = bytes_held(&messages);
        self.awaited_bytes += bytes;
        self.awaited.push_back(Awaited {
            channel: ch,
            serial,
            numbers,
            bytes,
            answer: queue.begin_put_batch(messages),
        });
    }

    /// Takes the answers that have come for awaited puts (see `Awaited`): a refused
    /// publish (a full queue, a failed log) is nacked on a confirming channel and dropped on
    /// another, a failed log without confirms or any other error is a channel error, a
    /// broker shutting down a connection error; then confirms what can be confirmed.
    /// `Ready` when an answer was taken, `Pending` (the waker registered with every awaited
    /// put) when none had come.
    pub fn poll_answers(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.phase != super::Phase::Open {
            // Closing or closed: nothing but close-ok goes out any more, and the answers
            // still to come have nobody to go to.
            let had = !self.awaited.is_empty();
            self.awaited.clear();
            self.awaited_bytes = 0;
            return if had { Poll::Ready(()) } else { Poll::Pending };
        }
        let mut faults: Vec<Fault> = Vec::new();
        let mut taken = false;
        let mut still = VecDeque::with_capacity(self.awaited.len());
        for mut awaited in std::mem::take(&mut self.awaited) {
            let Poll::Ready(answer) = Pin::new(&mut awaited.answer).poll(cx) else {
                still.push_back(awaited);
                continue;
            };
            self.awaited_bytes -= awaited.bytes;
            taken = true;
            let ch = awaited.channel;
            let Some(state) = self
                .channels
                .get_mut(&ch)
                .filter(|s| s.serial == awaited.serial && !s.closing)
            else {
                continue; // its channel closed meanwhile: nobody to tell
            };
            match answer {
                // A queue deleted after the publish was routed took the message with it, as
                // a delete takes what the queue holds: confirmed, as RabbitMQ confirms the
                // publishes a deleted queue still owed (only a crashed one's are nacked).
                Ok(_) | Err(Error::QueueClosed) => {}
                Err(Error::QueueFull | Error::Storage(_)) if state.confirm => {
                    state.refused.extend(&awaited.numbers);
                }
                // Dropped without confirms (a commit's puts too, whose commit is answered all
                // the same), as RabbitMQ drops what it cannot take.
                Err(Error::QueueFull) => {}
                Err(e) => faults.push(broker_fault(ch, &e, &publish_method())),
            }
        }
        self.awaited = still;
        // A connection error ends every channel: it alone is answered. Otherwise one
        // channel error per channel.
        if let Some(i) = faults.iter().position(|f| f.channel.is_none()) {
            faults.swap(0, i);
            faults.truncate(1);
        }
        let mut failed = Vec::new();
        for fault in faults {
            if self.phase == super::Phase::Open && !failed.contains(&fault.channel) {
                failed.push(fault.channel);
                self.fail(fault);
            }
        }
        if !taken {
            return Poll::Pending;
        }
        self.send_confirms();
        Poll::Ready(())
    }

    /// [`poll_answers`](Connection::poll_answers) without waiting: takes what has come.
    pub fn try_answers(&mut self) {
        if !self.awaited.is_empty() {
            let _ = self.poll_answers(&mut Context::from_waker(std::task::Waker::noop()));
        }
    }

    /// Whether puts are awaited: the driver then polls for their answers.
    pub fn awaits_answers(&self) -> bool {
        !self.awaited.is_empty()
    }

    /// Whether the connection takes more input: not while the memory alarm blocks it, nor
    /// while the puts it awaits hold more than `AWAITED_BYTES`, so that a publisher
    /// whose answers lag (a slow disk) is not read faster than they come.
    pub fn wants_input(&self) -> bool {
        !self.blocked && self.awaited_bytes < AWAITED_BYTES && self.awaited.len() < AWAITED_PUTS
    }

    /// Whether a run of publishes without confirms may go to its queue without waiting for
    /// the shard's answer, and if so counts it as unanswered: when nothing the answer could
    /// say needs telling. A refused publish is dropped either way, so only a refusal that is
    /// not would need the answer: a bounded queue (which takes what fits of a batch, not
    /// none of it), or a durable queue (a failed log is a channel error). The publishes a
    /// shard has not answered are bounded per connection ([`UNANSWERED_PUT_BYTES`]): past
    /// that, a put waits, and its answer covers the rest.
    pub(super) fn reserve_nowait(&mut self, queue: &Queue, bytes: usize) -> bool {
        if queue.is_durable() || queue.config().max_length.is_some() {
            return false;
        }
        let shard = queue.shard();
        if self.unanswered_puts.len() <= shard {
            self.unanswered_puts.resize(shard + 1, 0);
        }
        let unanswered = &mut self.unanswered_puts[shard];
        if *unanswered + bytes > UNANSWERED_PUT_BYTES {
            return false;
        }
        *unanswered += bytes;
        true
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

    /// Makes the broker calls gathered so far, then confirms what can be confirmed.
    pub(super) fn flush_pending(&mut self) {
        self.apply_pending();
        self.send_confirms();
    }

    /// Confirms the publishes of confirming channels that are settled (see [`confirms`]).
    fn send_confirms(&mut self) {
        // A publish not yet sent to its queue must not be confirmed: it is in no awaited put.
        debug_assert!(self.pending.is_empty(), "confirms after the broker calls");
        // Nor one whose awaited put was forgotten when the connection began to close.
        if self.phase != super::Phase::Open {
            return;
        }
        let mut answers = Vec::new();
        for (&ch, state) in &mut self.channels {
            let commits = state.tx.is_some() && !state.commits.is_empty();
            let waiting = state.confirm && state.confirmed < state.published;
            if state.closing || !(waiting || commits) {
                continue;
            }
            let awaited: Vec<&[u64]> = self
                .awaited
                .iter()
                .filter(|a| a.channel == ch && a.serial == state.serial)
                .map(|a| a.numbers.as_slice())
                .collect();
            let refused = std::mem::take(&mut state.refused);
            let now = confirms(state.confirmed, state.published, refused, &awaited);
            state.confirmed = now.confirmed;
            state.refused = now.refused;
            if state.tx.is_some() {
                // A transaction's publishes are not confirmed one by one: its commit is
                // answered once every publish up to it is settled.
                while state
                    .commits
                    .front()
                    .is_some_and(|&at| at <= state.confirmed)
                {
                    state.commits.pop_front();
                    let ok = AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
                    answers.push((ch, ok));
                }
                continue;
            }
            for confirm in now.answers {
                let method = match confirm {
                    Confirm::AckUpTo(delivery_tag) => basic::AMQPMethod::Ack(basic::Ack {
                        delivery_tag,
                        multiple: true,
                    }),
                    Confirm::Nack(delivery_tag) => basic::AMQPMethod::Nack(basic::Nack {
                        delivery_tag,
                        multiple: false,
                        requeue: false,
                    }),
                };
                answers.push((ch, AMQPClass::Basic(method)));
            }
        }
        for (ch, answer) in answers {
            self.send(ch, answer);
        }
    }

    /// Makes the gathered broker calls, in order. A call whose channel a fault earlier in
    /// the same flush closed is dropped, as RabbitMQ ignores what follows a channel error.
    pub(super) fn apply_pending(&mut self) {
        for op in std::mem::take(&mut self.pending) {
            let ch = match &op {
                Pending::Put { channel, .. } | Pending::Settle { channel, .. } => *channel,
            };
            let open = self.channels.get(&ch).is_some_and(|s| !s.closing);
            if !open || self.phase != super::Phase::Open {
                continue;
            }
            match op {
                Pending::Put {
                    queue,
                    messages,
                    numbers,
                    ..
                } => self.put(ch, &queue, messages, numbers),
                // A `false` answer is a stale tag (its lease ran out and the message went
                // elsewhere): the broker counted it, and AMQP hears nothing, as the
                // contract asks. So acks need no answer: the connection goes on without
                // waiting for the shard (or, on a durable queue, for the disk). A nack or
                // reject waits, so that a dead letter it causes is in its queue before the
                // channel's next method is served.
                Pending::Settle { queue, settles, .. } => {
                    if settles.iter().all(|(_, s)| *s == Settle::Ack) {
                        queue.settle_batch_nowait(&settles);
                    } else {
                        queue.settle_batch(&settles);
                    }
                }
            }
        }
        self.drop_settled_consumers();
    }
}

/// One publisher confirm.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) enum Confirm {
    /// `basic.ack` with `multiple`: every publish up to this one, not yet confirmed, is in.
    AckUpTo(u64),
    /// `basic.nack` of this publish alone.
    Nack(u64),
}

/// What a confirming channel answers now (see [`confirms`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Confirms {
    /// In the order they go out, by publish number.
    pub(super) answers: Vec<Confirm>,
    /// The channel's highest confirmed publish afterwards.
    pub(super) confirmed: u64,
    /// Refused publishes not nacked yet: an earlier publish is still awaited.
    pub(super) refused: Vec<u64>,
}

/// The confirms of a channel whose publishes are confirmed up to `confirmed` and numbered
/// up to `published`, with `refused` publishes refused by their queue and `awaited` the
/// publish numbers (ascending) of each of its puts whose answer has not come.
///
/// Every publish below the first one still awaited is settled: put in its queue (or
/// unroutable, which RabbitMQ confirms too), or refused (a full queue, a failed log), which
/// is a `basic.nack`. They are confirmed strictly in order, a run of puts with one
/// `basic.ack multiple` and each refused one with its own nack, so that no ack with
/// `multiple` covers a publish that was nacked (a client may take such an ack for the
/// publishes it covers whatever it heard before), and nothing at or past the first awaited
/// publish is confirmed, not even a refused one.
pub(super) fn confirms(
    confirmed: u64,
    published: u64,
    mut refused: Vec<u64>,
    awaited: &[&[u64]],
) -> Confirms {
    let settled = awaited
        .iter()
        .filter_map(|numbers| numbers.first().copied())
        .min()
        .map_or(published, |first| first - 1);
    refused.sort_unstable();
    refused.dedup();
    let later = refused.split_off(refused.partition_point(|&n| n <= settled));
    let mut answers = Vec::new();
    let mut done = confirmed;
    for n in refused.into_iter().filter(|&n| n > confirmed) {
        if n - 1 > done {
            answers.push(Confirm::AckUpTo(n - 1));
        }
        answers.push(Confirm::Nack(n));
        done = n;
    }
    if settled > done {
        answers.push(Confirm::AckUpTo(settled));
        done = settled;
    }
    Confirms {
        answers,
        confirmed: done,
        refused: later,
    }
}

/// `basic.publish`, as the method a channel error names: only its class and method ids
/// are read, so the publish's own fields need not be copied on every message.
pub(super) fn publish_method() -> AMQPClass {
    AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish::default()))
}
