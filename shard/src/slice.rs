//! The scheduler time slice a thread asks for: how the broker's shard threads, and any
//! caller thread that wants to, keep their hand-offs quick on a host whose other threads
//! keep the cores busy.
//!
//! Linux's EEVDF scheduler (6.6 and later) gives every runnable thread a virtual deadline
//! one time slice after it becomes eligible. A thread that wakes with a short slice has an
//! early deadline, so it preempts a CPU-bound thread at once instead of waiting in the run
//! queue for part of that thread's slice (about 1.4 ms by default on two cores). Since Linux
//! 6.12 a normal (`SCHED_OTHER`) thread may ask for its own slice, from 0.1 ms to 100 ms,
//! through `sched_setattr`'s `sched_runtime`, without any privilege. The thread's share of
//! the CPU does not change; only how soon it runs after a wake-up, and how soon it is
//! preempted in turn, which suits a thread that mostly sleeps and answers others.
//!
//! Older kernels ignore `sched_runtime` for normal threads, so asking is harmless there.
//!
//! A shard thread runs its short slice only while the host is busy ([`BusySlice`]). On a
//! host whose cores only our own threads want, the waits yield instead of parking
//! (`wait.rs`), and there a short slice is harmful: a yield pushes the yielding thread's
//! deadline back by one of its slices, so a shard whose slice is a tenth of its callers'
//! is picked again and again to look at an empty inbox while the callers that would fill
//! it wait. With 8 producers and 8 consumers on two cores the short slice cost 55–75 % of
//! the idle rate.

// `sched_setattr` has no safe wrapper in a crate we use (nor in glibc before 2.41); the two
// calls below are the only unsafe code of this crate.
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

/// The shortest slice the kernel grants (it clamps shorter requests to this).
pub const MIN_TIME_SLICE: Duration = Duration::from_micros(100);

/// The longest slice the kernel grants.
pub const MAX_TIME_SLICE: Duration = Duration::from_millis(100);

/// Asks the scheduler to give the calling thread time slices of `slice` (Linux 6.12 and
/// later; older kernels accept the request and keep their default). The thread keeps its
/// policy and nice value. A shorter slice lets the thread, when woken, preempt a busy
/// thread sooner, which is what a thread that makes many small calls to a broker on a busy
/// host wants (see [`BrokerBuilder::shard_time_slice`](crate::BrokerBuilder::shard_time_slice),
/// which does this for the shard threads).
///
/// # Errors
///
/// - [`io::ErrorKind::InvalidInput`] when `slice` is outside [`MIN_TIME_SLICE`] ..=
///   [`MAX_TIME_SLICE`], or the thread runs under a real-time or deadline policy, whose
///   slices are set otherwise;
/// - [`io::ErrorKind::Unsupported`] on systems other than Linux;
/// - the system's error when it refuses the call (a seccomp filter, say).
///
/// ```
/// # mod leasemq { pub use leasemq_shard::*; }
/// use std::time::Duration;
///
/// // On Linux this succeeds for any normal thread; elsewhere it says it is unsupported.
/// let asked = leasemq::set_thread_time_slice(Duration::from_micros(200));
/// assert!(asked.is_ok() || !cfg!(target_os = "linux"));
/// ```
pub fn set_thread_time_slice(slice: Duration) -> io::Result<()> {
    if !(MIN_TIME_SLICE..=MAX_TIME_SLICE).contains(&slice) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a time slice must be from 100 µs to 100 ms, got {slice:?}"),
        ));
    }
    set(slice)
}

/// A shard thread's time slice: the short one it asks for while the host is busy, the one
/// it started with otherwise (see the module docs). Lives on its thread.
#[derive(Debug)]
pub(crate) struct BusySlice {
    /// The short slice, as `sched_runtime` (nanoseconds).
    short: u64,
    /// The slice the thread started with, as `sched_runtime`: as the kernel reports it,
    /// which from Linux 6.12 on is the length of the system's slice for a thread that
    /// never asked for one.
    own: u64,
    /// Whether the thread runs the short slice now.
    short_now: bool,
}

