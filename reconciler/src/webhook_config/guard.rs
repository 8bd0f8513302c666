//! The label guard of each ring (`sharder_common::label_guard`), kept beside the ring's webhook
//! configuration by the same controller: applied when it is missing, when someone else changed
//! it (its generation moved) or when the desired one changed, never written again otherwise;
//! deleted when the guard is off. Whether it is on, and who the reconciler is, is settled once
//! per leadership ([`settings`]).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sharder_common::label_guard::{GuardSettings, label_guard};
use sharder_common::{RingObject, Roles};
use tracing::info;

use crate::Error;
use crate::args::LabelGuard;
use crate::controllers::FIELD_MANAGER;

/// The API group and version of ValidatingAdmissionPolicies.
const API: &str = "admissionregistration.k8s.io/v1";

/// Whether the guard is on for `mode` and, if so, who it lets do what: the reconciler is who
/// the apiserver says `client` is, the `acknowledgers` are as given, the rings' namespaces are
/// limited by `namespace_selector`. Off for [`LabelGuard::Auto`] where the apiserver does not
/// serve ValidatingAdmissionPolicies; an error for [`LabelGuard::On`] there.
pub(crate) async fn settings(
    client: &Client,
    mode: LabelGuard,
    acknowledgers: &[String],
    namespace_selector: &LabelSelector,
) -> Result<Option<GuardSettings>, Error> {
    if mode == LabelGuard::Off {
        return Ok(None);
    }
    let served = match client.list_api_group_resources(API).await {
        Ok(list) => {
            let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
            names.contains(&"validatingadmissionpolicies")
                && names.contains(&"validatingadmissionpolicybindings")
        }
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => return Err(Error::Kube(e)),
    };
    if !served {
        if mode == LabelGuard::On {
            return Err(Error::LabelGuardUnavailable);
        }
        info!(
            "the apiserver serves no ValidatingAdmissionPolicies (Kubernetes 1.30 or later): the label guard is off"
        );
        return Ok(None);
    }
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(Error::Kube)?;
    let reconciler = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .ok_or(Error::NoIdentity)?;
    info!(%reconciler, acknowledgers = ?acknowledgers, "the label guard is on");
    Ok(Some(GuardSettings {
        reconciler,
        acknowledgers: acknowledgers.to_vec(),
        namespace_selector: namespace_selector.clone(),
    }))
}

/// What was applied of one ring's guard: the desired objects and the generations the
/// apiserver gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Applied {
    desired: String,
    generations: [Option<i64>; 2],
}

/// The label guards of the rings of one kind.
#[derive(Debug, Default)]
pub(crate) struct Guards {
    /// `None`: the guard is off.
    settings: Option<GuardSettings>,
    /// What was applied, by the ring's configuration name.
    applied: Mutex<HashMap<String, Applied>>,
}

impl Guards {
    /// Guards with `settings` (`None`: off).
    pub(crate) fn new(settings: Option<GuardSettings>) -> Self {
        Self {
            settings,
            applied: Mutex::default(),
        }
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, HashMap<String, Applied>> {
        self.applied.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `ring`'s guard (its resources have `roles`) as the settings say: applied, or
    /// deleted when the guard is off.
    pub(crate) async fn keep(
        &self,
        client: &Client,
        ring: &RingObject,
        roles: &Roles,
    ) -> Result<(), Error> {
        let name = ring.id.configuration_name();
        let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
        let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
        let Some(settings) = &self.settings else {
            let owned = |labels: &std::collections::BTreeMap<String, String>| {
                labels.get(ring.id.kind.lease_label()) == Some(&ring.id.name)
            };
            let deleted =
                remove(&bindings, &name, owned).await? | remove(&policies, &name, owned).await?;
            if deleted {
                info!(ring = %ring.id, policy = %name, "label guard deleted: --label-guard is off");
            }
            return Ok(());
        };
        let (policy, binding) = label_guard(ring, roles, settings);
        let desired = serde_json::to_string(&(&policy, &binding)).unwrap_or_default();
        let existing = [
            policies
                .get_opt(&name)
                .await
                .map_err(Error::Kube)?
                .and_then(|p| p.metadata.generation),
            bindings
                .get_opt(&name)
                .await
                .map_err(Error::Kube)?
                .and_then(|b| b.metadata.generation),
        ];
        let remembered = self.applied().get(&name).cloned();
        if existing.iter().all(Option::is_some)
            && remembered.as_ref()
                == Some(&Applied {
                    desired: desired.clone(),
                    generations: existing,
                })
        {
            return Ok(());
        }
        let policy = apply(&policies, &name, &policy).await?;
        let binding = apply(&bindings, &name, &binding).await?;
        self.applied().insert(
            name.clone(),
            Applied {
                desired,
                generations: [policy.metadata.generation, binding.metadata.generation],
            },
        );
        info!(ring = %ring.id, policy = %name, "label guard applied");
        Ok(())
    }
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
    owned: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> Result<bool, Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug + kube::Resource,
{
    let Some(existing) = api.get_opt(name).await.map_err(Error::Kube)? else {
        return Ok(false);
    };
    if !owned(existing.labels()) {
        return Ok(false);
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}
