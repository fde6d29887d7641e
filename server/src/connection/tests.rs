//! The state machine driven frame by frame: frames made with `amq-protocol`'s generator go
//! in, the bytes that come out are parsed back into frames and checked. The broker runs
//! under the manual clock, so a lease runs out only when a test advances it.

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

use super::{Connection, LeaseClock, Settings};
use crate::memory::MemoryAlarm;

/// A connection under test, with the broker behind it.
struct Client {
    broker: Broker,
    conn: Connection,
}

fn encode(frames: &[AMQPFrame]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for frame in frames {
        bytes = gen_frame(frame)(WriteContext::from(bytes))
            .unwrap()
            .into_inner()
            .0;
    }
    bytes
}

fn decode(mut bytes: &[u8]) -> Vec<AMQPFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let (rest, frame) = parse_frame(bytes).expect("the server writes whole, valid frames");
        frames.push(frame);
        bytes = rest;
    }
    frames
}

fn method(channel: u16, m: AMQPClass) -> AMQPFrame {
    AMQPFrame::Method(channel, m)
}

fn conn_method(m: connection::AMQPMethod) -> AMQPFrame {
    method(0, AMQPClass::Connection(m))
}

fn basic_method(channel: u16, m: basic::AMQPMethod) -> AMQPFrame {
    method(channel, AMQPClass::Basic(m))
}

/// `tune-ok` (frame_max 8192, no heartbeat), `connection.open` and `channel.open` 1.
fn open_frames() -> [AMQPFrame; 3] {
    let tune_ok = conn_method(connection::AMQPMethod::TuneOk(connection::TuneOk {
        channel_max: 16,
        frame_max: 8192,
        heartbeat: 0,
    }));
    let open = conn_method(connection::AMQPMethod::Open(connection::Open {
        virtual_host: "/".into(),
    }));
    let channel_open = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    );
    [tune_ok, open, channel_open]
}

fn start_ok(user: &str, password: &str) -> AMQPFrame {
    conn_method(connection::AMQPMethod::StartOk(connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: "PLAIN".into(),
        response: format!("\0{user}\0{password}").into(),
        locale: "en_US".into(),
    }))
}

impl Client {
    fn new(settings: Settings) -> Client {
        let broker = Broker::builder().shards(1).manual_clock().build().unwrap();
        let conn = Connection::new(broker.clone(), Arc::new(settings), 1, true);
        Client { broker, conn }
    }

    /// Feeds raw bytes, then lets every waiting delivery out; returns what was written.
    fn feed_bytes(&mut self, bytes: &[u8]) -> Vec<AMQPFrame> {
        let used = self.conn.handle_input(bytes);
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

    fn feed(&mut self, frames: &[AMQPFrame]) -> Vec<AMQPFrame> {
        self.feed_bytes(&encode(frames))
    }

    /// A connection through the handshake (frame_max 8192), with channel 1 open.
    fn open() -> Client {
        Client::open_with(Settings::default())
    }

    /// As [`Client::open`], with `settings` (leases of 10 s).
    fn open_with(settings: Settings) -> Client {
        let mut c = Client::new(Settings {
            ack_timeout: Duration::from_secs(10),
            ..settings
        });
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

    /// Another connection to the same server (broker and settings), numbered `id`, with
    /// channel 1 open.
    fn another(&self, id: u64) -> Client {
        let settings = self.conn.settings.clone();
        let mut other = Client {
            broker: self.broker.clone(),
            conn: Connection::new(self.broker.clone(), settings, id, true),
        };
        let header = AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1());
        other.feed(&[header]);
        other.feed(&[start_ok("guest", "guest")]);
        other.feed(&open_frames());
        other
    }
}

/// The (delivery tag, redelivered, body) of each basic.deliver in `out`, with its content
/// put back together.
fn deliveries(out: &[AMQPFrame]) -> Vec<(u64, bool, Vec<u8>)> {
    let mut found: Vec<(u64, bool, Vec<u8>)> = Vec::new();
    for frame in out {
        match frame {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                found.push((d.delivery_tag, d.redelivered, Vec::new()));
            }
            AMQPFrame::Body(1, body) => found.last_mut().unwrap().2.extend_from_slice(body),
            _ => {}
        }
    }
    found
}

fn channel_close_code(out: &[AMQPFrame]) -> Option<u16> {
    channel_close(out).map(|(code, _)| code)
}

/// The reply code and text of the `channel.close` in `out`.
fn channel_close(out: &[AMQPFrame]) -> Option<(u16, String)> {
    out.iter().find_map(|f| match f {
        AMQPFrame::Method(_, AMQPClass::Channel(channel::AMQPMethod::Close(c))) => {
            Some((c.reply_code, c.reply_text.as_str().to_string()))
        }
        _ => None,
    })
}

fn connection_close_code(out: &[AMQPFrame]) -> Option<u16> {
    out.iter().find_map(|f| match f {
        AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Close(c))) => {
            Some(c.reply_code)
        }
        _ => None,
    })
}

fn ack(tag: u64, multiple: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag: tag,
            multiple,
        }),
    )
}

fn nack(tag: u64, requeue: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: tag,
            multiple: false,
            requeue,
        }),
    )
}

#[test]
fn a_wrong_password_is_refused_with_403() {
    let mut c = Client::new(Settings::default());
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let out = c.feed(&[start_ok("guest", "nope")]);
    assert_eq!(connection_close_code(&out), Some(403));
    let (code, text) = c.conn.closed_with().expect("kept for the log");
    assert_eq!(code, 403);
    assert!(text.starts_with("ACCESS_REFUSED"), "{text}");
    let out = c.feed(&[conn_method(connection::AMQPMethod::CloseOk(
        connection::CloseOk {},
    ))]);
    assert!(out.is_empty());
    assert!(c.conn.is_closed());
}

#[test]
fn guest_is_refused_from_a_remote_address() {
    let broker = Broker::builder().shards(1).manual_clock().build().unwrap();
    let conn = Connection::new(broker.clone(), Arc::new(Settings::default()), 1, false);
    let mut c = Client { broker, conn };
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let out = c.feed(&[start_ok("guest", "guest")]);
    assert_eq!(connection_close_code(&out), Some(403));
}

#[test]
fn another_protocol_header_is_answered_with_ours_and_closed() {
    let mut c = Client::new(Settings::default());
    let out = c.feed_bytes(b"AMQP\x01\x01\x00\x0a");
    assert_eq!(
        out,
        [AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]
    );
    assert!(c.conn.is_closed());
}

#[test]
fn a_header_split_across_reads_waits_for_the_rest() {
    let mut c = Client::new(Settings::default());
    assert_eq!(c.conn.handle_input(b"AMQ"), 0);
    let out = c.feed_bytes(b"AMQP\x00\x00\x09\x01");
    assert!(matches!(
        out[..],
        [AMQPFrame::Method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Start(_))
        )]
    ));
}

#[test]
fn a_publish_is_delivered_with_its_properties_and_its_body_split_per_frame_max() {
    let mut c = Client::open();
    c.declare("jobs");
    let mut headers = FieldTable::default();
    headers.insert("n".into(), AMQPValue::LongInt(7));
    let properties = BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_headers(headers);
    let body: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    // The client splits its body too: frames of at most 8192 bytes, overhead included.
    let mut frames = Client::publish_frames("jobs", properties.clone(), &[]);
    frames[1] = AMQPFrame::Header(
        1,
        AMQPContentHeader {
            class_id: 60,
            body_size: body.len() as u64,
            properties: properties.clone(),
        },
    );
    frames.extend(
        body.chunks(8184)
            .map(|piece| AMQPFrame::Body(1, piece.to_vec())),
    );
    assert!(c.feed(&frames).is_empty());
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 1);

    let out = c.consume("jobs", false);
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok))) = &out[0] else {
        panic!("expected basic.consume-ok first, got {out:?}");
    };
    assert!(ok.consumer_tag.as_str().starts_with("amq.ctag-"));
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver))) = &out[1]
    else {
        panic!("expected basic.deliver, got {out:?}");
    };
    assert_eq!(deliver.consumer_tag, ok.consumer_tag);
    assert_eq!((deliver.delivery_tag, deliver.redelivered), (1, false));
    assert_eq!(
        (deliver.exchange.as_str(), deliver.routing_key.as_str()),
        ("", "jobs")
    );
    let AMQPFrame::Header(1, header) = &out[2] else {
        panic!("expected a content header, got {out:?}");
    };
    assert_eq!(
        (header.body_size, &header.properties),
        (20_000, &properties)
    );
    let sizes: Vec<usize> = out[3..]
        .iter()
        .map(|f| match f {
            AMQPFrame::Body(1, b) => b.len(),
            other => panic!("expected body frames, got {other:?}"),
        })
        .collect();
    assert_eq!(sizes, [8184, 8184, 3632]);
    assert_eq!(deliveries(&out), [(1, false, body)]);

    assert!(c.feed(&[ack(1, false)]).is_empty());
    let stats = c.broker.queue("jobs").unwrap().stats();
    assert_eq!((stats.acked, stats.leased, stats.ready), (1, 0, 0));
}

#[test]
fn nack_with_requeue_redelivers_with_the_flag_and_a_new_tag() {
    let mut c = Client::open();
    c.declare("retry");
    c.feed(&Client::publish_frames(
        "retry",
        BasicProperties::default(),
        b"flaky",
    ));
    let out = c.consume("retry", false);
    assert_eq!(deliveries(&out), [(1, false, b"flaky".to_vec())]);
    let out = c.feed(&[nack(1, true)]);
    assert_eq!(deliveries(&out), [(2, true, b"flaky".to_vec())]);
    let stats = c.broker.queue("retry").unwrap().stats();
    assert_eq!((stats.nacked, stats.delivered), (1, 2));
}

#[test]
fn nack_without_requeue_rejects() {
    let mut c = Client::open();
    c.declare("poison");
    c.feed(&Client::publish_frames(
        "poison",
        BasicProperties::default(),
        b"not json",
    ));
    c.consume("poison", false);
    assert!(c.feed(&[nack(1, false)]).is_empty());
    let stats = c.broker.queue("poison").unwrap().stats();
    assert_eq!((stats.rejected, stats.ready, stats.leased), (1, 0, 0));
}

#[test]
fn ack_multiple_settles_every_delivery_up_to_the_tag() {
    let mut c = Client::open();
    c.declare("batch");
    let frames: Vec<AMQPFrame> = (0..5)
        .flat_map(|i| {
            Client::publish_frames(
                "batch",
                BasicProperties::default(),
                format!("m{i}").as_bytes(),
            )
        })
        .collect();
    c.feed(&frames);
    let out = c.consume("batch", false);
    assert_eq!(deliveries(&out).len(), 5);
    assert!(c.feed(&[ack(3, true)]).is_empty());
    let stats = c.broker.queue("batch").unwrap().stats();
    assert_eq!((stats.acked, stats.leased), (3, 2));
    // Tag 0 with multiple: everything outstanding.
    assert!(c.feed(&[ack(0, true)]).is_empty());
    assert_eq!(c.broker.queue("batch").unwrap().stats().acked, 5);
}

#[test]
fn qos_prefetch_bounds_the_deliveries_in_flight() {
    let mut c = Client::open();
    c.declare("bounded");
    let qos = basic::Qos {
        prefetch_count: 2,
        global: false,
    };
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Qos(qos))]);
    assert_eq!(
        out,
        [basic_method(1, basic::AMQPMethod::QosOk(basic::QosOk {}))]
    );
    let frames: Vec<AMQPFrame> = (0..5)
        .flat_map(|_| Client::publish_frames("bounded", BasicProperties::default(), b"x"))
        .collect();
    c.feed(&frames);
    assert_eq!(deliveries(&c.consume("bounded", false)).len(), 2);
    assert_eq!(
        deliveries(&c.feed(&[ack(1, false)])),
        [(3, false, b"x".to_vec())]
    );
}

#[test]
fn closing_the_channel_returns_unacked_deliveries_redelivered() {
    let mut c = Client::open();
    c.declare("crash");
    c.feed(&Client::publish_frames(
        "crash",
        BasicProperties::default(),
        b"half done",
    ));
    c.consume("crash", false);
    let out = c.feed(&[close_channel()]);
    assert_eq!(
        out,
        [method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {}))
        )]
    );
    let stats = c.broker.queue("crash").unwrap().stats();
    assert_eq!((stats.ready, stats.leased, stats.consumers), (1, 0, 0));

    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    let out = c.consume("crash", false);
    assert_eq!(deliveries(&out), [(1, true, b"half done".to_vec())]);
}

#[test]
fn a_late_ack_after_the_lease_ran_out_is_ignored_not_an_error() {
    let mut c = Client::open();
    c.declare("slow");
    c.feed(&Client::publish_frames(
        "slow",
        BasicProperties::default(),
        b"long job",
    ));
    c.consume("slow", false);
    c.broker.advance(Duration::from_secs(11)).unwrap(); // the lease was 10 s
                                                        // The message came back and was delivered again to the same consumer.
    let out = c.feed(&[]);
    assert_eq!(deliveries(&out), [(2, true, b"long job".to_vec())]);
    assert!(c.feed(&[ack(1, false)]).is_empty());
    let stats = c.broker.queue("slow").unwrap().stats();
    assert_eq!((stats.stale, stats.expired, stats.leased), (1, 1, 1));
    assert!(c.feed(&[ack(2, false)]).is_empty());
    assert_eq!(c.broker.queue("slow").unwrap().stats().acked, 1);
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

/// A client that takes deliveries and never acks them, on a queue whose leases run out:
/// each expiry gives the messages back and they come again under new tags. The channel
/// forgets the deliveries whose lease has run out, so what it holds stays bounded; a late
/// ack of one it forgot is ignored as before, and the live ones ack as usual.
#[test]
fn a_channel_forgets_the_deliveries_whose_lease_ran_out() {
    let (mut c, now) = on_a_lease_clock();
    c.declare("stuck");
    c.feed(&[qos(10, false)]);
    let frames: Vec<AMQPFrame> = (0..10)
        .flat_map(|_| Client::publish_frames("stuck", BasicProperties::default(), b"x"))
        .collect();
    c.feed(&frames);
    assert_eq!(deliveries(&c.consume("stuck", false)).len(), 10);
    let mut made = 10;
    for _ in 0..300 {
        // The leases are 10 s; both clocks move on together.
        c.broker.advance(Duration::from_secs(11)).unwrap();
        now.fetch_add(11_000, Ordering::Relaxed);
        let out = deliveries(&c.feed(&[]));
        assert!(out.len() >= 10, "the expired ones come again");
        made += out.len() as u64;
    }
    // The last 10 are the live ones: tags made - 9 ..= made.
    let held = c.conn.channels[&1].unacked.len();
    assert!(
        (10..=2 * super::channel::FORGET_EXPIRED_FROM).contains(&held),
        "{made} deliveries, 10 of them live: the channel holds {held}"
    );
    // A forgotten delivery's ack is a late ack: ignored, the channel stays.
    assert!(c.feed(&[ack(1, false)]).is_empty());
    assert!(c.feed(&[ack(2, true)]).is_empty());
    // The live ones are all still held and settle.
    for tag in made - 9..=made {
        assert!(c.feed(&[ack(tag, false)]).is_empty());
    }
    let stats = c.broker.queue("stuck").unwrap().stats();
    assert_eq!((stats.acked, stats.leased, stats.ready), (10, 0, 0));
    // A tag never delivered is still a channel error.
    let out = c.feed(&[ack(made + 1, false)]);
    assert_eq!(channel_close_code(&out), Some(406));
}

/// `basic.get` without an ack, again and again, on a queue whose lease runs out: each
/// get's stopped consumer goes once the channel forgets its expired delivery, so they do
/// not pile up either.
#[test]
fn repeated_gets_never_acked_are_forgotten_with_their_consumers() {
    let (mut c, now) = on_a_lease_clock();
    c.declare("again");
    c.feed(&Client::publish_frames(
        "again",
        BasicProperties::default(),
        b"x",
    ));
    for round in 1..=1500u64 {
        let out = c.feed(&[get("again", false)]);
        assert!(
            matches!(&out[0], AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ok)))
                if ok.delivery_tag == round),
            "{out:?}"
        );
        c.broker.advance(Duration::from_secs(11)).unwrap();
        now.fetch_add(11_000, Ordering::Relaxed);
    }
    let state = &c.conn.channels[&1];
    assert!(state.unacked.len() < 1024, "{}", state.unacked.len());
    assert!(state.stopped.len() < 1024, "{}", state.stopped.len());
}

