//! Shard lease states (docs/design.md §5) as a pure function of a Lease
//! and the current time, plus the Lease spec the reconciler writes when it takes a lease over.
//!
//! Expiry is `renewTime + leaseDurationSeconds`. The intervals are half-open, so a boundary
//! instant belongs to the later state and [`LeaseStatus::next_change`] is the first instant of
//! the next state:
//!
//! | held by its shard | time since expiry `t`           | state       |
//! |-------------------|---------------------------------|-------------|
//! | yes               | `t < 0`                         | `ready`     |
//! | yes               | `0 <= t < duration`             | `expired`   |
//! | yes               | `t >= duration`                 | `uncertain` |
//! | no                | `t < 1 min`                     | `dead`      |
//! | no                | `t >= 1 min`                    | `orphaned`  |
//!
//! A lease missing `renewTime` or a positive `leaseDurationSeconds` counts as expired by any
//! amount (as in the reference implementation): `uncertain` when held, `orphaned` when not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::labels::shard_name_problem;
use crate::{Error, RingId, RingKind};

/// Holder identity the reconciler writes when it takes over an `uncertain` lease.
pub const LEASE_CONTROLLER_HOLDER: &str = "shardlease-controller";

/// How long a dead lease must have been expired before it counts as orphaned.
pub const ORPHAN_AFTER: SignedDuration = SignedDuration::from_secs(60);

/// The state of a shard, derived from its Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShardState {
    /// Held by its shard and not expired.
    Ready,
    /// Held by its shard, expired less than one lease duration ago.
    Expired,
    /// Held by its shard, expired one lease duration ago or longer.
    Uncertain,
    /// Not held by its shard: released, or taken over by the reconciler.
    Dead,
    /// Dead and expired for a minute or longer: the reconciler deletes it.
    Orphaned,
}

impl ShardState {
    /// Every state, in lifecycle order.
    pub const ALL: [ShardState; 5] = [
        Self::Ready,
        Self::Expired,
        Self::Uncertain,
        Self::Dead,
        Self::Orphaned,
    ];

    /// Whether a shard in this state is on the ring (ready, expired, uncertain).
    pub fn is_available(self) -> bool {
        matches!(self, Self::Ready | Self::Expired | Self::Uncertain)
    }

    /// The value of the state label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Expired => "expired",
            Self::Uncertain => "uncertain",
            Self::Dead => "dead",
            Self::Orphaned => "orphaned",
        }
    }
}

impl fmt::Display for ShardState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ShardState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| Error::UnknownShardState(s.to_owned()))
    }
}

/// A lease's state and when it next changes on its own (without a write to the lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The state now.
    pub state: ShardState,
    /// The first instant of the next state, or `None` when only a write can change it
    /// (`uncertain`, `orphaned`, or missing times).
    pub next_change: Option<Timestamp>,
}

/// Whether the lease is held by its own shard: `holderIdentity` equals the Lease name, and that
/// name can be a shard's (a label value, see [`shard_name_problem`]; a longer Lease name is
/// never a shard on the ring).
pub fn is_held_by_shard(lease: &Lease) -> bool {
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    let holder = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .unwrap_or_default();
    holder == name && shard_name_problem(name).is_none()
}

/// Whether the shard of this Lease is on the ring (ready, expired or uncertain): the one
/// availability rule of the webhook and the reconciler. It is exactly "held by its own shard",
/// so it never changes with time alone: [`shard_state`]'s `is_available()` agrees at every
/// instant (property-tested).
pub fn is_available(lease: &Lease) -> bool {
    is_held_by_shard(lease)
}

/// What a ring reads of one of its shard Leases: the ring the Lease is labelled for, its
/// shard (the Lease's name) and whether that shard holds it ([`is_available`]). Only a change
/// of these can change a ring's shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLease {
    /// The ring.
    pub ring: RingId,
    /// The shard.
    pub shard: String,
    /// Whether the shard is on the ring.
    pub available: bool,
}

impl ShardLease {
    /// What a ring of `kind` reads of `lease`; `None` when it carries no ring label of `kind`.
    pub fn of(kind: RingKind, lease: &Lease) -> Option<Self> {
        let ring = lease.metadata.labels.as_ref()?.get(kind.lease_label())?;
        Some(Self {
            ring: RingId::new(kind, ring.as_str()),
            shard: lease.metadata.name.clone().unwrap_or_default(),
            available: is_available(lease),
        })
    }
}

