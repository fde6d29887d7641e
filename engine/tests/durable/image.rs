//! Images of a shard in the middle of a restore, as a follower of a replicated shard
//! takes them: it applies its leader's changes through `restore` and never finishes. An
//! image it takes, restored into a new shard (alone, or with the changes that came
//! after it), must finish the restore where the whole log does: the same messages,
//! attempts, delays, dedup windows and tags, lined up and delivered in the same order.

use std::time::Duration;

use bytes::Bytes;
use leasemq_engine::durable::{begin_batch, decode_batch, Change};
use leasemq_engine::{Command, Effects, Message, MsgId, PutOutcome, QueueKey, Reply, Shard, Tick};

use super::{config, drain, Rng, Run};

/// The changes of each batch.
fn decode(batches: &[Bytes]) -> Vec<Vec<Change>> {
    let decode_one = |batch: &Bytes| {
        let mut changes = Vec::new();
        decode_batch(batch.clone(), |change| {
            changes.push(change);
            Ok(())
        })
        .expect("decodes")
        .expect("collects");
        changes
    };
    batches.iter().map(decode_one).collect()
}

/// A new shard that has restored `batches` and stays in restore mode.
fn restoring(batches: &[Vec<Change>]) -> Shard {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    for change in batches.iter().flatten() {
        shard.restore(change.clone()).expect("fits");
    }
    shard
}

fn image_of(shard: &Shard) -> Vec<Change> {
    let mut image = Vec::new();
    shard.image(|change| image.push(change));
    image
}

/// `changes` in an order that does not depend on the slots and hash tables of the shard
/// that listed them.
fn canonical(mut changes: Vec<Change>) -> Vec<Change> {
    changes.sort_by_key(|change| match change {
        Change::Clock { .. } => (0, 0, 0, String::new()),
        Change::Counters { .. } => (1, 0, 0, String::new()),
        Change::Declared { queue, .. } => (2, *queue, 0, String::new()),
        Change::Tags { queue, .. } => (3, *queue, 0, String::new()),
        Change::Enqueued { queue, seq, .. } => (4, *queue, *seq, String::new()),
        Change::Windowed { queue, id, .. } => (5, *queue, 0, id.to_string()),
        Change::Delivered { queue, seq, .. }
        | Change::Returned { queue, seq, .. }
        | Change::Removed { queue, seq } => (6, *queue, *seq, String::new()),
        Change::Closed { queue } => (7, *queue, 0, String::new()),
    });
    changes
}

