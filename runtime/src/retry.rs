//! What the apiserver asks of a client it refuses for now: a 429 Too Many Requests (API Priority
//! and Fairness, the in-flight limits, a watch cache still initialising after a restart) or a
//! 503 carries how long to wait in `Retry-After`, which the apiserver also writes into the
//! answer's `details.retryAfterSeconds`. Lists, watches and writes wait that long before they
//! try again instead of counting a failure or growing a backoff.

use std::time::Duration;

use kube::runtime::watcher;

/// The longest wait taken from an answer: a larger Retry-After is cut to it, so one odd answer
/// cannot stall a watch or a rebalance for long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long the apiserver asked the client to wait before it tries `error`'s request again:
/// `Some` for a 429 or 503 answer with a positive `retryAfterSeconds` (at most
/// [`MAX_RETRY_AFTER`]), `None` for every other error.
pub fn retry_after(error: &kube::Error) -> Option<Duration> {
    match error {
        kube::Error::Api(status) => status_retry_after(status),
        _ => None,
    }
}

/// [`retry_after`] for the errors of a watch: its list, its start, or an error event in its
/// stream.
pub fn watch_retry_after(error: &watcher::Error) -> Option<Duration> {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => retry_after(e),
        watcher::Error::WatchError(status) => status_retry_after(status),
        watcher::Error::NoResourceVersion => None,
    }
}

/// `status` (the answer of a refused request) with the wait of its `Retry-After` header
/// (`header`, whole seconds) when its body named none: API Priority and Fairness and the
/// in-flight limits refuse with a plain-text body, which a client turns into a `Status` without
/// details, so the header is the only place their wait is told.
pub fn with_retry_after_header(
    mut status: kube::core::Status,
    header: Option<&str>,
) -> kube::core::Status {
    let Some(seconds) = header.and_then(|h| h.trim().parse::<u32>().ok()) else {
        return status;
    };
    match status.details.as_mut() {
        Some(details) if details.retry_after_seconds > 0 => {}
        Some(details) => details.retry_after_seconds = seconds,
        None => {
            status.details = Some(kube::core::response::StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: seconds,
            });
        }
    }
    status
}

fn status_retry_after(status: &kube::core::Status) -> Option<Duration> {
    if !matches!(status.code, 429 | 503) {
        return None;
    }
    let seconds = status.details.as_ref()?.retry_after_seconds;
    (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    /// An answer with `code` and, if given, `details.retryAfterSeconds`, as the apiserver sends it.
    fn answer(code: u16, retry_after_seconds: Option<u32>) -> Box<Status> {
        let mut status = serde_json::json!({ "code": code, "status": "Failure" });
        if let Some(seconds) = retry_after_seconds {
            status["details"] = serde_json::json!({ "retryAfterSeconds": seconds });
        }
        Box::new(serde_json::from_value(status).expect("a Status"))
    }

    #[test]
    fn a_retry_after_header_fills_in_the_wait_a_plain_text_refusal_could_not_name() {
        let plain = || {
            kube::core::Status::failure("Too many requests, please try again later.", "")
                .with_code(429)
        };
        let wait = |status: kube::core::Status| retry_after(&kube::Error::Api(Box::new(status)));
        let cases = [
            (plain(), Some("1"), Some(Duration::from_secs(1))),
            (plain(), Some(" 7 "), Some(Duration::from_secs(7))),
            (plain(), None, None),
            (plain(), Some("soon"), None),
            (plain(), Some("Wed, 21 Oct 2026 07:28:00 GMT"), None),
            // The body's own wait stands.
            (
                *answer(429, Some(3)),
                Some("1"),
                Some(Duration::from_secs(3)),
            ),
            (*answer(429, None), Some("2"), Some(Duration::from_secs(2))),
            (
                *answer(429, Some(0)),
                Some("2"),
                Some(Duration::from_secs(2)),
            ),
            // Only a busy apiserver's answer asks for a wait.
            (plain().with_code(500), Some("1"), None),
        ];
        for (status, header, expected) in cases {
            let code = status.code;
            assert_eq!(
                wait(with_retry_after_header(status, header)),
                expected,
                "{code} {header:?}"
            );
        }
    }

    #[test]
    fn a_busy_apiserver_s_retry_after_is_the_wait_and_nothing_else_asks_for_one() {
        let cases = [
            (answer(429, Some(1)), Some(Duration::from_secs(1))),
            (answer(503, Some(5)), Some(Duration::from_secs(5))),
            (answer(429, Some(3600)), Some(MAX_RETRY_AFTER)),
            (answer(429, Some(0)), None),
            (answer(429, None), None),
            (answer(500, Some(1)), None),
            (answer(410, Some(1)), None),
            (answer(409, Some(1)), None),
        ];
        for (status, wait) in cases {
            let code = status.code;
            let seconds = status.details.as_ref().map(|d| d.retry_after_seconds);
            assert_eq!(
                retry_after(&kube::Error::Api(status.clone())),
                wait,
                "{code} {seconds:?}"
            );
            for error in [
                watcher::Error::InitialListFailed(kube::Error::Api(status.clone())),
                watcher::Error::WatchStartFailed(kube::Error::Api(status.clone())),
                watcher::Error::WatchFailed(kube::Error::Api(status.clone())),
                watcher::Error::WatchError(status.clone()),
            ] {
                assert_eq!(watch_retry_after(&error), wait, "{error:?}");
            }
        }
        assert_eq!(retry_after(&kube::Error::Service("timed out".into())), None);
        assert_eq!(watch_retry_after(&watcher::Error::NoResourceVersion), None);
    }
}
