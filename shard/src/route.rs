//! Where the cross-shard effects of an engine call go: the routing a shard thread does,
//! free of threads and channels, so that the simulator (`leasemq-sim`) runs this very code
//! and a bug here cannot hide from it.
//!
//! An engine call may leave two kinds of effect for other shards:
//!
//! - **dead letters**, each for the queue it names, owned by the shard [`shard_for`] picks;
//! - **outcomes**, what a dead-letter queue did with a letter, each for the shard the
//!   letter came from (which counts it in its queue's stats).
//!
//! Those for this shard are handed to its engine at once; the rest are grouped by shard, one
//! [`Hop`] per shard. A caller whose command caused dead letters is answered only once they
//! have landed: its held-back answer (`deferred`) rides with the last dead-letter hop, is
//! carried back by the outcomes hop, and is given by the shard it started from. When
//! nothing travels, the answer is given at once. Before an outcomes hop leaves, the
//! deliveries made here are flushed: the outcome may release a caller on the other shard,
//! whose call must return only once the deliveries its dead letters caused are in their
//! channels.
//!
//! A message for a full inbox waits in a [`Backlog`], in order: the shard thread never
//! blocks on another one.
//!
//! The driver — the shard thread, or the simulator — supplies the engine calls and the
//! sends through [`Driver`].

use std::collections::VecDeque;

use leasemq_engine::{Command, DeadLetter, DeathOutcome, Effects, Tick};

use crate::router::shard_for;

/// What routing needs from the thread (or simulation) that owns one shard's engine.
pub trait Driver {
    /// A caller's answer held back until the dead letters its command caused have landed.
    type Deferred;

    /// The index of this shard and the number of shards.
    fn place(&self) -> (usize, usize);

    /// The effects of the engine calls not yet routed; routing drains their dead letters
    /// and outcomes, and leaves the deliveries for [`Driver::flush_deliveries`].
    fn effects(&mut self) -> &mut Effects;

    /// Hands `cmd` to this shard's engine at `now`; its effects join [`Driver::effects`].
    fn handle(&mut self, now: Tick, cmd: Command);

    /// Puts every delivery made so far into its consumer's channel.
    fn flush_deliveries(&mut self);

    /// Sends `hop` to shard `to` (never this one).
    fn send(&mut self, to: usize, hop: Hop<Self::Deferred>);

    /// Gives a held-back answer to its caller.
    fn answer(&mut self, deferred: Self::Deferred);
}

/// A message from one shard to another, stamped with the sender's time.
#[derive(Debug)]
pub enum Hop<D> {
    /// Dead letters for queues of the receiving shard.
    DeadLetters {
        /// The sender's time when it sent them.
        at: Tick,
        /// The letters, in the order the sender's engine made them.
        letters: Vec<DeadLetter>,
        /// A held-back answer that comes back with the outcomes.
        deferred: Option<D>,
    },
    /// What the sender's dead-letter queues did with letters from the receiving shard.
    Outcomes {
        /// The sender's time when it sent them.
        at: Tick,
        /// One per letter, in order.
        outcomes: Vec<DeathOutcome>,
        /// A held-back answer, to be given on arrival.
        deferred: Option<D>,
    },
}

impl<D> Hop<D> {
    /// The sender's time: the receiver catches up to it before it handles the hop, so the
    /// result does not depend on which of two messages arrives first.
    pub fn at(&self) -> Tick {
        match self {
            Hop::DeadLetters { at, .. } | Hop::Outcomes { at, .. } => *at,
        }
    }
}

/// Items split by the shard they are for: those of this shard, and the rest grouped by
/// shard in the order each shard first appears.
#[derive(Debug, PartialEq, Eq)]
pub struct Split<T> {
    /// The items for this shard, in order.
    pub local: Vec<T>,
    /// The items for each other shard, in order.
    pub remote: Vec<(usize, Vec<T>)>,
}

