//! Which shard Lease events wake a ring: only those that can change its shards or, in range
//! mode, what a shard serves. Every shard renews its Lease every few seconds and the ring
//! controller's debounce pushes a pending reconcile back at each event, so renewals wake
//! nothing. What wakes a ring is a change of what it reads of a Lease ([`ShardLease`] and the
//! served ranges), a new or deleted Lease, or a relist (once, at its end).

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};
use sharder_common::ranges::SERVED_ANNOTATION;
use sharder_common::{RingKind, ShardLease};
use sharder_runtime::watched::{Update, Watched};

/// The Leases of rings of one kind seen, by namespace and name, with what the rings read of
/// them (and the ranges they serve).
#[derive(Debug)]
pub(crate) struct LeaseTriggers {
    kind: RingKind,
    seen: Watched<(String, String), (ShardLease, Option<String>)>,
}

impl LeaseTriggers {
    /// Triggers for the rings of `kind`.
    pub(crate) fn new(kind: RingKind) -> Self {
        Self {
            kind,
            seen: Watched::default(),
        }
    }

    /// The Leases whose rings `event` should wake.
    pub(crate) fn admit(&mut self, event: Event<Lease>) -> Vec<Lease> {
        let kind = self.kind;
        let deleted = matches!(event, Event::Delete(_));
        let entry = |l: &Lease| {
            let key = (l.namespace().unwrap_or_default(), l.name_any());
            let served = l.annotations().get(SERVED_ANNOTATION).cloned();
            (key, ShardLease::of(kind, l).map(|lease| (lease, served)))
        };
        match self.seen.apply(event, entry) {
            None => Vec::new(),
            Some(Update::Changed {
                object,
                before,
                after,
            }) => {
                if deleted || before != after {
                    vec![object]
                } else {
                    Vec::new()
                }
            }
            // A relist wakes every ring once (it may follow missed events), at its end: the
            // rings of the Leases it returned and of those it no longer did.
            Some(Update::Relisted { gone }) => self
                .seen
                .iter()
                .map(|(key, lease)| (key.clone(), lease.clone()))
                .chain(gone)
                .map(|((namespace, name), (lease, _))| {
                    self.stand_in(namespace, name, lease.ring.name)
                })
                .collect(),
        }
    }

    /// A Lease of `ring` named `name` in `namespace`: what wakes its ring.
    fn stand_in(&self, namespace: String, name: String, ring: String) -> Lease {
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                labels: Some([(self.kind.lease_label().to_owned(), ring)].into()),
                ..Default::default()
            },
            spec: None,
        }
    }
}

