//! How a try ends, shared by every kind of try (a command, a SQL task, a promote, a rollback):
//! its outcome, the gate's rules and verdict on its record, and how a single, never retried
//! try settles its task.

use std::path::{Path, PathBuf};

use super::record::{LastTry, Published};
use super::{Event, Shared};
use crate::exit::Error;
use crate::gate::{Rules, Verdict};
use crate::interval::DataInterval;
use crate::manifest::TryRecord;
use crate::project::{Gate, Task};
use crate::state::TryState;
use crate::task::command;
use crate::task::template::Context;

/// How a task ended for its run.
pub(super) enum TaskEnd {
    Succeeded,
    /// Nothing to do for this task (a promote without a staged output of it, a rollback of a
    /// command task): no try.
    Skipped,
    Failed(String),
    Rejected(String),
    Cancelled,
    /// The interval was skipped as `upstream not successful` when it was about to start.
    UpstreamNotReady,
}

impl TaskEnd {
    /// How this end of task `task_id` ends its run: its state and error; `None` when the run
    /// goes on with its next task (or ends succeeded). `fault`: what stopped the backfill, if
    /// anything did.
    pub(super) fn run_end(
        &self,
        task_id: &str,
        fault: Option<crate::environment::Fault>,
    ) -> Option<(crate::plan::RunState, String)> {
        use crate::plan::RunState;
        Some(match self {
            Self::Succeeded | Self::Skipped => return None,
            Self::Failed(e) => (RunState::Failed, format!("task `{task_id}` failed: {e}")),
            Self::Rejected(reason) => (
                RunState::Rejected,
                format!("task `{task_id}` rejected: {reason}"),
            ),
            Self::Cancelled | Self::UpstreamNotReady => (
                RunState::Cancelled,
                match fault {
                    Some(fault) => {
                        format!("interrupted during task `{task_id}`: {}", fault.cause)
                    }
                    None => format!("cancelled during task `{task_id}`"),
                },
            ),
        })
    }
}

/// How one try ended.
pub(super) enum Outcome {
    Succeeded(TryRecord, Option<Published>),
    Rejected(TryRecord, String),
    /// May be retried.
    Failed(TryRecord),
    Cancelled(TryRecord),
}

impl Outcome {
    pub(super) fn record_mut(&mut self) -> &mut TryRecord {
        match self {
            Self::Succeeded(r, _) | Self::Rejected(r, _) | Self::Failed(r) | Self::Cancelled(r) => {
                r
            }
        }
    }
}

pub(super) fn failed(error: String, exit_code: Option<i32>) -> Outcome {
    let mut r = TryRecord::new(TryState::Failed);
    r.exit_code = exit_code;
    r.error = Some(error);
    Outcome::Failed(r)
}

pub(super) fn cancelled(why: &str) -> Outcome {
    let mut r = TryRecord::new(TryState::Cancelled);
    r.error = Some(why.to_string());
    Outcome::Cancelled(r)
}

/// One try's fixed inputs.
pub(super) struct TryInput<'a> {
    pub try_id: i64,
    pub interval: DataInterval,
    pub ctx: Context<'a>,
    pub env: Vec<(String, String)>,
    pub log_path: PathBuf,
    pub result_path: PathBuf,
    pub audit_path: Option<PathBuf>,
    /// The batch whose query computes this try's rows (the first try of an interval of a
    /// batch; see [`super::batch`]).
    pub batch: Option<std::sync::Arc<super::batch::Batch>>,
    /// The task has a try left after this one: a fault that may pass by itself (see
    /// [`crate::environment::Fault::transient`]) fails this try, to be retried, rather than
    /// stopping the backfill.
    pub may_retry: bool,
}

/// A try whose output passed its gate and is kept at `path`, unpublished, for `promote`.
pub(super) fn staged(mut record: TryRecord, path: &Path) -> Outcome {
    record.verdict = Some(crate::state::Verdict::Staged);
    record.staged = Some(crate::state::StagedState::Staged);
    record.staged_path = Some(path.display().to_string());
    Outcome::Succeeded(record, None)
}

