//! What waits for the disk in a durable run (`SyncPolicy::Always`, as `leasemq-shard`'s
//! `ShardLog::held`): a call that logged a change has its answer, its deliveries and its
//! messages to other shards held until the fsync that covers the change, and only then
//! do clients learn what it did ([`Confirm`]), which is what a restart must honour.

use leasemq_engine::{Command, Delivered, Tick};

use crate::ledger::{Confirm, Place, Serial, C, Q};
use crate::world::{enqueue, InFlight, World};
use crate::Violation;

/// What waits for the fsync of a shard's log before it leaves the shard (durable runs,
/// `SyncPolicy::Always`), as `leasemq-shard`'s `ShardLog::held`.
pub(crate) enum Held {
    /// With the stint of its message it was made in (see `Ledger::stint`).
    Delivery(C, Delivered, Option<(Serial, usize)>),
    Hop(InFlight),
    Answer(u64),
}

/// What a client command touched, looked up before the engine handles it, so that its
/// answer can say what the client learns (see [`Confirm`]).
pub(crate) enum Before {
    Nothing,
    Puts(Vec<Serial>),
    Settles(Q, Vec<Serial>),
    Declare(u8, usize),
    Close(Q),
}

impl World {
    /// Fsyncs shard `shard`'s log, and lets out, in order, what waited for it.
    pub(crate) fn sync(&mut self, shard: usize) -> Result<(), Violation> {
        let Some(disks) = &mut self.disks else {
            return Ok(());
        };
        let durable = disks
            .sync(shard)
            .map_err(|e| Violation::new("storage", format!("shard {shard}: {e}")))?;
        while self.pending[shard]
            .front()
            .is_some_and(|(lsn, _)| *lsn <= durable)
        {
            let (_, held) = self.pending[shard].pop_front().expect("looked");
            match held {
                Held::Delivery(c, delivered, stint) => self.give_delivery(c, delivered, stint),
                Held::Hop(hop) => self.send_hop(hop),
                Held::Answer(call) => self.give_answer(call)?,
            }
        }
        Ok(())
    }

    /// A delivery reaches its consumer's channel (unless the consumer ended meanwhile).
    pub(crate) fn give_delivery(
        &mut self,
        c: C,
        delivered: Delivered,
        stint: Option<(Serial, usize)>,
    ) {
        if !self.live.contains(&c) {
            return;
        }
        let q = self.ledger.consumers[c as usize].q;
        self.ledger
            .given_delivery(q, delivered.tag.0, delivered.attempt, stint);
        self.consumers[c as usize].channel.push_back(delivered);
    }

    /// A hop leaves its shard: into the receiver's inbox, or the sender's backlog.
    pub(crate) fn send_hop(&mut self, hop: InFlight) {
        let in_flight = &mut self.in_flight;
        let backlog = &mut self.backlogs[hop.from];
        backlog.send(hop.to, hop, |to, hop| enqueue(in_flight, to, hop));
        if !backlog.is_empty() {
            self.ledger.stats.backlogged += 1;
        }
    }

    /// A call's answer reaches its caller, telling it what the call did.
    pub(crate) fn give_answer(&mut self, call: u64) -> Result<(), Violation> {
        if !self.held.remove(&call) {
            return Err(Violation::new(
                "answer-twice",
                format!("call {call} answered twice, or never held"),
            ));
        }
        for c in self.confirms.remove(&call).unwrap_or_default() {
            self.ledger.confirm(&c);
        }
        Ok(())
    }

    /// What a client command touches, before the engine handles it.
    pub(crate) fn before(&self, shard: usize, cmd: &Command) -> Before {
        if self.disks.is_none() {
            return Before::Nothing;
        }
        let leased = |q: Option<Q>| match q {
            Some(q) => Before::Settles(
                q,
                self.ledger.queues[q as usize]
                    .leases
                    .values()
                    .map(|l| l.serial)
                    .collect(),
            ),
            None => Before::Nothing,
        };
        let shard16 = shard as u16;
        match cmd {
            Command::Put { message, .. } => {
                Before::Puts(self.ledger.serial_of(message.body()).into_iter().collect())
            }
            Command::PutBatch { messages, .. } => Before::Puts(
                messages
                    .iter()
                    .filter_map(|m| self.ledger.serial_of(m.body()).ok())
                    .collect(),
            ),
            Command::Settle { queue, .. } | Command::SettleBatch { queue, .. } => {
                leased(self.ledger.live_queue(shard16, *queue))
            }
            Command::AckUpTo { consumer, .. } => leased(
                self.ledger
                    .live_consumer(shard16, *consumer)
                    .map(|c| self.ledger.consumers[c as usize].q),
            ),
            Command::Declare { name, .. } => match self.setup.name_index(name) {
                Some(n) => Before::Declare(n, self.ledger.queues.len()),
                None => Before::Nothing,
            },
            Command::Close { queue } => match self.ledger.live_queue(shard16, *queue) {
                Some(q) => Before::Close(q),
                None => Before::Nothing,
            },
            _ => Before::Nothing,
        }
    }

    /// What the answer of a client command tells the client about durable queues.
    pub(crate) fn confirms_of(&self, shard: usize, before: Before) -> Vec<Confirm> {
        let ledger = &self.ledger;
        let durable = |q: Q| ledger.queues[q as usize].config.durable;
        let log_time = |tick: Tick| self.shards[shard].log_time(tick);
        let mut out = Vec::new();
        match before {
            Before::Nothing => {}
            Before::Puts(serials) => {
                for serial in serials {
                    let delay = match ledger.msgs[serial as usize].place {
                        Place::Delayed { q, until } if durable(q) => Some(log_time(until)),
                        Place::Ready { q, .. } | Place::Leased { q, .. } if durable(q) => None,
                        _ => continue,
                    };
                    out.push(Confirm::Put { serial, delay });
                }
            }
            Before::Settles(q, serials) if durable(q) => {
                for serial in serials {
                    match ledger.msgs[serial as usize].place {
                        Place::Acked { q: at } if at == q => {
                            out.push(Confirm::Acked { serial, q });
                        }
                        Place::Delayed { q: at, until } if at == q => {
                            let until = log_time(until);
                            out.push(Confirm::Delayed { serial, until });
                        }
                        _ => {}
                    }
                }
            }
            Before::Settles(..) => {}
            Before::Declare(name, known) => {
                if let Some(q) = ledger.by_name[usize::from(name)] {
                    if q as usize >= known && durable(q) {
                        out.push(Confirm::Declared { q });
                    }
                }
            }
            Before::Close(q) => {
                if !ledger.queues[q as usize].live && durable(q) {
                    out.push(Confirm::Closed { q });
                }
            }
        }
        out
    }
}
