//! Runs, task tries and publications. The owner's writes are fenced (see
//! [`super::backfills::fence`]); the writes of a process that recovers what a dead owner left are
//! conditional on the state they found, so that two recoverers never undo each other.

use rusqlite::params;

use super::db::Optional;

use super::db::{Conn, Params, Row, Step, ended};

use super::Result;
use super::backfills::{Fenced, Owner};
use crate::clock::End;
use crate::interval::DataInterval;
use crate::liveness::Group;
use crate::state::{RunState, TryState};

pub use super::record::TryRecord;
pub use super::staged::Staged;
pub(crate) use super::staged::{discard_staged, is_staged, set_promoted_from, set_staged, staged};

/// What came of starting an interval's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Started: the run's id.
    Run(i64),
    /// The backfill no longer holds the interval's lease, or another of its processes runs it
    /// (a worker, or the owner): not this process's to run.
    Lost,
    /// The backfill runs `max_active_runs` intervals already, across its processes: try again
    /// once one has ended.
    Busy,
    /// The backfill reached its `--max-failures`, across its processes: start nothing more.
    Halted,
    /// The run's id was reserved (see [`reserve_run_ids`]) before a run of the same interval,
    /// or before the backfill's owner took it, was recorded with a larger id: recorded now, it
    /// would not be the interval's latest run (the largest id). Nothing was recorded; start
    /// again with a fresh id.
    Stale,
}

/// A run whose id was reserved before its first try's process was spawned (see
/// [`reserve_run_ids`]), with that process's group: the run, the try and the group are recorded
/// in one statement, so that the try is let go after one commit instead of two.
#[derive(Debug, Clone, Copy)]
pub struct Early {
    pub run_id: i64,
    pub group: Group,
}

/// Reserves `n` run ids for starts that need their id before they are recorded (the run's id is
/// in its try's environment and log path, which a process spawned before the start is given).
/// Ids come from the runs' own sequence, so that they never collide with another start's; a
/// reserved id is recorded only while it is the largest of its interval's runs (see
/// [`Start::Stale`]), so that an interval's latest run is still its largest id. None on SQLite
/// (its writer is in this process, and a start there costs no round trip to save), nor for a
/// role that may write the tables but not use their sequences (its inserts take the columns'
/// defaults, which need no privilege on them; asking for an id would fail the transaction).
pub(crate) fn reserve_run_ids(conn: &Conn, n: u32) -> Result<Vec<i64>> {
    if !conn.is_postgres() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::new();
    // The privilege is a condition of the whole query, judged before any row is made.
    let mut stmt = conn.prepare_cached(
        "WITH s AS (SELECT pg_get_serial_sequence('runs', 'id') AS seq)
         SELECT nextval(s.seq) FROM s, generate_series(1, $1)
         WHERE has_sequence_privilege(s.seq, 'USAGE') OR has_sequence_privilege(s.seq, 'UPDATE')",
    )?;
    let mut rows = stmt.query([i64::from(n)])?;
    while let Some(r) = rows.next()? {
        ids.push(r.get(0)?);
    }
    Ok(ids)
}

/// The lease of interval `$2`/`$3` is the backfill `$1`'s, no run of it is in flight, and the
/// backfill was not asked to stop (its processes hear of it at their next heartbeat: none
/// starts a run meanwhile).
const FREE_LEASE: &str = "SELECT 1 FROM leases l
     WHERE l.dag_id = $2 AND l.interval_start = $3 AND l.backfill_id = $1
       AND (l.run_id IS NULL OR NOT EXISTS (
           SELECT 1 FROM runs f WHERE f.id = l.run_id AND f.state IN ('queued', 'running')))
       AND EXISTS (SELECT 1 FROM backfills c WHERE c.id = $1 AND c.cancel_requested = FALSE)";

/// Backfill `$1` has reached its `--max-failures`: that many of its runs failed or were
/// rejected since its owner took it, in any of its processes.
const HALTED: &str = "SELECT 1 FROM backfills h
     WHERE h.id = $1 AND h.max_failures IS NOT NULL
       AND (SELECT COUNT(*) FROM runs x WHERE x.backfill_id = $1
              AND x.state IN ('failed', 'rejected') AND x.id > h.runs_before) >= h.max_failures";

