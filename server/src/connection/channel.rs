//! Channels: queues, consumers, deliveries and settles, mapped onto the broker (publishes
//! are in `publish.rs`).
//!
//! AMQP's unacked model maps onto leases. Every `basic.deliver` is one broker delivery
//! under a lease of the queue's `ack_timeout` (30 minutes, RabbitMQ's `consumer_timeout`);
//! the channel numbers its deliveries 1, 2, 3, … and remembers which broker tag of which
//! queue each number stands for. `basic.ack` acks those leases; `basic.nack`/`basic.reject`
//! with `requeue=true` nack them with no delay, with `requeue=false` reject them (dead
//! letter). Closing the channel cancels its broker consumers, which returns every lease
//! they hold: the next delivery of those messages has `attempt` + 1, which AMQP reads as
//! `redelivered`. A lease that ran out was redelivered elsewhere; its late ack is stale and
//! changes nothing (the broker counts it), never a channel error.

use std::collections::{BTreeMap, VecDeque};
use std::task::{Context, Poll};
use std::time::Duration;

use amq_protocol::types::ShortString;
use leasemq::{Consumer, Delivery, DeliveryTag, Message, Queue, Settle};

use amq_protocol::protocol::{basic, channel, confirm, tx, AMQPClass};

use super::code;
use super::fault::Fault;
use super::incoming::{bytes_held, Incoming};
use super::subscription::Subscription;

/// The most prefetch a broker consumer takes; also what `prefetch_count = 0` (AMQP's "no
/// limit") becomes.
pub(super) const MAX_PREFETCH: u16 = u16::MAX;
/// A channel looks for deliveries whose lease has run out once it holds this many
/// unsettled, and again each time they have doubled since it last looked.
pub(super) const FORGET_EXPIRED_FROM: usize = 1024;

/// One open channel.
#[derive(Default)]
pub(crate) struct Channel {
    /// We sent `channel.close` and wait for `close-ok`.
    pub(super) closing: bool,
    /// `basic.qos` prefetch for each consumer started after it; 0 means no limit.
    pub(super) prefetch: u16,
    /// `basic.qos global=true` (RabbitMQ's meaning): the most deliveries unsettled on the
    /// channel, all its consumers together; 0 means no limit.
    pub(super) global_prefetch: u16,
    /// The client asked for no deliveries (`channel.flow active=false`).
    pub(super) paused: bool,
    /// The last delivery tag handed out on this channel.
    pub(super) last_tag: u64,
    /// Deliveries not yet settled, by channel delivery tag.
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// How many unsettled deliveries make the channel look for expired ones again (at
    /// least [`FORGET_EXPIRED_FROM`]).
    pub(super) forget_at: usize,
    /// The highest delivery tag forgotten because its lease had run out (0: none). An ack
    /// of a tag up to it that the channel no longer holds is a late ack, ignored.
    pub(super) forgotten: u64,
    /// A publish whose content is still arriving.
    pub(super) incoming: Option<Incoming>,
    /// Consumer tags in use on this channel.
    pub(super) consumer_tags: Vec<ShortString>,
    /// The queue last declared on this channel: AMQP's meaning of an empty queue name in
    /// the methods that name one.
    pub(super) last_queue: Option<String>,
    /// Publisher confirms are on (`confirm.select`).
    pub(super) confirm: bool,
    /// The channel is transactional (`tx.select`): what it holds until its next commit.
    pub(super) tx: Option<Tx>,
    /// The publish numbers (see `published`) at which a `tx.commit` came, not yet
    /// answered: each is answered once every publish up to it is settled.
    pub(super) commits: VecDeque<u64>,
    /// Consumers `basic.cancel` stopped (and `basic.get`'s), kept while deliveries of
    /// theirs are unsettled: those stay leased to the channel and can still be acked.
    pub(super) stopped: Vec<Stopped>,
    /// Publishes completed on this channel since `confirm.select`, or committed since
    /// `tx.select`: the last one's number.
    pub(super) published: u64,
    /// The highest publish number confirmed with `basic.ack` or `basic.nack`.
    pub(super) confirmed: u64,
    /// Publish numbers the broker refused and not yet nacked: nacked in order, once every
    /// publish before them is settled.
    pub(super) refused: Vec<u64>,
    /// Which channel of this number it is: the connection's count of channels opened.
    pub(super) serial: u64,
    /// The queue behind the channel's direct reply-to consumer (`reply_to.rs`), once it
    /// has had one; closed when that consumer went.
    pub(super) reply: Option<Queue>,
    /// Its live consumers.
    pub(super) consumers: Vec<Subscription>,
    /// Where the next look for a delivery among `consumers` starts, so that none starves
    /// the others.
    pub(super) rotor: usize,
}

