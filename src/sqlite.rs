//! What the SQLite manifest and the SQLite warehouse share: opening a database that this user
//! may read but not write.
//!
//! A WAL database is read through its `-shm` file, which SQLite creates next to it. When the
//! folder is not writable and no writer has the database open (so neither `-wal` nor `-shm`
//! exists), a plain read-only open fails with "attempt to write a readonly database". The
//! database file is then complete on its own (a writer checkpoints when it closes), and it is
//! opened `immutable`: SQLite reads it without the shared memory and without locks.

use std::path::Path;

use nix::libc;
use rusqlite::{Connection, OpenFlags};

/// Opens `path` for reading only. Never creates or writes anything, next to it either.
pub(crate) fn open_read_only(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    // The open itself is lazy: the first read is what needs the `-shm` file.
    match conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())) {
        Ok(()) => Ok(conn),
        Err(e) if needs_immutable(&e, path) => {
            drop(conn);
            Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
        }
        Err(e) => Err(e),
    }
}

/// A read that failed for want of a `-shm` file this user may create, with no writer active.
fn needs_immutable(e: &rusqlite::Error, path: &Path) -> bool {
    let readonly = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    );
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    readonly && !Path::new(&wal).exists()
}

/// `file:PATH?immutable=1`, with the characters a URI gives a meaning escaped.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Whether this user may write the file at `path`, as the system says (`access(2)`): no
/// descriptor is opened, so none is closed under SQLite's locks (closing any descriptor of a
/// file lets go of every POSIX lock the process holds on it).
pub(crate) fn writable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a NUL-terminated path that lives across the call, which only reads it.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The byte of a WAL database's `-shm` file that its writer locks (SQLite's `WAL_WRITE_LOCK`,
/// the first of the locks at offset 120).
const WAL_WRITE_LOCK_BYTE: libc::off_t = 120;

/// Who holds the write lock of a WAL database, as far as this host can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// No other process holds it.
    Nobody,
    /// Process `pid` (of this PID namespace); `stopped` when it is stopped (SIGSTOP, a debugger).
    Process { pid: i32, stopped: bool },
    /// A process this one cannot name (one of another PID namespace sharing the file), or a
    /// lock that cannot be looked at (no `-shm` file to look into).
    Unseen,
}

/// The bytes of a database file that a writer in rollback-journal mode locks (SQLite's
/// `PENDING_BYTE` and `RESERVED_BYTE`, which follows it).
const PENDING_BYTE: libc::off_t = 0x4000_0000;

/// Who holds the write lock of the database at `path`, as the operating system's record of the
/// lock says: the WAL write lock in its `-shm` file, else (a database in rollback-journal mode)
/// the reserved and pending bytes of the file itself.
pub(crate) fn lock_holder(path: &Path) -> Holder {
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    let wal = std::fs::File::open(shm).map(|f| holder_of(&f, WAL_WRITE_LOCK_BYTE, 1));
    match wal {
        Ok(Holder::Nobody) | Err(_) => {
            std::fs::File::open(path).map_or(Holder::Unseen, |f| holder_of(&f, PENDING_BYTE, 2))
        }
        Ok(holder) => holder,
    }
}

/// Who holds a lock that conflicts with a write lock of `len` bytes at `start` of `file`.
fn holder_of(file: &std::fs::File, start: libc::off_t, len: libc::off_t) -> Holder {
    use std::os::fd::AsRawFd;
    // SAFETY: a flock is plain data, filled by the kernel.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = start;
    lock.l_len = len;
    // SAFETY: F_GETLK on a descriptor of ours only reads the lock table into `lock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) } != 0 {
        return Holder::Unseen;
    }
    if lock.l_type == libc::F_UNLCK as libc::c_short {
        return Holder::Nobody;
    }
    // The kernel says 0 for a process of a PID namespace this one cannot see.
    if lock.l_pid <= 0 {
        return Holder::Unseen;
    }
    Holder::Process {
        pid: lock.l_pid,
        stopped: crate::liveness::is_stopped(i64::from(lock.l_pid)),
    }
}

