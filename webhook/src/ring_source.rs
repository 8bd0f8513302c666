//! The webhook's ring source: watches the rings of every served kind (ClusterRings,
//! ControllerRings) and the shard Leases carrying each kind's ring label (selector `Exists`, so
//! no other Lease is seen) and publishes one immutable [`RingSnapshot`] per ring. Requests read
//! snapshots lock-free; a snapshot is rebuilt only when its ring's spec or its set of available
//! shards changes.
//!
//! A shard is available by `sharder_common::is_available` (ready, expired or uncertain: exactly
//! when its Lease is held by itself), which never changes with time alone, so the source needs no
//! timers. Of each Lease only its ring, name and availability are kept; nothing else is cached.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use sharder_common::lease::conflicting_names;
use sharder_common::{ClusterRingSpec, Keying, RingId, RingKind, RingObject, ShardLease};
use sharder_runtime::Readiness;
use sharder_runtime::controller::watch;
use sharder_runtime::metrics::RingLabel;
use sharder_runtime::watched::Watched;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::admission::RingSnapshot;
use crate::metrics::Metrics;

/// Readiness condition set once the first list of rings of every served kind has been seen.
pub const RINGS_SYNCED: &str = "rings-synced";
/// Readiness condition set once the first list of shard Leases of every served kind has been
/// seen.
pub const LEASES_SYNCED: &str = "leases-synced";

/// The published ring snapshots, readable lock-free from any request.
#[derive(Debug, Default)]
pub struct Rings(ArcSwap<HashMap<RingId, Arc<RingSnapshot>>>);

impl Rings {
    /// The snapshot of `ring`, if the ring exists.
    pub fn get(&self, ring: &RingId) -> Option<Arc<RingSnapshot>> {
        self.0.load().get(ring).cloned()
    }

    /// Replaces all snapshots (used by the watcher, and by tests).
    pub fn publish(&self, snapshots: HashMap<RingId, Arc<RingSnapshot>>) {
        self.0.store(Arc::new(snapshots));
    }
}

/// What the source keeps of one ring: its spec and what it hashes, or why it cannot be read.
type RingInput = Result<(ClusterRingSpec, Keying), String>;

/// A ring object of `kind` as the source keeps it: its identity, spec and keying, or why it
/// cannot be read ([`RingObject::from_dynamic`], [`RingObject::keying`]; such a ring is invalid).
fn ring_input(kind: RingKind, object: &DynamicObject) -> (RingId, RingInput) {
    let ring = RingObject::from_dynamic(kind, object);
    let keying = ring.keying();
    let input = match (ring.unreadable, keying) {
        (Some(reason), _) => Err(reason),
        (None, Err(e)) => Err(e.to_string()),
        (None, Ok(keying)) => Ok((ring.object.spec, keying)),
    };
    (ring.id, input)
}

/// The pure state behind the snapshots: per ring kind, the rings' specs and what the rings
/// read of their shard Leases (`ShardLease`, by namespace and name; a Lease labelled for rings
/// of both kinds counts once for each); and the inputs each published snapshot was built from
/// (to rebuild only on change).
#[derive(Debug, Default)]
pub struct RingState {
    specs: BTreeMap<RingKind, Watched<RingId, RingInput>>,
    leases: BTreeMap<RingKind, Watched<(String, String), ShardLease>>,
    built: HashMap<RingId, (RingInput, BTreeSet<String>, Arc<RingSnapshot>)>,
}

/// What changed when the state was published.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Rings whose snapshot was (re)built, with their available shards.
    pub rebuilt: Vec<(RingId, BTreeSet<String>)>,
    /// Rings that were removed.
    pub removed: Vec<RingId>,
}

impl RingState {
    /// Applies one watch event of the rings of `kind`.
    pub fn apply_ring_event(&mut self, kind: RingKind, event: Event<DynamicObject>) {
        let entry = |object: &DynamicObject| {
            let (id, input) = ring_input(kind, object);
            (id, Some(input))
        };
        self.specs.entry(kind).or_default().apply(event, entry);
    }

