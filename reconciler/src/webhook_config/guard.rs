//! The label guard of each ring (`sharder_common::label_guard`), kept beside the ring's webhook
//! configuration by the same controller ([`super::pairs`]); deleted when the guard is off.
//! Whether it is on, and who the reconciler is, is settled once per leadership ([`settings`]).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::PostParams;
use kube::{Api, Client};
use sharder_common::label_guard::{GuardSettings, label_guard};
use sharder_common::{RingObject, Roles};
use tracing::info;

use super::pairs::{Pairs, served};
use crate::Error;
use crate::args::LabelGuard;

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
    let served = served(
        client,
        &[
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ],
    )
    .await?;
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

/// The label guards of the rings of one kind.
#[derive(Debug, Default)]
pub(crate) struct Guards {
    /// `None`: the guard is off.
    settings: Option<GuardSettings>,
    /// What was applied.
    pairs: Pairs,
}

impl Guards {
    /// Guards with `settings` (`None`: off).
    pub(crate) fn new(settings: Option<GuardSettings>) -> Self {
        Self {
            settings,
            pairs: Pairs::default(),
        }
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
            if self
                .pairs
                .remove(&policies, &bindings, &name, &ring.id)
                .await?
            {
                info!(ring = %ring.id, policy = %name, "label guard deleted: --label-guard is off");
            }
            return Ok(());
        };
        let (policy, binding) = label_guard(ring, roles, settings);
        if self
            .pairs
            .keep((&policies, &policy), (&bindings, &binding), &name)
            .await?
        {
            info!(ring = %ring.id, policy = %name, "label guard applied");
        }
        Ok(())
    }
}
