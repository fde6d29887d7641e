//! The simulated broker: engine shards driven in one thread on a virtual clock. Effects are
//! routed by the runtime's own code (`leasemq_shard::route`: dead letters to the shard
//! owning their queue, outcomes back, a held-back answer riding with them); what travels
//! between shards waits here, so that a seed decides when each message arrives.

use std::collections::{BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use leasemq_engine::durable::Change;
use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, Delivered, DeliveryTag, Effects, Message, QueueKey,
    Reply, Settle, Shard, Tick,
};
use leasemq_shard::route::{self, Backlog, Driver, Hop};
use leasemq_shard::shard_for;
use leasemq_wal::Lsn;

use crate::fault::FaultState;
use crate::hold::Held;
use crate::ledger::{Confirm, IdRec, Ledger, C, Q};
use crate::op::{Handle, IdSpec, MsgSpec, Op};
use crate::rng::Rng;
use crate::setup::{Setup, BAD_NAME, CONSUMER_NAMES};
use crate::storage::Disks;
use crate::Violation;

/// The most deliveries a client holds read and unsettled; it forgets the oldest beyond.
const HAND: usize = 32;

/// How many hops a shard's inbox holds: small, so that full inboxes and the backlog
/// behind them (`route::Backlog`, as the shard thread uses it) happen often.
const INBOX_HOPS: usize = 3;

/// A consumer as its client sees it: what sits unread in its channel, and what it has read
/// and not settled yet.
pub(crate) struct SimConsumer {
    pub shard: usize,
    pub queue: QueueKey,
    pub key: ConsumerKey,
    pub channel: VecDeque<Delivered>,
    pub hand: Vec<Delivered>,
}

/// A message between shards, in flight. What rides with it is the number of the call
/// whose answer is held back.
pub(crate) struct InFlight {
    pub(crate) from: usize,
    pub(crate) to: usize,
    hop: Hop<u64>,
}

pub(crate) struct World {
    pub(crate) setup: Setup,
    pub(crate) shards: Vec<Shard>,
    /// The global virtual clock, in ticks.
    now: Tick,
    pub ledger: Ledger,
    /// Per name, the incarnation closed last (for stale handles).
    pub(crate) closed: Vec<Option<Q>>,
    /// Every consumer ever seen, by ledger number.
    pub(crate) consumers: Vec<SimConsumer>,
    /// Live consumers, in the order they joined; ops pick among them.
    pub(crate) live: Vec<C>,
    /// Consumers that ended, in the order they did.
    pub(crate) ended: Vec<C>,
    pub(crate) in_flight: Vec<InFlight>,
    /// Per shard, the hops it sent that wait for room in a full inbox.
    pub(crate) backlogs: Vec<Backlog<InFlight>>,
    spare: Vec<Effects>,
    /// Calls answered by nobody yet: each waits for the dead letters it caused to land.
    pub(crate) held: BTreeSet<u64>,
    calls: u64,
    pub fault: Option<FaultState>,
    pub step: usize,
    /// Durable runs: each shard's log on its simulated disk.
    pub(crate) disks: Option<Disks>,
    /// Durable runs: per shard, what waits for its log's fsync, behind which lsn.
    pub(crate) pending: Vec<VecDeque<(Lsn, Held)>>,
    /// The log time of tick 0, in nanoseconds: moved on by each restart.
    pub(crate) epoch: u64,
    /// Per call, what its answer tells the client (durable runs).
    pub(crate) confirms: HashMap<u64, Vec<Confirm>>,
    /// Unanswered calls that put to a durable queue: each answers only behind what its
    /// shard's log appended, even if it logged nothing itself (every message a duplicate
    /// of one whose record may not be on disk yet), as the shard's `ShardLog::is_behind`.
    pub(crate) durable_puts: BTreeSet<u64>,
}

