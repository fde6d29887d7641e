//! Contract §7, durable queues: what a broker built on the same data dir has after a
//! `shutdown`, item by item, and the data dir's rules (lock, shard count, configs). The
//! `kill -9` crash suite is in `tests/crash.rs`.

mod common;
use common::*;

use std::path::Path;
use std::time::Duration;

use leasemq::{
    Broker, ConsumerConfig, DeathReason, Error, Message, Overflow, PutOutcome, QueueConfig,
    SyncPolicy,
};

fn durable() -> QueueConfig {
    QueueConfig {
        durable: true,
        ack_timeout: secs(10),
        ..QueueConfig::default()
    }
}

fn open(dir: &Path) -> Broker {
    Broker::builder()
        .manual_clock()
        .data_dir(dir)
        .build()
        .expect("the data dir opens")
}

fn open_with(dir: &Path, shards: usize) -> Broker {
    Broker::builder()
        .shards(shards)
        .manual_clock()
        .data_dir(dir)
        .build()
        .expect("the data dir opens")
}

/// Every delivery a fresh consumer gets at once: (id, body, attempt, tag).
fn drain(broker: &Broker, queue: &str) -> Vec<(String, String, u32, u64)> {
    let q = broker.queue(queue).expect("the durable queue is back");
    let c = q
        .consume("drain", ConsumerConfig { prefetch: 65_535 })
        .unwrap();
    let mut got = Vec::new();
    while let Some(d) = c.try_recv().unwrap() {
        let e = d.envelope();
        got.push((
            e.id.clone(),
            String::from_utf8(e.body.to_vec()).unwrap(),
            e.attempt,
            d.tag().0,
        ));
    }
    got
}

/// §7 items 1 and 2: the queue and its config come back, with every message put and not
/// acked, in order; an acked one never does; a queue that is not durable is gone.
#[test]
fn a_shutdown_keeps_durable_queues_their_configs_and_unacked_messages() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 2);
    let jobs = broker.declare_queue("jobs", durable()).unwrap();
    let scratch = broker
        .declare_queue("scratch", QueueConfig::default())
        .unwrap();
    for i in 0..5 {
        let put = jobs.put(Message::new(format!("job {i}")).with_id(format!("j{i}")));
        assert_eq!(put, Ok(PutOutcome::Enqueued));
    }
    scratch.put(Message::new("lost")).unwrap();
    let worker = jobs.consume("w", ConsumerConfig { prefetch: 2 }).unwrap();
    let first = worker.try_recv().unwrap().unwrap();
    assert!(first.ack());
    broker.shutdown();

    let broker = open(dir.path());
    assert_eq!(broker.shard_count(), 2, "the data dir's shard count");
    assert!(
        broker.queue("scratch").is_none(),
        "in-memory queues are gone"
    );
    let jobs = broker.queue("jobs").expect("found by name");
    assert!(jobs.is_durable());
    assert!(broker.declare_queue("jobs", durable()).is_ok());
    let other = QueueConfig {
        max_length: Some(3),
        ..durable()
    };
    assert_eq!(
        broker.declare_queue("jobs", other).unwrap_err(),
        Error::ConfigMismatch
    );
    let got = drain(&broker, "jobs");
    let ids: Vec<&str> = got.iter().map(|(id, ..)| id.as_str()).collect();
    // j1 and j2 (delivered when j0's ack freed credit) were leased at the shutdown: back
    // first, then the fresh ones in put order.
    assert_eq!(ids, ["j1", "j2", "j3", "j4"]);
    assert_eq!(got[0].1, "job 1");
    let attempts: Vec<u32> = got.iter().map(|(_, _, a, _)| *a).collect();
    assert_eq!(
        attempts,
        [2, 2, 1, 1],
        "a leased one's next attempt is one more"
    );
    assert!(
        got.iter().all(|(_, _, _, tag)| *tag > 3),
        "tags after the restart are above tags 1 to 3 handed out before it"
    );
    // Gauges exact (the drain's consumer ended: its deliveries were released), counters
    // from zero.
    let stats = jobs.stats();
    assert_eq!((stats.leased, stats.ready, stats.enqueued), (0, 4, 0));
    broker.shutdown();
}

