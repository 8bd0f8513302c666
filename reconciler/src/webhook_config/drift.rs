//! How a ring's webhook configuration in the cluster differs from what it should be: deleted,
//! edited (selectors, rules, client config), or still carrying a rotated-out CA bundle. Only the
//! fields the reconciler sets are compared, after dropping empty values, so the apiserver's
//! defaulting and fields other managers own never count as drift (they would make every
//! reconcile write).

use std::fmt;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde_json::Value;

/// What differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Drift {
    /// The configuration does not exist.
    Missing,
    /// These fields differ (`labels`, `ownerReferences`, `webhooks` for a missing webhook, or
    /// a webhook field such as `objectSelector`, `rules`, `clientConfig`, `caBundle`).
    Changed(Vec<String>),
}

impl Drift {
    /// A short reason for metrics: `missing`, `ca_bundle` (only the CA bundle changed: a CA
    /// rotation) or `changed`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Changed(fields) if fields.iter().all(|f| f == "caBundle") => "ca_bundle",
            Self::Changed(_) => "changed",
        }
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => f.write_str("missing"),
            Self::Changed(fields) => write!(f, "{}", fields.join(",")),
        }
    }
}

/// Drops nulls, empty objects and empty arrays, recursively (absent and empty mean the same to
/// the apiserver).
fn normalize(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, normalize(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

fn field(value: &Value, key: &str) -> Value {
    value.get(key).cloned().unwrap_or(Value::Null)
}

/// The webhook fields of `hook` that differ from `want` (only keys `want` sets), with the
/// client config's `caBundle` reported apart from the rest of it.
fn webhook_changes(want: &Value, hook: &Value, changed: &mut Vec<String>) {
    let Some(keys) = want.as_object() else {
        return;
    };
    for (key, wanted) in keys {
        let have = field(hook, key);
        if key == "clientConfig" {
            let without_ca = |v: &Value| {
                let mut v = v.clone();
                if let Some(map) = v.as_object_mut() {
                    map.remove("caBundle");
                }
                normalize(v)
            };
            if field(wanted, "caBundle") != field(&have, "caBundle") {
                changed.push("caBundle".to_owned());
            }
            if without_ca(wanted) != without_ca(&have) {
                changed.push("clientConfig".to_owned());
            }
        } else if normalize(wanted.clone()) != normalize(have) {
            changed.push(key.clone());
        }
    }
}

/// How `existing` (none: absent) differs from `desired`; `None` when it is as it should be.
pub(crate) fn drift(
    existing: Option<&MutatingWebhookConfiguration>,
    desired: &MutatingWebhookConfiguration,
) -> Option<Drift> {
    let Some(existing) = existing else {
        return Some(Drift::Missing);
    };
    let mut changed = Vec::new();
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    if desired
        .metadata
        .labels
        .iter()
        .flatten()
        .any(|(k, v)| labels.get(k) != Some(v))
    {
        changed.push("labels".to_owned());
    }
    let owners = existing
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    if desired
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|want| {
            !owners
                .iter()
                .any(|o| o.uid == want.uid && o.controller == want.controller)
        })
    {
        changed.push("ownerReferences".to_owned());
    }
    let to_value = |v| serde_json::to_value(v).unwrap_or(Value::Null);
    let existing_hooks = existing.webhooks.clone().unwrap_or_default();
    for want in desired.webhooks.iter().flatten() {
        match existing_hooks.iter().find(|h| h.name == want.name) {
            Some(hook) => webhook_changes(&to_value(want), &to_value(hook), &mut changed),
            None => changed.push("webhooks".to_owned()),
        }
    }
    (!changed.is_empty()).then_some(Drift::Changed(changed))
}

/// The field managers of the reference sharder's ring controllers (`controllerring-controller`
/// from v0.9, `clusterring-controller` before): the configurations they applied have the names
/// Sharder's have, and fields Sharder does not set (a Service client config beside Sharder's URL,
/// a cert-manager CA injection annotation, labels) that Sharder's applies would leave in place.
pub(crate) const REFERENCE_MANAGERS: [&str; 2] =
    ["controllerring-controller", "clusterring-controller"];

/// The reference's managers that still own fields of `existing`: before Sharder applies the
/// configuration, each releases them (an apply as that manager with no fields), so nothing of
/// the reference's is left in it.
pub(crate) fn previous_managers(existing: &MutatingWebhookConfiguration) -> Vec<String> {
    let mut managers: Vec<String> = existing
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .filter(|manager| REFERENCE_MANAGERS.contains(&manager.as_str()))
        .collect();
    managers.sort_unstable();
    managers.dedup();
    managers
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use sharder_common::{ClusterRing, ClusterRingSpec, GroupResource, RingResource};

    use super::*;
    use sharder_common::webhook_configuration::{
        WebhookSettings, WebhookTarget, webhook_configuration,
    };

    fn desired(ca: &[u8]) -> MutatingWebhookConfiguration {
        let mut ring = ClusterRing::new(
            "example",
            ClusterRingSpec {
                resources: vec![RingResource {
                    group: String::new(),
                    resource: "secrets".into(),
                    controlled_resources: vec![GroupResource::new("", "configmaps")],
                }],
                namespace_selector: None,
            },
        );
        ring.metadata.uid = Some("ring-uid".into());
        let ring = sharder_common::RingObject::cluster_ring(ring);
        let roles = ring.roles().expect("roles");
        webhook_configuration(
            &ring,
            &roles,
            &WebhookSettings {
                target: WebhookTarget::Url("https://127.0.0.1:9443".into()),
                ca_bundle: ca.to_vec(),
                timeout_seconds: 5,
                namespace_selector: LabelSelector::default(),
            },
        )
    }

    /// `desired` as the apiserver returns it: defaults filled in, empty values dropped, a field
    /// of another manager's, metadata the server sets.
    fn as_stored(mut mwc: MutatingWebhookConfiguration) -> MutatingWebhookConfiguration {
        mwc.metadata.resource_version = Some("7".into());
        mwc.metadata.uid = Some("mwc-uid".into());
        mwc.metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "platform".into());
        for hook in mwc.webhooks.iter_mut().flatten() {
            hook.match_conditions = Some(Vec::new());
            if let Some(selector) = hook.object_selector.as_mut() {
                selector.match_labels = Some(Default::default());
            }
        }
        mwc
    }

    fn edit(
        mut mwc: MutatingWebhookConfiguration,
        f: impl FnOnce(&mut k8s_openapi::api::admissionregistration::v1::MutatingWebhook),
    ) -> MutatingWebhookConfiguration {
        f(&mut mwc.webhooks.as_mut().expect("webhooks")[0]);
        mwc
    }

    #[test]
    fn a_stored_copy_with_defaults_and_other_labels_has_no_drift() {
        let want = desired(b"ca-1");
        assert_eq!(drift(Some(&as_stored(want.clone())), &want), None);
    }

    #[test]
    fn each_kind_of_drift_is_named() {
        let want = desired(b"ca-1");
        let stored = as_stored(want.clone());
        let cases: Vec<(&str, MutatingWebhookConfiguration, Drift)> = vec![
            (
                "object selector removed",
                edit(stored.clone(), |h| {
                    h.object_selector = Some(LabelSelector::default());
                }),
                Drift::Changed(vec!["objectSelector".into()]),
            ),
            (
                "rules emptied",
                edit(stored.clone(), |h| h.rules = None),
                Drift::Changed(vec!["rules".into()]),
            ),
            (
                "CA bundle of a rotated-out CA",
                desired(b"ca-0"),
                Drift::Changed(vec!["caBundle".into()]),
            ),
            (
                "URL and CA changed",
                edit(stored.clone(), |h| {
                    h.client_config.url = Some("https://elsewhere".into());
                    h.client_config.ca_bundle = Some(ByteString(b"other".to_vec()));
                }),
                Drift::Changed(vec!["caBundle".into(), "clientConfig".into()]),
            ),
            (
                "failure policy",
                edit(stored.clone(), |h| h.failure_policy = Some("Fail".into())),
                Drift::Changed(vec!["failurePolicy".into()]),
            ),
            (
                "webhook renamed",
                edit(stored.clone(), |h| h.name = "other.example.com".into()),
                Drift::Changed(vec!["webhooks".into()]),
            ),
            (
                "ring label and owner removed",
                {
                    let mut m = stored.clone();
                    m.metadata.labels = None;
                    m.metadata.owner_references = None;
                    m
                },
                Drift::Changed(vec!["labels".into(), "ownerReferences".into()]),
            ),
        ];
        for (name, existing, expected) in cases {
            assert_eq!(drift(Some(&existing), &want), Some(expected), "{name}");
        }
        assert_eq!(drift(None, &want), Some(Drift::Missing));
    }

    #[test]
    fn reasons_tell_a_ca_rotation_from_other_changes() {
        assert_eq!(Drift::Missing.reason(), "missing");
        assert_eq!(
            Drift::Changed(vec!["caBundle".into()]).reason(),
            "ca_bundle"
        );
        assert_eq!(
            Drift::Changed(vec!["caBundle".into(), "rules".into()]).reason(),
            "changed"
        );
        assert_eq!(
            Drift::Changed(vec!["caBundle".into(), "rules".into()]).to_string(),
            "caBundle,rules"
        );
    }

    #[test]
    fn the_reference_s_managers_are_found_and_no_other() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let managed = |managers: &[&str]| {
            let mut mwc = desired(b"ca-1");
            mwc.metadata.managed_fields = Some(
                managers
                    .iter()
                    .map(|m| ManagedFieldsEntry {
                        manager: Some((*m).to_owned()),
                        operation: Some("Apply".into()),
                        ..ManagedFieldsEntry::default()
                    })
                    .collect(),
            );
            previous_managers(&mwc)
        };
        let cases: [(&[&str], &[&str]); 5] = [
            (&[], &[]),
            (&["sharder-reconciler"], &[]),
            (&["sharder-reconciler", "kubectl-edit"], &[]),
            (
                &["controllerring-controller", "sharder-reconciler"],
                &["controllerring-controller"],
            ),
            (
                &[
                    "clusterring-controller",
                    "controllerring-controller",
                    "clusterring-controller",
                ],
                &["clusterring-controller", "controllerring-controller"],
            ),
        ];
        for (managers, want) in cases {
            assert_eq!(managed(managers), want, "{managers:?}");
        }
        assert!(
            previous_managers(&desired(b"ca-1")).is_empty(),
            "no managed fields"
        );
    }
}
