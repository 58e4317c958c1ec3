//! Throwaway PostgreSQL clusters for the integration tests.
//!
//! A test binary includes this module with `#[path = "../pg/mod.rs"] mod pg;` (from
//! `tests/cli/main.rs`, or `#[path = "pg/mod.rs"]` from a `tests/*.rs` file), beside
//! `tests/parts` as `crate::parts`, and then:
//!
//! ```ignore
//! #[test]
//! #[cfg_attr(
//!     missing = "postgres",
//!     ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
//! )]
//! fn a_test() {
//!     let url = pg::shared().create_db_url();     // a fresh, empty database on a shared cluster
//!     let own = pg::Cluster::start();              // a cluster of its own, to stop and restart
//! }
//! ```
//!
//! The server binaries come from `PG_BIN`, else from the newest `/usr/lib/postgresql/*/bin`
//! (Debian's `postgresql` package). Without them the test is ignored (`tests/parts`); when it
//! runs all the same (`CI=true`, `--include-ignored`), starting a cluster fails and says why.
//!
//! A cluster lives in a fresh folder under `/tmp`: initdb with trust authentication, no fsync,
//! locale C; the server listens on 127.0.0.1 on a free port and on a unix socket in its data
//! folder, and its log is `server.log` next to the data folder.
//! The server refuses to run as root, so under root every server program runs as `nobody`
//! (through `setpriv`), which owns the cluster's folder.
//!
//! A cluster is stopped when it is dropped. A watchdog process (one `sh` per cluster, waiting for
//! the end of a pipe from this process) stops the server and removes its folder when the test
//! process ends in any other way: killed, or exiting with the shared cluster in a static.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The user the server runs as when the tests run as root.
const SERVER_USER: &str = "nobody";
/// How long a server may take to become ready (or to go away after SIGKILL).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The folder of the server binaries: `PG_BIN` if set, else the newest
/// `/usr/lib/postgresql/*/bin` that has `initdb`, `pg_ctl` and `postgres` (`tests/parts`).
pub fn bin_dir() -> Option<PathBuf> {
    crate::parts::postgres().ok()
}

/// One cluster per test binary, started on first use, for tests that only need a database of
/// their own (`shared().create_db_url()`). Tests that stop or kill the server start their own.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(Cluster::start)
}

/// A running (or stopped, or killed) throwaway PostgreSQL cluster.
pub struct Cluster {
    bin: PathBuf,
    port: u16,
    /// `dir/data` is the data folder, `dir/server.log` the server's log.
    dir: tempfile::TempDir,
    data: PathBuf,
    log: PathBuf,
    /// The postmaster, a child of this process while it runs.
    postmaster: Mutex<Option<Child>>,
    /// `sh` waiting for EOF on its stdin, whose other end only this process holds.
    watchdog: Mutex<Option<Child>>,
}

impl Cluster {
    /// initdb into a fresh folder and start the server on a free port, waiting until it accepts
    /// connections. Panics (with the log) when it cannot.
    pub fn start() -> Cluster {
        Self::start_with(|_| String::new())
    }

