//! Resolves a ring's resources to API resources through discovery (kind, version, scope), so
//! that objects can be listed and patched without compiled-in types.

use std::collections::HashMap;

use kube::Client;
use kube::discovery::{ApiGroup, Scope as DiscoveryScope};
use sharder_common::Roles;
use tracing::warn;

use crate::terms::Target;

/// The ring's resources as the apiserver serves them. Resources (or groups) it does not serve
/// are skipped with a warning: they may be installed later, and the next sweep picks them up
/// (discovery runs at every rebalance). A discovery request that fails (the apiserver away or
/// refusing) is an error, so the rebalance is tried again with the same work: read as "nothing
/// served", it would count a rebalance that listed nothing as done.
pub(crate) async fn targets(client: &Client, roles: &Roles) -> Result<Vec<Target>, kube::Error> {
    let mut groups: HashMap<String, Option<ApiGroup>> = HashMap::new();
    let mut targets = Vec::new();
    for (resource, role) in roles.iter() {
        if !groups.contains_key(&resource.group) {
            let group = match kube::discovery::group(client, &resource.group).await {
                Ok(group) => Some(group),
                Err(kube::Error::Discovery(e)) => {
                    warn!(group = %resource.group, error = %e, "API group not served");
                    None
                }
                Err(e) => return Err(e),
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
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};
    use sharder_common::{ClusterRingSpec, Role};

    use super::*;

    /// Roles of a ring of Secrets controlling ConfigMaps, plus `extra` main resources.
    fn roles(extra: Value) -> Roles {
        let mut resources = vec![json!({
            "resource": "secrets",
            "controlledResources": [{"resource": "configmaps"}],
        })];
        resources.extend(extra.as_array().cloned().unwrap_or_default());
        let spec: ClusterRingSpec =
            serde_json::from_value(json!({ "resources": resources })).expect("a spec");
        spec.roles().expect("valid roles")
    }

    fn ok(body: Value) -> Response<Body> {
        Response::new(Body::from(serde_json::to_vec(&body).expect("json")))
    }

    /// An apiserver answering every request with [`core`] until the client is dropped; its
    /// task returns the paths asked for.
    fn apiserver() -> (Client, tokio::task::JoinHandle<Vec<String>>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let served = tokio::spawn(async move {
            let mut paths = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                respond.send_response(core(&path));
                paths.push(path);
            }
            paths
        });
        (Client::new(service, "default"), served)
    }

    /// Discovery of an apiserver serving Secrets and ConfigMaps and no API group but the core.
    fn core(path: &str) -> Response<Body> {
        match path {
            "/api" => ok(json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": []})),
            "/api/v1" => ok(json!({"kind": "APIResourceList", "groupVersion": "v1",
            "resources": [
                {"name": "secrets", "singularName": "", "namespaced": true, "kind": "Secret",
                 "verbs": ["get", "list", "patch"]},
                {"name": "configmaps", "singularName": "", "namespaced": true,
                 "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
            ]})),
            "/apis" => ok(json!({"kind": "APIGroupList", "groups": []})),
            other => panic!("unexpected request {other}"),
        }
    }

    #[tokio::test]
    async fn served_resources_become_targets_and_a_group_not_served_is_left_out() {
        let (client, served) = apiserver();
        let roles = roles(json!([{"group": "example.com", "resource": "widgets"}]));
        let targets = targets(&client, &roles).await.expect("discovery");
        drop(client);
        let found: Vec<_> = targets
            .iter()
            .map(|t| {
                (
                    t.resource.to_string(),
                    t.role,
                    t.api.kind.as_str(),
                    t.namespaced,
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                ("secrets".to_owned(), Role::Main, "Secret", true),
                ("configmaps".to_owned(), Role::Controlled, "ConfigMap", true),
            ]
        );
        assert_eq!(
            served.await.expect("apiserver"),
            ["/api", "/api/v1", "/apis"]
        );
    }

    #[tokio::test]
    async fn a_discovery_that_cannot_reach_the_apiserver_fails_instead_of_finding_nothing() {
        // As while the apiserver restarts: every request fails. A ring whose resources could
        // not be discovered has not been rebalanced.
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        drop(handle);
        let client = Client::new(service, "default");
        let failed = targets(&client, &roles(json!([]))).await;
        assert!(failed.is_err(), "{:?}", failed.map(|t| t.len()));
    }
}
