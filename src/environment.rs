//! Environment faults: a backfill cannot go on because the machine, or a service it needs,
//! failed (a full disk, no file descriptors or memory left, a folder of ours that this user may
//! not write, a warehouse's server out of resources or out of reach), not because a task did.
//! Running the next interval would fail the same way, so the runner stops: no interval starts,
//! the running ones are interrupted (recorded `cancelled`, as after Ctrl-C), and the process
//! exits 1 saying the cause and the fix; `backfill resume` runs them once the cause is gone.
//!
//! A [`Fault`] is told from the error's code (errno, SQLite's result code, PostgreSQL's
//! SQLSTATE), never from its words. The code that met the error knows which file or folder it
//! was writing, and names it: an audit file's full disk is not the warehouse's. A task's own
//! failure (a command's non-zero exit, a query that does not run) is never a fault.
//!
//! Code that finds a fault of its own (a wait it gives up, say) makes one with [`Fault::new`]
//! and returns it as `warehouse::Error::Environment` or `exit::Error::Environment`.

use std::path::Path;

use nix::libc;

/// What stopped a backfill from outside its tasks: the cause, naming the file, folder or server,
/// and what the operator does about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[error("{cause}; {fix}")]
pub struct Fault {
    /// What happened: `audit file /p/.backfill/audit/try-3.db: the disk of /p/.backfill/audit
    /// is full`.
    pub cause: String,
    /// What to do before resuming: `free space on it`.
    pub fix: String,
    /// It may pass by itself in a moment (a warehouse's server that restarts, a dropped
    /// connection): a try with retries left is retried rather than stopping the backfill.
    #[serde(skip)]
    pub transient: bool,
}

impl Fault {
    pub(crate) fn new(cause: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            cause: cause.into(),
            fix: fix.into(),
            transient: false,
        }
    }

    /// The same fault, one that may pass by itself in a moment (see [`Fault::transient`]).
    #[must_use]
    pub(crate) fn passing(mut self) -> Self {
        self.transient = true;
        self
    }

    /// The fault of an I/O error met while opening or writing `path`, a file or folder of ours
    /// described by `what` (`the log /p/x.log`), if the error is one.
    pub(crate) fn of_io(e: &std::io::Error, what: &str, path: &Path) -> Option<Self> {
        Self::of_errno(e.raw_os_error()?, what, path)
    }

    /// [`Fault::of_io`] by the error's number.
    pub(crate) fn of_errno(errno: i32, what: &str, path: &Path) -> Option<Self> {
        let dir = folder_of(path);
        let (reason, fix): (String, &str) = match errno {
            libc::ENOSPC => (format!("the disk of {} is full", dir.display()), FREE_SPACE),
            libc::EDQUOT => (
                format!("this user's disk quota on {} is used up", dir.display()),
                "free space on it, or raise the quota",
            ),
            libc::EMFILE => (descriptors(), DESCRIPTORS_FIX),
            libc::ENFILE => (
                "the system has no file descriptors left".into(),
                "close files that other programs hold open, or raise the system's limit (fs.file-max)",
            ),
            libc::ENOMEM => (OUT_OF_MEMORY.into(), MEMORY_FIX),
            libc::EACCES | libc::EPERM => {
                let denied = if path.exists() { path } else { dir };
                (
                    format!("this user may not write {}", denied.display()),
                    "give this user write access to it, or run backfill as its owner",
                )
            }
            libc::EROFS => (
                format!("{} is on a read-only file system", dir.display()),
                "remount it read-write",
            ),
            libc::EIO => (
                format!("the disk of {} failed (I/O error)", dir.display()),
                "check the disk and its file system (`dmesg`)",
            ),
            _ => return None,
        };
        Some(Self::new(format!("{what}: {reason}"), fix))
    }

    /// The fault of a failure to start a process (`what`: `cannot start `sh``): no file
    /// descriptors, memory or processes left. A program that cannot be executed (missing, not
    /// executable) is the task's failure.
    pub(crate) fn of_spawn(e: &std::io::Error, what: &str) -> Option<Self> {
        let (reason, fix): (String, &str) = match e.raw_os_error()? {
            libc::EMFILE => (descriptors(), DESCRIPTORS_FIX),
            libc::ENFILE => (
                "the system has no file descriptors left".into(),
                "close files that other programs hold open, or raise the system's limit (fs.file-max)",
            ),
            libc::ENOMEM => (OUT_OF_MEMORY.into(), MEMORY_FIX),
            libc::EAGAIN => (
                "this user may start no more processes".into(),
                "raise the limit (`ulimit -u`), or lower --max-active-runs",
            ),
            _ => return None,
        };
        Some(Self::new(format!("{what}: {reason}"), fix))
    }

    /// The fault of a SQLite error met on the database `file` (described by `what`: `audit file
    /// /p/.backfill/audit/try-3.db`), the one being written: a full disk, an I/O error, no
    /// memory, a file that cannot be opened for want of descriptors or permission, a database
    /// this user may not write.
    pub(crate) fn of_sqlite(e: &rusqlite::Error, what: &str, file: &Path) -> Option<Self> {
        Self::of_sqlite_errno(e, what, file, None)
    }

    /// [`Fault::of_sqlite`] with the error number of the system call that failed, read right
    /// after SQLite failed to open a file ([`last_errno`]): SQLite does not keep it.
    pub(crate) fn of_sqlite_errno(
        e: &rusqlite::Error,
        what: &str,
        file: &Path,
        errno: Option<i32>,
    ) -> Option<Self> {
        use rusqlite::ErrorCode as C;
        let code = e.sqlite_error_code()?;
        let words = crate::sqlite::describe(e);
        match code {
            C::DiskFull => Self::of_errno(libc::ENOSPC, what, file),
            C::OutOfMemory => Some(Self::new(format!("{what}: {OUT_OF_MEMORY}"), MEMORY_FIX)),
            C::SystemIoFailure => {
                let extended = e.sqlite_error().map_or(0, |s| s.extended_code);
                if extended == rusqlite::ffi::SQLITE_IOERR_NOMEM {
                    return Some(Self::new(format!("{what}: {OUT_OF_MEMORY}"), MEMORY_FIX));
                }
                Some(Self::new(
                    format!(
                        "{what}: the disk of {} failed ({words})",
                        folder_of(file).display()
                    ),
                    "check the disk and its file system (`dmesg`)",
                ))
            }
            C::ReadOnly
                if e.sqlite_error().map(|s| s.extended_code)
                    == Some(rusqlite::ffi::SQLITE_READONLY_DBMOVED) =>
            {
                Some(Self::new(
                    format!("{what}: the file was moved or removed while it was open"),
                    "put it back where the project says it is",
                ))
            }
            C::ReadOnly => Some(Self::new(
                format!("{what}: this user may not write it ({words})"),
                "give this user write access to the file and its folder, or run backfill as their owner",
            )),
            C::CannotOpen => match errno.filter(|n| *n != 0) {
                Some(n) => Self::of_errno(n, what, file).or_else(|| cannot_open(what, file)),
                None => cannot_open(what, file),
            },
            _ => None,
        }
    }
}

