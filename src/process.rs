//! Processes: every try runs in its own process group, started behind a gate so that its group
//! is in the manifest before it can do any work; stopping is SIGTERM to the group, a grace
//! period, then SIGKILL; liveness of pids and groups; killing what a dead owner left running.
//!
//! The gate: a try is started as `sh` reading one line from a pipe on its stdin before it runs
//! the command (an argument vector is `exec`ed, a shell line follows in the same shell). The
//! owner writes that line only after the group is committed to the manifest. If the owner dies
//! first, the pipe closes, `read` fails and the shell exits without running anything; so a try
//! whose group is not recorded has never run, and one that is recorded can be killed by whoever
//! takes over.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

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

/// What to run: an argument vector (no shell) or a line for `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    Argv(Vec<String>),
    Shell(String),
}

impl Program {
    /// The program's name, for messages.
    pub fn name(&self) -> &str {
        match self {
            Self::Argv(argv) => argv.first().map_or("", String::as_str),
            Self::Shell(_) => "sh",
        }
    }
}

/// The exit code of a gated try whose owner went away before letting it start.
pub const GATE_CLOSED: i32 = 125;

/// The shell that waits at the gate: one line on stdin, then stdin becomes /dev/null.
const GATE: &str = "read -r _ || exit 125; exec </dev/null";

/// A process group as recorded in the manifest: the group id and its leader's start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub pgid: i64,
    /// Clock ticks since boot at which the leader started (`/proc/PID/stat` field 22); `None`
    /// when unknown (a manifest written before it was recorded).
    pub leader_start: Option<i64>,
}

/// A try started behind its gate.
pub struct Spawned {
    child: Child,
    pub group: Group,
    gate: Option<std::io::PipeWriter>,
    /// Copies the try's output into its log file.
    log: tokio::task::JoinHandle<()>,
}

/// Whether `program` can be found (a path that exists, or a name on `PATH`), so that a missing
/// program is reported as such rather than as the gate shell's exit code 127.
fn check_program(program: &str, cwd: &Path, env: &[(String, String)]) -> std::io::Result<()> {
    let found = if program.contains('/') {
        cwd.join(program).exists()
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_default();
        std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
    };
    if found {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such program (not a file, and not found on PATH)",
        ))
    }
}

/// Starts `program` in its own process group, waiting at its gate. Its stdout and stderr share
/// one pipe, copied into `log_path` (created, without following symlinks and readable by its
/// owner only, when the first byte arrives: a try that prints nothing costs no file). Must be
/// called inside the async runtime; [`Spawned::release`] lets it run.
pub fn spawn(
    program: &Program,
    env: &[(String, String)],
    cwd: &Path,
    log_path: &Path,
) -> std::io::Result<Spawned> {
    let mut command = Command::new("sh");
    match program {
        Program::Argv(argv) => {
            let name = argv
                .first()
                .ok_or_else(|| std::io::Error::other("empty command"))?;
            check_program(name, cwd, env)?;
            command
                .arg("-c")
                .arg(format!("{GATE}; exec \"$@\""))
                .arg("sh")
                .args(argv);
        }
        Program::Shell(line) => {
            command.arg("-c").arg(format!("{GATE}\n{line}"));
        }
    }
    let (gate_reader, gate_writer) = std::io::pipe()?;
    let (reader, writer) = std::io::pipe()?;
    let child = command
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::from(gate_reader))
        .stdout(Stdio::from(writer.try_clone()?))
        .stderr(Stdio::from(writer))
        .process_group(0)
        .kill_on_drop(false)
        .spawn()?;
    // The command (and with it this process's copies of the pipes' child ends) is gone now, so
    // the output pipe reaches its end once every process of the try has closed it.
    let pid = child.id().map(i64::from).unwrap_or(0);
    let group = Group {
        pgid: pid,
        leader_start: start_time(pid),
    };
    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let log = tokio::spawn(copy_to_log(reader, log_path.to_path_buf()));
    Ok(Spawned {
        child,
        group,
        gate: Some(gate_writer),
        log,
    })
}

impl Spawned {
    /// Opens the gate: the try starts its work. Fails when the try is already gone.
    pub fn release(&mut self) -> std::io::Result<()> {
        match self.gate.take() {
            Some(mut gate) => gate.write_all(b"go\n"),
            None => Ok(()),
        }
    }

    /// Kills a try that was never released and reaps it.
    pub async fn discard(mut self) {
        self.gate = None;
        signal_group(self.group.pgid, Signal::SIGKILL);
        let _ = self.child.wait().await;
        self.log.abort();
    }
}

