//! Section 10, range mode beside label mode on the same Secrets: one scale-out 3 -> 4 in label
//! mode (drains, acknowledgements, the webhook), then the ring switched to range mode by uid and
//! one scale-out 3 -> 4 there (ranges handed over, each shard's list and watch selecting its
//! own), each with a reconciler process of its own; then what a shard's selector costs its list.
//! The shards run in this process on the shard SDK and record what they reconcile: a move has
//! ended when every object was last reconciled by the shard its new assignment names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use sharder_common::ranges::{
    RANGE_KEY_ANNOTATION, RangeKey, SERVED_ANNOTATION, SPACE_END, ShardSelector, fnv1a64,
    valid_assignment,
};
use sharder_common::{Ring, RingKind};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::AuditMark;
use sharder_harness::launch::Reconciler;
use sharder_harness::procfs::rss_kib;
use sharder_harness::wait::{apiserver_metrics, metric_value};
use sharder_runtime::sharded::selecting_client;
use sharder_sdk::lease::OnStop;

use crate::memory::settled_rss;
use crate::progress::progress;
use crate::rebalance::{Movers, RECONCILER, SHARD_CONCURRENCY, SHARDS, shards};
use crate::report::{goals, table};
use crate::stats::{cpu_seconds, median, mib};
use crate::tracker::Alarm;
use crate::webhooks::{Webhooks, share_cache};
use crate::{Args, Error, REBALANCE_CONCURRENCY, each_metadata};

/// How long a move may take before the section fails.
const MOVE_TIMEOUT: Duration = Duration::from_secs(900);

/// The label the bench puts on the fourth shard's share in range mode, to list and watch the
/// same objects by a label.
const SHARE_LABEL: &str = "bench/share";

/// Runs of each share cache, interleaved.
const CACHE_ROUNDS: usize = 3;

/// Rounds of each list in the selector's cost, interleaved.
const LIST_ROUNDS: usize = 5;

/// One scale-out 3 -> 4 in one mode.
#[derive(Clone, Debug, Default)]
struct Move {
    /// Objects whose shard changed.
    moved: usize,
    /// From the fourth shard's start until every object was last reconciled by its shard.
    served: Duration,
    /// Writes to the objects by the reconciler and by the shards.
    writes: [usize; 2],
    /// CPU seconds of the apiserver and etcd over [`Self::served`].
    cpu: f64,
    /// The reconciler's RSS after the move and its peak since its start, MiB.
    rss: (f64, f64),
}

/// What one list costs: objects returned, median milliseconds.
#[derive(Clone, Debug, Default)]
struct List {
    items: usize,
    ms: f64,
}

impl List {
    /// Milliseconds per object returned.
    fn per_object(&self) -> f64 {
        self.ms / self.items.max(1) as f64
    }
}

/// One size's figures.
#[derive(Clone, Debug, Default)]
struct Size {
    objects: usize,
    label: Move,
    range: Move,
    /// The fourth shard's share of the hash space in range mode.
    space: f64,
    /// The fourth shard's selector: terms and characters.
    terms: usize,
    chars: usize,
    /// Lists of the fourth shard's share by its label, by its selector, and of everything.
    by_label: List,
    by_range: List,
    all: List,
    /// The RSS (now, peak; MiB, medians) of a process caching the share by its label, and by
    /// its selector, as a shard's controller does.
    caches: [(f64, f64); 2],
    /// The apiserver's and etcd's CPU seconds for [`PATCHED`] patches with no watch, with
    /// [`WATCHERS`] watches of the share by its label, and by its selector, every run.
    watches: [Vec<f64>; 3],
    /// What the apiserver allocated in each of those runs, MiB.
    allocated: [Vec<f64>; 3],
}

/// The reconciler's flags in both modes: those of section 4 (no rate limit on its writes).
fn flags() -> String {
    format!(
        "--max-writes-per-second 0 --max-concurrent-writes {REBALANCE_CONCURRENCY} --drain-check-interval 500ms --sweep-interval 1h --leader-election-duration 20s --leader-election-renew 1s"
    )
}

