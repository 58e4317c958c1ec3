//! Staged outputs (`create --stage`): a try's output kept unpublished, then promoted or
//! discarded once.

use rusqlite::params;

use super::Result;
use super::db::{Conn, Optional};
use super::record::TryRecord;
use crate::interval::DataInterval;
use crate::state::TryState;

/// Records what became of a staged output (promoted or discarded); `false` when it was no
/// longer staged.
pub(crate) fn set_staged(
    conn: &Conn,
    staged_try: i64,
    to: crate::state::StagedState,
) -> Result<bool> {
    let changed = conn
        .prepare_cached("UPDATE task_tries SET staged = $2 WHERE id = $1 AND staged = 'staged'")?
        .execute(params![staged_try, to])?;
    Ok(changed == 1)
}

/// A staged output still awaiting promotion.
#[derive(Debug, Clone)]
pub struct Staged {
    pub interval: DataInterval,
    pub task_id: String,
    pub try_id: i64,
    pub run_id: i64,
    pub try_number: u32,
    pub record: TryRecord,
    pub path: Option<String>,
    pub state: crate::state::StagedState,
}

/// The staged outputs of a backfill, whatever became of them since, by interval then try.
pub(crate) fn staged(conn: &Conn, backfill_id: i64) -> Result<Vec<Staged>> {
    let mut stmt = conn.prepare_cached(
        "SELECT r.interval_start, r.interval_end, t.task_id, t.id, t.rows, t.fingerprint,
                t.source_rows, t.source_fingerprint, t.verdict, t.reasons, t.staged_path,
                r.id, t.try_number, t.staged
         FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE r.backfill_id = $1 AND t.staged IS NOT NULL
         ORDER BY r.interval_start, t.id",
    )?;
    let rows = stmt.query_map([backfill_id], |r| {
        Ok(Staged {
            interval: DataInterval::from_unix(r.get(0)?, r.get(1)?),
            task_id: r.get(2)?,
            try_id: r.get(3)?,
            run_id: r.get(11)?,
            try_number: r.get(12)?,
            record: TryRecord {
                rows: r.get(4)?,
                fingerprint: r.get(5)?,
                source_rows: r.get(6)?,
                source_fingerprint: r.get(7)?,
                verdict: r.get(8)?,
                reasons: r.get(9)?,
                ..TryRecord::new(TryState::Succeeded)
            },
            path: r.get(10)?,
            state: r.get(13)?,
        })
    })?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Whether a staged try's output still awaits promotion.
pub(crate) fn is_staged(conn: &Conn, staged_try: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM task_tries WHERE id = $1 AND staged = 'staged'")?
        .query_row([staged_try], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Records that try `try_id` promotes the staged try `staged_try`.
pub(crate) fn set_promoted_from(conn: &Conn, try_id: i64, staged_try: i64) -> Result<()> {
    conn.prepare_cached("UPDATE task_tries SET promoted_from = $2 WHERE id = $1")?
        .execute(params![try_id, staged_try])?;
    Ok(())
}

/// Discards a staged output unless a promote of it is running: `false` when it was not
/// discarded.
pub(crate) fn discard_staged(conn: &Conn, staged_try: i64) -> Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE task_tries SET staged = 'discarded'
             WHERE id = $1 AND staged = 'staged' AND NOT EXISTS (
                 SELECT 1 FROM task_tries p
                 WHERE p.promoted_from = $1 AND (p.state = 'running' OR p.publishing = TRUE))",
        )?
        .execute([staged_try])?;
    Ok(changed == 1)
}
