//! How one thread waits for another: spin while spinning pays, yield only while yielding
//! works, then park.
//!
//! Every hand-off of the broker (a caller waiting for its answer, a shard waiting for
//! requests, a consumer thread waiting for a delivery) goes through [`Sleeper::wait`] or
//! [`Bell::wait`]:
//!
//! 1. poll with the CPU's spin hint for at most [`SPIN`]: a round trip whose two sides are
//!    both on a core completes within it. A thread whose spins keep missing (more of our
//!    threads than cores: the one it waits for is not running) stops spinning, and tries
//!    again now and then ([`Spinning`]);
//! 2. poll between `yield_now` calls for at most the broker's [`YieldBudget`]
//!    ([`YIELD_BUDGET`] by default): on an idle machine with more of our threads than
//!    cores, a yield passes the core to one of them at once, and the core neither goes
//!    idle nor costs a futex call on either side;
//! 3. park on a futex until the other side wakes this thread.
//!
//! A busy host changes the sums. When other threads (the embedding service's own, or
//! another process's) keep the cores busy, a yield hands one of them a whole time slice
//! (milliseconds), and a woken thread may wait in the run queue for part of a slice before
//! it runs. Worse, a yield is often not slow at all: a thread that slept a while is owed
//! CPU time, the scheduler picks it again at once, and its yields only spend what it is
//! owed, so that it waits all the longer the next time it needs a core. So one slow
//! yield makes every thread of the process treat the host as busy for [`BUSY_HOLD`], and
//! one wake-up that reached its core more than [`LATE_WAKE`] after the unpark for
//! [`LATE_WAKE_HOLD`]: they skip step 2. Where shard threads run with the system's time
//! slice, a waiting thread then also spins longer in step 1 ([`BUSY_SPIN`]), to catch its
//! answer while it still holds a core; where they have a short one (see `slice.rs`), it
//! does not spin at all: a woken shard preempts a busy thread at once, but the wake-up
//! itself (an interrupt to a core running another thread) takes longer than a spin worth
//! its cost, so the spin would only burn the share of the CPU the host leaves us, and a
//! thread that sleeps rather than spins is also the one the scheduler runs first when it
//! wakes. No spin and no yield loop lasts longer than its time bound.
//!
//! The wake is cheap when nobody sleeps: a fence and a load of the `asleep` flag (a count
//! for a [`Bell`]), the "is anyone waiting" check of crossbeam's `SyncWaker`; only a thread
//! that set the flag is unparked. The waiter sets the flag and then looks once more; the
//! waker publishes its value and then reads the flag. With a sequentially consistent fence
//! on each side, at least one of them sees the other, so no wake-up is lost.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a thread that lately saw a slow yield spins before it parks, while shard
/// threads run with the system's time slice. Beside busy threads a parked thread, once
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

/// A yield that took longer than this gave the core to a thread that ran a time slice
/// (a default slice is 0.75 ms at the least): the host is busy, and yielding
/// again would wait out more slices. Our own threads, between two waits, seldom run this
/// long, so an idle host is seldom taken for a busy one.
const SLOW_YIELD: Duration = Duration::from_micros(500);

/// How long the process counts the host as busy after a slow yield or a late wake-up:
/// each new look may cost a slow yield, a time slice given away, so a busy host is looked
/// at again only a few times a second. (A budget of yields that runs out is no such sign:
/// a consumer of a quiet queue meets it all the time.)
const BUSY_HOLD: Duration = Duration::from_millis(250);

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
    /// When the waiter was last unparked ([`stamp`]), so that it can tell how long it
    /// waited for a core once woken.
    woken_at: AtomicU64,
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
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) && self.asleep.swap(false, Ordering::Relaxed) {
            if let Some(thread) = self.thread.get() {
                self.woken_at
                    .store(stamp(Instant::now()), Ordering::Relaxed);
                thread.unpark();
            }
        }
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
            if !park_until(deadline, &self.woken_at) {
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
    /// When it last unparked its waiters ([`stamp`]).
    rung_at: AtomicU64,
}

