//! A broker as one node of a cluster (contract §9): every shard is a Raft group whose
//! replicas are the nodes, and the node that leads a shard's group runs its engine.
//!
//! What the shard threads use of it lives here: each shard's [`Replica`] (its group, the
//! group's copy of the shard, and a view of who leads), and a leader's [`Proposing`], the
//! shard log's backend in a cluster, which proposes each turn's changes to the group where
//! a single broker appends them to its write-ahead log. What waits on a batch is let out
//! once the group committed it, as a single broker lets it out after the fsync. The
//! shard thread's roles (follow, lead, stand down) are in `runtime.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasemq_engine::Error;
use leasemq_replica::openraft::async_runtime::WatchReceiver;
use leasemq_replica::openraft::ServerState;
use leasemq_replica::{Batch, Outcome, Proposer, Raft, ReplayApplier};

use crate::wait::Sleeper;

pub use leasemq_replica::{ClusterStatus, PeerStatus, ShardStatus};

/// How long a call waits for its shard's leader by default (contract §9 Cluster).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node waits to hear from a shard's leader before it stands for election,
/// by default: drawn between this and twice this.
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_secs(1);
/// The most nodes a cluster has: every node is a voter of every shard's group.
pub const MAX_NODES: usize = 7;

/// What makes a broker a node of a cluster: given to
/// [`BrokerBuilder::cluster`](crate::BrokerBuilder::cluster).
///
/// ```no_run
/// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
/// use leasemq::{Broker, Cluster};
///
/// let cluster = Cluster::new("orders", 1)
///     .listen("10.0.0.1:5679")
///     .peer(1, "10.0.0.1:5679")
///     .peer(2, "10.0.0.2:5679")
///     .peer(3, "10.0.0.3:5679")
///     .secret(std::fs::read("/etc/leasemq/cluster-secret")?);
/// let broker = Broker::builder().data_dir("/var/lib/leasemq").shards(8).cluster(cluster).build()?;
/// broker.cluster().unwrap().init()?; // once per cluster, on one node
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Cluster {
    pub(crate) name: String,
    pub(crate) id: u64,
    pub(crate) listen: Option<String>,
    pub(crate) advertise: Option<String>,
    pub(crate) peers: BTreeMap<u64, String>,
    pub(crate) call_timeout: Duration,
    pub(crate) election_timeout: Duration,
    pub(crate) secret: Vec<u8>,
    pub(crate) tls: Option<leasemq_replica::LinkTls>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("peers", &self.peers)
            .field("call_timeout", &self.call_timeout)
            .field("election_timeout", &self.election_timeout)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Node `id` (1 or more) of the cluster called `name`.
    pub fn new(name: impl Into<String>, id: u64) -> Cluster {
        Cluster {
            name: name.into(),
            id,
            listen: None,
            advertise: None,
            peers: BTreeMap::new(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            election_timeout: DEFAULT_ELECTION_TIMEOUT,
            secret: Vec::new(),
            tls: None,
        }
    }

    /// Runs the node link over TLS: this node serves and dials with `tls`'s certificate,
    /// and each side verifies the other's.
    pub fn tls(mut self, tls: leasemq_replica::LinkTls) -> Cluster {
        self.tls = Some(tls);
        self
    }

    /// Where this node serves the node link (Raft and forwarded calls), as `host:port`.
    pub fn listen(mut self, addr: impl Into<String>) -> Cluster {
        self.listen = Some(addr.into());
        self
    }

    /// The address the other nodes dial for this one, where it differs from the listen
    /// address (behind NAT, or listening on `0.0.0.0`); it must be this node's
    /// [`peer`](Cluster::peer) entry.
    pub fn advertise(mut self, addr: impl Into<String>) -> Cluster {
        self.advertise = Some(addr.into());
        self
    }

    /// A voter of the cluster, this node included: its id and the address it is dialled at.
    pub fn peer(mut self, id: u64, addr: impl Into<String>) -> Cluster {
        self.peers.insert(id, addr.into());
        self
    }

    /// How long a call waits for its shard's leader, and for the commit of what it changed,
    /// before it answers [`Error::Unavailable`]; 10 s by default.
    pub fn call_timeout(mut self, timeout: Duration) -> Cluster {
        self.call_timeout = timeout;
        self
    }

    /// How long a node waits to hear from a shard's leader before it stands for election
    /// (drawn up to twice this); 1 s by default.
    pub fn election_timeout(mut self, timeout: Duration) -> Cluster {
        self.election_timeout = timeout;
        self
    }

    /// The secret every node of the cluster knows, as RabbitMQ's Erlang cookie: nodes prove
    /// they know it when they connect, and it never crosses the wire.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Cluster {
        self.secret = secret.into();
        self
    }

    /// The settings `build` refuses.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let invalid = |why: String| Err(Error::InvalidConfig(format!("cluster: {why}")));
        let name_ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
        if self.name.is_empty() || self.name.len() > 255 || !self.name.chars().all(name_ok) {
            return invalid(format!(
                "the name must be 1 to 255 bytes of A-Z a-z 0-9 . _ -, got {:?}",
                self.name
            ));
        }
        if self.id == 0 {
            return invalid("node ids start at 1".into());
        }
        if self.listen.is_none() {
            return invalid(
                "listen(addr) is required: where this node serves the node link".into(),
            );
        }
        let Some(own) = self.peers.get(&self.id) else {
            return invalid(format!(
                "node {} is not among its peers; add peer({}, addr) for it too",
                self.id, self.id
            ));
        };
        if let Some(advertise) = &self.advertise {
            if advertise != own {
                return invalid(format!(
                    "this node advertises {advertise} but its peer entry says {own}"
                ));
            }
        }
        if self.peers.len() > MAX_NODES {
            return invalid(format!(
                "at most {MAX_NODES} nodes, got {}",
                self.peers.len()
            ));
        }
        if self.secret.is_empty() {
            return invalid("secret(..) is required: every node proves it knows it".into());
        }
        let ms = Duration::from_millis(1);
        if !(10 * ms..=Duration::from_secs(60)).contains(&self.election_timeout) {
            return invalid(format!(
                "election_timeout must be from 10 ms to 60 s, got {:?}",
                self.election_timeout
            ));
        }
        if !(ms..=Duration::from_secs(3600)).contains(&self.call_timeout) {
            return invalid(format!(
                "call_timeout must be from 1 ms to 1 hour, got {:?}",
                self.call_timeout
            ));
        }
        Ok(())
    }
}

