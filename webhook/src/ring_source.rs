//! The webhook's ring source: watches ClusterRings and the shard Leases carrying the ring label
//! (selector `Exists`, so no other Lease is seen) and publishes one immutable [`RingSnapshot`]
//! per ClusterRing. Requests read snapshots lock-free; a snapshot is rebuilt only when its ring's
//! spec or its set of available shards changes.
//!
//! A shard is available by `sharder_common::is_available` (ready, expired or uncertain: exactly
//! when its Lease is held by itself), which never changes with time alone, so the source needs no
//! timers. Of each Lease only its ring, name and availability are kept; nothing else is cached.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use sharder_common::labels::RING_LABEL;
use sharder_common::lease::conflicting_names;
use sharder_common::{ClusterRing, ClusterRingSpec, is_available};
use sharder_runtime::Readiness;
use sharder_runtime::metrics::RingLabel;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::admission::RingSnapshot;
use crate::metrics::Metrics;

/// Readiness condition set once the first list of ClusterRings has been seen.
pub const RINGS_SYNCED: &str = "clusterrings-synced";
/// Readiness condition set once the first list of shard Leases has been seen.
pub const LEASES_SYNCED: &str = "leases-synced";

/// The published ring snapshots, readable lock-free from any request.
#[derive(Debug, Default)]
pub struct Rings(ArcSwap<HashMap<String, Arc<RingSnapshot>>>);

impl Rings {
    /// The snapshot of ring `name`, if the ring exists.
    pub fn get(&self, name: &str) -> Option<Arc<RingSnapshot>> {
        self.0.load().get(name).cloned()
    }

    /// Replaces all snapshots (used by the watcher, and by tests).
    pub fn publish(&self, snapshots: HashMap<String, Arc<RingSnapshot>>) {
        self.0.store(Arc::new(snapshots));
    }
}

/// What the source keeps of one shard Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ShardLease {
    ring: String,
    shard: String,
    available: bool,
}

impl ShardLease {
    fn of(lease: &Lease) -> Option<Self> {
        let ring = lease.labels().get(RING_LABEL)?.clone();
        Some(Self {
            ring,
            shard: lease.name_any(),
            available: is_available(lease),
        })
    }
}

fn lease_id(lease: &Lease) -> (String, String) {
    (lease.namespace().unwrap_or_default(), lease.name_any())
}

/// The pure state behind the snapshots: ring specs and shard leases, and the inputs each
/// published snapshot was built from (to rebuild only on change).
#[derive(Debug, Default)]
pub struct RingState {
    specs: BTreeMap<String, ClusterRingSpec>,
    leases: HashMap<(String, String), ShardLease>,
    init_specs: Option<BTreeMap<String, ClusterRingSpec>>,
    init_leases: Option<HashMap<(String, String), ShardLease>>,
    built: HashMap<String, (ClusterRingSpec, BTreeSet<String>, Arc<RingSnapshot>)>,
}

/// What changed when the state was published.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Rings whose snapshot was (re)built, with their available shards.
    pub rebuilt: Vec<(String, BTreeSet<String>)>,
    /// Rings that were removed.
    pub removed: Vec<String>,
}

impl RingState {
    /// Applies one ClusterRing watch event.
    pub fn apply_ring_event(&mut self, event: Event<ClusterRing>) {
        match event {
            Event::Apply(ring) => {
                self.specs.insert(ring.name_any(), ring.spec);
            }
            Event::Delete(ring) => {
                self.specs.remove(&ring.name_any());
            }
            Event::Init => self.init_specs = Some(BTreeMap::new()),
            Event::InitApply(ring) => {
                self.init_specs
                    .get_or_insert_with(BTreeMap::new)
                    .insert(ring.name_any(), ring.spec);
            }
            Event::InitDone => {
                self.specs = self.init_specs.take().unwrap_or_default();
            }
        }
    }

    /// Applies one shard Lease watch event.
    pub fn apply_lease_event(&mut self, event: Event<Lease>) {
        match event {
            Event::Apply(lease) => match ShardLease::of(&lease) {
                Some(shard) => {
                    self.leases.insert(lease_id(&lease), shard);
                }
                None => {
                    self.leases.remove(&lease_id(&lease));
                }
            },
            Event::Delete(lease) => {
                self.leases.remove(&lease_id(&lease));
            }
            Event::Init => self.init_leases = Some(HashMap::new()),
            Event::InitApply(lease) => {
                if let Some(shard) = ShardLease::of(&lease) {
                    self.init_leases
                        .get_or_insert_with(HashMap::new)
                        .insert(lease_id(&lease), shard);
                }
            }
            Event::InitDone => {
                self.leases = self.init_leases.take().unwrap_or_default();
            }
        }
    }

