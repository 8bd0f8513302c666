//! Range mode's pure logic: the apiserver's sharded list and watch (KEP-5866, the
//! `ShardedListAndWatch` gate) sends a client only the objects whose key (uid or namespace)
//! hashes, by 64-bit FNV-1a, into the ranges of its `shardSelector`. Here: that hash, ranges of
//! its space, the selector as the apiserver parses it, and each shard's ranges from the ring's
//! tokens, so that a membership change moves objects only to or from the shard that changed.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::{Error, Ring};

/// The end of the hash space, exclusive: 2^64.
pub const SPACE_END: u128 = 1 << 64;

/// Tokens per shard of a range-mode ring: each shard's selector has about as many terms.
pub const RANGE_TOKENS_PER_SHARD: usize = 16;

/// 64-bit FNV-1a, the apiserver's hash of a range key.
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What an object is hashed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RangeKey {
    /// `metadata.uid`: uniform, but a controlled object hashes apart from its owner.
    Uid,
    /// `metadata.namespace` (`""` for cluster-scoped objects): a namespace's objects together.
    Namespace,
}

impl RangeKey {
    /// The field as a selector names it.
    pub fn field(self) -> &'static str {
        match self {
            Self::Uid => "object.metadata.uid",
            Self::Namespace => "object.metadata.namespace",
        }
    }

    /// The key's value of an object with `uid` in `namespace` (`None`: cluster-scoped).
    pub fn value<'a>(self, uid: &'a str, namespace: Option<&'a str>) -> &'a str {
        match self {
            Self::Uid => uid,
            Self::Namespace => namespace.unwrap_or_default(),
        }
    }
}

impl FromStr for RangeKey {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "uid" => Ok(Self::Uid),
            "namespace" => Ok(Self::Namespace),
            other => Err(Error::InvalidRing(format!(
                "range key {other:?}: expected uid or namespace"
            ))),
        }
    }
}

impl fmt::Display for RangeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Uid => "uid",
            Self::Namespace => "namespace",
        })
    }
}

/// The hashes `start..end` (`end` at most [`SPACE_END`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Range {
    /// The first hash in the range.
    pub start: u64,
    /// The first hash after it.
    pub end: u128,
}

impl Range {
    /// The whole space.
    pub const ALL: Range = Range {
        start: 0,
        end: SPACE_END,
    };

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u64) -> bool {
        self.start <= hash && u128::from(hash) < self.end
    }

    /// How many hashes it holds.
    pub fn len(&self) -> u128 {
        self.end.saturating_sub(u128::from(self.start))
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A `shardSelector`: ranges of one key's hashes, in the apiserver's syntax
/// `shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSelector {
    /// What is hashed.
    pub key: RangeKey,
    /// The ranges, sorted, disjoint and not adjacent.
    pub ranges: Vec<Range>,
}

impl ShardSelector {
    /// The selector of `ranges` of `key`, sorted and merged where they touch or overlap.
    pub fn new(key: RangeKey, ranges: impl IntoIterator<Item = Range>) -> Self {
        Self {
            key,
            ranges: merge(ranges),
        }
    }

    /// Whether an object with `uid` in `namespace` is selected.
    pub fn selects(&self, uid: &str, namespace: Option<&str>) -> bool {
        self.contains(fnv1a64(self.key.value(uid, namespace).as_bytes()))
    }

    /// Whether `hash` is in one of the ranges.
    pub fn contains(&self, hash: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.end <= u128::from(hash));
        self.ranges.get(i).is_some_and(|r| r.contains(hash))
    }
}

/// Sorts `ranges`, drops the empty ones, and merges those that touch or overlap.
pub fn merge(ranges: impl IntoIterator<Item = Range>) -> Vec<Range> {
    let mut sorted: Vec<Range> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
    sorted.sort();
    let mut merged: Vec<Range> = Vec::with_capacity(sorted.len());
    for range in sorted {
        match merged.last_mut() {
            Some(last) if u128::from(range.start) <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

impl fmt::Display for ShardSelector {
    /// The selector as the apiserver takes it; no range selects nothing, which the apiserver
    /// cannot express, so it must not be sent (see [`ShardSelector::ranges`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(
                f,
                "shardRange({}, '0x{:016x}', '0x{:016x}')",
                self.key.field(),
                range.start,
                range.end
            )?;
        }
        Ok(())
    }
}

