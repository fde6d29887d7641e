//! Which shard owns a queue: a pure function of the name, the same in every process.

use ahash::RandomState;

/// The shard (in `0..shards`) that owns the queue called `name`.
///
/// A fixed-key hash, so a name maps to the same shard in every process and every run.
pub fn shard_for(name: &str, shards: usize) -> usize {
    assert!(shards > 0, "a broker has at least one shard");
    let hasher = RandomState::with_seeds(
        0x6c65_6173_656d_7121,
        0x7368_6172_645f_666f,
        0x725f_7175_6575_6573,
        0x0000_0000_0000_0001,
    );
    // Lemire's multiply-shift maps the hash onto the range without a division's bias.
    ((u128::from(hasher.hash_one(name)) * shards as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_owns_everything() {
        for name in ["a", "jobs", "emails.dead", ""] {
            assert_eq!(shard_for(name, 1), 0);
        }
    }

    #[test]
    fn result_is_in_range_and_stable() {
        for shards in 1..=16 {
            for i in 0..1000 {
                let name = format!("queue-{i}");
                let shard = shard_for(&name, shards);
                assert!(shard < shards);
                assert_eq!(shard, shard_for(&name, shards), "same name, same shard");
            }
        }
    }

    #[test]
    fn names_spread_over_shards() {
        let shards = 4;
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[shard_for(&format!("q{i}"), shards)] += 1;
        }
        for (shard, &count) in counts.iter().enumerate() {
            assert!(
                (800..1200).contains(&count),
                "shard {shard} got {count} of 4000 names: {counts:?}"
            );
        }
    }

    #[test]
    fn fixed_across_processes() {
        // These values are what the fixed seeds give; a change of hash or seeds would move
        // queues between shards of existing deployments, so it must be deliberate.
        let placed: Vec<usize> = ["library", "emails", "emails.dlq", "a", "b", "c"]
            .iter()
            .map(|n| shard_for(n, 8))
            .collect();
        assert_eq!(placed, FIXED_PLACEMENT);
    }

    const FIXED_PLACEMENT: [usize; 6] = [3, 3, 1, 3, 4, 2];
}
