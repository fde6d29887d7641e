//! One AMQP 0-9-1 connection as a state machine: bytes in, broker calls and frames out.
//!
//! [`Connection`] does no IO. The driver (`serve.rs`) feeds it what the socket read
//! ([`Connection::handle_input`]), hands it each delivery a consumer of it received
//! ([`Connection::handle_delivery`], after [`Connection::poll_delivery`] or
//! [`Connection::try_delivery`]), and writes out what it produced
//! ([`Connection::take_output`]), and hands it the answers to the puts it awaits
//! ([`Connection::poll_answers`]). Its broker calls are blocking ones (a round trip to a
//! shard thread, which never waits on a connection), ones not waited for (acks, and most
//! puts of publishes without confirms), and puts whose answers it awaits while it reads on
//! (those of confirming channels and durable queues).
//!
//! The connection walks through the handshake (protocol header, `connection.start`/
//! `start-ok` with PLAIN, `tune`/`tune-ok`, `open`/`open-ok`), then serves channels
//! (`channel.rs`). A fault answers as RabbitMQ does: a channel error closes that channel
//! (`channel.close`, then everything on it but `close-ok` is dropped), a connection error
//! closes the connection (`connection.close`, then everything but `close-ok`). Frames the
//! peer cannot have meant (malformed, over `frame_max`) end it at once.

mod answers;
mod channel;
mod consume;
mod dispatch;
mod fault;
mod incoming;
mod publish;
mod queues;
mod reply_to;
mod timers;
mod tx;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ahash::RandomState;
use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::BasicProperties;
use amq_protocol::protocol::{basic, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use leasemq::{Broker, Consumer, Delivery, DeliveryTag, Queue, Settle};

pub(crate) use crate::code;
use crate::consumers;
use crate::content::{self, PropertiesSeen};
use crate::dead_letter;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::vhost::VHost;
use crate::wire::{self, Next, Output};
use answers::{Awaited, Pending};
use channel::Channel;
use fault::{method_name, reply_text, Fault};
pub use timers::TimedOut;
use timers::Timers;

/// The most a feed of input writes before it leaves the rest of its frames for later
/// ([`Connection::handle_input`]): what one read can make the output grow by stays near
/// this, whatever its frames ask for.
pub(crate) const OUTPUT_PER_FEED: usize = 1 << 20;

/// How many queue handles a connection keeps before it first drops those of closed
/// queues (`Connection::queue`).
const QUEUES_SWEPT_FROM: usize = 64;

/// The smallest `frame_max` a client may ask for: AMQP 0-9-1's `frame-min-size`, which
/// RabbitMQ 3 keeps (`amq-protocol` follows RabbitMQ 4.1, which raised it to 8192 and so
/// refuses amqplib before 0.10.6, whose default was 4096).
const FRAME_MIN_SIZE: u32 = 4096;

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitHeader,
    AwaitStartOk,
    AwaitTuneOk,
    AwaitOpen,
    Open,
    /// We sent `connection.close` and wait for `close-ok`.
    Closing,
    /// Nothing more is read; the driver flushes the output and closes the socket.
    Closed,
}

/// One consumer of this connection: the broker's consumer and what AMQP calls it.
struct Subscription {
    channel: u16,
    /// Its queue's `x-message-ttl`, in milliseconds, as declared when it started.
    message_ttl: Option<u64>,
    /// The connection's number for it, unique on the connection.
    number: u64,
    tag: ShortString,
    queue: Queue,
    /// Its broker consumer; `None` while it waits its turn on a queue with a single
    /// active consumer.
    consumer: Option<Consumer>,
    /// What it waits for, and the broker consumer it makes then.
    waiting: Option<Waiting>,
    no_ack: bool,
    /// Its place among its queue's consumers, given back as the subscription ends.
    _claim: consumers::Claim,
}

/// A subscription waiting its turn (`x-single-active-consumer`): the broker consumer it
/// makes when the turn comes.
struct Waiting {
    turn: Arc<consumers::Turn>,
    name: String,
    config: leasemq::ConsumerConfig,
    priority: i64,
}

