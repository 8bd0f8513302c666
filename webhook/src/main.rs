//! `sharder-webhook`: parses flags and runs the webhook (see the library for everything else).

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = sharder_webhook::Args::parse();
    sharder_webhook::run(args).await?;
    Ok(())
}
