//! Fault injection for the crash and chaos tests: `BACKFILL_FAULT=POINT[@N][:ACTION],...` makes
//! the process abort (`abort`, the default, as `kill -9` or a power cut would), freeze itself
//! (`stop`, as SIGSTOP), fail (`fail`, as a full disk would), or take every file descriptor it
//! may still open and keep them (`files`, as a process at its open-files limit) the N-th time
//! (default: the first) it reaches POINT; `slow-commit:DURATION` delays every manifest commit (a slow disk);
//! `clock-skew:+DURATION` or `clock-skew:-DURATION` sets this host's wall clock ahead or behind
//! (a host whose clock is wrong); `serve-timeouts:DURATION` shortens `serve`'s header-read and
//! idle timeouts to DURATION (a test cannot wait tens of seconds).
//!
//! Compiled in only with the `fault-injection` cargo feature, which the tests enable; release
//! builds ignore the variable.

/// What to do at a fault point.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Abort,
    Stop,
    Fail,
    Files,
}

#[cfg(feature = "fault-injection")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    use std::time::Duration;

    use super::Action;

    struct Plan {
        points: HashMap<String, (u32, Action)>,
        hits: HashMap<String, u32>,
        slow_commit: Option<Duration>,
        skew_ms: i64,
        serve_timeouts: Option<Duration>,
    }

    static PLAN: LazyLock<Mutex<Plan>> = LazyLock::new(|| {
        let mut plan = Plan {
            points: HashMap::new(),
            hits: HashMap::new(),
            slow_commit: None,
            skew_ms: 0,
            serve_timeouts: None,
        };
        let spec = std::env::var("BACKFILL_FAULT").unwrap_or_default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (point, action) = item.split_once(':').unwrap_or((item, "abort"));
            if point == "clock-skew" {
                let (sign, d) = match action.strip_prefix('-') {
                    Some(d) => (-1, d),
                    None => (1, action.trim_start_matches('+')),
                };
                plan.skew_ms = humantime::parse_duration(d)
                    .map_or(0, |d| sign * i64::try_from(d.as_millis()).unwrap_or(0));
                continue;
            }
            if point == "slow-commit" {
                plan.slow_commit = humantime::parse_duration(action).ok();
                continue;
            }
            if point == "serve-timeouts" {
                plan.serve_timeouts = humantime::parse_duration(action).ok();
                continue;
            }
            let (name, nth) = point.split_once('@').unwrap_or((point, "1"));
            let action = match action {
                "stop" => Action::Stop,
                "fail" => Action::Fail,
                "files" => Action::Files,
                _ => Action::Abort,
            };
            plan.points
                .insert(name.to_string(), (nth.parse().unwrap_or(1), action));
        }
        Mutex::new(plan)
    });

    /// Held (shared) by the SQLite manifest's writer over each transaction, and (exclusive) by
    /// a process that freezes itself at a fault point.
    static MANIFEST_TX: std::sync::RwLock<()> = std::sync::RwLock::new(());

    thread_local! {
        /// Whether this thread is inside a manifest transaction.
        static IN_TX: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A manifest transaction of this process, while it is open.
    pub(crate) struct InTx {
        _guard: std::sync::RwLockReadGuard<'static, ()>,
    }

    impl Drop for InTx {
        fn drop(&mut self) {
            IN_TX.with(|t| t.set(false));
        }
    }

    pub(crate) fn manifest_tx() -> InTx {
        let guard = MANIFEST_TX
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        IN_TX.with(|t| t.set(true));
        InTx { _guard: guard }
    }

    /// Waits until no manifest transaction of this process is open, and keeps new ones from
    /// beginning while held; nothing when this thread is inside one.
    pub(crate) fn manifest_idle() -> Option<std::sync::RwLockWriteGuard<'static, ()>> {
        if IN_TX.with(std::cell::Cell::get) {
            return None;
        }
        Some(
            MANIFEST_TX
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    pub(crate) fn reached(point: &str) -> Option<Action> {
        let mut plan = PLAN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let &(nth, action) = plan.points.get(point)?;
        let hits = plan.hits.entry(point.to_string()).or_insert(0);
        *hits += 1;
        (*hits == nth).then_some(action)
    }

    pub(crate) fn slow_commit() -> Option<Duration> {
        PLAN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .slow_commit
    }

    pub(crate) fn skew_ms() -> i64 {
        PLAN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .skew_ms
    }

    pub(crate) fn serve_timeouts() -> Option<Duration> {
        PLAN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .serve_timeouts
    }
}

/// Reaches a fault point: aborts or freezes the process when configured to; returns true when
/// the caller must fail as if its write had failed.
pub(crate) fn point(name: &str) -> bool {
    #[cfg(feature = "fault-injection")]
    {
        match imp::reached(name) {
            Some(Action::Abort) => std::process::abort(),
            Some(Action::Stop) => {
                // Frozen between the SQLite manifest's transactions, as a test expects of a
                // process frozen at this point: which lock a frozen process holds is then the
                // point's, not a matter of timing.
                let _idle = imp::manifest_idle();
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                false
            }
            Some(Action::Fail) => true,
            Some(Action::Files) => {
                // Kept for the rest of the process: nothing closes them.
                while let Ok(f) = std::fs::File::open("/dev/null") {
                    std::mem::forget(f);
                }
                false
            }
            None => false,
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = name;
        false
    }
}

/// How long to delay each manifest commit (a slow disk), if configured.
pub(crate) fn slow_commit() -> Option<std::time::Duration> {
    #[cfg(feature = "fault-injection")]
    {
        imp::slow_commit()
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}

/// How far this host's wall clock is set off (milliseconds), if configured.
pub(crate) fn clock_skew_ms() -> i64 {
    #[cfg(feature = "fault-injection")]
    {
        imp::skew_ms()
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        0
    }
}

/// What `serve`'s header-read and idle timeouts are shortened to, if configured.
pub(crate) fn serve_timeouts() -> Option<std::time::Duration> {
    #[cfg(feature = "fault-injection")]
    {
        imp::serve_timeouts()
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}

/// Marks a SQLite manifest transaction of this process as open while the returned value lives:
/// a process that freezes itself at a fault point does so between them.
pub(crate) fn manifest_tx() -> impl Sized {
    #[cfg(feature = "fault-injection")]
    {
        imp::manifest_tx()
    }
    #[cfg(not(feature = "fault-injection"))]
    {}
}
