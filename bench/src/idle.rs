//! Section 8, what a quiet ring costs the control plane. For each size, a ring of that many Secrets
//! (assigned, in a namespace of their own) with 3 shard Leases held for an hour, nothing
//! changing, beside a namespace of another ring's Secrets (`--idle-others`), and windows of the
//! same length in turn: nothing more running (the control, before and after the others); the
//! sharder reconciler sweeping every [`SWEEP_IN_WINDOW`] (its full resync, every 6 hours, does
//! not come in a window: it is counted at the cost of one of the reference's lists, the same
//! list); the reference implementation's schedule (a paginated consistent metadata-only list of
//! the ring every 5 minutes, replayed by the bench [`LISTS_PER_WINDOW`] times in a window); a
//! metadata reflector once it holds every object (what a cache-based design pays at idle).
//! Compressed schedules are scaled back by what ran (sweeps, lists), so the signal stands above
//! the control's noise. Each design is reported as the apiserver's and etcd's CPU above the
//! control's, and the lists the apiserver sent to etcd, per hour at the real schedule.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::ListParams;
use kube::{Api, Client};
use sharder_common::Ring;
use sharder_harness::ControlPlane;
use sharder_harness::wait::{apiserver_metrics, metric_sum};

use crate::report::Goal;
use crate::stats::cpu_seconds;
use crate::webhooks::{Webhooks, bench_binary, spawn_until_line};
use crate::{Args, Error, RingSetup, each_metadata, start_reconciler, wait_first_rebalance};

/// The reconciler's default `--sweep-interval`.
pub const SWEEP: Duration = Duration::from_secs(120);
/// The reconciler's default `--resync-interval`.
pub const RESYNC: Duration = Duration::from_secs(6 * 3600);
/// The reference implementation's resync period.
pub const REFERENCE_RESYNC: Duration = Duration::from_secs(300);
/// The reconciler's `--sweep-interval` in its window.
pub const SWEEP_IN_WINDOW: Duration = Duration::from_secs(1);
/// The reconciler's default `--leader-election-renew`.
pub const RENEW: Duration = Duration::from_secs(5);
/// The reconciler's `--leader-election-renew` in its leader election window (no sweep comes
/// in that window).
pub const RENEW_IN_WINDOW: Duration = Duration::from_millis(50);
/// The reference's lists in a window (each starts on its schedule, or when the last ended).
pub const LISTS_PER_WINDOW: u32 = 10;

/// How many times faster than real `done` runs of a schedule of `period` ran in `window`.
pub fn speedup(done: usize, period: Duration, window: Duration) -> f64 {
    done as f64 * period.as_secs_f64() / window.as_secs_f64()
}

/// The names of the designs, as the report shows them. The sharder reconciler's cost is the sum
/// of two windows: its sweeps (and resyncs) and its leader election (and watches), each
/// compressed by its own schedule.
pub const SHARDER: &str = "sharder reconciler: sweeps and resyncs";
/// See [`SHARDER`].
pub const SHARDER_LEADER: &str = "sharder reconciler: leader election and watches";
/// See [`SHARDER`].
pub const REFERENCE: &str = "reference schedule (full list every 5 min)";
/// See [`SHARDER`].
pub const REFLECTOR: &str = "metadata reflector (after its first list)";

/// The apiserver's and etcd's CPU seconds and the lists the apiserver sent to etcd, over a
/// window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds of kube-apiserver and etcd together.
    pub cpu: f64,
    /// `etcd_request_duration_seconds_count{operation="list"}`, summed over types.
    pub etcd_lists: f64,
}

/// One design's window.
#[derive(Clone, Debug)]
pub struct Design {
    /// Which design ([`SHARDER`], [`REFERENCE`], [`REFLECTOR`]).
    pub name: &'static str,
    /// What the window used, the control's included.
    pub usage: Usage,
    /// How many times faster than real its schedule ran (1: not compressed).
    pub speedup: f64,
    /// Usage per hour counted from elsewhere (the sharder's resyncs), added to the window's.
    pub counted: Usage,
    /// What ran in the window (lists by kind), for the reader.
    pub activity: String,
}

