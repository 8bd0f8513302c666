//! Rebalancing (docs/design.md §5): lists a ring's objects (metadata only, page by page, label-selected
//! to what can need work) and drains or assigns those not on their desired shard, each write
//! with the object's resourceVersion, bounded in concurrency and rate. Every move is logged.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};
use sharder_common::key::display_name;
use sharder_common::{GroupResource, Ring, RingLabels, Role};
use sharder_runtime::metrics::ResourceLabels;
use tokio::sync::Mutex;
use tracing::{info, warn};

pub mod plan;

pub use plan::{Move, Reason};

use crate::metrics::Metrics;

/// The first wait after a write conflict (409); it doubles (with jitter) up to
/// [`CONFLICT_BACKOFF_MAX`].
pub const CONFLICT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// The longest wait between two attempts of a conflicting write.
pub const CONFLICT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How often a conflicting write is re-read, re-planned and retried before it counts as failed
/// (the next rebalance tries again).
pub const CONFLICT_RETRIES: usize = 5;

/// One resource of a ring, resolved through discovery.
#[derive(Clone, Debug)]
pub struct Target {
    /// Group and plural name.
    pub resource: GroupResource,
    /// Main or controlled.
    pub role: Role,
    /// Kind, version and plural for requests.
    pub api: ApiResource,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// Which objects one list selects.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every object of the resource (a shard was added, the ring changed, periodic resync).
    All,
    /// Objects on one shard (`<shard label>=<shard>`), when that shard died.
    OnShard(String),
    /// Objects without a shard (`!<shard label>`): new objects the webhook missed, objects
    /// whose drain was acknowledged, `generateName` objects.
    Unassigned,
}

impl Scope {
    fn selector(&self, labels: &RingLabels) -> Option<String> {
        match self {
            Self::All => None,
            Self::OnShard(shard) => Some(format!("{}={shard}", labels.shard)),
            Self::Unassigned => Some(format!("!{}", labels.shard)),
        }
    }
}

/// Which namespaces a ring's namespaced objects may be in.
#[derive(Clone, Debug)]
pub struct Namespaces(pub HashSet<String>);

/// Bounds the rate of writes: at most one per `interval`, shared by all writers.
#[derive(Debug)]
pub struct RateLimiter {
    next: Mutex<tokio::time::Instant>,
    interval: Duration,
}

impl RateLimiter {
    /// At most `per_second` writes per second; 0 means unlimited.
    pub fn new(per_second: u32) -> Self {
        let interval = if per_second == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(1) / per_second
        };
        Self {
            next: Mutex::new(tokio::time::Instant::now()),
            interval,
        }
    }

    async fn wait(&self) {
        if self.interval.is_zero() {
            return;
        }
        let at = {
            let mut next = self.next.lock().await;
            let now = tokio::time::Instant::now();
            let at = (*next).max(now);
            *next = at + self.interval;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// Settings of the rebalancer.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Objects per list page.
    pub page_size: u32,
    /// Writes in flight at once.
    pub max_concurrent_writes: usize,
}

/// Counts of one rebalance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Objects listed.
    pub listed: usize,
    /// Drain labels added.
    pub drained: usize,
    /// Direct assignments, by reason.
    pub assigned: BTreeMap<Reason, usize>,
    /// Writes that failed after retries.
    pub errors: usize,
}

impl Outcome {
    /// Whether anything was written.
    pub fn moved_anything(&self) -> bool {
        self.drained > 0 || self.assigned.values().any(|n| *n > 0)
    }

    fn add(&mut self, other: Outcome) {
        self.listed += other.listed;
        self.drained += other.drained;
        self.errors += other.errors;
        for (reason, n) in other.assigned {
            *self.assigned.entry(reason).or_default() += n;
        }
    }
}

/// One ring's view for a rebalance.
pub struct RingView<'a> {
    /// The ring's name.
    pub name: &'a str,
    /// Its label keys.
    pub labels: &'a RingLabels,
    /// The ring of available shards.
    pub ring: &'a Ring,
    /// The available shards.
    pub available: &'a BTreeSet<String>,
    /// Where namespaced objects may be.
    pub namespaces: &'a Namespaces,
}

/// What a single write ended with.
enum Written {
    Moved(Move),
    Stayed,
    Failed,
}

/// The rebalancer: lists and writes with one client, one rate limiter and shared metrics.
#[derive(Clone)]
pub struct Rebalancer {
    client: Client,
    settings: Settings,
    limiter: Arc<RateLimiter>,
    metrics: Metrics,
}

impl Rebalancer {
    /// A rebalancer writing at most `max_writes_per_second` (0: unlimited).
    pub fn new(
        client: Client,
        settings: Settings,
        max_writes_per_second: u32,
        metrics: Metrics,
    ) -> Self {
        Self {
            client,
            settings,
            limiter: Arc::new(RateLimiter::new(max_writes_per_second)),
            metrics,
        }
    }

    /// Rebalances every target over every scope.
    pub async fn run(&self, view: &RingView<'_>, targets: &[Target], scopes: &[Scope]) -> Outcome {
        let mut outcome = Outcome::default();
        for target in targets {
            for scope in scopes {
                outcome.add(self.rebalance(view, target, scope).await);
            }
        }
        outcome
    }

