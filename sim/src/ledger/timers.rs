//! Time and dispatch in the ledger: the timers it expects to fire, the deliveries each step
//! must make, and where a message goes when a lease ends.

use std::cmp::Reverse;

use leasemq_engine::{DeathReason, DeathRecord, Delivered, Tick};

use super::{Dedup, ExpectedLetter, LeaseRec, Ledger, Obs, Place, Serial, C, Q, READY_BIT};
use crate::Violation;

/// How a message comes back from a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// Expired, or read by a consumer that was cancelled.
    Expired,
    /// Nacked, ready again after this many ticks.
    Nacked(Tick),
}

impl Ledger {
    /// Fires, queue by queue, every timer of `obs.shard` due by `now`, a tick at a time, and
    /// accounts for the deliveries each tick makes.
    pub(crate) fn advance(&mut self, obs: &Obs, now: Tick) -> Result<(), Violation> {
        for q in 0..self.queues.len() as Q {
            let rec = &self.queues[q as usize];
            if !rec.live || rec.shard != obs.shard {
                continue;
            }
            while let Some(at) = self.next_event(q) {
                if at > now {
                    break;
                }
                while self.next_event(q) == Some(at) {
                    let Reverse((_, _, what)) =
                        self.queues[q as usize].events.pop().expect("peeked");
                    self.fire(q, at, what);
                }
                self.dispatch(obs, q, at, false)?;
            }
        }
        Ok(())
    }

    /// The tick of the queue's next live timer, dropping the ones that no longer count.
    pub(crate) fn next_event(&mut self, q: Q) -> Option<Tick> {
        loop {
            let &Reverse((at, _, what)) = self.queues[q as usize].events.peek()?;
            if self.event_is_live(q, at, what) {
                return Some(at);
            }
            self.queues[q as usize].events.pop();
        }
    }

    fn event_is_live(&self, q: Q, at: Tick, what: u64) -> bool {
        if what & READY_BIT != 0 {
            let serial = (what & !READY_BIT) as usize;
            self.msgs[serial].place == Place::Delayed { q, until: at }
        } else {
            self.queues[q as usize]
                .leases
                .get(&what)
                .is_some_and(|l| l.deadline == at)
        }
    }

    pub(crate) fn schedule(&mut self, q: Q, at: Tick, what: u64) {
        self.seq += 1;
        let seq = self.seq;
        self.queues[q as usize]
            .events
            .push(Reverse((at, seq, what)));
    }

    fn fire(&mut self, q: Q, at: Tick, what: u64) {
        if what & READY_BIT != 0 {
            let serial = (what & !READY_BIT) as Serial;
            let returned = self.msgs[serial as usize].attempt > 0;
            let rec = &mut self.queues[q as usize];
            rec.delayed -= 1;
            self.make_ready(q, serial, returned);
        } else {
            let lease = self.end_lease(q, what);
            self.queues[q as usize].stats.expired += 1;
            self.stats.expiries += 1;
            self.come_back(q, lease.serial, at, Back::Expired);
        }
    }

    /// Takes a live lease out of the table and gives its consumer the credit back.
    pub(crate) fn end_lease(&mut self, q: Q, tag: u64) -> LeaseRec {
        let rec = &mut self.queues[q as usize];
        let lease = rec.leases.remove(&tag).expect("a live lease");
        rec.free += 1;
        self.consumers[lease.consumer as usize].held -= 1;
        lease
    }

    pub(crate) fn make_ready(&mut self, q: Q, serial: Serial, returned: bool) {
        let rec = &mut self.queues[q as usize];
        rec.ready += 1;
        rec.returned += usize::from(returned);
        self.msgs[serial as usize].place = Place::Ready { q, returned };
    }

    pub(crate) fn make_delayed(&mut self, q: Q, serial: Serial, until: Tick) {
        self.queues[q as usize].delayed += 1;
        self.msgs[serial as usize].place = Place::Delayed { q, until };
        self.schedule(q, until, u64::from(serial) | READY_BIT);
    }

