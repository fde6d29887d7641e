//! Durable queues on the shard threads (contract §7): the data dir, each shard's log, and
//! what a shard holds back until the records that caused it are on disk.
//!
//! A data dir holds `leasemq.meta` (its format and shard count), a `LOCK` file that one
//! broker at a time holds, and one directory per shard (`shard-0`, `shard-1`, …) with that
//! shard's write-ahead log and its latest snapshot (`leasemq-wal`). A shard's records are
//! batches of the engine's [`Change`]s, each batch starting with the log time; a snapshot
//! is the engine's image in the same form.
//!
//! The rule under [`SyncPolicy::Always`]: what a request caused once it logged a change
//! (its answer, its deliveries, its messages to other shards) waits in [`ShardLog::held`]
//! until the fsync covering that change is done. What does not depend on the log goes out
//! at once, unless it must stay behind something held: a delivery to a consumer that has
//! one held, a step of the manual clock while anything is held. So each consumer gets its
//! deliveries in order, and the other queues of a shard keep their speed while its durable
//! queues wait for the disk. The fsyncs run on the log's syncer thread, one at a time,
//! each taking what was submitted while the previous one ran.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use leasemq_engine::durable::{begin_batch, Change};
use leasemq_engine::{ConsumerKey, Delivered, Error, Message, QueueKey, QueueStats, Shard};
use leasemq_wal::{latest_snapshot, DirLock, Lsn, Options, Storage, Wal, WalError};

use crate::cluster::{Ending, Proposing};

use crate::protocol::{Deferred, QueueCell, Sink};
use crate::route::Hop;
use crate::wait::Sleeper;

/// When the records of durable queues reach the disk (contract §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Nothing leaves a shard before the records that caused it are on disk: a put or
    /// settle of a durable queue is answered, and a delivery from one handed over, only
    /// after the fsync that covers it. Records that arrive during one fsync share the next.
    #[default]
    Always,
    /// Answers at once and fsyncs at least this often: a crash loses at most the changes
    /// of the last interval (Redis `appendfsync everysec`).
    Interval(Duration),
}

/// The name of the file that records a data dir's format and shard count.
pub const META_FILE: &str = "leasemq.meta";
const META_FORMAT: &str = "leasemq data dir, format 1";

/// Segments of a shard's log by default: small, so that a compacted log holds little
/// beside the snapshot.
pub const DEFAULT_LOG_SEGMENT_BYTES: u64 = 8 << 20;
/// The smallest segment [`BrokerBuilder::log_segment_bytes`](crate::BrokerBuilder::log_segment_bytes) takes:
/// a put makes room for its records and 256 KiB more in the current segment,
/// and starts the next one when they do not fit, so a segment must be several times that.
pub const MIN_LOG_SEGMENT_BYTES: u64 = 1 << 20;
/// The largest segment [`BrokerBuilder::log_segment_bytes`](crate::BrokerBuilder::log_segment_bytes) takes.
pub const MAX_LOG_SEGMENT_BYTES: u64 = 1 << 30;
/// The largest record: a batch holding one largest body, with room for the rest.
pub(crate) const MAX_RECORD_BYTES: usize = leasemq_engine::MAX_BODY_LIMIT + (1 << 20);
/// What a put's or settle's changes take in the log beyond bodies and ids: an `Enqueued`
/// or `Removed` or `Returned`, and a delivery's `Delivered`, with room to spare.
const PER_MESSAGE_BYTES: usize = 128;
/// Room a put leaves in the log beyond its own records, for what timers log (redeliveries)
/// and cannot refuse.
const HEADROOM_BYTES: usize = 256 << 10;
/// A turn's changes are cut into records of about this size (a change is never cut), so
/// that no record exceeds [`MAX_RECORD_BYTES`].
const RECORD_BYTES: usize = 4 << 20;
/// A snapshot is written once the log has grown by this many segments since the last
/// one, or by twice the last one's size, whichever is more.
const SNAPSHOT_AFTER_SEGMENTS: u64 = 2;

