//! Contract §3 Dispatch: round robin in registration order, credit, consumer priorities,
//! and returned messages before fresh ones in the order they became ready again.

use leasemq::{DeliveryTag, QueueConfig, RetryPolicy};

mod common;
use common::*;

#[test]
fn first_delivery_goes_to_the_first_registered_consumer() {
    let broker = broker();
    let q = plain(&broker, "dispatch.first");
    let a = q.consume("a", prefetch(5)).unwrap();
    let b = q.consume("b", prefetch(5)).unwrap();
    put(&q, "m1");
    assert_eq!(seen(&a), s("m1", 1, 1));
    nothing(&b);
}

#[test]
fn deliveries_go_round_robin_in_registration_order() {
    let broker = broker();
    let q = plain(&broker, "dispatch.rr");
    // Registered in the order c, a, b: names do not matter, registration does.
    let c = q.consume("c", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    let b = q.consume("b", prefetch(10)).unwrap();
    for i in 1..=7 {
        put(&q, &format!("m{i}"));
    }
    assert_eq!(seen(&c), s("m1", 1, 1));
    assert_eq!(seen(&a), s("m2", 2, 1));
    assert_eq!(seen(&b), s("m3", 3, 1));
    assert_eq!(seen(&c), s("m4", 4, 1));
    assert_eq!(seen(&a), s("m5", 5, 1));
    assert_eq!(seen(&b), s("m6", 6, 1));
    assert_eq!(seen(&c), s("m7", 7, 1));
    for consumer in [&a, &b, &c] {
        nothing(consumer);
    }
}

#[test]
fn round_robin_skips_consumers_without_credit_and_resumes_after_the_last_receiver() {
    let broker = broker();
    let q = plain(&broker, "dispatch.credit");
    let a = q.consume("a", prefetch(1)).unwrap();
    let b = q.consume("b", prefetch(100)).unwrap();
    let c = q.consume("c", prefetch(100)).unwrap();
    for i in 1..=5 {
        put(&q, &format!("m{i}"));
    }
    // a, b, c, then a has no credit: b, c.
    assert_eq!(seen(&a), s("m1", 1, 1));
    assert_eq!(seen(&b), s("m2", 2, 1));
    assert_eq!(seen(&c), s("m3", 3, 1));
    assert_eq!(seen(&b), s("m4", 4, 1));
    assert_eq!(seen(&c), s("m5", 5, 1));
    // A consumer registered now comes last in the rotation; c got the previous delivery.
    let d = q.consume("d", prefetch(100)).unwrap();
    nothing(&d);
    put(&q, "m6");
    assert_eq!(seen(&d), s("m6", 6, 1));
    put(&q, "m7"); // a still has no credit
    assert_eq!(seen(&b), s("m7", 7, 1));
    nothing(&a);
    nothing(&c);
}

/// Consumer priorities (AMQP's `x-priority`): deliveries go to the consumers with credit of
/// the highest priority, round robin among them; a lower one gets only what the higher ones
/// have no credit for, whatever the order they registered in.
#[test]
fn consumers_of_the_highest_priority_with_credit_come_first() {
    let broker = broker();
    let q = plain(&broker, "dispatch.consumer-priority");
    let low = q.consume_with_priority("low", prefetch(10), -3).unwrap();
    let mid = q.consume("mid", prefetch(2)).unwrap();
    let hi1 = q.consume_with_priority("hi1", prefetch(2), 5).unwrap();
    let hi2 = q.consume_with_priority("hi2", prefetch(1), 5).unwrap();
    for i in 1..=7 {
        put(&q, &format!("m{i}"));
    }
    assert_eq!(seen(&hi1), s("m1", 1, 1));
    assert_eq!(seen(&hi2), s("m2", 2, 1));
    assert_eq!(seen(&hi1), s("m3", 3, 1));
    assert_eq!(seen(&mid), s("m4", 4, 1));
    assert_eq!(seen(&mid), s("m5", 5, 1));
    assert_eq!(seen(&low), s("m6", 6, 1));
    assert_eq!(seen(&low), s("m7", 7, 1));
    // Credit coming back to a higher one takes the next message from the lower ones.
    assert!(q.ack(DeliveryTag(2)));
    put(&q, "m8");
    assert_eq!(seen(&hi2), s("m8", 8, 1));
    // A consumer of a new highest priority comes first at once.
    let top = q.consume_with_priority("top", prefetch(1), 9).unwrap();
    put(&q, "m9");
    assert_eq!(seen(&top), s("m9", 9, 1));
    put(&q, "m10");
    assert_eq!(seen(&low), s("m10", 10, 1));
    for consumer in [&low, &mid, &hi1, &hi2, &top] {
        nothing(consumer);
    }
    // A cancelled consumer's leases come back, to the highest priority with credit.
    hi1.cancel();
    assert_eq!(seen(&low), s("m1", 11, 2));
    assert_eq!(seen(&low), s("m3", 12, 2));
}

/// Each priority keeps its own round robin: deliveries to a higher consumer in between do
/// not send the lower ones' turn back to their first.
#[test]
fn each_consumer_priority_keeps_its_own_round_robin() {
    let broker = broker();
    let q = plain(&broker, "dispatch.priority-turns");
    let hi = q.consume_with_priority("hi", prefetch(1), 5).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    let b = q.consume("b", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert_eq!(seen(&hi), s("m1", 1, 1));
    assert_eq!(seen(&a), s("m2", 2, 1));
    assert!(q.ack(DeliveryTag(1)));
    put(&q, "m3");
    put(&q, "m4");
    assert_eq!(seen(&hi), s("m3", 3, 1));
    assert_eq!(seen(&b), s("m4", 4, 1));
    assert!(q.ack(DeliveryTag(3)));
    put(&q, "m5");
    put(&q, "m6");
    assert_eq!(seen(&hi), s("m5", 5, 1));
    assert_eq!(seen(&a), s("m6", 6, 1));
    // A higher consumer that comes and goes without a delivery leaves the turn as it was.
    assert!(q.ack(DeliveryTag(5)));
    hi.cancel();
    let h2 = q.consume_with_priority("h2", prefetch(1), 9).unwrap();
    h2.cancel();
    put(&q, "m7");
    assert_eq!(seen(&b), s("m7", 7, 1));
    for consumer in [&a, &b] {
        nothing(consumer);
    }
}

#[test]
fn consume_delivers_the_waiting_messages_before_it_returns() {
    let broker = broker();
    let q = plain(&broker, "dispatch.consume");
    put(&q, "m1");
    put(&q, "m2");
    put(&q, "m3");
    assert_stats!(q, { ready: 3, leased: 0, consumers: 0 });
    let a = q.consume("a", prefetch(2)).unwrap();
    assert_eq!(seen(&a), s("m1", 1, 1));
    assert_eq!(seen(&a), s("m2", 2, 1));
    nothing(&a);
    assert_stats!(q, { ready: 1, leased: 2, consumers: 1, delivered: 2 });
}

#[test]
fn prefetch_bounds_the_live_leases_of_a_consumer() {
    let broker = broker();
    let q = plain(&broker, "dispatch.prefetch");
    let a = q.consume("a", prefetch(2)).unwrap();
    for i in 1..=5 {
        put(&q, &format!("m{i}"));
    }
    let d1 = next(&a);
    let d2 = next(&a);
    nothing(&a);
    assert_stats!(q, { ready: 3, leased: 2 });
    // A settle frees credit, and the next message is in the channel when it returns.
    assert!(d1.ack());
    assert_eq!(seen(&a), s("m3", 3, 1));
    nothing(&a);
    assert!(d2.reject());
    assert_eq!(seen(&a), s("m4", 4, 1));
    nothing(&a);
    assert_stats!(q, { ready: 1, leased: 2 });
}

#[test]
fn returned_messages_go_before_fresh_ones_in_the_order_they_became_ready_again() {
    let broker = broker();
    let q = plain(&broker, "dispatch.returned");
    let a = q.consume("a", prefetch(3)).unwrap();
    for i in 1..=5 {
        put(&q, &format!("m{i}"));
    }
    let d1 = next(&a);
    let d2 = next(&a);
    let d3 = next(&a);
    // m1 waits 2 s, m3 waits 1 s: m3 becomes ready first although it was nacked second.
    assert!(d1.nack_with_delay(secs(2)));
    assert_eq!(seen(&a), s("m4", 4, 1)); // nothing returned is ready yet: a fresh one
    assert!(d3.nack_with_delay(secs(1)));
    assert_eq!(seen(&a), s("m5", 5, 1));
    put(&q, "m6"); // fresh, and enqueued before m3 and m1 come back
    nothing(&a);
    broker.advance(secs(2)).unwrap();
    nothing(&a);
    assert_stats!(q, { ready: 3, delayed: 0, leased: 3 });
    assert!(d2.ack());
    assert_eq!(seen(&a), s("m3", 6, 2));
    assert!(q.ack(DeliveryTag(4)));
    assert_eq!(seen(&a), s("m1", 7, 2));
    assert!(q.ack(DeliveryTag(5)));
    assert_eq!(seen(&a), s("m6", 8, 1));
}

#[test]
fn expired_messages_go_before_fresh_ones() {
    let broker = broker();
    let q = timeout_queue(&broker, "dispatch.expired", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert_eq!(seen(&a), s("m1", 1, 1));
    broker.advance(secs(10)).unwrap();
    // m1 came back at 10 s and went to a (credit regained) before m2, which waited longer.
    assert_eq!(seen(&a), s("m1", 2, 2));
    nothing(&a);
}

#[test]
fn nacked_message_is_redelivered_to_the_next_consumer_in_the_rotation() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "dispatch.nack",
            QueueConfig {
                retry: RetryPolicy::immediate(),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    let b = q.consume("b", prefetch(10)).unwrap();
    put(&q, "m1");
    let d = next(&a);
    assert!(d.nack()); // the previous delivery went to a, so b is next
    assert_eq!(seen(&b), s("m1", 2, 2));
    nothing(&a);
}

#[test]
fn commands_from_one_thread_reach_the_queue_in_order() {
    let broker = broker();
    let q = plain(&broker, "dispatch.fifo");
    for i in 0..200 {
        put(&q, &format!("m{i:03}"));
    }
    let a = q.consume("a", prefetch(500)).unwrap();
    for i in 0..200_u64 {
        assert_eq!(seen(&a), s(&format!("m{i:03}"), i + 1, 1));
    }
    nothing(&a);
}

/// With `max_priority`, the ready messages go highest priority first; within a priority,
/// returned before fresh, each in its usual order; a priority above the maximum counts as
/// the maximum, and a queue without priorities ignores them.
#[test]
fn priorities_go_first_and_keep_the_usual_order_within_a_level() {
    let broker = broker();
    let config = QueueConfig {
        max_priority: Some(2),
        ..QueueConfig::default()
    };
    let q = queue_with(&broker, "dispatch.priority", config);
    let with = |id: &str, priority: u8| {
        q.put(msg(id).with_priority(priority)).unwrap();
    };
    with("low-1", 0);
    with("mid-1", 1);
    with("top-1", 2);
    with("low-2", 0);
    with("over-1", 9); // counts as 2, after top-1
    with("mid-2", 1);
    let a = q.consume("a", prefetch(2)).unwrap();
    assert_eq!(seen(&a), s("top-1", 1, 1));
    let over = next(&a);
    assert_eq!(over.envelope().id, "over-1");
    // Back among the returned of its own level, ahead of nothing fresh at a higher one.
    assert!(over.nack_with_delay(secs(0)));
    assert_eq!(seen(&a), s("over-1", 3, 2));
    assert!(q.ack(DeliveryTag(1)));
    assert!(q.ack(DeliveryTag(3)));
    assert_eq!(seen(&a), s("mid-1", 4, 1));
    assert_eq!(seen(&a), s("mid-2", 5, 1));
    // A released low-priority message goes first among the low ones only.
    assert!(q.ack(DeliveryTag(4)));
    assert_eq!(seen(&a), s("low-1", 6, 1));
    with("mid-3", 1);
    assert!(q.release(DeliveryTag(6)));
    assert!(q.ack(DeliveryTag(5)));
    assert_eq!(seen(&a), s("mid-3", 7, 1));
    assert_eq!(seen(&a), s("low-1", 8, 1));
    assert!(q.ack(DeliveryTag(7)));
    assert_eq!(seen(&a), s("low-2", 9, 1));
    nothing(&a);

    let fifo = plain(&broker, "dispatch.no-priority");
    fifo.put(msg("first").with_priority(0)).unwrap();
    fifo.put(msg("second").with_priority(9)).unwrap();
    let b = fifo.consume("b", prefetch(2)).unwrap();
    assert_eq!(seen(&b), s("first", 1, 1));
    assert_eq!(seen(&b), s("second", 2, 1));
}

/// A drop-head queue with priorities drops the message dispatch would hand out next (the
/// first of the highest priority waiting) before the new one joins, so a new message of a
/// priority above every waiting one stays (RabbitMQ drops that one itself); a dead letter
/// keeps its priority in a dead-letter queue that has priorities.
#[test]
fn drop_head_and_dead_letters_follow_priorities() {
    let broker = broker();
    let capped = queue_with(
        &broker,
        "dispatch.priority-capped",
        QueueConfig {
            max_priority: Some(1),
            max_length: Some(2),
            overflow: leasemq::Overflow::DropHead,
            ..QueueConfig::default()
        },
    );
    capped.put(msg("low").with_priority(0)).unwrap();
    capped.put(msg("high").with_priority(1)).unwrap();
    capped.put(msg("new").with_priority(0)).unwrap();
    assert_stats!(capped, { ready: 2, dropped: 1 });
    // Room is made before the message joins: one above every waiting one stays.
    capped.put(msg("top").with_priority(1)).unwrap();
    assert_stats!(capped, { ready: 2, dropped: 2 });
    let a = capped.consume("a", prefetch(2)).unwrap();
    assert_eq!(seen(&a), s("top", 1, 1));
    assert_eq!(seen(&a), s("new", 2, 1));

    let priorities = QueueConfig {
        max_priority: Some(5),
        ..QueueConfig::default()
    };
    let (src, dlq) = dead_letter_pair_with(
        &broker,
        "dispatch.priority-src",
        QueueConfig::default(),
        "dispatch.priority-dlq",
        priorities,
    );
    dlq.put(msg("waiting").with_priority(1)).unwrap();
    src.put(msg("urgent").with_priority(4)).unwrap();
    let c = src.consume("c", prefetch(1)).unwrap();
    assert!(next(&c).reject());
    let d = dlq.consume("d", prefetch(2)).unwrap();
    assert_eq!(seen(&d).0, "urgent");
    assert_eq!(seen(&d).0, "waiting");
}
