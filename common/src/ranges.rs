//! Range mode's pure logic: the apiserver's sharded list and watch (KEP-5866, the
//! `ShardedListAndWatch` gate) sends a client only the objects whose key (uid or namespace)
//! hashes, by 64-bit FNV-1a, into the ranges of its `shardSelector`. Here: that hash, ranges of
//! its space, the selector as the apiserver parses it, and each shard's ranges from the ring's
//! tokens, so that a membership change moves objects only to or from the shard that changed.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hasher as _;
use std::str::FromStr;

use k8s_openapi::api::coordination::v1::Lease;

use crate::{Error, Ring};

/// On a ring: selects range mode and its key (`uid` or `namespace`). An annotation, so that it
/// survives on the reference's CRDs, whose schema would prune an unknown spec field.
pub const RANGE_KEY_ANNOTATION: &str = "sharder.dev/range-key";

/// On a shard Lease, written by the reconciler: the ranges the shard may serve, as a selector
/// ([`ShardSelector`]; empty: none).
pub const ASSIGNED_ANNOTATION: &str = "sharder.dev/assigned-ranges";

/// On a shard Lease, written by the reconciler with [`ASSIGNED_ANNOTATION`]: the Lease's
/// `leaseTransitions` the assignment is for. A shard trusts an assignment only while its Lease
/// has not changed hands since ([`valid_assignment`]): one that took its Lease back after
/// losing it waits for a new one, as its ranges may have gone to others meanwhile.
pub const EPOCH_ANNOTATION: &str = "sharder.dev/assigned-epoch";

/// On a shard Lease, written by the shard: the ranges it may be serving now, as a selector
/// (empty: none). It names a range before it starts serving it and drops it once it stopped,
/// and writes it with the resourceVersion of the Lease whose assignment it read, so it never
/// names more than that assignment.
pub const SERVED_ANNOTATION: &str = "sharder.dev/served-ranges";

/// The end of the hash space, exclusive: 2^64.
pub const SPACE_END: u128 = 1 << 64;

/// Tokens per shard of a range-mode ring: each shard's selector has about as many terms.
pub const RANGE_TOKENS_PER_SHARD: usize = 16;

/// 64-bit FNV-1a, the apiserver's hash of a range key.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(data);
    hasher.finish()
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

/// The ranges of an annotation holding a selector ([`ASSIGNED_ANNOTATION`],
/// [`SERVED_ANNOTATION`]): none when it is missing or empty.
pub fn parse_annotation(value: Option<&str>) -> Result<Vec<Range>, Error> {
    match value.map(str::trim) {
        None | Some("") => Ok(Vec::new()),
        Some(text) => Ok(text.parse::<ShardSelector>()?.ranges),
    }
}

/// The hashes both `a` and `b` hold (each sorted and disjoint, as [`merge`] leaves them).
pub fn intersect(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        let start = x.start.max(y.start);
        let end = x.end.min(y.end);
        if u128::from(start) < end {
            out.push(Range { start, end });
        }
        if x.end < y.end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The hashes `a` holds and `b` does not (each sorted and disjoint).
pub fn subtract(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    for x in a {
        let mut start = u128::from(x.start);
        for y in b {
            if y.end <= start || u128::from(y.start) >= x.end {
                continue;
            }
            if u128::from(y.start) > start {
                out.push(Range {
                    start: start as u64,
                    end: u128::from(y.start),
                });
            }
            start = start.max(y.end);
        }
        if start < x.end {
            out.push(Range {
                start: start as u64,
                end: x.end,
            });
        }
    }
    out
}

/// The epoch of `lease` ([`EPOCH_ANNOTATION`]): its `leaseTransitions` (0 when unset).
pub fn epoch(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// The ranges `lease`'s shard may serve: its [`ASSIGNED_ANNOTATION`] if written for the
/// Lease's current [`epoch`], else none. An assignment that cannot be parsed is none too.
pub fn valid_assignment(lease: &Lease) -> Vec<Range> {
    let annotations = lease.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    if get(EPOCH_ANNOTATION) != Some(epoch(lease).to_string().as_str()) {
        return Vec::new();
    }
    parse_annotation(get(ASSIGNED_ANNOTATION)).unwrap_or_default()
}

/// What the reconciler reads of one shard Lease of a range-mode ring
/// ([`ShardRanges::of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardRanges {
    /// Whether the shard holds its Lease ([`crate::is_available`]); one that does not serves
    /// nothing.
    pub available: bool,
    /// Its [`ASSIGNED_ANNOTATION`].
    pub assigned: Vec<Range>,
    /// Its [`SERVED_ANNOTATION`].
    pub served: Vec<Range>,
}

impl ShardRanges {
    /// What `lease` says: its [`valid_assignment`] and its [`SERVED_ANNOTATION`]; a served
    /// annotation that cannot be parsed counts as the whole space (nothing is given to another
    /// shard while it may be serving it), with the error to report.
    pub fn of(lease: &Lease) -> (Self, Option<Error>) {
        let served = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SERVED_ANNOTATION))
            .map(String::as_str);
        let (served, error) = match parse_annotation(served) {
            Ok(served) => (served, None),
            Err(e) => (vec![Range::ALL], Some(e)),
        };
        let ranges = Self {
            available: crate::is_available(lease),
            assigned: valid_assignment(lease),
            served,
        };
        (ranges, error)
    }
}

