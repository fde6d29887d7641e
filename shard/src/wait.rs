//! How one thread waits for another: spin while spinning pays, yield only while yielding
//! works, then park.
//!
//! Every hand-off of the broker (a caller waiting for its answer, a shard waiting for
//! requests, a consumer thread waiting for a delivery) goes through [`Sleeper::wait`] or
//! [`Bell::wait`]:
//!
//! 1. poll with the CPU's spin hint for at most [`SPIN`]: a round trip whose two sides are
//!    both on a core completes within it. Not while more of our threads keep busy than
//!    there are cores and one (`host.rs` counts them): then the one it waits for is most
//!    likely not running. A thread whose spins keep missing stops spinning too, and tries
//!    again now and then ([`Spinning`]);
//! 2. poll between `yield_now` calls for at most the broker's [`YieldBudget`]
//!    ([`YIELD_BUDGET`] by default): on an idle machine with more of our threads than
//!    cores, a yield passes the core to one of them at once, and the core neither goes
//!    idle nor costs a futex call on either side;
//! 3. park on a futex until the other side wakes this thread.
//!
//! A busy host changes the sums. When threads that do not wait on the broker (another
//! process's, or the service's own) keep the cores busy, a yield hands one of them a whole
//! time slice (a millisecond or more), and a woken thread may wait in the run queue for
//! part of a slice before it runs. Whether the host is busy is the sampler's to say
//! (`host.rs`: where the machine's CPU time goes). How long a yield took does not tell:
//! with 8 producers and 8 consumers on two idle cores a yield over 500 µs came about once
//! a second, a round of our own threads, and when each made the whole process park for
//! 250 ms the run lost 60 % of its rate.
//! On a busy host waits skip step 2; where shard threads run with the system's time
//! slice, a waiting thread then also spins longer in step 1 ([`BUSY_SPIN`]), to catch its
//! answer while it still holds a core; where they run a short one (see `slice.rs`: a
//! shard thread asks for it while the host is busy), it does not spin at all: a woken
//! shard preempts a busy thread at once, but the wake-up itself (an interrupt to a core
//! running another thread) takes longer than a spin worth its cost, so the spin would
//! only burn the share of the CPU the host leaves us, and a thread that sleeps rather
//! than spins is also the one the scheduler runs first when it wakes. Between two looks
//! of the sampler, a few yields that took longer than [`SLOW_YIELDS`] end their own
//! wait's yields: a load that came since, or that comes and goes faster than the sampler
//! looks, costs each wait a few slices at most. No spin and no yield loop lasts longer
//! than its time bound.
//!
//! The wake is cheap when nobody sleeps: a fence and a load of the `asleep` flag (a count
//! for a [`Bell`]), the "is anyone waiting" check of crossbeam's `SyncWaker`; only a thread
//! that set the flag is unparked. The waiter sets the flag and then looks once more; the
//! waker publishes its value and then reads the flag. With a sequentially consistent fence
//! on each side, at least one of them sees the other, so no wake-up is lost.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::host;

/// How long a thread spins before it parks on a busy host, while shard threads run with
/// the system's time slice. Beside busy threads a parked thread, once
/// woken, can wait in the run queue for part of a time slice before it runs, so catching
/// the answer while still on the core is worth more.
const BUSY_SPIN: Duration = Duration::from_micros(10);

/// How long a waiter polls with the CPU's spin hint before it yields or parks. An idle
/// round trip to a shard and back that both sides make on their cores takes 1–3 µs here.
const SPIN: Duration = Duration::from_micros(2);

/// The longest a waiter polls between yields before it parks. On an idle machine with more
/// of our threads than cores, a yield hands the core to another of them at once, without
/// the core going idle and without a futex call on either side.
pub(crate) const YIELD_BUDGET: Duration = Duration::from_micros(500);

/// A group of [`YIELDS_PER_CLOCK_READ`] yields that took longer than this most likely
/// gave the core to a thread that ran a time slice (a default slice is 0.75 ms at the
/// least): yielding again in the same wait could wait out more slices, so the wait parks.
const SLOW_YIELDS: Duration = Duration::from_micros(500);

/// Yields between two readings of the clock. A reading costs about as much as the poll
/// after a yield; read after each yield, the clock took a twentieth of the process's CPU
/// time outside the kernel with 4 producers and 4 consumers on two cores.
const YIELDS_PER_CLOCK_READ: u32 = 4;

/// Whether a shard thread of this process runs with a short time slice the kernel honours
/// (set once by [`shards_run_short_slices`]); then a busy host is no reason to spin.
static SHORT_SLICES: AtomicBool = AtomicBool::new(false);

