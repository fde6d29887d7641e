//! The broker handle: builds the shards, routes declares, moves the manual clock, shuts down.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasemq_engine::{validate, Command, Effects, Error, QueueConfig, QueueStats, Shard};

use crate::cluster::{Cluster, ClusterHandle, ClusterInner, Replica};
use crate::inner::BrokerInner;
use crate::protocol::{Answer, Inbox, ReplyTo, Request};
use crate::queue::Queue;
use crate::reply::{call, fan_in};
use crate::router::shard_for;
use crate::runtime::{new_engine, ShardThread, Steering, TimeSource};
use crate::slice::BusySlice;
use crate::store::{DataDir, ShardLog, SyncPolicy};
use crate::turns::{CallerTurns, TurnStats, Turns};
use crate::wait::{Sleeper, YieldBudget};
use crate::LogLag;

/// Builds a [`Broker`]: how many shards, which clock, how long a tick. Start with
/// [`Broker::builder`].
///
/// ```
/// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
/// use leasemq::Broker;
///
/// let broker = Broker::builder().shards(2).manual_clock().build()?;
/// assert_eq!(broker.shard_count(), 2);
/// broker.shutdown();
/// # Ok::<(), leasemq::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct BrokerBuilder {
    shards: Option<usize>,
    manual_clock: bool,
    tick: Duration,
    on_shard_start: Option<ShardSetup>,
    shard_time_slice: Option<Duration>,
    yield_budget: Duration,
    caller_turns: CallerTurns,
    data_dir: Option<std::path::PathBuf>,
    sync: SyncPolicy,
    log_segment_bytes: u64,
    storage: Option<Arc<dyn leasemq_wal::Storage>>,
    cluster: Option<Cluster>,
}

impl Default for BrokerBuilder {
    fn default() -> Self {
        BrokerBuilder {
            shards: None,
            manual_clock: false,
            tick: Duration::from_millis(1),
            on_shard_start: None,
            shard_time_slice: Some(DEFAULT_SHARD_TIME_SLICE),
            yield_budget: DEFAULT_YIELD_BUDGET,
            caller_turns: CallerTurns::default(),
            data_dir: None,
            sync: SyncPolicy::Always,
            log_segment_bytes: crate::store::DEFAULT_LOG_SEGMENT_BYTES,
            storage: None,
            cluster: None,
        }
    }
}

/// What [`BrokerBuilder::on_shard_start`] runs on each shard thread.
#[derive(Clone)]
struct ShardSetup(Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for ShardSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardSetup(..)")
    }
}

/// How long a waiting thread yields before it parks unless told otherwise (see
/// [`BrokerBuilder::yield_budget`]).
pub const DEFAULT_YIELD_BUDGET: Duration = crate::wait::YIELD_BUDGET;

/// The longest [`BrokerBuilder::yield_budget`] takes: past a few milliseconds a thread
/// that yields is a thread that spins.
pub const MAX_YIELD_BUDGET: Duration = Duration::from_millis(10);

/// The scheduler time slice a shard thread asks for unless told otherwise: the shortest
/// the kernel grants (see [`BrokerBuilder::shard_time_slice`]).
pub const DEFAULT_SHARD_TIME_SLICE: Duration = crate::slice::MIN_TIME_SLICE;

/// The longest shard slice with which a woken shard still preempts busy threads at once,
/// so that callers waiting on a busy host need not spin longer (see `wait.rs`).
const FAST_WAKE_SLICE: Duration = Duration::from_millis(1);

/// The most shards a broker may run.
pub const MAX_SHARDS: usize = 1024;

impl BrokerBuilder {
    /// How many shard threads, from 1 to [`MAX_SHARDS`] (default: the available
    /// parallelism). A queue lives on the shard [`shard_for`] maps its name to.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Time moves only when [`Broker::advance`] says so: for tests and simulations, which
    /// then repeat exactly (contract §2 G6, §4 Clocks).
    pub fn manual_clock(mut self) -> Self {
        self.manual_clock = true;
        self
    }

    /// The length of one tick, the unit deadlines are rounded up to (default 1 ms; from
    /// 1 µs to 1 s; contract §4 Ticks).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Runs `setup` on each shard thread as it starts, with the shard's index, before the
    /// thread serves anything; [`build`](Self::build) returns once every shard has run it.
    /// The place for what only the thread itself can ask of the operating system: pinning
    /// it to a core, a priority, or (Linux 6.12 and later) a shorter scheduler time slice,
    /// so that on a host whose other threads keep the cores busy a woken shard preempts
    /// them sooner instead of waiting out their slices.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let started = Arc::new(AtomicUsize::new(0));
    /// let seen = started.clone();
    /// let broker = leasemq::Broker::builder()
    ///     .shards(3)
    ///     .on_shard_start(move |_shard| {
    ///         seen.fetch_add(1, Ordering::SeqCst);
    ///     })
    ///     .build()?;
    /// assert_eq!(started.load(Ordering::SeqCst), 3);
    /// broker.shutdown();
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn on_shard_start(mut self, setup: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.on_shard_start = Some(ShardSetup(Arc::new(setup)));
        self
    }

