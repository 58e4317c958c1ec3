//! SQL tries, write-audit-publish: the rows, measures and source count are computed into the
//! try's audit file from one read snapshot (no warehouse lock, so tries audit in parallel); the
//! gate judges; the decision to publish is recorded before the warehouse is touched; the publish
//! is one short transaction that the manifest must still allow. A crash after the intent is
//! repaired by finishing the publish from the audit file (see `recovery`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::InterruptHandle;
use tokio::sync::watch;

use super::record::{Published, published_rows};
use super::tries::{Outcome, TryInput, apply_verdict, cancelled, failed, rules, timed_out};
use super::{Shared, Stop};
use crate::exit::Error;
use crate::gate::{self, Measures, Verdict};
use crate::manifest::backfills::fence;
use crate::manifest::leases::now_ms;
use crate::manifest::{self, TryRecord, runs};
use crate::project::{SqlTask, Task};
use crate::state::TryState;
use crate::warehouse::{self, AuditFile, AuditMeasures, Binds, Cancel, audit, publish};

/// A blocking warehouse step that can be cancelled or timed out.
pub(crate) enum Step<T> {
    Done(Result<T, warehouse::Error>),
    /// Timed out; the step's own result, when it still finished.
    TimedOut(Option<Result<T, warehouse::Error>>),
    /// Stopped; the step's own result, when it still finished.
    Cancelled(Option<Result<T, warehouse::Error>>),
}

pub(crate) type Interrupt = Arc<Mutex<Option<InterruptHandle>>>;

/// Runs a blocking warehouse step on the blocking pool; a timeout or a stop interrupts its
/// SQLite statement and waits for it to return.
pub(crate) async fn blocking_step<T: Send + 'static>(
    timeout: Option<Duration>,
    stop: &mut watch::Receiver<Stop>,
    f: impl FnOnce(&Cancel, &Interrupt) -> Result<T, warehouse::Error> + Send + 'static,
) -> Step<T> {
    let cancel = Cancel::default();
    let interrupt: Interrupt = Arc::default();
    let (c, i) = (cancel.clone(), interrupt.clone());
    let mut job = tokio::task::spawn_blocking(move || f(&c, &i));
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
    cancel.set();
    if let Ok(slot) = interrupt.lock()
        && let Some(handle) = slot.as_ref()
    {
        handle.interrupt();
    }
    // The step may have finished meanwhile: its result goes back, so that what it made (an
    // audit file) is removed.
    let late = job.await.ok();
    if timed_out {
        Step::TimedOut(late)
    } else {
        Step::Cancelled(late)
    }
}