/// The look for expired deliveries forgets none whose lease is still running, however
/// many the channel holds.
#[test]
fn a_channel_forgets_no_delivery_whose_lease_still_runs() {
    let (mut c, now) = on_a_lease_clock();
    c.declare("busy");
    let publish = |n| -> Vec<AMQPFrame> {
        (0..n)
            .flat_map(|_| Client::publish_frames("busy", BasicProperties::default(), b"x"))
            .collect()
    };
    c.feed(&publish(1000));
    assert_eq!(deliveries(&c.consume("busy", false)).len(), 1000);
    // A millisecond before the first ones' leases run out, 2 000 more come: the channel
    // looks for expired ones as they pass 1 024, and finds none.
    now.store(9_999, Ordering::Relaxed);
    assert_eq!(deliveries(&c.feed(&publish(2000))).len(), 2000);
    assert_eq!(c.conn.channels[&1].unacked.len(), 3000);
    assert!(c.feed(&[ack(3000, true)]).is_empty());
    assert_eq!(c.broker.queue("busy").unwrap().stats().acked, 3000);
}

/// A connection through the handshake with channel 1 open, whose client announced the
/// `connection.blocked` capability, on a server whose memory alarm is `alarm`.
fn hearing_blocked(alarm: &Arc<MemoryAlarm>) -> Client {
    let mut c = Client::new(Settings {
        memory_alarm: Arc::clone(alarm),
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

/// RabbitMQ's memory alarm: a publish met while it is raised is not taken, the client is
/// told `connection.blocked`, and nothing more is read until the alarm clears; then
/// `connection.unblocked`, and the publish goes in.
#[test]
fn the_memory_alarm_blocks_a_publishing_connection_until_it_clears() {
    let alarm = Arc::new(MemoryAlarm::default());
    let mut c = hearing_blocked(&alarm);
    c.declare("jobs");
    alarm.set(true);
    let publish = encode(&Client::publish_frames(
        "jobs",
        BasicProperties::default(),
        b"job",
    ));
    assert_eq!(c.conn.handle_input(&publish), 0, "the publish is not taken");
    assert!(c.conn.is_blocked() && !c.conn.wants_input());
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    let blocked = connection::Blocked {
        reason: "low on memory".into(),
    };
    assert_eq!(
        decode(&out),
        [conn_method(connection::AMQPMethod::Blocked(blocked))]
    );
    // Told once: the same input again while the alarm holds says nothing more.
    assert_eq!(c.conn.handle_input(&publish), 0);
    c.conn.unblock();
    assert!(c.conn.is_blocked());
    assert_eq!(c.conn.output_len(), 0);
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 0);

    alarm.set(false);
    c.conn.unblock();
    assert!(!c.conn.is_blocked() && c.conn.wants_input());
    let out = c.feed_bytes(&publish);
    assert_eq!(
        out,
        [conn_method(connection::AMQPMethod::Unblocked(
            connection::Unblocked {}
        ))]
    );
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 1);
}

/// A connection that only consumes and acks is never blocked, and one that did not ask
/// to hear of it is blocked without being told.
#[test]
fn the_memory_alarm_lets_consumers_go_on_and_tells_only_who_asked() {
    let alarm = Arc::new(MemoryAlarm::default());
    let mut c = Client::open_with(Settings {
        memory_alarm: Arc::clone(&alarm),
        ..Settings::default()
    });
    c.declare("work");
    c.feed(&Client::publish_frames(
        "work",
        BasicProperties::default(),
        b"a",
    ));
    alarm.set(true);
    assert_eq!(deliveries(&c.consume("work", false)).len(), 1);
    assert!(c.feed(&[ack(1, false)]).is_empty());
    assert_eq!(c.broker.queue("work").unwrap().stats().acked, 1);
    assert!(!c.conn.is_blocked());
    let publish = encode(&Client::publish_frames(
        "work",
        BasicProperties::default(),
        b"b",
    ));
    assert_eq!(c.conn.handle_input(&publish), 0);
    assert!(c.conn.is_blocked());
    assert_eq!(c.conn.output_len(), 0, "not told: it did not ask");
}

/// As RabbitMQ: `multiple` names a tag that must itself be outstanding; a tag past every
/// delivery is a channel error, not "everything".
#[test]
fn ack_multiple_of_a_tag_never_delivered_is_406_and_settles_nothing() {
    let mut c = Client::open();
    c.declare("far");
    c.feed(&Client::publish_frames(
        "far",
        BasicProperties::default(),
        b"m",
    ));
    let out = c.consume("far", false);
    assert_eq!(deliveries(&out).len(), 1);
    let out = c.feed(&[ack(1000, true)]);
    assert_eq!(channel_close_code(&out), Some(406));
    assert_eq!(c.broker.queue("far").unwrap().stats().acked, 0);
}

#[test]
fn an_unknown_delivery_tag_closes_the_channel_with_406() {
    let mut c = Client::open();
    let out = c.feed(&[ack(42, false)]);
    assert_eq!(channel_close_code(&out), Some(406));
    // Until close-ok, the channel ignores everything else.
    assert!(c.feed(&[ack(43, false)]).is_empty());
    let ok = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
    );
    assert!(c.feed(&[ok]).is_empty());
    // The connection lives on: the channel can be opened again.
    let out = c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    assert_eq!(
        out,
        [method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {}))
        )]
    );
}

#[test]
fn publishing_to_an_exchange_other_than_the_default_is_a_404() {
    let mut c = Client::open();
    let mut frames = Client::publish_frames("jobs", BasicProperties::default(), b"x");
    frames[0] = basic_method(
        1,
        basic::AMQPMethod::Publish(basic::Publish {
            exchange: "logs".into(),
            routing_key: "jobs".into(),
            mandatory: false,
            immediate: false,
        }),
    );
    assert_eq!(channel_close_code(&c.feed(&frames)), Some(404));
}

#[test]
fn a_mandatory_publish_nowhere_comes_back_as_basic_return() {
    let mut c = Client::open();
    let mut frames = Client::publish_frames("nowhere", BasicProperties::default(), b"lost?");
    frames[0] = basic_method(
        1,
        basic::AMQPMethod::Publish(basic::Publish {
            exchange: "".into(),
            routing_key: "nowhere".into(),
            mandatory: true,
            immediate: false,
        }),
    );
    let out = c.feed(&frames);
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Return(ret))) = &out[0] else {
        panic!("expected basic.return, got {out:?}");
    };
    assert_eq!(ret.reply_code, 312);
    assert_eq!(out[2], AMQPFrame::Body(1, b"lost?".to_vec()));
}

#[test]
fn an_unsupported_method_closes_the_connection_with_540() {
    let mut c = Client::open();
    let declare = exchange::Declare {
        exchange: "logs".into(),
        kind: "x-delayed-message".into(),
        ..exchange::Declare::default()
    };
    let out = c.feed(&[method(
        1,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare)),
    )]);
    assert_eq!(connection_close_code(&out), Some(540));
    assert!(c.conn.is_closing());
    c.feed(&[conn_method(connection::AMQPMethod::CloseOk(
        connection::CloseOk {},
    ))]);
    assert!(c.conn.is_closed());
}

#[test]
fn a_read_whose_frames_would_write_more_than_a_mebibyte_is_taken_in_parts() {
    let mut c = Client::open();
    c.declare("big");
    let body = vec![7; 300_000];
    let mut frames = Client::publish_frames("big", BasicProperties::default(), &body);
    frames.pop();
    frames.extend(
        body.chunks(8_000)
            .map(|part| AMQPFrame::Body(1, part.to_vec())),
    );
    assert_eq!(c.feed(&frames), []);
    // Seven gets of the one message, each nacked back: 2.1 MB to write, from one read.
    let get = || {
        let get = basic::Get {
            queue: "big".into(),
            no_ack: false,
        };
        basic_method(1, basic::AMQPMethod::Get(get))
    };
    let frames: Vec<_> = (1..=7).flat_map(|tag| [get(), nack(tag, true)]).collect();
    let bytes = encode(&frames);
    let gets = |out: &[AMQPFrame]| {
        let get_ok = |f: &&AMQPFrame| {
            matches!(
                f,
                AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(_)))
            )
        };
        out.iter().filter(get_ok).count()
    };
    let used = c.conn.handle_input(&bytes);
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    // It stopped after the get that took its output past a mebibyte, the fourth.
    assert!(used < bytes.len());
    assert!((super::OUTPUT_PER_FEED..super::OUTPUT_PER_FEED + 300_000).contains(&out.len()));
    assert_eq!(gets(&decode(&out)), 4);
    // The rest, fed again, is taken whole.
    assert_eq!(gets(&c.feed_bytes(&bytes[used..])), 3);
    assert_eq!(c.stats("big").ready, 1);
}

#[test]
fn large_bodies_received_at_once_are_bounded_per_connection() {
    let mut c = Client::open();
    c.declare("big");
    // The header of a publish on `ch` announcing `size` bytes, and its first body frame.
    let started = |ch: u16, size: u64| {
        let mut frames = Client::publish_frames("big", BasicProperties::default(), b"x");
        for frame in &mut frames {
            match frame {
                AMQPFrame::Method(n, _) | AMQPFrame::Body(n, _) => *n = ch,
                AMQPFrame::Header(n, header) => {
                    *n = ch;
                    header.body_size = size;
                }
                _ => {}
            }
        }
        frames
    };
    let open = |ch| {
        method(
            ch,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
    };
    c.feed(&(2..=5).map(open).collect::<Vec<_>>());
    // Four messages of the largest size at once are received.
    for ch in 1..=4 {
        assert_eq!(c.feed(&started(ch, 16 << 20)), []);
    }
    // A fifth large one is refused on its channel, its body dropped as it comes; the
    // connection goes on.
    let out = c.feed(&started(5, 200_000));
    let (code, text) = channel_close(&out).unwrap();
    assert_eq!(code, 406);
    assert!(text.contains("past 64 MiB"), "{text}");
    assert!(!c.conn.is_closing());
    // The channel opened again, a smaller one still goes through.
    let close_ok = channel::AMQPMethod::CloseOk(channel::CloseOk {});
    c.feed(&[method(5, AMQPClass::Channel(close_ok)), open(5)]);
    let mut frames = started(5, 100_000);
    frames.pop();
    frames.extend((0..25).map(|_| AMQPFrame::Body(5, vec![0; 4_000])));
    assert_eq!(c.feed(&frames), []);
    assert_eq!(c.stats("big").ready, 1);
}

#[test]
fn a_frame_over_frame_max_ends_the_connection_with_501() {
    let mut c = Client::open();
    let frames = Client::publish_frames("jobs", BasicProperties::default(), &[0; 9000]);
    let out = c.feed(&frames);
    assert_eq!(connection_close_code(&out), Some(501));
    assert!(c.conn.is_closed());
}

/// A field table whose one value is `levels` field arrays, one inside the other.
fn nested_table(levels: usize) -> Vec<u8> {
    let mut value = Vec::with_capacity(5 * levels + 1);
    for level in 0..levels {
        // Each array holds the ones inside it (5 bytes each) and the void at the bottom.
        let inside = u32::try_from(5 * (levels - 1 - level) + 1).unwrap();
        value.push(b'A');
        value.extend_from_slice(&inside.to_be_bytes());
    }
    value.push(b'V');
    let mut table = u32::try_from(2 + value.len())
        .unwrap()
        .to_be_bytes()
        .to_vec();
    table.extend_from_slice(&[1, b'x']);
    table.extend_from_slice(&value);
    table
}

/// A method frame on `channel` with this payload.
fn raw_method(channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![1];
    frame.extend_from_slice(&channel.to_be_bytes());
    frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(payload);
    frame.push(0xCE);
    frame
}

#[test]
fn tables_nested_past_the_limit_end_the_connection_with_501_unparsed() {
    // Before tune, frames are held to 4 KiB, as in RabbitMQ: a larger start-ok is a 501
    // from its frame header on.
    let mut c = Client::new(Settings::default());
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let deep_start_ok = |levels| {
        let mut start_ok = vec![0, 10, 0, 11];
        start_ok.extend_from_slice(&nested_table(levels));
        start_ok.extend_from_slice(b"\x05PLAIN\0\0\0\x0c\0guest\0guest\x05en_US");
        raw_method(0, &start_ok)
    };
    let out = c.feed_bytes(&deep_start_ok(20_000));
    assert_eq!(connection_close_code(&out), Some(501));
    // Within 4 KiB, 700 levels are refused for their depth.
    let mut c = Client::new(Settings::default());
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let out = c.feed_bytes(&deep_start_ok(700));
    assert_eq!(connection_close_code(&out), Some(501));
    // After a tune to 128 KiB frames, a queue.declare's arguments 20 000 levels deep, which
    // parsed by recursion would overflow this thread's stack and abort the process.
    let mut c = Client::new(Settings::default());
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    c.feed(&[start_ok("guest", "guest")]);
    let [tune_ok, open, channel_open] = open_frames();
    let AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::TuneOk(tune))) = tune_ok
    else {
        unreachable!("open_frames starts with tune-ok")
    };
    let tune_ok = connection::TuneOk {
        frame_max: 131_072,
        ..tune
    };
    let tune_ok = conn_method(connection::AMQPMethod::TuneOk(tune_ok));
    assert_eq!(c.feed(&[tune_ok, open, channel_open]).len(), 2);
    let mut declare = vec![0, 50, 0, 10, 0, 0, 4];
    declare.extend_from_slice(b"jobs");
    declare.push(0);
    declare.extend_from_slice(&nested_table(20_000));
    let out = c.feed_bytes(&raw_method(1, &declare));
    assert_eq!(connection_close_code(&out), Some(501));
    assert!(c.broker.queue("jobs").is_none());
    // And a publish's headers.
    let mut c = Client::open();
    c.declare("jobs");
    let mut bytes = encode(&Client::publish_frames("jobs", BasicProperties::default(), b"")[..1]);
    // class 60, weight 0, body size 0, flags announcing headers, then the headers.
    let mut payload = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20, 0];
    payload.extend_from_slice(&nested_table(1_000));
    bytes.extend_from_slice(&[2, 0, 1]);
    bytes.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    bytes.extend_from_slice(&payload);
    bytes.push(0xCE);
    let out = c.feed_bytes(&bytes);
    assert_eq!(connection_close_code(&out), Some(501));
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 0);
}