    /// A message back from a lease at `now`: dead-lettered once it has had
    /// `max_deliveries` deliveries, else ready again (at once or after its nack delay).
    pub(crate) fn come_back(&mut self, q: Q, serial: Serial, now: Tick, how: Back) {
        let attempt = self.msgs[serial as usize].attempt;
        let max = self.queues[q as usize].config.max_deliveries;
        if max.is_some_and(|max| attempt >= max) {
            self.dead_letter(q, serial, DeathReason::MaxDeliveries);
            return;
        }
        match how {
            Back::Expired | Back::Nacked(0) => self.make_ready(q, serial, true),
            Back::Nacked(delay) => self.make_delayed(q, serial, now + delay),
        }
    }

    /// Adds a live message to its queue's members.
    pub(crate) fn join(&mut self, q: Q, serial: Serial) {
        let rec = &mut self.queues[q as usize];
        self.msgs[serial as usize].slot = rec.members.len() as u32;
        rec.members.push(serial);
    }

    /// Takes a message out of its queue for good (acked, dead-lettered); its id stops being
    /// live there.
    pub(crate) fn leave(&mut self, q: Q, serial: Serial, now: Tick) {
        let slot = self.msgs[serial as usize].slot as usize;
        let rec = &mut self.queues[q as usize];
        debug_assert_eq!(rec.members[slot], serial);
        rec.members.swap_remove(slot);
        if let Some(&moved) = rec.members.get(slot) {
            self.msgs[moved as usize].slot = slot as u32;
        }
        if let super::IdRec::Given(n) = self.msgs[serial as usize].id {
            if let Some(d) = rec.dedup.get_mut(&n) {
                d.live = false;
                if d.until <= now {
                    rec.dedup.remove(&n);
                }
            }
        }
    }

    /// A message leaves its queue as a dead letter.
    pub(crate) fn dead_letter(&mut self, q: Q, serial: Serial, reason: DeathReason) {
        let now = self.shard_now[usize::from(self.queues[q as usize].shard)];
        let rec = &self.queues[q as usize];
        // A durable queue keeps a dead letter's id live until the outcome comes back: put
        // again meanwhile, a crash could bring back both (see `Ledger::dying`).
        let kept = match self.msgs[serial as usize].id {
            super::IdRec::Given(n) if rec.config.durable && rec.dead_letter.is_some() => {
                rec.dedup.get(&n).map(|d| (n, *d))
            }
            _ => None,
        };
        self.leave(q, serial, now);
        if let Some((n, d)) = kept {
            self.queues[q as usize].dedup.insert(n, d);
        }
        let m = &self.msgs[serial as usize];
        let death = DeathRecord {
            queue: self.setup.name(self.queues[q as usize].name).to_string(),
            reason,
            attempts: m.attempt,
        };
        if self.queues[q as usize].dead_letter.is_some() {
            self.letters.push(ExpectedLetter {
                serial,
                from: q,
                death,
            });
            self.msgs[serial as usize].place = Place::InFlight { from: q };
        } else {
            self.queues[q as usize].stats.dropped += 1;
            self.stats.dropped += 1;
            self.msgs[serial as usize].place = Place::Dropped { from: q };
        }
    }

    /// Enqueues a message that passed every check, at `now`: fresh, with its id live.
    pub(crate) fn enqueue(&mut self, q: Q, serial: Serial, now: Tick, delay: Tick) {
        self.join(q, serial);
        let rec = &mut self.queues[q as usize];
        rec.stats.enqueued += 1;
        if let super::IdRec::Given(n) = self.msgs[serial as usize].id {
            let until = now + rec.dedup_ticks;
            let by = serial;
            let visit = self.msgs[serial as usize].entered.len();
            rec.dedup.insert(
                n,
                Dedup {
                    live: true,
                    until,
                    by,
                    visit,
                },
            );
        }
        let m = &mut self.msgs[serial as usize];
        m.attempt = 0;
        m.entered.push(q);
        m.client.floor = 0;
        m.client.peak = 0;
        m.client.delay = None;
        if delay == 0 {
            self.make_ready(q, serial, false);
        } else {
            self.make_delayed(q, serial, now + delay);
        }
    }

