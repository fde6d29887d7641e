//! Contract §7 when the disk fails or the machine crashes, on `leasemq_wal::MemDisk`: a
//! fake disk that can fail an fsync, run full, or crash at any instant into an image that
//! keeps what was synced plus a seeded choice of what was not (torn sectors included).
//!
//! - A failed fsync refuses the changes that waited on it and every later change to the
//!   shard's durable queues (never retried); in-memory queues go on.
//! - A full disk fails the put whole with `Storage`, and puts succeed again once there is
//!   room.
//! - A crash at a random instant, while a thread works on durable queues, loses nothing
//!   whose answer said it was done: the image the crash leaves opens, and holds every put
//!   answered `Enqueued` and not acked, no message whose ack was answered `true`, attempts
//!   above every attempt delivered, tags above every tag handed out.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasemq::{Broker, ConsumerConfig, Error, Message, PutOutcome, QueueConfig};
use leasemq_wal::{Crash, MemDisk};

const DIR: &str = "/data";

/// Durable, and a nacked message is ready again at once: the checks read every message
/// without moving the manual clock.
fn durable() -> QueueConfig {
    QueueConfig {
        durable: true,
        retry: leasemq::RetryPolicy::immediate(),
        ..QueueConfig::default()
    }
}

fn open(disk: &MemDisk, shards: usize) -> Result<Broker, Error> {
    Broker::builder()
        .shards(shards)
        .manual_clock()
        .storage(Arc::new(disk.clone()))
        .data_dir(DIR)
        .build()
}

/// A one-shard broker on `disk` with a durable queue `jobs` and an in-memory `scratch`.
fn jobs_and_scratch(disk: &MemDisk) -> (Broker, leasemq::Queue, leasemq::Queue) {
    let broker = open(disk, 1).unwrap();
    let jobs = broker.declare_queue("jobs", durable()).unwrap();
    let scratch = broker
        .declare_queue("scratch", QueueConfig::default())
        .unwrap();
    (broker, jobs, scratch)
}

fn ids_in(broker: &Broker, queue: &str) -> Vec<String> {
    let q = broker.queue(queue).expect("the durable queue is back");
    let c = q
        .consume("check", ConsumerConfig { prefetch: 65_535 })
        .unwrap();
    std::iter::from_fn(|| c.try_recv().unwrap())
        .map(|d| d.envelope().id.clone())
        .collect()
}

#[test]
fn a_failed_fsync_refuses_durable_changes_for_good_and_keeps_what_was_answered() {
    let disk = MemDisk::new();
    let (broker, jobs, scratch) = jobs_and_scratch(&disk);
    for i in 0..3 {
        let put = jobs.put(Message::new("x").with_id(format!("ok{i}")));
        assert_eq!(put, Ok(PutOutcome::Enqueued));
    }
    disk.fail_next_sync();
    match jobs.put(Message::new("x").with_id("failed")) {
        Err(Error::Storage(why)) => assert!(why.contains("fdatasync"), "{why}"),
        other => panic!("expected a storage error, got {other:?}"),
    }
    // Never retried: the shard's durable queues refuse every change from now on.
    assert!(matches!(
        jobs.put(Message::new("x").with_id("after")),
        Err(Error::Storage(_))
    ));
    // In-memory queues on the same shard go on.
    assert_eq!(scratch.put(Message::new("y")), Ok(PutOutcome::Enqueued));
    let c = scratch.consume("c", ConsumerConfig::default()).unwrap();
    assert!(c.try_recv().unwrap().unwrap().ack());

    let image = disk.crash(Crash::LoseUnsynced);
    broker.shutdown();
    let broker = open(&image, 1).unwrap();
    let mut ids = ids_in(&broker, "jobs");
    ids.sort();
    assert_eq!(
        ids,
        ["ok0", "ok1", "ok2"],
        "what was answered, and nothing refused"
    );
    broker.shutdown();
}