#[test]
fn a_content_header_whose_properties_do_not_parse_ends_the_connection_with_501() {
    let mut c = Client::open();
    c.declare("jobs");
    let mut bytes = encode(&Client::publish_frames("jobs", BasicProperties::default(), b"")[..1]);
    // class 60, weight 0, body size 0, then flags announcing a content type with none after.
    let payload = [0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0];
    bytes.extend_from_slice(&[2, 0, 1, 0, 0, 0, payload.len() as u8]);
    bytes.extend_from_slice(&payload);
    bytes.push(0xCE);
    let out = c.feed_bytes(&bytes);
    assert_eq!(connection_close_code(&out), Some(501));
    assert!(c.conn.is_closed());
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 0);
}

#[test]
fn each_publishs_properties_and_message_id_are_its_own_in_a_run() {
    let mut c = Client::open();
    c.declare("jobs");
    // Alternating properties, and a repeated message-id: the second "a" is a duplicate
    // while the first is queued (contract §3 Deduplication).
    let sent = [
        (Some("a"), Some("text/plain")),
        (Some("a"), None),
        (None, Some("text/plain")),
        (Some("b"), Some("text/plain")),
        (None, None),
    ];
    let mut frames = Vec::new();
    for (i, (id, content_type)) in sent.iter().enumerate() {
        let mut properties = BasicProperties::default();
        if let Some(id) = id {
            properties = properties.with_message_id((*id).into());
        }
        if let Some(t) = content_type {
            properties = properties.with_content_type((*t).into());
        }
        frames.extend(Client::publish_frames("jobs", properties, &[i as u8]));
    }
    assert!(c.feed(&frames).is_empty());
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 4);
    let out = c.consume("jobs", true);
    let got: Vec<(Option<String>, Option<String>)> = out
        .iter()
        .filter_map(|f| match f {
            AMQPFrame::Header(1, h) => Some((
                h.properties.message_id().as_ref().map(|s| s.to_string()),
                h.properties.content_type().as_ref().map(|s| s.to_string()),
            )),
            _ => None,
        })
        .collect();
    let expected: Vec<(Option<String>, Option<String>)> = [0, 2, 3, 4]
        .iter()
        .map(|&i| {
            let (id, t) = sent[i];
            (id.map(String::from), t.map(String::from))
        })
        .collect();
    assert_eq!(got, expected);
    let bodies: Vec<Vec<u8>> = deliveries(&out).into_iter().map(|d| d.2).collect();
    assert_eq!(bodies, [[0], [2], [3], [4]]);
}

#[test]
fn a_method_on_a_channel_never_opened_is_a_504() {
    let mut c = Client::open();
    let qos = basic::Qos {
        prefetch_count: 1,
        global: false,
    };
    let out = c.feed(&[basic_method(7, basic::AMQPMethod::Qos(qos))]);
    assert_eq!(connection_close_code(&out), Some(504));
}

#[test]
fn garbage_after_the_handshake_never_panics() {
    // A small deterministic generator: each seed is a different run of junk.
    for seed in 1..200u64 {
        let mut c = Client::open();
        c.declare("q");
        let mut x = seed;
        let junk: Vec<u8> = (0..512)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        c.conn.handle_input(&junk);
        let mut out = Vec::new();
        c.conn.take_output(&mut out);
    }
}

#[test]
fn with_confirms_the_publishes_of_one_read_are_acked_together_once_put() {
    use amq_protocol::protocol::confirm;
    let mut c = Client::open();
    c.declare("confirmed");
    let select = method(
        1,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        })),
    );
    let out = c.feed(&[select]);
    assert_eq!(
        out,
        [method(
            1,
            AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {}))
        )]
    );
    let frames: Vec<AMQPFrame> = (0..3)
        .flat_map(|_| Client::publish_frames("confirmed", BasicProperties::default(), b"x"))
        .collect();
    let out = c.feed(&frames);
    let ack = basic::Ack {
        delivery_tag: 3,
        multiple: true,
    };
    assert_eq!(out, [basic_method(1, basic::AMQPMethod::Ack(ack))]);
    assert_eq!(c.broker.queue("confirmed").unwrap().stats().ready, 3);
    // A publish to no queue is confirmed too (after nothing: it is dropped).
    let out = c.feed(&Client::publish_frames(
        "nowhere",
        BasicProperties::default(),
        b"y",
    ));
    let ack = basic::Ack {
        delivery_tag: 4,
        multiple: true,
    };
    assert_eq!(out, [basic_method(1, basic::AMQPMethod::Ack(ack))]);
}

#[test]
fn acks_before_a_channel_error_in_the_same_read_still_count() {
    let mut c = Client::open();
    c.declare("mixed");
    let frames: Vec<AMQPFrame> = (0..2)
        .flat_map(|_| Client::publish_frames("mixed", BasicProperties::default(), b"x"))
        .collect();
    c.feed(&frames);
    assert_eq!(deliveries(&c.consume("mixed", false)).len(), 2);
    // One read: a good ack, then a tag never issued (a channel error).
    let out = c.feed(&[ack(1, false), ack(99, false)]);
    assert_eq!(channel_close_code(&out), Some(406));
    let stats = c.broker.queue("mixed").unwrap().stats();
    // Delivery 1 was acked; delivery 2 came back when the channel's consumer ended.
    assert_eq!(
        (stats.acked, stats.ready, stats.leased, stats.stale),
        (1, 1, 0, 0)
    );
}

#[test]
fn settles_of_one_read_follow_the_publishes_before_them() {
    let mut c = Client::open();
    c.declare("order");
    c.feed(&Client::publish_frames(
        "order",
        BasicProperties::default(),
        b"first",
    ));
    assert_eq!(deliveries(&c.consume("order", false)).len(), 1);
    // One read: publish a second message, ack the first, nack-requeue nothing else.
    let mut frames = Client::publish_frames("order", BasicProperties::default(), b"second");
    frames.push(ack(1, false));
    let out = c.feed(&frames);
    assert_eq!(deliveries(&out), [(2, false, b"second".to_vec())]);
    let stats = c.broker.queue("order").unwrap().stats();
    assert_eq!((stats.enqueued, stats.acked, stats.leased), (2, 1, 1));
}

fn cancel(tag: &str) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: tag.into(),
            nowait: false,
        }),
    )
}

fn get(queue: &str, no_ack: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Get(basic::Get {
            queue: queue.into(),
            no_ack,
        }),
    )
}

fn queue_method(m: queue::AMQPMethod) -> AMQPFrame {
    method(1, AMQPClass::Queue(m))
}

/// The consumer tag `consume-ok` gave.
fn consumer_tag(out: &[AMQPFrame]) -> String {
    out.iter()
        .find_map(|f| match f {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok))) => {
                Some(ok.consumer_tag.to_string())
            }
            _ => None,
        })
        .expect("consume-ok")
}

impl Client {
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
}

#[test]
fn basic_cancel_keeps_what_was_delivered_leased_and_ackable() {
    let mut c = Client::open();
    c.declare("graceful");
    for body in [b"one", b"two", b"six"] {
        c.publish("graceful", body);
    }
    c.prefetch(2);
    let out = c.consume("graceful", false);
    let tag = consumer_tag(&out);
    assert_eq!(deliveries(&out).len(), 2);
    let out = c.feed(&[cancel(&tag)]);
    assert!(matches!(
        out[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::CancelOk(_))
        )]
    ));
    // The two in hand stay leased to the channel; nothing new comes.
    let stats = c.stats("graceful");
    assert_eq!((stats.leased, stats.ready, stats.consumers), (2, 1, 0));
    let out = c.feed(&[ack(1, false), ack(2, false)]);
    assert!(
        out.is_empty(),
        "acks of a cancelled consumer's deliveries: {out:?}"
    );
    let stats = c.stats("graceful");
    assert_eq!((stats.acked, stats.stale, stats.leased), (2, 0, 0));
}

#[test]
fn after_basic_cancel_a_requeue_is_a_release_and_the_channel_close_returns_the_rest() {
    let mut c = Client::open();
    c.declare("handback");
    for body in [b"a", b"b"] {
        c.publish("handback", body);
    }
    let out = c.consume("handback", false);
    let tag = consumer_tag(&out);
    c.feed(&[cancel(&tag), nack(1, true)]);
    let stats = c.stats("handback");
    assert_eq!((stats.released, stats.nacked, stats.leased), (1, 0, 1));
    c.feed(&[close_channel()]);
    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    let out = c.consume("handback", false);
    // "a" was handed back unseen: not redelivered; "b" was seen: redelivered.
    assert_eq!(
        deliveries(&out),
        [(1, false, b"a".to_vec()), (2, true, b"b".to_vec())]
    );
}

#[test]
fn basic_get_leases_one_message_and_get_empty_when_none_is_ready() {
    let mut c = Client::open();
    c.declare("pull");
    c.publish("pull", b"first");
    c.publish("pull", b"second");
    let out = c.feed(&[get("pull", false)]);
    let [AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ok))), AMQPFrame::Header(..), AMQPFrame::Body(1, body)] =
        &out[..]
    else {
        panic!("expected get-ok with content, got {out:?}");
    };
    assert_eq!(
        (ok.delivery_tag, ok.redelivered, ok.message_count),
        (1, false, 1)
    );
    assert_eq!(body, b"first");
    assert_eq!(c.stats("pull").leased, 1);
    let out = c.feed(&[get("pull", true)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.delivery_tag == 2
    ));
    let out = c.feed(&[get("pull", false)]);
    assert_eq!(
        out,
        [basic_method(
            1,
            basic::AMQPMethod::GetEmpty(basic::GetEmpty {})
        )]
    );
    // The first is still leased to the channel: a nack with requeue redelivers it.
    c.feed(&[nack(1, true)]);
    let out = c.feed(&[get("pull", false)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.redelivered
    ));
    let stats = c.stats("pull");
    assert_eq!(
        (stats.acked, stats.nacked, stats.leased, stats.consumers),
        (1, 1, 1, 0)
    );
    let out = c.feed(&[get("nowhere", false)]);
    assert_eq!(channel_close_code(&out), Some(404));
}

#[test]
fn purge_delete_and_recover_answer_as_rabbitmq() {
    let mut c = Client::open();
    c.declare("scratch");
    for body in [b"1", b"2", b"3"] {
        c.publish("scratch", body);
    }
    c.prefetch(1);
    c.consume("scratch", false);
    let out = c.feed(&[queue_method(queue::AMQPMethod::Purge(queue::Purge {
        queue: "scratch".into(),
        nowait: false,
    }))]);
    assert_eq!(
        out,
        [queue_method(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
            message_count: 2
        }))]
    );
    // basic.recover: the one in hand comes back, redelivered.
    let recover = basic::AMQPMethod::Recover(basic::Recover { requeue: true });
    let out = c.feed(&[basic_method(1, recover)]);
    assert_eq!(deliveries(&out), [(2, true, b"1".to_vec())]);
    let delete = |if_unused| {
        queue_method(queue::AMQPMethod::Delete(queue::Delete {
            queue: "scratch".into(),
            if_unused,
            if_empty: false,
            nowait: false,
        }))
    };
    let out = c.feed(&[delete(true)]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
    )]);
    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    let out = c.feed(&[delete(false)]);
    assert_eq!(
        out,
        [queue_method(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
            message_count: 1
        }))]
    );
    assert!(c.broker.queue("scratch").is_none());
}

#[test]
fn deleting_a_queue_under_a_consumer_sends_it_basic_cancel() {
    let mut c = Client::open();
    c.declare("doomed");
    let tag = consumer_tag(&c.consume("doomed", false));
    c.broker.queue("doomed").unwrap().close();
    let out = c.feed(&[]);
    let [AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel)))] = &out[..]
    else {
        panic!("expected basic.cancel, got {out:?}");
    };
    assert_eq!(cancel.consumer_tag.as_str(), tag);
}

#[test]
fn a_server_named_exclusive_queue_is_the_connections_alone_and_goes_with_it() {
    let mut c = Client::open();
    let declare = queue::Declare {
        queue: "".into(),
        exclusive: true,
        auto_delete: true,
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(declare))]);
    let [AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))] = &out[..]
    else {
        panic!("expected declare-ok, got {out:?}");
    };
    let name = ok.queue.to_string();
    assert!(name.starts_with("amq.gen-"), "{name}");
    c.publish(&name, b"mine");
    // Another connection of the same server may publish to it but not consume from it.
    let mut them = c.another(2);
    let out = them.consume(&name, false);
    assert_eq!(channel_close_code(&out), Some(405));
    assert_eq!(c.stats(&name).ready, 1);
    drop(c.conn);
    assert!(
        them.broker.queue(&name).is_none(),
        "gone with its connection"
    );
}

#[test]
fn an_exclusive_consumer_has_its_queue_alone_across_connections() {
    let mut c = Client::open();
    c.declare("solo");
    c.declare("shared");
    let tag = consumer_tag(&c.consume_exclusive("solo"));
    // No other consumer, exclusive or not, on any connection (RabbitMQ: 403).
    let mut them = c.another(2);
    assert_eq!(channel_close_code(&them.consume("solo", false)), Some(403));
    let mut third = c.another(3);
    assert_eq!(
        channel_close_code(&third.consume_exclusive("solo")),
        Some(403)
    );
    // An exclusive consumer is refused where there is a consumer already.
    consumer_tag(&c.consume("shared", false));
    let mut fourth = c.another(4);
    assert_eq!(
        channel_close_code(&fourth.consume_exclusive("shared")),
        Some(403)
    );
    // Deliveries go to the exclusive consumer.
    let mut frames = Client::publish_frames("solo", BasicProperties::default(), b"one");
    frames.extend(Client::publish_frames(
        "solo",
        BasicProperties::default(),
        b"two",
    ));
    assert_eq!(deliveries(&c.feed(&frames)).len(), 2);
    // Once it is cancelled, the queue is free again.
    let cancel = basic::Cancel {
        consumer_tag: tag.as_str().into(),
        nowait: false,
    };
    c.feed(&[basic_method(1, basic::AMQPMethod::Cancel(cancel))]);
    let mut fifth = c.another(5);
    consumer_tag(&fifth.consume_exclusive("solo"));
    // And free again when the connection holding it ends.
    drop(fifth);
    let mut sixth = c.another(6);
    consumer_tag(&sixth.consume("solo", false));
}

