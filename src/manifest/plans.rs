//! Plans: what the manifest knows about intervals before planning, and the plan rows of a
//! backfill (one per interval, in execution order). A plan is written in chunks, each in its own
//! transaction together with the leases it takes, so that a large plan never holds the
//! manifest's write lock for long.

use std::collections::HashMap;

use rusqlite::params;
use rusqlite::types::Value;

use super::db::Optional;

use super::db::Conn;

use super::Result;
use super::backfills::Fenced;
use super::leases::{self, LeaseCtx};
use crate::interval::DataInterval;
use crate::plan::{Action, PlanRow, Prior, SkipReason};
use crate::state::RunState;

/// What the manifest knows about each interval (ascending), for planning: the latest run, and
/// whether a lease is held as `judge` says. Staged runs publish nothing and rollbacks put back
/// what earlier runs computed: only the runs of other backfills tell what was computed.
pub fn priors(
    conn: &Conn,
    dag_id: &str,
    intervals: &[DataInterval],
    ctx: &LeaseCtx,
    judge: leases::Judge,
) -> Result<Vec<Prior>> {
    let (Some(first), Some(last)) = (intervals.first(), intervals.last()) else {
        return Ok(Vec::new());
    };
    let (lo, hi) = (first.start.timestamp(), last.start.timestamp());
    let mut latest: HashMap<i64, RunState> = HashMap::new();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT r.interval_start, r.state FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs
               WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
                 AND backfill_id NOT IN {}
               GROUP BY interval_start) m ON r.id = m.id",
        crate::manifest::NOT_COMPUTING
    ))?;
    let mut rows = stmt.query(params![dag_id, lo, hi])?;
    while let Some(row) = rows.next()? {
        latest.insert(row.get(0)?, row.get(1)?);
    }
    let in_flight = leases::held(conn, dag_id, lo, hi, ctx, judge)?;
    Ok(intervals
        .iter()
        .map(|i| {
            let start = i.start.timestamp();
            Prior {
                latest: latest.get(&start).copied(),
                in_flight: in_flight.contains(&start),
                source_changed: false,
            }
        })
        .collect())
}

/// The latest state of the interval that ends where `start` begins, if any (for
/// `depends_on_past`).
pub(crate) fn state_before(conn: &Conn, dag_id: &str, start: i64) -> Result<Option<RunState>> {
    let before: Option<(i64, RunState)> = conn
        .prepare_cached(&format!(
            "SELECT interval_end, state FROM runs
             WHERE dag_id = $1 AND interval_start < $2 AND backfill_id NOT IN {}
             ORDER BY interval_start DESC, id DESC LIMIT 1",
            crate::manifest::NOT_COMPUTING
        ))?
        .query_row(params![dag_id, start], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(before.and_then(|(end, state)| (end == start).then_some(state)))
}

/// Writes plan rows (`(ord, row)`) and leases the intervals to run, for the owner.
pub fn insert_chunk(
    conn: &Conn,
    f: Fenced,
    dag_id: &str,
    rows: &[(i64, PlanRow)],
    ctx: &LeaseCtx,
) -> Result<()> {
    let leased = || {
        leases::take(
            conn,
            f.backfill_id(),
            dag_id,
            rows.iter()
                .filter(|(_, r)| r.action == Action::Run)
                .map(|(_, r)| r.interval),
            ctx,
        )
    };
    let Some(pg) = conn.postgres() else {
        // One prepared row at a time, with no copy of the values.
        let mut insert = conn.prepare_cached(
            "INSERT INTO plan (backfill_id, ord, interval_start, interval_end, action, reason)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )?;
        for (ord, row) in rows {
            let (action, reason) = match row.action {
                Action::Run => ("run", None),
                Action::Skip(r) => ("skip", Some(r.as_str())),
            };
            insert.execute(params![
                f.backfill_id(),
                ord,
                row.interval.start.timestamp(),
                row.interval.end.timestamp(),
                action,
                reason
            ])?;
        }
        return leased();
    };
    let mut values = Vec::with_capacity(rows.len() * 6);
    for (ord, row) in rows {
        let (action, reason) = match row.action {
            Action::Run => ("run", None),
            Action::Skip(r) => ("skip", Some(r.as_str())),
        };
        values.extend([
            Value::Integer(f.backfill_id()),
            Value::Integer(*ord),
            Value::Integer(row.interval.start.timestamp()),
            Value::Integer(row.interval.end.timestamp()),
            Value::Text(action.to_string()),
            reason.map_or(Value::Null, |r| Value::Text(r.to_string())),
        ]);
    }
    pg.insert_many(
        "INSERT INTO plan (backfill_id, ord, interval_start, interval_end, action, reason)",
        "",
        6,
        &values,
    )?;
    leased()
}

/// Interval starts that already have a plan row in a backfill.
pub(crate) fn planned_starts(
    conn: &Conn,
    backfill_id: i64,
) -> Result<std::collections::HashSet<i64>> {
    let mut stmt = conn.prepare_cached("SELECT interval_start FROM plan WHERE backfill_id = $1")?;
    let rows = stmt.query_map([backfill_id], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Changes a planned interval to a skip (decided while running, e.g. `depends_on_past`) and
/// releases its lease.
pub(crate) fn skip_planned(
    conn: &Conn,
    f: Fenced,
    dag_id: &str,
    interval_start: i64,
    reason: SkipReason,
) -> Result<()> {
    mark_skipped(conn, f.backfill_id(), interval_start, reason)?;
    leases::release(conn, f.backfill_id(), dag_id, interval_start)
}

/// Records a planned interval as skipped.
pub(crate) fn mark_skipped(
    conn: &Conn,
    backfill_id: i64,
    interval_start: i64,
    reason: SkipReason,
) -> Result<()> {
    conn.prepare_cached(
        "UPDATE plan SET action = 'skip', reason = $3 WHERE backfill_id = $1 AND interval_start = $2",
    )?
    .execute(params![backfill_id, interval_start, reason.as_str()])?;
    Ok(())
}

/// The planned intervals of a backfill that have not finished (`succeeded`, `failed` or
/// `rejected`) in it, in plan order.
pub(crate) fn unfinished(conn: &Conn, backfill_id: i64) -> Result<Vec<DataInterval>> {
    let mut stmt = conn.prepare(
        "SELECT p.interval_start, p.interval_end FROM plan p
         WHERE p.backfill_id = $1 AND p.action = 'run' AND NOT EXISTS (
            SELECT 1 FROM runs r WHERE r.backfill_id = p.backfill_id
              AND r.interval_start = p.interval_start
              AND r.state IN ('succeeded', 'failed', 'rejected'))
         ORDER BY p.ord",
    )?;
    let rows = stmt.query_map([backfill_id], |r| {
        Ok(DataInterval::from_unix(r.get(0)?, r.get(1)?))
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The latest run of each interval of `dag_id` starting in `[lo, hi]`: its state, backfill and
/// start time (unix milliseconds).
pub(crate) fn latest_runs(
    conn: &Conn,
    dag_id: &str,
    lo: i64,
    hi: i64,
) -> Result<HashMap<i64, (RunState, i64, i64)>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT r.interval_start, r.state, r.backfill_id, r.started_at FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs
               WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
                 AND backfill_id NOT IN {}
               GROUP BY interval_start) m ON r.id = m.id",
        crate::manifest::NOT_COMPUTING
    ))?;
    let rows = stmt.query_map(params![dag_id, lo, hi], |r| {
        Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}
