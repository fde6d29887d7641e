//! openraft's log storage over the write-ahead log.
//!
//! One entry is one record, at lsn = index + 1. Besides the records, a group keeps:
//!
//! - **The purge record**: the log id of the last entry openraft let go, written as the
//!   log's own snapshot ([`Wal::install_snapshot`]) at that entry's lsn. The log then
//!   drops the segments it covers, and when it lies past the log's end (a follower that
//!   installed its leader's snapshot) the log goes on after it. At open, replay starts
//!   after it.
//! - **The vote**, in a directory of its own, written whole and atomically as the log
//!   writes snapshots (temporary file, fsync, rename, directory fsync), each under a
//!   higher number than the last. The appends before it are made durable first:
//!   openraft counts on its writes reaching the disk in the order it makes them.
//!
//! Appends go through the log's group commit: [`RaftLogStorage::append`] frames the
//! entries, hands them to the log's syncer and returns; the callback that tells
//! openraft they are durable runs on the syncer thread, after the fsync that covers
//! them (`Options::on_progress`). Entries not yet durable, and the most recent durable
//! ones, stay in memory, where the leader's replication reads them; older ones are read
//! back from the log. Truncation, purge and vote block their caller until they are
//! durable; openraft makes them rarely.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use leasemq_wal::{Lsn, Options, Probe, Wal};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};

use crate::entry::{decode_entry, encode_entry, entry_log_id};
use crate::{invalid, io as wal_io, Entry, GroupDir, LogId, ShardRaft, Vote};

/// Durable entries kept in memory after the newest, per group: for followers a little
/// behind, and for the leader's own state machine, which under load applies entries some
/// way behind their commit. Read back from the log instead, they cost a loaded leader a
/// fifth of its rate (`docs/performance.md`).
const TAIL_BYTES: usize = 16 << 20;

/// A shard's Raft log, over its write-ahead log. Opened once per group and handed to
/// openraft, which reads through [`LogReader`]s.
pub struct LogStore {
    shared: Arc<Shared>,
}

/// Reads a [`LogStore`]'s entries and vote; any number of them, on any task.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    flush: Arc<Flush>,
    /// Bytes of records replayed at open and appended since.
    appended: Arc<AtomicU64>,
}

struct State {
    wal: Wal,
    /// The appends waiting for their fsync (shared with [`Shared::flush`]).
    flush: Arc<Flush>,
    group: GroupDir,
    vote: Option<Vote>,
    /// The number the vote was last written under.
    vote_number: u64,
    purged: Option<LogId>,
    /// The index of the first entry the log holds: the one after the purged ones, or
    /// after a gap.
    first: u64,
    last: Option<LogId>,
    /// The newest entries, in order, up to the last: every one not yet durable, and
    /// durable ones up to [`TAIL_BYTES`].
    tail: VecDeque<Entry>,
    tail_bytes: usize,
    buf: Vec<u8>,
}

/// The appends that wait for the fsync covering them, completed by the log's syncer.
struct Flush {
    waiting: Mutex<VecDeque<(Lsn, IOFlushed<ShardRaft>)>>,
    probe: OnceLock<Probe>,
}

impl LogStore {
    /// Opens (or makes) the log of the group in `group`, with the write-ahead log's
    /// `options` (its `on_progress` is the store's own).
    ///
    /// # Errors
    ///
    /// The log's error if it does not open (see [`Wal::open`]); `InvalidData` for a
    /// record, purge record or vote that does not decode.
    pub fn open(group: &GroupDir, mut options: Options) -> io::Result<LogStore> {
        let storage = &*group.storage;
        leasemq_wal::create_dir_durable(storage, &group.dir)?;
        leasemq_wal::create_dir_durable(storage, &group.vote())?;
        let purge_record = leasemq_wal::latest_snapshot(storage, &group.log()).map_err(wal_io)?;
        let (from, purged) = match purge_record {
            Some(record) => (Lsn(record.lsn.0 + 1), decode_purged(&record.data)?),
            None => (Lsn(1), None),
        };
        let (vote_number, vote) = match leasemq_wal::latest_snapshot(storage, &group.vote()) {
            Ok(Some(file)) => (file.lsn.0, Some(decode_vote(&file.data)?)),
            Ok(None) => (0, None),
            Err(e) => return Err(wal_io(e)),
        };
        let flush = Arc::new(Flush {
            waiting: Mutex::new(VecDeque::new()),
            probe: OnceLock::new(),
        });
        let notify = Arc::clone(&flush);
        options.on_progress = Some(Arc::new(move || notify.progress()));
        let (mut last, mut replayed) = (None, 0);
        let replay = |lsn: Lsn, record: &[u8]| {
            last = Some(entry_log_id(record, lsn.0 - 1).map_err(|e| e.to_string())?);
            replayed += record.len() as u64;
            Ok(())
        };
        let (wal, _report) = Wal::open(
            Arc::clone(&group.storage),
            &group.log(),
            options,
            from,
            replay,
        )
        .map_err(wal_io)?;
        flush.probe.set(wal.probe()).ok();
        let last = last.or(purged);
        let state = State {
            wal,
            flush: Arc::clone(&flush),
            group: group.clone(),
            vote,
            vote_number,
            purged,
            first: from.0 - 1,
            last,
            tail: VecDeque::new(),
            tail_bytes: 0,
            buf: Vec::new(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            flush,
            appended: Arc::new(AtomicU64::new(replayed)),
        });
        Ok(LogStore { shared })
    }

