//! Contract §4 (time): `advance`, deadline order, rounding to ticks, barriers, jitter; and the
//! counters of contract §3 `stats` walked through one queue's life.

use std::time::Duration;

use leasemq::{
    Broker, Consumer, Delivery, DeliveryTag, Error, Message, Queue, QueueConfig, RetryPolicy,
};

mod common;
use common::*;

#[test]
fn advance_on_a_system_clock_broker_is_not_manual_clock() {
    let system = Broker::builder().shards(2).build().unwrap();
    match system.advance(secs(1)) {
        Err(Error::NotManualClock) => {}
        other => panic!("expected NotManualClock, got {other:?}"),
    }
    system.shutdown();
    let default = Broker::new().unwrap();
    match default.advance(Duration::ZERO) {
        Err(Error::NotManualClock) => {}
        other => panic!("expected NotManualClock, got {other:?}"),
    }
    default.shutdown();
}

#[test]
fn timers_fire_in_deadline_order_within_one_advance() {
    let broker = broker();
    let q = timeout_queue(&broker, "time.order", secs(60));
    let a = q.consume("a", prefetch(10)).unwrap();
    q.put(Message::new("3").with_id("three").with_delay(secs(3)))
        .unwrap();
    q.put(Message::new("1").with_id("one").with_delay(secs(1)))
        .unwrap();
    q.put(Message::new("2").with_id("two").with_delay(secs(2)))
        .unwrap();
    broker.advance(secs(5)).unwrap();
    assert_eq!(seen(&a), s("one", 1, 1));
    assert_eq!(seen(&a), s("two", 2, 1));
    assert_eq!(seen(&a), s("three", 3, 1));
}

