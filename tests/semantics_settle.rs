//! Contract §3 settles: `ack`, `ack_up_to`, `nack` and the retry policy, `nack_with_delay`,
//! `reject` without a dead-letter queue, `touch` and `max_lease`, `release`, `settle_batch`,
//! and a consumer's own lease.

use std::time::Duration;

use leasemq::{ConsumeOptions, DeliveryTag, QueueConfig, RetryPolicy, Settle};

mod common;
use common::*;

// --- ack ---------------------------------------------------------------------------------

#[test]
fn ack_removes_the_message_for_good() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.ack", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    let d = next(&a);
    assert!(d.ack());
    assert_stats!(q, { ready: 0, delayed: 0, leased: 0, acked: 1, delivered: 1 });
    broker.advance(secs(3600)).unwrap();
    nothing(&a);
    assert_stats!(q, { expired: 0, delivered: 1 });
}

#[test]
fn ack_up_to_acks_read_and_unread_leases_of_that_consumer_only() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.upto", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    let b = q.consume("b", prefetch(10)).unwrap();
    for i in 1..=6 {
        put(&q, &format!("m{i}"));
    }
    // a holds tags 1, 3, 5; b holds 2, 4, 6. a reads only its first one.
    assert_eq!(seen(&a), s("m1", 1, 1));
    assert_eq!(a.ack_up_to(DeliveryTag(5)), 3);
    assert_stats!(q, { acked: 3, leased: 3, stale: 0 });
    // Tag 6 is b's: a has nothing left to ack.
    assert_eq!(a.ack_up_to(DeliveryTag(6)), 0);
    assert_stats!(q, { acked: 3, leased: 3, stale: 0 });
    assert_eq!(b.ack_up_to(DeliveryTag(3)), 1);
    assert_eq!(b.ack_up_to(DeliveryTag(6)), 2);
    assert_stats!(q, { acked: 6, leased: 0, stale: 0 });
    assert!(!q.ack(DeliveryTag(4)));
}

#[test]
fn ack_up_to_counts_only_live_leases_and_frees_credit() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.uptolive", secs(10));
    let a = q.consume("a", prefetch(4)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    broker.advance(secs(5)).unwrap();
    put(&q, "m3");
    put(&q, "m4");
    assert!(q.ack(DeliveryTag(2)));
    put(&q, "m5"); // tag 5, deadline 15 s
    broker.advance(secs(5)).unwrap(); // tag 1 expired at 10 s and came back as tag 6
    let tags: Vec<u64> = std::iter::from_fn(|| a.try_recv().unwrap())
        .map(|d| d.tag().0)
        .collect();
    assert_eq!(tags, vec![1, 2, 3, 4, 5, 6]);
    // Live: 3, 4, 5 (and 6 above the bound). 1 expired, 2 was acked.
    assert_eq!(a.ack_up_to(DeliveryTag(5)), 3);
    assert_stats!(q, { acked: 4, leased: 1, stale: 0, expired: 1 });
    put(&q, "m6");
    put(&q, "m7");
    put(&q, "m8");
    put(&q, "m9"); // a holds 6, 7, 8, 9: m9 waits
    assert_stats!(q, { ready: 1, leased: 4 });
    assert_eq!(a.ack_up_to(DeliveryTag(7)), 2);
    assert_eq!(seen(&a), s("m6", 7, 1));
    assert_eq!(seen(&a), s("m7", 8, 1));
    assert_eq!(seen(&a), s("m8", 9, 1));
    assert_eq!(seen(&a), s("m9", 10, 1));
    assert_stats!(q, { ready: 0, leased: 3, acked: 6 });
}

// --- nack and the retry policy ----------------------------------------------------------

