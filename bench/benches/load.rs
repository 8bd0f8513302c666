//! Load run of the TLS webhook server beside the floor webhook, in the same run.
//!
//! Both servers run on one runtime (2 worker threads) on loopback TLS; a load generator on its own
//! runtime keeps `--connections` HTTP/1.1 keep-alive connections busy for `--seconds` per round,
//! alternating floor and sharder for `--rounds` rounds each, and prints reviews/s and
//! p50/p90/p99 per round, the medians, and the sharder/floor ratios.
//!
//! `cargo bench -p sharder-bench --bench load -- --connections 32 --seconds 5 --rounds 3`
// A bench target is a crate of its own; its items need no docs.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::registry::Registry;
use sharder_bench::floor::{FLOOR_PATH, floor_router};
use sharder_bench::load::{LoadRound, Target, connector};
use sharder_bench::stats::median;
use sharder_common::OwnerState;
use sharder_webhook::admission::{OwnerRef, RingSnapshot};
use sharder_webhook::metrics::Metrics;
use sharder_webhook::owners::Owners;
use sharder_webhook::ring_source::Rings;
use sharder_webhook::server::{Limits, router};
use sharder_webhook::tls::TlsFiles;

struct Options {
    connections: usize,
    seconds: u64,
    rounds: usize,
}

fn options() -> Options {
    let mut options = Options {
        connections: 32,
        seconds: 5,
        rounds: 3,
    };
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| -> Option<usize> {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    if let Some(v) = value("--connections") {
        options.connections = v;
    }
    if let Some(v) = value("--seconds") {
        options.seconds = v as u64;
    }
    if let Some(v) = value("--rounds") {
        options.rounds = v;
    }
    options
}

fn review_body() -> Vec<u8> {
    sharder_harness::fixtures::secret_create_review(
        "object-1234",
        "project-a",
        &[("app", "web")],
        false,
    )
}

/// The load reviews main objects only: no owner is ever read.
struct NoOwners;

impl Owners for NoOwners {
    fn state<'a>(
        &'a self,
        _: &'a RingSnapshot,
        _: &'a OwnerRef,
    ) -> futures::future::BoxFuture<'a, Result<OwnerState, String>> {
        Box::pin(async { Ok(OwnerState::NotSharded) })
    }
}

/// Starts both servers on their own runtime; returns (floor, sharder) addresses and the CA.
fn start_servers() -> (SocketAddr, SocketAddr, String) {
    let ca = sharder_harness::certs::TestCa::new("bench-ca").expect("ca");
    let cert = ca.serving_cert("bench").expect("cert");
    let dir = tempfile::tempdir().expect("dir").keep();
    std::fs::write(dir.join("tls.crt"), &cert.cert_pem).expect("cert");
    std::fs::write(dir.join("tls.key"), &cert.key_pem).expect("key");
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let spec = sharder_harness::fixtures::secrets_ring("example", None).spec;
            let rings = Arc::new(Rings::default());
            rings.publish(
                [(
                    "example".to_owned(),
                    Arc::new(RingSnapshot::new(
                        "example",
                        &spec,
                        (0..10).map(|i| format!("shard-{i}")),
                    )),
                )]
                .into(),
            );
            let metrics = Metrics::new(&mut Registry::default());
            let sharder = router(rings, Arc::new(NoOwners), metrics, Limits::default());
            let mut addrs = Vec::new();
            for app in [floor_router(), sharder] {
                let (config, _) = files.load().expect("tls");
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                listener.set_nonblocking(true).expect("nonblocking");
                addrs.push(listener.local_addr().expect("addr"));
                let server = axum_server::from_tcp_rustls(listener, config).expect("server");
                tokio::spawn(server.serve(app.into_make_service()));
            }
            tx.send((addrs[0], addrs[1])).expect("send");
            std::future::pending::<()>().await;
        });
    });
    let (floor, sharder) = rx.recv().expect("servers started");
    (floor, sharder, ca.pem())
}

async fn round(addr: SocketAddr, path: &str, ca: &str, options: &Options) -> LoadRound {
    let target = Target {
        addr,
        path: path.to_owned(),
        body: Bytes::from(review_body()),
    };
    let connector = connector(ca).expect("connector");
    sharder_bench::load::round(
        &target,
        &connector,
        options.connections,
        Duration::from_secs(options.seconds),
    )
    .await
    .expect("load round")
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is needed from the harness.
    let options = options();
    let (floor, sharder, ca) = start_servers();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "webhook load: {} connections, {} s per round, {} rounds each, TLS over loopback",
        options.connections, options.seconds, options.rounds
    );
    println!("| round | server | reviews/s | p50 | p90 | p99 | errors |");
    println!("|---|---|---|---|---|---|---|");
    let mut results: Vec<(&str, LoadRound)> = Vec::new();
    runtime.block_on(async {
        // Warm-up, not counted.
        let warm = Options {
            seconds: 1,
            ..options
        };
        round(floor, FLOOR_PATH, &ca, &warm).await;
        round(sharder, "/webhooks/sharder/clusterring/example", &ca, &warm).await;
        for i in 0..options.rounds {
            for (name, addr, path) in [
                ("floor", floor, FLOOR_PATH),
                ("sharder", sharder, "/webhooks/sharder/clusterring/example"),
            ] {
                let r = round(addr, path, &ca, &options).await;
                println!(
                    "| {} | {name} | {:.0} | {:?} | {:?} | {:?} | {} |",
                    i + 1,
                    r.reviews_per_second,
                    r.p50,
                    r.p90,
                    r.p99,
                    r.errors
                );
                results.push((name, r));
            }
        }
    });
    let med = |server: &str, f: fn(&LoadRound) -> f64| {
        median(
            results
                .iter()
                .filter(|(n, _)| *n == server)
                .map(|(_, r)| f(r))
                .collect(),
        )
    };
    let rps = |r: &LoadRound| r.reviews_per_second;
    let p50 = |r: &LoadRound| r.p50.as_secs_f64() * 1e3;
    let p90 = |r: &LoadRound| r.p90.as_secs_f64() * 1e3;
    let p99 = |r: &LoadRound| r.p99.as_secs_f64() * 1e3;
    println!();
    println!("| median | reviews/s | p50 ms | p90 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for server in ["floor", "sharder"] {
        println!(
            "| {server} | {:.0} | {:.3} | {:.3} | {:.3} |",
            med(server, rps),
            med(server, p50),
            med(server, p90),
            med(server, p99)
        );
    }
    println!();
    println!(
        "sharder/floor: throughput {:.2}x (goal >= 0.8), p99 {:.2}x (goal <= 1.25)",
        med("sharder", rps) / med("floor", rps),
        med("sharder", p99) / med("floor", p99)
    );
}
