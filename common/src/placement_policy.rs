//! Assignment without a webhook for a ring keyed by namespace: a MutatingAdmissionPolicy and
//! its binding that give an unassigned object of the ring the shard its namespace has in a table
//! (a ConfigMap, namespace -> shard), inside the apiserver: no network hop, nothing to be
//! unreachable. The table leaves out a namespace whose objects are moving, so its new objects
//! stay unassigned until the move is done and the reconciler assigns them. The policy API is
//! `admissionregistration.k8s.io/v1` from Kubernetes 1.36 on; the objects are built as JSON, as
//! the API version this crate is built against does not have it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::key::ObjectKey;
use crate::webhook_configuration::{resources_by_group, ring_namespace_selector};
use crate::{Ring, RingObject, Roles};

/// The policy's kind, served from Kubernetes 1.36 on.
pub fn policy_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingAdmissionPolicy",
    );
    ApiResource::from_gvk_with_plural(&gvk, "mutatingadmissionpolicies")
}

/// The binding's kind.
pub fn binding_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingAdmissionPolicyBinding",
    );
    ApiResource::from_gvk_with_plural(&gvk, "mutatingadmissionpolicybindings")
}

/// Where a ring's table lives: a ConfigMap in the sharder's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// The sharder's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl Table {
    /// The table of `ring` in `namespace`: named like the ring's webhook configuration.
    pub fn of(ring: &RingObject, namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: ring.id.configuration_name(),
        }
    }
}

/// The table's entries: each of `namespaces` with the shard `ring` picks for it, but those in
/// `moving` (whose objects are not all on their shard yet).
pub fn entries<'a>(
    ring: &Ring,
    namespaces: impl IntoIterator<Item = &'a str>,
    moving: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    namespaces
        .into_iter()
        .filter(|ns| !moving.contains(*ns))
        .filter_map(|ns| {
            let shard = ring.shard_for(ObjectKey::namespace(ns).as_str())?;
            Some((ns.to_owned(), shard.to_owned()))
        })
        .collect()
}

/// `key` as one token of a JSON pointer (RFC 6901).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The MutatingAdmissionPolicy of `ring` (whose resources have `roles`) and the binding that
/// puts it in force with `table`, named like the ring's webhook configuration and owned by the
/// ring; `namespace_selector` limits every ring as the webhook configuration's does.
pub fn placement_policy(
    ring: &RingObject,
    roles: &Roles,
    table: &Table,
    namespace_selector: &LabelSelector,
) -> (DynamicObject, DynamicObject) {
    let id = &ring.id;
    let labels = id.labels();
    let name = id.configuration_name();
    let metadata = json!({
        "name": name,
        "labels": {id.kind.lease_label(): id.name},
        "ownerReferences": [ring.owner_reference()],
    });
    let rules: Vec<_> = resources_by_group(roles)
        .into_iter()
        .map(|(group, resources)| {
            json!({
                "apiGroups": [group],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": resources,
                "scope": "*",
            })
        })
        .collect();
    let (shard, drain) = (pointer_token(&labels.shard), pointer_token(&labels.drain));
    let patch = format!(
        "(has(object.metadata.labels) ? [] : [JSONPatch{{op: 'add', path: '/metadata/labels', value: {{}}}}]) + \
         [JSONPatch{{op: 'add', path: '/metadata/labels/{shard}', value: params.data[object.metadata.namespace]}}] + \
         (has(object.metadata.labels) && '{drain_key}' in object.metadata.labels ? [JSONPatch{{op: 'remove', path: '/metadata/labels/{drain}'}}] : [])",
        drain_key = labels.drain,
    );
    let selector = ring_namespace_selector(&ring.object.spec, namespace_selector);
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": metadata,
        "spec": {
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": rules,
                "namespaceSelector": selector,
                "objectSelector": {"matchExpressions": [
                    {"key": labels.shard, "operator": "DoesNotExist"}
                ]},
            },
            "matchConditions": [{
                "name": "the-namespace-has-a-shard",
                "expression": "params != null && has(params.data) && has(object.metadata.namespace) && object.metadata.namespace in params.data",
            }],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": metadata,
        "spec": {
            "policyName": name,
            "paramRef": {
                "name": table.name,
                "namespace": table.namespace,
                "parameterNotFoundAction": "Allow",
            },
        },
    });
    let object = |value| {
        serde_json::from_value::<DynamicObject>(value).unwrap_or_else(|e| {
            unreachable!("a policy object built from JSON literals parses: {e}")
        })
    };
    (object(policy), object(binding))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterRing, ClusterRingSpec, GroupResource, RingResource};

    fn ring() -> RingObject {
        let spec = ClusterRingSpec {
            resources: vec![RingResource {
                group: String::new(),
                resource: "secrets".into(),
                controlled_resources: vec![GroupResource::new("", "configmaps")],
            }],
            namespace_selector: None,
        };
        let mut object = ClusterRing::new("example", spec);
        object.metadata.uid = Some("uid-1".into());
        RingObject::cluster_ring(object)
    }

    #[test]
    fn a_namespace_is_in_the_table_with_its_shard_unless_its_objects_are_moving() {
        let ring = Ring::new(["shard-a", "shard-b", "shard-c"]);
        let moving: BTreeSet<String> = ["team-2".to_owned()].into();
        let table = entries(&ring, ["team-1", "team-2", "team-3"], &moving);
        let want = |ns: &str| {
            ring.shard_for(ObjectKey::namespace(ns).as_str())
                .expect("a shard")
                .to_owned()
        };
        assert_eq!(
            table,
            [
                ("team-1".to_owned(), want("team-1")),
                ("team-3".to_owned(), want("team-3")),
            ]
            .into()
        );
        let empty = Ring::new(std::iter::empty::<String>());
        assert!(
            entries(&empty, ["team-1"], &BTreeSet::new()).is_empty(),
            "no shard: no entry"
        );
    }

    #[test]
    fn the_policy_labels_unassigned_objects_of_the_rings_resources_from_the_table() {
        let ring = ring();
        let roles = ring.roles().expect("valid");
        let table = Table::of(&ring, "sharder");
        let (policy, binding) = placement_policy(&ring, &roles, &table, &LabelSelector::default());
        let spec = &policy.data["spec"];
        let shard_label = ring.labels().shard;
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some("sharder-clusterring-50d858e0-example")
        );
        assert_eq!(
            policy.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(spec["paramKind"]["kind"], "ConfigMap");
        assert_eq!(spec["failurePolicy"], "Ignore");
        assert_eq!(
            spec["matchConstraints"]["resourceRules"][0]["resources"],
            json!(["configmaps", "secrets"])
        );
        assert_eq!(
            spec["matchConstraints"]["objectSelector"]["matchExpressions"][0]["key"],
            shard_label
        );
        let patch = spec["mutations"][0]["jsonPatch"]["expression"]
            .as_str()
            .expect("an expression");
        assert!(
            patch.contains(
                "/metadata/labels/shard.alpha.sharding.timebertt.dev~1clusterring-50d858e0-example'"
            ),
            "{patch}"
        );
        assert!(
            patch.contains(
                "/metadata/labels/drain.alpha.sharding.timebertt.dev~1clusterring-50d858e0-example'"
            ),
            "{patch}"
        );
        assert_eq!(
            binding.data["spec"]["policyName"],
            policy.metadata.name.clone().unwrap_or_default()
        );
        assert_eq!(binding.data["spec"]["paramRef"]["namespace"], "sharder");
        assert_eq!(binding.data["spec"]["paramRef"]["name"], table.name);
    }
}