#[test]
fn a_full_disk_fails_the_put_with_a_storage_error() {
    let disk = MemDisk::new();
    let broker = open(&disk, 1).unwrap();
    let big = QueueConfig {
        max_body_bytes: 4 << 20,
        ..durable()
    };
    let q = broker.declare_queue("big", big).unwrap();
    // The first segment is there; the disk has room for little more.
    disk.set_capacity(Some(disk_bytes(&disk) + (1 << 20)));
    let mut answered = 0;
    let refused = loop {
        match q.put(Message::new(vec![1u8; 1 << 20])) {
            Ok(_) => answered += 1,
            Err(e) => break e,
        }
        assert!(answered < 100, "the disk never ran full");
    };
    match refused {
        Error::Storage(why) => assert!(why.contains("full") || why.contains("space"), "{why}"),
        other => panic!("expected a storage error, got {other:?}"),
    }
    // Refused whole, and the log goes on: once there is room, puts succeed again.
    disk.set_capacity(None);
    assert_eq!(q.put(Message::new("after")), Ok(PutOutcome::Enqueued));
    let image = disk.crash(Crash::LoseUnsynced);
    broker.shutdown();
    let broker = open(&image, 1).unwrap();
    assert_eq!(
        ids_in(&broker, "big").len(),
        answered + 1,
        "every answered put, no more"
    );
    broker.shutdown();
}

#[test]
fn a_full_copy_on_write_disk_refuses_changes_and_the_write_it_refused_waits_for_room() {
    let disk = MemDisk::new();
    disk.copy_on_write();
    let (broker, jobs, _) = jobs_and_scratch(&disk);
    let put = |id: &str| jobs.put(Message::new("x").with_id(id));
    assert_eq!(put("ok"), Ok(PutOutcome::Enqueued));
    // Full: the next write needs new blocks, even inside the preallocated segment.
    disk.set_capacity(Some(disk.used()));
    let waiting = {
        let jobs = jobs.clone();
        std::thread::spawn(move || jobs.put(Message::new("x").with_id("waited")))
    };
    let started = std::time::Instant::now();
    while !broker.log_lag()[0].waits_for_room {
        assert!(
            started.elapsed().as_secs() < 20,
            "the write never met the full disk"
        );
        std::thread::yield_now();
    }
    // Meanwhile changes are refused whole, and the log is not failed.
    match put("refused") {
        Err(Error::Storage(why)) => assert!(why.contains("room"), "{why}"),
        other => panic!("expected a storage error, got {other:?}"),
    }
    assert!(!broker.log_lag()[0].failed);
    // Room again: the waiting put is answered, and puts are taken.
    disk.set_capacity(None);
    assert_eq!(waiting.join().unwrap(), Ok(PutOutcome::Enqueued));
    assert_eq!(put("after"), Ok(PutOutcome::Enqueued));
    let image = disk.crash(Crash::LoseUnsynced);
    broker.shutdown();
    let broker = open(&image, 1).unwrap();
    let mut ids = ids_in(&broker, "jobs");
    ids.sort();
    assert_eq!(ids, ["after", "ok", "waited"]);
    broker.shutdown();
}

#[test]
fn a_read_error_at_the_start_refuses_it_and_changes_nothing() {
    let disk = MemDisk::new();
    let (broker, jobs, _) = jobs_and_scratch(&disk);
    for i in 0..3 {
        jobs.put(Message::new("x").with_id(format!("ok{i}")))
            .unwrap();
    }
    broker.shutdown();
    let dir = std::path::Path::new(DIR).join("shard-0");
    let segment = (leasemq_wal::Storage::list(&disk, &dir).unwrap().into_iter())
        .find(|name| name.ends_with(".wal"))
        .map(|name| dir.join(name))
        .expect("a segment");
    disk.fail_next_read(&segment);
    match open(&disk, 1) {
        Err(Error::Storage(why)) => assert!(why.contains("read"), "{why}"),
        other => panic!("expected a storage error, got {other:?}"),
    }
    // Nothing was cut or removed: the next start has everything.
    let broker = open(&disk, 1).unwrap();
    let mut ids = ids_in(&broker, "jobs");
    ids.sort();
    assert_eq!(ids, ["ok0", "ok1", "ok2"]);
    broker.shutdown();
}

