//! Many producer and consumer threads on several queues across several shards: every
//! message put is acked exactly once, nothing is lost, and no message is ever held by two
//! live leases at once. Plus a real lease expiry under the system clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leasemq::{
    Broker, Consumer, ConsumerConfig, Delivery, Message, PutOutcome, Queue, QueueConfig,
    RetryPolicy,
};

mod common;
use common::*;

const QUEUES: usize = 6;
const PRODUCERS: usize = 3;
const PER_PRODUCER_PER_QUEUE: usize = 400;
const TOTAL_PER_QUEUE: usize = PRODUCERS * PER_PRODUCER_PER_QUEUE;

/// A small stable hash of an id, so the settle decisions repeat.
fn fnv(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Who holds which message right now, as the consumers see it.
#[derive(Default)]
struct Ledger {
    /// (queue, id) -> (consumer, tag) of the one live lease a consumer has received.
    held: Mutex<HashMap<(usize, String), (String, u64)>>,
    /// (queue, id) -> how many acks returned true.
    acked: Mutex<HashMap<(usize, String), u32>>,
    done: AtomicUsize,
    nacks: [AtomicU64; QUEUES],
    abandoned: [AtomicU64; QUEUES],
}

impl Ledger {
    fn take(&self, queue: usize, consumer: &str, d: &Delivery) {
        let key = (queue, d.envelope().id.clone());
        let previous = self
            .held
            .lock()
            .unwrap()
            .insert(key.clone(), (consumer.to_string(), d.tag().0));
        assert!(
            previous.is_none(),
            "{key:?} delivered to {consumer} (tag {}) while leased to {previous:?}",
            d.tag().0
        );
    }

    fn give_back(&self, queue: usize, d: &Delivery) {
        let key = (queue, d.envelope().id.clone());
        let removed = self.held.lock().unwrap().remove(&key);
        assert_eq!(removed.map(|(_, tag)| tag), Some(d.tag().0));
    }
}

struct Worker {
    queue_index: usize,
    queue: Queue,
    consumer: Consumer,
    /// Stop after this many deliveries, abandoning the last two received leases.
    quit_after: Option<usize>,
}

fn run_worker(w: Worker, ledger: Arc<Ledger>, total: usize) {
    let name = w.consumer.name().to_string();
    let started = Instant::now();
    let mut received = 0;
    let mut kept: Vec<Delivery> = Vec::new();
    while ledger.done.load(Ordering::SeqCst) < total {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{name} on queue {} is still waiting: messages were lost",
            w.queue_index
        );
        let Some(d) = w
            .consumer
            .recv_timeout(Duration::from_millis(5))
            .expect("recv_timeout")
        else {
            if !kept.is_empty() {
                break; // nothing more is coming this way: leave with what it holds
            }
            continue;
        };
        assert_eq!(d.consumer(), name);
        ledger.take(w.queue_index, &name, &d);
        received += 1;
        if let Some(limit) = w.quit_after {
            if received > limit {
                kept.push(d);
                if kept.len() == 2 {
                    break;
                }
                continue;
            }
        }
        let h = fnv(&d.envelope().id);
        let attempt = d.envelope().attempt;
        if attempt == 1 && h.is_multiple_of(7) {
            ledger.give_back(w.queue_index, &d);
            assert!(d.nack(), "nack of a live lease");
            ledger.nacks[w.queue_index].fetch_add(1, Ordering::SeqCst);
        } else if attempt == 1 && h.is_multiple_of(11) && d.tag().0 % 2 == 0 {
            ledger.give_back(w.queue_index, &d);
            assert!(w.queue.release(d.tag()), "release of a live lease");
        } else {
            ledger.give_back(w.queue_index, &d);
            assert!(d.ack(), "ack of a live lease");
            *ledger
                .acked
                .lock()
                .unwrap()
                .entry((w.queue_index, d.envelope().id.clone()))
                .or_default() += 1;
            ledger.done.fetch_add(1, Ordering::SeqCst);
        }
    }
    // Leaving: the received leases come back to the others when the consumer goes.
    for d in &kept {
        ledger.give_back(w.queue_index, d);
    }
    ledger.abandoned[w.queue_index].fetch_add(kept.len() as u64, Ordering::SeqCst);
    w.consumer.cancel();
}

