//! A small seeded generator: splitmix64 (Steele, Lea & Flood, 2014).
//!
//! Fast, one `u64` of state, and the same stream on every platform, which is all a
//! simulation needs: a seed must replay exactly.
//!
//! [`Source`] is what the workload generator draws from: this generator, or the bytes of a
//! fuzzer's input. `Rng`'s own methods hand over to it, so code holding an `Rng` needs no
//! trait in scope and a seed draws exactly what it always drew.

/// splitmix64.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5bd1_e995_9e37_79b9)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n`; `n` must not be zero.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Lemire's multiply-shift: no division, bias below 2^-64 × n.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index in `0..n`.
    pub fn index(&mut self, n: usize) -> usize {
        Source::index(self, n)
    }

    /// In `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        Source::range(self, lo, hi)
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        Source::one_in(self, n)
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u64) -> bool {
        Source::percent(self, percent)
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        Source::pick(self, xs)
    }

    /// An index into `weights`, each drawn in proportion to its weight; at least one weight
    /// must be positive.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        Source::weighted(self, weights)
    }

    /// Shuffles `xs` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.index(i + 1);
            xs.swap(i, j);
        }
    }
}

/// Where the workload generator's choices come from: a seeded [`Rng`], or the bytes of a
/// fuzzer's input (`crate::fuzz`). Only `next_u64` and `below` differ between the two; every
/// other choice is made from `below`, the same way for both.
pub trait Source {
    fn next_u64(&mut self) -> u64;

    /// In `0..n`; `n` must not be zero.
    fn below(&mut self, n: u64) -> u64;

    /// An index in `0..n`.
    fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `1 / n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// True with probability `percent / 100`.
    fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.index(xs.len())]
    }

    /// An index into `weights`, each drawn in proportion to its weight; at least one weight
    /// must be positive.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut x = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if x < u64::from(w) {
                return i;
            }
            x -= u64::from(w);
        }
        unreachable!("x < total")
    }
}

impl Source for Rng {
    fn next_u64(&mut self) -> u64 {
        Rng::next_u64(self)
    }

    fn below(&mut self, n: u64) -> u64 {
        Rng::below(self, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = rng.below(5);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn weighted_never_picks_a_zero_weight() {
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            assert_ne!(rng.weighted(&[1, 0, 2]), 1);
        }
    }
}
