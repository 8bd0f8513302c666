//! An example sharded controller built on the shard SDK (`sharder_sdk::shard`): for every Secret
//! assigned to this shard it keeps a ConfigMap `checksums-<secret>` (controlled by the Secret)
//! holding an XXH64 checksum of each data key, like the reference project's checksum controller.
//!
//! In range mode (`--range-key`) it serves the hash ranges its Lease assigns instead of a label.
//! It holds its own shard Lease while it runs, releases it on SIGTERM (after in-flight reconciles
//! finished) and does not on SIGKILL (a crash). With `--record-file` it appends one JSON line per
//! reconcile start and end ([`record`]), which the end-to-end tests use to prove that no object is
//! ever reconciled by two shards at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sharder_sdk::controller::{drive, listed_controller, watch};
use sharder_sdk::lease::OnStop;
use sharder_sdk::shard::{RingArgs, Shard, ShardError, ShardReconcileError};
use sharder_sdk::{CommonArgs, RangeKey, Readiness, parse_duration};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub mod record;

use record::Recorder;

/// Flags of the example shard.
#[derive(clap::Parser, Clone, Debug)]
#[command(name = "checksum-controller", version, about)]
pub struct Args {
    /// The ring this shard belongs to.
    #[command(flatten)]
    pub ring: RingArgs,

    /// The shard's name: its Lease's name and holder identity (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub shard_name: Option<String>,

    /// Namespace of the shard Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// The shard name is stable across restarts (a StatefulSet's pod names): on SIGTERM stop
    /// renewing the shard Lease but do not release it, so a restart within the lease duration
    /// keeps the shard's objects where they are. Without it the Lease is released and the
    /// objects move at once (right for names that never come back, like a Deployment's pods).
    #[arg(long, env = "SHARD_STABLE_NAME")]
    pub stable_name: bool,

    /// `leaseDurationSeconds` of the shard Lease.
    #[arg(long, env = "SHARD_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How often the shard Lease is renewed.
    #[arg(long, env = "SHARD_LEASE_RENEW", default_value = "2s", value_parser = parse_duration)]
    pub lease_renew: Duration,

    /// Only this namespace's Secrets (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// Simulated work per reconcile.
    #[arg(long, env = "RECONCILE_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub reconcile_delay: Duration,

    /// Reconciles running at once (at least 1). Bounded, so that a burst of work (a shard
    /// joining, a relist) cannot flood the apiserver with this shard's writes: an overloaded
    /// apiserver refuses requests at random, the shard's Lease renewals among them.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,

    /// Range mode, by the key of the ring's `sharder.dev/range-key` annotation (`uid` or
    /// `namespace`): serve the hash ranges the shard's Lease assigns, through the apiserver's
    /// sharded list and watch (the `ShardedListAndWatch` feature gate), instead of a label.
    #[arg(long, env = "SHARD_RANGE_KEY")]
    pub range_key: Option<RangeKey>,

    /// Append a JSON line per reconcile start and end to this file.
    #[arg(long, env = "RECORD_FILE")]
    pub record_file: Option<PathBuf>,

    /// Admin server and logging flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Errors of the example shard.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed while reconciling `object`.
    #[error("reconciling {object}: {source}")]
    Kube {
        /// `namespace/name` of the Secret.
        object: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },

