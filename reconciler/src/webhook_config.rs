//! The MutatingWebhookConfiguration of one ClusterRing (docs/design.md §6), built as a pure function of
//! the ring and the reconciler's flags, and owned by the ring so it goes when the ring goes.
//! [`controller`] keeps it so in the cluster, [`drift`] tells what differs, [`ca`] follows the
//! CA file.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, OwnerReference,
};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use sharder_common::endpoint::webhook_path;
use sharder_common::labels::{RING_LABEL, ring_label_name};
use sharder_common::{ClusterRing, Roles};

pub mod ca;
pub mod controller;
pub mod drift;

/// Label key the apiserver (1.21+) puts on every namespace with its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Where the apiserver reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A Service in the cluster.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
        /// Port of the Service.
        port: i32,
    },
    /// A base URL, e.g. `https://127.0.0.1:9443` (the ring path is appended).
    Url(String),
}

/// Everything besides the ring that goes into its webhook configuration.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Where the webhook is.
    pub target: WebhookTarget,
    /// PEM bundle of the CA that signed the webhook's serving certificate.
    pub ca_bundle: Vec<u8>,
    /// `timeoutSeconds` of the webhook call.
    pub timeout_seconds: i32,
    /// Namespaces excluded when the ring has no namespaceSelector (kube-system and the
    /// sharder's own namespace).
    pub excluded_namespaces: Vec<String>,
}

/// The name of a ring's webhook configuration: `sharder-` + the ring's 63-character label name
/// part (unique per ring, valid whatever the ring name's length).
pub fn configuration_name(ring: &str) -> String {
    format!("sharder-{}", ring_label_name(ring))
}

/// The default namespaceSelector: every namespace but the excluded ones (by the
/// `kubernetes.io/metadata.name` label, so it takes effect on 1.21+ apiservers; the reconciler
/// additionally filters by namespace name when it lists objects).
pub fn default_namespace_selector(excluded: &[String]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(excluded.to_vec()),
        }]),
    }
}

/// The webhook configuration of `ring`, whose resources have `roles` (see
/// [`sharder_common::ClusterRingSpec::roles`]).
pub fn webhook_configuration(
    ring: &ClusterRing,
    roles: &Roles,
    settings: &WebhookSettings,
) -> MutatingWebhookConfiguration {
    let name = ring.name_any();
    let labels = ring.labels();
    let path = webhook_path(&name);
    let client_config = match &settings.target {
        WebhookTarget::Service {
            namespace,
            name: service,
            port,
        } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: service.clone(),
                path: Some(path),
                port: Some(*port),
            }),
            url: None,
            ca_bundle: Some(ByteString(settings.ca_bundle.clone())),
        },
        WebhookTarget::Url(base) => WebhookClientConfig {
            service: None,
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle: Some(ByteString(settings.ca_bundle.clone())),
        },
    };
    // One rule per API group, each with the group's main and controlled resources.
    let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (resource, _) in roles.iter() {
        by_group
            .entry(resource.group.clone())
            .or_default()
            .push(resource.resource.clone());
    }
    let rules = by_group
        .into_iter()
        .map(|(group, mut resources)| {
            resources.sort();
            RuleWithOperations {
                api_groups: Some(vec![group]),
                api_versions: Some(vec!["*".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(resources),
                scope: Some("*".into()),
            }
        })
        .collect();
    let owner = OwnerReference {
        api_version: ClusterRing::api_version(&()).into_owned(),
        kind: ClusterRing::kind(&()).into_owned(),
        name: name.clone(),
        uid: ring.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(configuration_name(&name)),
            labels: Some([(RING_LABEL.to_owned(), name.clone())].into()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "sharder.sharding.timebertt.dev".into(),
            admission_review_versions: vec!["v1".into()],
            client_config,
            failure_policy: Some("Ignore".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(settings.timeout_seconds),
            match_policy: Some("Equivalent".into()),
            reinvocation_policy: Some("Never".into()),
            object_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: labels.shard,
                    operator: "DoesNotExist".into(),
                    values: None,
                }]),
            }),
            namespace_selector: Some(
                ring.spec
                    .namespace_selector
                    .clone()
                    .unwrap_or_else(|| default_namespace_selector(&settings.excluded_namespaces)),
            ),
            rules: Some(rules),
            ..MutatingWebhook::default()
        }]),
    }
}

#[cfg(test)]
mod tests {
    use sharder_common::{ClusterRingSpec, GroupResource, RingResource};

    use super::*;

