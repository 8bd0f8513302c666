//! The benchmark command (`make bench`): on the local control plane, measures side by side in
//! one run the CREATE latency the webhook adds (against no webhook and a floor webhook), the
//! webhook alone under load, the reconciler's memory against object count (against a
//! metadata-cache baseline), the cost of rebalancing and of a shard crash, and the ring's
//! lookup cost and balance, and the chart's pods on a real node (memory as kubelet counts it, the
//! time from `helm install` to Ready); then writes a markdown report (`docs/benchmarks.md`).
//!
//! Numbers are printed and written, never asserted: the goals are stated beside them.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::core::PartialObjectMeta;
use kube::{Api, ResourceExt};
use serde_json::Value;
use sharder_common::{ClusterRing, Ring};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::NAMESPACE_LABEL;
use sharder_harness::fixtures::secrets_ring;
use sharder_harness::launch::{Env, Reconciler, ReconcilerFlags};
use sharder_harness::world::World;

pub mod create_latency;
pub mod floor;
pub mod idle;
pub mod load;
pub mod memory;
pub mod node;
pub mod rebalance;
pub mod report;
pub mod ring_balance;
pub mod rolling;
pub mod stats;
pub mod tracker;
pub mod webhooks;
pub mod writes;

/// `--max-concurrent-writes` of the reconciler in the moving benchmarks: twice the reconciler's
/// default (64); what 128 buys in speed and costs in memory is in `docs/performance-notes.md`
/// (writes in flight). The memory section runs the reconciler at its default.
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

    /// Rounds of each mode (no webhook, floor, sharder) in the CREATE latency benchmark.
    #[arg(long, env = "SHARDER_BENCH_ROUNDS", default_value_t = 5)]
    pub rounds: usize,

    /// Object counts of the memory benchmark, comma-separated.
    #[arg(
        long,
        env = "SHARDER_BENCH_SIZES",
        value_delimiter = ',',
        default_value = "1000,10000,100000,300000"
    )]
    pub sizes: Vec<usize>,

    /// Objects of the rebalancing and crash benchmarks.
    #[arg(
        long,
        env = "SHARDER_BENCH_REBALANCE_OBJECTS",
        default_value_t = 10_000
    )]
    pub rebalance_objects: usize,

    /// Scale-out rounds of the rebalancing benchmark (each with its raw PATCH baseline).
    #[arg(long, env = "SHARDER_BENCH_REBALANCE_ROUNDS", default_value_t = 5)]
    pub rebalance_rounds: usize,

    /// `--max-concurrent-writes` of the reconciler in the moving benchmarks (twice its
    /// default: see [`REBALANCE_CONCURRENCY`]).
    #[arg(long, env = "SHARDER_BENCH_REBALANCE_CONCURRENCY", default_value_t = REBALANCE_CONCURRENCY)]
    pub rebalance_concurrency: usize,

    /// Reconcile concurrency of the in-process shards' controllers (0: kube-runtime's default,
    /// unbounded).
    #[arg(long, env = "SHARDER_BENCH_SHARD_CONCURRENCY", default_value_t = 0)]
    pub shard_concurrency: u16,

    /// Shard crashes after the rebalancing rounds (each a fresh shard that joins, takes its
    /// share and stops without releasing its Lease).
    #[arg(long, env = "SHARDER_BENCH_CRASHES", default_value_t = 5)]
    pub crashes: usize,

    /// Shard Lease duration in the crash benchmark, in seconds (the bench's shards renew every
    /// second, so at least 2).
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

    /// Seconds of each window of the idle cost section (the reconciler sweeps every second; the
    /// reference's schedule is compressed so that 10 of its lists come in a window).
    #[arg(long, env = "SHARDER_BENCH_IDLE_WINDOW_SECONDS", default_value_t = 90)]
    pub idle_window_seconds: u64,

    /// Secrets of another ring, in a namespace of their own, in the cluster throughout the idle
    /// cost section (a real cluster holds more than the ring: every list across the cluster
    /// meets them).
    #[arg(long, env = "SHARDER_BENCH_IDLE_OTHERS", default_value_t = 10_000)]
    pub idle_others: usize,

    /// How the webhook load section loads each server in-process.
    #[command(flatten)]
    pub load: load::LoadOptions,

    /// Seconds of load on each webhook process while its memory is read.
    #[arg(long, env = "SHARDER_BENCH_LOAD_PROCESS_SECONDS", default_value_t = 10)]
    pub load_process_seconds: u64,

    /// `MALLOC_ARENA_MAX` for the webhook processes (the chart sets 2); 0 leaves glibc's default
    /// (8 arenas per core).
    #[arg(
        long,
        env = "SHARDER_BENCH_WEBHOOK_MALLOC_ARENA_MAX",
        default_value_t = 2
    )]
    pub webhook_malloc_arena_max: u32,

    /// `MALLOC_ARENA_MAX` for the reconciler processes (the chart sets 1); 0 leaves glibc's
    /// default (8 arenas per core).
    #[arg(
        long,
        env = "SHARDER_BENCH_RECONCILER_MALLOC_ARENA_MAX",
        default_value_t = 1
    )]
    pub reconciler_malloc_arena_max: u32,

    /// Run the criterion ring lookup bench (`cargo bench -p sharder-common --bench ring`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub criterion: bool,

    /// The sections to run, comma-separated (the others are reported as not run).
    #[arg(
        long,
        env = "SHARDER_BENCH_SECTIONS",
        value_enum,
        value_delimiter = ',',
        default_value = "latency,load,memory,rebalance,rolling,ring,node,idle"
    )]
    pub sections: Vec<Section>,
}

