//! The placement policy of a ring keyed by namespace (`sharder_common::placement_policy`) on the
//! real apiserver, with no webhook and no reconciler running: a new object of the ring gets the
//! shard its namespace has in the table, a leftover drain label goes, an assigned object is left
//! alone, a changed table places the next objects, and a namespace without an entry is left
//! unassigned.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::RingObject;
use sharder_common::placement_policy::{
    Table, binding_resource, placement_policy, policy_resource,
};
use sharder_harness::wait::eventually;

use crate::{Test, WAIT, named};

#[tokio::test]
async fn a_placement_policy_assigns_new_objects_from_its_table_without_a_webhook() {
    let w = Test::new("policy").await;
    w.create_ring().await;
    let object = w.rings().get(&w.ring).await.expect("the ring");
    let ring = RingObject::from_dynamic(w.kind, &object);
    let roles = ring.roles().expect("a valid ring");
    // The table lives outside the ring's namespaces, as in the sharder's own namespace.
    let home = w.cp.namespace("policy-table").await.expect("namespace");
    let table = Table::of(&ring, &home);
    let tables = Api::<ConfigMap>::namespaced(w.client.clone(), &home);
    let mut entries: ConfigMap = named(&table.name, &[]);
    entries.data = Some([(w.ns.clone(), "shard-a".to_owned())].into());
    tables
        .create(&PostParams::default(), &entries)
        .await
        .expect("the table");
    let (policy, binding) = placement_policy(&ring, &roles, &table, &LabelSelector::default());
    Api::<DynamicObject>::all_with(w.client.clone(), &policy_resource())
        .create(&PostParams::default(), &policy)
        .await
        .expect("the policy");
    Api::<DynamicObject>::all_with(w.client.clone(), &binding_resource())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the binding");

    // Admission sees the policy, its binding and the table a moment after they are written:
    // each step creates objects until one carries what it should.
    let mut probe = 0;
    let mut placed = |want: Option<&'static str>,
                      labels: &'static [(&'static str, &'static str)]| {
        probe += 1;
        let (name, w) = (format!("probe-{probe}"), &w);
        async move {
            let created = w
                .secrets()
                .create(&PostParams::default(), &named(&name, labels))
                .await
                .map_err(|e| e.to_string())?;
            let got = w.shard_of(&created);
            (got.as_deref() == want)
                .then_some(created)
                .ok_or(format!("{name} on {got:?}, want {want:?}"))
        }
    };
    eventually("a new Secret gets its namespace's shard", WAIT, || {
        placed(Some("shard-a"), &[])
    })
    .await;

    // A controlled resource's object alike; a leftover drain label goes with the assignment.
    let drain = w.labels.drain.clone();
    let mut child: ConfigMap = named("child", &[(drain.as_str(), "true")]);
    child.data = Some([("k".to_owned(), "v".to_owned())].into());
    let child = w
        .configmaps()
        .create(&PostParams::default(), &child)
        .await
        .expect("child");
    assert_eq!(w.shard_of(&child).as_deref(), Some("shard-a"));
    assert!(!child.labels().contains_key(&drain), "the drain label went");

    // An assigned object is left alone, and so is an UPDATE of one.
    let shard = w.labels.shard.clone();
    let assigned = w
        .secrets()
        .create(
            &PostParams::default(),
            &named::<Secret>("assigned", &[(shard.as_str(), "shard-z")]),
        )
        .await
        .expect("assigned");
    assert_eq!(w.shard_of(&assigned).as_deref(), Some("shard-z"));

    // The shard's acknowledgement (both labels removed) is assigned again from the table.
    let patch = json!({"metadata": {"labels": {shard.as_str(): null, drain.as_str(): null}}});
    let acknowledged = w
        .secrets()
        .patch("assigned", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("acknowledge");
    assert_eq!(w.shard_of(&acknowledged).as_deref(), Some("shard-a"));

    // A changed table places the next objects.
    let moved = json!({"data": {w.ns.as_str(): "shard-b"}});
    tables
        .patch(&table.name, &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .expect("table");
    eventually("new objects follow the table", WAIT, || {
        placed(Some("shard-b"), &[])
    })
    .await;

    // A namespace without an entry (its objects moving): new objects stay unassigned.
    let gone = json!({"data": {w.ns.as_str(): null}});
    tables
        .patch(&table.name, &PatchParams::default(), &Patch::Merge(&gone))
        .await
        .expect("table");
    eventually("a namespace without an entry is left alone", WAIT, || {
        placed(None, &[])
    })
    .await;
}
