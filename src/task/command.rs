//! Command tasks: one try is one process in its own process group, with its stdout and stderr in
//! a log file. Timeout and cancellation send SIGTERM to the whole group, then SIGKILL after the
//! grace period (at once on a hard stop). When the main process exits, anything it left running
//! in its group is killed, so a finished try leaves no process behind.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Deserialize;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::manifest::lease::signal_group;
use crate::project::CommandSpec;
use crate::task::template::{self, Context};

/// How far a backfill is from stopping. Sent to every running try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stop {
    /// Keep running.
    Run,
    /// Stop dispatching; SIGTERM running tries, SIGKILL after their grace period.
    Graceful,
    /// SIGKILL running tries now.
    Kill,
}

/// Renders a command into the argument vector to execute.
pub fn render(spec: &CommandSpec, ctx: &Context<'_>) -> Result<Vec<String>, String> {
    match spec {
        CommandSpec::Argv(args) => args.iter().map(|a| template::render(a, ctx)).collect(),
        CommandSpec::Shell(line) => Ok(vec![
            "sh".to_string(),
            "-c".to_string(),
            template::render(line, ctx)?,
        ]),
    }
}

/// A started try.
pub struct Spawned {
    child: Child,
    pub pgid: i64,
    /// Copies the try's output into its log file.
    log: tokio::task::JoinHandle<()>,
}

/// How long a finished try's output may take to drain after its process group is gone: a
/// daemon that left the group may hold the pipe open forever.
const LOG_DRAIN: Duration = Duration::from_secs(2);

/// Starts `argv` in its own process group. Its stdout and stderr share one pipe, copied into
/// `log_path`, which is created (with its folder) when the first byte arrives: a try that prints
/// nothing costs no file. Must be called inside the async runtime.
pub fn spawn(
    argv: &[String],
    env: &[(String, String)],
    cwd: &Path,
    log_path: &Path,
) -> std::io::Result<Spawned> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let (reader, writer) = std::io::pipe()?;
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer.try_clone()?))
        .stderr(Stdio::from(writer))
        .process_group(0)
        .kill_on_drop(false)
        .spawn()?;
    // The command (and with it this process's copies of the pipe's write end) is gone now, so
    // the pipe reaches its end once every process of the try has closed it.
    let pgid = child.id().map(i64::from).unwrap_or(0);
    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let log = tokio::spawn(copy_to_log(reader, log_path.to_path_buf()));
    Ok(Spawned { child, pgid, log })
}

async fn copy_to_log(mut pipe: tokio::net::unix::pipe::Receiver, path: PathBuf) {
    use std::io::Write;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut file: Option<std::fs::File> = None;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if file.is_none() {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .ok();
        }
        if let Some(f) = &mut file {
            let _ = f.write_all(&buf[..n]);
        }
    }
}

/// Waits until the try's output is in its log (or gives up after [`LOG_DRAIN`]).
async fn drain_log(spawned: &mut Spawned) {
    if tokio::time::timeout(LOG_DRAIN, &mut spawned.log)
        .await
        .is_err()
    {
        spawned.log.abort();
    }
}

/// How a try ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// Waits for a try, enforcing its timeout and reacting to `stop`.
pub async fn supervise(
    mut spawned: Spawned,
    timeout: Option<Duration>,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<Ended> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut stop_open = true;
    loop {
        if *stop.borrow() != Stop::Run {
            terminate(&mut spawned, grace, stop).await?;
            drain_log(&mut spawned).await;
            return Ok(Ended::Cancelled);
        }
        tokio::select! {
            status = spawned.child.wait() => {
                // Leftovers of the group (background grandchildren) go with the try.
                signal_group(spawned.pgid, Signal::SIGKILL);
                drain_log(&mut spawned).await;
                return Ok(Ended::Exited(status?));
            }
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                terminate(&mut spawned, grace, stop).await?;
                drain_log(&mut spawned).await;
                return Ok(Ended::TimedOut);
            }
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    stop_open = false;
                }
            }
        }
    }
}

/// SIGTERM to the group, SIGKILL after `grace` (or at once on [`Stop::Kill`]), then reap.
async fn terminate(
    spawned: &mut Spawned,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<()> {
    if *stop.borrow() != Stop::Kill {
        signal_group(spawned.pgid, Signal::SIGTERM);
        let deadline = sleep(grace);
        tokio::pin!(deadline);
        let mut stop_open = true;
        loop {
            tokio::select! {
                status = spawned.child.wait() => { status?; break; }
                () = &mut deadline => break,
                changed = stop.changed(), if stop_open => {
                    if changed.is_err() {
                        stop_open = false;
                    } else if *stop.borrow() == Stop::Kill {
                        break;
                    }
                }
            }
        }
    }
    signal_group(spawned.pgid, Signal::SIGKILL);
    spawned.child.wait().await?;
    Ok(())
}

/// What a task may report in the file named by `BACKFILL_RESULT`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskResult {
    pub rows: Option<i64>,
    pub partitions: Option<Vec<serde_json::Value>>,
    pub inputs: Option<Vec<serde_json::Value>>,
    pub fingerprint: Option<String>,
}

/// Reads the result JSON if the task wrote one.
pub fn read_result(path: &Path) -> Result<Option<TaskResult>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "the result file {} is not valid: {e}; expected {{\"rows\": N, \"partitions\": [...], \"inputs\": [...], \"fingerprint\": \"...\"}}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the result file {}: {e}", path.display())),
    }
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(16 * 1024);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Describes how a process exited, for the manifest.
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => "ended abnormally".to_string(),
    }
}

/// Where a try's log and result file live: `LOGS/DAG/TASK/INTERVAL.runR.tryN.log`. Run ids are
/// never reused, so the result file of a new try cannot exist yet.
pub fn try_paths(
    logs_dir: &Path,
    dag_id: &str,
    interval_start: chrono::DateTime<chrono::Utc>,
    task_id: &str,
    run_id: i64,
    try_number: u32,
) -> (PathBuf, PathBuf) {
    // One folder per task, created once: a folder per interval would cost two inodes a try.
    let dir = logs_dir.join(dag_id).join(task_id);
    let stem = format!(
        "{}.run{run_id}.try{try_number}",
        interval_start.format("%Y%m%dT%H%M%SZ")
    );
    (
        dir.join(format!("{stem}.log")),
        dir.join(format!("{stem}.result.json")),
    )
}

/// The `BACKFILL_*` environment of a try.
pub fn environment(ctx: &Context<'_>, conf: &str, result_path: &Path) -> Vec<(String, String)> {
    vec![
        ("BACKFILL_DAG_ID".into(), ctx.dag_id.into()),
        ("BACKFILL_TASK_ID".into(), ctx.task_id.into()),
        ("BACKFILL_RUN_ID".into(), ctx.run_id.into()),
        ("BACKFILL_TRY_NUMBER".into(), ctx.try_number.to_string()),
        (
            "BACKFILL_DATA_INTERVAL_START".into(),
            ctx.data_interval_start.into(),
        ),
        (
            "BACKFILL_DATA_INTERVAL_END".into(),
            ctx.data_interval_end.into(),
        ),
        ("BACKFILL_DS".into(), ctx.ds.into()),
        ("BACKFILL_DS_NODASH".into(), ctx.ds_nodash.into()),
        ("BACKFILL_CONF".into(), conf.into()),
        ("BACKFILL_RESULT".into(), result_path.display().to_string()),
    ]
}
