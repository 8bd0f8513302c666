//! One test's world on the shared control plane: a namespace, a ring named after it that
//! shards its Secrets (and the ConfigMaps they control), TLS files for webhooks, and the
//! helpers every cluster test needs: shard Leases, objects, assignments, audited writes, and
//! starting the components through the typed launchers ([`crate::launch`]).
//!
//! `sharder_tests::system::System` builds the whole running system on top of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use sharder_common::ranges::RANGE_KEY_ANNOTATION;
use sharder_common::{ObjectKey, Ring, RingId, RingKind, RingLabels, is_available};

use crate::ControlPlane;
use crate::certs::TestCa;
use crate::control_plane::{ADMIN_USER, AuditMark, RING_NAMESPACE_LABEL, audited_write};
use crate::crd::install_ring_crds;
use crate::fixtures::{
    child_of, refusing_configuration, ring_object, secret, secrets_ring, shard_lease,
};
use crate::launch::{Env, Reconciler, ReconcilerFlags, Webhook};
use crate::wait::eventually;

/// Label of the canary ConfigMaps of [`World::wait_until_admission_sees_configurations`]
/// (value: the test namespace).
pub const CANARY_LABEL: &str = "sharder-test/canary";

/// How long waits for the system to act may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// A test's namespace, ring and files.
pub struct World {
    /// The control plane.
    pub cp: &'static ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The test namespace (also the ring's name).
    pub ns: String,
    /// The ring's name.
    pub ring: String,
    /// The ring's kind (ClusterRing unless [`with_kind`](Self::with_kind) says otherwise).
    pub kind: RingKind,
    /// The ring's label keys.
    pub labels: RingLabels,
    dir: tempfile::TempDir,
    probes: usize,
}

/// Gives Lease `name` of `leases` to `holder` (`""` releases it), as a takeover or a release
/// by hand: read, then written with the resourceVersion read; a write that lost to another (a
/// holder's renewal, the reconciler's state label) reads again.
pub async fn set_lease_holder(leases: &Api<Lease>, name: &str, holder: &str) {
    loop {
        let mut lease = leases.get(name).await.expect("the lease");
        lease.spec.get_or_insert_default().holder_identity = Some(holder.to_owned());
        match leases.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("give lease {name} to {holder:?}: {e}"),
        }
    }
}

impl World {
    /// A new namespace `<prefix>-<random>` (the ring is not created yet), a CA and a webhook
    /// serving certificate signed by it (`tls.crt`, `tls.key`, `ca.crt` in [`dir`](Self::dir)).
    pub async fn new(prefix: &str) -> Self {
        let cp = ControlPlane::shared().await.expect("control plane");
        let ns = cp.namespace(prefix).await.expect("namespace");
        Self::in_namespace(cp, ns).await
    }

    /// The same in the existing namespace `ns`.
    pub async fn in_namespace(cp: &'static ControlPlane, ns: String) -> Self {
        let ring = ns.clone();
        Self::with_ring(cp, ns, ring).await
    }

    /// The same in the existing namespace `ns`, with the ClusterRing named `ring`.
    pub async fn with_ring(cp: &'static ControlPlane, ns: String, ring: String) -> Self {
        install_ring_crds(&cp.client().await.expect("client"))
            .await
            .expect("CRD");
        Self::under_installed_crds(cp, ns, ring).await
    }

    /// The same, with the ring CRDs `cp` serves already (a test that installed the reference's
    /// instead of Sharder's).
    pub async fn under_installed_crds(cp: &'static ControlPlane, ns: String, ring: String) -> Self {
        let client = cp.client().await.expect("client");
        // Kept, with the component logs in it, when `SHARDER_KEEP_TMP` is set.
        let dir = tempfile::Builder::new()
            .prefix(&format!("sharder-{ns}-"))
            .disable_cleanup(std::env::var_os("SHARDER_KEEP_TMP").is_some())
            .tempdir()
            .expect("dir");
        let ca = TestCa::new(&format!("{ns}-ca")).expect("ca");
        let cert = ca.serving_cert("webhook").expect("cert");
        cert.write_to(dir.path()).expect("cert and key");
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("ca");
        Self {
            cp,
            client,
            labels: RingId::cluster_ring(&ring).labels(),
            kind: RingKind::ClusterRing,
            ring,
            ns,
            dir,
            probes: 0,
        }
    }

