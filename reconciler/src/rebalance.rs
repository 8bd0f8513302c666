//! Rebalancing (docs/design.md §6, §2 steps 4-7): lists a ring's objects, metadata only, page
//! by page, and drains or assigns those not on their desired shard, each write with the object's
//! resourceVersion. Lists and writes overlap through one bounded channel, so a page is read to
//! its end however slowly its objects are written and memory follows the page size.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, ResourceExt};
use sharder_common::handover::OwnerState;
use sharder_common::{GroupResource, Ring, RingId, RingLabels, Role, is_available};
use tracing::warn;

pub(crate) mod concurrency;
mod listing;
pub(crate) mod pages;
pub(crate) mod plan;
pub(crate) mod strays;
mod writing;

use writing::{Handled, RateLimiter};

use concurrency::WriteSlots;
pub(crate) use plan::{Move, Reason};

use crate::metrics::Metrics;
use crate::terms::{Namespaces, ObjectId, Pass, Scope, Target};

/// The first wait after a write conflict (409); it doubles, with jitter.
pub(crate) const CONFLICT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// The longest wait between two attempts of a conflicting write.
pub(crate) const CONFLICT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How often a conflicting write is re-read, decided again and retried before it fails.
pub(crate) const CONFLICT_RETRIES: usize = 5;

/// How often a write or a list page the apiserver was too busy for is sent again.
pub(crate) const OVERLOAD_RETRIES: usize = 5;

/// How long a write may take before it counts as unanswered (an overload: it is sent again).
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes in flight when the reconciler starts; the limit adapts from there.
pub(crate) const INITIAL_CONCURRENT_WRITES: usize = 16;

/// Listed objects that may wait for a write slot beyond a page, so the writers do not run dry
/// while the next page is prepared.
pub(crate) const LISTED_AHEAD: usize = 64;

/// The rebalancer's clients: list pages, and object writes with the reads around them.
#[derive(Clone)]
pub struct Clients {
    /// List pages.
    pub lists: Client,
    /// Object writes and reads.
    pub writes: Client,
}

/// Settings of the rebalancer.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Objects per list page.
    pub page_size: u32,
    /// The most writes in flight at once (the adaptive limit's ceiling).
    pub max_concurrent_writes: usize,
}

/// Counts of one rebalance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Objects listed.
    pub listed: usize,
    /// Drain labels added.
    pub drained: usize,
    /// Main objects listed that were draining already (such as a previous leader's drains).
    pub already_draining: usize,
    /// Direct assignments, by reason.
    pub assigned: BTreeMap<Reason, usize>,
    /// Lists and writes that failed (writes after retries).
    pub errors: usize,
    /// Of those, failed lists.
    pub failed_lists: usize,
    /// Of those, writes refused for good (forbidden, invalid).
    pub refused: usize,
    /// Controlled objects waiting for their owner, or whose move failed.
    pub awaiting: Vec<ObjectId>,
    /// Objects that needed a write but were left because the ring was gone by then.
    pub abandoned: usize,
    /// Per resource, the objects no available shard held, as the last list of all of them found.
    pub strays: BTreeMap<GroupResource, strays::Strays>,
    /// The lists run.
    pub lists: BTreeSet<Scope>,
    /// Drains not acknowledged yet, as counted after the lists (0 when not counted).
    pub pending_drains: usize,
    /// Whether drains are pending, or the list after them must come again (it failed or
    /// drained again).
    pub drains_pending: bool,
}

impl Outcome {
    /// Whether anything was written.
    pub(crate) fn moved_anything(&self) -> bool {
        self.drained > 0 || self.assigned.values().any(|n| *n > 0)
    }

    /// Adds `other`'s counts and waiting objects to these.
    pub(crate) fn add(&mut self, other: Outcome) {
        self.listed += other.listed;
        self.drained += other.drained;
        self.already_draining += other.already_draining;
        self.errors += other.errors;
        self.failed_lists += other.failed_lists;
        self.refused += other.refused;
        self.abandoned += other.abandoned;
        for (reason, n) in other.assigned {
            *self.assigned.entry(reason).or_default() += n;
        }
        self.awaiting.extend(other.awaiting);
        self.lists.extend(other.lists);
        self.pending_drains += other.pending_drains;
        self.drains_pending |= other.drains_pending;
        // `other` listed later: what it found replaces what was found before.
        self.strays.extend(other.strays);
    }

    fn count(&mut self, handled: Handled) {
        match handled {
            Handled::Moved(Move::Drain { .. }) => self.drained += 1,
            Handled::Moved(Move::Assign { reason, .. }) => {
                *self.assigned.entry(reason).or_default() += 1;
            }
            Handled::Awaiting(object) => self.awaiting.push(object),
            Handled::Stayed => {}
            Handled::Failed { object, permanent } => {
                self.errors += 1;
                self.refused += usize::from(permanent);
                self.awaiting.extend(object);
            }
            Handled::Abandoned => self.abandoned += 1,
        }
    }
}

