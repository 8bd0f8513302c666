//! The single-ownership invariant, checked from the example shards' reconcile records (no object
//! is ever reconciled by two shards at overlapping times), and the ordered handover of
//! controlled objects, checked from the observed versions of owners and children
//! ([`check_handover`]).

use std::collections::{BTreeMap, BTreeSet};

use sharder_example::record::{Event, Line};

/// One reconcile of one object by one shard, in Unix nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The shard.
    pub shard: String,
    /// The run of the shard (see [`Line::incarnation`]).
    pub incarnation: Option<String>,
    /// Start.
    pub start: u128,
    /// End (for a reconcile cut short by a kill: the kill time).
    pub end: u128,
}

/// Two shards, or two runs of one, reconciling one object at the same time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The object.
    pub object: String,
    /// One reconcile.
    pub first: Interval,
    /// The other, by another shard, starting before the first ended.
    pub second: Interval,
}

/// What the records show.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Reconciles per object.
    pub reconciles: BTreeMap<String, Vec<Interval>>,
    /// Every overlap found.
    pub overlaps: Vec<Overlap>,
}

impl Report {
    /// Total reconciles.
    pub fn total(&self) -> usize {
        self.reconciles.values().map(Vec::len).sum()
    }

    /// How many objects were reconciled by more than one shard over time (moves).
    pub fn objects_with_several_shards(&self) -> usize {
        self.reconciles
            .values()
            .filter(|intervals| intervals.iter().any(|i| i.shard != intervals[0].shard))
            .count()
    }
}