/// A data dir, locked for this broker for as long as this lives.
#[derive(Debug)]
pub(crate) struct DataDir {
    pub path: PathBuf,
    pub shards: usize,
    pub storage: Arc<dyn Storage>,
    _lock: DirLock,
}

fn storage_error(e: WalError) -> Error {
    Error::Storage(e.to_string())
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Storage(format!("{}: {what}: {e}", path.display()))
}

impl DataDir {
    /// Opens (or makes) the data dir at `path` on `storage` and takes its lock; `shards`
    /// is the count the builder asked for, if it did; `node` the cluster and node id of a
    /// cluster's node, whose data dir a single broker does not open, nor the reverse.
    pub fn open(
        storage: &Arc<dyn Storage>,
        path: &Path,
        shards: Option<usize>,
        default: usize,
        node: Option<(&str, u64)>,
    ) -> Result<DataDir, Error> {
        leasemq_wal::create_dir_durable(&**storage, path)
            .map_err(|e| io_error(path, "create the data dir", e))?;
        let lock = storage.lock(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Storage(format!(
                    "{}: the data dir is locked by another broker (its {} file)",
                    path.display(),
                    leasemq_wal::LOCK_FILE
                ))
            } else {
                io_error(path, "lock the data dir", e)
            }
        })?;
        let meta = path.join(META_FILE);
        let shards = match read_meta(&**storage, &meta) {
            Ok(text) => {
                let (stored, made_for) = parse_meta(&text).ok_or_else(|| {
                    Error::Storage(format!(
                        "{}: not a leasemq data dir file (expected \"{META_FORMAT}\")",
                        meta.display()
                    ))
                })?;
                let asked = node.map(|(name, id)| (name.to_string(), id));
                if made_for != asked {
                    let say = |who: &Option<(String, u64)>| match who {
                        Some((name, id)) => format!("node {id} of cluster {name:?}"),
                        None => "a single broker".to_string(),
                    };
                    return Err(Error::InvalidConfig(format!(
                        "data_dir: {} was made for {}, and this broker is {}",
                        path.display(),
                        say(&made_for),
                        say(&asked)
                    )));
                }
                match shards {
                    Some(asked) if asked != stored => {
                        return Err(Error::InvalidConfig(format!(
                            "shards: the data dir {} was made with {stored} shards, \
                             the builder asks for {asked}; build without shards(n) to use \
                             {stored}",
                            path.display()
                        )))
                    }
                    _ => stored,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let shards = shards.unwrap_or(default);
                write_meta(&**storage, path, &meta, shards, node)?;
                shards
            }
            Err(e) => return Err(io_error(&meta, "read", e)),
        };
        Ok(DataDir {
            path: path.to_path_buf(),
            shards,
            storage: Arc::clone(storage),
            _lock: lock,
        })
    }

    /// The directory of shard `index`'s log.
    pub fn shard_dir(&self, index: usize) -> PathBuf {
        self.path.join(format!("shard-{index}"))
    }
}

/// The shard count a meta file records, and the cluster and node it was made for, if
/// a cluster's node made it.
fn parse_meta(text: &str) -> Option<(usize, Option<(String, u64)>)> {
    let mut lines = text.lines();
    if lines.next()? != META_FORMAT {
        return None;
    }
    let shards = lines.next()?.strip_prefix("shards ")?.parse().ok()?;
    let node = match lines.next() {
        None => None,
        Some(line) => {
            let cluster = line.strip_prefix("cluster ")?.to_string();
            let id = lines.next()?.strip_prefix("node ")?.parse().ok()?;
            Some((cluster, id))
        }
    };
    Some((shards, node))
}

