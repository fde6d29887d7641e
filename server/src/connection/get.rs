//! `basic.get`: one message taken through a consumer of its own, answered with `get-ok`
//! (or `get-empty`), its lease held on the channel until it is settled.

use std::sync::Arc;
use std::time::Duration;

use amq_protocol::protocol::{basic, AMQPClass};
use amq_protocol::types::ShortString;
use leasemq::{Broker, Consumer, ConsumerConfig, Delivery, Queue};

use super::channel::{Stopped, Unacked};
use super::consume::write_delivery;
use super::fault::{broker_fault, Fault};
use super::{code, Connection};
use crate::content::{self, PropertiesSeen};
use crate::vhost::VHost;
use crate::wire::Output;

impl Connection {
    /// `basic.get`: one message under a lease, as a delivery of a consumer made for it,
    /// stopped at once (it keeps that one lease until it is settled).
    pub(super) fn get(&mut self, ch: u16, get: basic::Get) -> Result<(), Fault> {
        let m = AMQPClass::Basic(basic::AMQPMethod::Get(get.clone()));
        let queue = self.named_queue(ch, get.queue.as_str(), &m)?;
        self.vhost.expiring.touch(queue.name());
        self.next_consumer += 1;
        let number = self.next_consumer;
        let take = Take {
            vhost: Arc::clone(&self.vhost),
            broker: self.broker.clone(),
            queue: queue.clone(),
            consumer: format!("amqp-{}-{}", self.id, number),
            ttl: self.message_ttl(queue.name()),
            no_ack: get.no_ack,
        };
        if !queue.is_durable() {
            let taken = take.run(false);
            if !matches!(&taken, Ok(Taken { again: true, .. })) {
                return self.got(ch, number, &queue, taken, &m);
            }
            // A look at the queue's head held its messages: off this thread, once it ends.
        }
        // The consume and the settles wait for the disk: off this thread.
        self.await_offloaded(
            ch,
            move || take.run(true),
            move |conn, taken| conn.got(ch, number, &queue, taken, &m),
        );
        Ok(())
    }

    /// Answers a `basic.get` of `queue` on channel `ch` with what its consumer (numbered
    /// `number`) took: `get-empty`, or `get-ok` and the message, held unsettled on the
    /// channel unless it was acked at once (`no_ack`).
    fn got(
        &mut self,
        ch: u16,
        number: u64,
        queue: &Queue,
        taken: Result<Taken, leasemq::Error>,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let Taken {
            delivery,
            kept,
            ready,
            ..
        } = taken.map_err(|e| broker_fault(ch, &e, m))?;
        let Some(delivery) = delivery else {
            let empty = basic::AMQPMethod::GetEmpty(basic::GetEmpty {});
            self.send(ch, AMQPClass::Basic(empty));
            return Ok(());
        };
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        state.last_tag += 1;
        let channel_tag = state.last_tag;
        if let Some(consumer) = kept {
            let now = self.settings.lease_clock.now_ms();
            let unacked = Unacked::new(queue.clone(), delivery.tag(), number, now);
            state.hold(channel_tag, unacked, now);
            state.stopped.push(Stopped {
                number,
                _consumer: consumer,
                outstanding: 1,
                cancelled: false,
            });
        }
        self.write_get_ok(ch, channel_tag, queue, &delivery, ready);
        Ok(())
    }

    /// Writes `basic.get-ok` for `delivery` of `queue`, as channel tag `channel_tag` on
    /// channel `ch` with `ready` messages left, then its content.
    fn write_get_ok(
        &mut self,
        ch: u16,
        channel_tag: u64,
        queue: &Queue,
        delivery: &Delivery,
        ready: usize,
    ) {
        let envelope = delivery.envelope();
        let message_count = u32::try_from(ready).unwrap_or(u32::MAX);
        let get_ok = |out: &mut Output, exchange: &str, routing_key: &str| {
            let ok = basic::GetOk {
                delivery_tag: channel_tag,
                redelivered: envelope.redelivered(),
                exchange: ShortString::from(exchange),
                routing_key: ShortString::from(routing_key),
                message_count,
            };
            out.method(ch, AMQPClass::Basic(basic::AMQPMethod::GetOk(ok)))
        };
        let (out, seen) = (&mut self.out, &mut self.seen.output);
        let written = write_delivery(
            out,
            seen,
            ch,
            self.frame_max,
            envelope,
            queue.name(),
            get_ok,
        );
        if written.is_err() {
            self.abort(Fault::connection(
                code::INTERNAL_ERROR,
                "could not write a frame",
            ));
        }
    }
}