/// One ring's view for a rebalance.
pub(crate) struct RingView<'a> {
    /// The ring.
    pub id: &'a RingId,
    /// Its label keys.
    pub labels: &'a RingLabels,
    /// The ring of available shards.
    pub ring: &'a Ring,
    /// The available shards.
    pub available: &'a BTreeSet<String>,
    /// Where namespaced objects may be.
    pub namespaces: &'a Namespaces,
    /// The shards holding their Leases now, read once when first needed.
    pub live_now: &'a LiveNow,
    /// Whether the ring is still the one this rebalance is for (not deleted or replaced).
    pub current: &'a (dyn Fn() -> bool + Send + Sync),
}

impl RingView<'_> {
    /// Whether the ring is still the one this rebalance is for.
    pub(crate) fn is_current(&self) -> bool {
        (self.current)()
    }

    /// What object `meta` of `target` needs on this ring ([`plan::decide`]; `owner`: its
    /// owner's state once read).
    fn decide(
        &self,
        target: &Target,
        meta: &ObjectMeta,
        owner: Option<&OwnerState>,
    ) -> plan::Decision {
        let key = plan::key_of(meta, target.role, &target.resource.group, &target.api.kind);
        let (ring, available, labels) = (self.ring, self.available, self.labels);
        plan::decide(
            meta,
            key.as_ref(),
            target.role,
            ring,
            available,
            labels,
            owner,
        )
    }
}

/// The ring's shards whose Leases are held now: one list of the ring's Leases, the first time
/// an object sits on a shard the rebalance's snapshot does not count as available.
#[derive(Debug, Default)]
pub(crate) struct LiveNow(tokio::sync::OnceCell<Option<BTreeSet<String>>>);

impl LiveNow {
    /// Whether `shard`'s Lease is held now; `true` when the Leases cannot be read (it stays).
    pub(crate) async fn holds(&self, client: &Client, ring: &RingId, shard: &str) -> bool {
        let live = self
            .0
            .get_or_init(|| async {
                let leases: Api<Lease> = Api::all(client.clone());
                let selector = ring.lease_selector();
                match leases.list(&ListParams::default().labels(&selector)).await {
                    Ok(list) => Some(
                        list.items
                            .iter()
                            .filter(|l| is_available(l))
                            .map(ResourceExt::name_any)
                            .collect(),
                    ),
                    Err(e) => {
                        warn!(%ring, error = %e, "cannot read the ring's Leases; objects on shards outside the ring wait");
                        None
                    }
                }
            })
            .await;
        live.as_ref().is_none_or(|live| live.contains(shard))
    }
}

/// The rebalancer: lists and writes with one client, one rate limiter, one set of write slots
/// and shared metrics.
#[derive(Clone)]
pub(crate) struct Rebalancer {
    lists: Client,
    writes: Client,
    settings: Settings,
    limiter: Arc<RateLimiter>,
    slots: Arc<WriteSlots>,
    metrics: Metrics,
}

impl Rebalancer {
    /// A rebalancer with `clients`, writing at most `max_writes_per_second` (0: unlimited).
    pub(crate) fn new(
        clients: Clients,
        settings: Settings,
        max_writes_per_second: u32,
        metrics: Metrics,
    ) -> Self {
        let max = settings.max_concurrent_writes.max(1);
        Self {
            lists: clients.lists,
            writes: clients.writes,
            slots: Arc::new(WriteSlots::new(
                INITIAL_CONCURRENT_WRITES.min(max),
                max,
                metrics.write_concurrency.clone(),
            )),
            settings,
            limiter: Arc::new(RateLimiter::new(max_writes_per_second)),
            metrics,
        }
    }

    /// The writes the adaptive limit lets be in flight now ([`concurrency`]).
    pub(crate) fn write_limit(&self) -> usize {
        self.slots.in_flight().1
    }

    /// The integral of the writes in flight up to now (every ring's).
    pub(crate) fn busy(&self) -> concurrency::Busy {
        self.slots.busy()
    }

    /// How many objects are handled at once: as many as there are write slots.
    fn parallel(&self) -> usize {
        self.settings.max_concurrent_writes.max(1)
    }

    /// Whether `meta` is a main object of `target` that needs no write (no request needed).
    fn stays(&self, view: &RingView<'_>, target: &Target, meta: &ObjectMeta) -> bool {
        if target.role != Role::Main {
            return false;
        }
        view.decide(target, meta, None) == plan::Decision::Stay
    }

