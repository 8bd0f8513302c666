//! The whole system as real processes on the shared control plane, for end-to-end tests and the
//! demo: webhook replicas behind a TCP proxy (the Service), reconciler replicas, example shards
//! (`checksum-controller`) recording every reconcile, one ControllerRing (or ClusterRing) over a
//! test namespace, and a history of every version of its objects (how long they stay
//! unassigned, whether children run ahead of their owners). Built on [`World`]; every process is
//! started through the launchers of `sharder_harness::launch`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nix::sys::signal::Signal;
use serde_json::json;
use sharder_common::{ObjectKey, Ring, RingKind};
use sharder_example::{checksums, configmap_name};
use sharder_runtime::lease::LEASE_LOST_EXIT_STATUS;

use crate::history::History;
use crate::ownership::{self, Report};
use sharder_harness::launch::{Env, Reconciler, Shard, ShardFlags, Webhook};
use sharder_harness::proxy::Proxy;
use sharder_harness::wait::eventually;
pub use sharder_harness::world::WAIT;
use sharder_harness::world::World;

/// The shape of a system.
#[derive(Clone, Debug)]
pub struct Options {
    /// Example shards started at first (`shard-0`, `shard-1`, ...).
    pub shards: usize,
    /// The shards' `--lease-duration` in seconds (renewed every 0.5 s). The default, 5, gives a
    /// renewal 4.5 s to be answered: with 3, beside two CPU hogs and the rest of the suite, a
    /// shard gave its Lease up (rightly) during a test's setup.
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
    /// The ring's kind: ControllerRing, the reference's current contract, unless a test needs
    /// the ClusterRing.
    pub kind: RingKind,
    /// Create the ring (named after the namespace, selecting it); `false` when something else
    /// (the Helm chart) created it.
    pub create_ring: bool,
    /// The webhook's kubeconfig (default: the admin's).
    pub webhook_kubeconfig: Option<PathBuf>,
    /// The reconciler's kubeconfig (default: the admin's).
    pub reconciler_kubeconfig: Option<PathBuf>,
    /// The reconciler's `--namespace` (its leader election Lease; default: the test namespace).
    pub reconciler_namespace: Option<String>,
    /// Run the reconciler and the shards as ServiceAccounts of the test namespace (bound to
    /// cluster-admin), so the audit log tells their writes apart:
    /// [`RECONCILER_ACCOUNT`] and [`SHARD_ACCOUNT`].
    pub service_accounts: bool,
    /// More flags for the reconciler replicas (replacing the harness's own value of a flag).
    pub reconciler_extra: Vec<(String, String)>,
    /// Run on this control plane instead of the shared one (for a test that disturbs it).
    pub control_plane: Option<&'static sharder_harness::ControlPlane>,
}

/// The reconciler's ServiceAccount with [`Options::service_accounts`].
pub const RECONCILER_ACCOUNT: &str = "sharder-reconciler";

/// The shards' ServiceAccount with [`Options::service_accounts`].
pub const SHARD_ACCOUNT: &str = "shards";