/// A settle a channel asks of the broker: a delivery of a queue, and how.
pub(super) type SettleRequest = (Queue, DeliveryTag, Settle);

/// What a channel makes of a method that comes on it ([`Channel::handle`]).
#[derive(Debug)]
pub(super) enum Handled {
    /// Served by the channel's own state: the answer to send, if any.
    Answered(Option<AMQPClass>),
    /// Refused: the fault to answer with.
    Failed(Fault),
    /// Needs the broker or the virtual host: the connection serves it.
    Passed(AMQPClass),
}

impl Channel {
    /// Deliveries not settled yet: unacked, or settled in a transaction not yet committed
    /// (a rollback gives them back), as RabbitMQ's channel-wide prefetch counts them.
    pub(super) fn unsettled(&self) -> usize {
        self.unacked.len() + self.tx.as_ref().map_or(0, Tx::held_deliveries)
    }

    /// Whether the channel takes a delivery for a consumer now: it is not paused by
    /// `channel.flow`, and is under its `global` prefetch (which, as in RabbitMQ, does not
    /// bound `no_ack` consumers).
    pub(super) fn may_deliver(&self, no_ack: bool) -> bool {
        !self.paused
            && (no_ack
                || self.global_prefetch == 0
                || self.unsettled() < usize::from(self.global_prefetch))
    }

    /// The next delivery of any of the channel's consumers and which one made it (a
    /// `None` delivery: its queue is gone), or `Pending`, with the waker registered with
    /// every consumer. Consumers are looked at in turn from where the last look stopped.
    pub(super) fn poll_delivery(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(usize, Option<Delivery>)> {
        let n = self.consumers.len();
        for step in 0..n {
            let i = (self.rotor + step) % n;
            let deliverable = self.may_deliver(self.consumers[i].no_ack);
            if let Poll::Ready(d) = self.consumers[i].poll_delivery(deliverable, cx) {
                self.rotor = (i + 1) % n;
                return Poll::Ready((i, d));
            }
        }
        Poll::Pending
    }

    /// The prefetch of a consumer started now: `basic.qos`'s per consumer, bounded by the
    /// channel-wide limit too (none may lease more than the channel may have unsettled;
    /// the rest stays ready for other channels). As in RabbitMQ, prefetch does not bound a
    /// consumer without acks (`no_ack`): its deliveries are acked in batches as they leave.
    pub(super) fn consumer_prefetch(&self, no_ack: bool) -> u16 {
        let limit = |n: u16| if n == 0 { MAX_PREFETCH } else { n };
        if no_ack {
            MAX_PREFETCH
        } else {
            limit(self.prefetch).min(limit(self.global_prefetch))
        }
    }

    /// Serves `method`, which came on this channel (numbered `ch`), where its own state
    /// is all it needs: `channel.flow`, `basic.qos`, the start of a `basic.publish`,
    /// `confirm.select`, `tx.select` and `tx.rollback`. Any other method is passed back.
    pub(super) fn handle(&mut self, ch: u16, method: AMQPClass) -> Handled {
        let refuse = |code: u16, text: &str, m: &AMQPClass| {
            Handled::Failed(Fault::channel(ch, code, text, m))
        };
        match method {
            AMQPClass::Basic(basic::AMQPMethod::Publish(publish)) => {
                if publish.immediate {
                    let text = "immediate=true is not supported (nor by RabbitMQ)";
                    let m = AMQPClass::Basic(basic::AMQPMethod::Publish(publish));
                    return Handled::Failed(
                        Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m),
                    );
                }
                self.incoming = Some(Incoming {
                    publish,
                    content: None,
                });
                Handled::Answered(None)
            }
            AMQPClass::Basic(basic::AMQPMethod::Qos(qos)) => {
                if qos.global {
                    self.global_prefetch = qos.prefetch_count;
                } else {
                    self.prefetch = qos.prefetch_count;
                }
                let ok = basic::AMQPMethod::QosOk(basic::QosOk {});
                Handled::Answered(Some(AMQPClass::Basic(ok)))
            }
            AMQPClass::Channel(channel::AMQPMethod::Flow(flow)) => {
                // Deliveries stop or start again; those the broker already handed to the
                // channel's consumers wait, leased, in their buffers (at most a prefetch).
                self.paused = !flow.active;
                let ok = channel::FlowOk {
                    active: flow.active,
                };
                Handled::Answered(Some(AMQPClass::Channel(channel::AMQPMethod::FlowOk(ok))))
            }
            m @ AMQPClass::Confirm(confirm::AMQPMethod::Select(_)) => {
                let AMQPClass::Confirm(confirm::AMQPMethod::Select(select)) = &m else {
                    unreachable!("matched above");
                };
                if self.tx.is_some() {
                    let text = "PRECONDITION_FAILED - cannot switch from tx to confirm mode";
                    return refuse(code::PRECONDITION_FAILED, text, &m);
                }
                self.confirm = true;
                let ok = confirm::AMQPMethod::SelectOk(confirm::SelectOk {});
                Handled::Answered((!select.nowait).then_some(AMQPClass::Confirm(ok)))
            }
            m @ AMQPClass::Tx(tx::AMQPMethod::Select(_)) => {
                if self.confirm {
                    let text = "PRECONDITION_FAILED - cannot switch from confirm to tx mode";
                    return refuse(code::PRECONDITION_FAILED, text, &m);
                }
                self.tx.get_or_insert_with(Tx::default);
                let ok = tx::AMQPMethod::SelectOk(tx::SelectOk {});
                Handled::Answered(Some(AMQPClass::Tx(ok)))
            }
            m @ AMQPClass::Tx(tx::AMQPMethod::Rollback(_)) => {
                let Some(held) = self.tx.as_mut() else {
                    let text = "PRECONDITION_FAILED - channel is not transactional";
                    return refuse(code::PRECONDITION_FAILED, text, &m);
                };
                // The held deliveries are the channel's again, to be settled anew; the
                // held publishes go.
                for (taken, _) in std::mem::take(held).settles {
                    self.unacked.extend(taken);
                }
                let ok = tx::AMQPMethod::RollbackOk(tx::RollbackOk {});
                Handled::Answered(Some(AMQPClass::Tx(ok)))
            }
            other => Handled::Passed(other),
        }
    }

