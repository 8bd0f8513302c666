//! `sharder-reconciler`: parses flags and runs the reconciler (see the library for the rest).

use std::process::ExitCode;

use clap::Parser as _;
use sharder_reconciler::Error;
use sharder_runtime::lease::LEASE_LOST_EXIT_STATUS;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = sharder_reconciler::Args::parse();
    match sharder_reconciler::run(args).await {
        Err(Error::LeadershipLost) => Ok(ExitCode::from(LEASE_LOST_EXIT_STATUS)),
        result => Ok(result.map(|()| ExitCode::SUCCESS)?),
    }
}
