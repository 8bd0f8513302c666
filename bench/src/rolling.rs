//! Section 5b, a rolling update of 4 shards over the same objects, three ways: stable names
//! keeping their Lease on shutdown (a StatefulSet with `OnStop::Keep`), stable names releasing it
//! (the default), and fresh names (a Deployment: every restart is a new shard). Each shard in
//! turn is stopped gracefully and started again; the moves (the reconciler's log) and the writes
//! to the objects (the apiserver's audit log) of each roll are counted.

use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use sharder_harness::ControlPlane;
use sharder_sdk::lease::OnStop;

use crate::progress::progress;
use crate::rebalance::{Movers, SHARD_CONCURRENCY};
use crate::report::{goals, table};
use crate::webhooks::Webhooks;
use crate::{Args, Error};

/// The ways of rolling: the report's name, the Lease on shutdown, and whether names are fresh.
const ROLLS: [(&str, OnStop, bool); 3] = [
    (
        "stable names, lease kept (`--stable-name`)",
        OnStop::Keep,
        false,
    ),
    (
        "stable names, lease released (default)",
        OnStop::Release,
        false,
    ),
    (
        "fresh names (Deployment), lease released",
        OnStop::Release,
        true,
    ),
];

/// Rolls the shards three ways over `args.rebalance_objects` objects; the section's text.
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<String, Error> {
    let mut names: Vec<String> = (0..4).map(|i| format!("shard-{i}")).collect();
    let (mut m, logs) =
        Movers::start(cp, webhooks, args, "bench-roll", &names, OnStop::Keep).await?;
    let (mut rows, mut stable) = (Vec::new(), None);
    let mut running = OnStop::Keep;
    for (mode, on_stop, fresh) in ROLLS {
        if on_stop != running {
            // The shards take this roll's policy: restarted once, untimed, under the old one
            // (which keeps the Lease: nothing moves).
            for name in &names {
                if let Some(shard) = m.shards.remove(name) {
                    shard.stop().await;
                }
                m.start_shard(name, on_stop);
                m.wait_ready(name).await?;
            }
            m.converge(&names).await?;
            running = on_stop;
        }
        let (mark, start, counted, started) = (
            cp.audit_mark(),
            Timestamp::now(),
            logs.rebalances(&m.setup.id()).await,
            Instant::now(),
        );
        for i in 0..names.len() {
            let old = names[i].clone();
            if let Some(shard) = m.shards.remove(&old) {
                shard.stop().await;
            }
            if on_stop == OnStop::Release {
                // Its objects move to the others before it (or its successor) is back.
                let others: Vec<String> = names.iter().filter(|s| **s != old).cloned().collect();
                m.converge(&others).await?;
            }
            names[i] = if fresh { format!("{old}-r") } else { old };
            m.start_shard(&names[i], on_stop);
            m.wait_ready(&names[i]).await?;
            m.converge(&names).await?;
        }
        let wall = started.elapsed().as_secs_f64();
        let (_, [reconciler, shards, _]) = m.writes(mark, start, &[]).await;
        let moved = logs.rebalances(&m.setup.id()).await.since(&counted);
        let moves = (moved.movements + moved.drains) as usize;
        let per_object = (reconciler + shards) as f64 / args.rebalance_objects.max(1) as f64;
        progress!("  roll, {mode}: {moves} moves, {reconciler} + {shards} writes");
        rows.push(format!(
            "{mode} | {moves} | {reconciler} | {shards} | {per_object:.2} | {wall:.1}"
        ));
        if on_stop == OnStop::Keep {
            stable = Some((moves, reconciler + shards));
        }
    }
    for shard in std::mem::take(&mut m.shards).into_values() {
        shard.crash();
    }
    let mut out = format!(
        "{} objects on 4 shards (the shard SDK in this process, acknowledging drains, each at most {SHARD_CONCURRENCY} reconciles at once); each shard in turn stopped gracefully and started again, waiting until every object was on its shard before the next. Moves from the reconciler's log, writes to the objects from the audit log. Releasing stable names moves each shard's objects off and back; fresh names move them off and a new share onto every new name.\n\n",
        args.rebalance_objects
    );
    out += &table(
        "roll | moves | reconciler writes | shard writes | writes per object | wall s",
        rows,
    );
    let (moves, writes) = stable.unwrap_or((usize::MAX, usize::MAX));
    Ok(out
        + &goals(&[(
            "a rolling update of stable names (Leases kept)".into(),
            format!("{moves} moves, {writes} writes"),
            "0 moves, 0 writes",
            moves == 0 && writes == 0,
        )]))
}
