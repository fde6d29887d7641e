//! The broker calls of one read, made in batches, and the puts whose answers a
//! connection awaits while it reads on: those of confirming channels (confirmed as their
//! answers come) and of durable queues (answered once on disk). A run of publishes to one
//! queue on one channel is one put batch; a run of settles of one queue's deliveries one
//! settle batch.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use amq_protocol::protocol::{basic, tx, AMQPClass};
use leasemq::{DeliveryTag, Error, Message, PendingPutBatch, Queue, Settle};

use super::channel::{confirms, Confirm};
use super::fault::{broker_fault, publish_method, Fault};
use super::incoming::bytes_held;
use super::{code, Connection};
use crate::{content, offload};

/// How many bytes of publishes one connection may have handed to a shard without waiting
/// for its answer (`put_batch_nowait`) before its next put there waits: what a shard that
/// falls behind holds for one connection in its inbox, beyond one read's publishes.
pub(super) const UNANSWERED_PUT_BYTES: usize = 256 * 1024;
/// The most bytes of awaited puts ([`Awaited`]) a connection holds before it stops
/// reading until answers come.
pub(super) const AWAITED_BYTES: usize = 1 << 20;
/// The most awaited puts a connection holds before it stops reading (each answer is
/// looked for on every wake-up of the connection).
pub(super) const AWAITED_PUTS: usize = 256;

/// A put sent with [`Queue::begin_put_batch`] whose answer the connection awaits while it
/// reads on: the puts of confirming channels (confirmed when answered) and of durable
/// queues (answered after an fsync; a failed log is a channel error).
pub(crate) struct Awaited {
    channel: u16,
    /// The channel's `serial`: an answer for an earlier channel of the same number is
    /// dropped.
    serial: u64,
    /// The publish numbers it holds, ascending; empty without confirms.
    numbers: Vec<u64>,
    bytes: usize,
    answer: PendingPutBatch,
}

/// What an awaited call does with its answer, once every call awaited before it has done
/// the same: it runs on the connection.
pub(super) type Then = Box<dyn FnOnce(&mut Connection) + Send>;

/// A call that may wait for the disk (on a durable queue a nack, reject, purge, declare,
/// delete, get or consume; with a data dir an exchange or binding method), made without
/// blocking: the connection serves no further frame until it is answered, so that what
/// follows it sees its effect, as it would had the call blocked. Sent when made (its first
/// poll), so that nothing the connection sends after it reaches the shard first.
pub(crate) struct Barrier {
    call: Pin<Box<dyn Future<Output = Then> + Send>>,
    /// Its answer, once it came, waiting for the calls before it.
    then: Option<Then>,
}

/// Broker calls gathered from one read, made in order when the read is done (or before a
/// method that must see their effects): a run of publishes to one queue on one channel is
/// one put batch (see `put`), a run of settles of one queue's deliveries one
/// `settle_batch`.
pub(crate) enum Pending {
    Put {
        channel: u16,
        queue: Queue,
        messages: Vec<Message>,
        /// Each message's publish number on a confirming channel; empty on another.
        numbers: Vec<u64>,
    },
    Settle {
        channel: u16,
        queue: Queue,
        settles: Vec<(DeliveryTag, Settle)>,
        /// Made waiting for its answer, even of acks: a transaction's, whose `commit-ok`
        /// follows once they are made (on a durable queue, on disk).
        awaited: bool,
    },
}

impl Connection {
    /// One channel's run of publishes to one queue. A full queue (`x-overflow`
    /// `reject-publish`) takes what fits, in order, and refuses the rest; a failed log
    /// refuses them all. A refused publish is nacked on a confirming channel and dropped on
    /// another, as RabbitMQ does; a failed log without confirms is a channel error, so that
    /// the loss is not silent.
    ///
    /// Three ways to the shard: without waiting where no answer could matter
    /// ([`reserve_nowait`](Connection::reserve_nowait)); awaited ([`Awaited`]) where the
    /// answer is confirmed or comes after an fsync, one put per message to a bounded queue;
    /// otherwise (a bounded queue in memory without confirms, or too much unanswered) a
    /// `put_batch` waited for, which is quick. A queue deleted since the publish was routed
    /// took the publish with it, as it took what it held (a confirming channel acks it).
    pub(super) fn put(
        &mut self,
        ch: u16,
        queue: &Queue,
        messages: Vec<Message>,
        numbers: Vec<u64>,
    ) {
        let own_ttl = messages.iter().any(|m| content::has_own_ttl(m.body()));
        if !own_ttl && !self.vhost.message_expiry.is_watching() {
            return self.put_now(ch, queue, messages, numbers);
        }
        self.put_now(ch, queue, messages, numbers);
        // After the put went to the shard: a look at the head made from here on sees it.
        (self.vhost.message_expiry).published(queue, own_ttl);
    }

