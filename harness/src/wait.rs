//! Waiting for conditions in tests, and a minimal HTTP GET for admin endpoints.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sharder_common::RingId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Polls `check` every 100 ms until it returns `Ok`, or panics after `timeout` with the last
/// error and `what`.
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Debug,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(e) if started.elapsed() >= timeout => {
                panic!("{what}: not true after {timeout:?}; last: {e:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `GET path` over plain HTTP/1.1; returns the status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The values of the samples of `metric` whose label set contains every `labels` pair, from a
/// Prometheus text exposition.
fn samples<'a>(
    exposition: &'a str,
    metric: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(move |line| {
            let (name_and_labels, value) = line.rsplit_once(' ')?;
            let (name, label_text) = match name_and_labels.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (name_and_labels, ""),
            };
            (name == metric
                && labels
                    .iter()
                    .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse().ok())
            .flatten()
        })
}

/// The value of the first sample of `metric` whose label set contains every `labels` pair, from
/// a Prometheus text exposition.
pub fn metric_value(exposition: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(exposition, metric, labels).next()
}

/// The sum of the samples of `metric` whose label set contains every `labels` pair (`&[]`:
/// every sample).
pub fn metric_sum(exposition: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    samples(exposition, metric, labels).sum()
}

/// The lists a rebalance can run, as `sharder_reconciler_rebalances_total` names them.
pub const LISTS: [&str; 5] = ["all", "on_shard", "unassigned", "stray", "after_drains"];

/// What the reconciler's metrics say of one ring's rebalances: counters since it started (or,
/// from [`Rebalances::since`], between two readings) and the gauges as they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebalances {
    /// Rebalances ended (`sharder_reconciler_rebalance_duration_seconds_count`).
    pub count: f64,
    /// The seconds they took together (its `_sum`).
    pub seconds: f64,
    /// Rebalances by each list they ran ([`LISTS`]; absent: none).
    pub lists: BTreeMap<String, f64>,
    /// Objects their lists returned.
    pub listed: f64,
    /// Drain labels added, every resource.
    pub drains: f64,
    /// Objects assigned directly, every resource.
    pub movements: f64,
    /// Object writes that failed after retries, by resource.
    pub failed_writes: BTreeMap<String, f64>,
    /// Failed rebalances and reconciles by reason (`list`, `write`, `reconcile`).
    pub failed: BTreeMap<String, f64>,
    /// Drains pending at the last count (a gauge).
    pub pending_drains: f64,
    /// Whether drain checks follow the last rebalance (a gauge).
    pub drain_checks: bool,
}

impl Rebalances {
    /// The figures of `ring` in the reconciler's metrics `exposition`.
    pub fn of(exposition: &str, ring: &RingId) -> Self {
        let label = [(ring.kind.lower(), ring.name.as_str())];
        let sum = |metric: &str| metric_sum(exposition, metric, &label);
        let by = |metric: &str, key: &str, values: &[&str]| -> BTreeMap<String, f64> {
            values
                .iter()
                .filter_map(|v| {
                    let labels = [label[0], (key, v)];
                    metric_value(exposition, metric, &labels).map(|n| ((*v).to_owned(), n))
                })
                .collect()
        };
        Self {
            count: sum("sharder_reconciler_rebalance_duration_seconds_count"),
            seconds: sum("sharder_reconciler_rebalance_duration_seconds_sum"),
            lists: by("sharder_reconciler_rebalances_total", "list", &LISTS),
            listed: sum("sharder_reconciler_listed_objects_total"),
            drains: sum("controller_sharding_drains_total"),
            movements: sum("controller_sharding_movements_total"),
            failed_writes: by(
                "sharder_reconciler_failed_writes_total",
                "resource",
                &["secrets", "configmaps", "gizmos"],
            ),
            failed: by(
                "sharder_reconciler_failed_rebalances_total",
                "reason",
                &["list", "write", "reconcile"],
            ),
            pending_drains: sum("sharder_reconciler_pending_drains"),
            drain_checks: sum("sharder_reconciler_drain_checks_scheduled") > 0.0,
        }
    }

