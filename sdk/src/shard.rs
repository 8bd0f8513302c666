//! What a sharded kube-rs controller needs, by the protocol of `docs/design.md` §3-§6:
//! keep its own shard Lease (and stop at once when it is lost), watch only
//! the objects assigned to it, and acknowledge drains.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube::runtime::WatchStreamExt as _;
//! use kube::runtime::controller::Action;
//! use kube::{Api, Client};
//! use sharder_sdk::controller::{drive, listed_controller, watch};
//! use sharder_sdk::RingId;
//! use sharder_sdk::shard::{Shard, ShardReconcileError};
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("reconcile failed")]
//! struct MyError;
//!
//! async fn reconcile(secret: Arc<Secret>, _ctx: Arc<()>) -> Result<Action, MyError> {
//!     // The business logic: only ever called for Secrets assigned to this shard and not
//!     // being drained.
//!     Ok(Action::await_change())
//! }
//!
//! # async fn example() -> Result<(), sharder_sdk::shard::ShardError> {
//! let client = Client::try_default().await.expect("kubeconfig");
//! // The shard's name is its Lease's name and holder identity (usually the pod name).
//! let ring = RingId::controller_ring("my-operator");
//! let shard = Shard::new(client.clone(), ring, "my-operator-0");
//! let lease = shard.lease("my-operator-system", Duration::from_secs(15), Duration::from_secs(2));
//! let shutdown = CancellationToken::new(); // e.g. sharder_sdk::shutdown_on_signal()
//! let reconciler = shard.reconciler(reconcile);
//! let config = shard.watcher_config();
//! shard
//!     .run(lease, &shutdown, |stop| async move {
//!         // `listed_controller` + `drive`: a shard stopped before its watch listed ends at
//!         // once (kube-runtime alone would wait for that list forever). `watch` for the
//!         // owned objects: like the main watch, it reconnects every second while the
//!         // apiserver restarts.
//!         let (controller, listed) = listed_controller(Api::<Secret>::all(client.clone()), config.clone());
//!         let running = controller
//!             .owns_stream(watch(Api::<ConfigMap>::all(client.clone()), config).touched_objects())
//!             .graceful_shutdown_on(stop.clone().cancelled_owned())
//!             .run(reconciler, |_, _: &ShardReconcileError<MyError>, _| {
//!                 Action::requeue(Duration::from_secs(5))
//!             }, Arc::new(()))
//!             .for_each(|_| async {});
//!         drive(running, &listed, &stop).await;
//!     })
//!     .await
//! # }
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::Predicate;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use serde_json::json;
use sharder_common::key::display_name;
use sharder_common::labels::shard_name_problem;
use sharder_common::ranges::ShardSelector;
use sharder_common::{RingId, RingLabels};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::lease::{HoldError, Holding, LeaseConfig, LeaseError, LeaseKeeper, OnStop, hold};

/// Why a shard stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The shard's name cannot be the value of the shard label, so no object could ever be
    /// assigned to it: refused before the Lease is touched.
    #[error(
        "shard name {name:?} {problem}: it is the value of the shard label on every object of the shard"
    )]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The shard Lease could not be acquired or released.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The shard Lease was lost (not renewed in time, or taken over): the controllers were
    /// stopped at once. Exit and let the process be restarted.
    #[error("shard lease {0} lost: controllers stopped")]
    LeaseLost(String),
    /// The controllers returned without being asked to stop (e.g. a watch stream ended): the
    /// Lease was handled as on a graceful stop. Exit and let the process be restarted.
    #[error("the controllers of shard {0} ended without being asked to stop")]
    ControllersEnded(String),
}

/// The error of a reconcile wrapped by [`Shard::reconciler`].
#[derive(Debug, thiserror::Error)]
pub enum ShardReconcileError<E> {
    /// The wrapped reconcile function failed.
    #[error(transparent)]
    Reconcile(E),
    /// Acknowledging a drain failed (a conflict means the object changed: it is retried).
    #[error("cannot acknowledge the drain of {object}: {source}")]
    Acknowledge {
        /// `namespace/name` of the object.
        object: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },
    /// The shard Lease was lost while reconciling: the reconcile was abandoned.
    #[error("shard lease lost, reconcile of {0} abandoned")]
    LeaseLost(String),
}