/// Runs the section at every size of `args.range_sizes`; its text.
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<String, Error> {
    let mut sizes = Vec::new();
    for &n in &args.range_sizes {
        sizes.push(size(cp, webhooks, args, n).await?);
    }
    Ok(markdown(&sizes))
}

/// CPU seconds the apiserver and etcd used so far.
fn control_plane_cpu(cp: &ControlPlane) -> f64 {
    cp.pids().iter().filter_map(|p| cpu_seconds(*p)).sum()
}

/// The RSS of `reconciler` now and its peak, MiB.
fn rss(reconciler: &Reconciler) -> (f64, f64) {
    rss_kib(reconciler.process.pid()).map_or((0.0, 0.0), |(now, peak)| (mib(now), mib(peak)))
}

/// One size: both moves on the same objects, then the lists; the namespace is deleted after.
async fn size(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
    n: usize,
) -> Result<Size, Error> {
    progress!("{n} objects: creating them on 3 shards in label mode");
    let prefix = format!("bench-ranges-{n}");
    let kind = RingKind::ClusterRing;
    let mut m = Movers::prepare(cp, args, &prefix, &shards(3), OnStop::Release, kind, n).await?;
    let mut uids = HashMap::new();
    each_metadata(&m.setup.secrets(), None, |o| {
        uids.insert(o.name_any(), o.uid().unwrap_or_default());
    })
    .await?;
    let mut reconciler = m.start_reconciler(webhooks, &flags(), n).await?;

    let before = by_ring(&m, &shards(3), &uids);
    wait_served(&m, &before).await?;
    let started = Started::now(cp);
    m.start_shard("shard-3", OnStop::Release);
    let after = by_ring(&m, &shards(4), &uids);
    wait_served(&m, &after).await?;
    let spent = started.spent(cp);
    m.converge(&shards(4)).await?;
    let label = started
        .finish(&m, spent, &reconciler, (&before, &after))
        .await;
    progress!("  label mode: {} moved in {:?}", label.moved, label.served);

    // The switch: the label-mode reconciler stops (the objects keep the labels of the ring of
    // 4), then its shards; the ring turns to range mode, a reconciler of its own and range-mode
    // shards start.
    reconciler.process.stop(Duration::from_secs(10));
    for shard in std::mem::take(&mut m.shards).into_values() {
        shard.stop().await;
    }
    m.setup.to_range_mode("uid", false).await;
    m.reconciled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    let mut reconciler = m.launch_reconciler(webhooks, &flags()).await?;
    for name in shards(3) {
        m.start_range_shard(&name);
    }
    let before = assigned(&m, &shards(3), &uids).await?;
    wait_served(&m, &before).await?;
    let started = Started::now(cp);
    m.start_range_shard("shard-3");
    let after = assigned(&m, &shards(4), &uids).await?;
    wait_served(&m, &after).await?;
    let spent = started.spent(cp);
    let range = started
        .finish(&m, spent, &reconciler, (&before, &after))
        .await;
    progress!("  range mode: {} moved in {:?}", range.moved, range.served);

    let mut out = lists(&m, &uids).await?;
    (out.objects, out.label, out.range) = (n, label, range);
    for shard in std::mem::take(&mut m.shards).into_values() {
        shard.crash();
    }
    reconciler.process.stop(Duration::from_secs(10));
    progress!("  deleting the namespace");
    m.setup.remove(true).await?;
    Ok(out)
}

/// The shard of each object of `uids` on the label ring of `names`.
fn by_ring(
    m: &Movers,
    names: &[String],
    uids: &HashMap<String, String>,
) -> HashMap<String, String> {
    let ring = Ring::new(names.iter().cloned());
    uids.keys()
        .filter_map(|name| {
            let shard = ring.shard_for(&m.setup.key(name))?;
            Some((name.clone(), shard.to_owned()))
        })
        .collect()
}

/// Where a move's measurement starts: the audit log, the time, the control plane's CPU.
struct Started {
    mark: AuditMark,
    start: Timestamp,
    cpu: f64,
    at: Instant,
}

impl Started {
    /// Starts measuring now.
    fn now(cp: &ControlPlane) -> Self {
        Self {
            mark: cp.audit_mark(),
            start: Timestamp::now(),
            cpu: control_plane_cpu(cp),
            at: Instant::now(),
        }
    }

