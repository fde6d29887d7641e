//! The log of durable queues (contract §7): a shard driven by random operations is
//! restarted, again and again, from its logged changes and from snapshot images, and what
//! comes back is checked against a ledger the test keeps from the answers and deliveries
//! it saw: every message that was put and not settled away is there, each with the attempt
//! its last delivery had (one more when next delivered), tags go on above every tag handed
//! out, and a snapshot restores exactly what the whole log does. The restarted shard then
//! carries on, so that logs written by several runs, and logs cut short by a snapshot,
//! are restored too. `image` checks the images a shard takes in the middle of a restore.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use leasemq_engine::durable::{begin_batch, decode_batch, Change};
use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, DeliveryTag, Effects, Message, PutOutcome, QueueConfig,
    QueueKey, Reply, RetryPolicy, Settle, Shard, Tick,
};

#[path = "durable/image.rs"]
mod image;

const WEEK_TICKS: Tick = 8 * 24 * 3600 * 1000;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Where the test believes a message is, and its attempt so far.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    queue: &'static str,
    attempt: u32,
}

struct Run {
    shard: Shard,
    out: Effects,
    now: Tick,
    /// Encoded batches of changes, one per engine call that made any.
    log: Vec<Bytes>,
    ledger: HashMap<String, Entry>,
    /// Live leases as far as the test knows: tag → (queue, id, consumer).
    leases: BTreeMap<(&'static str, u64), (String, ConsumerKey)>,
    consumers: Vec<(ConsumerKey, &'static str)>,
    max_tag: HashMap<&'static str, u64>,
    next_id: u64,
    restarts: u32,
    /// Check a restart between each dead letter and its arrival.
    verify_letters: bool,
}

fn config(dead_letter: Option<&str>) -> QueueConfig {
    QueueConfig {
        ack_timeout: Duration::from_millis(20),
        retry: RetryPolicy {
            initial: Duration::from_millis(3),
            multiplier: 2.0,
            max: Duration::from_millis(30),
            jitter: 0.0,
        },
        max_deliveries: dead_letter.map(|_| 3),
        dead_letter: dead_letter.map(String::from),
        dedup_window: Duration::from_millis(50),
        durable: true,
        ..QueueConfig::default()
    }
}

impl Run {
    fn new() -> Run {
        let mut run = Run {
            shard: Shard::new(0, Duration::from_millis(1)),
            out: Effects::new(),
            now: 0,
            log: Vec::new(),
            ledger: HashMap::new(),
            leases: BTreeMap::new(),
            consumers: Vec::new(),
            max_tag: HashMap::new(),
            next_id: 0,
            restarts: 0,
            verify_letters: false,
        };
        run.declare_both();
        run
    }

    fn declare_both(&mut self) {
        for (name, dl) in [("dlq", None), ("q", Some("dlq"))] {
            let cmd = Command::Declare {
                name: name.into(),
                config: Box::new(config(dl)),
            };
            assert!(matches!(self.call(cmd), Some(Reply::Declared(Ok(_)))));
        }
    }

    fn key(&self, name: &str) -> QueueKey {
        self.shard.lookup(name).expect("declared")
    }

    /// One engine call, then the dead letters it caused routed as the runtime does, with
    /// the ledger following every delivery and dead letter.
    fn call(&mut self, cmd: Command) -> Option<Reply> {
        self.shard.handle(self.now, cmd, &mut self.out);
        let reply = self.out.reply.take();
        self.settle_effects();
        reply
    }

    fn settle_effects(&mut self) {
        self.capture_log();
        self.note_deliveries();
        while !self.out.dead_letters.is_empty() {
            let letters = std::mem::take(&mut self.out.dead_letters);
            // A crash before the dead-letter queue took them keeps them where they were.
            if self.verify_letters {
                self.verify();
            }
            for letter in &letters {
                let id = letter.id.to_text();
                let entry = self
                    .ledger
                    .get_mut(&id)
                    .expect("a dead letter the ledger holds");
                assert_eq!(entry.queue, "q", "only q has a dead-letter queue");
                // Accepted: the ids are unique, dlq has no length limit.
                *entry = Entry {
                    queue: "dlq",
                    attempt: 0,
                };
            }
            self.shard
                .handle(self.now, Command::DeadLetters { letters }, &mut self.out);
            let outcomes = std::mem::take(&mut self.out.outcomes);
            assert!(outcomes.iter().all(|o| o.accepted));
            self.capture_log();
            self.note_deliveries();
            self.shard
                .handle(self.now, Command::Outcomes { outcomes }, &mut self.out);
            self.capture_log();
            self.note_deliveries();
        }
        for gone in self.out.consumers_gone.drain(..) {
            self.consumers.retain(|(k, _)| *k != gone);
        }
    }

    fn capture_log(&mut self) {
        if self.out.log.is_empty() {
            return;
        }
        let mut buf = Vec::new();
        begin_batch(&mut buf);
        Change::Clock {
            now: self.shard.log_time(self.now),
        }
        .encode(&mut buf);
        for change in self.out.log.drain(..) {
            change.encode(&mut buf);
        }
        self.log.push(buf.into());
    }

    fn note_deliveries(&mut self) {
        for (consumer, d) in self.out.deliveries.drain(..) {
            let queue = self
                .consumers
                .iter()
                .find(|(k, _)| *k == consumer)
                .map(|(_, q)| *q)
                .expect("a delivery to a known consumer");
            let id = d.id.to_text();
            let entry = self
                .ledger
                .get_mut(&id)
                .expect("a delivered message is held");
            assert_eq!(entry.queue, queue);
            assert_eq!(d.attempt, entry.attempt + 1, "attempt of {id}");
            entry.attempt = d.attempt;
            let max = self.max_tag.entry(queue).or_default();
            assert!(d.tag.0 > *max, "tags grow");
            *max = d.tag.0;
            self.leases.insert((queue, d.tag.0), (id, consumer));
        }
    }

    fn step(&mut self, rng: &mut Rng) {
        match rng.below(12) {
            0..=2 => {
                self.next_id += 1;
                let id = format!("m{}", self.next_id);
                let mut message = Message::new(format!("body of {id}")).with_id(id.clone());
                if rng.below(3) == 0 {
                    message = message.with_delay(Duration::from_millis(rng.below(40)));
                }
                let queue = self.key("q");
                // Ledger first: the put's own deliveries are checked against it.
                self.ledger.insert(
                    id,
                    Entry {
                        queue: "q",
                        attempt: 0,
                    },
                );
                let reply = self.call(Command::Put { queue, message });
                assert_eq!(reply, Some(Reply::Put(Ok(PutOutcome::Enqueued))));
            }
            3 => {
                if self.consumers.len() < 3 {
                    let name: &'static str = if rng.below(2) == 0 { "q" } else { "dlq" };
                    let queue = self.key(name);
                    let prefetch = 1 + rng.below(4) as u32;
                    self.consume(queue, name, prefetch);
                }
            }
            4..=7 => self.settle(rng),
            8 => {
                if let Some(&(key, queue)) = self.pick_consumer(rng) {
                    let upto = self.max_tag.get(queue).copied().unwrap_or(0);
                    let tag = upto.saturating_sub(rng.below(3));
                    let acked: Vec<(&'static str, u64)> = self
                        .leases
                        .iter()
                        .filter(|((q, t), (_, c))| {
                            *q == queue
                                && *t <= tag
                                && *c == key
                                && self.shard.holds(key, DeliveryTag(*t))
                        })
                        .map(|(k, _)| *k)
                        .collect();
                    let reply = self.call(Command::AckUpTo {
                        consumer: key,
                        tag: DeliveryTag(tag),
                    });
                    assert_eq!(reply, Some(Reply::Count(acked.len())));
                    for k in acked {
                        let (id, _) = self.leases.remove(&k).unwrap();
                        self.ledger.remove(&id);
                    }
                }
            }
            9 => {
                if let Some(&(key, queue)) = self.pick_consumer(rng) {
                    // The newest live leases count as unread: released, attempt given back.
                    let mut unread: Vec<DeliveryTag> = self
                        .leases
                        .iter()
                        .filter(|((q, t), (_, c))| {
                            *q == queue && *c == key && self.shard.holds(key, DeliveryTag(*t))
                        })
                        .map(|((_, t), _)| DeliveryTag(*t))
                        .collect();
                    let keep = rng.below(unread.len() as u64 + 1) as usize;
                    unread.drain(..keep);
                    for tag in &unread {
                        let (id, _) = &self.leases[&(queue, tag.0)];
                        self.ledger.get_mut(id).unwrap().attempt -= 1;
                    }
                    self.call(Command::Cancel {
                        consumer: key,
                        unread,
                    });
                }
            }
            _ => {
                self.now += 1 + rng.below(30);
                self.shard.handle_timeout(self.now, &mut self.out);
                self.settle_effects();
            }
        }
    }

    fn consume(&mut self, queue: QueueKey, name: &'static str, prefetch: u32) -> ConsumerKey {
        let cmd = Command::Consume {
            queue,
            name: format!("c{}", self.next_id),
            config: ConsumerConfig { prefetch },
            priority: 0,
            ack_timeout: None,
        };
        self.next_id += 1;
        // Known before the call: the consume's own deliveries go to it.
        self.shard.handle(self.now, cmd, &mut self.out);
        let Some(Reply::Consumed(Ok(key))) = self.out.reply.take() else {
            panic!("consume failed");
        };
        self.consumers.push((key, name));
        self.settle_effects();
        key
    }

    fn pick_consumer(&self, rng: &mut Rng) -> Option<&(ConsumerKey, &'static str)> {
        if self.consumers.is_empty() {
            return None;
        }
        self.consumers
            .get(rng.below(self.consumers.len() as u64) as usize)
    }

    fn settle(&mut self, rng: &mut Rng) {
        let live: Vec<(&'static str, u64)> = self
            .leases
            .iter()
            .filter(|(&(_, t), (_, c))| self.shard.holds(*c, DeliveryTag(t)))
            .map(|(k, _)| *k)
            .collect();
        if live.is_empty() {
            return;
        }
        let (queue, tag) = live[rng.below(live.len() as u64) as usize];
        let op = match rng.below(6) {
            0 | 1 => Settle::Ack,
            2 => Settle::Nack,
            3 => Settle::NackWithDelay(Duration::from_millis(rng.below(20))),
            4 => Settle::Reject,
            _ => Settle::Release,
        };
        let id = self.leases[&(queue, tag)].0.clone();
        if let Settle::Release = op {
            self.ledger.get_mut(&id).unwrap().attempt -= 1;
        }
        // A reject in q is a dead letter the routing moves; one in dlq is dropped.
        let dropped = matches!(op, Settle::Ack) || (matches!(op, Settle::Reject) && queue == "dlq");
        let cmd = Command::Settle {
            queue: self.key(queue),
            tag: DeliveryTag(tag),
            op,
        };
        assert_eq!(self.call(cmd), Some(Reply::Settled(true)));
        self.leases.remove(&(queue, tag));
        if dropped {
            self.ledger.remove(&id);
        }
    }

    /// A shard restored from `batches`, its clock resumed where the log left off, with
    /// what the restore left to route: the messages leased at the crash after their last
    /// allowed delivery, dead-lettered.
    fn restore(batches: &[Bytes]) -> (Shard, Effects) {
        let mut shard = Shard::new(0, Duration::from_millis(1));
        for batch in batches {
            decode_batch(batch.clone(), |change| shard.restore(change))
                .expect("decodes")
                .expect("fits");
        }
        shard.set_log_epoch(shard.restored_clock().unwrap_or(0));
        let mut out = Effects::new();
        shard.finish_restore(&mut out);
        shard.check_invariants();
        (shard, out)
    }

    fn image(&self) -> Bytes {
        let mut buf = Vec::new();
        begin_batch(&mut buf);
        self.shard.image(|change| change.encode(&mut buf));
        buf.into()
    }

    /// Restarts: checks a restore from the log and one from an image against the ledger,
    /// then carries on with a restored shard (sometimes with the log cut to the image).
    fn restart(&mut self, rng: &mut Rng) {
        let image = self.verify();
        if rng.below(2) == 0 {
            self.log = vec![image];
        }
        let (shard, out) = Run::restore(&self.log);
        self.shard = shard;
        self.out = out;
        self.now = 0;
        self.leases.clear();
        self.consumers.clear();
        self.settle_effects();
        self.restarts += 1;
    }

    /// Checks what a restart now would bring back; returns the image it checked.
    fn verify(&self) -> Bytes {
        let image = self.image();
        let from_log = drain(Run::restore(&self.log));
        let from_image = drain(Run::restore(std::slice::from_ref(&image)));
        // The order may differ: the log's clock stops at its last change, an image's at
        // the shard's time, so a delay that ended in between is over in one of them only.
        let sorted = |drained: &[(&'static str, String, u32, u64)]| {
            let mut v: Vec<_> = drained
                .iter()
                .map(|(q, id, a, _)| (*q, id.clone(), *a))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            sorted(&from_log),
            sorted(&from_image),
            "an image restores what the log does"
        );
        let mut expected: BTreeMap<(&'static str, String), u32> = BTreeMap::new();
        for (id, entry) in &self.ledger {
            // Leased after its third delivery: dead-lettered by the restart.
            if entry.queue == "q" && entry.attempt >= 3 {
                expected.insert(("dlq", id.clone()), 1);
            } else {
                expected.insert((entry.queue, id.clone()), entry.attempt + 1);
            }
        }
        let got: BTreeMap<(&'static str, String), u32> = from_log
            .iter()
            .map(|(q, id, attempt, _)| ((*q, id.clone()), *attempt))
            .collect();
        assert_eq!(got, expected, "every message kept, attempts one more");
        for (queue, _, _, tag) in &from_log {
            assert!(
                *tag > self.max_tag.get(queue).copied().unwrap_or(0),
                "tags after a restart are fresh"
            );
        }
        image
    }
}

/// Everything a restored shard delivers once every delay has passed: (queue, id, attempt,
/// tag), in delivery order per queue.
fn drain((mut shard, mut out): (Shard, Effects)) -> Vec<(&'static str, String, u32, u64)> {
    let letters = std::mem::take(&mut out.dead_letters);
    shard.handle(0, Command::DeadLetters { letters }, &mut out);
    let outcomes = std::mem::take(&mut out.outcomes);
    shard.handle(0, Command::Outcomes { outcomes }, &mut out);
    shard.handle_timeout(WEEK_TICKS, &mut out);
    let mut got = Vec::new();
    for queue in ["q", "dlq"] {
        let key = shard.lookup(queue).expect("a durable queue is back");
        let stats = shard.stats(key).unwrap();
        assert_eq!(stats.leased, 0, "leases do not survive");
        let cmd = Command::Consume {
            queue: key,
            name: "drain".into(),
            config: ConsumerConfig { prefetch: 65_535 },
            priority: 0,
            ack_timeout: None,
        };
        shard.handle(WEEK_TICKS, cmd, &mut out);
        for (_, d) in out.deliveries.drain(..) {
            got.push((queue, d.id.to_text(), d.attempt, d.tag.0));
        }
    }
    got
}

#[test]
fn restarts_from_the_log_or_an_image_keep_every_message_attempt_and_tag() {
    let mut restarts = 0;
    for seed in 0..40 {
        let mut rng = Rng(seed);
        let mut run = Run::new();
        run.verify_letters = seed % 4 == 0;
        for step in 0..400 {
            run.step(&mut rng);
            run.shard.check_invariants();
            if step % 37 == 36 {
                run.restart(&mut rng);
            }
        }
        run.restart(&mut rng);
        restarts += run.restarts;
    }
    assert!(restarts >= 40 * 10);
}

/// Contract §7 items 2–4 in one run: a delayed message stays delayed until the same log
/// time, the leased one comes back first with its next attempt, an acked id is a duplicate
/// until its window ends at the same log time, and the manual clock resumes at the last
/// time the log recorded.
#[test]
fn delays_windows_and_the_order_of_returned_messages_survive() {
    let mut run = Run::new();
    let q = run.key("q");
    let put = |run: &mut Run, id: &str, delay: u64| {
        run.ledger.insert(
            id.into(),
            Entry {
                queue: "q",
                attempt: 0,
            },
        );
        let message = Message::new("x")
            .with_id(id)
            .with_delay(Duration::from_millis(delay));
        let reply = run.call(Command::Put { queue: q, message });
        assert_eq!(reply, Some(Reply::Put(Ok(PutOutcome::Enqueued))));
    };
    // "gone": put at 0 ms (window to 50 ms), delivered, acked at 10 ms.
    put(&mut run, "gone", 0);
    let first = run.consume(q, "q", 1);
    run.now = 10;
    let tag = DeliveryTag(run.leases.keys().next().unwrap().1);
    let reply = run.call(Command::Settle {
        queue: q,
        tag,
        op: Settle::Ack,
    });
    assert_eq!(reply, Some(Reply::Settled(true)));
    run.call(Command::Cancel {
        consumer: first,
        unread: Vec::new(),
    });
    put(&mut run, "a", 0);
    put(&mut run, "b", 0);
    put(&mut run, "late", 100); // ready at 110 ms
    run.consume(q, "q", 1); // leases "a"
    let image = run.image();
    for (what, batches) in [("log", run.log.clone()), ("image", vec![image])] {
        let (mut shard, mut out) = Run::restore(&batches);
        let key = shard.lookup("q").unwrap();
        let put_again = |shard: &mut Shard, out: &mut Effects, at: Tick| {
            let message = Message::new("again").with_id("gone");
            shard.handle(
                at,
                Command::Put {
                    queue: key,
                    message,
                },
                out,
            );
            out.reply.take()
        };
        // Tick 0 is log time 10 ms, the last the shard saw: the window of "gone" ends at
        // 50 ms, tick 40.
        let base = 10;
        let duplicate = Some(Reply::Put(Ok(PutOutcome::Duplicate)));
        assert_eq!(
            put_again(&mut shard, &mut out, 49 - base),
            duplicate,
            "{what}"
        );
        let stats = shard.stats(key).unwrap();
        assert_eq!(
            (stats.ready, stats.delayed),
            (2, 1),
            "{what}: a b ready, late delayed"
        );
        let cmd = Command::Consume {
            queue: key,
            name: "r".into(),
            config: ConsumerConfig { prefetch: 10 },
            priority: 0,
            ack_timeout: None,
        };
        shard.handle(49 - base, cmd, &mut out);
        let order: Vec<(String, u32)> = out
            .deliveries
            .drain(..)
            .map(|(_, d)| (d.id.to_text(), d.attempt))
            .collect();
        let expected = [("a", 2), ("b", 1)].map(|(i, a)| (i.to_string(), a));
        assert_eq!(
            order, expected,
            "{what}: the leased one first, with its next attempt"
        );
        let enqueued = Some(Reply::Put(Ok(PutOutcome::Enqueued)));
        assert_eq!(
            put_again(&mut shard, &mut out, 50 - base),
            enqueued,
            "{what}: window over"
        );
        out.deliveries.clear();
        shard.handle_timeout(109 - base, &mut out);
        assert!(
            out.deliveries.iter().all(|(_, d)| d.id.to_text() != "late"),
            "{what}"
        );
        shard.handle_timeout(110 - base, &mut out);
        assert!(
            out.deliveries.iter().any(|(_, d)| d.id.to_text() == "late"),
            "{what}"
        );
    }
}

/// An id stays taken while its message is on the way to the dead-letter queue: a put of
/// the same id meanwhile is a duplicate, so a crash cannot bring back two messages of one
/// id, and the log and an image taken meanwhile both restore.
#[test]
fn an_id_stays_taken_while_its_dead_letter_is_on_the_way() {
    let mut run = Run::new();
    let q = run.key("q");
    let put = |run: &mut Run| {
        let message = Message::new("x").with_id("x");
        run.shard
            .handle(run.now, Command::Put { queue: q, message }, &mut run.out);
        run.capture_log();
        run.out.reply.take()
    };
    assert_eq!(put(&mut run), Some(Reply::Put(Ok(PutOutcome::Enqueued))));
    run.ledger.insert(
        "x".into(),
        Entry {
            queue: "q",
            attempt: 0,
        },
    );
    run.consume(q, "q", 1);
    let tag = DeliveryTag(run.leases.keys().next().unwrap().1);
    // The reject, without routing its dead letter yet.
    let cmd = Command::Settle {
        queue: q,
        tag,
        op: Settle::Reject,
    };
    run.shard.handle(run.now, cmd, &mut run.out);
    run.out.reply.take();
    run.capture_log();
    assert_eq!(run.out.dead_letters.len(), 1);
    assert_eq!(put(&mut run), Some(Reply::Put(Ok(PutOutcome::Duplicate))));
    let image = run.image();
    for batches in [run.log.clone(), vec![image.clone()]] {
        let got = drain(Run::restore(&batches));
        let ids: Vec<(&str, &str)> = got.iter().map(|(q, id, ..)| (*q, id.as_str())).collect();
        assert_eq!(ids, [("q", "x")], "back in its queue, once");
    }
    // Back in its queue, the message keeps its id's dedup window: once it is acked, the id
    // is still a duplicate until the window ends, restored from the log or from an image.
    for batches in [run.log.clone(), vec![image]] {
        let (mut shard, mut out) = Run::restore(&batches);
        let q = shard.lookup("q").expect("restored");
        let consume = Command::Consume {
            queue: q,
            name: "c".into(),
            config: ConsumerConfig { prefetch: 1 },
            priority: 0,
            ack_timeout: None,
        };
        shard.handle(1, consume, &mut out);
        let (_, delivered) = out.deliveries.pop().expect("x is delivered");
        let ack = Command::Settle {
            queue: q,
            tag: delivered.tag,
            op: Settle::Ack,
        };
        shard.handle(1, ack, &mut out);
        assert_eq!(out.reply.take(), Some(Reply::Settled(true)));
        let message = Message::new("x").with_id("x");
        shard.handle(2, Command::Put { queue: q, message }, &mut out);
        assert_eq!(
            out.reply.take(),
            Some(Reply::Put(Ok(PutOutcome::Duplicate))),
            "the window survived, restored from {} batches",
            batches.len()
        );
    }
    run.settle_effects();
    let got = drain(Run::restore(&run.log));
    let ids: Vec<(&str, &str)> = got.iter().map(|(q, id, ..)| (*q, id.as_str())).collect();
    assert_eq!(
        ids,
        [("dlq", "x")],
        "taken by the dead-letter queue: gone from its source"
    );
    run.now = 50; // the end of the id's dedup window, from its put at 0
    assert_eq!(
        put(&mut run),
        Some(Reply::Put(Ok(PutOutcome::Enqueued))),
        "free again"
    );
}

#[test]
fn a_log_whose_queue_config_or_tag_no_declare_could_make_is_refused_not_applied() {
    // What a damaged log, or one from a build with other limits, could hold: each is a
    // restore error (the broker refuses to start), never a shard that overflows later.
    let declared = |name: &str, config: QueueConfig| Change::Declared {
        queue: 1,
        name: name.into(),
        config: Box::new(config),
    };
    let endless = QueueConfig {
        ack_timeout: Duration::MAX,
        durable: true,
        ..QueueConfig::default()
    };
    let wild_jitter = QueueConfig {
        retry: RetryPolicy {
            jitter: f64::NAN,
            ..RetryPolicy::default()
        },
        durable: true,
        ..QueueConfig::default()
    };
    let fine = QueueConfig {
        durable: true,
        ..QueueConfig::default()
    };
    let bad_declares = [
        declared("jobs", endless),
        declared("jobs", wild_jitter),
        declared("", fine.clone()),
    ];
    for change in bad_declares {
        let mut shard = Shard::new(0, Duration::from_millis(1));
        let refused = shard.restore(change).unwrap_err();
        assert!(refused.to_string().contains("declared with"), "{refused}");
    }
    // A delivery tag at the end of the range leaves no next one.
    let mut shard = Shard::new(0, Duration::from_millis(1));
    shard.restore(declared("jobs", fine)).unwrap();
    shard
        .restore(Change::Enqueued {
            queue: 1,
            seq: 1,
            id: leasemq_engine::MsgId::Given("m-1".into()),
            body: Bytes::from_static(b"x"),
            attempt: 0,
            priority: 0,
            ready_at: None,
            dedup_until: None,
            death: None,
        })
        .unwrap();
    let last = Change::Delivered {
        queue: 1,
        seq: 1,
        tag: u64::MAX,
        attempt: 1,
    };
    let refused = shard.restore(last).unwrap_err();
    assert!(refused.to_string().contains("past the last"), "{refused}");
}