/// One shard of one ring (a ClusterRing or a ControllerRing): its name (= Lease name = holder
/// identity) and label keys.
#[derive(Clone)]
pub struct Shard {
    pub(crate) client: Client,
    ring: RingId,
    pub(crate) name: String,
    labels: RingLabels,
    on_stop: OnStop,
    halted: CancellationToken,
    /// In range mode, the ranges served now (`None`: label mode, or none yet).
    serving: Arc<RwLock<Option<ShardSelector>>>,
    /// Objects handed to the reconcile wrapper outside the served ranges.
    pub(crate) out_of_range: Counter,
}

/// The ring a shard joins, as flags: exactly one of `--clusterring` and `--controllerring`
/// (flatten it into a shard's arguments).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
#[group(required = true, multiple = false)]
pub struct RingArgs {
    /// The ClusterRing this shard belongs to (the reference's v0.8 contract).
    #[arg(long, env = "SHARD_CLUSTERRING")]
    pub clusterring: Option<String>,

    /// The ControllerRing this shard belongs to (the reference's contract since v0.9).
    #[arg(long, env = "SHARD_CONTROLLERRING")]
    pub controllerring: Option<String>,
}

impl RingArgs {
    /// The ring the flags name.
    ///
    /// # Panics
    /// When neither is set, which clap refuses when it parses them: a value built by hand must
    /// name a ring.
    pub fn id(&self) -> RingId {
        match (&self.clusterring, &self.controllerring) {
            (_, Some(name)) => RingId::controller_ring(name.as_str()),
            (Some(name), None) => RingId::cluster_ring(name.as_str()),
            (None, None) => panic!("RingArgs names no ring: set clusterring or controllerring"),
        }
    }
}

/// What the wrapper does with an object handed to it.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Assigned here and not draining: reconcile it.
    Reconcile,
    /// Assigned here and draining: acknowledge, do not reconcile.
    Acknowledge,
    /// Not assigned here (a stale event): leave it alone.
    Skip,
    /// In range mode, outside the ranges served: the apiserver sent what the selector excludes
    /// (its gate may be off). Left alone and counted ([`Shard::out_of_range`]).
    OutOfRange,
}

impl Shard {
    /// The shard `name` of `ring` (e.g. `RingId::controller_ring("my-operator")`).
    pub fn new(client: Client, ring: RingId, name: &str) -> Self {
        Self {
            client,
            labels: ring.labels(),
            ring,
            name: name.to_owned(),
            on_stop: OnStop::Release,
            halted: CancellationToken::new(),
            serving: Arc::default(),
            out_of_range: Counter::default(),
        }
    }