/// Creates a folder (and its parents) readable by its owner only.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Opens a log file for appending: created readable by its owner only (logs carry
/// `BACKFILL_CONF` and whatever tasks print), never through a symlink.
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

async fn copy_to_log(mut pipe: tokio::net::unix::pipe::Receiver, path: PathBuf) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut file: Option<std::fs::File> = None;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if file.is_none() {
            file = open_log(&path).ok();
        }
        if let Some(f) = &mut file {
            let _ = f.write_all(&buf[..n]);
        }
    }
}

/// How long a finished try's output may take to drain after its process group is gone: a
/// daemon that left the group may hold the pipe open forever.
const LOG_DRAIN: Duration = Duration::from_secs(2);

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

/// Waits for a released try, enforcing its timeout and reacting to `stop`.
pub async fn supervise(
    mut spawned: Spawned,
    timeout: Option<Duration>,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<Ended> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
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
                signal_group(spawned.group.pgid, Signal::SIGKILL);
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
    let pgid = spawned.group.pgid;
    if *stop.borrow() != Stop::Kill {
        signal_group(pgid, Signal::SIGTERM);
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
    signal_group(pgid, Signal::SIGKILL);
    spawned.child.wait().await?;
    Ok(())
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

/// The fields of `/proc/PID/stat` after the command name: state is the first.
fn stat_fields(pid: i64) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Clock ticks since boot at which a process started.
pub fn start_time(pid: i64) -> Option<i64> {
    // Field 22 of the whole line is the 20th after the command name.
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether a process exists and is not a zombie.
pub fn pid_alive(pid: i64) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    let exists = match kill(Pid::from_raw(raw), None) {
        Ok(()) | Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    };
    // A zombie has exited; only its parent has not reaped it yet.
    exists && stat_fields(pid).is_none_or(|f| f.first().is_none_or(|s| s != "Z"))
}

/// Sends `signal` to every process of a process group. Returns whether any received it.
pub fn signal_group(pgid: i64, signal: Signal) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), signal).is_ok(),
        _ => false,
    }
}

/// Whether the recorded group still has a live member. A group whose number now belongs to a
/// newer process (its leader started at another time) is not the recorded one. Zombies do not
/// count: they have exited and only wait for their parent, which may be a frozen owner.
pub fn group_alive(group: Group) -> bool {
    let pgid = group.pgid;
    let exists = match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), None).is_ok(),
        _ => false,
    };
    if !exists {
        return false;
    }
    if let (Some(recorded), Some(now)) = (group.leader_start, start_time(pgid))
        && recorded != now
    {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.filter_map(Result::ok).any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i64>().ok()) else {
            return false;
        };
        let Some(fields) = stat_fields(pid) else {
            return false;
        };
        // state, ppid, pgrp, ...
        fields.get(2).and_then(|g| g.parse::<i64>().ok()) == Some(pgid)
            && fields.first().is_some_and(|s| s != "Z")
    })
}

/// Kills a group left by a dead owner and waits (up to `wait`) until no member is alive.
/// Returns whether it is proven gone; a group that is not the recorded one (its number was
/// reused) counts as gone and is not touched.
pub fn kill_group(group: Group, wait: Duration) -> bool {
    if !group_alive(group) {
        return true;
    }
    signal_group(group.pgid, Signal::SIGKILL);
    let deadline = std::time::Instant::now() + wait;
    loop {
        if !group_alive(group) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_tells_a_process_from_a_reused_pid() {
        let me = i64::from(std::process::id());
        let t = start_time(me).unwrap();
        assert!(group_alive(Group {
            pgid: i64::from(nix::unistd::getpgrp().as_raw()),
            leader_start: None,
        }));
        assert!(pid_alive(me));
        assert!(t > 0);
        assert!(!pid_alive(i64::from(i32::MAX)));
    }

    #[test]
    fn a_group_with_another_leader_start_is_not_the_recorded_one() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = i64::from(child.id());
        let started = start_time(pid).unwrap();
        let recorded = Group {
            pgid: pid,
            leader_start: Some(started),
        };
        assert!(group_alive(recorded));
        let reused = Group {
            leader_start: Some(started + 1),
            ..recorded
        };
        assert!(!group_alive(reused));
        assert!(kill_group(reused, Duration::from_millis(10)));
        assert!(group_alive(recorded), "a reused number is never killed");
        assert!(kill_group(recorded, Duration::from_secs(5)));
        let _ = child.wait();
    }
}