/// Where a restore ends.
#[derive(Debug, PartialEq)]
struct Finished {
    /// The image of the live shard.
    image: Vec<Change>,
    /// What `finish_restore` logged and dead-lettered: (queue, id, message number).
    log: Vec<Change>,
    letters: Vec<(String, String, u64)>,
    /// Everything the shard then delivers (see `drain`), in order.
    delivered: Vec<(&'static str, String, u32, u64)>,
}

/// Finishes the restore of `shard` as a restart under the manual clock does.
fn finish(mut shard: Shard) -> Finished {
    shard.set_log_epoch(shard.restored_clock().unwrap_or(0));
    let mut out = Effects::new();
    shard.finish_restore(&mut out);
    shard.check_invariants();
    let image = canonical(image_of(&shard));
    let log = canonical(std::mem::take(&mut out.log));
    let letters = (out.dead_letters.iter())
        .map(|l| (l.to.to_string(), l.id.to_text(), l.origin.msg))
        .collect();
    Finished {
        image,
        log,
        letters,
        delivered: drain((shard, out)),
    }
}

#[test]
fn an_image_taken_while_restoring_finishes_where_the_whole_log_does() {
    let mut checked = 0;
    for seed in 0..64 {
        let mut rng = Rng(seed);
        let mut run = Run::new();
        for step in 0..300 {
            run.step(&mut rng);
            // Logs written by several runs, some starting with a live shard's image.
            if step % 37 == 36 {
                run.restart(&mut rng);
            }
            if step % 50 == 49 {
                let log = decode(&run.log);
                let whole = restoring(&log);
                let image = image_of(&whole);
                let from_image = restoring(std::slice::from_ref(&image));
                assert_eq!(
                    canonical(image_of(&from_image)),
                    canonical(image),
                    "seed {seed} step {step}: an image restores to itself"
                );
                assert_eq!(
                    finish(from_image),
                    finish(whole),
                    "seed {seed} step {step}: the image finishes where the log does"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 64 * 6);
}

#[test]
fn a_follower_that_snapshots_mid_stream_and_goes_on_ends_where_the_whole_log_does() {
    let mut snapshots = 0;
    for seed in 0..64 {
        let mut rng = Rng(1_000 + seed);
        let mut run = Run::new();
        for step in 0..300 {
            run.step(&mut rng);
            if step % 71 == 70 {
                run.restart(&mut rng);
            }
        }
        let log = decode(&run.log);
        let expected = finish(restoring(&log));
        // Each follower applies the log batch by batch, and now and then starts again
        // from an image of itself, as one that installs its own snapshot would.
        for _ in 0..3 {
            let mut follower = restoring(&[]);
            for batch in &log {
                if rng.below(8) == 0 {
                    follower = restoring(&[image_of(&follower)]);
                    snapshots += 1;
                }
                for change in batch {
                    follower.restore(change.clone()).expect("fits");
                }
            }
            assert_eq!(finish(follower), expected, "seed {seed}");
        }
    }
    assert!(snapshots > 64 * 3 * 5, "{snapshots} snapshots");
}

/// A shard under a real clock, and the batches of changes it logs, each starting with
/// the log time it was made at (as the runtime writes them).
struct Logged {
    shard: Shard,
    queue: QueueKey,
    log: Vec<Bytes>,
}

impl Logged {
    fn new() -> Logged {
        let mut shard = Shard::new(0, Duration::from_millis(1)).for_real_time();
        let mut out = Effects::new();
        let declare = Command::Declare {
            name: "q".into(),
            config: Box::new(config(None)),
        };
        shard.handle(0, declare, &mut out);
        let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
            panic!("declare failed");
        };
        let mut logged = Logged {
            shard,
            queue,
            log: Vec::new(),
        };
        logged.capture(&mut out);
        logged
    }

    fn call(&mut self, now: Tick, cmd: Command) -> Option<Reply> {
        let mut out = Effects::new();
        self.shard.handle(now, cmd, &mut out);
        self.capture(&mut out);
        out.reply
    }

    fn put(&mut self, now: Tick, id: &str) -> Option<Reply> {
        let message = Message::new("x").with_id(id);
        let queue = self.queue;
        self.call(now, Command::Put { queue, message })
    }

    fn capture(&mut self, out: &mut Effects) {
        if out.log.is_empty() {
            return;
        }
        let mut buf = Vec::new();
        begin_batch(&mut buf);
        let now = self.shard.log_time(self.shard.now());
        Change::Clock { now }.encode(&mut buf);
        for change in out.log.drain(..) {
            change.encode(&mut buf);
        }
        self.log.push(buf.into());
    }
}

/// Whether a put of `id` into the restored shard, at once, is a duplicate.
fn put_after_restore(batches: &[Vec<Change>], id: &str) -> Option<Reply> {
    let mut shard = Shard::new(0, Duration::from_millis(1)).for_real_time();
    for change in batches.iter().flatten() {
        shard.restore(change.clone()).expect("fits");
    }
    shard.set_log_epoch(shard.restored_clock().expect("a clock"));
    let mut out = Effects::new();
    shard.finish_restore(&mut out);
    let queue = shard.lookup("q").expect("restored");
    let message = Message::new("again").with_id(id);
    shard.handle(0, Command::Put { queue, message }, &mut out);
    out.reply
}

/// A dedup window that ended by the last log time a restore saw has ended, as it had for
/// the shard that logged it: the id is not a duplicate after the restore, restored from
/// the log or from an image of the restoring shard, which leaves the window out.
#[test]
fn a_dedup_window_that_ended_by_the_logs_clock_is_over_after_the_restore() {
    let duplicate = Some(Reply::Put(Ok(PutOutcome::Duplicate)));
    let enqueued = Some(Reply::Put(Ok(PutOutcome::Enqueued)));
    let mut logged = Logged::new();
    // Windows of 50 ms, one more tick under a real clock: "x" until 51 ms, "z" until 81.
    for (at, id) in [(0, "x"), (30, "z")] {
        assert_eq!(logged.put(at, id), enqueued, "{id}");
        let queue = logged.queue;
        let purged = logged.call(at, Command::Purge { queue });
        assert_eq!(
            purged,
            Some(Reply::Purged(Ok(1))),
            "{id} gone, its window open"
        );
    }
    // The last batch is made at 51 ms, when the window of "x" ends.
    assert_eq!(logged.put(51, "y"), enqueued);
    let log = decode(&logged.log);
    // What the shard that logged it answers then.
    assert_eq!(logged.put(51, "z"), duplicate);
    assert_eq!(logged.put(51, "x"), enqueued);

    let image = image_of(&restoring(&log));
    let windowed: Vec<&str> = (image.iter())
        .filter_map(|change| match change {
            Change::Windowed { id, .. } => Some(&**id),
            _ => None,
        })
        .collect();
    assert_eq!(windowed, ["z"], "the window of x has ended");
    for (what, batches) in [("log", log), ("image", vec![image])] {
        assert_eq!(put_after_restore(&batches, "z"), duplicate, "{what}");
        assert_eq!(put_after_restore(&batches, "x"), enqueued, "{what}");
    }
}

/// A shard that was live and then restores more queues lists both in its image: the
/// live queue's delays and windows from its timers, the restored queue's from the
/// restore.
#[test]
fn an_image_lists_live_queues_and_the_restore_under_way() {
    let mut logged = Logged::new();
    let queue = logged.queue;
    logged.put(0, "gone");
    logged.call(0, Command::Purge { queue });
    let later = Message::new("later")
        .with_id("later")
        .with_delay(Duration::from_millis(40));
    logged.call(
        0,
        Command::Put {
            queue,
            message: later,
        },
    );
    let mut shard = logged.shard;
    let at = |ms: u64| ms * 1_000_000;
    let restored = [
        Change::Clock { now: at(5) },
        Change::Declared {
            queue: 9,
            name: "restored".into(),
            config: Box::new(config(None)),
        },
        Change::Enqueued {
            queue: 9,
            seq: 100,
            id: MsgId::Given("held".into()),
            body: Bytes::from_static(b"held"),
            attempt: 0,
            priority: 0,
            ready_at: Some(at(30)),
            dedup_until: Some(at(55)),
            death: None,
        },
        Change::Windowed {
            queue: 9,
            id: "acked".into(),
            until: at(20),
        },
    ];
    for change in restored {
        shard.restore(change).expect("fits");
    }
    let mut image = canonical(image_of(&shard));
    image.retain(|change| matches!(change, Change::Enqueued { .. } | Change::Windowed { .. }));
    let listed: Vec<(String, Option<u64>, Option<u64>)> = (image.iter())
        .map(|change| match change {
            Change::Enqueued {
                id,
                ready_at,
                dedup_until,
                ..
            } => (id.to_text(), *ready_at, *dedup_until),
            Change::Windowed { id, until, .. } => (id.to_string(), None, Some(*until)),
            _ => unreachable!("kept above"),
        })
        .collect();
    let expected = [
        ("later", Some(at(41)), Some(at(51))),
        ("held", Some(at(30)), Some(at(55))),
        ("gone", None, Some(at(51))),
        ("acked", None, Some(at(20))),
    ]
    .map(|(id, ready_at, until)| (id.to_string(), ready_at, until));
    assert_eq!(listed, expected);
}