/// What a `basic.get` takes from its queue, with no connection at hand (so that it may
/// run off the connection's thread).
struct Take {
    vhost: Arc<VHost>,
    broker: Broker,
    queue: Queue,
    /// The broker's name of its consumer.
    consumer: String,
    /// The queue's `x-message-ttl`.
    ttl: Option<u64>,
    /// Acked at once.
    no_ack: bool,
}

/// What a `basic.get` took.
struct Taken {
    /// The message, if one was ready that had not expired.
    delivery: Option<Delivery>,
    /// The stopped consumer that holds its lease until it is settled; `None` once acked.
    kept: Option<Consumer>,
    /// How many messages are ready after it.
    ready: usize,
    /// It took nothing while a look at the queue's head (`message_expiry.rs`) may have
    /// held the queue's messages, and was not to wait for the look: take again.
    again: bool,
}

impl Take {
    /// Takes as [`take`](Take::take) does. A look at the head (`message_expiry.rs`) holds
    /// the queue's messages for a moment, and a take meets nothing then: one that met
    /// nothing while a look was under way takes again after the look, if it `waits`, else
    /// answers `again`.
    fn run(&self, waits: bool) -> Result<Taken, leasemq::Error> {
        let expiry = &self.vhost.message_expiry;
        let mut tries = 1;
        loop {
            let looks = expiry.looks();
            let mut taken = self.take()?;
            if taken.delivery.is_some() || tries == GET_TRIES || !expiry.may_have_hidden(looks) {
                return Ok(taken);
            }
            if !waits {
                taken.again = true;
                return Ok(taken);
            }
            expiry.wait_for_look(self.queue.name(), LOOK_WAIT);
            tries += 1;
        }
    }

    /// Takes the first ready message that has not expired through a consumer of
    /// prefetch 1. The consume call is a barrier: a message that was ready is in the
    /// consumer then. An expired one is dropped or dead-lettered, and its ack (also a
    /// barrier) lets the next in; a long run of them is dropped over several gets. The
    /// consumer is stopped before an ack at once: else the credit the ack frees would take
    /// the next message, and the cancel would hand it back to the front of the queue.
    fn take(&self) -> Result<Taken, leasemq::Error> {
        let config = ConsumerConfig { prefetch: 1 };
        let consumer = self.queue.consume(&self.consumer, config)?;
        let mut seen = PropertiesSeen::default();
        let mut dropped = 0;
        let delivery = loop {
            let Ok(Some(delivery)) = consumer.try_recv() else {
                break None;
            };
            let at = content::expires_at(&delivery.envelope().body, self.ttl, &mut seen);
            if at.is_none_or(|at| self.vhost.clock.now_ms() <= at) {
                break Some(delivery);
            }
            // Dead-lettered or dropped; either way its ack lets the next one in.
            if !self.vhost.expire(&self.broker, &self.queue, &delivery) {
                delivery.release();
                break None;
            }
            dropped += 1;
            if dropped == GET_DROPS_AT_MOST {
                break None;
            }
        };
        let kept = match &delivery {
            None => {
                consumer.cancel();
                None
            }
            Some(delivery) if self.no_ack => {
                consumer.stop();
                delivery.ack();
                consumer.cancel();
                None
            }
            Some(_) => {
                consumer.stop();
                Some(consumer)
            }
        };
        let ready = self.queue.stats().ready;
        Ok(Taken {
            delivery,
            kept,
            ready,
            again: false,
        })
    }
}
/// How many times one `basic.get` takes from a queue whose head a look held.
const GET_TRIES: u32 = 3;
/// The longest a `basic.get` waits for a look at its queue's head to end.
const LOOK_WAIT: Duration = Duration::from_secs(1);

/// The most expired messages one `basic.get` drops before it answers `get-empty`.
pub(super) const GET_DROPS_AT_MOST: usize = 1024;
