//! The async forms of contract §5 Async inside a tokio runtime, and `Consumer::next`, which
//! must be cancel-safe: dropping a pending `next()` loses no delivery.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use leasemq::{Consumer, DeliveryTag, Error, Message, PutOutcome, Settle};

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_puts_and_settles_behave_like_the_blocking_ones() {
    let broker = broker();
    let q = plain(&broker, "async.settles");
    let mut a = q.consume("a", prefetch(10)).unwrap();
    assert_eq!(q.put_async(msg("m1")).await.unwrap(), PutOutcome::Enqueued);
    assert_eq!(q.put_async(msg("m1")).await.unwrap(), PutOutcome::Duplicate);
    let batch = (2..=6).map(|i| msg(&format!("m{i}"))).collect();
    assert_eq!(
        q.put_batch_async(batch).await.unwrap(),
        vec![PutOutcome::Enqueued; 5]
    );
    for i in 1..=6_u64 {
        let d = a.next().await.expect("delivery");
        assert_eq!(d.tag(), DeliveryTag(i));
        assert_eq!(d.envelope().id, format!("m{i}"));
    }
    let t = DeliveryTag;
    assert!(q.touch_async(t(1)).await);
    assert!(q.ack_async(t(1)).await);
    assert!(!q.ack_async(t(1)).await);
    assert!(q.nack_async(t(2)).await); // waits 1 s
    assert!(q.nack_with_delay_async(t(3), Duration::ZERO).await); // back at once: tag 7
    let m3 = a.next().await.unwrap();
    assert_eq!(
        (m3.envelope().id.as_str(), m3.tag(), m3.envelope().attempt),
        ("m3", t(7), 2)
    );
    assert!(q.reject_async(t(4)).await);
    assert!(q.release_async(t(5)).await); // back at once: tag 8
    let m5 = a.next().await.unwrap();
    assert_eq!(
        (m5.envelope().id.as_str(), m5.tag(), m5.envelope().attempt),
        ("m5", t(8), 1)
    );
    let results = q
        .settle_batch_async(&[
            (t(6), Settle::Ack),
            (t(7), Settle::Ack),
            (t(8), Settle::Reject),
            (t(99), Settle::Touch),
        ])
        .await;
    assert_eq!(results, vec![true, true, true, false]);
    assert_stats!(q, {
        acked: 3, nacked: 2, rejected: 2, released: 1, dropped: 2, stale: 2,
        delayed: 1, ready: 0, leased: 0, duplicates: 1, enqueued: 6,
    });
    broker.advance(Duration::from_secs(1)).unwrap();
    let m2 = a.next().await.unwrap();
    assert_eq!(
        (m2.envelope().id.as_str(), m2.tag(), m2.envelope().attempt),
        ("m2", t(9), 2)
    );
    assert!(!q.touch_async(t(8)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_put_reports_the_same_errors() {
    let broker = broker();
    let q = plain(&broker, "async.errors");
    match q.put_async(Message::new("x").with_id("")).await {
        Err(Error::InvalidMessage(_)) => {}
        other => panic!("expected InvalidMessage, got {other:?}"),
    }
    assert!(q.close());
    match q.put_async(msg("x")).await {
        Err(Error::QueueClosed) => {}
        other => panic!("expected QueueClosed, got {other:?}"),
    }
    match q.put_batch_async(vec![msg("y")]).await {
        Err(Error::QueueClosed) => {}
        other => panic!("expected QueueClosed, got {other:?}"),
    }
    assert!(!q.ack_async(DeliveryTag(1)).await);
    let other = plain(&broker, "async.errors2");
    broker.shutdown();
    match other.put_async(msg("z")).await {
        Err(Error::ShutDown) => {}
        other => panic!("expected ShutDown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_purge_takes_what_is_ready_as_the_blocking_one_does() {
    let broker = broker();
    let q = plain(&broker, "async.purge");
    q.put_batch((1..=5).map(|i| msg(&format!("p{i}"))).collect())
        .unwrap();
    let held = q.consume("held", prefetch(2)).unwrap();
    assert_eq!(q.purge_async().await.unwrap(), 3, "the two leased stay");
    assert_eq!((q.stats().ready, q.stats().leased), (0, 2));
    drop(held);
    assert!(q.close());
    match q.purge_async().await {
        Err(Error::QueueClosed) => {}
        other => panic!("expected QueueClosed, got {other:?}"),
    }
    let other = plain(&broker, "async.purge2");
    broker.shutdown();
    match other.purge_async().await {
        Err(Error::ShutDown) => {}
        other => panic!("expected ShutDown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_dropped_by_select_loses_no_delivery() {
    let broker = broker();
    let q = plain(&broker, "async.select");
    let mut a = q.consume("a", prefetch(10)).unwrap();
    // Poll next() while nothing is there, then drop it.
    tokio::select! {
        biased;
        _ = a.next() => panic!("nothing was put yet"),
        _ = std::future::ready(()) => {}
    }
    q.put_async(msg("m1")).await.unwrap();
    let d = a.next().await.expect("the delivery is not lost");
    assert_eq!((d.tag(), d.envelope().id.as_str()), (DeliveryTag(1), "m1"));
    assert!(d.ack());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_next_calls_in_select_lose_no_delivery() {
    const N: usize = 600;
    let broker = broker();
    let q = plain(&broker, "async.race");
    let mut a = q.consume("a", prefetch(8)).unwrap();
    let mut b = q.consume("b", prefetch(8)).unwrap();
    let producer = {
        let q = q.clone();
        tokio::spawn(async move {
            for i in 0..N {
                q.put_async(msg(&format!("m{i}"))).await.unwrap();
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut seen = BTreeSet::new();
    let mut timeouts = 0_u32;
    while seen.len() < N {
        // Whichever side wins, the other side's pending next() is dropped.
        let got = tokio::select! {
            d = a.next() => d,
            d = b.next() => d,
            _ = tokio::time::timeout(Duration::from_micros(200), std::future::pending::<()>()) => {
                timeouts += 1;
                assert!(timeouts < 200_000, "deliveries were lost: {} of {N}", seen.len());
                continue;
            }
        };
        let d = got.expect("the queue is open");
        assert!(
            seen.insert(d.envelope().id.clone()),
            "{} delivered twice",
            d.envelope().id
        );
        assert!(q.ack_async(d.tag()).await, "ack of {}", d.envelope().id);
    }
    producer.await.unwrap();
    assert_stats!(q, {
        acked: N as u64, delivered: N as u64, leased: 0, ready: 0, stale: 0,
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_cut_short_by_timeouts_loses_no_delivery() {
    const N: usize = 300;
    let broker = broker();
    let q = plain(&broker, "async.timeout");
    let mut a = q.consume("a", prefetch(4)).unwrap();
    let producer = {
        let q = q.clone();
        tokio::spawn(async move {
            for chunk in 0..N / 3 {
                let batch = (0..3)
                    .map(|k| msg(&format!("m{}", chunk * 3 + k)))
                    .collect();
                q.put_batch_async(batch).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut seen = BTreeSet::new();
    let started = std::time::Instant::now();
    while seen.len() < N {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "deliveries were lost: {} of {N}",
            seen.len()
        );
        if let Ok(d) = tokio::time::timeout(Duration::from_micros(100), a.next()).await {
            let d = d.expect("the queue is open");
            assert!(seen.insert(d.envelope().id.clone()));
            assert!(q.ack_async(d.tag()).await);
        }
    }
    producer.await.unwrap();
    assert_stats!(q, { acked: N as u64, delivered: N as u64, leased: 0 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_next_calls_do_not_block_worker_threads() {
    const WAITERS: usize = 6;
    let broker = broker();
    let q = plain(&broker, "async.waiters");
    let (tx, rx) = mpsc::channel();
    for i in 0..WAITERS {
        let mut c = q.consume(&format!("w{i}"), prefetch(1)).unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            let d = c.next().await.expect("a delivery");
            tx.send((c.name().to_string(), d.envelope().id.clone()))
                .unwrap();
            assert!(d.ack());
        });
    }
    // More waiters than worker threads; the producer still gets to run.
    let producer = q.clone();
    tokio::spawn(async move {
        for i in 0..WAITERS {
            producer.put_async(msg(&format!("m{i}"))).await.unwrap();
        }
    });
    let mut got: Vec<(String, String)> = (0..WAITERS)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(20))
                .expect("every waiter gets its delivery")
        })
        .collect();
    got.sort();
    let expected: Vec<(String, String)> = (0..WAITERS)
        .map(|i| (format!("w{i}"), format!("m{i}")))
        .collect();
    assert_eq!(got, expected, "round robin in registration order");
}

/// Leaves `next()` pending in a task of its own, with its waker registered, then runs `end`
/// and expects the pending call to be woken and finish with `None`.
async fn pending_next_ends_with_none(mut consumer: Consumer, end: impl FnOnce()) {
    let (registered_tx, registered) = mpsc::channel();
    let waiter = tokio::spawn(async move {
        let mut next = Box::pin(consumer.next());
        let mut told = false;
        std::future::poll_fn(move |cx| {
            let polled = next.as_mut().poll(cx);
            if polled.is_pending() && !told {
                told = true;
                registered_tx.send(()).unwrap();
            }
            polled
        })
        .await
        .is_none()
    });
    registered
        .recv_timeout(Duration::from_secs(10))
        .expect("next() is pending: nothing was put");
    end();
    match tokio::time::timeout(Duration::from_secs(10), waiter).await {
        Ok(ended) => assert!(ended.unwrap(), "nothing was put, yet a delivery came"),
        Err(_) => panic!("a pending next() was never woken"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_next_returns_none_when_the_queue_closes() {
    let broker = broker();
    let q = plain(&broker, "async.closed");
    let a = q.consume("a", prefetch(1)).unwrap();
    pending_next_ends_with_none(a, || assert!(q.close())).await;
    let mut b = plain(&broker, "async.closed")
        .consume("b", prefetch(1))
        .unwrap();
    assert!(q.put_async(msg("old handle")).await.is_err());
    assert!(!q.close());
    tokio::select! {
        biased;
        _ = b.next() => panic!("the new queue is empty"),
        _ = std::future::ready(()) => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_next_returns_none_when_the_broker_shuts_down() {
    let broker = broker();
    let q = plain(&broker, "async.shutdown");
    let a = q.consume("a", prefetch(1)).unwrap();
    pending_next_ends_with_none(a, || broker.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_sees_deliveries_made_by_advance() {
    let broker = broker();
    let q = timeout_queue(&broker, "async.advance", Duration::from_secs(10));
    let mut a = q.consume("a", prefetch(1)).unwrap();
    q.put_async(msg("m").with_delay(Duration::from_secs(5)))
        .await
        .unwrap();
    broker.advance(Duration::from_secs(5)).unwrap();
    let first = a.next().await.unwrap();
    assert_eq!((first.tag(), first.envelope().attempt), (DeliveryTag(1), 1));
    broker.advance(Duration::from_secs(10)).unwrap();
    let second = a.next().await.unwrap();
    assert_eq!(
        (second.tag(), second.envelope().attempt),
        (DeliveryTag(2), 2)
    );
    assert!(!q.ack_async(first.tag()).await);
    assert!(q.ack_async(second.tag()).await);
}
