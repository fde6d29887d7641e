//! The tags delivered to one consumer, for `ack_up_to` and cancel.

use crate::deque::ChunkedDeque;

/// Tags moved per call while a sweep runs: more than the one tag a call can add, so a
/// sweep always ends, and few enough that no call stalls.
const SWEEP_STEP: usize = 8;
/// Settled tags dropped from the front per call. When a lease held long at the front ends,
/// tens of thousands settled after it may be waiting behind it; dropping them all in one
/// call stalled the shard for a millisecond. What is left goes in later calls or in the
/// sweep.
const FRONT_STEP: usize = 16;

/// The tags delivered to one consumer, in order. Settled tags are dropped lazily: a few per
/// call from the front (settles mostly come in delivery order), and by a sweep once they
/// outnumber the live ones. The sweep moves a few tags per call from `rest` to `swept`,
/// keeping the live ones, so that a consumer holding 60 000 leases never pays for one pass
/// over all of them in a single call (that pass, looking each tag up in the lease table,
/// stalled its shard for milliseconds).
#[derive(Debug, Default)]
pub(crate) struct Tags {
    /// Swept: tags that were live when the sweep passed them, all before `rest`'s.
    swept: ChunkedDeque<u64>,
    /// Not yet swept (every tag, while no sweep runs); new tags go on its back.
    rest: ChunkedDeque<u64>,
    sweeping: bool,
}

impl Tags {
    pub fn push(&mut self, tag: u64) {
        debug_assert!(self.rest.back().is_none_or(|&t| t < tag), "tags in order");
        self.rest.push_back(tag);
    }

    pub fn len(&self) -> usize {
        self.swept.len() + self.rest.len()
    }

    pub fn front(&self) -> Option<u64> {
        self.swept.front().or(self.rest.front()).copied()
    }

    pub fn pop_front(&mut self) -> Option<u64> {
        self.swept.pop_front().or_else(|| self.rest.pop_front())
    }

    /// Every tag, in order, settled ones included.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.swept.iter().chain(self.rest.iter()).copied()
    }

    /// Takes every tag, in order.
    pub fn take(&mut self) -> impl Iterator<Item = u64> {
        let swept = std::mem::take(&mut self.swept);
        let rest = std::mem::take(&mut self.rest);
        self.sweeping = false;
        swept.into_entries().chain(rest.into_entries())
    }

    /// After a lease of this consumer ended: drops a few settled tags at the front, and
    /// starts or continues the sweep. `held` is how many leases are live; `live` tells a
    /// live tag.
    pub fn tidy(&mut self, held: usize, live: impl Fn(u64) -> bool) {
        for _ in 0..FRONT_STEP {
            if self.front().is_none_or(&live) {
                break;
            }
            self.pop_front();
        }
        if !self.sweeping && self.len() > 2 * held + 32 {
            self.sweeping = true;
        }
        if !self.sweeping {
            return;
        }
        for _ in 0..SWEEP_STEP {
            let Some(tag) = self.rest.pop_front() else {
                break;
            };
            if live(tag) {
                self.swept.push_back(tag);
            }
        }
        if self.rest.is_empty() {
            // Done: everything is in `swept`. Keep both allocations for the next sweep.
            std::mem::swap(&mut self.swept, &mut self.rest);
            self.sweeping = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_sweep_keeps_order_and_live_tags_and_bounds_the_list() {
        let mut tags = Tags::default();
        let mut live = BTreeSet::new();
        let mut next = 1u64;
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut longest = 0;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Deliver while fewer than 1 000 are live; settle a random live one otherwise,
            // never the oldest (so the front drop alone cannot keep up).
            if live.len() < 1_000 && !x.is_multiple_of(3) {
                tags.push(next);
                live.insert(next);
                next += 1;
            } else if live.len() > 1 {
                let skip = 1 + (x >> 8) as usize % (live.len() - 1);
                let tag = *live.iter().nth(skip).expect("in range");
                live.remove(&tag);
                tags.tidy(live.len(), |t| live.contains(&t));
            }
            longest = longest.max(tags.len());
            let listed: Vec<u64> = tags.iter().collect();
            assert!(listed.windows(2).all(|w| w[0] < w[1]), "out of order");
            assert!(
                live.iter().all(|t| listed.binary_search(t).is_ok()),
                "a live tag lost"
            );
        }
        assert!(longest <= 3 * 1_000, "the list grew to {longest}");
        let taken: Vec<u64> = tags.take().filter(|t| live.contains(t)).collect();
        assert_eq!(taken, live.iter().copied().collect::<Vec<_>>());
        assert_eq!(tags.len(), 0);
    }

    /// A lease held at the front while thousands after it are settled, then settled itself:
    /// no call looks at more than a few tags, and the list still shrinks back.
    #[test]
    fn the_end_of_a_long_front_lease_is_tidied_a_few_tags_per_call() {
        let mut tags = Tags::default();
        let mut live = BTreeSet::new();
        for tag in 1..=30_000u64 {
            tags.push(tag);
            live.insert(tag);
        }
        let looked = std::cell::Cell::new(0usize);
        let mut most_looked = 0;
        let mut tidy = |tags: &mut Tags, live: &BTreeSet<u64>| {
            looked.set(0);
            tags.tidy(live.len(), |t| {
                looked.set(looked.get() + 1);
                live.contains(&t)
            });
            most_looked = most_looked.max(looked.get());
        };
        // 10 000 settled behind the first: too few of them for a sweep.
        for tag in 2..=10_001u64 {
            live.remove(&tag);
            tidy(&mut tags, &live);
        }
        assert_eq!(tags.len(), 30_000, "no sweep yet");
        live.remove(&1);
        tidy(&mut tags, &live);
        // Each later settle (of the oldest, with a fresh delivery) keeps tidying.
        for next in 30_001..50_001u64 {
            tags.push(next);
            live.insert(next);
            let oldest = *live.first().expect("not empty");
            live.remove(&oldest);
            tidy(&mut tags, &live);
        }
        assert!(most_looked <= 64, "one call looked at {most_looked} tags");
        assert!(tags.len() <= 2 * live.len() + 32, "{} tags", tags.len());
        let listed: Vec<u64> = tags.iter().filter(|t| live.contains(t)).collect();
        assert_eq!(listed, live.iter().copied().collect::<Vec<_>>());
    }
}