    /// The record file cannot be opened.
    #[error("--record-file {path}: {source}")]
    RecordFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// The shard stopped: its Lease was lost or could not be kept.
    #[error(transparent)]
    Shard(#[from] ShardError),

    /// A runtime piece (admin server, logging) failed.
    #[error(transparent)]
    Runtime(#[from] sharder_sdk::Error),
}

const LEASE_HELD: &str = "shard-lease";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

struct Context {
    client: Client,
    delay: Duration,
    recorder: Option<Recorder>,
    reconciles: Family<ResultLabels, Counter>,
}

/// The ConfigMap name for a Secret.
pub fn configmap_name(secret: &str) -> String {
    format!("checksums-{secret}")
}

/// The checksums of a Secret's data: key -> XXH64 of the value, 16 hex digits.
pub fn checksums(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(key, value)| {
            (
                key.clone(),
                format!("{:016x}", xxhash_rust::xxh64::xxh64(&value.0, 0)),
            )
        })
        .collect()
}

/// Runs the shard until SIGTERM/SIGINT (graceful: Lease released) or until its Lease is lost.
pub async fn run(args: Args) -> Result<(), Error> {
    sharder_sdk::start(&args.common.clone(), |client, shutdown| {
        run_with_client(args, client, shutdown)
    })
    .await
}

/// Runs the shard with `client` until `shutdown` (see [`run`]).
pub async fn run_with_client(
    args: Args,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let name = args
        .shard_name
        .clone()
        .or_else(sharder_sdk::host_name)
        .unwrap_or_else(|| "checksum-controller".to_owned());
    let recorder = match &args.record_file {
        Some(path) => Some(
            Recorder::open(path, &name).map_err(|source| Error::RecordFile {
                path: path.clone(),
                source,
            })?,
        ),
        None => None,
    };
    let on_stop = if args.stable_name {
        OnStop::Keep
    } else {
        OnStop::Release
    };
    let shard = Shard::new(client.clone(), args.ring.id(), &name).with_on_stop(on_stop);
    let mut registry = Registry::default();
    shard.register_metrics(&mut registry);
    let reconciles = Family::<ResultLabels, Counter>::default();
    registry.register(
        "checksum_reconciles",
        "Reconciles of Secrets by this shard, by result",
        reconciles.clone(),
    );
    let readiness = Readiness::new([LEASE_HELD]);
    let (admin_addr, admin) = sharder_sdk::admin::spawn(
        args.common.admin.admin_addr,
        registry,
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    info!(shard = %name, ring = %args.ring.id(), %admin_addr, "checksum controller started, acquiring the shard lease");

    let lease = shard.lease(&args.lease_namespace, args.lease_duration, args.lease_renew);
    let context = Arc::new(Context {
        client: client.clone(),
        delay: args.reconcile_delay,
        recorder,
        reconciles,
    });
    let concurrency = args.max_concurrent_reconciles;
    let namespace = args.namespace.clone();
    let result = match args.range_key {
        None => {
            let config = shard.watcher_config();
            let reconciler = shard.reconciler(reconcile);
            shard
                .run(lease, &shutdown, |stop| {
                    readiness.set(LEASE_HELD, true);
                    let apis = apis(&client, namespace.as_deref());
                    checksums_controller(apis, config, reconciler, context, concurrency, stop)
                })
                .await
        }
        Some(key) => {
            let resources = vec![
                ApiResource::erase::<Secret>(&()),
                ApiResource::erase::<ConfigMap>(&()),
            ];
            let lease_namespace = args.lease_namespace.clone();
            shard
                .run_ranges(
                    lease,
                    &lease_namespace,
                    key,
                    resources,
                    &shutdown,
                    |client, stop| {
                        readiness.set(LEASE_HELD, true);
                        let apis = apis(&client, namespace.as_deref());
                        let reconciler = shard.reconciler(reconcile);
                        let config = watcher::Config::default();
                        checksums_controller(
                            apis,
                            config,
                            reconciler,
                            Arc::clone(&context),
                            concurrency,
                            stop,
                        )
                    },
                )
                .await
        }
    };
    readiness.set(LEASE_HELD, false);
    shutdown.cancel();
    let _ = admin.await;
    result?;
    info!(shard = %name, "checksum controller stopped");
    Ok(())
}

/// The Secrets and ConfigMaps the shard watches, of `namespace` or of all.
fn apis(client: &Client, namespace: Option<&str>) -> (Api<Secret>, Api<ConfigMap>) {
    match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    }
}

/// The checksum controller over `secrets` owning `configmaps`, both watched with `config`,
/// until `stop`.
fn checksums_controller<R, Fut>(
    (secrets, configmaps): (Api<Secret>, Api<ConfigMap>),
    config: watcher::Config,
    reconciler: R,
    context: Arc<Context>,
    concurrency: u16,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static
where
    R: FnMut(Arc<Secret>, Arc<Context>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Action, ShardReconcileError<Error>>> + Send + 'static,
{
    let (controller, listed) = listed_controller(secrets, config.clone());
    let running = controller
        .owns_stream(watch(configmaps, config).touched_objects())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconciler, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "reconcile failed");
            }
        });
    async move { drive(running, &listed, &stop).await }
}

