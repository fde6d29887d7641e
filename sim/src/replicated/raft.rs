//! openraft on the simulated runtime: a shard's group of three replicas in one thread.
//!
//! The type configuration is the shipping one's (`leasemq_replica::ShardRaft`: entries
//! carry [`Batch`]es, node ids are `u64`) on `openraft-rt-sim`'s runtime: one thread, FIFO
//! polling, virtual time, a seeded random source, so that a seed replays exactly. Around
//! it, what the shipping replica has in its place:
//!
//! - [`Disk`]: a replica's log and vote, kept in memory across its crashes. An append is
//!   durable when it returns, as the write-ahead log's is once its fsync returns, so a
//!   crash keeps every entry openraft was told of.
//! - [`Machine`]: the state machine, which hands committed batches to the replica's
//!   [`Replay`] (the shipping follower's copy of the shard, under the chain rule) and asks
//!   it for the image of a snapshot. It is volatile: a replica that restarts applies its
//!   log again from the start.
//! - [`Net`]: calls go straight to the target's `Raft`, each after a seeded delay, unless a
//!   cut lies between the two nodes or the target is down.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::future::Future;
use std::io::{self, Cursor};
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use leasemq_replica::{Applied, Batch, Replay};
use openraft::errors::{Fatal, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AsyncRuntime, BasicNode, EntryPayload, LogState, OptionalSend, RaftLogReader,
    RaftNetworkFactory, RaftSnapshotBuilder,
};
use openraft_rt_sim::SimRuntime;

use crate::rng::Rng;

openraft::declare_raft_types!(
    /// A shard's group on the simulated runtime.
    pub SimRaft:
        D = Batch,
        R = (),
        NodeId = u64,
        Node = BasicNode,
        AsyncRuntime = SimRuntime,
);

pub type Raft = openraft::Raft<SimRaft, Machine>;
type LogId = openraft::alias::LogIdOf<SimRaft>;
type Vote = openraft::alias::VoteOf<SimRaft>;
type Entry = openraft::alias::EntryOf<SimRaft>;
type StoredMembership = openraft::alias::StoredMembershipOf<SimRaft>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<SimRaft>;
type Snapshot = openraft::alias::SnapshotOf<SimRaft, Cursor<Vec<u8>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shipping log id of a simulated entry: the replay takes those.
pub fn shipping_log_id(id: &LogId) -> leasemq_replica::LogId {
    let leader = id.committed_leader_id();
    leasemq_replica::log_id(leader.term, leader.node_id, id.index)
}

/// What a replica keeps on disk: its vote and its log.
#[derive(Default)]
pub struct Stored {
    vote: Option<Vote>,
    entries: BTreeMap<u64, Entry>,
    purged: Option<LogId>,
}

/// A replica's disk, shared by its incarnations.
#[derive(Clone, Default)]
pub struct Disk(Arc<Mutex<Stored>>);

impl RaftLogReader<SimRaft> for Disk {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let stored = lock(&self.0);
        Ok(stored
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(lock(&self.0).vote)
    }
}

impl RaftLogStorage<SimRaft> for Disk {
    type LogReader = Disk;

