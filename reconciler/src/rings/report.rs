//! Reporting on a ring: one summary log line per rebalance, a `Rebalanced` Event on the
//! ring when anything moved, a `Warning` Event when a rebalance failed or when shard
//! names are ambiguous.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::runtime::events::{Event, EventType, Recorder};
use sharder_common::RingObject;
use tracing::{info, warn};

use crate::rebalance::Outcome;

/// How a rebalance's writes went (the reconciler's, every ring's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct WriteStats {
    /// The writes the adaptive limit allowed in flight at its end.
    pub limit: usize,
    /// The writes in flight on average over it.
    pub mean_in_flight: f64,
}

/// What a rebalance's summary says beside its [`Outcome`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Summary {
    /// Whether drain checks follow it (`false`: the ring's moves are done until its next
    /// change, sweep or retry).
    pub drain_checks: bool,
    /// How its writes went.
    pub writes: WriteStats,
    /// How long it took.
    pub elapsed: Duration,
}

/// Logs the summary of a rebalance and publishes the Event.
pub(crate) async fn report(
    recorder: &Recorder,
    ring: &RingObject,
    outcome: &Outcome,
    summary: Summary,
) {
    let assigned: BTreeMap<&str, usize> = outcome
        .assigned
        .iter()
        .map(|(r, n)| (r.as_str(), *n))
        .collect();
    let scopes: Vec<String> = outcome.lists.iter().map(|s| format!("{s:?}")).collect();
    info!(
        scopes = ?scopes,
        listed = outcome.listed,
        drained = outcome.drained,
        assigned = ?assigned,
        pending_drains = outcome.pending_drains,
        drain_checks = summary.drain_checks,
        errors = outcome.errors,
        refused = outcome.refused,
        write_limit = summary.writes.limit,
        writes_in_flight = (summary.writes.mean_in_flight * 10.0).round() / 10.0,
        duration_ms = u64::try_from(summary.elapsed.as_millis()).unwrap_or(u64::MAX),
        "rebalance"
    );
    if !outcome.moved_anything() {
        return;
    }
    let note = format!(
        "listed {} objects: {} drained, {} assigned ({:?}), {} errors, in {} ms",
        outcome.listed,
        outcome.drained,
        assigned.values().sum::<usize>(),
        assigned,
        outcome.errors,
        summary.elapsed.as_millis()
    );
    publish(
        recorder,
        ring,
        Event {
            type_: EventType::Normal,
            reason: "Rebalanced".into(),
            note: Some(note),
            action: "Rebalance".into(),
            secondary: None,
        },
    )
    .await;
}

/// Publishes a `Warning` Event `reason` with `note` on `ring`.
pub(crate) async fn warning(recorder: &Recorder, ring: &RingObject, reason: &str, note: String) {
    publish(
        recorder,
        ring,
        Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Rebalance".into(),
            secondary: None,
        },
    )
    .await;
}

/// Publishes `event` on `ring` (a failure is logged: Events are best effort).
async fn publish(recorder: &Recorder, ring: &RingObject, event: Event) {
    if let Err(e) = recorder.publish(&event, &ring.object_reference()).await {
        warn!(error = %e, reason = %event.reason, ring = %ring.id, "cannot publish an Event on the ring");
    }
}
