//! The test harness of Sharder's crates: a real kube-apiserver + etcd on loopback, one per test
//! binary, supervised child processes that never outlive the tests, launchers of the product's
//! binaries, a test's [`world::World`] (namespace, ring, certificates), waits, fixtures and Helm.
//! It depends on no product crate but `sharder-common` (the contract's types), so every crate's
//! tests can use it without a dependency cycle; the end-to-end system is `sharder-tests`.
//!
//! ```no_run
//! # async fn example() -> Result<(), sharder_harness::Error> {
//! let control_plane = sharder_harness::ControlPlane::shared().await?;
//! let client = control_plane.client().await?;
//! # Ok(()) }
//! ```

pub mod binaries;
pub mod certs;
pub mod control_plane;
pub mod crd;
pub mod fixtures;
pub mod helm;
pub mod launch;
pub mod node;
pub mod procfs;
pub mod proxy;
pub mod reference;
pub mod supervisor;
pub mod wait;
pub mod world;

pub use control_plane::ControlPlane;
pub use supervisor::Supervised;

/// Errors of the test support library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control plane binaries could not be provisioned (see
    /// `harness/control-plane/provision.sh` or set `KUBEBUILDER_ASSETS`).
    #[error("cannot provision the control plane: {0}")]
    Provision(String),

    /// The control plane did not become ready; the message carries its log tail.
    #[error("control plane not ready: {0}")]
    NotReady(String),

    /// A kubeconfig could not be built or loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),

    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[source] kube::Error),

    /// The product's binaries could not be built; the message carries cargo's output.
    #[error("cannot build the binaries under test: {0}")]
    Build(String),

    /// A command run against a cluster (`kubectl`, `helm`) failed; the message names it and
    /// carries its output.
    #[error("{0}")]
    Command(String),

    /// A data file the tests read (the reference's objects) does not parse; the message names it.
    #[error("{0}")]
    Data(String),

    /// A file or process operation failed; the first field says which.
    #[error("cannot {0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |e| Self::Io(what, e)
    }
}