/// Splits `items` into those for shard `here` and groups for the others; `shard_of` says
/// which shard an item is for. Order is kept within each group.
pub fn split<T>(
    items: impl IntoIterator<Item = T>,
    here: usize,
    shard_of: impl Fn(&T) -> usize,
) -> Split<T> {
    let mut split = Split {
        local: Vec::new(),
        remote: Vec::new(),
    };
    for item in items {
        let shard = shard_of(&item);
        if shard == here {
            split.local.push(item);
        } else if let Some((_, group)) = split.remote.iter_mut().find(|(s, _)| *s == shard) {
            group.push(item);
        } else {
            split.remote.push((shard, vec![item]));
        }
    }
    split
}

/// Routes the dead letters in the driver's effects: this shard's to its engine at once
/// (and the outcomes of that), the others' to their shards. `deferred` rides with the last
/// hop sent, or is answered here when none is.
pub fn dead_letters<D: Driver>(driver: &mut D, now: Tick, mut deferred: Option<D::Deferred>) {
    let (here, shards) = driver.place();
    while !driver.effects().dead_letters.is_empty() {
        let letters = driver.effects().dead_letters.drain(..).collect::<Vec<_>>();
        let Split { local, remote } = split(letters, here, |l| shard_for(&l.to, shards));
        if !local.is_empty() {
            driver.handle(now, Command::DeadLetters { letters: local });
            outcomes(driver, now, None);
        }
        send_groups(driver, remote, &mut deferred, |letters, deferred| {
            Hop::DeadLetters {
                at: now,
                letters,
                deferred,
            }
        });
    }
    if let Some(deferred) = deferred {
        driver.answer(deferred);
    }
}

/// Routes the outcomes in the driver's effects: this shard's to its engine, the others'
/// back to the shards their letters came from, after flushing the deliveries made here.
/// `deferred` rides with the last hop sent, or is answered here when none is.
pub fn outcomes<D: Driver>(driver: &mut D, now: Tick, mut deferred: Option<D::Deferred>) {
    let (here, _) = driver.place();
    let outcomes = driver.effects().outcomes.drain(..).collect::<Vec<_>>();
    let Split { local, remote } = split(outcomes, here, |o| usize::from(o.origin.shard));
    if !local.is_empty() {
        driver.handle(now, Command::Outcomes { outcomes: local });
    }
    if !remote.is_empty() {
        driver.flush_deliveries();
    }
    send_groups(driver, remote, &mut deferred, |outcomes, deferred| {
        Hop::Outcomes {
            at: now,
            outcomes,
            deferred,
        }
    });
    if let Some(deferred) = deferred {
        driver.answer(deferred);
    }
}

/// Sends one hop per group, `deferred` (taken) riding with the last one.
fn send_groups<D: Driver, T>(
    driver: &mut D,
    groups: Vec<(usize, Vec<T>)>,
    deferred: &mut Option<D::Deferred>,
    hop: impl Fn(Vec<T>, Option<D::Deferred>) -> Hop<D::Deferred>,
) {
    let last = groups.len().saturating_sub(1);
    for (i, (shard, items)) in groups.into_iter().enumerate() {
        let rides = if i == last { deferred.take() } else { None };
        driver.send(shard, hop(items, rides));
    }
}

/// Handles a hop from another shard at `now` (the receiver's time, caught up to
/// [`Hop::at`]): dead letters go to the engine and their outcomes back; outcomes go to the
/// engine and the answer riding with them is given. Then any dead letters the engine made
/// meanwhile (timers fire before every command) go on to their queues.
pub fn receive<D: Driver>(driver: &mut D, now: Tick, hop: Hop<D::Deferred>) {
    match hop {
        Hop::DeadLetters {
            letters, deferred, ..
        } => {
            driver.handle(now, Command::DeadLetters { letters });
            outcomes(driver, now, deferred);
        }
        Hop::Outcomes {
            outcomes, deferred, ..
        } => {
            driver.handle(now, Command::Outcomes { outcomes });
            if let Some(deferred) = deferred {
                driver.answer(deferred);
            }
        }
    }
    dead_letters(driver, now, None);
}

/// Messages for other shards whose inboxes were full, sent in order as room appears.
#[derive(Debug)]
pub struct Backlog<M> {
    waiting: VecDeque<(usize, M)>,
}