/// Backfill `$1` may start another run in the process `$7` (a worker, or NULL: the owner): it
/// has no running worker (its one process bounds its runs), or fewer runs in flight than its
/// `max_active_runs`, of which this process runs fewer than its even share among the backfill's
/// live processes (the owner and the workers with a heartbeat since `$6 - $8`), so that each
/// of them gets its turn.
const ROOM: &str = "SELECT 1 WHERE NOT EXISTS (
         SELECT 1 FROM workers WHERE backfill_id = $1 AND state = 'running')
     OR ((SELECT COUNT(*) FROM runs WHERE backfill_id = $1 AND state IN ('queued', 'running'))
            < (SELECT max_active_runs FROM backfills WHERE id = $1)
         AND (SELECT COUNT(*) FROM runs WHERE backfill_id = $1 AND state IN ('queued', 'running')
                AND COALESCE(worker, 0) = COALESCE(CAST($7 AS bigint), 0))
            < ((SELECT max_active_runs FROM backfills WHERE id = $1)
               + (SELECT COUNT(*) FROM workers WHERE backfill_id = $1 AND state = 'running'
                    AND heartbeat_at > CAST($6 AS bigint) - CAST($8 AS bigint)))
              / (1 + (SELECT COUNT(*) FROM workers WHERE backfill_id = $1 AND state = 'running'
                    AND heartbeat_at > CAST($6 AS bigint) - CAST($8 AS bigint))))";

/// Whether a run may start, in one query over the run's values (see [`start_run`]): 0 the lease
/// is not free ([`Start::Lost`]), 2 [`Start::Halted`], 1 no room ([`Start::Busy`]), 3 it may.
static VERDICT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT CASE WHEN NOT EXISTS ({FREE_LEASE}) THEN 0 WHEN EXISTS ({HALTED}) THEN 2
                     WHEN NOT EXISTS ({ROOM}) THEN 1 ELSE 3 END"
    )
});

/// What a verdict (see [`VERDICT`]) says when no run was started.
fn refused(verdict: i64) -> Start {
    match verdict {
        1 => Start::Busy,
        2 => Start::Halted,
        4 => Start::Stale,
        _ => Start::Lost,
    }
}

/// Records that an interval's run started, by the owner or the worker `fenced` names, and names
/// the run in the interval's lease (with its first try: [`start_run_and_try`]).
pub fn start_run(
    conn: &Conn,
    fenced: Fenced,
    dag_id: &str,
    interval: DataInterval,
    now_ms: i64,
    lease_timeout_ms: i64,
) -> Result<Start> {
    let start = interval.start.timestamp();
    let (backfill_id, end) = (fenced.backfill_id(), interval.end.timestamp());
    let worker = fenced.owner().worker;
    let row: &[&dyn rusqlite::ToSql] = &[
        &backfill_id,
        &dag_id,
        &start,
        &end,
        &RunState::Running,
        &now_ms,
        &worker,
        &lease_timeout_ms,
    ];
    // Bound by position: the verdict reads $1 to $3 and $6 to $8 of the run's values.
    let verdict: i64 = conn
        .prepare_cached(&VERDICT)?
        .query_row(row, |r| r.get(0))?;
    if verdict != 3 {
        return Ok(refused(verdict));
    }
    // An id above every one given, also to runs that `forget` removed.
    let (id, new_id) = super::forgets::new_id(conn, "runs");
    let run_id: i64 = conn
        .prepare_cached(&format!(
            "INSERT INTO runs ({id}backfill_id, dag_id, interval_start, interval_end, state,
                               started_at, worker)
             VALUES ({new_id}$1, $2, $3, $4, $5, $6, $7) RETURNING id",
        ))?
        .query_row(&row[..7], |r| r.get(0))?;
    conn.prepare_cached(
        "UPDATE leases SET run_id = $4 WHERE dag_id = $1 AND interval_start = $2 AND backfill_id = $3",
    )?
    .execute(params![dag_id, start, fenced.backfill_id(), run_id])?;
    Ok(Start::Run(run_id))
}

