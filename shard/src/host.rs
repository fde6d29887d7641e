//! Whether other work keeps this machine's cores busy, which decides how the broker's
//! threads wait for each other (see `wait.rs`).
//!
//! On a machine whose cores only our own threads want, a waiting thread does best to
//! yield: the core goes straight to another of our threads, which is what it waits for or
//! something that leads to it, and neither side makes a futex call. Beside threads that
//! never sleep (another process's, or the service's own threads that never wait on the
//! broker) a yield is ruinous: Linux's EEVDF scheduler pushes the yielding thread's
//! deadline back by a slice, so the busy thread runs its whole slice first, a millisecond
//! or more for a hand-off that takes microseconds. There a thread must park, and a shard
//! does best with a short slice, so that when woken it preempts the busy thread at once.
//!
//! Neither a slow yield nor a late wake-up tells the two machines apart: with many more of
//! our threads than cores, a yield now and then waits out a whole round of them. What
//! does is where the CPU time goes. Every [`HOST_SAMPLE_EVERY`] a sampler thread reads how
//! long the machine's cores were busy (`/proc/stat`) and how much of that our
//! participants ran (each one's `/proc/self/task/<tid>/schedstat`): the threads that
//! wait on the broker or poll its futures, the shard threads among them. What is left is
//! the foreign load. The host counts as busy while that load takes at least
//! [`BUSY_FOREIGN`] of a core and leaves the machine without a spare half core; it
//! counts as idle again once the foreign load falls below [`IDLE_FOREIGN`], or the
//! machine has a whole core to spare (there the scheduler puts our threads where the busy
//! ones are not). Where the files cannot be read the host counts as busy: a parked
//! thread is slower on an idle host, but a yielding one beside busy threads can be a
//! hundred times slower. The figures are the whole machine's: a process confined to some
//! of its cores (an affinity mask, a cpuset) counts what runs on the others as well, and
//! so may park where it could have yielded, the same safe side.
//!
//! The same samples say whether a brief spin before a yield pays ([`spin_pays`]): only
//! while the participants that ran a good part of the window ([`ACTIVE_RUN`]) are no more
//! than the cores and one. A spin catches its answer only when whoever gives it runs on
//! another core; with more of our busy threads than that, the spinner mostly holds a core
//! that the one it waits for needs. With 4 producers and 4 consumers on two cores the spin
//! cost 7 % of the rate; with one of each it doubled the rate.
//!
//! The sampler parks while no participant has waited since its last sample, so an idle
//! process is not woken ten times a second.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the sampler looks. `/proc/stat` counts in hundredths of a second, so one
/// window of two cores holds 20 of them: a foreign load is read to within a tenth of a
/// core, and a host that turns busy is seen within two windows.
pub const HOST_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The foreign load, in cores, from which a saturated host counts as busy.
pub(crate) const BUSY_FOREIGN: f64 = 0.5;

/// The foreign load, in cores, under which a busy host counts as idle again.
pub(crate) const IDLE_FOREIGN: f64 = 0.25;

/// A machine with fewer idle cores than this is saturated: a yield there finds another
/// runnable thread on its core, ours or not.
pub(crate) const SATURATED_IDLE: f64 = 0.5;

/// A machine with this many idle cores has room for our threads beside the busy ones.
pub(crate) const SPARE_IDLE: f64 = 1.0;

/// A participant that ran this long in a window counts as active for [`spin_pays`].
pub(crate) const ACTIVE_RUN: Duration = Duration::from_millis(5);

/// The most participants the sampler follows; one past it counts as foreign, which can
/// only make the host look busy (parks: the safe side).
const MAX_PARTICIPANTS: usize = 1024;

/// What the sampler last saw, as [`host_load`] reports it.
///
/// ```
/// # mod leasemq { pub use leasemq_shard::*; }
/// let load = leasemq::host_load();
/// assert!(load.busy_windows <= load.windows);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct HostLoad {
    /// Whether the broker's threads now wait as on a busy host: they park instead of
    /// yielding, and shard threads run short time slices.
    pub busy: bool,
    /// Cores kept busy by threads that do not wait on the broker, over the last window.
    pub foreign_cores: f64,
    /// Cores left idle over the last window.
    pub idle_cores: f64,
    /// Threads waiting on the broker that ran at least 5 ms of the last window.
    pub active_participants: usize,
    /// Windows sampled since the process started.
    pub windows: u64,
    /// How many of them ended with the host counted as busy.
    pub busy_windows: u64,
}

