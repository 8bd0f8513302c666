//! The placement table of a ring keyed by namespace (`sharder_common::placement_policy`): the
//! ConfigMap its placement policy reads, kept by the ring controller, which knows the ring's
//! shards and its moves. Before a pass, the namespaces whose objects are about to move leave it
//! and those of a dead shard name their new shard; once the ring is settled, every namespace of
//! the ring has its shard ([`next_entries`]). Written only when it changes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use sharder_common::placement_policy::{Table, next_entries, table_object};
use sharder_common::{Ring, RingObject};
use tracing::info;

use crate::Error;
use crate::controllers::FIELD_MANAGER;

/// Brings `ring`'s table in `namespace` in step with its `available` shards: with the ring's
/// `namespaces` once it is settled (`Progress::settled`), else (`None`) only what the pass about
/// to run needs.
pub(crate) async fn keep(
    client: &Client,
    ring: &RingObject,
    namespace: &str,
    available: &BTreeSet<String>,
    namespaces: Option<&BTreeSet<String>>,
) -> Result<(), Error> {
    let table = Table::of(ring, namespace);
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let existing = api.get_opt(&table.name).await.map_err(Error::Kube)?;
    let current = existing
        .as_ref()
        .and_then(|t| t.data.clone())
        .unwrap_or_default();
    let next = next_entries(
        &current,
        &Ring::new(available.iter().cloned()),
        available,
        namespaces.unwrap_or(&BTreeSet::new()),
        namespaces.is_some(),
    );
    if existing.is_some() && next == current {
        return Ok(());
    }
    let (left, entered) = (changed(&current, &next), changed(&next, &current));
    api.patch(
        &table.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(table_object(ring, &table, next)),
    )
    .await
    .map_err(Error::Kube)?;
    info!(ring = %ring.id, table = %table.name, left = ?left, entered = ?entered, "placement table updated");
    Ok(())
}

/// The namespaces whose entry in `from` is not the same in `to`.
fn changed(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> Vec<String> {
    from.iter()
        .filter(|(ns, shard)| to.get(*ns) != Some(*shard))
        .map(|(ns, _)| ns.clone())
        .collect()
}
