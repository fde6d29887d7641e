//! Declaring, deleting and purging queues: redeclare rules, exclusive, auto-delete and server-named queues, names, priorities.

use super::*;

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
