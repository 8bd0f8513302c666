//! Rebalancing and a shard crash with real acknowledgements: shards run in-process on the shard
//! SDK (the same drain acknowledgement as any SDK shard, a no-op business reconcile), the
//! reconciler as a process, the sharder webhook assigning acknowledged objects. Writes, and
//! when the apiserver received and answered each, come from its audit log. Each round scales
//! out 3 -> 4 and measures, right after, raw PATCHes of the same apiserver (plain, at several
//! concurrencies, and through the webhook as an acknowledgement goes); then the fourth shard
//! leaves (its Lease released: its objects move back directly). After the rounds, shards crash one after another (each a fresh
//! shard that joined and took its share), each followed by raw PATCHes (several times its
//! objects): every move is compared with the apiserver's write rate measured right beside it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Config};
use kube::{Api, Client};
use serde_json::json;
use sharder_common::lease::shard_state;
use sharder_common::{Ring, RingId, ShardState};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::AuditMark;
use sharder_harness::launch::Reconciler;
use sharder_sdk::controller::{drive, listed_controller};
use sharder_sdk::lease::OnStop;
use sharder_sdk::shard::Shard;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::stats::{median, median_item};
use crate::tracker::{Alarm, Tracker};
use crate::webhooks::Webhooks;
use crate::writes::{Writes, count_by};
use crate::{Args, Error, RingSetup, start_reconciler, wait_first_rebalance};

/// The raw PATCH baseline at one concurrency.
#[derive(Clone, Debug)]
pub struct RawPatches {
    /// Requests in flight.
    pub concurrency: usize,
    /// Patches.
    pub count: usize,
    /// Patches per second at the apiserver (audit log: first received to last answered).
    pub per_second: f64,
    /// Patches in flight at the apiserver on average (audit log), against `concurrency` sent.
    pub in_flight: f64,
}

impl RawPatches {
    /// The fastest of `runs`, if any.
    pub fn fastest(runs: &[Self]) -> Option<&Self> {
        runs.iter()
            .max_by(|a, b| a.per_second.total_cmp(&b.per_second))
    }

    /// The run of `runs` at `concurrency`, if any.
    pub fn at(runs: &[Self], concurrency: usize) -> Option<&Self> {
        runs.iter().find(|x| x.concurrency == concurrency)
    }

    /// The rate of the run of `runs` at `concurrency` (NaN if none ran).
    pub fn rate_at(runs: &[Self], concurrency: usize) -> f64 {
        Self::at(runs, concurrency).map_or(f64::NAN, |x| x.per_second)
    }
}

/// One scale-out 3 -> 4 and what was measured beside it.
#[derive(Clone, Debug)]
pub struct Round {
    /// Objects moved.
    pub moved: usize,
    /// Reconciler writes to the objects (drains).
    pub reconciler_writes: usize,
    /// Shard writes to the objects (acknowledgements).
    pub shard_writes: usize,
    /// From the new shard's start until every object was on its shard, nothing draining.
    pub wall: Duration,
    /// The reconciler's and the shards' writes to the objects.
    pub writes: Writes,
    /// Raw merge PATCHes right after, at each concurrency.
    pub raw: Vec<RawPatches>,
    /// Raw merge PATCHes through the sharder webhook, at the best concurrency.
    pub raw_webhook: RawPatches,
    /// The fourth shard leaving (Lease released): the reconciler's writes moving its objects
    /// back directly.
    pub scale_in: Writes,
}

impl Round {
    /// The fastest raw PATCH rate of the round (the apiserver's ceiling for plain writes).
    pub fn raw_best(&self) -> &RawPatches {
        RawPatches::fastest(&self.raw).unwrap_or(&self.raw_webhook)
    }

    /// Rebalancing writes per second (first received to last answered) over the best raw rate.
    pub fn ratio(&self) -> f64 {
        self.writes.rate() / self.raw_best().per_second
    }

    /// Direct moves per second of the scale-in over the best raw rate.
    pub fn scale_in_ratio(&self) -> f64 {
        self.scale_in.rate() / self.raw_best().per_second
    }
}

