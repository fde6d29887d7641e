//! A shard's log and state on Raft (openraft).
//!
//! In a cluster every shard is one Raft group. Its leader's engine executes, and the
//! change records a turn logs (the bytes a single broker writes to its write-ahead log)
//! become one Raft entry, a [`Batch`]; a put or settle is answered once its entry is
//! committed, fsynced on a majority. Every replica applies committed entries through the
//! engine's restore path. This crate is the seam between openraft and the rest:
//!
//! - [`ShardRaft`], the group's type configuration: node ids are `u64`, entries carry
//!   [`Batch`]es, responses are `()`.
//! - [`LogStore`] and [`LogReader`]: openraft's log storage over [`leasemq_wal::Wal`].
//!   One entry is one record, at lsn = index + 1 (openraft's first index is 0, the log's
//!   first lsn is 1). An append is acknowledged to openraft from the log's group commit:
//!   when the fsync that covers it returns, never before.
//! - [`StateMachine`]: openraft's state machine, which keeps what was applied, the
//!   membership and the snapshots, and hands each committed [`Batch`] to an [`Applier`]
//!   (the shard) and asks it for the image a snapshot holds.
//! - [`Replay`]: a follower's copy of a shard, an engine restoring committed batches
//!   under the chain rule ([`Chain`]), which a replica promoted to lead takes over;
//!   [`ReplayApplier`] is the applier over one.
//! - [`start`] runs a replica over these; [`mem_net`] joins the replicas of one process.
//!
//! Everything openraft-facing lives here, so that the pinned alpha is upgraded in one
//! place.

mod entry;
mod handshake;
pub mod link;
mod log_store;
pub mod mem_net;
mod node;
mod proposer;
mod replay;
mod state_machine;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use entry::{decode_entry, encode_entry};
pub use handshake::{Identity, LinkTls};
pub use log_store::{LogReader, LogStore};
pub use node::{ClusterStatus, Node, NodeConfig, PeerStatus, ShardStatus};
pub use openraft;
pub use proposer::{Outcome, Proposer};
pub use replay::{Chain, Replay, ReplayApplier};
pub use state_machine::{Applied, Applier, SnapshotBuilder, StateMachine};

use leasemq_wal::Storage;
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// The type configuration of a shard's Raft group.
    pub ShardRaft:
        D = Batch,
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
);

/// A log id of a shard's group: the leader that wrote the entry (term, node) and its index.
pub type LogId = openraft::alias::LogIdOf<ShardRaft>;
/// A vote of a shard's group.
pub type Vote = openraft::alias::VoteOf<ShardRaft>;
/// An entry of a shard's log.
pub type Entry = openraft::alias::EntryOf<ShardRaft>;
/// A group's voters and learners with their addresses.
pub type Membership = openraft::Membership<u64, openraft::BasicNode>;
/// A membership with the log id of the entry that set it.
pub type StoredMembership = openraft::alias::StoredMembershipOf<ShardRaft>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<ShardRaft>;

/// A replica of a shard's group, whose state is behind an [`Applier`] `A`.
pub type Raft<A> = openraft::Raft<ShardRaft, StateMachine<A>>;

/// openraft's settings for a shard's group. A leader that hears from no majority for
/// `election_timeout` steps down, and a follower that hears from no leader for between
/// one and two of them stands for election, after a pre-vote (so that a node cut off
/// and back does not disturb a working group); leaders send heartbeats ten times per
/// election timeout. A leader that restarts stands for election again. Snapshots are
/// taken when the group's owner asks for them, and the last 64 entries they cover are
/// kept, for followers a little behind.
///
/// # Errors
///
/// openraft's refusal of an election timeout under 10 ms.
pub fn config(
    cluster: &str,
    election_timeout: Duration,
) -> Result<openraft::Config, openraft::ConfigError> {
    let election = election_timeout.as_millis().min(u64::MAX as u128) as u64;
    openraft::Config {
        cluster_name: cluster.to_string(),
        heartbeat_interval: (election / 10).max(1),
        election_timeout_min: election,
        election_timeout_max: election * 2,
        enable_pre_vote: Some(true),
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 64,
        max_payload_entries: 64,
        // A snapshot goes whole, and may take a while to send and install.
        install_snapshot_timeout: 60_000,
        // A leader that restarts stands for election again, in a new term. Restored
        // without one, it would write new entries under its old leader id, at indexes
        // where its followers may hold entries it sent before its own fsync and lost in
        // the crash: two entries under one log id, and a committed one replaced.
        enable_leader_restore: Some(false),
        ..openraft::Config::default()
    }
    .validate()
}

