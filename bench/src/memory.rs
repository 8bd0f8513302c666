//! Section 3, reconciler memory against object count: for each size, a fresh ring with that many
//! Secrets (already assigned), a reconciler process through its first full rebalance and a
//! scale-out 3 -> 4 shards; beside it, a baseline process that caches every object's metadata (a
//! kube-rs reflector over metadata), what not caching saves.

use std::time::Duration;

use sharder_common::Ring;
use sharder_harness::ControlPlane;
use sharder_harness::procfs::{open_sockets, rss_kib};

use crate::report::{goals, table};
use crate::stats::mib;
use crate::webhooks::{Webhooks, metadata_cache};
use crate::{Args, Error, RingSetup, rebalanced};

/// One size's readings: objects, then the reconciler's RSS after its first full rebalance,
/// after the scale-out and at peak, and the baseline's RSS (MiB).
type Row = (usize, [f64; 4]);

/// The size the memory goal holds against the smallest one.
const GOAL_OBJECTS: usize = 100_000;

/// The RSS and peak RSS (MiB) of process `pid`, read after 2 s of settling.
async fn settled_rss(pid: u32, what: &str) -> Result<(f64, f64), Error> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, peak) = rss_kib(pid).ok_or_else(|| Error::Setup(format!("no RSS of the {what}")))?;
    Ok((mib(rss), mib(peak)))
}

/// Measures every size of `args.sizes`; runs last, as the namespace of the last size is left
/// to be deleted. The section's text.
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<String, Error> {
    let (mut rows, mut cells) = (Vec::new(), Vec::new());
    for (i, &n) in args.sizes.iter().enumerate() {
        let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
        let setup = RingSetup::new(cp, &format!("bench-mem-{n}"), false, 3).await?;
        let created = setup
            .create_assigned(0..n, &Ring::new((0..3).map(|i| format!("shard-{i}"))))
            .await?;
        let flags = "--max-writes-per-second 0 --resync-interval 1h --sweep-interval 1h";
        let mut reconciler = setup
            .start_reconciler(dir.path(), cp.kubeconfig(), webhooks, flags, n)
            .await?;
        let pid = reconciler.process.pid();
        let (steady, _) = settled_rss(pid, "reconciler").await?;
        let skip = reconciler.process.lines().len();
        setup.add_shard_lease("shard-3", 3600).await;
        let line = reconciler
            .process
            .wait_for(
                "the scale-out's drains",
                skip,
                Duration::from_secs(600),
                |l| rebalanced(l, n) && l["drained"].as_u64().unwrap_or(0) > 0,
            )
            .await?;
        let (after, peak) = settled_rss(pid, "reconciler").await?;
        let sockets = open_sockets(pid).unwrap_or(0);
        drop(reconciler);

        let mut baseline = metadata_cache(cp, &setup.ns, n).await?;
        let (cache, _) = settled_rss(baseline.pid(), "baseline").await?;
        baseline.kill();
        eprintln!(
            "[bench]   {n}: reconciler {steady:.1} MiB, peak {peak:.1} MiB; baseline {cache:.1} MiB"
        );
        let (drained, took) = (
            &line["drained"],
            line["duration_ms"].as_f64().unwrap_or(0.0) / 1e3,
        );
        cells.push(format!("{n} | {steady:.1} | {after:.1} | {peak:.1} | {sockets} | {drained} | {took:.2} | {cache:.1} | {created:.0}"));
        rows.push((n, [steady, after, peak, cache]));
        // The last size's namespace is deleted without waiting: nothing is measured after it.
        setup
            .remove(n >= 10_000 && i + 1 < args.sizes.len())
            .await?;
    }
    let mut out = "For each size: a fresh ring and namespace with that many Secrets (already assigned to 3 shard Leases), a reconciler process (`MALLOC_ARENA_MAX` as the chart sets) through its first full rebalance (a paginated, metadata-only list of every object) and a scale-out to 4 shards (drains of a quarter of the objects, not acknowledged). Baseline in the same run: a process keeping a kube-rs reflector over the metadata of the same objects (what a controller caching every object's metadata holds). RSS from `/proc/<pid>/status` (VmRSS, peak VmHWM); sockets: the reconciler's open sockets after the scale-out.\n\n".to_owned();
    out += &table(
        "objects | reconciler steady MiB | reconciler after scale-out MiB | reconciler peak MiB | reconciler sockets | drained | scale-out rebalance s | baseline steady MiB | created/s",
        cells,
    );
    Ok(out + &memory_goals(&rows))
}

/// The goals: the peak at [`GOAL_OBJECTS`] (or the largest size) against the smallest size's.
fn memory_goals(rows: &[Row]) -> String {
    let large = rows.iter().find(|r| r.0 == GOAL_OBJECTS).or(rows.last());
    let (Some((small, [_, _, from, _])), Some((large, [steady, _, peak, cache]))) =
        (rows.first(), large)
    else {
        return String::new();
    };
    let ratio = peak / from;
    let mut out = format!(
        "Baseline at {large} objects: {cache:.1} MiB ({:.1}x the reconciler).\n\n",
        cache / steady
    );
    out += &goals(&[
        (
            format!("reconciler peak RSS at {large} objects against {small}"),
            format!("{peak:.1} MiB vs {from:.1} MiB = {ratio:.2}x"),
            "<= 1.1x",
            ratio <= 1.1,
        ),
        (
            format!("reconciler peak RSS at {large} objects"),
            format!("{peak:.1} MiB"),
            "<= 20 MiB",
            *peak <= 20.0,
        ),
    ]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_goal_holds_the_peak_at_100000_objects_against_the_smallest_size() {
        let rows = [
            (1000, [15.0, 18.0, 18.0, 14.0]),
            (100_000, [15.0, 19.0, 19.5, 480.0]),
            (300_000, [15.0, 19.0, 25.0, 1400.0]),
        ];
        let text = memory_goals(&rows);
        assert!(text.contains("| reconciler peak RSS at 100000 objects against 1000 | 19.5 MiB vs 18.0 MiB = 1.08x | <= 1.1x | met |"), "{text}");
        assert!(
            text.contains("Baseline at 100000 objects: 480.0 MiB (32.0x the reconciler)"),
            "{text}"
        );
        let missed = memory_goals(
            &rows[..1]
                .iter()
                .chain(&rows[2..])
                .copied()
                .collect::<Vec<_>>(),
        );
        assert!(
            missed.contains("at 300000 objects | 25.0 MiB | <= 20 MiB | **missed** |"),
            "{missed}"
        );
    }
}