/// The lease's expiry instant and duration, or `None` when renewTime or a positive duration is
/// missing.
pub fn expiry(lease: &Lease) -> Option<(Timestamp, SignedDuration)> {
    let spec = lease.spec.as_ref()?;
    let renew = spec.renew_time.as_ref()?.0;
    let seconds = spec.lease_duration_seconds.filter(|s| *s > 0)?;
    let duration = SignedDuration::from_secs(i64::from(seconds));
    Some((renew.checked_add(duration).ok()?, duration))
}

/// The state of a shard lease at `now`.
pub fn shard_state(lease: &Lease, now: Timestamp) -> LeaseStatus {
    let held = is_held_by_shard(lease);
    let Some((expires, duration)) = expiry(lease) else {
        let state = if held {
            ShardState::Uncertain
        } else {
            ShardState::Orphaned
        };
        return LeaseStatus {
            state,
            next_change: None,
        };
    };
    let after = |d: SignedDuration| expires.checked_add(d).ok();
    let (state, next_change) = if held {
        match after(duration) {
            _ if now < expires => (ShardState::Ready, Some(expires)),
            Some(uncertain_at) if now < uncertain_at => (ShardState::Expired, Some(uncertain_at)),
            _ => (ShardState::Uncertain, None),
        }
    } else {
        match after(ORPHAN_AFTER) {
            Some(orphaned_at) if now < orphaned_at => (ShardState::Dead, Some(orphaned_at)),
            _ => (ShardState::Orphaned, None),
        }
    };
    LeaseStatus { state, next_change }
}

/// The spec the reconciler writes to take over an `uncertain` lease: holder
/// [`LEASE_CONTROLLER_HOLDER`], twice the shard's duration, acquired and renewed `now`, one more
/// transition. Writing it (with the lease's resourceVersion) proves the apiserver accepts writes
/// before the shard is declared dead.
pub fn takeover_spec(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    let duration = current
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .unwrap_or(15);
    LeaseSpec {
        holder_identity: Some(LEASE_CONTROLLER_HOLDER.to_owned()),
        lease_duration_seconds: Some(duration.saturating_mul(2)),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..current.clone()
    }
}

/// The shard names among one ring's shard Leases, given as `(namespace, name)`, that occur in
/// more than one namespace, each with its namespaces. A ring's shards are told apart by name
/// alone (the shard label's value), so such a name is ambiguous: two shards would watch the same
/// objects. The reconciler moves nothing of such a ring, the webhook assigns nothing to such a
/// name.
pub fn conflicting_names<'a>(
    shards: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (namespace, name) in shards {
        by_name
            .entry(name.to_owned())
            .or_default()
            .insert(namespace.to_owned());
    }
    by_name.retain(|_, namespaces| namespaces.len() > 1);
    by_name
}

