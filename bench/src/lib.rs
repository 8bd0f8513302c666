//! The benchmark command (`make bench`): on the local control plane, measures side by side in
//! one run the CREATE latency the webhook adds (against no webhook and a floor webhook), the
//! webhook alone under load, the reconciler's memory against object count (against a
//! metadata-cache baseline), the cost of rebalancing, of shard crashes and of rolling updates,
//! the ring's lookup cost and balance, the chart's pods on a real node, what a quiet ring
//! costs the control plane, and range mode beside label mode; then writes a markdown report
//! (`docs/benchmarks.md`).
//!
//! Numbers are printed and written, never asserted: the goals are stated beside them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::{Api, ResourceExt};
use sharder_common::{Ring, RingKind};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::RING_NAMESPACE_LABEL;
use sharder_harness::fixtures::{ring_object, secrets_ring};
use sharder_harness::launch::{Env, Reconciler, ReconcilerFlags};
use sharder_harness::world::World;

use crate::progress::progress;

mod beside;
mod chains;
mod create_latency;
pub mod floor;
mod guard;
mod idle;
mod load;
mod memory;
mod node;
mod progress;
mod ranges;
mod rebalance;
mod report;
mod ring_balance;
mod rolling;
mod stats;
mod tracker;
mod webhooks;
mod writes;

/// `--max-concurrent-writes` of the reconciler in the moving benchmarks (four times its default
/// of 32), and the concurrency of the raw PATCHes they are compared with. The memory section and
/// the section beside the reference run the reconciler at its default.
pub const REBALANCE_CONCURRENCY: usize = 128;