/// Records that an interval's run started, as [`start_run`] does, and its first try, whose log
/// path is `log.0`, the run's id, then `log.1`: one round trip on PostgreSQL. Returns the try's
/// id with [`Start::Run`]. With `early` (PostgreSQL only), the run takes its reserved id and the
/// try its process group, in the same statement.
#[expect(
    clippy::too_many_arguments,
    reason = "a run and its first try, started in one statement batch: the parts of both"
)]
pub(crate) fn start_run_and_try(
    conn: &Conn,
    fenced: Fenced,
    dag_id: &str,
    interval: DataInterval,
    now_ms: i64,
    lease_timeout_ms: i64,
    task_id: &str,
    try_number: u32,
    log: (&str, &str),
    early: Option<Early>,
) -> Result<Step<(Start, Option<i64>)>> {
    if !conn.is_postgres() {
        if early.is_some() {
            return Err(super::Error::Invalid(
                "run ids are reserved on a PostgreSQL manifest only".into(),
            ));
        }
        let started = start_run(conn, fenced, dag_id, interval, now_ms, lease_timeout_ms)?;
        let Start::Run(run_id) = started else {
            return Ok(Step::Done((started, None)));
        };
        let path = format!("{}{run_id}{}", log.0, log.1);
        let try_id = insert_try(conn, fenced, run_id, task_id, try_number, &path, now_ms)?;
        return Ok(Step::Done((started, Some(try_id))));
    }
    let (backfill_id, dag, start, worker) = (
        fenced.backfill_id(),
        dag_id.to_string(),
        interval.start.timestamp(),
        fenced.owner().worker,
    );
    let row: &[&dyn rusqlite::ToSql] = &[
        &backfill_id,
        &dag,
        &start,
        &interval.end.timestamp(),
        &RunState::Running,
        &now_ms,
        &worker,
        &lease_timeout_ms,
        &task_id,
        &try_number,
        &log.0,
        &log.1,
        &early.map(|e| e.run_id),
        &early.map(|e| e.group.pgid),
        &early.and_then(|e| e.group.leader_start),
    ];
    // The reserved id, when there is one; else the column's own default (which, unlike a
    // `nextval` in the statement, needs no privilege on the sequence).
    let (id, reserved) = if early.is_some() {
        ("id, ", "CAST($13 AS bigint), ")
    } else {
        ("", "")
    };
    conn.defer(
        &format!(
            "WITH held AS ({FREE_LEASE}),
             halted AS ({HALTED}),
             room AS ({ROOM}),
             fresh AS (
                 SELECT 1 WHERE CAST($13 AS bigint) IS NULL
                    OR (CAST($13 AS bigint) > (SELECT runs_before FROM backfills WHERE id = $1)
                        AND NOT EXISTS (SELECT 1 FROM runs WHERE dag_id = $2
                                        AND interval_start = $3 AND id > $13))),
             run AS (
                 INSERT INTO runs ({id}backfill_id, dag_id, interval_start, interval_end, state,
                                   started_at, worker)
                 SELECT {reserved}CAST($1 AS bigint), CAST($2 AS text), CAST($3 AS bigint),
                        CAST($4 AS bigint), CAST($5 AS text), CAST($6 AS bigint),
                        CAST($7 AS bigint)
                 FROM held, room, fresh WHERE NOT EXISTS (SELECT 1 FROM halted) RETURNING id),
             named AS (
                 UPDATE leases SET run_id = (SELECT id FROM run)
                 WHERE dag_id = $2 AND interval_start = $3 AND backfill_id = $1
                   AND EXISTS (SELECT 1 FROM run)),
             try AS (
                 INSERT INTO task_tries (run_id, task_id, try_number, state, started_at, log_path,
                                         host, pgid, pgid_start)
                 SELECT run.id, CAST($9 AS text), CAST($10 AS bigint), 'running',
                        CAST($6 AS bigint),
                        CAST($11 AS text) || CAST(run.id AS text) || CAST($12 AS text),
                        COALESCE(w.host, b.owner_host), CAST($14 AS bigint), CAST($15 AS bigint)
                 FROM run JOIN backfills b ON b.id = CAST($1 AS bigint)
                 LEFT JOIN workers w ON w.id = CAST($7 AS bigint)
                 RETURNING id)
             SELECT (SELECT id FROM run), (SELECT id FROM try),
                    CASE WHEN NOT EXISTS (SELECT 1 FROM held) THEN 0
                         WHEN EXISTS (SELECT 1 FROM halted) THEN 2
                         WHEN NOT EXISTS (SELECT 1 FROM room) THEN 1 ELSE 4 END"
        ),
        row.values()?,
        |rows| {
            let r = Row::Pg(rows.first().ok_or(super::db::Error::NoRows)?);
            let (run, try_id, verdict): (Option<i64>, Option<i64>, i64) =
                (r.get(0)?, r.get(1)?, r.get(2)?);
            Ok(match (run, try_id) {
                (Some(run), Some(try_id)) => (Start::Run(run), Some(try_id)),
                _ => (refused(verdict), None),
            })
        },
        // Its answer lost after the commit: the run it started, read by its values (this
        // process's, at the transaction's time); none, and the start is tried again (which
        // asks the same questions anew).
        move |conn| {
            let started = conn
                .prepare_cached(
                    "SELECT r.id, t.id FROM runs r JOIN task_tries t ON t.run_id = r.id
                     WHERE r.backfill_id = $1 AND r.dag_id = $2 AND r.interval_start = $3
                       AND r.started_at = $4 AND t.try_number = $5
                       AND COALESCE(r.worker, 0) = COALESCE(CAST($6 AS bigint), 0)
                     ORDER BY r.id DESC LIMIT 1",
                )?
                .query_row(
                    params![backfill_id, dag, start, now_ms, try_number, worker],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            Ok(match started {
                Some((run, try_id)) => (Start::Run(run), Some(try_id)),
                None => (Start::Busy, None),
            })
        },
    )
}

/// Whether the backfill of a try's run still holds that interval's lease: a try whose interval
/// was taken over may neither be let go nor publish.
pub(crate) fn try_holds_lease(conn: &Conn, try_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM task_tries t JOIN runs r ON r.id = t.run_id
             JOIN leases l ON l.dag_id = r.dag_id AND l.interval_start = r.interval_start
                          AND l.backfill_id = r.backfill_id
             WHERE t.id = $1",
        )?
        .query_row([try_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Whether the backfill of a run still holds that interval's lease.
fn run_holds_lease(conn: &Conn, run_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM runs r
             JOIN leases l ON l.dag_id = r.dag_id AND l.interval_start = r.interval_start
                          AND l.backfill_id = r.backfill_id
             WHERE r.id = $1",
        )?
        .query_row([run_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Whether a run is still in progress (not abandoned by a taker).
pub(crate) fn in_progress(conn: &Conn, run_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT state FROM runs WHERE id = $1")?
        .query_row([run_id], |r| r.get::<_, RunState>(0))
        .optional()?
        .is_some_and(|s| !s.is_finished()))
}

/// Records a finished run and releases its lease.
pub fn finish_run(
    conn: &Conn,
    _fenced: Fenced,
    run_id: i64,
    state: RunState,
    error: Option<&str>,
    end: End,
) -> Result<()> {
    end_run(conn, run_id, state, error, end)
}

/// `UPDATE runs` of [`end_run`]: the run `$1` ends in state `$2` with error `$4` (now `$3`,
/// `$5` milliseconds after its start).
static END_RUN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE runs SET state = $2, ended_at = {}, error = $4
         WHERE id = $1 AND state IN ('queued', 'running')",
        ended("started_at", "$3", "$5")
    )
});

/// Ends a run still in progress and releases the lease it holds.
fn end_run(conn: &Conn, run_id: i64, state: RunState, error: Option<&str>, end: End) -> Result<()> {
    let values = params![run_id, state, end.now_ms, error, end.elapsed_ms];
    if conn.is_postgres() {
        // One round trip: the run ended, and its lease (joined by primary key) released.
        conn.prepare_cached(&format!(
            "WITH ended AS ({})
             DELETE FROM leases l USING runs r
             WHERE r.id = $1 AND l.dag_id = r.dag_id AND l.interval_start = r.interval_start
               AND l.backfill_id = r.backfill_id",
            *END_RUN
        ))?
        .execute(values)?;
        return Ok(());
    }
    conn.prepare_cached(&END_RUN)?.execute(values)?;
    // By primary key: the lease of this run's interval, if this run's backfill holds it. (A
    // `DELETE ... WHERE (key) IN (SELECT ...)` would build a temporary table for every run.)
    let key = conn
        .prepare_cached("SELECT dag_id, interval_start, backfill_id FROM runs WHERE id = $1")?
        .query_row([run_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    if let Some((dag_id, interval_start, backfill_id)) = key {
        conn.prepare_cached(
            "DELETE FROM leases WHERE dag_id = $1 AND interval_start = $2 AND backfill_id = $3",
        )?
        .execute(params![dag_id, interval_start, backfill_id])?;
    }
    Ok(())
}

/// Records that a try started; returns its id, or `None` when its run was abandoned or its
/// interval taken over.
pub(crate) fn start_try(
    conn: &Conn,
    fenced: Fenced,
    run_id: i64,
    task_id: &str,
    try_number: u32,
    log_path: &str,
    now_ms: i64,
) -> Result<Option<i64>> {
    if !in_progress(conn, run_id)? || !run_holds_lease(conn, run_id)? {
        return Ok(None);
    }
    insert_try(conn, fenced, run_id, task_id, try_number, log_path, now_ms).map(Some)
}

/// Records the first try of a run started in the same transaction (which checked the lease).
pub(crate) fn insert_try(
    conn: &Conn,
    _fenced: Fenced,
    run_id: i64,
    task_id: &str,
    try_number: u32,
    log_path: &str,
    now_ms: i64,
) -> Result<i64> {
    // A try runs on the host of the process that started its run (the owner, or a worker):
    // recorded now, for tries with no process group too (SQL).
    // An id above every one given, also to tries that `forget` removed.
    let (id, new_id) = super::forgets::new_id(conn, "task_tries");
    Ok(conn
        .prepare_cached(&format!(
            "INSERT INTO task_tries ({id}run_id, task_id, try_number, state, started_at, log_path,
                                     host)
             SELECT {new_id}r.id, CAST($2 AS TEXT), CAST($3 AS BIGINT), CAST($4 AS TEXT), CAST($5 AS BIGINT),
                    CAST($6 AS TEXT), COALESCE(w.host, b.owner_host)
             FROM runs r JOIN backfills b ON b.id = r.backfill_id
             LEFT JOIN workers w ON w.id = r.worker WHERE r.id = $1
             RETURNING id",
        ))?
        .query_row(
            params![
                run_id,
                task_id,
                try_number,
                TryState::Running,
                now_ms,
                log_path
            ],
            |r| r.get(0),
        )?)
}

/// Records the process group of a try before it is let go; `false` when the try is no longer
/// running (it must then never be let go).
pub(crate) fn set_try_group(
    conn: &Conn,
    _fenced: Fenced,
    try_id: i64,
    group: Group,
    host: &str,
) -> Result<Step<bool>> {
    // Only while the try's backfill holds its interval's lease (see [`try_holds_lease`]).
    conn.defer(
        "UPDATE task_tries SET pgid = $2, pgid_start = $3, host = $4
         WHERE id = $1 AND state = 'running' AND EXISTS (
             SELECT 1 FROM runs r
             JOIN leases l ON l.dag_id = r.dag_id AND l.interval_start = r.interval_start
                          AND l.backfill_id = r.backfill_id
             WHERE r.id = task_tries.run_id)
         RETURNING id",
        params![try_id, group.pgid, group.leader_start, host].values()?,
        |rows| Ok(rows.len() == 1),
        // Its answer lost after the commit: whether the try holds that group now.
        move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT 1 FROM task_tries WHERE id = $1 AND pgid = $2 AND state = 'running'",
                )?
                .query_row(params![try_id, group.pgid], |_| Ok(()))
                .optional()?
                .is_some())
        },
    )
}