/// What the sampler last saw: whether the broker's threads wait as on a busy host, and
/// the figures behind it. Sampling starts with the first wait on any broker, and pauses
/// while none waits.
pub fn host_load() -> HostLoad {
    let mut load = *lock(&sampler().report);
    load.busy = busy();
    load
}

/// Whether the host counts as busy (see the module docs).
#[inline]
pub(crate) fn busy() -> bool {
    BUSY.load(Ordering::Relaxed)
}

static BUSY: AtomicBool = AtomicBool::new(false);

/// Whether a waiting thread may spin before it yields (see the module docs).
#[inline]
pub(crate) fn spin_pays() -> bool {
    SPIN_PAYS.load(Ordering::Relaxed)
}

static SPIN_PAYS: AtomicBool = AtomicBool::new(true);

/// Set by a participant that waits, cleared by each sample: whether the sampler has
/// anyone to sample for.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Says that the calling thread waits on the broker or polls one of its futures: its CPU
/// time is ours, not a foreign load. Cheap after the first call on a thread: a
/// thread-local flag and a load.
#[inline]
pub(crate) fn participate() {
    // A thread whose locals are being torn down has already left.
    let _ = MEMBERSHIP.try_with(|membership| {
        if !membership.joined.get() {
            membership.join();
        }
    });
    if !ACTIVE.load(Ordering::Relaxed) {
        sampler().resume();
    }
}

thread_local! {
    static MEMBERSHIP: Membership = const {
        Membership { joined: Cell::new(false), tid: Cell::new(None) }
    };
}

/// A thread's place among the participants, given up when the thread ends.
struct Membership {
    joined: Cell<bool>,
    /// The thread's id, once it joined; `None` where it could not be read.
    tid: Cell<Option<u32>>,
}

impl Membership {
    /// Adds the calling thread to the participants the sampler follows, counting its run
    /// time from now.
    #[cold]
    fn join(&self) {
        self.joined.set(true);
        let Some(tid) = own_tid() else { return };
        let mut participants = lock(&sampler().participants);
        if participants.list.len() < MAX_PARTICIPANTS {
            self.tid.set(Some(tid));
            participants.list.push(Participant {
                tid,
                ran: own_run_time(),
            });
        }
    }
}

impl Drop for Membership {
    /// The thread ends: what it ran since the last sample still counts as ours.
    fn drop(&mut self) {
        let Some(tid) = self.tid.get() else { return };
        let ran = own_run_time();
        let mut participants = lock(&sampler().participants);
        if let Some(i) = participants.list.iter().position(|p| p.tid == tid) {
            let gone = participants.list.swap_remove(i);
            if let (Some(before), Some(now)) = (gone.ran, ran) {
                participants.exited += now.saturating_sub(before);
            }
        }
    }
}

