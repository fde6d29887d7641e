//! The closed-loop workload, the same for every broker: P producer threads put 16-byte
//! messages one per call, C consumer threads receive one at a time under a lease and ack
//! each, and at most `max_in_flight` messages are put and not yet acked.
//!
//! Body: the send time in ns since the run's epoch in bytes 0..8, a sequence number in
//! bytes 8..16 (producer index << 40 | n), both little endian. Consumers record send time
//! → ack returned into an HDR histogram for acks inside the measured window, and keep
//! every sequence number so the end-of-run check can prove each message put was acked
//! exactly once.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;

use crate::cpu::{self, CpuSample};
use crate::targets::{Consumer, Producer, Target};

pub const BODY_BYTES: usize = 16;
pub type Body = [u8; BODY_BYTES];

/// How long a consumer waits for a message before it looks at the shared state again.
const CONSUMER_POLL: Duration = Duration::from_millis(100);
/// How long a producer sleeps while the in-flight window is full.
const WINDOW_FULL_BACKOFF: Duration = Duration::from_micros(100);
const SEQ_PRODUCER_SHIFT: u32 = 40;
/// Latencies are recorded in ns, from 1 µs to 60 s, 3 significant digits.
const LATENCY_MAX_NS: u64 = 60_000_000_000;

#[derive(Clone, Debug)]
pub struct Workload {
    pub producers: usize,
    pub consumers: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub max_in_flight: u64,
    /// The longest the consumers may take to ack what is left after the window.
    pub drain_timeout: Duration,
}

/// One run's numbers.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    pub broker: String,
    pub window_s: f64,
    pub acked_in_window: u64,
    pub acked_per_s: f64,
    pub put_to_ack_p50_us: f64,
    pub put_to_ack_p99_us: f64,
    pub put_to_ack_p999_us: f64,
    pub put_to_ack_max_us: f64,
    /// CPU seconds of this process over the window (leasemq's shard threads included).
    pub client_cpu_s: f64,
    /// CPU seconds of the broker's server process(es) over the window; `None` in-process.
    pub broker_cpu_s: Option<f64>,
    pub total_put: u64,
    pub total_acked: u64,
    /// `None` when every message put was acked exactly once, else what went wrong.
    pub problem: Option<String>,
}

struct Shared {
    epoch: Instant,
    window_start_ns: u64,
    window_end_ns: u64,
    max_in_flight: u64,
    stop_producing: AtomicBool,
    abandon: AtomicBool,
    put: AtomicU64,
    acked: AtomicU64,
    /// `u64::MAX` until every producer has stopped.
    total_put: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn in_window(&self, t_ns: u64) -> bool {
        (self.window_start_ns..self.window_end_ns).contains(&t_ns)
    }

    fn in_flight(&self) -> u64 {
        let acked = self.acked.load(Ordering::Acquire);
        self.put.load(Ordering::Acquire).saturating_sub(acked)
    }

    fn all_acked(&self) -> bool {
        self.acked.load(Ordering::Acquire) >= self.total_put.load(Ordering::Acquire)
    }

    fn give_up(&self) {
        self.stop_producing.store(true, Ordering::Release);
        self.abandon.store(true, Ordering::Release);
    }
}

struct ConsumerTally {
    latency_ns: Histogram<u64>,
    acked_in_window: u64,
    seqs: Vec<u64>,
}

/// Runs the workload once against `target` and checks the accounting.
pub fn run(target: &dyn Target, workload: &Workload) -> Result<RunResult> {
    let producers = (0..workload.producers)
        .map(|_| target.producer())
        .collect::<Result<Vec<_>>>()
        .context("connecting producers")?;
    let consumers = (0..workload.consumers)
        .map(|i| target.consumer(i))
        .collect::<Result<Vec<_>>>()
        .context("connecting consumers")?;
    let server_pids = target.server_pids();
    if target.is_remote() && server_pids.is_empty() {
        bail!("no {} server process found in /proc", target.name());
    }
    let warmup_ns = workload.warmup.as_nanos() as u64;
    let shared = Shared {
        epoch: Instant::now(),
        window_start_ns: warmup_ns,
        window_end_ns: warmup_ns + workload.duration.as_nanos() as u64,
        max_in_flight: workload.max_in_flight,
        stop_producing: AtomicBool::new(false),
        abandon: AtomicBool::new(false),
        put: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        total_put: AtomicU64::new(u64::MAX),
    };
    let (puts, tallies, cpu) = drive(&shared, workload, producers, consumers, &server_pids)?;
    Ok(summarise(target, &shared, &puts, tallies, cpu))
}

