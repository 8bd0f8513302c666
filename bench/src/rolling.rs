//! A rolling update of 4 shards over the same objects, three ways: stable names keeping their
//! Lease on shutdown (a StatefulSet with `OnStop::Keep`), stable names releasing it (the
//! default), and fresh names (a Deployment: every restart is a new shard). Each shard in turn is
//! stopped gracefully and started again; the moves (the reconciler's log) and the writes to the
//! objects (the apiserver's audit log) of each roll are counted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sharder_common::Ring;
use sharder_harness::ControlPlane;
use sharder_sdk::lease::OnStop;

use crate::rebalance::{Accounts, BenchShard, start_moving_reconciler, start_shard, wait_ready};
use crate::tracker::{Alarm, Tracker};
use crate::webhooks::Webhooks;
use crate::{Args, Error, RingSetup};

/// Shards rolled.
pub const SHARDS: usize = 4;

/// One way of rolling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Stable names, Lease kept on shutdown.
    StableKeep,
    /// Stable names, Lease released on shutdown.
    StableRelease,
    /// A new name at every restart (Lease released).
    FreshNames,
}

impl Mode {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::StableKeep => "stable names, lease kept (`--stable-name`)",
            Self::StableRelease => "stable names, lease released (default)",
            Self::FreshNames => "fresh names (Deployment), lease released",
        }
    }
}

/// What one roll cost.
#[derive(Clone, Debug)]
pub struct Roll {
    /// How it rolled.
    pub mode: Mode,
    /// Moves the reconciler logged (drains and direct assignments).
    pub moves: usize,
    /// Reconciler writes to the objects.
    pub reconciler_writes: usize,
    /// Shard writes to the objects (drain acknowledgements).
    pub shard_writes: usize,
    /// From the first stop until the last restarted shard's objects were all in place.
    pub wall: Duration,
}

/// The rolling update benchmark's result.
#[derive(Clone, Debug)]
pub struct RollingResult {
    /// Objects.
    pub objects: usize,
    /// Every roll, in the order of [`Mode`].
    pub rolls: Vec<Roll>,
}

fn ring_of(names: &[String]) -> Ring {
    Ring::new(names.iter().cloned())
}

/// Rolls the shards three ways over `args.rebalance_objects` objects.
pub async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<RollingResult, Error> {
    let n = args.rebalance_objects;
    let lease = Duration::from_secs(args.lease_seconds);
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let setup = RingSetup::new(cp, "bench-roll", false, 0).await?;
    let Accounts {
        reconciler_kubeconfig: kubeconfig,
        reconciler_user,
        shard_user,
        shard_client,
        ..
    } = Accounts::new(cp, &setup).await?;

    let mut names: Vec<String> = (0..SHARDS).map(|i| format!("shard-{i}")).collect();
    let mut shards: BTreeMap<String, BenchShard> = BTreeMap::new();
    let alarm = Alarm::default();
    let start = |name: &str, on_stop: OnStop| {
        start_shard(
            shard_client.clone(),
            &setup.ns,
            name,
            lease,
            on_stop,
            args.shard_concurrency,
            &alarm,
        )
    };
    for name in &names {
        shards.insert(name.clone(), start(name, OnStop::Keep));
        wait_ready(&setup, name).await?;
    }
    setup.create_assigned(0..n, &ring_of(&names)).await?;
    let reconciler =
        start_moving_reconciler(&setup, dir.path(), &kubeconfig, webhooks, args, n).await?;
    let tracker = Tracker::start(&setup, &alarm).await?;
    let converge = |ring: Ring| {
        let (tracker, setup) = (&tracker, &setup);
        async move { tracker.converge(setup, &ring).await }
    };
    converge(ring_of(&names)).await?;

    let mut rolls = Vec::new();
    let mut running = OnStop::Keep;
    for mode in [Mode::StableKeep, Mode::StableRelease, Mode::FreshNames] {
        let on_stop = if mode == Mode::StableKeep {
            OnStop::Keep
        } else {
            OnStop::Release
        };
        if on_stop != running {
            // The shards take this mode's policy: restarted once, untimed, under the old one
            // (which keeps the Lease: nothing moves).
            for name in names.clone() {
                if let Some(shard) = shards.remove(&name) {
                    shard.stop().await;
                }
                shards.insert(name.clone(), start(&name, on_stop));
                wait_ready(&setup, &name).await?;
            }
            converge(ring_of(&names)).await?;
            running = on_stop;
        }

        let audit = cp.audit_mark();
        let logged = reconciler.process.lines().len();
        let started = Instant::now();
        for i in 0..SHARDS {
            let old = names[i].clone();
            if let Some(shard) = shards.remove(&old) {
                shard.stop().await;
            }
            if on_stop == OnStop::Release {
                // Its objects move to the others before it (or its successor) is back.
                let others: Vec<String> = names.iter().filter(|s| **s != old).cloned().collect();
                converge(ring_of(&others)).await?;
            }
            let new = match mode {
                Mode::FreshNames => format!("{old}-r"),
                _ => old.clone(),
            };
            shards.insert(new.clone(), start(&new, on_stop));
            wait_ready(&setup, &new).await?;
            names[i] = new;
            converge(ring_of(&names)).await?;
        }
        let wall = started.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let events = cp.audited_writes_since(audit);
        let moves = reconciler
            .process
            .lines()
            .into_iter()
            .skip(logged)
            .filter(|l| l["message"] == "moved" || l["message"] == "draining")
            .count();
        let roll = Roll {
            mode,
            moves,
            reconciler_writes: crate::writes::count_by(&events, &setup.ns, &reconciler_user),
            shard_writes: crate::writes::count_by(&events, &setup.ns, &shard_user),
            wall,
        };
        eprintln!(
            "[bench]   roll, {}: {} moves, {} reconciler + {} shard writes, {:?}",
            mode.name(),
            roll.moves,
            roll.reconciler_writes,
            roll.shard_writes,
            roll.wall
        );
        rolls.push(roll);
    }
    for shard in shards.into_values() {
        shard.task.abort();
    }
    drop(reconciler);
    Ok(RollingResult { objects: n, rolls })
}
