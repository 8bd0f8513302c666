//! Which namespaces a ring's namespaced objects are sharded in: those both its
//! namespaceSelector (none: all) and the global `--namespace-selector` select, evaluated by the
//! apiserver (the same selector the ring's webhook configuration carries).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::core::Selector;
use kube::{Api, Client, ResourceExt};
use sharder_common::ClusterRingSpec;

use crate::Error;
use crate::rebalance::Namespaces;
use crate::webhook_config::ring_namespace_selector;

/// The ring's namespaces now.
pub async fn namespaces(
    client: &Client,
    spec: &ClusterRingSpec,
    global: &LabelSelector,
) -> Result<Namespaces, Error> {
    // The ring's own selector is checked first, so its error names the ring's field.
    spec.parse_namespace_selector()?;
    let selector = Selector::try_from(ring_namespace_selector(spec, global))
        .map_err(|e| Error::NamespaceSelector(e.to_string()))?;
    let listed = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().labels_from(&selector))
        .await
        .map_err(Error::Kube)?;
    let names: HashSet<String> = listed.items.iter().map(ResourceExt::name_any).collect();
    Ok(Namespaces(names))
}
