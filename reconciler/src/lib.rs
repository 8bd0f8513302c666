//! Sharder's reconciler: leader-elected; watches shard Leases, rings and their webhook
//! configurations. It keeps the state of every shard Lease ([`shard_leases`]), one
//! MutatingWebhookConfiguration and the status per ring, and rebalances a ring's objects when
//! its shards change ([`rings`], [`rebalance`]). Sharded objects are listed, metadata-only,
//! page by page; the only ones watched are those carrying a ring's drain label while its drains
//! are pending ([`rings::acks`]).
//!
//! The controllers run only while this replica holds the leader Lease
//! (`sharder_runtime::lease::hold`), as supervised tasks: if one ends, the leader releases the
//! Lease (a standby takes over at once) and the process exits with an error.

use std::fmt::Debug;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use prometheus_client::registry::Registry;
use sharder_common::RingKind;
use sharder_runtime::controller::{self, Listed, listed_controller_with};
use sharder_runtime::lease::{HoldError, Holding, LeaseConfig, LeaseKeeper, OnStop, hold};
use sharder_runtime::{CommonArgs, Readiness, RingKindArgs, Tasks, parse_duration};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub mod clients;
mod lead;
mod metrics;
mod rebalance;
mod rings;
mod shard_leases;
mod webhook_config;

/// Readiness condition: the leader's watches (shard Leases, ClusterRings, webhook
/// configurations) have listed. A standby has nothing to list and is ready: it takes over when
/// the leader goes.
pub const CONTROLLERS_SYNCED: &str = "controllers-synced";

