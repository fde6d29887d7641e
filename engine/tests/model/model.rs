use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use leasemq_engine::{DeathReason, DeathRecord, Error, PutOutcome, QueueConfig, QueueStats};

use crate::{ms, Tick, TickLen, SEVEN_DAYS};

// ----- the model ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Id {
    /// A broker id: the model numbers them itself and checks the engine's are one-to-one.
    Auto(u64),
    Given(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Ready,
    /// `retry`: a nacked message, which comes back among the returned ones; else a message
    /// put with a delay, which joins the fresh ones.
    Delayed {
        since: Tick,
        until: Tick,
        seq: u64,
        retry: bool,
    },
    Leased(u64),
}

#[derive(Clone, Debug)]
pub(crate) struct Msg {
    pub(crate) id: Id,
    pub(crate) body: String,
    /// Deliveries so far.
    pub(crate) attempt: u32,
    /// As put; a dead letter keeps it.
    pub(crate) priority: u8,
    pub(crate) death: Option<DeathRecord>,
    pub(crate) state: State,
}

#[derive(Clone, Debug)]
pub(crate) struct Lease {
    pub(crate) msg: u64,
    pub(crate) consumer: usize,
    pub(crate) delivered_at: Tick,
    pub(crate) deadline: Tick,
    /// When the deadline was last set, in timer-setting order.
    pub(crate) seq: u64,
    /// When the lease began, in the same order.
    first_seq: u64,
    /// Once touched: the deadline it had before the latest touch.
    pub(crate) prev_deadline: Option<Tick>,
}

#[derive(Clone, Debug)]
pub(crate) struct ModelQueue {
    pub(crate) name: String,
    pub(crate) config: QueueConfig,
    pub(crate) open: bool,
    pub(crate) msgs: BTreeMap<u64, Msg>,
    /// Messages that came back, in the order they became ready again.
    pub(crate) returned: VecDeque<u64>,
    pub(crate) fresh: VecDeque<u64>,
    pub(crate) leases: BTreeMap<u64, Lease>,
    pub(crate) next_tag: u64,
    /// In registration order (consumer numbers grow with registration).
    pub(crate) consumers: Vec<usize>,
    /// For each consumer priority, the consumer of that priority that got the latest
    /// delivery among them.
    pub(crate) last_served: BTreeMap<i64, usize>,
    /// The consumer that got the queue's latest delivery (for coverage only).
    pub(crate) latest: Option<usize>,
    /// Given id → end of its dedup window.
    pub(crate) windows: BTreeMap<String, Tick>,
    /// Counters; the gauges are computed.
    pub(crate) counters: QueueStats,
}

