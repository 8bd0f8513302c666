//! The reconciler's Prometheus metrics (names as in the reference implementation where one
//! exists).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sharder_common::RingKind;
use sharder_runtime::metrics::{ResourceLabels, RingLabel, register};

/// Labels of the shard state set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ShardLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// The Lease's namespace.
    pub namespace: String,
    /// The shard (Lease name).
    pub shard: String,
    /// The state (`ready`, `expired`, `uncertain`, `dead`, `orphaned`).
    pub state: String,
}

/// Labels of the shard info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ShardInfoLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// The Lease's namespace.
    pub namespace: String,
    /// The shard (Lease name).
    pub shard: String,
}

/// Labels of the failed write counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailedWriteLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// API group of the resource.
    pub group: String,
    /// The resource.
    pub resource: String,
    /// `conflict` (still conflicting after retries) or `error` (the apiserver refused or failed).
    pub reason: String,
}

/// Labels of a counter of a ring's events by reason: the failed rebalances (`list`, `write`, or
/// `reconcile` when the ring's reconcile failed) and the webhook configuration writes
/// (`missing`, `ca_bundle` or `changed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// Why.
    pub reason: String,
}

/// Labels of the rebalance counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RebalanceLabels {
    /// The ring.
    #[prometheus(flatten)]
    pub ring: RingLabel,
    /// A list the rebalance ran: `all`, `on_shard`, `unassigned`, `stray` or `after_drains`.
    pub list: String,
}

/// Labels of the leader gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LeaderLabels {
    /// The leader election Lease.
    pub name: String,
}

/// All metrics of the reconciler.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    /// Objects assigned directly by the reconciler (unassigned, dead shard, controlled).
    pub movements: Family<ResourceLabels, Counter>,
    /// Drain labels added.
    pub drains: Family<ResourceLabels, Counter>,
    /// Duration of rebalances (its count: the rebalances).
    pub rebalance_duration: Family<RingLabel, Histogram>,
    /// Rebalances by each list they ran.
    pub rebalances: Family<RebalanceLabels, Counter>,
    /// Objects the rebalances' lists returned.
    pub listed_objects: Family<RingLabel, Counter>,
    /// Drains not acknowledged yet, as the last rebalance counted them.
    pub pending_drains: Family<RingLabel, Gauge>,
    /// 1 while drain checks follow the last rebalance, 0 once its moves are done.
    pub drain_checks_scheduled: Family<RingLabel, Gauge>,
    /// Each ring's generation, one family per ring kind ([`RingKind::state_metric`]).
    pub metadata_generation: BTreeMap<RingKind, Family<RingLabel, Gauge>>,
    /// The generation the reconciler last observed, per ring and kind.
    pub observed_generation: BTreeMap<RingKind, Family<RingLabel, Gauge>>,
    /// Shard Leases per ring, one family per ring kind.
    pub shards: BTreeMap<RingKind, Family<RingLabel, Gauge>>,
    /// Available shards per ring, one family per ring kind.
    pub available_shards: BTreeMap<RingKind, Family<RingLabel, Gauge>>,
    /// State set per shard Lease: 1 for its current state, 0 for the others.
    pub shard_state: Family<ShardLabels, Gauge>,
    /// 1 for every shard Lease seen (as the reference's `controller_sharding_shard_info`).
    pub shard_info: Family<ShardInfoLabels, Gauge>,
    /// Hash rings calculated (one per rebalance).
    pub ring_calculations: Family<RingLabel, Counter>,
    /// Object writes that failed after retries.
    pub failed_writes: Family<FailedWriteLabels, Counter>,
    /// Rebalances (or ring reconciles) that failed, by reason.
    pub failed_rebalances: Family<ReasonLabels, Counter>,
    /// Webhook configuration writes by reason.
    pub webhook_configuration_writes: Family<ReasonLabels, Counter>,
    /// 1 while this replica leads.
    pub leader: Family<LeaderLabels, Gauge>,
    /// Object writes in flight at most now (the adaptive limit).
    pub write_concurrency: Gauge,
    /// Object writes the apiserver was too busy for (429, 503, 504) or that could not reach it.
    pub overloaded_writes: Family<RingLabel, Counter>,
    /// Objects no available shard held (no shard label, or a shard not in the ring), as the last
    /// full list or sweep of their resource found them.
    pub unassigned_objects: Family<ResourceLabels, Gauge>,
    /// How long the oldest of those had existed when that list ended, in seconds.
    pub unassigned_oldest_seconds: Family<ResourceLabels, Gauge<f64, AtomicU64>>,
}

