//! The syncer thread: writes what the owner submitted and fsyncs it, one round at a time.
//!
//! A round takes everything queued when it starts. It writes the round's frames to each
//! segment they belong to with one `write_at` and one `fdatasync` per segment, in
//! segment order, then publishes the new durable lsn. The next round starts
//! only after that, so exactly one fsync is in flight, and what the owner submits during
//! a round goes whole into the next one.
//!
//! Compaction runs on a thread of its own, the compactor: once a round made a snapshot's
//! records durable, the syncer hands it the snapshot and the segments it covers, and goes
//! on to the next round. Writing a snapshot (with its own fsyncs) would otherwise hold
//! every answer waiting for the next fsync. The compactor renames up to two removed
//! segments to spares (`<n>.spare`), which the owner's next rolls recycle, and unlinks
//! the rest: an unlink of a preallocated segment takes milliseconds on ext4 and stalls
//! concurrent fsyncs behind its journal commit, and a write over blocks a recycled
//! segment's last use wrote changes no metadata, so its fsync flushes data only.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::probe::Gauges;
use crate::segment::Segment;
use crate::storage::{DirLock, Storage};
use crate::WalError;
use crate::{frame, poison};

/// Frames appended to one segment between two submits, not yet sealed (see `frame::seal`).
#[derive(Debug)]
pub(crate) struct Piece {
    pub(crate) segment: Arc<Segment>,
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
    pub(crate) first: u64,
    pub(crate) last: u64,
    /// The segment was created for this piece: its directory entry must be synced too.
    pub(crate) new_segment: bool,
}

/// What the owner and the syncer share.
///
/// Each thread that waits on the state has a condvar of its own, woken only when there
/// is something for it: a round ends thousands of times a second, and a compactor (or a
/// caller of `wait_idle`) woken by each for nothing would cost a context switch apiece.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The syncer waits here for work.
    work: Condvar,
    /// The compactor waits here for a compaction.
    compaction: Condvar,
    /// A closing owner waits here for the threads to end (`wait_exited`).
    exited: Condvar,
    /// What the disk owes, read without the lock by the owner and by a `Probe`.
    pub(crate) gauges: Arc<Gauges>,
    /// The directory's lock, held while the log or any of its threads lives: a thread
    /// left behind by a close that gave up on a hung fsync keeps others out.
    _dir_lock: DirLock,
    /// Callers of [`wait_idle`](Shared::wait_idle) wait here.
    idle: Condvar,
    /// Set with `State::skipped_snapshot`, so that the owner, which asks after every
    /// turn, takes the lock only when there is something to take.
    snapshot_skipped: AtomicBool,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// The size a segment must have to be recycled.
    segment_bytes: u64,
    on_progress: Option<Arc<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct State {
    queue: Vec<Piece>,
    /// Where the last round's filler took the end of its last segment (see
    /// `next_round`): the owner's next piece there, placed where the round ended, moves
    /// to after the filler when it is submitted.
    skip: Option<Skip>,
    removals: Vec<Arc<Segment>>,
    /// A snapshot to write once the round's records are durable: its lsn and bytes.
    snapshot: Option<(u64, Vec<u8>)>,
    busy: bool,
    stop: bool,
    /// Handed to the compactor, in order: the newest snapshot whose records are durable,
    /// and the segments to remove after it.
    compact_snapshot: Option<(u64, Vec<u8>)>,
    compact_removals: Vec<Arc<Segment>>,
    compacting: bool,
    error: Option<WalError>,
    /// Emptied piece buffers, handed back to the owner for reuse.
    spare: Vec<Vec<u8>>,
    /// Why the last snapshot was left out (the disk had no room for it), until the owner
    /// asks.
    skipped_snapshot: Option<WalError>,
    /// Removed segments set aside for the owner's next rolls, their new names durable.
    spares: Vec<PathBuf>,
    /// Spare names given out so far: the next spare is named by this number.
    spares_named: u64,
    /// Callers waiting in `wait_idle`: the syncer and the compactor wake them only if
    /// there are some.
    idle_waiters: usize,
    /// Threads of the log that have ended.
    exited: usize,
}

