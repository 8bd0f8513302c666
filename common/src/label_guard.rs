//! The label guard of one ring (docs/design.md §7, docs/operations.md "Label guard"): a
//! ValidatingAdmissionPolicy and its binding, as a pure function of the ring and the
//! installation's identities, so that only the steps of the protocol change the ring's shard and
//! drain labels. The apiserver evaluates it (CEL, no network hop) on every UPDATE of the ring's
//! resources that changes one of the two labels; every other update is untouched.
//!
//! Allowed: the reconciler, anything; anyone, an unassigned object gaining a shard (the policy
//! runs after mutating admission and cannot tell the webhook's label from the requester's: a
//! wrong placement is corrected by the reconciler's next full list); the shard that holds a
//! draining object, removing its drain (the acknowledgement; the webhook may assign the next
//! shard in the same request), identified by the pod name of its pod-bound token or, for shards
//! outside pods, by being one of the acknowledgers given. Everything else is denied with a
//! message naming the ring and the rule.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::webhook_configuration::{resources_by_group, ring_namespace_selector};
use crate::{RingObject, Roles};

/// The user-info extra key under which a pod-bound ServiceAccount token carries its pod's name.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// Who the guard lets do what, besides the ring itself.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardSettings {
    /// The reconciler's username: every change of the ring's labels is its to make.
    pub reconciler: String,
    /// Users who may acknowledge the drain of any shard's object (shards that run outside pods
    /// and share one identity, so no token names the shard).
    pub acknowledgers: Vec<String>,
    /// The namespaces every ring is limited to.
    pub namespace_selector: LabelSelector,
}

/// `value` as a CEL string literal.
fn cel_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `values` as a CEL list of string literals.
fn cel_list(values: &[String]) -> String {
    let items: Vec<String> = values.iter().map(|v| cel_string(v)).collect();
    format!("[{}]", items.join(", "))
}

/// The label `key` of `object` (`object` or `oldObject`) as a CEL optional.
fn label(object: &str, key: &str) -> String {
    format!("{object}.metadata.?labels[?{}]", cel_string(key))
}

