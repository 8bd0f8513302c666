//! Range mode end to end: example shards serving the hash ranges on their Leases through the
//! apiserver's sharded list and watch, the reconciler assigning them, no webhook. Through a
//! scale-out, a crash and a graceful release every Secret is reconciled by the shard whose
//! ranges hold it, never by two at overlapping times (their records, with every Secret updated
//! all along), and the reconciler writes no Secret (the audit log); a rolling restart of stable
//! names moves none.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use sharder_common::Ring;
use sharder_common::ranges::{RANGE_TOKENS_PER_SHARD, RangeKey, ShardSelector, assign_uids};
use sharder_harness::control_plane::AuditMark;
use sharder_harness::launch::ShardFlags;
use sharder_harness::wait::eventually;
use sharder_tests::system::{Options, RECONCILER_ACCOUNT, System, WAIT, unix_nanos};

/// Per Secret name, the shard of `shards` whose uid ranges hold it.
fn owners(secrets: &BTreeMap<String, String>, shards: &[&str]) -> BTreeMap<String, String> {
    let ranges = assign_uids(&Ring::with_tokens(
        shards.iter().copied(),
        RANGE_TOKENS_PER_SHARD,
    ));
    secrets
        .iter()
        .filter_map(|(name, uid)| {
            let owner = ranges.iter().find(|(_, r)| {
                ShardSelector::new(RangeKey::Uid, r.iter().copied()).selects(uid, None)
            })?;
            Some((name.clone(), owner.0.clone()))
        })
        .collect()
}

/// Waits until every Secret was reconciled by its owner in `owners` since `since` (Unix
/// nanoseconds), as the shards' records say.
async fn wait_reconciled_by(
    system: &System,
    owners: &BTreeMap<String, String>,
    since: u128,
    what: &str,
) {
    eventually(what, WAIT, || async {
        let report = system.ownership();
        let missing: Vec<&String> = owners
            .iter()
            .filter(|(name, owner)| {
                !report
                    .reconciles
                    .get(&format!("{}/{name}", system.ns))
                    .into_iter()
                    .flatten()
                    .any(|i| &i.shard == *owner && i.start >= since)
            })
            .map(|(name, _)| name)
            .collect();
        missing.is_empty().then_some(()).ok_or(format!(
            "{} not reconciled by their owner yet: {missing:?}",
            missing.len()
        ))
    })
    .await;
}

/// The flags of example shard `name` in range mode by uid, with `extra`.
fn range_flags(system: &System, name: &str, extra: &[&str]) -> ShardFlags {
    let mut flags = system.shard_flags(name);
    flags.extra = ["--range-key", "uid"]
        .iter()
        .chain(extra)
        .map(|f| (*f).to_owned())
        .collect();
    flags
}

/// A system with its ring in range mode by uid (no webhook; the reconciler and shards as
/// ServiceAccounts with `accounts`), shards `shard-0` and `shard-1` (with `extra` flags) and
/// `n` Secrets: with each Secret's uid by name, and the audit log's end before the shards.
async fn started(
    prefix: &str,
    accounts: bool,
    extra: &[&str],
    n: usize,
) -> (System, BTreeMap<String, String>, AuditMark) {
    let options = Options {
        shards: 0,
        webhooks: 0,
        service_accounts: accounts,
        ..Options::default()
    };
    let mut system = System::start(prefix, options).await;
    system.to_range_mode("uid", true).await;
    let mark = system.audit_mark();
    for name in ["shard-0", "shard-1"] {
        let flags = range_flags(&system, name, extra);
        system.start_shard_with(flags).await;
    }
    system.create_secrets(0..n).await;
    let secrets = system
        .list_secrets()
        .await
        .into_iter()
        .map(|(name, s)| (name, s.uid().unwrap_or_default()))
        .collect();
    (system, secrets, mark)
}