/// One size's windows.
#[derive(Clone, Debug)]
pub struct IdleRow {
    /// Objects in the ring.
    pub objects: usize,
    /// The length of every window.
    pub window: Duration,
    /// The control windows (before and after the designs).
    pub control: [Usage; 2],
    /// The designs.
    pub designs: Vec<Design>,
}

impl IdleRow {
    /// The control's usage per window: the mean of the two.
    pub fn control(&self) -> Usage {
        mean(self.control[0], self.control[1])
    }

    /// `design`'s CPU seconds and etcd lists per hour above the control, at its real schedule.
    pub fn per_hour(&self, design: &Design) -> Usage {
        let control = self.control();
        let scale = 3600.0 / self.window.as_secs_f64() / design.speedup;
        Usage {
            cpu: (design.usage.cpu - control.cpu).max(0.0) * scale + design.counted.cpu,
            etcd_lists: (design.usage.etcd_lists - control.etcd_lists).max(0.0) * scale
                + design.counted.etcd_lists,
        }
    }

    /// The design named `name`.
    pub fn design(&self, name: &str) -> Option<&Design> {
        self.designs.iter().find(|d| d.name == name)
    }

    /// The CPU seconds per hour of the design named `name`, if it ran.
    pub fn cpu_per_hour(&self, name: &str) -> Option<f64> {
        self.design(name).map(|d| self.per_hour(d).cpu)
    }

    /// The sharder reconciler's CPU seconds per hour: its sweeps' and its leader election's.
    pub fn sharder(&self) -> Option<f64> {
        let leader = self.cpu_per_hour(SHARDER_LEADER).unwrap_or(0.0);
        Some(self.cpu_per_hour(SHARDER)? + leader)
    }
}

/// The mean of two usages.
fn mean(a: Usage, b: Usage) -> Usage {
    Usage {
        cpu: (a.cpu + b.cpu) / 2.0,
        etcd_lists: (a.etcd_lists + b.etcd_lists) / 2.0,
    }
}