/// What the rebalancing and crash benchmarks measured.
#[derive(Clone, Debug)]
pub struct RebalanceResult {
    /// Objects.
    pub objects: usize,
    /// The reconciler's `--max-concurrent-writes`.
    pub concurrency: usize,
    /// The shards' controller concurrency (0: unbounded).
    pub shard_concurrency: u16,
    /// The scale-out rounds.
    pub rounds: Vec<Round>,
    /// Shard Lease duration.
    pub lease: Duration,
    /// The crashes, one after another.
    pub crashes: Vec<Crash>,
}

/// One shard crash: a fresh shard joins, takes its share, and stops at once (no release, no
/// more renewals); its objects move once its Lease expired and was taken over.
#[derive(Clone, Debug)]
pub struct Crash {
    /// The crashed shard.
    pub shard: String,
    /// Its objects.
    pub objects: usize,
    /// From the crash until every object of the crashed shard was reassigned.
    pub recovery: Duration,
    /// The reconciler's writes moving them.
    pub moves: Writes,
    /// Raw merge PATCHes of the namespace's objects right after the crashed shard's were back
    /// ([`RAW_AFTER_CRASH`] times as many as it had), at each concurrency: the apiserver's
    /// plain write rate beside this crash.
    pub raw: Vec<RawPatches>,
}

impl Crash {
    /// The fastest raw PATCH run right after this crash (the apiserver's ceiling for plain
    /// writes beside it), if any ran.
    pub fn raw_best(&self) -> Option<&RawPatches> {
        RawPatches::fastest(&self.raw)
    }

    /// The fastest raw PATCH rate right after this crash (NaN if none ran).
    pub fn raw_beside(&self) -> f64 {
        self.raw_best().map_or(f64::NAN, |r| r.per_second)
    }

    /// The bound on the recovery: 2 x lease (expired, then taken over) + the objects at the
    /// raw rate `raw` + 1 s.
    pub fn bound(&self, lease: Duration, raw: f64) -> f64 {
        2.0 * lease.as_secs_f64() + self.objects as f64 / raw + 1.0
    }

    /// Dead-shard moves per second (first received to last answered) over `raw`.
    pub fn ratio(&self, raw: f64) -> f64 {
        self.moves.rate() / raw
    }
}

