//! What the runner reports while it works. The reporter turns these into a progress bar, plain
//! lines or JSON; the runner itself never prints.

use std::time::Duration;

use crate::interval::DataInterval;
use crate::plan::{RunState, SkipReason};

#[derive(Debug, Clone)]
pub enum Event {
    IntervalStarted {
        interval: DataInterval,
        run_id: i64,
    },
    TryFailed {
        interval: DataInterval,
        task_id: String,
        try_number: u32,
        error: String,
        will_retry: bool,
        log_path: String,
        log_tail: String,
    },
    IntervalFinished {
        interval: DataInterval,
        run_id: i64,
        state: RunState,
        elapsed: Duration,
        error: Option<String>,
    },
    /// Skipped while running (e.g. `depends_on_past` after a failure).
    IntervalSkipped {
        interval: DataInterval,
        reason: SkipReason,
    },
    /// A try waits for a slot of its pool (`waiting`), or got one.
    PoolWait {
        interval: DataInterval,
        task_id: String,
        pool: String,
        waiting: bool,
    },
    /// `--max-failures` was reached: no new interval starts; running ones finish.
    MaxFailures {
        failed: u32,
    },
    /// A stop was requested: by a signal, or by `backfill cancel`.
    Stopping {
        hard: bool,
        why: String,
    },
}
