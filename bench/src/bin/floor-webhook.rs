//! The floor webhook as a process: serves `sharder_bench::floor` over TLS on a loopback port of
//! its own choosing and prints `serving <addr>` once it listens.
//!
//! `floor-webhook CERT_FILE KEY_FILE`

use std::sync::Arc;

use anyhow::Context as _;
use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let mut args = std::env::args().skip(1);
    let usage = || anyhow::anyhow!("usage: floor-webhook CERT_FILE KEY_FILE");
    let (cert, key) = (
        args.next().ok_or_else(usage)?,
        args.next().ok_or_else(usage)?,
    );
    let certs = CertificateDer::pem_file_iter(&cert)
        .with_context(|| format!("certificate {cert}"))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("certificate {cert}"))?;
    let key = PrivateKeyDer::from_pem_file(&key).with_context(|| format!("key {key}"))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    println!("serving {}", listener.local_addr()?);
    axum_server::from_tcp_rustls(listener, RustlsConfig::from_config(Arc::new(config)))?
        .serve(sharder_bench::floor::floor_router().into_make_service())
        .await?;
    Ok(())
}
