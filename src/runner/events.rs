//! What the runner reports while it works. The reporter turns these into a progress bar, plain
//! lines or JSON; the runner itself never prints.

use std::time::Duration;

use crate::interval::DataInterval;
use crate::plan::{RunState, SkipReason};

#[derive(Debug, Clone)]
pub(crate) enum Event {
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
        state: RunState,
        elapsed: Duration,
        error: Option<String>,
    },
    /// The gate published a try's output with a warning (a `warn` rule that found violations,
    /// or less history than asked).
    GateWarned {
        interval: DataInterval,
        task_id: String,
        warning: String,
    },
    /// What a run says of its setting before its first try (e.g. of a warehouse): shown also
    /// when quiet.
    Warning {
        warning: String,
    },
    /// Skipped while running (e.g. `depends_on_past` after a failure).
    IntervalSkipped {
        interval: DataInterval,
        reason: SkipReason,
    },
    /// A try waits for a slot of its pool (`waiting`), or got one; `rate` when what it first
    /// waited for was the pool's rate, not a slot.
    PoolWait {
        interval: DataInterval,
        task_id: String,
        pool: String,
        waiting: bool,
        rate: bool,
    },
    /// An interval waits for its sources (`[tasks.ready]`, `waiting`, with the time its wait
    /// has `left`), or stopped waiting (ready, not ready, or stopped).
    ReadyWait {
        interval: DataInterval,
        task_id: String,
        waiting: bool,
        left: Duration,
    },
    /// A readiness check failed (said once per interval and task): it counts as not ready.
    ReadyCheckFailed {
        interval: DataInterval,
        task_id: String,
        error: String,
    },
    /// `--max-failures` was reached: no new interval starts; running ones finish.
    MaxFailures {
        failed: u32,
    },
    /// A worker (`backfill join`) found its backfill's owner gone: `owner` says which process
    /// it was. The worker took the backfill over and finishes it, or, when `refused` says why
    /// it cannot, starts no more intervals and leaves the rest to `backfill resume`.
    OwnerGone {
        backfill_id: i64,
        worker: i64,
        owner: String,
        refused: Option<String>,
    },
    /// A stop was requested: by a signal, or by `backfill cancel`.
    Stopping {
        hard: bool,
        why: String,
    },
}

/// The run's counts so far. Whoever receives the events (the dispatcher) records each one here
/// and hands the counts to the reporter with the event, so that the reporter shows them and
/// never counts by itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Intervals this run is to run.
    pub total: u64,
    /// Intervals started and not finished.
    pub running: u64,
    /// Tries waiting for a slot of their pool.
    pub waiting: u64,
    /// Intervals that ended, whichever way (skipped while running included).
    pub finished: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub rejected: u64,
    pub cancelled: u64,
    /// Skipped while running (`depends_on_past` after a failure, sources not ready).
    pub skipped: u64,
    /// Intervals waiting for their sources (`[tasks.ready]`).
    pub waiting_ready: u64,
    /// Skipped because their sources were not ready when their wait ran out.
    pub not_ready: u64,
}

impl Stats {
    pub(crate) fn new(total: u64) -> Self {
        Self {
            total,
            ..Self::default()
        }
    }

    /// Counts what `event` says happened.
    pub(crate) fn record(&mut self, event: &Event) {
        match event {
            Event::IntervalStarted { .. } => self.running += 1,
            Event::IntervalFinished { state, .. } => {
                self.running = self.running.saturating_sub(1);
                self.finished += 1;
                match state {
                    RunState::Succeeded => self.succeeded += 1,
                    RunState::Failed => self.failed += 1,
                    RunState::Rejected => self.rejected += 1,
                    RunState::Cancelled => self.cancelled += 1,
                    RunState::Queued | RunState::Running => {}
                }
            }
            Event::IntervalSkipped { reason, .. } => {
                self.finished += 1;
                self.skipped += 1;
                if *reason == SkipReason::NotReady {
                    self.not_ready += 1;
                }
            }
            Event::ReadyWait { waiting: true, .. } => self.waiting_ready += 1,
            Event::ReadyWait { waiting: false, .. } => {
                self.waiting_ready = self.waiting_ready.saturating_sub(1);
            }
            Event::PoolWait { waiting: true, .. } => self.waiting += 1,
            Event::PoolWait { waiting: false, .. } => {
                self.waiting = self.waiting.saturating_sub(1);
            }
            Event::TryFailed { .. }
            | Event::ReadyCheckFailed { .. }
            | Event::GateWarned { .. }
            | Event::Warning { .. }
            | Event::MaxFailures { .. }
            | Event::OwnerGone { .. }
            | Event::Stopping { .. } => {}
        }
    }

    /// Intervals that failed or were rejected.
    pub(crate) fn failures(&self) -> u64 {
        self.failed + self.rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_what_the_events_say() {
        let interval = DataInterval {
            start: chrono::DateTime::UNIX_EPOCH,
            end: chrono::DateTime::UNIX_EPOCH + chrono::Duration::days(1),
        };
        let finished = |state| Event::IntervalFinished {
            interval,
            state,
            elapsed: Duration::ZERO,
            error: None,
        };
        let pool = |waiting| Event::PoolWait {
            interval,
            task_id: "t".into(),
            pool: "p".into(),
            waiting,
            rate: false,
        };
        let mut stats = Stats::new(5);
        for e in [
            Event::IntervalStarted {
                interval,
                run_id: 1,
            },
            Event::IntervalStarted {
                interval,
                run_id: 2,
            },
            pool(true),
            pool(true),
            pool(false),
            finished(RunState::Succeeded),
        ] {
            stats.record(&e);
        }
        assert_eq!(
            (stats.running, stats.waiting, stats.finished),
            (1, 1, 1),
            "{stats:?}"
        );
        for e in [
            finished(RunState::Rejected),
            Event::IntervalSkipped {
                interval,
                reason: SkipReason::PreviousNotSuccessful,
            },
            Event::MaxFailures { failed: 1 },
        ] {
            stats.record(&e);
        }
        assert_eq!(
            stats,
            Stats {
                total: 5,
                running: 0,
                waiting: 1,
                finished: 3,
                succeeded: 1,
                failed: 0,
                rejected: 1,
                cancelled: 0,
                skipped: 1,
                waiting_ready: 0,
                not_ready: 0,
            }
        );
        assert_eq!(stats.failures(), 1);
    }
}
