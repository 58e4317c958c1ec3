//! Processes: the one way this program runs a child process (a try's command, a gate's probe,
//! a notify hook). Every child runs in its own process group, started behind a gate so that a
//! try's group is in the manifest before it can do any work; its stdin is `/dev/null` or a
//! payload written without ever blocking the caller; its output goes to a log file or is
//! captured; stopping (a timeout or a [`Stop`]) is SIGTERM to the group, a grace period, then
//! SIGKILL. Also: liveness of pids and groups; killing what a dead owner left running.
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
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::net::unix::pipe;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

pub(crate) mod folders;
mod spawn;
pub(crate) use spawn::Child;

/// How far a backfill is from stopping. Sent to every running child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stop {
    /// Keep running.
    Run,
    /// Stop dispatching; SIGTERM running children, SIGKILL after their grace period.
    Graceful,
    /// SIGKILL running children now.
    Kill,
}

/// What to run: an argument vector (no shell) or a line for `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Program {
    Argv(Vec<String>),
    Shell(String),
}

impl Program {
    /// The program's name, for messages.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Argv(argv) => argv.first().map_or("", String::as_str),
            Self::Shell(_) => "sh",
        }
    }
}

/// What a child reads on its stdin.
#[derive(Debug, Clone, Default)]
pub(crate) enum Input {
    /// Nothing: `/dev/null`.
    #[default]
    Null,
    /// These bytes, then the end of the file. They are written while the child runs, never
    /// blocking the caller: a child that does not read them is still stopped at its timeout,
    /// and what it left unread is dropped when it ends.
    Bytes(Vec<u8>),
}

/// Where a child's stdout and stderr go.
#[derive(Debug, Clone)]
pub(crate) enum Output {
    /// Both into one log file, appended to; created (without following symlinks and readable
    /// by its owner only) when the first byte arrives: a child that prints nothing costs no file.
    Log(PathBuf),
    /// Each kept in memory, for [`Finished`].
    Capture,
    /// stdout into one file and stderr into another (a log), each appended to and created on
    /// its first byte: for a command whose stdout is its answer (a gate's `source_count`).
    Split { stdout: PathBuf, stderr: PathBuf },
}

/// A child process to start: the program, the variables added to this process's environment,
/// the folder it runs in, its stdin and where its output goes.
#[derive(Debug, Clone)]
pub(crate) struct Command<'a> {
    pub program: &'a Program,
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    pub input: Input,
    pub output: Output,
}

pub(crate) use crate::liveness::Group;

/// This host's processes, as the manifest's lease judgements see them.
#[derive(Debug)]
pub struct Local;

/// The one [`Local`], handed to lease contexts.
pub static LOCAL: Local = Local;

impl crate::liveness::Host for Local {
    /// The host name, and the PID namespace whose process ids this process sees: two
    /// containers may share a host name (`--network host` shares it) while each numbers its
    /// processes on its own, and a pid of one means nothing in the other.
    fn name(&self) -> String {
        static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        NAME.get_or_init(|| {
            let host = nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "localhost".to_string());
            // `pid:[4026531836]`
            let ns = std::fs::read_link("/proc/self/ns/pid").ok().and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                let id = l.strip_prefix("pid:[")?.strip_suffix(']')?.to_string();
                Some(id)
            });
            crate::liveness::identity(&host, ns.as_deref())
        })
        .clone()
    }

    fn pid_alive(&self, pid: i64) -> bool {
        pid_alive(pid)
    }

    fn group_alive(&self, group: Group) -> bool {
        group_alive(group)
    }

    fn start_of(&self, pid: i64) -> Option<i64> {
        // This process's own, asked for by every lease context it makes: read once.
        static OWN: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
        if pid == i64::from(std::process::id()) {
            return *OWN.get_or_init(|| start_time(pid));
        }
        start_time(pid)
    }

    fn stopped(&self, pid: i64) -> bool {
        crate::liveness::is_stopped(pid)
    }
}

/// What a child printed with [`Output::Capture`], filled while it runs.
#[derive(Debug, Default, Clone)]
struct Captured {
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    fn take(&self) -> (Vec<u8>, Vec<u8>) {
        fn take(buffer: &Mutex<Vec<u8>>) -> Vec<u8> {
            buffer
                .lock()
                .map(|mut b| std::mem::take(&mut *b))
                .unwrap_or_default()
        }
        (take(&self.stdout), take(&self.stderr))
    }
}

