//! One MutatingWebhookConfiguration per ring: created with the ring's resources, pointing at
//! the webhook, updated when the ring changes, garbage-collected with the ring, restored when
//! deleted or edited, following the CA file; the ring's status reports its shards.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::{ClusterRing, RingId};
use sharder_harness::certs::{TestCa, der_of, served_certificate};
use sharder_harness::control_plane::NAMESPACE_NAME_LABEL;
use sharder_harness::fixtures::{secret, secrets_ring};
use sharder_harness::wait::{eventually, metric_value};
use tokio_util::sync::CancellationToken;

use crate::{Test, WAIT};

#[tokio::test]
async fn a_webhook_configuration_follows_its_ring_and_goes_with_it() {
    let mut w = Test::new("mwc").await;
    w.add_shard_lease("shard-a", 3600).await;
    w.start_webhook().await;
    w.start_reconciler().await;
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = RingId::cluster_ring(&w.ring).configuration_name();
    let resources = |mwc: &MutatingWebhookConfiguration| -> BTreeSet<String> {
        mwc.webhooks
            .iter()
            .flatten()
            .flat_map(|h| h.rules.iter().flatten())
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect()
    };
    let created = w.configuration_of("webhook configuration created").await;
    assert_eq!(
        resources(&created),
        ["configmaps".to_owned(), "secrets".to_owned()].into()
    );
    let hook = &created.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(w.webhook.as_ref().expect("webhook").url(&w.id()).as_str())
    );
    // The ring's selector (its namespace) as an expression; the tests' global selector is `{}`
    // (the default is unit-tested in `webhook_config`).
    let expressions: Vec<(String, String, Vec<String>)> = hook
        .namespace_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .map(|e| {
            (
                e.key.clone(),
                e.operator.clone(),
                e.values.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        expressions,
        [(
            NAMESPACE_NAME_LABEL.to_owned(),
            "In".to_owned(),
            vec![w.ns.clone()]
        )]
    );

    // Status reflects the shards.
    w.wait_until_ring_ready(1).await;
    let rings = Api::<ClusterRing>::all(w.client.clone());
    let status = rings.get(&w.ring).await.expect("ring").status;
    assert_eq!(status.and_then(|s| s.observed_generation), Some(1));

    // A changed ring changes its configuration.
    let patch = json!({"spec": {"resources": [
        {"group": "", "resource": "secrets", "controlledResources": [{"group": "", "resource": "configmaps"}]},
        {"group": "apps", "resource": "deployments"}
    ]}});
    rings
        .patch(&w.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("update ring");
    eventually("webhook configuration updated", WAIT, || async {
        let mwc = mwcs.get(&name).await.map_err(|e| e.to_string())?;
        resources(&mwc)
            .contains("deployments")
            .then_some(())
            .ok_or(format!("{:?}", resources(&mwc)))
    })
    .await;

    // Deleting the ring removes its configuration (owner reference, garbage collector).
    rings
        .delete(&w.ring, &DeleteParams::default())
        .await
        .expect("delete ring");
    eventually(
        "webhook configuration removed with the ring",
        Duration::from_secs(60),
        || async {
            match mwcs.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|m| m.is_some()))),
            }
        },
    )
    .await;
}

/// How many times the reconciler wrote ring `ring`'s configuration for `reason`.
fn configuration_writes(metrics: &str, ring: &str, reason: &str) -> f64 {
    metric_value(
        metrics,
        "sharder_reconciler_webhook_configuration_writes_total",
        &[("clusterring", ring), ("reason", reason)],
    )
    .unwrap_or(0.0)
}

