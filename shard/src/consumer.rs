//! The consumer handle and the deliveries it receives.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use leasemq_engine::{
    validate, Command, ConsumeOptions, ConsumerConfig, ConsumerKey, Delivered, DeliveryTag,
    Envelope, Error, Reply,
};

use crate::cluster::ClusterInner;
use crate::forward::Call;
use crate::protocol::{Answer, Readers, Request, Sink, WakeOnDrop};
use crate::queue::Queue;
use crate::reply::call;

/// A registered consumer of one queue: receives deliveries up to its prefetch. `Send`, not
/// `Clone`; made by [`Queue::consume`].
///
/// Dropping it (or [`cancel`](Consumer::cancel)) ends it: every live lease it holds comes
/// back at once; deliveries still unread in its channel are released without costing an
/// attempt. The cancel is ordered after the earlier calls of the thread that drops it
/// (contract §3 Consumer cancel).
pub struct Consumer {
    owner: Arc<Owner>,
    key: ConsumerKey,
    rx: Option<Receiver<Delivered>>,
    readers: Arc<Readers>,
    /// In a cluster, for a consumer registered on the node that leads its queue's shard
    /// while this one does not: that node, and the stream its deliveries come by
    /// (`remote.rs`).
    remote: Option<(u64, u64)>,
}

/// What every delivery of a consumer shares.
struct Owner {
    queue: Queue,
    name: String,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.owner.queue.name())
            .field("name", &self.owner.name)
            .finish()
    }
}

impl Consumer {
    pub(crate) fn new(
        queue: Queue,
        name: &str,
        key: ConsumerKey,
        rx: Receiver<Delivered>,
        readers: Arc<Readers>,
    ) -> Consumer {
        Consumer {
            owner: Arc::new(Owner {
                queue,
                name: name.to_string(),
            }),
            key,
            rx: Some(rx),
            readers,
            remote: None,
        }
    }

    /// The same consumer as registered on node `peer`, its deliveries coming by `stream`.
    pub(crate) fn remote(mut self, peer: u64, stream: u64) -> Consumer {
        self.remote = Some((peer, stream));
        self
    }

    /// Ends a remote consumer's stream here, and tells its node to stop it (keeping its
    /// leases) or cancel it, with the deliveries this node held unread; waits for the
    /// answer where `wait`.
    fn end_remote(&self, rx: &Receiver<Delivered>, keep_leases: bool, wait: bool) {
        let Some((peer, stream)) = self.remote else {
            return;
        };
        let queue = &self.owner.queue;
        let Some(cluster) = queue.broker().cluster.as_ref() else {
            return;
        };
        cluster.streams.end(stream, false);
        let unread = rx.try_iter().map(|d| d.tag).collect();
        let call = Call::End {
            consumer: self.key,
            unread,
            keep_leases,
        };
        if wait {
            cluster.call_at(peer, queue.shard(), &call);
        } else {
            cluster.tell(peer, queue.shard(), &call);
        }
    }

    /// The consumer's name, unique among its queue's live consumers.
    pub fn name(&self) -> &str {
        &self.owner.name
    }

    /// The queue this consumer reads.
    pub fn queue(&self) -> &Queue {
        &self.owner.queue
    }

    fn rx(&self) -> &Receiver<Delivered> {
        self.rx.as_ref().expect("present until drop")
    }

    /// Wraps what came out of the channel; a delivery left over from a queue that has since
    /// closed is not handed out.
    fn wrap(&self, delivered: Delivered) -> Result<Delivery, Error> {
        if self.owner.queue.cell().is_closed() {
            return Err(Error::Closed);
        }
        if let Some(e) = self.stood_down() {
            return Err(e);
        }
        Ok(Delivery {
            tag: delivered.tag,
            envelope: delivered.into_envelope(),
            owner: self.owner.clone(),
        })
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.owner.queue.broker().is_shut_down() {
            return Err(Error::ShutDown);
        }
        Ok(())
    }

    /// Blocks until a delivery arrives, and returns it (contract §3 Receiving).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the queue is closed, also for deliveries still in the channel;
    /// [`Error::ShutDown`] once the broker shuts down, whether that happened before the call or
    /// while it waited.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().shards(2).build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let worker = jobs.consume("worker", ConsumerConfig::default())?;
    /// let producer = {
    ///     let jobs = jobs.clone();
    ///     std::thread::spawn(move || jobs.put(Message::new("resize photo 17")))
    /// };
    /// let job = worker.recv()?; // waits for the producer thread's put
    /// assert_eq!(&job.envelope().body[..], b"resize photo 17");
    /// assert!(job.ack());
    /// producer.join().unwrap()?;
    /// broker.shutdown();
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn recv(&self) -> Result<Delivery, Error> {
        self.check_open()?;
        match self.wait(None) {
            Some(Ok(delivered)) => self.wrap(delivered),
            _ => Err(self.ended()),
        }
    }