/// Flags of the benchmark command.
#[derive(clap::Parser, Clone, Debug)]
#[command(name = "sharder-bench", about)]
pub struct Args {
    /// Where to write the markdown report.
    #[arg(
        long,
        env = "SHARDER_BENCH_OUTPUT",
        default_value = "docs/benchmarks.md"
    )]
    pub output: PathBuf,

    /// Creates per round of the CREATE latency benchmark.
    #[arg(long, env = "SHARDER_BENCH_CREATES", default_value_t = 500)]
    pub creates: usize,

    /// Creates per second in the CREATE latency benchmark.
    #[arg(long, env = "SHARDER_BENCH_RATE", default_value_t = 150.0)]
    pub rate: f64,

    /// Rounds of each mode in the CREATE latency benchmark.
    #[arg(long, env = "SHARDER_BENCH_ROUNDS", default_value_t = 4)]
    pub rounds: usize,

    /// Object counts of the memory benchmark, comma-separated (`make bench-scale` runs the
    /// larger ones).
    #[arg(
        long,
        env = "SHARDER_BENCH_SIZES",
        value_delimiter = ',',
        default_value = "1000,10000,100000"
    )]
    pub sizes: Vec<usize>,

    /// Pods of the chains section (in chains of a Secret, a ConfigMap and 10 Pods),
    /// comma-separated.
    #[arg(
        long,
        env = "SHARDER_BENCH_CHAIN_SIZES",
        value_delimiter = ',',
        default_value = "10000,100000"
    )]
    pub chain_sizes: Vec<usize>,

    /// Objects of the rebalancing, crash and rolling update benchmarks.
    #[arg(
        long,
        env = "SHARDER_BENCH_REBALANCE_OBJECTS",
        default_value_t = 10_000
    )]
    pub rebalance_objects: usize,

    /// Scale-out rounds of the rebalancing benchmark (each with its raw PATCH baseline), after
    /// one that warms the apiserver up.
    #[arg(long, env = "SHARDER_BENCH_REBALANCE_ROUNDS", default_value_t = 5)]
    pub rebalance_rounds: usize,

    /// Shard crashes after the rebalancing rounds (each a fresh shard that joins, takes its
    /// share and stops without releasing its Lease).
    #[arg(long, env = "SHARDER_BENCH_CRASHES", default_value_t = 3)]
    pub crashes: usize,

    /// Shard Lease duration of the moving benchmarks, in seconds (renewed every second).
    #[arg(long, env = "SHARDER_BENCH_LEASE_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..))]
    pub lease_seconds: u64,

    /// Secrets of the real node section (created through the chart's webhook, then moved by a
    /// scale-out of the example shards).
    #[arg(long, env = "SHARDER_BENCH_NODE_OBJECTS", default_value_t = 10_000)]
    pub node_objects: usize,

    /// Object counts of the idle cost section, comma-separated.
    #[arg(
        long,
        env = "SHARDER_BENCH_IDLE_SIZES",
        value_delimiter = ',',
        default_value = "10000,100000"
    )]
    pub idle_sizes: Vec<usize>,

    /// Seconds of each window of the idle cost section.
    #[arg(long, env = "SHARDER_BENCH_IDLE_WINDOW_SECONDS", default_value_t = 30)]
    pub idle_window_seconds: u64,

    /// Secrets of another ring, in a namespace of their own, in the cluster throughout the idle
    /// cost section (lists across the cluster meet them).
    #[arg(long, env = "SHARDER_BENCH_IDLE_OTHERS", default_value_t = 10_000)]
    pub idle_others: usize,

    /// Keep-alive connections of the in-process webhook load.
    #[arg(long, env = "SHARDER_BENCH_LOAD_CONNECTIONS", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub load_connections: u64,

    /// Seconds per round of the in-process webhook load.
    #[arg(long, env = "SHARDER_BENCH_LOAD_SECONDS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub load_seconds: u64,

    /// Rounds per server of the in-process webhook load.
    #[arg(long, env = "SHARDER_BENCH_LOAD_ROUNDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub load_rounds: u64,

    /// The reference sharder's `sharder` binary (built by you from its release; the bench never
    /// builds it): section 9 runs it beside Sharder. Without it, section 9 says it was not run.
    #[arg(long, env = "SHARDER_BENCH_REFERENCE")]
    pub reference: Option<PathBuf>,

    /// The reference's release the `--reference` binary was built from, as the report names it.
    #[arg(
        long,
        env = "SHARDER_BENCH_REFERENCE_VERSION",
        default_value = "(release not stated: --reference-version)"
    )]
    pub reference_version: String,

    /// Object counts of section 9 (Sharder beside the reference), comma-separated (`make
    /// bench-scale` runs the larger ones).
    #[arg(
        long,
        env = "SHARDER_BENCH_REFERENCE_SIZES",
        value_delimiter = ',',
        default_value = "10000"
    )]
    pub reference_sizes: Vec<usize>,

    /// Rounds of each contender at section 9's first size, interleaved (Sharder, the
    /// reference, Sharder, ...): each verdict is decided by the medians and shows the spread.
    #[arg(long, env = "SHARDER_BENCH_REFERENCE_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub reference_rounds: u32,

    /// Section 9 measures only each contender's CREATE latency, memory and scale-out at its
    /// first size too, not the release, the crash and the rolling restart (`make bench-scale`).
    #[arg(long, env = "SHARDER_BENCH_REFERENCE_SCALE_OUT_ONLY")]
    pub reference_scale_out_only: bool,

    /// Object counts of section 10 (range mode beside label mode), comma-separated.
    #[arg(
        long,
        env = "SHARDER_BENCH_RANGE_SIZES",
        value_delimiter = ',',
        default_value = "10000,100000"
    )]
    pub range_sizes: Vec<usize>,

    /// The sections to run, comma-separated (the others are reported as not run).
    #[arg(
        long,
        env = "SHARDER_BENCH_SECTIONS",
        value_enum,
        value_delimiter = ',',
        default_value = "latency,load,memory,chains,rebalance,rolling,ranges,ring,node,idle,reference"
    )]
    pub sections: Vec<Section>,
}