/// Records the audit file of a SQL try, so that it can be removed should the owner die.
pub(crate) fn set_try_audit(conn: &Conn, _fenced: Fenced, try_id: i64, path: &str) -> Result<()> {
    conn.prepare_cached(
        "UPDATE task_tries SET audit_path = $2 WHERE id = $1 AND state = 'running'",
    )?
    .execute(params![try_id, path])?;
    Ok(())
}

/// Records the end of a try of the owner.
pub(crate) fn finish_try(
    conn: &Conn,
    _fenced: Fenced,
    try_id: i64,
    rec: &TryRecord,
    end: End,
) -> Result<()> {
    end_try(conn, try_id, rec, end)
}

/// A try's end: its record in `$2` to `$19` and `$21` to `$24`, the try `$1`, if it is still
/// running; `$3` is now and `$20` the milliseconds since its start (see [`ended`]).
static END_TRY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE task_tries SET state = $2, ended_at = {}, exit_code = $4, error = $5,
        rows = $6, partitions = $7, inputs = $8, fingerprint = $9, source_rows = $10,
        previous_rows = $11, verdict = $12, reasons = $13, source_fingerprint = $14, staged = $15,
        staged_path = $16, promoted_from = $17, restored_from = $18, batch = $19, publishing = FALSE,
        rows_inserted = $21, rows_updated = $22, rows_deleted = $23, rows_unchanged = $24
     WHERE id = $1 AND state = 'running'",
        ended("started_at", "$3", "$20")
    )
});

