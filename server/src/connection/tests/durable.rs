//! A broker with a data dir: the calls whose logs wait for the disk (a durable queue's
//! nacks, rejects and purges) are awaited, never blocked on, and what comes after them
//! waits for their answers.

use super::*;

fn passive(queue: &str) -> AMQPFrame {
    queue_method(queue::AMQPMethod::Declare(queue::Declare {
        queue: queue.into(),
        passive: true,
        ..queue::Declare::default()
    }))
}

fn ready_count(out: &[AMQPFrame]) -> u32 {
    match out {
        [AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))] => {
            ok.message_count
        }
        other => panic!("expected queue.declare-ok, got {other:?}"),
    }
}

#[test]
fn a_method_after_a_durable_nack_waits_for_it_and_sees_its_effect() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    assert!(c.broker.queue("jobs").unwrap().is_durable());
    for body in [b"a", b"b", b"c"] {
        c.publish("jobs", body);
    }
    let tags: Vec<u64> = deliveries(&c.consume("jobs", false))
        .iter()
        .map(|(tag, _, _)| *tag)
        .collect();
    assert_eq!(tags.len(), 3);
    // One read: a reject (dropped, no dead-letter exchange), a requeue, then a method that
    // must see both.
    let reject = basic_method(
        1,
        basic::AMQPMethod::Reject(basic::Reject {
            delivery_tag: tags[0],
            requeue: false,
        }),
    );
    let settles = encode(&[reject, nack(tags[1], true)]);
    let bytes = [settles.clone(), encode(&[passive("jobs")])].concat();
    let used = c.conn.handle_input(&bytes);
    assert_eq!(used, settles.len(), "the declare waits for the settles");
    assert!(c.conn.awaits_call() && !c.conn.wants_input());
    c.answered();
    assert!(!c.conn.awaits_call() && c.conn.wants_input());
    // The requeued message went back to the consumer; the declare counts none ready.
    let out = c.feed_bytes(&bytes[used..]);
    let declared: Vec<AMQPFrame> = (out.iter())
        .filter(|f| matches!(f, AMQPFrame::Method(_, AMQPClass::Queue(_))))
        .cloned()
        .collect();
    assert_eq!(ready_count(&declared), 0);
    let stats = c.stats("jobs");
    assert_eq!((stats.rejected, stats.nacked), (1, 1));
}

#[test]
fn a_durable_queues_purge_is_answered_once_its_log_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    for body in [b"a", b"b"] {
        c.publish("jobs", body);
    }
    let purge = queue_method(queue::AMQPMethod::Purge(queue::Purge {
        queue: "jobs".into(),
        ..queue::Purge::default()
    }));
    let bytes = encode(&[purge, passive("jobs")]);
    let used = c.conn.handle_input(&bytes);
    assert!(used < bytes.len(), "the declare waits for the purge");
    assert!(c.conn.awaits_call());
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no purge-ok before the log is written"
    );
    c.answered();
    c.conn.take_output(&mut out);
    let ok = queue::PurgeOk { message_count: 2 };
    assert_eq!(decode(&out), [queue_method(queue::AMQPMethod::PurgeOk(ok))]);
    assert_eq!(ready_count(&c.feed_bytes(&bytes[used..])), 0);
    // Kept on disk: the purge comes back with the queue.
    drop(c);
    let c = Client::open_durable(dir.path());
    assert_eq!(c.stats("jobs").ready, 0);
}

#[test]
fn a_get_from_a_durable_queue_is_answered_once_its_lease_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    for body in [b"a", b"b"] {
        c.publish("jobs", body);
    }
    let get_frame = encode(&[get("jobs", false)]);
    let bytes = [get_frame.clone(), encode(&[passive("jobs")])].concat();
    assert_eq!(
        c.conn.handle_input(&bytes),
        get_frame.len(),
        "the declare waits"
    );
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no get-ok before the call is answered"
    );
    c.answered();
    c.conn.take_output(&mut out);
    let out = decode(&out);
    assert!(matches!(
        &out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ok)))
            if ok.delivery_tag == 1 && ok.message_count == 1
    ));
    assert_eq!(delivered_bodies(&out), [b"a".to_vec()]);
    assert_eq!(ready_count(&c.feed_bytes(&bytes[get_frame.len()..])), 1);
    // Its lease is the channel's: acked, it is gone; a get with no ack takes the other.
    c.feed(&[ack(1, false)]);
    let out = c.feed(&[get("jobs", true)]);
    assert_eq!(delivered_bodies(&out), [b"b".to_vec()]);
    let out = c.feed(&[get("jobs", true)]);
    assert!(matches!(
        &out[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::GetEmpty(_))
        )]
    ));
    let stats = c.stats("jobs");
    assert_eq!((stats.acked, stats.ready, stats.leased), (2, 0, 0));
}

