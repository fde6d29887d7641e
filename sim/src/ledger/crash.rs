//! The ledger across a crash (durable runs): what clients were told, checked against what
//! a restart brings back (contract §7 item by item), then the books started again from
//! what came back.
//!
//! Before a crash the ledger knows what the engine did; the clients know less, because
//! under `SyncPolicy::Always` an answer, a delivery or a hop caused by a logged change
//! waits for the fsync that covers it. The world tells the ledger when each is handed
//! over ([`Confirm`], [`Ledger::given_delivery`]), and that is what binds a restart: a put
//! answered `Enqueued` must be back unless settled away, an ack answered `true` must not
//! be, a delivery's attempt must not go back, tags must go on past every tag handed out.
//! What the engine did but nobody was told (a put whose record was still in memory, or
//! torn) may be back or not; the ledger then takes the restored shards' word for it.

use std::collections::HashMap;

use bytes::Bytes;
use leasemq_engine::{DeathRecord, MsgId, QueueConfig, QueueKey, Tick};

use super::{Ledger, Place, Serial, Q, RESTORED};
use crate::Violation;

/// What a client learns when an answer reaches it.
#[derive(Clone, Debug)]
pub(crate) enum Confirm {
    /// A put into a durable queue answered `Enqueued`, delayed until this log time.
    Put {
        serial: Serial,
        delay: Option<u64>,
    },
    /// An ack (or `ack_up_to`) answered `true` in this incarnation.
    Acked {
        serial: Serial,
        q: Q,
    },
    /// A `nack_with_delay` answered `true`: ready again at this log time.
    Delayed {
        serial: Serial,
        until: u64,
    },
    Declared {
        q: Q,
    },
    Closed {
        q: Q,
    },
}

/// A durable queue as a restarted shard has it (from `Shard::image`).
#[derive(Debug)]
pub(crate) struct RestoredQueue {
    pub shard: u16,
    /// Its number in the shard's log.
    pub number: u32,
    pub name: String,
    pub config: QueueConfig,
    /// What a lookup of its name answers on the restored shard.
    pub key: Option<QueueKey>,
    pub next_tag: u64,
    pub msgs: Vec<RestoredMsg>,
    /// Ids whose message is gone, with the log time their window ends.
    pub windows: Vec<(String, u64)>,
}

#[derive(Debug)]
pub(crate) struct RestoredMsg {
    pub body: Bytes,
    pub id: MsgId,
    pub attempt: u32,
    pub ready_at: Option<u64>,
    pub dedup_until: Option<u64>,
    pub death: Option<DeathRecord>,
    /// The restart dead-lettered it (it stays in its source until the outcome): the
    /// letter's number in its source queue, [`Origin::msg`](leasemq_engine::Origin::msg).
    pub dying: Option<u64>,
}

/// When the crash happened and when the broker came back, in log time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Restart {
    /// The log time of tick 0 before the crash.
    pub old_epoch: u64,
    /// The log time of tick 0 after the restart.
    pub epoch: u64,
    pub tick_nanos: u64,
}

impl Restart {
    /// The tick after the restart at which log time `t` falls, rounded up; `None` when it
    /// is not after tick 0 (as `Shard::finish_restore` counts it).
    pub(super) fn tick_of(&self, t: u64) -> Option<Tick> {
        let tick = t.checked_sub(self.epoch)?.div_ceil(self.tick_nanos);
        (tick > 0).then_some(tick)
    }
}

impl Ledger {
    /// An answer reached its client.
    pub fn confirm(&mut self, c: &Confirm) {
        match *c {
            Confirm::Put { serial, delay } => {
                let m = &mut self.msgs[serial as usize];
                m.client.put = true;
                m.client.delay = delay;
                m.client.know(0);
            }
            Confirm::Acked { serial, q } => self.msgs[serial as usize].client.acked_in = Some(q),
            Confirm::Delayed { serial, until } => {
                self.msgs[serial as usize].client.delay = Some(until);
            }
            Confirm::Declared { q } => self.queues[q as usize].declared = true,
            Confirm::Closed { q } => self.queues[q as usize].closed = true,
        }
    }