    /// The scheduler time slice each shard thread runs while other threads keep the host
    /// busy (default [`DEFAULT_SHARD_TIME_SLICE`], 100 µs; `None` leaves every shard the
    /// slice a new thread inherits from the one that calls `build`, the system's unless
    /// that thread changed it). A shard thread asks for it as it starts, before
    /// [`on_shard_start`](Self::on_shard_start) runs, and from its first wait on runs it
    /// only while the broker counts the host as busy ([`host_load`](crate::host_load)),
    /// the slice it started with otherwise. A shard thread sleeps until a caller needs it
    /// and then works briefly; beside busy threads a short slice lets it preempt them when
    /// woken instead of waiting out a slice of theirs, which is what each hand-off would
    /// otherwise cost. Its share of the CPU is unchanged. On a host whose cores only the
    /// broker's threads want, they yield to each other instead of parking, and there a
    /// short slice would cost: each yield pushes the yielder back by one of its own
    /// slices, so a shard with a short one is picked again and again to find its inbox
    /// empty. Linux 6.12 and later honour it (see
    /// [`set_thread_time_slice`](crate::set_thread_time_slice)); elsewhere, or when the
    /// system refuses, the shard runs with the system's slice.
    ///
    /// [`build`](Self::build) gives [`Error::InvalidConfig`] for a slice outside
    /// [`MIN_TIME_SLICE`](crate::MIN_TIME_SLICE) ..= [`MAX_TIME_SLICE`](crate::MAX_TIME_SLICE).
    pub fn shard_time_slice(mut self, slice: Option<Duration>) -> Self {
        self.shard_time_slice = slice;
        self
    }

    /// How long a thread that waits on this broker may yield its core, between looks at
    /// what it waits for, before it parks (default [`DEFAULT_YIELD_BUDGET`], 500 µs; zero:
    /// no yields, it parks after a brief spin). That is a shard thread waiting for
    /// requests, and a caller of a blocking call waiting for its answer or for a delivery.
    /// No yield is made while the broker counts the host as busy (threads that do not wait
    /// on it, the service's own or another process's, keep its cores busy; see
    /// [`host_load`](crate::host_load)), where each would give a time slice away.
    ///
    /// Threads that call the broker and wait for it (the per-message API from many
    /// threads, or the `_async` calls from a runtime's tasks) do best with the default:
    /// on a machine with more such threads than cores, a yield hands the core straight to
    /// one of them, and the next request finds the shard awake without a futex call on
    /// either side. A server whose connection tasks make blocking calls from its
    /// runtime's workers, beside clients on the same cores, does better with a few
    /// microseconds (leasemqd uses 20 µs): a longer run of yields, by the shard and by
    /// the waiting worker, takes cores the other workers and the clients need. The load
    /// generator's `--yield-budget` measures the difference.
    ///
    /// [`build`](Self::build) gives [`Error::InvalidConfig`] for a budget over
    /// [`MAX_YIELD_BUDGET`].
    pub fn yield_budget(mut self, budget: Duration) -> Self {
        self.yield_budget = budget;
        self
    }

    /// When a blocking caller may handle a shard's requests on its own thread, instead of
    /// waking the shard thread and waiting to be woken by it (default
    /// [`CallerTurns::WhenBusy`]). Only while the shard thread sleeps, and only on a
    /// broker without a data dir under the system clock: the turn is the one the thread
    /// would run, on the same state, one at a time, in the order the requests were sent.
    ///
    /// Each hand-off between two sleeping threads costs a futex call on each side and a
    /// context switch, and beside CPU-bound threads a preemption too; a per-message put
    /// and its ack were three or more of them. On an idle host with more of the broker's
    /// threads than cores, the waits yield to each other instead, which costs no system
    /// call, and there a caller's turn would only make callers queue for the shard's
    /// state. The load generator's `--caller-turns` measures the difference.
    pub fn caller_turns(mut self, when: CallerTurns) -> Self {
        self.caller_turns = when;
        self
    }

    /// Where durable queues keep their logs (contract §7): each shard writes its own log
    /// under this directory, and [`build`](Self::build) replays them, so every durable
    /// queue is back before it returns. One broker at a time may have a data dir open. A
    /// data dir remembers its shard count: built without [`shards`](Self::shards), the
    /// broker takes that count.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
    ///
    /// let dir = std::env::temp_dir().join(format!("leasemq-doc-{}", std::process::id()));
    /// let durable = QueueConfig { durable: true, ..QueueConfig::default() };
    /// let broker = Broker::builder().shards(2).data_dir(&dir).build()?;
    /// let jobs = broker.declare_queue("jobs", durable.clone())?;
    /// jobs.put(Message::new("resize photo 17"))?; // answered once it is on disk
    /// broker.shutdown();
    ///
    /// let broker = Broker::builder().data_dir(&dir).build()?; // two shards, as before
    /// let jobs = broker.queue("jobs").expect("a durable queue is back");
    /// let worker = jobs.consume("worker", ConsumerConfig::default())?;
    /// assert_eq!(&worker.try_recv()?.unwrap().envelope().body[..], b"resize photo 17");
    /// broker.shutdown();
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn data_dir(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.data_dir = Some(path.into());
        self
    }

