//! SQL tries, write-audit-publish: the rows, measures and source count are computed into the
//! try's audit file from one read snapshot (no warehouse lock, so tries audit in parallel); the
//! gate judges; the decision to publish is recorded before the warehouse is touched; the publish
//! is one short transaction that the manifest must still allow. A crash after the intent is
//! repaired by finishing the publish from the audit file (see `recovery`).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use super::outcome::{Outcome, TryInput, apply_verdict, cancelled, failed, rules, timed_out};
use super::record::{Published, published_and_history};
use super::{Shared, Stop};
use crate::clock::End;
use crate::exit::Error;
use crate::gate::{self, Measures, Verdict};
use crate::manifest::{self, TryRecord, publishes};
use crate::project::{SqlTask, Task};
use crate::state::TryState;
use crate::warehouse::backend::{self, Pending};
use crate::warehouse::{self, Binds, Cancel};

/// A blocking warehouse step that can be cancelled or timed out.
pub(crate) enum Step<T> {
    Done(Result<T, warehouse::Error>),
    /// Timed out; the step's own result, when it still finished.
    TimedOut(Option<Result<T, warehouse::Error>>),
    /// Stopped; the step's own result, when it still finished.
    Cancelled(Option<Result<T, warehouse::Error>>),
}

/// Runs a blocking warehouse step on the blocking pool; a timeout or a stop sets its cancel
/// flag, which interrupts its statement, and waits for it to return.
pub(crate) async fn blocking_step<T: Send + 'static>(
    timeout: Option<Duration>,
    stop: &mut watch::Receiver<Stop>,
    f: impl FnOnce(&Cancel) -> Result<T, warehouse::Error> + Send + 'static,
) -> Step<T> {
    let cancel = Cancel::default();
    let c = cancel.clone();
    let mut job = tokio::task::spawn_blocking(move || f(&c));
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let mut stop_open = true;
    let timed_out = loop {
        if *stop.borrow() != Stop::Run {
            break false;
        }
        tokio::select! {
            joined = &mut job => {
                return Step::Done(joined.unwrap_or_else(|e| Err(warehouse::Error::Message(format!("warehouse step panicked: {e}")))));
            }
            () = &mut deadline, if timeout.is_some() => break true,
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    stop_open = false;
                }
            }
        }
    };
    // Interrupting may block (PostgreSQL's cancel request is a connection of its own).
    let _ = tokio::task::spawn_blocking(move || cancel.set()).await;
    // The step may have finished meanwhile: its result goes back, so that what it made (an
    // audit file) is removed.
    let late = job.await.ok();
    if timed_out {
        Step::TimedOut(late)
    } else {
        Step::Cancelled(late)
    }
}

