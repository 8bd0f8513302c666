//! Rebalancing and a shard crash with real acknowledgements: shards run in-process on the shard
//! SDK (the same drain acknowledgement as any SDK shard, a no-op business reconcile), the
//! reconciler as a process, the sharder webhook assigning acknowledged objects. Writes are
//! counted per user in the apiserver's audit log; the raw PATCH throughput of the same
//! apiserver is measured in the same run.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Api, Client};
use serde_json::json;
use sharder_common::lease::shard_state;
use sharder_common::{Ring, ShardState};
use sharder_sdk::lease::OnStop;
use sharder_sdk::shard::Shard;
use sharder_tests::ControlPlane;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::webhooks::Webhooks;
use crate::{Args, Error, RingSetup, start_reconciler, wait_first_rebalance};
use sharder_tests::launch::Reconciler;

/// What the rebalancing and crash benchmarks measured.
#[derive(Clone, Debug)]
pub struct RebalanceResult {
    /// Objects.
    pub objects: usize,
    /// Objects moved by the scale-out 3 -> 4.
    pub moved: usize,
    /// Reconciler writes to the objects during the scale-out.
    pub reconciler_writes: usize,
    /// Shard writes (acknowledgements) during the scale-out.
    pub shard_writes: usize,
    /// From the new shard's start until every object was on its desired shard, nothing draining.
    pub wall: Duration,
    /// Raw merge PATCHes per second of the same apiserver, same concurrency.
    pub raw_patches_per_second: f64,
    /// The reconciler's `--max-concurrent-writes`.
    pub concurrency: usize,
    /// Objects of the crashed shard.
    pub crashed_objects: usize,
    /// Reconciler writes to them.
    pub crash_writes: usize,
    /// Shard Lease duration.
    pub lease: Duration,
    /// From the crash until every object of the crashed shard was reassigned.
    pub crash_recovery: Duration,
}

/// A minimal shard on the shard SDK, in this process: acknowledges drains, reconciles nothing.
pub(crate) struct BenchShard {
    pub(crate) task: JoinHandle<()>,
    shutdown: CancellationToken,
}