impl Default for Options {
    fn default() -> Self {
        Self {
            shards: 3,
            lease_seconds: 5,
            webhooks: 1,
            reconcilers: 1,
            sweep_seconds: 1,
            reconcile_delay_ms: 20,
            namespace: None,
            kind: RingKind::ControllerRing,
            create_ring: true,
            webhook_kubeconfig: None,
            reconciler_kubeconfig: None,
            reconciler_namespace: None,
            service_accounts: false,
            reconciler_extra: Vec::new(),
            control_plane: None,
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

/// Writes to the test namespace's Secrets.
#[derive(Clone)]
pub struct Objects(Api<Secret>);

impl Objects {
    /// Writes through `secrets`.
    pub fn new(secrets: Api<Secret>) -> Self {
        Self(secrets)
    }

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
    /// The world (namespace, ring, files, helpers).
    pub world: World,
    /// The options it was started with.
    pub options: Options,
    proxy: Proxy,
    webhooks: Vec<Option<Webhook>>,
    reconcilers: Vec<Option<Reconciler>>,
    shards: BTreeMap<String, Shard>,
    lives: ownership::Lives,
    blind: Vec<(u128, u128)>,
    history: History,
    reconciler_env: Env,
    shard_env: Env,
    _machine: tokio::sync::RwLockReadGuard<'static, ()>,
}

impl Deref for System {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl DerefMut for System {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.world
    }
}

impl System {
    /// Starts everything: webhooks, the ring, reconcilers, shards; returns once a new object is
    /// assigned by the webhook (with no shard, at once: start shards, then wait for it).
    pub async fn start(prefix: &str, options: Options) -> Self {
        let machine = crate::MACHINE.read().await;
        let cp = match options.control_plane {
            Some(cp) => cp,
            None => sharder_harness::ControlPlane::shared()
                .await
                .expect("control plane"),
        };
        let ns = match &options.namespace {
            Some(ns) => ns.clone(),
            None => cp.namespace(prefix).await.expect("namespace"),
        };
        let world = World::in_namespace(cp, ns).await.with_kind(options.kind);
        let proxy = Proxy::start(options.webhooks).await.expect("proxy");
        let history = History::start(&world.client, &world.ns, &world.labels);
        let (reconciler_env, shard_env) = if options.service_accounts {
            (
                world.service_account_env(RECONCILER_ACCOUNT).await,
                world.service_account_env(SHARD_ACCOUNT).await,
            )
        } else {
            let env = |kubeconfig: Option<&PathBuf>| match kubeconfig {
                Some(kubeconfig) => Env::new(world.dir(), kubeconfig),
                None => world.admin_env(),
            };
            (
                env(options.reconciler_kubeconfig.as_ref()),
                world.admin_env(),
            )
        };
        let mut system = Self {
            world,
            options,
            proxy,
            webhooks: Vec::new(),
            reconcilers: Vec::new(),
            shards: BTreeMap::new(),
            lives: ownership::Lives::new(),
            blind: Vec::new(),
            history,
            reconciler_env,
            shard_env,
            _machine: machine,
        };
        for i in 0..system.options.webhooks {
            system.webhooks.push(None);
            system.start_webhook(i).await;
        }
        if system.options.create_ring {
            system.create_ring().await;
        }
        for i in 0..system.options.reconcilers {
            system.reconcilers.push(None);
            system.start_reconciler(i).await;
        }
        for i in 0..system.options.shards {
            system.start_shard(&format!("shard-{i}")).await;
        }
        if system.options.shards > 0 {
            system.wait_until_webhook_assigns().await;
        }
        system
    }

    fn env(&self, kubeconfig: Option<&PathBuf>) -> Env {
        match kubeconfig {
            Some(kubeconfig) => Env::new(self.dir(), kubeconfig),
            None => self.admin_env(),
        }
    }

    /// Starts (or restarts) webhook replica `i` and waits until it is ready; the proxy sends
    /// connections to it.
    pub async fn start_webhook(&mut self, i: usize) {
        let env = self.env(self.options.webhook_kubeconfig.as_ref());
        let webhook = self
            .world
            .start_webhook(&format!("webhook-{i}"), &env, &[])
            .await;
        self.proxy.set_backend(i, Some(webhook.addr));
        self.webhooks[i] = Some(webhook);
    }

    /// Kills webhook replica `i` (SIGKILL).
    pub fn kill_webhook(&mut self, i: usize) {
        if let Some(mut webhook) = self.webhooks[i].take() {
            webhook.process.kill();
        }
    }

    /// Blackholes the webhook Service (`true`: the apiserver's calls are accepted and never
    /// answered, a hung webhook) or heals it.
    pub fn blackhole_webhooks(&self, on: bool) {
        self.proxy.blackhole(on);
    }

    /// Whether webhook replica `i` runs.
    pub fn webhook_running(&self, i: usize) -> bool {
        self.webhooks[i].is_some()
    }

    /// Starts (or restarts) reconciler replica `i` (identity `replica-<i>`).
    pub async fn start_reconciler(&mut self, i: usize) {
        let env = self.reconciler_env.clone();
        let mut flags = self.world.reconciler_flags(
            &format!("replica-{i}"),
            self.reconciler_namespace(),
            &format!("https://{}", self.proxy.addr()),
            Duration::from_secs(self.options.sweep_seconds),
        );
        // The label guard (on by default) lets the shards acknowledge their drains: they run
        // outside pods, so no token names a shard, and they share one identity (the admin's,
        // as the harness's flags have it, unless they run as their ServiceAccount).
        if self.options.service_accounts {
            flags.set(
                "--label-guard-acknowledgers",
                &self.service_account(SHARD_ACCOUNT),
            );
        }
        for (flag, value) in &self.options.reconciler_extra {
            flags.set(flag, value);
        }
        let reconciler = self
            .world
            .start_reconciler(&format!("reconciler-{i}"), &env, &flags)
            .await;
        self.reconcilers[i] = Some(reconciler);
    }

    /// The metrics (Prometheus text) of reconciler replica `i`; empty when it does not run or
    /// answer.
    pub async fn reconciler_metrics(&self, i: usize) -> String {
        match &self.reconcilers[i] {
            Some(reconciler) => reconciler.metrics().await,
            None => String::new(),
        }
    }

    /// Kills reconciler replica `i` (SIGKILL).
    pub fn kill_reconciler(&mut self, i: usize) {
        if let Some(mut reconciler) = self.reconcilers[i].take() {
            reconciler.process.kill();
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
            .unwrap_or(&self.world.ns)
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
        self.dir().join(format!("records-{shard}.jsonl"))
    }

    /// The flags of example shard `name` in this system.
    pub fn shard_flags(&self, name: &str) -> ShardFlags {
        ShardFlags {
            ring: self.id(),
            name: name.to_owned(),
            namespace: self.ns.clone(),
            lease_duration: Duration::from_secs(self.options.lease_seconds),
            lease_renew: Duration::from_millis(500),
            reconcile_delay: Duration::from_millis(self.options.reconcile_delay_ms),
            record_file: Some(self.record_file(name)),
            extra: Vec::new(),
        }
    }

    /// Starts example shard `name` and waits until it holds its Lease.
    pub async fn start_shard(&mut self, name: &str) {
        let flags = self.shard_flags(name);
        self.start_shard_with(flags).await;
    }

    /// Starts an example shard with `flags` and waits until it holds its Lease.
    pub async fn start_shard_with(&mut self, flags: ShardFlags) {
        let env = self.shard_env.clone();
        self.start_shard_as(flags, &env).await;
    }

    /// Starts an example shard with `flags` in `env` (its own credentials or network) and waits
    /// until it holds its Lease.
    pub async fn start_shard_as(&mut self, flags: ShardFlags, env: &Env) {
        let name = flags.name.clone();
        let started = unix_nanos();
        let mut shard = Shard::start(env, &flags).await.expect("shard");
        shard
            .process
            .wait_ready(shard.admin)
            .await
            .expect("the shard holds its lease");
        self.shards.insert(name.clone(), shard);
        self.lives.entry(name).or_default().push((started, None));
    }

    /// Records that shard `name`'s current run ended now.
    fn ended(&mut self, name: &str) {
        let now = unix_nanos();
        let run = self.lives.get_mut(name).and_then(|runs| runs.last_mut());
        if let Some((_, end @ None)) = run {
            *end = Some(now);
        }
    }

    /// Declares that the object history may miss versions from `from` to `to` (Unix
    /// nanoseconds: a control plane restart breaks its watches): records it cannot place are
    /// allowed in that window, and fail the ownership assertion anywhere else.
    pub fn history_blind(&mut self, from: u128, to: u128) {
        self.blind.push((from, to));
    }

    /// Stops shard `name` gracefully (SIGTERM) and waits for it to exit; returns whether it
    /// exited successfully.
    pub fn stop_shard(&mut self, name: &str) -> bool {
        let Some(mut shard) = self.shards.remove(name) else {
            return false;
        };
        let status = shard.process.stop(Duration::from_secs(30));
        self.ended(name);
        status.is_some_and(|s| s.success())
    }

    /// What running shard `name`'s `/metrics` answer now (`None`: it does not run).
    pub async fn shard_metrics(&self, name: &str) -> Option<String> {
        let shard = self.shards.get(name)?;
        Some(sharder_harness::launch::metrics(shard.admin).await)
    }

    /// Kills shard `name` (SIGKILL, a crash: its Lease is not released).
    pub fn kill_shard(&mut self, name: &str) {
        if let Some(mut shard) = self.shards.remove(name) {
            let _ = shard.process.signal(Signal::SIGKILL);
            shard.process.kill();
            self.ended(name);
        }
    }

    /// Waits until shard `name` exits by itself (its Lease lost), at most `timeout`; records the
    /// moment it was seen gone as its end and returns its exit status.
    pub async fn wait_shard_exit(&mut self, name: &str, timeout: Duration) -> ExitStatus {
        let shard = self.shards.get_mut(name).expect("a running shard");
        let status = eventually(&format!("{name} exits"), timeout, || {
            std::future::ready(shard.process.try_wait().ok_or("still running"))
        })
        .await;
        self.shards.remove(name);
        self.ended(name);
        status
    }

    /// The processes of the system that exited by themselves (a component that had to be
    /// restarted), with their exit status.
    pub fn exited(&mut self) -> Vec<String> {
        let mut exited = Vec::new();
        let processes = self
            .webhooks
            .iter_mut()
            .enumerate()
            .filter_map(|(i, w)| w.as_mut().map(|w| (format!("webhook-{i}"), &mut w.process)))
            .chain(
                self.reconcilers
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        r.as_mut()
                            .map(|r| (format!("reconciler-{i}"), &mut r.process))
                    }),
            )
            .chain(
                self.shards
                    .iter_mut()
                    .map(|(n, s)| (n.clone(), &mut s.process)),
            );
        for (name, process) in processes {
            if let Some(status) = process.try_wait() {
                exited.push(format!("{name}: {status}"));
            }
        }
        exited
    }

    /// Starts again every shard and reconciler replica that exited because it lost its Lease
    /// (exit status [`LEASE_LOST_EXIT_STATUS`]: what the contract asks of them; their pods are
    /// restarted), and returns their names; panics on any other exit.
    pub async fn restart_lease_losers(&mut self) -> Vec<String> {
        let lost = |status: ExitStatus| status.code() == Some(i32::from(LEASE_LOST_EXIT_STATUS));
        let mut restarted = Vec::new();
        let exited: Vec<(String, ExitStatus)> = self
            .shards
            .iter_mut()
            .filter_map(|(n, s)| s.process.try_wait().map(|status| (n.clone(), status)))
            .collect();
        for (name, status) in exited {
            let shard = self.shards.remove(&name).expect("an exited shard");
            assert!(
                lost(status),
                "{name} exited with {status}, not for a lost Lease:\n{}",
                shard.process.log()
            );
            self.ended(&name);
            self.start_shard(&name).await;
            restarted.push(name);
        }
        for i in 0..self.reconcilers.len() {
            let Some(reconciler) = self.reconcilers[i].as_mut() else {
                continue;
            };
            let Some(status) = reconciler.process.try_wait() else {
                continue;
            };
            assert!(
                lost(status),
                "reconciler-{i} exited with {status}, not for a lost Lease:\n{}",
                reconciler.process.log()
            );
            self.start_reconciler(i).await;
            restarted.push(format!("reconciler-{i}"));
        }
        restarted
    }

    /// The names of the running shards.
    pub fn running_shards(&self) -> Vec<String> {
        self.shards.keys().cloned().collect()
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
        objects_converged(self, &ring).await
    }

    /// Waits until [`converged`](Self::converged).
    pub async fn wait_converged(&self, what: &str) {
        eventually(what, WAIT, || self.converged()).await;
    }

    /// Every line of every shard's reconcile record so far.
    pub fn record_lines(&self) -> Vec<sharder_example::record::Line> {
        let mut lines = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir()) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "jsonl") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    lines.extend(sharder_example::record::parse(&text));
                }
            }
        }
        lines
    }

    /// The ownership report from every shard's records so far.
    pub fn ownership(&self) -> Report {
        ownership::check(&self.record_lines(), &self.lives, unix_nanos())
    }

    /// Waits until the shards that reconciled each of `names` are `enough`, and returns that
    /// report. A shard records its reconcile after what [`converged`](Self::converged) reads
    /// from the apiserver (an owner's label, its child moved by the reconciler).
    pub async fn wait_reconciled<S: AsRef<str>>(
        &self,
        names: &[S],
        enough: impl Fn(&BTreeSet<String>) -> bool,
    ) -> Report {
        eventually("the reconciles recorded", WAIT, || async {
            let report = self.ownership();
            let short = names
                .iter()
                .map(|n| (n.as_ref(), self.reconcilers_of(&report, n.as_ref())))
                .find(|(_, shards)| !enough(shards));
            match short {
                Some((name, shards)) => Err(format!("{name} reconciled by {shards:?}")),
                None => Ok(report),
            }
        })
        .await
    }

    /// The longest time any object of the namespace stayed unassigned (so far).
    pub fn longest_unassigned(&self) -> Duration {
        self.history.longest_unassigned(unix_nanos())
    }

    /// The handover check over everything observed so far: children never ahead of their
    /// owners, following them within the unassigned bound, shards acting only on owners they
    /// hold (see [`ownership::check_handover`]).
    pub fn handover(&self) -> ownership::Handover {
        let bound = self.options.unassigned_bound().as_nanos();
        ownership::check_handover(
            &self.history.versions(),
            &self.record_lines(),
            &self.lives,
            bound,
            unix_nanos(),
        )
    }

    /// Asserts the ownership invariant: no object reconciled by two shards at overlapping
    /// times, none unassigned longer than the stated bound, no child ahead of its owner or
    /// left behind, no owner reconciled (or its child written) by a shard not holding it.
    /// Returns the report.
    pub fn assert_single_ownership(&self) -> Report {
        let report = self.ownership();
        let summary = ownership::assert_holds(&report, &self.handover(), &self.blind);
        let longest = self.longest_unassigned();
        let bound = self.options.unassigned_bound();
        assert!(
            longest <= bound,
            "an object stayed unassigned for {longest:?} (bound {bound:?})"
        );
        eprintln!("ownership: {summary}; longest unassigned {longest:?} (bound {bound:?})");
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

/// Checks that the example shards' objects in `world`'s namespace sit where `ring` puts them:
/// every Secret on its shard, nothing draining, its ConfigMap present on the same shard with the
/// checksums of the Secret's current data.
pub async fn objects_converged(world: &World, ring: &Ring) -> Result<(), String> {
    let configmaps: BTreeMap<String, ConfigMap> = world
        .configmaps()
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let mut problems = Vec::new();
    for (name, secret) in world.list_secrets().await {
        let key = ObjectKey::main("", "Secret", Some(&world.ns), &name).ok_or("key")?;
        let want = ring.shard_for(key.as_str()).map(str::to_owned);
        let have = world.shard_of(&secret);
        if have != want {
            problems.push(format!("{name} on {have:?}, want {want:?}"));
        }
        if world.draining(&secret) {
            problems.push(format!("{name} still draining"));
        }
        match configmaps.get(&configmap_name(&name)) {
            None => problems.push(format!("{name} has no checksums")),
            Some(cm) => {
                if cm.data.clone().unwrap_or_default() != checksums(&secret) {
                    problems.push(format!("{name}'s checksums are stale"));
                }
                if world.shard_of(cm) != have {
                    problems.push(format!(
                        "{name}'s checksums on {:?}, owner on {have:?}",
                        world.shard_of(cm)
                    ));
                }
                if world.draining(cm) {
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
