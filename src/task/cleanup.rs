//! A command task's `cleanup`: what removes a try's unpublished output (an audit branch, a
//! staging folder) once the output will not be published: the gate rejected it, the try failed
//! or was cancelled, or `backfill discard` dropped it after staging. It runs with the try's own
//! environment plus `BACKFILL_CLEANUP` (why), its output appended to the try's log, and nothing
//! stops it but its timeout: a cleanup cut short by a Ctrl-C would leave what it exists to
//! remove.

use std::path::Path;
use std::time::Duration;

use crate::process::{self, Ended, Input, Output, Program};

/// How long a cleanup may take when its task sets no `timeout`.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a try's output is being cleaned up: the value of `BACKFILL_CLEANUP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    Rejected,
    Failed,
    Cancelled,
    Discarded,
}

impl Why {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Discarded => "discarded",
        }
    }
}

/// Runs a rendered `cleanup` command in `cwd` with the try's environment, its output appended to
/// `log`. `Err` says why it did not succeed, for a warning: a failed cleanup never changes how
/// the try ended.
pub(crate) async fn run(
    program: &Program,
    env: &[(String, String)],
    why: Why,
    cwd: &Path,
    log: &Path,
    timeout: Option<Duration>,
    grace: Duration,
) -> Result<(), String> {
    let mut env = env.to_vec();
    env.push(("BACKFILL_CLEANUP".into(), why.as_str().into()));
    let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT);
    let (_no_stop, mut stop) = tokio::sync::watch::channel(process::Stop::Run);
    let spawned = process::start(process::Command {
        program,
        env: &env,
        cwd,
        input: Input::Null,
        output: Output::Log(log.to_path_buf()),
    })
    .await
    .map_err(|e| {
        format!(
            "cannot start `{}`: {}",
            program.name(),
            crate::limits::io(&e)
        )
    })?;
    let finished = process::finish(spawned, Some(timeout), grace, &mut stop)
        .await
        .map_err(|e| e.to_string())?;
    match finished.ended {
        Ended::Exited(status) if status.success() => Ok(()),
        Ended::Exited(status) => Err(process::describe_exit(status)),
        Ended::TimedOut | Ended::Cancelled => Err(format!(
            "timed out after {}",
            humantime::format_duration(timeout)
        )),
    }
}
