//! Range mode: a ring annotated with a range key gets no webhook configuration and no object
//! writes; each shard's ranges are on its Lease, and a range goes to a new shard only once the
//! shard that held it let it go (the shards here are played by the test: it writes what a shard
//! serves on its Lease), or once the shard that held it is dead; back in label mode the ranges
//! are taken back. A `uid` key on a ring with children and an apiserver without the gate are
//! refused on the ring.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use sharder_common::Ring;
use sharder_common::ranges::{
    ASSIGNED_ANNOTATION, RANGE_KEY_ANNOTATION, RANGE_TOKENS_PER_SHARD, Range, RangeKey,
    SERVED_ANNOTATION, assign_uids, thousandths, valid_assignment,
};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::Options;
use sharder_harness::wait::eventually;
use sharder_harness::world::set_lease_holder;

use super::{Test, WAIT};

impl Test {
    /// The ranges shard `name`'s Lease assigns it now (for the Lease's current holder).
    async fn assigned(&self, name: &str) -> Vec<Range> {
        valid_assignment(&self.leases().get(name).await.expect("lease"))
    }

    /// Waits until shard `name`'s Lease assigns it `ranges` (`what` names the wait).
    async fn wait_assigned(&self, name: &str, ranges: &[Range], what: &str) {
        eventually(what, WAIT, || async {
            let assigned = self.assigned(name).await;
            (assigned == ranges)
                .then_some(())
                .ok_or(format!("{name}: {assigned:?}"))
        })
        .await;
    }

    /// Plays shard `name`: it serves what its Lease assigns it, written on its Lease with the
    /// version it read.
    async fn serve(&self, name: &str) {
        let lease: Lease = self.leases().get(name).await.expect("lease");
        let assigned = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNED_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let patch = json!({"metadata": {
            "resourceVersion": lease.metadata.resource_version,
            "annotations": {SERVED_ANNOTATION: assigned},
        }});
        self.leases()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("served ranges");
    }

    /// The ring's `Ready` condition as (status, reason, message), once it satisfies `check`.
    async fn ready_until(&self, what: &str, check: impl Fn(&str, &str, &str) -> bool) {
        let rings = self.rings();
        eventually(what, WAIT, || async {
            let ring = rings
                .get_status(&self.ring)
                .await
                .map_err(|e| e.to_string())?;
            let conditions = ring.data["status"]["conditions"].clone();
            let ready = conditions
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready")
                .cloned()
                .unwrap_or_default();
            let field = |f: &str| ready[f].as_str().unwrap_or_default().to_owned();
            check(&field("status"), &field("reason"), &field("message"))
                .then_some(())
                .ok_or_else(|| ready.to_string())
        })
        .await;
    }
}