/// Each available shard's assignment now, towards the division `desired`: what it is assigned
/// and still desires, and what it desires that no other available shard is assigned or serves.
/// A range taken from one shard is thus given to the next only once the first one's Lease says
/// it neither has it nor serves it: never two shards at once. Shards not available get nothing.
pub fn grants(
    desired: &BTreeMap<String, Vec<Range>>,
    shards: &BTreeMap<String, ShardRanges>,
) -> BTreeMap<String, Vec<Range>> {
    let none = Vec::new();
    shards
        .iter()
        .map(|(name, shard)| {
            if !shard.available {
                return (name.clone(), Vec::new());
            }
            let wanted = desired.get(name).unwrap_or(&none);
            let others = merge(
                shards
                    .iter()
                    .filter(|(other, s)| *other != name && s.available)
                    .flat_map(|(_, s)| s.assigned.iter().chain(&s.served).copied()),
            );
            let kept = intersect(&shard.assigned, wanted);
            let free = subtract(wanted, &others);
            (name.clone(), merge(kept.into_iter().chain(free)))
        })
        .collect()
}

/// The share of the hash space `ranges` hold, in thousandths, rounded (the ranges do not
/// overlap).
pub fn thousandths(ranges: &[Range]) -> u32 {
    let held: u128 = ranges.iter().map(Range::len).sum();
    let share = (held * 1000 + SPACE_END / 2) / SPACE_END;
    u32::try_from(share).unwrap_or(1000)
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

    #[test]
    fn a_share_of_the_space_is_counted_in_rounded_thousandths() {
        let quarter = 1u64 << 62;
        let table: [(&[Range], u32); 5] = [
            (&[], 0),
            (&[range(0, SPACE_END)], 1000),
            (
                &[
                    range(0, u128::from(quarter)),
                    range(2 * quarter, u128::from(3 * quarter)),
                ],
                500,
            ),
            // 0.0004 rounds down, 0.0005 up.
            (&[range(0, (SPACE_END * 4) / 10_000)], 0),
            (&[range(0, (SPACE_END * 5) / 10_000 + 1)], 1),
        ];
        for (ranges, expected) in table {
            assert_eq!(thousandths(ranges), expected, "{ranges:?}");
        }
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

    #[test]
    fn intersections_and_differences_of_range_sets() {
        let a = vec![range(0, 10), range(20, 30)];
        for (b, both, only_a) in [
            (vec![], vec![], a.clone()),
            (vec![Range::ALL], a.clone(), vec![]),
            (
                vec![range(5, 25)],
                vec![range(5, 10), range(20, 25)],
                vec![range(0, 5), range(25, 30)],
            ),
            (vec![range(10, 20)], vec![], a.clone()),
            (
                vec![range(2, 3), range(4, 5), range(29, 40)],
                vec![range(2, 3), range(4, 5), range(29, 30)],
                vec![range(0, 2), range(3, 4), range(5, 10), range(20, 29)],
            ),
        ] {
            assert_eq!(intersect(&a, &b), both, "{b:?}");
            assert_eq!(intersect(&b, &a), both, "{b:?}");
            assert_eq!(subtract(&a, &b), only_a, "{b:?}");
        }
        assert_eq!(
            subtract(&[Range::ALL], &[range(0, 1 << 63)]),
            vec![range(1 << 63, SPACE_END)]
        );
    }

    fn shard(available: bool, assigned: &[Range], served: &[Range]) -> ShardRanges {
        ShardRanges {
            available,
            assigned: assigned.to_vec(),
            served: served.to_vec(),
        }
    }

    #[test]
    fn a_range_is_granted_only_once_no_other_shard_is_assigned_it_or_serves_it() {
        let (low, high) = (range(0, 1 << 63), range(1 << 63, SPACE_END));
        let desired: BTreeMap<String, Vec<Range>> =
            [("a".to_owned(), vec![low]), ("b".to_owned(), vec![high])].into();
        let cases = [
            (
                "a new ring: each shard its share",
                shard(true, &[], &[]),
                shard(true, &[], &[]),
                vec![low],
                vec![high],
            ),
            (
                "a keeps its share, b waits while a is assigned b's",
                shard(true, &[Range::ALL], &[Range::ALL]),
                shard(true, &[], &[]),
                vec![low],
                vec![],
            ),
            (
                "b waits while a still serves it",
                shard(true, &[low], &[Range::ALL]),
                shard(true, &[], &[]),
                vec![low],
                vec![],
            ),
            (
                "b gets it once a acknowledged",
                shard(true, &[low], &[low]),
                shard(true, &[], &[]),
                vec![low],
                vec![high],
            ),
            (
                "a dead shard's ranges go at once",
                shard(false, &[Range::ALL], &[Range::ALL]),
                shard(true, &[], &[]),
                vec![],
                vec![high],
            ),
            (
                "what no one holds goes at once",
                shard(true, &[low], &[range(0, 5)]),
                shard(true, &[range(1 << 63, (1 << 63) + 10)], &[]),
                vec![low],
                vec![high],
            ),
        ];
        for (case, a, b, to_a, to_b) in cases {
            let shards: BTreeMap<String, ShardRanges> =
                [("a".to_owned(), a), ("b".to_owned(), b)].into();
            let granted = grants(&desired, &shards);
            let expected: BTreeMap<String, Vec<Range>> =
                [("a".to_owned(), to_a), ("b".to_owned(), to_b)].into();
            assert_eq!(granted, expected, "{case}");
        }
    }

    /// One shard of the handover simulation: its Lease (annotations, holder changes, version),
    /// what its process serves, and an acknowledgement it read but has not written yet.
    #[derive(Clone, Debug, Default)]
    struct Simulated {
        available: bool,
        transitions: i32,
        version: u64,
        assigned: Vec<Range>,
        epoch: i32,
        served: Vec<Range>,
        running: bool,
        serving: Vec<Range>,
        reading: Option<(u64, Vec<Range>)>,
    }

    impl Simulated {
        fn valid(&self) -> Vec<Range> {
            if self.epoch == self.transitions {
                self.assigned.clone()
            } else {
                Vec::new()
            }
        }
    }

    type Shards = BTreeMap<&'static str, Simulated>;

    /// The reconciler's read of every Lease: the grants, each to be written with the version it
    /// was read at.
    fn reconciler_reads(shards: &Shards) -> Vec<(&'static str, u64, Vec<Range>)> {
        let available: Vec<&str> = shards
            .iter()
            .filter(|(_, s)| s.available)
            .map(|(n, _)| *n)
            .collect();
        let desired = assign_uids(&Ring::with_tokens(available, RANGE_TOKENS_PER_SHARD));
        let read: BTreeMap<String, ShardRanges> = shards
            .iter()
            .map(|(n, s)| {
                (
                    (*n).to_owned(),
                    ShardRanges {
                        available: s.available,
                        assigned: s.valid(),
                        served: s.served.clone(),
                    },
                )
            })
            .collect();
        let granted = grants(&desired, &read);
        shards
            .iter()
            .filter(|(n, s)| s.available && granted.get(**n) != Some(&s.valid()))
            .map(|(n, s)| (*n, s.version, granted.get(*n).cloned().unwrap_or_default()))
            .collect()
    }

    /// Writes `grants` whose Lease did not change since it was read (the others conflict).
    fn reconciler_writes(shards: &mut Shards, grants: Vec<(&'static str, u64, Vec<Range>)>) {
        for (name, version, ranges) in grants {
            let s = shards.get_mut(name).expect("shard");
            if s.version == version {
                s.assigned = ranges;
                s.epoch = s.transitions;
                s.version += 1;
            }
        }
    }

    /// The shard reads its Lease's assignment (the first half of an acknowledgement).
    fn shard_reads(s: &mut Simulated) {
        if s.running && s.available {
            s.reading = Some((s.version, s.valid()));
        }
    }

    /// The shard stops serving, writes what it read as served if its Lease did not change
    /// since, and serves it.
    fn shard_writes(s: &mut Simulated) {
        let Some((version, valid)) = s.reading.take() else {
            return;
        };
        if !s.running || s.version != version {
            return;
        }
        s.serving.clear();
        s.served = valid.clone();
        s.version += 1;
        s.serving = valid;
    }

    #[test]
    fn through_any_interleaving_no_hash_is_served_by_two_shards_and_every_hash_is_served_in_the_end()
     {
        let names = ["a", "b", "c", "d"];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for run in 0..300 {
            let mut shards: Shards = names[..2]
                .iter()
                .map(|n| {
                    (
                        *n,
                        Simulated {
                            available: true,
                            running: true,
                            ..Simulated::default()
                        },
                    )
                })
                .collect();
            let mut pending = Vec::new();
            for _ in 0..80 {
                let name = names[next(names.len())];
                match next(8) {
                    0 => pending = reconciler_reads(&shards),
                    1 => reconciler_writes(&mut shards, std::mem::take(&mut pending)),
                    2 | 3 => shards.get_mut(name).into_iter().for_each(shard_reads),
                    4 | 5 => shards.get_mut(name).into_iter().for_each(shard_writes),
                    6 => {
                        // A crash: the process stops serving at once; the reconciler takes its
                        // Lease over later (a new holder: not available).
                        if let Some(s) = shards.get_mut(name) {
                            s.running = false;
                            s.serving.clear();
                            if next(2) == 0 && s.available {
                                s.available = false;
                                s.transitions += 1;
                                s.version += 1;
                            }
                        }
                    }
                    _ => {
                        // A shard (new, or back after losing its Lease) takes its Lease.
                        let s = shards.entry(name).or_default();
                        if !s.available {
                            s.available = true;
                            s.transitions += 1;
                            s.version += 1;
                            s.running = true;
                        }
                    }
                }
                let serving: Vec<Range> = shards
                    .values()
                    .filter(|s| s.running)
                    .flat_map(|s| s.serving.clone())
                    .collect();
                let total: u128 = serving.iter().map(Range::len).sum();
                let union: u128 = merge(serving).iter().map(Range::len).sum();
                assert_eq!(total, union, "run {run}: a hash served twice: {shards:#?}");
            }
            // Settle: every available shard runs; rounds and acknowledgements alternate.
            for s in shards.values_mut().filter(|s| s.available) {
                s.running = true;
            }
            for _ in 0..4 {
                let grants = reconciler_reads(&shards);
                reconciler_writes(&mut shards, grants);
                shards.values_mut().for_each(shard_reads);
                shards.values_mut().for_each(shard_writes);
            }
            let serving: Vec<Range> = shards
                .values()
                .filter(|s| s.available)
                .flat_map(|s| s.serving.clone())
                .collect();
            if shards.values().any(|s| s.available) {
                assert_eq!(
                    merge(serving),
                    vec![Range::ALL],
                    "run {run}: not all served: {shards:#?}"
                );
            }
        }
    }

    #[test]
    fn an_assignment_counts_only_for_the_lease_holder_it_was_written_for() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        let selector = ShardSelector::new(RangeKey::Uid, [range(0, 1 << 63)]).to_string();
        let lease = |transitions: i32, epoch: &str, served: &str| Lease {
            metadata: kube_meta(&[
                (ASSIGNED_ANNOTATION, selector.as_str()),
                (EPOCH_ANNOTATION, epoch),
                (SERVED_ANNOTATION, served),
            ]),
            spec: Some(LeaseSpec {
                holder_identity: Some("shard-a".to_owned()),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(
            valid_assignment(&lease(3, "3", "")),
            vec![range(0, 1 << 63)]
        );
        assert_eq!(valid_assignment(&lease(4, "3", "")), vec![]);
        assert_eq!(valid_assignment(&lease(0, "", "")), vec![]);
        let (read, error) = ShardRanges::of(&lease(3, "3", "not a selector"));
        assert!(error.is_some());
        assert_eq!(
            read.served,
            vec![Range::ALL],
            "an unreadable claim blocks everything"
        );
        let (read, error) = ShardRanges::of(&lease(3, "3", &selector));
        assert!(error.is_none());
        assert_eq!(read.served, vec![range(0, 1 << 63)]);
    }

    fn kube_meta(
        annotations: &[(&str, &str)],
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("shard-a".to_owned()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        }
    }
}