#[derive(Clone, Debug)]
pub(crate) struct ModelConsumer {
    pub(crate) queue: usize,
    pub(crate) name: String,
    pub(crate) prefetch: u32,
    /// Dispatch serves the highest priority among the consumers with credit.
    pub(crate) priority: i64,
    /// Its own lease length, where not its queue's `ack_timeout`.
    pub(crate) ack_timeout: Option<Duration>,
    pub(crate) open: bool,
    /// Stopped: no more deliveries; its leases stay until settled, expired or cancelled.
    pub(crate) stopped: bool,
    /// Every tag delivered to it, in channel order.
    pub(crate) tags: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ModelDelivery {
    pub(crate) consumer: usize,
    pub(crate) tag: u64,
    pub(crate) id: Id,
    pub(crate) body: String,
    pub(crate) attempt: u32,
    pub(crate) death: Option<DeathRecord>,
}

#[derive(Clone, Debug)]
pub(crate) struct Letter {
    pub(crate) to: String,
    pub(crate) origin: usize,
    pub(crate) id: Id,
    pub(crate) body: String,
    pub(crate) priority: u8,
    pub(crate) death: DeathRecord,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ModelEffects {
    pub(crate) deliveries: Vec<ModelDelivery>,
    pub(crate) letters: Vec<Letter>,
    pub(crate) outcomes: Vec<(usize, bool)>,
    pub(crate) gone: Vec<usize>,
}

/// The model's reply to a step.
#[derive(Debug)]
pub(crate) enum Answer {
    Silent,
    Declared(Result<usize, Error>),
    Put(Result<PutOutcome, Error>),
    PutBatch(Result<Vec<PutOutcome>, Error>),
    Settled(bool),
    SettledBatch(Vec<bool>),
    Consumed(Result<usize, Error>),
    Count(usize),
    Purged(Result<usize, Error>),
    Stats(Option<QueueStats>),
    Found(Option<usize>),
    Closed(Option<QueueStats>),
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Due {
    Lease(u64),
    Ready(u64),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Timer {
    pub(crate) at: Tick,
    seq: u64,
    pub(crate) queue: usize,
    due: Due,
    /// The first and the last moment, as (tick, seq), at which a timer wheel may have set
    /// this timer at its deadline: see [`Model::order_is_open`].
    set_from: (Tick, u64),
    set_by: (Tick, u64),
}

/// Events the runs went through, summed over all seeds so that a generator that stops
/// reaching a corner shows.
#[derive(Debug, Default, Clone)]
pub(crate) struct Coverage {
    pub(crate) runs: u64,
    pub(crate) cut_short: u64,
    pub(crate) steps: u64,
    pub(crate) delivered: u64,
    pub(crate) redelivered: u64,
    pub(crate) expired: u64,
    pub(crate) nacked: u64,
    pub(crate) released: u64,
    pub(crate) rejected: u64,
    pub(crate) duplicates: u64,
    pub(crate) stale: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) dropped: u64,
    pub(crate) dead_letters_delivered: u64,
    pub(crate) touch_refused: u64,
    pub(crate) queue_full: u64,
    pub(crate) unread_released: u64,
    pub(crate) closes: u64,
    pub(crate) stopped_with_leases: u64,
    pub(crate) purged: u64,
    pub(crate) heads_dropped: u64,
    /// Ready messages taken ahead of the first in line for their higher priority.
    pub(crate) priority_overtakes: u64,
    /// Deliveries that passed over a consumer with credit of a lower priority.
    pub(crate) consumers_passed_over: u64,
    /// Deliveries whose round robin went on after a consumer of their priority that had
    /// gone, while one of that priority listed before it was still there.
    pub(crate) turns_after_a_gone_consumer: u64,
    /// Deliveries whose round robin went on after one of their priority while the queue's
    /// previous delivery went to another priority.
    pub(crate) turns_kept_across_priorities: u64,
}

#[derive(Clone)]
pub(crate) struct Model {
    pub(crate) tick: TickLen,
    pub(crate) now: Tick,
    pub(crate) queues: Vec<ModelQueue>,
    pub(crate) consumers: Vec<ModelConsumer>,
    pub(crate) next_msg: u64,
    pub(crate) next_auto: u64,
    next_seq: u64,
    pub(crate) fx: ModelEffects,
    /// Set when the step hit a tie whose order the contract leaves open (contract §4 Equal
    /// deadlines).
    pub(crate) open_order: Option<String>,
    /// Take such ties in the order the deadlines were last set, as an eager wheel does,
    /// instead of stopping there.
    eager_ties: bool,
    pub(crate) coverage: Coverage,
}

pub(crate) fn valid_queue_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    !name.is_empty() && name.len() <= 255 && name.chars().all(allowed)
}

/// The limits of contract §3 Limits that the generator breaks.
pub(crate) fn check_config(name: &str, config: &QueueConfig) -> Result<(), Error> {
    let invalid = |why: &str| Err(Error::InvalidConfig(why.to_string()));
    if config.ack_timeout < ms(1) || config.ack_timeout > SEVEN_DAYS {
        return invalid("ack_timeout");
    }
    if config.max_lease.is_some_and(|m| m < config.ack_timeout) {
        return invalid("max_lease");
    }
    let multiplier_ok = config.retry.multiplier >= 1.0;
    if !multiplier_ok || !(0.0..=1.0).contains(&config.retry.jitter) {
        return invalid("retry");
    }
    if config.max_deliveries == Some(0) || config.max_length == Some(0) {
        return invalid("max_deliveries or max_length");
    }
    if config.max_body_bytes == 0 || config.max_body_bytes > 64 * 1024 * 1024 {
        return invalid("max_body_bytes");
    }
    if config.dead_letter.as_deref() == Some(name) {
        return invalid("dead_letter");
    }
    Ok(())
}

impl Model {
    pub(crate) fn new(tick: Duration, eager_ties: bool) -> Model {
        Model {
            eager_ties,
            tick: TickLen::new(tick),
            now: 0,
            queues: Vec::new(),
            consumers: Vec::new(),
            next_msg: 0,
            next_auto: 0,
            next_seq: 0,
            fx: ModelEffects::default(),
            open_order: None,
            coverage: Coverage::default(),
        }
    }

