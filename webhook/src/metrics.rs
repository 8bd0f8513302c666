//! The webhook's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sharder_runtime::metrics::{ResourceLabels, RingLabel, register};

/// Labels of the not-assigned counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// The ring named in the request path.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// Why the object was not assigned ([`crate::admission::SkipReason`]).
    pub reason: String,
}

/// Labels of the owner lookup counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwnerLabels {
    /// The owner's state (`settled`, `draining`, `unassigned`, `missing`, `not_sharded`) or
    /// `error`.
    pub result: &'static str,
}

/// Labels of the request latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `assigned`, `already_assigned`, `skipped` or `bad_request`.
    pub outcome: &'static str,
}

/// All metrics of the webhook.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Objects assigned to a shard (dry-run requests not counted).
    pub assignments: Family<ResourceLabels, Counter>,
    /// Objects allowed without an assignment, by reason.
    pub not_assigned: Family<SkipLabels, Counter>,
    /// Time to answer a review, from body read to response serialized.
    pub request_duration: Family<RequestLabels, Histogram>,
    /// Available shards per ring, as the webhook sees them.
    pub available_shards: Family<RingLabel, Gauge>,
    /// Ring snapshot rebuilds per ring.
    pub ring_rebuilds: Family<RingLabel, Counter>,
    /// Owner reads for new controlled objects, by result.
    pub owner_lookups: Family<OwnerLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> Self {
        Self {
            assignments: register(
                registry,
                "controller_sharding_assignments",
                "Objects assigned to a shard by the webhook",
                Family::default(),
            ),
            not_assigned: register(
                registry,
                "sharder_webhook_not_assigned",
                "Objects the webhook allowed without assigning a shard, by reason",
                Family::default(),
            ),
            request_duration: register(
                registry,
                "sharder_webhook_request_duration_seconds",
                "Time to answer an admission review",
                Family::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
                }),
            ),
            available_shards: register(
                registry,
                "sharder_webhook_available_shards",
                "Available shards per ClusterRing as seen by the webhook",
                Family::default(),
            ),
            ring_rebuilds: register(
                registry,
                "controller_sharding_ring_calculations",
                "Hash rings calculated from the shard Leases per ClusterRing (snapshot rebuilds)",
                Family::default(),
            ),
            owner_lookups: register(
                registry,
                "sharder_webhook_owner_lookups",
                "Owner reads for new controlled objects (they follow their owner's current shard), by result",
                Family::default(),
            ),
        }
    }
}
