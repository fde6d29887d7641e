//! One or more tests per guarantee of contract §2 (G1 to G6). Each test fails if its
//! guarantee breaks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasemq::{
    Broker, Consumer, Delivery, DeliveryTag, Message, PutOutcome, Queue, QueueConfig, RetryPolicy,
    Settle,
};

mod common;
use common::*;

/// Puts [`msg`]`(id)` and expects it enqueued: unlike `common::put`, a duplicate fails.
fn put(queue: &Queue, id: &str) {
    let outcome = queue.put(msg(id)).expect("put");
    assert_eq!(outcome, PutOutcome::Enqueued, "put of {id}");
}

fn drain(consumer: &Consumer) -> Vec<Delivery> {
    let mut out = Vec::new();
    while let Some(d) = consumer.try_recv().expect("try_recv") {
        out.push(d);
    }
    out
}

fn live(queue: &Queue) -> u64 {
    let s = queue.stats();
    count(s.ready) + count(s.delayed) + count(s.leased)
}

// ---------------------------------------------------------------------------------------
// G1 At least once
// ---------------------------------------------------------------------------------------

#[test]
fn unacked_message_is_always_ready_delayed_or_leased() {
    let broker = broker();
    let q = timeout_queue(&broker, "g1.walk", secs(10));
    put(&q, "m");
    assert_stats!(q, { ready: 1, delayed: 0, leased: 0 });

    let a = q.consume("a", prefetch(1)).unwrap();
    let d1 = next(&a);
    assert_eq!((d1.tag(), d1.envelope().attempt), (DeliveryTag(1), 1));
    assert_stats!(q, { ready: 0, delayed: 0, leased: 1 });

    // nack: waits retry.delay(1) = 1 s (default policy).
    assert!(d1.nack());
    assert_stats!(q, { ready: 0, delayed: 1, leased: 0 });
    broker.advance(ms(999)).unwrap();
    nothing(&a);
    assert_stats!(q, { ready: 0, delayed: 1, leased: 0 });
    broker.advance(ms(1)).unwrap();
    let d2 = next(&a);
    assert_eq!((d2.tag(), d2.envelope().attempt), (DeliveryTag(2), 2));
    assert_stats!(q, { leased: 1 });

    // expiry at 11 s: it comes back and goes to `a` again, which regained its credit.
    broker.advance(secs(10)).unwrap();
    let d3 = next(&a);
    assert_eq!((d3.tag(), d3.envelope().attempt), (DeliveryTag(3), 3));
    assert_stats!(q, { ready: 0, delayed: 0, leased: 1, expired: 1 });

    // release: back at once with the same attempt.
    assert!(d3.release());
    let d4 = next(&a);
    assert_eq!((d4.tag(), d4.envelope().attempt), (DeliveryTag(4), 3));
    assert_stats!(q, { leased: 1, released: 1 });

    // cancel with a received lease: returned like an expiry.
    a.cancel();
    assert_stats!(q, { ready: 1, delayed: 0, leased: 0, consumers: 0, expired: 1 });

    let b = q.consume("b", prefetch(1)).unwrap();
    let d5 = next(&b);
    assert_eq!((d5.tag(), d5.envelope().attempt), (DeliveryTag(5), 4));
    assert_eq!(d5.envelope().id, "m");
    assert!(d5.ack());
    assert_stats!(q, { ready: 0, delayed: 0, leased: 0, acked: 1, delivered: 5, enqueued: 1 });
}