/// A child process, forked and waiting at its gate. Dropped without [`Gated::release`] or
/// [`Gated::discard`] (its task was cancelled), it kills the process: closing the gate alone is
/// not enough, as a child cloned at the same moment holds a copy of its end until it has closed
/// what it does not need, and the thread that cloned it waits until it is gone.
pub(crate) struct Gated {
    pub group: Group,
    gate: Option<tokio::net::UnixStream>,
    /// The spawn, which returns once the child has `exec`ed (or failed to).
    spawn: Option<JoinHandle<std::io::Result<Child>>>,
    /// Copies the child's output to its log or into memory.
    output: Option<JoinHandle<Option<LogFailure>>>,
    captured: Captured,
    /// Our end of the child's stdin and what to write there once it runs.
    input: Option<(pipe::Sender, Vec<u8>)>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        if self.gate.take().is_some() {
            signal_group(self.group.pgid, Signal::SIGKILL);
            if let Some(output) = self.output.take() {
                output.abort();
            }
        }
    }
}

/// A released child, running its command.
pub(crate) struct Spawned {
    child: Child,
    pub group: Group,
    output: JoinHandle<Option<LogFailure>>,
    captured: Captured,
    /// Writes the child's stdin; abandoned when the child ends or is stopped.
    input: Option<JoinHandle<()>>,
}

/// Forks a try's `program` in its own process group, stopped at its gate before `exec`, with
/// `/dev/null` on its stdin and its output as `output` says.
pub(crate) async fn spawn(
    program: &Program,
    env: &[(String, String)],
    cwd: &Path,
    output: Output,
) -> std::io::Result<Gated> {
    spawn_gated(Command {
        program,
        env,
        cwd,
        input: Input::Null,
        output,
    })
    .await
}

/// Forks `command` in its own process group, stopped at its gate before `exec`. Must be called
/// inside the async runtime; [`Gated::release`] lets it run and [`Gated::discard`] makes it exit
/// without running anything.
pub(crate) async fn spawn_gated(command: Command<'_>) -> std::io::Result<Gated> {
    use std::ffi::OsStr;
    let argv: Vec<&OsStr> = match command.program {
        Program::Argv(argv) => argv.iter().map(OsStr::new).collect(),
        Program::Shell(line) => vec![OsStr::new("sh"), OsStr::new("-c"), OsStr::new(line)],
    };
    let prepared = spawn::Prepared::new(&argv, command.env, command.cwd)?;
    // One socket pair is the gate: the child writes its pid on its end and waits there for the
    // owner's byte.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let (stdin, input) = match command.input {
        Input::Null => (spawn::dev_null()?, None),
        Input::Bytes(bytes) => {
            let (reader, writer) = std::io::pipe()?;
            let sender = pipe::Sender::from_owned_fd(OwnedFd::from(writer))?;
            (OwnedFd::from(reader), Some((sender, bytes)))
        }
    };
    let captured = Captured::default();
    let (out, err, output) = match command.output {
        Output::Log(path) => {
            let (reader, writer) = std::io::pipe()?;
            let writer = OwnedFd::from(writer);
            let reader = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
            (
                writer.try_clone()?,
                writer,
                tokio::spawn(copy_to_log(reader, path)),
            )
        }
        Output::Split { stdout, stderr } => {
            let (out_reader, out_writer) = std::io::pipe()?;
            let (err_reader, err_writer) = std::io::pipe()?;
            let out_reader = pipe::Receiver::from_owned_fd(OwnedFd::from(out_reader))?;
            let err_reader = pipe::Receiver::from_owned_fd(OwnedFd::from(err_reader))?;
            let copy = async move {
                let (out, err) = tokio::join!(
                    copy_to_log(out_reader, stdout),
                    copy_to_log(err_reader, stderr)
                );
                out.or(err)
            };
            (
                OwnedFd::from(out_writer),
                OwnedFd::from(err_writer),
                tokio::spawn(copy),
            )
        }
        Output::Capture => {
            let (out_reader, out_writer) = std::io::pipe()?;
            let (err_reader, err_writer) = std::io::pipe()?;
            let out_reader = pipe::Receiver::from_owned_fd(OwnedFd::from(out_reader))?;
            let err_reader = pipe::Receiver::from_owned_fd(OwnedFd::from(err_reader))?;
            let (stdout, stderr) = (captured.stdout.clone(), captured.stderr.clone());
            let collect = async move {
                tokio::join!(collect(out_reader, stdout), collect(err_reader, stderr));
                None
            };
            (
                OwnedFd::from(out_writer),
                OwnedFd::from(err_writer),
                tokio::spawn(collect),
            )
        }
    };
    let wiring = spawn::Wiring {
        stdin,
        out,
        err,
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
        output.abort();
        // No pid: the start failed before the gate; its error says why.
        return match spawn.await.map_err(std::io::Error::other)? {
            Ok(mut child) => {
                let _ = child.wait().await;
                Err(std::io::Error::other("the child ended before its gate"))
            }
            Err(e) => Err(e),
        };
    };
    let pid = i64::from(pid);
    let group = Group {
        pgid: pid,
        leader_start: start_time(pid),
    };
    Ok(Gated {
        group,
        gate: Some(gate),
        spawn: Some(spawn),
        output: Some(output),
        captured,
        input,
    })
}

