//! Label keys of the wire contract (docs/design.md §3), bit-exact with the reference implementation so
//! that shards written in any language interoperate. A ring's own keys follow from its kind and
//! name ([`crate::RingId::labels`]).

use std::collections::BTreeMap;

/// Label the reconciler writes on shard Leases with their [`crate::ShardState`], for observability.
pub const STATE_LABEL: &str = "alpha.sharding.timebertt.dev/state";

/// Prefix of the per-ring shard label key; the value of the label is the shard name.
pub const SHARD_LABEL_PREFIX: &str = "shard.alpha.sharding.timebertt.dev/";

/// Prefix of the per-ring drain label key; only its presence counts.
pub const DRAIN_LABEL_PREFIX: &str = "drain.alpha.sharding.timebertt.dev/";

/// Whether `key` is a shard or drain label key of any ring: the only labels sharding reads on a
/// sharded object.
pub fn is_sharding_label(key: &str) -> bool {
    key.starts_with(SHARD_LABEL_PREFIX) || key.starts_with(DRAIN_LABEL_PREFIX)
}

/// Longest name part of a qualified label key (after the `/`).
pub const MAX_LABEL_NAME_LEN: usize = 63;

/// Longest label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// Why `name` cannot be a shard's name, or `None` if it can. A shard's name is the value of the
/// shard label on every object it holds, so it must be a label value: at most 63 characters of
/// letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit. (A Lease
/// name may be up to 253 characters long: such a shard could never be assigned anything.)
pub fn shard_name_problem(name: &str) -> Option<String> {
    let alphanumeric = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() {
        Some("is empty".to_owned())
    } else if name.len() > MAX_LABEL_VALUE_LEN {
        Some(format!(
            "is {} characters long; a label value may have {MAX_LABEL_VALUE_LEN}",
            name.len()
        ))
    } else if !name
        .chars()
        .all(|c| alphanumeric(c) || matches!(c, '-' | '_' | '.'))
    {
        Some("may hold only letters, digits, '-', '_' and '.'".to_owned())
    } else if !name.starts_with(alphanumeric) || !name.ends_with(alphanumeric) {
        Some("must begin and end with a letter or digit".to_owned())
    } else {
        None
    }
}

/// Both label keys of one ring, computed once and kept with the ring.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RingLabels {
    /// The shard label key: its value names the shard.
    pub shard: String,
    /// The drain label key: its presence asks the shard to let go of the object.
    pub drain: String,
}

impl RingLabels {
    /// The shard an object carrying `labels` is assigned to, if any.
    pub fn shard_of<'a>(&self, labels: &'a BTreeMap<String, String>) -> Option<&'a str> {
        labels.get(&self.shard).map(String::as_str)
    }

    /// Whether an object carrying `labels` is being drained (the value does not matter).
    pub fn is_draining(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.contains_key(&self.drain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RingId, RingKind};

    #[test]
    fn shard_and_drain_are_read_from_an_objects_labels() {
        let l = RingId::cluster_ring("example").labels();
        let mut labels = BTreeMap::from([("other".to_owned(), "x".to_owned())]);
        assert_eq!(l.shard_of(&labels), None);
        assert!(!l.is_draining(&labels));
        labels.insert(l.shard.clone(), "shard-1".to_owned());
        labels.insert(l.drain.clone(), String::new());
        assert_eq!(l.shard_of(&labels), Some("shard-1"));
        assert!(l.is_draining(&labels), "presence counts, not the value");
        assert!(
            !RingId::cluster_ring("other").labels().is_draining(&labels),
            "keys are per ring"
        );
        assert!(
            !RingId::controller_ring("example")
                .labels()
                .is_draining(&labels),
            "keys are per kind"
        );
    }

    #[test]
    fn shard_and_drain_keys_of_every_ring_are_sharding_labels() {
        for kind in RingKind::ALL {
            for name in ["example", "a", &"r".repeat(63)] {
                let labels = RingId::new(kind, name).labels();
                assert!(is_sharding_label(&labels.shard), "{kind} {name}");
                assert!(is_sharding_label(&labels.drain), "{kind} {name}");
            }
        }
        for other in [
            RingKind::ClusterRing.lease_label(),
            RingKind::ControllerRing.lease_label(),
            STATE_LABEL,
            "app",
            "shard.alpha.sharding.timebertt.dev",
            "",
        ] {
            assert!(!is_sharding_label(other), "{other}");
        }
    }

    #[test]
    fn a_shard_name_must_be_a_label_value() {
        for fine in [
            "shard-0",
            "a",
            "checksum-controller-1",
            "s_1.b",
            &"s".repeat(63),
        ] {
            assert_eq!(shard_name_problem(fine), None, "{fine}");
        }
        let table = [
            ("", "is empty"),
            (
                &*"s".repeat(64),
                "is 64 characters long; a label value may have 63",
            ),
            ("shard/0", "may hold only letters, digits, '-', '_' and '.'"),
            ("-shard", "must begin and end with a letter or digit"),
            ("shard.", "must begin and end with a letter or digit"),
        ];
        for (name, problem) in table {
            assert_eq!(shard_name_problem(name).as_deref(), Some(problem), "{name}");
        }
    }
}
