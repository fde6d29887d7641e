//! Time to live: message TTLs at the head of a queue, dead-lettering on expiry, and queues that expire unused (`x-expires`).

use super::*;

#[test]
fn x_expires_counts_from_the_last_use_and_waits_while_the_queue_has_consumers() {
    use std::time::Instant;
    let mut c = Client::open();
    let vhost = c.conn.vhost.clone();
    let expires = |ms: i32| {
        let mut arguments = FieldTable::default();
        arguments.insert("x-expires".into(), AMQPValue::LongInt(ms));
        queue::Declare {
            queue: "idle".into(),
            arguments,
            ..queue::Declare::default()
        }
    };
    assert_eq!(declare_code(&mut c, expires(100)), 0);
    let expire = |at: Instant| {
        let (expired, _) = vhost
            .expiring
            .expire(at, |name| vhost.consumers.is_consumed(name));
        expired
            .iter()
            .map(|q| q.name().to_string())
            .collect::<Vec<_>>()
    };
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    assert!(expire(t0).is_empty());
    // A publish is no use; a get is.
    c.publish("idle", b"m");
    c.feed(&[get("idle", true)]);
    assert!(expire(ms(60)).is_empty());
    assert!(expire(ms(100)).is_empty(), "used at 60 ms");
    // A redeclare must say the same x-expires.
    let code = declare_code(&mut c, expires(200));
    assert_eq!(code, 406);
    let plain = queue::Declare {
        queue: "idle".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, plain), 406);
    // A consumer keeps it; its going starts the time again.
    let tag = consumer_tag(&c.consume("idle", false));
    assert!(expire(ms(1_000)).is_empty());
    assert!(expire(ms(1_200)).is_empty(), "consumed past its time");
    c.feed(&[cancel(&tag)]);
    assert!(expire(ms(2_000)).is_empty());
    let expired = vhost.expiring.expire(ms(2_100), |_| false).0;
    assert_eq!(expired.len(), 1);
    vhost.forget_queue(&expired[0]);
    assert!(c.broker.queue("idle").is_none(), "deleted");
    let passive = queue::Declare {
        queue: "idle".into(),
        passive: true,
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, passive), 404);
    // The name is free: declared again without x-expires, it stays.
    let plain = queue::Declare {
        queue: "idle".into(),
        ..queue::Declare::default()
    };
    assert_eq!(declare_code(&mut c, plain), 0);
    assert!(expire(ms(10_000)).is_empty());
}

#[test]
fn an_exclusive_queue_deleted_by_x_expires_leaves_its_name_free_and_others_state_alone() {
    use std::time::Instant;
    let mut a = Client::open();
    let vhost = a.conn.vhost.clone();
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    assert_eq!(
        declare_code(&mut a, declare_with("mine", true, Some(100))),
        0
    );
    run_expiry(&vhost, t0);
    run_expiry(&vhost, ms(100));
    assert!(a.broker.queue("mine").is_none(), "expired");
    // Declared exclusive again, it is this connection's again.
    assert_eq!(declare_code(&mut a, declare_with("mine", true, None)), 0);
    let mut b = a.another(2);
    assert_eq!(channel_close_code(&b.consume("mine", false)), Some(405));
    b.reopen();
    // Another exclusive queue of `a` expires; `b` declares a queue of its name and binds
    // it. `a`'s end must not touch `b`'s queue.
    assert_eq!(
        declare_code(&mut a, declare_with("brief", true, Some(100))),
        0
    );
    run_expiry(&vhost, ms(200));
    run_expiry(&vhost, ms(300));
    assert!(a.broker.queue("brief").is_none(), "expired");
    assert_eq!(declare_code(&mut b, declare_with("brief", false, None)), 0);
    let bind = queue::Bind {
        queue: "brief".into(),
        exchange: "amq.direct".into(),
        routing_key: "k".into(),
        ..queue::Bind::default()
    };
    b.feed(&[queue_method(queue::AMQPMethod::Bind(bind))]);
    drop(a.conn);
    let exchanges = vhost.exchanges.lock().unwrap();
    assert_eq!(
        exchanges.route("amq.direct", "k", || None).unwrap(),
        ["brief"]
    );
    drop(exchanges);
    assert!(b.broker.queue("brief").is_some());
    assert!(b.broker.queue("mine").is_none(), "gone with its connection");
}

