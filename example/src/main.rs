//! `checksum-controller`: parses flags and runs the example shard (see the library for the rest).

use std::process::ExitCode;

use clap::Parser as _;
use sharder_example::Error;
use sharder_sdk::lease::LEASE_LOST_EXIT_STATUS;
use sharder_sdk::shard::ShardError;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = sharder_example::Args::parse();
    match sharder_example::run(args).await {
        Err(Error::Shard(ShardError::LeaseLost(_))) => Ok(ExitCode::from(LEASE_LOST_EXIT_STATUS)),
        result => Ok(result.map(|()| ExitCode::SUCCESS)?),
    }
}
