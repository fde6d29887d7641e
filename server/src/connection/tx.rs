//! Transactions (`tx.select`, `tx.commit`, `tx.rollback`), as RabbitMQ serves them.
//!
//! On a transactional channel a publish is routed when it comes (an unknown exchange is
//! its 404 then, an unroutable `mandatory` one comes back then), but its copies are held
//! until `tx.commit`; an ack, nack or reject is checked when it comes (an unknown tag is
//! its 406 then) and its deliveries leave the channel's unacked ones, but it is made only at
//! the commit. `tx.rollback` drops the held publishes and gives the held deliveries back to
//! the channel's unacked ones, to be settled again; nothing is requeued. The commit puts
//! the held publishes in order, as a confirming channel's are (numbered, their answers
//! awaited), makes the held settles (their answers awaited too), and answers `commit-ok`
//! once every put and settle is answered: on a durable queue, once it is on disk; in a
//! cluster, once a majority of the nodes holds it. A publish a full queue refuses is dropped, as
//! without a transaction; a failed log is a channel error instead of the `commit-ok`.
//! Closing the channel drops what it holds: the publishes are lost, and the deliveries go
//! back to their queues with the channel's consumers.
//!
//! What transactions hold is bounded per connection ([`HELD_BYTES`]): a publish past it
//! is a 406 that says so, where RabbitMQ would hold it.

use amq_protocol::protocol::{tx, AMQPClass};
use leasemq::{Message, Queue};

use super::channel::Tx;
use super::fault::{publish_method, Fault};
use super::{code, Connection};

/// The most bytes of publishes the transactions of one connection hold, all its channels
/// together (a message's body and a few bytes of bookkeeping each).
pub(super) const HELD_BYTES: usize = 64 << 20;

impl Connection {
    /// `tx.commit` on channel `ch`: the held publishes are put in order, as a confirming
    /// channel's are (numbered, their answers awaited), the held settles are made and
    /// awaited, and the commit is answered once every put up to here is, and every settle
    /// (see `send_confirms`). `select` and
    /// `rollback` are the channel's own (`Channel::handle`).
    pub(super) fn commit(&mut self, ch: u16, commit: tx::Commit) -> Result<(), Fault> {
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let Some(held) = state.tx.as_mut() else {
            let text = "PRECONDITION_FAILED - channel is not transactional";
            let m = AMQPClass::Tx(tx::AMQPMethod::Commit(commit));
            return Err(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
        };
        let held = std::mem::take(held);
        for (queues, message) in held.publishes {
            let state = self.channels.get_mut(&ch).expect("open");
            state.published += 1;
            let number = state.published;
            self.put_copies(ch, queues, message, Some(number));
        }
        for (taken, how) in held.settles {
            self.settle_taken(ch, taken, how, true);
        }
        let state = self.channels.get_mut(&ch).expect("open");
        state.commits.push_back(state.published);
        Ok(())
    }

    /// Holds a publish routed to `queues` on transactional channel `ch` until its commit;
    /// a 406 if the connection's transactions would hold more than [`HELD_BYTES`].
    pub(super) fn hold_publish(
        &mut self,
        ch: u16,
        queues: Vec<Queue>,
        message: Message,
    ) -> Result<(), Fault> {
        let bytes = Tx::cost(&queues, &message);
        let held: usize = (self.channels.values())
            .filter_map(|c| c.tx.as_ref())
            .map(|t| t.bytes)
            .sum();
        if held + bytes > HELD_BYTES {
            let text = format!(
                "PRECONDITION_FAILED - transactions on this connection would hold more than {} MiB of publishes: commit sooner",
                HELD_BYTES >> 20
            );
            return Err(Fault::channel(
                ch,
                code::PRECONDITION_FAILED,
                text,
                &publish_method(),
            ));
        }
        let state = self.channels.get_mut(&ch).expect("checked by the caller");
        let held = state.tx.as_mut().expect("a transactional channel");
        held.bytes += bytes;
        held.publishes.push((queues, message));
        Ok(())
    }
}