    /// [`put`](Connection::put), without a word to `message_expiry.rs`.
    pub(super) fn put_now(
        &mut self,
        ch: u16,
        queue: &Queue,
        messages: Vec<Message>,
        numbers: Vec<u64>,
    ) {
        // Checked here, whichever way the put goes, so that the channel fails before any
        // later publish of it is put, and none of the run is.
        let max = queue.config().max_body_bytes;
        if messages.iter().any(|m| m.body().len() > max) {
            self.fail(broker_fault(ch, &Error::MessageTooLarge, &publish_method()));
            return;
        }
        if numbers.is_empty() && self.reserve_nowait(queue, bytes_held(&messages)) {
            queue.put_batch_nowait(messages);
            return;
        }
        let bounded = queue.config().max_length.is_some();
        if !numbers.is_empty() || queue.is_durable() {
            let serial = self.channels.get(&ch).map_or(0, |s| s.serial);
            if bounded {
                // One put each, so that a full queue refuses only what does not fit.
                for (i, message) in messages.into_iter().enumerate() {
                    let number = numbers.get(i).map(|&n| vec![n]).unwrap_or_default();
                    self.await_put(ch, serial, queue, vec![message], number);
                }
            } else {
                self.await_put(ch, serial, queue, messages, numbers);
            }
            return;
        }
        // Once this call is answered, every put sent before it to this shard is applied.
        if let Some(bytes) = self.unanswered_puts.get_mut(queue.shard()) {
            *bytes = 0;
        }
        // Kept for a second try one by one; only a bounded queue can refuse part.
        let retry = (messages.len() > 1 && bounded).then(|| messages.clone());
        match queue.put_batch(messages) {
            Ok(_) => {}
            Err(Error::QueueFull) => {
                for message in retry.into_iter().flatten() {
                    if queue.put(message).is_err() {
                        break;
                    }
                }
            }
            Err(Error::QueueClosed) => {}
            Err(e) => self.fail(broker_fault(ch, &e, &publish_method())),
        }
    }

    /// Sends a put whose answer is awaited ([`Awaited`]) rather than waited for: the
    /// connection reads on, and confirms (or fails the channel) when the answer comes.
    pub(super) fn await_put(
        &mut self,
        ch: u16,
        serial: u64,
        queue: &Queue,
        messages: Vec<Message>,
        numbers: Vec<u64>,
    ) {
        let bytes = bytes_held(&messages);
        self.awaited_bytes += bytes;
        self.awaited.push_back(Awaited {
            channel: ch,
            serial,
            numbers,
            bytes,
            answer: queue.begin_put_batch(messages),
        });
    }

