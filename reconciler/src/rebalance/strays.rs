//! Objects no shard reconciles: what a list that selects every such object of a resource (a full
//! list or a sweep) found without a shard label or on a shard that is not available, counted with
//! the creation time of the oldest. The counts are gauges an operator alerts on: a count of the
//! webhook's misses says how many CREATEs went unassigned, not how many objects wait now.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use sharder_common::RingLabels;

/// The objects of one resource that no available shard held, as one list found them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Strays {
    /// How many.
    pub objects: usize,
    /// The earliest creation time among them (`None`: none, or none with a creation time).
    pub oldest: Option<Timestamp>,
}

impl Strays {
    /// Counts `meta` when no shard of `available` holds it.
    pub(crate) fn see(
        &mut self,
        meta: &ObjectMeta,
        labels: &RingLabels,
        available: &BTreeSet<String>,
    ) {
        if held(meta.labels.as_ref(), labels, available) {
            return;
        }
        self.objects += 1;
        if let Some(created) = meta.creation_timestamp.as_ref().map(|t| t.0) {
            self.oldest = Some(self.oldest.map_or(created, |oldest| oldest.min(created)));
        }
    }

    /// Seconds the oldest of them had existed at `now` (0 when there are none).
    pub(crate) fn oldest_age(&self, now: Timestamp) -> f64 {
        match self.oldest {
            Some(oldest) if self.objects > 0 => now.duration_since(oldest).as_secs_f64().max(0.0),
            _ => 0.0,
        }
    }
}

/// Whether an object with `object_labels` sits on one of the `available` shards.
pub(crate) fn held(
    object_labels: Option<&BTreeMap<String, String>>,
    labels: &RingLabels,
    available: &BTreeSet<String>,
) -> bool {
    object_labels
        .and_then(|l| labels.shard_of(l))
        .is_some_and(|shard| available.contains(shard))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use sharder_common::RingId;

    use super::*;

    fn at(time: &str) -> Timestamp {
        time.parse().expect("a time")
    }

    fn object(shard: Option<&str>, draining: bool, created: Option<&str>) -> ObjectMeta {
        let ring = RingId::cluster_ring("ring").labels();
        let mut labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        if let Some(shard) = shard {
            labels.insert(ring.shard.clone(), shard.to_owned());
        }
        if draining {
            labels.insert(ring.drain.clone(), "true".to_owned());
        }
        ObjectMeta {
            name: Some("object".into()),
            labels: Some(labels),
            creation_timestamp: created.map(|t| Time(at(t))),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn an_object_without_a_shard_or_on_a_shard_not_available_is_counted() {
        let ring = RingId::cluster_ring("ring").labels();
        let available: BTreeSet<String> = ["shard-0".into(), "shard-1".into()].into();
        let cases = [
            (object(Some("shard-0"), false, None), false),
            (object(Some("shard-1"), true, None), false),
            (object(None, false, None), true),
            (object(Some("shard-9"), false, None), true),
            (object(Some("shard-9"), true, None), true),
            (object(Some(""), false, None), true),
            (ObjectMeta::default(), true),
        ];
        for (meta, counted) in cases {
            let mut strays = Strays::default();
            strays.see(&meta, &ring, &available);
            assert_eq!(strays.objects, usize::from(counted), "{meta:?}");
        }
    }

    #[test]
    fn the_oldest_is_the_earliest_creation_of_the_objects_counted() {
        let ring = RingId::cluster_ring("ring").labels();
        let available: BTreeSet<String> = ["shard-0".into()].into();
        let now = at("2026-12-03T09:00:00Z");
        let cases: [(&[ObjectMeta], usize, f64); 4] = [
            (&[], 0, 0.0),
            (
                &[
                    object(None, false, Some("2026-12-03T08:59:00Z")),
                    object(Some("gone"), false, Some("2026-12-03T08:50:00Z")),
                    object(None, false, None),
                ],
                3,
                600.0,
            ),
            // Held objects do not count, however old.
            (
                &[
                    object(Some("shard-0"), false, Some("2026-12-01T00:00:00Z")),
                    object(None, false, Some("2026-12-03T08:59:30Z")),
                ],
                1,
                30.0,
            ),
            // A creation time after `now` (clocks that disagree) is no wait.
            (&[object(None, false, Some("2026-12-03T09:00:05Z"))], 1, 0.0),
        ];
        for (objects, count, age) in cases {
            let mut strays = Strays::default();
            for meta in objects {
                strays.see(meta, &ring, &available);
            }
            assert_eq!(strays.objects, count, "{objects:?}");
            assert_eq!(strays.oldest_age(now), age, "{objects:?}");
        }
    }
}
