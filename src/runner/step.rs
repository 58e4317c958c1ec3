//! One command of a try (the task's own command, its `publish` or its `source_count`): rendered,
//! run in its own process group under the task's timeout and the backfill's stop, and judged by
//! its exit. A command that cannot be started for want of descriptors, memory or processes,
//! or whose output cannot be written to its log (a full or unwritable log folder), interrupts
//! the try and stops the backfill (see [`crate::environment`]): its exit, whatever it was,
//! cannot be told from the machine's failure, and its log would be missing from its record.

use tokio::sync::watch;

use super::outcome::{Outcome, TryInput, cancelled, failed, timed_out};
use super::{Shared, Stop};

use crate::exit::Error;
use crate::process::{self, Ended};
use crate::project::{CommandSpec, Task};
use crate::task::command;

/// Starts a command behind its gate, records its process group, lets it go and supervises it
/// to its end; `recorded` is the command spawned already, its group recorded with its try's
/// start (see [`super::tries`]). `Err` inside is the try's outcome when the command could not
/// be started, or its log not written.
#[expect(
    clippy::too_many_arguments,
    reason = "the command's parts, each used once; a struct would only rename them"
)]
pub(super) async fn run_process(
    shared: &Shared,
    try_id: i64,
    program: &process::Program,
    env: &[(String, String)],
    output: process::Output,
    task: &Task,
    recorded: Option<process::Gated>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Result<Ended, Outcome>, Error> {
    let owner = shared.spec.owner;
    let gated = match recorded {
        Some(gated) => gated,
        None => {
            crate::fault::point("before-spawn");
            let gated = match process::spawn(program, env, &shared.spec.project_root, output).await
            {
                Ok(s) => s,
                Err(e) => return Ok(Err(not_started(shared, program, &e))),
            };
            crate::fault::point("after-spawn");
            let (group, host) = (gated.group, shared.spec.host.clone());
            let recorded = shared
                .writer
                .call_step(move |c| c.set_try_group(c.fence(owner)?, try_id, group, &host))
                .await;
            match recorded {
                Ok(true) => gated,
                Ok(false) => {
                    gated.discard().await;
                    return Ok(Ok(Ended::Cancelled));
                }
                Err(e) => {
                    gated.discard().await;
                    return Err(e.into());
                }
            }
        }
    };
    let group = gated.group;
    crate::fault::point("before-release");
    tracing::debug!(
        backfill = owner.backfill_id,
        task = %task.id,
        try_id,
        pgid = group.pgid,
        "process group recorded; letting the try go"
    );
    let spawned = match gated.release().await {
        Ok(s) => s,
        Err(e) => return Ok(Err(not_started(shared, program, &e))),
    };
    let finished = process::finish(spawned, task.timeout, task.grace_period, stop)
        .await
        .map_err(|e| Error::io("cannot supervise a task", e))?;
    if let Some(lost) = &finished.log_failure {
        let what = format!("the log {}", lost.path.display());
        if let Some(fault) = crate::environment::Fault::of_io(&lost.error, &what, &lost.path) {
            return Ok(Err(shared.interrupted(&fault)));
        }
    }
    Ok(Ok(finished.ended))
}

/// The outcome of a try whose command could not be started: interrupted by an environment
/// fault (no descriptors, memory or processes left), or failed (a program that cannot be
/// executed).
fn not_started(shared: &Shared, program: &process::Program, e: &std::io::Error) -> Outcome {
    let what = format!("cannot start `{}`", program.name());
    match crate::environment::Fault::of_spawn(e, &what) {
        Some(fault) => shared.interrupted(&fault),
        None => failed(format!("{what}: {}", crate::limits::io(e)), None),
    }
}

/// Maps how a process ended to a failure, or `None` when it succeeded.
fn unsuccessful(ended: &Ended, task: &Task) -> Option<Outcome> {
    match ended {
        Ended::Exited(status) if status.success() => None,
        Ended::Exited(status) => Some(failed(process::describe_exit(*status), status.code())),
        Ended::TimedOut => Some(failed(timed_out(task), None)),
        Ended::Cancelled => Some(cancelled("cancelled")),
    }
}

/// Renders and runs one command of a try (the task's own, `publish` or `source_count`) with its
/// output where `output` says, or lets go the one `recorded` (see [`run_process`]); `Err` is the
/// outcome when it did not succeed, its error prefixed by `what`.
#[expect(
    clippy::too_many_arguments,
    reason = "the command's parts, each used once; a struct would only rename them"
)]
pub(super) async fn run_step(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    output: process::Output,
    what: Option<&str>,
    recorded: Option<process::Gated>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Result<(), Outcome>, Error> {
    let program = match command::render(spec, &input.ctx) {
        Ok(p) => p,
        Err(e) => return Ok(Err(failed(e, None))),
    };
    let ended = match run_process(
        shared,
        input.try_id,
        &program,
        &input.env,
        output,
        task,
        recorded,
        stop,
    )
    .await?
    {
        Ok(ended) => ended,
        Err(outcome) => return Ok(Err(outcome)),
    };
    Ok(match (unsuccessful(&ended, task), what) {
        (None, _) => Ok(()),
        (Some(Outcome::Failed(mut r)), Some(what)) => {
            r.error = r.error.map(|e| format!("{what} failed: {e}"));
            Err(Outcome::Failed(r))
        }
        (Some(other), _) => Err(other),
    })
}
