//! The two webhooks of the latency comparison, served over TLS on loopback from one dedicated
//! runtime (2 threads) so both pay the same: the floor webhook (a fixed one-label patch) and
//! the sharder webhook (`sharder_webhook::run_with_client`, watching the real rings and Leases).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;
use sharder_tests::ControlPlane;
use sharder_tests::certs::TestCa;
use sharder_tests::fixtures::loopback_addr;
use sharder_tests::wait::http_get;
use sharder_webhook::floor::floor_router;
use sharder_webhook::tls::TlsFiles;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The running webhooks.
pub struct Webhooks {
    /// The floor webhook's address.
    pub floor: SocketAddr,
    /// The sharder webhook's address.
    pub sharder: SocketAddr,
    /// The PEM CA both certificates are signed by.
    pub ca_pem: String,
    /// A file holding `ca_pem` (the reconciler's `--webhook-ca-file`).
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts both webhooks; returns once the sharder webhook is ready.
pub async fn start() -> Result<Webhooks, Error> {
    let ca = TestCa::new("bench-ca").map_err(|e| Error::Setup(e.to_string()))?;
    let cert = ca
        .serving_cert("bench-webhook")
        .map_err(|e| Error::Setup(e.to_string()))?;
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&files.cert, &cert.cert_pem).map_err(Error::io("write the certificate"))?;
    std::fs::write(&files.key, &cert.key_pem).map_err(Error::io("write the key"))?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).map_err(Error::io("write the CA"))?;
    let floor = loopback_addr();
    let sharder = loopback_addr();
    let admin = loopback_addr();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let args = sharder_webhook::Args::parse_from([
        "sharder-webhook",
        "--listen-addr",
        &sharder.to_string(),
        "--admin-addr",
        &admin.to_string(),
        "--tls-cert-file",
        &files.cert.to_string_lossy(),
        "--tls-key-file",
        &files.key.to_string_lossy(),
    ]);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("webhook runtime");
        runtime.block_on(async move {
            let cp = ControlPlane::shared().await.expect("control plane");
            let client = cp.client().await.expect("client");
            let (config, _) = files.load().expect("tls");
            let listener = std::net::TcpListener::bind(floor).expect("bind the floor webhook");
            listener.set_nonblocking(true).expect("nonblocking");
            let server = axum_server::from_tcp_rustls(listener, config).expect("floor server");
            tokio::spawn(server.serve(floor_router().into_make_service()));
            if let Err(e) = sharder_webhook::run_with_client(args, client, token).await {
                eprintln!("[bench] the sharder webhook stopped: {e}");
            }
        });
    });
    for _ in 0..300 {
        if let Ok((200, _)) = http_get(admin, "/readyz").await {
            return Ok(Webhooks {
                floor,
                sharder,
                ca_pem: ca.pem(),
                ca_file,
                _dir: dir,
                stop,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Setup(
        "the sharder webhook did not become ready".into(),
    ))
}
