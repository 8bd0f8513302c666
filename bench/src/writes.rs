//! The writes of a move, a crash recovery or a raw PATCH run, from the apiserver's audit log:
//! how many, when the apiserver received the first and answered the last (as offsets from the
//! moment the benchmark changed something), and how long it spent on them.

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use sharder_harness::control_plane::audited_write;

/// The writes of some users, as the apiserver saw them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Writes {
    /// How many.
    pub(crate) count: usize,
    /// Seconds from the start until the apiserver received the first.
    pub(crate) first_received: f64,
    /// Seconds from the start until the apiserver answered the last.
    pub(crate) last_answered: f64,
    /// Sum of the apiserver's time per write (received to answered), in seconds.
    pub(crate) busy: f64,
}

fn timestamp(value: &Value) -> Option<Timestamp> {
    value.as_str()?.parse().ok()
}

/// Whether audit event `e` is a write to `ns`'s Secrets by `user`.
fn is_write_by(e: &Value, ns: &str, user: &str) -> bool {
    audited_write(e, ns, user).is_some_and(|(resource, _)| resource == "secrets")
}

/// How many writes to `ns`'s Secrets by `user` `audit` holds.
pub(crate) fn count_by(audit: &[Value], ns: &str, user: &str) -> usize {
    audit.iter().filter(|e| is_write_by(e, ns, user)).count()
}

impl Writes {
    /// The writes to `ns`'s Secrets in `audit` by any of `users`, from `start`.
    pub(crate) fn of(start: Timestamp, audit: &[Value], ns: &str, users: &[&str]) -> Self {
        let writes: Vec<(Timestamp, Timestamp)> = audit
            .iter()
            .filter(|e| users.iter().any(|user| is_write_by(e, ns, user)))
            .filter_map(|e| {
                Some((
                    timestamp(&e["requestReceivedTimestamp"])?,
                    timestamp(&e["stageTimestamp"])?,
                ))
            })
            .collect();
        let offset = |at: Timestamp| at.duration_since(start).as_secs_f64();
        match (
            writes.iter().map(|w| w.0).min(),
            writes.iter().map(|w| w.1).max(),
        ) {
            (Some(first), Some(last)) => Self {
                count: writes.len(),
                first_received: offset(first),
                last_answered: offset(last),
                busy: writes
                    .iter()
                    .map(|(r, a)| a.duration_since(*r).as_secs_f64())
                    .sum(),
            },
            _ => Self::default(),
        }
    }

    /// Writes per second from the first received to the last answered.
    pub(crate) fn rate(&self) -> f64 {
        self.count as f64 / (self.last_answered - self.first_received).max(1e-9)
    }

    /// Writes in flight at the apiserver on average over the same window (Little's law).
    pub(crate) fn in_flight(&self) -> f64 {
        self.busy / (self.last_answered - self.first_received).max(1e-9)
    }
}

/// Writes per second over several runs together: all their writes over all their time (each
/// run from its first received to its last answered).
pub(crate) fn pooled<'a>(runs: impl Iterator<Item = &'a Writes>) -> f64 {
    let (count, seconds) = runs.fold((0, 0.0), |(n, s), w| {
        (n + w.count, s + w.last_answered - w.first_received)
    });
    count as f64 / seconds.max(1e-9)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn write(user: &str, received: &str, answered: &str) -> Value {
        json!({
            "user": {"username": user},
            "objectRef": {"namespace": "ns", "resource": "secrets", "name": "a"},
            "requestReceivedTimestamp": received,
            "stageTimestamp": answered,
        })
    }

    #[test]
    fn the_writes_of_the_users_given_make_the_rate_and_the_writes_in_flight() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().expect("start");
        let audit = [
            write("r", "2026-01-01T00:00:01Z", "2026-01-01T00:00:01.010Z"),
            write("r", "2026-01-01T00:00:01.005Z", "2026-01-01T00:00:01.015Z"),
            write("s", "2026-01-01T00:00:01.110Z", "2026-01-01T00:00:01.120Z"),
            write("s", "2026-01-01T00:00:01.315Z", "2026-01-01T00:00:02Z"),
            write("other", "2026-01-01T00:00:00.5Z", "2026-01-01T00:00:03Z"),
        ];
        let w = Writes::of(start, &audit, "ns", &["r", "s"]);
        assert_eq!(w.count, 4);
        assert!((w.first_received - 1.0).abs() < 1e-9);
        assert!((w.last_answered - 2.0).abs() < 1e-9);
        assert!((w.rate() - 4.0).abs() < 1e-9);
        // 10 + 10 + 10 + 685 ms busy over 1 s.
        assert!((w.in_flight() - 0.715).abs() < 1e-9);
        assert_eq!(
            Writes::of(start, &audit, "ns", &["nobody"]),
            Writes::default()
        );
    }

    #[test]
    fn pooled_runs_weigh_every_second_alike() {
        let run = |count, seconds| Writes {
            count,
            first_received: 1.0,
            last_answered: 1.0 + seconds,
            busy: 0.0,
        };
        // 1000/s for 1 s and 250/s for 4 s: 2000 writes in 5 s, not the mean of the rates.
        assert_eq!(pooled([run(1000, 1.0), run(1000, 4.0)].iter()), 400.0);
        assert_eq!(pooled([].iter()), 0.0);
    }
}
