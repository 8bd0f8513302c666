//! Section 2, the webhook alone under load: a generator keeping HTTP/1.1 keep-alive TLS
//! connections busy posting one AdmissionReview body, against the floor and the sharder webhook
//! in this process (alternating rounds; the sharder also reviewing for a ControllerRing).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject as _;
use sharder_common::RingId;
use sharder_webhook::admission::{OwnerRef, RingSnapshot};

use crate::floor::FLOOR_PATH;
use crate::report::{goals, table};
use crate::stats::{median_at, percentile};
use crate::{Args, Error};

/// A load run's reviews per second, p50, p90 and p99 (ms), and failed requests.
type Figures = [f64; 5];

/// Where to post what.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    path: String,
    body: Bytes,
    tls: tokio_rustls::TlsConnector,
}

fn load_error(e: impl std::fmt::Display) -> Error {
    Error::Setup(format!("load connection: {e}"))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Target {
    /// `body` posted to `path` on `addr`, over TLS trusting the PEM CA `ca`.
    fn new(addr: SocketAddr, path: String, body: &Bytes, ca: &str) -> Result<Self, Error> {
        let mut roots = rustls::RootCertStore::empty();
        let cert =
            rustls_pki_types::CertificateDer::from_pem_slice(ca.as_bytes()).map_err(load_error)?;
        roots.add(cert).map_err(load_error)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(load_error)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        Ok(Self {
            addr,
            path,
            body: body.clone(),
            tls,
        })
    }

    /// A keep-alive HTTP/1.1 connection.
    async fn connect(&self) -> Result<Sender, Error> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(load_error)?;
        tcp.set_nodelay(true).map_err(load_error)?;
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").map_err(load_error)?;
        let tls = self.tls.connect(name, tcp).await.map_err(load_error)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(load_error)?;
        tokio::spawn(conn);
        Ok(sender)
    }

    /// Posts the body once: whether the answer was a success, and its body.
    async fn post(&self, sender: &mut Sender) -> Result<(bool, Bytes), Error> {
        let request = hyper::Request::post(self.path.as_str())
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(self.body.clone()))
            .map_err(load_error)?;
        let response = sender.send_request(request).await.map_err(load_error)?;
        let ok = response.status().is_success();
        Ok((
            ok,
            response
                .into_body()
                .collect()
                .await
                .map_err(load_error)?
                .to_bytes(),
        ))
    }

    /// Loads the target over `connections` connections for `duration`.
    async fn load(&self, connections: u64, duration: Duration) -> Result<Figures, Error> {
        let started = Instant::now();
        let until = started + duration;
        let tasks: Vec<_> = (0..connections)
            .map(|_| {
                let target = self.clone();
                tokio::spawn(async move {
                    let mut sender = target.connect().await?;
                    let (mut latencies, mut errors) = (Vec::new(), 0);
                    while Instant::now() < until {
                        let sent = Instant::now();
                        match target.post(&mut sender).await {
                            Ok((true, _)) => latencies.push(sent.elapsed()),
                            _ => errors += 1,
                        }
                    }
                    Ok::<_, Error>((latencies, errors))
                })
            })
            .collect();
        let (mut latencies, mut errors) = (Vec::new(), 0);
        for task in tasks {
            let (l, e) = task.await.map_err(load_error)??;
            latencies.extend(l);
            errors += e;
        }
        let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let p = |q| percentile(&latencies, q).as_secs_f64() * 1e3;
        Ok([rate, p(50.0), p(90.0), p(99.0), f64::from(errors)])
    }
}

/// The load reviews main objects only: no owner is ever read.
struct NoOwners;

impl sharder_webhook::owners::Owners for NoOwners {
    fn state<'a>(
        &'a self,
        _: &'a RingSnapshot,
        _: &'a OwnerRef,
    ) -> futures::future::BoxFuture<'a, Result<sharder_common::OwnerState, String>> {
        Box::pin(async { Ok(sharder_common::OwnerState::NotSharded) })
    }
}

