//! Section 9, Sharder beside the reference sharder, both as they run by default: the reference's
//! own `sharder` binary, given with `--reference` (the bench runs it, never builds it). For each
//! size one ControllerRing of Secrets on three shards of the shard SDK in this process; Sharder
//! (its reconciler as a process, the bench's sharder webhook) and then the reference (its one
//! process) take the same ring and the same objects in turn, never both at once (each reconciles
//! every ControllerRing it sees), in interleaved rounds at the first size. Each round, from the
//! same placement: the CREATE latency its webhook adds (at the first size), its memory, a 3 -> 4
//! scale-out with a neighbouring client reading meanwhile, and at the first size the fourth
//! shard's release and crash. Writes come from the apiserver's audit log, times from the
//! bench's metadata watch of the objects, memory from `/proc`; the report gives each figure as
//! the median of the rounds and each goal with their range.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use sharder_common::{Ring, RingKind};
use sharder_harness::launch::{Reconciler, dump_logs};
use sharder_harness::procfs::rss_kib;
use sharder_harness::{ControlPlane, Supervised};
use sharder_sdk::lease::OnStop;

use crate::create_latency::Creator;
use crate::idle::secret_lists;
use crate::progress::progress;
use crate::rebalance::{Movers, SHARD_CONCURRENCY};
use crate::report::{goals, table};
use crate::stats::{Spread, mib, ms, percentile};
use crate::webhooks::Webhooks;
use crate::writes::Writes;
use crate::{Args, Error, delete_if_there};

/// Where the reference's webhook server listens (controller-runtime's default port, which its
/// configuration cannot change) and what its webhook configuration calls.
const REFERENCE_URL: &str = "https://127.0.0.1:9443/";

/// The log (in the movers' folder) of the reference's process.
pub(crate) const REFERENCE_LOG: &str = "reference-sharder";

/// Who moves the objects.
#[derive(Clone, Copy, Debug)]
enum Contender<'a> {
    /// Sharder's reconciler and webhook.
    Sharder,
    /// The reference's `sharder` binary at this path.
    Reference(&'a Path),
}

impl Contender<'_> {
    fn name(self) -> &'static str {
        match self {
            Self::Sharder => "Sharder",
            Self::Reference(_) => "reference",
        }
    }
}

/// A running contender.
enum Running {
    Sharder(Reconciler),
    Reference(Supervised),
}

impl Running {
    /// Its memory (MiB): the peak of the process that moves the objects, plus for Sharder the
    /// webhook's resident memory now (the reference serves its webhook from the same process).
    fn memory(&self, webhooks: &Webhooks) -> Result<f64, Error> {
        let peak = |pid| {
            rss_kib(pid)
                .map(|(rss, peak)| (mib(rss), mib(peak)))
                .ok_or_else(|| Error::Setup(format!("no memory figures of process {pid}")))
        };
        Ok(match self {
            Self::Sharder(reconciler) => {
                peak(reconciler.process.pid())?.1 + peak(webhooks.sharder.process.pid())?.0
            }
            Self::Reference(process) => peak(process.pid())?.1,
        })
    }

    fn stop(&mut self) {
        match self {
            Self::Sharder(reconciler) => reconciler.process.stop(Duration::from_secs(20)),
            Self::Reference(process) => process.stop(Duration::from_secs(20)),
        };
    }
}

/// CREATE latency with a contender's webhook, with the floor webhook and without a webhook,
/// every round's creates pooled: percentiles of one pool of durations each (a percentile of the
/// difference of two rounds' p99s, each the fifth slowest of 500, is noise that can fall below
/// zero).
#[derive(Clone, Debug, Default, PartialEq)]
struct Latency {
    /// p50 and p99 (ms) of the creates its webhook assigned.
    with: [f64; 2],
    /// p50 and p99 (ms) of the creates no webhook saw, each round right before its webhook's.
    without: [f64; 2],
    /// p50 and p99 (ms) of each round's creates through the floor webhook (each round between
    /// the two others): the spread of the least any webhook adds.
    floor: Vec<[f64; 2]>,
    /// Creates in each pool.
    creates: usize,
}

impl Latency {
    /// What the webhook added at percentile `i` (0: p50, 1: p99): the difference of the two
    /// pools' percentiles, or `None` where the webhook's is not above (nothing measurable).
    fn added(&self, i: usize) -> Option<f64> {
        let added = self.with[i] - self.without[i];
        (added > 0.0).then_some(added)
    }

    /// The floor webhook's rounds at percentile `i`: the lowest and the highest.
    fn floor_range(&self, i: usize) -> Option<(f64, f64)> {
        let spread = Spread::of(self.floor.iter().map(|p| p[i]))?;
        Some((spread.low, spread.high))
    }
}

/// When a change's moves happened, in seconds from the change: the contender's first write
/// (received) and last write (answered) from the audit log, and every object on its shard with
/// none draining (stable, the bench's watch).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Timing {
    first: f64,
    last: f64,
    stable: f64,
}

impl Timing {
    /// From the change at `start` (`changed` on the bench's clock) to `stable`, with the
    /// contender's `writes` since.
    fn of(writes: &Writes, changed: Instant, stable: Instant) -> Self {
        Self {
            first: writes.first_received,
            last: writes.last_answered,
            stable: (stable - changed).as_secs_f64(),
        }
    }

    fn cells(timing: Option<&Self>) -> String {
        timing.map_or("-".to_owned(), |t| {
            format!("{:.2} / {:.2} / {:.2}", t.first, t.last, t.stable)
        })
    }
}

/// One contender's figures at one size.
#[derive(Clone, Debug, Default, PartialEq)]
struct Figures {
    /// CREATE latency with its webhook and without, when measured.
    latency: Option<Latency>,
    /// Peak memory (MiB).
    memory: f64,
    /// Scale-out: objects moved, the writes to the objects (the contender's and the shards':
    /// drains, acknowledgements, moves), when.
    moved: usize,
    writes: usize,
    scale_out: Timing,
    /// p99 (ms) of a neighbouring client's GETs during the scale-out.
    neighbour_p99: f64,
    /// The fourth shard stops and releases its Lease (first size).
    release: Option<Timing>,
    /// The fourth shard crashes (first size).
    crash: Option<Timing>,
    /// The writes to the objects (the contender's and the shards') while the three shards
    /// restart one after the other keeping their Leases (first size).
    roll: Option<usize>,
}

