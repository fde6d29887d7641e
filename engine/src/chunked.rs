//! A slab whose storage grows in fixed-size chunks, never moves, and gives back what a
//! drained backlog no longer needs.
//!
//! `slab::Slab` keeps its entries in one `Vec`: when a queue holding millions of messages
//! outgrows it, the push that triggers the growth copies every entry (hundreds of MB, a
//! stall of a good part of a second on the shard thread), and the old buffer lingers in
//! the allocator's caches afterwards. Here entries live in chunks of [`CHUNK`] slots each,
//! allocated once at their full size and never reallocated: growth costs one chunk, and a
//! key is stable for the life of its entry.
//!
//! **Giving memory back.** A queue that held ten million messages for a minute must not
//! keep their slots for the rest of the process's life. So live entries are packed toward
//! the low chunks: an insert takes the slot freed last (most likely still in cache) when
//! its chunk lies within the span the entries would fill if packed, and else a slot in the
//! lowest chunk with room. As a backlog drains, the high chunks then empty for good. When a
//! chunk empties and the slab holds more than twice the chunks its entries need (plus
//! two), empty chunks are freed, the highest first, down to that bound: a depth that
//! swings by less than half frees and makes no chunk, while one that falls for good
//! leaves at most about twice its need. Freed chunks at the end are dropped from the list
//! altogether.

use std::ops::{Index, IndexMut};

/// log2 of the slots per chunk.
const CHUNK_BITS: u32 = 12;
/// Slots per chunk: 4 096, a few hundred KB for the engine's largest entries.
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;
/// Ends a chunk's free list.
const NONE: usize = usize::MAX;

enum Slot<T> {
    Full(T),
    /// Free; the next free slot of the same chunk, or `NONE`. Word-sized on purpose: with
    /// a `u32` here the compiler moved a `Full` into place through a misaligned copy that
    /// stalled store forwarding, which cost about 10 ns per insert.
    Free(usize),
}

struct Chunk<T> {
    /// Capacity `CHUNK` while the chunk is allocated, 0 once freed; slots past `len()` are
    /// not made yet.
    slots: Vec<Slot<T>>,
    /// Entries in it.
    used: u32,
    /// Head of its free list.
    free: usize,
}

impl<T> Chunk<T> {
    const FREED: Chunk<T> = Chunk {
        slots: Vec::new(),
        used: 0,
        free: NONE,
    };

    fn is_allocated(&self) -> bool {
        self.slots.capacity() > 0
    }
}

pub(crate) struct ChunkSlab<T> {
    chunks: Vec<Chunk<T>>,
    /// Bit `c % 64` of word `c / 64` is set when chunk `c` has room for an entry.
    open: Vec<u64>,
    /// Every word of `open` below this one is zero.
    open_from: usize,
    len: usize,
    /// Chunks holding memory.
    allocated: usize,
    /// The chunk of the last removal.
    hot: usize,
    /// Chunks freed so far, for tests.
    #[cfg(test)]
    freed: usize,
}

impl<T> Default for ChunkSlab<T> {
    fn default() -> Self {
        ChunkSlab::new()
    }
}

impl<T> ChunkSlab<T> {
    pub fn new() -> Self {
        ChunkSlab {
            chunks: Vec::new(),
            open: Vec::new(),
            open_from: 0,
            len: 0,
            allocated: 0,
            hot: 0,
            #[cfg(test)]
            freed: 0,
        }
    }

    /// Room for `n` entries made up front (rounded up to whole chunks). Chunks made here
    /// are freed like any other once the slab holds more than its entries need.
    pub fn with_capacity(n: usize) -> Self {
        let mut slab = ChunkSlab::new();
        for c in 0..n.div_ceil(CHUNK) {
            slab.push_chunk();
            slab.chunks[c].slots = Vec::with_capacity(CHUNK);
            slab.allocated += 1;
        }
        slab
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries it can hold before it allocates another chunk.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.allocated * CHUNK
    }