fn error_policy(_: Arc<Secret>, _: &ShardReconcileError<Error>, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = secret.namespace().unwrap_or_default();
    let object = format!("{namespace}/{}", secret.name_any());
    let record = ctx
        .recorder
        .as_ref()
        .map(|r| r.reconcile(&object, secret.resource_version().as_deref()));
    let result = apply_checksums(&secret, &ctx, &namespace, &object, record.as_ref()).await;
    ctx.reconciles
        .get_or_create(&ResultLabels {
            result: if result.is_ok() { "ok" } else { "error" },
        })
        .inc();
    result
}

async fn apply_checksums(
    secret: &Secret,
    ctx: &Context,
    namespace: &str,
    object: &str,
    record: Option<&record::Open>,
) -> Result<Action, Error> {
    if !ctx.delay.is_zero() {
        tokio::time::sleep(ctx.delay).await;
    }
    let kube_err = |source| Error::Kube {
        object: object.to_owned(),
        source,
    };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let name = configmap_name(&secret.name_any());
    let child = format!("{namespace}/{name}");
    let wrote = || {
        if let Some(record) = record {
            record.wrote(&child);
        }
    };
    let want = checksums(secret);
    match api.get_opt(&name).await.map_err(kube_err)? {
        Some(existing) if existing.data.clone().unwrap_or_default() == want => {}
        Some(mut existing) => {
            existing.data = Some(want);
            api.replace(&name, &PostParams::default(), &existing)
                .await
                .map_err(kube_err)?;
            wrote();
            info!("checksums updated");
        }
        None => {
            let configmap = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(namespace.to_owned()),
                    owner_references: secret.controller_owner_ref(&()).map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                data: Some(want),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &configmap)
                .await
                .map_err(kube_err)?;
            wrote();
            info!("checksums created");
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn checksums_are_xxh64_per_key() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("a".to_owned(), ByteString(b"".to_vec())),
                ("b".to_owned(), ByteString(b"hello".to_vec())),
            ])),
            ..Secret::default()
        };
        let sums = checksums(&secret);
        // XXH64 golden values (seed 0).
        assert_eq!(sums["a"], "ef46db3751d8e999");
        assert_eq!(sums["b"], "26c7827d889f6da3");
        assert!(checksums(&Secret::default()).is_empty());
    }

    #[test]
    fn the_ring_is_one_of_either_kind() {
        use clap::Parser as _;
        use sharder_sdk::RingId;
        let ring = |args: &[&str]| {
            Args::try_parse_from([&["checksum-controller"], args].concat()).map(|a| a.ring.id())
        };
        assert_eq!(
            ring(&["--clusterring", "r"]).expect("a ClusterRing"),
            RingId::cluster_ring("r")
        );
        assert_eq!(
            ring(&["--controllerring", "r"]).expect("a ControllerRing"),
            RingId::controller_ring("r")
        );
        let both = ring(&["--clusterring", "r", "--controllerring", "r"]).expect_err("both");
        assert!(both.to_string().contains("cannot be used with"), "{both}");
        let none = ring(&[]).expect_err("none");
        assert!(none.to_string().contains("--clusterring"), "{none}");
    }

    #[test]
    fn only_the_ring_is_required() {
        use clap::Parser as _;
        let args =
            Args::try_parse_from(["checksum-controller", "--clusterring", "r"]).expect("args");
        assert_eq!(args.lease_duration, Duration::from_secs(15));
        assert_eq!(args.lease_renew, Duration::from_secs(2));
        assert!(args.record_file.is_none());
    }

    #[test]
    fn bad_durations_name_the_flag() {
        use clap::Parser as _;
        let err = Args::try_parse_from([
            "checksum-controller",
            "--clusterring",
            "r",
            "--lease-duration",
            "soon",
        ])
        .expect_err("invalid");
        assert!(err.to_string().contains("--lease-duration"), "{err}");
    }
}
