//! Sharder's mutating admission webhook: a TLS server that labels every unassigned object of a
//! ClusterRing's resources with the shard the ring of live shard Leases picks for it.
//!
//! The decision is a pure function ([`admission`]); [`server`] is the thin HTTP layer over it;
//! [`rings`] keeps one ring snapshot per ClusterRing from watches on ClusterRings and shard
//! Leases; [`tls`] serves and reloads the certificate. Nothing else is cached: in particular no
//! sharded object.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sharder_sdk::{AdminArgs, LogArgs, Readiness, parse_duration};
use tokio_util::sync::CancellationToken;
use tracing::info;

pub mod admission;
pub mod floor;
pub mod metrics;
pub mod rings;
pub mod server;
pub mod tls;

/// Readiness condition set once the serving certificate is loaded.
pub const TLS_LOADED: &str = "tls-loaded";

/// Flags of `sharder-webhook` (each with an environment variable fallback).
#[derive(clap::Parser, Clone, Debug)]
#[command(
    name = "sharder-webhook",
    version,
    about = "Sharder's mutating admission webhook"
)]
pub struct Args {
    /// Address of the TLS webhook server.
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

    /// Longest time to answer one request (then 503).
    #[arg(long, env = "SHARDER_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Requests handled at once; more wait.
    #[arg(long, env = "SHARDER_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,

    /// How long open connections may finish after SIGTERM.
    #[arg(long, env = "SHARDER_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Admin server flags.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// Logging flags.
    #[command(flatten)]
    pub log: LogArgs,
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

    /// A runtime piece (admin server, logging) failed.
    #[error(transparent)]
    Runtime(#[from] sharder_sdk::Error),

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
    args.log.init()?;
    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    run_with_client(args, client, sharder_sdk::shutdown_on_signal()).await
}

/// Runs the webhook with `client` until `shutdown` is cancelled.
pub async fn run_with_client(
    args: Args,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let files = tls::TlsFiles {
        cert: args.tls_cert_file.clone(),
        key: args.tls_key_file.clone(),
    };
    let (tls_config, loaded) = files.load()?;

    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let readiness = Readiness::new([rings::RINGS_SYNCED, rings::LEASES_SYNCED, TLS_LOADED]);
    readiness.set(TLS_LOADED, true);
    let ring_source = Arc::new(rings::Rings::default());

    let (admin_addr, admin) = sharder_sdk::admin::spawn(
        args.admin.admin_addr,
        registry,
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    let source = tokio::spawn(rings::run(
        client,
        ring_source.clone(),
        readiness,
        metrics.clone(),
        shutdown.clone(),
    ));
    let reload = tokio::spawn(tls::reload_on_change(
        files,
        tls_config.clone(),
        loaded,
        args.tls_reload_interval,
        shutdown.clone(),
    ));

    let app = server::router(
        ring_source,
        metrics,
        server::Limits {
            max_body_bytes: args.max_body_bytes,
            request_timeout: args.request_timeout,
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
    let addr = args.listen_addr;
    info!(%addr, %admin_addr, "webhook serving");
    let served = axum_server::bind_rustls(addr, tls_config)
        .handle(handle)
        .serve(app.into_make_service())
        .await;
    shutdown.cancel();
    let _ = tokio::join!(admin, source, reload);
    info!("webhook stopped");
    served.map_err(|source| Error::Serve { addr, source })
}