/// One section of the report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    /// 1. CREATE latency added by the webhook.
    Latency,
    /// 2. The webhook alone under load.
    Load,
    /// 3. Reconciler memory against object count.
    Memory,
    /// 3b. A scale-out of Pods in chains.
    Chains,
    /// 4-5. Rebalancing and shard crashes.
    Rebalance,
    /// 5b. Rolling updates of the shards.
    Rolling,
    /// 6. The ring.
    Ring,
    /// 7. The chart's pods on a real node (needs root: a bridge, iptables, cgroups).
    Node,
    /// 8. What a quiet ring costs the apiserver and etcd.
    Idle,
    /// 9. Sharder beside the reference sharder's own binary (`--reference`).
    Reference,
    /// 10. Range mode beside label mode.
    Ranges,
}

impl Section {
    /// The section's heading in the report.
    pub fn heading(self) -> &'static str {
        match self {
            Self::Latency => "1. CREATE latency added by the webhook",
            Self::Load => "2. The webhook alone under load",
            Self::Memory => "3. Reconciler memory against object count",
            Self::Chains => "3b. A scale-out of Pods in chains",
            Self::Rebalance => "4. Rebalancing 3 -> 4 shards",
            Self::Rolling => "5b. A rolling update of the shards",
            Self::Ring => "6. Ring",
            Self::Node => "7. The chart's pods on a real node",
            Self::Idle => "8. What a quiet ring costs the control plane",
            Self::Reference => "9. Beside the reference sharder",
            Self::Ranges => "10. Range mode beside label mode",
        }
    }

    /// How long the section is expected to take with `args`, from the rates of a run on 2
    /// cores: the progress lines' estimate of what is left, never a measurement.
    pub fn estimate(self, args: &Args) -> Duration {
        // Objects created per second, moved per second, and settling per step.
        const CREATE: f64 = 1100.0;
        const MOVE: f64 = 600.0;
        let create = |n: usize| n as f64 / CREATE;
        let lease = args.lease_seconds as f64;
        let per_round = args.creates as f64 / args.rate;
        let seconds = match self {
            Self::Load => args.load_rounds as f64 * 3.0 * (args.load_seconds as f64 + 1.0) + 5.0,
            Self::Latency => (args.rounds + 1) as f64 * 5.0 * (per_round + 1.5) + 20.0,
            Self::Rebalance => {
                let n = args.rebalance_objects;
                let round = 3.0 * (n as f64 / 4.0) / MOVE + 15.0;
                let crash = 3.0 * lease + (n as f64 / 4.0) / MOVE + 10.0;
                create(n) + (args.rebalance_rounds + 1) as f64 * round + args.crashes as f64 * crash
            }
            Self::Rolling => {
                let n = args.rebalance_objects as f64;
                create(args.rebalance_objects) + 2.0 * 3.0 * n / (MOVE / 1.4) + 30.0
            }
            Self::Ring => 15.0,
            Self::Chains => args
                .chain_sizes
                .iter()
                .map(|&pods| {
                    // Created (Pods more slowly), a quarter moved, deleted.
                    let objects = pods as f64 * 1.2;
                    1.5 * objects / CREATE + 2.0 * (objects / 4.0) / MOVE + objects / 2e3 + 20.0
                })
                .sum(),
            Self::Ranges => args
                .range_sizes
                .iter()
                .map(|&n| {
                    let n = n as f64;
                    // Created, moved in label mode, listed and watched, deleted.
                    n / CREATE + (n / 4.0) / (MOVE / 1.6) + n / 1.8e3 + n / 640.0 + 40.0
                })
                .sum(),
            Self::Node => 60.0 + 3.0 * args.node_objects as f64 / 400.0,
            Self::Idle => {
                let windows = 7.0;
                let each = |n: usize| {
                    create(n) + windows * args.idle_window_seconds as f64 + n as f64 / 2e4 + 30.0
                };
                create(args.idle_others) + args.idle_sizes.iter().map(|&n| each(n)).sum::<f64>()
            }
            Self::Memory => args
                .sizes
                .iter()
                .map(|&n| {
                    let runs = if n >= 100_000 { 1.0 } else { 3.0 };
                    let moved = n as f64 / 4.0 / MOVE;
                    let shared =
                        args.sections.contains(&Self::Idle) && args.idle_sizes.contains(&n);
                    let create = if shared { 0.0 } else { create(n) };
                    create + runs * (n as f64 / 1e4 + 2.0 * moved + 8.0) + n as f64 / 5e3 + 5.0
                })
                .sum(),
            Self::Reference => {
                let contenders = if args.reference.is_some() { 2.0 } else { 1.0 };
                let latency = (args.rounds + 1) as f64 * 3.0 * (per_round + 1.0);
                args.reference_sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let moves = 2.0 * (n as f64 / 4.0) / MOVE + n as f64 / 1e4 + 15.0;
                        // At the first size: a release and a join again beside the crash,
                        // then the rolling restart.
                        let changes = if args.reference_scale_out_only {
                            0.0
                        } else {
                            2.0 * (n as f64 / 4.0) / MOVE + 20.0 + 3.0 * lease
                        };
                        let rounds = f64::from(args.reference_rounds);
                        let each = if i == 0 {
                            rounds * (latency + moves + changes)
                        } else {
                            moves
                        };
                        create(n) + contenders * each
                    })
                    .sum()
            }
        };
        Duration::from_secs_f64(seconds)
    }
}