impl FromStr for ShardSelector {
    type Err = Error;

    /// Parses a selector as the apiserver accepts it: terms joined by `||`, all on one key,
    /// bounds `0x` and 16 lowercase hex digits (the end may be `0x10000000000000000`), each
    /// range not empty.
    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = |what: String| Error::InvalidShardSelector(format!("{what} in {s:?}"));
        let mut key = None;
        let mut ranges = Vec::new();
        for term in s.split("||") {
            let args = term
                .trim()
                .strip_prefix("shardRange(")
                .and_then(|t| t.strip_suffix(')'))
                .filter(|args| !args.contains(['(', ')']))
                .ok_or_else(|| {
                    invalid(format!(
                        "{:?} is not shardRange(field, start, end)",
                        term.trim()
                    ))
                })?;
            let parts: Vec<&str> = args.split(',').map(str::trim).collect();
            let [field, start, end] = parts[..] else {
                return Err(invalid(format!("shardRange({args}) takes 3 arguments")));
            };
            let this = match field {
                "object.metadata.uid" => RangeKey::Uid,
                "object.metadata.namespace" => RangeKey::Namespace,
                other => return Err(invalid(format!("unknown field {other:?}"))),
            };
            if key.is_some_and(|k| k != this) {
                return Err(invalid("terms on more than one field".to_owned()));
            }
            key = Some(this);
            let (start, end) = (bound(start).map_err(invalid)?, bound(end).map_err(invalid)?);
            if start >= end || start >= SPACE_END {
                return Err(invalid(format!("empty range {start:#x}..{end:#x}")));
            }
            ranges.push(Range {
                start: u64::try_from(start).unwrap_or(u64::MAX),
                end,
            });
        }
        let key = key.ok_or_else(|| invalid("no term".to_owned()))?;
        Ok(Self::new(key, ranges))
    }
}

/// One bound: `'0x'` and 16 lowercase hex digits, or `'0x10000000000000000'`.
fn bound(quoted: &str) -> Result<u128, String> {
    let digits = quoted
        .strip_prefix("'0x")
        .and_then(|b| b.strip_suffix('\''))
        .ok_or_else(|| format!("bound {quoted} is not '0x' and 16 hex digits"))?;
    if digits == "10000000000000000" {
        return Ok(SPACE_END);
    }
    let lower = digits
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if digits.len() != 16 || !lower {
        return Err(format!(
            "bound {quoted} is not '0x' and 16 lowercase hex digits"
        ));
    }
    u128::from_str_radix(digits, 16).map_err(|e| format!("bound {quoted}: {e}"))
}

/// Each shard's ranges of the `uid` key: the arcs of `ring`'s tokens (a hash belongs to the
/// owner of the first token at or after it, as on the label ring), merged where they touch.
pub fn assign_uids(ring: &Ring) -> BTreeMap<String, Vec<Range>> {
    let mut ranges: BTreeMap<String, Vec<Range>> = BTreeMap::new();
    let arcs: Vec<(u64, &str)> = ring.tokens().collect();
    let Some(&(_, first_owner)) = arcs.first() else {
        return ranges;
    };
    let mut start = 0u64;
    for &(token, owner) in &arcs {
        let end = u128::from(token) + 1;
        ranges
            .entry(owner.to_owned())
            .or_default()
            .push(Range { start, end });
        start = u64::try_from(end).unwrap_or(u64::MAX);
    }
    // Past the last token: the first token's owner (wrapping).
    if let Some(&(last, _)) = arcs.last()
        && u128::from(last) + 1 < SPACE_END
    {
        ranges
            .entry(first_owner.to_owned())
            .or_default()
            .push(Range {
                start: last + 1,
                end: SPACE_END,
            });
    }
    ranges.into_iter().map(|(s, r)| (s, merge(r))).collect()
}