    /// The folder holding the TLS files, the logs (`<process>.log`) and other files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA file of the webhook's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir().join("ca.crt")
    }

    /// The log of process `name`.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Processes started with the admin's credentials, logging into [`dir`](Self::dir).
    pub fn admin_env(&self) -> Env {
        Env::new(self.dir(), self.cp.kubeconfig())
    }

    /// Processes started as ServiceAccount `<ns>/<name>` bound to cluster-admin, so their
    /// writes can be told apart in the audit log (user [`Self::service_account`]).
    pub async fn service_account_env(&self, name: &str) -> Env {
        let token = self
            .cp
            .cluster_admin_token(&self.ns, name)
            .await
            .expect("token");
        self.env_with_token(name, &token)
    }

    /// Processes started as ServiceAccount `<ns>/<name>` with exactly what RBAC grants it
    /// ([`Self::grant`]).
    pub async fn restricted_env(&self, name: &str) -> Env {
        let token = self
            .cp
            .service_account_token(&self.ns, name)
            .await
            .expect("token");
        self.env_with_token(name, &token)
    }

    fn env_with_token(&self, name: &str, token: &str) -> Env {
        let kubeconfig = self
            .cp
            .write_kubeconfig(&format!("{name}-{}", self.ns), token)
            .expect("kubeconfig");
        Env::new(self.dir(), &kubeconfig)
    }

    /// Grants `rules` to ServiceAccount `<ns>/<account>` across the cluster: a ClusterRole and
    /// a ClusterRoleBinding, both named `name` (one the tests sharing the control plane do not
    /// use); a role that exists is kept, so granting again after [`Self::revoke`] binds it again.
    pub async fn grant(&self, name: &str, account: &str, rules: Vec<PolicyRule>) {
        let pp = PostParams::default();
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        };
        let role = ClusterRole {
            metadata: metadata.clone(),
            rules: Some(rules),
            ..ClusterRole::default()
        };
        match Api::<ClusterRole>::all(self.client.clone())
            .create(&pp, &role)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("ClusterRole {name}: {e}"),
        }
        let binding = ClusterRoleBinding {
            metadata,
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: account.to_owned(),
                namespace: Some(self.ns.clone()),
                ..Subject::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(self.client.clone())
            .create(&pp, &binding)
            .await
            .unwrap_or_else(|e| panic!("ClusterRoleBinding {name}: {e}"));
    }

    /// Takes back what [`Self::grant`] granted as `name` (its binding; the role stays).
    pub async fn revoke(&self, name: &str) {
        Api::<ClusterRoleBinding>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("revoke {name}: {e}"));
    }

    /// The audit user of ServiceAccount `name` of the test namespace.
    pub fn service_account(&self, name: &str) -> String {
        format!("system:serviceaccount:{}:{name}", self.ns)
    }

    /// The same world with a ring of `kind` (before the ring is created).
    pub fn with_kind(mut self, kind: RingKind) -> Self {
        self.kind = kind;
        self.labels = self.id().labels();
        self
    }

    /// The world's ring.
    pub fn id(&self) -> RingId {
        RingId::new(self.kind, self.ring.as_str())
    }

    /// The rings of the world's kind.
    pub fn rings(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.kind.api_resource())
    }

    /// Creates the ring (selecting only the test namespace; see
    /// [`secrets_ring`](crate::fixtures::secrets_ring)).
    pub async fn create_ring(&self) {
        let template = secrets_ring(&self.ring, Some(&self.ns));
        self.rings()
            .create(&PostParams::default(), &ring_object(&self.id(), &template))
            .await
            .expect("ring");
    }

    /// Puts the ring in range mode by `key` (`uid`, `namespace`: its annotation); `main_only`
    /// drops its controlled resources (the key `uid` refuses them).
    pub async fn to_range_mode(&self, key: &str, main_only: bool) {
        let mut patch = json!({"metadata": {"annotations": {RANGE_KEY_ANNOTATION: key}}});
        if main_only {
            patch["spec"] = json!({"resources": [{"group": "", "resource": "secrets"}]});
        }
        self.rings()
            .patch(&self.ring, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("the ring in range mode");
    }

    /// Starts a webhook replica `name` serving the world's certificate.
    pub async fn start_webhook(&self, name: &str, env: &Env, extra: &[&str]) -> Webhook {
        Webhook::start(
            name,
            env,
            &self.dir().join("tls.crt"),
            &self.dir().join("tls.key"),
            extra,
        )
        .await
        .expect("webhook")
    }

    /// The flags of a reconciler replica with identity `identity` managing this world's ring
    /// (leader election in `namespace`), calling the webhook at `webhook_url`; short intervals.
    pub fn reconciler_flags(
        &self,
        identity: &str,
        namespace: &str,
        webhook_url: &str,
        sweep: Duration,
    ) -> ReconcilerFlags {
        ReconcilerFlags {
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            webhook_url: webhook_url.to_owned(),
            ca_file: self.ca_file(),
            ring_selector: format!("{RING_NAMESPACE_LABEL}={}", self.ns),
            extra: [
                // A renewal may go unanswered for 9 s before the leader gives its Lease up: `make
                // test` keeps both cores busy, and at 3 s (500 ms renewals) a leader once did so
                // during a test's setup (docs/performance-notes.md, "make test saturates both
                // cores").
                "--leader-election-duration",
                "10s",
                "--leader-election-renew",
                "1s",
                "--sweep-interval",
                &format!("{}ms", sweep.as_millis()),
                "--drain-check-interval",
                "500ms",
                // Every test ring selects its namespace, which is also the reconciler's.
                "--namespace-selector",
                "{}",
                // The tests act as the shards with the admin's credentials, outside pods: the
                // label guard (on by default) lets the admin acknowledge drains.
                "--label-guard-acknowledgers",
                ADMIN_USER,
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        }
    }

    /// Starts reconciler `name` with `flags`.
    pub async fn start_reconciler(
        &self,
        name: &str,
        env: &Env,
        flags: &ReconcilerFlags,
    ) -> Reconciler {
        Reconciler::start(name, env, flags)
            .await
            .expect("reconciler")
    }

    /// The namespace's Leases.
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The shard Leases of the ring.
    pub async fn shard_leases(&self) -> BTreeMap<String, Lease> {
        Api::<Lease>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels(&self.id().lease_selector()))
            .await
            .expect("leases")
            .items
            .into_iter()
            .map(|l| (l.name_any(), l))
            .collect()
    }

    /// The ring the reconciler should have converged to: the available shard Leases.
    pub async fn desired_ring(&self) -> Ring {
        Ring::new(
            self.shard_leases()
                .await
                .into_iter()
                .filter(|(_, l)| is_available(l))
                .map(|(name, _)| name),
        )
    }

    /// The namespace's Secrets.
    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The namespace's ConfigMaps.
    pub fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates shard Lease `name` of the ring, held by its shard and renewed now for
    /// `duration` seconds (no process behind it).
    pub async fn add_shard_lease(&self, name: &str, duration: i32) {
        self.leases()
            .create(
                &PostParams::default(),
                &shard_lease(&self.ns, &self.id(), name, true, duration),
            )
            .await
            .expect("lease");
    }

    /// Creates shard Lease `name` of the ring with a `duration`-second Lease and renews it every
    /// 500 ms until the returned task is aborted (then it runs out, as a crashed shard's does).
    pub async fn add_mortal_shard_lease(
        &self,
        name: &str,
        duration: i32,
    ) -> tokio::task::JoinHandle<()> {
        self.add_shard_lease(name, duration).await;
        let leases = self.leases();
        let name = name.to_owned();
        tokio::spawn(async move {
            loop {
                if let Ok(mut lease) = leases.get(&name).await {
                    if let Some(spec) = lease.spec.as_mut() {
                        spec.renew_time = Some(MicroTime(Timestamp::now()));
                    }
                    let _ = leases.replace(&name, &PostParams::default(), &lease).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    }

    /// Waits until exactly the Secrets named in `moving` carry the drain label.
    pub async fn wait_until_drained(&self, moving: &BTreeSet<String>) {
        eventually("exactly the moving objects drained", WAIT, || async {
            let drained: BTreeSet<String> = self
                .list_secrets()
                .await
                .into_iter()
                .filter(|(_, s)| self.draining(s))
                .map(|(n, _)| n)
                .collect();
            (&drained == moving).then_some(()).ok_or(format!(
                "{} of {} drained",
                drained.len(),
                moving.len()
            ))
        })
        .await;
    }

    /// Waits until Secret `name` is on the shard `ring` picks (read by a GET, which no list
    /// count of the apiserver's counts).
    pub async fn wait_until_assigned(&self, name: &str, ring: &Ring) {
        let want = ring.shard_for(&self.key(name)).map(str::to_owned);
        eventually(&format!("{name} on {want:?}"), WAIT, || async {
            let secret = self.secrets().get(name).await.map_err(|e| e.to_string())?;
            let shard = self.shard_of(&secret);
            (shard == want).then_some(()).ok_or(format!("on {shard:?}"))
        })
        .await;
    }

    /// Whether every test Secret (`object-*`) is on the shard `ring` picks and not draining, with
    /// each child (`child-*`) on its owner's shard; else which are not.
    pub async fn settled(&self, ring: &Ring) -> Result<(), String> {
        let secrets = self.list_secrets().await;
        let mut wrong: Vec<String> = secrets
            .iter()
            .filter(|(n, s)| {
                self.shard_of(*s).as_deref() != ring.shard_for(&self.key(n)) || self.draining(*s)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for (name, child) in self.list_configmaps("child-").await {
            let owner = child
                .owner_references()
                .first()
                .and_then(|o| secrets.get(&o.name));
            if owner.is_none_or(|owner| self.shard_of(&child) != self.shard_of(owner)) {
                wrong.push(name);
            }
        }
        wrong
            .is_empty()
            .then_some(())
            .ok_or(format!("{} objects not settled: {wrong:?}", wrong.len()))
    }

    /// The ring's condition of `type_` as it stands (JSON), or why there is none.
    pub async fn ring_condition(&self, type_: &str) -> Result<serde_json::Value, String> {
        let ring = self
            .rings()
            .get(&self.ring)
            .await
            .map_err(|e| e.to_string())?;
        ring.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .cloned()
            .ok_or_else(|| format!("no condition {type_}: {}", ring.data["status"]))
    }

    /// Waits until the ring's status counts `shards` shards, every one available, and says
    /// `Ready`.
    pub async fn wait_until_ring_ready(&self, shards: u64) {
        let rings = self.rings();
        eventually(
            "the ring's status: its shards available, Ready",
            WAIT,
            || async {
                let ring = rings
                    .get_status(&self.ring)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = &ring.data["status"];
                let ready = status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                (ready && status["shards"] == shards && status["availableShards"] == shards)
                    .then_some(())
                    .ok_or_else(|| status.to_string())
            },
        )
        .await;
    }

    /// The shard label of `object`.
    pub fn shard_of<K: Resource>(&self, object: &K) -> Option<String> {
        self.labels.shard_of(object.labels()).map(str::to_owned)
    }

    /// Whether `object` carries the drain label.
    pub fn draining<K: Resource>(&self, object: &K) -> bool {
        self.labels.is_draining(object.labels())
    }

    /// The ring key of Secret `name` of the namespace.
    pub fn key(&self, name: &str) -> String {
        ObjectKey::main("", "Secret", Some(&self.ns), name)
            .expect("named")
            .to_string()
    }

    /// The test's Secrets (`object-*`) by name.
    pub async fn list_secrets(&self) -> BTreeMap<String, Secret> {
        self.list_named(&self.secrets(), "object-").await
    }

    /// The ConfigMaps whose name starts with `prefix`, by name.
    pub async fn list_configmaps(&self, prefix: &str) -> BTreeMap<String, ConfigMap> {
        self.list_named(&self.configmaps(), prefix).await
    }

    /// Lists in pages of 50: a test's objects may be big (a page of them must reach the test
    /// within an apiserver's short `--request-timeout` on a busy machine).
    async fn list_named<K>(&self, api: &Api<K>, prefix: &str) -> BTreeMap<String, K>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut named = BTreeMap::new();
        let mut params = ListParams::default().limit(50);
        loop {
            let page = api.list(&params).await.expect("list");
            named.extend(
                page.items
                    .into_iter()
                    .filter(|o| o.name_any().starts_with(prefix))
                    .map(|o| (o.name_any(), o)),
            );
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return named,
            }
        }
    }

    /// Creates `n` Secrets `object-<i>`.
    pub async fn create_secrets(&self, n: usize) {
        for i in 0..n {
            self.secrets()
                .create(&PostParams::default(), &secret(&format!("object-{i}")))
                .await
                .expect("secret");
        }
    }

    /// Creates `n` Secrets `object-<i>` and a ConfigMap `child-<i>` controlled by each.
    pub async fn create_objects(&self, n: usize) {
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
    pub async fn acknowledge_drains(&self) -> usize {
        let mut acknowledged = 0;
        for (name, secret) in self.list_secrets().await {
            if self.draining(&secret) {
                self.acknowledge(&name, &secret).await;
                acknowledged += 1;
            }
        }
        acknowledged
    }

    /// Acknowledges the drain of Secret `name` (as read: `secret`) like a shard does.
    pub async fn acknowledge(&self, name: &str, secret: &Secret) {
        let patch = json!({"metadata": {
            "resourceVersion": secret.resource_version(),
            "labels": {self.labels.shard.as_str(): null, self.labels.drain.as_str(): null},
        }});
        self.secrets()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("acknowledge");
    }

    /// Successful writes to objects of this namespace by `user`, per (resource, name).
    pub fn writes_by(&self, user: &str) -> BTreeMap<(String, String), usize> {
        self.writes_by_since(user, AuditMark::default())
    }

    /// Where the audit log ends now (for [`writes_by_since`](Self::writes_by_since)).
    pub fn audit_mark(&self) -> AuditMark {
        self.cp.audit_mark()
    }

    /// Successful writes to objects of this namespace by `user` after `mark`, per (resource,
    /// name).
    pub fn writes_by_since(
        &self,
        user: &str,
        mark: AuditMark,
    ) -> BTreeMap<(String, String), usize> {
        let mut writes = BTreeMap::new();
        for event in self.cp.audited_writes_since(mark) {
            if let Some((resource, name)) = audited_write(&event, &self.ns, user) {
                *writes
                    .entry((resource.to_owned(), name.to_owned()))
                    .or_default() += 1;
            }
        }
        writes
    }

    /// Waits until the webhook assigns new objects of the namespace (a probe Secret created
    /// afterwards is labelled; probes are deleted again).
    pub async fn wait_until_webhook_assigns(&mut self) {
        let mut attempt = self.probes;
        self.probes += 1000;
        let this = &*self;
        eventually("the webhook assigns new objects", WAIT, || {
            attempt += 1;
            let name = format!("probe-{attempt}");
            async move {
                let created = this
                    .secrets()
                    .create(&PostParams::default(), &secret(&name))
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = this.secrets().delete(&name, &DeleteParams::default()).await;
                this.shard_of(&created)
                    .ok_or_else(|| "not labelled".to_owned())
            }
        })
        .await;
    }

    /// Whether an Event of `type_` (`Normal`, `Warning`) with `reason` was published on the
    /// ring.
    pub async fn ring_event(&self, type_: &str, reason: &str) -> bool {
        self.events(type_, reason, self.kind.kind(), &self.ring)
            .await
            > 0
    }

    /// How often an Event of `type_` with `reason` was published on the object of `kind` named
    /// `name` (an Event published again counts in its series).
    pub async fn events(&self, type_: &str, reason: &str, kind: &str, name: &str) -> i32 {
        Api::<k8s_openapi::api::events::v1::Event>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                let regarding = e.regarding.as_ref();
                e.type_.as_deref() == Some(type_)
                    && e.reason.as_deref() == Some(reason)
                    && regarding.and_then(|r| r.name.as_deref()) == Some(name)
                    && regarding.and_then(|r| r.kind.as_deref()) == Some(kind)
            })
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum()
    }

    /// How many of the test's Secrets (`object-*`) carry no shard label.
    pub async fn unassigned(&self) -> usize {
        self.list_secrets()
            .await
            .values()
            .filter(|s| self.shard_of(*s).is_none())
            .count()
    }

    /// Waits until every one of the test's Secrets (`object-*`) carries a shard label.
    pub async fn wait_until_all_assigned(&self, what: &str) {
        eventually(what, WAIT, || async {
            let unassigned = self.unassigned().await;
            (unassigned == 0)
                .then_some(())
                .ok_or(format!("{unassigned} unassigned"))
        })
        .await;
    }

    /// Waits until the apiserver's admission chain has seen every webhook configuration change
    /// made so far (its configurations come from an informer, a little behind the writes): a
    /// blocking configuration (failurePolicy Fail, pointing nowhere, for ConfigMaps labelled
    /// `sharder-test/canary`) is created and then deleted, each step waited for by creating a
    /// canary ConfigMap; the informer handles events in order, so having seen the deletion it
    /// has seen everything before it.
    pub async fn wait_until_admission_sees_configurations(&mut self) {
        let name = format!("sharder-test-barrier-{}", self.ns);
        let blocker =
            refusing_configuration(&name, "CREATE", "configmaps", (CANARY_LABEL, &self.ns));
        let configurations = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
        configurations
            .create(&PostParams::default(), &blocker)
            .await
            .expect("barrier configuration");
        let mut attempt = self.probes;
        self.probes += 1000;
        let this = &*self;
        let mut canary = move || {
            attempt += 1;
            let name = format!("canary-{attempt}");
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name.clone());
            cm.metadata.labels = Some([(CANARY_LABEL.to_owned(), this.ns.clone())].into());
            async move {
                let created = this.configmaps().create(&PostParams::default(), &cm).await;
                if created.is_ok() {
                    let _ = this
                        .configmaps()
                        .delete(&name, &DeleteParams::default())
                        .await;
                }
                created.is_ok()
            }
        };
        eventually("admission sees the barrier configuration", WAIT, || {
            let attempt = canary();
            async move {
                if attempt.await {
                    Err("created")
                } else {
                    Ok(())
                }
            }
        })
        .await;
        configurations
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete barrier configuration");
        eventually("admission sees the barrier deleted", WAIT, || {
            let attempt = canary();
            async move {
                if attempt.await {
                    Ok(())
                } else {
                    Err("refused")
                }
            }
        })
        .await;
    }

    /// Prints the last `lines` lines of every process log in [`dir`](Self::dir) (for failed
    /// tests).
    pub fn dump_logs(&self, lines: usize) {
        let mut names = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir()) {
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if let Some(name) = file.strip_suffix(".log") {
                    names.push(name.to_owned());
                }
            }
        }
        crate::launch::dump_logs(self.dir(), names, lines);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs(40);
        }
    }
}