/// The prologue of the bench's helper binaries: installs the rustls crypto provider and returns
/// exactly `N` positional arguments, or a usage error naming them.
pub fn helper_args<const N: usize>(usage: &str) -> anyhow::Result<[String; N]> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.try_into()
        .map_err(|_| anyhow::anyhow!("usage: {usage}"))
}

/// The end of the bench's cache helpers: drives `stream` (a reflector's) in the background,
/// prints `synced <n>` once `len` (its store's size) reaches `expected`, then waits until killed.
pub async fn hold_until_killed<S>(
    stream: S,
    len: impl Fn() -> usize,
    expected: usize,
) -> anyhow::Result<()>
where
    S: futures::Stream + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    loop {
        let n = len();
        if n >= expected {
            println!("synced {n}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// Errors of the benchmark command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control plane or a test-support piece failed.
    #[error(transparent)]
    Support(#[from] sharder_harness::Error),
    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[from] kube::Error),
    /// A file or process operation failed; the first field says which.
    #[error("cannot {0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    /// A benchmark could not be set up or did not reach the state it waits for.
    #[error("{0}")]
    Setup(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |e| Self::Io(what, e)
    }
}

/// The `MALLOC_ARENA_MAX` the chart's template `name` sets (the bench runs each process as the
/// chart does), read from its text.
fn chart_arena_max(name: &str) -> Result<u32, Error> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/sharder/templates")
        .join(name);
    let text = std::fs::read_to_string(&path).map_err(Error::io("read the chart's templates"))?;
    let mut lines = text
        .lines()
        .skip_while(|l| !l.contains("name: MALLOC_ARENA_MAX"));
    lines
        .nth(1)
        .and_then(|v| {
            v.trim()
                .strip_prefix("value: ")?
                .trim_matches('"')
                .parse()
                .ok()
        })
        .ok_or_else(|| Error::Setup(format!("{}: no MALLOC_ARENA_MAX value", path.display())))
}

/// Deletes object `name` of `api`; gone already is as good.
pub(crate) async fn delete_if_there<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies (server-side, as the bench) an admission policy and its binding, both named `name`.
pub(crate) async fn apply_policy<P, B>(
    (policies, policy): (&Api<P>, &P),
    (bindings, binding): (&Api<B>, &B),
    name: &str,
) -> Result<(), Error>
where
    P: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    B: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let apply = PatchParams::apply("sharder-bench").force();
    policies.patch(name, &apply, &Patch::Apply(policy)).await?;
    bindings.patch(name, &apply, &Patch::Apply(binding)).await?;
    Ok(())
}

/// One ring over Secrets of its own namespace (a harness [`World`]: the ring is named after the
/// namespace and selects it), with shard Leases held for an hour.
struct RingSetup(World);

impl std::ops::Deref for RingSetup {
    type Target = World;

    fn deref(&self) -> &World {
        &self.0
    }
}

