//! Reading the owner of a controlled object under admission, so the object goes where its owner
//! is held now (`sharder_common::handover`): one metadata-only GET per new controlled object,
//! whether the owner is a main object or a level of a chain.
//! The owner's resource is found through discovery (its kind to its plural), once per kind, in a
//! task of its own: the first children after a start all wait on one discovery instead of each
//! sending its own, and one slower than the owner read's bound still ends and serves the children
//! after it (tied to its caller, it would start over with each). The owner itself is never
//! cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Api, Client};
use sharder_common::key::group_of_api_version;
use sharder_common::{OwnerState, Role};
use tokio::sync::OnceCell;

use crate::admission::{OwnerRef, RingSnapshot};

/// The longest an owner read may take before the object is left to the reconciler's sweep.
pub const OWNER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the webhook learns an owner's state.
pub trait Owners: Send + Sync + 'static {
    /// The state of `owner` in `ring`, or why it cannot be known.
    fn state<'a>(
        &'a self,
        ring: &'a RingSnapshot,
        owner: &'a OwnerRef,
    ) -> BoxFuture<'a, Result<OwnerState, String>>;
}

/// Owner resources by (group, version, kind): the API resource and whether it is namespaced,
/// once discovered (a failed discovery leaves the cell empty for the next caller).
type Resources = HashMap<(String, String, String), Arc<OnceCell<(ApiResource, bool)>>>;

/// Owners read from the apiserver.
pub struct ApiOwners {
    client: Client,
    resources: Mutex<Resources>,
}

impl ApiOwners {
    /// Owners read with `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            resources: Mutex::new(HashMap::new()),
        }
    }

    /// The API resource of `api_version`/`kind` and whether it is namespaced (discovery, once
    /// per kind, in a task that outlives a caller who stops waiting; concurrent callers wait on
    /// the one in flight).
    async fn resource(&self, api_version: &str, kind: &str) -> Result<(ApiResource, bool), String> {
        let group = group_of_api_version(api_version).map_err(|e| e.to_string())?;
        let version = api_version.rsplit('/').next().unwrap_or(api_version);
        let id = (group.to_owned(), version.to_owned(), kind.to_owned());
        let cell = Arc::clone(self.lock().entry(id).or_default());
        if let Some(found) = cell.get() {
            return Ok(found.clone());
        }
        let client = self.client.clone();
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let discovery = tokio::spawn(async move {
            cell.get_or_try_init(|| async {
                let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((resource, caps.scope == Scope::Namespaced))
            })
            .await
            .cloned()
        });
        let found = discovery.await.unwrap_or_else(|e| Err(e.to_string()));
        found.map_err(|e| format!("discovery of {api_version} {kind}: {e}"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Resources> {
        self.resources.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Owners for ApiOwners {
    fn state<'a>(
        &'a self,
        ring: &'a RingSnapshot,
        owner: &'a OwnerRef,
    ) -> BoxFuture<'a, Result<OwnerState, String>> {
        Box::pin(async move {
            let read = async {
                let (resource, namespaced) = self.resource(&owner.api_version, &owner.kind).await?;
                let Some(role) = ring.role(&resource.group, &resource.plural) else {
                    return Ok(OwnerState::NotSharded);
                };
                let api = match (&owner.namespace, namespaced) {
                    (Some(ns), true) => {
                        Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
                    }
                    _ => Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                };
                let found = api
                    .get_metadata_opt(&owner.name)
                    .await
                    .map_err(|e| format!("reading owner {} {}: {e}", owner.kind, owner.name))?;
                let state = OwnerState::of(found.as_ref().map(|o| &o.metadata), &ring.labels);
                Ok(match role {
                    Role::Main => state,
                    // A level of a chain: its holder now, if that shard is on the ring.
                    Role::Controlled => state.as_chain_level(true, |s| ring.ring.contains(s)),
                })
            };
            tokio::time::timeout(OWNER_LOOKUP_TIMEOUT, read)
                .await
                .unwrap_or_else(|_| Err(format!("reading owner {} took too long", owner.name)))
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{Request, Response};
    use kube::client::Body;
    use sharder_common::RingId;
    use tokio::task::JoinHandle;

    use super::*;

    /// A ring over Secrets with shard `shard-1`, owner Secret `ns/owner`, and owners read from a
    /// mock apiserver that answers discovery after `delay` and the owner's GET with `owner`
    /// (an object's metadata, or a Status whose `code` is the answer's); it returns how many
    /// discoveries it answered once the owners are dropped.
    fn setup(
        delay: Duration,
        owner: impl Fn(&RingSnapshot) -> serde_json::Value + Send + 'static,
    ) -> (ApiOwners, RingSnapshot, OwnerRef, JoinHandle<usize>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let spec = sharder_harness::fixtures::secrets_ring("ring", None).spec;
        let ring = RingSnapshot::new(&RingId::cluster_ring("ring"), &spec, ["shard-1"]);
        let answer = owner(&ring);
        let apiserver = tokio::spawn(async move {
            let mut discoveries = 0;
            while let Some((request, respond)) = handle.next_request().await {
                let body = match request.uri().path() {
                    "/api/v1" => {
                        discoveries += 1;
                        tokio::time::sleep(delay).await;
                        serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": "v1", "resources": [{"name": "secrets",
                            "singularName": "secret", "namespaced": true, "kind": "Secret",
                            "verbs": ["get"]}]})
                    }
                    "/api/v1/namespaces/ns/secrets/owner" => answer.clone(),
                    other => panic!("unexpected request {other}"),
                };
                let status = body["code"].as_u64().unwrap_or(200) as u16;
                let body = Body::from(serde_json::to_vec(&body).expect("json"));
                let response = Response::builder().status(status).body(body);
                respond.send_response(response.expect("response"));
            }
            discoveries
        });
        let owner = OwnerRef {
            api_version: "v1".into(),
            kind: "Secret".into(),
            namespace: Some("ns".into()),
            name: "owner".into(),
        };
        let owners = ApiOwners::new(Client::new(service, "default"));
        (owners, ring, owner, apiserver)
    }

    #[tokio::test]
    async fn the_first_children_after_a_start_wait_on_one_discovery_of_their_owners_kind() {
        let (owners, ring, owner, apiserver) = setup(Duration::ZERO, |ring| {
            serde_json::json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": "owner", "namespace": "ns",
                    "labels": {ring.labels.shard.as_str(): "shard-1"}}})
        });
        // Eight reads at once: each sends its requests before the apiserver answers any.
        let states = futures::future::join_all((0..8).map(|_| owners.state(&ring, &owner))).await;
        assert!(
            states
                .iter()
                .all(|s| s == &Ok(OwnerState::Settled("shard-1".into()))),
            "{states:?}"
        );
        drop(owners);
        assert_eq!(apiserver.await.expect("apiserver"), 1, "discoveries");
    }

    #[tokio::test(start_paused = true)]
    async fn a_discovery_slower_than_the_owner_reads_bound_still_serves_the_reads_after_it() {
        // A busy apiserver: discovery is answered after the first read's bound.
        let (owners, ring, owner, apiserver) =
            setup(OWNER_LOOKUP_TIMEOUT + Duration::from_secs(1), |_| {
                serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "NotFound", "code": 404})
            });
        let first = owners.state(&ring, &owner).await;
        assert!(first.is_err(), "{first:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(owners.state(&ring, &owner).await, Ok(OwnerState::Missing));
        drop(owners);
        assert_eq!(apiserver.await.expect("apiserver"), 1, "discoveries");
    }
}
