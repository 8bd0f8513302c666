//! Webhook load: a generator that keeps `connections` HTTP/1.1 keep-alive TLS connections busy
//! posting one AdmissionReview body for a while and reports reviews/s and latency percentiles,
//! the in-process run of it against the floor and the sharder webhook ([`run_in_process`]; also
//! `cargo bench -p sharder-bench --bench load`), and the webhook processes' memory under load:
//! the sharder webhook and the floor webhook, each its own process as deployed, loaded in turn
//! while their RSS is read from `/proc`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject as _;

use crate::Error;
use crate::stats::percentile;
use crate::webhooks::Webhooks;
use sharder_harness::procfs::rss_kib;

/// The round label of the sharder webhook reviewing for a ControllerRing (the other sharder
/// rounds review for a ClusterRing of the same spec and shards).
pub const CONTROLLER_RING: &str = "sharder, ControllerRing";

/// The goal on the sharder webhook's throughput against the floor's (at least this ratio).
pub const THROUGHPUT_GOAL: f64 = 0.95;

/// The goal on the sharder webhook's p99 latency against the floor's (at most this ratio).
pub const P99_GOAL: f64 = 1.1;

/// One load run's numbers.
#[derive(Clone, Debug)]
pub struct LoadRound {
    /// Answered reviews per second.
    pub reviews_per_second: f64,
    /// Latency percentiles.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Failed requests (transport errors or non-2xx answers).
    pub errors: usize,
}

/// What to send where.
#[derive(Clone)]
pub struct Target {
    /// The server.
    pub addr: SocketAddr,
    /// The request path.
    pub path: String,
    /// The review body posted every time.
    pub body: Bytes,
}

