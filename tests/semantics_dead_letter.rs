//! Contract §3 Expiry, §3 `max_deliveries` and §3 Dead-lettering.

use std::time::Duration;

use leasemq::{DeathReason, DeathRecord, DeliveryTag, Message, Overflow, QueueConfig, RetryPolicy};

mod common;
use common::*;

fn death(queue: &str, reason: DeathReason, attempts: u32) -> Option<DeathRecord> {
    Some(DeathRecord {
        queue: queue.to_string(),
        reason,
        attempts,
    })
}

// --- expiry ------------------------------------------------------------------------------

#[test]
fn expired_lease_brings_the_message_back_and_returns_the_credit() {
    let broker = broker();
    let q = timeout_queue(&broker, "exp.credit", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    let b = q.consume("b", prefetch(1)).unwrap();
    put(&q, "m1");
    assert_eq!(seen(&a), s("m1", 1, 1));
    broker.advance(secs(10)).unwrap();
    assert_eq!(seen(&b), s("m1", 2, 2));
    assert_stats!(q, { expired: 1, leased: 1, delivered: 2 });
    put(&q, "m2"); // a has its credit back and is next after b
    assert_eq!(seen(&a), s("m2", 3, 1));
    nothing(&b);
}

#[test]
fn expired_message_waits_ready_when_no_consumer_has_credit() {
    let broker = broker();
    let q = timeout_queue(&broker, "exp.noconsumer", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m1");
    let first = next(&a);
    assert!(first.envelope().attempt == 1);
    a.cancel(); // a received it: returned like an expiry
    assert_stats!(q, { ready: 1, leased: 0, expired: 0 });
    let b = q.consume("b", prefetch(1)).unwrap();
    assert_eq!(seen(&b), s("m1", 2, 2));
    broker.advance(secs(10)).unwrap(); // b's lease expires and comes back to b
    assert_eq!(seen(&b), s("m1", 3, 3));
    assert_stats!(q, { expired: 1, leased: 1, ready: 0 });
}

#[test]
fn every_late_settle_after_expiry_is_stale() {
    let broker = broker();
    let q = timeout_queue(&broker, "exp.late", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m1");
    let late = next(&a);
    broker.advance(secs(11)).unwrap();
    let current = next(&a);
    assert!(!late.ack());
    assert!(!late.nack());
    assert!(!late.reject());
    assert!(!late.release());
    assert!(!late.touch());
    assert!(!late.nack_with_delay(Duration::ZERO));
    assert_eq!(a.ack_up_to(late.tag()), 0);
    assert_stats!(q, {
        stale: 6, expired: 1, acked: 0, nacked: 0, rejected: 0, released: 0, dropped: 0,
        leased: 1,
    });
    assert!(current.ack());
}

// --- max_deliveries ----------------------------------------------------------------------

#[test]
fn max_deliveries_dead_letters_on_expiry() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "maxd.expiry",
        "maxd.expiry.dead",
        QueueConfig {
            ack_timeout: secs(10),
            max_deliveries: Some(2),
            ..QueueConfig::default()
        },
    );
    let w = dead.consume("w", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert_eq!(seen(&a), s("m", 1, 1));
    broker.advance(secs(10)).unwrap();
    assert_eq!(seen(&a), s("m", 2, 2));
    nothing(&w);
    broker.advance(secs(10)).unwrap();
    nothing(&a);
    let d = next(&w);
    assert_eq!(d.envelope().id, "m");
    assert_eq!(&d.envelope().body[..], &b"body of m"[..]);
    assert_eq!(d.envelope().attempt, 1);
    assert_eq!(
        d.envelope().death,
        death("maxd.expiry", DeathReason::MaxDeliveries, 2)
    );
    assert_stats!(q, {
        expired: 2, dead_lettered: 1, dropped: 0, delivered: 2, ready: 0, leased: 0,
    });
    assert_stats!(dead, { enqueued: 1, leased: 1 });
}

#[test]
fn max_deliveries_dead_letters_on_nack_and_still_counts_the_nack() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "maxd.nack",
        "maxd.nack.dead",
        QueueConfig {
            retry: RetryPolicy::immediate(),
            max_deliveries: Some(3),
            ..QueueConfig::default()
        },
    );
    let w = dead.consume("w", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert!(next(&a).nack());
    assert!(next(&a).nack());
    let third = next(&a);
    assert_eq!(third.envelope().attempt, 3);
    // A long retry delay does not matter: the message dies now.
    assert!(third.nack_with_delay(secs(3600)));
    nothing(&a);
    assert_eq!(
        next(&w).envelope().death,
        death("maxd.nack", DeathReason::MaxDeliveries, 3)
    );
    assert_stats!(q, { nacked: 3, dead_lettered: 1, delayed: 0, ready: 0, leased: 0 });
}

#[test]
fn max_deliveries_on_consumer_cancel_only_counts_received_deliveries() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "maxd.cancel",
        "maxd.cancel.dead",
        QueueConfig {
            max_deliveries: Some(1),
            ..QueueConfig::default()
        },
    );
    let w = dead.consume("w", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert_eq!(seen(&a), s("m1", 1, 1)); // m2 stays unread in the channel
    a.cancel();
    // m1 was received: it came back at attempt 1 = max_deliveries and died.
    let d = next(&w);
    assert_eq!(d.envelope().id, "m1");
    assert_eq!(
        d.envelope().death,
        death("maxd.cancel", DeathReason::MaxDeliveries, 1)
    );
    nothing(&w);
    // m2 was never seen: released, no attempt spent.
    assert_stats!(q, { released: 1, dead_lettered: 1, expired: 0, ready: 1, leased: 0 });
    let b = q.consume("b", prefetch(10)).unwrap();
    assert_eq!(seen(&b), s("m2", 3, 1));
}