/// Whether this thread is a worker of a multi-threaded tokio runtime, where a broker call
/// that may wait for the disk goes under `block_in_place` (which moves the worker's other
/// tasks away, at the cost of a thread hand-off).
pub(crate) fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// An ahash state with keys drawn from the standard library's randomly keyed hasher, so
/// that a client cannot choose names that collide.
fn keyed_state(id: u64) -> RandomState {
    use std::hash::BuildHasher;
    let std = std::collections::hash_map::RandomState::new();
    let key = |n: u64| std.hash_one((id, n));
    RandomState::with_seeds(key(0), key(1), key(2), key(3))
}

/// One AMQP connection's protocol state; see the module docs.
pub struct Connection {
    broker: Broker,
    settings: Arc<Settings>,
    /// The virtual host its methods act on: queues, exchanges and what is kept of them.
    vhost: Arc<VHost>,
    id: u64,
    peer_is_loopback: bool,
    phase: Phase,
    frame_max: usize,
    channel_max: u16,
    heartbeat: u16,
    /// Looked up for every frame: hashed with ahash, not SipHash (a client only ever
    /// collides with itself in these per-connection maps).
    channels: HashMap<u16, Channel, RandomState>,
    subscriptions: Vec<Subscription>,
    /// Where the next look for a delivery starts, so no consumer starves the others.
    rotor: usize,
    next_consumer: u64,
    /// Queues by name, so a publish needs no lookup round trip.
    queues: HashMap<String, Queue, RandomState>,
    /// The size of `queues` at which the handles of closed queues are dropped.
    sweep_queues_at: usize,
    /// When the current input arrived (milliseconds since the Unix epoch), read once per
    /// input: the arrival its publishes are stamped with.
    arrived: Option<u64>,
    /// Publishes and settles of the current input, made in batches when it is done.
    pending: Vec<Pending>,
    /// Bytes of publishes put without waiting, by shard, since a put to that shard last
    /// waited for its answer (see `reserve_nowait`).
    unanswered_puts: Vec<usize>,
    /// Puts whose answers are awaited, in the order sent, and their bytes.
    awaited: VecDeque<Awaited>,
    awaited_bytes: usize,
    /// Channels opened so far: the next one's `serial`.
    opened: u64,
    /// The exclusive queues this connection declared: deleted when it ends.
    exclusive: Vec<Queue>,
    /// Channels whose publish was refused at its content header, and how many bytes of
    /// its body may still come: dropped as they do, even after the channel's `close-ok`
    /// (a client may answer the close before it has written the rest of a large body).
    refused_bodies: Vec<(u16, u64)>,
    /// The code and text of the `connection.close` a connection error made us send.
    closed_with: Option<(u16, String)>,
    /// Deliveries to `no_ack` consumers, acked in one batch per queue once their frames
    /// leave for the socket (or before the next input), rather than a broker round trip
    /// each. A connection that ends first does not ack them: they come back.
    auto_acks: Vec<(Queue, Vec<(DeliveryTag, Settle)>)>,
    /// Properties already found well formed, so that neither a publish nor a delivery
    /// parses the same ones again.
    seen: Seen,
    out: Output,
    /// A `basic.publish` met the memory alarm: no input is taken until it clears
    /// (`memory.rs`).
    blocked: bool,
    /// The client announced the `connection.blocked` capability: it is told when it is
    /// blocked and unblocked.
    hears_blocked: bool,
    /// The handshake's deadline, heartbeats and a close's grace (`timers.rs`).
    timers: Timers,
}

/// The last properties checked on each way, kept apart so that a connection that both
/// publishes and consumes keeps both.
#[derive(Debug, Default)]
struct Seen {
    /// Of publishes.
    input: PropertiesSeen,
    /// Of deliveries.
    output: PropertiesSeen,
}