impl World {
    pub fn new(setup: &Setup) -> World {
        World {
            setup: setup.clone(),
            shards: (0..setup.shards)
                .map(|i| Shard::new(i as u16, setup.tick))
                .collect(),
            now: 0,
            ledger: Ledger::new(setup),
            closed: vec![None; setup.names.len()],
            consumers: Vec::new(),
            live: Vec::new(),
            ended: Vec::new(),
            in_flight: Vec::new(),
            backlogs: (0..setup.shards).map(|_| Backlog::default()).collect(),
            spare: Vec::new(),
            held: BTreeSet::new(),
            calls: 0,
            fault: None,
            step: 0,
            disks: setup.durable.then(|| Disks::new(setup.shards)),
            pending: (0..setup.shards).map(|_| VecDeque::new()).collect(),
            epoch: 0,
            confirms: HashMap::new(),
            durable_puts: BTreeSet::new(),
        }
    }

    pub(crate) fn setup(&self) -> &Setup {
        &self.setup
    }

    /// The restarted broker: shards restored from `disks`, time counted again from tick 0
    /// at log time `epoch`.
    pub(crate) fn restart_world(&mut self, shards: Vec<Shard>, disks: Disks, epoch: u64) {
        self.shards = shards;
        self.disks = Some(disks);
        self.epoch = epoch;
        self.now = 0;
    }

    pub fn now(&self) -> Tick {
        self.now
    }

    /// The checks after a step: each shard's own invariants, then the ledger's audit.
    pub fn audit(&mut self) -> Result<(), Violation> {
        for (i, shard) in self.shards.iter().enumerate() {
            crate::quietly(|| shard.check_invariants()).map_err(|v| {
                Violation::new("engine-invariant", format!("shard {i}: {}", v.detail))
            })?;
        }
        self.ledger.audit(&self.shards)
    }

    pub fn live_consumers(&self) -> &[C] {
        &self.live
    }

    pub fn consumer(&self, c: C) -> &SimConsumer {
        &self.consumers[c as usize]
    }

