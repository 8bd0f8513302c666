//! Kubernetes clients for bulk work (the reconciler's list pages and object writes), built like
//! kube's default client from the same configuration (KUBECONFIG or in-cluster: server, TLS,
//! credentials, impersonation headers), with the transport chosen for the work and without a
//! retry layer: an overloaded apiserver's 429, 503 and 504 answers reach the caller, which
//! slows down. Timeouts are the caller's (wrap requests in `tokio::time::timeout`).
//!
//! Why HTTP/1.1 for writes: kube-apiserver (Go) serves an HTTP/1.1 request on the connection's
//! own goroutine, an HTTP/2 stream through its connection's frame loop. Measured on the
//! benchmarks' 1.20 apiserver (2 cores, 5,000 merge PATCHes per run, 64 in flight, nine runs
//! each, alternated): median 1,274 PATCH/s over HTTP/1.1 and 1,130/s over one HTTP/2
//! connection. The price is a connection per write in flight (about 30 KiB each: TLS and HTTP
//! buffers, TLS state, hyper's dispatch channel), which [`Transport::reads`] keeps from growing.
//! Writes read in exact 4 KiB pieces ([`Reads::Exact`]): an answer's head is a few
//! hundred bytes and its body (the object's metadata) is read piece by piece, while hyper's
//! default reserves 8 KiB per read and, as it reads ahead while the previous answer still holds
//! its buffer, often a second one. Measured with the benchmarks' memory section (one run each,
//! same machine and day): the reconciler's peak at 100,000 objects 20.5 -> 19.4 MiB, at 1,000
//! objects 18.1 -> 17.7 MiB.
//!
//! HTTP/2 writes spread over a few connections ([`Transport::http2_writes`]) are the alternative
//! when connections cost more than speed: a connection carries up to 250 writes at once (the
//! apiserver's default stream limit), but the apiserver reads and writes one connection's frames in
//! one loop, so the writes are spread over several, in turn. Measured with the benchmarks' crash
//! and memory sections (README, `--http2-write-connections`): with 128 writes in flight, the
//! apiserver's audit log sees fewer of them at once than over HTTP/1.1 and dead-shard moves are
//! slower, while the reconciler holds far fewer sockets and less memory.
//!
//! Why write connections are capped, not only their idle ones ([`Transport::max_connections`],
//! `clients::capped`): when a request finds no idle connection, hyper-util's pool starts a new one,
//! and if another request's connection comes back first it takes that one and still keeps the
//! new connection. A cap on idle connections ([`Transport::idle_connections`], what the lists
//! use) closes the extra ones as they come back, but at the peak of a rebalance the reconciler
//! held 163 write connections for 128 writes in flight (heaptrack, benchmarks' memory section
//! at 10,000 objects). Capped, a write that finds none idle waits for the next to come back:
//! the reconciler's peak at 10,000 objects with 128 in flight was 20.1-20.3 MiB against 21.4.
//!
//! Why a capped connection's hyper state is renewed, not the connection: hyper hands requests
//! to a connection through a channel that takes a second 8.5 KiB block once it carried 32
//! requests, the one part of a connection that grows with use. Renewing whole connections
//! (`Connection: close` after 16 requests) was measured worse (peak at 100,000 objects 20.3
//! against 19.5 MiB, the TLS handshakes churning the heap); `clients::capped` keeps the TCP and TLS
//! connection and starts hyper's state again on it every [`REQUESTS_PER_CHANNEL`] requests.
//! Idle connections are closed after [`IDLE_TIMEOUT`].

use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use tower::{BoxError, Service, ServiceBuilder};

use crate::Error;

mod capped;

use capped::CappedPool;

/// Requests an HTTP/1.1 connection of a capped pool ([`Transport::max_connections`]) carries
/// before hyper's state on it is started again (same TCP and TLS connection): hyper hands
/// requests to a connection through a channel whose memory comes in blocks of 32 messages, and
/// closing it takes a slot too, so 31 requests and the close fit in the first block; a
/// connection that carried more holds a second block (8.5 KiB) for the rest of its life.
pub const REQUESTS_PER_CHANNEL: usize = 31;

/// How long a connection may stay idle in a client's pool before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How a client talks to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport {
    /// Offer HTTP/2 (ALPN `h2`, then `http/1.1`): every request of a pool on one connection.
    /// Otherwise HTTP/1.1: a connection per request in flight, kept for reuse.
    pub http2: bool,
    /// Separate connection pools the requests take in turn (at least 1): with HTTP/2, this
    /// many connections.
    pub pools: usize,
    /// How an HTTP/1.1 connection reads.
    pub reads: Reads,
    /// The most idle connections each pool keeps for reuse (at least 1); more are closed
    /// when their request is done.
    pub idle_connections: usize,
    /// HTTP/1.1 only: the most connections the client holds, busy or idle (0: no cap); a
    /// request that finds none idle at the cap waits for one to come back (`clients::capped`).
    pub max_connections: usize,
}