pub(super) async fn sql_try(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Outcome, Error> {
    let tz = shared.spec.dag.tz;
    let binds = Binds::new(input.interval, tz);
    let Some(audit_path) = input.audit_path.clone() else {
        return Err(Error::Internal("a SQL try without an audit file".into()));
    };
    let known_repr = shared
        .reprs
        .lock()
        .ok()
        .and_then(|r| r.get(&task.id).copied().flatten());
    let in_its_publish = crate::warehouse::backend_of(&sql.warehouse).holding()
        == crate::warehouse::Holding::OwnTransaction;
    let staging = matches!(shared.spec.mode, super::Mode::Stage);
    let in_manifest = in_its_publish && !staging && shared.in_manifest(sql);
    let into = if in_its_publish {
        "its own transaction".to_string()
    } else {
        audit_path.display().to_string()
    };
    let first = format!(
        "warehouse `{}`: computing {} for [{}, {}) into {into}",
        sql.warehouse.name, sql.target, binds.data_interval_start, binds.data_interval_end,
    );
    // The log file is created while the warehouse works: creating a file is not free.
    let log_path = input.log_path.clone();
    let open_log = tokio::task::spawn_blocking(move || {
        let mut log = TryLog::open(&log_path);
        log.line(&first);
        log
    });
    let (s, g, b) = (sql.clone(), task.gate.clone(), binds.clone());
    let (try_id, manifest) = (
        input.try_id,
        manifest::identity(&shared.spec.manifest_path)?,
    );
    let lease_timeout = shared.spec.lease_timeout;
    // The first try of an interval of a batch takes its rows from the batch's one query.
    let mut batch_notes = Vec::new();
    let share = match batch_share(shared, task, sql, input, stop, &mut batch_notes).await {
        Ok(share) => share,
        Err(outcome) => return Ok(outcome),
    };
    let write = blocking_step(task.timeout, stop, move |cancel| {
        let write = backend::Write {
            task: &s,
            gate: g.as_ref(),
            binds: &b,
            tz,
            repr: known_repr,
            audit_path: &audit_path,
            try_id,
            manifest: &manifest,
            stage: staging,
            measure_only: false,
            lease_timeout,
        };
        match &share {
            Some((rows, k)) => rows.share(&write, *k, cancel),
            None => crate::warehouse::backend_of(&s.warehouse).write(&write, cancel),
        }
    });
    // Where the write is the publish's own transaction, which books the publish (PostgreSQL),
    // the intent is recorded while the warehouse works, before anything can commit (a crash is
    // settled from the booking, see `recovery`); unless that transaction records the publish
    // in the manifest itself (the manifest's own database), which needs no intent. What the
    // partition holds now is read meanwhile too.
    let owner = shared.spec.owner;
    let early_intent = in_its_publish && !staging && !in_manifest;
    let intent = async {
        if !early_intent {
            return Ok(true);
        }
        let rec = TryRecord::new(TryState::Succeeded);
        shared
            .writer
            .call(move |c| c.record_publish_intent(c.fence(owner)?, try_id, None, &rec))
            .await
    };
    let (step, published, intent, log) = tokio::join!(
        write,
        published_and_history(shared, task, input.interval),
        intent,
        open_log
    );
    let mut log = log.unwrap_or_else(|_| TryLog::none());
    for note in &batch_notes {
        log.line(note);
    }
    let output = match written(shared, task, input, step, &mut log).await {
        Ok(output) => output,
        Err(outcome) => return Ok(outcome),
    };
    let measures = output.measures().clone();
    crate::fault::point("after-audit");
    if known_repr.is_none()
        && let (Some(r), Ok(mut reprs)) = (measures.repr, shared.reprs.lock())
    {
        reprs.insert(task.id.clone(), Some(r));
    }
    let (current, history) = match (published, intent) {
        (Ok(c), Ok(true)) => c,
        (Ok(_), Ok(false)) => {
            let_go(output, false).await;
            return Ok(cancelled("taken over by another process before publishing"));
        }
        (Err(e), _) => {
            let_go(output, false).await;
            return Err(e);
        }
        (_, Err(e)) => {
            let_go(output, false).await;
            return Err(e.into());
        }
    };
    let published = current.as_ref().map(|c| c.rows);
    let judged = match judge(
        shared,
        task,
        input.interval,
        &measures,
        (published, history),
        &mut log,
    ) {
        Ok(judged) => judged,
        Err(why) => {
            let_go(output, false).await;
            return Ok(failed(why, None));
        }
    };
    let Judged {
        mut record,
        verdict,
    } = judged;
    if let Verdict::Reject(reason) = verdict {
        let_go(output, false).await;
        record.state = TryState::Rejected;
        // What a merge would have done is in the reason when it is why; it did not happen.
        record.clear_merge();
        return Ok(Outcome::Rejected(record, reason));
    }
    if matches!(shared.spec.mode, super::Mode::Stage) {
        return Ok(stage(output, record, &mut log).await);
    }
    publish_audited(
        shared,
        ToPublish {
            task,
            sql,
            interval: input.interval,
            try_id: input.try_id,
            log_path: &input.log_path,
            output,
            record,
            repr: measures.repr.or(known_repr),
            empty: verdict == Verdict::PublishEmpty,
            current,
            promoting: false,
            intent_recorded: early_intent,
            in_manifest,
            may_retry: input.may_retry,
        },
        &mut log,
    )
    .await
}

/// The rows of a batch's one query that the interval takes (`None`: its own query), once the
/// batch is computed; what to say of the batch goes into `notes`. Stopped meanwhile, the try's
/// outcome.
async fn batch_share(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
    notes: &mut Vec<String>,
) -> Result<Option<(std::sync::Arc<dyn backend::Batched>, usize)>, Outcome> {
    let share = match &input.batch {
        Some(batch) => {
            batch
                .share_of(input.interval, notes, |intervals| {
                    compute_batch(shared, task, sql, intervals, stop.clone())
                })
                .await
        }
        None => super::batch::Share::Own,
    };
    match share {
        super::batch::Share::Of(super::batch::Rows::Sql(rows), k) => Ok(Some((rows, k))),
        super::batch::Share::Of(super::batch::Rows::Command(_), _) | super::batch::Share::Own => {
            Ok(None)
        }
        super::batch::Share::Cancelled => Err(cancelled("cancelled")),
    }
}

/// The written output of the try's write step, or the try's outcome when there is none: the
/// step failed, timed out or was stopped, or the try's log cannot be written (a try whose log
/// cannot be written publishes nothing: its record would lack its log, and so would every try
/// after it).
async fn written(
    shared: &Shared,
    task: &Task,
    input: &TryInput<'_>,
    step: Step<Box<dyn Pending>>,
    log: &mut TryLog,
) -> Result<Box<dyn Pending>, Outcome> {
    if let Some(fault) = log.fault(&input.log_path) {
        if let Step::Done(Ok(output)) = step {
            let_go(output, false).await;
        } else if let Step::TimedOut(late) | Step::Cancelled(late) = step {
            discard(late).await;
        }
        return Err(shared.interrupted(&fault));
    }
    match step {
        Step::Done(Ok(v)) => Ok(v),
        Step::Done(Err(e)) => {
            let error = e.to_string();
            log.line(&error);
            if let Some(fault) = e.environment() {
                return Err(shared.met(&fault, input.may_retry, error));
            }
            Err(failed(error, None))
        }
        Step::TimedOut(late) => {
            discard(late).await;
            let error = timed_out(task);
            log.line(&error);
            Err(failed(error, None))
        }
        Step::Cancelled(late) => {
            discard(late).await;
            Err(cancelled("cancelled"))
        }
    }
}

/// A try's output as the gate judged it: its record (rows, fingerprint, verdict and reasons,
/// warnings and notes) and the verdict.
struct Judged {
    record: TryRecord,
    verdict: Verdict,
}

/// Judges the measured output by the task's gate, against what the partition holds now
/// (`published` rows) and its `history`, and says the verdict in the try's log. `Err`: the
/// gate could not judge it, and why.
fn judge(
    shared: &Shared,
    task: &Task,
    interval: crate::interval::DataInterval,
    measures: &warehouse::AuditMeasures,
    (published, history): (Option<i64>, Option<Vec<i64>>),
    log: &mut TryLog,
) -> Result<Judged, String> {
    // A merge is judged by the partition as it will be after it.
    let rows = measures.merge.map_or(measures.rows, |m| m.after());
    let gate_measures = Measures {
        rows,
        outside: Some(measures.outside),
        outside_values: measures.outside_values.clone(),
        duplicate_keys: measures.duplicate_keys,
        source: measures.source,
        published,
        mixed: measures.mixed.clone(),
        elsewhere: measures.elsewhere.clone(),
        constraint: measures.constraint.clone(),
        found: measures.found.clone(),
        history,
        merge: measures.merge,
    };
    let rules = rules(task.gate.as_ref(), shared.spec.allow_drift);
    let verdict = gate::judge(&gate_measures, &rules).inspect_err(|why| log.line(why))?;
    log.line(&format!(
        "rows {rows} (source {}, published {}){}, fingerprint {}: {verdict}",
        measures.source.map_or("-".into(), |n| n.to_string()),
        published.map_or("-".into(), |n| n.to_string()),
        measures
            .merge
            .map(|m| format!(", merge {}", m.short()))
            .unwrap_or_default(),
        measures.fingerprint
    ));
    let mut record = TryRecord::new(TryState::Succeeded);
    record.rows = Some(rows);
    if let Some(m) = &measures.merge {
        record.set_merge(m);
    }
    record.fingerprint = Some(measures.fingerprint.clone());
    apply_verdict(&mut record, &verdict, measures.source, published);
    record.source_fingerprint = measures.source_fingerprint.clone();
    if !matches!(verdict, Verdict::Reject(_)) {
        let (warnings, notes) = (
            gate::warnings(&gate_measures),
            gate::notes(&gate_measures, &rules),
        );
        for w in &warnings {
            log.line(&format!("warning: {w}"));
        }
        for n in &notes {
            log.line(&format!("note: {n}"));
        }
        super::outcome::warn(shared, task, interval, &mut record, &warnings, &notes);
    }
    Ok(Judged { record, verdict })
}

/// An audited output that passed its gate, to publish.
pub(super) struct ToPublish<'a> {
    pub task: &'a Task,
    pub sql: &'a SqlTask,
    pub interval: crate::interval::DataInterval,
    pub try_id: i64,
    pub log_path: &'a Path,
    /// The audited output.
    pub output: Box<dyn Pending>,
    /// The try's record as judged (rows, fingerprint, verdict, links).
    pub record: TryRecord,
    pub repr: Option<warehouse::Repr>,
    /// Publish an explicit empty partition.
    pub empty: bool,
    /// What the partition holds now.
    pub current: Option<publishes::Current>,
    /// A staged output: its file is checked against the staged fingerprint before it is
    /// published, and kept when the publish fails (it stays staged).
    pub promoting: bool,
    /// The intent was recorded already, before the output was measured (PostgreSQL).
    pub intent_recorded: bool,
    /// The publish's transaction records it in the manifest too (a PostgreSQL warehouse in the
    /// manifest's own database): no intent is recorded, and nothing is left to record after.
    pub in_manifest: bool,
    /// The task has a try left after this one (see [`super::outcome::TryInput::may_retry`]).
    pub may_retry: bool,
}