/// A filler a round ended with: in `segment`, from byte `from` to byte `to`.
struct Skip {
    segment: Arc<Segment>,
    from: u64,
    to: u64,
}

impl State {
    /// The syncer has nothing queued and no round running.
    fn syncer_idle(&self) -> bool {
        !self.busy && self.queue.is_empty() && self.removals.is_empty() && self.snapshot.is_none()
    }

    /// The compactor has nothing handed over and nothing running.
    fn compactor_idle(&self) -> bool {
        !self.compacting && self.compact_snapshot.is_none() && self.compact_removals.is_empty()
    }
}

/// Buffers kept for reuse; more than a few means the owner submits rarely and big.
const SPARE_BUFFERS: usize = 4;

/// Removed segments kept as spares for recycling; a compaction usually frees one or two,
/// and each takes a segment's room on the disk.
const SPARE_SEGMENTS: usize = 2;

impl Shared {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        dir_lock: DirLock,
        segment_bytes: u64,
        durable: u64,
        on_progress: Option<Arc<dyn Fn() + Send + Sync>>,
    ) -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            compaction: Condvar::new(),
            idle: Condvar::new(),
            gauges: Arc::new(Gauges::new(durable)),
            snapshot_skipped: AtomicBool::new(false),
            storage,
            dir,
            segment_bytes,
            on_progress,
            exited: Condvar::new(),
            _dir_lock: dir_lock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic never leaves the state half-changed (see `run`): take it as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn storage(&self) -> &dyn Storage {
        &*self.storage
    }

    /// The size of a segment: what a roll starts, and what a spare must have.
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn durable(&self) -> u64 {
        self.gauges.durable.load(Ordering::Acquire)
    }

    /// The poisoning error, if the log is poisoned.
    pub(crate) fn error(&self) -> Option<WalError> {
        if self.gauges.poisoned.load(Ordering::Acquire) {
            self.lock().error.clone()
        } else {
            None
        }
    }

    /// The owner's log goes on at `next` (after a truncation, or a snapshot past its
    /// end), with nothing in flight: every record before it is durable.
    pub(crate) fn restart_at(&self, next: u64) {
        let state = self.lock();
        debug_assert!(state.syncer_idle(), "restarted with a round in flight");
        self.gauges.durable.store(next - 1, Ordering::Release);
        drop(state);
    }

    /// Poisons the log with `error` (the first error sticks) and returns the error it holds.
    pub(crate) fn poison(&self, error: WalError) -> WalError {
        let error = self.poison_quietly(error);
        self.notify_owner();
        error
    }

    /// Poisons the log as [`poison`](Shared::poison) does, without calling the owner's
    /// callback: for the owner itself.
    pub(crate) fn poison_quietly(&self, error: WalError) -> WalError {
        let mut state = self.lock();
        let error = state.error.get_or_insert(error).clone();
        self.gauges.poisoned.store(true, Ordering::Release);
        self.work.notify_one();
        self.compaction.notify_one();
        self.idle.notify_all();
        error
    }

    /// Why a snapshot was left out since the last call, if one was.
    pub(crate) fn take_skipped_snapshot(&self) -> Option<WalError> {
        if !self.snapshot_skipped.swap(false, Ordering::Acquire) {
            return None;
        }
        self.lock().skipped_snapshot.take()
    }

    /// A spare segment to recycle, if the compactor set one aside: a file of
    /// `segment_bytes`, its blocks allocated and mostly written already, whose name is
    /// durable.
    pub(crate) fn take_spare(&self) -> Option<PathBuf> {
        self.lock().spares.pop()
    }

    pub(crate) fn take_buffer(&self) -> Vec<u8> {
        self.lock().spare.pop().unwrap_or_default()
    }

    /// Queues pieces and removals for the syncer and wakes it.
    pub(crate) fn submit(&self, pieces: &mut Vec<Piece>, removals: Vec<Arc<Segment>>) -> u64 {
        self.submit_with(pieces, None, removals)
    }

    /// Queues pieces, then a snapshot (written once they are durable), then removals (done
    /// once the snapshot is), and wakes the syncer. A later snapshot replaces one not yet
    /// written.
    ///
    /// A piece placed where the last round ended moves past the filler that round ended
    /// with (see `next_round`); returns by how many bytes, 0 if none moved, for the owner
    /// to move its position in that segment by as much.
    pub(crate) fn submit_with(
        &self,
        pieces: &mut Vec<Piece>,
        snapshot: Option<(u64, Vec<u8>)>,
        removals: Vec<Arc<Segment>>,
    ) -> u64 {
        let mut state = self.lock();
        let mut moved = 0;
        let after = |skip: &Skip, piece: &Piece| {
            Arc::ptr_eq(&piece.segment, &skip.segment) && piece.offset >= skip.from
        };
        match state.skip.take() {
            Some(skip) if pieces.iter().any(|p| after(&skip, p)) => {
                let by = skip.to - skip.from;
                for piece in pieces.iter_mut().filter(|p| after(&skip, p)) {
                    piece.offset += by;
                }
                // The owner's position moves with its last piece, in its current segment.
                if pieces.last().is_some_and(|p| after(&skip, p)) {
                    moved = by;
                }
            }
            // Kept until a piece comes after it in its segment.
            kept => state.skip = kept,
        }
        let bytes: u64 = pieces.iter().map(|p| p.bytes.len() as u64).sum();
        self.gauges.unsynced.fetch_add(bytes, Ordering::Relaxed);
        state.queue.append(pieces);
        if snapshot.is_some() {
            state.snapshot = snapshot;
        }
        state.removals.extend(removals);
        // A busy syncer looks at the queue when its round ends: no wake-up needed.
        if !state.busy {
            self.work.notify_one();
        }
        moved
    }

    /// Blocks until the syncer is idle with nothing queued, or the log is poisoned.
    pub(crate) fn wait_idle(&self) -> Result<(), WalError> {
        let mut state = self.lock();
        state.idle_waiters += 1;
        let result = loop {
            if let Some(error) = &state.error {
                break Err(error.clone());
            }
            if state.syncer_idle() && state.compactor_idle() {
                break Ok(());
            }
            state = self.idle.wait(state).unwrap_or_else(|e| e.into_inner());
        };
        state.idle_waiters -= 1;
        result
    }

    /// Wakes the callers of `wait_idle`, if any, to look again.
    fn notify_idle_waiters(&self, state: &State) {
        if state.idle_waiters > 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until `threads` threads of the log have ended, or `deadline` passed;
    /// whether they did.
    pub(crate) fn wait_exited(&self, threads: usize, deadline: std::time::Instant) -> bool {
        let mut state = self.lock();
        while state.exited < threads {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            state = (self.exited.wait_timeout(state, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Asks the syncer to finish what is queued and stop, and the compactor to stop once
    /// the syncer has and nothing is left for it.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.work.notify_one();
        self.compaction.notify_one();
    }

    fn notify_owner(&self) {
        if let Some(notify) = &self.on_progress {
            notify();
        }
    }
}

/// The syncer thread's body. A panic in it (in the owner's `on_progress` callback, or a
/// bug here) poisons the log, so that `sync` and every later call fail instead of waiting
/// for a thread that is gone.
pub(crate) fn run(shared: Arc<Shared>) {
    guarded(&shared, "syncer", "sync round", rounds);
}

/// The compactor thread's body; a panic in it poisons the log too.
pub(crate) fn run_compactor(shared: Arc<Shared>) {
    guarded(&shared, "compactor", "compaction", compactions);
}

fn guarded(shared: &Shared, thread: &str, op: &'static str, body: fn(&Shared)) {
    /// Counts the thread ended however it ends, a panic in `poison`'s callback included.
    struct Ended<'a>(&'a Shared);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            self.0.lock().exited += 1;
            self.0.exited.notify_all();
        }
    }
    let _ended = Ended(shared);
    let body = std::panic::AssertUnwindSafe(|| body(shared));
    if std::panic::catch_unwind(body).is_err() {
        let gone = std::io::Error::other(format!("the log's {thread} thread panicked"));
        shared.poison(WalError::io(&shared.dir, op, gone));
    }
}

