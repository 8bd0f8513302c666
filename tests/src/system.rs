//! The whole system as real processes on the shared control plane, for end-to-end tests: webhook
//! replicas behind a TCP proxy (the Service), reconciler replicas, example shards
//! (`checksum-controller`) recording every reconcile, one ClusterRing over a test namespace, and a
//! monitor of how long objects stay unassigned.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nix::sys::signal::Signal;
use serde_json::json;
use sharder_common::labels::RING_LABEL;
use sharder_common::lease::shard_state;
use sharder_common::{ClusterRing, ObjectKey, Ring, RingLabels};
use sharder_example::{checksums, configmap_name};
use tokio::task::JoinHandle;

use crate::binaries::binary;
use crate::certs::TestCa;
use crate::control_plane::NAMESPACE_LABEL;
use crate::crd::install_cluster_ring_crd;
use crate::fixtures::{loopback_addr, secrets_ring};
use crate::ownership::{self, Report};
use crate::proxy::Proxy;
use crate::wait::{eventually, http_get};
use crate::{ControlPlane, Supervised};

/// How long waits for the system to act may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// The shape of a system.
#[derive(Clone, Debug)]
pub struct Options {
    /// Example shards started at first (`shard-0`, `shard-1`, ...).
    pub shards: usize,
    /// The shards' `--lease-duration` in seconds.
    pub lease_seconds: u64,
    /// Webhook replicas behind the proxy.
    pub webhooks: usize,
    /// Reconciler replicas.
    pub reconcilers: usize,
    /// The reconciler's `--sweep-interval` in seconds.
    pub sweep_seconds: u64,
    /// Simulated work per reconcile, in milliseconds.
    pub reconcile_delay_ms: u64,
    /// Use this existing namespace (default: a new one).
    pub namespace: Option<String>,
    /// Create the ClusterRing (named after the namespace, selecting it); `false` when something
    /// else (the Helm chart) created it.
    pub create_ring: bool,
    /// The webhook's kubeconfig (default: the admin's).
    pub webhook_kubeconfig: Option<PathBuf>,
    /// The reconciler's kubeconfig (default: the admin's).
    pub reconciler_kubeconfig: Option<PathBuf>,
    /// The reconciler's `--namespace` (its leader election Lease; default: the test namespace).
    pub reconciler_namespace: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            shards: 3,
            lease_seconds: 3,
            webhooks: 1,
            reconcilers: 1,
            sweep_seconds: 1,
            reconcile_delay_ms: 20,
            namespace: None,
            create_ring: true,
            webhook_kubeconfig: None,
            reconciler_kubeconfig: None,
            reconciler_namespace: None,
        }
    }
}

impl Options {
    /// The bound on how long any object may stay unassigned: the sweep interval, plus time for
    /// a slow list and write on a busy machine.
    pub fn unassigned_bound(&self) -> Duration {
        Duration::from_secs(self.sweep_seconds + 10)
    }
}

/// Unix time in nanoseconds.
pub fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// Objects unassigned now (uid -> since when), and the longest unassigned period that ended.
#[derive(Debug, Default)]
struct Unassigned {
    open: BTreeMap<String, Instant>,
    longest_closed: Duration,
}

type Sightings = Arc<Mutex<Unassigned>>;

/// Writes to the test namespace's Secrets.
#[derive(Clone)]
pub struct Objects(Api<Secret>);

impl Objects {
    /// Creates Secret `name` with `value` under key `value`.
    pub async fn create_secret(&self, name: &str, value: &str) -> Result<Secret, kube::Error> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "value".to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        self.0.create(&PostParams::default(), &secret).await
    }

    /// Sets Secret `name`'s value (its checksum changes).
    pub async fn update_secret(&self, name: &str, value: &str) -> Result<(), kube::Error> {
        let patch = json!({ "data": { "value": ByteString(value.as_bytes().to_vec()) } });
        self.0
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Deletes Secret `name` (its ConfigMap is garbage-collected).
    pub async fn delete_secret(&self, name: &str) -> Result<(), kube::Error> {
        self.0
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ())
    }
}