/// §7 recovery: a record whose frame checks out but that the broker cannot take (one a
/// later build wrote, of a kind this one does not know) refuses the start with `Storage`
/// naming the segment file and the byte the record starts at, not a shard half restored.
/// Being the log's last, it is no torn tail either: it was written whole.
#[test]
fn a_record_that_does_not_decode_refuses_the_start_naming_file_and_offset() {
    let disk = MemDisk::new();
    let (broker, jobs, _) = jobs_and_scratch(&disk);
    jobs.put(Message::new("kept")).unwrap();
    broker.shutdown();
    drop(broker);
    let shard = std::path::Path::new(DIR).join("shard-0");
    let storage: Arc<dyn leasemq_wal::Storage> = Arc::new(disk.clone());
    let from = leasemq_wal::latest_snapshot(&*storage, &shard)
        .unwrap()
        .map_or(1, |s| s.lsn.0 + 1);
    let options = leasemq_wal::Options::default();
    let (mut wal, _) =
        leasemq_wal::Wal::open(storage, &shard, options, leasemq_wal::Lsn(from), |_, _| {
            Ok(())
        })
        .unwrap();
    let garbage = wal.append(&[0xee; 40]).unwrap();
    wal.submit().unwrap();
    wal.sync().unwrap();
    let segment = wal.segments().last().unwrap().clone();
    drop(wal);
    match open(&disk, 1) {
        Err(Error::Storage(why)) => {
            let name = segment.display().to_string();
            assert!(why.contains(&name), "{why}");
            assert!(why.contains(&format!("record {}", garbage.0)), "{why}");
            assert!(why.contains("byte "), "{why}");
        }
        other => panic!("expected a storage error, got {:?}", other.map(|_| ())),
    }
}

fn disk_bytes(disk: &MemDisk) -> u64 {
    let mut total = 0;
    let mut dirs = vec![std::path::PathBuf::from(DIR)];
    while let Some(dir) = dirs.pop() {
        let storage: &dyn leasemq_wal::Storage = disk;
        for name in storage.list(&dir).unwrap_or_default() {
            let path = dir.join(&name);
            match disk.contents(&path) {
                Some(bytes) => total += bytes.len() as u64,
                None => dirs.push(path),
            }
        }
    }
    total
}

/// What the working thread was told, recorded after each answer.
#[derive(Default)]
struct Told {
    /// Put answered `Enqueued` → its queue.
    put: HashMap<String, &'static str>,
    acked: HashSet<String>,
    rejected: HashSet<String>,
    attempts: HashMap<String, u32>,
    tags: HashMap<&'static str, u64>,
}

const QUEUES: [&str; 2] = ["crash.a", "crash.b"];
const DLQ: &str = "crash.dead";

fn declare(broker: &Broker) -> Result<Vec<leasemq::Queue>, Error> {
    broker.declare_queue(DLQ, durable())?;
    let config = QueueConfig {
        dead_letter: Some(DLQ.into()),
        ..durable()
    };
    QUEUES
        .iter()
        .map(|q| broker.declare_queue(q, config.clone()))
        .collect()
}

/// Works until the disk crashes under it: puts, acks, nacks, releases and rejects,
/// recording each answer.
fn work(broker: &Broker, seed: u64, round: u64, told: &Mutex<Told>) -> Result<(), Error> {
    let queues = declare(broker)?;
    let consumers = queues
        .iter()
        .map(|q| q.consume("w", ConsumerConfig { prefetch: 8 }))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rng = fastrand::Rng::with_seed(seed);
    for step in 0u64.. {
        let which = rng.usize(..QUEUES.len());
        let id = format!("r{round}-{step}");
        queues[which].put(Message::new("job").with_id(id.clone()))?;
        told.lock().unwrap().put.insert(id, QUEUES[which]);
        for (q, c) in consumers.iter().enumerate() {
            while let Some(d) = c.try_recv()? {
                let id = d.envelope().id.clone();
                {
                    let mut t = told.lock().unwrap();
                    let a = t.attempts.entry(id.clone()).or_default();
                    *a = (*a).max(d.envelope().attempt);
                    let tag = t.tags.entry(QUEUES[q]).or_default();
                    *tag = (*tag).max(d.tag().0);
                }
                match rng.u32(..10) {
                    0..=5 => {
                        let acked = d.ack();
                        if acked {
                            told.lock().unwrap().acked.insert(id);
                        }
                    }
                    6 => {
                        d.nack();
                    }
                    7 => {
                        d.release();
                    }
                    8 => {
                        let rejected = d.reject();
                        if rejected {
                            told.lock().unwrap().rejected.insert(id);
                        }
                    }
                    _ => {}
                }
            }
        }
        if broker.is_shut_down() {
            return Ok(());
        }
    }
    Ok(())
}

