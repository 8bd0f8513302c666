//! The Lease keeper against a real kube-apiserver: one holder at a time, renewals keep the Lease
//! ready, a release hands it over at once, an abandoned Lease is taken after it expires, and a
//! holder whose Lease is taken learns it has lost it (as does one whose renewals hang, before its
//! Lease can expire), and one whose Lease's labels are written beside it (the shard lease
//! controller's state label) keeps it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use sharder_common::{ShardState, shard_state};
use sharder_harness::ControlPlane;
use sharder_harness::proxy::Proxy;
use sharder_harness::world::set_lease_holder;
use sharder_runtime::lease::{Attempt, HoldError, LeaseConfig, LeaseKeeper, OnStop, hold};
use tokio_util::sync::CancellationToken;

async fn keepers(name: &str, identities: [&str; 2]) -> (LeaseKeeper, LeaseKeeper, Api<Lease>) {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.namespace("lease").await.expect("namespace");
    let client = cp.client().await.expect("client");
    let keeper = |identity: &str| {
        LeaseKeeper::new(
            client.clone(),
            LeaseConfig {
                namespace: ns.clone(),
                name: name.into(),
                identity: identity.into(),
                duration: Duration::from_secs(2),
                renew_interval: Duration::from_millis(300),
                labels: [("app".to_owned(), "test".to_owned())].into(),
            },
        )
    };
    (
        keeper(identities[0]),
        keeper(identities[1]),
        Api::namespaced(client, &ns),
    )
}

#[tokio::test]
async fn one_holder_at_a_time_and_a_release_hands_over_at_once() {
    let (a, b, api) = keepers("shard-a", ["shard-a", "other"]).await;
    let shutdown = CancellationToken::new();
    let held = a.clone().acquire(&shutdown).await.expect("acquire");
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::HeldByOther
    );

    // Renewals keep the Lease ready past its duration.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lease = api.get("shard-a").await.expect("get");
    assert_eq!(
        shard_state(&lease, Timestamp::now()).state,
        ShardState::Ready
    );
    assert_eq!(lease.metadata.labels.expect("labels")["app"], "test");
    assert!(!held.lost().is_cancelled());

    held.release().await.expect("release");
    let lease = api.get("shard-a").await.expect("get");
    assert_eq!(
        shard_state(&lease, Timestamp::now()).state,
        ShardState::Dead,
        "released is dead at once"
    );
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::Held
    );
}

#[tokio::test]
async fn an_abandoned_lease_is_taken_only_after_it_expires() {
    let (a, b, api) = keepers("leader", ["replica-1", "replica-2"]).await;
    let shutdown = CancellationToken::new();
    let held = a.acquire(&shutdown).await.expect("acquire");
    held.abandon().await;
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::HeldByOther
    );
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::Held
    );
    let lease = api.get("leader").await.expect("get");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-2"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_holder_whose_lease_is_taken_loses_it() {
    let (a, _, api) = keepers("taken", ["replica-1", "replica-2"]).await;
    let shutdown = CancellationToken::new();
    let held = a.acquire(&shutdown).await.expect("acquire");
    // The holder renews every 300 ms meanwhile.
    set_lease_holder(&api, "taken", "shardlease-controller").await;
    tokio::time::timeout(Duration::from_secs(5), held.lost().cancelled())
        .await
        .expect("the holder learns it lost the lease");
}

#[tokio::test]
async fn a_holder_keeps_its_lease_while_others_write_its_labels() {
    let (a, _, api) = keepers("relabelled", ["relabelled", "other"]).await;
    let held = a.acquire(&CancellationToken::new()).await.expect("acquire");
    // The shard lease controller writes its state label with merge patches (no
    // resourceVersion). Here a label write every 100 ms for 3 s (the controller writes one on a
    // state change): each renewal, every 300 ms, finds the Lease changed since it last wrote it,
    // past the 1.7 s renewal deadline. (Back to back, on a loaded machine, the writes can leave a
    // read and its write no gap at all.)
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = 0_u32;
    while tokio::time::Instant::now() < until && !held.lost().is_cancelled() {
        pace.tick().await;
        let patch =
            serde_json::json!({"metadata": {"labels": {"test/written": writes.to_string()}}});
        api.patch("relabelled", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label write");
        writes += 1;
    }
    assert!(
        !held.lost().is_cancelled(),
        "the holder lost its Lease to {writes} label writes"
    );
    let lease = api.get("relabelled").await.expect("get");
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("relabelled")
    );
    assert_eq!(
        shard_state(&lease, Timestamp::now()).state,
        ShardState::Ready
    );
    let labels = lease.metadata.labels.expect("labels");
    assert_eq!(labels["app"], "test", "the keeper's own label stays");
    assert_eq!(
        labels["test/written"],
        (writes - 1).to_string(),
        "a renewal wrote back no older labels"
    );
}

