//! Unit tests of the timer wheel.

use super::*;
use std::collections::BTreeMap;

/// Ticks one turn of the top level covers: `64^6`.
const SPAN: Tick = 1 << 36;

/// xorshift64*: repeatable randomness from a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Everything due by `now`, in the order `poll` hands it out.
fn drain<T>(wheel: &mut Wheel<T>, now: Tick) -> Vec<(Tick, T)> {
    std::iter::from_fn(|| wheel.poll(now)).collect()
}

/// Polls at each `next_deadline`, as the shard runtime wakes, until a timer fires.
fn wake_until_fired<T>(wheel: &mut Wheel<T>) -> (Tick, T) {
    loop {
        let hint = wheel.next_deadline().expect("a timer is pending");
        assert!(hint >= wheel.elapsed(), "next_deadline is in the past");
        if let Some(fired) = wheel.poll(hint) {
            assert_eq!(fired.0, hint, "fired at a tick next_deadline did not name");
            return fired;
        }
        wheel.check_invariants();
    }
}

#[test]
fn list_id_leaves_the_slab_a_niche() {
    use std::mem::size_of;
    assert_eq!(size_of::<Option<Entry<u64>>>(), size_of::<Entry<u64>>());
    assert_eq!(size_of::<Entry<u64>>(), 32);
}

#[test]
fn new_wheel_is_empty_at_tick_zero() {
    let mut wheel: Wheel<u32> = Wheel::default();
    assert_eq!(wheel.elapsed(), 0);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_deadline(), None);
    assert_eq!(wheel.poll(1_000), None);
    assert_eq!(wheel.elapsed(), 1_000);
    wheel.check_invariants();
}

#[test]
fn timer_on_every_level_fires_exactly_at_its_tick() {
    for start in [0, 12_345, SPAN - 1, 3 * SPAN + 4_000_000_001] {
        for level in 0..=LEVELS as u32 {
            for offset in [0, 1, 2, 37, 63] {
                let deadline = start + 64u64.pow(level) + offset;
                let mut wheel = Wheel::new();
                wheel.poll(start);
                wheel.insert(deadline, level);
                wheel.check_invariants();
                assert_eq!(wheel.poll(deadline - 1), None, "fired before {deadline}");
                wheel.check_invariants();
                assert_eq!(wheel.next_deadline(), Some(deadline));
                assert_eq!(wheel.poll(deadline), Some((deadline, level)));
                assert!(wheel.is_empty());

                let mut wheel = Wheel::new();
                wheel.poll(start);
                wheel.insert(deadline, level);
                assert_eq!(wheel.poll(deadline + 5), Some((deadline, level)));
                assert_eq!(wheel.elapsed(), deadline);

                let mut wheel = Wheel::new();
                wheel.poll(start);
                wheel.insert(deadline, level);
                assert_eq!(wake_until_fired(&mut wheel), (deadline, level));
            }
        }
    }
}

#[test]
fn far_future_deadlines_fire_exactly_and_are_never_lost() {
    const YEAR_OF_MS: Tick = 365 * 24 * 3600 * 1000;
    let mut deadlines = [
        3 * YEAR_OF_MS,
        SPAN - 1,
        SPAN,
        SPAN + 1,
        10 * SPAN + 3,
        1 << 44,
        1_000 * YEAR_OF_MS,
    ];
    let mut wheel = Wheel::new();
    wheel.poll(17);
    for deadline in deadlines {
        wheel.insert(deadline, deadline);
    }
    let forever = wheel.insert(Tick::MAX, 0);
    wheel.check_invariants();
    deadlines.sort_unstable();
    for deadline in deadlines {
        assert_eq!(wheel.poll(deadline - 1), None, "fired before {deadline}");
        wheel.check_invariants();
        assert!(wheel.next_deadline().unwrap() <= deadline);
        assert_eq!(wheel.poll(deadline), Some((deadline, deadline)));
    }
    assert_eq!(wheel.poll(1 << 46), None);
    assert_eq!(wheel.len(), 1);
    assert_eq!(wheel.deadline(forever), Tick::MAX);
    assert!(wheel.next_deadline().is_some());
    assert_eq!(wheel.cancel(forever), 0);

    let mut wheel = Wheel::new();
    for deadline in deadlines {
        wheel.insert(deadline, deadline);
    }
    let fired: Vec<Tick> = drain(&mut wheel, 1 << 46)
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    assert_eq!(fired, deadlines);
}