#[test]
fn max_deliveries_without_a_dead_letter_queue_drops_and_counts() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "maxd.drop",
            QueueConfig {
                ack_timeout: secs(5),
                max_deliveries: Some(1),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    next(&a);
    broker.advance(secs(5)).unwrap();
    nothing(&a);
    assert_stats!(q, { expired: 1, dropped: 1, dead_lettered: 0, ready: 0, leased: 0 });
}

// --- dead-lettering ----------------------------------------------------------------------

#[test]
fn reject_dead_letters_with_a_death_record_keeping_id_and_body() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "dl.reject",
        "dl.reject.dead",
        QueueConfig {
            retry: RetryPolicy::immediate(),
            ..QueueConfig::default()
        },
    );
    let w = dead.consume("w", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert!(next(&a).nack());
    assert!(next(&a).nack());
    let d = next(&a);
    assert!(q.reject(d.tag()));
    // The letter is in the dead-letter consumer's channel when reject returns.
    let dl = next(&w);
    assert_eq!(dl.tag(), DeliveryTag(1));
    assert_eq!(dl.envelope().id, "m");
    assert_eq!(&dl.envelope().body[..], &b"body of m"[..]);
    assert_eq!(dl.envelope().attempt, 1);
    assert!(!dl.envelope().redelivered());
    assert_eq!(
        dl.envelope().death,
        death("dl.reject", DeathReason::Rejected, 3)
    );
    assert_stats!(q, {
        rejected: 1, nacked: 2, dead_lettered: 1, dropped: 0, ready: 0, leased: 0,
    });
    assert_stats!(dead, { enqueued: 1, delivered: 1, leased: 1 });
    // Never retried.
    broker.advance(secs(3600)).unwrap();
    nothing(&a);
}

#[test]
fn dead_letters_reach_their_queue_wherever_it_lives() {
    // With 4 shards and 8 pairs, some dead-letter queues live on another shard than their
    // source; every pair must behave the same.
    let broker = broker4();
    for i in 0..8 {
        let (q, dead) = dead_letter_pair(
            &broker,
            &format!("dl.shard.src{i}"),
            &format!("dl.shard.dead{i}"),
            QueueConfig::default(),
        );
        let w = dead.consume("w", prefetch(10)).unwrap();
        let a = q.consume("a", prefetch(10)).unwrap();
        put(&q, "x");
        put(&q, "y");
        assert!(next(&a).reject());
        assert!(next(&a).reject());
        let x = next(&w);
        let y = next(&w);
        assert_eq!(
            (x.envelope().id.as_str(), y.envelope().id.as_str()),
            ("x", "y")
        );
        assert_eq!(
            y.envelope().death,
            death(&format!("dl.shard.src{i}"), DeathReason::Rejected, 1)
        );
        assert_stats!(q, { dead_lettered: 2, dropped: 0 });
        assert_stats!(dead, { enqueued: 2, leased: 2 });
    }
}

#[test]
fn redeclared_dead_letter_queue_receives_the_letter() {
    let broker = broker4();
    let (q, old_dead) = dead_letter_pair(
        &broker,
        "dl.redecl",
        "dl.redecl.dead",
        QueueConfig::default(),
    );
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert!(old_dead.close());
    let new_dead = timeout_queue(&broker, "dl.redecl.dead", secs(99));
    let w = new_dead.consume("w", prefetch(10)).unwrap();
    assert!(next(&a).reject());
    assert_eq!(next(&w).envelope().id, "m1");
    assert_stats!(new_dead, { enqueued: 1 });
    assert_stats!(old_dead, { enqueued: 0, ready: 0, leased: 0 });
    assert_stats!(q, { dead_lettered: 1, dropped: 0 });
    // Closed again and not re-declared: dropped.
    assert!(new_dead.close());
    assert!(next(&a).reject());
    assert_stats!(q, { dead_lettered: 1, dropped: 1, rejected: 2 });
}

