//! The MutatingWebhookConfiguration of one ring (docs/design.md §7), as a pure function of
//! the ring and the installation's settings: the apiserver calls the webhook only for the ring's
//! unassigned objects in the ring's namespaces. The reconciler keeps it in the cluster; tests
//! register exactly this configuration.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::{RingObject, Roles};

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
    /// The namespaces every ring is limited to ([`global_namespace_selector`]).
    pub namespace_selector: LabelSelector,
}

/// The selector every ring is limited to: `flag` (`--namespace-selector`) as given, or by
/// default every namespace but `kube-system` and the sharder's own namespace `own` (by the
/// `kubernetes.io/metadata.name` label the apiserver puts on every namespace since 1.21).
pub fn global_namespace_selector(flag: Option<&LabelSelector>, own: &str) -> LabelSelector {
    flag.cloned().unwrap_or_else(|| LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(vec!["kube-system".to_owned(), own.to_owned()]),
        }]),
    })
}

/// Both selectors at once (a namespace must match each): their label matches become `In`
/// expressions, so one key wanted with two values selects nothing rather than one of them.
pub fn both_selectors(a: Option<&LabelSelector>, b: &LabelSelector) -> LabelSelector {
    let mut expressions = Vec::new();
    for selector in a.into_iter().chain([b]) {
        for (key, value) in selector.match_labels.iter().flatten() {
            expressions.push(LabelSelectorRequirement {
                key: key.clone(),
                operator: "In".into(),
                values: Some(vec![value.clone()]),
            });
        }
        expressions.extend(selector.match_expressions.iter().flatten().cloned());
    }
    LabelSelector {
        match_labels: None,
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    }
}

/// The namespaces ring `spec` shards in: its own namespaceSelector (none: all) and the global
/// one.
pub fn ring_namespace_selector(
    spec: &crate::ClusterRingSpec,
    global: &LabelSelector,
) -> LabelSelector {
    both_selectors(spec.namespace_selector.as_ref(), global)
}

/// The resources of `roles` by API group (one admission rule each), each group's sorted: its
/// main and controlled resources together.
pub fn resources_by_group(roles: &Roles) -> BTreeMap<String, Vec<String>> {
    let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (resource, _) in roles.iter() {
        by_group
            .entry(resource.group.clone())
            .or_default()
            .push(resource.resource.clone());
    }
    for resources in by_group.values_mut() {
        resources.sort();
    }
    by_group
}

/// The webhook configuration of `ring`, whose resources have `roles` (see
/// [`RingObject::roles`]).
pub fn webhook_configuration(
    ring: &RingObject,
    roles: &Roles,
    settings: &WebhookSettings,
) -> MutatingWebhookConfiguration {
    let id = &ring.id;
    let labels = id.labels();
    let path = id.webhook_path();
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
    let rules = resources_by_group(roles)
        .into_iter()
        .map(|(group, resources)| RuleWithOperations {
            api_groups: Some(vec![group]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(resources),
            scope: Some("*".into()),
        })
        .collect();
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(id.configuration_name()),
            labels: Some([(id.kind.lease_label().to_owned(), id.name.clone())].into()),
            owner_references: Some(vec![ring.owner_reference()]),
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
            namespace_selector: Some(ring_namespace_selector(
                &ring.object.spec,
                &settings.namespace_selector,
            )),
            rules: Some(rules),
            ..MutatingWebhook::default()
        }]),
    }
}

#[cfg(test)]
mod tests {
    use crate::{ClusterRing, ClusterRingSpec, GroupResource, RingId, RingResource};

    use super::*;

    fn ring(namespace_selector: Option<LabelSelector>) -> RingObject {
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
        RingObject::cluster_ring(ring)
    }

    fn roles() -> Roles {
        ring(None).roles().expect("valid")
    }