#[test]
fn timers_fire_at_the_end_of_time() {
    let mut wheel = Wheel::new();
    wheel.poll(Tick::MAX - 3 * SPAN);
    wheel.insert(Tick::MAX, 'b');
    wheel.insert(Tick::MAX - 1, 'a');
    assert_eq!(wheel.poll(Tick::MAX - 2), None);
    wheel.check_invariants();
    assert_eq!(
        drain(&mut wheel, Tick::MAX),
        [(Tick::MAX - 1, 'a'), (Tick::MAX, 'b')]
    );
}

#[test]
fn cancel_removes_a_timer_from_any_level() {
    let deadlines: Vec<Tick> = (0..LEVELS as u32)
        .map(|level| 64u64.pow(level) + 5)
        .chain([3 * SPAN + 9])
        .collect();
    for advance in [0, 64 * 64 * 64 + 1] {
        for victim in 0..deadlines.len() {
            let mut wheel = Wheel::new();
            let keys: Vec<TimerKey> = deadlines.iter().map(|&d| wheel.insert(d, d)).collect();
            let mut expected: Vec<Tick> = drain(&mut wheel, advance).iter().map(|f| f.0).collect();
            if deadlines[victim] <= advance {
                continue;
            }
            assert_eq!(wheel.cancel(keys[victim]), deadlines[victim]);
            wheel.check_invariants();
            assert_eq!(wheel.len(), deadlines.len() - expected.len() - 1);
            expected.extend(drain(&mut wheel, 4 * SPAN).iter().map(|f| f.0));
            expected.push(deadlines[victim]);
            expected.sort_unstable();
            assert_eq!(
                expected, deadlines,
                "victim {victim} fired, or another was lost"
            );
        }
    }
}

#[test]
fn cancel_removes_a_timer_from_the_pending_list() {
    let mut wheel = Wheel::new();
    let keys: Vec<TimerKey> = ['a', 'b', 'c', 'd'].map(|v| wheel.insert(10, v)).to_vec();
    assert_eq!(wheel.poll(10), Some((10, 'a')));
    assert_eq!(wheel.entries[keys[2].0 as usize].list, ListId::PENDING);
    assert_eq!(wheel.cancel(keys[2]), 'c');
    wheel.check_invariants();
    assert_eq!(wheel.poll(10), Some((10, 'b')));
    assert_eq!(wheel.cancel(keys[3]), 'd');
    wheel.check_invariants();
    assert_eq!(wheel.poll(10), None);
    assert!(wheel.is_empty());
}

#[test]
#[should_panic(expected = "not a live timer")]
fn cancel_of_a_fired_timer_panics() {
    let mut wheel = Wheel::new();
    let key = wheel.insert(3, ());
    wheel.poll(3);
    wheel.cancel(key);
}

#[test]
#[should_panic(expected = "time went backwards")]
fn poll_before_elapsed_panics() {
    let mut wheel: Wheel<()> = Wheel::new();
    wheel.poll(10);
    wheel.poll(9);
}

#[test]
fn reset_within_the_same_slot_only_changes_the_deadline() {
    let mut wheel = Wheel::new();
    let key = wheel.insert(100, ());
    let list = wheel.entries[key.0 as usize].list;
    wheel.reset(key, 120);
    assert_eq!(
        wheel.entries[key.0 as usize].list, list,
        "level 1 slot 1 holds 64..128"
    );
    assert_eq!(wheel.deadline(key), 120);
    wheel.check_invariants();
    assert_eq!(wheel.poll(119), None);
    assert_eq!(wheel.poll(120), Some((120, ())));
}

