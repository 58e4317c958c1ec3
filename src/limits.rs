//! The files this process may open (`RLIMIT_NOFILE`): raised at start as far as the hard limit
//! lets it, checked against what a run needs before anything is written, and named in the
//! message of an open that failed for want of a descriptor.
//!
//! Most systems start a program with a soft limit of 1024 and a much higher hard one: the soft
//! limit is a default for programs that still use `select(2)`, not a policy. Like most programs
//! that hold many files (Go's runtime does the same for every program), `backfill` raises its
//! soft limit to the hard one at start, and gives its children the soft limit it was started
//! with (see [`inherited`]), so that a task sees the limit its shell gave it.
//!
//! A run holds a few descriptors of its own and a few per interval in flight (see
//! [`needed`]); a limit too low for the run is refused before the manifest is opened
//! ([`room_for_runs`]), rather than failing opens in the middle of it. An open that still
//! fails says why: an `EMFILE` or `ENFILE` error, or SQLite's `unable to open database file`
//! whose cause SQLite's error log gave as one of them ([`watch_sqlite`]), is shown with the
//! limit and how to raise it ([`io`], [`sqlite`]).

use std::fmt;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use nix::libc;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors a run holds whatever its concurrency: stdin, stdout and stderr; the manifest's
/// file, WAL and shared memory, on the writer's and the readers' connections; the async
/// runtime's poll, waker and signal pipe; `/dev/null` for the children's stdin; and room for a
/// hook, a probe or the summary's reads.
const BASE: u64 = 24;
/// Descriptors each interval in flight holds: a command try's log, gate, pidfd and stdin; a SQL
/// try's warehouse connection (its file and WAL), audit file and journal, and log. Measured:
/// the smallest limit at which a backfill of a command DAG (`sleep`) completes is 21, 27, 39,
/// 63 and 112 at 1, 2, 4, 8 and 16 intervals at a time (15 + 6 each); of the shop's SQL DAG
/// over a month, 68 and 116 at 8 and 16 (20 + 6 each), 68 failing once in 13 runs. [`BASE`]
/// keeps four more.
const PER_RUN: u64 = 6;

/// The soft limit this process was started with, before [`raise`]; 0 until then.
static STARTED_WITH: AtomicU64 = AtomicU64::new(0);

/// The hard limit this process was started with; 0 until [`raise`].
static HARD: AtomicU64 = AtomicU64::new(0);

/// The errno of the last file that SQLite could not open, as its error log said; 0 for none.
static SQLITE_OPEN_ERRNO: AtomicI32 = AtomicI32::new(0);

/// Raises the soft open-files limit to the hard one. Called once, first thing in `main`.
pub fn raise() {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    STARTED_WITH.store(soft, Ordering::Relaxed);
    HARD.store(hard, Ordering::Relaxed);
    if soft < hard {
        // Refused only where the hard limit is above what the kernel allows (`fs.nr_open`):
        // the soft limit then stays.
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// The limit to give a child before it `exec`s (soft, hard): the one this process was started
/// with, when [`raise`] changed it.
pub(crate) fn inherited() -> Option<(u64, u64)> {
    let (soft, hard) = (
        STARTED_WITH.load(Ordering::Relaxed),
        HARD.load(Ordering::Relaxed),
    );
    (soft != 0 && soft < hard).then_some((soft, hard))
}

/// This process's open-files limit (the soft one, which [`raise`] set to the hard one).
pub(crate) fn open_files() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(u64::MAX, |(soft, _)| soft)
}

/// The fewest descriptors a run of `max_active_runs` intervals at a time needs.
pub(crate) fn needed(max_active_runs: u32) -> u64 {
    BASE + PER_RUN * u64::from(max_active_runs.max(1))
}

/// A limit to suggest: a round number well above what `needed` asks.
fn suggested(needed: u64) -> u64 {
    (needed * 2).next_power_of_two().max(1024)
}

/// Why a command refused to start, before it wrote anything.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// An open-files limit too low for the run asked for.
    #[error(
        "the open-files limit of this process is {limit} (`ulimit -n`), and a run of {max_active_runs} interval{s} at a time needs at least {needed}: raise it, e.g. `ulimit -n {suggested}` in the shell that starts backfill (or LimitNOFILE= in a systemd unit, --ulimit nofile= for docker){fewer}; nothing was written",
        s = if *max_active_runs == 1 { "" } else { "s" },
        suggested = suggested(*needed),
        fewer = match (fits, lower) {
            (Some(n), Some(flag)) => format!(", or run fewer at a time ({flag} {n} fits)"),
            _ => String::new(),
        }
    )]
    TooFewFiles {
        limit: u64,
        max_active_runs: u32,
        needed: u64,
        /// The most intervals at a time that fit in the limit, if one does.
        fits: Option<u32>,
        /// The option that sets how many run at a time, when the command has one.
        lower: Option<&'static str>,
    },
    /// The async runtime could not be started (see [`claim_signal_pipe`]).
    #[error("cannot start the async runtime: {0}; nothing was written")]
    Runtime(String),
}