    /// The available shards per ring; a name held in more than one namespace of a ring is
    /// ambiguous and left out (`sharder_common::lease::conflicting_names`).
    fn available(&self) -> HashMap<String, BTreeSet<String>> {
        let mut by_ring: HashMap<&str, Vec<(&str, &ShardLease)>> = HashMap::new();
        for ((namespace, _), lease) in &self.leases {
            by_ring
                .entry(lease.ring.as_str())
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
                (ring.to_owned(), shards)
            })
            .collect()
    }

    /// Rebuilds the snapshots whose inputs changed and returns the full map to publish, with
    /// what changed.
    pub fn snapshots(&mut self) -> (HashMap<String, Arc<RingSnapshot>>, Changes) {
        let mut available = self.available();
        let mut changes = Changes::default();
        let mut built = HashMap::with_capacity(self.specs.len());
        for (name, spec) in &self.specs {
            let shards = available.remove(name.as_str()).unwrap_or_default();
            let entry = match self.built.remove(name) {
                Some(entry) if entry.0 == *spec && entry.1 == shards => entry,
                _ => {
                    changes.rebuilt.push((name.clone(), shards.clone()));
                    let snapshot = Arc::new(RingSnapshot::new(name, spec, shards.iter().cloned()));
                    (spec.clone(), shards, snapshot)
                }
            };
            built.insert(name.clone(), entry);
        }
        changes.removed = self.built.keys().cloned().collect();
        changes.removed.sort();
        self.built = built;
        let map = self
            .built
            .iter()
            .map(|(name, (_, _, snapshot))| (name.clone(), snapshot.clone()))
            .collect();
        (map, changes)
    }
}

enum SourceEvent {
    Ring(Event<ClusterRing>),
    Lease(Event<Lease>),
}