/// How a single try (of a promote or a rollback, never retried) ends its task; a failure is
/// reported as a try that will not be retried.
pub(super) fn settle(
    shared: &Shared,
    outcome: Outcome,
    started: &super::record::Started,
    task: &Task,
    interval: DataInterval,
) -> (TaskEnd, Option<LastTry>) {
    let (record, end, published) = match outcome {
        Outcome::Succeeded(r, p) => (r, TaskEnd::Succeeded, p),
        Outcome::Rejected(r, reason) => (r, TaskEnd::Rejected(reason), None),
        Outcome::Cancelled(r) => (r, TaskEnd::Cancelled, None),
        Outcome::Failed(r) => {
            let error = r.error.clone().unwrap_or_default();
            let _ = shared.events.send(Event::TryFailed {
                interval,
                task_id: task.id.clone(),
                try_number: 1,
                error: error.clone(),
                will_retry: false,
                log_path: started.log.display().to_string(),
                log_tail: command::log_tail(&started.log, 20),
            });
            (r, TaskEnd::Failed(error), None)
        }
    };
    let last = LastTry {
        try_id: started.try_id,
        task_id: task.id.clone(),
        interval,
        record,
        published,
    };
    (end, Some(last))
}

/// Records a run's first try as started and tells the reporter the interval started.
pub(super) async fn start_single(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: &mut Option<i64>,
    claim: Option<i64>,
) -> Result<super::record::Claimed, Error> {
    use super::record::Claimed;
    let started =
        match super::record::start_claiming(shared, task, interval, *run_id, 1, claim, None).await?
        {
            Claimed::Started(s) => s,
            other => return Ok(other),
        };
    if run_id.is_none() {
        *run_id = Some(started.run_id);
        let _ = shared.events.send(Event::IntervalStarted {
            interval,
            run_id: started.run_id,
        });
    }
    Ok(Claimed::Started(started))
}

/// Gate rules of a task. Without a gate only the boundary check applies (SQL tasks): publishing
/// replaces exactly the interval, so rows outside it would survive a rerun twice.
pub(super) fn rules(gate: Option<&Gate>, allow_drift: bool) -> Rules {
    match gate {
        Some(g) => Rules {
            tolerance: g.tolerance,
            allow_empty: g.allow_empty,
            allow_drift,
            history: g.history,
            max_changed: g.max_changed,
        },
        None => Rules {
            tolerance: f64::INFINITY,
            allow_empty: true,
            allow_drift: true,
            history: None,
            max_changed: None,
        },
    }
}

pub(super) fn apply_verdict(
    record: &mut TryRecord,
    verdict: &Verdict,
    source: Option<i64>,
    published: Option<i64>,
) {
    record.source_rows = source;
    record.previous_rows = published;
    record.verdict = Some(verdict.recorded());
    record.reasons = verdict.reason().map(str::to_string);
}

/// Adds to a try's reasons, after its verdict's: `warning: ...; note: ...`.
pub(super) fn add_reasons(record: &mut TryRecord, prefix: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let mut parts: Vec<String> = record.reasons.take().into_iter().collect();
    parts.extend(items.iter().map(|w| format!("{prefix}{w}")));
    record.reasons = Some(parts.join("; "));
}

/// Records what the gate warned of and noted with a try that publishes, and says each
/// warning as it happens.
pub(super) fn warn(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    record: &mut TryRecord,
    warnings: &[String],
    notes: &[String],
) {
    add_reasons(record, WARNING, warnings);
    add_reasons(record, NOTE, notes);
    for warning in warnings {
        let _ = shared.events.send(Event::GateWarned {
            interval,
            task_id: task.id.clone(),
            warning: warning.clone(),
        });
    }
}

pub(crate) use crate::gate::WARNING;

/// How each of the gate's notes begins in a try's reasons.
pub(crate) const NOTE: &str = "note: ";

/// The error of a try stopped by its task's `timeout`.
pub(super) fn timed_out(task: &Task) -> String {
    format!(
        "timed out after {}",
        humantime::format_duration(task.timeout.unwrap_or_default())
    )
}
