//! Rebalancing (docs/design.md §6, §2 steps 4-7): lists a ring's objects, metadata only, page
//! by page, and drains or assigns those not on their desired shard, each write with the object's
//! resourceVersion. Lists and writes overlap through one bounded channel, so a page is read to
//! its end however slowly its objects are written and memory follows the page size.

use std::collections::BTreeSet;

use futures::StreamExt;
use kube::Client;
use kube::api::ListParams;
use sharder_common::Role;
use tokio::time::Instant;
use tracing::warn;

pub(crate) mod concurrency;
mod listing;
mod outcome;
pub(crate) mod pages;
pub(crate) mod plan;
pub(crate) mod strays;
mod view;
mod writing;

pub(crate) use outcome::Outcome;
pub(crate) use view::{LiveNow, OwnerReads, RingView};

use outcome::Handled;
use writing::Writer;

use crate::metrics::Metrics;
use crate::terms::{ObjectId, Pass, Scope, Target};

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

/// The rebalancer: lists with one client and writes through one [`Writer`] (its rate limit,
/// write slots and metrics shared by every ring).
#[derive(Clone)]
pub(crate) struct Rebalancer {
    lists: Client,
    writer: Writer,
    settings: Settings,
}

impl Rebalancer {
    /// A rebalancer with `clients`, writing at most `max_writes_per_second` (0: unlimited).
    pub(crate) fn new(
        clients: Clients,
        settings: Settings,
        max_writes_per_second: u32,
        metrics: Metrics,
    ) -> Self {
        let writer = Writer::new(
            clients.writes,
            settings.max_concurrent_writes,
            max_writes_per_second,
            metrics,
        );
        Self {
            lists: clients.lists,
            writer,
            settings,
        }
    }

    /// The writes the adaptive limit lets be in flight now ([`concurrency`]).
    pub(crate) fn write_limit(&self) -> usize {
        self.writer.slots.in_flight().1
    }

    /// The integral of the writes in flight up to now (every ring's).
    pub(crate) fn busy(&self) -> concurrency::Busy {
        self.writer.slots.busy()
    }

    /// How many objects are handled at once: as many as there are write slots.
    fn parallel(&self) -> usize {
        self.settings.max_concurrent_writes.max(1)
    }

    /// Runs `pass`: its lists, then the children still waiting for their owners read again by
    /// name, then a count of the drains still pending where there can be some
    /// ([`Pass::counts_drains`]) and, once none is, everything once more
    /// ([`Scope::AfterDrains`]), and the waiting children once more while a step moved
    /// others. Stops after the lists when the ring is gone.
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
        // Each level of a chain follows the level above it once that one has moved: while a
        // step assigned objects and others wait, the waiting ones are read again.
        let mut assigned = outcome.assigned.values().sum::<usize>();
        for _ in 0..plan::MAX_CHAIN_LEVELS {
            if assigned == 0 || outcome.awaiting.is_empty() || !view.is_current() {
                break;
            }
            let again = if outcome.too_many_awaiting() {
                // Too many to read by name: everything is listed again.
                outcome.awaiting.clear();
                self.run(view, targets, &[Scope::AfterDrains].into()).await
            } else {
                let waiting = std::mem::take(&mut outcome.awaiting);
                self.recheck(view, targets, waiting).await
            };
            assigned = again.assigned.values().sum();
            outcome.add(again);
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
        view.owner_reads.new_round();
        let mut outcome = Outcome::default();
        let results: Vec<Handled> = futures::stream::iter(awaiting)
            .map(|object| async move {
                let Some(target) = targets.iter().find(|t| t.resource == object.resource) else {
                    return Handled::Stayed;
                };
                let api = self.writer.api(target, object.namespace.as_deref());
                match api.get_metadata_opt(&object.name).await {
                    Ok(Some(fresh)) => {
                        let seen = Instant::now();
                        self.writer
                            .handle(view, targets, target, fresh.metadata, seen)
                            .await
                    }
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
        view.owner_reads.new_round();
        let (tx, mut rx) =
            tokio::sync::mpsc::channel(listing::channel_capacity(self.settings.page_size));
        let lister = listing::list_into(
            &self.lists,
            view,
            target,
            scope,
            self.settings.page_size,
            tx,
        );
        let writers = async {
            let mut outcome = Outcome::default();
            let mut results = std::pin::pin!(
                futures::stream::poll_fn(|cx| rx.poll_recv(cx))
                    .map(|(meta, seen): listing::Listed| {
                        self.writer.handle(view, targets, target, meta.into(), seen)
                    })
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
