//! One ring as a pass sees it ([`RingView`]): its shards, labels and namespaces, whether it is
//! still there, and the decision for one object on it ([`plan::decide`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, ResourceExt};
use sharder_common::handover::OwnerState;
use sharder_common::key::group_of_api_version;
use sharder_common::{GroupResource, Keying, Ring, RingId, RingLabels, Role, is_available};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::warn;

use super::plan::{self, Placement};
use crate::terms::{Namespaces, Target};

/// One ring's view for a rebalance.
pub(crate) struct RingView<'a> {
    /// The ring.
    pub id: &'a RingId,
    /// Its label keys.
    pub labels: &'a RingLabels,
    /// What it hashes.
    pub keying: Keying,
    /// The ring of available shards.
    pub ring: &'a Ring,
    /// The available shards.
    pub available: &'a BTreeSet<String>,
    /// Where namespaced objects may be.
    pub namespaces: &'a Namespaces,
    /// The shards holding their Leases now, read once when first needed.
    pub live_now: &'a LiveNow,
    /// The owners read in the pass's current round.
    pub owner_reads: &'a OwnerReads,
    /// Whether the ring is still the one this rebalance is for (not deleted or replaced).
    pub current: &'a (dyn Fn() -> bool + Send + Sync),
}

impl RingView<'_> {
    /// Whether the ring is still the one this rebalance is for.
    pub(crate) fn is_current(&self) -> bool {
        (self.current)()
    }

    /// What object `meta` of `target`, placed as `placement`, needs on this ring
    /// ([`plan::decide`]; `owner`: its owner's state once read).
    pub(crate) fn decide(
        &self,
        target: &Target,
        placement: Placement,
        meta: &ObjectMeta,
        owner: Option<&OwnerState>,
    ) -> plan::Decision {
        let key = plan::key_of(
            self.keying,
            meta,
            target.role,
            &target.resource.group,
            &target.api.kind,
        );
        let (ring, available, labels) = (self.ring, self.available, self.labels);
        plan::decide(
            meta,
            key.as_ref(),
            placement,
            ring,
            available,
            labels,
            owner,
        )
    }

    /// Whether `meta` is a main object of `target` that needs no write (no request needed).
    pub(crate) fn stays(&self, target: &Target, meta: &ObjectMeta) -> bool {
        target.role == Role::Main
            && self.decide(target, Placement::Main, meta, None) == plan::Decision::Stay
    }
}

/// The controller ownerReference of `meta`, if any.
pub(crate) fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// How object `meta` of `target` is placed among the ring's `targets` on a ring hashing as
/// `keying` says: a controlled object whose controller is of a controlled resource of the ring
/// is a level of a chain, unless the ring is keyed by namespace (then each level's place is
/// known from its own namespace, and it follows its owner as a child does).
pub(crate) fn placement(
    keying: Keying,
    targets: &[Target],
    target: &Target,
    meta: &ObjectMeta,
) -> Placement {
    if target.role == Role::Main {
        return Placement::Main;
    }
    let chained = keying == Keying::Object
        && controller_of(meta).is_some_and(|owner| {
            group_of_api_version(&owner.api_version).is_ok_and(|group| {
                targets.iter().any(|t| {
                    t.role == Role::Controlled
                        && t.resource.group == group
                        && t.api.kind == owner.kind
                })
            })
        });
    if chained {
        Placement::Chained
    } else {
        Placement::Child
    }
}

/// How long an owner read serves the other objects of its owner.
const OWNER_READ_TTL: Duration = Duration::from_secs(1);

/// The most owners remembered at once: objects are listed in name order and handled a few
/// hundred at a time, so the objects of one owner meet within far fewer.
const MAX_OWNER_READS: usize = 512;

/// What a read of an owner found: its metadata (what deciding it needs), none, or why it could
/// not be read.
type OwnerRead = Result<Option<ObjectMeta>, String>;

/// An owner by resource, namespace and name.
type OwnerKey = (GroupResource, Option<String>, String);

/// The reads of one round: when each began, and its answer once there.
type Reads = HashMap<OwnerKey, (Instant, Arc<OnceCell<OwnerRead>>)>;