/// This broker as a node of its cluster: from [`Broker::cluster`](crate::Broker::cluster).
#[derive(Clone)]
pub struct ClusterHandle {
    pub(crate) inner: Arc<ClusterInner>,
}

impl std::fmt::Debug for ClusterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHandle")
            .field("node_id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

impl ClusterHandle {
    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.id
    }

    /// Forms the cluster: every peer becomes a voter of every shard's group. Called once,
    /// on any one node; on a cluster already formed it does nothing and returns `Ok`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after the broker's shutdown; [`Error::Unavailable`] when a
    /// group refuses.
    pub fn init(&self) -> Result<(), Error> {
        let node = self.inner.node.lock().unwrap_or_else(|e| e.into_inner());
        let node = node.as_ref().ok_or(Error::ShutDown)?;
        node.init()
            .map_err(|e| Error::Unavailable(format!("forming the cluster: {e}")))
    }

    /// Where the cluster stands, as this node sees it: per shard its leader, term, voters,
    /// committed and applied index; per peer whether it is reachable. After the broker's
    /// shutdown the node has no shards or peers left to report.
    pub fn status(&self) -> ClusterStatus {
        let node = self.inner.node.lock().unwrap_or_else(|e| e.into_inner());
        match node.as_ref() {
            Some(node) => node.status(),
            None => ClusterStatus {
                node: self.inner.id,
                shards: Vec::new(),
                peers: Vec::new(),
            },
        }
    }
}

/// The node behind a cluster broker's handles.
pub(crate) struct ClusterInner {
    pub id: u64,
    /// Taken at shutdown, after the shard threads stopped.
    pub node: Mutex<Option<leasemq_replica::Node>>,
    /// Each shard's replica here, which knows the shard's leader.
    pub replicas: Vec<Arc<Replica>>,
    /// The node link, for calls forwarded to a shard's leader.
    pub link: leasemq_replica::link::Link<ReplayApplier>,
    /// Each peer's queue of forwarded calls (`forward::dispatch`).
    pub outgoing: std::collections::HashMap<u64, tokio::sync::mpsc::UnboundedSender<Outgoing>>,
    /// The node's runtime, which forwarded calls run on.
    pub runtime: tokio::runtime::Handle,
    pub call_timeout: Duration,
    /// This node's consumers of queues that another node leads.
    pub streams: Arc<crate::remote::Streams>,
}