    /// Takes the deliveries an ack, nack or reject of `tag` settles: that one, or with
    /// `multiple` every one up to it (0: all of them). As RabbitMQ: with `multiple` the
    /// named tag itself must be outstanding; a tag never delivered, or settled already, is
    /// `None` (a channel error). One forgotten because its lease ran out is not
    /// ([`Channel::forget_expired`]): a late ack, which settles nothing.
    pub(super) fn take_settled(&mut self, tag: u64, multiple: bool) -> Option<Vec<(u64, Unacked)>> {
        let forgotten = tag != 0 && tag <= self.forgotten;
        if !multiple {
            return match self.unacked.remove(&tag) {
                Some(u) => Some(vec![(tag, u)]),
                None => forgotten.then(Vec::new),
            };
        }
        if tag != 0 && !forgotten && !self.unacked.contains_key(&tag) {
            return None;
        }
        let upto = if tag == 0 { u64::MAX } else { tag };
        let keep = self.unacked.split_off(&upto.saturating_add(1));
        Some(
            std::mem::replace(&mut self.unacked, keep)
                .into_iter()
                .collect(),
        )
    }

    /// `basic.ack`, `nack` or `reject` of `tag` (with `multiple`, of every unsettled one up
    /// to it; see [`Channel::take_settled`]), settled `how`: the broker settles to make
    /// now. A transactional channel holds them until its commit and asks for none. A tag
    /// the channel does not hold is a 406.
    pub(super) fn settle(
        &mut self,
        ch: u16,
        tag: u64,
        multiple: bool,
        how: Settle,
        m: &AMQPClass,
    ) -> Result<Vec<SettleRequest>, Fault> {
        let Some(taken) = self.take_settled(tag, multiple) else {
            let text = format!("PRECONDITION_FAILED - unknown delivery tag {tag}");
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, m));
        };
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        match self.tx.as_mut() {
            Some(held) => {
                held.hold_settle(taken, how);
                Ok(Vec::new())
            }
            None => Ok(self.settles_of(taken, how)),
        }
    }

    /// The broker settles that settle `taken`, deliveries already taken from the
    /// channel's unacked ones, `how`, in the order to make them.
    pub(super) fn settles_of(
        &mut self,
        taken: Vec<(u64, Unacked)>,
        how: Settle,
    ) -> Vec<SettleRequest> {
        let mut settles = Vec::with_capacity(taken.len());
        let mut releases = Vec::new();
        for (_, unacked) in taken {
            let Unacked {
                queue,
                tag,
                consumer,
                ..
            } = unacked;
            if let Some(stopped) = self.stopped.iter_mut().find(|s| s.number == consumer) {
                stopped.outstanding = stopped.outstanding.saturating_sub(1);
                // What a client hands back with `requeue` after cancelling, it never gave
                // its application (a delivery in flight when it cancelled, which pika
                // hands back as it arrives): a release, which costs no attempt.
                if stopped.cancelled && how == requeue(true) {
                    releases.push((queue, tag, Settle::Release));
                    continue;
                }
            }
            settles.push((queue, tag, how));
        }
        // Each release goes to the front of its queue: the last delivered goes first, so
        // that they come back in the order they were delivered, as with RabbitMQ.
        settles.extend(releases.into_iter().rev());
        settles
    }

    /// Holds delivery `channel_tag` until it is settled. First, once the unsettled ones
    /// have reached [`FORGET_EXPIRED_FROM`], or doubled since the last look, forgets those
    /// whose lease has certainly run out by `now` (see [`Channel::forget_expired`]).
    pub(super) fn hold(&mut self, channel_tag: u64, unacked: Unacked, now: u64) {
        if self.unacked.len() >= self.forget_at.max(FORGET_EXPIRED_FROM) {
            self.forget_expired(now);
        }
        self.unacked.insert(channel_tag, unacked);
    }

    /// Forgets the unsettled deliveries whose lease had run out by `now`.
    ///
    /// A client that never acks would otherwise make the channel hold one entry for every
    /// delivery its leases outlived, without end: an expired lease frees the consumer's
    /// prefetch, and the message comes again under a new tag. RabbitMQ closes such a
    /// channel at its `consumer_timeout`; a lease gives the message back instead and the
    /// channel stays. The broker's lease began before the connection had the delivery, so
    /// an entry older than its queue's `ack_timeout` on the lease clock names a lease that
    /// has certainly run out, whose ack the broker would count as stale. Its ack is then
    /// ignored here (`forgotten`); the stopped consumer it kept counts one fewer.
    pub(super) fn forget_expired(&mut self, now: u64) {
        let (stopped, forgotten) = (&mut self.stopped, &mut self.forgotten);
        self.unacked.retain(|&channel_tag, unacked| {
            if unacked.expires > now {
                return true;
            }
            *forgotten = (*forgotten).max(channel_tag);
            if let Some(s) = stopped.iter_mut().find(|s| s.number == unacked.consumer) {
                s.outstanding = s.outstanding.saturating_sub(1);
            }
            false
        });
        self.forget_at = 2 * self.unacked.len();
    }
}