/// The calling thread's id, read from `/proc/thread-self` (`<pid>/task/<tid>`).
fn own_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The calling thread's run time so far, in nanoseconds.
fn own_run_time() -> Option<u64> {
    run_time(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// The threads the sampler follows, and what those that ended ran since its last look.
struct Participants {
    list: Vec<Participant>,
    exited: u64,
}

struct Participant {
    tid: u32,
    /// Its run time at the last sample, in nanoseconds; `None` before the first.
    ran: Option<u64>,
}

/// The process's sampler: the participants it follows, its report, and the thread that
/// samples, started by the first participant and resumed by the first after a pause.
struct Sampler {
    participants: Mutex<Participants>,
    report: Mutex<HostLoad>,
    started: OnceLock<()>,
    /// Held while the sampler decides to pause, and by whoever resumes it.
    pause: Mutex<()>,
    resume: Condvar,
}

fn sampler() -> &'static Sampler {
    static SAMPLER: Sampler = Sampler {
        participants: Mutex::new(Participants {
            list: Vec::new(),
            exited: 0,
        }),
        report: Mutex::new(HostLoad {
            busy: false,
            foreign_cores: 0.0,
            idle_cores: 0.0,
            active_participants: 0,
            windows: 0,
            busy_windows: 0,
        }),
        started: OnceLock::new(),
        pause: Mutex::new(()),
        resume: Condvar::new(),
    };
    &SAMPLER
}

impl Sampler {
    /// Says that a participant waits: starts the sampler thread on the first call, and
    /// wakes it if it paused. A system that cannot start the thread leaves the host
    /// counted as busy.
    #[cold]
    fn resume(&'static self) {
        self.started.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("leasemq-host".into())
                .spawn(move || self.run());
            if started.is_err() {
                BUSY.store(true, Ordering::Relaxed);
            }
        });
        ACTIVE.store(true, Ordering::Relaxed);
        // Under the lock, so that a sampler deciding to pause either sees the flag or is
        // already waiting for this notification.
        let _pause = lock(&self.pause);
        self.resume.notify_one();
    }

    fn run(&self) -> ! {
        let mut last: Option<Reading> = None;
        loop {
            if !ACTIVE.swap(false, Ordering::Relaxed) {
                // Nobody waited since the last look: pause until somebody does, and start
                // the next window afresh.
                let mut pause = lock(&self.pause);
                while !ACTIVE.load(Ordering::Relaxed) {
                    pause = self.resume.wait(pause).unwrap_or_else(|e| e.into_inner());
                }
                drop(pause);
                last = None;
            }
            let now = self.read();
            if let (Some(before), Some(after)) = (&last, &now) {
                let window = Window::between(before, after);
                let busy = judge(busy(), &window);
                BUSY.store(busy, Ordering::Relaxed);
                SPIN_PAYS.store(window.spin_pays(), Ordering::Relaxed);
                let mut report = lock(&self.report);
                report.foreign_cores = window.foreign_cores();
                report.idle_cores = window.idle_cores();
                report.active_participants = window.active;
                report.windows += 1;
                report.busy_windows += u64::from(busy);
            } else if now.is_none() {
                // Nothing to read: the safe side (see the module docs).
                BUSY.store(true, Ordering::Relaxed);
            }
            last = now;
            std::thread::sleep(HOST_SAMPLE_EVERY);
        }
    }

    /// The machine's CPU times and our participants' run time now; `None` when
    /// `/proc/stat` cannot be read. A participant whose thread is gone leaves the list.
    fn read(&self) -> Option<Reading> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let machine = MachineTimes::parse(&stat)?;
        let at = Instant::now();
        let mut participants = lock(&self.participants);
        let mut ours = std::mem::take(&mut participants.exited);
        let mut active = 0;
        let active_run = ACTIVE_RUN.as_nanos() as u64;
        participants.list.retain_mut(|p| {
            let path = format!("/proc/self/task/{}/schedstat", p.tid);
            let Some(ran) = std::fs::read_to_string(path)
                .ok()
                .and_then(|text| run_time(&text))
            else {
                return false;
            };
            // One whose run time could not be read when it joined counts from here on.
            let delta = ran.saturating_sub(p.ran.unwrap_or(ran));
            ours += delta;
            active += usize::from(delta >= active_run);
            p.ran = Some(ran);
            true
        });
        Some(Reading {
            at,
            machine,
            ours,
            active,
        })
    }
}

/// One look of the sampler: the machine's CPU times, and what our participants ran since
/// the look before.
struct Reading {
    at: Instant,
    machine: MachineTimes,
    ours: u64,
    /// How many participants ran at least [`ACTIVE_RUN`] since the look before.
    active: usize,
}

/// The machine's CPU times from `/proc/stat`'s first line, in its units (hundredths of a
/// second), and how many CPUs it counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MachineTimes {
    busy: u64,
    idle: u64,
    cpus: usize,
}

