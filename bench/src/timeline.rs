//! Where the time of a move goes: a timeline of one scale-out or crash from the apiserver's
//! audit log (every write, with the time the apiserver received it and the time it answered)
//! and the reconciler's JSON log (shard states, list pages, rebalance summaries), as offsets
//! from the moment the benchmark changed the shards.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use sharder_harness::control_plane::audited_write;

use crate::stats::percentile;

/// One thing that happened over a span of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What it was.
    pub what: String,
    /// How many (writes, pages, ...).
    pub count: usize,
    /// Seconds from the start to its first instant.
    pub from: f64,
    /// Seconds from the start to its last instant.
    pub to: f64,
}

/// The writes of one user, as the apiserver saw them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Writes {
    /// How many.
    pub count: usize,
    /// Seconds from the start until the apiserver received the first.
    pub first_received: f64,
    /// Seconds from the start until the apiserver answered the last.
    pub last_answered: f64,
    /// Sum of the apiserver's time per write (received to answered), in seconds.
    pub busy: f64,
}

impl Writes {
    /// Writes per second from the first received to the last answered.
    pub fn rate(&self) -> f64 {
        self.count as f64 / (self.last_answered - self.first_received).max(1e-9)
    }

    /// Writes in flight at the apiserver on average over the same window (Little's law).
    pub fn in_flight(&self) -> f64 {
        self.busy / (self.last_answered - self.first_received).max(1e-9)
    }
}

/// The timeline of one run.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// What happened, in the order of its first instant.
    pub spans: Vec<Span>,
    /// Every write to the objects, of every user given.
    pub writes: Writes,
    /// From a drain (answered) to its acknowledgement (received), per object: p50, p90, max.
    pub ack_latency: Option<[Duration; 3]>,
}

fn timestamp(value: &Value) -> Option<Timestamp> {
    value.as_str()?.parse().ok()
}

fn offset(start: Timestamp, at: Timestamp) -> f64 {
    at.duration_since(start).as_secs_f64()
}

/// Whether audit event `e` is a write to `ns`'s Secrets by `user`.
pub fn is_write_by(e: &Value, ns: &str, user: &str) -> bool {
    audited_write(e, ns, user).is_some_and(|(resource, _)| resource == "secrets")
}

/// The audit events of writes to `ns`'s Secrets by `user`: (name, received, answered).
fn writes_of(events: &[Value], ns: &str, user: &str) -> Vec<(String, Timestamp, Timestamp)> {
    events
        .iter()
        .filter(|e| is_write_by(e, ns, user))
        .filter_map(|e| {
            Some((
                e["objectRef"]["name"].as_str()?.to_owned(),
                timestamp(&e["requestReceivedTimestamp"])?,
                timestamp(&e["stageTimestamp"])?,
            ))
        })
        .collect()
}

fn summarize(start: Timestamp, writes: &[(String, Timestamp, Timestamp)]) -> Writes {
    let first = writes.iter().map(|w| w.1).min();
    let last = writes.iter().map(|w| w.2).max();
    match (first, last) {
        (Some(first), Some(last)) => Writes {
            count: writes.len(),
            first_received: offset(start, first),
            last_answered: offset(start, last),
            busy: writes
                .iter()
                .map(|(_, r, a)| a.duration_since(*r).as_secs_f64())
                .sum(),
        },
        _ => Writes::default(),
    }
}

impl Timeline {
    /// The timeline from `start`: writes to `ns`'s Secrets in `audit` by each `(what, user)`,
    /// the reconciler's `log` lines, and `marks` (instants the benchmark saw itself, as
    /// seconds from the start). `pairs` names the users (drainer, acknowledger) whose writes
    /// pair up into drain-to-acknowledgement latencies (`None` for a crash).
    pub fn new(
        start: Timestamp,
        audit: &[Value],
        ns: &str,
        users: &[(&str, &str)],
        log: &[Value],
        marks: &[(&str, f64)],
        pairs: Option<(&str, &str)>,
    ) -> Self {
        let mut spans = Vec::new();
        let mut all = Vec::new();
        for (what, user) in users {
            let writes = writes_of(audit, ns, user);
            let summary = summarize(start, &writes);
            if summary.count > 0 {
                spans.push(Span {
                    what: (*what).to_owned(),
                    count: summary.count,
                    from: summary.first_received,
                    to: summary.last_answered,
                });
            }
            all.extend(writes);
        }
        let ack_latency = pairs.and_then(|(drainer, acknowledger)| {
            let drained: HashMap<String, Timestamp> = writes_of(audit, ns, drainer)
                .into_iter()
                .map(|(name, _, answered)| (name, answered))
                .collect();
            let mut latencies: Vec<Duration> = writes_of(audit, ns, acknowledger)
                .into_iter()
                .filter_map(|(name, received, _)| {
                    let drained = drained.get(&name)?;
                    Some(Duration::try_from(received.duration_since(*drained)).unwrap_or_default())
                })
                .collect();
            latencies.sort();
            (!latencies.is_empty()).then(|| {
                [
                    percentile(&latencies, 50.0),
                    percentile(&latencies, 90.0),
                    percentile(&latencies, 100.0),
                ]
            })
        });
        spans.extend(log_spans(start, log));
        for (what, at) in marks {
            spans.push(Span {
                what: (*what).to_owned(),
                count: 1,
                from: *at,
                to: *at,
            });
        }
        spans.sort_by(|a, b| a.from.total_cmp(&b.from));
        Self {
            spans,
            writes: summarize(start, &all),
            ack_latency,
        }
    }
}