    fn settings(target: WebhookTarget) -> WebhookSettings {
        WebhookSettings {
            target,
            ca_bundle: b"---CA---".to_vec(),
            timeout_seconds: 5,
            namespace_selector: global_namespace_selector(None, "sharding-system"),
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
    fn every_ring_is_limited_to_the_global_selector_by_default_not_the_sharders_namespace() {
        let not_in = |values: &[&str]| LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        };
        let selector_of = |mwc: MutatingWebhookConfiguration| {
            mwc.webhooks.expect("webhooks")[0]
                .namespace_selector
                .clone()
                .expect("selector")
        };
        let default = webhook_configuration(&ring(None), &roles(), &settings(service()));
        assert_eq!(
            selector_of(default).match_expressions,
            Some(vec![not_in(&["kube-system", "sharding-system"])])
        );
        let given = LabelSelector {
            match_labels: Some([("sharded".to_owned(), "yes".to_owned())].into()),
            match_expressions: None,
        };
        assert_eq!(
            global_namespace_selector(Some(&given), "sharding-system"),
            given,
            "a given selector is used as it is"
        );

        let own = LabelSelector {
            match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "Exists".into(),
                values: None,
            }]),
        };
        let mwc = webhook_configuration(&ring(Some(own)), &roles(), &settings(service()));
        let team_a = LabelSelectorRequirement {
            key: "team".into(),
            operator: "In".into(),
            values: Some(vec!["a".into()]),
        };
        let tier = LabelSelectorRequirement {
            key: "tier".into(),
            operator: "Exists".into(),
            values: None,
        };
        assert_eq!(
            selector_of(mwc),
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![
                    team_a,
                    tier,
                    not_in(&["kube-system", "sharding-system"])
                ]),
            }
        );
    }

    #[test]
    fn one_key_wanted_with_two_values_selects_nothing_rather_than_either() {
        let team = |v: &str| LabelSelector {
            match_labels: Some([("team".to_owned(), v.to_owned())].into()),
            match_expressions: None,
        };
        let both = both_selectors(Some(&team("a")), &team("b"));
        let selector = kube::core::Selector::try_from(both).expect("valid");
        let labels = |v: &str| [("team".to_owned(), v.to_owned())].into();
        use kube::core::SelectorExt as _;
        assert!(!selector.matches(&labels("a")));
        assert!(!selector.matches(&labels("b")));
        let one = kube::core::Selector::try_from(both_selectors(None, &team("a"))).expect("valid");
        assert!(one.matches(&labels("a")));
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
        let name = crate::RingId::cluster_ring("r".repeat(253)).configuration_name();
        assert!(name.len() <= 253 && name.len() == "sharder-".len() + 63);
        let name = crate::RingId::controller_ring("r".repeat(63)).configuration_name();
        assert_eq!(name.len(), "controllerring-".len() + 63);
    }

    #[test]
    fn a_controller_ring_gets_the_references_names_and_keys() {
        let mut ring = ring(None);
        ring.id = RingId::controller_ring("example");
        let mwc = webhook_configuration(&ring, &roles(), &settings(service()));
        assert_eq!(mwc.metadata.name.as_deref(), Some("controllerring-example"));
        assert_eq!(
            mwc.metadata.labels.as_ref().expect("labels")["alpha.sharding.timebertt.dev/controllerring"],
            "example"
        );
        let owner = &mwc.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.kind, "ControllerRing");
        let webhook = &mwc.webhooks.as_ref().expect("webhooks")[0];
        assert_eq!(webhook.name, "sharder.sharding.timebertt.dev");
        assert_eq!(
            webhook
                .client_config
                .service
                .as_ref()
                .and_then(|s| s.path.as_deref()),
            Some("/webhooks/sharder/controllerring/example")
        );
        let selector = webhook.object_selector.as_ref().expect("object selector");
        assert_eq!(
            selector.match_expressions.as_ref().expect("expressions")[0].key,
            "shard.alpha.sharding.timebertt.dev/example"
        );
    }
}