const FREE_SPACE: &str = "free space on it";
const OUT_OF_MEMORY: &str = "out of memory";
const MEMORY_FIX: &str =
    "free memory (or raise this process's limit, `ulimit -v`), or lower --max-active-runs";
const DESCRIPTORS_FIX: &str = "raise the limit (`ulimit -n`, or LimitNOFILE= for a systemd service), or lower --max-active-runs";

/// What running out of descriptors is, with this process's limit.
fn descriptors() -> String {
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => format!("this process has no file descriptors left (its limit is {soft})"),
        Err(_) => "this process has no file descriptors left".into(),
    }
}

/// The folder a path is in, or the path itself when it is a folder.
fn folder_of(path: &Path) -> &Path {
    if path.is_dir() {
        return path;
    }
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The error number of this thread's last failed system call: read right after SQLite failed to
/// open a file, it says why (see [`Fault::of_sqlite_errno`]).
pub(crate) fn last_errno() -> Option<i32> {
    std::io::Error::last_os_error().raw_os_error()
}

/// Why SQLite could not open `file`, found by opening it (and a file beside it) again: SQLite
/// does not keep the error number. A file that is gone, or a folder that is, is not a fault. One
/// that opens now failed for a shortage that passed: descriptors other tries freed meanwhile,
/// almost always.
fn cannot_open(what: &str, file: &Path) -> Option<Fault> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = if file.exists() {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .map(drop)
    } else {
        Ok(())
    };
    if let Err(e) = opened {
        return Fault::of_io(&e, what, file);
    }
    // SQLite also creates its journal, WAL and shared memory beside the file.
    let beside = folder_of(file).join(format!(".backfill-probe-{}", std::process::id()));
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&beside);
    match created {
        Ok(_) => {
            let _ = std::fs::remove_file(&beside);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Fault::of_io(&e, what, &beside),
    }
    if !file.exists() {
        // Gone (an audit file that whoever finished its publish removed): no shortage.
        return None;
    }
    let limit = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => format!("its limit is {soft}"),
        Err(_) => "see `ulimit -n`".into(),
    };
    Some(Fault::new(
        format!(
            "{what}: could not be opened, though it opens now: this process likely ran out of file descriptors ({limit})"
        ),
        DESCRIPTORS_FIX,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_of_the_machine_are_faults_and_name_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("try-3.db");
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let f = Fault::of_io(&full, "audit file x", &file).unwrap();
        assert_eq!(
            f.cause,
            format!("audit file x: the disk of {} is full", dir.path().display())
        );
        assert_eq!(f.fix, "free space on it");
        for errno in [
            libc::EDQUOT,
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOMEM,
            libc::EACCES,
            libc::EPERM,
            libc::EROFS,
            libc::EIO,
        ] {
            assert!(Fault::of_errno(errno, "x", &file).is_some(), "{errno}");
        }
        // A file that is not there, or a path that is not one, is not the machine's doing.
        for errno in [libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::EINVAL] {
            assert!(Fault::of_errno(errno, "x", &file).is_none(), "{errno}");
        }
        let descriptors = Fault::of_errno(libc::EMFILE, "x", &file).unwrap();
        assert!(
            descriptors
                .cause
                .contains("no file descriptors left (its limit is "),
            "{descriptors}"
        );
    }

    #[test]
    fn a_program_that_cannot_be_executed_is_the_tasks_failure() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert!(Fault::of_spawn(&e(libc::EMFILE), "cannot start `sh`").is_some());
        assert!(Fault::of_spawn(&e(libc::EAGAIN), "cannot start `sh`").is_some());
        assert!(Fault::of_spawn(&e(libc::ENOENT), "cannot start `nope`").is_none());
        assert!(Fault::of_spawn(&e(libc::EACCES), "cannot start `x`").is_none());
    }

    #[test]
    fn sqlite_errors_are_told_by_their_codes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.db");
        let failure = |code: i32, message: Option<&str>| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                message.map(str::to_string),
            )
        };
        let full = Fault::of_sqlite(
            &failure(rusqlite::ffi::SQLITE_FULL, Some("database or disk is full")),
            "warehouse `w`",
            &file,
        )
        .unwrap();
        assert_eq!(
            full.cause,
            format!(
                "warehouse `w`: the disk of {} is full",
                dir.path().display()
            )
        );
        for code in [
            rusqlite::ffi::SQLITE_NOMEM,
            rusqlite::ffi::SQLITE_IOERR_WRITE,
            rusqlite::ffi::SQLITE_IOERR_NOMEM,
            rusqlite::ffi::SQLITE_READONLY,
        ] {
            assert!(
                Fault::of_sqlite(&failure(code, None), "w", &file).is_some(),
                "{code}"
            );
        }
        // The task's own SQL, a constraint, a corrupt file: not the machine's doing.
        for code in [
            rusqlite::ffi::SQLITE_ERROR,
            rusqlite::ffi::SQLITE_CONSTRAINT,
            rusqlite::ffi::SQLITE_CORRUPT,
            rusqlite::ffi::SQLITE_NOTADB,
        ] {
            assert!(
                Fault::of_sqlite(&failure(code, None), "w", &file).is_none(),
                "{code}"
            );
        }
        // A file that cannot be opened because it is gone is not a fault; one that opens on a
        // second look failed for a shortage that passed; the error number says which.
        let cantopen = failure(rusqlite::ffi::SQLITE_CANTOPEN, None);
        assert!(Fault::of_sqlite(&cantopen, "w", &dir.path().join("gone/w.db")).is_none());
        std::fs::write(&file, "").unwrap();
        let passed = Fault::of_sqlite(&cantopen, "w", &file).unwrap();
        assert!(
            passed.cause.contains("likely ran out of file descriptors"),
            "{passed}"
        );
        let emfile = Fault::of_sqlite_errno(&cantopen, "w", &file, Some(libc::EMFILE)).unwrap();
        assert!(
            emfile
                .cause
                .starts_with("w: this process has no file descriptors left"),
            "{emfile}"
        );
        let gone = dir.path().join("gone.db");
        assert!(Fault::of_sqlite_errno(&cantopen, "w", &gone, Some(libc::ENOENT)).is_none());
    }
}