    /// In a cluster, once the shard's leader stood down: the consumer ended with it, and
    /// what its channel still holds was handed out under leases that ended too.
    fn stood_down(&self) -> Option<Error> {
        self.readers
            .unavailable
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| {
                Error::Unavailable(format!(
                    "the leader of shard {} stood down, ending its consumers and their \
                     leases; consume again",
                    self.owner.queue.shard()
                ))
            })
    }

    /// Why the channel ended: the queue closed, the broker shut down, or (in a cluster)
    /// the shard's leader stood down.
    fn ended(&self) -> Error {
        let queue = &self.owner.queue;
        if !queue.cell().is_closed() && queue.broker().is_shut_down() {
            return Error::ShutDown;
        }
        self.stood_down().unwrap_or(Error::Closed)
    }

    /// Like [`recv`](Consumer::recv), but waits at most `timeout`: `Ok(None)` then.
    ///
    /// # Errors
    ///
    /// As [`recv`](Consumer::recv): [`Error::Closed`] once the queue is closed,
    /// [`Error::ShutDown`] once the broker shuts down.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Delivery>, Error> {
        self.check_open()?;
        // A timeout too long to add to now waits without one.
        match self.wait(Instant::now().checked_add(timeout)) {
            Some(Ok(delivered)) => self.wrap(delivered).map(Some),
            Some(Err(())) => Err(self.ended()),
            None => Ok(None),
        }
    }

    /// Waits for a delivery (`Ok`) or the channel's end (`Err`): polls briefly, then parks
    /// until the shard rings (see `wait.rs`). `None` once `deadline` passes.
    fn wait(&self, deadline: Option<Instant>) -> Option<Result<Delivered, ()>> {
        let rx = self.rx();
        let attempt = || match rx.try_recv() {
            Ok(delivered) => Some(Ok(delivered)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(())),
        };
        // A durable queue's deliveries come after an fsync: no point spinning for them.
        if self.owner.queue.is_durable() {
            self.readers.threads.wait_parked(deadline, attempt)
        } else {
            let yields = self
                .owner
                .queue
                .broker()
                .inbox(self.owner.queue.shard())
                .yields();
            self.readers.threads.wait(deadline, yields, attempt)
        }
    }

    /// A delivery if one is waiting, else `Ok(None)` at once. Since every call is a barrier for
    /// its own effects (contract §4 Barriers), a `try_recv` right after a `put` or an `advance`
    /// finds what they delivered.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the queue is closed; [`Error::ShutDown`] after the broker's
    /// shutdown.
    pub fn try_recv(&self) -> Result<Option<Delivery>, Error> {
        self.check_open()?;
        match self.rx().try_recv() {
            Ok(delivered) => self.wrap(delivered).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.ended()),
        }
    }

    /// The next delivery, without blocking the executor; `None` once the consumer is closed.
    /// Cancel-safe: dropping the future loses nothing.
    pub async fn next(&mut self) -> Option<Delivery> {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        if self.check_open().is_err() {
            return Poll::Ready(None);
        }
        crate::host::participate();
        let rx = self.rx();
        for registered in [false, true] {
            match rx.try_recv() {
                Ok(delivered) => return Poll::Ready(self.wrap(delivered).ok()),
                Err(TryRecvError::Disconnected) => return Poll::Ready(None),
                Err(TryRecvError::Empty) if registered => return Poll::Pending,
                // Register, then look again: a delivery sent in between is not missed.
                Err(TryRecvError::Empty) => self.readers.task.register(cx.waker()),
            }
        }
        Poll::Pending
    }

    /// Acks every live lease of this consumer with a tag up to `tag`, read or still unread;
    /// returns how many (RabbitMQ's `multiple=true`; contract §3 `ack_up_to`). Tags that name no
    /// live lease of this consumer are skipped without counting as stale; on a closed queue or
    /// after shutdown it returns 0.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let events = broker.declare_queue("events", QueueConfig::default())?;
    /// let reader = events.consume("reader", ConsumerConfig::default())?;
    /// events.put_batch((0..10).map(|i| Message::new(format!("event {i}"))).collect())?;
    ///
    /// let mut last = None;
    /// while let Some(d) = reader.try_recv()? {
    ///     last = Some(d.tag());
    /// }
    /// assert_eq!(reader.ack_up_to(last.unwrap()), 10); // one round trip for all ten
    /// assert_eq!(events.stats().leased, 0);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn ack_up_to(&self, tag: DeliveryTag) -> usize {
        let queue = &self.owner.queue;
        if queue.broker().is_shut_down() || queue.cell().is_closed() {
            return 0;
        }
        if let (Some((peer, _)), Some(cluster)) = (self.remote, &queue.broker().cluster) {
            let call = Call::AckUpTo {
                consumer: self.key,
                tag,
            };
            return match cluster.call_at(peer, queue.shard(), &call) {
                Answer::Engine(Reply::Count(n)) => n,
                _ => 0,
            };
        }
        let cmd = Command::AckUpTo {
            consumer: self.key,
            tag,
        };
        match call(queue.broker().inbox(queue.shard()), |reply| {
            Request::Engine { cmd, reply }
        }) {
            Answer::Engine(Reply::Count(n)) => n,
            _ => 0,
        }
    }

    /// Stops the consumer's deliveries and keeps its leases: what it has read stays leased
    /// to it and can still be settled, while deliveries still unread in its channel are
    /// released (no attempt spent). This is AMQP's `basic.cancel`, and the graceful way to
    /// shut a worker down: stop, finish the work in hand, settle it, then drop the consumer.
    /// Its leases still run out at their deadlines, and dropping or cancelling it returns
    /// the ones left. Afterwards `recv` and `try_recv` give [`Error::Closed`], and `next`
    /// gives `None`: nothing more will arrive. The name stays in use until the consumer is
    /// dropped. Idempotent; returns once done.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// jobs.put_batch((0..3).map(|i| Message::new(format!("job {i}"))).collect())?;
    /// let worker = jobs.consume("worker", ConsumerConfig { prefetch: 3 })?;
    /// let in_hand = worker.recv()?; // the other two stay unread in the channel
    /// worker.stop();
    /// assert_eq!(jobs.stats().ready, 2); // released
    /// assert!(in_hand.ack()); // still its lease
    /// assert!(worker.try_recv().is_err());
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn stop(&self) {
        let Some(rx) = self.rx.as_ref() else { return };
        let queue = &self.owner.queue;
        if queue.broker().is_shut_down() || queue.cell().is_closed() {
            return;
        }
        if self.remote.is_some() {
            return self.end_remote(rx, true, true);
        }
        let consumer = self.key;
        let rx = rx.clone();
        call(queue.broker().inbox(queue.shard()), |reply| Request::Stop {
            consumer,
            rx,
            unread: Vec::new(),
            reply,
        });
    }

    /// Ends the consumer, as dropping it does, and returns once that is done: its leases
    /// are back in the queue and any dead letter it caused has landed.
    pub fn cancel(mut self) {
        let Some(rx) = self.rx.take() else { return };
        let queue = &self.owner.queue;
        if queue.broker().is_shut_down() || queue.cell().is_closed() {
            return;
        }
        if self.remote.is_some() {
            return self.end_remote(&rx, false, true);
        }
        let consumer = self.key;
        call(queue.broker().inbox(queue.shard()), |reply| {
            Request::Cancel {
                consumer,
                rx,
                unread: Vec::new(),
                reply: Some(reply),
            }
        });
    }
}