/// Runs Sharder, and the reference when its binary is given, at every size of
/// `args.reference_sizes`; the section's text. After each size but the last, `partial` gets the
/// text of the sizes measured so far (a run stopped in a long size keeps them).
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
    partial: &mut dyn FnMut(String) -> Result<(), Error>,
) -> Result<String, Error> {
    let contenders: Vec<Contender<'_>> = std::iter::once(Contender::Sharder)
        .chain(args.reference.as_deref().map(Contender::Reference))
        .collect();
    let mut rows = Vec::new();
    for (i, &n) in args.reference_sizes.iter().enumerate() {
        let names: Vec<String> = (0..3).map(|i| format!("shard-{i}")).collect();
        let prefix = format!("bench-beside-{n}");
        // The three shards keep their Leases when stopped (stable names, a StatefulSet's
        // rolling update moves nothing); the fourth releases its Lease.
        let mut m = Movers::prepare(
            cp,
            args,
            &prefix,
            &names,
            OnStop::Keep,
            RingKind::ControllerRing,
            n,
        )
        .await?;
        // At the first size the contenders' rounds interleave (Sharder, the reference,
        // Sharder, ...): a slow minute of the machine falls on both.
        let rounds = if i == 0 { args.reference_rounds } else { 1 };
        let (mut sharder, mut reference) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            for &contender in &contenders {
                progress!(
                    "  {n} objects: {} (round {} of {rounds})",
                    contender.name(),
                    round + 1
                );
                let plan = Plan {
                    latency: i == 0,
                    changes: i == 0 && !args.reference_scale_out_only,
                };
                let measured = contend(&mut m, webhooks, args, contender, n, plan).await;
                if measured.is_err() {
                    let log = match contender {
                        Contender::Sharder => format!("reconciler-{}", m.setup.ns),
                        Contender::Reference(_) => REFERENCE_LOG.to_owned(),
                    };
                    dump_logs(m.dir(), [log], 40);
                }
                match contender {
                    Contender::Sharder => sharder.push(measured?),
                    Contender::Reference(_) => reference.push(measured?),
                }
            }
        }
        for shard in std::mem::take(&mut m.shards).into_values() {
            shard.crash();
        }
        let last = i + 1 == args.reference_sizes.len();
        m.setup.remove(!last).await?;
        rows.push((n, sharder, reference));
        if !last {
            let left = &args.reference_sizes[i + 1..];
            partial(format!(
                "{}Sizes still being measured when this was written: {left:?}.\n\n",
                markdown(args, &rows)
            ))?;
        }
    }
    Ok(markdown(args, &rows))
}

/// What the section says when no reference binary was given.
const NOT_RUN: &str = "The reference was not run: its `sharder` binary was not given (`make bench BENCH_ARGS=\"--reference <path>\"`, the binary built by you from the reference's release; the bench never builds it). Sharder's figures stand alone.\n\n";

/// What one round of a contender measures beside its scale-out.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// The CREATE latency rounds, before it (every round at the first size).
    latency: bool,
    /// The fourth shard's release and crash and the rolling restart, after it (otherwise the
    /// bench puts the objects back itself).
    changes: bool,
}

/// `contender` takes the ring of `m` (its `n` objects each on its shard, three shards), adds
/// a fourth shard, with what `plan` adds; it is stopped after, the objects back on the first
/// three shards.
async fn contend(
    m: &mut Movers,
    webhooks: &Webhooks,
    args: &Args,
    contender: Contender<'_>,
    n: usize,
    plan: Plan,
) -> Result<Figures, Error> {
    let names: Vec<String> = m.shards.keys().cloned().collect();
    let mut running = match contender {
        Contender::Sharder => Running::Sharder(m.start_reconciler(webhooks, "", n).await?),
        Contender::Reference(binary) => {
            // Sharder's reconciler owns the fields of the ring's webhook configuration, and the
            // reference applies its own without forcing: a switch back deletes it first, and
            // Sharder's label guard with it (the reference has none; the policy would be
            // evaluated on the reference's writes).
            let name = m.setup.id().configuration_name();
            let client = &m.setup.client;
            delete_if_there(
                &Api::<MutatingWebhookConfiguration>::all(client.clone()),
                &name,
            )
            .await?;
            delete_if_there(
                &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
                &name,
            )
            .await?;
            delete_if_there(
                &Api::<ValidatingAdmissionPolicy>::all(client.clone()),
                &name,
            )
            .await?;
            let run = ReferenceRun {
                binary,
                dir: m.dir(),
                kubeconfig: m.kubeconfig(),
                namespace: &m.setup.ns,
            };
            Running::Reference(start_reference(&run, webhooks, None, None)?)
        }
    };
    let outcome = measure(m, webhooks, args, &running, &names, plan).await;
    running.stop();
    let figures = outcome?;
    if !plan.changes {
        put_back(m, &names).await?;
    }
    Ok(figures)
}

/// Puts the objects back on the shards `names` with no contender running (at sizes after the
/// first, where nothing is measured after the scale-out): shard `shard-3` stops and its Lease
/// is deleted, and the bench relabels its objects to their shards on the ring of `names`
/// (64 writes in flight, much faster than a contender's scale-in at its defaults).
async fn put_back(m: &mut Movers, names: &[String]) -> Result<(), Error> {
    if let Some(shard) = m.shards.remove("shard-3") {
        shard.stop().await;
    }
    delete_fourth_lease(m).await?;
    let ring = Ring::new(names.iter().cloned());
    let (setup, label) = (&m.setup, &m.setup.labels.shard);
    progress!(
        "  putting the fourth shard's objects back on {} shards",
        names.len()
    );
    let placed = setup
        .relabel(&format!("{label}=shard-3"), label, |name| {
            ring.shard_for(&setup.key(name)).map(str::to_owned)
        })
        .await?;
    progress!("  {placed} objects put back");
    m.converge(names).await?;
    Ok(())
}

