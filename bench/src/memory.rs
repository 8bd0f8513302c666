//! Section 3, reconciler memory against object count: for each size, the bench's ring of that
//! many Secrets (already assigned), [`runs`] reconciler processes one after another, each
//! through its first full rebalance and a scale-out 3 -> 4 shards (the objects put back between
//! runs), the run with the median peak reported; beside it, a baseline process that caches every
//! object's metadata (a kube-rs reflector over metadata), what not caching saves.

use std::time::Duration;

use kube::api::DeleteParams;
use sharder_harness::ControlPlane;
use sharder_harness::procfs::{open_sockets, rss_kib};

use crate::progress::progress;
use crate::report::{goals, table};
use crate::stats::mib;
use crate::webhooks::{Webhooks, metadata_cache};
use crate::{Error, RingSetup};

/// One size's readings: objects, then the reconciler's RSS after its first full rebalance,
/// after the scale-out and at peak, and the baseline's RSS (MiB).
type Row = (usize, [f64; 4]);

/// The size the memory goal holds against the smallest one.
pub(crate) const GOAL_OBJECTS: usize = 100_000;

/// Reconciler runs at `n` objects (or Pods, section 3b): a peak is one process's high-water mark
/// over a scale-out of a few seconds at most, noisy from process to process
/// (docs/performance-notes.md), so small sizes run 3 times; from 100,000 on a scale-out's peak
/// is steady and each run costs minutes, so they run once.
pub(crate) fn runs(n: usize) -> usize {
    if n >= GOAL_OBJECTS { 1 } else { 3 }
}

/// The RSS and peak RSS (MiB) of process `pid`, read after 2 s of settling.
pub(crate) async fn settled_rss(pid: u32, what: &str) -> Result<(f64, f64), Error> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, peak) = rss_kib(pid).ok_or_else(|| Error::Setup(format!("no RSS of the {what}")))?;
    Ok((mib(rss), mib(peak)))
}

/// Section 3's figures, size by size.
#[derive(Default)]
pub(crate) struct Memory {
    rows: Vec<Row>,
    cells: Vec<String>,
}

impl Memory {
    /// Measures the `n` objects of `objects` (each on its shard of 3, created at `created` per
    /// second); leaves them with Lease `shard-3` and a quarter of them draining (the ring is
    /// not used after).
    pub(crate) async fn size(
        &mut self,
        cp: &'static ControlPlane,
        webhooks: &Webhooks,
        objects: &RingSetup,
        (n, created): (usize, f64),
    ) -> Result<(), Error> {
        let (count, mut runs) = (runs(n), Vec::new());
        for run in 0..count {
            if run > 0 {
                put_back(objects).await?;
            }
            progress!("  {n} objects: reconciler run {} of {count}", run + 1);
            runs.push(scale_out(objects, webhooks, cp, n).await?);
        }
        // The run with the median peak, whole; every run's peak beside it.
        let peaks: Vec<String> = runs.iter().map(|r| format!("{:.1}", r.0[2])).collect();
        runs.sort_by(|a, b| a.0[2].total_cmp(&b.0[2]));
        let ([steady, after, peak], scale_out) = runs.swap_remove(runs.len() / 2);

        let mut baseline = metadata_cache(cp, &objects.ns, n).await?;
        let (cache, _) = settled_rss(baseline.pid(), "baseline").await?;
        baseline.kill();
        progress!(
            "  {n}: reconciler {steady:.1} MiB, peaks {peaks:?} MiB; baseline {cache:.1} MiB"
        );
        self.cells.push(format!("{n} | {steady:.1} | {after:.1} | {peak:.1} | {} | {scale_out} | {cache:.1} | {created:.0}", peaks.join(", ")));
        self.rows.push((n, [steady, after, peak, cache]));
        Ok(())
    }

    /// The section's text of the sizes measured.
    pub(crate) fn text(&self) -> String {
        let mut out = format!(
            "For each size: a ring (a ControllerRing) and namespace with that many Secrets (already assigned to 3 shard Leases; the same objects as section 8's at that size), a reconciler process (`MALLOC_ARENA_MAX` as the chart sets) through its first full rebalance (a paginated, metadata-only list of every object) and a scale-out to 4 shards (drains of a quarter of the objects, not acknowledged); {} such processes one after another below {GOAL_OBJECTS} objects, {} from there on (between them the fourth Lease is deleted and the drains taken off again), the run with the median peak shown, every run's peak beside it. Baseline in the same run: a process keeping a kube-rs reflector over the metadata of the same objects (what a controller caching every object's metadata holds). RSS from `/proc/<pid>/status` (VmRSS, peak VmHWM); sockets: the reconciler's open sockets after the scale-out.\n\n",
            runs(0),
            runs(GOAL_OBJECTS)
        );
        out += &table(
            "objects | reconciler steady MiB | reconciler after scale-out MiB | reconciler peak MiB | every run's peak MiB | reconciler sockets | drained | scale-out rebalance s | baseline steady MiB | created/s",
            self.cells.iter().cloned(),
        );
        out + &memory_goals(&self.rows)
    }
}

/// One reconciler run: its RSS (MiB) after the first full rebalance, after the scale-out and at
/// peak; the scale-out's sockets, drains and seconds as table cells.
type Run = ([f64; 3], String);

/// Starts a reconciler over `setup`'s `n` objects, reads its RSS after the first full rebalance,
/// adds Lease `shard-3` and reads it again after the scale-out's drains; the process is stopped.
async fn scale_out(
    setup: &RingSetup,
    webhooks: &Webhooks,
    cp: &ControlPlane,
    n: usize,
) -> Result<Run, Error> {
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let flags = "--max-writes-per-second 0 --resync-interval 1h --sweep-interval 1h";
    let mut reconciler = setup
        .start_reconciler(dir.path(), cp.kubeconfig(), webhooks, flags, n)
        .await?;
    let pid = reconciler.process.pid();
    let (steady, _) = settled_rss(pid, "reconciler").await?;
    let before = reconciler.rebalances(&setup.id()).await;
    setup.add_shard_lease("shard-3", 3600).await;
    // The scale-out's full list counts as it ends; the drain checks after it come seconds later.
    let scale_out = reconciler
        .wait_for_rebalances(
            &setup.id(),
            "the scale-out's drains",
            Duration::from_secs(600),
            |m| {
                let since = m.since(&before);
                since.listed >= n as f64 && since.drains > 0.0
            },
        )
        .await?
        .since(&before);
    let (after, peak) = settled_rss(pid, "reconciler").await?;
    let sockets = open_sockets(pid).unwrap_or(0);
    Ok((
        [steady, after, peak],
        format!(
            "{sockets} | {} | {:.2}",
            scale_out.drains, scale_out.seconds
        ),
    ))
}

/// Puts `setup`'s objects back as they were before a scale-out (no reconciler running): Lease
/// `shard-3` deleted, the drain label taken off every object, 64 writes in flight.
async fn put_back(setup: &RingSetup) -> Result<(), Error> {
    setup
        .leases()
        .delete("shard-3", &DeleteParams::default())
        .await?;
    let drain = &setup.labels.drain;
    setup.relabel(drain, drain, |_| None).await?;
    Ok(())
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