/// Starts `command` at once (nothing to record before it runs): [`spawn_gated`], then
/// [`Gated::release`].
pub(crate) async fn start(command: Command<'_>) -> std::io::Result<Spawned> {
    spawn_gated(command).await?.release().await
}

/// The exit code of a gated child whose owner went away before letting it start.
pub(crate) const GATE_CLOSED: i32 = 125;

impl Gated {
    /// Opens the gate: the child `exec`s its command, and its stdin starts being written. `Err`
    /// when it could not start (a program that cannot be executed).
    pub(crate) async fn release(mut self) -> std::io::Result<Spawned> {
        let (spawn, output) = (self.spawn.take(), self.output.take());
        let (Some(spawn), Some(output)) = (spawn, output) else {
            return Err(std::io::Error::other("the child was already let go"));
        };
        if let Some(mut gate) = self.gate.take() {
            use tokio::io::AsyncWriteExt;
            // A child killed meanwhile shows as such once it is waited for.
            let _ = gate.write_all(b"g").await;
        }
        let child = match spawn.await.map_err(std::io::Error::other)? {
            Ok(child) => child,
            Err(e) => {
                output.abort();
                return Err(e);
            }
        };
        let input = self.input.take().map(|(mut pipe, bytes)| {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                // A child that ends or closes its stdin before reading it all is fine.
                let _ = pipe.write_all(&bytes).await;
            })
        });
        Ok(Spawned {
            child,
            group: self.group,
            output,
            captured: std::mem::take(&mut self.captured),
            input,
        })
    }

    /// Closes the gate without letting the child run: it is killed before it runs anything.
    pub(crate) async fn discard(mut self) {
        self.gate = None;
        signal_group(self.group.pgid, Signal::SIGKILL);
        if let Some(spawn) = self.spawn.take()
            && let Ok(Ok(mut child)) = spawn.await
        {
            let _ = child.wait().await;
        }
        if let Some(output) = self.output.take() {
            output.abort();
        }
    }
}

/// Creates a folder (and its parents) readable by its owner only; none below a project folder
/// that is gone (see [`folders`]).
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    folders::make_dir(dir, 0o700)
}

/// Opens a log file for appending: created readable by its owner only (logs carry
/// `BACKFILL_CONF` and whatever tasks print), never through a symlink.
pub(crate) fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
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

/// A log that could not be created or written: the first error, and the file. What the child
/// printed after it is drained and dropped, so that the child never blocks on its output.
#[derive(Debug)]
pub(crate) struct LogFailure {
    pub path: PathBuf,
    pub error: std::io::Error,
}

async fn copy_to_log(mut pipe: pipe::Receiver, path: PathBuf) -> Option<LogFailure> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut file: Option<std::fs::File> = None;
    let mut failure = None;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return failure,
            Ok(n) => n,
        };
        if failure.is_some() {
            continue;
        }
        if file.is_none() {
            match open_log(&path) {
                Ok(f) => file = Some(f),
                Err(error) => {
                    failure = Some(LogFailure {
                        path: path.clone(),
                        error,
                    });
                    continue;
                }
            }
        }
        if let Some(f) = &mut file
            && let Err(error) = f.write_all(&buf[..n])
        {
            failure = Some(LogFailure {
                path: path.clone(),
                error,
            });
        }
    }
}

/// Appends what comes through `pipe` to `into`, as it comes (what arrived is kept even when
/// the end never does).
async fn collect(mut pipe: pipe::Receiver, into: Arc<Mutex<Vec<u8>>>) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Ok(mut into) = into.lock() {
            into.extend_from_slice(&buf[..n]);
        }
    }
}

/// How long a finished child's output may take to drain after its process group is gone: a
/// daemon that left the group may hold the pipe open forever.
const LOG_DRAIN: Duration = Duration::from_secs(2);

/// Waits until the child's output is in its log or memory (or gives up after [`LOG_DRAIN`]):
/// whether its log could not be written.
async fn drain_output(spawned: &mut Spawned) -> Option<LogFailure> {
    match tokio::time::timeout(LOG_DRAIN, &mut spawned.output).await {
        Ok(joined) => joined.ok().flatten(),
        Err(_) => {
            spawned.output.abort();
            None
        }
    }
}

