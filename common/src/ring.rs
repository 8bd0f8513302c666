//! The consistent-hash ring (docs/design.md §4): XXH64 with seed 0, 100 tokens per shard, token `i` of
//! shard `n` is `xxh64(n + decimal(i))`; a key maps to the owner of the first token `>=`
//! `xxh64(key)`, wrapping to the first token.
//!
//! A [`Ring`] depends only on the *set* of shard names, never on their order. Build it once per
//! membership change and share it (it is immutable and cheap to read).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use xxhash_rust::xxh64::xxh64;

/// Tokens (virtual nodes) per shard.
pub const TOKENS_PER_SHARD: usize = 100;

/// The ring's hash: XXH64 with seed 0.
pub fn hash(data: &[u8]) -> u64 {
    xxh64(data, 0)
}

/// An immutable consistent-hash ring over a set of shard names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    /// Sorted shard names, deduplicated.
    shards: Vec<String>,
    /// Sorted token values.
    tokens: Vec<u64>,
    /// `owners[i]` is the index into `shards` of the shard owning `tokens[i]`.
    owners: Vec<u32>,
}

impl Ring {
    /// Builds the ring of the given shard names. Duplicates count once; order does not matter.
    pub fn new<I, S>(shards: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_tokens(shards, TOKENS_PER_SHARD)
    }

