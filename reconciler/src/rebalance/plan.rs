//! What to do with one object (docs/design.md §5), as a pure function of its metadata and the ring.

use std::collections::BTreeSet;
use std::fmt;

use kube::api::ObjectMeta;
use serde_json::{Value, json};
use sharder_common::{ObjectKey, Ring, RingLabels, Role};

/// Why an object moves (the `reason` of the move log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Moved off a live shard for rebalancing (a drain for main objects, a direct assignment
    /// for controlled objects, which follow their owner).
    Drain,
    /// Its shard is not available any more.
    DeadShard,
    /// It had no shard.
    Unassigned,
}

impl Reason {
    /// The reason as a log and metric value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::DeadShard => "dead-shard",
            Self::Unassigned => "unassigned",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The write one object needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// Add the drain label; the current shard acknowledges by removing both labels, and the
    /// webhook (or the next unassigned sweep) assigns the desired shard.
    Drain {
        /// The current (live) shard.
        from: String,
        /// The shard the ring wants.
        to: String,
    },
    /// Set the shard label and remove the drain label in one write.
    Assign {
        /// The current shard, if any.
        from: Option<String>,
        /// The shard the ring wants.
        to: String,
        /// Why.
        reason: Reason,
    },
}

impl Move {
    /// The merge patch for the move, carrying `resource_version` as optimistic lock.
    pub fn patch(&self, labels: &RingLabels, resource_version: &str) -> Value {
        match self {
            Self::Drain { .. } => json!({"metadata": {
                "resourceVersion": resource_version,
                "labels": {labels.drain.as_str(): "true"},
            }}),
            Self::Assign { to, .. } => json!({"metadata": {
                "resourceVersion": resource_version,
                "labels": {labels.shard.as_str(): to, labels.drain.as_str(): Value::Null},
            }}),
        }
    }
}

/// The object's key on the ring, or `None` when it has none (no name yet, no controller
/// reference, or a malformed one: such objects are left alone).
pub fn key_of(meta: &ObjectMeta, role: Role, group: &str, kind: &str) -> Option<ObjectKey> {
    ObjectKey::of(role, group, kind, meta.namespace.as_deref(), meta)
        .ok()
        .flatten()
}