/// What a channel delivery tag stands for.
pub(crate) struct Unacked {
    pub(super) queue: Queue,
    pub(super) tag: DeliveryTag,
    /// The number of the subscription it came from.
    pub(super) consumer: u64,
    /// When its lease has certainly run out, on the lease clock: when the connection had
    /// it, plus its lease (its queue's `ack_timeout`, or its consumer's own).
    pub(super) expires: u64,
}

impl Unacked {
    /// Delivery `tag` of `queue`, to the subscription numbered `consumer`, had `now`.
    pub(super) fn new(queue: Queue, tag: DeliveryTag, consumer: u64, now: u64) -> Unacked {
        let lease = queue.config().ack_timeout;
        Unacked::leased(queue, tag, (consumer, lease), now)
    }

    /// As [`Unacked::new`], for a subscription whose leases last `lease`.
    pub(super) fn leased(
        queue: Queue,
        tag: DeliveryTag,
        (consumer, lease): (u64, Duration),
        now: u64,
    ) -> Unacked {
        // Rounded up: never earlier than the broker's deadline.
        let lease = lease.as_micros().div_ceil(1000);
        let expires = now.saturating_add(u64::try_from(lease).unwrap_or(u64::MAX));
        Unacked {
            queue,
            tag,
            consumer,
            expires,
        }
    }
}

/// A broker consumer that takes no more deliveries, kept until the deliveries it made on
/// the channel are settled; dropping it (then, or with the channel) returns the rest.
pub(super) struct Stopped {
    pub(super) number: u64,
    /// Held for its leases; never read again.
    pub(super) _consumer: Consumer,
    /// Its deliveries on the channel not yet settled.
    pub(super) outstanding: usize,
    /// Stopped by `basic.cancel` (not made for a `basic.get`).
    pub(super) cancelled: bool,
}

