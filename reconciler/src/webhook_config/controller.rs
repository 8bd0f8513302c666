//! The webhook configuration controller: keeps every ring's MutatingWebhookConfiguration as
//! [`webhook_configuration`] says. It reconciles a ring when the ring changes, when a
//! configuration changes or goes (by its ring label, or its owner reference when the label was
//! removed), when the CA bundle changes, and every resync interval; it reads the configuration
//! and writes (server-side apply) only when [`drift`] finds a difference, so an unchanged
//! configuration is never written again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use sharder_common::ClusterRing;
use sharder_common::labels::RING_LABEL;
use tokio::sync::watch;
use tracing::{info, warn};

use super::drift::drift;
use crate::Error;
use crate::metrics::{ConfigurationWriteLabels, Metrics};
use crate::rings::FIELD_MANAGER;
use sharder_common::webhook_configuration::{WebhookSettings, webhook_configuration};

/// When to retry after a failed reconcile.
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(2);

/// Context of the webhook configuration controller.
pub(crate) struct Context {
    /// Client for the configurations.
    pub client: Client,
    /// Everything but the CA bundle (see `ca`).
    pub settings: WebhookSettings,
    /// The current CA bundle.
    pub ca: watch::Receiver<Vec<u8>>,
    /// When each ring's configuration is compared again without a trigger.
    pub resync: Duration,
    /// Metrics.
    pub metrics: Metrics,
}

/// The ring a configuration belongs to: its ring label, else its ClusterRing owner reference.
pub(crate) fn ring_of(mwc: &MutatingWebhookConfiguration) -> Option<ObjectRef<ClusterRing>> {
    if let Some(ring) = mwc.labels().get(RING_LABEL) {
        return Some(ObjectRef::new(ring));
    }
    let kind = ClusterRing::kind(&());
    let api_version = ClusterRing::api_version(&());
    mwc.owner_references()
        .iter()
        .find(|o| o.kind == kind && o.api_version == api_version)
        .map(|o| ObjectRef::new(&o.name))
}

/// Reconciles one object (for `crate::run_controller`).
pub(crate) async fn reconcile(ring: Arc<ClusterRing>, ctx: Arc<Context>) -> Result<Action, Error> {
    if ring.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // An invalid ring gets no configuration; the ring controller reports it in its status.
    let Ok(roles) = ring.spec.roles() else {
        return Ok(Action::await_change());
    };
    let settings = WebhookSettings {
        ca_bundle: ctx.ca.borrow().clone(),
        ..ctx.settings.clone()
    };
    let desired = webhook_configuration(&ring, &roles, &settings);
    let name = desired.metadata.name.clone().unwrap_or_default();
    let api = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone());
    let existing = api.get_opt(&name).await.map_err(Error::Kube)?;
    if let Some(drift) = drift(existing.as_ref(), &desired) {
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(Error::Kube)?;
        ctx.metrics
            .webhook_configuration_writes
            .get_or_create(&ConfigurationWriteLabels {
                clusterring: ring.name_any(),
                reason: drift.reason().to_owned(),
            })
            .inc();
        info!(
            clusterring = %ring.name_any(),
            webhook_configuration = %name,
            reason = drift.reason(),
            fields = %drift,
            "webhook configuration applied"
        );
    }
    Ok(Action::requeue(ctx.resync))
}

/// What to do after a failed reconcile (for `crate::run_controller`).
pub(crate) fn error_policy(ring: Arc<ClusterRing>, error: &Error, _: Arc<Context>) -> Action {
    warn!(clusterring = %ring.name_any(), error = %error, "webhook configuration reconcile failed, retrying");
    Action::requeue(ERROR_REQUEUE)
}

/// The controller over the ClusterRings matching `selector` (empty: all), triggered by the
/// webhook configurations and by every change of `ca`.
pub(crate) fn controller(
    client: Client,
    selector: &str,
    ca: watch::Receiver<Vec<u8>>,
) -> (Controller<ClusterRing>, sharder_runtime::controller::Listed) {
    // All configurations are watched (they are few), so one whose ring label was removed is
    // still seen.
    let ca_changes = futures::stream::unfold(ca, |mut ca| async move {
        ca.changed().await.ok().map(|()| ((), ca))
    });
    let (controller, listed) = crate::ring_controller(client.clone(), selector);
    let controller = controller
        .watches(
            Api::<MutatingWebhookConfiguration>::all(client),
            watcher::Config::default(),
            |mwc| ring_of(&mwc),
        )
        .reconcile_all_on(ca_changes);
    (controller, listed)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    use super::*;

    fn mwc(labels: &[(&str, &str)], owner: Option<(&str, &str)>) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some("sharder-x".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                owner_references: owner.map(|(kind, name)| {
                    vec![OwnerReference {
                        api_version: ClusterRing::api_version(&()).into_owned(),
                        kind: kind.into(),
                        name: name.into(),
                        uid: "uid".into(),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            webhooks: None,
        }
    }

    #[test]
    fn a_configuration_maps_to_its_ring_by_label_then_by_owner() {
        let ring = |name: &str| Some(ObjectRef::<ClusterRing>::new(name));
        let cases = [
            (mwc(&[(RING_LABEL, "a")], None), ring("a")),
            (
                mwc(&[(RING_LABEL, "a")], Some(("ClusterRing", "b"))),
                ring("a"),
            ),
            (mwc(&[], Some(("ClusterRing", "b"))), ring("b")),
            (mwc(&[("other", "a")], Some(("Deployment", "b"))), None),
            (mwc(&[], None), None),
        ];
        for (i, (config, expected)) in cases.into_iter().enumerate() {
            assert_eq!(ring_of(&config), expected, "case {i}");
        }
    }
}