    /// Counts objects of `target` carrying the drain label (drains not acknowledged yet).
    pub async fn pending_drains(
        &self,
        view: &RingView<'_>,
        target: &Target,
    ) -> Result<usize, kube::Error> {
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &target.api);
        let list = api
            .list_metadata(
                &ListParams::default()
                    .labels(&view.labels.drain)
                    .limit(self.settings.page_size),
            )
            .await?;
        Ok(list.items.len())
    }

    async fn rebalance(&self, view: &RingView<'_>, target: &Target, scope: &Scope) -> Outcome {
        let mut outcome = Outcome::default();
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &target.api);
        let mut params = ListParams::default().limit(self.settings.page_size);
        if let Some(selector) = scope.selector(view.labels) {
            params = params.labels(&selector);
        }
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                Err(e) => {
                    warn!(resource = %target.resource, error = %e, "cannot list objects");
                    outcome.errors += 1;
                    return outcome;
                }
            };
            outcome.listed += page.items.len();
            let moves: Vec<(ObjectMeta, Move)> = page
                .items
                .into_iter()
                .filter(|o| {
                    !target.namespaced
                        || o.metadata
                            .namespace
                            .as_ref()
                            .is_some_and(|ns| view.namespaces.0.contains(ns))
                })
                .filter_map(|o| {
                    let key = plan::key_of(
                        &o.metadata,
                        target.role,
                        &target.resource.group,
                        &target.api.kind,
                    );
                    let mv = plan::plan(
                        &o.metadata,
                        key.as_ref(),
                        target.role,
                        view.ring,
                        view.available,
                        view.labels,
                    )?;
                    Some((o.metadata, mv))
                })
                .collect();
            let results: Vec<Written> = futures::stream::iter(moves)
                .map(|(meta, mv)| self.write(view, target, meta, mv))
                .buffer_unordered(self.settings.max_concurrent_writes.max(1))
                .collect()
                .await;
            for result in results {
                match result {
                    Written::Moved(Move::Drain { .. }) => outcome.drained += 1,
                    Written::Moved(Move::Assign { reason, .. }) => {
                        *outcome.assigned.entry(reason).or_default() += 1;
                    }
                    Written::Stayed => {}
                    Written::Failed => outcome.errors += 1,
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return outcome,
            }
        }
    }

    /// Writes one move with the object's resourceVersion; on a conflict re-reads the object,
    /// re-plans and retries with backoff ([`CONFLICT_RETRIES`] times).
    async fn write(
        &self,
        view: &RingView<'_>,
        target: &Target,
        mut meta: ObjectMeta,
        mut mv: Move,
    ) -> Written {
        let name = meta.name.clone().unwrap_or_default();
        let api = match (&meta.namespace, target.namespaced) {
            (Some(ns), true) => {
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &target.api)
            }
            _ => Api::<DynamicObject>::all_with(self.client.clone(), &target.api),
        };
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(CONFLICT_BACKOFF_MIN)
            .with_max_delay(CONFLICT_BACKOFF_MAX)
            .with_max_times(CONFLICT_RETRIES)
            .with_jitter()
            .build();
        loop {
            self.limiter.wait().await;
            let patch = mv.patch(
                view.labels,
                meta.resource_version.as_deref().unwrap_or_default(),
            );
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.log_and_count(view, target, &meta, &mv);
                    return Written::Moved(mv);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return Written::Stayed,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let Some(delay) = backoff.next() else {
                        warn!(object = %display_name(&meta), "move still conflicting after retries");
                        return Written::Failed;
                    };
                    tokio::time::sleep(delay).await;
                    let fresh = match api.get_metadata_opt(&name).await {
                        Ok(Some(fresh)) => fresh.metadata,
                        Ok(None) => return Written::Stayed,
                        Err(e) => {
                            warn!(object = %display_name(&meta), error = %e, "cannot re-read object after a conflict");
                            return Written::Failed;
                        }
                    };
                    let key = plan::key_of(
                        &fresh,
                        target.role,
                        &target.resource.group,
                        &target.api.kind,
                    );
                    match plan::plan(
                        &fresh,
                        key.as_ref(),
                        target.role,
                        view.ring,
                        view.available,
                        view.labels,
                    ) {
                        Some(next) => {
                            meta = fresh;
                            mv = next;
                        }
                        None => return Written::Stayed,
                    }
                }
                Err(e) => {
                    warn!(object = %display_name(&meta), error = %e, "move failed");
                    return Written::Failed;
                }
            }
        }
    }

    fn log_and_count(&self, view: &RingView<'_>, target: &Target, meta: &ObjectMeta, mv: &Move) {
        let object = display_name(meta);
        let labels = ResourceLabels {
            clusterring: view.name.to_owned(),
            group: target.resource.group.clone(),
            resource: target.resource.resource.clone(),
        };
        match mv {
            Move::Drain { from, to } => {
                self.metrics.drains.get_or_create(&labels).inc();
                info!(resource = %target.resource, %object, from = %from, to = %to, reason = %Reason::Drain, "draining");
            }
            Move::Assign { from, to, reason } => {
                self.metrics.movements.get_or_create(&labels).inc();
                let from = from.as_deref().unwrap_or("");
                info!(resource = %target.resource, %object, from = %from, to = %to, reason = %reason, "moved");
            }
        }
    }
}