impl Drop for Consumer {
    /// Sends the cancel without waiting; it is ordered before this thread's next call on
    /// the queue, since both go through the same inbox.
    fn drop(&mut self) {
        let Some(rx) = self.rx.take() else { return };
        let queue = &self.owner.queue;
        if queue.broker().is_shut_down() || queue.cell().is_closed() {
            return;
        }
        if self.remote.is_some() {
            return self.end_remote(&rx, false, false);
        }
        let _ = queue.broker().inbox(queue.shard()).send(Request::Cancel {
            consumer: self.key,
            rx,
            unread: Vec::new(),
            reply: None,
        });
    }
}

/// One hand-over of a message to a consumer, under a lease: its tag, what the consumer sees
/// of the message ([`Envelope`]), and settles for that tag on its own queue (each the
/// [`Queue`] call of the same name, so `delivery.ack()` is `queue.ack(delivery.tag())`).
#[derive(Clone)]
pub struct Delivery {
    tag: DeliveryTag,
    envelope: Envelope,
    owner: Arc<Owner>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("tag", &self.tag)
            .field("envelope", &self.envelope)
            .field("consumer", &self.owner.name)
            .finish()
    }
}

impl PartialEq for Delivery {
    fn eq(&self, other: &Self) -> bool {
        self.tag == other.tag
            && self.envelope == other.envelope
            && self.owner.name == other.owner.name
            && self.owner.queue.name() == other.owner.queue.name()
    }
}