impl Connection {
    /// A connection that waits for the protocol header. `id` names it in consumer names
    /// and logs; `peer_is_loopback` decides whether a loopback-only user may log in.
    pub fn new(
        broker: Broker,
        settings: Arc<Settings>,
        vhost: Arc<VHost>,
        id: u64,
        peer_is_loopback: bool,
    ) -> Connection {
        // Until tune-ok, as RabbitMQ: frames of the smallest size any peer takes. A client
        // not logged in yet has a connection hold little.
        let frame_max = FRAME_MIN_SIZE as usize;
        let channel_max = settings.channel_max;
        let handshake_timeout = settings.handshake_timeout;
        Connection {
            broker,
            settings,
            vhost,
            id,
            peer_is_loopback,
            phase: Phase::AwaitHeader,
            frame_max,
            channel_max,
            heartbeat: 0,
            channels: HashMap::with_hasher(keyed_state(id)),
            subscriptions: Vec::new(),
            rotor: 0,
            next_consumer: 0,
            queues: HashMap::with_hasher(keyed_state(id)),
            sweep_queues_at: QUEUES_SWEPT_FROM,
            arrived: None,
            pending: Vec::new(),
            unanswered_puts: Vec::new(),
            awaited: VecDeque::new(),
            awaited_bytes: 0,
            opened: 0,
            exclusive: Vec::new(),
            refused_bodies: Vec::new(),
            closed_with: None,
            auto_acks: Vec::new(),
            seen: Seen::default(),
            out: Output::default(),
            blocked: false,
            hears_blocked: false,
            timers: Timers::new(std::time::Instant::now(), handshake_timeout),
        }
    }

    /// Feeds bytes read from the socket; returns how many were used (whole frames). The
    /// rest must be fed again, with what is read next, once more has arrived. It stops
    /// taking frames, whole ones left, once what it wrote passes `OUTPUT_PER_FEED` (a
    /// read of `basic.get`s that each return a large message, say): those are to be fed
    /// again, with no read needed, once the socket has taken the output.
    pub fn handle_input(&mut self, input: &[u8]) -> usize {
        self.flush_auto_acks();
        self.arrived = None;
        let mut used = 0;
        while used < input.len() && !matches!(self.phase, Phase::Closed) {
            let rest = &input[used..];
            if self.phase == Phase::AwaitHeader {
                match wire::protocol_header(rest) {
                    None => break,
                    Some(Ok(())) => {
                        used += 8;
                        self.send_start();
                    }
                    Some(Err(())) => {
                        // AMQP 0-9-1 §4.2.2: answer with the header we speak, then close.
                        let ours = amq_protocol::frame::ProtocolVersion::amqp_0_9_1();
                        let _ = self.out.frame(&AMQPFrame::ProtocolHeader(ours));
                        self.phase = Phase::Closed;
                        used = input.len();
                    }
                }
                continue;
            }
            match wire::next_frame(rest, self.frame_max) {
                Next::Incomplete => break,
                Next::Frame(frame, n) => {
                    if self.blocks(&frame) {
                        break;
                    }
                    used += n;
                    self.handle_frame(frame);
                    if self.out.len() >= OUTPUT_PER_FEED {
                        break;
                    }
                }
                Next::Header(header, n) => {
                    used += n;
                    if self.content_header(header).is_err() {
                        self.abort(Fault::connection(code::FRAME_ERROR, "malformed frame"));
                        used = input.len();
                    }
                }
                Next::Body(channel, body, n) => {
                    used += n;
                    self.content_body(channel, body);
                }
                Next::TooLarge(n) => {
                    let text = format!("frame of {n} bytes is over frame_max {}", self.frame_max);
                    self.abort(Fault::connection(code::FRAME_ERROR, text));
                    used = input.len();
                }
                Next::Malformed => {
                    self.abort(Fault::connection(code::FRAME_ERROR, "malformed frame"));
                    used = input.len();
                }
            }
        }
        self.flush_pending();
        used
    }

