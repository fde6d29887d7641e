//! Restore mode as a follower uses it: the tables a long restore keeps, and queue
//! numbers.

use std::time::Duration;

use bytes::Bytes;

use crate::durable::Change;
use crate::{Command, Effects, Message, MsgId, QueueConfig, QueueKey, Reply, Shard};

const MS: u64 = 1_000_000;

fn durable(dedup_window: Duration) -> Box<QueueConfig> {
    Box::new(QueueConfig {
        dedup_window,
        durable: true,
        ..QueueConfig::default()
    })
}

fn declare(shard: &mut Shard, name: &str, config: Box<QueueConfig>) -> QueueKey {
    let mut out = Effects::new();
    let cmd = Command::Declare {
        name: name.into(),
        config,
    };
    shard.handle(shard.now(), cmd, &mut out);
    match out.reply {
        Some(Reply::Declared(Ok(key))) => key,
        other => panic!("declare of {name} failed: {other:?}"),
    }
}

/// The dedup windows a restore holds for queue number `queue`.
fn windows_held(shard: &Shard, queue: u32) -> (usize, usize) {
    let r = shard.restoring.as_ref().expect("restoring");
    r.windows
        .get(&queue)
        .map_or((0, 0), |w| (w.until.len(), w.until.capacity()))
}

#[test]
fn a_long_restore_keeps_only_the_dedup_windows_that_have_not_ended() {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let declared = Change::Declared {
        queue: 1,
        name: "jobs".into(),
        config: durable(Duration::from_millis(50)),
    };
    shard.restore(declared).unwrap();
    // A put every millisecond, acked at once: at most 50 windows are open at a time.
    for seq in 1..=20_000u64 {
        let now = seq * MS;
        let changes = [
            Change::Clock { now },
            Change::Enqueued {
                queue: 1,
                seq,
                id: MsgId::Given(format!("m{seq}").into()),
                body: Bytes::from_static(b"x"),
                attempt: 0,
                priority: 0,
                ready_at: None,
                dedup_until: Some(now + 50 * MS),
                death: None,
            },
            Change::Removed { queue: 1, seq },
        ];
        for change in changes {
            shard.restore(change).unwrap();
        }
        let (len, room) = windows_held(&shard, 1);
        assert!(
            len <= 128 && room <= 512,
            "{len} windows in room for {room}"
        );
    }
    // The image has only the open ones; so does the shard that finishes the restore.
    let mut windowed = Vec::new();
    shard.image(|change| {
        if let Change::Windowed { id, .. } = change {
            windowed.push(id);
        }
    });
    assert_eq!(windowed.len(), 50, "m19951 to m20000");
    shard.set_log_epoch(20_000 * MS);
    let mut out = Effects::new();
    shard.finish_restore(&mut out);
    assert_eq!(shard.pending_timers(), 50);
}