/// The events of `events` (Leases of rings of `kind`) that should wake a ring, as Lease objects
/// (errors pass through).
pub(crate) fn lease_triggers<S>(
    kind: RingKind,
    events: S,
) -> impl Stream<Item = Result<Lease, watcher::Error>> + Send
where
    S: Stream<Item = Result<Event<Lease>, watcher::Error>> + Send,
{
    let mut triggers = LeaseTriggers::new(kind);
    events.flat_map(move |event| {
        let admitted = match event {
            Ok(event) => triggers.admit(event).into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(admitted)
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    use super::*;

    fn lease(name: &str, ring: &str, holder: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some(
                    [(
                        RingKind::ClusterRing.lease_label().to_owned(),
                        ring.to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(renewed).expect("timestamp"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn renewals_do_not_wake_the_ring_but_changes_of_its_shards_do() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        let name = |l: Vec<Lease>| l.first().map(|l| l.name_any());
        let table = [
            (
                Event::Apply(lease("a", "r", "a", 100)),
                Some("a"),
                "a new Lease",
            ),
            (Event::Apply(lease("a", "r", "a", 102)), None, "a renewal"),
            (
                Event::Apply(lease("a", "r", "a", 500)),
                None,
                "a renewal long after expiry: still held, still available",
            ),
            (
                Event::Apply(lease("a", "r", "shardlease-controller", 500)),
                Some("a"),
                "taken over: the shard is dead",
            ),
            (
                Event::Apply(lease("a", "r", "a", 501)),
                Some("a"),
                "held by its shard again",
            ),
            (
                Event::Apply(lease("a", "other", "a", 502)),
                Some("a"),
                "moved to another ring",
            ),
            (
                Event::Delete(lease("a", "other", "a", 502)),
                Some("a"),
                "deleted",
            ),
            (
                Event::Apply(lease("a", "other", "a", 503)),
                Some("a"),
                "created again",
            ),
        ];
        for (event, want, what) in table {
            assert_eq!(name(t.admit(event)).as_deref(), want, "{what}");
        }
    }

    #[test]
    fn a_change_of_the_ranges_a_shard_serves_wakes_the_ring_and_a_new_assignment_does_not() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        let annotated = |annotations: &[(&str, &str)]| {
            let mut l = lease("a", "r", "a", 100);
            l.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
            l
        };
        use sharder_common::ranges::ASSIGNED_ANNOTATION;
        let table = [
            (annotated(&[]), true, "a new Lease"),
            (annotated(&[(ASSIGNED_ANNOTATION, "x")]), false, "assigned"),
            (
                annotated(&[(ASSIGNED_ANNOTATION, "x"), (SERVED_ANNOTATION, "x")]),
                true,
                "the shard serves it",
            ),
            (
                annotated(&[(ASSIGNED_ANNOTATION, "x"), (SERVED_ANNOTATION, "x")]),
                false,
                "a renewal",
            ),
            (
                annotated(&[(ASSIGNED_ANNOTATION, ""), (SERVED_ANNOTATION, "")]),
                true,
                "the shard let it go",
            ),
        ];
        for (lease, wakes, what) in table {
            assert_eq!(!t.admit(Event::Apply(lease)).is_empty(), wakes, "{what}");
        }
    }

    #[test]
    fn a_released_lease_wakes_the_ring() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        assert!(!t.admit(Event::Apply(lease("a", "r", "a", 100))).is_empty());
        let mut released = lease("a", "r", "a", 100);
        if let Some(spec) = released.spec.as_mut() {
            spec.holder_identity = None;
        }
        assert!(!t.admit(Event::Apply(released)).is_empty());
    }

    #[test]
    fn leases_of_the_same_name_in_two_namespaces_are_told_apart() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        let mut other = lease("a", "r", "a", 100);
        other.metadata.namespace = Some("ns-2".into());
        assert!(!t.admit(Event::Apply(lease("a", "r", "a", 100))).is_empty());
        assert!(
            !t.admit(Event::Apply(other)).is_empty(),
            "not a renewal of the first"
        );
    }

    #[test]
    fn a_relist_wakes_the_rings_of_every_lease_listed_or_gone_once_it_is_done() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        let names = |leases: Vec<Lease>| -> Vec<String> {
            let mut names: Vec<String> = leases
                .iter()
                .map(|l| {
                    format!(
                        "{} of {}",
                        l.name_any(),
                        l.labels()[RingKind::ClusterRing.lease_label()]
                    )
                })
                .collect();
            names.sort();
            names
        };
        for lease in [lease("a", "r", "a", 100), lease("b", "s", "b", 100)] {
            assert!(!t.admit(Event::Apply(lease)).is_empty());
        }
        assert!(t.admit(Event::Init).is_empty(), "the start of a relist");
        for lease in [lease("a", "r", "a", 102), lease("c", "r", "c", 100)] {
            assert!(
                t.admit(Event::InitApply(lease)).is_empty(),
                "the store takes a list's Leases at its end"
            );
        }
        assert_eq!(
            names(t.admit(Event::InitDone)),
            ["a of r", "b of s", "c of r"],
            "the listed Leases, and b, deleted while the watch was away"
        );
        assert!(
            t.admit(Event::Apply(lease("a", "r", "a", 104))).is_empty(),
            "after the relist, a renewal of a listed Lease is a renewal"
        );
        assert!(t.admit(Event::InitDone).is_empty(), "no list under way");
    }
}
