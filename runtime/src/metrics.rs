//! Label sets of the Prometheus metrics the webhook and the reconciler share (names as in the
//! reference implementation where one exists).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::{Metric, Registry};

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
    /// The ClusterRing.
    pub clusterring: String,
    /// API group of the resource.
    pub group: String,
    /// The resource.
    pub resource: String,
}

/// Labels of per-ring metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RingLabel {
    /// The ClusterRing.
    pub clusterring: String,
}

impl RingLabel {
    /// The labels of ring `ring`.
    pub fn new(ring: &str) -> Self {
        Self {
            clusterring: ring.to_owned(),
        }
    }
}
