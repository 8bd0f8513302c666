//! The ring controller, one per ring kind (docs/design.md §2): per ring, keeps its status and
//! rebalances its objects when its available shards or its spec change, periodically, and while
//! drains are pending. Woken by the ring's events and its shard Leases' ([`triggers`]); it never
//! watches or caches sharded objects.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use sharder_common::lease::{conflicting_names, namespace_and_name};
use sharder_common::{
    GroupResource, Keying, Ring, RingId, RingKind, RingObject, Roles, is_available,
};
use sharder_runtime::metrics::{ResourceLabels, RingLabel};
use tokio::time::Instant;
use tracing::{Instrument as _, info, info_span, warn};

use crate::Error;
use crate::metrics::{Metrics, ReasonLabels, RebalanceLabels};
use crate::rebalance::strays::Strays;
use crate::rebalance::{LiveNow, Outcome, OwnerReads, Rebalancer, RingView};
use crate::shard_leases::leases_of;
use crate::terms::{Namespaces, Pass, Scope, Target};

pub(crate) mod acks;
pub(crate) mod discovery;
pub(crate) mod namespaces;
pub(crate) mod ranges;
pub(crate) mod report;
pub(crate) mod schedule;
pub(crate) mod status;
pub(crate) mod table;
pub(crate) mod triggers;

use ranges::RangeState;
pub(crate) use schedule::Intervals;
use schedule::{Observed, Progress, Ran};
use status::Counts;

/// How long ring and Lease events are collected before a ring is reconciled (a relist's Leases
/// trigger one reconcile).
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(10);

/// When to retry after a failed reconcile: as soon as after a failed rebalance's first failure.
pub(crate) const ERROR_REQUEUE: Duration = schedule::FIRST_RETRY;

/// Context of the ring controller of one ring kind.
pub(crate) struct Context {
    /// The kind of the rings.
    pub kind: RingKind,
    /// Client for discovery, lists and status.
    pub client: Client,
    /// The rings of the kind, to tell whether a ring is still there during its rebalance.
    pub rings: Store<DynamicObject>,
    /// Shard Leases of rings of the kind, from the watch that wakes the rings ([`controller`]).
    pub leases: Store<Lease>,
    /// The global namespace selector (see `sharder_common::webhook_configuration::global_namespace_selector`).
    pub namespace_selector: LabelSelector,
    /// Writes moves.
    pub rebalancer: Rebalancer,
    /// Timing.
    pub intervals: Intervals,
    /// Metrics.
    pub metrics: Metrics,
    /// Publishes Events on rings.
    pub recorder: Recorder,
    /// Wakes rings as their drains are acknowledged.
    pub acks: acks::Acks,
    /// What the controller remembers of each ring, by name.
    pub memory: Mutex<HashMap<String, Memory>>,
    /// Where the placement tables of rings keyed by namespace live (`None`: no ring has one).
    pub table_namespace: Option<String>,
}

/// What the ring controller remembers of one ring between reconciles.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// Its schedule's state ([`schedule`]).
    progress: Option<Progress>,
    /// The resources whose unassigned-object gauges are set.
    strays: BTreeSet<GroupResource>,
    /// The owner chains its last passes could not follow (described), until a full list finds
    /// none.
    chains: Option<String>,
}

impl Context {
    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memory>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is remembered of the ring `name` (created empty), under the lock.
    fn remember<T>(&self, name: &str, f: impl FnOnce(&mut Memory) -> T) -> T {
        f(self.memory().entry(name.to_owned()).or_default())
    }

    /// Forgets `ring`: its progress, its acknowledgement watches and its unassigned-object
    /// gauges.
    fn forget(&self, ring: &RingId) {
        self.acks.stop(ring);
        self.publish_strays(ring, &[], &BTreeMap::new());
        self.memory().remove(&ring.name);
        let label = RingLabel::new(ring);
        self.metrics.pending_drains.remove(&label);
        self.metrics.drain_checks_scheduled.remove(&label);
    }

