//! Rebalancing (docs/design.md §5): lists a ring's objects (metadata only, page by page, label-selected
//! to what can need work; across the cluster or namespace by namespace, see [`Namespaces`]) and
//! drains or assigns those not on their desired shard, each write with the object's
//! resourceVersion, bounded in concurrency and rate. Every move is logged.
//!
//! Lists and writes run as a pipeline: the writes never wait for a page to finish, and a page
//! is never left waiting for the writes. A page is requested once its objects have room to wait
//! for a write slot (a page and [`LISTED_AHEAD`] more), so it is read to its end as fast as
//! the apiserver sends it, however slowly its objects are written: the apiserver ends a
//! request that outlives its `--request-timeout` by closing the connection. What a page holds
//! is cut down to the fields a move needs as it is parsed (no managedFields, annotations or the
//! like), and only objects that need a write wait, so memory grows with the page size and
//! never with the number of objects. How many writes are in flight adapts to the apiserver's
//! answers ([`concurrency`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use kube::api::{ListParams, ObjectMeta};
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};
use sharder_common::key::{display_name, group_of_api_version};
use sharder_common::{GroupResource, Ring, RingLabels, Role};
use sharder_runtime::metrics::{ResourceLabels, RingLabel};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

pub mod concurrency;
pub mod pages;
pub mod plan;
pub mod requests;

use concurrency::{Answer, WriteSlots};
use plan::ChildPlan;
pub use plan::{Move, Reason};
use sharder_common::OwnerState;

use crate::metrics::{FailedWriteLabels, Metrics};

/// The first wait after a write conflict (409); it doubles (with jitter) up to
/// [`CONFLICT_BACKOFF_MAX`].
pub const CONFLICT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// The longest wait between two attempts of a conflicting write.
pub const CONFLICT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How often a conflicting write is re-read, re-planned and retried before it counts as failed
/// (the next rebalance tries again).
pub const CONFLICT_RETRIES: usize = 5;

/// How often a write the apiserver was too busy for (429, 503, 504, a failed connection) is
/// sent again, after its Retry-After or a backoff, before it counts as failed.
pub const OVERLOAD_RETRIES: usize = 5;

/// How long a write may take before it counts as unanswered (an overload: it is sent again,
/// and a write that did land meanwhile makes the next attempt conflict, re-read and stay).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes in flight when the reconciler starts; the limit adapts from there (up to
/// `--max-concurrent-writes`).
pub const INITIAL_CONCURRENT_WRITES: usize = 16;

/// Listed objects that may still wait for a write slot when the next page is requested (on
/// top of the page's own): the writers work through them while the apiserver prepares the page
/// (about 0.2 s per page with 300,000 objects in a namespace on etcd 3.4), so they do not run
/// dry at a page boundary. One round of the default write slots.
pub const LISTED_AHEAD: usize = 64;

/// The rebalancer's clients: list pages and object writes (with the small reads around them:
/// owners, re-reads after a conflict) each on connections of their own.
#[derive(Clone)]
pub struct Clients {
    /// List pages.
    pub lists: Client,
    /// Object writes and reads.
    pub writes: Client,
}

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

/// One list of a target's objects: across the cluster (`namespace` `None`) or in one
/// namespace, its pages continuing `first`.
#[derive(Clone, Copy, Debug)]
struct ListRange<'a> {
    target: &'a Target,
    namespace: Option<&'a str>,
    first: &'a ListParams,
    /// Places for listed objects waiting for a write slot.
    room: &'a Arc<Semaphore>,
}

/// Which namespaces a ring's namespaced objects may be in, and how they are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// The ring's namespaces.
    pub selected: BTreeSet<String>,
    /// List namespaced objects namespace by namespace instead of across the cluster (see
    /// [`Namespaces::new`]).
    pub one_by_one: bool,
}

impl Namespaces {
    /// The ring's namespaces `selected` among the cluster's `total`. Its namespaced objects
    /// are listed namespace by namespace when it selects at most half of them, else across the
    /// cluster (objects elsewhere left out as they arrive). A list reads every object of the
    /// resource in its range from etcd, whatever the label selector: across the cluster, a
    /// ring of a few namespaces would read every Secret (say) of the cluster on every sweep,
    /// while one list per namespace reads only its own, at a request each.
    pub fn new(selected: BTreeSet<String>, total: usize) -> Self {
        let one_by_one = selected.len() * 2 <= total;
        Self {
            selected,
            one_by_one,
        }
    }

