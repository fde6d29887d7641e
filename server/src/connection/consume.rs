//! Consumers, deliveries and settles: `basic.consume`, `cancel`, `get`, `recover`, `ack`,
//! `nack` and `reject`, and the deliveries a channel's consumers make.

use amq_protocol::protocol::{basic, AMQPClass};
use amq_protocol::types::ShortString;
use leasemq::{ConsumeOptions, Consumer, ConsumerConfig, Delivery, Envelope, Queue, Settle};

use super::answers::Pending;
use super::channel::{requeue, SettleRequest, Stopped, Unacked};
use super::fault::{broker_fault, Fault};
use super::subscription::{Subscription, Waiting};
use super::{code, reply_to, unserved, Connection};
use crate::content::PropertiesSeen;
use crate::declared::Declared;
use crate::message_expiry;
use crate::wire::{GenFailed, Output};
use crate::{arguments, content, names, offload, wire};

impl Connection {
    pub(super) fn consume(&mut self, ch: u16, consume: basic::Consume) -> Result<(), Fault> {
        let m = AMQPClass::Basic(basic::AMQPMethod::Consume(consume.clone()));
        // As in RabbitMQ, a tag in use on the channel is refused before anything else.
        let channel = self.channels.get(&ch).expect("checked by the caller");
        if channel.consumer_tags.contains(&consume.consumer_tag) {
            let tag = &consume.consumer_tag;
            let text = format!("NOT_ALLOWED - attempt to reuse consumer tag '{tag}'");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m));
        }
        if self.settings.cluster {
            if let Some(fault) = unserved::consume(ch, &consume) {
                return Err(fault);
            }
        }
        let (queue, options) = self.consume_queue(ch, &consume, &m)?;
        self.vhost.expiring.touch(queue.name());
        self.next_consumer += 1;
        let number = self.next_consumer;
        let tag = self.consumer_tag(ch, &consume.consumer_tag);
        // RabbitMQ's rule for `exclusive` (see `consumers.rs`), across every connection,
        // and the turns of a single active consumer.
        let single_active = (self.vhost.declared.lock().expect("never poisoned"))
            .get(queue.name())
            .is_some_and(Declared::is_single_active);
        let Some((claim, turn)) =
            (self.vhost.consumers).claim(queue.name(), consume.exclusive, single_active)
        else {
            return Err(in_exclusive_use(ch, &queue, &m));
        };
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let prefetch = state.consumer_prefetch(consume.no_ack);
        // The broker's consumer name is the connection's, unique whatever tags clients pick.
        let name = format!("amqp-{}-{}", self.id, self.next_consumer);
        let config = ConsumerConfig {
            prefetch: u32::from(prefetch),
        };
        let mut subscription = Subscription {
            message_ttl: self.message_ttl(queue.name()),
            number,
            tag,
            queue: queue.clone(),
            consumer: None,
            waiting: None,
            starting: None,
            no_ack: consume.no_ack,
            lease: options.ack_timeout,
            _claim: claim,
        };
        let nowait = consume.nowait;
        // One that waits its turn makes its broker consumer when the turn comes.
        if let Some(turn) = turn {
            subscription.waiting = Some(Waiting {
                turn,
                name,
                config,
                options,
            });
            self.subscribe(ch, subscription, nowait);
            return Ok(());
        }
        let start = move || queue.consume_with(&name, config, options);
        if !subscription.queue.is_durable() {
            let consumer = start().map_err(|e| broker_fault(ch, &e, &m))?;
            subscription.consumer = Some(consumer);
            self.subscribe(ch, subscription, nowait);
            return Ok(());
        }
        // The deliveries it starts wait for the disk: off this thread.
        self.await_offloaded(ch, start, move |conn, consumer| {
            subscription.consumer = Some(consumer.map_err(|e| broker_fault(ch, &e, &m))?);
            conn.subscribe(ch, subscription, nowait);
            Ok(())
        });
        Ok(())
    }

    /// Starts `subscription` on channel `ch`: its tag taken, `consume-ok` sent (unless
    /// `nowait`), then its deliveries.
    fn subscribe(&mut self, ch: u16, subscription: Subscription, nowait: bool) {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        state.consumer_tags.push(subscription.tag.clone());
        let tag = subscription.tag.clone();
        if state.consumers.is_empty() {
            self.consuming.push(ch);
        }
        state.consumers.push(subscription);
        if !nowait {
            let ok = basic::ConsumeOk { consumer_tag: tag };
            self.send(ch, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok)));
        }
    }

    /// The queue a `basic.consume` names (a direct reply-to queue made for it) and what
    /// the consumer's arguments ask (its priority and lease), once they pass. They are
    /// looked at once the queue is found (a missing one is a 404 first), and a 406 names
    /// the queue, as in RabbitMQ; a reply-to queue is made only once they pass.
    fn consume_queue(
        &mut self,
        ch: u16,
        consume: &basic::Consume,
        m: &AMQPClass,
    ) -> Result<(Queue, ConsumeOptions), Fault> {
        let checked = arguments::consume_options(&consume.arguments);
        let vhost = std::sync::Arc::clone(&self.vhost);
        let refuse = |refused: arguments::Refused, shown: &str| {
            if refused.code == code::NOT_IMPLEMENTED {
                Fault::connection(refused.code, refused.text).for_method(m)
            } else {
                let refused = refused.for_queue(shown, &vhost.name);
                Fault::channel(ch, refused.code, refused.text, m)
            }
        };
        Ok(match consume.queue.as_str() {
            reply_to::REPLY_TO => {
                let options = checked.map_err(|r| refuse(r, reply_to::REPLY_TO))?;
                (self.reply_queue(ch, consume, m)?, options)
            }
            name => {
                let queue = self.named_queue(ch, name, m)?;
                let options = checked.map_err(|r| refuse(r, &names::amqp(queue.name())))?;
                (queue, options)
            }
        })
    }

    /// The tag of a new consumer on channel `ch`: `given`, or for an empty one a tag the
    /// server picks, new on the channel even where a client chose one of the same form.
    fn consumer_tag(&mut self, ch: u16, given: &ShortString) -> ShortString {
        if !given.as_str().is_empty() {
            return given.clone();
        }
        let channel = self.channels.get(&ch).expect("checked by the caller");
        loop {
            let tag = ShortString::from(format!("amq.ctag-{}-{}", self.id, self.next_consumer));
            if !channel.consumer_tags.contains(&tag) {
                return tag;
            }
            self.next_consumer += 1;
        }
    }

    /// `basic.cancel`: the consumer takes no more deliveries, and what it delivered and
    /// the client has not settled stays leased to the channel (RabbitMQ's graceful
    /// shutdown: cancel, finish the work in hand, ack). Deliveries not yet sent are
    /// released. The broker consumer is dropped once none of its deliveries is unsettled,
    /// or with the channel, which returns what it still holds.
    pub(super) fn cancel(&mut self, ch: u16, cancel: basic::Cancel) {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        if let Some(i) = (state.consumers.iter()).position(|s| s.tag == cancel.consumer_tag) {
            let Subscription {
                number,
                consumer,
                queue,
                _claim: claim,
                ..
            } = state.consumers.swap_remove(i);
            self.forget_consumer_channel(ch);
            if let Some(consumer) = consumer {
                self.keep_leases(ch, number, consumer);
            }
            // Its place goes once its broker consumer is stopped: the next in line on a
            // queue with a single active consumer must not share a delivery round with it.
            drop(claim);
            self.auto_delete(&queue);
        }
        self.forget_consumer_tag(ch, &cancel.consumer_tag);
        if !cancel.nowait {
            let ok = basic::CancelOk {
                consumer_tag: cancel.consumer_tag,
            };
            self.send(ch, AMQPClass::Basic(basic::AMQPMethod::CancelOk(ok)));
        }
    }

    /// Stops `consumer` and keeps it while deliveries of it on `ch` are unsettled.
    pub(super) fn keep_leases(&mut self, ch: u16, number: u64, consumer: Consumer) {
        let Some(state) = self.channels.get_mut(&ch) else {
            return;
        };
        // Deliveries whose settle a transaction holds are still the consumer's until the
        // commit (a rollback gives them back to the channel).
        let held = state.tx.as_ref().map_or(0, |tx| tx.held_of(number));
        let outstanding = (state.unacked.values())
            .filter(|u| u.consumer == number)
            .count()
            + held;
        if outstanding == 0 {
            self.cancel_consumer(consumer);
            return;
        }
        if !consumer.queue().is_durable() {
            consumer.stop();
            state.stopped.push(Stopped {
                number,
                _consumer: consumer,
                outstanding,
                cancelled: true,
            });
            return;
        }
        // Its stop may release deliveries, whose log waits for the disk: off this thread,
        // and kept once stopped (the next frame, which may settle its deliveries, waits).
        let stop = move || {
            consumer.stop();
            consumer
        };
        self.await_offloaded(ch, stop, move |conn, consumer| {
            let state = conn.channels.get_mut(&ch).expect("checked by await_answer");
            state.stopped.push(Stopped {
                number,
                _consumer: consumer,
                outstanding,
                cancelled: true,
            });
            Ok(())
        });
    }

    /// Ends `consumer` and returns once its leases are back in its queue: at once on a
    /// queue in memory; on a durable one, whose log waits for the disk, off this thread,
    /// awaited before the next frame (and done all the same if the connection is ending).
    pub(super) fn cancel_consumer(&mut self, consumer: Consumer) {
        if !consumer.queue().is_durable() {
            consumer.cancel();
            return;
        }
        self.await_done(offload::run(move || consumer.cancel()));
    }

    pub(super) fn forget_consumer_tag(&mut self, ch: u16, tag: &ShortString) {
        if let Some(state) = self.channels.get_mut(&ch) {
            state.consumer_tags.retain(|t| t != tag);
        }
    }

    /// Drops the stopped consumers whose deliveries are all settled. Called once the
    /// gathered settles have reached the broker, so that no lease comes back first.
    pub(super) fn drop_settled_consumers(&mut self) {
        for state in self.channels.values_mut() {
            state.stopped.retain(|s| s.outstanding > 0);
        }
    }

    /// `basic.recover` with `requeue`: every unsettled delivery of the channel goes back
    /// and is redelivered, as after a nack. RabbitMQ does not serve `requeue=false`.
    pub(super) fn recover(&mut self, ch: u16, requeue: bool, m: &AMQPClass) -> Result<(), Fault> {
        if !requeue {
            let text = "basic.recover with requeue=false is not supported (nor by RabbitMQ)";
            return Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m));
        }
        // At once, outside any transaction, as RabbitMQ requeues: not held to a commit.
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let taken = std::mem::take(&mut state.unacked).into_iter().collect();
        self.settle_taken(ch, taken, self::requeue(true), false);
        Ok(())
    }

    /// `basic.ack`/`nack`/`reject` of one channel tag, or of every unsettled one up to it
    /// (`multiple`; tag 0 with `multiple` means all of them). A transactional channel holds
    /// it until its commit.
    pub(super) fn settle(
        &mut self,
        ch: u16,
        tag: u64,
        multiple: bool,
        how: Settle,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let settles = state.settle(ch, tag, multiple, how, m)?;
        self.gather_settles(ch, settles, false);
        Ok(())
    }

    /// Settles `taken`, deliveries already taken from channel `ch`'s unacked ones, as
    /// `how` says: gathered into this read's settle batches. With `awaited`, the batches
    /// are made waiting for their answers (and, on a durable queue, the disk), as a
    /// commit's are.
    pub(super) fn settle_taken(
        &mut self,
        ch: u16,
        taken: Vec<(u64, Unacked)>,
        how: Settle,
        awaited: bool,
    ) {
        let Some(state) = self.channels.get_mut(&ch) else {
            return;
        };
        let settles = state.settles_of(taken, how);
        self.gather_settles(ch, settles, awaited);
    }

    /// Gathers `settles`, asked for by channel `ch`, into this read's settle batches; a
    /// batch is awaited if any settle in it asks to be.
    fn gather_settles(&mut self, ch: u16, settles: Vec<SettleRequest>, awaited: bool) {
        for (queue, tag, how) in settles {
            match self.pending.last_mut() {
                Some(Pending::Settle {
                    channel,
                    queue: q,
                    settles,
                    awaited: a,
                }) if *channel == ch && q.name() == queue.name() => {
                    settles.push((tag, how));
                    *a |= awaited;
                }
                _ => self.pending.push(Pending::Settle {
                    channel: ch,
                    queue,
                    settles: vec![(tag, how)],
                    awaited,
                }),
            }
        }
    }

    /// Sends one delivery of consumer `index` of channel `ch` as `basic.deliver` +
    /// content.
    pub(super) fn deliver(&mut self, ch: u16, index: usize, delivery: Delivery) {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let sub = &state.consumers[index];
        let (no_ack, number, ttl, lease) = (sub.no_ack, sub.number, sub.message_ttl, sub.lease);
        if self.expired(ttl, delivery.envelope()) {
            // Never sent, as RabbitMQ expires it at the head of its queue: dead-lettered
            // where the queue has an exchange for it, else dropped (acked with the automatic
            // acknowledgements).
            let queue = self.channels[&ch].consumers[index].queue.clone();
            if message_expiry::dead_letters(&queue) {
                self.vhost.message_expiry.hand_over(queue, delivery);
            } else {
                self.drop_expired(queue, &delivery);
            }
            return;
        }
        let state = self.channels.get_mut(&ch).expect("checked above");
        state.last_tag += 1;
        let channel_tag = state.last_tag;
        if !no_ack {
            let now = self.settings.lease_clock.now_ms();
            let queue = state.consumers[index].queue.clone();
            let lease = lease.unwrap_or(queue.config().ack_timeout);
            let unacked = Unacked::leased(queue, delivery.tag(), (number, lease), now);
            state.hold(channel_tag, unacked, now);
        }
        let sub = &state.consumers[index];
        let envelope = delivery.envelope();
        let deliver = |out: &mut Output, exchange: &str, routing_key: &str| {
            let deliver = wire::Deliver {
                consumer_tag: sub.tag.as_str().as_bytes(),
                delivery_tag: channel_tag,
                redelivered: envelope.redelivered(),
                exchange: exchange.as_bytes(),
                routing_key: routing_key.as_bytes(),
            };
            out.deliver(ch, &deliver)
        };
        let (out, seen) = (&mut self.out, &mut self.seen.output);
        let queue = sub.queue.name();
        let written =
            write_delivery(out, seen, ch, self.frame_max, envelope, queue, deliver).is_ok();
        if no_ack {
            // Automatic acknowledgement: settled as it is sent (see `auto_acks`).
            let queue = &sub.queue;
            let ack = (delivery.tag(), Settle::Ack);
            match self.auto_acks.last_mut() {
                Some((last, settles)) if last.name() == queue.name() => settles.push(ack),
                _ => self.auto_acks.push((queue.clone(), vec![ack])),
            }
        }
        if !written {
            self.abort(Fault::connection(
                code::INTERNAL_ERROR,
                "could not write a frame",
            ));
        }
    }

    /// Whether `envelope`, about to be delivered from a queue whose `x-message-ttl` is
    /// `ttl`, has outlived its time (the queue's or its own `expiration`): it expires once
    /// the clock is past its arrival plus that time.
    pub(super) fn expired(&mut self, ttl: Option<u64>, envelope: &Envelope) -> bool {
        let at = content::expires_at(&envelope.body, ttl, &mut self.seen.output);
        at.is_some_and(|at| self.settings.clock.now_ms() > at)
    }

    /// Drops an expired delivery from `queue`: acked with the automatic acknowledgements
    /// (see `auto_acks`), never sent.
    pub(super) fn drop_expired(&mut self, queue: Queue, delivery: &Delivery) {
        let ack = (delivery.tag(), Settle::Ack);
        match self.auto_acks.last_mut() {
            Some((last, settles)) if last.name() == queue.name() => settles.push(ack),
            _ => self.auto_acks.push((queue, vec![ack])),
        }
        self.settings.metrics.ttl_expired.inc();
    }

    /// The `x-message-ttl` the queue called `name` was declared with.
    pub(super) fn message_ttl(&self, name: &str) -> Option<u64> {
        let declared = self.vhost.declared.lock().expect("never poisoned");
        declared.get(name).and_then(|d| d.message_ttl)
    }
}