impl BenchShard {
    /// Stops gracefully (the Lease released or kept as the shard was started with).
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Starts shard `name` of the ring `ns` (Lease in `ns`), handling its Lease as `on_stop`
/// says when stopped.
pub(crate) fn start_shard(
    client: Client,
    ns: &str,
    name: &str,
    lease: Duration,
    on_stop: OnStop,
) -> BenchShard {
    let shard = Shard::new(client.clone(), ns, name).with_on_stop(on_stop);
    let keeper = shard.lease(ns, lease, Duration::from_secs(1));
    let api: Api<Secret> = Api::namespaced(client, ns);
    let shutdown = CancellationToken::new();
    let stop_on = shutdown.clone();
    let task = tokio::spawn(async move {
        let config = shard.watcher_config();
        let reconciler = shard.reconciler(|_: Arc<Secret>, _: Arc<()>| async {
            Ok::<_, Infallible>(Action::await_change())
        });
        let _ = shard
            .run(keeper, &stop_on, |stop| {
                Controller::new(api, config)
                    .graceful_shutdown_on(stop.cancelled_owned())
                    .run(
                        reconciler,
                        |_, _, _| Action::requeue(Duration::from_millis(200)),
                        Arc::new(()),
                    )
                    .for_each(|_| async {})
            })
            .await;
    });
    BenchShard { task, shutdown }
}

pub(crate) async fn wait_ready(setup: &RingSetup, name: &str) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(setup.client.clone(), &setup.ns);
    for _ in 0..600 {
        if let Ok(lease) = api.get(name).await
            && shard_state(&lease, Timestamp::now()).state == ShardState::Ready
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(Error::Setup(format!("{name} never held its lease")))
}

/// The reconciler and the shards of a benchmark as ServiceAccounts of its namespace (bound to
/// cluster-admin), so the audit log tells their writes apart.
pub(crate) struct Accounts {
    /// The reconciler's kubeconfig.
    pub(crate) reconciler_kubeconfig: std::path::PathBuf,
    /// The reconciler's audit user.
    pub(crate) reconciler_user: String,
    /// The shards' audit user.
    pub(crate) shard_user: String,
    /// A client for the shards.
    pub(crate) shard_client: Client,
}

impl Accounts {
    /// The accounts `bench-reconciler` and `bench-shard` of the namespace of `setup`.
    pub(crate) async fn new(cp: &ControlPlane, setup: &RingSetup) -> Result<Self, Error> {
        let reconciler_token = cp
            .cluster_admin_token(&setup.ns, "bench-reconciler")
            .await?;
        let shard_token = cp.cluster_admin_token(&setup.ns, "bench-shard").await?;
        Ok(Self {
            reconciler_kubeconfig: cp
                .write_kubeconfig(&format!("bench-reconciler-{}", setup.ns), &reconciler_token)?,
            reconciler_user: format!("system:serviceaccount:{}:bench-reconciler", setup.ns),
            shard_user: format!("system:serviceaccount:{}:bench-shard", setup.ns),
            shard_client: cp.client_with_token(&shard_token).await?,
        })
    }
}

/// The reconciler of the moving benchmarks (`name` logs in `dir`): writes unlimited in rate,
/// [`CONCURRENCY`] in flight, drain checks every 500 ms, no periodic sweep; returns once its
/// first full rebalance of the `n` objects is done.
pub(crate) async fn start_moving_reconciler(
    setup: &RingSetup,
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    webhooks: &Webhooks,
    args: &Args,
    n: usize,
) -> Result<Reconciler, Error> {
    let mut reconciler = start_reconciler(
        setup,
        dir,
        kubeconfig,
        webhooks,
        &[
            "--max-writes-per-second",
            "0",
            "--max-concurrent-writes",
            &CONCURRENCY.to_string(),
            "--drain-check-interval",
            "500ms",
            "--sweep-interval",
            "1h",
        ],
        args.malloc_arena_max,
    )
    .await?;
    wait_first_rebalance(&mut reconciler, n).await?;
    Ok(reconciler)
}

/// Writes in flight of the moving benchmarks' reconciler (and of the raw PATCH baseline).
pub(crate) const CONCURRENCY: usize = 16;

/// Writes to the namespace's Secrets by `user` among `events`.
pub(crate) fn writes_by(events: &[serde_json::Value], ns: &str, user: &str) -> usize {
    events
        .iter()
        .filter(|e| {
            e["user"]["username"] == user
                && e["objectRef"]["namespace"] == ns
                && e["objectRef"]["resource"] == "secrets"
        })
        .count()
}

/// Waits until every object is on its shard of `ring` and none is draining.
pub(crate) async fn converge(
    setup: &RingSetup,
    ring: &Ring,
) -> Result<BTreeMap<String, String>, Error> {
    for _ in 0..2400 {
        let all = setup.assignment().await?;
        let done = all.iter().all(|(name, shard, draining)| {
            !draining && shard.as_deref() == ring.shard_for(&setup.key(name))
        });
        if done {
            return Ok(all
                .into_iter()
                .map(|(name, shard, _)| (name, shard.unwrap_or_default()))
                .collect());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(Error::Setup("the objects never converged".into()))
}

/// Runs the scale-out 3 -> 4 and then the crash of one shard.
pub async fn run(
    cp: &ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<RebalanceResult, Error> {
    let n = args.rebalance_objects;
    let lease = Duration::from_secs(args.lease_seconds);
    let concurrency = CONCURRENCY;
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let setup = RingSetup::new(cp, "bench-rebalance", false, 0).await?;
    let Accounts {
        reconciler_kubeconfig: kubeconfig,
        reconciler_user,
        shard_user,
        shard_client,
    } = Accounts::new(cp, &setup).await?;

    let mut shards: BTreeMap<String, BenchShard> = BTreeMap::new();
    for i in 0..3 {
        let name = format!("shard-{i}");
        shards.insert(
            name.clone(),
            start_shard(
                shard_client.clone(),
                &setup.ns,
                &name,
                lease,
                OnStop::Release,
            ),
        );
        wait_ready(&setup, &name).await?;
    }
    let three = Ring::new((0..3).map(|i| format!("shard-{i}")));
    let rate = setup.create_assigned(0..n, &three).await?;
    eprintln!("[bench]   {n} objects created ({rate:.0}/s)");
    let reconciler =
        start_moving_reconciler(&setup, dir.path(), &kubeconfig, webhooks, args, n).await?;
    let before = converge(&setup, &three).await?;

    // Scale-out 3 -> 4.
    let audit_start = cp.audited_writes().len();
    let started = Instant::now();
    shards.insert(
        "shard-3".into(),
        start_shard(
            shard_client.clone(),
            &setup.ns,
            "shard-3",
            lease,
            OnStop::Release,
        ),
    );
    let four = Ring::new((0..4).map(|i| format!("shard-{i}")));
    let after = converge(&setup, &four).await?;
    let wall = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events: Vec<_> = cp.audited_writes().into_iter().skip(audit_start).collect();
    let moved: Vec<&String> = before.keys().filter(|k| before[*k] != after[*k]).collect();
    let reconciler_writes = writes_by(&events, &setup.ns, &reconciler_user);
    let shard_writes = writes_by(&events, &setup.ns, &shard_user);
    eprintln!(
        "[bench]   scale-out: {} of {n} moved in {wall:?}; {reconciler_writes} reconciler + {shard_writes} shard writes",
        moved.len()
    );

    // Raw PATCH throughput of the same apiserver, same concurrency, as many objects.
    let api = setup.secrets();
    let raw_started = Instant::now();
    futures::stream::iter(moved.iter().map(|name| (*name).clone()))
        .map(|name| {
            let api = api.clone();
            async move {
                let patch = json!({ "metadata": { "labels": { "bench/raw": "1" } } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let raw_patches_per_second = moved.len() as f64 / raw_started.elapsed().as_secs_f64();

    // Crash shard-1: no release; its objects move once its Lease expired and was taken over.
    let victims: Vec<String> = after
        .iter()
        .filter(|(_, s)| s.as_str() == "shard-1")
        .map(|(n, _)| n.clone())
        .collect();
    let audit_start = cp.audited_writes().len();
    let crashed = Instant::now();
    if let Some(shard) = shards.remove("shard-1") {
        shard.task.abort();
    }
    let survivors = Ring::new(["shard-0", "shard-2", "shard-3"]);
    converge(&setup, &survivors).await?;
    let crash_recovery = crashed.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events: Vec<_> = cp.audited_writes().into_iter().skip(audit_start).collect();
    let crash_writes = writes_by(&events, &setup.ns, &reconciler_user);
    eprintln!(
        "[bench]   crash: {} objects reassigned {crash_recovery:?} after the crash (lease {lease:?}), {crash_writes} writes",
        victims.len()
    );
    for shard in shards.values() {
        shard.task.abort();
    }
    drop(reconciler);
    Ok(RebalanceResult {
        objects: n,
        moved: moved.len(),
        reconciler_writes,
        shard_writes,
        wall,
        raw_patches_per_second,
        concurrency,
        crashed_objects: victims.len(),
        crash_writes,
        lease,
        crash_recovery,
    })
}