/// The owners read during one round of a pass (a list, or a look at the waiting objects again),
/// so that the objects of one owner (a ReplicaSet's Pods, handled side by side) read it once:
/// cleared at each round, each read kept at most [`OWNER_READ_TTL`], at most
/// [`MAX_OWNER_READS`] at once. A read is shared while in flight; only the read is, never a
/// decision, so objects controlling each other cannot wait on one another.
#[derive(Debug, Default)]
pub(crate) struct OwnerReads(Mutex<Reads>);

impl OwnerReads {
    /// Starts a round: nothing read before it is used.
    pub(crate) fn new_round(&self) {
        self.lock().clear();
    }

    /// The owner `key` as `read` finds it, read once for every object asking within the bound.
    pub(crate) async fn read<F>(&self, key: OwnerKey, read: impl FnOnce() -> F) -> OwnerRead
    where
        F: Future<Output = OwnerRead>,
    {
        let cell = {
            let mut reads = self.lock();
            let now = Instant::now();
            match reads.get(&key) {
                Some((at, cell)) if now.duration_since(*at) < OWNER_READ_TTL => cell.clone(),
                _ => {
                    if reads.len() >= MAX_OWNER_READS {
                        reads.retain(|_, (at, _)| now.duration_since(*at) < OWNER_READ_TTL);
                        if reads.len() >= MAX_OWNER_READS {
                            reads.clear();
                        }
                    }
                    let cell = Arc::new(OnceCell::new());
                    reads.insert(key, (now, cell.clone()));
                    cell
                }
            }
        };
        cell.get_or_init(read).await.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reads> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What deciding an owner needs of its metadata (its identity, labels and owners), without the
/// rest (managed fields, annotations), which a remembered read would only hold.
pub(crate) fn slim(meta: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels,
        owner_references: meta.owner_references,
        ..ObjectMeta::default()
    }
}

/// The ring's shards whose Leases are held now, read when an object sits on a shard the
/// rebalance's snapshot does not count as available. A read answers for the objects seen
/// before it started: such an object was put on its shard after that shard's Lease was
/// written, so the read shows the Lease unless it is no longer held. One read at a time, shared
/// by the objects waiting for it.
#[derive(Debug, Default)]
pub(crate) struct LiveNow(tokio::sync::Mutex<Option<LeaseRead>>);

/// One read of a ring's Leases.
#[derive(Debug)]
struct LeaseRead {
    /// When the list was sent.
    started: Instant,
    /// The shards holding their Leases; `None` when the Leases could not be read.
    live: Option<BTreeSet<String>>,
}

impl LiveNow {
    /// Whether `shard`'s Lease is held, for an object seen on it at `seen`: from the last read
    /// when that read holds it or started after `seen`, otherwise from a new read. `true` when
    /// the Leases cannot be read (the object stays).
    pub(crate) async fn holds(
        &self,
        client: &Client,
        ring: &RingId,
        shard: &str,
        seen: Instant,
    ) -> bool {
        let mut last = self.0.lock().await;
        if let Some(read) = last.as_ref()
            && let Some(holds) = read.answer(shard, seen)
        {
            return holds;
        }
        let started = Instant::now();
        let leases: Api<Lease> = Api::all(client.clone());
        let live = match leases
            .list(&ListParams::default().labels(&ring.lease_selector()))
            .await
        {
            Ok(list) => Some(
                list.items
                    .iter()
                    .filter(|l| is_available(l))
                    .map(ResourceExt::name_any)
                    .collect(),
            ),
            Err(e) => {
                warn!(%ring, error = %e, "cannot read the ring's Leases; objects on shards outside the ring wait");
                None
            }
        };
        let read = last.insert(LeaseRead { started, live });
        read.answer(shard, seen).unwrap_or(true)
    }
}

impl LeaseRead {
    /// What this read says of `shard` for an object seen on it at `seen`: held when the read
    /// lists it; when it does not, or could not be made, and started after `seen`, not held
    /// or (could not be made) held; `None` (read again) when the read may predate the shard's
    /// Lease.
    fn answer(&self, shard: &str, seen: Instant) -> Option<bool> {
        match &self.live {
            Some(live) if live.contains(shard) => Some(true),
            live => (self.started >= seen).then_some(live.is_none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::core::{ApiResource, GroupVersionKind};

    use super::*;

    fn target(group: &str, version: &str, kind: &str, plural: &str, role: Role) -> Target {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        Target {
            resource: GroupResource::new(group, plural),
            role,
            api: ApiResource::from_gvk_with_plural(&gvk, plural),
            namespaced: true,
        }
    }

    fn controlled_by(api_version: &str, kind: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("object".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "owner".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn levels_of_a_chain_are_chained_only_in_a_ring_keyed_by_object() {
        let deployments = target("apps", "v1", "Deployment", "deployments", Role::Main);
        let replicasets = target("apps", "v1", "ReplicaSet", "replicasets", Role::Controlled);
        let pods = target("", "v1", "Pod", "pods", Role::Controlled);
        let targets = [deployments.clone(), replicasets.clone(), pods.clone()];
        let table = [
            (
                "a main object",
                &deployments,
                ObjectMeta::default(),
                Placement::Main,
                Placement::Main,
            ),
            (
                "a child of a main object",
                &replicasets,
                controlled_by("apps/v1", "Deployment"),
                Placement::Child,
                Placement::Child,
            ),
            (
                "a child of a controlled object",
                &pods,
                controlled_by("apps/v1", "ReplicaSet"),
                Placement::Chained,
                Placement::Child,
            ),
            (
                "a child of an object outside the ring",
                &pods,
                controlled_by("v1", "Node"),
                Placement::Child,
                Placement::Child,
            ),
            (
                "an object without a controller",
                &pods,
                ObjectMeta::default(),
                Placement::Child,
                Placement::Child,
            ),
            (
                "a malformed controller",
                &pods,
                controlled_by("a/b/c", "ReplicaSet"),
                Placement::Child,
                Placement::Child,
            ),
        ];
        for (what, target, meta, by_object, by_namespace) in table {
            assert_eq!(
                placement(Keying::Object, &targets, target, &meta),
                by_object,
                "{what}"
            );
            assert_eq!(
                placement(Keying::Namespace, &targets, target, &meta),
                by_namespace,
                "{what}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_owner_is_read_once_per_round_while_its_read_is_fresh() {
        let reads = OwnerReads::default();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let key = || {
            (
                GroupResource::new("", "configmaps"),
                Some("ns".to_owned()),
                "rs".to_owned(),
            )
        };
        let read = || async {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(Some(ObjectMeta::default()))
        };
        // Side by side: one read.
        let side_by_side =
            futures::future::join_all((0..10).map(|_| reads.read(key(), read))).await;
        assert!(side_by_side.iter().all(Result::is_ok));
        let after = |n| count.load(std::sync::atomic::Ordering::SeqCst) == n;
        assert!(after(1), "ten objects of one owner read it once");
        reads.read(key(), read).await.expect("read");
        assert!(after(1), "within the bound: not read again");
        tokio::time::advance(OWNER_READ_TTL).await;
        reads.read(key(), read).await.expect("read");
        assert!(after(2), "past the bound: read again");
        reads.new_round();
        reads.read(key(), read).await.expect("read");
        assert!(after(3), "a new round reads again");
    }

    #[test]
    fn a_lease_read_answers_for_objects_seen_before_it_or_on_shards_it_lists() {
        let seen = Instant::now();
        let before = seen - Duration::from_secs(1);
        let after = seen + Duration::from_secs(1);
        let live = Some(BTreeSet::from(["a".to_owned()]));
        let cases = [
            (
                "lists the shard, read before",
                before,
                live.clone(),
                "a",
                Some(true),
            ),
            (
                "lists the shard, read after",
                after,
                live.clone(),
                "a",
                Some(true),
            ),
            (
                "no such Lease, read after",
                after,
                live.clone(),
                "c",
                Some(false),
            ),
            (
                "no such Lease, read at the same time",
                seen,
                live.clone(),
                "c",
                Some(false),
            ),
            (
                "no such Lease, read before: read again",
                before,
                live,
                "c",
                None,
            ),
            ("could not read, after: stays", after, None, "c", Some(true)),
            (
                "could not read, before: read again",
                before,
                None,
                "c",
                None,
            ),
        ];
        for (case, started, live, shard, want) in cases {
            let read = LeaseRead { started, live };
            assert_eq!(read.answer(shard, seen), want, "{case}");
        }
    }
}
