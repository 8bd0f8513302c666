//! One MutatingWebhookConfiguration per ring: created with the ring's resources, pointing at
//! the webhook, updated when the ring changes, garbage-collected with the ring; the ring's
//! status reports its shards.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use sharder_common::ClusterRing;
use sharder_reconciler::webhook_config::configuration_name;
use sharder_tests::control_plane::NAMESPACE_LABEL;
use sharder_tests::wait::eventually;

use crate::{Test, WAIT};

#[tokio::test]
async fn a_webhook_configuration_follows_its_ring_and_goes_with_it() {
    let mut w = Test::new("mwc").await;
    w.add_shard_lease("shard-a", 3600).await;
    w.start_webhook().await;
    w.start_reconciler().await;
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = configuration_name(&w.ring);
    let resources = |mwc: &MutatingWebhookConfiguration| -> BTreeSet<String> {
        mwc.webhooks
            .iter()
            .flatten()
            .flat_map(|h| h.rules.iter().flatten())
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect()
    };
    let created = eventually("webhook configuration created", WAIT, || async {
        mwcs.get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "absent".to_owned())
    })
    .await;
    assert_eq!(
        resources(&created),
        ["configmaps".to_owned(), "secrets".to_owned()].into()
    );
    let hook = &created.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(w.webhook.as_ref().expect("webhook").url(&w.ring).as_str())
    );
    assert_eq!(
        hook.namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone()),
        Some([(NAMESPACE_LABEL.to_owned(), w.ns.clone())].into())
    );

    // Status reflects the shards.
    let rings = Api::<ClusterRing>::all(w.client.clone());
    eventually("ring status", WAIT, || async {
        let ring = rings.get(&w.ring).await.map_err(|e| e.to_string())?;
        let status = ring.status.ok_or_else(|| "no status".to_owned())?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (status.available_shards == Some(1)
            && status.shards == Some(1)
            && ready
            && status.observed_generation == Some(1))
        .then_some(())
        .ok_or(format!("{status:?}"))
    })
    .await;

    // A changed ring changes its configuration.
    let patch = json!({"spec": {"resources": [
        {"group": "", "resource": "secrets", "controlledResources": [{"group": "", "resource": "configmaps"}]},
        {"group": "apps", "resource": "deployments"}
    ]}});
    rings
        .patch(&w.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("update ring");
    eventually("webhook configuration updated", WAIT, || async {
        let mwc = mwcs.get(&name).await.map_err(|e| e.to_string())?;
        resources(&mwc)
            .contains("deployments")
            .then_some(())
            .ok_or(format!("{:?}", resources(&mwc)))
    })
    .await;

    // Deleting the ring removes its configuration (owner reference, garbage collector).
    rings
        .delete(&w.ring, &DeleteParams::default())
        .await
        .expect("delete ring");
    eventually(
        "webhook configuration removed with the ring",
        Duration::from_secs(60),
        || async {
            match mwcs.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|m| m.is_some()))),
            }
        },
    )
    .await;
}
