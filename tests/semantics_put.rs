//! Contract §3 `put`, Deduplication, Delays, Put errors and `put_batch`: outcomes,
//! deduplication, delays, error order, `QueueFull` and the atomicity of `put_batch`.

use std::collections::BTreeSet;
use std::time::Duration;

use leasemq::{Broker, Consumer, Error, Message, Overflow, PutOutcome, Queue, QueueConfig};

mod common;
use common::*;

fn dedup_queue(broker: &Broker, name: &str, window: Duration) -> Queue {
    broker
        .declare_queue(
            name,
            QueueConfig {
                dedup_window: window,
                ..QueueConfig::default()
            },
        )
        .unwrap()
}

#[test]
fn put_of_a_live_id_is_a_duplicate_while_ready_delayed_or_leased() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.live", Duration::ZERO);
    assert_eq!(q.put(msg("ready")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(msg("ready")).unwrap(), PutOutcome::Duplicate);
    let later = msg("delayed").with_delay(secs(5));
    assert_eq!(q.put(later.clone()).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(later).unwrap(), PutOutcome::Duplicate);
    let a = q.consume("a", prefetch(1)).unwrap();
    let d = next(&a);
    assert_eq!(d.envelope().id, "ready");
    assert_eq!(q.put(msg("ready")).unwrap(), PutOutcome::Duplicate);
    // Waiting after a nack is still live.
    assert!(d.nack());
    assert_stats!(q, { delayed: 2, leased: 0 });
    assert_eq!(q.put(msg("ready")).unwrap(), PutOutcome::Duplicate);
    assert_stats!(q, { enqueued: 2, duplicates: 4 });
}

#[test]
fn duplicate_put_changes_nothing_but_the_duplicates_counter() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.dup", Duration::ZERO);
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(msg("x")).unwrap();
    q.put(msg("y")).unwrap();
    let d = next(&a);
    let before = q.stats();
    assert_eq!(
        q.put(Message::new("another body").with_id("x")).unwrap(),
        PutOutcome::Duplicate
    );
    assert_eq!(
        q.put(Message::new("another body").with_id("y")).unwrap(),
        PutOutcome::Duplicate
    );
    let mut expected = before.clone();
    expected.duplicates += 2;
    assert_eq!(q.stats(), expected);
    nothing(&a);
    // The original body is what is delivered.
    assert!(d.ack());
    let y = next(&a);
    assert_eq!(
        (y.envelope().id.as_str(), &y.envelope().body[..]),
        ("y", &b"body of y"[..])
    );
}

#[test]
fn settled_id_can_be_put_again_when_the_dedup_window_is_zero() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.again", Duration::ZERO);
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(msg("x")).unwrap();
    assert!(next(&a).ack());
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Enqueued);
    let again = next(&a);
    assert_eq!(
        (again.envelope().id.as_str(), again.envelope().attempt),
        ("x", 1)
    );
    // A rejected (dropped) id is not live either.
    assert!(again.reject());
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Enqueued);
    assert_stats!(q, { enqueued: 3, duplicates: 0, dropped: 1 });
}

#[test]
fn dedup_window_counts_from_the_first_enqueue_and_duplicates_do_not_extend_it() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.window", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Enqueued); // t = 0
    assert!(next(&a).ack());
    broker.advance(secs(5)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Duplicate); // t = 5 s
    broker.advance(secs(5) - ms(1)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Duplicate); // t = 9.999 s
    broker.advance(ms(1)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Enqueued); // t = 10 s
    assert!(next(&a).ack());
    // The new enqueue starts a new window.
    broker.advance(secs(10) - ms(1)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Duplicate); // t = 19.999 s
    broker.advance(ms(1)).unwrap();
    assert_eq!(q.put(msg("x")).unwrap(), PutOutcome::Enqueued); // t = 20 s
    assert_stats!(q, { enqueued: 3, duplicates: 3, acked: 2, delivered: 3 });
}

#[test]
fn message_without_id_gets_a_unique_broker_id_and_is_never_a_duplicate() {
    let broker = broker();
    let queues = [
        dedup_queue(&broker, "put.anon1", secs(3600)),
        dedup_queue(&broker, "put.anon2", secs(3600)),
        dedup_queue(&broker, "put.anon3", Duration::ZERO),
    ];
    let consumers: Vec<Consumer> = queues
        .iter()
        .map(|q| q.consume("c", prefetch(100)).unwrap())
        .collect();
    let mut ids = BTreeSet::new();
    for (q, c) in queues.iter().zip(&consumers) {
        for _ in 0..20 {
            assert_eq!(
                q.put(Message::new("same body")).unwrap(),
                PutOutcome::Enqueued
            );
        }
        assert_eq!(
            q.put_batch(vec![Message::new("b"), Message::new("b")])
                .unwrap(),
            vec![PutOutcome::Enqueued, PutOutcome::Enqueued]
        );
        for _ in 0..22 {
            let id = next(c).envelope().id.clone();
            assert!(!id.is_empty());
            assert!(ids.insert(id), "broker-assigned ids are unique");
        }
        assert_stats!(q, { enqueued: 22, duplicates: 0 });
    }
    assert_eq!(ids.len(), 66);
}

