//! The ring controller: per ClusterRing, keeps its MutatingWebhookConfiguration (server-side
//! apply, owned by the ring), its status, and rebalances its objects when the set of available
//! shards changes, when the ring changes, periodically, and with follow-up sweeps after drains.
//!
//! It is triggered by ClusterRing and shard Lease events and reads Leases from the shard lease
//! controller's store; it never watches or caches sharded objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::discovery::Scope as DiscoveryScope;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use sharder_common::cluster_ring::CONDITION_READY;
use sharder_common::labels::RING_LABEL;
use sharder_common::{ClusterRing, ClusterRingStatus, GroupResource, Ring, shard_state};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::metrics::{Metrics, RingLabels as RingMetricLabels};
use crate::rebalance::{Namespaces, Outcome, Rebalancer, RingView, Role, Scope, Target};
use crate::shard_leases::leases_of;
use crate::webhook_config::{WebhookSettings, webhook_configuration};

/// Field manager of the reconciler's server-side applies.
pub const FIELD_MANAGER: &str = "sharder-reconciler";

/// Timing of rebalances.
#[derive(Clone, Copy, Debug)]
pub struct Intervals {
    /// Full resync of every ring.
    pub resync: Duration,
    /// Unassigned sweep (`!<shard label>`), for objects the webhook missed.
    pub sweep: Duration,
    /// Follow-up sweeps while drains are not acknowledged yet.
    pub drain_check: Duration,
}

/// What the controller remembers of a ring between reconciles.
#[derive(Clone, Debug)]
struct Memory {
    uid: String,
    generation: i64,
    available: BTreeSet<String>,
    applied_generation: Option<i64>,
    last_full: Instant,
    last_sweep: Instant,
    draining: bool,
}

/// Context of the ring controller.
pub struct Context {
    /// Client for discovery, lists and status.
    pub client: Client,
    /// Shard Leases (from the shard lease controller).
    pub leases: Store<Lease>,
    /// Webhook configuration settings.
    pub webhook: WebhookSettings,
    /// Writes moves.
    pub rebalancer: Rebalancer,
    /// Timing.
    pub intervals: Intervals,
    /// Metrics.
    pub metrics: Metrics,
    /// Publishes Events on ClusterRings.
    pub recorder: Recorder,
    memory: Mutex<HashMap<String, Memory>>,
}

impl Context {
    /// A context with empty memory.
    pub fn new(
        client: Client,
        leases: Store<Lease>,
        webhook: WebhookSettings,
        rebalancer: Rebalancer,
        intervals: Intervals,
        metrics: Metrics,
        recorder: Recorder,
    ) -> Self {
        Self {
            client,
            leases,
            webhook,
            rebalancer,
            intervals,
            metrics,
            recorder,
            memory: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, ring: &str) -> Option<Memory> {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(ring)
            .cloned()
    }

    fn remember(&self, ring: &str, memory: Memory) {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ring.to_owned(), memory);
    }

    fn forget(&self, ring: &str) {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(ring);
    }
}

/// Resolves the ring's resources through discovery; resources that do not exist are skipped
/// with a warning (they may be installed later; the periodic resync picks them up).
async fn targets(client: &Client, ring: &ClusterRing) -> Vec<Target> {
    let mut wanted: Vec<(GroupResource, Role)> = Vec::new();
    for resource in &ring.spec.resources {
        wanted.push((resource.main(), Role::Main));
        for child in &resource.controlled_resources {
            if !wanted.iter().any(|(gr, _)| gr == child) {
                wanted.push((child.clone(), Role::Controlled));
            }
        }
    }
    let mut groups: HashMap<String, Option<kube::discovery::ApiGroup>> = HashMap::new();
    let mut targets = Vec::new();
    for (resource, role) in wanted {
        if !groups.contains_key(&resource.group) {
            let group = match kube::discovery::group(client, &resource.group).await {
                Ok(group) => Some(group),
                Err(e) => {
                    warn!(clusterring = %ring.name_any(), group = %resource.group, error = %e, "API group not found");
                    None
                }
            };
            groups.insert(resource.group.clone(), group);
        }
        let Some(Some(group)) = groups.get(&resource.group) else {
            continue;
        };
        match group
            .recommended_resources()
            .into_iter()
            .find(|(ar, _)| ar.plural == resource.resource)
        {
            Some((api, caps)) => targets.push(Target {
                namespaced: caps.scope == DiscoveryScope::Namespaced,
                resource,
                role,
                api,
            }),
            None => {
                warn!(clusterring = %ring.name_any(), resource = %resource, "resource not served by the apiserver")
            }
        }
    }
    targets
}

/// The namespaces whose objects belong to the ring: its namespaceSelector's, or every namespace
/// but the excluded ones.
async fn namespaces(
    client: &Client,
    ring: &ClusterRing,
    excluded: &[String],
) -> Result<Namespaces, Error> {
    let all = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(Error::Kube)?;
    let mut selected = HashSet::new();
    for ns in all.items {
        let name = ns.name_any();
        let keep = match &ring.spec.namespace_selector {
            Some(selector) => sharder_common::selector::matches(
                selector,
                &ns.metadata.labels.clone().unwrap_or_default(),
            )
            .map_err(Error::Common)?,
            None => !excluded.contains(&name),
        };
        if keep {
            selected.insert(name);
        }
    }
    Ok(Namespaces(selected))
}

