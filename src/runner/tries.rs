//! The tries of one task, and command tasks: each try is recorded before it starts and when it
//! ends. A command's process group is recorded before it is let go (see [`crate::process`]),
//! so that whoever takes over can always kill it. Gated command tasks report their row count,
//! are judged, and run their `publish` command only after the gate passed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::outcome::{Outcome, TaskEnd, TryInput, apply_verdict, cancelled, failed, rules, staged};
use super::record::{Claimed, LastTry, Published, published_and_history, start_claiming};
use super::sql_try::sql_try;
use super::step::run_step;
use super::{Event, Shared, Stop};
use crate::clock::End;
use crate::exit::Error;
use crate::gate::{self, Measures, Verdict};
use crate::interval::DataInterval;
use crate::manifest::TryRecord;
use crate::manifest::queries::Seen;
use crate::project::{CommandSpec, Gate, SourceCount, Task, TaskKind};
use crate::state::TryState;
use crate::task::cleanup;
use crate::task::command::{self, TaskResult};
use crate::task::template::IntervalValues;

/// The error of a try stopped while it waited for a slot of its pool.
const STOPPED_IN_POOL: &str = "stopped while waiting for a slot of its pool";

/// Longest wait between two tries, whatever the backoff computes.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// Runs the tries of one task until one succeeds, is rejected, the retries are used up, or a
/// stop. Starts the run with the first try when `run_id` is `None`. The final try is returned
/// unrecorded, for [`super::record::record_end`].
pub(super) async fn run_task(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: &mut Option<i64>,
    stop: &mut watch::Receiver<Stop>,
    batch: Option<&Arc<super::batch::Batch>>,
) -> Result<(TaskEnd, Option<LastTry>), Error> {
    use tracing::Instrument;
    // Every diagnostic of the task's tries carries the backfill, DAG, interval and task.
    let span = tracing::info_span!(
        "task",
        backfill = shared.spec.owner.backfill_id,
        dag = %shared.spec.dag.id,
        interval = %interval,
        task = %task.id,
    );
    match &shared.spec.mode {
        super::Mode::Promote(staged) | super::Mode::PromoteAtomic(staged) => {
            let staged = staged.get(&(interval.start.timestamp(), task.id.clone()));
            super::promote::promote_task(shared, task, interval, run_id, staged, stop)
                .instrument(span)
                .await
        }
        super::Mode::Rollback(only) => {
            let chosen = only.as_ref().is_none_or(|o| o.contains(&task.id));
            match &task.kind {
                TaskKind::Sql(sql) if chosen => {
                    super::rollback::rollback_task(shared, task, sql, interval, run_id)
                        .instrument(span)
                        .await
                }
                _ => Ok((TaskEnd::Skipped, None)),
            }
        }
        super::Mode::Run | super::Mode::Stage => {
            tries(shared, task, interval, run_id, stop, batch)
                .instrument(span)
                .await
        }
    }
}

