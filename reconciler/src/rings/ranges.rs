//! Range mode (docs/design.md §8): the apiserver's sharded list and watch divides the ring's
//! objects by hash ([`sharder_common::ranges`]). The reconciler writes each shard's ranges on
//! its Lease and gives a range to a shard only once no other shard is assigned it or serves it
//! ([`grants`]); it lists and writes no sharded object.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sharder_common::ranges::{
    ASSIGNED_ANNOTATION, EPOCH_ANNOTATION, RANGE_TOKENS_PER_SHARD, RangeKey, ShardRanges,
    ShardSelector, assign_namespaces, assign_uids, epoch, grants, thousandths,
};
use sharder_common::{Ring, RingObject, Roles, is_available};
use sharder_runtime::sharded::applies_selectors;
use tracing::{info, warn};

use super::{discovery, namespaces};
use crate::Error;

/// Where a range-mode ring stands after a reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RangeState {
    /// Ranges are handed out; `waiting` available shards lack some of theirs (another shard
    /// still holds them, or a write conflicted), `conflicts` writes lost a race.
    Assigned {
        /// Available shards short of their share.
        waiting: usize,
        /// Lease writes that conflicted (tried again soon).
        conflicts: usize,
        /// Each available shard's share of the hash space as granted now, in thousandths.
        shares: BTreeMap<String, u32>,
    },
    /// The apiserver does not apply `shardSelector` to this resource (the gate is off): no
    /// range is handed out and those handed out are taken back.
    Unserved(String),
}

impl RangeState {
    /// Whether the ring needs another look soon (handovers or conflicts pending).
    pub(crate) fn pending(&self) -> bool {
        matches!(self, Self::Assigned { waiting, conflicts, .. } if waiting + conflicts > 0)
    }
}

/// Assigns `ring`'s ranges of `key` to its available shards: probes that the apiserver applies
/// selectors to each of the ring's resources, reads the ring's Leases (a fresh list: the
/// handover rule needs what each shard wrote last) and writes each changed assignment, with the
/// Lease's resourceVersion and epoch.
pub(crate) async fn reconcile(
    client: &Client,
    ring: &RingObject,
    roles: &Roles,
    key: RangeKey,
    namespace_selector: &LabelSelector,
) -> Result<RangeState, Error> {
    let mut unserved = None;
    for target in discovery::targets(client, roles)
        .await
        .map_err(Error::Kube)?
    {
        if !applies_selectors(client, &target.api)
            .await
            .map_err(Error::Kube)?
        {
            unserved = Some(target.resource.to_string());
            break;
        }
    }
    let leases = Api::<Lease>::all(client.clone())
        .list(&ListParams::default().labels(&ring.id.lease_selector()))
        .await
        .map_err(Error::Kube)?
        .items;
    let available: BTreeSet<String> = leases
        .iter()
        .filter(|l| is_available(l))
        .map(ResourceExt::name_any)
        .collect();
    let hashed = Ring::with_tokens(available.iter().cloned(), RANGE_TOKENS_PER_SHARD);
    let desired = match (&unserved, key) {
        (Some(_), _) => BTreeMap::new(),
        (None, RangeKey::Uid) => assign_uids(&hashed),
        (None, RangeKey::Namespace) => {
            let selected = namespaces::namespaces(client, &ring.object.spec, namespace_selector)
                .await?
                .selected;
            assign_namespaces(&hashed, selected.iter().map(String::as_str))
        }
    };
    let mut read = BTreeMap::new();
    for lease in &leases {
        let (ranges, error) = ShardRanges::of(lease);
        if let Some(e) = error {
            warn!(shard = %lease.name_any(), error = %e, "the Lease's served ranges do not parse: counted as serving everything");
        }
        read.insert(lease.name_any(), ranges);
    }
    let granted = grants(&desired, &read);
    let api = |namespace: &str| Api::<Lease>::namespaced(client.clone(), namespace);
    let mut conflicts = 0;
    for lease in leases.iter().filter(|l| is_available(l)) {
        let shard = lease.name_any();
        let (Some(next), Some(now)) = (granted.get(&shard), read.get(&shard)) else {
            continue;
        };
        if *next == now.assigned {
            continue;
        }
        let selector = ShardSelector::new(key, next.iter().copied()).to_string();
        let patch = json!({"metadata": {
            "resourceVersion": lease.resource_version(),
            "annotations": {ASSIGNED_ANNOTATION: selector, EPOCH_ANNOTATION: epoch(lease).to_string()},
        }});
        let namespace = lease.namespace().unwrap_or_default();
        match api(&namespace)
            .patch(&shard, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let share = f64::from(thousandths(next)) / 1e3;
                info!(%shard, key = %key, ranges = next.len(), share = format!("{share:.3}"), "ranges assigned");
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => conflicts += 1,
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    if let Some(resource) = unserved {
        return Ok(RangeState::Unserved(resource));
    }
    let none = Vec::new();
    let waiting = available
        .iter()
        .filter(|s| granted.get(*s).unwrap_or(&none) != desired.get(*s).unwrap_or(&none))
        .count();
    let shares = available
        .iter()
        .map(|s| (s.clone(), thousandths(granted.get(s).unwrap_or(&none))))
        .collect();
    Ok(RangeState::Assigned {
        waiting,
        conflicts,
        shares,
    })
}

/// Takes back every range assigned on `leases` (their ring is not in range mode): a shard that
/// still serves ranges stops, and serves nothing by them until its ring is in range mode again.
pub(crate) async fn revoke(client: &Client, leases: &[Arc<Lease>]) -> Result<(), Error> {
    for lease in leases {
        let assigned = lease
            .annotations()
            .get(ASSIGNED_ANNOTATION)
            .is_some_and(|a| !a.is_empty());
        if !assigned {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {ASSIGNED_ANNOTATION: ""}}});
        let namespace = lease.namespace().unwrap_or_default();
        match Api::<Lease>::namespaced(client.clone(), &namespace)
            .patch(
                &lease.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                info!(shard = %lease.name_any(), "ranges taken back: the ring is not in range mode")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(())
}
