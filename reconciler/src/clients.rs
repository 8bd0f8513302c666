//! The rebalancer's bulk clients (list pages and object writes), built like kube's default
//! client from the same configuration (KUBECONFIG or in-cluster: server, TLS, credentials,
//! impersonation headers), over HTTP/1.1 through hyper-util's connection pool, and without a
//! retry layer: an overloaded apiserver's 429, 503 and 504 answers reach the rebalancer, which
//! slows down (`rebalance::concurrency`). Timeouts are the caller's. Why not kube's own client
//! with its retries off: docs/performance-notes.md, "Transport and memory".
//!
//! Why HTTP/1.1: kube-apiserver (Go) serves an HTTP/1.1 request on the connection's own
//! goroutine, an HTTP/2 stream through its connection's frame loop, so object writes go faster
//! over HTTP/1.1 (docs/performance-notes.md, "Transport and memory"). The price is a
//! connection per write in flight, which the pool's idle limit keeps from growing past the
//! writes in flight at most.
//! Writes read in exact 4 KiB pieces ([`Reads::Exact`]): an answer's head is a few hundred bytes
//! and its body (one object's metadata) is read piece by piece, where hyper's default reserves
//! 8 KiB per read and often a second buffer while the previous answer still holds the first.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use tower::{BoxError, ServiceBuilder};

use crate::Error;

/// How long a connection may stay idle in a client's pool before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How a client reads from the apiserver and how many idle connections it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport {
    /// How a connection reads.
    pub reads: Reads,
    /// The most idle connections the pool keeps for reuse (at least 1); more are closed when
    /// their request is done.
    pub idle_connections: usize,
}

/// How a connection reads what the apiserver sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// hyper's default: reads of 8 KiB, growing while they fill up, into a buffer of at most
    /// this many bytes (8 KiB at least).
    Growing(usize),
    /// Reads of exactly this many bytes into a buffer that never grows (an answer's head must
    /// fit in it; its body is read piece by piece).
    Exact(usize),
}

impl Transport {
    /// Object writes: answers are one object's metadata, read 4 KiB at a time; as many idle
    /// connections as writes in flight at most (set with [`Self::with_idle_connections`]).
    pub const WRITES: Self = Self {
        reads: Reads::Exact(4 * 1024),
        idle_connections: crate::args::DEFAULT_MAX_CONCURRENT_WRITES,
    };

    /// List pages, read in pieces of at most 16 KiB into the page's body (hyper's default lets
    /// a long list grow its read buffer to 400 KiB and more, beside the body).
    pub const LISTS: Self = Self {
        reads: Reads::Growing(16 * 1024),
        idle_connections: 8,
    };

    /// This transport keeping at most `n` idle connections (at least 1).
    pub const fn with_idle_connections(self, n: usize) -> Self {
        Self {
            idle_connections: if n == 0 { 1 } else { n },
            ..self
        }
    }
}

/// A client with `transport` from the environment (KUBECONFIG or in-cluster).
pub async fn client(transport: Transport) -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| client_error(kube::Error::InferConfig(e)))?;
    client_for(config, transport)
}

/// A client with `transport` for `config`.
pub fn client_for(config: kube::Config, transport: Transport) -> Result<kube::Client, Error> {
    let tls = config.rustls_client_config().map_err(client_error)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            client_error(kube::Error::RustlsTls(
                kube::client::RustlsTlsError::InvalidServerName(e),
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    match transport.reads {
        Reads::Exact(size) => builder.http1_read_buf_exact_size(size.max(1)),
        Reads::Growing(max) => builder.http1_max_buf_size(max.max(8 * 1024)),
    };
    let pool = builder
        .pool_max_idle_per_host(transport.idle_connections.max(1))
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(client_error)?)
        .layer(config.extra_headers_layer().map_err(client_error)?)
        .map_err(Into::<BoxError>::into)
        .service(pool);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// A client configuration error, as the runtime reports it for the main client.
fn client_error(e: kube::Error) -> Error {
    Error::Runtime(sharder_runtime::Error::Client(e))
}
