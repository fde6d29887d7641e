//! The state machine driven frame by frame: frames made with `amq-protocol`'s generator go
//! in, the bytes that come out are parsed back into frames and checked. The broker runs
//! under the manual clock, so a lease runs out only when a test advances it.
//!
//! This file is the harness (a [`Client`] and the helpers that build and read frames); the
//! tests are in one file per topic.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::frame::{
    gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, ProtocolVersion, WriteContext,
};
use amq_protocol::protocol::{
    basic, channel, connection, exchange, queue, AMQPClass, BasicProperties,
};
use amq_protocol::types::{AMQPValue, FieldTable};
use leasemq::{Broker, ConsumerConfig};

use super::{Connection, Settings};
use crate::alarms::{Alarms, Resource};
use crate::clock::LeaseClock;
use crate::vhost::{VHost, VHosts};
use frames::*;

mod access;
mod consume;
mod declare;
mod durable;
mod exchanges;
mod frames;
mod handshake;
mod limits;
mod publish;
mod reply_to;
mod settle;
mod timers;
mod ttl;
mod tx;
mod vhosts;

/// A connection under test, with the broker behind it.
struct Client {
    broker: Broker,
    conn: Connection,
}

impl Client {
    fn new(settings: Settings) -> Client {
        let broker = Broker::builder().shards(1).manual_clock().build().unwrap();
        Client::on(broker, settings)
    }

    /// A connection to `broker` that waits for the protocol header.
    fn on(broker: Broker, settings: Settings) -> Client {
        let vhost = Arc::new(VHost::new(&settings));
        let vhosts = VHosts::one(vhost);
        let conn = Connection::new(broker.clone(), Arc::new(settings), vhosts, 1, true);
        Client { broker, conn }
    }

    /// Feeds raw bytes, then lets every waiting delivery out; returns what was written.
    /// A call the connection awaits (a durable queue's nack or purge) holds the frames
    /// after it: once it is answered, they are fed again.
    fn feed_bytes(&mut self, bytes: &[u8]) -> Vec<AMQPFrame> {
        let mut used = self.conn.handle_input(bytes);
        while self.conn.awaits_call() && !self.conn.is_closed() {
            self.answered();
            used += self.conn.handle_input(&bytes[used..]);
        }
        if !self.conn.is_closed() {
            assert_eq!(used, bytes.len(), "whole frames are used whole");
        }
        // Acks are not waited for (`settle_batch_nowait`): a call to every shard lets what
        // they free reach the consumers first, as it would reach a server's connection
        // task while it waits for its next read.
        self.broker.advance(Duration::ZERO).unwrap();
        // So are the puts of confirming channels: their answers are in by now.
        self.conn.try_answers();
        while let Some((i, d)) = self.conn.try_delivery() {
            self.conn.handle_delivery(i, d);
        }
        let mut out = Vec::new();
        self.conn.take_output(&mut out);
        decode(&out)
    }

    /// Waits for the answers the connection awaits, and takes them.
    fn answered(&mut self) {
        let conn = &mut self.conn;
        futures_lite::future::block_on(std::future::poll_fn(|cx| conn.poll_answers(cx)));
    }

    fn feed(&mut self, frames: &[AMQPFrame]) -> Vec<AMQPFrame> {
        self.feed_bytes(&encode(frames))
    }

    /// A connection through the handshake (frame_max 8192), with channel 1 open.
    fn open() -> Client {
        Client::open_with(Settings::default())
    }

    /// As [`Client::open`], with `settings` (leases of 10 s).
    fn open_with(settings: Settings) -> Client {
        Client::handshake(Client::new(Settings {
            ack_timeout: Duration::from_secs(10),
            ..settings
        }))
    }

    /// As [`Client::open`], on a broker with a data dir in `dir`: a durable queue's log
    /// waits for the disk.
    fn open_durable(dir: &std::path::Path) -> Client {
        let broker = (Broker::builder().shards(1).manual_clock())
            .data_dir(dir)
            .build()
            .unwrap();
        let settings = Settings {
            durable: true,
            ack_timeout: Duration::from_secs(10),
            ..Settings::default()
        };
        Client::handshake(Client::on(broker, settings))
    }

