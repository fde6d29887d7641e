//! One AMQP 0-9-1 connection as a state machine: bytes in, broker calls and frames out.
//!
//! [`Connection`] does no IO. The driver (`serve.rs`) feeds it what the socket read
//! ([`Connection::handle_input`]), hands it each delivery a consumer of it received
//! ([`Connection::handle_delivery`], after [`Connection::poll_delivery`] or
//! [`Connection::try_delivery`]), and writes out what it produced
//! ([`Connection::take_output`]), and hands it the answers to the puts it awaits
//! ([`Connection::poll_answers`]). Its broker calls are blocking ones (a round trip to a
//! shard thread, which never waits on a connection), ones not waited for (acks, and most
//! puts of publishes without confirms), puts whose answers it awaits while it reads on
//! (those of confirming channels and durable queues), and calls whose answers it awaits
//! before it serves its next frame (a durable queue's nacks, rejects and purges).
//!
//! The connection walks through the handshake (`handshake.rs`), then serves channels:
//! `dispatch.rs` sends each method to the room that serves it (`queues.rs`,
//! `consume.rs`, `publish.rs`, `tx.rs`, `reply_to.rs`), and each channel's own state is a
//! `Channel` (`channel.rs`). This file is the reader: framing, content assembly, the
//! output budget, the memory alarm and the channel table. A fault answers as RabbitMQ does: a channel error closes that channel
//! (`channel.close`, then everything on it but `close-ok` is dropped), a connection error
//! closes the connection (`connection.close`, then everything but `close-ok`). Frames the
//! peer cannot have meant (malformed, over `frame_max`) end it at once.

mod answers;
mod channel;
mod consume;
mod deliveries;
mod dispatch;
mod exchanges;
mod fault;
mod get;
mod handshake;
mod incoming;
mod login;
mod permitted;
mod publish;
mod queues;
mod reply_to;
mod subscription;
mod timers;
mod tx;
mod unserved;
mod view;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ahash::RandomState;
use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, connection, AMQPClass};
use leasemq::{Broker, DeliveryTag, Queue, Settle};

pub(crate) use crate::code;
use crate::content::PropertiesSeen;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::vhost::{VHost, VHosts};
use crate::wire::{self, Next, Output};
use answers::{Awaited, Barrier, Pending};
use channel::Channel;
pub use deliveries::ConsumerSlot;
use fault::{reply_text, Fault};
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

/// Whether `frame` is a method that must see the broker calls a read gathered before it
/// made first: any but those gathered (a publish, an ack, a nack, a reject).
fn sees_gathered(frame: &AMQPFrame) -> bool {
    matches!(frame, AMQPFrame::Method(_, method) if sees_gathered_method(method))
}

/// [`sees_gathered`] for a method.
fn sees_gathered_method(method: &AMQPClass) -> bool {
    !matches!(
        method,
        AMQPClass::Basic(
            basic::AMQPMethod::Publish(_)
                | basic::AMQPMethod::Ack(_)
                | basic::AMQPMethod::Nack(_)
                | basic::AMQPMethod::Reject(_)
        )
    )
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
    /// The virtual host its methods act on: queues, exchanges and what is kept of them
    /// (`/` until `connection.open` names one).
    vhost: Arc<VHost>,
    /// The server's virtual hosts, for `connection.open`.
    vhosts: Arc<VHosts>,
    id: u64,
    /// Who logged in, and what it may do in its virtual host.
    login: login::Login,
    phase: Phase,
    frame_max: usize,
    channel_max: u16,
    heartbeat: u16,
    /// Looked up for every frame: hashed with ahash, not SipHash (a client only ever
    /// collides with itself in these per-connection maps).
    channels: HashMap<u16, Channel, RandomState>,
    /// The channels that have consumers, in the order they are looked at for deliveries.
    consuming: Vec<u16>,
    /// Where the next look for a delivery in `consuming` starts, so that no channel
    /// starves the others.
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
    /// Calls awaited before the next frame is served, in the order made (`Barrier`).
    barriers: VecDeque<Barrier>,
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
    /// A connection that waits for the protocol header, to open one of `vhosts`. `id`
    /// names it in consumer names and logs; `peer_is_loopback` decides whether a
    /// loopback-only user may log in.
    pub fn new(
        broker: Broker,
        settings: Arc<Settings>,
        vhosts: Arc<VHosts>,
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
            vhost: vhosts.default_vhost(),
            vhosts,
            id,
            login: login::Login::new(peer_is_loopback),
            phase: Phase::AwaitHeader,
            frame_max,
            channel_max,
            heartbeat: 0,
            channels: HashMap::with_hasher(keyed_state(id)),
            consuming: Vec::new(),
            rotor: 0,
            next_consumer: 0,
            queues: HashMap::with_hasher(keyed_state(id)),
            sweep_queues_at: QUEUES_SWEPT_FROM,
            arrived: None,
            pending: Vec::new(),
            unanswered_puts: Vec::new(),
            awaited: VecDeque::new(),
            barriers: VecDeque::new(),
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
            if self.awaits_call() {
                // The next frame is served once the call before it is answered.
                break;
            }
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
                    if !self.pending.is_empty() && sees_gathered(&frame) {
                        // A method comes after the publishes and settles before it, which
                        // may have a call to await first.
                        self.flush_pending();
                        if self.awaits_call() {
                            break;
                        }
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

    /// Whether `frame`, a `basic.publish` met while a resource alarm is raised, blocks the
    /// connection: it is left untaken, and the client told (`connection.blocked`) if it
    /// asked to be.
    fn blocks(&mut self, frame: &AMQPFrame) -> bool {
        let publish = matches!(
            frame,
            AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::Publish(_)))
        );
        if !publish || !self.settings.alarms.raised() || self.phase != Phase::Open {
            return false;
        }
        if !self.blocked && self.hears_blocked {
            let blocked = connection::Blocked {
                reason: self.settings.alarms.reason().into(),
            };
            self.send(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Blocked(blocked)),
            );
        }
        self.blocked = true;
        true
    }

    /// Whether the connection is blocked by a resource alarm: it takes no input (see
    /// [`Connection::unblock`]).
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Ends the block once every resource alarm has cleared, telling the client
    /// (`connection.unblocked`) if it asked to be; the input left untaken is to be fed
    /// again.
    pub fn unblock(&mut self) {
        if !self.blocked || self.settings.alarms.raised() {
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

    /// What the connection was configured with, and the server-wide services it shares:
    /// its driver watches the memory alarm and the shutdown signal there.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The server is shutting down: `connection.close` 320, and every unacked delivery
    /// goes back to its queue. The driver then waits a moment for `close-ok`.
    pub fn force_close(&mut self) {
        self.timers.force();
        self.close_forced("broker forced connection closure with reason 'shutdown'");
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

    fn send(&mut self, channel: u16, method: AMQPClass) {
        if self.out.method(channel, method).is_err() {
            self.abort(Fault::connection(
                code::INTERNAL_ERROR,
                "could not write a frame",
            ));
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

#[cfg(test)]
mod tests;
