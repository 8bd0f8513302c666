//! Label keys of the wire contract (docs/design.md §2), bit-exact with the reference implementation so
//! that shards written in any language interoperate.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Label on shard Leases naming the ClusterRing the shard belongs to.
pub const RING_LABEL: &str = "alpha.sharding.timebertt.dev/clusterring";

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

/// The name part shared by a ring's shard and drain label keys: the first 63 characters of
/// `"clusterring-" + hex(sha256(ring))[0..8] + "-" + ring`.
pub fn ring_label_name(ring: &str) -> String {
    let digest = Sha256::digest(ring.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("clusterring-{hex}-{ring}")
        .chars()
        .take(MAX_LABEL_NAME_LEN)
        .collect()
}

/// The shard label key of a ring, e.g.
/// `shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example` for ring `example`.
pub fn shard_label(ring: &str) -> String {
    format!("{SHARD_LABEL_PREFIX}{}", ring_label_name(ring))
}

/// The drain label key of a ring, e.g.
/// `drain.alpha.sharding.timebertt.dev/clusterring-50d858e0-example` for ring `example`.
pub fn drain_label(ring: &str) -> String {
    format!("{DRAIN_LABEL_PREFIX}{}", ring_label_name(ring))
}

/// Both label keys of one ring, computed once and kept with the ring.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RingLabels {
    /// The shard label key ([`shard_label`]).
    pub shard: String,
    /// The drain label key ([`drain_label`]).
    pub drain: String,
}

impl RingLabels {
    /// The label keys of the ring named `ring`.
    pub fn new(ring: &str) -> Self {
        Self {
            shard: shard_label(ring),
            drain: drain_label(ring),
        }
    }

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

    #[test]
    fn shard_and_drain_are_read_from_an_objects_labels() {
        let l = RingLabels::new("example");
        let mut labels = BTreeMap::from([("other".to_owned(), "x".to_owned())]);
        assert_eq!(l.shard_of(&labels), None);
        assert!(!l.is_draining(&labels));
        labels.insert(l.shard.clone(), "shard-1".to_owned());
        labels.insert(l.drain.clone(), String::new());
        assert_eq!(l.shard_of(&labels), Some("shard-1"));
        assert!(l.is_draining(&labels), "presence counts, not the value");
        assert!(
            !RingLabels::new("other").is_draining(&labels),
            "keys are per ring"
        );
    }

    #[test]
    fn example_ring_matches_the_seed_golden_value() {
        assert_eq!(
            shard_label("example"),
            "shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example"
        );
        assert_eq!(
            drain_label("example"),
            "drain.alpha.sharding.timebertt.dev/clusterring-50d858e0-example"
        );
    }

    #[test]
    fn name_part_is_checksum_prefixed_for_a_table_of_rings() {
        // Checksums computed independently with `printf %s NAME | sha256sum | cut -c1-8`.
        let table = [
            ("example", "clusterring-50d858e0-example"),
            ("a", "clusterring-ca978112-a"),
            ("my-clusterring", "clusterring-f959313c-my-clusterring"),
            (
                "kube-controller-manager-deployment",
                "clusterring-9b5084f8-kube-controller-manager-deployment",
            ),
        ];
        for (ring, want) in table {
            assert_eq!(ring_label_name(ring), want, "ring {ring}");
        }
    }

    #[test]
    fn long_ring_names_are_truncated_to_63_characters() {
        let ring = "r".repeat(200);
        let name = ring_label_name(&ring);
        assert_eq!(name.len(), MAX_LABEL_NAME_LEN);
        assert!(name.starts_with("clusterring-"));
        // 12 ("clusterring-") + 8 (checksum) + 1 ("-") leaves 42 characters of the ring name.
        assert_eq!(&name[21..], "r".repeat(42));
        assert_eq!(shard_label(&ring), format!("{SHARD_LABEL_PREFIX}{name}"));
    }

    #[test]
    fn a_name_of_exactly_42_characters_is_not_truncated() {
        let ring = "x".repeat(42);
        assert_eq!(ring_label_name(&ring).len(), 63);
        assert!(ring_label_name(&ring).ends_with(&ring));
        let longer = "x".repeat(43);
        assert!(!ring_label_name(&longer).ends_with(&longer));
    }

    #[test]
    fn long_rings_sharing_a_prefix_get_distinct_keys() {
        let a = format!("{}-a", "p".repeat(80));
        let b = format!("{}-b", "p".repeat(80));
        assert_ne!(shard_label(&a), shard_label(&b));
    }

    #[test]
    fn shard_and_drain_keys_of_every_ring_are_sharding_labels() {
        for ring in ["example", "a", &"r".repeat(80)] {
            assert!(is_sharding_label(&shard_label(ring)), "{ring}");
            assert!(is_sharding_label(&drain_label(ring)), "{ring}");
        }
        for other in [
            RING_LABEL,
            STATE_LABEL,
            "app",
            "shard.alpha.sharding.timebertt.dev",
            "",
        ] {
            assert!(!is_sharding_label(other), "{other}");
        }
    }

    #[test]
    fn ring_labels_bundles_both_keys() {
        let labels = RingLabels::new("example");
        assert_eq!(labels.shard, shard_label("example"));
        assert_eq!(labels.drain, drain_label("example"));
    }
}