/// Updates every one of `secrets`, round after round, until aborted.
fn churn(system: &System, secrets: &BTreeMap<String, String>) -> tokio::task::JoinHandle<()> {
    let (objects, names) = (
        system.objects(),
        secrets.keys().cloned().collect::<Vec<_>>(),
    );
    tokio::spawn(async move {
        for round in 0.. {
            for name in &names {
                let _ = objects.update_secret(name, &format!("round-{round}")).await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn in_range_mode_each_object_is_reconciled_by_one_shard_through_scale_out_crash_and_release()
{
    let (mut system, secrets, mark) = started("e2e-ranges", true, &[], 40).await;
    let t0 = unix_nanos();
    let two = owners(&secrets, &["shard-0", "shard-1"]);
    wait_reconciled_by(
        &system,
        &two,
        0,
        "every Secret reconciled by its shard of two",
    )
    .await;

    // Every Secret updated, round after round, through the moves: shards reconcile all along,
    // so two serving one Secret at once would show in their records.
    let churn = churn(&system, &secrets);

    // Scale-out: shard-2 takes its share once the others let it go.
    let flags = range_flags(&system, "shard-2", &[]);
    system.start_shard_with(flags).await;
    let three = owners(&secrets, &["shard-0", "shard-1", "shard-2"]);
    let moved: BTreeMap<String, String> = three
        .iter()
        .filter(|(name, owner)| two.get(*name) != Some(owner))
        .map(|(n, o)| (n.clone(), o.clone()))
        .collect();
    assert!(!moved.is_empty(), "the scale-out moves some Secrets");
    assert!(
        moved.values().all(|o| o == "shard-2"),
        "only to the new shard"
    );
    wait_reconciled_by(&system, &moved, t0, "the new shard reconciled its share").await;

    // A crash: shard-1's ranges go to the others once its Lease is taken over.
    let t1 = unix_nanos();
    system.kill_shard("shard-1");
    let after_crash = owners(&secrets, &["shard-0", "shard-2"]);
    let orphaned: BTreeMap<String, String> = after_crash
        .iter()
        .filter(|(name, _)| three.get(*name).map(String::as_str) == Some("shard-1"))
        .map(|(n, o)| (n.clone(), o.clone()))
        .collect();
    assert!(!orphaned.is_empty(), "shard-1 held Secrets");
    wait_reconciled_by(
        &system,
        &orphaned,
        t1,
        "the crashed shard's Secrets reconciled by the others",
    )
    .await;

    // A graceful release: shard-0's ranges go to shard-2 at once.
    let t2 = unix_nanos();
    assert!(system.stop_shard("shard-0"), "shard-0 stops cleanly");
    let last: BTreeMap<String, String> = secrets
        .keys()
        .map(|n| (n.clone(), "shard-2".to_owned()))
        .collect();
    wait_reconciled_by(
        &system,
        &last,
        t2,
        "every Secret reconciled by the last shard",
    )
    .await;

    churn.abort();
    let metrics = system.shard_metrics("shard-2").await.expect("shard-2 runs");
    assert!(
        metrics.contains("sharder_shard_out_of_range_objects_total 0"),
        "the apiserver sent shard-2 only its ranges: {metrics}"
    );
    let report = system.ownership();
    assert!(
        report.objects_with_several_shards() > 0,
        "Secrets changed hands"
    );
    assert!(
        report.overlaps.is_empty(),
        "{} reconciles by two shards at once, the first: {:?}",
        report.overlaps.len(),
        report.overlaps.first()
    );
    let writes: BTreeSet<(String, String)> = system
        .writes_by_since(&system.service_account(RECONCILER_ACCOUNT), mark)
        .into_keys()
        .filter(|(resource, _)| resource == "secrets")
        .collect();
    assert!(
        writes.is_empty(),
        "the reconciler wrote Secrets: {writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn in_range_mode_a_rolling_restart_of_stable_names_moves_nothing() {
    let (mut system, secrets, _) = started("e2e-ranges-roll", false, &["--stable-name"], 30).await;
    let two = owners(&secrets, &["shard-0", "shard-1"]);
    wait_reconciled_by(&system, &two, 0, "every Secret reconciled by its shard").await;
    let settled = unix_nanos();

    // Each shard in turn stops (its Lease kept) and starts again under its name, while every
    // Secret is updated: its Secrets wait for it and go nowhere else.
    let churn = churn(&system, &secrets);
    for name in ["shard-0", "shard-1"] {
        assert!(system.stop_shard(name), "{name} stops cleanly");
        let restarted = unix_nanos();
        let flags = range_flags(&system, name, &["--stable-name"]);
        system.start_shard_with(flags).await;
        let own: BTreeMap<String, String> = two
            .iter()
            .filter(|(_, owner)| *owner == name)
            .map(|(n, o)| (n.clone(), o.clone()))
            .collect();
        wait_reconciled_by(
            &system,
            &own,
            restarted,
            "the restarted shard reconciles its own",
        )
        .await;
    }
    churn.abort();
    let report = system.ownership();
    let two = &two;
    let strays: Vec<String> = report
        .reconciles
        .iter()
        .flat_map(|(object, intervals)| {
            let name = object.rsplit('/').next().unwrap_or_default();
            intervals
                .iter()
                .filter(move |i| i.start >= settled && two.get(name) != Some(&i.shard))
                .map(move |i| format!("{object} by {}", i.shard))
        })
        .collect();
    assert!(
        strays.is_empty(),
        "moved by the rolling restart: {strays:?}"
    );
    assert!(
        report.overlaps.is_empty(),
        "{} overlapping reconciles",
        report.overlaps.len()
    );
}
