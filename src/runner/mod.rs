//! The runner: runs the planned intervals of one backfill with at most `max_active_runs` in
//! flight, the tasks of an interval in `depends_on` order, retries with exponential backoff,
//! per-task timeouts, and a stop signal (graceful or hard).
//!
//! It talks to the manifest only through the writer and to the outside world only through
//! [`Event`]s; it never prints. Signals and the cancel flag are watched by the caller, which
//! turns them into [`Stop`] levels.

pub mod events;
mod tries;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::task::command::Stop;
pub use events::Event;

use crate::interval::DataInterval;
use crate::manifest::{self, writer::Writer};
use crate::plan::{RunState, SkipReason};
use crate::project::Dag;
use tries::TaskEnd;

/// Everything the runner needs for one backfill.
pub struct RunSpec {
    pub backfill_id: i64,
    pub dag: Arc<Dag>,
    pub conf: serde_json::Value,
    pub project_root: PathBuf,
    pub logs_dir: PathBuf,
    pub host: String,
    pub max_active_runs: usize,
    /// Intervals to run, in plan order (moved into the runner's queue).
    pub intervals: Vec<DataInterval>,
    /// `--allow-drift`: the gate skips its drift check.
    pub allow_drift: bool,
    /// A crash injection point for tests (`BACKFILL_FAULT`).
    pub fault: Option<String>,
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
    mut spec: RunSpec,
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
    // Each task's folder for logs and result files, once: tries only add files to it.
    for task in &spec.dag.tasks {
        let dir = spec.logs_dir.join(&spec.dag.id).join(&task.id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create the log folder {}: {e}", dir.display()))?;
    }
    let mut queue: VecDeque<DataInterval> = std::mem::take(&mut spec.intervals).into();
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
                    if depends_on_past {
                        succeeded_by_end.insert(interval.end.timestamp(), state == RunState::Succeeded);
                    }
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
    // The run is recorded with its first try (one commit), and its end with its last try's.
    let mut run_id = None;
    let mut state = RunState::Succeeded;
    let mut error = None;
    let tasks = &shared.spec.dag.tasks;
    for (i, task) in tasks.iter().enumerate() {
        let (end, last_try) =
            tries::run_task(&shared, task, interval, &mut run_id, &mut stop).await?;
        let ends_run = match end {
            TaskEnd::Succeeded => i + 1 == tasks.len(),
            TaskEnd::Failed(e) => {
                state = RunState::Failed;
                error = Some(format!("task `{}` failed: {e}", task.id));
                true
            }
            TaskEnd::Rejected(reason) => {
                state = RunState::Rejected;
                error = Some(format!("task `{}` rejected: {reason}", task.id));
                true
            }
            TaskEnd::Cancelled => {
                state = RunState::Cancelled;
                error = Some(format!("cancelled during task `{}`", task.id));
                true
            }
        };
        let Some(run) = run_id else {
            // Stopped before anything started: the interval stays planned, for `resume`.
            return Ok((interval, RunState::Cancelled));
        };
        let run_end = ends_run.then(|| (state, error.clone()));
        tries::record_end(&shared, run, last_try, run_end).await?;
        if ends_run {
            break;
        }
    }
    if let Some(run_id) = run_id {
        let _ = shared.events.send(Event::IntervalFinished {
            interval,
            run_id,
            state,
            elapsed: began.elapsed(),
            error,
        });
    }
    Ok((interval, state))
}
