//! Which namespaces a ring's namespaced objects are sharded in: those both its
//! namespaceSelector (none: all) and the global `--namespace-selector` select (the same selector
//! the ring's webhook configuration carries), and how its objects are listed
//! ([`Namespaces::new`]: namespace by namespace when it selects at most half of the cluster's).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt as _};
use kube::{Api, Client, ResourceExt};
use sharder_common::ClusterRingSpec;

use crate::Error;
use crate::terms::Namespaces;
use sharder_common::webhook_configuration::ring_namespace_selector;

/// Namespaces per list page.
const PAGE: u32 = 500;

/// The ring's namespaces now: every namespace is listed (metadata only, page by page) and
/// matched against the ring's selector with the apiserver's semantics (kube's `Selector`).
pub(crate) async fn namespaces(
    client: &Client,
    spec: &ClusterRingSpec,
    global: &LabelSelector,
) -> Result<Namespaces, Error> {
    // The ring's own selector is checked first, so its error names the ring's field.
    spec.parse_namespace_selector()?;
    let selector = Selector::try_from(ring_namespace_selector(spec, global))
        .map_err(|e| Error::NamespaceSelector(e.to_string()))?;
    let api = Api::<Namespace>::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    let mut selected = BTreeSet::new();
    let mut total = 0;
    loop {
        let page = api.list_metadata(&params).await.map_err(Error::Kube)?;
        total += page.items.len();
        selected.extend(
            page.items
                .iter()
                .filter(|ns| selector.matches(ns.labels()))
                .map(ResourceExt::name_any),
        );
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(Namespaces::new(selected, total)),
        }
    }
}
