//! What the reconciler's controllers share: how one runs, the watch of the rings two of them
//! are built on, when the leader is ready, and the field manager of their writes.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use sharder_common::RingKind;
use sharder_runtime::controller::{self, Listed, listed_controller_with};
use sharder_runtime::{Readiness, Tasks};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::Error;

/// Field manager of the reconciler's server-side applies.
pub(crate) const FIELD_MANAGER: &str = "sharder-reconciler";

/// Readiness condition: the leader's watches (shard Leases, ClusterRings, webhook
/// configurations) have listed. A standby has nothing to list and is ready: it takes over when
/// the leader goes.
pub const CONTROLLERS_SYNCED: &str = "controllers-synced";

/// Spawns `controller` (its main watch `listed`) into `tasks` as `name`, with `reconcile` and
/// `error_policy`, until `shutdown` ([`controller::drive`]); `tasks` reports it if it ends
/// before that.
pub(crate) fn spawn_controller<K, C, F, Fut>(
    tasks: &mut Tasks,
    name: &'static str,
    (controller, listed): (Controller<K>, Listed),
    reconcile: F,
    error_policy: impl Fn(Arc<K>, &Error, Arc<C>) -> Action + Send + Sync + 'static,
    ctx: Arc<C>,
    shutdown: &CancellationToken,
) where
    K: Clone + kube::Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin + Send + Sync,
    C: Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<C>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let shutdown = shutdown.clone();
    tasks.spawn(name, async move {
        let running = controller
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {});
        controller::drive(running, &listed, &shutdown).await;
        Ok::<(), Error>(())
    });
}

/// A controller over the rings of `kind` matching `selector` (`--ring-selector`; empty: all),
/// saying when its watch listed.
pub fn ring_controller(
    client: kube::Client,
    kind: RingKind,
    selector: &str,
) -> (Controller<DynamicObject>, Listed) {
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(selector);
    }
    let resource = kind.api_resource();
    listed_controller_with(Api::all_with(client, &resource), config, resource)
}

/// Sets [`CONTROLLERS_SYNCED`] false until every one of `watches` has listed, then true.
pub(crate) async fn ready_when_listed(readiness: Readiness, watches: Vec<Listed>) {
    readiness.set(CONTROLLERS_SYNCED, false);
    let listed = futures::future::join_all(watches.into_iter().map(Listed::wait)).await;
    if listed.into_iter().all(|l| l) {
        readiness.set(CONTROLLERS_SYNCED, true);
        info!("watches listed, ready");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_leader_is_ready_only_once_every_watch_listed() {
        let readiness = Readiness::new([CONTROLLERS_SYNCED]);
        readiness.set(CONTROLLERS_SYNCED, true);
        let (leases, leases_listed) = Listed::channel();
        let (rings, rings_listed) = Listed::channel();
        let synced = tokio::spawn(ready_when_listed(
            readiness.clone(),
            vec![leases_listed, rings_listed],
        ));
        tokio::task::yield_now().await;
        assert!(!readiness.is_ready(), "not ready when leading starts");
        leases.listed();
        tokio::task::yield_now().await;
        assert!(!readiness.is_ready(), "one watch still lists");
        rings.listed();
        synced.await.expect("task");
        assert!(readiness.is_ready());
    }
}