    /// Where the data dir's files live: the file system by default. Tests give a
    /// [`leasemq_wal::MemDisk`] here, to crash the disk at any moment or make it fail.
    pub fn storage(mut self, storage: Arc<dyn leasemq_wal::Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// When durable queues' records reach the disk (default [`SyncPolicy::Always`]: before
    /// anything they caused leaves the shard).
    pub fn sync(mut self, policy: SyncPolicy) -> Self {
        self.sync = policy;
        self
    }

    /// The size of each segment file of a shard's log (default
    /// [`DEFAULT_LOG_SEGMENT_BYTES`](crate::DEFAULT_LOG_SEGMENT_BYTES), 8 MiB). A shard
    /// writes a snapshot once its log has grown by two segments since the last one (or by
    /// twice the last snapshot's size), and then recycles the segments it covers; so a
    /// data dir holds, beside the snapshots, a few segments per shard. Smaller segments
    /// take less disk and write snapshots more often. A log written with another size
    /// opens as it is.
    ///
    /// [`build`](Self::build) gives [`Error::InvalidConfig`] for a size that is not a
    /// multiple of 8 from [`MIN_LOG_SEGMENT_BYTES`](crate::MIN_LOG_SEGMENT_BYTES) (1 MiB)
    /// to [`MAX_LOG_SEGMENT_BYTES`](crate::MAX_LOG_SEGMENT_BYTES) (1 GiB).
    pub fn log_segment_bytes(mut self, bytes: u64) -> Self {
        self.log_segment_bytes = bytes;
        self
    }

    /// Makes the broker a node of a cluster (contract §9): every queue is replicated to
    /// the cluster's nodes, and its changes are answered once a majority of them holds
    /// them on disk. Needs [`data_dir`](Self::data_dir); refuses
    /// [`manual_clock`](Self::manual_clock) and [`SyncPolicy::Interval`]. `build` starts
    /// the node; a new cluster serves nothing until [`ClusterHandle::init`] has been called
    /// once, on any one node.
    pub fn cluster(mut self, cluster: Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Starts the shard threads, after replaying the data dir's logs if there is one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `shards` is 0 or over [`MAX_SHARDS`] or differs from
    /// the data dir's, when `tick` is under 1 µs or over 1 s, when `shard_time_slice` is
    /// outside 100 µs ..= 100 ms, when a `sync` interval is zero, when the system refuses to start a thread, or when the
    /// [`on_shard_start`](Self::on_shard_start) setup panics (the broker is shut down
    /// again first). [`Error::Storage`] when the data dir is locked by another broker,
    /// cannot be read or written, or holds a damaged record (naming file and offset).
    /// For a [`cluster`](Self::cluster)'s node, also [`Error::InvalidConfig`] for its
    /// settings, for a data dir made for another node or for a single broker (naming
    /// both), and when the node link cannot listen.
    pub fn build(self) -> Result<Broker, Error> {
        if let Some(cluster) = &self.cluster {
            cluster.check()?;
            if self.data_dir.is_none() {
                return Err(Error::InvalidConfig(
                    "cluster: a node needs a data dir (BrokerBuilder::data_dir)".into(),
                ));
            }
            if self.manual_clock {
                return Err(Error::InvalidConfig(
                    "cluster: a node runs on the system clock, not manual_clock()".into(),
                ));
            }
            if self.sync != SyncPolicy::Always {
                return Err(Error::InvalidConfig(
                    "cluster: a node answers once a majority fsynced, so sync must be \
                     SyncPolicy::Always"
                        .into(),
                ));
            }
        }
        let default_shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let SyncPolicy::Interval(d) = self.sync {
            if d.is_zero() || d > leasemq_engine::MAX_DURATION {
                return Err(Error::InvalidConfig(format!(
                    "sync: the interval must be from 1 ns to 7 days, got {d:?}"
                )));
            }
        }
        let segment = self.log_segment_bytes;
        let sizes = crate::store::MIN_LOG_SEGMENT_BYTES..=crate::store::MAX_LOG_SEGMENT_BYTES;
        if !segment.is_multiple_of(8) || !sizes.contains(&segment) {
            return Err(Error::InvalidConfig(format!(
                "log_segment_bytes must be a multiple of 8 from 1 MiB to 1 GiB, got {segment}"
            )));
        }
        let data_dir = match &self.data_dir {
            Some(path) => {
                if let Some(n) = self.shards {
                    check_shards(n)?;
                }
                let storage = self
                    .storage
                    .clone()
                    .unwrap_or_else(|| Arc::new(leasemq_wal::DiskStorage));
                let node = (self.cluster.as_ref()).map(|c| (c.name.as_str(), c.id));
                Some(DataDir::open(
                    &storage,
                    path,
                    self.shards,
                    default_shards,
                    node,
                )?)
            }
            None => None,
        };
        let shards = match &data_dir {
            Some(dir) => dir.shards,
            None => self.shards.unwrap_or(default_shards),
        };
        check_shards(shards)?;
        self.start(shards, data_dir)
    }

    /// The settings `build` refuses.
    fn check(&self) -> Result<(), Error> {
        if self.yield_budget > MAX_YIELD_BUDGET {
            return Err(Error::InvalidConfig(format!(
                "yield_budget must be at most 10 ms, got {:?}",
                self.yield_budget
            )));
        }
        if let Some(slice) = self.shard_time_slice {
            if !(crate::MIN_TIME_SLICE..=crate::MAX_TIME_SLICE).contains(&slice) {
                return Err(Error::InvalidConfig(format!(
                    "shard_time_slice must be from 100 µs to 100 ms, got {slice:?}"
                )));
            }
        }
        if self.tick < Duration::from_micros(1) || self.tick > Duration::from_secs(1) {
            return Err(Error::InvalidConfig(format!(
                "tick must be from 1 µs to 1 s, got {:?}",
                self.tick
            )));
        }
        Ok(())
    }

    /// Each shard's engine, restored from the data dir if there is one, with its log and
    /// what the restore left to route, ready to serve: the log's time set, and broker ids
    /// reserved past any that another shard's log holds.
    fn engines(
        &self,
        data_dir: Option<&DataDir>,
        time: &TimeSource,
        sleepers: &[Arc<Sleeper>],
    ) -> Result<Vec<(Shard, Option<ShardLog>, Effects)>, Error> {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let log = (self.sync, self.log_segment_bytes);
        // A node's shards start idle: each is built from its group's copy when the node
        // takes the lead.
        let data_dir = data_dir.filter(|_| self.cluster.is_none());
        let engines = restore(data_dir, log, sleepers, |index| {
            new_engine(index, time, self.tick)
        })?;
        // Log time at tick 0: the wall clock, or the manual clock where the logs left off.
        let epoch = match time {
            TimeSource::System(_) => wall,
            TimeSource::Manual => engines
                .iter()
                .filter_map(|(engine, _)| engine.restored_clock())
                .max()
                .unwrap_or(0),
        };
        // A dead letter keeps its broker id: a shard's ids may be in another's log.
        let mut auto_ids = vec![0u64; sleepers.len()];
        for (engine, _) in &engines {
            for (shard, seq) in engine.restored_auto_ids() {
                if let Some(max) = auto_ids.get_mut(usize::from(shard)) {
                    *max = (*max).max(seq);
                }
            }
        }
        Ok(engines
            .into_iter()
            .zip(auto_ids)
            .map(|((mut engine, log), ids)| {
                engine.reserve_auto_ids(ids);
                engine.set_log_epoch(epoch);
                let mut out = Effects::new();
                engine.finish_restore(&mut out);
                (engine, log, out)
            })
            .collect())
    }

    fn start(self, shards: usize, data_dir: Option<DataDir>) -> Result<Broker, Error> {
        self.check()?;
        let time = if self.manual_clock {
            TimeSource::Manual
        } else {
            TimeSource::System(Instant::now())
        };
        let (turns, senders, receivers) = self.inboxes(shards);
        let sleepers: Vec<Arc<Sleeper>> = receivers.iter().map(|(_, s)| s.clone()).collect();
        let engines = self.engines(data_dir.as_ref(), &time, &sleepers)?;
        let probes = (engines.iter())
            .filter_map(|(_, log, _)| log.as_ref().and_then(ShardLog::probe))
            .collect();
        let mut engines = engines.into_iter();
        let (cluster, mut replicas) = self.start_node(data_dir.as_ref(), &sleepers)?;
        if let Some(cluster) = &cluster {
            cluster.serve_calls(senders.clone());
        }
        let mut threads = Vec::with_capacity(shards);
        // Each shard thread says whether its setup ran, before it serves anything.
        let (setup_done, setups) = crossbeam_channel::bounded::<bool>(shards);
        for (index, (inbox, sleeper)) in receivers.into_iter().enumerate() {
            let engine = engines.next().expect("one engine per shard");
            let shard = ShardThread::new(
                index,
                inbox.clone(),
                sleeper,
                senders.clone(),
                time.clone(),
                engine,
            );
            let replica = replicas.get_mut(index).and_then(Option::take);
            let shard = steered(shard, replica, cluster.as_ref(), &senders[index]);
            let start = ShardStart {
                index,
                setup: self.on_shard_start.clone(),
                slice: self.shard_time_slice,
                setup_done: setup_done.clone(),
                after_panic: inbox,
                own_inbox: senders[index].clone(),
                turns: turns[index].clone(),
                shard,
            };
            let thread = std::thread::Builder::new()
                .name(format!("leasemq-shard-{index}"))
                .spawn(move || start.run())
                .map_err(|e| Error::InvalidConfig(format!("cannot start a shard thread: {e}")))?;
            threads.push(thread);
        }
        drop(setup_done);
        let broker = Broker {
            inner: Arc::new(BrokerInner::new(
                senders,
                self.manual_clock,
                threads,
                data_dir,
                probes,
                cluster,
            )),
        };
        if !(0..shards).all(|_| setups.recv() == Ok(true)) {
            broker.shutdown();
            return Err(Error::InvalidConfig(
                "the on_shard_start setup panicked on a shard thread".into(),
            ));
        }
        if broker.inner.durable && broker.inner.cluster.is_none() {
            broker.settle_restore()?;
        }
        Ok(broker)
    }

    /// Each shard's turns (its thread's state, which blocking callers may run turns on)
    /// and inbox: the senders every handle shares, and what each thread reads and sleeps on.
    #[allow(clippy::type_complexity)]
    fn inboxes(
        &self,
        shards: usize,
    ) -> (
        Vec<Arc<Turns<ShardThread>>>,
        Vec<Inbox>,
        Vec<(crossbeam_channel::Receiver<Request>, Arc<Sleeper>)>,
    ) {
        let yields = YieldBudget(self.yield_budget);
        let turns: Vec<Arc<Turns<ShardThread>>> = (0..shards)
            .map(|_| Arc::new(Turns::new(self.caller_turns)))
            .collect();
        let (senders, receivers) = turns
            .iter()
            .map(|turns| {
                let (inbox, rx, sleeper) = Inbox::new(yields, turns.clone());
                (inbox, (rx, sleeper))
            })
            .unzip();
        (turns, senders, receivers)
    }

    /// For a cluster's node, starts the node in its data dir: the node link and every
    /// shard's group, each shard thread woken when its shard's leader changes. Gives the
    /// node and each shard's replica; nothing for a single broker.
    #[allow(clippy::type_complexity)]
    fn start_node(
        &self,
        dir: Option<&DataDir>,
        sleepers: &[Arc<Sleeper>],
    ) -> Result<(Option<Arc<ClusterInner>>, Vec<Option<Arc<Replica>>>), Error> {
        let (Some(cluster), Some(dir)) = (&self.cluster, dir) else {
            return Ok((None, Vec::new()));
        };
        let shards = u16::try_from(dir.shards).expect("at most MAX_SHARDS");
        let identity = leasemq_replica::Identity {
            cluster: cluster.name.clone(),
            node: cluster.id,
            shards,
            secret: cluster.secret.clone(),
            tls: cluster.tls.clone(),
        };
        let log = leasemq_wal::Options {
            segment_bytes: self.log_segment_bytes,
            // A batch of the largest record a shard writes, and the entry's header.
            max_record_bytes: crate::store::MAX_RECORD_BYTES + 4096,
            ..leasemq_wal::Options::default()
        };
        let config = leasemq_replica::NodeConfig {
            identity,
            listen: cluster.listen.clone().expect("checked"),
            peers: cluster.peers.clone(),
            election_timeout: cluster.election_timeout,
            dir: dir.path.clone(),
            storage: Arc::clone(&dir.storage),
            log,
            tick: self.tick,
        };
        let node = leasemq_replica::Node::start(config).map_err(|e| {
            let what = match e.kind() {
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::AddrInUse => {
                    Error::InvalidConfig
                }
                _ => Error::Storage,
            };
            what(format!("cluster: node {} cannot start: {e}", cluster.id))
        })?;
        let streams = Arc::new(crate::remote::Streams::default());
        node.runtime().spawn(crate::remote::end_unheard(
            Arc::downgrade(&streams),
            node.link().clone(),
            cluster.election_timeout,
        ));
        let replicas: Vec<Option<Arc<Replica>>> = (0..shards)
            .map(|shard| {
                let group = node.group(shard).expect("one group per shard").clone();
                let runtime = node.runtime().clone();
                let sleeper = sleepers[usize::from(shard)].clone();
                let (timeout, streams) = (cluster.call_timeout, Arc::clone(&streams));
                let at = (shard, cluster.id);
                Some(Replica::start(
                    at,
                    group,
                    runtime,
                    timeout,
                    (sleeper, streams),
                ))
            })
            .collect();
        let inner = ClusterInner {
            id: cluster.id,
            replicas: replicas.iter().flatten().cloned().collect(),
            link: node.link().clone(),
            runtime: node.runtime().clone(),
            call_timeout: cluster.call_timeout,
            outgoing: crate::forward::dispatchers(&node, cluster),
            streams,
            node: std::sync::Mutex::new(Some(node)),
        };
        Ok((Some(Arc::new(inner)), replicas))
    }
}

/// The shard thread `shard`, steered by its group in a cluster (where it has a `replica`).
fn steered(
    shard: ShardThread,
    replica: Option<Arc<Replica>>,
    cluster: Option<&Arc<ClusterInner>>,
    own_inbox: &Inbox,
) -> ShardThread {
    match (replica, cluster) {
        (Some(replica), Some(cluster)) => shard.in_cluster(Steering::new(
            replica,
            Arc::clone(cluster),
            own_inbox.clone(),
        )),
        _ => shard,
    }
}

/// What a shard thread starts with, and what it does until it ends.
struct ShardStart {
    index: usize,
    shard: ShardThread,
    turns: Arc<Turns<ShardThread>>,
    slice: Option<Duration>,
    setup: Option<ShardSetup>,
    /// Told whether the setup ran, before the shard serves anything.
    setup_done: crossbeam_channel::Sender<bool>,
    /// The shard's own inbox, read after a panic to drop what comes.
    after_panic: crossbeam_channel::Receiver<Request>,
    own_inbox: Inbox,
}

impl ShardStart {
    fn run(self) {
        let ShardStart {
            index,
            shard,
            turns,
            slice,
            setup,
            setup_done,
            after_panic,
            own_inbox,
        } = self;
        // Best effort: a system that refuses leaves the default slice, which is slower on
        // a busy host but correct.
        let busy_slice = slice.and_then(BusySlice::new);
        if busy_slice.is_some() && slice.is_some_and(|s| s <= FAST_WAKE_SLICE) {
            crate::wait::shards_run_short_slices();
        }
        let shard = shard.with_busy_slice(busy_slice);
        let ran = setup.is_none_or(|ShardSetup(setup)| {
            catch_unwind(AssertUnwindSafe(|| setup(index))).is_ok()
        });
        let _ = setup_done.send(ran);
        drop(setup_done);
        // A panic here is a broker bug, and it must not leave callers waiting for answers
        // that will never come: unwinding drops every request the shard held, and the
        // thread stays to drop each later one, until shutdown. A dropped request answers
        // `ShutDown`.
        if catch_unwind(AssertUnwindSafe(|| shard.run(&turns))).is_err() {
            // The state stays with the shard's turns: take it out, so that no caller runs
            // a turn on it and its channels close.
            drop(turns.take());
            for request in after_panic.iter() {
                if matches!(request, Request::Shutdown) {
                    break;
                }
            }
        }
        // Whatever is sent from now on is dropped by its sender.
        own_inbox.close();
    }
}

/// A running broker: a set of shard threads, each owning the queues that hash onto it.
///
/// Cheap to clone, `Send + Sync`; every clone drives the same shards. The shards stop at
/// [`shutdown`](Broker::shutdown), or when the last handle of any kind (broker, queue,
/// consumer, delivery) is dropped.
///
/// ```
/// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
/// use std::time::Duration;
/// use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};
///
/// let broker = Broker::builder().shards(2).manual_clock().build()?;
/// let config = QueueConfig { ack_timeout: Duration::from_secs(5), ..QueueConfig::default() };
/// let jobs = broker.declare_queue("jobs", config)?;
/// let worker = jobs.consume("worker", ConsumerConfig::default())?;
/// jobs.put(Message::new("resize photo 17"))?;
///
/// let first = worker.try_recv()?.expect("delivered before put returned");
/// broker.advance(Duration::from_secs(5))?; // the lease runs out
/// let again = worker.try_recv()?.expect("redelivered during advance");
/// assert_eq!(again.envelope().attempt, 2);
/// assert!(!first.ack() && again.ack());
/// broker.shutdown();
/// # Ok::<(), leasemq::Error>(())
/// ```
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerInner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("shards", &self.inner.shards.len())
            .field("manual_clock", &self.inner.manual)
            .field("shut_down", &self.inner.is_shut_down())
            .finish()
    }
}

