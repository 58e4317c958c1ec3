//! The runner: runs the planned intervals of one backfill with at most `max_active_runs` in
//! flight, the tasks of an interval in `depends_on` order, retries with exponential backoff,
//! per-task timeouts, and a stop signal (graceful or hard).
//!
//! It talks to the manifest only through the writer and to the outside world only through
//! [`Event`]s; it never prints. Signals and the cancel flag are watched by the caller, which
//! turns them into [`Stop`] levels.

pub mod events;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::task::command::Stop;
pub use events::Event;

use crate::interval::{DataInterval, rfc3339};
use crate::manifest::{self, TryRecord, lease::now_ms, writer::Writer};
use crate::plan::{RunState, SkipReason};
use crate::project::{Dag, Task, TaskKind};
use crate::task::command::{self, Ended};
use crate::task::template::Context;

/// Longest wait between two tries, whatever the backoff computes.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// Everything the runner needs for one backfill.
pub struct RunSpec {
    pub backfill_id: i64,
    pub dag: Arc<Dag>,
    pub conf: serde_json::Value,
    pub project_root: PathBuf,
    pub logs_dir: PathBuf,
    pub host: String,
    pub max_active_runs: usize,
    /// Intervals to run, in plan order.
    pub intervals: Vec<DataInterval>,
}

/// Shared by the interval tasks of one backfill.
struct Shared {
    spec: RunSpec,
    writer: Writer,
    events: mpsc::UnboundedSender<Event>,
    conf_text: String,
}

/// Runs the backfill until every interval finished or a stop was requested.
pub async fn run(
    spec: RunSpec,
    writer: Writer,
    events: mpsc::UnboundedSender<Event>,
    stop: watch::Receiver<Stop>,
) -> anyhow::Result<()> {
    let depends_on_past = spec.dag.depends_on_past;
    let max = if depends_on_past {
        1
    } else {
        spec.max_active_runs.max(1)
    };
    let mut queue: VecDeque<DataInterval> = spec.intervals.iter().copied().collect();
    let shared = Arc::new(Shared {
        conf_text: spec.conf.to_string(),
        spec,
        writer,
        events,
    });
    // For depends_on_past: whether the interval ending at this instant succeeded here.
    let mut succeeded_by_end: HashMap<i64, bool> = HashMap::new();
    let mut running: JoinSet<anyhow::Result<(DataInterval, RunState)>> = JoinSet::new();
    let mut stop_rx = stop.clone();
    loop {
        while running.len() < max && *stop.borrow() == Stop::Run {
            let Some(interval) = queue.pop_front() else {
                break;
            };
            if depends_on_past && succeeded_by_end.get(&interval.start.timestamp()) == Some(&false)
            {
                let reason = SkipReason::PreviousNotSuccessful;
                let dag_id = shared.spec.dag.id.clone();
                let id = shared.spec.backfill_id;
                let start = interval.start.timestamp();
                shared
                    .writer
                    .call(move |c| manifest::skip_planned(c, id, &dag_id, start, reason.as_str()))
                    .await?;
                succeeded_by_end.insert(interval.end.timestamp(), false);
                let _ = shared
                    .events
                    .send(Event::IntervalSkipped { interval, reason });
                continue;
            }
            running.spawn(run_interval(shared.clone(), interval, stop.clone()));
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            joined = running.join_next() => {
                if let Some(joined) = joined {
                    let (interval, state) = joined??;
                    succeeded_by_end.insert(interval.end.timestamp(), state == RunState::Succeeded);
                }
            }
            _ = stop_rx.changed() => {}
        }
    }
    Ok(())
}