impl ClusterInner {
    /// Stops the node's groups and its link.
    pub fn shutdown(&self) {
        let node = self.node.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(node) = node {
            node.shutdown();
        }
    }
}

/// A call forwarded to a peer, on its way to the link's queue of frames.
pub(crate) struct Outgoing {
    pub shard: u16,
    pub bytes: Vec<u8>,
    pub answer: tokio::sync::oneshot::Sender<Result<Vec<u8>, leasemq_replica::link::ForwardError>>,
}

/// One shard's replica as its shard thread sees it.
pub(crate) struct Replica {
    pub shard: u16,
    pub node: u64,
    pub raft: Raft<ReplayApplier>,
    /// The group's copy of the shard, which a new leader's engine starts from.
    pub replay: ReplayApplier,
    pub runtime: tokio::runtime::Handle,
    pub call_timeout: Duration,
    /// Moves whenever the role view may have changed; the thread looks again then.
    version: AtomicU64,
    /// Set while the thread waits for its group to settle: every change of the group's
    /// metrics wakes it then, not only a change of leader.
    wants_every_change: AtomicBool,
    /// The node that leads the shard as this replica last heard; 0 for none.
    leader: AtomicU64,
}

/// Who leads a shard, as its thread acts on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoleView {
    pub leader: Option<u64>,
    pub term: u64,
    /// This node leads, and its group applied the leader's first entry of the term: its
    /// copy of the shard holds everything any earlier leader committed.
    pub ready: bool,
    /// The group applied every entry in its log.
    pub settled: bool,
}

impl Replica {
    /// Shard `shard`'s replica on node `node`: its thread (`sleeper`) is woken whenever
    /// the shard's leader changes.
    /// The consumers here whose queue another node leads end when it stops leading
    /// (`streams`).
    pub fn start(
        (shard, node): (u16, u64),
        (raft, replay): (Raft<ReplayApplier>, ReplayApplier),
        runtime: tokio::runtime::Handle,
        call_timeout: Duration,
        (sleeper, streams): (Arc<Sleeper>, Arc<crate::remote::Streams>),
    ) -> Arc<Replica> {
        let replica = Arc::new(Replica {
            shard,
            node,
            raft,
            replay,
            runtime,
            call_timeout,
            version: AtomicU64::new(1),
            wants_every_change: AtomicBool::new(false),
            leader: AtomicU64::new(0),
        });
        replica
            .runtime
            .spawn(watch(Arc::downgrade(&replica), sleeper, streams));
        replica
    }

    /// The role view now.
    pub fn view(&self) -> RoleView {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let leading = m.state == ServerState::Leader && m.current_leader == Some(self.node);
        let applied = m.last_applied;
        RoleView {
            leader: m.current_leader,
            term: m.current_term,
            ready: leading && applied.is_some_and(|a| a.leader_id.term == m.current_term),
            settled: applied.map(|a| a.index) >= m.last_log_index,
        }
    }

    /// The node that leads the shard, as this replica last heard.
    pub fn leader(&self) -> Option<u64> {
        Some(self.leader.load(Ordering::Acquire)).filter(|&node| node != 0)
    }

    /// A number that moves whenever [`view`](Replica::view) may have changed.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Has every change of the group wake the thread, or only a change of leader.
    pub fn want_every_change(&self, want: bool) {
        self.wants_every_change.store(want, Ordering::Release);
    }
}

