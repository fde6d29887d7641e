//! The server's two clocks: the wall clock messages are stamped and expire by, and the
//! monotonic clock a connection measures its deliveries' leases on. Tests read clocks
//! they move by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a clock of the server reads: milliseconds.
type ReadMs = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A reading that is what the returned cell holds, starting at `start`: a clock tests
/// move by hand.
fn manual_ms(start: u64) -> (ReadMs, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(start));
    let read = Arc::clone(&now);
    (Arc::new(move || read.load(Ordering::Relaxed)), now)
}

/// The wall clock, in milliseconds since the Unix epoch: when messages arrive, and when
/// they expire (message TTL). Tests use one they move by hand ([`WallClock::manual`]).
#[derive(Clone)]
pub struct WallClock(ReadMs);

impl WallClock {
    /// The system's clock.
    pub fn system() -> WallClock {
        WallClock(Arc::new(|| {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            since.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }))
    }

    /// A clock that reads what the returned cell holds, starting at `start`.
    pub fn manual(start: u64) -> (WallClock, Arc<AtomicU64>) {
        let (read, now) = manual_ms(start);
        (WallClock(read), now)
    }

    /// Now, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for WallClock {
    fn default() -> WallClock {
        WallClock::system()
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WallClock({} ms)", self.now_ms())
    }
}

/// A monotonic clock in milliseconds from an arbitrary start, on which a connection
/// measures how long its deliveries have been out. Tests use one they move by hand
/// ([`LeaseClock::manual`]), in step with the broker's manual clock.
#[derive(Clone)]
pub struct LeaseClock(ReadMs);

impl LeaseClock {
    /// The system's monotonic clock, counted from the first time any `LeaseClock` read it.
    pub fn system() -> LeaseClock {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        LeaseClock(Arc::new(|| {
            let start = *START.get_or_init(std::time::Instant::now);
            u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
        }))
    }

    /// A clock that reads what the returned cell holds, starting at 0.
    pub fn manual() -> (LeaseClock, Arc<AtomicU64>) {
        let (read, now) = manual_ms(0);
        (LeaseClock(read), now)
    }

    /// Now, in milliseconds from the clock's start.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for LeaseClock {
    fn default() -> LeaseClock {
        LeaseClock::system()
    }
}

impl std::fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseClock({} ms)", self.now_ms())
    }
}