    pub(crate) fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<usize> {
        self.queues.iter().position(|q| q.open && q.name == name)
    }

    pub(crate) fn stats(&self, q: usize) -> QueueStats {
        let queue = &self.queues[q];
        let is_delayed = |m: &&Msg| matches!(m.state, State::Delayed { .. });
        QueueStats {
            ready: queue.returned.len() + queue.fresh.len(),
            delayed: queue.msgs.values().filter(is_delayed).count(),
            leased: queue.leases.len(),
            consumers: (queue.consumers.iter())
                .filter(|&&c| !self.consumers[c].stopped)
                .count(),
            ..queue.counters.clone()
        }
    }

    /// The earliest pending deadline of any kind, dedup windows included.
    pub(crate) fn next_deadline(&self) -> Option<Tick> {
        let mut next: Option<Tick> = None;
        let mut consider = |t: Tick| next = Some(next.map_or(t, |n| n.min(t)));
        for timer in self.timers() {
            consider(timer.at);
        }
        for queue in self.queues.iter().filter(|q| q.open) {
            for &end in queue.windows.values().filter(|&&end| end > self.now) {
                consider(end);
            }
        }
        next
    }

    /// Every pending lease and ready timer.
    pub(crate) fn timers(&self) -> Vec<Timer> {
        let mut timers = Vec::new();
        for (q, queue) in self.queues.iter().enumerate().filter(|(_, q)| q.open) {
            for (&tag, lease) in &queue.leases {
                let set_from = (lease.delivered_at, lease.first_seq);
                timers.push(Timer {
                    at: lease.deadline,
                    seq: lease.seq,
                    queue: q,
                    due: Due::Lease(tag),
                    set_from,
                    set_by: lease.prev_deadline.map_or(set_from, |d| (d, u64::MAX)),
                });
            }
            for (&msg, m) in &queue.msgs {
                if let State::Delayed {
                    since, until, seq, ..
                } = m.state
                {
                    timers.push(Timer {
                        at: until,
                        seq,
                        queue: q,
                        due: Due::Ready(msg),
                        set_from: (since, seq),
                        set_by: (since, seq),
                    });
                }
            }
        }
        timers
    }

    /// Whether the contract leaves open which of two timers due at the same tick fires first,
    /// where that changes what is seen. Equal deadlines fire in the order they were set
    /// (STYLE: the wheel); but a wheel may set a touched lease at its new deadline at the
    /// touch (eagerly), keep its place when the slot does not change (Linux `__mod_timer`),
    /// or move it when its old deadline comes up (tokio's lazy reschedule). So a touched
    /// lease may have been set at any moment from its delivery to the end of the tick of its
    /// deadline before the last touch; two timers whose such spans overlap have no fixed
    /// order. The order shows within a queue, and between two leases whose queues send dead
    /// letters to the same queue.
    fn order_is_open(&self, a: &Timer, b: &Timer) -> bool {
        let dead_letter = |t: &Timer| self.queues[t.queue].config.dead_letter.as_deref();
        let both_leases = matches!((a.due, b.due), (Due::Lease(_), Due::Lease(_)));
        let related = a.queue == b.queue
            || (both_leases && dead_letter(a).is_some() && dead_letter(a) == dead_letter(b));
        related && !(a.set_by < b.set_from || b.set_by < a.set_from)
    }