/// Writes a delivery of `envelope` from `queue` on channel `ch`: the method `method` makes
/// from its exchange and routing key, then its content. The stored properties and names
/// are copied out as they came; a dead letter's (which gain `x-death` headers) and those of
/// a body put through the Rust API are written anew. Nothing is written if the method
/// cannot be.
pub(super) fn write_delivery(
    out: &mut Output,
    seen: &mut PropertiesSeen,
    ch: u16,
    frame_max: usize,
    envelope: &Envelope,
    queue: &str,
    method: impl FnOnce(&mut Output, &str, &str) -> Result<(), GenFailed>,
) -> Result<(), GenFailed> {
    let (anew, properties);
    // Through the default exchange, the routing key is the queue's name as clients know it.
    let queue = &names::amqp(queue);
    let content = match content::delivered_encoded(envelope, queue, seen) {
        Some(content) => content,
        None => {
            anew = content::delivered(envelope, queue);
            properties = anew.encoded_properties().ok_or(GenFailed)?;
            content::Encoded {
                properties: &properties,
                exchange: &anew.exchange,
                routing_key: &anew.routing_key,
                payload: &anew.payload,
            }
        }
    };
    method(out, content.exchange, content.routing_key)?;
    out.content_encoded(ch, content.properties, content.payload, frame_max);
    Ok(())
}

/// RabbitMQ's 403 for a consume of a queue another consumer holds exclusively.
fn in_exclusive_use(ch: u16, queue: &Queue, m: &AMQPClass) -> Fault {
    let (name, vhost) = (names::amqp(queue.name()), names::vhost_of(queue.name()));
    let text = format!("ACCESS_REFUSED - queue '{name}' in vhost '{vhost}' in exclusive use");
    Fault::channel(ch, code::ACCESS_REFUSED, text, m)
}
