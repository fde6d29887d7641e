//! A node of a cluster: one replica of every shard's group, the node link that joins
//! them to their peers, and the runtime they run on.
//!
//! A node's directory holds `meta/` (the cluster's name, this node's id and the shard
//! count, fixed when the directory is made, in a file written as the log writes its
//! snapshots: atomically, and checked when read) and one group directory per shard,
//! `shard-<k>` (see [`GroupDir`]). Every replica's state machine is a [`Replay`] of its
//! shard: the leader's engine, when this node leads, lives with the shard, and is rebuilt
//! from the replay's image when it takes the lead.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasemq_wal::{Options, Storage};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{InitializeError, RaftError};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};

use crate::link::{Admin, AdminCall, Link};
use crate::{invalid, GroupDir, Identity, LogStore, Raft, Replay, ReplayApplier, StateMachine};

const META_FORMAT: &str = "leasemq cluster node, format 1";
/// How often a group's log growth is looked at.
const SNAPSHOT_CHECK: Duration = Duration::from_millis(250);

/// What a node is and where it keeps its data.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Who this node is in its cluster, and the cluster's secret.
    pub identity: Identity,
    /// Where the node link listens.
    pub listen: String,
    /// Every voter's link address by node id, this node's included (what peers dial).
    pub peers: BTreeMap<u64, String>,
    /// A follower that hears from no leader for this long (up to twice it) stands for
    /// election.
    pub election_timeout: Duration,
    /// The node's directory.
    pub dir: PathBuf,
    /// The disk it is on.
    pub storage: Arc<dyn Storage>,
    /// The write-ahead log's options for every group's log.
    pub log: Options,
    /// The engines' tick.
    pub tick: Duration,
}

/// A running node.
pub struct Node {
    config: NodeConfig,
    runtime: tokio::runtime::Runtime,
    link: Link<ReplayApplier>,
    groups: Vec<(Raft<ReplayApplier>, ReplayApplier)>,
}

/// Where a cluster stands, as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This node's id.
    pub node: u64,
    /// Every shard's group, by shard.
    pub shards: Vec<ShardStatus>,
    /// Every peer but this node.
    pub peers: Vec<PeerStatus>,
}

impl std::fmt::Display for ClusterStatus {
    /// As `leasemqd cluster status` prints it: a line per shard (leader, term, voters,
    /// committed and applied index, `-` where unknown), then whether each peer is
    /// reachable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "node {}", self.node)?;
        writeln!(f, "shard  leader  term  voters   committed  applied")?;
        let or_dash = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        for s in &self.shards {
            let voters: Vec<String> = s.voters.iter().map(u64::to_string).collect();
            writeln!(
                f,
                "{:<6} {:<7} {:<5} {:<8} {:<10} {}",
                s.shard,
                or_dash(s.leader),
                s.term,
                voters.join(","),
                or_dash(s.committed),
                or_dash(s.applied)
            )?;
        }
        for p in &self.peers {
            let reach = if p.reachable {
                "reachable"
            } else {
                "unreachable"
            };
            writeln!(f, "peer {}: {reach}", p.node)?;
        }
        Ok(())
    }
}

/// A shard's group, as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStatus {
    /// The shard.
    pub shard: u16,
    /// The node that leads it, if this node knows one.
    pub leader: Option<u64>,
    /// The group's term, as this node knows it.
    pub term: u64,
    /// The group's voters.
    pub voters: Vec<u64>,
    /// The last index this node knows to be committed.
    pub committed: Option<u64>,
    /// The last index this node applied.
    pub applied: Option<u64>,
}

/// A peer, as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its node id.
    pub node: u64,
    /// Heard from over the node link within two election timeouts.
    pub reachable: bool,
}