impl Client {
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
}

#[test]
fn a_full_queue_with_reject_publish_takes_what_fits_and_nacks_the_rest() {
    use amq_protocol::protocol::confirm;
    let mut c = Client::open();
    c.declare_rejecting_over("bounded", 2);
    let select = confirm::AMQPMethod::Select(confirm::Select { nowait: false });
    c.feed(&[method(1, AMQPClass::Confirm(select))]);
    let frames = Client::publish_run("bounded", &[b"1", b"2", b"3"]);
    let out = c.feed(&frames);
    let nack = basic::Nack {
        delivery_tag: 3,
        multiple: false,
        requeue: false,
    };
    let ack = basic::Ack {
        delivery_tag: 2,
        multiple: true,
    };
    // In order: the ack with multiple stops below the nack.
    assert_eq!(
        out,
        [
            basic_method(1, basic::AMQPMethod::Ack(ack)),
            basic_method(1, basic::AMQPMethod::Nack(nack)),
        ]
    );
    assert_eq!(c.stats("bounded").ready, 2);
    // Room again once one is taken: the next publish is acked.
    c.feed(&[get("bounded", true)]);
    let out = c.feed(&Client::publish_frames(
        "bounded",
        BasicProperties::default(),
        b"4",
    ));
    let ack = basic::Ack {
        delivery_tag: 4,
        multiple: true,
    };
    assert_eq!(out, [basic_method(1, basic::AMQPMethod::Ack(ack))]);
}

fn qos(count: u16, global: bool) -> AMQPFrame {
    let qos = basic::Qos {
        prefetch_count: count,
        global,
    };
    basic_method(1, basic::AMQPMethod::Qos(qos))
}

fn flow(active: bool) -> AMQPFrame {
    method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active })),
    )
}

/// `global=true` bounds the channel's unsettled deliveries, all its consumers together;
/// `global=false` bounds each consumer; both hold at once (RabbitMQ's meaning).
#[test]
fn a_global_qos_bounds_the_channel_and_a_per_consumer_qos_each_consumer() {
    let mut c = Client::open();
    c.declare("shared-a");
    c.declare("shared-b");
    for _ in 0..5 {
        c.publish("shared-a", b"a");
        c.publish("shared-b", b"b");
    }
    c.feed(&[qos(3, true), qos(2, false)]);
    let mut got = deliveries(&c.consume("shared-a", false));
    got.extend(deliveries(&c.consume("shared-b", false)));
    assert_eq!(got.len(), 3, "the channel holds at most 3 unsettled");
    let per_queue = |q: &str| c.stats(q).leased;
    assert!(per_queue("shared-a") <= 2 && per_queue("shared-b") <= 2);
    // One ack makes room for one more on the channel.
    let more = deliveries(&c.feed(&[ack(got[0].0, false)]));
    assert_eq!(more.len(), 1);
    // A no_ack consumer is not bounded by the channel's limit.
    c.declare("free");
    for _ in 0..4 {
        c.publish("free", b"f");
    }
    assert_eq!(deliveries(&c.consume("free", true)).len(), 4);
}

/// `channel.flow active=false` stops deliveries on the channel until `active=true`; each
/// is answered with `flow-ok` carrying the same flag.
#[test]
fn channel_flow_pauses_and_resumes_deliveries() {
    let mut c = Client::open();
    c.declare("flowing");
    let out = c.feed(&[flow(false)]);
    let ok = |active| {
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active })),
        )
    };
    assert_eq!(out, [ok(false)]);
    c.consume("flowing", false);
    c.publish("flowing", b"held");
    assert!(deliveries(&c.feed(&[])).is_empty(), "paused");
    let out = c.feed(&[flow(true)]);
    assert_eq!(out[0], ok(true));
    assert_eq!(deliveries(&out), [(1, false, b"held".to_vec())]);
}

#[test]
fn publishes_without_confirms_are_not_waited_for_unless_the_answer_needs_telling() {
    use super::publish::{bytes_held, UNANSWERED_PUT_BYTES};
    use leasemq::{Message, QueueConfig};
    let mut c = Client::open();
    c.declare("plain");
    // Put before a method later in the same read is answered.
    let mut frames = Client::publish_run("plain", &[b"1", b"2", b"3"]);
    let passive = queue::Declare {
        queue: "plain".into(),
        passive: true,
        ..queue::Declare::default()
    };
    frames.push(queue_method(queue::AMQPMethod::Declare(passive)));
    let out = c.feed(&frames);
    let ok = queue::DeclareOk {
        queue: "plain".into(),
        message_count: 3,
        consumer_count: 0,
    };
    assert_eq!(out, [queue_method(queue::AMQPMethod::DeclareOk(ok))]);

    // A bounded queue takes what fits of a run, which a batch put without waiting would not.
    c.declare_rejecting_over("bounded", 2);
    let frames = Client::publish_run("bounded", &[b"1", b"2", b"3"]);
    let first = c.feed(&frames[..2]);
    eprintln!("first {first:?} closing {}", c.conn.is_closing());
    let second = c.feed(&frames[2..3]);
    eprintln!("second {second:?} closing {}", c.conn.is_closing());
    assert_eq!(c.feed(&frames[3..]), []);
    assert_eq!(c.stats("bounded").ready, 2);

    // A message over the queue's size limit is a channel error, not a silent drop.
    let small = QueueConfig {
        max_body_bytes: 64,
        ..QueueConfig::default()
    };
    c.broker.declare_queue("small", small).unwrap();
    let mut c3 = c.another(3);
    let out = c3.feed(&Client::publish_frames(
        "small",
        BasicProperties::default(),
        &[7; 100],
    ));
    assert_eq!(channel_close_code(&out), Some(406));

    // The bytes a shard has not answered are bounded: past the bound a put waits, and
    // once it has, puts go without waiting again.
    let plain = c.broker.queue("plain").unwrap();
    let batch = bytes_held(&vec![Message::new(vec![0u8; 4000]); 4]);
    let mut sent = 0;
    while c.conn.reserve_nowait(&plain, batch) {
        sent += 1;
        assert!(
            sent * 4 * 4000 <= UNANSWERED_PUT_BYTES,
            "{sent} batches unanswered"
        );
    }
    assert!(
        (sent + 1) * 4 * 4064 > UNANSWERED_PUT_BYTES,
        "waited after {sent}"
    );
    assert!(
        !c.conn.reserve_nowait(&plain, batch),
        "still over the bound"
    );
    let mut c2 = c.another(2);
    c2.publish("plain", b"another connection's puts are its own");
    assert!(
        !c.conn.reserve_nowait(&plain, batch),
        "its own put must wait"
    );
    // A run bigger than the room left: it waits (bodies within the frame_max of 8 192).
    let run: Vec<AMQPFrame> = (0..3)
        .flat_map(|_| Client::publish_frames("plain", BasicProperties::default(), &[1; 8000]))
        .collect();
    c.feed(&run);
    assert_eq!(plain.stats().ready, 7);
    assert!(c.conn.reserve_nowait(&plain, batch), "answered: room again");
}

#[test]
fn confirms_go_out_in_order_and_never_past_a_publish_still_awaited() {
    use super::publish::{confirms, Confirm, Confirms};
    use Confirm::{AckUpTo as Ack, Nack};
    let c = |answers: &[Confirm], confirmed: u64, refused: &[u64]| Confirms {
        answers: answers.to_vec(),
        confirmed,
        refused: refused.to_vec(),
    };
    // Nothing awaited: runs of puts acked with one multiple each, every refused one nacked
    // in its place, so that no multiple covers a nack.
    assert_eq!(
        confirms(0, 5, vec![3], &[]),
        c(&[Ack(2), Nack(3), Ack(5)], 5, &[])
    );
    assert_eq!(
        confirms(0, 5, vec![5, 1, 5], &[]),
        c(&[Nack(1), Ack(4), Nack(5)], 5, &[])
    );
    assert_eq!(
        confirms(2, 4, vec![3, 4], &[]),
        c(&[Nack(3), Nack(4)], 4, &[])
    );
    assert_eq!(confirms(5, 5, vec![], &[]), c(&[], 5, &[]));
    // Answers to come for 2 and 3 (another shard, or the disk): only 1 is confirmed,
    // though 4 and 5 were answered; 4 was refused, and is nacked only after 2 and 3.
    assert_eq!(confirms(0, 5, vec![4], &[&[2, 3]]), c(&[Ack(1)], 1, &[4]));
    assert_eq!(confirms(1, 5, vec![4], &[&[3]]), c(&[Ack(2)], 2, &[4]));
    assert_eq!(
        confirms(2, 5, vec![4], &[]),
        c(&[Ack(3), Nack(4), Ack(5)], 5, &[])
    );
    // A publish routed to two queues, refused by one, waits for the other's answer.
    assert_eq!(confirms(0, 3, vec![2], &[&[2]]), c(&[Ack(1)], 1, &[2]));
    assert_eq!(confirms(1, 3, vec![2], &[]), c(&[Nack(2), Ack(3)], 3, &[]));
}

#[test]
fn with_confirms_a_publish_is_acked_only_once_its_put_is_answered() {
    use amq_protocol::protocol::confirm;
    let mut c = Client::open();
    c.declare("answered");
    let select = confirm::AMQPMethod::Select(confirm::Select { nowait: false });
    c.feed(&[method(1, AMQPClass::Confirm(select))]);
    let run = encode(&Client::publish_run("answered", &[b"1", b"2"]));
    assert_eq!(c.conn.handle_input(&run), run.len());
    assert!(c.conn.awaits_answers());
    // The shard may not have answered yet: nothing is confirmed before it has.
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert_eq!(decode(&out), []);
    // Once it has (a call to every shard is answered after it), the two are acked.
    c.broker.advance(Duration::ZERO).unwrap();
    c.conn.try_answers();
    assert!(!c.conn.awaits_answers());
    c.conn.take_output(&mut out);
    let ack = basic::Ack {
        delivery_tag: 2,
        multiple: true,
    };
    assert_eq!(decode(&out), [basic_method(1, basic::AMQPMethod::Ack(ack))]);
    assert_eq!(c.stats("answered").ready, 2);
}

#[test]
fn a_publisher_whose_puts_await_too_many_answers_is_not_read() {
    use amq_protocol::protocol::confirm;
    let mut c = Client::open();
    c.declare("even");
    c.declare("odd");
    let select = confirm::AMQPMethod::Select(confirm::Select { nowait: false });
    c.feed(&[method(1, AMQPClass::Confirm(select))]);
    // Alternating queues: each publish is a put of its own.
    let frames: Vec<AMQPFrame> = (0..300)
        .flat_map(|i| {
            let queue = if i % 2 == 0 { "even" } else { "odd" };
            Client::publish_frames(queue, BasicProperties::default(), b"x")
        })
        .collect();
    let bytes = encode(&frames);
    assert_eq!(c.conn.handle_input(&bytes), bytes.len());
    assert!(!c.conn.wants_input(), "300 puts await their answers");
    c.broker.advance(Duration::ZERO).unwrap();
    c.conn.try_answers();
    assert!(c.conn.wants_input());
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    let ack = basic::Ack {
        delivery_tag: 300,
        multiple: true,
    };
    assert_eq!(decode(&out), [basic_method(1, basic::AMQPMethod::Ack(ack))]);
}

#[test]
fn answers_in_flight_go_nowhere_once_their_channel_or_connection_closed() {
    use amq_protocol::protocol::confirm;
    let select = || {
        method(
            1,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                nowait: false,
            })),
        )
    };
    let mut c = Client::open();
    c.declare("inflight");
    c.feed(&[select()]);
    // Two publishes, then the channel closed and opened again, in one read: the puts'
    // answers come after, for a channel that is gone.
    let mut frames = Client::publish_run("inflight", &[b"1", b"2"]);
    frames.push(close_channel());
    frames.push(method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    ));
    frames.push(select());
    let bytes = encode(&frames);
    assert_eq!(c.conn.handle_input(&bytes), bytes.len());
    c.broker.advance(Duration::ZERO).unwrap();
    c.conn.try_answers();
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    let acks = decode(&out)
        .into_iter()
        .filter(|f| {
            matches!(
                f,
                AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Ack(_)))
            )
        })
        .count();
    assert_eq!(
        acks, 0,
        "the new channel 1 hears nothing of the old one's publishes"
    );
    // Its own first publish is its number 1.
    let out = c.feed(&Client::publish_run("inflight", &[b"3"]));
    let ack = basic::Ack {
        delivery_tag: 1,
        multiple: true,
    };
    assert_eq!(out, [basic_method(1, basic::AMQPMethod::Ack(ack))]);
    // A publish, then connection.close: close-ok is the last thing written.
    let mut frames = Client::publish_run("inflight", &[b"4"]);
    frames.push(conn_method(connection::AMQPMethod::Close(
        connection::Close {
            reply_code: 200,
            reply_text: "bye".into(),
            class_id: 0,
            method_id: 0,
        },
    )));
    let out = c.feed(&frames);
    assert_eq!(
        out,
        [conn_method(connection::AMQPMethod::CloseOk(
            connection::CloseOk {}
        ))]
    );
    assert!(!c.conn.awaits_answers());
    assert_eq!(
        c.stats("inflight").ready,
        4,
        "every publish was put all the same"
    );
}

#[test]
fn a_multiple_requeue_after_basic_cancel_hands_back_in_delivery_order() {
    let mut c = Client::open();
    c.declare("inorder");
    for body in [b"m0", b"m1", b"m2", b"m3"] {
        c.publish("inorder", body);
    }
    let out = c.consume("inorder", false);
    let tag = consumer_tag(&out);
    assert_eq!(deliveries(&out).len(), 4);
    let all = basic::Nack {
        delivery_tag: 0,
        multiple: true,
        requeue: true,
    };
    c.feed(&[cancel(&tag), basic_method(1, basic::AMQPMethod::Nack(all))]);
    assert_eq!(c.stats("inorder").released, 4);
    // Each release goes to the front: they come back as they were first delivered.
    let out = c.consume("inorder", false);
    let bodies: Vec<Vec<u8>> = deliveries(&out).into_iter().map(|d| d.2).collect();
    assert_eq!(bodies, [b"m0", b"m1", b"m2", b"m3"].map(|b| b.to_vec()));
}

#[test]
fn a_server_picked_consumer_tag_never_takes_one_a_client_chose() {
    let mut c = Client::open();
    c.declare("tags");
    // The tags the server would pick next (connection 1's fourth consumer on), taken by
    // the client first.
    let mut chosen = Vec::new();
    for n in 4..=6 {
        let consume = basic::Consume {
            queue: "tags".into(),
            consumer_tag: format!("amq.ctag-1-{n}").into(),
            ..basic::Consume::default()
        };
        let out = c.feed(&[basic_method(1, basic::AMQPMethod::Consume(consume))]);
        chosen.push(consumer_tag(&out));
    }
    let out = c.consume("tags", false);
    assert_eq!(connection_close_code(&out), None, "{out:?}");
    let picked = consumer_tag(&out);
    assert!(picked.starts_with("amq.ctag-"), "{picked}");
    assert!(!chosen.contains(&picked), "{picked} is one of {chosen:?}");
}