#[tokio::test]
async fn a_dropped_holder_stops_renewing_like_a_crash() {
    let (a, _, api) = keepers("shard-dropped", ["shard-dropped", "other"]).await;
    let held = a.acquire(&CancellationToken::new()).await.expect("acquire");
    drop(held);
    // A renewal already in flight may still land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = api.get("shard-dropped").await.expect("get");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = api.get("shard-dropped").await.expect("get");
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    assert_eq!(
        renewed(&before),
        renewed(&after),
        "no renewal after the drop"
    );
    assert_eq!(
        after.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("shard-dropped"),
        "not released either"
    );
    assert_ne!(
        shard_state(
            &api.get("shard-dropped").await.expect("get"),
            Timestamp::now()
        )
        .state,
        ShardState::Ready
    );
}

#[tokio::test]
async fn work_that_ends_by_itself_is_reported_and_its_lease_released() {
    let (a, b, api) = keepers("ended", ["replica-1", "replica-2"]).await;
    let result = hold(a, &CancellationToken::new(), OnStop::Release, |_| async {
        Ok::<(), String>(())
    })
    .await;
    assert!(
        matches!(result, Err(HoldError::Ended(ref name)) if name == "ended"),
        "{result:?}"
    );
    let lease = api.get("ended").await.expect("get");
    assert_eq!(
        shard_state(&lease, Timestamp::now()).state,
        ShardState::Dead,
        "released, so a standby takes over at once"
    );
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::Held
    );
}

#[tokio::test]
async fn failing_work_is_reported_with_its_error() {
    let (a, _, _) = keepers("failed", ["replica-1", "replica-2"]).await;
    let result = hold(a, &CancellationToken::new(), OnStop::Release, |_| async {
        Err::<(), _>("controller crashed")
    })
    .await;
    assert_eq!(
        result.expect_err("failed").to_string(),
        "controller crashed"
    );
}

#[tokio::test]
async fn a_kept_lease_is_taken_back_at_once_by_the_same_identity_and_by_others_only_after_it_expired()
 {
    let (a, b, api) = keepers("stable-0", ["stable-0", "other"]).await;
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    hold(a.clone(), &shutdown, OnStop::Keep, |holding| async move {
        trigger.cancel();
        holding.stop.cancelled().await;
        Ok::<(), String>(())
    })
    .await
    .expect("graceful stop");
    let kept = api.get("stable-0").await.expect("get");
    assert_eq!(
        kept.spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("stable-0"),
        "not released"
    );
    assert_eq!(
        b.try_acquire_or_renew().await.expect("attempt"),
        Attempt::HeldByOther,
        "nobody else may take it before it expired"
    );
    assert_eq!(
        a.try_acquire_or_renew().await.expect("attempt"),
        Attempt::Held,
        "the same identity takes it back at once"
    );
    let back = api.get("stable-0").await.expect("get");
    assert_eq!(
        back.spec.and_then(|s| s.lease_transitions),
        kept.spec.and_then(|s| s.lease_transitions),
        "no transition: the same holder"
    );
}

#[tokio::test]
async fn a_holder_whose_renewals_hang_loses_its_lease_before_it_can_expire() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.namespace("lease").await.expect("namespace");
    let apiserver = cp.url().trim_start_matches("https://");
    let proxy = Proxy::to(apiserver.parse().expect("the apiserver's address"))
        .await
        .expect("proxy");
    let mut config = cp.config().await.expect("config");
    config.cluster_url = format!("https://{}", proxy.addr()).parse().expect("url");
    let through_proxy = kube::Client::try_from(config).expect("client");
    let duration = Duration::from_secs(3);
    let keeper = LeaseKeeper::new(
        through_proxy,
        LeaseConfig {
            namespace: ns.clone(),
            name: "partitioned".into(),
            identity: "partitioned".into(),
            duration,
            renew_interval: Duration::from_millis(500),
            labels: [("app".to_owned(), "test".to_owned())].into(),
        },
    );
    let held = keeper
        .acquire(&CancellationToken::new())
        .await
        .expect("acquire");
    let api: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), &ns);

    // Every renewal from now on hangs: no answer, no error.
    proxy.blackhole(true);
    let cut = std::time::Instant::now();
    tokio::time::timeout(2 * duration, held.lost().cancelled())
        .await
        .expect("the holder gives its lease up although its renewal never returns");
    let gave_up = Timestamp::now();
    let spec = api
        .get("partitioned")
        .await
        .expect("get")
        .spec
        .expect("spec");
    let expires = spec.renew_time.expect("renewTime").0
        + k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
            spec.lease_duration_seconds.expect("duration"),
        ));
    assert!(
        gave_up < expires,
        "gave up at {gave_up}, after the lease expired at {expires} ({:?} after the cut)",
        cut.elapsed()
    );
    proxy.blackhole(false);
}
