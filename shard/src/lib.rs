//! Shard threads, routing, clocks and the handles of the leasemq broker.
//!
//! A [`Broker`] starts one OS thread per shard; each runs a thin event loop around its own
//! [`leasemq_engine::Shard`] and owns the queues that [`shard_for`] maps onto it. Handles
//! talk to a shard only through its bounded inbox: a [`Queue`] sends puts and settles and
//! waits for the answer in a per-thread reply slot (or a oneshot, for the async forms); a
//! [`Consumer`] reads [`Delivery`]s from its own channel, which the shard fills up to the
//! consumer's prefetch. While the host is busy, a blocking caller that finds the shard
//! thread asleep runs the shard's turn itself instead of waking it (see
//! [`CallerTurns`]). Nothing on the per-message path waits for a lock (a caller only tries
//! the sleeping shard's), and two queues on different shards share no channel.
//!
//! Time comes from the system clock (ticks of 1 ms by default; the loop sleeps until the
//! engine's next deadline), or from a manual clock that only [`Broker::advance`] moves: a
//! barrier across every shard, which returns once each has fired every timer due and
//! pushed the deliveries that followed.
//!
//! What each call means is the contract's (`docs/contract.md` in the repository), which
//! the item docs cite as "contract §3 `put`". Their examples are written as a user of the
//! `leasemq` crate writes them, since that crate re-exports these handles beside the
//! engine's data types; a hidden first line in each maps `leasemq` onto this crate and
//! `leasemq-engine`.

// Unsafe code is denied everywhere but in `slice`, whose one system call has no safe form.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod broker;
mod cluster;
mod consumer;
mod forward;
mod host;
mod inner;
mod protocol;
mod queue;
mod remote;
mod reply;
pub mod route;
mod router;
mod runtime;
mod slice;
mod store;
mod turns;
mod wait;

pub use broker::{
    Broker, BrokerBuilder, DEFAULT_SHARD_TIME_SLICE, DEFAULT_YIELD_BUDGET, MAX_SHARDS,
    MAX_YIELD_BUDGET,
};
pub use cluster::{
    Cluster, ClusterHandle, ClusterStatus, PeerStatus, ShardStatus, DEFAULT_CALL_TIMEOUT,
    DEFAULT_ELECTION_TIMEOUT, MAX_NODES,
};
pub use consumer::{Consumer, Delivery};
pub use host::{host_load, HostLoad, HOST_SAMPLE_EVERY};
/// How far the disk is behind a shard's log: see [`Broker::log_lag`].
pub use leasemq_wal::Lag as LogLag;
pub use queue::{PendingPutBatch, Queue};
pub use router::shard_for;
pub use slice::{set_thread_time_slice, MAX_TIME_SLICE, MIN_TIME_SLICE};
pub use store::{
    SyncPolicy, DEFAULT_LOG_SEGMENT_BYTES, MAX_LOG_SEGMENT_BYTES, META_FILE, MIN_LOG_SEGMENT_BYTES,
};
pub use turns::{CallerTurns, TurnStats};
