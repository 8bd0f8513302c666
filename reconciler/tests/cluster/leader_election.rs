//! Leader election: a killed leader's standby takes over once the Lease expires; a leader
//! stopped with SIGTERM releases the Lease and the standby takes over at once; a leader whose
//! Lease is taken exits with the lease-lost status.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use sharder_harness::launch::Reconciler;
use sharder_harness::wait::{eventually, http_get, metric_value};
use sharder_runtime::lease::LEASE_LOST_EXIT_STATUS;

use crate::{Test, WAIT};

#[tokio::test]
async fn a_standby_reconciler_takes_over_when_the_leader_is_killed() {
    let mut w = Test::new("failover").await;
    w.add_shard_lease("shard-a", 3600).await;
    w.start_reconciler().await;
    w.start_reconciler().await;
    let leader_lease = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let leader = eventually("a leader is elected", WAIT, || async {
        let l = leader_lease
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        l.spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
            .ok_or("no holder".to_owned())
    })
    .await;
    let index: usize = leader
        .trim_start_matches("replica-")
        .parse()
        .expect("replica index");
    // The leader reports itself once its watches listed; the standby is ready too (it has
    // nothing to list) and does not lead.
    eventually("the leader is ready and says so", WAIT, || async {
        leading_and_ready(&w.reconcilers[index]).await
    })
    .await;
    assert_eq!(
        leading_and_ready(&w.reconcilers[1 - index]).await,
        Err((false, true)),
        "the standby: not leading, ready"
    );
    w.reconcilers[index].process.kill();

    let standby = format!("replica-{}", 1 - index);
    eventually("the standby leads", WAIT, || async {
        let l = leader_lease
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        (l.spec.and_then(|s| s.holder_identity).as_deref() == Some(standby.as_str()))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    // The next change is handled by the new leader.
    w.create_ring().await;
    w.configuration_of("the new leader configures the new ring")
        .await;
    eventually("the new leader is ready and says so", WAIT, || async {
        leading_and_ready(&w.reconcilers[1 - index]).await
    })
    .await;
}

/// Whether `reconciler` says it leads (`leader_election_master_status`) and is ready
/// (`/readyz`): `Ok` when both, else both as they are.
async fn leading_and_ready(reconciler: &Reconciler) -> Result<(), (bool, bool)> {
    let metrics = reconciler.metrics().await;
    let leading = metric_value(
        &metrics,
        "leader_election_master_status",
        &[("name", "sharder-reconciler")],
    ) == Some(1.0);
    let ready = matches!(http_get(reconciler.admin, "/readyz").await, Ok((200, _)));
    if leading && ready {
        Ok(())
    } else {
        Err((leading, ready))
    }
}

#[tokio::test]
async fn sigterm_releases_leadership_and_the_standby_takes_over() {
    let mut w = Test::new("handover").await;
    w.start_reconciler().await;
    let leases = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    eventually("replica-0 leads", WAIT, || async {
        let l = leases
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        (holder(&l) == "replica-0")
            .then_some(())
            .ok_or_else(|| holder(&l))
    })
    .await;
    w.start_reconciler().await;
    let status = w.reconcilers[0]
        .process
        .stop(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    eventually(
        "replica-1 leads without waiting for expiry",
        Duration::from_secs(10),
        || async {
            let l = leases
                .get("sharder-reconciler")
                .await
                .map_err(|e| e.to_string())?;
            (holder(&l) == "replica-1")
                .then_some(())
                .ok_or_else(|| holder(&l))
        },
    )
    .await;
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_and_exits_with_the_lease_lost_status() {
    let mut w = Test::new("taken").await;
    w.start_reconciler().await;
    eventually("replica-0 leads and is ready", WAIT, || async {
        leading_and_ready(&w.reconcilers[0]).await
    })
    .await;
    let leases = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let taken = serde_json::json!({"spec": {
        "holderIdentity": "intruder",
        "leaseDurationSeconds": 3600,
        "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
    }});
    leases
        .patch(
            "sharder-reconciler",
            &PatchParams::default(),
            &Patch::Merge(&taken),
        )
        .await
        .expect("take the Lease");
    let deadline = tokio::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = w.reconcilers[0].process.try_wait() {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica-0 still runs {WAIT:?} after its Lease was taken"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        status.code(),
        Some(i32::from(LEASE_LOST_EXIT_STATUS)),
        "{status:?}"
    );
}