/// Starts the floor and the sharder webhook (ring `example` of 10 shards as a ClusterRing and
/// a ControllerRing, no apiserver) on a runtime of their own (2 worker threads) over loopback
/// TLS; their addresses and the CA.
fn start_servers() -> Result<(SocketAddr, SocketAddr, String), Error> {
    let ca = sharder_harness::certs::TestCa::new("bench-ca")?;
    let cert = ca.serving_cert("bench")?;
    let dir = tempfile::tempdir()
        .map_err(Error::io("create a folder"))?
        .keep();
    let (cert, key) = cert
        .write_to(&dir)
        .map_err(Error::io("write the certificate"))?;
    let files = sharder_webhook::tls::TlsFiles { cert, key };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::io("start the servers' runtime"))?;
    let entered = runtime.enter();
    let spec = sharder_harness::fixtures::secrets_ring("example", None).spec;
    let rings = Arc::new(sharder_webhook::ring_source::Rings::default());
    let ids = [
        RingId::cluster_ring("example"),
        RingId::controller_ring("example"),
    ];
    rings.publish(
        ids.into_iter()
            .map(|id| {
                let snapshot = RingSnapshot::new(&id, &spec, (0..10).map(|i| format!("shard-{i}")));
                (id, Arc::new(snapshot))
            })
            .collect(),
    );
    let metrics = sharder_webhook::metrics::Metrics::new(
        &mut prometheus_client::registry::Registry::default(),
    );
    let limits = sharder_webhook::server::Limits::default();
    let sharder = sharder_webhook::server::router(rings, Arc::new(NoOwners), metrics, limits);
    let (config, _) = files
        .load()
        .map_err(|e| Error::Setup(format!("the load TLS files: {e}")))?;
    let mut addrs = Vec::new();
    for app in [crate::floor::floor_router(), sharder] {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::io("bind a load server"))?;
        listener
            .set_nonblocking(true)
            .map_err(Error::io("bind a load server"))?;
        addrs.push(
            listener
                .local_addr()
                .map_err(Error::io("bind a load server"))?,
        );
        let server = axum_server::from_tcp_rustls(listener, config.clone())
            .map_err(Error::io("serve TLS"))?;
        tokio::spawn(server.serve(app.into_make_service()));
    }
    drop(entered);
    std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    Ok((addrs[0], addrs[1], ca.pem()))
}

/// Names of the in-process load's servers, as the report shows them.
const SERVERS: [&str; 3] = ["floor", "sharder", "sharder, ControllerRing"];

/// Loads the floor and the sharder webhook in-process (see [`start_servers`]) in rounds after a
/// 1 s warm-up of each, from a runtime of its own (2 worker threads), every other round in the
/// reverse order; each round's server and figures, in the order run. Blocks the calling thread,
/// which must not be a runtime's worker.
fn in_process(args: &Args) -> Result<Vec<(&'static str, Figures)>, Error> {
    let (floor, sharder, ca) = start_servers()?;
    let body = Bytes::from(sharder_harness::fixtures::secret_create_review(
        "object-1234",
        "project-a",
        &[("app", "web")],
        false,
    ));
    let targets = [
        Target::new(floor, FLOOR_PATH.to_owned(), &body, &ca)?,
        Target::new(
            sharder,
            RingId::cluster_ring("example").webhook_path(),
            &body,
            &ca,
        )?,
        Target::new(
            sharder,
            RingId::controller_ring("example").webhook_path(),
            &body,
            &ca,
        )?,
    ];
    let (connections, seconds, rounds) =
        (args.load_connections, args.load_seconds, args.load_rounds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::io("start the load runtime"))?;
    runtime.block_on(async {
        for target in &targets {
            target.load(connections, Duration::from_secs(1)).await?;
        }
        let mut out = Vec::new();
        for round in 0..rounds {
            let mut order: Vec<_> = SERVERS.into_iter().zip(&targets).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for (server, target) in order {
                let figures = target.load(connections, Duration::from_secs(seconds));
                out.push((server, figures.await?));
            }
        }
        Ok(out)
    })
}

/// Runs the section's rounds; its text.
pub(crate) async fn run(args: &Args) -> Result<String, Error> {
    let rounds = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || in_process(&args))
            .await
            .map_err(load_error)??
    };
    Ok(markdown(&rounds, args))
}

