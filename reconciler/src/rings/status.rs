//! A ring's status: shard counts, observed generation and the `Ready` condition,
//! written only when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;
use sharder_common::cluster_ring::CONDITION_READY;
use sharder_common::ranges::RangeKey;
use sharder_common::{ClusterRingStatus, RingObject};

use super::ranges::RangeState;

use crate::Error;

/// Reason of the `Ready` condition when the ring cannot be used as it is.
pub(crate) const REASON_INVALID_SPEC: &str = "InvalidSpec";

/// Reason of the `Ready` condition when a range-mode ring's selectors would not be applied.
pub(crate) const REASON_SELECTORS_NOT_APPLIED: &str = "ShardedListAndWatchOff";

/// Reason of the `Ready` condition when shard names are ambiguous.
pub(crate) const REASON_CONFLICTING_SHARD_NAMES: &str = "ConflictingShardNames";

/// Type of the condition present while objects are left where they are because their owner
/// chain cannot be followed (always `False`; gone once a full list finds no such chain).
pub(crate) const CONDITION_OWNER_CHAINS: &str = "OwnerChainsFollowed";

/// Its reason, and that of the Warning Event.
pub(crate) const REASON_OWNER_CHAIN: &str = "OwnerChainNotFollowed";

/// What the status reports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counts<'a> {
    /// Shard Leases of the ring.
    pub shards: usize,
    /// Available shards.
    pub available: usize,
    /// Why the spec is invalid, if it is.
    pub invalid: Option<&'a str>,
    /// Shard names in more than one namespace, if any (described).
    pub conflicting: Option<&'a str>,
    /// In range mode, its key and where the assignment stands.
    pub ranges: Option<(RangeKey, &'a RangeState)>,
    /// Owner chains not followed, if any (described).
    pub chains: Option<&'a str>,
}

