//! Processes: every try runs in its own process group, started behind a gate so that its group
//! is in the manifest before it can do any work; stopping is SIGTERM to the group, a grace
//! period, then SIGKILL; liveness of pids and groups; killing what a dead owner left running.
//!
//! The gate: between `fork` and `exec`, the child puts itself in a new process group, writes
//! its pid on one pipe and waits for a byte on another. The owner records the group in the
//! manifest and only then writes that byte; the child then `exec`s the command. If the owner
//! dies first, the pipe closes, the read ends with nothing and the child exits without ever
//! running the command. So a try whose group is not recorded has never run, and one that is
//! recorded can be killed by whoever takes over. There is no extra process and no shell in
//! between: an array command is `exec`ed directly, a string by `sh -c`.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

mod spawn;
pub use spawn::Child;

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

pub use crate::liveness::Group;

/// This host's processes, as the manifest's lease judgements see them.
#[derive(Debug)]
pub struct Local;

/// The one [`Local`], handed to lease contexts.
pub static LOCAL: Local = Local;

impl crate::liveness::Host for Local {
    fn name(&self) -> String {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".to_string())
    }

    fn pid_alive(&self, pid: i64) -> bool {
        pid_alive(pid)
    }

    fn group_alive(&self, group: Group) -> bool {
        group_alive(group)
    }
}

/// A try's process, forked and waiting at its gate. Dropped without [`Gated::release`] or
/// [`Gated::discard`] (its task was cancelled), it kills the process: closing the gate alone is
/// not enough, as other children waiting at their gates may hold copies of its end, and the
/// thread that cloned it waits until it is gone.
pub struct Gated {
    pub group: Group,
    gate: Option<tokio::net::UnixStream>,
    /// The spawn, which returns once the child has `exec`ed (or failed to).
    spawn: Option<tokio::task::JoinHandle<std::io::Result<Child>>>,
    log: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        if self.gate.take().is_some() {
            signal_group(self.group.pgid, Signal::SIGKILL);
            if let Some(log) = self.log.take() {
                log.abort();
            }
        }
    }
}

/// A released try, running its command.
pub struct Spawned {
    child: Child,
    pub group: Group,
    /// Copies the try's output into its log file.
    log: tokio::task::JoinHandle<()>,
}

/// Forks `program` in its own process group, stopped at its gate before `exec`. Its stdout and
/// stderr share one pipe, copied into `log_path` (created, without following symlinks and
/// readable by its owner only, when the first byte arrives: a try that prints nothing costs no
/// file). Must be called inside the async runtime; [`Gated::release`] lets it run and
/// [`Gated::discard`] makes it exit without running anything.
pub async fn spawn(
    program: &Program,
    env: &[(String, String)],
    cwd: &Path,
    log_path: &Path,
) -> std::io::Result<Gated> {
    use std::ffi::OsStr;
    let argv: Vec<&OsStr> = match program {
        Program::Argv(argv) => argv.iter().map(OsStr::new).collect(),
        Program::Shell(line) => vec![OsStr::new("sh"), OsStr::new("-c"), OsStr::new(line)],
    };
    let prepared = spawn::Prepared::new(&argv, env, cwd)?;
    // One socket pair is the gate: the child writes its pid on its end and waits there for the
    // owner's byte.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let (reader, writer) = std::io::pipe()?;
    let wiring = spawn::Wiring {
        stdin: spawn::dev_null()?,
        out: OwnedFd::from(writer),
        gate: OwnedFd::from(theirs),
    };
    // The clone blocks its thread until the child passes the gate and execs; the child's ends
    // are closed in this process once it has.
    let spawn = tokio::task::spawn_blocking(move || spawn::clone_gated(&prepared, wiring));
    ours.set_nonblocking(true)?;
    let mut gate = tokio::net::UnixStream::from_std(ours)?;
    let pid = {
        use tokio::io::AsyncReadExt;
        let mut pid = [0u8; 4];
        gate.read_exact(&mut pid)
            .await
            .ok()
            .map(|_| i32::from_le_bytes(pid))
    };
    let Some(pid) = pid else {
        // No pid: the start failed before the gate; its error says why.
        return match spawn.await.map_err(std::io::Error::other)? {
            Ok(mut child) => {
                let _ = child.wait().await;
                Err(std::io::Error::other("the try ended before its gate"))
            }
            Err(e) => Err(e),
        };
    };
    let pid = i64::from(pid);
    let group = Group {
        pgid: pid,
        leader_start: start_time(pid),
    };
    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let log = tokio::spawn(copy_to_log(reader, log_path.to_path_buf()));
    Ok(Gated {
        group,
        gate: Some(gate),
        spawn: Some(spawn),
        log: Some(log),
    })
}

