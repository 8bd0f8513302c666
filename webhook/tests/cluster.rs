//! The webhook binary against a real kube-apiserver: registered by URL with the ring's
//! MutatingWebhookConfiguration as the reconciler builds it (`sharder_common::webhook_configuration`:
//! CA as `caBundle`, objectSelector `<shard label> DoesNotExist`), it labels new objects with
//! exactly the shard `common`'s ring computes, children on their owner's shard; assigned objects
//! never reach it; with no shard available or with the webhook down, writes still succeed. Its
//! certificate is reloaded when the files change.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::webhook_configuration::{
    WebhookSettings, WebhookTarget, webhook_configuration,
};
use sharder_common::{ClusterRing, ObjectKey, Ring};
use sharder_harness::certs::{TestCa, der_of, served_certificate};
use sharder_harness::fixtures::{child_of, secret, shard_lease};
use sharder_harness::launch::Webhook;
use sharder_harness::wait::{eventually, metric_sum, metric_value};
use sharder_harness::world::{World, set_lease_holder};

const WAIT: Duration = Duration::from_secs(30);

/// Starts a webhook serving `world`'s certificate, reloading it every 200 ms.
async fn start_webhook(world: &World) -> Webhook {
    let env = world
        .admin_env()
        .var("SHARDER_LOG_LEVEL", "info,sharder_webhook=debug");
    world
        .start_webhook("webhook", &env, &["--tls-reload-interval", "200ms"])
        .await
}

/// Everything one test needs: a world whose ring has `shards` held leases (plus `released`
/// released ones), a running webhook and the ring's webhook configuration registered.
struct Setup {
    world: World,
    webhook: Webhook,
}