impl<M> Default for Backlog<M> {
    fn default() -> Self {
        Backlog {
            waiting: VecDeque::new(),
        }
    }
}

impl<M> Backlog<M> {
    /// Sends `msg` to shard `to` with `try_send`, which gives the message back when that
    /// inbox is full (and drops it when the shard is gone). Behind a message already
    /// waiting, it waits too: messages leave in the order they were sent.
    pub fn send(&mut self, to: usize, msg: M, try_send: impl FnMut(usize, M) -> Result<(), M>) {
        self.waiting.push_back((to, msg));
        if self.waiting.len() == 1 {
            self.retry(try_send);
        }
    }

    /// Sends what waits, in order, until an inbox is full again.
    pub fn retry(&mut self, mut try_send: impl FnMut(usize, M) -> Result<(), M>) {
        while let Some((to, msg)) = self.waiting.pop_front() {
            if let Err(msg) = try_send(to, msg) {
                self.waiting.push_front((to, msg));
                return;
            }
        }
    }

    /// How many messages wait.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Drops everything that waits (the shard stops).
    pub fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasemq_engine::{DeathReason, DeathRecord, MsgId, Origin, QueueKey, Reply, Shard};
    use std::time::Duration;

    #[test]
    fn split_keeps_order_and_groups_by_first_appearance() {
        let s = split([5, 1, 7, 2, 9, 4], 1, |x| *x % 3);
        assert_eq!(s.local, vec![1, 7, 4]);
        assert_eq!(s.remote, vec![(2, vec![5, 2]), (0, vec![9])]);
        let none = split(Vec::<u32>::new(), 0, |_| 0);
        assert!(none.local.is_empty() && none.remote.is_empty());
    }

    #[test]
    fn backlog_keeps_order_behind_a_full_inbox() {
        let mut room = 1usize;
        let mut sent = Vec::new();
        let mut backlog = Backlog::default();
        let try_send = |to: usize, m: u32, room: &mut usize, sent: &mut Vec<(usize, u32)>| {
            if *room == 0 {
                return Err(m);
            }
            *room -= 1;
            sent.push((to, m));
            Ok(())
        };
        backlog.send(1, 10, |to, m| try_send(to, m, &mut room, &mut sent));
        backlog.send(2, 11, |to, m| try_send(to, m, &mut room, &mut sent));
        assert_eq!(backlog.len(), 1);
        // Room appears, but the next send queues behind the one waiting.
        room = 1;
        backlog.send(1, 12, |to, m| try_send(to, m, &mut room, &mut sent));
        assert_eq!(sent, vec![(1, 10)]);
        room = 5;
        backlog.retry(|to, m| try_send(to, m, &mut room, &mut sent));
        assert_eq!(sent, vec![(1, 10), (2, 11), (1, 12)]);
        assert!(backlog.is_empty());
    }