#[test]
fn a_message_past_its_ttl_is_dropped_when_a_consumer_or_get_reaches_it() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.declare("plain");
    let with_expiration = |queue: &str, expiration: &str, body: &[u8]| {
        let properties = BasicProperties::default().with_expiration(expiration.into());
        Client::publish_frames(queue, properties, body)
    };
    // The queue's TTL, and a message's own shorter one; counted from each arrival.
    c.publish("ttl", b"old");
    c.feed(&with_expiration("ttl", "100", b"short"));
    c.feed(&with_expiration("plain", "100", b"own"));
    c.publish("plain", b"forever");
    now.store(1_000_600, Ordering::Relaxed);
    c.publish("ttl", b"new");
    now.store(1_001_200, Ordering::Relaxed);
    let out = c.consume("ttl", false);
    assert_eq!(delivered_bodies(&out), [b"new".to_vec()]);
    assert_eq!(c.stats("ttl").acked, 2, "the expired two dropped");
    let get = basic::Get {
        queue: "plain".into(),
        no_ack: true,
    };
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Get(get.clone()))]);
    assert_eq!(delivered_bodies(&out), [b"forever".to_vec()]);
    let out = c.feed(&[basic_method(1, basic::AMQPMethod::Get(get))]);
    assert!(
        matches!(
            &out[..],
            [AMQPFrame::Method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::GetEmpty(_))
            )]
        ),
        "{out:?}"
    );
    assert_eq!(c.conn.metrics().ttl_expired.get(), 3);
    // An expiration that is no number of milliseconds is RabbitMQ's 406.
    let out = c.feed(&with_expiration("plain", "soon", b"x"));
    assert_eq!(channel_close_code(&out), Some(406));
    // A redeclare names the same TTL.
    let redeclare = queue::Declare {
        queue: "ttl".into(),
        ..queue::Declare::default()
    };
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
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(redeclare))]);
    assert_eq!(channel_close_code(&out), Some(406));
}

#[test]
fn expired_messages_at_the_head_do_not_hold_a_prefetch_of_one() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    for body in [b"old1", b"old2", b"old3"] {
        c.publish("ttl", body);
    }
    now.store(1_002_000, Ordering::Relaxed);
    c.publish("ttl", b"fresh");
    c.prefetch(1);
    // Each expired delivery is acked as the output goes, which frees the one credit for
    // the next: the fresh message comes within as many turns of the connection.
    let mut bodies = delivered_bodies(&c.consume("ttl", false));
    for _ in 0..4 {
        bodies.extend(delivered_bodies(&c.feed(&[])));
    }
    assert_eq!(bodies, [b"fresh".to_vec()]);
    assert_eq!(c.stats("ttl").acked, 3);
}

#[test]
fn a_head_stored_with_an_expiration_past_ten_years_never_expires() {
    // A build from before expirations were capped at ten years stored this one: read as
    // no expiration at all (an arrival plus it would pass the end of time).
    let (mut c, now) = Client::with_clock();
    c.declare("forever");
    let properties = BasicProperties::default().with_expiration("18446744073709551615".into());
    let mut body = crate::content::encode(&properties, b"kept")
        .unwrap()
        .to_vec();
    crate::content::stamp(&mut body, 1_000_000, true);
    let queue = c.broker.queue("forever").unwrap();
    queue.put(leasemq::Message::new(body)).unwrap();
    c.conn.vhost.message_expiry.published(&queue, true);
    // Handed back unseen, and looked at again a second later, as any head that does not
    // expire in a queue messages with an expiration went to.
    for at in [2_000_000, 2_001_000] {
        let looked = (vec!["forever".to_string()], Some(at + 1_000));
        assert_eq!(c.expire_at(at, &now), looked);
    }
    assert_eq!(queue.stats().ready, 1);
}