/// Measures every size of `args.idle_sizes`.
pub async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<Vec<IdleRow>, Error> {
    let client = cp.client().await?;
    let window = Duration::from_secs(args.idle_window_seconds);
    let mut rows = Vec::new();
    // Another ring's Secrets, labelled with its shards: never this ring's, in the cluster
    // throughout.
    let others = RingSetup::new(cp, "bench-idle-others", false, 0).await?;
    let other_ring = Ring::new((0..3).map(|i| format!("other-{i}")));
    others
        .create_assigned(0..args.idle_others, &other_ring)
        .await?;
    for &n in &args.idle_sizes {
        let setup = RingSetup::new(cp, &format!("bench-idle-{n}"), false, 3).await?;
        let ring = Ring::new((0..3).map(|i| format!("shard-{i}")));
        let rate = setup.create_assigned(0..n, &ring).await?;
        eprintln!("[bench]   {n} objects created ({rate:.0}/s); waiting for a quiet apiserver");
        quiet(&client).await?;
        let first_control = measure(cp, &client, window, async {}).await?;

        let renew = format!("{}ms", RENEW_IN_WINDOW.as_millis());
        let (leader, (swept, what)) = reconciler_window(
            cp,
            &client,
            (&setup, n),
            webhooks,
            args,
            &["--sweep-interval", "1h", "--leader-election-renew", &renew],
        )
        .await?;
        if swept != 0 {
            return Err(Error::Setup(format!(
                "the reconciler swept in its leader election window at {n} objects ({what})"
            )));
        }
        let sweep = format!("{}ms", SWEEP_IN_WINDOW.as_millis());
        let resync = format!("{}s", RESYNC.as_secs());
        let (sharder, (sweeps, activity)) = reconciler_window(
            cp,
            &client,
            (&setup, n),
            webhooks,
            args,
            &["--sweep-interval", &sweep, "--resync-interval", &resync],
        )
        .await?;
        if sweeps == 0 {
            return Err(Error::Setup(format!(
                "the reconciler did not sweep in its {window:?} window at {n} objects"
            )));
        }

        let api = Api::<Secret>::namespaced(client.clone(), &setup.ns);
        let mut lists = 0;
        let every = window / LISTS_PER_WINDOW;
        let reference = measure(cp, &client, window, async {
            let started = Instant::now();
            loop {
                if each_metadata(&api, None, |_| {}).await.is_ok() {
                    lists += 1;
                }
                let next = every * lists;
                tokio::time::sleep(next.saturating_sub(started.elapsed())).await;
            }
        })
        .await?;
        if lists == 0 {
            return Err(Error::Setup(format!(
                "no reference list completed in its {window:?} window at {n} objects"
            )));
        }

        let mut command = std::process::Command::new(bench_binary("metadata-cache")?);
        command
            .env("KUBECONFIG", cp.kubeconfig())
            .args([setup.ns.as_str(), &n.to_string()]);
        let (mut cache, _) = spawn_until_line("metadata-cache", command, "synced").await?;
        let reflector = measure(cp, &client, window, async {}).await?;
        cache.kill();

        let last_control = measure(cp, &client, window, async {}).await?;
        // The sharder's full resyncs, at the cost of the reference's lists (the same list).
        let control = mean(first_control, last_control);
        let per_list = |value: fn(&Usage) -> f64| {
            (value(&reference) - value(&control)).max(0.0) / f64::from(lists.max(1))
        };
        let resyncs = 3600.0 / RESYNC.as_secs_f64();
        let counted = Usage {
            cpu: resyncs * per_list(|u| u.cpu),
            etcd_lists: resyncs * per_list(|u| u.etcd_lists),
        };
        let row = IdleRow {
            objects: n,
            window,
            control: [first_control, last_control],
            designs: vec![
                Design {
                    name: SHARDER,
                    usage: sharder,
                    speedup: speedup(sweeps, SWEEP, window),
                    counted,
                    activity: format!(
                        "{activity}; its full resyncs ({resyncs:.2} an hour) at a reference list's cost"
                    ),
                },
                Design {
                    name: SHARDER_LEADER,
                    usage: leader,
                    speedup: RENEW.as_secs_f64() / RENEW_IN_WINDOW.as_secs_f64(),
                    counted: Usage::default(),
                    activity: format!("renewals every {}ms, no sweep", RENEW_IN_WINDOW.as_millis()),
                },
                Design {
                    name: REFERENCE,
                    usage: reference,
                    speedup: speedup(lists as usize, REFERENCE_RESYNC, window),
                    counted: Usage::default(),
                    activity: format!("{lists} full lists"),
                },
                Design {
                    name: REFLECTOR,
                    usage: reflector,
                    speedup: 1.0,
                    counted: Usage::default(),
                    activity: "one watch".into(),
                },
            ],
        };
        for design in &row.designs {
            let hour = row.per_hour(design);
            eprintln!(
                "[bench]   {n}: {}: {:.1} CPU-s/h, {:.0} etcd lists/h ({})",
                design.name, hour.cpu, hour.etcd_lists, design.activity
            );
        }
        rows.push(row);
        // The next size waits for a quiet apiserver anyway; after the last nothing is measured.
        setup.remove(false).await?;
    }
    others.remove(false).await?;
    Ok(rows)
}

