//! Read queries behind `backfill serve`: an interval's tries, the pools' slots, the leases, a
//! DAG's partitions over time, and the figures of `/metrics`. Each is a fixed number of
//! indexed queries, bounded by its arguments (no query per row).

use rusqlite::params;
use serde::Serialize;

use super::Result;
use super::db::{Conn, Optional};
use super::queries::{ms_to_rfc3339, shown_verdict};
use crate::interval::{Rfc3339, from_unix};
use crate::state::{BackfillState, ShownVerdict, Verdict};
use crate::state::{RunState, TryState};

/// One try of an interval, as the status page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TryView {
    pub run_id: i64,
    pub run_state: RunState,
    pub try_id: i64,
    pub task: String,
    pub try_number: i64,
    pub state: TryState,
    pub host: Option<String>,
    pub started_at: String,
    pub duration_ms: Option<i64>,
    pub rows: Option<i64>,
    /// What the try's merge did (`write = "merge"`).
    pub changes: Option<super::queries::Changes>,
    pub source_rows: Option<i64>,
    pub previous_rows: Option<i64>,
    pub verdict: Option<ShownVerdict>,
    pub reasons: Option<String>,
    pub error: Option<String>,
    pub log: Option<String>,
    pub batch: Option<String>,
}

/// Every try of every run of a backfill's interval that starts at `start` (unix seconds), in
/// the order they ran.
pub(crate) fn interval_tries(conn: &Conn, backfill_id: i64, start: i64) -> Result<Vec<TryView>> {
    let mut stmt = conn.prepare(
        "SELECT r.id, r.state, t.id, t.task_id, t.try_number, t.state, t.host, t.started_at,
                t.ended_at, t.rows, t.source_rows, t.previous_rows, t.verdict, t.reasons,
                t.error, t.log_path, t.batch, t.staged, t.rows_inserted, t.rows_updated,
                t.rows_deleted, t.rows_unchanged
         FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE r.backfill_id = $1 AND r.interval_start = $2
         ORDER BY t.id",
    )?;
    let rows = stmt.query_map(params![backfill_id, start], |r| {
        let started: i64 = r.get(7)?;
        let ended: Option<i64> = r.get(8)?;
        let verdict: Option<Verdict> = r.get(12)?;
        let mut changes = None;
        super::queries::Changes::add(&mut changes, r, 18)?;
        Ok(TryView {
            changes,
            run_id: r.get(0)?,
            run_state: r.get(1)?,
            try_id: r.get(2)?,
            task: r.get(3)?,
            try_number: r.get(4)?,
            state: r.get(5)?,
            host: r.get(6)?,
            started_at: ms_to_rfc3339(started),
            duration_ms: ended.map(|e| e - started),
            rows: r.get(9)?,
            source_rows: r.get(10)?,
            previous_rows: r.get(11)?,
            verdict: match verdict {
                Some(v) => Some(shown_verdict(v, r.get(17)?)),
                None => None,
            },
            reasons: r.get(13)?,
            error: r.get(14)?,
            log: r.get(15)?,
            batch: r.get(16)?,
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// A pool slot in use: the try that holds it.
#[derive(Debug, Clone, Serialize)]
pub struct SlotView {
    pub pool: String,
    pub backfill_id: i64,
    pub try_id: i64,
    pub dag_id: String,
    pub interval_start: Rfc3339,
    pub task: String,
    pub host: Option<String>,
    pub taken_at: String,
}

/// The pools' slots in use, by pool then age.
pub(crate) fn pool_slots(conn: &Conn) -> Result<Vec<SlotView>> {
    let mut stmt = conn.prepare(
        "SELECT p.pool, p.backfill_id, p.try_id, r.dag_id, r.interval_start, t.task_id, t.host,
                p.taken_at
         FROM pool_slots p JOIN task_tries t ON t.id = p.try_id JOIN runs r ON r.id = t.run_id
         WHERE t.state = 'running'
         ORDER BY p.pool, p.taken_at, p.try_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(SlotView {
            pool: r.get(0)?,
            backfill_id: r.get(1)?,
            try_id: r.get(2)?,
            dag_id: r.get(3)?,
            interval_start: Rfc3339(from_unix(r.get(4)?)),
            task: r.get(5)?,
            host: r.get(6)?,
            taken_at: ms_to_rfc3339(r.get(7)?),
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The leases one backfill holds: how many, and its owner's heartbeat.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseView {
    pub backfill_id: i64,
    pub dag_id: String,
    pub leases: i64,
    pub first: Rfc3339,
    pub last: Rfc3339,
    pub owner_host: Option<String>,
    pub owner_pid: Option<i64>,
    /// The owner's last heartbeat (unix milliseconds).
    #[serde(skip)]
    pub heartbeat_ms: Option<i64>,
    pub heartbeat_at: Option<String>,
    pub backfill_state: crate::state::BackfillState,
    /// When the owner's process started, to judge it.
    #[serde(skip)]
    pub owner_start: Option<i64>,
}

/// The leases held, by backfill.
pub(crate) fn leases(conn: &Conn) -> Result<Vec<LeaseView>> {
    let mut stmt = conn.prepare(
        "SELECT l.backfill_id, l.dag_id, COUNT(*), MIN(l.interval_start), MAX(l.interval_start),
                b.owner_host, b.owner_pid, b.heartbeat_at, b.state, b.owner_start
         FROM leases l JOIN backfills b ON b.id = l.backfill_id
         GROUP BY l.backfill_id, l.dag_id, b.owner_host, b.owner_pid, b.heartbeat_at, b.state,
                  b.owner_start
         ORDER BY l.backfill_id",
    )?;
    let rows = stmt.query_map([], |r| {
        let heartbeat: Option<i64> = r.get(7)?;
        Ok(LeaseView {
            backfill_id: r.get(0)?,
            dag_id: r.get(1)?,
            leases: r.get(2)?,
            first: Rfc3339(from_unix(r.get(3)?)),
            last: Rfc3339(from_unix(r.get(4)?)),
            owner_host: r.get(5)?,
            owner_pid: r.get(6)?,
            heartbeat_ms: heartbeat,
            heartbeat_at: heartbeat.map(ms_to_rfc3339),
            backfill_state: r.get(8)?,
            owner_start: r.get(9)?,
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Every backfill's id, DAG and state, oldest first: what the status page's list filters and
/// pages before it counts the intervals of the page's backfills only.
pub(crate) fn heads(conn: &Conn) -> Result<Vec<(i64, String, crate::state::BackfillState)>> {
    let mut stmt = conn.prepare("SELECT id, dag_id, state FROM backfills ORDER BY id")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The DAGs the manifest has runs of, and how many interval starts each has.
pub(crate) fn dags(conn: &Conn) -> Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare(
        "SELECT dag_id, COUNT(DISTINCT interval_start) FROM runs GROUP BY dag_id ORDER BY dag_id",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The starts (unix seconds) of a DAG's intervals that have runs, newest first: `limit` of
/// them after skipping `skip`.
pub(crate) fn dag_starts(conn: &Conn, dag_id: &str, limit: i64, skip: i64) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT interval_start FROM runs WHERE dag_id = $1
         ORDER BY interval_start DESC LIMIT $2 OFFSET $3",
    )?;
    let rows = stmt.query_map(params![dag_id, limit, skip], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The starts of a DAG's published partitions in `[lo, hi]` (unix seconds), with their rows.
pub(crate) fn published(conn: &Conn, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(i64, i64)>> {
    let mut stmt = conn.prepare(
        "SELECT interval_start, CAST(SUM(rows) AS BIGINT) FROM published
         WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
         GROUP BY interval_start ORDER BY interval_start",
    )?;
    let rows = stmt.query_map(params![dag_id, lo, hi], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// What `/metrics` exposes, read in one go.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// `(dag, state, intervals)`: each interval by the state of its latest run.
    pub intervals: Vec<(String, RunState, i64)>,
    /// `(state, backfills)`.
    pub backfills: Vec<(BackfillState, i64)>,
    /// Task tries running now.
    pub tries_running: i64,
    /// The oldest heartbeat (unix ms) of a running backfill, when one runs.
    pub oldest_heartbeat_ms: Option<i64>,
    /// `(pool, slots in use)`.
    pub pool_slots: Vec<(String, i64)>,
    /// `(dag, end of the latest published interval, unix seconds)`.
    pub last_published: Vec<(String, i64)>,
    /// `(dag, reasons)` of every rejected try, for counting rejections by rule.
    pub rejections: Vec<(String, String)>,
    /// `(dag, reasons)` of every try published with the gate's warnings, for counting them by
    /// rule.
    pub warnings: Vec<(String, String)>,
    /// Leases held.
    pub leases: i64,
    /// `(dag, inserted, updated, deleted, unchanged)`: what the merges of each DAG's
    /// succeeded tries did.
    pub merged: Vec<(String, [i64; 4])>,
    /// The intervals waiting for their sources, by DAG and backfill recorded as running, with
    /// what judges whether its owner still runs.
    pub waiting_for_sources: Vec<Waiting>,
    /// `(dag, times)` an interval was given up on as `not ready`.
    pub not_ready: Vec<(String, i64)>,
}

/// Intervals of one DAG in one backfill recorded as running that wait for their sources, and
/// the backfill's owner, as the lease rule judges it (a killed owner's waits are no one's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Waiting {
    pub dag_id: String,
    pub intervals: i64,
    pub owner_pid: Option<i64>,
    pub owner_start: Option<i64>,
    pub owner_host: Option<String>,
    pub heartbeat_at: Option<i64>,
}

/// The figures of `/metrics`.
pub(crate) fn figures(conn: &Conn) -> Result<Figures> {
    let mut f = Figures::default();
    let mut stmt = conn.prepare(
        "SELECT r.dag_id, r.state, COUNT(*) FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs GROUP BY dag_id, interval_start) m ON m.id = r.id
         GROUP BY r.dag_id, r.state ORDER BY r.dag_id, r.state",
    )?;
    f.intervals = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<super::db::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT r.dag_id, COUNT(*), b.owner_pid, b.owner_start, b.owner_host, b.heartbeat_at
         FROM readiness r JOIN backfills b ON b.id = r.backfill_id
         WHERE r.state = 'waiting' AND b.state = 'running'
         GROUP BY r.dag_id, b.id, b.owner_pid, b.owner_start, b.owner_host, b.heartbeat_at
         ORDER BY r.dag_id, b.id",
    )?;
    f.waiting_for_sources = stmt
        .query_map([], |r| {
            Ok(Waiting {
                dag_id: r.get(0)?,
                intervals: r.get(1)?,
                owner_pid: r.get(2)?,
                owner_start: r.get(3)?,
                owner_host: r.get(4)?,
                heartbeat_at: r.get(5)?,
            })
        })?
        .collect::<super::db::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT dag_id, COUNT(*) FROM readiness WHERE state = 'not ready'
         GROUP BY dag_id ORDER BY dag_id",
    )?;
    f.not_ready = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    let mut stmt =
        conn.prepare("SELECT state, COUNT(*) FROM backfills GROUP BY state ORDER BY state")?;
    f.backfills = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    f.tries_running = conn.query_row(
        "SELECT COUNT(*) FROM task_tries WHERE state = 'running'",
        [],
        |r| r.get(0),
    )?;
    f.oldest_heartbeat_ms = conn.query_row(
        "SELECT MIN(heartbeat_at) FROM backfills WHERE state = 'running'",
        [],
        |r| r.get(0),
    )?;
    // A slot is held by a running try; one whose try ended waits for the next taker to free it.
    let mut stmt = conn.prepare(
        "SELECT p.pool, COUNT(*) FROM pool_slots p JOIN task_tries t ON t.id = p.try_id
         WHERE t.state = 'running' GROUP BY p.pool ORDER BY p.pool",
    )?;
    f.pool_slots = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    f.last_published = last_published(conn)?;
    let mut stmt = conn.prepare(
        "SELECT r.dag_id, t.reasons FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE t.verdict = 'rejected' AND t.reasons IS NOT NULL ORDER BY t.id",
    )?;
    f.rejections = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT r.dag_id, t.reasons FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE t.state = 'succeeded' AND t.reasons LIKE '%warning: %'
           AND COALESCE(t.verdict, '') <> 'staged' ORDER BY t.id",
    )?;
    f.warnings = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    f.leases = conn.query_row("SELECT COUNT(*) FROM leases", [], |r| r.get(0))?;
    let mut stmt = conn.prepare(
        "SELECT r.dag_id, CAST(SUM(t.rows_inserted) AS BIGINT), CAST(SUM(t.rows_updated) AS BIGINT),
                CAST(SUM(t.rows_deleted) AS BIGINT), CAST(SUM(t.rows_unchanged) AS BIGINT)
         FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE t.state = 'succeeded' AND t.rows_inserted IS NOT NULL
         GROUP BY r.dag_id ORDER BY r.dag_id",
    )?;
    f.merged = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, [r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?]))
        })?
        .collect::<super::db::Result<_>>()?;
    Ok(f)
}

/// The end of the latest published interval of each DAG: of the partitions its tasks published,
/// or of its latest succeeded run that was not only staged (a task without a gate publishes
/// what it wrote as it succeeds, and records no partition).
fn last_published(conn: &Conn) -> Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare(
        "SELECT dag_id, MAX(interval_end) FROM published GROUP BY dag_id ORDER BY dag_id",
    )?;
    let mut ends: std::collections::BTreeMap<String, i64> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    let mut dags = conn.prepare("SELECT DISTINCT dag_id FROM backfills")?;
    let dags: Vec<String> = dags
        .query_map([], |r| r.get(0))?
        .collect::<super::db::Result<_>>()?;
    // The DAG's runs from its latest interval down (the index's order): the first that
    // succeeded, in a backfill that published.
    let mut latest = conn.prepare(
        "SELECT r.interval_end FROM runs r JOIN backfills b ON b.id = r.backfill_id
         WHERE r.dag_id = $1 AND r.state = 'succeeded' AND b.kind <> 'stage'
         ORDER BY r.interval_start DESC LIMIT 1",
    )?;
    for dag in dags {
        let end: Option<i64> = latest.query_row([&dag], |r| r.get(0)).optional()?;
        if let Some(end) = end {
            let e = ends.entry(dag).or_insert(end);
            *e = (*e).max(end);
        }
    }
    Ok(ends.into_iter().collect())
}