fn read_meta(storage: &dyn Storage, meta: &Path) -> std::io::Result<String> {
    let file = storage.open(meta)?;
    let mut bytes = vec![0; usize::try_from(file.size()?).unwrap_or(0).min(4096)];
    file.read_at(&mut bytes, 0)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Writes the meta file whole: a temp file, fsynced, renamed, the directory fsynced.
fn write_meta(
    storage: &dyn Storage,
    dir: &Path,
    meta: &Path,
    shards: usize,
    node: Option<(&str, u64)>,
) -> Result<(), Error> {
    let tmp = meta.with_extension("tmp");
    let mut text = format!("{META_FORMAT}\nshards {shards}\n");
    if let Some((cluster, id)) = node {
        text.push_str(&format!("cluster {cluster}\nnode {id}\n"));
    }
    let _ = storage.remove(&tmp); // a leftover from a crash, if any
    let file = storage
        .create(&tmp)
        .map_err(|e| io_error(&tmp, "create", e))?;
    file.write_at(text.as_bytes(), 0)
        .map_err(|e| io_error(&tmp, "write", e))?;
    file.sync_data().map_err(|e| io_error(&tmp, "fsync", e))?;
    storage
        .rename(&tmp, meta)
        .map_err(|e| io_error(&tmp, "rename", e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| io_error(dir, "fsync directory", e))
}

/// Something that waits for the disk before it leaves the shard.
pub(crate) enum Held {
    Delivery(ConsumerKey, Delivered),
    Reply(Deferred),
    Hop(usize, Hop<Deferred>),
    /// A durable queue's close: its handles see it closed, and its consumers' channels
    /// close, only once the `Closed` record is on disk, so that no handle learns of a close
    /// a crash could undo.
    Close(QueueKey, Arc<QueueCell>, QueueStats, Vec<Sink>),
}

/// Where a shard's log goes: its write-ahead log on a single broker; in a cluster, while
/// this node leads the shard, its group, as a chain of proposed batches.
enum Backend {
    Wal(Wal),
    Raft(Proposing),
}

impl Backend {
    /// The last record appended (an lsn, or a batch of the chain).
    fn last_appended(&self) -> u64 {
        match self {
            Backend::Wal(wal) => wal.last_appended().0,
            Backend::Raft(chain) => chain.last_proposed(),
        }
    }

    /// The last record up to which every one is durable: fsynced, or committed.
    fn durable(&self) -> u64 {
        match self {
            Backend::Wal(wal) => wal.durable().0,
            Backend::Raft(chain) => chain.committed(),
        }
    }

    /// `Err` once the log failed: a write or fsync did, or the chain broke.
    fn check(&mut self) -> Result<(), Error> {
        match self {
            Backend::Wal(wal) => wal.check().map_err(storage_error),
            Backend::Raft(chain) => chain.check(Instant::now()),
        }
    }
}

/// One shard's log, and what waits on it.
pub(crate) struct ShardLog {
    backend: Backend,
    policy: SyncPolicy,
    buf: Vec<u8>,
    /// What waits for the disk, each behind the record that must be durable first, and
    /// whether it depends on the log (else it only keeps its place in the order).
    held: VecDeque<(u64, bool, Held)>,
    /// Consumers with deliveries in `held`, and how many.
    held_consumers: HashMap<ConsumerKey, usize>,
    /// Durable queues whose close is in `held`: answers about them wait behind it.
    closing: HashSet<QueueKey>,
    /// Appended records not yet handed to the syncer.
    unsubmitted: bool,
    last_submit: Instant,
    since_snapshot: u64,
    snapshot_bytes: u64,
    segment_bytes: u64,
    /// Set once a write, an fsync or a snapshot failed: the durable queues of this shard
    /// refuse every change from then on.
    failed: Option<Error>,
}

impl ShardLog {
    /// Opens shard `index`'s log in `dir`, restoring what it and its snapshot hold into
    /// `engine`; `wake` is woken after every fsync.
    pub fn recover(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        engine: &mut Shard,
        policy: SyncPolicy,
        segment_bytes: u64,
        wake: Arc<Sleeper>,
    ) -> Result<ShardLog, Error> {
        leasemq_wal::create_dir_durable(&*storage, &dir)
            .map_err(|e| io_error(&dir, "create directory", e))?;
        let snapshot = latest_snapshot(&*storage, &dir).map_err(storage_error)?;
        let mut from = Lsn(1);
        let mut snapshot_bytes = 0;
        if let Some(snapshot) = snapshot {
            let path = snapshot.path.display().to_string();
            snapshot_bytes = snapshot.data.len() as u64;
            engine
                .restore_batch(Bytes::from(snapshot.data))
                .map_err(|e| Error::Storage(format!("{path}: {e}")))?;
            from = Lsn(snapshot.lsn.0 + 1);
        }
        let options = Options {
            segment_bytes,
            max_record_bytes: MAX_RECORD_BYTES,
            on_progress: Some(Arc::new(move || wake.wake())),
            ..Options::default()
        };
        let mut since_snapshot = 0;
        // A record that does not decode or does not fit stops the open, which names its
        // file and offset.
        let (wal, report) = Wal::open(storage.clone(), &dir, options, from, |_, payload| {
            since_snapshot += payload.len() as u64;
            engine.restore_batch(Bytes::copy_from_slice(payload))
        })
        .map_err(storage_error)?;
        if let Some(torn) = &report.torn {
            eprintln!(
                "leasemq: {}: cut a torn last write at byte {} (a crash during a write; \
                 nothing in it was ever acknowledged)",
                torn.path.display(),
                torn.offset
            );
        }
        let sizes = (since_snapshot, snapshot_bytes, segment_bytes);
        Ok(ShardLog::new(Backend::Wal(wal), policy, sizes))
    }

    /// A log over `backend`; `sizes` are the bytes since the last snapshot, the last
    /// snapshot's and a segment's.
    fn new(backend: Backend, policy: SyncPolicy, sizes: (u64, u64, u64)) -> ShardLog {
        let (since_snapshot, snapshot_bytes, segment_bytes) = sizes;
        ShardLog {
            backend,
            policy,
            buf: Vec::new(),
            held: VecDeque::new(),
            held_consumers: HashMap::new(),
            closing: HashSet::new(),
            unsubmitted: false,
            last_submit: Instant::now(),
            since_snapshot,
            snapshot_bytes,
            segment_bytes,
            failed: None,
        }
    }

    /// The log of a shard this node leads in a cluster: each record is proposed to the
    /// shard's group, and what waits on it goes once the group committed it.
    pub fn proposing(chain: Proposing) -> ShardLog {
        // Snapshots are the group's: no sizes to keep here.
        ShardLog::new(Backend::Raft(chain), SyncPolicy::Always, (0, 0, 0))
    }

    /// A probe that reads how far the disk is behind this log (`Broker::log_lag`); none
    /// for a cluster's log.
    pub fn probe(&self) -> Option<leasemq_wal::Probe> {
        match &self.backend {
            Backend::Wal(wal) => Some(wal.probe()),
            Backend::Raft(_) => None,
        }
    }

    /// Whether the log is a cluster's: what waits on it waits for the group's commit.
    pub fn is_replicated(&self) -> bool {
        matches!(self.backend, Backend::Raft(_))
    }

    /// When the log must be looked at again: a cluster's fails once a batch waited the
    /// call timeout for its commit.
    pub fn check_at(&self) -> Option<Instant> {
        match &self.backend {
            Backend::Raft(chain) if !self.held.is_empty() && self.failed.is_none() => {
                chain.deadline()
            }
            _ => None,
        }
    }

    /// Ends a cluster's chain: from now on the log refuses what it holds with `why`.
    /// Gives back what a new chain must wait for.
    pub fn end_chain(&mut self, why: Error) -> Option<Ending> {
        self.fail_with(why);
        match &self.backend {
            Backend::Raft(chain) => Some(chain.ending()),
            Backend::Wal(_) => None,
        }
    }

    /// The error durable queues answer with once the log failed.
    pub fn failed(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// Whether what a logged change caused waits for the disk: under `Always`, or once
    /// the log failed (then to be refused).
    pub fn holds_back(&self) -> bool {
        matches!(self.policy, SyncPolicy::Always) || self.failed.is_some()
    }

    /// Whether the loop has anything to do for the log: records to submit, things held,
    /// or a snapshot due.
    pub fn has_work(&self) -> bool {
        self.unsubmitted || !self.held.is_empty() || self.snapshot_due()
    }

    fn snapshot_due(&self) -> bool {
        // A cluster's group takes its snapshots from its own copy of the shard.
        if self.is_replicated() {
            return false;
        }
        let after = SNAPSHOT_AFTER_SEGMENTS * self.segment_bytes;
        self.since_snapshot > after.max(2 * self.snapshot_bytes)
    }

    /// Whether anything waits.
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether an answer that must follow what the log holds has to wait: something is
    /// held, or (under `Always`, or once the log failed) records appended are not yet on
    /// disk, such as those of a timer that sent nothing.
    pub fn is_behind(&self) -> bool {
        self.is_holding()
            || (self.holds_back() && self.backend.last_appended() > self.backend.durable())
    }

    /// Whether a delivery to `consumer` waits, so that the next one must too.
    pub fn holds_for(&self, consumer: ConsumerKey) -> bool {
        !self.held_consumers.is_empty() && self.held_consumers.contains_key(&consumer)
    }

    /// Appends `changes` (drained), stamped with the log time, in as few records as fit.
    /// Once the log failed they are dropped: nothing more reaches the disk.
    pub fn append(&mut self, log_time: u64, changes: &mut Vec<Change>) {
        if self.failed.is_some() {
            changes.clear();
            return;
        }
        let start = |buf: &mut Vec<u8>| {
            buf.clear();
            begin_batch(buf);
            Change::Clock { now: log_time }.encode(buf);
        };
        start(&mut self.buf);
        let header = self.buf.len();
        for change in changes.drain(..) {
            if self.buf.len() > RECORD_BYTES {
                self.append_record();
                start(&mut self.buf);
            }
            change.encode(&mut self.buf);
        }
        if self.buf.len() > header {
            self.append_record();
        }
        if self.buf.capacity() > 2 * RECORD_BYTES {
            self.buf = Vec::new();
        }
    }

    fn append_record(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let appended = match &mut self.backend {
            Backend::Wal(wal) => wal.append(&self.buf).map(drop).map_err(storage_error),
            Backend::Raft(chain) => chain.propose(&self.buf).map(drop),
        };
        match appended {
            Ok(()) => {
                self.unsubmitted = true;
                self.since_snapshot += self.buf.len() as u64;
            }
            Err(e) => self.fail_with(e),
        }
    }

    /// Holds `what` until everything appended so far is durable; `depends` says whether
    /// it was caused by a logged change (else it only keeps its place in the order).
    pub fn hold(&mut self, depends: bool, what: Held) {
        if let Held::Delivery(key, _) = &what {
            *self.held_consumers.entry(*key).or_default() += 1;
        }
        // Once the log failed, what depends on it waits for a record that never came: no
        // lsn covers it.
        let lsn = match self.failed {
            Some(_) => u64::MAX,
            None => self.backend.last_appended(),
        };
        self.held.push_back((lsn, depends, what));
    }

    fn let_go(&mut self, what: &Held) {
        match what {
            Held::Delivery(key, _) => {
                if let Some(n) = self.held_consumers.get_mut(key) {
                    *n -= 1;
                    if *n == 0 {
                        self.held_consumers.remove(key);
                    }
                }
            }
            Held::Close(key, ..) => {
                self.closing.remove(key);
            }
            Held::Reply(_) | Held::Hop(..) => {}
        }
    }

    /// Holds the close of durable queue `key` until its record is on disk.
    pub fn hold_close(
        &mut self,
        key: QueueKey,
        cell: Arc<QueueCell>,
        frozen: QueueStats,
        sinks: Vec<Sink>,
    ) {
        self.closing.insert(key);
        self.hold(true, Held::Close(key, cell, frozen, sinks));
    }

    /// Whether the close of `queue` waits for the disk: an answer about it must wait too.
    pub fn is_closing(&self, queue: QueueKey) -> bool {
        self.closing.contains(&queue)
    }

    /// Takes out the held deliveries of a consumer that ends, to count them unread.
    pub fn take_deliveries_of(&mut self, consumer: ConsumerKey) -> Vec<Delivered> {
        if !self.holds_for(consumer) {
            return Vec::new();
        }
        self.held_consumers.remove(&consumer);
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.held.len());
        for (lsn, depends, what) in self.held.drain(..) {
            match what {
                Held::Delivery(key, delivered) if key == consumer => taken.push(delivered),
                other => kept.push_back((lsn, depends, other)),
            }
        }
        self.held = kept;
        taken
    }

    /// The log bytes a put of `messages` may take: each message's change and its
    /// delivery's, in records of at most `RECORD_BYTES`, and room to spare for what
    /// timers log meanwhile.
    pub fn put_bytes<'m>(messages: impl Iterator<Item = &'m Message>) -> usize {
        let payload: usize = messages
            .map(|m| m.body().len() + m.id().map_or(0, str::len) + PER_MESSAGE_BYTES)
            .sum();
        payload + (payload / RECORD_BYTES + 1) * leasemq_wal::RESERVE_SLACK + HEADROOM_BYTES
    }

    /// The log bytes `n` settles may take: each one's change and the delivery it frees
    /// credit for.
    pub fn settle_bytes(n: usize) -> usize {
        n * PER_MESSAGE_BYTES + leasemq_wal::RESERVE_SLACK
    }

    /// Makes room in the log for `bytes` before the engine applies a change, so that a
    /// full disk refuses the change whole (contract §7) instead of failing the log.
    ///
    /// # Errors
    ///
    /// `Storage` naming the full disk (the log goes on, and a later change may succeed once
    /// there is room), or the log's failure.
    pub fn reserve(&mut self, bytes: usize) -> Result<(), Error> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // A cluster's log has no room to make here: a replica whose disk is full stops,
        // and the group goes on if a majority is left (contract §9).
        let Backend::Wal(wal) = &mut self.backend else {
            return Ok(());
        };
        match wal.reserve(bytes) {
            Ok(()) => Ok(()),
            Err(e @ WalError::NoSpace { .. }) => Err(Error::Storage(format!(
                "{e}; the change was refused whole, and durable queues go on once there is room"
            ))),
            Err(e @ WalError::Behind { .. }) => Err(Error::Storage(format!(
                "{e}; the change was refused whole, and durable queues go on once it catches up"
            ))),
            Err(e) => {
                self.fail(e);
                Err(self.failed.clone().expect("just failed"))
            }
        }
    }

    /// Hands what was appended to the syncer: at once under `Always`; under `Interval(d)`
    /// once `d` has passed since the last hand-over.
    pub fn submit(&mut self, now: Instant) {
        if !self.unsubmitted || self.failed.is_some() {
            return;
        }
        if let SyncPolicy::Interval(d) = self.policy {
            if now < self.last_submit + d {
                return;
            }
        }
        self.unsubmitted = false;
        self.last_submit = now;
        if let Backend::Wal(wal) = &mut self.backend {
            if let Err(e) = wal.submit() {
                self.fail(e);
            }
        }
    }

    /// When the loop must wake to submit under `Interval`, if records wait for it.
    pub fn submit_at(&self) -> Option<Instant> {
        match self.policy {
            SyncPolicy::Interval(d) if self.unsubmitted => Some(self.last_submit + d),
            _ => None,
        }
    }

    /// Whether something held may leave now (an fsync finished, or the log failed).
    pub fn progressed(&mut self) -> bool {
        self.held
            .front()
            .is_some_and(|(lsn, _, _)| *lsn <= self.backend.durable())
            || (!self.held.is_empty() && (self.failed.is_some() || self.backend.check().is_err()))
    }

    /// What may leave now, in order: what the disk covers; once the log failed, also
    /// the rest, each with the failure if it depended on a change that never reached the
    /// disk (to be refused), or without if it only kept its place in the order.
    pub fn release(&mut self, mut each: impl FnMut(Held, Option<&Error>)) {
        if self.failed.is_none() {
            if let Err(e) = self.backend.check() {
                self.fail_with(e);
            }
        }
        let durable = self.backend.durable();
        while let Some(&(lsn, depends, _)) = self.held.front() {
            let covered = lsn <= durable;
            if !covered && self.failed.is_none() {
                break;
            }
            let (_, _, what) = self.held.pop_front().expect("looked at the front");
            self.let_go(&what);
            let refused = (!covered && depends)
                .then_some(())
                .and(self.failed.as_ref());
            each(what, refused);
        }
    }

    /// Hands a snapshot of `engine` to the log's syncer when the log has grown enough since
    /// the last: the syncer writes it once the records it covers are durable, then removes
    /// the segments it covers. The shard thread only encodes the image (bodies are shared,
    /// not copied, until then) and goes on.
    pub fn maybe_snapshot(&mut self, engine: &Shard) {
        // A cluster's group takes its snapshots from its own copy of the shard.
        let Backend::Wal(wal) = &mut self.backend else {
            return;
        };
        if let Some(e) = wal.take_skipped_snapshot() {
            // Not an error of the log: its records are on disk, only the compaction waits.
            eprintln!(
                "leasemq: a snapshot was left out ({e}); the log keeps the segments it \
                 would have covered and writes one again once it has grown"
            );
        }
        if !self.snapshot_due() || self.failed.is_some() {
            return;
        }
        let Backend::Wal(wal) = &mut self.backend else {
            return;
        };
        let mut image = Vec::new();
        begin_batch(&mut image);
        engine.image(|change| change.encode(&mut image));
        let len = image.len() as u64;
        match wal.submit_snapshot(image) {
            Ok(_) => {
                self.unsubmitted = false;
                self.since_snapshot = 0;
                self.snapshot_bytes = len;
            }
            Err(e) => self.fail(e),
        }
    }

    /// At shutdown: everything appended goes to disk.
    pub fn close(&mut self) {
        if let (None, Backend::Wal(wal)) = (&self.failed, &mut self.backend) {
            if let Err(e) = wal.sync() {
                self.fail(e);
            }
        }
    }

    fn fail(&mut self, e: WalError) {
        self.fail_with(storage_error(e));
    }

    fn fail_with(&mut self, e: Error) {
        self.failed.get_or_insert(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meta_file_says_its_format_and_shard_count() {
        assert_eq!(
            parse_meta(&format!("{META_FORMAT}\nshards 4\n")),
            Some((4, None))
        );
        assert_eq!(parse_meta("shards 4\n"), None);
        assert_eq!(parse_meta(&format!("{META_FORMAT}\nshards x\n")), None);
        let node = format!("{META_FORMAT}\nshards 4\ncluster orders\nnode 2\n");
        assert_eq!(parse_meta(&node), Some((4, Some(("orders".into(), 2)))));
        assert_eq!(
            parse_meta(&format!("{META_FORMAT}\nshards 4\ncluster orders\n")),
            None
        );
    }
}
