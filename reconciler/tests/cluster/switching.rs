//! Switching from the reference sharder, against its own objects (`sharder_harness::reference`):
//! its released ControllerRing CRD instead of Sharder's, the webhook configuration its controller
//! applies, its shards' Leases renewed as client-go renews them, and objects its ring placed.
//! Sharder then moves nothing placed right, takes the configuration over whole and keeps the
//! ring's status under the reference's schema. From v0.8 (ClusterRing, the apiVersion in its
//! keys) the objects its key placed elsewhere move, and its differently named configuration goes;
//! from v0.9.x (ControllerRing, the same keys) the same objects move and its configuration is
//! taken over.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::{Ring, RingKind};
use sharder_harness::control_plane::{ControlPlane, RING_NAMESPACE_LABEL};
use sharder_harness::crd::{RING_CRDS, install_chart_crd};
use sharder_harness::reference;
use sharder_harness::wait::eventually;
use sharder_harness::world::World;

use crate::{Test, WAIT};

/// The shard the reference's ring picks for `key` among `shards`, computed here from the ring
/// rule alone (XXH64 seed 0, 100 tokens `xxh64(shard + i)` per shard, the first token at or
/// after the key's hash, wrapping), not with Sharder's `Ring`.
fn reference_shard<'a>(shards: &[&'a str], key: &str) -> &'a str {
    use xxhash_rust::xxh64::xxh64;
    let mut tokens: Vec<(u64, &str)> = shards
        .iter()
        .flat_map(|s| (0..100).map(move |i| (xxh64(format!("{s}{i}").as_bytes(), 0), *s)))
        .collect();
    tokens.sort_unstable();
    let hash = xxh64(key.as_bytes(), 0);
    tokens
        .iter()
        .find(|(t, _)| *t >= hash)
        .unwrap_or(&tokens[0])
        .1
}

/// A control plane of its own serving the reference's CRD of `kind` (v0.13.0's ControllerRing,
/// v0.8.0's ClusterRing) and, beside it, Sharder's chart's CRD of the other kind (Helm skips the
/// one that exists): a test of a ring of `kind` on it.
async fn under_the_reference_s_crd(prefix: &str, kind: RingKind) -> Test {
    let cp = ControlPlane::dedicated(Default::default())
        .await
        .expect("a control plane of its own");
    let client = cp.client().await.expect("client");
    let (theirs, ours) = match kind {
        RingKind::ControllerRing => (reference::CONTROLLER_RING_CRD, RING_CRDS[0]),
        RingKind::ClusterRing => (reference::CLUSTER_RING_CRD, RING_CRDS[1]),
    };
    reference::install_crd(&client, theirs)
        .await
        .expect("the reference's CRD");
    install_chart_crd(&client, ours)
        .await
        .expect("Sharder's CRD of the other kind");
    let ns = cp.namespace(prefix).await.expect("namespace");
    let world = World::under_installed_crds(cp, ns.clone(), ns).await;
    Test::in_world(world.with_kind(kind)).await
}

/// Creates the world's ring of its kind as the reference's users write it (the label only
/// selects it for the test's reconciler); returns its uid.
async fn create_ring_as_its_users_write_it(w: &Test) -> String {
    let ring: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "sharding.timebertt.dev/v1alpha1",
        "kind": w.kind.kind(),
        "metadata": { "name": w.ring, "labels": { RING_NAMESPACE_LABEL: w.ns } },
        "spec": {
            "resources": [{
                "group": "",
                "resource": "secrets",
                "controlledResources": [{ "group": "", "resource": "configmaps" }],
            }],
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": w.ns } },
        },
    }))
    .expect("a ring");
    let ring = w
        .rings()
        .create(&PostParams::default(), &ring)
        .await
        .expect("the ring");
    ring.uid().expect("the ring's uid")
}

/// Creates `object-0` to `object-59` and a child of each, labelled with the shard the
/// reference's ring picks among `shards` for the key `key` gives an object's name.
async fn place_as_the_reference(w: &Test, shards: &[&str], key: impl Fn(&str) -> String) {
    let pp = PostParams::default();
    for i in 0..60 {
        let name = format!("object-{i}");
        let shard = reference_shard(shards, &key(&name));
        let mut owner = sharder_harness::fixtures::secret(&name);
        owner.metadata.labels = Some([(w.labels.shard.clone(), shard.to_owned())].into());
        let owner = w.secrets().create(&pp, &owner).await.expect("secret");
        let mut child = sharder_harness::fixtures::child_of(&owner, &format!("child-{i}"));
        child.metadata.labels = Some([(w.labels.shard.clone(), shard.to_owned())].into());
        w.configmaps().create(&pp, &child).await.expect("configmap");
    }
}

