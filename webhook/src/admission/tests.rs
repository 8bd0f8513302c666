//! Table tests of the pure admission path: review bytes in, decision and response bytes out.

use serde_json::{Value, json};
use sharder_common::{ClusterRingSpec, GroupResource, OwnerState, RingResource};

use super::*;

const RING: &str = "example";
const SHARD_LABEL: &str = "shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example";
const DRAIN_LABEL: &str = "drain.alpha.sharding.timebertt.dev/clusterring-50d858e0-example";

fn spec() -> ClusterRingSpec {
    ClusterRingSpec {
        resources: vec![
            RingResource {
                group: String::new(),
                resource: "secrets".into(),
                controlled_resources: vec![GroupResource::new("", "configmaps")],
            },
            RingResource {
                group: "example.com".into(),
                resource: "themes".into(),
                controlled_resources: vec![],
            },
        ],
        namespace_selector: None,
    }
}

fn snapshot(shards: &[&str]) -> RingSnapshot {
    RingSnapshot::new(&RingId::cluster_ring(RING), &spec(), shards.iter().copied())
}

struct Req {
    group: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespace: Option<&'static str>,
    name: &'static str,
    object: Value,
    sub_resource: Option<&'static str>,
}

fn secret(name: &'static str, object: Value) -> Req {
    Req {
        group: "",
        resource: "secrets",
        kind: "Secret",
        namespace: Some("default"),
        name,
        object,
        sub_resource: None,
    }
}

fn configmap(object: Value) -> Req {
    Req {
        group: "",
        resource: "configmaps",
        kind: "ConfigMap",
        namespace: Some("default"),
        name: "child",
        object,
        sub_resource: None,
    }
}

fn body(req: &Req) -> Vec<u8> {
    let version = if req.group.is_empty() {
        "v1"
    } else {
        "v1alpha1"
    };
    let mut request = json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": req.group, "version": version, "kind": req.kind},
        "resource": {"group": req.group, "version": version, "resource": req.resource},
        "name": req.name,
        "operation": "CREATE",
        "userInfo": {"username": "admin"},
        "object": req.object,
        "dryRun": false,
    });
    if let Some(ns) = req.namespace {
        request["namespace"] = json!(ns);
    }
    if let Some(sub) = req.sub_resource {
        request["subResource"] = json!(sub);
    }
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    }))
    .expect("serializable")
}

fn object(kind: &str, metadata: Value) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": metadata})
}

/// Runs the pure path and returns the decision, the response JSON, and the object after
/// applying the response's patch. Owners of controlled objects count as not sharded (their
/// children follow the ring alone); [`run_with_owner`] gives their state.
fn run(req: &Req, ring: Option<&RingSnapshot>) -> (Decision, Value, Value) {
    run_with_owner(req, ring, &OwnerState::NotSharded)
}

