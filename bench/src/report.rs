//! The markdown report: machine, versions, parameters, every figure and its goal.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use sharder_harness::ControlPlane;

use crate::Args;
use crate::create_latency::{CreateLatency, Mode};
use crate::memory::MemoryRow;
use crate::rebalance::{RAW_AFTER_CRASH, RawPatches, RebalanceResult, Round};
use crate::ring_balance::RingResult;
use crate::stats::{mib, ms};

/// The object count of the memory goal (its peak against the smallest size's).
const GOAL_MEMORY_OBJECTS: usize = 100_000;

/// Everything measured in one run.
pub struct Report {
    args: Args,
    machine: Vec<(String, String)>,
    /// Section 1.
    pub create_latency: Option<CreateLatency>,
    /// The rolling updates.
    pub rolling: Option<crate::rolling::RollingResult>,
    /// Section 2: the load bench's output.
    pub load: Option<Result<crate::load::LoadRun, String>>,
    /// Section 2: the webhook processes' memory under load.
    pub load_processes: Vec<crate::load::ProcessUnderLoad>,
    /// Section 3.
    pub memory: Vec<MemoryRow>,
    /// Sections 4 and 5.
    pub rebalance: Option<RebalanceResult>,
    /// Section 6.
    pub ring: Option<RingResult>,
    /// Section 7 (or why it could not run).
    pub node: Option<Result<crate::node::NodeResult, String>>,
    /// Section 8.
    pub idle: Vec<crate::idle::IdleRow>,
    /// How long the run took.
    pub duration: Duration,
}

fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn memory_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A markdown table with `header` and `rows` (each as many cells as the header), ending in a
/// newline.
pub fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// One goal of the report: what is measured, its figure, the goal, and whether it was met.
pub struct Goal {
    /// What is measured.
    pub what: String,
    /// The figure of this run.
    pub figure: String,
    /// The goal, as a bound.
    pub goal: String,
    /// Whether the figure meets the goal.
    pub met: bool,
}

impl Goal {
    /// A goal on `what`: `figure` against `goal`, `met` or not.
    pub fn new(what: &str, figure: String, goal: &str, met: bool) -> Self {
        Self {
            what: what.to_owned(),
            figure,
            goal: goal.to_owned(),
            met,
        }
    }
}

/// A section's goals as a table (goal, figure, met/missed); returns whether every one was met.
pub(crate) fn goals(out: &mut String, goals: &[Goal]) -> bool {
    out.push_str(&table(
        &["goal", "figure", "bound", "verdict"],
        goals.iter().map(|g| {
            vec![
                g.what.clone(),
                g.figure.clone(),
                g.goal.clone(),
                verdict(g.met).to_owned(),
            ]
        }),
    ));
    out.push('\n');
    goals.iter().all(|g| g.met)
}

impl Report {
    /// A report for a run with `args` on `cp`.
    pub fn new(args: &Args, cp: &ControlPlane) -> Self {
        let assets = sharder_harness::control_plane::assets_dir().unwrap_or_default();
        let apiserver = assets.join("kube-apiserver");
        let etcd = assets.join("etcd");
        let machine = vec![
            (
                "CPU".to_owned(),
                format!(
                    "{} x {}",
                    std::thread::available_parallelism().map_or(0, |n| n.get()),
                    cpu_model()
                ),
            ),
            ("memory".to_owned(), memory_total()),
            ("kernel".to_owned(), first_line("uname", &["-sr"])),
            ("rustc".to_owned(), first_line("rustc", &["--version"])),
            (
                "kube-apiserver".to_owned(),
                first_line(&apiserver.to_string_lossy(), &["--version"]),
            ),
            (
                "etcd".to_owned(),
                first_line(&etcd.to_string_lossy(), &["--version"]),
            ),
            (
                "apiserver".to_owned(),
                format!("{} (loopback, audit log on)", cp.url()),
            ),
            (
                "build".to_owned(),
                if cfg!(debug_assertions) {
                    "debug (use --release for the report)".to_owned()
                } else {
                    "release".to_owned()
                },
            ),
        ];
        Self {
            args: args.clone(),
            machine,
            create_latency: None,
            rolling: None,
            load: None,
            load_processes: Vec::new(),
            memory: Vec::new(),
            rebalance: None,
            ring: None,
            node: None,
            idle: Vec::new(),
            duration: Duration::ZERO,
        }
    }