    /// Applies one watch event of the shard Leases of rings of `kind`.
    pub fn apply_lease_event(&mut self, kind: RingKind, event: Event<Lease>) {
        let entry = |lease: &Lease| {
            let key = (lease.namespace().unwrap_or_default(), lease.name_any());
            (key, ShardLease::of(kind, lease))
        };
        self.leases.entry(kind).or_default().apply(event, entry);
    }

    /// The available shards per ring; a name held in more than one namespace of a ring is
    /// ambiguous and left out (`sharder_common::lease::conflicting_names`).
    fn available(&self) -> HashMap<RingId, BTreeSet<String>> {
        let mut by_ring: HashMap<&RingId, Vec<(&str, &ShardLease)>> = HashMap::new();
        for ((namespace, _), lease) in self.leases.values().flat_map(Watched::iter) {
            by_ring
                .entry(&lease.ring)
                .or_default()
                .push((namespace.as_str(), lease));
        }
        by_ring
            .into_iter()
            .map(|(ring, leases)| {
                let ambiguous =
                    conflicting_names(leases.iter().map(|(ns, l)| (*ns, l.shard.as_str())));
                let shards = leases
                    .iter()
                    .filter(|(_, l)| l.available && !ambiguous.contains_key(&l.shard))
                    .map(|(_, l)| l.shard.clone())
                    .collect();
                (ring.clone(), shards)
            })
            .collect()
    }

    /// Rebuilds the snapshots whose inputs changed and returns the full map to publish, with
    /// what changed.
    pub fn snapshots(&mut self) -> (HashMap<RingId, Arc<RingSnapshot>>, Changes) {
        let mut available = self.available();
        let mut changes = Changes::default();
        let mut built = HashMap::with_capacity(self.specs.values().map(Watched::len).sum());
        for (id, input) in self.specs.values().flat_map(Watched::iter) {
            let shards = available.remove(id).unwrap_or_default();
            let entry = match self.built.remove(id) {
                Some(entry) if entry.0 == *input && entry.1 == shards => entry,
                _ => {
                    changes.rebuilt.push((id.clone(), shards.clone()));
                    let snapshot = Arc::new(match input {
                        Ok((spec, keying)) => {
                            RingSnapshot::new(id, spec, shards.iter().cloned()).keyed_by(*keying)
                        }
                        Err(reason) => RingSnapshot::invalid(id, reason.clone()),
                    });
                    (input.clone(), shards, snapshot)
                }
            };
            built.insert(id.clone(), entry);
        }
        changes.removed = self.built.keys().cloned().collect();
        changes.removed.sort();
        self.built = built;
        let map = self
            .built
            .iter()
            .map(|(id, (_, _, snapshot))| (id.clone(), snapshot.clone()))
            .collect();
        (map, changes)
    }
}

enum SourceEvent {
    Ring(RingKind, Event<DynamicObject>),
    Lease(RingKind, Event<Lease>),
}

