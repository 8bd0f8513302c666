//! The shard lease controller (docs/design.md §5): keeps the state label on every shard Lease, takes
//! over `uncertain` Leases (proving the apiserver accepts writes before a shard is declared
//! dead), deletes `orphaned` ones, and wakes exactly at the next state boundary.
//!
//! What to do with a Lease is a pure function of the Lease and the time ([`decide`]); the
//! controller only carries it out.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource as _, ResourceExt};
use serde_json::json;
use sharder_common::labels::STATE_LABEL;
use sharder_common::labels::shard_name_problem;
use sharder_common::lease::takeover_spec;
use sharder_common::{LeaseStatus, RingId, RingKind, ShardState, shard_state};
use sharder_runtime::metrics::RingLabel;
use tracing::{Instrument as _, info, info_span, warn};

use crate::Error;
use crate::metrics::{Metrics, ShardInfoLabels, ShardLabels};

/// How long after a state boundary the controller wakes, so the new state is in force.
pub(crate) const BOUNDARY_MARGIN: Duration = Duration::from_millis(20);

/// When to look again after a takeover lost a race with the shard's own renewal (409).
pub(crate) const CONFLICT_REQUEUE: Duration = Duration::from_millis(200);

/// When to look again at a Lease whose ring is not (yet) among the managed rings.
pub(crate) const UNKNOWN_RING_REQUEUE: Duration = Duration::from_secs(1);

/// When to retry after a failed reconcile.
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(2);

/// Context of the shard lease controller of one ring kind.
pub(crate) struct Context {
    /// The kind of the Leases' rings.
    pub kind: RingKind,
    /// Client for Lease writes.
    pub client: Client,
    /// Metrics.
    pub metrics: Metrics,
    /// Publishes Events on Leases.
    pub recorder: Recorder,
    /// The managed rings of the kind when `--ring-selector` limits them (`None`: all rings),
    /// and when their watch listed; Leases of other rings are left alone.
    pub rings: Option<(Store<DynamicObject>, sharder_runtime::controller::Listed)>,
}

/// What the controller does with a Lease.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LeaseAction {
    /// Write the state label (it is missing or stale), then wake after `wake`.
    Label {
        /// The state to write.
        state: ShardState,
        /// When to look again (`None`: only when the Lease changes).
        wake: Option<Duration>,
    },
    /// Nothing to write; look again after `wake` (`None`: only when the Lease changes).
    Wait(Option<Duration>),
    /// Take the `uncertain` Lease over with this spec (and label it dead).
    TakeOver(LeaseSpec),
    /// Delete the `orphaned` Lease (guarded by its resourceVersion).
    Delete,
}

/// How long until just past `next_change` (the next state boundary), if there is one.
pub(crate) fn wake_after(next_change: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    next_change.map(|next| {
        Duration::try_from(next.duration_since(now)).unwrap_or_default() + BOUNDARY_MARGIN
    })
}

/// The Lease's state at `now` and what to do about it.
pub(crate) fn decide(lease: &Lease, now: Timestamp) -> (LeaseStatus, LeaseAction) {
    let status = shard_state(lease, now);
    let action = match status.state {
        ShardState::Uncertain => {
            let spec = lease.spec.clone().unwrap_or_default();
            LeaseAction::TakeOver(takeover_spec(&spec, now))
        }
        ShardState::Orphaned => LeaseAction::Delete,
        state => {
            let wake = wake_after(status.next_change, now);
            if lease.labels().get(STATE_LABEL).map(String::as_str) == Some(state.as_str()) {
                LeaseAction::Wait(wake)
            } else {
                LeaseAction::Label { state, wake }
            }
        }
    };
    (status, action)
}

/// What is wrong with the name of a Lease its own shard holds, if that name cannot be a shard's
/// (see [`shard_name_problem`]).
fn refused_name(lease: &Lease) -> Option<String> {
    let name = lease.name_any();
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    (holder == Some(name.as_str()))
        .then(|| shard_name_problem(&name))
        .flatten()
}

fn requeue(wake: Option<Duration>) -> Action {
    wake.map_or_else(Action::await_change, Action::requeue)
}

