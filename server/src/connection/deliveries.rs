//! The deliveries the channels' consumers make: found in turn, so that none starves the
//! others, sent on their channels, and those of `no_ack` consumers acked in batches once
//! their frames leave.

use std::task::{Context, Poll};

use amq_protocol::protocol::{basic, AMQPClass};
use leasemq::Delivery;

use super::Connection;

/// Which consumer a delivery came from: a channel and its place among the channel's
/// consumers, as [`Connection::poll_delivery`] found it. Good only until the connection
/// is next called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerSlot {
    channel: u16,
    index: usize,
}

impl Connection {
    /// The next delivery of any consumer of this connection and which consumer made it (a
    /// `None` delivery: that consumer's queue closed), or `Pending`, with the waker
    /// registered with every consumer. Channels are looked at in turn from where the last
    /// look stopped, and each channel's consumers in turn, so that none starves the others.
    pub fn poll_delivery(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(ConsumerSlot, Option<Delivery>)> {
        let n = self.consuming.len();
        for step in 0..n {
            let k = (self.rotor + step) % n;
            let channel = self.consuming[k];
            let Some(state) = self.channels.get_mut(&channel) else {
                continue;
            };
            if let Poll::Ready((index, d)) = state.poll_delivery(cx) {
                self.rotor = (k + 1) % n;
                return Poll::Ready((ConsumerSlot { channel, index }, d));
            }
        }
        Poll::Pending
    }

    /// A delivery that is already waiting, without blocking; `None` if none is.
    pub fn try_delivery(&mut self) -> Option<(ConsumerSlot, Option<Delivery>)> {
        let waker = std::task::Waker::noop();
        match self.poll_delivery(&mut Context::from_waker(waker)) {
            Poll::Ready(found) => Some(found),
            Poll::Pending => None,
        }
    }

    /// Sends a delivery that [`poll_delivery`](Connection::poll_delivery) or
    /// [`try_delivery`](Connection::try_delivery) returned for consumer `slot` as a
    /// `basic.deliver` (a `None` there means that consumer's queue closed).
    pub fn handle_delivery(&mut self, slot: ConsumerSlot, delivery: Option<Delivery>) {
        let ConsumerSlot { channel: ch, index } = slot;
        let Some(state) = self.channels.get_mut(&ch) else {
            return;
        };
        if index >= state.consumers.len() {
            return;
        }
        let Some(delivery) = delivery else {
            // The queue was deleted under the consumer: nothing more will come, and the
            // client hears so as from RabbitMQ (`consumer_cancel_notify`).
            let sub = state.consumers.swap_remove(index);
            let open = !state.closing;
            self.forget_consumer_channel(ch);
            if open {
                let cancel = basic::Cancel {
                    consumer_tag: sub.tag.clone(),
                    nowait: true,
                };
                self.forget_consumer_tag(ch, &sub.tag);
                self.send(ch, AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel)));
            }
            return;
        };
        self.deliver(ch, index, delivery);
    }

    /// Takes channel `ch` out of those looked at for deliveries once it has no consumer.
    pub(super) fn forget_consumer_channel(&mut self, ch: u16) {
        let consumes = (self.channels.get(&ch)).is_some_and(|state| !state.consumers.is_empty());
        if !consumes {
            self.consuming.retain(|&c| c != ch);
        }
    }

    /// Cancels the broker consumers of `channel` (all of them for `None`): the deliveries
    /// they received and did not settle come back to the queue, redelivered; those still
    /// unread are released.
    pub(super) fn end_subscriptions(&mut self, channel: Option<u16>) {
        let ended: Vec<_> = match channel {
            Some(ch) => (self.channels.get_mut(&ch).into_iter())
                .flat_map(|state| state.consumers.drain(..))
                .collect(),
            None => (self.channels.values_mut())
                .flat_map(|state| state.consumers.drain(..))
                .collect(),
        };
        match channel {
            Some(ch) => self.consuming.retain(|&c| c != ch),
            None => self.consuming.clear(),
        }
        let mut queues = Vec::with_capacity(ended.len());
        for sub in ended {
            if let Some(consumer) = sub.consumer {
                self.cancel_consumer(consumer);
            }
            queues.push(sub.queue);
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
