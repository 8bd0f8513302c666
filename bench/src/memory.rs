//! Reconciler memory against object count: for each size, a fresh ring with that many Secrets
//! (already assigned), a reconciler process through its first full rebalance and a scale-out
//! 3 -> 4 shards; beside it, a baseline process that caches every object's metadata (a kube-rs
//! reflector over metadata), what not caching saves.

use std::process::Command;
use std::time::{Duration, Instant};

use sharder_common::Ring;
use sharder_harness::ControlPlane;
use sharder_harness::procfs::open_sockets;

use crate::webhooks::{Webhooks, bench_binary, spawn_until_line};
use crate::{Args, Error, RingSetup, rebalanced, start_reconciler, wait_first_rebalance};
use sharder_harness::procfs::rss_kib;

/// One size's readings, in KiB.
#[derive(Clone, Debug)]
pub struct MemoryRow {
    /// Sharded objects.
    pub objects: usize,
    /// Creates per second while preparing (informational).
    pub create_rate: f64,
    /// Reconciler RSS after the first full rebalance.
    pub reconciler_steady: u64,
    /// Reconciler peak RSS through the rebalance and the scale-out.
    pub reconciler_peak: u64,
    /// Reconciler RSS after the scale-out's drains.
    pub reconciler_after_scale_out: u64,
    /// Sockets the reconciler held open after the scale-out (its connections to the
    /// apiserver, at most one per write in flight plus lists and watches when pooled right).
    pub reconciler_sockets: usize,
    /// Objects the scale-out drained.
    pub drained: u64,
    /// How long the first full rebalance (a list of every object) took.
    pub first_rebalance: Duration,
    /// How long the scale-out's rebalance (a list of every object and the drains) took.
    pub scale_out_rebalance: Duration,
    /// Baseline RSS once its cache holds every object.
    pub baseline_steady: u64,
    /// Baseline peak RSS.
    pub baseline_peak: u64,
}

/// The duration a rebalance summary line reports.
fn took(line: &serde_json::Value) -> Duration {
    Duration::from_millis(line["duration_ms"].as_u64().unwrap_or(0))
}

async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Measures every size of `args.sizes`; runs last, as the namespace of the last size is left
/// to be deleted.
pub async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<Vec<MemoryRow>, Error> {
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
        let setup = RingSetup::new(cp, &format!("bench-mem-{n}"), false, 3).await?;
        let ring = Ring::new((0..3).map(|i| format!("shard-{i}")));
        let create_rate = setup.create_assigned(0..n, &ring).await?;
        eprintln!("[bench]   {n} objects created ({create_rate:.0}/s)");

        let mut reconciler = start_reconciler(
            &setup,
            dir.path(),
            cp.kubeconfig(),
            webhooks,
            &[
                "--max-writes-per-second",
                "0",
                "--resync-interval",
                "1h",
                "--sweep-interval",
                "1h",
            ],
            args.reconciler_malloc_arena_max,
        )
        .await?;
        let pid = reconciler.process.pid();
        let first = wait_first_rebalance(&mut reconciler, n).await?;
        settle().await;
        let (steady, _) = rss_kib(pid).ok_or_else(|| Error::Setup("no reconciler RSS".into()))?;
        let skip = reconciler.process.lines().len();
        setup.add_shard_lease("shard-3", 3600).await;
        let line = reconciler
            .process
            .wait_for(
                "the scale-out's drains",
                skip,
                Duration::from_secs(600),
                |l| rebalanced(l, n) && l["drained"].as_u64().unwrap_or(0) > 0,
            )
            .await?;
        settle().await;
        let (after, peak) = rss_kib(pid).ok_or_else(|| Error::Setup("no reconciler RSS".into()))?;
        let reconciler_sockets = open_sockets(pid).unwrap_or(0);
        drop(reconciler);

        let mut command = Command::new(bench_binary("metadata-cache")?);
        command
            .env("KUBECONFIG", cp.kubeconfig())
            .args([setup.ns.as_str(), &n.to_string()]);
        let started = Instant::now();
        let (mut baseline, _) = spawn_until_line("metadata-cache", command, "synced").await?;
        let baseline_pid = baseline.pid();
        settle().await;
        let (baseline_steady, baseline_peak) =
            rss_kib(baseline_pid).ok_or_else(|| Error::Setup("no baseline RSS".into()))?;
        baseline.kill();
        eprintln!(
            "[bench]   {n}: reconciler {:.1} MiB steady, {:.1} MiB peak, {reconciler_sockets} sockets; baseline {:.1} MiB (synced in {:?})",
            steady as f64 / 1024.0,
            peak as f64 / 1024.0,
            baseline_steady as f64 / 1024.0,
            started.elapsed()
        );
        rows.push(MemoryRow {
            objects: n,
            create_rate,
            reconciler_steady: steady,
            reconciler_peak: peak,
            reconciler_after_scale_out: after,
            reconciler_sockets,
            drained: line["drained"].as_u64().unwrap_or(0),
            first_rebalance: took(&first),
            scale_out_rebalance: took(&line),
            baseline_steady,
            baseline_peak,
        });
        // The last size's namespace is deleted without waiting: nothing is measured after it.
        let last = rows.len() == args.sizes.len();
        let wait = n >= crate::WAIT_FOR_REMOVAL_FROM && !last;
        let removed = setup.remove(wait).await?;
        if wait {
            eprintln!("[bench]   {n}: namespace removed in {removed:?}");
        }
    }
    Ok(rows)
}
