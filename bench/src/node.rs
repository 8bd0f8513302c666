//! The chart's pods on a real node (`sharder_harness::node`): `helm install` of the chart with the
//! image built from this checkout until every pod is Ready, the example shards as the
//! StatefulSet of `docs/examples/statefulset-shards.yaml`, Secrets created through the webhook's
//! Service, then a scale-out 3 -> 4. Each container's memory as kubelet counts it (its cgroup's
//! working set, sampled every second) beside its process's resident set.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::{Client, ResourceExt};
use sharder_common::{Ring, RingKind};
use sharder_harness::node::Node;
use sharder_harness::node::chart::{
    self, ContainerMemory, RELEASE, RELEASE_NAMESPACE, RING, SHARDS_NAMESPACE, STATEFULSET,
    Workload,
};
use sharder_harness::world::World;

use crate::progress::progress;
use crate::report::table;
use crate::stats::mib;
use crate::{Error, RingSetup, each_metadata};

/// How long each step may take.
const TIMEOUT: Duration = Duration::from_secs(900);

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

/// Runs the section with `objects` Secrets; the node is left idle (shards scaled to 0, the chart
/// uninstalled) for the sections after it. The section's text.
pub(crate) async fn run(objects: usize) -> Result<String, Error> {
    let node = Node::shared().await?;
    let cp = node.control_plane();
    let client = cp.client().await?;
    let install = node.install_chart(&chart::ring_values(), TIMEOUT).await?;
    progress!("  helm install to all pods Ready: {install:.1?}");
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
    let world = World::with_ring(cp, SHARDS_NAMESPACE.into(), RING.into()).await;
    let setup = RingSetup(world.with_kind(RingKind::ControllerRing));
    until("the ring holds the 3 shards", || async {
        let ring = setup.desired_ring().await;
        (ring.shards() == ring_of(3).shards())
            .then_some(())
            .ok_or(format!("{:?}", ring.shards()))
    })
    .await?;
    let shards_ready = applying.elapsed();
    let (create_rate, unassigned) = setup.create(0..objects, None).await?;
    if unassigned > 0 {
        let failed = cp.failed_webhook_calls().join("\n");
        progress!("  {unassigned} created unassigned; failed webhook calls:\n{failed}");
    }
    let created = Instant::now();
    let (three, four) = (ring_of(3), ring_of(4));
    until("every object with its checksums on its shard", || {
        converged(&setup, &three)
    })
    .await?;
    let settled_after = created.elapsed();
    let steady = memory(&client).await?;
    let before = setup.assignment().await?;
    let scaling = Instant::now();
    node.scale_example(4)?;
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
    let mut now = memory(&client).await?;
    let peaks = sampler.stop();
    let leading = chart::leader(&client).await.ok();
    let role = |pod: &str| match pod {
        _ if pod.starts_with(STATEFULSET) => "shard",
        _ if leading.as_deref() == Some(pod) => "reconciler (leader)",
        _ if pod.starts_with(&format!("{RELEASE}-reconciler")) => "reconciler (standby)",
        _ => "webhook",
    };
    now.sort_by(|a, b| (role(&a.pod), &a.pod).cmp(&(role(&b.pod), &b.pod)));
    let pods = now.iter().map(|c| {
        let settled = steady
            .iter()
            .find(|s| s.pod == c.pod)
            .map_or("-".to_owned(), |s| format!("{:.1}", mib(s.working_set)));
        let peak = peaks.get(&c.pod).copied().unwrap_or(c.working_set);
        let usage = c
            .max_usage
            .map_or("-".to_owned(), |m| format!("{:.1}", mib(m)));
        format!(
            "{} | {} | {settled} | {:.1} | {:.1} | {usage} | {:.1} ({:.1}) | {:.1}",
            c.pod,
            role(&c.pod),
            mib(c.working_set),
            mib(peak),
            mib(c.rss),
            mib(c.rss_anon),
            mib(c.hwm)
        )
    });
    let pods = table(
        "pod | runs | working set, settled MiB | working set, after scale-out MiB | working set, peak sampled MiB | cgroup peak usage MiB | process RSS (anonymous) MiB | process peak RSS MiB",
        pods.collect::<Vec<_>>(),
    );

    // Leave the node idle for the sections after this one.
    node.scale_example(0)?;
    let kubeconfig = cp.kubeconfig().to_string_lossy().into_owned();
    sharder_harness::helm::Helm::get()?
        .run(&[
            "uninstall",
            "--name",
            RELEASE,
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
        ])
        .map_err(|e| Error::Setup(format!("helm uninstall: {e}")))?;

    let steps = [
        format!(
            "`helm install` to all 4 pods Ready | {:.1} s",
            install.as_secs_f64()
        ),
        format!(
            "the example applied to its 3 shards Ready and in the ring | {:.1} s",
            shards_ready.as_secs_f64()
        ),
        format!(
            "creates through the webhook | {create_rate:.0}/s, {unassigned} of {objects} without a shard label after CREATE"
        ),
        format!(
            "last create to every object with its checksums on its shard | {:.1} s",
            settled_after.as_secs_f64()
        ),
        format!(
            "scale-out 3 -> 4 to every object on its shard | {:.1} s, {moved} objects moved",
            scale_out.as_secs_f64()
        ),
    ];
    Ok(format!(
        "The chart installed with Helm as the README says (2 webhook and 2 reconciler pods, the image built from this checkout's {} binaries) on a single-node cluster of this machine (`sharder_harness::node`: kubelet, containerd, kube-proxy, kube-scheduler, its own apiserver and etcd); the example shards as the StatefulSet of `docs/examples/statefulset-shards.yaml` (3 replicas); {objects} Secrets created through the webhook's Service (64 in flight), each with its checksums ConfigMap made by its shard; then `kubectl scale --replicas=4`. Working set: the container's memory cgroup usage minus its inactive file pages (what kubelet reports and evicts by), once every object is on its shard, after the scale-out, and the highest sampled every second from the install on; beside it the container's process as `/proc` counts it (VmRSS after the scale-out with its anonymous part RssAnon, peak VmHWM). The process figures include the binary's file pages (RSS minus RssAnon); the container's cgroup is not charged for them (they entered the page cache when containerd unpacked the image), so its working set is close to the anonymous part.\n\n{}{pods}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        table("step | measured", steps)
    ))
}
