//! The scheduler time slices a run asks for: the broker's shard threads'
//! (`--shard-time-slice`) and the workers' (`--caller-time-slice`), and how long threads
//! waiting on the broker yield before they park (`--yield-budget`), and when callers run a
//! sleeping shard's turns (`--caller-turns`), set once from the
//! command line before any broker or worker starts.
//!
//! On a busy host a thread woken for a hand-off waits in the run queue until the thread
//! running there has used its slice, unless its own slice is short (Linux 6.12 and later:
//! see `leasemq::set_thread_time_slice`). The broker gives its shard threads a short slice
//! by default; the threads that call it belong to the service, so the load generator
//! leaves them alone unless told, as an embedding service would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use leasemq::BrokerBuilder;

/// What the run asks of the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct Slices {
    /// The shard threads' slice; `None` keeps the system's.
    pub shard: Option<Duration>,
    /// The producer and consumer threads' (and tokio workers') slice; `None` keeps the
    /// system's.
    pub caller: Option<Duration>,
    /// How long a thread waiting on the broker yields before it parks.
    pub yield_budget: Duration,
    /// When blocking callers run a sleeping shard's turns.
    pub caller_turns: leasemq::CallerTurns,
}

static SLICES: OnceLock<Slices> = OnceLock::new();

/// Records the run's slices; the first call wins.
pub fn set(slices: Slices) {
    let _ = SLICES.set(slices);
}

/// The run's slices (the broker's default and the system's, when never set).
pub fn slices() -> Slices {
    SLICES.get().copied().unwrap_or(Slices {
        shard: Some(leasemq::DEFAULT_SHARD_TIME_SLICE),
        caller: None,
        yield_budget: leasemq::DEFAULT_YIELD_BUDGET,
        caller_turns: leasemq::CallerTurns::default(),
    })
}

/// `builder` with the run's shard slice and yield budget.
pub fn broker(builder: BrokerBuilder) -> BrokerBuilder {
    let slices = slices();
    builder
        .shard_time_slice(slices.shard)
        .yield_budget(slices.yield_budget)
        .caller_turns(slices.caller_turns)
}

/// Gives the calling worker thread the run's caller slice, if it has one. A system that
/// refuses is reported once, and the run goes on with the system's slice.
pub fn caller_thread() {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if let Some(slice) = slices().caller {
        if let Err(e) = leasemq::set_thread_time_slice(slice) {
            if !REPORTED.swap(true, Ordering::Relaxed) {
                eprintln!("leasemq-loadgen: --caller-time-slice: {e}; the workers keep the system's slice");
            }
        }
    }
}

/// How the summary names a slice.
pub fn describe(slice: Option<Duration>) -> String {
    match slice {
        Some(d) => format!("{} µs", d.as_micros()),
        None => "system".into(),
    }
}