impl MachineTimes {
    /// Reads `/proc/stat`: the `cpu` line's user, nice, system, irq and softirq (guest
    /// time is counted in user) as busy, idle and iowait as idle. Steal is neither: time
    /// the hypervisor took is no core that a yield could give away. `None` when the first
    /// line is not the `cpu` line or is short of fields.
    pub(crate) fn parse(stat: &str) -> Option<MachineTimes> {
        let mut lines = stat.lines();
        let mut fields = lines.next()?.split_ascii_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let v: Vec<u64> = fields
            .take(7)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let [user, nice, system, idle, iowait, irq, softirq] = v[..] else {
            return None;
        };
        let cpus = lines
            .take_while(|l| l.starts_with("cpu"))
            .filter(|l| l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        (cpus > 0).then_some(MachineTimes {
            busy: user + nice + system + irq + softirq,
            idle: idle + iowait,
            cpus,
        })
    }
}

/// A thread's run time in nanoseconds: the first field of its `schedstat`.
pub(crate) fn run_time(schedstat: &str) -> Option<u64> {
    schedstat.split_ascii_whitespace().next()?.parse().ok()
}

/// What one window between two looks saw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Window {
    /// Cores busy on average.
    pub busy_cores: f64,
    /// Cores our participants kept busy on average.
    pub our_cores: f64,
    /// The machine's CPUs.
    pub cpus: f64,
    /// Participants that ran at least [`ACTIVE_RUN`].
    pub active: usize,
}

impl Window {
    fn between(before: &Reading, after: &Reading) -> Window {
        let busy = after.machine.busy.saturating_sub(before.machine.busy) as f64;
        let idle = after.machine.idle.saturating_sub(before.machine.idle) as f64;
        let cpus = after.machine.cpus as f64;
        let busy_cores = if busy + idle > 0.0 {
            cpus * busy / (busy + idle)
        } else {
            0.0
        };
        let wall = after.at.saturating_duration_since(before.at).as_nanos() as f64;
        let our_cores = if wall > 0.0 {
            after.ours as f64 / wall
        } else {
            0.0
        };
        Window {
            busy_cores,
            our_cores,
            cpus,
            active: after.active,
        }
    }

    /// Whether a waiting thread may spin: no more active participants than the cores and
    /// one (see the module docs).
    pub fn spin_pays(&self) -> bool {
        self.active as f64 <= self.cpus + 1.0
    }

    /// Cores busy with threads that are not ours.
    pub fn foreign_cores(&self) -> f64 {
        (self.busy_cores - self.our_cores).max(0.0)
    }

    /// Cores left idle.
    pub fn idle_cores(&self) -> f64 {
        (self.cpus - self.busy_cores).max(0.0)
    }
}

/// Whether the host counts as busy after `window`, given whether it did before: the
/// thresholds of the module docs, with room between entering and leaving so that a load
/// near one of them does not flip the waits every window.
pub(crate) fn judge(was_busy: bool, window: &Window) -> bool {
    let foreign = window.foreign_cores();
    let idle = window.idle_cores();
    if was_busy {
        !(foreign < IDLE_FOREIGN || idle >= SPARE_IDLE)
    } else {
        foreign >= BUSY_FOREIGN && idle < SATURATED_IDLE
    }
}