/// A small seeded generator so the op sequence repeats exactly.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[test]
fn no_message_is_lost_through_random_settles_expiries_and_cancels() {
    for seed in [1_u64, 7, 42] {
        let broker = broker();
        let q = timeout_queue(&broker, "g1.random", secs(10));
        let mut consumers: Vec<Option<Consumer>> = vec![None, None, None];
        let mut held: Vec<Vec<Delivery>> = vec![Vec::new(), Vec::new(), Vec::new()];
        let mut put_ids = BTreeSet::new();
        let mut acked: BTreeMap<String, u32> = BTreeMap::new();
        let mut rng = Lcg(seed);
        for step in 0..600 {
            let i = rng.below(3) as usize;
            match rng.below(8) {
                0 | 1 => {
                    let id = format!("m{step}");
                    put(&q, &id);
                    put_ids.insert(id);
                }
                2 => match &consumers[i] {
                    Some(c) => held[i].extend(drain(c)),
                    None => {
                        consumers[i] =
                            Some(q.consume(&format!("c{i}"), prefetch(1 + i as u32)).unwrap())
                    }
                },
                3 => {
                    if let Some(d) = held[i].pop() {
                        if d.ack() {
                            *acked.entry(d.envelope().id.clone()).or_default() += 1;
                        }
                    }
                }
                4 => {
                    if let Some(d) = held[i].pop() {
                        d.nack();
                    }
                }
                5 => {
                    if let Some(d) = held[i].pop() {
                        d.release();
                    }
                }
                6 => broker.advance(ms(rng.below(6000))).unwrap(),
                _ => {
                    if let Some(c) = consumers[i].take() {
                        c.cancel();
                        held[i].clear();
                    }
                }
            }
            let expected_live = (put_ids.len() - acked.len()) as u64;
            assert_eq!(live(&q), expected_live, "seed {seed} step {step}");
        }
        // Finish: one consumer takes everything that is left and acks it.
        for c in consumers.iter_mut() {
            if let Some(c) = c.take() {
                c.cancel();
            }
        }
        let last = q.consume("last", prefetch(1000)).unwrap();
        for _ in 0..100 {
            for d in drain(&last) {
                if d.ack() {
                    *acked.entry(d.envelope().id.clone()).or_default() += 1;
                }
            }
            if live(&q) == 0 {
                break;
            }
            broker.advance(secs(60)).unwrap();
        }
        assert_eq!(live(&q), 0, "seed {seed}");
        assert_eq!(
            acked.keys().cloned().collect::<BTreeSet<_>>(),
            put_ids,
            "seed {seed}"
        );
        assert!(acked.values().all(|&n| n == 1), "seed {seed}: {acked:?}");
        assert_stats!(q, { acked: put_ids.len() as u64, enqueued: put_ids.len() as u64 });
    }
}

// ---------------------------------------------------------------------------------------
// G2 Stale answers change nothing
// ---------------------------------------------------------------------------------------

type SettleFn = fn(&Queue, DeliveryTag) -> bool;

const SETTLES: [(&str, SettleFn); 7] = [
    ("ack", |q, t| q.ack(t)),
    ("nack", |q, t| q.nack(t)),
    ("reject", |q, t| q.reject(t)),
    ("release", |q, t| q.release(t)),
    ("touch", |q, t| q.touch(t)),
    ("nack_with_delay(0)", |q, t| {
        q.nack_with_delay(t, Duration::ZERO)
    }),
    ("nack_with_delay(1s)", |q, t| q.nack_with_delay(t, secs(1))),
];

