//! Sharder's reconciler: leader-elected; watches only shard Leases and ClusterRings. It keeps
//! the state of every shard Lease ([`shard_leases`]), one MutatingWebhookConfiguration and the
//! status per ClusterRing, and rebalances a ring's objects when its shards change
//! ([`rings`], [`rebalance`]). Sharded objects are only ever listed, metadata-only, page by page.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sharder_sdk::lease::{LeaseConfig, LeaseKeeper};
use sharder_sdk::{AdminArgs, LogArgs, Readiness, parse_duration};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

pub mod metrics;
pub mod rebalance;
pub mod rings;
pub mod shard_leases;
pub mod webhook_config;

/// Readiness condition: the process runs (standbys are ready too; only the leader acts).
pub const STARTED: &str = "started";

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

    /// `timeoutSeconds` of the webhook calls.
    #[arg(long, env = "SHARDER_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 5)]
    pub webhook_timeout_seconds: i32,

    /// Label selector of the ClusterRings this reconciler manages (empty: all). Shard Leases of
    /// other rings are left alone.
    #[arg(long, env = "SHARDER_CLUSTERRING_SELECTOR", default_value = "")]
    pub clusterring_selector: String,

    /// Full resync of every ring.
    #[arg(long, env = "SHARDER_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Sweep for unassigned objects (missed by the webhook, or created with generateName).
    #[arg(long, env = "SHARDER_SWEEP_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// Follow-up sweeps while drains are not acknowledged yet.
    #[arg(long, env = "SHARDER_DRAIN_CHECK_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub drain_check_interval: Duration,

    /// Objects per list page.
    #[arg(long, env = "SHARDER_LIST_PAGE_SIZE", default_value_t = 500)]
    pub list_page_size: u32,

    /// Object writes in flight at once.
    #[arg(long, env = "SHARDER_MAX_CONCURRENT_WRITES", default_value_t = 16)]
    pub max_concurrent_writes: usize,

    /// Object writes per second (0: unlimited).
    #[arg(long, env = "SHARDER_MAX_WRITES_PER_SECOND", default_value_t = 200)]
    pub max_writes_per_second: u32,

    /// Admin server flags.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// Logging flags.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Errors of the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Kubernetes client could be configured.
    #[error("cannot configure a Kubernetes client (KUBECONFIG or in-cluster): {0}")]
    Client(#[source] kube::Error),

    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[source] kube::Error),

    /// The webhook CA file cannot be read.
    #[error("--webhook-ca-file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// Pure logic reported an error (for example an invalid namespaceSelector).
    #[error(transparent)]
    Common(#[from] sharder_common::Error),

    /// A runtime piece (admin server, logging) failed.
    #[error(transparent)]
    Runtime(#[from] sharder_sdk::Error),

    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(#[from] sharder_sdk::lease::LeaseError),

    /// This replica lost its leadership; it exits so that it restarts as a standby.
    #[error("leadership lost")]
    LeadershipLost,
}

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "sharder-reconciler".to_owned())
            + &format!("-{}", std::process::id())
    })
}

/// Runs the reconciler until SIGTERM/SIGINT.
pub async fn run(args: Args) -> Result<(), Error> {
    args.log.init()?;
    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    run_with_client(args, client, sharder_sdk::shutdown_on_signal()).await
}

/// Runs the reconciler with `client` until `shutdown`: waits for leadership, then runs the
/// controllers; releases leadership on shutdown and fails with [`Error::LeadershipLost`] if it
/// is lost.
pub async fn run_with_client(
    args: Args,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let ca_bundle = std::fs::read(&args.webhook_ca_file).map_err(|source| Error::CaFile {
        path: args.webhook_ca_file.clone(),
        source,
    })?;
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let readiness = Readiness::new([STARTED]);
    let (admin_addr, admin) = sharder_sdk::admin::spawn(
        args.admin.admin_addr,
        registry,
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    readiness.set(STARTED, true);
    let identity = identity(&args);
    info!(%admin_addr, %identity, "reconciler started, waiting for leadership");

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
    let held = match keeper.acquire(&shutdown).await {
        Ok(held) => held,
        Err(sharder_sdk::lease::LeaseError::Cancelled) => {
            let _ = admin.await;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    info!(%identity, "leading");
    let lost = held.lost();
    let controllers = CancellationToken::new();

    let webhook = webhook_config::WebhookSettings {
        target: match &args.webhook_url {
            Some(url) => webhook_config::WebhookTarget::Url(url.clone()),
            None => webhook_config::WebhookTarget::Service {
                namespace: args.namespace.clone(),
                name: args.webhook_service_name.clone(),
                port: args.webhook_service_port,
            },
        },
        ca_bundle,
        timeout_seconds: args.webhook_timeout_seconds,
        excluded_namespaces: vec!["kube-system".to_owned(), args.namespace.clone()],
    };
    let ring_controller = rings::controller(client.clone(), &args.clusterring_selector);
    let lease_controller = shard_leases::controller(client.clone());
    let lease_store = lease_controller.store();
    let lease_ctx = Arc::new(shard_leases::Context {
        client: client.clone(),
        metrics: metrics.clone(),
        rings: (!args.clusterring_selector.is_empty()).then(|| ring_controller.store()),
    });
    let leases = tokio::spawn(shard_leases::run(
        lease_controller,
        lease_ctx,
        controllers.clone(),
    ));
    // Both controllers start at once. A ring reconciled before all its shard Leases are in the
    // store sees fewer shards: it moves nothing off them, and each shard appearing later counts
    // as added, which triggers a full resync; no shard is ever taken for dead by it.
    let rebalancer = rebalance::Rebalancer::new(
        client.clone(),
        rebalance::Settings {
            page_size: args.list_page_size,
            max_concurrent_writes: args.max_concurrent_writes,
        },
        args.max_writes_per_second,
        metrics.clone(),
    );
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "sharder-reconciler".into(),
            instance: Some(identity.clone()),
        },
    );
    let ring_ctx = Arc::new(rings::Context::new(
        client,
        lease_store,
        webhook,
        rebalancer,
        rings::Intervals {
            resync: args.resync_interval,
            sweep: args.sweep_interval,
            drain_check: args.drain_check_interval,
        },
        metrics,
        recorder,
    ));
    let ring_task = tokio::spawn(rings::run(ring_controller, ring_ctx, controllers.clone()));

    let result = tokio::select! {
        () = lost.cancelled() => {
            error!(%identity, "leadership lost, stopping at once");
            Err(Error::LeadershipLost)
        }
        () = shutdown.cancelled() => Ok(()),
    };
    controllers.cancel();
    let _ = tokio::join!(leases, ring_task);
    if result.is_ok() {
        held.release().await?;
    }
    shutdown.cancel();
    let _ = admin.await;
    info!("reconciler stopped");
    result
}
