//! The reference sharder's objects as it writes them, from the data in `harness/reference/`: its
//! released ControllerRing CRD, the webhook configuration its controller applies for a ring, and
//! shard Leases renewed as its shard library (client-go's leader election) renews them. Switch
//! tests install these, so they meet the reference as it is, not Sharder's picture of it.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use sharder_common::{RingId, RingKind};

use crate::Error;

/// The reference's ControllerRing CRD, v0.13.0 as released.
pub const CONTROLLER_RING_CRD: &str =
    include_str!("../reference/v0.13.0-controllerrings.sharding.timebertt.dev.yaml");

/// The reference's ClusterRing CRD, v0.8.0 as released.
pub const CLUSTER_RING_CRD: &str =
    include_str!("../reference/v0.8.0-clusterrings.sharding.timebertt.dev.yaml");

/// The webhook configuration v0.13.0 applies, written for ring `checksum-controller` selecting
/// namespace `default`.
const WEBHOOK_CONFIGURATION: &str =
    include_str!("../reference/v0.13.0-mutatingwebhookconfiguration.yaml");

/// A shard Lease as v0.13.0's shard library holds it.
const SHARD_LEASE: &str = include_str!("../reference/v0.13.0-shard-lease.yaml");

/// The field manager of the reference's controllerring controller's applies.
pub const FIELD_MANAGER: &str = "controllerring-controller";

/// The ring and namespace the data files are written for.
const EXAMPLE_RING: &str = "checksum-controller";
const EXAMPLE_SELECTOR: &str = "kubernetes.io/metadata.name: default";

/// How often client-go's leader election in the reference's shards renews (its retry period).
pub const RENEW_PERIOD: Duration = Duration::from_secs(2);

fn parse<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> Result<T, Error> {
    serde_yaml::from_str(text)
        .map_err(|e| Error::Data(format!("the reference's {file} does not parse: {e}")))
}

/// Installs one of the reference's CRDs ([`CONTROLLER_RING_CRD`], [`CLUSTER_RING_CRD`]) and
/// waits until it is served.
pub async fn install_crd(client: &Client, file: &str) -> Result<(), Error> {
    let crd: CustomResourceDefinition = parse("CRD", file)?;
    crate::crd::install_crd(client, &crd).await.map(drop)
}

/// The webhook configuration the reference applies for ControllerRing `ring` (uid `uid`) whose
/// namespaceSelector selects namespace `namespace` by name.
pub fn webhook_configuration(
    ring: &str,
    uid: &str,
    namespace: &str,
) -> Result<MutatingWebhookConfiguration, Error> {
    let text = WEBHOOK_CONFIGURATION
        .replace("<ring uid>", uid)
        .replace(
            EXAMPLE_SELECTOR,
            &format!("kubernetes.io/metadata.name: {namespace}"),
        )
        .replace(EXAMPLE_RING, ring);
    parse("webhook configuration", &text)
}

/// Applies [`webhook_configuration`] as the reference does: server-side, as [`FIELD_MANAGER`].
pub async fn apply_webhook_configuration(
    client: &Client,
    ring: &str,
    uid: &str,
    namespace: &str,
) -> Result<MutatingWebhookConfiguration, Error> {
    let mwc = webhook_configuration(ring, uid, namespace)?;
    let name = mwc.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&mwc),
        )
        .await
        .map_err(Error::Kube)
}