/// The values of [`END_TRY`], then `more`.
fn end_try_values<'a>(
    try_id: &'a i64,
    rec: &'a TryRecord,
    end: &'a End,
    more: &[&'a dyn rusqlite::ToSql],
) -> Vec<&'a dyn rusqlite::ToSql> {
    let mut v: Vec<&dyn rusqlite::ToSql> = vec![
        try_id,
        &rec.state,
        &end.now_ms,
        &rec.exit_code,
        &rec.error,
        &rec.rows,
        &rec.partitions,
        &rec.inputs,
        &rec.fingerprint,
        &rec.source_rows,
        &rec.previous_rows,
        &rec.verdict,
        &rec.reasons,
        &rec.source_fingerprint,
        &rec.staged,
        &rec.staged_path,
        &rec.promoted_from,
        &rec.restored_from,
        &rec.batch,
        &end.elapsed_ms,
        &rec.rows_inserted,
        &rec.rows_updated,
        &rec.rows_deleted,
        &rec.rows_unchanged,
    ];
    v.extend_from_slice(more);
    v
}

/// Records a try's end and its run's end, releasing the run's lease: one round trip on
/// PostgreSQL (a try that stages an output also discards older ones, see [`end_try`]).
#[expect(
    clippy::too_many_arguments,
    reason = "a run's last try and the run, ended in one statement batch: the parts of both"
)]
pub(crate) fn finish_try_and_run(
    conn: &Conn,
    fenced: Fenced,
    try_id: i64,
    rec: &TryRecord,
    run_id: i64,
    state: RunState,
    error: Option<&str>,
    (try_end, run_end): (End, End),
) -> Result<Step<()>> {
    if !conn.is_postgres() || rec.staged == Some(crate::state::StagedState::Staged) {
        finish_try(conn, fenced, try_id, rec, try_end)?;
        return finish_run(conn, fenced, run_id, state, error, run_end).map(Step::Done);
    }
    let values = end_try_values(
        &try_id,
        rec,
        &try_end,
        &[&state, &error, &run_id, &run_end.elapsed_ms],
    );
    conn.defer(
        &format!(
            "WITH ended_try AS ({}),
         ended AS (
             UPDATE runs SET state = $25, ended_at = {}, error = $26
             WHERE id = $27 AND state IN ('queued', 'running'))
         DELETE FROM leases l USING runs r
         WHERE r.id = $27 AND l.dag_id = r.dag_id AND l.interval_start = r.interval_start
           AND l.backfill_id = r.backfill_id",
            *END_TRY,
            ended("started_at", "$3", "$28")
        ),
        values.as_slice().values()?,
        |_| Ok(()),
        // Committed: the ends are recorded, and the statement answers nothing.
        |_| Ok(()),
    )
}

