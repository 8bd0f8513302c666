//! Rebalancing: a scale-out drains exactly the objects that move (2 writes per moved object
//! with the acknowledgement, none for the rest), a dead shard's objects and their children move
//! directly (1 write each), objects the webhook missed are swept, cluster-scoped resources are
//! sharded and unselected namespaces left alone.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::{ClusterRing, Ring};
use sharder_tests::fixtures::{secret, secrets_ring};
use sharder_tests::wait::eventually;

use crate::{Test, WAIT};

#[tokio::test]
async fn scale_out_drains_exactly_the_objects_that_move_and_nothing_else_is_written() {
    let mut w = Test::new("scaleout").await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b", "shard-c"] {
        w.add_shard_lease(shard, 3600).await;
    }
    w.start_webhook().await;
    w.start_reconciler().await;
    w.wait_until_webhook_assigns().await;
    w.create_objects(150).await;

    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let four = Ring::new(["shard-a", "shard-b", "shard-c", "shard-d"]);
    let before = w.list_secrets().await;
    let children_before = w.list_configmaps("child-").await;
    assert_eq!((before.len(), children_before.len()), (150, 150));
    for (name, secret) in &before {
        assert_eq!(
            w.shard_of(secret).as_deref(),
            three.shard_for(&w.key(name)),
            "{name} assigned by the webhook"
        );
    }
    let moving: BTreeSet<&String> = before
        .keys()
        .filter(|n| three.shard_for(&w.key(n)) != four.shard_for(&w.key(n)))
        .collect();
    assert!(!moving.is_empty() && moving.len() < 150);

    w.add_shard_lease("shard-d", 3600).await;
    eventually("every moving object is drained", WAIT, || async {
        let now = w.list_secrets().await;
        let drained = now.values().filter(|s| w.draining(*s)).count();
        (drained == moving.len())
            .then_some(())
            .ok_or(format!("{drained} of {} drained", moving.len()))
    })
    .await;
    // Give a straggling write a moment to show up, then check what was written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = w.list_secrets().await;
    for (name, secret) in &after {
        if moving.contains(name) {
            assert!(w.draining(secret), "{name} should be draining");
            assert_eq!(
                w.shard_of(secret),
                w.shard_of(&before[name]),
                "{name} keeps its shard until acknowledged"
            );
        } else {
            assert!(!w.draining(secret), "{name} must not be drained");
            assert_eq!(
                secret.resource_version(),
                before[name].resource_version(),
                "{name} was written but stays"
            );
        }
    }
    // While their owners drain, children stay where their owners are still held: nothing may
    // land on the new shard ahead of its owner.
    for (name, child) in w.list_configmaps("child-").await {
        assert_eq!(
            child.resource_version(),
            children_before[&name].resource_version(),
            "{name} was written while its owner was not acknowledged"
        );
    }

    // The shards acknowledge; the webhook assigns the new shard in the same request; then each
    // moving owner's child follows it.
    let acknowledged = w.acknowledge_drains().await;
    assert_eq!(acknowledged, moving.len());
    eventually(
        "every object and child on its desired shard, no drain label left",
        WAIT,
        || async {
            let now = w.list_secrets().await;
            let mut wrong: Vec<String> = now
                .iter()
                .filter(|(n, s)| {
                    w.shard_of(*s).as_deref() != four.shard_for(&w.key(n)) || w.draining(*s)
                })
                .map(|(n, _)| n.clone())
                .collect();
            for (name, child) in w.list_configmaps("child-").await {
                let owner = &now[&child.owner_references()[0].name];
                if w.shard_of(&child) != w.shard_of(owner) {
                    wrong.push(name);
                }
            }
            wrong
                .is_empty()
                .then_some(())
                .ok_or(format!("{} objects not settled: {wrong:?}", wrong.len()))
        },
    )
    .await;
    let used: BTreeSet<String> = w
        .list_secrets()
        .await
        .values()
        .filter_map(|s| w.shard_of(s))
        .collect();
    assert_eq!(used.len(), 4);
    let log = w.reconciler_log(0);
    assert!(
        log.contains("draining") && log.contains(r#""reason":"drain""#),
        "moves are logged:\n{log}"
    );

    // Writes, from the apiserver's audit log: the reconciler wrote once per drained object and
    // once per child following its owner (after the owner's acknowledgement), nothing for
    // objects that stay; with the shard's acknowledgement that is 2 writes per object moved off
    // a live shard and 1 per child.
    let by_reconciler = w.writes_by(&w.reconciler_user());
    let by_shards = w.writes_by("admin");
    for name in before.keys() {
        let key = ("secrets".to_owned(), name.clone());
        let (reconciler, shard) = (
            by_reconciler.get(&key).copied().unwrap_or(0),
            by_shards.get(&key).copied().unwrap_or(0),
        );
        if moving.contains(name) {
            assert_eq!(
                (reconciler, shard),
                (1, 2),
                "{name}: drain by the reconciler; create + acknowledgement by the test"
            );
        } else {
            assert_eq!((reconciler, shard), (0, 1), "{name}: only its create");
        }
    }
    for (name, child) in w.list_configmaps("child-").await {
        let owner = &child.owner_references()[0].name;
        let writes = by_reconciler
            .get(&("configmaps".to_owned(), name.clone()))
            .copied()
            .unwrap_or(0);
        assert_eq!(writes, usize::from(moving.contains(owner)), "{name}");
    }
    let total: usize = by_reconciler.values().sum();
    println!(
        "scale-out 3 -> 4: {} of 150 main objects moved (ideal 1/4 = 37.5), reconciler writes {total}, acknowledgements {}",
        moving.len(),
        moving.len()
    );

    // The rebalance is reported as an Event on the ring.
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(w.client.clone());
    let reported = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("Rebalanced")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(w.ring.as_str())
        });
    assert!(reported, "a Rebalanced Event on the ClusterRing");
}

