//! The webhook configuration controller: keeps every ring's MutatingWebhookConfiguration as
//! [`webhook_configuration`] says. It reconciles a ring when the ring changes, when a
//! configuration changes or goes (by its ring label, or its owner reference when the label was
//! removed), when the CA bundle changes, and every resync interval; it reads the configuration
//! and writes (server-side apply) only when [`drift`] finds a difference, so an unchanged
//! configuration is never written again; the ring's label guard is kept beside it
//! ([`super::guard`]). A configuration the reference sharder applied is taken
//! over whole: its fields are released first ([`previous_managers`]); one it named otherwise
//! (v0.8's ClusterRing configuration) is deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use sharder_common::placement_policy::{binding_resource, policy_resource};
use sharder_common::ring_kind::{API_GROUP, API_VERSION};
use sharder_common::{RingId, RingKind, RingObject};
use sharder_runtime::metrics::RingLabel;
use tokio::sync::watch;
use tracing::{info, warn};

use super::drift::{drift, previous_managers};
use super::guard::Guards;
use super::placement::Placements;
use crate::Error;
use crate::controllers::FIELD_MANAGER;
use crate::metrics::{Metrics, ReasonLabels};
use sharder_common::webhook_configuration::{WebhookSettings, webhook_configuration};

/// When to retry after a failed reconcile.
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(2);

/// Context of the webhook configuration controller of one ring kind.
pub(crate) struct Context {
    /// The kind of the rings.
    pub kind: RingKind,
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
    /// The rings' label guards.
    pub guards: Guards,
    /// The placement policies of rings keyed by namespace.
    pub placements: Placements,
}

/// The ring of `kind` a configuration belongs to: its ring label of that kind, else its owner
/// reference to a ring of that kind.
pub(crate) fn ring_of(kind: RingKind, mwc: &MutatingWebhookConfiguration) -> Option<RingId> {
    if let Some(ring) = mwc.labels().get(kind.lease_label()) {
        return Some(RingId::new(kind, ring.as_str()));
    }
    let api_version = format!("{API_GROUP}/{API_VERSION}");
    mwc.owner_references()
        .iter()
        .find(|o| o.kind == kind.kind() && o.api_version == api_version)
        .map(|o| RingId::new(kind, o.name.as_str()))
}

/// Reconciles one object (for `crate::controllers::spawn_controller`).
pub(crate) async fn reconcile(
    object: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ring = RingObject::from_dynamic(ctx.kind, &object);
    if ring.object.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // An invalid ring's configuration is left (the webhook assigns nothing for it) and its
    // placement policy deleted; the ring controller reports it in its status.
    let (Ok(roles), Ok(range_key), Ok(keying)) = (ring.roles(), ring.range_key(), ring.keying())
    else {
        ctx.placements.remove(&ctx.client, &ring).await?;
        return Ok(Action::await_change());
    };
    if range_key.is_some() {
        // Range mode: the apiserver divides the ring's objects; no webhook assigns them.
        remove_configuration(&ctx.client, &ring).await?;
        ctx.placements.remove(&ctx.client, &ring).await?;
        return Ok(Action::requeue(ctx.resync));
    }
    let settings = WebhookSettings {
        ca_bundle: ctx.ca.borrow().clone(),
        ..ctx.settings.clone()
    };
    let desired = webhook_configuration(&ring, &roles, &settings);
    let name = desired.metadata.name.clone().unwrap_or_default();
    let api = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone());
    let mut existing = api.get_opt(&name).await.map_err(Error::Kube)?;
    let previous = existing.as_ref().map(previous_managers).unwrap_or_default();
    for manager in &previous {
        // An apply with no fields: whatever only that manager set goes.
        let release = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": { "name": name },
        });
        existing = Some(
            api.patch(&name, &PatchParams::apply(manager), &Patch::Apply(&release))
                .await
                .map_err(Error::Kube)?,
        );
        info!(
            ring = %ring.id,
            webhook_configuration = %name,
            manager = %manager,
            "the reference's fields of the webhook configuration released"
        );
    }
    if let Some(leftover) = ring.id.reference_configuration_name() {
        delete_reference_configuration(&api, &ring, &leftover).await?;
    }
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
            .get_or_create(&ReasonLabels {
                ring: RingLabel::new(&ring.id),
                reason: drift.reason().to_owned(),
            })
            .inc();
        info!(
            ring = %ring.id,
            webhook_configuration = %name,
            reason = drift.reason(),
            fields = %drift,
            "webhook configuration applied"
        );
    }
    ctx.guards.keep(&ctx.client, &ring, &roles).await?;
    ctx.placements
        .keep(
            &ctx.client,
            &ring,
            &roles,
            keying,
            &ctx.settings.namespace_selector,
        )
        .await?;
    Ok(Action::requeue(ctx.resync))
}

/// Deletes `ring`'s configuration, if there is one of this ring (by its ring label or owner).
async fn remove_configuration(client: &Client, ring: &RingObject) -> Result<(), Error> {
    let name = ring.id.configuration_name();
    let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let Some(existing) = api.get_opt(&name).await.map_err(Error::Kube)? else {
        return Ok(());
    };
    if ring_of(ring.id.kind, &existing).as_ref() != Some(&ring.id) {
        return Ok(());
    }
    if delete_this(&api, &existing).await? {
        info!(ring = %ring.id, webhook_configuration = %name, "webhook configuration deleted: the ring is in range mode");
    }
    Ok(())
}