#[test]
fn delayed_message_becomes_ready_at_now_plus_delay() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.delay", Duration::ZERO);
    let a = q.consume("a", prefetch(10)).unwrap();
    broker.advance(secs(2)).unwrap();
    q.put(msg("later").with_delay(secs(5))).unwrap(); // ready at 7 s
    q.put(msg("now").with_delay(Duration::ZERO)).unwrap();
    assert_eq!(next(&a).envelope().id, "now");
    assert_stats!(q, { delayed: 1, ready: 0, leased: 1 });
    broker.advance(secs(5) - ms(1)).unwrap();
    nothing(&a);
    broker.advance(ms(1)).unwrap();
    let d = next(&a);
    assert_eq!(
        (d.envelope().id.as_str(), d.envelope().attempt),
        ("later", 1)
    );
    assert_stats!(q, { delayed: 0, leased: 2 });
}

#[test]
fn delay_of_exactly_seven_days_is_accepted() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.week", Duration::ZERO);
    assert_eq!(
        q.put(msg("w").with_delay(SEVEN_DAYS)).unwrap(),
        PutOutcome::Enqueued
    );
    assert_stats!(q, { delayed: 1 });
    assert_err_unchanged!(
        q,
        q.put(msg("w2").with_delay(SEVEN_DAYS + ms(1))),
        Error::InvalidMessage(_)
    );
}

#[test]
fn put_errors_are_checked_in_the_documented_order() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.order",
            QueueConfig {
                max_length: Some(1),
                max_body_bytes: 16,
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let big = || Message::new(vec![0_u8; 17]);
    // InvalidMessage before MessageTooLarge.
    assert_err_unchanged!(q, q.put(big().with_id("")), Error::InvalidMessage(_));
    assert_err_unchanged!(
        q,
        q.put(big().with_id("x").with_delay(SEVEN_DAYS + ms(1))),
        Error::InvalidMessage(_)
    );
    assert_err_unchanged!(q, q.put(big().with_id("x")), Error::MessageTooLarge);
    assert_eq!(q.put(msg("a")).unwrap(), PutOutcome::Enqueued);
    // MessageTooLarge before Duplicate: not counted as a duplicate.
    assert_err_unchanged!(q, q.put(big().with_id("a")), Error::MessageTooLarge);
    assert_stats!(q, { duplicates: 0 });
    // Duplicate before QueueFull.
    assert_eq!(q.put(msg("a")).unwrap(), PutOutcome::Duplicate);
    assert_err_unchanged!(q, q.put(msg("b")), Error::QueueFull);
    // QueueClosed before everything.
    assert!(q.close());
    assert_err!(q.put(big().with_id("")), Error::QueueClosed);
    assert_err!(q.put(msg("a")), Error::QueueClosed);
    assert_stats!(q, { enqueued: 1, duplicates: 1 });
}

#[test]
fn body_of_exactly_max_body_bytes_is_accepted() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.size",
            QueueConfig {
                max_body_bytes: 16,
                ..QueueConfig::default()
            },
        )
        .unwrap();
    assert_eq!(
        q.put(Message::new(vec![7_u8; 16]).with_id("fits")).unwrap(),
        PutOutcome::Enqueued
    );
    assert_err_unchanged!(
        q,
        q.put(Message::new(vec![7_u8; 17]).with_id("over")),
        Error::MessageTooLarge
    );
    assert_eq!(
        q.put(Message::new(Vec::<u8>::new()).with_id("empty"))
            .unwrap(),
        PutOutcome::Enqueued
    );
}