    /// Runs `pass`: its lists, then the children still waiting for their owners read again by
    /// name, then a count of the drains still pending where there can be some
    /// ([`Pass::counts_drains`]) and, once none is, everything once more
    /// ([`Scope::AfterDrains`]). Stops after the lists when the ring is gone.
    pub(crate) async fn pass(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        pass: &Pass,
    ) -> Outcome {
        let mut outcome = self.run(view, targets, &pass.lists).await;
        if !view.is_current() {
            return outcome;
        }
        if !pass.recheck.is_empty() {
            let mut seen: BTreeSet<&ObjectId> = outcome.awaiting.iter().collect();
            let rest: Vec<ObjectId> = pass
                .recheck
                .iter()
                .filter(|o| seen.insert(o))
                .cloned()
                .collect();
            outcome.add(self.recheck(view, targets, rest).await);
        }
        if pass.counts_drains(outcome.drained) {
            for target in targets.iter().filter(|t| t.role == Role::Main) {
                // A failed count is taken as pending, so the drain check comes again soon.
                outcome.pending_drains += self.pending_drains(view, target).await.unwrap_or(1);
            }
        }
        outcome.drains_pending = outcome.pending_drains > 0;
        let drains = outcome.drained + outcome.already_draining;
        if pass.lists_after_drains(outcome.pending_drains, drains) {
            let after = self.run(view, targets, &[Scope::AfterDrains].into()).await;
            if after.failed_lists == 0 {
                // Every child was planned again after the drains ended: those still waiting
                // are in `after`.
                outcome.awaiting.clear();
            }
            outcome.drains_pending =
                after.failed_lists > 0 || after.drained + after.already_draining > 0;
            outcome.add(after);
        }
        outcome
    }

    /// Lists and writes every target over every scope, main resources first (children follow
    /// them).
    async fn run(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        scopes: &BTreeSet<Scope>,
    ) -> Outcome {
        let mut outcome = Outcome {
            lists: scopes.clone(),
            ..Outcome::default()
        };
        let ordered = targets
            .iter()
            .filter(|t| t.role == Role::Main)
            .chain(targets.iter().filter(|t| t.role == Role::Controlled));
        for target in ordered {
            for scope in scopes {
                outcome.add(self.list_and_write(view, targets, target, scope).await);
            }
        }
        outcome
    }

    /// Looks again at controlled objects that waited for their owners.
    async fn recheck(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        awaiting: Vec<ObjectId>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let results: Vec<Handled> = futures::stream::iter(awaiting)
            .map(|object| async move {
                let Some(target) = targets.iter().find(|t| t.resource == object.resource) else {
                    return Handled::Stayed;
                };
                let api = self.api(target, object.namespace.as_deref());
                match api.get_metadata_opt(&object.name).await {
                    Ok(Some(fresh)) => self.handle(view, targets, target, fresh.metadata).await,
                    Ok(None) => Handled::Stayed,
                    Err(e) => {
                        warn!(resource = %target.resource, object = %object.name, error = %e, "cannot read a waiting object");
                        Handled::Awaiting(object)
                    }
                }
            })
            .buffer_unordered(self.parallel())
            .collect()
            .await;
        for result in results {
            outcome.count(result);
        }
        outcome
    }

    /// Counts `target`'s objects carrying the drain label, up to the first page holding any.
    async fn pending_drains(
        &self,
        view: &RingView<'_>,
        target: &Target,
    ) -> Result<usize, kube::Error> {
        let mut pending = 0;
        for namespace in view.namespaces.list_ranges(target) {
            let mut params = ListParams::default()
                .labels(&view.labels.drain)
                .limit(self.settings.page_size);
            loop {
                let mut page =
                    listing::Page::open(&self.lists, &target.api, namespace, &params).await?;
                while let Some(meta) = page.next() {
                    pending +=
                        usize::from(view.namespaces.holds(target, meta.namespace.as_deref()));
                }
                if pending > 0 {
                    return Ok(pending);
                }
                match page.continue_token() {
                    Some(token) => params = params.continue_token(token),
                    None => break,
                }
            }
        }
        Ok(pending)
    }

    /// One list of `target`'s objects in `scope`, handed to the writers through one bounded
    /// channel ([`listing::channel_capacity`]).
    async fn list_and_write(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        scope: &Scope,
    ) -> Outcome {
        let (tx, mut rx) =
            tokio::sync::mpsc::channel(listing::channel_capacity(self.settings.page_size));
        let lister = self.list_into(view, target, scope, tx);
        let writers = async {
            let mut outcome = Outcome::default();
            let mut results = std::pin::pin!(
                futures::stream::poll_fn(|cx| rx.poll_recv(cx))
                    .map(|meta: pages::ListedMeta| self.handle(view, targets, target, meta.into()))
                    .buffer_unordered(self.parallel())
            );
            while let Some(result) = results.next().await {
                outcome.count(result);
            }
            outcome
        };
        let (listed, mut outcome) = tokio::join!(lister, writers);
        outcome.add(listed);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> ObjectId {
        ObjectId {
            resource: GroupResource::new("", "configmaps"),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_controlled_object_whose_write_failed_is_looked_at_again_and_a_main_one_is_not() {
        let mut outcome = Outcome::default();
        outcome.count(Handled::Failed {
            object: Some(object("child-1")),
            permanent: false,
        });
        outcome.count(Handled::Failed {
            object: None,
            permanent: true,
        });
        outcome.count(Handled::Awaiting(object("child-2")));
        assert_eq!((outcome.errors, outcome.refused), (2, 1));
        assert_eq!(outcome.awaiting, [object("child-1"), object("child-2")]);
    }
}
