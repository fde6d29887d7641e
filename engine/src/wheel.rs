//! A hierarchical timing wheel: the one place a shard keeps its deadlines.
//!
//! This is the hierarchical wheel of G. Varghese and T. Lauck, "Hashed and Hierarchical
//! Timing Wheels: Data Structures for the Efficient Implementation of a Timer Facility"
//! (SOSP 1987), laid out as in tokio's `runtime/time/wheel` and Linux's `kernel/time/timer.c`:
//!
//! - **Levels.** Six levels of 64 slots. A slot on level `l` covers `64^l` ticks, so level 0
//!   has a slot per tick and the wheel spans `64^6 = 2^36` ticks (2.2 years of 1 ms ticks).
//!   A timer goes on the level of the highest bit in which its deadline differs from
//!   [`Wheel::elapsed`], in the slot named by the deadline's six bits of that level. All the
//!   timers in one level-0 slot are due at the same tick; a higher slot holds a range.
//! - **Bitmaps.** Each level keeps a `u64` of its non-empty slots. The next slot to visit is
//!   the first set bit after the current slot on the lowest non-empty level: a rotate and a
//!   `trailing_zeros`, never a walk over slots. Any slot on a lower level comes before any
//!   slot on a higher one, because lower levels only hold the rest of the current slot above.
//! - **Cascading.** When time reaches a slot above level 0, its whole list is taken and every
//!   timer in it is re-inserted against the new time, which moves it at least one level
//!   down (but for the far timers below). When time reaches a level-0 slot, its list
//!   becomes the *pending* list that [`Wheel::poll`] pops from; a timer inserted for that
//!   same tick joins the pending list behind it. Each list is appended to and cascaded in
//!   order, so equal deadlines fire in insertion order.
//! - **Beyond the span.** The top level is a ring. A timer due after the top level's
//!   current turn (any deadline up to `Tick::MAX`) waits in the top slot named by its
//!   deadline's bits 30..36, is taken out again each time time comes round to that slot
//!   (once per `64^6` ticks) and goes back until its deadline is within the turn. It never
//!   fires early and is never dropped.
//!
//! Timers live in a [`Slab`]. The lists are doubly linked through slab indices and every
//! entry records the list it is on, so cancel and reset unlink in O(1) and allocate nothing.
//!
//! ```
//! use leasemq_engine::wheel::Wheel;
//!
//! let mut wheel = Wheel::new();
//! let lease = wheel.insert(30_000, "lease of message 7");
//! wheel.insert(500, "delayed message 9");
//! wheel.reset(lease, 45_000);
//! assert_eq!(wheel.poll(1_000), Some((500, "delayed message 9")));
//! assert_eq!(wheel.poll(44_999), None);
//! assert_eq!(wheel.poll(60_000), Some((45_000, "lease of message 7")));
//! assert!(wheel.is_empty());
//! ```

use std::fmt;
use std::num::NonZeroU16;

use slab::Slab;

/// Time in whole ticks since the broker's epoch.
pub type Tick = u64;

/// Names a live timer of a [`Wheel`]. Once the timer fires or is cancelled, the wheel may
/// give the same key to a later timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey(u32);

const LEVELS: usize = 6;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const SLOT_MASK: u64 = SLOTS as u64 - 1;
/// The end of a list, and no list neighbour.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };
}

/// Names one of `Wheel::lists`: the slot list `level * SLOTS + slot`, or after them the
/// pending list of the timers due at `elapsed`. Kept off by one in a `NonZeroU16`, whose
/// niche lets the slab tell its free entries from its used ones without growing them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ListId(NonZeroU16);

impl ListId {
    const PENDING: ListId = ListId::new(LEVELS * SLOTS);

    const fn new(index: usize) -> ListId {
        match NonZeroU16::new(index as u16 + 1) {
            Some(id) => ListId(id),
            None => unreachable!(),
        }
    }

    fn slot(level: usize, slot: usize) -> ListId {
        ListId::new(level * SLOTS + slot)
    }

    fn index(self) -> usize {
        usize::from(self.0.get() - 1)
    }

    /// The level and slot of a slot list; `None` for the pending list.
    fn level_slot(self) -> Option<(usize, usize)> {
        let index = self.index();
        (self != ListId::PENDING).then_some((index / SLOTS, index % SLOTS))
    }
}

impl fmt::Debug for ListId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level_slot() {
            Some((level, slot)) => write!(f, "level {level} slot {slot}"),
            None => f.write_str("pending list"),
        }
    }
}

struct Entry<T> {
    value: T,
    deadline: Tick,
    prev: u32,
    next: u32,
    /// The list this entry is linked on.
    list: ListId,
}

/// A hierarchical timing wheel of values of type `T`. See the module docs.
pub struct Wheel<T> {
    entries: Slab<Entry<T>>,
    /// `LEVELS * SLOTS` slot lists, then the pending list; indexed by `ListId::index`.
    lists: Box<[List]>,
    /// Bit `s` of `occupied[l]` is set exactly when slot `s` of level `l` is non-empty.
    occupied: [u64; LEVELS],
    elapsed: Tick,
}

