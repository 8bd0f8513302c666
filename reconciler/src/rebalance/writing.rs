//! Writing for a rebalance: what one listed object needs (its plan, its owner's state for a
//! controlled object) and the write itself, a merge patch carrying the object's resourceVersion,
//! within the rate limit and a write slot, retried after a conflict (read again, planned again)
//! or an overloaded apiserver.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::future::BoxFuture;
use http_body_util::BodyExt as _;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::client::Body;
use kube::core::{DynamicObject, Request, Resource, Status};
use kube::{Api, Client};
use sharder_common::key::{display_name, group_of_api_version};
use sharder_common::{OwnerState, Role};
use sharder_runtime::metrics::{ResourceLabels, RingLabel};
use sharder_runtime::retry::{retry_after, with_retry_after_header};
use tokio::sync::Mutex;
use tracing::{debug, info, warn};

use super::concurrency::{Answer, OVERLOAD_RETRIES, WriteSlots};
use super::outcome::Handled;
use super::plan::{ChainProblem, Decision, MAX_CHAIN_LEVELS, Move, Placement, Reason};
use super::view::{RingView, controller_of, placement, slim};
use crate::metrics::{FailedWriteLabels, Metrics};
use crate::terms::{ObjectId, Target};

/// The first wait after a write conflict (409); it doubles, with jitter.
pub(crate) const CONFLICT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// The longest wait between two attempts of a conflicting write.
pub(crate) const CONFLICT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How often a conflicting write is re-read, decided again and retried before it fails.
pub(crate) const CONFLICT_RETRIES: usize = 5;

/// How long a write may take before it counts as unanswered (an overload: it is sent again).
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes in flight when the reconciler starts; the limit adapts from there.
pub(crate) const INITIAL_CONCURRENT_WRITES: usize = 16;

/// Writes objects for every ring: one client, one rate limit, one set of write slots.
#[derive(Clone)]
pub(super) struct Writer {
    client: Client,
    limiter: Arc<RateLimiter>,
    /// The write slots (their adaptive limit).
    pub(super) slots: Arc<WriteSlots>,
    metrics: Metrics,
}

/// Bounds the rate of writes: at most one per `interval`, shared by all writers.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    next: Mutex<tokio::time::Instant>,
    interval: Duration,
}

impl RateLimiter {
    /// At most `per_second` writes per second; 0 means unlimited.
    pub(crate) fn new(per_second: u32) -> Self {
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

/// A failed write of `meta` (named `name`) of `target`: see [`Handled::Failed`]. A controlled
/// object is remembered unless the apiserver refused the write for good (`permanent`): trying
/// it again at every drain check would only repeat the refusal; the next full list does.
fn failed(target: &Target, meta: &ObjectMeta, name: String, permanent: bool) -> Handled {
    let object = (target.role == Role::Controlled && !permanent).then(|| ObjectId {
        resource: target.resource.clone(),
        namespace: meta.namespace.clone(),
        name,
    });
    Handled::Failed { object, permanent }
}

/// Whether `error` refuses a write for good: forbidden (RBAC), invalid or malformed. Anything
/// else (the apiserver unreachable, restarting, overloaded past the retries, a conflict past
/// its retries) may go through the next time.
fn permanent(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422))
}

impl Writer {
    /// A writer on `client`, at most `max_concurrent_writes` in flight (the adaptive limit's
    /// ceiling) and `max_writes_per_second` (0: unlimited).
    pub(super) fn new(
        client: Client,
        max_concurrent_writes: usize,
        max_writes_per_second: u32,
        metrics: Metrics,
    ) -> Self {
        let max = max_concurrent_writes.max(1);
        Self {
            client,
            limiter: Arc::new(RateLimiter::new(max_writes_per_second)),
            slots: Arc::new(WriteSlots::new(
                INITIAL_CONCURRENT_WRITES.min(max),
                max,
                metrics.write_concurrency.clone(),
            )),
            metrics,
        }
    }