/// Whether this process may open what a run of `max_active_runs` intervals at a time needs.
/// `lower`: the command's option that sets it (`--max-active-runs`), named in the message.
pub(crate) fn room_for_runs(
    max_active_runs: u32,
    lower: Option<&'static str>,
) -> Result<(), Refused> {
    let limit = open_files();
    let needed = needed(max_active_runs);
    if limit >= needed {
        return Ok(());
    }
    let fits = (limit.saturating_sub(BASE) / PER_RUN).min(u64::from(max_active_runs));
    Err(Refused::TooFewFiles {
        limit,
        max_active_runs,
        needed,
        fits: (fits >= 1).then(|| u32::try_from(fits).unwrap_or(1)),
        lower,
    })
}

/// Makes the pipe tokio's signal handling needs, while failing is clean. Tokio makes it, once
/// for the whole process, when the first runtime with I/O is built, and panics when it cannot
/// (at the open-files limit): building (and dropping) one here, before a command writes
/// anything, turns that into an error, and no later runtime needs the pipe again.
pub(crate) fn claim_signal_pipe() -> Result<(), Refused> {
    // What building it opens: the poll and a copy of it, its waker, the pipe, and a copy of
    // the pipe's end.
    const OPENS: u64 = 6;
    let emfile =
        || Refused::Runtime(io(&std::io::Error::from_raw_os_error(libc::EMFILE)).to_string());
    match open_now() {
        None => return Err(emfile()),
        Some(n) if n + OPENS > open_files() => return Err(emfile()),
        Some(_) => {}
    }
    let built = crate::crash::catching(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
    });
    match built {
        Ok(Ok(_runtime)) => Ok(()),
        Ok(Err(e)) => Err(Refused::Runtime(io(&e).to_string())),
        Err(panic) => Err(Refused::Runtime(panic)),
    }
}

/// How many descriptors this process holds below its limit (the limit bounds a descriptor's
/// number: one inherited above it takes no room); `None` when it cannot even count them
/// (counting needs one more: a process at its limit cannot).
fn open_now() -> Option<u64> {
    let limit = open_files();
    match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => {
            let below = dir
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
                .filter(|&fd| fd < limit)
                .count() as u64;
            // Less the one that reads the folder.
            Some(below.saturating_sub(1))
        }
        Err(e) if io_shortage(&e) => None,
        // No /proc: nothing to tell.
        Err(_) => Some(0),
    }
}

/// Whether `errno` says that a descriptor could not be had.
fn is_shortage(errno: i32) -> bool {
    errno == libc::EMFILE || errno == libc::ENFILE
}

/// What to say after an error whose cause was `errno` (EMFILE or ENFILE).
fn why(errno: i32) -> String {
    if errno == libc::ENFILE {
        return "the system's table of open files is full (`sysctl fs.file-max`): close other programs' files or raise fs.file-max".into();
    }
    let limit = open_files();
    format!(
        "this process reached its open-files limit of {limit} (`ulimit -n`): raise it, e.g. `ulimit -n {}` in the shell that starts backfill",
        suggested(limit)
    )
}

/// Whether an I/O error says that a descriptor could not be had (EMFILE, ENFILE).
pub(crate) fn io_shortage(e: &std::io::Error) -> bool {
    e.raw_os_error().is_some_and(is_shortage)
}

/// Shows an I/O error, and the open-files limit when it is the cause.
pub(crate) fn io(e: &std::io::Error) -> impl fmt::Display + '_ {
    Shown(e, e.raw_os_error().filter(|&n| is_shortage(n)))
}