fn run_with_owner(
    req: &Req,
    ring: Option<&RingSnapshot>,
    owner: &OwnerState,
) -> (Decision, Value, Value) {
    let (_, decision, response) = review(&body(req), ring, owner).expect("valid review");
    let response: Value = serde_json::from_slice(&response).expect("json response");
    let mut patched = req.object.clone();
    if let Some(patch) = response["response"].get("patch") {
        // Go's []byte as the apiserver reads it: a base64 string.
        let bytes: ByteString = serde_json::from_value(patch.clone()).expect("base64 patch");
        let ops: Patch = serde_json::from_slice(&bytes.0).expect("patch json");
        json_patch::patch(&mut patched, &ops).expect("patch applies");
        assert_eq!(response["response"]["patchType"], "JSONPatch");
    }
    assert_eq!(response["response"]["allowed"], true, "never denies");
    assert_eq!(
        response["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    (decision, response, patched)
}

fn shard_of(patched: &Value) -> Option<&str> {
    patched["metadata"]["labels"][SHARD_LABEL].as_str()
}

#[test]
fn object_without_labels_gets_labels_and_the_rings_shard() {
    let ring = snapshot(&["shard-a", "shard-b", "shard-c"]);
    let req = secret(
        "foo",
        object("Secret", json!({"name": "foo", "namespace": "default"})),
    );
    let (decision, _, patched) = run(&req, Some(&ring));
    let want = ring.ring.shard_for("/Secret/default/foo").expect("shard");
    assert_eq!(shard_of(&patched), Some(want));
    match decision {
        Decision::Assign { key, shard, patch } => {
            assert_eq!(key.as_str(), "/Secret/default/foo");
            assert_eq!(shard, want);
            assert_eq!(patch.0.len(), 2, "add labels map, then the label");
        }
        other => panic!("expected an assignment, got {other:?}"),
    }
}

#[test]
fn existing_labels_are_kept_and_the_key_is_escaped() {
    let ring = snapshot(&["shard-a", "shard-b"]);
    let req = secret(
        "foo",
        object(
            "Secret",
            json!({"name": "foo", "namespace": "default", "labels": {"app": "web", "a~b/c": "x"}}),
        ),
    );
    let (decision, _, patched) = run(&req, Some(&ring));
    let Decision::Assign { patch, .. } = decision else {
        panic!("expected an assignment");
    };
    assert_eq!(patch.0.len(), 1, "labels exist: one add");
    let PatchOperation::Add(add) = &patch.0[0] else {
        panic!("expected an add");
    };
    assert_eq!(
        add.path.as_str(),
        "/metadata/labels/shard.alpha.sharding.timebertt.dev~1clusterring-50d858e0-example"
    );
    let labels = &patched["metadata"]["labels"];
    assert_eq!(labels["app"], "web");
    assert_eq!(labels["a~b/c"], "x");
    assert!(shard_of(&patched).is_some());
}

#[test]
fn pointer_tokens_escape_tilde_before_slash() {
    let table = [
        ("plain", "/metadata/labels/plain"),
        ("a/b", "/metadata/labels/a~1b"),
        ("a~b", "/metadata/labels/a~0b"),
        ("~/", "/metadata/labels/~0~1"),
        ("~1", "/metadata/labels/~01"),
    ];
    for (token, want) in table {
        assert_eq!(labels_pointer(Some(token)).as_str(), want, "{token}");
    }
    assert_eq!(labels_pointer(None).as_str(), "/metadata/labels");
}

#[test]
fn already_labelled_object_is_allowed_without_patch() {
    let ring = snapshot(&["shard-a"]);
    let req = secret(
        "foo",
        object(
            "Secret",
            json!({"name": "foo", "namespace": "default", "labels": {SHARD_LABEL: "shard-z"}}),
        ),
    );
    let (decision, response, patched) = run(&req, Some(&ring));
    assert_eq!(decision, Decision::AlreadyAssigned);
    assert!(response["response"].get("patch").is_none());
    assert_eq!(shard_of(&patched), Some("shard-z"), "label untouched");
}

#[test]
fn a_leftover_drain_label_is_removed_with_the_assignment() {
    let ring = snapshot(&["shard-a"]);
    let req = secret(
        "foo",
        object(
            "Secret",
            json!({"name": "foo", "namespace": "default", "labels": {DRAIN_LABEL: "true"}}),
        ),
    );
    let (_, _, patched) = run(&req, Some(&ring));
    assert_eq!(shard_of(&patched), Some("shard-a"));
    assert!(patched["metadata"]["labels"].get(DRAIN_LABEL).is_none());
}

#[test]
fn controlled_object_lands_on_its_owners_shard() {
    let ring = snapshot(&["shard-a", "shard-b", "shard-c", "shard-d"]);
    for owner in ["s1", "s2", "s3", "s4", "s5", "s6"] {
        let child = configmap(object(
            "ConfigMap",
            json!({"name": "child", "namespace": "default", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Secret", "name": owner, "uid": "u", "controller": true}
            ]}),
        ));
        let (_, _, patched) = run(&child, Some(&ring));
        let owner_key = format!("/Secret/default/{owner}");
        assert_eq!(
            shard_of(&patched),
            ring.ring.shard_for(&owner_key),
            "owner {owner}"
        );
    }
}

fn child_of(owner: &str) -> Req {
    configmap(object(
        "ConfigMap",
        json!({"name": "child", "namespace": "default", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Secret", "name": owner, "uid": "u", "controller": true}
        ]}),
    ))
}

