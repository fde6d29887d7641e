//! Limits on what one connection takes: the resource alarms, the output budget of a read, large bodies, publishers whose puts wait.

use super::*;

/// RabbitMQ's memory alarm: a publish met while it is raised is not taken, the client is
/// told `connection.blocked`, and nothing more is read until the alarm clears; then
/// `connection.unblocked`, and the publish goes in.
#[test]
fn the_memory_alarm_blocks_a_publishing_connection_until_it_clears() {
    let alarm = Arc::new(Alarms::default());
    let mut c = hearing_blocked(&alarm);
    c.declare("jobs");
    alarm.set(Resource::Memory, true);
    let publish = blocked_publish(&mut c, "low on memory");
    assert!(c.conn.is_blocked() && !c.conn.wants_input());
    // Told once: the same input again while the alarm holds says nothing more.
    assert_eq!(c.conn.handle_input(&publish), 0);
    c.conn.unblock();
    assert!(c.conn.is_blocked());
    assert_eq!(c.conn.output_len(), 0);
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 0);

    alarm.set(Resource::Memory, false);
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

/// A publish to `jobs` fed to a connection under an alarm: not taken, and the client told
/// `connection.blocked` with `reason`. The publish's bytes, to feed again.
fn blocked_publish(c: &mut Client, reason: &str) -> Vec<u8> {
    let publish = encode(&Client::publish_frames(
        "jobs",
        BasicProperties::default(),
        b"job",
    ));
    assert_eq!(c.conn.handle_input(&publish), 0, "the publish is not taken");
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    let blocked = connection::Blocked {
        reason: reason.into(),
    };
    assert_eq!(
        decode(&out),
        [conn_method(connection::AMQPMethod::Blocked(blocked))]
    );
    publish
}

/// The disk alarm blocks as the memory alarm does, with RabbitMQ's reason; while both
/// are raised the connection stays blocked until the last one clears.
#[test]
fn the_disk_alarm_blocks_publishers_until_every_alarm_clears() {
    let alarm = Arc::new(Alarms::default());
    let mut c = hearing_blocked(&alarm);
    c.declare("jobs");
    alarm.set(Resource::Disk, true);
    alarm.set(Resource::Memory, true);
    let publish = blocked_publish(&mut c, "low on memory & disk");
    alarm.set(Resource::Memory, false);
    c.conn.unblock();
    assert!(c.conn.is_blocked(), "the disk alarm still holds");
    assert_eq!(c.conn.handle_input(&publish), 0);
    alarm.set(Resource::Disk, false);
    c.conn.unblock();
    assert!(!c.conn.is_blocked());
    c.feed_bytes(&publish);
    assert_eq!(c.broker.queue("jobs").unwrap().stats().ready, 1);
}

/// A connection that only consumes and acks is never blocked, and one that did not ask
/// to hear of it is blocked without being told.
#[test]
fn the_memory_alarm_lets_consumers_go_on_and_tells_only_who_asked() {
    let alarm = Arc::new(Alarms::default());
    let mut c = Client::open_with(Settings {
        alarms: Arc::clone(&alarm),
        ..Settings::default()
    });
    c.declare("work");
    c.feed(&Client::publish_frames(
        "work",
        BasicProperties::default(),
        b"a",
    ));
    alarm.set(Resource::Memory, true);
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
    assert!(
        (crate::connection::OUTPUT_PER_FEED..crate::connection::OUTPUT_PER_FEED + 300_000)
            .contains(&out.len())
    );
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
