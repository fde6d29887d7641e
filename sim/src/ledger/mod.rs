//! The ledger: where every message ever put is, and what each queue's stats must say.
//!
//! It is not a model of the engine: it does not know the round robin, the order of the
//! ready lists or which consumer gets what. It knows where each message is (one [`Place`]),
//! each live lease's deadline, each consumer's credit, and every counter. From that it
//! predicts every reply exactly, and how many deliveries each step must cause (a queue with
//! a ready message and a consumer with credit must deliver), and it checks each delivery the
//! engine makes against what it knows: the message was ready in that queue, the consumer had
//! credit, the tag is new, the attempt and death record are right.
//!
//! The engine fires timers of one `handle_timeout` in deadline order, each at its own tick;
//! the ledger does the same per queue, in groups of equal ticks: after applying every
//! expiry and every delayed message of a tick, the queue must deliver
//! `min(ready, free credit)` messages, and those are the next deliveries of that queue in
//! the effects.

mod audit;
mod crash;
mod effects;
mod ops;
mod rebuild;
mod timers;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::time::Duration;

use leasemq_engine::{
    Command, ConsumerKey, DeathRecord, Delivered, Effects, QueueConfig, QueueKey, QueueStats,
    RetryPolicy, Tick,
};

use crate::setup::Setup;
use crate::{Stats, Violation};

pub(crate) use crash::{Confirm, Restart, RestoredMsg, RestoredQueue};

pub(crate) type Serial = u32;
/// A queue incarnation: a name declared once, until it is closed.
pub(crate) type Q = u32;
/// A consumer, for as long as it lives.
pub(crate) type C = u32;

/// A message's id as the ledger knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdRec {
    Given(u32),
    /// Broker-assigned, learned from the first delivery or dead letter that shows it.
    Auto(Option<u64>),
    /// Empty or too long: never enqueued.
    Invalid,
}

/// Where a message is. Exactly one of these at any time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Not (yet) in any queue: refused by its put (duplicate or error), or not put yet.
    NotEnqueued,
    Ready {
        q: Q,
        returned: bool,
    },
    Delayed {
        q: Q,
        until: Tick,
    },
    Leased {
        q: Q,
        tag: u64,
        consumer: C,
    },
    Acked {
        q: Q,
    },
    /// A dead letter on its way to the dead-letter queue of `from`.
    InFlight {
        from: Q,
    },
    /// Dead-lettered with nowhere to go: counted in `from`'s `dropped`.
    Dropped {
        from: Q,
    },
    /// Removed by the close of its queue.
    Closed {
        q: Q,
    },
    /// Gone with the broker that crashed while it was live: in a queue in memory, or in a
    /// durable one whose restored copy the ledger counts under this serial's copy (see
    /// `Ledger::copies`) or, when the restore did not bring it back, lost as contract §7
    /// allows (its put not yet on disk).
    Crashed,
}

#[derive(Clone, Debug)]
pub(crate) struct MsgRec {
    pub id: IdRec,
    pub body_len: usize,
    /// The shard it was first put on (a broker id names it).
    pub born_on: u16,
    pub place: Place,
    /// Deliveries in its current queue.
    pub attempt: u32,
    pub death: Option<DeathRecord>,
    /// Its index in its queue's `members` while it is ready, delayed or leased.
    pub slot: u32,
    /// The incarnations it was ever enqueued in (by a put, or as a dead letter).
    pub entered: Vec<Q>,
    /// What its clients were told (durable runs): see [`Client`].
    pub client: Client,
}

/// What the clients of a message were told, as opposed to what the engine did: under
/// `SyncPolicy::Always` an answer or delivery caused by a logged change reaches a client
/// only once the fsync covering it is done (contract §7), and only that binds a restart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Client {
    /// Its put into a durable queue was answered `Enqueued` (or a restart brought it back
    /// from disk): it must survive a crash until settled away.
    pub put: bool,
    /// The incarnation whose ack of it was answered `true`: it never comes back there.
    pub acked_in: Option<Q>,
    /// The least attempt a restart may give it back with in its current queue: the attempt
    /// of the last delivery handed to a client, less one after a release or cancel gave
    /// one back (which need not be on disk yet).
    pub floor: u32,
    /// The log time until which an answered put or `nack_with_delay` delayed it.
    pub delay: Option<u64>,
    /// The highest attempt the engine delivered it at in its current queue (handed over
    /// or not): a restart may bring it back with that attempt.
    pub peak: u32,
    /// A delivery from a durable queue showed a client its broker id, so the log holds
    /// it: no later message may have it (one from a queue in memory may be given again
    /// after a restart).
    pub id_seen: bool,
    /// Its enqueues (indices into [`MsgRec::entered`]) known to be on disk: the put's once
    /// answered, one a delivery was handed over from, one a restart brought back. A dead
    /// letter's enqueue in the next queue is known only once a client sees it there.
    pub known: Vec<usize>,
}

