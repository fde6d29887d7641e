//! A hierarchical timing wheel: the one place a shard keeps its deadlines.
//!
//! This is the hierarchical wheel of G. Varghese and T. Lauck, "Hashed and Hierarchical
//! Timing Wheels: Data Structures for the Efficient Implementation of a Timer Facility"
//! (SOSP 1987), laid out as in tokio's `runtime/time/wheel` and Linux's `kernel/time/timer.c`:
//!
//! - **Levels.** Six levels of 64 slots. A slot on level `l` covers `64^l` ticks, so level 0
//!   has a slot per tick and the wheel spans `64^6 = 2^36` ticks (2.2 years of 1 ms ticks).
//!   A timer goes on the level of its *distance* from [`Wheel::elapsed`] (level `l` for
//!   `64^l` up to `64^(l+1)` ticks away), in the slot named by the deadline's six bits of
//!   that level, as in Kafka's `TimingWheel`. All the timers in one level-0 slot are due at
//!   the same tick; a higher slot holds a range. (tokio picks the level by the highest bit in
//!   which deadline and time differ instead; then every timer set across a `64^l` boundary
//!   lands in the one slot that starts there, and time reaching it moves them all at once:
//!   with a million 2-second leases renewed every second, that was every lease of the shard,
//!   a 20 ms stall every 4 seconds. By distance, a slot holds only the timers due in its
//!   own range.)
//! - **Bitmaps.** Each level keeps a `u64` of its non-empty slots. Every timer of a level is
//!   in one of the 64 slots after the one `elapsed` is in, so each level's next slot is a
//!   rotate and a `trailing_zeros`, never a walk over slots; the next slot of the wheel is
//!   the one of the six that starts first.
//! - **Cascading.** When time reaches a slot above level 0, its whole list is taken and every
//!   timer in it is re-linked against the new time, which moves it at least one level
//!   down (but for the far timers below). When time reaches a level-0 slot, its list
//!   becomes the *pending* list that [`Wheel::poll`] pops from; a timer inserted for that
//!   same tick joins the pending list behind it. Lists are appended to; a cascade puts the
//!   timers it moves at the *front* of their new lists (they were set farther ahead, so
//!   before the timers already there), and slots of several levels starting at the same
//!   tick are taken lowest first; so equal deadlines fire in insertion order.
//! - **Beyond the span.** The top level is a ring. A timer due after the top level's
//!   current turn (any deadline up to `Tick::MAX`) waits in the top slot named by its
//!   deadline's bits 30..36, is taken out again each time time comes round to that slot
//!   (once per `64^6` ticks) and goes back until its deadline is within the turn. It never
//!   fires early and is never dropped.
//!
//! Timers live in a slab that grows by fixed-size chunks and never moves its entries (so
//! a wheel of millions of timers grows without a copy). The lists are doubly linked through
//! slab indices and every entry records the list it is on, so cancel and reset unlink in
//! O(1) and allocate nothing.
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

use crate::chunked::ChunkSlab;

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
    entries: ChunkSlab<Entry<T>>,
    /// `LEVELS * SLOTS` slot lists, then the pending list; indexed by `ListId::index`.
    lists: Box<[List]>,
    /// Bit `s` of `occupied[l]` is set exactly when slot `s` of level `l` is non-empty.
    occupied: [u64; LEVELS],
    elapsed: Tick,
    /// Timers moved by cascades so far.
    #[cfg(test)]
    cascaded: u64,
}

impl<T> Wheel<T> {
    /// An empty wheel at tick 0.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty wheel at tick 0 with room for `n` timers before it allocates.
    pub fn with_capacity(n: usize) -> Self {
        Wheel {
            entries: ChunkSlab::with_capacity(n),
            lists: vec![List::EMPTY; LEVELS * SLOTS + 1].into_boxed_slice(),
            occupied: [0; LEVELS],
            elapsed: 0,
            #[cfg(test)]
            cascaded: 0,
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

    /// Whether no timer is pending.
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

    /// The value of a live timer. Panics on a key that is not live.
    pub fn get(&self, key: TimerKey) -> &T {
        &self.entry(key).value
    }

    /// The value of a live timer, to change it in place. Panics on a key that is not live.
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
                Some((_, start)) if start <= now => {
                    // Every slot starting at this tick, lowest level first: the higher ones
                    // hold older timers, which go ahead of the lower ones' before any fires.
                    let due: [Option<ListId>; LEVELS] = std::array::from_fn(|level| {
                        self.level_next(level)
                            .filter(|&(_, s)| s == start)
                            .map(|(list, _)| list)
                    });
                    self.elapsed = start;
                    for list in due.into_iter().flatten() {
                        self.cascade(list);
                    }
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
                self.assert_placed(list, entry.deadline, index);
                (prev, index) = (index, entry.next);
            }
            assert_eq!(tail, prev, "{list:?}: tail is not the last entry");
        }
        assert_eq!(linked, self.len(), "some live entries are on no list");
    }