async fn tries(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: &mut Option<i64>,
    stop: &mut watch::Receiver<Stop>,
    batch: Option<&Arc<super::batch::Batch>>,
) -> Result<(TaskEnd, Option<LastTry>), Error> {
    let spec = &shared.spec;
    let values = IntervalValues::new(interval, spec.dag.tz);
    let attempts = task.retries.saturating_add(1);
    let mut last_error = String::new();
    for try_number in 1..=attempts {
        // A run not started yet starts no more once the process winds down; a started one
        // goes on to its end, retries included.
        if *stop.borrow() != Stop::Run || (run_id.is_none() && shared.winding_down()) {
            return Ok((TaskEnd::Cancelled, None));
        }
        let (started, recorded) =
            match claim(shared, task, interval, &values, *run_id, try_number, batch).await? {
                Ok(claimed) => claimed,
                Err(end) => return Ok((end, None)),
            };
        if run_id.is_none() {
            *run_id = Some(started.run_id);
            let _ = shared.events.send(Event::IntervalStarted {
                interval,
                run_id: started.run_id,
            });
        }
        let log_text = started.log.display().to_string();
        let run_id_text = started.run_id.to_string();
        let ctx = values.context(&spec.dag.id, &task.id, &run_id_text, try_number, &spec.conf);
        let env = try_environment(shared, &ctx, &started.result);
        let input = TryInput {
            try_id: started.try_id,
            interval,
            env,
            ctx,
            log_path: started.log,
            result_path: started.result,
            audit_path: started.audit,
            batch: batch.filter(|_| try_number == 1).cloned(),
            may_retry: try_number < attempts,
        };
        let outcome = attempt(shared, task, &input, recorded, stop).await?;
        let (record, end, published) = match outcome {
            Outcome::Succeeded(r, p) => (r, Some(TaskEnd::Succeeded), p),
            Outcome::Rejected(r, reason) => (r, Some(TaskEnd::Rejected(reason)), None),
            Outcome::Cancelled(r) => (r, Some(TaskEnd::Cancelled), None),
            Outcome::Failed(r) => {
                last_error = r.error.clone().unwrap_or_default();
                (r, None, None)
            }
        };
        let last = LastTry {
            try_id: input.try_id,
            task_id: task.id.clone(),
            interval,
            record,
            published,
        };
        if let Some(end) = end {
            return Ok((end, Some(last)));
        }
        let will_retry = try_number < attempts;
        let _ = shared.events.send(Event::TryFailed {
            interval,
            task_id: task.id.clone(),
            try_number,
            error: last_error.clone(),
            will_retry,
            log_path: log_text,
            log_tail: command::log_tail(&input.log_path, 20),
        });
        if !will_retry {
            return Ok((TaskEnd::Failed(last_error), Some(last)));
        }
        tracing::info!(
            backfill = spec.owner.backfill_id,
            dag = %spec.dag.id,
            task = %task.id,
            interval = %interval,
            try_number,
            error = %last_error,
            "retrying"
        );
        let (try_id, record, owner) = (last.try_id, last.record, spec.owner);
        let began = shared.marks.try_end(try_id);
        shared
            .writer
            .call(move |c| c.finish_try(c.fence(owner)?, try_id, &record, End::since(began)))
            .await?;
        if !wait_before_retry(task.retry_delay, try_number, stop).await {
            return Ok((TaskEnd::Cancelled, None));
        }
    }
    Ok((TaskEnd::Failed(last_error), None))
}

/// Claims try `try_number` of the task for `interval` (the first try of an interval of a batch
/// may run the batch's command, not its own): the try started, with what an early start of its
/// command recorded; or how the task ends when it cannot start.
async fn claim(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    values: &IntervalValues,
    run_id: Option<i64>,
    try_number: u32,
    batch: Option<&Arc<super::batch::Batch>>,
) -> Result<Result<(super::record::Started, Option<crate::process::Gated>), TaskEnd>, Error> {
    let early = match batch {
        Some(_) if try_number == 1 => None,
        _ => early_start(shared, task, interval, values, run_id, try_number).await?,
    };
    let (claimed, recorded) = match early {
        Some(early) => early,
        None => (
            start_claiming(shared, task, interval, run_id, try_number, None, None).await?,
            None,
        ),
    };
    Ok(match claimed {
        Claimed::Started(s) => {
            if let Some(b) = batch {
                shared.batch_began(b);
            }
            Ok((s, recorded))
        }
        Claimed::UpstreamNotReady => Err(TaskEnd::UpstreamNotReady),
        Claimed::TakenOver | Claimed::Gone | Claimed::Busy | Claimed::Halted | Claimed::Stale => {
            Err(TaskEnd::Cancelled)
        }
    })
}

