//! Contract §3 Consumer cancel, `stop`, `purge`, §3 `close` and §3 `shutdown`.

use std::time::Duration;

use leasemq::{Broker, DeliveryTag, Error, Message, QueueConfig, Settle};

mod common;
use common::*;

// --- consumer cancel and drop ------------------------------------------------------------

#[test]
fn cancel_releases_unread_deliveries_without_spending_an_attempt() {
    let broker = broker();
    let q = timeout_queue(&broker, "cancel.unread", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert_stats!(q, { leased: 2, consumers: 1 });
    a.cancel();
    assert_stats!(q, { ready: 2, leased: 0, consumers: 0, released: 2, expired: 0 });
    let b = q.consume("b", prefetch(10)).unwrap();
    assert_eq!(seen(&b), s("m1", 3, 1));
    assert_eq!(seen(&b), s("m2", 4, 1));
}

#[test]
fn cancel_returns_received_deliveries_like_an_expiry_but_not_counted_as_expired() {
    let broker = broker();
    let q = timeout_queue(&broker, "cancel.received", secs(10));
    let b = q.consume("b", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1"); // to b
    put(&q, "m2"); // to a
    assert_eq!(seen(&a), s("m2", 2, 1));
    a.cancel();
    // Back at once: already in b's channel when cancel returns.
    assert_eq!(seen(&b), s("m1", 1, 1));
    assert_eq!(seen(&b), s("m2", 3, 2));
    nothing(&b);
    assert!(!q.ack(DeliveryTag(2)));
    assert_stats!(q, {
        expired: 0, released: 0, stale: 1, leased: 2, consumers: 1, delivered: 3,
    });
}

#[test]
fn dropping_a_consumer_cancels_it_before_the_threads_next_call() {
    let broker = broker();
    let q = timeout_queue(&broker, "cancel.drop", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "seen");
    put(&q, "unseen");
    assert_eq!(seen(&a), s("seen", 1, 1));
    drop(a);
    assert_stats!(q, { consumers: 0, released: 1, ready: 2, leased: 0, expired: 0 });
    let b = q.consume("b", prefetch(10)).unwrap();
    // Both came back at the same moment; the received one costs an attempt.
    let mut got = [seen(&b), seen(&b)];
    got.sort();
    let attempts: Vec<(&str, u32)> = got.iter().map(|(id, _, n)| (id.as_str(), *n)).collect();
    assert_eq!(attempts, vec![("seen", 2), ("unseen", 1)]);
    let mut tags: Vec<u64> = got.iter().map(|(_, tag, _)| *tag).collect();
    tags.sort();
    assert_eq!(tags, vec![3, 4]);
}

#[test]
fn consumer_name_is_free_for_the_same_threads_next_consume() {
    let broker = broker();
    let q = timeout_queue(&broker, "cancel.name", secs(10));
    let other = timeout_queue(&broker, "cancel.name.other", secs(10));
    for _ in 0..100 {
        let a = q.consume("a", prefetch(1)).unwrap();
        assert_err!(q.consume("a", prefetch(1)), Error::DuplicateConsumer);
        // The same name on another queue is another consumer.
        let on_other = other.consume("a", prefetch(1)).unwrap();
        drop(on_other);
        drop(a);
        let a = q.consume("a", prefetch(1)).unwrap();
        a.cancel();
    }
    assert_stats!(q, { consumers: 0 });
}

#[test]
fn consumers_gauge_counts_live_consumers() {
    let broker = broker();
    let q = timeout_queue(&broker, "cancel.gauge", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    let b = q.consume("b", prefetch(1)).unwrap();
    let c = q.consume("c", prefetch(1)).unwrap();
    assert_eq!(a.name(), "a");
    assert_stats!(q, { consumers: 3 });
    b.cancel();
    assert_stats!(q, { consumers: 2 });
    drop(c);
    assert_stats!(q, { consumers: 1 });
    drop(a);
    assert_stats!(q, { consumers: 0 });
}

// --- stop: no more deliveries, leases kept ----------------------------------------------

#[test]
fn stop_keeps_what_was_read_releases_the_unread_and_sends_nothing_more() {
    let broker = broker();
    let q = timeout_queue(&broker, "stop.keep", secs(10));
    let a = q.consume("a", prefetch(3)).unwrap();
    for id in ["m1", "m2", "m3", "m4"] {
        put(&q, id);
    }
    let in_hand = next(&a);
    assert_eq!(in_hand.envelope().id, "m1");
    a.stop();
    // m2 and m3 were unread: released, no attempt spent; m4 never went to a.
    assert_stats!(q, { ready: 3, leased: 1, consumers: 0, released: 2, expired: 0 });
    assert_err!(a.try_recv(), Error::Closed);
    assert_err!(a.recv(), Error::Closed);
    let b = q.consume("b", prefetch(10)).unwrap();
    let mut got = [seen(&b), seen(&b), seen(&b)];
    got.sort();
    assert_eq!(got, [s("m2", 4, 1), s("m3", 5, 1), s("m4", 6, 1)]);
    // The lease in hand is still a's: acked once, then stale.
    assert!(in_hand.ack());
    assert!(!in_hand.ack());
    assert_stats!(q, { acked: 1, stale: 1, leased: 3, consumers: 1 });
}

#[test]
fn a_stopped_consumer_takes_no_new_message_even_when_it_has_credit() {
    let broker = broker();
    let q = timeout_queue(&broker, "stop.credit", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    a.stop();
    put(&q, "m1");
    assert_stats!(q, { ready: 1, leased: 0, consumers: 0 });
    // The name stays taken until the consumer is dropped.
    assert_err!(q.consume("a", prefetch(1)), Error::DuplicateConsumer);
    drop(a);
    let a = q.consume("a", prefetch(1)).unwrap();
    assert_eq!(seen(&a), s("m1", 1, 1));
}

#[test]
fn a_stopped_consumers_leases_still_run_out_and_its_drop_returns_the_rest() {
    let broker = broker();
    let q = timeout_queue(&broker, "stop.leases", secs(10));
    let a = q.consume("a", prefetch(2)).unwrap();
    put(&q, "m1");
    let first = next(&a);
    broker.advance(secs(5)).unwrap();
    put(&q, "m2");
    let second = next(&a);
    a.stop();
    a.stop(); // idempotent
    broker.advance(secs(6)).unwrap(); // m1's lease ran out at 10 s
    assert!(!first.ack(), "the late ack is refused");
    assert_stats!(q, { ready: 1, leased: 1, expired: 1 });
    drop(a); // m2's lease comes back, costing the attempt it used
    assert_stats!(q, { ready: 2, leased: 0 });
    assert!(!second.ack());
    let b = q.consume("b", prefetch(10)).unwrap();
    assert_eq!(seen(&b), s("m1", 3, 2));
    assert_eq!(seen(&b), s("m2", 4, 2));
}

#[test]
fn stop_after_close_or_shutdown_does_nothing() {
    let broker = broker();
    let q = plain(&broker, "stop.late");
    let a = q.consume("a", prefetch(1)).unwrap();
    assert!(q.close());
    a.stop();
    assert_err!(a.try_recv(), Error::Closed);
    let q = plain(&broker, "stop.late");
    let b = q.consume("b", prefetch(1)).unwrap();
    broker.shutdown();
    b.stop();
}

// --- purge -------------------------------------------------------------------------------

#[test]
fn purge_removes_ready_and_delayed_messages_and_keeps_leased_ones() {
    let broker = broker();
    let q = timeout_queue(&broker, "purge.some", secs(60));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "leased");
    assert_eq!(seen(&a), s("leased", 1, 1));
    put(&q, "ready");
    q.put(msg("delayed").with_delay(secs(30))).unwrap();
    assert_stats!(q, { ready: 1, delayed: 1, leased: 1 });
    assert_eq!(q.purge().unwrap(), 2);
    assert_stats!(q, { ready: 0, delayed: 0, leased: 1, enqueued: 3 });
    // The delayed one's timer is gone with it; the leased one is still a's.
    broker.advance(secs(31)).unwrap();
    assert_stats!(q, { ready: 0, delayed: 0 });
    let d = a.try_recv().unwrap();
    assert!(d.is_none(), "nothing was redelivered");
    assert_eq!(q.purge().unwrap(), 0);
}

#[test]
fn purge_keeps_each_ids_dedup_window_and_refuses_on_a_closed_queue() {
    let broker = broker();
    let config = QueueConfig {
        dedup_window: secs(60),
        ..QueueConfig::default()
    };
    let q = broker.declare_queue("purge.dedup", config).unwrap();
    put(&q, "once");
    assert_eq!(q.purge().unwrap(), 1);
    assert_eq!(q.put(msg("once")).unwrap(), leasemq::PutOutcome::Duplicate);
    assert!(q.close());
    assert_err!(q.purge(), Error::QueueClosed);
    broker.shutdown();
    assert_err!(q.purge(), Error::QueueClosed);
}

// --- close -------------------------------------------------------------------------------

#[test]
fn close_wakes_a_blocked_recv_with_closed() {
    let broker = broker();
    let q = timeout_queue(&broker, "close.recv", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    let waiter = std::thread::spawn(move || match a.recv() {
        Err(Error::Closed) => {}
        Err(other) => panic!("expected Closed, got {other:?}"),
        Ok(_) => panic!("nothing was put"),
    });
    assert!(q.close());
    waiter.join().expect("recv returned Closed");
}

#[test]
fn close_drops_deliveries_already_in_the_channel() {
    let broker = broker();
    let q = timeout_queue(&broker, "close.channel", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    assert!(q.close());
    assert_err!(a.try_recv(), Error::Closed);
    assert_err!(a.recv_timeout(secs(1)), Error::Closed);
    assert_err!(a.recv(), Error::Closed);
    assert_eq!(a.ack_up_to(DeliveryTag(2)), 0);
}

#[test]
fn closed_queue_refuses_every_later_call_and_freezes_its_stats() {
    let broker = broker();
    let (q, dead) = dead_letter_pair(
        &broker,
        "close.calls",
        "close.dead",
        with_ack_timeout(secs(10)),
    );
    let other_handle = broker.queue("close.calls").unwrap();
    let a = q.consume("a", prefetch(2)).unwrap();
    for i in 1..=4 {
        put(&q, &format!("m{i}"));
    }
    assert!(next(&a).ack());
    assert!(!q.ack(DeliveryTag(1)));
    q.put(Message::new("later").with_id("later").with_delay(secs(5)))
        .unwrap();
    let at_close = q.stats();
    assert_eq!(
        (
            count(at_close.ready),
            count(at_close.delayed),
            count(at_close.leased),
            count(at_close.consumers)
        ),
        (1, 1, 2, 1)
    );
    assert!(q.close());
    assert!(!q.close());
    assert!(!other_handle.close());

    let mut frozen = at_close.clone();
    frozen.ready = 0;
    frozen.delayed = 0;
    frozen.leased = 0;
    frozen.consumers = 0;
    assert_eq!(q.stats(), frozen);

    for handle in [&q, &other_handle] {
        assert_err!(
            handle.put(Message::new("x").with_id("x")),
            Error::QueueClosed
        );
        assert_err!(
            handle.put_batch(vec![Message::new("y")]),
            Error::QueueClosed
        );
        assert_err!(handle.consume("b", prefetch(1)), Error::QueueClosed);
        for tag in [DeliveryTag(2), DeliveryTag(3), DeliveryTag(99)] {
            assert!(!handle.ack(tag));
            assert!(!handle.nack(tag));
            assert!(!handle.nack_with_delay(tag, Duration::ZERO));
            assert!(!handle.reject(tag));
            assert!(!handle.release(tag));
            assert!(!handle.touch(tag));
        }
        assert_eq!(
            handle.settle_batch(&[
                (DeliveryTag(2), Settle::Ack),
                (DeliveryTag(3), Settle::Reject)
            ]),
            vec![false, false]
        );
        assert_eq!(
            handle.stats(),
            frozen,
            "settles on a closed queue count nothing"
        );
    }
    // Nothing was requeued or dead-lettered, now or later.
    broker.advance(secs(60)).unwrap();
    assert_stats!(dead, { enqueued: 0, ready: 0 });
    assert_eq!(q.stats(), frozen);
    assert!(broker.queue("close.calls").is_none());
}

#[test]
fn closed_name_can_be_declared_again_and_old_handles_never_reach_the_new_queue() {
    let broker = broker();
    let old = timeout_queue(&broker, "close.redeclare", secs(10));
    let old_clone = old.clone();
    let old_consumer = old.consume("a", prefetch(10)).unwrap();
    put(&old, "old");
    assert!(old.close());
    let old_stats = old.stats();

    // A different config is fine: it is a new queue.
    let new = timeout_queue(&broker, "close.redeclare", secs(20));
    let by_name = broker.queue("close.redeclare").unwrap();
    let a = new.consume("a", prefetch(10)).unwrap();
    put(&new, "new");
    assert_eq!(seen(&a), s("new", 1, 1));
    assert_stats!(by_name, { leased: 1, enqueued: 1 });

    assert_err!(old.put(Message::new("x").with_id("x")), Error::QueueClosed);
    assert_err!(
        old_clone.put(Message::new("x").with_id("y")),
        Error::QueueClosed
    );
    assert!(!old.ack(DeliveryTag(1)));
    assert!(!old_clone.touch(DeliveryTag(1)));
    assert_err!(old_consumer.try_recv(), Error::Closed);
    assert_eq!(old.stats(), old_stats);
    assert_stats!(new, { leased: 1, acked: 0, stale: 0, enqueued: 1 });
    assert!(new.ack(DeliveryTag(1)));
    assert!(!old.close());
    assert_stats!(new, { acked: 1, consumers: 1 });
}

// --- shutdown ----------------------------------------------------------------------------

#[test]
fn shutdown_is_idempotent_and_shared_by_clones() {
    let broker = broker();
    let clone = broker.clone();
    broker.shutdown();
    broker.shutdown();
    clone.shutdown();
    assert_err!(clone.advance(secs(1)), Error::ShutDown);
}

#[test]
fn after_shutdown_calls_give_shut_down_and_settles_false() {
    let broker = broker();
    let q = timeout_queue(&broker, "shutdown.calls", secs(10));
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    let d = next(&a);
    broker.shutdown();
    assert_err!(q.put(Message::new("x").with_id("x")), Error::ShutDown);
    assert_err!(q.consume("b", prefetch(1)), Error::ShutDown);
    assert_err!(
        broker.declare_queue("shutdown.other", QueueConfig::default()),
        Error::ShutDown
    );
    assert_err!(broker.advance(secs(1)), Error::ShutDown);
    assert_err!(a.recv(), Error::ShutDown);
    assert_err!(a.try_recv(), Error::ShutDown);
    assert_err!(a.recv_timeout(secs(1)), Error::ShutDown);
    assert!(!d.ack());
    assert!(!q.ack(DeliveryTag(2)));
    assert!(!q.nack(DeliveryTag(2)));
    assert!(!q.nack_with_delay(DeliveryTag(2), secs(1)));
    assert!(!q.reject(DeliveryTag(2)));
    assert!(!q.release(DeliveryTag(2)));
    assert!(!q.touch(DeliveryTag(2)));
    assert_eq!(
        q.settle_batch(&[
            (DeliveryTag(1), Settle::Ack),
            (DeliveryTag(2), Settle::Touch)
        ]),
        vec![false, false]
    );
}

/// A `recv` (or `recv_timeout`) already blocked when the broker shuts down returns
/// `ShutDown`, never `Closed`: a worker tells "my queue was closed" from "the broker is
/// going away" by it.
#[test]
fn shutdown_wakes_a_blocked_recv_with_shut_down() {
    let broker = broker();
    let q = timeout_queue(&broker, "shutdown.recv", secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    let b = q.consume("b", prefetch(1)).unwrap();
    let spawn = |name: &str, recv: Box<dyn FnOnce() -> Result<(), Error> + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(recv)
            .unwrap()
    };
    let blocked = spawn("blocked-recv", Box::new(move || a.recv().map(|_| ())));
    let timed = spawn(
        "blocked-recv-to",
        Box::new(move || b.recv_timeout(secs(600)).map(|_| ())),
    );
    // Shut down only once both threads are parked in their calls.
    while !(parked("blocked-recv") && parked("blocked-recv-to")) {
        std::thread::yield_now();
    }
    broker.shutdown();
    assert_eq!(blocked.join().expect("recv returned"), Err(Error::ShutDown));
    assert_eq!(
        timed.join().expect("recv_timeout returned"),
        Err(Error::ShutDown)
    );
}

/// Whether this process's thread called `name` is asleep (state `S` in
/// `/proc/self/task/<tid>/stat`): parked, for a thread whose only wait is a `recv`.
fn parked(name: &str) -> bool {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc on Linux")
        .flatten()
        .any(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            comm.trim() == name && state.is_some_and(|s| s.starts_with('S'))
        })
}

#[test]
fn shutdown_of_a_system_clock_broker_returns() {
    let broker = Broker::builder().shards(2).build().unwrap();
    let q = timeout_queue(&broker, "shutdown.system", secs(10));
    put(&q, "m");
    broker.shutdown();
    broker.shutdown();
    assert_err!(q.put(Message::new("x").with_id("x")), Error::ShutDown);
}
