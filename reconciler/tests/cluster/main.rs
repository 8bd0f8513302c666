//! The reconciler binary against a real kube-apiserver (with the garbage collector), the webhook
//! running beside it, both started through the shared launchers. One test binary (one control
//! plane), one module per topic: lease states and takeover, one webhook configuration per ring,
//! rebalancing (drains on scale-out that touch exactly the objects that move, direct moves off
//! dead shards, sweeps of objects the webhook missed, cluster-scoped resources), hostile rings
//! and owner references, chains and rings keyed by namespace, the label guard, leader election,
//! switching from the reference, and range mode.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use sharder_common::{Ring, RingKind};
use sharder_harness::control_plane::{AuditMark, ControlPlane};
use sharder_harness::launch::{Env, Reconciler, Webhook};
use sharder_harness::wait::{Rebalances, eventually};
use sharder_harness::world::World;

mod chains;
mod clients;
mod controller_ring;
mod hostile_rings;
mod label_guard;
mod leader_election;
mod lease_states;
mod namespace_key;
mod placement_policy;
mod range_mode;
mod rebalancing;
mod switching;
mod webhook_configuration;

/// How long waits for the reconciler to act may take.
const WAIT: Duration = Duration::from_secs(40);

/// The reconciler's ServiceAccount (its writes are told apart by it in the audit log).
const RECONCILER_ACCOUNT: &str = "sharder-reconciler";

/// Where the webhook configurations point while no webhook runs (nothing listens there; the
/// configurations' failurePolicy Ignore lets every write through).
const NO_WEBHOOK: &str = "https://127.0.0.1:9";

/// One test's world with the webhook and reconciler replicas it started.
struct Test {
    world: World,
    reconciler_env: Env,
    webhook: Option<Webhook>,
    reconcilers: Vec<Reconciler>,
}

impl Deref for Test {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl DerefMut for Test {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.world
    }
}

impl Test {
    async fn new(prefix: &str) -> Self {
        Self::in_world(World::new(prefix).await).await
    }

    /// A test whose ring is of `kind`.
    async fn of_kind(prefix: &str, kind: RingKind) -> Self {
        Self::in_world(World::new(prefix).await.with_kind(kind)).await
    }

    /// The same on control plane `cp` (one the test started for itself).
    async fn on(cp: &'static ControlPlane, prefix: &str) -> Self {
        let ns = cp.namespace(prefix).await.expect("namespace");
        Self::in_world(World::in_namespace(cp, ns).await).await
    }

    async fn in_world(world: World) -> Self {
        let reconciler_env = world.service_account_env(RECONCILER_ACCOUNT).await;
        Self {
            world,
            reconciler_env,
            webhook: None,
            reconcilers: Vec::new(),
        }
    }

    /// Starts the webhook (before the reconciler, whose configurations point at it).
    async fn start_webhook(&mut self) {
        let webhook = self
            .world
            .start_webhook("webhook", &self.world.admin_env(), &[])
            .await;
        self.webhook = Some(webhook);
    }

    /// Stops the webhook gracefully.
    fn stop_webhook(&mut self) {
        if let Some(mut webhook) = self.webhook.take() {
            webhook.process.stop(Duration::from_secs(20));
        }
    }

    fn webhook_url(&self) -> String {
        self.webhook
            .as_ref()
            .map_or_else(|| NO_WEBHOOK.to_owned(), |w| format!("https://{}", w.addr))
    }

    /// Starts reconciler replica `replica-<i>` (leader election in the test namespace).
    async fn start_reconciler(&mut self) {
        self.start_reconciler_with(Duration::from_secs(1), &[])
            .await;
    }

    /// The same with sweeps every `sweep` and `extra` flags (each replacing the harness's value
    /// of the same flag).
    async fn start_reconciler_with(&mut self, sweep: Duration, extra: &[(&str, &str)]) {
        let i = self.reconcilers.len();
        let mut flags = self.world.reconciler_flags(
            &format!("replica-{i}"),
            &self.world.ns,
            &self.webhook_url(),
            sweep,
        );
        for (flag, value) in extra {
            flags.set(flag, value);
        }
        let reconciler = self
            .world
            .start_reconciler(&format!("reconciler-{i}"), &self.reconciler_env, &flags)
            .await;
        self.reconcilers.push(reconciler);
    }

    /// The ring with Leases of `shards` held for an hour, the webhook and a reconciler, once
    /// the webhook assigns objects.
    async fn start_ring(&mut self, shards: &[&str]) {
        self.create_ring().await;
        for shard in shards {
            self.add_shard_lease(shard, 3600).await;
        }
        self.start_webhook().await;
        self.start_reconciler().await;
        self.wait_until_webhook_assigns().await;
    }