#[test]
fn a_channel_method_on_channel_0_is_a_504() {
    let mut c = Client::open();
    let declare = queue::Declare {
        queue: "zero".into(),
        ..queue::Declare::default()
    };
    let out = c.feed(&[method(
        0,
        AMQPClass::Queue(queue::AMQPMethod::Declare(declare)),
    )]);
    assert_eq!(connection_close_code(&out), Some(504), "{out:?}");
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

#[test]
fn a_redeclare_must_say_what_the_declare_said_as_in_rabbitmq() {
    let mut c = Client::open();
    // No data dir: every queue is in memory, and `durable` still has to match.
    c.declare("same");
    let durable = |durable| queue::Declare {
        queue: "same".into(),
        durable,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, durable(false)), 406);
    assert_eq!(declare_code(&mut c, durable(true)), 0);
    let quorum = queue::Declare {
        arguments: {
            let mut args = FieldTable::default();
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            args
        },
        ..durable(true)
    };
    assert_eq!(declare_code(&mut c, quorum), 406);
    let exclusive = queue::Declare {
        queue: "mine".into(),
        exclusive: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, exclusive.clone()), 0);
    let shared = queue::Declare {
        exclusive: false,
        ..exclusive.clone()
    };
    assert_eq!(declare_code(&mut c, shared), 405);
    let auto_delete = queue::Declare {
        auto_delete: true,
        ..exclusive
    };
    assert_eq!(declare_code(&mut c, auto_delete), 406);
    // A client may not make an `amq.` queue; a deleted queue may come back otherwise.
    let reserved = queue::Declare {
        queue: "amq.mine".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, reserved), 403);
    let delete = queue::Delete {
        queue: "same".into(),
        ..queue::Delete::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Delete(delete))]);
    assert_eq!(declare_code(&mut c, durable(false)), 0);
}

#[test]
fn an_empty_queue_name_is_the_queue_last_declared_on_the_channel() {
    let mut c = Client::open();
    c.declare("latest");
    c.publish("latest", b"here");
    let out = c.feed(&[get("", true)]);
    assert_eq!(channel_close_code(&out), None, "{out:?}");
    assert!(out
        .iter()
        .any(|f| matches!(f, AMQPFrame::Body(1, b) if b == b"here")));
}

#[test]
fn a_user_id_that_is_not_the_connections_user_is_a_406() {
    let mut c = Client::open();
    c.declare("claims");
    let honest = BasicProperties::default().with_user_id("guest".into());
    let out = c.feed(&Client::publish_frames("claims", honest, b"mine"));
    assert_eq!(channel_close_code(&out), None, "{out:?}");
    let forged = BasicProperties::default().with_user_id("admin".into());
    let out = c.feed(&Client::publish_frames("claims", forged, b"theirs"));
    assert_eq!(channel_close_code(&out), Some(406), "{out:?}");
    assert_eq!(c.stats("claims").ready, 1);
}

#[test]
fn an_auto_delete_queue_goes_with_its_last_consumer() {
    let mut c = Client::open();
    let declare = queue::Declare {
        queue: "passing".into(),
        auto_delete: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, declare), 0);
    c.publish("passing", b"kept");
    // Never consumed: it stays, as in RabbitMQ.
    assert_eq!(c.stats("passing").ready, 1);
    let first = consumer_tag(&c.consume("passing", false));
    let second = consumer_tag(&c.consume("passing", false));
    c.feed(&[cancel(&first)]);
    assert!(!c.broker.queue("passing").unwrap().is_closed(), "one left");
    c.feed(&[cancel(&second)]);
    assert!(c.broker.queue("passing").is_none_or(|q| q.is_closed()));
    // The name is free again, for a queue that is not auto-delete.
    let again = queue::Declare {
        queue: "passing".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, again), 0);
}

#[test]
fn unbinding_is_lenient_but_not_from_another_connections_exclusive_queue() {
    let mut c = Client::open();
    let exclusive = queue::Declare {
        queue: "private".into(),
        exclusive: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, exclusive), 0);
    let unbind = |queue: &str| {
        queue_method(queue::AMQPMethod::Unbind(queue::Unbind {
            queue: queue.into(),
            exchange: "amq.direct".into(),
            routing_key: "k".into(),
            arguments: FieldTable::default(),
        }))
    };
    // Nothing bound, a queue that is not there: fine, as in RabbitMQ.
    let out = c.feed(&[unbind("private"), unbind("missing")]);
    assert_eq!(channel_close_code(&out), None, "{out:?}");
    let mut other = c.another(2);
    let out = other.feed(&[unbind("private")]);
    assert_eq!(channel_close_code(&out), Some(405), "{out:?}");
}

#[test]
fn an_empty_queue_name_with_none_declared_is_a_404_and_amq_names_stay_the_servers() {
    let mut c = Client::open();
    let out = c.feed(&[get("", true)]);
    assert_eq!(channel_close_code(&out), Some(404), "{out:?}");
    let mut c = Client::open();
    let named = queue::Declare {
        queue: "".into(),
        ..queue::Declare::default()
    };
    let out = c.feed(&[method(
        1,
        AMQPClass::Queue(queue::AMQPMethod::Declare(named)),
    )]);
    let name = out
        .iter()
        .find_map(|f| match f {
            AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))) => {
                Some(ok.queue.to_string())
            }
            _ => None,
        })
        .expect("declare-ok");
    assert!(name.starts_with("amq.gen-"), "{name}");
    // Even the server's own name, once made, is not the client's to declare.
    let again = queue::Declare {
        queue: name.as_str().into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, again.clone()), 403);
    let passive = queue::Declare {
        passive: true,
        ..again
    };
    assert_eq!(declare_code(&mut c, passive), 0);
}

#[test]
fn an_exclusive_queue_is_never_durable_so_its_durable_flag_may_differ() {
    let mut c = Client::open();
    let mine = |durable| queue::Declare {
        queue: "mine".into(),
        exclusive: true,
        durable,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, mine(true)), 0);
    assert_eq!(declare_code(&mut c, mine(false)), 0);
}

#[test]
fn a_basic_get_with_no_ack_takes_one_message_and_moves_no_other() {
    let mut c = Client::open();
    c.declare("line");
    for body in [b"m0", b"m1", b"m2"] {
        c.publish("line", body);
    }
    let body_of = |out: &[AMQPFrame]| {
        out.iter().find_map(|f| match f {
            AMQPFrame::Body(1, b) => Some(b.clone()),
            _ => None,
        })
    };
    let out = c.feed(&[get("line", false)]);
    assert_eq!(body_of(&out).as_deref(), Some(&b"m0"[..]));
    let out = c.feed(&[get("line", true)]);
    assert_eq!(body_of(&out).as_deref(), Some(&b"m1"[..]));
    c.feed(&[nack(1, true)]);
    // m0 came back; m2 was never taken, so it did not jump ahead of it.
    let out = c.feed(&[get("line", true)]);
    assert_eq!(body_of(&out).as_deref(), Some(&b"m0"[..]));
    let stats = c.stats("line");
    assert_eq!((stats.ready, stats.released), (1, 0));
}

/// The properties of the first content header in `out`.
fn first_properties(out: &[AMQPFrame]) -> BasicProperties {
    out.iter()
        .find_map(|f| match f {
            AMQPFrame::Header(_, header) => Some(header.properties.clone()),
            _ => None,
        })
        .expect("a content header")
}

#[test]
fn direct_reply_to_hands_the_requesting_channel_its_replies() {
    let mut client = Client::open();
    let mut server = client.another(2);
    server.declare("rpc");
    // The pseudo-queue takes only a consumer without acks, and one per channel.
    let out = client.consume("amq.rabbitmq.reply-to", false);
    assert_eq!(channel_close_code(&out), Some(406), "{out:?}");
    client.reopen();
    let tag = consumer_tag(&client.consume("amq.rabbitmq.reply-to", true));
    let request = BasicProperties::default()
        .with_reply_to("amq.rabbitmq.reply-to".into())
        .with_correlation_id("c-1".into());
    client.feed(&Client::publish_frames("rpc", request, b"ping"));
    // The request carries the channel's reply name, which a declare finds (0 messages,
    // 1 consumer) but no other queue method does.
    let out = server.feed(&[get("rpc", true)]);
    let reply_to = first_properties(&out)
        .reply_to()
        .clone()
        .expect("rewritten");
    let name = reply_to.to_string();
    assert!(name.starts_with("amq.rabbitmq.reply-to."), "{name}");
    let declare = |name: &str| queue::Declare {
        queue: name.into(),
        passive: true,
        ..queue::Declare::default()
    };
    let out = server.feed(&[queue_method(queue::AMQPMethod::Declare(declare(&name)))]);
    let ok = queue::DeclareOk {
        queue: name.as_str().into(),
        message_count: 0,
        consumer_count: 1,
    };
    assert_eq!(out, [queue_method(queue::AMQPMethod::DeclareOk(ok))]);
    let out = server.feed(&[get(&name, true)]);
    assert_eq!(channel_close_code(&out), Some(404), "{out:?}");
    server.reopen();
    // The reply reaches the consumer, with the reply name as its routing key.
    let reply = BasicProperties::default().with_correlation_id("c-1".into());
    server.feed(&Client::publish_frames(&name, reply, b"pong"));
    let out = client.feed(&[]);
    assert_eq!(deliveries(&out), [(1, false, b"pong".to_vec())]);
    let routed = out.iter().find_map(|f| match f {
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
            Some((d.exchange.to_string(), d.routing_key.to_string()))
        }
        _ => None,
    });
    assert_eq!(routed, Some((String::new(), name.clone())));
    assert_eq!(
        first_properties(&out)
            .correlation_id()
            .as_ref()
            .map(|c| c.to_string()),
        Some("c-1".into())
    );
    let out = client.consume("amq.rabbitmq.reply-to", true);
    assert_eq!(channel_close_code(&out), Some(406), "already set: {out:?}");
    client.reopen();
    // A channel without the consumer may not ask for direct replies.
    let request = BasicProperties::default().with_reply_to("amq.rabbitmq.reply-to".into());
    let out = client.feed(&Client::publish_frames("rpc", request, b"lost"));
    assert_eq!(channel_close_code(&out), Some(406), "{out:?}");
    assert_eq!(server.stats("rpc").ready, 0);
    // The name dies with its consumer: a reply to it is unroutable.
    let mut again = client.another(3);
    let tag_again = consumer_tag(&again.consume("amq.rabbitmq.reply-to", true));
    let request = BasicProperties::default().with_reply_to("amq.rabbitmq.reply-to".into());
    again.feed(&Client::publish_frames("rpc", request, b"ping"));
    let out = server.feed(&[get("rpc", true)]);
    let second = first_properties(&out)
        .reply_to()
        .clone()
        .expect("rewritten");
    assert_ne!(second.as_str(), name, "a name per channel");
    again.feed(&[cancel(&tag_again)]);
    let out = server.feed(&[queue_method(queue::AMQPMethod::Declare(declare(
        second.as_str(),
    )))]);
    assert_eq!(channel_close_code(&out), Some(404), "{out:?}");
    server.reopen();
    client.feed(&[cancel(&tag)]);
    let out = server.feed(&[queue_method(queue::AMQPMethod::Declare(declare(&name)))]);
    assert_eq!(channel_close_code(&out), Some(404), "{out:?}");
}

#[test]
fn x_expires_counts_from_the_last_use_and_waits_while_the_queue_has_consumers() {
    use std::time::Instant;
    let mut c = Client::open();
    let settings = c.conn.settings.clone();
    let expires = |ms: i32| {
        let mut arguments = FieldTable::default();
        arguments.insert("x-expires".into(), AMQPValue::LongInt(ms));
        queue::Declare {
            queue: "idle".into(),
            arguments,
            ..queue::Declare::default()
        }
    };
    assert_eq!(declare_code(&mut c, expires(100)), 0);
    let expire = |at: Instant| {
        let (expired, _) = settings
            .expiring
            .expire(at, |name| settings.consumers.is_consumed(name));
        expired
            .iter()
            .map(|q| q.name().to_string())
            .collect::<Vec<_>>()
    };
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    assert!(expire(t0).is_empty());
    // A publish is no use; a get is.
    c.publish("idle", b"m");
    c.feed(&[get("idle", true)]);
    assert!(expire(ms(60)).is_empty());
    assert!(expire(ms(100)).is_empty(), "used at 60 ms");
    // A redeclare must say the same x-expires.
    let code = declare_code(&mut c, expires(200));
    assert_eq!(code, 406);
    let plain = queue::Declare {
        queue: "idle".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, plain), 406);
    // A consumer keeps it; its going starts the time again.
    let tag = consumer_tag(&c.consume("idle", false));
    assert!(expire(ms(1_000)).is_empty());
    assert!(expire(ms(1_200)).is_empty(), "consumed past its time");
    c.feed(&[cancel(&tag)]);
    assert!(expire(ms(2_000)).is_empty());
    let expired = settings.expiring.expire(ms(2_100), |_| false).0;
    assert_eq!(expired.len(), 1);
    settings.forget_queue(&expired[0]);
    assert!(c.broker.queue("idle").is_none(), "deleted");
    let passive = queue::Declare {
        queue: "idle".into(),
        passive: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, passive), 404);
    // The name is free: declared again without x-expires, it stays.
    let plain = queue::Declare {
        queue: "idle".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, plain), 0);
    assert!(expire(ms(10_000)).is_empty());
}

