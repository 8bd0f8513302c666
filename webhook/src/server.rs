//! The thin HTTP layer over [`crate::admission`]: routing, limits, metrics and logs.
//!
//! `POST /webhooks/sharder/clusterring/{ring}` answers AdmissionReviews. Bodies that are not a
//! review get 400 with the reason, other methods 405, other paths 404, bodies over
//! `--max-body-bytes` 413; at most `--max-concurrent-requests` are handled at once (the rest
//! wait). A review waits on nothing but its body, which the apiserver sends at once (and stops
//! sending when the webhook's `timeoutSeconds` runs out, closing the connection), and on a
//! controlled object's owner read, which has a bound of its own
//! ([`crate::owners::OWNER_LOOKUP_TIMEOUT`]); so no timer is armed per request.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower::limit::ConcurrencyLimitLayer;
use tracing::{debug, warn};

use sharder_common::ring_kind::WEBHOOK_PATH_PREFIX;
use sharder_common::{RingId, RingKind};
use sharder_runtime::metrics::{ResourceLabels, RingLabel};

use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;

use crate::admission::{self, Decision, SkipReason};
use crate::metrics::{Metrics, OwnerLabels, RequestLabels, SkipLabels};
use crate::owners::Owners;
use crate::ring_source::Rings;

/// Limits of the HTTP layer.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest accepted body in bytes.
    pub max_body_bytes: usize,
    /// Requests handled at once.
    pub max_concurrent_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 6 * 1024 * 1024,
            max_concurrent_requests: 1024,
        }
    }
}

/// What every request reads, shared behind one `Arc` (one reference count per request).
struct AppState {
    rings: Arc<Rings>,
    owners: Arc<dyn Owners>,
    metrics: Metrics,
}

/// The webhook's routes over the published rings; owners of controlled objects are read from
/// `owners`.
pub fn router(
    rings: Arc<Rings>,
    owners: Arc<dyn Owners>,
    metrics: Metrics,
    limits: Limits,
) -> Router {
    Router::new()
        .route(
            &format!("{WEBHOOK_PATH_PREFIX}{{kind}}/{{ring}}"),
            post(handle),
        )
        .fallback(|| async { not_found() })
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(ConcurrencyLimitLayer::new(limits.max_concurrent_requests))
        .with_state(Arc::new(AppState {
            rings,
            owners,
            metrics,
        }))
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: the webhook serves POST /webhooks/sharder/clusterring/<ring> and \
         /webhooks/sharder/controllerring/<ring>\n",
    )
        .into_response()
}

/// Parses and decides; for a controlled object reads its owner and decides again. The request
/// is boxed: it is large, and moves through the handler's future as a pointer.
async fn decide(
    state: &AppState,
    ring: &RingId,
    body: &[u8],
) -> Result<(Box<AdmissionRequest<DynamicObject>>, Decision), admission::ReviewError> {
    let request = Box::new(admission::parse(body)?);
    let snapshot = state.rings.get(ring);
    let decision = admission::decide(&request, snapshot.as_deref());
    let (Decision::FollowOwner { key, owner }, Some(snapshot)) = (&decision, &snapshot) else {
        return Ok((request, decision));
    };
    let looked_up = state.owners.state(snapshot, owner).await;
    let result = match &looked_up {
        Ok(owner) => owner.as_str(),
        Err(_) => "error",
    };
    state
        .metrics
        .owner_lookups
        .get_or_create(&OwnerLabels { result })
        .inc();
    let decision = match looked_up {
        Ok(owner) => admission::decide_child(&request, snapshot, key.clone(), &owner),
        Err(reason) => Decision::Skip {
            reason: SkipReason::OwnerUnknown,
            detail: reason,
        },
    };
    Ok((request, decision))
}

async fn handle(
    State(state): State<Arc<AppState>>,
    Path((kind, ring)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let Ok(kind) = kind.parse::<RingKind>() else {
        return not_found();
    };
    let ring = RingId::new(kind, ring);
    let started = Instant::now();
    let reviewed = match decide(&state, &ring, &body).await {
        Ok((request, decision)) => {
            admission::encode(&request, &decision).map(|body| (request, decision, body))
        }
        Err(e) => Err(e),
    };
    let (outcome, response) = match reviewed {
        Err(e) => {
            warn!(%ring, error = %e, "bad admission request");
            (
                "bad_request",
                (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
            )
        }
        Ok((request, decision, body)) => {
            let outcome = record(&state.metrics, &ring, &request, &decision);
            (
                outcome,
                ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            )
        }
    };
    state
        .metrics
        .request_duration
        .get_or_create(&RequestLabels { outcome })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Counts and logs a decision; returns the request's outcome label.
fn record(
    metrics: &Metrics,
    ring: &RingId,
    request: &AdmissionRequest<DynamicObject>,
    decision: &Decision,
) -> &'static str {
    let counted = !request.dry_run;
    let (group, resource) = (&request.resource.group, &request.resource.resource);
    let namespace = request.namespace.as_deref().unwrap_or_default();
    match decision {
        Decision::Assign { key, shard, .. } => {
            if counted {
                metrics
                    .assignments
                    .get_or_create(&ResourceLabels {
                        ring: RingLabel::new(ring),
                        group: group.clone(),
                        resource: resource.clone(),
                    })
                    .inc();
            }
            debug!(%ring, object = %key, shard = %shard, dry_run = request.dry_run, "assigned");
            "assigned"
        }
        Decision::AlreadyAssigned => "already_assigned",
        Decision::FollowOwner { .. } => "skipped",
        Decision::Skip { reason, detail } => {
            if counted {
                metrics
                    .not_assigned
                    .get_or_create(&SkipLabels {
                        ring: RingLabel::new(ring),
                        reason: reason.as_str().to_owned(),
                    })
                    .inc();
            }
            let name = &request.name;
            match reason {
                SkipReason::UnknownRing
                | SkipReason::InvalidRing
                | SkipReason::NoShardAvailable
                | SkipReason::MalformedOwnerReference
                | SkipReason::OwnerUnknown => warn!(
                    %ring, %group, %resource, %namespace, %name, %reason, %detail,
                    "object allowed without a shard"
                ),
                _ => debug!(
                    %ring, %group, %resource, %namespace, %name, %reason, %detail,
                    "object allowed without a shard"
                ),
            }
            "skipped"
        }
    }
}

#[cfg(test)]
mod tests;
