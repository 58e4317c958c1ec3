//! Waiting for a SQLite warehouse that another process has locked, as the manifest's lock is
//! waited for: bounded, and naming the process that holds the lock.
//!
//! A write that finds the warehouse locked is retried while the lock's holder gets somewhere:
//! the lock changes hands, or its holder uses CPU time (a long publish that works). A holder
//! that is stopped (SIGSTOP, a debugger), or that has done nothing for [`PATIENCE`] (a process
//! that keeps a transaction open and sleeps), is given up on with [`Error::LockedBy`], which
//! names it, and how to let it go on when it is stopped. After [`SAY_AFTER`] of waiting, the
//! wait is said once on stderr, with the same names: a frozen owner is then never a silent
//! hang. The writes of a process share what they saw of a lock, so that publishes queued behind
//! one that gave up (they take turns) give up at their first look rather than each after as
//! long again.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::{Error, Result};
use crate::project::Warehouse;
use crate::sqlite::Holder;

/// How long a write waits for a lock whose holder gets nowhere: as long as the manifest's lock
/// is waited for (its busy timeout).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// After how long a wait for another process's lock is said on stderr.
pub(crate) const SAY_AFTER: Duration = Duration::from_secs(3);

/// Runs `f` until it does not fail with SQLITE_BUSY beyond the busy timeout: a warehouse locked
/// by another process is waited for while its holder gets somewhere, and given up on with
/// [`Error::LockedBy`] once it has not for [`PATIENCE`]. Stops when `cancel` is set.
pub(crate) fn retry_busy<R>(
    w: &Warehouse,
    cancel: Option<&AtomicBool>,
    f: impl FnMut() -> Result<R>,
) -> Result<R> {
    retry_busy_noting(w, cancel, &mut || {}, f)
}

/// [`retry_busy`], calling `waiting` each time the lock was not had within the busy timeout.
pub(crate) fn retry_busy_noting<R>(
    w: &Warehouse,
    cancel: Option<&AtomicBool>,
    waiting: &mut dyn FnMut(),
    mut f: impl FnMut() -> Result<R>,
) -> Result<R> {
    let began = Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut looked = false;
    loop {
        match f() {
            Err(e) if e.is_busy() => {
                waiting();
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return Err(Error::Cancelled);
                }
                let holder = crate::sqlite::lock_holder(&w.path);
                let now = Instant::now();
                let stalled = look(w, holder, began, now);
                looked = true;
                if now.duration_since(began) >= SAY_AFTER {
                    say_once(w, holder);
                }
                if stalled >= PATIENCE {
                    return Err(locked_by(w, holder, now.duration_since(began)));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => {
                if looked {
                    forget(w);
                }
                return other;
            }
        }
    }
}

/// What the writes of this process have seen of a warehouse's lock and its holder.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The holder, when it could be named, and its CPU time then.
    holder: Option<(i32, Option<u64>)>,
    /// When this was seen.
    at: Instant,
    /// Since when the holder has got nowhere.
    since: Instant,
}

impl Seen {
    /// What is seen at `now` of `holder`, after `self`. The holder gets somewhere when the lock
    /// was released or changed hands, or when it used CPU time; a stopped one gets nowhere, and
    /// one seen for the first time has not been seen getting anywhere yet.
    fn then(self, holder: Holder, now: Instant) -> Seen {
        let (named, progress) = match holder {
            Holder::Nobody => (None, true),
            // A stopped one may have worked since the last look: its CPU time says.
            Holder::Process { pid, .. } => {
                let ticks = crate::liveness::cpu_ticks(i64::from(pid));
                let progress = self
                    .holder
                    .is_some_and(|(before, used)| before != pid || used != ticks);
                (Some((pid, ticks)), progress)
            }
            Holder::Unseen => (None, false),
        };
        Seen {
            holder: named,
            at: now,
            since: if progress { now } else { self.since },
        }
    }
}

/// What the writes of this process saw of each warehouse's lock, by its file.
static SEEN: LazyLock<Mutex<HashMap<PathBuf, Seen>>> = LazyLock::new(Mutex::default);

/// Forgets what was seen of a warehouse's lock: a write had it.
fn forget(w: &Warehouse) {
    SEEN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&w.path);
}

