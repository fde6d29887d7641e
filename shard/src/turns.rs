//! A shard's turn, run by a caller: when the shard thread sleeps, a blocking caller takes
//! the shard's state and handles its inbox itself, instead of waking the thread and then
//! waiting to be woken by it.
//!
//! Each hand-off between two parked threads costs a futex call on each side and a
//! context switch; beside CPU-bound threads it also takes a core from one of them (an
//! interrupt, a preemption), about 8 µs of CPU in all on the machines the broker was
//! measured on. A per-message put and its ack were three or more such hand-offs, so a
//! broker beside two busy threads on two cores made a seventh of its idle rate (with
//! callers running the turns, three fifths: `docs/performance.md`). A caller that runs
//! the turn itself makes none: its answer is in its slot when the turn ends,
//! the deliveries the turn made are in their channels (a consumer that acked gets its
//! next message on its own thread), and only a consumer parked on an empty channel is
//! woken.
//!
//! The state is the shard thread's, behind a lock that the thread holds for its own turns
//! and releases while it waits for requests. A caller only tries the lock (it never
//! waits on it): when the lock is taken, or callers may not run turns, it wakes the
//! thread as any sender does. The thread parks until the next timer of the engine; a
//! caller's turn that brings a timer earlier than that, leaves work in the backlog or the
//! inbox, or stops the shard, wakes the thread to look again.
//!
//! Only shards that no log and no manual clock tie to their thread lend their turns: a
//! log's syncer wakes the thread to let out what the disk covers, and under the manual
//! clock the thread alone moves time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::host;
use crate::wait::Sleeper;

/// When a caller may run a shard's turn on its own thread instead of waking the shard
/// (see [`BrokerBuilder::caller_turns`](crate::BrokerBuilder::caller_turns)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallerTurns {
    /// Never: every request is handled on the shard's thread.
    Never,
    /// While the host is busy ([`host_load`](crate::host_load)): there each hand-off
    /// costs a preemption of a foreign thread. On an idle host the threads yield to each
    /// other instead, which costs no system call.
    #[default]
    WhenBusy,
    /// Whenever the shard thread sleeps.
    Always,
}

/// What a caller runs: one turn of a shard whose thread waits.
pub(crate) trait Turn: Send + 'static {
    /// Handles what the inbox holds (a batch at most) and flushes what it caused. Returns
    /// how many requests it handled, and whether the thread must look again: the turn left
    /// work for it, or brought the next timer before `wakes_at`, when the thread planned to
    /// wake (nanoseconds of the shard's clock).
    fn run_callers_turn(&mut self, wakes_at: u64) -> (usize, bool);
}

/// What a shard's senders see of its turns (the shard's inbox holds one).
pub(crate) trait Lender: Send + Sync + std::fmt::Debug {
    /// After sending a request: runs the shard's turn on the calling thread when the
    /// thread sleeps and callers may; else wakes the thread.
    fn run_or_wake(&self, shard: &Sleeper);

    /// The requests handled so far, by the thread and by callers.
    fn stats(&self) -> TurnStats;
}

/// A shard's state, shared by its thread and the callers that may run its turns.
pub(crate) struct Turns<S> {
    state: Mutex<Option<S>>,
    /// Whether callers may run turns now: set by the thread once it serves, for a shard
    /// that lends its turns at all; cleared when it stops.
    open: AtomicBool,
    when: CallerTurns,
    /// When the thread will wake on its own, in nanoseconds of the shard's clock
    /// (`u64::MAX`: only when woken).
    wakes_at: AtomicU64,
    /// Set by a caller whose turn needs the thread to look again; the thread's wait ends.
    look_again: AtomicBool,
    /// Requests handled by the shard thread, and by callers.
    by_thread: AtomicU64,
    by_callers: AtomicU64,
}

/// How many requests a broker's shards handled on their own threads and how many blocking
/// callers handled on theirs, while the shard thread slept (see
/// [`BrokerBuilder::caller_turns`](crate::BrokerBuilder::caller_turns)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnStats {
    /// Requests handled by the shard threads.
    pub shard_threads: u64,
    /// Requests handled by callers, in turns they ran for a sleeping shard.
    pub callers: u64,
}

impl<S> std::fmt::Debug for Turns<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("when", &self.when)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

