//! Resolves a ring's resources to API resources through discovery (kind, version, scope), so
//! that objects can be listed and patched without compiled-in types.

use std::collections::HashMap;

use kube::Client;
use kube::discovery::{ApiGroup, Scope as DiscoveryScope};
use sharder_common::Roles;
use tracing::warn;

use crate::rebalance::Target;

/// The ring's resources as the apiserver serves them. Resources (or groups) it does not serve
/// are skipped with a warning: they may be installed later, and the next sweep picks them up
/// (discovery runs at every rebalance).
pub(crate) async fn targets(client: &Client, roles: &Roles) -> Vec<Target> {
    let mut groups: HashMap<String, Option<ApiGroup>> = HashMap::new();
    let mut targets = Vec::new();
    for (resource, role) in roles.iter() {
        if !groups.contains_key(&resource.group) {
            let group = match kube::discovery::group(client, &resource.group).await {
                Ok(group) => Some(group),
                Err(e) => {
                    warn!(group = %resource.group, error = %e, "API group not found");
                    None
                }
            };
            groups.insert(resource.group.clone(), group);
        }
        let Some(Some(group)) = groups.get(&resource.group) else {
            continue;
        };
        match group
            .recommended_resources()
            .into_iter()
            .find(|(ar, _)| ar.plural == resource.resource)
        {
            Some((api, caps)) => targets.push(Target {
                namespaced: caps.scope == DiscoveryScope::Namespaced,
                resource: resource.clone(),
                role,
                api,
            }),
            None => warn!(resource = %resource, "resource not served by the apiserver"),
        }
    }
    targets
}
