//! `sharder-bench`: parses flags and runs the benchmarks (see the library).

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    sharder_bench::run(sharder_bench::Args::parse()).await?;
    Ok(())
}
