//! Section 8, what a quiet ring costs the control plane. For each size, a ring of that many Secrets
//! (assigned, in a namespace of their own) with 3 shard Leases held for an hour, nothing
//! changing, beside a namespace of another ring's Secrets (`--idle-others`), and windows of the
//! same length in turn: nothing more running (the control, before and after the others); the
//! sharder reconciler sweeping every [`SWEEP_IN_WINDOW`], and renewing its leader Lease every
//! [`RENEW_IN_WINDOW`] (its full resync, every 6 hours, does not come in a window: it is counted
//! at the measured cost of its list); the reference implementation's requests (per resource of
//! the ring a metadata-only list across the cluster at `resourceVersion=0` every 5 minutes,
//! replayed by the bench [`LISTS_PER_WINDOW`] times in a window, and its leader election's
//! Lease update every 2 s, replayed every [`RENEW_IN_WINDOW`]); a metadata reflector once it
//! holds every object (what a cache-based design pays at idle). Compressed schedules are scaled
//! back by what ran (sweeps, lists, renewals), so the signal stands above the control's noise.
//! Each design is reported as the apiserver's and etcd's CPU above the control's, and the lists
//! the apiserver sent to etcd, per hour at the real schedule.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use sharder_common::Ring;
use sharder_harness::ControlPlane;
use sharder_harness::launch::dump_logs;
use sharder_harness::wait::{Rebalances, apiserver_metrics, metric_sum};

use crate::beside::{REFERENCE_LOG, ReferenceRun, start_reference};
use crate::progress::progress;
use crate::report::{goals, table};
use crate::stats::cpu_seconds;
use crate::webhooks::{Webhooks, metadata_cache};
use crate::{Args, Error, RingSetup, each_metadata};

/// The reconciler's default `--sweep-interval`.
const SWEEP: Duration = Duration::from_secs(300);
/// The reconciler's default `--resync-interval`.
const RESYNC: Duration = Duration::from_secs(6 * 3600);
/// The reference implementation's resync period.
const REFERENCE_RESYNC: Duration = Duration::from_secs(300);
/// The reconciler's `--sweep-interval` in its window.
const SWEEP_IN_WINDOW: Duration = Duration::from_secs(1);
/// The reconciler's default `--leader-election-renew`.
const RENEW: Duration = Duration::from_secs(5);
/// The reconciler's `--leader-election-renew` in its leader election window (no sweep then), and
/// the reference's leader election renewals in theirs.
const RENEW_IN_WINDOW: Duration = Duration::from_millis(50);
/// The reference's leader election renews every 2 s (controller-runtime's retry period).
const REFERENCE_RENEW: Duration = Duration::from_secs(2);
/// The reference's lists in a window (each starts on its schedule, or when the last ended).
const LISTS_PER_WINDOW: u32 = 10;
/// The sharder's full lists measured for the cost of its resync.
const RESYNC_LISTS: u32 = 3;

/// The designs, as the report names them. The sharder reconciler's cost is the sum of two
/// windows, its sweeps (and resyncs) and its leader election (and watches), each compressed by
/// its own schedule; the reference's the sum of its lists' and its leader election's.
const SHARDER: &str = "sharder reconciler: sweeps and resyncs";
const SHARDER_LEADER: &str = "sharder reconciler: leader election and watches";
const REFERENCE: &str = "reference: resync lists (every 5 min)";
const REFERENCE_LEADER: &str = "reference: leader election (renewed every 2 s)";
const REFLECTOR: &str = "metadata reflector (after its first list)";
/// The reference's own binary (`--reference`), in two windows as the sharder's.
const REFERENCE_BINARY: &str = "reference binary: resync lists";
const REFERENCE_BINARY_LEADER: &str = "reference binary: leader election and watches";

/// How many times faster than real `done` runs of a schedule of `period` ran in `window`.
fn speedup(done: usize, period: Duration, window: Duration) -> f64 {
    done as f64 * period.as_secs_f64() / window.as_secs_f64()
}

/// The apiserver's and etcd's CPU seconds together, and the lists the apiserver sent to etcd
/// (`etcd_request_duration_seconds_count`, operations `list` and `listStream`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Usage {
    cpu: f64,
    etcd_lists: f64,
}

impl Usage {
    /// A usage of `cpu` CPU seconds and `etcd_lists` lists.
    fn new(cpu: f64, etcd_lists: f64) -> Self {
        Self { cpu, etcd_lists }
    }

    /// `f` of both figures of `self` and `other`.
    fn with(self, other: Self, f: impl Fn(f64, f64) -> f64) -> Self {
        Self::new(f(self.cpu, other.cpu), f(self.etcd_lists, other.etcd_lists))
    }
}