/// What a `nack` or `reject` with `requeue` does to a delivery: given back at once, or
/// dead-lettered.
pub(super) fn requeue(requeue: bool) -> Settle {
    if requeue {
        Settle::NackWithDelay(Duration::ZERO)
    } else {
        Settle::Reject
    }
}

/// What a transactional channel holds until its next commit or rollback.
#[derive(Default)]
pub(crate) struct Tx {
    /// Each publish routed since, with the queues it reached.
    pub(super) publishes: Vec<(Vec<Queue>, Message)>,
    /// Each settle since: the deliveries it took from the channel's unacked ones (with
    /// their channel tags, for a rollback) and what it does to them.
    pub(super) settles: Vec<(Vec<(u64, Unacked)>, Settle)>,
    /// What `publishes` hold (see [`Tx::cost`]).
    pub(super) bytes: usize,
}

impl Tx {
    /// Holds a settle of `taken` (deliveries taken from the channel's unacked ones) until
    /// the commit.
    pub(super) fn hold_settle(&mut self, taken: Vec<(u64, Unacked)>, how: Settle) {
        self.settles.push((taken, how));
    }

    /// The deliveries whose settles it holds.
    pub(super) fn held_deliveries(&self) -> usize {
        self.settles.iter().map(|(taken, _)| taken.len()).sum()
    }

    /// The deliveries of the consumer numbered `consumer` whose settles it holds.
    pub(super) fn held_of(&self, consumer: u64) -> usize {
        (self.settles.iter())
            .flat_map(|(taken, _)| taken)
            .filter(|(_, u)| u.consumer == consumer)
            .count()
    }

    /// What holding `message` for `queues` costs: its body and bookkeeping, and a queue
    /// handle and a copy's bookkeeping for each queue it goes to.
    pub(super) fn cost(queues: &[Queue], message: &Message) -> usize {
        let per_copy = std::mem::size_of::<Queue>() + std::mem::size_of::<Message>();
        bytes_held(std::slice::from_ref(message)) + queues.len() * per_copy
    }
}

/// One publisher confirm.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) enum Confirm {
    /// `basic.ack` with `multiple`: every publish up to this one, not yet confirmed, is in.
    AckUpTo(u64),
    /// `basic.nack` of this publish alone.
    Nack(u64),
}

/// What a confirming channel answers now (see [`confirms`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Confirms {
    /// In the order they go out, by publish number.
    pub(super) answers: Vec<Confirm>,
    /// The channel's highest confirmed publish afterwards.
    pub(super) confirmed: u64,
    /// Refused publishes not nacked yet: an earlier publish is still awaited.
    pub(super) refused: Vec<u64>,
}

