//! A slab whose storage grows in fixed-size chunks and never moves.
//!
//! `slab::Slab` keeps its entries in one `Vec`: when a queue holding millions of messages
//! outgrows it, the push that triggers the growth copies every entry (hundreds of MB, a
//! stall of a good part of a second on the shard thread), and the old buffer lingers in
//! the allocator's caches afterwards. Here entries live in chunks of [`CHUNK`] slots each,
//! allocated once at their full size and never reallocated: growth costs one chunk, a key is
//! stable for the life of its entry, and the memory held is the entries plus a pointer per
//! chunk. Free slots are chained through a free list as in `slab` (the last freed is reused
//! first), so a steady workload keeps touching the same warm slots.

use std::ops::{Index, IndexMut};

/// log2 of the slots per chunk.
const CHUNK_BITS: u32 = 12;
/// Slots per chunk: 4 096, a few hundred KB for the engine's largest entries.
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;

enum Slot<T> {
    Full(T),
    /// Free; the next free slot, or the slot count when this is the last.
    Free(usize),
}

pub(crate) struct ChunkSlab<T> {
    /// Every chunk has capacity `CHUNK`; all but the last are full of slots.
    chunks: Vec<Vec<Slot<T>>>,
    /// Slots made so far (full or free).
    slots: usize,
    len: usize,
    /// Head of the free list; `slots` when no slot is free.
    next_free: usize,
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
            slots: 0,
            len: 0,
            next_free: 0,
        }
    }

    /// Room for `n` entries made up front (rounded up to whole chunks).
    pub fn with_capacity(n: usize) -> Self {
        let mut slab = ChunkSlab::new();
        slab.chunks.reserve(n.div_ceil(CHUNK));
        for _ in 0..n.div_ceil(CHUNK) {
            slab.chunks.push(Vec::with_capacity(CHUNK));
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
        self.chunks.len() * CHUNK
    }

    /// Stores `value` and returns its key.
    pub fn insert(&mut self, value: T) -> usize {
        let key = self.next_free;
        if key == self.slots {
            let chunk = key >> CHUNK_BITS;
            if chunk == self.chunks.len() {
                self.chunks.push(Vec::with_capacity(CHUNK));
            }
            let slots = &mut self.chunks[chunk];
            debug_assert!(slots.len() < CHUNK && slots.capacity() == CHUNK);
            slots.push(Slot::Full(value));
            self.slots += 1;
            self.next_free = self.slots;
        } else {
            let slot = self.slot_mut(key);
            let Slot::Free(next) = *slot else {
                unreachable!("the free list holds only free slots")
            };
            *slot = Slot::Full(value);
            self.next_free = next;
        }
        self.len += 1;
        key
    }

    /// Takes the entry out; panics if `key` holds none.
    pub fn remove(&mut self, key: usize) -> T {
        self.try_remove(key)
            .unwrap_or_else(|| panic!("no entry at key {key}"))
    }

    pub fn try_remove(&mut self, key: usize) -> Option<T> {
        if key >= self.slots {
            return None;
        }
        let next_free = self.next_free;
        let slot = self.slot_mut(key);
        if let Slot::Free(_) = slot {
            return None;
        }
        let Slot::Full(value) = std::mem::replace(slot, Slot::Free(next_free)) else {
            unreachable!("checked full above")
        };
        self.next_free = key;
        self.len -= 1;
        Some(value)
    }

    pub fn get(&self, key: usize) -> Option<&T> {
        match self.chunks.get(key >> CHUNK_BITS)?.get(key & (CHUNK - 1))? {
            Slot::Full(value) => Some(value),
            Slot::Free(_) => None,
        }
    }

    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self
            .chunks
            .get_mut(key >> CHUNK_BITS)?
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
        self.chunks
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(key, slot)| match slot {
                Slot::Full(value) => Some((key, value)),
                Slot::Free(_) => None,
            })
    }

    fn slot_mut(&mut self, key: usize) -> &mut Slot<T> {
        &mut self.chunks[key >> CHUNK_BITS][key & (CHUNK - 1)]
    }
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
mod tests {
    use super::*;

    #[test]
    fn keys_are_reused_last_freed_first_and_entries_never_move() {
        let mut s = ChunkSlab::new();
        let keys: Vec<usize> = (0..3 * CHUNK + 5).map(|i| s.insert(i)).collect();
        assert_eq!(keys, (0..3 * CHUNK + 5).collect::<Vec<_>>());
        let first = &s[0] as *const usize;
        for i in 0..10 * CHUNK {
            s.insert(i);
        }
        assert_eq!(first, &s[0] as *const usize, "growth moved an entry");
        assert_eq!(s.remove(7), 7);
        assert_eq!(s.remove(CHUNK + 1), CHUNK + 1);
        assert_eq!(s.try_remove(7), None);
        assert!(!s.contains(7));
        assert_eq!(s.insert(100), CHUNK + 1);
        assert_eq!(s.insert(200), 7);
        assert_eq!(s.insert(300), 13 * CHUNK + 5);
        assert_eq!(s.len(), 13 * CHUNK + 6);
        assert_eq!(s[7], 200);
    }

    #[test]
    fn matches_slab_under_a_random_workload() {
        let mut ours = ChunkSlab::new();
        let mut theirs = slab::Slab::new();
        let mut live: Vec<usize> = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 5 < 3 || live.is_empty() {
                let k = ours.insert(step);
                assert_eq!(k, theirs.insert(step));
                live.push(k);
            } else {
                let k = live.swap_remove((x >> 8) as usize % live.len());
                assert_eq!(ours.remove(k), theirs.remove(k));
            }
            assert_eq!(ours.len(), theirs.len());
        }
        let a: Vec<(usize, u64)> = ours.iter().map(|(k, v)| (k, *v)).collect();
        let b: Vec<(usize, u64)> = theirs.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(a, b);
        assert_eq!(ours.get(usize::MAX), None);
    }

    #[test]
    fn with_capacity_makes_whole_chunks() {
        let mut s = ChunkSlab::with_capacity(CHUNK + 1);
        assert!(s.is_empty());
        for i in 0..2 * CHUNK {
            assert_eq!(s.insert(i), i);
        }
        assert_eq!(s.chunks.len(), 2);
        s.insert(0);
        assert_eq!(s.chunks.len(), 3);
    }
}