/// The `Ready` condition for `counts` at generation `generation`; its transition time moves
/// only when its status changes (then it is `now`).
pub(crate) fn ready_condition(
    existing: Option<&ClusterRingStatus>,
    generation: i64,
    counts: Counts<'_>,
    now: Timestamp,
) -> Condition {
    let Counts {
        shards,
        available,
        invalid,
        conflicting,
        ranges,
        chains: _,
    } = counts;
    let (status, reason, message) = match (invalid, conflicting) {
        (Some(reason), _) => ("False", REASON_INVALID_SPEC, reason.to_owned()),
        (None, None) if let Some((_, RangeState::Unserved(resource))) = ranges => (
            "False",
            REASON_SELECTORS_NOT_APPLIED,
            format!(
                "the apiserver does not apply shardSelector to {resource} (feature gate ShardedListAndWatch off): no ranges are handed out"
            ),
        ),
        (None, Some(names)) => (
            "False",
            REASON_CONFLICTING_SHARD_NAMES,
            format!(
                "shard names in more than one namespace: {names}; nothing is moved until each name is in one namespace"
            ),
        ),
        (None, None) if available > 0 => (
            "True",
            "ShardsAvailable",
            match ranges {
                Some((
                    key,
                    RangeState::Assigned {
                        waiting, shares, ..
                    },
                )) => format!(
                    "{available} of {shards} shards available; ranges by {key}: {} (of the hash space: {})",
                    if *waiting == 0 {
                        "every shard has its share".to_owned()
                    } else {
                        format!("{waiting} shards wait for ranges another shard still holds")
                    },
                    shares
                        .iter()
                        .map(|(shard, share)| format!("{shard} {:.1} %", f64::from(*share) / 10.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => format!("{available} of {shards} shards available"),
            },
        ),
        (None, None) => (
            "False",
            "NoShardsAvailable",
            format!("0 of {shards} shards available"),
        ),
    };
    let condition = (CONDITION_READY, status, reason, message);
    condition_of(existing, generation, condition, now)
}

/// The condition (type, status, reason, message) at `generation`; its transition time moves
/// only when its status changes (then it is `now`).
fn condition_of(
    existing: Option<&ClusterRingStatus>,
    generation: i64,
    (type_, status, reason, message): (&str, &str, &str, String),
    now: Timestamp,
) -> Condition {
    let previous = existing.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Time(now),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: Some(generation),
    }
}

/// The status the ring should have.
pub(crate) fn desired_status(
    ring: &RingObject,
    counts: Counts<'_>,
    now: Timestamp,
) -> ClusterRingStatus {
    let generation = ring.object.meta().generation.unwrap_or_default();
    let existing = ring.object.status.as_ref();
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    ClusterRingStatus {
        observed_generation: Some(generation),
        shards: count(counts.shards),
        available_shards: count(counts.available),
        conditions: std::iter::once(ready_condition(existing, generation, counts, now))
            .chain(counts.chains.map(|problem| {
                let chains = (
                    CONDITION_OWNER_CHAINS,
                    "False",
                    REASON_OWNER_CHAIN,
                    problem.into(),
                );
                condition_of(existing, generation, chains, now)
            }))
            .collect(),
    }
}

/// Writes the ring's status if it differs from what it should be.
pub(crate) async fn patch_status(
    client: &Client,
    ring: &RingObject,
    counts: Counts<'_>,
) -> Result<(), Error> {
    let status = desired_status(ring, counts, Timestamp::now());
    if ring.object.status.as_ref() == Some(&status) {
        return Ok(());
    }
    Api::<DynamicObject>::all_with(client.clone(), &ring.id.kind.api_resource())
        .patch_status(
            &ring.id.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use sharder_common::ClusterRingSpec;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).expect("valid")
    }

    fn counts(available: usize, invalid: Option<&str>) -> Counts<'_> {
        Counts {
            shards: 3,
            available,
            invalid,
            conflicting: None,
            ranges: None,
            chains: None,
        }
    }

    #[test]
    fn ready_means_configured_with_an_available_shard() {
        let settled = RangeState::Assigned {
            waiting: 0,
            conflicts: 0,
            shares: [("shard-a".into(), 512), ("shard-b".into(), 488)].into(),
        };
        let handing_over = RangeState::Assigned {
            waiting: 1,
            conflicts: 0,
            shares: [("shard-a".into(), 1000), ("shard-b".into(), 0)].into(),
        };
        let unserved = RangeState::Unserved("configmaps".into());
        let table = [
            (
                counts(2, None),
                "True",
                "ShardsAvailable",
                "2 of 3 shards available",
            ),
            (
                counts(0, None),
                "False",
                "NoShardsAvailable",
                "0 of 3 shards available",
            ),
            (
                counts(2, Some("spec.resources[0] ...")),
                "False",
                "InvalidSpec",
                "spec.resources[0] ...",
            ),
            (
                Counts {
                    conflicting: Some("shard-a (ns-1, ns-2)"),
                    ..counts(2, None)
                },
                "False",
                "ConflictingShardNames",
                "shard names in more than one namespace: shard-a (ns-1, ns-2); nothing is moved until each name is in one namespace",
            ),
            (
                Counts {
                    conflicting: Some("shard-a (ns-1, ns-2)"),
                    ..counts(2, Some("spec.resources[0] ..."))
                },
                "False",
                "InvalidSpec",
                "spec.resources[0] ...",
            ),
            (
                Counts {
                    ranges: Some((RangeKey::Uid, &settled)),
                    ..counts(2, None)
                },
                "True",
                "ShardsAvailable",
                "2 of 3 shards available; ranges by uid: every shard has its share (of the hash space: shard-a 51.2 %, shard-b 48.8 %)",
            ),
            (
                Counts {
                    ranges: Some((RangeKey::Namespace, &handing_over)),
                    ..counts(2, None)
                },
                "True",
                "ShardsAvailable",
                "2 of 3 shards available; ranges by namespace: 1 shards wait for ranges another shard still holds (of the hash space: shard-a 100.0 %, shard-b 0.0 %)",
            ),
            (
                Counts {
                    ranges: Some((RangeKey::Uid, &unserved)),
                    ..counts(2, None)
                },
                "False",
                "ShardedListAndWatchOff",
                "the apiserver does not apply shardSelector to configmaps (feature gate ShardedListAndWatch off): no ranges are handed out",
            ),
        ];
        for (counts, status, reason, message) in table {
            let c = ready_condition(None, 4, counts, at(0));
            assert_eq!(
                (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
                (status, reason, message)
            );
            assert_eq!(c.observed_generation, Some(4));
        }
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_changes() {
        let mut ring = RingObject::cluster_ring(sharder_common::ClusterRing::new(
            "r",
            ClusterRingSpec::default(),
        ));
        ring.object.status = Some(desired_status(&ring, counts(1, None), at(0)));
        let same = desired_status(&ring, counts(3, None), at(10));
        assert_eq!(same.conditions[0].last_transition_time, Time(at(0)));
        assert_eq!(same.available_shards, Some(3));
        let flipped = desired_status(&ring, counts(0, None), at(10));
        assert_eq!(flipped.conditions[0].last_transition_time, Time(at(10)));
    }

    #[test]
    fn unfollowed_owner_chains_have_a_condition_of_their_own_while_they_last() {
        let mut ring = RingObject::cluster_ring(sharder_common::ClusterRing::new(
            "r",
            ClusterRingSpec::default(),
        ));
        let problem =
            "an owner chain cycles through ns/a: objects below it are left where they are";
        let with = |available| Counts {
            chains: Some(problem),
            ..counts(available, None)
        };
        ring.object.status = Some(desired_status(&ring, with(1), at(0)));
        let status = desired_status(&ring, with(2), at(10));
        let types: Vec<(&str, &str)> = status
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [(CONDITION_READY, "True"), (CONDITION_OWNER_CHAINS, "False")],
            "the ring is ready all the same"
        );
        let chains = &status.conditions[1];
        assert_eq!(
            (chains.reason.as_str(), chains.message.as_str()),
            (REASON_OWNER_CHAIN, problem)
        );
        assert_eq!(chains.last_transition_time, Time(at(0)));
        ring.object.status = Some(status);
        let resolved = desired_status(&ring, counts(2, None), at(20));
        assert_eq!(resolved.conditions.len(), 1, "gone once resolved");
    }
}
