//! The single-ownership invariant, checked from the example shards' reconcile records: no object
//! is ever reconciled by two shards at overlapping times.

use std::collections::BTreeMap;

use sharder_example::record::{Event, Line};

/// One reconcile of one object by one shard, in Unix nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The shard.
    pub shard: String,
    /// Start.
    pub start: u128,
    /// End (for a reconcile cut short by a kill: the kill time).
    pub end: u128,
}

/// Two shards reconciling one object at the same time.
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

/// Builds intervals from `lines` and finds overlaps. A start with no end is closed at
/// `ended[shard]` (the time the shard was killed), or at `now` if the shard is still running.
pub fn check(lines: &[Line], ended: &BTreeMap<String, u128>, now: u128) -> Report {
    let mut open: BTreeMap<(String, String), u128> = BTreeMap::new();
    let mut report = Report::default();
    let mut sorted: Vec<&Line> = lines.iter().collect();
    sorted.sort_by_key(|l| l.t);
    for line in sorted {
        let key = (line.shard.clone(), line.object.clone());
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
                            start,
                            end: line.t,
                        });
                }
            }
        }
    }
    for ((shard, object), start) in open {
        let end = ended.get(&shard).copied().unwrap_or(now).max(start);
        report
            .reconciles
            .entry(object)
            .or_default()
            .push(Interval { shard, start, end });
    }
    for (object, intervals) in &mut report.reconciles {
        intervals.sort_by_key(|i| i.start);
        for (i, first) in intervals.iter().enumerate() {
            for second in &intervals[i + 1..] {
                if second.start >= first.end {
                    break;
                }
                if second.shard != first.shard {
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
        let report = check(&lines, &BTreeMap::new(), 10);
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
        let report = check(&lines, &BTreeMap::new(), 10);
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
        let killed_before = BTreeMap::from([("a".to_owned(), 4)]);
        assert!(check(&lines, &killed_before, 10).overlaps.is_empty());
        let killed_after = BTreeMap::from([("a".to_owned(), 6)]);
        assert_eq!(check(&lines, &killed_after, 10).overlaps.len(), 1);
        assert_eq!(
            check(&lines, &BTreeMap::new(), 10).overlaps.len(),
            1,
            "a still-running shard's open reconcile lasts until now"
        );
    }
}
