//! The `ClusterRing` API (`sharding.timebertt.dev/v1alpha1`, cluster-scoped, status subresource):
//! which resources one sharded controller owns, and the CRD generated from these types.
//!
//! The checked-in CRD under `charts/sharder/crds/` is generated from these types
//! (`make crd`); a test fails when it drifts.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::Selector;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::ring_kind::RingKind;

pub use crate::ring_kind::{API_GROUP, API_VERSION};

/// Type of the condition that tells whether the ring is ready.
pub const CONDITION_READY: &str = "Ready";

/// Desired state of a ClusterRing: the resources of one sharded controller.
// The printer columns repeat `type_ = "string"`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sharding.timebertt.dev",
    version = "v1alpha1",
    kind = "ClusterRing",
    status = "ClusterRingStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A ring of shards of one sharded controller: the sharder assigns the objects of the listed resources to the available shards of the ring.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type == "Ready")].status"#
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.availableShards"
    ),
    printcolumn(name = "Shards", type_ = "string", json_path = ".status.shards"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRingSpec {
    /// The sharded resources: each main resource of the controller with the resources it
    /// controls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<RingResource>,

    /// Selects the namespaces whose objects are sharded. Defaults to every namespace but
    /// `kube-system` and the sharder's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// A main resource of the sharded controller and the resources it controls.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RingResource {
    /// API group of the main resource (empty for the core group).
    #[serde(default)]
    #[schemars(transform = without_default)]
    pub group: String,

    /// Plural resource name of the main resource, e.g. `secrets`.
    #[schemars(length(min = 1))]
    pub resource: String,

    /// Resources whose objects are controlled by the main resource's objects (through an
    /// ownerReference with `controller: true`); they follow their owner's shard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controlled_resources: Vec<GroupResource>,
}

/// A resource named by API group and plural name.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct GroupResource {
    /// API group (empty for the core group).
    #[serde(default)]
    #[schemars(transform = without_default)]
    pub group: String,

    /// Plural resource name, e.g. `configmaps`.
    #[schemars(length(min = 1))]
    pub resource: String,
}

/// Drops the `default: ""` that `#[serde(default)]` puts into the derived schema of `group`
/// fields, as the reference's schema has none: a group left out stays left out as written (the
/// core group either way).
fn without_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

impl GroupResource {
    /// A group and resource.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

impl RingResource {
    /// The main resource as a [`GroupResource`].
    pub fn main(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.resource)
    }
}

/// Observed state of a ClusterRing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRingStatus {
    /// The generation the reconciler acted on last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Number of shard Leases of the ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<i32>,

    /// Number of shards available for assignments (ready, expired or uncertain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_shards: Option<i32>,

    /// Conditions of the ring; type `Ready` tells whether the ring is configured and has an
    /// available shard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// How a resource takes part in a ring (docs/design.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A main resource: its objects are keyed by themselves and moved off a live shard by
    /// draining.
    Main,
    /// A controlled resource: its objects are keyed by their controller owner and follow it.
    Controlled,
}

/// The resources of a valid ring with their roles, in spec order (each main resource, then the
/// resources it controls that were not listed before). Built by [`ClusterRingSpec::roles`], the
/// one place that turns a spec into roles for the webhook, the reconciler and the webhook
/// configuration alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roles(Vec<(GroupResource, Role)>);

impl Roles {
    /// The role of `group`/`resource` in the ring, if the ring shards it. Allocates nothing.
    pub fn get(&self, group: &str, resource: &str) -> Option<Role> {
        self.0
            .iter()
            .find(|(gr, _)| gr.group == group && gr.resource == resource)
            .map(|(_, role)| *role)
    }

    /// Every sharded resource with its role, in spec order.
    pub fn iter(&self) -> impl Iterator<Item = (&GroupResource, Role)> {
        self.0.iter().map(|(gr, role)| (gr, *role))
    }

    /// How many resources the ring shards.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the ring shards no resource.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl ClusterRingSpec {
    /// Checks what the CRD schema cannot: names present, no resource listed twice as a main
    /// resource or twice under one main resource, no resource both main and controlled (it
    /// would be keyed two ways), and a namespaceSelector the apiserver can evaluate. Errors name
    /// the field to fix.
    pub fn validate(&self) -> Result<(), Error> {
        self.roles().map(|_| ())
    }