    /// A counter of the bytes of records the log holds past its purge point at open,
    /// and appended since, read from any thread: how much the log grew, for the rule
    /// that takes snapshots.
    pub fn appended(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shared.appended)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock left the state as the last completed step left
        // it: every step below changes memory only after the log did what it says.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry>> {
        let state = self.lock();
        let Some(last) = state.last else {
            return Ok(Vec::new());
        };
        let from = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        // Purged entries are not asked for; where the log still holds them, they are
        // left out all the same.
        let from = from.max(state.first);
        let to = to.min(last.index + 1);
        if from >= to {
            return Ok(Vec::new());
        }
        let in_memory = state
            .tail
            .front()
            .map_or(to, |e| e.log_id.index.clamp(from, to));
        let mut entries = Vec::with_capacity((to - from) as usize);
        if from < in_memory {
            let records = state
                .wal
                .read(Lsn(from + 1), Lsn(in_memory + 1))
                .map_err(wal_io)?;
            for (lsn, record) in records {
                entries.push(decode_entry(&record, lsn.0 - 1)?);
            }
        }
        let tail_first = state.tail.front().map_or(in_memory, |e| e.log_id.index);
        let skip = in_memory.saturating_sub(tail_first);
        let wanted = (to - in_memory) as usize;
        entries.extend(state.tail.iter().skip(skip as usize).take(wanted).cloned());
        Ok(entries)
    }
}

impl State {
    /// Appends an entry; returns the size of its record.
    fn append(&mut self, entry: Entry) -> io::Result<usize> {
        let lsn = entry.log_id.index + 1;
        let next = self.wal.last_appended().0 + 1;
        if lsn < next {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "append of entry {} where the log's next is {}: truncate first",
                    entry.log_id.index,
                    next - 1
                ),
            ));
        }
        if lsn > next {
            // A log that goes on after a gap: what came before is of no use to a log
            // that must hold every entry after its start. Raft never asks for one (after
            // a purge past the end, the log already goes on where it left off); the
            // test suite's stores begin anywhere.
            let record = encode_purged(self.purged);
            self.settle()?;
            self.wal
                .install_snapshot(Lsn(lsn - 1), &record)
                .map_err(wal_io)?;
            self.tail.clear();
            self.tail_bytes = 0;
            self.first = entry.log_id.index;
        }
        self.buf.clear();
        encode_entry(&entry, &mut self.buf)?;
        self.wal.append(&self.buf).map_err(wal_io)?;
        // Counted as it is counted when it goes, so that the sum never drifts.
        self.tail_bytes += entry_bytes(&entry);
        self.last = Some(entry.log_id);
        self.tail.push_back(entry);
        Ok(self.buf.len())
    }

    /// Makes everything appended durable and completes every append waiting for it,
    /// before a truncation or a restart of the log moves its durable lsn back: the
    /// syncer's next report would read the moved lsn, and never complete them.
    fn settle(&mut self) -> io::Result<()> {
        let durable = self.wal.sync().map_err(wal_io)?;
        self.flush.complete_up_to(durable);
        Ok(())
    }

    /// Lets go of durable entries past what the tail keeps.
    fn trim_tail(&mut self) {
        let durable = self.wal.durable().0;
        while self.tail_bytes > TAIL_BYTES {
            let Some(first) = self.tail.front() else {
                break;
            };
            if first.log_id.index + 1 > durable {
                break;
            }
            self.tail_bytes -= entry_bytes(first);
            self.tail.pop_front();
        }
    }

    fn truncate_after(&mut self, kept: Option<LogId>) -> io::Result<()> {
        let keep = kept.or(self.purged);
        let keep_index = keep.map(|k| k.index);
        if keep_index >= self.last.map(|l| l.index) {
            return Ok(());
        }
        self.settle()?;
        self.wal
            .truncate_after(Lsn(keep_index.map_or(0, |i| i + 1)))
            .map_err(wal_io)?;
        while self
            .tail
            .back()
            .is_some_and(|e| Some(e.log_id.index) > keep_index)
        {
            let gone = self.tail.pop_back().expect("just looked");
            self.tail_bytes -= entry_bytes(&gone);
        }
        self.last = keep;
        Ok(())
    }

    fn purge(&mut self, upto: LogId) -> io::Result<()> {
        if self.purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(());
        }
        let record = encode_purged(Some(upto));
        self.settle()?;
        self.wal
            .install_snapshot(Lsn(upto.index + 1), &record)
            .map_err(wal_io)?;
        self.purged = Some(upto);
        self.first = self.first.max(upto.index + 1);
        while self
            .tail
            .front()
            .is_some_and(|e| e.log_id.index <= upto.index)
        {
            let gone = self.tail.pop_front().expect("just looked");
            self.tail_bytes -= entry_bytes(&gone);
        }
        if self.last.is_none_or(|l| l.index < upto.index) {
            self.last = Some(upto);
        }
        Ok(())
    }

    fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.wal.sync().map_err(wal_io)?;
        let number = self.vote_number + 1;
        let storage = &*self.group.storage;
        let bytes = encode_vote(vote);
        leasemq_wal::write_snapshot(storage, &self.group.vote(), Lsn(number), &bytes)
            .map_err(wal_io)?;
        self.vote_number = number;
        self.vote = Some(*vote);
        Ok(())
    }
}