/// Records the decision to publish, then publishes in one short transaction that the manifest
/// must still allow; the audit file goes once the publish committed.
pub(super) async fn publish_audited(
    shared: &Shared,
    p: ToPublish<'_>,
    log: &mut TryLog,
) -> Result<Outcome, Error> {
    let ToPublish {
        task,
        sql,
        interval,
        try_id,
        log_path,
        output,
        record,
        repr,
        empty,
        current,
        promoting,
        intent_recorded,
        in_manifest,
        may_retry,
    } = p;
    let at = Publishing {
        task,
        sql,
        interval,
        try_id,
        log_path,
        repr,
        empty,
        promoting,
        in_manifest,
        may_retry,
    };
    let may_publish = if intent_recorded || in_manifest {
        Ok(true)
    } else {
        let file = output.file().map(|p| p.display().to_string());
        record_intent(shared, &at, &record, file).await
    };
    match may_publish {
        Ok(true) => {}
        Ok(false) => {
            let_go(output, promoting).await;
            return Ok(cancelled("cancelled"));
        }
        Err(e) => {
            let_go(output, promoting).await;
            return Err(e.into());
        }
    }
    crate::fault::point("before-publish");
    let (output, result) = publish_blocking(shared, &at, &record, current.as_ref(), output).await?;
    match result {
        Ok(rows) => Ok(published(shared, &at, record, output, rows, log)),
        Err(warehouse::Error::Refused) => {
            // Taken over: whoever took the interval over decides what is published. The file
            // stays: a recorded intent without its file would read as a publish that
            // committed; the recoverer (or the sweep, once the intent is settled) removes it.
            output.keep();
            log.line("not published: another process took this interval over");
            Ok(cancelled("taken over by another process before publishing"))
        }
        Err(warehouse::Error::Constraint(why)) => {
            refused_by_target(shared, &at, record, output, &why, log).await
        }
        Err(e) => publish_failed(shared, &at, record, output, &e, log).await,
    }
}

