//! Which namespaces a ring's namespaced objects are sharded in: those its namespaceSelector
//! selects (evaluated by the apiserver), or every namespace but the excluded ones.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use sharder_common::ClusterRingSpec;

use crate::Error;
use crate::rebalance::Namespaces;

/// The ring's namespaces now.
pub async fn namespaces(
    client: &Client,
    spec: &ClusterRingSpec,
    excluded: &[String],
) -> Result<Namespaces, Error> {
    let selector = spec.parse_namespace_selector()?;
    let params = match &selector {
        Some(selector) => ListParams::default().labels_from(selector),
        None => ListParams::default(),
    };
    let listed = Api::<Namespace>::all(client.clone())
        .list_metadata(&params)
        .await
        .map_err(Error::Kube)?;
    let names: HashSet<String> = listed
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|name| selector.is_some() || !excluded.contains(name))
        .collect();
    Ok(Namespaces(names))
}