#[test]
fn stale_settles_and_touches_change_nothing_but_stale() {
    let broker = broker();
    let (q, dlq) = dead_letter_pair(&broker, "g2.work", "g2.dead", with_ack_timeout(secs(10)));
    let watcher = dlq.consume("watcher", prefetch(10)).unwrap();
    let a = q.consume("a", prefetch(10)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    put(&q, "m3");
    let d1 = next(&a);
    let d2 = next(&a);
    let d3 = next(&a);
    assert_eq!(
        [d1.tag(), d2.tag(), d3.tag()],
        [DeliveryTag(1), DeliveryTag(2), DeliveryTag(3)]
    );
    assert!(d1.ack()); // tag 1: already settled
    broker.advance(secs(5)).unwrap();
    assert!(d3.touch()); // tag 3 now lives until 15 s
    broker.advance(secs(5)).unwrap(); // tag 2 expired at 10 s and came back as tag 4
    let d4 = next(&a);
    assert_eq!((d4.tag(), d4.envelope().attempt), (DeliveryTag(4), 2));
    assert_eq!(d4.envelope().id, "m2");

    let stale_tags = [d1.tag(), d2.tag(), DeliveryTag(999)];
    for tag in stale_tags {
        for (name, settle) in SETTLES {
            let before = q.stats();
            let before_dlq = dlq.stats();
            assert!(!settle(&q, tag), "{name} on stale {tag:?} must be refused");
            let mut expected = before.clone();
            expected.stale += 1;
            assert_eq!(q.stats(), expected, "{name} on stale {tag:?}");
            assert_eq!(dlq.stats(), before_dlq, "{name} on stale {tag:?}");
            nothing(&a);
            nothing(&watcher);
        }
    }
    assert_stats!(q, { stale: 21 });

    // The same through the delivery handles and through settle_batch.
    let before = q.stats();
    assert!(!d1.ack());
    assert!(!d2.nack());
    assert!(!d2.reject());
    assert!(!d2.release());
    assert!(!d2.touch());
    assert!(!d1.nack_with_delay(Duration::ZERO));
    let results = q.settle_batch(&[
        (d1.tag(), Settle::Ack),
        (d2.tag(), Settle::Reject),
        (DeliveryTag(999), Settle::Touch),
        (DeliveryTag(0), Settle::NackWithDelay(secs(1))),
    ]);
    assert_eq!(results, vec![false, false, false, false]);
    let mut expected = before.clone();
    expected.stale += 10;
    assert_eq!(q.stats(), expected);
    nothing(&a);
    nothing(&watcher);

    // The live leases are untouched.
    assert!(d3.ack());
    assert!(d4.ack());
    assert_stats!(q, {
        ready: 0, delayed: 0, leased: 0, acked: 3, nacked: 0, rejected: 0, released: 0,
        expired: 1, dead_lettered: 0, dropped: 0, delivered: 4, stale: 31,
    });
    assert_stats!(dlq, { enqueued: 0, ready: 0 });
}

#[test]
fn second_ack_of_the_same_tag_is_stale() {
    let broker = broker();
    let q = plain(&broker, "g2.twice");
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m1");
    put(&q, "m2");
    let d = next(&a);
    assert!(q.ack(d.tag()));
    let after_first = q.stats();
    assert_eq!(after_first.acked, 1);
    assert!(!q.ack(d.tag()));
    let mut expected = after_first.clone();
    expected.stale += 1;
    assert_eq!(q.stats(), expected);
    // m2 went to `a` when its credit came back, and only once.
    let d2 = next(&a);
    assert_eq!(
        (d2.tag(), d2.envelope().id.as_str()),
        (DeliveryTag(2), "m2")
    );
    nothing(&a);
}

// ---------------------------------------------------------------------------------------
// G3 Fresh tags
// ---------------------------------------------------------------------------------------

#[test]
fn every_delivery_gets_a_tag_greater_than_all_before() {
    let broker = broker();
    let q = broker
        .declare_queue(
            "g3.tags",
            QueueConfig {
                ack_timeout: secs(10),
                retry: RetryPolicy::immediate(),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let mut tags = Vec::new();
    let a = q.consume("a", prefetch(2)).unwrap();
    let b = q.consume("b", prefetch(2)).unwrap();
    for i in 0..4 {
        put(&q, &format!("m{i}"));
    }
    let (a1, a2) = (next(&a), next(&a));
    let (b1, b2) = (next(&b), next(&b));
    tags.extend([a1.tag(), b1.tag(), a2.tag(), b2.tag()]);
    assert!(a1.nack()); // immediate redelivery
    let a3 = next(&a);
    tags.push(a3.tag());
    assert!(b1.release());
    let b3 = next(&b);
    tags.push(b3.tag());
    broker.advance(secs(10)).unwrap(); // every lease expires and comes back
    let mut redelivered: Vec<Delivery> = drain(&a);
    redelivered.extend(drain(&b));
    redelivered.sort_by_key(|d| d.tag());
    assert_eq!(redelivered.len(), 4);
    tags.extend(redelivered.iter().map(|d| d.tag()));
    // Restart consumer "a" under the same name: its leases come back with new tags.
    a.cancel();
    let a = q.consume("a", prefetch(2)).unwrap();
    let mut after_restart = drain(&a);
    after_restart.extend(drain(&b));
    after_restart.sort_by_key(|d| d.tag());
    tags.extend(after_restart.iter().map(|d| d.tag()));
    let expected: Vec<DeliveryTag> = (1..=12).map(DeliveryTag).collect();
    assert_eq!(tags, expected);
    // Both consumers are at their credit; freeing one of the restarted consumer's leases
    // lets the next message through, and it continues the sequence.
    put(&q, "last");
    nothing(&a);
    nothing(&b);
    assert!(after_restart[0].ack());
    let last = next(&a);
    assert_eq!(
        (last.tag(), last.envelope().id.as_str()),
        (DeliveryTag(13), "last")
    );
}

#[test]
fn redelivery_after_expiry_gets_a_new_tag_never_the_old_one() {
    let broker = broker();
    let q = timeout_queue(&broker, "g3.expiry", secs(1));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let mut seen = Vec::new();
    for attempt in 1..=5 {
        let d = next(&a);
        assert_eq!(d.envelope().attempt, attempt);
        seen.push(d.tag().0);
        broker.advance(secs(1)).unwrap();
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    assert_stats!(q, { expired: 5, delivered: 6 });
}

// ---------------------------------------------------------------------------------------
// G4 A lease with deadline d is expired at every t >= d; a settle at t < d succeeds
// ---------------------------------------------------------------------------------------

fn leased_at_zero(name: &str) -> (Broker, Queue, Consumer, Delivery) {
    let broker = broker();
    let q = timeout_queue(&broker, name, secs(10));
    let a = q.consume("a", prefetch(1)).unwrap();
    put(&q, "m");
    let d = next(&a);
    (broker, q, a, d)
}

#[test]
fn every_settle_one_tick_before_the_deadline_succeeds() {
    for (name, settle) in SETTLES {
        let (broker, q, _a, d) = leased_at_zero("g4.before");
        broker.advance(secs(10) - ms(1)).unwrap();
        assert!(settle(&q, d.tag()), "{name} at d - 1 tick");
        assert_stats!(q, { stale: 0, expired: 0 });
    }
}

#[test]
fn every_settle_at_the_deadline_is_stale() {
    for (name, settle) in SETTLES {
        let (broker, q, a, d) = leased_at_zero("g4.at");
        broker.advance(secs(10)).unwrap();
        assert!(!settle(&q, d.tag()), "{name} at d");
        assert_stats!(q, { stale: 1, expired: 1, leased: 1 });
        let again = next(&a);
        assert_eq!((again.tag(), again.envelope().attempt), (DeliveryTag(2), 2));
    }
}

#[test]
fn lease_stays_expired_at_every_later_time() {
    let (broker, q, _a, d) = leased_at_zero("g4.after");
    broker.advance(secs(10)).unwrap();
    for step in [ms(1), secs(1), secs(60), secs(3600)] {
        broker.advance(step).unwrap();
        assert!(!q.ack(d.tag()));
        assert!(!q.touch(d.tag()));
    }
    assert_stats!(q, { stale: 8, acked: 0 });
}

#[test]
fn touched_lease_expires_exactly_at_its_new_deadline() {
    // touched at 4 s: the deadline moves to 14 s.
    let (broker, q, _a, d) = leased_at_zero("g4.touch");
    broker.advance(secs(4)).unwrap();
    assert!(d.touch());
    broker.advance(secs(10) - ms(1)).unwrap();
    assert!(d.ack(), "at 13.999 s the touched lease is live");

    let (broker, q2, _a2, d2) = leased_at_zero("g4.touch");
    broker.advance(secs(4)).unwrap();
    assert!(d2.touch());
    broker.advance(secs(10)).unwrap();
    assert!(!d2.ack(), "at 14 s the touched lease has expired");
    assert_stats!(q2, { expired: 1, stale: 1 });
    assert_stats!(q, { expired: 0, acked: 1 });
}

// ---------------------------------------------------------------------------------------
// G5 No cross-shard contention: queues are independent of each other
// ---------------------------------------------------------------------------------------

#[test]
fn queues_on_different_shards_keep_independent_tags_and_state() {
    let broker = broker4();
    let queues: Vec<Queue> = (0..8)
        .map(|i| plain(&broker, &format!("g5.q{i}")))
        .collect();
    let consumers: Vec<Consumer> = queues
        .iter()
        .map(|q| q.consume("c", prefetch(10)).unwrap())
        .collect();
    for round in 0..3 {
        for q in &queues {
            put(q, &format!("{}-{round}", q.name()));
        }
    }
    for (q, c) in queues.iter().zip(&consumers) {
        let tags: Vec<u64> = drain(c).iter().map(|d| d.tag().0).collect();
        assert_eq!(tags, vec![1, 2, 3], "queue {}", q.name());
    }
    // Acking tag 2 on one queue acks nothing anywhere else.
    assert!(queues[0].ack(DeliveryTag(2)));
    for q in &queues[1..] {
        assert_stats!(q, { acked: 0, leased: 3, stale: 0 });
    }
    assert!(!queues[0].ack(DeliveryTag(2)));
    for q in &queues[1..] {
        assert!(
            q.ack(DeliveryTag(2)),
            "tag 2 of {} is its own lease",
            q.name()
        );
    }
    for q in &queues {
        assert_stats!(q, { acked: 1, leased: 2, enqueued: 3 });
    }
}

#[test]
fn concurrent_traffic_on_many_shards_does_not_disturb_any_queue() {
    let broker = broker4();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let q = plain(&broker, &format!("g5.busy{i}"));
            std::thread::spawn(move || {
                let c = q.consume("c", prefetch(1)).unwrap();
                for n in 1..=2000_u64 {
                    put(&q, &format!("m{n}"));
                    let d = next(&c);
                    assert_eq!(d.tag(), DeliveryTag(n));
                    assert_eq!(d.envelope().id, format!("m{n}"));
                    assert!(d.ack());
                }
                assert_stats!(q, {
                    enqueued: 2000, delivered: 2000, acked: 2000, stale: 0,
                    ready: 0, leased: 0,
                });
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
}

#[test]
fn cross_shard_dead_letter_forwards_in_every_direction_lose_nothing() {
    let broker = broker4();
    for j in 0..8 {
        plain(&broker, &format!("g5.dlq{j}"));
    }
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let q = broker
                .declare_queue(
                    &format!("g5.src{i}"),
                    QueueConfig {
                        dead_letter: Some(format!("g5.dlq{}", (i + 3) % 8)),
                        ..QueueConfig::default()
                    },
                )
                .unwrap();
            std::thread::spawn(move || {
                let c = q.consume("c", prefetch(100)).unwrap();
                for batch in 0..10 {
                    let msgs = (0..50)
                        .map(|n| Message::new("x").with_id(format!("{i}-{batch}-{n}")))
                        .collect();
                    q.put_batch(msgs).unwrap();
                    let settles: Vec<(DeliveryTag, Settle)> = drain(&c)
                        .iter()
                        .map(|d| (d.tag(), Settle::Reject))
                        .collect();
                    assert_eq!(settles.len(), 50);
                    assert!(q.settle_batch(&settles).iter().all(|&ok| ok));
                }
                assert_stats!(q, { rejected: 500, dead_lettered: 500, dropped: 0, leased: 0 });
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    for j in 0..8 {
        let dlq = broker.queue(&format!("g5.dlq{j}")).unwrap();
        assert_stats!(dlq, { enqueued: 500, ready: 500 });
    }
}

// ---------------------------------------------------------------------------------------
// G6 Deterministic under the manual clock
// ---------------------------------------------------------------------------------------

/// A busy program: jittered retries, expiries, releases, dead letters, three queues on
/// three shards. Returns every delivery it saw, with the time it was seen.
fn jittery_program() -> Vec<String> {
    let broker = Broker::builder().shards(3).manual_clock().build().unwrap();
    let dead = plain(&broker, "g6.dead");
    let jobs = broker
        .declare_queue(
            "g6.jobs",
            QueueConfig {
                ack_timeout: secs(2),
                retry: RetryPolicy {
                    initial: ms(300),
                    multiplier: 1.7,
                    max: secs(3),
                    jitter: 0.5,
                },
                max_deliveries: Some(4),
                dead_letter: Some("g6.dead".into()),
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let other = broker
        .declare_queue(
            "g6.other",
            QueueConfig {
                ack_timeout: secs(1),
                retry: RetryPolicy {
                    initial: ms(200),
                    multiplier: 2.0,
                    max: secs(2),
                    jitter: 0.9,
                },
                ..QueueConfig::default()
            },
        )
        .unwrap();
    let watchers = [
        (jobs.clone(), jobs.consume("a", prefetch(2)).unwrap()),
        (jobs.clone(), jobs.consume("b", prefetch(1)).unwrap()),
        (jobs.clone(), jobs.consume("c", prefetch(3)).unwrap()),
        (other.clone(), other.consume("x", prefetch(2)).unwrap()),
        (other.clone(), other.consume("y", prefetch(2)).unwrap()),
        (dead.clone(), dead.consume("z", prefetch(50)).unwrap()),
    ];
    for i in 0..12 {
        put(&jobs, &format!("job{i}"));
    }
    for i in 0..8 {
        put(&other, &format!("other{i}"));
    }
    let mut log = Vec::new();
    let mut held = Vec::new();
    for step in 0..1500 {
        broker.advance(ms(10)).unwrap();
        for (q, c) in &watchers {
            for d in drain(c) {
                let e = d.envelope();
                log.push(format!(
                    "{} {} {} {} {} {} {:?}",
                    step * 10,
                    q.name(),
                    d.consumer(),
                    d.tag().0,
                    e.id,
                    e.attempt,
                    e.death
                ));
                match d.tag().0 % 5 {
                    0 | 4 => assert!(d.ack()),
                    1 => assert!(d.nack()),
                    2 => held.push(d), // left to expire
                    _ => assert!(d.release()),
                }
            }
        }
    }
    for q in [&jobs, &other, &dead] {
        log.push(format!("{:?}", q.stats()));
    }
    broker.shutdown();
    log
}

#[test]
fn same_program_twice_gives_the_same_deliveries_tags_and_attempts() {
    let first = jittery_program();
    let second = jittery_program();
    assert!(first.len() > 40, "the program should be busy: {first:#?}");
    assert!(
        first.iter().any(|line| line.contains("MaxDeliveries")),
        "the program should dead-letter something"
    );
    assert_eq!(first, second);
}