    /// The Api of `target` (in `namespace`) on the write client: object writes and the small
    /// reads around them (owners, re-reads after a conflict).
    pub(super) fn api(&self, target: &Target, namespace: Option<&str>) -> Api<DynamicObject> {
        match (namespace, target.namespaced) {
            (Some(ns), true) => {
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &target.api)
            }
            _ => Api::<DynamicObject>::all_with(self.client.clone(), &target.api),
        }
    }

    /// What object `meta` of `target`, as read at `seen`, needs: for a controlled object, its
    /// owner's state is read when the owner decides (docs/design.md §6).
    async fn plan(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        meta: &ObjectMeta,
        seen: Instant,
    ) -> Result<Decision, ChainProblem> {
        let planned = self.plan_on_snapshot(view, targets, target, meta).await?;
        // The ring's snapshot of Leases predates the objects it lists: an object may sit on a
        // shard that joined since (the webhook saw its Lease first). Only a shard whose Lease
        // is not held now is dead; an object on a live one waits for the rebalance its Lease
        // brings (a move now would take it from a shard that may be reconciling it).
        if let Decision::Move(Move::Assign {
            from: Some(from),
            reason: Reason::DeadShard,
            ..
        }) = &planned
            && view.live_now.holds(&self.client, view.id, from, seen).await
        {
            debug!(ring = %view.id, shard = %from, "shard joined after the ring's snapshot; its objects wait");
            return Ok(Decision::Stay);
        }
        Ok(planned)
    }

    /// What [`plan`](Self::plan) decides from the ring's snapshot alone (and the owner, read
    /// when it decides). An owner chain that cannot be followed leaves the object where it is.
    async fn plan_on_snapshot(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        meta: &ObjectMeta,
    ) -> Result<Decision, ChainProblem> {
        let placement = placement(view.keying, targets, target, meta);
        Ok(match view.decide(target, placement, meta, None) {
            Decision::ReadOwner => {
                let uid = meta.uid.clone().unwrap_or_default();
                let owner = self.owner_state(view, targets, meta, vec![uid]).await?;
                view.decide(target, placement, meta, Some(&owner))
            }
            decided => decided,
        })
    }

    /// The state of the controller owner of the controlled object `meta` (metadata only, read
    /// from the apiserver when the owner's resource is a resource of the ring). An owner that is
    /// itself controlled (a level of a chain) is decided in turn, up its chain to the main
    /// object, and its children see it as [`OwnerState::as_chain_level`] says. `chain`: the
    /// uids of the objects below the owner, to stop at a cycle and at [`MAX_CHAIN_LEVELS`].
    fn owner_state<'a>(
        &'a self,
        view: &'a RingView<'a>,
        targets: &'a [Target],
        meta: &'a ObjectMeta,
        mut chain: Vec<String>,
    ) -> BoxFuture<'a, Result<OwnerState, ChainProblem>> {
        Box::pin(async move {
            // Reached without a (well-formed) controller only in a ring keyed by namespace,
            // where such an object has a key all the same: nothing holds it, it follows the ring.
            let Some((owner, group)) = controller_of(meta).and_then(|owner| {
                let group = group_of_api_version(&owner.api_version).ok()?;
                Some((owner, group))
            }) else {
                return Ok(OwnerState::NotSharded);
            };
            let Some(target) = targets
                .iter()
                .find(|t| t.resource.group == group && t.api.kind == owner.kind)
            else {
                return Ok(OwnerState::NotSharded);
            };
            let key = (
                target.resource.clone(),
                meta.namespace.clone(),
                owner.name.clone(),
            );
            let read = || async {
                let api = self.api(target, meta.namespace.as_deref());
                match api.get_metadata_opt(&owner.name).await {
                    Ok(found) => Ok(found.map(|f| slim(f.metadata))),
                    Err(e) => Err(e.to_string()),
                }
            };
            let found = match view.owner_reads.read(key, read).await {
                Ok(Some(found)) => found,
                Ok(None) => return Ok(OwnerState::Missing),
                // Unknown: treat it as not settled, so the child waits (never moves ahead of it).
                Err(e) => {
                    warn!(object = %display_name(meta), owner = %owner.name, error = %e, "cannot read the owner");
                    return Ok(OwnerState::Unassigned);
                }
            };
            let state = OwnerState::of(Some(&found), view.labels);
            if target.role == Role::Main {
                return Ok(state);
            }
            let uid = found.uid.clone().unwrap_or_default();
            if chain.contains(&uid) {
                return Err(ChainProblem::Cycle(display_name(&found)));
            }
            if chain.len() > MAX_CHAIN_LEVELS {
                return Err(ChainProblem::TooDeep(display_name(&found)));
            }
            chain.push(uid);
            let placement = placement(view.keying, targets, target, &found);
            let decided = match view.decide(target, placement, &found, None) {
                Decision::ReadOwner if placement == Placement::Chained => {
                    let above = self.owner_state(view, targets, &found, chain).await?;
                    view.decide(target, placement, &found, Some(&above))
                }
                decided => decided,
            };
            let in_place = decided == Decision::Stay;
            Ok(state.as_chain_level(in_place, |s| view.available.contains(s)))
        })
    }

    /// Plans object `meta` (as read at `seen`) and writes its move with the object's resourceVersion; on a conflict
    /// re-reads the object, plans again and retries with backoff ([`CONFLICT_RETRIES`] times);
    /// when the apiserver is too busy, sends the same write again after its Retry-After or a
    /// backoff ([`OVERLOAD_RETRIES`] times). Each write holds one of the reconciler's write
    /// slots and reports the apiserver's answer to it.
    pub(super) async fn handle(
        &self,
        view: &RingView<'_>,
        targets: &[Target],
        target: &Target,
        mut meta: ObjectMeta,
        mut seen: Instant,
    ) -> Handled {
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
            if !view.is_current() {
                return Handled::Abandoned;
            }
            let mv = match self.plan(view, targets, target, &meta, seen).await {
                Ok(Decision::Move(mv)) => mv,
                // `ReadOwner` does not come back: the owner was read.
                Ok(Decision::Stay | Decision::ReadOwner) => return Handled::Stayed,
                Err(problem) => {
                    debug!(object = %display_name(&meta), %problem, "left where it is");
                    return Handled::Unresolved(problem);
                }
                Ok(Decision::AwaitOwner) => {
                    debug!(object = %display_name(&meta), "waiting for its owner to settle");
                    return Handled::Awaiting(ObjectId {
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
                // Checked again just before sending: a ring deleted while its writes waited
                // for a slot or the rate limit gets none of them.
                if !view.is_current() {
                    return Handled::Abandoned;
                }
                let sent = tokio::time::Instant::now();
                let result = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    merge_patch(
                        &self.client,
                        target,
                        meta.namespace.as_deref(),
                        &name,
                        &patch,
                    ),
                )
                .await
                .unwrap_or_else(|_| Err(kube::Error::Service("write timed out".into())));
                let refused = overloaded(&result);
                slot.answered(Answer::of(refused.is_some(), sent.elapsed()));
                let Some(retry_after) = refused else {
                    break result;
                };
                self.metrics
                    .overloaded_writes
                    .get_or_create(&RingLabel::new(view.id))
                    .inc();
                let Some(delay) = overloads.next() else {
                    break result;
                };
                tokio::time::sleep(retry_after.unwrap_or(delay)).await;
            };
            match result {
                Ok(_) => {
                    self.log_and_count(view, target, &meta, &mv);
                    return Handled::Moved(mv);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return Handled::Stayed,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let Some(delay) = conflicts.next() else {
                        warn!(object = %display_name(&meta), "move still conflicting after retries");
                        self.count_failure(view, target, "conflict");
                        return failed(target, &meta, name, false);
                    };
                    tokio::time::sleep(delay).await;
                    meta = match api.get_metadata_opt(&name).await {
                        Ok(Some(fresh)) => {
                            seen = Instant::now();
                            fresh.metadata
                        }
                        Ok(None) => return Handled::Stayed,
                        Err(e) => {
                            warn!(object = %display_name(&meta), error = %e, "cannot re-read object after a conflict");
                            self.count_failure(view, target, "error");
                            return failed(target, &meta, name, permanent(&e));
                        }
                    };
                }
                Err(e) => {
                    warn!(object = %display_name(&meta), error = %e, "move failed");
                    self.count_failure(view, target, "error");
                    return failed(target, &meta, name, permanent(&e));
                }
            }
        }
    }

    fn count_failure(&self, view: &RingView<'_>, target: &Target, reason: &str) {
        self.metrics
            .failed_writes
            .get_or_create(&FailedWriteLabels {
                ring: RingLabel::new(view.id),
                group: target.resource.group.clone(),
                resource: target.resource.resource.clone(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    fn log_and_count(&self, view: &RingView<'_>, target: &Target, meta: &ObjectMeta, mv: &Move) {
        let object = display_name(meta);
        let labels = ResourceLabels {
            ring: RingLabel::new(view.id),
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
        Err(error @ kube::Error::Api(status)) => {
            matches!(status.code, 429 | 503 | 504).then(|| retry_after(error))
        }
        Err(kube::Error::HyperError(_) | kube::Error::Service(_)) => Some(None),
        Err(_) => None,
    }
}

/// Merge-patches object `name` of `target` (in `namespace`) with `patch`; the answer (the
/// object's metadata) is read and dropped unparsed. A refusal is the apiserver's `Status`, with
/// the wait of its `Retry-After` header when the body names none (a plain-text 429 of API
/// Priority and Fairness: [`with_retry_after_header`]).
pub(super) async fn merge_patch(
    client: &Client,
    target: &Target,
    namespace: Option<&str>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let namespace = namespace.filter(|_| target.namespaced);
    let request = Request::new(DynamicObject::url_path(&target.api, namespace))
        .patch_metadata(name, &PatchParams::default(), &Patch::Merge(patch))
        .map_err(kube::Error::BuildRequest)?;
    let response = client.send(request.map(Body::from)).await?;
    let code = response.status();
    let header = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    let mut body = response.into_body();
    if code.is_success() {
        while let Some(frame) = body.frame().await {
            frame?;
        }
        return Ok(());
    }
    let bytes = body.collect().await?.to_bytes();
    let status = serde_json::from_slice::<Status>(&bytes).unwrap_or_else(|_| {
        Status::failure(String::from_utf8_lossy(&bytes).trim(), "").with_code(code.as_u16())
    });
    Err(kube::Error::Api(Box::new(with_retry_after_header(
        status,
        header.as_deref(),
    ))))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn refused(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Status::default()
        }))
    }

    #[test]
    fn only_a_forbidden_invalid_or_malformed_write_is_refused_for_good() {
        for code in [400, 403, 422] {
            assert!(permanent(&refused(code)), "{code}");
        }
        for code in [404, 409, 429, 500, 503, 504] {
            assert!(!permanent(&refused(code)), "{code}");
        }
        assert!(!permanent(&kube::Error::Service("write timed out".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn writers_of_two_rings_share_one_slot_every_interval_without_a_burst() {
        let limiter = Arc::new(RateLimiter::new(20));
        let started = tokio::time::Instant::now();
        let ring = |limiter: Arc<RateLimiter>| async move {
            let mut at = Vec::new();
            for _ in 0..30 {
                limiter.wait().await;
                at.push(started.elapsed());
            }
            at
        };
        let (a, b) = tokio::join!(ring(Arc::clone(&limiter)), ring(Arc::clone(&limiter)));
        let mut slots = [a, b].concat();
        slots.sort();
        let expected: Vec<Duration> = (0..60).map(|i| Duration::from_millis(50) * i).collect();
        assert_eq!(
            slots, expected,
            "60 slots 50 ms apart from the first write on"
        );
        let unlimited = RateLimiter::new(0);
        for _ in 0..1000 {
            unlimited.wait().await;
        }
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(2950),
            "0 never waits"
        );
    }
}