    /// Counts a rebalance of `ring` in the metrics; its duration last, so that whoever sees it
    /// counted sees the rest.
    fn count_rebalance(
        &self,
        ring: &RingId,
        outcome: &Outcome,
        drain_checks: bool,
        elapsed: Duration,
    ) {
        let m = &self.metrics;
        let label = RingLabel::new(ring);
        let lists: BTreeSet<&str> = outcome.lists.iter().map(Scope::list_name).collect();
        for list in lists {
            m.rebalances
                .get_or_create(&RebalanceLabels {
                    ring: label.clone(),
                    list: list.to_owned(),
                })
                .inc();
        }
        m.listed_objects
            .get_or_create(&label)
            .inc_by(u64::try_from(outcome.listed).unwrap_or(u64::MAX));
        m.pending_drains
            .get_or_create(&label)
            .set(i64::try_from(outcome.pending_drains).unwrap_or(i64::MAX));
        m.drain_checks_scheduled
            .get_or_create(&label)
            .set(i64::from(drain_checks));
        m.rebalance_duration
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }

    /// Sets `ring`'s unassigned-object gauges to what its lists `found`; removes those of
    /// resources not in `targets`.
    fn publish_strays(
        &self,
        ring: &RingId,
        targets: &[Target],
        found: &BTreeMap<GroupResource, Strays>,
    ) {
        let labels = |resource: &GroupResource| ResourceLabels {
            ring: RingLabel::new(ring),
            group: resource.group.clone(),
            resource: resource.resource.clone(),
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        self.remember(&ring.name, |memory| {
            memory.strays.retain(|resource| {
                let kept = targets.iter().any(|t| &t.resource == resource);
                if !kept {
                    self.metrics.unassigned_objects.remove(&labels(resource));
                    self.metrics
                        .unassigned_oldest_seconds
                        .remove(&labels(resource));
                }
                kept
            });
            for (resource, strays) in found {
                let labels = labels(resource);
                self.metrics
                    .unassigned_objects
                    .get_or_create(&labels)
                    .set(i64::try_from(strays.objects).unwrap_or(i64::MAX));
                self.metrics
                    .unassigned_oldest_seconds
                    .get_or_create(&labels)
                    .set(strays.oldest_age(now));
                memory.strays.insert(resource.clone());
            }
        });
    }
}

/// Reconciles one object (for `crate::controllers::spawn_controller`).
pub(crate) async fn reconcile(
    object: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ring = RingObject::from_dynamic(ctx.kind, &object);
    let span = info_span!("ring", ring = %ring.id);
    reconcile_ring(&ring, &ctx).instrument(span).await
}

async fn reconcile_ring(ring: &RingObject, ctx: &Context) -> Result<Action, Error> {
    let name = ring.id.name.as_str();
    if ring.object.meta().deletion_timestamp.is_some() {
        ctx.forget(&ring.id);
        return Ok(Action::await_change());
    }
    let uid = ring.object.uid().unwrap_or_default();
    let leases = leases_of(&ctx.leases, &ring.id);
    let available: BTreeSet<String> = leases
        .iter()
        .filter(|l| is_available(l))
        .map(|l| l.name_any())
        .collect();
    let observed = Observed {
        uid: &uid,
        generation: ring.object.meta().generation.unwrap_or_default(),
        // An invalid value is reported below and nothing runs.
        keying: ring.keying().unwrap_or_default(),
        available: &available,
    };
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let label = RingLabel::new(&ring.id);
    let generation = ring.object.meta().generation.unwrap_or_default();
    let m = &ctx.metrics;
    for (families, value) in [
        (&m.metadata_generation, generation),
        (&m.shards, gauge(leases.len())),
        (&m.available_shards, gauge(available.len())),
    ] {
        if let Some(family) = families.get(&ctx.kind) {
            family.get_or_create(&label).set(value);
        }
    }
    let mut counts = Counts {
        shards: leases.len(),
        available: available.len(),
        invalid: None,
        conflicting: None,
        ranges: None,
        chains: None,
    };

    let read = ring
        .roles()
        .and_then(|r| Ok((r, ring.range_key()?, ring.keying()?)));
    let (roles, range_key, keying) = match read {
        Ok(read) => read,
        Err(e) => {
            let reason = e.to_string();
            counts.invalid = Some(&reason);
            status::patch_status(&ctx.client, ring, counts).await?;
            let note =
                format!("invalid ring: {reason}; nothing is assigned or moved until it is fixed");
            warn_once(ctx, ring, status::REASON_INVALID_SPEC, &reason, note).await;
            return Ok(Action::await_change());
        }
    };

    let conflicts = conflicting_names(leases.iter().map(|l| namespace_and_name(l)));
    if !conflicts.is_empty() {
        let described = describe_conflicts(&conflicts);
        counts.conflicting = Some(&described);
        status::patch_status(&ctx.client, ring, counts).await?;
        let note = format!(
            "shard names in more than one namespace: {described}; nothing is moved until each name is in one namespace"
        );
        warn_once(
            ctx,
            ring,
            status::REASON_CONFLICTING_SHARD_NAMES,
            &described,
            note,
        )
        .await;
        // Lease changes bring the ring back; the progress is kept, so the rebalance after the
        // conflict compares with the shards before it.
        return Ok(Action::await_change());
    }

    if let Some(key) = range_key {
        // Nothing of the label mode's rebalances is kept for a ring in range mode.
        ctx.forget(&ring.id);
        let state =
            ranges::reconcile(&ctx.client, ring, &roles, key, &ctx.namespace_selector).await?;
        if let RangeState::Unserved(resource) = &state {
            let why = format!("does not apply shardSelector to {resource}");
            let note = format!(
                "the apiserver {why} (feature gate ShardedListAndWatch off): no ranges are handed out"
            );
            warn_once(ctx, ring, status::REASON_SELECTORS_NOT_APPLIED, &why, note).await;
        }
        counts.ranges = Some((key, &state));
        status::patch_status(&ctx.client, ring, counts).await?;
        if let Some(family) = ctx.metrics.observed_generation.get(&ctx.kind) {
            family.get_or_create(&label).set(generation);
        }
        let wait = if state.pending() {
            ctx.intervals.drain_check
        } else {
            ctx.intervals.sweep
        };
        return Ok(Action::requeue(wait));
    }
    // Back in label mode: shards still serving ranges are told to stop.
    ranges::revoke(&ctx.client, &leases).await?;

    // A ring keyed by namespace with a placement policy: its moving namespaces leave the table
    // before their objects move, and enter it again once they are all moved.
    let table = ctx
        .table_namespace
        .as_deref()
        .filter(|_| keying == Keying::Namespace);
    if let Some(namespace) = table {
        table::keep(&ctx.client, ring, namespace, &available, None).await?;
    }
    let previous = ctx.remember(name, |m| m.progress.clone());
    let pass = schedule::next_pass(previous.as_ref(), &observed, &ctx.intervals, Instant::now());
    let (ran, listed) = match pass {
        None => (None, None),
        Some(pass) => match run_pass(ctx, ring, &roles, keying, &available, &pass).await? {
            Some((ran, namespaces)) => (Some(ran), Some(namespaces)),
            None => {
                // Deleted or replaced during its rebalance: nothing of it is kept.
                ctx.forget(&ring.id);
                return Ok(Action::await_change());
            }
        },
    };
    let progress = schedule::progress_after(previous.as_ref(), &observed, ran, Instant::now());
    if !progress.drain_checks_due() {
        ctx.acks.stop(&ring.id);
    }
    let settled = progress.settled();
    let wait = schedule::requeue_after(&progress, &ctx.intervals, Instant::now());
    ctx.remember(name, |m| m.progress = Some(progress));
    if let Some(namespace) = table
        && settled
    {
        // The pass's namespaces, or read now when no pass ran.
        let selected = match listed {
            Some(listed) => listed,
            None => {
                namespaces::namespaces(&ctx.client, &ring.object.spec, &ctx.namespace_selector)
                    .await?
            }
        };
        table::keep(
            &ctx.client,
            ring,
            namespace,
            &available,
            Some(&selected.selected),
        )
        .await?;
    }

    let chains = ctx.remember(name, |m| m.chains.clone());
    counts.chains = chains.as_deref();
    status::patch_status(&ctx.client, ring, counts).await?;
    if let Some(family) = ctx.metrics.observed_generation.get(&ctx.kind) {
        family.get_or_create(&label).set(generation);
    }
    Ok(Action::requeue(wait))
}

/// Warns of `note` (a log line and a Warning Event `reason` on `ring`) unless one of the ring's
/// conditions already reports `reason` about `what`: once per problem, not at every reconcile.
async fn warn_once(ctx: &Context, ring: &RingObject, reason: &str, what: &str, note: String) {
    let reported = ring
        .object
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.reason == reason && c.message.contains(what));
    if !reported {
        warn!(reason, "{note}");
        report::warning(&ctx.recorder, ring, reason, note).await;
    }
}