#[test]
fn nack_waits_the_retry_delay_growing_by_the_multiplier_up_to_max() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.retry",
        QueueConfig {
            ack_timeout: secs(60),
            retry: RetryPolicy {
                initial: secs(1),
                multiplier: 2.0,
                max: secs(3),
                jitter: 0.0,
            },
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    // delay(1) = 1 s, delay(2) = 2 s, delay(3) = min(4 s, 3 s), delay(4) = min(8 s, 3 s).
    for (attempt, wait_ms) in [(1_u32, 1000_u64), (2, 2000), (3, 3000), (4, 3000)] {
        let d = next(&a);
        assert_eq!(d.envelope().attempt, attempt);
        assert!(d.nack());
        assert_stats!(q, { delayed: 1, leased: 0 });
        broker.advance(ms(wait_ms - 1)).unwrap();
        nothing(&a);
        broker.advance(ms(1)).unwrap();
    }
    let d = next(&a);
    assert_eq!((d.tag().0, d.envelope().attempt), (5, 5));
    assert!(d.envelope().redelivered());
    assert_stats!(q, { nacked: 4, delivered: 5 });
}

#[test]
fn default_retry_policy_waits_one_second_then_two() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.default", secs(60));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert!(next(&a).nack());
    broker.advance(ms(999)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    assert!(next(&a).nack());
    broker.advance(ms(1999)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    assert_eq!(seen(&a), s("m", 3, 3));
}

#[test]
fn immediate_retry_policy_redelivers_before_nack_returns() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.immediate",
        QueueConfig {
            retry: RetryPolicy::immediate(),
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    for attempt in 1..=4_u32 {
        let d = next(&a);
        assert_eq!(d.envelope().attempt, attempt);
        assert_eq!(d.envelope().redelivered(), attempt > 1);
        assert!(d.nack());
    }
    assert_eq!(seen(&a), s("m", 5, 5));
    assert_stats!(q, { nacked: 4, delayed: 0 });
}

#[test]
fn nack_with_delay_uses_its_delay_instead_of_the_policy() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.nackdelay", secs(60));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert!(next(&a).nack_with_delay(secs(5)));
    broker.advance(secs(5) - ms(1)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    let d = next(&a);
    assert_eq!((d.tag().0, d.envelope().attempt), (2, 2));
    // Zero: ready at once.
    assert!(q.nack_with_delay(d.tag(), Duration::ZERO));
    assert_eq!(seen(&a), s("m", 3, 3));
    assert_stats!(q, { nacked: 2 });
}

#[test]
fn nack_with_delay_over_seven_days_is_refused_and_not_stale() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.nackweek", secs(60));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a);
    let before = q.stats();
    assert!(!d.nack_with_delay(SEVEN_DAYS + ms(1)));
    assert!(!q.settle_batch(&[(d.tag(), Settle::NackWithDelay(SEVEN_DAYS + ms(1)))])[0]);
    assert_eq!(q.stats(), before, "nothing changes, not even stale");
    // The lease is intact; exactly seven days is accepted.
    assert!(d.nack_with_delay(SEVEN_DAYS));
    assert_stats!(q, { delayed: 1, leased: 0, nacked: 1, stale: 0 });
    broker.advance(SEVEN_DAYS - ms(1)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    assert_eq!(seen(&a), s("m", 2, 2));
}

// --- reject ------------------------------------------------------------------------------

#[test]
fn reject_without_a_dead_letter_queue_drops_the_message() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.reject", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    assert!(next(&a).reject());
    assert_stats!(q, {
        ready: 0, delayed: 0, leased: 0, rejected: 1, dropped: 1, dead_lettered: 0,
        acked: 0, nacked: 0,
    });
    broker.advance(secs(3600)).unwrap();
    nothing(&a);
}

// --- touch and max_lease -----------------------------------------------------------------

#[test]
fn touch_restarts_the_lease_clock_from_now() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.touch", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a);
    broker.advance(secs(6)).unwrap();
    assert!(d.touch()); // deadline 16 s
    broker.advance(secs(10) - ms(1)).unwrap();
    assert_stats!(q, { expired: 0, leased: 1 });
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    assert_stats!(q, { expired: 1 });
    assert_eq!(seen(&a), s("m", 2, 2));
    assert!(!d.touch());
    assert_stats!(q, { stale: 1 });
}

