//! Alerts: the `[notify]` commands run when a `create` or `resume` ends, also when it was
//! interrupted. `on_failure` runs when an interval failed or was rejected (or the backfill hit
//! an internal error), `on_not_ready` when the sources of one or more intervals were not ready
//! (`[tasks.ready]`), `on_success` when every planned interval succeeded, `on_finish` always.
//! Each runs in the project folder with the JSON summary on stdin and `BACKFILL_ID`,
//! `BACKFILL_DAG`, `BACKFILL_STATE`, `BACKFILL_EXIT_CODE` and `BACKFILL_NOT_READY` (how many
//! intervals were not ready) in its environment, in its own
//! process group, stopped after its timeout (default 30 s): SIGTERM to the group, SIGKILL after
//! [`GRACE`]. The timeout also bounds the summary's delivery: a hook that does not read its
//! stdin is stopped like any other. Its output goes to `LOGS/notify/ID.EVENT.log`. A hook that
//! fails is a warning: it never changes the exit code. A stop (a signal to backfill) stops the
//! running hook the same way, and no other hook starts.

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use crate::exit;
use crate::process::{self, Input, Output, Program, Stop};
use crate::project::{CommandSpec, Notify};

/// How long a hook may take unless `timeout` says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How a backfill ended, for its hooks.
pub(crate) struct Ended<'a> {
    pub backfill_id: i64,
    pub dag_id: &'a str,
    pub state: &'a str,
    pub exit_code: u8,
    /// Intervals whose sources were not ready.
    pub not_ready: i64,
    /// The JSON summary (as `--output json` prints it), given on stdin.
    pub summary: String,
}

/// The hooks that apply to an end, in the order they run.
fn due(notify: &Notify, exit_code: u8, not_ready: i64) -> Vec<(&'static str, &CommandSpec)> {
    let mut hooks = Vec::new();
    match exit_code {
        exit::OK if not_ready == 0 => {
            hooks.extend(notify.on_success.as_ref().map(|c| ("on_success", c)));
        }
        exit::FAILED | exit::INTERNAL => {
            hooks.extend(notify.on_failure.as_ref().map(|c| ("on_failure", c)));
        }
        _ => {}
    }
    if not_ready > 0 && exit_code != exit::INTERRUPTED {
        hooks.extend(notify.on_not_ready.as_ref().map(|c| ("on_not_ready", c)));
    }
    hooks.extend(notify.on_finish.as_ref().map(|c| ("on_finish", c)));
    hooks
}

/// How long a hook gets between SIGTERM and SIGKILL once its timeout passed or it was stopped.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// Runs the hooks that apply, one after the other; returns a warning for each that failed or
/// did not run. Once `stop` leaves [`Stop::Run`], the running hook is stopped (SIGTERM, SIGKILL
/// after [`GRACE`], at once on [`Stop::Kill`]) and no other starts.
pub(crate) async fn run(
    notify: &Notify,
    root: &Path,
    logs: &Path,
    ended: &Ended<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> Vec<String> {
    let timeout = notify.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let mut warnings = Vec::new();
    for (event, spec) in due(notify, ended.exit_code, ended.not_ready) {
        if *stop.borrow() != Stop::Run {
            warnings.push(format!(
                "notify hook `{event}` did not run: backfill was stopped by a signal"
            ));
            continue;
        }
        let log = logs
            .join("notify")
            .join(format!("{}.{event}.log", ended.backfill_id));
        tracing::info!(backfill = ended.backfill_id, event, "running a notify hook");
        if let Err(why) = hook(spec, root, &log, ended, timeout, stop).await {
            warnings.push(format!(
                "notify hook `{event}` {why} (log: {})",
                log.display()
            ));
        }
    }
    warnings
}

async fn hook(
    spec: &CommandSpec,
    root: &Path,
    log: &Path,
    ended: &Ended<'_>,
    timeout: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> Result<(), String> {
    // Created before the hook starts, so that the log a warning names exists.
    process::open_log(log).map_err(|e| format!("cannot open its log: {e}"))?;
    let program = match spec {
        CommandSpec::Argv(argv) => Program::Argv(argv.clone()),
        CommandSpec::Shell(line) => Program::Shell(line.clone()),
    };
    let env = [
        ("BACKFILL_ID", ended.backfill_id.to_string()),
        ("BACKFILL_DAG", ended.dag_id.to_string()),
        ("BACKFILL_STATE", ended.state.to_string()),
        ("BACKFILL_EXIT_CODE", ended.exit_code.to_string()),
        ("BACKFILL_NOT_READY", ended.not_ready.to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v));
    let mut summary = Vec::with_capacity(ended.summary.len() + 1);
    summary.extend_from_slice(ended.summary.as_bytes());
    summary.push(b'\n');
    let spawned = process::start(process::Command {
        program: &program,
        env: &env,
        cwd: root,
        input: Input::Bytes(summary),
        output: Output::Log(log.to_path_buf()),
    })
    .await
    .map_err(|e| format!("cannot start: {e}"))?;
    let finished = process::finish(spawned, Some(timeout), GRACE, stop)
        .await
        .map_err(|e| format!("cannot be waited for: {e}"))?;
    match finished.ended {
        process::Ended::Exited(status) if status.success() => Ok(()),
        process::Ended::Exited(status) => {
            Err(format!("failed: {}", process::describe_exit(status)))
        }
        process::Ended::TimedOut => Err(format!(
            "timed out after {} and was killed",
            humantime::format_duration(timeout)
        )),
        process::Ended::Cancelled => Err("was stopped by a signal".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_follow_the_exit_code_and_sources_not_ready() {
        let shell = |s: &str| Some(CommandSpec::Shell(s.into()));
        let n = Notify {
            on_failure: shell("f"),
            on_success: shell("s"),
            on_not_ready: shell("n"),
            on_finish: shell("x"),
            timeout: None,
        };
        let names = |code, not_ready| {
            due(&n, code, not_ready)
                .into_iter()
                .map(|h| h.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(exit::OK, 0), ["on_success", "on_finish"]);
        assert_eq!(names(exit::FAILED, 0), ["on_failure", "on_finish"]);
        assert_eq!(names(exit::INTERNAL, 0), ["on_failure", "on_finish"]);
        assert_eq!(names(exit::INTERRUPTED, 0), ["on_finish"]);
        // Not ready: not a success, not a failure.
        assert_eq!(names(exit::OK, 2), ["on_not_ready", "on_finish"]);
        assert_eq!(names(exit::NOT_READY, 2), ["on_not_ready", "on_finish"]);
        assert_eq!(
            names(exit::FAILED, 1),
            ["on_failure", "on_not_ready", "on_finish"]
        );
        assert_eq!(names(exit::INTERRUPTED, 1), ["on_finish"]);
    }
}
