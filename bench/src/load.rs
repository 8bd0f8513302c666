//! Webhook load: a generator that keeps `connections` HTTP/1.1 keep-alive TLS connections busy
//! posting one AdmissionReview body for a while and reports reviews/s and latency percentiles
//! (used by the in-process `load` bench), and the webhook processes' memory under that load:
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
use crate::stats::{percentile, rss_kib};
use crate::webhooks::Webhooks;

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
            sharder_common::endpoint::webhook_path(ring),
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