#[test]
fn a_crash_at_any_instant_keeps_every_answered_change() {
    let seed: u64 = std::env::var("LEASEMQ_FAULT_SEED").map_or_else(
        |_| fastrand::u64(..),
        |n| n.parse().expect("LEASEMQ_FAULT_SEED is a number"),
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut disk = MemDisk::new();
    let told = Arc::new(Mutex::new(Told::default()));
    for round in 0..12 {
        let broker = open(&disk, 2).unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}"));
        let worker = {
            let (broker, told) = (broker.clone(), Arc::clone(&told));
            let work_seed = rng.u64(..);
            std::thread::spawn(move || work(&broker, work_seed, round, &told))
        };
        // Picks the crash instant while the worker runs; no state is waited for.
        std::thread::sleep(Duration::from_millis(rng.u64(1..30)));
        let mode = match rng.u8(..3) {
            0 => Crash::KeepUnsynced,
            1 => Crash::LoseUnsynced,
            _ => Crash::Tear { seed: rng.u64(..) },
        };
        let image = disk.crash(mode);
        // The old broker fails on its crashed disk from now on; stop it and its worker.
        broker.shutdown();
        let _ = worker.join().expect("the worker does not panic");
        disk = image;
        check(&disk, &mut told.lock().unwrap(), seed, round);
    }
    let told = told.lock().unwrap();
    eprintln!(
        "seed {seed}: 12 crashes, {} puts, {} acks, {} rejects answered",
        told.put.len(),
        told.acked.len(),
        told.rejected.len()
    );
    assert!(
        told.put.len() > 12,
        "the worker got work done between crashes"
    );
}

/// Opens the crash image and checks it against what the worker was told; the check's own
/// deliveries count as deliveries from then on.
fn check(disk: &MemDisk, told: &mut Told, seed: u64, round: u64) {
    let context = format!("seed {seed} round {round}");
    let broker = open(disk, 2).unwrap_or_else(|e| panic!("{context}: the image opens: {e}"));
    declare(&broker).unwrap();
    let mut found: HashMap<String, Vec<&str>> = HashMap::new();
    for queue in QUEUES.iter().chain([&DLQ]) {
        let q = broker.queue(queue).unwrap();
        let c = q
            .consume("check", ConsumerConfig { prefetch: 65_535 })
            .unwrap();
        while let Some(d) = c.try_recv().unwrap() {
            let id = d.envelope().id.clone();
            let before = told.tags.get(queue).copied().unwrap_or(0);
            assert!(
                d.tag().0 > before,
                "{context}: {queue} tag {} after {before}",
                d.tag().0
            );
            if *queue != DLQ {
                let before = told.attempts.get(&id).copied().unwrap_or(0);
                let attempt = d.envelope().attempt;
                assert!(
                    attempt > before,
                    "{context}: {id} attempt {attempt} after {before}"
                );
            }
            found.entry(id.clone()).or_default().push(queue);
            let a = told.attempts.entry(id).or_default();
            *a = (*a).max(d.envelope().attempt);
            let tag = told.tags.entry(queue).or_default();
            *tag = (*tag).max(d.tag().0);
        }
    }
    for (id, queue) in &told.put {
        let here = found.get(id).map(Vec::as_slice).unwrap_or_default();
        if told.acked.contains(id) {
            // At most a dead-letter copy made across an earlier crash (contract §7).
            assert!(
                here.iter().all(|q| *q == DLQ),
                "{context}: acked {id} is back in {here:?}"
            );
        } else if told.rejected.contains(id) {
            assert!(
                here.contains(&DLQ),
                "{context}: rejected {id} is in {here:?}"
            );
        } else {
            assert!(
                here.contains(queue) || here.contains(&DLQ),
                "{context}: {id} put in {queue} is in {here:?}"
            );
        }
    }
    broker.shutdown();
}