/// Watches the rings of `kinds` and their shard Leases until `shutdown`, publishing snapshots
/// into `rings` and setting the readiness conditions [`RINGS_SYNCED`] and [`LEASES_SYNCED`] once
/// every kind's first list was seen. Watch errors are retried with backoff (a kind whose CRD is
/// missing is retried, logged, and keeps the webhook unready); the watches ending is an error
/// (the process must not serve stale rings).
pub async fn run(
    client: Client,
    kinds: Vec<RingKind>,
    rings: Arc<Rings>,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut streams = Vec::new();
    for &kind in &kinds {
        let ring_events = watch(
            Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map_ok(move |e| SourceEvent::Ring(kind, e));
        let lease_events = watch(
            Api::<Lease>::all(client.clone()),
            watcher::Config::default().labels(kind.lease_label()),
        )
        .default_backoff()
        .map_ok(move |e| SourceEvent::Lease(kind, e));
        streams.push(ring_events.boxed());
        streams.push(lease_events.boxed());
    }
    let mut events = futures::stream::select_all(streams);
    let mut state = RingState::default();
    let (mut rings_synced, mut leases_synced) = (BTreeSet::new(), BTreeSet::new());
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        match event {
            None => return Err(Error::WatchEnded),
            Some(Err(e)) => {
                warn!(error = %e, "watch failed, retrying with backoff");
                continue;
            }
            Some(Ok(SourceEvent::Ring(kind, event))) => {
                if matches!(event, Event::InitDone) && rings_synced.insert(kind) {
                    readiness.set(RINGS_SYNCED, rings_synced.len() == kinds.len());
                }
                state.apply_ring_event(kind, event);
            }
            Some(Ok(SourceEvent::Lease(kind, event))) => {
                if matches!(event, Event::InitDone) && leases_synced.insert(kind) {
                    readiness.set(LEASES_SYNCED, leases_synced.len() == kinds.len());
                }
                state.apply_lease_event(kind, event);
            }
        }
        let (snapshots, changes) = state.snapshots();
        if changes == Changes::default() {
            continue;
        }
        rings.publish(snapshots);
        for (ring, shards) in changes.rebuilt {
            let label = RingLabel::new(&ring);
            metrics
                .available_shards
                .get_or_create(&label)
                .set(i64::try_from(shards.len()).unwrap_or(i64::MAX));
            metrics.ring_rebuilds.get_or_create(&label).inc();
            info!(%ring, shards = ?shards, "ring rebuilt");
        }
        for ring in changes.removed {
            metrics.available_shards.remove(&RingLabel::new(&ring));
            info!(%ring, "ring removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;
    use serde_json::json;

    use super::*;

    const CLUSTER: RingKind = RingKind::ClusterRing;

    /// A ring object of `kind` as the watch hands it over.
    fn ring_of(kind: RingKind, name: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "sharding.timebertt.dev/v1alpha1",
            "kind": kind.kind(),
            "metadata": { "name": name },
            "spec": { "resources": [{ "group": "", "resource": "secrets" }] },
        }))
        .expect("a ring object")
    }

    fn ring(name: &str) -> DynamicObject {
        ring_of(CLUSTER, name)
    }

    fn id(name: &str) -> RingId {
        RingId::cluster_ring(name)
    }

    fn lease(name: &str, ring: Option<&str>, holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shards".into()),
                labels: ring.map(|r| {
                    [(RingKind::ClusterRing.lease_label().to_owned(), r.to_owned())].into()
                }),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                ..LeaseSpec::default()
            }),
        }
    }

    fn shards(snapshots: &HashMap<RingId, Arc<RingSnapshot>>, ring: &str) -> Vec<String> {
        snapshots[&id(ring)].ring.shards().to_vec()
    }

    #[test]
    fn only_leases_held_by_their_shard_are_on_the_ring() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        state.apply_lease_event(CLUSTER, Event::Apply(lease("b", Some("example"), Some(""))));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("c", Some("example"), Some("shardlease-controller"))),
        );
        state.apply_lease_event(CLUSTER, Event::Apply(lease("d", Some("other"), Some("d"))));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["a"]);
        assert!(
            !snapshots.contains_key(&id("other")),
            "no ClusterRing named other"
        );
    }

    #[test]
    fn snapshots_are_rebuilt_only_when_their_inputs_change() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        let (first, changes) = state.snapshots();
        assert_eq!(changes.rebuilt.len(), 1);

        // A renewal of the same lease changes nothing.
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        let (second, changes) = state.snapshots();
        assert_eq!(changes, Changes::default());
        assert!(Arc::ptr_eq(&first[&id("example")], &second[&id("example")]));

        // A new shard does.
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("b", Some("example"), Some("b"))),
        );
        let (third, changes) = state.snapshots();
        assert_eq!(
            changes.rebuilt,
            [(id("example"), ["a".to_owned(), "b".to_owned()].into())]
        );
        assert_eq!(shards(&third, "example"), ["a", "b"]);

        // Releasing a lease takes the shard off at once.
        state.apply_lease_event(CLUSTER, Event::Apply(lease("b", Some("example"), None)));
        let (fourth, _) = state.snapshots();
        assert_eq!(shards(&fourth, "example"), ["a"]);
    }

    #[test]
    fn deleted_rings_and_leases_disappear() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        state.snapshots();
        state.apply_lease_event(
            CLUSTER,
            Event::Delete(lease("a", Some("example"), Some("a"))),
        );
        let (snapshots, _) = state.snapshots();
        assert!(snapshots[&id("example")].ring.is_empty());
        state.apply_ring_event(CLUSTER, Event::Delete(ring("example")));
        let (snapshots, changes) = state.snapshots();
        assert!(snapshots.is_empty());
        assert_eq!(changes.removed, [id("example")]);
    }

    #[test]
    fn a_relist_replaces_everything_seen_before() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("gone")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("old", Some("example"), Some("old"))),
        );
        state.apply_ring_event(CLUSTER, Event::Init);
        state.apply_ring_event(CLUSTER, Event::InitApply(ring("example")));
        state.apply_ring_event(CLUSTER, Event::InitDone);
        state.apply_lease_event(CLUSTER, Event::Init);
        state.apply_lease_event(
            CLUSTER,
            Event::InitApply(lease("new", Some("example"), Some("new"))),
        );
        state.apply_lease_event(CLUSTER, Event::InitDone);
        let (snapshots, _) = state.snapshots();
        assert_eq!(snapshots.keys().collect::<Vec<_>>(), [&id("example")]);
        assert_eq!(shards(&snapshots, "example"), ["new"]);
    }

    #[test]
    fn a_lease_losing_its_ring_label_leaves_the_ring() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        state.apply_lease_event(CLUSTER, Event::Apply(lease("a", None, Some("a"))));
        let (snapshots, _) = state.snapshots();
        assert!(snapshots[&id("example")].ring.is_empty());
    }

    #[test]
    fn a_shard_name_held_in_two_namespaces_gets_no_new_objects() {
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("b", Some("example"), Some("b"))),
        );
        let mut twin = lease("a", Some("example"), Some("a"));
        twin.metadata.namespace = Some("elsewhere".into());
        state.apply_lease_event(CLUSTER, Event::Apply(twin.clone()));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["b"]);
        // The same name in another ring's Lease is no conflict.
        let mut other_ring = twin.clone();
        other_ring.labels_mut().insert(
            RingKind::ClusterRing.lease_label().to_owned(),
            "other".into(),
        );
        state.apply_lease_event(CLUSTER, Event::Apply(other_ring));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["a", "b"]);
    }

    fn controller_lease(name: &str, ring: &str) -> Lease {
        let mut lease = lease(name, None, Some(name));
        lease.labels_mut().insert(
            RingKind::ControllerRing.lease_label().to_owned(),
            ring.to_owned(),
        );
        lease
    }

    #[test]
    fn rings_of_the_two_kinds_with_one_name_keep_their_own_shards() {
        let controller = RingKind::ControllerRing;
        let mut state = RingState::default();
        state.apply_ring_event(CLUSTER, Event::Apply(ring("example")));
        state.apply_ring_event(controller, Event::Apply(ring_of(controller, "example")));
        state.apply_lease_event(
            CLUSTER,
            Event::Apply(lease("a", Some("example"), Some("a"))),
        );
        state.apply_lease_event(controller, Event::Apply(controller_lease("b", "example")));
        let (snapshots, changes) = state.snapshots();
        assert_eq!(changes.rebuilt.len(), 2);
        assert_eq!(shards(&snapshots, "example"), ["a"]);
        let theirs = &snapshots[&RingId::controller_ring("example")];
        assert_eq!(theirs.ring.shards(), ["b"]);
        assert_eq!(
            theirs.labels.shard,
            "shard.alpha.sharding.timebertt.dev/example"
        );

        // A relist of one kind replaces only that kind's rings and Leases.
        state.apply_ring_event(controller, Event::Init);
        state.apply_ring_event(controller, Event::InitDone);
        state.apply_lease_event(controller, Event::Init);
        state.apply_lease_event(controller, Event::InitDone);
        let (snapshots, changes) = state.snapshots();
        assert_eq!(changes.removed, [RingId::controller_ring("example")]);
        assert_eq!(shards(&snapshots, "example"), ["a"]);
    }

    #[test]
    fn a_ring_whose_spec_does_not_parse_or_whose_name_is_too_long_assigns_nothing() {
        let controller = RingKind::ControllerRing;
        let mut state = RingState::default();
        let mut broken = ring_of(controller, "broken");
        broken.data["spec"] = json!({ "resources": "not a list" });
        state.apply_ring_event(controller, Event::Apply(broken));
        let long = "l".repeat(64);
        state.apply_ring_event(controller, Event::Apply(ring_of(controller, &long)));
        state.apply_lease_event(controller, Event::Apply(controller_lease("a", "broken")));
        state.apply_lease_event(controller, Event::Apply(controller_lease("b", &long)));
        let (snapshots, _) = state.snapshots();
        for ring in [
            RingId::controller_ring("broken"),
            RingId::controller_ring(long),
        ] {
            assert_eq!(
                snapshots[&ring].role("", "secrets"),
                None,
                "{ring} shards nothing"
            );
            assert!(snapshots[&ring].invalid_reason().is_some(), "{ring}");
        }
    }

    #[test]
    fn a_rings_key_annotation_decides_what_its_snapshot_hashes() {
        let mut state = RingState::default();
        let annotated = |name: &str, value: &str| {
            let mut ring = ring(name);
            ring.metadata.annotations =
                Some([("sharder.dev/key".to_owned(), value.to_owned())].into());
            ring
        };
        state.apply_ring_event(
            CLUSTER,
            Event::Apply(annotated("by-namespace", "namespace")),
        );
        state.apply_ring_event(CLUSTER, Event::Apply(annotated("bad", "name")));
        state.apply_ring_event(CLUSTER, Event::Apply(ring("plain")));
        for ring in ["by-namespace", "bad", "plain"] {
            let shard = format!("{ring}-a");
            state.apply_lease_event(
                CLUSTER,
                Event::Apply(lease(&shard, Some(ring), Some(&shard))),
            );
        }
        let (snapshots, _) = state.snapshots();
        let spec =
            serde_json::from_value(json!({"resources": [{"group": "", "resource": "secrets"}]}))
                .expect("spec");
        let expected = |name: &str, keying| {
            RingSnapshot::new(&id(name), &spec, [format!("{name}-a")]).keyed_by(keying)
        };
        assert_eq!(
            *snapshots[&id("by-namespace")],
            expected("by-namespace", Keying::Namespace)
        );
        assert_eq!(*snapshots[&id("plain")], expected("plain", Keying::Object));
        let reason = snapshots[&id("bad")].invalid_reason().expect("invalid");
        assert!(reason.contains("sharder.dev/key: \"name\""), "{reason}");

        // Changing the annotation alone rebuilds the snapshot.
        state.apply_ring_event(CLUSTER, Event::Apply(annotated("plain", "namespace")));
        let (snapshots, changes) = state.snapshots();
        assert_eq!(
            changes.rebuilt,
            vec![(id("plain"), ["plain-a".to_owned()].into())]
        );
        assert_eq!(
            *snapshots[&id("plain")],
            expected("plain", Keying::Namespace)
        );
    }
}