    /// The ring's resources with their roles, after [`validate`](Self::validate)'s checks. A
    /// resource controlled by several main resources is listed once.
    pub fn roles(&self) -> Result<Roles, Error> {
        let invalid = |message: String| Err(Error::InvalidRing(message));
        let mut main: Vec<(GroupResource, usize)> = Vec::new();
        for (i, resource) in self.resources.iter().enumerate() {
            if resource.resource.is_empty() {
                return invalid(format!("spec.resources[{i}].resource must not be empty"));
            }
            if main.iter().any(|(gr, _)| *gr == resource.main()) {
                return invalid(format!(
                    "spec.resources[{i}] lists {} twice",
                    resource.main()
                ));
            }
            main.push((resource.main(), i));
        }
        let mut roles: Vec<(GroupResource, Role)> = Vec::new();
        for (i, resource) in self.resources.iter().enumerate() {
            roles.push((resource.main(), Role::Main));
            let mut seen = BTreeSet::new();
            for (j, child) in resource.controlled_resources.iter().enumerate() {
                if child.resource.is_empty() {
                    return invalid(format!(
                        "spec.resources[{i}].controlledResources[{j}].resource must not be empty"
                    ));
                }
                if !seen.insert(child) {
                    return invalid(format!(
                        "spec.resources[{i}].controlledResources lists {child} twice"
                    ));
                }
                if let Some((_, k)) = main.iter().find(|(gr, _)| gr == child) {
                    return invalid(format!(
                        "spec.resources[{i}].controlledResources[{j}] lists {child}, which \
                         spec.resources[{k}] lists as a main resource: a resource is either \
                         sharded by its own key or follows its controller, not both"
                    ));
                }
                if !roles.iter().any(|(gr, _)| gr == child) {
                    roles.push((child.clone(), Role::Controlled));
                }
            }
        }
        self.parse_namespace_selector()?;
        Ok(Roles(roles))
    }

    /// The ring's namespaceSelector as a [`Selector`] (`None`: the default, every namespace but
    /// the excluded ones). Errors name the field to fix.
    pub fn parse_namespace_selector(&self) -> Result<Option<Selector>, Error> {
        let Some(selector) = &self.namespace_selector else {
            return Ok(None);
        };
        Selector::try_from(selector.clone())
            .map(Some)
            .map_err(|e| {
                Error::InvalidRing(format!(
                    "spec.namespaceSelector: {} (operators: In and NotIn with values, Exists, DoesNotExist)",
                    e.0
                ))
            })
    }
}

/// The message of the ControllerRing CRD's rule on the name's length (the reference's words,
/// which the apiserver answers a longer name with).
pub const NAME_LENGTH_MESSAGE: &str = "ControllerRing name must not be longer than 63 characters";

/// The CRD of a ring kind. Both kinds share the schema generated from these types; a
/// ControllerRing's name is at most 63 characters, by the CEL rule the reference's CRD states
/// (`size(self.metadata.name) <= 63` on the object). The ClusterRing CRD has no such rule, as the
/// reference's v0.8 had none: the sharder checks every ring's name itself too
/// ([`crate::RingId::validate`]).
pub fn crd(kind: RingKind) -> CustomResourceDefinition {
    let mut crd = ClusterRing::crd();
    if kind == RingKind::ClusterRing {
        return crd;
    }
    crd.metadata.name = Some(format!("{}.{API_GROUP}", kind.plural()));
    let names = &mut crd.spec.names;
    names.kind = kind.kind().to_owned();
    names.list_kind = Some(format!("{}List", kind.kind()));
    names.plural = kind.plural().to_owned();
    names.singular = Some(kind.lower().to_owned());
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.x_kubernetes_validations = Some(vec![ValidationRule {
                rule: "size(self.metadata.name) <= 63".to_owned(),
                message: Some(NAME_LENGTH_MESSAGE.to_owned()),
                ..ValidationRule::default()
            }]);
            schema.title = Some(kind.kind().to_owned());
        }
    }
    crd
}