impl Node {
    /// Starts the node: checks (or writes) its directory's meta file, opens every
    /// shard's group, and serves the node link. Its groups serve nothing until the
    /// cluster is formed ([`init`](Node::init), once, on any node).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a directory made for another cluster, node id or shard count
    /// (naming both), or a node missing from its own peers; the disk's or a group's
    /// error; the listener's.
    pub fn start(config: NodeConfig) -> io::Result<Node> {
        if !config.peers.contains_key(&config.identity.node) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node {} is not among its peers", config.identity.node),
            ));
        }
        check_meta(&*config.storage, &config.dir, &config.identity)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("leasemq-raft")
            .enable_all()
            .build()?;
        let peers = config
            .peers
            .iter()
            .map(|(&id, addr)| (id, addr.clone()))
            .collect();
        let link = Link::new(config.identity.clone(), peers);
        let groups = runtime.block_on(open_groups(&config, &link))?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(&config.listen))?;
        runtime.spawn(link.clone().serve(listener));
        runtime.spawn(link.clone().ping(config.election_timeout / 2));
        link.serve_admin(admin(&groups, &link, &config));
        Ok(Node {
            config,
            runtime,
            link,
            groups,
        })
    }

    /// Forms the cluster: every peer becomes a voter of every shard's group. On a
    /// cluster already formed, it does nothing.
    ///
    /// # Errors
    ///
    /// A group's error.
    pub fn init(&self) -> io::Result<()> {
        let rafts: Vec<_> = self.groups.iter().map(|(raft, _)| raft.clone()).collect();
        self.runtime
            .block_on(init(rafts, self.config.peers.clone()))
    }

    /// Where the cluster stands, as this node sees it.
    pub fn status(&self) -> ClusterStatus {
        let rafts: Vec<_> = self.groups.iter().map(|(raft, _)| raft.clone()).collect();
        status(&rafts, &self.link, &self.config)
    }

    /// This node's replica of `shard`'s group, and its replay of the shard.
    pub fn group(&self, shard: u16) -> Option<&(Raft<ReplayApplier>, ReplayApplier)> {
        self.groups.get(usize::from(shard))
    }

    /// Makes `serve` what answers the calls peers forward to this node.
    pub fn serve_forwarded(&self, serve: crate::link::Forwarded) {
        self.link.serve_forwarded(serve);
    }

    /// The node link, which forwarded calls travel on.
    pub fn link(&self) -> &Link<ReplayApplier> {
        &self.link
    }

    /// The runtime the groups and the link run on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Stops every group and the link.
    pub fn shutdown(self) {
        self.runtime.block_on(async {
            for (raft, _) in &self.groups {
                let _ = raft.shutdown().await;
            }
        });
        self.runtime.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Serves an admin tool's calls on the node of `config`.
fn admin(
    groups: &[(Raft<ReplayApplier>, ReplayApplier)],
    link: &Link<ReplayApplier>,
    config: &NodeConfig,
) -> Admin {
    let rafts: Vec<_> = groups.iter().map(|(raft, _)| raft.clone()).collect();
    let (link, config) = (link.clone(), config.clone());
    Arc::new(move |call| {
        let (rafts, link, config) = (rafts.clone(), link.clone(), config.clone());
        Box::pin(async move {
            match call {
                AdminCall::Init => init(rafts, config.peers.clone())
                    .await
                    .map(|()| Vec::new())
                    .map_err(|e| e.to_string()),
                AdminCall::Status => {
                    serde_json::to_vec(&status(&rafts, &link, &config)).map_err(|e| e.to_string())
                }
            }
        })
    })
}

/// Forms the cluster of `peers`: each becomes a voter of every group. A formed group
/// stays as it is.
async fn init(rafts: Vec<Raft<ReplayApplier>>, peers: BTreeMap<u64, String>) -> io::Result<()> {
    let members: BTreeMap<u64, BasicNode> = (peers.iter())
        .map(|(&id, addr)| (id, BasicNode::new(addr)))
        .collect();
    for raft in &rafts {
        match raft.initialize(members.clone()).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => return Err(io::Error::other(e)),
        }
    }
    Ok(())
}

/// Where the cluster stands, as the node of `config` sees it through its `rafts` and its
/// `link`.
fn status(
    rafts: &[Raft<ReplayApplier>],
    link: &Link<ReplayApplier>,
    config: &NodeConfig,
) -> ClusterStatus {
    let shards = (rafts.iter().zip(0u16..))
        .map(|(raft, shard)| {
            let metrics = raft.metrics().borrow_watched().clone();
            ShardStatus {
                shard,
                leader: metrics.current_leader,
                term: metrics.current_term,
                voters: metrics.membership_config.voter_ids().collect(),
                committed: metrics.local_committed.map(|id| id.index),
                applied: metrics.last_applied.map(|id| id.index),
            }
        })
        .collect();
    let recent = 2 * config.election_timeout;
    let peers = (config.peers.keys())
        .filter(|&&id| id != config.identity.node)
        .map(|&node| PeerStatus {
            node,
            reachable: (link.last_heard(node)).is_some_and(|at| at.elapsed() < recent),
        })
        .collect();
    ClusterStatus {
        node: config.identity.node,
        shards,
        peers,
    }
}