    /// The counters' growth since `earlier`; the gauges as they are now.
    pub fn since(&self, earlier: &Self) -> Self {
        let minus = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v != 0.0)
                .collect()
        };
        Self {
            count: self.count - earlier.count,
            seconds: self.seconds - earlier.seconds,
            lists: minus(&self.lists, &earlier.lists),
            listed: self.listed - earlier.listed,
            drains: self.drains - earlier.drains,
            movements: self.movements - earlier.movements,
            failed_writes: minus(&self.failed_writes, &earlier.failed_writes),
            failed: minus(&self.failed, &earlier.failed),
            pending_drains: self.pending_drains,
            drain_checks: self.drain_checks,
        }
    }

    /// Rebalances that ran `list` ([`LISTS`]).
    pub fn list(&self, list: &str) -> f64 {
        self.lists.get(list).copied().unwrap_or(0.0)
    }

    /// Rebalances that ran only `list` and no other: all of them ran it, and no other list.
    pub fn only(&self, list: &str) -> bool {
        self.lists.keys().all(|l| l == list) && self.list(list) == self.count
    }
}

/// The apiserver's own metrics (`GET /metrics` with `client`'s credentials).
pub async fn apiserver_metrics(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// Has the apiserver collect its garbage now and returns once it did (`GET
/// /debug/pprof/heap?gc=1`, served while its `--profiling` is on, the default): a measurement
/// that starts right after finds no garbage of earlier work left to collect.
pub async fn apiserver_collect_garbage(client: &kube::Client) -> Result<(), kube::Error> {
    let request = http::Request::get("/debug/pprof/heap?gc=1&debug=1")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await.map(drop)
}

/// How the apiserver answered the lists of one resource so far (from its own metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ListReads {
    /// Lists it read from etcd (`etcd_request_duration_seconds_count`, operations `list` and
    /// `listStream`).
    pub from_etcd: f64,
    /// List responses its watch cache served: every page of a paginated list and every list with
    /// `resourceVersion=0` (`apiserver_cache_list_total`, or from 1.37 on
    /// `apiserver_storage_list_total` with `storage="watchcache"`).
    pub from_cache: f64,
    /// Consistent lists (first pages) its watch cache answered without falling back to etcd
    /// (`apiserver_watch_cache_consistent_read_total`, `fallback="false"`); a list with
    /// `resourceVersion=0` is not one.
    pub consistent: f64,
}

impl ListReads {
    /// The lists answered between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            from_etcd: self.from_etcd - earlier.from_etcd,
            from_cache: self.from_cache - earlier.from_cache,
            consistent: self.consistent - earlier.consistent,
        }
    }
}

/// How the apiserver `client` talks to answered the lists of `resource` (of the core group, or
/// `group`) so far. An error when the apiserver reports no etcd request for the resource at
/// all: then its metrics are not the ones read here, and counts of 0 would mean nothing.
pub async fn list_reads(
    client: &kube::Client,
    group: &str,
    resource: &str,
) -> Result<ListReads, kube::Error> {
    let metrics = apiserver_metrics(client).await?;
    let of = [("group", group), ("resource", resource)];
    let etcd = "etcd_request_duration_seconds_count";
    if samples(&metrics, etcd, &of).next().is_none() {
        return Err(kube::Error::Service(
            format!("the apiserver's metrics have no {etcd} of {resource}").into(),
        ));
    }
    let from_etcd = ["list", "listStream"]
        .iter()
        .map(|op| metric_sum(&metrics, etcd, &[of[0], of[1], ("operation", op)]))
        .sum();
    let deprecated = "apiserver_cache_list_total";
    let from_cache = if samples(&metrics, deprecated, &of).next().is_some() {
        metric_sum(&metrics, deprecated, &of)
    } else {
        let storage = ("storage", "watchcache");
        metric_sum(
            &metrics,
            "apiserver_storage_list_total",
            &[of[0], of[1], storage],
        )
    };
    let consistent = metric_sum(
        &metrics,
        "apiserver_watch_cache_consistent_read_total",
        &[of[0], of[1], ("fallback", "false"), ("success", "true")],
    );
    Ok(ListReads {
        from_etcd,
        from_cache,
        consistent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "# HELP x X\n# TYPE x counter\n\
        x_total{clusterring=\"a\",reason=\"no_name\"} 2\n\
        x_total{clusterring=\"b\",reason=\"no_name\"} 5\n\
        y 7\n";

    #[test]
    fn metric_values_are_found_by_name_and_labels() {
        assert_eq!(
            metric_value(EXPOSITION, "x_total", &[("clusterring", "b")]),
            Some(5.0)
        );
        assert_eq!(metric_value(EXPOSITION, "y", &[]), Some(7.0));
        assert_eq!(
            metric_value(EXPOSITION, "x_total", &[("clusterring", "c")]),
            None
        );
        assert_eq!(metric_sum(EXPOSITION, "x_total", &[]), 7.0);
        assert_eq!(
            metric_sum(EXPOSITION, "x_total", &[("clusterring", "b")]),
            5.0
        );
    }
}