/// The running system of one test.
pub struct System {
    /// The control plane.
    pub cp: &'static ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The test namespace (also the ring's name).
    pub ns: String,
    /// The ClusterRing's name.
    pub ring: String,
    /// The ring's label keys.
    pub labels: RingLabels,
    /// The options it was started with.
    pub options: Options,
    dir: tempfile::TempDir,
    webhook_addrs: Vec<SocketAddr>,
    webhooks: Vec<Option<Supervised>>,
    proxy: Proxy,
    reconcilers: Vec<Option<Supervised>>,
    shards: BTreeMap<String, Supervised>,
    ended: BTreeMap<String, u128>,
    unassigned: Sightings,
    monitor: JoinHandle<()>,
    probes: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl System {
    /// Starts everything: webhooks, the ring, reconcilers, shards; returns once a new object is
    /// assigned by the webhook.
    pub async fn start(prefix: &str, options: Options) -> Self {
        let cp = ControlPlane::shared().await.expect("control plane");
        let client = cp.client().await.expect("client");
        install_cluster_ring_crd(&client).await.expect("CRD");
        let ns = match &options.namespace {
            Some(ns) => ns.clone(),
            None => cp.namespace(prefix).await.expect("namespace"),
        };
        let dir = tempfile::tempdir().expect("dir");
        let ca = TestCa::new("e2e-ca").expect("ca");
        let cert = ca.serving_cert("webhook").expect("cert");
        std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem).expect("cert");
        std::fs::write(dir.path().join("tls.key"), &cert.key_pem).expect("key");
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("ca");
        let webhook_addrs: Vec<_> = (0..options.webhooks).map(|_| loopback_addr()).collect();
        let proxy = Proxy::start(webhook_addrs.clone()).await.expect("proxy");
        let unassigned = Sightings::default();
        let monitor = tokio::spawn(monitor(
            client.clone(),
            ns.clone(),
            RingLabels::new(&ns),
            Arc::clone(&unassigned),
        ));
        let mut system = Self {
            cp,
            client,
            ring: ns.clone(),
            labels: RingLabels::new(&ns),
            ns,
            options,
            dir,
            webhook_addrs,
            webhooks: Vec::new(),
            proxy,
            reconcilers: Vec::new(),
            shards: BTreeMap::new(),
            ended: BTreeMap::new(),
            unassigned,
            monitor,
            probes: 0,
        };
        for i in 0..system.options.webhooks {
            system.webhooks.push(None);
            system.start_webhook(i).await;
        }
        if system.options.create_ring {
            Api::<ClusterRing>::all(system.client.clone())
                .create(
                    &PostParams::default(),
                    &secrets_ring(&system.ring, Some(&system.ns)),
                )
                .await
                .expect("ring");
        }
        for i in 0..system.options.reconcilers {
            system.reconcilers.push(None);
            system.start_reconciler(i);
        }
        for i in 0..system.options.shards {
            system.start_shard(&format!("shard-{i}")).await;
        }
        system.wait_until_webhook_assigns().await;
        system
    }

    fn log_file(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log file")
    }

    fn spawn(&self, name: &str, kubeconfig: Option<&PathBuf>, mut command: Command) -> Supervised {
        let log = self.log_file(name);
        command
            .env(
                "KUBECONFIG",
                kubeconfig.map_or_else(|| self.cp.kubeconfig(), PathBuf::as_path),
            )
            .env("NO_COLOR", "1")
            .args(["--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        Supervised::spawn(name, command).expect("spawn")
    }

    /// The folder holding the logs (`<process>.log`) and reconcile records.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The log of process `name` (`webhook-0`, `reconciler-1`, `shard-2`, ...).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Starts (or restarts) webhook replica `i` and waits until it is ready.
    pub async fn start_webhook(&mut self, i: usize) {
        let admin = loopback_addr();
        let mut command = Command::new(binary("sharder-webhook").expect("binary"));
        command
            .args(["--listen-addr", &self.webhook_addrs[i].to_string()])
            .args(["--admin-addr", &admin.to_string()])
            .arg("--tls-cert-file")
            .arg(self.dir.path().join("tls.crt"))
            .arg("--tls-key-file")
            .arg(self.dir.path().join("tls.key"));
        let kubeconfig = self.options.webhook_kubeconfig.as_ref();
        self.webhooks[i] = Some(self.spawn(&format!("webhook-{i}"), kubeconfig, command));
        eventually("webhook ready", WAIT, || async {
            match http_get(admin, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    /// Kills webhook replica `i` (SIGKILL).
    pub fn kill_webhook(&mut self, i: usize) {
        if let Some(mut webhook) = self.webhooks[i].take() {
            webhook.kill();
        }
    }

    /// Whether webhook replica `i` runs.
    pub fn webhook_running(&self, i: usize) -> bool {
        self.webhooks[i].is_some()
    }

    /// Starts (or restarts) reconciler replica `i` (identity `replica-<i>`).
    pub fn start_reconciler(&mut self, i: usize) {
        let mut command = Command::new(binary("sharder-reconciler").expect("binary"));
        let namespace = self.reconciler_namespace().to_owned();
        command
            .args(["--namespace", &namespace])
            .args(["--identity", &format!("replica-{i}")])
            .args([
                "--leader-election-duration",
                "3s",
                "--leader-election-renew",
                "500ms",
            ])
            .args(["--webhook-url", &format!("https://{}", self.proxy.addr())])
            .arg("--webhook-ca-file")
            .arg(self.dir.path().join("ca.crt"))
            .args([
                "--sweep-interval",
                &format!("{}s", self.options.sweep_seconds),
                "--drain-check-interval",
                "500ms",
            ])
            .args([
                "--clusterring-selector",
                &format!("{NAMESPACE_LABEL}={}", self.ns),
            ])
            .args(["--admin-addr", &loopback_addr().to_string()]);
        let kubeconfig = self.options.reconciler_kubeconfig.as_ref();
        self.reconcilers[i] = Some(self.spawn(&format!("reconciler-{i}"), kubeconfig, command));
    }

    /// Kills reconciler replica `i` (SIGKILL).
    pub fn kill_reconciler(&mut self, i: usize) {
        if let Some(mut reconciler) = self.reconcilers[i].take() {
            reconciler.kill();
        }
    }

    /// Whether reconciler replica `i` runs.
    pub fn reconciler_running(&self, i: usize) -> bool {
        self.reconcilers[i].is_some()
    }

    fn reconciler_namespace(&self) -> &str {
        self.options
            .reconciler_namespace
            .as_deref()
            .unwrap_or(&self.ns)
    }

    /// The replica index holding the reconciler's leader Lease, once one does.
    pub async fn leader(&self) -> usize {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), self.reconciler_namespace());
        eventually("a reconciler leads", WAIT, || async {
            let lease = leases
                .get("sharder-reconciler")
                .await
                .map_err(|e| e.to_string())?;
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            holder
                .strip_prefix("replica-")
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|i| self.reconcilers.get(*i).is_some_and(Option::is_some))
                .ok_or_else(|| format!("holder {holder:?}"))
        })
        .await
    }

    fn record_file(&self, shard: &str) -> PathBuf {
        self.dir.path().join(format!("records-{shard}.jsonl"))
    }

    /// Starts example shard `name` and waits until it holds its Lease.
    pub async fn start_shard(&mut self, name: &str) {
        let mut command = Command::new(binary("checksum-controller").expect("binary"));
        command
            .args(["--clusterring", &self.ring])
            .args(["--shard-name", name])
            .args(["--lease-namespace", &self.ns, "--namespace", &self.ns])
            .args([
                "--lease-duration",
                &format!("{}s", self.options.lease_seconds),
                "--lease-renew",
                "500ms",
            ])
            .args([
                "--reconcile-delay",
                &format!("{}ms", self.options.reconcile_delay_ms),
            ])
            .arg("--record-file")
            .arg(self.record_file(name))
            .args(["--admin-addr", &loopback_addr().to_string()]);
        let process = self.spawn(name, None, command);
        self.shards.insert(name.to_owned(), process);
        self.ended.remove(name);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        eventually(&format!("{name} holds its lease"), WAIT, || async {
            let lease = leases.get(name).await.map_err(|e| e.to_string())?;
            let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
            (holder.as_deref() == Some(name))
                .then_some(())
                .ok_or_else(|| format!("holder {holder:?}"))
        })
        .await;
    }

    /// Stops shard `name` gracefully (SIGTERM) and waits for it to exit; returns whether it
    /// exited successfully.
    pub fn stop_shard(&mut self, name: &str) -> bool {
        let Some(mut shard) = self.shards.remove(name) else {
            return false;
        };
        let status = shard.stop(Duration::from_secs(30));
        self.ended.insert(name.to_owned(), unix_nanos());
        status.is_some_and(|s| s.success())
    }

    /// Kills shard `name` (SIGKILL, a crash: its Lease is not released).
    pub fn kill_shard(&mut self, name: &str) {
        if let Some(mut shard) = self.shards.remove(name) {
            let _ = shard.signal(Signal::SIGKILL);
            shard.kill();
            self.ended.insert(name.to_owned(), unix_nanos());
        }
    }

    /// The names of the running shards.
    pub fn running_shards(&self) -> Vec<String> {
        self.shards.keys().cloned().collect()
    }

    /// The shard Leases of the ring.
    pub async fn shard_leases(&self) -> BTreeMap<String, Lease> {
        Api::<Lease>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels(&format!("{RING_LABEL}={}", self.ring)))
            .await
            .expect("leases")
            .items
            .into_iter()
            .map(|l| (l.name_any(), l))
            .collect()
    }

    /// The ring the reconciler should have converged to: the available shard Leases.
    pub async fn desired_ring(&self) -> Ring {
        let now = Timestamp::now();
        Ring::new(
            self.shard_leases()
                .await
                .into_iter()
                .filter(|(_, l)| shard_state(l, now).state.is_available())
                .map(|(name, _)| name),
        )
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A handle for writing the namespace's Secrets, usable beside the system (e.g. a churn task).
    pub fn objects(&self) -> Objects {
        Objects(self.secrets())
    }

    /// Creates Secret `name` with `value` under key `value`.
    pub async fn create_secret(&self, name: &str, value: &str) -> Result<Secret, kube::Error> {
        self.objects().create_secret(name, value).await
    }

    /// Creates Secrets `object-<i>` for `range`.
    pub async fn create_secrets(&self, range: std::ops::Range<usize>) {
        for i in range {
            self.create_secret(&format!("object-{i}"), &format!("{i}-0"))
                .await
                .expect("secret");
        }
    }

    /// Deletes Secret `name` (its ConfigMap is garbage-collected).
    pub async fn delete_secret(&self, name: &str) -> Result<(), kube::Error> {
        self.objects().delete_secret(name).await
    }

    /// The test's Secrets (`object-*`) by name.
    pub async fn list_secrets(&self) -> BTreeMap<String, Secret> {
        self.secrets()
            .list(&ListParams::default())
            .await
            .expect("secrets")
            .items
            .into_iter()
            .filter(|s| s.name_any().starts_with("object-"))
            .map(|s| (s.name_any(), s))
            .collect()
    }

    /// The shard label of `object`.
    pub fn shard_of<K: kube::Resource>(&self, object: &K) -> Option<String> {
        self.labels
            .shard_of(kube::ResourceExt::labels(object))
            .map(str::to_owned)
    }

    /// Whether `object` carries the drain label.
    pub fn draining<K: kube::Resource>(&self, object: &K) -> bool {
        self.labels.is_draining(kube::ResourceExt::labels(object))
    }

    /// How many Secrets each shard holds (`-` for unassigned).
    pub async fn holdings(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for secret in self.list_secrets().await.values() {
            let shard = self.shard_of(secret).unwrap_or_else(|| "-".to_owned());
            *counts.entry(shard).or_default() += 1;
        }
        counts
    }

    /// Checks the converged state: the available shards are the running ones (crashes
    /// detected), every Secret on its desired shard, nothing draining, and its ConfigMap present
    /// on the same shard with the checksums of its current data.
    pub async fn converged(&self) -> Result<(), String> {
        let ring = self.desired_ring().await;
        let running = self.running_shards();
        if ring.shards() != running.as_slice() {
            return Err(format!(
                "available shards {:?}, running {running:?}",
                ring.shards()
            ));
        }
        let configmaps: BTreeMap<String, ConfigMap> = self
            .configmaps()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
        let mut problems = Vec::new();
        for (name, secret) in self.list_secrets().await {
            let key = ObjectKey::main("", "Secret", Some(&self.ns), &name).ok_or("key")?;
            let want = ring.shard_for(key.as_str()).map(str::to_owned);
            let have = self.shard_of(&secret);
            if have != want {
                problems.push(format!("{name} on {have:?}, want {want:?}"));
            }
            if self.draining(&secret) {
                problems.push(format!("{name} still draining"));
            }
            match configmaps.get(&configmap_name(&name)) {
                None => problems.push(format!("{name} has no checksums")),
                Some(cm) => {
                    if cm.data.clone().unwrap_or_default() != checksums(&secret) {
                        problems.push(format!("{name}'s checksums are stale"));
                    }
                    if self.shard_of(cm) != have {
                        problems.push(format!(
                            "{name}'s checksums on {:?}, owner on {have:?}",
                            self.shard_of(cm)
                        ));
                    }
                    if self.draining(cm) {
                        problems.push(format!("{name}'s checksums draining"));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            let n = problems.len();
            problems.truncate(5);
            Err(format!("{n} problems, e.g. {problems:?}"))
        }
    }

    /// Waits until [`converged`](Self::converged).
    pub async fn wait_converged(&self, what: &str) {
        eventually(what, WAIT, || self.converged()).await;
    }

    /// Waits until the webhook assigns new objects of the namespace (a probe is labelled).
    pub async fn wait_until_webhook_assigns(&mut self) {
        let mut attempt = self.probes;
        self.probes += 1000;
        let this = &*self;
        eventually("the webhook assigns new objects", WAIT, || {
            attempt += 1;
            let name = format!("probe-{attempt}");
            async move {
                let created = this
                    .create_secret(&name, "probe")
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = this.delete_secret(&name).await;
                this.shard_of(&created)
                    .ok_or_else(|| "not labelled".to_owned())
            }
        })
        .await;
    }

    /// The ownership report from every shard's records so far.
    pub fn ownership(&self) -> Report {
        let mut lines = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "jsonl") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    lines.extend(sharder_example::record::parse(&text));
                }
            }
        }
        ownership::check(&lines, &self.ended, unix_nanos())
    }

    /// The longest time any object of the namespace stayed unassigned (so far).
    pub fn longest_unassigned(&self) -> Duration {
        let now = Instant::now();
        let unassigned = lock(&self.unassigned);
        unassigned
            .open
            .values()
            .map(|since| now - *since)
            .fold(unassigned.longest_closed, Duration::max)
    }

    /// Asserts the ownership invariant: no object reconciled by two shards at overlapping
    /// times, none unassigned longer than the stated bound. Returns the report.
    pub fn assert_single_ownership(&self) -> Report {
        let report = self.ownership();
        assert!(
            report.overlaps.is_empty(),
            "{} overlapping reconciles, first: {:?}",
            report.overlaps.len(),
            report.overlaps.first()
        );
        let longest = self.longest_unassigned();
        let bound = self.options.unassigned_bound();
        assert!(
            longest <= bound,
            "an object stayed unassigned for {longest:?} (bound {bound:?})"
        );
        eprintln!(
            "ownership: {} reconciles of {} objects, {} reconciled by more than one shard over time, no overlap; longest unassigned {longest:?} (bound {bound:?})",
            report.total(),
            report.reconciles.len(),
            report.objects_with_several_shards()
        );
        report
    }

    /// Which shards ever reconciled `object` (`namespace/name`).
    pub fn reconcilers_of(&self, report: &Report, name: &str) -> BTreeSet<String> {
        report
            .reconciles
            .get(&format!("{}/{name}", self.ns))
            .into_iter()
            .flatten()
            .map(|i| i.shard.clone())
            .collect()
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.monitor.abort();
        if std::thread::panicking() {
            let mut names: Vec<String> = Vec::new();
            names.extend((0..self.webhooks.len()).map(|i| format!("webhook-{i}")));
            names.extend((0..self.reconcilers.len()).map(|i| format!("reconciler-{i}")));
            if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
                for entry in entries.flatten() {
                    let file = entry.file_name().to_string_lossy().into_owned();
                    if let Some(shard) = file.strip_suffix(".log")
                        && shard.starts_with("shard-")
                    {
                        names.push(shard.to_owned());
                    }
                }
            }
            for name in names {
                let log = self.log(&name);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("----- {name} (last 40 lines) -----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Every 200 ms: notes when each object of `ns` (Secret or ConfigMap) is seen without a shard
/// label and when that ends (labelled or gone).
async fn monitor(client: Client, ns: String, labels: RingLabels, sightings: Sightings) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    loop {
        let mut seen: Vec<(String, bool)> = Vec::new();
        if let Ok(list) = secrets.list_metadata(&ListParams::default()).await {
            seen.extend(list.items.iter().map(|o| {
                (
                    o.uid().unwrap_or_default(),
                    o.labels().contains_key(&labels.shard),
                )
            }));
        }
        if let Ok(list) = configmaps.list_metadata(&ListParams::default()).await {
            seen.extend(
                list.items
                    .iter()
                    .filter(|o| o.name_any().starts_with("checksums-"))
                    .map(|o| {
                        (
                            o.uid().unwrap_or_default(),
                            o.labels().contains_key(&labels.shard),
                        )
                    }),
            );
        }
        let now = Instant::now();
        {
            let mut sightings = lock(&sightings);
            let present: BTreeSet<&String> = seen.iter().map(|(uid, _)| uid).collect();
            let mut ended: Vec<String> = sightings
                .open
                .keys()
                .filter(|uid| !present.contains(uid))
                .cloned()
                .collect();
            for (uid, assigned) in &seen {
                if *assigned {
                    ended.push(uid.clone());
                } else {
                    sightings.open.entry(uid.clone()).or_insert(now);
                }
            }
            for uid in ended {
                if let Some(since) = sightings.open.remove(&uid) {
                    sightings.longest_closed = sightings.longest_closed.max(now - since);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
