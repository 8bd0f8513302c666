//! Section 3b, chains at scale: a ring of Secrets controlling ConfigMaps and Pods, each Secret
//! with one ConfigMap controlling [`PODS_PER_CHAIN`] Pods (a Deployment's ReplicaSet's Pods in
//! shape; the Pods stay Pending, no node runs them), every object already on its Secret's shard
//! of 3. For each size a reconciler process runs through its first full rebalance and a
//! scale-out to 4 shards whose drains the bench acknowledges as the shards would (the webhook
//! assigns each Secret at that write) until every level is with the level above it: the
//! reconciler's peak RSS, the scale-out's time and writes (audit log) and its owner reads (the
//! apiserver's GETs of ConfigMaps and Secrets, which nothing else reads meanwhile). Small sizes
//! run as often as section 3's ([`runs`]), the run with the median peak shown.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sharder_common::{Ring, RingKind};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::{ADMIN_USER, audited_write};
use sharder_harness::fixtures::pause_pod_spec;
use sharder_harness::wait::{apiserver_metrics, metric_sum};

use crate::memory::{GOAL_OBJECTS, runs, settled_rss};
use crate::progress::{self, progress};
use crate::report::{goals, table};
use crate::webhooks::Webhooks;
use crate::{Args, Error, REBALANCE_CONCURRENCY, RingSetup, delete_if_there, each_metadata};

/// Pods under each ConfigMap.
pub(crate) const PODS_PER_CHAIN: usize = 10;

/// The longest a scale-out may take before the section gives up.
const SCALE_OUT_LIMIT: Duration = Duration::from_secs(1200);

/// One run's figures: Pods, then the reconciler's steady and peak RSS (MiB), every run's peak at
/// that size, the scale-out's seconds (the shard's Lease created to the last move's answer), its
/// reconciler writes, the objects that moved, and the owner reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pods: usize,
    steady: f64,
    peak: f64,
    peaks: Vec<f64>,
    seconds: f64,
    writes: usize,
    moved: usize,
    owner_reads: f64,
}

/// Section 3b's figures, size by size.
#[derive(Default)]
struct Chains {
    rows: Vec<Row>,
}

