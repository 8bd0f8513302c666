//! End-to-end scenarios, every part a real process on the real control plane: webhook,
//! reconciler, example shards. Each scenario ends with the ownership invariant: no object
//! reconciled by two shards at overlapping times, none unassigned longer than the stated bound.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sharder_common::lease::expiry;
use sharder_example::configmap_name;
use sharder_harness::wait::{eventually, metric_sum, metric_value};
use sharder_tests::system::{Options, RECONCILER_ACCOUNT, SHARD_ACCOUNT, System, WAIT};

fn assignment(
    system: &System,
    secrets: &BTreeMap<String, k8s_openapi::api::core::v1::Secret>,
) -> BTreeMap<String, String> {
    secrets
        .iter()
        .map(|(name, s)| (name.clone(), system.shard_of(s).unwrap_or_default()))
        .collect()
}

/// The moves and drains the leading reconciler (replica 0) counted in its metrics.
async fn reconciler_moves(system: &System) -> f64 {
    let metrics = system.reconciler_metrics(0).await;
    assert!(
        metrics.contains("sharder_reconciler_rebalance_duration_seconds"),
        "the reconciler's metrics: {metrics}"
    );
    metric_sum(&metrics, "controller_sharding_movements_total", &[])
        + metric_sum(&metrics, "controller_sharding_drains_total", &[])
}

