//! Exit codes, and the error type that maps onto them. Every exit code of the binary is here,
//! and an error's code is decided by its kind alone. (A panic, or an allocation that fails, is
//! no error: the process aborts, see `crash`, and a shell shows 134.)

use crate::interval::RangeError;
use crate::project::ProjectError;

/// Every planned interval succeeded, or there was nothing to do.
pub const OK: u8 = 0;
/// An internal error: a bug, or the manifest or a warehouse could not be read or written; or
/// the environment failed (a full disk, no descriptors or memory left, see
/// [`crate::environment`]), which stopped a backfill that `backfill resume` continues.
pub(crate) const INTERNAL: u8 = 1;
/// Bad usage, bad configuration or bad input, or an open-files limit too low for the run;
/// nothing was written.
pub const USAGE: u8 = 2;
/// One or more intervals failed or were rejected; the rest completed.
pub(crate) const FAILED: u8 = 3;
/// `--require-ready`: every interval that ran succeeded, and the sources of one or more were
/// not ready (`[tasks.ready]`), so they did not run.
pub(crate) const NOT_READY: u8 = 4;
/// Interrupted (Ctrl-C, SIGTERM, SIGHUP, `backfill cancel`); resumable with `backfill resume ID`.
pub(crate) const INTERRUPTED: u8 = 130;

/// Every error the library reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments or input, found before anything was written.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(transparent)]
    Now(#[from] crate::clock::BadNow),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::Error),
    #[error(transparent)]
    Warehouse(#[from] crate::warehouse::Error),
    /// What the process may open or start is too little for the command; nothing was written.
    #[error(transparent)]
    Limit(#[from] crate::limits::Refused),
    #[error("{context}: {}", crate::limits::io(source))]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// What a backfill stood on went while it ran: its project folder, or its manifest's file.
    #[error("{0}")]
    Gone(String),
    /// The machine or a service failed, not a task (see [`crate::environment`]).
    #[error("{0}")]
    Environment(crate::environment::Fault),
    /// A failure with no better kind: a bug.
    #[error("{0}")]
    Internal(String),
    /// stdout was closed by its reader (`backfill show 1 | head`): not an error.
    #[error("stdout was closed")]
    ClosedPipe,
}

impl Error {
    /// The exit code of this kind of error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Project(_) | Self::Range(_) | Self::Now(_) | Self::Limit(_) => {
                USAGE
            }
            Self::Manifest(
                crate::manifest::Error::Missing { .. }
                | crate::manifest::Error::NotAManifest { .. }
                | crate::manifest::Error::Emptied { .. }
                | crate::manifest::Error::ReadOnly { .. }
                | crate::manifest::Error::ReadOnlyRole { .. }
                | crate::manifest::Error::BadUrl { .. },
            ) => USAGE,
            Self::Manifest(_)
            | Self::Warehouse(_)
            | Self::Io { .. }
            | Self::Gone(_)
            | Self::Environment(_)
            | Self::Internal(_) => INTERNAL,
            Self::ClosedPipe => OK,
        }
    }

    /// A short name of the kind, for `{"error": {"kind": ..}}`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Usage(_) | Self::Now(_) => "usage",
            Self::Project(_) => "configuration",
            Self::Range(_) => "range",
            Self::Manifest(_) => "manifest",
            Self::Warehouse(crate::warehouse::Error::Environment(_)) | Self::Environment(_) => {
                "environment"
            }
            Self::Warehouse(_) => "warehouse",
            Self::Limit(_) => "limit",
            Self::Io { .. } => "io",
            Self::Gone(_) => "environment",
            Self::Internal(_) => "internal",
            Self::ClosedPipe => "closed pipe",
        }
    }

    /// The environment fault this error is, if it is one: found as such where it happened
    /// (see [`crate::environment`]).
    pub(crate) fn environment(&self) -> Option<crate::environment::Fault> {
        match self {
            Self::Environment(f) => Some(f.clone()),
            Self::Warehouse(w) => w.environment(),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_codes_by_kind() {
        assert_eq!(Error::Usage("x".into()).exit_code(), USAGE);
        assert_eq!(
            Error::Project(ProjectError::NotFound(".".into())).exit_code(),
            USAGE
        );
        assert_eq!(Error::Internal("x".into()).exit_code(), INTERNAL);
        assert_eq!(
            Error::Manifest(crate::manifest::Error::WriterGone).exit_code(),
            INTERNAL
        );
        assert_eq!(
            Error::Manifest(crate::manifest::Error::Missing {
                path: "m.db".into()
            })
            .exit_code(),
            USAGE
        );
        assert_eq!(
            Error::Manifest(crate::manifest::Error::NotAManifest {
                path: "w.db".into(),
                why: "x".into()
            })
            .exit_code(),
            USAGE
        );
        assert_eq!(
            Error::Manifest(crate::manifest::Error::Emptied {
                path: "m.db".into(),
                history: "logs".into()
            })
            .exit_code(),
            USAGE
        );
        assert_eq!(Error::Gone("x".into()).exit_code(), INTERNAL);
    }
}
