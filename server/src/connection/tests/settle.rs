//! Settling: acks, nacks and rejects, unknown and late tags, a closed channel's
//! deliveries redelivered, and leases that run out forgotten by the channel.

use super::*;

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
        (10..=2 * crate::connection::channel::FORGET_EXPIRED_FROM).contains(&held),
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
