//! Shard lease states: labelled as they change, a silent shard's Lease taken over once
//! uncertain, a released Lease dead at once, a renewed one ready again, an orphaned one deleted;
//! hostile Leases (a name no label value can hold, another holder, no renewTime) kept off the
//! ring while everything else moves.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::PostParams;
use sharder_common::labels::STATE_LABEL;
use sharder_harness::fixtures::shard_lease;
use sharder_harness::wait::{eventually, metric_value};
use sharder_harness::world::set_lease_holder;

use crate::{Test, WAIT};

fn state_of(lease: &Lease) -> Option<String> {
    lease.labels().get(STATE_LABEL).cloned()
}

#[tokio::test]
async fn lease_states_are_labelled_and_a_silent_shard_is_taken_over_then_deleted() {
    let mut w = Test::new("states").await;
    w.create_ring().await;
    w.add_shard_lease("steady", 3600).await;
    // The short Leases come after the reconciler is ready, so their first state is seen
    // however long its start took.
    w.start_reconciler().await;
    w.add_shard_lease("silent", 2).await;
    let silent_renewed = w
        .leases()
        .get("silent")
        .await
        .expect("get")
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    w.add_shard_lease("renewed", 2).await;

    // A released lease is dead at once.
    w.add_shard_lease("released", 3600).await;
    eventually("released starts ready", WAIT, || async {
        let l = w
            .leases()
            .get("released")
            .await
            .map_err(|e| e.to_string())?;
        (state_of(&l).as_deref() == Some("ready"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    set_lease_holder(&w.leases(), "released", "").await;

    // Watch the silent lease's state label over time.
    let started = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut renewed_ready_again = false;
    let mut renewed_once = false;
    let taken = loop {
        assert!(
            started.elapsed() < WAIT,
            "silent lease not taken over; states seen {seen:?}\n{}",
            w.reconciler_log(0)
        );
        let silent = w.leases().get("silent").await.expect("get");
        if let Some(state) = state_of(&silent)
            && seen.last() != Some(&state)
        {
            seen.push(state);
        }
        // Renew "renewed" once it is expired: it must become ready again.
        let renewed = w.leases().get("renewed").await.expect("get");
        if !renewed_once && state_of(&renewed).as_deref() == Some("expired") {
            let mut l = renewed.clone();
            l.spec.as_mut().expect("spec").renew_time = Some(MicroTime(Timestamp::now()));
            l.spec.as_mut().expect("spec").lease_duration_seconds = Some(3600);
            w.leases()
                .replace("renewed", &PostParams::default(), &l)
                .await
                .expect("renew");
            renewed_once = true;
        }
        if renewed_once && state_of(&renewed).as_deref() == Some("ready") {
            renewed_ready_again = true;
        }
        if silent
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("shardlease-controller")
        {
            break silent;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(&seen[..2], ["ready", "expired"], "states seen {seen:?}");
    let spec = taken.spec.clone().expect("spec");
    assert_eq!(
        spec.lease_duration_seconds,
        Some(4),
        "twice the shard's duration"
    );
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(state_of(&taken).as_deref(), Some("dead"));
    // Taken over only after it had been expired for a full duration: renewed at creation,
    // expired 2 s later, uncertain 2 s after that.
    let renewed_at = silent_renewed.expect("silent lease was created with a renewTime");
    let taken_at = spec
        .acquire_time
        .clone()
        .expect("takeover sets acquireTime")
        .0;
    let after = taken_at.duration_since(renewed_at);
    assert!(
        after >= k8s_openapi::jiff::SignedDuration::from_secs(4),
        "taken over {after:?} after the last renewal"
    );

    eventually("released lease is dead", WAIT, || async {
        let l = w
            .leases()
            .get("released")
            .await
            .map_err(|e| e.to_string())?;
        (state_of(&l).as_deref() == Some("dead"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    eventually("the renewed lease is ready again", WAIT, || async {
        let l = w.leases().get("renewed").await.map_err(|e| e.to_string())?;
        (renewed_ready_again || state_of(&l).as_deref() == Some("ready"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    assert_eq!(
        state_of(&w.leases().get("steady").await.expect("get")).as_deref(),
        Some("ready")
    );

    // Orphaned (dead and expired for a minute: 4 s + 60 s after the takeover), then deleted.
    eventually(
        "the orphaned lease is deleted",
        Duration::from_secs(100),
        || async {
            match w.leases().get_opt("silent").await {
                Ok(None) => Ok(()),
                Ok(Some(l)) => Err(format!("still there: {:?}", state_of(&l))),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    // Its state leaves the metrics once it is deleted.
    eventually(
        "the deleted Lease's state gone from the metrics",
        WAIT,
        || async {
            let metrics = w.reconcilers[0].metrics().await;
            let state = metric_value(
                &metrics,
                "controller_sharding_shard_state",
                &[("shard", "silent")],
            );
            state.map_or(Ok(()), |v| Err(format!("still there: {v}")))
        },
    )
    .await;
}

#[tokio::test]
async fn hostile_shard_leases_stay_off_the_ring_and_everything_else_keeps_moving() {
    let mut w = Test::new("hostile").await;
    w.create_ring().await;
    w.add_shard_lease("good", 3600).await;
    let ring = w.id();
    // Held by itself, but 65 characters: a Lease name may be, a label value may not.
    let long = format!("long-{}", "x".repeat(60));
    let mut imposter = shard_lease(&w.ns, &ring, "imposter", true, 3600);
    imposter.spec.as_mut().expect("spec").holder_identity = Some("someone-else".into());
    let mut unrenewed = shard_lease(&w.ns, &ring, "unrenewed", true, 3600);
    unrenewed.spec.as_mut().expect("spec").renew_time = None;
    for lease in [
        shard_lease(&w.ns, &ring, &long, true, 3600),
        imposter,
        unrenewed,
    ] {
        w.leases()
            .create(&PostParams::default(), &lease)
            .await
            .expect("the apiserver accepts it");
    }
    // What the apiserver refuses never reaches the reconciler.
    for seconds in [0, -5] {
        let refused = w
            .leases()
            .create(
                &PostParams::default(),
                &shard_lease(&w.ns, &ring, "no-duration", true, seconds),
            )
            .await
            .expect_err("a Lease of no duration");
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 422),
            "{refused}"
        );
    }
    w.start_webhook().await;
    w.start_reconciler().await;
    w.wait_until_webhook_assigns().await;
    w.create_objects(30).await;

    eventually("every object on the one good shard", WAIT, || async {
        let shards: BTreeSet<Option<String>> = w
            .list_secrets()
            .await
            .values()
            .map(|s| w.shard_of(s))
            .chain(
                w.list_configmaps("child-")
                    .await
                    .values()
                    .map(|c| w.shard_of(c)),
            )
            .collect();
        (shards == BTreeSet::from([Some("good".to_owned())]))
            .then_some(())
            .ok_or(format!("{shards:?}"))
    })
    .await;
    assert_eq!(w.desired_ring().await.shards(), ["good"]);
    let reported = w
        .events("Warning", "InvalidShardName", "Lease", &long)
        .await;
    assert_eq!(reported, 1, "the long name is reported once, on its Lease");
    assert!(
        w.reconcilers[0].process.try_wait().is_none(),
        "the reconciler keeps running"
    );
}