impl RebalanceResult {
    /// The median of `f` over the rounds.
    pub fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        median(self.rounds.iter().map(f).collect())
    }

    /// The median of `f` over the crashes.
    pub fn crash_median(&self, f: impl Fn(&Crash) -> f64) -> f64 {
        median(self.crashes.iter().map(f).collect())
    }

    /// The round with the median ratio (its raw PATCH runs are shown).
    pub fn median_round(&self) -> Option<&Round> {
        median_item(&self.rounds, Round::ratio)
    }
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
    concurrency: u16,
    alarm: &Alarm,
) -> BenchShard {
    let shard = Shard::new(client.clone(), RingId::cluster_ring(ns), name).with_on_stop(on_stop);
    let keeper = shard.lease(ns, lease, Duration::from_secs(1));
    let api: Api<Secret> = Api::namespaced(client, ns);
    let shutdown = CancellationToken::new();
    let stop_on = shutdown.clone();
    let (name, alarm) = (name.to_owned(), alarm.clone());
    let task = tokio::spawn(async move {
        let config = shard.watcher_config();
        let reconciler = shard.reconciler(|_: Arc<Secret>, _: Arc<()>| async {
            Ok::<_, Infallible>(Action::await_change())
        });
        let run = shard
            .run(keeper, &stop_on, |stop| {
                let (controller, listed) = listed_controller(api, config);
                let running = controller
                    .with_config(Config::default().concurrency(concurrency))
                    .graceful_shutdown_on(stop.clone().cancelled_owned())
                    .run(
                        reconciler,
                        |_, _, _| Action::requeue(Duration::from_millis(200)),
                        Arc::new(()),
                    )
                    .for_each(|_| async {});
                async move { drive(running, &listed, &stop).await }
            })
            .await;
        // Stopped by the bench it returns Ok; an error (its Lease lost, say to renewals
        // late under load) leaves the ring without a shard the bench counts on.
        if let Err(e) = run {
            eprintln!("[bench]   shard {name} stopped: {e}");
            alarm.raise(format!("shard {name} stopped: {e}"));
        }
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

/// The reconciler, the shards and the raw PATCH baseline of a benchmark as ServiceAccounts of
/// its namespace (bound to cluster-admin), so the audit log tells their writes apart and each
/// authenticates as an in-cluster component does (a ServiceAccount token, verified per request).
pub(crate) struct Accounts {
    /// The reconciler's kubeconfig.
    pub(crate) reconciler_kubeconfig: std::path::PathBuf,
    /// The reconciler's audit user.
    pub(crate) reconciler_user: String,
    /// The shards' audit user.
    pub(crate) shard_user: String,
    /// A client for the shards.
    pub(crate) shard_client: Client,
    /// The raw PATCH baseline's audit user.
    pub(crate) raw_user: String,
    /// A client for the raw PATCH baseline.
    pub(crate) raw_client: Client,
}

impl Accounts {
    /// The accounts `bench-reconciler`, `bench-shard` and `bench-raw` of the namespace of
    /// `setup`.
    pub(crate) async fn new(cp: &ControlPlane, setup: &RingSetup) -> Result<Self, Error> {
        let reconciler_token = cp
            .cluster_admin_token(&setup.ns, "bench-reconciler")
            .await?;
        let shard_token = cp.cluster_admin_token(&setup.ns, "bench-shard").await?;
        let raw_token = cp.cluster_admin_token(&setup.ns, "bench-raw").await?;
        Ok(Self {
            reconciler_kubeconfig: cp
                .write_kubeconfig(&format!("bench-reconciler-{}", setup.ns), &reconciler_token)?,
            reconciler_user: format!("system:serviceaccount:{}:bench-reconciler", setup.ns),
            shard_user: format!("system:serviceaccount:{}:bench-shard", setup.ns),
            shard_client: cp.client_with_token(&shard_token).await?,
            raw_user: format!("system:serviceaccount:{}:bench-raw", setup.ns),
            raw_client: cp.client_with_token(&raw_token).await?,
        })
    }
}

/// The reconciler of the moving benchmarks (`name` logs in `dir`): writes unlimited in rate,
/// at most `--rebalance-concurrency` in flight, drain checks every 500 ms, no periodic sweep;
/// returns once its first full rebalance of the `n` objects is done.
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
            &args.rebalance_concurrency.to_string(),
            "--drain-check-interval",
            "500ms",
            "--sweep-interval",
            "1h",
        ],
        args.reconciler_malloc_arena_max,
    )
    .await?;
    wait_first_rebalance(&mut reconciler, n).await?;
    Ok(reconciler)
}

/// Concurrencies of the raw PATCH baseline.
pub const RAW_CONCURRENCIES: [usize; 4] = [16, 32, 64, 128];

/// The raw PATCH runs right after a crash write this many times the crash's objects (at least
/// [`RAW_MIN`], at most every object of the namespace once): a run as short as the moves (about
/// 2 s) holds none or one of the apiserver's garbage collections (a few tenths of a second of
/// its CPU each, about every 2 s under this load), which moves its rate by a fifth either way,
/// and the fastest of four such runs is then biased upwards.
pub const RAW_AFTER_CRASH: usize = 3;

/// The fewest writes of a raw PATCH run.
pub const RAW_MIN: usize = 1000;

/// One raw PATCH run, as `user` through `client`.
struct RawRun<'a> {
    cp: &'a ControlPlane,
    setup: &'a RingSetup,
    client: &'a Client,
    user: &'a str,
    names: &'a [String],
    count: usize,
}