/// Flags of `sharder-reconciler` (each with an environment variable fallback).
#[derive(clap::Parser, Clone, Debug)]
#[command(name = "sharder-reconciler", version, about = "Sharder's reconciler")]
pub struct Args {
    /// Namespace of the leader election Lease; also excluded from sharding by default.
    #[arg(long, env = "SHARDER_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "SHARDER_LEADER_ELECTION_NAME",
        default_value = "sharder-reconciler"
    )]
    pub leader_election_name: String,

    /// Identity of this replica in leader election (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Leader election Lease duration.
    #[arg(long, env = "SHARDER_LEADER_ELECTION_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_duration: Duration,

    /// How often the leader renews its Lease (and standbys retry).
    #[arg(long, env = "SHARDER_LEADER_ELECTION_RENEW", default_value = "5s", value_parser = parse_duration)]
    pub leader_election_renew: Duration,

    /// PEM CA bundle that signed the webhook's certificate (the webhook configurations' caBundle).
    #[arg(long, env = "SHARDER_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: PathBuf,

    /// How often `--webhook-ca-file` is checked for changes (a changed bundle goes into every
    /// webhook configuration).
    #[arg(long, env = "SHARDER_WEBHOOK_CA_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub webhook_ca_reload_interval: Duration,

    /// Base URL of the webhook (e.g. `https://127.0.0.1:9443`) instead of a Service.
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_URL",
        conflicts_with = "webhook_service_name"
    )]
    pub webhook_url: Option<String>,

    /// Name of the webhook's Service (in `--namespace`).
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_SERVICE_NAME",
        default_value = "sharder-webhook"
    )]
    pub webhook_service_name: String,

    /// Port of the webhook's Service.
    #[arg(long, env = "SHARDER_WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    pub webhook_service_port: i32,

    /// `timeoutSeconds` of the webhook calls (1-30). What the apiserver waits for a webhook that
    /// accepts connections and never answers, on every CREATE of a ring's objects; then it
    /// creates the object unassigned (failurePolicy Ignore) and the next sweep assigns it.
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_TIMEOUT_SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(i32).range(1..=30)
    )]
    pub webhook_timeout_seconds: i32,

    /// The namespaces every ring is limited to, as a JSON LabelSelector (`matchLabels`,
    /// `matchExpressions`), in addition to the ring's own namespaceSelector. Default: every
    /// namespace but `kube-system` and `--namespace`.
    #[arg(long, env = "SHARDER_NAMESPACE_SELECTOR", value_parser = parse_namespace_selector)]
    pub namespace_selector: Option<LabelSelector>,

    /// Label selector of the rings (of every served kind) this reconciler manages (empty: all).
    /// Shard Leases of other rings are left alone.
    #[arg(
        long,
        env = "SHARDER_RING_SELECTOR",
        alias = "clusterring-selector",
        default_value = ""
    )]
    pub ring_selector: String,

    /// The ring kinds served.
    #[command(flatten)]
    pub rings: RingKindArgs,

    /// Full resync of every ring: a list of all its objects, page by page, which repairs
    /// what no sweep selects (an object the webhook placed by a ring it had not updated yet).
    /// Rings are also listed in full whenever a shard joins or their spec changes.
    #[arg(long, env = "SHARDER_RESYNC_INTERVAL", default_value = "6h", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Sweep for objects without a shard or on a shard not in the ring (missed by the webhook,
    /// created with generateName, labelled by hand): one list of what needs work. The default
    /// waits as long as the reference implementation's resync period.
    #[arg(long, env = "SHARDER_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// Follow-up sweeps while drains are not acknowledged yet.
    #[arg(long, env = "SHARDER_DRAIN_CHECK_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub drain_check_interval: Duration,

    /// Objects per list page (at least 1). Up to a page of the objects that need a write wait
    /// for a write slot, so memory grows with it.
    #[arg(long, env = "SHARDER_LIST_PAGE_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub list_page_size: u32,

    /// Object writes in flight at most: the limit starts at 16 (or this, if lower) and adapts
    /// to the apiserver's answers, growing while writes succeed and halving when it is
    /// overloaded (429, 503, 504, an answer slower than a second). More in flight than the
    /// apiserver's cores can serve adds latency for every other client, not writes per second.
    #[arg(long, env = "SHARDER_MAX_CONCURRENT_WRITES", default_value_t = DEFAULT_MAX_CONCURRENT_WRITES)]
    pub max_concurrent_writes: usize,

    /// A fixed bound on object writes per second, on top of the write concurrency that
    /// follows the apiserver's answers (0: none, the default).
    #[arg(long, env = "SHARDER_MAX_WRITES_PER_SECOND", default_value_t = 0)]
    pub max_writes_per_second: u32,

    /// The label guard (docs/operations.md, "Label guard"): a ValidatingAdmissionPolicy per
    /// ring that admits only the protocol's changes of the ring's shard and drain labels.
    /// `auto`: on where the apiserver serves ValidatingAdmissionPolicies (Kubernetes 1.30 or
    /// later), off where it does not.
    #[arg(long, env = "SHARDER_LABEL_GUARD", value_enum, default_value_t = LabelGuard::Auto)]
    pub label_guard: LabelGuard,

    /// Users who may acknowledge any shard's drains, comma-separated: shards that run outside
    /// pods and share one identity (e.g. `system:serviceaccount:<namespace>:<name>`). A shard
    /// in a pod acknowledges its own drains with its pod-bound token and needs no entry here.
    #[arg(long, env = "SHARDER_LABEL_GUARD_ACKNOWLEDGERS", value_delimiter = ',')]
    pub label_guard_acknowledgers: Vec<String>,

    /// Admin server and logging flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Whether the label guard is on (`--label-guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabelGuard {
    /// On where the apiserver serves ValidatingAdmissionPolicies, off where it does not.
    Auto,
    /// On; the reconciler does not start leading where the API is not served.
    On,
    /// Off: no guard, and the guards of an earlier run are deleted.
    Off,
}

/// Default of `--max-concurrent-writes`.
pub const DEFAULT_MAX_CONCURRENT_WRITES: usize = 32;