/// What a publish is of, besides its output and record (see [`ToPublish`]).
#[derive(Clone, Copy)]
struct Publishing<'a> {
    task: &'a Task,
    sql: &'a SqlTask,
    interval: crate::interval::DataInterval,
    try_id: i64,
    log_path: &'a Path,
    repr: Option<warehouse::Repr>,
    empty: bool,
    promoting: bool,
    in_manifest: bool,
    may_retry: bool,
}

/// Records the decision to publish (the output's `file` with it): whether the manifest still
/// lets this owner publish.
async fn record_intent(
    shared: &Shared,
    at: &Publishing<'_>,
    record: &TryRecord,
    path_text: Option<String>,
) -> Result<bool, manifest::Error> {
    let (owner, try_id) = (shared.spec.owner, at.try_id);
    let intent = record.clone();
    shared
        .writer
        .call(move |c| {
            c.record_publish_intent(c.fence(owner)?, try_id, path_text.as_deref(), &intent)
        })
        .await
}

/// Publishes the output in one transaction that the manifest must still allow, on the
/// blocking pool: the output back, with the rows published or why not.
async fn publish_blocking(
    shared: &Shared,
    at: &Publishing<'_>,
    record: &TryRecord,
    current: Option<&publishes::Current>,
    mut output: Box<dyn Pending>,
) -> Result<(Box<dyn Pending>, Result<i64, warehouse::Error>), Error> {
    let owner = shared.spec.owner;
    let tz = shared.spec.dag.tz;
    let (try_id, in_manifest, interval, repr, empty) =
        (at.try_id, at.in_manifest, at.interval, at.repr, at.empty);
    let (s, manifest_path) = (at.sql.clone(), shared.spec.manifest_path.clone());
    let log_path = at.log_path.to_path_buf();
    let expect = at.promoting.then(|| record.fingerprint.clone()).flatten();
    let table_keys = at
        .task
        .gate
        .as_ref()
        .filter(|g| g.unique_key_table)
        .map(|g| g.unique_key.clone());
    let version_of = current.and_then(|c| c.content);
    let same_content =
        current.is_some_and(|c| c.fingerprint.is_some() && c.fingerprint == record.fingerprint);
    let judged = record.judged();
    // A merge must do what the gate judged (a promote's is planned again by its publish).
    let planned = if at.promoting {
        None
    } else {
        output.measures().merge
    };
    // Promotes take no pool slot (see `tries`).
    let pooled = at.task.pool.is_some() && !at.promoting;
    let recorded = in_manifest.then(|| shared.record_in_manifest(at.task, record));
    tokio::task::spawn_blocking(move || {
        let reader = manifest::Reader::take(&manifest_path);
        let result = match &reader {
            Ok(reader) => {
                // A try of a pool must still hold its slot: once pool cleanup gave it to
                // another try (this owner was frozen past its lease), it publishes nothing.
                let allowed = || {
                    let may = reader
                        .may_publish(try_id, Some(owner), !in_manifest)
                        .map_err(crate::warehouse::AskError::from)?;
                    if may && pooled {
                        return reader
                            .holds_pool_slot(try_id)
                            .map_err(crate::warehouse::AskError::from);
                    }
                    Ok(may)
                };
                let p = backend::PublishAs {
                    task: &s,
                    interval,
                    tz,
                    repr,
                    empty,
                    expect_fingerprint: expect.as_deref(),
                    keep: Some(warehouse::versions::Keep {
                        by_try: try_id,
                        version_of,
                        keep: s.keep_versions,
                        same_content,
                    }),
                    table_keys: table_keys.as_deref(),
                    judged: Some(&judged),
                    in_manifest: recorded.as_ref(),
                    planned,
                };
                let mut waiting = waiting_log(&log_path);
                output.publish(&p, &allowed, &mut waiting)
            }
            Err(e) => Err(match super::record::environment_of_manifest(e) {
                Some(fault) => warehouse::Error::Environment(fault),
                None => warehouse::Error::Message(format!("cannot read the manifest: {e}")),
            }),
        };
        (output, result)
    })
    .await
    .map_err(|e| Error::Internal(format!("publish panicked: {e}")))
}