/// The lists are only pushed to, pruned and overwritten: a panic while one is locked
/// leaves it whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  4705 356 584 3699176 23 0 15 7 0 0\n\
                        cpu0 1393 280 290 1848346 11 0 12 3 0 0\n\
                        cpu1 3312 76 294 1850830 12 0 3 4 0 0\n\
                        intr 1462898 ...\n\
                        ctxt 4123 ...\n";

    #[test]
    fn proc_stat_gives_busy_and_idle_time_and_the_cpus() {
        assert_eq!(
            MachineTimes::parse(STAT),
            Some(MachineTimes {
                busy: 4705 + 356 + 584 + 15,
                idle: 3699176 + 23,
                cpus: 2,
            })
        );
        // Not the aggregate line first, or short of fields: nothing to go on.
        assert_eq!(MachineTimes::parse("cpu0 1 2 3 4 5 6 7\n"), None);
        assert_eq!(MachineTimes::parse("cpu 1 2 3\ncpu0 1 2 3\n"), None);
        assert_eq!(MachineTimes::parse("cpu 1 2 3 4 5 6 x\ncpu0 1\n"), None);
        assert_eq!(MachineTimes::parse(""), None);
        // An aggregate without any CPU's line counts no CPU.
        assert_eq!(MachineTimes::parse("cpu 1 2 3 4 5 6 7\nintr 1\n"), None);
    }

    #[test]
    fn schedstat_gives_the_run_time() {
        assert_eq!(run_time("79158 64967 2\n"), Some(79158));
        assert_eq!(run_time(""), None);
        assert_eq!(run_time("x 1 2"), None);
    }

    #[test]
    fn this_machine_reads() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let machine = MachineTimes::parse(&stat).unwrap();
        let cpus = std::thread::available_parallelism().unwrap().get();
        // Affinity may leave this process fewer CPUs than the machine has.
        assert!(machine.cpus >= cpus, "{machine:?} against {cpus}");
        // A thread's run time is brought up to date when it is switched out or the
        // scheduler ticks, so a thread that has just started may read 0: only that it
        // reads is checked, and that it never goes back.
        let tid = own_tid().unwrap();
        let read = || {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
                .ok()
                .and_then(|s| run_time(&s))
                .unwrap()
        };
        let first = read();
        std::thread::yield_now();
        assert!(read() >= first);
        assert!(own_run_time().is_some());
    }

    fn window(busy_cores: f64, our_cores: f64, cpus: f64) -> Window {
        Window {
            busy_cores,
            our_cores,
            cpus,
            active: 0,
        }
    }

    #[test]
    fn spinning_pays_with_no_more_active_threads_than_cores_and_one() {
        let with = |active, cpus| Window {
            active,
            ..window(1.0, 1.0, cpus)
        };
        // One producer, one consumer and a shard on two cores.
        assert!(with(3, 2.0).spin_pays());
        // Four of each and two shards.
        assert!(!with(10, 2.0).spin_pays());
        assert!(with(17, 16.0).spin_pays());
        assert!(!with(18, 16.0).spin_pays());
    }

    #[test]
    fn a_saturated_host_with_a_foreign_load_is_busy() {
        // Two cores full, one of them ours: another's threads took the other.
        assert!(judge(false, &window(2.0, 1.0, 2.0)));
        // Two cores full, all ours: many of our threads on few cores.
        assert!(!judge(false, &window(2.0, 1.9, 2.0)));
        // A foreign half core beside our idle threads: room to spare.
        assert!(!judge(false, &window(0.6, 0.1, 2.0)));
        // Many cores, some of them busy with other work, a whole one idle.
        assert!(!judge(false, &window(12.0, 4.0, 16.0)));
        assert!(judge(false, &window(15.8, 4.0, 16.0)));
    }

    #[test]
    fn a_busy_host_stays_busy_until_the_load_clearly_goes() {
        // Between the thresholds: each state stays as it was.
        let between = window(2.0, 1.6, 2.0);
        assert!(judge(true, &between));
        assert!(!judge(false, &between));
        // The foreign load gone, or a core to spare.
        assert!(!judge(true, &window(2.0, 1.8, 2.0)));
        assert!(!judge(true, &window(1.0, 0.2, 2.0)));
        // Our participants ran more than the machine counted (they are measured to the
        // nanosecond, the machine in hundredths): no foreign load, never a negative one.
        assert_eq!(window(1.0, 1.3, 2.0).foreign_cores(), 0.0);
        assert_eq!(window(2.1, 1.3, 2.0).idle_cores(), 0.0);
    }

    #[test]
    fn a_thread_that_waits_joins_once() {
        let count = |tid: u32| {
            lock(&sampler().participants)
                .list
                .iter()
                .filter(|p| p.tid == tid)
                .count()
        };
        std::thread::spawn(move || {
            participate();
            participate();
            assert_eq!(count(own_tid().unwrap()), 1);
        })
        .join()
        .unwrap();
    }
}
