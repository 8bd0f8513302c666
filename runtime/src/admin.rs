//! The admin server: `/livez`, `/readyz` and `/metrics` (Prometheus text) on a plain-HTTP port
//! separate from the component's main traffic.
//!
//! Readiness is a set of named conditions (for example `leases-synced`, `tls-loaded`); `/readyz`
//! answers 200 once all are true and otherwise names the ones still missing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// Flags of the admin server.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminArgs {
    /// Address of the admin server (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, env = "SHARDER_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
}

/// Named readiness conditions, shared between the parts that set them and `/readyz`.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<Mutex<BTreeMap<&'static str, bool>>>);

impl Readiness {
    /// Readiness that waits for each of `conditions` to be set.
    pub fn new(conditions: impl IntoIterator<Item = &'static str>) -> Self {
        Self(Arc::new(Mutex::new(
            conditions.into_iter().map(|c| (c, false)).collect(),
        )))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<&'static str, bool>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets one condition.
    pub fn set(&self, condition: &'static str, ready: bool) {
        self.lock().insert(condition, ready);
    }

    /// Whether every condition is true.
    pub fn is_ready(&self) -> bool {
        self.lock().values().all(|r| *r)
    }

    /// The conditions that are not true yet.
    pub fn missing(&self) -> Vec<&'static str> {
        self.lock()
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(c, _)| *c)
            .collect()
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

/// The admin routes over a metrics registry and readiness conditions.
pub fn router(registry: Arc<Registry>, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let missing = state.readiness.missing();
    if missing.is_empty() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join(", ")),
        )
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Binds the admin server to `addr`; returns the bound address and the serving future, which
/// ends when `shutdown` is cancelled.
pub async fn bind(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Bind {
            flag: "--admin-addr",
            addr,
            source: e,
        })?;
    let local = listener.local_addr().map_err(|e| Error::Bind {
        flag: "--admin-addr",
        addr,
        source: e,
    })?;
    let serve = async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(Error::Serve)
    };
    Ok((local, serve))
}

/// Binds the admin server for `registry` and `readiness` to `addr` and serves it in a task until
/// `shutdown`; returns the bound address and the task.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), Error>>), Error> {
    let (local, serve) = bind(addr, router(Arc::new(registry), readiness), shutdown).await?;
    Ok((local, tokio::spawn(serve)))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    use super::*;

    async fn get_path(router: Router, path: &str) -> (StatusCode, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_names_missing_conditions_until_all_are_set() {
        let readiness = Readiness::new(["tls-loaded", "leases-synced"]);
        let app = router(Arc::new(Registry::default()), readiness.clone());
        let (status, body) = get_path(app.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: leases-synced, tls-loaded\n");
        readiness.set("tls-loaded", true);
        let (_, body) = get_path(app.clone(), "/readyz").await;
        assert_eq!(body, "not ready: leases-synced\n");
        readiness.set("leases-synced", true);
        assert_eq!(get_path(app.clone(), "/readyz").await.0, StatusCode::OK);
        assert_eq!(
            get_path(app, "/livez").await,
            (StatusCode::OK, "ok\n".into())
        );
    }

    #[tokio::test]
    async fn metrics_are_served_in_prometheus_text() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("demo_events", "Demo events", counter.clone());
        counter.inc_by(3);
        let (status, body) =
            get_path(router(Arc::new(registry), Readiness::default()), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("demo_events_total 3"), "{body}");
    }
}