impl Delivery {
    /// This delivery's tag: greater than every tag its queue handed out before (contract §2 G3).
    pub fn tag(&self) -> DeliveryTag {
        self.tag
    }

    /// What the consumer sees of the message: id, body, attempt, death record.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The name of the consumer it was delivered to.
    pub fn consumer(&self) -> &str {
        &self.owner.name
    }

    /// The queue it came from.
    pub fn queue(&self) -> &Queue {
        &self.owner.queue
    }

    /// Finishes the delivery: the message is gone. `false` if the tag is stale. See
    /// [`Queue::ack`].
    pub fn ack(&self) -> bool {
        self.owner.queue.ack(self.tag)
    }

    /// Gives the message back to be retried after the queue's retry delay. `false` if the tag is
    /// stale. See [`Queue::nack`].
    pub fn nack(&self) -> bool {
        self.owner.queue.nack(self.tag)
    }

    /// Gives the message back to be retried after `delay` (at most 7 days). See
    /// [`Queue::nack_with_delay`].
    pub fn nack_with_delay(&self, delay: Duration) -> bool {
        self.owner.queue.nack_with_delay(self.tag, delay)
    }

    /// Dead-letters the message now. `false` if the tag is stale. See [`Queue::reject`].
    pub fn reject(&self) -> bool {
        self.owner.queue.reject(self.tag)
    }

    /// Hands the message back unseen, costing no attempt. `false` if the tag is stale. See
    /// [`Queue::release`].
    pub fn release(&self) -> bool {
        self.owner.queue.release(self.tag)
    }

    /// Restarts the lease clock. `false` if the tag is stale or `max_lease` refuses it. See
    /// [`Queue::touch`].
    pub fn touch(&self) -> bool {
        self.owner.queue.touch(self.tag)
    }
}