/// The shard's state, held by whoever runs its turn.
pub(crate) struct Held<'a, S>(MutexGuard<'a, Option<S>>);

impl<S> std::ops::Deref for Held<'_, S> {
    type Target = S;

    fn deref(&self) -> &S {
        self.0.as_ref().expect("held only while the shard serves")
    }
}

impl<S> std::ops::DerefMut for Held<'_, S> {
    fn deref_mut(&mut self) -> &mut S {
        self.0.as_mut().expect("held only while the shard serves")
    }
}

impl<S: Turn> Turns<S> {
    pub fn new(when: CallerTurns) -> Turns<S> {
        Turns {
            state: Mutex::new(None),
            open: AtomicBool::new(false),
            when,
            wakes_at: AtomicU64::new(u64::MAX),
            look_again: AtomicBool::new(false),
            by_thread: AtomicU64::new(0),
            by_callers: AtomicU64::new(0),
        }
    }

    /// The thread's side: puts its state here, to be held for each of its turns.
    pub fn install(&self, shard: S) {
        *self.lock_poisoned() = Some(shard);
    }

    /// The thread's side, once it serves: from now on callers may run its turns (as
    /// [`CallerTurns`] says when).
    pub fn lend(&self) {
        self.open.store(true, Ordering::Release);
    }

    /// The thread's side: takes its state for a turn. A caller's turn that panicked left
    /// it half changed: the thread then panics too, and drops what it is sent from then on.
    pub fn hold(&self) -> Held<'_, S> {
        Held(
            self.state
                .lock()
                .expect("a caller's turn of this shard panicked"),
        )
    }

    /// The thread's side, once it stops: takes its state out for good. Callers that try
    /// from now on wake the thread, which drops their requests.
    pub fn take(&self) -> Option<S> {
        self.open.store(false, Ordering::Release);
        self.lock_poisoned().take()
    }

    fn lock_poisoned(&self) -> MutexGuard<'_, Option<S>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The thread's side: counts the requests of one of its turns.
    pub fn handled_by_thread(&self, requests: usize) {
        if requests > 0 {
            self.by_thread.fetch_add(requests as u64, Ordering::Relaxed);
        }
    }

    /// Whether a caller that finds the thread asleep runs its turn now. The thread then
    /// parks as soon as it has nothing to do: a spin or a yield would only keep a core
    /// from the callers that do its work.
    pub fn callers_may_run(&self) -> bool {
        self.open.load(Ordering::Acquire) && self.may_now()
    }

    /// The thread's side, before it releases the state to wait: when it will wake on its
    /// own (nanoseconds of the shard's clock, `None`: only when woken).
    pub fn plan_wake(&self, at: Option<u64>) {
        self.wakes_at
            .store(at.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The thread's side, in its wait: whether a caller's turn asked it to look again.
    pub fn look_again(&self) -> bool {
        self.look_again.load(Ordering::Relaxed) && self.look_again.swap(false, Ordering::Acquire)
    }

    fn may_now(&self) -> bool {
        match self.when {
            CallerTurns::Never => false,
            CallerTurns::WhenBusy => host::busy(),
            CallerTurns::Always => true,
        }
    }
}

impl<S: Turn> Lender for Turns<S> {
    fn run_or_wake(&self, shard: &Sleeper) {
        // Checked first, so that a broker whose callers may not run turns now pays only
        // these loads on top of the wake.
        if !self.callers_may_run() || !shard.is_asleep() {
            shard.wake();
            return;
        }
        let mut held = match self.state.try_lock() {
            Ok(held) => held,
            Err(TryLockError::WouldBlock | TryLockError::Poisoned(_)) => {
                shard.wake();
                return;
            }
        };
        let Some(state) = held.as_mut() else {
            drop(held);
            shard.wake();
            return;
        };
        let wakes_at = self.wakes_at.load(Ordering::Acquire);
        let (handled, needs_thread) = state.run_callers_turn(wakes_at);
        drop(held);
        if handled > 0 {
            self.by_callers.fetch_add(handled as u64, Ordering::Relaxed);
        }
        if needs_thread {
            self.look_again.store(true, Ordering::Release);
            shard.wake();
        }
    }

    fn stats(&self) -> TurnStats {
        TurnStats {
            shard_threads: self.by_thread.load(Ordering::Relaxed),
            callers: self.by_callers.load(Ordering::Relaxed),
        }
    }
}