fn count_lines(system: &System, process: &str, needle: &str) -> usize {
    system
        .log(process)
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn objects_spread_over_shards_and_follow_scale_out_and_graceful_scale_in() {
    let mut system = System::start(
        "e2e-scale",
        Options {
            lease_seconds: 20,
            service_accounts: true,
            ..Options::default()
        },
    )
    .await;

    // 1. 150 owners: all assigned, each with its child (checksums ConfigMap) on the owner's
    // shard, every shard used.
    system.create_secrets(0..150).await;
    system
        .wait_converged("150 objects assigned and reconciled")
        .await;
    let holdings = system.holdings().await;
    eprintln!("3 shards: {holdings:?}");
    assert!(!holdings.contains_key("-"));
    for shard in ["shard-0", "shard-1", "shard-2"] {
        assert!(
            holdings.get(shard).copied().unwrap_or(0) > 0,
            "{shard} unused: {holdings:?}"
        );
    }
    let before = assignment(&system, &system.list_secrets().await);

    // 2a. Scale out 3 -> 4: the moving owners are drained, acknowledged by their old shard and
    // reconciled by the new one; each child follows its owner once the owner is acknowledged;
    // nothing else moves.
    let mark = system.audit_mark();
    system.start_shard("shard-3").await;
    system
        .wait_converged("objects and children rebalanced onto shard-3")
        .await;
    let after = assignment(&system, &system.list_secrets().await);
    let moved: Vec<&String> = before.keys().filter(|n| before[*n] != after[*n]).collect();
    eprintln!(
        "3 -> 4: {} of 150 moved: {:?}",
        moved.len(),
        system.holdings().await
    );
    assert!(!moved.is_empty());
    assert!(
        moved.iter().all(|n| after[*n] == "shard-3"),
        "objects only move to the new shard"
    );
    let report = system
        .wait_reconciled(&moved, |shards| shards.contains("shard-3"))
        .await;
    // The old shard logs its acknowledgement once the apiserver answered it.
    let acks = eventually("one acknowledged drain per moved object", WAIT, || async {
        let acks: usize = ["shard-0", "shard-1", "shard-2"]
            .iter()
            .map(|s| count_lines(&system, s, "drain acknowledged"))
            .sum();
        (acks == moved.len()).then_some(acks).ok_or(acks)
    })
    .await;
    for name in &moved {
        let shards = system.reconcilers_of(&report, name);
        assert!(
            shards.contains("shard-3") && shards.contains(&before[*name]),
            "{name}: {shards:?}"
        );
    }
    // Writes during the scale-out, from the audit log: per moved owner the reconciler's drain
    // and its shard's acknowledgement (the webhook assigns inside it), per child of a moved
    // owner the reconciler's one move after that; nothing for anything else.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let by_reconciler = system.writes_by_since(&system.service_account(RECONCILER_ACCOUNT), mark);
    let by_shards = system.writes_by_since(&system.service_account(SHARD_ACCOUNT), mark);
    let writes = |by: &BTreeMap<(String, String), usize>, resource: &str, name: &str| {
        by.get(&(resource.to_owned(), name.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    for name in before.keys() {
        let child = configmap_name(name);
        let moving = usize::from(moved.contains(&name));
        assert_eq!(
            (
                writes(&by_reconciler, "secrets", name),
                writes(&by_shards, "secrets", name),
                writes(&by_reconciler, "configmaps", &child),
                writes(&by_shards, "configmaps", &child),
            ),
            (moving, moving, moving, 0),
            "{name} (moved: {})",
            moving == 1
        );
    }
    let handover = system.handover();
    assert!(
        handover.violations.is_empty(),
        "{:?}",
        handover.violations.first()
    );
    eprintln!(
        "3 -> 4: {} owners moved with 2 writes each, {} children with 1 write each after their owner; longest a child stayed behind its acknowledged owner: {} ms",
        moved.len(),
        moved.len(),
        handover.longest_behind / 1_000_000
    );
    // The label guard (on by default) let those drains, acknowledgements and moves through; the
    // admin, neither the reconciler nor a shard, may change an object's data but not move it.
    let (name, shard) = after.iter().next().expect("an object");
    let elsewhere = if shard == "shard-0" {
        "shard-1"
    } else {
        "shard-0"
    };
    system
        .objects()
        .update_secret(name, "changed by the admin")
        .await
        .expect("an update that leaves the labels alone is admitted");
    let relabel = system
        .secrets()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!(
                { "metadata": { "labels": { &system.labels.shard: elsewhere } } }
            )),
        )
        .await;
    assert!(
        matches!(&relabel, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("only the sharder reconciler")),
        "the label guard denies the admin's relabel: {relabel:?}"
    );
    system
        .wait_converged("the admin's update reconciled where the object is")
        .await;

    // 2b + 3. Scale in 4 -> 2 by graceful stops: the Leases are released and the objects
    // reassigned without waiting for the Leases to expire.
    let leases = system.shard_leases().await;
    let expires = ["shard-2", "shard-3"]
        .iter()
        .filter_map(|s| expiry(&leases[*s]).map(|(at, _)| at))
        .min()
        .expect("expiry");
    assert!(
        system.stop_shard("shard-3"),
        "shard-3 exits cleanly on SIGTERM"
    );
    assert!(
        system.stop_shard("shard-2"),
        "shard-2 exits cleanly on SIGTERM"
    );
    let leases = system.shard_leases().await;
    for shard in ["shard-2", "shard-3"] {
        let holder = leases[shard]
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone());
        assert!(
            holder
                .as_deref()
                .is_none_or(|h| h.is_empty() || h == "shardlease-controller"),
            "{shard} released its lease: {holder:?}"
        );
        assert!(
            count_lines(&system, shard, "shard lease released") == 1,
            "{shard} logs the release"
        );
    }
    system
        .wait_converged("objects of the stopped shards reassigned")
        .await;
    let converged_at = Timestamp::now();
    assert!(
        converged_at < expires,
        "reassigned at {converged_at}, before the released leases would have expired at {expires}"
    );
    let holdings = system.holdings().await;
    eprintln!("4 -> 2: {holdings:?}");
    assert_eq!(holdings.keys().collect::<Vec<_>>(), ["shard-0", "shard-1"]);
    let acks_after: usize = ["shard-0", "shard-1", "shard-2", "shard-3"]
        .iter()
        .map(|s| count_lines(&system, s, "drain acknowledged"))
        .sum();
    assert_eq!(
        acks_after, acks,
        "objects of released shards move without drains"
    );

    system.assert_single_ownership();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_shards_objects_are_reassigned_once_its_lease_expires() {
    let mut system = System::start("e2e-crash", Options::default()).await;
    system.create_secrets(0..60).await;
    system
        .wait_converged("60 objects assigned and reconciled")
        .await;
    let victims: Vec<String> = system
        .list_secrets()
        .await
        .iter()
        .filter(|(_, s)| system.shard_of(*s).as_deref() == Some("shard-1"))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!victims.is_empty());

    // 4. SIGKILL: no release. The objects stay until the Lease expires, then move.
    system.kill_shard("shard-1");
    let killed = Instant::now();
    let lease = system
        .shard_leases()
        .await
        .remove("shard-1")
        .expect("lease");
    let (expires, duration) = expiry(&lease).expect("expiry");
    let first_move: std::sync::Mutex<Option<Timestamp>> = std::sync::Mutex::new(None);
    let done = eventually("the crashed shard's objects reassigned", WAIT, || async {
        let secrets = system.list_secrets().await;
        let left = victims
            .iter()
            .filter(|n| {
                secrets.get(*n).and_then(|s| system.shard_of(s)).as_deref() == Some("shard-1")
            })
            .count();
        if left < victims.len() {
            first_move
                .lock()
                .expect("lock")
                .get_or_insert_with(Timestamp::now);
        }
        if left == 0 {
            Ok(Instant::now())
        } else {
            Err(format!("{left} left"))
        }
    })
    .await;
    let first_move = first_move.into_inner().expect("lock").expect("moved");
    let took = done - killed;
    eprintln!(
        "crash: {} objects reassigned {took:?} after the kill (lease {duration}), first move {:?} after expiry",
        victims.len(),
        first_move.duration_since(expires)
    );
    // The Lease's times come from the shard's clock: the same machine as this one.
    assert!(
        first_move >= expires - SignedDuration::from_millis(100),
        "no object moved before the lease expired ({first_move} < {expires})"
    );
    let bound = Duration::from_secs(2 * system.options.lease_seconds + 5);
    assert!(
        took <= bound,
        "reassigned within 2 x lease + 5 s ({took:?} > {bound:?})"
    );

    system
        .wait_converged("converged without the crashed shard")
        .await;
    // Each victim reconciled by its new shard as well.
    system
        .wait_reconciled(&victims, |shards| shards.len() >= 2)
        .await;
    system.assert_single_ownership();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standby_reconciler_handles_the_next_change_after_the_leader_is_killed() {
    let mut system = System::start(
        "e2e-failover",
        Options {
            reconcilers: 2,
            ..Options::default()
        },
    )
    .await;
    system.create_secrets(0..40).await;
    system
        .wait_converged("40 objects assigned and reconciled")
        .await;

    // 5. Kill the leader; the standby takes over and handles the next change (a new shard).
    let leader = system.leader().await;
    system.kill_reconciler(leader);
    let standby = system.leader().await;
    assert_ne!(standby, leader);
    system.start_shard("shard-3").await;
    system
        .wait_converged("the standby rebalanced onto shard-3")
        .await;
    let holdings = system.holdings().await;
    eprintln!("after failover and scale-out: {holdings:?}");
    assert!(holdings.get("shard-3").copied().unwrap_or(0) > 0);
    let drains = metric_sum(
        &system.reconciler_metrics(standby).await,
        "controller_sharding_drains_total",
        &[],
    );
    assert!(drains > 0.0, "the standby drained objects onto shard-3");
    system.assert_single_ownership();
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_succeed_with_the_webhook_down_and_the_sweep_assigns_them() {
    let mut system = System::start("e2e-nowebhook", Options::default()).await;
    system.create_secrets(0..20).await;
    system
        .wait_converged("20 objects assigned and reconciled")
        .await;

    let leader = system.leader().await;
    eventually("a sweep finds nothing unassigned", WAIT, || {
        nothing_unassigned(&system, leader)
    })
    .await;

    // 6. Webhook down: creates succeed unassigned; the sweep counts and assigns them, the shards
    // reconcile.
    system.kill_webhook(0);
    // The most Secrets a sweep counted, and the oldest's age then.
    let most = std::cell::Cell::new((0.0_f64, 0.0_f64));
    let look = || async {
        let (objects, age) = unassigned_secrets(&system, leader).await;
        if objects > most.get().0 {
            most.set((objects, age.unwrap_or_default()));
        }
    };
    for i in 20..40 {
        let created = system
            .create_secret(&format!("object-{i}"), &format!("{i}-0"))
            .await
            .expect("create succeeds with the webhook down");
        assert_eq!(system.shard_of(&created), None, "not assigned at creation");
        look().await;
    }
    // Each sweep's count stands until the next one (`sweep_seconds`): polled more often than that.
    eventually(
        "objects created without the webhook swept and reconciled",
        WAIT,
        || async {
            look().await;
            system.converged().await
        },
    )
    .await;
    assert_eq!(system.holdings().await.values().sum::<usize>(), 40);
    let (counted, age) = most.get();
    assert!(
        counted > 0.0 && age > 0.0,
        "a sweep counted the Secrets created while the webhook was down, and how long the oldest \
         had waited: {counted} Secrets, {age} s"
    );
    // The objects the last sweep found were assigned by it: the next one finds none.
    eventually(
        "a sweep after the assignments finds nothing unassigned",
        WAIT,
        || nothing_unassigned(&system, leader),
    )
    .await;

    system.start_webhook(0).await;
    system.wait_until_webhook_assigns().await;
    system.assert_single_ownership();
}

/// What the leader's gauges say of the ring's Secrets no available shard held at the last full
/// list or sweep: how many (every sample's sum; 0 when the gauge is missing) and the oldest's age.
async fn unassigned_secrets(system: &System, leader: usize) -> (f64, Option<f64>) {
    let metrics = system.reconciler_metrics(leader).await;
    let secrets = [("resource", "secrets")];
    (
        metric_sum(&metrics, "sharder_reconciler_unassigned_objects", &secrets),
        metric_value(
            &metrics,
            "sharder_reconciler_unassigned_oldest_seconds",
            &secrets,
        ),
    )
}

/// `Ok` once the leader publishes the unassigned-object gauges and they read no object of any
/// resource of the ring, and no age for the Secrets.
async fn nothing_unassigned(system: &System, leader: usize) -> Result<(), String> {
    let metrics = system.reconciler_metrics(leader).await;
    let count = metric_value(&metrics, "sharder_reconciler_unassigned_objects", &[])
        .map(|_| metric_sum(&metrics, "sharder_reconciler_unassigned_objects", &[]));
    let oldest = unassigned_secrets(system, leader).await.1;
    match (count, oldest) {
        (Some(n), Some(age)) if n == 0.0 && age == 0.0 => Ok(()),
        seen => Err(format!(
            "unassigned objects, the oldest Secret's age: {seen:?}"
        )),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_update_of_stable_shard_names_moves_nothing() {
    let mut system = System::start(
        "e2e-roll",
        Options {
            shards: 0,
            lease_seconds: 10,
            ..Options::default()
        },
    )
    .await;
    let names: Vec<String> = (0..4).map(|i| format!("shard-{i}")).collect();
    for name in &names {
        let mut flags = system.shard_flags(name);
        flags.extra.push("--stable-name".into());
        system.start_shard_with(flags).await;
    }
    system.wait_until_webhook_assigns().await;
    system.create_secrets(0..80).await;
    system
        .wait_converged("80 objects and their children on 4 stable shards")
        .await;
    let before = assignment(&system, &system.list_secrets().await);

    // Restart each shard in turn: SIGTERM (the Lease is kept), then the same name again, well
    // within the lease duration: it takes its own Lease back at once.
    let mark = system.audit_mark();
    let moved_before = reconciler_moves(&system).await;
    for name in &names {
        assert!(system.stop_shard(name), "{name} exits cleanly on SIGTERM");
        assert_eq!(
            count_lines(
                &system,
                name,
                "controllers stopped, shard lease kept (it runs out unless this name comes back)"
            ),
            count_lines(&system, name, "checksum controller stopped"),
            "{name} keeps its lease on every stop"
        );
        let holder = system.shard_leases().await[name]
            .spec
            .clone()
            .and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some(name.as_str()), "not released");
        let mut flags = system.shard_flags(name);
        flags.extra.push("--stable-name".into());
        system.start_shard_with(flags).await;
    }
    system
        .wait_converged("every object where it was after the roll")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let after = assignment(&system, &system.list_secrets().await);
    assert_eq!(after, before, "nothing moved");
    let moved = reconciler_moves(&system).await - moved_before;
    assert_eq!(moved, 0.0, "the reconciler moved or drained objects");
    let written: Vec<String> = system
        .cp
        .audited_writes_since(mark)
        .into_iter()
        .filter(|e| {
            let name = e["objectRef"]["name"].as_str().unwrap_or_default();
            e["objectRef"]["namespace"] == system.ns.as_str()
                && matches!(
                    e["objectRef"]["resource"].as_str(),
                    Some("secrets" | "configmaps")
                )
                // The probe Secrets of `wait_until_webhook_assigns` are deleted before the roll;
                // the garbage collector deletes their children whenever it gets to them.
                && !(name.starts_with("probe-") || name.starts_with("checksums-probe-"))
        })
        .map(|e| {
            format!(
                "{} {} {}/{} by {} at {}",
                e["verb"],
                e["objectRef"]["resource"],
                e["objectRef"]["name"],
                e["objectRef"]["subresource"],
                e["user"]["username"],
                e["requestReceivedTimestamp"]
            )
        })
        .collect();
    assert_eq!(
        written,
        Vec::<String>::new(),
        "no write to any sharded object during the roll"
    );
    eprintln!(
        "roll of 4 stable shards: 0 moves, 0 writes; {:?}",
        system.holdings().await
    );
    system.assert_single_ownership();
}