#[test]
fn reset_moves_a_timer_across_levels() {
    let mut wheel = Wheel::new();
    let key = wheel.insert(64u64.pow(4) + 11, 'x');
    wheel.reset(key, 3);
    wheel.check_invariants();
    assert_eq!(wheel.poll(2), None);
    wheel.reset(key, 2 * SPAN + 5);
    wheel.check_invariants();
    assert_eq!(wheel.poll(64u64.pow(4) + 11), None);
    let deadline = wheel.elapsed() + 3 * 64 * 64 + 1;
    wheel.reset(key, deadline);
    wheel.check_invariants();
    assert_eq!(wheel.poll(deadline - 1), None);
    assert_eq!(wheel.poll(2 * SPAN + 5), Some((deadline, 'x')));
    assert!(wheel.is_empty());
}

/// A shard renewing a million leases every second keeps all their timers between one and
/// two seconds ahead. Time crossing a level boundary must not move all of them at once (a
/// 20 ms stall of the shard each time, with 1 ms ticks and a million timers): a cascade
/// moves only the timers due within its slot's range.
#[test]
fn renewed_timers_are_not_all_cascaded_at_a_level_boundary() {
    const TIMERS: u64 = 100_000;
    const TIMEOUT: u64 = 2_000;
    let mut wheel = Wheel::new();
    let mut renewals = std::collections::VecDeque::new();
    let mut most = 0;
    for now in 1..5 * 4_096 {
        let before = wheel.cascaded;
        assert_eq!(
            wheel.poll(now),
            None,
            "every timer is renewed before it is due"
        );
        most = most.max(wheel.cascaded - before);
        // Set up a twentieth of the timers each tick, then renew each at half its timeout.
        if (wheel.len() as u64) < TIMERS {
            for _ in 0..TIMERS / 20 {
                renewals.push_back((wheel.insert(now + TIMEOUT, ()), now));
            }
        }
        while let Some(&(key, set)) = renewals.front() {
            if set + TIMEOUT / 2 > now {
                break;
            }
            renewals.pop_front();
            wheel.reset(key, now + TIMEOUT);
            renewals.push_back((key, now));
        }
    }
    assert_eq!(wheel.len() as u64, TIMERS);
    assert!(most < TIMERS / 100, "one poll cascaded {most} timers");
    wheel.check_invariants();
}

#[test]
fn reset_never_grows_the_slab() {
    let mut wheel = Wheel::with_capacity(8);
    let keys: Vec<TimerKey> = (0..8).map(|i| wheel.insert(i * 1_000, i)).collect();
    let capacity = wheel.entries.capacity();
    let mut rng = Rng::new(3);
    for _ in 0..10_000 {
        let key = keys[rng.below(8) as usize];
        let deadline = match rng.below(3) {
            0 => rng.below(64),
            1 => rng.below(1 << 20),
            _ => rng.next(),
        };
        wheel.reset(key, deadline);
        assert_eq!(wheel.deadline(key), deadline);
        assert_eq!(wheel.len(), 8);
        assert_eq!(wheel.entries.capacity(), capacity);
        wheel.check_invariants();
    }
}

#[test]
fn reset_orders_as_if_inserted_now() {
    let mut wheel = Wheel::new();
    let a = wheel.insert(10, 'a');
    wheel.insert(10, 'b');
    let c = wheel.insert(10, 'c');
    wheel.reset(a, 10);
    wheel.reset(c, 10);
    let far = wheel.insert(1_000, 'd');
    wheel.insert(1_000, 'e');
    wheel.reset(far, 1_000);
    wheel.check_invariants();
    let fired: String = drain(&mut wheel, 1_000).into_iter().map(|f| f.1).collect();
    assert_eq!(fired, "baced");
}

