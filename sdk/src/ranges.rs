//! A shard in range mode (docs/design.md §8): it serves the hash ranges its Lease assigns it,
//! through the apiserver's sharded list and watch. While its Lease is held it follows the
//! assignment: at each change it stops its controllers (in-flight reconciles finish), writes on
//! its Lease what it will serve (with the version of the Lease it read, so never more than that
//! assignment), and starts them again with a client whose lists and watches carry the selector.
//! It trusts no apiserver alone: it serves nothing where selectors are not applied, and the
//! reconcile wrapper skips and counts any object outside its ranges.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ApiResource, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use prometheus_client::registry::Registry;
use serde_json::json;
use sharder_common::ranges::{Range, RangeKey, SERVED_ANNOTATION, ShardSelector, valid_assignment};
use sharder_runtime::sharded::{applies_selectors, selecting_client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::lease::LeaseKeeper;
use crate::shard::{Shard, ShardError};

/// Aborts the controllers' task when dropped (the Lease was lost: they stop at once).
struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Asks the controllers to stop and waits until they did.
    async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shard {
    /// Runs the shard in range mode by `key` over `resources` (every resource its controllers
    /// watch): holds its Lease (in `namespace`) as [`run`](Self::run) does, and while it is held
    /// runs `controllers` with a client that lists and watches only the assigned ranges, again
    /// at every change of them (after the previous run stopped); none while nothing is assigned.
    pub async fn run_ranges<F, Fut>(
        &self,
        lease: LeaseKeeper,
        namespace: &str,
        key: RangeKey,
        resources: Vec<ApiResource>,
        shutdown: &CancellationToken,
        controllers: F,
    ) -> Result<(), ShardError>
    where
        F: Fn(Client, CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.run(lease, shutdown, |stop| {
            self.follow_ranges(namespace, key, resources, controllers, stop)
        })
        .await
    }

    async fn follow_ranges<F, Fut>(
        &self,
        namespace: &str,
        key: RangeKey,
        resources: Vec<ApiResource>,
        controllers: F,
        stop: CancellationToken,
    ) where
        F: Fn(Client, CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut events = std::pin::pin!(watcher(leases.clone(), config).applied_objects());
        let mut current: Option<Vec<Range>> = None;
        let mut running: Option<Running> = None;
        loop {
            let lease = tokio::select! {
                () = stop.cancelled() => break,
                event = events.next() => match event {
                    Some(Ok(lease)) => lease,
                    Some(Err(e)) => {
                        warn!(error = %e, "cannot watch the shard Lease; its assignment is followed once it can");
                        continue;
                    }
                    None => break,
                },
            };
            let mut assigned = valid_assignment(&lease);
            if current.as_ref() == Some(&assigned) {
                continue;
            }
            if let Some(run) = running.take() {
                run.stop().await;
            }
            self.set_serving(None);
            if !assigned.is_empty() && !self.selectors_applied(&resources).await {
                assigned.clear();
            }
            let selector = ShardSelector::new(key, assigned.iter().copied());
            let patch = json!({"metadata": {
                "resourceVersion": lease.resource_version(),
                "annotations": {SERVED_ANNOTATION: selector.to_string()},
            }});
            match leases
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    // A conflict: the Lease changed since; its next version comes as an event.
                    if !matches!(&e, kube::Error::Api(s) if s.code == 409) {
                        warn!(error = %e, "cannot write the served ranges; tried again at the Lease's next change");
                    }
                    current = None;
                    continue;
                }
            }
            info!(shard = %self.name, ranges = assigned.len(), "serving ranges");
            current = Some(assigned.clone());
            if assigned.is_empty() {
                continue;
            }
            self.set_serving(Some(selector.clone()));
            let client = selecting_client(&self.client, &selector, &resources);
            let token = stop.child_token();
            running = Some(Running {
                stop: token.clone(),
                task: tokio::spawn(controllers(client, token)),
            });
        }
        if let Some(run) = running.take() {
            run.stop().await;
        }
    }

    /// Whether the apiserver applies `shardSelector` to every one of `resources` (a failed
    /// probe counts as not).
    async fn selectors_applied(&self, resources: &[ApiResource]) -> bool {
        for resource in resources {
            match applies_selectors(&self.client, resource).await {
                Ok(true) => {}
                Ok(false) => {
                    warn!(resource = %resource.plural, "the apiserver ignores shardSelector (feature gate ShardedListAndWatch off): serving nothing");
                    return false;
                }
                Err(e) => {
                    warn!(resource = %resource.plural, error = %e, "cannot ask the apiserver whether it applies shardSelector: serving nothing");
                    return false;
                }
            }
        }
        true
    }

    /// Objects the reconcile wrapper was handed outside this shard's ranges (and skipped).
    pub fn out_of_range(&self) -> u64 {
        self.out_of_range.get()
    }

    /// Registers the shard's metrics in `registry`:
    /// `sharder_shard_out_of_range_objects_total`, the objects handed to the reconcile wrapper
    /// outside this shard's ranges (the apiserver did not apply its selector), skipped.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "sharder_shard_out_of_range_objects",
            "Objects handed to the reconcile wrapper outside this shard's ranges (the apiserver did not apply its selector), skipped",
            self.out_of_range.clone(),
        );
    }
}