impl RingSetup {
    /// A new namespace and ClusterRing; `controlled` keeps ConfigMaps as controlled resources;
    /// `leases` shard Leases `shard-<i>` held for an hour.
    async fn new(
        cp: &'static ControlPlane,
        prefix: &str,
        controlled: bool,
        leases: usize,
    ) -> Result<Self, Error> {
        Self::of_kind(cp, prefix, controlled, leases, RingKind::ClusterRing).await
    }

    /// [`Self::new`] with a ring of `kind`.
    async fn of_kind(
        cp: &'static ControlPlane,
        prefix: &str,
        controlled: bool,
        leases: usize,
        kind: RingKind,
    ) -> Result<Self, Error> {
        let world = World::in_namespace(cp, cp.namespace(prefix).await?)
            .await
            .with_kind(kind);
        let mut ring = secrets_ring(&world.ring, Some(&world.ns));
        if !controlled {
            ring.spec.resources[0].controlled_resources.clear();
        }
        world
            .rings()
            .create(&PostParams::default(), &ring_object(&world.id(), &ring))
            .await?;
        for i in 0..leases {
            world.add_shard_lease(&format!("shard-{i}"), 3600).await;
        }
        Ok(Self(world))
    }

    /// Deletes the namespace and its ring; with `wait`, waits (up to 15 minutes) until the
    /// namespace is gone: the namespace controller deletes its objects one by one, and a later
    /// measurement must not share the apiserver with the deletion of a big one.
    async fn remove(self, wait: bool) -> Result<(), Error> {
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let _ = self
            .rings()
            .delete(&self.ring, &DeleteParams::default())
            .await;
        namespaces
            .delete(&self.ns, &DeleteParams::default())
            .await?;
        let started = Instant::now();
        while wait && namespaces.get_opt(&self.ns).await?.is_some() {
            if started.elapsed() > Duration::from_secs(900) {
                return Err(Error::Setup(format!("namespace {} still there", self.ns)));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(())
    }

    /// Creates Secrets `object-<i>` for `range`, 64 in flight, labelled with their shard on
    /// `ring` or (`None`) left to the webhook; creates per second and how many came back from
    /// the CREATE without a shard label.
    async fn create(
        &self,
        range: std::ops::Range<usize>,
        ring: Option<&Ring>,
    ) -> Result<(f64, usize), Error> {
        let started = Instant::now();
        let n = range.len();
        let (api, shard_label) = (self.secrets(), &self.labels.shard);
        let mut counter = progress::Counter::new(format!("objects created in {}", self.ns), n);
        let unassigned = futures::stream::iter(range)
            .map(|i| {
                let name = format!("object-{i}");
                let labels = ring.map(|ring| {
                    let shard = ring.shard_for(&self.key(&name)).unwrap_or_default();
                    [(shard_label.clone(), shard.to_owned())].into()
                });
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name),
                        labels,
                        ..ObjectMeta::default()
                    },
                    data: Some([("value".to_owned(), ByteString(vec![b'x'; 16]))].into()),
                    ..Secret::default()
                };
                let api = api.clone();
                async move {
                    let created = api.create(&PostParams::default(), &secret).await?;
                    Ok::<_, kube::Error>(usize::from(!created.labels().contains_key(shard_label)))
                }
            })
            .buffer_unordered(64)
            .try_fold(0, |sum, unassigned| {
                counter.add(1);
                async move { Ok(sum + unassigned) }
            })
            .await?;
        Ok((n as f64 / started.elapsed().as_secs_f64(), unassigned))
    }

    /// Creates Secrets `object-<i>` for `range`, each already labelled with its shard on
    /// `ring` (no write is needed to assign them); creates per second.
    async fn create_assigned(
        &self,
        range: std::ops::Range<usize>,
        ring: &Ring,
    ) -> Result<f64, Error> {
        let (rate, _) = self.create(range, Some(ring)).await?;
        progress!("  objects created in {} ({rate:.0}/s)", self.ns);
        Ok(rate)
    }

    /// Sets label `key` of every Secret `selector` selects to what `value` gives for its name
    /// (`None`: removes it), 64 merge patches in flight; how many were patched.
    async fn relabel(
        &self,
        selector: &str,
        key: &str,
        value: impl Fn(&str) -> Option<String>,
    ) -> Result<usize, Error> {
        let mut names = Vec::new();
        each_metadata(&self.secrets(), Some(selector), |o| {
            names.push(o.name_any())
        })
        .await?;
        let (api, params) = (self.secrets(), PatchParams::default());
        futures::stream::iter(&names)
            .map(|name| {
                let patch = Patch::Merge(serde_json::json!(
                    {"metadata": {"labels": {key: value(name)}}}
                ));
                let (api, params) = (&api, &params);
                async move { api.patch_metadata(name, params, &patch).await }
            })
            .buffer_unordered(64)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        Ok(names.len())
    }

    /// Name, shard label and whether draining, of every Secret (metadata list, paginated).
    async fn assignment(&self) -> Result<Vec<(String, Option<String>, bool)>, Error> {
        let mut all = Vec::new();
        each_metadata(&self.secrets(), None, |object| {
            let labels = object.labels();
            let shard = labels.get(&self.labels.shard).cloned();
            all.push((
                object.name_any(),
                shard,
                labels.contains_key(&self.labels.drain),
            ));
        })
        .await?;
        Ok(all)
    }

    /// Starts a reconciler for this ring as [`Self::launch_reconciler`] does; returns once its
    /// first full rebalance of the ring's `n` objects is done.
    async fn start_reconciler(
        &self,
        dir: &Path,
        kubeconfig: &Path,
        webhooks: &webhooks::Webhooks,
        extra: &str,
        n: usize,
    ) -> Result<Reconciler, Error> {
        let mut reconciler = self
            .launch_reconciler(dir, kubeconfig, webhooks, extra)
            .await?;
        reconciler
            .wait_for_rebalances(
                &self.id(),
                "the first full rebalance",
                Duration::from_secs(600),
                |m| m.listed >= n as f64,
            )
            .await?;
        Ok(reconciler)
    }

    /// Starts a reconciler for this ring (leader election in its namespace) with `kubeconfig`,
    /// calling `webhooks`' sharder webhook, plus `extra` flags (separated by spaces),
    /// `MALLOC_ARENA_MAX` as the chart sets; returns once it serves its admin port.
    async fn launch_reconciler(
        &self,
        dir: &Path,
        kubeconfig: &Path,
        webhooks: &webhooks::Webhooks,
        extra: &str,
    ) -> Result<Reconciler, Error> {
        let arenas = chart_arena_max("reconciler.yaml")?.to_string();
        let env = Env::new(dir, kubeconfig).var("MALLOC_ARENA_MAX", &arenas);
        let flags = ReconcilerFlags {
            namespace: self.ns.clone(),
            identity: "bench".into(),
            webhook_url: format!("https://{}", webhooks.sharder.addr),
            ca_file: webhooks.ca_file.clone(),
            ring_selector: format!("{RING_NAMESPACE_LABEL}={}", self.ns),
            // The bench's ring selects its namespace, which is also the reconciler's.
            extra: format!("--namespace-selector {{}} {extra}")
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        };
        Ok(Reconciler::start(&format!("reconciler-{}", self.ns), &env, &flags).await?)
    }
}