    /// Panics unless a timer due at `deadline` may be on `list` now: pending when due now;
    /// else in the slot its deadline names on that level, a slot that starts after
    /// `elapsed` and, below the top level, among the 64 after the current one; and no
    /// lower than the level it would go on now (timers only move down).
    fn assert_placed(&self, list: ListId, deadline: Tick, index: u32) {
        let Some((level, slot)) = list.level_slot() else {
            assert_eq!(
                deadline, self.elapsed,
                "entry {index} is pending but not due"
            );
            return;
        };
        assert!(
            deadline > self.elapsed,
            "entry {index} is due but on {list:?}"
        );
        let shift = level as u32 * SLOT_BITS;
        let (named, current) = (deadline >> shift, self.elapsed >> shift);
        assert_eq!(
            (named & SLOT_MASK) as usize,
            slot,
            "entry {index} (due {deadline}) is on {list:?}"
        );
        assert!(named > current, "entry {index} is on a slot already passed");
        if level + 1 < LEVELS {
            assert!(
                named <= current.saturating_add(SLOTS as u64),
                "entry {index} is a turn ahead"
            );
        }
        let home = level_for(deadline - self.elapsed) as usize;
        assert!(
            level >= home,
            "entry {index} (due {deadline}) is below level {home}"
        );
    }

    /// The non-empty slot that starts first, as its list and the tick it starts at; of
    /// slots starting at the same tick, the one on the lowest level.
    fn next_slot(&self) -> Option<(ListId, Tick)> {
        let mut best: Option<(ListId, Tick)> = None;
        for level in 0..LEVELS {
            if let Some((list, start)) = self.level_next(level) {
                if best.is_none_or(|(_, earliest)| start < earliest) {
                    best = Some((list, start));
                }
            }
        }
        best
    }

    /// The next non-empty slot of `level`, as its list and the tick it starts at.
    fn level_next(&self, level: usize) -> Option<(ListId, Tick)> {
        let bits = self.occupied[level];
        if bits == 0 {
            return None;
        }
        let shift = level as u32 * SLOT_BITS;
        // Slots counted from tick 0: `current` is the one `elapsed` is in. Every timer of this
        // level is in one of the 64 slots after it (the top level also holds timers whole
        // turns ahead), so the scan starts just after `current` and wraps round.
        let current = self.elapsed >> shift;
        let after = ((current + 1) & SLOT_MASK) as u32;
        let distance = bits.rotate_right(after).trailing_zeros();
        let index = current + 1 + u64::from(distance);
        debug_assert!(
            index <= Tick::MAX >> shift,
            "slot starts past the end of time"
        );
        Some((
            ListId::slot(level, (index & SLOT_MASK) as usize),
            index << shift,
        ))
    }

    /// Takes the whole of `list` and re-links each entry on the list its deadline belongs
    /// on now: a lower level, the same top slot a turn later, or the pending list. They go
    /// to the *front* of those lists, keeping their order: a timer placed on a higher level
    /// was placed farther from its deadline, so before any timer with the same deadline
    /// that a lower list holds; putting it first keeps equal deadlines in insertion order.
    fn cascade(&mut self, list: ListId) {
        let taken = std::mem::replace(&mut self.lists[list.index()], List::EMPTY);
        self.vacate(list);
        let mut index = taken.tail;
        while index != NIL {
            let entry = &self.entries[index as usize];
            let (prev, home) = (entry.prev, list_for(self.elapsed, entry.deadline));
            self.push_front(home, index);
            index = prev;
            #[cfg(test)]
            {
                self.cascaded += 1;
            }
        }
    }

    fn push_front(&mut self, list: ListId, index: u32) {
        let head = self.lists[list.index()].head;
        let entry = &mut self.entries[index as usize];
        entry.list = list;
        entry.prev = NIL;
        entry.next = head;
        match head {
            NIL => self.lists[list.index()].tail = index,
            _ => self.entries[head as usize].prev = index,
        }
        self.lists[list.index()].head = index;
        if let Some((level, slot)) = list.level_slot() {
            self.occupied[level] |= 1 << slot;
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

/// The list a timer due at `deadline` (not before `elapsed`) goes on at time `elapsed`.
fn list_for(elapsed: Tick, deadline: Tick) -> ListId {
    debug_assert!(deadline >= elapsed);
    if deadline == elapsed {
        return ListId::PENDING;
    }
    let level = level_for(deadline - elapsed);
    let slot = (deadline >> (level * SLOT_BITS)) & SLOT_MASK;
    ListId::slot(level as usize, slot as usize)
}

/// The level for a timer `distance` ticks away: level `l` holds distances in
/// `64^l .. 64^(l+1)`, the top level everything farther. (Kafka's `TimingWheel` picks by
/// distance the same way; picking by the highest bit in which deadline and `elapsed`
/// differ, as tokio does, would put every timer that crosses a level boundary on that
/// level, and time reaching the boundary would then cascade all of them at once.)
fn level_for(distance: Tick) -> u32 {
    debug_assert!(distance > 0);
    let highest = 63 - distance.leading_zeros();
    (highest / SLOT_BITS).min(LEVELS as u32 - 1)
}

#[cfg(test)]
mod tests;
