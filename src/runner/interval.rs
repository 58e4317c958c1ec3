//! One interval: its tasks in `depends_on` order, each until it succeeds, is rejected or fails
//! after its retries; then the run's end.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::outcome::TaskEnd;
use super::record::record_end;
use super::tries::run_task;
use super::{Event, Shared, Stop};
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::plan::RunState;

/// Runs every task of one interval; records the run.
pub(super) async fn run(
    shared: Arc<Shared>,
    interval: DataInterval,
    mut stop: watch::Receiver<Stop>,
    mut slot: super::Slot,
    batch: Option<&Arc<super::batch::Batch>>,
) -> Result<(DataInterval, RunState), Error> {
    let began = Instant::now();
    // The run is recorded with its first try (one commit), and its end with its last try's.
    let mut run_id = None;
    let mut state = RunState::Succeeded;
    let mut error = None;
    let tasks = &shared.spec.dag.tasks;
    for (i, task) in tasks.iter().enumerate() {
        let (end, last_try) =
            run_task(&shared, task, interval, &mut run_id, &mut stop, batch).await?;
        if matches!(end, TaskEnd::UpstreamNotReady) {
            // Recorded as skipped in the commit that would have started the run.
            let reason = crate::plan::SkipReason::UpstreamNotSuccessful;
            let _ = shared
                .events
                .send(Event::IntervalSkipped { interval, reason });
            return Ok((interval, RunState::Cancelled));
        }
        let skipped = matches!(end, TaskEnd::Skipped);
        let ends_run = match end.run_end(&task.id, shared.fault()) {
            Some((ended, why)) => {
                state = ended;
                error = Some(why);
                true
            }
            None => i + 1 == tasks.len(),
        };
        let Some(run) = run_id else {
            if skipped && !ends_run {
                continue;
            }
            if skipped {
                // No task had anything to do (a promote of outputs promoted meanwhile).
                super::skip(&shared, interval, crate::plan::SkipReason::NothingStaged).await?;
                return Ok((interval, RunState::Succeeded));
            }
            // Stopped before anything started: the interval stays planned, for `resume`.
            return Ok((interval, RunState::Cancelled));
        };
        let run_end = ends_run.then(|| (state, error.clone()));
        let free = ends_run && state == RunState::Succeeded && shared.free_early;
        record_end(&shared, run, last_try, run_end, free.then_some(&mut slot)).await?;
        if ends_run {
            break;
        }
    }
    if run_id.is_some() {
        let _ = shared.events.send(Event::IntervalFinished {
            interval,
            state,
            elapsed: began.elapsed(),
            error,
        });
    }
    Ok((interval, state))
}