/// The measurements of one contender while it runs.
async fn measure(
    m: &mut Movers,
    webhooks: &Webhooks,
    args: &Args,
    running: &Running,
    names: &[String],
    plan: Plan,
) -> Result<Figures, Error> {
    wait_until_assigning(m, running).await?;
    settle(m).await?;
    let latency = if plan.latency {
        Some(latency(m, webhooks, args).await?)
    } else {
        None
    };

    // A fourth shard joins, a neighbouring client reading meanwhile.
    let mut four = names.to_vec();
    four.push("shard-3".into());
    let neighbour = Neighbour::start(m).await?;
    let (mark, start, joined) = (m.cp.audit_mark(), Timestamp::now(), Instant::now());
    m.start_shard("shard-3", OnStop::Release);
    let (at, placed) = m.converge(&four).await?;
    let gets = neighbour.stop().await;
    let (scale_out, [by_contender, by_shards, _]) = m.writes(mark, start, &[0]).await;
    let writes = by_contender + by_shards;
    let memory = running.memory(webhooks)?;
    let moved = placed.values().filter(|s| *s == "shard-3").count();

    // It stops and releases its Lease, joins again, and crashes (no release: its Lease
    // expires); then the three shards restart one after the other.
    let (mut release, mut crash, mut roll) = (None, None, None);
    if plan.changes {
        release = Some(leave(m, names, false).await?);
        m.start_shard("shard-3", OnStop::Release);
        m.converge(&four).await?;
        crash = Some(leave(m, names, true).await?);
        roll = Some(rolling_restart(m, names).await?);
    }
    Ok(Figures {
        latency,
        memory,
        moved,
        writes,
        scale_out: Timing::of(&scale_out, joined, at),
        neighbour_p99: ms(percentile(&gets, 99.0)),
        release,
        crash,
        roll,
    })
}

/// Each of the shards `names` in turn stops gracefully, keeping its Lease, and starts again (a
/// StatefulSet's rolling update), every object on its shard before the next; the writes to the
/// objects meanwhile (the contender's and the shards').
async fn rolling_restart(m: &mut Movers, names: &[String]) -> Result<usize, Error> {
    let (mark, start) = (m.cp.audit_mark(), Timestamp::now());
    for name in names {
        let shard = m
            .shards
            .remove(name)
            .ok_or_else(|| Error::Setup(format!("{name} is not running")))?;
        shard.stop().await;
        m.start_shard(name, OnStop::Keep);
        m.wait_ready(name).await?;
        m.converge(names).await?;
    }
    let (_, [by_contender, by_shards, _]) = m.writes(mark, start, &[0]).await;
    Ok(by_contender + by_shards)
}

/// How long the apiserver must have answered no list of Secrets before a round's change: the
/// contender's startup (its caches, its first pass over the ring's objects) is over by then.
const SETTLED: Duration = Duration::from_secs(2);

/// Waits (up to 2 minutes) until the apiserver answered no list of Secrets for [`SETTLED`]: each
/// contender's round starts from the same quiet point, not inside its startup.
async fn settle(m: &Movers) -> Result<(), Error> {
    let started = Instant::now();
    let mut last = (secret_lists(&m.setup.client).await?, Instant::now());
    while last.1.elapsed() < SETTLED {
        if started.elapsed() > Duration::from_secs(120) {
            return Err(Error::Setup(
                "the contender kept listing Secrets for 2 minutes after it started".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = secret_lists(&m.setup.client).await?;
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    Ok(())
}

/// Shard `shard-3` stops, releasing its Lease, or (`crash`) stops at once, its Lease left to
/// expire; when its objects moved back to the shards `names`.
async fn leave(m: &mut Movers, names: &[String], crash: bool) -> Result<Timing, Error> {
    let shard = m
        .shards
        .remove("shard-3")
        .ok_or_else(|| Error::Setup("shard-3 is not running".into()))?;
    let (mark, start, left) = (m.cp.audit_mark(), Timestamp::now(), Instant::now());
    if crash {
        shard.crash();
    } else {
        shard.stop().await;
    }
    let (back, _) = m.converge(names).await?;
    let (writes, _) = m.writes(mark, start, &[0]).await;
    if crash {
        // Taken over, it would hold the next round's fourth shard back until it expired.
        delete_fourth_lease(m).await?;
    }
    Ok(Timing::of(&writes, left, back))
}

/// Deletes the fourth shard's Lease (gone already is fine).
async fn delete_fourth_lease(m: &Movers) -> Result<(), Error> {
    delete_if_there(&m.setup.leases(), "shard-3").await
}

/// A neighbouring client of the apiserver: GETs of one of the ring's Secrets one after the
/// other, with a client of its own, while the contender moves objects.
struct Neighbour {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<Vec<Duration>, kube::Error>>,
}

impl Neighbour {
    async fn start(m: &Movers) -> Result<Self, Error> {
        let client = m.cp.client().await?;
        let api: Api<Secret> = Api::namespaced(client, &m.setup.ns);
        let name = m
            .setup
            .secrets()
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await?
            .items
            .first()
            .map(|s| s.name_any())
            .ok_or_else(|| Error::Setup("no Secret for the neighbour to read".into()))?;
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut took = Vec::new();
                while !stop.is_cancelled() {
                    let sent = Instant::now();
                    api.get(&name).await?;
                    took.push(sent.elapsed());
                }
                Ok(took)
            }
        });
        Ok(Self { stop, task })
    }

    /// The durations of its GETs, sorted.
    async fn stop(self) -> Vec<Duration> {
        self.stop.cancel();
        let mut took = match self.task.await {
            Ok(Ok(took)) => took,
            _ => Vec::new(),
        };
        took.sort();
        took
    }
}

/// Where the reference runs: its binary, the folder of its configuration and log, its
/// kubeconfig and its leader election's namespace.
pub(crate) struct ReferenceRun<'a> {
    pub(crate) binary: &'a Path,
    pub(crate) dir: &'a Path,
    pub(crate) kubeconfig: &'a Path,
    pub(crate) namespace: &'a str,
}

/// Starts the reference's binary for every ControllerRing, at its defaults but for where it
/// finds its certificate (the bench's sharder webhook's), which URL its webhook configuration
/// names, its leader election's namespace, and (`sync`) its resync period; logs to
/// `<dir>/reference-sharder.log`; with `renew`, its leader election renews its Lease that often
/// (its default is controller-runtime's retry period, 2 s).
pub(crate) fn start_reference(
    run: &ReferenceRun<'_>,
    webhooks: &Webhooks,
    sync: Option<Duration>,
    renew: Option<Duration>,
) -> Result<Supervised, Error> {
    let mut config = json!({
        "apiVersion": "config.sharding.timebertt.dev/v1alpha1",
        "kind": "SharderConfig",
        "leaderElection": { "resourceNamespace": run.namespace },
        "health": { "bindAddress": "0" },
        "metrics": { "bindAddress": "0" },
        "webhook": {
            "server": { "certDir": webhooks.cert_dir },
            "config": {
                "clientConfig": {
                    "url": REFERENCE_URL,
                    "caBundle": ByteString(webhooks.ca_pem.clone().into_bytes()),
                },
            },
        },
    });
    if let Some(renew) = renew {
        config["leaderElection"]["retryPeriod"] = json!(format!("{}ms", renew.as_millis()));
    }
    if let Some(sync) = sync {
        config["controller"] =
            json!({ "sharder": { "syncPeriod": format!("{}ms", sync.as_millis()) } });
    }
    // JSON is YAML: the reference reads either.
    let file = run.dir.join("reference-config.yaml");
    std::fs::write(&file, config.to_string()).map_err(Error::io("write the reference's config"))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run.dir.join(format!("{REFERENCE_LOG}.log")))
        .map_err(Error::io("open the reference's log"))?;
    let mut command = Command::new(run.binary);
    command
        .env("KUBECONFIG", run.kubeconfig)
        .arg("--config")
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(Error::io("open the reference's log"))?,
        )
        .stderr(log);
    Supervised::spawn("the reference sharder", command)
        .map_err(Error::io("start the reference's sharder binary"))
}