/// The section's text: how it was measured, a row per size and design, and the goals.
pub fn markdown(rows: &[IdleRow], others: usize) -> String {
    let window = rows.first().map_or(0, |r| r.window.as_secs());
    let mut out = format!(
        "A ring of Secrets in a namespace of their own, already assigned, 3 shard Leases held for an hour, nothing changing, beside a namespace of {others} Secrets of another ring (a cluster holds more than the ring: lists across the cluster meet them). Windows of {window} s in turn: nothing more running (the control, before and after the others); the sharder reconciler twice, once renewing its leader Lease every {}ms (its default is {}s) with no sweep due (its leader election and watches), once with `--sweep-interval` {}s (its default is {}s; its full resync, every {}s by default, does not come in a window and is counted at the cost of one of the reference window's lists, the same list); the reference implementation's schedule replayed by the bench (a consistent metadata-only list of the ring, 500 to a page, every {}s, {LISTS_PER_WINDOW} in a window, each as soon as the last ended if that is later; the reference's own leader election is not counted) and a kube-rs metadata reflector after its first list (not compressed; its watch is all it does). CPU is kube-apiserver's and etcd's user + system time from `/proc`; etcd lists are the apiserver's `etcd_request_duration_seconds_count{{operation=\"list\"}}`. Per hour: the window's usage above the control's mean, scaled to an hour and divided by the compression (what ran in the window against the default schedule: renewals, sweeps x {}s or lists x {}s over the window); the sharder's is the sum of its two windows.\n\n",
        RENEW_IN_WINDOW.as_millis(),
        RENEW.as_secs(),
        SWEEP_IN_WINDOW.as_secs_f64(),
        SWEEP.as_secs(),
        RESYNC.as_secs(),
        REFERENCE_RESYNC.as_secs(),
        SWEEP.as_secs(),
        REFERENCE_RESYNC.as_secs()
    );
    out.push_str(&crate::report::table(
        &[
            "objects",
            "design",
            "CPU-s in the window (control)",
            "etcd lists in the window (control)",
            "what ran",
            "compressed",
            "apiserver + etcd CPU-s per hour",
            "etcd lists per hour",
            "vs the reference schedule",
        ],
        rows.iter().flat_map(|row| {
            let control = row.control();
            let reference = row.cpu_per_hour(REFERENCE);
            let versus = move |cpu: f64| {
                reference
                    .filter(|r| *r > 0.0)
                    .map_or("-".into(), |r| format!("{:.2}x", cpu / r))
            };
            let total = row.sharder().map(|cpu| {
                let mut cells = vec![row.objects.to_string(), "sharder reconciler (both)".into()];
                cells.extend(["-", "-", "-", "-"].map(String::from));
                cells.extend([format!("{cpu:.1}"), "-".into(), versus(cpu)]);
                cells
            });
            row.designs
                .iter()
                .map(move |d| {
                    let hour = row.per_hour(d);
                    vec![
                        row.objects.to_string(),
                        d.name.to_owned(),
                        format!("{:.2} ({:.2})", d.usage.cpu, control.cpu),
                        format!("{:.0} ({:.0})", d.usage.etcd_lists, control.etcd_lists),
                        d.activity.clone(),
                        format!("{:.0}x", d.speedup),
                        format!("{:.1}", hour.cpu),
                        format!("{:.0}", hour.etcd_lists),
                        versus(hour.cpu),
                    ]
                })
                .chain(total)
        }),
    ));
    let lists = |row: &IdleRow| row.cpu_per_hour(SHARDER);
    let reference = |row: &IdleRow| row.cpu_per_hour(REFERENCE);
    let mut goals = Vec::new();
    let mut parts = None;
    let mut why_ratio = None;
    if let (Some(small), Some(large)) = (rows.first(), rows.last()) {
        if let (Some(all), Some(s), Some(r)) = (large.sharder(), lists(large), reference(large)) {
            // The reconciler's whole idle cost (the measure: its window against the
            // control); the reference's schedule is its lists alone (its own leader election,
            // client-go's every 2 s, is not replayed).
            let what = format!(
                "the sharder's idle apiserver + etcd CPU (leader election and lists) at {} objects vs the reference schedule's",
                large.objects
            );
            // A reference window at or below the control's says nothing to divide by.
            goals.push(if r > 0.0 {
                let ratio = all / r;
                if ratio > 0.1 {
                    why_ratio = ratio_missed(large, all);
                }
                Goal::new(
                    &what,
                    format!(
                        "{all:.2} vs {r:.2} CPU-s per hour = {ratio:.2}x (its lists alone {s:.1} = {:.2}x; the reference's leader election is not counted)",
                        s / r
                    ),
                    "<= 0.1x",
                    ratio <= 0.1,
                )
            } else {
                Goal::new(
                    &what,
                    format!(
                        "{all:.1} CPU-s per hour; the reference's window was within the control's noise"
                    ),
                    "<= 0.1x",
                    false,
                )
            });
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
            let bound = format!("< {objects:.0}x (the object count's)");
            goals.push(if a > 0.0 {
                let growth = b / a;
                parts = growth_parts(small, large, growth >= objects);
                let alone = match (lists(small), lists(large)) {
                    (Some(x), Some(y)) if x > 0.0 => format!("; the lists alone {:.1}x", y / x),
                    _ => String::new(),
                };
                Goal::new(
                    &what,
                    format!("{growth:.1}x ({a:.1} to {b:.1} CPU-s per hour{alone})"),
                    &bound,
                    growth < objects,
                )
            } else {
                Goal::new(
                    &what,
                    format!(
                        "{b:.1} CPU-s per hour at {}; at {} within the control's noise",
                        large.objects, small.objects
                    ),
                    &bound,
                    false,
                )
            });
        }
    }
    out.push('\n');
    if !goals.is_empty() {
        crate::report::goals(&mut out, &goals);
    }
    out.push_str(&why_ratio.unwrap_or_default());
    out.push_str(&parts.unwrap_or_default());
    out
}