    /// Whether `frame`, a `basic.publish` met while the memory alarm is raised, blocks the
    /// connection: it is left untaken, and the client told (`connection.blocked`) if it
    /// asked to be.
    fn blocks(&mut self, frame: &AMQPFrame) -> bool {
        let publish = matches!(
            frame,
            AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::Publish(_)))
        );
        if !publish || !self.settings.memory_alarm.raised() || self.phase != Phase::Open {
            return false;
        }
        if !self.blocked && self.hears_blocked {
            let blocked = connection::Blocked {
                reason: "low on memory".into(),
            };
            self.send(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Blocked(blocked)),
            );
        }
        self.blocked = true;
        true
    }

    /// A receiver that sees each change of the server's memory alarm.
    pub fn memory_alarm(&self) -> tokio::sync::watch::Receiver<bool> {
        self.settings.memory_alarm.subscribe()
    }

    /// Whether the connection is blocked by the memory alarm: it takes no input (see
    /// [`Connection::unblock`]).
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Ends the block once the memory alarm has cleared, telling the client
    /// (`connection.unblocked`) if it asked to be; the input left untaken is to be fed
    /// again.
    pub fn unblock(&mut self) {
        if !self.blocked || self.settings.memory_alarm.raised() {
            return;
        }
        self.blocked = false;
        if self.hears_blocked && !matches!(self.phase, Phase::Closed) {
            let unblocked = connection::AMQPMethod::Unblocked(connection::Unblocked {});
            self.send(0, AMQPClass::Connection(unblocked));
        }
    }

    /// Moves the bytes waiting for the socket onto the end of `to`.
    pub fn take_output(&mut self, to: &mut Vec<u8>) {
        self.flush_auto_acks();
        self.out.drain_into(to);
    }

    /// Acks what was delivered to `no_ack` consumers since the last time.
    fn flush_auto_acks(&mut self) {
        for (queue, settles) in self.auto_acks.drain(..) {
            // A `false` is a lease that ran out meanwhile: counted stale by the broker.
            // Waited for, though no answer is needed: while the connection waits, the
            // shard gathers the next deliveries into one batch; without the wait the
            // connection comes back for them a few at a time, at more CPU per message.
            // Not on a durable queue, whose answer waits for an fsync.
            if queue.is_durable() {
                queue.settle_batch_nowait(&settles);
            } else {
                queue.settle_batch(&settles);
            }
        }
    }

    /// Open channels.
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// Bytes waiting for the socket.
    pub fn output_len(&self) -> usize {
        self.out.len()
    }

    /// Whether the connection still reads frames (it does until it is closed).
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Whether the handshake is done (`connection.open` answered) and the connection not
    /// closing.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Whether the connection sent `connection.close` and waits for the answer.
    pub fn is_closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// The reply code and text of the `connection.close` the server sent for a
    /// connection error, if it sent one (for the driver's log).
    pub fn closed_with(&self) -> Option<(u16, &str)> {
        (self.closed_with.as_ref()).map(|(code, text)| (*code, text.as_str()))
    }

    /// The number the server gave this connection (in consumer names and logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The server's metrics, which this connection's driver updates.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.settings.metrics.clone()
    }

    /// Tells when the server shuts down (see [`Settings::shutdown`]).
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.settings.shutdown.subscribe()
    }

    /// The server is shutting down: `connection.close` 320, and every unacked delivery
    /// goes back to its queue. The driver then waits a moment for `close-ok`.
    pub fn force_close(&mut self) {
        self.timers.force();
        if matches!(self.phase, Phase::Closing | Phase::Closed) {
            return;
        }
        if self.phase != Phase::Open {
            self.phase = Phase::Closed;
            return;
        }
        self.fail(Fault::connection(
            code::CONNECTION_FORCED,
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
        ));
    }

    /// Whether handling `input` may wait for the disk: the broker has durable queues, and
    /// `input` holds a method that waits for an fsync (a `basic.nack` or `basic.reject`, a
    /// queue's declaration or deletion). Publishes and acks do not: their puts and settles
    /// are not waited for.
    pub fn may_wait_for_disk(&self, input: &[u8]) -> bool {
        self.settings.durable
            && (self.phase != Phase::Open || !wire::only_publishes_and_acks(input))
    }

    /// The heartbeat interval the client asked for in `tune-ok` (zero: none).
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(u64::from(self.heartbeat))
    }

    /// Appends a heartbeat frame (the driver sends one when the socket was quiet).
    pub fn send_heartbeat(&mut self) {
        if self.phase == Phase::Open {
            let _ = self.out.frame(&AMQPFrame::Heartbeat);
        }
    }

    /// The next delivery of any consumer of this connection, or `Pending` (with the waker
    /// registered with every consumer). Consumers are looked at in turn from where the last
    /// look stopped.
    pub fn poll_delivery(&mut self, cx: &mut Context<'_>) -> Poll<(usize, Option<Delivery>)> {
        let n = self.subscriptions.len();
        for step in 0..n {
            let i = (self.rotor + step) % n;
            let sub = &mut self.subscriptions[i];
            if let Some(waiting) = &sub.waiting {
                if !waiting.turn.has_come(cx) {
                    continue;
                }
                // Its turn: it consumes from now on; a queue gone meanwhile ends it as a
                // deleted queue ends any consumer. On a durable queue the consume waits
                // for the deliveries it starts to be on disk: off the worker's other tasks
                // then, as a read with such a call is (`serve.rs`).
                let consume = || {
                    let config = waiting.config.clone();
                    (sub.queue).consume_with_priority(&waiting.name, config, waiting.priority)
                };
                let consumed = if sub.queue.is_durable() && may_block_in_place() {
                    tokio::task::block_in_place(consume)
                } else {
                    consume()
                };
                match consumed {
                    Ok(consumer) => {
                        sub.consumer = Some(consumer);
                        sub.waiting = None;
                    }
                    Err(_) => {
                        self.rotor = (i + 1) % n;
                        return Poll::Ready((i, None));
                    }
                }
            }
            // A paused or full channel is looked at again after the next input, which is
            // what can change that.
            if !self.may_deliver(i) {
                continue;
            }
            let Some(consumer) = self.subscriptions[i].consumer.as_mut() else {
                continue;
            };
            if let Poll::Ready(d) = pin!(consumer.next()).poll(cx) {
                self.rotor = (i + 1) % n;
                return Poll::Ready((i, d));
            }
        }
        Poll::Pending
    }

    /// A delivery that is already waiting, without blocking; `None` if none is.
    pub fn try_delivery(&mut self) -> Option<(usize, Option<Delivery>)> {
        let waker = std::task::Waker::noop();
        match self.poll_delivery(&mut Context::from_waker(waker)) {
            Poll::Ready(found) => Some(found),
            Poll::Pending => None,
        }
    }

    /// Sends a delivery that [`poll_delivery`](Connection::poll_delivery) or
    /// [`try_delivery`](Connection::try_delivery) returned for consumer `index` as a
    /// `basic.deliver` (a `None` there means that consumer's queue closed).
    pub fn handle_delivery(&mut self, index: usize, delivery: Option<Delivery>) {
        match delivery {
            Some(delivery) => self.deliver(index, delivery),
            None => {
                // The queue was deleted under the consumer: nothing more will come, and the
                // client hears so as from RabbitMQ (`consumer_cancel_notify`).
                let sub = self.subscriptions.swap_remove(index);
                let open = self.channels.get(&sub.channel).is_some_and(|s| !s.closing);
                if open {
                    let cancel = basic::Cancel {
                        consumer_tag: sub.tag.clone(),
                        nowait: true,
                    };
                    self.forget_consumer_tag(sub.channel, &sub.tag);
                    self.send(
                        sub.channel,
                        AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel)),
                    );
                }
            }
        }
    }

    fn send(&mut self, channel: u16, method: AMQPClass) {
        if self.out.method(channel, method).is_err() {
            self.abort(Fault::connection(
                code::INTERNAL_ERROR,
                "could not write a frame",
            ));
        }
    }

    fn send_start(&mut self) {
        let mut capabilities = FieldTable::default();
        for name in [
            "basic.nack",
            "per_consumer_qos",
            "authentication_failure_close",
            "publisher_confirms",
            "consumer_cancel_notify",
            "direct_reply_to",
            "exchange_exchange_bindings",
            "connection.blocked",
        ] {
            capabilities.insert(name.into(), AMQPValue::Boolean(true));
        }
        let mut properties = FieldTable::default();
        properties.insert("product".into(), AMQPValue::LongString("leasemqd".into()));
        let version = env!("CARGO_PKG_VERSION");
        properties.insert("version".into(), AMQPValue::LongString(version.into()));
        properties.insert("platform".into(), AMQPValue::LongString("Rust".into()));
        properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
        let start = connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: properties,
            mechanisms: "PLAIN".into(),
            locales: "en_US".into(),
        };
        self.phase = Phase::AwaitStartOk;
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Start(start)),
        );
    }

    /// A content header: on a channel of an open connection, the next part of a publish
    /// (its properties checked, and parsed only if they differ from the last ones); else
    /// handled as any other frame. `Err` for properties that do not parse.
    fn content_header(&mut self, header: wire::Header<'_>) -> Result<(), ()> {
        if self.phase != Phase::Open || header.channel == 0 {
            self.handle_frame(header.to_frame().ok_or(())?);
            return Ok(());
        }
        let properties = self.seen.input.check(header.properties).ok_or(())?;
        let id = properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        let mut refused = refused_properties(properties, &self.settings.user);
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
                refuse(publish::PROPERTIES_NOT_STORED.into());
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
    fn content_body(&mut self, channel: u16, body: &[u8]) {
        if self.phase != Phase::Open || channel == 0 {
            self.handle_frame(AMQPFrame::Body(channel, body.to_vec()));
        } else if let Err(fault) = self.handle_body(channel, body) {
            self.fail(fault);
        }
    }

    fn handle_frame(&mut self, frame: AMQPFrame) {
        match self.phase {
            Phase::AwaitHeader | Phase::Closed => {}
            Phase::Closing => self.handle_while_closing(frame),
            Phase::AwaitStartOk | Phase::AwaitTuneOk | Phase::AwaitOpen => {
                if let Err(fault) = self.handle_handshake(frame) {
                    self.fail(fault);
                }
            }
            Phase::Open => {
                if let Err(fault) = self.handle_open(frame) {
                    self.fail(fault);
                }
            }
        }
    }

    /// After our `connection.close`, only the peer's `close-ok` (or its own `close`) counts.
    fn handle_while_closing(&mut self, frame: AMQPFrame) {
        match frame {
            AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::CloseOk(_))) => {
                self.phase = Phase::Closed;
            }
            AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Close(_))) => {
                let ok = connection::AMQPMethod::CloseOk(connection::CloseOk {});
                self.send(0, AMQPClass::Connection(ok));
                self.phase = Phase::Closed;
            }
            _ => {}
        }
    }

    fn handle_handshake(&mut self, frame: AMQPFrame) -> Result<(), Fault> {
        use connection::AMQPMethod as M;
        let method = match frame {
            AMQPFrame::Method(0, AMQPClass::Connection(method)) => method,
            AMQPFrame::Heartbeat => return Ok(()),
            other => {
                let text = format!("unexpected {} during the handshake", frame_kind(&other));
                return Err(Fault::connection(code::UNEXPECTED_FRAME, text));
            }
        };
        match (self.phase, method) {
            (Phase::AwaitStartOk, M::StartOk(start_ok)) => self.handle_start_ok(start_ok),
            (Phase::AwaitTuneOk, M::TuneOk(tune_ok)) => self.handle_tune_ok(tune_ok),
            (Phase::AwaitOpen, M::Open(open)) => {
                if open.virtual_host.as_str() != "/" {
                    let text = format!(
                        "vhost '{}' not found: leasemqd has only '/'",
                        open.virtual_host
                    );
                    return Err(Fault::connection(code::NOT_ALLOWED, text)
                        .for_method(&AMQPClass::Connection(M::Open(open))));
                }
                self.phase = Phase::Open;
                self.send(0, AMQPClass::Connection(M::OpenOk(connection::OpenOk {})));
                Ok(())
            }
            (_, M::Close(_)) => {
                self.send(0, AMQPClass::Connection(M::CloseOk(connection::CloseOk {})));
                self.phase = Phase::Closed;
                Ok(())
            }
            (_, other) => {
                let m = AMQPClass::Connection(other);
                let text = format!("unexpected {} during the handshake", method_name(&m));
                Err(Fault::connection(code::COMMAND_INVALID, text).for_method(&m))
            }
        }
    }

    fn handle_start_ok(&mut self, start_ok: connection::StartOk) -> Result<(), Fault> {
        let m = AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok.clone()));
        if start_ok.mechanism.as_str() != "PLAIN" {
            let text = format!(
                "unsupported auth mechanism {}: only PLAIN",
                start_ok.mechanism
            );
            return Err(Fault::connection(code::ACCESS_REFUSED, text).for_method(&m));
        }
        // PLAIN (RFC 4616): [authzid] NUL authcid NUL passwd.
        let mut parts = start_ok.response.as_bytes().split(|&b| b == 0);
        let (_, user, password) = (parts.next(), parts.next(), parts.next());
        let settings = &self.settings;
        let valid = user == Some(settings.user.as_bytes())
            && password == Some(settings.password.as_bytes())
            && parts.next().is_none();
        if !valid {
            let text = "ACCESS_REFUSED - login refused: wrong user name or password";
            return Err(Fault::connection(code::ACCESS_REFUSED, text).for_method(&m));
        }
        if settings.loopback_only && !self.peer_is_loopback {
            let text = format!("user '{}' can only connect from localhost", settings.user);
            return Err(Fault::connection(code::ACCESS_REFUSED, text).for_method(&m));
        }
        // RabbitMQ's blocked connection notifications, for a client that asks for them.
        let capabilities = start_ok.client_properties.inner().get("capabilities");
        self.hears_blocked = matches!(capabilities, Some(AMQPValue::FieldTable(c))
            if matches!(c.inner().get("connection.blocked"), Some(AMQPValue::Boolean(true))));
        let tune = connection::Tune {
            channel_max: settings.channel_max,
            frame_max: settings.frame_max,
            heartbeat: settings.heartbeat,
        };
        self.phase = Phase::AwaitTuneOk;
        self.send(0, AMQPClass::Connection(connection::AMQPMethod::Tune(tune)));
        Ok(())
    }

    fn handle_tune_ok(&mut self, tune_ok: connection::TuneOk) -> Result<(), Fault> {
        let ours = self.settings.frame_max;
        let frame_max = if tune_ok.frame_max == 0 {
            ours
        } else {
            tune_ok.frame_max
        };
        if frame_max > ours || frame_max < FRAME_MIN_SIZE {
            let m = AMQPClass::Connection(connection::AMQPMethod::TuneOk(tune_ok));
            let text = format!("frame_max {frame_max} is outside {FRAME_MIN_SIZE}..={ours}");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m));
        }
        self.frame_max = frame_max as usize;
        let channel_max = self.settings.channel_max;
        self.channel_max = match tune_ok.channel_max {
            0 => channel_max,
            n => n.min(channel_max),
        };
        self.heartbeat = tune_ok.heartbeat;
        self.phase = Phase::AwaitOpen;
        Ok(())
    }

    fn handle_open(&mut self, frame: AMQPFrame) -> Result<(), Fault> {
        match frame {
            AMQPFrame::Heartbeat => Ok(()),
            AMQPFrame::Method(0, AMQPClass::Connection(method)) => {
                self.handle_connection_method(method)
            }
            AMQPFrame::Method(channel, method) if channel != 0 => {
                self.handle_channel_method(channel, method)
            }
            // A channel's method on channel 0, which only carries the connection's: as
            // RabbitMQ, a channel error that closes the connection.
            AMQPFrame::Method(0, method) => {
                let text = format!("CHANNEL_ERROR - {} on channel 0", method_name(&method));
                Err(Fault::connection(code::CHANNEL_ERROR, text).for_method(&method))
            }
            other => {
                let text = format!(
                    "unexpected {} on channel {}",
                    frame_kind(&other),
                    other.channel_id()
                );
                Err(Fault::connection(code::UNEXPECTED_FRAME, text))
            }
        }
    }

    fn handle_connection_method(&mut self, method: connection::AMQPMethod) -> Result<(), Fault> {
        use connection::AMQPMethod as M;
        match method {
            M::Close(_) => {
                self.flush_pending();
                self.end_subscriptions(None);
                // Stopped consumers return what they still hold as the channels go.
                self.channels.clear();
                self.drop_exclusive_queues();
                self.send(0, AMQPClass::Connection(M::CloseOk(connection::CloseOk {})));
                self.phase = Phase::Closed;
                Ok(())
            }
            other => {
                let m = AMQPClass::Connection(other);
                let text = format!("{} is not supported by leasemqd", method_name(&m));
                Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m))
            }
        }
    }

    /// Answers a fault: a channel error closes the channel, a connection error the
    /// connection (RabbitMQ's soft and hard errors).
    fn fail(&mut self, fault: Fault) {
        // What came before the fault happened before it: the settles among it must reach
        // the broker before the consumers end and their leases come back.
        self.apply_pending();
        match fault.channel {
            Some(channel) => self.close_channel_with(channel, fault),
            None => {
                self.end_subscriptions(None);
                self.channels.clear();
                self.drop_exclusive_queues();
                let text = reply_text(fault.code, fault.text);
                self.closed_with = Some((fault.code, text.to_string()));
                let close = connection::Close {
                    reply_code: fault.code,
                    reply_text: text,
                    class_id: fault.class_id,
                    method_id: fault.method_id,
                };
                self.phase = Phase::Closing;
                self.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::Close(close)),
                );
            }
        }
    }

    /// A connection error after which the input cannot be trusted (framing is lost):
    /// `connection.close`, and nothing more is read.
    fn abort(&mut self, fault: Fault) {
        if self.phase != Phase::Closing && self.phase != Phase::Closed {
            self.fail(fault);
        }
        self.phase = Phase::Closed;
    }

    /// Cancels the broker consumers of `channel` (all of them for `None`): the deliveries
    /// they received and did not settle come back to the queue, redelivered; those still
    /// unread are released.
    fn end_subscriptions(&mut self, channel: Option<u16>) {
        let mut i = 0;
        let mut queues = Vec::new();
        while i < self.subscriptions.len() {
            if channel.is_none_or(|c| self.subscriptions[i].channel == c) {
                let sub = self.subscriptions.swap_remove(i);
                if let Some(consumer) = sub.consumer {
                    consumer.cancel();
                }
                queues.push(sub.queue);
            } else {
                i += 1;
            }
        }
        for queue in queues {
            self.auto_delete(&queue);
        }
    }

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
    fn drop_exclusive_queues(&mut self) {
        for queue in std::mem::take(&mut self.exclusive) {
            self.delete_queue(&queue);
        }
    }

    /// Closes `queue` and forgets it: its bindings, this connection's handle, and its
    /// exclusive owner when that is this connection.
    fn delete_queue(&mut self, queue: &Queue) {
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
    fn locked_by_another(&self, name: &str) -> bool {
        self.vhost.locked_by_another(name, self.id)
    }

    /// The queue called `name`, from the cache or the broker; never a holding queue of
    /// dead letters, which are the server's.
    fn queue(&mut self, name: &str) -> Option<Queue> {
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

impl Drop for Connection {
    /// A connection that ends without a clean close (the socket dropped) returns every
    /// unacked delivery too, as the consumers it drops are cancelled.
    fn drop(&mut self) {
        self.end_subscriptions(None);
        // Stopped consumers return what they still hold as the channels drop them.
        self.channels.clear();
        self.drop_exclusive_queues();
    }
}

/// Why a publish with these properties is refused (a 406 on its channel, as RabbitMQ's),
/// if it is: a `user-id` other than the connection's user, which RabbitMQ checks so that
/// a consumer may trust it.
///
/// `expiration` is kept and delivered back, but a message does not expire by it: refusing
/// it would fail a publish that works against RabbitMQ, where keeping the message longer
/// only delivers what RabbitMQ might have dropped (ARCHITECTURE, "AMQP and leases").
fn refused_properties(properties: &BasicProperties, user: &str) -> Option<String> {
    let claimed = properties.user_id().as_ref()?;
    (claimed.as_str() != user).then(|| {
        format!(
            "PRECONDITION_FAILED - user_id property set to '{claimed}' but authenticated user was '{user}'"
        )
    })
}

/// What kind of frame, for error texts.
fn frame_kind(frame: &AMQPFrame) -> String {
    match frame {
        AMQPFrame::ProtocolHeader(_) => "protocol header".into(),
        AMQPFrame::Method(_, m) => method_name(m),
        AMQPFrame::Header(..) => "content header".into(),
        AMQPFrame::Body(..) => "content body".into(),
        AMQPFrame::Heartbeat | AMQPFrame::InvalidHeartbeat(_) => "heartbeat".into(),
    }
}

#[cfg(test)]
mod tests;