#[test]
fn deadline_in_the_past_fires_at_the_next_poll() {
    let mut wheel = Wheel::new();
    wheel.poll(1_000);
    let key = wheel.insert(5, "late");
    assert_eq!(wheel.deadline(key), 1_000);
    assert_eq!(wheel.next_deadline(), Some(1_000));
    wheel.check_invariants();
    assert_eq!(wheel.poll(1_000), Some((1_000, "late")));
    let key = wheel.insert(5_000, "moved back");
    wheel.reset(key, 0);
    assert_eq!(wheel.deadline(key), 1_000);
    assert_eq!(wheel.poll(1_000), Some((1_000, "moved back")));
}

#[test]
fn equal_deadlines_fire_in_insertion_order_across_cascades() {
    let deadline = 3 * 64u64.pow(3) + 17;
    let mut wheel = Wheel::new();
    wheel.insert(deadline, 'a');
    assert_eq!(wheel.poll(2 * 64u64.pow(3)), None);
    wheel.insert(deadline, 'b');
    assert_eq!(wheel.poll(3 * 64u64.pow(3) + 1), None);
    wheel.insert(deadline, 'c');
    assert_eq!(wheel.poll(deadline - 1), None);
    wheel.insert(deadline, 'd');
    wheel.check_invariants();
    let fired: String = drain(&mut wheel, deadline)
        .into_iter()
        .map(|f| f.1)
        .collect();
    assert_eq!(fired, "abcd");

    let far = 2 * SPAN + 5;
    let mut wheel = Wheel::new();
    wheel.insert(far, 'a');
    assert_eq!(wheel.poll(SPAN + 7), None);
    wheel.insert(far, 'b');
    assert_eq!(wheel.poll(2 * SPAN), None);
    wheel.insert(far, 'c');
    wheel.insert(far - 1, 'z');
    wheel.check_invariants();
    let fired: String = drain(&mut wheel, far).into_iter().map(|f| f.1).collect();
    assert_eq!(fired, "zabc");
}

#[test]
fn timers_inserted_for_the_current_tick_fire_in_the_same_poll_loop() {
    let mut wheel = Wheel::new();
    wheel.insert(10, 1);
    wheel.insert(10, 2);
    wheel.insert(11, 5);
    let mut fired = Vec::new();
    while let Some((deadline, value)) = wheel.poll(11) {
        fired.push((deadline, value));
        match value {
            1 => {
                wheel.insert(10, 3);
                wheel.insert(0, 4);
            }
            2 => _ = wheel.insert(11, 7),
            5 => _ = wheel.insert(11, 6),
            _ => {}
        }
        wheel.check_invariants();
    }
    let expected = [
        (10, 1),
        (10, 2),
        (10, 3),
        (10, 4),
        (11, 5),
        (11, 7),
        (11, 6),
    ];
    assert_eq!(fired, expected);
}

#[test]
fn next_deadline_is_exact_on_level_zero_and_a_slot_start_above() {
    let mut wheel = Wheel::new();
    wheel.insert(1_000, 'b');
    assert_eq!(
        wheel.next_deadline(),
        Some(960),
        "level 1 slot 15 starts at 960"
    );
    wheel.insert(40, 'a');
    assert_eq!(wheel.next_deadline(), Some(40));
    assert_eq!(wheel.poll(40), Some((40, 'a')));
    assert_eq!(wheel.poll(960), None);
    assert_eq!(wheel.next_deadline(), Some(1_000));
    wheel.insert(960, 'c');
    assert_eq!(wheel.next_deadline(), Some(960));
}

#[test]
fn get_mut_changes_the_value_that_fires() {
    let mut wheel = Wheel::new();
    let key = wheel.insert(5, String::from("a"));
    wheel.get_mut(key).push('b');
    assert_eq!(wheel.get(key), "ab");
    assert_eq!(wheel.poll(5), Some((5, String::from("ab"))));
}