/// Wakes the shard thread when the view of its role may have changed. Ends when the
/// group stops or the replica is dropped.
async fn watch(
    replica: std::sync::Weak<Replica>,
    sleeper: Arc<Sleeper>,
    streams: Arc<crate::remote::Streams>,
) {
    let Some(mut metrics) = replica.upgrade().map(|r| r.raft.metrics()) else {
        return;
    };
    let mut last = None;
    loop {
        let Some(replica) = replica.upgrade() else {
            return;
        };
        let view = replica.view();
        let leader = (view.leader, view.term, view.ready);
        if last != Some(leader) || replica.wants_every_change.load(Ordering::Acquire) {
            last = Some(leader);
            let before = (replica.leader).swap(view.leader.unwrap_or(0), Ordering::AcqRel);
            if before != view.leader.unwrap_or(0) {
                streams.leader_changed(replica.shard, view.leader);
            }
            replica.version.fetch_add(1, Ordering::AcqRel);
            sleeper.wake();
        }
        drop(replica);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// What became of a leader's proposals, as its proposer reports them.
#[derive(Default)]
pub(crate) struct Outcomes {
    /// Every batch up to this one is committed.
    committed: AtomicU64,
    /// Every batch up to this one has its outcome.
    resolved: AtomicU64,
    /// A batch's outcome is unknown: the chain is broken.
    unknown: AtomicBool,
}

/// A leading shard's log: each record of its turns becomes a batch of its chain,
/// proposed to the group.
pub(crate) struct Proposing {
    proposer: Proposer,
    term: u64,
    inc: u32,
    next: u64,
    outcomes: Arc<Outcomes>,
    /// Batches not yet known committed, and when each was proposed.
    open: VecDeque<(u64, Instant)>,
    call_timeout: Duration,
    shard: u16,
}

impl Proposing {
    /// Starts chain `inc` of this node's lead of `replica`'s group in `term`; `sleeper` is
    /// woken at every outcome.
    pub fn start(replica: &Replica, term: u64, inc: u32, sleeper: Arc<Sleeper>) -> Proposing {
        let outcomes = Arc::new(Outcomes::default());
        let report = {
            let outcomes = outcomes.clone();
            move |outcome| {
                match outcome {
                    Outcome::Committed { p, .. } => {
                        outcomes.committed.store(p, Ordering::Release);
                        outcomes.resolved.store(p, Ordering::Release);
                    }
                    Outcome::Unknown { p } => {
                        outcomes.unknown.store(true, Ordering::Release);
                        outcomes.resolved.store(p, Ordering::Release);
                    }
                }
                sleeper.wake();
            }
        };
        let proposer = Proposer::start(
            replica.raft.clone(),
            (term, replica.node),
            report,
            &replica.runtime,
        );
        Proposing {
            proposer,
            term,
            inc,
            next: 1,
            outcomes,
            open: VecDeque::new(),
            call_timeout: replica.call_timeout,
            shard: replica.shard,
        }
    }

    /// Proposes `changes` as the chain's next batch; returns its number.
    pub fn propose(&mut self, changes: &[u8]) -> Result<u64, Error> {
        let p = self.next;
        let batch = Batch {
            inc: self.inc,
            p,
            changes: changes.to_vec(),
        };
        if !self.proposer.propose(batch) {
            return Err(self.lost("its replica stopped"));
        }
        self.next += 1;
        self.open.push_back((p, Instant::now()));
        Ok(p)
    }

    /// The last batch proposed.
    pub fn last_proposed(&self) -> u64 {
        self.next - 1
    }

    /// The last batch up to which every one is committed.
    pub fn committed(&self) -> u64 {
        self.outcomes.committed.load(Ordering::Acquire)
    }

    /// `Err` once the chain broke, or a batch waited longer than the call timeout for
    /// its commit: the leader then stands down.
    pub fn check(&mut self, now: Instant) -> Result<(), Error> {
        if self.outcomes.unknown.load(Ordering::Acquire) {
            return Err(self.lost("the group did not commit a change it proposed"));
        }
        let committed = self.committed();
        while self.open.front().is_some_and(|&(p, _)| p <= committed) {
            self.open.pop_front();
        }
        match self.open.front() {
            Some(&(_, at)) if now.duration_since(at) >= self.call_timeout => {
                Err(self.lost(&format!(
                    "no majority committed its changes in {:?}",
                    self.call_timeout
                )))
            }
            _ => Ok(()),
        }
    }

    /// When [`check`](Proposing::check) fails unless a commit comes first.
    pub fn deadline(&self) -> Option<Instant> {
        let committed = self.committed();
        (self.open.iter())
            .find(|&&(p, _)| p > committed)
            .map(|&(_, at)| at + self.call_timeout)
    }

    /// What a new chain must wait for, once this one stopped.
    pub fn ending(&self) -> Ending {
        Ending {
            term: self.term,
            last: self.last_proposed(),
            outcomes: self.outcomes.clone(),
        }
    }

    fn lost(&self, why: &str) -> Error {
        Error::Unavailable(format!(
            "this node's lead of shard {} ended ({why})",
            self.shard
        ))
    }
}

/// A chain that stopped while its node may still lead: before the node starts a new one,
/// every batch of this one has its outcome, and the group applied all it will ever
/// apply of it.
pub(crate) struct Ending {
    pub term: u64,
    last: u64,
    outcomes: Arc<Outcomes>,
}

impl Ending {
    /// Whether every batch of the chain has its outcome.
    pub fn resolved(&self) -> bool {
        self.outcomes.resolved.load(Ordering::Acquire) >= self.last
    }
}