/// Waits (up to 2 minutes) until the ring's webhook configuration calls `running`'s webhook and
/// that webhook assigns new objects (probes, deleted after).
async fn wait_until_assigning(m: &Movers, running: &Running) -> Result<(), Error> {
    let url = match running {
        Running::Sharder(_) => None,
        Running::Reference(_) => Some(REFERENCE_URL),
    };
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(m.setup.client.clone());
    let name = m.setup.id().configuration_name();
    let calls = || async {
        let mwc = mwcs.get_opt(&name).await?;
        Ok::<_, kube::Error>(mwc.is_some_and(|mwc| {
            let urls = mwc.webhooks.unwrap_or_default().into_iter();
            let mut urls = urls.map(|w| w.client_config.url.unwrap_or_default());
            urls.all(|u| url.is_none_or(|url| u.starts_with(url)))
        }))
    };
    probe_until(
        &m.setup.secrets(),
        &format!("{name} did not call the webhook, or it did not assign"),
        calls,
        |created| m.setup.shard_of(created).is_some(),
    )
    .await
}

/// Creates probes in `secrets` (once `ready` says so, every 200 ms) until one comes back as
/// `assigned` says, up to 2 minutes (then an error: `what`, within 2 minutes); the probes are
/// deleted after.
async fn probe_until<R, F>(
    secrets: &Api<Secret>,
    what: &str,
    ready: R,
    assigned: impl Fn(&Secret) -> bool,
) -> Result<(), Error>
where
    R: Fn() -> F,
    F: std::future::Future<Output = Result<bool, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut probes = Vec::new();
    let outcome = loop {
        if Instant::now() > deadline {
            break Err(Error::Setup(format!("{what} within 2 minutes")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !ready().await? {
            continue;
        }
        let probe = format!("probe-{}", probes.len());
        let created = secrets
            .create(
                &PostParams::default(),
                &sharder_harness::fixtures::secret(&probe),
            )
            .await?;
        probes.push(probe);
        if assigned(&created) {
            break Ok(());
        }
    };
    delete_all(secrets, probes).await?;
    outcome
}

/// Deletes the Secrets `names` of `api`, 64 at a time.
async fn delete_all(api: &Api<Secret>, names: Vec<String>) -> Result<(), Error> {
    futures::stream::iter(names)
        .map(|name| async move { api.delete(&name, &DeleteParams::default()).await })
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(())
}

/// A warm-up round and `args.rounds` rounds of `args.creates` Secrets at `args.rate`, in turn
/// in a namespace no webhook selects, in one only the floor webhook selects, and in the ring's
/// (the webhook registered now assigns them; they are deleted after); the latency of each pool
/// of creates.
async fn latency(m: &Movers, webhooks: &Webhooks, args: &Args) -> Result<Latency, Error> {
    let client = &m.setup.client;
    let plain_ns = m.cp.namespace("bench-beside-plain").await?;
    let floor_ns = m.cp.namespace("bench-beside-floor").await?;
    let floor_hook = floor_only(client, webhooks, &floor_ns).await?;
    let (plain, floored, ringed) = (
        Creator::of_secrets(client, &plain_ns),
        Creator::of_secrets(client, &floor_ns),
        Creator::of_secrets(client, &m.setup.ns),
    );
    let (mut without, mut floor, mut with, mut created) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..=args.rounds {
        let base = plain
            .samples(
                crate::create_latency::Level::Main,
                &format!("plain-{r}"),
                args.creates,
                args.rate,
            )
            .await;
        let least = floored
            .samples(
                crate::create_latency::Level::Main,
                &format!("floor-{r}"),
                args.creates,
                args.rate,
            )
            .await;
        let hooked = ringed
            .samples(
                crate::create_latency::Level::Main,
                &format!("lat-{r}"),
                args.creates,
                args.rate,
            )
            .await;
        created.extend((0..args.creates).map(|i| format!("lat-{r}-{i}")));
        let failed = base.2 + least.2 + hooked.2;
        if failed > 0 {
            return Err(Error::Setup(format!(
                "{failed} of the latency round's creates failed"
            )));
        }
        // Round 0 warms them up.
        if r > 0 {
            without.extend(base.0);
            floor.push([50.0, 99.0].map(|q| ms(percentile(&least.0, q))));
            with.extend(hooked.0);
        }
    }
    delete_all(&m.setup.secrets(), created).await?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(&floor_hook, &DeleteParams::default())
        .await?;
    let namespaces = Api::<Namespace>::all(client.clone());
    for ns in [plain_ns, floor_ns] {
        namespaces.delete(&ns, &DeleteParams::default()).await?;
    }
    Ok(pooled(with, without, floor))
}

/// Registers the floor webhook for the CREATEs of Secrets in namespace `ns` alone and waits
/// until creates there get its label (probes, deleted after); the configuration's name.
async fn floor_only(client: &kube::Client, webhooks: &Webhooks, ns: &str) -> Result<String, Error> {
    let name = format!("{ns}-floor");
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": { "name": name },
        "webhooks": [{
            "name": "floor.bench.sharder.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "url": format!("https://{}{}", webhooks.floor, crate::floor::FLOOR_PATH),
                "caBundle": ByteString(webhooks.ca_pem.clone().into_bytes()),
            },
            "namespaceSelector": {
                "matchLabels": { "kubernetes.io/metadata.name": ns },
            },
            "rules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["secrets"],
            }],
        }],
    }))
    .map_err(|e| Error::Setup(format!("the floor webhook's configuration: {e}")))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await?;
    probe_until(
        &Api::namespaced(client.clone(), ns),
        &format!("{name} did not call the floor webhook"),
        || async { Ok(true) },
        |created| created.labels().contains_key("floor"),
    )
    .await?;
    Ok(name)
}

