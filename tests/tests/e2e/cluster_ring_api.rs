//! The ring APIs and shard Leases on a real kube-apiserver: the generated CRDs install and are
//! served with their status subresource and printer columns (a ControllerRing's name is at most
//! 63 characters); shard Leases are found by the ring label selector and their states computed by
//! `common` from what the apiserver returns.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use sharder_common::RingKind;
use sharder_common::{ClusterRing, ClusterRingStatus, ShardState, shard_state};
use sharder_harness::ControlPlane;
use sharder_harness::crd::install_ring_crds;
use sharder_harness::fixtures::secrets_ring;

async fn client() -> Client {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.expect("client");
    install_ring_crds(&client).await.expect("CRD");
    client
}

fn ring(name: &str) -> ClusterRing {
    secrets_ring(name, None)
}

#[tokio::test]
async fn cluster_ring_round_trips_through_the_apiserver() {
    let api = Api::<ClusterRing>::all(client().await);
    let created = api
        .create(&PostParams::default(), &ring("round-trip"))
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    let read = api.get("round-trip").await.expect("get");
    assert_eq!(read.spec, ring("round-trip").spec);
    assert!(read.metadata.namespace.is_none(), "cluster-scoped");
    assert_eq!(
        read.spec.resources[0].controlled_resources[0].resource,
        "configmaps"
    );
}

#[tokio::test]
async fn status_is_a_subresource() {
    let api = Api::<ClusterRing>::all(client().await);
    api.create(&PostParams::default(), &ring("status-sub"))
        .await
        .expect("create");

    // A status written through the main resource is dropped by the apiserver.
    let with_status = json!({"status": {"shards": 9}});
    api.patch(
        "status-sub",
        &PatchParams::default(),
        &Patch::Merge(&with_status),
    )
    .await
    .expect("merge patch");
    assert_eq!(api.get("status-sub").await.expect("get").status, None);

    // Through the status subresource it sticks, without bumping the generation.
    let status = ClusterRingStatus {
        observed_generation: Some(1),
        shards: Some(3),
        available_shards: Some(2),
        conditions: vec![ready_condition()],
    };
    api.patch_status(
        "status-sub",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await
    .expect("status patch");
    let read = api.get("status-sub").await.expect("get");
    assert_eq!(read.status, Some(status));
    assert_eq!(read.metadata.generation, Some(1));
}

fn ready_condition() -> Condition {
    Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "ShardsAvailable".into(),
        message: "2 of 3 shards available".into(),
        last_transition_time: Time(Timestamp::from_second(1_700_000_000).expect("valid")),
        observed_generation: Some(1),
    }
}

#[tokio::test]
async fn printer_columns_are_served_as_a_table() {
    let client = client().await;
    let api = Api::<ClusterRing>::all(client.clone());
    api.create(&PostParams::default(), &ring("table"))
        .await
        .expect("create");
    let status =
        json!({"status": {"shards": 3, "availableShards": 2, "conditions": [ready_condition()]}});
    api.patch_status("table", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status patch");

    let request = http::Request::get("/apis/sharding.timebertt.dev/v1alpha1/clusterrings/table")
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .expect("request");
    let table: Value =
        serde_json::from_str(&client.request_text(request).await.expect("table")).expect("json");
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(columns, ["Name", "Ready", "Available", "Shards", "Age"]);
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "table");
    assert_eq!(cells[1], "True");
    assert_eq!(cells[2], "2");
    assert_eq!(cells[3], "3");
}

#[tokio::test]
async fn a_controller_ring_is_served_like_a_cluster_ring_with_names_up_to_63_characters() {
    let client = client().await;
    let api = Api::<kube::api::DynamicObject>::all_with(
        client.clone(),
        &RingKind::ControllerRing.api_resource(),
    );
    let template = ring("ignored");
    let ring_named = |name: &str| {
        sharder_harness::fixtures::ring_object(
            &sharder_common::RingId::controller_ring(name),
            &template,
        )
    };
    let exact = "c".repeat(63);
    let created = api
        .create(&PostParams::default(), &ring_named(&exact))
        .await
        .expect("63 characters");
    assert_eq!(
        created.data["spec"],
        serde_json::to_value(&template.spec).expect("json")
    );
    match api
        .create(&PostParams::default(), &ring_named(&"c".repeat(64)))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            // The CRD's CEL rule refused it, in the reference's words.
            assert!(
                status
                    .message
                    .contains(sharder_common::cluster_ring::NAME_LENGTH_MESSAGE),
                "{}",
                status.message
            );
        }
        other => panic!("a 64-character ControllerRing was accepted: {other:?}"),
    }
    let status = json!({"status": {"shards": 2, "availableShards": 1}});
    api.patch_status(&exact, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the status subresource");
    let read = api.get(&exact).await.expect("get");
    assert_eq!(read.data["status"]["availableShards"], 1);
}

#[tokio::test]
async fn schema_rejects_a_resource_without_a_name() {
    let api = Api::<ClusterRing>::all(client().await);
    let bad: ClusterRing = serde_json::from_value(json!({
        "apiVersion": "sharding.timebertt.dev/v1alpha1",
        "kind": "ClusterRing",
        "metadata": {"name": "bad"},
        "spec": {"resources": [{"group": "apps", "resource": ""}]}
    }))
    .expect("parses client-side");
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("spec.resources[0].resource")
                    && status.message.contains("at least 1 chars long"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
}

fn shard_lease(namespace: &str, name: &str, ring: Option<&str>, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: ring.map(|r| {
                BTreeMap::from([(RingKind::ClusterRing.lease_label().to_owned(), r.to_owned())])
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

#[tokio::test]
async fn shard_leases_are_listed_by_the_ring_label_selector() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let ns = cp.namespace("leases").await.expect("namespace");
    let api = Api::<Lease>::namespaced(client, &ns);
    // Microsecond precision, as Lease times have on the wire.
    let now = Timestamp::from_microsecond(Timestamp::now().as_microsecond()).expect("valid");
    let pp = PostParams::default();
    for (name, ring) in [
        ("shard-a", Some("example")),
        ("shard-b", Some("example")),
        ("shard-c", Some("example")),
        ("other-ring", Some("other")),
        ("plain-leader-election", None),
    ] {
        api.create(&pp, &shard_lease(&ns, name, ring, now))
            .await
            .expect("create lease");
    }

    let names = |leases: Vec<Lease>| {
        let mut names: Vec<String> = leases.iter().map(ResourceExt::name_any).collect();
        names.sort();
        names
    };
    let of_example = api
        .list(
            &ListParams::default()
                .labels(&sharder_common::RingId::cluster_ring("example").lease_selector()),
        )
        .await
        .expect("list");
    assert_eq!(
        names(of_example.items.clone()),
        ["shard-a", "shard-b", "shard-c"]
    );
    let any_ring = api
        .list(&ListParams::default().labels(RingKind::ClusterRing.lease_label()))
        .await
        .expect("list");
    assert_eq!(
        names(any_ring.items),
        ["other-ring", "shard-a", "shard-b", "shard-c"]
    );

    // The times survive the round trip with microsecond precision, so `common` sees a fresh
    // lease as ready and knows it changes exactly at renewTime + 15 s.
    for lease in of_example.items {
        let status = shard_state(&lease, Timestamp::now());
        assert_eq!(status.state, ShardState::Ready, "{}", lease.name_any());
        let renew = lease.spec.and_then(|s| s.renew_time).expect("renewTime").0;
        assert_eq!(renew, now);
        assert_eq!(
            status.next_change,
            Some(renew + k8s_openapi::jiff::SignedDuration::from_secs(15))
        );
    }
}
