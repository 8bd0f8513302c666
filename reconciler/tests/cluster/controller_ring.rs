//! ControllerRings (the reference's contract since v0.9) beside ClusterRings: shards written
//! from the ControllerRing contract alone (Leases labelled `alpha.sharding.timebertt.dev/
//! controllerring`, plain label keys `shard.alpha.sharding.timebertt.dev/<ring>`) are assigned,
//! drained onto a new shard and recovered from a dead one exactly as the ring predicts; the
//! ring's configuration `controllerring-<ring>`, status, Events and metrics carry its kind; and a
//! ClusterRing and a ControllerRing sharding the same objects each keep their own labels.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use sharder_common::{Ring, RingKind};
use sharder_harness::wait::{eventually, metric_value};
use sharder_harness::world::World;

use crate::{Test, WAIT};

#[tokio::test]
async fn shards_of_the_controller_ring_contract_are_assigned_drained_and_recovered() {
    let mut w = Test::of_kind("ctrl", RingKind::ControllerRing).await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    let keep_alive = w.add_mortal_shard_lease("mortal", 2).await;
    w.start_webhook().await;
    w.start_reconciler().await;

    // The configuration carries the ControllerRing's names.
    let configuration = w
        .configuration_of("the ControllerRing's configuration")
        .await;
    assert_eq!(
        configuration.name_any(),
        format!("controllerring-{}", w.ring)
    );
    assert_eq!(
        configuration.owner_references()[0].kind,
        "ControllerRing",
        "owned by its ring"
    );
    let hook = &configuration.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(hook.name, "sharder.sharding.timebertt.dev");
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(w.webhook.as_ref().expect("webhook").url(&w.id()).as_str())
    );
    assert!(
        hook.client_config
            .url
            .as_deref()
            .is_some_and(|u| u.ends_with(&format!("/webhooks/sharder/controllerring/{}", w.ring))),
        "{:?}",
        hook.client_config.url
    );

    // Assigned at CREATE under the plain label key.
    w.wait_until_webhook_assigns().await;
    w.create_objects(60).await;
    let three = Ring::new(["mortal", "shard-a", "shard-b"]);
    let key = format!("shard.alpha.sharding.timebertt.dev/{}", w.ring);
    assert_eq!(w.labels.shard, key);
    for (name, secret) in w.list_secrets().await {
        assert_eq!(
            secret.labels().get(&key).map(String::as_str),
            three.shard_for(&w.key(&name)),
            "{name} assigned by the webhook"
        );
    }

    // Status, by the shared schema.
    w.wait_until_ring_ready(3).await;

    // Scale-out: only the objects that move are drained; acknowledged as a shard does, they
    // and their children land on the new shard.
    let four = Ring::new(["mortal", "shard-a", "shard-b", "shard-c"]);
    let moving = w.moving(&three, &four).await;
    assert!(!moving.is_empty());
    w.add_shard_lease("shard-c", 3600).await;
    w.wait_until_drained(&moving).await;
    assert_eq!(w.acknowledge_drains().await, moving.len());
    eventually("settled on four shards", WAIT, || w.settled(&four)).await;
    assert!(
        w.ring_event("Normal", "Rebalanced").await,
        "a Rebalanced Event on the ControllerRing"
    );

    // A dead shard's objects move to the rest.
    keep_alive.abort();
    let rest = Ring::new(["shard-a", "shard-b", "shard-c"]);
    eventually("the dead shard's objects reassigned", WAIT, || {
        w.settled(&rest)
    })
    .await;

    // Metrics by the reference's names and label.
    let metrics = w.reconcilers[0].metrics().await;
    let ring = w.ring.clone();
    let shards = metric_value(
        &metrics,
        "controller_sharding_controllerring_status_shards",
        &[("controllerring", &ring)],
    );
    assert_eq!(
        metric_value(
            &metrics,
            "controller_sharding_shard_info",
            &[("controllerring", &ring), ("shard", "shard-c")]
        ),
        Some(1.0),
        "{metrics}"
    );
    for generation in [
        "controller_sharding_controllerring_metadata_generation",
        "controller_sharding_controllerring_observed_generation",
    ] {
        assert_eq!(
            metric_value(&metrics, generation, &[("controllerring", &ring)]),
            Some(1.0),
            "{generation}: {metrics}"
        );
    }
    assert!(
        matches!(shards, Some(n) if n == 3.0 || n == 4.0),
        "4 Leases, or 3 once the dead one is deleted as orphaned: {shards:?}\n{metrics}"
    );
    assert!(
        metric_value(
            &metrics,
            "controller_sharding_drains_total",
            &[("controllerring", &ring), ("resource", "secrets")]
        )
        .is_some_and(|n| n >= moving.len() as f64),
        "{metrics}"
    );

    // A deleted configuration comes back.
    Api::<MutatingWebhookConfiguration>::all(w.client.clone())
        .delete(&configuration.name_any(), &DeleteParams::default())
        .await
        .expect("delete the configuration");
    eventually("the configuration restored", WAIT, || async {
        Api::<MutatingWebhookConfiguration>::all(w.client.clone())
            .get_opt(&configuration.name_any())
            .await
            .map_err(|e| e.to_string())?
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|_| ())
            .ok_or("absent".to_owned())
    })
    .await;
}

