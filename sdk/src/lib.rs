//! The shard SDK for kube-rs controllers ([`shard`]: shard Lease, a watch of the assigned objects,
//! drain acknowledgement) and the runtime pieces shared by Sharder's components and sharded
//! controllers: the admin server (probes and Prometheus metrics), logging setup, graceful shutdown
//! on signals, and the Lease keeper used for leader election and shard membership.

use std::net::SocketAddr;

pub mod admin;
pub mod duration;
pub mod lease;
pub mod logging;
pub mod shard;

pub use admin::{AdminArgs, Readiness};
pub use duration::parse_duration;
pub use logging::{LogArgs, LogFormat};
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
