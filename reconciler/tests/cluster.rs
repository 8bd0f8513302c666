//! The reconciler binary against a real kube-apiserver (with the garbage collector), the webhook
//! running beside it: lease states and takeover, one webhook configuration per ring, drains on
//! scale-out that touch exactly the objects that move, direct moves off dead shards, sweeps of
//! objects the webhook missed, and leader failover.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sharder_common::labels::STATE_LABEL;
use sharder_common::{ClusterRing, ObjectKey, Ring, RingLabels};
use sharder_reconciler::webhook_config::configuration_name;
use sharder_tests::certs::TestCa;
use sharder_tests::control_plane::NAMESPACE_LABEL;
use sharder_tests::crd::install_cluster_ring_crd;
use sharder_tests::fixtures::{child_of, loopback_addr, secret, secrets_ring, shard_lease};
use sharder_tests::wait::{eventually, http_get};
use sharder_tests::{ControlPlane, Supervised};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(40);

/// The webhook, in-process, serving TLS on loopback.
struct Webhook {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Webhook {
    async fn start(cp: &ControlPlane, dir: &std::path::Path, addr: SocketAddr) -> Self {
        let admin = loopback_addr();
        let args = sharder_webhook::Args::parse_from([
            "sharder-webhook",
            "--listen-addr",
            &addr.to_string(),
            "--admin-addr",
            &admin.to_string(),
            "--tls-cert-file",
            &dir.join("tls.crt").to_string_lossy(),
            "--tls-key-file",
            &dir.join("tls.key").to_string_lossy(),
        ]);
        let client = cp.client().await.expect("client");
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let _ = sharder_webhook::run_with_client(args, client, token).await;
        });
        eventually("webhook ready", WAIT, || async {
            match http_get(admin, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// One test's world: a namespace, a ring sharding its secrets (and configmaps they control),
/// shard Leases, the webhook and reconciler replicas.
struct World {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    ring: String,
    labels: RingLabels,
    dir: tempfile::TempDir,
    webhook_addr: SocketAddr,
    reconcilers: Vec<(Supervised, SocketAddr)>,
}

impl World {
    async fn new(prefix: &str) -> Self {
        let cp = ControlPlane::shared().await.expect("control plane");
        let client = cp.client().await.expect("client");
        install_cluster_ring_crd(&client).await.expect("CRD");
        let ns = cp.namespace(prefix).await.expect("namespace");
        let dir = tempfile::tempdir().expect("dir");
        let ca = TestCa::new("reconciler-test-ca").expect("ca");
        let cert = ca.serving_cert("webhook").expect("cert");
        std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem).expect("cert");
        std::fs::write(dir.path().join("tls.key"), &cert.key_pem).expect("key");
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("ca");
        Self {
            cp,
            client,
            ring: ns.clone(),
            labels: RingLabels::new(&ns),
            ns,
            dir,
            webhook_addr: loopback_addr(),
            reconcilers: Vec::new(),
        }
    }

    async fn create_ring(&self) {
        Api::<ClusterRing>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &secrets_ring(&self.ring, Some(&self.ns)),
            )
            .await
            .expect("ring");
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn add_shard(&self, name: &str, duration: i32) {
        self.leases()
            .create(
                &PostParams::default(),
                &shard_lease(&self.ns, &self.ring, name, true, duration),
            )
            .await
            .expect("lease");
    }

    async fn webhook(&self) -> Webhook {
        Webhook::start(self.cp, self.dir.path(), self.webhook_addr).await
    }

    /// Starts a reconciler replica.
    async fn start_reconciler(&mut self) {
        let kubeconfig = self.reconciler_kubeconfig().await;
        let admin = loopback_addr();
        let index = self.reconcilers.len();
        let log = std::fs::File::create(self.dir.path().join(format!("reconciler-{index}.log")))
            .expect("log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sharder-reconciler"));
        command
            .env("KUBECONFIG", kubeconfig)
            .args(["--namespace", &self.ns])
            .args(["--leader-election-name", "sharder-reconciler"])
            .args(["--identity", &format!("replica-{index}")])
            .args([
                "--leader-election-duration",
                "3s",
                "--leader-election-renew",
                "500ms",
            ])
            .args(["--webhook-url", &format!("https://{}", self.webhook_addr)])
            .arg("--webhook-ca-file")
            .arg(self.dir.path().join("ca.crt"))
            .args(["--sweep-interval", "1s", "--drain-check-interval", "500ms"])
            .args([
                "--clusterring-selector",
                &format!("{NAMESPACE_LABEL}={}", self.ns),
            ])
            .args(["--admin-addr", &admin.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let process =
            Supervised::spawn(format!("sharder-reconciler-{index}"), command).expect("reconciler");
        self.reconcilers.push((process, admin));
    }

    /// The user the reconciler runs as: a ServiceAccount of the test namespace.
    fn reconciler_user(&self) -> String {
        format!("system:serviceaccount:{}:sharder-reconciler", self.ns)
    }

    /// A kubeconfig for the reconciler's ServiceAccount, bound to cluster-admin (the chart's
    /// least-privilege RBAC is tested with the chart), so its writes can be told apart in the
    /// audit log.
    async fn reconciler_kubeconfig(&self) -> std::path::PathBuf {
        let token = self
            .cp
            .cluster_admin_token(&self.ns, "sharder-reconciler")
            .await
            .expect("token");
        self.cp
            .write_kubeconfig(&format!("reconciler-{}", self.ns), &token)
            .expect("kubeconfig")
    }

    /// Successful writes to objects of this namespace by `user`, per (resource, name).
    fn writes_by(&self, user: &str) -> BTreeMap<(String, String), usize> {
        let mut writes = BTreeMap::new();
        for event in self.cp.audited_writes() {
            let object = &event["objectRef"];
            if event["user"]["username"] == user && object["namespace"] == self.ns.as_str() {
                let key = (
                    object["resource"].as_str().unwrap_or_default().to_owned(),
                    object["name"].as_str().unwrap_or_default().to_owned(),
                );
                *writes.entry(key).or_default() += 1;
            }
        }
        writes
    }

    fn reconciler_log(&self, index: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("reconciler-{index}.log")))
            .unwrap_or_default()
    }

    fn shard_of<K: kube::Resource>(&self, object: &K) -> Option<String> {
        self.labels
            .shard_of(kube::ResourceExt::labels(object))
            .map(str::to_owned)
    }

    fn draining<K: kube::Resource>(&self, object: &K) -> bool {
        self.labels.is_draining(kube::ResourceExt::labels(object))
    }

    fn key(&self, name: &str) -> String {
        ObjectKey::main("", "Secret", Some(&self.ns), name)
            .expect("named")
            .to_string()
    }

    /// Waits until the apiserver calls the webhook for this namespace (a probe secret created
    /// afterwards is labelled).
    async fn wait_until_webhook_assigns(&self) {
        let mut attempt = 0;
        eventually("the webhook assigns new objects", WAIT, || {
            attempt += 1;
            let name = format!("probe-{attempt}");
            async move {
                let created = self
                    .secrets()
                    .create(&PostParams::default(), &secret(&name))
                    .await
                    .map_err(|e| e.to_string())?;
                self.secrets()
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                self.shard_of(&created)
                    .ok_or_else(|| "not labelled".to_owned())
            }
        })
        .await;
    }

    async fn list_secrets(&self) -> BTreeMap<String, Secret> {
        self.secrets()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter(|s| s.name_any().starts_with("object-"))
            .map(|s| (s.name_any(), s))
            .collect()
    }

    async fn list_children(&self) -> BTreeMap<String, ConfigMap> {
        self.configmaps()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter(|c| c.name_any().starts_with("child-"))
            .map(|c| (c.name_any(), c))
            .collect()
    }

    /// Creates `n` secrets `object-<i>` and a configmap `child-<i>` controlled by each.
    async fn create_objects(&self, n: usize) {
        let pp = PostParams::default();
        for i in 0..n {
            let owner = self
                .secrets()
                .create(&pp, &secret(&format!("object-{i}")))
                .await
                .expect("secret");
            self.configmaps()
                .create(&pp, &child_of(&owner, &format!("child-{i}")))
                .await
                .expect("configmap");
        }
    }

    /// Acknowledges every drain like a shard does: removes both labels with an optimistic lock.
    async fn acknowledge_drains(&self) -> usize {
        let mut acknowledged = 0;
        for (name, secret) in self.list_secrets().await {
            if !self.draining(&secret) {
                continue;
            }
            let patch = json!({"metadata": {
                "resourceVersion": secret.resource_version(),
                "labels": {self.labels.shard.as_str(): null, self.labels.drain.as_str(): null},
            }});
            self.secrets()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("acknowledge");
            acknowledged += 1;
        }
        acknowledged
    }
}

fn state_of(lease: &Lease) -> Option<String> {
    lease.labels().get(STATE_LABEL).cloned()
}

#[tokio::test]
async fn lease_states_are_labelled_and_a_silent_shard_is_taken_over_then_deleted() {
    let mut w = World::new("states").await;
    w.create_ring().await;
    w.add_shard("steady", 3600).await;
    w.add_shard("silent", 2).await;
    let silent_renewed = w
        .leases()
        .get("silent")
        .await
        .expect("get")
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    w.add_shard("renewed", 2).await;
    w.start_reconciler().await;

    // A released lease is dead at once.
    w.add_shard("released", 3600).await;
    eventually("released starts ready", WAIT, || async {
        let l = w
            .leases()
            .get("released")
            .await
            .map_err(|e| e.to_string())?;
        (state_of(&l).as_deref() == Some("ready"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    let mut released = w.leases().get("released").await.expect("get");
    released.spec.as_mut().expect("spec").holder_identity = Some(String::new());
    w.leases()
        .replace("released", &PostParams::default(), &released)
        .await
        .expect("release");

    // Watch the silent lease's state label over time.
    let started = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut renewed_ready_again = false;
    let mut renewed_once = false;
    let taken = loop {
        assert!(
            started.elapsed() < WAIT,
            "silent lease not taken over; states seen {seen:?}\n{}",
            w.reconciler_log(0)
        );
        let silent = w.leases().get("silent").await.expect("get");
        if let Some(state) = state_of(&silent)
            && seen.last() != Some(&state)
        {
            seen.push(state);
        }
        // Renew "renewed" once it is expired: it must become ready again.
        let renewed = w.leases().get("renewed").await.expect("get");
        if !renewed_once && state_of(&renewed).as_deref() == Some("expired") {
            let mut l = renewed.clone();
            l.spec.as_mut().expect("spec").renew_time = Some(MicroTime(Timestamp::now()));
            l.spec.as_mut().expect("spec").lease_duration_seconds = Some(3600);
            w.leases()
                .replace("renewed", &PostParams::default(), &l)
                .await
                .expect("renew");
            renewed_once = true;
        }
        if renewed_once && state_of(&renewed).as_deref() == Some("ready") {
            renewed_ready_again = true;
        }
        if silent
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("shardlease-controller")
        {
            break silent;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(&seen[..2], ["ready", "expired"], "states seen {seen:?}");
    let spec = taken.spec.clone().expect("spec");
    assert_eq!(
        spec.lease_duration_seconds,
        Some(4),
        "twice the shard's duration"
    );
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(state_of(&taken).as_deref(), Some("dead"));
    // Taken over only after it had been expired for a full duration: renewed at creation,
    // expired 2 s later, uncertain 2 s after that.
    let renewed_at = silent_renewed.expect("silent lease was created with a renewTime");
    let taken_at = spec
        .acquire_time
        .clone()
        .expect("takeover sets acquireTime")
        .0;
    let after = taken_at.duration_since(renewed_at);
    assert!(
        after >= k8s_openapi::jiff::SignedDuration::from_secs(4),
        "taken over {after:?} after the last renewal"
    );

    eventually("released lease is dead", WAIT, || async {
        let l = w
            .leases()
            .get("released")
            .await
            .map_err(|e| e.to_string())?;
        (state_of(&l).as_deref() == Some("dead"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    eventually("the renewed lease is ready again", WAIT, || async {
        let l = w.leases().get("renewed").await.map_err(|e| e.to_string())?;
        (renewed_ready_again || state_of(&l).as_deref() == Some("ready"))
            .then_some(())
            .ok_or(format!("{:?}", state_of(&l)))
    })
    .await;
    assert_eq!(
        state_of(&w.leases().get("steady").await.expect("get")).as_deref(),
        Some("ready")
    );

    // Orphaned (dead and expired for a minute: 4 s + 60 s after the takeover), then deleted.
    eventually(
        "the orphaned lease is deleted",
        Duration::from_secs(100),
        || async {
            match w.leases().get_opt("silent").await {
                Ok(None) => Ok(()),
                Ok(Some(l)) => Err(format!("still there: {:?}", state_of(&l))),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    // The log line follows the delete call, so it can land a moment after the Lease is gone.
    eventually("the deletion is logged", WAIT, || async {
        w.reconciler_log(0)
            .contains("deleted orphaned shard lease")
            .then_some(())
            .ok_or("not logged yet")
    })
    .await;
}

#[tokio::test]
async fn a_webhook_configuration_follows_its_ring_and_goes_with_it() {
    let mut w = World::new("mwc").await;
    w.add_shard("shard-a", 3600).await;
    w.start_reconciler().await;
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = configuration_name(&w.ring);
    let resources = |mwc: &MutatingWebhookConfiguration| -> BTreeSet<String> {
        mwc.webhooks
            .iter()
            .flatten()
            .flat_map(|h| h.rules.iter().flatten())
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect()
    };
    let created = eventually("webhook configuration created", WAIT, || async {
        mwcs.get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "absent".to_owned())
    })
    .await;
    assert_eq!(
        resources(&created),
        ["configmaps".to_owned(), "secrets".to_owned()].into()
    );
    let hook = &created.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(
            format!(
                "https://{}/webhooks/sharder/clusterring/{}",
                w.webhook_addr, w.ring
            )
            .as_str()
        )
    );
    assert_eq!(
        hook.namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone()),
        Some([(NAMESPACE_LABEL.to_owned(), w.ns.clone())].into())
    );

    // Status reflects the shards.
    let rings = Api::<ClusterRing>::all(w.client.clone());
    eventually("ring status", WAIT, || async {
        let ring = rings.get(&w.ring).await.map_err(|e| e.to_string())?;
        let status = ring.status.ok_or_else(|| "no status".to_owned())?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (status.available_shards == Some(1)
            && status.shards == Some(1)
            && ready
            && status.observed_generation == Some(1))
        .then_some(())
        .ok_or(format!("{status:?}"))
    })
    .await;

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

#[tokio::test]
async fn scale_out_drains_exactly_the_objects_that_move_and_nothing_else_is_written() {
    let mut w = World::new("scaleout").await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b", "shard-c"] {
        w.add_shard(shard, 3600).await;
    }
    let webhook = w.webhook().await;
    w.start_reconciler().await;
    w.wait_until_webhook_assigns().await;
    w.create_objects(150).await;

    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let four = Ring::new(["shard-a", "shard-b", "shard-c", "shard-d"]);
    let before = w.list_secrets().await;
    let children_before = w.list_children().await;
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

    w.add_shard("shard-d", 3600).await;
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
    for (name, child) in w.list_children().await {
        let owner = &child.owner_references()[0].name;
        let want = four.shard_for(&w.key(owner));
        if moving.contains(owner) {
            assert_eq!(
                w.shard_of(&child).as_deref(),
                want,
                "{name} follows its owner directly"
            );
        } else {
            assert_eq!(
                child.resource_version(),
                children_before[&name].resource_version(),
                "{name} was written but stays"
            );
        }
    }

    // The shards acknowledge; the webhook assigns the new shard in the same request.
    let acknowledged = w.acknowledge_drains().await;
    assert_eq!(acknowledged, moving.len());
    eventually(
        "every object on its desired shard, no drain label left",
        WAIT,
        || async {
            let now = w.list_secrets().await;
            let wrong: Vec<&String> = now
                .iter()
                .filter(|(n, s)| {
                    w.shard_of(*s).as_deref() != four.shard_for(&w.key(n)) || w.draining(*s)
                })
                .map(|(n, _)| n)
                .collect();
            wrong
                .is_empty()
                .then_some(())
                .ok_or(format!("{} objects not settled", wrong.len()))
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
        log.contains("draining") && log.contains("reason=drain"),
        "moves are logged:\n{log}"
    );

    // Writes, from the apiserver's audit log: the reconciler wrote once per drained object and
    // once per child following its owner, nothing for objects that stay; with the shard's
    // acknowledgement that is 2 writes per object moved off a live shard.
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
    for (name, child) in w.list_children().await {
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
    webhook.stop().await;
}

#[tokio::test]
async fn a_dead_shards_objects_move_directly_and_missed_objects_are_swept() {
    let mut w = World::new("dead").await;
    w.create_ring().await;
    for shard in ["shard-a", "shard-b"] {
        w.add_shard(shard, 3600).await;
    }
    w.add_shard("mortal", 2).await;
    let webhook = w.webhook().await;
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
            let children = w.list_children().await;
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
    for (name, child) in w.list_children().await {
        let owner = &child.owner_references()[0].name;
        assert_eq!(
            w.shard_of(&child).as_deref(),
            two.shard_for(&w.key(owner)),
            "{name} follows its owner"
        );
    }
    assert!(w.reconciler_log(0).contains("reason=dead-shard"));
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
    webhook.stop().await;
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
    w.add_shard("shard-c", 3600).await;
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

    let mut w = World::new("scope").await;
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
    w.add_shard("shard-a", 3600).await;
    w.add_shard("shard-b", 3600).await;
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

#[tokio::test]
async fn a_standby_reconciler_takes_over_when_the_leader_is_killed() {
    let mut w = World::new("failover").await;
    w.add_shard("shard-a", 3600).await;
    w.start_reconciler().await;
    w.start_reconciler().await;
    let leader_lease = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let leader = eventually("a leader is elected", WAIT, || async {
        let l = leader_lease
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        l.spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
            .ok_or("no holder".to_owned())
    })
    .await;
    let index: usize = leader
        .trim_start_matches("replica-")
        .parse()
        .expect("replica index");
    w.reconcilers[index].0.kill();

    let standby = format!("replica-{}", 1 - index);
    eventually("the standby leads", WAIT, || async {
        let l = leader_lease
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        (l.spec.and_then(|s| s.holder_identity).as_deref() == Some(standby.as_str()))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    // The next change is handled by the new leader.
    w.create_ring().await;
    let mwcs = Api::<MutatingWebhookConfiguration>::all(w.client.clone());
    let name = configuration_name(&w.ring);
    eventually("the new leader configures the new ring", WAIT, || async {
        mwcs.get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or_else(|| "absent".to_owned())
    })
    .await;
    assert!(w.reconciler_log(1 - index).contains("leading"));
}

#[tokio::test]
async fn sigterm_releases_leadership_and_the_standby_takes_over() {
    let mut w = World::new("handover").await;
    w.start_reconciler().await;
    let leases = Api::<Lease>::namespaced(w.client.clone(), &w.ns);
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    eventually("replica-0 leads", WAIT, || async {
        let l = leases
            .get("sharder-reconciler")
            .await
            .map_err(|e| e.to_string())?;
        (holder(&l) == "replica-0")
            .then_some(())
            .ok_or_else(|| holder(&l))
    })
    .await;
    w.start_reconciler().await;
    w.reconcilers[0]
        .0
        .signal(nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    let status = w.reconcilers[0]
        .0
        .wait_timeout(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(w.reconciler_log(0).contains("lease released"));
    eventually(
        "replica-1 leads without waiting for expiry",
        Duration::from_secs(10),
        || async {
            let l = leases
                .get("sharder-reconciler")
                .await
                .map_err(|e| e.to_string())?;
            (holder(&l) == "replica-1")
                .then_some(())
                .ok_or_else(|| holder(&l))
        },
    )
    .await;
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for index in 0..self.reconcilers.len() {
                let log = self.reconciler_log(index);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- reconciler {index} log (last 40 lines) ---");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