#[tokio::test]
async fn a_dead_shards_objects_move_directly_and_missed_objects_are_swept() {
    let mut w = Test::new("dead").await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    w.add_shard_lease("mortal", 2).await;
    w.start_webhook().await;
    w.start_reconciler().await;
    w.wait_until_webhook_assigns().await;
    // Keep "mortal" alive while the objects are created, then let it die.
    let keep_alive = {
        let leases = w.leases();
        tokio::spawn(async move {
            loop {
                if let Ok(mut l) = leases.get("mortal").await {
                    l.spec.as_mut().expect("spec").renew_time = Some(MicroTime(Timestamp::now()));
                    let _ = leases.replace("mortal", &PostParams::default(), &l).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    w.create_objects(60).await;
    let three = Ring::new(["mortal", "shard-a", "shard-b"]);
    let two = Ring::new(["shard-a", "shard-b"]);
    let on_mortal: BTreeSet<String> = w
        .list_secrets()
        .await
        .iter()
        .filter(|(_, s)| w.shard_of(*s).as_deref() == Some("mortal"))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!on_mortal.is_empty());
    for name in &on_mortal {
        assert_eq!(three.shard_for(&w.key(name)), Some("mortal"));
    }

    keep_alive.abort();
    let stopped = Instant::now();
    eventually(
        "the dead shard's objects and their children are reassigned",
        WAIT,
        || async {
            let secrets = w.list_secrets().await;
            let children = w.list_configmaps("child-").await;
            let left = secrets
                .values()
                .filter(|s| w.shard_of(*s).as_deref() == Some("mortal"))
                .count()
                + children
                    .values()
                    .filter(|c| w.shard_of(*c).as_deref() == Some("mortal"))
                    .count();
            (left == 0)
                .then_some(())
                .ok_or(format!("{left} objects still on the dead shard"))
        },
    )
    .await;
    let took = stopped.elapsed();
    for (name, secret) in w.list_secrets().await {
        assert_eq!(
            w.shard_of(&secret).as_deref(),
            two.shard_for(&w.key(&name)),
            "{name}"
        );
        assert!(!w.draining(&secret), "{name}: no drain off a dead shard");
    }
    for (name, child) in w.list_configmaps("child-").await {
        let owner = &child.owner_references()[0].name;
        assert_eq!(
            w.shard_of(&child).as_deref(),
            two.shard_for(&w.key(owner)),
            "{name} follows its owner"
        );
    }
    assert!(w.reconciler_log(0).contains(r#""reason":"dead-shard""#));
    // One write per object moved off the dead shard (audit log), none for the others.
    let by_reconciler = w.writes_by(&w.reconciler_user());
    for name in w.list_secrets().await.keys() {
        let writes = by_reconciler
            .get(&("secrets".to_owned(), name.clone()))
            .copied()
            .unwrap_or(0);
        assert_eq!(writes, usize::from(on_mortal.contains(name)), "{name}");
    }
    println!("objects of a shard with a 2 s lease reassigned {took:?} after it stopped renewing");

    // Objects created while the webhook is down are assigned by the sweep.
    w.stop_webhook();
    let pp = PostParams::default();
    for i in 0..5 {
        let created = w
            .secrets()
            .create(&pp, &secret(&format!("object-late-{i}")))
            .await
            .expect("create while the webhook is down");
        assert_eq!(w.shard_of(&created), None);
    }
    let generated = w
        .secrets()
        .create(
            &pp,
            &Secret {
                metadata: ObjectMeta {
                    generate_name: Some("object-gen-".into()),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            },
        )
        .await
        .expect("generateName");
    eventually(
        "objects the webhook missed are swept onto their shards",
        WAIT,
        || async {
            let now = w.list_secrets().await;
            let unassigned: Vec<&String> = now
                .iter()
                .filter(|(_, s)| w.shard_of(*s).is_none())
                .map(|(n, _)| n)
                .collect();
            unassigned
                .is_empty()
                .then_some(())
                .ok_or(format!("{unassigned:?}"))
        },
    )
    .await;
    let swept = w.secrets().get(&generated.name_any()).await.expect("get");
    assert_eq!(
        w.shard_of(&swept).as_deref(),
        two.shard_for(&w.key(&generated.name_any()))
    );

    // With the webhook still down, a scale-out's acknowledged drains get their new shard from
    // the follow-up sweeps.
    w.add_shard_lease("shard-c", 3600).await;
    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let acknowledged = eventually("drains to acknowledge", WAIT, || async {
        let n = w.acknowledge_drains().await;
        if n > 0 { Ok(n) } else { Err("no drain yet") }
    })
    .await;
    assert!(acknowledged > 0);
    eventually(
        "acknowledged objects are swept onto their new shard",
        WAIT,
        || async {
            let now = w.list_secrets().await;
            let wrong = now
                .iter()
                .filter(|(n, s)| {
                    w.shard_of(*s).as_deref() != three.shard_for(&w.key(n)) || w.draining(*s)
                })
                .count();
            // Drains issued after the first acknowledgement round are acknowledged here too.
            w.acknowledge_drains().await;
            if wrong == 0 {
                Ok(())
            } else {
                Err(format!("{wrong} objects not on their shard"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn cluster_scoped_objects_are_sharded_and_unselected_namespaces_are_left_alone() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::{ApiResource, DynamicObject};
    use kube::runtime::wait::{await_condition, conditions};
    use sharder_common::{ClusterRingSpec, GroupResource, RingResource};

    let mut w = Test::new("scope").await;
    let crds = Api::<CustomResourceDefinition>::all(w.client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.sharder.dev"},
        "spec": {
            "group": "test.sharder.dev",
            "scope": "Cluster",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("crd");
    crds.patch(
        "widgets.test.sharder.dev",
        &PatchParams::apply("sharder-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("install widgets");
    tokio::time::timeout(
        WAIT,
        await_condition(
            crds,
            "widgets.test.sharder.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("established in time")
    .expect("established");

    let mut ring = secrets_ring(&w.ring, Some(&w.ns));
    ring.spec = ClusterRingSpec {
        resources: vec![
            RingResource {
                group: "test.sharder.dev".into(),
                resource: "widgets".into(),
                controlled_resources: vec![],
            },
            RingResource {
                group: String::new(),
                resource: "secrets".into(),
                controlled_resources: vec![GroupResource::new("", "configmaps")],
            },
        ],
        namespace_selector: ring.spec.namespace_selector.clone(),
    };
    Api::<ClusterRing>::all(w.client.clone())
        .create(&PostParams::default(), &ring)
        .await
        .expect("ring");
    w.add_shard_lease("shard-a", 3600).await;
    w.add_shard_lease("shard-b", 3600).await;
    let shards = Ring::new(["shard-a", "shard-b"]);

    // No webhook runs here: everything is assigned by the reconciler's sweeps.
    let widget_api = ApiResource {
        group: "test.sharder.dev".into(),
        version: "v1".into(),
        api_version: "test.sharder.dev/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets = Api::<DynamicObject>::all_with(w.client.clone(), &widget_api);
    let names: Vec<String> = (0..10).map(|i| format!("{}-widget-{i}", w.ns)).collect();
    for name in &names {
        widgets
            .create(
                &PostParams::default(),
                &DynamicObject::new(name, &widget_api),
            )
            .await
            .expect("widget");
    }
    w.secrets()
        .create(&PostParams::default(), &secret("object-0"))
        .await
        .expect("secret");
    let other = w.cp.namespace("unselected").await.expect("namespace");
    let elsewhere = Api::<Secret>::namespaced(w.client.clone(), &other);
    elsewhere
        .create(&PostParams::default(), &secret("not-mine"))
        .await
        .expect("secret");

    w.start_reconciler().await;
    eventually(
        "cluster-scoped widgets are assigned by key group/Kind//name",
        WAIT,
        || async {
            for name in &names {
                let widget = widgets.get(name).await.map_err(|e| e.to_string())?;
                let want = shards.shard_for(&format!("test.sharder.dev/Widget//{name}"));
                if w.shard_of(&widget).as_deref() != want {
                    return Err(format!("{name}: {:?} != {want:?}", w.shard_of(&widget)));
                }
            }
            Ok(())
        },
    )
    .await;
    eventually(
        "the selected namespace's secret is assigned",
        WAIT,
        || async {
            let s = w
                .secrets()
                .get("object-0")
                .await
                .map_err(|e| e.to_string())?;
            w.shard_of(&s).ok_or_else(|| "unassigned".to_owned())
        },
    )
    .await;
    // Two more sweeps later, the secret in the unselected namespace is still untouched.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let untouched = elsewhere.get("not-mine").await.expect("get");
    assert_eq!(w.shard_of(&untouched), None);
    for name in &names {
        let _ = widgets.delete(name, &DeleteParams::default()).await;
    }
}