impl BusySlice {
    /// For the calling thread, which runs `short` from now until the first
    /// [`follow`](Self::follow): `None` when the system refuses or ignores it (then the
    /// thread keeps the slice it has).
    pub fn new(short: Duration) -> Option<BusySlice> {
        #[cfg(target_os = "linux")]
        {
            let own = current().ok()?.sched_runtime;
            set_thread_time_slice(short).ok()?;
            if !honoured(short) {
                return None;
            }
            Some(BusySlice {
                short: u64::try_from(short.as_nanos()).unwrap_or(u64::MAX),
                own,
                short_now: true,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = short;
            None
        }
    }

    /// Runs the short slice if the host is `busy`, the thread's own otherwise: a system
    /// call only when that changes. A refusal leaves the slice as it was, and is not
    /// asked again until the host changes again.
    pub fn follow(&mut self, busy: bool) {
        if busy != self.short_now {
            self.short_now = busy;
            let _ = set_runtime(if busy { self.short } else { self.own });
        }
    }
}

/// Whether the calling thread now runs with time slices of `slice`: the kernel reads back
/// what was asked (kernels before 6.12 accept the request and report no slice of their own).
#[cfg(target_os = "linux")]
fn honoured(slice: Duration) -> bool {
    current().is_ok_and(|attr| u128::from(attr.sched_runtime) == slice.as_nanos())
}

fn set(slice: Duration) -> io::Result<()> {
    set_runtime(u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX))
}

/// Sets the calling thread's `sched_runtime`, keeping the rest.
#[cfg(target_os = "linux")]
fn set_runtime(runtime: u64) -> io::Result<()> {
    let mut attr = current()?;
    if attr.sched_policy != libc::SCHED_OTHER as u32
        && attr.sched_policy != libc::SCHED_BATCH as u32
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the thread runs under a real-time or deadline policy",
        ));
    }
    // Only reset-on-fork is a flag the kernel reports back for a normal thread; keep it.
    attr.sched_flags &= libc::SCHED_FLAG_RESET_ON_FORK as u64;
    attr.sched_runtime = runtime;
    // SAFETY: `attr` is a valid, fully initialised `sched_attr` whose `size` field says how
    // much of it the kernel may read; pid 0 is the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's scheduling attributes, so that a change of slice keeps the rest.
#[cfg(target_os = "linux")]
fn current() -> io::Result<libc::sched_attr> {
    let size = std::mem::size_of::<libc::sched_attr>() as u32;
    let mut attr = libc::sched_attr {
        size,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: the kernel writes at most `size` bytes into `attr`, which has that size;
    // pid 0 is the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut libc::sched_attr,
            size,
            0,
        )
    };
    if rc == 0 {
        // The kernel may have written its own structure's size; ours is what it reads.
        attr.size = size;
        Ok(attr)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_runtime(_runtime: u64) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "a thread's time slice can be set on Linux only",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_slice_out_of_range_is_refused_before_the_kernel_sees_it() {
        for slice in [
            Duration::ZERO,
            Duration::from_micros(99),
            Duration::from_millis(101),
        ] {
            let err = set_thread_time_slice(slice).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{slice:?}");
        }
    }

    #[test]
    fn the_slice_is_set_and_the_nice_value_kept() {
        std::thread::spawn(|| {
            let before = current().unwrap();
            set_thread_time_slice(Duration::from_micros(300)).unwrap();
            let after = current().unwrap();
            assert_eq!(after.sched_policy, before.sched_policy);
            assert_eq!(after.sched_nice, before.sched_nice);
            // Kernels before 6.12 keep their own slice for normal threads; from 6.12 on
            // the thread reads back what it asked for.
            if kernel_at_least(6, 12) {
                assert_eq!(after.sched_runtime, 300_000);
                assert!(honoured(Duration::from_micros(300)));
                assert!(!honoured(Duration::from_micros(200)));
            }
        })
        .join()
        .unwrap();
    }

    /// The short slice while busy, the thread's own (here the system's) otherwise.
    #[test]
    fn a_busy_slice_follows_the_host() {
        std::thread::spawn(|| {
            let runtime = || current().unwrap().sched_runtime;
            // Kernels from 6.12 on report the slice a thread runs, its own or the system's.
            let own = runtime();
            let Some(mut slice) = BusySlice::new(Duration::from_micros(100)) else {
                // Kernels before 6.12 do not honour the request.
                assert!(!kernel_at_least(6, 12));
                return;
            };
            assert_eq!(runtime(), 100_000);
            slice.follow(false);
            assert_eq!(runtime(), own);
            slice.follow(false);
            assert_eq!(runtime(), own);
            slice.follow(true);
            assert_eq!(runtime(), 100_000);
        })
        .join()
        .unwrap();
        // A thread that started with a slice of its own goes back to it.
        std::thread::spawn(|| {
            if set_thread_time_slice(Duration::from_millis(2)).is_err() || !kernel_at_least(6, 12) {
                return;
            }
            let mut slice = BusySlice::new(Duration::from_micros(100)).unwrap();
            slice.follow(false);
            assert_eq!(current().unwrap().sched_runtime, 2_000_000);
        })
        .join()
        .unwrap();
    }

    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        found >= (major, minor)
    }
}
