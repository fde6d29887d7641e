//! Direct reply-to (`amq.rabbitmq.reply-to`).

use super::*;

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