/// §7 items 3 and 5 through several restarts: attempts keep counting, so `max_deliveries`
/// bounds a message whose handler crashes the process every time, and tags keep growing.
#[test]
fn attempts_and_tags_carry_on_across_restarts_and_max_deliveries_ends_a_crash_loop() {
    let dir = tempfile::tempdir().unwrap();
    let config = |dead_letter: Option<&str>| QueueConfig {
        max_deliveries: dead_letter.map(|_| 3),
        dead_letter: dead_letter.map(String::from),
        ..durable()
    };
    {
        let broker = open_with(dir.path(), 3);
        broker.declare_queue("poison.dlq", config(None)).unwrap();
        let q = broker
            .declare_queue("poison", config(Some("poison.dlq")))
            .unwrap();
        q.put(Message::new("crashes its handler").with_id("p"))
            .unwrap();
        broker.shutdown();
    }
    let mut last_tag = 0;
    for attempt in 1..=3 {
        let broker = open(dir.path());
        let q = broker.queue("poison").unwrap();
        let c = q.consume("handler", ConsumerConfig::default()).unwrap();
        let d = c.try_recv().unwrap().expect("delivered at once");
        assert_eq!(d.envelope().attempt, attempt);
        assert!(d.tag().0 > last_tag, "fresh tag");
        last_tag = d.tag().0;
        // The handler "crashes": the broker goes down with the lease live.
        broker.shutdown();
    }
    let broker = open(dir.path());
    // Its third delivery came back with the restart: dead-lettered at once.
    assert_eq!(drain(&broker, "poison"), []);
    let dead = broker.queue("poison.dlq").unwrap();
    let c = dead
        .consume("inspector", ConsumerConfig::default())
        .unwrap();
    let d = c.try_recv().unwrap().expect("the dead letter");
    let death = d.envelope().death.clone().unwrap();
    assert_eq!(
        (death.queue.as_str(), death.reason, death.attempts),
        ("poison", DeathReason::MaxDeliveries, 3)
    );
    broker.shutdown();
}

/// §7 items 2 and 4, and the manual clock resuming where the log left off: a delayed
/// message is ready at the same instant, an acked id stays a duplicate until its window
/// ends at the same instant.
#[test]
fn delays_and_dedup_windows_end_at_the_same_instant_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        dedup_window: secs(60),
        ..durable()
    };
    {
        let broker = open_with(dir.path(), 1);
        let q = broker.declare_queue("timed", config.clone()).unwrap();
        q.put(Message::new("later").with_id("later").with_delay(secs(30)))
            .unwrap();
        q.put(Message::new("done").with_id("done")).unwrap();
        let c = q.consume("c", ConsumerConfig::default()).unwrap();
        broker.advance(secs(5)).unwrap();
        assert!(c.try_recv().unwrap().unwrap().ack());
        broker.shutdown();
    }
    let broker = open(dir.path());
    let q = broker.queue("timed").unwrap();
    // The clock resumes at 5 s, the ack: "done" was first put at 0 s, its window ends at
    // 60 s.
    let again = q.put(Message::new("again").with_id("done"));
    assert_eq!(again, Ok(PutOutcome::Duplicate));
    let c = q.consume("c", ConsumerConfig::default()).unwrap();
    broker.advance(secs(25) - ms(1)).unwrap();
    assert!(c.try_recv().unwrap().is_none(), "not before 30 s");
    broker.advance(ms(1)).unwrap();
    assert_eq!(c.try_recv().unwrap().unwrap().envelope().id, "later");
    broker.advance(secs(30) - ms(1)).unwrap();
    assert_eq!(
        q.put(Message::new("again").with_id("done")),
        Ok(PutOutcome::Duplicate)
    );
    broker.advance(ms(1)).unwrap();
    assert_eq!(
        q.put(Message::new("again").with_id("done")),
        Ok(PutOutcome::Enqueued),
        "the window ended at 60 s"
    );
    broker.shutdown();
}

