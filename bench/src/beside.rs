//! Section 9, Sharder beside the reference sharder, both as they run by default: the reference's
//! own `sharder` binary, given with `--reference` (the bench runs it, never builds it). For each
//! size one ControllerRing of Secrets on three shards of the shard SDK in this process; Sharder
//! (its reconciler as a process, the bench's sharder webhook) and then the reference (its one
//! process) take the same ring and the same objects in turn, never both at once (each reconciles
//! every ControllerRing it sees). Each, from the same placement: the CREATE latency its webhook
//! adds (first size), its memory, a 3 -> 4 scale-out and a shard crash (first size). Writes come from the
//! apiserver's audit log, times from the bench's metadata watch of the objects, memory from
//! `/proc`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use sharder_common::RingKind;
use sharder_harness::launch::{Reconciler, dump_logs};
use sharder_harness::procfs::rss_kib;
use sharder_harness::{ControlPlane, Supervised};
use sharder_sdk::lease::OnStop;

use crate::create_latency::Creator;
use crate::rebalance::Movers;
use crate::report::{goals, table};
use crate::stats::{median, mib};
use crate::webhooks::Webhooks;
use crate::{Args, Error};

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

/// One contender's figures at one size.
#[derive(Clone, Debug, Default, PartialEq)]
struct Figures {
    /// CREATE latency it adds, p50 and p99 (ms), when measured.
    added: Option<[f64; 2]>,
    /// Peak memory (MiB).
    memory: f64,
    /// Scale-out: objects moved, wall seconds, writes by the contender.
    moved: usize,
    scale_out: f64,
    writes: usize,
    /// Seconds from a shard's crash to every object on a live shard (first size).
    crash: Option<f64>,
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
        let mut m = Movers::prepare(
            cp,
            args,
            &prefix,
            &names,
            OnStop::Release,
            RingKind::ControllerRing,
            n,
        )
        .await?;
        let mut figures = Vec::new();
        for &contender in &contenders {
            eprintln!("[bench]   {n} objects: {}", contender.name());
            let measured = contend(&mut m, webhooks, args, contender, (n, i == 0)).await;
            if measured.is_err() {
                let log = match contender {
                    Contender::Sharder => format!("reconciler-{}", m.setup.ns),
                    Contender::Reference(_) => REFERENCE_LOG.to_owned(),
                };
                dump_logs(m.dir(), [log], 40);
            }
            figures.push(measured?);
        }
        for shard in std::mem::take(&mut m.shards).into_values() {
            shard.crash();
        }
        let last = i + 1 == args.reference_sizes.len();
        m.setup.remove(!last).await?;
        let sharder = figures.remove(0);
        rows.push((n, sharder, figures.pop()));
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

/// `contender` takes the ring of `m` (its `n` objects each on its shard, three shards), adds
/// a fourth shard, and when `first` the CREATE latency rounds before it and its crash after it;
/// it is stopped after, the objects back on the first three shards.
async fn contend(
    m: &mut Movers,
    webhooks: &Webhooks,
    args: &Args,
    contender: Contender<'_>,
    (n, first): (usize, bool),
) -> Result<Figures, Error> {
    let names: Vec<String> = m.shards.keys().cloned().collect();
    let mut running = match contender {
        Contender::Sharder => Running::Sharder(m.start_reconciler(webhooks, "", n).await?),
        Contender::Reference(binary) => {
            // Sharder's reconciler owns the fields of the ring's webhook configuration, and the
            // reference applies its own without forcing: a switch back deletes it first.
            let mwcs: Api<MutatingWebhookConfiguration> = Api::all(m.setup.client.clone());
            let name = m.setup.id().configuration_name();
            match mwcs.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            let run = ReferenceRun {
                binary,
                dir: m.dir(),
                kubeconfig: m.kubeconfig(),
                namespace: &m.setup.ns,
            };
            Running::Reference(start_reference(&run, webhooks, None)?)
        }
    };
    let outcome = measure(m, webhooks, args, &running, &names, first).await;
    running.stop();
    outcome
}

/// The measurements of one contender while it runs.
async fn measure(
    m: &mut Movers,
    webhooks: &Webhooks,
    args: &Args,
    running: &Running,
    names: &[String],
    first: bool,
) -> Result<Figures, Error> {
    wait_until_assigning(m, running).await?;
    let added = if first {
        Some(latency_added(m, args).await?)
    } else {
        None
    };

    // A fourth shard joins.
    let (mark, start, joined) = (m.cp.audit_mark(), Timestamp::now(), Instant::now());
    m.start_shard("shard-3", OnStop::Release);
    let mut four = names.to_vec();
    four.push("shard-3".into());
    let (at, placed) = m.converge(&four).await?;
    let (_, [writes, _, _]) = m.writes(mark, start, &[0]).await;
    let memory = running.memory(webhooks)?;
    let moved = placed.values().filter(|s| *s == "shard-3").count();

    // It crashes (no release, its Lease expires), or leaves.
    let crashed = Instant::now();
    if let Some(shard) = m.shards.remove("shard-3") {
        if first {
            shard.crash();
        } else {
            shard.stop().await;
        }
    }
    let (back, _) = m.converge(names).await?;
    Ok(Figures {
        added,
        memory,
        moved,
        scale_out: (at - joined).as_secs_f64(),
        writes,
        crash: first.then(|| (back - crashed).as_secs_f64()),
    })
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
/// `<dir>/reference-sharder.log`.
pub(crate) fn start_reference(
    run: &ReferenceRun<'_>,
    webhooks: &Webhooks,
    sync: Option<Duration>,
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
    let secrets = m.setup.secrets();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut probes = Vec::new();
    let outcome = loop {
        if Instant::now() > deadline {
            break Err(Error::Setup(format!(
                "{name} did not call the webhook, or it did not assign, within 2 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let calls = mwcs.get_opt(&name).await?.is_some_and(|mwc| {
            let urls = mwc.webhooks.unwrap_or_default().into_iter();
            let mut urls = urls.map(|w| w.client_config.url.unwrap_or_default());
            urls.all(|u| url.is_none_or(|url| u.starts_with(url)))
        });
        if !calls {
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
        if m.setup.shard_of(&created).is_some() {
            break Ok(());
        }
    };
    delete_all(&secrets, probes).await?;
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

/// `args.rounds` rounds of `args.creates` Secrets at `args.rate`, alternately in a namespace no
/// webhook selects and in the ring's (the webhook registered now assigns them; they are deleted
/// after); the added latency at p50 and p99 (ms), medians over the rounds.
async fn latency_added(m: &Movers, args: &Args) -> Result<[f64; 2], Error> {
    let client = &m.setup.client;
    let plain_ns = m.cp.namespace("bench-beside-plain").await?;
    let (plain, ringed) = (
        Creator::of_secrets(client, &plain_ns),
        Creator::of_secrets(client, &m.setup.ns),
    );
    let (mut p50, mut p99, mut created) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..=args.rounds {
        let base = plain
            .round(false, &format!("plain-{r}"), args.creates, args.rate)
            .await;
        let hooked = ringed
            .round(false, &format!("lat-{r}"), args.creates, args.rate)
            .await;
        created.extend((0..args.creates).map(|i| format!("lat-{r}-{i}")));
        if base[4] + hooked[4] > 0.0 {
            return Err(Error::Setup(format!(
                "{} of the latency round's creates failed",
                base[4] + hooked[4]
            )));
        }
        // Round 0 warms both up.
        if r > 0 {
            p50.push(hooked[0] - base[0]);
            p99.push(hooked[2] - base[2]);
        }
    }
    delete_all(&m.setup.secrets(), created).await?;
    Api::<Namespace>::all(client.clone())
        .delete(&plain_ns, &DeleteParams::default())
        .await?;
    Ok([median(p50), median(p99)])
}

/// The section's text: how it was measured, the figures per size and contender, the goals.
fn markdown(args: &Args, rows: &[(usize, Figures, Option<Figures>)]) -> String {
    let mut out = format!(
        "The reference's `sharder` binary ({}) and Sharder, each at its defaults, one after the other on the same control plane, ring and objects: a ControllerRing of Secrets on 3 shards of the shard SDK in this process (the same drain acknowledgement for both: the protocol is the same), every object on its shard. Each contender in turn: its webhook's added CREATE latency (first size only: {} rounds of {} creates at {}/s, each against a round in a namespace no webhook selects right before it; medians of the rounds), then a fourth shard joins (wall time from its start to every object on its shard of the 4-shard ring, seen by the bench's watch; the contender's writes from the audit log), then at the first size it crashes (its Lease not released, {} s; time to every object on a live shard; at the other sizes it leaves). Memory: the peak RSS (VmHWM) of the process that moves the objects, plus for Sharder its webhook's RSS (the reference serves its webhook from the same process). Sharder's webhook serves every ring of the bench; the reference's process watches every ControllerRing, so the contenders never run at once.\n\n",
        args.reference
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        args.rounds,
        args.creates,
        args.rate,
        args.lease_seconds
    );
    let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    out += &table(
        "objects | contender | added p50 ms | added p99 ms | memory MiB | moved | scale-out s | writes | crash to reassigned s",
        rows.iter().flat_map(|(n, sharder, reference)| {
            let both = std::iter::once(("Sharder", sharder));
            both.chain(reference.iter().map(|r| ("reference", r)))
                .map(move |(who, f)| {
                    format!(
                        "{n} | {who} | {} | {} | {:.1} | {} | {:.2} | {} | {}",
                        cell(f.added.map(|a| a[0])),
                        cell(f.added.map(|a| a[1])),
                        f.memory,
                        f.moved,
                        f.scale_out,
                        f.writes,
                        cell(f.crash)
                    )
                })
        }),
    );
    if rows.iter().any(|(_, _, r)| r.is_none()) {
        out += NOT_RUN;
    }
    let mut goal_rows = Vec::new();
    for (n, s, r) in rows {
        let Some(r) = r else { continue };
        if let (Some(sa), Some(ra)) = (s.added, r.added) {
            for (i, p) in [(0, "p50"), (1, "p99")] {
                goal_rows.push(cost(
                    format!("CREATE latency added, {p} ({n} objects)"),
                    sa[i],
                    ra[i],
                    "ms",
                ));
            }
        }
        goal_rows.push(cost(
            format!("memory ({n} objects)"),
            s.memory,
            r.memory,
            "MiB",
        ));
        goal_rows.push(cost(
            format!("scale-out writes ({n} objects)"),
            s.writes as f64,
            r.writes as f64,
            "",
        ));
        goal_rows.push(speed(
            format!("scale-out wall time ({n} objects)"),
            s.scale_out,
            r.scale_out,
        ));
        if let (Some(sc), Some(rc)) = (s.crash, r.crash) {
            goal_rows.push(speed(format!("crash to reassigned ({n} objects)"), sc, rc));
        }
    }
    if !goal_rows.is_empty() {
        out += &goals(&goal_rows);
    }
    out + "The reference's own binary's idle cost is in section 8.\n\n"
}

/// A cost row: Sharder's figure against the reference's, met at or below it.
fn cost(what: String, sharder: f64, reference: f64, unit: &str) -> crate::report::Goal {
    let ratio = sharder / reference;
    let figure = format!(
        "{sharder:.2}{unit} vs {reference:.2}{unit} = {}",
        ratio_text(ratio)
    );
    (what, figure, "<= 1.0x", sharder <= reference)
}

/// A speed row from two durations (s): the reference's over Sharder's, met at or above 1.
fn speed(what: String, sharder: f64, reference: f64) -> crate::report::Goal {
    let ratio = reference / sharder;
    let figure = format!(
        "{sharder:.2} s vs {reference:.2} s = {} as fast",
        ratio_text(ratio)
    );
    (what, figure, ">= 1.0x", sharder <= reference)
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
        let text = markdown(&args, &[(100, sharder, None)]);
        assert!(text.contains("| 100 | Sharder | - | - | 20.0 |"), "{text}");
        assert!(text.contains(NOT_RUN), "{text}");
        assert!(
            !text.contains("| reference |") && !text.contains("| goal |"),
            "{text}"
        );
    }

    #[test]
    fn each_row_holds_sharder_against_the_reference_as_a_cost_or_a_speed() {
        let args = <Args as clap::Parser>::parse_from(["sharder-bench", "--reference", "/ref"]);
        let sharder = Figures {
            added: Some([1.0, 4.0]),
            memory: 20.0,
            moved: 2500,
            scale_out: 10.0,
            writes: 2500,
            crash: Some(14.0),
        };
        let reference = Figures {
            added: Some([2.0, 3.0]),
            memory: 80.0,
            moved: 2500,
            scale_out: 5.0,
            writes: 2500,
            crash: Some(16.0),
        };
        let later = |f: &Figures| Figures {
            added: None,
            crash: None,
            ..f.clone()
        };
        let text = markdown(
            &args,
            &[
                (10_000, sharder.clone(), Some(reference.clone())),
                (100_000, later(&sharder), Some(later(&reference))),
            ],
        );
        assert!(
            text.contains("| 100000 | Sharder | - | - | 20.0 | 2500 | 10.00 | 2500 | - |")
                && text.contains("| memory (100000 objects) |")
                && !text.contains("crash to reassigned (100000 objects)"),
            "a crash only at the first size: {text}"
        );
        for row in [
            "| 10000 | Sharder | 1.00 | 4.00 | 20.0 | 2500 | 10.00 | 2500 | 14.00 |",
            "| CREATE latency added, p50 (10000 objects) | 1.00ms vs 2.00ms = 0.50x | <= 1.0x | met |",
            "| CREATE latency added, p99 (10000 objects) | 4.00ms vs 3.00ms = 1.33x | <= 1.0x | **missed** |",
            "| memory (10000 objects) | 20.00MiB vs 80.00MiB = 0.25x | <= 1.0x | met |",
            "| scale-out writes (10000 objects) | 2500.00 vs 2500.00 = 1.00x | <= 1.0x | met |",
            "| scale-out wall time (10000 objects) | 10.00 s vs 5.00 s = 0.50x as fast | >= 1.0x | **missed** |",
            "| crash to reassigned (10000 objects) | 14.00 s vs 16.00 s = 1.14x as fast | >= 1.0x | met |",
        ] {
            assert!(text.contains(row), "{row}\n{text}");
        }
    }

    #[test]
    fn a_ratio_of_a_figure_at_or_below_zero_is_not_printed() {
        assert_eq!(ratio_text(-0.5), "no ratio");
        assert_eq!(ratio_text(f64::INFINITY), "no ratio");
        assert_eq!(ratio_text(0.5), "0.50x");
    }
}