/// How an HTTP/1.1 connection reads what the apiserver sends.
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
    /// Object writes: HTTP/1.1, answers are one object's metadata, read 4 KiB at a time; at
    /// most 64 idle connections (set the writes in flight at most with
    /// [`Self::with_idle_connections`]).
    pub const WRITES: Self = Self {
        http2: false,
        pools: 1,
        reads: Reads::Exact(4 * 1024),
        idle_connections: 64,
        max_connections: 64,
    };

    /// List pages: HTTP/1.1, read in pieces of at most 16 KiB (a page is parsed as it arrives,
    /// so a piece only has to hold an object or two; hyper's default lets a long list grow its
    /// buffer to 400 KiB and more).
    pub const LISTS: Self = Self {
        http2: false,
        pools: 1,
        reads: Reads::Growing(16 * 1024),
        idle_connections: 8,
        max_connections: 0,
    };

    /// Everything on one HTTP/2 connection.
    pub const MULTIPLEXED: Self = Self {
        http2: true,
        pools: 1,
        reads: Reads::Growing(64 * 1024),
        idle_connections: 1,
        max_connections: 0,
    };

    /// Object writes over HTTP/2, spread in turn over `connections` connections (at least 1).
    /// Should the apiserver answer only HTTP/1.1, they read like [`Self::WRITES`] and each
    /// pool keeps at most 64 idle connections (see [`Self::with_idle_connections`]).
    pub const fn http2_writes(connections: usize) -> Self {
        Self {
            http2: true,
            pools: if connections == 0 { 1 } else { connections },
            max_connections: 0,
            ..Self::WRITES
        }
    }

    /// This transport keeping at most `n` idle connections (at least 1).
    pub const fn with_idle_connections(self, n: usize) -> Self {
        Self {
            idle_connections: if n == 0 { 1 } else { n },
            ..self
        }
    }

    /// This transport holding at most `n` connections (at least 1), all of which it keeps
    /// when idle: as many as writes in flight at most.
    pub const fn with_connections(self, n: usize) -> Self {
        let n = if n == 0 { 1 } else { n };
        Self {
            idle_connections: n,
            max_connections: n,
            ..self
        }
    }
}

/// A client with `transport` from the environment (KUBECONFIG or in-cluster).
pub async fn client(transport: Transport) -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
    client_for(config, transport)
}

/// A client with `transport` for `config`.
pub fn client_for(config: kube::Config, transport: Transport) -> Result<kube::Client, Error> {
    let tls = config.rustls_client_config().map_err(Error::Client)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            Error::Client(kube::Error::RustlsTls(
                kube::client::RustlsTlsError::InvalidServerName(e),
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = if transport.http2 {
        https.enable_all_versions().wrap_connector(http)
    } else {
        https.enable_http1().wrap_connector(http)
    };
    if transport.max_connections > 0 && !transport.http2 {
        let mut http1 = hyper::client::conn::http1::Builder::new();
        match transport.reads {
            Reads::Exact(size) => http1.read_buf_exact_size(Some(size.max(1))),
            Reads::Growing(max) => http1.max_buf_size(max.max(8 * 1024)),
        };
        let pools = (0..transport.pools.max(1))
            .map(|_| CappedPool::new(https.clone(), http1.clone(), transport.max_connections))
            .collect();
        return kube_client(&config, InTurn::new(pools));
    }
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    match transport.reads {
        Reads::Exact(size) => builder.http1_read_buf_exact_size(size.max(1)),
        Reads::Growing(max) => builder.http1_max_buf_size(max.max(8 * 1024)),
    };
    builder
        .pool_max_idle_per_host(transport.idle_connections.max(1))
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE_TIMEOUT);
    let pools = (0..transport.pools.max(1))
        .map(|_| builder.build(https.clone()))
        .collect();
    kube_client(&config, InTurn::new(pools))
}

/// A kube client sending through `service` (absolute URIs in, answers out) with `config`'s
/// base URI, credentials and extra headers.
fn kube_client<S>(config: &kube::Config, service: S) -> Result<kube::Client, Error>
where
    S: Service<http::Request<kube::client::Body>, Response = http::Response<Incoming>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .map_err(Into::<BoxError>::into)
        .service(service);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Requests spread over several services in turn (each of the transport's pools).
#[derive(Clone, Debug)]
struct InTurn<S> {
    services: Vec<S>,
    next: usize,
}

impl<S> InTurn<S> {
    /// Requests to `services` in turn, starting with the first.
    ///
    /// # Panics
    /// If `services` is empty.
    fn new(services: Vec<S>) -> Self {
        assert!(!services.is_empty(), "InTurn needs a service");
        Self { services, next: 0 }
    }
}

impl<S: Service<R>, R> Service<R> for InTurn<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.services[self.next].poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let this = self.next;
        self.next = (this + 1) % self.services.len();
        self.services[this].call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::future::{Ready, ready};

    use tower::ServiceExt as _;

    use super::*;

    /// A service answering with its own number.
    #[derive(Clone, Copy, Debug)]
    struct Numbered(usize);

    impl Service<()> for Numbered {
        type Response = usize;
        type Error = std::convert::Infallible;
        type Future = Ready<Result<usize, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            ready(Ok(self.0))
        }
    }

    #[tokio::test]
    async fn requests_take_the_services_in_turn() {
        let mut spread = InTurn::new((0..3).map(Numbered).collect());
        let mut answered = Vec::new();
        for _ in 0..7 {
            answered.push(spread.ready().await.unwrap().call(()).await.unwrap());
        }
        assert_eq!(answered, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[tokio::test]
    async fn one_service_takes_every_request() {
        let mut spread = InTurn::new(vec![Numbered(7)]);
        for _ in 0..3 {
            assert_eq!(spread.ready().await.unwrap().call(()).await.unwrap(), 7);
        }
    }

    #[test]
    fn zero_http2_write_connections_mean_one() {
        assert_eq!(Transport::http2_writes(0).pools, 1);
        assert_eq!(Transport::http2_writes(4).pools, 4);
        assert!(Transport::http2_writes(4).http2);
    }
}