impl RawRun<'_> {
    /// Merge PATCHes of `count` of `names` (a new label value `round` each, so every one is a
    /// real write), answered with the object's metadata only as the reconciler's and the
    /// shards' writes are (a whole object costs the apiserver more to encode), `concurrency` in
    /// flight; the rate is taken from the audit log like the
    /// moves'. With `through_webhook` each patch also removes the shard label, so the sharder
    /// webhook is called and puts it back (as it does for every acknowledgement).
    async fn run(
        &self,
        concurrency: usize,
        round: usize,
        through_webhook: bool,
    ) -> Result<RawPatches, Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.setup.ns);
        let mark = self.cp.audit_mark();
        let start = Timestamp::now();
        let shard_label = self.setup.labels.shard.clone();
        futures::stream::iter(self.names.iter().cycle().take(self.count).cloned())
            .map(|name| {
                let api = api.clone();
                let mut labels = json!({ "bench/raw": round.to_string() });
                if through_webhook {
                    labels[&shard_label] = serde_json::Value::Null;
                }
                async move {
                    let patch = json!({ "metadata": { "labels": labels } });
                    api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                }
            })
            .buffer_unordered(concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        let writes = Writes::of(
            start,
            &settled_audit(self.cp, mark).await,
            &self.setup.ns,
            &[self.user],
        );
        Ok(RawPatches {
            concurrency,
            count: writes.count,
            per_second: writes.rate(),
            in_flight: writes.in_flight(),
        })
    }
}

/// The audit events after `mark`, once the log stopped growing (the apiserver writes an event
/// as it answers, so the last ones may land just after the client saw its answer).
async fn settled_audit(cp: &ControlPlane, mark: AuditMark) -> Vec<serde_json::Value> {
    let mut seen = cp.audit_mark();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cp.audit_mark();
        if now == seen {
            return cp.audited_writes_since(mark);
        }
        seen = now;
    }
}

/// The running system of the benchmark.
struct Bench<'a> {
    cp: &'a ControlPlane,
    setup: RingSetup,
    tracker: Tracker,
    /// Runs as long as the benchmark (its moves are what is measured).
    _reconciler: Reconciler,
    reconciler_user: String,
    shard_user: String,
    shard_client: Client,
    raw_user: String,
    raw_client: Client,
    shards: BTreeMap<String, BenchShard>,
    /// Raised by a shard that stops by itself.
    alarm: Alarm,
    lease: Duration,
    shard_concurrency: u16,
}