#[tokio::test]
async fn a_cluster_ring_and_a_controller_ring_over_the_same_objects_keep_their_own_labels() {
    let mut w = Test::new("both").await;
    let theirs = World::in_namespace(w.cp, w.ns.clone())
        .await
        .with_kind(RingKind::ControllerRing);
    w.create_ring().await;
    theirs.create_ring().await;
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    for shard in ["ctrl-a", "ctrl-b", "ctrl-c"] {
        theirs.add_shard_lease(shard, 3600).await;
    }
    w.start_webhook().await;
    w.start_reconciler().await;
    w.wait_until_webhook_assigns().await;
    w.create_objects(40).await;
    let ours = Ring::new(["shard-a", "shard-b"]);
    let controller = Ring::new(["ctrl-a", "ctrl-b", "ctrl-c"]);
    eventually("both rings assigned every object", WAIT, || async {
        w.settled(&ours).await?;
        theirs.settled(&controller).await
    })
    .await;
    for (name, secret) in w.list_secrets().await {
        let sharding: Vec<&String> = secret
            .labels()
            .keys()
            .filter(|k| k.starts_with("shard.alpha.sharding.timebertt.dev/"))
            .collect();
        assert_eq!(
            sharding.len(),
            2,
            "{name}: one label per ring: {sharding:?}"
        );
    }

    // A shard joining the ControllerRing drains only the ControllerRing's label.
    let before = w.list_secrets().await;
    theirs.add_shard_lease("ctrl-d", 3600).await;
    let grown = Ring::new(["ctrl-a", "ctrl-b", "ctrl-c", "ctrl-d"]);
    let moving: BTreeSet<String> = before
        .keys()
        .filter(|n| controller.shard_for(&w.key(n)) != grown.shard_for(&w.key(n)))
        .cloned()
        .collect();
    assert!(!moving.is_empty());
    theirs.wait_until_drained(&moving).await;
    for (name, secret) in w.list_secrets().await {
        assert!(
            !w.draining(&secret),
            "{name}: the ClusterRing drains nothing"
        );
        assert_eq!(
            w.shard_of(&secret),
            w.shard_of(&before[&name]),
            "{name} keeps its ClusterRing shard"
        );
    }
    assert_eq!(theirs.acknowledge_drains().await, moving.len());
    eventually(
        "the ControllerRing settled, the ClusterRing unchanged",
        WAIT,
        || async {
            theirs.settled(&grown).await?;
            w.settled(&ours).await
        },
    )
    .await;
}