/// Says that a shard thread got the short time slice it asked for.
pub(crate) fn shards_run_short_slices() {
    SHORT_SLICES.store(true, Ordering::Relaxed);
}

/// How long to spin before parking on a busy host: not at all where shard threads run
/// short slices (see the module docs).
fn busy_spin() -> Duration {
    if SHORT_SLICES.load(Ordering::Relaxed) {
        Duration::ZERO
    } else {
        BUSY_SPIN
    }
}

/// Polls made between two readings of the clock while spinning.
const POLLS_PER_CLOCK_READ: u32 = 8;

/// One thread that may park waiting for something, and the flag that says it does.
#[derive(Debug, Default)]
pub(crate) struct Sleeper {
    thread: OnceLock<Thread>,
    asleep: AtomicBool,
}

impl Sleeper {
    /// A sleeper for the calling thread.
    pub fn current() -> Sleeper {
        let sleeper = Sleeper::default();
        sleeper.bind();
        sleeper
    }

    /// Makes the calling thread the one that waits here. Until it is bound nobody waits,
    /// so a wake does nothing.
    pub fn bind(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Tells the waiter that what it waits for may be there: call after making it visible
    /// (sending it into a channel). Unparks the waiter only when it is parked or about to.
    #[inline]
    pub fn wake(&self) {
        if self.is_asleep() && self.asleep.swap(false, Ordering::Relaxed) {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
    }

    /// Whether the thread parked, or is about to, and a [`wake`](Self::wake) would unpark
    /// it. Read after making something visible to it, as `wake` does.
    #[inline]
    pub fn is_asleep(&self) -> bool {
        fence(Ordering::SeqCst);
        self.asleep.load(Ordering::Relaxed)
    }

    /// Waits, on the bound thread, until `attempt` gives a value or `deadline` passes
    /// (`None` then, after one last attempt).
    pub fn wait<T>(
        &self,
        deadline: Option<Instant>,
        yields: YieldBudget,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        debug_assert!(
            self.thread.get().map(Thread::id) == Some(std::thread::current().id()),
            "only the bound thread waits on a sleeper"
        );
        if let Some(value) = spin(deadline, &mut attempt, yields) {
            return Some(value);
        }
        self.park(deadline, attempt)
    }

    /// Like [`wait`](Self::wait), for a wait known to be long (an fsync, a fraction of a
    /// millisecond at best): parks at once, leaving the cores to the threads that do the
    /// work, instead of spinning and yielding first.
    pub fn wait_parked<T>(
        &self,
        deadline: Option<Instant>,
        attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        host::participate();
        self.park(deadline, attempt)
    }

    fn park<T>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        loop {
            self.asleep.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if let Some(value) = attempt() {
                self.asleep.store(false, Ordering::Relaxed);
                return Some(value);
            }
            if !park_until(deadline) {
                self.asleep.store(false, Ordering::Relaxed);
                return attempt();
            }
        }
    }
}

/// Any number of threads that may park waiting for one thing (a consumer's channel, which
/// several threads may read): a [`Sleeper`] for many. Ringing it costs a fence and a load
/// when nobody waits.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// How many threads are in `waiting` (read without the lock).
    count: AtomicUsize,
    waiting: Mutex<Vec<Thread>>,
}

impl Bell {
    /// Wakes every parked waiter: call after making what they wait for visible.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::Acquire) > 0 {
            for thread in lock(&self.waiting).iter() {
                thread.unpark();
            }
        }
    }

    /// Waits until `attempt` gives a value or `deadline` passes (`None` then, after one
    /// last attempt).
    pub fn wait<T>(
        &self,
        deadline: Option<Instant>,
        yields: YieldBudget,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        if let Some(value) = spin(deadline, &mut attempt, yields) {
            return Some(value);
        }
        self.park(deadline, attempt)
    }

    /// Like [`wait`](Self::wait), for a wait known to be long (deliveries of a durable
    /// queue come after an fsync): parks at once.
    pub fn wait_parked<T>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        if let Some(value) = attempt() {
            return Some(value);
        }
        host::participate();
        self.park(deadline, attempt)
    }

    fn park<T>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let me = std::thread::current();
        lock(&self.waiting).push(me.clone());
        // Listed before counted: a ringer that sees the count finds this thread in the list.
        self.count.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            fence(Ordering::SeqCst);
            if let Some(value) = attempt() {
                break Some(value);
            }
            if !park_until(deadline) {
                break attempt();
            }
        };
        self.count.fetch_sub(1, Ordering::SeqCst);
        let mut waiting = lock(&self.waiting);
        if let Some(i) = waiting.iter().position(|t| t.id() == me.id()) {
            waiting.swap_remove(i);
        }
        result
    }
}