/// Writes `contents` to `path` at once (a rename), as a volume update does.
fn replace_file(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test]
async fn a_deleted_or_edited_webhook_configuration_is_restored_and_assignment_goes_on() {
    let mut w = Test::new("drift").await;
    w.add_shard_lease("shard-a", 3600).await;
    w.start_webhook().await;
    // No sweep during the test: only the webhook can assign new objects.
    w.start_reconciler_with(Duration::from_secs(3600), &[])
        .await;
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = RingId::cluster_ring(&w.ring).configuration_name();
    let our_selector = |mwc: &MutatingWebhookConfiguration| {
        mwc.webhooks
            .as_ref()
            .and_then(|h| h[0].object_selector.clone())
    };
    let created = w.configuration_of("webhook configuration created").await;
    let wanted_selector = our_selector(&created);
    w.wait_until_webhook_assigns().await;

    // Deleted: recreated, and new objects are assigned again.
    mwcs.delete(&name, &DeleteParams::default())
        .await
        .expect("delete configuration");
    let old_uid = created.metadata.uid.clone();
    eventually("deleted configuration recreated", WAIT, || async {
        let mwc = mwcs.get_opt(&name).await.map_err(|e| e.to_string())?;
        match mwc {
            Some(m) if m.metadata.uid != old_uid => Ok(()),
            other => Err(format!("{:?}", other.map(|m| m.metadata.uid))),
        }
    })
    .await;
    w.wait_until_webhook_assigns().await;

    // Edited (an object selector no object matches, as a careless `kubectl edit` might leave
    // it): restored.
    let mut edited = mwcs.get(&name).await.expect("get");
    edited.webhooks.as_mut().expect("webhooks")[0].object_selector = Some(LabelSelector {
        match_labels: Some([("nothing".to_owned(), "matches".to_owned())].into()),
        match_expressions: None,
    });
    mwcs.replace(&name, &PostParams::default(), &edited)
        .await
        .expect("edit configuration");
    eventually("edited configuration restored", WAIT, || async {
        let mwc = mwcs.get(&name).await.map_err(|e| e.to_string())?;
        (our_selector(&mwc) == wanted_selector)
            .then_some(())
            .ok_or(format!("{:?}", our_selector(&mwc)))
    })
    .await;
    w.wait_until_webhook_assigns().await;

    // Another manager's label and a ring change that leaves the configuration as it is: no
    // write (a broken comparison would write at every event, its own included).
    let patch = json!({"metadata": {"labels": {"team": "platform"}}});
    mwcs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label configuration");
    Api::<ClusterRing>::all(w.client.clone())
        .patch(&w.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label ring");

    // Deleted once more, so the counts below include every event before.
    mwcs.delete(&name, &DeleteParams::default())
        .await
        .expect("delete configuration");
    let reconciler = &w.reconcilers[0];
    let metrics = eventually("second deletion repaired", WAIT, || async {
        let metrics = reconciler.metrics().await;
        (configuration_writes(&metrics, &w.ring, "missing") >= 3.0)
            .then_some(metrics.clone())
            .ok_or(metrics)
    })
    .await;
    assert_eq!(configuration_writes(&metrics, &w.ring, "missing"), 3.0);
    assert_eq!(configuration_writes(&metrics, &w.ring, "changed"), 1.0);
    assert_eq!(configuration_writes(&metrics, &w.ring, "ca_bundle"), 0.0);
    let restored = mwcs.get(&name).await.expect("get");
    assert_eq!(
        restored.labels().get("team"),
        None,
        "a recreated configuration has only the reconciler's labels"
    );
}

#[tokio::test]
async fn a_rotated_ca_reaches_every_configuration_without_a_failed_call() {
    let mut w = Test::new("ca-rotation").await;
    w.add_shard_lease("shard-a", 3600).await;
    let webhook = w
        .world
        .start_webhook(
            "webhook",
            &w.world.admin_env(),
            &["--tls-reload-interval", "100ms"],
        )
        .await;
    w.webhook = Some(webhook);
    w.start_reconciler_with(
        Duration::from_secs(3600),
        &[("--webhook-ca-reload-interval", "100ms")],
    )
    .await;
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = RingId::cluster_ring(&w.ring).configuration_name();
    let bundle_is = |want: String| {
        let mwcs = mwcs.clone();
        let name = name.clone();
        async move {
            eventually("caBundle updated", WAIT, || async {
                let mwc = mwcs.get_opt(&name).await.map_err(|e| e.to_string())?;
                let have = mwc
                    .and_then(|m| m.webhooks)
                    .and_then(|h| h[0].client_config.ca_bundle.clone())
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned());
                (have.as_deref() == Some(want.as_str()))
                    .then_some(())
                    .ok_or(have)
            })
            .await;
        }
    };
    let old_ca = std::fs::read_to_string(w.ca_file()).expect("ca");
    bundle_is(old_ca.clone()).await;
    w.wait_until_webhook_assigns().await;

    // Objects are created one after another for the whole rotation; each must come back
    // assigned (a failed webhook call lets it through unassigned: failurePolicy Ignore).
    let stop = CancellationToken::new();
    let creator = tokio::spawn({
        let secrets = w.secrets();
        let shard = w.labels.shard.clone();
        let stop = stop.clone();
        async move {
            let (mut assigned, mut missed, mut failed) = (0, Vec::new(), Vec::new());
            for i in 0.. {
                if stop.is_cancelled() {
                    break;
                }
                let name = format!("rotation-{i}");
                match secrets.create(&PostParams::default(), &secret(&name)).await {
                    Ok(s) if s.labels().contains_key(&shard) => assigned += 1,
                    Ok(_) => missed.push(name),
                    Err(e) => failed.push(format!("{name}: {e}")),
                }
            }
            (assigned, missed, failed)
        }
    });

    // 1. Old and new CA in the file: every configuration carries both.
    let new_ca = TestCa::new("rotated-ca").expect("ca");
    let both = format!("{old_ca}{}", new_ca.pem());
    replace_file(&w.ca_file(), &both);
    bundle_is(both).await;
    w.wait_until_admission_sees_configurations().await;

    // 2. The webhook serves a certificate of the new CA.
    let cert = new_ca.serving_cert("webhook").expect("cert");
    let addr = w.webhook.as_ref().expect("webhook").addr;
    replace_file(&w.world.dir().join("tls.key"), &cert.key_pem);
    replace_file(&w.world.dir().join("tls.crt"), &cert.cert_pem);
    eventually("the webhook serves the new certificate", WAIT, || async {
        let served = served_certificate(addr, &[old_ca.clone(), new_ca.pem()]).await;
        (served == der_of(&cert.cert_pem))
            .then_some(())
            .ok_or("the old one")
    })
    .await;

    // 3. Only the new CA.
    replace_file(&w.ca_file(), &new_ca.pem());
    bundle_is(new_ca.pem()).await;
    w.wait_until_admission_sees_configurations().await;

    // A broken bundle is refused with a warning for people that names the flag, and changes
    // nothing.
    let logged = w.reconciler_log(0).len();
    replace_file(&w.ca_file(), "not a certificate\n");
    eventually("a warning naming --webhook-ca-file", WAIT, || async {
        let log = w.reconciler_log(0);
        log[logged..]
            .contains("--webhook-ca-file ")
            .then_some(())
            .ok_or("not yet")
    })
    .await;
    w.wait_until_webhook_assigns().await;

    stop.cancel();
    let (assigned, missed, failed) = creator.await.expect("creator");
    assert!(failed.is_empty(), "creates failed: {failed:?}");
    assert!(missed.is_empty(), "created unassigned: {missed:?}");
    assert!(assigned > 0, "objects were created during the rotation");
    bundle_is(new_ca.pem()).await;
    let metrics = w.reconcilers[0].metrics().await;
    assert_eq!(configuration_writes(&metrics, &w.ring, "ca_bundle"), 2.0);
    assert_eq!(configuration_writes(&metrics, &w.ring, "changed"), 0.0);
    println!("created {assigned} objects during the rotation, all assigned");
}