/// `shard-a (ns-1, ns-2), shard-b (...)`.
fn describe_conflicts(conflicts: &BTreeMap<String, BTreeSet<String>>) -> String {
    conflicts
        .iter()
        .map(|(name, namespaces)| {
            format!(
                "{name} ({})",
                namespaces.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `pass` on `ring` and reports it: its resources and namespaces read, the ring of its
/// `available` shards, the pass ([`Rebalancer::pass`]), the metrics, the acknowledgement
/// watches, the log and Events; with the ring's namespaces it read. `None`: the ring was deleted
/// or replaced meanwhile.
async fn run_pass(
    ctx: &Context,
    ring: &RingObject,
    roles: &Roles,
    keying: Keying,
    available: &BTreeSet<String>,
    pass: &Pass,
) -> Result<Option<(Ran, Namespaces)>, Error> {
    let started = Instant::now();
    let busy = ctx.rebalancer.busy();
    // Both before the first list: at once.
    let (targets, namespaces) = tokio::try_join!(
        async {
            discovery::targets(&ctx.client, roles)
                .await
                .map_err(Error::Kube)
        },
        namespaces::namespaces(&ctx.client, &ring.object.spec, &ctx.namespace_selector),
    )?;
    let ring_of_shards = Ring::new(available.iter().cloned());
    let ring_labels = ring.labels();
    let live_now = LiveNow::default();
    let owner_reads = OwnerReads::default();
    let this = ObjectRef::new_with(&ring.id.name, ctx.kind.api_resource());
    let uid = ring.object.uid();
    let current = || ctx.rings.get(&this).is_some_and(|r| r.uid() == uid);
    let view = RingView {
        id: &ring.id,
        labels: &ring_labels,
        keying,
        ring: &ring_of_shards,
        available,
        namespaces: &namespaces,
        live_now: &live_now,
        owner_reads: &owner_reads,
        current: &current,
    };
    ctx.metrics
        .ring_calculations
        .get_or_create(&RingLabel::new(&ring.id))
        .inc();
    let mut outcome = ctx.rebalancer.pass(&view, &targets, pass).await;
    if !view.is_current() {
        ctx.metrics
            .rebalance_duration
            .get_or_create(&RingLabel::new(&ring.id))
            .observe(started.elapsed().as_secs_f64());
        info!(
            listed = outcome.listed,
            drained = outcome.drained,
            assigned = outcome.assigned.values().sum::<usize>(),
            left = outcome.abandoned,
            "the ring was deleted or replaced during its rebalance: the rest of it is left"
        );
        return Ok(None);
    }
    ctx.publish_strays(&ring.id, &targets, &outcome.strays);
    let elapsed = started.elapsed();
    let writes = report::WriteStats {
        limit: ctx.rebalancer.write_limit(),
        mean_in_flight: ctx.rebalancer.busy().mean_since(&busy),
    };
    let ran = Ran {
        full: pass.lists.contains(&Scope::All),
        drains_pending: outcome.drains_pending,
        failed: outcome.errors > 0,
        refused: outcome.errors > 0 && outcome.refused == outcome.errors,
        awaiting: std::mem::take(&mut outcome.awaiting),
    };
    ctx.count_rebalance(&ring.id, &outcome, ran.drain_checks(), elapsed);
    if ran.drain_checks() {
        let children = !ran.awaiting.is_empty();
        ctx.acks
            .follow(&ring.id, &ring_labels.drain, &targets, children);
    }
    let summary = report::Summary {
        drain_checks: ran.drain_checks(),
        writes,
        elapsed,
    };
    report::report(&ctx.recorder, ring, &outcome, summary).await;
    let full = pass.lists.contains(&Scope::All) && outcome.failed_lists == 0;
    match &outcome.unresolved {
        (left @ 1.., Some(problem)) => {
            let what = format!("{problem}: objects below it are left where they are");
            let note = format!("{what} ({left} in this pass)");
            warn_once(ctx, ring, status::REASON_OWNER_CHAIN, &what, note).await;
            ctx.remember(&ring.id.name, |m| m.chains = Some(what));
        }
        _ if full => {
            ctx.remember(&ring.id.name, |m| m.chains = None);
        }
        _ => {}
    }
    if outcome.errors > 0 {
        let failed_writes = outcome.errors - outcome.failed_lists;
        for (reason, n) in [("list", outcome.failed_lists), ("write", failed_writes)] {
            if n > 0 {
                ctx.metrics
                    .failed_rebalances
                    .get_or_create(&ReasonLabels {
                        ring: RingLabel::new(&ring.id),
                        reason: reason.to_owned(),
                    })
                    .inc();
            }
        }
        report::warning(
            &ctx.recorder,
            ring,
            "RebalanceFailed",
            format!(
                "{} lists and {failed_writes} writes failed (the reconciler's log names them); the same work is tried again",
                outcome.failed_lists
            ),
        )
        .await;
    }
    Ok(Some((ran, namespaces)))
}

/// What to do after a failed reconcile (for `crate::controllers::spawn_controller`).
pub(crate) fn error_policy(object: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    let ring = RingId::new(ctx.kind, object.name_any());
    warn!(%ring, error = %error, "ring reconcile failed, retrying");
    ctx.metrics
        .failed_rebalances
        .get_or_create(&ReasonLabels {
            ring: RingLabel::new(&ring),
            reason: "reconcile".to_owned(),
        })
        .inc();
    Action::requeue(ERROR_REQUEUE)
}

/// The controller over the rings of `kind` matching `selector` (empty: all), woken by their
/// shard Leases ([`triggers`]) and drain acknowledgements ([`acks`]); with the store of that
/// Lease watch for [`Context::leases`] (it holds a change before the change wakes a ring) and
/// the acknowledgement watches for [`Context::acks`].
pub(crate) fn controller(
    client: Client,
    kind: RingKind,
    selector: &str,
) -> (
    (
        Controller<DynamicObject>,
        sharder_runtime::controller::Listed,
    ),
    Store<Lease>,
    acks::Acks,
) {
    let (controller, listed) = crate::controllers::ring_controller(client.clone(), kind, selector);
    let writer = reflector::store::Writer::default();
    let leases = writer.as_reader();
    let events = reflector::reflector(
        writer,
        sharder_runtime::controller::watch(
            Api::<Lease>::all(client.clone()),
            watcher::Config::default().labels(kind.lease_label()),
        ),
    );
    let resource = kind.api_resource();
    let (acks, woken) = acks::Acks::new(client, kind);
    let by_lease = resource.clone();
    let controller = controller
        .watches_stream(triggers::lease_triggers(kind, events), move |lease| {
            lease
                .labels()
                .get(kind.lease_label())
                .map(|ring| ObjectRef::<DynamicObject>::new_with(ring, by_lease.clone()))
        })
        .watches_stream_with(
            woken,
            move |ring| Some(ObjectRef::new_with(&ring.name_any(), resource.clone())),
            kind.api_resource(),
        )
        .with_config(kube::runtime::controller::Config::default().debounce(DEBOUNCE));
    ((controller, listed), leases, acks)
}
