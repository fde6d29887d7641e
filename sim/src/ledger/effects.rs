//! Checking what one engine call put out against the ledger: ids, replies, dead letters,
//! their outcomes and the consumers that ended.

use leasemq_engine::{DeadLetter, Effects, MsgId, Reply};

use super::{ExpectedLetter, IdRec, Ledger, Obs, Place, Serial, Q};
use crate::Violation;

impl Ledger {
    /// The serial a body carries, checked against what was put.
    pub(crate) fn serial_of(&self, body: &[u8]) -> Result<Serial, Violation> {
        let serial = body
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .filter(|&s| s < self.msgs.len() as u64)
            .ok_or_else(|| {
                Violation::new(
                    "delivery",
                    format!("a body no producer put: {:?}", &body[..body.len().min(16)]),
                )
            })? as Serial;
        if self.msgs[serial as usize].body_len != body.len() {
            return Err(Violation::new(
                "delivery",
                format!(
                    "message #{serial} came back with {} body bytes, {} were put",
                    body.len(),
                    self.msgs[serial as usize].body_len
                ),
            ));
        }
        Ok(serial)
    }

    /// The serial of the copy of `body` that fits `fits`, or the first copy: a
    /// crash may have left one message in two queues (see `Ledger::copies`).
    pub(crate) fn pick_copy(
        &self,
        body: &[u8],
        fits: impl Fn(&super::MsgRec) -> bool,
    ) -> Result<Serial, Violation> {
        Ok(self.find_copy(body, fits)?.unwrap_or(self.serial_of(body)?))
    }

    /// The serial of the copy of `body` that fits `fits`, if one does.
    pub(crate) fn find_copy(
        &self,
        body: &[u8],
        fits: impl Fn(&super::MsgRec) -> bool,
    ) -> Result<Option<Serial>, Violation> {
        Ok(self
            .group(self.serial_of(body)?)
            .find(|&s| fits(&self.msgs[s as usize])))
    }

    /// The message a copy is a copy of (itself if none).
    pub(crate) fn original(&self, serial: Serial) -> Serial {
        self.copies
            .iter()
            .find(|(_, copies)| copies.contains(&serial))
            .map_or(serial, |(&s, _)| s)
    }

    /// The serial of a dead letter: the copy in flight from its origin.
    pub(crate) fn letter_serial(&self, letter: &DeadLetter) -> Result<Serial, Violation> {
        self.pick_copy(&letter.body, |m| match m.place {
            Place::InFlight { from } => {
                let rec = &self.queues[from as usize];
                rec.shard == letter.origin.shard && rec.key == letter.origin.queue
            }
            _ => false,
        })
    }

    pub(crate) fn describe_body(&self, body: &[u8]) -> String {
        match self.serial_of(body) {
            Ok(s) => self.describe(s),
            Err(_) => "an unknown body".into(),
        }
    }

    /// A message as a person reads it in a failure.
    pub(crate) fn describe(&self, serial: Serial) -> String {
        let m = &self.msgs[serial as usize];
        let id = match m.id {
            IdRec::Given(n) => format!("id m{n}"),
            IdRec::Auto(Some(n)) => format!("broker id {}", MsgId::Auto(n)),
            IdRec::Auto(None) => "a broker id".into(),
            IdRec::Invalid => "an invalid id".into(),
        };
        let place = match m.place {
            Place::Ready { q, .. } => format!("ready in {}", self.qname(q)),
            Place::Delayed { q, until } => format!("delayed in {} until {until}", self.qname(q)),
            Place::Leased { q, tag, .. } => format!("leased in {} as tag {tag}", self.qname(q)),
            Place::Acked { q } => format!("acked in {}", self.qname(q)),
            Place::InFlight { from } => {
                format!("a dead letter in flight from {}", self.qname(from))
            }
            Place::Dropped { from } => format!("dropped by {}", self.qname(from)),
            Place::Closed { q } => format!("removed by the close of {}", self.qname(q)),
            Place::NotEnqueued => "never enqueued".into(),
            Place::Crashed => "gone with a crash".into(),
        };
        format!("message #{serial} ({id}, attempt {}, {place})", m.attempt)
    }

    /// A queue incarnation as a person reads it.
    pub(crate) fn qname(&self, q: Q) -> String {
        let rec = &self.queues[q as usize];
        format!("{}#{}", self.setup.name(rec.name), q)
    }

    /// Checks a delivered or dead-lettered id against the message's, learning broker ids.
    pub(crate) fn check_id(&mut self, serial: Serial, id: &MsgId) -> Result<(), Violation> {
        let m = &self.msgs[serial as usize];
        let ok = match (m.id, id) {
            (IdRec::Given(n), MsgId::Given(text)) => text
                .strip_prefix('m')
                .and_then(|t| t.parse::<u32>().ok())
                .is_some_and(|k| k == n && text.len() == format!("m{n}").len()),
            (IdRec::Auto(Some(known)), MsgId::Auto(got)) => known == *got,
            (IdRec::Auto(None), MsgId::Auto(got)) => {
                if *got >> 48 != u64::from(m.born_on) {
                    return Err(Violation::new(
                        "delivery",
                        format!(
                            "{} was put on shard {}, its broker id {id} names another",
                            self.describe(serial),
                            m.born_on
                        ),
                    ));
                }
                if let Some(&other) = self.auto_ids.get(got) {
                    return Err(Violation::new(
                        "delivery",
                        format!(
                            "broker id {id} of {} was already given to {}",
                            self.describe(serial),
                            self.describe(other)
                        ),
                    ));
                }
                self.auto_ids.insert(*got, serial);
                self.msgs[serial as usize].id = IdRec::Auto(Some(*got));
                true
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Violation::new(
                "delivery",
                format!("{} came with id {id}", self.describe(serial)),
            ))
        }
    }