impl Bench<'_> {
    fn start_shard(&mut self, name: &str) {
        let shard = start_shard(
            self.shard_client.clone(),
            &self.setup.ns,
            name,
            self.lease,
            OnStop::Release,
            self.shard_concurrency,
            &self.alarm,
        );
        self.shards.insert(name.to_owned(), shard);
    }

    /// Crash `number`: shard `crash-<number>` joins the three shards and takes its share, then
    /// stops at once (no release, no more renewals); measured until its objects are back on
    /// the three.
    async fn crash(&mut self, number: usize) -> Result<Crash, Error> {
        let three: Vec<String> = (0..3).map(|i| format!("shard-{i}")).collect();
        let name = format!("crash-{number}");
        let four = Ring::new(three.iter().cloned().chain([name.clone()]));
        self.start_shard(&name);
        let (_, after) = self.tracker.converge(&self.setup, &four).await?;
        let objects = after.values().filter(|s| **s == name).count();
        let mark = self.cp.audit_mark();
        let start = Timestamp::now();
        let crashed = Instant::now();
        if let Some(shard) = self.shards.remove(&name) {
            shard.task.abort();
        }
        let (converged, _) = self
            .tracker
            .converge(&self.setup, &Ring::new(three))
            .await?;
        let recovery = converged - crashed;
        let events = settled_audit(self.cp, mark).await;
        let moves = Writes::of(start, &events, &self.setup.ns, &[&self.reconciler_user]);
        eprintln!(
            "[bench]   crash {number}: {objects} objects of {name} reassigned {recovery:?} after the crash (lease {:?}), {} writes, {:.0}/s from the first to the last, {:.1} in flight",
            self.lease,
            moves.count,
            moves.rate(),
            moves.in_flight(),
        );
        // The apiserver's plain write rate right beside the moves: its speed drifts by a
        // fifth and more between minutes on a shared machine. Any object of the namespace
        // will do (each a Secret on a live shard); none is written twice in a run.
        let names: Vec<String> = after.into_keys().collect();
        let count = (RAW_AFTER_CRASH * objects).max(RAW_MIN).min(names.len());
        let raw = self.raw_runs(&names, count, 1000 + 10 * number).await?;
        Ok(Crash {
            shard: name,
            objects,
            recovery,
            moves,
            raw,
        })
    }

    /// Raw PATCHes (`count`, cycling through `names`) at each of [`RAW_CONCURRENCIES`] in
    /// turn, the label values numbered from `first`.
    async fn raw_runs(
        &self,
        names: &[String],
        count: usize,
        first: usize,
    ) -> Result<Vec<RawPatches>, Error> {
        let runs = self.raw_run(names, count);
        let mut raw = Vec::new();
        for (i, concurrency) in RAW_CONCURRENCIES.into_iter().enumerate() {
            let r = runs.run(concurrency, first + i, false).await?;
            eprintln!(
                "[bench]   raw PATCH: {} at {} in flight: {:.0}/s, {:.1} in flight at the apiserver",
                r.count, r.concurrency, r.per_second, r.in_flight
            );
            raw.push(r);
        }
        Ok(raw)
    }

    /// A raw PATCH run of `count` writes cycling through `names`, as the raw ServiceAccount.
    fn raw_run<'a>(&'a self, names: &'a [String], count: usize) -> RawRun<'a> {
        RawRun {
            cp: self.cp,
            setup: &self.setup,
            client: &self.raw_client,
            user: &self.raw_user,
            names,
            count,
        }
    }

    /// One round: scale-out 3 -> 4, raw PATCHes, then shard-3 leaves.
    async fn round(&mut self, number: usize) -> Result<Round, Error> {
        let three = Ring::new((0..3).map(|i| format!("shard-{i}")));
        let four = Ring::new((0..4).map(|i| format!("shard-{i}")));
        let (_, before) = self.tracker.converge(&self.setup, &three).await?;

        let mark = self.cp.audit_mark();
        let start = Timestamp::now();
        let started = Instant::now();
        self.start_shard("shard-3");
        let (converged, after) = self.tracker.converge(&self.setup, &four).await?;
        let wall = converged - started;
        let events = settled_audit(self.cp, mark).await;
        let users = [self.reconciler_user.as_str(), self.shard_user.as_str()];
        let writes = Writes::of(start, &events, &self.setup.ns, &users);
        let moved = before
            .keys()
            .filter(|k| before.get(*k) != after.get(*k))
            .count();
        let reconciler_writes = count_by(&events, &self.setup.ns, &self.reconciler_user);
        let shard_writes = count_by(&events, &self.setup.ns, &self.shard_user);
        eprintln!(
            "[bench]   round {number}: {moved} of {} moved in {wall:?}; {reconciler_writes} reconciler + {shard_writes} shard writes; {:.0} writes/s from the first to the last, {:.1} in flight",
            after.len(),
            writes.rate(),
            writes.in_flight(),
        );

        // Raw PATCHes of the same apiserver, as many writes, each concurrency in turn.
        let names: Vec<String> = after.keys().cloned().collect();
        let count = writes.count.max(RAW_MIN);
        let raw = self.raw_runs(&names, count, 10 * number).await?;
        let runs = self.raw_run(&names, count);
        let best = RawPatches::fastest(&raw).map_or(64, |r| r.concurrency);
        let raw_webhook = runs.run(best, 10 * number + 9, true).await?;
        self.tracker.converge(&self.setup, &four).await?;
        eprintln!(
            "[bench]   raw PATCH through the webhook: {} at {} in flight: {:.0}/s",
            raw_webhook.count, raw_webhook.concurrency, raw_webhook.per_second
        );

        // shard-3 leaves: its Lease is released, its objects move back directly.
        let mark = self.cp.audit_mark();
        let start = Timestamp::now();
        if let Some(shard) = self.shards.remove("shard-3") {
            shard.stop().await;
        }
        self.tracker.converge(&self.setup, &three).await?;
        let scale_in = Writes::of(
            start,
            &settled_audit(self.cp, mark).await,
            &self.setup.ns,
            &[&self.reconciler_user],
        );
        eprintln!(
            "[bench]   round {number}: shard-3 left, {} moved back at {:.0}/s",
            scale_in.count,
            scale_in.rate()
        );
        Ok(Round {
            moved,
            reconciler_writes,
            shard_writes,
            wall,
            writes,
            raw,
            raw_webhook,
            scale_in,
        })
    }
}