/// The percentiles of the pools of create latencies with the webhook and without, beside the
/// floor webhook's rounds.
fn pooled(mut with: Vec<Duration>, mut without: Vec<Duration>, floor: Vec<[f64; 2]>) -> Latency {
    with.sort();
    without.sort();
    let p = |pool: &[Duration], q| ms(percentile(pool, q));
    Latency {
        with: [p(&with, 50.0), p(&with, 99.0)],
        without: [p(&without, 50.0), p(&without, 99.0)],
        floor,
        creates: with.len().min(without.len()),
    }
}

/// One figure of each round.
type Figure = fn(&Figures) -> Option<f64>;

/// The median of `figure` over `rounds` (0 without any).
fn median(rounds: &[Figures], figure: impl Fn(&Figures) -> Option<f64>) -> f64 {
    Spread::of(rounds.iter().filter_map(figure)).map_or(0.0, |s| s.median)
}

/// A contender's figures as its rounds' medians, figure by figure (the CREATE latency of the
/// rounds that measured it: each percentile's median, the floor webhook's rounds all together).
fn medians(rounds: &[Figures]) -> Figures {
    let timing = |of: fn(&Figures) -> Option<&Timing>| {
        rounds.iter().any(|f| of(f).is_some()).then(|| Timing {
            first: median(rounds, |f| of(f).map(|t| t.first)),
            last: median(rounds, |f| of(f).map(|t| t.last)),
            stable: median(rounds, |f| of(f).map(|t| t.stable)),
        })
    };
    Figures {
        latency: latencies(rounds),
        memory: median(rounds, |f| Some(f.memory)),
        moved: rounds.first().map_or(0, |f| f.moved),
        writes: median(rounds, |f| Some(f.writes as f64)).round() as usize,
        scale_out: timing(|f| Some(&f.scale_out)).unwrap_or_default(),
        neighbour_p99: median(rounds, |f| Some(f.neighbour_p99)),
        release: timing(|f| f.release.as_ref()),
        crash: timing(|f| f.crash.as_ref()),
        roll: rounds
            .iter()
            .any(|f| f.roll.is_some())
            .then(|| median(rounds, |f| f.roll.map(|w| w as f64)).round() as usize),
    }
}

/// The CREATE latency of `rounds` (those that measured it) as one: each percentile's median,
/// every round of the floor webhook, the creates of all (`None` where none measured it).
fn latencies(rounds: &[Figures]) -> Option<Latency> {
    let measured: Vec<&Latency> = rounds.iter().filter_map(|f| f.latency.as_ref()).collect();
    if measured.is_empty() {
        return None;
    }
    let of = |pick: fn(&Latency) -> [f64; 2], i: usize| {
        Spread::of(measured.iter().map(|l| pick(l)[i])).map_or(0.0, |s| s.median)
    };
    Some(Latency {
        with: [0, 1].map(|i| of(|l| l.with, i)),
        without: [0, 1].map(|i| of(|l| l.without, i)),
        floor: measured
            .iter()
            .flat_map(|l| l.floor.iter().copied())
            .collect(),
        creates: measured.iter().map(|l| l.creates).sum(),
    })
}

