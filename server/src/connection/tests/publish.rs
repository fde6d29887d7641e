//! Publishing and confirms: content assembly, routing through the default exchange, mandatory returns, confirms and what a publisher waits for.

use super::*;

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

#[test]
fn publishes_without_confirms_are_not_waited_for_unless_the_answer_needs_telling() {
    use crate::connection::answers::UNANSWERED_PUT_BYTES;
    use crate::connection::incoming::bytes_held;
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
    use crate::connection::channel::{confirms, Confirm, Confirms};
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