/// A dead letter between two durable queues on different shards survives, with its
/// death record.
#[test]
fn dead_letters_of_durable_queues_survive_with_their_death_records() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 4);
    let (src, dlq) = (0..)
        .map(|i| (format!("src{i}"), format!("dlq{i}")))
        .find(|(s, d)| broker.shard_of(s) != broker.shard_of(d))
        .unwrap();
    broker.declare_queue(&dlq, durable()).unwrap();
    let config = QueueConfig {
        dead_letter: Some(dlq.clone()),
        ..durable()
    };
    let q = broker.declare_queue(&src, config).unwrap();
    q.put(Message::new("bad").with_id("bad")).unwrap();
    let c = q.consume("c", ConsumerConfig::default()).unwrap();
    assert!(c.try_recv().unwrap().unwrap().reject());
    broker.shutdown();

    let broker = open(dir.path());
    assert_eq!(drain(&broker, &src), []);
    let got = drain(&broker, &dlq);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), got[0].2), ("bad", 1));
    broker.shutdown();
}

/// A closed durable queue stays closed; its name may be declared again, fresh.
#[test]
fn a_closed_durable_queue_does_not_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 1);
    let q = broker.declare_queue("short", durable()).unwrap();
    q.put(Message::new("x")).unwrap();
    assert!(q.close());
    broker.shutdown();
    let broker = open(dir.path());
    assert!(broker.queue("short").is_none());
    let q = broker.declare_queue("short", durable()).unwrap();
    assert_eq!(q.stats().ready, 0);
    broker.shutdown();
}

/// A queue that a durable queue dead-letters into stays durable: declaring it again in
/// memory (after closing it) is refused while the durable queue lives, also after a restart.
#[test]
fn a_durable_queues_dead_letter_queue_cannot_come_back_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path());
    let dead = broker.declare_queue("work.dead", durable()).unwrap();
    let config = QueueConfig {
        dead_letter: Some("work.dead".into()),
        ..durable()
    };
    let work = broker.declare_queue("work", config).unwrap();
    assert!(dead.close());
    assert_err!(
        broker.declare_queue("work.dead", QueueConfig::default()),
        Error::InvalidConfig(_)
    );
    broker.declare_queue("work.dead", durable()).unwrap();
    broker.shutdown();
    let broker = open(dir.path());
    broker.queue("work.dead").unwrap().close();
    assert_err!(
        broker.declare_queue("work.dead", QueueConfig::default()),
        Error::InvalidConfig(_)
    );
    // Once the durable queue is gone, the name is free for any queue.
    assert!(broker.queue("work").unwrap().close());
    broker
        .declare_queue("work.dead", QueueConfig::default())
        .unwrap();
    drop(work);
    broker.shutdown();
}

/// A purge is on disk: what it removed stays gone after a restart, and what a stopped
/// consumer still held comes back (it was never settled).
#[test]
fn a_purge_and_a_stopped_consumers_leases_survive_a_restart_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path());
    let q = broker.declare_queue("purged", durable()).unwrap();
    for i in 0..5 {
        q.put(Message::new(format!("m{i}")).with_id(format!("m{i}")))
            .unwrap();
    }
    let c = q.consume("c", ConsumerConfig { prefetch: 3 }).unwrap();
    let held = c.recv().unwrap();
    c.stop(); // the two unread are released, m0 stays leased
    assert_eq!(held.envelope().id, "m0");
    assert_eq!(q.purge().unwrap(), 4);
    q.put(Message::new("after").with_id("after")).unwrap();
    broker.shutdown();
    drop(c);
    let broker = open(dir.path());
    let got: Vec<(String, u32)> = (drain(&broker, "purged").into_iter())
        .map(|d| (d.0, d.2))
        .collect();
    assert_eq!(got, [("m0".to_string(), 2), ("after".to_string(), 1)]);
    broker.shutdown();
}