/// A TLS connector trusting the PEM CA `ca`.
pub fn connector(ca: &str) -> Result<tokio_rustls::TlsConnector, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let cert = rustls_pki_types::CertificateDer::from_pem_slice(ca.as_bytes())
        .map_err(|e| Error::Setup(format!("the load CA: {e}")))?;
    roots
        .add(cert)
        .map_err(|e| Error::Setup(format!("the load CA: {e}")))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Setup(format!("TLS versions: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

fn setup_error(e: &dyn std::fmt::Display) -> Error {
    Error::Setup(format!("load connection: {e}"))
}

/// A keep-alive HTTP/1.1 connection to `target` over TLS.
async fn connect(target: &Target, connector: &tokio_rustls::TlsConnector) -> Result<Sender, Error> {
    let tcp = tokio::net::TcpStream::connect(target.addr)
        .await
        .map_err(|e| setup_error(&e))?;
    tcp.set_nodelay(true).map_err(|e| setup_error(&e))?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").map_err(|e| setup_error(&e))?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| setup_error(&e))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| setup_error(&e))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Posts `target`'s body once on `sender`: the status and the answer's body.
async fn post(sender: &mut Sender, target: &Target) -> Result<(bool, Bytes), Error> {
    let request = hyper::Request::post(target.path.as_str())
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(target.body.clone()))
        .map_err(|e| setup_error(&e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| setup_error(&e))?;
    let ok = response.status().is_success();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| setup_error(&e))?
        .to_bytes();
    Ok((ok, body))
}

/// One connection posting `target`'s body until `until`: latencies (µs) and errors.
async fn connection(
    target: Target,
    connector: tokio_rustls::TlsConnector,
    until: Instant,
) -> Result<(Vec<u32>, usize), Error> {
    let mut sender = connect(&target, &connector).await?;
    let mut latencies = Vec::new();
    let mut errors = 0;
    while Instant::now() < until {
        let started = Instant::now();
        match post(&mut sender, &target).await {
            Ok((true, _)) => {
                latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            Ok((false, _)) | Err(_) => errors += 1,
        }
    }
    Ok((latencies, errors))
}

/// Waits until `target` answers its review with a patch (a webhook that knows the ring and
/// its shards), at most `timeout`.
pub async fn wait_until_patching(
    target: &Target,
    connector: &tokio_rustls::TlsConnector,
    timeout: Duration,
) -> Result<(), Error> {
    let started = Instant::now();
    let mut sender = connect(target, connector).await?;
    loop {
        let (ok, body) = post(&mut sender, target).await?;
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // Base64 text (the sharder) or an array of bytes (kube's serializer, the floor).
        let patch = &answer["response"]["patch"];
        if ok && (patch.is_string() || patch.is_array()) {
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(Error::Setup(format!(
                "{} answered no patch within {timeout:?}: {answer}",
                target.path
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the in-process load run loads each server.
#[derive(clap::Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Keep-alive connections each round keeps busy.
    #[arg(id = "load_connections", long = "load-connections", env = "SHARDER_BENCH_LOAD_CONNECTIONS", default_value_t = 32,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,
    /// Seconds per round.
    #[arg(id = "load_seconds", long = "load-seconds", env = "SHARDER_BENCH_LOAD_SECONDS", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Rounds per server, alternating floor and sharder (0: no in-process load run).
    #[arg(
        id = "load_rounds",
        long = "load-rounds",
        env = "SHARDER_BENCH_LOAD_ROUNDS",
        default_value_t = 5
    )]
    pub rounds: usize,
}

/// The in-process load run: both servers loaded in turn, round by round.
#[derive(Clone, Debug)]
pub struct LoadRun {
    /// How each server was loaded.
    pub options: LoadOptions,
    /// Each round: the server (`floor` or `sharder`) and its numbers, in the order run.
    pub rounds: Vec<(&'static str, LoadRound)>,
}

impl LoadRun {
    /// The median over `server`'s rounds of `f`.
    pub fn median(&self, server: &str, f: impl Fn(&LoadRound) -> f64) -> f64 {
        crate::stats::median(
            self.rounds
                .iter()
                .filter(|(name, _)| *name == server)
                .map(|(_, round)| f(round))
                .collect(),
        )
    }

    /// The sharder's median throughput and p99 against the floor's.
    pub fn ratios(&self) -> (f64, f64) {
        let rps = |r: &LoadRound| r.reviews_per_second;
        let p99 = |r: &LoadRound| r.p99.as_secs_f64();
        (
            self.median("sharder", rps) / self.median("floor", rps),
            self.median("sharder", p99) / self.median("floor", p99),
        )
    }

    /// A ControllerRing's reviews against a ClusterRing's on the same sharder webhook (medians):
    /// throughput and p99 ratios.
    pub fn controller_ring_ratios(&self) -> (f64, f64) {
        let rps = |r: &LoadRound| r.reviews_per_second;
        let p99 = |r: &LoadRound| r.p99.as_secs_f64();
        (
            self.median(CONTROLLER_RING, rps) / self.median("sharder", rps),
            self.median(CONTROLLER_RING, p99) / self.median("sharder", p99),
        )
    }

    /// The rounds and the medians as markdown tables.
    pub fn markdown(&self) -> String {
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        let mut out = crate::report::table(
            &[
                "round",
                "server",
                "reviews/s",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "errors",
            ],
            self.rounds.iter().enumerate().map(|(i, (server, r))| {
                vec![
                    (i / 3 + 1).to_string(),
                    (*server).to_owned(),
                    format!("{:.0}", r.reviews_per_second),
                    ms(r.p50),
                    ms(r.p90),
                    ms(r.p99),
                    r.errors.to_string(),
                ]
            }),
        );
        out.push('\n');
        out += &crate::report::table(
            &["median", "reviews/s", "p50 ms", "p90 ms", "p99 ms"],
            ["floor", "sharder", CONTROLLER_RING]
                .into_iter()
                .map(|server| {
                    let at = |f: fn(&LoadRound) -> Duration| {
                        format!("{:.3}", self.median(server, |r| f(r).as_secs_f64() * 1e3))
                    };
                    vec![
                        server.to_owned(),
                        format!("{:.0}", self.median(server, |r| r.reviews_per_second)),
                        at(|r| r.p50),
                        at(|r| r.p90),
                        at(|r| r.p99),
                    ]
                }),
        );
        out
    }
}

/// The load reviews main objects only: no owner is ever read.
struct NoOwners;

impl sharder_webhook::owners::Owners for NoOwners {
    fn state<'a>(
        &'a self,
        _: &'a sharder_webhook::admission::RingSnapshot,
        _: &'a sharder_webhook::admission::OwnerRef,
    ) -> futures::future::BoxFuture<'a, Result<sharder_common::OwnerState, String>> {
        Box::pin(async { Ok(sharder_common::OwnerState::NotSharded) })
    }
}

/// Starts the floor and the sharder webhook (ring `example` of 10 shards, no apiserver) on a
/// runtime of their own (2 worker threads) over loopback TLS; their addresses and the CA.
fn start_servers() -> Result<(SocketAddr, SocketAddr, String), Error> {
    use sharder_webhook::admission::RingSnapshot;
    use sharder_webhook::ring_source::Rings;

    let ca = sharder_harness::certs::TestCa::new("bench-ca")?;
    let cert = ca.serving_cert("bench")?;
    let dir = tempfile::tempdir()
        .map_err(Error::io("create a folder"))?
        .keep();
    std::fs::write(dir.join("tls.crt"), &cert.cert_pem).map_err(Error::io("write the cert"))?;
    std::fs::write(dir.join("tls.key"), &cert.key_pem).map_err(Error::io("write the key"))?;
    let files = sharder_webhook::tls::TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = (|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(Error::io("start the servers' runtime"))?;
            let _entered = runtime.enter();
            let spec = sharder_harness::fixtures::secrets_ring("example", None).spec;
            let rings = Arc::new(Rings::default());
            // The same ring as a ClusterRing and as a ControllerRing.
            let snapshots = [
                sharder_common::RingId::cluster_ring("example"),
                sharder_common::RingId::controller_ring("example"),
            ]
            .into_iter()
            .map(|ring| {
                let shards = (0..10).map(|i| format!("shard-{i}"));
                let snapshot = Arc::new(RingSnapshot::new(&ring, &spec, shards));
                (ring, snapshot)
            })
            .collect();
            rings.publish(snapshots);
            let metrics = sharder_webhook::metrics::Metrics::new(
                &mut prometheus_client::registry::Registry::default(),
            );
            let limits = sharder_webhook::server::Limits::default();
            let sharder =
                sharder_webhook::server::router(rings, Arc::new(NoOwners), metrics, limits);
            let mut addrs = Vec::new();
            for app in [crate::floor::floor_router(), sharder] {
                let (config, _) = files
                    .load()
                    .map_err(|e| Error::Setup(format!("the load TLS files: {e}")))?;
                let listener = std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(Error::io("bind a load server"))?;
                listener
                    .set_nonblocking(true)
                    .map_err(Error::io("bind a load server"))?;
                addrs.push(
                    listener
                        .local_addr()
                        .map_err(Error::io("bind a load server"))?,
                );
                let server = axum_server::from_tcp_rustls(listener, config)
                    .map_err(Error::io("serve TLS"))?;
                tokio::spawn(server.serve(app.into_make_service()));
            }
            Ok::<_, Error>((runtime, addrs[0], addrs[1]))
        })();
        match started {
            Ok((runtime, floor, sharder)) => {
                let _ = tx.send(Ok((floor, sharder)));
                runtime.block_on(std::future::pending::<()>());
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    let (floor, sharder) = rx
        .recv()
        .map_err(|_| Error::Setup("the load servers did not start".to_owned()))??;
    Ok((floor, sharder, ca.pem()))
}

/// Loads the floor and the sharder webhook in-process (see [`start_servers`]) in alternating
/// rounds after a 1 s warm-up of each, from a load generator on a runtime of its own (2 worker
/// threads). Blocks the calling thread.
pub fn run_in_process(options: LoadOptions) -> Result<LoadRun, Error> {
    let (floor, sharder, ca) = start_servers()?;
    let sharder_path = sharder_common::RingId::cluster_ring("example").webhook_path();
    let controller_path = sharder_common::RingId::controller_ring("example").webhook_path();
    let body = Bytes::from(sharder_harness::fixtures::secret_create_review(
        "object-1234",
        "project-a",
        &[("app", "web")],
        false,
    ));
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(Error::io("start the load runtime"))?;
        runtime.block_on(async {
            let connector = connector(&ca)?;
            let load = |addr: SocketAddr, path: &str, seconds: u64| {
                let target = Target {
                    addr,
                    path: path.to_owned(),
                    body: body.clone(),
                };
                let connector = connector.clone();
                async move {
                    round(
                        &target,
                        &connector,
                        options.connections,
                        Duration::from_secs(seconds),
                    )
                    .await
                }
            };
            load(floor, crate::floor::FLOOR_PATH, 1).await?;
            load(sharder, &sharder_path, 1).await?;
            load(sharder, &controller_path, 1).await?;
            let mut rounds = Vec::new();
            for _ in 0..options.rounds {
                rounds.push((
                    "floor",
                    load(floor, crate::floor::FLOOR_PATH, options.seconds).await?,
                ));
                rounds.push((
                    "sharder",
                    load(sharder, &sharder_path, options.seconds).await?,
                ));
                rounds.push((
                    CONTROLLER_RING,
                    load(sharder, &controller_path, options.seconds).await?,
                ));
            }
            Ok(LoadRun { options, rounds })
        })
    })
    .join()
    .map_err(|_| Error::Setup("the load generator panicked".to_owned()))?
}

/// Loads `target` over `connections` connections for `duration`.
pub async fn round(
    target: &Target,
    connector: &tokio_rustls::TlsConnector,
    connections: usize,
    duration: Duration,
) -> Result<LoadRound, Error> {
    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(connection(target.clone(), connector.clone(), until)))
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task
            .await
            .map_err(|e| Error::Setup(format!("load connection task: {e}")))??;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok(LoadRound {
        reviews_per_second: latencies.len() as f64 / elapsed,
        p50: Duration::from_micros(u64::from(percentile(&latencies, 50.0))),
        p90: Duration::from_micros(u64::from(percentile(&latencies, 90.0))),
        p99: Duration::from_micros(u64::from(percentile(&latencies, 99.0))),
        errors,
    })
}

/// A webhook process's memory under load.
#[derive(Clone, Debug)]
pub struct ProcessUnderLoad {
    /// Which webhook.
    pub name: &'static str,
    /// RSS before any load of this run, KiB.
    pub idle: u64,
    /// RSS right after the load, KiB.
    pub after: u64,
    /// Peak RSS of the process's life so far (VmHWM), KiB.
    pub peak: u64,
    /// The load.
    pub load: LoadRound,
}

/// Connections of the process memory run.
pub const PROCESS_CONNECTIONS: usize = 32;

/// Loads the floor and the sharder webhook processes in turn (`PROCESS_CONNECTIONS`
/// connections for `duration` each) with a CREATE review of a Secret in ring `ring`'s namespace
/// and reads their RSS before, after and at peak.
pub async fn processes_under_load(
    webhooks: &Webhooks,
    ring: &str,
    duration: Duration,
) -> Result<Vec<ProcessUnderLoad>, Error> {
    let connector = connector(&webhooks.ca_pem)?;
    let body = Bytes::from(sharder_harness::fixtures::secret_create_review(
        "object-load",
        ring,
        &[("app", "web")],
        false,
    ));
    let runs = [
        (
            "floor webhook",
            webhooks.floor,
            crate::floor::FLOOR_PATH.to_owned(),
            webhooks.floor_pid,
        ),
        (
            "sharder webhook",
            webhooks.sharder.addr,
            sharder_common::RingId::cluster_ring(ring).webhook_path(),
            webhooks.sharder.process.pid(),
        ),
    ];
    let mut out = Vec::new();
    for (name, addr, path, pid) in runs {
        let target = Target {
            addr,
            path,
            body: body.clone(),
        };
        wait_until_patching(&target, &connector, Duration::from_secs(60)).await?;
        let rss = || rss_kib(pid).ok_or_else(|| Error::Setup(format!("no RSS of the {name}")));
        let (idle, _) = rss()?;
        // Warm-up, not counted in the rates.
        round(
            &target,
            &connector,
            PROCESS_CONNECTIONS,
            Duration::from_secs(1),
        )
        .await?;
        let load = round(&target, &connector, PROCESS_CONNECTIONS, duration).await?;
        let (after, peak) = rss()?;
        eprintln!(
            "[bench]   {name} process: {:.0} reviews/s, RSS {:.1} MiB idle, {:.1} MiB after, {:.1} MiB peak",
            load.reviews_per_second,
            idle as f64 / 1024.0,
            after as f64 / 1024.0,
            peak as f64 / 1024.0
        );
        out.push(ProcessUnderLoad {
            name,
            idle,
            after,
            peak,
            load,
        });
    }
    Ok(out)
}
