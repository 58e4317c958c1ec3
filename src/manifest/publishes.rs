//! Publishes as the manifest records them: the intent a try records before it touches the
//! warehouse (so that recovery can finish or undo it), the partition's current publication,
//! and what recovery needs to find the publishes a dead owner left half done.

use rusqlite::params;

use super::db::Optional;

use super::db::Conn;

use super::Result;
use super::backfills::{Fenced, Owner};
use super::runs::{TryRecord, try_holds_lease};
use crate::interval::DataInterval;
use crate::state::TryState;

/// Records the gate's decision to publish before the warehouse is touched: a crash between this
/// and [`mark_published`] is repaired by redoing the publish from the audit file.
pub(crate) fn record_publish_intent(
    conn: &Conn,
    _fenced: Fenced,
    try_id: i64,
    audit_path: Option<&str>,
    rec: &TryRecord,
) -> Result<bool> {
    if !try_holds_lease(conn, try_id)? {
        return Ok(false);
    }
    let changed = conn
        .prepare_cached(
            "UPDATE task_tries SET publishing = TRUE, audit_path = $2, rows = $3, fingerprint = $4,
                source_rows = $5, previous_rows = $6, verdict = $7, reasons = $8,
                source_fingerprint = $9, promoted_from = $10, restored_from = $11,
                restore_key = $12, rows_inserted = $13, rows_updated = $14, rows_deleted = $15,
                rows_unchanged = $16
             WHERE id = $1 AND state = 'running'",
        )?
        .execute(params![
            try_id,
            audit_path,
            rec.rows,
            rec.fingerprint,
            rec.source_rows,
            rec.previous_rows,
            rec.verdict,
            rec.reasons,
            rec.source_fingerprint,
            rec.promoted_from,
            rec.restored_from,
            rec.restore_key,
            rec.rows_inserted,
            rec.rows_updated,
            rec.rows_deleted,
            rec.rows_unchanged
        ])?;
    Ok(changed == 1)
}

/// Records the decision to publish a group of outputs in one warehouse transaction (`promote
/// --atomic`): every intent, or none when any try may no longer publish (its lease is gone, or
/// it is not running). Recovery finishes the group's publishes together.
pub(crate) fn record_group_intent(
    conn: &Conn,
    fenced: Fenced,
    group: &[(i64, Option<String>, TryRecord)],
) -> Result<bool> {
    for (try_id, _, _) in group {
        let running = conn
            .prepare_cached("SELECT 1 FROM task_tries WHERE id = $1 AND state = 'running'")?
            .query_row([try_id], |_| Ok(()))
            .optional()?
            .is_some();
        if !running || !try_holds_lease(conn, *try_id)? {
            return Ok(false);
        }
    }
    for (try_id, path, rec) in group {
        // Each was checked above, in this transaction: none can be refused now.
        record_publish_intent(conn, fenced, *try_id, path.as_deref(), rec)?;
    }
    Ok(true)
}

/// The manifest's record of a publish, run by a PostgreSQL warehouse in the manifest's own
/// database as the last statement of the publish's transaction: the try ends `succeeded` with
/// its judged record and becomes its partition's publication, both only while it is still
/// running. When it is not (recovery ended it: its owner was gone, or its pool slot was given
/// away), `publish_refused` raises and the whole transaction rolls back, the warehouse's rows
/// with it. A recovery that ends it after this transaction's snapshot was taken makes the
/// update a serialization failure, with the same effect. So the manifest says `succeeded`
/// exactly when the publish committed, and nothing has to be settled after a crash.
///
/// `$1` try, `$2` rows, `$3` fingerprint, `$4` source rows, `$5` rows compared with, `$6`
/// verdict, `$7` reasons, `$8` source fingerprint, `$9` DAG, `$10` task, `$11` and `$12` the
/// interval (unix seconds), `$13` the staged try a promote publishes (then `promoted`), `$14`
/// to `$17` a merge's rows inserted, updated, deleted and unchanged. Times
/// are the database's clock, as every manifest write's.
pub(crate) const IN_PUBLISH: &str = "WITH now AS (
     SELECT CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) AS ms),
 ended AS (
     UPDATE backfill_manifest.task_tries SET state = 'succeeded',
         ended_at = GREATEST((SELECT ms FROM now), started_at),
         rows = $2, fingerprint = $3, source_rows = $4, previous_rows = $5, verdict = $6,
         reasons = $7, source_fingerprint = $8, publishing = FALSE, rows_inserted = $14,
         rows_updated = $15, rows_deleted = $16, rows_unchanged = $17
     WHERE id = $1 AND state = 'running'
     RETURNING id),
 published AS (
     INSERT INTO backfill_manifest.published
         (dag_id, task_id, interval_start, interval_end, try_id, rows, fingerprint, published_at)
     SELECT $9, $10, $11, $12, id, $2, $3, (SELECT ms FROM now) FROM ended
     ON CONFLICT (dag_id, task_id, interval_start) DO UPDATE SET
         interval_end = EXCLUDED.interval_end, try_id = EXCLUDED.try_id, rows = EXCLUDED.rows,
         fingerprint = EXCLUDED.fingerprint, published_at = EXCLUDED.published_at
     RETURNING 1),
 promoted AS (
     UPDATE backfill_manifest.task_tries SET staged = 'promoted'
     WHERE id = $13 AND staged = 'staged' AND EXISTS (SELECT 1 FROM ended))
 SELECT CASE WHEN EXISTS (SELECT 1 FROM published) THEN 1
             ELSE backfill_manifest.publish_refused($1) END";