/// Runs one started try (once it holds a slot of its pool): its outcome, saying what
/// environment fault stopped it and which batch computed it, once its cleanup ran.
async fn attempt(
    shared: &Shared,
    task: &Task,
    input: &TryInput<'_>,
    mut recorded: Option<crate::process::Gated>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Outcome, Error> {
    let interval = input.interval;
    let slot = match &task.pool {
        Some(pool) => Some(take_slot(shared, task, pool, input.try_id, interval, stop).await?),
        None => None,
    };
    let mut outcome = match (&task.kind, slot) {
        (_, Some(false)) => cancelled(STOPPED_IN_POOL),
        (TaskKind::Command(command_spec), _) => {
            command_try(shared, task, command_spec, input, recorded.take(), stop).await?
        }
        (TaskKind::Sql(sql), _) => sql_try(shared, task, sql, input, stop).await?,
    };
    // A try stopped because the backfill met an environment fault says what it was.
    if let (Outcome::Cancelled(r), Some(fault)) = (&mut outcome, shared.fault())
        && matches!(r.error.as_deref(), Some("cancelled" | STOPPED_IN_POOL))
    {
        r.error = Some(super::interrupted_by(&fault));
    }
    if let Some(batch) = &input.batch {
        outcome.record_mut().batch = batch.took(interval);
    }
    let why = match &outcome {
        Outcome::Succeeded(..) => None,
        Outcome::Rejected(..) => Some(cleanup::Why::Rejected),
        Outcome::Failed(..) => Some(cleanup::Why::Failed),
        Outcome::Cancelled(..) => Some(cleanup::Why::Cancelled),
    };
    if let (Some(why), Some(spec)) = (why, &task.cleanup) {
        clean_up(shared, task, spec, input, why).await;
    }
    Ok(outcome)
}

/// The environment of a try: `BACKFILL_*`, and `BACKFILL_STAGE` when its output will wait for
/// `backfill promote` (a task may keep it apart).
fn try_environment(
    shared: &Shared,
    ctx: &crate::task::template::Context<'_>,
    result: &std::path::Path,
) -> Vec<(String, String)> {
    let mut env = command::environment(ctx, &shared.conf_text, result);
    if matches!(shared.spec.mode, super::Mode::Stage) {
        env.push(("BACKFILL_STAGE".into(), "1".into()));
    }
    env
}

/// Starts a run whose first try's command is spawned first, behind its gate, so that the run,
/// the try and its process group are recorded in one commit rather than two (each a round trip
/// to a PostgreSQL manifest). The run's id, which the command's environment and log path name,
/// is one reserved beforehand (see [`crate::manifest::runs::reserve_run_ids`]). Only where the
/// command is the try's first process (no pool slot, no source command before it). `None`:
/// start as usual (a SQLite manifest, which reserves no id; a backfill with no room for the
/// run yet; or a command that cannot be rendered or spawned, whose failure the usual start
/// records).
async fn early_start(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    values: &IntervalValues,
    run_id: Option<i64>,
    try_number: u32,
) -> Result<Option<(Claimed, Option<crate::process::Gated>)>, Error> {
    let spec = &shared.spec;
    let TaskKind::Command(command_spec) = &task.kind else {
        return Ok(None);
    };
    let by_command = |s: &Option<SourceCount>| matches!(s, Some(SourceCount::Command(_)));
    let sources_first = task
        .gate
        .as_ref()
        .is_some_and(|g| by_command(&g.source_count) || by_command(&g.source_fingerprint));
    if run_id.is_some() || task.pool.is_some() || sources_first {
        return Ok(None);
    }
    // A stale id (see [`Claimed::Stale`]) once: the next is reserved after every recorded run.
    for _ in 0..2 {
        let Some(reserved) = shared.reserved_run_id().await? else {
            return Ok(None);
        };
        let run_text = reserved.to_string();
        let ctx = values.context(&spec.dag.id, &task.id, &run_text, try_number, &spec.conf);
        let (log, result) = command::try_paths(
            &spec.logs_dir,
            &spec.dag.id,
            interval.start,
            &task.id,
            reserved,
            try_number,
        );
        let env = try_environment(shared, &ctx, &result);
        let Ok(program) = command::render(command_spec, &ctx) else {
            return Ok(None);
        };
        let output = crate::process::Output::Log(log);
        crate::fault::point("before-spawn");
        let Ok(gated) = crate::process::spawn(&program, &env, &spec.project_root, output).await
        else {
            return Ok(None);
        };
        crate::fault::point("after-spawn");
        let early = crate::manifest::runs::Early {
            run_id: reserved,
            group: gated.group,
        };
        let claimed =
            start_claiming(shared, task, interval, None, try_number, None, Some(early)).await;
        match claimed {
            Ok(Claimed::Started(started)) => {
                return Ok(Some((Claimed::Started(started), Some(gated))));
            }
            Ok(Claimed::Stale) => {
                gated.discard().await;
                shared.forget_reserved_run_ids().await;
            }
            // No room yet: it waits for one the usual way, without a process at its gate.
            Ok(Claimed::Busy) => {
                gated.discard().await;
                return Ok(None);
            }
            Ok(other) => {
                gated.discard().await;
                return Ok(Some((other, None)));
            }
            Err(e) => {
                gated.discard().await;
                return Err(e);
            }
        }
    }
    Ok(None)
}

async fn command_try(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    recorded: Option<crate::process::Gated>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Outcome, Error> {
    // The first try of an interval of a batch takes what the batch's one run of the command
    // reported for it, and the source as the batch measured it before the command.
    let mut notes = Vec::new();
    let share = match &input.batch {
        Some(batch) => {
            batch
                .share_of(input.interval, &mut notes, |intervals| {
                    batch_command(shared, task, spec, input, intervals, stop.clone())
                })
                .await
        }
        None => super::batch::Share::Own,
    };
    if !notes.is_empty() {
        append_log(&input.log_path, &notes).await;
    }
    let (result, before) = match share {
        super::batch::Share::Cancelled => return Ok(cancelled("cancelled")),
        super::batch::Share::Of(super::batch::Rows::Command(rows), k) => {
            let result = rows.reported.get(k).cloned().flatten();
            let before = rows.before.get(k).cloned().flatten();
            // The try's result file says what was reported for its interval, as if its own
            // command had written it (a staged try's publish command reads it).
            let (path, json) = (
                input.result_path.clone(),
                result.as_ref().and_then(|r| serde_json::to_string(r).ok()),
            );
            let _ = tokio::task::spawn_blocking(move || match json {
                Some(json) => std::fs::write(&path, json),
                None => std::fs::remove_file(&path).or(Ok(())),
            })
            .await;
            (result, before)
        }
        super::batch::Share::Of(super::batch::Rows::Sql(_), _) | super::batch::Share::Own => {
            // The source as the command will find it: what its output is judged against and
            // what `changed` and `stale` compare with later. Measured again after the command.
            let before = match &task.gate {
                Some(gate) => match measure_source(shared, task, gate, input, stop).await? {
                    Ok(seen) => Some(seen),
                    Err(outcome) => return Ok(outcome),
                },
                None => None,
            };
            if let Err(outcome) = run_step(
                shared,
                task,
                spec,
                input,
                crate::process::Output::Log(input.log_path.clone()),
                None,
                recorded,
                stop,
            )
            .await?
            {
                return Ok(outcome);
            }
            match command::read_result(&input.result_path) {
                Ok(r) => (r, before),
                Err(e) => return Ok(failed(e, Some(0))),
            }
        }
    };
    let mut record = TryRecord::new(TryState::Succeeded);
    record.exit_code = Some(0);
    if let Some(r) = &result {
        let json = |v: &Option<Vec<serde_json::Value>>| {
            v.as_ref()
                .map(|v| serde_json::Value::Array(v.clone()).to_string())
        };
        record.rows = r.rows;
        record.partitions = json(&r.partitions);
        record.inputs = json(&r.inputs);
        record.fingerprint = r.fingerprint.clone();
    }
    let (Some(gate), Some(before)) = (&task.gate, before) else {
        return Ok(Outcome::Succeeded(record, None));
    };
    gated_command(shared, task, gate, input, result, record, before, stop).await
}

/// Runs a command task's command once for a batch of `intervals`, in the try `input` (whose
/// log, result file and process group it uses): its templates and `BACKFILL_*` variables see
/// the batch's whole range, and `BACKFILL_BATCH` lists its intervals; its result file reports
/// per interval (see [`super::batch::read_reported`]).
async fn batch_command(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    intervals: Vec<DataInterval>,
    mut stop: watch::Receiver<Stop>,
) -> super::batch::Computed {
    use super::batch::Computed;
    let tz = shared.spec.dag.tz;
    let Some(whole) = DataInterval::span(&intervals) else {
        return Computed::Failed("a batch of no intervals".into());
    };
    let values = IntervalValues::new(whole, tz);
    let ctx = values.context(
        &shared.spec.dag.id,
        &task.id,
        input.ctx.run_id,
        input.ctx.try_number,
        &shared.spec.conf,
    );
    // Each interval's source, before the command: what its gate compares the source after the
    // command with, as a try of its own would.
    let mut before = Vec::with_capacity(intervals.len());
    for interval in &intervals {
        let Some(gate) = &task.gate else {
            before.push(None);
            continue;
        };
        let values = IntervalValues::new(*interval, tz);
        let ctx = values.context(
            &shared.spec.dag.id,
            &task.id,
            input.ctx.run_id,
            input.ctx.try_number,
            &shared.spec.conf,
        );
        let one = TryInput {
            try_id: input.try_id,
            interval: *interval,
            env: try_environment(shared, &ctx, &input.result_path),
            ctx,
            log_path: input.log_path.clone(),
            result_path: input.result_path.clone(),
            audit_path: None,
            batch: None,
            may_retry: input.may_retry,
        };
        match measure_source(shared, task, gate, &one, &mut stop).await {
            Ok(Ok(seen)) => before.push(Some(seen)),
            Ok(Err(Outcome::Cancelled(_))) => return Computed::Cancelled,
            Ok(Err(outcome)) => {
                let mut outcome = outcome;
                let error = outcome.record_mut().error.take();
                return Computed::Failed(format!(
                    "the source of {}: {}",
                    crate::interval::Rfc3339(interval.start),
                    error.unwrap_or_else(|| "its source command failed".into())
                ));
            }
            Err(e) => return Computed::Failed(e.to_string()),
        }
    }
    let mut env = try_environment(shared, &ctx, &input.result_path);
    env.push((
        "BACKFILL_BATCH".into(),
        super::batch::intervals_json(&intervals, tz),
    ));
    let run = TryInput {
        try_id: input.try_id,
        interval: whole,
        env,
        ctx,
        log_path: input.log_path.clone(),
        result_path: input.result_path.clone(),
        audit_path: None,
        batch: None,
        may_retry: input.may_retry,
    };
    let step = run_step(
        shared,
        task,
        spec,
        &run,
        crate::process::Output::Log(run.log_path.clone()),
        None,
        None,
        &mut stop,
    )
    .await;
    let path = run.result_path.clone();
    let failed = match step {
        Ok(Ok(())) => None,
        Ok(Err(Outcome::Cancelled(_))) => Some(Computed::Cancelled),
        Ok(Err(Outcome::Failed(r) | Outcome::Rejected(r, _) | Outcome::Succeeded(r, _))) => Some(
            Computed::Failed(r.error.unwrap_or_else(|| "the command failed".into())),
        ),
        Err(e) => Some(Computed::Failed(e.to_string())),
    };
    let read = tokio::task::spawn_blocking(move || {
        let read = match failed {
            Some(f) => Err(f),
            None => super::batch::read_reported(&path, &intervals, tz).map_err(Computed::Failed),
        };
        if read.is_err() {
            // What a failed batch wrote is no interval's: the try's own run writes it anew.
            let _ = std::fs::remove_file(&path);
        }
        read
    })
    .await;
    let computed = match read {
        Ok(Ok(reported)) => Computed::Done(super::batch::Rows::Command(Arc::new(
            super::batch::CommandRows { reported, before },
        ))),
        Ok(Err(computed)) => computed,
        Err(e) => Computed::Failed(format!("reading the result file panicked: {e}")),
    };
    // What a batch's command left of its work when it failed, was stopped or reported what
    // cannot be read is cleaned up as a try's would be, with the batch's values.
    let why = match &computed {
        Computed::Done(_) => None,
        Computed::Cancelled => Some(cleanup::Why::Cancelled),
        Computed::Failed(_) => Some(cleanup::Why::Failed),
    };
    if let (Some(why), Some(cleanup)) = (why, &task.cleanup) {
        clean_up(shared, task, cleanup, &run, why).await;
    }
    computed
}

/// Appends `lines` to a try's log.
async fn append_log(path: &std::path::Path, lines: &[String]) {
    let (path, text) = (path.to_path_buf(), lines.join("\n") + "\n");
    let _ = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
    })
    .await;
}

