//! What to do with one object (docs/design.md §6), as a pure function of its metadata and the ring.

use std::collections::BTreeSet;
use std::fmt;

use kube::api::ObjectMeta;
use serde_json::{Value, json};
use sharder_common::handover::{OwnerState, child_shard};
use sharder_common::{Keying, ObjectKey, Ring, RingLabels, Role};

/// Why an object moves (the `reason` of the move log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reason {
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
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) enum Move {
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
    pub(crate) fn patch(&self, labels: &RingLabels, resource_version: &str) -> Value {
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

/// The object's key on a ring hashing as `keying` says, or `None` when it has none (no name
/// yet, no controller reference, or a malformed one: such objects are left alone).
pub(crate) fn key_of(
    keying: Keying,
    meta: &ObjectMeta,
    role: Role,
    group: &str,
    kind: &str,
) -> Option<ObjectKey> {
    ObjectKey::of(keying, role, group, kind, meta.namespace.as_deref(), meta)
        .ok()
        .flatten()
}

/// The move a **main** object `meta` needs, or `None` if it stays: no key, no shard available,
/// already on its desired shard, or already draining (its shard acknowledges).
fn plan(
    meta: &ObjectMeta,
    key: Option<&ObjectKey>,
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
        Some(current) if available.contains(current) && current != desired => {
            (!draining).then(|| Move::Drain {
                from: current.clone(),
                to: desired.to_owned(),
            })
        }
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

/// What one object needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// This write.
    Move(Move),
    /// Nothing now.
    Stay,
    /// Nothing yet: a controlled object waits on a live shard for its owner to settle on its
    /// new shard (look again soon).
    AwaitOwner,
    /// A controlled object whose owner's state decides: read the owner, then decide again.
    ReadOwner,
}

/// How an object is placed on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A main object: by its own key.
    Main,
    /// A controlled object whose controller is a main object of the ring or not of the ring:
    /// by its controller's key, with its controller's current holder.
    Child,
    /// A controlled object whose controller is a controlled object of the ring (a level of a
    /// chain): with its controller's current holder alone, once that level is in place
    /// (`OwnerState::as_chain_level`).
    Chained,
}

/// What object `meta` (its key on the ring `key`, its `placement`) needs, as a pure function of
/// its labels, the ring, the `available` shards and, for a controlled object whose owner
/// decides, the owner's state (`None`: not read yet, then [`Decision::ReadOwner`]).
pub(crate) fn decide(
    meta: &ObjectMeta,
    key: Option<&ObjectKey>,
    placement: Placement,
    ring: &Ring,
    available: &BTreeSet<String>,
    labels: &RingLabels,
    owner: Option<&OwnerState>,
) -> Decision {
    match (placement, owner) {
        (Placement::Main, _) => {
            plan(meta, key, ring, available, labels).map_or(Decision::Stay, Decision::Move)
        }
        (Placement::Child, owner) => {
            match (plan_child(meta, key, ring, available, labels), owner) {
                (Some(decided), _) => decided,
                (None, None) => Decision::ReadOwner,
                (None, Some(owner)) => follow_owner(meta, key, ring, available, labels, owner),
            }
        }
        (Placement::Chained, None) => Decision::ReadOwner,
        (Placement::Chained, Some(owner)) => follow_chain(meta, available, labels, owner),
    }
}

/// The first step for a **controlled** object `meta`: what can be decided without its owner
/// (`Some`), or `None` when the owner's state decides.
///
/// A child on its desired shard stays; a leftover drain label is cleared; a child on a dead
/// shard moves to its desired shard at once (1 write; its owner moves there directly too).
fn plan_child(
    meta: &ObjectMeta,
    key: Option<&ObjectKey>,
    ring: &Ring,
    available: &BTreeSet<String>,
    labels: &RingLabels,
) -> Option<Decision> {
    let Some(desired) = key.and_then(|k| ring.shard_for(k.as_str())) else {
        return Some(Decision::Stay);
    };
    let object_labels = meta.labels.as_ref();
    let current = object_labels.and_then(|l| l.get(&labels.shard));
    let draining = object_labels.is_some_and(|l| l.contains_key(&labels.drain));
    let assign = |reason| {
        Some(Decision::Move(Move::Assign {
            from: current.cloned(),
            to: desired.to_owned(),
            reason,
        }))
    };
    match current {
        Some(current) if current == desired && !draining => Some(Decision::Stay),
        Some(current) if current == desired => assign(Reason::Drain),
        Some(current) if !available.contains(current) => assign(Reason::DeadShard),
        _ => None,
    }
}

/// The second step for a controlled object whose first step needed its owner: it follows its
/// owner's current holder ([`child_shard`]), never ahead of it. Already there (the owner has
/// yet to move, or is draining off that shard): it waits. No holder: an assigned child waits,
/// an unassigned one stays unassigned until the next sweep; a child whose owner is missing
/// stays (the garbage collector removes it, or the owner appears).
fn follow_owner(
    meta: &ObjectMeta,
    key: Option<&ObjectKey>,
    ring: &Ring,
    available: &BTreeSet<String>,
    labels: &RingLabels,
    owner: &OwnerState,
) -> Decision {
    let Some(desired) = key.and_then(|k| ring.shard_for(k.as_str())) else {
        return Decision::Stay;
    };
    let current = meta.labels.as_ref().and_then(|l| l.get(&labels.shard));
    match (
        child_shard(owner, desired, |s| available.contains(s)),
        current,
    ) {
        (Some(to), Some(current)) if current == to => Decision::AwaitOwner,
        (Some(to), current) => Decision::Move(Move::Assign {
            from: current.cloned(),
            to: to.to_owned(),
            reason: if current.is_some() {
                Reason::Drain
            } else {
                Reason::Unassigned
            },
        }),
        (None, Some(_)) if *owner != OwnerState::Missing => Decision::AwaitOwner,
        (None, _) => Decision::Stay,
    }
}

/// The decision for a level of a chain once its owner's state is known: it goes to the shard
/// that holds its owner (settled or leaving), and waits there while the owner is leaving. An
/// owner that no available shard holds: an assigned object waits, an unassigned one stays
/// unassigned until the next sweep; an object whose owner is missing stays.
fn follow_chain(
    meta: &ObjectMeta,
    available: &BTreeSet<String>,
    labels: &RingLabels,
    owner: &OwnerState,
) -> Decision {
    let object_labels = meta.labels.as_ref();
    let current = object_labels.and_then(|l| l.get(&labels.shard));
    let draining = object_labels.is_some_and(|l| l.contains_key(&labels.drain));
    let holder = match owner {
        OwnerState::Settled(shard) | OwnerState::Draining(shard) if available.contains(shard) => {
            shard
        }
        OwnerState::Missing | OwnerState::NotSharded => return Decision::Stay,
        _ if current.is_some() => return Decision::AwaitOwner,
        _ => return Decision::Stay,
    };
    let settled = matches!(owner, OwnerState::Settled(_));
    match current {
        Some(current) if current == holder && !settled => Decision::AwaitOwner,
        Some(current) if current == holder && !draining => Decision::Stay,
        current => Decision::Move(Move::Assign {
            from: current.cloned(),
            to: holder.clone(),
            reason: match current {
                None => Reason::Unassigned,
                Some(current) if !available.contains(current) => Reason::DeadShard,
                Some(_) => Reason::Drain,
            },
        }),
    }
}

/// The most controlled levels a chain may have above an object, up to its main object.
pub(crate) const MAX_CHAIN_LEVELS: usize = 8;

/// Why an object's owner chain cannot be followed (its objects stay where they are).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ChainProblem {
    /// The chain comes back to an object already in it (named).
    Cycle(String),
    /// More than [`MAX_CHAIN_LEVELS`] controlled levels above the object (the level named).
    TooDeep(String),
}