#[test]
fn a_frame_max_of_4096_is_accepted_as_amqp_and_rabbitmq_3_accept_it() {
    let tune_ok = |frame_max: u32| {
        conn_method(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max: 16,
            frame_max,
            heartbeat: 0,
        }))
    };
    let mut small = Client::new(Settings::default());
    small.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    small.feed(&[start_ok("guest", "guest")]);
    let out = small.feed(&[tune_ok(4095)]);
    assert_eq!(connection_close_code(&out), Some(530), "{out:?}");
    let mut c = Client::new(Settings::default());
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    c.feed(&[start_ok("guest", "guest")]);
    let open = open_frames();
    let out = c.feed(&[tune_ok(4096), open[1].clone(), open[2].clone()]);
    assert_eq!(connection_close_code(&out), None, "{out:?}");
    c.declare("small");
    let body = [7; 5000];
    let mut frames = Client::publish_frames("small", BasicProperties::default(), &body);
    frames.pop();
    frames.extend(
        body.chunks(4088)
            .map(|piece| AMQPFrame::Body(1, piece.to_vec())),
    );
    assert!(c.feed(&frames).is_empty());
    let out = c.consume("small", true);
    let sizes: Vec<usize> = (out.iter())
        .filter_map(|f| match f {
            AMQPFrame::Body(1, b) => Some(b.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, [4088, 912], "bodies cut to the frame_max asked for");
}

#[test]
fn the_rest_of_a_body_refused_at_its_header_is_dropped_even_after_close_ok() {
    let mut c = Client::open();
    c.declare("big");
    let size = 17 << 20;
    let publish = basic::Publish {
        exchange: "".into(),
        routing_key: "big".into(),
        mandatory: false,
        immediate: false,
    };
    let header = AMQPContentHeader {
        class_id: 60,
        body_size: size,
        properties: BasicProperties::default(),
    };
    let piece = AMQPFrame::Body(1, vec![1; 8184]);
    let out = c.feed(&[
        basic_method(1, basic::AMQPMethod::Publish(publish)),
        AMQPFrame::Header(1, header),
        piece.clone(),
    ]);
    assert_eq!(channel_close_code(&out), Some(406), "over the size limit");
    // The client answers the close before the rest of its body, as amqplib does.
    let close_ok = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
    );
    let out = c.feed(&[close_ok, piece.clone(), piece.clone()]);
    assert!(out.is_empty(), "{out:?}");
    assert!(!c.conn.is_closed());
    // A channel opened again starts afresh: its publishes count.
    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    c.publish("big", b"fits");
    assert_eq!(c.stats("big").ready, 1);
    let out = c.feed(&[piece]);
    assert_eq!(
        connection_close_code(&out),
        Some(505),
        "a body with no publish"
    );
}

/// What the server's `x-expires` task does at `at`: deletes each queue due then.
fn run_expiry(settings: &Settings, at: std::time::Instant) {
    let (expired, _) = settings
        .expiring
        .expire(at, |name| settings.consumers.is_consumed(name));
    for queue in &expired {
        if settings.expiring.still_due(queue) {
            settings.forget_queue(queue);
        }
    }
}

fn declare_with(name: &str, exclusive: bool, expires: Option<i32>) -> queue::Declare {
    let mut arguments = FieldTable::default();
    if let Some(ms) = expires {
        arguments.insert("x-expires".into(), AMQPValue::LongInt(ms));
    }
    queue::Declare {
        queue: name.into(),
        exclusive,
        arguments,
        ..queue::Declare::default()
    }
}

#[test]
fn an_exclusive_queue_deleted_by_x_expires_leaves_its_name_free_and_others_state_alone() {
    use std::time::Instant;
    let mut a = Client::open();
    let settings = a.conn.settings.clone();
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    assert_eq!(
        declare_code(&mut a, declare_with("mine", true, Some(100))),
        0
    );
    run_expiry(&settings, t0);
    run_expiry(&settings, ms(100));
    assert!(a.broker.queue("mine").is_none(), "expired");
    // Declared exclusive again, it is this connection's again.
    assert_eq!(declare_code(&mut a, declare_with("mine", true, None)), 0);
    let mut b = a.another(2);
    assert_eq!(channel_close_code(&b.consume("mine", false)), Some(405));
    b.reopen();
    // Another exclusive queue of `a` expires; `b` declares a queue of its name and binds
    // it. `a`'s end must not touch `b`'s queue.
    assert_eq!(
        declare_code(&mut a, declare_with("brief", true, Some(100))),
        0
    );
    run_expiry(&settings, ms(200));
    run_expiry(&settings, ms(300));
    assert!(a.broker.queue("brief").is_none(), "expired");
    assert_eq!(declare_code(&mut b, declare_with("brief", false, None)), 0);
    let bind = queue::Bind {
        queue: "brief".into(),
        exchange: "amq.direct".into(),
        routing_key: "k".into(),
        ..queue::Bind::default()
    };
    b.feed(&[queue_method(queue::AMQPMethod::Bind(bind))]);
    drop(a.conn);
    let exchanges = settings.exchanges.lock().unwrap();
    assert_eq!(
        exchanges.route("amq.direct", "k", || None).unwrap(),
        ["brief"]
    );
    drop(exchanges);
    assert!(b.broker.queue("brief").is_some());
    assert!(b.broker.queue("mine").is_none(), "gone with its connection");
}

#[test]
fn a_connection_keeps_no_handles_of_the_many_queues_it_published_to_once_deleted() {
    let mut c = Client::open();
    let mut server = c.another(2);
    for i in 0..500 {
        let name = format!("once-{i}");
        c.declare(&name);
        server.publish(&name, b"reply");
        let delete = queue::Delete {
            queue: name.as_str().into(),
            ..queue::Delete::default()
        };
        c.feed(&[queue_method(queue::AMQPMethod::Delete(delete))]);
    }
    assert!(
        server.conn.queues.len() <= 2 * 64,
        "{}",
        server.conn.queues.len()
    );
}

#[test]
fn cc_keys_through_a_fanout_exchange_give_each_bound_queue_one_copy() {
    let mut c = Client::open();
    c.declare("left");
    c.declare("right");
    for queue in ["left", "right"] {
        let bind = queue::Bind {
            queue: queue.into(),
            exchange: "amq.fanout".into(),
            ..queue::Bind::default()
        };
        c.feed(&[queue_method(queue::AMQPMethod::Bind(bind))]);
    }
    let mut cc = amq_protocol::types::FieldArray::default();
    for key in ["a", "b", "a"] {
        cc.push(AMQPValue::LongString(key.into()));
    }
    let mut headers = FieldTable::default();
    headers.insert("CC".into(), AMQPValue::FieldArray(cc));
    let mut frames =
        Client::publish_frames("k", BasicProperties::default().with_headers(headers), b"m");
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(publish))) =
        &mut frames[0]
    else {
        unreachable!("publish_frames starts with basic.publish");
    };
    publish.exchange = "amq.fanout".into();
    c.feed(&frames);
    assert_eq!((c.stats("left").ready, c.stats("right").ready), (1, 1));
}

#[test]
fn an_internal_exchange_takes_what_a_bound_exchange_routes_and_refuses_a_publish() {
    let mut c = Client::open();
    c.declare("behind");
    let declare = |name: &str, internal: bool, arguments: FieldTable| {
        method(
            1,
            AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
                exchange: name.into(),
                kind: "fanout".into(),
                internal,
                arguments,
                ..exchange::Declare::default()
            })),
        )
    };
    let mut alternate = FieldTable::default();
    alternate.insert(
        "alternate-exchange".into(),
        AMQPValue::LongString("hidden".into()),
    );
    let bind = exchange::Bind {
        destination: "hidden".into(),
        source: "public".into(),
        ..exchange::Bind::default()
    };
    let out = c.feed(&[
        declare("hidden", true, FieldTable::default()),
        declare("public", false, FieldTable::default()),
        declare("spare", false, alternate),
        method(1, AMQPClass::Exchange(exchange::AMQPMethod::Bind(bind))),
    ]);
    assert!(
        matches!(
            out.last(),
            Some(AMQPFrame::Method(
                1,
                AMQPClass::Exchange(exchange::AMQPMethod::BindOk(_))
            ))
        ),
        "{out:?}"
    );
    let bind = queue::Bind {
        queue: "behind".into(),
        exchange: "hidden".into(),
        ..queue::Bind::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Bind(bind))]);
    let publish_to = |exchange: &str| {
        let mut frames = Client::publish_frames("k", BasicProperties::default(), b"m");
        let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(publish))) =
            &mut frames[0]
        else {
            unreachable!("publish_frames starts with basic.publish");
        };
        publish.exchange = exchange.into();
        frames
    };
    // Through the bound exchange, and through an exchange whose alternate it is.
    c.feed(&publish_to("public"));
    c.feed(&publish_to("spare"));
    assert_eq!(c.stats("behind").ready, 2);
    assert_eq!(
        channel_close_code(&c.feed(&publish_to("hidden"))),
        Some(403)
    );
    assert_eq!(c.stats("behind").ready, 2);
}

#[test]
fn a_queue_that_dead_letters_has_a_holding_queue_no_client_reaches() {
    let mut c = Client::open();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("amq.fanout".into()),
    );
    let declare = queue::Declare {
        queue: "work".into(),
        arguments,
        ..queue::Declare::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Declare(declare))]);
    let holding = crate::dead_letter::holding_name("work");
    let work = c.broker.queue("work").expect("declared");
    assert_eq!(work.config().dead_letter.as_deref(), Some(holding.as_str()));
    assert!(c.broker.queue(&holding).is_some());
    // Not by name: a passive declare is a 404, a mandatory publish comes back.
    let passive = queue::Declare {
        queue: holding.as_str().into(),
        passive: true,
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(passive))]);
    assert_eq!(channel_close_code(&out), Some(404));
    c.feed(&[
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        ),
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        ),
    ]);
    let mut frames = Client::publish_frames(&holding, BasicProperties::default(), b"x");
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(publish))) =
        &mut frames[0]
    else {
        unreachable!("publish_frames starts with basic.publish");
    };
    publish.mandatory = true;
    let out = c.feed(&frames);
    assert!(
        matches!(
            &out[0],
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Return(_)))
        ),
        "{out:?}"
    );
    assert_eq!(c.stats(&holding).enqueued, 0);
    // Deleted with its queue once drained: by the server's task (`dead_letter::run`),
    // which none runs here, so it stays, still out of reach.
    let delete = queue::Delete {
        queue: "work".into(),
        ..queue::Delete::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Delete(delete))]);
    assert!(c.broker.queue("work").is_none());
    assert!(c.broker.queue(&holding).is_some(), "left to drain");
}

/// The bodies of the deliveries and `get-ok`s in `out`, in order.
fn delivered_bodies(out: &[AMQPFrame]) -> Vec<Vec<u8>> {
    (out.iter())
        .filter_map(|f| match f {
            AMQPFrame::Body(1, body) => Some(body.clone()),
            _ => None,
        })
        .collect()
}

impl Client {
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
}

#[test]
fn a_message_past_its_ttl_is_dropped_when_a_consumer_or_get_reaches_it() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.declare("plain");
    let with_expiration = |queue: &str, expiration: &str, body: &[u8]| {
        let properties = BasicProperties::default().with_expiration(expiration.into());
        Client::publish_frames(queue, properties, body)
    };
    // The queue's TTL, and a message's own shorter one; counted from each arrival.
    c.publish("ttl", b"old");
    c.feed(&with_expiration("ttl", "100", b"short"));
    c.feed(&with_expiration("plain", "100", b"own"));
    c.publish("plain", b"forever");
    now.store(1_000_600, Ordering::Relaxed);
    c.publish("ttl", b"new");
    now.store(1_001_200, Ordering::Relaxed);
    let out = c.consume("ttl", false);
    assert_eq!(delivered_bodies(&out), [b"new".to_vec()]);
    assert_eq!(c.stats("ttl").acked, 2, "the expired two dropped");
    let get = basic::Get {
        queue: "plain".into(),
        no_ack: true,
    };
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Get(get.clone()))]);
    assert_eq!(delivered_bodies(&out), [b"forever".to_vec()]);
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Get(get))]);
    assert!(
        matches!(
            &out[..],
            [AMQPFrame::Method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::GetEmpty(_))
            )]
        ),
        "{out:?}"
    );
    assert_eq!(c.conn.metrics().ttl_expired.get(), 3);
    // An expiration that is no number of milliseconds is RabbitMQ's 406.
    let out = c.feed(&with_expiration("plain", "soon", b"x"));
    assert_eq!(channel_close_code(&out), Some(406));
    // A redeclare names the same TTL.
    let redeclare = queue::Declare {
        queue: "ttl".into(),
        ..queue::Declare::default()
    };
    c.feed(&[
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        ),
        method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        ),
    ]);
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(redeclare))]);
    assert_eq!(channel_close_code(&out), Some(406));
}

#[test]
fn a_queue_name_with_bytes_the_broker_does_not_take_is_served_under_its_own_name() {
    let mut c = Client::open();
    let name = "celery@host.celery/pidbox café";
    let declare = queue::Declare {
        queue: name.into(),
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(declare))]);
    let Some(AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))) =
        out.first()
    else {
        panic!("expected declare-ok, got {out:?}");
    };
    assert_eq!(ok.queue.as_str(), name);
    let kept = crate::names::engine(name);
    assert!(kept.starts_with(crate::names::ESCAPED), "{kept}");
    assert!(c.broker.queue(&kept).is_some());
    // Published through the default exchange and through a binding, delivered with the
    // name it was published to.
    c.publish(name, b"direct");
    let bind = queue::Bind {
        queue: name.into(),
        exchange: "amq.direct".into(),
        routing_key: "k".into(),
        ..queue::Bind::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Bind(bind))]);
    let mut frames = Client::publish_frames("k", BasicProperties::default(), b"bound");
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(publish))) =
        &mut frames[0]
    else {
        unreachable!("publish_frames starts with basic.publish");
    };
    publish.exchange = "amq.direct".into();
    c.feed(&frames);
    let out = c.consume(name, true);
    let keys: Vec<String> = (out.iter())
        .filter_map(|f| match f {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                Some(d.routing_key.to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(keys, [name, "k"]);
    assert_eq!(
        delivered_bodies(&out),
        [b"direct".to_vec(), b"bound".to_vec()]
    );
    // A name that looks escaped is a client's own name too: the escaped form of this
    // queue's name names another queue, which does not exist, also for a publish in the
    // same read as one to this queue.
    let mut frames = Client::publish_frames(name, BasicProperties::default(), b"again");
    frames.extend(Client::publish_frames(
        &kept,
        BasicProperties::default(),
        b"elsewhere",
    ));
    c.feed(&frames);
    assert_eq!(c.stats(&kept).enqueued, 3, "the first publish only");
    let passive = queue::Declare {
        queue: kept.as_ref().into(),
        passive: true,
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(passive))]);
    assert_eq!(channel_close_code(&out), Some(404));
}

#[test]
fn expired_messages_at_the_head_do_not_hold_a_prefetch_of_one() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    for body in [b"old1", b"old2", b"old3"] {
        c.publish("ttl", body);
    }
    now.store(1_002_000, Ordering::Relaxed);
    c.publish("ttl", b"fresh");
    c.prefetch(1);
    // Each expired delivery is acked as the output goes, which frees the one credit for
    // the next: the fresh message comes within as many turns of the connection.
    let mut bodies = delivered_bodies(&c.consume("ttl", false));
    for _ in 0..4 {
        bodies.extend(delivered_bodies(&c.feed(&[])));
    }
    assert_eq!(bodies, [b"fresh".to_vec()]);
    assert_eq!(c.stats("ttl").acked, 3);
}

/// A field table of `arguments`.
fn table(arguments: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert((*key).into(), value.clone());
    }
    table
}

impl Client {
    /// Declares `queue` with `arguments`.
    fn declare_with(&mut self, queue: &str, arguments: &[(&str, AMQPValue)]) -> Vec<AMQPFrame> {
        let declare = queue::Declare {
            queue: queue.into(),
            arguments: table(arguments),
            ..queue::Declare::default()
        };
        self.feed(&[queue_method(queue::AMQPMethod::Declare(declare))])
    }