    pub(super) fn check_reply(
        &self,
        expected: Option<Reply>,
        got: Option<&Reply>,
    ) -> Result<(), Violation> {
        let same = match (&expected, got) {
            (None, None) => true,
            (Some(a), Some(b)) => same_reply(a, b),
            _ => false,
        };
        if same {
            Ok(())
        } else {
            Err(Violation::new(
                "reply",
                format!("expected {expected:?}, the engine answered {got:?}"),
            ))
        }
    }

    pub(super) fn check_letters(&mut self, obs: &Obs) -> Result<(), Violation> {
        let got = &obs.out.dead_letters;
        if got.len() != self.letters.len() {
            return Err(Violation::new(
                "dead-letter",
                format!(
                    "expected {} dead letters ({:?}), the engine sent {}: {:?}",
                    self.letters.len(),
                    self.letters
                        .iter()
                        .map(|l| self.describe(l.serial))
                        .collect::<Vec<_>>(),
                    got.len(),
                    got.iter()
                        .map(|l| self.describe_body(&l.body))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        // Copies of one message (see `Ledger::copies`) carry the same body, and two of
        // them may die in one call (one in each of two queues that dead-letter into each
        // other): letters are matched by message, then by the queue they leave and the
        // attempts they died with, whichever copy.
        let mut expected = std::mem::take(&mut self.letters);
        expected.sort_by_key(|l| {
            let from = self.queues[l.from as usize].key.slot();
            (self.original(l.serial), from, l.death.attempts, l.serial)
        });
        let mut sorted: Vec<&DeadLetter> = got.iter().collect();
        sorted.sort_by_key(|l| {
            let serial = self.serial_of(&l.body).unwrap_or(u32::MAX);
            (serial, l.origin.queue.slot(), l.death.attempts)
        });
        let result = expected
            .iter()
            .zip(sorted)
            .try_for_each(|(e, l)| self.check_letter(obs, e, l));
        self.letters = expected;
        result
    }

    fn check_letter(
        &mut self,
        obs: &Obs,
        e: &ExpectedLetter,
        l: &DeadLetter,
    ) -> Result<(), Violation> {
        let serial = self.letter_serial(l)?;
        if self.queues[e.from as usize].config.durable {
            self.dying.insert((l.origin.shard, l.origin.msg), serial);
        }
        let from = &self.queues[e.from as usize];
        let problem = if self.original(serial) != self.original(e.serial) {
            Some(format!("{} instead", self.describe(serial)))
        } else if Some(&*l.to) != from.dead_letter.as_deref() {
            Some(format!("addressed to {:?}", l.to))
        } else if l.origin.shard != obs.shard || l.origin.queue != from.key {
            Some(format!("from origin {:?}", l.origin))
        } else if l.death != e.death {
            Some(format!("with death record {:?}", l.death))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Violation::new(
                "dead-letter",
                format!(
                    "expected {} to die with {:?}, the engine sent it {problem}",
                    self.describe(e.serial),
                    e.death
                ),
            ));
        }
        self.check_id(serial, &l.id)
    }

    pub(super) fn check_outcomes(&self, out: &Effects) -> Result<(), Violation> {
        if out.outcomes != self.outcomes {
            return Err(Violation::new(
                "outcome",
                format!(
                    "expected outcomes {:?}, the engine sent {:?}",
                    self.outcomes, out.outcomes
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn check_gone(&mut self, out: &Effects) -> Result<(), Violation> {
        let mut got = out.consumers_gone.clone();
        got.sort_by_key(|k| k.slot());
        self.gone.sort_by_key(|k| k.slot());
        if got != self.gone {
            return Err(Violation::new(
                "consumers-gone",
                format!(
                    "expected consumers {:?} to end, the engine ended {:?}",
                    self.gone, out.consumers_gone
                ),
            ));
        }
        Ok(())
    }
}

/// Replies are equal, errors by kind only (their texts are for people).
fn same_reply(a: &Reply, b: &Reply) -> bool {
    fn same<T: PartialEq>(
        a: &Result<T, leasemq_engine::Error>,
        b: &Result<T, leasemq_engine::Error>,
    ) -> bool {
        match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (Err(x), Err(y)) => std::mem::discriminant(x) == std::mem::discriminant(y),
            _ => false,
        }
    }
    match (a, b) {
        (Reply::Declared(x), Reply::Declared(y)) => same(x, y),
        (Reply::Put(x), Reply::Put(y)) => same(x, y),
        (Reply::PutBatch(x), Reply::PutBatch(y)) => same(x, y),
        (Reply::Consumed(x), Reply::Consumed(y)) => same(x, y),
        _ => a == b,
    }
}
