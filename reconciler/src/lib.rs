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
//!
//! Where each rule lives, from a Lease event to a write (docs/design.md §2): [`rings::triggers`]
//! (which Lease events wake a ring), [`rings`] (the ring's reconcile), [`rings::schedule`] (the
//! next pass, as data), [`rebalance`] (the pass), [`rebalance::listing`] (the lists),
//! [`rebalance::plan`] (what each object needs), [`rebalance::writing`] (the writes) and
//! [`rebalance::concurrency`] (how many at once). Their shared words are in [`terms`]; the flags
//! in [`args`]; what the controllers share in [`controllers`]; leading in [`lead`].

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use sharder_runtime::lease::{HoldError, Holding, LeaseConfig, LeaseKeeper, OnStop, hold};
use sharder_runtime::{Readiness, Tasks};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

mod args;
pub mod clients;
mod controllers;
mod lead;
mod metrics;
mod rebalance;
mod rings;
mod shard_leases;
mod terms;
mod webhook_config;

pub use args::{Args, DEFAULT_MAX_CONCURRENT_WRITES, LabelGuard, PlacementPolicy};
pub use controllers::{CONTROLLERS_SYNCED, ring_controller};

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

    /// The leader's work ended without being asked to stop.
    #[error("the {0} ended without being asked to stop")]
    ControllerEnded(&'static str),
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

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        sharder_runtime::host_name().unwrap_or_else(|| "sharder-reconciler".to_owned())
            + &format!("-{}", std::process::id())
    })
}
