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
use std::time::Duration;

use amq_protocol::protocol::{basic, channel, confirm, exchange, queue, tx, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use leasemq::{
    Consumer, ConsumerConfig, Delivery, DeliveryTag, Envelope, Error, Queue, QueueConfig, Settle,
};

use super::publish::{Incoming, Pending};
use super::tx::Tx;
use super::{code, method_name, reply_text, reply_to, Connection, Fault, Subscription, Waiting};
use crate::content::PropertiesSeen;
use crate::declared::Declared;
use crate::exchange::{HeadersBinding, Kind, Refusal, Shape};
use crate::message_expiry;
use crate::vhost::declare::{self, DeclareError, QueueDeclare};
use crate::wire::{GenFailed, Output};
use crate::{arguments, content, names, wire};

/// The most prefetch a broker consumer takes; also what `prefetch_count = 0` (AMQP's "no
/// limit") becomes.
const MAX_PREFETCH: u16 = u16::MAX;
/// A channel looks for deliveries whose lease has run out once it holds this many
/// unsettled, and again each time they have doubled since it last looked.
pub(super) const FORGET_EXPIRED_FROM: usize = 1024;

/// One open channel.
#[derive(Default)]
pub(crate) struct Channel {
    /// We sent `channel.close` and wait for `close-ok`.
    pub(super) closing: bool,
    /// `basic.qos` prefetch for each consumer started after it; 0 means no limit.
    prefetch: u16,
    /// `basic.qos global=true` (RabbitMQ's meaning): the most deliveries unsettled on the
    /// channel, all its consumers together; 0 means no limit.
    global_prefetch: u16,
    /// The client asked for no deliveries (`channel.flow active=false`).
    paused: bool,
    /// The last delivery tag handed out on this channel.
    last_tag: u64,
    /// Deliveries not yet settled, by channel delivery tag.
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// How many unsettled deliveries make the channel look for expired ones again (at
    /// least [`FORGET_EXPIRED_FROM`]).
    forget_at: usize,
    /// The highest delivery tag forgotten because its lease had run out (0: none). An ack
    /// of a tag up to it that the channel no longer holds is a late ack, ignored.
    forgotten: u64,
    /// A publish whose content is still arriving.
    pub(super) incoming: Option<Incoming>,
    /// Consumer tags in use on this channel.
    consumer_tags: Vec<ShortString>,
    /// The queue last declared on this channel: AMQP's meaning of an empty queue name in
    /// the methods that name one.
    last_queue: Option<String>,
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
}

impl Channel {
    /// Deliveries not settled yet: unacked, or settled in a transaction not yet committed
    /// (a rollback gives them back), as RabbitMQ's channel-wide prefetch counts them.
    fn unsettled(&self) -> usize {
        self.unacked.len() + self.tx.as_ref().map_or(0, Tx::held_deliveries)
    }

    /// Holds delivery `channel_tag` until it is settled. First, once the unsettled ones
    /// have reached [`FORGET_EXPIRED_FROM`], or doubled since the last look, forgets those
    /// whose lease has certainly run out by `now` (see [`Channel::forget_expired`]).
    fn hold(&mut self, channel_tag: u64, unacked: Unacked, now: u64) {
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
    fn forget_expired(&mut self, now: u64) {
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
    queue: Queue,
    tag: DeliveryTag,
    /// The number of the subscription it came from.
    pub(super) consumer: u64,
    /// When its lease has certainly run out, on the lease clock: when the connection had
    /// it, plus its queue's `ack_timeout`.
    expires: u64,
}

impl Unacked {
    /// Delivery `tag` of `queue`, to the subscription numbered `consumer`, had `now`.
    fn new(queue: Queue, tag: DeliveryTag, consumer: u64, now: u64) -> Unacked {
        // Rounded up: never earlier than the broker's deadline.
        let lease = queue.config().ack_timeout.as_micros().div_ceil(1000);
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
    number: u64,
    /// Held for its leases; never read again.
    _consumer: Consumer,
    /// Its deliveries on the channel not yet settled.
    outstanding: usize,
    /// Stopped by `basic.cancel` (not made for a `basic.get`).
    cancelled: bool,
}

impl Connection {
    pub(super) fn handle_channel_method(
        &mut self,
        ch: u16,
        method: AMQPClass,
    ) -> Result<(), Fault> {
        let gathered = matches!(
            method,
            AMQPClass::Basic(
                basic::AMQPMethod::Publish(_)
                    | basic::AMQPMethod::Ack(_)
                    | basic::AMQPMethod::Nack(_)
                    | basic::AMQPMethod::Reject(_)
            )
        );
        if !gathered {
            // Whatever this method does, it comes after the publishes and settles before it.
            self.flush_pending();
        }
        let Some(state) = self.channels.get_mut(&ch) else {
            return self.handle_unopened(ch, method);
        };
        if state.closing {
            // After our channel.close only its close-ok (or the peer's own close) counts.
            match method {
                AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) => {
                    self.channels.remove(&ch);
                }
                AMQPClass::Channel(channel::AMQPMethod::Close(_)) => {
                    self.channels.remove(&ch);
                    self.send(
                        ch,
                        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                }
                _ => {}
            }
            return Ok(());
        }
        if state.incoming.is_some() {
            let text = format!(
                "expected content for basic.publish, got {}",
                method_name(&method)
            );
            return Err(Fault::connection(code::UNEXPECTED_FRAME, text).for_method(&method));
        }
        match method {
            AMQPClass::Channel(m) => self.channel_method(ch, m),
            AMQPClass::Basic(m) => self.basic_method(ch, m),
            AMQPClass::Queue(m) => self.queue_method(ch, m),
            AMQPClass::Exchange(m) => self.exchange_method(ch, m),
            AMQPClass::Confirm(confirm::AMQPMethod::Select(select)) => {
                self.confirm_select(ch, select)
            }
            AMQPClass::Tx(
                method @ (tx::AMQPMethod::Select(_)
                | tx::AMQPMethod::Commit(_)
                | tx::AMQPMethod::Rollback(_)),
            ) => self.handle_tx(ch, method),
            other => unsupported(other),
        }
    }

    /// A `channel` method on open channel `ch`.
    fn channel_method(&mut self, ch: u16, method: channel::AMQPMethod) -> Result<(), Fault> {
        match method {
            channel::AMQPMethod::Close(_) => {
                self.end_subscriptions(Some(ch));
                self.channels.remove(&ch);
                self.send(
                    ch,
                    AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                );
                Ok(())
            }
            channel::AMQPMethod::CloseOk(_) => Ok(()),
            channel::AMQPMethod::Flow(flow) => {
                let Some(state) = self.channels.get_mut(&ch) else {
                    return Ok(());
                };
                // Deliveries stop or start again; those the broker already handed to the
                // channel's consumers wait, leased, in their buffers (at most a prefetch).
                state.paused = !flow.active;
                let ok = channel::FlowOk {
                    active: flow.active,
                };
                self.send(ch, AMQPClass::Channel(channel::AMQPMethod::FlowOk(ok)));
                Ok(())
            }
            channel::AMQPMethod::Open(_) => {
                let text = format!("channel {ch} is already open");
                let method = AMQPClass::Channel(method);
                Err(Fault::connection(code::CHANNEL_ERROR, text).for_method(&method))
            }
            other => unsupported(AMQPClass::Channel(other)),
        }
    }

    /// A `basic` method on open channel `ch`.
    fn basic_method(&mut self, ch: u16, method: basic::AMQPMethod) -> Result<(), Fault> {
        let Some(state) = self.channels.get_mut(&ch) else {
            return Ok(());
        };
        match method {
            basic::AMQPMethod::Qos(qos) => {
                if qos.global {
                    state.global_prefetch = qos.prefetch_count;
                } else {
                    state.prefetch = qos.prefetch_count;
                }
                self.send(
                    ch,
                    AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
                Ok(())
            }
            basic::AMQPMethod::Publish(publish) => {
                if publish.immediate {
                    let text = "immediate=true is not supported (nor by RabbitMQ)";
                    let m = AMQPClass::Basic(basic::AMQPMethod::Publish(publish));
                    return Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m));
                }
                state.incoming = Some(Incoming {
                    publish,
                    content: None,
                });
                Ok(())
            }
            basic::AMQPMethod::Consume(consume) => self.consume(ch, consume),
            basic::AMQPMethod::Get(get) => self.get(ch, get),
            basic::AMQPMethod::Recover(recover) => {
                let m = AMQPClass::Basic(basic::AMQPMethod::Recover(recover.clone()));
                self.recover(ch, recover.requeue, &m)?;
                let ok = basic::AMQPMethod::RecoverOk(basic::RecoverOk {});
                self.send(ch, AMQPClass::Basic(ok));
                Ok(())
            }
            basic::AMQPMethod::RecoverAsync(recover) => {
                let m = AMQPClass::Basic(basic::AMQPMethod::RecoverAsync(recover.clone()));
                self.recover(ch, recover.requeue, &m)
            }
            basic::AMQPMethod::Cancel(cancel) => {
                self.cancel(ch, cancel);
                Ok(())
            }
            other => self.settle_method(ch, other),
        }
    }

    /// `basic.ack`, `basic.nack` or `basic.reject` on open channel `ch`.
    fn settle_method(&mut self, ch: u16, method: basic::AMQPMethod) -> Result<(), Fault> {
        let m = AMQPClass::Basic(method.clone());
        match method {
            basic::AMQPMethod::Ack(ack) => {
                self.settle(ch, ack.delivery_tag, ack.multiple, Settle::Ack, &m)
            }
            basic::AMQPMethod::Nack(nack) => self.settle(
                ch,
                nack.delivery_tag,
                nack.multiple,
                requeue(nack.requeue),
                &m,
            ),
            basic::AMQPMethod::Reject(reject) => {
                self.settle(ch, reject.delivery_tag, false, requeue(reject.requeue), &m)
            }
            _ => unsupported(m),
        }
    }

    /// A `queue` method on open channel `ch`.
    fn queue_method(&mut self, ch: u16, method: queue::AMQPMethod) -> Result<(), Fault> {
        match method {
            queue::AMQPMethod::Declare(declare) => self.declare(ch, declare),
            queue::AMQPMethod::Purge(purge) => self.purge(ch, purge),
            queue::AMQPMethod::Bind(bind) => self.bind(ch, bind),
            queue::AMQPMethod::Unbind(unbind) => self.unbind(ch, unbind),
            queue::AMQPMethod::Delete(delete) => self.delete(ch, delete),
            other => unsupported(AMQPClass::Queue(other)),
        }
    }

    /// An `exchange` method on open channel `ch`.
    fn exchange_method(&mut self, ch: u16, method: exchange::AMQPMethod) -> Result<(), Fault> {
        match method {
            exchange::AMQPMethod::Declare(declare) => self.exchange_declare(ch, declare),
            exchange::AMQPMethod::Delete(delete) => self.exchange_delete(ch, delete),
            exchange::AMQPMethod::Bind(bind) => {
                let m = AMQPClass::Exchange(exchange::AMQPMethod::Bind(bind.clone()));
                let (source, destination) = (bind.source.as_str(), bind.destination.as_str());
                let (key, arguments) = (bind.routing_key.as_str(), &bind.arguments);
                self.bind_exchange(ch, (source, key, destination), arguments, &m)?;
                if !bind.nowait {
                    let ok = exchange::AMQPMethod::BindOk(exchange::BindOk {});
                    self.send(ch, AMQPClass::Exchange(ok));
                }
                Ok(())
            }
            exchange::AMQPMethod::Unbind(unbind) => {
                let m = AMQPClass::Exchange(exchange::AMQPMethod::Unbind(unbind.clone()));
                let (source, destination) = (unbind.source.as_str(), unbind.destination.as_str());
                let (key, arguments) = (unbind.routing_key.as_str(), &unbind.arguments);
                self.unbind_exchange(ch, (source, key, destination), arguments, &m)?;
                if !unbind.nowait {
                    let ok = exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {});
                    self.send(ch, AMQPClass::Exchange(ok));
                }
                Ok(())
            }
            other => unsupported(AMQPClass::Exchange(other)),
        }
    }

    /// `confirm.select` on open channel `ch`: refused on a transactional channel.
    fn confirm_select(&mut self, ch: u16, select: confirm::Select) -> Result<(), Fault> {
        let Some(state) = self.channels.get_mut(&ch) else {
            return Ok(());
        };
        if state.tx.is_some() {
            let text = "PRECONDITION_FAILED - cannot switch from tx to confirm mode";
            let m = AMQPClass::Confirm(confirm::AMQPMethod::Select(select));
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
        }
        state.confirm = true;
        if !select.nowait {
            let ok = confirm::AMQPMethod::SelectOk(confirm::SelectOk {});
            self.send(ch, AMQPClass::Confirm(ok));
        }
        Ok(())
    }

    /// A method on a channel that is not open: only `channel.open` may come.
    fn handle_unopened(&mut self, ch: u16, method: AMQPClass) -> Result<(), Fault> {
        match method {
            AMQPClass::Channel(channel::AMQPMethod::Open(_)) if ch <= self.channel_max => {
                // What may still have come of a refused body on the channel's last life
                // does not count against the new one.
                self.refused_bodies.retain(|(c, _)| *c != ch);
                self.opened += 1;
                let serial = self.opened;
                self.channels.insert(
                    ch,
                    Channel {
                        serial,
                        ..Channel::default()
                    },
                );
                self.send(
                    ch,
                    AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
                );
                Ok(())
            }
            AMQPClass::Channel(channel::AMQPMethod::Open(_)) => {
                let text = format!("channel {ch} is over channel_max {}", self.channel_max);
                Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&method))
            }
            // A close-ok that crossed the peer's own close.
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) => Ok(()),
            other => {
                let text = format!("{} on channel {ch}, which is not open", method_name(&other));
                Err(Fault::connection(code::CHANNEL_ERROR, text).for_method(&other))
            }
        }
    }

    fn declare(&mut self, ch: u16, declare: queue::Declare) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Declare(declare.clone()));
        // An empty name asks the server to pick one, as RabbitMQ's `amq.gen-…`.
        // The broker's name for it (`names.rs`): a client's name with bytes the broker does
        // not take in names is escaped.
        let name = match declare.queue.as_str() {
            "" if !declare.passive => self.server_named_queue(),
            given => names::engine(given).into_owned(),
        };
        let name = name.as_str();
        if reply_to::is_reply_name(name) {
            return self.declare_reply_name(ch, &declare, &m);
        }
        self.check_exclusive(ch, name, &m)?;
        let queue = if declare.passive {
            let queue = self.queue(name).ok_or_else(|| no_queue(ch, name, &m))?;
            // A declare is a use, passive or not (RabbitMQ's `x-expires`).
            self.vhost.expiring.touch(name);
            queue
        } else {
            self.declare_in_vhost(ch, name, &declare, &m)?
        };
        if let Some(state) = self.channels.get_mut(&ch) {
            state.last_queue = Some(name.to_string());
        }
        if declare.nowait {
            return Ok(());
        }
        let stats = queue.stats();
        // Those waiting their turn count too, as in RabbitMQ.
        let consumers = (stats.consumers).max(self.vhost.consumers.consumer_count(name));
        let ok = queue::DeclareOk {
            queue: ShortString::from(names::amqp(name).into_owned()),
            message_count: u32::try_from(stats.ready).unwrap_or(u32::MAX),
            consumer_count: u32::try_from(consumers).unwrap_or(u32::MAX),
        };
        self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)));
        Ok(())
    }

    /// A declare that may make the queue, by the virtual host's rules (`VHost::declare_queue`);
    /// the queue is this connection's to use, and to delete when it ends if exclusive.
    fn declare_in_vhost(
        &mut self,
        ch: u16,
        name: &str,
        declare: &queue::Declare,
        m: &AMQPClass,
    ) -> Result<Queue, Fault> {
        // `durable` makes a durable queue when the server has a data dir; without one
        // every queue is in memory (the startup line says so), and `durable` is accepted
        // as RabbitMQ clients send it by habit.
        let base = QueueConfig {
            ack_timeout: self.settings.ack_timeout,
            max_body_bytes: self.max_stored_bytes(),
            // An exclusive queue goes with its connection, which a crash ends too: kept
            // on disk, it would come back with no owner, and its program's own redeclare
            // would be refused.
            durable: declare.durable && self.settings.durable && !declare.exclusive,
            ..QueueConfig::default()
        };
        let request = QueueDeclare {
            name,
            reserved: declare.queue.as_str().starts_with("amq."),
            durable: declare.durable,
            exclusive: declare.exclusive,
            auto_delete: declare.auto_delete,
            arguments: &declare.arguments,
            owner: self.id,
        };
        let declared = match self.vhost.declare_queue(&self.broker, &request, base) {
            Ok(declared) => declared,
            Err(DeclareError::Refused(refused)) => return Err(refused_fault(ch, refused, m)),
            Err(DeclareError::Broker(e)) => return Err(broker_fault(ch, &e, m)),
        };
        let queue = declared.queue;
        self.queues.insert(name.to_string(), queue.clone());
        // Exclusive queues of this connection that `x-expires` deleted are gone.
        self.exclusive.retain(|e| !e.is_closed());
        if declared.made_exclusive {
            self.exclusive.push(queue.clone());
        }
        Ok(queue)
    }

    /// The largest stored body: the largest payload, plus its properties (which fit one
    /// frame) and the few bytes of the stored layout.
    pub(super) fn max_stored_bytes(&self) -> usize {
        self.settings.max_message_bytes + self.settings.frame_max as usize + 16
    }

    /// A fresh name for a server-named queue: `amq.gen-`, then this server process's
    /// start time, the connection and a count, so that it is new in a data dir too.
    fn server_named_queue(&mut self) -> String {
        self.unique_name("amq.gen-")
    }

    /// A name no queue had in this data dir: `prefix`, then this server process's start
    /// time, the connection and a count.
    pub(super) fn unique_name(&mut self, prefix: &str) -> String {
        use std::sync::OnceLock;
        static STARTED: OnceLock<u128> = OnceLock::new();
        let started = STARTED.get_or_init(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(0, |d| d.as_nanos())
        });
        self.next_consumer += 1;
        format!("{prefix}{started:x}-{}-{}", self.id, self.next_consumer)
    }

    /// RabbitMQ's 405 for a queue another connection holds exclusively.
    fn check_exclusive(&self, ch: u16, name: &str, m: &AMQPClass) -> Result<(), Fault> {
        if self.locked_by_another(name) {
            return Err(locked(ch, name, m));
        }
        Ok(())
    }

    /// The name a method gives, or for an empty one the queue last declared on the
    /// channel (AMQP's rule, which RabbitMQ keeps).
    /// # Errors
    ///
    /// RabbitMQ's 404 for an empty name where no queue was declared on the channel.
    fn queue_name(&self, ch: u16, given: &str, m: &AMQPClass) -> Result<String, Fault> {
        if !given.is_empty() {
            return Ok(names::engine(given).into_owned());
        }
        let last = self.channels.get(&ch).and_then(|c| c.last_queue.clone());
        last.ok_or_else(|| {
            let text = "NOT_FOUND - no previously declared queue";
            Fault::channel(ch, code::NOT_FOUND, text, m)
        })
    }

    /// The queue a method names, or its 404 (405 when another connection holds it
    /// exclusively).
    fn named_queue(&mut self, ch: u16, name: &str, m: &AMQPClass) -> Result<Queue, Fault> {
        let name = &self.queue_name(ch, name, m)?;
        if reply_to::is_reply_name(name) {
            return Err(no_queue(ch, name, m));
        }
        self.check_exclusive(ch, name, m)?;
        self.queue(name).ok_or_else(|| no_queue(ch, name, m))
    }

    fn consume(&mut self, ch: u16, consume: basic::Consume) -> Result<(), Fault> {
        let m = AMQPClass::Basic(basic::AMQPMethod::Consume(consume.clone()));
        // As in RabbitMQ, a tag in use on the channel is refused before anything else.
        let channel = self.channels.get(&ch).expect("checked by the caller");
        if channel.consumer_tags.contains(&consume.consumer_tag) {
            let tag = &consume.consumer_tag;
            let text = format!("NOT_ALLOWED - attempt to reuse consumer tag '{tag}'");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m));
        }
        // The arguments are looked at once the queue is found (a missing one is a 404
        // first), and a 406 names the queue, as in RabbitMQ; a reply-to queue is made only
        // once they pass.
        let checked = arguments::consumer_priority(&consume.arguments);
        let refuse = |refused: arguments::Refused, shown: &str| {
            if refused.code == code::NOT_IMPLEMENTED {
                Fault::connection(refused.code, refused.text).for_method(&m)
            } else {
                let refused = refused.for_queue(shown);
                Fault::channel(ch, refused.code, refused.text, &m)
            }
        };
        let (queue, priority) = match consume.queue.as_str() {
            reply_to::REPLY_TO => {
                let priority = checked.map_err(|r| refuse(r, reply_to::REPLY_TO))?;
                (self.reply_queue(ch, &consume, &m)?, priority)
            }
            name => {
                let queue = self.named_queue(ch, name, &m)?;
                let priority = checked.map_err(|r| refuse(r, &names::amqp(queue.name())))?;
                (queue, priority)
            }
        };
        self.vhost.expiring.touch(queue.name());
        self.next_consumer += 1;
        let number = self.next_consumer;
        let channel = self.channels.get(&ch).expect("checked by the caller");
        let tag = match consume.consumer_tag.as_str() {
            // A tag the server picks is new on the channel, even where a client chose
            // one of the same form.
            "" => loop {
                let tag = ShortString::from(format!("amq.ctag-{}-{}", self.id, self.next_consumer));
                if !channel.consumer_tags.contains(&tag) {
                    break tag;
                }
                self.next_consumer += 1;
            },
            _ => consume.consumer_tag.clone(),
        };
        // RabbitMQ's rule for `exclusive` (see `consumers.rs`), across every connection,
        // and the turns of a single active consumer.
        let single_active = (self.vhost.declared.lock().expect("never poisoned"))
            .get(queue.name())
            .is_some_and(Declared::is_single_active);
        let Some((claim, turn)) =
            (self.vhost.consumers).claim(queue.name(), consume.exclusive, single_active)
        else {
            let text = format!(
                "ACCESS_REFUSED - queue '{}' in vhost '/' in exclusive use",
                names::amqp(queue.name())
            );
            return Err(Fault::channel(ch, code::ACCESS_REFUSED, text, &m));
        };
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        // A channel-wide limit also bounds each consumer: none may lease more than the
        // channel may have unsettled (the rest stays ready for other channels).
        let limit = |n: u16| if n == 0 { MAX_PREFETCH } else { n };
        let prefetch = if consume.no_ack {
            // As in RabbitMQ, prefetch does not bound a consumer without acks; its
            // deliveries are acked in batches as they leave (see `auto_acks`).
            MAX_PREFETCH
        } else {
            limit(state.prefetch).min(limit(state.global_prefetch))
        };
        // The broker's consumer name is the connection's, unique whatever tags clients pick.
        let name = format!("amqp-{}-{}", self.id, self.next_consumer);
        let config = ConsumerConfig {
            prefetch: u32::from(prefetch),
        };
        // One that waits its turn makes its broker consumer when the turn comes.
        let (consumer, waiting) = match turn {
            None => {
                let consumer = queue.consume_with_priority(&name, config, priority);
                (Some(consumer.map_err(|e| broker_fault(ch, &e, &m))?), None)
            }
            Some(turn) => (
                None,
                Some(Waiting {
                    turn,
                    name,
                    config,
                    priority,
                }),
            ),
        };
        state.consumer_tags.push(tag.clone());
        if !consume.nowait {
            let ok = basic::ConsumeOk {
                consumer_tag: tag.clone(),
            };
            self.send(ch, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok)));
        }
        self.subscriptions.push(Subscription {
            channel: ch,
            message_ttl: self.message_ttl(queue.name()),
            number,
            tag,
            queue,
            consumer,
            waiting,
            no_ack: consume.no_ack,
            _claim: claim,
        });
        Ok(())
    }

    /// `basic.cancel`: the consumer takes no more deliveries, and what it delivered and
    /// the client has not settled stays leased to the channel (RabbitMQ's graceful
    /// shutdown: cancel, finish the work in hand, ack). Deliveries not yet sent are
    /// released. The broker consumer is dropped once none of its deliveries is unsettled,
    /// or with the channel, which returns what it still holds.
    fn cancel(&mut self, ch: u16, cancel: basic::Cancel) {
        if let Some(i) = self
            .subscriptions
            .iter()
            .position(|s| s.channel == ch && s.tag == cancel.consumer_tag)
        {
            let Subscription {
                number,
                consumer,
                queue,
                _claim: claim,
                ..
            } = self.subscriptions.swap_remove(i);
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
    fn keep_leases(&mut self, ch: u16, number: u64, consumer: Consumer) {
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
            consumer.cancel();
            return;
        }
        consumer.stop();
        state.stopped.push(Stopped {
            number,
            _consumer: consumer,
            outstanding,
            cancelled: true,
        });
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

    /// `basic.get`: one message under a lease, as a delivery of a consumer made for it,
    /// stopped at once (it keeps that one lease until it is settled).
    fn get(&mut self, ch: u16, get: basic::Get) -> Result<(), Fault> {
        let m = AMQPClass::Basic(basic::AMQPMethod::Get(get.clone()));
        let queue = self.named_queue(ch, get.queue.as_str(), &m)?;
        self.vhost.expiring.touch(queue.name());
        self.next_consumer += 1;
        let number = self.next_consumer;
        let name = format!("amqp-{}-{}", self.id, number);
        let consumer = queue
            .consume(&name, ConsumerConfig { prefetch: 1 })
            .map_err(|e| broker_fault(ch, &e, &m))?;
        // The consume call is a barrier: a message that was ready is in the channel now.
        // An expired one is dropped, and its ack (also a barrier) lets the next in.
        let ttl = self.message_ttl(queue.name());
        let mut dropped = 0;
        let delivery = loop {
            let Ok(Some(delivery)) = consumer.try_recv() else {
                break None;
            };
            if !self.expired(ttl, delivery.envelope()) {
                break Some(delivery);
            }
            // Dead-lettered or dropped; either way its ack lets the next one in.
            if !self.vhost.expire(&self.broker, &queue, &delivery) {
                delivery.release();
                break None;
            }
            dropped += 1;
            // A long run of expired messages is dropped over several gets.
            if dropped == GET_DROPS_AT_MOST {
                break None;
            }
        };
        let Some(delivery) = delivery else {
            consumer.cancel();
            let empty = basic::AMQPMethod::GetEmpty(basic::GetEmpty {});
            self.send(ch, AMQPClass::Basic(empty));
            return Ok(());
        };
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        state.last_tag += 1;
        let channel_tag = state.last_tag;
        if get.no_ack {
            // Stopped before the ack: else the credit the ack frees would take the next
            // message, and the cancel would hand it back to the front of the queue.
            consumer.stop();
            delivery.ack();
            consumer.cancel();
        } else {
            consumer.stop();
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
        let envelope = delivery.envelope();
        let message_count = u32::try_from(queue.stats().ready).unwrap_or(u32::MAX);
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
        Ok(())
    }

    /// `queue.purge`: the ready and delayed messages go; leased ones stay.
    fn purge(&mut self, ch: u16, purge: queue::Purge) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Purge(purge.clone()));
        let queue = self.named_queue(ch, purge.queue.as_str(), &m)?;
        let purged = queue.purge().map_err(|e| broker_fault(ch, &e, &m))?;
        if !purge.nowait {
            let ok = queue::PurgeOk {
                message_count: u32::try_from(purged).unwrap_or(u32::MAX),
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::PurgeOk(ok)));
        }
        Ok(())
    }

    /// `queue.delete`: the queue, its messages and its leases go (the broker's `close`);
    /// its consumers, here and on other connections, are told with `basic.cancel`. As in
    /// RabbitMQ, deleting a queue that does not exist succeeds.
    fn delete(&mut self, ch: u16, delete: queue::Delete) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Delete(delete.clone()));
        let name = &self.queue_name(ch, delete.queue.as_str(), &m)?;
        self.check_exclusive(ch, name, &m)?;
        let mut message_count = 0;
        // A reply name is no queue to a client (`reply_to.rs`): deleting it is a no-op.
        let queue = match reply_to::is_reply_name(name) {
            true => None,
            false => self.queue(name),
        };
        if let Some(queue) = queue {
            let stats = queue.stats();
            // Consumers waiting their turn (`x-single-active-consumer`) count too.
            let consumed = stats.consumers > 0 || self.vhost.consumers.is_consumed(name);
            if delete.if_unused && consumed {
                let name = names::amqp(name);
                let text = format!("PRECONDITION_FAILED - queue '{name}' in vhost '/' in use");
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            // As RabbitMQ, a queue is empty when nothing waits to be delivered: leased
            // messages go with it (their late acks change nothing).
            if delete.if_empty && stats.ready + stats.delayed > 0 {
                let text = format!(
                    "PRECONDITION_FAILED - queue '{}' in vhost '/' is not empty",
                    names::amqp(name)
                );
                return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
            }
            message_count = stats.ready + stats.delayed;
            self.delete_queue(&queue);
        }
        if !delete.nowait {
            let ok = queue::DeleteOk {
                message_count: u32::try_from(message_count).unwrap_or(u32::MAX),
            };
            self.send(ch, AMQPClass::Queue(queue::AMQPMethod::DeleteOk(ok)));
        }
        Ok(())
    }

    /// `exchange.declare` of the types served (and `passive` checks of any exchange), with
    /// `internal` and `alternate-exchange`.
    fn exchange_declare(&mut self, ch: u16, declare: exchange::Declare) -> Result<(), Fault> {
        let m = AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare.clone()));
        let name = declare.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        if declare.passive {
            // As RabbitMQ: the default exchange is not declared, passively or not.
            if name.is_empty() {
                return Err(exchange_fault(ch, Refusal::Reserved, name, &m));
            }
            if !exchanges.exists(name) {
                return Err(exchange_fault(ch, Refusal::NotFound, name, &m));
            }
        } else {
            let kind = declare.kind.as_str();
            let Some(served) = Kind::named(kind) else {
                return Err(unserved_exchange_type(kind, &m));
            };
            let arguments = declare.arguments.inner();
            let alternate = match arguments.get("alternate-exchange") {
                None => None,
                Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes())),
                Some(AMQPValue::ShortString(s)) => Some(s.as_str().into()),
                Some(other) => {
                    let text = format!(
                        "PRECONDITION_FAILED - invalid type '{}' for arg 'alternate-exchange' in exchange '{name}' in vhost '/'",
                        crate::field::type_name(other)
                    );
                    return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
                }
            };
            // RabbitMQ compares no argument of a redeclare but the alternate (it keeps the
            // first declare's); a new exchange with one leasemqd does not serve is a 540.
            let unserved = arguments
                .keys()
                .find(|arg| arg.as_str() != "alternate-exchange");
            if let (Some(arg), false) = (unserved, exchanges.exists(name)) {
                let text = format!("exchange argument '{arg}' is not supported by leasemqd yet");
                return Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m));
            }
            let shape = Shape {
                kind: served,
                durable: declare.durable,
                auto_delete: declare.auto_delete,
                internal: declare.internal,
                alternate: alternate.map(|name| name.into_owned()),
            };
            // Each is checked where exchanges are kept.
            exchanges
                .declare_shaped(name, shape)
                .map_err(|r| exchange_fault(ch, r, name, &m))?;
        }
        drop(exchanges);
        if !declare.nowait {
            let ok = exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {});
            self.send(ch, AMQPClass::Exchange(ok));
        }
        Ok(())
    }

    fn exchange_delete(&mut self, ch: u16, delete: exchange::Delete) -> Result<(), Fault> {
        let m = AMQPClass::Exchange(exchange::AMQPMethod::Delete(delete.clone()));
        let name = delete.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        exchanges
            .delete(name, delete.if_unused)
            .map_err(|r| exchange_fault(ch, r, name, &m))?;
        drop(exchanges);
        if !delete.nowait {
            let ok = exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {});
            self.send(ch, AMQPClass::Exchange(ok));
        }
        Ok(())
    }

    /// `queue.bind` of an existing queue to a direct exchange.
    fn bind(&mut self, ch: u16, bind: queue::Bind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Bind(bind.clone()));
        let name = bind.exchange.as_str();
        let kind = (self.vhost.exchanges.lock().expect("never poisoned")).kind(name);
        let key = binding_key(ch, kind, bind.routing_key.as_str(), &bind.arguments, &m)?;
        let queue = self.named_queue(ch, bind.queue.as_str(), &m)?;
        // Kept across a restart only if the queue is: durable, and not exclusive.
        let exclusive =
            (self.vhost.exclusive.lock().expect("never poisoned")).contains_key(queue.name());
        let durable_queue = queue.is_durable() && !exclusive;
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        exchanges
            .bind(name, &key, queue.name(), durable_queue)
            .map_err(|r| exchange_fault(ch, r, name, &m))?;
        drop(exchanges);
        if !bind.nowait {
            let ok = queue::AMQPMethod::BindOk(queue::BindOk {});
            self.send(ch, AMQPClass::Queue(ok));
        }
        Ok(())
    }

    /// `exchange.bind`: `destination` gets what `source` routes with `key` (or, from a
    /// headers exchange, the binding's arguments).
    fn bind_exchange(
        &mut self,
        ch: u16,
        (source, key, destination): (&str, &str, &str),
        arguments: &FieldTable,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        // As RabbitMQ: the default exchange first, then the source, then the destination.
        for name in [source, destination] {
            if name.is_empty() {
                return Err(exchange_fault(ch, Refusal::Reserved, name, m));
            }
        }
        for name in [source, destination] {
            if !exchanges.exists(name) {
                return Err(exchange_fault(ch, Refusal::NotFound, name, m));
            }
        }
        let key = binding_key(ch, exchanges.kind(source), key, arguments, m)?;
        (exchanges.bind_exchange(source, &key, destination))
            .map_err(|r| exchange_fault(ch, r, source, m))
    }

    /// `exchange.unbind`: as `queue.unbind`, removing a binding that is not there
    /// succeeds.
    fn unbind_exchange(
        &self,
        ch: u16,
        (source, key, destination): (&str, &str, &str),
        arguments: &FieldTable,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        match unbinding_key(exchanges.kind(source), key, arguments) {
            Some(key) => (exchanges.unbind_exchange(source, &key, destination))
                .map_err(|r| exchange_fault(ch, r, source, m)),
            None => Ok(()),
        }
    }

    /// `queue.unbind`: as in RabbitMQ, removing a binding that is not there (its queue or
    /// its exchange missing too) succeeds.
    fn unbind(&mut self, ch: u16, unbind: queue::Unbind) -> Result<(), Fault> {
        let m = AMQPClass::Queue(queue::AMQPMethod::Unbind(unbind.clone()));
        let queue = &self.queue_name(ch, unbind.queue.as_str(), &m)?;
        self.check_exclusive(ch, queue, &m)?;
        let name = unbind.exchange.as_str();
        let mut exchanges = self.vhost.exchanges.lock().expect("never poisoned");
        let kind = exchanges.kind(name);
        if let Some(key) = unbinding_key(kind, unbind.routing_key.as_str(), &unbind.arguments) {
            exchanges
                .unbind(name, &key, queue)
                .map_err(|r| exchange_fault(ch, r, name, &m))?;
        }
        drop(exchanges);
        let ok = queue::AMQPMethod::UnbindOk(queue::UnbindOk {});
        self.send(ch, AMQPClass::Queue(ok));
        Ok(())
    }

    /// `basic.recover` with `requeue`: every unsettled delivery of the channel goes back
    /// and is redelivered, as after a nack. RabbitMQ does not serve `requeue=false`.
    fn recover(&mut self, ch: u16, requeue: bool, m: &AMQPClass) -> Result<(), Fault> {
        if !requeue {
            let text = "basic.recover with requeue=false is not supported (nor by RabbitMQ)";
            return Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m));
        }
        // At once, outside any transaction, as RabbitMQ requeues: not held to a commit.
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let taken = std::mem::take(&mut state.unacked).into_iter().collect();
        self.settle_taken(ch, taken, self::requeue(true));
        Ok(())
    }

    /// `basic.ack`/`nack`/`reject` of one channel tag, or of every unsettled one up to it
    /// (`multiple`; tag 0 with `multiple` means all of them). A transactional channel holds
    /// it until its commit.
    fn settle(
        &mut self,
        ch: u16,
        tag: u64,
        multiple: bool,
        how: Settle,
        m: &AMQPClass,
    ) -> Result<(), Fault> {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        // As RabbitMQ: with `multiple`, the named tag itself must be outstanding (0 means
        // all of them); a tag never delivered, or settled already, is a channel error. One
        // forgotten because its lease ran out is not (`forget_expired`).
        let forgotten = tag != 0 && tag <= state.forgotten;
        if multiple && tag != 0 && !forgotten && !state.unacked.contains_key(&tag) {
            let text = format!("PRECONDITION_FAILED - unknown delivery tag {tag}");
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, m));
        }
        let taken: Vec<(u64, Unacked)> = if multiple {
            let upto = if tag == 0 { u64::MAX } else { tag };
            let keep = state.unacked.split_off(&upto.saturating_add(1));
            std::mem::replace(&mut state.unacked, keep)
                .into_iter()
                .collect()
        } else {
            match state.unacked.remove(&tag) {
                Some(u) => vec![(tag, u)],
                None if forgotten => Vec::new(),
                None => {
                    let text = format!("PRECONDITION_FAILED - unknown delivery tag {tag}");
                    return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, m));
                }
            }
        };
        if taken.is_empty() {
            return Ok(());
        }
        // A transactional channel makes it at its commit (`tx.rs`).
        match state.tx.as_mut() {
            Some(held) => held.hold_settle(taken, how),
            None => self.settle_taken(ch, taken, how),
        }
        Ok(())
    }

    /// Settles `taken`, deliveries already taken from channel `ch`'s unacked ones, as
    /// `how` says: gathered into this read's settle batches.
    pub(super) fn settle_taken(&mut self, ch: u16, taken: Vec<(u64, Unacked)>, how: Settle) {
        let Some(state) = self.channels.get_mut(&ch) else {
            return;
        };
        let mut settles = Vec::with_capacity(taken.len());
        let mut releases = Vec::new();
        for (
            _,
            Unacked {
                queue,
                tag,
                consumer,
                ..
            },
        ) in taken
        {
            if let Some(stopped) = state.stopped.iter_mut().find(|s| s.number == consumer) {
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
        for (queue, tag, how) in settles {
            match self.pending.last_mut() {
                Some(Pending::Settle {
                    channel,
                    queue: q,
                    settles,
                }) if *channel == ch && q.name() == queue.name() => settles.push((tag, how)),
                _ => self.pending.push(Pending::Settle {
                    channel: ch,
                    queue,
                    settles: vec![(tag, how)],
                }),
            }
        }
    }

    /// Whether the channel of subscription `index` takes a delivery now: it is not
    /// paused by `channel.flow`, and is under its `global` prefetch (which, as in RabbitMQ,
    /// does not bound `no_ack` consumers).
    pub(super) fn may_deliver(&self, index: usize) -> bool {
        let sub = &self.subscriptions[index];
        self.channels.get(&sub.channel).is_none_or(|state| {
            !state.paused
                && (sub.no_ack
                    || state.global_prefetch == 0
                    || state.unsettled() < usize::from(state.global_prefetch))
        })
    }

    /// Sends one delivery of subscription `index` as `basic.deliver` + content.
    pub(super) fn deliver(&mut self, index: usize, delivery: Delivery) {
        let sub = &self.subscriptions[index];
        let (ch, no_ack) = (sub.channel, sub.no_ack);
        if !self.channels.contains_key(&ch) {
            // The channel is gone; its consumer is being cancelled.
            delivery.release();
            return;
        }
        if self.expired(sub.message_ttl, delivery.envelope()) {
            // Never sent, as RabbitMQ expires it at the head of its queue: dead-lettered
            // where the queue has an exchange for it, else dropped (acked with the automatic
            // acknowledgements).
            let queue = &self.subscriptions[index].queue;
            if message_expiry::dead_letters(queue) {
                let queue = queue.clone();
                self.vhost.message_expiry.hand_over(queue, delivery);
            } else {
                self.drop_expired(index, &delivery);
            }
            return;
        }
        let sub = &self.subscriptions[index];
        let state = self.channels.get_mut(&ch).expect("checked above");
        state.last_tag += 1;
        let channel_tag = state.last_tag;
        if !no_ack {
            let now = self.settings.lease_clock.now_ms();
            let unacked = Unacked::new(sub.queue.clone(), delivery.tag(), sub.number, now);
            state.hold(channel_tag, unacked, now);
        }
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

    /// Drops an expired delivery of consumer `index`: acked with the automatic
    /// acknowledgements (see `auto_acks`), never sent.
    fn drop_expired(&mut self, index: usize, delivery: &Delivery) {
        let queue = &self.subscriptions[index].queue;
        let ack = (delivery.tag(), Settle::Ack);
        match self.auto_acks.last_mut() {
            Some((last, settles)) if last.name() == queue.name() => settles.push(ack),
            _ => self.auto_acks.push((queue.clone(), vec![ack])),
        }
        self.settings.metrics.ttl_expired.inc();
    }

    /// The `x-message-ttl` the queue called `name` was declared with.
    fn message_ttl(&self, name: &str) -> Option<u64> {
        let declared = self.vhost.declared.lock().expect("never poisoned");
        declared.get(name).and_then(|d| d.message_ttl)
    }

    /// Closes `ch` for a channel error: its consumers end (their unsettled deliveries come
    /// back), and `channel.close` goes out.
    pub(super) fn close_channel_with(&mut self, ch: u16, fault: Fault) {
        self.end_subscriptions(Some(ch));
        if let Some(state) = self.channels.get_mut(&ch) {
            *state = Channel {
                closing: true,
                serial: state.serial,
                ..Channel::default()
            };
        }
        let close = channel::Close {
            reply_code: fault.code,
            reply_text: reply_text(fault.code, fault.text),
            class_id: fault.class_id,
            method_id: fault.method_id,
        };
        self.send(ch, AMQPClass::Channel(channel::AMQPMethod::Close(close)));
    }
}

/// `requeue=true` is a nack with no delay; `false` a reject (dead letter).
/// RabbitMQ's 404 for a queue that does not exist (or a name that is no queue).
/// The key a binding from an exchange of `kind` is kept under: its routing key, or from a
/// headers exchange (which reads no routing key) its arguments, encoded. Arguments on
/// another exchange's binding are not served (540).
fn binding_key(
    ch: u16,
    kind: Option<Kind>,
    key: &str,
    arguments: &FieldTable,
    m: &AMQPClass,
) -> Result<String, Fault> {
    match kind {
        Some(Kind::Headers) => HeadersBinding::from_arguments(arguments)
            .map(|b| b.encode())
            .map_err(|why| {
                let text = format!("PRECONDITION_FAILED - {why}");
                Fault::channel(ch, code::PRECONDITION_FAILED, text, m)
            }),
        _ => match arguments.inner().keys().next() {
            Some(arg) => {
                let text = format!(
                    "binding argument '{arg}' is not supported by leasemqd yet (only on a headers exchange)"
                );
                Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m))
            }
            None => Ok(key.to_string()),
        },
    }
}