/// Runs every task of one interval; records the run.
async fn run_interval(
    shared: Arc<Shared>,
    interval: DataInterval,
    mut stop: watch::Receiver<Stop>,
) -> anyhow::Result<(DataInterval, RunState)> {
    let began = Instant::now();
    let (id, dag_id) = (shared.spec.backfill_id, shared.spec.dag.id.clone());
    let run_id = shared
        .writer
        .call(move |c| manifest::start_run(c, id, &dag_id, interval, now_ms()))
        .await?;
    let _ = shared
        .events
        .send(Event::IntervalStarted { interval, run_id });
    let mut state = RunState::Succeeded;
    let mut error = None;
    for task in &shared.spec.dag.tasks {
        match run_task(&shared, task, interval, run_id, &mut stop).await? {
            TaskEnd::Succeeded => {}
            TaskEnd::Failed(e) => {
                state = RunState::Failed;
                error = Some(format!("task `{}` failed: {e}", task.id));
                break;
            }
            TaskEnd::Cancelled => {
                state = RunState::Cancelled;
                error = Some(format!("cancelled during task `{}`", task.id));
                break;
            }
        }
    }
    let recorded_error = error.clone();
    shared
        .writer
        .call(move |c| manifest::finish_run(c, run_id, state, recorded_error.as_deref(), now_ms()))
        .await?;
    let _ = shared.events.send(Event::IntervalFinished {
        interval,
        run_id,
        state,
        elapsed: began.elapsed(),
        error,
    });
    Ok((interval, state))
}

enum TaskEnd {
    Succeeded,
    Failed(String),
    Cancelled,
}

/// Runs the tries of one task until one succeeds, the retries are used up, or a stop.
async fn run_task(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: i64,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<TaskEnd> {
    let spec = &shared.spec;
    let tz = spec.dag.tz;
    let ds = interval.ds(tz);
    let ds_nodash = ds.replace('-', "");
    let (start, end) = (rfc3339(interval.start), rfc3339(interval.end));
    let run_id_text = run_id.to_string();
    let attempts = task.retries + 1;
    let mut last_error = String::new();
    for try_number in 1..=attempts {
        if *stop.borrow() != Stop::Run {
            return Ok(TaskEnd::Cancelled);
        }
        let (log_path, result_path) = command::try_paths(
            &spec.logs_dir,
            &spec.dag.id,
            interval.start,
            &task.id,
            run_id,
            try_number,
        );
        let log_text = log_path.display().to_string();
        let (task_id, log_for_row) = (task.id.clone(), log_text.clone());
        let try_id = shared
            .writer
            .call(move |c| {
                manifest::start_try(c, run_id, &task_id, try_number, &log_for_row, now_ms())
            })
            .await?;
        let ctx = Context {
            ds: &ds,
            ds_nodash: &ds_nodash,
            data_interval_start: &start,
            data_interval_end: &end,
            dag_id: &spec.dag.id,
            task_id: &task.id,
            run_id: &run_id_text,
            try_number,
            conf: &spec.conf,
        };
        let outcome = match &task.kind {
            TaskKind::Command(command_spec) => match command::render(command_spec, &ctx) {
                Err(e) => Attempt::Failed {
                    error: e,
                    exit_code: None,
                },
                Ok(argv) => {
                    let env = environment(&ctx, &shared.conf_text, &result_path);
                    let _ = std::fs::remove_file(&result_path);
                    run_command(
                        shared,
                        try_id,
                        &argv,
                        &env,
                        &log_path,
                        &result_path,
                        task,
                        stop,
                    )
                    .await?
                }
            },
        };
        let (record, end) = match outcome {
            Attempt::Succeeded(result) => {
                let result = result.unwrap_or_default();
                let json = |v: Option<Vec<serde_json::Value>>| {
                    v.map(|v| serde_json::Value::Array(v).to_string())
                };
                (
                    TryRecord {
                        state: "succeeded".into(),
                        exit_code: Some(0),
                        rows: result.rows,
                        partitions: json(result.partitions),
                        inputs: json(result.inputs),
                        fingerprint: result.fingerprint,
                        ..TryRecord::default()
                    },
                    Some(TaskEnd::Succeeded),
                )
            }
            Attempt::Cancelled => (
                TryRecord {
                    state: "cancelled".into(),
                    error: Some("cancelled".into()),
                    ..TryRecord::default()
                },
                Some(TaskEnd::Cancelled),
            ),
            Attempt::Failed { error, exit_code } => {
                last_error = error.clone();
                (
                    TryRecord {
                        state: "failed".into(),
                        exit_code,
                        error: Some(error),
                        ..TryRecord::default()
                    },
                    None,
                )
            }
        };
        shared
            .writer
            .call(move |c| manifest::finish_try(c, try_id, &record, now_ms()))
            .await?;
        if let Some(end) = end {
            return Ok(end);
        }
        let will_retry = try_number < attempts;
        let _ = shared.events.send(Event::TryFailed {
            interval,
            task_id: task.id.clone(),
            try_number,
            error: last_error.clone(),
            will_retry,
            log_path: log_text,
            log_tail: command::log_tail(&log_path, 20),
        });
        if will_retry && !wait_before_retry(task.retry_delay, try_number, stop).await {
            return Ok(TaskEnd::Cancelled);
        }
    }
    Ok(TaskEnd::Failed(last_error))
}

enum Attempt {
    Succeeded(Option<command::TaskResult>),
    Failed {
        error: String,
        exit_code: Option<i32>,
    },
    Cancelled,
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the pieces of one try"
)]
async fn run_command(
    shared: &Shared,
    try_id: i64,
    argv: &[String],
    env: &[(String, String)],
    log_path: &std::path::Path,
    result_path: &std::path::Path,
    task: &Task,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Attempt> {
    let spawned = match command::spawn(argv, env, &shared.spec.project_root, log_path) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Attempt::Failed {
                error: format!("cannot start `{}`: {e}", argv[0]),
                exit_code: None,
            });
        }
    };
    let (pgid, host) = (spawned.pgid, shared.spec.host.clone());
    // Not awaited: the group is recorded with the next commit, while the try already runs.
    drop(
        shared
            .writer
            .submit(move |c| manifest::set_try_group(c, try_id, pgid, &host)),
    );
    let ended = command::supervise(spawned, task.timeout, task.grace_period, stop).await?;
    Ok(match ended {
        Ended::Exited(status) if status.success() => match command::read_result(result_path) {
            Ok(result) => Attempt::Succeeded(result),
            Err(error) => Attempt::Failed {
                error,
                exit_code: Some(0),
            },
        },
        Ended::Exited(status) => Attempt::Failed {
            error: command::describe_exit(status),
            exit_code: status.code(),
        },
        Ended::TimedOut => Attempt::Failed {
            error: format!(
                "timed out after {}",
                humantime::format_duration(task.timeout.unwrap_or_default())
            ),
            exit_code: None,
        },
        Ended::Cancelled => Attempt::Cancelled,
    })
}

