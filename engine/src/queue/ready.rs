//! A queue's ready messages, in the order dispatch hands them out (contract §3 Dispatch):
//! by priority, highest first, and within a priority those that came back before those
//! never delivered.
//!
//! Level 0 is kept inline: a queue without priorities has only it, and its dispatch looks
//! at one pair of lists as it always did. A queue with `max_priority: Some(n)` has levels
//! 1 to `n` besides, and a bitmap of those holding a message, so that the next message is
//! found in a few word reads whatever `n` is.

use crate::deque::ChunkedDeque;

/// One priority's ready messages.
#[derive(Default)]
struct Level {
    /// Messages that came back, in the order they became ready again; delivered first.
    returned: ChunkedDeque<u32>,
    /// Messages never delivered, in the order they became ready.
    fresh: ChunkedDeque<u32>,
}

impl Level {
    fn pop_front(&mut self) -> Option<u32> {
        self.returned.pop_front().or_else(|| self.fresh.pop_front())
    }

    fn is_empty(&self) -> bool {
        self.returned.is_empty() && self.fresh.is_empty()
    }
}

pub(super) struct ReadyLists {
    /// Level 0.
    base: Level,
    /// Levels 1 to the queue's `max_priority`; none in a queue without priorities.
    higher: Box<[Level]>,
    /// Bit `l - 1` is set while level `l` holds a message.
    occupied: [u64; 4],
    len: usize,
}

impl ReadyLists {
    pub fn new(max_priority: Option<u8>) -> ReadyLists {
        let higher = max_priority.map_or(0, usize::from);
        ReadyLists {
            base: Level::default(),
            higher: (0..higher).map(|_| Level::default()).collect(),
            occupied: [0; 4],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The level of a message of `priority`: its priority, at most the queue's maximum
    /// (always 0 in a queue without priorities).
    pub fn level_of(&self, priority: u8) -> usize {
        usize::from(priority).min(self.higher.len())
    }

    /// Adds a message never delivered, last of its level's fresh ones.
    pub fn push_fresh(&mut self, msg: u32, priority: u8) {
        self.level(priority).fresh.push_back(msg);
    }

    /// Adds a message that came back, last of its level's returned ones.
    pub fn push_returned(&mut self, msg: u32, priority: u8) {
        self.level(priority).returned.push_back(msg);
    }

    /// Adds a message handed back unseen, first of its level.
    pub fn push_released(&mut self, msg: u32, priority: u8) {
        self.level(priority).returned.push_front(msg);
    }

    /// Takes the message dispatch hands out next.
    pub fn pop_front(&mut self) -> Option<u32> {
        let higher = if self.higher.is_empty() {
            None
        } else {
            self.highest()
        };
        let msg = match higher {
            None => self.base.pop_front()?,
            Some(at) => {
                let level = &mut self.higher[at - 1];
                let msg = level
                    .pop_front()
                    .expect("an occupied level holds a message");
                if level.is_empty() {
                    self.occupied[(at - 1) / 64] &= !(1 << ((at - 1) % 64));
                }
                msg
            }
        };
        self.len -= 1;
        Some(msg)
    }

    /// Every ready message with its level, in no particular order (for invariant checks).
    pub fn iter(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let levels = std::iter::once(&self.base).chain(self.higher.iter());
        levels.enumerate().flat_map(|(at, level)| {
            (level.returned.iter().chain(level.fresh.iter())).map(move |&msg| (at, msg))
        })
    }

    /// Checks that the bitmap marks exactly the higher levels in use and `len` counts
    /// every level.
    pub fn check_invariants(&self) {
        for (i, level) in self.higher.iter().enumerate() {
            let marked = self.occupied[i / 64] & (1 << (i % 64)) != 0;
            assert_eq!(marked, !level.is_empty(), "level {} marked", i + 1);
        }
        assert_eq!(self.iter().count(), self.len, "ready count");
    }

    /// The highest level above 0 that holds a message.
    fn highest(&self) -> Option<usize> {
        (0..self.occupied.len()).rev().find_map(|word| {
            let bits = self.occupied[word];
            (bits != 0).then(|| word * 64 + 64 - bits.leading_zeros() as usize)
        })
    }

    /// The level a message of `priority` joins, counted in.
    fn level(&mut self, priority: u8) -> &mut Level {
        self.len += 1;
        match self.level_of(priority) {
            0 => &mut self.base,
            at => {
                self.occupied[(at - 1) / 64] |= 1 << ((at - 1) % 64);
                &mut self.higher[at - 1]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(lists: &mut ReadyLists) -> Vec<u32> {
        std::iter::from_fn(|| lists.pop_front()).collect()
    }

    #[test]
    fn without_priorities_returned_come_first_then_fresh_in_order() {
        let mut lists = ReadyLists::new(None);
        lists.push_fresh(1, 0);
        lists.push_fresh(2, 9);
        lists.push_returned(3, 0);
        lists.push_released(4, 200);
        assert_eq!(lists.len(), 4);
        lists.check_invariants();
        assert_eq!(drain(&mut lists), [4, 3, 1, 2]);
        assert_eq!(lists.len(), 0);
    }

    #[test]
    fn the_highest_level_goes_first_and_above_the_maximum_counts_as_it() {
        let mut lists = ReadyLists::new(Some(3));
        lists.push_fresh(1, 0);
        lists.push_fresh(2, 2);
        lists.push_fresh(3, 7);
        lists.push_fresh(4, 3);
        lists.push_returned(5, 0);
        lists.push_released(6, 2);
        lists.check_invariants();
        assert_eq!(drain(&mut lists), [3, 4, 6, 2, 5, 1]);
        lists.push_fresh(7, 1);
        assert_eq!(lists.pop_front(), Some(7));
        lists.push_fresh(8, 0);
        lists.push_fresh(9, 3);
        lists.check_invariants();
        assert_eq!(drain(&mut lists), [9, 8]);
        lists.check_invariants();
    }

    #[test]
    fn every_one_of_255_levels_is_found_across_the_bitmap_words() {
        let mut lists = ReadyLists::new(Some(255));
        for priority in [0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 254, 255] {
            lists.push_fresh(u32::from(priority), priority);
        }
        lists.check_invariants();
        let order = drain(&mut lists);
        assert_eq!(order, [255, 254, 192, 191, 129, 128, 127, 65, 64, 63, 1, 0]);
        lists.check_invariants();
    }
}