/// The confirms of a channel whose publishes are confirmed up to `confirmed` and numbered
/// up to `published`, with `refused` publishes refused by their queue and `awaited` the
/// publish numbers (ascending) of each of its puts whose answer has not come.
///
/// Every publish below the first one still awaited is settled: put in its queue (or
/// unroutable, which RabbitMQ confirms too), or refused (a full queue, a failed log), which
/// is a `basic.nack`. They are confirmed strictly in order, a run of puts with one
/// `basic.ack multiple` and each refused one with its own nack, so that no ack with
/// `multiple` covers a publish that was nacked (a client may take such an ack for the
/// publishes it covers whatever it heard before), and nothing at or past the first awaited
/// publish is confirmed, not even a refused one.
pub(super) fn confirms(
    confirmed: u64,
    published: u64,
    mut refused: Vec<u64>,
    awaited: &[&[u64]],
) -> Confirms {
    let settled = awaited
        .iter()
        .filter_map(|numbers| numbers.first().copied())
        .min()
        .map_or(published, |first| first - 1);
    refused.sort_unstable();
    refused.dedup();
    let later = refused.split_off(refused.partition_point(|&n| n <= settled));
    let mut answers = Vec::new();
    let mut done = confirmed;
    for n in refused.into_iter().filter(|&n| n > confirmed) {
        if n - 1 > done {
            answers.push(Confirm::AckUpTo(n - 1));
        }
        answers.push(Confirm::Nack(n));
        done = n;
    }
    if settled > done {
        answers.push(Confirm::AckUpTo(settled));
        done = settled;
    }
    Confirms {
        answers,
        confirmed: done,
        refused: later,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasemq::{Broker, ConsumerConfig, QueueConfig};

    use super::*;

    /// A queue whose leases last `lease_ms`, with `n` messages delivered to a consumer of
    /// it: their tags.
    fn delivered(lease_ms: u64, n: usize) -> (Queue, Vec<DeliveryTag>) {
        let broker = Broker::builder().shards(1).manual_clock().build().unwrap();
        let config = QueueConfig {
            ack_timeout: Duration::from_millis(lease_ms),
            ..QueueConfig::default()
        };
        let queue = broker.declare_queue("q", config).unwrap();
        for i in 0..n {
            queue.put(Message::new(format!("m{i}"))).unwrap();
        }
        let consumer = queue.consume("c", ConsumerConfig::default()).unwrap();
        let tags = (0..n)
            .map(|_| consumer.try_recv().unwrap().unwrap().tag())
            .collect();
        (queue, tags)
    }

    /// A consumer of `queue` on a channel, tagged `tag`.
    fn subscription(queue: &Queue, tag: &str, no_ack: bool) -> Subscription {
        let consumers = std::sync::Arc::new(crate::consumers::QueueConsumers::default());
        let (claim, _) = consumers.claim(queue.name(), false, false).unwrap();
        let consumer = queue.consume(tag, ConsumerConfig::default()).unwrap();
        Subscription {
            message_ttl: None,
            number: 1,
            tag: ShortString::from(tag),
            queue: queue.clone(),
            consumer: Some(consumer),
            waiting: None,
            starting: None,
            no_ack,
            lease: None,
            _claim: claim,
        }
    }

    #[test]
    fn a_channels_consumers_deliver_in_turn_while_it_takes_deliveries() {
        let broker = Broker::builder().shards(1).manual_clock().build().unwrap();
        let (a, b) = (
            broker.declare_queue("a", QueueConfig::default()).unwrap(),
            broker.declare_queue("b", QueueConfig::default()).unwrap(),
        );
        for i in 0..3 {
            a.put(Message::new(format!("a{i}"))).unwrap();
            b.put(Message::new(format!("b{i}"))).unwrap();
        }
        let mut channel = Channel::default();
        channel.consumers.push(subscription(&a, "ca", false));
        channel.consumers.push(subscription(&b, "cb", true));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Waits for a delivery (its prefetch may still be on its way) unless `paused`.
        let mut next = |channel: &mut Channel| loop {
            match channel.poll_delivery(&mut cx) {
                Poll::Ready((i, Some(d))) => return Some((i, d)),
                Poll::Ready((_, None)) => panic!("no queue went"),
                Poll::Pending if channel.paused => return None,
                Poll::Pending => std::thread::yield_now(),
            }
        };
        let mut order = Vec::new();
        for _ in 0..4 {
            let (i, d) = next(&mut channel).unwrap();
            order.push(i);
            if i == 0 {
                let unacked = Unacked::new(a.clone(), d.tag(), 1, 0);
                let tag = channel.unacked.len() as u64 + 1;
                channel.hold(tag, unacked, 0);
            }
        }
        assert_eq!(order, [0, 1, 0, 1], "one consumer after the other");
        channel.paused = true;
        assert!(next(&mut channel).is_none(), "channel.flow stopped them");
        channel.paused = false;
        channel.global_prefetch = 2;
        let (i, _) = next(&mut channel).unwrap();
        assert_eq!(i, 1, "only the consumer without acks, with two unsettled");
    }

    #[test]
    fn a_settle_asks_the_broker_for_its_deliveries_and_a_cancelled_consumers_come_back_unseen() {
        let (queue, tags) = delivered(60_000, 4);
        let mut channel = Channel::default();
        for (i, &tag) in tags.iter().enumerate() {
            // The first two from a live consumer, the last two from a cancelled one.
            let consumer = if i < 2 { 1 } else { 2 };
            channel.hold(
                i as u64 + 1,
                Unacked::new(queue.clone(), tag, consumer, 0),
                0,
            );
        }
        let cancelled = queue.consume("gone", ConsumerConfig::default()).unwrap();
        channel.stopped.push(Stopped {
            number: 2,
            _consumer: cancelled,
            outstanding: 2,
            cancelled: true,
        });
        let m = AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack::default()));
        let asked = |settles: Vec<SettleRequest>| -> Vec<(DeliveryTag, Settle)> {
            settles
                .into_iter()
                .map(|(_, tag, how)| (tag, how))
                .collect()
        };
        let fault = channel.settle(3, 9, false, Settle::Ack, &m).unwrap_err();
        assert_eq!(
            (fault.channel, fault.code),
            (Some(3), code::PRECONDITION_FAILED)
        );
        let acked = channel.settle(3, 1, false, Settle::Ack, &m).unwrap();
        assert_eq!(asked(acked), [(tags[0], Settle::Ack)]);
        // A nack with requeue of the rest: the live consumer's is nacked, the cancelled
        // one's are released, the last delivered first so they come back in order.
        let nacked = channel.settle(3, 0, true, requeue(true), &m).unwrap();
        let expected = [
            (tags[1], requeue(true)),
            (tags[3], Settle::Release),
            (tags[2], Settle::Release),
        ];
        assert_eq!(asked(nacked), expected);
        assert_eq!(
            channel.stopped[0].outstanding, 0,
            "its deliveries are all settled"
        );
        assert_eq!(channel.unsettled(), 0);
    }

    #[test]
    fn a_transactional_channel_asks_for_no_settle_before_its_commit() {
        let (queue, tags) = delivered(60_000, 1);
        let mut channel = Channel {
            tx: Some(Tx::default()),
            ..Channel::default()
        };
        channel.hold(1, Unacked::new(queue, tags[0], 1, 0), 0);
        let m = AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack::default()));
        let asked = channel.settle(1, 1, false, Settle::Ack, &m).unwrap();
        assert!(asked.is_empty());
        assert_eq!(channel.unsettled(), 1, "held until the commit");
    }

    #[test]
    fn a_consumers_prefetch_is_bounded_by_the_channels_and_none_without_acks() {
        let mut channel = Channel::default();
        assert_eq!(
            channel.consumer_prefetch(false),
            MAX_PREFETCH,
            "0 is no limit"
        );
        channel.prefetch = 10;
        assert_eq!(channel.consumer_prefetch(false), 10);
        channel.global_prefetch = 4;
        assert_eq!(
            channel.consumer_prefetch(false),
            4,
            "the channel's bound is lower"
        );
        channel.prefetch = 0;
        assert_eq!(channel.consumer_prefetch(false), 4);
        assert_eq!(channel.consumer_prefetch(true), MAX_PREFETCH);
    }

    #[test]
    fn deliveries_whose_lease_certainly_ran_out_are_forgotten_and_their_consumer_freed() {
        let (queue, tags) = delivered(1_000, 3);
        let mut channel = Channel::default();
        for (i, &tag) in tags.iter().enumerate() {
            // Had at 0, 0 and 500 ms: their leases run out by 1 000 and 1 500 ms.
            let now = if i < 2 { 0 } else { 500 };
            let channel_tag = i as u64 + 1;
            channel.hold(channel_tag, Unacked::new(queue.clone(), tag, 7, now), now);
        }
        assert_eq!(channel.unsettled(), 3);
        channel.forget_expired(999);
        assert_eq!(channel.unacked.len(), 3, "none ran out yet");
        channel.forget_expired(1_000);
        assert_eq!(channel.unacked.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(channel.forgotten, 2, "acks up to it are late, not unknown");
        assert_eq!(channel.forget_at, 2);
    }

    #[test]
    fn a_settle_takes_its_tag_or_every_one_up_to_it_and_a_late_ack_nothing() {
        let (queue, tags) = delivered(1_000, 4);
        let mut channel = Channel::default();
        for (i, &tag) in tags.iter().enumerate() {
            let now = if i == 0 { 0 } else { 600 };
            channel.hold(i as u64 + 1, Unacked::new(queue.clone(), tag, 1, now), now);
        }
        let numbers = |taken: Option<Vec<(u64, Unacked)>>| -> Option<Vec<u64>> {
            taken.map(|t| t.into_iter().map(|(n, _)| n).collect())
        };
        assert_eq!(
            numbers(channel.take_settled(9, false)),
            None,
            "never delivered"
        );
        assert_eq!(numbers(channel.take_settled(9, true)), None);
        // Tag 1's lease ran out by 1 000 ms: forgotten, then acked late.
        channel.forget_expired(1_000);
        assert_eq!(numbers(channel.take_settled(1, false)), Some(vec![]));
        assert_eq!(numbers(channel.take_settled(3, false)), Some(vec![3]));
        assert_eq!(
            numbers(channel.take_settled(3, false)),
            None,
            "settled already"
        );
        assert_eq!(
            numbers(channel.take_settled(3, true)),
            None,
            "nor with multiple"
        );
        assert_eq!(numbers(channel.take_settled(2, true)), Some(vec![2]));
        assert_eq!(
            numbers(channel.take_settled(0, true)),
            Some(vec![4]),
            "0: all"
        );
        assert!(channel.unacked.is_empty());
    }

    #[test]
    fn qos_flow_and_a_publishs_start_are_the_channels_own() {
        let mut state = Channel::default();
        let qos = |prefetch_count, global| {
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count,
                global,
            }))
        };
        let answered = |handled: Handled| match handled {
            Handled::Answered(answer) => answer,
            other => panic!("not answered: {other:?}"),
        };
        let ok = answered(state.handle(1, qos(10, false)));
        assert!(matches!(
            ok,
            Some(AMQPClass::Basic(basic::AMQPMethod::QosOk(_)))
        ));
        answered(state.handle(1, qos(4, true)));
        assert_eq!((state.prefetch, state.global_prefetch), (10, 4));
        let flow = |active| AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active }));
        answered(state.handle(1, flow(false)));
        assert!(state.paused);
        answered(state.handle(1, flow(true)));
        assert!(!state.paused);
        // A publish is held until its content comes; nothing is answered.
        let publish = |immediate| {
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                immediate,
                ..basic::Publish::default()
            }))
        };
        assert!(answered(state.handle(1, publish(false))).is_none());
        assert!(state.incoming.is_some());
        match state.handle(1, publish(true)) {
            Handled::Failed(fault) => assert_eq!((fault.channel, fault.code), (None, 540)),
            other => panic!("not refused: {other:?}"),
        }
        // What needs the broker is passed back.
        let get = AMQPClass::Basic(basic::AMQPMethod::Get(basic::Get::default()));
        assert!(matches!(state.handle(1, get), Handled::Passed(_)));
    }

    #[test]
    fn confirms_and_transactions_exclude_each_other_and_a_rollback_gives_back_its_settles() {
        let (queue, tags) = delivered(60_000, 1);
        let select = AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        }));
        let tx_select = AMQPClass::Tx(tx::AMQPMethod::Select(tx::Select {}));
        let rollback = AMQPClass::Tx(tx::AMQPMethod::Rollback(tx::Rollback {}));
        let code_of = |handled: Handled| match handled {
            Handled::Failed(fault) => Some(fault.code),
            _ => None,
        };
        let mut confirming = Channel::default();
        assert_eq!(code_of(confirming.handle(1, select.clone())), None);
        assert!(confirming.confirm);
        assert_eq!(code_of(confirming.handle(1, tx_select.clone())), Some(406));
        assert_eq!(code_of(confirming.handle(1, rollback.clone())), Some(406));
        let mut transactional = Channel::default();
        assert_eq!(code_of(transactional.handle(1, tx_select)), None);
        assert_eq!(code_of(transactional.handle(1, select)), Some(406));
        // A settle held by the transaction is the channel's again after a rollback.
        transactional.hold(1, Unacked::new(queue.clone(), tags[0], 1, 0), 0);
        let taken = transactional.take_settled(1, false).unwrap();
        (transactional.tx.as_mut().unwrap()).hold_settle(taken, Settle::Ack);
        assert!(transactional.unacked.is_empty());
        assert_eq!(code_of(transactional.handle(1, rollback)), None);
        assert_eq!(
            transactional.unacked.keys().copied().collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(transactional.unsettled(), 1);
    }

    #[test]
    fn settles_a_transaction_holds_count_as_unsettled_until_the_commit() {
        let (queue, tags) = delivered(60_000, 2);
        let mut channel = Channel {
            tx: Some(Tx::default()),
            ..Channel::default()
        };
        channel.hold(1, Unacked::new(queue.clone(), tags[0], 1, 0), 0);
        let taken = channel.unacked.remove(&1).unwrap();
        let tx = channel.tx.as_mut().unwrap();
        tx.hold_settle(vec![(1, taken)], Settle::Ack);
        tx.hold_settle(
            vec![(2, Unacked::new(queue, tags[1], 2, 0))],
            Settle::Reject,
        );
        assert_eq!(tx.held_deliveries(), 2);
        assert_eq!(tx.held_of(1), 1);
        assert_eq!(
            channel.unsettled(),
            2,
            "held settles still count for prefetch"
        );
    }
}