/// A delivery held back until the disk covers it gets its lease from when it is handed
/// over: had it run out meanwhile, the consumer gets the redelivery, never the stale one.
#[test]
fn a_lease_that_ran_out_while_its_delivery_waited_for_the_disk_is_not_handed_over() {
    let disk = MemDisk::new();
    let broker = open(&disk, 1).unwrap();
    let config = QueueConfig {
        ack_timeout: Duration::from_secs(1),
        ..durable()
    };
    let q = broker.declare_queue("slow-disk", config).unwrap();
    let c = q.consume("c", ConsumerConfig { prefetch: 1 }).unwrap();
    disk.hold_syncs();
    let put = {
        let q = q.clone();
        std::thread::spawn(move || q.put(Message::new("x")))
    };
    // The put's record (and its delivery's) is in an fsync the disk holds.
    disk.wait_for_held_sync();
    let advance = {
        let broker = broker.clone();
        std::thread::spawn(move || broker.advance(Duration::from_millis(1500)))
    };
    // The advance is handled (its answer waits for the disk): the lease ran out.
    while q.stats().expired == 0 {
        std::thread::yield_now();
    }
    disk.release_syncs();
    assert_eq!(put.join().unwrap(), Ok(PutOutcome::Enqueued));
    advance.join().unwrap().unwrap();
    let d = c.try_recv().unwrap().expect("the redelivery");
    assert_eq!(
        d.envelope().attempt,
        2,
        "the first lease ran out before it was handed over"
    );
    assert!(d.ack());
    assert!(c.try_recv().unwrap().is_none());
    broker.shutdown();
}

/// A durable queue's close is seen by its other handles only once the close is on disk:
/// while the fsync is held, another handle still sees the queue open, and a crash then
/// brings the queue back. The close was never told done: once the crashed disk fails the
/// fsync, `close` says `false`; the put and the stats asked meanwhile are answered after
/// it, as about a queue the close took away.
#[test]
fn a_durable_close_is_seen_only_once_it_is_on_disk() {
    let disk = MemDisk::new();
    let broker = open(&disk, 1).unwrap();
    let q = broker.declare_queue("closing", durable()).unwrap();
    let c = q.consume("c", ConsumerConfig { prefetch: 1 }).unwrap();
    assert_eq!(q.put(Message::new("kept")).unwrap(), PutOutcome::Enqueued);
    let other = broker.queue("closing").unwrap();
    disk.hold_syncs();
    let closer = std::thread::spawn(move || q.close());
    disk.wait_for_held_sync();
    assert!(!other.is_closed(), "the close is not on disk yet");
    // Its consumer has not heard of it either: what was in its channel is there, and the
    // channel is still open.
    assert!(c.try_recv().unwrap().is_some());
    assert_eq!(c.try_recv(), Ok(None));
    let put = {
        let other = other.clone();
        std::thread::spawn(move || other.put(Message::new("late")))
    };
    let stats = {
        let other = other.clone();
        std::thread::spawn(move || other.stats())
    };
    let image = disk.crash(Crash::LoseUnsynced);
    disk.release_syncs();
    assert!(!closer.join().unwrap(), "the close never reached the disk");
    assert_eq!(c.try_recv(), Err(Error::Closed));
    assert_eq!(put.join().unwrap(), Err(Error::QueueClosed));
    // Its counters are not lost: those the queue had when it closed.
    assert_eq!(stats.join().unwrap().enqueued, 1);
    broker.shutdown();
    let reopened = open(&image, 1).unwrap();
    assert_eq!(
        ids_in(&reopened, "closing").len(),
        1,
        "the message put before the close"
    );
    reopened.shutdown();
}

/// Once its fsync is done, the close is seen through every handle, and a crash keeps it.
#[test]
fn a_durable_close_on_disk_is_seen_everywhere_and_kept() {
    let disk = MemDisk::new();
    let broker = open(&disk, 1).unwrap();
    let q = broker.declare_queue("closed", durable()).unwrap();
    q.put(Message::new("gone")).unwrap();
    let other = broker.queue("closed").unwrap();
    assert!(q.close());
    assert!(other.is_closed());
    assert_eq!(other.put(Message::new("late")), Err(Error::QueueClosed));
    let image = disk.crash(Crash::LoseUnsynced);
    broker.shutdown();
    let reopened = open(&image, 1).unwrap();
    assert!(reopened.queue("closed").is_none());
    reopened.shutdown();
}