impl Flush {
    /// Completes `done` once the fsync covering `lsn` returned (at once if it has).
    fn when_durable(&self, lsn: Lsn, done: IOFlushed<ShardRaft>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let lag = self.probe.get().map(Probe::lag);
        match lag {
            Some(lag) if lag.durable >= lsn => done.io_completed(Ok(())),
            Some(lag) if lag.failed => done.io_completed(Err(failed())),
            _ => waiting.push_back((lsn, done)),
        }
    }

    /// Completes the appends waiting for lsns up to `durable`.
    fn complete_up_to(&self, durable: Lsn) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        while waiting.front().is_some_and(|(lsn, _)| *lsn <= durable) {
            let (_, done) = waiting.pop_front().expect("just looked");
            done.io_completed(Ok(()));
        }
    }

    /// On the syncer thread, after each round: completes the appends it made durable,
    /// or fails them all once the log failed.
    fn progress(&self) {
        let Some(probe) = self.probe.get() else {
            return;
        };
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let lag = probe.lag();
        while waiting.front().is_some_and(|(lsn, _)| *lsn <= lag.durable) {
            let (_, done) = waiting.pop_front().expect("just looked");
            done.io_completed(Ok(()));
        }
        if lag.failed {
            for (_, done) in waiting.drain(..) {
                done.io_completed(Err(failed()));
            }
        }
    }
}

fn failed() -> io::Error {
    io::Error::other("the log failed a write or fsync: it takes nothing more until it is reopened")
}

fn entry_bytes(entry: &Entry) -> usize {
    let body = match &entry.payload {
        openraft::EntryPayload::Normal(batch) => batch.changes.len() + 12,
        _ => 0,
    };
    crate::entry::HEADER + body
}

impl RaftLogReader<ShardRaft> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        self.shared.entries(range)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.shared.lock().vote)
    }
}

impl RaftLogStorage<ShardRaft> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> io::Result<LogState<ShardRaft>> {
        let state = self.shared.lock();
        Ok(LogState {
            last_purged_log_id: state.purged,
            // The later by index: a purge past the end (a snapshot installed) moves the
            // last log id forward.
            last_log_id: match (state.last, state.purged) {
                (Some(last), Some(purged)) if purged.index > last.index => Some(purged),
                (last, purged) => last.or(purged),
            },
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            shared: Arc::clone(&self.shared),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.shared.lock().save_vote(vote)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<ShardRaft>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let last = {
            let mut state = self.shared.lock();
            for entry in entries {
                let bytes = state.append(entry)?;
                self.shared
                    .appended
                    .fetch_add(bytes as u64, Ordering::Relaxed);
            }
            state.wal.submit().map_err(wal_io)?;
            state.trim_tail();
            state.wal.last_appended()
        };
        self.shared.flush.when_durable(last, callback);
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        self.shared.lock().truncate_after(last_log_id)
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.shared.lock().purge(log_id)
    }
}

/// The purge record: 0 for none, or 1 and the log id (term, node, index).
fn encode_purged(purged: Option<LogId>) -> Vec<u8> {
    match purged {
        None => vec![0],
        Some(id) => {
            let leader = id.committed_leader_id();
            let mut bytes = vec![1];
            for n in [leader.term, leader.node_id, id.index] {
                bytes.extend_from_slice(&n.to_le_bytes());
            }
            bytes
        }
    }
}

fn decode_purged(bytes: &[u8]) -> io::Result<Option<LogId>> {
    match bytes {
        [0] => Ok(None),
        [1, rest @ ..] if rest.len() == 24 => {
            let n = |i: usize| u64::from_le_bytes(rest[i * 8..i * 8 + 8].try_into().expect("8"));
            Ok(Some(crate::log_id(n(0), n(1), n(2))))
        }
        _ => Err(invalid(format!("a purge record of {} bytes", bytes.len()))),
    }
}

/// The vote: term, node id, and 1 if it was committed (a leader's), else 0.
fn encode_vote(vote: &Vote) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(17);
    bytes.extend_from_slice(&vote.leader_id.term.to_le_bytes());
    bytes.extend_from_slice(&vote.leader_id.node_id.to_le_bytes());
    bytes.push(u8::from(vote.committed));
    bytes
}

fn decode_vote(bytes: &[u8]) -> io::Result<Vote> {
    if bytes.len() != 17 || bytes[16] > 1 {
        return Err(invalid(format!("a vote of {} bytes", bytes.len())));
    }
    let term = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let node = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Ok(if bytes[16] == 1 {
        Vote::new_committed(term, node)
    } else {
        Vote::new(term, node)
    })
}