    /// Whether `m<n>` counts as a duplicate in `q` at `now`: live there, or first enqueued
    /// less than `dedup_window` ago.
    pub(crate) fn is_duplicate(&self, q: Q, n: u32, now: Tick) -> bool {
        self.queues[q as usize]
            .dedup
            .get(&n)
            .is_some_and(|d| d.live || now < d.until)
    }

    /// While `q` has a ready message and a consumer with credit, the next delivery of `q` in
    /// the effects must hand one over; checks it and records the lease, made at `at`.
    /// `in_command` turns on the check that returned messages go before fresh ones (within
    /// a tick of timers, the engine's order among equal deadlines is its own).
    pub(crate) fn dispatch(
        &mut self,
        obs: &Obs,
        q: Q,
        at: Tick,
        in_command: bool,
    ) -> Result<(), Violation> {
        loop {
            let rec = &self.queues[q as usize];
            if rec.ready == 0 || rec.free == 0 {
                return Ok(());
            }
            let Some((c, d)) = self.take_delivery(obs, q) else {
                let rec = &self.queues[q as usize];
                return Err(Violation::new(
                    "missing-delivery",
                    format!(
                        "at tick {at} queue {} has {} ready message(s) and {} free credit, \
                         but the engine delivered nothing more",
                        self.qname(q),
                        rec.ready,
                        rec.free
                    ),
                ));
            };
            self.lease(q, c, d, at, in_command)?;
        }
    }

    /// Checks one delivery against the ledger and records its lease.
    fn lease(
        &mut self,
        q: Q,
        c: C,
        d: &Delivered,
        at: Tick,
        in_command: bool,
    ) -> Result<(), Violation> {
        let (serial, returned) = self.check_delivery(q, c, d, in_command)?;
        let tag = d.tag.0;
        let rec = &mut self.queues[q as usize];
        rec.ready -= 1;
        rec.returned -= usize::from(returned);
        rec.free -= 1;
        rec.last_tag = tag;
        rec.stats.delivered += 1;
        let deadline = at + rec.ack;
        rec.leases.insert(
            tag,
            LeaseRec {
                serial,
                consumer: c,
                deadline,
                delivered_at: at,
            },
        );
        self.schedule(q, deadline, tag);
        self.consumers[c as usize].held += 1;
        let m = &mut self.msgs[serial as usize];
        m.attempt += 1;
        m.client.peak = m.client.peak.max(m.attempt);
        m.place = Place::Leased {
            q,
            tag,
            consumer: c,
        };
        self.stats.deliveries += 1;
        if m.attempt > 1 {
            self.stats.redeliveries += 1;
        }
        Ok(())
    }

    /// What a delivery must be: a message ready in `q`, to a consumer with credit, under a new
    /// tag, with the right attempt, death record and id. Returns the message and whether it
    /// had come back.
    fn check_delivery(
        &mut self,
        q: Q,
        c: C,
        d: &Delivered,
        in_command: bool,
    ) -> Result<(Serial, bool), Violation> {
        let serial = self.delivered_copy(q, d)?;
        self.check_credit(q, c, serial)?;
        let returned = self.check_ready(q, d, serial)?;
        self.check_order(q, d, serial, returned, in_command)?;
        self.check_attempt_and_death(d, serial)?;
        self.check_id(serial, &d.id)?;
        Ok((serial, returned))
    }