/// A close whose record cannot reach the disk did not happen: `close` says `false`, and a
/// restart has the queue with its messages.
#[test]
fn a_close_the_disk_refuses_is_not_a_close() {
    let disk = MemDisk::new();
    let broker = open(&disk, 1).unwrap();
    let q = broker.declare_queue("stays", durable()).unwrap();
    assert_eq!(q.put(Message::new("kept")).unwrap(), PutOutcome::Enqueued);
    disk.fail_next_sync();
    assert!(!q.close(), "the fsync of the close failed");
    // The log has failed for good: a second close is refused before it is applied.
    let again = broker.queue("stays");
    assert!(again.is_none_or(|q| !q.close()));
    let image = disk.crash(Crash::LoseUnsynced);
    broker.shutdown();
    let broker = open(&image, 1).unwrap();
    assert_eq!(ids_in(&broker, "stays").len(), 1);
    broker.shutdown();
}

/// A put answered `Duplicate` on a durable queue is answered only once the message it
/// duplicates is on disk: until then a crash could lose the original, and the publisher
/// told "already there" would have lost its message.
#[test]
fn a_duplicate_of_a_put_not_yet_on_disk_is_answered_after_it() {
    let disk = MemDisk::new();
    let (broker, jobs, scratch) = jobs_and_scratch(&disk);
    disk.hold_syncs();
    let mut first = jobs.begin_put_batch(vec![Message::new("x").with_id("a")]);
    // The put's record is in an fsync the disk holds.
    disk.wait_for_held_sync();
    let mut again = jobs.begin_put_batch(vec![Message::new("y").with_id("a")]);
    // A call to the same shard is answered after the duplicate was handled.
    assert_eq!(scratch.stats().enqueued, 0);
    let waited = (first.try_answer().is_none(), again.try_answer().is_none());
    // Released before the checks, so that a failing one does not leave the syncer held.
    disk.release_syncs();
    assert_eq!(
        waited,
        (true, true),
        "the original and its duplicate wait for the original's fsync"
    );
    // A put behind both, on the same queue, is answered after them.
    assert_eq!(jobs.put(Message::new("z")), Ok(PutOutcome::Enqueued));
    assert_eq!(first.try_answer(), Some(Ok(vec![PutOutcome::Enqueued])));
    assert_eq!(again.try_answer(), Some(Ok(vec![PutOutcome::Duplicate])));
    broker.shutdown();
}

/// The same when what it duplicates came from a timer on the running clock: a lease that
/// ran out past the delivery limit dead-letters its message on the same shard, a change
/// that logs but answers no one, so nothing is held when the duplicate comes. (Under the
/// manual clock the advance that ran the timer is held, and the duplicate waits behind
/// it anyway.) The test waits for the disk's fsync gate, not for the clock.
#[test]
fn a_duplicate_of_a_dead_letter_not_yet_on_disk_is_answered_after_it() {
    let disk = MemDisk::new();
    let broker = Broker::builder()
        .shards(1)
        .storage(Arc::new(disk.clone()))
        .data_dir(DIR)
        .build()
        .unwrap();
    let dead = broker.declare_queue("dead", durable()).unwrap();
    let config = QueueConfig {
        ack_timeout: Duration::from_secs(1),
        max_deliveries: Some(1),
        dead_letter: Some("dead".into()),
        ..durable()
    };
    let jobs = broker.declare_queue("jobs", config).unwrap();
    let c = jobs.consume("c", ConsumerConfig { prefetch: 1 }).unwrap();
    assert_eq!(
        jobs.put(Message::new("x").with_id("a")),
        Ok(PutOutcome::Enqueued)
    );
    assert!(c.try_recv().unwrap().is_some());
    disk.hold_syncs();
    // The lease runs out: the message moves to `dead`, in an fsync the disk holds.
    disk.wait_for_held_sync();
    assert_eq!(dead.stats().ready, 1);
    let mut again = dead.begin_put_batch(vec![Message::new("y").with_id("a")]);
    // A call to the same shard is answered after the duplicate was handled.
    assert_eq!(dead.stats().duplicates, 1);
    let waited = again.try_answer().is_none();
    disk.release_syncs();
    assert!(waited, "the duplicate waits for the dead letter's fsync");
    assert_eq!(dead.put(Message::new("z")), Ok(PutOutcome::Enqueued));
    assert_eq!(again.try_answer(), Some(Ok(vec![PutOutcome::Duplicate])));
    broker.shutdown();
}