    async fn get_log_state(&mut self) -> io::Result<LogState<SimRaft>> {
        let stored = lock(&self.0);
        let last = stored.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: stored.purged,
            last_log_id: last.or(stored.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Disk {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        lock(&self.0).vote = Some(*vote);
        Ok(())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<SimRaft>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut stored = lock(&self.0);
        for entry in entries {
            stored.entries.insert(entry.log_id.index, entry);
        }
        drop(stored);
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> io::Result<()> {
        let from = last.map_or(0, |id| id.index + 1);
        lock(&self.0).entries.split_off(&from);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let mut stored = lock(&self.0);
        stored.entries = stored.entries.split_off(&(log_id.index + 1));
        stored.purged = Some(log_id);
        Ok(())
    }
}

/// A replica's state machine: its replay of the shard, what it applied, the membership.
#[derive(Clone)]
pub struct Machine {
    pub replay: Arc<Mutex<Replay>>,
    state: Arc<Mutex<(Option<LogId>, StoredMembership)>>,
}

impl Machine {
    pub fn new(replay: Replay) -> Machine {
        Machine {
            replay: Arc::new(Mutex::new(replay)),
            state: Arc::default(),
        }
    }

    /// The log id of the last entry applied.
    pub fn applied(&self) -> Option<u64> {
        lock(&self.state).0.map(|id| id.index)
    }

    fn snapshot(&self) -> Snapshot {
        let (applied, membership) = lock(&self.state).clone();
        let image = lock(&self.replay).image();
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
        };
        Snapshot {
            meta,
            snapshot: Cursor::new(image),
        }
    }
}

impl RaftStateMachine<SimRaft> for Machine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Machine;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok(lock(&self.state).clone())
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: futures_util::Stream<Item = io::Result<EntryResponder<SimRaft>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => {
                    let applied = Applied {
                        log_id: shipping_log_id(&entry.log_id),
                        batch,
                    };
                    lock(&self.replay).apply(&applied)?;
                }
                EntryPayload::Membership(m) => {
                    lock(&self.state).1 = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            lock(&self.state).0 = Some(entry.log_id);
            if let Some(responder) = responder {
                responder.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Machine {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        lock(&self.replay).install(&snapshot.into_inner())?;
        *lock(&self.state) = (meta.last_log_id, meta.last_membership.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        Ok(None)
    }
}

impl RaftSnapshotBuilder<SimRaft> for Machine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        Ok(self.snapshot())
    }
}

/// The network between a group's replicas: which are up, which pairs are cut apart.
#[derive(Clone)]
pub struct Net {
    nodes: Arc<Mutex<BTreeMap<u64, Raft>>>,
    cuts: Arc<Mutex<BTreeSet<(u64, u64)>>>,
    /// Draws each call's delay: up to `max_delay_ms` one way.
    rng: Arc<Mutex<Rng>>,
    max_delay_ms: u64,
}

impl Net {
    pub fn new(seed: u64, max_delay_ms: u64) -> Net {
        Net {
            nodes: Arc::default(),
            cuts: Arc::default(),
            rng: Arc::new(Mutex::new(Rng::new(seed))),
            max_delay_ms,
        }
    }

    pub fn up(&self, id: u64, raft: Raft) {
        lock(&self.nodes).insert(id, raft);
    }

    pub fn down(&self, id: u64) -> Option<Raft> {
        lock(&self.nodes).remove(&id)
    }

    pub fn cut(&self, a: u64, b: u64) {
        lock(&self.cuts).insert((a.min(b), a.max(b)));
    }

    pub fn heal(&self) {
        lock(&self.cuts).clear();
    }

    pub fn is_cut(&self, a: u64, b: u64) -> bool {
        lock(&self.cuts).contains(&(a.min(b), a.max(b)))
    }

    /// Node `to`'s replica, once a call from `from` got there; an error where it cannot.
    async fn reach(&self, from: u64, to: u64) -> Result<Raft, Unreachable<SimRaft>> {
        let ms = lock(&self.rng).below(self.max_delay_ms + 1);
        SimRuntime::sleep(Duration::from_millis(ms)).await;
        if self.is_cut(from, to) {
            let why = format!("node {from} and node {to} are cut apart");
            return Err(Unreachable::from_string(why));
        }
        match lock(&self.nodes).get(&to) {
            Some(raft) => Ok(raft.clone()),
            None => Err(Unreachable::from_string(format!("node {to} is down"))),
        }
    }
}

/// What node `from` sends through.
pub struct From {
    pub net: Net,
    pub from: u64,
}

/// A connection from one node to another.
pub struct Link {
    net: Net,
    from: u64,
    to: u64,
}

impl RaftNetworkFactory<SimRaft> for From {
    type Network = Link;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Link {
        Link {
            net: self.net.clone(),
            from: self.from,
            to: target,
        }
    }
}

fn unreachable(e: impl std::fmt::Display) -> RPCError<SimRaft> {
    RPCError::Unreachable(Unreachable::from_string(e.to_string()))
}

fn down(e: Fatal<SimRaft>) -> Unreachable<SimRaft> {
    Unreachable::from_string(format!("the target's replica stopped: {e}"))
}

impl RaftNetworkV2<SimRaft> for Link {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<SimRaft>, RPCError<SimRaft>> {
        let raft = self.net.reach(self.from, self.to).await?;
        raft.append_entries(rpc).await.map_err(unreachable)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let raft = self.net.reach(self.from, self.to).await?;
        raft.vote(rpc).await.map_err(unreachable)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let raft = self.net.reach(self.from, self.to).await?;
        raft.pre_vote(rpc).await.map_err(unreachable)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<SimRaft>, StreamingError<SimRaft>> {
        let raft = self.net.reach(self.from, self.to).await?;
        Ok(raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(down)?)
    }
}

/// Starts node `id`'s replica over `disk`, with a fresh replay of shard 0.
pub async fn start(id: u64, disk: &Disk, net: &Net, tick: Duration) -> (Raft, Machine) {
    let config = leasemq_replica::config("sim", Duration::from_millis(150)).expect("valid");
    let machine = Machine::new(Replay::new(0, tick));
    let from = From {
        net: net.clone(),
        from: id,
    };
    let raft = openraft::Raft::new(id, Arc::new(config), from, disk.clone(), machine.clone())
        .await
        .expect("a replica starts");
    net.up(id, raft.clone());
    (raft, machine)
}
