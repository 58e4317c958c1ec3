//! What cascades read of the manifest: a backfill's plan with its runs' outcomes, an
//! interval's latest computing run, the tries whose fingerprints tell whether an upstream
//! output changed, and the backfills that make up a cascade.

use rusqlite::params;

use super::db::Optional;

use super::db::Conn;

use super::backfills::{self, Backfill};
use super::{NOT_COMPUTING, Result};
use crate::plan::{Action, RunState, SkipReason};

/// One row of a backfill's plan with the state of its latest run there.
#[derive(Debug, Clone, Copy)]
pub struct PlanOutcome {
    pub start: i64,
    pub end: i64,
    pub action: Action,
    pub state: Option<RunState>,
}

/// Every row of the plan of backfill `backfill_id`, by interval start.
pub(crate) fn plan_outcomes(conn: &Conn, backfill_id: i64) -> Result<Vec<PlanOutcome>> {
    let mut stmt = conn.prepare(
        "SELECT p.interval_start, p.interval_end, p.action, p.reason,
                (SELECT r.state FROM runs r WHERE r.backfill_id = p.backfill_id
                   AND r.interval_start = p.interval_start ORDER BY r.id DESC LIMIT 1)
         FROM plan p WHERE p.backfill_id = $1 ORDER BY p.interval_start",
    )?;
    let rows = stmt.query_map([backfill_id], |r| {
        let action: String = r.get(2)?;
        let reason: Option<String> = r.get(3)?;
        Ok((r.get(0)?, r.get(1)?, action, reason, r.get(4)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (start, end, action, reason, state): (i64, i64, String, Option<String>, _) = row?;
        let action = match (action.as_str(), reason.as_deref()) {
            ("run", _) => Action::Run,
            (_, Some(r)) => match r.parse::<SkipReason>() {
                Ok(reason) => Action::Skip(reason),
                Err(_) => {
                    return Err(super::Error::Invalid(format!(
                        "plan row of backfill {backfill_id} at {start}: unknown skip reason `{r}`; is the manifest from a newer backfill?"
                    )));
                }
            },
            (other, None) => {
                return Err(super::Error::Invalid(format!(
                    "plan row of backfill {backfill_id} at {start}: action `{other}` without a reason"
                )));
            }
        };
        out.push(PlanOutcome {
            start,
            end,
            action,
            state,
        });
    }
    Ok(out)
}

/// The state of the latest run of an interval that computed it (staged, rollback and
/// partial `--tasks` runs left out).
pub(crate) fn latest_state(
    conn: &Conn,
    dag_id: &str,
    start: i64,
) -> super::db::Result<Option<RunState>> {
    conn.prepare_cached(&format!(
        "SELECT state FROM runs WHERE dag_id = $1 AND interval_start = $2
           AND backfill_id NOT IN {NOT_COMPUTING}
         ORDER BY id DESC LIMIT 1"
    ))?
    .query_row(params![dag_id, start], |r| r.get(0))
    .optional()
}

/// When the latest successful run of an interval of `dag_id` started (unix ms), staged runs
/// left out: what it read of its upstream is what was published then.
pub(crate) fn last_success(
    conn: &Conn,
    dag_id: &str,
    start: i64,
) -> super::db::Result<Option<i64>> {
    conn.prepare_cached(&format!(
        "SELECT MAX(started_at) FROM runs WHERE dag_id = $1 AND interval_start = $2
           AND state = 'succeeded' AND backfill_id NOT IN {NOT_COMPUTING}"
    ))?
    .query_row(params![dag_id, start], |r| r.get(0))
}

/// A succeeded try: its task, fingerprint and when it ended (unix ms).
pub(crate) type SucceededTry = (String, Option<String>, Option<i64>);

/// The succeeded, unstaged tries of an interval in the order they were made: task, fingerprint
/// and when it ended (unix ms).
pub(crate) fn succeeded_tries(
    conn: &Conn,
    dag_id: &str,
    start: i64,
) -> super::db::Result<Vec<SucceededTry>> {
    conn.prepare_cached(
        "SELECT t.task_id, t.fingerprint, t.ended_at FROM runs r
         JOIN task_tries t ON t.run_id = r.id
         WHERE r.dag_id = $1 AND r.interval_start = $2 AND t.state = 'succeeded'
           AND COALESCE(t.verdict, '') != 'staged'
         ORDER BY t.id",
    )?
    .query_map(params![dag_id, start], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?
    .collect()
}

/// The backfills of the cascade of `root` after `root` itself, oldest first.
pub(crate) fn members(conn: &Conn, root: i64) -> Result<Vec<Backfill>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {} FROM backfills WHERE cascade_of = $1 ORDER BY id",
        backfills::COLUMNS
    ))?;
    let rows = stmt.query_map([root], backfills::from_row)?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// How many planned intervals of backfill `id` have not ended (not started, or cancelled):
/// a cascade goes on past it only once it has none.
pub(crate) fn unfinished(conn: &Conn, id: i64) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM plan p WHERE p.backfill_id = $1 AND p.action = 'run'
           AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.backfill_id = p.backfill_id
                             AND r.interval_start = p.interval_start
                             AND r.state IN ('succeeded', 'failed', 'rejected'))",
        [id],
        |r| r.get(0),
    )?)
}

/// The running backfill of the cascade of `root` (`root` itself or one of its members), the
/// newest if several.
pub(crate) fn running_member(conn: &Conn, root: i64) -> Result<Option<i64>> {
    Ok(conn
        .query_row(
            "SELECT id FROM backfills WHERE (id = $1 OR cascade_of = $1) AND state = 'running'
             ORDER BY id DESC LIMIT 1",
            [root],
            |r| r.get(0),
        )
        .optional()?)
}