/// A publish that committed `rows`: the try succeeded, its output removed.
fn published(
    shared: &Shared,
    at: &Publishing<'_>,
    mut record: TryRecord,
    output: Box<dyn Pending>,
    rows: i64,
    log: &mut TryLog,
) -> Outcome {
    crate::fault::point("after-publish");
    // A promote's merge is planned by its publish, against the partition as it is now: what it
    // did is recorded, not what staging saw.
    let merged = output.merged().or(output.measures().merge);
    if let (true, Some(m)) = (at.promoting, merged) {
        record.set_merge(&m);
    }
    // A merge's partition is what the gate judged: with `on_missing = "keep"`, more than the
    // output's rows (drift compares the next rerun with it).
    let rows = match (&at.sql.write, at.promoting, record.rows) {
        (crate::project::WritePattern::Merge { .. }, false, Some(judged)) => judged,
        _ => rows,
    };
    output.remove();
    log.line(&format!(
        "published {} into {}{}",
        crate::words::plural(rows, "row", "rows"),
        at.sql.target,
        recorded_too(at.in_manifest)
    ));
    tracing::debug!(
        backfill = shared.spec.owner.backfill_id,
        dag = %shared.spec.dag.id,
        task = %at.task.id,
        interval = %at.interval,
        try_id = at.try_id,
        rows,
        "published"
    );
    let fingerprint = record.fingerprint.clone();
    Outcome::Succeeded(
        record,
        Some(Published {
            rows,
            fingerprint,
            recorded: at.in_manifest,
        }),
    )
}