    /// The ring with Leases of `shard-a` and `shard-b` held for an hour and a reconciler, no
    /// webhook, and `n` objects with their children, once the sweeps put them on their shards;
    /// returns the ring of the two.
    async fn start_swept_ring(&mut self, n: usize) -> Ring {
        self.create_ring().await;
        for shard in ["shard-a", "shard-b"] {
            self.add_shard_lease(shard, 3600).await;
        }
        self.start_reconciler().await;
        let two = Ring::new(["shard-a", "shard-b"]);
        self.create_settled(n, &two).await;
        two
    }

    /// Creates `n` objects with their children and waits until they are on their shards of
    /// `ring`: the webhook's, or a sweep's where no webhook runs or the webhook admitted one
    /// unassigned (it fails open when the apiserver's call or its owner read takes too long, as
    /// on a loaded machine). Where the audit log ends then: writes counted after it are the
    /// test's, not the setup's.
    async fn create_settled(&self, n: usize, ring: &Ring) -> AuditMark {
        self.create_objects(n).await;
        eventually("the objects on their shards", WAIT, || self.settled(ring)).await;
        self.audit_mark()
    }

    /// The Secrets whose shard on ring `from` is not their shard on ring `to`.
    async fn moving(&self, from: &Ring, to: &Ring) -> BTreeSet<String> {
        self.list_secrets()
            .await
            .into_keys()
            .filter(|n| from.shard_for(&self.key(n)) != to.shard_for(&self.key(n)))
            .collect()
    }

    fn reconciler_log(&self, i: usize) -> String {
        self.world.log(&format!("reconciler-{i}"))
    }

    /// Waits until reconciler replica `i` has ended `n` more rebalances of the ring (every sweep
    /// is one) than it had now, as its metrics count them: whatever those could have written is
    /// written. Returns what they did.
    async fn wait_for_rebalances(&mut self, i: usize, n: usize) -> Rebalances {
        let ring = self.id();
        let before = self.reconcilers[i].rebalances(&ring).await;
        let what = format!("{n} more rebalances");
        let now = self.reconcilers[i]
            .wait_for_rebalances(&ring, &what, WAIT, |now| {
                now.count >= before.count + n as f64
            })
            .await
            .expect("more rebalances");
        now.since(&before)
    }

    /// Waits until what reconciler replica `i`'s metrics say of the ring satisfies `check`
    /// (`what` describes it), and returns them.
    async fn wait_for_metrics(
        &mut self,
        i: usize,
        what: &str,
        check: impl Fn(&Rebalances) -> bool,
    ) -> Rebalances {
        let ring = self.id();
        self.reconcilers[i]
            .wait_for_rebalances(&ring, what, WAIT, check)
            .await
            .expect(what)
    }

    /// What reconciler replica `i`'s metrics say of the ring now.
    async fn rebalances(&self, i: usize) -> Rebalances {
        self.reconcilers[i].rebalances(&self.id()).await
    }

    /// Waits until the webhook configuration of the world's ring exists (`what` names the
    /// wait).
    async fn configuration_of(&self, what: &str) -> MutatingWebhookConfiguration {
        let mwcs = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
        let name = self.id().configuration_name();
        eventually(what, WAIT, || async {
            mwcs.get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "absent".to_owned())
        })
        .await
    }

    /// Waits (`what` names the wait) until every object is on its shard of `ring`, no drain
    /// left, acknowledging drains meanwhile as the shards would (those issued while waiting too).
    async fn settle_acknowledging(&self, what: &str, ring: &Ring) {
        eventually(what, WAIT, || async {
            self.acknowledge_drains().await;
            self.settled(ring).await
        })
        .await;
    }

    /// The audit user of the reconciler.
    fn reconciler_user(&self) -> String {
        self.world.service_account(RECONCILER_ACCOUNT)
    }
}

/// Waits (`what` names the wait) until neither the admission policy `name` of `policies` nor
/// its binding of `bindings` exists.
async fn wait_until_policy_deleted<P, B>(
    what: &str,
    policies: &Api<P>,
    bindings: &Api<B>,
    name: &str,
) where
    P: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    B: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, WAIT, || async {
        let left = (
            policies.get_opt(name).await.map_err(|e| e.to_string())?,
            bindings.get_opt(name).await.map_err(|e| e.to_string())?,
        );
        match left {
            (None, None) => Ok(()),
            left => Err(format!("left: {:?}", (left.0.is_some(), left.1.is_some()))),
        }
    })
    .await;
}

/// An object of kind `K` named `name` with `labels`, nothing else set.
fn named<K: kube::Resource<DynamicType = ()> + Default>(name: &str, labels: &[(&str, &str)]) -> K {
    let mut object = K::default();
    object.meta_mut().name = Some(name.into());
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    object.meta_mut().labels = (!labels.is_empty()).then_some(labels);
    object
}
