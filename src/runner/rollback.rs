//! Rollback: puts back, in one warehouse transaction, the rows that the current publish of a
//! SQL task's interval replaced (kept by that publish, see [`crate::warehouse::versions`]). It
//! is recorded like a publish: an intent first (naming the kept version it puts back, which
//! the transaction drops: recovery knows it committed when the version is gone), then the try
//! with the verdict `rolled back`, which becomes the interval's published try.

use super::Shared;
use super::outcome::{Outcome, TaskEnd, cancelled, failed, settle, start_single};
use super::record::{LastTry, Published, Started, published_try};
use super::sql_try::TryLog;
use crate::clock::End;
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::manifest::{self, TryRecord, publishes};
use crate::project::{SqlTask, Task};
use crate::state::TryState;
use crate::warehouse::{self, backend};

pub(super) async fn rollback_task(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    interval: DataInterval,
    run_id: &mut Option<i64>,
) -> Result<(TaskEnd, Option<LastTry>), Error> {
    let started = match start_single(shared, task, interval, run_id, None).await? {
        super::record::Claimed::Started(s) => s,
        _ => return Ok((TaskEnd::Cancelled, None)),
    };
    let outcome = rollback_sql(shared, task, sql, interval, &started).await?;
    Ok(settle(shared, outcome, &started, task, interval))
}

async fn rollback_sql(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    interval: DataInterval,
    started: &Started,
) -> Result<Outcome, Error> {
    let mut log = TryLog::open(&started.log);
    let Some(publishes::Current {
        try_id: current,
        rows: current_rows,
        content,
        ..
    }) = published_try(shared, task, interval).await?
    else {
        let error = "nothing is published, so there is nothing to roll back".to_string();
        log.line(&error);
        return Ok(failed(error, None));
    };
    let manifest = manifest::identity(&shared.spec.manifest_path)?;
    let (key, version, fingerprint) = match kept_version(sql, &manifest, content).await? {
        Ok(Some(v)) => v,
        Ok(None) => {
            let error = match content {
                Some(key) => format!(
                    "no earlier version is kept (none of the rows that try {key}'s publish replaced; keep_versions = {})",
                    sql.keep_versions
                ),
                None => format!(
                    "no earlier version is kept (the rows put back by try {current} predate the manifest)"
                ),
            };
            log.line(&error);
            return Ok(failed(error, None));
        }
        Err(e) => {
            let error = e.at(&sql.warehouse).to_string();
            log.line(&error);
            return Ok(failed(error, None));
        }
    };
    let mut record = TryRecord::new(TryState::Succeeded);
    record.rows = Some(version.rows);
    record.fingerprint = Some(fingerprint.clone());
    record.previous_rows = Some(current_rows);
    record.verdict = Some(crate::state::Verdict::RolledBack);
    record.restored_from = version.version_of;
    record.restore_key = Some(key);
    log.line(&format!(
        "rolling back `{}` for [{}, {}): {} rows published by try {current} make way for the {} rows {}",
        sql.target,
        interval.start.to_rfc3339(),
        interval.end.to_rfc3339(),
        current_rows,
        version.rows,
        version
            .version_of
            .map_or("that predate the manifest".to_string(), |t| format!("of try {t}")),
    ));
    let (owner, try_id, intent) = (shared.spec.owner, started.try_id, record.clone());
    let may = shared
        .writer
        .call(move |c| c.record_publish_intent(c.fence(owner)?, try_id, None, &intent))
        .await?;
    if !may {
        return Ok(cancelled("cancelled"));
    }
    crate::fault::point("before-publish");
    let in_manifest = shared.in_manifest(sql);
    let recorded = in_manifest.then(|| shared.record_in_manifest(task, &record));
    let put_back = PutBack {
        interval,
        key,
        manifest,
        try_id,
        fingerprint: fingerprint.clone(),
        recorded,
    };
    let result = roll_back(shared, task, sql, put_back).await?;
    match result {
        Ok(rows) => {
            crate::fault::point("after-publish");
            log.line(&format!(
                "rolled back: {rows} rows put back{}",
                super::sql_try::recorded_too(in_manifest)
            ));
            Ok(Outcome::Succeeded(
                record,
                Some(Published {
                    rows,
                    fingerprint: Some(fingerprint),
                    recorded: in_manifest,
                }),
            ))
        }
        Err(warehouse::Error::Refused) => {
            log.line("not rolled back: another process took this interval over");
            Ok(cancelled(
                "taken over by another process before rolling back",
            ))
        }
        Err(e) => {
            let error = format!("rollback failed: {e}");
            log.line(&error);
            let mut rec = TryRecord::new(TryState::Failed);
            rec.error = Some(error);
            let done = rec.clone();
            let began = shared.marks.try_end(try_id);
            shared
                .writer
                .call(move |c| c.finish_try(c.fence(owner)?, try_id, &done, End::since(began)))
                .await?;
            Ok(Outcome::Failed(rec))
        }
    }
}

/// The version kept for the publish of try `content` (the partition's content now), with its
/// key and the fingerprint of its rows; `None` when none is kept.
async fn kept_version(
    sql: &SqlTask,
    manifest: &str,
    content: Option<i64>,
) -> Result<Result<Option<(i64, warehouse::versions::Version, String)>, warehouse::Error>, Error> {
    let (s, m) = (sql.clone(), manifest.to_string());
    tokio::task::spawn_blocking(move || -> Result<_, warehouse::Error> {
        let Some(key) = content else {
            return Ok(None);
        };
        Ok(crate::warehouse::backend_of(&s.warehouse)
            .kept_version(&s, &m, key)?
            .map(|(v, f)| (key, v, f)))
    })
    .await
    .map_err(|e| Error::Internal(format!("reading the warehouse panicked: {e}")))
}

/// What a rollback puts back: the version kept under `key`, as try `try_id` of `manifest`
/// (whose rows' fingerprint is `fingerprint`), recorded by its own transaction when `recorded`.
struct PutBack {
    interval: DataInterval,
    key: i64,
    manifest: String,
    try_id: i64,
    fingerprint: String,
    recorded: Option<backend::InManifest>,
}

/// Puts the kept version back in one warehouse transaction that the manifest must still
/// allow, on the blocking pool: the rows put back, or why not.
async fn roll_back(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    p: PutBack,
) -> Result<Result<i64, warehouse::Error>, Error> {
    let owner = shared.spec.owner;
    let (s, manifest_path, tz) = (
        sql.clone(),
        shared.spec.manifest_path.clone(),
        shared.spec.dag.tz,
    );
    let repr = shared
        .reprs
        .lock()
        .ok()
        .and_then(|r| r.get(&task.id).copied().flatten());
    tokio::task::spawn_blocking(move || {
        let reader = manifest::Reader::take(&manifest_path)
            .map_err(|e| warehouse::Error::Message(format!("cannot read the manifest: {e}")))?;
        let allowed = || {
            reader
                .may_publish(p.try_id, Some(owner), true)
                .map_err(crate::warehouse::AskError::from)
        };
        let r = backend::RollBack {
            task: &s,
            repr,
            interval: p.interval,
            tz,
            key: p.key,
            manifest: &p.manifest,
            try_id: p.try_id,
            fingerprint: &p.fingerprint,
            in_manifest: p.recorded.as_ref(),
        };
        crate::warehouse::backend_of(&s.warehouse).roll_back(&r, &allowed)
    })
    .await
    .map_err(|e| Error::Internal(format!("rollback panicked: {e}")))
}