/// How a child ended.
#[derive(Debug)]
pub(crate) enum Ended {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// How a child ended and, with [`Output::Capture`], what it printed (empty otherwise); with a
/// log, whether the log could not be created or written.
#[derive(Debug)]
pub(crate) struct Finished {
    pub ended: Ended,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub log_failure: Option<LogFailure>,
}

/// Waits for a released try, enforcing its timeout and reacting to `stop`.
pub(crate) async fn supervise(
    spawned: Spawned,
    timeout: Option<Duration>,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<Ended> {
    finish(spawned, timeout, grace, stop).await.map(|f| f.ended)
}

/// Waits for a released child to end, enforcing its timeout and reacting to `stop`: either
/// sends SIGTERM to its group and SIGKILL after `grace` (at once on [`Stop::Kill`]). Anything
/// the child left running in its group is killed when it exits; what it did not read of its
/// stdin is dropped.
pub(crate) async fn finish(
    mut spawned: Spawned,
    timeout: Option<Duration>,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<Finished> {
    let ended = wait(&mut spawned, timeout, grace, stop).await;
    if let Some(input) = spawned.input.take() {
        input.abort();
    }
    let log_failure = drain_output(&mut spawned).await;
    let (stdout, stderr) = spawned.captured.take();
    Ok(Finished {
        ended: ended?,
        stdout,
        stderr,
        log_failure,
    })
}

async fn wait(
    spawned: &mut Spawned,
    timeout: Option<Duration>,
    grace: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> std::io::Result<Ended> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut stop_open = true;
    loop {
        if *stop.borrow() != Stop::Run {
            terminate(spawned, grace, stop).await?;
            return Ok(Ended::Cancelled);
        }
        tokio::select! {
            status = spawned.child.wait() => {
                // Leftovers of the group (background grandchildren) go with the child.
                signal_group(spawned.group.pgid, Signal::SIGKILL);
                return Ok(Ended::Exited(status?));
            }
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                terminate(spawned, grace, stop).await?;
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
pub(crate) fn describe_exit(status: ExitStatus) -> String {
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

/// Clock ticks since boot at which a process started.
pub(crate) fn start_time(pid: i64) -> Option<i64> {
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
pub(crate) fn pid_alive(pid: i64) -> bool {
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
    exists && crate::liveness::stat_fields(pid).is_none_or(|f| f.first().is_none_or(|s| s != "Z"))
}

/// Sends `signal` to every process of a process group. Returns whether any received it.
pub(crate) fn signal_group(pgid: i64, signal: Signal) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), signal).is_ok(),
        _ => false,
    }
}

/// Whether the recorded group still has a live member. A group whose number now belongs to a
/// newer process (its leader started at another time) is not the recorded one. Zombies do not
/// count: they have exited and only wait for their parent, which may be a frozen owner.
pub(crate) fn group_alive(group: Group) -> bool {
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
        let Some(fields) = crate::liveness::stat_fields(pid) else {
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
pub(crate) fn kill_group(group: Group, wait: Duration) -> bool {
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

    /// The descriptors a process holds, as `fd -> what it points to`.
    fn descriptors(pid: i64) -> std::collections::BTreeMap<i32, String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let fd = e.file_name().to_string_lossy().parse().unwrap();
                let to = std::fs::read_link(e.path()).unwrap_or_default();
                (fd, to.to_string_lossy().into_owned())
            })
            .collect()
    }

    #[test]
    fn a_child_at_its_gate_holds_nothing_but_its_stdio_and_its_gate() {
        // Two tries gated at once, the second cloned while the first's pipes, the first's gate
        // and a pipe of this process's own are open here: each holds its stdin, stdout, stderr
        // and gate, and nothing of the other's or of this process.
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let (ours, _theirs) = std::io::pipe().unwrap();
        let ours = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&ours)
        ))
        .unwrap()
        .to_string_lossy()
        .into_owned();
        rt.block_on(async {
            let program = Program::Argv(vec!["true".into()]);
            let gated =
                |log: &str| spawn(&program, &[], dir.path(), Output::Log(dir.path().join(log)));
            let a = gated("a.log").await.unwrap();
            let b = gated("b.log").await.unwrap();
            let (held_a, held_b) = (descriptors(a.group.pgid), descriptors(b.group.pgid));
            for held in [&held_a, &held_b] {
                assert_eq!(
                    held.keys().copied().collect::<Vec<_>>()[..3],
                    [0, 1, 2],
                    "{held:?}"
                );
                assert_eq!(held.len(), 4, "stdio and the gate only: {held:?}");
                let gate = held.values().nth(3).unwrap();
                assert!(gate.starts_with("socket:"), "the gate: {held:?}");
                assert!(!held.values().any(|to| *to == ours), "{held:?}");
            }
            assert_ne!(held_a[&1], held_b[&1], "each its own output pipe");
            assert_ne!(
                held_a.values().nth(3),
                held_b.values().nth(3),
                "each its own gate"
            );
            let (_keep, mut stop) = watch::channel(Stop::Run);
            for gated in [a, b] {
                let spawned = gated.release().await.unwrap();
                let f = finish(spawned, None, Duration::from_secs(5), &mut stop)
                    .await
                    .unwrap();
                assert!(matches!(f.ended, Ended::Exited(s) if s.success()), "{f:?}");
            }
        });
    }