#[test]
fn million_random_timers_fire_in_order_each_at_its_deadline() {
    const N: usize = 1_000_000;
    let mut rng = Rng::new(7);
    let mut wheel = Wheel::with_capacity(N);
    let deadlines: Vec<Tick> = (0..N)
        .map(|id| {
            let deadline = match rng.below(4) {
                0 => rng.below(1 << 12),
                1 => rng.below(1 << 24),
                2 => rng.below(SPAN),
                _ => rng.below(1 << 40),
            };
            wheel.insert(deadline, id);
            deadline
        })
        .collect();
    wheel.check_invariants();
    let (mut fired, mut last, mut previous_now) = (0, 0, None);
    while let Some(hint) = wheel.next_deadline() {
        let now = match rng.below(2) {
            0 => hint,
            _ => {
                let bits = rng.below(24);
                hint + rng.below(1 << bits)
            }
        };
        while let Some((deadline, id)) = wheel.poll(now) {
            assert_eq!(
                deadline, deadlines[id],
                "timer {id} fired with a wrong deadline"
            );
            assert!(deadline >= last, "timer {id} fired out of order");
            assert!(deadline <= now, "timer {id} fired early");
            if let Some(previous_now) = previous_now {
                assert!(deadline > previous_now, "timer {id} fired late");
            }
            assert_eq!(wheel.elapsed(), deadline);
            (last, fired) = (deadline, fired + 1);
            if fired % 100_000 == 0 {
                wheel.check_invariants();
            }
        }
        previous_now = Some(now);
    }
    assert_eq!(fired, N);
}

/// The reference the wheel is checked against: timers ordered by (deadline, insertion).
#[derive(Default)]
struct Model {
    timers: BTreeMap<(Tick, u64), u64>,
    elapsed: Tick,
    inserted: u64,
}

impl Model {
    fn insert(&mut self, deadline: Tick, id: u64) -> (Tick, u64) {
        let at = (deadline.max(self.elapsed), self.inserted);
        self.inserted += 1;
        self.timers.insert(at, id);
        at
    }

    fn poll(&mut self, now: Tick) -> Option<(Tick, u64)> {
        match self.timers.first_key_value() {
            Some((&(deadline, _), _)) if deadline <= now => {
                self.elapsed = deadline;
                self.timers.pop_first().map(|(_, id)| (deadline, id))
            }
            _ => {
                self.elapsed = now;
                None
            }
        }
    }
}

struct Live {
    key: TimerKey,
    id: u64,
    at: (Tick, u64),
}

/// One run of the wheel and the model side by side.
struct Sim {
    rng: Rng,
    wheel: Wheel<u64>,
    model: Model,
    live: Vec<Live>,
    next_id: u64,
}

impl Sim {
    fn deadline(&mut self) -> Tick {
        let now = self.wheel.elapsed();
        let ahead = match self.rng.below(16) {
            0 => return now.saturating_sub(self.rng.below(1_000)),
            1 if !self.live.is_empty() => {
                let i = self.pick();
                return self.live[i].at.0;
            }
            1 => 0,
            2..=5 => self.rng.below(64),
            6..=8 => self.rng.below(1 << 12),
            9..=10 => self.rng.below(1 << 24),
            11..=12 => self.rng.below(SPAN),
            13 => SPAN - 2 + self.rng.below(4),
            14 => self.rng.below(1 << 44),
            _ => return self.rng.next(),
        };
        now.saturating_add(ahead)
    }

    fn step(&mut self) -> Tick {
        match self.rng.below(20) {
            0..=3 => 0,
            4..=9 => self.rng.below(64),
            10..=14 => self.rng.below(1 << 12),
            15..=17 => self.rng.below(1 << 24),
            18 => self.rng.below(1 << 32),
            _ => self.rng.below(1 << 38),
        }
    }