    /// The markdown text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let a = &self.args;
        let _ = writeln!(out, "# Benchmarks\n");
        let _ = writeln!(
            out,
            "Written by `make bench` (`cargo run --release -p sharder-bench`) on the local control plane; every comparison is measured side by side in the same run. Run took {:.0} s.\n",
            self.duration.as_secs_f64()
        );
        let machine = self.machine.iter().map(|(k, v)| vec![k.clone(), v.clone()]);
        let _ = write!(
            out,
            "## Machine and versions\n\n{}",
            table(&["", ""], machine)
        );
        let _ = writeln!(
            out,
            "\nParameters: {} creates per round at {}/s, {} rounds per mode; memory sizes {:?}; rebalancing {} objects; shard Lease {} s.\n",
            a.creates, a.rate, a.rounds, a.sizes, a.rebalance_objects, a.lease_seconds
        );
        self.render_create(&mut out);
        self.render_load(&mut out);
        self.render_memory(&mut out);
        self.render_rebalance(&mut out);
        self.render_rolling(&mut out);
        self.render_ring(&mut out);
        self.render_node(&mut out);
        let _ = writeln!(out, "## 8. What a quiet ring costs the control plane\n");
        if self.idle.is_empty() {
            let _ = writeln!(out, "Not run.\n");
        } else {
            out.push_str(&crate::idle::markdown(&self.idle, self.args.idle_others));
        }
        out
    }

    fn render_create(&self, out: &mut String) {
        let _ = writeln!(out, "## 1. CREATE latency added by the webhook\n");
        let Some(c) = &self.create_latency else {
            let _ = writeln!(out, "Not run.\n");
            return;
        };
        let _ = writeln!(
            out,
            "Secrets created through kube-apiserver at {}/s, {} per round, rounds interleaved: no webhook registered, the floor webhook (parses the review, answers a fixed one-label patch: the transport cost any webhook pays) and the sharder webhook, each its own process serving TLS on loopback, registered with the same MutatingWebhookConfiguration (only the URL differs). Then controlled objects (ConfigMaps with a controller Secret already on its shard) with no webhook and with the sharder webhook, which reads each new child's owner (one metadata GET) so the child lands on the shard holding the owner now, never ahead of it.\n",
            c.rate, c.creates
        );
        out.push_str(&table(
            &[
                "round",
                "mode",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "achieved/s",
                "errors",
            ],
            c.rounds.iter().map(|r| {
                vec![
                    r.round.to_string(),
                    r.mode.name().to_owned(),
                    format!("{:.2}", ms(r.p50)),
                    format!("{:.2}", ms(r.p90)),
                    format!("{:.2}", ms(r.p99)),
                    format!("{:.0}", r.achieved_rate),
                    r.errors.to_string(),
                ]
            }),
        ));
        let p50 = |m| c.median_ms(m, |r| r.p50);
        let p90 = |m| c.median_ms(m, |r| r.p90);
        let p99 = |m| c.median_ms(m, |r| r.p99);
        out.push('\n');
        out.push_str(&table(
            &[
                "median over rounds",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "added p50 ms",
                "added p90 ms",
            ],
            Mode::ALL.into_iter().map(|m| {
                let base = if m.children() {
                    Mode::NoneChild
                } else {
                    Mode::None
                };
                vec![
                    m.name().to_owned(),
                    format!("{:.2}", p50(m)),
                    format!("{:.2}", p90(m)),
                    format!("{:.2}", p99(m)),
                    format!("{:+.2}", p50(m) - p50(base)),
                    format!("{:+.2}", p90(m) - p90(base)),
                ]
            }),
        ));
        let _ = writeln!(
            out,
            "\nChildren: the sharder webhook adds {:+.2} ms at p50 and {:+.2} ms at p90 to a child's CREATE over no webhook, against {:+.2} / {:+.2} ms for a main object: the owner read costs {:+.2} ms at p50. (The added latency of a main object is the row \"sharder webhook\" against \"no webhook\"; of a child, \"sharder webhook, children\" against \"no webhook, children\".)\n",
            p50(Mode::SharderChild) - p50(Mode::NoneChild),
            p90(Mode::SharderChild) - p90(Mode::NoneChild),
            p50(Mode::Sharder) - p50(Mode::None),
            p90(Mode::Sharder) - p90(Mode::None),
            (p50(Mode::SharderChild) - p50(Mode::NoneChild))
                - (p50(Mode::Sharder) - p50(Mode::None)),
        );
        let added = |f: &dyn Fn(Mode) -> f64| {
            let floor = f(Mode::Floor) - f(Mode::None);
            let sharder = f(Mode::Sharder) - f(Mode::None);
            (floor, sharder)
        };
        let (f50, s50) = added(&p50);
        let (f90, s90) = added(&p90);
        // A ratio of two small differences is meaningless when the floor adds ~nothing; compare
        // against the floor's added latency with a 0.1 ms allowance for timer resolution.
        let ok50 = s50 <= 1.2 * f50.max(0.0) + 0.1;
        let ok90 = s90 <= 1.2 * f90.max(0.0) + 0.1;
        let _ = writeln!(
            out,
            "\nThe reference design measured +62 ms at p99; here the sharder webhook's p99 is {:+.2} ms over no webhook (p99 on 2 cores is mostly scheduling noise).\n",
            p99(Mode::Sharder) - p99(Mode::None)
        );
        let bound = "<= 1.2x the floor's added + 0.1 ms (timer resolution)";
        let met = goals(
            out,
            &[
                Goal::new(
                    "CREATE latency the sharder webhook adds, p50",
                    format!("{s50:+.2} ms (floor {f50:+.2} ms)"),
                    bound,
                    ok50,
                ),
                Goal::new(
                    "the same at p90",
                    format!("{s90:+.2} ms (floor {f90:+.2} ms)"),
                    bound,
                    ok90,
                ),
            ],
        );
        if !met {
            let none: Vec<f64> = c
                .rounds
                .iter()
                .filter(|r| r.mode == Mode::None)
                .map(|r| ms(r.p50))
                .collect();
            let spread = none.iter().copied().fold(f64::MIN, f64::max)
                - none.iter().copied().fold(f64::MAX, f64::min);
            let _ = writeln!(
                out,
                "Why missed: the no-webhook rounds alone spread {spread:.2} ms at p50 across rounds, the same order as the gap; the sharder's own work per review is about 1.2 us over the floor's (`docs/performance-notes.md`, webhook per review).\n"
            );
        }
    }

    fn render_rolling(&self, out: &mut String) {
        let _ = writeln!(out, "## 5b. A rolling update of the shards\n");
        let Some(r) = &self.rolling else {
            let _ = writeln!(out, "Not run.\n");
            return;
        };
        let _ = writeln!(
            out,
            "{} objects on {} shards (the shard SDK in this process, acknowledging drains); each shard in turn stopped gracefully and started again, waiting until every object was on its shard before the next. Moves from the reconciler's log, writes to the objects from the audit log.\n",
            r.objects,
            crate::rolling::SHARDS
        );
        out.push_str(&table(
            &[
                "roll",
                "moves",
                "reconciler writes",
                "shard writes",
                "writes per object",
                "wall s",
            ],
            r.rolls.iter().map(|roll| {
                vec![
                    roll.mode.name().to_owned(),
                    roll.moves.to_string(),
                    roll.reconciler_writes.to_string(),
                    roll.shard_writes.to_string(),
                    format!(
                        "{:.2}",
                        (roll.reconciler_writes + roll.shard_writes) as f64
                            / r.objects.max(1) as f64
                    ),
                    format!("{:.1}", roll.wall.as_secs_f64()),
                ]
            }),
        ));
        let stable = r
            .rolls
            .iter()
            .find(|x| x.mode == crate::rolling::Mode::StableKeep);
        let _ = writeln!(
            out,
            "\nReleasing stable names moves each shard's objects off and back; fresh names move them off and a new share onto every new name.\n"
        );
        goals(
            out,
            &[Goal::new(
                "a rolling update of stable names (Leases kept)",
                stable.map_or("not run".to_owned(), |x| {
                    format!(
                        "{} moves, {} writes",
                        x.moves,
                        x.reconciler_writes + x.shard_writes
                    )
                }),
                "0 moves, 0 writes",
                stable.is_some_and(|x| x.moves == 0 && x.reconciler_writes + x.shard_writes == 0),
            )],
        );
    }

    fn render_load(&self, out: &mut String) {
        let _ = writeln!(out, "## 2. The webhook alone under load\n");
        match &self.load {
            None => {
                let _ = writeln!(out, "Not run (`--load-rounds 0` or not in `--sections`).\n");
            }
            Some(Err(e)) => {
                let _ = writeln!(out, "Failed: {e}\n");
            }
            Some(Ok(run)) => {
                let o = run.options;
                let _ = writeln!(
                    out,
                    "In-process (`cargo bench -p sharder-bench --bench load` runs the same): a hyper HTTP/1.1 keep-alive load generator with {} connections and both servers (floor and sharder, same TLS stack) on 2 worker threads each, {} rounds of {} s each alternating after a 1 s warm-up.\n\n{}",
                    o.connections,
                    o.rounds,
                    o.seconds,
                    run.markdown()
                );
                let (throughput, p99) = run.ratios();
                let met = goals(
                    out,
                    &[
                        Goal::new(
                            "sharder/floor throughput (medians)",
                            format!("{throughput:.2}x"),
                            &format!(">= {}x", crate::load::THROUGHPUT_GOAL),
                            throughput >= crate::load::THROUGHPUT_GOAL,
                        ),
                        Goal::new(
                            "sharder/floor p99 (medians)",
                            format!("{p99:.2}x"),
                            &format!("<= {}x", crate::load::P99_GOAL),
                            p99 <= crate::load::P99_GOAL,
                        ),
                    ],
                );
                if !met {
                    let _ = writeln!(
                        out,
                        "Why missed: what the sharder does per review that the floor does not, from a profile of this load, is in `docs/performance-notes.md` (webhook per review: the profile, and the webhook after it).\n"
                    );
                }
                let (throughput, p99) = run.controller_ring_ratios();
                let _ = writeln!(
                    out,
                    "A ControllerRing's reviews against a ClusterRing's on the same webhook (same spec and shards; medians): throughput {throughput:.2}x, p99 {p99:.2}x.\n"
                );
            }
        }
        self.render_load_processes(out);
    }

    fn render_load_processes(&self, out: &mut String) {
        if self.load_processes.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "Memory of the webhook processes under load: the floor webhook and the sharder webhook, each its own process as deployed (the sharder webhook watching the real ring and its 3 shard Leases, `MALLOC_ARENA_MAX={}` as the chart sets), loaded in turn by this process over {} HTTP/1.1 keep-alive TLS connections with a Secret CREATE review for {} s after a 1 s warm-up. RSS from `/proc/<pid>/status` (VmRSS before any load and right after, peak VmHWM).\n",
            self.args.webhook_malloc_arena_max,
            crate::load::PROCESS_CONNECTIONS,
            self.args.load_process_seconds
        );
        out.push_str(&table(
            &[
                "process",
                "reviews/s",
                "p50 ms",
                "p99 ms",
                "errors",
                "RSS before MiB",
                "RSS after MiB",
                "peak RSS MiB",
            ],
            self.load_processes.iter().map(|p| {
                vec![
                    p.name.to_owned(),
                    format!("{:.0}", p.load.reviews_per_second),
                    format!("{:.3}", ms(p.load.p50)),
                    format!("{:.3}", ms(p.load.p99)),
                    p.load.errors.to_string(),
                    format!("{:.1}", mib(p.idle)),
                    format!("{:.1}", mib(p.after)),
                    format!("{:.1}", mib(p.peak)),
                ]
            }),
        ));
        let by_name = |name: &str| self.load_processes.iter().find(|p| p.name == name);
        if let (Some(floor), Some(sharder)) = (by_name("floor webhook"), by_name("sharder webhook"))
        {
            let _ = writeln!(
                out,
                "\nThe sharder webhook's peak RSS under load: {:.1} MiB, {:+.1} MiB over the floor webhook's ({:.1} MiB), which holds no ring, no watches and no metrics.\n",
                mib(sharder.peak),
                mib(sharder.peak) - mib(floor.peak),
                mib(floor.peak)
            );
        }
    }

    fn render_memory(&self, out: &mut String) {
        let _ = writeln!(out, "## 3. Reconciler memory against object count\n");
        if self.memory.is_empty() {
            let _ = writeln!(out, "Not run.\n");
            return;
        }
        let _ = writeln!(
            out,
            "For each size: a fresh ring and namespace with that many Secrets (already assigned to 3 shard Leases), a reconciler process (`MALLOC_ARENA_MAX={}` as the chart sets) through its first full rebalance (a paginated, metadata-only list of every object) and a scale-out to 4 shards (drains of a quarter of the objects, not acknowledged: the drain checks every 2 s sweep for unassigned objects and read a page of the pending drains). Baseline in the same run: a process keeping a kube-rs reflector over the metadata of the same objects (what a controller caching every object's metadata holds). RSS from `/proc/<pid>/status` (VmRSS, peak VmHWM); sockets: the reconciler's open sockets after the scale-out (`/proc/<pid>/fd`).\n",
            self.args.reconciler_malloc_arena_max
        );
        out.push_str(&table(
            &[
                "objects",
                "reconciler steady MiB",
                "reconciler after scale-out MiB",
                "reconciler peak MiB",
                "reconciler sockets",
                "drained",
                "first full rebalance s",
                "scale-out rebalance s",
                "baseline steady MiB",
                "baseline peak MiB",
                "created/s",
            ],
            self.memory.iter().map(|r| {
                vec![
                    r.objects.to_string(),
                    format!("{:.1}", mib(r.reconciler_steady)),
                    format!("{:.1}", mib(r.reconciler_after_scale_out)),
                    format!("{:.1}", mib(r.reconciler_peak)),
                    r.reconciler_sockets.to_string(),
                    r.drained.to_string(),
                    format!("{:.2}", r.first_rebalance.as_secs_f64()),
                    format!("{:.2}", r.scale_out_rebalance.as_secs_f64()),
                    format!("{:.1}", mib(r.baseline_steady)),
                    format!("{:.1}", mib(r.baseline_peak)),
                    format!("{:.0}", r.create_rate),
                ]
            }),
        ));
        // The goal is the issue's: 100000 objects against 1000 (the largest size when a run
        // has no 100000); larger sizes are reported step by step.
        let goal = self
            .memory
            .iter()
            .find(|r| r.objects == GOAL_MEMORY_OBJECTS)
            .or(self.memory.last());
        if let (Some(small), Some(large)) = (self.memory.first(), goal) {
            let ratio = large.reconciler_peak as f64 / small.reconciler_peak as f64;
            let _ = writeln!(
                out,
                "\nBaseline at {} objects: {:.1} MiB ({:.1}x the reconciler).\n",
                large.objects,
                mib(large.baseline_steady),
                large.baseline_steady as f64 / large.reconciler_steady.max(1) as f64
            );
            goals(
                out,
                &[
                    Goal::new(
                        &format!(
                            "reconciler peak RSS at {} objects against {}",
                            large.objects, small.objects
                        ),
                        format!(
                            "{:.1} MiB vs {:.1} MiB = {ratio:.2}x",
                            mib(large.reconciler_peak),
                            mib(small.reconciler_peak)
                        ),
                        "<= 1.1x",
                        ratio <= 1.1,
                    ),
                    Goal::new(
                        &format!("reconciler peak RSS at {} objects", large.objects),
                        format!("{:.1} MiB", mib(large.reconciler_peak)),
                        "<= 20 MiB",
                        mib(large.reconciler_peak) <= 20.0,
                    ),
                ],
            );
            if self.memory.len() >= 3 {
                let steps: Vec<String> = self
                    .memory
                    .windows(2)
                    .map(|w| {
                        format!(
                            "{} -> {} objects: {:.1} -> {:.1} MiB ({:.2}x)",
                            w[0].objects,
                            w[1].objects,
                            mib(w[0].reconciler_peak),
                            mib(w[1].reconciler_peak),
                            w[1].reconciler_peak as f64 / w[0].reconciler_peak.max(1) as f64
                        )
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "The reconciler's peak from each size to the next: {}.\n",
                    steps.join("; ")
                );
            }
            if ratio > 1.1 || mib(large.reconciler_peak) > 20.0 {
                let _ = writeln!(
                    out,
                    "Why missed: from {} to {} objects the baseline cache grows by {:.0} MiB while the reconciler's peak changes by {:+.1} MiB; where the reconciler's memory goes (write connections, read buffers, the allocator) is in `docs/performance-notes.md` (reconciler memory).\n",
                    small.objects,
                    large.objects,
                    mib(large.baseline_steady.saturating_sub(small.baseline_steady)),
                    mib(large.reconciler_peak) - mib(small.reconciler_peak),
                );
            }
        }
    }

    fn render_rebalance(&self, out: &mut String) {
        let _ = writeln!(out, "## 4. Rebalancing 3 -> 4 shards\n");
        let Some(r) = &self.rebalance else {
            let _ = writeln!(out, "Not run.\n\n## 5. Shard crashes\n\nNot run.\n");
            return;
        };
        let Some(m) = r.median_round() else {
            let _ = writeln!(out, "No round ran.\n");
            return;
        };
        let _ = writeln!(
            out,
            "{} Secrets on 3 shards; shards run on the shard SDK in-process (real drain acknowledgements, no-op business logic, controller concurrency {}), the reconciler as a process (`--max-concurrent-writes {}`, adaptive below it; no rate limit), the sharder webhook assigning acknowledged objects. Each round: a fourth shard starts and its share moves (drain, acknowledgement); right after, raw merge PATCHes of the same objects (as many as the round wrote, each answered with the metadata only, as the reconciler's and the shards' writes are) at 16/32/64/128 in flight, as a ServiceAccount like the reconciler and the shards, and the same through the webhook (each removes the shard label, which the webhook puts back: what an acknowledgement costs); then the fourth shard stops, releasing its Lease, and its objects move back directly. Writes and their times come from the apiserver's audit log (received to answered), the end from a metadata watch of the bench. Each round is judged against the raw rates measured right beside it (this machine's write rate drifts by a fifth and more from one minute to the next), the goals on the median over the rounds. A live move is two writes of different cost, the drain (a plain PATCH) and the acknowledgement (through the webhook), so rebalancing is judged against that mix: half at the best raw rate, half at the raw rate through the webhook.\n",
            r.objects,
            if r.shard_concurrency == 0 {
                "unbounded".to_owned()
            } else {
                r.shard_concurrency.to_string()
            },
            r.concurrency
        );
        // What the mix of writes allows at best: half at the raw rate (drains), half at the raw
        // rate through the webhook (acknowledgements), each round's own.
        let mix_of = |x: &Round| {
            let plain = x.raw_best().per_second;
            2.0 / (1.0 / plain + 1.0 / x.raw_webhook.per_second) / plain
        };
        out.push_str(&table(
            &[
                "round",
                "moved",
                "writes",
                "writes/s (first to last)",
                "in flight",
                "best raw PATCH/s",
                "raw through the webhook/s",
                "vs best raw",
                "vs the mix",
                "wall s",
                "moved back directly/s (vs best raw)",
            ],
            r.rounds.iter().enumerate().map(|(i, round)| {
                let w = &round.writes;
                let best = round.raw_best();
                vec![
                    (i + 1).to_string(),
                    round.moved.to_string(),
                    format!("{} + {}", round.reconciler_writes, round.shard_writes),
                    format!("{:.0}", w.rate()),
                    format!("{:.1}", w.in_flight()),
                    format!("{:.0} (at {})", best.per_second, best.concurrency),
                    format!("{:.0}", round.raw_webhook.per_second),
                    format!("{:.2}", round.ratio()),
                    format!("{:.2}", round.ratio() / mix_of(round)),
                    format!("{:.2}", round.wall.as_secs_f64()),
                    format!(
                        "{:.0} ({:.2})",
                        round.scale_in.rate(),
                        round.scale_in_ratio()
                    ),
                ]
            }),
        ));
        let scale_in = r.median(Round::scale_in_ratio);
        let ideal = r.objects as f64 / 4.0;
        let worst_off = r
            .rounds
            .iter()
            .map(|x| (x.moved as f64 - ideal).abs() / ideal)
            .fold(0.0, f64::max);
        let exact = r
            .rounds
            .iter()
            .all(|x| x.reconciler_writes == x.moved && x.shard_writes == x.moved);
        let vs_mix = r.median(|x| x.ratio() / mix_of(x));
        out.push('\n');
        goals(
            out,
            &[
                Goal::new(
                    "objects moved, worst round off the ideal",
                    format!("{:.1} % (ideal {ideal:.0})", 100.0 * worst_off),
                    "<= 10 %",
                    worst_off <= 0.10,
                ),
                Goal::new(
                    "writes per moved object (drain + acknowledgement), every round",
                    if exact {
                        "2".to_owned()
                    } else {
                        "not 2 in some round".to_owned()
                    },
                    "2",
                    exact,
                ),
                Goal::new(
                    "rebalancing writes/s vs the mix's rate beside it (median over the rounds)",
                    format!("{vs_mix:.2}"),
                    ">= 0.9",
                    vs_mix >= 0.9,
                ),
                Goal::new(
                    "direct moves/s (the fourth shard leaving) vs the best raw PATCH/s beside them (median)",
                    format!("{scale_in:.2}"),
                    ">= 0.9",
                    scale_in >= 0.9,
                ),
            ],
        );
        if vs_mix < 0.9 {
            let _ = writeln!(
                out,
                "Why missed: the rebalancing reached {vs_mix:.2} of the mix's rate beside it. Where the apiserver spends a write through the webhook: `docs/performance-notes.md` (rebalancing through the webhook).\n"
            );
        }
        if scale_in < 0.9 {
            let rounds: Vec<String> = r
                .rounds
                .iter()
                .map(|x| format!("{:.2}", x.scale_in_ratio()))
                .collect();
            let _ = writeln!(
                out,
                "Why missed: the direct moves reached {scale_in:.2} of the best raw rate beside them (rounds: {}). They are written as the list of the leaving shard's objects comes in (a label-selected list from etcd reads the whole namespace), and a round's raw rate moves by a fifth from one minute to the next: `docs/performance-notes.md` (rebalancing and crashes part by part).\n",
                rounds.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "Raw PATCHes right after the median round (round {}):\n",
            r.rounds
                .iter()
                .position(|x| std::ptr::eq(x, m))
                .map_or(0, |i| i + 1)
        );
        let runs = m
            .raw
            .iter()
            .map(|x| (x.concurrency.to_string(), x))
            .chain([(
                format!("{} through the webhook", m.raw_webhook.concurrency),
                &m.raw_webhook,
            )]);
        out.push_str(&table(
            &["raw PATCH in flight", "patches", "patches/s"],
            runs.map(|(what, x)| vec![what, x.count.to_string(), format!("{:.0}", x.per_second)]),
        ));
        out.push('\n');
        self.render_crash(out, r);
    }

    fn render_crash(&self, out: &mut String, r: &RebalanceResult) {
        let _ = writeln!(out, "## 5. Shard crashes\n");
        let _ = writeln!(
            out,
            "After the rounds, {} times: a fresh shard joins the three and takes its share (live moves), then stops at once (its task aborted: no release, no more renewals). A Lease counts as expired after its duration and is taken over one duration later (the protocol's `uncertain` state), then its objects move directly (no drain). Right after each crash's objects are back, raw merge PATCHes of the namespace's objects ({} times as many as the crash had, each object at most once per run) at 16/32/64/128 in flight, as in section 4: the apiserver's plain write rate beside the crash. The runs are longer than the moves: a run of about 2 s holds none or one of the apiserver's garbage collections, which moves its rate by a fifth either way. Bound: 2 x lease + N / best raw rate + 1 s.\n",
            r.crashes.len(),
            RAW_AFTER_CRASH,
        );
        out.push_str(&table(
            &[
                "crash",
                "objects",
                "reassigned after s",
                "bound s",
                "writes",
                "moves/s (first received to last answered)",
                "in flight",
                "best raw right after /s",
                "vs it",
                &format!("raw at {} right after /s", r.concurrency),
                "vs it",
            ],
            r.crashes.iter().map(|c| {
                let raw = c.raw_beside();
                let same = RawPatches::rate_at(&c.raw, r.concurrency);
                vec![
                    c.shard.clone(),
                    c.objects.to_string(),
                    format!("{:.2}", c.recovery.as_secs_f64()),
                    format!("{:.2}", c.bound(r.lease, raw)),
                    c.moves.count.to_string(),
                    format!("{:.0}", c.moves.rate()),
                    format!("{:.1}", c.moves.in_flight()),
                    format!(
                        "{raw:.0} (at {})",
                        c.raw_best().map_or(0, |x| x.concurrency)
                    ),
                    format!("{:.2}", c.ratio(raw)),
                    format!("{same:.0}"),
                    format!("{:.2}", c.ratio(same)),
                ]
            }),
        ));
        let within = r
            .crashes
            .iter()
            .filter(|c| c.recovery.as_secs_f64() <= c.bound(r.lease, c.raw_beside()))
            .count();
        let margin =
            r.crash_median(|c| c.bound(r.lease, c.raw_beside()) - c.recovery.as_secs_f64());
        let exact = r.crashes.iter().all(|c| c.moves.count == c.objects);
        // The goal: against raw PATCHes at the reconciler's own concurrency right after.
        let vs_same = r.crash_median(|c| c.ratio(RawPatches::rate_at(&c.raw, r.concurrency)));
        out.push('\n');
        goals(
            out,
            &[
                Goal::new(
                    "crashes whose objects were reassigned within the bound",
                    format!(
                        "{within} of {} (median margin {margin:.2} s)",
                        r.crashes.len()
                    ),
                    "every crash",
                    within == r.crashes.len(),
                ),
                Goal::new(
                    &format!(
                        "dead-shard moves/s vs raw PATCH/s at {} in flight right after each crash (median)",
                        r.concurrency
                    ),
                    format!("{vs_same:.2}"),
                    ">= 0.9",
                    vs_same >= 0.9,
                ),
                Goal::new(
                    "writes per dead-shard move, every crash",
                    if exact {
                        "1".to_owned()
                    } else {
                        "not 1 in some crash".to_owned()
                    },
                    "1",
                    exact,
                ),
            ],
        );
        if vs_same < 0.9 {
            let _ = writeln!(
                out,
                "Why missed: the dead-shard moves reached {vs_same:.2} of the raw rate at the same concurrency. The apiserver, etcd, the reconciler and the shards share this machine's 2 cores, and the moves carry the list of the dead shard's objects (a label-selected list from etcd reads the whole namespace): `docs/performance-notes.md` (rebalancing and crashes part by part).\n"
            );
        }
    }

    fn render_ring(&self, out: &mut String) {
        let _ = writeln!(out, "## 6. Ring\n");
        let Some(r) = &self.ring else {
            let _ = writeln!(out, "Not run.\n");
            return;
        };
        match &r.lookups {
            Ok(lookups) => {
                let rows = lookups
                    .iter()
                    .map(|(name, time)| vec![name.clone(), time.clone()]);
                let _ = writeln!(
                    out,
                    "Lookup (criterion, `cargo bench -p sharder-common --bench ring`; 100 tokens per shard, XXH64, binary search):\n\n{}",
                    table(&["benchmark", "time [low estimate high]"], rows)
                );
            }
            Err(e) => {
                let _ = writeln!(out, "Lookup bench: {e}\n");
            }
        }
        let balance = r.balance.iter().map(|b| {
            vec![
                b.shards.to_string(),
                format!("{:.3}", b.max_over_mean),
                format!("{:.3}", b.min_over_mean),
                format!("{:.1} %", 100.0 * b.relative_std_dev),
            ]
        });
        let _ = writeln!(
            out,
            "Balance over 100,000 object keys:\n\n{}",
            table(
                &["shards", "max/mean", "min/mean", "relative std dev"],
                balance
            )
        );
        let moved = r
            .v08_moves
            .iter()
            .map(|(shards, share)| vec![shards.to_string(), format!("{:.1} %", 100.0 * share)]);
        let _ = writeln!(
            out,
            "Switching from the reference's v0.8 sharder (object key `<apiVersion>/<Kind>/<namespace>/<name>`) to the current key (`<group>/<Kind>/<namespace>/<name>`): share of 100,000 objects (Secrets, Deployments and a custom resource in turn) that land on another shard, moved once.\n\n{}",
            table(&["shards", "objects moved"], moved)
        );
    }
}

impl Report {
    fn render_node(&self, out: &mut String) {
        let _ = writeln!(out, "## 7. The chart's pods on a real node\n");
        let r = match &self.node {
            None => {
                let _ = writeln!(out, "Not run.\n");
                return;
            }
            Some(Err(e)) => {
                let _ = writeln!(out, "Could not run: {e}\n");
                return;
            }
            Some(Ok(r)) => r,
        };
        let _ = writeln!(
            out,
            "The chart installed with Helm as the README says (2 webhook and 2 reconciler pods, the image built from this checkout's {} binaries) on a single-node cluster of this machine (`sharder_harness::node`: kubelet, containerd, kube-proxy, kube-scheduler, its own apiserver and etcd); the example shards as the StatefulSet of `docs/examples/statefulset-shards.yaml` (3 replicas); {} Secrets created through the webhook's Service (64 in flight), each with its checksums ConfigMap made by its shard; then `kubectl scale --replicas=4`. Working set: the container's memory cgroup usage minus its inactive file pages (what kubelet reports and evicts by), once every object is on its shard, after the scale-out, and the highest sampled every second from the install on; beside it the container's process as `/proc` counts it (VmRSS after the scale-out with its anonymous part RssAnon, peak VmHWM). The process figures include the binary's file pages (RSS minus RssAnon); the container's cgroup is not charged for them (they entered the page cache when containerd unpacked the image), so its working set is close to the anonymous part.\n",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            r.objects
        );
        let steps = [
            (
                "`helm install` to all 4 pods Ready",
                format!("{:.1} s", r.install.as_secs_f64()),
            ),
            (
                "the example applied to its 3 shards Ready and in the ring",
                format!("{:.1} s", r.shards_ready.as_secs_f64()),
            ),
            (
                "creates through the webhook",
                format!(
                    "{:.0}/s, {} of {} without a shard label after CREATE",
                    r.create_rate, r.unassigned_at_create, r.objects
                ),
            ),
            (
                "last create to every object with its checksums on its shard",
                format!("{:.1} s", r.converged.as_secs_f64()),
            ),
            (
                "scale-out 3 -> 4 to every object on its shard",
                format!(
                    "{:.1} s, {} objects moved",
                    r.scale_out.as_secs_f64(),
                    r.moved
                ),
            ),
        ];
        let _ = writeln!(
            out,
            "{}",
            table(
                &["step", "measured"],
                steps.map(|(k, v)| vec![k.to_owned(), v])
            )
        );
        let rows = r.pods.iter().map(|p| {
            vec![
                p.pod.clone(),
                p.role.clone(),
                p.steady
                    .map_or("-".to_owned(), |s| format!("{:.1}", mib(s))),
                format!("{:.1}", mib(p.after_scale_out)),
                format!("{:.1}", mib(p.peak)),
                p.max_usage
                    .map_or("-".to_owned(), |m| format!("{:.1}", mib(m))),
                format!("{:.1} ({:.1})", mib(p.rss), mib(p.rss_anon)),
                format!("{:.1}", mib(p.hwm)),
            ]
        });
        let _ = writeln!(
            out,
            "{}",
            table(
                &[
                    "pod",
                    "runs",
                    "working set, settled MiB",
                    "working set, after scale-out MiB",
                    "working set, peak sampled MiB",
                    "cgroup peak usage MiB",
                    "process RSS (anonymous) MiB",
                    "process peak RSS MiB",
                ],
                rows
            )
        );
        let mut beside = Vec::new();
        if let Some(m) = self.memory.iter().find(|m| m.objects == r.objects) {
            beside.push(format!(
                "the reconciler process of section 3 at {} objects: {:.1} MiB settled, {:.1} MiB peak",
                m.objects,
                mib(m.reconciler_steady),
                mib(m.reconciler_peak)
            ));
        }
        if let Some(p) = self
            .load_processes
            .iter()
            .find(|p| p.name == "sharder webhook")
        {
            beside.push(format!(
                "the webhook process of section 2 under load: {:.1} MiB peak",
                mib(p.peak)
            ));
        }
        if !beside.is_empty() {
            let _ = writeln!(
                out,
                "Beside the same binaries run as processes in this report: {}.\n",
                beside.join("; ")
            );
        }
    }
}