    /// Stores `value` and returns its key.
    ///
    /// The common case, a slot on the free list of the chosen chunk, makes no call before
    /// `value` is written: a call in between made the compiler park `value` on the stack
    /// and copy it into the slot with loads wider than the stores that built it, which
    /// stalls store forwarding (several nanoseconds per insert).
    #[inline(always)]
    pub fn insert(&mut self, value: T) -> usize {
        let c = if self.is_hot_open() {
            self.hot
        } else {
            match self.open.get(self.open_from) {
                Some(&word) if word != 0 => self.open_from * 64 + word.trailing_zeros() as usize,
                _ => return self.insert_slow(None, value),
            }
        };
        if self.chunks[c].free == NONE {
            return self.insert_slow(Some(c), value);
        }
        self.place(c, value)
    }

    /// Stores `value` where [`insert`](Self::insert)'s common case does not apply: in
    /// chunk `c`, which has no memory or only slots never used; or, when no word from
    /// `open_from` on has a chunk with room, in the one [`find_open`](Self::find_open) gives.
    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, c: Option<usize>, value: T) -> usize {
        let c = c.unwrap_or_else(|| self.find_open());
        if !self.chunks[c].is_allocated() {
            self.chunks[c].slots = Vec::with_capacity(CHUNK);
            self.allocated += 1;
        }
        self.place(c, value)
    }

    /// Stores `value` in chunk `c`, which has room and memory.
    #[inline(always)]
    fn place(&mut self, c: usize, value: T) -> usize {
        let chunk = &mut self.chunks[c];
        let i = chunk.free;
        let i = if i != NONE {
            let slot = &mut chunk.slots[i];
            let Slot::Free(next) = *slot else {
                unreachable!("a free list holds only free slots")
            };
            *slot = Slot::Full(value);
            chunk.free = next;
            i
        } else {
            debug_assert!(chunk.slots.len() < CHUNK && chunk.slots.capacity() == CHUNK);
            chunk.slots.push(Slot::Full(value));
            chunk.slots.len() - 1
        };
        chunk.used += 1;
        if chunk.used as usize == CHUNK {
            self.open[c / 64] &= !(1 << (c % 64));
        }
        self.len += 1;
        (c << CHUNK_BITS) | i
    }

    /// Whether the chunk of the last removal takes the next entry: it has room, holds
    /// memory, and lies within the chunks the entries would fill if packed.
    #[inline]
    fn is_hot_open(&self) -> bool {
        let hot = self.hot;
        hot <= self.len >> CHUNK_BITS
            && self
                .chunks
                .get(hot)
                .is_some_and(|c| c.is_allocated() && (c.used as usize) < CHUNK)
    }

    /// The lowest chunk with room when the word at `open_from` has none: a later word's,
    /// or a chunk made for it.
    #[cold]
    fn find_open(&mut self) -> usize {
        while let Some(&word) = self.open.get(self.open_from) {
            if word != 0 {
                return self.open_from * 64 + word.trailing_zeros() as usize;
            }
            self.open_from += 1;
        }
        self.push_chunk();
        self.chunks.len() - 1
    }

    /// Lists a chunk, freed, at the end.
    fn push_chunk(&mut self) {
        let c = self.chunks.len();
        self.chunks.push(Chunk::FREED);
        if c / 64 == self.open.len() {
            self.open.push(0);
        }
        self.set_open(c);
    }

    #[inline(always)]
    fn set_open(&mut self, c: usize) {
        self.open[c / 64] |= 1 << (c % 64);
        self.open_from = self.open_from.min(c / 64);
    }

    /// Takes the entry out; panics if `key` holds none.
    #[inline(always)]
    pub fn remove(&mut self, key: usize) -> T {
        let (c, i) = (key >> CHUNK_BITS, key & (CHUNK - 1));
        let Some(chunk) = self.chunks.get_mut(c) else {
            no_entry(key)
        };
        let used = chunk.used as usize;
        if used == 1 {
            return self.remove_last(c, i);
        }
        if !matches!(chunk.slots.get(i), Some(Slot::Full(_))) {
            no_entry(key);
        }
        if used == CHUNK {
            self.set_open(c);
        }
        // As in `insert`: nothing happens between taking the value out and handing it
        // back, so the compiler need not park it on the stack.
        self.take(c, i)
    }

    /// Takes the entry out, if `key` holds one.
    #[cfg(test)]
    pub fn try_remove(&mut self, key: usize) -> Option<T> {
        self.contains(key).then(|| self.remove(key))
    }

    /// Takes the entry out of slot `i` of chunk `c`, which holds one.
    #[inline(always)]
    fn take(&mut self, c: usize, i: usize) -> T {
        let chunk = &mut self.chunks[c];
        let Slot::Full(value) = std::mem::replace(&mut chunk.slots[i], Slot::Free(chunk.free))
        else {
            unreachable!("the caller checked it full")
        };
        chunk.free = i;
        chunk.used -= 1;
        self.hot = c;
        self.len -= 1;
        value
    }

    /// Takes the last entry out of chunk `c`, at slot `i` if it is there, and frees empty
    /// chunks if the slab now holds too much. Only here: a chunk kept empty while the slab
    /// needed it is freed at a later chunk's emptying.
    #[cold]
    #[inline(never)]
    fn remove_last(&mut self, c: usize, i: usize) -> T {
        if !matches!(self.chunks[c].slots.get(i), Some(Slot::Full(_))) {
            no_entry((c << CHUNK_BITS) | i);
        }
        let value = self.take(c, i);
        if self.holds_too_much() {
            self.free_empties();
        }
        value
    }

    /// Whether the slab holds more than twice the chunks its entries need, plus two.
    fn holds_too_much(&self) -> bool {
        self.allocated > 2 * (self.len >> CHUNK_BITS) + 2
    }

    /// Frees empty chunks, highest first (inserts prefer the low ones, and freed chunks at
    /// the end can be dropped from the list), until the slab no longer holds too much.
    /// A scan of the chunk list, on the rare removal that empties a chunk.
    #[cold]
    fn free_empties(&mut self) {
        for c in (0..self.chunks.len()).rev() {
            if !self.holds_too_much() {
                break;
            }
            let chunk = &mut self.chunks[c];
            if chunk.used == 0 && chunk.is_allocated() {
                *chunk = Chunk::FREED;
                self.allocated -= 1;
                #[cfg(test)]
                {
                    self.freed += 1;
                }
            }
        }
        while self.chunks.last().is_some_and(|c| !c.is_allocated()) {
            self.chunks.pop();
            let c = self.chunks.len();
            self.open[c / 64] &= !(1 << (c % 64));
        }
        self.open.truncate(self.chunks.len().div_ceil(64));
        self.open_from = self.open_from.min(self.open.len());
    }

    #[inline(always)]
    pub fn get(&self, key: usize) -> Option<&T> {
        match self
            .chunks
            .get(key >> CHUNK_BITS)?
            .slots
            .get(key & (CHUNK - 1))?
        {
            Slot::Full(value) => Some(value),
            Slot::Free(_) => None,
        }
    }

    #[inline(always)]
    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self
            .chunks
            .get_mut(key >> CHUNK_BITS)?
            .slots
            .get_mut(key & (CHUNK - 1))?
        {
            Slot::Full(value) => Some(value),
            Slot::Free(_) => None,
        }
    }

    pub fn contains(&self, key: usize) -> bool {
        self.get(key).is_some()
    }

    /// Every entry with its key, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk
                .slots
                .iter()
                .enumerate()
                .filter_map(move |(i, slot)| match slot {
                    Slot::Full(value) => Some(((c << CHUNK_BITS) | i, value)),
                    Slot::Free(_) => None,
                })
        })
    }
}

