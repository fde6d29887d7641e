//! A queue's lease table, indexed by delivery tag.
//!
//! Tags are handed out one after another, and most leases end roughly in the order they
//! began, so live leases sit in a ring indexed by `tag - base`: a lookup is an index, not a
//! hash. A lease held long while later ones come and go would stretch the ring over a long
//! run of holes; once holes far outnumber live leases, the oldest leases move to an ordered map,
//! a few per call so that no call stalls, and memory stays proportional to the live leases.

use std::collections::BTreeMap;

use crate::deque::ChunkedDeque;

use crate::wheel::{Tick, TimerKey};

/// A live delivery.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub msg: u32,
    /// The consumer's slot in the shard.
    pub consumer: u32,
    pub timer: TimerKey,
    pub delivered_at: Tick,
}

/// The ring turns sparse when it is longer than this many times its live leases (plus
/// [`SLACK`]): several consumers settling their own leases leave every other slot empty
/// for a while, which is not yet worth a move.
const SPARSE_FACTOR: usize = 4;
/// Holes allowed in the ring beyond [`SPARSE_FACTOR`] times the live leases in it.
const SLACK: usize = 1024;
/// The most leases one call moves from the ring to the map: enough that a sparse ring
/// drains faster than one call can make holes, never so many that a call stalls.
const MOVES_PER_CALL: usize = 8;

#[derive(Debug)]
pub(crate) struct LeaseTable {
    /// The tag of `ring[0]`; `base + ring.len()` is the next tag to be handed out.
    base: u64,
    ring: ChunkedDeque<Option<Lease>>,
    in_ring: usize,
    /// Leases older than `base`.
    overflow: BTreeMap<u64, Lease>,
}

impl LeaseTable {
    /// An empty table whose first tag will be `first`.
    pub fn new(first: u64) -> LeaseTable {
        LeaseTable {
            base: first,
            ring: ChunkedDeque::new(),
            in_ring: 0,
            overflow: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.in_ring + self.overflow.len()
    }

    /// The tag the next [`insert`](Self::insert) must use.
    pub fn next_tag(&self) -> u64 {
        self.base + self.ring.len() as u64
    }

    /// Adds the lease of the next tag.
    #[inline]
    pub fn insert(&mut self, tag: u64, lease: Lease) {
        assert_eq!(tag, self.next_tag(), "tags are handed out in order");
        self.ring.push_back(Some(lease));
        self.in_ring += 1;
    }

    #[inline]
    pub fn get(&self, tag: u64) -> Option<&Lease> {
        if tag >= self.base {
            self.ring.get((tag - self.base) as usize)?.as_ref()
        } else {
            self.overflow.get(&tag)
        }
    }

    pub fn get_mut(&mut self, tag: u64) -> Option<&mut Lease> {
        if tag >= self.base {
            self.ring.get_mut((tag - self.base) as usize)?.as_mut()
        } else {
            self.overflow.get_mut(&tag)
        }
    }

    pub fn contains(&self, tag: u64) -> bool {
        self.get(tag).is_some()
    }

    pub fn remove(&mut self, tag: u64) -> Option<Lease> {
        if tag < self.base {
            return self.overflow.remove(&tag);
        }
        let lease = self.ring.get_mut((tag - self.base) as usize)?.take()?;
        self.in_ring -= 1;
        self.trim();
        Some(lease)
    }

    /// Drops leading holes; while holes dominate, moves a few of the oldest leases to the
    /// map (an ordered one: it grows without a rehashing pause).
    fn trim(&mut self) {
        let mut moves = 0;
        while let Some(front) = self.ring.front() {
            if front.is_some() {
                let too_sparse = self.ring.len() > SPARSE_FACTOR * self.in_ring + SLACK;
                if !too_sparse || moves == MOVES_PER_CALL {
                    break;
                }
                moves += 1;
            }
            if let Some(lease) = self.ring.pop_front().flatten() {
                self.in_ring -= 1;
                self.overflow.insert(self.base, lease);
            }
            self.base += 1;
        }
    }

    /// Every live lease, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Lease)> + '_ {
        let ring = self
            .ring
            .iter()
            .enumerate()
            .filter_map(|(i, l)| Some((self.base + i as u64, l.as_ref()?)));
        ring.chain(self.overflow.iter().map(|(&tag, l)| (tag, l)))
    }

    /// Cross-checks the counts; for tests.
    pub fn check_invariants(&self) {
        let live = self.ring.iter().filter(|l| l.is_some()).count();
        assert_eq!(live, self.in_ring, "ring count");
        assert!(
            self.ring.front().is_none_or(|l| l.is_some()),
            "no leading hole"
        );
        assert!(
            self.overflow.keys().all(|&t| t < self.base),
            "overflow holds old tags"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(msg: u32) -> Lease {
        Lease {
            msg,
            consumer: 0,
            timer: crate::wheel::Wheel::new().insert(0, ()),
            delivered_at: 0,
        }
    }

    #[test]
    fn leases_are_found_by_tag_and_removed_once() {
        let mut table = LeaseTable::new(1);
        for tag in 1..=10 {
            table.insert(tag, lease(tag as u32));
        }
        assert_eq!(table.len(), 10);
        assert_eq!(table.get(4).map(|l| l.msg), Some(4));
        assert_eq!(table.remove(4).map(|l| l.msg), Some(4));
        assert!(table.remove(4).is_none());
        assert!(table.get(11).is_none());
        assert!(table.get(0).is_none());
        assert_eq!(table.len(), 9);
        table.check_invariants();
    }

    #[test]
    fn one_old_lease_does_not_stretch_the_ring() {
        let mut table = LeaseTable::new(1);
        table.insert(1, lease(1));
        for tag in 2..100_000 {
            table.insert(tag, lease(0));
            assert!(table.remove(tag).is_some());
            table.check_invariants();
        }
        assert!(
            table.ring.len() <= SPARSE_FACTOR + SLACK,
            "ring length {}",
            table.ring.len()
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(1).map(|l| l.msg), Some(1), "moved, not lost");
        assert!(table.remove(1).is_some());
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn leases_settled_in_random_order_are_all_found_and_each_call_moves_few() {
        let mut table = LeaseTable::new(1);
        let n = 20_000u64;
        for tag in 1..=n {
            table.insert(tag, lease(tag as u32));
        }
        // A fixed permutation: multiply by a number coprime with n.
        let order: Vec<u64> = (0..n).map(|i| (i * 7_919) % n + 1).collect();
        for (done, &tag) in order.iter().enumerate() {
            let in_map = table.overflow.len();
            assert_eq!(table.remove(tag).map(|l| u64::from(l.msg)), Some(tag));
            assert!(
                table.overflow.len() <= in_map + MOVES_PER_CALL,
                "a call moved too many"
            );
            assert_eq!(table.len(), (n as usize) - done - 1);
            if done % 1_000 == 0 {
                table.check_invariants();
                for &left in &order[done + 1..] {
                    assert!(table.contains(left), "lease {left} lost");
                }
            }
        }
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn iter_sees_ring_and_overflow() {
        let mut table = LeaseTable::new(1);
        for tag in 1..=500 {
            table.insert(tag, lease(tag as u32));
        }
        for tag in 2..=499 {
            table.remove(tag);
        }
        let mut tags: Vec<u64> = table.iter().map(|(t, _)| t).collect();
        tags.sort_unstable();
        assert_eq!(tags, [1, 500]);
        table.check_invariants();
    }
}
