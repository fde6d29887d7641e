//! An in-memory network between the replicas of groups in one process, for tests and
//! the simulator: calls go straight to the target's `Raft`, and any node can be cut off.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Cursor;
use std::sync::{Arc, Mutex};

use openraft::errors::{Fatal, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};

use crate::{Applier, Raft, ShardRaft, Vote};

/// The replicas of a group, reachable from each other unless one is cut off. Clones
/// share the same network.
pub struct MemNetwork<A: Applier> {
    nodes: Arc<Mutex<BTreeMap<u64, Raft<A>>>>,
    cut: Arc<Mutex<BTreeSet<u64>>>,
}

impl<A: Applier> Clone for MemNetwork<A> {
    fn clone(&self) -> Self {
        MemNetwork {
            nodes: Arc::clone(&self.nodes),
            cut: Arc::clone(&self.cut),
        }
    }
}

impl<A: Applier> Default for MemNetwork<A> {
    fn default() -> Self {
        MemNetwork {
            nodes: Arc::default(),
            cut: Arc::default(),
        }
    }
}

impl<A: Applier> MemNetwork<A> {
    /// Makes `raft` the replica that calls to node `id` reach (replacing an earlier one,
    /// as a restarted node replaces itself).
    pub fn add(&self, id: u64, raft: Raft<A>) {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, raft);
    }

    /// Takes node `id` off the network; its replica is returned.
    pub fn remove(&self, id: u64) -> Option<Raft<A>> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }

    /// Cuts node `id` off: nothing it sends arrives and nothing reaches it.
    pub fn cut_off(&self, id: u64) {
        self.cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
    }

    /// Joins node `id` to the others again.
    pub fn heal(&self, id: u64) {
        self.cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// The network as node `from` sees it: what its replica sends through.
    pub fn from(&self, from: u64) -> NodeNetwork<A> {
        NodeNetwork {
            net: self.clone(),
            from,
        }
    }

    /// Node `to`'s replica, if `from` can reach it.
    fn reach(&self, from: u64, to: u64) -> Result<Raft<A>, Unreachable<ShardRaft>> {
        let cut = self.cut.lock().unwrap_or_else(|e| e.into_inner());
        if cut.contains(&from) || cut.contains(&to) {
            return Err(Unreachable::from_string(format!(
                "node {from} and node {to} are cut apart"
            )));
        }
        drop(cut);
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        match nodes.get(&to) {
            Some(raft) => Ok(raft.clone()),
            None => Err(Unreachable::from_string(format!("node {to} is down"))),
        }
    }
}

/// The network of one node: it makes that node's connections to the others.
pub struct NodeNetwork<A: Applier> {
    net: MemNetwork<A>,
    from: u64,
}

/// A connection from one node to another over a [`MemNetwork`].
pub struct Connection<A: Applier> {
    net: MemNetwork<A>,
    from: u64,
    to: u64,
}

impl<A: Applier> RaftNetworkFactory<ShardRaft> for NodeNetwork<A> {
    type Network = Connection<A>;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Connection<A> {
        Connection {
            net: self.net.clone(),
            from: self.from,
            to: target,
        }
    }
}

fn down(e: Fatal<ShardRaft>) -> Unreachable<ShardRaft> {
    Unreachable::from_string(format!("the target's replica stopped: {e}"))
}

impl<A: Applier> RaftNetworkV2<ShardRaft> for Connection<A> {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<ShardRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<ShardRaft>, RPCError<ShardRaft>> {
        let raft = self.net.reach(self.from, self.to)?;
        let answer = raft.append_entries(rpc).await;
        answer.map_err(|e| RPCError::Unreachable(Unreachable::from_string(e.to_string())))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        let raft = self.net.reach(self.from, self.to)?;
        let answer = raft.vote(rpc).await;
        answer.map_err(|e| RPCError::Unreachable(Unreachable::from_string(e.to_string())))
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        let raft = self.net.reach(self.from, self.to)?;
        let answer = raft.pre_vote(rpc).await;
        answer.map_err(|e| RPCError::Unreachable(Unreachable::from_string(e.to_string())))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<ShardRaft, Cursor<Vec<u8>>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<ShardRaft>, StreamingError<ShardRaft>> {
        let raft = self.net.reach(self.from, self.to)?;
        Ok(raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(down)?)
    }
}