/// Records the end of a try that is still running or publishing. A try that stages an output
/// supersedes the outputs that earlier tries of its backfill staged for the same task and
/// interval (an interval staged again after a crash): one staged output per task and interval
/// awaits promotion, the newest, and the others are discarded (unless a promote is publishing
/// one).
pub(crate) fn end_try(conn: &Conn, try_id: i64, rec: &TryRecord, end: End) -> Result<()> {
    let ended = conn
        .prepare_cached(&END_TRY)?
        .execute(end_try_values(&try_id, rec, &end, &[]).as_slice())?;
    if ended == 1 && rec.staged == Some(crate::state::StagedState::Staged) {
        conn.prepare_cached(
            "UPDATE task_tries SET staged = 'discarded'
             WHERE staged = 'staged' AND id != $1
               AND task_id = (SELECT task_id FROM task_tries WHERE id = $1)
               AND run_id IN (
                   SELECT o.id FROM runs o
                   JOIN runs r ON r.id = (SELECT run_id FROM task_tries WHERE id = $1)
                   WHERE o.backfill_id = r.backfill_id AND o.dag_id = r.dag_id
                     AND o.interval_start = r.interval_start)
               AND NOT EXISTS (
                   SELECT 1 FROM task_tries p WHERE p.promoted_from = task_tries.id
                     AND (p.state = 'running' OR p.publishing = TRUE))",
        )?
        .execute([try_id])?;
    }
    Ok(())
}

