//! Contract §7 after `kill -9`: a child process puts, acks, nacks, releases, touches and
//! rejects (into a dead-letter queue on another shard) on durable queues under the system
//! clock, printing each answer the moment it has it; the parent kills it at a random
//! moment, reopens the data dir, and checks what came back against what the child was
//! told:
//!
//! - every message whose put was answered `Enqueued` and whose ack was not answered `true`
//!   is back (in its queue, or in the dead-letter queue once a reject was answered);
//! - no message whose ack was answered `true` is back;
//! - a message's next delivery has an attempt above every attempt it was delivered with;
//! - every tag handed out after the restart is above every tag handed out before.
//!
//! Each cycle carries on in the same data dir, so recovery of a recovered log is tested
//! too. `LEASEMQ_CRASH_CYCLES=<n>` sets the number of kills (a few by default; the long run
//! is `LEASEMQ_CRASH_CYCLES=1000 cargo test --release --test crash`), and
//! `LEASEMQ_CRASH_SEED=<n>` the seed of the kill times.

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasemq::{Broker, ConsumerConfig, Message, PutOutcome, QueueConfig};

const QUEUES: [&str; 2] = ["crash.a", "crash.b"];
const DLQ: &str = "crash.dead";
const SHARDS: usize = 3;
const DIR_VAR: &str = "LEASEMQ_CRASH_CHILD_DIR";
const CYCLE_VAR: &str = "LEASEMQ_CRASH_CHILD_CYCLE";
/// Lines kept per message to explain a failure.
const HISTORY: usize = 16;

fn config(dead_letter: bool) -> QueueConfig {
    QueueConfig {
        durable: true,
        ack_timeout: Duration::from_millis(150),
        dead_letter: dead_letter.then(|| DLQ.to_string()),
        retry: leasemq::RetryPolicy::immediate(),
        ..QueueConfig::default()
    }
}

/// The log segment size of cycle `cycle`: every other cycle the smallest, so that logs
/// roll and compact more often, and a log written with one size is reopened with the
/// other.
fn segment_bytes(cycle: u64) -> u64 {
    if cycle.is_multiple_of(2) {
        leasemq::MIN_LOG_SEGMENT_BYTES
    } else {
        leasemq::DEFAULT_LOG_SEGMENT_BYTES
    }
}

fn open(dir: &Path, cycle: u64) -> (Broker, Vec<leasemq::Queue>, leasemq::Queue) {
    let broker = Broker::builder()
        .shards(SHARDS)
        .data_dir(dir)
        .log_segment_bytes(segment_bytes(cycle))
        .build()
        .expect("the data dir opens");
    let dlq = broker.declare_queue(DLQ, config(false)).unwrap();
    let queues = QUEUES
        .iter()
        .map(|q| broker.declare_queue(q, config(true)).unwrap())
        .collect();
    (broker, queues, dlq)
}

/// The child: works until it is killed, printing `put <id> <queue>`, `got <queue> <id>
/// <attempt> <tag>`, `ack <id>` and `rej <id>` as the answers come, and `acking <id>`
/// before it sends an ack.
#[test]
#[ignore = "the child process of crash_recovery_keeps_what_was_confirmed"]
fn crash_child() {
    let dir = std::env::var(DIR_VAR).expect("run by the crash test");
    let cycle: u64 = std::env::var(CYCLE_VAR).unwrap().parse().unwrap();
    let (_broker, queues, _dlq) = open(Path::new(&dir), cycle);
    let consumers: Vec<_> = queues
        .iter()
        .map(|q| {
            q.consume("worker", ConsumerConfig { prefetch: 16 })
                .unwrap()
        })
        .collect();
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    let mut rng = fastrand::Rng::with_seed(cycle);
    for round in 0u64.. {
        let which = (round % 2) as usize;
        // Puts only while the queue is short, so that long runs stay checkable.
        let stats = queues[which].stats();
        if stats.ready + stats.delayed + stats.leased > 2_000 {
            drain_some(&consumers, &mut rng, &mut out);
            continue;
        }
        let ids: Vec<String> = (0..4).map(|j| format!("c{cycle}-{round}-{j}")).collect();
        let batch = ids
            .iter()
            .map(|id| Message::new(id.clone()).with_id(id.clone()));
        let outcomes = queues[which].put_batch(batch.collect()).unwrap();
        for (id, outcome) in ids.iter().zip(outcomes) {
            assert_eq!(outcome, PutOutcome::Enqueued);
            writeln!(out, "put {id} {}", QUEUES[which]).unwrap();
        }
        out.flush().unwrap();
        drain_some(&consumers, &mut rng, &mut out);
    }
}