#[test]
fn queue_numbers_name_durable_queues_live_and_while_restoring() {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let a = declare(&mut shard, "a", durable(Duration::ZERO));
    let b = declare(&mut shard, "b", durable(Duration::ZERO));
    let passing = declare(&mut shard, "passing", Box::default());
    assert_eq!(shard.queue_number(a), Some(1));
    assert_eq!(shard.queue_number(b), Some(2));
    assert_eq!(shard.queue_number(passing), None, "not durable: no number");
    assert_eq!(shard.queue_by_number(1), Some(a));
    assert_eq!(shard.queue_by_number(2), Some(b));
    assert_eq!(shard.queue_by_number(3), None);
    let mut out = Effects::new();
    shard.handle(0, Command::Close { queue: a }, &mut out);
    assert_eq!(shard.queue_number(a), None, "closed");
    assert_eq!(shard.queue_by_number(1), None, "closed");
    let c = declare(&mut shard, "a", durable(Duration::ZERO));
    assert_eq!(shard.queue_number(c), Some(3), "numbers are not reused");
    shard.check_invariants();

    // A restore knows its queues by the numbers the log gives them.
    let mut restoring = Shard::new(0, Duration::from_millis(1));
    for (queue, name) in [(7, "seven"), (9, "nine")] {
        let change = Change::Declared {
            queue,
            name: name.into(),
            config: durable(Duration::ZERO),
        };
        restoring.restore(change).unwrap();
    }
    let seven = restoring.lookup("seven").unwrap();
    let nine = restoring.lookup("nine").unwrap();
    assert_eq!(restoring.queue_number(seven), Some(7));
    assert_eq!(restoring.queue_by_number(9), Some(nine));
    restoring.restore(Change::Closed { queue: 7 }).unwrap();
    assert_eq!(restoring.queue_number(seven), None);
    assert_eq!(restoring.queue_by_number(7), None);
    let twice = Change::Declared {
        queue: 9,
        name: "another".into(),
        config: durable(Duration::ZERO),
    };
    assert!(restoring.restore(twice).is_err(), "one number, one queue");
    restoring.finish_restore(&mut out);
    assert_eq!(
        restoring.queue_by_number(9),
        Some(nine),
        "and keeps them after"
    );
    let ten = declare(&mut restoring, "ten", durable(Duration::ZERO));
    assert_eq!(
        restoring.queue_number(ten),
        Some(10),
        "new numbers go on after the log's"
    );
    restoring.check_invariants();
    let message = Message::new("x");
    restoring.handle(
        0,
        Command::Put {
            queue: ten,
            message,
        },
        &mut out,
    );
    assert!(matches!(
        out.log.last(),
        Some(Change::Enqueued { queue: 10, .. })
    ));
}

fn enqueued(queue: u32, seq: u64, id: &str, ready_at: Option<u64>) -> Change {
    Change::Enqueued {
        queue,
        seq,
        id: MsgId::Given(id.into()),
        body: Bytes::from_static(b"x"),
        attempt: 0,
        priority: 0,
        ready_at,
        dedup_until: None,
        death: None,
    }
}

#[test]
fn delays_that_end_together_end_in_the_order_of_first_enqueue_whatever_the_slots() {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let changes = [
        Change::Declared {
            queue: 1,
            name: "jobs".into(),
            config: durable(Duration::ZERO),
        },
        enqueued(1, 1, "a", None),
        enqueued(1, 2, "b", Some(10 * MS)),
        // "c" takes the slot "a" left, ahead of "b"'s.
        Change::Removed { queue: 1, seq: 1 },
        enqueued(1, 3, "c", Some(10 * MS)),
    ];
    for change in changes {
        shard.restore(change).unwrap();
    }
    let mut out = Effects::new();
    shard.finish_restore(&mut out);
    let queue = shard.lookup("jobs").unwrap();
    let consume = Command::Consume {
        queue,
        name: "c".into(),
        config: crate::ConsumerConfig { prefetch: 10 },
        priority: 0,
        ack_timeout: None,
    };
    shard.handle(0, consume, &mut out);
    shard.handle_timeout(10, &mut out);
    let order: Vec<String> = (out.deliveries.iter())
        .map(|(_, d)| d.id.to_text())
        .collect();
    assert_eq!(order, ["b", "c"]);
}

#[test]
fn what_finishing_a_restore_logs_comes_in_the_order_of_queue_numbers() {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let once = Box::new(QueueConfig {
        max_deliveries: Some(1),
        durable: true,
        ..QueueConfig::default()
    });
    for queue in 1..=32u32 {
        let seq = u64::from(queue);
        let changes = [
            Change::Declared {
                queue,
                name: format!("q{queue}").into(),
                config: once.clone(),
            },
            enqueued(queue, seq, "m", None),
            Change::Delivered {
                queue,
                seq,
                tag: 1,
                attempt: 1,
            },
        ];
        for change in changes {
            shard.restore(change).unwrap();
        }
    }
    // Each message was leased at the crash after its only allowed delivery: dropped.
    let mut out = Effects::new();
    shard.finish_restore(&mut out);
    let removed: Vec<u32> = (out.log.iter())
        .filter_map(|change| match change {
            Change::Removed { queue, .. } => Some(*queue),
            _ => None,
        })
        .collect();
    assert_eq!(removed, (1..=32).collect::<Vec<u32>>());
}