/// An unfinished try of a backfill: what a recoverer must kill, remove or finish.
#[derive(Debug, Clone)]
pub struct UnfinishedTry {
    pub try_id: i64,
    pub run_id: i64,
    pub dag_id: String,
    pub interval_start: i64,
    pub group: Option<Group>,
    pub host: Option<String>,
    pub audit_path: Option<String>,
    pub publishing: bool,
}

/// The runs (as `r`) that a recovery of `claimed` settles, as SQL with its one parameter: a
/// worker's own runs; for a backfill's owner, its own and those of its workers no longer
/// running (a live worker's runs are its own to finish).
pub(super) fn claimed_runs(claimed: Owner) -> (&'static str, i64) {
    match claimed.worker {
        Some(w) => ("r.worker = $1", w),
        None => (
            "r.backfill_id = $1 AND (r.worker IS NULL OR r.worker NOT IN
                (SELECT id FROM workers WHERE backfill_id = $1 AND state = 'running'))",
            claimed.backfill_id,
        ),
    }
}

/// The tries of the runs `claimed` settles (see [`claimed_runs`]) still running or publishing.
pub(crate) fn unfinished_tries(conn: &Conn, claimed: Owner) -> Result<Vec<UnfinishedTry>> {
    let (runs, id) = claimed_runs(claimed);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT t.id, t.run_id, r.dag_id, r.interval_start, t.pgid, t.pgid_start, t.host,
                t.audit_path, t.publishing
         FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE {runs} AND (t.state = 'running' OR t.publishing = TRUE)
         ORDER BY t.id"
    ))?;
    let rows = stmt.query_map([id], |r| {
        let pgid: Option<i64> = r.get(4)?;
        let leader_start: Option<i64> = r.get(5)?;
        Ok(UnfinishedTry {
            try_id: r.get(0)?,
            run_id: r.get(1)?,
            dag_id: r.get(2)?,
            interval_start: r.get(3)?,
            group: pgid.map(|pgid| Group { pgid, leader_start }),
            host: r.get(6)?,
            audit_path: r.get(7)?,
            publishing: r.get(8)?,
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Records the end of a try of a dead owner (killed, never started, or its publish finished by
/// the recoverer). Only a try still unfinished changes; returns whether it did.
pub(crate) fn end_abandoned_try(
    conn: &Conn,
    try_id: i64,
    rec: &TryRecord,
    now_ms: i64,
) -> Result<bool> {
    static END: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "UPDATE task_tries SET state = $2, ended_at = {}, error = COALESCE($4, error),
                rows = COALESCE($5, rows), fingerprint = COALESCE($6, fingerprint),
                source_rows = COALESCE($7, source_rows),
                previous_rows = COALESCE($8, previous_rows),
                source_fingerprint = COALESCE($9, source_fingerprint),
                rows_inserted = COALESCE($12, rows_inserted),
                rows_updated = COALESCE($13, rows_updated),
                rows_deleted = COALESCE($14, rows_deleted),
                rows_unchanged = COALESCE($15, rows_unchanged),
                publishing = FALSE,
                verdict = CASE WHEN $2 = 'succeeded' THEN COALESCE($10, verdict) END,
                reasons = CASE WHEN $2 = 'succeeded' THEN COALESCE($11, reasons) END
             WHERE id = $1 AND (state = 'running' OR publishing = TRUE)",
            ended("started_at", "$3", "NULL")
        )
    });
    let changed = conn.prepare_cached(&END)?.execute(params![
        try_id,
        rec.state,
        now_ms,
        rec.error,
        rec.rows,
        rec.fingerprint,
        rec.source_rows,
        rec.previous_rows,
        rec.source_fingerprint,
        rec.verdict,
        rec.reasons,
        rec.rows_inserted,
        rec.rows_updated,
        rec.rows_deleted,
        rec.rows_unchanged
    ])?;
    Ok(changed == 1)
}

/// The runs `claimed` settles (see [`claimed_runs`]) still in progress.
pub(crate) fn runs_in_progress(conn: &Conn, claimed: Owner) -> Result<Vec<i64>> {
    let (runs, id) = claimed_runs(claimed);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT r.id FROM runs r WHERE {runs} AND r.state IN ('queued', 'running')"
    ))?;
    let rows = stmt.query_map([id], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Ends runs of a dead backfill that are still in progress (from `runs`, as claimed): a run
/// whose every task has a succeeded try succeeded (a crash after its last publish); the others
/// are cancelled, except those whose interval is still held by a try that could not be stopped
/// (`keep`). Releases their leases.
pub(crate) fn end_abandoned_runs(
    conn: &Conn,
    runs: &[i64],
    task_counts: &dyn Fn(&str) -> Option<usize>,
    keep: &[i64],
    why: &str,
    now_ms: i64,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT r.dag_id,
                (SELECT COUNT(DISTINCT t.task_id) FROM task_tries t
                 WHERE t.run_id = r.id AND t.state = 'succeeded')
         FROM runs r WHERE r.id = $1 AND r.state IN ('queued', 'running')",
    )?;
    // Ended by another process than the one that started it: now, never before its start.
    let recovered = End {
        now_ms,
        elapsed_ms: None,
    };
    for &run_id in runs {
        if keep.contains(&run_id) {
            continue;
        }
        let Some((dag_id, succeeded)) = stmt
            .query_row([run_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })
            .optional()?
        else {
            continue;
        };
        let done = task_counts(&dag_id)
            .is_some_and(|n| usize::try_from(succeeded).is_ok_and(|s| s == n && n > 0));
        if done {
            end_run(conn, run_id, RunState::Succeeded, None, recovered)?;
        } else {
            end_run(conn, run_id, RunState::Cancelled, Some(why), recovered)?;
        }
    }
    Ok(())
}

/// The tries whose audit files must stay: publishes that were decided (a recovery redoes
/// them) and staged outputs, kept until promoted or discarded.
pub(crate) fn needing_audit_files(conn: &Conn) -> Result<std::collections::HashSet<i64>> {
    let mut stmt =
        conn.prepare("SELECT id FROM task_tries WHERE publishing = TRUE OR staged = 'staged'")?;
    let ids = stmt.query_map([], |r| r.get(0))?;
    Ok(ids.collect::<super::db::Result<_>>()?)
}

/// The lowest id of a try still running or publishing, else one above every try: the tries
/// below it are all recorded as ended.
pub(crate) fn first_unfinished_try(conn: &Conn) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT COALESCE((SELECT MIN(id) FROM task_tries WHERE state = 'running' OR publishing = TRUE),
                         (SELECT COALESCE(MAX(id), 0) + 1 FROM task_tries))",
        [],
        |r| r.get(0),
    )?)
}