impl Broker {
    /// After a restore: lets the messages it dead-lettered land before anyone can look,
    /// and notes each durable queue's dead-letter queue.
    fn settle_restore(&self) -> Result<(), Error> {
        while self.step_all(|reply| Request::Barrier { reply })? > 0 {}
        for name in self.queue_names() {
            if let Some(queue) = self.queue(&name) {
                self.note_dead_letter_queue(&queue);
            }
        }
        Ok(())
    }

    /// A builder with the defaults: one shard per core, the system clock, 1 ms ticks.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder::default()
    }

    /// A broker with the default settings: one shard per core, the system clock.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when the system refuses to start a shard thread.
    pub fn new() -> Result<Broker, Error> {
        Broker::builder().build()
    }

    /// How many shards this broker runs.
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// How many requests the shards handled on their own threads, and how many blocking
    /// callers handled for them while they slept (see
    /// [`BrokerBuilder::caller_turns`]), over all shards since the broker started.
    pub fn turn_stats(&self) -> TurnStats {
        self.inner
            .shards
            .iter()
            .map(|inbox| inbox.turns().stats())
            .fold(TurnStats::default(), |sum, one| TurnStats {
                shard_threads: sum.shard_threads + one.shard_threads,
                callers: sum.callers + one.callers,
            })
    }

    /// The shard that owns (or would own) the queue `name`.
    pub fn shard_of(&self, name: &str) -> usize {
        shard_for(name, self.inner.shards.len())
    }

    /// Declares a queue, or returns the existing one when its config is equal (contract §3
    /// `declare_queue`).
    ///
    /// # Errors
    ///
    /// Checked in this order, and a failed declare creates nothing:
    ///
    /// - [`Error::ShutDown`] after [`shutdown`](Broker::shutdown);
    /// - [`Error::InvalidName`] unless `name` is 1 to 255 bytes of `[A-Za-z0-9._:-]`;
    /// - [`Error::InvalidConfig`] for a config outside its limits (contract §3 Limits),
    ///   including a `dead_letter` naming this queue or not a valid queue name, and a queue
    ///   that is not durable under the name of a live durable queue's dead-letter queue;
    /// - [`Error::UnknownQueue`] when `dead_letter` names no live queue;
    /// - [`Error::ConfigMismatch`] when a live queue of that name has another config.
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, Error, QueueConfig};
    ///
    /// let broker = Broker::builder().manual_clock().build()?;
    /// let jobs = broker.declare_queue("jobs", QueueConfig::default())?;
    /// let again = broker.declare_queue("jobs", QueueConfig::default())?; // the same queue
    /// assert_eq!(again.name(), jobs.name());
    ///
    /// let other = QueueConfig { max_length: Some(10), ..QueueConfig::default() };
    /// assert_eq!(broker.declare_queue("jobs", other).unwrap_err(), Error::ConfigMismatch);
    /// let refused = broker.declare_queue("no spaces", QueueConfig::default());
    /// assert_eq!(refused.unwrap_err(), Error::InvalidName);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn declare_queue(&self, name: &str, config: QueueConfig) -> Result<Queue, Error> {
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        validate::queue_name(name)?;
        validate::queue_config(name, &config)?;
        if self.inner.cluster.is_some() && (!config.durable || config.dead_letter.is_some()) {
            return Err(Error::InvalidConfig(
                "in a cluster every queue is replicated, hence durable, and dead-lettering \
                 is not served yet (contract §9): declare it with durable: true and no \
                 dead_letter"
                    .into(),
            ));
        }
        if config.durable && !self.inner.durable {
            return Err(Error::InvalidConfig(
                "durable: a durable queue needs a broker with a data dir \
                 (BrokerBuilder::data_dir); declare it with durable: false"
                    .into(),
            ));
        }
        if !config.durable && self.inner.durable {
            let durable_dead_letters = self.inner.durable_dead_letters.lock();
            let taken = durable_dead_letters.unwrap_or_else(|e| e.into_inner());
            if let Some((source, _)) = taken.iter().find(|(_, dlq)| *dlq == name) {
                return Err(Error::InvalidConfig(format!(
                    "durable: {name:?} is the dead-letter queue of the durable queue \
                     {source:?}, so it must be durable too, or its dead letters would not \
                     survive"
                )));
            }
        }
        if let Some(dead_letter) = &config.dead_letter {
            match self.lookup(dead_letter)? {
                None => return Err(Error::UnknownQueue(dead_letter.clone())),
                Some(dlq) if config.durable && !dlq.is_durable() => {
                    return Err(Error::InvalidConfig(format!(
                        "dead_letter: the dead-letter queue {dead_letter:?} of a durable \
                         queue must be durable too, or its dead letters would not survive"
                    )))
                }
                Some(_) => {}
            }
        }
        let shard = self.shard_of(name);
        let cmd = Command::Declare {
            name: name.to_string(),
            config: Box::new(config),
        };
        match self.declare_call(shard, cmd) {
            Answer::Queue(Ok(Some((key, cell)))) => {
                let queue = Queue::new(self.inner.clone(), name, shard, key, cell);
                self.note_dead_letter_queue(&queue);
                Ok(queue)
            }
            Answer::Queue(Err(e)) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("declare answered {other:?}"),
        }
    }

    /// Sends a declare or lookup to `shard` (in a cluster, to its leader) and waits for
    /// the answer.
    fn declare_call(&self, shard: usize, cmd: Command) -> Answer {
        let inbox = self.inner.inbox(shard);
        match &self.inner.cluster {
            Some(cluster) => cluster.call(inbox, shard, crate::forward::Call::Declare { cmd }),
            None => call(inbox, |reply| Request::Declare { cmd, reply }),
        }
    }

    /// Remembers the dead-letter queue of a durable queue (see `durable_dead_letters`).
    fn note_dead_letter_queue(&self, queue: &Queue) {
        let config = queue.config();
        if let (true, Some(dead_letter)) = (config.durable, &config.dead_letter) {
            let mut taken = self.inner.durable_dead_letters.lock();
            let taken = taken.as_mut().unwrap_or_else(|e| e.get_mut());
            taken.insert(queue.name().to_string(), dead_letter.clone());
        }
    }

    /// The names of every live queue, sorted: one round trip to each shard. Empty after
    /// [`shutdown`](Broker::shutdown).
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, QueueConfig};
    ///
    /// let broker = Broker::builder().shards(2).manual_clock().build()?;
    /// for name in ["emails", "thumbnails", "invoices"] {
    ///     broker.declare_queue(name, QueueConfig::default())?;
    /// }
    /// assert_eq!(broker.queue_names(), ["emails", "invoices", "thumbnails"]);
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn queue_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for shard in 0..self.shard_count() {
            if self.inner.is_shut_down() {
                return Vec::new();
            }
            if let Answer::Names(found) =
                call(self.inner.inbox(shard), |reply| Request::Names { reply })
            {
                names.extend(found);
            }
        }
        names.sort_unstable();
        names
    }

    /// The name and stats of every live queue, sorted by name: one call per shard, where
    /// [`Queue::stats`] is one per queue. Empty after [`shutdown`](Broker::shutdown).
    ///
    /// ```
    /// # mod leasemq { pub use leasemq_engine::*; pub use leasemq_shard::*; }
    /// use leasemq::{Broker, Message, QueueConfig};
    ///
    /// let broker = Broker::builder().shards(2).manual_clock().build()?;
    /// broker.declare_queue("emails", QueueConfig::default())?.put(Message::new("hi"))?;
    /// broker.declare_queue("invoices", QueueConfig::default())?;
    /// let stats = broker.queue_stats();
    /// assert_eq!(stats.len(), 2);
    /// assert_eq!((stats[0].0.as_str(), stats[0].1.ready), ("emails", 1));
    /// assert_eq!((stats[1].0.as_str(), stats[1].1.ready), ("invoices", 0));
    /// # Ok::<(), leasemq::Error>(())
    /// ```
    pub fn queue_stats(&self) -> Vec<(String, QueueStats)> {
        let mut all = Vec::new();
        for shard in 0..self.shard_count() {
            if self.inner.is_shut_down() {
                return Vec::new();
            }
            if let Answer::Stats(found) =
                call(self.inner.inbox(shard), |reply| Request::Stats { reply })
            {
                all.extend(found);
            }
        }
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The live queue called `name`, if there is one; `None` for a name never declared, a
    /// closed queue, an invalid name, or after [`shutdown`](Broker::shutdown).
    pub fn queue(&self, name: &str) -> Option<Queue> {
        self.lookup(name).ok().flatten()
    }

    fn lookup(&self, name: &str) -> Result<Option<Queue>, Error> {
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        if validate::queue_name(name).is_err() {
            return Ok(None);
        }
        let shard = self.shard_of(name);
        let cmd = Command::Lookup {
            name: name.to_string(),
        };
        match self.declare_call(shard, cmd) {
            Answer::Queue(Ok(found)) => {
                Ok(found.map(|(key, cell)| Queue::new(self.inner.clone(), name, shard, key, cell)))
            }
            Answer::Queue(Err(e)) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("lookup answered {other:?}"),
        }
    }

    /// Moves the manual clock forward by `by` and returns once every shard has fired every
    /// timer due and pushed the deliveries that followed into consumer channels, and every
    /// dead letter that caused has landed (contract §4 `advance`). One long advance does what
    /// many short ones adding up to it do: each timer fires at its own deadline.
    ///
    /// # Errors
    ///
    /// [`Error::NotManualClock`] on a broker built without
    /// [`manual_clock`](BrokerBuilder::manual_clock) (checked first); [`Error::ShutDown`]
    /// after [`shutdown`](Broker::shutdown).
    pub fn advance(&self, by: Duration) -> Result<(), Error> {
        if !self.inner.manual {
            return Err(Error::NotManualClock);
        }
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let nanos = self
            .inner
            .manual_nanos
            .fetch_add(by, Ordering::AcqRel)
            .saturating_add(by);
        let mut moved = self.step_all(|reply| Request::Advance { nanos, reply })?;
        // Dead letters crossing shards, and the answers about them, take more steps.
        while moved > 0 {
            moved = self.step_all(|reply| Request::Barrier { reply })?;
        }
        Ok(())
    }

    /// Sends one step to every shard and waits for all; returns the messages they sent to
    /// each other meanwhile.
    fn step_all(&self, request: impl Fn(ReplyTo) -> Request) -> Result<u64, Error> {
        let (reply_to, answers) = fan_in(self.inner.shards.len());
        for inbox in &self.inner.shards {
            drop(inbox.send(request(reply_to())));
        }
        let mut moved = 0;
        for _ in 0..self.inner.shards.len() {
            match answers.recv() {
                Ok(Answer::Step { cross_sent }) => moved += cross_sent,
                _ => return Err(Error::ShutDown),
            }
        }
        Ok(moved)
    }

    /// Stops every shard and joins its thread. Idempotent. Afterwards `put`, `consume`,
    /// `declare_queue`, `advance` and `recv` give [`Error::ShutDown`]; settles return false
    /// (contract §3 `shutdown`).
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// How far the disk is behind each shard's log, by shard; empty without a data dir.
    /// Read from atomics the logs keep, without a word to the shards: for metrics and
    /// health checks, which should raise an alarm on a log that is `stalled`, waits for
    /// room, or `failed` (its durable queues then refuse changes with
    /// [`Error::Storage`]). After [`shutdown`](Broker::shutdown), what the logs left.
    pub fn log_lag(&self) -> Vec<LogLag> {
        self.inner
            .logs
            .iter()
            .map(leasemq_wal::Probe::lag)
            .collect()
    }

    /// This broker as a node of its cluster; `None` for a broker built without
    /// [`BrokerBuilder::cluster`].
    pub fn cluster(&self) -> Option<ClusterHandle> {
        (self.inner.cluster.clone()).map(|inner| ClusterHandle { inner })
    }

    /// Whether [`shutdown`](Broker::shutdown) was called, through this handle or a clone.
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }
}