#[test]
fn a_consumer_of_a_durable_queue_starts_off_the_connections_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    c.publish("jobs", b"a");
    let consume = encode(&[basic_method(
        1,
        basic::AMQPMethod::Consume(basic::Consume {
            queue: "jobs".into(),
            consumer_tag: "worker".into(),
            ..basic::Consume::default()
        }),
    )]);
    let bytes = [consume.clone(), encode(&[passive("jobs")])].concat();
    assert_eq!(
        c.conn.handle_input(&bytes),
        consume.len(),
        "the declare waits"
    );
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no consume-ok before the consumer is made"
    );
    c.answered();
    let out = c.feed_bytes(&bytes[consume.len()..]);
    assert_eq!(consumer_tag(&out), "worker");
    assert_eq!(delivered_bodies(&out), [b"a".to_vec()]);
    // A second consumer on a single-active-consumer queue starts when the first goes.
    c.declare_with(
        "one",
        &[("x-single-active-consumer", AMQPValue::Boolean(true))],
    );
    c.publish("one", b"x");
    let first = consumer_tag(&c.consume("one", false));
    let mut second = c.another(2);
    let out = second.consume("one", false);
    assert!(delivered_bodies(&out).is_empty(), "waits its turn");
    c.feed(&[cancel(&first)]);
    c.feed(&[close_channel()]);
    // Its turn: its consumer is made off the thread, then the message comes.
    let mut got = Vec::new();
    for _ in 0..1_000 {
        let out = second.feed(&[]);
        got.extend(delivered_bodies(&out));
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got, [b"x".to_vec()]);
}

#[test]
fn a_durable_queue_is_declared_off_the_connections_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    let declare = encode(&[queue_method(queue::AMQPMethod::Declare(queue::Declare {
        queue: "kept".into(),
        durable: true,
        arguments: table(&[("x-message-ttl", AMQPValue::LongInt(60_000))]),
        ..queue::Declare::default()
    }))]);
    let bytes = [declare.clone(), encode(&[passive("kept")])].concat();
    assert_eq!(
        c.conn.handle_input(&bytes),
        declare.len(),
        "the passive one waits"
    );
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no declare-ok before the queue is made"
    );
    c.answered();
    c.conn.take_output(&mut out);
    assert_eq!(ready_count(&decode(&out)), 0);
    assert_eq!(ready_count(&c.feed_bytes(&bytes[declare.len()..])), 0);
    // A redeclare that differs is refused as before, once the virtual host has checked it.
    let other = queue::Declare {
        queue: "kept".into(),
        durable: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, other), 406);
}

#[test]
fn a_durable_queues_delete_and_an_exchange_declare_are_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    c.publish("jobs", b"a");
    // An exchange rewrites the exchanges' file in the data dir: awaited too.
    let declare = encode(&[method(
        1,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
            exchange: "work".into(),
            kind: "direct".into(),
            durable: true,
            ..exchange::Declare::default()
        })),
    )]);
    let bind = encode(&[queue_method(queue::AMQPMethod::Bind(queue::Bind {
        queue: "jobs".into(),
        exchange: "work".into(),
        routing_key: "k".into(),
        ..queue::Bind::default()
    }))]);
    let bytes = [declare.clone(), bind].concat();
    assert_eq!(c.conn.handle_input(&bytes), declare.len(), "the bind waits");
    c.answered();
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(matches!(
        &decode(&out)[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(_))
        )]
    ));
    let out = c.feed_bytes(&bytes[declare.len()..]);
    assert!(matches!(
        &out[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::BindOk(_))
        )]
    ));
    // The delete of a durable queue: its close waits for the disk.
    let delete = encode(&[queue_method(queue::AMQPMethod::Delete(queue::Delete {
        queue: "jobs".into(),
        ..queue::Delete::default()
    }))]);
    let bytes = [delete.clone(), encode(&[passive("jobs")])].concat();
    assert_eq!(
        c.conn.handle_input(&bytes),
        delete.len(),
        "the declare waits"
    );
    assert!(c.conn.awaits_call());
    c.answered();
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    let ok = queue::DeleteOk { message_count: 1 };
    assert_eq!(
        decode(&out),
        [queue_method(queue::AMQPMethod::DeleteOk(ok))]
    );
    let out = c.feed_bytes(&bytes[delete.len()..]);
    assert_eq!(
        channel_close_code(&out),
        Some(404),
        "gone before the declare"
    );
}

#[test]
fn what_a_read_gathered_after_an_awaited_call_is_made_once_it_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("jobs");
    c.publish("jobs", b"a");
    let tags: Vec<u64> = deliveries(&c.consume("jobs", false))
        .iter()
        .map(|(tag, _, _)| *tag)
        .collect();
    // A queue in memory beside it: its publish comes after the reject in the same read.
    let side = queue_method(queue::AMQPMethod::Declare(queue::Declare {
        queue: "side".into(),
        ..queue::Declare::default()
    }));
    c.feed(&[side]);
    let reject = basic_method(
        1,
        basic::AMQPMethod::Reject(basic::Reject {
            delivery_tag: tags[0],
            requeue: false,
        }),
    );
    let mut frames = vec![reject];
    frames.extend(Client::publish_frames(
        "side",
        BasicProperties::default(),
        b"s",
    ));
    let bytes = encode(&frames);
    assert_eq!(
        c.conn.handle_input(&bytes),
        bytes.len(),
        "publishes and settles are read on"
    );
    assert!(c.conn.awaits_call());
    c.broker.advance(Duration::ZERO).unwrap();
    assert_eq!(
        c.stats("side").enqueued,
        0,
        "the publish waits for the reject"
    );
    c.answered();
    c.broker.advance(Duration::ZERO).unwrap();
    assert_eq!(c.stats("side").enqueued, 1);
    assert_eq!(c.stats("jobs").rejected, 1);
}