#[test]
fn redelivery_inside_a_long_advance_can_itself_expire_before_it_returns() {
    let broker = broker();
    let q = timeout_queue(&broker, "time.chain", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    let b = q.consume("b", prefetch(1)).unwrap();
    put(&q, "m");
    assert_eq!(seen(&a), s("m", 1, 1));
    // 10 s: expires, goes to b (tag 2, lease until 20 s); 20 s: expires, goes to a (tag 3).
    broker.advance(secs(25)).unwrap();
    assert_eq!(seen(&b), s("m", 2, 2));
    assert_eq!(seen(&a), s("m", 3, 3));
    assert_stats!(q, { expired: 2, delivered: 3, leased: 1 });
    assert!(!q.ack(DeliveryTag(2)));
    // Tag 3 was delivered at 20 s: its lease ends at 30 s, not 35 s.
    broker.advance(secs(5) - ms(1)).unwrap();
    assert!(q.touch(DeliveryTag(3))); // 29.999 s: now until 39.999 s
    broker.advance(secs(10) - ms(1)).unwrap();
    assert!(q.ack(DeliveryTag(3)));
}

#[test]
fn lease_of_a_delivery_made_during_an_advance_counts_from_that_moment() {
    let broker = broker();
    let q = timeout_queue(&broker, "time.moment", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(Message::new("x").with_id("m").with_delay(secs(3)))
        .unwrap();
    broker.advance(secs(14)).unwrap(); // delivered at 3 s, expired at 13 s, again at 13 s
    assert_eq!(seen(&a), s("m", 1, 1));
    assert_eq!(seen(&a), s("m", 2, 2));
    assert_stats!(q, { expired: 1 });
    broker.advance(secs(9) - ms(1)).unwrap(); // 22.999 s
    assert_stats!(q, { expired: 1 });
    broker.advance(ms(1)).unwrap(); // 23 s
    assert_stats!(q, { expired: 2 });
    assert_eq!(seen(&a), s("m", 3, 3));
}

/// The same program with one long advance or many short ones.
fn chain_program(step: Duration, steps: u32) -> (Vec<(String, String, u64, u32)>, String) {
    let broker = broker();
    let q = broker
        .declare_queue(
            "time.steps",
            QueueConfig {
                ack_timeout: ms(700),
                retry: RetryPolicy {
                    initial: ms(300),
                    multiplier: 1.5,
                    max: secs(2),
                    jitter: 0.0,
                },
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let consumers = [
        q.consume("a", prefetch(1)).unwrap(),
        q.consume("b", prefetch(2)).unwrap(),
    ];
    for i in 0..5 {
        q.put(
            Message::new("x")
                .with_id(format!("m{i}"))
                .with_delay(ms(i * 150)),
        )
        .unwrap();
    }
    for _ in 0..steps {
        broker.advance(step).unwrap();
    }
    let mut log = Vec::new();
    for c in &consumers {
        while let Some(d) = c.try_recv().unwrap() {
            log.push((
                c.name().to_string(),
                d.envelope().id.clone(),
                d.tag().0,
                d.envelope().attempt,
            ));
        }
    }
    let stats = format!("{:?}", q.stats());
    (log, stats)
}

#[test]
fn one_long_advance_equals_advancing_one_tick_at_a_time() {
    let long = chain_program(secs(6), 1);
    let ticks = chain_program(ms(1), 6000);
    let mixed = chain_program(ms(8), 750);
    assert!(long.0.len() > 10, "{:?}", long.0);
    assert_eq!(long, ticks);
    assert_eq!(long, mixed);
}

#[test]
fn deadlines_round_up_to_whole_ticks() {
    let broker = Broker::builder()
        .shards(2)
        .manual_clock()
        .tick(ms(10))
        .build()
        .unwrap();
    let q = timeout_queue(&broker, "time.ticks", ms(15));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a);
    broker.advance(ms(10)).unwrap(); // 10 ms: the 15 ms deadline is 20 ms
    assert!(d.touch()); // 10 ms + 15 ms = 25 ms, rounded up to 30 ms
    broker.advance(ms(10)).unwrap(); // 20 ms
    assert_stats!(q, { expired: 0 });
    broker.advance(ms(10)).unwrap(); // 30 ms
    assert_stats!(q, { expired: 1 });
    assert!(!d.ack());
}

#[test]
fn sub_tick_delays_round_up_and_never_fire_early() {
    let broker = broker(); // 1 ms ticks
    let q = timeout_queue(&broker, "time.subtick", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(
        Message::new("x")
            .with_id("m")
            .with_delay(Duration::from_micros(1500)),
    )
    .unwrap();
    broker.advance(ms(1)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    let d = next(&a);
    assert!(d.nack_with_delay(Duration::from_micros(1)));
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    assert_eq!(seen(&a), s("m", 2, 2));
}

#[test]
fn delayed_messages_become_ready_exactly_at_their_deadline_at_every_distance() {
    let broker = broker();
    let q = timeout_queue(&broker, "time.wheel", Duration::from_secs(7 * 24 * 3600));
    let a = q.consume("a", prefetch(100)).unwrap();
    let delays_ms: [u64; 13] = [
        1,
        63,
        64,
        65,
        4_095,
        4_096,
        4_097,
        262_143,
        262_144,
        262_145,
        16_777_217,
        3_600_000,
        604_800_000,
    ];
    for &delay in delays_ms.iter().rev() {
        q.put(
            Message::new("x")
                .with_id(format!("d{delay}"))
                .with_delay(ms(delay)),
        )
        .unwrap();
    }
    let mut sorted = delays_ms;
    sorted.sort_unstable();
    let mut now = 0;
    for (i, &deadline) in sorted.iter().enumerate() {
        if deadline - now > 1 {
            broker.advance(ms(deadline - now - 1)).unwrap();
            nothing(&a);
        }
        broker.advance(ms(1)).unwrap();
        now = deadline;
        assert_eq!(
            seen(&a),
            s(&format!("d{deadline}"), i as u64 + 1, 1),
            "at {deadline} ms"
        );
        nothing(&a);
    }
    assert_stats!(q, { delayed: 0, leased: 13 });
}

#[test]
fn advance_returns_after_every_shard_has_delivered() {
    let broker = Broker::builder().shards(4).manual_clock().build().unwrap();
    let queues: Vec<Queue> = (0..12)
        .map(|i| timeout_queue(&broker, &format!("time.shard{i}"), secs(10)))
        .collect();
    let consumers: Vec<Consumer> = queues
        .iter()
        .map(|q| q.consume("c", prefetch(10)).unwrap())
        .collect();
    for q in &queues {
        q.put(Message::new("x").with_id("later").with_delay(secs(1)))
            .unwrap();
        put(q, "now");
    }
    broker.advance(secs(1)).unwrap();
    for (q, c) in queues.iter().zip(&consumers) {
        assert_eq!(seen(c), s("now", 1, 1), "{}", q.name());
        assert_eq!(seen(c), s("later", 2, 1), "{}", q.name());
    }
    // Expiries on every shard are likewise done when advance returns.
    broker.advance(secs(10)).unwrap();
    for (q, c) in queues.iter().zip(&consumers) {
        assert_stats!(q, { expired: 2, leased: 2 });
        let mut again = [seen(c), seen(c)];
        again.sort();
        assert_eq!(again, [s("later", 4, 2), s("now", 3, 2)]);
    }
}

#[test]
fn advance_by_zero_fires_nothing() {
    let broker = broker();
    let q = timeout_queue(&broker, "time.zero", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(Message::new("x").with_id("m").with_delay(ms(1)))
        .unwrap();
    broker.advance(Duration::ZERO).unwrap();
    nothing(&a);
    assert_stats!(q, { delayed: 1 });
}

#[test]
fn jittered_retry_delays_stay_within_the_jitter_fraction() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "time.jitter",
            QueueConfig {
                ack_timeout: secs(60),
                retry: RetryPolicy {
                    initial: secs(1),
                    multiplier: 1.0,
                    max: secs(1),
                    jitter: 0.5,
                },
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(50)).unwrap();
    let msgs = (0..40)
        .map(|i| Message::new("x").with_id(format!("m{i}")))
        .collect();
    q.put_batch(msgs).unwrap();
    for _ in 0..40 {
        assert!(next(&a).nack());
    }
    let mut arrivals = Vec::new();
    for t in 1..=1500_u64 {
        broker.advance(ms(1)).unwrap();
        while let Some(d) = a.try_recv().unwrap() {
            assert_eq!(d.envelope().attempt, 2);
            arrivals.push(t);
        }
    }
    assert_eq!(arrivals.len(), 40, "every retry is due by 1.5 s");
    assert!(arrivals.iter().all(|&t| t >= 500), "{arrivals:?}");
    let distinct: std::collections::BTreeSet<_> = arrivals.iter().collect();
    assert!(
        distinct.len() > 1,
        "jitter spreads the retries: {arrivals:?}"
    );
}

#[test]
fn stats_count_every_event_of_a_queue() {
    let broker = broker();
    let dead = timeout_queue(&broker, "stats.dead", secs(10));
    let q = broker
        .declare_queue(
            "stats.q",
            QueueConfig {
                ack_timeout: secs(10),
                retry: RetryPolicy::immediate(),
                dead_letter: Some("stats.dead".into()),
                max_deliveries: Some(3),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(3)).unwrap();
    for i in 1..=5 {
        put(&q, &format!("m{i}"));
    }
    put(&q, "m1"); // duplicate
    q.put(Message::new("x").with_id("late").with_delay(secs(100)))
        .unwrap();
    assert_stats!(q, {
        ready: 2, delayed: 1, leased: 3, consumers: 1, enqueued: 6, duplicates: 1,
        delivered: 3, acked: 0, nacked: 0, rejected: 0, released: 0, expired: 0,
        dead_lettered: 0, dropped: 0, stale: 0,
    });
    let d1 = next(&a); // m1
    let d2 = next(&a); // m2
    let d3 = next(&a); // m3
    assert!(d1.ack()); // m4 -> tag 4
    assert!(!d1.ack()); // stale
    assert!(d2.nack()); // m2 again, before m5 -> tag 5, attempt 2
    assert!(d3.reject()); // m3 dead-lettered; m5 -> tag 6
    assert_stats!(q, {
        ready: 0, delayed: 1, leased: 3, enqueued: 6, delivered: 6, acked: 1, nacked: 1,
        rejected: 1, dead_lettered: 1, stale: 1,
    });
    assert!(q.release(DeliveryTag(4))); // m4 -> tag 7, same attempt
    broker.advance(secs(10)).unwrap(); // tags 5, 6, 7 expire and come back
    assert_stats!(q, {
        leased: 3, released: 1, expired: 3, delivered: 10, dead_lettered: 1, dropped: 0,
    });
    assert!(dead.close());
    // Drain and reject what a holds: dead letters are now dropped.
    let held: Vec<Delivery> = std::iter::from_fn(|| a.try_recv().unwrap()).collect();
    for d in held.iter().filter(|d| d.tag().0 > 7) {
        assert!(d.reject());
    }
    assert_stats!(q, {
        ready: 0, delayed: 1, leased: 0, consumers: 1, enqueued: 6, duplicates: 1,
        delivered: 10, acked: 1, nacked: 1, rejected: 4, released: 1, expired: 3,
        dead_lettered: 1, dropped: 3, stale: 1,
    });
    drop(a);
    assert_stats!(q, { consumers: 0 });
}