    /// [`Cluster::start`] serving TLS with `cert` and `key` (PEM): both copied into the data
    /// folder, the key readable by the server's user only.
    pub fn start_tls(cert: &Path, key: &Path) -> Cluster {
        Self::start_with(|data| {
            for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
                let at = data.join(to);
                std::fs::copy(from, &at).expect("copy the server's certificate");
                if is_root() {
                    run(Command::new("chown")
                        .arg(format!("{SERVER_USER}:"))
                        .arg(&at));
                }
                run(Command::new("chmod").arg("600").arg(&at));
            }
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n".to_string()
        })
    }

    /// [`Cluster::start`], `setup` run on the data folder after initdb; it returns more lines
    /// for postgresql.conf.
    fn start_with(setup: impl FnOnce(&Path) -> String) -> Cluster {
        let bin = crate::parts::Part::Postgres.require();
        // Under /tmp: `nobody` can traverse it, and the socket path stays short (~107 bytes max).
        let dir = tempfile::Builder::new()
            .prefix("backfill-pg-")
            .tempdir_in("/tmp")
            .expect("temp dir for a PostgreSQL cluster");
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");
        if is_root() {
            run(Command::new("chown")
                .arg("-R")
                .arg(format!("{SERVER_USER}:"))
                .arg(dir.path()));
        }
        let watchdog = start_watchdog(&bin, dir.path(), &data);
        run(server_command(&bin, "initdb", dir.path())
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["--locale=C", "-E", "UTF8"]));
        let mut conf = OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        // Fast and not crash-safe, except for a crash of the server alone (`kill9`): with
        // fsync off a commit costs one write(2), and synchronous_commit stays on so that the
        // write happens before the commit returns; off, a SIGKILL loses the last commits, still
        // in the server's WAL buffers.
        write!(
            conf,
            "\n# backfill tests: a throwaway cluster\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             fsync = off\n\
             synchronous_commit = on\n\
             full_page_writes = off\n\
             max_connections = 200\n\
             shared_buffers = 16MB\n",
            data.display()
        )
        .expect("write postgresql.conf");
        let more = setup(&data);
        conf.write_all(more.as_bytes())
            .expect("write postgresql.conf");
        drop(conf);

        let mut cluster = Cluster {
            bin,
            port: 0,
            dir,
            data,
            log,
            postmaster: Mutex::new(None),
            watchdog: Mutex::new(Some(watchdog)),
        };
        // The port is free when picked but may be taken before the server binds it: try another.
        for attempt in 1.. {
            cluster.port = free_port();
            match cluster.spawn_postmaster() {
                Ok(()) => return cluster,
                Err(log) if attempt < 20 => eprintln!(
                    "pg: port {} is taken, trying another: {}",
                    cluster.port,
                    log.trim()
                ),
                Err(log) => panic!("PostgreSQL found no free port after {attempt} tries:\n{log}"),
            }
        }
        unreachable!()
    }

    /// `postgresql://postgres@127.0.0.1:PORT/DB`
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The TCP port on 127.0.0.1 (the same across stops and restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data folder (its unix socket is there too).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log file (stdout and stderr of every start).
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Whether the server was started and has not been stopped or killed since.
    pub fn is_running(&self) -> bool {
        let mut postmaster = lock(&self.postmaster);
        if let Some(child) = postmaster.as_mut()
            && let Ok(Some(_)) = child.try_wait()
        {
            *postmaster = None;
        }
        postmaster.is_some()
    }

    /// Create a fresh, empty database (a name unique per call and process) and return its name.
    pub fn create_db(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        name
    }

    /// Drops database `db` of the shared cluster, its sessions ended first (`WITH (FORCE)`), on a
    /// thread of its own so that the test does not wait. A database costs about 8 MB, and a run
    /// of the suite creates hundreds on the shared cluster: dropped as their tests end, the
    /// cluster stays small instead of growing to gigabytes. A drop that fails (the server
    /// stopping as the process ends) is of no consequence: the cluster's folder goes with it.
    pub fn drop_shared_db(db: String) {
        std::thread::spawn(move || {
            let _ = clean_env(&mut Command::new(shared().psql_program()))
                .args(["-X", "-q", "-c"])
                .arg(format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
                .arg("-d")
                .arg(shared().url("postgres"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        });
    }

    /// Create a fresh, empty database and return its URL.
    pub fn create_db_url(&self) -> String {
        self.url(&self.create_db())
    }

    /// Run `sql` (one or more statements, or psql commands) with `psql -X -q -A -t -v
    /// ON_ERROR_STOP=1` in database `db`; return its stdout without the final newline (rows one
    /// a line, columns separated by `|`). Panics with psql's stderr when it fails.
    /// The cluster's psql, else the one on the PATH.
    fn psql_program(&self) -> PathBuf {
        let psql = self.bin.join("psql");
        if psql.is_file() {
            psql
        } else {
            PathBuf::from("psql")
        }
    }

    /// A psql session in `db` that stays open: statements sent to it run as they arrive, so a
    /// test can hold a transaction (and its locks) while the program under test runs. Ends
    /// (its transaction rolled back) when dropped.
    pub fn session(&self, db: &str) -> Held {
        let program = self.psql_program();
        let child = clean_env(&mut Command::new(program))
            .args(["-X", "-q", "-A", "-t", "-f", "-", "-d"])
            .arg(self.url(db))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run psql");
        Held { child }
    }

    pub fn psql(&self, db: &str, sql: &str) -> String {
        let program = self.psql_program();
        let mut child = clean_env(&mut Command::new(program))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-f",
                "-",
                "-d",
            ])
            .arg(self.url(db))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run psql");
        let mut stdin = child.stdin.take().expect("psql's stdin");
        let input = sql.to_owned();
        let writer = std::thread::spawn(move || {
            // An early error closes psql's stdin; its stderr says why.
            let _ = stdin.write_all(input.as_bytes());
        });
        let output = child.wait_with_output().expect("wait for psql");
        writer.join().expect("psql stdin writer");
        if !output.status.success() {
            panic!(
                "psql in {db} failed ({}):\n{}\n--- sql:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                sql.chars().take(2000).collect::<String>(),
            );
        }
        let mut out = String::from_utf8(output.stdout).expect("psql's output is UTF-8");
        if out.ends_with('\n') {
            out.pop();
        }
        out
    }

    /// Stop the server with a fast shutdown (SIGINT, what `pg_ctl stop -m fast` sends): sessions
    /// are disconnected, then a checkpoint; returns once the server has exited.
    pub fn stop(&self) {
        self.shut_down("fast");
    }

    /// SIGKILL the postmaster and its processes, like a crash of the machine's database (but the
    /// OS keeps what was written, so nothing committed is lost). `start_again` recovers.
    pub fn kill9(&self) {
        let mut child = lock(&self.postmaster)
            .take()
            .expect("kill9: the server is not running");
        let pid = child.id();
        assert_eq!(
            postmaster_pid(&self.data),
            Some(pid),
            "kill9: postmaster.pid names another process"
        );
        // Freeze it first so that it forks no process that the SIGKILLs would miss.
        signal("STOP", &[pid]);
        let children = children_of(pid);
        child.kill().expect("SIGKILL the postmaster");
        child.wait().expect("reap the postmaster");
        signal("KILL", &children);
        // Until they are gone the old shared memory is in use and a new server would not start.
        let deadline = Instant::now() + TIMEOUT;
        while children.iter().any(|&pid| !is_gone(pid)) {
            assert!(
                Instant::now() < deadline,
                "kill9: processes outlive SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Start the server again after `stop` or `kill9`, on the same port (crash recovery after a
    /// `kill9`), waiting until it accepts connections.
    pub fn start_again(&self) {
        assert!(!self.is_running(), "start_again: the server is running");
        if let Err(log) = self.spawn_postmaster() {
            panic!(
                "PostgreSQL could not start again on port {}:\n{log}",
                self.port
            );
        }
    }

    /// Freeze the server (SIGSTOP to the postmaster and its processes): it stops answering
    /// without closing a connection, as a host cut off by the network. `thaw` resumes it.
    pub fn freeze(&self) {
        let pid = postmaster_pid(&self.data).expect("freeze: no postmaster.pid");
        signal("STOP", &[pid]);
        signal("STOP", &children_of(pid));
    }

    pub fn thaw(&self) {
        let pid = postmaster_pid(&self.data).expect("thaw: no postmaster.pid");
        signal("CONT", &children_of(pid));
        signal("CONT", &[pid]);
    }

    /// `stop` then `start_again`.
    pub fn restart(&self) {
        self.stop();
        self.start_again();
    }

    /// Start the postmaster and wait until it is ready. `Err(log)` when its port is taken;
    /// panics on any other failure.
    fn spawn_postmaster(&self) -> Result<(), String> {
        let mut postmaster = lock(&self.postmaster);
        assert!(postmaster.is_none(), "the server is running");
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the server log");
        let log_start = log.seek(SeekFrom::End(0)).expect("server log size");
        let mut child = server_command(&self.bin, "postgres", self.dir.path())
            .arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("server log"))
            .stderr(log)
            // Like pg_ctl: not in the test's process group (nor its terminal's signals).
            .process_group(0)
            .spawn()
            .expect("start postgres");
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("postgres status") {
                let log = read_from(&self.log, log_start);
                if log.contains("could not bind") || log.contains("Address already in use") {
                    return Err(log);
                }
                panic!("PostgreSQL exited ({status}) while starting:\n{log}");
            }
            if postmaster_ready(&self.data, child.id()) {
                *postmaster = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "PostgreSQL not ready after {TIMEOUT:?}:\n{}",
                    read_from(&self.log, log_start)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Shut the server down in `mode` (smart, fast or immediate) and reap it; nothing when it is
    /// not running.
    fn shut_down(&self, mode: &str) {
        let Some(mut child) = lock(&self.postmaster).take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let signal_name = match mode {
            "smart" => "TERM",
            "fast" => "INT",
            _ => "QUIT",
        };
        // What `pg_ctl stop -m MODE` sends; waiting on the child also reaps it.
        signal(signal_name, &[child.id()]);
        child.wait().expect("wait for postgres to stop");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut watchdog) = lock(&self.watchdog).take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        self.shut_down("immediate");
    }
}

/// `sh` running as the server's user that waits for the end of its stdin (a pipe only this
/// process holds, closed by the kernel however the process ends), then stops the server with
/// `pg_ctl stop -m immediate` and removes the cluster's folder.
fn start_watchdog(bin: &Path, dir: &Path, data: &Path) -> Child {
    server_command(Path::new(""), "sh", Path::new("/"))
        .arg("-c")
        .arg(r#"cat >/dev/null; "$0" stop -D "$1" -m immediate -w; rm -rf "$2""#)
        .arg(bin.join("pg_ctl"))
        .arg(data)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start the PostgreSQL watchdog")
}

/// `program` (from `bin`, or from PATH when `bin` is empty) as the server's user, in `cwd`.
fn server_command(bin: &Path, program: &str, cwd: &Path) -> Command {
    let program = bin.join(program);
    let mut command = if is_root() {
        // setpriv execs the program: the child's pid is the program's.
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={SERVER_USER}"))
            .arg(format!("--regid={}", server_gid()))
            .arg("--clear-groups")
            .arg("--")
            .arg(program);
        command
    } else {
        Command::new(program)
    };
    clean_env(&mut command).current_dir(cwd);
    command
}

/// Without the PG* variables of the environment (PGDATA, PGPORT, PGOPTIONS, ...).
fn clean_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("PG")) {
            command.env_remove(name);
        }
    }
    command.env("LC_ALL", "C")
}

fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| id(&["-u"]) == "0")
}