/// Watches ClusterRings and shard Leases until `shutdown`, publishing snapshots into `rings`
/// and setting the readiness conditions [`RINGS_SYNCED`] and [`LEASES_SYNCED`]. Watch errors are
/// retried with backoff; the watches ending is an error (the process must not serve stale rings).
pub async fn run(
    client: Client,
    rings: Arc<Rings>,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let ring_events = watcher::watcher(
        Api::<ClusterRing>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map_ok(SourceEvent::Ring);
    let lease_events = watcher::watcher(
        Api::<Lease>::all(client),
        watcher::Config::default().labels(RING_LABEL),
    )
    .default_backoff()
    .map_ok(SourceEvent::Lease);
    let mut events = std::pin::pin!(futures::stream::select(ring_events, lease_events));
    let mut state = RingState::default();
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
            Some(Ok(SourceEvent::Ring(event))) => {
                let done = matches!(event, Event::InitDone);
                state.apply_ring_event(event);
                if done {
                    readiness.set(RINGS_SYNCED, true);
                }
            }
            Some(Ok(SourceEvent::Lease(event))) => {
                let done = matches!(event, Event::InitDone);
                state.apply_lease_event(event);
                if done {
                    readiness.set(LEASES_SYNCED, true);
                }
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
            info!(clusterring = %ring, shards = ?shards, "ring rebuilt");
        }
        for ring in changes.removed {
            metrics.available_shards.remove(&RingLabel::new(&ring));
            info!(clusterring = %ring, "ring removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;
    use sharder_common::RingResource;

    use super::*;

    fn ring(name: &str) -> ClusterRing {
        ClusterRing::new(
            name,
            ClusterRingSpec {
                resources: vec![RingResource {
                    group: String::new(),
                    resource: "secrets".into(),
                    controlled_resources: vec![],
                }],
                namespace_selector: None,
            },
        )
    }

    fn lease(name: &str, ring: Option<&str>, holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shards".into()),
                labels: ring.map(|r| [(RING_LABEL.to_owned(), r.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                ..LeaseSpec::default()
            }),
        }
    }

    fn shards(snapshots: &HashMap<String, Arc<RingSnapshot>>, ring: &str) -> Vec<String> {
        snapshots[ring].ring.shards().to_vec()
    }

    #[test]
    fn only_leases_held_by_their_shard_are_on_the_ring() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("example")));
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        state.apply_lease_event(Event::Apply(lease("b", Some("example"), Some(""))));
        state.apply_lease_event(Event::Apply(lease(
            "c",
            Some("example"),
            Some("shardlease-controller"),
        )));
        state.apply_lease_event(Event::Apply(lease("d", Some("other"), Some("d"))));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["a"]);
        assert!(
            !snapshots.contains_key("other"),
            "no ClusterRing named other"
        );
    }

    #[test]
    fn snapshots_are_rebuilt_only_when_their_inputs_change() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("example")));
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        let (first, changes) = state.snapshots();
        assert_eq!(changes.rebuilt.len(), 1);

        // A renewal of the same lease changes nothing.
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        let (second, changes) = state.snapshots();
        assert_eq!(changes, Changes::default());
        assert!(Arc::ptr_eq(&first["example"], &second["example"]));

        // A new shard does.
        state.apply_lease_event(Event::Apply(lease("b", Some("example"), Some("b"))));
        let (third, changes) = state.snapshots();
        assert_eq!(
            changes.rebuilt,
            [(
                "example".to_owned(),
                ["a".to_owned(), "b".to_owned()].into()
            )]
        );
        assert_eq!(shards(&third, "example"), ["a", "b"]);

        // Releasing a lease takes the shard off at once.
        state.apply_lease_event(Event::Apply(lease("b", Some("example"), None)));
        let (fourth, _) = state.snapshots();
        assert_eq!(shards(&fourth, "example"), ["a"]);
    }

    #[test]
    fn deleted_rings_and_leases_disappear() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("example")));
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        state.snapshots();
        state.apply_lease_event(Event::Delete(lease("a", Some("example"), Some("a"))));
        let (snapshots, _) = state.snapshots();
        assert!(snapshots["example"].ring.is_empty());
        state.apply_ring_event(Event::Delete(ring("example")));
        let (snapshots, changes) = state.snapshots();
        assert!(snapshots.is_empty());
        assert_eq!(changes.removed, ["example"]);
    }

    #[test]
    fn a_relist_replaces_everything_seen_before() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("gone")));
        state.apply_lease_event(Event::Apply(lease("old", Some("example"), Some("old"))));
        state.apply_ring_event(Event::Init);
        state.apply_ring_event(Event::InitApply(ring("example")));
        state.apply_ring_event(Event::InitDone);
        state.apply_lease_event(Event::Init);
        state.apply_lease_event(Event::InitApply(lease("new", Some("example"), Some("new"))));
        state.apply_lease_event(Event::InitDone);
        let (snapshots, _) = state.snapshots();
        assert_eq!(snapshots.keys().collect::<Vec<_>>(), ["example"]);
        assert_eq!(shards(&snapshots, "example"), ["new"]);
    }

    #[test]
    fn a_lease_losing_its_ring_label_leaves_the_ring() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("example")));
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        state.apply_lease_event(Event::Apply(lease("a", None, Some("a"))));
        let (snapshots, _) = state.snapshots();
        assert!(snapshots["example"].ring.is_empty());
    }

    #[test]
    fn a_shard_name_held_in_two_namespaces_gets_no_new_objects() {
        let mut state = RingState::default();
        state.apply_ring_event(Event::Apply(ring("example")));
        state.apply_lease_event(Event::Apply(lease("a", Some("example"), Some("a"))));
        state.apply_lease_event(Event::Apply(lease("b", Some("example"), Some("b"))));
        let mut twin = lease("a", Some("example"), Some("a"));
        twin.metadata.namespace = Some("elsewhere".into());
        state.apply_lease_event(Event::Apply(twin.clone()));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["b"]);
        // The same name in another ring's Lease is no conflict.
        let mut other_ring = twin.clone();
        other_ring
            .labels_mut()
            .insert(RING_LABEL.to_owned(), "other".into());
        state.apply_lease_event(Event::Apply(other_ring));
        let (snapshots, _) = state.snapshots();
        assert_eq!(shards(&snapshots, "example"), ["a", "b"]);
    }
}
