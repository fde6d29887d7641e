//! The connection's consumers and the deliveries they make: found in turn, so that none
//! starves the others, handed to their channels, and those of `no_ack` consumers acked in
//! batches once their frames leave.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use amq_protocol::protocol::{basic, AMQPClass};
use amq_protocol::types::ShortString;
use leasemq::{Consumer, Delivery, Queue};

use super::{consumers, Connection};
use crate::offload::{self, Offloaded};

/// One consumer of this connection: the broker's consumer and what AMQP calls it.
pub(super) struct Subscription {
    pub(super) channel: u16,
    /// Its queue's `x-message-ttl`, in milliseconds, as declared when it started.
    pub(super) message_ttl: Option<u64>,
    /// The connection's number for it, unique on the connection.
    pub(super) number: u64,
    pub(super) tag: ShortString,
    pub(super) queue: Queue,
    /// Its broker consumer; `None` while it waits its turn on a queue with a single
    /// active consumer.
    pub(super) consumer: Option<Consumer>,
    /// What it waits for, and the broker consumer it makes then.
    pub(super) waiting: Option<Waiting>,
    /// Its broker consumer being made, once its turn came on a durable queue.
    pub(super) starting: Option<Starting>,
    pub(super) no_ack: bool,
    /// Its place among its queue's consumers, given back as the subscription ends.
    pub(super) _claim: consumers::Claim,
}

/// A subscription waiting its turn (`x-single-active-consumer`): the broker consumer it
/// makes when the turn comes.
pub(super) struct Waiting {
    pub(super) turn: Arc<consumers::Turn>,
    pub(super) name: String,
    pub(super) config: leasemq::ConsumerConfig,
    pub(super) priority: i64,
}

/// A subscription whose turn came on a durable queue: its broker consumer is being made
/// off the connection's thread (the deliveries it starts wait for the disk).
pub(super) type Starting = Offloaded<Result<Consumer, leasemq::Error>>;

impl Connection {
    /// The next delivery of any consumer of this connection, or `Pending` (with the waker
    /// registered with every consumer). Consumers are looked at in turn from where the last
    /// look stopped.
    pub fn poll_delivery(&mut self, cx: &mut Context<'_>) -> Poll<(usize, Option<Delivery>)> {
        let n = self.subscriptions.len();
        for step in 0..n {
            let i = (self.rotor + step) % n;
            let sub = &mut self.subscriptions[i];
            if let Some(consumed) = start_turn(sub, cx) {
                match consumed {
                    Ok(consumer) => sub.consumer = Some(consumer),
                    // A queue gone meanwhile ends it as a deleted queue ends any consumer.
                    Err(_) => {
                        self.rotor = (i + 1) % n;
                        return Poll::Ready((i, None));
                    }
                }
            }
            // A paused or full channel is looked at again after the next input, which is
            // what can change that.
            if !self.may_deliver(i) {
                continue;
            }
            let Some(consumer) = self.subscriptions[i].consumer.as_mut() else {
                continue;
            };
            if let Poll::Ready(d) = pin!(consumer.next()).poll(cx) {
                self.rotor = (i + 1) % n;
                return Poll::Ready((i, d));
            }
        }
        Poll::Pending
    }

    /// A delivery that is already waiting, without blocking; `None` if none is.
    pub fn try_delivery(&mut self) -> Option<(usize, Option<Delivery>)> {
        let waker = std::task::Waker::noop();
        match self.poll_delivery(&mut Context::from_waker(waker)) {
            Poll::Ready(found) => Some(found),
            Poll::Pending => None,
        }
    }

    /// Sends a delivery that [`poll_delivery`](Connection::poll_delivery) or
    /// [`try_delivery`](Connection::try_delivery) returned for consumer `index` as a
    /// `basic.deliver` (a `None` there means that consumer's queue closed).
    pub fn handle_delivery(&mut self, index: usize, delivery: Option<Delivery>) {
        match delivery {
            Some(delivery) => self.deliver(index, delivery),
            None => {
                // The queue was deleted under the consumer: nothing more will come, and the
                // client hears so as from RabbitMQ (`consumer_cancel_notify`).
                let sub = self.subscriptions.swap_remove(index);
                let open = self.channels.get(&sub.channel).is_some_and(|s| !s.closing);
                if open {
                    let cancel = basic::Cancel {
                        consumer_tag: sub.tag.clone(),
                        nowait: true,
                    };
                    self.forget_consumer_tag(sub.channel, &sub.tag);
                    self.send(
                        sub.channel,
                        AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel)),
                    );
                }
            }
        }
    }

    /// Cancels the broker consumers of `channel` (all of them for `None`): the deliveries
    /// they received and did not settle come back to the queue, redelivered; those still
    /// unread are released.
    pub(super) fn end_subscriptions(&mut self, channel: Option<u16>) {
        let mut i = 0;
        let mut queues = Vec::new();
        while i < self.subscriptions.len() {
            if channel.is_none_or(|c| self.subscriptions[i].channel == c) {
                let sub = self.subscriptions.swap_remove(i);
                if let Some(consumer) = sub.consumer {
                    self.cancel_consumer(consumer);
                }
                queues.push(sub.queue);
            } else {
                i += 1;
            }
        }
        for queue in queues {
            self.auto_delete(&queue);
        }
    }

    /// Acks what was delivered to `no_ack` consumers since the last time.
    pub(super) fn flush_auto_acks(&mut self) {
        for (queue, settles) in self.auto_acks.drain(..) {
            // A `false` is a lease that ran out meanwhile: counted stale by the broker.
            // Waited for, though no answer is needed: while the connection waits, the
            // shard gathers the next deliveries into one batch; without the wait the
            // connection comes back for them a few at a time, at more CPU per message.
            // Not on a durable queue, whose answer waits for an fsync.
            if queue.is_durable() {
                queue.settle_batch_nowait(&settles);
            } else {
                queue.settle_batch(&settles);
            }
        }
    }
}

/// A waiting subscription's broker consumer, once its turn came (`x-single-active-consumer`):
/// made at once on a queue in memory; on a durable queue, where the deliveries it starts
/// wait for the disk, made off this thread and taken once ready. `None` while it waits.
fn start_turn(
    sub: &mut Subscription,
    cx: &mut Context<'_>,
) -> Option<Result<Consumer, leasemq::Error>> {
    if sub.starting.is_none() {
        let waiting = sub.waiting.as_ref()?;
        if !waiting.turn.has_come(cx) {
            return None;
        }
        let waiting = sub.waiting.take()?;
        let queue = sub.queue.clone();
        let consume =
            move || queue.consume_with_priority(&waiting.name, waiting.config, waiting.priority);
        if !sub.queue.is_durable() {
            return Some(consume());
        }
        sub.starting = Some(offload::run(consume));
    }
    let starting = sub.starting.as_mut()?;
    let Poll::Ready(consumed) = starting.as_mut().poll(cx) else {
        return None;
    };
    sub.starting = None;
    Some(consumed.unwrap_or(Err(leasemq::Error::ShutDown)))
}