#[cold]
#[inline(never)]
fn no_entry(key: usize) -> ! {
    panic!("no entry at key {key}")
}

impl<T> Index<usize> for ChunkSlab<T> {
    type Output = T;

    fn index(&self, key: usize) -> &T {
        self.get(key)
            .unwrap_or_else(|| panic!("no entry at key {key}"))
    }
}

impl<T> IndexMut<usize> for ChunkSlab<T> {
    fn index_mut(&mut self, key: usize) -> &mut T {
        self.get_mut(key)
            .unwrap_or_else(|| panic!("no entry at key {key}"))
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ChunkSlab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
impl<T> ChunkSlab<T> {
    /// Panics unless the bookkeeping agrees with the slots.
    fn check_invariants(&self) {
        let mut len = 0;
        let mut allocated = 0;
        for (c, chunk) in self.chunks.iter().enumerate() {
            let full = chunk
                .slots
                .iter()
                .filter(|s| matches!(s, Slot::Full(_)))
                .count();
            assert_eq!(chunk.used as usize, full, "chunk {c}");
            assert!(chunk.slots.capacity() == CHUNK || !chunk.is_allocated());
            let mut free = 0;
            let mut at = chunk.free;
            while at != NONE {
                let Slot::Free(next) = chunk.slots[at] else {
                    panic!("chunk {c}: a full slot on the free list");
                };
                free += 1;
                at = next;
            }
            assert_eq!(free + full, chunk.slots.len(), "chunk {c}: free list");
            let open = self.open[c / 64] >> (c % 64) & 1 == 1;
            assert_eq!(open, full < CHUNK, "chunk {c}: open bit");
            len += full;
            allocated += usize::from(chunk.is_allocated());
        }
        assert_eq!(len, self.len);
        assert_eq!(allocated, self.allocated);
        assert!(self.open[..self.open_from].iter().all(|&w| w == 0));
        assert_eq!(self.open.len(), self.chunks.len().div_ceil(64));
        assert!(self.chunks.last().is_none_or(Chunk::is_allocated));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_lowest_chunk_with_room_and_entries_never_move() {
        let mut s = ChunkSlab::new();
        let keys: Vec<usize> = (0..3 * CHUNK + 5).map(|i| s.insert(i)).collect();
        assert_eq!(keys, (0..3 * CHUNK + 5).collect::<Vec<_>>());
        let first = &s[0] as *const usize;
        for i in 0..10 * CHUNK {
            s.insert(i);
        }
        assert_eq!(first, &s[0] as *const usize, "growth moved an entry");
        assert_eq!(s.remove(CHUNK + 1), CHUNK + 1);
        assert_eq!(s.remove(7), 7);
        assert_eq!(s.remove(9), 9);
        assert_eq!(s.try_remove(7), None);
        assert!(!s.contains(7));
        // Chunk 0 first, its last freed slot first; then chunk 1; then a new slot.
        assert_eq!(s.insert(100), 9);
        assert_eq!(s.insert(200), 7);
        assert_eq!(s.insert(300), CHUNK + 1);
        assert_eq!(s.insert(400), 13 * CHUNK + 5);
        assert_eq!(s.len(), 13 * CHUNK + 6);
        assert_eq!(s[7], 200);
        s.check_invariants();
    }

    #[test]
    fn matches_a_map_under_a_random_workload() {
        let mut ours = ChunkSlab::new();
        let mut model = std::collections::BTreeMap::new();
        let mut live: Vec<usize> = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for step in 0..300_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Spells of growth and of draining, so that chunks fill, empty and are freed.
            let grow = if (step / 40_000) % 2 == 0 { 4 } else { 1 };
            if x % 5 < grow || live.is_empty() {
                let k = ours.insert(step);
                assert_eq!(model.insert(k, step), None, "key {k} given twice");
                live.push(k);
            } else {
                let k = live.swap_remove((x >> 8) as usize % live.len());
                assert_eq!(ours.remove(k), model.remove(&k).unwrap());
                assert_eq!(ours.try_remove(k), None);
            }
            assert_eq!(ours.len(), model.len());
            if step % 997 == 0 {
                ours.check_invariants();
            }
        }
        let a: Vec<(usize, u64)> = ours.iter().map(|(k, v)| (k, *v)).collect();
        let b: Vec<(usize, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(a, b);
        assert_eq!(ours.get(usize::MAX), None);
        ours.check_invariants();
    }

    #[test]
    fn a_drained_slab_keeps_at_most_two_chunks() {
        let mut s = ChunkSlab::new();
        let keys: Vec<usize> = (0..10 * CHUNK).map(|i| s.insert(i)).collect();
        assert_eq!(s.allocated, 10);
        for k in keys {
            s.remove(k);
        }
        s.check_invariants();
        assert!(s.allocated <= 2, "{} chunks held", s.allocated);
        assert!(s.insert(1) < CHUNK);
        assert!(s.allocated <= 2, "a chunk was made while two were held");
        s.check_invariants();
    }

    #[test]
    fn a_backlog_draining_while_entries_keep_coming_gives_its_chunks_back() {
        // A FIFO queue: 20 chunks' worth of backlog, then two leave for each one that
        // comes, until half a chunk is left.
        let mut s = ChunkSlab::new();
        let mut fifo: std::collections::VecDeque<usize> =
            (0..20 * CHUNK).map(|i| s.insert(i)).collect();
        let mut n = 0;
        while fifo.len() > CHUNK / 2 {
            s.remove(fifo.pop_front().unwrap());
            n += 1;
            if n % 2 == 0 {
                fifo.push_back(s.insert(n));
            }
        }
        s.check_invariants();
        assert!(
            s.allocated <= 2,
            "{} chunks held for {} entries",
            s.allocated,
            s.len()
        );
    }

    #[test]
    fn a_depth_swinging_by_less_than_half_frees_no_chunk() {
        // A FIFO queue whose depth goes back and forth between 10 and 16 chunks' worth.
        let mut s = ChunkSlab::new();
        let mut fifo: std::collections::VecDeque<usize> =
            (0..16 * CHUNK).map(|i| s.insert(i)).collect();
        for round in 0..20 {
            while fifo.len() > 10 * CHUNK {
                s.remove(fifo.pop_front().unwrap());
            }
            while fifo.len() < 16 * CHUNK {
                fifo.push_back(s.insert(round));
            }
        }
        s.check_invariants();
        assert_eq!(s.freed, 0);
        // Falling for good, to a chunk's worth, it gives back all but about twice that.
        while fifo.len() > CHUNK {
            s.remove(fifo.pop_front().unwrap());
        }
        s.check_invariants();
        assert!(s.freed > 0);
        assert!(s.allocated <= 4, "{} chunks held", s.allocated);
    }

    #[test]
    fn a_workload_across_a_chunk_boundary_keeps_its_chunk() {
        let mut s = ChunkSlab::new();
        for i in 0..CHUNK {
            s.insert(i);
        }
        let k = s.insert(0);
        let spare = &s[k] as *const usize;
        for i in 0..1000 {
            s.remove(k);
            assert_eq!(s.insert(i), k);
            assert_eq!(
                &s[k] as *const usize, spare,
                "the chunk was freed and made again"
            );
        }
        s.check_invariants();
        assert_eq!(s.freed, 0);
    }

    #[test]
    fn with_capacity_makes_whole_chunks() {
        let mut s = ChunkSlab::with_capacity(CHUNK + 1);
        assert!(s.is_empty());
        assert_eq!(s.capacity(), 2 * CHUNK);
        for i in 0..2 * CHUNK {
            assert_eq!(s.insert(i), i);
        }
        assert_eq!(s.chunks.len(), 2);
        s.insert(0);
        assert_eq!(s.chunks.len(), 3);
        s.check_invariants();
        let mut s: ChunkSlab<usize> = ChunkSlab::with_capacity(10 * CHUNK);
        let k = s.insert(1);
        s.remove(k);
        s.check_invariants();
        assert!(
            s.allocated <= 2,
            "unused chunks made up front are freed too"
        );
    }
}