/// The `BACKFILL_*` environment of a try.
fn environment(
    ctx: &Context<'_>,
    conf: &str,
    result_path: &std::path::Path,
) -> Vec<(String, String)> {
    vec![
        ("BACKFILL_DAG_ID".into(), ctx.dag_id.into()),
        ("BACKFILL_TASK_ID".into(), ctx.task_id.into()),
        ("BACKFILL_RUN_ID".into(), ctx.run_id.into()),
        ("BACKFILL_TRY_NUMBER".into(), ctx.try_number.to_string()),
        (
            "BACKFILL_DATA_INTERVAL_START".into(),
            ctx.data_interval_start.into(),
        ),
        (
            "BACKFILL_DATA_INTERVAL_END".into(),
            ctx.data_interval_end.into(),
        ),
        ("BACKFILL_DS".into(), ctx.ds.into()),
        ("BACKFILL_DS_NODASH".into(), ctx.ds_nodash.into()),
        ("BACKFILL_CONF".into(), conf.into()),
        ("BACKFILL_RESULT".into(), result_path.display().to_string()),
    ]
}

/// `retry_delay * 2^(try_number - 1)`, capped.
pub fn retry_delay(base: Duration, try_number: u32) -> Duration {
    let factor = 2u32.saturating_pow(try_number.saturating_sub(1));
    base.checked_mul(factor)
        .unwrap_or(MAX_RETRY_DELAY)
        .min(MAX_RETRY_DELAY)
}

/// Sleeps before the next try; returns false when a stop came first.
async fn wait_before_retry(
    base: Duration,
    try_number: u32,
    stop: &mut watch::Receiver<Stop>,
) -> bool {
    let sleep = tokio::time::sleep(retry_delay(base, try_number));
    tokio::pin!(sleep);
    loop {
        if *stop.borrow() != Stop::Run {
            return false;
        }
        tokio::select! {
            () = &mut sleep => return true,
            changed = stop.changed() => {
                if changed.is_err() {
                    (&mut sleep).await;
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_secs(5);
        assert_eq!(retry_delay(base, 1), Duration::from_secs(5));
        assert_eq!(retry_delay(base, 2), Duration::from_secs(10));
        assert_eq!(retry_delay(base, 3), Duration::from_secs(20));
        assert_eq!(retry_delay(base, 40), MAX_RETRY_DELAY);
    }
}