async fn open_groups(
    config: &NodeConfig,
    link: &Link<ReplayApplier>,
) -> io::Result<Vec<(Raft<ReplayApplier>, ReplayApplier)>> {
    let raft_config = crate::config(&config.identity.cluster, config.election_timeout)
        .map_err(io::Error::other)?;
    let raft_config = Arc::new(raft_config);
    let mut groups = Vec::new();
    for shard in 0..config.identity.shards {
        let dir = config.dir.join(format!("shard-{shard}"));
        let group = GroupDir::new(Arc::clone(&config.storage), dir);
        let replay = ReplayApplier::new(Replay::new(shard, config.tick));
        let log = LogStore::open(&group, config.log.clone())?;
        let appended = log.appended();
        let state = StateMachine::open(&group, replay.clone()).await?;
        let snapshot_bytes = state.snapshot_bytes();
        let (id, raft_config) = (config.identity.node, Arc::clone(&raft_config));
        let raft = openraft::Raft::new(id, raft_config, link.network(shard), log, state).await;
        let raft = raft.map_err(io::Error::other)?;
        link.serve_group(shard, raft.clone());
        let growth = Growth {
            appended,
            snapshot_bytes,
            segment_bytes: config.log.segment_bytes,
        };
        tokio::spawn(take_snapshots(raft.clone(), growth));
        groups.push((raft, replay));
    }
    Ok(groups)
}

/// How far a group's log grew since its last snapshot.
struct Growth {
    appended: Arc<AtomicU64>,
    snapshot_bytes: Arc<AtomicU64>,
    segment_bytes: u64,
}

/// Has the group take a snapshot once its log grew by two segments since the last one,
/// or by twice the last snapshot's size, whichever is more, as a single broker's shard
/// does: disk use follows what the queues hold, and a snapshot costs time in proportion
/// to the log it saves. openraft then lets go of the entries it covers but the last few.
/// Ends when the replica stops.
async fn take_snapshots(raft: Raft<ReplayApplier>, growth: Growth) {
    let mut at = 0;
    loop {
        tokio::time::sleep(SNAPSHOT_CHECK).await;
        let appended = growth.appended.load(Ordering::Relaxed);
        let last = growth.snapshot_bytes.load(Ordering::Relaxed);
        let due = (2 * growth.segment_bytes).max(2 * last);
        if appended.saturating_sub(at) < due {
            continue;
        }
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
        at = appended;
    }
}

/// Checks that `dir` was made for this node of this cluster, with this shard count;
/// writes the meta file where there is none.
fn check_meta(storage: &dyn Storage, dir: &Path, me: &Identity) -> io::Result<()> {
    leasemq_wal::create_dir_durable(storage, dir)?;
    let want = format!(
        "{META_FORMAT}\ncluster {}\nnode {}\nshards {}\n",
        me.cluster, me.node, me.shards
    );
    match leasemq_wal::latest_snapshot(storage, &dir.join("meta")) {
        Ok(Some(found)) => {
            let found = String::from_utf8_lossy(&found.data).into_owned();
            if found == want {
                return Ok(());
            }
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} was made for another node: it says {:?}, this node is {:?}",
                    dir.display(),
                    found.trim_end(),
                    want.trim_end()
                ),
            ))
        }
        Ok(None) => {
            let meta = dir.join("meta");
            leasemq_wal::create_dir_durable(storage, &meta)?;
            leasemq_wal::write_snapshot(storage, &meta, leasemq_wal::Lsn(1), want.as_bytes())
                .map_err(|e| invalid(e.to_string()))?;
            Ok(())
        }
        Err(e) => Err(invalid(e.to_string())),
    }
}