    /// Whether a namespaced object in `namespace` belongs to the ring.
    pub fn contains(&self, namespace: &str) -> bool {
        self.selected.contains(namespace)
    }

    /// Whether an object of `target` in `namespace` (as listed) belongs to the ring: every
    /// cluster-scoped one, a namespaced one in a selected namespace.
    pub fn holds(&self, target: &Target, namespace: Option<&str>) -> bool {
        !target.namespaced || namespace.is_some_and(|ns| self.contains(ns))
    }

    /// Where `target`'s objects are listed from: `None` for the whole cluster, else each
    /// namespace.
    pub fn list_ranges(&self, target: &Target) -> Vec<Option<&str>> {
        if target.namespaced && self.one_by_one {
            self.selected.iter().map(|ns| Some(ns.as_str())).collect()
        } else {
            vec![None]
        }
    }
}

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
    /// The most writes in flight at once (the adaptive limit's ceiling).
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
    /// Lists and writes that failed (writes after retries).
    pub errors: usize,
    /// Of those, failed lists.
    pub failed_lists: usize,
    /// Controlled objects waiting on a live shard for their owner to settle on its new shard
    /// (looked at again at every drain check until they followed it).
    pub awaiting: Vec<ObjectId>,
}

/// One object of a ring's resource: enough to read it again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId {
    /// Its resource.
    pub resource: GroupResource,
    /// Its namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl Outcome {
    /// Whether anything was written.
    pub fn moved_anything(&self) -> bool {
        self.drained > 0 || self.assigned.values().any(|n| *n > 0)
    }

    /// Adds `other`'s counts and waiting objects to these.
    pub fn add(&mut self, other: Outcome) {
        self.listed += other.listed;
        self.drained += other.drained;
        self.errors += other.errors;
        self.failed_lists += other.failed_lists;
        for (reason, n) in other.assigned {
            *self.assigned.entry(reason).or_default() += n;
        }
        self.awaiting.extend(other.awaiting);
    }

    fn count(&mut self, written: Written) {
        match written {
            Written::Moved(Move::Drain { .. }) => self.drained += 1,
            Written::Moved(Move::Assign { reason, .. }) => {
                *self.assigned.entry(reason).or_default() += 1;
            }
            Written::Awaiting(object) => self.awaiting.push(object),
            Written::Stayed => {}
            Written::Failed => self.errors += 1,
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

/// What handling one object ended with.
enum Written {
    Moved(Move),
    Awaiting(ObjectId),
    Stayed,
    Failed,
}

/// How listing a page ended.
enum Listed {
    /// Every object was handed over; the next page, already requested, if there is one.
    Page(Option<Opening>),
    /// The writers stopped taking objects.
    Stopped,
}

/// A list page being requested in the background, with the places its objects may take
/// (dropping it cancels the request).
type Opening = AbortOnDropHandle<Result<(requests::Page, OwnedSemaphorePermit), kube::Error>>;

/// A listed object waiting for a write slot, holding its place in the room.
type Waiting = (pages::Waiting, OwnedSemaphorePermit);

/// What one object needs.
enum Planned {
    Move(Move),
    Await,
    Stay,
}

/// The rebalancer: lists and writes with one client, one rate limiter, one set of write slots
/// and shared metrics.
#[derive(Clone)]
pub struct Rebalancer {
    lists: Client,
    writes: Client,
    settings: Settings,
    limiter: Arc<RateLimiter>,
    slots: Arc<WriteSlots>,
    metrics: Metrics,
}

impl Rebalancer {
    /// A rebalancer with `clients`, writing at most `max_writes_per_second` (0: unlimited).
    pub fn new(
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
    pub fn write_limit(&self) -> usize {
        self.slots.in_flight().1
    }

    /// The integral of the writes in flight up to now (every ring's).
    pub fn busy(&self) -> concurrency::Busy {
        self.slots.busy()
    }

    /// How many objects are handled at once: as many as there are write slots (objects that
    /// stay never get here, see [`Self::stays`]).
    fn parallel(&self) -> usize {
        self.settings.max_concurrent_writes.max(1)
    }

    /// Whether `meta` is a main object of `target` that needs no write (decided without any
    /// request; a controlled object may need its owner read, so it is never decided here).
    fn stays(&self, view: &RingView<'_>, target: &Target, meta: &ObjectMeta) -> bool {
        if target.role != Role::Main {
            return false;
        }
        let key = plan::key_of(meta, target.role, &target.resource.group, &target.api.kind);
        plan::plan(meta, key.as_ref(), view.ring, view.available, view.labels).is_none()
    }

    /// Rebalances every target over every scope: main resources first, so that controlled
    /// objects are planned against their owners' state after this pass's drains.
    pub async fn run(&self, view: &RingView<'_>, targets: &[Target], scopes: &[Scope]) -> Outcome {
        let mut outcome = Outcome::default();
        let ordered = targets
            .iter()
            .filter(|t| t.role == Role::Main)
            .chain(targets.iter().filter(|t| t.role == Role::Controlled));
        for target in ordered {
            for scope in scopes {
                outcome.add(self.rebalance(view, targets, target, scope).await);
            }
        }
        outcome
    }

    /// Looks again at controlled objects that were waiting for their owners: each one that can
    /// follow its owner now is moved (one write), the others stay in the returned outcome's
    /// `awaiting`.
    pub async fn recheck(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        awaiting: Vec<ObjectId>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let results: Vec<Written> = futures::stream::iter(awaiting)
            .map(|object| async move {
                let Some(target) = targets.iter().find(|t| t.resource == object.resource) else {
                    return Written::Stayed;
                };
                let api = self.api(target, object.namespace.as_deref());
                match api.get_metadata_opt(&object.name).await {
                    Ok(Some(fresh)) => self.handle(view, targets, target, fresh.metadata).await,
                    Ok(None) => Written::Stayed,
                    Err(e) => {
                        warn!(resource = %target.resource, object = %object.name, error = %e, "cannot read a waiting object");
                        Written::Awaiting(object)
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

    /// Counts objects of `target` carrying the drain label (drains not acknowledged yet), up to
    /// a page of them: the count ends with the first page that holds any (what a drain check
    /// needs is whether any is pending; the log shows the count).
    pub async fn pending_drains(
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
                    requests::Page::open(&self.lists, &target.api, namespace, &params).await?;
                while let Some(meta) = page.next().await? {
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

    async fn rebalance(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        scope: &Scope,
    ) -> Outcome {
        // What waits between the lister and the writers: at most a page and LISTED_AHEAD
        // objects, each holding a place in `room` until a writer takes it.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(
            self.settings.page_size as usize + LISTED_AHEAD,
        ));
        let lister = self.list_into(view, target, scope, &room, tx);
        let writers = async {
            let mut outcome = Outcome::default();
            let mut results = std::pin::pin!(
                futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|waiting| (waiting, rx))
                })
                .map(|(meta, place): Waiting| {
                    drop(place);
                    self.handle(view, targets, target, meta.into())
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

    /// Lists `target`'s objects in `scope` page by page into `tx`, across the cluster or
    /// namespace by namespace ([`Namespaces::list_ranges`]; objects in namespaces the ring does
    /// not shard are left out), each page once `room` has a place for each of its objects;
    /// the outcome counts what was listed and failed lists.
    async fn list_into(
        &self,
        view: &RingView<'_>,
        target: &Target,
        scope: &Scope,
        room: &Arc<Semaphore>,
        tx: UnboundedSender<Waiting>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let mut first = ListParams::default().limit(self.settings.page_size);
        if let Some(selector) = scope.selector(view.labels) {
            first = first.labels(&selector);
        }
        for namespace in view.namespaces.list_ranges(target) {
            let range = ListRange {
                target,
                namespace,
                first: &first,
                room,
            };
            let mut opening = self.open_page(&range, None);
            loop {
                let listing = std::time::Instant::now();
                let mut objects = 0;
                let page = self
                    .list_page(view, &range, opening, &tx, &mut objects)
                    .await;
                outcome.listed += objects;
                match page {
                    Ok(Listed::Stopped) => return outcome,
                    Ok(Listed::Page(next)) => {
                        debug!(resource = %target.resource, namespace = namespace.unwrap_or(""), objects, list_ms = listing.elapsed().as_secs_f64() * 1e3, "listed a page");
                        match next {
                            Some(next) => opening = next,
                            None => break,
                        }
                    }
                    Err(e) => {
                        warn!(resource = %target.resource, namespace = namespace.unwrap_or(""), error = %e, "cannot list objects");
                        outcome.errors += 1;
                        outcome.failed_lists += 1;
                        return outcome;
                    }
                }
            }
        }
        outcome
    }

    /// Requests a page of `range` in the background (its first, or the one `token`
    /// continues) once its room has a place for each object the page may hold.
    fn open_page(&self, range: &ListRange<'_>, token: Option<&str>) -> Opening {
        let client = self.lists.clone();
        let api = range.target.api.clone();
        let namespace = range.namespace.map(str::to_owned);
        let params = match token {
            Some(token) => range.first.clone().continue_token(token),
            None => range.first.clone(),
        };
        let room = Arc::clone(range.room);
        let page_size = self.settings.page_size;
        AbortOnDropHandle::new(tokio::spawn(async move {
            let places = room
                .acquire_many_owned(page_size)
                .await
                .expect("the room is never closed");
            let page = requests::Page::open(&client, &api, namespace.as_deref(), &params).await?;
            Ok((page, places))
        }))
    }

    /// Lists the page `opening` into `tx` as it arrives (counting its objects in `objects`),
    /// leaving out objects in namespaces the ring does not shard and main objects that stay;
    /// each object handed over takes one of the page's places (the rest are given back when
    /// the page ends). The next page (the range's first page continued) is requested as soon
    /// as its token is known, and opens once its places are free.
    async fn list_page(
        &self,
        view: &RingView<'_>,
        range: &ListRange<'_>,
        opening: Opening,
        tx: &UnboundedSender<Waiting>,
        objects: &mut usize,
    ) -> Result<Listed, kube::Error> {
        let target = range.target;
        let (mut page, mut places) = opening
            .await
            .map_err(|e| kube::Error::Service(e.into()))??;
        let mut next = None;
        let prefetch = |page: &requests::Page, next: &mut Option<Opening>| {
            if next.is_none()
                && let Some(Some(token)) = page.early_continue_token()
            {
                *next = Some(self.open_page(range, Some(token)));
            }
        };
        loop {
            prefetch(&page, &mut next);
            let Some(meta) = page.next().await? else {
                break;
            };
            *objects += 1;
            // A main object that stays is done here; only work goes to the writers.
            if !view.namespaces.holds(target, meta.namespace.as_deref())
                || self.stays(view, target, &meta)
            {
                continue;
            }
            // A page longer than asked for (a server that ignores `limit`) waits for places.
            let place = match places.split(1) {
                Some(place) => place,
                None => Arc::clone(range.room)
                    .acquire_owned()
                    .await
                    .expect("the room is never closed"),
            };
            if tx.send((meta.into(), place)).is_err() {
                return Ok(Listed::Stopped);
            }
        }
        // A list whose metadata came after its objects: the token is known only now.
        prefetch(&page, &mut next);
        Ok(Listed::Page(next))
    }

    /// The Api of `target` (in `namespace`) on the write client: object writes and the small
    /// reads around them (owners, re-reads after a conflict).
    fn api(&self, target: &Target, namespace: Option<&str>) -> Api<DynamicObject> {
        match (namespace, target.namespaced) {
            (Some(ns), true) => {
                Api::<DynamicObject>::namespaced_with(self.writes.clone(), ns, &target.api)
            }
            _ => Api::<DynamicObject>::all_with(self.writes.clone(), &target.api),
        }
    }

    /// What object `meta` of `target` needs: for a controlled object, its owner's state is
    /// read when the owner decides (docs/design.md §5).
    async fn plan(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        meta: &ObjectMeta,
    ) -> Planned {
        let key = plan::key_of(meta, target.role, &target.resource.group, &target.api.kind);
        if target.role == Role::Main {
            return match plan::plan(meta, key.as_ref(), view.ring, view.available, view.labels) {
                Some(mv) => Planned::Move(mv),
                None => Planned::Stay,
            };
        }
        let child =
            match plan::plan_child(meta, key.as_ref(), view.ring, view.available, view.labels) {
                Some(decided) => decided,
                None => {
                    let owner = self.owner_state(view, targets, meta).await;
                    plan::follow_owner(
                        meta,
                        key.as_ref(),
                        view.ring,
                        view.available,
                        view.labels,
                        &owner,
                    )
                }
            };
        match child {
            ChildPlan::Move(mv) => Planned::Move(mv),
            ChildPlan::AwaitOwner => Planned::Await,
            ChildPlan::Stay => Planned::Stay,
        }
    }

    /// The state of the controller owner of the controlled object `meta`: read from the
    /// apiserver (metadata only) when the owner's resource is a main resource of the ring.
    async fn owner_state(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        meta: &ObjectMeta,
    ) -> OwnerState {
        let Some(owner) = meta
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
        else {
            return OwnerState::Missing;
        };
        let Ok(group) = group_of_api_version(&owner.api_version) else {
            return OwnerState::Missing;
        };
        let Some(target) = targets.iter().find(|t| {
            t.role == Role::Main && t.resource.group == group && t.api.kind == owner.kind
        }) else {
            return OwnerState::NotSharded;
        };
        match self
            .api(target, meta.namespace.as_deref())
            .get_metadata_opt(&owner.name)
            .await
        {
            Ok(found) => OwnerState::of(found.as_ref().map(|o| &o.metadata), view.labels),
            // Unknown: treat it as not settled, so the child waits (never moves ahead of it).
            Err(e) => {
                warn!(object = %display_name(meta), owner = %owner.name, error = %e, "cannot read the owner");
                OwnerState::Unassigned
            }
        }
    }

    /// Plans object `meta` and writes its move with the object's resourceVersion; on a conflict
    /// re-reads the object, plans again and retries with backoff ([`CONFLICT_RETRIES`] times);
    /// when the apiserver is too busy, sends the same write again after its Retry-After or a
    /// backoff ([`OVERLOAD_RETRIES`] times). Each write holds one of the reconciler's write
    /// slots and reports the apiserver's answer to it.
    async fn handle(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        mut meta: ObjectMeta,
    ) -> Written {
        let name = meta.name.clone().unwrap_or_default();
        let api = self.api(target, meta.namespace.as_deref());
        let backoff = || {
            ExponentialBuilder::default()
                .with_min_delay(CONFLICT_BACKOFF_MIN)
                .with_max_delay(CONFLICT_BACKOFF_MAX)
                .with_jitter()
        };
        let mut conflicts = backoff().with_max_times(CONFLICT_RETRIES).build();
        let mut overloads = backoff().with_max_times(OVERLOAD_RETRIES).build();
        loop {
            let mv = match self.plan(view, targets, target, &meta).await {
                Planned::Move(mv) => mv,
                Planned::Stay => return Written::Stayed,
                Planned::Await => {
                    debug!(object = %display_name(&meta), "waiting for its owner to settle");
                    return Written::Awaiting(ObjectId {
                        resource: target.resource.clone(),
                        namespace: meta.namespace.clone(),
                        name,
                    });
                }
            };
            let patch = mv.patch(
                view.labels,
                meta.resource_version.as_deref().unwrap_or_default(),
            );
            let result = loop {
                let slot = self.slots.acquire().await;
                self.limiter.wait().await;
                let result = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    requests::patch(
                        &self.writes,
                        target,
                        meta.namespace.as_deref(),
                        &name,
                        &patch,
                    ),
                )
                .await
                .unwrap_or_else(|_| Err(kube::Error::Service("write timed out".into())));
                let Some(retry_after) = overloaded(&result) else {
                    slot.answered(Answer::Handled);
                    break result;
                };
                slot.answered(Answer::Overloaded);
                self.metrics
                    .overloaded_writes
                    .get_or_create(&RingLabel::new(view.name))
                    .inc();
                let Some(delay) = overloads.next() else {
                    break result;
                };
                tokio::time::sleep(retry_after.unwrap_or(delay)).await;
            };
            match result {
                Ok(_) => {
                    self.log_and_count(view, target, &meta, &mv);
                    return Written::Moved(mv);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return Written::Stayed,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let Some(delay) = conflicts.next() else {
                        warn!(object = %display_name(&meta), "move still conflicting after retries");
                        self.count_failure(view, target, "conflict");
                        return Written::Failed;
                    };
                    tokio::time::sleep(delay).await;
                    meta = match api.get_metadata_opt(&name).await {
                        Ok(Some(fresh)) => fresh.metadata,
                        Ok(None) => return Written::Stayed,
                        Err(e) => {
                            warn!(object = %display_name(&meta), error = %e, "cannot re-read object after a conflict");
                            self.count_failure(view, target, "error");
                            return Written::Failed;
                        }
                    };
                }
                Err(e) => {
                    warn!(object = %display_name(&meta), error = %e, "move failed");
                    self.count_failure(view, target, "error");
                    return Written::Failed;
                }
            }
        }
    }

    fn count_failure(&self, view: &RingView<'_>, target: &Target, reason: &str) {
        self.metrics
            .failed_writes
            .get_or_create(&FailedWriteLabels {
                clusterring: view.name.to_owned(),
                group: target.resource.group.clone(),
                resource: target.resource.resource.clone(),
                reason: reason.to_owned(),
            })
            .inc();
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

/// Whether `result` says the apiserver is too busy (429 Too Many Requests, 503, 504) or could
/// not be reached (a transport error): then `Some`, with the wait the apiserver asked for, if
/// any. Refusals for the object's own reasons (conflict, not found, invalid, forbidden, a
/// webhook's denial or failure) are not overload.
fn overloaded<T>(result: &Result<T, kube::Error>) -> Option<Option<Duration>> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => matches!(status.code, 429 | 503 | 504).then(|| {
            status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)))
        }),
        Err(kube::Error::HyperError(_) | kube::Error::Service(_)) => Some(None),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;

    use super::*;

    fn target(namespaced: bool) -> Target {
        Target {
            resource: GroupResource {
                group: String::new(),
                resource: "secrets".into(),
            },
            role: Role::Main,
            api: ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Secret")),
            namespaced,
        }
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_ring_of_at_most_half_the_namespaces_lists_them_one_by_one() {
        for (selected, total, one_by_one) in [
            (&["a"][..], 1000, true),
            (&["a", "b"], 4, true),
            (&["a", "b", "c"], 5, false),
            (&["a", "b"], 2, false),
            (&[], 0, true),
            (&[], 7, true),
        ] {
            let namespaces = Namespaces::new(names(selected), total);
            assert_eq!(namespaces.one_by_one, one_by_one, "{selected:?} of {total}");
        }
    }

    #[test]
    fn a_listed_object_belongs_to_the_ring_only_in_a_selected_namespace() {
        let namespaces = Namespaces::new(names(&["a", "b", "c"]), 4);
        let secrets = target(true);
        assert!(namespaces.holds(&secrets, Some("a")));
        assert!(
            !namespaces.holds(&secrets, Some("kube-system")),
            "a cluster-wide list brings objects of other namespaces: they are left out"
        );
        assert!(
            !namespaces.holds(&secrets, None),
            "namespaced but no namespace"
        );
        let cluster_scoped = target(false);
        assert!(namespaces.holds(&cluster_scoped, None));
        assert!(Namespaces::default().holds(&cluster_scoped, None));
    }

    #[test]
    fn list_ranges_are_each_namespace_in_order_or_the_whole_cluster() {
        let few = Namespaces::new(names(&["b", "a"]), 10);
        assert_eq!(few.list_ranges(&target(true)), vec![Some("a"), Some("b")]);
        assert_eq!(
            few.list_ranges(&target(false)),
            vec![None],
            "cluster-scoped objects are listed across the cluster"
        );
        let most = Namespaces::new(names(&["a", "b", "c"]), 4);
        assert_eq!(most.list_ranges(&target(true)), vec![None]);
        assert!(most.contains("a") && !most.contains("d"));
        let none = Namespaces::new(BTreeSet::new(), 3);
        assert!(
            none.list_ranges(&target(true)).is_empty(),
            "no namespace selected: nothing namespaced to list"
        );
    }
}