    /// Takes `c` through the handshake (frame_max 8192), and opens channel 1.
    fn handshake(mut c: Client) -> Client {
        let header = AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1());
        let out = c.feed(&[header]);
        assert!(matches!(
            out[..],
            [AMQPFrame::Method(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Start(_))
            )]
        ));
        let out = c.feed(&[start_ok("guest", "guest")]);
        let [AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Tune(tune)))] =
            &out[..]
        else {
            panic!("expected connection.tune, got {out:?}");
        };
        assert_eq!(
            (tune.frame_max, tune.channel_max, tune.heartbeat),
            (131_072, 2047, 60)
        );
        let out = c.feed(&open_frames());
        assert_eq!(
            out,
            [
                conn_method(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
                method(
                    1,
                    AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {}))
                ),
            ]
        );
        c
    }

    fn declare(&mut self, name: &str) {
        let declare = queue::Declare {
            queue: name.into(),
            durable: true,
            ..queue::Declare::default()
        };
        let out = self.feed(&[method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::Declare(declare)),
        )]);
        let ok = queue::DeclareOk {
            queue: name.into(),
            message_count: 0,
            consumer_count: 0,
        };
        assert_eq!(
            out,
            [method(
                1,
                AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))
            )]
        );
    }

    /// basic.publish + content header + the body in one body frame.
    fn publish_frames(queue: &str, properties: BasicProperties, body: &[u8]) -> Vec<AMQPFrame> {
        let publish = basic::Publish {
            exchange: "".into(),
            routing_key: queue.into(),
            mandatory: false,
            immediate: false,
        };
        let header = AMQPContentHeader {
            class_id: 60,
            body_size: body.len() as u64,
            properties,
        };
        let mut frames = vec![
            basic_method(1, basic::AMQPMethod::Publish(publish)),
            AMQPFrame::Header(1, header),
        ];
        if !body.is_empty() {
            frames.push(AMQPFrame::Body(1, body.to_vec()));
        }
        frames
    }

    fn consume(&mut self, queue: &str, no_ack: bool) -> Vec<AMQPFrame> {
        let consume = basic::Consume {
            queue: queue.into(),
            consumer_tag: "".into(),
            no_ack,
            ..basic::Consume::default()
        };
        self.feed(&[basic_method(1, basic::AMQPMethod::Consume(consume))])
    }

    /// `basic.consume` with `exclusive`.
    fn consume_exclusive(&mut self, queue: &str) -> Vec<AMQPFrame> {
        let consume = basic::Consume {
            queue: queue.into(),
            exclusive: true,
            ..basic::Consume::default()
        };
        self.feed(&[basic_method(1, basic::AMQPMethod::Consume(consume))])
    }

    /// Another connection to the same server (broker, settings and vhost), numbered `id`, with
    /// channel 1 open.
    fn another(&self, id: u64) -> Client {
        let (settings, vhosts) = (self.conn.settings.clone(), self.conn.vhosts.clone());
        let mut other = Client {
            broker: self.broker.clone(),
            conn: Connection::new(self.broker.clone(), settings, vhosts, id, true),
        };
        let header = AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1());
        other.feed(&[header]);
        other.feed(&[start_ok("guest", "guest")]);
        other.feed(&open_frames());
        other
    }

    /// After a channel error on channel 1: its `close-ok`, and the channel opened again.
    fn reopen(&mut self) {
        self.feed(&[method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        )]);
        self.feed(&[method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )]);
    }

    fn publish(&mut self, queue: &str, body: &[u8]) {
        self.feed(&Client::publish_frames(
            queue,
            BasicProperties::default(),
            body,
        ));
    }

    fn prefetch(&mut self, n: u16) {
        let qos = basic::Qos {
            prefetch_count: n,
            global: false,
        };
        self.feed(&[basic_method(1, basic::AMQPMethod::Qos(qos))]);
    }

    fn stats(&self, queue: &str) -> leasemq::QueueStats {
        self.broker.queue(queue).unwrap().stats()
    }

    /// Declares `name` with `x-max-length` `max` and `x-overflow` `reject-publish`.
    fn declare_rejecting_over(&mut self, name: &str, max: i32) {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(max));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let declare = queue::Declare {
            queue: name.into(),
            arguments,
            ..queue::Declare::default()
        };
        self.feed(&[queue_method(queue::AMQPMethod::Declare(declare))]);
    }

    /// The frames of one publish of each body to `queue`, in order.
    fn publish_run(queue: &str, bodies: &[&[u8]]) -> Vec<AMQPFrame> {
        bodies
            .iter()
            .flat_map(|body| Client::publish_frames(queue, BasicProperties::default(), body))
            .collect()
    }

    /// A client whose server's clock is moved by hand, from 1 000 000 ms.
    fn with_clock() -> (Client, Arc<std::sync::atomic::AtomicU64>) {
        let (clock, now) = crate::WallClock::manual(1_000_000);
        let c = Client::open_with(Settings {
            clock,
            ..Settings::default()
        });
        (c, now)
    }

    /// Declares `queue` dead-lettering through `amq.fanout`; the name of its holding queue.
    fn declare_dead_lettering(&mut self, queue: &str) -> String {
        let fanout = AMQPValue::LongString("amq.fanout".into());
        self.declare_with(queue, &[("x-dead-letter-exchange", fanout)]);
        crate::dead_letter::holding_name(queue)
    }

    /// [`Client::with_clock`], with queue `queue` declared with an `x-message-ttl` of
    /// `ttl_ms`.
    fn with_ttl_queue(queue: &str, ttl_ms: i32) -> (Client, Arc<std::sync::atomic::AtomicU64>) {
        let (mut c, now) = Client::with_clock();
        let mut arguments = FieldTable::default();
        arguments.insert("x-message-ttl".into(), AMQPValue::LongInt(ttl_ms));
        let declare = queue::Declare {
            queue: queue.into(),
            arguments,
            ..queue::Declare::default()
        };
        c.feed(&[queue_method(queue::AMQPMethod::Declare(declare))]);
        (c, now)
    }

    /// Declares `queue` with `arguments`.
    fn declare_with(&mut self, queue: &str, arguments: &[(&str, AMQPValue)]) -> Vec<AMQPFrame> {
        let declare = queue::Declare {
            queue: queue.into(),
            arguments: table(arguments),
            ..queue::Declare::default()
        };
        self.feed(&[queue_method(queue::AMQPMethod::Declare(declare))])
    }

    /// Does what the server's message-expiry task does at `now` (`VHost::expire_messages`),
    /// with the server's clock set to `now`: dead-letters the deliveries handed over, and
    /// looks at the heads of the queues due. Returns the names looked at, and the next
    /// deadline.
    fn expire_at(
        &mut self,
        now: u64,
        clock: &std::sync::atomic::AtomicU64,
    ) -> (Vec<String>, Option<u64>) {
        clock.store(now, Ordering::Relaxed);
        let vhost = self.conn.vhost.clone();
        let expiry = &vhost.message_expiry;
        let (due, _) = expiry.due(now);
        for (queue, delivery) in due.handed {
            assert!(vhost.expire(&self.broker, &queue, &delivery));
        }
        let mut looked = Vec::new();
        for look in due.queues {
            let looking = expiry.begin_look(&look.queue);
            let next = vhost.look_at_head(&self.broker, &look);
            drop(looking);
            expiry.looked(&look.queue, next);
            looked.push(look.queue.name().to_string());
        }
        (looked, expiry.due(now).1)
    }

    /// `basic.consume` on channel 1 with `arguments`; the frames it answered.
    fn consume_with(&mut self, queue: &str, arguments: &[(&str, AMQPValue)]) -> Vec<AMQPFrame> {
        let consume = basic::Consume {
            queue: queue.into(),
            arguments: table(arguments),
            ..basic::Consume::default()
        };
        self.feed(&[basic_method(1, basic::AMQPMethod::Consume(consume))])
    }
}