/// The key of the binding an unbind names, as [`binding_key`] keeps it; `None` where it
/// names one that was never made (arguments on another exchange's binding), whose removal
/// changes nothing.
fn unbinding_key(kind: Option<Kind>, key: &str, arguments: &FieldTable) -> Option<String> {
    match kind {
        Some(Kind::Headers) => HeadersBinding::from_arguments(arguments)
            .ok()
            .map(|b| b.encode()),
        _ if arguments.inner().is_empty() => Some(key.to_string()),
        _ => None,
    }
}

/// The most expired messages one `basic.get` drops before it answers `get-empty`.
const GET_DROPS_AT_MOST: usize = 1024;

pub(super) fn no_queue(ch: u16, name: &str, m: &AMQPClass) -> Fault {
    let name = names::amqp(name);
    let text = format!("NOT_FOUND - no queue '{name}' in vhost '/'");
    Fault::channel(ch, code::NOT_FOUND, text, m)
}

/// RabbitMQ's 405 for a queue another connection holds exclusively, or one redeclared
/// with another `exclusive`.
fn locked(ch: u16, name: &str, m: &AMQPClass) -> Fault {
    refused_fault(ch, declare::locked(name), m)
}

/// The fault a refusal of the virtual host's makes: 540 (an argument not served) closes
/// the connection, as RabbitMQ's does; any other code the channel.
fn refused_fault(ch: u16, refused: arguments::Refused, m: &AMQPClass) -> Fault {
    if refused.code == code::NOT_IMPLEMENTED {
        Fault::connection(refused.code, refused.text).for_method(m)
    } else {
        Fault::channel(ch, refused.code, refused.text, m)
    }
}

