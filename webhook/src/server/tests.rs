//! In-process HTTP tests of the webhook's routes (`tower::ServiceExt::oneshot`).

use axum::body::Body;
use axum::http::{Method, Request};
use http_body_util::BodyExt;
use k8s_openapi::ByteString;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use sharder_common::{ClusterRingSpec, GroupResource, OwnerState, RingResource};
use sharder_runtime::metrics::RingLabel;
use tower::ServiceExt;

use super::*;
use crate::admission::RingSnapshot;

/// Owners of one known state (or a failing read).
struct FixedOwners(Result<OwnerState, String>);

impl Owners for FixedOwners {
    fn state<'a>(
        &'a self,
        _: &'a RingSnapshot,
        _: &'a crate::admission::OwnerRef,
    ) -> futures::future::BoxFuture<'a, Result<OwnerState, String>> {
        Box::pin(async move { self.0.clone() })
    }
}

fn app(limits: Limits) -> (Router, Metrics) {
    app_with_owners(limits, Ok(OwnerState::NotSharded))
}

fn app_with_owners(limits: Limits, owners: Result<OwnerState, String>) -> (Router, Metrics) {
    let rings = Arc::new(Rings::default());
    let spec = ClusterRingSpec {
        resources: vec![RingResource {
            group: String::new(),
            resource: "secrets".into(),
            controlled_resources: vec![GroupResource::new("", "configmaps")],
        }],
        namespace_selector: None,
    };
    rings.publish(
        [
            RingId::cluster_ring("example"),
            RingId::controller_ring("example"),
        ]
        .into_iter()
        .map(|ring| {
            let snapshot = RingSnapshot::new(&ring, &spec, ["shard-a", "shard-b"]);
            (ring, Arc::new(snapshot))
        })
        .collect(),
    );
    let metrics = Metrics::new(&mut Registry::default());
    let owners = Arc::new(FixedOwners(owners));
    (router(rings, owners, metrics.clone(), limits), metrics)
}

fn child_review() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-2",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": "child",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {},
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": "child", "namespace": "default",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": "u", "controller": true}]
            }},
            "dryRun": false,
        }
    }))
    .expect("json")
}

#[tokio::test]
async fn a_child_is_labelled_with_the_shard_its_owner_is_held_by() {
    let (app, metrics) = app_with_owners(
        Limits::default(),
        Ok(OwnerState::Draining("shard-b".into())),
    );
    let (status, body) = call(app, Method::POST, PATH, child_review()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"patch\""), "{body}");
    let lookups = |result| {
        metrics
            .owner_lookups
            .get_or_create(&OwnerLabels { result })
            .get()
    };
    assert_eq!(lookups("draining"), 1);
    let labels = ResourceLabels {
        ring: RingLabel::new(&RingId::cluster_ring("example")),
        group: String::new(),
        resource: "configmaps".into(),
    };
    assert_eq!(metrics.assignments.get_or_create(&labels).get(), 1);
}

#[tokio::test]
async fn a_child_whose_owner_cannot_be_read_is_left_to_the_reconciler() {
    let (app, metrics) = app_with_owners(Limits::default(), Err("timeout".into()));
    let (status, body) = call(app, Method::POST, PATH, child_review()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains("\"patch\""), "{body}");
    assert!(body.contains("\"allowed\":true"), "never denied: {body}");
    let skipped = SkipLabels {
        ring: RingLabel::new(&RingId::cluster_ring("example")),
        reason: "owner_unknown".into(),
    };
    assert_eq!(metrics.not_assigned.get_or_create(&skipped).get(), 1);
    assert_eq!(
        metrics
            .owner_lookups
            .get_or_create(&OwnerLabels { result: "error" })
            .get(),
        1
    );
}

fn review(dry_run: bool) -> Vec<u8> {
    sharder_harness::fixtures::secret_create_review("foo", "default", &[], dry_run)
}

async fn call(app: Router, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, String) {
    let response = app
        .oneshot(
            Request::builder()
                .method(method)
                .uri(path)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("request"),
        )
        .await
        .expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

const PATH: &str = "/webhooks/sharder/clusterring/example";

#[tokio::test]
async fn a_review_gets_200_with_a_patch_and_is_counted() {
    let (app, metrics) = app(Limits::default());
    let (status, body) = call(app, Method::POST, PATH, review(false)).await;
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(
        response["response"]["uid"],
        sharder_harness::fixtures::REVIEW_UID
    );
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(response["response"]["patchType"], "JSONPatch");
    let labels = ResourceLabels {
        ring: RingLabel::new(&RingId::cluster_ring("example")),
        group: String::new(),
        resource: "secrets".into(),
    };
    assert_eq!(metrics.assignments.get_or_create(&labels).get(), 1);
}

#[tokio::test]
async fn dry_run_reviews_are_assigned_but_not_counted() {
    let (app, metrics) = app(Limits::default());
    let (status, body) = call(app, Method::POST, PATH, review(true)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"patch\""), "{body}");
    let labels = ResourceLabels {
        ring: RingLabel::new(&RingId::cluster_ring("example")),
        group: String::new(),
        resource: "secrets".into(),
    };
    assert_eq!(metrics.assignments.get_or_create(&labels).get(), 0);
}