/// The median over the rounds of `a`'s figure `i` against `b`'s in the same round: servers
/// loaded seconds apart share the machine's state, which drifts over a run.
fn paired_ratio(rounds: &[(&str, Figures)], a: &str, b: &str, i: usize) -> f64 {
    let per_round = rounds.chunks(SERVERS.len()).filter_map(|round| {
        let of = |server| round.iter().find(|(s, _)| *s == server).map(|(_, f)| f[i]);
        Some(of(a)? / of(b)?)
    });
    crate::stats::median(per_round.collect())
}

/// The section's text from the in-process rounds.
fn markdown(rounds: &[(&str, Figures)], args: &Args) -> String {
    let mut out = format!(
        "In-process: a hyper HTTP/1.1 keep-alive load generator with {} connections and both servers (floor and sharder, same TLS stack) on 2 worker threads each, {} rounds of {} s each after a 1 s warm-up, every other round in the reverse order (ratios: the median of each round's own); the sharder webhook also reviews for a ControllerRing of the same spec and shards.\n\n",
        args.load_connections, args.load_rounds, args.load_seconds
    );
    out += &table(
        "round | server | reviews/s | p50 ms | p90 ms | p99 ms | errors",
        rounds
            .iter()
            .enumerate()
            .map(|(i, (server, [rate, p50, p90, p99, errors]))| {
                format!(
                    "{} | {server} | {rate:.0} | {p50:.3} | {p90:.3} | {p99:.3} | {errors}",
                    i / SERVERS.len() + 1
                )
            }),
    );
    let median = |server: &str, i: usize| median_at(rounds, server, i);
    out += &table(
        "median | reviews/s | p50 ms | p90 ms | p99 ms",
        SERVERS.map(|s| {
            format!(
                "{s} | {:.0} | {:.3} | {:.3} | {:.3}",
                median(s, 0),
                median(s, 1),
                median(s, 2),
                median(s, 3)
            )
        }),
    );
    let ratio = |a: &str, b: &str, i: usize| paired_ratio(rounds, a, b, i);
    let (throughput, p99) = (ratio("sharder", "floor", 0), ratio("sharder", "floor", 3));
    out += &goals(&[
        (
            "sharder/floor throughput (median of rounds)".into(),
            format!("{throughput:.3}x"),
            ">= 0.95x",
            throughput >= 0.95,
        ),
        (
            "sharder/floor p99 (median of rounds)".into(),
            format!("{p99:.3}x"),
            "<= 1.1x",
            p99 <= 1.1,
        ),
    ]);
    let (controller, cluster) = (SERVERS[2], SERVERS[1]);
    out + &format!(
        "A ControllerRing's reviews against a ClusterRing's on the same webhook (median of rounds): throughput {:.2}x, p99 {:.2}x. The webhook's memory as deployed, under the creates of section 7, is in section 7.\n\n",
        ratio(controller, cluster, 0),
        ratio(controller, cluster, 3),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(rate: f64) -> Figures {
        [rate, 0.0, 0.0, 0.0, 0.0]
    }

    #[test]
    fn each_round_is_judged_against_the_floor_of_the_same_round() {
        // The machine is slower in rounds 2 and 3, and the sharder's last two rounds are slow:
        // each round's own ratio gives 0.9, the ratio of the medians would give 0.6.
        let rounds: Vec<(&str, Figures)> = [(100.0, 90.0), (50.0, 45.0), (50.0, 45.0)]
            .into_iter()
            .chain([(100.0, 60.0), (100.0, 60.0)])
            .enumerate()
            .flat_map(|(i, (floor, sharder))| {
                let mut round = vec![
                    (SERVERS[0], figures(floor)),
                    (SERVERS[1], figures(sharder)),
                    (SERVERS[2], figures(sharder * 0.5)),
                ];
                if i % 2 == 1 {
                    round.reverse();
                }
                round
            })
            .collect();
        assert_eq!(paired_ratio(&rounds, "sharder", "floor", 0), 0.9);
        assert_eq!(paired_ratio(&rounds, SERVERS[2], "sharder", 0), 0.5);
        assert!(paired_ratio(&rounds[1..3], "sharder", "floor", 0).is_nan());
    }
}