/// The SQLSTATE that [`IN_PUBLISH`] raises for a try that may not publish.
pub(crate) const PUBLISH_REFUSED: &str = "BF001";

/// A try's output that became the published partition of its task and interval.
#[derive(Debug, Clone)]
pub struct Publication<'a> {
    pub try_id: i64,
    pub dag_id: &'a str,
    pub task_id: &'a str,
    pub interval: DataInterval,
    pub rows: i64,
    pub fingerprint: Option<&'a str>,
}

/// Makes a try the published try of its task and interval.
pub(crate) fn mark_published(conn: &Conn, p: &Publication<'_>, now_ms: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO published
            (dag_id, task_id, interval_start, interval_end, try_id, rows, fingerprint, published_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (dag_id, task_id, interval_start) DO UPDATE SET
            interval_end = excluded.interval_end, try_id = excluded.try_id, rows = excluded.rows,
            fingerprint = excluded.fingerprint, published_at = excluded.published_at",
    )?
    .execute(params![
        p.dag_id,
        p.task_id,
        p.interval.start.timestamp(),
        p.interval.end.timestamp(),
        p.try_id,
        p.rows,
        p.fingerprint,
        now_ms
    ])?;
    Ok(())
}

/// The currently published try of a task and interval: `(try_id, rows, fingerprint)`.
pub(crate) fn published(
    conn: &Conn,
    dag_id: &str,
    task_id: &str,
    interval_start: i64,
) -> Result<Option<(i64, i64, Option<String>)>> {
    Ok(conn
        .prepare_cached(
            "SELECT try_id, rows, fingerprint FROM published
             WHERE dag_id = $1 AND task_id = $2 AND interval_start = $3",
        )?
        .query_row(params![dag_id, task_id, interval_start], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?)
}

/// A try that decided to publish but may not have finished.
#[derive(Debug, Clone)]
pub struct PendingPublish {
    pub try_id: i64,
    pub run_id: i64,
    pub dag_id: String,
    pub task_id: String,
    pub interval: DataInterval,
    /// The audit file (or, for a manifest of an older version, the audit table in the
    /// warehouse).
    pub audit_path: Option<String>,
    pub audit_table: Option<String>,
    pub record: TryRecord,
}

/// Tries of a backfill's runs that recorded a publish intent and never finished it.
pub(crate) fn pending_publishes(conn: &Conn, claimed: Owner) -> Result<Vec<PendingPublish>> {
    let (runs, id) = super::runs::claimed_runs(claimed);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT t.id, t.run_id, r.dag_id, t.task_id, r.interval_start, r.interval_end,
                t.audit_path, t.audit_table, t.rows, t.fingerprint, t.source_rows,
                t.previous_rows, t.verdict, t.reasons, t.source_fingerprint, t.promoted_from,
                t.restored_from, t.restore_key, t.rows_inserted, t.rows_updated, t.rows_deleted,
                t.rows_unchanged
         FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE {runs} AND t.publishing = TRUE ORDER BY t.id"
    ))?;
    let rows = stmt.query_map([id], |r| {
        Ok(PendingPublish {
            try_id: r.get(0)?,
            run_id: r.get(1)?,
            dag_id: r.get(2)?,
            task_id: r.get(3)?,
            interval: DataInterval::from_unix(r.get(4)?, r.get(5)?),
            audit_path: r.get(6)?,
            audit_table: r.get(7)?,
            record: TryRecord {
                rows: r.get(8)?,
                fingerprint: r.get(9)?,
                source_rows: r.get(10)?,
                previous_rows: r.get(11)?,
                verdict: r.get(12)?,
                reasons: r.get(13)?,
                source_fingerprint: r.get(14)?,
                promoted_from: r.get(15)?,
                restored_from: r.get(16)?,
                restore_key: r.get(17)?,
                rows_inserted: r.get(18)?,
                rows_updated: r.get(19)?,
                rows_deleted: r.get(20)?,
                rows_unchanged: r.get(21)?,
                ..TryRecord::new(TryState::Succeeded)
            },
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Whether a try still has an unfinished publish intent.
pub(crate) fn publishing(conn: &Conn, try_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT publishing FROM task_tries WHERE id = $1")?
        .query_row([try_id], |r| r.get::<_, bool>(0))
        .optional()?
        .unwrap_or(false))
}

/// Whether a try may publish now: it is running and its intent is recorded (unless `intent` is
/// false: a publish that records itself, see [`IN_PUBLISH`]), its backfill still holds the
/// interval's lease, no newer try of its task and interval is published, and (for the owner's
/// own publish) the owner's epoch is current. Asked inside the warehouse's publish
/// transaction, after the warehouse's write lock is taken.
pub(crate) fn may_publish(
    conn: &Conn,
    try_id: i64,
    owner: Option<Owner>,
    intent: bool,
) -> Result<bool> {
    type Row = (
        bool,
        i64,
        i64,
        String,
        String,
        i64,
        Option<i64>,
        Option<i64>,
    );
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT (t.publishing = TRUE OR $2 = 0) AND t.state = 'running', b.id, b.epoch, r.dag_id, t.task_id,
                    r.interval_start, r.worker, w.epoch
             FROM task_tries t JOIN runs r ON r.id = t.run_id JOIN backfills b ON b.id = r.backfill_id
             LEFT JOIN workers w ON w.id = r.worker
             WHERE t.id = $1",
        )?
        .query_row(params![try_id, intent], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
            ))
        })
        .optional()?;
    let Some((publishing, backfill_id, epoch, dag_id, task_id, start, worker, worker_epoch)) = row
    else {
        return Ok(false);
    };
    if !publishing || !try_holds_lease(conn, try_id)? {
        return Ok(false);
    }
    // The process that publishes its own try: its epoch (a worker's own) must be current.
    if let Some(o) = owner {
        let current = match o.worker {
            None => worker.is_none() && epoch == o.epoch,
            Some(w) => worker == Some(w) && worker_epoch == Some(o.epoch),
        };
        if o.backfill_id != backfill_id || !current {
            return Ok(false);
        }
    }
    let newer = published(conn, &dag_id, &task_id, start)?.is_some_and(|(t, ..)| t > try_id);
    Ok(!newer)
}