/// What a command task's gate `source_count` and `source_fingerprint` commands give for the
/// try's interval now (`None` for a key the gate does not set).
async fn measure_source(
    shared: &Shared,
    task: &Task,
    gate: &Gate,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Result<Seen, Outcome>, Error> {
    let source_rows = match &gate.source_count {
        Some(SourceCount::Command(spec)) => {
            match source_command(shared, task, spec, input, "source_count", stop).await? {
                Ok(text) => match text.parse::<i64>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        return Ok(Err(failed(
                            format!(
                                "source_count command printed `{}`, not one integer",
                                text.chars().take(200).collect::<String>()
                            ),
                            None,
                        )));
                    }
                },
                Err(outcome) => return Ok(Err(outcome)),
            }
        }
        Some(SourceCount::Sql(_)) | None => None,
    };
    let source_fingerprint = match &gate.source_fingerprint {
        Some(SourceCount::Command(spec)) => {
            match source_command(shared, task, spec, input, "source_fingerprint", stop).await? {
                Ok(text) => Some(text),
                Err(outcome) => return Ok(Err(outcome)),
            }
        }
        Some(SourceCount::Sql(_)) | None => None,
    };
    Ok(Ok(Seen {
        source_rows,
        source_fingerprint,
    }))
}

/// The gate of a command task: rows from the result file, the source as measured before the
/// command (and again after it: a source that moved while the command ran fails the try, as
/// its output may hold part of the change), then the optional `publish` command.
#[expect(
    clippy::too_many_arguments,
    reason = "the try's parts, each used once; a struct would only rename them"
)]
async fn gated_command(
    shared: &Shared,
    task: &Task,
    gate: &Gate,
    input: &TryInput<'_>,
    result: Option<TaskResult>,
    mut record: TryRecord,
    before: Seen,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Outcome, Error> {
    let Some(rows) = result.and_then(|r| r.rows) else {
        return Ok(failed(
            format!(
                "task `{}` has a gate but reported no row count; write {{\"rows\": N}} to $BACKFILL_RESULT",
                task.id
            ),
            Some(0),
        ));
    };
    let after = match measure_source(shared, task, gate, input, stop).await? {
        Ok(seen) => seen,
        Err(outcome) => return Ok(outcome),
    };
    if let Some(moved) = crate::probe::changed(gate, &before, &after) {
        return Ok(failed(
            format!(
                "the source changed while the task ran ({moved}): its output cannot be matched to one state of the source; run it again"
            ),
            Some(0),
        ));
    }
    let Seen {
        source_rows: source,
        source_fingerprint,
    } = before;
    let mut found = Vec::new();
    for rule in &gate.rules {
        let crate::project::RuleKind::Command(spec) = &rule.kind else {
            continue;
        };
        let key = format!("check \"{}\"", rule.name);
        let text = match source_command(shared, task, spec, input, "check", stop).await? {
            Ok(text) => text,
            Err(outcome) => return Ok(outcome),
        };
        let violations = match text.parse::<i64>() {
            Ok(n) if n >= 0 => n,
            _ => {
                return Ok(failed(
                    format!(
                        "{key}: its command printed `{}`, not the number of violations (a whole number of at least 0)",
                        text.chars().take(200).collect::<String>()
                    ),
                    Some(0),
                ));
            }
        };
        found.push(gate::Found {
            what: crate::warehouse::rules::what(rule),
            severity: rule.severity,
            violations,
            of_rows: None,
            samples: Vec::new(),
        });
    }
    let (current, history) = published_and_history(shared, task, input.interval).await?;
    let published = current.map(|c| c.rows);
    let measures = Measures {
        merge: None,
        rows,
        outside: None,
        outside_values: Vec::new(),
        duplicate_keys: None,
        source,
        published,
        mixed: None,
        elsewhere: None,
        constraint: None,
        found,
        history,
    };
    let rules = rules(Some(gate), shared.spec.allow_drift);
    let verdict = match gate::judge(&measures, &rules) {
        Ok(v) => v,
        Err(why) => return Ok(failed(why, Some(0))),
    };
    apply_verdict(&mut record, &verdict, source, published);
    record.source_fingerprint = source_fingerprint;
    if let Verdict::Reject(reason) = verdict {
        record.state = TryState::Rejected;
        return Ok(Outcome::Rejected(record, reason));
    }
    let (warnings, notes) = (gate::warnings(&measures), gate::notes(&measures, &rules));
    super::outcome::warn(shared, task, input.interval, &mut record, &warnings, &notes);
    if matches!(shared.spec.mode, super::Mode::Stage) {
        // `publish` waits for `backfill promote`; the result file stays with the try.
        return Ok(staged(record, &input.result_path));
    }
    if let Some(publish) = &task.publish
        && let Err(outcome) = run_step(
            shared,
            task,
            publish,
            input,
            crate::process::Output::Log(input.log_path.clone()),
            Some("publish command"),
            None,
            stop,
        )
        .await?
    {
        return Ok(outcome);
    }
    let fingerprint = record.fingerprint.clone();
    Ok(Outcome::Succeeded(
        record,
        Some(Published {
            rows,
            fingerprint,
            recorded: false,
        }),
    ))
}

/// Runs the task's `cleanup` after a try whose output will not be published; a cleanup that
/// fails is a warning in the try's log and the diagnostics, never a change to the try's end.
async fn clean_up(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    why: cleanup::Why,
) {
    let result = match command::render(spec, &input.ctx) {
        Ok(program) => {
            cleanup::run(
                &program,
                &input.env,
                why,
                &shared.spec.project_root,
                &input.log_path,
                task.timeout,
                task.grace_period,
            )
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        tracing::warn!(
            backfill = shared.spec.owner.backfill_id,
            task = %task.id,
            try_id = input.try_id,
            "cleanup command failed: {e}"
        );
        if let Ok(mut log) = crate::process::open_log(&input.log_path) {
            use std::io::Write;
            let _ = writeln!(log, "backfill: cleanup command failed: {e}");
        }
    }
}

/// Runs a `source_count` or `source_fingerprint` command and reads what it prints, trimmed.
async fn source_command(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    key: &str,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Result<String, Outcome>, Error> {
    let out = input.log_path.with_extension(format!("{key}.out"));
    let _ = std::fs::remove_file(&out);
    let what = format!("{key} command");
    // Its stdout is its answer; what it says on stderr goes to the try's log.
    let output = crate::process::Output::Split {
        stdout: out.clone(),
        stderr: input.log_path.clone(),
    };
    if let Err(outcome) =
        run_step(shared, task, spec, input, output, Some(&what), None, stop).await?
    {
        return Ok(Err(outcome));
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    Ok(Ok(text.trim().to_string()))
}

/// How often a try waiting for a pool slot asks again.
const POOL_POLL: Duration = Duration::from_millis(200);

/// Waits until the try holds a slot of `pool` (`true`), or a stop (`false`), and a start of its
/// rate if it has one. A slot is freed by the end of the try that holds it (see
/// [`crate::manifest::pools`]).
async fn take_slot(
    shared: &Shared,
    task: &Task,
    pool: &str,
    try_id: i64,
    interval: DataInterval,
    stop: &mut watch::Receiver<Stop>,
) -> Result<bool, Error> {
    let limits = crate::manifest::pools::Limits {
        size: shared.spec.pools.get(pool).copied().unwrap_or(1),
        rate: shared
            .spec
            .pool_rates
            .get(pool)
            .map(|r| (r.starts, r.per_ms())),
    };
    let ctx =
        crate::manifest::leases::LeaseCtx::new(shared.spec.lease_timeout, &crate::process::LOCAL);
    let owner = shared.spec.owner;
    let mut waiting = false;
    let got = loop {
        let (p, c) = (pool.to_string(), ctx.refreshed());
        let taken = shared
            .writer
            .call(move |conn| conn.take_pool_slot(conn.fence(owner)?, &p, limits, try_id, &c))
            .await?;
        let mut pause = POOL_POLL;
        let mut rate = false;
        match taken {
            crate::manifest::pools::Take::Taken => break true,
            crate::manifest::pools::Take::Full => {}
            crate::manifest::pools::Take::Rate { wait_ms } => {
                // Asked again when the window has room, at most a second later.
                rate = true;
                pause = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1).clamp(1, 1000));
            }
            crate::manifest::pools::Take::Kill(groups) => {
                // Tries of a gone owner still run: they hold their slots until they are dead.
                tracing::warn!(
                    pool,
                    groups = groups.len(),
                    "killing the tries of a gone backfill that still hold slots of the pool"
                );
                let _ = tokio::task::spawn_blocking(move || {
                    for g in groups {
                        crate::process::kill_group(g, std::time::Duration::from_secs(5));
                    }
                })
                .await;
                continue;
            }
        }
        if !waiting {
            waiting = true;
            let _ = shared.events.send(Event::PoolWait {
                interval,
                task_id: task.id.clone(),
                pool: pool.to_string(),
                waiting: true,
                rate,
            });
        }
        let sleep = tokio::time::sleep(pause);
        tokio::pin!(sleep);
        tokio::select! {
            () = &mut sleep => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() != Stop::Run {
            break false;
        }
    };
    if waiting {
        let _ = shared.events.send(Event::PoolWait {
            interval,
            task_id: task.id.clone(),
            pool: pool.to_string(),
            waiting: false,
            rate: false,
        });
    }
    Ok(got)
}

/// `retry_delay * 2^(try_number - 1)`, capped.
pub(crate) fn retry_delay(base: Duration, try_number: u32) -> Duration {
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
