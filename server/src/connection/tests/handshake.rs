//! The handshake and framing: credentials, the protocol header, frame and table limits, malformed input, methods on the wrong channel.

use super::*;

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
    let settings = Settings::default();
    let vhost = Arc::new(VHost::new(&settings));
    let vhosts = VHosts::one(vhost);
    let conn = Connection::new(broker.clone(), Arc::new(settings), vhosts, 1, false);
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
fn a_frame_over_frame_max_ends_the_connection_with_501() {
    let mut c = Client::open();
    let frames = Client::publish_frames("jobs", BasicProperties::default(), &[0; 9000]);
    let out = c.feed(&frames);
    assert_eq!(connection_close_code(&out), Some(501));
    assert!(c.conn.is_closed());
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