/// Who holds the write lock of the WAL database at `path`: the process's id and whether it is
/// stopped (SIGSTOP, a debugger). `None` when no other process holds it or it cannot be told.
pub(crate) fn write_lock_holder(path: &Path) -> Option<(i32, bool)> {
    match lock_holder(path) {
        Holder::Process { pid, stopped } => Some((pid, stopped)),
        Holder::Nobody | Holder::Unseen => None,
    }
}

/// What a write that found the database at `path` locked adds to its error: who holds the lock
/// and, when that process is stopped, how to let it go on.
pub(crate) fn locked_by(path: &Path) -> String {
    match write_lock_holder(path) {
        Some((pid, true)) => format!(
            "; its write lock is held by process {pid}, which is stopped: `kill -CONT {pid}` lets it go on (or end it)"
        ),
        Some((pid, false)) => format!("; its write lock is held by process {pid}"),
        None => String::new(),
    }
}

/// A SQLite error in words: SQLite's message, or what its code means where the driver gave
/// only the file's name (an open that failed before SQLite had a connection to say why, out of
/// memory for one), which would otherwise read `manifest X: X`.
pub(crate) fn describe(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(code, Some(message))
            if !message.contains(char::is_whitespace) =>
        {
            let meaning = rusqlite::ffi::code_to_str(code.extended_code);
            // The file's name: whoever reports the error names the file already.
            if message == meaning || message.contains('/') {
                meaning.to_string()
            } else {
                format!("{meaning} ({message})")
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;

    use super::*;

    /// Another process that begins a write on `db` and waits: it and the line it said once it
    /// held the lock.
    fn hold_write_lock(db: &Path) -> (std::process::Child, String) {
        let mut holder = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3, sys, time\n\
                 c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                 c.execute('BEGIN IMMEDIATE')\n\
                 print('held', flush=True)\n\
                 time.sleep(60)",
            ])
            .arg(db)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("no python3 on PATH to hold a SQLite write lock");
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (holder, line)
    }

    #[test]
    fn an_error_that_names_only_its_file_says_what_failed() {
        let nomem = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOMEM),
            Some("/p/.backfill/manifest.db".into()),
        );
        assert_eq!(describe(&nomem), "out of memory");
        let worded = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        );
        assert_eq!(describe(&worded), "database or disk is full");
        let interrupted = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
            Some("interrupted".into()),
        );
        assert_eq!(describe(&interrupted), "interrupted");
    }

    #[test]
    fn uris_escape_what_sqlite_would_read_as_syntax() {
        assert_eq!(
            immutable_uri(Path::new("/a b/m?#%.db")),
            "file:/a%20b/m%3F%23%25.db?immutable=1"
        );
    }

    #[test]
    #[cfg_attr(
        missing = "python3",
        ignore = "no python3 on PATH: sudo apt-get install python3"
    )]
    fn a_write_lock_is_traced_to_the_process_that_holds_it_and_whether_it_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("m.db");
        let c = Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .unwrap();
        assert_eq!(write_lock_holder(&db), None, "nobody writes");
        // Another process begins a write and waits.
        let (mut holder, line) = hold_write_lock(&db);
        assert_eq!(line, "held\n");
        let pid = i32::try_from(holder.id()).unwrap();
        assert_eq!(write_lock_holder(&db), Some((pid, false)));
        assert_eq!(
            locked_by(&db),
            format!("; its write lock is held by process {pid}")
        );
        // Stopped, it is named as such, with how to let it go on.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let stopped = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            write_lock_holder(&db) == Some((pid, true))
        });
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(stopped, "{:?}", write_lock_holder(&db));
        assert_eq!(write_lock_holder(&db), None, "released when it died");
    }

    #[test]
    #[cfg_attr(
        missing = "python3",
        ignore = "no python3 on PATH: sudo apt-get install python3"
    )]
    fn a_writer_in_rollback_journal_mode_is_named_by_its_reserved_lock() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("w.db");
        Connection::open(&db)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert_eq!(lock_holder(&db), Holder::Nobody);
        let (mut holder, line) = hold_write_lock(&db);
        let found = lock_holder(&db);
        let _ = holder.kill();
        let _ = holder.wait();
        assert_eq!(line, "held\n");
        assert_eq!(
            found,
            Holder::Process {
                pid: i32::try_from(holder.id()).unwrap(),
                stopped: false
            }
        );
    }
}