fn check_shards(shards: usize) -> Result<(), Error> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(Error::InvalidConfig(format!(
            "shards must be from 1 to {MAX_SHARDS}, got {shards}"
        )));
    }
    Ok(())
}

/// Each shard's engine, restored from its log in the data dir (all shards at once, one
/// thread each), or fresh without one.
fn restore(
    data_dir: Option<&DataDir>,
    (sync, segment_bytes): (SyncPolicy, u64),
    sleepers: &[Arc<Sleeper>],
    engine: impl Fn(usize) -> leasemq_engine::Shard + Sync,
) -> Result<Vec<(leasemq_engine::Shard, Option<ShardLog>)>, Error> {
    let Some(dir) = data_dir else {
        return Ok((0..sleepers.len()).map(|i| (engine(i), None)).collect());
    };
    std::thread::scope(|scope| {
        let restores: Vec<_> = sleepers
            .iter()
            .enumerate()
            .map(|(index, sleeper)| {
                let engine = &engine;
                scope.spawn(move || {
                    let mut shard = engine(index);
                    let storage = Arc::clone(&dir.storage);
                    let shard_dir = dir.shard_dir(index);
                    let wake = sleeper.clone();
                    let log = ShardLog::recover(
                        storage,
                        shard_dir,
                        &mut shard,
                        sync,
                        segment_bytes,
                        wake,
                    )?;
                    Ok((shard, Some(log)))
                })
            })
            .collect();
        restores
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err(Error::Storage("a shard's recovery panicked".into())))
            })
            .collect()
    })
}
