//! Hostile rings and owner references, at the apiserver: a ring deleted during its rebalance gets
//! no more writes; a ClusterRing whose label keys would be too long gets them cut, one whose
//! name no Lease label can carry is refused and reported once; an object with two controllers
//! never gets past the apiserver; objects controlled in a cycle are left where they are, with a
//! Warning Event; and the rest keeps moving throughout.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;
use sharder_common::Ring;
use sharder_common::labels::{MAX_LABEL_NAME_LEN, SHARD_LABEL_PREFIX};
use sharder_harness::control_plane::ControlPlane;
use sharder_harness::fixtures::{child_of, secret, shard_lease};
use sharder_harness::wait::eventually;
use sharder_harness::world::World;

use crate::{Test, WAIT};

/// How many of the test's Secrets carry `world`'s shard label.
async fn assigned(world: &World) -> usize {
    world
        .list_secrets()
        .await
        .values()
        .filter(|s| world.shard_of(*s).is_some())
        .count()
}

/// Makes object `name` of `api` controlled by ConfigMap `owner` (its ownerReferences replaced).
async fn control<K>(api: &Api<K>, name: &str, owner: &ConfigMap)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let reference = owner.controller_owner_ref(&()).expect("created");
    let patch = json!({"metadata": {"ownerReferences": [reference]}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("{name} controlled by {}: {e}", reference.name));
}

#[tokio::test]
async fn a_ring_deleted_during_its_rebalance_gets_no_more_writes_and_the_next_ring_is_served() {
    const OBJECTS: usize = 120;
    let mut w = Test::new("deleted").await;
    w.create_ring().await;
    w.add_shard_lease("shard-a", 3600).await;
    w.create_secrets(OBJECTS).await;
    // No webhook: every assignment is a write of the reconciler, 10 a second, so the first
    // rebalance takes 12 s.
    w.start_reconciler_with(
        std::time::Duration::from_secs(1),
        &[("--max-writes-per-second", "10")],
    )
    .await;
    eventually("the first rebalance under way", WAIT, || async {
        let n = assigned(&w).await;
        (n >= 10).then_some(()).ok_or(n)
    })
    .await;
    w.configuration_of("the ring's webhook configuration").await;
    let before = w.rebalances(0).await;
    w.rings()
        .delete(&w.ring, &DeleteParams::default())
        .await
        .expect("delete the ring");

    let ended = w
        .wait_for_metrics(0, "the deleted ring's rebalance ended", |m| {
            m.count > before.count
        })
        .await;
    let at_stop = assigned(&w).await;
    assert!(
        at_stop < OBJECTS,
        "the rebalance stopped before its end: {at_stop} of {OBJECTS} assigned ({ended:?})"
    );

    // The reconciler goes on: a new ring over the same objects is served in full.
    let next = World::with_ring(w.cp, w.ns.clone(), format!("{}-next", w.ring)).await;
    next.create_ring().await;
    next.add_shard_lease("shard-b", 3600).await;
    eventually("the next ring assigned every object", WAIT, || async {
        let n = assigned(&next).await;
        (n == OBJECTS).then_some(()).ok_or(n)
    })
    .await;
    assert_eq!(
        assigned(&w).await,
        at_stop,
        "nothing was written for the deleted ring after it said it stopped"
    );
    let configurations = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    eventually(
        "the deleted ring's configuration goes with it",
        WAIT,
        || async {
            let found = configurations
                .get_opt(&w.id().configuration_name())
                .await
                .map_err(|e| e.to_string())?;
            found
                .is_none()
                .then_some(())
                .ok_or("still there".to_owned())
        },
    )
    .await;
    assert!(
        w.reconcilers[0].process.try_wait().is_none(),
        "the reconciler keeps running"
    );
}