/// The exit code of a gated try whose owner went away before letting it start.
pub const GATE_CLOSED: i32 = 125;

impl Gated {
    /// Opens the gate: the try `exec`s its command. `Err` when it could not start (a program
    /// that cannot be executed).
    pub async fn release(mut self) -> std::io::Result<Spawned> {
        let (spawn, log) = (self.spawn.take(), self.log.take());
        let (Some(spawn), Some(log)) = (spawn, log) else {
            return Err(std::io::Error::other("the try was already let go"));
        };
        if let Some(mut gate) = self.gate.take() {
            use tokio::io::AsyncWriteExt;
            // A try killed meanwhile shows as such once it is waited for.
            let _ = gate.write_all(b"g").await;
        }
        let child = spawn.await.map_err(std::io::Error::other)??;
        Ok(Spawned {
            child,
            group: self.group,
            log,
        })
    }

    /// Closes the gate without letting the try run: it is killed before it runs anything.
    pub async fn discard(mut self) {
        self.gate = None;
        signal_group(self.group.pgid, Signal::SIGKILL);
        if let Some(spawn) = self.spawn.take()
            && let Ok(Ok(mut child)) = spawn.await
        {
            let _ = child.wait().await;
        }
        if let Some(log) = self.log.take() {
            log.abort();
        }
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
    // Read for every try: one read into a buffer on the stack, no allocation per field. The
    // line is far shorter than the buffer (52 numbers after the command name).
    use std::io::Read;
    let mut buf = [0u8; 1024];
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(_) => return None,
        }
    }
    let line = std::str::from_utf8(&buf[..len]).ok()?;
    let (_, rest) = line.rsplit_once(')')?;
    // Field 22 of the whole line is the 20th after the command name.
    rest.split_whitespace().nth(19)?.parse().ok()
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

    #[test]
    fn gated_tries_dropped_without_release_are_killed() {
        // Two tries gated at once hold copies of each other's gate: closing a gate alone would
        // leave both waiting for ever, and the runtime waiting for the threads that cloned them.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pids = rt.block_on(async {
            let program = Program::Argv(vec!["true".into()]);
            let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
            let (a, b) = tokio::join!(
                spawn(&program, &[], dir.path(), &log_a),
                spawn(&program, &[], dir.path(), &log_b),
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            let pids = [a.group.pgid, b.group.pgid];
            assert!(
                pids.iter().all(|&p| pid_alive(p)),
                "both wait at their gates"
            );
            drop((a, b));
            pids
        });
        rt.shutdown_timeout(std::time::Duration::from_secs(5));
        // Killed when dropped; on a loaded machine the kernel may take a moment to finish them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for pid in pids {
            while pid_alive(pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(!pid_alive(pid), "gated process {pid} outlived its try");
        }
    }
    use super::*;

    #[test]
    fn start_time_tells_a_process_from_a_reused_pid() {
        let me = i64::from(std::process::id());
        let t = start_time(me).unwrap();
        let fields = stat_fields(me).unwrap();
        assert_eq!(
            fields[19].parse::<i64>().ok(),
            Some(t),
            "field 22 of /proc/PID/stat"
        );
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