    /// Does what the server's message-expiry task does at `now` (`message_expiry::run`),
    /// with the server's clock set to `now`: dead-letters the deliveries handed over, and
    /// looks at the heads of the queues due. Returns the names looked at, and the next
    /// deadline.
    fn expire_at(
        &mut self,
        now: u64,
        clock: &std::sync::atomic::AtomicU64,
    ) -> (Vec<String>, Option<u64>) {
        use crate::message_expiry::{expire, look_at_head};
        clock.store(now, Ordering::Relaxed);
        let settings = self.conn.settings.clone();
        let expiry = &settings.message_expiry;
        let (due, _) = expiry.due(now);
        for (queue, delivery) in due.handed {
            assert!(expire(&settings, &self.broker, &queue, &delivery));
        }
        let mut looked = Vec::new();
        for look in due.queues {
            let next = look_at_head(&settings, &self.broker, &look);
            expiry.looked(&look.queue, next);
            looked.push(look.queue.name().to_string());
        }
        (looked, expiry.due(now).1)
    }
}

#[test]
fn a_head_stored_with_an_expiration_past_ten_years_never_expires() {
    // A build from before expirations were capped at ten years stored this one: read as
    // no expiration at all (an arrival plus it would pass the end of time).
    let (mut c, now) = Client::with_clock();
    c.declare("forever");
    let properties = BasicProperties::default().with_expiration("18446744073709551615".into());
    let mut body = crate::content::encode(&properties, b"kept")
        .unwrap()
        .to_vec();
    crate::content::stamp(&mut body, 1_000_000, true);
    let queue = c.broker.queue("forever").unwrap();
    queue.put(leasemq::Message::new(body)).unwrap();
    c.conn.settings.message_expiry.published(&queue, true);
    // Handed back unseen, and looked at again a second later, as any head that does not
    // expire in a queue messages with an expiration went to.
    for at in [2_000_000, 2_001_000] {
        let looked = (vec!["forever".to_string()], Some(at + 1_000));
        assert_eq!(c.expire_at(at, &now), looked);
    }
    assert_eq!(queue.stats().ready, 1);
}

#[test]
fn a_queue_nobody_consumes_dead_letters_each_message_as_its_ttl_runs_out_at_the_head() {
    let (mut c, now) = Client::with_clock();
    c.declare("work");
    let text = |s: &str| AMQPValue::LongString(s.into());
    c.declare_with(
        "delay",
        &[
            ("x-message-ttl", AMQPValue::LongInt(1_000)),
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text("work")),
        ],
    );
    let holding = crate::dead_letter::holding_name("delay");
    // Watched from its declare: looked at once, and found empty.
    assert_eq!(
        c.expire_at(1_000_000, &now),
        (vec!["delay".to_string()], None)
    );
    c.publish("delay", b"first");
    c.publish("delay", b"second");
    now.store(1_000_400, Ordering::Relaxed);
    for body in [&b"third"[..], b"fourth", b"fifth"] {
        c.publish("delay", body);
    }
    // The publishes poked it: its head has 1 000 ms left, so it is handed back unseen
    // and looked at again when that is up (it expires once the clock is past it).
    assert_eq!(
        c.expire_at(1_000_500, &now),
        (vec!["delay".to_string()], Some(1_001_001))
    );
    assert_eq!(c.stats("delay").ready, 5);
    assert_eq!(c.expire_at(1_001_000, &now), (vec![], Some(1_001_001)));
    // Both first messages go to the holding queue, with no death record (an expiry),
    // and the third is due next. (The first was taken alone; the next four together,
    // and the three with time left handed back in their order.)
    assert_eq!(
        c.expire_at(1_001_001, &now),
        (vec!["delay".to_string()], Some(1_001_401))
    );
    let stats = c.stats("delay");
    assert_eq!((stats.ready, stats.acked), (3, 2));
    assert_eq!(c.stats(&holding).ready, 2);
    assert_eq!(c.conn.metrics().ttl_expired.get(), 2);
    // Those were never delivered: handed back unseen, none is a redelivery.
    let out = c.consume("delay", false);
    let tag = consumer_tag(&out);
    assert_eq!(
        deliveries(&out),
        [
            (1, false, b"third".to_vec()),
            (2, false, b"fourth".to_vec()),
            (3, false, b"fifth".to_vec())
        ]
    );
    c.feed(&[ack(3, true)]);
    // While it has a consumer, a look leaves it to that consumer: looked at again later.
    let delay = || vec!["delay".to_string()];
    assert_eq!(c.expire_at(1_001_401, &now), (delay(), Some(1_002_401)));
    // Found holding nothing once the consumer went, and disarmed.
    c.feed(&[cancel(&tag)]);
    assert_eq!(c.expire_at(1_002_401, &now), (delay(), None));
    assert_eq!(c.expire_at(1_002_402, &now), (vec![], None));
    // A publish arms it again (stamped 1 002 402, the clock's last setting).
    c.publish("delay", b"fourth");
    assert_eq!(c.expire_at(1_002_500, &now), (delay(), Some(1_003_403)));
    // The holding queue's dead letters are the messages as they were stored, with no
    // death record: what its task reads as an expiry in `delay`.
    let held = c.broker.queue(&holding).unwrap();
    let held = held
        .consume("test", ConsumerConfig { prefetch: 10 })
        .unwrap();
    for body in [&b"first"[..], b"second"] {
        let letter = held.try_recv().unwrap().expect("held");
        assert_eq!(letter.envelope().death, None);
        let delivered = crate::content::delivered(letter.envelope(), "delay");
        assert_eq!(&delivered.payload[..], body);
    }
}

#[test]
fn a_queue_with_a_ttl_and_no_consumer_drops_what_expires_at_its_head() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.publish("ttl", b"old");
    c.publish("ttl", b"older");
    let ttl = || vec!["ttl".to_string()];
    assert_eq!(c.expire_at(1_000_000, &now), (ttl(), Some(1_001_001)));
    assert_eq!(c.expire_at(1_001_001, &now), (ttl(), None));
    let stats = c.stats("ttl");
    assert_eq!((stats.ready, stats.acked), (0, 2));
    assert_eq!(c.conn.metrics().ttl_expired.get(), 2);
}

#[test]
fn an_expired_message_met_by_a_get_or_a_consumer_is_dead_lettered_where_the_queue_says() {
    let (mut c, now) = Client::with_clock();
    let holding = c.declare_dead_lettering("jobs");
    let expiring = |body: &[u8]| {
        let properties = BasicProperties::default().with_expiration("100".into());
        Client::publish_frames("jobs", properties, body)
    };
    let jobs = || vec!["jobs".to_string()];
    assert_eq!(c.expire_at(1_000_000, &now), (jobs(), None));
    // With no TTL of its own, the queue is armed only by a message with one.
    c.publish("jobs", b"plain");
    assert_eq!(c.expire_at(1_000_000, &now), (vec![], None));
    c.feed(&expiring(b"by get"));
    // That one arms it; its head never expires, so the one behind waits (as in RabbitMQ),
    // and the queue is looked at again a second later.
    assert_eq!(c.expire_at(1_000_000, &now), (jobs(), Some(1_001_000)));
    assert_eq!(c.expire_at(1_000_500, &now), (vec![], Some(1_001_000)));
    now.store(1_000_200, Ordering::Relaxed);
    let out = c.feed(&[get("jobs", false)]);
    assert_eq!(delivered_bodies(&out), [b"plain".to_vec()]);
    c.feed(&[ack(1, false)]);
    let out = c.feed(&[get("jobs", false)]);
    assert!(delivered_bodies(&out).is_empty(), "{out:?}");
    assert_eq!(c.stats(&holding).ready, 1, "put there by the get");
    // A consumer's expired deliveries are handed over, never sent.
    c.feed(&expiring(b"by consumer 1"));
    c.feed(&expiring(b"by consumer 2"));
    c.publish("jobs", b"kept");
    now.store(1_000_400, Ordering::Relaxed);
    let out = c.consume("jobs", false);
    assert_eq!(delivered_bodies(&out), [b"kept".to_vec()]);
    assert_eq!(c.stats("jobs").leased, 3);
    c.expire_at(1_000_400, &now);
    assert_eq!(c.stats(&holding).ready, 3);
    let stats = c.stats("jobs");
    assert_eq!(
        (stats.leased, stats.acked),
        (1, 4),
        "three expired, one acked"
    );
    assert_eq!(c.conn.metrics().ttl_expired.get(), 3);
}

#[test]
fn a_message_with_its_own_expiration_leaves_any_queue_at_the_head() {
    let (mut c, now) = Client::with_clock();
    c.declare("plain");
    c.publish("plain", b"kept");
    assert_eq!(c.expire_at(1_000_000, &now), (vec![], None), "not watched");
    let properties = BasicProperties::default().with_expiration("100".into());
    c.feed(&Client::publish_frames("plain", properties, b"short"));
    // Watched from that publish on. Its head never expires, and the one behind waits for
    // it; messages with their own expiration were published, so it is looked at again.
    let plain = || vec!["plain".to_string()];
    assert_eq!(c.expire_at(1_000_200, &now), (plain(), Some(1_001_200)));
    let out = c.feed(&[get("plain", true)]);
    assert_eq!(delivered_bodies(&out), [b"kept".to_vec()]);
    assert_eq!(c.expire_at(1_001_200, &now), (plain(), None));
    let stats = c.stats("plain");
    assert_eq!((stats.ready, stats.acked), (0, 2), "dropped at the head");
}

#[test]
fn a_watched_queue_with_a_consumer_is_left_to_it() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.prefetch(1);
    c.publish("ttl", b"in hand");
    c.consume("ttl", false);
    c.publish("ttl", b"waiting");
    let ttl = || vec!["ttl".to_string()];
    // Past its time, but a look would take it from under the consumer.
    assert_eq!(c.expire_at(1_002_000, &now), (ttl(), Some(1_003_000)));
    let stats = c.stats("ttl");
    assert_eq!((stats.ready, stats.delivered), (1, 1), "untouched");
    // The consumer meets it when it reaches it, and drops it.
    c.feed(&[ack(1, false)]);
    assert_eq!(c.stats("ttl").acked, 2);
}

#[test]
fn an_expired_delivery_returned_before_it_is_dead_lettered_is_dead_lettered_once() {
    let (mut c, now) = Client::with_clock();
    let holding = c.declare_dead_lettering("jobs");
    let properties = BasicProperties::default().with_expiration("100".into());
    c.feed(&Client::publish_frames("jobs", properties, b"late"));
    now.store(1_000_200, Ordering::Relaxed);
    // The consumer meets it expired and hands it over; its cancel returns it (as after a
    // lease that ran out) before the handed delivery is dead-lettered.
    let tag = consumer_tag(&c.consume("jobs", false));
    c.feed(&[cancel(&tag)]);
    assert_eq!(c.stats("jobs").ready, 1);
    // The handed delivery's ack does not take, so it is not dead-lettered; the message,
    // back at the head of a queue nobody consumes, is: once.
    c.expire_at(1_000_200, &now);
    assert_eq!(c.stats(&holding).ready, 1);
    assert_eq!(c.stats("jobs").ready, 0);
    c.expire_at(1_001_200, &now);
    assert_eq!(c.stats(&holding).ready, 1);
}

#[test]
fn a_single_active_consumer_has_the_queue_until_it_goes_then_the_next_in_line() {
    let mut c = Client::open();
    let sac = [("x-single-active-consumer", AMQPValue::Boolean(true))];
    c.declare_with("sac", &sac);
    let mut second = c.another(2);
    let mut third = c.another(3);
    c.consume("sac", false);
    second.consume("sac", false);
    let third_tag = consumer_tag(&third.consume("sac", false));
    for body in [&b"1"[..], b"2", b"3"] {
        second.publish("sac", body);
    }
    let bodies = |out: &[AMQPFrame]| delivered_bodies(out);
    assert_eq!(
        bodies(&c.feed(&[])),
        [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
    );
    assert!(bodies(&second.feed(&[])).is_empty(), "waits its turn");
    assert!(bodies(&third.feed(&[])).is_empty());
    // Each counts, the waiting ones too.
    let passive = queue::Declare {
        queue: "sac".into(),
        passive: true,
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(passive))]);
    let AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(ok.consumer_count, 3);
    // One waiting that goes leaves the line; the active one's channel closes with its
    // deliveries unacked: they come back, and the next in line gets them, redelivered.
    third.feed(&[cancel(&third_tag)]);
    c.feed(&[ack(1, false)]);
    c.feed(&[close_channel()]);
    // Its turn has come, its broker consumer not made yet: the queue is still in use.
    let delete = queue::Delete {
        queue: "sac".into(),
        if_unused: true,
        ..queue::Delete::default()
    };
    let out = third.feed(&[queue_method(queue::AMQPMethod::Delete(delete))]);
    assert_eq!(channel_close_code(&out), Some(406));
    let out = second.feed(&[]);
    assert_eq!(
        deliveries(&out),
        [(1, true, b"2".to_vec()), (2, true, b"3".to_vec())]
    );
    // A redeclare must say the same.
    let out = c.another(4).declare_with("sac", &[]);
    assert_eq!(channel_close_code(&out), Some(406));
}

/// `channel.close` of channel 1 by the client, 200.
fn close_channel() -> AMQPFrame {
    let close = channel::Close {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    };
    method(1, AMQPClass::Channel(channel::AMQPMethod::Close(close)))
}

fn tx_method(m: amq_protocol::protocol::tx::AMQPMethod) -> AMQPFrame {
    method(1, AMQPClass::Tx(m))
}

#[test]
fn a_transaction_holds_publishes_and_settles_until_its_commit() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare("tx.jobs");
    c.publish("tx.jobs", b"before");
    let out = c.feed(&[get("tx.jobs", false)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.delivery_tag == 1
    ));
    let out = c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::SelectOk(tx::SelectOk {}))]);
    // Held: nothing is put or acked before the commit.
    c.publish("tx.jobs", b"one");
    c.publish("tx.jobs", b"two");
    assert!(c.feed(&[ack(1, false)]).is_empty());
    assert_eq!(
        (c.stats("tx.jobs").ready, c.stats("tx.jobs").leased),
        (0, 1)
    );
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}))]);
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (2, 0, 1));
    // A rollback drops the publishes and gives the settled deliveries back to the channel,
    // to be settled again; nothing is requeued.
    let out = c.feed(&[get("tx.jobs", false)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.delivery_tag == 2
    ));
    c.publish("tx.jobs", b"dropped");
    c.feed(&[ack(2, false)]);
    let out = c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(
        out,
        [tx_method(tx::AMQPMethod::RollbackOk(tx::RollbackOk {}))]
    );
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (1, 1, 1));
    c.feed(&[ack(2, false)]);
    // Acking a tag twice in one transaction is RabbitMQ's 406, at the second ack.
    let out = c.feed(&[ack(2, false)]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    // The channel closed with the transaction: its held ack went with it, and the
    // delivery came back to its queue.
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (2, 0, 1));
}