    /// Takes the answers that have come for awaited puts (see `Awaited`): a refused
    /// publish (a full queue, a failed log) is nacked on a confirming channel and dropped on
    /// another, a failed log without confirms or any other error is a channel error, a
    /// broker shutting down a connection error; then confirms what can be confirmed.
    /// `Ready` when an answer was taken, `Pending` (the waker registered with every awaited
    /// put) when none had come.
    pub fn poll_answers(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.phase != super::Phase::Open {
            // Closing or closed: nothing but close-ok goes out any more, and the answers
            // still to come have nobody to go to.
            let had = self.awaits_answers();
            self.awaited.clear();
            self.awaited_bytes = 0;
            self.barriers.clear();
            return if had { Poll::Ready(()) } else { Poll::Pending };
        }
        let ran = self.poll_barriers(cx);
        let mut faults: Vec<Fault> = Vec::new();
        let mut taken = false;
        let mut still = VecDeque::with_capacity(self.awaited.len());
        for mut awaited in std::mem::take(&mut self.awaited) {
            let Poll::Ready(answer) = Pin::new(&mut awaited.answer).poll(cx) else {
                still.push_back(awaited);
                continue;
            };
            self.awaited_bytes -= awaited.bytes;
            taken = true;
            let ch = awaited.channel;
            let Some(state) = self
                .channels
                .get_mut(&ch)
                .filter(|s| s.serial == awaited.serial && !s.closing)
            else {
                continue; // its channel closed meanwhile: nobody to tell
            };
            match answer {
                // A queue deleted after the publish was routed took the message with it, as
                // a delete takes what the queue holds: confirmed, as RabbitMQ confirms the
                // publishes a deleted queue still owed (only a crashed one's are nacked).
                Ok(_) | Err(Error::QueueClosed) => {}
                // In a cluster, a put whose outcome is unknown (contract §9 R6) is nacked:
                // the client publishes it again.
                Err(Error::QueueFull | Error::Storage(_) | Error::Unavailable(_))
                    if state.confirm =>
                {
                    state.refused.extend(&awaited.numbers);
                }
                // Dropped without confirms (a commit's puts too, whose commit is answered all
                // the same), as RabbitMQ drops what it cannot take.
                Err(Error::QueueFull) => {}
                Err(e) => faults.push(broker_fault(ch, &e, &publish_method())),
            }
        }
        self.awaited = still;
        // A connection error ends every channel: it alone is answered. Otherwise one
        // channel error per channel.
        if let Some(i) = faults.iter().position(|f| f.channel.is_none()) {
            faults.swap(0, i);
            faults.truncate(1);
        }
        let mut failed = Vec::new();
        for fault in faults {
            if self.phase == super::Phase::Open && !failed.contains(&fault.channel) {
                failed.push(fault.channel);
                self.fail(fault);
            }
        }
        if !taken && !ran {
            return Poll::Pending;
        }
        self.send_confirms();
        Poll::Ready(())
    }

    /// [`poll_answers`](Connection::poll_answers) without waiting: takes what has come.
    pub fn try_answers(&mut self) {
        if self.awaits_answers() {
            let _ = self.poll_answers(&mut Context::from_waker(std::task::Waker::noop()));
        }
    }

    /// Whether puts are awaited: the driver then polls for their answers.
    pub fn awaits_answers(&self) -> bool {
        !self.awaited.is_empty() || !self.barriers.is_empty()
    }

    /// Whether a call the connection made awaits its answer before the next frame is
    /// served ([`Barrier`]).
    pub(super) fn awaits_call(&self) -> bool {
        !self.barriers.is_empty()
    }

    /// Makes `call`, a broker call whose answer the next frame must wait for
    /// ([`Barrier`]): polled once now, which sends it.
    fn await_call(&mut self, call: impl Future<Output = Then> + Send + 'static) {
        let mut barrier = Barrier {
            call: Box::pin(call),
            then: None,
        };
        let noop = &mut Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(then) = barrier.call.as_mut().poll(noop) {
            barrier.then = Some(then);
        }
        self.barriers.push_back(barrier);
    }