fn requeue(requeue: bool) -> Settle {
    if requeue {
        Settle::NackWithDelay(Duration::ZERO)
    } else {
        Settle::Reject
    }
}

/// The answer to an `exchange.declare` of a type not served: a plugin's (`x-…`) is a
/// 540; one no broker knows, RabbitMQ's 503.
fn unserved_exchange_type(kind: &str, m: &AMQPClass) -> Fault {
    if kind.starts_with("x-") {
        let text = format!(
            "exchange type '{kind}' is not supported by leasemqd yet (direct, fanout, topic and headers are)"
        );
        Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m)
    } else {
        let text = format!("COMMAND_INVALID - unknown exchange type '{kind}'");
        Fault::connection(code::COMMAND_INVALID, text).for_method(m)
    }
}

/// The AMQP error for a refused exchange call on channel `ch`.
pub(super) fn exchange_fault(ch: u16, refusal: Refusal, name: &str, m: &AMQPClass) -> Fault {
    let (code, text) = match refusal {
        // A hard error, as RabbitMQ's 541: the server could not keep what it is asked to.
        Refusal::Storage(why) => {
            return Fault::connection(code::INTERNAL_ERROR, format!("INTERNAL_ERROR - {why}"))
                .for_method(m);
        }
        Refusal::Reserved if name.is_empty() => (
            code::ACCESS_REFUSED,
            "ACCESS_REFUSED - operation not permitted on the default exchange".to_string(),
        ),
        Refusal::Reserved => (
            code::ACCESS_REFUSED,
            format!("ACCESS_REFUSED - operation not permitted on exchange '{name}'"),
        ),
        Refusal::NotFound => (
            code::NOT_FOUND,
            format!("NOT_FOUND - no exchange '{name}' in vhost '/'"),
        ),
        Refusal::Inequivalent(what) => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - inequivalent arg '{what}' for exchange '{name}' in vhost '/'"),
        ),
        Refusal::InUse => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use"),
        ),
    };
    Fault::channel(ch, code, text, m)
}