    /// Hops between shards: in inboxes, or waiting for room.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.backlogs.iter().map(Backlog::len).sum::<usize>()
    }

    pub fn has_closed(&self, name: u8) -> bool {
        self.closed
            .get(usize::from(name))
            .is_some_and(Option::is_some)
    }

    /// Carries out one op. The checks of each engine call run inside.
    pub fn run(&mut self, op: &Op) -> Result<(), Violation> {
        match op {
            Op::Declare { name, config } => self.declare(*name, *config),
            Op::Consume {
                queue,
                name,
                prefetch,
            } => self.consume(*queue, *name, *prefetch),
            Op::Recv { consumer, max } => {
                self.recv(*consumer, *max);
                Ok(())
            }
            Op::Close { queue } => self.close(*queue),
            Op::Jump {
                ticks,
                order,
                interleave,
            } => self.jump(*ticks, *order, *interleave),
            Op::Deliver { pick } => {
                if self.in_flight.is_empty() {
                    return Ok(());
                }
                let i = usize::from(*pick) % self.in_flight.len();
                let (from, to) = (self.in_flight[i].from, self.in_flight[i].to);
                let first = self
                    .in_flight
                    .iter()
                    .position(|h| h.from == from && h.to == to)
                    .expect("hop i matches");
                self.deliver(first)
            }
            Op::Flush => self.flush(),
            Op::Sync { shard } => self.sync(usize::from(*shard) % self.shards.len()),
            Op::Crash { seed, flip } => self.crash(*seed, *flip),
            _ => match self.client_command(op) {
                Some((shard, cmd)) => self.call(shard, Some(cmd)).map(drop),
                None => Ok(()),
            },
        }
    }

    /// Delivers every message in flight, and what those cause, oldest first. Then every
    /// call has its answer: one still held back lost its way between shards.
    pub fn flush(&mut self) -> Result<(), Violation> {
        loop {
            while !self.in_flight.is_empty() {
                self.deliver(0)?;
            }
            if self.pending.iter().all(VecDeque::is_empty) {
                break;
            }
            for shard in 0..self.shards.len() {
                self.sync(shard)?;
            }
        }
        // A hop waits in a backlog only behind a full inbox, and every delivery retries
        // the backlogs: with the inboxes empty, nothing waits.
        debug_assert_eq!(self.in_flight(), 0, "hops left in a backlog");
        match self.held.first() {
            Some(call) => Err(Violation::new(
                "answer-held",
                format!("call {call} was never answered, though nothing is in flight"),
            )),
            None => Ok(()),
        }
    }

    fn deliver(&mut self, i: usize) -> Result<(), Violation> {
        let InFlight { to, hop, .. } = self.in_flight.remove(i);
        // The hop left its inbox: what waits behind a full one may move up.
        self.retry_backlogs();
        // The receiver catches up to the sender's time first (as the runtime does under
        // the manual clock), so the result does not depend on which arrives first.
        let at = self.ledger.shard_now[to].max(hop.at());
        self.ledger.stats.hops += 1;
        if hop.at() > self.ledger.shard_now[to] {
            self.ledger.stats.catch_ups += 1;
        }
        let mut shard = OnShard::new(self, to);
        route::receive(&mut shard, at, hop);
        shard.finish()
    }

    /// Moves hops that wait for room into inboxes that have it, in order per sender.
    fn retry_backlogs(&mut self) {
        let in_flight = &mut self.in_flight;
        for backlog in &mut self.backlogs {
            backlog.retry(|to, hop| enqueue(in_flight, to, hop));
        }
    }

    fn jump(&mut self, ticks: u64, order: u64, interleave: bool) -> Result<(), Violation> {
        self.now = self.now.saturating_add(ticks);
        let mut shards: Vec<usize> = (0..self.shards.len()).collect();
        Rng::new(order).shuffle(&mut shards);
        for s in shards {
            self.call(s, None)?;
            if interleave {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn declare(&mut self, name: u8, config: u8) -> Result<(), Violation> {
        let config = self.setup.config(name, config).clone();
        let text = self.setup.name(name).to_string();
        // As the broker does: a valid declare first looks its dead-letter queue up, on the
        // shard that owns it, and answers UnknownQueue without declaring when it is missing.
        if name != BAD_NAME && self.setup.is_valid(&config) {
            if let Some(dead_letter) = &config.dead_letter {
                let shard = shard_for(dead_letter, self.shards.len());
                let cmd = Command::Lookup {
                    name: dead_letter.clone(),
                };
                if let Some(Reply::Found(None)) = self.call(shard, Some(cmd))? {
                    return Ok(());
                }
            }
        }
        let shard = shard_for(&text, self.shards.len());
        let cmd = Command::Declare {
            name: text,
            config: Box::new(config),
        };
        self.call(shard, Some(cmd)).map(drop)
    }

    fn close(&mut self, name: u8) -> Result<(), Violation> {
        let Some(q) = self.incarnation(name, Handle::Live) else {
            return Ok(());
        };
        let (shard, key) = self.place_of(q);
        let reply = self.call(shard, Some(Command::Close { queue: key }))?;
        if let Some(Reply::Closed(Some(_))) = reply {
            self.closed[usize::from(name)] = Some(q);
        }
        Ok(())
    }

    /// The consumer reads up to `max` deliveries from its channel into its hand.
    fn recv(&mut self, consumer: u16, max: u16) {
        if let Some(c) = self.pick_consumer(consumer) {
            let sc = &mut self.consumers[c as usize];
            let n = sc.channel.len().min(usize::from(max));
            sc.hand.extend(sc.channel.drain(..n));
            // A client works on a few deliveries at a time; the ones it drops here it never
            // settles (their leases run out).
            let over = sc.hand.len().saturating_sub(HAND);
            sc.hand.drain(..over);
        }
    }

    fn consume(&mut self, queue: u8, name: u8, prefetch: u32) -> Result<(), Violation> {
        let Some((shard, key)) = self.resolve(queue, Handle::Live) else {
            return Ok(());
        };
        let name = CONSUMER_NAMES
            .get(usize::from(name))
            .copied()
            .unwrap_or("")
            .to_string();
        let cmd = Command::Consume {
            queue: key,
            name,
            config: ConsumerConfig { prefetch },
            priority: 0,
            ack_timeout: None,
        };
        if let Some(Reply::Consumed(Ok(key))) = self.call(shard, Some(cmd))? {
            let c = self
                .ledger
                .consumer_at(shard as u16, key)
                .expect("the ledger registered it");
            self.see_consumer(c);
        }
        Ok(())
    }

    /// Makes a message for `spec` whose body names it in the ledger.
    pub(crate) fn message(&mut self, shard: usize, spec: &MsgSpec) -> Message {
        let (id, text) = match spec.id {
            IdSpec::None => (IdRec::Auto(None), None),
            IdSpec::Given(n) => (IdRec::Given(n), Some(format!("m{n}"))),
            IdSpec::Empty => (IdRec::Invalid, Some(String::new())),
            IdSpec::TooLong => (IdRec::Invalid, Some("x".repeat(1025))),
        };
        let len = if spec.big { 200 } else { 8 };
        let serial = self.ledger.register(id, len, shard);
        let mut body = vec![0u8; len];
        body[..8].copy_from_slice(&u64::from(serial).to_le_bytes());
        let mut message = Message::new(Bytes::from(body)).with_delay(spec.delay);
        if let Some(text) = text {
            message = message.with_id(text);
        }
        message
    }

    /// The live or last closed incarnation of a name.
    pub(crate) fn incarnation(&self, name: u8, handle: Handle) -> Option<Q> {
        match handle {
            Handle::Live => *self.ledger.by_name.get(usize::from(name))?,
            Handle::Stale => *self.closed.get(usize::from(name))?,
        }
    }

    fn place_of(&self, q: Q) -> (usize, QueueKey) {
        let rec = &self.ledger.queues[q as usize];
        (usize::from(rec.shard), rec.key)
    }

    pub(crate) fn resolve(&self, name: u8, handle: Handle) -> Option<(usize, QueueKey)> {
        self.incarnation(name, handle).map(|q| self.place_of(q))
    }

    pub(crate) fn pick_consumer(&self, pick: u16) -> Option<C> {
        match self.live.len() {
            0 => None,
            n => Some(self.live[usize::from(pick) % n]),
        }
    }

    /// The tag of a delivery in the consumer's hand; a settle takes it out, a touch keeps it.
    pub(crate) fn take_from_hand(&mut self, c: C, pick: u16, op: Settle) -> Option<DeliveryTag> {
        let hand = &mut self.consumers[c as usize].hand;
        if hand.is_empty() {
            return None;
        }
        // Counted from the newest: a client settles what it read last, mostly.
        let i = hand.len() - 1 - usize::from(pick) % hand.len();
        let tag = hand[i].tag;
        if op != Settle::Touch {
            hand.remove(i);
        }
        Some(tag)
    }

    /// Whether `cmd` puts to a durable queue (durable runs).
    fn is_durable_put(&self, shard: usize, cmd: &Command) -> bool {
        let queue = match cmd {
            Command::Put { queue, .. } | Command::PutBatch { queue, .. } => *queue,
            _ => return false,
        };
        self.disks.is_some()
            && self
                .ledger
                .live_queue(shard as u16, queue)
                .is_some_and(|q| self.ledger.queues[q as usize].config.durable)
    }

    /// Creates the client side of every consumer the ledger knows up to `c`.
    fn see_consumer(&mut self, c: C) {
        while self.consumers.len() <= c as usize {
            let n = self.consumers.len();
            let rec = &self.ledger.consumers[n];
            let q = &self.ledger.queues[rec.q as usize];
            self.consumers.push(SimConsumer {
                shard: usize::from(q.shard),
                queue: q.key,
                key: rec.key,
                channel: VecDeque::new(),
                hand: Vec::new(),
            });
            if rec.live {
                self.live.push(n as C);
            }
        }
    }

    /// One engine call at the global time.
    fn call(&mut self, shard: usize, cmd: Option<Command>) -> Result<Option<Reply>, Violation> {
        let now = self.now;
        let mut on = OnShard::new(self, shard);
        let reply = match cmd {
            // A client's command: answered once the dead letters it caused have landed.
            Some(cmd) => {
                let before = on.world.before(shard, &cmd);
                let durable_put = on.world.is_durable_put(shard, &cmd);
                let reply = on.engine_call(now, Some(cmd));
                on.world.calls += 1;
                let call = on.world.calls;
                on.world.held.insert(call);
                if durable_put {
                    on.world.durable_puts.insert(call);
                }
                if on.failed.is_none() {
                    let confirms = on.world.confirms_of(shard, before);
                    if !confirms.is_empty() {
                        on.world.confirms.insert(call, confirms);
                    }
                }
                route::dead_letters(&mut on, now, Some(call));
                reply
            }
            None => {
                on.engine_call(now, None);
                route::dead_letters(&mut on, now, None);
                None
            }
        };
        on.finish().map(|()| reply)
    }
}

/// The world as one shard's thread sees it, for the runtime's routing: engine calls
/// checked by the ledger, deliveries into the consumers' channels, hops into flight.
pub(crate) struct OnShard<'w> {
    world: &'w mut World,
    shard: usize,
    /// Effects not yet routed.
    pub(crate) out: Effects,
    /// The first violation the ledger found; later calls are skipped.
    failed: Option<Violation>,
    /// Whether an engine call logged a change: from then on, what this turn sends waits
    /// for the fsync that covers it.
    logged: bool,
}

impl<'w> OnShard<'w> {
    pub(crate) fn new(world: &'w mut World, shard: usize) -> OnShard<'w> {
        let out = world.spare.pop().unwrap_or_default();
        OnShard {
            world,
            shard,
            out,
            failed: None,
            logged: false,
        }
    }

    /// Whether what this turn sends now must wait for the disk: it logged, or something
    /// sent before it still waits (order is kept per shard).
    fn holds(&self) -> bool {
        self.world.disks.is_some() && (self.logged || !self.world.pending[self.shard].is_empty())
    }

    fn hold(&mut self, what: Held) {
        let lsn = self
            .world
            .disks
            .as_ref()
            .expect("holds only with disks")
            .last_appended(self.shard);
        self.world.pending[self.shard].push_back((lsn, what));
    }

    /// Appends the changes an engine call logged as one record of this shard's log.
    pub(crate) fn log(&mut self, now: Tick, changes: &mut Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let world = &mut *self.world;
        let Some(disks) = &mut world.disks else {
            changes.clear();
            return;
        };
        for change in changes.iter() {
            if let Change::Declared { queue, name, .. } = change {
                let q = world
                    .setup
                    .name_index(name)
                    .and_then(|n| world.ledger.by_name[usize::from(n)]);
                if let Some(q) = q {
                    world.ledger.logged_declare(self.shard as u16, *queue, q);
                }
            }
        }
        let log_time = world.shards[self.shard].log_time(now);
        match disks.append(self.shard, log_time, changes) {
            Ok(_) => self.logged = true,
            Err(e) => {
                let v = Violation::new("storage", format!("shard {}: {e}", self.shard));
                self.failed.get_or_insert(v);
            }
        }
    }

    /// One engine call at `now` (`None`: the timers), checked by the ledger; its effects
    /// join those not yet routed.
    fn engine_call(&mut self, now: Tick, cmd: Option<Command>) -> Option<Reply> {
        if self.failed.is_some() {
            return None;
        }
        let world = &mut *self.world;
        let mut out = world.spare.pop().unwrap_or_default();
        let copy = cmd.clone();
        match cmd {
            Some(cmd) => world.shards[self.shard].handle(now, cmd, &mut out),
            None => world.shards[self.shard].handle_timeout(now, &mut out),
        }
        if let Some(fault) = &mut world.fault {
            fault.tamper(world.step, &mut out);
        }
        if let Err(v) = world.ledger.observe(self.shard, now, copy.as_ref(), &out) {
            self.failed = Some(v);
        }
        let mut changes = std::mem::take(&mut out.log);
        self.log(now, &mut changes);
        let world = &mut *self.world;
        out.log = changes;
        let reply = out.reply.take();
        self.out.deliveries.append(&mut out.deliveries);
        self.out.dead_letters.append(&mut out.dead_letters);
        self.out.outcomes.append(&mut out.outcomes);
        self.out.consumers_gone.append(&mut out.consumers_gone);
        world.spare.push(out);
        reply
    }

    /// Puts what is left into the channels and hands back the effects.
    pub(crate) fn finish(mut self) -> Result<(), Violation> {
        Driver::flush_deliveries(&mut self);
        let mut out = std::mem::take(&mut self.out);
        out.dead_letters.clear();
        out.outcomes.clear();
        self.world.spare.push(out);
        self.failed.map_or(Ok(()), Err)
    }
}

impl Driver for OnShard<'_> {
    type Deferred = u64;

    fn place(&self) -> (usize, usize) {
        (self.shard, self.world.shards.len())
    }

    fn effects(&mut self) -> &mut Effects {
        &mut self.out
    }

    fn handle(&mut self, now: Tick, cmd: Command) {
        let reply = self.engine_call(now, Some(cmd));
        debug_assert!(reply.is_none(), "dead letters and outcomes have no reply");
    }

    /// Deliveries into channels, then the channels of consumers that ended dropped (what
    /// the shard thread does once per batch).
    fn flush_deliveries(&mut self) {
        let holds = self.holds();
        let mut deliveries = std::mem::take(&mut self.out.deliveries);
        for (key, delivered) in deliveries.drain(..) {
            let c = self
                .world
                .ledger
                .consumer_at(self.shard as u16, key)
                .expect("the ledger checked every delivery");
            self.world.see_consumer(c);
            if self.world.disks.is_none() {
                self.world.consumers[c as usize]
                    .channel
                    .push_back(delivered);
                continue;
            }
            let q = self.world.ledger.consumers[c as usize].q;
            let stint = self.world.ledger.stint(q, delivered.tag.0, &delivered.body);
            if holds {
                self.hold(Held::Delivery(c, delivered, stint));
            } else {
                self.world.give_delivery(c, delivered, stint);
            }
        }
        self.out.deliveries = deliveries;
        let world = &mut *self.world;
        for key in self.out.consumers_gone.drain(..) {
            let c = world
                .ledger
                .consumer_at(self.shard as u16, key)
                .expect("the ledger checked every ended consumer");
            world.see_consumer(c);
            world.live.retain(|&x| x != c);
            world.ended.push(c);
            let sc = &mut world.consumers[c as usize];
            sc.channel.clear();
            sc.hand.clear();
        }
    }

    fn send(&mut self, to: usize, hop: Hop<u64>) {
        let hop = InFlight {
            from: self.shard,
            to,
            hop,
        };
        if self.holds() {
            self.hold(Held::Hop(hop));
        } else {
            self.world.send_hop(hop);
        }
    }

    fn answer(&mut self, call: u64) {
        let behind = self.world.durable_puts.remove(&call)
            && self
                .world
                .disks
                .as_ref()
                .is_some_and(|d| d.is_behind(self.shard));
        if self.holds() || behind {
            self.hold(Held::Answer(call));
            return;
        }
        if let Err(v) = self.world.give_answer(call) {
            self.failed.get_or_insert(v);
        }
    }
}

/// Puts a hop into shard `to`'s inbox, or gives it back when that inbox is full.
pub(crate) fn enqueue(
    in_flight: &mut Vec<InFlight>,
    to: usize,
    hop: InFlight,
) -> Result<(), InFlight> {
    if in_flight.iter().filter(|h| h.to == to).count() >= INBOX_HOPS {
        return Err(hop);
    }
    in_flight.push(hop);
    Ok(())
}
