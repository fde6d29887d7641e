//! Which shard owns a queue: a pure function of the name, the same in every build, on
//! every machine, for good.
//!
//! The hash is XXH3-64 with seed 0, whose output its specification fixes byte for byte
//! (unlike a general-purpose hasher such as ahash, which may change between versions,
//! machines and CPU features). A data directory, and later a cluster, rely on a queue
//! landing on the same shard every time, so the mapping is pinned by a golden file
//! (`shard/tests/placement.golden`) and changing it means migrating data.

use xxhash_rust::xxh3::xxh3_64;

/// The shard (in `0..shards`) that owns the queue called `name`.
///
/// XXH3-64 of the name's UTF-8 bytes, mapped onto `0..shards` by Lemire's multiply-shift
/// (`hash × shards / 2⁶⁴`), which needs no division and has no modulo bias.
pub fn shard_for(name: &str, shards: usize) -> usize {
    assert!(shards > 0, "a broker has at least one shard");
    ((u128::from(xxh3_64(name.as_bytes())) * shards as u128) >> 64) as usize
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

    /// The hash is the specified XXH3-64 (seed 0): the reference implementation's values
    /// for the empty input and for "a".
    #[test]
    fn the_hash_is_xxh3_64() {
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(xxh3_64(b"a"), 0xE6C6_32B6_1E96_4E1F);
    }
}