/// Errors of the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[source] kube::Error),

    /// `--label-guard on`, but the apiserver serves no ValidatingAdmissionPolicies.
    #[error(
        "--label-guard on: the apiserver serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies (Kubernetes 1.30 or later); use --label-guard auto or off"
    )]
    LabelGuardUnavailable,

    /// The apiserver named no user for the reconciler's own credentials (a SelfSubjectReview),
    /// so the label guard cannot let the reconciler's writes through.
    #[error(
        "the apiserver named no user for the reconciler's credentials (SelfSubjectReview): the label guard needs one; use --label-guard off"
    )]
    NoIdentity,

    /// The webhook CA file cannot be read.
    #[error("--webhook-ca-file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// The webhook CA file does not hold a usable PEM bundle.
    #[error("--webhook-ca-file {path}: {reason}")]
    CaBundle {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// Pure logic reported an error (for example an invalid namespaceSelector).
    #[error(transparent)]
    Common(#[from] sharder_common::Error),

    /// A runtime piece (admin server, logging, a supervised task) failed.
    #[error(transparent)]
    Runtime(#[from] sharder_runtime::Error),

    /// The global namespace selector and a ring's cannot be combined.
    #[error("--namespace-selector: {0}")]
    NamespaceSelector(String),

    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(#[from] sharder_runtime::lease::LeaseError),

    /// This replica lost its leadership; it exits so that it restarts as a standby.
    #[error("leadership lost")]
    LeadershipLost,

    /// A controller ended without being asked to stop (its watch ended).
    #[error("the {0} ended without being asked to stop")]
    ControllerEnded(&'static str),
}

/// Parses `--namespace-selector`: a JSON LabelSelector that is also a valid selector.
fn parse_namespace_selector(value: &str) -> Result<LabelSelector, String> {
    let selector: LabelSelector = serde_json::from_str(value)
        .map_err(|e| format!("not a JSON LabelSelector (matchLabels, matchExpressions): {e}"))?;
    kube::core::Selector::try_from(selector.clone()).map_err(|e| format!("{e}: {value}"))?;
    Ok(selector)
}

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        sharder_runtime::host_name().unwrap_or_else(|| "sharder-reconciler".to_owned())
            + &format!("-{}", std::process::id())
    })
}

/// Runs `controller` (named `name` in errors; its main watch `listed`) with `reconcile` and
/// `error_policy` until `shutdown` (see [`controller::drive`]); its stream ending before that is
/// an error ([`Error::ControllerEnded`]).
pub(crate) async fn run_controller<K, C, F, Fut>(
    name: &'static str,
    (controller, listed): (Controller<K>, Listed),
    reconcile: F,
    error_policy: impl Fn(Arc<K>, &Error, Arc<C>) -> Action,
    ctx: Arc<C>,
    shutdown: CancellationToken,
) -> Result<(), Error>
where
    K: Clone + kube::Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin + Send + Sync,
    C: Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let running = controller
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    controller::drive(running, &listed, &shutdown).await;
    if shutdown.is_cancelled() {
        Ok(())
    } else {
        Err(Error::ControllerEnded(name))
    }
}

/// Runs the reconciler until SIGTERM/SIGINT.
pub async fn run(args: Args) -> Result<(), Error> {
    sharder_runtime::start(&args.common.clone(), |client, shutdown| async move {
        let bulk = rebalance::Clients {
            lists: clients::client(clients::Transport::LISTS).await?,
            writes: clients::client(
                clients::Transport::WRITES.with_idle_connections(args.max_concurrent_writes),
            )
            .await?,
        };
        run_with_client(args, client, bulk, shutdown).await
    })
    .await
}

