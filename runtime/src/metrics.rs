//! Label sets of the Prometheus metrics the webhook and the reconciler share (names as in the
//! reference implementation where one exists).

use prometheus_client::encoding::{EncodeLabel as _, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::registry::{Metric, Registry};
use sharder_common::RingId;

/// Registers `metric` under `name` with `help` and returns it (metrics are handles: the
/// returned clone and the registered one are the same metric).
pub fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Labels of per-resource counters (`controller_sharding_assignments_total`,
/// `controller_sharding_movements_total`, `controller_sharding_drains_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// API group of the resource.
    pub group: String,
    /// The resource.
    pub resource: String,
}

/// The label naming a ring in per-ring metrics: `clusterring="<name>"` for a ClusterRing,
/// `controllerring="<name>"` for a ControllerRing (as the reference names it). Flatten it into
/// other label sets with `#[prometheus(flatten)]`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RingLabel(pub RingId);

impl RingLabel {
    /// The label of `ring`.
    pub fn new(ring: &RingId) -> Self {
        Self(ring.clone())
    }
}

impl EncodeLabelSet for RingLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        (self.0.kind.lower(), self.0.name.as_str()).encode(encoder.encode_label())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    use super::*;

    #[test]
    fn each_ring_kind_names_its_own_label() {
        let mut registry = Registry::default();
        let family = register(
            &mut registry,
            "controller_sharding_assignments",
            "Assignments",
            Family::<ResourceLabels, Counter>::default(),
        );
        for ring in [RingId::cluster_ring("a"), RingId::controller_ring("b")] {
            family
                .get_or_create(&ResourceLabels {
                    ring: RingLabel::new(&ring),
                    group: "apps".into(),
                    resource: "deployments".into(),
                })
                .inc();
        }
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(
                r#"controller_sharding_assignments_total{clusterring="a",group="apps",resource="deployments"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"controller_sharding_assignments_total{controllerring="b",group="apps",resource="deployments"} 1"#
            ),
            "{text}"
        );
    }
}