#[tokio::test]
async fn a_range_goes_to_a_new_shard_only_after_its_holder_let_it_go_and_no_object_is_written() {
    let mut t = Test::new("range-mode").await;
    t.create_ring().await;
    t.add_shard_lease("shard-a", 3600).await;
    t.start_reconciler().await;
    t.create_settled(5, &Ring::new(["shard-a"])).await;
    t.configuration_of("the label mode's webhook configuration")
        .await;

    let mark = t.audit_mark();
    t.to_range_mode("uid", true).await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(t.client.clone());
    let name = t.id().configuration_name();
    eventually("the webhook configuration deleted", WAIT, || async {
        match mwcs.get_opt(&name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
    t.wait_assigned("shard-a", &[Range::ALL], "shard-a assigned every range")
        .await;
    t.serve("shard-a").await;

    t.add_shard_lease("shard-b", 3600).await;
    let two = assign_uids(&Ring::with_tokens(
        ["shard-a", "shard-b"],
        RANGE_TOKENS_PER_SHARD,
    ));
    t.ready_until("shard-b waiting for shard-a", |_, _, message| {
        message.contains("1 shards wait")
    })
    .await;
    assert_eq!(
        t.assigned("shard-a").await,
        two["shard-a"],
        "shard-a keeps its share only"
    );
    assert_eq!(
        t.assigned("shard-b").await,
        vec![],
        "nothing while shard-a serves it"
    );

    t.serve("shard-a").await;
    t.wait_assigned("shard-b", &two["shard-b"], "shard-b assigned its share")
        .await;
    // The status records the assignment: each shard's share of the hash space.
    let shares = ["shard-a", "shard-b"]
        .map(|shard| {
            format!(
                "{shard} {:.1} %",
                f64::from(thousandths(&two[shard])) / 10.0
            )
        })
        .join(", ");
    t.ready_until("every shard has its share", |status, _, message| {
        status == "True"
            && message.contains(&format!(
                "ranges by uid: every shard has its share (of the hash space: {shares})"
            ))
    })
    .await;

    // A label ring's scale-out would have drained about half of the 5 Secrets here.
    let writes = t.writes_by_since(&t.reconciler_user(), mark);
    assert!(
        writes
            .keys()
            .all(|(resource, _)| resource != "secrets" && resource != "configmaps"),
        "no object written in range mode: {writes:?}"
    );

    // Back to label mode: the ranges are taken back, the webhook configuration returns.
    let patch = json!({"metadata": {"annotations": {RANGE_KEY_ANNOTATION: null}}});
    t.rings()
        .patch(&t.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label mode");
    for shard in ["shard-a", "shard-b"] {
        t.wait_assigned(shard, &[], "the ranges taken back").await;
    }
    t.configuration_of("the webhook configuration again").await;
}

#[tokio::test]
async fn a_shard_that_does_not_let_go_keeps_its_ranges_until_its_lease_is_taken_over() {
    let mut t = Test::new("range-stuck").await;
    t.create_ring().await;
    t.add_shard_lease("shard-a", 3600).await;
    t.to_range_mode("uid", true).await;
    t.start_reconciler().await;
    t.wait_assigned("shard-a", &[Range::ALL], "shard-a assigned every range")
        .await;
    t.serve("shard-a").await;

    // shard-a never acknowledges again: the shards that join get nothing of what it serves,
    // however often the ring is reconciled (each join is one, seen in shard-a's assignment).
    for (joining, shards) in [
        ("shard-b", &["shard-a", "shard-b"][..]),
        ("shard-c", &["shard-a", "shard-b", "shard-c"][..]),
    ] {
        t.add_shard_lease(joining, 3600).await;
        let share = assign_uids(&Ring::with_tokens(
            shards.iter().copied(),
            RANGE_TOKENS_PER_SHARD,
        ));
        t.wait_assigned(
            "shard-a",
            &share["shard-a"],
            "shard-a's assignment shrunk to its share",
        )
        .await;
        for waiting in &shards[1..] {
            assert_eq!(
                t.assigned(waiting).await,
                vec![],
                "{waiting} while shard-a serves all"
            );
        }
    }

    // Its Lease taken over (the shard is dead): its ranges go without its word.
    set_lease_holder(&t.leases(), "shard-a", "shardlease-controller").await;
    let two = assign_uids(&Ring::with_tokens(
        ["shard-b", "shard-c"],
        RANGE_TOKENS_PER_SHARD,
    ));
    for shard in ["shard-b", "shard-c"] {
        t.wait_assigned(shard, &two[shard], "the dead shard's ranges handed out")
            .await;
    }
}

#[tokio::test]
async fn a_namespace_keyed_ring_spreads_alike_named_namespaces_over_every_shard() {
    use k8s_openapi::api::core::v1::Namespace;
    use sharder_common::ranges::{ShardSelector, assign_namespaces, fnv1a64};

    let mut t = Test::new("range-ns").await;
    t.create_ring().await;
    // Twelve namespaces named alike, which FNV-1a hashes close together, selected by a label.
    let namespaces: Vec<String> = (0..12).map(|i| format!("{}-team-{i:02}", t.ns)).collect();
    let api = Api::<Namespace>::all(t.client.clone());
    for name in &namespaces {
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(name.clone());
        namespace.metadata.labels = Some([("range-test".to_owned(), t.ns.clone())].into());
        api.create(&Default::default(), &namespace)
            .await
            .expect("namespace");
    }
    let patch = json!({
        "metadata": {"annotations": {RANGE_KEY_ANNOTATION: "namespace"}},
        "spec": {"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": null,
            "range-test": t.ns,
        }}},
    });
    t.rings()
        .patch(&t.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("ring");
    let shards = ["shard-a", "shard-b", "shard-c"];
    for shard in shards {
        t.add_shard_lease(shard, 3600).await;
    }
    t.start_reconciler().await;

    let expected = assign_namespaces(
        &Ring::with_tokens(shards, RANGE_TOKENS_PER_SHARD),
        namespaces.iter().map(String::as_str),
    );
    for shard in shards {
        t.wait_assigned(
            shard,
            &expected[shard],
            "each shard assigned its namespaces' ranges",
        )
        .await;
    }
    let mut held = std::collections::BTreeMap::new();
    for name in &namespaces {
        for shard in shards {
            let ranges = t.assigned(shard).await;
            if ShardSelector::new(RangeKey::Namespace, ranges).contains(fnv1a64(name.as_bytes())) {
                *held.entry(shard).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(
        held.values().sum::<usize>(),
        namespaces.len(),
        "each namespace on one shard"
    );
    // By rank on the ring of 16 tokens a shard, not by hash: every shard holds some, none
    // half (the even boundaries of the hash space put such names on one or two shards).
    assert!(
        held.len() == 3 && held.values().all(|n| *n < 6),
        "twelve namespaces over three shards: {held:?}"
    );
    for name in &namespaces {
        let _ = api.delete(name, &Default::default()).await;
    }
}

#[tokio::test]
async fn the_uid_key_on_a_ring_with_children_is_refused_on_the_ring() {
    let mut t = Test::new("range-uid").await;
    t.create_ring().await;
    t.add_shard_lease("shard-a", 3600).await;
    t.to_range_mode("uid", false).await;
    t.start_reconciler().await;
    t.ready_until("the ring refused", |status, reason, message| {
        status == "False" && reason == "InvalidSpec" && message.contains("uid would hash children")
    })
    .await;
    // The Event follows the status.
    eventually("a Warning Event InvalidSpec", WAIT, || async {
        t.ring_event("Warning", "InvalidSpec")
            .await
            .then_some(())
            .ok_or("none yet")
    })
    .await;
    assert_eq!(t.assigned("shard-a").await, vec![]);
}

#[tokio::test]
async fn without_the_gate_no_range_is_handed_out_and_the_ring_says_why() {
    let cp = ControlPlane::dedicated(Options {
        without_sharded_list_and_watch: true,
        ..Options::default()
    })
    .await
    .expect("control plane");
    let mut t = Test::on(cp, "range-off").await;
    t.create_ring().await;
    t.add_shard_lease("shard-a", 3600).await;
    t.to_range_mode("namespace", false).await;
    t.start_reconciler().await;
    t.ready_until("the ring says the gate is off", |status, reason, _| {
        status == "False" && reason == "ShardedListAndWatchOff"
    })
    .await;
    assert!(t.ring_event("Warning", "ShardedListAndWatchOff").await);
    let lease = t.leases().get("shard-a").await.expect("lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(ASSIGNED_ANNOTATION),
        None,
        "{annotations:?}"
    );
}