fn server_gid() -> &'static str {
    static GID: OnceLock<String> = OnceLock::new();
    GID.get_or_init(|| id(&["-g", SERVER_USER]))
}

fn id(args: &[&str]) -> String {
    let output = Command::new("id").args(args).output().expect("run id");
    assert!(output.status.success(), "id {args:?} failed");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Run a command to completion; panic with its output when it fails.
fn run(command: &mut Command) {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    if !output.status.success() {
        panic!(
            "{command:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free TCP port")
        .port()
}

/// The postmaster's pid, from the first line of `postmaster.pid`.
fn postmaster_pid(data: &Path) -> Option<u32> {
    let text = fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// What `pg_ctl start -w` waits for: `postmaster.pid` of this postmaster, status "ready".
fn postmaster_ready(data: &Path, pid: u32) -> bool {
    let Ok(text) = fs::read_to_string(data.join("postmaster.pid")) else {
        return false;
    };
    let lines: Vec<&str> = text.lines().collect();
    lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
        && lines.get(7).map(|l| l.trim()) == Some("ready")
}

/// `kill -SIGNAL pids...`
fn signal(name: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    // Errors are for processes already gone.
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -{name} \"$@\" 2>/dev/null"))
        .arg("sh")
        .args(pids.iter().map(u32::to_string))
        .status();
}

/// `(state, ppid)` from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = text[text.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Gone, or a zombie nobody reaps yet (a container's init may never do it).
fn is_gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|(state, _)| matches!(state, 'Z' | 'X' | 'x'))
}

fn children_of(parent: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.seek(SeekFrom::Start(offset));
        let _ = file.read_to_string(&mut text);
    }
    text
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A psql session that stays open (see [`Cluster::session`]).
pub struct Held {
    child: Child,
}

impl Held {
    /// Sends `sql` (whole statements); it runs as soon as psql reads it, after what was sent
    /// before.
    pub fn send(&mut self, sql: &str) {
        let stdin = self.child.stdin.as_mut().expect("psql's stdin");
        stdin.write_all(sql.as_bytes()).expect("write to psql");
        stdin.write_all(b"\n").expect("write to psql");
        stdin.flush().expect("flush psql's stdin");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