/// Why the sharder's idle cost at `row` is above a tenth of the reference schedule's: the
/// share of its leader election, which no list strategy changes.
fn ratio_missed(row: &IdleRow, all: f64) -> Option<String> {
    let leader = row.cpu_per_hour(SHARDER_LEADER)?;
    Some(format!(
        "Why missed: the leader election renews the reconciler's Lease every {}s, one write each, whatever the object count: {leader:.1} of the {all:.1} CPU-s per hour at {} objects. `docs/performance-notes.md` (the leader election's share of the idle cost) has what would lower it.\n\n",
        RENEW.as_secs(),
        row.objects
    ))
}

/// What the sharder's idle cost is made of at `small` and `large`: one sweep's cost (linear in
/// what the watch cache holds) and the leader election's per hour; `missed` says it is why the
/// growth goal is missed.
fn growth_parts(small: &IdleRow, large: &IdleRow, missed: bool) -> Option<String> {
    let per_sweep = |row: &IdleRow| {
        let design = row.design(SHARDER)?;
        let sweeps = design.speedup * row.window.as_secs_f64() / SWEEP.as_secs_f64();
        Some((design.usage.cpu - row.control().cpu).max(0.0) / sweeps.max(1.0))
    };
    let leader = |row: &IdleRow| row.cpu_per_hour(SHARDER_LEADER).unwrap_or(0.0);
    let (a, b) = (per_sweep(small)?, per_sweep(large)?);
    Some(format!(
        "{}The sweeps grow with the objects: a quiet sweep is a list from the watch cache, which this apiserver (1.20) answers by filtering every object of the resource it holds, whatever the namespace: {a:.3} CPU-s a sweep at {} objects, {b:.3} at {}. The leader election does not: {:.1} and {:.1} CPU-s per hour.{}\n",
        if missed { "Why missed: " } else { "" },
        small.objects,
        large.objects,
        leader(small),
        leader(large),
        if missed {
            " `docs/performance-notes.md` (quiet sweeps grow with the watch cache) has what would not grow."
        } else {
            ""
        }
    ))
}

/// Starts the reconciler with `flags` on `setup`'s ring, waits for its first full rebalance,
/// and measures a window; returns what the window used and the rebalances in it.
async fn reconciler_window(
    cp: &ControlPlane,
    client: &Client,
    (setup, n): (&RingSetup, usize),
    webhooks: &Webhooks,
    args: &Args,
    flags: &[&str],
) -> Result<(Usage, (usize, String)), Error> {
    let window = Duration::from_secs(args.idle_window_seconds);
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let mut reconciler = start_reconciler(
        setup,
        dir.path(),
        cp.kubeconfig(),
        webhooks,
        flags,
        args.reconciler_malloc_arena_max,
    )
    .await?;
    wait_first_rebalance(&mut reconciler, n).await?;
    let skip = reconciler.process.lines().len();
    let used = measure(cp, client, window, async {}).await?;
    Ok((used, rebalances(&reconciler.process.lines()[skip..])))
}

