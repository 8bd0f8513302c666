//! The reconciler's Prometheus metrics (names as in the reference implementation where one
//! exists).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of per-resource counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The ClusterRing.
    pub clusterring: String,
    /// API group.
    pub group: String,
    /// Resource.
    pub resource: String,
}

/// Labels of per-ring metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RingLabels {
    /// The ClusterRing.
    pub clusterring: String,
}

/// Labels of the shard state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    /// The ClusterRing.
    pub clusterring: String,
    /// The shard (Lease name).
    pub shard: String,
    /// The state (`ready`, `expired`, `uncertain`, `dead`, `orphaned`).
    pub state: String,
}

/// All metrics of the reconciler.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Objects assigned directly by the reconciler (unassigned, dead shard, controlled).
    pub movements: Family<ResourceLabels, Counter>,
    /// Drain labels added.
    pub drains: Family<ResourceLabels, Counter>,
    /// Duration of rebalances.
    pub resync_duration: Family<RingLabels, Histogram>,
    /// Shard Leases per ring.
    pub shards: Family<RingLabels, Gauge>,
    /// Available shards per ring.
    pub available_shards: Family<RingLabels, Gauge>,
    /// 1 for the current state of each shard Lease.
    pub shard_state: Family<ShardLabels, Gauge>,
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            movements: Family::default(),
            drains: Family::default(),
            resync_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            shards: Family::default(),
            available_shards: Family::default(),
            shard_state: Family::default(),
        };
        registry.register(
            "controller_sharding_movements",
            "Objects assigned directly by the reconciler",
            metrics.movements.clone(),
        );
        registry.register(
            "controller_sharding_drains",
            "Drain labels added by the reconciler",
            metrics.drains.clone(),
        );
        registry.register(
            "sharder_reconciler_resync_duration_seconds",
            "Duration of rebalances per ClusterRing",
            metrics.resync_duration.clone(),
        );
        registry.register(
            "sharder_reconciler_ring_shards",
            "Shard Leases per ClusterRing",
            metrics.shards.clone(),
        );
        registry.register(
            "sharder_reconciler_ring_available_shards",
            "Available shards per ClusterRing",
            metrics.available_shards.clone(),
        );
        registry.register(
            "sharder_reconciler_shard_state",
            "1 for the current state of each shard Lease",
            metrics.shard_state.clone(),
        );
        metrics
    }
}
