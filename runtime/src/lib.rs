//! The runtime pieces shared by Sharder's components and sharded controllers: the admin server
//! (probes and Prometheus metrics), logging setup, graceful shutdown on signals, supervised
//! tasks, controllers that stop when asked ([`controller`]), the Lease keeper,
//! [`lease::hold`], which runs work only while a Lease is held (the reconciler's leader election
//! and a shard's membership alike), and range mode's sharded lists ([`sharded`]).
//!
//! The webhook and the reconciler depend on this crate alone; sharded controllers use it
//! through the shard SDK (`sharder-sdk`), which re-exports it.

use std::future::Future;
use std::net::SocketAddr;

pub mod admin;
pub mod controller;
pub mod duration;
pub mod files;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod retry;
pub mod sharded;
pub mod tasks;
pub mod watched;

pub use admin::{AdminArgs, Readiness};
pub use duration::parse_duration;
pub use logging::{LogArgs, LogFormat};
pub use sharder_common::RingKind;
pub use tasks::Tasks;
use tokio_util::sync::CancellationToken;

/// Errors of the runtime pieces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A server could not bind its address; `flag` names the flag to change.
    #[error("cannot listen on {addr} ({flag}): {source}")]
    Bind {
        /// The flag that sets the address.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },

    /// A server failed while serving.
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),

    /// A flag has a value that cannot be used.
    #[error("invalid {flag} {value:?}: {reason}")]
    InvalidFlag {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },

    /// The logging subscriber could not be installed.
    #[error("cannot set up logging: {0}")]
    Logging(String),

    /// No Kubernetes client could be configured.
    #[error("cannot configure a Kubernetes client (KUBECONFIG or in-cluster): {0}")]
    Client(#[source] kube::Error),

    /// A supervised task failed, panicked or ended without being asked to stop.
    #[error("task {task} ended unexpectedly: {reason}")]
    TaskEnded {
        /// The task's name.
        task: String,
        /// What happened.
        reason: String,
    },
}

/// The flags every process shares: the admin server and logging.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// Admin server flags.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// Logging flags.
    #[command(flatten)]
    pub log: LogArgs,
}

/// The ring kinds the webhook and the reconciler serve (both by default; the chart ships both
/// CRDs). A kind left out is not watched: its rings get no webhook configuration, no
/// assignments and no moves.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct RingKindArgs {
    /// The ring kinds to serve, comma-separated: clusterring, controllerring.
    #[arg(
        long,
        env = "SHARDER_RING_KINDS",
        value_delimiter = ',',
        default_value = "clusterring,controllerring"
    )]
    pub ring_kinds: Vec<sharder_common::RingKind>,
}

impl RingKindArgs {
    /// The kinds to serve, each once, in a stable order.
    pub fn kinds(&self) -> Vec<sharder_common::RingKind> {
        let mut kinds = self.ring_kinds.clone();
        kinds.sort();
        kinds.dedup();
        kinds
    }
}

/// How every process starts: logging as `common` says, a Kubernetes client from the
/// environment (KUBECONFIG or in-cluster), a token cancelled on the first SIGTERM or SIGINT;
/// then `run` with the client and the token.
pub async fn start<F, Fut, E>(common: &CommonArgs, run: F) -> Result<(), E>
where
    F: FnOnce(kube::Client, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: From<Error>,
{
    common.log.init()?;
    run(client().await?, shutdown_on_signal()).await
}

/// A Kubernetes client from the environment (KUBECONFIG or in-cluster), without kube's retry
/// layer: an apiserver's refusal for now (429, 503) reaches the caller, which waits as long as
/// its Retry-After says ([`retry`]: watches, list pages, writes) or tries again on its own
/// schedule (a Lease renewal, a controller's requeue). kube's layer would wait longer than the
/// answer asks once its own backoff grows past it, and give up after 15 tries.
pub async fn client() -> Result<kube::Client, Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(Error::Client)
}

/// This machine's host name (a pod's name in Kubernetes), if it has one.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// A token cancelled on the first SIGTERM or SIGINT (Ctrl-C); a second signal exits at once.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received, shutting down gracefully");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second shutdown signal, exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod ring_kind_tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        rings: RingKindArgs,
    }

    #[test]
    fn both_ring_kinds_are_served_unless_told_otherwise() {
        let kinds =
            |args: &[&str]| Flags::try_parse_from([&["x"], args].concat()).map(|f| f.rings.kinds());
        use sharder_common::RingKind::{ClusterRing, ControllerRing};
        assert_eq!(kinds(&[]).expect("default"), [ClusterRing, ControllerRing]);
        assert_eq!(
            kinds(&["--ring-kinds", "controllerring"]).expect("one"),
            [ControllerRing]
        );
        assert_eq!(
            kinds(&["--ring-kinds", "controllerring,clusterring,clusterring"]).expect("both"),
            [ClusterRing, ControllerRing]
        );
        let error = kinds(&["--ring-kinds", "ringring"])
            .expect_err("unknown")
            .to_string();
        assert!(
            error.contains("--ring-kinds") && error.contains("clusterring, controllerring"),
            "{error}"
        );
    }
}