type Driven = (Vec<u64>, Vec<ConsumerTally>, (CpuSample, CpuSample));

fn drive(
    shared: &Shared,
    workload: &Workload,
    producers: Vec<Box<dyn Producer>>,
    consumers: Vec<Box<dyn Consumer>>,
    server_pids: &[u32],
) -> Result<Driven> {
    thread::scope(|scope| {
        let consumer_threads: Vec<_> = consumers
            .into_iter()
            .map(|c| scope.spawn(move || guarded(shared, || consume(shared, c))))
            .collect();
        let producer_threads: Vec<_> = producers
            .into_iter()
            .enumerate()
            .map(|(i, p)| scope.spawn(move || guarded(shared, || produce(shared, i as u64, p))))
            .collect();
        let cpu = sample_window(shared, server_pids);
        shared.stop_producing.store(true, Ordering::Release);
        let puts = join_all(producer_threads)?;
        shared.total_put.store(puts.iter().sum(), Ordering::Release);
        wait_for_drain(shared, workload.drain_timeout);
        let tallies = join_all(consumer_threads)?;
        Ok((puts, tallies, cpu))
    })
}

/// Runs a worker; on an error or a panic stops the whole run so no thread waits for it.
fn guarded<T>(shared: &Shared, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let outcome = panic::catch_unwind(AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker panicked")));
    if outcome.is_err() {
        shared.give_up();
    }
    outcome
}

/// Joins every handle, then gives the first error if any.
fn join_all<T>(handles: Vec<thread::ScopedJoinHandle<'_, Result<T>>>) -> Result<Vec<T>> {
    let joined: Vec<Result<T>> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker panicked")))
        })
        .collect();
    joined.into_iter().collect()
}

/// Sleeps through the warm-up and the window; CPU samples at both edges of the window.
fn sample_window(shared: &Shared, server_pids: &[u32]) -> (CpuSample, CpuSample) {
    sleep_until(shared, shared.window_start_ns);
    let start = cpu::sample(server_pids);
    sleep_until(shared, shared.window_end_ns);
    let end = cpu::sample(server_pids);
    (start, end)
}

fn sleep_until(shared: &Shared, t_ns: u64) {
    while !shared.abandon.load(Ordering::Acquire) {
        let now = shared.now_ns();
        if now >= t_ns {
            return;
        }
        thread::sleep(Duration::from_nanos(t_ns - now).min(Duration::from_millis(50)));
    }
}