#[test]
fn repeated_touches_keep_a_lease_alive_without_max_lease() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.keepalive", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a);
    for _ in 0..500 {
        broker.advance(secs(9)).unwrap();
        assert!(d.touch());
    }
    assert_stats!(q, { expired: 0, leased: 1, delivered: 1 });
    assert!(d.ack());
}

#[test]
fn touch_is_refused_past_max_lease_and_not_counted_as_stale() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.maxlease",
        QueueConfig {
            ack_timeout: secs(10),
            max_lease: Some(secs(25)),
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a); // delivered at 0: no deadline past 25 s
    broker.advance(secs(6)).unwrap();
    assert!(d.touch()); // 16 s
    broker.advance(secs(9)).unwrap();
    assert!(d.touch()); // 15 s + 10 s = 25 s: exactly max_lease
    broker.advance(ms(1)).unwrap();
    let before = q.stats();
    assert!(!d.touch()); // would be 25.001 s
    assert!(!q.touch(d.tag()));
    assert!(!q.settle_batch(&[(d.tag(), Settle::Touch)])[0]);
    assert_eq!(
        q.stats(),
        before,
        "a touch refused by max_lease changes nothing"
    );
    // The deadline stays 25 s.
    broker.advance(secs(10) - ms(2)).unwrap(); // 24.999 s
    assert_stats!(q, { expired: 0, leased: 1 });
    broker.advance(ms(1)).unwrap();
    assert_stats!(q, { expired: 1, stale: 0 });
    assert_eq!(seen(&a), s("m", 2, 2));
}

#[test]
fn max_lease_is_counted_from_each_delivery() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.maxlease2",
        QueueConfig {
            ack_timeout: secs(10),
            max_lease: Some(secs(15)),
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let first = next(&a);
    broker.advance(secs(10)).unwrap(); // expired; redelivered at 10 s
    assert!(!first.touch());
    let second = next(&a);
    broker.advance(secs(5)).unwrap(); // 15 s: 5 s into the second lease
    assert!(second.touch()); // 25 s = 10 s + 15 s
    broker.advance(ms(1)).unwrap();
    assert!(!second.touch());
    assert_stats!(q, { stale: 1, expired: 1 });
}

// --- release -----------------------------------------------------------------------------

#[test]
fn release_puts_the_message_back_at_the_front_with_the_same_attempt() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.release",
        QueueConfig {
            retry: RetryPolicy::immediate(),
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    let d = next(&a);
    assert!(d.release());
    let d = next(&a);
    assert_eq!(
        (d.envelope().id.as_str(), d.tag().0, d.envelope().attempt),
        ("m1", 2, 1)
    );
    assert!(!d.envelope().redelivered());
    assert!(d.nack());
    let d = next(&a);
    assert_eq!(
        (d.envelope().id.as_str(), d.tag().0, d.envelope().attempt),
        ("m1", 3, 2)
    );
    assert!(q.release(d.tag()));
    assert_eq!(seen(&a), s("m1", 4, 2));
    nothing(&a);
    assert_stats!(q, { released: 2, nacked: 1, delivered: 4, ready: 1, leased: 1 });
}

#[test]
fn released_message_goes_before_messages_already_waiting_to_come_back() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.releasefront", secs(60));
    let a = q.consume("a", prefetch(2)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    put(&q, "m3");
    let d1 = next(&a);
    let d2 = next(&a);
    assert!(d1.nack_with_delay(secs(1)));
    assert_eq!(seen(&a), s("m3", 3, 1));
    broker.advance(secs(1)).unwrap(); // m1 is back and waits: a has no credit
    assert_stats!(q, { ready: 1, leased: 2 });
    assert!(d2.release()); // to the front, ahead of m1
    assert_eq!(seen(&a), s("m2", 4, 1));
    assert!(q.ack(DeliveryTag(4)));
    assert_eq!(seen(&a), s("m1", 5, 2));
}