    /// Runs `work`, which may wait for the disk, off this thread (`offload.rs`), and awaits
    /// it as a call the next frame waits for ([`Connection::await_answer`]).
    pub(super) fn await_offloaded<R: Send + 'static>(
        &mut self,
        ch: u16,
        work: impl FnOnce() -> R + Send + 'static,
        then: impl FnOnce(&mut Connection, R) -> Result<(), Fault> + Send + 'static,
    ) {
        self.await_answer(ch, offload::run(work), then);
    }

    /// Awaits `answer`, to a call made for channel `ch`, as a call the next frame waits
    /// for: `then` takes it on the connection if channel `ch` is still the one that asked
    /// (its fault fails the channel). No answer (work that panicked) is an internal error,
    /// which ends the connection.
    pub(super) fn await_answer<R: Send + 'static>(
        &mut self,
        ch: u16,
        answer: impl Future<Output = Option<R>> + Send + 'static,
        then: impl FnOnce(&mut Connection, R) -> Result<(), Fault> + Send + 'static,
    ) {
        let serial = self.channels.get(&ch).map_or(0, |c| c.serial);
        self.await_call(async move {
            let answer = answer.await;
            Box::new(move |conn: &mut Connection| {
                let Some(answer) = answer else {
                    let fault = Fault::connection(code::INTERNAL_ERROR, "INTERNAL_ERROR");
                    return conn.abort(fault);
                };
                let open =
                    (conn.channels.get(&ch)).is_some_and(|c| c.serial == serial && !c.closing);
                if open {
                    if let Err(fault) = then(conn, answer) {
                        conn.fail(fault);
                    }
                }
            }) as Then
        });
    }

    /// Awaits `done`, a call whose answer says nothing, as a call the next frame waits for;
    /// sent already, it is made even if the connection ends first.
    pub(super) fn await_done(&mut self, done: impl Future + Send + 'static) {
        self.await_call(async move {
            done.await;
            Box::new(|_: &mut Connection| {}) as Then
        });
    }

    /// Takes the answers of the awaited calls that have come, and runs them in the order
    /// the calls were made; then makes the broker calls gathered behind them. Whether any
    /// ran.
    fn poll_barriers(&mut self, cx: &mut Context<'_>) -> bool {
        for barrier in &mut self.barriers {
            if barrier.then.is_none() {
                if let Poll::Ready(then) = barrier.call.as_mut().poll(cx) {
                    barrier.then = Some(then);
                }
            }
        }
        let mut ran = false;
        while let Some(then) = self.barriers.front_mut().and_then(|b| b.then.take()) {
            self.barriers.pop_front();
            then(self);
            ran = true;
        }
        if ran && self.barriers.is_empty() && !self.pending.is_empty() {
            self.flush_pending();
        }
        ran
    }

    /// Whether the connection takes more input: not while the memory alarm blocks it, nor
    /// while the puts it awaits hold more than `AWAITED_BYTES`, so that a publisher
    /// whose answers lag (a slow disk) is not read faster than they come.
    pub fn wants_input(&self) -> bool {
        !self.blocked
            && self.barriers.is_empty()
            && self.awaited_bytes < AWAITED_BYTES
            && self.awaited.len() < AWAITED_PUTS
    }

    /// Whether a run of publishes without confirms may go to its queue without waiting for
    /// the shard's answer, and if so counts it as unanswered: when nothing the answer could
    /// say needs telling. A refused publish is dropped either way, so only a refusal that is
    /// not would need the answer: a bounded queue (which takes what fits of a batch, not
    /// none of it), or a durable queue (a failed log is a channel error). The publishes a
    /// shard has not answered are bounded per connection ([`UNANSWERED_PUT_BYTES`]): past
    /// that, a put waits, and its answer covers the rest.
    pub(super) fn reserve_nowait(&mut self, queue: &Queue, bytes: usize) -> bool {
        if queue.is_durable() || queue.config().max_length.is_some() {
            return false;
        }
        let shard = queue.shard();
        if self.unanswered_puts.len() <= shard {
            self.unanswered_puts.resize(shard + 1, 0);
        }
        let unanswered = &mut self.unanswered_puts[shard];
        if *unanswered + bytes > UNANSWERED_PUT_BYTES {
            return false;
        }
        *unanswered += bytes;
        true
    }

    /// Makes the broker calls gathered so far, then confirms what can be confirmed.
    pub(super) fn flush_pending(&mut self) {
        // Behind a call still awaited, they wait for its answer (`poll_barriers`).
        if self.awaits_call() {
            return;
        }
        self.apply_pending();
        self.send_confirms();
    }

    /// Whether confirms (and a transaction's `commit-ok`) may go out: not while a call is
    /// awaited, whose answer may still make the broker calls gathered behind it, and
    /// which a commit's answer must follow.
    fn may_confirm(&self) -> bool {
        self.barriers.is_empty()
    }

    /// Confirms the publishes of confirming channels that are settled (see [`confirms`]).
    pub(super) fn send_confirms(&mut self) {
        if !self.may_confirm() {
            return;
        }
        // A publish not yet sent to its queue must not be confirmed: it is in no awaited put.
        debug_assert!(self.pending.is_empty(), "confirms after the broker calls");
        // Nor one whose awaited put was forgotten when the connection began to close.
        if self.phase != super::Phase::Open {
            return;
        }
        let mut answers = Vec::new();
        for (&ch, state) in &mut self.channels {
            let commits = state.tx.is_some() && !state.commits.is_empty();
            let waiting = state.confirm && state.confirmed < state.published;
            if state.closing || !(waiting || commits) {
                continue;
            }
            let awaited: Vec<&[u64]> = self
                .awaited
                .iter()
                .filter(|a| a.channel == ch && a.serial == state.serial)
                .map(|a| a.numbers.as_slice())
                .collect();
            let refused = std::mem::take(&mut state.refused);
            let now = confirms(state.confirmed, state.published, refused, &awaited);
            state.confirmed = now.confirmed;
            state.refused = now.refused;
            if state.tx.is_some() {
                // A transaction's publishes are not confirmed one by one: its commit is
                // answered once every publish up to it is settled.
                while state
                    .commits
                    .front()
                    .is_some_and(|&at| at <= state.confirmed)
                {
                    state.commits.pop_front();
                    let ok = AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
                    answers.push((ch, ok));
                }
                continue;
            }
            for confirm in now.answers {
                let method = match confirm {
                    Confirm::AckUpTo(delivery_tag) => basic::AMQPMethod::Ack(basic::Ack {
                        delivery_tag,
                        multiple: true,
                    }),
                    Confirm::Nack(delivery_tag) => basic::AMQPMethod::Nack(basic::Nack {
                        delivery_tag,
                        multiple: false,
                        requeue: false,
                    }),
                };
                answers.push((ch, AMQPClass::Basic(method)));
            }
        }
        for (ch, answer) in answers {
            self.send(ch, answer);
        }
    }

    /// Makes the gathered broker calls, in order, up to one that must be awaited (a nack or
    /// reject on a durable queue): those after it wait for its answer. A call whose channel
    /// a fault earlier in the same flush closed is dropped, as RabbitMQ ignores what
    /// follows a channel error.
    pub(super) fn apply_pending(&mut self) {
        let mut ops = std::mem::take(&mut self.pending).into_iter();
        while let Some(op) = ops.next() {
            let ch = match &op {
                Pending::Put { channel, .. } | Pending::Settle { channel, .. } => *channel,
            };
            let open = self.channels.get(&ch).is_some_and(|s| !s.closing);
            if !open || self.phase != super::Phase::Open {
                continue;
            }
            match op {
                Pending::Put {
                    queue,
                    messages,
                    numbers,
                    ..
                } => self.put(ch, &queue, messages, numbers),
                // A `false` answer is a stale tag (its lease ran out and the message went
                // elsewhere): the broker counted it, and AMQP hears nothing, as the
                // contract asks. So acks need no answer: the connection goes on without
                // waiting for the shard (or, on a durable queue, for the disk). A nack or
                // reject waits, so that a dead letter it causes is in its queue before the
                // channel's next method is served; so does a commit's settle, so that its
                // `commit-ok` follows them.
                Pending::Settle {
                    queue,
                    settles,
                    awaited,
                    ..
                } => {
                    if awaited {
                        self.await_commit_settles(ch, queue, settles);
                        self.pending.extend(ops);
                        break;
                    } else if settles.iter().all(|(_, s)| *s == Settle::Ack) {
                        queue.settle_batch_nowait(&settles);
                    } else if queue.is_durable() {
                        // Its log waits for the disk: awaited, and what was gathered after
                        // it is made once it is answered.
                        self.await_done(async move { queue.settle_batch_async(&settles).await });
                        self.pending.extend(ops);
                        break;
                    } else {
                        queue.settle_batch(&settles);
                    }
                }
            }
        }
        self.drop_settled_consumers();
    }

    /// Makes a transaction's settles of one queue on channel `ch`, awaited. One that was not
    /// answered as made fails the channel in place of the `commit-ok`, which must mean that
    /// every settle of the transaction took effect: its lease had run out (the message
    /// comes again), or its queue was unavailable (in a cluster; then, as for any call
    /// answered `Unavailable`, it may still have been made).
    fn await_commit_settles(&mut self, ch: u16, queue: Queue, settles: Vec<(DeliveryTag, Settle)>) {
        self.await_call(async move {
            let made = queue.settle_batch_async(&settles).await;
            let missed = made.iter().filter(|made| !**made).count();
            Box::new(move |conn: &mut Connection| {
                if missed > 0 {
                    let text = format!(
                        "PRECONDITION_FAILED - {missed} of the transaction's acks, nacks or rejects on queue '{}' were not answered as made: a lease that had run out, or a queue that was unavailable; a message whose ack was not made will be delivered again",
                        crate::names::amqp(queue.name())
                    );
                    let m = AMQPClass::Tx(tx::AMQPMethod::Commit(tx::Commit {}));
                    conn.fail(Fault::channel(ch, code::PRECONDITION_FAILED, text, &m));
                }
            }) as Then
        });
    }
}