impl Client {
    /// Its enqueue `visit` (an index into [`MsgRec::entered`]) is on disk.
    pub fn know(&mut self, visit: usize) {
        if !self.known.contains(&visit) {
            self.known.push(visit);
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseRec {
    pub serial: Serial,
    pub consumer: C,
    pub deadline: Tick,
    pub delivered_at: Tick,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Dedup {
    pub live: bool,
    /// The window since the id's first enqueue ends here.
    pub until: Tick,
    /// The enqueue that opened it: its index in the message's [`MsgRec::entered`].
    pub visit: usize,
    /// The message whose enqueue opened the window ([`RESTORED`] for one a restart
    /// brought back from disk).
    pub by: Serial,
}

/// [`Dedup::by`] of a window restored from disk.
pub(crate) const RESTORED: Serial = Serial::MAX;

/// A timer the ledger expects the engine to fire: `(deadline, sequence, what)` where `what`
/// is a lease tag, or a serial with [`READY_BIT`] set for a delayed message.
type Event = Reverse<(Tick, u64, u64)>;
const READY_BIT: u64 = 1 << 63;

pub(crate) struct QueueRec {
    pub name: u8,
    pub shard: u16,
    pub key: QueueKey,
    pub config: QueueConfig,
    pub live: bool,
    pub ack: Tick,
    pub max_lease: Option<Tick>,
    pub dedup_ticks: Tick,
    pub dead_letter: Option<String>,
    /// Live messages (ready, delayed, leased).
    pub members: Vec<Serial>,
    pub ready: usize,
    /// Ready messages that came back (expiry, nack, release, cancel): delivered first.
    pub returned: usize,
    pub delayed: usize,
    pub leases: BTreeMap<u64, LeaseRec>,
    pub events: BinaryHeap<Event>,
    pub dedup: HashMap<u32, Dedup>,
    /// Consumers in registration order.
    pub consumers: Vec<C>,
    /// Free credit over all consumers.
    pub free: u64,
    pub last_tag: u64,
    /// Counters; the gauges are filled in from the fields above.
    pub stats: QueueStats,
    /// Where the search for this queue's next delivery in the effects resumes.
    cursor: usize,
    /// Durable runs: its declare was answered (or a restart brought it back), so a crash
    /// must not lose it.
    pub declared: bool,
    /// Durable runs: its close was answered, so a crash must not bring it back.
    pub closed: bool,
    /// The highest tag of a delivery of it handed to a client.
    pub given_tag: u64,
}

pub(crate) struct ConsumerRec {
    pub q: Q,
    pub key: ConsumerKey,
    pub name: String,
    pub prefetch: u32,
    pub held: u32,
    pub live: bool,
}

/// A dead letter the ledger expects in the effects.
#[derive(Clone, Debug)]
pub(crate) struct ExpectedLetter {
    pub serial: Serial,
    pub from: Q,
    pub death: DeathRecord,
}

pub(crate) struct Ledger {
    pub setup: Setup,
    pub msgs: Vec<MsgRec>,
    pub queues: Vec<QueueRec>,
    /// The live incarnation of each name.
    pub by_name: Vec<Option<Q>>,
    /// Per shard, per queue slot: the incarnation last seen there.
    queue_slots: Vec<Vec<Option<Q>>>,
    pub consumers: Vec<ConsumerRec>,
    consumer_slots: Vec<Vec<Option<C>>>,
    seen_queue_keys: HashSet<(u16, QueueKey)>,
    seen_consumer_keys: HashSet<(u16, ConsumerKey)>,
    auto_ids: HashMap<u64, Serial>,
    /// A message that a crash left in two queues (a dead letter whose source had not yet
    /// logged it gone, contract §7): its serial, and the serials of its other copies.
    pub copies: HashMap<Serial, Vec<Serial>>,
    /// Dead letters of durable queues whose outcome has not come back, by origin (shard,
    /// message number): their ids stay live in the source until it does.
    pub dying: HashMap<(u16, u64), Serial>,
    /// Durable queues by the number their shard's log knows them by.
    pub log_numbers: HashMap<(u16, u32), Q>,
    /// The tick each shard was last handed.
    pub shard_now: Vec<Tick>,
    pub seq: u64,
    /// Incarnations closed since the last audit: their stats must be gone.
    pub just_closed: Vec<Q>,
    pub stats: Stats,
    // Per observation:
    taken: Vec<bool>,
    letters: Vec<ExpectedLetter>,
    gone: Vec<ConsumerKey>,
    outcomes: Vec<leasemq_engine::DeathOutcome>,
}

/// The effects of one engine call, with which deliveries the ledger has accounted for.
pub(crate) struct Obs<'a> {
    pub shard: u16,
    pub out: &'a Effects,
}

impl Ledger {
    pub fn new(setup: &Setup) -> Ledger {
        Ledger {
            setup: setup.clone(),
            msgs: Vec::new(),
            queues: Vec::new(),
            by_name: vec![None; setup.names.len()],
            queue_slots: vec![Vec::new(); setup.shards],
            consumers: Vec::new(),
            consumer_slots: vec![Vec::new(); setup.shards],
            seen_queue_keys: HashSet::new(),
            seen_consumer_keys: HashSet::new(),
            auto_ids: HashMap::new(),
            copies: HashMap::new(),
            dying: HashMap::new(),
            log_numbers: HashMap::new(),
            shard_now: vec![0; setup.shards],
            seq: 0,
            just_closed: Vec::new(),
            stats: Stats::default(),
            taken: Vec::new(),
            letters: Vec::new(),
            gone: Vec::new(),
            outcomes: Vec::new(),
        }
    }

    /// A new message about to be put on `shard`; its body must start with the serial.
    pub fn register(&mut self, id: IdRec, body_len: usize, shard: usize) -> Serial {
        let serial = u32::try_from(self.msgs.len()).expect("fewer than 2^32 messages");
        self.msgs.push(MsgRec {
            id,
            body_len,
            born_on: shard as u16,
            place: Place::NotEnqueued,
            attempt: 0,
            death: None,
            slot: 0,
            entered: Vec::new(),
            client: Client::default(),
        });
        serial
    }

    /// The live incarnation at `key` on `shard`.
    pub fn live_queue(&self, shard: u16, key: QueueKey) -> Option<Q> {
        let q = (*self.queue_slots[usize::from(shard)].get(key.slot())?)?;
        let rec = &self.queues[q as usize];
        (rec.key == key && rec.live).then_some(q)
    }

    /// The live consumer `key` on `shard`.
    pub fn live_consumer(&self, shard: u16, key: ConsumerKey) -> Option<C> {
        let c = (*self.consumer_slots[usize::from(shard)].get(key.slot())?)?;
        let rec = &self.consumers[c as usize];
        (rec.key == key && rec.live).then_some(c)
    }

    /// The consumer `key` on `shard`, live or not (for routing what the engine just said).
    pub fn consumer_at(&self, shard: u16, key: ConsumerKey) -> Option<C> {
        let c = (*self.consumer_slots[usize::from(shard)].get(key.slot())?)?;
        (self.consumers[c as usize].key == key).then_some(c)
    }

    pub(crate) fn new_queue(
        &mut self,
        name: u8,
        shard: u16,
        key: QueueKey,
        config: QueueConfig,
    ) -> Result<Q, Violation> {
        if !self.seen_queue_keys.insert((shard, key)) {
            return Err(Violation::new(
                "reply",
                format!("declare answered {key:?}, a key an earlier queue had"),
            ));
        }
        let q = self.queues.len() as Q;
        let setup = &self.setup;
        self.queues.push(QueueRec {
            name,
            shard,
            key,
            live: true,
            ack: setup.ticks(config.ack_timeout),
            max_lease: config.max_lease.map(|d| setup.ticks(d)),
            dedup_ticks: setup.ticks(config.dedup_window),
            dead_letter: config.dead_letter.clone(),
            config,
            members: Vec::new(),
            ready: 0,
            returned: 0,
            delayed: 0,
            leases: BTreeMap::new(),
            events: BinaryHeap::new(),
            dedup: HashMap::new(),
            consumers: Vec::new(),
            free: 0,
            last_tag: 0,
            stats: QueueStats::default(),
            cursor: 0,
            declared: false,
            closed: false,
            given_tag: 0,
        });
        let slots = &mut self.queue_slots[usize::from(shard)];
        if slots.len() <= key.slot() {
            slots.resize(key.slot() + 1, None);
        }
        slots[key.slot()] = Some(q);
        self.by_name[usize::from(name)] = Some(q);
        Ok(q)
    }

    pub(crate) fn new_consumer(
        &mut self,
        q: Q,
        key: ConsumerKey,
        name: String,
        prefetch: u32,
    ) -> Result<C, Violation> {
        let shard = self.queues[q as usize].shard;
        if !self.seen_consumer_keys.insert((shard, key)) {
            return Err(Violation::new(
                "reply",
                format!("consume answered {key:?}, a key an earlier consumer had"),
            ));
        }
        let c = self.consumers.len() as C;
        self.consumers.push(ConsumerRec {
            q,
            key,
            name,
            prefetch,
            held: 0,
            live: true,
        });
        let slots = &mut self.consumer_slots[usize::from(shard)];
        if slots.len() <= key.slot() {
            slots.resize(key.slot() + 1, None);
        }
        slots[key.slot()] = Some(c);
        let rec = &mut self.queues[q as usize];
        rec.consumers.push(c);
        rec.free += u64::from(prefetch);
        Ok(c)
    }

    /// `retry.delay(attempt)` in ticks, exactly: the multipliers here are 1 and 2.
    pub fn retry_ticks(&self, retry: &RetryPolicy, attempt: u32) -> Tick {
        let max = retry.max.as_nanos();
        let mut n = retry.initial.as_nanos();
        let factor = if retry.multiplier == 2.0 { 2 } else { 1 };
        for _ in 1..attempt {
            if n >= max || factor == 1 {
                break;
            }
            n *= factor;
        }
        self.setup.ticks(Duration::from_nanos(n.min(max) as u64))
    }

    /// Checks one engine call: `cmd` at `now` on `shard` (or `handle_timeout` when `None`)
    /// and the effects it had.
    pub fn observe(
        &mut self,
        shard: usize,
        now: Tick,
        cmd: Option<&Command>,
        out: &Effects,
    ) -> Result<(), Violation> {
        if now < self.shard_now[shard] {
            return Err(Violation::new(
                "clock",
                format!(
                    "the simulator took shard {shard} back in time ({now} after {})",
                    self.shard_now[shard]
                ),
            ));
        }
        self.taken.clear();
        self.taken.resize(out.deliveries.len(), false);
        self.letters.clear();
        self.gone.clear();
        self.outcomes.clear();
        for q in &mut self.queues {
            q.cursor = 0;
        }
        let obs = Obs {
            shard: shard as u16,
            out,
        };
        self.advance(&obs, now)?;
        self.shard_now[shard] = now;
        let reply = match cmd {
            Some(cmd) => self.command(&obs, now, cmd)?,
            None => None,
        };
        self.check_reply(reply, out.reply.as_ref())?;
        if let Some(i) = self.taken.iter().position(|&t| !t) {
            let (key, d) = &out.deliveries[i];
            let leased = self
                .serial_of(&d.body)
                .is_ok_and(|s| matches!(self.msgs[s as usize].place, Place::Leased { .. }));
            return Err(Violation::new(
                if leased {
                    "lease-overlap"
                } else {
                    "unexpected-delivery"
                },
                format!(
                    "shard {shard} delivered tag {} ({}) to {key:?}, but no message was due: {}",
                    d.tag.0,
                    self.describe_body(&d.body),
                    self.why_no_delivery(shard as u16, *key)
                ),
            ));
        }
        self.check_letters(&obs)?;
        self.check_outcomes(out)?;
        self.check_gone(out)
    }

    /// The next delivery of queue `q` in the effects not yet accounted for.
    fn take_delivery<'a>(&mut self, obs: &Obs<'a>, q: Q) -> Option<(C, &'a Delivered)> {
        let start = self.queues[q as usize].cursor;
        for i in start..obs.out.deliveries.len() {
            if self.taken[i] {
                continue;
            }
            let (key, d) = &obs.out.deliveries[i];
            let Some(c) = self.live_consumer(obs.shard, *key) else {
                continue;
            };
            if self.consumers[c as usize].q == q {
                self.taken[i] = true;
                self.queues[q as usize].cursor = i + 1;
                return Some((c, d));
            }
        }
        self.queues[q as usize].cursor = obs.out.deliveries.len();
        None
    }

    fn why_no_delivery(&self, shard: u16, key: ConsumerKey) -> String {
        let Some(c) = self.live_consumer(shard, key) else {
            return "that consumer is not live".into();
        };
        let q = &self.queues[self.consumers[c as usize].q as usize];
        format!(
            "its queue {} has {} ready and {} free credit",
            self.setup.name(q.name),
            q.ready,
            q.free
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasemq_engine::RetryPolicy;

    use super::Ledger;
    use crate::setup::Setup;

    /// The ledger's exact retry delays agree with the engine's policy for every policy the
    /// simulation draws, so a nack's wait is not a source of false alarms.
    #[test]
    fn retry_delays_match_the_policy() {
        for seed in 0..8 {
            let setup = Setup::from_seed(seed);
            let ledger = Ledger::new(&setup);
            for row in &setup.configs {
                for config in &row[..row.len() - 1] {
                    let retry: &RetryPolicy = &config.retry;
                    for attempt in 1..40 {
                        assert_eq!(
                            ledger.retry_ticks(retry, attempt),
                            setup.ticks(retry.base_delay(attempt)),
                            "{retry:?} at attempt {attempt}, tick {:?}",
                            setup.tick
                        );
                    }
                }
            }
        }
        assert_eq!(Setup::from_seed(0).ticks(Duration::from_nanos(1)), 1);
    }
}
