//! Consuming: prefetch, flow, cancels, gets, consumer arguments and priorities.

use super::*;

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

/// `x-consumer-timeout` on `basic.consume` (RabbitMQ 3.12's consumer timeout): the
/// consumer's deliveries are leased for that long, not for their queue's lease.
#[test]
fn a_consumers_own_timeout_is_the_lease_of_its_deliveries() {
    let mut c = Client::open();
    c.declare("eta");
    c.declare("quick");
    c.prefetch(1);
    let hour = AMQPValue::LongLongInt(3_600_000);
    c.consume_with("eta", &[("x-consumer-timeout", hour)]);
    c.consume_with("quick", &[("x-consumer-timeout", AMQPValue::LongInt(500))]);
    let mut out = Vec::new();
    for queue in ["eta", "quick"] {
        out.extend(c.feed(&Client::publish_frames(
            queue,
            BasicProperties::default(),
            queue.as_bytes(),
        )));
    }
    assert_eq!(
        deliveries(&out),
        [(1, false, b"eta".to_vec()), (2, false, b"quick".to_vec())]
    );
    // Past the quick consumer's 500 ms and well short of the queues' 30 minutes: only its
    // delivery comes again.
    c.broker.advance(Duration::from_millis(600)).unwrap();
    assert_eq!(deliveries(&c.feed(&[])), [(3, true, b"quick".to_vec())]);
    // An hour less a minute on: the eta consumer still holds its delivery, and acks it.
    c.broker.advance(Duration::from_secs(3_540)).unwrap();
    c.feed(&[ack(1, false)]);
    assert_eq!(c.stats("eta").acked, 1);
}

#[test]
fn a_consumer_timeout_out_of_range_is_a_406() {
    let mut c = Client::open();
    c.declare("eta");
    for value in [
        AMQPValue::LongInt(0),
        AMQPValue::LongLongInt(8 * 24 * 3_600_000),
        AMQPValue::LongInt(-5),
        AMQPValue::LongString("soon".into()),
    ] {
        let out = c.consume_with("eta", &[("x-consumer-timeout", value.clone())]);
        let (code, text) = channel_close(&out).expect("a channel error");
        assert_eq!(code, 406, "{value:?}");
        assert!(text.contains("'x-consumer-timeout'"), "{text}");
        c.reopen();
    }
    assert_eq!(c.stats("eta").consumers, 0);
}