#[test]
fn every_message_is_acked_exactly_once_by_many_threads_on_many_shards() {
    let broker = Broker::builder().shards(4).manual_clock().build().unwrap();
    let queues: Vec<Queue> = (0..QUEUES)
        .map(|i| {
            broker
                .declare_queue(
                    &format!("threads.q{i}"),
                    QueueConfig {
                        retry: RetryPolicy::immediate(),
                        ..QueueConfig::default()
                    },
                )
                .unwrap()
        })
        .collect();
    let total = QUEUES * TOTAL_PER_QUEUE;
    let ledger = Arc::new(Ledger::default());

    let mut workers = Vec::new();
    for (qi, q) in queues.iter().enumerate() {
        for (ci, (prefetch, quit_after)) in [(1, None), (4, None), (16, Some(25)), (3, None)]
            .into_iter()
            .enumerate()
        {
            let w = Worker {
                queue_index: qi,
                queue: q.clone(),
                consumer: q
                    .consume(&format!("c{ci}"), ConsumerConfig { prefetch })
                    .unwrap(),
                quit_after,
            };
            let ledger = Arc::clone(&ledger);
            workers.push(thread::spawn(move || run_worker(w, ledger, total)));
        }
    }
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let queues = queues.clone();
            thread::spawn(move || {
                for n in 0..PER_PRODUCER_PER_QUEUE {
                    for (qi, q) in queues.iter().enumerate() {
                        let id = format!("p{p}-q{qi}-{n}");
                        if n % 10 < 5 {
                            let outcome = q.put(Message::new(id.clone()).with_id(id)).unwrap();
                            assert_eq!(outcome, PutOutcome::Enqueued);
                        } else if n % 10 == 5 {
                            let batch = (n..n + 5)
                                .map(|k| {
                                    let id = format!("p{p}-q{qi}-{k}");
                                    Message::new(id.clone()).with_id(id)
                                })
                                .collect();
                            let outcomes = q.put_batch(batch).unwrap();
                            assert_eq!(outcomes, vec![PutOutcome::Enqueued; 5]);
                        }
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().expect("producer");
    }
    for w in workers {
        w.join().expect("consumer");
    }

    let acked = ledger.acked.lock().unwrap();
    assert_eq!(acked.len(), total, "every message acked");
    assert!(acked.values().all(|&n| n == 1), "no message acked twice");
    for p in 0..PRODUCERS {
        for qi in 0..QUEUES {
            for n in 0..PER_PRODUCER_PER_QUEUE {
                assert!(acked.contains_key(&(qi, format!("p{p}-q{qi}-{n}"))));
            }
        }
    }
    assert!(ledger.held.lock().unwrap().is_empty());
    for (qi, q) in queues.iter().enumerate() {
        let s = q.stats();
        let n = TOTAL_PER_QUEUE as u64;
        assert_eq!(count(s.enqueued), n, "{s:?}");
        assert_eq!(count(s.acked), n, "{s:?}");
        assert_eq!(
            (count(s.ready), count(s.delayed), count(s.leased)),
            (0, 0, 0),
            "{s:?}"
        );
        assert_eq!(
            (count(s.expired), count(s.stale), count(s.duplicates)),
            (0, 0, 0)
        );
        assert_eq!(count(s.nacked), ledger.nacks[qi].load(Ordering::SeqCst));
        // Every delivery ended in exactly one way.
        let abandoned = ledger.abandoned[qi].load(Ordering::SeqCst);
        assert_eq!(
            count(s.delivered),
            count(s.acked) + count(s.nacked) + count(s.released) + abandoned,
            "{s:?}"
        );
    }
    broker.shutdown();
}

#[test]
fn short_ack_timeout_expires_under_the_system_clock_and_another_consumer_gets_it() {
    let broker = Broker::builder().shards(2).build().unwrap();
    let q = timeout_queue(&broker, "threads.system", Duration::from_millis(20));
    let a = q.consume("a", ConsumerConfig { prefetch: 1 }).unwrap();
    let b = q.consume("b", ConsumerConfig { prefetch: 1 }).unwrap();
    q.put(Message::new("job").with_id("job")).unwrap();
    let wait = Duration::from_secs(10);
    let first = a.recv_timeout(wait).unwrap().expect("a gets it first");
    assert_eq!((first.tag().0, first.envelope().attempt), (1, 1));

    // a never answers; after 20 ms the lease runs out and b, next in the rotation, gets it.
    let mut current = b
        .recv_timeout(wait)
        .unwrap()
        .expect("b gets it after expiry");
    assert_eq!(current.envelope().id, "job");
    assert_eq!(current.envelope().attempt, 2);
    assert!(current.envelope().redelivered());
    assert!(current.tag() > first.tag());
    assert!(!first.ack(), "a's late ack is stale");
    let mut refused = 1;
    // b acks at once; on a machine too slow for 20 ms the message comes round again.
    while !current.ack() {
        refused += 1;
        assert!(refused < 50, "the message keeps expiring");
        let mut pending: Vec<Delivery> = Vec::new();
        for c in [&a, &b] {
            while let Some(d) = c.try_recv().unwrap() {
                pending.push(d);
            }
        }
        current = pending
            .into_iter()
            .max_by_key(|d| d.tag())
            .expect("the redelivery is in a channel once the ack was refused");
    }
    let s = q.stats();
    assert_eq!(count(s.acked), 1);
    assert_eq!(count(s.stale), refused);
    assert!(count(s.expired) >= 1);
    assert_eq!(count(s.delivered), count(s.expired) + 1);
    assert_eq!((count(s.ready), count(s.leased)), (0, 0));
    broker.shutdown();
}

/// A consumer that stops reading (a hung handler thread) must not make the broker's memory
/// grow under the system clock: every expiry gives it its credit back and the message is
/// delivered to it again, but deliveries whose leases ended unread are dropped from its
/// channel once it holds twice its prefetch.
#[test]
fn a_consumer_that_stops_reading_holds_a_bounded_channel() {
    let broker = Broker::builder().shards(1).build().unwrap();
    let q = timeout_queue(&broker, "threads.stuck", Duration::from_millis(1));
    let stuck = q.consume("stuck", ConsumerConfig { prefetch: 2 }).unwrap();
    q.put(Message::new("job-1")).unwrap();
    q.put(Message::new("job-2")).unwrap();
    // The fault under test is the consumer not reading: let a few hundred leases run out.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(q.stats().expired) < 400 {
        assert!(Instant::now() < deadline, "leases stopped expiring");
        thread::sleep(Duration::from_millis(5));
    }
    let mut waiting = 0;
    while stuck.try_recv().unwrap().is_some() {
        waiting += 1;
    }
    // Twice the prefetch, and a few more for expiries landing while it is read (without the
    // bound: one per expiry, hundreds).
    assert!(
        waiting <= 16,
        "a channel of prefetch 2 held {waiting} deliveries"
    );
    broker.shutdown();
}

/// `on_shard_start` runs once on every shard thread, with its index, before `build`
/// returns; the broker then works as usual.
#[test]
fn on_shard_start_runs_on_each_shard_thread_before_build_returns() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let broker = Broker::builder()
        .shards(3)
        .manual_clock()
        .on_shard_start(move |shard| {
            let name = thread::current().name().map(str::to_owned);
            record.lock().unwrap().push((shard, name));
        })
        .build()
        .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let want: Vec<_> = (0..3)
        .map(|i| (i, Some(format!("leasemq-shard-{i}"))))
        .collect();
    assert_eq!(seen, want);
    let q = broker
        .declare_queue("setup.q", QueueConfig::default())
        .unwrap();
    assert_eq!(q.put(Message::new("x")).unwrap(), PutOutcome::Enqueued);
    broker.shutdown();
}

/// A setup that panics fails `build` with a message that says so, instead of leaving a
/// shard that never ran it.
#[test]
fn a_panicking_shard_setup_fails_build() {
    let result = Broker::builder()
        .shards(2)
        .on_shard_start(|shard| {
            if shard == 1 {
                panic!("setup refused on purpose");
            }
        })
        .build();
    match result {
        Err(leasemq::Error::InvalidConfig(why)) => assert!(why.contains("on_shard_start"), "{why}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// The scheduler time slice a thread runs with, from `/proc/thread-self/sched` (Linux 6.6
/// and later print it as `se.slice`), in nanoseconds; `None` where the system does not say.
fn own_slice() -> Option<u64> {
    let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
    let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
    line.rsplit(':').next()?.trim().parse().ok()
}

/// Shard threads ask for the short default slice before the setup runs, another slice when
/// told, and keep the system's when told `None`; a slice the kernel would not grant fails
/// `build`.
#[test]
fn shard_threads_run_with_the_time_slice_they_were_given() {
    let slices = |slice: Option<Option<Duration>>| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut builder = Broker::builder().shards(2).manual_clock();
        if let Some(slice) = slice {
            builder = builder.shard_time_slice(slice);
        }
        let broker = builder
            .on_shard_start(move |_| record.lock().unwrap().push(own_slice()))
            .build()
            .unwrap();
        broker.shutdown();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        seen
    };
    let default = slices(None);
    let chosen = slices(Some(Some(Duration::from_micros(750))));
    let system = slices(Some(None));
    if custom_slices() && own_slice().is_some() {
        let ns = |d: Duration| Some(d.as_nanos() as u64);
        assert_eq!(default, vec![ns(leasemq::DEFAULT_SHARD_TIME_SLICE); 2]);
        assert_eq!(chosen, vec![ns(Duration::from_micros(750)); 2]);
        assert_eq!(
            system,
            vec![own_slice(); 2],
            "a thread's own slice is the system's"
        );
    }
    for bad in [Duration::from_micros(50), Duration::from_secs(1)] {
        match Broker::builder()
            .shards(1)
            .shard_time_slice(Some(bad))
            .build()
        {
            Err(leasemq::Error::InvalidConfig(why)) => {
                assert!(why.contains("shard_time_slice"), "{why}")
            }
            other => panic!("expected InvalidConfig for {bad:?}, got {other:?}"),
        }
    }
}

/// A broker whose waits never yield still hands off both ways: callers blocked on their
/// answers are woken, and so is a consumer thread parked for its next delivery, in order
/// and with nothing left over. A budget over the maximum fails `build`.
#[test]
fn waits_without_yields_still_hand_off_and_an_overlong_budget_is_refused() {
    const N: usize = 2_000;
    let broker = Broker::builder()
        .shards(2)
        .yield_budget(Duration::ZERO)
        .build()
        .unwrap();
    let jobs = broker
        .declare_queue("jobs", QueueConfig::default())
        .unwrap();
    let worker = jobs.consume("worker", ConsumerConfig::default()).unwrap();
    let reader = thread::spawn(move || {
        (0..N)
            .map(|_| {
                let delivery = worker.recv().unwrap();
                assert!(delivery.ack(), "a live lease is acked");
                String::from_utf8(delivery.envelope().body.to_vec()).unwrap()
            })
            .collect::<Vec<_>>()
    });
    for i in 0..N {
        jobs.put(Message::new(i.to_string())).unwrap();
    }
    let seen = reader.join().unwrap();
    assert_eq!(seen, (0..N).map(|i| i.to_string()).collect::<Vec<_>>());
    let stats = jobs.stats();
    assert_eq!((stats.ready, stats.leased, stats.acked), (0, 0, N as u64));
    broker.shutdown();

    let over = leasemq::MAX_YIELD_BUDGET + Duration::from_micros(1);
    match Broker::builder().shards(1).yield_budget(over).build() {
        Err(leasemq::Error::InvalidConfig(why)) => assert!(why.contains("yield_budget"), "{why}"),
        other => panic!("expected InvalidConfig for {over:?}, got {other:?}"),
    }
    let most = Broker::builder()
        .shards(1)
        .yield_budget(leasemq::MAX_YIELD_BUDGET)
        .build()
        .unwrap();
    most.shutdown();
}