/// The move `meta` needs, or `None` if it stays: no key, no shard available, already on its
/// desired shard, or already draining.
pub fn plan(
    meta: &ObjectMeta,
    key: Option<&ObjectKey>,
    role: Role,
    ring: &Ring,
    available: &BTreeSet<String>,
    labels: &RingLabels,
) -> Option<Move> {
    let desired = ring.shard_for(key?.as_str())?;
    let object_labels = meta.labels.as_ref();
    let current = object_labels.and_then(|l| l.get(&labels.shard));
    let draining = object_labels.is_some_and(|l| l.contains_key(&labels.drain));
    match current {
        Some(current) if current == desired && !draining => None,
        Some(current) if available.contains(current) && current != desired => match role {
            Role::Main if draining => None,
            Role::Main => Some(Move::Drain {
                from: current.clone(),
                to: desired.to_owned(),
            }),
            Role::Controlled => Some(Move::Assign {
                from: Some(current.clone()),
                to: desired.to_owned(),
                reason: Reason::Drain,
            }),
        },
        // On its desired shard but with a leftover drain label: clear it by re-assigning.
        Some(current) if available.contains(current) => Some(Move::Assign {
            from: Some(current.clone()),
            to: desired.to_owned(),
            reason: Reason::Drain,
        }),
        Some(current) => Some(Move::Assign {
            from: Some(current.clone()),
            to: desired.to_owned(),
            reason: Reason::DeadShard,
        }),
        None => Some(Move::Assign {
            from: None,
            to: desired.to_owned(),
            reason: Reason::Unassigned,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn labels() -> RingLabels {
        RingLabels::new("example")
    }

    fn meta(name: &str, shard: Option<&str>, drain: bool) -> ObjectMeta {
        let mut l = BTreeMap::new();
        if let Some(shard) = shard {
            l.insert(labels().shard, shard.to_owned());
        }
        if drain {
            l.insert(labels().drain, "true".to_owned());
        }
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(l),
            ..ObjectMeta::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Finds an object name whose desired shard on `ring` is `want`.
    fn name_on(ring: &Ring, want: &str) -> String {
        (0..1000)
            .map(|i| format!("object-{i}"))
            .find(|n| ring.shard_for(&format!("/Secret/default/{n}")) == Some(want))
            .expect("some object maps to the shard")
    }

    fn run(
        meta: &ObjectMeta,
        role: Role,
        ring: &Ring,
        available: &BTreeSet<String>,
    ) -> Option<Move> {
        let key = key_of(meta, role, "", "Secret");
        plan(meta, key.as_ref(), role, ring, available, &labels())
    }

    #[test]
    fn movement_rules_for_main_objects() {
        let available = set(&["a", "b"]);
        let ring = Ring::new(["a", "b"]);
        let on_a = name_on(&ring, "a");
        let table = [
            ("on its shard", meta(&on_a, Some("a"), false), None),
            (
                "on a live wrong shard",
                meta(&on_a, Some("b"), false),
                Some(Move::Drain {
                    from: "b".into(),
                    to: "a".into(),
                }),
            ),
            ("already draining", meta(&on_a, Some("b"), true), None),
            (
                "on a dead shard",
                meta(&on_a, Some("gone"), false),
                Some(Move::Assign {
                    from: Some("gone".into()),
                    to: "a".into(),
                    reason: Reason::DeadShard,
                }),
            ),
            (
                "draining off a dead shard",
                meta(&on_a, Some("gone"), true),
                Some(Move::Assign {
                    from: Some("gone".into()),
                    to: "a".into(),
                    reason: Reason::DeadShard,
                }),
            ),
            (
                "unassigned",
                meta(&on_a, None, false),
                Some(Move::Assign {
                    from: None,
                    to: "a".into(),
                    reason: Reason::Unassigned,
                }),
            ),
            (
                "unassigned with a leftover drain label",
                meta(&on_a, None, true),
                Some(Move::Assign {
                    from: None,
                    to: "a".into(),
                    reason: Reason::Unassigned,
                }),
            ),
            (
                "on its shard with a leftover drain label",
                meta(&on_a, Some("a"), true),
                Some(Move::Assign {
                    from: Some("a".into()),
                    to: "a".into(),
                    reason: Reason::Drain,
                }),
            ),
        ];
        for (what, meta, want) in table {
            assert_eq!(run(&meta, Role::Main, &ring, &available), want, "{what}");
        }
    }

    #[test]
    fn controlled_objects_follow_their_owner_directly() {
        let ring = Ring::new(["a", "b"]);
        let owner = name_on(&ring, "a");
        let mut child = meta("child", Some("b"), false);
        child.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: owner,
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        assert_eq!(
            run(&child, Role::Controlled, &ring, &set(&["a", "b"])),
            Some(Move::Assign {
                from: Some("b".into()),
                to: "a".into(),
                reason: Reason::Drain
            })
        );
    }

    #[test]
    fn objects_without_key_or_without_shards_stay() {
        let ring = Ring::new(["a"]);
        let orphan = meta("child", None, false);
        assert_eq!(
            run(&orphan, Role::Controlled, &ring, &set(&["a"])),
            None,
            "no controller reference"
        );
        let unnamed = ObjectMeta {
            name: None,
            ..meta("x", None, false)
        };
        assert_eq!(
            run(&unnamed, Role::Main, &ring, &set(&["a"])),
            None,
            "no name"
        );
        let empty = Ring::new(Vec::<String>::new());
        assert_eq!(
            run(
                &meta("x", Some("gone"), false),
                Role::Main,
                &empty,
                &set(&[])
            ),
            None,
            "no shard"
        );
    }

    #[test]
    fn patches_carry_the_resource_version_and_the_right_labels() {
        let l = labels();
        let drain = Move::Drain {
            from: "a".into(),
            to: "b".into(),
        }
        .patch(&l, "42");
        assert_eq!(drain["metadata"]["resourceVersion"], "42");
        assert_eq!(drain["metadata"]["labels"][&l.drain], "true");
        assert!(
            drain["metadata"]["labels"].get(&l.shard).is_none(),
            "a drain keeps the shard label"
        );
        let assign = Move::Assign {
            from: None,
            to: "b".into(),
            reason: Reason::Unassigned,
        }
        .patch(&l, "7");
        assert_eq!(assign["metadata"]["labels"][&l.shard], "b");
        assert_eq!(
            assign["metadata"]["labels"][&l.drain],
            Value::Null,
            "null removes the drain label"
        );
    }
}