/// Each shard's ranges of the `namespace` key, balanced by the number of `namespaces` each
/// holds: FNV-1a puts similar names close together, so the namespaces are placed on `ring` by
/// their rank in hash order (evenly spread over the ring's space), and each shard gets the
/// hashes from its first namespace of a run to the next shard's first. A namespace created
/// later falls into whichever range covers its hash until the next assignment.
pub fn assign_namespaces<'a>(
    ring: &Ring,
    namespaces: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, Vec<Range>> {
    let mut hashes: Vec<u64> = namespaces
        .into_iter()
        .map(|n| fnv1a64(n.as_bytes()))
        .collect();
    hashes.sort_unstable();
    hashes.dedup();
    if hashes.is_empty() {
        return assign_uids(ring);
    }
    let n = hashes.len() as u128;
    let mut runs: Vec<(u64, &str)> = Vec::new();
    for (rank, hash) in hashes.iter().enumerate() {
        // The middle of the namespace's share of the space.
        let position = ((2 * rank as u128 + 1) * SPACE_END / (2 * n)) as u64;
        let Some(owner) = ring.shard_for_hash(position) else {
            return BTreeMap::new();
        };
        if runs.last().is_none_or(|(_, o)| *o != owner) {
            runs.push((*hash, owner));
        }
    }
    let mut ranges: BTreeMap<String, Vec<Range>> = ring
        .shards()
        .iter()
        .map(|s| (s.clone(), Vec::new()))
        .collect();
    for (i, (start, owner)) in runs.iter().enumerate() {
        let start = if i == 0 { 0 } else { *start };
        let end = runs
            .get(i + 1)
            .map_or(SPACE_END, |(next, _)| u128::from(*next));
        ranges
            .entry((*owner).to_owned())
            .or_default()
            .push(Range { start, end });
    }
    ranges.into_iter().map(|(s, r)| (s, merge(r))).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn range(start: u64, end: u128) -> Range {
        Range { start, end }
    }

    fn ring(shards: &[&str]) -> Ring {
        Ring::with_tokens(shards.iter().copied(), RANGE_TOKENS_PER_SHARD)
    }

    /// The owner of `hash` in `assignment`; panics if not exactly one shard holds it.
    fn owner(assignment: &BTreeMap<String, Vec<Range>>, hash: u64) -> &str {
        let owners: Vec<&str> = assignment
            .iter()
            .filter(|(_, ranges)| ranges.iter().any(|r| r.contains(hash)))
            .map(|(s, _)| s.as_str())
            .collect();
        assert_eq!(owners.len(), 1, "{hash:#x} held by {owners:?}");
        owners[0]
    }

    /// Whether the ranges of `assignment` cover the space exactly once.
    fn covers_the_space_once(assignment: &BTreeMap<String, Vec<Range>>) -> bool {
        let all: Vec<Range> = assignment.values().flatten().copied().collect();
        let total: u128 = all.iter().map(Range::len).sum();
        total == SPACE_END && merge(all) == vec![Range::ALL]
    }

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        for (input, hash) in [
            ("", 0xcbf2_9ce4_8422_2325_u64),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("foobar", 0x8594_4171_f739_67e8),
        ] {
            assert_eq!(fnv1a64(input.as_bytes()), hash, "{input:?}");
        }
    }

    #[test]
    fn a_selector_is_written_as_the_apiserver_parses_it() {
        let cases = [
            (
                ShardSelector::new(RangeKey::Uid, [range(0, 1 << 63)]),
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
            ),
            (
                ShardSelector::new(
                    RangeKey::Namespace,
                    [range(1 << 63, SPACE_END), range(0, 16)],
                ),
                "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000010') || \
                 shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')",
            ),
        ];
        for (selector, text) in cases {
            assert_eq!(selector.to_string(), text);
            assert_eq!(text.parse::<ShardSelector>().expect(text), selector);
        }
    }

    #[test]
    fn a_selector_the_apiserver_would_refuse_is_an_error_naming_the_fault() {
        let uid = "object.metadata.uid";
        for (text, fault) in [
            ("", "is not shardRange"),
            (
                "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
                "16 lowercase hex",
            ),
            (
                "shardRange(object.metadata.uid, '0x000000000000000A', '0x8000000000000000')",
                "16 lowercase hex",
            ),
            (
                "shardRange(object.metadata.uid, 0x0000000000000000, '0x8000000000000000')",
                "is not '0x'",
            ),
            (
                "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
                "unknown field",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000')",
                "takes 3 arguments",
            ),
            (
                "shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')",
                "empty range",
            ),
            (
                "shardRange(object.metadata.uid, '0x10000000000000000', '0x10000000000000000')",
                "empty range",
            ),
            (
                &format!(
                    "shardRange({uid}, '0x0000000000000000', '0x0000000000000001') && shardRange({uid}, '0x0000000000000002', '0x0000000000000003')"
                ),
                "is not shardRange",
            ),
            (
                &format!(
                    "shardRange({uid}, '0x0000000000000000', '0x0000000000000001') || shardRange(object.metadata.namespace, '0x0000000000000002', '0x0000000000000003')"
                ),
                "more than one field",
            ),
        ] {
            let error = text.parse::<ShardSelector>().expect_err(text).to_string();
            assert!(error.contains(fault), "{text:?}: {error}");
        }
    }

    #[test]
    fn ranges_are_merged_where_they_touch_or_overlap_and_empty_ones_dropped() {
        for (input, merged) in [
            (vec![], vec![]),
            (vec![range(5, 5)], vec![]),
            (vec![range(10, 20), range(0, 10)], vec![range(0, 20)]),
            (
                vec![range(0, 10), range(5, 8), range(11, 12)],
                vec![range(0, 10), range(11, 12)],
            ),
            (vec![range(0, 1 << 64), range(3, 4)], vec![Range::ALL]),
        ] {
            assert_eq!(merge(input.clone()), merged, "{input:?}");
        }
    }

    #[test]
    fn a_selector_selects_exactly_the_hashes_in_its_ranges() {
        let selector =
            ShardSelector::new(RangeKey::Uid, [range(10, 20), range(u64::MAX, SPACE_END)]);
        for (hash, selected) in [
            (9, false),
            (10, true),
            (19, true),
            (20, false),
            (u64::MAX - 1, false),
            (u64::MAX, true),
        ] {
            assert_eq!(selector.contains(hash), selected, "{hash}");
        }
        let uid = "0b6f4a6e-4a55-4e0a-9a53-0b1d2f1d3c4e";
        let one = ShardSelector::new(
            RangeKey::Uid,
            [range(
                fnv1a64(uid.as_bytes()),
                u128::from(fnv1a64(uid.as_bytes())) + 1,
            )],
        );
        assert!(one.selects(uid, Some("a")));
        assert!(!one.selects("another", Some("a")));
        let cluster_scoped = ShardSelector::new(
            RangeKey::Namespace,
            [range(fnv1a64(b""), u128::from(fnv1a64(b"")) + 1)],
        );
        assert!(cluster_scoped.selects(uid, None));
        assert!(!cluster_scoped.selects(uid, Some("default")));
    }

    #[test]
    fn uid_ranges_cover_the_space_once_and_agree_with_the_ring() {
        for shards in [
            &["a"][..],
            &["a", "b"],
            &["shard-0", "shard-1", "shard-2", "shard-3", "shard-4"],
        ] {
            let ring = ring(shards);
            let assignment = assign_uids(&ring);
            assert!(covers_the_space_once(&assignment), "{shards:?}");
            assert_eq!(assignment.len(), shards.len());
            for ranges in assignment.values() {
                assert!(
                    ranges.len() <= RANGE_TOKENS_PER_SHARD + 1,
                    "{} terms",
                    ranges.len()
                );
            }
            let tokens: Vec<u64> = ring.tokens().map(|(t, _)| t).collect();
            let samples = tokens
                .iter()
                .flat_map(|t| [*t, t.wrapping_add(1), t.wrapping_sub(1)]);
            for hash in samples.chain([0, u64::MAX, 1 << 63]) {
                assert_eq!(
                    Some(owner(&assignment, hash)),
                    ring.shard_for_hash(hash),
                    "{hash:#x}"
                );
            }
        }
    }

    #[test]
    fn a_new_shard_takes_uids_from_the_others_and_nothing_else_moves() {
        let before = assign_uids(&ring(&["shard-0", "shard-1", "shard-2", "shard-3"]));
        let after = assign_uids(&ring(&[
            "shard-0", "shard-1", "shard-2", "shard-3", "shard-4",
        ]));
        let mut moved = 0;
        for i in 0..20_000u32 {
            let hash = fnv1a64(format!("uid-{i}").as_bytes());
            let (from, to) = (owner(&before, hash), owner(&after, hash));
            if from != to {
                assert_eq!(to, "shard-4", "{hash:#x} moved from {from} to {to}");
                moved += 1;
            }
        }
        assert!(moved > 0, "the new shard took nothing");
    }

    #[test]
    fn namespace_ranges_hold_each_namespace_on_its_shard_and_cover_the_space_once() {
        let names: Vec<String> = (0..200).map(|i| format!("kep-ns-{i:03}")).collect();
        let ring = ring(&["shard-0", "shard-1", "shard-2", "shard-3"]);
        let assignment = assign_namespaces(&ring, names.iter().map(String::as_str));
        assert!(covers_the_space_once(&assignment));
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for name in &names {
            *held
                .entry(owner(&assignment, fnv1a64(name.as_bytes())))
                .or_default() += 1;
        }
        assert_eq!(held.len(), 4, "every shard holds namespaces: {held:?}");
        // Evenly spaced boundaries put these names on fewer shards, unevenly.
        let even: BTreeSet<u64> = names.iter().map(|n| fnv1a64(n.as_bytes()) >> 62).collect();
        assert!(even.len() < 4, "the names spread evenly by hash: {even:?}");
    }

    #[test]
    fn a_new_shard_takes_namespaces_from_the_others_and_nothing_else_moves() {
        let names: Vec<String> = (0..500).map(|i| format!("team-{i}")).collect();
        let names = || names.iter().map(String::as_str);
        let before = assign_namespaces(&ring(&["a", "b", "c"]), names());
        let after = assign_namespaces(&ring(&["a", "b", "c", "d"]), names());
        let mut moved = 0;
        for name in names() {
            let hash = fnv1a64(name.as_bytes());
            let (from, to) = (owner(&before, hash), owner(&after, hash));
            if from != to {
                assert_eq!(to, "d", "{name} moved from {from} to {to}");
                moved += 1;
            }
        }
        assert!(moved > 0, "the new shard took nothing");
    }

    #[test]
    fn without_namespaces_the_namespace_key_is_divided_as_the_uid_key() {
        let ring = ring(&["a", "b"]);
        assert_eq!(assign_namespaces(&ring, []), assign_uids(&ring));
        assert!(assign_uids(&Ring::default()).is_empty());
    }

    #[test]
    fn range_keys_parse_from_their_names_only() {
        assert_eq!("uid".parse::<RangeKey>().expect("uid"), RangeKey::Uid);
        assert_eq!(
            "namespace".parse::<RangeKey>().expect("ns"),
            RangeKey::Namespace
        );
        let error = "name".parse::<RangeKey>().expect_err("name").to_string();
        assert!(error.contains("expected uid or namespace"), "{error}");
        assert_eq!(RangeKey::Namespace.to_string(), "namespace");
    }
}