/// The ValidatingAdmissionPolicy of `ring` (whose resources have `roles`) and the binding that
/// puts it in force, named like the ring's webhook configuration and owned by the ring.
pub fn label_guard(
    ring: &RingObject,
    roles: &Roles,
    settings: &GuardSettings,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let id = &ring.id;
    let labels = id.labels();
    let name = id.configuration_name();
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        labels: Some([(id.kind.lease_label().to_owned(), id.name.clone())].into()),
        owner_references: Some(vec![ring.owner_reference()]),
        ..ObjectMeta::default()
    };
    let rules = resources_by_group(roles)
        .into_iter()
        .map(|(group, resources)| NamedRuleWithOperations {
            api_groups: Some(vec![group]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["UPDATE".into()]),
            resources: Some(resources),
            scope: Some("*".into()),
            resource_names: None,
        })
        .collect();
    let (shard, drain) = (&labels.shard, &labels.drain);
    let changes = format!(
        "{old_shard}.orValue('') != {new_shard}.orValue('') || {old_drain}.hasValue() != {new_drain}.hasValue()",
        old_shard = label("oldObject", shard),
        new_shard = label("object", shard),
        old_drain = label("oldObject", drain),
        new_drain = label("object", drain),
    );
    let variable = |name: &str, expression: String| Variable {
        name: name.into(),
        expression,
    };
    let variables = vec![
        variable(
            "oldShard",
            format!("{}.orValue('')", label("oldObject", shard)),
        ),
        variable(
            "oldDrain",
            format!("{}.hasValue()", label("oldObject", drain)),
        ),
        variable("newDrain", format!("{}.hasValue()", label("object", drain))),
        variable(
            "reconciler",
            format!(
                "request.userInfo.username == {}",
                cel_string(&settings.reconciler)
            ),
        ),
        variable(
            "holder",
            format!(
                "variables.oldShard != '' && (variables.oldShard in request.userInfo.?extra[?{}].orValue([]) || request.userInfo.username in {})",
                cel_string(POD_NAME_EXTRA),
                cel_list(&settings.acknowledgers)
            ),
        ),
    ];
    let what = format!("{} {}", id.kind.kind(), id.name);
    let acknowledgers = if settings.acknowledgers.is_empty() {
        String::new()
    } else {
        format!(", or one of {}", settings.acknowledgers.join(", "))
    };
    let to_fix = " (docs/operations.md, \"Label guard\")";
    let acknowledgement = format!(
        "{} + variables.oldShard + {}",
        cel_string(&format!(
            "the labels {shard} and {drain} of {what} are the sharder's: a draining object's drain is acknowledged only by its shard "
        )),
        cel_string(&format!(
            " (a token bound to the pod of that name{acknowledgers}){to_fix}"
        )),
    );
    let moves = cel_string(&format!(
        "the labels {shard} and {drain} of {what} are the sharder's: only the sharder reconciler ({}) moves an object to another shard, drains it or takes its shard away; anyone may give an unassigned object a shard{to_fix}",
        settings.reconciler
    ));
    let message =
        format!("variables.oldDrain && !variables.newDrain ? {acknowledgement} : {moves}");
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                match_policy: Some("Equivalent".into()),
                resource_rules: Some(rules),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "changes-the-ring-s-labels".into(),
                expression: changes,
            }]),
            variables: Some(variables),
            validations: Some(vec![Validation {
                expression: "variables.reconciler || (variables.oldShard == '' && !variables.oldDrain && !variables.newDrain) || (variables.oldDrain && !variables.newDrain && variables.holder)".into(),
                message_expression: Some(message),
                reason: Some("Forbidden".into()),
                message: None,
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(name),
            validation_actions: Some(vec!["Deny".into()]),
            match_resources: Some(MatchResources {
                namespace_selector: Some(ring_namespace_selector(
                    &ring.object.spec,
                    &settings.namespace_selector,
                )),
                ..MatchResources::default()
            }),
            param_ref: None,
        }),
    };
    (policy, binding)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::{ClusterRing, ClusterRingSpec, GroupResource, RingResource};

    use super::*;

    fn ring() -> RingObject {
        let mut ring = ClusterRing::new(
            "example",
            ClusterRingSpec {
                resources: vec![RingResource {
                    group: "apps".into(),
                    resource: "deployments".into(),
                    controlled_resources: vec![
                        GroupResource::new("apps", "replicasets"),
                        GroupResource::new("", "configmaps"),
                    ],
                }],
                namespace_selector: None,
            },
        );
        ring.metadata.uid = Some("uid-1".into());
        RingObject::cluster_ring(ring)
    }

    fn settings(acknowledgers: &[&str]) -> GuardSettings {
        GuardSettings {
            reconciler: "system:serviceaccount:sharder:reconciler".into(),
            acknowledgers: acknowledgers.iter().map(|a| (*a).to_owned()).collect(),
            namespace_selector: LabelSelector::default(),
        }
    }

    #[test]
    fn a_cel_string_literal_escapes_what_would_end_or_break_it() {
        for (value, literal) in [
            ("plain", "'plain'"),
            ("it's", r"'it\'s'"),
            (r"a\b", r"'a\\b'"),
            ("two\nlines", r"'two\nlines'"),
            ("", "''"),
        ] {
            assert_eq!(cel_string(value), literal, "{value:?}");
        }
        assert_eq!(cel_list(&[]), "[]");
        assert_eq!(cel_list(&["a".into(), "b'".into()]), r"['a', 'b\'']");
    }

    #[test]
    fn the_policy_watches_updates_of_the_ring_s_resources_that_change_its_labels() {
        let ring = ring();
        let roles = ring.roles().expect("roles");
        let (policy, binding) = label_guard(&ring, &roles, &settings(&[]));
        let name = ring.id.configuration_name();
        assert_eq!(policy.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(binding.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(
            policy.metadata.owner_references,
            Some(vec![ring.owner_reference()])
        );
        let spec = policy.spec.expect("a spec");
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let rules = spec
            .match_constraints
            .and_then(|m| m.resource_rules)
            .expect("rules");
        let seen: Vec<(Vec<String>, Vec<String>, Vec<String>)> = rules
            .into_iter()
            .map(|r| {
                (
                    r.api_groups.unwrap_or_default(),
                    r.resources.unwrap_or_default(),
                    r.operations.unwrap_or_default(),
                )
            })
            .collect();
        let update = vec!["UPDATE".to_owned()];
        assert_eq!(
            seen,
            [
                (
                    vec![String::new()],
                    vec!["configmaps".into()],
                    update.clone()
                ),
                (
                    vec!["apps".into()],
                    vec!["deployments".into(), "replicasets".into()],
                    update
                ),
            ]
        );
        let labels = ring.id.labels();
        let condition = &spec.match_conditions.expect("a condition")[0].expression;
        for key in [&labels.shard, &labels.drain] {
            assert!(condition.contains(&format!("oldObject.metadata.?labels[?'{key}']")));
            assert!(condition.contains(&format!(" object.metadata.?labels[?'{key}']")));
        }
        let binding = binding.spec.expect("a binding spec");
        assert_eq!(binding.policy_name, Some(name));
        assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
        assert!(
            binding
                .match_resources
                .and_then(|m| m.namespace_selector)
                .is_some(),
            "the ring's namespaces"
        );
    }

    #[test]
    fn the_reconciler_the_pod_bound_shard_and_the_acknowledgers_are_named_in_the_rules() {
        let ring = ring();
        let roles = ring.roles().expect("roles");
        for (acknowledgers, list, mentioned) in [
            (vec![], "[]", ""),
            (
                vec!["shards", "o'brien"],
                r"['shards', 'o\'brien']",
                r", or one of shards, o\'brien",
            ),
        ] {
            let (policy, _) = label_guard(&ring, &roles, &settings(&acknowledgers));
            let spec = policy.spec.expect("a spec");
            let variables: BTreeMap<String, String> = spec
                .variables
                .expect("variables")
                .into_iter()
                .map(|v| (v.name, v.expression))
                .collect();
            assert_eq!(
                variables["reconciler"],
                "request.userInfo.username == 'system:serviceaccount:sharder:reconciler'"
            );
            assert!(
                variables["holder"]
                    .contains(&format!("request.userInfo.?extra[?'{POD_NAME_EXTRA}']"))
                    && variables["holder"]
                        .ends_with(&format!("request.userInfo.username in {list})")),
                "{}",
                variables["holder"]
            );
            let validation = &spec.validations.expect("a validation")[0];
            let message = validation.message_expression.as_deref().unwrap_or_default();
            assert!(
                message.contains(&format!(
                    "(a token bound to the pod of that name{mentioned})"
                )),
                "{message}"
            );
            assert!(message.contains("ClusterRing example"), "{message}");
        }
    }
}