/// Lists the objects of `api` that `selector` selects (every one: `None`), metadata only and
/// 500 to a page as the reconciler does, handing each to `each`.
async fn each_metadata<K>(
    api: &Api<K>,
    selector: Option<&str>,
    mut each: impl FnMut(&PartialObjectMeta<K>),
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(500);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    loop {
        let page = api.list_metadata(&params).await?;
        page.items.iter().for_each(&mut each);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// The order the sections run in after section 2 (which needs no control plane and runs
/// before it starts). Sections 8 and 3 run last, size by size on the same objects
/// ([`shared_objects`]): the largest size's namespace is left to the control plane's end
/// (deleting 100,000 objects takes longer than measuring them).
const ORDER: [Section; 8] = [
    Section::Latency,
    Section::Rebalance,
    Section::Rolling,
    Section::Ranges,
    Section::Ring,
    Section::Reference,
    Section::Chains,
    Section::Node,
];

/// A ring (a ControllerRing, the kind the reference's binary serves) of `n` Secrets, each
/// already on its shard of 3 Leases held for an hour, and how fast they were created: the
/// objects sections 8 and 3 share at a size, created once. The moving sections (4, 5, 5b, 9)
/// make rings of their own: their shards run in this process and hold Leases of their own, and
/// they leave objects moved.
async fn shared_objects(cp: &'static ControlPlane, n: usize) -> Result<(RingSetup, f64), Error> {
    let kind = RingKind::ControllerRing;
    let setup = RingSetup::of_kind(cp, &format!("bench-objects-{n}"), false, 3, kind).await?;
    let created = setup
        .create_assigned(0..n, &Ring::new((0..3).map(|i| format!("shard-{i}"))))
        .await?;
    Ok((setup, created))
}

/// What a run has written: the sections' texts, the report they make, where it goes.
struct Report<'a> {
    args: &'a Args,
    cp: Option<&'static ControlPlane>,
    texts: std::collections::BTreeMap<Section, String>,
}

impl Report<'_> {
    /// Keeps `text` as `section`'s and writes the report (a stopped run keeps what is in it).
    fn keep(&mut self, section: Section, text: String) -> Result<(), Error> {
        self.texts.insert(section, text);
        self.save(false).map(drop)
    }

    /// Renders the report, `done` or not, writes it to `args.output` and returns it.
    fn save(&self, done: bool) -> Result<String, Error> {
        let text = report::render(self.args, self.cp, progress::elapsed(), &self.texts, done);
        if let Some(parent) = self.args.output.parent() {
            std::fs::create_dir_all(parent).map_err(Error::io("create the report folder"))?;
        }
        std::fs::write(&self.args.output, &text).map_err(Error::io("write the report"))?;
        Ok(text)
    }
}

