//! Reading the owner of a controlled object under admission, so the object goes where its owner
//! is held now (`sharder_common::handover`): one metadata-only GET per new controlled object.
//! The owner's resource is found through discovery (its kind to its plural), cached; the owner
//! itself is never cached.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Api, Client};
use sharder_common::OwnerState;
use sharder_common::key::group_of_api_version;

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

/// Resolved owner resources by (group, version, kind): the API resource and whether it is
/// namespaced.
type Resources = HashMap<(String, String, String), (ApiResource, bool)>;

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

    /// The API resource of `api_version`/`kind` and whether it is namespaced (discovery,
    /// cached).
    async fn resource(&self, api_version: &str, kind: &str) -> Result<(ApiResource, bool), String> {
        let group = group_of_api_version(api_version).map_err(|e| e.to_string())?;
        let version = api_version.rsplit('/').next().unwrap_or(api_version);
        let id = (group.to_owned(), version.to_owned(), kind.to_owned());
        if let Some(found) = self.lock().get(&id) {
            return Ok(found.clone());
        }
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| format!("discovery of {api_version} {kind}: {e}"))?;
        let found = (resource, caps.scope == Scope::Namespaced);
        self.lock().insert(id, found.clone());
        Ok(found)
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
                if ring.role(&resource.group, &resource.plural) != Some(sharder_common::Role::Main)
                {
                    return Ok(OwnerState::NotSharded);
                }
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
                Ok(OwnerState::of(
                    found.as_ref().map(|o| &o.metadata),
                    &ring.labels,
                ))
            };
            tokio::time::timeout(OWNER_LOOKUP_TIMEOUT, read)
                .await
                .unwrap_or_else(|_| Err(format!("reading owner {} took too long", owner.name)))
        })
    }
}
