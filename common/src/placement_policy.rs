//! Assignment without a webhook for a ring keyed by namespace: a MutatingAdmissionPolicy and
//! its binding that give an unassigned object of the ring the shard its namespace has in a table
//! (a ConfigMap, namespace -> shard), inside the apiserver: no network hop, nothing to be
//! unreachable. The apiserver runs it before the mutating webhooks, and the webhook's object
//! selector then skips what it labelled: the webhook is asked only for namespaces without an
//! entry (new ones, and those whose objects are moving, [`next_entries`]). The policy API is
//! `admissionregistration.k8s.io/v1` from Kubernetes 1.36 on; the objects are built as JSON, as
//! the API version this crate is built against does not have it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
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

/// The table's next entries, from its `current` ones and the `ring` of the `available`
/// shards: a namespace keeps an entry that names its shard; an entry naming a shard that is
/// gone names the namespace's new shard at once (its objects move directly, as off any dead
/// shard); an entry naming another live shard is left out while its objects move (the webhook
/// places the namespace's new objects meanwhile, children with their owners). Once the ring is
/// `settled` (no drain pending, nothing to try again), every one of the ring's `namespaces` has
/// its shard, and a namespace the ring no longer selects has none; until then no entry is added.
pub fn next_entries(
    current: &BTreeMap<String, String>,
    ring: &Ring,
    available: &BTreeSet<String>,
    namespaces: &BTreeSet<String>,
    settled: bool,
) -> BTreeMap<String, String> {
    let shard_of = |ns: &str| ring.shard_for(ObjectKey::namespace(ns).as_str());
    if settled {
        return namespaces
            .iter()
            .filter_map(|ns| Some((ns.clone(), shard_of(ns)?.to_owned())))
            .collect();
    }
    current
        .iter()
        .filter_map(|(ns, shard)| {
            let desired = shard_of(ns)?;
            (shard == desired || !available.contains(shard))
                .then(|| (ns.clone(), desired.to_owned()))
        })
        .collect()
}

/// The table of `ring` holding `entries`, owned by the ring (it goes with it) and labelled with
/// it.
pub fn table_object(
    ring: &RingObject,
    table: &Table,
    entries: BTreeMap<String, String>,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(table.name.clone()),
            namespace: Some(table.namespace.clone()),
            labels: Some([(ring.id.kind.lease_label().to_owned(), ring.id.name.clone())].into()),
            owner_references: Some(vec![ring.owner_reference()]),
            ..ObjectMeta::default()
        },
        data: Some(entries),
        ..ConfigMap::default()
    }
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
    fn the_table_follows_the_ring_and_leaves_out_namespaces_while_their_objects_move() {
        let two = Ring::new(["shard-a", "shard-b"]);
        let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
        let shard = |ring: &Ring, ns: &str| {
            ring.shard_for(ObjectKey::namespace(ns).as_str())
                .expect("a shard")
                .to_owned()
        };
        let names = |ns: &[&str]| ns.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        let all = (0..40)
            .map(|i| format!("team-{i}"))
            .collect::<BTreeSet<_>>();
        let on = |ring: &Ring, ns: &BTreeSet<String>| {
            ns.iter()
                .map(|n| (n.clone(), shard(ring, n)))
                .collect::<BTreeMap<_, _>>()
        };
        let moving: BTreeSet<String> = all
            .iter()
            .filter(|ns| shard(&two, ns) != shard(&three, ns))
            .cloned()
            .collect();
        assert!(!moving.is_empty() && moving.len() < all.len());
        let staying: BTreeSet<String> = all.difference(&moving).cloned().collect();
        let from_a_and_b = on(&two, &all);
        // A dead shard-b: its namespaces go to their new shard at once.
        let only_a = Ring::new(["shard-a"]);
        let on_a: BTreeMap<String, String> = all
            .iter()
            .map(|n| (n.clone(), "shard-a".to_owned()))
            .collect();
        let cases = [
            (
                "settled: every namespace with its shard",
                BTreeMap::new(),
                &all,
                &three,
                names(&["shard-a", "shard-b", "shard-c"]),
                true,
                on(&three, &all),
            ),
            (
                "a shard joins: the namespaces that move are left out",
                from_a_and_b.clone(),
                &all,
                &three,
                names(&["shard-a", "shard-b", "shard-c"]),
                false,
                on(&three, &staying),
            ),
            (
                "while moving, nothing is added",
                on(&three, &staying),
                &all,
                &three,
                names(&["shard-a", "shard-b", "shard-c"]),
                false,
                on(&three, &staying),
            ),
            (
                "a shard dies: its namespaces name the new shard at once",
                from_a_and_b.clone(),
                &all,
                &only_a,
                names(&["shard-a"]),
                false,
                on_a,
            ),
            (
                "settled: a namespace the ring no longer selects goes",
                from_a_and_b.clone(),
                &staying,
                &two,
                names(&["shard-a", "shard-b"]),
                true,
                on(&two, &staying),
            ),
            (
                "no shard: no entry",
                from_a_and_b,
                &all,
                &Ring::new(std::iter::empty::<String>()),
                BTreeSet::new(),
                false,
                BTreeMap::new(),
            ),
        ];
        for (case, current, namespaces, ring, available, settled, want) in cases {
            assert_eq!(
                next_entries(&current, ring, &available, namespaces, settled),
                want,
                "{case}"
            );
        }
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