/// Runs the reconciler with `client` until `shutdown`: waits for leadership, then runs the
/// controllers; releases leadership on shutdown and fails with [`Error::LeadershipLost`] if it
/// is lost, or with the controller's error if one ends by itself.
///
/// `bulk` carries the rebalancer's list pages and object writes (with the small reads around
/// them), each on connections of their own (`run` builds them with
/// [`clients`]: no retry layer, so overload answers reach the rebalancer,
/// which slows down, see `rebalance::concurrency`); watches and everything else go through
/// `client`.
pub async fn run_with_client(
    args: Args,
    client: kube::Client,
    bulk: rebalance::Clients,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let (ca_sender, ca) = watch::channel(webhook_config::ca::read(&args.webhook_ca_file)?);
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let readiness = Readiness::new([CONTROLLERS_SYNCED]);
    let (admin_addr, admin) = sharder_runtime::admin::bind(
        args.common.admin.admin_addr,
        sharder_runtime::admin::router(Arc::new(registry), readiness.clone()),
        shutdown.clone(),
    )
    .await?;
    readiness.set(CONTROLLERS_SYNCED, true);
    let identity = identity(&args);
    info!(%admin_addr, %identity, "reconciler started, waiting for leadership");

    let mut tasks = Tasks::new(shutdown.clone());
    tasks.spawn("admin server", admin);
    tasks.spawn(
        "CA reload",
        webhook_config::ca::reload_on_change(
            args.webhook_ca_file.clone(),
            ca_sender,
            args.webhook_ca_reload_interval,
            shutdown.clone(),
        ),
    );
    let leader_gauge = metrics
        .leader
        .get_or_create(&metrics::LeaderLabels {
            name: args.leader_election_name.clone(),
        })
        .clone();
    leader_gauge.set(0);
    let keeper = LeaseKeeper::new(
        client.clone(),
        LeaseConfig {
            namespace: args.namespace.clone(),
            name: args.leader_election_name.clone(),
            identity: identity.clone(),
            duration: args.leader_election_duration,
            renew_interval: args.leader_election_renew,
            labels: Default::default(),
        },
    );
    let leading = hold(keeper, &shutdown, OnStop::Release, |holding: Holding| {
        info!(%identity, "leading");
        leader_gauge.set(1);
        lead::lead(
            args,
            client,
            lead::Leader {
                bulk,
                identity: identity.clone(),
                metrics,
                ca,
                readiness,
            },
            holding.stop,
        )
    })
    .await;
    leader_gauge.set(0);
    let led = match leading {
        Ok(()) => Ok(()),
        Err(HoldError::Lost(_)) => Err(Error::LeadershipLost),
        Err(HoldError::Lease(e)) => Err(e.into()),
        Err(HoldError::Work(e)) => Err(e),
        Err(HoldError::Ended(_)) => Err(Error::ControllerEnded("leader")),
    };
    shutdown.cancel();
    let served = tasks.supervise().await;
    info!("reconciler stopped");
    led?;
    Ok(served?)
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
async fn ready_when_listed(readiness: Readiness, watches: Vec<Listed>) {
    readiness.set(CONTROLLERS_SYNCED, false);
    let listed = futures::future::join_all(watches.into_iter().map(Listed::wait)).await;
    if listed.into_iter().all(|l| l) {
        readiness.set(CONTROLLERS_SYNCED, true);
        info!("watches listed, ready");
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    /// The flags every reconciler needs.
    const BASE: [&str; 5] = [
        "sharder-reconciler",
        "--webhook-url",
        "https://webhook",
        "--webhook-ca-file",
        "/ca.crt",
    ];

    #[test]
    fn a_list_page_of_no_objects_is_refused_with_the_flag_named() {
        let parse = |size: &str| {
            Args::try_parse_from(BASE.iter().copied().chain(["--list-page-size", size]))
        };
        let err = parse("0").expect_err("0 is no page").to_string();
        assert!(err.contains("--list-page-size"), "{err}");
        assert_eq!(parse("1").expect("1 object a page").list_page_size, 1);
    }

    #[test]
    fn a_webhook_timeout_the_api_would_refuse_is_refused_with_the_flag_named() {
        let parse = |seconds: &str| {
            let flag = format!("--webhook-timeout-seconds={seconds}");
            Args::try_parse_from(BASE.iter().copied().chain([flag.as_str()]))
        };
        for refused in ["0", "31", "-1"] {
            let err = parse(refused).expect_err(refused).to_string();
            assert!(err.contains("--webhook-timeout-seconds"), "{err}");
        }
        assert_eq!(parse("30").expect("30 s").webhook_timeout_seconds, 30);
        assert_eq!(
            Args::try_parse_from(BASE)
                .expect("defaults")
                .webhook_timeout_seconds,
            5
        );
    }

    #[test]
    fn the_namespace_selector_flag_is_a_json_label_selector() {
        let parsed = parse_namespace_selector(
            r#"{"matchExpressions":[{"key":"team","operator":"NotIn","values":["infra"]}]}"#,
        )
        .expect("parses");
        assert_eq!(parsed.match_expressions.expect("expressions").len(), 1);
        assert!(parse_namespace_selector(r#"{"matchLabels":{"team":"a"}}"#).is_ok());
        assert_eq!(parse_namespace_selector("{}"), Ok(LabelSelector::default()));
        let not_json = parse_namespace_selector("team=a").expect_err("not JSON");
        assert!(
            not_json.starts_with("not a JSON LabelSelector"),
            "{not_json}"
        );
        let bad_operator = parse_namespace_selector(
            r#"{"matchExpressions":[{"key":"team","operator":"Near","values":["a"]}]}"#,
        )
        .expect_err("bad operator");
        assert!(bad_operator.contains("Near"), "{bad_operator}");
    }

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