#[test]
fn a_controlled_object_needs_its_owners_state_to_be_decided() {
    let ring = snapshot(&["shard-a", "shard-b"]);
    let request = parse(&body(&child_of("s1"))).expect("valid");
    match decide(&request, Some(&ring)) {
        Decision::FollowOwner { key, owner } => {
            assert_eq!(key.as_str(), "/Secret/default/s1");
            assert_eq!(
                owner,
                OwnerRef {
                    api_version: "v1".into(),
                    kind: "Secret".into(),
                    namespace: Some("default".into()),
                    name: "s1".into(),
                }
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_new_child_goes_where_its_owner_is_held_now_never_ahead_of_it() {
    let ring = snapshot(&["shard-a", "shard-b", "shard-c"]);
    let desired = ring
        .ring
        .shard_for("/Secret/default/s1")
        .expect("shard")
        .to_owned();
    let other = ["shard-a", "shard-b", "shard-c"]
        .into_iter()
        .find(|s| *s != desired)
        .expect("another shard");
    let table = [
        // The owner drains off `other` (the ring now picks `desired`): `other` still holds it.
        (OwnerState::Draining(other.into()), Some(other)),
        (OwnerState::Settled(other.into()), Some(other)),
        (OwnerState::Settled(desired.clone()), Some(desired.as_str())),
        // Its holder is dead: the owner moves to the ring's choice directly, so does the child.
        (OwnerState::Settled("gone".into()), Some(desired.as_str())),
        // No shard holds the owner: the child is left to the reconciler's sweep.
        (OwnerState::Unassigned, None),
        (OwnerState::Missing, None),
    ];
    for (owner, want) in table {
        let (decision, response, patched) = run_with_owner(&child_of("s1"), Some(&ring), &owner);
        assert_eq!(shard_of(&patched), want, "{owner:?}");
        if want.is_none() {
            assert!(
                matches!(
                    decision,
                    Decision::Skip {
                        reason: SkipReason::OwnerNotHeld,
                        ..
                    }
                ),
                "{owner:?}: {decision:?}"
            );
            assert!(response["response"].get("patch").is_none());
        }
    }
}

#[test]
fn a_ring_keyed_by_namespace_gives_each_object_its_namespaces_shard_and_children_their_owners_holder()
 {
    let shards = ["shard-a", "shard-b", "shard-c"];
    let ring = snapshot(&shards).keyed_by(Keying::Namespace);
    let desired = ring.ring.shard_for("/Namespace//default").expect("shard");
    let other = shards.into_iter().find(|s| *s != desired).expect("another");
    let orphan = configmap(object(
        "ConfigMap",
        json!({"name": "c", "namespace": "default"}),
    ));
    let malformed = configmap(object(
        "ConfigMap",
        json!({"name": "c", "namespace": "default", "ownerReferences": [
            {"apiVersion": "a/b/c", "kind": "Secret", "name": "s", "uid": "u", "controller": true}
        ]}),
    ));
    // (what, request, its owner's holder, the shard it gets)
    let table = [
        (
            "a main object",
            secret(
                "foo",
                object("Secret", json!({"name": "foo", "namespace": "default"})),
            ),
            None,
            desired,
        ),
        (
            "a main object without a name yet",
            secret(
                "",
                object(
                    "Secret",
                    json!({"generateName": "foo-", "namespace": "default"}),
                ),
            ),
            None,
            desired,
        ),
        ("a child without a controller", orphan, None, desired),
        (
            "a child with a malformed controller",
            malformed,
            None,
            desired,
        ),
        (
            "a child whose owner is held elsewhere (draining)",
            child_of("s1"),
            Some(OwnerState::Draining(other.into())),
            other,
        ),
        (
            "a child whose owner is settled",
            child_of("s1"),
            Some(OwnerState::Settled(desired.into())),
            desired,
        ),
    ];
    for (what, req, owner, want) in table {
        let request = parse(&body(&req)).expect("valid");
        let follows = matches!(decide(&request, Some(&ring)), Decision::FollowOwner { .. });
        assert_eq!(follows, owner.is_some(), "{what}: reads its owner");
        let owner = owner.unwrap_or(OwnerState::Missing);
        let (_, _, patched) = run_with_owner(&req, Some(&ring), &owner);
        assert_eq!(shard_of(&patched), Some(want), "{what}");
    }
}

#[test]
fn objects_that_cannot_be_keyed_are_allowed_unassigned() {
    let ring = snapshot(&["shard-a"]);
    let table = [
        (
            "generateName main object",
            secret(
                "",
                object(
                    "Secret",
                    json!({"generateName": "s-", "namespace": "default"}),
                ),
            ),
            SkipReason::NoName,
        ),
        (
            "controlled object without owner",
            configmap(object(
                "ConfigMap",
                json!({"name": "child", "namespace": "default"}),
            )),
            SkipReason::NoControllerReference,
        ),
        (
            "controlled object with a non-controller owner",
            configmap(object(
                "ConfigMap",
                json!({"name": "child", "namespace": "default", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u"}
                ]}),
            )),
            SkipReason::NoControllerReference,
        ),
        (
            "controlled object with a malformed controller",
            configmap(object(
                "ConfigMap",
                json!({"name": "child", "namespace": "default", "ownerReferences": [
                    {"apiVersion": "a/b/c", "kind": "Secret", "name": "s", "uid": "u", "controller": true}
                ]}),
            )),
            SkipReason::MalformedOwnerReference,
        ),
        (
            "resource the ring does not shard",
            Req {
                resource: "services",
                kind: "Service",
                ..secret("svc", object("Service", json!({"name": "svc"})))
            },
            SkipReason::ResourceNotSharded,
        ),
        (
            "subresource",
            Req {
                sub_resource: Some("status"),
                ..secret("foo", object("Secret", json!({"name": "foo"})))
            },
            SkipReason::ResourceNotSharded,
        ),
    ];
    for (what, req, want) in table {
        let (decision, response, patched) = run(&req, Some(&ring));
        match decision {
            Decision::Skip { reason, .. } => assert_eq!(reason, want, "{what}"),
            other => panic!("{what}: expected a skip, got {other:?}"),
        }
        assert!(response["response"].get("patch").is_none(), "{what}");
        assert_eq!(patched, req.object, "{what}: object unchanged");
    }
}

#[test]
fn malformed_controller_reference_is_reported_as_a_warning() {
    let ring = snapshot(&["shard-a"]);
    let req = configmap(object(
        "ConfigMap",
        json!({"name": "child", "namespace": "default", "ownerReferences": [
            {"apiVersion": "", "kind": "Secret", "name": "s", "uid": "u", "controller": true}
        ]}),
    ));
    let (_, response, _) = run(&req, Some(&ring));
    let warning = response["response"]["warnings"][0]
        .as_str()
        .expect("warning");
    assert!(warning.contains("apiVersion"), "{warning}");
}

#[test]
fn unknown_ring_and_empty_ring_allow_without_patch() {
    let req = secret(
        "foo",
        object("Secret", json!({"name": "foo", "namespace": "default"})),
    );
    let (decision, _, patched) = run(&req, None);
    assert!(matches!(
        decision,
        Decision::Skip {
            reason: SkipReason::UnknownRing,
            ..
        }
    ));
    assert_eq!(patched, req.object);

    let empty = snapshot(&[]);
    let (decision, _, patched) = run(&req, Some(&empty));
    assert!(matches!(
        decision,
        Decision::Skip {
            reason: SkipReason::NoShardAvailable,
            ..
        }
    ));
    assert_eq!(patched, req.object);
}

#[test]
fn cluster_scoped_objects_are_keyed_with_an_empty_namespace() {
    let ring = snapshot(&["shard-a", "shard-b", "shard-c"]);
    let req = Req {
        group: "example.com",
        resource: "themes",
        kind: "Theme",
        namespace: None,
        name: "dark",
        object: json!({"apiVersion": "example.com/v1alpha1", "kind": "Theme", "metadata": {"name": "dark"}}),
        sub_resource: None,
    };
    let (decision, _, patched) = run(&req, Some(&ring));
    let Decision::Assign { key, .. } = decision else {
        panic!("expected an assignment");
    };
    assert_eq!(key.as_str(), "example.com/Theme//dark");
    assert_eq!(
        shard_of(&patched),
        ring.ring.shard_for("example.com/Theme//dark")
    );
}

#[test]
fn a_ring_listing_a_resource_as_main_and_controlled_assigns_nothing_like_the_reconciler() {
    // [secrets{controlledResources:[configmaps]}, configmaps]: invalid (common rejects it), so
    // the webhook assigns nothing, just as the reconciler moves nothing of an invalid ring.
    let spec = ClusterRingSpec {
        resources: vec![
            RingResource {
                group: String::new(),
                resource: "secrets".into(),
                controlled_resources: vec![GroupResource::new("", "configmaps")],
            },
            RingResource {
                group: String::new(),
                resource: "configmaps".into(),
                controlled_resources: vec![],
            },
        ],
        namespace_selector: None,
    };
    let ring = RingSnapshot::new(&RingId::cluster_ring(RING), &spec, ["a"]);
    assert_eq!(ring.role("", "configmaps"), None);
    assert_eq!(ring.role("", "secrets"), None);
    for req in [
        secret(
            "foo",
            object("Secret", json!({"name": "foo", "namespace": "default"})),
        ),
        configmap(object(
            "ConfigMap",
            json!({"name": "c", "namespace": "default"}),
        )),
    ] {
        let (decision, response, _) = run(&req, Some(&ring));
        match decision {
            Decision::Skip {
                reason: SkipReason::InvalidRing,
                detail,
            } => assert!(
                detail.contains("spec.resources[0].controlledResources[0]"),
                "{detail}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(response["response"].get("patch").is_none());
        assert_eq!(response["response"]["allowed"], true, "never denied");
    }
}

#[test]
fn bodies_that_are_not_reviews_are_errors_that_say_why() {
    let table: [(&[u8], &str); 4] = [
        (b"", "not an admission.k8s.io/v1 AdmissionReview"),
        (
            b"{\"kind\": 3}",
            "not an admission.k8s.io/v1 AdmissionReview",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "has no request",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":null}"#,
            "not supported",
        ),
    ];
    for (body, want) in table {
        let err = review(body, None, &OwnerState::Missing).expect_err("invalid");
        assert!(err.to_string().contains(want), "{err}");
    }
}