fn ready_condition(
    existing: Option<&ClusterRingStatus>,
    generation: i64,
    available: usize,
    shards: usize,
    invalid: Option<&str>,
) -> Condition {
    let (status, reason, message) = match invalid {
        Some(reason) => ("False", "InvalidSpec", reason.to_owned()),
        None if available > 0 => (
            "True",
            "ShardsAvailable",
            format!("{available} of {shards} shards available"),
        ),
        None => (
            "False",
            "NoShardsAvailable",
            format!("0 of {shards} shards available"),
        ),
    };
    let previous = existing.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    Condition {
        type_: CONDITION_READY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: Some(generation),
    }
}

/// Writes the ring's status (shard counts, observed generation, Ready condition) if it changed.
async fn patch_status(
    client: &Client,
    ring: &ClusterRing,
    shards: usize,
    available: usize,
    invalid: Option<&str>,
) -> Result<(), Error> {
    let generation = ring.meta().generation.unwrap_or_default();
    let condition = ready_condition(ring.status.as_ref(), generation, available, shards, invalid);
    let status = ClusterRingStatus {
        observed_generation: Some(generation),
        shards: Some(i32::try_from(shards).unwrap_or(i32::MAX)),
        available_shards: Some(i32::try_from(available).unwrap_or(i32::MAX)),
        conditions: vec![condition],
    };
    if ring.status.as_ref() == Some(&status) {
        return Ok(());
    }
    Api::<ClusterRing>::all(client.clone())
        .patch_status(
            &ring.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

fn scopes(
    memory: Option<&Memory>,
    uid: &str,
    generation: i64,
    available: &BTreeSet<String>,
    intervals: &Intervals,
) -> BTreeSet<Scope> {
    let mut scopes = BTreeSet::new();
    match memory {
        None => {
            scopes.insert(Scope::All);
        }
        Some(m) => {
            if m.uid != uid
                || m.generation != generation
                || available.difference(&m.available).next().is_some()
                || m.last_full.elapsed() >= intervals.resync
            {
                scopes.insert(Scope::All);
            }
            for dead in m.available.difference(available) {
                scopes.insert(Scope::OnShard(dead.clone()));
            }
            if m.draining || m.last_sweep.elapsed() >= intervals.sweep {
                scopes.insert(Scope::Unassigned);
            }
        }
    }
    if scopes.contains(&Scope::All) {
        return [Scope::All].into();
    }
    scopes
}

async fn reconcile(ring: Arc<ClusterRing>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = ring.name_any();
    if ring.meta().deletion_timestamp.is_some() {
        ctx.forget(&name);
        return Ok(Action::await_change());
    }
    let uid = ring.uid().unwrap_or_default();
    let generation = ring.meta().generation.unwrap_or_default();
    let now = Timestamp::now();
    let leases = leases_of(&ctx.leases, &name);
    let available: BTreeSet<String> = leases
        .iter()
        .filter(|l| shard_state(l, now).state.is_available())
        .map(|l| l.name_any())
        .collect();
    let labels = RingMetricLabels {
        clusterring: name.clone(),
    };
    ctx.metrics
        .shards
        .get_or_create(&labels)
        .set(i64::try_from(leases.len()).unwrap_or(i64::MAX));
    ctx.metrics
        .available_shards
        .get_or_create(&labels)
        .set(i64::try_from(available.len()).unwrap_or(i64::MAX));

    if let Err(e) = ring.spec.validate() {
        patch_status(
            &ctx.client,
            &ring,
            leases.len(),
            available.len(),
            Some(&e.to_string()),
        )
        .await?;
        warn!(clusterring = %name, error = %e, "invalid ClusterRing");
        return Ok(Action::await_change());
    }

    let memory = ctx.remembered(&name).filter(|m| m.uid == uid);
    if memory.as_ref().and_then(|m| m.applied_generation) != Some(generation) {
        let mwc = webhook_configuration(&ring, &ctx.webhook);
        let mwc_name = mwc.metadata.name.clone().unwrap_or_default();
        Api::<MutatingWebhookConfiguration>::all(ctx.client.clone())
            .patch(
                &mwc_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&mwc),
            )
            .await
            .map_err(Error::Kube)?;
        info!(clusterring = %name, webhook_configuration = %mwc_name, generation, "webhook configuration applied");
    }

    let scopes = scopes(
        memory.as_ref(),
        &uid,
        generation,
        &available,
        &ctx.intervals,
    );
    let mut next = Memory {
        uid: uid.clone(),
        generation,
        available: available.clone(),
        applied_generation: Some(generation),
        last_full: memory.as_ref().map_or_else(Instant::now, |m| m.last_full),
        last_sweep: memory.as_ref().map_or_else(Instant::now, |m| m.last_sweep),
        draining: memory.as_ref().is_some_and(|m| m.draining),
    };
    if !scopes.is_empty() && !available.is_empty() {
        let started = Instant::now();
        let targets = targets(&ctx.client, &ring).await;
        let namespaces = namespaces(&ctx.client, &ring, &ctx.webhook.excluded_namespaces).await?;
        let ring_of_shards = Ring::new(available.iter().cloned());
        let ring_labels = ring.labels();
        let view = RingView {
            name: &name,
            labels: &ring_labels,
            ring: &ring_of_shards,
            available: &available,
            namespaces: &namespaces,
        };
        let scope_list: Vec<Scope> = scopes.iter().cloned().collect();
        let outcome = ctx.rebalancer.run(&view, &targets, &scope_list).await;
        let mut pending = 0;
        for target in targets.iter().filter(|t| t.role == Role::Main) {
            pending += ctx
                .rebalancer
                .pending_drains(&view, target)
                .await
                .unwrap_or(1);
        }
        let elapsed = started.elapsed();
        ctx.metrics
            .resync_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        summarize(&ctx, &ring, &scopes, &outcome, pending, elapsed).await;
        if scopes.contains(&Scope::All) {
            next.last_full = Instant::now();
        }
        next.last_sweep = Instant::now();
        next.draining = pending > 0;
        if outcome.errors > 0 {
            // Remember the old set so the next attempt retries the same work.
            next.available = memory
                .as_ref()
                .map(|m| m.available.clone())
                .unwrap_or_default();
        }
    }
    ctx.remember(&name, next.clone());

    patch_status(&ctx.client, &ring, leases.len(), available.len(), None).await?;

    let until_resync = ctx
        .intervals
        .resync
        .saturating_sub(next.last_full.elapsed());
    let until_sweep = ctx
        .intervals
        .sweep
        .saturating_sub(next.last_sweep.elapsed());
    let mut wait = until_resync
        .min(until_sweep)
        .max(Duration::from_millis(100));
    if next.draining {
        wait = wait.min(ctx.intervals.drain_check);
    }
    Ok(Action::requeue(wait))
}

async fn summarize(
    ctx: &Context,
    ring: &ClusterRing,
    scopes: &BTreeSet<Scope>,
    outcome: &Outcome,
    pending: usize,
    elapsed: Duration,
) {
    let assigned: BTreeMap<&str, usize> = outcome
        .assigned
        .iter()
        .map(|(r, n)| (r.as_str(), *n))
        .collect();
    let scopes: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
    info!(
        clusterring = %ring.name_any(),
        scopes = ?scopes,
        listed = outcome.listed,
        drained = outcome.drained,
        assigned = ?assigned,
        pending_drains = pending,
        errors = outcome.errors,
        duration_ms = elapsed.as_millis() as u64,
        "rebalance"
    );
    if outcome.moved_anything() {
        let note = format!(
            "listed {} objects: {} drained, {} assigned ({:?}), {} errors, in {} ms",
            outcome.listed,
            outcome.drained,
            assigned.values().sum::<usize>(),
            assigned,
            outcome.errors,
            elapsed.as_millis()
        );
        let event = Event {
            type_: EventType::Normal,
            reason: "Rebalanced".into(),
            note: Some(note),
            action: "Rebalance".into(),
            secondary: None,
        };
        let reference = ring.object_ref(&());
        let mut result = ctx.recorder.publish(&event, &reference).await;
        if matches!(&result, Err(kube::Error::Api(s)) if s.code == 422) {
            // kube-apiserver < 1.22 rejects an events.k8s.io/v1 Event in `default` about a
            // cluster-scoped object unless the reference names that namespace too.
            let mut in_default = reference;
            in_default.namespace = Some("default".into());
            result = ctx.recorder.publish(&event, &in_default).await;
        }
        if let Err(e) = result {
            warn!(clusterring = %ring.name_any(), error = %e, "cannot publish the rebalance Event");
        }
    }
}

fn error_policy(ring: Arc<ClusterRing>, error: &Error, _: Arc<Context>) -> Action {
    warn!(clusterring = %ring.name_any(), error = %error, "ring reconcile failed, retrying");
    Action::requeue(Duration::from_secs(2))
}

/// The controller over the ClusterRings matching `selector` (empty: all), triggered by their
/// shard Leases too.
pub fn controller(client: Client, selector: &str) -> Controller<ClusterRing> {
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(selector);
    }
    Controller::new(Api::<ClusterRing>::all(client.clone()), config)
        .watches(
            Api::<Lease>::all(client),
            watcher::Config::default().labels(RING_LABEL),
            |lease| {
                lease
                    .labels()
                    .get(RING_LABEL)
                    .map(|ring| ObjectRef::<ClusterRing>::new(ring))
            },
        )
        .with_config(
            kube::runtime::controller::Config::default().debounce(Duration::from_millis(200)),
        )
}

/// Runs the ring controller until `shutdown`.
pub async fn run(
    controller: Controller<ClusterRing>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) {
    controller
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
