//! A channel's consumers as AMQP sees them: the broker consumer each stands for, or the
//! turn it waits for on a queue with a single active consumer.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use amq_protocol::types::ShortString;
use leasemq::{ConsumeOptions, Consumer, Delivery, Queue};

use crate::consumers;
use crate::offload::{self, Offloaded};

/// One consumer of a channel: the broker's consumer and what AMQP calls it.
pub(super) struct Subscription {
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
    /// Its deliveries' lease, where its `x-consumer-timeout` set one of its own.
    pub(super) lease: Option<std::time::Duration>,
    /// Its place among its queue's consumers, given back as the subscription ends.
    pub(super) _claim: consumers::Claim,
}

/// A subscription waiting its turn (`x-single-active-consumer`): the broker consumer it
/// makes when the turn comes.
pub(super) struct Waiting {
    pub(super) turn: Arc<consumers::Turn>,
    pub(super) name: String,
    pub(super) config: leasemq::ConsumerConfig,
    pub(super) options: ConsumeOptions,
}

/// A subscription whose turn came on a durable queue: its broker consumer is being made
/// off the connection's thread (the deliveries it starts wait for the disk).
pub(super) type Starting = Offloaded<Result<Consumer, leasemq::Error>>;

impl Subscription {
    /// Its next delivery, `Ready(None)` once its queue is gone, or `Pending`. A
    /// subscription waiting its turn makes its broker consumer first, once the turn comes.
    /// `deliverable` says whether its channel takes a delivery now; if not, none is taken.
    pub(super) fn poll_delivery(
        &mut self,
        deliverable: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Delivery>> {
        if let Some(started) = start_turn(self, cx) {
            match started {
                Ok(consumer) => self.consumer = Some(consumer),
                // A queue gone meanwhile ends it as a deleted queue ends any consumer.
                Err(_) => return Poll::Ready(None),
            }
        }
        // A paused or full channel is looked at again after the next input, which is
        // what can change that.
        match self.consumer.as_mut() {
            Some(consumer) if deliverable => pin!(consumer.next()).poll(cx),
            _ => Poll::Pending,
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
        let consume = move || queue.consume_with(&waiting.name, waiting.config, waiting.options);
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
