//! The ledger's books started again after a restart, from what the restored shards hold
//! (the checks before it are in `crash.rs`).

use leasemq_engine::MsgId;

use super::{
    Dedup, IdRec, Ledger, Place, Restart, RestoredMsg, RestoredQueue, Serial, Q, RESTORED,
};
use crate::Violation;

impl Ledger {
    /// Every queue, consumer and message of the crashed broker is gone.
    pub(super) fn forget_the_crashed(&mut self) {
        for rec in &mut self.queues {
            rec.live = false;
            rec.consumers.clear();
            rec.free = 0;
            rec.leases.clear();
            rec.events.clear();
            rec.dedup.clear();
            rec.members.clear();
            (rec.ready, rec.returned, rec.delayed) = (0, 0, 0);
        }
        for c in &mut self.consumers {
            c.live = false;
            c.held = 0;
        }
        for m in &mut self.msgs {
            if matches!(
                m.place,
                Place::Ready { .. }
                    | Place::Delayed { .. }
                    | Place::Leased { .. }
                    | Place::InFlight { .. }
            ) {
                m.place = Place::Crashed;
            }
        }
        self.by_name.iter_mut().for_each(|q| *q = None);
        self.queue_slots.iter_mut().for_each(Vec::clear);
        self.consumer_slots.iter_mut().for_each(Vec::clear);
        self.seen_queue_keys.clear();
        self.seen_consumer_keys.clear();
        self.just_closed.clear();
        self.shard_now.iter_mut().for_each(|t| *t = 0);
        // A broker id may be given again after a restart unless a client saw it on a
        // message of a durable queue: one no client saw may never have reached the disk,
        // and queues in memory log nothing (contract §1: an id names a message inside its
        // queue; only a live one counts for deduplication).
        let msgs = &self.msgs;
        self.auto_ids
            .retain(|_, &mut s| msgs[s as usize].client.id_seen);
        self.log_numbers.clear();
        self.dying.clear();
    }

    /// A restored message (copy `serial` of `orig`) has broker id `n`: the one it had, and
    /// no other message's.
    pub(super) fn restored_auto_id(
        &mut self,
        orig: Serial,
        serial: Serial,
        n: u64,
    ) -> Result<(), Violation> {
        let bad = |what: String| Violation::new("restart-id", what);
        if let IdRec::Auto(Some(known)) = self.msgs[serial as usize].id {
            if known != n {
                return Err(bad(format!(
                    "{} came back with broker id {}",
                    self.describe(serial),
                    MsgId::Auto(n)
                )));
            }
        }
        if let Some(&other) = self.auto_ids.get(&n) {
            if other != orig {
                return Err(bad(format!(
                    "{} came back with broker id {}, which {} had",
                    self.describe(serial),
                    MsgId::Auto(n),
                    self.describe(other)
                )));
            }
        }
        self.auto_ids.insert(n, orig);
        self.msgs[serial as usize].id = IdRec::Auto(Some(n));
        Ok(())
    }

    /// One restored queue, old incarnation `old`, as a new incarnation.
    pub(super) fn rebuild(
        &mut self,
        r: &RestoredQueue,
        old: Q,
        at: Restart,
    ) -> Result<(), Violation> {
        let name = self
            .setup
            .name_index(&r.name)
            .expect("checked: a name of ours");
        let given = self.queues[old as usize].given_tag;
        let key = r.key.expect("checked: found by lookup");
        let q = self.new_queue(name, r.shard, key, r.config.clone())?;
        self.log_numbers.insert((r.shard, r.number), q);
        let rec = &mut self.queues[q as usize];
        rec.declared = true;
        rec.given_tag = given;
        rec.last_tag = given;
        let mut placed = Vec::new();
        for m in &r.msgs {
            let orig = self.serial_of(&m.body)?;
            let serial = self.restored_serial(orig);
            if let MsgId::Auto(n) = m.id {
                self.restored_auto_id(orig, serial, n)?;
            }
            let visit = self.restore_record(serial, q, m);
            let msg = &mut self.msgs[serial as usize];
            if let Some(seq) = m.dying {
                msg.place = Place::InFlight { from: q };
                if let IdRec::Given(n) = msg.id {
                    // Its id stays taken until the outcome, with the window the restored
                    // shard has for it (the one the enqueue on disk opened).
                    let d = Dedup {
                        live: true,
                        until: m.dedup_until.and_then(|t| at.tick_of(t)).unwrap_or(0),
                        by: serial,
                        visit,
                    };
                    self.queues[q as usize].dedup.insert(n, d);
                }
                self.dying.insert((r.shard, seq), serial);
                continue;
            }
            self.join(q, serial);
            match m.ready_at.and_then(|t| at.tick_of(t)) {
                Some(until) => self.make_delayed(q, serial, until),
                None => self.make_ready(q, serial, m.attempt > 0),
            }
            placed.push((serial, m));
        }
        for (serial, m) in placed {
            let msg = &self.msgs[serial as usize];
            if let IdRec::Given(n) = msg.id {
                let d = Dedup {
                    live: true,
                    until: m.dedup_until.and_then(|t| at.tick_of(t)).unwrap_or(0),
                    by: serial,
                    visit: msg.entered.len() - 1,
                };
                self.queues[q as usize].dedup.insert(n, d);
            }
        }
        self.restore_windows(q, r, at);
        Ok(())
    }

    /// The serial a message restored with `orig`'s body takes: `orig` itself while its place
    /// is still `Crashed`, else a new copy of it (the message is back in two queues).
    fn restored_serial(&mut self, orig: Serial) -> Serial {
        if self.msgs[orig as usize].place == Place::Crashed {
            orig
        } else {
            let serial = orig;
            // Back in two queues: the second copy is a message of its own.
            let copy = self.msgs.len() as Serial;
            let mut rec = self.msgs[serial as usize].clone();
            rec.entered.clear();
            self.msgs.push(rec);
            self.copies.entry(serial).or_default().push(copy);
            copy
        }
    }

    /// Sets message `serial`'s record to what the restored shard holds of it (`m`, now in
    /// queue `q`): its attempt and death record, a new visit to `q`, and what clients know
    /// of it started afresh, that visit known to be on disk. Returns the visit.
    fn restore_record(&mut self, serial: Serial, q: Q, m: &RestoredMsg) -> usize {
        let msg = &mut self.msgs[serial as usize];
        msg.attempt = m.attempt;
        msg.death = m.death.clone();
        msg.entered.push(q);
        let visit = msg.entered.len() - 1;
        msg.client = super::Client {
            put: true,
            acked_in: None,
            floor: m.attempt,
            peak: m.attempt,
            delay: m.ready_at,
            id_seen: msg.client.id_seen,
            known: vec![visit],
        };
        visit
    }

    /// The windows of ids whose message is gone, as restored queue `r` (new incarnation
    /// `q`) holds them: each still open after the restart keeps its id a duplicate.
    fn restore_windows(&mut self, q: Q, r: &RestoredQueue, at: Restart) {
        for (id, until) in &r.windows {
            let Some(n) = id.strip_prefix('m').and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(until) = at.tick_of(*until) {
                let d = Dedup {
                    live: false,
                    until,
                    by: RESTORED,
                    visit: 0,
                };
                self.queues[q as usize].dedup.entry(n).or_insert(d);
            }
        }
    }
}
