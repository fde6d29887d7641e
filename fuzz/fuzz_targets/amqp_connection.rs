//! leasemqd's connection state machine fed arbitrary bytes (contract §8: malformed or
//! oversized frames close that connection only, never a panic).
//!
//! The first input byte picks how the connection starts: odd, it is taken through the
//! handshake (protocol header, `start-ok`, `tune-ok` with a small `frame_max`, `open`,
//! `channel.open` 1) so that the rest reaches the channel methods; even, the rest is all
//! there is. The rest is fed in pieces whose sizes the input also chooses, as reads from a
//! socket come; the answers to its awaited puts and every delivery its consumers receive
//! are handed to it. The first byte's next two bits raise the server's memory alarm from
//! the start and have the client ask to hear of it (`connection.blocked`), and its fourth
//! raises the disk alarm; a piece of length 0 turns the memory alarm over, and the connection is given the chance to unblock
//! before each piece, as the driver does.
//! The target checks that `handle_input` never claims more bytes than it was given, that
//! what the server writes parses as AMQP frames, and that nothing panics. The broker is
//! shared by every input and runs under the manual clock.

#![no_main]

use std::sync::{Arc, OnceLock};

use amq_protocol::frame::{gen_frame, parse_frame, AMQPFrame, ProtocolVersion, WriteContext};
use amq_protocol::protocol::{channel, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};
use leasemq::Broker;
use leasemq_server::alarms::{Alarms, Resource};
use leasemq_server::{Connection, Settings, VHost};
use libfuzzer_sys::fuzz_target;

fn broker() -> &'static Broker {
    static BROKER: OnceLock<Broker> = OnceLock::new();
    BROKER.get_or_init(|| {
        Broker::builder()
            .shards(2)
            .manual_clock()
            .build()
            .expect("a manual-clock broker")
    })
}

/// The client's side of the handshake; `hears_blocked`: it announces the
/// `connection.blocked` capability.
fn handshake(hears_blocked: bool) -> Vec<u8> {
    let conn = |m| AMQPFrame::Method(0, AMQPClass::Connection(m));
    let mut client_properties = FieldTable::default();
    if hears_blocked {
        let mut capabilities = FieldTable::default();
        capabilities.insert("connection.blocked".into(), AMQPValue::Boolean(true));
        client_properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
    }
    let frames = [
        AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1()),
        conn(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties,
            mechanism: "PLAIN".into(),
            response: "\0guest\0guest".into(),
            locale: "en_US".into(),
        })),
        conn(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max: 8,
            frame_max: 4096,
            heartbeat: 0,
        })),
        conn(connection::AMQPMethod::Open(connection::Open {
            virtual_host: "/".into(),
        })),
        AMQPFrame::Method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        ),
    ];
    let mut bytes = Vec::new();
    for frame in &frames {
        bytes = gen_frame(frame)(WriteContext::from(bytes))
            .expect("the handshake encodes")
            .into_inner()
            .0;
    }
    bytes
}

/// Checks that what the server wrote is whole AMQP frames.
fn check_output(conn: &mut Connection) {
    let mut out = Vec::new();
    conn.take_output(&mut out);
    let mut rest = &out[..];
    while !rest.is_empty() {
        match parse_frame(rest) {
            Ok((next, _)) => rest = next,
            Err(e) => panic!("the server wrote a frame that does not parse: {e:?}"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let alarm = Arc::new(Alarms::default());
    alarm.set(Resource::Memory, mode & 2 != 0);
    alarm.set(Resource::Disk, mode & 8 != 0);
    let settings = Arc::new(Settings {
        alarms: Arc::clone(&alarm),
        ..Settings::default()
    });
    let vhost = Arc::new(VHost::new(&settings));
    let vhosts = leasemq_server::vhost::VHosts::one(vhost);
    let mut conn = Connection::new(broker().clone(), settings, vhosts, 1, true);
    let mut input = if mode % 2 == 1 {
        handshake(mode & 4 != 0)
    } else {
        Vec::new()
    };
    let mut pieces = rest;
    // Pieces: a length byte, then that many bytes (or what is left).
    while let Some((&len, tail)) = pieces.split_first() {
        let take = usize::from(len).min(tail.len());
        input.extend_from_slice(&tail[..take]);
        pieces = &tail[take..];
        if len == 0 {
            alarm.set(Resource::Memory, !alarm.is_raised(Resource::Memory));
        }
        conn.unblock();
        let used = conn.handle_input(&input);
        assert!(used <= input.len(), "used more bytes than it was given");
        input.drain(..used);
        conn.try_answers();
        while let Some((i, d)) = conn.try_delivery() {
            conn.handle_delivery(i, d);
        }
        check_output(&mut conn);
        if conn.is_closed() {
            break;
        }
    }
    // Dropping it returns whatever it held, as a vanished socket does.
    drop(conn);
});
