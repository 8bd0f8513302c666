//! Which shard Lease events wake a ring: only those that can change its shards. A Lease is
//! renewed every few seconds by every shard; the ring controller's debounce pushes a pending
//! reconcile back at each event it gets, so with renewals as triggers a ring with many shards
//! (or a short renew interval) would wait for a quiet moment that may not come, and a dead
//! shard's objects would wait with it. What a ring reads of a Lease is its ring label and
//! whether it is held by its shard ([`is_available`]); only a change of those, a new Lease, a
//! deleted one, or a relist passes.

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};
use sharder_common::{RingKind, is_available};

/// What a ring reads of a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signature {
    ring: Option<String>,
    available: bool,
}

impl Signature {
    fn of(kind: RingKind, lease: &Lease) -> Self {
        Self {
            ring: lease.labels().get(kind.lease_label()).cloned(),
            available: is_available(lease),
        }
    }
}

/// The Leases of rings of one kind seen, by namespace and name, with what the rings read of
/// them.
#[derive(Debug)]
pub(crate) struct LeaseTriggers {
    kind: RingKind,
    seen: HashMap<(String, String), Signature>,
}

impl LeaseTriggers {
    /// Triggers for the rings of `kind`.
    pub(crate) fn new(kind: RingKind) -> Self {
        Self {
            kind,
            seen: HashMap::new(),
        }
    }

    /// The Lease of `event` if it should wake its ring.
    pub(crate) fn admit(&mut self, event: Event<Lease>) -> Option<Lease> {
        let key = |l: &Lease| (l.namespace().unwrap_or_default(), l.name_any());
        match event {
            // A relist wakes every ring once (it may follow missed events).
            Event::InitApply(lease) => {
                self.seen
                    .insert(key(&lease), Signature::of(self.kind, &lease));
                Some(lease)
            }
            Event::Apply(lease) => {
                let signature = Signature::of(self.kind, &lease);
                let changed = self.seen.get(&key(&lease)) != Some(&signature);
                self.seen.insert(key(&lease), signature);
                changed.then_some(lease)
            }
            Event::Delete(lease) => {
                self.seen.remove(&key(&lease));
                Some(lease)
            }
            Event::Init | Event::InitDone => None,
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
    events.filter_map(move |event| {
        let admitted = match event {
            Ok(event) => triggers.admit(event).map(Ok),
            Err(e) => Some(Err(e)),
        };
        std::future::ready(admitted)
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
        let name = |l: Option<Lease>| l.map(|l| l.name_any());
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
            (
                Event::InitApply(lease("a", "other", "a", 503)),
                Some("a"),
                "a relist wakes every ring",
            ),
            (Event::Init, None, "the start of a relist"),
            (Event::InitDone, None, "the end of a relist"),
        ];
        for (event, want, what) in table {
            assert_eq!(name(t.admit(event)).as_deref(), want, "{what}");
        }
    }

    #[test]
    fn a_released_lease_wakes_the_ring() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        assert!(t.admit(Event::Apply(lease("a", "r", "a", 100))).is_some());
        let mut released = lease("a", "r", "a", 100);
        if let Some(spec) = released.spec.as_mut() {
            spec.holder_identity = None;
        }
        assert!(t.admit(Event::Apply(released)).is_some());
    }

    #[test]
    fn leases_of_the_same_name_in_two_namespaces_are_told_apart() {
        let mut t = LeaseTriggers::new(RingKind::ClusterRing);
        let mut other = lease("a", "r", "a", 100);
        other.metadata.namespace = Some("ns-2".into());
        assert!(t.admit(Event::Apply(lease("a", "r", "a", 100))).is_some());
        assert!(
            t.admit(Event::Apply(other)).is_some(),
            "not a renewal of the first"
        );
    }
}