    /// A driver over real engines on one thread: hops go into a list the test delivers.
    struct Test {
        shards: Vec<Shard>,
        here: usize,
        out: Effects,
        sent: Vec<(usize, usize, Hop<&'static str>)>,
        answered: Vec<(usize, &'static str)>,
        flushed: usize,
    }

    impl Driver for Test {
        type Deferred = &'static str;

        fn place(&self) -> (usize, usize) {
            (self.here, self.shards.len())
        }

        fn effects(&mut self) -> &mut Effects {
            &mut self.out
        }

        fn handle(&mut self, now: Tick, cmd: Command) {
            self.shards[self.here].handle(now, cmd, &mut self.out);
        }

        fn flush_deliveries(&mut self) {
            self.flushed += 1;
            self.out.deliveries.clear();
        }

        fn send(&mut self, to: usize, hop: Hop<&'static str>) {
            assert_ne!(to, self.here, "a hop never goes to its own shard");
            self.sent.push((self.here, to, hop));
        }

        fn answer(&mut self, deferred: &'static str) {
            self.answered.push((self.here, deferred));
        }
    }

    fn letter(to: &str, origin: QueueKey, id: &str) -> DeadLetter {
        DeadLetter {
            to: to.into(),
            origin: Origin {
                shard: 0,
                queue: origin,
                msg: 0,
            },
            id: MsgId::Given(id.into()),
            body: bytes::Bytes::from_static(b"x"),
            priority: 0,
            death: DeathRecord {
                queue: "src".into(),
                reason: DeathReason::Rejected,
                attempts: 1,
            },
        }
    }

    /// Two names that land on different shards of two.
    fn names_on_two_shards() -> [String; 2] {
        let mut names = [None, None];
        for i in 0.. {
            let name = format!("dlq-{i}");
            let shard = shard_for(&name, 2);
            if names[shard].is_none() {
                names[shard] = Some(name);
            }
            if names.iter().all(Option::is_some) {
                break;
            }
        }
        names.map(Option::unwrap)
    }

    #[test]
    fn a_deferred_answer_rides_to_the_far_shard_and_back() {
        let [on0, on1] = names_on_two_shards();
        let mut shards: Vec<Shard> = (0..2)
            .map(|i| Shard::new(i, Duration::from_millis(1)))
            .collect();
        let mut out = Effects::new();
        for (i, name) in [(0, &on0), (1, &on1)] {
            let cmd = Command::Declare {
                name: name.clone(),
                config: Box::default(),
            };
            shards[i].handle(0, cmd, &mut out);
            assert!(matches!(out.reply.take(), Some(Reply::Declared(Ok(_)))));
        }
        let mut t = Test {
            shards,
            here: 0,
            out,
            sent: Vec::new(),
            answered: Vec::new(),
            flushed: 0,
        };
        // One letter for each shard: the local one lands at once, the far one travels
        // with the answer.
        let src = t.shards[0].lookup(&on0).unwrap();
        t.out.dead_letters = vec![
            letter(&on1, src, "a"),
            letter(&on0, src, "b"),
            letter(&on1, src, "c"),
        ];
        dead_letters(&mut t, 3, Some("put"));
        assert!(t.answered.is_empty(), "answered before its letters landed");
        assert_eq!(
            t.shards[0].stats(key_of(&t.shards[0], &on0)).unwrap().ready,
            1
        );
        let (from, to, hop) = t.sent.pop().unwrap();
        assert!(t.sent.is_empty(), "one hop per shard");
        assert_eq!((from, to, hop.at()), (0, 1, 3));
        assert!(
            matches!(&hop, Hop::DeadLetters { letters, deferred: Some("put"), .. } if letters.len() == 2)
        );
        // Shard 1 takes both and sends the outcomes, with the answer, back.
        t.here = 1;
        receive(&mut t, 5, hop);
        assert_eq!(
            t.shards[1].stats(key_of(&t.shards[1], &on1)).unwrap().ready,
            2
        );
        assert_eq!(t.flushed, 1, "deliveries flushed before the outcomes leave");
        let (from, to, hop) = t.sent.pop().unwrap();
        assert_eq!((from, to), (1, 0));
        assert!(
            matches!(&hop, Hop::Outcomes { outcomes, deferred: Some("put"), .. }
            if outcomes.len() == 2 && outcomes.iter().all(|o| o.accepted))
        );
        t.here = 0;
        receive(&mut t, 5, hop);
        assert_eq!(t.answered, vec![(0, "put")]);
    }

    #[test]
    fn with_nothing_to_send_the_answer_is_given_at_once() {
        let mut t = Test {
            shards: vec![Shard::new(0, Duration::from_millis(1))],
            here: 0,
            out: Effects::new(),
            sent: Vec::new(),
            answered: Vec::new(),
            flushed: 0,
        };
        let mut out = Effects::new();
        let declare = Command::Declare {
            name: "src".into(),
            config: Box::default(),
        };
        t.shards[0].handle(0, declare, &mut out);
        let src = t.shards[0].lookup("src").unwrap();
        // A letter for a queue nobody declared is refused, here, at once.
        t.out.dead_letters = vec![letter("nowhere", src, "a")];
        dead_letters(&mut t, 0, Some("ack"));
        assert!(t.sent.is_empty());
        assert_eq!(t.answered, vec![(0, "ack")]);
    }

    fn key_of(shard: &Shard, name: &str) -> QueueKey {
        shard.lookup(name).expect("declared")
    }
}