    /// The message of a delivery of queue `q` under `tag` that the ledger just checked,
    /// with how many queues it had entered then: a delivery handed over later counts for
    /// the message's attempts only if it has not moved on to another queue meanwhile.
    pub fn stint(&self, q: Q, tag: u64, body: &[u8]) -> Option<(Serial, usize)> {
        let serial = self
            .pick_copy(
                body,
                |m| matches!(m.place, Place::Leased { q: at, tag: t, .. } if at == q && t == tag),
            )
            .ok()?;
        Some((serial, self.msgs[serial as usize].entered.len()))
    }

    /// A delivery of queue `q` reached its consumer's channel.
    pub fn given_delivery(&mut self, q: Q, tag: u64, attempt: u32, stint: Option<(Serial, usize)>) {
        let durable = self.queues[q as usize].config.durable;
        let rec = &mut self.queues[q as usize];
        rec.given_tag = rec.given_tag.max(tag);
        let Some((serial, entered)) = stint else {
            return;
        };
        let m = &mut self.msgs[serial as usize];
        m.client.id_seen |= durable;
        let visit = entered - 1;
        if durable && m.entered.get(visit) == Some(&q) {
            m.client.know(visit);
        }
        if m.entered.len() == entered && m.entered.last() == Some(&q) {
            m.client.floor = attempt;
            m.client.delay = None;
        }
    }

    /// The engine logged the declare of incarnation `q` under `number` on `shard`.
    pub fn logged_declare(&mut self, shard: u16, number: u32, q: Q) {
        self.log_numbers.insert((shard, number), q);
    }

    /// Checks what came back after a crash against what clients were told, then starts
    /// the books again from it: every queue and consumer of the crashed broker is gone,
    /// each restored queue is a new incarnation holding what the restart brought back,
    /// and what the restart dead-lettered ([`RestoredMsg::dying`]) is in flight.
    pub fn restart(
        &mut self,
        restored: &[RestoredQueue],
        dropped: &[(u16, u32)],
        at: Restart,
    ) -> Result<(), Violation> {
        let found = self.check_restored(restored, at)?;
        self.check_survivors(restored, &found, at)?;
        let olds: Vec<Q> = restored
            .iter()
            .map(|r| self.log_numbers[&(r.shard, r.number)])
            .collect();
        self.forget_the_crashed();
        for (r, old) in restored.iter().zip(olds) {
            self.rebuild(r, old, at)?;
            let n = dropped
                .iter()
                .filter(|&&d| d == (r.shard, r.number))
                .count() as u64;
            let q = self.log_numbers[&(r.shard, r.number)];
            self.queues[q as usize].stats.dropped += n;
            self.stats.dropped += n;
        }
        Ok(())
    }

    /// §7 items 1, 2 (upper bound), 3, 5 per restored queue; returns, per serial, the old
    /// incarnations it came back in.
    fn check_restored(
        &self,
        restored: &[RestoredQueue],
        at: Restart,
    ) -> Result<HashMap<Serial, Vec<Q>>, Violation> {
        let mut found: HashMap<Serial, Vec<Q>> = HashMap::new();
        for r in restored {
            let bad = |what: String| {
                Violation::new(
                    "restart",
                    format!("queue {:?} (log number {}): {what}", r.name, r.number),
                )
            };
            let Some(&old) = self.log_numbers.get(&(r.shard, r.number)) else {
                return Err(bad("came back, but no durable queue was declared so".into()));
            };
            let rec = &self.queues[old as usize];
            if !rec.config.durable || self.setup.name(rec.name) != r.name {
                return Err(bad(format!("came back as {}", self.qname(old))));
            }
            if rec.config != r.config {
                return Err(bad(format!(
                    "came back with config {:?}, it was declared with {:?}",
                    r.config, rec.config
                )));
            }
            if rec.closed {
                return Err(bad("came back, though its close was answered".into()));
            }
            if r.key.is_none() {
                return Err(bad(
                    "is in the image, but a lookup of its name finds nothing".into(),
                ));
            }
            // §7.5: every tag after the restart is greater than every tag handed out.
            if r.next_tag <= rec.given_tag {
                return Err(bad(format!(
                    "its next tag is {}, tag {} was handed out before the crash",
                    r.next_tag, rec.given_tag
                )));
            }
            for m in &r.msgs {
                let serial = self.serial_of(&m.body)?;
                if !self
                    .group(serial)
                    .any(|s| self.msgs[s as usize].entered.contains(&old))
                {
                    return Err(bad(format!(
                        "{} came back in it, where it was never enqueued",
                        self.describe(serial)
                    )));
                }
                let copies = self.copies.contains_key(&serial);
                let listed = found.entry(serial).or_default();
                if listed.contains(&old) && !copies {
                    return Err(bad(format!("{} came back twice", self.describe(serial))));
                }
                listed.push(old);
                self.check_restored_message(serial, old, m, at)
                    .map_err(bad)?;
            }
        }
        Ok(found)
    }

