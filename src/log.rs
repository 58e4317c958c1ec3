//! Diagnostics through `tracing`: why a takeover, a fence, a repair, a retry or a publish
//! happened, with the backfill, DAG, interval and try as fields. Off by default; `BACKFILL_LOG`
//! takes a filter directive (`BACKFILL_LOG=debug`, `BACKFILL_LOG=backfill::recovery=info`),
//! `-vv` means debug, and `--log-format json` writes JSON lines. Always on stderr, apart from
//! the progress and summary that the reporter writes.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;
use crate::exit::Error;

/// The environment variable that holds the filter directive.
pub(crate) const ENV: &str = "BACKFILL_LOG";

/// Installs the subscriber for this process.
pub fn init(verbose: u8, format: LogFormat) -> Result<(), Error> {
    let filter = match std::env::var(ENV) {
        Ok(directive) => EnvFilter::try_new(&directive).map_err(|e| {
            Error::Usage(format!(
                "{ENV}={directive} is not a filter directive ({e}); write it like `info`, `debug` or `backfill::recovery=debug`"
            ))
        })?,
        Err(_) if verbose >= 2 => EnvFilter::new("backfill=debug"),
        Err(_) => EnvFilter::new("off"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .with_ansi(
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        );
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| Error::Internal(format!("cannot start diagnostics: {e}")))
}