/// Runs the scale-out rounds and then the crashes.
pub async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<RebalanceResult, Error> {
    let n = args.rebalance_objects;
    let lease = Duration::from_secs(args.lease_seconds);
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let setup = RingSetup::new(cp, "bench-rebalance", false, 0).await?;
    let accounts = Accounts::new(cp, &setup).await?;
    let mut shards = BTreeMap::new();
    let alarm = Alarm::default();
    for i in 0..3 {
        let name = format!("shard-{i}");
        let shard = start_shard(
            accounts.shard_client.clone(),
            &setup.ns,
            &name,
            lease,
            OnStop::Release,
            args.shard_concurrency,
            &alarm,
        );
        shards.insert(name.clone(), shard);
        wait_ready(&setup, &name).await?;
    }
    let three = Ring::new((0..3).map(|i| format!("shard-{i}")));
    let rate = setup.create_assigned(0..n, &three).await?;
    eprintln!("[bench]   {n} objects created ({rate:.0}/s)");
    let tracker = Tracker::start(&setup, &alarm).await?;
    let reconciler = start_moving_reconciler(
        &setup,
        dir.path(),
        &accounts.reconciler_kubeconfig,
        webhooks,
        args,
        n,
    )
    .await?;
    let mut bench = Bench {
        cp,
        setup,
        tracker,
        _reconciler: reconciler,
        reconciler_user: accounts.reconciler_user,
        shard_user: accounts.shard_user,
        shard_client: accounts.shard_client,
        raw_user: accounts.raw_user,
        raw_client: accounts.raw_client,
        shards,
        alarm,
        lease,
        shard_concurrency: args.shard_concurrency,
    };
    let mut rounds = Vec::new();
    for number in 1..=args.rebalance_rounds.max(1) {
        rounds.push(bench.round(number).await?);
    }

    let mut crashes = Vec::new();
    for number in 1..=args.crashes.max(1) {
        crashes.push(bench.crash(number).await?);
    }
    for shard in bench.shards.values() {
        shard.task.abort();
    }
    Ok(RebalanceResult {
        objects: n,
        concurrency: args.rebalance_concurrency,
        shard_concurrency: args.shard_concurrency,
        rounds,
        lease,
        crashes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(concurrency: usize, per_second: f64) -> RawPatches {
        RawPatches {
            concurrency,
            count: 1000,
            per_second,
            in_flight: concurrency as f64,
        }
    }

    /// A crash whose `moves` writes took one second, with raw runs `raw` beside it.
    fn crash(moves: usize, raw: Vec<RawPatches>) -> Crash {
        Crash {
            shard: format!("crash-{moves}"),
            objects: moves,
            recovery: Duration::from_secs(21),
            moves: Writes {
                count: moves,
                first_received: 1.0,
                last_answered: 2.0,
                busy: 0.0,
            },
            raw,
        }
    }

    #[test]
    fn a_crash_is_judged_against_the_fastest_raw_run_right_after_it() {
        let c = crash(900, vec![raw(16, 800.0), raw(64, 1000.0), raw(128, 950.0)]);
        assert_eq!(c.raw_best().map(|r| r.concurrency), Some(64));
        assert!((c.ratio(c.raw_beside()) - 0.9).abs() < 1e-9);
        assert!(crash(900, Vec::new()).raw_beside().is_nan());
    }

    #[test]
    fn crashes_are_judged_each_against_its_own_raw_rate_then_by_the_median() {
        // Move rates 900, 1000, 1100 against raw rates beside them that turn the order round:
        // ratios 0.9, 0.5, 1.1.
        let result = RebalanceResult {
            objects: 10_000,
            concurrency: 64,
            shard_concurrency: 0,
            rounds: Vec::new(),
            lease: Duration::from_secs(10),
            crashes: vec![
                crash(900, vec![raw(64, 1000.0)]),
                crash(1000, vec![raw(64, 2000.0)]),
                crash(1100, vec![raw(64, 1000.0)]),
            ],
        };
        let median = result.crash_median(|c| c.ratio(RawPatches::rate_at(&c.raw, 64)));
        assert!((median - 0.9).abs() < 1e-9, "{median}");
    }
}
