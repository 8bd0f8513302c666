//! Sharder's mutating admission webhook: a TLS server that labels every unassigned object of a
//! ClusterRing's resources with the shard the ring of live shard Leases picks for it.
//!
//! The decision is a pure function ([`admission`]); [`server`] is the thin HTTP layer over it;
//! [`ring_source`] keeps one ring snapshot per ClusterRing from watches on ClusterRings and
//! shard Leases; [`tls`] serves and reloads the certificate. Nothing else is cached: in
//! particular no sharded object. Every part runs as a supervised task: if one ends, the process
//! exits with an error instead of serving without it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sharder_runtime::{CommonArgs, Readiness, RingKindArgs, Tasks, parse_duration};
use tokio_util::sync::CancellationToken;
use tracing::info;

pub mod admission;
pub mod metrics;
pub mod owners;
pub mod ring_source;
pub mod server;
pub mod tls;

/// Readiness condition set once the serving certificate is loaded.
pub const TLS_LOADED: &str = "tls-loaded";

/// Readiness condition cleared on SIGTERM, while the webhook still serves for
/// `--shutdown-delay`.
pub const NOT_STOPPING: &str = "not-stopping";

/// Flags of `sharder-webhook` (each with an environment variable fallback).
#[derive(clap::Parser, Clone, Debug)]
#[command(
    name = "sharder-webhook",
    version,
    about = "Sharder's mutating admission webhook"
)]
pub struct Args {
    /// Address of the TLS webhook server (port 0: any free port; the bound address is logged).
    #[arg(long, env = "SHARDER_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub listen_addr: SocketAddr,

    /// PEM certificate chain served by the webhook; reloaded when it changes.
    #[arg(long, env = "SHARDER_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the certificate; reloaded when it changes.
    #[arg(long, env = "SHARDER_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,

    /// How often the certificate files are checked for changes.
    #[arg(long, env = "SHARDER_TLS_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,

    /// Largest accepted request body in bytes (larger ones get 413).
    #[arg(long, env = "SHARDER_MAX_BODY_BYTES", default_value_t = 6 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Requests handled at once; more wait.
    #[arg(long, env = "SHARDER_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,

    /// How long the webhook keeps serving new connections after SIGTERM, reporting not ready:
    /// until the Service stops sending it any (endpoints and proxy rules update within seconds,
    /// more on a busy node; a connection refused meanwhile is a CREATE admitted unassigned).
    #[arg(long, env = "SHARDER_SHUTDOWN_DELAY", default_value = "15s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// How long open connections may finish after the shutdown delay (a review takes at most
    /// the webhook's `timeoutSeconds`; delay and grace stay within the pod's termination grace
    /// period).
    #[arg(long, env = "SHARDER_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// The ring kinds served.
    #[command(flatten)]
    pub rings: RingKindArgs,

    /// Admin server and logging flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Errors of the webhook.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TLS file cannot be read or used; `flag` names the flag to fix.
    #[error("{flag} {path}: {reason}")]
    Tls {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// No Kubernetes client could be configured (kubeconfig or in-cluster config).
    #[error("cannot configure a Kubernetes client (KUBECONFIG or in-cluster): {0}")]
    Client(#[source] kube::Error),

    /// A runtime piece (admin server, logging, a supervised task) failed.
    #[error(transparent)]
    Runtime(#[from] sharder_runtime::Error),

    /// The ClusterRing or Lease watch ended (it retries errors itself, so this is a bug or a
    /// shutdown of the client).
    #[error("the ClusterRing/Lease watch ended")]
    WatchEnded,

    /// The webhook server could not listen or failed while serving.
    #[error("webhook server on {addr} (--listen-addr): {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the webhook until SIGTERM/SIGINT: ring source, admin server and TLS server.
pub async fn run(args: Args) -> Result<(), Error> {
    sharder_runtime::start(&args.common.clone(), |client, shutdown| {
        run_with_client(args, client, shutdown)
    })
    .await
}

/// Runs the webhook with `client` until `stop` is cancelled (then it reports not ready, serves on
/// for `--shutdown-delay` and lets open requests finish), or until one of its parts
/// fails or ends by itself (then the error names it).
pub async fn run_with_client(
    args: Args,
    client: kube::Client,
    stop: CancellationToken,
) -> Result<(), Error> {
    let files = tls::TlsFiles {
        cert: args.tls_cert_file.clone(),
        key: args.tls_key_file.clone(),
    };
    let (tls_config, loaded) = files.load()?;

    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let readiness = Readiness::new([
        ring_source::RINGS_SYNCED,
        ring_source::LEASES_SYNCED,
        TLS_LOADED,
        NOT_STOPPING,
    ]);
    readiness.set(TLS_LOADED, true);
    readiness.set(NOT_STOPPING, true);
    // On `stop`, report not ready at once but keep everything running for the delay.
    let shutdown = CancellationToken::new();
    let delayed = shutdown.clone();
    let stopping = readiness.clone();
    let delay = args.shutdown_delay;
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = delayed.cancelled() => return,
        }
        stopping.set(NOT_STOPPING, false);
        info!(
            ?delay,
            "stopping: not ready, still serving for the shutdown delay"
        );
        tokio::time::sleep(delay).await;
        delayed.cancel();
    });
    let rings = Arc::new(ring_source::Rings::default());

    let listener = std::net::TcpListener::bind(args.listen_addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| Error::Serve {
            addr: args.listen_addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Serve {
        addr: args.listen_addr,
        source,
    })?;
    let (admin_addr, admin) = sharder_runtime::admin::bind(
        args.common.admin.admin_addr,
        sharder_runtime::admin::router(Arc::new(registry), readiness.clone()),
        shutdown.clone(),
    )
    .await?;

    let mut tasks = Tasks::new(shutdown.clone());
    tasks.spawn("admin server", admin);
    let owners = Arc::new(owners::ApiOwners::new(client.clone()));
    tasks.spawn(
        "ring source",
        ring_source::run(
            client,
            args.rings.kinds(),
            rings.clone(),
            readiness,
            metrics.clone(),
            shutdown.clone(),
        ),
    );
    tasks.spawn(
        "certificate reload",
        tls::reload_on_change(
            files,
            tls_config.clone(),
            loaded,
            args.tls_reload_interval,
            shutdown.clone(),
        ),
    );
    let app = server::router(
        rings,
        owners,
        metrics,
        server::Limits {
            max_body_bytes: args.max_body_bytes,
            max_concurrent_requests: args.max_concurrent_requests,
        },
    );
    let handle = axum_server::Handle::new();
    let graceful = handle.clone();
    let grace = args.shutdown_grace;
    let on_shutdown = shutdown.clone();
    tokio::spawn(async move {
        on_shutdown.cancelled().await;
        graceful.graceful_shutdown(Some(grace));
    });
    let server = axum_server::from_tcp_rustls(listener, tls_config)
        .map_err(|source| Error::Serve { addr, source })?
        .handle(handle);
    tasks.spawn("webhook server", async move {
        server
            .serve(app.into_make_service())
            .await
            .map_err(|source| Error::Serve { addr, source })
    });
    info!(%addr, %admin_addr, "webhook serving");
    let result = tasks.supervise().await;
    // A part that failed by itself ended the rest; the delay task has nothing left to wait for.
    shutdown.cancel();
    info!("webhook stopped");
    Ok(result?)
}