/// What the apiserver and etcd used over `window` while `during` ran (it is dropped at the
/// window's end).
async fn measure(
    cp: &ControlPlane,
    client: &Client,
    window: Duration,
    during: impl Future<Output = ()>,
) -> Result<Usage, Error> {
    let before = usage(cp, client).await?;
    tokio::select! {
        () = tokio::time::sleep(window) => {}
        () = during => tokio::time::sleep(window).await,
    }
    let after = usage(cp, client).await?;
    Ok(Usage {
        cpu: after.cpu - before.cpu,
        etcd_lists: after.etcd_lists - before.etcd_lists,
    })
}

/// The apiserver's and etcd's CPU seconds and etcd lists so far.
async fn usage(cp: &ControlPlane, client: &Client) -> Result<Usage, Error> {
    let metrics = apiserver_metrics(client).await?;
    Ok(Usage {
        cpu: cp.pids().iter().filter_map(|p| cpu_seconds(*p)).sum(),
        etcd_lists: metric_sum(
            &metrics,
            "etcd_request_duration_seconds_count",
            &[("operation", "list")],
        ),
    })
}

/// How many rebalances `lines` hold, and how many by what they listed.
fn rebalances(lines: &[serde_json::Value]) -> (usize, String) {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for line in lines.iter().filter(|l| l["message"] == "rebalance") {
        *counts
            .entry(line["scopes"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    if counts.is_empty() {
        return (0, "no rebalance".into());
    }
    let text = counts
        .iter()
        .map(|(scopes, n)| format!("{n} x {scopes}"))
        .collect::<Vec<_>>()
        .join(", ");
    (counts.values().sum(), text)
}

/// Waits (up to 10 minutes) until no namespace is being deleted: an earlier section's deletion
/// must not run through the windows.
async fn quiet(client: &Client) -> Result<(), Error> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let started = Instant::now();
    loop {
        let terminating = namespaces
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|ns| ns.metadata.deletion_timestamp.is_some())
            .count();
        if terminating == 0 || started.elapsed() > Duration::from_secs(600) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_hour_is_above_the_mean_control_at_the_real_schedule() {
        let design = |name, cpu, speedup| Design {
            name,
            usage: Usage {
                cpu,
                etcd_lists: 13.0,
            },
            speedup,
            counted: Usage {
                cpu: 0.5,
                etcd_lists: 1.0,
            },
            activity: String::new(),
        };
        let row = IdleRow {
            objects: 10,
            window: Duration::from_secs(90),
            control: [
                Usage {
                    cpu: 1.0,
                    etcd_lists: 1.0,
                },
                Usage {
                    cpu: 3.0,
                    etcd_lists: 3.0,
                },
            ],
            designs: vec![design(SHARDER, 4.0, 10.0), design(REFLECTOR, 1.0, 1.0)],
        };
        let sharder = row.per_hour(row.design(SHARDER).expect("design"));
        // (4 - 2) CPU-s in 90 s, 40 windows an hour, 10 times compressed, plus what is counted.
        assert!((sharder.cpu - 8.5).abs() < 1e-9, "{sharder:?}");
        assert!((sharder.etcd_lists - 45.0).abs() < 1e-9, "{sharder:?}");
        // Below the control counts as nothing.
        let reflector = row.per_hour(row.design(REFLECTOR).expect("design"));
        assert_eq!(reflector.cpu, 0.5);
    }

    /// A design whose window used `cpu` CPU-s (no etcd lists), `speedup` times compressed.
    fn design(name: &'static str, cpu: f64, speedup: f64) -> Design {
        Design {
            name,
            usage: Usage {
                cpu,
                etcd_lists: 0.0,
            },
            speedup,
            counted: Usage::default(),
            activity: String::new(),
        }
    }

    #[test]
    fn the_sharders_cost_is_its_sweeps_and_its_leader_election_and_a_missed_growth_says_why() {
        let row = |objects, sweeps_cpu, leader_cpu| IdleRow {
            objects,
            window: Duration::from_secs(90),
            control: [Usage::default(); 2],
            designs: vec![
                design(
                    SHARDER,
                    sweeps_cpu,
                    speedup(50, SWEEP, Duration::from_secs(90)),
                ),
                design(SHARDER_LEADER, leader_cpu, 50.0),
            ],
        };
        // 50 sweeps of 2 minutes in 90 s: 66.7x; 40 windows an hour.
        let small = row(10, 1.0, 0.0);
        assert!((small.sharder().expect("sharder") - 0.6).abs() < 1e-9);
        // Renewals 50 times faster: 1.25 CPU-s in the window is 1 CPU-s an hour.
        let both = row(10, 1.0, 1.25);
        assert!((both.sharder().expect("sharder") - 1.6).abs() < 1e-9);
        // Sweeps 20x the cost for 10x the objects, nothing else: missed, and why.
        let missed = markdown(&[row(10, 1.0, 0.0), row(100, 20.0, 0.0)], 0);
        assert!(missed.contains("**missed**"), "{missed}");
        assert!(
            missed.contains("Why missed: The sweeps grow with the objects")
                && missed.contains("0.020 CPU-s a sweep at 10 objects, 0.400 at 100"),
            "{missed}"
        );
        // The same sweeps beside a leader election of 5 CPU-s an hour: 17/5.6, met, no why.
        // (No reference in these rows: no ratio goal either.)
        let met = markdown(&[row(10, 1.0, 6.25), row(100, 20.0, 6.25)], 0);
        assert!(
            !met.contains("Why missed") && !met.contains("**missed**"),
            "{met}"
        );
        assert!(
            met.contains("| 3.0x (5.6 to 17.0 CPU-s per hour; the lists alone 20.0x) |"),
            "{met}"
        );
        assert!(
            met.contains("The leader election does not: 5.0 and 5.0 CPU-s per hour"),
            "{met}"
        );
    }

    #[test]
    fn the_whole_idle_cost_is_held_against_the_reference_and_a_miss_names_the_leader_election() {
        // 40 windows an hour: lists 1 CPU-s, leader election 5, the reference 40 or 100.
        let row = |reference: f64| IdleRow {
            objects: 100,
            window: Duration::from_secs(90),
            control: [Usage::default(); 2],
            designs: vec![
                design(SHARDER, 1.0, 40.0),
                design(SHARDER_LEADER, 5.0, 40.0),
                design(REFERENCE, reference, 40.0),
            ],
        };
        let missed = markdown(&[row(40.0)], 0);
        assert!(
            missed.contains("| 6.00 vs 40.00 CPU-s per hour = 0.15x (its lists alone 1.0 = 0.03x; the reference's leader election is not counted) | <= 0.1x | **missed** |"),
            "{missed}"
        );
        assert!(
            missed.contains("Why missed: the leader election renews the reconciler's Lease every 5s, one write each, whatever the object count: 5.0 of the 6.0 CPU-s per hour at 100 objects."),
            "{missed}"
        );
        let met = markdown(&[row(100.0)], 0);
        assert!(
            met.contains("= 0.06x") && !met.contains("Why missed"),
            "{met}"
        );
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
        let line = |scopes: &str| serde_json::json!({"message": "rebalance", "scopes": scopes});
        let lines = [
            line("[\"All\"]"),
            line("[\"Unassigned\"]"),
            line("[\"Unassigned\"]"),
            serde_json::json!({"message": "moved"}),
        ];
        assert_eq!(
            rebalances(&lines),
            (3, "1 x [\"All\"], 2 x [\"Unassigned\"]".to_owned())
        );
        assert_eq!(rebalances(&[]), (0, "no rebalance".to_owned()));
    }
}