#[test]
fn release_does_not_count_toward_max_deliveries() {
    let broker = broker();
    let q = queue_with(
        &broker,
        "settle.releasemax",
        QueueConfig {
            max_deliveries: Some(1),
            ..QueueConfig::default()
        },
    );
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    for tag in 1..=5_u64 {
        let d = next(&a);
        assert_eq!((d.tag().0, d.envelope().attempt), (tag, 1));
        assert!(d.release());
    }
    assert_stats!(q, { released: 5, dead_lettered: 0, dropped: 0, leased: 1 });
}

// --- settle_batch ------------------------------------------------------------------------

#[test]
fn settle_batch_applies_settles_in_order_with_one_result_each() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.batch", secs(10));
    let a = q.consume("a", prefetch(5)).unwrap();
    for i in 1..=5 {
        put(&q, &format!("m{i}"));
    }
    for _ in 1..=5 {
        next(&a);
    }
    let t = DeliveryTag;
    let results = q.settle_batch(&[
        (t(1), Settle::Ack),
        (t(1), Settle::Ack),
        (t(2), Settle::Touch),
        (t(2), Settle::NackWithDelay(secs(5))),
        (t(2), Settle::Ack),
        (t(3), Settle::Reject),
        (t(4), Settle::Release),
        (t(5), Settle::Nack),
        (t(99), Settle::Ack),
    ]);
    assert_eq!(
        results,
        vec![true, false, true, true, false, true, true, true, false]
    );
    assert_stats!(q, {
        acked: 1, stale: 3, nacked: 2, rejected: 1, dropped: 1, released: 1,
        delayed: 2, leased: 1, ready: 0,
    });
    // The released m4 went straight back to a, with the same attempt.
    assert_eq!(seen(&a), s("m4", 6, 1));
    // m5 (policy: 1 s) comes back before m2 (5 s).
    broker.advance(secs(1)).unwrap();
    assert_eq!(seen(&a), s("m5", 7, 2));
    broker.advance(secs(4)).unwrap();
    assert_eq!(seen(&a), s("m2", 8, 2));
    assert!(q.settle_batch(&[]).is_empty());
}

#[test]
fn settle_batch_nowait_is_applied_in_order_before_the_callers_next_call() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.nowait", secs(10));
    let a = q.consume("a", prefetch(4)).unwrap();
    for i in 1..=4 {
        put(&q, &format!("m{i}"));
    }
    for _ in 1..=4 {
        next(&a);
    }
    let t = DeliveryTag;
    q.settle_batch_nowait(&[
        (t(1), Settle::Ack),
        (t(1), Settle::Ack),
        (t(2), Settle::Release),
        (t(3), Settle::Ack),
        (t(99), Settle::Ack),
    ]);
    // The next call (`stats`) is answered after them: a stale tag is counted as ever.
    assert_stats!(q, { acked: 2, stale: 2, released: 1, leased: 2 });
    // The released m2 went back to a, with the same attempt.
    assert_eq!(seen(&a), s("m2", 5, 1));
    q.settle_batch_nowait(&[]);
    q.settle_batch_nowait(&[(t(4), Settle::Ack), (t(5), Settle::Ack)]);
    assert_stats!(q, { acked: 4, leased: 0, ready: 0 });
    // On a closed queue it is refused quietly, as the answer would have been `false`.
    assert!(q.close());
    q.settle_batch_nowait(&[(t(5), Settle::Ack)]);
    assert_stats!(q, { acked: 4, stale: 2 });
}