/// A Lease as `(namespace, name)`, for [`conflicting_names`].
pub fn namespace_and_name(lease: &Lease) -> (&str, &str) {
    (
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.metadata.name.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    const T0: i64 = 1_700_000_000;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(T0 + seconds).expect("valid")
    }

    fn at_micros(micros: i64) -> Timestamp {
        Timestamp::from_microsecond(T0 * 1_000_000 + micros).expect("valid")
    }

    fn lease(name: &str, holder: Option<&str>, renew: Option<i64>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                renew_time: renew.map(|s| MicroTime(at(s))),
                lease_duration_seconds: duration,
                ..LeaseSpec::default()
            }),
        }
    }

    /// A lease held by its shard, renewed at T0 with a 10 s duration: expires at T0+10.
    fn held() -> Lease {
        lease("shard-a", Some("shard-a"), Some(0), Some(10))
    }

    #[test]
    fn a_lease_whose_name_cannot_be_a_label_value_is_never_a_shard_on_the_ring() {
        let long = "s".repeat(64);
        let lease = lease(&long, Some(&long), Some(0), Some(10));
        assert!(!is_available(&lease));
        assert_eq!(shard_state(&lease, at(5)).state, ShardState::Dead);
        let fits = "s".repeat(63);
        assert!(is_available(&super::tests::lease(
            &fits,
            Some(&fits),
            Some(0),
            Some(10)
        )));
    }

    #[test]
    fn held_lease_states_at_every_boundary() {
        let table = [
            (-5, ShardState::Ready, Some(at(10))),
            (0, ShardState::Ready, Some(at(10))),
            (9, ShardState::Ready, Some(at(10))),
            (10, ShardState::Expired, Some(at(20))),
            (15, ShardState::Expired, Some(at(20))),
            (20, ShardState::Uncertain, None),
            (10_000, ShardState::Uncertain, None),
        ];
        for (now, state, next_change) in table {
            assert_eq!(
                shard_state(&held(), at(now)),
                LeaseStatus { state, next_change },
                "now = T0{now:+}"
            );
        }
    }

    #[test]
    fn boundaries_are_exact_to_the_microsecond() {
        assert_eq!(
            shard_state(&held(), at_micros(9_999_999)).state,
            ShardState::Ready
        );
        assert_eq!(
            shard_state(&held(), at_micros(10_000_000)).state,
            ShardState::Expired
        );
        assert_eq!(
            shard_state(&held(), at_micros(19_999_999)).state,
            ShardState::Expired
        );
        assert_eq!(
            shard_state(&held(), at_micros(20_000_000)).state,
            ShardState::Uncertain
        );
    }

    #[test]
    fn released_lease_is_dead_at_once_then_orphaned_a_minute_after_expiry() {
        for holder in [None, Some("")] {
            let released = lease("shard-a", holder, Some(0), Some(10));
            let table = [
                (0, ShardState::Dead, Some(at(70))),
                (69, ShardState::Dead, Some(at(70))),
                (70, ShardState::Orphaned, None),
            ];
            for (now, state, next_change) in table {
                assert_eq!(
                    shard_state(&released, at(now)),
                    LeaseStatus { state, next_change },
                    "holder {holder:?}, now = T0{now:+}"
                );
            }
        }
    }

    #[test]
    fn lease_held_by_someone_else_is_dead() {
        let taken = lease("shard-a", Some(LEASE_CONTROLLER_HOLDER), Some(0), Some(20));
        assert_eq!(shard_state(&taken, at(0)).state, ShardState::Dead);
        assert_eq!(shard_state(&taken, at(0)).next_change, Some(at(80)));
        let other = lease("shard-a", Some("shard-b"), Some(0), Some(10));
        assert_eq!(shard_state(&other, at(0)).state, ShardState::Dead);
    }

    #[test]
    fn missing_times_or_duration_count_as_long_expired() {
        let table = [
            (lease("s", Some("s"), None, Some(10)), ShardState::Uncertain),
            (lease("s", Some("s"), Some(0), None), ShardState::Uncertain),
            (
                lease("s", Some("s"), Some(0), Some(0)),
                ShardState::Uncertain,
            ),
            (
                lease("s", Some("s"), Some(0), Some(-3)),
                ShardState::Uncertain,
            ),
            (lease("s", None, None, None), ShardState::Orphaned),
            (
                Lease {
                    metadata: ObjectMeta {
                        name: Some("s".into()),
                        ..ObjectMeta::default()
                    },
                    spec: None,
                },
                ShardState::Orphaned,
            ),
        ];
        for (lease, state) in table {
            assert_eq!(
                shard_state(&lease, at(0)),
                LeaseStatus {
                    state,
                    next_change: None
                },
                "{lease:?}"
            );
        }
    }

    #[test]
    fn renewing_an_expired_lease_makes_it_ready_again() {
        assert_eq!(shard_state(&held(), at(15)).state, ShardState::Expired);
        let renewed = lease("shard-a", Some("shard-a"), Some(15), Some(10));
        assert_eq!(shard_state(&renewed, at(15)).state, ShardState::Ready);
    }

    #[test]
    fn only_ready_expired_and_uncertain_are_available() {
        let available: Vec<_> = ShardState::ALL
            .into_iter()
            .filter(|s| s.is_available())
            .collect();
        assert_eq!(
            available,
            [
                ShardState::Ready,
                ShardState::Expired,
                ShardState::Uncertain
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn availability_never_depends_on_the_clock(
            holder in proptest::option::of(proptest::sample::select(vec!["shard-a", "shard-b", "", LEASE_CONTROLLER_HOLDER])),
            renew in proptest::option::of(-1_000i64..1_000),
            duration in proptest::option::of(-5i32..100),
            now in -2_000i64..2_000,
        ) {
            let lease = lease("shard-a", holder, renew, duration);
            proptest::prop_assert_eq!(
                shard_state(&lease, at(now)).state.is_available(),
                is_available(&lease)
            );
            let long = "s".repeat(64);
            let lease = super::tests::lease(&long, holder.map(|_| long.as_str()), renew, duration);
            proptest::prop_assert_eq!(
                shard_state(&lease, at(now)).state.is_available(),
                is_available(&lease)
            );
        }
    }

    #[test]
    fn state_label_values_round_trip() {
        for state in ShardState::ALL {
            assert_eq!(state.as_str().parse::<ShardState>().expect("known"), state);
        }
        let err = "gone".parse::<ShardState>().expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "unknown shard state \"gone\" (expected ready, expired, uncertain, dead or orphaned)"
        );
    }

    #[test]
    fn takeover_doubles_the_duration_and_makes_the_lease_dead() {
        let current = held().spec.expect("spec");
        let now = at(25);
        let spec = takeover_spec(&current, now);
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(LEASE_CONTROLLER_HOLDER)
        );
        assert_eq!(spec.lease_duration_seconds, Some(20));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        assert_eq!(spec.lease_transitions, Some(1));
        let taken = Lease {
            metadata: held().metadata,
            spec: Some(spec),
        };
        // Dead until the doubled lease has been expired for a minute: 25 + 20 + 60.
        assert_eq!(
            shard_state(&taken, now),
            LeaseStatus {
                state: ShardState::Dead,
                next_change: Some(at(105))
            }
        );
    }

    #[test]
    fn takeover_counts_transitions_on() {
        let current = LeaseSpec {
            lease_transitions: Some(4),
            lease_duration_seconds: Some(7),
            ..LeaseSpec::default()
        };
        let spec = takeover_spec(&current, at(0));
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(spec.lease_duration_seconds, Some(14));
    }

    #[test]
    fn a_shard_name_in_two_namespaces_is_a_conflict() {
        let lease = |namespace: &str, name: &str| Lease {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            spec: None,
        };
        type Expected<'a> = Vec<(&'a str, Vec<&'a str>)>;
        let cases: Vec<(Vec<Lease>, Expected<'_>)> = vec![
            (vec![], vec![]),
            (vec![lease("a", "s-0"), lease("a", "s-1")], vec![]),
            (
                vec![lease("a", "s-0"), lease("b", "s-0"), lease("a", "s-1")],
                vec![("s-0", vec!["a", "b"])],
            ),
            (
                vec![
                    lease("c", "s-1"),
                    lease("a", "s-1"),
                    lease("b", "s-1"),
                    lease("a", "s-2"),
                    lease("b", "s-2"),
                ],
                vec![("s-1", vec!["a", "b", "c"]), ("s-2", vec!["a", "b"])],
            ),
        ];
        for (leases, expected) in cases {
            let expected: BTreeMap<String, BTreeSet<String>> = expected
                .into_iter()
                .map(|(n, ns)| (n.to_owned(), ns.into_iter().map(str::to_owned).collect()))
                .collect();
            assert_eq!(
                conflicting_names(leases.iter().map(namespace_and_name)),
                expected
            );
        }
    }

    #[test]
    fn a_ring_reads_of_a_lease_its_ring_label_its_name_and_whether_its_shard_holds_it() {
        let kind = RingKind::ControllerRing;
        let mut lease = Lease::default();
        lease.metadata.name = Some("shard-a".into());
        assert_eq!(ShardLease::of(kind, &lease), None, "no ring label");
        lease.metadata.labels = Some([(kind.lease_label().to_owned(), "ring".to_owned())].into());
        let read = ShardLease::of(kind, &lease).expect("labelled");
        assert_eq!(
            (read.ring, read.shard.as_str(), read.available),
            (RingId::new(kind, "ring"), "shard-a", false),
        );
        assert_eq!(
            ShardLease::of(RingKind::ClusterRing, &lease),
            None,
            "the label of the other kind"
        );
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("shard-a".into()),
            ..LeaseSpec::default()
        });
        assert!(ShardLease::of(kind, &lease).expect("labelled").available);
    }
}