    /// One restored message against what its clients were told (§7 items 2 and 3).
    fn check_restored_message(
        &self,
        serial: Serial,
        old: Q,
        m: &RestoredMsg,
        at: Restart,
    ) -> Result<(), String> {
        let msg = &self.msgs[serial as usize];
        let copies = 1 + self.copies.get(&serial).map_or(0, Vec::len);
        if copies == 1 && msg.client.acked_in == Some(old) {
            return Err(format!(
                "{} came back, though its ack was answered true",
                self.describe(serial)
            ));
        }
        let here = msg.entered.last() == Some(&old);
        if !here || copies > 1 {
            return Ok(());
        }
        if m.attempt < msg.client.floor {
            return Err(format!(
                "{} came back at attempt {}, it had been delivered at attempt {}",
                self.describe(serial),
                m.attempt,
                msg.client.floor
            ));
        }
        // Delays end at the same instant of log time: one that ends after the restart is
        // still pending (one that ended while the broker was down is ready at once).
        if let Some(until) = msg.client.delay.filter(|&u| u > at.epoch) {
            if m.ready_at != Some(until) {
                return Err(format!(
                    "{} was delayed until log time {until}, it came back ready at {:?}",
                    self.describe(serial),
                    m.ready_at
                ));
            }
        }
        // Its death record is the one of its arrival here, if that arrival is known to be
        // on disk: a message that went round a cycle of dead-letter queues may come back
        // as it was on an earlier stay here, with that stay's record.
        let last_known = msg.client.known.contains(&(msg.entered.len() - 1));
        if let (Some(d), Some(got), true) = (&msg.death, &m.death, last_known) {
            if d != got {
                return Err(format!(
                    "{} came back with death record {got:?}, it died with {d:?}",
                    self.describe(serial)
                ));
            }
        }
        Ok(())
    }

    /// §7 items 1, 2 (lower bound) and 4, and dead letters at least once: what clients
    /// were told is there must be there.
    fn check_survivors(
        &self,
        restored: &[RestoredQueue],
        found: &HashMap<Serial, Vec<Q>>,
        at: Restart,
    ) -> Result<(), Violation> {
        let by_old: HashMap<Q, &RestoredQueue> = restored
            .iter()
            .filter_map(|r| Some((*self.log_numbers.get(&(r.shard, r.number))?, r)))
            .collect();
        self.check_queues_back(&by_old)?;
        self.check_messages_back(&by_old, found)?;
        self.check_windows_kept(&by_old, at)
    }