/// Deletes `existing` with its uid as a precondition, so nothing else of its name is; whether
/// it did (not when it was gone already or replaced meanwhile).
async fn delete_this(
    api: &Api<MutatingWebhookConfiguration>,
    existing: &MutatingWebhookConfiguration,
) -> Result<bool, Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&existing.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Deletes the reference's configuration `name` of `ring` (v0.8's name for a ClusterRing's), if
/// it exists and is the reference's: a field of it applied by one of its managers, and not
/// another ring's (its controller reference, if any, is `ring`).
async fn delete_reference_configuration(
    api: &Api<MutatingWebhookConfiguration>,
    ring: &RingObject,
    name: &str,
) -> Result<(), Error> {
    let Some(leftover) = api.get_opt(name).await.map_err(Error::Kube)? else {
        return Ok(());
    };
    let ring_uid = ring.object.meta().uid.as_deref();
    let owner = leftover
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    if previous_managers(&leftover).is_empty()
        || owner.is_some_and(|o| Some(o.uid.as_str()) != ring_uid)
    {
        return Ok(());
    }
    if delete_this(api, &leftover).await? {
        info!(ring = %ring.id, webhook_configuration = %name, "the reference's webhook configuration deleted");
    }
    Ok(())
}

/// What to do after a failed reconcile (for `crate::controllers::spawn_controller`).
pub(crate) fn error_policy(object: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    let ring = RingId::new(ctx.kind, object.name_any());
    warn!(%ring, error = %error, "webhook configuration reconcile failed, retrying");
    Action::requeue(ERROR_REQUEUE)
}

/// The controller over the rings of `kind` matching `selector` (empty: all), triggered by the
/// webhook configurations, by every change of `ca`, with the label guard on (`guard`) by the
/// guards' policies and bindings, and with placement policies on (`placement`) by theirs.
pub(crate) fn controller(
    client: Client,
    kind: RingKind,
    selector: &str,
    ca: watch::Receiver<Vec<u8>>,
    guard: bool,
    placement: bool,
) -> (
    Controller<DynamicObject>,
    sharder_runtime::controller::Listed,
) {
    // All configurations are watched (they are few), so one whose ring label was removed is
    // still seen.
    let ca_changes = futures::stream::unfold(ca, |mut ca| async move {
        ca.changed().await.ok().map(|()| ((), ca))
    });
    let (controller, listed) = crate::controllers::ring_controller(client.clone(), kind, selector);
    let resource = kind.api_resource();
    let to_ring = {
        let resource = resource.clone();
        move |ring: RingId| ObjectRef::<DynamicObject>::new_with(&ring.name, resource.clone())
    };
    // The secondary watches ride out an apiserver's restart as the rings' watch does
    // (`sharder_runtime::controller::watch`): their refusals do not feed the controller's
    // backoff, which would hold back every watch of it.
    let mut controller = controller
        .watches_stream(
            sharder_runtime::controller::watch(
                Api::<MutatingWebhookConfiguration>::all(client.clone()),
                watcher::Config::default(),
            )
            .touched_objects(),
            {
                let to_ring = to_ring.clone();
                move |mwc| ring_of(kind, &mwc).map(&to_ring)
            },
        )
        .reconcile_all_on(ca_changes);
    // The policies carry their ring's label; a deleted or edited one is restored at once.
    let labelled = watcher::Config::default().labels(kind.lease_label());
    let mut policies = Vec::new();
    if guard {
        policies.push(ApiResource::erase::<ValidatingAdmissionPolicy>(&()));
        policies.push(ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&()));
    }
    if placement {
        policies.extend([policy_resource(), binding_resource()]);
    }
    for resource in policies {
        let to_ring = to_ring.clone();
        controller = controller.watches_stream_with(
            sharder_runtime::controller::watch(
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                labelled.clone(),
            )
            .touched_objects(),
            move |policy| {
                let ring = policy.labels().get(kind.lease_label())?;
                Some(to_ring(RingId::new(kind, ring.as_str())))
            },
            resource,
        );
    }
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
                        api_version: format!("{API_GROUP}/{API_VERSION}"),
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
        let ring = |name: &str| Some(RingId::cluster_ring(name));
        let cases = [
            (
                mwc(&[(RingKind::ClusterRing.lease_label(), "a")], None),
                ring("a"),
            ),
            (
                mwc(
                    &[(RingKind::ClusterRing.lease_label(), "a")],
                    Some(("ClusterRing", "b")),
                ),
                ring("a"),
            ),
            (mwc(&[], Some(("ClusterRing", "b"))), ring("b")),
            (mwc(&[("other", "a")], Some(("Deployment", "b"))), None),
            (mwc(&[], None), None),
            (mwc(&[], Some(("ControllerRing", "b"))), None),
        ];
        for (i, (config, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                ring_of(RingKind::ClusterRing, &config),
                expected,
                "case {i}"
            );
        }
    }

    #[test]
    fn a_configuration_of_a_controller_ring_belongs_to_no_cluster_ring() {
        let controller = RingKind::ControllerRing;
        let labelled = mwc(&[(controller.lease_label(), "a")], None);
        assert_eq!(
            ring_of(controller, &labelled),
            Some(RingId::controller_ring("a"))
        );
        assert_eq!(ring_of(RingKind::ClusterRing, &labelled), None);
        let owned = mwc(&[], Some(("ControllerRing", "b")));
        assert_eq!(
            ring_of(controller, &owned),
            Some(RingId::controller_ring("b"))
        );
    }
}