impl<T> Wheel<T> {
    /// An empty wheel at tick 0.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty wheel at tick 0 with room for `n` timers before it allocates.
    pub fn with_capacity(n: usize) -> Self {
        Wheel {
            entries: Slab::with_capacity(n),
            lists: vec![List::EMPTY; LEVELS * SLOTS + 1].into_boxed_slice(),
            occupied: [0; LEVELS],
            elapsed: 0,
        }
    }

    /// The wheel's current time: the last tick processed by [`Wheel::poll`].
    pub fn elapsed(&self) -> Tick {
        self.elapsed
    }

    /// How many timers are pending.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a timer due at `deadline`, O(1). A deadline before [`Wheel::elapsed`] is treated
    /// as `elapsed()`: the timer fires at the next poll.
    pub fn insert(&mut self, deadline: Tick, value: T) -> TimerKey {
        let deadline = deadline.max(self.elapsed);
        let index = self.entries.insert(Entry {
            value,
            deadline,
            prev: NIL,
            next: NIL,
            list: ListId::PENDING,
        });
        assert!(
            index < NIL as usize,
            "a wheel holds fewer than 2^32 - 1 timers"
        );
        let index = index as u32;
        self.push_back(list_for(self.elapsed, deadline), index);
        TimerKey(index)
    }

    /// Removes a live timer and returns its value, O(1). Panics on a key that is not live.
    pub fn cancel(&mut self, key: TimerKey) -> T {
        self.assert_live(key);
        self.unlink(key.0);
        self.entries.remove(key.0 as usize).value
    }

    /// Moves a live timer to `deadline`, O(1), keeping its key and its slab entry. Within the
    /// same slot only the stored deadline changes (and the timer goes to the back of the
    /// slot's list). A deadline before [`Wheel::elapsed`] is treated as `elapsed()`. Afterwards
    /// the timer orders as if inserted now. Panics on a key that is not live.
    pub fn reset(&mut self, key: TimerKey, deadline: Tick) {
        self.assert_live(key);
        let deadline = deadline.max(self.elapsed);
        let list = list_for(self.elapsed, deadline);
        let entry = &mut self.entries[key.0 as usize];
        entry.deadline = deadline;
        if entry.list == list && entry.next == NIL {
            return;
        }
        self.unlink(key.0);
        self.push_back(list, key.0);
    }

    /// The deadline of a live timer (raised to `elapsed()` if it was given in the past).
    pub fn deadline(&self, key: TimerKey) -> Tick {
        self.entry(key).deadline
    }

    pub fn get(&self, key: TimerKey) -> &T {
        &self.entry(key).value
    }

    pub fn get_mut(&mut self, key: TimerKey) -> &mut T {
        self.assert_live(key);
        &mut self.entries[key.0 as usize].value
    }

    /// A tick no later than the earliest pending deadline, `None` when the wheel is empty.
    /// Exact when that timer is due now or within the current level-0 range; otherwise the
    /// start of the slot that holds it, where [`Wheel::poll`] will cascade it.
    pub fn next_deadline(&self) -> Option<Tick> {
        if self.lists[ListId::PENDING.index()].head != NIL {
            return Some(self.elapsed);
        }
        self.next_slot().map(|(_, start)| start)
    }

    /// Removes and returns the earliest timer due by `now`, as `(deadline, value)`, and sets
    /// [`Wheel::elapsed`] to its deadline. Returns `None` when no timer is due by `now`,
    /// leaving `elapsed() == now`.
    ///
    /// Timers come out in deadline order, equal deadlines in insertion order (a reset counts
    /// as an insertion). Timers inserted between polls for the tick being processed fire in
    /// the same poll loop, after the ones already due. Panics if `now` is before `elapsed()`.
    pub fn poll(&mut self, now: Tick) -> Option<(Tick, T)> {
        assert!(
            now >= self.elapsed,
            "time went backwards: poll({now}) after elapsed() = {}",
            self.elapsed
        );
        loop {
            let head = self.lists[ListId::PENDING.index()].head;
            if head != NIL {
                self.unlink(head);
                let entry = self.entries.remove(head as usize);
                return Some((entry.deadline, entry.value));
            }
            match self.next_slot() {
                Some((list, start)) if start <= now => {
                    self.elapsed = start;
                    self.cascade(list);
                }
                _ => {
                    self.elapsed = now;
                    return None;
                }
            }
        }
    }