/// Reads what the child's consumers have and settles each in a random way.
fn drain_some(consumers: &[leasemq::Consumer], rng: &mut fastrand::Rng, out: &mut impl Write) {
    {
        for (q, consumer) in consumers.iter().enumerate() {
            while let Some(d) = consumer.try_recv().unwrap() {
                let id = d.envelope().id.clone();
                let (attempt, tag) = (d.envelope().attempt, d.tag().0);
                writeln!(out, "got {} {id} {attempt} {tag}", QUEUES[q]).unwrap();
                out.flush().unwrap();
                match rng.u32(0..20) {
                    0..=10 => {
                        // Killed between the two lines, the ack may or may not be on disk.
                        writeln!(out, "acking {id}").unwrap();
                        out.flush().unwrap();
                        if d.ack() {
                            writeln!(out, "ack {id}").unwrap();
                        }
                    }
                    11 | 12 => {
                        d.nack();
                    }
                    13 | 14 => {
                        d.release();
                    }
                    15 => {
                        let rejected = d.reject();
                        if rejected {
                            writeln!(out, "rej {id}").unwrap();
                        }
                    }
                    16 => {
                        d.touch();
                    }
                    // Left to expire.
                    _ => {}
                }
                out.flush().unwrap();
            }
        }
    }
}

/// What the parent knows of each message from the child's answers.
#[derive(Default)]
struct Ledger {
    /// Put and not acked: id → (queue it was put in, rejected into the dead-letter queue).
    live: HashMap<String, (String, bool)>,
    acked: HashSet<String>,
    /// Acks sent whose answers the child never printed.
    acking: HashSet<String>,
    /// The highest attempt each message was delivered with in its source queue.
    attempts: HashMap<String, u32>,
    /// The highest tag handed out per queue.
    tags: HashMap<String, u64>,
    /// Messages a check found both in their queue and in the dead-letter queue: dead-
    /// lettered at a crash that fell between the dead-letter queue's enqueue and the
    /// source's removal reaching the disk. Dead-lettering is at least once, as RabbitMQ's
    /// at-least-once dead-lettering is: such a message has a copy in each, and the copy
    /// in the dead-letter queue outlives an ack of the other.
    both: HashSet<String>,
    /// Every line about each message, to show when a check fails.
    history: HashMap<String, Vec<String>>,
}

impl Ledger {
    fn read(&mut self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let id = match words[..] {
            ["got", _, id, ..] => Some(id),
            [_, id, ..] => Some(id),
            _ => None,
        };
        if let Some(id) = id {
            // The latest lines are the ones that explain a failure; long runs keep few.
            let history = self.history.entry(id.into()).or_default();
            if history.len() == HISTORY {
                history.remove(0);
            }
            history.push(line.into());
        }
        match words[..] {
            ["put", id, queue] => {
                self.live.insert(id.into(), (queue.into(), false));
            }
            ["got", queue, id, attempt, tag] => {
                let tag: u64 = tag.parse().unwrap();
                let max = self.tags.entry(queue.into()).or_default();
                *max = (*max).max(tag);
                if queue != DLQ {
                    let attempt: u32 = attempt.parse().unwrap();
                    let max = self.attempts.entry(id.into()).or_default();
                    *max = (*max).max(attempt);
                }
            }
            ["acking", id] => {
                self.acking.insert(id.into());
            }
            ["ack", id] => {
                self.acking.remove(id);
                self.live.remove(id);
                self.acked.insert(id.into());
            }
            ["rej", id] => {
                if let Some(entry) = self.live.get_mut(id) {
                    entry.1 = true;
                }
            }
            ["ready"] | [""] => {}
            _ => panic!("unexpected line from the child: {line:?}"),
        }
    }

