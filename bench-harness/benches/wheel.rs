//! The timer wheel against a binary heap with lazy deletion, with a million timers pending.
//!
//! - `wheel/insert_cancel`: each element inserts a timer at a random deadline up to 2^20
//!   ticks ahead and cancels a random pending one, so a million stay pending.
//! - `wheel/lease_cycle`: the broker's common case with a million timers pending: each
//!   element sets a lease timer `ACK_TIMEOUT` ahead of a clock that moves a tick every 64
//!   elements and cancels the one set `IN_FLIGHT` elements before (a consumer acking in
//!   order with that many deliveries in flight).
//! - `wheel/expiry`: a million timers spread over 2^16 ticks; time advances a tick at a time
//!   and every timer due is polled out. Refilling the structure is not timed.
//!
//! Both count one element per timer (inserted and cancelled, or fired).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::hint::black_box;
use std::mem;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use leasemq_engine::wheel::{Tick, TimerKey, Wheel};

const PENDING: usize = 1_000_000;
/// `insert_cancel` deadlines land up to this many ticks ahead (17 minutes of 1 ms ticks).
const NEAR: Tick = 1 << 20;
/// `expiry` spreads its timers over this many ticks (about 15 fire per tick).
const WINDOW: Tick = 1 << 16;

/// xorshift64*: cheap, repeatable, the same stream for both contenders.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The baseline: a min-heap of (deadline, id). Cancel only records the id; a cancelled
/// entry is skipped when it reaches the top, and the heap is rebuilt without the cancelled
/// entries once they outnumber the live ones.
#[derive(Default)]
struct HeapTimers {
    heap: BinaryHeap<Reverse<(Tick, u64)>>,
    cancelled: HashSet<u64>,
    next_id: u64,
}

impl HeapTimers {
    fn insert(&mut self, deadline: Tick) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.heap.push(Reverse((deadline, id)));
        id
    }

    fn cancel(&mut self, id: u64) {
        self.cancelled.insert(id);
        if self.cancelled.len() > self.heap.len() / 2 {
            let cancelled = &self.cancelled;
            self.heap.retain(|Reverse((_, id))| !cancelled.contains(id));
            self.cancelled.clear();
        }
    }

    fn poll(&mut self, now: Tick) -> Option<(Tick, u64)> {
        while let Some(&Reverse((deadline, id))) = self.heap.peek() {
            if deadline > now {
                return None;
            }
            self.heap.pop();
            if !self.cancelled.remove(&id) {
                return Some((deadline, id));
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.heap.len() == self.cancelled.len()
    }
}

/// What both contenders offer: timers carrying a `u64` id.
trait Timers {
    type Key: Copy;
    fn insert(&mut self, deadline: Tick, id: u64) -> Self::Key;
    fn cancel(&mut self, key: Self::Key);
    fn poll(&mut self, now: Tick) -> Option<(Tick, u64)>;
    fn is_empty(&self) -> bool;
}

impl Timers for Wheel<u64> {
    type Key = TimerKey;

    fn insert(&mut self, deadline: Tick, id: u64) -> TimerKey {
        Wheel::insert(self, deadline, id)
    }

    fn cancel(&mut self, key: TimerKey) {
        black_box(Wheel::cancel(self, key));
    }

    fn poll(&mut self, now: Tick) -> Option<(Tick, u64)> {
        Wheel::poll(self, now)
    }

    fn is_empty(&self) -> bool {
        Wheel::is_empty(self)
    }
}

impl Timers for HeapTimers {
    type Key = u64;

    fn insert(&mut self, deadline: Tick, _id: u64) -> u64 {
        HeapTimers::insert(self, deadline)
    }

    fn cancel(&mut self, id: u64) {
        HeapTimers::cancel(self, id);
    }

    fn poll(&mut self, now: Tick) -> Option<(Tick, u64)> {
        HeapTimers::poll(self, now)
    }

    fn is_empty(&self) -> bool {
        HeapTimers::is_empty(self)
    }
}

fn insert_cancel_one<T: Timers>(c: &mut Criterion, name: &str, mut timers: T) {
    let mut rng = Rng::new(1);
    let mut keys: Vec<T::Key> = (0..PENDING as u64)
        .map(|id| timers.insert(rng.below(NEAR), id))
        .collect();
    let mut id = PENDING as u64;
    let mut group = c.benchmark_group("wheel/insert_cancel");
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter(|| {
            let key = timers.insert(rng.below(NEAR), id);
            id += 1;
            let victim = &mut keys[rng.below(PENDING as u64) as usize];
            timers.cancel(mem::replace(victim, key));
        })
    });
    group.finish();
}

fn insert_cancel(c: &mut Criterion) {
    insert_cancel_one(c, "wheel", Wheel::with_capacity(PENDING + 1));
    insert_cancel_one(c, "binary_heap", HeapTimers::default());
}

/// Leases a consumer holds at once in `lease_cycle`.
const IN_FLIGHT: usize = 256;
/// The lease length in `lease_cycle` (30 s of 1 ms ticks).
const ACK_TIMEOUT: Tick = 30_000;

fn lease_cycle_one<T: Timers>(c: &mut Criterion, name: &str, mut timers: T) {
    let mut rng = Rng::new(3);
    // The million others: far enough out that none fires while the benchmark runs.
    for id in 0..PENDING as u64 {
        timers.insert(NEAR + rng.below(NEAR), id);
    }
    let mut in_flight: Vec<T::Key> = (0..IN_FLIGHT as u64)
        .map(|id| timers.insert(ACK_TIMEOUT, id))
        .collect();
    let (mut id, mut next) = (0u64, 0usize);
    let mut group = c.benchmark_group("wheel/lease_cycle");
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter(|| {
            id += 1;
            let now = id / 64;
            let key = timers.insert(now + ACK_TIMEOUT, id);
            timers.cancel(mem::replace(&mut in_flight[next], key));
            next = (next + 1) % IN_FLIGHT;
        })
    });
    group.finish();
}

fn lease_cycle(c: &mut Criterion) {
    lease_cycle_one(c, "wheel", Wheel::with_capacity(PENDING + IN_FLIGHT));
    lease_cycle_one(c, "binary_heap", HeapTimers::default());
}

/// Polls out `iters` timers a tick at a time, refilling (untimed) whenever `timers` runs dry.
fn fire<T: Timers>(timers: &mut T, iters: u64, now: &mut Tick, rng: &mut Rng) -> Duration {
    let (mut spent, mut left) = (Duration::ZERO, iters);
    while left > 0 {
        if timers.is_empty() {
            for id in 0..PENDING as u64 {
                timers.insert(*now + 1 + rng.below(WINDOW), id);
            }
        }
        let start = Instant::now();
        while left > 0 && !timers.is_empty() {
            *now += 1;
            while left > 0 {
                let Some(timer) = timers.poll(*now) else {
                    break;
                };
                black_box(timer);
                left -= 1;
            }
        }
        spent += start.elapsed();
    }
    spent
}

fn expiry_one<T: Timers>(c: &mut Criterion, name: &str, mut timers: T) {
    let (mut rng, mut now) = (Rng::new(2), 0);
    let mut group = c.benchmark_group("wheel/expiry");
    group.throughput(Throughput::Elements(1));
    group.sampling_mode(SamplingMode::Flat);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| fire(&mut timers, iters, &mut now, &mut rng))
    });
    group.finish();
}

fn expiry(c: &mut Criterion) {
    expiry_one(c, "wheel", Wheel::with_capacity(PENDING));
    expiry_one(c, "binary_heap", HeapTimers::default());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = insert_cancel, lease_cycle, expiry
}
criterion_main!(benches);