#[test]
fn dead_letter_to_a_closed_queue_is_dropped_and_counted() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "dl.closed",
        "dl.closed.dead",
        QueueConfig::default(),
    );
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m");
    assert!(dead.close());
    assert!(next(&a).reject());
    assert_stats!(q, { rejected: 1, dead_lettered: 0, dropped: 1, ready: 0, leased: 0 });
    assert_stats!(dead, { enqueued: 0 });
    assert!(broker.queue("dl.closed.dead").is_none());
}

#[test]
fn dead_letter_refused_by_a_full_queue_is_dropped() {
    let broker = broker();
    let (q, dead) = dead_letter_pair_with(
        &broker,
        "dl.full",
        QueueConfig::default(),
        "dl.full.dead",
        QueueConfig {
            max_length: Some(1),
            ..QueueConfig::default()
        },
    );
    put(&dead, "filler");
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m");
    assert!(next(&a).reject());
    assert_stats!(q, { dead_lettered: 0, dropped: 1 });
    assert_stats!(dead, { enqueued: 1, ready: 1 });
}

#[test]
fn dead_letter_to_a_full_drop_head_queue_drops_its_head() {
    let broker = broker();
    let (q, dead) = dead_letter_pair_with(
        &broker,
        "dl.drop_head",
        QueueConfig::default(),
        "dl.drop_head.dead",
        QueueConfig {
            max_length: Some(1),
            overflow: Overflow::DropHead,
            ..QueueConfig::default()
        },
    );
    put(&dead, "filler");
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m");
    assert!(next(&a).reject());
    assert_stats!(q, { dead_lettered: 1, dropped: 0 });
    assert_stats!(dead, { enqueued: 2, ready: 1, dropped: 1 });
    let d = next(&dead.consume("b", prefetch(1)).unwrap());
    assert_eq!(d.envelope().id, "m");
}

#[test]
fn dead_letter_whose_id_is_a_duplicate_in_the_dead_letter_queue_is_dropped() {
    let broker = broker();
    let (q, dead) = dead_letter_pair_with(
        &broker,
        "dl.dup",
        QueueConfig::default(),
        "dl.dup.dead",
        QueueConfig {
            dedup_window: secs(3600),
            ..QueueConfig::default()
        },
    );
    let w = dead.consume("w", prefetch(10)).unwrap();
    put(&dead, "windowed");
    assert!(next(&w).ack()); // gone, but still inside the dedup window
    put(&dead, "live"); // leased to w below
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "live");
    put(&q, "windowed");
    put(&q, "fresh");
    assert!(next(&a).reject());
    assert!(next(&a).reject());
    assert!(next(&a).reject());
    assert_stats!(q, { rejected: 3, dead_lettered: 1, dropped: 2 });
    assert_stats!(dead, { enqueued: 3 });
    let got = next(&w);
    assert_eq!(got.envelope().id, "live");
    assert_eq!(got.envelope().death, None);
    let got = next(&w);
    assert_eq!(got.envelope().id, "fresh");
    assert_eq!(
        got.envelope().death,
        death("dl.dup", DeathReason::Rejected, 1)
    );
}

#[test]
fn dead_letter_too_large_for_the_dead_letter_queue_is_dropped() {
    let broker = broker();
    let (q, dead) = dead_letter_pair_with(
        &broker,
        "dl.size",
        QueueConfig::default(),
        "dl.size.dead",
        QueueConfig {
            max_body_bytes: 4,
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(10)).unwrap();
    q.put(Message::new("four").with_id("small")).unwrap();
    q.put(Message::new("fivey").with_id("big")).unwrap();
    assert!(next(&a).reject());
    assert!(next(&a).reject());
    assert_stats!(q, { dead_lettered: 1, dropped: 1 });
    assert_stats!(dead, { enqueued: 1, ready: 1 });
}

#[test]
fn broker_assigned_ids_are_kept_and_never_duplicates_in_the_dead_letter_queue() {
    let broker = broker4();
    let (q, dead) = dead_letter_pair_with(
        &broker,
        "dl.anon",
        QueueConfig::default(),
        "dl.anon.dead",
        QueueConfig {
            dedup_window: secs(3600),
            ..QueueConfig::default()
        },
    );
    // Id-less messages put straight on the dead-letter queue, too.
    dead.put(Message::new("direct")).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    let w = dead.consume("w", prefetch(10)).unwrap();
    next(&w);
    let mut src_ids = Vec::new();
    for _ in 0..5 {
        q.put(Message::new("anonymous")).unwrap();
        let d = next(&a);
        src_ids.push(d.envelope().id.clone());
        assert!(d.reject());
    }
    let dead_ids: Vec<String> = (0..5).map(|_| next(&w).envelope().id.clone()).collect();
    assert_eq!(dead_ids, src_ids);
    assert_stats!(q, { dead_lettered: 5, dropped: 0 });
    assert_stats!(dead, { enqueued: 6, duplicates: 0 });
}