/// Places the objects as v0.8 and v0.9.x did, by keys holding the apiVersion
/// (`v1/Secret/<namespace>/<name>`), among `shards`; returns those Sharder's key places elsewhere
/// (about (n-1)/n of them).
async fn place_by_api_version_keys(w: &Test, shards: &[&str]) -> BTreeSet<String> {
    let old_key = |name: &str| format!("v1/Secret/{}/{name}", w.ns);
    place_as_the_reference(w, shards, old_key).await;
    let moving: BTreeSet<String> = (0..60)
        .map(|i| format!("object-{i}"))
        .filter(|n| reference_shard(shards, &old_key(n)) != reference_shard(shards, &w.key(n)))
        .collect();
    assert!(moving.len() > 20, "{} of 60 move", moving.len());
    moving
}

/// What of the reference is left in the ring's webhook configuration, or where it points if
/// not at `ours`.
fn not_taken_over(mwc: &MutatingWebhookConfiguration, ours: &str) -> Vec<String> {
    let mut left = Vec::new();
    for (key, value) in mwc.annotations() {
        left.push(format!("annotation {key}={value}"));
    }
    for webhook in mwc.webhooks.iter().flatten() {
        if let Some(service) = &webhook.client_config.service {
            left.push(format!(
                "webhook {} calls Service {}/{}",
                webhook.name, service.namespace, service.name
            ));
        }
        if webhook.client_config.url.as_deref() != Some(ours) {
            left.push(format!(
                "webhook {} calls {:?}",
                webhook.name, webhook.client_config.url
            ));
        }
    }
    left
}