/// One design's window: its name, what it used (the control's included), how many times faster
/// than real its schedule ran, what is counted per hour from elsewhere (the sharder's resyncs),
/// and what ran in the window.
#[derive(Clone, Debug)]
struct Design(&'static str, Usage, f64, Usage, String);

/// One size's windows.
#[derive(Clone, Debug)]
struct IdleRow {
    objects: usize,
    window: Duration,
    /// The control windows, before and after the designs.
    control: [Usage; 2],
    designs: Vec<Design>,
}

impl IdleRow {
    /// The control's usage per window: the mean of the two.
    fn control(&self) -> Usage {
        self.control[0].with(self.control[1], |a, b| (a + b) / 2.0)
    }

    /// `design`'s usage per hour above the control, at its real schedule.
    fn per_hour(&self, Design(_, usage, speedup, counted, _): &Design) -> Usage {
        let scale = 3600.0 / self.window.as_secs_f64() / speedup;
        let above = usage.with(self.control(), |u, c| (u - c).max(0.0) * scale);
        above.with(*counted, |a, c| a + c)
    }

    /// How far the two control windows' CPU differ, per hour at `design`'s compression: a
    /// figure of the design within it is noise.
    fn spread(&self, Design(_, _, speedup, _, _): &Design) -> f64 {
        let scale = 3600.0 / self.window.as_secs_f64() / speedup;
        (self.control[0].cpu - self.control[1].cpu).abs() * scale
    }

    /// The CPU seconds per hour of the design named `name`, if it ran.
    fn cpu_per_hour(&self, name: &str) -> Option<f64> {
        self.designs
            .iter()
            .find(|d| d.0 == name)
            .map(|d| self.per_hour(d).cpu)
    }

    /// The sharder reconciler's CPU seconds per hour: its sweeps' and its leader election's.
    fn sharder(&self) -> Option<f64> {
        Some(self.cpu_per_hour(SHARDER)? + self.cpu_per_hour(SHARDER_LEADER).unwrap_or(0.0))
    }

    /// The reference's CPU seconds per hour as the bench replays it: its lists' and its leader
    /// election's.
    fn reference(&self) -> Option<f64> {
        Some(self.cpu_per_hour(REFERENCE)? + self.cpu_per_hour(REFERENCE_LEADER).unwrap_or(0.0))
    }

    /// The reference's own binary's CPU seconds per hour, when it ran: both its windows.
    fn reference_binary(&self) -> Option<f64> {
        Some(
            self.cpu_per_hour(REFERENCE_BINARY)?
                + self.cpu_per_hour(REFERENCE_BINARY_LEADER).unwrap_or(0.0),
        )
    }
}

/// Measures the apiserver's and etcd's usage over windows of one length.
struct Meter {
    cp: &'static ControlPlane,
    client: Client,
    window: Duration,
}

impl Meter {
    /// The apiserver's and etcd's CPU seconds and etcd lists so far.
    async fn usage(&self) -> Result<Usage, Error> {
        let metrics = apiserver_metrics(&self.client).await?;
        let lists = ["list", "listStream"]
            .iter()
            .map(|op| {
                metric_sum(
                    &metrics,
                    "etcd_request_duration_seconds_count",
                    &[("operation", op)],
                )
            })
            .sum();
        Ok(Usage::new(
            self.cp.pids().iter().filter_map(|p| cpu_seconds(*p)).sum(),
            lists,
        ))
    }

    /// What the apiserver and etcd used over a window while `during` ran (dropped at its end).
    async fn measure(&self, during: impl Future<Output = ()>) -> Result<Usage, Error> {
        let before = self.usage().await?;
        tokio::select! {
            () = tokio::time::sleep(self.window) => {}
            () = during => tokio::time::sleep(self.window).await,
        }
        Ok(self.usage().await?.with(before, |a, b| a - b))
    }

    /// What `work` used, its run time's share of the control window `control` taken off.
    async fn cost_of(
        &self,
        control: Usage,
        work: impl Future<Output = ()>,
    ) -> Result<Usage, Error> {
        let before = self.usage().await?;
        let started = Instant::now();
        work.await;
        let share = started.elapsed().as_secs_f64() / self.window.as_secs_f64();
        let used = self.usage().await?.with(before, |a, b| a - b);
        Ok(used.with(control, |u, c| (u - c * share).max(0.0)))
    }

    /// A window of the reconciler running with `flags` on `setup`'s ring of `n` objects (from
    /// its first full rebalance on): what it used, its rebalances and what they listed.
    async fn reconciler(
        &self,
        setup: &RingSetup,
        webhooks: &Webhooks,
        n: usize,
        flags: &str,
    ) -> Result<(Usage, usize, String), Error> {
        let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
        let reconciler = setup
            .start_reconciler(dir.path(), self.cp.kubeconfig(), webhooks, flags, n)
            .await?;
        let before = reconciler.rebalances(&setup.id()).await;
        let used = self.measure(async {}).await?;
        let (count, what) = rebalances(&reconciler.rebalances(&setup.id()).await.since(&before));
        Ok((used, count, what))
    }

    /// Two windows of the reference's own `binary` over `setup`'s ring, each from the end of its
    /// startup on ([`startup_over`]), its leader election renewing every [`RENEW_IN_WINDOW`]:
    /// with its resync pushed past the window (its leader election and watches), then every
    /// [`LISTS_PER_WINDOW`]th of a window.
    async fn reference_binary(
        &self,
        setup: &RingSetup,
        webhooks: &Webhooks,
        binary: &Path,
    ) -> Result<[BinaryWindow; 2], Error> {
        let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
        let run = ReferenceRun {
            binary,
            dir: dir.path(),
            kubeconfig: self.cp.kubeconfig(),
            namespace: &setup.ns,
        };
        let mut windows = [BinaryWindow::default(); 2];
        let mut startup = None;
        for (window, sync) in windows
            .iter_mut()
            .zip([Duration::from_secs(3600), self.window / LISTS_PER_WINDOW])
        {
            let before = self.secret_lists().await?;
            let mut process = start_reference(&run, webhooks, Some(sync), Some(RENEW_IN_WINDOW))?;
            let started = Instant::now();
            let mut last = (before, Instant::now());
            loop {
                if process.try_wait().is_some() || started.elapsed() > Duration::from_secs(120) {
                    process.stop(Duration::from_secs(5));
                    dump_logs(dir.path(), [REFERENCE_LOG.to_owned()], 40);
                    return Err(Error::Setup(
                        "the reference's binary did not list the ring's Secrets and end its \
                         startup within 2 minutes"
                            .into(),
                    ));
                }
                let now = self.secret_lists().await?;
                if now != last.0 {
                    last = (now, Instant::now());
                }
                if startup_over(&mut startup, now - before, last.1.elapsed()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let from = [self.secret_lists().await?, self.lease_updates().await?];
            let used = self.measure(async {}).await?;
            let lists = self.secret_lists().await? - from[0];
            let renewals = self.lease_updates().await? - from[1];
            process.stop(Duration::from_secs(20));
            *window = BinaryWindow {
                used,
                lists: lists as usize,
                renewals: renewals as usize,
            };
        }
        Ok(windows)
    }

    /// The lists of Secrets the apiserver answered so far.
    async fn secret_lists(&self) -> Result<f64, Error> {
        secret_lists(&self.client).await
    }

    /// The updates of Leases the apiserver answered so far (client-go's leader election renews
    /// with one).
    async fn lease_updates(&self) -> Result<f64, Error> {
        requests(&self.client, "leases", "PUT").await
    }
}

/// One window of the reference's binary: what the apiserver and etcd used, and the lists of
/// Secrets and updates of Leases (its leader election's renewals) the apiserver answered.
#[derive(Clone, Copy, Debug, Default)]
struct BinaryWindow {
    used: Usage,
    lists: usize,
    renewals: usize,
}

/// The requests of `verb` on `resource` the apiserver answered so far (`apiserver_request_total`).
async fn requests(client: &Client, resource: &str, verb: &str) -> Result<f64, Error> {
    let metrics = apiserver_metrics(client).await?;
    let labels = [("resource", resource), ("verb", verb)];
    Ok(metric_sum(&metrics, "apiserver_request_total", &labels))
}

/// The lists of Secrets the apiserver answered so far.
pub(crate) async fn secret_lists(client: &Client) -> Result<f64, Error> {
    requests(client, "secrets", "LIST").await
}

/// How long the reference's binary must have listed no Secrets before its first window starts:
/// its startup (its caches' lists, its first reconcile of the ring) is over then.
const STARTUP_QUIET: Duration = Duration::from_secs(10);

/// Whether the reference's binary ended its startup, having answered `listed` lists of Secrets
/// since it started, the last `quiet` ago: in its first run once it listed and went quiet for
/// [`STARTUP_QUIET`] (`startup` then holds how many lists that took), in the next once it
/// listed as many (its resyncs would never leave it quiet that long).
fn startup_over(startup: &mut Option<f64>, listed: f64, quiet: Duration) -> bool {
    match *startup {
        Some(lists) => listed >= lists,
        None if listed >= 1.0 && quiet >= STARTUP_QUIET => {
            *startup = Some(listed);
            true
        }
        None => false,
    }
}

/// Section 8, size by size: the other ring's Secrets are in the cluster from [`Idle::start`]
/// to [`Idle::finish`].
pub(crate) struct Idle {
    meter: Meter,
    others: RingSetup,
    rows: Vec<IdleRow>,
}

impl Idle {
    /// Creates the other ring's Secrets (`args.idle_others`, labelled with its shards: never
    /// this ring's).
    pub(crate) async fn start(cp: &'static ControlPlane, args: &Args) -> Result<Self, Error> {
        let meter = Meter {
            cp,
            client: cp.client().await?,
            window: Duration::from_secs(args.idle_window_seconds),
        };
        let others = RingSetup::new(cp, "bench-idle-others", false, 0).await?;
        others
            .create_assigned(
                0..args.idle_others,
                &Ring::new((0..3).map(|i| format!("other-{i}"))),
            )
            .await?;
        Ok(Self {
            meter,
            others,
            rows: Vec::new(),
        })
    }

    /// Measures the windows of `objects` (a ControllerRing, the kind the reference's binary
    /// serves, of `n` Secrets on 3 shard Leases); leaves it as it was.
    pub(crate) async fn size(
        &mut self,
        webhooks: &Webhooks,
        objects: &RingSetup,
        n: usize,
        reference: Option<&Path>,
    ) -> Result<(), Error> {
        let row = size(&self.meter, webhooks, objects, n, reference).await?;
        self.rows.push(row);
        Ok(())
    }

    /// The section's text of the sizes measured.
    pub(crate) fn text(&self, args: &Args) -> String {
        markdown(&self.rows, args.idle_others)
    }

    /// Deletes the other ring's Secrets and waits until every deletion ended (the sections
    /// after this one measure too).
    pub(crate) async fn finish(self) -> Result<(), Error> {
        self.others.remove(false).await?;
        quiet(&self.meter.client).await
    }
}

/// The windows of the ring of `setup` with `n` objects; those of the reference's own binary too
/// when given.
async fn size(
    meter: &Meter,
    webhooks: &Webhooks,
    setup: &RingSetup,
    n: usize,
    reference_binary: Option<&Path>,
) -> Result<IdleRow, Error> {
    quiet(&meter.client).await?;
    progress!("  {n} objects: the control window, then the sharder's two");
    let first_control = meter.measure(async {}).await?;
    let renew = format!("{}ms", RENEW_IN_WINDOW.as_millis());
    let flags = format!("--sweep-interval 1h --leader-election-renew {renew}");
    let (leader, swept, _) = meter.reconciler(setup, webhooks, n, &flags).await?;
    let (sweep, resync) = (SWEEP_IN_WINDOW.as_millis(), RESYNC.as_secs());
    let flags = format!("--sweep-interval {sweep}ms --resync-interval {resync}s");
    let (sharder, sweeps, what) = meter.reconciler(setup, webhooks, n, &flags).await?;
    if swept != 0 || sweeps == 0 {
        return Err(Error::Setup(format!(
            "at {n} objects the reconciler swept {swept} times in its leader election window, {sweeps} in its sweeps'"
        )));
    }
    // Without its binary, the reference's requests replayed: its resync and its leader
    // election, each in a window of its own.
    let replayed = match reference_binary {
        Some(_) => None,
        None => Some(replay(meter, setup).await?),
    };
    let binary = match reference_binary {
        Some(binary) => Some(meter.reference_binary(setup, webhooks, binary).await?),
        None => None,
    };
    let mut cache = metadata_cache(meter.cp, &setup.ns, n).await?;
    let reflector = meter.measure(async {}).await?;
    cache.kill();
    let last_control = meter.measure(async {}).await?;
    let control = first_control.with(last_control, |a, b| (a + b) / 2.0);
    // The sharder's full resync: the list of everything its rebalance makes (the ring's one
    // namespace, consistent, 500 to a page), at its measured cost.
    let api = setup.secrets();
    let full = meter
        .cost_of(control, async {
            for _ in 0..RESYNC_LISTS {
                let _ = each_metadata(&api, None, |_| {}).await;
            }
        })
        .await?;
    let resyncs = 3600.0 / RESYNC.as_secs_f64();
    let counted = full.with(Usage::default(), |f, _| {
        resyncs * f / f64::from(RESYNC_LISTS)
    });
    let window = meter.window;
    let mut row = IdleRow {
        objects: n,
        window,
        control: [first_control, last_control],
        designs: vec![
            Design(
                SHARDER,
                sharder,
                speedup(sweeps, SWEEP, window),
                counted,
                format!(
                    "{what}; its full resyncs ({resyncs:.2} an hour) at the measured cost of its list"
                ),
            ),
            Design(
                SHARDER_LEADER,
                leader,
                RENEW.as_secs_f64() / RENEW_IN_WINDOW.as_secs_f64(),
                Usage::default(),
                format!("renewals every {renew}, no sweep"),
            ),
            Design(
                REFLECTOR,
                reflector,
                1.0,
                Usage::default(),
                "one watch".into(),
            ),
        ],
    };
    if let Some([(reference, lists), (reference_leader, renewals)]) = replayed {
        row.designs.push(Design(
            REFERENCE,
            reference,
            speedup(lists, REFERENCE_RESYNC, window),
            Usage::default(),
            format!("{lists} lists"),
        ));
        row.designs.push(Design(
            REFERENCE_LEADER,
            reference_leader,
            speedup(renewals, REFERENCE_RENEW, window),
            Usage::default(),
            format!("{renewals} renewals every {renew}"),
        ));
    }
    if let Some(windows) = binary {
        row.designs
            .extend(reference_binary_designs(windows, row.control(), window));
    }
    for design in &row.designs {
        progress!(
            "  {n}: {}: {:.1} CPU-s/h",
            design.0,
            row.per_hour(design).cpu
        );
    }
    Ok(row)
}

/// The reference binary's two windows as designs: its lists' window above its leader
/// election's, compressed by the lists the apiserver answered; its leader election's by the
/// renewals it answered against the default schedule ([`REFERENCE_RENEW`]), as the sharder's.
fn reference_binary_designs(
    [quiet, listing]: [BinaryWindow; 2],
    control: Usage,
    window: Duration,
) -> [Design; 2] {
    // Its lists' window holds its leader election too: what it used above the other.
    let above = listing
        .used
        .with(quiet.used, |l, q| (l - q).max(0.0))
        .with(control, |a, c| a + c);
    let (listed, quiet_lists) = (listing.lists, quiet.lists);
    [
        Design(
            REFERENCE_BINARY,
            above,
            speedup(listed, REFERENCE_RESYNC, window),
            Usage::default(),
            format!(
                "{listed} lists of Secrets with `syncPeriod` {}ms, less its other window",
                (window / LISTS_PER_WINDOW).as_millis()
            ),
        ),
        Design(
            REFERENCE_BINARY_LEADER,
            quiet.used,
            speedup(quiet.renewals, REFERENCE_RENEW, window),
            Usage::default(),
            format!(
                "`syncPeriod` 1h, `retryPeriod` {}ms: {} renewals ({quiet_lists} lists of Secrets)",
                RENEW_IN_WINDOW.as_millis(),
                quiet.renewals
            ),
        ),
    ]
}

/// The reference's requests replayed over `setup`'s ring, in two windows: its resync lists and
/// its leader election; each window's usage and how many of its requests ran.
async fn replay(meter: &Meter, setup: &RingSetup) -> Result<[(Usage, usize); 2], Error> {
    // The reference's resync: a list of each resource of the ring across the cluster, metadata
    // only, from the watch cache (`resourceVersion=0`: the apiserver ignores `limit` then).
    let all = Api::<Secret>::all(meter.client.clone());
    let cached = ListParams::default().match_any().limit(500);
    let (every, mut lists) = (meter.window / LISTS_PER_WINDOW, 0);
    let reference = meter
        .measure(async {
            let started = Instant::now();
            loop {
                lists += u32::from(all.list_metadata(&cached).await.is_ok());
                tokio::time::sleep((every * lists).saturating_sub(started.elapsed())).await;
            }
        })
        .await?;
    // Its leader election: client-go's leader updates its Lease, as it last read it, every
    // retry period.
    let leases = Api::<Lease>::namespaced(meter.client.clone(), &setup.ns);
    let mut lease = leases
        .create(&PostParams::default(), &leader_lease("reference-leader"))
        .await?;
    let mut renewals = 0;
    let reference_leader = meter
        .measure(async {
            loop {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.renew_time = Some(MicroTime(Timestamp::now()));
                }
                if let Ok(renewed) = leases
                    .replace("reference-leader", &PostParams::default(), &lease)
                    .await
                {
                    lease = renewed;
                    renewals += 1;
                }
                tokio::time::sleep(RENEW_IN_WINDOW).await;
            }
        })
        .await?;
    Ok([(reference, lists as usize), (reference_leader, renewals)])
}

/// A leader election Lease held now by the bench, as controller-runtime's defaults write it.
fn leader_lease(name: &str) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("bench".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// The section's text: how it was measured, a row per size and design, and the goals.
fn markdown(rows: &[IdleRow], others: usize) -> String {
    let window = rows.first().map_or(0, |r| r.window.as_secs());
    let mut out = format!(
        "A ring of Secrets in a namespace of their own, already assigned, 3 shard Leases held for an hour, nothing changing, beside a namespace of {others} Secrets of another ring (a cluster holds more than the ring: lists across the cluster meet them). Windows of {window} s in turn: nothing more running (the control, before and after the others); the sharder reconciler twice, once renewing its leader Lease every {}ms (its default is {}s) with no sweep due (its leader election and watches), once with `--sweep-interval` {}s (its default is {}s; its full resync, every {}s by default, does not come in a window and is counted at the measured cost of its list, {RESYNC_LISTS} of them run back to back); without `--reference`, the reference implementation's requests replayed by the bench, in two windows: its resync (a metadata-only list of the ring's resource across the cluster at `resourceVersion=0`, one answer from the watch cache, every {}s, {LISTS_PER_WINDOW} in a window, each as soon as the last ended if that is later) and its leader election (an update of its Lease every {}s, controller-runtime's default, replayed every {}ms); and a kube-rs metadata reflector after its first list (not compressed; its watch is all it does). With `--reference`, the reference's own binary too, in two windows, each from the end of its startup on (its lists of the Secrets until it went quiet for {}s in its first run; as many lists in its second): both with its leader election's `retryPeriod` at {}ms (its default is {}s): its `syncPeriod` at 1h (its leader election and watches, compressed by its renewals, the Lease updates the apiserver answered, against its default schedule), then at a tenth of the window (its lists; what that window used above the other, compressed by the lists the apiserver answered, `apiserver_request_total` of Secrets). CPU is kube-apiserver's and etcd's user + system time from `/proc`; etcd lists are the apiserver's `etcd_request_duration_seconds_count` of operations `list` and `listStream`. Per hour: the window's usage above the control's mean, scaled to an hour and divided by the compression (what ran in the window against the default schedule), ± how far the two control windows differ at that compression (a figure within it is noise); the sharder's and the reference's are each the sum of their two windows.\n\n",
        RENEW_IN_WINDOW.as_millis(),
        RENEW.as_secs(),
        SWEEP_IN_WINDOW.as_secs_f64(),
        SWEEP.as_secs(),
        RESYNC.as_secs(),
        REFERENCE_RESYNC.as_secs(),
        REFERENCE_RENEW.as_secs(),
        RENEW_IN_WINDOW.as_millis(),
        STARTUP_QUIET.as_secs(),
        RENEW_IN_WINDOW.as_millis(),
        REFERENCE_RENEW.as_secs(),
    );
    let mut cells = Vec::new();
    for row in rows {
        let (n, control) = (row.objects, row.control());
        let reference = row
            .reference()
            .or(row.reference_binary())
            .filter(|r| *r > 0.0);
        let versus = |cpu: f64| reference.map_or("-".into(), |r| format!("{:.2}x", cpu / r));
        for d in &row.designs {
            let (hour, used) = (row.per_hour(d), d.1);
            cells.push(format!(
                "{n} | {} | {:.2} ({:.2}) | {:.0} ({:.0}) | {} | {:.0}x | {:.1} ± {:.1} | {:.0} | {}",
                d.0,
                used.cpu,
                control.cpu,
                used.etcd_lists,
                control.etcd_lists,
                d.4,
                d.2,
                hour.cpu,
                row.spread(d),
                hour.etcd_lists,
                versus(hour.cpu)
            ));
        }
        if let Some(cpu) = row.sharder() {
            cells.push(format!(
                "{n} | sharder reconciler (both) | - | - | - | - | {cpu:.1} | - | {}",
                versus(cpu)
            ));
        }
        if let Some(cpu) = row.reference() {
            cells.push(format!(
                "{n} | reference (both) | - | - | - | - | {cpu:.1} | - | {}",
                versus(cpu)
            ));
        }
        if let Some(cpu) = row.reference_binary() {
            cells.push(format!(
                "{n} | reference binary (both) | - | - | - | - | {cpu:.1} | - | {}",
                versus(cpu)
            ));
        }
    }
    out += &table(
        "objects | design | CPU-s in the window (control) | etcd lists in the window (control) | what ran | compressed | apiserver + etcd CPU-s per hour | etcd lists per hour | vs the reference",
        cells,
    );
    let (Some(small), Some(large)) = (rows.first(), rows.last()) else {
        return out;
    };
    let mut all = Vec::new();
    if let (Some(sharder), Some(lists), Some(r)) = (
        large.sharder(),
        large.cpu_per_hour(SHARDER),
        large.reference(),
    ) {
        let what = format!(
            "the sharder's idle apiserver + etcd CPU (leader election and lists) at {} objects vs the reference's",
            large.objects
        );
        // A reference window at or below the control's says nothing to divide by.
        let (ratio, figure) = match r > 0.0 {
            true => (
                sharder / r,
                format!(
                    "{sharder:.2} vs {r:.2} CPU-s per hour = {:.3}x (its lists alone {lists:.1} = {:.3}x)",
                    sharder / r,
                    lists / r
                ),
            ),
            false => (
                f64::INFINITY,
                format!(
                    "{sharder:.1} CPU-s per hour; the reference's window was within the control's noise"
                ),
            ),
        };
        all.push((what, figure, "<= 1.0x", ratio <= 1.0));
    }
    if let (Some(sharder), Some(r)) = (large.sharder(), large.reference_binary()) {
        let what = format!(
            "the sharder's idle apiserver + etcd CPU at {} objects vs the reference's own binary's",
            large.objects
        );
        let figure = match r > 0.0 {
            true => format!(
                "{sharder:.2} vs {r:.2} CPU-s per hour = {:.3}x",
                sharder / r
            ),
            false => format!(
                "{sharder:.1} CPU-s per hour; the reference binary's windows were within the control's noise"
            ),
        };
        all.push((what, figure, "<= 1.0x", r > 0.0 && sharder <= r));
    }
    if let (true, Some(a), Some(b)) = (
        large.objects > small.objects,
        small.sharder(),
        large.sharder(),
    ) {
        let objects = large.objects as f64 / small.objects as f64;
        let what = format!(
            "growth of the sharder's idle cost (leader election and lists) from {} to {} objects",
            small.objects, large.objects
        );
        let figure = format!(
            "{:.1}x for {objects:.0}x the objects ({a:.1} to {b:.1} CPU-s per hour)",
            b / a
        );
        all.push((
            what,
            figure,
            "< the object count's growth",
            a > 0.0 && b / a < objects,
        ));
    }
    out + &goals(&all)
}

/// How many rebalances `counted` (the reconciler's metrics over a window) holds, and how many
/// ran each list.
fn rebalances(counted: &Rebalances) -> (usize, String) {
    let text: Vec<String> = counted
        .lists
        .iter()
        .map(|(list, n)| format!("{n} x {list}"))
        .collect();
    (
        counted.count as usize,
        if text.is_empty() {
            "no rebalance".into()
        } else {
            text.join(", ")
        },
    )
}

/// Waits (up to 10 minutes) until no namespace is being deleted: an earlier section's deletion
/// must not run through the windows.
async fn quiet(client: &Client) -> Result<(), Error> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        let all = namespaces.list(&ListParams::default()).await?.items;
        if all
            .iter()
            .all(|ns| ns.metadata.deletion_timestamp.is_none())
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A design whose window used `cpu` CPU-s and 13 etcd lists, `speedup` times compressed.
    fn design(name: &'static str, cpu: f64, speedup: f64) -> Design {
        Design(
            name,
            Usage::new(cpu, 13.0),
            speedup,
            Usage::default(),
            String::new(),
        )
    }

    /// A row of 90 s windows (40 an hour) with controls of `control` CPU-s and etcd lists.
    fn row(objects: usize, control: [f64; 2], designs: Vec<Design>) -> IdleRow {
        let control = control.map(|x| Usage::new(x, x));
        IdleRow {
            objects,
            window: Duration::from_secs(90),
            control,
            designs,
        }
    }

    #[test]
    fn per_hour_is_above_the_mean_control_at_the_real_schedule() {
        let mut sharder = design(SHARDER, 4.0, 10.0);
        sharder.3 = Usage::new(0.5, 1.0);
        let row = row(
            10,
            [1.0, 3.0],
            vec![sharder.clone(), design(REFLECTOR, 1.0, 1.0)],
        );
        // (4 - 2) CPU-s in 90 s, 40 windows an hour, 10 times compressed, plus what is counted.
        assert_eq!(row.per_hour(&sharder), Usage::new(8.5, 45.0));
        // The controls 2 CPU-s apart: 8 an hour at 10 times compressed, 80 uncompressed.
        assert_eq!(row.spread(&sharder), 8.0);
        assert_eq!(row.spread(&design(REFLECTOR, 1.0, 1.0)), 80.0);
        // Below the control counts as nothing.
        assert_eq!(row.cpu_per_hour(REFLECTOR), Some(0.0));
    }

    #[test]
    fn the_whole_idle_cost_is_held_against_the_reference_and_its_growth_against_the_objects() {
        // Sweeps 0.5 or 1 CPU-s and leader election 5 in a window, 40x compressed: as many
        // CPU-s an hour; the reference 4 or 6.5.
        let at = |objects, sweeps, reference| {
            let designs = vec![
                design(SHARDER, sweeps, 40.0),
                design(SHARDER_LEADER, 5.0, 40.0),
                design(REFERENCE, reference, 40.0),
            ];
            row(objects, [0.0, 0.0], designs)
        };
        let missed = markdown(&[at(10, 0.5, 4.0), at(100, 1.0, 4.0)], 0);
        assert!(missed.contains("| 6.00 vs 4.00 CPU-s per hour = 1.500x (its lists alone 1.0 = 0.250x) | <= 1.0x | **missed** |"), "{missed}");
        assert!(missed.contains("| 1.1x for 10x the objects (5.5 to 6.0 CPU-s per hour) | < the object count's growth | met |"), "{missed}");
        assert!(
            missed
                .contains("| 100 | sharder reconciler (both) | - | - | - | - | 6.0 | - | 1.50x |"),
            "{missed}"
        );
        assert!(
            missed.contains("| 100 | reference (both) | - | - | - | - | 4.0 | - | 1.00x |"),
            "{missed}"
        );
        let met = markdown(&[at(10, 0.5, 6.5), at(100, 1.0, 6.5)], 0);
        assert!(
            met.contains("= 0.923x") && !met.contains("**missed**"),
            "{met}"
        );
    }

    #[test]
    fn the_reference_costs_its_lists_and_its_leader_election() {
        let row = row(
            10,
            [0.0, 0.0],
            vec![
                design(REFERENCE, 2.0, 40.0),
                design(REFERENCE_LEADER, 1.0, 40.0),
            ],
        );
        // 2 and 1 CPU-s in 90 s windows, 40 an hour, 40 times compressed.
        assert_eq!(row.reference(), Some(3.0));
        let lists_only = IdleRow {
            designs: vec![design(REFERENCE, 2.0, 40.0)],
            ..row
        };
        assert_eq!(lists_only.reference(), Some(2.0));
    }

    #[test]
    fn the_reference_s_own_binary_is_held_against_the_sharder_when_it_ran() {
        let at = |binary: f64| {
            let designs = vec![
                design(SHARDER, 1.0, 40.0),
                design(SHARDER_LEADER, 5.0, 40.0),
                design(REFERENCE_BINARY, binary, 40.0),
                design(REFERENCE_BINARY_LEADER, 0.1, 1.0),
            ];
            row(100, [0.0, 0.0], designs)
        };
        // Its lists 40x compressed, its leader election not: 0.1 CPU-s in 90 s is 4 an hour.
        // Without the replayed requests, the binary is what every design is held against.
        assert_eq!(at(2.0).reference_binary(), Some(6.0));
        let met = markdown(&[at(2.0)], 0);
        assert!(
            met.contains("| 100 | reference binary (both) | - | - | - | - | 6.0 | - | 1.00x |")
                && met.contains(
                    "| 100 | sharder reconciler: sweeps and resyncs | 1.00 (0.00) | 13 (0) |  | 40x | 1.0 ± 0.0 | 13 | 0.17x |"
                ),
            "{met}"
        );
        assert!(met.contains("| the sharder's idle apiserver + etcd CPU at 100 objects vs the reference's own binary's | 6.00 vs 6.00 CPU-s per hour = 1.000x | <= 1.0x | met |"), "{met}");
        let missed = markdown(&[at(1.0)], 0);
        assert!(
            missed.contains("| 6.00 vs 5.00 CPU-s per hour = 1.200x | <= 1.0x | **missed** |"),
            "{missed}"
        );
        let without = row(100, [0.0, 0.0], vec![design(SHARDER, 1.0, 40.0)]);
        assert_eq!(without.reference_binary(), None);
        assert!(!markdown(&[without], 0).contains("vs the reference's own binary's"));
    }

    #[test]
    fn the_reference_binary_s_leader_election_is_compressed_by_the_renewals_it_made() {
        let window = Duration::from_secs(90);
        let control = Usage::new(1.0, 5.0);
        let quiet = BinaryWindow {
            used: Usage::new(3.0, 6.0),
            lists: 0,
            renewals: 1800,
        };
        let listing = BinaryWindow {
            used: Usage::new(5.0, 9.0),
            lists: 30,
            renewals: 1800,
        };
        let [lists, leader] = reference_binary_designs([quiet, listing], control, window);
        // 1,800 renewals of a 2 s schedule in 90 s: every 50 ms.
        assert_eq!(leader.2, 40.0);
        // A binary renewing at its default is not compressed.
        let at_default = BinaryWindow {
            renewals: 45,
            ..quiet
        };
        let [_, leader_at_default] =
            reference_binary_designs([at_default, listing], control, window);
        assert_eq!(leader_at_default.2, 1.0);
        assert_eq!(leader.1, Usage::new(3.0, 6.0));
        // The lists' window above the leader election's, on the control; 30 lists of a
        // 5-minute schedule in 90 s.
        assert_eq!(lists.1, Usage::new(3.0, 8.0));
        assert_eq!(lists.2, 100.0);
    }

    #[test]
    fn the_compression_is_what_ran_against_the_real_schedule() {
        let window = Duration::from_secs(90);
        // 10 lists of a 5-minute schedule in 90 s: 3,000 s of schedule, 33.3 times faster.
        assert_eq!(speedup(10, Duration::from_secs(300), window), 3000.0 / 90.0);
        // 88 sweeps of a 2-minute schedule.
        assert_eq!(
            speedup(88, Duration::from_secs(120), window),
            88.0 * 120.0 / 90.0
        );
        assert_eq!(speedup(0, Duration::from_secs(300), window), 0.0);
    }

    #[test]
    fn the_schedule_replayed_is_the_reconcilers_default() {
        use clap::CommandFactory as _;
        let command = sharder_reconciler::Args::command();
        let default = |id: &str| {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no {id}"));
            let value = arg.get_default_values()[0].to_string_lossy().into_owned();
            sharder_runtime::duration::parse_duration(&value).expect("a duration")
        };
        assert_eq!(default("sweep_interval"), SWEEP);
        assert_eq!(default("resync_interval"), RESYNC);
        assert_eq!(default("leader_election_renew"), RENEW);
    }

    #[test]
    fn rebalances_are_counted_by_what_they_listed() {
        let counted = Rebalances {
            count: 3.0,
            lists: [("all".to_owned(), 1.0), ("unassigned".to_owned(), 2.0)].into(),
            ..Rebalances::default()
        };
        assert_eq!(
            rebalances(&counted),
            (3, "1 x all, 2 x unassigned".to_owned())
        );
        assert_eq!(
            rebalances(&Rebalances::default()),
            (0, "no rebalance".to_owned())
        );
    }

    #[test]
    fn the_reference_s_startup_is_over_once_it_went_quiet_then_after_as_many_lists() {
        let quiet = STARTUP_QUIET;
        let mut startup = None;
        assert!(
            !startup_over(&mut startup, 0.0, quiet),
            "nothing listed yet"
        );
        assert!(!startup_over(&mut startup, 1.0, quiet / 2), "still listing");
        assert!(startup_over(&mut startup, 2.0, quiet));
        assert_eq!(startup, Some(2.0));
        // Its second run resyncs too often to go quiet: as many lists end its startup.
        assert!(!startup_over(&mut startup, 1.0, Duration::ZERO));
        assert!(startup_over(&mut startup, 2.0, Duration::ZERO));
    }
}