/// Reconciles one object (for `crate::controllers::spawn_controller`).
pub(crate) async fn reconcile(lease: Arc<Lease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = lease.name_any();
    let namespace = lease.namespace().unwrap_or_default();
    let ring = RingId::new(
        ctx.kind,
        lease
            .labels()
            .get(ctx.kind.lease_label())
            .cloned()
            .unwrap_or_default(),
    );
    let span = info_span!("shard_lease", %ring, shard = %name, %namespace);
    async move {
        if let Some((rings, listed)) = &ctx.rings {
            // Until the rings listed, every ring would look unknown.
            listed.clone().wait().await;
            let key = ObjectRef::<DynamicObject>::new_with(&ring.name, ctx.kind.api_resource());
            if rings.get(&key).is_none() {
                // Not a ring of ours (or created a moment ago): look again shortly.
                return Ok(Action::requeue(UNKNOWN_RING_REQUEUE));
            }
        }
        let (status, action) = decide(&lease, Timestamp::now());
        record_state(&ctx.metrics, &ring, &namespace, &name, Some(status.state));
        let api = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
        match action {
            LeaseAction::TakeOver(spec) => {
                let mut taken = (*lease).clone();
                taken.spec = Some(spec);
                taken
                    .labels_mut()
                    .insert(STATE_LABEL.to_owned(), ShardState::Dead.as_str().to_owned());
                match api.replace(&name, &PostParams::default(), &taken).await {
                    Ok(_) => {
                        info!(
                            "shard stopped renewing its lease: took the lease over, shard is dead"
                        );
                        Ok(Action::await_change())
                    }
                    // The shard renewed meanwhile: look again with the new version.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Ok(Action::requeue(CONFLICT_REQUEUE))
                    }
                    Err(e) => Err(Error::Kube(e)),
                }
            }
            LeaseAction::Delete => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: lease.resource_version(),
                        uid: lease.uid(),
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {
                        info!("deleted orphaned shard lease");
                        record_state(&ctx.metrics, &ring, &namespace, &name, None);
                        Ok(Action::await_change())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                        Ok(Action::await_change())
                    }
                    Err(e) => Err(Error::Kube(e)),
                }
            }
            LeaseAction::Label { state, wake } => {
                let patch = json!({"metadata": {"labels": {STATE_LABEL: state.as_str()}}});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        info!(state = %state, "shard state");
                        if let Some(problem) = refused_name(&lease) {
                            warn!(%problem, "shard lease held under a name that cannot be a label value: the shard is not on the ring");
                            let event = Event {
                                type_: EventType::Warning,
                                reason: "InvalidShardName".into(),
                                note: Some(format!(
                                    "{problem}: the shard is not on the ring {ring}"
                                )),
                                action: "Label".into(),
                                secondary: None,
                            };
                            let reference = lease.object_ref(&());
                            if let Err(e) = ctx.recorder.publish(&event, &reference).await {
                                warn!(error = %e, "cannot publish an Event on the Lease");
                            }
                        }
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
                    Err(e) => return Err(Error::Kube(e)),
                }
                Ok(requeue(wake))
            }
            LeaseAction::Wait(wake) => Ok(requeue(wake)),
        }
    }
    .instrument(span)
    .await
}

/// Sets the state gauge of a shard: 1 for `state`, 0 for the others, and its info gauge to 1;
/// `None` removes them.
fn record_state(
    metrics: &Metrics,
    ring: &RingId,
    namespace: &str,
    shard: &str,
    state: Option<ShardState>,
) {
    let info = ShardInfoLabels {
        ring: RingLabel::new(ring),
        namespace: namespace.to_owned(),
        shard: shard.to_owned(),
    };
    if state.is_some() {
        metrics.shard_info.get_or_create(&info).set(1);
    } else {
        metrics.shard_info.remove(&info);
    }
    for candidate in ShardState::ALL {
        let labels = ShardLabels {
            ring: RingLabel::new(ring),
            namespace: namespace.to_owned(),
            shard: shard.to_owned(),
            state: candidate.as_str().to_owned(),
        };
        match state {
            Some(state) => {
                metrics
                    .shard_state
                    .get_or_create(&labels)
                    .set(i64::from(state == candidate));
            }
            None => {
                metrics.shard_state.remove(&labels);
            }
        }
    }
}

/// What to do after a failed reconcile (for `crate::controllers::spawn_controller`).
pub(crate) fn error_policy(lease: Arc<Lease>, error: &Error, _: Arc<Context>) -> Action {
    warn!(shard = %lease.name_any(), error = %error, "shard lease reconcile failed, retrying");
    Action::requeue(ERROR_REQUEUE)
}

/// The controller over the shard Leases of rings of `kind` (selector: the kind's ring label
/// exists), and its Lease store (which the ring controller of the kind reads).
pub(crate) fn controller(
    client: Client,
    kind: RingKind,
) -> (Controller<Lease>, sharder_runtime::controller::Listed) {
    sharder_runtime::controller::listed_controller(
        Api::<Lease>::all(client),
        watcher::Config::default().labels(kind.lease_label()),
    )
}