/// The tries whose staged tables must stay: staged outputs and tries still running.
pub(crate) fn keeping_staged_tables(conn: &Conn) -> Result<std::collections::HashSet<i64>> {
    let mut stmt =
        conn.prepare("SELECT id FROM task_tries WHERE staged = 'staged' OR state = 'running'")?;
    let ids = stmt.query_map([], |r| r.get(0))?;
    Ok(ids.collect::<super::db::Result<_>>()?)
}

/// The interval starts of backfill `backfill_id` whose runs are still queued or running.
pub(crate) fn starts_in_progress(
    conn: &Conn,
    backfill_id: i64,
) -> Result<std::collections::HashSet<i64>> {
    Ok(conn
        .prepare(
            "SELECT interval_start FROM runs WHERE backfill_id = $1 AND state IN ('queued', 'running')",
        )?
        .query_map([backfill_id], |r| r.get(0))?
        .collect::<super::db::Result<_>>()?)
}

/// Whether a run of backfill `backfill_id` succeeded: the first one found, through the index
/// on runs by backfill, so the answer reads a few pages whatever the backfill's size.
pub(crate) fn any_succeeded(conn: &Conn, backfill_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE backfill_id = $1 AND state = 'succeeded')",
        )?
        .query_row([backfill_id], |r| r.get(0))?)
}