/// The audit step's result: the connection (reused to publish), the audit file and measures.
type Audited = (warehouse::pool::Pooled, AuditFile, AuditMeasures);

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
    let mut log = TryLog::open(&input.log_path);
    log.line(&format!(
        "warehouse `{}`: computing {} for [{}, {}) into {}",
        sql.warehouse.name,
        sql.target,
        binds.data_interval_start,
        binds.data_interval_end,
        audit_path.display()
    ));
    let (s, g, b) = (sql.clone(), task.gate.clone(), binds.clone());
    let step = blocking_step(
        task.timeout,
        stop,
        move |cancel, interrupt| -> Result<Audited, warehouse::Error> {
            let dir = audit_path.parent().unwrap_or_else(|| Path::new("."));
            let name = audit_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let file = AuditFile::create(dir, &name)?;
            let measured = (|| -> Result<_, warehouse::Error> {
                let conn = warehouse::pool::take(&s.warehouse)?;
                if let Ok(mut slot) = interrupt.lock() {
                    *slot = Some(conn.get_interrupt_handle());
                }
                if cancel.flag().load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(warehouse::Error::Cancelled);
                }
                file.attach(&conn)?;
                let m = audit::write_and_measure(
                    &conn,
                    &s,
                    g.as_ref(),
                    known_repr,
                    &b,
                    tz,
                    Some(cancel.flag()),
                );
                audit::detach(&conn);
                Ok((conn, m?))
            })();
            match measured {
                Ok((conn, m)) => Ok((conn, file, m)),
                Err(e) => {
                    file.remove();
                    Err(e.at(&s.warehouse))
                }
            }
        },
    )
    .await;
    let (conn, file, measures) = match step {
        Step::Done(Ok(v)) => v,
        Step::Done(Err(e)) => {
            let error = e.to_string();
            log.line(&error);
            return Ok(failed(error, None));
        }
        Step::TimedOut(late) => {
            discard(late);
            let error = timed_out(task);
            log.line(&error);
            return Ok(failed(error, None));
        }
        Step::Cancelled(late) => {
            discard(late);
            return Ok(cancelled("cancelled"));
        }
    };
    crate::fault::point("after-audit");
    if known_repr.is_none()
        && let (Some(r), Ok(mut reprs)) = (measures.repr, shared.reprs.lock())
    {
        reprs.insert(task.id.clone(), Some(r));
    }
    let published = published_rows(shared, task, input.interval).await?;
    let gate_measures = Measures {
        rows: measures.rows,
        outside: Some(measures.outside),
        duplicate_keys: measures.duplicate_keys,
        source: measures.source,
        published,
        mixed: measures.mixed.clone(),
    };
    let verdict = match gate::judge(
        &gate_measures,
        &rules(task.gate.as_ref(), shared.spec.allow_drift),
    ) {
        Ok(v) => v,
        Err(why) => {
            file.remove();
            log.line(&why);
            return Ok(failed(why, None));
        }
    };
    log.line(&format!(
        "rows {} (source {}, published {}), fingerprint {}: {verdict}",
        measures.rows,
        measures.source.map_or("-".into(), |n| n.to_string()),
        published.map_or("-".into(), |n| n.to_string()),
        measures.fingerprint
    ));
    let mut record = TryRecord::new(TryState::Succeeded);
    record.rows = Some(measures.rows);
    record.fingerprint = Some(measures.fingerprint.clone());
    apply_verdict(&mut record, &verdict, measures.source, published);
    record.source_fingerprint = measures.source_fingerprint.clone();
    if let Verdict::Reject(reason) = verdict {
        file.remove();
        record.state = TryState::Rejected;
        return Ok(Outcome::Rejected(record, reason));
    }
    let (intent, path_text, owner, try_id) = (
        record.clone(),
        file.path.display().to_string(),
        shared.spec.owner,
        input.try_id,
    );
    let may_publish = shared
        .writer
        .call(move |c| {
            runs::record_publish_intent(c, fence(c, owner)?, try_id, &path_text, &intent)
        })
        .await;
    match may_publish {
        Ok(true) => {}
        Ok(false) => {
            file.remove();
            return Ok(cancelled("cancelled"));
        }
        Err(e) => {
            file.remove();
            return Err(e.into());
        }
    }
    crate::fault::point("before-publish");
    let (s, manifest_path) = (sql.clone(), shared.spec.manifest_path.clone());
    let log_path = input.log_path.clone();
    let repr = measures.repr.or(known_repr);
    let interval = input.interval;
    let empty = verdict == Verdict::PublishEmpty;
    let joined = tokio::task::spawn_blocking(move || {
        let reader = manifest::Reader::take(&manifest_path);
        let result = match &reader {
            Ok(reader) => {
                let allowed =
                    || runs::may_publish(reader, try_id, Some(owner)).map_err(|e| e.to_string());
                let p = publish::Publish {
                    task: &s,
                    interval,
                    tz,
                    repr,
                    audit: (!empty).then_some(&file),
                    expect_fingerprint: None,
                };
                let mut waiting = waiting_log(&log_path);
                if crate::fault::point("publish") {
                    Err(warehouse::Error::Message(
                        "disk I/O error (injected)".into(),
                    ))
                } else {
                    publish::publish_noting(&conn, &p, &allowed, &mut waiting)
                }
            }
            Err(e) => Err(warehouse::Error::Message(format!(
                "cannot read the manifest: {e}"
            ))),
        };
        (file, result)
    })
    .await
    .map_err(|e| Error::Internal(format!("publish panicked: {e}")))?;
    let (file, result) = joined;
    match result {
        Ok(rows) => {
            crate::fault::point("after-publish");
            file.remove();
            log.line(&format!(
                "published {} into {}",
                crate::report::out::plural(rows, "row", "rows"),
                sql.target
            ));
            tracing::debug!(
                backfill = owner.backfill_id,
                dag = %shared.spec.dag.id,
                task = %task.id,
                interval = %input.interval,
                try_id,
                rows,
                "published"
            );
            Ok(Outcome::Succeeded(
                record,
                Some(Published {
                    rows,
                    fingerprint: Some(measures.fingerprint),
                }),
            ))
        }
        Err(warehouse::Error::Refused) => {
            // Taken over: whoever took the interval over decides what is published. The file
            // stays: a recorded intent without its file would read as a publish that
            // committed; the recoverer (or the sweep, once the intent is settled) removes it.
            file.keep();
            log.line("not published: another process took this interval over");
            Ok(cancelled("taken over by another process before publishing"))
        }
        Err(e) => {
            let error = format!("publish failed: {e}");
            log.line(&error);
            // Recorded before the audit file goes: a recorded intent without its file would
            // read as a publish that committed.
            let mut rec = TryRecord::new(TryState::Failed);
            rec.error = Some(error.clone());
            let done = rec.clone();
            shared
                .writer
                .call(move |c| runs::finish_try(c, fence(c, owner)?, try_id, &done, now_ms()))
                .await?;
            file.remove();
            Ok(Outcome::Failed(rec))
        }
    }
}

/// Removes the audit file of an audit step that finished after it was given up.
fn discard(late: Option<Result<Audited, warehouse::Error>>) {
    if let Some(Ok((_, file, _))) = late {
        file.remove();
    }
}

/// Notes in the try's log, once, that the publish waits for another writer.
fn waiting_log(path: &Path) -> impl FnMut() + use<> {
    let mut log = Some(TryLog::open(path));
    move || {
        if let Some(mut l) = log.take() {
            l.line("the warehouse is locked by another writer; waiting for it");
        }
    }
}

/// The log file of a SQL try.
struct TryLog(Option<std::fs::File>);

impl TryLog {
    fn open(path: &Path) -> Self {
        Self(crate::process::open_log(path).ok())
    }

    fn line(&mut self, text: &str) {
        use std::io::Write;
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "{text}");
        }
    }
}