impl fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cycle(at) => write!(f, "an owner chain cycles through {at}"),
            Self::TooDeep(at) => write!(
                f,
                "an owner chain has more than {MAX_CHAIN_LEVELS} controlled levels (at {at})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn labels() -> RingLabels {
        sharder_common::RingId::cluster_ring("example").labels()
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

    fn run(meta: &ObjectMeta, ring: &Ring, available: &BTreeSet<String>) -> Option<Move> {
        let key = key_of(Keying::Object, meta, Role::Main, "", "Secret");
        plan(meta, key.as_ref(), ring, available, &labels())
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
            assert_eq!(run(&meta, &ring, &available), want, "{what}");
        }
    }

    /// A child of a Secret whose desired shard on `ring` is `a`, labelled `shard`.
    fn child_on(ring: &Ring, shard: Option<&str>, drain: bool) -> (ObjectMeta, Option<ObjectKey>) {
        let mut child = meta("child", shard, drain);
        child.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: name_on(ring, "a"),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let key = key_of(Keying::Object, &child, Role::Controlled, "", "ConfigMap");
        (child, key)
    }

    fn assign(from: Option<&str>, to: &str, reason: Reason) -> Decision {
        Decision::Move(Move::Assign {
            from: from.map(Into::into),
            to: to.into(),
            reason,
        })
    }

    #[test]
    fn one_decision_per_object_reads_the_owner_only_when_it_decides() {
        let ring = Ring::new(["a", "b"]);
        let available = set(&["a", "b"]);
        let on_b = name_on(&ring, "b");
        let main = meta(&on_b, Some("a"), false);
        let main_key = key_of(Keying::Object, &main, Role::Main, "", "Secret");
        let (on_its_shard, key) = child_on(&ring, Some("a"), false);
        let (elsewhere, elsewhere_key) = child_on(&ring, Some("b"), false);
        let settled = OwnerState::Settled("a".into());
        let table = [
            (
                "a main object on a live wrong shard: drained, no owner read",
                &main,
                main_key.as_ref(),
                Placement::Main,
                None,
                Decision::Move(Move::Drain {
                    from: "a".into(),
                    to: "b".into(),
                }),
            ),
            (
                "a child on its owner's desired shard: stays, no owner read",
                &on_its_shard,
                key.as_ref(),
                Placement::Child,
                None,
                Decision::Stay,
            ),
            (
                "a child on another live shard, owner not read yet",
                &elsewhere,
                elsewhere_key.as_ref(),
                Placement::Child,
                None,
                Decision::ReadOwner,
            ),
            (
                "the same, its owner settled on a",
                &elsewhere,
                elsewhere_key.as_ref(),
                Placement::Child,
                Some(&settled),
                assign(Some("b"), "a", Reason::Drain),
            ),
        ];
        for (what, object, key, placement, owner, want) in table {
            assert_eq!(
                decide(object, key, placement, &ring, &available, &labels(), owner),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn children_decided_without_their_owner() {
        let ring = Ring::new(["a", "b"]);
        let available = set(&["a", "b"]);
        let table = [
            ("on its shard", Some("a"), false, Some(Decision::Stay)),
            (
                "leftover drain label",
                Some("a"),
                true,
                Some(assign(Some("a"), "a", Reason::Drain)),
            ),
            (
                "on a dead shard: moves with its owner, 1 write",
                Some("gone"),
                false,
                Some(assign(Some("gone"), "a", Reason::DeadShard)),
            ),
            (
                "on a live other shard: the owner decides",
                Some("b"),
                false,
                None,
            ),
            ("unassigned: the owner decides", None, false, None),
        ];
        for (what, shard, drain, want) in table {
            let (child, key) = child_on(&ring, shard, drain);
            assert_eq!(
                plan_child(&child, key.as_ref(), &ring, &available, &labels()),
                want,
                "{what}"
            );
        }
        let orphan = meta("child", Some("b"), false);
        assert_eq!(
            plan_child(&orphan, None, &ring, &available, &labels()),
            Some(Decision::Stay),
            "no controller reference"
        );
    }

    #[test]
    fn children_follow_their_owners_current_holder_never_ahead_of_it() {
        let ring = Ring::new(["a", "b"]);
        let available = set(&["a", "b"]);
        let settled = |s: &str| OwnerState::Settled(s.into());
        let draining = |s: &str| OwnerState::Draining(s.into());
        let table = [
            // Scale-out: the owner is drained off b (desired a); its child on b waits until
            // the owner carries a, then follows it with one write.
            (
                "owner draining, child on its shard",
                Some("b"),
                draining("b"),
                Decision::AwaitOwner,
            ),
            (
                "owner not drained yet",
                Some("b"),
                settled("b"),
                Decision::AwaitOwner,
            ),
            (
                "owner settled on its new shard",
                Some("b"),
                settled("a"),
                assign(Some("b"), "a", Reason::Drain),
            ),
            (
                "owner unassigned (acknowledged)",
                Some("b"),
                OwnerState::Unassigned,
                Decision::AwaitOwner,
            ),
            // Unassigned children go where the owner is held now.
            (
                "unassigned child, owner draining off b",
                None,
                draining("b"),
                assign(None, "b", Reason::Unassigned),
            ),
            (
                "unassigned child, owner settled on b",
                None,
                settled("b"),
                assign(None, "b", Reason::Unassigned),
            ),
            (
                "unassigned child, unassigned owner",
                None,
                OwnerState::Unassigned,
                Decision::Stay,
            ),
            (
                "owner missing",
                Some("b"),
                OwnerState::Missing,
                Decision::Stay,
            ),
            // An owner on a dead shard moves to the ring's choice directly, and so does its child.
            (
                "owner on a dead shard",
                Some("b"),
                settled("gone"),
                assign(Some("b"), "a", Reason::Drain),
            ),
            (
                "owner draining off a dead shard",
                None,
                draining("gone"),
                assign(None, "a", Reason::Unassigned),
            ),
            (
                "owner not sharded by the ring",
                Some("b"),
                OwnerState::NotSharded,
                assign(Some("b"), "a", Reason::Drain),
            ),
        ];
        for (what, shard, owner, want) in table {
            let (child, key) = child_on(&ring, shard, false);
            assert_eq!(
                follow_owner(&child, key.as_ref(), &ring, &available, &labels(), &owner),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn objects_without_key_or_without_shards_stay() {
        let ring = Ring::new(["a"]);
        let unnamed = ObjectMeta {
            name: None,
            ..meta("x", None, false)
        };
        assert_eq!(run(&unnamed, &ring, &set(&["a"])), None, "no name");
        let empty = Ring::new(Vec::<String>::new());
        assert_eq!(
            run(&meta("x", Some("gone"), false), &empty, &set(&[])),
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

    #[test]
    fn a_chain_level_follows_its_owners_holder_and_waits_while_the_owner_leaves() {
        let ring = Ring::new(["a", "b"]);
        let available = set(&["a", "b"]);
        let settled = |s: &str| OwnerState::Settled(s.into());
        let leaving = |s: &str| OwnerState::Draining(s.into());
        let table = [
            ("in place", Some("a"), false, settled("a"), Decision::Stay),
            (
                "leftover drain label",
                Some("a"),
                true,
                settled("a"),
                assign(Some("a"), "a", Reason::Drain),
            ),
            (
                "with its owner, which leaves",
                Some("a"),
                false,
                leaving("a"),
                Decision::AwaitOwner,
            ),
            (
                "owner settled elsewhere",
                Some("b"),
                false,
                settled("a"),
                assign(Some("b"), "a", Reason::Drain),
            ),
            (
                "on a dead shard, owner held on a, leaving",
                Some("gone"),
                false,
                leaving("a"),
                assign(Some("gone"), "a", Reason::DeadShard),
            ),
            (
                "unassigned, owner settled",
                None,
                false,
                settled("b"),
                assign(None, "b", Reason::Unassigned),
            ),
            (
                "owner held by no available shard: waits where it is",
                Some("gone"),
                false,
                OwnerState::Unassigned,
                Decision::AwaitOwner,
            ),
            (
                "owner on a dead shard (as read, not yet mapped): waits",
                Some("b"),
                false,
                settled("gone"),
                Decision::AwaitOwner,
            ),
            (
                "unassigned, owner held by none: left to the sweep",
                None,
                false,
                OwnerState::Unassigned,
                Decision::Stay,
            ),
            (
                "owner missing",
                Some("a"),
                false,
                OwnerState::Missing,
                Decision::Stay,
            ),
        ];
        for (what, shard, drain, owner, want) in table {
            let (object, key) = child_on(&ring, shard, drain);
            let decided = |owner| {
                decide(
                    &object,
                    key.as_ref(),
                    Placement::Chained,
                    &ring,
                    &available,
                    &labels(),
                    owner,
                )
            };
            assert_eq!(
                decided(None),
                Decision::ReadOwner,
                "{what}: the owner decides"
            );
            assert_eq!(decided(Some(&owner)), want, "{what}");
        }
    }
}