    #[test]
    fn gated_tries_dropped_without_release_are_killed() {
        // Dropped at their gates, both are killed, and the threads that cloned them (which
        // wait for the exec) are free: the runtime shuts down.
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
                spawn(&program, &[], dir.path(), Output::Log(log_a.clone())),
                spawn(&program, &[], dir.path(), Output::Log(log_b.clone())),
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

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Runs a shell line to its end with its output captured.
    async fn run(line: &str, input: Input, timeout: Duration) -> Finished {
        let dir = std::env::temp_dir();
        let program = Program::Shell(line.into());
        let spawned = start(Command {
            program: &program,
            env: &[("GREETING".into(), "hello".into())],
            cwd: &dir,
            input,
            output: Output::Capture,
        })
        .await
        .unwrap();
        let (_keep, mut stop) = watch::channel(Stop::Run);
        finish(spawned, Some(timeout), Duration::from_secs(5), &mut stop)
            .await
            .unwrap()
    }

    #[test]
    fn a_payload_larger_than_a_pipe_reaches_a_child_that_reads_it() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let f = runtime().block_on(run(
            "cat; echo \"$GREETING\" >&2",
            Input::Bytes(payload.clone()),
            Duration::from_secs(60),
        ));
        assert!(matches!(f.ended, Ended::Exited(s) if s.success()), "{f:?}");
        assert!(
            f.stdout == payload,
            "stdout is the payload, kept apart from stderr"
        );
        assert_eq!(f.stderr, b"hello\n");
    }

    #[test]
    fn a_child_that_does_not_read_its_payload_gets_sigterm_at_its_timeout() {
        let payload = vec![b'x'; 300_000];
        let f = runtime().block_on(run(
            "trap 'echo TERM; exit 0' TERM; sleep 600 & wait",
            Input::Bytes(payload),
            // Time enough for the shell to set its trap, however loaded the machine.
            Duration::from_secs(2),
        ));
        assert!(matches!(f.ended, Ended::TimedOut), "{f:?}");
        assert_eq!(
            f.stdout, b"TERM\n",
            "SIGTERM first, within the grace period"
        );
    }

    #[test]
    fn a_log_that_cannot_be_written_is_reported_and_the_child_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        // Its folder is a file: the log cannot be created.
        std::fs::write(dir.path().join("logs"), "").unwrap();
        let log = dir.path().join("logs/try.log");
        let program = Program::Shell("seq 1 100000; echo done >&2".into());
        let f = runtime().block_on(async {
            let spawned = start(Command {
                program: &program,
                env: &[],
                cwd: dir.path(),
                input: Input::Null,
                output: Output::Log(log.clone()),
            })
            .await
            .unwrap();
            let (_keep, mut stop) = watch::channel(Stop::Run);
            finish(
                spawned,
                Some(Duration::from_secs(60)),
                Duration::from_secs(5),
                &mut stop,
            )
            .await
            .unwrap()
        });
        assert!(matches!(f.ended, Ended::Exited(s) if s.success()), "{f:?}");
        let failure = f.log_failure.expect("the log's failure is reported");
        assert_eq!(failure.path, log);
        assert!(failure.error.raw_os_error().is_some(), "{failure:?}");
        // A log that can be written reports nothing.
        let fine = runtime().block_on(run("echo hi", Input::Null, Duration::from_secs(60)));
        assert!(fine.log_failure.is_none());
    }

    #[test]
    fn start_time_tells_a_process_from_a_reused_pid() {
        let me = i64::from(std::process::id());
        let t = start_time(me).unwrap();
        let fields = crate::liveness::stat_fields(me).unwrap();
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