    fn ring(namespace_selector: Option<LabelSelector>) -> ClusterRing {
        let mut ring = ClusterRing::new(
            "example",
            ClusterRingSpec {
                resources: vec![
                    RingResource {
                        group: "apps".into(),
                        resource: "deployments".into(),
                        controlled_resources: vec![
                            GroupResource::new("apps", "replicasets"),
                            GroupResource::new("", "configmaps"),
                        ],
                    },
                    RingResource {
                        group: String::new(),
                        resource: "secrets".into(),
                        controlled_resources: vec![GroupResource::new("", "configmaps")],
                    },
                ],
                namespace_selector,
            },
        );
        ring.metadata.uid = Some("ring-uid".into());
        ring
    }

    fn roles() -> Roles {
        ring(None).spec.roles().expect("valid")
    }

    fn settings(target: WebhookTarget) -> WebhookSettings {
        WebhookSettings {
            target,
            ca_bundle: b"---CA---".to_vec(),
            timeout_seconds: 5,
            excluded_namespaces: vec!["kube-system".into(), "sharding-system".into()],
        }
    }

    fn service() -> WebhookTarget {
        WebhookTarget::Service {
            namespace: "sharding-system".into(),
            name: "sharder-webhook".into(),
            port: 443,
        }
    }

    #[test]
    fn configuration_follows_the_design() {
        let mwc = webhook_configuration(&ring(None), &roles(), &settings(service()));
        assert_eq!(
            mwc.metadata.name.as_deref(),
            Some("sharder-clusterring-50d858e0-example")
        );
        let owner = &mwc.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("ClusterRing", "example", "ring-uid", Some(true))
        );
        let webhook = &mwc.webhooks.as_ref().expect("webhooks")[0];
        assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(webhook.side_effects, "None");
        assert_eq!(webhook.timeout_seconds, Some(5));
        assert_eq!(webhook.admission_review_versions, ["v1"]);
        let object_selector = webhook.object_selector.as_ref().expect("objectSelector");
        let expr = &object_selector
            .match_expressions
            .as_ref()
            .expect("expressions")[0];
        assert_eq!(
            expr.key,
            "shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example"
        );
        assert_eq!(expr.operator, "DoesNotExist");
        let service = webhook.client_config.service.as_ref().expect("service");
        assert_eq!(
            service.path.as_deref(),
            Some("/webhooks/sharder/clusterring/example")
        );
        assert_eq!(
            webhook.client_config.ca_bundle,
            Some(ByteString(b"---CA---".to_vec()))
        );
    }

    #[test]
    fn rules_cover_main_and_controlled_resources_per_group_for_create_and_update() {
        let mwc = webhook_configuration(&ring(None), &roles(), &settings(service()));
        let rules = mwc.webhooks.expect("webhooks")[0]
            .rules
            .clone()
            .expect("rules");
        let summary: Vec<(Vec<String>, Vec<String>, Vec<String>)> = rules
            .into_iter()
            .map(|r| {
                (
                    r.api_groups.expect("groups"),
                    r.resources.expect("resources"),
                    r.operations.expect("operations"),
                )
            })
            .collect();
        let ops = vec!["CREATE".to_owned(), "UPDATE".to_owned()];
        assert_eq!(
            summary,
            [
                (
                    vec![String::new()],
                    vec!["configmaps".to_owned(), "secrets".to_owned()],
                    ops.clone()
                ),
                (
                    vec!["apps".to_owned()],
                    vec!["deployments".to_owned(), "replicasets".to_owned()],
                    ops
                ),
            ]
        );
    }

    #[test]
    fn namespace_selector_is_the_rings_or_a_default_excluding_system_namespaces() {
        let default = webhook_configuration(&ring(None), &roles(), &settings(service()));
        let selector = default.webhooks.expect("webhooks")[0]
            .namespace_selector
            .clone()
            .expect("selector");
        let expr = &selector.match_expressions.expect("expressions")[0];
        assert_eq!(expr.operator, "NotIn");
        assert_eq!(
            expr.values.clone().expect("values"),
            ["kube-system", "sharding-system"]
        );

        let own = LabelSelector {
            match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
            match_expressions: None,
        };
        let mwc = webhook_configuration(&ring(Some(own.clone())), &roles(), &settings(service()));
        assert_eq!(
            mwc.webhooks.expect("webhooks")[0].namespace_selector,
            Some(own)
        );
    }

    #[test]
    fn a_url_target_gets_the_ring_path_appended() {
        let mwc = webhook_configuration(
            &ring(None),
            &roles(),
            &settings(WebhookTarget::Url("https://127.0.0.1:9443/".into())),
        );
        let config = &mwc.webhooks.expect("webhooks")[0].client_config;
        assert_eq!(
            config.url.as_deref(),
            Some("https://127.0.0.1:9443/webhooks/sharder/clusterring/example")
        );
        assert!(config.service.is_none());
    }

    #[test]
    fn long_ring_names_give_valid_configuration_names() {
        let name = configuration_name(&"r".repeat(253));
        assert!(name.len() <= 253 && name.len() == "sharder-".len() + 63);
    }
}