#[test]
fn queue_full_counts_ready_delayed_and_leased_messages() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.full",
            QueueConfig {
                max_length: Some(3),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(msg("leased")).unwrap();
    q.put(msg("ready")).unwrap();
    q.put(msg("delayed").with_delay(secs(60))).unwrap();
    assert_stats!(q, { ready: 1, delayed: 1, leased: 1 });
    assert_err_unchanged!(q, q.put(msg("fourth")), Error::QueueFull);
    assert_err_unchanged!(q, q.put(msg("later").with_delay(secs(1))), Error::QueueFull);
    // A nacked message waiting for its retry still counts.
    let d = next(&a);
    assert!(d.nack());
    assert_stats!(q, { ready: 0, delayed: 2, leased: 1 });
    assert_err_unchanged!(q, q.put(msg("fourth")), Error::QueueFull);
    // Acking frees room.
    assert!(next(&a).ack());
    assert_eq!(q.put(msg("fourth")).unwrap(), PutOutcome::Enqueued);
    assert_err_unchanged!(q, q.put(msg("fifth")), Error::QueueFull);
}

fn drop_head_queue(broker: &Broker, name: &str, max_length: usize) -> Queue {
    broker
        .declare_queue(
            name,
            QueueConfig {
                max_length: Some(max_length),
                overflow: Overflow::DropHead,
                ..QueueConfig::default()
            },
        )
        .unwrap()
}

/// The ids a fresh consumer gets at once, in order.
fn ready_ids(q: &Queue) -> Vec<String> {
    let c = q.consume("reader", prefetch(1_000)).unwrap();
    let mut ids = Vec::new();
    while let Some(d) = c.try_recv().unwrap() {
        ids.push(d.envelope().id.clone());
    }
    ids
}

#[test]
fn drop_head_drops_the_oldest_ready_message_returned_ones_first() {
    let broker = broker();
    let q = drop_head_queue(&broker, "put.drop_head", 2);
    let a = q.consume("a", prefetch(1)).unwrap();
    for id in ["m1", "m2", "m3"] {
        q.put(msg(id)).unwrap();
    }
    // m1 is leased and does not count; m2 and m3 wait: a put drops m2, the next ready.
    assert_stats!(q, { ready: 2, leased: 1, dropped: 0 });
    assert_eq!(q.put(msg("m4")).unwrap(), PutOutcome::Enqueued);
    assert_stats!(q, { ready: 2, leased: 1, dropped: 1, enqueued: 4 });
    // Its id is free again (it is not live).
    assert_eq!(q.put(msg("m2")).unwrap(), PutOutcome::Enqueued);
    assert_stats!(q, { ready: 2, leased: 1, dropped: 2 });
    // m1 comes back first in line (returned before fresh): three wait, over the limit, and
    // the next put drops one, m1.
    let m1 = next(&a);
    a.stop();
    assert!(m1.release());
    assert_stats!(q, { ready: 3, leased: 0 });
    assert_eq!(q.put(msg("m5")).unwrap(), PutOutcome::Enqueued);
    assert_stats!(q, { ready: 3, dropped: 3 });
    assert_eq!(ready_ids(&q), ["m4", "m2", "m5"]);
    // A duplicate drops nothing.
    assert_eq!(q.put(msg("m5")).unwrap(), PutOutcome::Duplicate);
    assert_stats!(q, { dropped: 3, duplicates: 1 });
}

#[test]
fn drop_head_refuses_when_what_waits_is_delayed() {
    let broker = broker();
    let q = drop_head_queue(&broker, "put.drop_head.delayed", 1);
    q.put(msg("delayed").with_delay(secs(60))).unwrap();
    assert_err_unchanged!(q, q.put(msg("second")), Error::QueueFull);
    assert_err_unchanged!(q, q.put_batch(vec![msg("x")]), Error::QueueFull);
    // A consumer leasing every message leaves room: leases do not count.
    let q = drop_head_queue(&broker, "put.drop_head.leased", 1);
    let a = q.consume("a", prefetch(5)).unwrap();
    for id in ["l1", "l2", "l3"] {
        assert_eq!(q.put(msg(id)).unwrap(), PutOutcome::Enqueued);
    }
    assert_stats!(q, { ready: 0, leased: 3, dropped: 0 });
    assert!(next(&a).ack());
}

#[test]
fn a_drop_head_batch_keeps_its_last_messages_and_may_drop_its_own_first() {
    let broker = broker();
    let q = drop_head_queue(&broker, "put.drop_head.batch", 3);
    q.put(msg("old")).unwrap();
    let batch = ["b1", "b2", "b3", "b4"].map(msg).to_vec();
    let outcomes = q.put_batch(batch).unwrap();
    assert_eq!(outcomes, [PutOutcome::Enqueued; 4]);
    assert_stats!(q, { ready: 3, dropped: 2, enqueued: 5 });
    assert_eq!(ready_ids(&q), ["b2", "b3", "b4"]);
    // A batch that would need more heads than are ready fails whole.
    let q = drop_head_queue(&broker, "put.drop_head.batch.delayed", 2);
    let batch = vec![
        msg("d1").with_delay(secs(1)),
        msg("d2").with_delay(secs(1)),
        msg("r"),
    ];
    assert_err_unchanged!(q, q.put_batch(batch), Error::QueueFull);
    let batch = vec![msg("d1").with_delay(secs(1)), msg("r1"), msg("r2")];
    assert_eq!(q.put_batch(batch).unwrap(), [PutOutcome::Enqueued; 3]);
    assert_stats!(q, { ready: 1, delayed: 1, dropped: 1 });
}