#[tokio::test]
async fn long_ring_names_two_controllers_and_owner_cycles_are_cut_refused_or_placed() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.namespace("hostilering").await.expect("namespace");
    // A ClusterRing of 63 characters: the name part of its label keys
    // (`clusterring-<checksum>-<name>`) is cut to 63.
    let long = format!("{ns}-{}", "r".repeat(62 - ns.len()));
    let mut w = Test::in_world(World::with_ring(cp, ns.clone(), long).await).await;
    assert_eq!(w.ring.len(), MAX_LABEL_NAME_LEN);
    assert_eq!(
        w.labels.shard.len(),
        SHARD_LABEL_PREFIX.len() + MAX_LABEL_NAME_LEN
    );
    // A ClusterRing of 64 characters: no shard Lease can name it (a label value), so the
    // reconciler refuses it. (A ControllerRing's CRD refuses such a name at the apiserver.)
    let refused = World::with_ring(
        cp,
        ns.clone(),
        format!("{ns}-{}", "c".repeat(63 - ns.len())),
    )
    .await;
    assert_eq!(refused.ring.len(), MAX_LABEL_NAME_LEN + 1);
    w.create_ring().await;
    refused.create_ring().await;
    let error = refused
        .leases()
        .create(
            &PostParams::default(),
            &shard_lease(&ns, &refused.id(), "shard-x", true, 3600),
        )
        .await
        .expect_err("a Lease labelled with a 64-character ring name");
    assert!(
        matches!(&error, kube::Error::Api(s) if s.code == 422),
        "{error}"
    );
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    // No webhook: the sweeps place everything.
    w.start_reconciler().await;
    w.create_objects(20).await;

    let pp = PostParams::default();
    let secrets = w.secrets();
    let configmaps = w.configmaps();
    // Two controller references: the apiserver refuses the object.
    let first = secrets.get("object-0").await.expect("owner");
    let second = secrets.get("object-1").await.expect("owner");
    let mut two = child_of(&first, "child-two-controllers");
    two.metadata
        .owner_references
        .get_or_insert_default()
        .push(second.controller_owner_ref(&()).expect("created"));
    let error = configmaps
        .create(&pp, &two)
        .await
        .expect_err("an object with two controllers");
    assert!(
        matches!(&error, kube::Error::Api(s) if s.code == 422 && s.message.contains("Only one reference can have Controller set to true")),
        "{error}"
    );

    // A Secret and its child controlling each other: the Secret is a main object (its own
    // key), the child follows it.
    let looped = secrets
        .create(&pp, &secret("object-looped"))
        .await
        .expect("secret");
    let looped_child = configmaps
        .create(&pp, &child_of(&looped, "child-looped"))
        .await
        .expect("child");
    control(&secrets, "object-looped", &looped_child).await;
    // Two ConfigMaps controlling each other: a chain (their controller is a controlled
    // resource of the ring) that is a cycle, so both are left where they are (unassigned).
    let named = |name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let a = configmaps
        .create(&pp, &named("cycle-a"))
        .await
        .expect("cycle-a");
    let b = configmaps
        .create(&pp, &named("cycle-b"))
        .await
        .expect("cycle-b");
    control(&configmaps, "cycle-a", &b).await;
    control(&configmaps, "cycle-b", &a).await;

    // Everything placed as the ring predicts, then again after a shard joins (the drains
    // acknowledged as a shard does).
    for shards in [
        vec!["shard-a", "shard-b"],
        vec!["shard-a", "shard-b", "shard-c"],
    ] {
        if shards.len() == 3 {
            w.add_shard_lease("shard-c", 3600).await;
        }
        let ring = Ring::new(shards.iter().copied());
        eventually("every object where the ring puts it", WAIT, || async {
            w.acknowledge_drains().await;
            w.settled(&ring).await?;
            if !w.ring_event("Warning", "OwnerChainNotFollowed").await {
                return Err("no Event on the cycle".to_owned());
            }
            Ok(())
        })
        .await;
        for name in ["cycle-a", "cycle-b"] {
            let object = configmaps.get(name).await.expect("cycle");
            assert_eq!(w.shard_of(&object), None, "{name} placed");
        }
    }
    eventually("the ring's status names the cycle", WAIT, || async {
        let chains = w.ring_condition("OwnerChainsFollowed").await?;
        let message = chains["message"].as_str().unwrap_or_default();
        (chains["status"] == "False" && message.contains("cycles through"))
            .then_some(())
            .ok_or(chains.to_string())
    })
    .await;

    // The long ring is reported, once, and gets no configuration.
    let message = eventually("the long ring reports why", WAIT, || async {
        let ready = refused.ring_condition("Ready").await?;
        (ready["status"] == "False" && ready["reason"] == "InvalidSpec")
            .then(|| ready["message"].as_str().unwrap_or_default().to_owned())
            .ok_or(ready.to_string())
    })
    .await;
    assert!(message.contains("longer than 63"), "{message}");
    let configurations = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    assert!(
        configurations
            .get_opt(&refused.id().configuration_name())
            .await
            .expect("get")
            .is_none(),
        "no configuration for the refused ring"
    );
    let reported = refused
        .events("Warning", "InvalidSpec", refused.kind.kind(), &refused.ring)
        .await;
    assert_eq!(reported, 1, "the refused ring is reported once");
    assert!(
        w.reconcilers[0].process.try_wait().is_none(),
        "the reconciler keeps running"
    );
}
