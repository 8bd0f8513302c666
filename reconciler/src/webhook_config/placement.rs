//! The placement policy of each ring keyed by namespace (`sharder_common::placement_policy`),
//! kept beside the ring's webhook configuration by the same controller ([`super::pairs`]) where
//! the apiserver serves MutatingAdmissionPolicies and `--placement-policy` is not off, and
//! deleted for every other ring. Its table is the ring controller's to keep
//! (`crate::rings::table`), in the namespace [`Setting::On`] names.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use kube::{Api, Client};
use sharder_common::placement_policy::{
    Table, binding_resource, placement_policy, policy_resource,
};
use sharder_common::{Keying, RingObject, Roles};
use tracing::info;

use super::pairs::{Pairs, served};
use crate::Error;
use crate::args::PlacementPolicy;

/// Whether namespace rings get a placement policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Setting {
    /// The apiserver does not serve MutatingAdmissionPolicies: nothing to keep or delete.
    #[default]
    Unserved,
    /// `--placement-policy off`: the policies of an earlier run are deleted.
    Off,
    /// On, the tables in this namespace (the reconciler's).
    On(String),
}

impl Setting {
    /// Where the tables live, when on.
    pub(crate) fn table_namespace(&self) -> Option<&str> {
        match self {
            Self::On(namespace) => Some(namespace),
            _ => None,
        }
    }
}

/// The setting for `mode` with the tables in `namespace`, as the apiserver serves the API.
pub(crate) async fn setting(
    client: &Client,
    mode: PlacementPolicy,
    namespace: &str,
) -> Result<Setting, Error> {
    let resources = [policy_resource().plural, binding_resource().plural];
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    if !served(client, &names).await? {
        info!(
            "the apiserver serves no MutatingAdmissionPolicies (Kubernetes 1.36 or later): the webhook alone assigns rings keyed by namespace"
        );
        return Ok(Setting::Unserved);
    }
    if mode == PlacementPolicy::Off {
        return Ok(Setting::Off);
    }
    info!(%namespace, "rings keyed by namespace get a placement policy in front of the webhook");
    Ok(Setting::On(namespace.to_owned()))
}

/// The placement policies of the rings of one kind.
#[derive(Debug, Default)]
pub(crate) struct Placements {
    /// Whether they are on.
    setting: Setting,
    /// What was applied.
    pairs: Pairs,
}

impl Placements {
    /// Placements as `setting` says.
    pub(crate) fn new(setting: Setting) -> Self {
        Self {
            setting,
            pairs: Pairs::default(),
        }
    }

    /// Makes `ring`'s placement policy (its resources have `roles`, it hashes as `keying`)
    /// what the setting says: applied for a ring keyed by namespace, deleted otherwise.
    pub(crate) async fn keep(
        &self,
        client: &Client,
        ring: &RingObject,
        roles: &Roles,
        keying: Keying,
        namespace_selector: &LabelSelector,
    ) -> Result<(), Error> {
        let table = self
            .setting
            .table_namespace()
            .filter(|_| keying == Keying::Namespace)
            .map(|namespace| Table::of(ring, namespace));
        let Some(table) = table else {
            return self.remove(client, ring).await;
        };
        let name = ring.id.configuration_name();
        let (policies, bindings) = apis(client);
        let (policy, binding) = placement_policy(ring, roles, &table, namespace_selector);
        if self
            .pairs
            .keep((&policies, &policy), (&bindings, &binding), &name)
            .await?
        {
            info!(ring = %ring.id, policy = %name, table = %table.name, "placement policy applied");
        }
        Ok(())
    }

    /// Deletes `ring`'s placement policy, if it has one (an invalid ring, a ring in range mode
    /// or not keyed by namespace, `--placement-policy off`).
    pub(crate) async fn remove(&self, client: &Client, ring: &RingObject) -> Result<(), Error> {
        if self.setting == Setting::Unserved {
            return Ok(());
        }
        let name = ring.id.configuration_name();
        let (policies, bindings) = apis(client);
        if self
            .pairs
            .remove(&policies, &bindings, &name, &ring.id)
            .await?
        {
            info!(ring = %ring.id, policy = %name, "placement policy deleted");
        }
        Ok(())
    }
}

/// The APIs of the policies and their bindings.
fn apis(client: &Client) -> (Api<DynamicObject>, Api<DynamicObject>) {
    (
        Api::all_with(client.clone(), &policy_resource()),
        Api::all_with(client.clone(), &binding_resource()),
    )
}