    /// Panics unless every live entry is linked on exactly one list, which is the list its
    /// deadline belongs on at `elapsed()`; the links run both ways; the bitmaps match the
    /// non-empty slots; and `len()` counts the linked entries. O(len): for tests.
    pub fn check_invariants(&self) {
        let mut linked = 0;
        for (n, &List { head, tail }) in self.lists.iter().enumerate() {
            let list = ListId::new(n);
            assert_eq!(head == NIL, tail == NIL, "{list:?}: head and tail disagree");
            if let Some((level, slot)) = list.level_slot() {
                let bit = (self.occupied[level] >> slot) & 1 == 1;
                assert_eq!(bit, head != NIL, "{list:?}: the bitmap disagrees");
            }
            let (mut prev, mut index) = (NIL, head);
            while index != NIL {
                linked += 1;
                assert!(linked <= self.len(), "{list:?} loops or shares entries");
                let entry = self.entries.get(index as usize);
                let entry = entry.unwrap_or_else(|| panic!("{list:?} links free entry {index}"));
                assert_eq!(entry.list, list, "entry {index} records another list");
                assert_eq!(entry.prev, prev, "entry {index}: prev link is wrong");
                assert!(entry.deadline >= self.elapsed, "entry {index} is overdue");
                let home = list_for(self.elapsed, entry.deadline);
                assert_eq!(
                    home, list,
                    "entry {index} (due {}) misplaced",
                    entry.deadline
                );
                (prev, index) = (index, entry.next);
            }
            assert_eq!(tail, prev, "{list:?}: tail is not the last entry");
        }
        assert_eq!(linked, self.len(), "some live entries are on no list");
    }

    /// The lowest level's next non-empty slot, as its list and the tick it starts at.
    fn next_slot(&self) -> Option<(ListId, Tick)> {
        let level = self.occupied.iter().position(|&bits| bits != 0)?;
        let shift = level as u32 * SLOT_BITS;
        // Slots counted from tick 0: `current` is the one `elapsed` is in. Below the top level
        // every timer is in a later slot of the current 64. The top level is a ring where
        // the current slot and the ones before it hold timers a turn ahead; so the scan
        // starts just after `current` and wraps round.
        let current = self.elapsed >> shift;
        let after = ((current + 1) & SLOT_MASK) as u32;
        let distance = self.occupied[level].rotate_right(after).trailing_zeros();
        let index = current + 1 + u64::from(distance);
        debug_assert!(
            index <= Tick::MAX >> shift,
            "slot starts past the end of time"
        );
        let slot = (index & SLOT_MASK) as usize;
        Some((ListId::slot(level, slot), index << shift))
    }

    /// Takes the whole of `list` and re-links each entry, in order, on the list its deadline
    /// belongs on now: a lower level, the same top slot a turn later, or the pending list.
    fn cascade(&mut self, list: ListId) {
        let taken = std::mem::replace(&mut self.lists[list.index()], List::EMPTY);
        self.vacate(list);
        let mut index = taken.head;
        while index != NIL {
            let entry = &self.entries[index as usize];
            let (next, home) = (entry.next, list_for(self.elapsed, entry.deadline));
            self.push_back(home, index);
            index = next;
        }
    }

    fn push_back(&mut self, list: ListId, index: u32) {
        let tail = self.lists[list.index()].tail;
        let entry = &mut self.entries[index as usize];
        entry.list = list;
        entry.prev = tail;
        entry.next = NIL;
        match tail {
            NIL => self.lists[list.index()].head = index,
            _ => self.entries[tail as usize].next = index,
        }
        self.lists[list.index()].tail = index;
        if let Some((level, slot)) = list.level_slot() {
            self.occupied[level] |= 1 << slot;
        }
    }

    fn unlink(&mut self, index: u32) {
        let Entry {
            prev, next, list, ..
        } = self.entries[index as usize];
        let links = &mut self.lists[list.index()];
        match prev {
            NIL => links.head = next,
            _ => self.entries[prev as usize].next = next,
        }
        match next {
            NIL => links.tail = prev,
            _ => self.entries[next as usize].prev = prev,
        }
        if links.head == NIL {
            self.vacate(list);
        }
    }

    /// Clears the occupied bit of an emptied slot list.
    fn vacate(&mut self, list: ListId) {
        if let Some((level, slot)) = list.level_slot() {
            self.occupied[level] &= !(1 << slot);
        }
    }

    fn entry(&self, key: TimerKey) -> &Entry<T> {
        match self.entries.get(key.0 as usize) {
            Some(entry) => entry,
            None => panic!("{key:?} is not a live timer"),
        }
    }

    fn assert_live(&self, key: TimerKey) {
        assert!(
            self.entries.contains(key.0 as usize),
            "{key:?} is not a live timer"
        );
    }
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("elapsed", &self.elapsed)
            .field("len", &self.len())
            .field("next_deadline", &self.next_deadline())
            .finish()
    }
}

/// The list a timer due at `deadline` (not before `elapsed`) belongs on at time `elapsed`.
fn list_for(elapsed: Tick, deadline: Tick) -> ListId {
    debug_assert!(deadline >= elapsed);
    if deadline == elapsed {
        return ListId::PENDING;
    }
    // The highest bit in which the two differ picks the level (tokio's `level_for`); a
    // deadline farther than the span goes on the top level.
    let highest = 63 - (elapsed ^ deadline).leading_zeros();
    let level = (highest / SLOT_BITS).min(LEVELS as u32 - 1);
    let slot = (deadline >> (level * SLOT_BITS)) & SLOT_MASK;
    ListId::slot(level as usize, slot as usize)
}

#[cfg(test)]
mod tests {
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
                let mut expected: Vec<Tick> =
                    drain(&mut wheel, advance).iter().map(|f| f.0).collect();
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
}