#[test]
fn tx_and_confirms_do_not_mix_and_a_commit_needs_tx_select() {
    use amq_protocol::protocol::{confirm, tx};
    let mut c = Client::open();
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    let out = c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    let confirm_select = method(
        1,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        })),
    );
    c.feed(std::slice::from_ref(&confirm_select));
    let out = c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    let out = c.feed(&[confirm_select]);
    assert_eq!(channel_close_code(&out), Some(406));
}

#[test]
fn a_commit_to_a_full_queue_drops_what_does_not_fit_and_a_transaction_is_bounded() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare_rejecting_over("tx.small", 1);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.publish("tx.small", b"fits");
    c.publish("tx.small", b"refused");
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}))]);
    assert_eq!(c.stats("tx.small").ready, 1);
    // What transactions hold on a connection is bounded.
    c.declare("tx.big");
    let body = vec![7u8; 4 << 20];
    let mut code = None;
    for _ in 0..(super::tx::HELD_BYTES / body.len() + 1) {
        // The body in frames that fit frame_max.
        let mut frames = Client::publish_frames("tx.big", BasicProperties::default(), &[]);
        let Some(AMQPFrame::Header(_, header)) = frames.last_mut() else {
            panic!("publish, then its header");
        };
        header.body_size = body.len() as u64;
        frames.extend(
            body.chunks(8000)
                .map(|chunk| AMQPFrame::Body(1, chunk.to_vec())),
        );
        let out = c.feed(&frames);
        assert_eq!(connection_close_code(&out), None);
        code = channel_close_code(&out);
        if code.is_some() {
            break;
        }
    }
    assert_eq!(code, Some(406));
    assert_eq!(c.stats("tx.big").ready, 0, "nothing was committed");
}

#[test]
fn a_cancel_keeps_the_leases_whose_settles_a_transaction_holds() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    let select = tx_method(tx::AMQPMethod::Select(tx::Select {}));
    let commit = tx_method(tx::AMQPMethod::Commit(tx::Commit {}));
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    // One ack held before the cancel and one after; then both held before it.
    let cases = [("tx.cancel.some", 1), ("tx.cancel.all", 2)];
    let mut consumers = Vec::new();
    for (queue, _) in cases {
        c.declare(queue);
        c.publish(queue, b"a");
        c.publish(queue, b"b");
        let out = c.consume(queue, false);
        let tags: Vec<u64> = deliveries(&out).iter().map(|d| d.0).collect();
        assert_eq!(tags.len(), 2);
        consumers.push((consumer_tag(&out), tags));
    }
    c.feed(&[select]);
    for ((queue, acks_before), (consumer, tags)) in cases.into_iter().zip(consumers) {
        for &tag in &tags[..acks_before] {
            assert!(c.feed(&[ack(tag, false)]).is_empty());
        }
        c.feed(&[cancel(&consumer)]);
        for &tag in &tags[acks_before..] {
            assert!(c.feed(&[ack(tag, false)]).is_empty());
        }
        // The leases stayed the channel's: both acks count, nothing comes back.
        assert_eq!(
            c.feed(std::slice::from_ref(&commit)),
            std::slice::from_ref(&commit_ok)
        );
        let stats = c.stats(queue);
        assert_eq!(
            (stats.acked, stats.leased, stats.ready),
            (2, 0, 0),
            "{queue}"
        );
    }
}

#[test]
fn basic_recover_on_a_transactional_channel_requeues_at_once() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare("tx.recover");
    c.publish("tx.recover", b"again");
    c.feed(&[get("tx.recover", false)]);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    let recover = basic::AMQPMethod::Recover(basic::Recover { requeue: true });
    c.feed(&[basic_method(1, recover)]);
    let stats = c.stats("tx.recover");
    assert_eq!((stats.ready, stats.leased), (1, 0), "not held to a commit");
    // A rollback does not take it back.
    c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(c.stats("tx.recover").ready, 1);
}

#[test]
fn commit_ok_waits_for_the_answers_of_the_committed_puts() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    // A bounded queue: its puts are awaited, as a durable queue's are.
    c.declare_rejecting_over("tx.awaited", 10);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.publish("tx.awaited", b"one");
    let commit = encode(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    c.conn.handle_input(&commit);
    assert!(c.conn.awaits_answers(), "the put went out awaited");
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no commit-ok before the put is answered"
    );
    // The answer comes from the shard's thread.
    while c.conn.awaits_answers() {
        c.conn.try_answers();
        std::thread::yield_now();
    }
    c.conn.take_output(&mut out);
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    assert_eq!(decode(&out), [commit_ok]);
    assert_eq!(c.stats("tx.awaited").ready, 1);
}

/// The bodies of the deliveries and `get-ok`s in `out`, in order, as text.
fn delivered_texts(out: &[AMQPFrame]) -> Vec<String> {
    (delivered_bodies(out).into_iter())
        .map(|body| String::from_utf8(body).expect("text"))
        .collect()
}

#[test]
fn a_priority_queue_delivers_its_highest_level_first_and_in_order_within_a_level() {
    let mut c = Client::open();
    let out = c.declare_with("prio", &[("x-max-priority", AMQPValue::ShortShortUInt(5))]);
    assert_eq!(channel_close(&out), None);
    // Published with no consumer: every one waits, and each level keeps its order.
    let publish = |c: &mut Client, body: &str, priority: Option<u8>| {
        let mut properties = BasicProperties::default();
        if let Some(p) = priority {
            properties = properties.with_priority(p);
        }
        c.feed(&Client::publish_frames("prio", properties, body.as_bytes()));
    };
    for (body, priority) in [
        ("none 1", None),
        ("3 a", Some(3)),
        ("9", Some(9)),
        ("5", Some(5)),
        ("3 b", Some(3)),
        ("0", Some(0)),
        ("255", Some(255)),
        ("none 2", None),
    ] {
        publish(&mut c, body, priority);
    }
    // Above the maximum counts as the maximum; no priority as 0.
    let out = c.feed(&[get("prio", false)]);
    assert_eq!(delivered_texts(&out), ["9"]);
    assert_eq!(
        *first_properties(&out).priority(),
        Some(9),
        "delivered with its priority as published"
    );
    // A requeued message goes back to its level, ahead of the lower ones.
    c.feed(&[nack(1, true)]);
    let out = c.feed(&[get("prio", true)]);
    assert_eq!(delivered_texts(&out), ["9"]);
    assert_eq!(delivered_texts(&c.feed(&[get("prio", true)])), ["5"]);
    // The rest through a consumer with a prefetch of 2: a message published while it
    // holds two goes ahead of the lower ones still waiting.
    c.prefetch(2);
    let out = c.consume("prio", false);
    assert_eq!(delivered_texts(&out), ["255", "3 a"]);
    publish(&mut c, "4", Some(4));
    let mut got = Vec::new();
    let mut tags = deliveries(&out);
    while let Some(&(last, _, _)) = tags.last() {
        let out = c.feed(&[ack(last, true)]);
        got.extend(delivered_texts(&out));
        tags = deliveries(&out);
    }
    assert_eq!(got, ["4", "3 b", "none 1", "0", "none 2"]);
    assert_eq!(c.stats("prio").acked, 9);
}

#[test]
fn x_max_priority_is_refused_past_255_and_a_redeclare_must_repeat_it() {
    let mut c = Client::open();
    for (value, why) in [
        (AMQPValue::LongInt(256), "{max_value_exceeded,256}"),
        (AMQPValue::LongInt(-1), "{value_negative,-1}"),
        (
            AMQPValue::LongString("5".into()),
            "\"expected integer, got longstr\"",
        ),
    ] {
        let out = c.declare_with("prio.bad", &[("x-max-priority", value)]);
        let expected = format!(
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'prio.bad' in vhost '/': {why}"
        );
        assert_eq!(channel_close(&out), Some((406, expected)));
        c.reopen();
    }
    assert!(c.broker.queue("prio.bad").is_none());
    // 0 is one level; any integer type says the same.
    let out = c.declare_with(
        "prio.one",
        &[("x-max-priority", AMQPValue::ShortShortUInt(0))],
    );
    assert_eq!(channel_close(&out), None);
    let max = |value| [("x-max-priority", value)];
    c.declare_with("prio.eq", &max(AMQPValue::LongInt(10)));
    let out = c.declare_with("prio.eq", &max(AMQPValue::ShortShortUInt(10)));
    assert_eq!(channel_close(&out), None, "the same value, another width");
    let head =
        "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'prio.eq' in vhost '/'";
    let out = c.declare_with("prio.eq", &max(AMQPValue::LongInt(4)));
    let text = format!("{head}: received '4' but current is '10'");
    assert_eq!(channel_close(&out), Some((406, text)));
    c.reopen();
    let out = c.declare_with("prio.eq", &[]);
    let text = format!("{head}: received none but current is the value '10' of type 'signedint'");
    assert_eq!(channel_close(&out), Some((406, text)));
    c.reopen();
    c.declare_with("prio.plain", &[]);
    let out = c.declare_with("prio.plain", &max(AMQPValue::LongInt(10)));
    let code = channel_close_code(&out);
    assert_eq!(code, Some(406), "a queue without priorities stays so");
}

impl Client {
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

/// The consumer tag and body of each `basic.deliver` in `out`.
fn deliveries_by_consumer(out: &[AMQPFrame]) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    for frame in out {
        match frame {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                found.push((d.consumer_tag.to_string(), String::new()));
            }
            AMQPFrame::Body(1, body) => {
                let text = std::str::from_utf8(body).expect("a text body");
                found.last_mut().expect("a deliver first").1.push_str(text);
            }
            _ => {}
        }
    }
    found
}

#[test]
fn x_priority_serves_the_highest_consumer_with_room_first() {
    let mut c = Client::open();
    c.declare("cprio");
    c.prefetch(1);
    let low =
        consumer_tag(&c.consume_with("cprio", &[("x-priority", AMQPValue::ShortShortInt(-2))]));
    let plain = consumer_tag(&c.consume_with("cprio", &[]));
    let high =
        consumer_tag(&c.consume_with("cprio", &[("x-priority", AMQPValue::LongLongInt(10))]));
    let mut out = Vec::new();
    for body in ["a", "b", "c", "d"] {
        out.extend(c.feed(&Client::publish_frames(
            "cprio",
            BasicProperties::default(),
            body.as_bytes(),
        )));
    }
    let expected = [(&high, "a"), (&plain, "b"), (&low, "c")];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(t, b)| ((*t).clone(), b.to_string()))
        .collect();
    assert_eq!(deliveries_by_consumer(&out), expected, "d waits for room");
    // The high one's ack makes room there first.
    let out = c.feed(&[ack(1, false)]);
    assert_eq!(deliveries_by_consumer(&out), [(high, "d".to_string())]);
}

#[test]
fn consumer_arguments_are_checked_as_rabbitmq_checks_them() {
    let mut c = Client::open();
    c.declare("cargs");
    for (key, value, why) in [
        (
            "x-priority",
            AMQPValue::LongString("5".into()),
            "\"expected integer, got longstr\"",
        ),
        (
            "x-priority",
            AMQPValue::Boolean(true),
            "\"expected integer, got bool\"",
        ),
        (
            "x-cancel-on-ha-failover",
            AMQPValue::LongInt(1),
            "{unacceptable_type,signedint}",
        ),
    ] {
        let out = c.consume_with("cargs", &[(key, value)]);
        let text = format!(
            "PRECONDITION_FAILED - invalid arg '{key}' for queue 'cargs' in vhost '/': {why}"
        );
        assert_eq!(channel_close(&out), Some((406, text)));
        c.reopen();
    }
    assert_eq!(
        c.stats("cargs").consumers,
        0,
        "a refused consume registers nothing"
    );
    // Both wrong: x-priority is the one named, as RabbitMQ checks it first; an argument
    // not served, whatever its name, counts only after them.
    let both = [
        ("x-cancel-on-ha-failover", AMQPValue::LongInt(1)),
        ("x-priority", AMQPValue::Boolean(true)),
        ("a-first-key", AMQPValue::LongInt(0)),
    ];
    let out = c.consume_with("cargs", &both);
    let (code, text) = channel_close(&out).expect("a channel error");
    assert_eq!(code, 406);
    assert!(text.contains("'x-priority'"), "{text}");
    c.reopen();
    // Priorities beyond 32 bits are told apart, as RabbitMQ compares them: 2^41 above
    // 2^40 (neither clamped to the same value nor wrapped).
    c.prefetch(1);
    let lower = [("x-priority", AMQPValue::LongLongInt(1 << 40))];
    let one = consumer_tag(&c.consume_with("cargs", &lower));
    let served = [
        ("x-cancel-on-ha-failover", AMQPValue::Boolean(true)),
        ("x-priority", AMQPValue::LongLongInt(1 << 41)),
    ];
    let out = c.consume_with("cargs", &served);
    assert_eq!(channel_close(&out), None);
    let huge = consumer_tag(&out);
    let out = c.feed(&Client::publish_frames(
        "cargs",
        BasicProperties::default(),
        b"a",
    ));
    assert_eq!(deliveries_by_consumer(&out), [(huge, "a".to_string())]);
    let out = c.feed(&Client::publish_frames(
        "cargs",
        BasicProperties::default(),
        b"b",
    ));
    assert_eq!(deliveries_by_consumer(&out), [(one, "b".to_string())]);
    // A missing queue is a 404 before its arguments are looked at.
    let out = c.consume_with("nowhere", &[("x-priority", AMQPValue::Boolean(true))]);
    assert_eq!(channel_close_code(&out), Some(404));
    c.reopen();
    // The reply-to pseudo-queue: refused before its queue is made, so none is left.
    let queues = c.broker.queue_names().len();
    let bad = [("x-priority", AMQPValue::Boolean(true))];
    let out = c.consume_with("amq.rabbitmq.reply-to", &bad);
    let text = "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'amq.rabbitmq.reply-to' \
                in vhost '/': \"expected integer, got bool\"";
    assert_eq!(channel_close(&out), Some((406, text.to_string())));
    assert_eq!(c.broker.queue_names().len(), queues, "no reply queue made");
    c.reopen();
    // Any other argument is refused, not ignored.
    let out = c.consume_with("cargs", &[("x-stream-offset", AMQPValue::LongInt(0))]);
    assert_eq!(connection_close_code(&out), Some(540));
}

#[test]
fn a_reused_consumer_tag_is_530_before_the_arguments_are_looked_at() {
    let mut c = Client::open();
    c.declare("ctag");
    let consume = basic::Consume {
        queue: "ctag".into(),
        consumer_tag: "mine".into(),
        ..basic::Consume::default()
    };
    c.feed(&[basic_method(1, basic::AMQPMethod::Consume(consume.clone()))]);
    let mut again = consume;
    (again.arguments).insert("x-priority".into(), AMQPValue::Boolean(true));
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Consume(again))]);
    assert_eq!(connection_close_code(&out), Some(530));
}
