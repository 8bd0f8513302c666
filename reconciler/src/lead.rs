//! The leader's work: per served ring kind, the shard lease, ring and webhook configuration
//! controllers, each with its context built by its own constructor and run as a supervised task
//! until the leader Lease is lost or the process stops.

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use sharder_common::RingKind;
use sharder_common::label_guard::GuardSettings;
use sharder_common::webhook_configuration::{
    WebhookSettings, WebhookTarget, global_namespace_selector,
};
use sharder_runtime::controller::Listed;
use sharder_runtime::{Readiness, Tasks};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::args::Args;
use crate::controllers::{ready_when_listed, spawn_controller};
use crate::webhook_config::placement::Setting;
use crate::{metrics, rebalance, rings, shard_leases, webhook_config};

/// What the leader is handed when it starts leading.
pub(crate) struct Leader {
    /// The clients of rebalancing lists and writes.
    pub bulk: rebalance::Clients,
    /// This replica's identity (the Events' reporter instance).
    pub identity: String,
    /// The reconciler's metrics.
    pub metrics: metrics::Metrics,
    /// The webhook CA bundle, as it changes.
    pub ca: watch::Receiver<Vec<u8>>,
    /// The readiness the controllers' watches report to.
    pub readiness: Readiness,
}

/// Runs the shard lease, ring and webhook configuration controllers of every served ring kind
/// until `stop`; ready once their watches listed.
pub(crate) async fn lead(
    args: Args,
    client: kube::Client,
    leader: Leader,
    stop: CancellationToken,
) -> Result<(), Error> {
    let readiness = leader.readiness.clone();
    let guard = webhook_config::guard::settings(
        &client,
        args.label_guard,
        &args.label_guard_acknowledgers,
        &global_namespace_selector(args.namespace_selector.as_ref(), &args.namespace),
    )
    .await?;
    let placement =
        webhook_config::placement::setting(&client, args.placement_policy, &args.namespace).await?;
    let shared = Shared::new(&args, client, leader, (guard, placement), stop.clone());
    let mut tasks = Tasks::new(stop);
    let mut watches = Vec::new();
    for kind in args.rings.kinds() {
        watches.extend(shared.spawn_controllers(kind, &mut tasks));
    }
    let synced = tokio::spawn(ready_when_listed(readiness, watches));
    let result = tasks.supervise().await;
    synced.abort();
    Ok(result?)
}

/// What the controllers of every kind share.
struct Shared {
    client: kube::Client,
    metrics: metrics::Metrics,
    ca: watch::Receiver<Vec<u8>>,
    webhook: WebhookSettings,
    rebalancer: rebalance::Rebalancer,
    recorder: Recorder,
    intervals: rings::Intervals,
    selector: String,
    guard: Option<GuardSettings>,
    placement: Setting,
    stop: CancellationToken,
}

impl Shared {
    fn new(
        args: &Args,
        client: kube::Client,
        leader: Leader,
        (guard, placement): (Option<GuardSettings>, Setting),
        stop: CancellationToken,
    ) -> Self {
        let webhook = WebhookSettings {
            target: match &args.webhook_url {
                Some(url) => WebhookTarget::Url(url.clone()),
                None => WebhookTarget::Service {
                    namespace: args.namespace.clone(),
                    name: args.webhook_service_name.clone(),
                    port: args.webhook_service_port,
                },
            },
            ca_bundle: Vec::new(),
            timeout_seconds: args.webhook_timeout_seconds,
            namespace_selector: global_namespace_selector(
                args.namespace_selector.as_ref(),
                &args.namespace,
            ),
        };
        let rebalancer = rebalance::Rebalancer::new(
            leader.bulk,
            rebalance::Settings {
                page_size: args.list_page_size,
                max_concurrent_writes: args.max_concurrent_writes,
            },
            args.max_writes_per_second,
            leader.metrics.clone(),
        );
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "sharder-reconciler".into(),
                instance: Some(leader.identity),
            },
        );
        Self {
            client,
            metrics: leader.metrics,
            ca: leader.ca,
            webhook,
            rebalancer,
            recorder,
            intervals: rings::Intervals {
                resync: args.resync_interval,
                sweep: args.sweep_interval,
                drain_check: args.drain_check_interval,
            },
            selector: args.ring_selector.clone(),
            guard,
            placement,
            stop,
        }
    }

    /// Spawns the three controllers of `kind` into `tasks`; returns their watches. They start
    /// at once: a ring reconciled before all its shard Leases are in the store sees fewer
    /// shards, moves nothing off them, and takes each one appearing later as added.
    fn spawn_controllers(&self, kind: RingKind, tasks: &mut Tasks) -> [Listed; 3] {
        let (rings, ring_leases, acks) =
            rings::controller(self.client.clone(), kind, &self.selector);
        let leases = shard_leases::controller(self.client.clone(), kind);
        let configurations = webhook_config::controller::controller(
            self.client.clone(),
            kind,
            &self.selector,
            self.ca.clone(),
            self.guard.is_some(),
            self.placement.table_namespace().is_some(),
        );
        let watches = [leases.1.clone(), rings.1.clone(), configurations.1.clone()];
        let lease_ctx = shard_leases::Context {
            kind,
            client: self.client.clone(),
            metrics: self.metrics.clone(),
            recorder: self.recorder.clone(),
            // With a ring selector, the Leases of unselected rings are left alone.
            rings: (!self.selector.is_empty()).then(|| (rings.0.store(), rings.1.clone())),
        };
        let ring_ctx = rings::Context {
            kind,
            client: self.client.clone(),
            rings: rings.0.store(),
            leases: ring_leases,
            namespace_selector: self.webhook.namespace_selector.clone(),
            rebalancer: self.rebalancer.clone(),
            intervals: self.intervals,
            metrics: self.metrics.clone(),
            recorder: self.recorder.clone(),
            acks,
            memory: Default::default(),
            table_namespace: self.placement.table_namespace().map(str::to_owned),
        };
        let configuration_ctx = webhook_config::controller::Context {
            kind,
            client: self.client.clone(),
            settings: self.webhook.clone(),
            ca: self.ca.clone(),
            resync: self.intervals.resync,
            metrics: self.metrics.clone(),
            guards: webhook_config::guard::Guards::new(self.guard.clone()),
            placements: webhook_config::placement::Placements::new(self.placement.clone()),
        };
        use webhook_config::controller as configuration;
        let stop = &self.stop;
        let (lease_ctx, ring_ctx) = (Arc::new(lease_ctx), Arc::new(ring_ctx));
        spawn_controller(
            tasks,
            "shard lease controller",
            leases,
            shard_leases::reconcile,
            shard_leases::error_policy,
            lease_ctx,
            stop,
        );
        spawn_controller(
            tasks,
            "ring controller",
            rings,
            rings::reconcile,
            rings::error_policy,
            ring_ctx,
            stop,
        );
        spawn_controller(
            tasks,
            "webhook configuration controller",
            configurations,
            configuration::reconcile,
            configuration::error_policy,
            Arc::new(configuration_ctx),
            stop,
        );
        watches
    }
}
