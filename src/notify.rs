//! Alerts: the `[notify]` commands run when a `create` or `resume` ends, also when it was
//! interrupted. `on_failure` runs when an interval failed or was rejected (or the backfill hit
//! an internal error), `on_success` when every planned interval succeeded, `on_finish` always.
//! Each runs in the project folder with the JSON summary on stdin and `BACKFILL_ID`,
//! `BACKFILL_DAG`, `BACKFILL_STATE` and `BACKFILL_EXIT_CODE` in its environment, in its own
//! process group, killed after its timeout (default 30 s); its output goes to
//! `LOGS/notify/ID.EVENT.log`. A hook that fails is a warning: it never changes the exit code.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::exit;
use crate::process::signal_group;
use crate::project::{CommandSpec, Notify};

/// How long a hook may take unless `timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How a backfill ended, for its hooks.
pub struct Ended<'a> {
    pub backfill_id: i64,
    pub dag_id: &'a str,
    pub state: &'a str,
    pub exit_code: u8,
    /// The JSON summary (as `--output json` prints it), given on stdin.
    pub summary: String,
}

/// The hooks that apply to an end, in the order they run.
fn due(notify: &Notify, exit_code: u8) -> Vec<(&'static str, &CommandSpec)> {
    let mut hooks = Vec::new();
    match exit_code {
        exit::OK => hooks.extend(notify.on_success.as_ref().map(|c| ("on_success", c))),
        exit::FAILED | exit::INTERNAL => {
            hooks.extend(notify.on_failure.as_ref().map(|c| ("on_failure", c)));
        }
        _ => {}
    }
    hooks.extend(notify.on_finish.as_ref().map(|c| ("on_finish", c)));
    hooks
}

/// Runs the hooks that apply; returns a warning for each that failed.
pub fn run(notify: &Notify, root: &Path, logs: &Path, ended: &Ended<'_>) -> Vec<String> {
    let timeout = notify.timeout.unwrap_or(DEFAULT_TIMEOUT);
    due(notify, ended.exit_code)
        .into_iter()
        .filter_map(|(event, spec)| {
            let log = logs
                .join("notify")
                .join(format!("{}.{event}.log", ended.backfill_id));
            tracing::info!(backfill = ended.backfill_id, event, "running a notify hook");
            hook(spec, root, &log, ended, timeout)
                .err()
                .map(|why| format!("notify hook `{event}` {why} (log: {})", log.display()))
        })
        .collect()
}

fn hook(
    spec: &CommandSpec,
    root: &Path,
    log: &Path,
    ended: &Ended<'_>,
    timeout: Duration,
) -> Result<(), String> {
    let out = crate::process::open_log(log).map_err(|e| format!("cannot open its log: {e}"))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open its log: {e}"))?;
    let mut command = match spec {
        CommandSpec::Argv(argv) => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        CommandSpec::Shell(line) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(line);
            c
        }
    };
    let mut child = command
        .current_dir(root)
        .env("BACKFILL_ID", ended.backfill_id.to_string())
        .env("BACKFILL_DAG", ended.dag_id)
        .env("BACKFILL_STATE", ended.state)
        .env("BACKFILL_EXIT_CODE", ended.exit_code.to_string())
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its stdin is fine.
        let _ = stdin.write_all(ended.summary.as_bytes());
        let _ = stdin.write_all(b"\n");
    }
    let pgid = i64::from(child.id());
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                signal_group(pgid, Signal::SIGKILL);
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("failed: {}", crate::process::describe_exit(status)))
                };
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                signal_group(pgid, Signal::SIGKILL);
                let _ = child.wait();
                return Err(format!(
                    "timed out after {} and was killed",
                    humantime::format_duration(timeout)
                ));
            }
            Err(e) => return Err(format!("cannot be waited for: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_follow_the_exit_code() {
        let shell = |s: &str| Some(CommandSpec::Shell(s.into()));
        let n = Notify {
            on_failure: shell("f"),
            on_success: shell("s"),
            on_finish: shell("x"),
            timeout: None,
        };
        let names = |code| due(&n, code).into_iter().map(|h| h.0).collect::<Vec<_>>();
        assert_eq!(names(exit::OK), ["on_success", "on_finish"]);
        assert_eq!(names(exit::FAILED), ["on_failure", "on_finish"]);
        assert_eq!(names(exit::INTERNAL), ["on_failure", "on_finish"]);
        assert_eq!(names(exit::INTERRUPTED), ["on_finish"]);
    }
}