/// A head dropped to make room is gone for good, and the queue drops its head after a
/// restart too (its overflow is part of its config on disk).
#[test]
fn a_dropped_head_stays_dropped_and_the_overflow_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        max_length: Some(2),
        overflow: Overflow::DropHead,
        ..durable()
    };
    let broker = open(dir.path());
    let q = broker.declare_queue("capped", config.clone()).unwrap();
    for i in 0..3 {
        q.put(Message::new(format!("m{i}")).with_id(format!("m{i}")))
            .unwrap();
    }
    broker.shutdown();
    let broker = open(dir.path());
    let q = broker.queue("capped").expect("the durable queue is back");
    assert_eq!(
        q.put(Message::new("m3").with_id("m3")).unwrap(),
        PutOutcome::Enqueued
    );
    assert_eq!(
        broker.declare_queue("capped", config).unwrap().name(),
        "capped"
    );
    broker.shutdown();
    let broker = open(dir.path());
    let ids: Vec<String> = drain(&broker, "capped").into_iter().map(|d| d.0).collect();
    assert_eq!(ids, ["m2", "m3"]);
    broker.shutdown();
}

/// The data dir's rules: one broker at a time, the shard count it was made with, durable
/// queues only with a data dir and only into durable dead-letter queues.
#[test]
fn the_data_dir_is_locked_remembers_its_shards_and_checks_durable_configs() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 3);
    match Broker::builder().data_dir(dir.path()).build() {
        Err(Error::Storage(why)) => assert!(why.contains("locked"), "{why}"),
        other => panic!("expected a locked data dir, got {other:?}"),
    }
    let plain = broker
        .declare_queue("plain", QueueConfig::default())
        .unwrap();
    assert!(!plain.is_durable());
    let into_plain = QueueConfig {
        dead_letter: Some("plain".into()),
        ..durable()
    };
    match broker.declare_queue("d", into_plain) {
        Err(Error::InvalidConfig(why)) => assert!(why.contains("dead_letter"), "{why}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    broker.shutdown();

    match Broker::builder().shards(2).data_dir(dir.path()).build() {
        Err(Error::InvalidConfig(why)) => {
            assert!(why.contains('3') && why.contains('2'), "{why}")
        }
        other => panic!("expected InvalidConfig naming both counts, got {other:?}"),
    }
    let broker = Broker::builder().data_dir(dir.path()).build().unwrap();
    assert_eq!(broker.shard_count(), 3);
    broker.shutdown();

    let memory = Broker::builder().manual_clock().build().unwrap();
    match memory.declare_queue("d", durable()) {
        Err(Error::InvalidConfig(why)) => assert!(why.contains("data dir"), "{why}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let zero = Broker::builder()
        .data_dir(dir.path())
        .sync(SyncPolicy::Interval(Duration::ZERO))
        .build();
    assert!(matches!(zero, Err(Error::InvalidConfig(_))));
}

/// `SyncPolicy::Interval` answers at once and still has everything on disk after a
/// shutdown; the system clock works with durable queues as the manual one does.
#[test]
fn interval_sync_and_the_system_clock_keep_what_a_shutdown_saw() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::builder()
        .shards(2)
        .data_dir(dir.path())
        .sync(SyncPolicy::Interval(ms(50)))
        .build()
        .unwrap();
    let q = broker.declare_queue("batch", durable()).unwrap();
    let messages = (0..1_000).map(|i| Message::new(format!("m{i}"))).collect();
    assert_eq!(q.put_batch(messages).unwrap().len(), 1_000);
    broker.shutdown();
    let broker = Broker::builder().data_dir(dir.path()).build().unwrap();
    let got = drain(&broker, "batch");
    assert_eq!(got.len(), 1_000);
    assert!(got.iter().enumerate().all(|(i, m)| m.1 == format!("m{i}")));
    broker.shutdown();
}

/// Disk use follows what the durable queues hold, not what passed through them: a queue
/// that holds a few hundred messages while many megabytes pass ends with a few segments.
#[test]
fn compaction_keeps_the_data_dir_small() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 1);
    let q = broker.declare_queue("through", durable()).unwrap();
    let c = q.consume("c", ConsumerConfig { prefetch: 1_000 }).unwrap();
    let body = vec![b'x'; 1024];
    for _ in 0..120 {
        let batch = (0..500).map(|_| Message::new(body.clone())).collect();
        q.put_batch(batch).unwrap();
        let mut last = None;
        while let Some(d) = c.try_recv().unwrap() {
            last = Some(d.tag());
        }
        if let Some(tag) = last {
            // Keep the last 300 of each round leased, so that something is held.
            c.ack_up_to(leasemq::DeliveryTag(tag.0.saturating_sub(300)));
        }
    }
    let held = q.stats().leased;
    broker.shutdown();
    // 60 000 messages of 1 KiB passed: ~60 MiB of records without compaction.
    let bytes = disk_use(dir.path());
    assert!(bytes < 40 << 20, "{bytes} bytes on disk");
    let broker = open(dir.path());
    assert_eq!(drain(&broker, "through").len(), held);
    broker.shutdown();
}