/// Builds intervals from `lines` and finds overlaps. A start with no end is closed at the end
/// of its shard's run that it falls in by `lives` (the time the shard was killed), or at `now`
/// if the shard still runs. Two runs of one shard count as two shards.
pub fn check(lines: &[Line], lives: &Lives, now: u128) -> Report {
    type Key = (String, Option<String>, String);
    let mut open: BTreeMap<Key, u128> = BTreeMap::new();
    let mut report = Report::default();
    let mut sorted: Vec<&Line> = lines.iter().collect();
    sorted.sort_by_key(|l| l.t);
    for line in sorted {
        let key = (
            line.shard.clone(),
            line.incarnation.clone(),
            line.object.clone(),
        );
        match line.event {
            Event::Start => {
                open.insert(key, line.t);
            }
            Event::End => {
                if let Some(start) = open.remove(&key) {
                    report
                        .reconciles
                        .entry(line.object.clone())
                        .or_default()
                        .push(Interval {
                            shard: line.shard.clone(),
                            incarnation: line.incarnation.clone(),
                            start,
                            end: line.t,
                        });
                }
            }
            Event::Write => {}
        }
    }
    for ((shard, incarnation, object), start) in open {
        let end = lives
            .get(&shard)
            .into_iter()
            .flatten()
            .filter_map(|(_, end)| *end)
            .filter(|end| *end >= start)
            .min()
            .unwrap_or(now);
        report.reconciles.entry(object).or_default().push(Interval {
            shard,
            incarnation,
            start,
            end,
        });
    }
    for (object, intervals) in &mut report.reconciles {
        intervals.sort_by_key(|i| i.start);
        for (i, first) in intervals.iter().enumerate() {
            for second in &intervals[i + 1..] {
                if second.start >= first.end {
                    break;
                }
                if (&second.shard, &second.incarnation) != (&first.shard, &first.incarnation) {
                    report.overlaps.push(Overlap {
                        object: object.clone(),
                        first: first.clone(),
                        second: second.clone(),
                    });
                }
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(t: u128, shard: &str, object: &str, event: Event) -> Line {
        Line {
            t,
            shard: shard.into(),
            object: object.into(),
            event,
            rv: None,
            child: None,
            incarnation: None,
        }
    }

    #[test]
    fn sequential_reconciles_by_different_shards_do_not_overlap() {
        let lines = [
            line(1, "a", "o", Event::Start),
            line(2, "a", "o", Event::End),
            line(3, "b", "o", Event::Start),
            line(4, "b", "o", Event::End),
        ];
        let report = check(&lines, &Lives::new(), 10);
        assert!(report.overlaps.is_empty());
        assert_eq!(report.total(), 2);
        assert_eq!(report.objects_with_several_shards(), 1);
    }

    #[test]
    fn concurrent_reconciles_by_different_shards_are_found() {
        let lines = [
            line(1, "a", "o", Event::Start),
            line(3, "b", "o", Event::Start),
            line(4, "a", "o", Event::End),
            line(5, "b", "o", Event::End),
            line(6, "a", "p", Event::Start),
            line(7, "a", "p", Event::End),
        ];
        let report = check(&lines, &Lives::new(), 10);
        assert_eq!(report.overlaps.len(), 1);
        assert_eq!(report.overlaps[0].object, "o");
    }

    #[test]
    fn a_killed_shards_open_reconcile_ends_at_the_kill() {
        let lines = [
            line(1, "a", "o", Event::Start),
            line(5, "b", "o", Event::Start),
            line(6, "b", "o", Event::End),
        ];
        let killed_before = Lives::from([("a".to_owned(), vec![(0, Some(4))])]);
        assert!(check(&lines, &killed_before, 10).overlaps.is_empty());
        let killed_after = Lives::from([("a".to_owned(), vec![(0, Some(6))])]);
        assert_eq!(check(&lines, &killed_after, 10).overlaps.len(), 1);
        assert_eq!(
            check(&lines, &Lives::new(), 10).overlaps.len(),
            1,
            "a still-running shard's open reconcile lasts until now"
        );
    }

    #[test]
    fn a_restarted_shard_overlapping_its_predecessor_is_found() {
        let run = |t, event, incarnation: &str| Line {
            incarnation: Some(incarnation.into()),
            ..line(t, "a", "o", event)
        };
        // The first run's reconcile is left open; it was killed at 4 or at 8.
        let lines = [
            run(1, Event::Start, "1"),
            run(5, Event::Start, "2"),
            run(6, Event::End, "2"),
        ];
        let lives = |killed| Lives::from([("a".to_owned(), vec![(0, Some(killed)), (5, None)])]);
        assert!(check(&lines, &lives(4), 10).overlaps.is_empty());
        let report = check(&lines, &lives(8), 10);
        assert_eq!(report.overlaps.len(), 1, "the runs of a at 5 to 6");
        let unnamed = lines.map(|l| Line {
            incarnation: None,
            ..l
        });
        assert!(
            check(&unnamed, &lives(8), 10).overlaps.is_empty(),
            "without the runs' names one shard cannot overlap itself"
        );
    }
}

/// Asserts that `report` shows no overlapping reconciles and `handover` no breach of the handover
/// rules, and that every record it could not place falls in one of the windows `blind` declares
/// (Unix nanoseconds, from and to: a control plane restart, when the history's watches missed
/// versions); returns a one-line summary of both.
pub fn assert_holds(report: &Report, handover: &Handover, blind: &[(u128, u128)]) -> String {
    assert!(
        handover.records_checked > 0,
        "no record was checked against the owners' versions ({} reconciles recorded, {} records \
         unplaced): the check saw nothing",
        report.total(),
        handover.unplaced.len()
    );
    let outside: Vec<&(String, u128)> = handover
        .unplaced
        .iter()
        .filter(|(_, t)| !blind.iter().any(|(from, to)| from <= t && t <= to))
        .collect();
    assert!(
        outside.is_empty(),
        "{} records name an owner version the history never saw, outside the windows declared \
         blind ({blind:?}), first: {:?}",
        outside.len(),
        outside.first()
    );
    assert!(
        report.overlaps.is_empty(),
        "{} overlapping reconciles, first: {:?}",
        report.overlaps.len(),
        report.overlaps.first()
    );
    assert!(
        handover.violations.is_empty(),
        "{} handover violations, first: {:?}",
        handover.violations.len(),
        handover.violations.first()
    );
    format!(
        "{} reconciles of {} objects, {} reconciled by more than one shard over time, no overlap; {} children, {} child moves, none ahead of its owner, longest behind {:?}; {} records checked against the owners' versions, {} unplaced",
        report.total(),
        report.reconciles.len(),
        report.objects_with_several_shards(),
        handover.children,
        handover.child_moves,
        std::time::Duration::from_nanos(u64::try_from(handover.longest_behind).unwrap_or(u64::MAX)),
        handover.records_checked,
        handover.unplaced.len(),
    )
}

/// One observed version of a sharded object (owner or child), from a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its resourceVersion: one etcd revision, ordered across resources.
    pub rv: u64,
    /// When it was observed (Unix nanoseconds).
    pub t: u128,
    /// `namespace/name` of the object.
    pub object: String,
    /// For a controlled object: `namespace/name` of its controller owner.
    pub owner: Option<String>,
    /// Its shard label.
    pub shard: Option<String>,
    /// Whether it carries the drain label.
    pub draining: bool,
    /// Whether this is its deletion.
    pub deleted: bool,
}

/// A breach of the handover rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The object (child or owner) concerned.
    pub object: String,
    /// What happened.
    pub what: String,
}

/// What the versions and records show about handovers.
#[derive(Clone, Debug, Default)]
pub struct Handover {
    /// Every breach found.
    pub violations: Vec<Violation>,
    /// Controlled objects seen.
    pub children: usize,
    /// Times a child moved.
    pub child_moves: usize,
    /// The longest a child stayed on its owner's previous shard after the owner moved on
    /// (nanoseconds): the allowed window between the owner's acknowledgement and the child's
    /// move.
    pub longest_behind: u128,
    /// Reconcile starts and child writes checked against the owner's observed versions.
    pub records_checked: usize,
    /// Records of an owner that name a version its observed history lacks (a watch that
    /// reconnected past it), by object and record time: not checked.
    pub unplaced: Vec<(String, u128)>,
}

/// When each shard ran, by name: the start and end (Unix nanoseconds) of each of its runs, the
/// end `None` while it runs. A restarted shard keeps its name and adds a run.
pub type Lives = BTreeMap<String, Vec<(u128, Option<u128>)>>;

/// Whether `shard` was dead at `t`: one of its runs had ended by then and none was running.
fn dead_at(lives: &Lives, shard: &str, t: u128) -> bool {
    let Some(runs) = lives.get(shard) else {
        return false;
    };
    let ended = runs.iter().any(|(_, end)| end.is_some_and(|e| e <= t));
    let running = runs
        .iter()
        .any(|(start, end)| *start <= t && end.is_none_or(|e| t < e));
    ended && !running
}

/// How long after an owner moved on a shard may still act on its old copy (watch delivery).
pub const STALE_TOLERANCE: u128 = 2_000_000_000;

/// How long after an owner left a shard a child may still be admitted onto that shard: the
/// webhook read the owner before it moved (its owner read may take up to 2 s), and the child's
/// CREATE committed after the move (docs/design.md §6, a child created while its owner drains).
/// Such a child is behind its owner, not ahead of it, and must follow within the bound.
pub const ADMITTED_BEHIND: u128 = 2_000_000_000 + STALE_TOLERANCE;

#[derive(Clone, Debug, Default)]
struct Held {
    shard: Option<String>,
    draining: bool,
    present: bool,
}

impl Held {
    /// The shard that holds the object and is not letting it go.
    fn settled(&self) -> Option<&str> {
        (self.present && !self.draining)
            .then_some(self.shard.as_deref())
            .flatten()
    }
}

/// Checks the ordered handover of controlled objects (docs/design.md §6) over the observed
/// `versions` of owners and children and the shards' records `lines`:
///
/// - a child is never labelled with a shard other than the one holding its owner at that
///   moment (in resourceVersion order; in a chain its owner is the controlled object above it), unless the owner's shard was dead then by `lives`
///   (owners and children of a dead shard move together), or the child lands on the shard its
///   owner left at most [`ADMITTED_BEHIND`] earlier (behind it, not ahead);
/// - after an owner settles on a new shard, its children follow within `bound` nanoseconds
///   (a child still behind at `now` counts too);
/// - a shard reconciles an owner, or writes its child, only at a version labelled with that
///   shard and not draining, and never more than [`STALE_TOLERANCE`] after a newer version
///   moved the owner elsewhere.
pub fn check_handover(
    versions: &[Version],
    lines: &[Line],
    lives: &Lives,
    bound: u128,
    now: u128,
) -> Handover {
    let mut report = Handover::default();
    let mut sorted: Vec<&Version> = versions.iter().collect();
    sorted.sort_by_key(|v| v.rv);
    // Every object's state so far, main or controlled: in a chain a controlled object owns
    // the level below it.
    let mut held: BTreeMap<&str, Held> = BTreeMap::new();
    let mut behind: BTreeMap<&str, u128> = BTreeMap::new();
    let mut by_owner: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    // The shard each object last left, and when.
    let mut left: BTreeMap<&str, (String, u128)> = BTreeMap::new();
    for v in &sorted {
        let now_held = Held {
            shard: v.shard.clone(),
            draining: v.draining,
            present: !v.deleted,
        };
        let before = held.get(v.object.as_str()).cloned();
        if let Some(owner) = &v.owner {
            if before.is_none() {
                report.children += 1;
            }
            by_owner.entry(owner).or_default().insert(&v.object);
            let moved = now_held.present
                && now_held.shard.is_some()
                && before.as_ref().and_then(|b| b.shard.clone()) != now_held.shard;
            if moved {
                report.child_moves += 1;
                let owner_held = held.get(owner.as_str()).cloned().unwrap_or_default();
                let just_left = left.get(owner.as_str()).is_some_and(|(s, t)| {
                    now_held.shard.as_ref() == Some(s) && v.t.saturating_sub(*t) <= ADMITTED_BEHIND
                });
                let allowed = owner_held.present
                    && (owner_held.shard == now_held.shard
                        || just_left
                        || owner_held
                            .shard
                            .as_ref()
                            .is_some_and(|s| dead_at(lives, s, v.t)));
                if owner_held.present && !allowed {
                    report.violations.push(Violation {
                        object: v.object.clone(),
                        what: format!(
                            "child moved to {:?} at rv {} while its owner {owner} was on {:?} (draining: {})",
                            now_held.shard, v.rv, owner_held.shard, owner_held.draining
                        ),
                    });
                }
            }
        }
        if let Some(before) = &before
            && let Some(shard) = &before.shard
            && before.present
            && now_held.shard.as_ref() != Some(shard)
        {
            left.insert(&v.object, (shard.clone(), v.t));
        }
        held.insert(&v.object, now_held);
        // Windows in which a child is behind its owner's settled shard: this object's siblings
        // (its owner changed nothing, but the object itself did) and its own children.
        for owner in v.owner.as_deref().into_iter().chain([v.object.as_str()]) {
            let owner_held = held.get(owner).cloned().unwrap_or_default();
            for child in by_owner.get(owner).into_iter().flatten() {
                let Some(child_held) = held.get(child) else {
                    continue;
                };
                let is_behind = child_held.present
                    && child_held.shard.is_some()
                    && owner_held
                        .settled()
                        .is_some_and(|s| child_held.shard.as_deref() != Some(s));
                match (is_behind, behind.get(child).copied()) {
                    (true, None) => {
                        behind.insert(child, v.t);
                    }
                    (false, Some(since)) => {
                        behind.remove(child);
                        report.longest_behind =
                            report.longest_behind.max(v.t.saturating_sub(since));
                    }
                    _ => {}
                }
            }
        }
    }
    for (child, since) in &behind {
        let open = now.saturating_sub(*since);
        report.longest_behind = report.longest_behind.max(open);
        if open > bound {
            report.violations.push(Violation {
                object: (*child).to_owned(),
                what: format!("still behind its owner after {} ms", open / 1_000_000),
            });
        }
    }
    if report.longest_behind > bound && !report.violations.iter().any(|v| v.what.contains("behind"))
    {
        report.violations.push(Violation {
            object: String::new(),
            what: format!(
                "a child stayed behind its owner for {} ms (bound {} ms)",
                report.longest_behind / 1_000_000,
                bound / 1_000_000
            ),
        });
    }
    check_records(&sorted, lines, &mut report);
    report
}

/// The reconcile-start and child-write records against the owners' observed versions.
fn check_records(sorted: &[&Version], lines: &[Line], report: &mut Handover) {
    let mut history: BTreeMap<&str, Vec<&Version>> = BTreeMap::new();
    for v in sorted.iter().filter(|v| v.owner.is_none()) {
        history.entry(&v.object).or_default().push(v);
    }
    for line in lines
        .iter()
        .filter(|l| matches!(l.event, Event::Start | Event::Write))
    {
        let Some(rv) = line.rv.as_deref().and_then(|r| r.parse::<u64>().ok()) else {
            continue;
        };
        let Some(versions) = history.get(line.object.as_str()) else {
            continue;
        };
        let Some(seen) = versions.iter().find(|v| v.rv == rv) else {
            report.unplaced.push((line.object.clone(), line.t));
            continue;
        };
        report.records_checked += 1;
        let what = match line.event {
            Event::Write => format!("wrote child {:?}", line.child),
            _ => "reconciled".to_owned(),
        };
        if seen.shard.as_deref() != Some(line.shard.as_str()) || seen.draining {
            report.violations.push(Violation {
                object: line.object.clone(),
                what: format!(
                    "{} {what} at rv {rv}, which was on {:?} (draining: {})",
                    line.shard, seen.shard, seen.draining
                ),
            });
        }
        let moved_away = versions.iter().find(|v| {
            v.rv > rv
                && v.shard.as_deref() != Some(line.shard.as_str())
                && v.t + STALE_TOLERANCE < line.t
        });
        if let Some(newer) = moved_away {
            report.violations.push(Violation {
                object: line.object.clone(),
                what: format!(
                    "{} {what} at rv {rv}, {} ms after rv {} moved it to {:?}",
                    line.shard,
                    (line.t - newer.t) / 1_000_000,
                    newer.rv,
                    newer.shard
                ),
            });
        }
    }
}

#[cfg(test)]
mod handover_tests {
    use super::*;

    const MS: u128 = 1_000_000;

    fn owner(rv: u64, shard: Option<&str>, draining: bool) -> Version {
        Version {
            rv,
            t: u128::from(rv) * 100 * MS,
            object: "ns/o".into(),
            owner: None,
            shard: shard.map(Into::into),
            draining,
            deleted: false,
        }
    }

    fn child(rv: u64, shard: Option<&str>) -> Version {
        Version {
            object: "ns/checksums-o".into(),
            owner: Some("ns/o".into()),
            ..owner(rv, shard, false)
        }
    }

    /// A child of [`child`]: the third level of a chain.
    fn grandchild(rv: u64, shard: Option<&str>) -> Version {
        Version {
            object: "ns/grandchild".into(),
            owner: Some("ns/checksums-o".into()),
            ..owner(rv, shard, false)
        }
    }

    fn check(versions: &[Version], lines: &[Line]) -> Handover {
        check_handover(versions, lines, &Lives::new(), 5_000 * MS, 100_000 * MS)
    }

    #[test]
    fn todays_direct_child_move_puts_the_child_ahead_of_its_draining_owner() {
        // What the reconciler did before ordered handover: in the pass that drains the owner
        // off a, its child is assigned to b directly, while a still holds the owner.
        let versions = [
            owner(1, Some("a"), false),
            child(2, Some("a")),
            owner(10, Some("a"), true),
            child(11, Some("b")),
            owner(12, Some("b"), false),
        ];
        let report = check(&versions, &[]);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(report.violations[0].what.contains("child moved to"));
    }

    #[test]
    fn a_grandchild_ahead_of_its_parent_is_a_violation_and_one_following_it_is_not() {
        // The owner moves from a to b; the grandchild lands on b while a still holds its parent.
        let ahead = [
            owner(1, Some("a"), false),
            child(2, Some("a")),
            grandchild(3, Some("a")),
            owner(10, Some("a"), true),
            owner(12, Some("b"), false),
            grandchild(13, Some("b")),
            child(14, Some("b")),
        ];
        let report = check(&ahead, &[]);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert_eq!(report.violations[0].object, "ns/grandchild");
        let ordered = [
            owner(1, Some("a"), false),
            child(2, Some("a")),
            grandchild(3, Some("a")),
            owner(10, Some("a"), true),
            owner(12, Some("b"), false),
            child(13, Some("b")),
            grandchild(15, Some("b")),
        ];
        let report = check(&ordered, &[]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!((report.children, report.child_moves), (2, 4));
        assert_eq!(report.longest_behind, 200 * MS, "rv 13 -> rv 15");
    }

    #[test]
    fn a_child_following_its_acknowledged_owner_is_fine() {
        let versions = [
            owner(1, Some("a"), false),
            child(2, Some("a")),
            owner(10, Some("a"), true),
            owner(12, Some("b"), false),
            child(13, Some("b")),
        ];
        let report = check(&versions, &[]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.child_moves, 2);
        assert_eq!(report.longest_behind, 100 * MS, "rv 12 -> rv 13");
    }

    #[test]
    fn a_child_admitted_on_the_shard_its_owner_just_left_is_behind_not_ahead() {
        // The webhook read the draining owner on a; the owner's acknowledgement (rv 12, b)
        // committed before the child's CREATE (rv 13, a).
        let versions = [
            owner(1, Some("a"), false),
            owner(10, Some("a"), true),
            owner(12, Some("b"), false),
            child(13, Some("a")),
            child(20, Some("b")),
        ];
        let report = check(&versions, &[]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.longest_behind, 700 * MS, "rv 13 -> rv 20");
        // Long after the owner left a, a child landing there is a violation.
        let late = [
            owner(1, Some("a"), false),
            owner(12, Some("b"), false),
            child(12 + 1 + 41, Some("a")),
            child(60, Some("b")),
        ];
        let report = check(&late, &[]);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(report.violations[0].what.contains("child moved to"));
    }

    #[test]
    fn owners_and_children_of_a_dead_shard_may_move_in_any_order() {
        let versions = [
            owner(1, Some("x"), false),
            child(2, Some("x")),
            child(3, Some("b")),
            owner(4, Some("b"), false),
        ];
        // x ran until 250 ms: dead when the child moved at rv 3 (300 ms).
        let dead = Lives::from([("x".to_owned(), vec![(0, Some(250 * MS))])]);
        let report = check_handover(&versions, &[], &dead, 5_000 * MS, 100_000 * MS);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        let alive = check(&versions, &[]);
        assert_eq!(
            alive.violations.len(),
            1,
            "x was not dead: {:?}",
            alive.violations
        );
    }

    #[test]
    fn a_shard_is_dead_from_its_end_on_and_not_before() {
        let versions = [
            owner(1, Some("x"), false),
            child(2, Some("x")),
            child(3, Some("b")),
            owner(40, Some("b"), false),
        ];
        // x ended at 3.5 s, after its owner's child moved ahead (300 ms): a violation still.
        let later = Lives::from([("x".to_owned(), vec![(0, Some(3_500 * MS))])]);
        let report = check_handover(&versions, &[], &later, 5_000 * MS, 100_000 * MS);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        // x ended at 250 ms and ran again from 280 ms: alive at 300 ms.
        let again = Lives::from([("x".to_owned(), vec![(0, Some(250 * MS)), (280 * MS, None)])]);
        let report = check_handover(&versions, &[], &again, 5_000 * MS, 100_000 * MS);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    }

    #[test]
    fn a_child_left_behind_too_long_is_a_violation() {
        let versions = [
            owner(1, Some("a"), false),
            child(2, Some("a")),
            owner(3, Some("b"), false),
        ];
        let report = check_handover(
            &versions,
            &[],
            &Lives::new(),
            5_000 * MS,
            300 * MS + 6_000 * MS,
        );
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(report.violations[0].what.contains("behind"));
    }

    fn start(shard: &str, rv: u64, t: u128) -> Line {
        Line {
            t,
            shard: shard.into(),
            object: "ns/o".into(),
            event: Event::Start,
            rv: Some(rv.to_string()),
            child: None,
            incarnation: None,
        }
    }

    #[test]
    fn a_shard_may_only_reconcile_an_owner_it_holds() {
        let versions = [
            owner(1, Some("a"), false),
            owner(5, Some("a"), true),
            owner(6, Some("b"), false),
        ];
        let fine = check(
            &versions,
            &[start("a", 1, 150 * MS), start("b", 6, 700 * MS)],
        );
        assert!(fine.violations.is_empty(), "{:?}", fine.violations);
        assert_eq!(fine.records_checked, 2);
        let draining = check(&versions, &[start("a", 5, 550 * MS)]);
        assert_eq!(
            draining.violations.len(),
            1,
            "a draining owner is not reconciled"
        );
        let not_held = check(&versions, &[start("b", 1, 150 * MS)]);
        assert_eq!(not_held.violations.len(), 1, "b did not hold it at rv 1");
        let stale = check(&versions, &[start("a", 1, 600 * MS + STALE_TOLERANCE + 1)]);
        assert_eq!(stale.violations.len(), 1, "long after it moved to b");
        let unseen = check(&versions, &[start("a", 3, 300 * MS)]);
        assert_eq!(
            (unseen.records_checked, unseen.unplaced.len()),
            (0, 1),
            "rv 3 was never observed"
        );
    }

    #[test]
    #[should_panic(expected = "outside the windows declared blind")]
    fn a_record_the_history_could_not_place_fails_outside_a_declared_window() {
        let versions = [owner(1, Some("a"), false)];
        let records = [start("a", 1, 150 * MS), start("a", 3, 300 * MS)];
        let report = check(&versions, &records);
        // Inside the window: passes.
        assert_holds(&Report::default(), &report, &[(200 * MS, 400 * MS)]);
        assert_holds(&Report::default(), &report, &[(0, 200 * MS)]);
    }

    #[test]
    #[should_panic(expected = "no record was checked")]
    fn a_run_whose_records_were_none_checked_fails() {
        let versions = [owner(1, Some("a"), false)];
        let nothing = check(&versions, &[]);
        assert_holds(&Report::default(), &nothing, &[]);
    }
}