impl Bell {
    /// Wakes every parked waiter: call after making what they wait for visible.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::Acquire) > 0 {
            self.rung_at.store(stamp(Instant::now()), Ordering::Relaxed);
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
            if !park_until(deadline, &self.rung_at) {
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
/// without parking once the deadline has passed. `woken_at` is where the waker stamps
/// the unpark: a thread that got a core long after it was woken counts the host as busy.
fn park_until(deadline: Option<Instant>, woken_at: &AtomicU64) -> bool {
    let parked_at = Instant::now();
    match deadline {
        None => std::thread::park(),
        Some(at) => {
            if parked_at >= at {
                return false;
            }
            std::thread::park_timeout(at - parked_at);
        }
    }
    let now = Instant::now();
    if woke_late(
        stamp(parked_at),
        woken_at.load(Ordering::Relaxed),
        stamp(now),
    ) {
        HOST_BUSY_UNTIL.fetch_max(stamp(now + LATE_WAKE_HOLD), Ordering::Relaxed);
    }
    true
}

/// A thread that got its core this long after it was unparked waited in a run queue
/// behind other threads' time slices: our own threads, between two waits, seldom run that
/// long, and on an idle machine with more of them than cores they pass the core on with
/// yields.
const LATE_WAKE: Duration = Duration::from_millis(3);

/// How long the process counts the host as busy after a late wake-up. Unlike a slow yield,
/// a wake-up costs nothing to look at again, and on a busy host late ones keep coming; a
/// short hold bounds what a rare late one on an idle host costs (a stall of the machine
/// itself, which makes every thread late), since without yields an idle host's hand-offs
/// between more of our threads than cores slow down many times over.
const LATE_WAKE_HOLD: Duration = Duration::from_millis(20);

/// Whether a thread parked at `parked` and running again at `now` was woken (at `woken`,
/// no earlier than it parked: an older stamp is another wait's) more than [`LATE_WAKE`]
/// before it ran. All three are [`stamp`]s.
fn woke_late(parked: u64, woken: u64, now: u64) -> bool {
    woken >= parked && now.saturating_sub(woken) > LATE_WAKE.as_nanos() as u64
}

/// `at` as nanoseconds since a process-wide origin, plus one: 0 stands for "never".
fn stamp(at: Instant) -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let nanos = at.saturating_duration_since(origin).as_nanos();
    u64::try_from(nanos).map_or(u64::MAX, |n| n.saturating_add(1))
}

/// The list is only pushed to and removed from: a panic while it is locked leaves it whole.
fn lock(waiting: &Mutex<Vec<Thread>>) -> std::sync::MutexGuard<'_, Vec<Thread>> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// The waiting before a park (steps 1 and 2 of the module docs): polls `attempt` with the
/// CPU's spin hint for at most [`SPIN`] when spinning pays, or [`busy_spin`] on a busy
/// host; then, on a host not busy, between yields for at most `yields` ([`YIELD_BUDGET`]
/// unless the broker says otherwise). Never past `deadline`.
fn spin<T>(
    deadline: Option<Instant>,
    attempt: &mut impl FnMut() -> Option<T>,
    yields: YieldBudget,
) -> Option<T> {
    if let Some(value) = attempt() {
        return Some(value);
    }
    let mut now = Instant::now();
    let busy = stamp(now) < HOST_BUSY_UNTIL.load(Ordering::Relaxed);
    let spin_for = if busy { busy_spin() } else { SPIN };
    if (busy && !spin_for.is_zero()) || (!busy && SPINNING.with(Spinning::should_spin)) {
        let spin_end = cap(now + spin_for, deadline);
        let caught = 'spin: loop {
            for _ in 0..POLLS_PER_CLOCK_READ {
                std::hint::spin_loop();
                if let Some(value) = attempt() {
                    break 'spin Some(value);
                }
            }
            now = Instant::now();
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
    if busy || yields.0.is_zero() {
        return None;
    }
    let budget_end = now + yields.0;
    loop {
        if deadline.is_some_and(|at| now >= at) {
            return None;
        }
        std::thread::yield_now();
        if let Some(value) = attempt() {
            return Some(value);
        }
        let after = Instant::now();
        if after - now > SLOW_YIELD {
            HOST_BUSY_UNTIL.fetch_max(stamp(after + BUSY_HOLD), Ordering::Relaxed);
            return None;
        }
        if after >= budget_end {
            return None;
        }
        now = after;
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

/// Until when every thread of the process counts the host as busy ([`stamp`]; see
/// [`BUSY_HOLD`]). One thread's slow yield or late wake-up speaks for all: they share the
/// cores, and a thread that has not looked for itself would otherwise keep yielding.
static HOST_BUSY_UNTIL: AtomicU64 = AtomicU64::new(0);

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

    /// A wake-up counts as late only when its stamp belongs to this wait (no earlier than
    /// the park) and the thread ran more than `LATE_WAKE` after it.
    #[test]
    fn only_a_wake_up_of_this_wait_that_came_late_counts() {
        let ms = |n: u64| n * 1_000_000;
        let late = LATE_WAKE.as_nanos() as u64;
        let parked = ms(100);
        // Woken 1 ms after the park, running right after, or just within the bound.
        assert!(!woke_late(parked, parked + ms(1), parked + ms(1) + 1_000));
        assert!(!woke_late(parked, parked + ms(1), parked + ms(1) + late));
        // Running more than the bound after the unpark.
        assert!(woke_late(parked, parked + ms(1), parked + ms(1) + late + 1));
        assert!(woke_late(parked, parked, parked + late + 1));
        // A stamp from before the park is another wait's: a timeout or a spurious
        // wake-up long after it says nothing, nor does a sleeper never woken.
        assert!(!woke_late(parked, parked - 1, parked + ms(50)));
        assert!(!woke_late(parked, 0, parked + ms(50)));
    }

    /// Stamps never read "never", and keep the order of the instants they stamp.
    #[test]
    fn stamps_are_ordered_and_never_zero() {
        // The origin is set by the first stamp: an instant before it stamps as 1.
        assert!(stamp(Instant::now()) >= 1);
        let early = Instant::now();
        let later = early + Duration::from_micros(3);
        assert!(stamp(early) >= 1);
        assert!(stamp(later) > stamp(early));
        assert_eq!(stamp(later) - stamp(early), 3_000);
    }
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