/// Shard state changes, list pages (one span per rebalance) and rebalance summaries of the
/// reconciler's log.
fn log_spans(start: Timestamp, log: &[Value]) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut pages: Option<Span> = None;
    let at = |line: &Value| timestamp(&line["timestamp"]).map(|t| offset(start, t));
    for line in log {
        let Some(t) = at(line) else { continue };
        if t < 0.0 {
            continue;
        }
        let message = line["message"].as_str().unwrap_or_default();
        let shard = line["span"]["shard"]
            .as_str()
            .or_else(|| line["shard"].as_str())
            .unwrap_or_default();
        match message {
            "shard state" => spans.push(Span {
                what: format!("{shard} labelled {}", line["state"].as_str().unwrap_or("?")),
                count: 1,
                from: t,
                to: t,
            }),
            m if m.starts_with("shard stopped renewing") => spans.push(Span {
                what: format!("{shard} taken over (dead)"),
                count: 1,
                from: t,
                to: t,
            }),
            "listed a page" => {
                let objects = line["objects"].as_u64().unwrap_or(0) as usize;
                let took = line["list_ms"].as_f64().unwrap_or(0.0) / 1e3;
                let p = pages.get_or_insert_with(|| Span {
                    what: "list pages (objects listed)".to_owned(),
                    count: 0,
                    from: t - took,
                    to: t,
                });
                p.count += objects;
                p.to = t;
            }
            "rebalance" => {
                // The pages listed so far were this rebalance's.
                spans.extend(pages.take());
                let took = line["duration_ms"].as_f64().unwrap_or(0.0) / 1e3;
                let scopes = line["scopes"].as_str().unwrap_or_default();
                spans.push(Span {
                    what: format!(
                        "rebalance {scopes}: listed {}, drained {}, assigned {}, errors {}; the reconciler's writes in flight {} on average, limit {} at the end",
                        line["listed"],
                        line["drained"],
                        line["assigned"],
                        line["errors"],
                        line["writes_in_flight"],
                        line["write_limit"]
                    ),
                    count: line["listed"].as_u64().unwrap_or(0) as usize,
                    from: (t - took).max(0.0),
                    to: t,
                });
            }
            _ => {}
        }
    }
    spans.extend(pages);
    spans
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn write(user: &str, name: &str, received: &str, answered: &str) -> Value {
        json!({
            "user": {"username": user},
            "objectRef": {"namespace": "ns", "resource": "secrets", "name": name},
            "requestReceivedTimestamp": received,
            "stageTimestamp": answered,
        })
    }

    #[test]
    fn writes_become_spans_rates_and_acknowledgement_latencies() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().expect("start");
        let audit = [
            write("r", "a", "2026-01-01T00:00:01Z", "2026-01-01T00:00:01.010Z"),
            write(
                "r",
                "b",
                "2026-01-01T00:00:01.005Z",
                "2026-01-01T00:00:01.015Z",
            ),
            write(
                "s",
                "a",
                "2026-01-01T00:00:01.110Z",
                "2026-01-01T00:00:01.120Z",
            ),
            write("s", "b", "2026-01-01T00:00:01.315Z", "2026-01-01T00:00:02Z"),
            write(
                "other",
                "c",
                "2026-01-01T00:00:00.5Z",
                "2026-01-01T00:00:03Z",
            ),
        ];
        let log = [
            json!({"timestamp": "2026-01-01T00:00:00.900Z", "message": "listed a page", "objects": 500, "list_ms": 100.0}),
            json!({"timestamp": "2026-01-01T00:00:01.900Z", "message": "listed a page", "objects": 20, "list_ms": 10.0}),
            json!({"timestamp": "2026-01-01T00:00:00.100Z", "message": "shard state", "state": "ready", "span": {"shard": "shard-3"}}),
        ];
        let t = Timeline::new(
            start,
            &audit,
            "ns",
            &[("drains", "r"), ("acknowledgements", "s")],
            &log,
            &[("converged", 2.5)],
            Some(("r", "s")),
        );
        assert_eq!(t.writes.count, 4);
        assert!((t.writes.first_received - 1.0).abs() < 1e-9);
        assert!((t.writes.last_answered - 2.0).abs() < 1e-9);
        assert!((t.writes.rate() - 4.0).abs() < 1e-9);
        // 10 + 10 + 10 + 685 ms busy over 1 s.
        assert!((t.writes.in_flight() - 0.715).abs() < 1e-9);
        let [p50, _, max] = t.ack_latency.expect("latencies");
        assert_eq!(p50, Duration::from_millis(100));
        assert_eq!(max, Duration::from_millis(300));
        let names: Vec<&str> = t.spans.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(
            names,
            [
                "shard-3 labelled ready",
                "list pages (objects listed)",
                "drains",
                "acknowledgements",
                "converged"
            ]
        );
        let pages = &t.spans[1];
        assert_eq!(pages.count, 520);
        assert!((pages.from - 0.8).abs() < 1e-9 && (pages.to - 1.9).abs() < 1e-9);
    }
}