/// The target itself refused the rows the gate passed (a SQLite target's key, which the audit
/// file does not have): rejected as by the gate, the partition untouched.
async fn refused_by_target(
    shared: &Shared,
    at: &Publishing<'_>,
    mut rec: TryRecord,
    output: Box<dyn Pending>,
    why: &str,
    log: &mut TryLog,
) -> Result<Outcome, Error> {
    let verdict = gate::refused_by_target(why);
    log.line(&format!("not published: {verdict}"));
    rec.state = TryState::Rejected;
    rec.clear_merge();
    let (source, previous) = (rec.source_rows, rec.previous_rows);
    apply_verdict(&mut rec, &verdict, source, previous);
    end_unpublished(shared, at.try_id, &rec, output, at.promoting).await?;
    let reason = verdict.reason().unwrap_or_default().to_string();
    Ok(Outcome::Rejected(rec, reason))
}

/// A publish that failed with `e`. Not published for want of space, memory or a warehouse that
/// answers, the try is interrupted, and runs again on `resume` (or, for a fault that may pass
/// by itself, fails to be retried when it may).
async fn publish_failed(
    shared: &Shared,
    at: &Publishing<'_>,
    record: TryRecord,
    output: Box<dyn Pending>,
    e: &warehouse::Error,
    log: &mut TryLog,
) -> Result<Outcome, Error> {
    let error = format!("publish failed: {e}");
    log.line(&error);
    let fault = e.environment().filter(|f| !(f.transient && at.may_retry));
    let mut rec = match &fault {
        Some(fault) => {
            shared.stop_for(fault);
            let mut rec = TryRecord::new(TryState::Cancelled);
            rec.error = Some(super::interrupted_by(fault));
            rec
        }
        None => {
            let mut rec = TryRecord::new(TryState::Failed);
            rec.error = Some(error.clone());
            rec
        }
    };
    rec.promoted_from = record.promoted_from;
    end_unpublished(shared, at.try_id, &rec, output, at.promoting).await?;
    Ok(match fault {
        Some(_) => Outcome::Cancelled(rec),
        None => Outcome::Failed(rec),
    })
}

