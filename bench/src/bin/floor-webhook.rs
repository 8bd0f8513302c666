//! The floor webhook as a process: serves `sharder_bench::floor` over TLS (the sharder
//! webhook's own TLS setup) on a loopback port of its own choosing and prints `serving <addr>`
//! once it listens.
//!
//! `floor-webhook CERT_FILE KEY_FILE`

use sharder_webhook::tls::TlsFiles;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let [cert, key] = sharder_bench::helper_args::<2>("floor-webhook CERT_FILE KEY_FILE")?;
    let (config, _) = TlsFiles {
        cert: cert.into(),
        key: key.into(),
    }
    .load()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    println!("serving {}", listener.local_addr()?);
    axum_server::from_tcp_rustls(listener, config)?
        .serve(sharder_bench::floor::floor_router().into_make_service())
        .await?;
    Ok(())
}