/// The section's text: how it was measured, the figures per size and contender (each the
/// median of its rounds), the goals (decided by the medians, with each side's range).
fn markdown(args: &Args, rows: &[(usize, Vec<Figures>, Vec<Figures>)]) -> String {
    let mut out = format!(
        "The reference's `sharder` binary ({}, built by hand from its release outside the project) and Sharder, each at its defaults, one after the other on the same control plane, ring and objects: a ControllerRing of Secrets on 3 shards of the shard SDK in this process (each at most {SHARD_CONCURRENCY} reconciles at once; the same drain acknowledgement for both: the protocol is the same), every object on its shard. At the first size {} rounds of each contender, interleaved (Sharder, the reference, Sharder, ...), each from the same placement; at the others one. Each round: the contender starts and assigns new objects, the apiserver answers no list of Secrets for {} s (its startup is over), a fourth shard joins, a neighbouring client GETting one of the ring's Secrets over and over meanwhile (one GET after the other, a client of its own: how hard the contender leans on the apiserver); then at the first size{} the fourth shard stops and releases its Lease, joins again, and crashes (its Lease not released, {} s), and the three shards restart one after the other keeping their Leases (stable names, a StatefulSet's rolling update: nothing should move); otherwise the bench puts the objects back itself, with no contender running. Before each round's scale-out at the first size, the CREATE latency with its webhook ({} rounds of {} creates at {}/s after a warm-up round, each right after a round in a namespace no webhook selects and one in a namespace only the floor webhook selects, the least any webhook adds; each pool's creates of the contender's round together, its percentiles: a percentile is a duration, and where the webhook's is not above the pool without it nothing measurable was added; the table and the goals take each percentile's median over the contender's rounds; a CREATE row where both medians are at or below the floor webhook's slowest round is a tie at the floor). Writes per moved object: the contender's and the shards' writes to the objects during the scale-out over the objects moved. For each change: the contender's first write (received) and last write (answered) from the audit log, and stable (every object on its shard of the ring, none draining, seen by the bench's watch), each in seconds from the change. A crash's first move waits for the Lease to expire and be taken over (the same protocol for both): its goals are what follows the takeover. Memory: the peak RSS (VmHWM) of the process that moves the objects, plus for Sharder its webhook's RSS (the reference serves its webhook from the same process). Each figure in the table is the median of the contender's rounds; each goal is decided by the medians and shows the rounds' range in brackets. Sharder's webhook serves every ring of the bench; the reference's process watches every ControllerRing, so the contenders never run at once.\n\n",
        args.reference_version,
        args.reference_rounds,
        SETTLED.as_secs(),
        if args.reference_scale_out_only {
            " (not in this run: `--reference-scale-out-only`)"
        } else {
            ""
        },
        args.lease_seconds,
        args.rounds,
        args.creates,
        args.rate
    );
    out += &table(
        "objects | contender | rounds | CREATE p50 / p99 ms | without a webhook p50 / p99 ms | floor webhook's rounds p50 / p99 ms | added p50 / p99 ms | memory MiB | moved | writes (contender + shards) | writes per moved object | scale-out first / last move / stable s | neighbour GET p99 ms | release first / last move / stable s | crash first / last move / stable s | rolling restart writes",
        rows.iter().flat_map(|(n, sharder, reference)| {
            let both = std::iter::once(("Sharder", sharder));
            both.chain((!reference.is_empty()).then_some(("reference", reference)))
                .map(move |(who, rounds)| {
                    let f = medians(rounds);
                    let pair = |p: fn(&Latency) -> [String; 2]| {
                        f.latency
                            .as_ref()
                            .map_or("-".to_owned(), |l| p(l).join(" / "))
                    };
                    format!(
                        "{n} | {who} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {}",
                        rounds.len(),
                        pair(|l| l.with.map(|v| format!("{v:.2}"))),
                        pair(|l| l.without.map(|v| format!("{v:.2}"))),
                        pair(|l| [0, 1].map(|i| l
                            .floor_range(i)
                            .map_or("-".to_owned(), |(low, high)| format!("{low:.2}-{high:.2}")))),
                        pair(|l| [0, 1].map(|i| l
                            .added(i)
                            .map_or("none measurable".to_owned(), |v| format!("{v:.2}")))),
                        f.memory,
                        f.moved,
                        f.writes,
                        per_moved(&f).unwrap_or_default(),
                        Timing::cells(Some(&f.scale_out)),
                        f.neighbour_p99,
                        Timing::cells(f.release.as_ref()),
                        Timing::cells(f.crash.as_ref()),
                        f.roll.map_or("-".to_owned(), |w| w.to_string()),
                    )
                })
        }),
    );
    if rows.iter().any(|(_, _, r)| r.is_empty()) {
        out += NOT_RUN;
    }
    let mut goal_rows = Vec::new();
    for (n, s, r) in rows {
        if r.is_empty() {
            continue;
        }
        let (sm, rm) = (medians(s), medians(r));
        if let (Some(sl), Some(rl)) = (&sm.latency, &rm.latency) {
            for (i, p) in [(0, "p50"), (1, "p99")] {
                let what = format!(
                    "CREATE latency with the webhook, {p} ({} creates each, {n} objects)",
                    sl.creates.min(rl.creates)
                );
                if let Some(row) = create_goal(what, s, r, i) {
                    goal_rows.push(row);
                }
            }
        }
        let costs: [(&str, Figure, &str); 3] = [
            ("memory", |f| Some(f.memory), "MiB"),
            ("writes per moved object", per_moved, ""),
            (
                "a neighbour's GET p99 during the scale-out",
                |f| Some(f.neighbour_p99),
                "ms",
            ),
        ];
        for (what, figure, unit) in costs {
            if let Some(row) = compare(s, r, figure, |s, r| {
                cost(format!("{what} ({n} objects)"), s, r, unit)
            }) {
                goal_rows.push(row);
            }
        }
        let speeds: [(&str, Figure); 8] = [
            ("scale-out, first move", |f| Some(f.scale_out.first)),
            ("scale-out, last move", |f| Some(f.scale_out.last)),
            ("scale-out, stable", |f| Some(f.scale_out.stable)),
            ("release, first move", |f| f.release.map(|t| t.first)),
            ("release, last move", |f| f.release.map(|t| t.last)),
            ("release, stable", |f| f.release.map(|t| t.stable)),
            // A crash's first move waits for the Lease: what follows the takeover.
            ("crash, first move to last", |f| {
                f.crash.map(|t| t.last - t.first)
            }),
            ("crash, first move to stable", |f| {
                f.crash.map(|t| t.stable - t.first)
            }),
        ];
        for (what, figure) in speeds {
            if let Some(row) = compare(s, r, figure, |s, r| {
                speed(format!("{what} ({n} objects)"), s, r)
            }) {
                goal_rows.push(row);
            }
        }
        let roll = |f: &Figures| f.roll.map(|w| w as f64);
        if let Some(row) = compare(s, r, roll, |(s, sn), (r, rn)| {
            (
                format!(
                    "a rolling restart of the shards, Leases kept: writes to the objects ({n} objects)"
                ),
                format!("{} vs {}", s.text("", sn), r.text("", rn)),
                "0 in every round of Sharder's",
                s.high == 0.0,
            )
        }) {
            goal_rows.push(row);
        }
    }
    if !goal_rows.is_empty() {
        out += &goals(&goal_rows);
    }
    if args.reference.is_some() && args.sections.contains(&crate::Section::Idle) {
        out += "The reference's own binary's idle cost is in section 8.\n\n";
    }
    out
}

/// The bound of the CREATE latency rows.
const CREATE_BOUND: &str = "<= 1.0x, or both within the floor webhook's rounds (a tie)";

/// A CREATE latency row at percentile `i` (0: p50, 1: p99) of Sharder's rounds `s` and the
/// reference's `r` (each round's percentile of its own creates): a tie at the floor where both
/// medians are at or below the slowest round of the floor webhook (the least any webhook adds,
/// as it varies between rounds), otherwise decided by the medians as any cost. `None` where
/// either measured no latency.
fn create_goal(
    what: String,
    s: &[Figures],
    r: &[Figures],
    i: usize,
) -> Option<crate::report::Goal> {
    let floors = s.iter().chain(r).filter_map(|f| f.latency.as_ref());
    let floor = Spread::of(floors.flat_map(|l| l.floor.iter().map(|p| p[i])));
    let with = |f: &Figures| f.latency.as_ref().map(|l| l.with[i]);
    let (sw, rw) = (rounds_spread(s, with)?, rounds_spread(r, with)?);
    Some(match floor {
        Some(f) if sw.0.median <= f.high && rw.0.median <= f.high => (
            what,
            format!(
                "{} vs {}, both within the floor webhook's rounds ({:.2}-{:.2}ms): a tie at the floor",
                sw.0.text("ms", sw.1),
                rw.0.text("ms", rw.1),
                f.low,
                f.high
            ),
            CREATE_BOUND,
            true,
        ),
        _ => {
            let (what, figure, _, met) = cost(what, sw, rw, "ms");
            let floor = floor.map_or(String::new(), |f| {
                format!(" (the floor webhook's rounds {:.2}-{:.2}ms)", f.low, f.high)
            });
            (what, figure + &floor, CREATE_BOUND, met)
        }
    })
}

/// Writes per moved object.
fn per_moved(f: &Figures) -> Option<f64> {
    (f.moved > 0).then(|| f.writes as f64 / f.moved as f64)
}