/// Registering consumers: here, beside the [`Consumer`] they make.
impl Queue {
    /// Registers a consumer of priority 0, last in the queue's round robin among those of
    /// its priority (contract §3 `consume`). Deliveries
    /// start at once, up to its prefetch: what is ready is in its channel when this returns.
    ///
    /// # Errors
    ///
    /// Checked in this order; a consume that fails registers nothing:
    ///
    /// - [`Error::ShutDown`] after the broker's shutdown;
    /// - [`Error::QueueClosed`] once the queue is closed;
    /// - [`Error::InvalidName`] unless `name` is 1 to 255 bytes;
    /// - [`Error::InvalidConfig`] for a prefetch of 0 or over 65 535;
    /// - [`Error::DuplicateConsumer`] when a live consumer of this queue has that name.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Error, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// jobs.put_batch(vec![Message::new("a"), Message::new("b"), Message::new("c")])?;
    ///
    /// let worker = jobs.consume("worker", ConsumerConfig { prefetch: 2 })?;
    /// assert!(worker.try_recv()?.is_some() && worker.try_recv()?.is_some());
    /// assert!(worker.try_recv()?.is_none(), "prefetch 2: the third waits for credit");
    /// let taken = jobs.consume("worker", ConsumerConfig::default());
    /// assert_eq!(taken.unwrap_err(), Error::DuplicateConsumer);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn consume(&self, name: &str, config: ConsumerConfig) -> Result<Consumer, Error> {
        self.consume_with(name, config, ConsumeOptions::default())
    }

    /// [`consume`](Queue::consume) with a consumer priority (contract §3 Dispatch, AMQP's
    /// `x-priority`): the queue hands its ready messages to the consumers of the highest
    /// priority that have credit, round robin among them, and to a lower one only while
    /// every higher one is full (its prefetch reached) or stopped. A consumer made with
    /// [`consume`](Queue::consume) has priority 0; priorities may be negative.
    ///
    /// # Errors
    ///
    /// As [`consume`](Queue::consume).
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let spare = jobs.consume_with_priority("spare", ConsumerConfig::default(), -1)?;
    /// let main = jobs.consume_with_priority("main", ConsumerConfig { prefetch: 2 }, 5)?;
    /// jobs.put_batch(vec![Message::new("a"), Message::new("b"), Message::new("c")])?;
    ///
    /// // `main` takes what its prefetch allows; only the overflow goes to `spare`.
    /// assert_eq!(main.try_recv()?.unwrap().envelope().body, "a");
    /// assert_eq!(main.try_recv()?.unwrap().envelope().body, "b");
    /// assert_eq!(spare.try_recv()?.unwrap().envelope().body, "c");
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn consume_with_priority(
        &self,
        name: &str,
        config: ConsumerConfig,
        priority: i64,
    ) -> Result<Consumer, Error> {
        self.consume_with(name, config, ConsumeOptions::default().priority(priority))
    }

    /// [`consume`](Queue::consume) with [`ConsumeOptions`]: a priority (as
    /// [`consume_with_priority`](Queue::consume_with_priority)), and a lease length of the
    /// consumer's own in place of the queue's `ack_timeout` (AMQP's `x-consumer-timeout` on
    /// `basic.consume`): its deliveries, and its touches, last that long, still bounded by
    /// the queue's `max_lease`.
    ///
    /// # Errors
    ///
    /// As [`consume`](Queue::consume), and [`Error::InvalidConfig`] for a lease outside
    /// 1 ms to 7 days or over the queue's `max_lease`.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use std::time::Duration;
    /// use leasemq::{Broker, ConsumeOptions, ConsumerConfig, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let config = QueueConfig { ack_timeout: Duration::from_secs(30), ..QueueConfig::default() };
    /// let jobs = broker.declare_queue("jobs", config)?;
    /// jobs.put(Message::new("due in an hour"))?;
    ///
    /// // This worker holds what it takes for up to two hours before it goes to another.
    /// let options = ConsumeOptions::default().ack_timeout(Duration::from_secs(7200));
    /// let patient = jobs.consume_with("patient", ConsumerConfig::default(), options)?;
    /// let held = patient.try_recv()?.unwrap();
    /// broker.advance(Duration::from_secs(3600))?;
    /// assert!(held.ack(), "its lease has not run out");
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn consume_with(
        &self,
        name: &str,
        config: ConsumerConfig,
        options: ConsumeOptions,
    ) -> Result<Consumer, Error> {
        if self.broker().is_shut_down() {
            return Err(Error::ShutDown);
        }
        if self.cell().is_closed() {
            return Err(Error::QueueClosed);
        }
        validate::consumer_name(name)?;
        validate::consumer_config(&config)?;
        if let Some(lease) = options.ack_timeout {
            validate::consumer_lease(lease, self.config().max_lease)?;
        }
        let (tx, rx) = unbounded();
        let readers = Arc::new(Readers::default());
        if let Some(cluster) = &self.broker().cluster {
            if let Some(peer) = cluster.elsewhere(self.shard()) {
                return self.consume_at(cluster, peer, (name, config, options), (tx, rx, readers));
            }
        }
        let sink = Sink {
            tx,
            rx: rx.clone(),
            prefetch: config.prefetch as usize,
            readers: WakeOnDrop(readers.clone()),
        };
        let queue = self.key();
        let answer = call(self.broker().inbox(self.shard()), |reply| {
            Request::Consume {
                queue,
                name: name.into(),
                config,
                options: Box::new(options),
                sink,
                reply,
            }
        });
        match answer {
            Answer::Engine(Reply::Consumed(Ok(key))) => {
                Ok(Consumer::new(self.clone(), name, key, rx, readers))
            }
            Answer::Engine(Reply::Consumed(Err(e))) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("consume answered {other:?}"),
        }
    }
}

impl Queue {
    /// In a cluster, registers a consumer on node `peer`, which leads the queue's shard,
    /// and streams its deliveries here (`remote.rs`).
    #[allow(clippy::type_complexity)]
    fn consume_at(
        &self,
        cluster: &ClusterInner,
        peer: u64,
        (name, config, options): (&str, ConsumerConfig, ConsumeOptions),
        (tx, rx, readers): (Sender<Delivered>, Receiver<Delivered>, Arc<Readers>),
    ) -> Result<Consumer, Error> {
        let shard = u16::try_from(self.shard()).expect("at most MAX_SHARDS");
        let stream = cluster.streams.open(shard, peer, tx, readers.clone());
        let call = Call::Consume {
            // Every queue of a cluster is durable, hence numbered.
            number: self.cell().number().unwrap_or(u32::MAX),
            name: name.to_string(),
            config,
            options,
            from: cluster.id,
            stream,
        };
        let e = match cluster.call_at(peer, self.shard(), &call) {
            Answer::Engine(Reply::Consumed(Ok(key))) => {
                let consumer = Consumer::new(self.clone(), name, key, rx, readers);
                return Ok(consumer.remote(peer, stream));
            }
            Answer::Engine(Reply::Consumed(Err(e))) | Answer::Failed(e) => e,
            Answer::NotLeader(_) => Error::Unavailable(format!(
                "node {peer} no longer leads shard {shard}; consume again"
            )),
            Answer::ShutDown => Error::ShutDown,
            other => unreachable!("consume answered {other:?}"),
        };
        cluster.streams.end(stream, false);
        Err(e)
    }
}