/// The CRD of `kind` as YAML, exactly as checked in under `charts/sharder/crds/`.
pub fn crd_yaml(kind: RingKind) -> Result<String, Error> {
    serde_yaml::to_string(&crd(kind)).map_err(|e| Error::Serialize(e.to_string()))
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn cluster_ring_is_cluster_scoped_in_the_sharding_group() {
        let crd = ClusterRing::crd();
        assert_eq!(crd.spec.group, API_GROUP);
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.kind, "ClusterRing");
        assert_eq!(crd.spec.names.plural, "clusterrings");
        assert_eq!(
            ClusterRing::api_version(&()),
            "sharding.timebertt.dev/v1alpha1"
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, API_VERSION);
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }

    #[test]
    fn printer_columns_are_ready_available_shards_age() {
        let crd = ClusterRing::crd();
        let columns: Vec<_> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Ready", "Available", "Shards", "Age"]);
    }

    #[test]
    fn checked_in_crds_match_the_types() {
        let checked_in = [
            (
                RingKind::ClusterRing,
                include_str!("../../charts/sharder/crds/clusterrings.sharding.timebertt.dev.yaml"),
            ),
            (
                RingKind::ControllerRing,
                include_str!(
                    "../../charts/sharder/crds/controllerrings.sharding.timebertt.dev.yaml"
                ),
            ),
        ];
        for (kind, checked_in) in checked_in {
            let generated = crd_yaml(kind).expect("serializable");
            assert!(
                checked_in == generated,
                "charts/sharder/crds/{}.{API_GROUP}.yaml is out of date: run `make crd`",
                kind.plural()
            );
        }
    }

    #[test]
    fn the_controller_ring_crd_differs_only_in_names_and_its_name_limit() {
        let cluster = crd(RingKind::ClusterRing);
        let controller = crd(RingKind::ControllerRing);
        assert_eq!(
            controller.metadata.name.as_deref(),
            Some("controllerrings.sharding.timebertt.dev")
        );
        let names = &controller.spec.names;
        assert_eq!(
            (
                names.kind.as_str(),
                names.plural.as_str(),
                names.singular.as_deref(),
                names.list_kind.as_deref()
            ),
            (
                "ControllerRing",
                "controllerrings",
                Some("controllerring"),
                Some("ControllerRingList")
            )
        );
        assert_eq!(controller.spec.scope, "Cluster");
        let schema = |c: &CustomResourceDefinition| {
            c.spec.versions[0]
                .schema
                .clone()
                .and_then(|s| s.open_api_v3_schema)
                .expect("schema")
        };
        let mut controller_schema = schema(&controller);
        let rules = controller_schema
            .x_kubernetes_validations
            .take()
            .expect("the name limit");
        assert_eq!(
            rules
                .iter()
                .map(|r| (r.rule.as_str(), r.message.as_deref()))
                .collect::<Vec<_>>(),
            [("size(self.metadata.name) <= 63", Some(NAME_LENGTH_MESSAGE))]
        );
        assert_eq!(
            controller_schema.title.take().as_deref(),
            Some("ControllerRing")
        );
        controller_schema.title = Some("ClusterRing".to_owned());
        assert_eq!(
            controller_schema,
            schema(&cluster),
            "the same schema otherwise"
        );
        assert_eq!(
            controller.spec.versions[0].additional_printer_columns,
            cluster.spec.versions[0].additional_printer_columns
        );
    }

    #[test]
    fn spec_round_trips_the_wire_format_of_the_seed() {
        let yaml = r#"
apiVersion: sharding.timebertt.dev/v1alpha1
kind: ClusterRing
metadata:
  name: kube-controller-manager-deployment
spec:
  resources:
  - group: apps
    resource: deployments
    controlledResources:
    - group: apps
      resource: replicasets
"#;
        let ring: ClusterRing = serde_yaml::from_str(yaml).expect("valid");
        assert_eq!(
            ring.spec.resources,
            [RingResource {
                group: "apps".into(),
                resource: "deployments".into(),
                controlled_resources: vec![GroupResource::new("apps", "replicasets")],
            }]
        );
        assert!(ring.spec.validate().is_ok());
        assert_eq!(
            crate::RingObject::cluster_ring(ring).labels().shard,
            "shard.alpha.sharding.timebertt.dev/clusterring-9b5084f8-kube-controller-manager-deployment"
        );
    }

    #[test]
    fn core_group_may_be_omitted() {
        let spec: ClusterRingSpec =
            serde_json::from_str(r#"{"resources":[{"resource":"secrets"}]}"#).expect("valid");
        assert_eq!(spec.resources[0].main(), GroupResource::new("", "secrets"));
        assert_eq!(spec.resources[0].main().to_string(), "secrets");
        assert_eq!(
            GroupResource::new("apps", "deployments").to_string(),
            "deployments.apps"
        );
    }

    #[test]
    fn status_serializes_in_camel_case() {
        let status = ClusterRingStatus {
            observed_generation: Some(3),
            shards: Some(4),
            available_shards: Some(2),
            conditions: vec![],
        };
        assert_eq!(
            serde_json::to_value(&status).expect("serializable"),
            serde_json::json!({"observedGeneration": 3, "shards": 4, "availableShards": 2})
        );
    }

    #[test]
    fn invalid_specs_are_rejected_with_the_path_to_fix() {
        let table = [
            (
                vec![resource("", "", &[])],
                "spec.resources[0].resource must not be empty",
            ),
            (
                vec![resource("", "secrets", &[]), resource("", "secrets", &[])],
                "spec.resources[1] lists secrets twice",
            ),
            (
                vec![resource("", "secrets", &[("", "")])],
                "spec.resources[0].controlledResources[0].resource must not be empty",
            ),
            (
                vec![resource(
                    "",
                    "secrets",
                    &[("", "configmaps"), ("", "configmaps")],
                )],
                "spec.resources[0].controlledResources lists configmaps twice",
            ),
            (
                // [A{controlledResources:[B]}, B]: B would be keyed by its owner and by itself.
                vec![
                    resource("", "secrets", &[("", "configmaps")]),
                    resource("", "configmaps", &[]),
                ],
                "spec.resources[0].controlledResources[0] lists configmaps, which \
                 spec.resources[1] lists as a main resource: a resource is either sharded by \
                 its own key or follows its controller, not both",
            ),
            (
                // The same the other way round, and a resource controlling itself.
                vec![
                    resource("", "configmaps", &[]),
                    resource("", "secrets", &[("", "configmaps")]),
                ],
                "spec.resources[1].controlledResources[0] lists configmaps, which \
                 spec.resources[0] lists as a main resource: a resource is either sharded by \
                 its own key or follows its controller, not both",
            ),
            (
                vec![resource("apps", "deployments", &[("apps", "deployments")])],
                "spec.resources[0].controlledResources[0] lists deployments.apps, which \
                 spec.resources[0] lists as a main resource: a resource is either sharded by \
                 its own key or follows its controller, not both",
            ),
        ];
        for (resources, want) in table {
            let spec = ClusterRingSpec {
                resources,
                namespace_selector: None,
            };
            let err = spec.validate().expect_err("invalid");
            assert_eq!(err.to_string(), format!("invalid ring: {want}"));
            assert!(spec.roles().is_err(), "no roles for an invalid spec");
        }
    }

    fn resource(group: &str, name: &str, children: &[(&str, &str)]) -> RingResource {
        RingResource {
            group: group.into(),
            resource: name.into(),
            controlled_resources: children
                .iter()
                .map(|(g, r)| GroupResource::new(*g, *r))
                .collect(),
        }
    }

    #[test]
    fn roles_list_main_resources_and_each_controlled_resource_once_in_spec_order() {
        let spec = ClusterRingSpec {
            resources: vec![
                resource(
                    "apps",
                    "deployments",
                    &[("apps", "replicasets"), ("", "configmaps")],
                ),
                resource("", "secrets", &[("", "configmaps")]),
            ],
            namespace_selector: None,
        };
        let roles = spec.roles().expect("valid");
        let listed: Vec<(String, Role)> = roles.iter().map(|(gr, r)| (gr.to_string(), r)).collect();
        assert_eq!(
            listed,
            [
                ("deployments.apps".to_owned(), Role::Main),
                ("replicasets.apps".to_owned(), Role::Controlled),
                ("configmaps".to_owned(), Role::Controlled),
                ("secrets".to_owned(), Role::Main),
            ]
        );
        assert_eq!(roles.get("", "configmaps"), Some(Role::Controlled));
        assert_eq!(roles.get("apps", "deployments"), Some(Role::Main));
        assert_eq!(roles.get("", "deployments"), None, "the group counts");
        assert_eq!(roles.get("apps", "statefulsets"), None);
        assert_eq!(roles.len(), 4);
    }

    #[test]
    fn a_namespace_selector_with_an_unknown_operator_is_rejected() {
        let spec = ClusterRingSpec {
            resources: vec![resource("", "secrets", &[])],
            namespace_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "team".into(),
                        operator: "Gt".into(),
                        values: Some(vec!["1".into()]),
                    },
                ]),
            }),
        };
        let err = spec.validate().expect_err("invalid");
        assert!(
            err.to_string()
                .starts_with("invalid ring: spec.namespaceSelector: "),
            "{err}"
        );
    }

    #[test]
    fn a_namespace_selector_becomes_a_selector_the_apiserver_understands() {
        let spec = ClusterRingSpec {
            resources: vec![resource("", "secrets", &[])],
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
                match_expressions: None,
            }),
        };
        let selector = spec
            .parse_namespace_selector()
            .expect("valid")
            .expect("some");
        assert_eq!(selector.to_string(), "team=a");
        let none = ClusterRingSpec::default();
        assert!(none.parse_namespace_selector().expect("valid").is_none());
    }
}