/// Runs the sections `args` names and writes the report, section by section as each ends.
pub async fn run(args: Args) -> Result<(), Error> {
    let runs = |s: &Section| args.sections.contains(s);
    let shared = args.sections.contains(&Section::Idle) || args.sections.contains(&Section::Memory);
    let mut plan: Vec<(&'static str, Duration)> = std::iter::once(Section::Load)
        .chain(ORDER)
        .filter(runs)
        .map(|s| (s.heading(), s.estimate(&args)))
        .collect();
    if shared {
        let estimate = Section::Idle.estimate(&args) + Section::Memory.estimate(&args);
        plan.push((SHARED, estimate));
    }
    progress::start(plan);
    let mut report = Report {
        args: &args,
        cp: None,
        texts: std::collections::BTreeMap::new(),
    };
    // The webhook alone under load needs no control plane and runs before it starts: a control
    // plane still deleting an earlier section's namespace takes its share of the machine.
    if runs(&Section::Load) {
        progress::begin(Section::Load.heading());
        report.keep(Section::Load, load::run(&args).await?)?;
        progress::end(Section::Load.heading());
    }
    if args.sections.iter().all(|s| *s == Section::Load) {
        return finish(&report);
    }
    let cp = ControlPlane::shared().await?;
    report.cp = Some(cp);
    sharder_harness::crd::install_ring_crds(&cp.client().await?).await?;
    let webhooks = webhooks::start(cp).await?;
    let mut failed = Vec::new();
    for section in ORDER.into_iter().filter(runs) {
        progress::begin(section.heading());
        let text: Result<String, Error> = async {
            Ok(match section {
                Section::Latency => create_latency::run(cp, &webhooks, &args).await?,
                Section::Rebalance => rebalance::run(cp, &webhooks, &args).await?,
                Section::Rolling => rolling::run(cp, &webhooks, &args).await?,
                Section::Ranges => ranges::run(cp, &webhooks, &args).await?,
                Section::Chains => chains::run(cp, &webhooks, &args).await?,
                Section::Ring => ring_balance::run(),
                Section::Node => node::run(args.node_objects)
                    .await
                    .unwrap_or_else(|e| format!("Could not run: {e}\n\n")),
                Section::Reference => {
                    let mut partial = |text: String| report.keep(Section::Reference, text);
                    beside::run(cp, &webhooks, &args, &mut partial).await?
                }
                Section::Load | Section::Idle | Section::Memory => String::new(),
            })
        }
        .await;
        // A section that failed says so in the report; the others still run.
        let text = text.unwrap_or_else(|e| {
            progress!("{} failed: {e}", section.heading());
            failed.push(section.heading());
            format!("**Failed**: {e}\n\n")
        });
        report.keep(section, text)?;
        progress::end(section.heading());
    }
    if shared {
        progress::begin(SHARED);
        if let Err(e) = idle_and_memory(cp, &webhooks, &mut report).await {
            progress!("{SHARED} failed: {e}");
            failed.push(SHARED);
            for section in [Section::Idle, Section::Memory].into_iter().filter(runs) {
                let text = report.texts.remove(&section).unwrap_or_default();
                report.keep(section, format!("{text}**Failed** before its end: {e}\n\n"))?;
            }
        }
        progress::end(SHARED);
    }
    finish(&report)?;
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Error::Setup(format!("failed: {}", failed.join("; ")))),
    }
}