/// Parks until unparked (or spuriously woken), or at most until `deadline`; `false`
/// without parking once the deadline has passed.
fn park_until(deadline: Option<Instant>) -> bool {
    match deadline {
        None => std::thread::park(),
        Some(at) => {
            let now = Instant::now();
            if now >= at {
                return false;
            }
            std::thread::park_timeout(at - now);
        }
    }
    true
}

/// The list is only pushed to and removed from: a panic while it is locked leaves it whole.
fn lock(waiting: &Mutex<Vec<Thread>>) -> std::sync::MutexGuard<'_, Vec<Thread>> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// The waiting before a park (steps 1 and 2 of the module docs): polls `attempt` with the
/// CPU's spin hint for at most [`SPIN`] when spinning pays, or [`busy_spin`] on a busy
/// host; then, on a host not busy, between yields for at most `yields` ([`YIELD_BUDGET`]
/// unless the broker says otherwise), until a group of yields is slow. Never past
/// `deadline`.
fn spin<T>(
    deadline: Option<Instant>,
    attempt: &mut impl FnMut() -> Option<T>,
    yields: YieldBudget,
) -> Option<T> {
    if let Some(value) = attempt() {
        return Some(value);
    }
    host::participate();
    let busy = host::busy();
    let spin_for = if busy { busy_spin() } else { SPIN };
    // When the clock was last read: waits without a deadline that do not spin read it
    // only after their first yields, and most of them end within those.
    let mut last = deadline.map(|_| Instant::now());
    if (busy && !spin_for.is_zero())
        || (!busy && host::spin_pays() && SPINNING.with(Spinning::should_spin))
    {
        let spin_end = cap(last.unwrap_or_else(Instant::now) + spin_for, deadline);
        let caught = 'spin: loop {
            for _ in 0..POLLS_PER_CLOCK_READ {
                std::hint::spin_loop();
                if let Some(value) = attempt() {
                    break 'spin Some(value);
                }
            }
            let now = Instant::now();
            last = Some(now);
            if now >= spin_end {
                break None;
            }
        };
        if !busy {
            SPINNING.with(|s| s.record(caught.is_some()));
        }
        if caught.is_some() {
            return caught;
        }
    }
    if busy || yields.0.is_zero() || deadline.zip(last).is_some_and(|(at, now)| now >= at) {
        return None;
    }
    let mut budget_end = last.map(|now| now + yields.0);
    loop {
        for _ in 0..YIELDS_PER_CLOCK_READ {
            std::thread::yield_now();
            if let Some(value) = attempt() {
                return Some(value);
            }
        }
        let now = Instant::now();
        if last.is_some_and(|before| now - before > SLOW_YIELDS)
            || budget_end.is_some_and(|end| now >= end)
            || deadline.is_some_and(|at| now >= at)
        {
            return None;
        }
        budget_end.get_or_insert(now + yields.0);
        last = Some(now);
    }
}

/// How long a wait may poll between yields of its core before it parks (step 2 of the
/// module docs): a broker's setting (`BrokerBuilder::yield_budget`), for every wait on it.
/// Zero: none, the wait parks after its spin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct YieldBudget(pub(crate) Duration);

impl Default for YieldBudget {
    fn default() -> Self {
        YieldBudget(YIELD_BUDGET)
    }
}

/// Caps `at` by an optional deadline.
fn cap(at: Instant, deadline: Option<Instant>) -> Instant {
    deadline.map_or(at, |d| d.min(at))
}

/// Whether spinning pays on this thread: a spin holds a core, which is waste when the
/// thread we wait for is not running (more of our threads than cores). A spin that catches
/// its value earns credit, one that does not loses some; without credit the thread skips
/// the spin, and tries it again every [`SPIN_PROBE_EVERY`] waits.
struct Spinning {
    credit: Cell<i32>,
    skipped: Cell<u32>,
}

const SPIN_CREDIT_MAX: i32 = 8;
const SPIN_PROBE_EVERY: u32 = 32;

impl Spinning {
    fn should_spin(&self) -> bool {
        if self.credit.get() >= 0 {
            return true;
        }
        let skipped = self.skipped.get() + 1;
        self.skipped.set(skipped % SPIN_PROBE_EVERY);
        skipped == SPIN_PROBE_EVERY
    }

