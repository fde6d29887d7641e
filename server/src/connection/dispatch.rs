//! A channel's methods, dispatched: each method that comes on an open channel goes to its
//! `Channel` first, which answers what its own state serves (`Channel::handle`); the rest
//! goes to the part that serves it (queues and exchanges, consumers and settles, gets,
//! commits), and a channel error closes the channel.

use amq_protocol::protocol::{basic, channel, exchange, queue, tx, AMQPClass};
use leasemq::Settle;

use super::channel::{requeue, Channel, Handled};
use super::fault::{method_name, reply_text, Fault};
use super::{code, Connection};

impl Connection {
    pub(super) fn handle_channel_method(
        &mut self,
        ch: u16,
        method: AMQPClass,
    ) -> Result<(), Fault> {
        // Whatever this method does, it comes after the publishes and settles before it:
        // the reader made them (`handle_input`), and awaited any that waits for the disk.
        debug_assert!(self.pending.is_empty() || !super::sees_gathered_method(&method));
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
        self.permitted(ch, &method)?;
        let state = self.channels.get_mut(&ch).expect("open, looked up above");
        // What the channel's own state serves, it answers; the rest needs the broker or
        // the virtual host.
        let method = match state.handle(ch, method) {
            Handled::Answered(answer) => {
                if let Some(answer) = answer {
                    self.send(ch, answer);
                }
                return Ok(());
            }
            Handled::Failed(fault) => return Err(fault),
            Handled::Passed(method) => method,
        };
        match method {
            AMQPClass::Channel(m) => self.channel_method(ch, m),
            AMQPClass::Basic(m) => self.basic_method(ch, m),
            AMQPClass::Queue(m) => self.queue_method(ch, m),
            AMQPClass::Exchange(m) => self.exchange_method(ch, m),
            AMQPClass::Tx(tx::AMQPMethod::Commit(commit)) => self.commit(ch, commit),
            other => unsupported(other),
        }
    }

    /// A `channel` method on open channel `ch`.
    pub(super) fn channel_method(
        &mut self,
        ch: u16,
        method: channel::AMQPMethod,
    ) -> Result<(), Fault> {
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
            channel::AMQPMethod::Open(_) => {
                let text = format!("channel {ch} is already open");
                let method = AMQPClass::Channel(method);
                Err(Fault::connection(code::CHANNEL_ERROR, text).for_method(&method))
            }
            other => unsupported(AMQPClass::Channel(other)),
        }
    }

    /// A `basic` method on open channel `ch`.
    pub(super) fn basic_method(&mut self, ch: u16, method: basic::AMQPMethod) -> Result<(), Fault> {
        match method {
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
    pub(super) fn settle_method(
        &mut self,
        ch: u16,
        method: basic::AMQPMethod,
    ) -> Result<(), Fault> {
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
    pub(super) fn queue_method(&mut self, ch: u16, method: queue::AMQPMethod) -> Result<(), Fault> {
        if self.settings.cluster
            && matches!(
                method,
                queue::AMQPMethod::Bind(_) | queue::AMQPMethod::Unbind(_)
            )
        {
            return not_in_a_cluster(AMQPClass::Queue(method));
        }
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
    pub(super) fn exchange_method(
        &mut self,
        ch: u16,
        method: exchange::AMQPMethod,
    ) -> Result<(), Fault> {
        if self.settings.cluster {
            return not_in_a_cluster(AMQPClass::Exchange(method));
        }
        match method {
            exchange::AMQPMethod::Declare(declare) => self.exchange_declare(ch, declare),
            exchange::AMQPMethod::Delete(delete) => self.exchange_delete(ch, delete),
            exchange::AMQPMethod::Bind(bind) => self.bind_exchange(ch, bind),
            exchange::AMQPMethod::Unbind(unbind) => self.unbind_exchange(ch, unbind),
            other => unsupported(AMQPClass::Exchange(other)),
        }
    }

    /// A method on a channel that is not open: only `channel.open` may come.
    pub(super) fn handle_unopened(&mut self, ch: u16, method: AMQPClass) -> Result<(), Fault> {
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

/// A method the server does not serve (yet): the connection closes with 540.
/// What a cluster's node does not serve yet (contract §9): exchanges and bindings; the
/// default exchange routes.
fn not_in_a_cluster(method: AMQPClass) -> Result<(), Fault> {
    let text = format!(
        "NOT_IMPLEMENTED - {} is not served by a cluster yet (contract §9): the default \
         exchange routes",
        method_name(&method)
    );
    Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&method))
}

pub(super) fn unsupported(method: AMQPClass) -> Result<(), Fault> {
    let text = format!("{} is not supported by leasemqd yet", method_name(&method));
    Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&method))
}