#[test]
fn put_batch_is_atomic_for_errors() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.batch",
            QueueConfig {
                max_length: Some(3),
                max_body_bytes: 16,
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    let big = Message::new(vec![1_u8; 17]).with_id("big");
    assert_err_unchanged!(
        q,
        q.put_batch(vec![msg("a"), msg("b"), big]),
        Error::MessageTooLarge
    );
    assert_err_unchanged!(
        q,
        q.put_batch(vec![msg("a"), Message::new("x").with_id("")]),
        Error::InvalidMessage(_)
    );
    assert_err_unchanged!(
        q,
        q.put_batch(vec![msg("a"), msg("b"), msg("c"), msg("d")]),
        Error::QueueFull
    );
    nothing(&a);
    assert_stats!(q, { enqueued: 0, ready: 0, leased: 0, delivered: 0 });

    assert_eq!(
        q.put_batch(vec![msg("a"), msg("b")]).unwrap(),
        vec![PutOutcome::Enqueued, PutOutcome::Enqueued]
    );
    // Two more would make four live messages: none of them is enqueued.
    assert_err_unchanged!(q, q.put_batch(vec![msg("c"), msg("d")]), Error::QueueFull);
    assert_eq!(next(&a).envelope().id, "a");
    assert_eq!(next(&a).envelope().id, "b");
    nothing(&a);
    assert_stats!(q, { enqueued: 2, leased: 2 });
}

#[test]
fn put_batch_reports_duplicates_inside_the_batch_and_against_the_queue() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.batchdup",
            QueueConfig {
                max_length: Some(3),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    q.put(msg("old")).unwrap();
    // Live: old, x, y = 3; the repeated x and the old one are duplicates, not over the limit.
    assert_eq!(
        q.put_batch(vec![msg("x"), msg("old"), msg("y"), msg("x")])
            .unwrap(),
        vec![
            PutOutcome::Enqueued,
            PutOutcome::Duplicate,
            PutOutcome::Enqueued,
            PutOutcome::Duplicate,
        ]
    );
    assert_stats!(q, { enqueued: 3, duplicates: 2, ready: 3 });
    assert_eq!(
        q.put_batch(vec![msg("y"), msg("old")]).unwrap(),
        vec![PutOutcome::Duplicate, PutOutcome::Duplicate]
    );
    assert_eq!(q.put_batch(Vec::new()).unwrap(), Vec::<PutOutcome>::new());
    assert_stats!(q, { enqueued: 3, duplicates: 4, ready: 3 });
}

#[test]
fn put_batch_delivers_in_order_before_it_returns() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.batchorder", Duration::ZERO);
    let a = q.consume("a", prefetch(100)).unwrap();
    let ids: Vec<String> = (0..30).map(|i| format!("m{i:02}")).collect();
    q.put_batch(ids.iter().map(|id| msg(id)).collect()).unwrap();
    let got: Vec<String> = (0..30).map(|_| next(&a).envelope().id.clone()).collect();
    assert_eq!(got, ids);
    nothing(&a);
}

#[test]
fn put_batch_on_a_closed_queue_is_queue_closed() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.batchclosed", Duration::ZERO);
    assert!(q.close());
    assert_err!(q.put_batch(vec![msg("a")]), Error::QueueClosed);
}

