//! The broker's threads tell a host whose cores other threads keep busy from one whose
//! cores only they want (`shard/src/host.rs`): beside busy threads they park and shard
//! threads run a short time slice; once those threads are gone they yield again and the
//! shards go back to the system's slice. A file of its own, so that no other test's
//! threads run beside it; it needs a machine that nothing else keeps busy meanwhile (its
//! first step waits for the host to be seen idle, and says what was seen if it is not).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};

mod common;
use common::custom_slices;

/// Waits up to `limit` for `done`, looking every few sampler windows' worth of time.
/// Real time, not a lease: the sampler reads the machine's CPU times as they are.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < end,
            "{what} within {limit:?}: {:?}",
            leasemq::host_load()
        );
        thread::sleep(leasemq::HOST_SAMPLE_EVERY / 2);
    }
}

/// The `se.slice` line of a thread's `sched` file (`/proc/<pid>/task/<tid>`, or
/// `/proc/thread-self`), in nanoseconds, where the kernel shows it (with the scheduler's
/// debug files).
fn slice_of(thread: &Path) -> Option<u64> {
    let sched = std::fs::read_to_string(thread.join("sched")).ok()?;
    let line = sched.lines().find(|l| l.starts_with("se.slice "))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// The slices of this process's shard threads, where the kernel shows them.
fn shard_slices() -> Option<Vec<u64>> {
    let mut slices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.starts_with("leasemq-shard") {
            slices.push(slice_of(&dir)?);
        }
    }
    (!slices.is_empty()).then_some(slices)
}

#[test]
fn threads_that_never_wait_on_the_broker_make_the_host_busy_until_they_stop() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let short = Duration::from_micros(100);
    let broker = Broker::builder()
        .shards(1)
        .shard_time_slice(Some(short))
        .build()
        .unwrap();
    let jobs = broker
        .declare_queue("jobs", QueueConfig::default())
        .unwrap();
    let worker = jobs.consume("worker", ConsumerConfig::default()).unwrap();
    let ticks = jobs.clone();
    let tick = || {
        ticks
            .put(Message::new("tick").with_delay(Duration::from_millis(1)))
            .unwrap();
    };
    // One thread that keeps handing messages to the shard and back: a participant whose
    // CPU time is ours.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = stop.clone();
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                jobs.put(Message::new("job")).unwrap();
                assert!(worker.recv().unwrap().ack());
            }
        })
    };
    // This thread never asked for a slice of its own: its slice is the system's.
    let system_slice = shard_slices().and(slice_of(Path::new("/proc/thread-self")));
    let slices_are =
        |ns: u64| !custom_slices() || system_slice.is_none() || shard_slices() == Some(vec![ns]);

    // Only our own threads: idle, the shard on the system's slice.
    let start = leasemq::host_load().windows;
    eventually(Duration::from_secs(20), "the host seen idle", || {
        let load = leasemq::host_load();
        load.windows >= start + 3 && !load.busy
    });
    eventually(Duration::from_secs(5), "the system's slice", || {
        slices_are(system_slice.unwrap_or(0))
    });

    // As many threads that never sleep as there are cores: busy, the shard on its short
    // slice.
    let burn = Arc::new(AtomicBool::new(true));
    let cores = thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..cores)
        .map(|_| {
            let burn = burn.clone();
            thread::spawn(move || {
                let mut x = 1u64;
                while burn.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(20), "the host seen busy", || {
        leasemq::host_load().busy
    });
    let load = leasemq::host_load();
    assert!(
        load.busy_windows >= 1 && load.foreign_cores > 0.0,
        "{load:?}"
    );
    // While the host is busy the traffic thread runs the shard's turns itself, and the
    // shard thread may stay parked, on the slice it had: a slice matters only to a thread
    // that runs. A message due a moment from now wakes the thread for its timer, and a
    // thread that woke follows the host before it waits again.
    eventually(Duration::from_secs(5), "the short slice", || {
        tick();
        slices_are(short.as_nanos() as u64)
    });

    // They stop: idle again, and back to the system's slice.
    burn.store(false, Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    eventually(Duration::from_secs(20), "the host seen idle again", || {
        !leasemq::host_load().busy
    });
    eventually(Duration::from_secs(5), "the system's slice again", || {
        tick();
        slices_are(system_slice.unwrap_or(0))
    });

    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    broker.shutdown();
}
