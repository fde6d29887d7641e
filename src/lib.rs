//! leasemq: an embeddable, sharded, lease-based work queue.
//!
//! A [`Broker`] runs one thread per shard; each queue lives on exactly one shard, chosen by
//! hashing its name. A queue lends each message to one consumer at a time under a **lease**
//! of `ack_timeout`; the consumer settles it ([`ack`](Delivery::ack),
//! [`nack`](Delivery::nack), [`reject`](Delivery::reject), [`release`](Delivery::release))
//! or renews it ([`touch`](Delivery::touch)). A lease that runs out makes the message
//! available again with `attempt + 1`, and the late settle is refused. Delivery is **at
//! least once**: a handler may see a message twice, and nothing is lost silently.
//!
//! This page is a tutorial. The contract, every guarantee and the meaning of every
//! operation, is `docs/contract.md` in the repository; the item docs cite it as
//! "contract §3 `put`" or "contract §2 G1", and list under **Errors** what each call that
//! returns a `Result` can fail with.
//!
//! # Hello, queue
//!
//! ```
//! use leasemq::{Broker, ConsumerConfig, Message, PutOutcome, QueueConfig};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let broker = Broker::builder().shards(2).build()?;
//! let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
//! let worker = jobs.consume("worker-1", ConsumerConfig::default())?;
//!
//! assert_eq!(jobs.put(Message::new("resize photo 17"))?, PutOutcome::Enqueued);
//! let delivery = worker.recv()?;
//! assert_eq!(&delivery.envelope().body[..], b"resize photo 17");
//! assert!(delivery.ack()); // done: the message is gone
//! broker.shutdown();
//! # Ok(()) }
//! ```
//!
//! A call is a barrier for its own effects: when `put` returns, the delivery it caused is
//! already in the consumer's channel, so `try_recv` right after it finds it.
//!
//! # Leases, expiry and the manual clock
//!
//! Tests should not sleep to see a lease run out. A broker built with
//! [`manual_clock`](BrokerBuilder::manual_clock) moves time only when
//! [`Broker::advance`] says so, and `advance` returns once every shard has fired every
//! timer due and pushed the redeliveries that followed:
//!
//! ```
//! use std::time::Duration;
//! use leasemq::{Broker, ConsumerConfig, DeliveryTag, Message, QueueConfig};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let broker = Broker::builder().shards(2).manual_clock().build()?;
//! let config = QueueConfig { ack_timeout: Duration::from_secs(10), ..QueueConfig::default() };
//! let library = broker.declare_queue("library", config)?;
//! let sam = library.consume("sam", ConsumerConfig::default())?;
//! library.put(Message::new("Dragon Book").with_id("book-1"))?;
//!
//! let first = sam.try_recv()?.expect("delivered at once");
//! assert_eq!((first.tag(), first.envelope().attempt), (DeliveryTag(1), 1));
//!
//! broker.advance(Duration::from_secs(12))?; // sam forgets the book
//! assert!(!first.ack()); // the lease ran out: the late ack is stale and changes nothing
//!
//! let again = sam.try_recv()?.expect("redelivered");
//! assert_eq!((again.tag(), again.envelope().attempt), (DeliveryTag(2), 2));
//! assert!(again.envelope().redelivered());
//! assert!(again.ack());
//! # Ok(()) }
//! ```
//!
//! A long job keeps its lease with [`touch`](Delivery::touch), which restarts the lease
//! clock (up to the queue's `max_lease`, counted from the delivery).
//!
//! # Retries and dead letters
//!
//! `nack` gives a message back after the queue's [`RetryPolicy`] delay; `reject` sends it
//! to the queue's dead-letter queue at once, with a [`DeathRecord`] saying where and why.
//! A message that comes back after `max_deliveries` deliveries is dead-lettered too:
//!
//! ```
//! use std::time::Duration;
//! use leasemq::{Broker, ConsumerConfig, DeathReason, Message, QueueConfig, RetryPolicy};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let broker = Broker::builder().manual_clock().build()?;
//! let dead = broker.declare_queue("emails.dead", QueueConfig::default())?;
//! let emails = broker.declare_queue("emails", QueueConfig {
//!     retry: RetryPolicy::immediate(),
//!     max_deliveries: Some(2),
//!     dead_letter: Some("emails.dead".into()),
//!     ..QueueConfig::default()
//! })?;
//! let sender = emails.consume("sender", ConsumerConfig { prefetch: 10 })?;
//! emails.put(Message::new("not json").with_id("e-1"))?;
//!
//! let d = sender.try_recv()?.unwrap();
//! assert!(d.nack()); // a transient failure: retried at once
//! let d = sender.try_recv()?.unwrap();
//! assert!(d.nack()); // second delivery failed too: max_deliveries reached
//!
//! let inspector = dead.consume("inspector", ConsumerConfig::default())?;
//! let letter = inspector.try_recv()?.expect("dead-lettered");
//! let death = letter.envelope().death.clone().unwrap();
//! assert_eq!((death.queue.as_str(), death.reason, death.attempts), ("emails", DeathReason::MaxDeliveries, 2));
//! assert_eq!(letter.envelope().id, "e-1");
//! assert_eq!(emails.stats().dead_lettered, 1);
//! # Ok(()) }
//! ```
//!
//! # Priorities
//!
//! A queue declared with [`QueueConfig::max_priority`] hands out its ready messages highest
//! [`Message::with_priority`] first, in the usual order within a priority (RabbitMQ's
//! `x-max-priority`); a priority above the maximum counts as the maximum:
//!
//! ```
//! use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let broker = Broker::builder().shards(1).build()?;
//! let config = QueueConfig { max_priority: Some(5), ..QueueConfig::default() };
//! let tickets = broker.declare_queue("tickets", config)?;
//! tickets.put(Message::new("routine").with_id("t-1"))?;
//! tickets.put(Message::new("outage").with_id("t-2").with_priority(9))?;
//! tickets.put(Message::new("bug").with_id("t-3").with_priority(2))?;
//! let desk = tickets.consume("desk", ConsumerConfig { prefetch: 3 })?;
//! let mut order = Vec::new();
//! for _ in 0..3 {
//!     order.push(desk.recv()?.envelope().id.clone());
//! }
//! assert_eq!(order, ["t-2", "t-3", "t-1"]);
//! # Ok(()) }
//! ```
//!
//! Consumers have priorities too ([`Queue::consume_with_priority`], RabbitMQ's consumer
//! `x-priority`): a queue's messages go to its consumers of the highest priority that have
//! credit, and to a lower one only while every higher one is at its prefetch, e.g. a
//! local worker first and a remote one for the overflow.
//!
//! # Throughput: batches
//!
//! Every call is one round trip to the queue's shard thread. For throughput, put many
//! messages with [`Queue::put_batch`] and settle many deliveries at once with
//! [`Consumer::ack_up_to`] (every live lease of that consumer up to a tag) or
//! [`Queue::settle_batch`] (any mix of settles, in order):
//!
//! ```
//! use leasemq::{Broker, ConsumerConfig, Message, QueueConfig, Settle};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let broker = Broker::builder().shards(2).build()?;
//! let q = broker.declare_queue("events", QueueConfig::default())?;
//! let c = q.consume("c", ConsumerConfig { prefetch: 1000 })?;
//! q.put_batch((0..100).map(|i| Message::new(format!("event {i}"))).collect())?;
//! let mut last = None;
//! for _ in 0..100 {
//!     last = Some(c.recv()?.tag());
//! }
//! assert_eq!(c.ack_up_to(last.unwrap()), 100);
//!
//! q.put_batch(vec![Message::new("a"), Message::new("b")])?;
//! let (a, b) = (c.recv()?, c.recv()?);
//! assert_eq!(q.settle_batch(&[(a.tag(), Settle::Ack), (b.tag(), Settle::Release)]), [true, true]);
//! # Ok(()) }
//! ```
//!
//! # Async
//!
//! Inside a tokio runtime, use the `_async` forms of the per-message calls and
//! [`Consumer::next`], which wait without blocking a worker thread:
//!
//! ```
//! use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
//!
//! # fn main() -> Result<(), leasemq::Error> {
//! let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
//! rt.block_on(async {
//!     let broker = Broker::builder().shards(2).build()?;
//!     let q = broker.declare_queue("async-jobs", QueueConfig::default())?;
//!     let mut c = q.consume("worker", ConsumerConfig::default())?;
//!     q.put_async(Message::new("hello")).await?;
//!     let d = c.next().await.expect("a delivery");
//!     assert!(q.ack_async(d.tag()).await);
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # Guarantees
//!
//! 1. **At least once.** Until it is acked, dead-lettered or its queue closed, a message
//!    is always ready, delayed, or leased to exactly one consumer.
//! 2. **Stale answers change nothing.** A settle or touch on an unknown, settled or expired
//!    tag returns `false` and changes nothing but the `stale` counter.
//! 3. **Fresh tags.** Every delivery gets a tag greater than every earlier one of its queue.
//! 4. **Deadlines are exact.** A lease with deadline `d` is expired at every `t ≥ d`.
//! 5. **No cross-shard contention.** A queue is touched only by its own shard's thread.
//! 6. **Deterministic under the manual clock.** The same program gives the same deliveries,
//!    tags and attempts.
//!
//! These are contract §2 G1 to G6.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use leasemq_engine::{
    ConsumeOptions, ConsumerConfig, DeathReason, DeathRecord, DeliveryTag, Envelope, Error,
    Message, Overflow, PutOutcome, QueueConfig, QueueStats, RetryPolicy, Settle, MAX_DURATION,
    MIN_ACK_TIMEOUT,
};
pub use leasemq_shard::{
    host_load, set_thread_time_slice, shard_for, Broker, BrokerBuilder, CallerTurns, Cluster,
    ClusterHandle, ClusterStatus, Consumer, Delivery, HostLoad, LogLag, PeerStatus,
    PendingPutBatch, Queue, ShardStatus, SyncPolicy, TurnStats, DEFAULT_CALL_TIMEOUT,
    DEFAULT_ELECTION_TIMEOUT, DEFAULT_LOG_SEGMENT_BYTES, DEFAULT_SHARD_TIME_SLICE,
    DEFAULT_YIELD_BUDGET, HOST_SAMPLE_EVERY, MAX_LOG_SEGMENT_BYTES, MAX_NODES, MAX_TIME_SLICE,
    MAX_YIELD_BUDGET, MIN_LOG_SEGMENT_BYTES, MIN_TIME_SLICE,
};

/// The code blocks of `README.md`, compiled and run by `cargo test --doc` so that the
/// embedding example there cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The code blocks of `docs/contract.md` (its API summary), compiled and run by
/// `cargo test --doc`; the planned parts are `text`.
#[doc = include_str!("../docs/contract.md")]
#[cfg(doctest)]
pub struct ContractDoctests;