/// Runs sync rounds until stopped, or until one fails (which poisons the log). A round
/// with a snapshot hands it, with the removals, to the compactor once its records are
/// durable.
fn rounds(shared: &Shared) {
    let mut scratch = Vec::new();
    while let Some((mut pieces, snapshot, removals)) = next_round(shared) {
        if let Err(error) = write_round(shared, &mut pieces, &mut scratch) {
            // What this round wrote may sit in the page cache, never to reach the disk:
            // the next opening must not take it for records (see `poison`). Only the
            // syncer moves `durable`, and it stops here, so the lsn is final. The marker
            // goes first: once the owner learns of the failure it refuses what waited for
            // this round, and a process that dies just after must not bring that back.
            let _ = poison::write(&*shared.storage, &shared.dir, shared.durable());
            shared.poison(error);
            return;
        }
        let mut state = shared.lock();
        // The compactor has work, or (once stopping) may find that it can stop.
        let wake_compactor = snapshot.is_some() || !removals.is_empty() || state.stop;
        if snapshot.is_some() {
            // A newer snapshot covers all an older one not yet written would.
            state.compact_snapshot = snapshot;
        }
        state.compact_removals.extend(removals);
        state.busy = false;
        shared.gauges.round_began.store(0, Ordering::Relaxed);
        let written: u64 = pieces.iter().map(|p| p.bytes.len() as u64).sum();
        shared.gauges.unsynced.fetch_sub(written, Ordering::Relaxed);
        for piece in pieces {
            if state.spare.len() < SPARE_BUFFERS {
                let mut bytes = piece.bytes;
                bytes.clear();
                state.spare.push(bytes);
            }
        }
        if wake_compactor {
            shared.compaction.notify_one();
        }
        shared.notify_idle_waiters(&state);
        drop(state);
        shared.notify_owner();
    }
}

