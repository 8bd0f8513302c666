//! Objects the cluster tests create again and again: a ring sharding Secrets (and the ConfigMaps
//! they control), shard Leases, Secrets and their controlled ConfigMaps, a Pod's spec.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Secret};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{DynamicObject, ObjectMeta};
use sharder_common::{ClusterRing, ClusterRingSpec, GroupResource, RingId, RingResource};

use crate::control_plane::{NAMESPACE_NAME_LABEL, RING_NAMESPACE_LABEL};

/// The spec of a Pod of one pause container: Pending where no node runs it, which is all the
/// tests and the bench need of a Pod.
pub fn pause_pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "app".into(),
            image: Some("registry.k8s.io/pause:3.10".into()),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

/// A ring sharding `secrets` with the `configmaps` they control. With `namespace`, the ring
/// selects only that test namespace and carries [`RING_NAMESPACE_LABEL`] (so a reconciler started
/// with `--ring-selector` manages only it).
pub fn secrets_ring(name: &str, namespace: Option<&str>) -> ClusterRing {
    let mut ring = ClusterRing::new(
        name,
        ClusterRingSpec {
            resources: vec![RingResource {
                group: String::new(),
                resource: "secrets".into(),
                controlled_resources: vec![GroupResource::new("", "configmaps")],
            }],
            namespace_selector: namespace.map(|ns| LabelSelector {
                match_labels: Some([(NAMESPACE_NAME_LABEL.to_owned(), ns.to_owned())].into()),
                match_expressions: None,
            }),
        },
    );
    if let Some(ns) = namespace {
        ring.metadata.labels = Some([(RING_NAMESPACE_LABEL.to_owned(), ns.to_owned())].into());
    }
    ring
}

/// The ring object `ring` of its kind with `spec` and `labels` taken from `template` (one of
/// [`secrets_ring`]'s), as the apiserver takes it for either kind.
pub fn ring_object(ring: &RingId, template: &ClusterRing) -> DynamicObject {
    let mut object = DynamicObject::new(&ring.name, &ring.kind.api_resource()).data(
        serde_json::json!({ "spec": serde_json::to_value(&template.spec).unwrap_or_default() }),
    );
    object.metadata.labels = template.metadata.labels.clone();
    object
}

/// A shard Lease of `ring` renewed now, held by itself (`held`) or released (empty holder).
pub fn shard_lease(
    namespace: &str,
    ring: &RingId,
    name: &str,
    held: bool,
    duration_seconds: i32,
) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some([(ring.kind.lease_label().to_owned(), ring.name.clone())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(if held { name.into() } else { String::new() }),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    }
}

/// A Secret named `name` (namespace from the Api it is created with).
pub fn secret(name: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    }
}

/// An RBAC rule: `verbs` on `resources` of API group `group`.
pub fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

/// A ConfigMap controlled by the created Secret `owner` (an ownerReference with
/// `controller: true`).
pub fn child_of(owner: &Secret, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(vec![
                owner
                    .controller_owner_ref(&())
                    .expect("the owner was created (it has a uid)"),
            ]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// The request uid of [`secret_create_review`]'s reviews (the response must carry it back).
pub const REVIEW_UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// The body of an `admission.k8s.io/v1` AdmissionReview of a CREATE of Secret
/// `namespace/name` carrying `labels`, as the apiserver sends it to a webhook.
pub fn secret_create_review(
    name: &str,
    namespace: &str,
    labels: &[(&str, &str)],
    dry_run: bool,
) -> Vec<u8> {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    let mut metadata = serde_json::json!({"name": name, "namespace": namespace});
    if !labels.is_empty() {
        metadata["labels"] = serde_json::Value::Object(labels);
    }
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": REVIEW_UID,
            "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:project-a:deployer", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": metadata,
                "data": {"key": "dmFsdWU="}
            },
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    }))
    .unwrap_or_default()
}

/// A MutatingWebhookConfiguration `name` that refuses `operation` on core `resource` of objects
/// labelled `label` (`(key, value)`): failurePolicy Fail, pointing at a port nothing listens on.
pub fn refusing_configuration(
    name: &str,
    operation: &str,
    resource: &str,
    label: (&str, &str),
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "refuse.sharder.test".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some("https://127.0.0.1:9/refuse".into()),
                ..WebhookClientConfig::default()
            },
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(2),
            object_selector: Some(LabelSelector {
                match_labels: Some([(label.0.to_owned(), label.1.to_owned())].into()),
                match_expressions: None,
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec![operation.into()]),
                resources: Some(vec![resource.into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..MutatingWebhook::default()
        }]),
    }
}
