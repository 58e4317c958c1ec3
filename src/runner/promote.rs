//! Promote: publishes the staged output of a task and interval. The gate judges it again
//! against what is published now (someone may have published since it was staged); a SQL
//! output then goes through the same crash-safe publish as any try (intent, one transaction,
//! recovery), its file checked against the staged fingerprint first. A command task runs its
//! `publish` command as the staged try would have.

use std::path::PathBuf;

use tokio::sync::watch;

use super::outcome::{
    Outcome, TaskEnd, TryInput, apply_verdict, failed, rules, settle, start_single,
};
use super::record::{Claimed, LastTry, Published, Started, published_try};
use super::sql_try::{ToPublish, TryLog, publish_audited};
use super::step::run_step;
use super::{Shared, StagedTry, Stop};
use crate::exit::Error;
use crate::gate::{self, Measures, Verdict};
use crate::interval::DataInterval;
use crate::manifest::TryRecord;
use crate::project::{SqlTask, Task, TaskKind};
use crate::state::TryState;
use crate::task::command;
use crate::task::template::IntervalValues;

/// Promotes one task of an interval: one try, never retried (a failed promote leaves the output
/// staged, for the next `promote`).
pub(super) async fn promote_task(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: &mut Option<i64>,
    staged: Option<&StagedTry>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<(TaskEnd, Option<LastTry>), Error> {
    let Some(staged) = staged else {
        // Nothing of this task is staged for the interval (or it was promoted already).
        return Ok((TaskEnd::Skipped, None));
    };
    if *stop.borrow() != Stop::Run {
        return Ok((TaskEnd::Cancelled, None));
    }
    let started = match start_single(shared, task, interval, run_id, Some(staged.try_id)).await? {
        Claimed::Started(s) => s,
        // Promoted or discarded since this promote read the staged outputs.
        Claimed::Gone => return Ok((TaskEnd::Skipped, None)),
        Claimed::TakenOver | Claimed::Busy | Claimed::Halted | Claimed::Stale => {
            return Ok((TaskEnd::Cancelled, None));
        }
        Claimed::UpstreamNotReady => return Ok((TaskEnd::UpstreamNotReady, None)),
    };
    let outcome = match &task.kind {
        TaskKind::Sql(sql) => promote_sql(shared, task, sql, interval, &started, staged).await?,
        TaskKind::Command(_) => {
            promote_command(shared, task, interval, &started, staged, stop).await?
        }
    };
    Ok(settle(shared, outcome, &started, task, interval))
}

/// The staged measures judged again, against the rows published now.
pub(super) fn judge_again(
    shared: &Shared,
    task: &Task,
    staged: &StagedTry,
    published: Option<i64>,
    merge: Option<gate::Merge>,
) -> Result<(TryRecord, Verdict), Box<Outcome>> {
    let s = &staged.record;
    let Some(rows) = s.rows else {
        return Err(Box::new(failed(
            format!("staged try {} recorded no row count", staged.try_id),
            None,
        )));
    };
    let measures = Measures {
        // What merging it into the partition as it is now would do (`max_changed`).
        merge,
        rows,
        outside: None,
        outside_values: Vec::new(),
        duplicate_keys: None,
        source: s.source_rows,
        published,
        mixed: None,
        elsewhere: None,
        constraint: None,
        // The rules on values and the history judged the output when it was staged (its rows
        // have not changed since: promote checks its fingerprint).
        found: Vec::new(),
        history: None,
    };
    let verdict = gate::judge(
        &measures,
        &rules(task.gate.as_ref(), shared.spec.allow_drift),
    )
    .map_err(|why| Box::new(failed(why, None)))?;
    let mut record = TryRecord::new(TryState::Succeeded);
    record.rows = Some(rows);
    record.fingerprint = s.fingerprint.clone();
    apply_verdict(&mut record, &verdict, s.source_rows, published);
    // What the gate warned of and noted when it staged the output stays with the try that
    // publishes it: the staged try's reasons after its verdict's own (`empty source`, judged
    // again above).
    let kept = s.reasons.as_deref().map(|r| {
        r.strip_prefix(
            crate::gate::Verdict::PublishEmpty
                .reason()
                .unwrap_or_default(),
        )
        .map_or(r, |rest| rest.trim_start_matches("; "))
    });
    if let Some(kept) = kept.filter(|k| !k.is_empty()) {
        super::outcome::add_reasons(&mut record, "", &[kept.to_string()]);
    }
    record.source_fingerprint = s.source_fingerprint.clone();
    record.promoted_from = Some(staged.try_id);
    if let Verdict::Reject(reason) = &verdict {
        record.state = TryState::Rejected;
        return Err(Box::new(Outcome::Rejected(record, reason.clone())));
    }
    Ok((record, verdict))
}

async fn promote_sql(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    interval: DataInterval,
    started: &Started,
    staged: &StagedTry,
) -> Result<Outcome, Error> {
    let mut log = TryLog::open(&started.log);
    log.line(&format!(
        "promoting the output staged by try {} ({})",
        staged.try_id, staged.path
    ));
    let reopened = crate::warehouse::backend_of(&sql.warehouse).staged(
        sql,
        &staged.path,
        &crate::manifest::identity(&shared.spec.manifest_path)?,
        started.try_id,
    );
    let Some(output) = reopened else {
        let error = format!(
            "the staged output {} is gone; stage the interval again",
            staged.path
        );
        log.line(&error);
        return Ok(failed(error, None));
    };
    let current = published_try(shared, task, interval).await?;
    let repr = shared
        .reprs
        .lock()
        .ok()
        .and_then(|r| r.get(&task.id).copied().flatten());
    let (output, planned) = plan_now(shared, task, sql, interval, repr, output).await?;
    let planned = match planned {
        Ok(planned) => planned,
        Err(why) => {
            output.keep();
            log.line(&why);
            return Ok(failed(why, None));
        }
    };
    let (record, verdict) = match judge_again(
        shared,
        task,
        staged,
        current.as_ref().map(|c| c.rows),
        planned,
    ) {
        Ok(v) => v,
        Err(outcome) => {
            // Still staged: a later `promote` (with --allow-drift, say) can publish it.
            output.keep();
            if let Outcome::Rejected(_, why)
            | Outcome::Failed(TryRecord {
                error: Some(why), ..
            }) = outcome.as_ref()
            {
                log.line(why);
            }
            return Ok(*outcome);
        }
    };
    log.line(&format!(
        "rows {} (published {}): {verdict}",
        record.rows.unwrap_or(0),
        current.as_ref().map_or("-".into(), |c| c.rows.to_string()),
    ));
    publish_audited(
        shared,
        ToPublish {
            task,
            sql,
            interval,
            try_id: started.try_id,
            log_path: &started.log,
            output,
            record,
            repr,
            empty: verdict == Verdict::PublishEmpty,
            current,
            promoting: true,
            intent_recorded: false,
            in_manifest: shared.in_manifest(sql),
            may_retry: false,
        },
        &mut log,
    )
    .await
}

/// What merging a staged output into its partition as the partition is now would do, when
/// `max_changed` is to judge it (`None` otherwise): the output, handed back, and the counts or
/// why they could not be had.
pub(super) async fn plan_now(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    interval: DataInterval,
    repr: Option<crate::warehouse::Repr>,
    mut output: Box<dyn crate::warehouse::backend::Pending>,
) -> Result<
    (
        Box<dyn crate::warehouse::backend::Pending>,
        Result<Option<gate::Merge>, String>,
    ),
    Error,
> {
    if task.gate.as_ref().and_then(|g| g.max_changed).is_none() {
        return Ok((output, Ok(None)));
    }
    let (sql, tz) = (sql.clone(), shared.spec.dag.tz);
    tokio::task::spawn_blocking(move || {
        let p = crate::warehouse::backend::PublishAs {
            task: &sql,
            interval,
            tz,
            repr,
            empty: false,
            expect_fingerprint: None,
            keep: None,
            table_keys: None,
            judged: None,
            in_manifest: None,
            planned: None,
        };
        let planned = output
            .plan_merge(&p)
            .map_err(|e| format!("cannot count what the merge would change: {e}"));
        (output, planned)
    })
    .await
    .map_err(|e| Error::Internal(format!("counting a merge panicked: {e}")))
}

async fn promote_command(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    started: &Started,
    staged: &StagedTry,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Outcome, Error> {
    let current = published_try(shared, task, interval).await?;
    let (record, _) = match judge_again(shared, task, staged, current.map(|c| c.rows), None) {
        Ok(v) => v,
        Err(outcome) => return Ok(*outcome),
    };
    if let Some(publish) = &task.publish {
        // Rendered as for the staged try (its run id and try number), with its result file.
        let spec = &shared.spec;
        let values = IntervalValues::new(interval, spec.dag.tz);
        let run_id_text = staged.run_id.to_string();
        let ctx = values.context(
            &spec.dag.id,
            &task.id,
            &run_id_text,
            staged.try_number,
            &spec.conf,
        );
        let result_path = PathBuf::from(&staged.path);
        let input = TryInput {
            try_id: started.try_id,
            interval,
            env: command::environment(&ctx, &shared.conf_text, &result_path),
            ctx,
            log_path: started.log.clone(),
            result_path,
            audit_path: None,
            batch: None,
            may_retry: false,
        };
        if let Err(mut outcome) = run_step(
            shared,
            task,
            publish,
            &input,
            crate::process::Output::Log(input.log_path.clone()),
            Some("publish command"),
            None,
            stop,
        )
        .await?
        {
            if let Outcome::Failed(r) | Outcome::Cancelled(r) = &mut outcome {
                r.promoted_from = Some(staged.try_id);
            }
            return Ok(outcome);
        }
    }
    let (rows, fingerprint) = (record.rows.unwrap_or(0), record.fingerprint.clone());
    Ok(Outcome::Succeeded(
        record,
        Some(Published {
            rows,
            fingerprint,
            recorded: false,
        }),
    ))
}