/// The shard Leases of `ring` from `store`.
pub(crate) fn leases_of(store: &Store<Lease>, ring: &RingId) -> Vec<Arc<Lease>> {
    store
        .state()
        .into_iter()
        .filter(|l| {
            l.labels().get(ring.kind.lease_label()).map(String::as_str) == Some(ring.name.as_str())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;
    use sharder_common::lease::LEASE_CONTROLLER_HOLDER;

    use super::*;

    const T0: i64 = 1_700_000_000;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(T0 + seconds).expect("valid")
    }

    /// Shard `s`'s Lease renewed at T0 for 10 s, held by `holder`, labelled with `label`.
    fn lease(holder: &str, label: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("s".into()),
                labels: label.map(|l| [(STATE_LABEL.to_owned(), l.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(at(0))),
                lease_duration_seconds: Some(10),
                ..LeaseSpec::default()
            }),
        }
    }

    fn ms(millis: u64) -> Option<Duration> {
        Some(Duration::from_millis(millis))
    }

    #[test]
    fn states_are_labelled_and_the_controller_wakes_just_past_the_next_boundary() {
        let table = [
            (
                lease("s", None),
                0,
                LeaseAction::Label {
                    state: ShardState::Ready,
                    wake: ms(10_020),
                },
            ),
            (lease("s", Some("ready")), 4, LeaseAction::Wait(ms(6_020))),
            (
                lease("s", Some("ready")),
                10,
                LeaseAction::Label {
                    state: ShardState::Expired,
                    wake: ms(10_020),
                },
            ),
            (
                lease("s", Some("expired")),
                15,
                LeaseAction::Wait(ms(5_020)),
            ),
            (
                lease("", Some("ready")),
                0,
                LeaseAction::Label {
                    state: ShardState::Dead,
                    wake: ms(70_020),
                },
            ),
            (lease("", Some("dead")), 69, LeaseAction::Wait(ms(1_020))),
        ];
        for (lease, now, want) in table {
            assert_eq!(
                decide(&lease, at(now)).1,
                want,
                "T0{now:+} {:?}",
                lease.metadata.labels
            );
        }
    }

    #[test]
    fn an_uncertain_lease_is_taken_over_for_twice_its_duration() {
        let (status, action) = decide(&lease("s", Some("expired")), at(20));
        assert_eq!(status.state, ShardState::Uncertain);
        let LeaseAction::TakeOver(spec) = action else {
            panic!("{action:?}");
        };
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(LEASE_CONTROLLER_HOLDER)
        );
        assert_eq!(spec.lease_duration_seconds, Some(20));
        assert_eq!(spec.renew_time, Some(MicroTime(at(20))));
    }

    #[test]
    fn an_orphaned_lease_is_deleted() {
        assert_eq!(
            decide(&lease("", Some("dead")), at(70)).1,
            LeaseAction::Delete
        );
        let taken = lease(LEASE_CONTROLLER_HOLDER, Some("dead"));
        assert_eq!(decide(&taken, at(69)).1, LeaseAction::Wait(ms(1_020)));
        assert_eq!(decide(&taken, at(70)).1, LeaseAction::Delete);
    }

    #[test]
    fn a_boundary_in_the_past_wakes_at_once() {
        assert_eq!(wake_after(Some(at(0)), at(5)), ms(20));
        assert_eq!(wake_after(None, at(5)), None);
    }

    #[tokio::test]
    async fn a_takeover_from_a_stale_view_is_refused_and_the_lease_looked_at_again() {
        // The reconciler's Lease watch may lag (after an apiserver restart, for seconds) and
        // show a renewing shard's Lease as uncertain: the takeover carries the
        // resourceVersion it saw, so the apiserver refuses it (409) instead of taking a live
        // shard's Lease.
        use http::{Method, Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut stale = lease("s", Some("expired"));
        stale.metadata.namespace = Some("ns".into());
        stale.metadata.resource_version = Some("7".into());
        stale.metadata.labels.get_or_insert_default().insert(
            RingKind::ClusterRing.lease_label().to_owned(),
            "ring".into(),
        );
        let client = Client::new(service, "default");
        let ctx = Arc::new(Context {
            kind: RingKind::ClusterRing,
            client: client.clone(),
            metrics: Metrics::new(&mut prometheus_client::registry::Registry::default()),
            recorder: Recorder::new(client, "test".into()),
            rings: None,
        });
        let apiserver = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("a request");
            assert_eq!(request.method(), Method::PUT);
            assert_eq!(
                request.uri().path(),
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/s"
            );
            let body = request.into_body().collect_bytes().await.expect("body");
            let sent: Lease = serde_json::from_slice(&body).expect("a Lease");
            assert_eq!(sent.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(
                sent.spec.and_then(|s| s.holder_identity).as_deref(),
                Some(LEASE_CONTROLLER_HOLDER)
            );
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the object has been modified"});
            respond.send_response(
                Response::builder()
                    .status(409)
                    .body(Body::from(serde_json::to_vec(&conflict).expect("json")))
                    .expect("response"),
            );
        });
        let action = reconcile(Arc::new(stale), ctx)
            .await
            .expect("a refused takeover is not an error");
        apiserver.await.expect("the takeover was sent as expected");
        assert_eq!(action, Action::requeue(CONFLICT_REQUEUE));
    }
}