    /// The message delivery `d` from `q` hands over, among the copies of its body.
    fn delivered_copy(&self, q: Q, d: &Delivered) -> Result<Serial, Violation> {
        // Copies of a message (a hop sent again after a crash) share its body and may be
        // ready in one queue at the same attempt. Their death records can still differ
        // (the first hop rejected, the restart's for its last delivery), and one may have
        // come back while the other is fresh: a delivery is taken for the copy it fits
        // best (a returned one first, as the engine hands those out first), and the checks
        // below report one that fits none.
        let ready_here = |m: &super::MsgRec| {
            matches!(m.place, Place::Ready { q: at, .. } if at == q) && m.attempt + 1 == d.attempt
        };
        let exact = |m: &super::MsgRec| ready_here(m) && m.death.as_ref() == d.death.as_deref();
        let returned =
            |m: &super::MsgRec| exact(m) && matches!(m.place, Place::Ready { returned: true, .. });
        Ok(match self.find_copy(&d.body, returned)? {
            Some(s) => s,
            None => match self.find_copy(&d.body, exact)? {
                Some(s) => s,
                None => self.pick_copy(&d.body, ready_here)?,
            },
        })
    }

    /// Consumer `c` of `q` had credit for message `serial`: it held less than its prefetch.
    fn check_credit(&self, q: Q, c: C, serial: Serial) -> Result<(), Violation> {
        let consumer = &self.consumers[c as usize];
        if consumer.held >= consumer.prefetch {
            return Err(Violation::new(
                "prefetch",
                format!(
                    "{} went to consumer {:?} of {}, which holds {} of its prefetch {}",
                    self.describe(serial),
                    consumer.name,
                    self.qname(q),
                    consumer.held,
                    consumer.prefetch
                ),
            ));
        }
        Ok(())
    }

    /// Message `serial`, delivered from `q` under `d`'s tag, was ready there: whether it had
    /// come back.
    fn check_ready(&self, q: Q, d: &Delivered, serial: Serial) -> Result<bool, Violation> {
        match self.msgs[serial as usize].place {
            Place::Ready { q: at_q, returned } if at_q == q => Ok(returned),
            Place::Leased { .. } => Err(Violation::new(
                "lease-overlap",
                format!(
                    "tag {} delivered {} while that lease is live",
                    d.tag.0,
                    self.describe(serial)
                ),
            )),
            _ => Err(Violation::new(
                "delivery",
                format!(
                    "tag {} of {} delivered {}, which is not ready there",
                    d.tag.0,
                    self.qname(q),
                    self.describe(serial)
                ),
            )),
        }
    }

    /// `q` delivered message `serial` in order: not fresh while messages that came back
    /// were ready (checked in a command only), and under a tag past its last.
    fn check_order(
        &self,
        q: Q,
        d: &Delivered,
        serial: Serial,
        returned: bool,
        in_command: bool,
    ) -> Result<(), Violation> {
        let rec = &self.queues[q as usize];
        if in_command && !returned && rec.returned > 0 {
            return Err(Violation::new(
                "order",
                format!(
                    "{} delivered fresh {} while {} message(s) that came back were ready",
                    self.qname(q),
                    self.describe(serial),
                    rec.returned
                ),
            ));
        }
        if d.tag.0 <= rec.last_tag {
            return Err(Violation::new(
                "tag-order",
                format!(
                    "{} delivered tag {} after tag {}",
                    self.qname(q),
                    d.tag.0,
                    rec.last_tag
                ),
            ));
        }
        Ok(())
    }

    /// Delivery `d` of message `serial` carries the attempt after its last and the death
    /// record it has.
    fn check_attempt_and_death(&self, d: &Delivered, serial: Serial) -> Result<(), Violation> {
        let m = &self.msgs[serial as usize];
        if d.attempt != m.attempt + 1 {
            return Err(Violation::new(
                "attempt",
                format!(
                    "{} delivered with attempt {}, expected {}",
                    self.describe(serial),
                    d.attempt,
                    m.attempt + 1
                ),
            ));
        }
        if d.death.as_deref() != m.death.as_ref() {
            return Err(Violation::new(
                "death",
                format!(
                    "{} delivered with death record {:?}, expected {:?}",
                    self.describe(serial),
                    d.death,
                    m.death
                ),
            ));
        }
        Ok(())
    }
}
