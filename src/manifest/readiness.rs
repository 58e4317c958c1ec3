//! Readiness (`[tasks.ready]`): what a backfill's checks answered for each interval and task
//! before its run started, kept in `readiness` (one row per backfill, interval and task, written
//! again at each ask). An interval still not ready when its wait ran out is skipped in its plan
//! as `not ready`, in the same transaction.

use super::Result;
use super::backfills::Fenced;
use super::db::Conn;
use crate::interval::DataInterval;
use crate::plan::SkipReason;
use crate::state::ReadyState;

/// One answer of a task's readiness check for an interval.
#[derive(Debug, Clone)]
pub struct Asked {
    pub dag_id: String,
    pub interval: DataInterval,
    pub task_id: String,
    pub state: ReadyState,
    /// How many times it was asked so far (this one included).
    pub asks: u32,
    /// What the check said: the query's value, or the command's last line of output.
    pub answer: Option<String>,
    /// How long the interval has waited so far (milliseconds), and may wait in all.
    pub waited_ms: i64,
    pub wait_ms: i64,
}

/// Records an answer (see the module's doc); a `not ready` one skips the interval. Only an
/// interval the backfill still plans to run and has not started is answered for: `false`, and
/// nothing written, when another process of the backfill (`backfill join`) started it or gave
/// up on it meanwhile.
pub(crate) fn note(conn: &Conn, f: Fenced, a: &Asked) -> Result<bool> {
    let start = a.interval.start.timestamp();
    let open: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM plan p JOIN leases l
               ON l.dag_id = $2 AND l.interval_start = p.interval_start
              AND l.backfill_id = p.backfill_id AND l.run_id IS NULL
             WHERE p.backfill_id = $1 AND p.interval_start = $3 AND p.action = 'run'",
        )?
        .query_row(rusqlite::params![f.backfill_id(), a.dag_id, start], |r| {
            r.get(0)
        })?;
    if open == 0 {
        return Ok(false);
    }
    let now = conn.clock_now_ms()?;
    conn.prepare_cached(
        "INSERT INTO readiness (backfill_id, dag_id, interval_start, interval_end, task_id, state,
            asks, answer, first_asked_at, last_asked_at, deadline)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (backfill_id, interval_start, task_id) DO UPDATE SET
            state = excluded.state, asks = excluded.asks, answer = excluded.answer,
            first_asked_at = excluded.first_asked_at, last_asked_at = excluded.last_asked_at,
            deadline = excluded.deadline",
    )?
    .execute(rusqlite::params![
        f.backfill_id(),
        a.dag_id,
        start,
        a.interval.end.timestamp(),
        a.task_id,
        a.state,
        i64::from(a.asks),
        a.answer,
        now.saturating_sub(a.waited_ms),
        now,
        now.saturating_sub(a.waited_ms).saturating_add(a.wait_ms),
    ])?;
    if a.state == ReadyState::NotReady {
        super::plans::skip_planned(conn, f, &a.dag_id, start, SkipReason::NotReady)?;
    }
    Ok(true)
}
