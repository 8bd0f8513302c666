//! The shard lease controller (design §4): keeps the state label on every shard Lease, takes
//! over `uncertain` Leases (proving the apiserver accepts writes before a shard is declared
//! dead), deletes `orphaned` ones, and wakes exactly at the next state boundary.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sharder_common::labels::{RING_LABEL, STATE_LABEL};
use sharder_common::lease::takeover_spec;
use sharder_common::{ClusterRing, ShardState, shard_state};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::metrics::{Metrics, ShardLabels};

/// Context of the shard lease controller.
pub struct Context {
    /// Client for Lease writes.
    pub client: Client,
    /// Metrics.
    pub metrics: Metrics,
    /// The managed ClusterRings when `--clusterring-selector` limits them (`None`: all rings);
    /// Leases of other rings are left alone.
    pub rings: Option<Store<ClusterRing>>,
}

fn requeue_at(next: Option<Timestamp>, now: Timestamp) -> Action {
    match next {
        Some(next) => {
            let wait = Duration::try_from(next.duration_since(now)).unwrap_or_default();
            // Wake just past the boundary, so the new state is already in force.
            Action::requeue(wait + Duration::from_millis(20))
        }
        None => Action::await_change(),
    }
}

async fn reconcile(lease: Arc<Lease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let now = Timestamp::now();
    let name = lease.name_any();
    let namespace = lease.namespace().unwrap_or_default();
    let ring = lease.labels().get(RING_LABEL).cloned().unwrap_or_default();
    let api = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
    if let Some(rings) = &ctx.rings
        && rings.get(&ObjectRef::new(&ring)).is_none()
    {
        // Not a ring of ours (or not listed yet): look again shortly.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let status = shard_state(&lease, now);

    for state in ShardState::ALL {
        let labels = ShardLabels {
            clusterring: ring.clone(),
            shard: name.clone(),
            state: state.as_str().to_owned(),
        };
        ctx.metrics
            .shard_state
            .get_or_create(&labels)
            .set(i64::from(state == status.state));
    }

    match status.state {
        ShardState::Uncertain => {
            let mut taken = (*lease).clone();
            let spec = taken.spec.clone().unwrap_or_default();
            taken.spec = Some(takeover_spec(&spec, now));
            taken
                .labels_mut()
                .insert(STATE_LABEL.to_owned(), ShardState::Dead.as_str().to_owned());
            match api.replace(&name, &PostParams::default(), &taken).await {
                Ok(_) => {
                    info!(clusterring = %ring, shard = %name, %namespace, "shard stopped renewing its lease: took the lease over, shard is dead");
                    Ok(Action::await_change())
                }
                // The shard renewed meanwhile: look again with the new version.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Ok(Action::requeue(Duration::from_millis(200)))
                }
                Err(e) => Err(Error::Kube(e)),
            }
        }
        ShardState::Orphaned => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.resource_version(),
                    uid: lease.uid(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    info!(clusterring = %ring, shard = %name, %namespace, "deleted orphaned shard lease");
                    for state in ShardState::ALL {
                        ctx.metrics.shard_state.remove(&ShardLabels {
                            clusterring: ring.clone(),
                            shard: name.clone(),
                            state: state.as_str().to_owned(),
                        });
                    }
                    Ok(Action::await_change())
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    Ok(Action::await_change())
                }
                Err(e) => Err(Error::Kube(e)),
            }
        }
        state => {
            if lease.labels().get(STATE_LABEL).map(String::as_str) != Some(state.as_str()) {
                let patch = json!({"metadata": {"labels": {STATE_LABEL: state.as_str()}}});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        info!(clusterring = %ring, shard = %name, %namespace, state = %state, "shard state")
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
                    Err(e) => return Err(Error::Kube(e)),
                }
            }
            Ok(requeue_at(status.next_change, now))
        }
    }
}

fn error_policy(lease: Arc<Lease>, error: &Error, _: Arc<Context>) -> Action {
    warn!(shard = %lease.name_any(), error = %error, "shard lease reconcile failed, retrying");
    Action::requeue(Duration::from_secs(2))
}

/// The controller over shard Leases (selector: the ring label exists), and its Lease store
/// (which the ring controller reads).
pub fn controller(client: Client) -> Controller<Lease> {
    Controller::new(
        Api::<Lease>::all(client),
        watcher::Config::default().labels(RING_LABEL),
    )
}

/// Runs the shard lease controller until `shutdown`.
pub async fn run(controller: Controller<Lease>, ctx: Arc<Context>, shutdown: CancellationToken) {
    controller
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

/// The shard Leases of `ring` from `store`.
pub fn leases_of(store: &Store<Lease>, ring: &str) -> Vec<Arc<Lease>> {
    store
        .state()
        .into_iter()
        .filter(|l| l.labels().get(RING_LABEL).map(String::as_str) == Some(ring))
        .collect()
}