/// An open connection (leases of 10 s) whose lease clock the returned cell moves.
fn on_a_lease_clock() -> (Client, Arc<std::sync::atomic::AtomicU64>) {
    let (lease_clock, now) = LeaseClock::manual();
    let c = Client::open_with(Settings {
        lease_clock,
        ..Settings::default()
    });
    (c, now)
}

/// A connection through the handshake with channel 1 open, whose client announced the
/// `connection.blocked` capability, on a server whose alarms are `alarms`.
fn hearing_blocked(alarms: &Arc<Alarms>) -> Client {
    let mut c = Client::new(Settings {
        alarms: Arc::clone(alarms),
        ..Settings::default()
    });
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let mut capabilities = FieldTable::default();
    capabilities.insert("connection.blocked".into(), AMQPValue::Boolean(true));
    let mut client_properties = FieldTable::default();
    client_properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
    let start_ok = connection::StartOk {
        client_properties,
        mechanism: "PLAIN".into(),
        response: "\0guest\0guest".into(),
        locale: "en_US".into(),
    };
    c.feed(&[conn_method(connection::AMQPMethod::StartOk(start_ok))]);
    c.feed(&open_frames());
    c
}

/// The reply code of `declare` on channel 1 (0 for declare-ok), the channel reopened
/// after a channel error.
fn declare_code(c: &mut Client, declare: queue::Declare) -> u16 {
    let out = c.feed(&[method(
        1,
        AMQPClass::Queue(queue::AMQPMethod::Declare(declare)),
    )]);
    match channel_close_code(&out).or(connection_close_code(&out)) {
        Some(code) => {
            c.reopen();
            code
        }
        None => 0,
    }
}

/// What the server's `x-expires` task does at `at`: deletes each queue due then.
fn run_expiry(vhost: &VHost, at: std::time::Instant) {
    let (expired, _) = vhost
        .expiring
        .expire(at, |name| vhost.consumers.is_consumed(name));
    for queue in &expired {
        if vhost.expiring.still_due(queue) {
            vhost.forget_queue(queue);
        }
    }
}