#[test]
fn a_queue_nobody_consumes_dead_letters_each_message_as_its_ttl_runs_out_at_the_head() {
    let (mut c, now) = Client::with_clock();
    c.declare("work");
    let text = |s: &str| AMQPValue::LongString(s.into());
    c.declare_with(
        "delay",
        &[
            ("x-message-ttl", AMQPValue::LongInt(1_000)),
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text("work")),
        ],
    );
    let holding = crate::dead_letter::holding_name("delay");
    // Watched from its declare: looked at once, and found empty.
    assert_eq!(
        c.expire_at(1_000_000, &now),
        (vec!["delay".to_string()], None)
    );
    c.publish("delay", b"first");
    c.publish("delay", b"second");
    now.store(1_000_400, Ordering::Relaxed);
    for body in [&b"third"[..], b"fourth", b"fifth"] {
        c.publish("delay", body);
    }
    // The publishes poked it: its head has 1 000 ms left, so it is handed back unseen
    // and looked at again when that is up (it expires once the clock is past it).
    assert_eq!(
        c.expire_at(1_000_500, &now),
        (vec!["delay".to_string()], Some(1_001_001))
    );
    assert_eq!(c.stats("delay").ready, 5);
    assert_eq!(c.expire_at(1_001_000, &now), (vec![], Some(1_001_001)));
    // Both first messages go to the holding queue, with no death record (an expiry),
    // and the third is due next. (The first was taken alone; the next four together,
    // and the three with time left handed back in their order.)
    assert_eq!(
        c.expire_at(1_001_001, &now),
        (vec!["delay".to_string()], Some(1_001_401))
    );
    let stats = c.stats("delay");
    assert_eq!((stats.ready, stats.acked), (3, 2));
    assert_eq!(c.stats(&holding).ready, 2);
    assert_eq!(c.conn.metrics().ttl_expired.get(), 2);
    // Those were never delivered: handed back unseen, none is a redelivery.
    let out = c.consume("delay", false);
    let tag = consumer_tag(&out);
    assert_eq!(
        deliveries(&out),
        [
            (1, false, b"third".to_vec()),
            (2, false, b"fourth".to_vec()),
            (3, false, b"fifth".to_vec())
        ]
    );
    c.feed(&[ack(3, true)]);
    // While it has a consumer, a look leaves it to that consumer: looked at again later.
    let delay = || vec!["delay".to_string()];
    assert_eq!(c.expire_at(1_001_401, &now), (delay(), Some(1_002_401)));
    // Found holding nothing once the consumer went, and disarmed.
    c.feed(&[cancel(&tag)]);
    assert_eq!(c.expire_at(1_002_401, &now), (delay(), None));
    assert_eq!(c.expire_at(1_002_402, &now), (vec![], None));
    // A publish arms it again (stamped 1 002 402, the clock's last setting).
    c.publish("delay", b"fourth");
    assert_eq!(c.expire_at(1_002_500, &now), (delay(), Some(1_003_403)));
    // The holding queue's dead letters are the messages as they were stored, with no
    // death record: what its task reads as an expiry in `delay`.
    let held = c.broker.queue(&holding).unwrap();
    let held = held
        .consume("test", ConsumerConfig { prefetch: 10 })
        .unwrap();
    for body in [&b"first"[..], b"second"] {
        let letter = held.try_recv().unwrap().expect("held");
        assert_eq!(letter.envelope().death, None);
        let delivered = crate::content::delivered(letter.envelope(), "delay");
        assert_eq!(&delivered.payload[..], body);
    }
}

#[test]
fn a_queue_with_a_ttl_and_no_consumer_drops_what_expires_at_its_head() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.publish("ttl", b"old");
    c.publish("ttl", b"older");
    let ttl = || vec!["ttl".to_string()];
    assert_eq!(c.expire_at(1_000_000, &now), (ttl(), Some(1_001_001)));
    assert_eq!(c.expire_at(1_001_001, &now), (ttl(), None));
    let stats = c.stats("ttl");
    assert_eq!((stats.ready, stats.acked), (0, 2));
    assert_eq!(c.conn.metrics().ttl_expired.get(), 2);
}

#[test]
fn an_expired_message_met_by_a_get_or_a_consumer_is_dead_lettered_where_the_queue_says() {
    let (mut c, now) = Client::with_clock();
    let holding = c.declare_dead_lettering("jobs");
    let expiring = |body: &[u8]| {
        let properties = BasicProperties::default().with_expiration("100".into());
        Client::publish_frames("jobs", properties, body)
    };
    let jobs = || vec!["jobs".to_string()];
    // With no TTL of its own, the queue is watched only once a message with one comes.
    assert_eq!(c.expire_at(1_000_000, &now), (vec![], None));
    c.publish("jobs", b"plain");
    assert_eq!(c.expire_at(1_000_000, &now), (vec![], None));
    c.feed(&expiring(b"by get"));
    // That one arms it; its head never expires, so the one behind waits (as in RabbitMQ),
    // and the queue is looked at again a second later.
    assert_eq!(c.expire_at(1_000_000, &now), (jobs(), Some(1_001_000)));
    assert_eq!(c.expire_at(1_000_500, &now), (vec![], Some(1_001_000)));
    now.store(1_000_200, Ordering::Relaxed);
    let out = c.feed(&[get("jobs", false)]);
    assert_eq!(delivered_bodies(&out), [b"plain".to_vec()]);
    c.feed(&[ack(1, false)]);
    let out = c.feed(&[get("jobs", false)]);
    assert!(delivered_bodies(&out).is_empty(), "{out:?}");
    assert_eq!(c.stats(&holding).ready, 1, "put there by the get");
    // A consumer's expired deliveries are handed over, never sent.
    c.feed(&expiring(b"by consumer 1"));
    c.feed(&expiring(b"by consumer 2"));
    c.publish("jobs", b"kept");
    now.store(1_000_400, Ordering::Relaxed);
    let out = c.consume("jobs", false);
    assert_eq!(delivered_bodies(&out), [b"kept".to_vec()]);
    assert_eq!(c.stats("jobs").leased, 3);
    c.expire_at(1_000_400, &now);
    assert_eq!(c.stats(&holding).ready, 3);
    let stats = c.stats("jobs");
    assert_eq!(
        (stats.leased, stats.acked),
        (1, 4),
        "three expired, one acked"
    );
    assert_eq!(c.conn.metrics().ttl_expired.get(), 3);
}

