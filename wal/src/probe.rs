//! [`Probe`]: how far a running log's disk is behind, read from any thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Lsn;

/// What the log's disk owes, kept by the syncer in atomics: the owner reads it before
/// each change it reserves room for, a [`Probe`] whenever it is asked.
#[derive(Debug)]
pub(crate) struct Gauges {
    /// Bytes submitted and not durable yet.
    pub(crate) unsynced: AtomicU64,
    /// A round's write waits for room on a full disk (`syncer::write_when_room`).
    pub(crate) no_space: AtomicBool,
    /// When the round in flight began, in nanoseconds after `epoch` plus one; 0 when no
    /// round is in flight.
    pub(crate) round_began: AtomicU64,
    pub(crate) epoch: Instant,
    /// The last durable lsn.
    pub(crate) durable: AtomicU64,
    /// A write or fsync failed.
    pub(crate) poisoned: AtomicBool,
}

impl Gauges {
    pub(crate) fn new(durable: u64) -> Gauges {
        Gauges {
            unsynced: AtomicU64::new(0),
            no_space: AtomicBool::new(false),
            round_began: AtomicU64::new(0),
            epoch: Instant::now(),
            durable: AtomicU64::new(durable),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Bytes submitted and not durable yet, and how long the round in flight has run.
    pub(crate) fn backlog(&self) -> (u64, Option<Duration>) {
        let began = self.round_began.load(Ordering::Relaxed);
        let running = (began != 0).then(|| {
            let since = Duration::from_nanos(began - 1);
            self.epoch.elapsed().saturating_sub(since)
        });
        (self.unsynced.load(Ordering::Relaxed), running)
    }
}

/// A look at a running log from any thread, for metrics and health checks: what waits
/// for the disk, and whether the disk keeps up. Taken with [`Wal::probe`](crate::Wal::probe);
/// it holds none of the log's files or locks, and once the log is closed it reads what
/// the log left.
#[derive(Clone, Debug)]
pub struct Probe {
    gauges: Arc<Gauges>,
    stall_after: Duration,
}

/// What a [`Probe`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lag {
    /// Bytes handed to the syncer and not durable yet.
    pub unsynced_bytes: u64,
    /// How long the write and fsync in flight have run, if one is.
    pub fsync_running: Option<Duration>,
    /// The last durable lsn.
    pub durable: Lsn,
    /// The fsync in flight has run longer than
    /// [`Options::stall_after`](crate::Options::stall_after): changes are refused with
    /// [`WalError::Behind`](crate::WalError::Behind) until it returns.
    pub stalled: bool,
    /// A write waits for room on a full disk: changes are refused with
    /// [`WalError::NoSpace`](crate::WalError::NoSpace) until it gets some.
    pub waits_for_room: bool,
    /// A write or fsync failed: the log is poisoned, and takes nothing more.
    pub failed: bool,
}

impl Probe {
    pub(crate) fn new(gauges: &Arc<Gauges>, stall_after: Duration) -> Probe {
        Probe {
            gauges: Arc::clone(gauges),
            stall_after,
        }
    }

    /// What the log's disk owes now.
    pub fn lag(&self) -> Lag {
        let (unsynced_bytes, fsync_running) = self.gauges.backlog();
        Lag {
            unsynced_bytes,
            fsync_running,
            durable: Lsn(self.gauges.durable.load(Ordering::Acquire)),
            stalled: fsync_running.is_some_and(|d| d > self.stall_after),
            waits_for_room: self.gauges.no_space.load(Ordering::Relaxed),
            failed: self.gauges.poisoned.load(Ordering::Acquire),
        }
    }
}