fn disk_use(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            disk_use(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// A put_batch larger than one log record is cut into several and comes back whole.
#[test]
fn a_batch_larger_than_a_record_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 1);
    let q = broker.declare_queue("big", durable()).unwrap();
    let body = vec![7u8; 1 << 20];
    let batch: Vec<Message> = (0..12).map(|_| Message::new(body.clone())).collect();
    assert_eq!(q.put_batch(batch).unwrap().len(), 12);
    assert_eq!(q.put(Message::new("after")), Ok(PutOutcome::Enqueued));
    broker.shutdown();
    let broker = open(dir.path());
    let got = drain(&broker, "big");
    assert_eq!(got.len(), 13);
    assert!(got[..12].iter().all(|m| m.1.len() == 1 << 20));
    broker.shutdown();
}

/// Broker ids stay unique across restarts also where a dead letter carried one into a
/// queue of another shard.
#[test]
fn broker_ids_carried_by_dead_letters_are_not_handed_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_with(dir.path(), 2);
    let (src, dlq) = (0..)
        .map(|i| (format!("ids{i}"), format!("ids-dead{i}")))
        .find(|(s, d)| broker.shard_of(s) != broker.shard_of(d))
        .unwrap();
    broker.shutdown();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let broker = open(dir.path());
        broker.declare_queue(&dlq, durable()).unwrap();
        let config = QueueConfig {
            dead_letter: Some(dlq.clone()),
            ..QueueConfig::default()
        };
        let q = broker.declare_queue(&src, config).unwrap();
        q.put(Message::new("no id")).unwrap();
        let c = q.consume("c", ConsumerConfig::default()).unwrap();
        let d = c.try_recv().unwrap().unwrap();
        assert!(
            seen.insert(d.envelope().id.clone()),
            "{} again",
            d.envelope().id
        );
        assert!(d.reject());
        broker.shutdown();
    }
    let broker = open(dir.path());
    assert_eq!(drain(&broker, &dlq).len(), 3);
    broker.shutdown();
}