#[tokio::test]
async fn the_global_namespace_selector_limits_every_ring_and_its_lists() {
    const GROUP: &str = "sharder-test/group";
    const EXCLUDED: &str = "sharder-test/excluded";
    let mut w = Test::new("global").await;
    let other = w.cp.namespace("global-b").await.expect("namespace");
    let namespaces = Api::<Namespace>::all(w.client.clone());
    for (ns, excluded) in [(w.ns.clone(), false), (other.clone(), true)] {
        let mut labels = json!({ GROUP: w.ns });
        if excluded {
            labels[EXCLUDED] = json!("yes");
        }
        namespaces
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .expect("label namespace");
    }
    // The ring selects both namespaces; the global selector leaves one out.
    let mut ring = secrets_ring(&w.ring, Some(&w.ns));
    ring.spec.namespace_selector = Some(LabelSelector {
        match_labels: Some([(GROUP.to_owned(), w.ns.clone())].into()),
        match_expressions: None,
    });
    Api::<ClusterRing>::all(w.client.clone())
        .create(&PostParams::default(), &ring)
        .await
        .expect("ring");
    w.add_shard_lease("shard-a", 3600).await;
    let in_other = Api::<Secret>::namespaced(w.client.clone(), &other);
    for i in 0..5 {
        let name = format!("object-{i}");
        w.secrets()
            .create(&PostParams::default(), &secret(&name))
            .await
            .expect("secret");
        in_other
            .create(&PostParams::default(), &secret(&name))
            .await
            .expect("secret in the excluded namespace");
    }
    let global =
        format!(r#"{{"matchExpressions":[{{"key":"{EXCLUDED}","operator":"DoesNotExist"}}]}}"#);
    let mut flags = w.world.reconciler_flags(
        "replica-0",
        &w.world.ns,
        super::NO_WEBHOOK,
        Duration::from_secs(1),
    );
    let at = flags
        .extra
        .iter()
        .position(|f| f == "--namespace-selector")
        .expect("the harness sets it");
    flags.extra[at + 1] = global;
    let reconciler = w
        .world
        .start_reconciler("reconciler-0", &w.reconciler_env, &flags)
        .await;
    w.reconcilers.push(reconciler);

    w.wait_until_all_assigned("the included namespace's objects assigned")
        .await;
    // Two more sweeps, then the excluded namespace's objects are still untouched.
    w.wait_for_rebalances(0, 2).await;
    let touched: Vec<String> = in_other
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|s| w.shard_of(s).is_some())
        .map(|s| s.name_any())
        .collect();
    assert!(
        touched.is_empty(),
        "assigned in the excluded namespace: {touched:?}"
    );

    // The configuration carries both selectors.
    let mwc = Api::<MutatingWebhookConfiguration>::all(w.client.clone())
        .get(&RingId::cluster_ring(&w.ring).configuration_name())
        .await
        .expect("configuration");
    let keys: Vec<(String, String)> = mwc.webhooks.expect("webhooks")[0]
        .namespace_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .map(|e| (e.key.clone(), e.operator.clone()))
        .collect();
    assert_eq!(
        keys,
        [
            (GROUP.to_owned(), "In".to_owned()),
            (EXCLUDED.to_owned(), "DoesNotExist".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_malformed_ring_is_reported_in_its_status_and_the_others_go_on() {
    let mut w = Test::new("malformed").await;
    // ConfigMaps both controlled by Secrets and a main resource: the spec cannot be used.
    let bad_name = format!("{}-bad", w.ns);
    let mut bad = secrets_ring(&bad_name, Some(&w.ns));
    bad.spec.resources.push(sharder_common::RingResource {
        group: String::new(),
        resource: "configmaps".into(),
        controlled_resources: vec![],
    });
    let rings = Api::<ClusterRing>::all(w.client.clone());
    rings
        .create(&PostParams::default(), &bad)
        .await
        .expect("the apiserver accepts it; only the reconciler can tell");
    w.create_ring().await;
    w.add_shard_lease("shard-a", 3600).await;
    w.start_reconciler().await;
    w.create_secrets(5).await;
    w.wait_until_all_assigned("the valid ring's objects assigned")
        .await;
    let message = eventually("the malformed ring reports why", WAIT, || async {
        let ring = rings.get(&bad_name).await.map_err(|e| e.to_string())?;
        let ready = ring
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.type_ == "Ready")
            .cloned()
            .ok_or("no condition")?;
        (ready.status == "False" && ready.reason == "InvalidSpec")
            .then_some(ready.message.clone())
            .ok_or(format!("{} {}", ready.reason, ready.message))
    })
    .await;
    assert!(
        message.contains("configmaps"),
        "names the resource: {message}"
    );
    let configurations = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    assert!(
        configurations
            .get_opt(&RingId::cluster_ring(&bad_name).configuration_name())
            .await
            .expect("get")
            .is_none(),
        "no webhook configuration for a malformed ring"
    );
    assert!(
        configurations
            .get_opt(&RingId::cluster_ring(&w.ring).configuration_name())
            .await
            .expect("get")
            .is_some()
    );
}