    /// Every durable queue declared and not closed is back (`by_old`: the restored queues
    /// by their old incarnation).
    fn check_queues_back(&self, by_old: &HashMap<Q, &RestoredQueue>) -> Result<(), Violation> {
        for (q, rec) in self.queues.iter().enumerate() {
            let q = q as Q;
            if rec.live && rec.config.durable && rec.declared && !by_old.contains_key(&q) {
                return Err(Violation::new(
                    "restart-lost-queue",
                    format!(
                        "{} was declared and not closed, a restart lost it",
                        self.qname(q)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every message whose put was answered `Enqueued` and that no client settled away is
    /// back (`found`: the queues each serial came back in), unless the crash may drop it.
    fn check_messages_back(
        &self,
        by_old: &HashMap<Q, &RestoredQueue>,
        found: &HashMap<Serial, Vec<Q>>,
    ) -> Result<(), Violation> {
        let copied: std::collections::HashSet<Serial> = self
            .copies
            .iter()
            .flat_map(|(&s, copies)| std::iter::once(s).chain(copies.iter().copied()))
            .collect();
        for (serial, m) in self.msgs.iter().enumerate() {
            let serial = serial as Serial;
            let home = match m.place {
                Place::Ready { q, .. } | Place::Delayed { q, .. } | Place::Leased { q, .. } => q,
                Place::InFlight { from } => from,
                _ => continue,
            };
            // Leased at the crash after its last allowed delivery (as the disk has it: a
            // release or nack since may not be there), with no dead-letter queue: the
            // restart drops it, as an expiry would (contract §7).
            let config = &self.queues[home as usize].config;
            let spent = config.dead_letter.is_none()
                && config
                    .max_deliveries
                    .is_some_and(|max| m.client.peak >= max);
            // A dead letter's source closed since: gone with it, unless the restart lost
            // the close (and brought the source back).
            let gone = |q: Q| !self.queues[q as usize].live && !by_old.contains_key(&q);
            // So with a dead letter whose source closed before its copy was known to be on
            // disk: nothing protects that copy (the close removed the source's).
            let source = match m.place {
                Place::InFlight { from } => Some(from),
                _ if m.death.is_some() => m.entered.len().checked_sub(2).map(|i| m.entered[i]),
                _ => None,
            };
            // And with a message whose last queue known to hold it on disk closed since:
            // the queues it went on to (dead letters no client saw arrive) may all be
            // lost with the crash.
            let known = m.client.known.iter().max().and_then(|&v| m.entered.get(v));
            let closed = gone(home) || source.is_some_and(gone) || known.is_some_and(|&q| gone(q));
            let must = m.client.put && m.client.acked_in.is_none() && !spent && !closed;
            if !must || copied.contains(&serial) {
                continue;
            }
            let back = found.get(&serial).map_or(&[][..], Vec::as_slice);
            // A dead letter may be back in its source or its dead-letter queue, or both.
            let dying = matches!(m.place, Place::InFlight { .. }) || m.death.is_some();
            let ok = if dying {
                !back.is_empty()
            } else {
                back.contains(&home)
            };
            if !ok {
                return Err(Violation::new(
                    "restart-lost-message",
                    format!(
                        "{}: its put was answered Enqueued, a restart lost it (back in {:?})",
                        self.describe(serial),
                        back.iter().map(|&q| self.qname(q)).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every answered put's id is still a duplicate on its restored queue until its window
    /// ends.
    fn check_windows_kept(
        &self,
        by_old: &HashMap<Q, &RestoredQueue>,
        at: Restart,
    ) -> Result<(), Violation> {
        // §7.4: an answered put's id stays a duplicate for its window, in wall-clock time:
        // the window an enqueue known to be on disk opened (the put's, or a dead letter's
        // arrival a client saw). A dead letter no client saw arrive may be lost with the
        // crash, window and all: the message is then back where it came from.
        for (&q, r) in by_old {
            let rec = &self.queues[q as usize];
            for (&n, d) in &rec.dedup {
                let confirmed = d.by == RESTORED || {
                    let m = &self.msgs[d.by as usize];
                    m.client.known.contains(&d.visit) || m.client.acked_in == Some(q)
                };
                let until = at.old_epoch + d.until * at.tick_nanos;
                if !confirmed || d.live || until <= at.epoch {
                    continue;
                }
                let id = format!("m{n}");
                let kept = r.windows.iter().any(|(w, u)| *w == id && *u >= until)
                    || r.msgs.iter().any(|m| {
                        matches!(&m.id, MsgId::Given(g) if **g == *id)
                            && m.dedup_until >= Some(until)
                    });
                if !kept {
                    return Err(Violation::new(
                        "restart-dedup",
                        format!(
                            "{}: the window of id {id} ends at log time {until}, after the \
                             restart it is gone",
                            self.qname(q)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A serial and its copies.
    pub(super) fn group(&self, serial: Serial) -> impl Iterator<Item = Serial> + '_ {
        std::iter::once(serial).chain(self.copies.get(&serial).into_iter().flatten().copied())
    }
}