impl Deref for Setup {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

async fn setup(prefix: &str, shards: &[&str], released: &[&str]) -> Setup {
    let world = World::new(prefix).await;
    world.create_ring().await;
    for name in shards {
        world.add_shard_lease(name, 3600).await;
    }
    for name in released {
        world
            .leases()
            .create(
                &PostParams::default(),
                &shard_lease(&world.ns, &world.id(), name, false, 3600),
            )
            .await
            .expect("lease");
    }
    let webhook = start_webhook(&world).await;
    let want = shards.len() as f64;
    eventually("webhook sees the ring's shards", WAIT, || async {
        let metrics = webhook.metrics().await;
        match metric_value(
            &metrics,
            "sharder_webhook_available_shards",
            &[("clusterring", &world.ring)],
        ) {
            Some(n) if n == want => Ok(()),
            other => Err(other),
        }
    })
    .await;
    let ring = Api::<ClusterRing>::all(world.client.clone())
        .get(&world.ring)
        .await
        .expect("ring");
    let settings = WebhookSettings {
        target: WebhookTarget::Url(format!("https://{}", webhook.addr)),
        ca_bundle: std::fs::read(world.ca_file()).expect("CA file"),
        timeout_seconds: 5,
        // The ring selects its namespace; nothing more is needed.
        namespace_selector: LabelSelector::default(),
    };
    let ring = sharder_common::RingObject::cluster_ring(ring);
    let configuration = webhook_configuration(&ring, &ring.roles().expect("roles"), &settings);
    Api::<MutatingWebhookConfiguration>::all(world.client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .expect("webhook configuration");
    Setup { world, webhook }
}

impl Setup {
    /// Total admission reviews the webhook answered.
    async fn reviews(&self) -> f64 {
        metric_sum(
            &self.webhook.metrics().await,
            "sharder_webhook_request_duration_seconds_count",
            &[],
        )
    }

    /// Waits until the apiserver calls the webhook for this namespace (webhook configurations
    /// take effect a moment after they are created).
    async fn wait_until_registered(&self) {
        let mut attempt = 0;
        eventually("apiserver calls the webhook", WAIT, || {
            attempt += 1;
            let name = format!("probe-{attempt}");
            async move {
                let before = self.reviews().await;
                self.secrets()
                    .create(&PostParams::default(), &secret(&name))
                    .await
                    .map_err(|e| e.to_string())?;
                if self.reviews().await > before {
                    Ok(())
                } else {
                    Err("not called yet".to_owned())
                }
            }
        })
        .await;
    }
}

#[tokio::test]
async fn objects_get_the_shard_the_ring_computes_and_children_follow_their_owners() {
    let shards = ["shard-a", "shard-b", "shard-c"];
    let s = setup("assign", &shards, &[]).await;
    s.wait_until_registered().await;
    let ring = Ring::new(shards);
    let pp = PostParams::default();

    let mut owners = Vec::new();
    for i in 0..50 {
        owners.push(
            s.secrets()
                .create(&pp, &secret(&format!("object-{i}")))
                .await
                .expect("create secret"),
        );
    }
    let mut children = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        children.push(
            s.configmaps()
                .create(&pp, &child_of(owner, &format!("child-{i}")))
                .await
                .expect("create configmap"),
        );
    }

    // The objects as the apiserver stored them.
    let stored: BTreeMap<String, Secret> = s
        .secrets()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|o| o.name_any().starts_with("object-"))
        .map(|o| (o.name_any(), o))
        .collect();
    assert_eq!(stored.len(), 50);
    let mut used = BTreeSet::new();
    for (name, object) in &stored {
        let key = ObjectKey::main("", "Secret", Some(&s.ns), name).expect("named");
        let want = ring.shard_for(key.as_str()).expect("shard");
        assert_eq!(s.shard_of(object).as_deref(), Some(want), "secret {name}");
        used.insert(want.to_owned());
    }
    assert_eq!(used.len(), 3, "every shard is used: {used:?}");
    let children: Vec<ConfigMap> = s
        .configmaps()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|o| o.name_any().starts_with("child-"))
        .collect();
    assert_eq!(children.len(), 50);
    for child in &children {
        let owner = &child.owner_references()[0].name;
        assert_eq!(
            s.shard_of(child),
            s.shard_of(&stored[owner]),
            "child {} of {owner}",
            child.name_any()
        );
    }
    let metrics = s.webhook.metrics().await;
    let assigned_secrets = metric_value(
        &metrics,
        "controller_sharding_assignments_total",
        &[("clusterring", &s.ring), ("resource", "secrets")],
    );
    assert!(
        assigned_secrets.is_some_and(|n| n >= 50.0),
        "{assigned_secrets:?}"
    );

    // An update of an assigned object is filtered by the objectSelector: the webhook never sees it.
    let before = s.reviews().await;
    s.secrets()
        .patch(
            "object-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .expect("update");
    assert_eq!(
        s.reviews().await,
        before,
        "an assigned object's update reached the webhook"
    );
    // While an unassigned object's update does reach it (so the counter above can move).
    let orphan = ConfigMap {
        metadata: ObjectMeta {
            name: Some("no-owner".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    s.configmaps().create(&pp, &orphan).await.expect("create");
    assert_eq!(
        s.shard_of(&s.configmaps().get("no-owner").await.expect("get")),
        None
    );
    let before = s.reviews().await;
    s.configmaps()
        .patch(
            "no-owner",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .expect("update");
    assert_eq!(
        s.reviews().await,
        before + 1.0,
        "an unassigned object's update reaches the webhook"
    );
}

#[tokio::test]
async fn a_new_child_goes_to_the_shard_holding_its_owner_not_ahead_of_it() {
    let shards = ["shard-a", "shard-b", "shard-c"];
    let s = setup("handover", &shards, &[]).await;
    s.wait_until_registered().await;
    let ring = Ring::new(shards);
    let pp = PostParams::default();
    // An owner the ring would put on one shard, held (draining) by another: its new children
    // go to the holder, not to the ring's choice.
    let name = "owner-draining";
    let desired = ring
        .shard_for(
            ObjectKey::main("", "Secret", Some(&s.ns), name)
                .expect("named")
                .as_str(),
        )
        .expect("shard")
        .to_owned();
    let holder = shards
        .iter()
        .find(|sh| **sh != desired)
        .expect("another shard");
    let mut draining = secret(name);
    draining.metadata.labels = Some(
        [
            (s.labels.shard.clone(), (*holder).to_owned()),
            (s.labels.drain.clone(), "true".to_owned()),
        ]
        .into(),
    );
    let owner = s.secrets().create(&pp, &draining).await.expect("owner");
    let child = s
        .configmaps()
        .create(&pp, &child_of(&owner, "child-of-draining"))
        .await
        .expect("child");
    assert_eq!(
        s.shard_of(&child).as_deref(),
        Some(*holder),
        "the holder, not the ring's choice {desired}"
    );

    // An owner no shard holds yet: its child stays unassigned (the reconciler's sweep assigns
    // it once the owner is held); the write still succeeds.
    // (A generateName owner has no name at admission, so the webhook leaves it unassigned.)
    let mut unheld = secret("");
    unheld.metadata.name = None;
    unheld.metadata.generate_name = Some("owner-unheld-".into());
    let owner = s.secrets().create(&pp, &unheld).await.expect("owner");
    assert_eq!(s.shard_of(&owner), None);
    let child = s
        .configmaps()
        .create(&pp, &child_of(&owner, "child-of-unheld"))
        .await
        .expect("created unassigned");
    assert_eq!(s.shard_of(&child), None);
    let metrics = s.webhook.metrics().await;
    assert!(
        metric_value(
            &metrics,
            "sharder_webhook_owner_lookups_total",
            &[("result", "draining")]
        ) >= Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sharder_webhook_not_assigned_total",
            &[("clusterring", &s.ring), ("reason", "owner_not_held")]
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn with_no_shard_available_creates_succeed_unlabelled_until_one_is() {
    let s = setup("noshard", &[], &["released"]).await;
    s.wait_until_registered().await;
    let pp = PostParams::default();
    for i in 0..5 {
        let created = s
            .secrets()
            .create(&pp, &secret(&format!("early-{i}")))
            .await
            .expect("create succeeds");
        assert_eq!(s.shard_of(&created), None);
    }
    let metrics = s.webhook.metrics().await;
    let skipped = metric_value(
        &metrics,
        "sharder_webhook_not_assigned_total",
        &[("clusterring", &s.ring), ("reason", "no_shard_available")],
    );
    assert!(skipped.is_some_and(|n| n >= 5.0), "{skipped:?}");

    // Once a shard holds its lease, new objects are assigned to it.
    set_lease_holder(&s.leases(), "released", "released").await;
    let mut attempt = 0;
    let s = &s;
    eventually("new objects are assigned to the shard", WAIT, || {
        attempt += 1;
        let name = format!("late-{attempt}");
        async move {
            let created = s
                .secrets()
                .create(&PostParams::default(), &secret(&name))
                .await
                .map_err(|e| e.to_string())?;
            match s.shard_of(&created) {
                Some(shard) if shard == "released" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn with_the_webhook_down_creates_still_succeed() {
    let mut s = setup("down", &["shard-a"], &[]).await;
    s.wait_until_registered().await;
    let labelled = s
        .secrets()
        .create(&PostParams::default(), &secret("while-up"))
        .await
        .expect("create");
    assert_eq!(s.shard_of(&labelled).as_deref(), Some("shard-a"));
    s.webhook.process.kill();
    for i in 0..5 {
        let created = s
            .secrets()
            .create(&PostParams::default(), &secret(&format!("while-down-{i}")))
            .await
            .expect("create succeeds with failurePolicy Ignore");
        assert_eq!(s.shard_of(&created), None);
    }
}

/// Writes `cert`/`key` into a new timestamped folder and swaps the `..data` symlink to it, the
/// way the kubelet updates Secret volumes.
fn swap_secret_volume(dir: &Path, version: &str, cert: &str, key: &str) {
    let data = dir.join(version);
    std::fs::create_dir(&data).expect("version dir");
    std::fs::write(data.join("tls.crt"), cert).expect("cert");
    std::fs::write(data.join("tls.key"), key).expect("key");
    let tmp: PathBuf = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("atomic swap");
}

#[tokio::test]
async fn a_rotated_certificate_is_served_on_new_connections_without_restart() {
    let world = World::new("rotate").await;
    let (old_ca, new_ca) = (
        TestCa::new("old-ca").expect("ca"),
        TestCa::new("new-ca").expect("ca"),
    );
    let (old, new) = (
        old_ca.serving_cert("old").expect("cert"),
        new_ca.serving_cert("new").expect("cert"),
    );
    // A Secret volume's layout: tls.crt -> ..data/tls.crt, ..data -> ..v1.
    let dir = world.dir().join("volume");
    std::fs::create_dir(&dir).expect("volume dir");
    swap_secret_volume(&dir, "..v1", &old.cert_pem, &old.key_pem);
    std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).expect("symlink");
    std::os::unix::fs::symlink("..data/tls.key", dir.join("tls.key")).expect("symlink");
    let webhook = Webhook::start(
        "webhook",
        &world.admin_env(),
        &dir.join("tls.crt"),
        &dir.join("tls.key"),
        &["--tls-reload-interval", "200ms"],
    )
    .await
    .expect("webhook");
    let roots = [old_ca.pem(), new_ca.pem()];
    assert_eq!(
        served_certificate(webhook.addr, &roots).await,
        der_of(&old.cert_pem)
    );

    swap_secret_volume(&dir, "..v2", &new.cert_pem, &new.key_pem);
    eventually("the new certificate is served", WAIT, || async {
        let served = served_certificate(webhook.addr, &roots).await;
        if served == der_of(&new.cert_pem) {
            Ok(())
        } else {
            Err("old certificate")
        }
    })
    .await;

    // A broken pair keeps the last good certificate in service.
    swap_secret_volume(&dir, "..v3", &old.cert_pem, "not a key");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        served_certificate(webhook.addr, &roots).await,
        der_of(&new.cert_pem)
    );
    assert!(
        webhook.process.log().contains("do not load yet"),
        "{}",
        webhook.process.log()
    );
}

#[tokio::test]
async fn sigterm_stops_the_webhook_gracefully() {
    let world = World::new("sigterm").await;
    let mut webhook = start_webhook(&world).await;
    webhook
        .process
        .signal(nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    // Not ready at once, so the Service stops sending it connections, but still serving them
    // for the shutdown delay (15 s) while endpoints and proxy rules catch up.
    eventually("not ready after SIGTERM", WAIT, || async {
        match sharder_harness::wait::http_get(webhook.admin, "/readyz").await {
            Ok((503, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let ca = std::fs::read_to_string(world.ca_file()).expect("ca");
    assert!(!served_certificate(webhook.addr, &[ca]).await.is_empty());
    assert!(
        webhook.process.try_wait().is_none(),
        "exited within the delay"
    );
    let status = eventually("exits after the delay and the grace", WAIT, || {
        let status = webhook.process.try_wait();
        async move { status.ok_or("running") }
    })
    .await;
    assert!(status.success(), "{status:?}\n{}", webhook.process.log());
    assert!(
        webhook.process.log().contains("webhook stopped"),
        "{}",
        webhook.process.log()
    );
}