    /// Reopens the data dir and checks it against the ledger; then counts what it found as
    /// delivered (the check's own deliveries are leases too).
    fn check(&mut self, dir: &Path, cycle: u64) {
        let (broker, queues, dlq) = open(dir, cycle);
        let mut found: HashMap<String, String> = HashMap::new();
        for q in queues.iter().chain([&dlq]) {
            let c = q
                .consume("checker", ConsumerConfig { prefetch: 65_535 })
                .unwrap();
            while let Some(d) = c.try_recv().unwrap() {
                let (id, attempt, tag) = (d.envelope().id.clone(), d.envelope().attempt, d.tag().0);
                let queue = q.name().to_string();
                let before = self.tags.get(&queue).copied().unwrap_or(0);
                assert!(
                    tag > before,
                    "cycle {cycle}: {queue} tag {tag} after {before}"
                );
                let copy = queue == DLQ && self.both.contains(&id);
                assert!(
                    !self.acked.contains(&id) || copy,
                    "cycle {cycle}: acked {id} came back in {} (attempt {attempt}, tag {tag}): {:?}",
                    q.name(),
                    self.history.get(&id)
                );
                if queue != DLQ {
                    let before = self.attempts.get(&id).copied().unwrap_or(0);
                    assert!(
                        attempt > before,
                        "cycle {cycle}: {id} attempt {attempt} after {before}"
                    );
                }
                self.read(&format!("got {queue} {id} {attempt} {tag}"));
                if let Some(other) = found.insert(id.clone(), queue.clone()) {
                    assert!(other != queue, "cycle {cycle}: {id} twice in {queue}");
                    self.both.insert(id.clone());
                    // The copy in its own queue is the one the ledger follows.
                    found.insert(id, other);
                }
            }
        }
        for (id, (queue, rejected)) in &self.live {
            if self.acking.contains(id) && !found.contains_key(id) {
                continue;
            }
            match found.get(id) {
                Some(q) if q == queue || (*rejected && q == DLQ) => {}
                // A reject whose answer the child never printed may have landed.
                Some(q) if q == DLQ => {}
                other => panic!(
                    "cycle {cycle}: {id} (put in {queue}) is {other:?}: {:?}",
                    self.history.get(id)
                ),
            }
        }
        // An ack whose answer never came either landed (gone) or did not (back).
        for id in std::mem::take(&mut self.acking) {
            if !found.contains_key(&id) {
                self.live.remove(&id);
            }
        }
        // Puts whose answers the child never printed may be back: they count from now on.
        for (id, queue) in found {
            let entry = self
                .live
                .entry(id)
                .or_insert_with(|| (queue.clone(), false));
            if queue == DLQ {
                entry.1 = true;
            }
        }
        broker.shutdown();
    }
}

#[test]
fn crash_recovery_keeps_what_was_confirmed() {
    let cycles: u64 = std::env::var("LEASEMQ_CRASH_CYCLES")
        .map_or(4, |n| n.parse().expect("LEASEMQ_CRASH_CYCLES is a number"));
    let seed: u64 = std::env::var("LEASEMQ_CRASH_SEED").map_or_else(
        |_| fastrand::u64(..),
        |n| n.parse().expect("LEASEMQ_CRASH_SEED is a number"),
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::default();
    let mut lines = 0;
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_VAR, dir.path())
            .env(CYCLE_VAR, cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
            // The kill may cut the last line short: only whole lines count.
            let mut lines: Vec<String> = text.split('\n').map(String::from).collect();
            lines.pop();
            lines
        });
        // The kill lands anywhere from the child's start-up (its recovery) to well into
        // its work.
        std::thread::sleep(Duration::from_millis(rng.u64(20..400)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let output = reader.join().unwrap();
        for line in output
            .iter()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_lowercase()))
        {
            // The test harness's own lines ("running 1 test") are not the child's.
            if line.starts_with("running") || line.starts_with("test ") {
                continue;
            }
            ledger.read(line);
        }
        lines += output.len();
        ledger.check(dir.path(), cycle);
        if (cycle + 1) % 100 == 0 {
            eprintln!(
                "{} kills: {} messages live, {} acked",
                cycle + 1,
                ledger.live.len(),
                ledger.acked.len()
            );
        }
    }
    eprintln!(
        "seed {seed}: {cycles} kills, {lines} lines, {} messages live, {} acked",
        ledger.live.len(),
        ledger.acked.len()
    );
    assert!(lines > 0 || cycles == 0);
}
