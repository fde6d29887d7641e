//! The checks after every step: the engine's stats against the ledger's counts, and the
//! ledger's own books (every live message in exactly one place of one queue).

use leasemq_engine::{QueueStats, Shard, Tick};

use super::{Ledger, Place, Q};
use crate::Violation;

impl Ledger {
    /// What `stats()` of live queue `q` must say.
    pub(crate) fn expected_stats(&self, q: Q) -> QueueStats {
        let rec = &self.queues[q as usize];
        QueueStats {
            ready: rec.ready,
            delayed: rec.delayed,
            leased: rec.leases.len(),
            consumers: rec.consumers.len(),
            ..rec.stats.clone()
        }
    }

    /// Every live queue's stats equal the ledger's, gauges and counters; a queue closed
    /// since the last audit has none; each shard's clock is where the ledger put it.
    pub fn audit(&mut self, shards: &[Shard]) -> Result<(), Violation> {
        for (s, shard) in shards.iter().enumerate() {
            if shard.now() != self.shard_now[s] {
                return Err(Violation::new(
                    "clock",
                    format!(
                        "shard {s} is at tick {}, it was last handed {}",
                        shard.now(),
                        self.shard_now[s]
                    ),
                ));
            }
        }
        for q in 0..self.queues.len() as Q {
            let rec = &self.queues[q as usize];
            if !rec.live {
                continue;
            }
            self.recount(q)?;
            let expected = self.expected_stats(q);
            match shards[usize::from(rec.shard)].stats(rec.key) {
                Some(got) if got == expected => {}
                Some(got) => {
                    return Err(Violation::new(
                        "stats",
                        format!(
                            "{} at tick {}: {}",
                            self.qname(q),
                            self.shard_now[usize::from(rec.shard)],
                            diff(&expected, &got)
                        ),
                    ))
                }
                None => {
                    return Err(Violation::new(
                        "stats",
                        format!("{} is live, the engine has no stats for it", self.qname(q)),
                    ))
                }
            }
        }
        for (s, shard) in shards.iter().enumerate() {
            self.check_next_deadline(s, shard.now(), shard.next_deadline())?;
        }
        for q in std::mem::take(&mut self.just_closed) {
            let rec = &self.queues[q as usize];
            if let Some(got) = shards[usize::from(rec.shard)].stats(rec.key) {
                return Err(Violation::new(
                    "stats",
                    format!(
                        "{} was closed, its stats are still there: {got:?}",
                        self.qname(q)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `next_deadline` is when the runtime wakes the shard: no later than the earliest
    /// deadline the ledger knows there (a lease, a delayed message, a dedup window), after
    /// `now` (every timer due by `now` has fired), and `None` only with no timer pending.
    fn check_next_deadline(
        &mut self,
        s: usize,
        now: Tick,
        next: Option<Tick>,
    ) -> Result<(), Violation> {
        let mut earliest: Option<Tick> = None;
        for q in 0..self.queues.len() as Q {
            let rec = &self.queues[q as usize];
            if !rec.live || usize::from(rec.shard) != s {
                continue;
            }
            let windows = rec
                .dedup
                .values()
                .map(|d| d.until)
                .filter(|&t| t > now)
                .min();
            let timer = self.next_event(q);
            for t in [windows, timer].into_iter().flatten() {
                earliest = Some(earliest.map_or(t, |e: Tick| e.min(t)));
            }
        }
        let problem = match (next, earliest) {
            (Some(d), _) if d <= now => Some("is not after now"),
            (None, Some(_)) => Some("is None"),
            (Some(d), Some(e)) if d > e => Some("is later than the earliest deadline"),
            _ => None,
        };
        match problem {
            Some(problem) => Err(Violation::new(
                "next-deadline",
                format!(
                    "shard {s} at tick {now}: next_deadline() = {next:?} {problem}; the \
                     earliest deadline the ledger knows there is {earliest:?}"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The ledger's books for live queue `q`: each member is ready, delayed or leased there,
    /// the counts agree, every lease is a member's, and credit adds up.
    fn recount(&self, q: Q) -> Result<(), Violation> {
        let rec = &self.queues[q as usize];
        let (mut ready, mut returned, mut delayed, mut leased) = (0, 0, 0, 0);
        for (slot, &serial) in rec.members.iter().enumerate() {
            let m = &self.msgs[serial as usize];
            let ok = m.slot as usize == slot
                && match m.place {
                    Place::Ready { q: at, returned: r } if at == q => {
                        ready += 1;
                        returned += usize::from(r);
                        true
                    }
                    Place::Delayed { q: at, .. } if at == q => {
                        delayed += 1;
                        true
                    }
                    Place::Leased { q: at, tag, .. } if at == q => {
                        leased += 1;
                        rec.leases.get(&tag).is_some_and(|l| l.serial == serial)
                    }
                    _ => false,
                };
            if !ok {
                return Err(self.placement(format!(
                    "{} is listed in {} but is not live there",
                    self.describe(serial),
                    self.qname(q)
                )));
            }
        }
        let counted = (ready, returned, delayed, leased);
        let kept = (rec.ready, rec.returned, rec.delayed, rec.leases.len());
        if counted != kept {
            return Err(self.placement(format!(
                "{}: members count (ready, returned, delayed, leased) = {counted:?}, \
                 the books say {kept:?}",
                self.qname(q)
            )));
        }
        let mut free = 0;
        for &c in &rec.consumers {
            let consumer = &self.consumers[c as usize];
            let held = rec.leases.values().filter(|l| l.consumer == c).count();
            if held != consumer.held as usize || consumer.held > consumer.prefetch {
                return Err(self.placement(format!(
                    "consumer {:?} of {} holds {held} leases, the books say {} (prefetch {})",
                    consumer.name,
                    self.qname(q),
                    consumer.held,
                    consumer.prefetch
                )));
            }
            free += u64::from(consumer.prefetch - consumer.held);
        }
        if free != rec.free {
            return Err(self.placement(format!(
                "{}: free credit is {free}, the books say {}",
                self.qname(q),
                rec.free
            )));
        }
        Ok(())
    }

    fn placement(&self, detail: String) -> Violation {
        Violation::new("placement", detail)
    }

    /// At the end of a run, with nothing in flight: every message ever put is in exactly one
    /// place, and a live one is among its live queue's members.
    pub fn final_check(&self) -> Result<(), Violation> {
        let mut live = 0;
        for (serial, m) in self.msgs.iter().enumerate() {
            let q = match m.place {
                Place::Ready { q, .. } | Place::Delayed { q, .. } | Place::Leased { q, .. } => q,
                Place::InFlight { .. } => {
                    return Err(self.placement(format!(
                        "{} is still in flight after every message was delivered",
                        self.describe(serial as u32)
                    )))
                }
                _ => continue,
            };
            live += 1;
            let rec = &self.queues[q as usize];
            let listed = rec.live && rec.members.get(m.slot as usize) == Some(&(serial as u32));
            if !listed {
                return Err(self.placement(format!(
                    "{} is not among the members of {}",
                    self.describe(serial as u32),
                    self.qname(q)
                )));
            }
        }
        let members: usize = self.queues.iter().map(|q| q.members.len()).sum();
        if members != live {
            return Err(self.placement(format!("{live} live messages, {members} queue members")));
        }
        Ok(())
    }
}

/// The fields in which two stats differ.
fn diff(expected: &QueueStats, got: &QueueStats) -> String {
    let mut out = Vec::new();
    macro_rules! fields {
        ($($f:ident),*) => {$(
            if expected.$f != got.$f {
                out.push(format!(
                    "{} is {} (ledger: {})",
                    stringify!($f),
                    got.$f,
                    expected.$f
                ));
            }
        )*};
    }
    fields!(
        ready,
        delayed,
        leased,
        consumers,
        enqueued,
        duplicates,
        delivered,
        acked,
        nacked,
        rejected,
        released,
        expired,
        dead_lettered,
        dropped,
        stale
    );
    out.join(", ")
}

impl Ledger {
    /// Forgets one ready message, as a bug in the books would: for the planted-fault tests.
    pub(crate) fn forget_ready(&mut self) -> bool {
        for q in 0..self.queues.len() as Q {
            let rec = &self.queues[q as usize];
            if !rec.live {
                continue;
            }
            let found = rec.members.iter().copied().find(|&s| {
                matches!(
                    self.msgs[s as usize].place,
                    Place::Ready {
                        returned: false,
                        ..
                    }
                )
            });
            if let Some(serial) = found {
                let now = self.shard_now[usize::from(rec.shard)];
                self.queues[q as usize].ready -= 1;
                self.leave(q, serial, now);
                self.msgs[serial as usize].place = Place::Acked { q };
                return true;
            }
        }
        false
    }
}
