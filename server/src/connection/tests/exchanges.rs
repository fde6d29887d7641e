//! Exchanges and bindings: fanout copies, internal exchanges, unbinding, the holding queue of a dead-lettering queue.

use super::*;

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
    // Deleted with its queue once drained: by the server's task (`VHost::forward_dead_letters`),
    // which none runs here, so it stays, still out of reach.
    let delete = queue::Delete {
        queue: "work".into(),
        ..queue::Delete::default()
    };
    c.feed(&[queue_method(queue::AMQPMethod::Delete(delete))]);
    assert!(c.broker.queue("work").is_none());
    assert!(c.broker.queue(&holding).is_some(), "left to drain");
}
