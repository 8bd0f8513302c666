//! `checksum-controller`: parses flags and runs the example shard (see the library for the rest).

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = sharder_example::Args::parse();
    sharder_example::run(args).await?;
    Ok(())
}