/// What the compactor does next: a snapshot to write (its lsn and bytes), then files to
/// remove.
type Compaction = (Option<(u64, Vec<u8>)>, Vec<Arc<Segment>>);

/// Writes the snapshots and removes the segments the syncer hands over, until stopped or
/// until one fails (which poisons the log).
///
/// A snapshot the disk has no room for is left out, not fatal: nothing depends on it, and
/// the segments it would have covered stay until a later snapshot covers them.
fn compactions(shared: &Shared) {
    // Segments whose removal waits for a snapshot that covers them, after one was left out.
    let mut deferred: Vec<Arc<Segment>> = Vec::new();
    while let Some((snapshot, mut removals)) = next_compaction(shared) {
        let mut skipped = None;
        let result = match &snapshot {
            Some((lsn, data)) => {
                let lsn = crate::Lsn(*lsn);
                match crate::snapshot::write_snapshot(&*shared.storage, &shared.dir, lsn, data) {
                    Ok(_) => {
                        // Oldest first, as always: a crash midway leaves no gap.
                        deferred.append(&mut removals);
                        removals = std::mem::take(&mut deferred);
                        Ok(())
                    }
                    Err(e @ WalError::NoSpace { .. }) => {
                        deferred.append(&mut removals);
                        skipped = Some(e);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            None => Ok(()),
        }
        .and_then(|()| remove(shared, &removals));
        if let Err(error) = result {
            shared.poison(error);
            return;
        }
        let mut state = shared.lock();
        if skipped.is_some() {
            state.skipped_snapshot = skipped;
            shared.snapshot_skipped.store(true, Ordering::Release);
        }
        state.compacting = false;
        shared.notify_idle_waiters(&state);
    }
}

/// Waits for compaction work; `None` once poisoned, or once the syncer stopped and
/// nothing is left.
fn next_compaction(shared: &Shared) -> Option<Compaction> {
    let mut state = shared.lock();
    loop {
        if state.error.is_some() {
            return None;
        }
        if state.compact_snapshot.is_some() || !state.compact_removals.is_empty() {
            state.compacting = true;
            return Some((
                state.compact_snapshot.take(),
                std::mem::take(&mut state.compact_removals),
            ));
        }
        // Nothing more comes once the syncer was asked to stop and is idle: it hands work
        // over under this lock before it counts itself idle.
        if state.stop && state.syncer_idle() {
            return None;
        }
        state = shared
            .compaction
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// A round's work: pieces to write, then a snapshot and files to remove, for the
/// compactor once the pieces are durable.
type Round = (Vec<Piece>, Option<(u64, Vec<u8>)>, Vec<Arc<Segment>>);

/// Waits for work; `None` once stopped with nothing left to do.
fn next_round(shared: &Shared) -> Option<Round> {
    let mut state = shared.lock();
    loop {
        // A poisoned log writes nothing more (a close may have given up on it).
        if state.error.is_some() {
            return None;
        }
        let work = !state.queue.is_empty() || !state.removals.is_empty();
        if work || state.snapshot.is_some() {
            state.busy = true;
            let began = shared.gauges.epoch.elapsed().as_nanos() as u64 + 1;
            shared.gauges.round_began.store(began, Ordering::Relaxed);
            let mut pieces = std::mem::take(&mut state.queue);
            if let Some(skip) = end_on_a_sector(&mut pieces) {
                (shared.gauges.unsynced).fetch_add(skip.to - skip.from, Ordering::Relaxed);
                state.skip = Some(skip);
            }
            return Some((
                pieces,
                state.snapshot.take(),
                std::mem::take(&mut state.removals),
            ));
        }
        if state.stop {
            return None;
        }
        state = shared.work.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

/// Ends a round's last piece with a filler frame up to the next multiple of
/// [`frame::ALIGN`], where its segment has room, so that the next round starts in a
/// sector of its own and never rewrites one that holds durable data (see `frame`).
/// Decided as the round is taken, under the lock: a piece the owner submits later, placed
/// where this round ends, moves past the filler (`submit_with`). Only the last piece
/// needs one: the owner writes no more to the segments of earlier pieces.
fn end_on_a_sector(pieces: &mut [Piece]) -> Option<Skip> {
    let last = pieces.last_mut()?;
    let from = last.offset + last.bytes.len() as u64;
    let filler = frame::filler_len(from).min(last.segment.capacity.saturating_sub(from));
    if filler < frame::HEADER as u64 {
        return None;
    }
    frame::push_filler(&mut last.bytes, filler as usize);
    Some(Skip {
        segment: Arc::clone(&last.segment),
        from,
        to: from + filler,
    })
}

/// Writes `bytes` at `offset` of `segment`, waiting while the disk is full. A
/// copy-on-write file system needs new blocks even inside preallocated space, so a full
/// disk can refuse a write there; nothing of it is durable, and no fsync failed, so the
/// write is made again, whole, once there is room. Meanwhile `Wal::reserve` refuses
/// changes with `NoSpace` (see `Gauges::no_space`). Gives up once the log is poisoned
/// (a close that stopped waiting for it).
fn write_when_room(
    shared: &Shared,
    segment: &Segment,
    bytes: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    let mut wait = std::time::Duration::from_millis(1);
    loop {
        match segment.file.write_at(bytes, offset) {
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull && shared.error().is_none() => {
                shared.gauges.no_space.store(true, Ordering::Relaxed);
                std::thread::sleep(wait);
                wait = (wait * 2).min(std::time::Duration::from_secs(1));
            }
            result => {
                shared.gauges.no_space.store(false, Ordering::Relaxed);
                return result;
            }
        }
    }
}

/// Writes and syncs a round's pieces, segment by segment, publishing the durable lsn
/// after each segment's fsync.
fn write_round(
    shared: &Shared,
    pieces: &mut [Piece],
    scratch: &mut Vec<u8>,
) -> Result<(), WalError> {
    let mut rest = pieces;
    while let Some(head) = rest.first() {
        if let Some(error) = shared.error() {
            return Err(error);
        }
        let segment = Arc::clone(&head.segment);
        let n = rest
            .iter()
            .take_while(|p| Arc::ptr_eq(&p.segment, &segment))
            .count();
        let (group, tail) = rest.split_at_mut(n);
        rest = tail;
        if group.iter().any(|p| p.new_segment) {
            shared
                .storage
                .sync_dir(&shared.dir)
                .map_err(|e| WalError::io(&shared.dir, "fsync directory", e))?;
        }
        // Every frame of this write names its first lsn: recovery tells a torn write
        // from damage by it (see `frame`). Pieces of one segment are contiguous: one
        // write for all of them (a copy costs less than a system call per submit).
        let first = group[0].first;
        let offset = group[0].offset;
        let bytes = if let [piece] = group {
            &mut piece.bytes
        } else {
            scratch.clear();
            for piece in group.iter() {
                debug_assert_eq!(piece.offset, offset + scratch.len() as u64);
                scratch.extend_from_slice(&piece.bytes);
            }
            &mut *scratch
        };
        frame::seal(bytes, first, segment.seed);
        // The end marker goes in the same write, where the segment has room for it. A
        // segment grown for a large first record (past the capacity it was opened with)
        // needs none: that record covers all it held before, and the rest is zeros. Nor
        // does a segment this log made: zeros follow what it wrote, and a write that
        // stays in its sectors touches one page fewer.
        let written = bytes.len();
        let room = segment.capacity.saturating_sub(offset + written as u64);
        let marker = if segment.zeroed {
            0
        } else {
            frame::HEADER as u64
        };
        bytes.resize(written + marker.min(room) as usize, 0);
        let result = write_when_room(shared, &segment, bytes, offset);
        bytes.truncate(written);
        result.map_err(|e| WalError::io(&segment.path, "write", e))?;
        segment
            .file
            .sync_data()
            .map_err(|e| WalError::io(&segment.path, "fdatasync", e))?;
        let last = group[n - 1].last;
        shared.gauges.durable.store(last, Ordering::Release);
    }
    Ok(())
}

/// Removes `segments`, setting up to [`SPARE_SEGMENTS`] aside as spares: renamed, not
/// unlinked. Unlinking a segment frees its blocks in the file system's journal, which
/// stalls the syncer's fsyncs for milliseconds on ext4; and appends into the blocks of a
/// recycled segment that its last use wrote change no metadata, so their fsyncs flush
/// data only (a preallocated block that was never written still needs its extent
/// marked written, as in a new segment).
fn remove(shared: &Shared, segments: &[Arc<Segment>]) -> Result<(), WalError> {
    if segments.is_empty() {
        return Ok(());
    }
    let (mut room, mut named) = {
        let state = shared.lock();
        (
            SPARE_SEGMENTS.saturating_sub(state.spares.len()),
            state.spares_named,
        )
    };
    let mut spares = Vec::new();
    for segment in segments {
        let path = &segment.path;
        if room > 0 && segment.capacity == shared.segment_bytes {
            let spare = shared.dir.join(crate::segment::spare_name(named));
            shared
                .storage
                .rename(path, &spare)
                .map_err(|e| WalError::io(path, "rename", e))?;
            named += 1;
            room -= 1;
            spares.push(spare);
        } else {
            shared
                .storage
                .remove(path)
                .map_err(|e| WalError::io(path, "remove", e))?;
        }
    }
    shared
        .storage
        .sync_dir(&shared.dir)
        .map_err(|e| WalError::io(&shared.dir, "fsync directory", e))?;
    // Offered once the renames are durable.
    let mut state = shared.lock();
    state.spares_named = named;
    state.spares.append(&mut spares);
    Ok(())
}