/// What a task's partition of an interval holds now, as the manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The published try.
    pub try_id: i64,
    pub rows: i64,
    /// Whose rows they are: the try itself, or, for a rollback, the try whose rows it put back
    /// (`None` when they predate the manifest). A publish keeps them as the version of this.
    pub content: Option<i64>,
    /// The fingerprint of the published rows, when it is known.
    pub fingerprint: Option<String>,
}

/// The currently published try of a task and interval, with its rows and content.
pub(crate) fn current(
    conn: &Conn,
    dag_id: &str,
    task_id: &str,
    interval_start: i64,
) -> Result<Option<Current>> {
    Ok(conn
        .prepare_cached(
            "SELECT p.try_id, p.rows,
                    CASE WHEN t.verdict = $4 THEN t.restored_from ELSE p.try_id END,
                    p.fingerprint
             FROM published p LEFT JOIN task_tries t ON t.id = p.try_id
             WHERE p.dag_id = $1 AND p.task_id = $2 AND p.interval_start = $3",
        )?
        .query_row(params![dag_id, task_id, interval_start, ROLLED_BACK], |r| {
            Ok(Current {
                try_id: r.get(0)?,
                rows: r.get(1)?,
                content: r.get(2)?,
                fingerprint: r.get(3)?,
            })
        })
        .optional()?)
}

/// The rows of a task's published partitions before `before` (an interval's start), newest
/// first, at most `limit`: what the gate's `history` compares with. Read through the
/// primary key, never a scan.
pub(crate) fn history(
    conn: &Conn,
    dag_id: &str,
    task_id: &str,
    before: i64,
    limit: i64,
) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT rows FROM published
         WHERE dag_id = $1 AND task_id = $2 AND interval_start < $3
         ORDER BY interval_start DESC LIMIT $4",
    )?;
    let rows = stmt.query_map(params![dag_id, task_id, before, limit], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The verdict of a rollback try.
pub(crate) const ROLLED_BACK: &str = crate::state::Verdict::RolledBack.as_str();

/// A task's published partition as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub task_id: String,
    pub interval: DataInterval,
    pub rows: i64,
}

/// The published partitions of a DAG whose interval starts between `lo` and `hi` (unix
/// seconds, both included), by task then start.
pub(crate) fn partitions(conn: &Conn, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<Recorded>> {
    let mut stmt = conn.prepare_cached(
        "SELECT task_id, interval_start, interval_end, rows FROM published
         WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
         ORDER BY task_id, interval_start",
    )?;
    let rows = stmt.query_map(params![dag_id, lo, hi], |r| {
        let (start, end): (i64, i64) = (r.get(1)?, r.get(2)?);
        Ok(Recorded {
            task_id: r.get(0)?,
            interval: DataInterval::from_unix(start, end),
            rows: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}
