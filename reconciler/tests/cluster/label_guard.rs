//! The label guard against the real apiserver: with `--label-guard on` the reconciler installs
//! the ring's ValidatingAdmissionPolicy and binding, its own drains go through, anyone else's
//! relabel is denied with a message naming the ring and the rule, a shard acknowledges its own
//! drains with its pod-bound token and not another shard's, an acknowledger given by flag
//! acknowledges any shard's, and every other update of an object is untouched; turned off, the
//! guard is deleted.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sharder_common::Ring;
use sharder_harness::wait::eventually;

use super::{Test, WAIT, wait_until_policy_deleted};

/// A merge patch setting (or, with `None`, removing) `labels` of Secret `name` with `client`.
async fn set_label(
    w: &Test,
    client: &Client,
    name: &str,
    labels: &[(&str, Option<&str>)],
) -> Result<Secret, kube::Error> {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    Api::<Secret>::namespaced(client.clone(), &w.ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": labels } })),
        )
        .await
}

/// The message of a denial (`Err` with a 403 from admission), or what came instead.
fn denial(result: Result<Secret, kube::Error>) -> Result<String, String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(s.message),
        Err(e) => Err(format!("another error: {e}")),
        Ok(_) => Err("admitted".into()),
    }
}

/// A client whose token is bound to a Pod named `pod` of ServiceAccount `account` (created with
/// the Pod, which no node runs: the token alone is what a shard's pod would hold).
async fn pod_bound_client(w: &Test, account: &str, pod: &str) -> Client {
    let pp = PostParams::default();
    let accounts = Api::<ServiceAccount>::namespaced(w.client.clone(), &w.ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match accounts.create(&pp, &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("ServiceAccount {account}: {e}"),
    }
    let created = Api::<Pod>::namespaced(w.client.clone(), &w.ns)
        .create(
            &pp,
            &Pod {
                metadata: ObjectMeta {
                    name: Some(pod.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    service_account_name: Some(account.into()),
                    containers: vec![Container {
                        name: "shard".into(),
                        image: Some("example.invalid/shard".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
                ..Pod::default()
            },
        )
        .await
        .expect("a Pod");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["https://kubernetes.default.svc".into()],
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                uid: created.metadata.uid,
            }),
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(account, &pp, &request)
        .await
        .expect("a token bound to the Pod")
        .status
        .expect("a token")
        .token;
    w.cp.client_with_token(&token).await.expect("a client")
}

/// Lets ServiceAccount `account` of the test namespace update Secrets.
async fn may_update_secrets(w: &Test, account: &str) {
    w.grant(
        &format!("{}-{account}", w.ns),
        account,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            verbs: vec!["get".into(), "patch".into(), "update".into()],
            ..PolicyRule::default()
        }],
    )
    .await;
}

#[tokio::test]
async fn only_the_protocol_s_steps_change_a_ring_s_labels_with_the_guard_on() {
    let mut w = Test::new("guard").await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    w.start_webhook().await;
    let outside = w.service_account("outside");
    w.start_reconciler_with(
        Duration::from_secs(3600),
        &[
            ("--label-guard", "on"),
            ("--label-guard-acknowledgers", &outside),
        ],
    )
    .await;
    w.wait_until_webhook_assigns().await;
    w.create_secrets(40).await;
    let two = Ring::new(["shard-a", "shard-b"]);
    eventually("settled", WAIT, || w.settled(&two)).await;
    let labels = w.id().labels();
    let (shard, drain) = (labels.shard.as_str(), labels.drain.as_str());

    // Anyone else (here even the test's admin) moving an object is denied, once the apiserver
    // has the policy; until then the probe's label goes back and forth.
    let probe = "object-0";
    let message = eventually("the guard in force", WAIT, || async {
        let now = w.shard_of(&w.secrets().get(probe).await.map_err(|e| e.to_string())?);
        let other = if now.as_deref() == Some("shard-a") {
            "shard-b"
        } else {
            "shard-a"
        };
        denial(set_label(&w, &w.client, probe, &[(shard, Some(other))]).await)
    })
    .await;
    let ring = format!("{} {}", w.id().kind.kind(), w.id().name);
    assert!(
        message.contains(&ring) && message.contains("only the sharder reconciler"),
        "{message}"
    );
    // Every other label, and an update without the ring's labels, are untouched.
    set_label(&w, &w.client, probe, &[("team", Some("blue"))])
        .await
        .expect("another label changes freely");
    // Nor may anyone else drain it. (Taking its shard away is no change: the webhook gives
    // the unassigned object its shard again in the same request.)
    let message = denial(set_label(&w, &w.client, probe, &[(drain, Some("true"))]).await)
        .expect("a drain by the admin");
    assert!(message.contains("only the sharder reconciler"), "{message}");

    // The reconciler's drains go through: a shard joins.
    w.add_shard_lease("shard-c", 3600).await;
    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let draining = eventually("the reconciler's drains", WAIT, || async {
        let objects = w.list_secrets().await;
        let draining: Vec<(String, String)> = objects
            .iter()
            .filter(|(_, s)| w.draining(*s))
            .filter_map(|(n, s)| w.shard_of(s).map(|shard| (n.clone(), shard)))
            .collect();
        // Those joining shard-c (the probe too if its relabel went through before the policy
        // was in force: then it is off its shard).
        let moving: Vec<&String> = objects
            .keys()
            .filter(|n| three.shard_for(&w.key(n)) == Some("shard-c"))
            .collect();
        let drained = |n: &&String| draining.iter().any(|(d, _)| d == *n);
        if !moving.is_empty() && moving.iter().all(drained) {
            Ok(draining)
        } else {
            Err(format!(
                "{} draining, {} moving",
                draining.len(),
                moving.len()
            ))
        }
    })
    .await;
    let on = |shard: &str| -> Vec<String> {
        draining
            .iter()
            .filter(|(_, on)| on == shard)
            .map(|(n, _)| n.clone())
            .collect()
    };
    let (on_a, on_b) = (on("shard-a"), on("shard-b"));
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "drains on both shards (the namespace's random name decides): {draining:?}"
    );

    // Shard A's pod-bound token acknowledges shard A's drain (the webhook assigns it at once),
    // not shard B's.
    may_update_secrets(&w, "shards").await;
    let shard_a = pod_bound_client(&w, "shards", "shard-a").await;
    let ack = [(shard, None), (drain, None)];
    let acknowledged = set_label(&w, &shard_a, &on_a[0], &ack)
        .await
        .expect("shard-a acknowledges its own drain");
    assert_eq!(
        w.shard_of(&acknowledged).as_deref(),
        three.shard_for(&w.key(&on_a[0])),
        "assigned by the webhook in the same request"
    );
    let message = denial(set_label(&w, &shard_a, &on_b[0], &ack).await)
        .expect("shard-a acknowledging shard-b's drain");
    assert!(
        message.contains(&ring) && message.contains("acknowledged only by its shard shard-b"),
        "{message}"
    );
    // Nor does a token of the same account that no pod is bound to.
    let unbound =
        w.cp.service_account_token(&w.ns, "shards")
            .await
            .expect("a token");
    let unbound = w.cp.client_with_token(&unbound).await.expect("a client");
    denial(set_label(&w, &unbound, &on_b[0], &ack).await).expect("an unbound token acknowledging");

    // An acknowledger given by flag acknowledges any shard's drain.
    may_update_secrets(&w, "outside").await;
    let outside =
        w.cp.service_account_token(&w.ns, "outside")
            .await
            .expect("a token");
    let outside = w.cp.client_with_token(&outside).await.expect("a client");
    let acknowledged = set_label(&w, &outside, &on_b[0], &ack)
        .await
        .expect("the acknowledger acknowledges shard-b's drain");
    assert_eq!(
        w.shard_of(&acknowledged).as_deref(),
        three.shard_for(&w.key(&on_b[0]))
    );

    // Turned off, the guard goes: the policy and its binding are deleted, and the admin's
    // relabel goes through.
    w.reconcilers[0].process.stop(Duration::from_secs(20));
    w.start_reconciler_with(Duration::from_secs(3600), &[("--label-guard", "off")])
        .await;
    let name = w.id().configuration_name();
    let policies = Api::<ValidatingAdmissionPolicy>::all(w.client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(w.client.clone());
    wait_until_policy_deleted("the guard deleted", &policies, &bindings, &name).await;
    eventually("a relabel admitted", WAIT, || async {
        set_label(&w, &w.client, &on_b[0], &[(shard, Some("shard-a"))])
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
}