/// Records the end of a try whose publish did not happen, then lets its output go: in that
/// order, since a recorded intent without its audit file would read as a publish that committed.
async fn end_unpublished(
    shared: &Shared,
    try_id: i64,
    rec: &TryRecord,
    output: Box<dyn Pending>,
    promoting: bool,
) -> Result<(), Error> {
    let (owner, done) = (shared.spec.owner, rec.clone());
    let began = shared.marks.try_end(try_id);
    shared
        .writer
        .call(move |c| c.finish_try(c.fence(owner)?, try_id, &done, End::since(began)))
        .await?;
    let_go(output, promoting).await;
    Ok(())
}

/// The warehouses (by name) of the run's SQL tasks that are in the manifest's own database,
/// their users allowed to write the manifest's record of a publish: their publishes'
/// transactions record them (see [`Shared::in_manifest`]); and what to say of those whose users
/// may not. Looked up once, before the first try; a failed look-up counts as "no" (a publish is
/// then recorded after it commits, which is always safe).
pub(super) async fn one_database(spec: &super::RunSpec) -> (HashSet<String>, Vec<String>) {
    if !manifest::is_url(&spec.manifest_path) {
        return Default::default();
    }
    let mut warehouses: Vec<crate::project::Warehouse> = Vec::new();
    for task in &spec.dag.tasks {
        if let crate::project::TaskKind::Sql(sql) = &task.kind
            && !warehouses.iter().any(|w| w.name == sql.warehouse.name)
        {
            warehouses.push(sql.warehouse.clone());
        }
    }
    if warehouses.is_empty() {
        return Default::default();
    }
    let path = spec.manifest_path.clone();
    tokio::task::spawn_blocking(move || match manifest::database_key(&path) {
        Ok(Some(key)) => {
            let (mut shared, mut said) = (HashSet::new(), Vec::new());
            for w in warehouses {
                let sharing = warehouse::backend_of(&w).shares_manifest(&w, &key);
                said.extend(sharing.warning(&w.name));
                if sharing == warehouse::Sharing::Shared {
                    shared.insert(w.name);
                }
            }
            (shared, said)
        }
        Ok(None) => Default::default(),
        Err(e) => {
            tracing::warn!("cannot tell which database holds the manifest: {e}");
            Default::default()
        }
    })
    .await
    .unwrap_or_default()
}

/// What a publish's log line adds when its transaction recorded it in the manifest too.
pub(super) fn recorded_too(in_manifest: bool) -> &'static str {
    if in_manifest {
        ", recorded in the manifest in the same transaction"
    } else {
        ""
    }
}

/// Keeps a try's audited output for `promote` instead of publishing it, durably: not even a
/// crash of the machine loses a staged output.
async fn stage(output: Box<dyn Pending>, record: TryRecord, log: &mut TryLog) -> Outcome {
    let staged = tokio::task::spawn_blocking(move || output.stage())
        .await
        .unwrap_or_else(|e| Err(warehouse::Error::Message(format!("staging panicked: {e}"))));
    match staged {
        Ok(path) => {
            crate::fault::point("after-stage");
            log.line(&format!(
                "staged: kept in {} for `backfill promote`, not published",
                path.display()
            ));
            super::outcome::staged(record, &path)
        }
        Err(error) => {
            let error = error.to_string();
            log.line(&error);
            failed(error, None)
        }
    }
}