/// The goal row `row` makes of `figure`'s spread over Sharder's rounds `s` and the
/// reference's `r`, each with its count of rounds (`None` where either has none).
fn compare(
    s: &[Figures],
    r: &[Figures],
    figure: Figure,
    row: impl Fn((Spread, usize), (Spread, usize)) -> crate::report::Goal,
) -> Option<crate::report::Goal> {
    Some(row(rounds_spread(s, figure)?, rounds_spread(r, figure)?))
}

/// `figure`'s spread over `rounds` and how many rounds had it (`None` where none had).
fn rounds_spread(
    rounds: &[Figures],
    figure: impl Fn(&Figures) -> Option<f64>,
) -> Option<(Spread, usize)> {
    let values: Vec<f64> = rounds.iter().filter_map(figure).collect();
    let n = values.len();
    Spread::of(values.into_iter()).map(|s| (s, n))
}

/// A cost row: Sharder's figure against the reference's, met when its median is at or below.
fn cost(
    what: String,
    (sharder, sn): (Spread, usize),
    (reference, rn): (Spread, usize),
    unit: &str,
) -> crate::report::Goal {
    let ratio = sharder.median / reference.median;
    let figure = format!(
        "{} vs {} = {}",
        sharder.text(unit, sn),
        reference.text(unit, rn),
        ratio_text(ratio)
    );
    (what, figure, "<= 1.0x", sharder.median <= reference.median)
}

/// A speed row from two durations (s): the reference's median over Sharder's, met at or above
/// 1.
fn speed(
    what: String,
    (sharder, sn): (Spread, usize),
    (reference, rn): (Spread, usize),
) -> crate::report::Goal {
    let ratio = reference.median / sharder.median;
    let figure = format!(
        "{} vs {} = {} as fast",
        sharder.text(" s", sn),
        reference.text(" s", rn),
        ratio_text(ratio)
    );
    (what, figure, ">= 1.0x", sharder.median <= reference.median)
}