/// One section of the report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// 1. CREATE latency added by the webhook.
    Latency,
    /// 2. The webhook alone under load.
    Load,
    /// 3. Reconciler memory against object count.
    Memory,
    /// 4-5. Rebalancing and a shard crash.
    Rebalance,
    /// 5b. Rolling updates of the shards.
    Rolling,
    /// 6. The ring.
    Ring,
    /// 7. The chart's pods on a real node (needs root: a bridge, iptables, cgroups).
    Node,
    /// 8. What a quiet ring costs the apiserver and etcd.
    Idle,
}

impl Args {
    fn runs(&self, section: Section) -> bool {
        self.sections.contains(&section)
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

/// How long the removal of a benchmark's namespace may take (100 000 Secrets take minutes).
pub const NAMESPACE_REMOVAL_TIMEOUT: Duration = Duration::from_secs(900);

/// From how many objects on the removal of a benchmark's namespace is waited for (smaller ones
/// are gone in moments).
pub const WAIT_FOR_REMOVAL_FROM: usize = 10_000;

/// One ring over Secrets of its own namespace (a harness [`World`]: the ring is named after the
/// namespace and selects it), with shard Leases held for an hour.
pub struct RingSetup(World);

impl std::ops::Deref for RingSetup {
    type Target = World;

    fn deref(&self) -> &World {
        &self.0
    }
}

impl RingSetup {
    /// A new namespace and ring; `controlled` adds ConfigMaps as controlled resources;
    /// `leases` shard Leases `shard-<i>` held for an hour.
    pub async fn new(
        cp: &'static ControlPlane,
        prefix: &str,
        controlled: bool,
        leases: usize,
    ) -> Result<Self, Error> {
        let world = World::in_namespace(cp, cp.namespace(prefix).await?).await;
        let mut ring = secrets_ring(&world.ring, Some(&world.ns));
        if !controlled {
            ring.spec.resources[0].controlled_resources.clear();
        }
        Api::<ClusterRing>::all(world.client.clone())
            .create(&PostParams::default(), &ring)
            .await?;
        for i in 0..leases {
            world.add_shard_lease(&format!("shard-{i}"), 3600).await;
        }
        Ok(Self(world))
    }

    /// Deletes the namespace and its ring; with `wait`, waits until the namespace is gone (the
    /// namespace controller deletes its objects one by one: a later measurement must not share
    /// the apiserver with the deletion of a big one); returns how long it took.
    pub async fn remove(self, wait: bool) -> Result<Duration, Error> {
        let started = Instant::now();
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let _ = Api::<ClusterRing>::all(self.client.clone())
            .delete(&self.ring, &DeleteParams::default())
            .await;
        namespaces
            .delete(&self.ns, &DeleteParams::default())
            .await?;
        while wait && started.elapsed() < NAMESPACE_REMOVAL_TIMEOUT {
            if namespaces.get_opt(&self.ns).await?.is_none() {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if !wait {
            return Ok(started.elapsed());
        }
        Err(Error::Setup(format!(
            "namespace {} still there {NAMESPACE_REMOVAL_TIMEOUT:?} after its deletion",
            self.ns
        )))
    }

    /// Creates Secrets `object-<i>` for `range`, each already labelled with its shard on
    /// `ring` (so no write is needed to assign them), 64 in flight; returns creates per second.
    pub async fn create_assigned(
        &self,
        range: std::ops::Range<usize>,
        ring: &Ring,
    ) -> Result<f64, Error> {
        Ok(self.create(range, Some(ring)).await?.0)
    }

    /// Creates Secrets `object-<i>` for `range`, 64 in flight, labelled with their shard on
    /// `ring` or (`None`) left to the webhook; creates per second and how many came back from
    /// the CREATE without a shard label.
    pub async fn create(
        &self,
        range: std::ops::Range<usize>,
        ring: Option<&Ring>,
    ) -> Result<(f64, usize), Error> {
        let started = Instant::now();
        let n = range.len();
        let api = self.secrets();
        let shard_label = &self.labels.shard;
        let created = futures::stream::iter(range)
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
                    api.create(&PostParams::default(), &secret)
                        .await
                        .map(|created| created.labels().contains_key(shard_label))
                }
            })
            .buffer_unordered(64)
            .try_collect::<Vec<bool>>()
            .await?;
        let unassigned = created.iter().filter(|assigned| !**assigned).count();
        Ok((n as f64 / started.elapsed().as_secs_f64(), unassigned))
    }

    /// Lists the Secrets `selector` selects (every one: `None`), metadata only and 500 to a
    /// page as the reconciler does, handing each to `each`.
    async fn each_secret(
        &self,
        selector: Option<&str>,
        each: impl FnMut(&PartialObjectMeta<Secret>),
    ) -> Result<(), Error> {
        each_metadata(&self.secrets(), selector, each).await
    }

    /// Name -> shard label of every Secret (metadata list, paginated).
    pub async fn assignment(&self) -> Result<Vec<(String, Option<String>, bool)>, Error> {
        let mut all = Vec::new();
        self.each_secret(None, |object| {
            let labels = object.labels();
            all.push((
                object.name_any(),
                labels.get(&self.labels.shard).cloned(),
                labels.contains_key(&self.labels.drain),
            ));
        })
        .await?;
        Ok(all)
    }
}

/// Lists the objects of `api` that `selector` selects (every one: `None`), metadata only and
/// 500 to a page as the reconciler does, handing each to `each`.
pub async fn each_metadata<K>(
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

/// `env` with `MALLOC_ARENA_MAX` set to `malloc_arena_max` (0: glibc's default), as the chart
/// sets it for the webhook and the reconciler.
pub fn with_arena_max(env: Env, malloc_arena_max: u32) -> Env {
    if malloc_arena_max > 0 {
        env.var("MALLOC_ARENA_MAX", &malloc_arena_max.to_string())
    } else {
        env
    }
}

/// Starts a reconciler (`name`, logs in `dir`) for the ring of `setup` (leader election in its
/// namespace) with `kubeconfig`, calling `webhooks`' sharder webhook, plus `extra` flags;
/// `MALLOC_ARENA_MAX` as given (0: glibc's default).
pub async fn start_reconciler(
    setup: &RingSetup,
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    webhooks: &webhooks::Webhooks,
    extra: &[&str],
    malloc_arena_max: u32,
) -> Result<Reconciler, Error> {
    let env = with_arena_max(Env::new(dir, kubeconfig), malloc_arena_max);
    let flags = ReconcilerFlags {
        namespace: setup.ns.clone(),
        identity: "bench".into(),
        webhook_url: format!("https://{}", webhooks.sharder.addr),
        ca_file: webhooks.ca_file.clone(),
        ring_selector: format!("{NAMESPACE_LABEL}={}", setup.ns),
        // The bench's ring selects its namespace, which is also the reconciler's.
        extra: ["--namespace-selector", "{}"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect(),
    };
    Ok(Reconciler::start(&format!("reconciler-{}", setup.ns), &env, &flags).await?)
}

/// Waits for the reconciler's first full rebalance of the ring's `n` objects; returns its
/// summary line.
pub async fn wait_first_rebalance(reconciler: &mut Reconciler, n: usize) -> Result<Value, Error> {
    Ok(reconciler
        .process
        .wait_for(
            "the first full rebalance",
            0,
            Duration::from_secs(600),
            |l| rebalanced(l, n),
        )
        .await?)
}

/// Whether `line` is a rebalance summary that listed at least `n` objects.
pub fn rebalanced(line: &Value, n: usize) -> bool {
    line["message"] == "rebalance" && line["listed"].as_u64().unwrap_or(0) >= n as u64
}

/// Runs every benchmark and writes the report.
pub async fn run(args: Args) -> Result<(), Error> {
    let started = Instant::now();
    let cp = ControlPlane::shared().await?;
    sharder_harness::crd::install_ring_crds(&cp.client().await?).await?;
    eprintln!("[bench] control plane up; starting the webhooks");
    let webhooks = webhooks::start(cp, args.webhook_malloc_arena_max).await?;
    let mut report = report::Report::new(&args, cp);
    if args.runs(Section::Latency) {
        eprintln!("[bench] 1/8 CREATE latency through the apiserver");
        report.create_latency = Some(create_latency::run(cp, &webhooks, &args).await?);
    }
    if args.runs(Section::Load) {
        eprintln!("[bench] 2/8 webhook alone under load");
        report.load = load_bench(&args);
        let setup = RingSetup::new(cp, "bench-load", false, 3).await?;
        report.load_processes = load::processes_under_load(
            &webhooks,
            &setup.ns,
            Duration::from_secs(args.load_process_seconds),
        )
        .await?;
        setup.remove(false).await?;
    }
    if args.runs(Section::Rebalance) {
        eprintln!("[bench] 4-5/8 rebalancing and a shard crash");
        report.rebalance = Some(rebalance::run(cp, &webhooks, &args).await?);
    }
    if args.runs(Section::Rolling) {
        eprintln!("[bench] 5b/8 rolling updates of the shards, three ways");
        report.rolling = Some(rolling::run(cp, &webhooks, &args).await?);
    }
    if args.runs(Section::Ring) {
        eprintln!("[bench] 6/8 ring");
        report.ring = Some(ring_balance::run(args.criterion));
    }
    if args.runs(Section::Idle) {
        eprintln!("[bench] 8/8 what a quiet ring costs the apiserver and etcd");
        report.idle = idle::run(cp, &webhooks, &args).await?;
    }
    if args.runs(Section::Node) {
        eprintln!("[bench] 7/8 the chart's pods on a real node");
        report.node = Some(
            node::run(args.node_objects)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    // Last: the largest size's namespace is left to the control plane's end (deleting 300k
    // objects takes the namespace controller longer than measuring them).
    if args.runs(Section::Memory) {
        eprintln!("[bench] 3/8 reconciler memory");
        report.memory = memory::run(cp, &webhooks, &args).await?;
    }
    report.duration = started.elapsed();
    let text = report.render();
    if let Some(parent) = args.output.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io("create the report folder"))?;
    }
    std::fs::write(&args.output, &text).map_err(Error::io("write the report"))?;
    println!("{text}");
    eprintln!("[bench] report written to {}", args.output.display());
    Ok(())
}

/// Runs `cargo bench -p <package> --bench <bench> -- <args>`; its stdout, or why not.
pub fn cargo_bench(package: &str, bench: &str, args: &str) -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let output = Command::new(cargo)
        .args(["bench", "--locked", "--manifest-path"])
        .arg(manifest)
        .args(["-p", package, "--bench", bench, "--"])
        .args(args.split_whitespace())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo bench: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo bench -p {package} --bench {bench} failed"));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn load_bench(args: &Args) -> Option<Result<load::LoadRun, String>> {
    (args.load.rounds > 0).then(|| load::run_in_process(args.load).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::Args;

    /// The `MALLOC_ARENA_MAX` the chart's template `name` sets, read from its text.
    fn chart_arena_max(name: &str) -> u32 {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/sharder/templates")
            .join(name);
        let text = std::fs::read_to_string(&path).expect("the chart's template");
        let mut lines = text
            .lines()
            .skip_while(|l| !l.contains("name: MALLOC_ARENA_MAX"));
        let value = lines.nth(1).expect("a value under MALLOC_ARENA_MAX");
        value
            .trim()
            .strip_prefix("value: ")
            .and_then(|v| v.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("{}: MALLOC_ARENA_MAX is {value:?}", path.display()))
    }

    #[test]
    fn the_bench_runs_each_process_with_the_malloc_arenas_the_chart_sets() {
        let args = Args::try_parse_from(["sharder-bench"]).expect("the defaults parse");
        assert_eq!(
            args.reconciler_malloc_arena_max,
            chart_arena_max("reconciler.yaml")
        );
        assert_eq!(
            args.webhook_malloc_arena_max,
            chart_arena_max("webhook.yaml")
        );
    }
}