/// Drops the output of a write step that finished after it was given up.
async fn discard(late: Option<Result<Box<dyn Pending>, warehouse::Error>>) {
    if let Some(Ok(output)) = late {
        let_go(output, false).await;
    }
}

/// Lets go of an output that is not published: removed (its transaction rolled back, its audit
/// file deleted), or kept for the one who decides (a promote's staged output). On a blocking
/// thread, because that may wait on the warehouse, and the async workers must never wait: the
/// owner's heartbeat runs on them.
async fn let_go(output: Box<dyn Pending>, keep: bool) {
    let _ = tokio::task::spawn_blocking(move || {
        if keep {
            output.keep();
        } else {
            output.remove();
        }
    })
    .await;
}

/// Notes in the try's log, once, that the publish waits for another writer.
fn waiting_log(path: &Path) -> impl FnMut() + use<> {
    let mut path = Some(path.to_path_buf());
    move || {
        if let Some(p) = path.take() {
            TryLog::open(&p).line("the warehouse is locked by another writer; waiting for it");
        }
    }
}

/// The log file of a SQL try, and the first error opening or writing it.
pub(super) struct TryLog {
    file: Option<std::fs::File>,
    failure: Option<std::io::Error>,
}

impl TryLog {
    pub(super) fn open(path: &Path) -> Self {
        match crate::process::open_log(path) {
            Ok(f) => Self {
                file: Some(f),
                failure: None,
            },
            Err(e) => Self {
                file: None,
                failure: Some(e),
            },
        }
    }

    /// No log (its opening panicked).
    fn none() -> Self {
        Self {
            file: None,
            failure: None,
        }
    }

    pub(super) fn line(&mut self, text: &str) {
        use std::io::Write;
        if let Some(f) = &mut self.file
            && let Err(e) = writeln!(f, "{text}")
        {
            self.file = None;
            self.failure.get_or_insert(e);
        }
    }

    /// The environment fault that kept the log at `path` from being written, if one did.
    pub(super) fn fault(&self, path: &Path) -> Option<crate::environment::Fault> {
        let e = self.failure.as_ref()?;
        crate::environment::Fault::of_io(e, &format!("the log {}", path.display()), path)
    }
}

/// Runs a SQL task's query for a batch, bounded by the task's timeout and stopped as a try is.
pub(super) async fn compute_batch(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    intervals: Vec<crate::interval::DataInterval>,
    mut stop: watch::Receiver<Stop>,
) -> super::batch::Computed {
    use super::batch::{Computed, Rows};
    use std::sync::Arc;
    let (s, g, ivs, tz) = (
        sql.clone(),
        task.gate.clone(),
        intervals,
        shared.spec.dag.tz,
    );
    let audit_dir = crate::warehouse::audit_dir(&shared.spec.manifest_path);
    let step = blocking_step(task.timeout, &mut stop, move |cancel| {
        crate::warehouse::backend_of(&s.warehouse).write_batch(
            &s,
            g.as_ref(),
            &ivs,
            tz,
            &audit_dir,
            cancel,
        )
    })
    .await;
    match step {
        Step::Done(Ok(rows)) => Computed::Done(Rows::Sql(Arc::from(rows))),
        // The batch's intervals are interrupted, not split: they would meet the same fault
        // (one that may pass by itself fails the batch, whose intervals then run alone).
        Step::Done(Err(e)) => match e.environment().filter(|f| !f.transient) {
            Some(fault) => {
                shared.stop_for(&fault);
                Computed::Cancelled
            }
            None => Computed::Failed(e.to_string()),
        },
        Step::TimedOut(_) => Computed::Failed(super::outcome::timed_out(task)),
        Step::Cancelled(_) => Computed::Cancelled,
    }
}