/// The AMQP error for a broker error on channel `ch`.
pub(super) fn broker_fault(ch: u16, e: &Error, m: &AMQPClass) -> Fault {
    let (code, text) = match e {
        Error::ShutDown => {
            return Fault::connection(code::CONNECTION_FORCED, "broker is shutting down")
                .for_method(m)
        }
        Error::QueueClosed | Error::UnknownQueue(_) => {
            (code::NOT_FOUND, format!("NOT_FOUND - {e}"))
        }
        Error::InvalidName => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - {e} (a queue name is 1 to 255 bytes; one with bytes outside A-Z a-z 0-9 . _ : - is kept escaped, each such byte as 3 and each _ as 2, plus 9, and must fit too)"),
        ),
        _ => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - {e}"),
        ),
    };
    Fault::channel(ch, code, text, m)
}

/// Writes a delivery of `envelope` from `queue` on channel `ch`: the method `method` makes
/// from its exchange and routing key, then its content. The stored properties and names
/// are copied out as they came; a dead letter's (which gain `x-death` headers) and those of
/// a body put through the Rust API are written anew. Nothing is written if the method
/// cannot be.
fn write_delivery(
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

/// A method the server does not serve (yet): the connection closes with 540.
fn unsupported(method: AMQPClass) -> Result<(), Fault> {
    let text = format!("{} is not supported by leasemqd yet", method_name(&method));
    Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&method))
}