#[test]
fn a_message_with_its_own_expiration_leaves_any_queue_at_the_head() {
    let (mut c, now) = Client::with_clock();
    c.declare("plain");
    c.publish("plain", b"kept");
    assert_eq!(c.expire_at(1_000_000, &now), (vec![], None), "not watched");
    let properties = BasicProperties::default().with_expiration("100".into());
    c.feed(&Client::publish_frames("plain", properties, b"short"));
    // Watched from that publish on. Its head never expires, and the one behind waits for
    // it; messages with their own expiration were published, so it is looked at again.
    let plain = || vec!["plain".to_string()];
    assert_eq!(c.expire_at(1_000_200, &now), (plain(), Some(1_001_200)));
    let out = c.feed(&[get("plain", true)]);
    assert_eq!(delivered_bodies(&out), [b"kept".to_vec()]);
    assert_eq!(c.expire_at(1_001_200, &now), (plain(), None));
    let stats = c.stats("plain");
    assert_eq!((stats.ready, stats.acked), (0, 2), "dropped at the head");
}

#[test]
fn a_watched_queue_with_a_consumer_is_left_to_it() {
    let (mut c, now) = Client::with_ttl_queue("ttl", 1_000);
    c.prefetch(1);
    c.publish("ttl", b"in hand");
    c.consume("ttl", false);
    c.publish("ttl", b"waiting");
    let ttl = || vec!["ttl".to_string()];
    // Past its time, but a look would take it from under the consumer.
    assert_eq!(c.expire_at(1_002_000, &now), (ttl(), Some(1_003_000)));
    let stats = c.stats("ttl");
    assert_eq!((stats.ready, stats.delivered), (1, 1), "untouched");
    // The consumer meets it when it reaches it, and drops it.
    c.feed(&[ack(1, false)]);
    assert_eq!(c.stats("ttl").acked, 2);
}

#[test]
fn an_expired_delivery_returned_before_it_is_dead_lettered_is_dead_lettered_once() {
    let (mut c, now) = Client::with_clock();
    let holding = c.declare_dead_lettering("jobs");
    let properties = BasicProperties::default().with_expiration("100".into());
    c.feed(&Client::publish_frames("jobs", properties, b"late"));
    now.store(1_000_200, Ordering::Relaxed);
    // The consumer meets it expired and hands it over; its cancel returns it (as after a
    // lease that ran out) before the handed delivery is dead-lettered.
    let tag = consumer_tag(&c.consume("jobs", false));
    c.feed(&[cancel(&tag)]);
    assert_eq!(c.stats("jobs").ready, 1);
    // The handed delivery's ack does not take, so it is not dead-lettered; the message,
    // back at the head of a queue nobody consumes, is: once.
    c.expire_at(1_000_200, &now);
    assert_eq!(c.stats(&holding).ready, 1);
    assert_eq!(c.stats("jobs").ready, 0);
    c.expire_at(1_001_200, &now);
    assert_eq!(c.stats(&holding).ready, 1);
}

#[test]
fn a_get_that_meets_the_head_under_a_look_takes_it_once_the_look_hands_it_back() {
    let (mut c, _now) = Client::with_clock();
    c.declare_with("jobs", &[("x-message-ttl", AMQPValue::LongInt(60_000))]);
    c.publish("jobs", b"job");
    // A look at the head, as `VHost::look_at_head` makes it, holds the only message.
    let (vhost, queue) = (c.conn.vhost.clone(), c.broker.queue("jobs").unwrap());
    let looking = vhost.message_expiry.begin_look(&queue);
    let config = ConsumerConfig { prefetch: 1 };
    let look = queue
        .consume(crate::message_expiry::CONSUMER, config)
        .unwrap();
    let head = look.try_recv().unwrap().expect("the head");
    look.stop();
    // The get meets nothing, and takes again, off the connection's thread, once the look
    // has handed the head back.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _inside = runtime.enter();
    c.conn.handle_input(&encode(&[get("jobs", false)]));
    assert!(c.conn.awaits_call(), "the get waits for the look");
    assert!(head.release());
    look.cancel();
    drop(looking);
    c.answered();
    let out = c.feed(&[]);
    assert_eq!(delivered_bodies(&out), [b"job".to_vec()]);
    assert_eq!(c.stats("jobs").leased, 1);
}