/// One gauge family per ring kind named [`RingKind::state_metric`]`(name)`, each registered with
/// help "The <kind>'s <what>".
fn state_gauges(
    registry: &mut Registry,
    name: &str,
    what: &str,
) -> BTreeMap<RingKind, Family<RingLabel, Gauge>> {
    RingKind::ALL
        .into_iter()
        .map(|kind| {
            let help = format!("The {kind}'s {what}");
            let family = register(registry, &kind.state_metric(name), &help, Family::default());
            (kind, family)
        })
        .collect()
}

impl Metrics {
    /// Creates and registers the metrics.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        Self {
            movements: register(
                registry,
                "controller_sharding_movements",
                "Objects assigned directly by the reconciler",
                Family::default(),
            ),
            drains: register(
                registry,
                "controller_sharding_drains",
                "Drain labels added by the reconciler",
                Family::default(),
            ),
            rebalance_duration: register(
                registry,
                "sharder_reconciler_rebalance_duration_seconds",
                "Duration of rebalances per ring (its count: the rebalances)",
                Family::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.005, 2.0, 14))
                }),
            ),
            rebalances: register(
                registry,
                "sharder_reconciler_rebalances",
                "Rebalances per ring by each list they ran (all, on_shard, unassigned, stray, after_drains); one that ran two lists counts under each",
                Family::default(),
            ),
            listed_objects: register(
                registry,
                "sharder_reconciler_listed_objects",
                "Objects the rebalances' lists returned, per ring",
                Family::default(),
            ),
            pending_drains: register(
                registry,
                "sharder_reconciler_pending_drains",
                "Drains the ring's shards had not acknowledged yet when its last rebalance counted them",
                Family::default(),
            ),
            drain_checks_scheduled: register(
                registry,
                "sharder_reconciler_drain_checks_scheduled",
                "1 while drain checks follow the ring's last rebalance (drains pending, children waiting for their owners), 0 once its moves are done",
                Family::default(),
            ),
            metadata_generation: state_gauges(registry, "metadata_generation", "generation"),
            observed_generation: state_gauges(
                registry,
                "observed_generation",
                "latest generation the reconciler observed",
            ),
            shards: state_gauges(registry, "status_shards", "number of shard Leases"),
            available_shards: state_gauges(
                registry,
                "status_available_shards",
                "number of available shards",
            ),
            shard_info: register(
                registry,
                "controller_sharding_shard_info",
                "Information about a shard: 1 for each shard Lease",
                Family::default(),
            ),
            shard_state: register(
                registry,
                "controller_sharding_shard_state",
                "State set of each shard Lease: 1 for its current state, 0 for the others",
                Family::default(),
            ),
            ring_calculations: register(
                registry,
                "controller_sharding_ring_calculations",
                "Hash rings calculated from the shard Leases per ring",
                Family::default(),
            ),
            failed_writes: register(
                registry,
                "sharder_reconciler_failed_writes",
                "Object writes (drains, assignments) that failed after retries",
                Family::default(),
            ),
            failed_rebalances: register(
                registry,
                "sharder_reconciler_failed_rebalances",
                "Rebalances and ring reconciles that failed, by reason (list, write, reconcile)",
                Family::default(),
            ),
            webhook_configuration_writes: register(
                registry,
                "sharder_reconciler_webhook_configuration_writes",
                "Webhook configuration writes by reason (missing, ca_bundle, changed)",
                Family::default(),
            ),
            leader: register(
                registry,
                "leader_election_master_status",
                "1 while this replica is the leader (name: the leader election Lease)",
                Family::default(),
            ),
            write_concurrency: register(
                registry,
                "sharder_reconciler_write_concurrency_limit",
                "Object writes the reconciler keeps in flight at most now (adapts to the apiserver's answers, up to --max-concurrent-writes)",
                Gauge::default(),
            ),
            overloaded_writes: register(
                registry,
                "sharder_reconciler_overloaded_writes",
                "Object writes the apiserver was too busy for (429, 503, 504) or that did not reach it; each is sent again after a wait",
                Family::default(),
            ),
            unassigned_objects: register(
                registry,
                "sharder_reconciler_unassigned_objects",
                "Objects no available shard held (no shard label, or a shard not in the ring) when the last full list or sweep of their resource ended; that rebalance assigns them",
                Family::default(),
            ),
            unassigned_oldest_seconds: register(
                registry,
                "sharder_reconciler_unassigned_oldest_seconds",
                "How long the oldest of the unassigned objects had existed when that list ended (0: none)",
                Family::default(),
            ),
        }
    }
}