    /// The time and the apiserver's and etcd's CPU seconds since the start.
    fn spent(&self, cp: &ControlPlane) -> (Duration, f64) {
        (self.at.elapsed(), control_plane_cpu(cp) - self.cpu)
    }

    /// The move from `before` to `after` that took `(served, cpu)`: its writes since the start
    /// and the reconciler's RSS now.
    async fn finish(
        self,
        m: &Movers,
        (served, cpu): (Duration, f64),
        reconciler: &Reconciler,
        (before, after): (&HashMap<String, String>, &HashMap<String, String>),
    ) -> Move {
        let (_, [by_reconciler, by_shards, _]) =
            m.writes(self.mark, self.start, &[RECONCILER, SHARDS]).await;
        Move {
            moved: moved(before, after),
            served,
            writes: [by_reconciler, by_shards],
            cpu,
            rss: rss(reconciler),
        }
    }
}

/// Objects whose shard differs between `before` and `after`.
fn moved(before: &HashMap<String, String>, after: &HashMap<String, String>) -> usize {
    after
        .iter()
        .filter(|(name, shard)| before.get(*name) != Some(shard))
        .count()
}

/// Waits until every object of `expected` was last reconciled by the shard it names; ends at
/// once with the reason when a bench shard stops (its Lease lost).
async fn wait_served(m: &Movers, expected: &HashMap<String, String>) -> Result<(), Error> {
    let off = || {
        let reconciled = m
            .reconciled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        expected
            .iter()
            .filter(|(name, shard)| reconciled.get(*name) != Some(shard))
            .count()
    };
    wait_none_off(&m.alarm, off).await
}