fn owner(kind: &str, object: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: object.name.clone().unwrap_or_default(),
        uid: object.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

impl Chains {
    /// Measures `pods` Pods in chains in a namespace of their own, deleted after (waited for:
    /// the sections after it must not share the apiserver with the deletion).
    async fn size(
        cp: &'static ControlPlane,
        webhooks: &Webhooks,
        pods: usize,
    ) -> Result<Row, Error> {
        let chains = pods.div_ceil(PODS_PER_CHAIN);
        let kind = RingKind::ControllerRing;
        let setup = RingSetup::of_kind(cp, &format!("bench-chains-{pods}"), true, 3, kind).await?;
        let spec = json!({"spec": {"resources": [{"group": "", "resource": "secrets",
            "controlledResources": [{"group": "", "resource": "configmaps"}, {"group": "", "resource": "pods"}]}]}});
        setup
            .rings()
            .patch(&setup.ring, &PatchParams::default(), &Patch::Merge(&spec))
            .await?;
        let mut account = ServiceAccount::default();
        account.metadata.name = Some("default".into());
        Api::<ServiceAccount>::namespaced(setup.client.clone(), &setup.ns)
            .create(&PostParams::default(), &account)
            .await?;
        let three = Ring::new((0..3).map(|i| format!("shard-{i}")));
        progress!("  {pods} Pods in {chains} chains: creating them");
        let created = create_chains(&setup, chains, &three).await?;
        let total = chains * (2 + PODS_PER_CHAIN);
        progress!("  {total} objects created ({created:.0}/s)");

        // The reconciler as a ServiceAccount of its own, so the audit log tells its writes
        // from the bench's acknowledgements (the admin's, which the label guard lets through).
        let account = "bench-reconciler";
        let token = cp.cluster_admin_token(&setup.ns, account).await?;
        let kubeconfig = cp.write_kubeconfig(&format!("{account}-{}", setup.ns), &token)?;
        let reconciler_user = format!("system:serviceaccount:{}:{account}", setup.ns);
        let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
        let flags = format!(
            "--max-writes-per-second 0 --max-concurrent-writes {REBALANCE_CONCURRENCY} --drain-check-interval 500ms --resync-interval 1h --sweep-interval 1h --label-guard-acknowledgers {ADMIN_USER}"
        );
        let mut reconciler = setup
            .start_reconciler(dir.path(), &kubeconfig, webhooks, &flags, total)
            .await?;
        let pid = reconciler.process.pid();
        let (steady, _) = settled_rss(pid, "reconciler").await?;

        let four = Ring::new((0..4).map(|i| format!("shard-{i}")));
        let reads_before = owner_reads(&setup.client).await?;
        let mark = cp.audit_mark();
        let start = Timestamp::now();
        setup.add_shard_lease("shard-3", 3600).await;
        let (started, mut said) = (Instant::now(), Instant::now());
        loop {
            acknowledge(&setup).await?;
            let off = off_place(&setup, &four).await?;
            if off == 0 {
                break;
            }
            if started.elapsed() > SCALE_OUT_LIMIT {
                reconciler.process.kill();
                return Err(Error::Setup(format!(
                    "{off} objects of {} still off their chain's shard after {SCALE_OUT_LIMIT:?}",
                    setup.ns
                )));
            }
            if said.elapsed() >= Duration::from_secs(10) {
                said = Instant::now();
                progress!("  {off} of {total} objects not with their chain yet");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let owner_reads = owner_reads(&setup.client).await? - reads_before;
        let (_, peak) = settled_rss(pid, "reconciler").await?;
        reconciler.process.kill();

        let mut moved: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut last_answered = start;
        for event in cp.audited_writes_since(mark) {
            if let Some((resource, name)) = audited_write(&event, &setup.ns, &reconciler_user) {
                *moved
                    .entry((resource.to_owned(), name.to_owned()))
                    .or_default() += 1;
                if let Some(at) = event["stageTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                {
                    last_answered = last_answered.max(at);
                }
            }
        }
        let row = Row {
            pods,
            steady,
            peak,
            peaks: vec![peak],
            seconds: last_answered.duration_since(start).as_secs_f64(),
            writes: moved.values().sum(),
            moved: moved.len(),
            owner_reads,
        };
        progress!("  {pods} Pods: {row:?}");
        // The apiserver deletes a collection one object at a time: the Pods go first, 64
        // deletes in flight, then the namespace with the rest.
        delete_pods(&setup, chains).await?;
        setup.remove(true).await?;
        Ok(row)
    }

    /// Measures `pods` Pods in chains [`runs`] times; keeps the run with the median peak, every
    /// run's peak beside it.
    async fn runs(
        &mut self,
        cp: &'static ControlPlane,
        webhooks: &Webhooks,
        pods: usize,
    ) -> Result<(), Error> {
        let mut rows = Vec::new();
        for run in 0..runs(pods) {
            progress!("  {pods} Pods: run {} of {}", run + 1, runs(pods));
            rows.push(Self::size(cp, webhooks, pods).await?);
        }
        self.rows.push(median_peak(rows));
        Ok(())
    }

    /// The section's text of the sizes measured.
    pub(crate) fn text(&self) -> String {
        let mut out = format!(
            "For each size: a ring (a ControllerRing) of Secrets controlling ConfigMaps and Pods in a namespace of its own, each Secret with one ConfigMap controlling {PODS_PER_CHAIN} Pods (the shape of a Deployment, its ReplicaSet and its Pods; Pods Pending, no node), every object already on its Secret's shard of 3 Leases; a reconciler process (`MALLOC_ARENA_MAX` as the chart sets, writes unlimited in rate, {REBALANCE_CONCURRENCY} in flight) through its first full rebalance, then a fourth shard Lease: the bench acknowledges each drained Secret as its shard would (the sharder webhook assigns it at that write) until every ConfigMap is on its Secret's shard and every Pod on its ConfigMap's. Seconds: from the Lease's creation to the apiserver's answer to the reconciler's last write (audit log); owner reads: the apiserver's GETs of ConfigMaps and Secrets meanwhile (`apiserver_request_total`; nothing else reads them); RSS from `/proc/<pid>/status`. {} such runs one after another below {GOAL_OBJECTS} Pods (each in a namespace of its own, created anew), {} from there on, the run with the median peak shown, every run's peak beside it.\n\n",
            runs(0),
            runs(GOAL_OBJECTS)
        );
        out += &table(
            "Pods | objects | reconciler steady MiB | reconciler peak MiB | every run's peak MiB | scale-out s | objects moved | reconciler writes | owner reads | owner reads per object moved",
            self.rows.iter().map(|r| {
                let objects = r.pods.div_ceil(PODS_PER_CHAIN) * (2 + PODS_PER_CHAIN);
                let peaks: Vec<String> = r.peaks.iter().map(|p| format!("{p:.1}")).collect();
                format!(
                    "{} | {objects} | {:.1} | {:.1} | {} | {:.1} | {} | {} | {:.0} | {:.2}",
                    r.pods,
                    r.steady,
                    r.peak,
                    peaks.join(", "),
                    r.seconds,
                    r.moved,
                    r.writes,
                    r.owner_reads,
                    r.owner_reads / r.moved.max(1) as f64
                )
            }),
        );
        out + &chain_goals(&self.rows)
    }
}

/// Section 3b at every size of `args.chain_sizes`, smallest first.
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<String, Error> {
    let mut sizes = args.chain_sizes.clone();
    sizes.sort_unstable();
    let mut chains = Chains::default();
    for pods in sizes {
        chains.runs(cp, webhooks, pods).await?;
    }
    Ok(chains.text())
}

/// The run of `rows` (one size's) with the median peak, carrying every run's peak in run order.
fn median_peak(mut rows: Vec<Row>) -> Row {
    let peaks: Vec<f64> = rows.iter().map(|r| r.peak).collect();
    rows.sort_by(|a, b| a.peak.total_cmp(&b.peak));
    let mut row = rows.swap_remove(rows.len() / 2);
    row.peaks = peaks;
    row
}

/// The goal: the peak at the largest size against the smallest's (memory flat in the number of
/// Pods).
fn chain_goals(rows: &[Row]) -> String {
    let (Some(small), Some(large)) = (rows.first(), rows.last()) else {
        return String::new();
    };
    if small.pods == large.pods {
        return String::new();
    }
    let ratio = large.peak / small.peak;
    goals(&[(
        format!(
            "reconciler peak RSS with {} Pods in chains against {}",
            large.pods, small.pods
        ),
        format!(
            "{:.1} MiB vs {:.1} MiB = {ratio:.2}x",
            large.peak, small.peak
        ),
        "<= 1.1x",
        ratio <= 1.1,
    )])
}

/// Creates `chains` chains (Secret, ConfigMap, Pods `app-<i>`, `app-<i>-<j>`), each object
/// labelled with its Secret's shard on `ring`, 8 chains in flight; objects created per second.
async fn create_chains(setup: &RingSetup, chains: usize, ring: &Ring) -> Result<f64, Error> {
    let started = Instant::now();
    let (secrets, configmaps) = (setup.secrets(), setup.configmaps());
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), &setup.ns);
    let label = &setup.labels.shard;
    let mut counter = progress::Counter::new(format!("chains created in {}", setup.ns), chains);
    futures::stream::iter(0..chains)
        .map(|i| {
            let name = format!("app-{i}");
            let shard = ring.shard_for(&setup.key(&name)).unwrap_or_default();
            let meta = |name: String, owner: Option<OwnerReference>| ObjectMeta {
                name: Some(name),
                labels: Some([(label.clone(), shard.to_owned())].into()),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            };
            let (secrets, configmaps, pods) = (&secrets, &configmaps, &pods);
            async move {
                let pp = &PostParams::default();
                let secret = Secret {
                    metadata: meta(name.clone(), None),
                    ..Secret::default()
                };
                let secret = secrets.create(pp, &secret).await?;
                let configmap = ConfigMap {
                    metadata: meta(name.clone(), Some(owner("Secret", &secret.metadata))),
                    ..ConfigMap::default()
                };
                let configmap = configmaps.create(pp, &configmap).await?;
                futures::stream::iter(0..PODS_PER_CHAIN)
                    .map(|j| {
                        let pod = Pod {
                            metadata: meta(
                                format!("{name}-{j}"),
                                Some(owner("ConfigMap", &configmap.metadata)),
                            ),
                            spec: Some(pause_pod_spec()),
                            ..Pod::default()
                        };
                        async move { pods.create(pp, &pod).await.map(drop) }
                    })
                    .buffer_unordered(PODS_PER_CHAIN)
                    .try_collect::<Vec<()>>()
                    .await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(8)
        .try_for_each(|()| {
            counter.add(1);
            async { Ok(()) }
        })
        .await?;
    Ok((chains * (2 + PODS_PER_CHAIN)) as f64 / started.elapsed().as_secs_f64())
}

/// Deletes the Pods of `chains` chains, 64 deletes in flight.
async fn delete_pods(setup: &RingSetup, chains: usize) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), &setup.ns);
    let names = (0..chains).flat_map(|i| (0..PODS_PER_CHAIN).map(move |j| format!("app-{i}-{j}")));
    futures::stream::iter(names)
        .map(|name| {
            let pods = &pods;
            async move { delete_if_there(pods, &name).await }
        })
        .buffer_unordered(64)
        .try_for_each(|()| async { Ok(()) })
        .await
}

/// Acknowledges every drained Secret as its shard would: both labels removed in one write with
/// the object's resourceVersion, 64 in flight (a conflict is left to the next round).
async fn acknowledge(setup: &RingSetup) -> Result<(), Error> {
    let mut draining = Vec::new();
    each_metadata(&setup.secrets(), Some(&setup.labels.drain), |o| {
        draining.push((o.name_any(), o.resource_version().unwrap_or_default()));
    })
    .await?;
    let (api, params) = (setup.secrets(), PatchParams::default());
    let (shard, drain) = (setup.labels.shard.as_str(), setup.labels.drain.as_str());
    futures::stream::iter(&draining)
        .map(|(name, version)| {
            let patch = Patch::Merge(json!({"metadata": {
                "resourceVersion": version,
                "labels": {shard: null, drain: null},
            }}));
            let (api, params) = (&api, &params);
            async move { api.patch_metadata(name, params, &patch).await.map(drop) }
        })
        .buffer_unordered(64)
        .for_each(|_| async {})
        .await;
    Ok(())
}

/// How many objects of the chains are not on their Secret's shard on `ring`, or draining.
async fn off_place(setup: &RingSetup, ring: &Ring) -> Result<usize, Error> {
    let mut off = 0;
    let shard = &setup.labels.shard;
    let drain = &setup.labels.drain;
    let mut count = |name: &str, labels: &BTreeMap<String, String>| {
        // `app-<i>` for a Secret and its ConfigMap, `app-<i>-<j>` for its Pods.
        let chain = match name.rsplit_once('-') {
            Some((head, _)) if head.contains('-') => head,
            _ => name,
        };
        let want = ring.shard_for(&setup.key(chain));
        if labels.get(shard).map(String::as_str) != want || labels.contains_key(drain) {
            off += 1;
        }
    };
    each_metadata(&setup.secrets(), None, |o| count(&o.name_any(), o.labels())).await?;
    each_metadata(&setup.configmaps(), None, |o| {
        count(&o.name_any(), o.labels())
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), &setup.ns);
    each_metadata(&pods, None, |o| count(&o.name_any(), o.labels())).await?;
    Ok(off)
}

/// The GETs of ConfigMaps and Secrets the apiserver answered so far.
async fn owner_reads(client: &Client) -> Result<f64, Error> {
    let metrics = apiserver_metrics(client).await?;
    let get = |resource| {
        metric_sum(
            &metrics,
            "apiserver_request_total",
            &[("resource", resource), ("verb", "GET")],
        )
    };
    Ok(get("configmaps") + get("secrets"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pods: usize, peak: f64) -> Row {
        Row {
            pods,
            steady: 15.0,
            peak,
            peaks: vec![peak],
            seconds: 10.0,
            writes: 100,
            moved: 90,
            owner_reads: 180.0,
        }
    }

    #[test]
    fn the_chain_goal_holds_the_peak_at_the_largest_size_against_the_smallest() {
        let met = chain_goals(&[row(10_000, 18.0), row(100_000, 19.5)]);
        assert!(met.contains("| reconciler peak RSS with 100000 Pods in chains against 10000 | 19.5 MiB vs 18.0 MiB = 1.08x | <= 1.1x | met |"), "{met}");
        let missed = chain_goals(&[row(10_000, 18.0), row(100_000, 20.0)]);
        assert!(
            missed.contains("1.11x | <= 1.1x | **missed** |"),
            "{missed}"
        );
        assert_eq!(
            chain_goals(&[row(10_000, 18.0)]),
            "",
            "one size has no goal"
        );
    }

    #[test]
    fn a_size_run_three_times_shows_its_median_peak_run_and_every_peak() {
        let mut runs = [26.7, 24.4, 25.0].map(|peak| row(10_000, peak));
        runs[2].seconds = 4.2;
        let kept = median_peak(runs.to_vec());
        assert_eq!(
            (kept.peak, kept.seconds),
            (25.0, 4.2),
            "the median run, whole"
        );
        assert_eq!(kept.peaks, [26.7, 24.4, 25.0]);
        let text = Chains {
            rows: vec![kept, row(100_000, 27.2)],
        }
        .text();
        assert!(text.contains("| 25.0 | 26.7, 24.4, 25.0 | 4.2 |"), "{text}");
        assert!(text.contains("27.2 MiB vs 25.0 MiB = 1.09x"), "{text}");
    }
}
