//! A ring's admission policy and its binding kept in the cluster (the label guard's, the
//! placement policy's): applied when one is missing, when someone else changed one (its
//! generation moved) or when the desired pair changed, never written again otherwise; deleted
//! when the pair is off for the ring.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sharder_common::RingId;

use crate::Error;
use crate::controllers::FIELD_MANAGER;

/// What was applied of one pair: the desired objects and the generations the apiserver gave
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Applied {
    desired: String,
    generations: [Option<i64>; 2],
}

/// The pairs of one kind (label guards, or placement policies) of every ring, by name.
#[derive(Debug, Default)]
pub(crate) struct Pairs(Mutex<HashMap<String, Applied>>);

impl Pairs {
    fn applied(&self) -> std::sync::MutexGuard<'_, HashMap<String, Applied>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `policy` and `binding`, both named `name`, what the cluster holds; whether it
    /// wrote them.
    pub(crate) async fn keep<P, B>(
        &self,
        (policies, policy): (&Api<P>, &P),
        (bindings, binding): (&Api<B>, &B),
        name: &str,
    ) -> Result<bool, Error>
    where
        P: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
        B: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        let desired = serde_json::to_string(&(policy, binding)).unwrap_or_default();
        let existing = [
            generation(policies.get_opt(name).await.map_err(Error::Kube)?),
            generation(bindings.get_opt(name).await.map_err(Error::Kube)?),
        ];
        let remembered = self.applied().get(name).cloned();
        if existing.iter().all(Option::is_some)
            && remembered.as_ref()
                == Some(&Applied {
                    desired: desired.clone(),
                    generations: existing,
                })
        {
            return Ok(false);
        }
        let policy = apply(policies, name, policy).await?;
        let binding = apply(bindings, name, binding).await?;
        self.applied().insert(
            name.to_owned(),
            Applied {
                desired,
                generations: [generation(Some(policy)), generation(Some(binding))],
            },
        );
        Ok(true)
    }

    /// Deletes the pair named `name` where it is `ring`'s (by its ring label); whether it
    /// deleted one.
    pub(crate) async fn remove<P, B>(
        &self,
        policies: &Api<P>,
        bindings: &Api<B>,
        name: &str,
        ring: &RingId,
    ) -> Result<bool, Error>
    where
        P: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        B: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        self.applied().remove(name);
        let owned = |labels: &BTreeMap<String, String>| {
            labels.get(ring.kind.lease_label()) == Some(&ring.name)
        };
        Ok(remove(bindings, name, owned).await? | remove(policies, name, owned).await?)
    }
}

/// The API group and version of admission policies.
const API: &str = "admissionregistration.k8s.io/v1";

/// Whether the apiserver serves every one of `resources` of [`API`].
pub(crate) async fn served(client: &Client, resources: &[&str]) -> Result<bool, Error> {
    match client.list_api_group_resources(API).await {
        Ok(list) => Ok(resources
            .iter()
            .all(|wanted| list.resources.iter().any(|r| r.name == *wanted))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}

fn generation<K: Resource>(object: Option<K>) -> Option<i64> {
    object.and_then(|o| o.meta().generation)
}

/// Applies `object` as `name` (server-side, the reconciler's fields forced); what the
/// apiserver made of it.
async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<K, Error>
where
    K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(Error::Kube)
}

/// Deletes `name` of `api` if it exists and its labels say it is the ring's (`owned`); whether
/// it did.
async fn remove<K>(
    api: &Api<K>,
    name: &str,
    owned: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Result<bool, Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug + Resource,
{
    let Some(existing) = api.get_opt(name).await.map_err(Error::Kube)? else {
        return Ok(false);
    };
    if !existing.meta().labels.as_ref().is_some_and(owned) {
        return Ok(false);
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}