    /// Fires every timer due by `until`, each at its own deadline, in deadline order and,
    /// for equal deadlines, in the order they were set.
    pub(crate) fn run_timers(&mut self, until: Tick) {
        loop {
            let timers = self.timers();
            let due = timers
                .iter()
                .filter(|t| t.at <= until)
                .min_by_key(|t| (t.at, t.seq))
                .copied();
            let Some(next) = due else { break };
            let tied = timers
                .iter()
                .filter(|t| t.at == next.at && t.seq != next.seq);
            for other in tied {
                let open = !self.eager_ties && self.order_is_open(&next, other);
                if open && self.open_order.is_none() {
                    self.open_order = Some(format!("{next:?} and {other:?}"));
                }
            }
            self.now = next.at;
            match next.due {
                Due::Lease(tag) => self.expire(next.queue, tag),
                Due::Ready(msg) => self.become_ready(next.queue, msg),
            }
        }
        self.now = until;
    }

    fn expire(&mut self, q: usize, tag: u64) {
        let lease = self.queues[q].leases.remove(&tag).expect("a live lease");
        self.queues[q].counters.expired += 1;
        self.come_back(q, lease.msg, 0);
        self.dispatch(q);
    }

    fn become_ready(&mut self, q: usize, msg: u64) {
        let queue = &mut self.queues[q];
        let m = queue.msgs.get_mut(&msg).expect("a delayed message");
        let State::Delayed { retry, .. } = m.state else {
            panic!("not delayed")
        };
        m.state = State::Ready;
        if retry {
            queue.returned.push_back(msg);
        } else {
            queue.fresh.push_back(msg);
        }
        self.dispatch(q);
    }

    /// A message back from a lease (expiry, nack, a read delivery of a cancelled consumer):
    /// dead once its attempt has reached `max_deliveries`, else ready after `delay` ticks.
    pub(crate) fn come_back(&mut self, q: usize, msg: u64, delay: Tick) {
        let seq = self.seq();
        let now = self.now;
        let queue = &mut self.queues[q];
        let attempt = queue.msgs[&msg].attempt;
        if queue
            .config
            .max_deliveries
            .is_some_and(|max| attempt >= max)
        {
            self.dead_letter(q, msg, DeathReason::MaxDeliveries);
            return;
        }
        let m = queue.msgs.get_mut(&msg).expect("live");
        if delay == 0 {
            m.state = State::Ready;
            queue.returned.push_back(msg);
        } else {
            m.state = State::Delayed {
                since: now,
                until: now + delay,
                seq,
                retry: true,
            };
        }
    }

    /// To the front, as if the delivery had not happened.
    pub(crate) fn release(&mut self, q: usize, msg: u64) {
        let queue = &mut self.queues[q];
        let m = queue.msgs.get_mut(&msg).expect("live");
        m.attempt -= 1;
        m.state = State::Ready;
        queue.returned.push_front(msg);
    }

    pub(crate) fn dead_letter(&mut self, q: usize, msg: u64, reason: DeathReason) {
        let queue = &mut self.queues[q];
        let m = queue.msgs.remove(&msg).expect("live");
        match &queue.config.dead_letter {
            Some(to) => self.fx.letters.push(Letter {
                to: to.clone(),
                origin: q,
                id: m.id,
                body: m.body,
                priority: m.priority,
                death: DeathRecord {
                    queue: queue.name.clone(),
                    reason,
                    attempts: m.attempt,
                },
            }),
            None => queue.counters.dropped += 1,
        }
    }

    fn held(&self, q: usize, consumer: usize) -> usize {
        let leases = self.queues[q].leases.values();
        leases.filter(|l| l.consumer == consumer).count()
    }