#[test]
fn put_batch_nowait_is_put_in_order_before_the_callers_next_call() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "put.nowait",
            QueueConfig {
                max_length: Some(4),
                max_body_bytes: 16,
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    q.put_batch_nowait(vec![msg("a"), msg("b"), msg("a")]);
    // The next call (`stats`) is answered after it, with put_batch's outcomes.
    assert_stats!(q, { enqueued: 2, duplicates: 1 });
    assert_eq!(next(&a).envelope().id, "a");
    assert_eq!(next(&a).envelope().id, "b");
    // A batch put_batch would refuse is dropped whole, as put_batch leaves it.
    q.put_batch_nowait(vec![msg("c"), Message::new(vec![1_u8; 17])]);
    q.put_batch_nowait(vec![msg("c"), msg("d"), msg("e")]);
    q.put_batch_nowait(Vec::new());
    assert_stats!(q, { enqueued: 2, ready: 0, leased: 2 });
    q.put_batch_nowait(vec![msg("c")]);
    assert_stats!(q, { enqueued: 3, leased: 3 });
    assert_eq!(next(&a).envelope().id, "c");
    nothing(&a);
    // On a closed queue it is dropped quietly, as put_batch's answer would be QueueClosed.
    assert!(q.close());
    q.put_batch_nowait(vec![msg("f")]);
    assert_stats!(q, { enqueued: 3 });
}

#[test]
fn envelope_carries_body_id_and_first_attempt() {
    let broker = broker();
    let q = dedup_queue(&broker, "put.envelope", Duration::ZERO);
    let a = q.consume("a", prefetch(1)).unwrap();
    q.put(Message::new(&b"\x00\x01binary"[..]).with_id("bin"))
        .unwrap();
    let d = next(&a);
    let e = d.envelope();
    assert_eq!(e.id, "bin");
    assert_eq!(&e.body[..], &b"\x00\x01binary"[..]);
    assert_eq!(e.attempt, 1);
    assert!(!e.redelivered());
    assert_eq!(e.death, None);
    assert_eq!(d.consumer(), "a");
}

/// A 1-shard manual-clock broker: its first generated id is `~0-1`.
fn one_shard() -> Broker {
    Broker::builder().shards(1).manual_clock().build().unwrap()
}

/// The ids of every message a queue holds, read through a fresh consumer.
fn ids_held(q: &Queue) -> Vec<String> {
    let c = q.consume("reader", prefetch(100)).unwrap();
    let mut ids = Vec::new();
    while let Some(d) = c.try_recv().unwrap() {
        ids.push(d.envelope().id.clone());
    }
    ids
}

/// A generated id never equals an id a caller gave that is live in the queue, whatever
/// the caller chose: `~0-1` is the text the broker would have generated next.
#[test]
fn a_generated_id_skips_a_live_given_id_of_the_same_text() {
    let broker = one_shard();
    let q = plain(&broker, "ids.given.first");
    assert_eq!(q.put(msg("~0-1")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(Message::new("y")).unwrap(), PutOutcome::Enqueued);
    let ids = ids_held(&q);
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], "~0-1");
    assert_ne!(ids[1], "~0-1", "two live messages with one id: {ids:?}");
}

/// The same inside one `put_batch`, where the given id comes after the message that gets
/// a generated one.
#[test]
fn a_generated_id_skips_a_given_id_later_in_the_same_batch() {
    let broker = one_shard();
    let q = plain(&broker, "ids.batch");
    let outcomes = q.put_batch(vec![Message::new("y"), msg("~0-1")]).unwrap();
    assert_eq!(outcomes, [PutOutcome::Enqueued, PutOutcome::Enqueued]);
    let ids: BTreeSet<String> = ids_held(&q).into_iter().collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
}

/// A given id equal to a live generated one is a duplicate: the id is live in the queue.
#[test]
fn a_given_id_equal_to_a_live_generated_id_is_a_duplicate() {
    let broker = one_shard();
    let q = plain(&broker, "ids.generated.first");
    assert_eq!(q.put(Message::new("y")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(msg("~0-1")).unwrap(), PutOutcome::Duplicate);
    // Not the broker's form: an ordinary id, whatever it looks like.
    assert_eq!(q.put(msg("~0-01")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(msg("~00-1")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(ids_held(&q), ["~0-1", "~0-01", "~00-1"]);
    assert_stats!(q, { enqueued: 3, duplicates: 1 });
}

/// A dead letter keeps its generated id, and is refused (dropped at its origin) where a
/// caller's id of the same text is live in the dead-letter queue.
#[test]
fn a_dead_letter_never_lands_beside_a_live_namesake() {
    let broker = one_shard();
    let (q, dead) = dead_letter_pair(&broker, "ids.src", "ids.dead", QueueConfig::default());
    assert_eq!(dead.put(msg("~0-1")).unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put(Message::new("x")).unwrap(), PutOutcome::Enqueued);
    let a = q.consume("a", prefetch(1)).unwrap();
    let d = next(&a);
    assert_eq!(d.envelope().id, "~0-1");
    assert!(d.reject());
    assert_stats!(q, { dead_lettered: 0, dropped: 1 });
    assert_eq!(ids_held(&dead), ["~0-1"]);
}