/// The configuration v0.8 applied for ClusterRing `ring` (uid `uid`) selecting namespace
/// `namespace` by name, as its field manager `clusterring-controller` applied it
/// (`pkg/controller/clusterring/reconciler.go` at v0.8.0): named `sharding-<label name>`, labelled
/// with its app and ring, owned by the ring, calling its Service `sharding-system/sharder` on the
/// ring's path, for unassigned objects, failing open after 5 s.
pub fn v0_8_webhook_configuration(
    ring: &RingId,
    uid: &str,
    namespace: &str,
) -> Result<MutatingWebhookConfiguration, Error> {
    let name = ring
        .reference_configuration_name()
        .ok_or_else(|| Error::Data(format!("{ring} is no ClusterRing")))?;
    let rule = |resource: &str| {
        serde_json::json!({
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [""],
            "apiVersions": ["*"],
            "resources": [resource],
            "scope": "*",
        })
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "controller-sharding",
                ring.kind.lease_label(): ring.name,
            },
            "ownerReferences": [{
                "apiVersion": "sharding.timebertt.dev/v1alpha1",
                "kind": "ClusterRing",
                "name": ring.name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "webhooks": [{
            "name": "sharder.sharding.timebertt.dev",
            "clientConfig": {
                "service": {
                    "namespace": "sharding-system",
                    "name": "sharder",
                    "path": ring.webhook_path(),
                    "port": 443,
                },
            },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": namespace } },
            "objectSelector": { "matchExpressions": [{
                "key": ring.labels().shard,
                "operator": "DoesNotExist",
            }] },
            "rules": [rule("secrets"), rule("configmaps")],
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .map_err(|e| Error::Data(format!("v0.8's webhook configuration: {e}")))
}

/// Shard `shard`'s Lease in `namespace` for `ring` as the reference's shard library holds it
/// (held by the shard, 15 s, ready), acquired and renewed now; for a ClusterRing (v0.8) labelled
/// with that kind's ring label instead.
pub fn shard_lease(shard: &str, namespace: &str, ring: &RingId) -> Result<Lease, Error> {
    let text = SHARD_LEASE.replace(EXAMPLE_RING, &ring.name);
    let mut lease: Lease = parse("shard Lease", &text)?;
    let labels = lease.metadata.labels.get_or_insert_default();
    if let Some(name) = labels.remove(RingKind::ControllerRing.lease_label()) {
        labels.insert(ring.kind.lease_label().to_owned(), name);
    }
    lease.metadata.name = Some(shard.to_owned());
    lease.metadata.namespace = Some(namespace.to_owned());
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(shard.to_owned());
    let now = MicroTime(Timestamp::now());
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    Ok(lease)
}

/// Renewals of shard Leases, as client-go's leader election makes them, until dropped.
pub struct Renewals(JoinHandle<()>);

impl Drop for Renewals {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Creates [`shard_lease`] for each of `shards` and renews them every [`RENEW_PERIOD`] as
/// client-go does: a read, then a full Update with `renewTime` set and everything else as read
/// (so labels another writer added stay), again after a conflict.
pub async fn hold_shard_leases(
    client: &Client,
    namespace: &str,
    ring: &RingId,
    shards: &[&str],
) -> Result<Renewals, Error> {
    let leases = Api::<Lease>::namespaced(client.clone(), namespace);
    for shard in shards {
        let lease = shard_lease(shard, namespace, ring)?;
        leases
            .create(&PostParams::default(), &lease)
            .await
            .map_err(Error::Kube)?;
    }
    let names: Vec<String> = shards.iter().map(|s| (*s).to_owned()).collect();
    Ok(Renewals(tokio::spawn(async move {
        loop {
            tokio::time::sleep(RENEW_PERIOD).await;
            for name in &names {
                let Ok(mut lease) = leases.get(name).await else {
                    continue;
                };
                lease.spec.get_or_insert_default().renew_time = Some(MicroTime(Timestamp::now()));
                // A conflict is tried again at the next period, as client-go does.
                let _ = leases.replace(name, &PostParams::default(), &lease).await;
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_s_configuration_is_written_for_the_ring_and_namespace_given() {
        let mwc = webhook_configuration("my-ring", "u-1", "my-ns").expect("parses");
        assert_eq!(mwc.metadata.name.as_deref(), Some("controllerring-my-ring"));
        assert_eq!(mwc.metadata.owner_references.expect("owner")[0].uid, "u-1");
        let webhook = &mwc.webhooks.expect("webhooks")[0];
        let selector = webhook.namespace_selector.as_ref().expect("selector");
        assert_eq!(
            selector.match_labels.as_ref().expect("labels")["kubernetes.io/metadata.name"],
            "my-ns"
        );
        let service = webhook.client_config.service.as_ref().expect("a Service");
        assert_eq!(
            service.path.as_deref(),
            Some("/webhooks/sharder/controllerring/my-ring")
        );
        let lease =
            shard_lease("s-0", "my-ns", &RingId::controller_ring("my-ring")).expect("parses");
        assert_eq!(
            lease.metadata.labels.expect("labels")["alpha.sharding.timebertt.dev/controllerring"],
            "my-ring"
        );
        let v0_8 = shard_lease("s-0", "my-ns", &RingId::cluster_ring("my-ring")).expect("parses");
        let labels = v0_8.metadata.labels.expect("labels");
        assert_eq!(
            labels["alpha.sharding.timebertt.dev/clusterring"],
            "my-ring"
        );
        assert!(!labels.contains_key("alpha.sharding.timebertt.dev/controllerring"));
        assert_eq!(
            lease.spec.expect("spec").holder_identity.as_deref(),
            Some("s-0")
        );
        let ring = RingId::cluster_ring("my-ring");
        let old = v0_8_webhook_configuration(&ring, "u-2", "my-ns").expect("builds");
        assert_eq!(
            old.metadata.name,
            Some(format!("sharding-{}", ring.label_name()))
        );
    }
}