/// A ratio as the report prints it; one of a figure at or below zero means nothing.
fn ratio_text(ratio: f64) -> String {
    if ratio.is_finite() && ratio > 0.0 {
        format!("{ratio:.2}x")
    } else {
        "no ratio".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_reference_s_binary_sharder_s_figures_stand_alone() {
        let args = <Args as clap::Parser>::parse_from(["sharder-bench"]);
        let sharder = Figures {
            memory: 20.0,
            ..Figures::default()
        };
        let text = markdown(&args, &[(100, vec![sharder], Vec::new())]);
        assert!(
            text.contains("| 100 | Sharder | 1 | - | - | - | - | 20.0 |"),
            "{text}"
        );
        assert!(text.contains(NOT_RUN), "{text}");
        assert!(
            !text.contains("| reference |") && !text.contains("| goal |"),
            "{text}"
        );
    }

    #[test]
    fn each_row_holds_sharder_against_the_reference_as_a_cost_or_a_speed() {
        let args = <Args as clap::Parser>::parse_from(["sharder-bench", "--reference", "/ref"]);
        let timing = |first, last, stable| Timing {
            first,
            last,
            stable,
        };
        let sharder = Figures {
            latency: Some(Latency {
                with: [3.0, 9.0],
                without: [2.0, 9.5],
                floor: vec![[2.5, 7.0], [2.8, 8.5]],
                creates: 2000,
            }),
            memory: 20.0,
            moved: 2500,
            writes: 5000,
            scale_out: timing(0.1, 4.0, 10.0),
            neighbour_p99: 12.0,
            release: Some(timing(0.2, 3.0, 4.0)),
            crash: Some(timing(20.0, 22.0, 24.0)),
            roll: Some(0),
        };
        let reference = Figures {
            latency: Some(Latency {
                with: [4.0, 8.0],
                without: [2.5, 6.0],
                floor: vec![[2.6, 7.5]],
                creates: 2000,
            }),
            memory: 80.0,
            moved: 2500,
            writes: 7500,
            scale_out: timing(0.2, 3.0, 5.0),
            neighbour_p99: 10.0,
            release: Some(timing(0.1, 3.5, 5.0)),
            crash: Some(timing(19.0, 22.0, 26.0)),
            roll: Some(0),
        };
        let later = |f: &Figures| Figures {
            latency: None,
            release: None,
            crash: None,
            roll: None,
            ..f.clone()
        };
        let text = markdown(
            &args,
            &[
                (10_000, vec![sharder.clone()], vec![reference.clone()]),
                (100_000, vec![later(&sharder)], vec![later(&reference)]),
            ],
        );
        assert!(
            text.contains("| 100000 | Sharder | 1 | - | - | - | - | 20.0 | 2500 | 5000 | 2.00 | 0.10 / 4.00 / 10.00 | 12.00 | - | - | - |")
                && text.contains("| memory (100000 objects) |")
                && !text.contains("crash, first move to last (100000 objects)")
                && !text.contains("release, stable (100000 objects)")
                && !text.contains("rolling restart of the shards, Leases kept: writes to the objects (100000 objects)"),
            "a release, a crash and a roll only at the first size: {text}"
        );
        for row in [
            "| 10000 | Sharder | 1 | 3.00 / 9.00 | 2.00 / 9.50 | 2.50-2.80 / 7.00-8.50 | 1.00 / none measurable | 20.0 | 2500 | 5000 | 2.00 | 0.10 / 4.00 / 10.00 | 12.00 | 0.20 / 3.00 / 4.00 | 20.00 / 22.00 / 24.00 | 0 |",
            "| 10000 | reference | 1 | 4.00 / 8.00 | 2.50 / 6.00 | 2.60-2.60 / 7.50-7.50 | 1.50 / 2.00 | 80.0 | 2500 | 7500 | 3.00 |",
            "| CREATE latency with the webhook, p50 (2000 creates each, 10000 objects) | 3.00ms vs 4.00ms = 0.75x (the floor webhook's rounds 2.50-2.80ms) | <= 1.0x, or both within the floor webhook's rounds (a tie) | met |",
            "| CREATE latency with the webhook, p99 (2000 creates each, 10000 objects) | 9.00ms vs 8.00ms = 1.12x (the floor webhook's rounds 7.00-8.50ms) | <= 1.0x, or both within the floor webhook's rounds (a tie) | **missed** |",
            "| a rolling restart of the shards, Leases kept: writes to the objects (10000 objects) | 0.00 vs 0.00 | 0 in every round of Sharder's | met |",
            "| memory (10000 objects) | 20.00MiB vs 80.00MiB = 0.25x | <= 1.0x | met |",
            "| writes per moved object (10000 objects) | 2.00 vs 3.00 = 0.67x | <= 1.0x | met |",
            "| a neighbour's GET p99 during the scale-out (10000 objects) | 12.00ms vs 10.00ms = 1.20x | <= 1.0x | **missed** |",
            "| scale-out, first move (10000 objects) | 0.10 s vs 0.20 s = 2.00x as fast | >= 1.0x | met |",
            "| scale-out, last move (10000 objects) | 4.00 s vs 3.00 s = 0.75x as fast | >= 1.0x | **missed** |",
            "| scale-out, stable (10000 objects) | 10.00 s vs 5.00 s = 0.50x as fast | >= 1.0x | **missed** |",
            "| release, first move (10000 objects) | 0.20 s vs 0.10 s = 0.50x as fast | >= 1.0x | **missed** |",
            "| release, stable (10000 objects) | 4.00 s vs 5.00 s = 1.25x as fast | >= 1.0x | met |",
            "| crash, first move to last (10000 objects) | 2.00 s vs 3.00 s = 1.50x as fast | >= 1.0x | met |",
            "| crash, first move to stable (10000 objects) | 4.00 s vs 7.00 s = 1.75x as fast | >= 1.0x | met |",
        ] {
            assert!(text.contains(row), "{row}\n{text}");
        }
    }

    #[test]
    fn rounds_are_told_by_their_medians_and_the_goals_show_their_range() {
        let args = <Args as clap::Parser>::parse_from(["sharder-bench", "--reference", "/ref"]);
        let round = |stable: f64, neighbour: f64, p99: Option<f64>| Figures {
            latency: p99.map(|p99| Latency {
                with: [3.0, p99],
                without: [2.0, 9.5],
                floor: vec![[3.1, 8.0], [2.9, 9.5]],
                creates: 2000,
            }),
            memory: 20.0 + stable,
            moved: 100,
            writes: 200,
            scale_out: Timing {
                first: 0.1,
                last: stable - 1.0,
                stable,
            },
            neighbour_p99: neighbour,
            release: None,
            crash: None,
            roll: Some(if stable > 10.0 { 2 } else { 0 }),
        };
        // Sharder's median stable 6 (a slow round of 20 does not decide), the reference's 5.5
        // (the mean of two); Sharder's CREATE p99 9 ms (a round of 30 does not decide either),
        // the reference's measured in one round.
        let sharder = vec![
            round(6.0, 30.0, Some(9.0)),
            round(20.0, 10.0, Some(30.0)),
            round(5.0, 20.0, Some(8.0)),
        ];
        let reference = vec![round(5.0, 25.0, Some(9.0)), round(6.0, 15.0, None)];
        let text = markdown(&args, &[(10_000, sharder, reference)]);
        for row in [
            "| 10000 | Sharder | 3 | 3.00 / 9.00 | 2.00 / 9.50 | 2.90-3.10 / 8.00-9.50 | 1.00 / none measurable | 26.0 | 100 | 200 | 2.00 | 0.10 / 5.00 / 6.00 | 20.00 | - | - | 0 |",
            "| 10000 | reference | 2 | 3.00 / 9.00 |",
            "| scale-out, stable (10000 objects) | 6.00 s [5.00-20.00] vs 5.50 s [5.00-6.00] = 0.92x as fast | >= 1.0x | **missed** |",
            "| a neighbour's GET p99 during the scale-out (10000 objects) | 20.00ms [10.00-30.00] vs 20.00ms [15.00-25.00] = 1.00x | <= 1.0x | met |",
            "| CREATE latency with the webhook, p50 (2000 creates each, 10000 objects) | 3.00ms [3.00-3.00] vs 3.00ms, both within the floor webhook's rounds (2.90-3.10ms): a tie at the floor | <= 1.0x, or both within the floor webhook's rounds (a tie) | met |",
            "| CREATE latency with the webhook, p99 (2000 creates each, 10000 objects) | 9.00ms [8.00-30.00] vs 9.00ms, both within the floor webhook's rounds (8.00-9.50ms): a tie at the floor | <= 1.0x, or both within the floor webhook's rounds (a tie) | met |",
            // One round of three wrote to the objects: the median is 0, the verdict is not.
            "| a rolling restart of the shards, Leases kept: writes to the objects (10000 objects) | 0.00 [0.00-2.00] vs 0.00 [0.00-0.00] | 0 in every round of Sharder's | **missed** |",
        ] {
            assert!(text.contains(row), "{row}\n{text}");
        }
    }

    #[test]
    fn a_spread_is_the_median_and_the_range_of_its_rounds() {
        let of = |v: &[f64]| Spread::of(v.iter().copied());
        assert_eq!(of(&[]), None);
        let one = of(&[2.0]).expect("one");
        assert_eq!((one.median, one.low, one.high), (2.0, 2.0, 2.0));
        assert_eq!(one.text(" s", 1), "2.00 s");
        let three = of(&[9.0, 1.0, 4.0]).expect("three");
        assert_eq!((three.median, three.low, three.high), (4.0, 1.0, 9.0));
        assert_eq!(three.text("ms", 3), "4.00ms [1.00-9.00]");
        assert_eq!(of(&[1.0, 4.0, 2.0, 9.0]).expect("four").median, 3.0);
    }

    #[test]
    fn a_pool_s_percentiles_are_durations_and_no_gain_is_not_an_added_figure() {
        let pool = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect();
        let latency = pooled(
            pool(&[60, 3, 6, 5]),
            pool(&[4, 90, 3, 5]),
            vec![[2.0, 30.0], [1.0, 40.0]],
        );
        assert_eq!(latency.floor_range(0), Some((1.0, 2.0)));
        assert_eq!(latency.floor_range(1), Some((30.0, 40.0)));
        assert_eq!(latency.with, [5.0, 60.0]);
        assert_eq!(latency.without, [4.0, 90.0]);
        assert_eq!(latency.creates, 4);
        assert_eq!(latency.added(0), Some(1.0));
        assert_eq!(
            latency.added(1),
            None,
            "p99 60 ms against 90 ms adds nothing"
        );
    }

    #[test]
    fn a_ratio_of_a_figure_at_or_below_zero_is_not_printed() {
        assert_eq!(ratio_text(-0.5), "no ratio");
        assert_eq!(ratio_text(f64::INFINITY), "no ratio");
        assert_eq!(ratio_text(0.5), "0.50x");
    }
}
