//! One ring as a pass sees it ([`RingView`]): its shards, labels and namespaces, whether it is
//! still there, and the decision for one object on it ([`plan::decide`]).

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, ResourceExt};
use sharder_common::handover::OwnerState;
use sharder_common::key::group_of_api_version;
use sharder_common::{Keying, Ring, RingId, RingLabels, Role, is_available};
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

/// The ring's shards whose Leases are held now: one list of the ring's Leases, the first time
/// an object sits on a shard the rebalance's snapshot does not count as available.
#[derive(Debug, Default)]
pub(crate) struct LiveNow(tokio::sync::OnceCell<Option<BTreeSet<String>>>);

impl LiveNow {
    /// Whether `shard`'s Lease is held now; `true` when the Leases cannot be read (it stays).
    pub(crate) async fn holds(&self, client: &Client, ring: &RingId, shard: &str) -> bool {
        let live = self
            .0
            .get_or_init(|| async {
                let leases: Api<Lease> = Api::all(client.clone());
                let selector = ring.lease_selector();
                match leases.list(&ListParams::default().labels(&selector)).await {
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
                }
            })
            .await;
        live.as_ref().is_none_or(|live| live.contains(shard))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::core::{ApiResource, GroupVersionKind};
    use sharder_common::GroupResource;

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
}