/// Starts node `id`'s replica of the group kept in `group`: opens its log (with the
/// write-ahead log's `options`) and its state machine over `applier`, and runs openraft
/// on them, talking to the other replicas through `network`.
///
/// # Errors
///
/// The log's or the state machine's error if either does not open; openraft's if it
/// does not start.
pub async fn start<A, N>(
    id: u64,
    config: Arc<openraft::Config>,
    group: &GroupDir,
    options: leasemq_wal::Options,
    applier: A,
    network: N,
) -> std::io::Result<Raft<A>>
where
    A: Applier,
    N: openraft::RaftNetworkFactory<ShardRaft>,
    N::Network: openraft::network::NetSnapshot<ShardRaft, SnapshotData = std::io::Cursor<Vec<u8>>>,
{
    let log = LogStore::open(group, options)?;
    let state = StateMachine::open(group, applier).await?;
    let raft = openraft::Raft::new(id, config, network, log, state).await;
    raft.map_err(std::io::Error::other)
}

/// The log id of the entry at `index` written by the leader of `term` on `node`.
pub fn log_id(term: u64, node: u64, index: u64) -> LogId {
    let leader = openraft::impls::leader_id_adv::LeaderId {
        term,
        node_id: node,
    };
    LogId::new(leader, index)
}

/// The changes one turn of a leader's engine made, as one Raft entry.
///
/// A leader runs ahead of commit: each turn's changes are computed on top of the last
/// turn's, before either is committed. So each batch names its place in the leader's
/// chain of proposals, `(inc, p)` under the entry's leader id: replicas apply a batch
/// only if it follows the last one of its chain (or starts a newer chain at `p = 1`),
/// so a proposal openraft refused leaves no hole that later ones were computed across.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The incarnation of the leader's chain: it grows when the leader rebuilt its
    /// engine after a refused proposal.
    pub inc: u32,
    /// The proposal's number in its chain, from 1.
    pub p: u64,
    /// The engine's change records, encoded as the log of a single broker holds them.
    pub changes: Vec<u8>,
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (inc, p, n) = (self.inc, self.p, self.changes.len());
        write!(f, "batch {p} of chain {inc}, {n} bytes of changes")
    }
}

/// Where a group keeps its files: the log, the vote and the state machine's snapshots,
/// each in a directory of its own under one group directory.
#[derive(Clone, Debug)]
pub struct GroupDir {
    /// The disk (a fake one in tests).
    pub storage: Arc<dyn Storage>,
    /// The group's directory.
    pub dir: std::path::PathBuf,
}

impl GroupDir {
    /// The group directory `dir` on `storage`.
    pub fn new(storage: Arc<dyn Storage>, dir: impl AsRef<Path>) -> GroupDir {
        GroupDir {
            storage,
            dir: dir.as_ref().to_path_buf(),
        }
    }

    fn log(&self) -> std::path::PathBuf {
        self.dir.join("log")
    }

    fn vote(&self) -> std::path::PathBuf {
        self.dir.join("vote")
    }

    fn state(&self) -> std::path::PathBuf {
        self.dir.join("state")
    }
}

/// An io error of kind `InvalidData` saying what was wrong with stored bytes.
fn invalid(detail: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, detail.into())
}

/// The log's error as an io error, as openraft's storage traits take them.
fn io(e: leasemq_wal::WalError) -> std::io::Error {
    std::io::Error::other(e)
}