/// The log's segment size is a tuning knob: checked at build, and a log written with one
/// size opens with another.
#[test]
fn log_segment_bytes_is_checked_and_a_log_opens_with_another_size() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        0,
        leasemq::MIN_LOG_SEGMENT_BYTES - 8,
        (1 << 20) + 4,
        (1 << 30) + 8,
    ] {
        let err = Broker::builder()
            .data_dir(dir.path())
            .log_segment_bytes(bad)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{bad}: {err}");
    }
    let small = leasemq::MIN_LOG_SEGMENT_BYTES;
    let broker = Broker::builder()
        .shards(1)
        .data_dir(dir.path())
        .log_segment_bytes(small)
        .build()
        .unwrap();
    let q = broker.declare_queue("sized", durable()).unwrap();
    let body = vec![b'y'; 1000];
    for _ in 0..60 {
        let batch = (0..50).map(|_| Message::new(body.clone())).collect();
        q.put_batch(batch).unwrap();
    }
    broker.shutdown();
    // Every segment has the size asked for (each record, a batch of 50 KB, fits one).
    let sizes: Vec<u64> = std::fs::read_dir(dir.path().join("shard-0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some("wal".as_ref()))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&n| n == small),
        "{sizes:?}"
    );
    let broker = Broker::builder().data_dir(dir.path()).build().unwrap();
    assert_eq!(drain(&broker, "sized").len(), 3_000);
    broker.shutdown();
}

/// A priority queue comes back with its `max_priority` and each message's priority: the
/// ready order after a restart is by priority, and within one, those delivered before the
/// restart first (§7 item 3), then the fresh ones in the order they were put.
#[test]
fn priorities_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        max_priority: Some(2),
        ..durable()
    };
    let broker = open(dir.path());
    let q = broker.declare_queue("ranked", config.clone()).unwrap();
    for (id, priority) in [("low-1", 0), ("top-1", 2), ("mid-1", 1), ("low-2", 0)] {
        q.put(Message::new(id).with_id(id).with_priority(priority))
            .unwrap();
    }
    // top-1 is leased at the shutdown; `over` (priority 9) counts as 2, after it.
    let c = q.consume("c", ConsumerConfig { prefetch: 1 }).unwrap();
    assert_eq!(c.try_recv().unwrap().unwrap().envelope().id, "top-1");
    q.put(Message::new("over").with_id("over").with_priority(9))
        .unwrap();
    broker.shutdown();

    let broker = open(dir.path());
    let other = QueueConfig {
        max_priority: Some(3),
        ..config.clone()
    };
    assert_err!(broker.declare_queue("ranked", other), Error::ConfigMismatch);
    assert_eq!(
        broker.declare_queue("ranked", config).unwrap().name(),
        "ranked"
    );
    let got: Vec<(String, u32)> = drain(&broker, "ranked")
        .into_iter()
        .map(|(id, _, attempt, _)| (id, attempt))
        .collect();
    let want = [
        ("top-1", 1),
        ("over", 0),
        ("mid-1", 0),
        ("low-1", 0),
        ("low-2", 0),
    ];
    let want: Vec<(String, u32)> = (want.iter())
        .map(|&(id, attempt)| (id.to_string(), attempt + 1))
        .collect();
    assert_eq!(got, want);
    broker.shutdown();
}

/// In a priority queue after a restart, a message whose delay ends then joins its own
/// level, ahead of a message of a lower level that was leased at the shutdown.
#[test]
fn a_delayed_message_of_a_priority_queue_comes_back_at_its_level() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        max_priority: Some(2),
        ..durable()
    };
    {
        let broker = open(dir.path());
        let q = broker.declare_queue("ranked", config).unwrap();
        let later = Message::new("later").with_id("later").with_priority(2);
        q.put(later.with_delay(secs(30))).unwrap();
        for (id, priority) in [("low", 0), ("mid", 1)] {
            q.put(Message::new(id).with_id(id).with_priority(priority))
                .unwrap();
        }
        let c = q.consume("c", ConsumerConfig { prefetch: 1 }).unwrap();
        assert_eq!(c.try_recv().unwrap().unwrap().envelope().id, "mid");
        broker.shutdown();
    }
    let broker = open(dir.path());
    broker.advance(secs(30)).unwrap();
    let got: Vec<(String, u32)> = drain(&broker, "ranked")
        .into_iter()
        .map(|(id, _, attempt, _)| (id, attempt))
        .collect();
    let want = [("later", 1), ("mid", 2), ("low", 1)];
    assert_eq!(got, want.map(|(id, attempt)| (id.to_string(), attempt)));
    broker.shutdown();
}