    fn pick(&mut self) -> usize {
        self.rng.below(self.live.len() as u64) as usize
    }

    fn insert(&mut self) {
        let (deadline, id) = (self.deadline(), self.next_id);
        self.next_id += 1;
        let key = self.wheel.insert(deadline, id);
        let at = self.model.insert(deadline, id);
        self.live.push(Live { key, id, at });
    }

    fn cancel(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let i = self.pick();
        let live = self.live.swap_remove(i);
        assert_eq!(self.wheel.cancel(live.key), live.id);
        assert_eq!(self.model.timers.remove(&live.at), Some(live.id));
    }

    fn reset(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let (i, deadline) = (self.pick(), self.deadline());
        let live = &mut self.live[i];
        self.wheel.reset(live.key, deadline);
        self.model.timers.remove(&live.at);
        live.at = self.model.insert(deadline, live.id);
    }

    /// Polls until nothing is due, now and then inserting, cancelling or resetting
    /// between two polls, as a shard does while it handles what fired.
    fn poll_loop(&mut self) {
        let now = self.wheel.elapsed().saturating_add(self.step());
        loop {
            let fired = self.wheel.poll(now);
            assert_eq!(fired, self.model.poll(now), "poll({now})");
            assert_eq!(self.wheel.elapsed(), self.model.elapsed);
            let Some((_, id)) = fired else { break };
            let i = self.live.iter().position(|l| l.id == id).unwrap();
            self.live.swap_remove(i);
            match self.rng.below(8) {
                0 => self.insert(),
                1 => self.cancel(),
                2 => self.reset(),
                _ => {}
            }
        }
        assert_eq!(self.wheel.elapsed(), now);
    }

    fn compare(&mut self) {
        self.wheel.check_invariants();
        assert_eq!(self.wheel.len(), self.model.timers.len());
        assert_eq!(self.wheel.elapsed(), self.model.elapsed);
        let elapsed = self.wheel.elapsed();
        let earliest = self.model.timers.keys().next().map(|at| at.0);
        match (self.wheel.next_deadline(), earliest) {
            (None, None) => {}
            (Some(hint), Some(earliest)) => {
                assert!(hint <= earliest, "next_deadline {hint} after {earliest}");
                assert!(hint >= elapsed, "next_deadline {hint} before {elapsed}");
                assert_eq!(hint == elapsed, earliest == elapsed, "due now, or not");
            }
            (hint, earliest) => panic!("next_deadline {hint:?}, earliest {earliest:?}"),
        }
        if !self.live.is_empty() {
            let i = self.pick();
            let live = &self.live[i];
            assert_eq!(self.wheel.deadline(live.key), live.at.0);
            assert_eq!(*self.wheel.get(live.key), live.id);
        }
    }
}

/// Names the seed of a failing run, so that `WHEEL_SEED=<seed>` replays it alone.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("wheel model run failed: replay with WHEEL_SEED={}", self.0);
        }
    }
}

fn run_against_model(seed: u64, ops: usize) {
    let _guard = SeedGuard(seed);
    let mut sim = Sim {
        rng: Rng::new(seed),
        wheel: Wheel::new(),
        model: Model::default(),
        live: Vec::new(),
        next_id: 0,
    };
    for _ in 0..ops {
        match sim.rng.below(10) {
            0..=3 if sim.live.len() < 400 => sim.insert(),
            4 => sim.cancel(),
            5 | 6 => sim.reset(),
            _ => sim.poll_loop(),
        }
        sim.compare();
    }
    while !sim.live.is_empty() {
        sim.cancel();
    }
    sim.compare();
}

#[test]
fn matches_a_btreemap_model_under_random_operations() {
    if let Ok(seed) = std::env::var("WHEEL_SEED") {
        return run_against_model(seed.parse().expect("WHEEL_SEED is a u64"), 4_000);
    }
    for seed in 0..64 {
        run_against_model(seed, 4_000);
    }
}