/// Takes in what a write waiting since `began` sees of the lock at `now`, and returns how long
/// its holder has got nowhere. The writes of this process that wait one after another (its
/// publishes take turns) share what they saw: once one gave up on a holder that got nowhere,
/// the next gives up after one look at it, not after waiting as long again.
fn look(w: &Warehouse, holder: Holder, began: Instant, now: Instant) -> Duration {
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // What another write saw carries over while it is recent: a look per busy timeout.
    let recent = w.busy_timeout * 2 + Duration::from_secs(1);
    let fresh = Seen {
        holder: None,
        at: began,
        since: began,
    };
    // A holder that is stopped got nowhere since it was seen stopped, however long ago: a
    // write that waits after a try's compute (seconds on a busy machine) gives up at once too.
    let still_stopped = |s: &Seen| match holder {
        Holder::Process { pid, stopped: true } => s.holder.is_some_and(|(p, _)| p == pid),
        _ => false,
    };
    let before = seen
        .get(&w.path)
        .copied()
        .filter(|s| now.duration_since(s.at) <= recent || still_stopped(s))
        .unwrap_or(fresh);
    let after = before.then(holder, now);
    seen.insert(w.path.clone(), after);
    now.duration_since(after.since)
}

/// What a wait for `holder`'s lock says once on stderr (per warehouse and holder, in this
/// process: its concurrent writes wait for the same lock).
fn say_once(w: &Warehouse, holder: Holder) {
    /// A warehouse's file, the holder (when named) and whether it was stopped.
    type Said = (PathBuf, Option<i32>, bool);
    static SAID: LazyLock<Mutex<HashSet<Said>>> = LazyLock::new(Mutex::default);
    let key = match holder {
        Holder::Nobody => return,
        Holder::Process { pid, stopped } => (w.path.clone(), Some(pid), stopped),
        Holder::Unseen => (w.path.clone(), None, false),
    };
    let first = SAID.lock().map(|mut s| s.insert(key)).unwrap_or(false);
    if !first {
        return;
    }
    let patience = humantime::format_duration(PATIENCE);
    let what = match holder {
        Holder::Process { pid, stopped: true } => format!(
            "its write lock is held by process {pid}, which is stopped: `kill -CONT {pid}` lets it go on (or end it); waiting up to {patience}"
        ),
        Holder::Process { pid, .. } => format!(
            "its write lock is held by process {pid}; waiting while it works (up to {patience} once it does nothing)"
        ),
        _ => format!(
            "its write lock is held by a process this one cannot name (another PID namespace or host); waiting up to {patience}"
        ),
    };
    super::notice(format!(
        "warning: warehouse `{}` ({}) is locked: {what}",
        w.name,
        w.location()
    ));
}

/// The error of a write that gave up on `holder`'s lock after `waited`.
fn locked_by(w: &Warehouse, holder: Holder, waited: Duration) -> Error {
    let (holder, stopped) = match holder {
        Holder::Process { pid, stopped } => (Some(pid), stopped),
        Holder::Nobody | Holder::Unseen => (None, false),
    };
    Error::LockedBy {
        name: w.name.clone(),
        path: w.path.clone(),
        holder,
        stopped,
        waited: Duration::from_secs(waited.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_gets_somewhere_by_releasing_the_lock_changing_hands_or_working() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let me = i32::try_from(std::process::id()).unwrap();
        let process = |pid, stopped| Holder::Process { pid, stopped };
        let first = Seen {
            holder: None,
            at: t0,
            since: t0,
        };
        // Stopped: never progress.
        let s = first.then(process(me, true), at(1));
        assert_eq!(s.since, t0, "a holder seen first has not got anywhere yet");
        let s = s.then(process(me, true), at(2));
        assert_eq!(s.since, t0);
        // Released: progress.
        let s = s.then(Holder::Nobody, at(3));
        assert_eq!(s.since, at(3));
        // Another holder than the last: progress, stopped or not.
        let s = s.then(process(me, false), at(4));
        assert_eq!(s.since, at(3));
        let s = s.then(process(me + 1, true), at(5));
        assert_eq!(s.since, at(5));
        // A holder nobody can see: the wait's length alone.
        let s = s.then(Holder::Unseen, at(6));
        assert_eq!(s.since, at(5));
        // This process, working: its CPU time grows between looks.
        let s = s.then(process(me, false), at(7));
        assert_eq!(s.since, at(5));
        let idle = s.then(process(me, false), at(8));
        let spin = Instant::now();
        let mut x = 0u64;
        while crate::liveness::cpu_ticks(i64::from(me)) == s.holder.and_then(|h| h.1)
            && spin.elapsed() < Duration::from_secs(5)
        {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let worked = s.then(process(me, false), at(9));
        assert_eq!(worked.since, at(9));
        // The same, having done next to nothing between two looks: nowhere, or (a clock tick
        // passed) somewhere.
        assert!(idle.since == at(5) || idle.since == at(8));
    }
}
