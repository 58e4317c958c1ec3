//! Workers: processes that joined a live backfill (`backfill join ID`) to run its remaining
//! intervals beside its owner, on this host or another.
//!
//! A worker holds a lease of its own (pid, host, heartbeat) and an epoch. Its runs are the
//! backfill's runs (`runs.backfill_id`), marked with the worker that ran them; the intervals stay
//! leased to the backfill, and a run is claimed by the commit that starts it (the lease names
//! the run, so no second process starts it). Every write of a worker is fenced by its own epoch;
//! a worker whose lease expired is recovered like a dead owner (its epoch bumped, its tries
//! stopped and ended), and its intervals go back to the backfill.

use rusqlite::params;

use super::db::Optional;

use super::Result;
use super::backfills::{Heartbeat, Owner};
use super::db::Conn;
use super::leases::LeaseCtx;
use crate::state::BackfillState;

/// A worker row.
#[derive(Debug, Clone)]
pub struct Worker {
    pub id: i64,
    pub backfill_id: i64,
    pub pid: Option<i64>,
    /// When its process started (clock ticks since its host's boot), if recorded.
    pub start: Option<i64>,
    pub host: Option<String>,
    pub heartbeat_at: Option<i64>,
    pub epoch: i64,
    pub state: BackfillState,
    pub max_active_runs: u32,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

impl Worker {
    pub fn alive(&self, ctx: &LeaseCtx) -> bool {
        ctx.owner_alive(
            self.state,
            (self.pid, self.start),
            self.host.as_deref(),
            self.heartbeat_at,
        )
    }
}

const COLUMNS: &str = "id, backfill_id, pid, host, heartbeat_at, epoch, state, max_active_runs, started_at, finished_at, start";

fn from_row(r: &super::db::Row<'_>) -> super::db::Result<Worker> {
    Ok(Worker {
        id: r.get(0)?,
        backfill_id: r.get(1)?,
        pid: r.get(2)?,
        host: r.get(3)?,
        heartbeat_at: r.get(4)?,
        epoch: r.get(5)?,
        state: r.get(6)?,
        max_active_runs: r.get(7)?,
        started_at: r.get(8)?,
        finished_at: r.get(9)?,
        start: r.get(10)?,
    })
}

/// The workers of a backfill, oldest first.
pub(crate) fn of(conn: &Conn, backfill_id: i64) -> Result<Vec<Worker>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM workers WHERE backfill_id = $1 ORDER BY id"
    ))?;
    let rows = stmt.query_map([backfill_id], from_row)?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// Records this process as a worker of `backfill_id`, which the caller found running with a
/// live owner in this transaction.
pub(crate) fn join(
    conn: &Conn,
    backfill_id: i64,
    max_active_runs: u32,
    ctx: &LeaseCtx,
) -> Result<Owner> {
    // An id above every one given, also to workers of backfills that `forget` removed: a
    // worker's fence names its id.
    let (id, new_id) = super::forgets::new_id(conn, "workers");
    let id: i64 = conn.query_row(
        &format!(
            "INSERT INTO workers ({id}backfill_id, pid, host, heartbeat_at, epoch, state,
                max_active_runs, started_at, start)
             VALUES ({new_id}$1, $2, $3, $4, 0, $5, $6, $4, $7) RETURNING id"
        ),
        params![
            backfill_id,
            ctx.pid,
            ctx.host,
            ctx.now_ms,
            BackfillState::Running,
            max_active_runs,
            ctx.start
        ],
        |r| r.get(0),
    )?;
    Ok(Owner {
        backfill_id,
        epoch: 0,
        worker: Some(id),
    })
}

/// A worker's heartbeat (its fence already checked): what it must do.
pub(crate) fn heartbeat(
    conn: &Conn,
    backfill_id: i64,
    worker: i64,
    now_ms: i64,
) -> Result<Heartbeat> {
    conn.prepare_cached("UPDATE workers SET heartbeat_at = $2 WHERE id = $1")?
        .execute(params![worker, now_ms])?;
    let (cancel, state): (bool, BackfillState) = conn
        .prepare_cached("SELECT cancel_requested, state FROM backfills WHERE id = $1")?
        .query_row([backfill_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(if cancel {
        Heartbeat::CancelRequested
    } else if state != BackfillState::Running {
        Heartbeat::Ended
    } else {
        Heartbeat::Carry
    })
}

/// Records the end of a worker (its fence already checked). The backfill's leases are not the
/// worker's: they stay.
pub(crate) fn finish(conn: &Conn, worker: i64, state: BackfillState, now_ms: i64) -> Result<()> {
    conn.execute(
        &format!(
            "UPDATE workers SET state = $2, finished_at = {}, heartbeat_at = $3 WHERE id = $1",
            super::db::ended("started_at", "$3", "NULL")
        ),
        params![worker, state, now_ms],
    )?;
    Ok(())
}

/// Takes the leases of the gone workers of backfill `backfill_id` away: a new epoch each, so
/// that should one wake up it is refused everything, and the state `cancelled`. Returns them as
/// claimed (their runs are to be recovered); live workers and ended ones are left as they are.
pub(crate) fn take_gone(conn: &Conn, backfill_id: i64, ctx: &LeaseCtx) -> Result<Vec<Owner>> {
    let mut claimed = Vec::new();
    for w in of(conn, backfill_id)? {
        if w.state != BackfillState::Running || w.alive(ctx) {
            continue;
        }
        let epoch = w.epoch + 1;
        tracing::info!(
            backfill = backfill_id,
            worker = w.id,
            epoch,
            host = w.host.as_deref().unwrap_or("?"),
            "taking a gone worker's lease away"
        );
        conn.execute(
            &format!(
                "UPDATE workers SET epoch = $2, state = 'cancelled', finished_at = {} WHERE id = $1",
                super::db::ended("started_at", "$3", "NULL")
            ),
            params![w.id, epoch, ctx.now_ms],
        )?;
        claimed.push(Owner {
            backfill_id,
            epoch,
            worker: Some(w.id),
        });
    }
    Ok(claimed)
}

/// Whether a backfill has ever had a worker (its runs are then counted against its
/// `max_active_runs` in the manifest, across its processes).
pub(crate) fn any(conn: &Conn, backfill_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM workers WHERE backfill_id = $1 LIMIT 1")?
        .query_row([backfill_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The interval starts that a worker still running holds: its runs in progress, and the
/// intervals its batches hold (see [`super::leases::reserve_batch`]). They are that worker's,
/// neither recovered with the owner nor run by another process.
pub(crate) fn starts_in_flight(
    conn: &Conn,
    backfill_id: i64,
) -> Result<std::collections::HashSet<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT r.interval_start FROM runs r JOIN workers w ON w.id = r.worker
         WHERE r.backfill_id = $1 AND r.state IN ('queued', 'running') AND w.state = 'running'
         UNION
         SELECT l.interval_start FROM leases l JOIN workers w ON w.id = l.batch_holder
         WHERE l.backfill_id = $1 AND w.backfill_id = $1 AND w.state = 'running'",
    )?;
    let rows = stmt.query_map([backfill_id], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}