    /// In range mode, the ranges this shard serves now.
    pub fn serving(&self) -> Option<ShardSelector> {
        self.serving
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_serving(&self, selector: Option<ShardSelector>) {
        *self.serving.write().unwrap_or_else(|p| p.into_inner()) = selector;
    }

    /// What [`run`](Self::run) does with the shard Lease after a graceful stop.
    ///
    /// - [`OnStop::Release`] (the default): release it, so the shard is dead at once and its
    ///   objects move to the other shards without waiting. Right for shards whose names change
    ///   with every start (a Deployment's pods): a stopped name never comes back.
    /// - [`OnStop::Keep`]: stop renewing, do not release. The Lease runs out after its duration;
    ///   a shard started again with the same name within that time takes its own Lease back at
    ///   once and keeps its objects, so a rolling update of stable names (a StatefulSet's pods)
    ///   moves nothing. If it does not come back, its objects move once the Lease has expired
    ///   and been taken over (about twice the duration), as after a crash.
    pub fn with_on_stop(mut self, on_stop: OnStop) -> Self {
        self.on_stop = on_stop;
        self
    }

    /// The shard's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ring's shard and drain label keys.
    pub fn labels(&self) -> &RingLabels {
        &self.labels
    }

    /// The label selector of this shard's objects: `<shard label>=<name>`.
    pub fn selector(&self) -> String {
        format!("{}={}", self.labels.shard, self.name)
    }

    /// A watcher configuration that lists and watches only this shard's objects. Use it for
    /// every watch of a sharded resource (main and controlled).
    pub fn watcher_config(&self) -> watcher::Config {
        watcher::Config::default().labels(&self.selector())
    }

    /// The keeper of this shard's Lease in `namespace`: named after the shard, held by the
    /// shard's name, labelled with the ring.
    pub fn lease(
        &self,
        namespace: &str,
        duration: Duration,
        renew_interval: Duration,
    ) -> LeaseKeeper {
        LeaseKeeper::new(
            self.client.clone(),
            LeaseConfig {
                namespace: namespace.to_owned(),
                name: self.name.clone(),
                identity: self.name.clone(),
                duration,
                renew_interval,
                labels: BTreeMap::from([(
                    self.ring.kind.lease_label().to_owned(),
                    self.ring.name.clone(),
                )]),
            },
        )
    }

    /// What to do with `object`: reconcile, acknowledge its drain, or skip it.
    pub fn verdict<K: Resource>(&self, object: &K) -> Verdict {
        if let Some(selector) = self.serving() {
            let meta = object.meta();
            let uid = meta.uid.as_deref().unwrap_or_default();
            return if selector.selects(uid, meta.namespace.as_deref()) {
                Verdict::Reconcile
            } else {
                Verdict::OutOfRange
            };
        }
        let labels = object.labels();
        if self.labels.shard_of(labels) != Some(self.name.as_str()) {
            Verdict::Skip
        } else if self.labels.is_draining(labels) {
            Verdict::Acknowledge
        } else {
            Verdict::Reconcile
        }
    }

    /// Wraps a predicate (for `predicate_filter`) so that an object's drain label passes
    /// whatever the predicate says: a drain must always reach the reconciler.
    pub fn predicate<K: Resource, P: Predicate<K>>(
        &self,
        inner: P,
    ) -> impl Predicate<K> + use<K, P> {
        let labels = self.labels.clone();
        move |object: &K| {
            let draining = labels.is_draining(object.labels());
            let mut hasher = DefaultHasher::new();
            (inner.hash_property(object), draining).hash(&mut hasher);
            Some(hasher.finish())
        }
    }

    /// Wraps a kube-runtime reconcile function: objects not assigned to this shard are skipped,
    /// a drain is acknowledged (both labels removed, guarded by the object's resourceVersion)
    /// instead of reconciling, and a reconcile in flight is abandoned when the Lease is lost.
    pub fn reconciler<K, C, E, F, Fut>(
        &self,
        reconcile: F,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, ShardReconcileError<E>>>
    + use<K, C, E, F, Fut>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        C: Send + Sync + 'static,
        E: Send + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let shard = self.clone();
        let reconcile = Arc::new(reconcile);
        move |object: Arc<K>, ctx: Arc<C>| {
            let shard = shard.clone();
            let reconcile = Arc::clone(&reconcile);
            let key = display_name(object.meta());
            let span = info_span!("reconcile", shard = %shard.name, object = %key);
            Box::pin(
                async move {
                    if shard.halted.is_cancelled() {
                        return Err(ShardReconcileError::LeaseLost(key));
                    }
                    match shard.verdict(object.as_ref()) {
                        Verdict::Skip => {
                            debug!("not assigned to this shard, skipped");
                            Ok(Action::await_change())
                        }
                        Verdict::OutOfRange => {
                            shard.out_of_range.inc();
                            warn!("outside this shard's ranges, skipped: the apiserver may not apply shardSelector");
                            Ok(Action::await_change())
                        }
                        Verdict::Acknowledge => shard.acknowledge(object.as_ref()).await,
                        Verdict::Reconcile => {
                            tokio::select! {
                                biased;
                                () = shard.halted.cancelled() => Err(ShardReconcileError::LeaseLost(key)),
                                result = reconcile(object, ctx) => result.map_err(ShardReconcileError::Reconcile),
                            }
                        }
                    }
                }
                .instrument(span),
            )
        }
    }

    async fn acknowledge<K, E>(&self, object: &K) -> Result<Action, ShardReconcileError<E>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let key = display_name(object.meta());
        let resource = ApiResource::erase::<K>(&());
        let api: Api<DynamicObject> = match object.namespace() {
            Some(ns) => Api::namespaced_with(self.client.clone(), &ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let patch = json!({
            "metadata": {
                "resourceVersion": object.resource_version(),
                "labels": { self.labels.shard.as_str(): null, self.labels.drain.as_str(): null },
            }
        });
        // The answer carries the object's metadata only.
        api.patch_metadata(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| ShardReconcileError::Acknowledge {
            object: key.clone(),
            source,
        })?;
        info!("drain acknowledged");
        Ok(Action::await_change())
    }

    /// Runs the shard: waits for its Lease, then runs `controllers` (given a token that asks
    /// them to stop gracefully) while renewing the Lease; no reconcile runs before the Lease is
    /// held.
    ///
    /// On `shutdown` the controllers are asked to stop; once they finished the Lease is released
    /// (or kept, see [`with_on_stop`](Self::with_on_stop)). When the Lease is lost the controllers
    /// are dropped at once (in-flight reconciles abandoned) and [`ShardError::LeaseLost`]
    /// returned; when they return by themselves, [`ShardError::ControllersEnded`].
    pub async fn run<F, Fut>(
        &self,
        lease: LeaseKeeper,
        shutdown: &CancellationToken,
        controllers: F,
    ) -> Result<(), ShardError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        if let Some(problem) = shard_name_problem(&self.name) {
            return Err(ShardError::InvalidName {
                name: self.name.clone(),
                problem,
            });
        }
        let result = hold(lease, shutdown, self.on_stop, |holding: Holding| {
            info!(shard = %self.name, ring = %self.ring, "shard lease held, starting controllers");
            let running = controllers(holding.stop);
            async move {
                running.await;
                Ok::<(), Infallible>(())
            }
        })
        .await;
        match result {
            Ok(()) => {
                match self.on_stop {
                    OnStop::Release => {
                        info!(shard = %self.name, "controllers stopped, shard lease released");
                    }
                    OnStop::Keep => info!(
                        shard = %self.name,
                        "controllers stopped, shard lease kept (it runs out unless this name comes back)"
                    ),
                }
                Ok(())
            }
            Err(HoldError::Lease(e)) => Err(e.into()),
            Err(HoldError::Lost(_)) => {
                self.halted.cancel();
                Err(ShardError::LeaseLost(self.name.clone()))
            }
            Err(HoldError::Ended(_)) => Err(ShardError::ControllersEnded(self.name.clone())),
            Err(HoldError::Work(never)) => match never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;
    use kube::runtime::predicates;

    use super::*;

    fn shard() -> Shard {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        Shard::new(client, RingId::cluster_ring("example"), "shard-0")
    }

    fn secret(labels: &[(&str, &str)], generation: i64) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                generation: Some(generation),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    #[tokio::test]
    async fn a_name_that_cannot_be_a_label_value_is_refused_before_the_lease_is_touched() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        let name = "s".repeat(64);
        let shard = Shard::new(client, RingId::cluster_ring("example"), &name);
        let lease = shard.lease("ns", Duration::from_secs(15), Duration::from_secs(2));
        let err = shard
            .run(lease, &CancellationToken::new(), |_| async {
                panic!("no controller runs under a refused name")
            })
            .await
            .expect_err("refused");
        assert!(matches!(err, ShardError::InvalidName { .. }), "{err}");
        assert!(err.to_string().contains("64 characters long"), "{err}");
    }

    #[tokio::test]
    async fn the_selector_is_the_seed_shard_label() {
        let shard = shard();
        assert_eq!(
            shard.selector(),
            "shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example=shard-0"
        );
        assert_eq!(
            shard.watcher_config().label_selector,
            Some(shard.selector())
        );
    }

    #[tokio::test]
    async fn verdicts_follow_the_labels() {
        let shard = shard();
        let l = shard.labels().clone();
        let table = [
            (vec![], Verdict::Skip),
            (vec![(l.shard.as_str(), "shard-1")], Verdict::Skip),
            (
                vec![(l.shard.as_str(), "shard-1"), (l.drain.as_str(), "true")],
                Verdict::Skip,
            ),
            (vec![(l.drain.as_str(), "true")], Verdict::Skip),
            (vec![(l.shard.as_str(), "shard-0")], Verdict::Reconcile),
            (
                vec![(l.shard.as_str(), "shard-0"), (l.drain.as_str(), "")],
                Verdict::Acknowledge,
            ),
            (
                vec![(l.shard.as_str(), "shard-0"), (l.drain.as_str(), "true")],
                Verdict::Acknowledge,
            ),
        ];
        for (labels, want) in table {
            assert_eq!(shard.verdict(&secret(&labels, 1)), want, "{labels:?}");
        }
    }

    #[tokio::test]
    async fn the_drain_label_passes_a_predicate_that_would_filter_it() {
        let shard = shard();
        let drain = shard.labels().drain.clone();
        let predicate = shard.predicate(predicates::generation);
        let before = secret(&[], 1);
        let label_only = secret(&[("other", "x")], 1);
        let draining = secret(&[(drain.as_str(), "true")], 1);
        let newer = secret(&[], 2);
        let p = |s: &Secret| predicate.hash_property(s);
        assert_eq!(
            p(&before),
            p(&label_only),
            "unrelated label changes stay filtered"
        );
        assert_ne!(p(&before), p(&draining), "the drain label always passes");
        assert_ne!(
            p(&before),
            p(&newer),
            "the inner predicate still passes its own changes"
        );
    }

    #[tokio::test]
    async fn objects_of_other_shards_are_skipped_without_calling_the_reconcile() {
        let shard = shard();
        let called = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&called);
        let mut wrapped = shard.reconciler(move |_: Arc<Secret>, _: Arc<()>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(Action::await_change()) }
        });
        let other = secret(&[(shard.labels().shard.as_str(), "shard-1")], 1);
        assert!(wrapped(Arc::new(other), Arc::new(())).await.is_ok());
        assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 0);
        let mine = secret(&[(shard.labels().shard.as_str(), "shard-0")], 1);
        assert!(wrapped(Arc::new(mine.clone()), Arc::new(())).await.is_ok());
        assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 1);
        shard.halted.cancel();
        assert!(matches!(
            wrapped(Arc::new(mine), Arc::new(())).await,
            Err(ShardReconcileError::LeaseLost(_))
        ));
        assert_eq!(
            called.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "no reconcile after the lease is lost"
        );
    }

    #[tokio::test]
    async fn in_range_mode_an_object_is_reconciled_only_inside_the_served_ranges() {
        use sharder_common::ranges::{Range, RangeKey, fnv1a64};
        let shard = shard();
        let mine = "0b6f4a6e-4a55-4e0a-9a53-0b1d2f1d3c4e";
        let hash = fnv1a64(mine.as_bytes());
        let only = Range {
            start: hash,
            end: u128::from(hash) + 1,
        };
        shard.set_serving(Some(ShardSelector::new(RangeKey::Uid, [only])));
        let with_uid = |uid: &str| {
            let mut object = secret(&[], 1);
            object.metadata.uid = Some(uid.to_owned());
            object
        };
        assert_eq!(shard.verdict(&with_uid(mine)), Verdict::Reconcile);
        assert_eq!(shard.verdict(&with_uid("another")), Verdict::OutOfRange);
        shard.set_serving(None);
        assert_eq!(
            shard.verdict(&with_uid(mine)),
            Verdict::Skip,
            "label mode: no shard label"
        );
    }
}
