//! Ordered handover of controlled objects (docs/design.md §6): a controlled object belongs with
//! its owner's **current holder**, never ahead of it. While the owner drains off a shard, that
//! shard still holds it, and its children stay (or are created) there; once the owner carries
//! its new shard, they follow. The webhook (for new children) and the reconciler (for existing
//! ones) decide by the same function.
//!
//! In a chain (an owner that is itself a controlled object of the ring, as a ReplicaSet between
//! a Deployment and its Pods) each level follows the level above it the same way, so only the
//! main object's key is hashed ([`OwnerState::as_chain_level`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::labels::RingLabels;

/// What is known of a controlled object's owner (its controller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// Labelled with this shard and not draining: settled there.
    Settled(String),
    /// Labelled with this shard and leaving it: a main object draining off it (the shard holds
    /// it until it acknowledges), or a level of a chain that moves once its own owner has.
    Draining(String),
    /// Not labelled with a shard (yet).
    Unassigned,
    /// Not found (deleted, or not created yet).
    Missing,
    /// Its resource is not a main resource of the ring: nothing holds it, its children follow
    /// the ring alone.
    NotSharded,
}

impl OwnerState {
    /// The state of an owner with metadata `meta` (`None`: the owner was not found).
    pub fn of(meta: Option<&ObjectMeta>, ring: &RingLabels) -> Self {
        let Some(meta) = meta else {
            return Self::Missing;
        };
        let none = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&none);
        match ring.shard_of(labels) {
            None => Self::Unassigned,
            Some(shard) if ring.is_draining(labels) => Self::Draining(shard.to_owned()),
            Some(shard) => Self::Settled(shard.to_owned()),
        }
    }

    /// What the children of an owner that is itself a controlled object of the ring (a level of
    /// a chain) see of it, given whether it is `in_place` (nothing to move: its own owner holds
    /// it where it is) and the available shards. Its holder, if available: settled there when
    /// it is in place, leaving it otherwise (children wait there, never ahead of it). On a shard
    /// that is not available it holds nothing yet: it moves first, its children after it, never
    /// to the ring's choice for their own key.
    pub fn as_chain_level(self, in_place: bool, is_available: impl Fn(&str) -> bool) -> Self {
        match self {
            Self::Settled(shard) | Self::Draining(shard) if !is_available(&shard) => {
                Self::Unassigned
            }
            Self::Settled(shard) if !in_place => Self::Draining(shard),
            other => other,
        }
    }

    /// The metric and log value of the state.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Settled(_) => "settled",
            Self::Draining(_) => "draining",
            Self::Unassigned => "unassigned",
            Self::Missing => "missing",
            Self::NotSharded => "not_sharded",
        }
    }
}

/// The shard a controlled object belongs on now, given its owner's state, the shard the ring
/// picks for the owner's key (`desired`) and the available shards; `None` while no shard holds
/// the owner (unassigned or missing): then the object waits where it is, or stays unassigned.
///
/// - Owner settled on, or draining off, an available shard: that shard (its current holder).
/// - Owner on a shard that is not available: the ring's choice, where the owner is moved
///   directly too (owners and children of a dead shard move together).
/// - Owner not sharded by the ring: the ring's choice.
pub fn child_shard<'a>(
    owner: &'a OwnerState,
    desired: &'a str,
    is_available: impl Fn(&str) -> bool,
) -> Option<&'a str> {
    match owner {
        OwnerState::Settled(shard) | OwnerState::Draining(shard) if is_available(shard) => {
            Some(shard)
        }
        OwnerState::Settled(_) | OwnerState::Draining(_) | OwnerState::NotSharded => Some(desired),
        OwnerState::Unassigned | OwnerState::Missing => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn owner_states_are_read_from_the_owners_labels() {
        let ring = crate::RingId::cluster_ring("example").labels();
        let meta = |pairs: &[(&str, &str)]| ObjectMeta {
            labels: (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        };
        assert_eq!(OwnerState::of(None, &ring), OwnerState::Missing);
        assert_eq!(
            OwnerState::of(Some(&meta(&[])), &ring),
            OwnerState::Unassigned,
            "found without any label"
        );
        assert_eq!(
            OwnerState::of(Some(&meta(&[("app", "x")])), &ring),
            OwnerState::Unassigned
        );
        assert_eq!(
            OwnerState::of(Some(&meta(&[(&ring.shard, "a")])), &ring),
            OwnerState::Settled("a".into())
        );
        assert_eq!(
            OwnerState::of(
                Some(&meta(&[(&ring.shard, "a"), (&ring.drain, "true")])),
                &ring
            ),
            OwnerState::Draining("a".into())
        );
        assert_eq!(
            OwnerState::of(Some(&meta(&[(&ring.drain, "true")])), &ring),
            OwnerState::Unassigned,
            "a drain label alone holds nothing"
        );
    }

    #[test]
    fn children_belong_with_their_owners_current_holder() {
        let available = set(&["a", "b"]);
        let settled = |s: &str| OwnerState::Settled(s.into());
        let draining = |s: &str| OwnerState::Draining(s.into());
        let table = [
            // The ring picks b for the owner's key; the owner is still held by a.
            (settled("a"), Some("a")),
            (draining("a"), Some("a")),
            (settled("b"), Some("b")),
            // A dead holder: the owner moves to the ring's choice directly, so do its children.
            (settled("gone"), Some("b")),
            (draining("gone"), Some("b")),
            (OwnerState::NotSharded, Some("b")),
            (OwnerState::Unassigned, None),
            (OwnerState::Missing, None),
        ];
        for (owner, want) in table {
            assert_eq!(
                child_shard(&owner, "b", |s| available.contains(s)),
                want,
                "{owner:?}"
            );
        }
    }

    #[test]
    fn a_chain_level_holds_its_children_only_where_it_stays() {
        let available = set(&["a", "b"]);
        let settled = |s: &str| OwnerState::Settled(s.into());
        let draining = |s: &str| OwnerState::Draining(s.into());
        let table = [
            (settled("a"), true, settled("a")),
            (settled("a"), false, draining("a")),
            (draining("a"), true, draining("a")),
            (draining("a"), false, draining("a")),
            (settled("gone"), true, OwnerState::Unassigned),
            (settled("gone"), false, OwnerState::Unassigned),
            (draining("gone"), false, OwnerState::Unassigned),
            (OwnerState::Unassigned, true, OwnerState::Unassigned),
            (OwnerState::Missing, false, OwnerState::Missing),
        ];
        for (owner, in_place, want) in table {
            let seen = owner
                .clone()
                .as_chain_level(in_place, |s| available.contains(s));
            assert_eq!(seen, want, "{owner:?}, in place: {in_place}");
            // Never the ring's choice for the child's own key ("b" here).
            let holder = child_shard(&seen, "b", |s| available.contains(s));
            assert_ne!(holder, Some("b"), "{owner:?}, in place: {in_place}");
        }
    }
}
