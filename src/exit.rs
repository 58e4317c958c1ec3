//! Exit codes, and the error type that maps onto them. Every exit code of the binary is here.

use crate::interval::RangeError;
use crate::project::ProjectError;

/// Every planned interval succeeded, or there was nothing to do.
pub const OK: u8 = 0;
/// An internal error: a bug, or the manifest could not be read or written.
pub const INTERNAL: u8 = 1;
/// Bad usage, bad configuration or bad input; nothing was written.
pub const USAGE: u8 = 2;
/// One or more intervals failed or were rejected; the rest completed.
pub const FAILED: u8 = 3;
/// Interrupted (Ctrl-C, SIGTERM, `backfill cancel`); resumable with `backfill resume ID`.
pub const INTERRUPTED: u8 = 130;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments or input, found before anything was written.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error("{0:#}")]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Project(_) | Self::Range(_) => USAGE,
            Self::Internal(_) => INTERNAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_codes() {
        assert_eq!(Error::Usage("x".into()).exit_code(), USAGE);
        assert_eq!(
            Error::Project(ProjectError::NotFound(".".into())).exit_code(),
            USAGE
        );
        assert_eq!(Error::Internal(anyhow::anyhow!("x")).exit_code(), INTERNAL);
    }
}
