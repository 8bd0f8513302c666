//! The chart's pods on a real node (`sharder_harness::node`): `helm install` of the chart with the
//! image built from this checkout until every pod is Ready, the example shards as the
//! StatefulSet of `docs/examples/statefulset-shards.yaml`, Secrets created through the webhook's
//! Service, then a scale-out 3 -> 4. Each container's memory as kubelet counts it (its cgroup's
//! working set, sampled every second) beside its process's resident set.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use sharder_common::Ring;
use sharder_harness::node::Node;
use sharder_harness::node::chart::{
    self, ContainerMemory, RELEASE, RELEASE_NAMESPACE, RING, SHARDS_NAMESPACE, STATEFULSET,
    Workload,
};
use sharder_harness::world::World;

use crate::{Error, RingSetup, each_metadata};

/// How long each step may take.
const TIMEOUT: Duration = Duration::from_secs(900);

/// One pod's memory, in KiB.
#[derive(Clone, Debug)]
pub struct PodRow {
    /// The pod.
    pub pod: String,
    /// What it runs: webhook, reconciler (leader or standby), shard.
    pub role: String,
    /// Working set once every object is on its shard (`None`: the pod came with the scale-out).
    pub steady: Option<u64>,
    /// Working set after the scale-out's moves.
    pub after_scale_out: u64,
    /// Highest working set sampled (every second, from the install on).
    pub peak: u64,
    /// The cgroup's own peak usage (page cache included), if the kernel keeps it.
    pub max_usage: Option<u64>,
    /// The process's resident set after the scale-out (`VmRSS`).
    pub rss: u64,
    /// Its anonymous part (`RssAnon`).
    pub rss_anon: u64,
    /// The process's peak resident set (`VmHWM`).
    pub hwm: u64,
}

/// What the section measured.
#[derive(Clone, Debug)]
pub struct NodeResult {
    /// Secrets created.
    pub objects: usize,
    /// From `helm install` to the webhook's and the reconciler's pods all Ready.
    pub install: Duration,
    /// From applying the example to its 3 shards Ready and in the ring.
    pub shards_ready: Duration,
    /// Creates per second through the webhook (64 in flight).
    pub create_rate: f64,
    /// Secrets that came back from their CREATE without a shard label.
    pub unassigned_at_create: usize,
    /// From the last create to every object with its checksums on its shard.
    pub converged: Duration,
    /// Objects the scale-out moved.
    pub moved: usize,
    /// From `kubectl scale` to every object on the shard of the 4-shard ring.
    pub scale_out: Duration,
    /// Every pod of the chart and of the example.
    pub pods: Vec<PodRow>,
}