    /// Credit stays within -1 ..= SPIN_CREDIT_MAX: below zero only says "skip".
    fn record(&self, caught: bool) {
        let credit = self.credit.get();
        self.credit.set(if caught {
            (credit.max(0) + 1).min(SPIN_CREDIT_MAX)
        } else {
            (credit - 1).max(-1)
        });
    }
}

thread_local! {
    static SPINNING: Spinning = const {
        Spinning { credit: Cell::new(0), skipped: Cell::new(0) }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// Many hand-offs between two threads, each waiting in turn for the other's value:
    /// a lost wake-up would leave one parked for ever and the test would hang.
    #[test]
    fn ping_pong_never_loses_a_wake_up() {
        let ping = Arc::new(Sleeper::current());
        let pong = Arc::new(Sleeper::default());
        let ball = Arc::new(AtomicU64::new(0));
        let rounds = 20_000u64;
        let other = {
            let (ping, pong, ball) = (ping.clone(), pong.clone(), ball.clone());
            std::thread::spawn(move || {
                pong.bind();
                for i in 0..rounds {
                    let want = 2 * i + 1;
                    pong.wait(None, YieldBudget::default(), || {
                        (ball.load(Ordering::Acquire) == want).then_some(())
                    });
                    ball.store(want + 1, Ordering::Release);
                    ping.wake();
                }
            })
        };
        for i in 0..rounds {
            ball.store(2 * i + 1, Ordering::Release);
            pong.wake();
            let want = 2 * i + 2;
            ping.wait(None, YieldBudget::default(), || {
                (ball.load(Ordering::Acquire) == want).then_some(())
            });
        }
        other.join().unwrap();
        assert_eq!(ball.load(Ordering::Acquire), 2 * rounds);
    }

    /// Threads parked on one bell each get a value: a ring wakes every waiter, and one
    /// that finds nothing parks again.
    #[test]
    fn a_bell_wakes_every_parked_waiter() {
        let bell = Arc::new(Bell::default());
        let (tx, rx) = crossbeam_channel::unbounded::<u32>();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (bell, rx) = (bell.clone(), rx.clone());
                std::thread::spawn(move || {
                    bell.wait(None, YieldBudget::default(), || rx.try_recv().ok())
                })
            })
            .collect();
        // Let them get past spinning and yielding to their park.
        while bell.count.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        for value in 0..3 {
            tx.send(value).unwrap();
            bell.ring();
        }
        let mut got: Vec<u32> = waiters
            .into_iter()
            .map(|w| w.join().unwrap().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(bell.count.load(Ordering::SeqCst), 0);
        assert!(lock(&bell.waiting).is_empty());
    }

    #[test]
    fn spins_that_keep_missing_stop_and_are_tried_again_now_and_then() {
        let s = Spinning {
            credit: Cell::new(0),
            skipped: Cell::new(0),
        };
        assert!(s.should_spin());
        s.record(false);
        // Out of credit: skipped, but for one probe in every SPIN_PROBE_EVERY waits.
        let spins = (0..3 * SPIN_PROBE_EVERY)
            .filter(|_| s.should_spin())
            .count();
        assert_eq!(spins, 3);
        // A probe that catches its value brings spinning back.
        s.record(true);
        assert!(s.should_spin());
        for _ in 0..100 {
            s.record(true);
        }
        assert_eq!(s.credit.get(), SPIN_CREDIT_MAX);
        // Credit earned is spent one miss at a time.
        for _ in 0..SPIN_CREDIT_MAX {
            s.record(false);
            assert!(s.should_spin());
        }
        s.record(false);
        assert!(!s.should_spin());
        // However long the misses go on, one caught probe brings spinning back.
        for _ in 0..1000 {
            s.record(false);
        }
        assert_eq!(s.credit.get(), -1);
        s.record(true);
        assert!(s.should_spin());
    }

    #[test]
    fn a_wait_with_a_deadline_gives_up_after_one_last_look() {
        let sleeper = Sleeper::current();
        let deadline = Instant::now() + Duration::from_millis(2);
        let mut polls = 0u32;
        let got: Option<()> = sleeper.wait(Some(deadline), YieldBudget::default(), || {
            polls += 1;
            None
        });
        assert_eq!(got, None);
        assert!(Instant::now() >= deadline);
        assert!(polls >= 2, "polled {polls} times");
    }

    #[test]
    fn a_wake_with_nobody_asleep_leaves_the_flag_down() {
        let sleeper = Sleeper::current();
        sleeper.wake();
        assert!(!sleeper.asleep.load(Ordering::Relaxed));
        assert_eq!(
            sleeper.wait(None, YieldBudget::default(), || Some(7)),
            Some(7)
        );
    }
}