#[test]
fn delivery_handles_settle_their_own_tag_on_their_own_queue() {
    let broker = broker();
    let q1 = timeout_queue(&broker, "settle.handle1", secs(10));
    let q2 = timeout_queue(&broker, "settle.handle2", secs(10));
    let a1 = q1.consume("a", prefetch(1)).unwrap();
    let a2 = q2.consume("a", prefetch(1)).unwrap();
    put(&q1, "x");
    put(&q2, "y");
    let d1 = next(&a1);
    let d2 = next(&a2);
    assert_eq!((d1.tag(), d2.tag()), (DeliveryTag(1), DeliveryTag(1)));
    assert!(d1.ack());
    assert_stats!(q2, { acked: 0, leased: 1 });
    assert!(d2.touch());
    assert!(d2.ack());
    assert_stats!(q1, { acked: 1, leased: 0 });
    assert_stats!(q2, { acked: 1, leased: 0 });
}

// --- a consumer's own lease (`ConsumeOptions::ack_timeout`) ------------------------------

/// A consumer of `q` (prefetch 1) whose own lease is 2 s, given one message put: the
/// consumer and its delivery.
fn quick_with_one(q: &leasemq::Queue) -> (leasemq::Consumer, leasemq::Delivery) {
    let options = ConsumeOptions::default().ack_timeout(secs(2));
    let quick = q.consume_with("quick", prefetch(1), options).unwrap();
    put(q, "m1");
    let first = next(&quick);
    (quick, first)
}

#[test]
fn a_consumers_own_lease_replaces_the_queues_for_its_deliveries_and_touches() {
    let broker = broker();
    let q = timeout_queue(&broker, "settle.own_lease", secs(30));
    let (quick, first) = quick_with_one(&q);
    let plain = q.consume("plain", prefetch(1)).unwrap();
    put(&q, "m2");
    let second = next(&plain);
    // Two seconds: the quick consumer's lease ends, the queue's 30 s one does not.
    broker.advance(secs(2)).unwrap();
    assert!(!first.ack(), "its 2 s lease ran out");
    assert_eq!(seen(&quick), s("m1", first.tag().0 + 2, 2));
    assert!(second.ack());
    // A touch restarts the consumer's own lease, not the queue's.
    let again = q.consume("plain2", prefetch(1)).unwrap();
    nothing(&again);
    broker.advance(ms(1_500)).unwrap();
    let held = DeliveryTag(first.tag().0 + 2);
    assert!(q.touch(held));
    broker.advance(ms(1_500)).unwrap();
    assert!(q.ack(held), "touched 1.5 s ago, for 2 s");
}

#[test]
fn a_consumers_own_lease_restarts_at_its_hand_over_on_a_durable_queue() {
    let dir = tempfile::tempdir().unwrap();
    let broker = leasemq::Broker::builder()
        .manual_clock()
        .data_dir(dir.path())
        .build()
        .unwrap();
    let config = QueueConfig {
        durable: true,
        ..with_ack_timeout(secs(30))
    };
    let q = queue_with(&broker, "settle.own_lease_durable", config);
    let (quick, first) = quick_with_one(&q);
    broker.advance(secs(2)).unwrap();
    assert!(!first.ack(), "its 2 s lease ran out, not the queue's 30 s");
    assert_eq!(seen(&quick).2, 2);
}

#[test]
fn a_consumers_own_lease_is_checked_against_the_limits() {
    let broker = broker();
    let config = QueueConfig {
        max_lease: Some(secs(60)),
        ..with_ack_timeout(secs(10))
    };
    let q = queue_with(&broker, "settle.own_lease_limits", config);
    for lease in [Duration::ZERO, secs(61), secs(8 * 24 * 3600)] {
        let options = ConsumeOptions::default().ack_timeout(lease);
        let refused = q.consume_with("c", prefetch(1), options).unwrap_err();
        assert!(
            matches!(refused, leasemq::Error::InvalidConfig(_)),
            "{lease:?}: {refused:?}"
        );
    }
    assert_stats!(q, { consumers: 0 });
    let options = ConsumeOptions::default().ack_timeout(secs(60)).priority(3);
    assert!(q.consume_with("c", prefetch(1), options).is_ok());
}