#[tokio::test]
async fn switching_from_the_reference_under_its_own_crd_moves_nothing_and_takes_its_configuration_over_and_back()
 {
    let mut w = under_the_reference_s_crd("switch", RingKind::ControllerRing).await;

    let uid = create_ring_as_its_users_write_it(&w).await;
    let pp = PostParams::default();
    let shards = ["ref-a", "ref-b", "ref-c"];
    let _renewals = reference::hold_shard_leases(&w.client, &w.ns, &w.id(), &shards)
        .await
        .expect("the reference's shard Leases");
    reference::apply_webhook_configuration(&w.client, &w.ring, &uid, &w.ns)
        .await
        .expect("the reference's webhook configuration");
    place_as_the_reference(&w, &shards, |n| w.key(n)).await;
    let leases = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let of_ring = ListParams::default().labels(&format!("{}={}", w.kind.lease_label(), w.ring));
    // Each shard Lease's holder and state.
    let holders = |all: Vec<Lease>| -> BTreeMap<String, (Option<String>, Option<String>)> {
        all.into_iter()
            .map(|l| {
                let state = l
                    .labels()
                    .get("alpha.sharding.timebertt.dev/state")
                    .cloned();
                (
                    l.name_any(),
                    (l.spec.and_then(|s| s.holder_identity), state),
                )
            })
            .collect()
    };
    let before = holders(leases.list(&of_ring).await.expect("Leases").items);
    assert_eq!(before.len(), shards.len());

    let mark = w.audit_mark();
    w.start_webhook().await;
    w.start_reconciler().await;
    let ours = w.webhook_url() + &w.id().webhook_path();
    let name = w.id().configuration_name();
    assert_eq!(
        name,
        format!("controllerring-{}", w.ring),
        "the reference's name"
    );
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    eventually("the reference's configuration taken over", WAIT, || async {
        let mwc = mwcs.get(&name).await.map_err(|e| vec![e.to_string()])?;
        let left = not_taken_over(&mwc, &ours);
        left.is_empty().then_some(()).ok_or(left)
    })
    .await;

    // A full rebalance and sweeps later, nothing was written to the sharded objects.
    w.wait_for_rebalances(0, 3).await;
    let reconciler = w.reconciler_user();
    let by_reconciler = w.writes_by_since(&reconciler, mark);
    let sharded: Vec<_> = by_reconciler
        .keys()
        .filter(|(resource, _)| resource == "secrets" || resource == "configmaps")
        .collect();
    assert!(
        sharded.is_empty(),
        "the reconciler wrote objects the reference placed: {sharded:?}"
    );
    w.settled(&Ring::new(shards))
        .await
        .expect("as the reference placed them");

    // The ring's status under the reference's schema, and the shards keep their Leases.
    eventually("the ring's status", WAIT, || async {
        let ring = w.rings().get(&w.ring).await.map_err(|e| e.to_string())?;
        let status = &ring.data["status"];
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (status["availableShards"] == 3 && status["shards"] == 3 && ready)
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    let after = holders(leases.list(&of_ring).await.expect("Leases").items);
    assert_eq!(
        after, before,
        "the shards' Leases keep their holders and states"
    );

    // The taken-over configuration places a new object by the reference's ring.
    let created = w
        .secrets()
        .create(&pp, &sharder_harness::fixtures::secret("object-new"))
        .await
        .expect("a new Secret");
    assert_eq!(
        w.shard_of(&created).as_deref(),
        Some(reference_shard(&shards, &w.key("object-new")))
    );

    // The reconciler read the objects it left alone: a fourth shard of the reference's drains
    // exactly those the reference's ring moves to it.
    let four = ["ref-a", "ref-b", "ref-c", "ref-d"];
    let _fourth = reference::hold_shard_leases(&w.client, &w.ns, &w.id(), &four[3..])
        .await
        .expect("a fourth shard Lease");
    let moving: BTreeSet<String> = (0..60)
        .map(|i| format!("object-{i}"))
        .chain(["object-new".to_string()])
        .filter(|n| reference_shard(&shards, &w.key(n)) != reference_shard(&four, &w.key(n)))
        .collect();
    assert!(!moving.is_empty());
    w.wait_until_drained(&moving).await;

    // Switching back: the reference applies its configuration without forcing, so while
    // Sharder's fields are in it every apply conflicts; deleted, the apply creates it anew.
    for mut reconciler in std::mem::take(&mut w.reconcilers) {
        reconciler.process.stop(std::time::Duration::from_secs(20));
    }
    let refused = reference::apply_webhook_configuration(&w.client, &w.ring, &uid, &w.ns).await;
    assert!(
        matches!(&refused, Err(sharder_harness::Error::Kube(kube::Error::Api(s))) if s.code == 409),
        "the reference's apply over Sharder's fields: {refused:?}"
    );
    mwcs.delete(&name, &Default::default())
        .await
        .expect("Sharder's configuration deleted");
    let theirs = reference::apply_webhook_configuration(&w.client, &w.ring, &uid, &w.ns)
        .await
        .expect("the reference's apply once it is gone");
    assert_eq!(
        theirs.webhooks.unwrap_or_default()[0]
            .client_config
            .service
            .as_ref()
            .map(|s| s.name.as_str()),
        Some("sharder"),
        "the reference's Service"
    );
}

#[tokio::test]
async fn switching_from_the_reference_v0_8_moves_what_its_keys_placed_elsewhere_and_deletes_its_configuration()
 {
    let mut w = under_the_reference_s_crd("switch-v08", RingKind::ClusterRing).await;
    let uid = create_ring_as_its_users_write_it(&w).await;
    let shards = ["ref-a", "ref-b", "ref-c"];
    let _renewals = reference::hold_shard_leases(&w.client, &w.ns, &w.id(), &shards)
        .await
        .expect("the reference's shard Leases");
    let old = reference::v0_8_webhook_configuration(&w.id(), &uid, &w.ns).expect("v0.8's");
    let old_name = old.metadata.name.clone().expect("named");
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    mwcs.patch(
        &old_name,
        &PatchParams::apply("clusterring-controller"),
        &Patch::Apply(&old),
    )
    .await
    .expect("v0.8's webhook configuration");
    let moving = place_by_api_version_keys(&w, &shards).await;

    w.start_webhook().await;
    w.start_reconciler().await;
    eventually(
        "v0.8's configuration deleted, Sharder's in place",
        WAIT,
        || async {
            let old = mwcs.get_opt(&old_name).await.map_err(|e| e.to_string())?;
            let ours = mwcs
                .get_opt(&w.id().configuration_name())
                .await
                .map_err(|e| e.to_string())?;
            match (old, ours) {
                (None, Some(_)) => Ok(()),
                (old, ours) => Err(format!(
                    "v0.8's there: {}, Sharder's there: {}",
                    old.is_some(),
                    ours.is_some()
                )),
            }
        },
    )
    .await;
    // The objects v0.8's key placed elsewhere are drained off their live shards, and only they.
    w.wait_until_drained(&moving).await;
}

/// v0.9.x: a ControllerRing under the reference's CRD and the configuration its controller
/// applies (named as Sharder names it), with v0.8's keys (the apiVersion in them).
#[tokio::test]
async fn switching_from_the_reference_v0_9_takes_its_configuration_over_and_moves_what_its_keys_placed_elsewhere()
 {
    let mut w = under_the_reference_s_crd("switch-v09", RingKind::ControllerRing).await;
    let uid = create_ring_as_its_users_write_it(&w).await;
    let shards = ["ref-a", "ref-b", "ref-c"];
    let _renewals = reference::hold_shard_leases(&w.client, &w.ns, &w.id(), &shards)
        .await
        .expect("the reference's shard Leases");
    reference::apply_webhook_configuration(&w.client, &w.ring, &uid, &w.ns)
        .await
        .expect("the reference's webhook configuration");
    let moving = place_by_api_version_keys(&w, &shards).await;

    w.start_webhook().await;
    w.start_reconciler().await;
    let ours = w.webhook_url() + &w.id().webhook_path();
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    eventually("the reference's configuration taken over", WAIT, || async {
        let mwc = mwcs
            .get(&w.id().configuration_name())
            .await
            .map_err(|e| vec![e.to_string()])?;
        let left = not_taken_over(&mwc, &ours);
        left.is_empty().then_some(()).ok_or(left)
    })
    .await;
    // The objects v0.9's key placed elsewhere are drained off their live shards, and only they.
    w.wait_until_drained(&moving).await;
}