#[tokio::test]
async fn an_unknown_ring_is_allowed_without_patch_and_counted_by_reason() {
    let (app, metrics) = app(Limits::default());
    let (status, body) = call(
        app,
        Method::POST,
        "/webhooks/sharder/clusterring/nope",
        review(false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none());
    let labels = SkipLabels {
        ring: RingLabel::new(&RingId::cluster_ring("nope")),
        reason: "unknown_ring".into(),
    };
    assert_eq!(metrics.not_assigned.get_or_create(&labels).get(), 1);
}

#[tokio::test]
async fn a_body_that_is_not_a_review_gets_400_saying_why() {
    let (app, _) = app(Limits::default());
    let (status, body) = call(app, Method::POST, PATH, b"{\"hello\": 1}".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.starts_with("body is not an admission.k8s.io/v1 AdmissionReview"),
        "{body}"
    );
}

#[tokio::test]
async fn other_methods_get_405_and_other_paths_404() {
    let (app, _) = app(Limits::default());
    assert_eq!(
        call(app.clone(), Method::GET, PATH, vec![]).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        call(app.clone(), Method::PUT, PATH, review(false)).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let (status, body) = call(app.clone(), Method::POST, "/webhooks/other", review(false)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("/webhooks/sharder/clusterring/<ring>"),
        "{body}"
    );
    for path in [
        "/webhooks/sharder/clusterring/",
        "/webhooks/sharder/otherring/example",
    ] {
        assert_eq!(
            call(app.clone(), Method::POST, path, review(false)).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_controller_ring_gets_its_own_label_key_and_metric_label() {
    let (app, metrics) = app(Limits::default());
    let (status, body) = call(
        app,
        Method::POST,
        "/webhooks/sharder/controllerring/example",
        review(false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_str(&body).expect("json");
    // The apiserver reads the patch bytes as Go's []byte: base64.
    let patch: ByteString =
        serde_json::from_value(response["response"]["patch"].clone()).expect("a base64 patch");
    let patch = String::from_utf8(patch.0).expect("utf-8");
    assert!(
        patch.contains("/metadata/labels/shard.alpha.sharding.timebertt.dev~1example"),
        "{patch}"
    );
    let labels = ResourceLabels {
        ring: RingLabel::new(&RingId::controller_ring("example")),
        group: String::new(),
        resource: "secrets".into(),
    };
    assert_eq!(metrics.assignments.get_or_create(&labels).get(), 1);
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let (app, _) = app(Limits {
        max_body_bytes: 1024,
        ..Limits::default()
    });
    let (status, _) = call(app.clone(), Method::POST, PATH, vec![b' '; 2048]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // A review under the limit still passes.
    assert_eq!(
        call(app, Method::POST, PATH, review(false)).await.0,
        StatusCode::OK
    );
}

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("apiVersion".to_owned()),
                        Just("kind".to_owned()),
                        Just("request".to_owned()),
                        Just("object".to_owned()),
                        Just("metadata".to_owned()),
                        Just("labels".to_owned()),
                        Just("ownerReferences".to_owned()),
                        ".{0,8}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A valid review with one field replaced by arbitrary JSON.
    fn mutated_review() -> impl Strategy<Value = Vec<u8>> {
        let fields = prop_oneof![
            Just("/request/uid"),
            Just("/request/kind"),
            Just("/request/resource"),
            Just("/request/name"),
            Just("/request/namespace"),
            Just("/request/operation"),
            Just("/request/object"),
            Just("/request/object/metadata"),
            Just("/request/object/metadata/labels"),
            Just("/request/object/metadata/ownerReferences"),
            Just("/request/dryRun"),
            Just("/apiVersion"),
        ];
        (fields, arbitrary_json()).prop_map(|(field, value)| {
            let mut review: Value = serde_json::from_slice(&review(false)).expect("json");
            if let Some(slot) = review.pointer_mut(field) {
                *slot = value;
            }
            serde_json::to_vec(&review).expect("json")
        })
    }

    fn status_of(body: Vec<u8>, path: &str) -> StatusCode {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (app, _) = app(Limits {
            max_body_bytes: 4096,
            ..Limits::default()
        });
        runtime.block_on(call(app, Method::POST, path, body)).0
    }

    const ANSWERS: [StatusCode; 3] = [
        StatusCode::OK,
        StatusCode::BAD_REQUEST,
        StatusCode::PAYLOAD_TOO_LARGE,
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic_and_get_a_documented_answer(
            body in proptest::collection::vec(any::<u8>(), 0..6000),
        ) {
            let status = status_of(body, PATH);
            prop_assert!(ANSWERS.contains(&status), "{}", status);
        }

        #[test]
        fn arbitrary_json_never_panics_and_gets_a_documented_answer(value in arbitrary_json()) {
            let status = status_of(serde_json::to_vec(&value).expect("json"), PATH);
            prop_assert!(ANSWERS.contains(&status), "{}", status);
        }

        #[test]
        fn mutated_reviews_are_answered_or_rejected_never_denied(body in mutated_review()) {
            let status = status_of(body.clone(), PATH);
            prop_assert!(ANSWERS.contains(&status), "{}", status);
            if status == StatusCode::OK {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                let (app, _) = app(Limits::default());
                let (_, text) = runtime.block_on(call(app, Method::POST, PATH, body));
                let response: Value = serde_json::from_str(&text).expect("json");
                prop_assert_eq!(&response["response"]["allowed"], &json!(true));
            }
        }
    }
}