/// Waits until `off` counts no object off its shard, for at most [`MOVE_TIMEOUT`]; ends at once
/// with the reason when `alarm` is raised.
async fn wait_none_off(alarm: &Alarm, off: impl Fn() -> usize) -> Result<(), Error> {
    let deadline = Instant::now() + MOVE_TIMEOUT;
    loop {
        let off = off();
        if off == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Setup(format!(
                "{off} objects not reconciled by their shard after {MOVE_TIMEOUT:?}"
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            why = alarm.raised() => {
                return Err(Error::Setup(format!("{off} objects not reconciled by their shard: {why}")));
            }
        }
    }
}

/// Waits until shards `names` are each assigned ranges they serve, together the whole hash
/// space; the shard each object's uid falls to.
async fn assigned(
    m: &Movers,
    names: &[String],
    uids: &HashMap<String, String>,
) -> Result<HashMap<String, String>, Error> {
    let leases: Api<Lease> = Api::namespaced(m.setup.client.clone(), &m.setup.ns);
    let deadline = Instant::now() + MOVE_TIMEOUT;
    loop {
        let mut ranges = Vec::new();
        for name in names {
            let Some(lease) = leases.get_opt(name).await? else {
                break;
            };
            let assigned = valid_assignment(&lease);
            let selector = ShardSelector::new(RangeKey::Uid, assigned.iter().copied());
            let served = lease.annotations().get(SERVED_ANNOTATION);
            if assigned.is_empty() || served != Some(&selector.to_string()) {
                break;
            }
            ranges.push((name.clone(), selector, assigned));
        }
        let covered: u128 = ranges.iter().flat_map(|r| &r.2).map(|r| r.len()).sum();
        if ranges.len() == names.len() && covered == SPACE_END {
            return Ok(uids
                .iter()
                .filter_map(|(name, uid)| {
                    let hash = fnv1a64(uid.as_bytes());
                    let (shard, _, _) = ranges.iter().find(|r| r.1.contains(hash))?;
                    Some((name.clone(), shard.clone()))
                })
                .collect());
        }
        if Instant::now() > deadline {
            return Err(Error::Setup(format!(
                "shards {names:?} not serving the whole hash space after {MOVE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fourth shard's share listed by its label and by its selector, and every object, whole
/// objects 500 to a page as the SDK's watch lists them, interleaved [`LIST_ROUNDS`] times; then
/// what watches of that share by each cost ([`watch_cost`]).
async fn lists(m: &Movers, uids: &HashMap<String, String>) -> Result<Size, Error> {
    let leases: Api<Lease> = Api::namespaced(m.setup.client.clone(), &m.setup.ns);
    let lease = leases.get("shard-3").await?;
    let ranges = valid_assignment(&lease);
    let space = ranges.iter().map(|r| r.len() as f64).sum::<f64>() / SPACE_END as f64;
    let selector = ShardSelector::new(RangeKey::Uid, ranges);
    let text = selector.to_string();
    let client = &m.setup.client;
    let ranged = selecting_client(client, &selector, &[ApiResource::erase::<Secret>(&())]);
    let plain: Api<Secret> = Api::namespaced(client.clone(), &m.setup.ns);
    let ranged: Api<Secret> = Api::namespaced(ranged, &m.setup.ns);
    // The share's objects get a label of their own, so that both select the same objects.
    let share: Vec<&String> = uids
        .iter()
        .filter(|(_, uid)| selector.contains(fnv1a64(uid.as_bytes())))
        .map(|(name, _)| name)
        .collect();
    let patch = Patch::Merge(json!({"metadata": {"labels": {SHARE_LABEL: "shard-3"}}}));
    let params = PatchParams::default();
    futures::stream::iter(share)
        .map(|name| plain.patch_metadata(name, &params, &patch))
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let label = format!("{SHARE_LABEL}=shard-3");
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut items = [0; 3];
    for _ in 0..LIST_ROUNDS {
        for (i, (api, selector)) in [(&plain, Some(&label)), (&ranged, None), (&plain, None)]
            .into_iter()
            .enumerate()
        {
            let started = Instant::now();
            items[i] = list_all(api, selector.map(String::as_str)).await?;
            times[i].push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let [by_label, by_range, all] = [0, 1, 2].map(|i| List {
        items: items[i],
        ms: median(times[i].clone()),
    });
    let (watches, allocated) = watch_cost(m, uids, (&plain, &label), (&ranged, &selector)).await?;
    let (ns, cp) = (&m.setup.ns, m.cp);
    let mut caches: [Vec<(f64, f64)>; 2] = Default::default();
    for _ in 0..CACHE_ROUNDS {
        let kinds = [
            (label.as_str(), "-", items[0]),
            ("-", text.as_str(), items[1]),
        ];
        for (i, (labels, selector, n)) in kinds.into_iter().enumerate() {
            let mut cache = share_cache(cp, ns, n, labels, selector).await?;
            caches[i].push(settled_rss(cache.pid(), "share cache").await?);
            cache.kill();
        }
    }
    let caches = caches.map(|runs| {
        let now = median(runs.iter().map(|r| r.0).collect());
        let peak = median(runs.iter().map(|r| r.1).collect());
        (now, peak)
    });
    Ok(Size {
        space,
        watches,
        allocated,
        caches,
        terms: text.matches("shardRange(").count(),
        chars: text.len(),
        by_label,
        by_range,
        all,
        ..Size::default()
    })
}

/// Watches of the share open at once in [`watch_cost`], as many shards' watches would be.
const WATCHERS: usize = 16;

/// Objects of the share patched once in each run of [`watch_cost`].
const PATCHED: usize = 2000;

/// Runs of each kind in [`watch_cost`], interleaved.
const WATCH_ROUNDS: usize = 5;

/// What [`WATCHERS`] watches of the fourth shard's share cost the apiserver and etcd while
/// [`PATCHED`] objects of the share are patched (64 in flight), so each patch is an event of
/// every watch: CPU seconds from the first patch until every watch received each of its events,
/// with no watch, with watches by `label` on `plain`, and by `selector` through `ranged`, in
/// [`WATCH_ROUNDS`] interleaved rounds of one run each; and the MiB the apiserver allocated in
/// each run. Each run starts right after a garbage collection of the apiserver: with every
/// object in the apiserver's heap a collection is dear, and it would fall in some runs and not
/// others.
async fn watch_cost(
    m: &Movers,
    uids: &HashMap<String, String>,
    (plain, label): (&Api<Secret>, &str),
    (ranged, selector): (&Api<Secret>, &ShardSelector),
) -> Result<([Vec<f64>; 3], [Vec<f64>; 3]), Error> {
    let mut labelled = std::collections::HashSet::new();
    each_metadata(plain, Some(label), |o| {
        labelled.insert(o.name_any());
    })
    .await?;
    let mut names: Vec<&String> = labelled.iter().collect();
    names.sort_unstable();
    names.truncate(PATCHED);
    let in_range = names
        .iter()
        .filter(|n| selector.contains(fnv1a64(uids[**n].as_bytes())))
        .count();
    let by_label = names.iter().filter(|n| labelled.contains(**n)).count();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut allocated: [Vec<f64>; 3] = Default::default();
    for round in 0..WATCH_ROUNDS {
        for (kind, (api, labels, each)) in [
            (plain, None, 0),
            (plain, Some(label), by_label),
            (ranged, None, in_range),
        ]
        .into_iter()
        .enumerate()
        {
            let watchers = if kind == 0 { 0 } else { WATCHERS };
            let version = plain
                .list_metadata(&ListParams::default().limit(1))
                .await?
                .metadata
                .resource_version
                .unwrap_or_default();
            let received = Arc::new(AtomicUsize::new(0));
            let mut params = WatchParams::default();
            if let Some(labels) = labels {
                params = params.labels(labels);
            }
            let tag = format!("{round}-{kind}");
            let mut tasks = Vec::new();
            for _ in 0..watchers {
                let stream = api.watch(&params, &version).await?;
                let watching = Watching {
                    api: api.clone(),
                    params: params.clone(),
                    version: version.clone(),
                    tag: tag.clone(),
                    received: Arc::clone(&received),
                };
                tasks.push(tokio::spawn(watching.count(stream)));
            }
            m.collect_garbage().await?;
            let allocated_before = apiserver_allocated(&m.setup.client).await?;
            let started = control_plane_cpu(m.cp);
            let patch = Patch::Merge(json!({"metadata": {"labels": {WATCHED_LABEL: tag}}}));
            let params = PatchParams::default();
            futures::stream::iter(&names)
                .map(|name| plain.patch_metadata(name, &params, &patch))
                .buffer_unordered(64)
                .try_for_each(|_| async { Ok(()) })
                .await?;
            let expected = watchers * each;
            let deadline = Instant::now() + Duration::from_secs(120);
            while received.load(Ordering::Relaxed) < expected {
                if Instant::now() > deadline {
                    return Err(Error::Setup(format!(
                        "{} of {expected} watch events in 120 s",
                        received.load(Ordering::Relaxed)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cpu[kind].push(control_plane_cpu(m.cp) - started);
            let bytes = apiserver_allocated(&m.setup.client).await? - allocated_before;
            allocated[kind].push(bytes / (1024.0 * 1024.0));
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
    Ok((cpu, allocated))
}

/// The bytes the apiserver allocated since it started (`go_memstats_alloc_bytes_total`).
async fn apiserver_allocated(client: &kube::Client) -> Result<f64, Error> {
    let metrics = apiserver_metrics(client).await?;
    metric_value(&metrics, "go_memstats_alloc_bytes_total", &[]).ok_or_else(|| {
        Error::Setup("the apiserver's metrics have no go_memstats_alloc_bytes_total".into())
    })
}

/// The label [`watch_cost`]'s patches set, to a value of their run.
const WATCHED_LABEL: &str = "bench/watched";

/// One watch of [`watch_cost`]: counts the objects it saw patched in its run.
struct Watching {
    api: Api<Secret>,
    params: WatchParams,
    /// Where it resumes when the apiserver ends the watch.
    version: String,
    /// The value of [`WATCHED_LABEL`] in this run.
    tag: String,
    /// Objects each watch saw patched, together.
    received: Arc<AtomicUsize>,
}

impl Watching {
    /// Counts each object seen with this run's tag once, from `stream` and, when the apiserver
    /// ends it, from new watches resuming where it ended.
    async fn count(
        mut self,
        stream: impl futures::Stream<Item = kube::Result<WatchEvent<Secret>>> + Send,
    ) {
        let mut seen = std::collections::HashSet::new();
        let mut stream = stream.boxed();
        loop {
            while let Some(Ok(event)) = stream.next().await {
                let secret = match event {
                    WatchEvent::Modified(secret) => secret,
                    WatchEvent::Bookmark(b) => {
                        self.version = b.metadata.resource_version;
                        continue;
                    }
                    _ => continue,
                };
                self.version = secret.resource_version().unwrap_or_default();
                if secret.labels().get(WATCHED_LABEL) == Some(&self.tag)
                    && seen.insert(secret.name_any())
                {
                    self.received.fetch_add(1, Ordering::Relaxed);
                }
            }
            stream = loop {
                match self.api.watch(&self.params, &self.version).await {
                    Ok(stream) => break stream.boxed(),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
        }
    }
}

/// Lists every Secret of `api` that `labels` selects, 500 to a page; how many.
async fn list_all(api: &Api<Secret>, labels: Option<&str>) -> Result<usize, Error> {
    let mut params = ListParams::default().limit(500);
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    let mut count = 0;
    loop {
        let page = api.list(&params).await?;
        count += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(count),
        }
    }
}

impl Size {
    /// The CPU of the run with watches by selector over that with watches by label, the
    /// median of each round's own (the rounds are interleaved, so a slow spell of the machine
    /// weighs on both runs of its round).
    fn watch_ratio(&self) -> f64 {
        let [_, label, range] = &self.watches;
        median(range.iter().zip(label).map(|(r, l)| r / l).collect())
    }
}

/// Runs' CPU seconds as their median and range.
fn spread(runs: &[f64]) -> String {
    let (low, high) = runs
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
    format!("{:.2} ({low:.2}-{high:.2})", median(runs.to_vec()))
}

/// The section's text.
fn markdown(sizes: &[Size]) -> String {
    let mut out = format!(
        "At each size, Secrets of one ClusterRing on 3 shards of the shard SDK in this process (each records which objects it reconciles, with a no-op business reconcile, at most {SHARD_CONCURRENCY} at once), the reconciler as a process with section 4's flags. Label mode first: every object on its shard, a fourth shard starts and its share moves (drain, acknowledgement, the webhook's label). Then the shards and the reconciler stop, the ring gets `{RANGE_KEY_ANNOTATION}: uid`, a new reconciler and 3 range-mode shards start (the objects keep their stale labels: range mode reads none) and, once each shard serves its ranges, a fourth shard starts (the share of the hash space its ranges hold is in the second table: the ring of 16 tokens a shard divides the space unevenly, the uids fall in it evenly). Served: from the fourth shard's start until every object was last reconciled by the shard its new assignment names (label mode: the ring of 4; range mode: the Leases' ranges), seen from inside the shards. Writes: the reconciler's and the shards' writes to the objects, from the audit log (Lease writes are not audited). CPU: the apiserver's and etcd's over the move. The reconciler's RSS after the move (peak since its start in brackets). Then the fourth shard's share in range mode gets a label of its own (`{SHARE_LABEL}`), so that a label and the selector select the same objects, and is listed {LIST_ROUNDS} times, interleaved, whole objects 500 to a page as the SDK's watch lists: by that label (as a label-mode shard lists by its shard label), by the shard's `shardSelector`, and every object for scale; median milliseconds. Then the watch: {PATCHED} objects of the share patched once (64 in flight, each an event of every watch) with no watch open, with {WATCHERS} watches of the share by the label, and with {WATCHERS} by the selector; the apiserver's and etcd's CPU from the first patch until every watch received each of its events, {WATCH_ROUNDS} interleaved rounds of one run each (median, range in brackets; the patches' own cost is the run with no watch; the ratio is the median of each round's own). Each run starts right after a garbage collection the bench asks of the apiserver (`/debug/pprof/heap?gc=1`): with every object in its heap a collection is dear and would fall in some runs and not others, so the CPU leaves out collecting, and what each run leaves to collect is the apiserver's allocation beside it (`go_memstats_alloc_bytes_total`, median MiB). A shard's memory is its cache of its share: a process (`share-cache`) keeping a kube-rs reflector of the share's whole Secrets by the label, then one by the selector, RSS 2 s after it holds them all (peak in brackets), medians of {CACHE_ROUNDS} interleaved runs each.\n\n"
    );
    out += &table(
        "objects | mode | moved | moved vs ideal (n/4) | served after s | writes (reconciler + shards) | writes per moved object | apiserver + etcd CPU s | reconciler RSS MiB (peak)",
        sizes.iter().flat_map(|s| {
            let ideal = s.objects as f64 / 4.0;
            [("label", &s.label), ("range", &s.range)].map(|(mode, m)| {
                let writes = m.writes[0] + m.writes[1];
                format!(
                    "{} | {mode} | {} | {:.3} | {:.2} | {} + {} | {:.2} | {:.1} | {:.1} ({:.1})",
                    s.objects,
                    m.moved,
                    m.moved as f64 / ideal,
                    m.served.as_secs_f64(),
                    m.writes[0],
                    m.writes[1],
                    writes as f64 / m.moved.max(1) as f64,
                    m.cpu,
                    m.rss.0,
                    m.rss.1
                )
            })
        }),
    );
    out += &table(
        "objects | the fourth shard's ranges: share of the hash space | selector terms (characters) | by label: objects, ms | by selector: objects, ms | selector vs label, per object | every object: objects, ms | cache by label: RSS MiB (peak) | cache by selector: RSS MiB (peak)",
        sizes.iter().map(|s| {
            format!(
                "{} | {:.3} | {} ({}) | {}, {:.1} | {}, {:.1} | {:.2} | {}, {:.1} | {:.1} ({:.1}) | {:.1} ({:.1})",
                s.objects,
                s.space,
                s.terms,
                s.chars,
                s.by_label.items,
                s.by_label.ms,
                s.by_range.items,
                s.by_range.ms,
                s.by_range.per_object() / s.by_label.per_object(),
                s.all.items,
                s.all.ms,
                s.caches[0].0,
                s.caches[0].1,
                s.caches[1].0,
                s.caches[1].1
            )
        }),
    );
    out += &table(
        &format!(
            "objects | {PATCHED} patches, no watch: CPU s | with {WATCHERS} watches by label: CPU s | with {WATCHERS} watches by selector: CPU s | by selector vs by label | apiserver allocated MiB: no watch, by label, by selector"
        ),
        sizes.iter().map(|s| {
            let [none, label, range] = [0, 1, 2].map(|i| spread(&s.watches[i]));
            let [a, b, c] = [0, 1, 2].map(|i| median(s.allocated[i].clone()));
            format!(
                "{} | {none} | {label} | {range} | {:.2} | {a:.0}, {b:.0}, {c:.0}",
                s.objects,
                s.watch_ratio()
            )
        }),
    );
    let watch = sizes.iter().map(Size::watch_ratio).fold(0.0, f64::max);
    let cache = sizes
        .iter()
        .map(|s| s.caches[1].0 / s.caches[0].0)
        .fold(0.0, f64::max);
    let zero = sizes.iter().all(|s| s.range.writes == [0, 0]);
    let off = sizes
        .iter()
        .map(|s| (s.range.moved as f64 / (s.objects as f64 / 4.0) - 1.0).abs())
        .fold(0.0, f64::max);
    let faster = sizes.iter().all(|s| s.range.served < s.label.served);
    let cheaper = sizes.iter().all(|s| s.range.cpu < s.label.cpu);
    let list = sizes
        .iter()
        .map(|s| s.by_range.per_object() / s.by_label.per_object())
        .fold(0.0, f64::max);
    out + &goals(&[
        (
            "writes to the objects per range-mode move, every size".into(),
            if zero { "0" } else { "not 0 at some size" }.into(),
            "0",
            zero,
        ),
        (
            "range-mode objects moved, worst size off the ideal (n/4)".into(),
            format!("{:.1} %", 100.0 * off),
            "<= 10 %",
            off <= 0.1,
        ),
        (
            "range mode served sooner than label mode, every size".into(),
            if faster { "yes" } else { "not at some size" }.into(),
            "every size",
            faster,
        ),
        (
            "range mode's apiserver + etcd CPU below label mode's, every size".into(),
            if cheaper { "yes" } else { "not at some size" }.into(),
            "every size",
            cheaper,
        ),
        (
            "a shard's list by its selector vs by its label, per object listed, worst size".into(),
            format!("{list:.2}"),
            "<= 1.5",
            list <= 1.5,
        ),
        (
            "a shard's cache of its share by selector vs by label, RSS, worst size".into(),
            format!("{cache:.2}"),
            "<= 1.1",
            cache <= 1.1,
        ),
        (
            "CPU of patches with watches by selector vs by label (median of rounds), worst size"
                .into(),
            format!("{watch:.2}"),
            "<= 1.5",
            watch <= 1.5,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_for_the_shards_reconciles_ends_at_once_with_the_reason_of_a_raised_alarm() {
        let alarm = Alarm::default();
        let done = || 0;
        assert!(
            wait_none_off(&alarm, done).await.is_ok(),
            "nothing off: done"
        );
        alarm.raise("shard-3 stopped: lease lost".into());
        let waited = tokio::time::timeout(Duration::from_secs(5), wait_none_off(&alarm, || 7))
            .await
            .expect("ends at once, not at its timeout");
        let error = waited.expect_err("objects still off").to_string();
        assert!(
            error.contains("7 objects") && error.contains("shard-3 stopped: lease lost"),
            "{error}"
        );
    }

    /// A size whose range-mode move wrote `writes` (reconciler, shards).
    fn size(writes: [usize; 2]) -> Size {
        let label = Move {
            moved: 250,
            served: Duration::from_secs(10),
            writes: [250, 250],
            cpu: 10.0,
            rss: (20.0, 21.0),
        };
        Size {
            objects: 1000,
            range: Move {
                moved: 240,
                served: Duration::from_secs(1),
                writes,
                cpu: 1.0,
                ..label.clone()
            },
            label,
            by_label: List {
                items: 250,
                ms: 10.0,
            },
            by_range: List {
                items: 240,
                ms: 12.0,
            },
            watches: [vec![1.0], vec![2.0, 2.2, 1.8], vec![2.2, 2.0, 2.4]],
            ..Size::default()
        }
    }

    #[test]
    fn a_range_move_that_wrote_an_object_misses_the_zero_writes_goal() {
        let goal = "writes to the objects per range-mode move, every size";
        assert!(markdown(&[size([0, 0])]).contains(&format!("| {goal} | 0 | 0 | met |")));
        let text = markdown(&[size([0, 0]), size([0, 1])]);
        assert!(
            text.contains(&format!("| {goal} | not 0 at some size | 0 | **missed** |")),
            "{text}"
        );
    }

    #[test]
    fn lists_are_compared_per_object_and_watches_by_each_round_s_own_ratio() {
        let mut rounds = size([0, 0]);
        rounds.watches = [vec![0.5], vec![1.0, 2.0, 3.0], vec![1.3, 3.0, 2.0]];
        let text = markdown(&[rounds]);
        // 12 ms for 240 objects against 10 ms for 250.
        assert!(text.contains("| 250, 10.0 | 240, 12.0 | 1.25 |"), "{text}");
        // Rounds 1.3/1.0, 3.0/2.0, 2.0/3.0: the median of their ratios, not the medians' 1.00.
        assert!(
            text.contains("| 2.00 (1.00-3.00) | 2.00 (1.30-3.00) | 1.30 |"),
            "{text}"
        );
        assert!(text.contains("moved vs ideal (n/4)"), "{text}");
        assert!(text.contains("| 1000 | range | 240 | 0.960 |"), "{text}");
    }

    #[test]
    fn each_kind_of_watch_run_shows_the_median_of_what_the_apiserver_allocated() {
        let mut rounds = size([0, 0]);
        rounds.allocated = [vec![10.0], vec![30.0, 20.0, 40.0], vec![35.0, 25.0, 90.0]];
        let text = markdown(&[rounds]);
        assert!(text.contains("| 1.10 | 10, 30, 35 |"), "{text}");
    }
}