fn sqlite_cause(e: &rusqlite::Error) -> Option<i32> {
    if e.sqlite_error_code() != Some(rusqlite::ErrorCode::CannotOpen) {
        return None;
    }
    match SQLITE_OPEN_ERRNO.load(Ordering::Relaxed) {
        0 => at_limit().then_some(libc::EMFILE),
        n => is_shortage(n).then_some(n),
    }
}

/// Shows a SQLite error, and the open-files limit when it is the cause.
pub(crate) fn sqlite(e: &rusqlite::Error) -> String {
    let described = crate::sqlite::describe(e);
    match sqlite_cause(e) {
        Some(errno) => format!("{described} ({})", why(errno)),
        None => described,
    }
}

/// An error, and why when a descriptor could not be had.
struct Shown<'a, E>(&'a E, Option<i32>);

impl<E: fmt::Display> fmt::Display for Shown<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(errno) => write!(f, "{} ({})", self.0, why(errno)),
            None => self.0.fmt(f),
        }
    }
}

/// Whether this process holds (nearly) as many descriptors as it may.
fn at_limit() -> bool {
    open_now().is_none_or(|n| n + 2 >= open_files())
}

/// Listens to SQLite's error log for the errno of each file it could not open. Called first
/// thing in `main`, before any SQLite call (SQLite takes its configuration only then).
pub fn watch_sqlite() {
    // SAFETY: called before any other SQLite call, from the one thread there is; the callback
    // makes no SQLite call and only stores an atomic.
    let _ = unsafe { rusqlite::trace::config_log(Some(sqlite_logged)) };
}

/// SQLite's error log: a file it could not open is logged as
/// `os_unix.c:LINE: (ERRNO) open(PATH) - TEXT` with code SQLITE_CANTOPEN.
fn sqlite_logged(code: std::ffi::c_int, message: &str) {
    if code & 0xff != rusqlite::ffi::SQLITE_CANTOPEN {
        return;
    }
    if let Some(errno) = logged_errno(message) {
        SQLITE_OPEN_ERRNO.store(errno, Ordering::Relaxed);
    }
}

/// The errno of a line of SQLite's log about a failed system call.
fn logged_errno(message: &str) -> Option<i32> {
    let rest = message.strip_prefix("os_unix.c:")?;
    let (_, rest) = rest.split_once(": (")?;
    let (errno, _) = rest.split_once(')')?;
    errno.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errno_is_read_from_sqlites_log_line() {
        assert_eq!(
            logged_errno(
                "os_unix.c:43345: (24) open(/tmp/p/.backfill/manifest.db) - Too many open files"
            ),
            Some(24)
        );
        assert_eq!(
            logged_errno("cannot open file at line 43345 of [abcdef]"),
            None
        );
        assert_eq!(logged_errno("os_unix.c:1: (x) open(/a) - b"), None);
    }

    #[test]
    fn a_run_needs_more_at_more_intervals_at_a_time() {
        assert_eq!(needed(0), needed(1));
        assert!(needed(4) > needed(1));
        assert_eq!(needed(4) - needed(3), PER_RUN);
        assert_eq!(suggested(40), 1024);
        assert_eq!(suggested(1500), 4096);
    }

    #[test]
    fn a_limit_too_low_says_what_fits() {
        let e = Refused::TooFewFiles {
            limit: 30,
            max_active_runs: 4,
            needed: needed(4),
            fits: Some(1),
            lower: Some("--max-active-runs"),
        };
        assert_eq!(
            e.to_string(),
            "the open-files limit of this process is 30 (`ulimit -n`), and a run of 4 intervals at a time needs at least 48: raise it, e.g. `ulimit -n 1024` in the shell that starts backfill (or LimitNOFILE= in a systemd unit, --ulimit nofile= for docker), or run fewer at a time (--max-active-runs 1 fits); nothing was written"
        );
    }

    #[test]
    fn only_a_missing_descriptor_is_explained() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(io_shortage(&emfile));
        assert!(io(&emfile).to_string().contains("open-files limit"));
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert!(!io_shortage(&enoent));
        assert_eq!(io(&enoent).to_string(), enoent.to_string());
    }
}
