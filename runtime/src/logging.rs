//! Structured logging with `tracing`: plain text for people, JSON for log pipelines.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::Error;

/// Output format of the logs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

/// Flags of the logging setup.
#[derive(clap::Args, Clone, Debug)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "SHARDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` directive syntax, e.g. `info` or `info,sharder_webhook=debug`.
    #[arg(long, env = "SHARDER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

impl LogArgs {
    /// Installs the global subscriber. Fails on an invalid `--log-level`, naming the flag.
    pub fn init(&self) -> Result<(), Error> {
        let filter = EnvFilter::try_new(&self.log_level).map_err(|e| Error::InvalidFlag {
            flag: "--log-level",
            value: self.log_level.clone(),
            reason: e.to_string(),
        })?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        let result = match self.log_format {
            LogFormat::Plain => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
        };
        result.map_err(|e| Error::Logging(e.to_string()))
    }
}