/// Samples the working sets of every container in both namespaces, keeping each pod's highest.
struct Sampler {
    peaks: Arc<Mutex<BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(client: Client) -> Self {
        let peaks = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
        let into = peaks.clone();
        let task = tokio::spawn(async move {
            loop {
                for c in memory(&client).await.unwrap_or_default() {
                    let mut peaks = into.lock().unwrap_or_else(PoisonError::into_inner);
                    let peak = peaks.entry(c.pod).or_default();
                    *peak = (*peak).max(c.working_set);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Self { peaks, task }
    }

    fn stop(self) -> BTreeMap<String, u64> {
        self.task.abort();
        self.peaks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The memory of every container of the chart's and the example's pods.
async fn memory(client: &Client) -> Result<Vec<ContainerMemory>, Error> {
    let mut all = chart::pod_memory(client, RELEASE_NAMESPACE).await?;
    all.extend(chart::pod_memory(client, SHARDS_NAMESPACE).await?);
    Ok(all)
}

/// Polls `check` every 2 s until it succeeds, at most [`TIMEOUT`].
async fn until<F, Fut>(what: &str, mut check: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(()) => return Ok(()),
            Err(e) if started.elapsed() > TIMEOUT => {
                return Err(Error::Setup(format!("{what}: not after {TIMEOUT:?}: {e}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

fn ring_of(shards: usize) -> Ring {
    Ring::new((0..shards).map(|i| format!("{STATEFULSET}-{i}")))
}

/// Every Secret on the shard `ring` picks, not draining, with its checksums ConfigMap on the
/// same shard (metadata lists, paginated).
async fn converged(setup: &RingSetup, ring: &Ring) -> Result<(), String> {
    let secrets = setup.assignment().await.map_err(|e| e.to_string())?;
    let mut children = BTreeMap::new();
    let (shard, drain) = (&setup.labels.shard, &setup.labels.drain);
    each_metadata(&setup.configmaps(), Some(shard), |cm| {
        let labels = cm.labels();
        children.insert(
            cm.name_any(),
            (labels.get(shard).cloned(), labels.contains_key(drain)),
        );
    })
    .await
    .map_err(|e| e.to_string())?;
    let wrong = secrets
        .iter()
        .filter(|(name, on, draining)| {
            let child = children.get(&format!("checksums-{name}"));
            on.as_deref() != ring.shard_for(&setup.key(name))
                || *draining
                || child.is_none_or(|(child_on, child_draining)| child_on != on || *child_draining)
        })
        .count();
    (wrong == 0)
        .then_some(())
        .ok_or(format!("{wrong} of {} not settled", secrets.len()))
}

/// The pod holding the reconciler's leader election Lease.
async fn leader(client: &Client) -> Option<String> {
    let holder = Api::<Lease>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .get("sharder-reconciler")
        .await
        .ok()?
        .spec?
        .holder_identity?;
    Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .map(|p| p.name_any())
        .find(|pod| holder == *pod || holder.starts_with(&format!("{pod}-")))
}

/// Runs the section with `objects` Secrets; the node is left idle (shards scaled to 0, the chart
/// uninstalled) for the sections after it.
pub async fn run(objects: usize) -> Result<NodeResult, Error> {
    let node = Node::shared().await?;
    let cp = node.control_plane();
    let client = cp.client().await?;

    let install = node.install_chart(&chart::ring_values(), TIMEOUT).await?;
    eprintln!("[bench]   helm install to all pods Ready: {install:.1?}");
    let sampler = Sampler::start(client.clone());
    let applying = Instant::now();
    node.apply_example(3, &[])?;
    node.wait_ready(
        Workload::StatefulSet,
        STATEFULSET,
        SHARDS_NAMESPACE,
        Some(3),
        TIMEOUT,
    )
    .await?;
    let setup = RingSetup(World::with_ring(cp, SHARDS_NAMESPACE.into(), RING.into()).await);
    until("the ring holds the 3 shards", || async {
        let ring = setup.desired_ring().await;
        (ring.shards() == ring_of(3).shards())
            .then_some(())
            .ok_or(format!("{:?}", ring.shards()))
    })
    .await?;
    let shards_ready = applying.elapsed();

    let (create_rate, unassigned_at_create) = setup.create(0..objects, None).await?;
    let created = Instant::now();
    eprintln!("[bench]   {objects} objects created through the webhook ({create_rate:.0}/s)");
    let three = ring_of(3);
    until("every object with its checksums on its shard", || {
        converged(&setup, &three)
    })
    .await?;
    let converged_after = created.elapsed();
    let steady = memory(&client).await?;

    let before = setup.assignment().await?;
    let scaling = Instant::now();
    node.scale_example(4)?;
    let four = ring_of(4);
    until("rebalanced onto the fourth shard", || {
        converged(&setup, &four)
    })
    .await?;
    let scale_out = scaling.elapsed();
    let after: BTreeMap<String, Option<String>> = setup
        .assignment()
        .await?
        .into_iter()
        .map(|(name, shard, _)| (name, shard))
        .collect();
    let moved = before
        .iter()
        .filter(|(name, shard, _)| after.get(name) != Some(shard))
        .count();
    let now = memory(&client).await?;
    let peaks = sampler.stop();
    let leading = leader(&client).await;

    let mut pods = Vec::new();
    for c in now {
        let role = if c.pod.starts_with(STATEFULSET) {
            "shard".to_owned()
        } else if c.pod.starts_with(&format!("{RELEASE}-reconciler")) {
            if leading.as_deref() == Some(c.pod.as_str()) {
                "reconciler (leader)".to_owned()
            } else {
                "reconciler (standby)".to_owned()
            }
        } else {
            "webhook".to_owned()
        };
        pods.push(PodRow {
            steady: steady
                .iter()
                .find(|s| s.pod == c.pod)
                .map(|s| s.working_set),
            after_scale_out: c.working_set,
            peak: peaks.get(&c.pod).copied().unwrap_or(c.working_set),
            max_usage: c.max_usage,
            rss: c.rss,
            rss_anon: c.rss_anon,
            hwm: c.hwm,
            role,
            pod: c.pod,
        });
    }
    pods.sort_by(|a, b| (&a.role, &a.pod).cmp(&(&b.role, &b.pod)));

    // Leave the node idle for the sections after this one.
    node.scale_example(0)?;
    sharder_harness::helm::Helm::get()?
        .run(&[
            "uninstall",
            "--name",
            RELEASE,
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            &cp.kubeconfig().to_string_lossy(),
        ])
        .map_err(|e| Error::Setup(format!("helm uninstall: {e}")))?;

    Ok(NodeResult {
        objects,
        install,
        shards_ready,
        create_rate,
        unassigned_at_create,
        converged: converged_after,
        moved,
        scale_out,
        pods,
    })
}