    /// [`Ring::new`] with `per_shard` tokens per shard (tokens `0..per_shard` of each).
    pub fn with_tokens<I, S>(shards: I, per_shard: usize) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let shards: Vec<String> = shards
            .into_iter()
            .map(Into::into)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(shards.len() * per_shard);
        let mut buf = String::new();
        for (index, shard) in shards.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            for i in 0..per_shard {
                buf.clear();
                buf.push_str(shard);
                let _ = write!(buf, "{i}");
                pairs.push((hash(buf.as_bytes()), index));
            }
        }
        // Ties between equal token values are broken by shard name (the index order), so the
        // result stays independent of the input order.
        pairs.sort_unstable();
        let (tokens, owners) = pairs.into_iter().unzip();
        Self {
            shards,
            tokens,
            owners,
        }
    }

    /// The shard a key maps to, or `None` when the ring has no shard.
    pub fn shard_for(&self, key: &str) -> Option<&str> {
        self.shard_for_hash(hash(key.as_bytes()))
    }

    /// The shard owning the first token `>= h`, wrapping to the first token.
    pub fn shard_for_hash(&self, h: u64) -> Option<&str> {
        if self.tokens.is_empty() {
            return None;
        }
        let mut i = self.tokens.partition_point(|t| *t < h);
        if i == self.tokens.len() {
            i = 0;
        }
        self.shards.get(self.owners[i] as usize).map(String::as_str)
    }

    /// The tokens in ascending order, each with its shard.
    pub fn tokens(&self) -> impl Iterator<Item = (u64, &str)> {
        self.tokens
            .iter()
            .zip(&self.owners)
            .filter_map(|(t, o)| Some((*t, self.shards.get(*o as usize)?.as_str())))
    }

    /// The shard names on the ring, sorted.
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// Whether `shard` is on the ring.
    pub fn contains(&self, shard: &str) -> bool {
        self.shards
            .binary_search_by(|s| s.as_str().cmp(shard))
            .is_ok()
    }

    /// Number of shards on the ring.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether the ring has no shard (every lookup answers `None`).
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    use super::*;

    fn abc() -> Ring {
        Ring::new(["shard-a", "shard-b", "shard-c"])
    }

    #[test]
    fn xxh64_matches_published_vectors() {
        assert_eq!(hash(b""), 0xef46_db37_51d8_e999);
        assert_eq!(hash(b"abc"), 0x44bc_2cf5_ad77_0999);
        // Token 7 of shard "shard-a" (computed with Python's xxhash package).
        assert_eq!(hash(b"shard-a7"), 0x8367_d178_1876_bece);
    }

    #[test]
    fn lookups_match_an_independent_implementation() {
        // Golden vectors from an independent Python implementation of the same ring
        // (PyPI xxhash, tokens name+str(i), bisect_left, wrap to 0).
        let three = [
            ("/Secret/default/foo", "shard-a"),
            ("/Secret/default/bar", "shard-a"),
            ("/ConfigMap/default/foo", "shard-b"),
            ("apps/Deployment/default/web", "shard-a"),
            ("apps/Deployment/prod/web", "shard-b"),
            ("example.com/Widget//w1", "shard-b"),
            ("/Namespace//kube-system", "shard-a"),
            ("sharding.timebertt.dev/ClusterRing//example", "shard-c"),
            ("/Secret/demo/secret-0", "shard-a"),
            ("/Secret/demo/secret-1", "shard-b"),
            ("/Secret/demo/secret-2", "shard-b"),
            ("/Secret/demo/secret-3", "shard-c"),
        ];
        let ring = abc();
        for (key, want) in three {
            assert_eq!(ring.shard_for(key), Some(want), "key {key}");
        }
        let four = Ring::new(["shard-a", "shard-b", "shard-c", "shard-d"]);
        let moved = [
            ("apps/Deployment/default/web", "shard-d"),
            ("/Secret/demo/secret-2", "shard-d"),
        ];
        for (key, want) in moved {
            assert_eq!(four.shard_for(key), Some(want), "key {key}");
        }
    }

    #[test]
    fn empty_ring_maps_nothing() {
        let ring = Ring::new(Vec::<String>::new());
        assert!(ring.is_empty());
        assert_eq!(ring.shard_for("/Secret/default/foo"), None);
    }

    #[test]
    fn single_shard_gets_every_key() {
        let ring = Ring::new(["only"]);
        for h in [0, 1, u64::MAX / 2, u64::MAX] {
            assert_eq!(ring.shard_for_hash(h), Some("only"));
        }
    }

    #[test]
    fn hash_past_the_last_token_wraps_to_the_first() {
        let ring = abc();
        let first_owner = ring.shards[ring.owners[0] as usize].as_str();
        assert_eq!(ring.shard_for_hash(u64::MAX), Some(first_owner));
        let last = *ring.tokens.last().expect("tokens");
        if last < u64::MAX {
            assert_eq!(ring.shard_for_hash(last + 1), Some(first_owner));
        }
    }

    #[test]
    fn a_hash_equal_to_a_token_maps_to_that_tokens_owner() {
        let ring = abc();
        for (i, token) in ring.tokens.iter().enumerate() {
            let owner = ring.shards[ring.owners[i] as usize].as_str();
            assert_eq!(ring.shard_for_hash(*token), Some(owner));
        }
    }

    #[test]
    fn duplicates_count_once() {
        assert_eq!(Ring::new(["a", "b", "a"]), Ring::new(["a", "b"]));
        assert_eq!(Ring::new(["a", "a"]).tokens.len(), TOKENS_PER_SHARD);
    }

    #[test]
    fn contains_and_shards_report_membership() {
        let ring = Ring::new(["b", "a"]);
        assert_eq!(ring.shards(), ["a", "b"]);
        assert!(ring.contains("a") && ring.contains("b") && !ring.contains("c"));
        assert_eq!(ring.len(), 2);
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("/Secret/namespace-{}/object-{i}", i % 97))
            .collect()
    }

    fn load(ring: &Ring, keys: &[String]) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for key in keys {
            *counts
                .entry(ring.shard_for(key).expect("non-empty ring").to_owned())
                .or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn ten_named_shards_over_100k_keys_are_balanced() {
        let ring = Ring::new((0..10).map(|i| format!("shard-{i}")));
        let keys = keys(100_000);
        let counts = load(&ring, &keys);
        assert_eq!(counts.len(), 10, "every shard gets keys");
        let max = *counts.values().max().expect("counts");
        let mean = keys.len() as f64 / 10.0;
        assert!(max as f64 <= 1.35 * mean, "busiest {max} vs mean {mean}");
    }

    fn shard_name() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9-]{0,30}"
    }

    fn shard_set(min: usize, max: usize) -> impl Strategy<Value = BTreeSet<String>> {
        proptest::collection::btree_set(shard_name(), min..=max)
    }

    proptest! {
        #![proptest_config(Config { cases: 64, ..Config::default() })]

        #[test]
        fn lookups_are_deterministic_and_order_free(
            shards in shard_set(1, 12),
            keys in proptest::collection::vec(".{0,40}", 1..50),
        ) {
            let forward = Ring::new(shards.iter().cloned());
            let backward = Ring::new(shards.iter().rev().cloned());
            let again = Ring::new(shards.iter().cloned());
            prop_assert_eq!(&forward, &backward);
            for key in &keys {
                let got = forward.shard_for(key);
                prop_assert_eq!(got, backward.shard_for(key));
                prop_assert_eq!(got, again.shard_for(key));
                prop_assert!(shards.contains(got.expect("non-empty ring")));
            }
        }

        #[test]
        fn adding_a_shard_moves_keys_only_onto_it(
            shards in shard_set(1, 10),
            added in shard_name(),
            keys in proptest::collection::vec(".{0,40}", 1..200),
        ) {
            prop_assume!(!shards.contains(&added));
            let before = Ring::new(shards.iter().cloned());
            let after = Ring::new(shards.iter().cloned().chain([added.clone()]));
            for key in &keys {
                let (old, new) = (before.shard_for(key), after.shard_for(key));
                prop_assert!(old == new || new == Some(added.as_str()),
                    "key {} moved {:?} -> {:?}", key, old, new);
            }
        }

        #[test]
        fn removing_a_shard_moves_only_its_keys(
            shards in shard_set(2, 10),
            removed_index in any::<prop::sample::Index>(),
            keys in proptest::collection::vec(".{0,40}", 1..200),
        ) {
            let removed = removed_index.get(&shards.iter().collect::<Vec<_>>()).to_string();
            let before = Ring::new(shards.iter().cloned());
            let after = Ring::new(shards.iter().filter(|s| **s != removed).cloned());
            for key in &keys {
                let (old, new) = (before.shard_for(key), after.shard_for(key));
                prop_assert!(old == new || old == Some(removed.as_str()),
                    "key {} moved {:?} -> {:?}", key, old, new);
                prop_assert_ne!(new, Some(removed.as_str()));
            }
        }
    }

    proptest! {
        // Fixed seed: the balance bound is statistical, so the sampled shard names are pinned to
        // keep the test deterministic (300 random name sets were checked offline: worst 1.33x).
        #![proptest_config(Config {
            cases: 8,
            rng_seed: RngSeed::Fixed(0x5ead_5eed),
            ..Config::default()
        })]

        #[test]
        fn ten_random_shards_over_100k_keys_stay_within_1_35x_of_the_mean(
            shards in shard_set(10, 10),
        ) {
            let ring = Ring::new(shards.iter().cloned());
            let keys = keys(100_000);
            let counts = load(&ring, &keys);
            let max = *counts.values().max().expect("counts");
            let mean = keys.len() as f64 / 10.0;
            prop_assert!(max as f64 <= 1.35 * mean, "busiest {} vs mean {}", max, mean);
        }
    }
}