fn wait_for_drain(shared: &Shared, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !shared.all_acked() && !shared.abandon.load(Ordering::Acquire) {
        if Instant::now() >= deadline {
            shared.abandon.store(true, Ordering::Release);
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn produce(shared: &Shared, index: u64, mut producer: Box<dyn Producer>) -> Result<u64> {
    let mut n = 0u64;
    while !shared.stop_producing.load(Ordering::Acquire) {
        if shared.in_flight() >= shared.max_in_flight {
            thread::sleep(WINDOW_FULL_BACKOFF);
            continue;
        }
        let seq = (index << SEQ_PRODUCER_SHIFT) | n;
        let body = encode(shared.now_ns(), seq);
        producer.put(&body)?;
        shared.put.fetch_add(1, Ordering::AcqRel);
        n += 1;
    }
    Ok(n)
}

fn consume(shared: &Shared, mut consumer: Box<dyn Consumer>) -> Result<ConsumerTally> {
    let mut tally = ConsumerTally {
        latency_ns: Histogram::new_with_bounds(1_000, LATENCY_MAX_NS, 3)?,
        acked_in_window: 0,
        seqs: Vec::new(),
    };
    while !shared.abandon.load(Ordering::Acquire) {
        let Some(body) = consumer.next(CONSUMER_POLL)? else {
            if shared.all_acked() {
                break;
            }
            continue;
        };
        consumer.ack()?;
        let acked_ns = shared.now_ns();
        shared.acked.fetch_add(1, Ordering::AcqRel);
        let (sent_ns, seq) = decode(&body);
        if shared.in_window(acked_ns) {
            tally.acked_in_window += 1;
            let latency = acked_ns
                .saturating_sub(sent_ns)
                .clamp(1_000, LATENCY_MAX_NS);
            tally.latency_ns.record(latency)?;
        }
        tally.seqs.push(seq);
    }
    Ok(tally)
}

fn encode(sent_ns: u64, seq: u64) -> Body {
    let mut body = [0u8; BODY_BYTES];
    body[..8].copy_from_slice(&sent_ns.to_le_bytes());
    body[8..].copy_from_slice(&seq.to_le_bytes());
    body
}

fn decode(body: &Body) -> (u64, u64) {
    let sent_ns = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
    let seq = u64::from_le_bytes(body[8..].try_into().expect("8 bytes"));
    (sent_ns, seq)
}

fn summarise(
    target: &dyn Target,
    shared: &Shared,
    puts: &[u64],
    tallies: Vec<ConsumerTally>,
    (start, end): (CpuSample, CpuSample),
) -> RunResult {
    let mut latency = Histogram::<u64>::new_with_bounds(1_000, LATENCY_MAX_NS, 3).expect("bounds");
    let mut seqs = Vec::new();
    let mut acked_in_window = 0;
    for tally in tallies {
        latency.add(&tally.latency_ns).expect("same bounds");
        acked_in_window += tally.acked_in_window;
        seqs.extend(tally.seqs);
    }
    let total_acked = seqs.len() as u64;
    let problem = check_exactly_once(puts, seqs, shared.abandon.load(Ordering::Acquire));
    let window_s = (shared.window_end_ns - shared.window_start_ns) as f64 / 1e9;
    let us = |q: f64| latency.value_at_quantile(q) as f64 / 1e3;
    RunResult {
        broker: target.name().to_string(),
        window_s,
        acked_in_window,
        acked_per_s: acked_in_window as f64 / window_s,
        put_to_ack_p50_us: us(0.5),
        put_to_ack_p99_us: us(0.99),
        put_to_ack_p999_us: us(0.999),
        put_to_ack_max_us: latency.max() as f64 / 1e3,
        client_cpu_s: end.own_s - start.own_s,
        broker_cpu_s: target
            .is_remote()
            .then_some(end.servers_s - start.servers_s),
        total_put: puts.iter().sum(),
        total_acked,
        problem,
    }
}

/// Every (producer, n) with n below that producer's count acked once, nothing else.
fn check_exactly_once(puts: &[u64], mut seqs: Vec<u64>, abandoned: bool) -> Option<String> {
    seqs.sort_unstable();
    let duplicates = seqs.windows(2).filter(|w| w[0] == w[1]).count();
    seqs.dedup();
    let unknown = seqs
        .iter()
        .filter(|&&seq| {
            let producer = (seq >> SEQ_PRODUCER_SHIFT) as usize;
            let n = seq & ((1 << SEQ_PRODUCER_SHIFT) - 1);
            puts.get(producer).is_none_or(|&count| n >= count)
        })
        .count();
    let total_put: u64 = puts.iter().sum();
    let missing = total_put.saturating_sub((seqs.len() - unknown) as u64);
    let mut problems = Vec::new();
    if abandoned {
        problems.push("drain abandoned".to_string());
    }
    for (count, what) in [
        (duplicates as u64, "acked twice"),
        (unknown as u64, "never put"),
    ] {
        if count > 0 {
            problems.push(format!("{count} {what}"));
        }
    }
    if missing > 0 {
        problems.push(format!("{missing} put but never acked"));
    }
    (!problems.is_empty()).then(|| problems.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_round_trips() {
        assert_eq!(
            decode(&encode(123_456_789, 7 << 40 | 9)),
            (123_456_789, 7 << 40 | 9)
        );
    }

    #[test]
    fn exactly_once_passes_when_every_message_is_acked_once() {
        let seqs = vec![1 << 40, 0, 1, (1 << 40) | 1, 2];
        assert_eq!(check_exactly_once(&[3, 2], seqs, false), None);
    }

    #[test]
    fn exactly_once_reports_duplicates_and_missing() {
        let seqs = vec![0, 0, 5];
        let problem = check_exactly_once(&[2], seqs, false).expect("a problem");
        assert_eq!(problem, "1 acked twice, 1 never put, 1 put but never acked");
    }
}