    /// Of the consumers with credit, those of the highest priority among them; round robin
    /// over those in registration order, starting after the consumer of that priority
    /// served last (gone or not).
    fn next_consumer(&mut self, q: usize) -> Option<usize> {
        let queue = &self.queues[q];
        let with_credit: Vec<usize> = (queue.consumers.iter().copied())
            .filter(|&c| !self.consumers[c].stopped)
            .filter(|&c| self.held(q, c) < self.consumers[c].prefetch as usize)
            .collect();
        let top = with_credit
            .iter()
            .map(|&c| self.consumers[c].priority)
            .max()?;
        let priority = |c: usize| self.consumers[c].priority;
        let (tops, lower): (Vec<usize>, Vec<usize>) =
            with_credit.iter().partition(|&&c| priority(c) == top);
        let after = |c: usize| queue.last_served.get(&top).is_none_or(|&last| c > last);
        let next = (tops.iter().copied().find(|&c| after(c))).or(tops.first().copied());
        self.coverage.consumers_passed_over += u64::from(!lower.is_empty());
        if let Some(&last) = queue.last_served.get(&top) {
            // Gone, while one of its priority listed before it still is: the queue kept
            // this round robin and goes on from a consumer no longer in its list.
            let kept = (queue.consumers.iter()).any(|&c| c < last && priority(c) == top);
            let gone = !self.consumers[last].open;
            self.coverage.turns_after_a_gone_consumer += u64::from(gone && kept);
            self.coverage.turns_kept_across_priorities += u64::from(queue.latest != Some(last));
        }
        next
    }

    pub(crate) fn dispatch(&mut self, q: usize) {
        loop {
            let queue = &self.queues[q];
            if queue.returned.is_empty() && queue.fresh.is_empty() {
                return;
            }
            let Some(consumer) = self.next_consumer(q) else {
                return;
            };
            let msg = self.take_head(q).expect("a ready message");
            self.deliver(q, msg, consumer);
        }
    }

    /// Takes the ready message that dispatch (or a drop-head) takes next: of the highest
    /// priority level waiting, the first returned one, else the first fresh one. A
    /// message's level is its priority, at most the queue's `max_priority`; in a queue
    /// without priorities every level is 0, which leaves returned then fresh.
    pub(crate) fn take_head(&mut self, q: usize) -> Option<u64> {
        let queue = &mut self.queues[q];
        let max = queue.config.max_priority.unwrap_or(0);
        let level = |msg: &u64| queue.msgs[msg].priority.min(max);
        let top = queue.returned.iter().chain(&queue.fresh).map(level).max()?;
        let first = *queue.returned.front().or(queue.fresh.front())?;
        let msg = match queue.returned.iter().position(|m| level(m) == top) {
            Some(i) => queue.returned.remove(i),
            None => {
                let i = queue.fresh.iter().position(|m| level(m) == top);
                queue
                    .fresh
                    .remove(i.expect("the top level has a ready message"))
            }
        }?;
        self.coverage.priority_overtakes += u64::from(msg != first);
        Some(msg)
    }

    fn deliver(&mut self, q: usize, msg: u64, consumer: usize) {
        let seq = self.seq();
        let now = self.now;
        let own = self.consumers[consumer].ack_timeout;
        let lease_length = own.unwrap_or(self.queues[q].config.ack_timeout);
        let queue = &mut self.queues[q];
        let tag = queue.next_tag;
        queue.next_tag += 1;
        let m = queue.msgs.get_mut(&msg).expect("live");
        m.attempt += 1;
        m.state = State::Leased(tag);
        let delivery = ModelDelivery {
            consumer,
            tag,
            id: m.id.clone(),
            body: m.body.clone(),
            attempt: m.attempt,
            death: m.death.clone(),
        };
        let lease = Lease {
            msg,
            consumer,
            delivered_at: now,
            deadline: now + self.tick.of(lease_length),
            seq,
            first_seq: seq,
            prev_deadline: None,
        };
        queue.leases.insert(tag, lease);
        let priority = self.consumers[consumer].priority;
        queue.last_served.insert(priority, consumer);
        queue.latest = Some(consumer);
        queue.counters.delivered += 1;
        self.consumers[consumer].tags.push(tag);
        self.coverage.delivered += 1;
        self.coverage.redelivered += u64::from(delivery.attempt > 1);
        self.coverage.dead_letters_delivered += u64::from(delivery.death.is_some());
        self.fx.deliveries.push(delivery);
    }
}