/// The progress step of sections 8 and 3.
const SHARED: &str = "8. and 3., size by size on the same objects";

/// Sections 8 and 3 at every size either names, smallest first, on [`shared_objects`]: section
/// 8 first (it moves nothing), then section 3 (which leaves the objects draining); each size's
/// namespace is deleted before the next one's objects are created, but the last.
async fn idle_and_memory(
    cp: &'static ControlPlane,
    webhooks: &webhooks::Webhooks,
    report: &mut Report<'_>,
) -> Result<(), Error> {
    let args = report.args;
    let sizes_of = |section, sizes: &[usize]| match args.sections.contains(&section) {
        true => sizes.to_vec(),
        false => Vec::new(),
    };
    let idle_sizes = sizes_of(Section::Idle, &args.idle_sizes);
    let memory_sizes = sizes_of(Section::Memory, &args.sizes);
    let mut sizes: Vec<usize> = idle_sizes.iter().chain(&memory_sizes).copied().collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut idle = match idle_sizes.is_empty() {
        true => None,
        false => Some(idle::Idle::start(cp, args).await?),
    };
    let mut memory = memory::Memory::default();
    for (i, &n) in sizes.iter().enumerate() {
        progress!("{n} objects: creating them (64 in flight)");
        let (objects, created) = shared_objects(cp, n).await?;
        let left = &sizes[i + 1..];
        let still = |sizes: &[usize]| {
            let left: Vec<_> = left.iter().filter(|n| sizes.contains(n)).collect();
            match left.is_empty() {
                true => String::new(),
                false => format!("Sizes still being measured when this was written: {left:?}.\n\n"),
            }
        };
        if let Some(measuring) = idle.as_mut().filter(|_| idle_sizes.contains(&n)) {
            progress!("{n} objects: {}", Section::Idle.heading());
            measuring
                .size(webhooks, &objects, n, args.reference.as_deref())
                .await?;
            report.keep(Section::Idle, measuring.text(args) + &still(&idle_sizes))?;
            if !idle_sizes.iter().any(|s| *s > n)
                && let Some(done) = idle.take()
            {
                done.finish().await?;
            }
        }

        if memory_sizes.contains(&n) {
            progress!("{n} objects: {}", Section::Memory.heading());
            memory.size(cp, webhooks, &objects, (n, created)).await?;
            report.keep(Section::Memory, memory.text() + &still(&memory_sizes))?;
        }
        // The last size's namespace is deleted without waiting: nothing is measured after it.
        objects.remove(!left.is_empty()).await?;
    }
    Ok(())
}

/// Writes the finished report and prints it.
fn finish(report: &Report<'_>) -> Result<(), Error> {
    let text = report.save(true)?;
    println!("{text}");
    progress!("report written to {}", report.args.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_chart_sets_the_malloc_arenas_the_bench_runs_each_process_with() {
        assert_eq!(super::chart_arena_max("reconciler.yaml").ok(), Some(1));
        assert_eq!(super::chart_arena_max("webhook.yaml").ok(), Some(2));
    }
}
