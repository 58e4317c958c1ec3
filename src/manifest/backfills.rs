//! Backfill rows: the request, its owner (pid, host, heartbeat) and its ownership epoch.
//!
//! Every change of ownership bumps `epoch`. The owner process is given an [`Owner`] (id and
//! epoch) and every write it makes first checks, in the same transaction, that its epoch is
//! still current and the backfill still running ([`fence`]); a frozen owner that wakes up after
//! a takeover is refused everything and stops.

use rusqlite::params;

use super::db::Optional;

use super::db::{Conn, Row};

use super::leases::LeaseCtx;
use super::{Error, Result};
use crate::clock::End;
use crate::plan::Reprocess;
use crate::state::{BackfillKind, BackfillState};

/// The right to act for a backfill: its id and the epoch this process was given. A process
/// that joined a backfill (`backfill join`) acts for it as its `worker`, fenced by the worker's
/// epoch instead of the backfill's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub backfill_id: i64,
    pub epoch: i64,
    pub worker: Option<i64>,
}

impl Owner {
    /// The backfill's owner itself, at `epoch`.
    pub fn of(backfill_id: i64, epoch: i64) -> Self {
        Self {
            backfill_id,
            epoch,
            worker: None,
        }
    }
}

/// A backfill request as recorded.
#[derive(Debug, Clone)]
pub struct NewBackfill {
    pub dag_id: String,
    pub from_arg: String,
    pub to_arg: String,
    /// Interval starts `s` with `range_start <= s < range_end` (unix seconds).
    pub range_start: i64,
    pub range_end: i64,
    pub reprocess: Reprocess,
    pub max_active_runs: u32,
    pub run_backwards: bool,
    pub allow_drift: bool,
    pub conf: String,
    pub kind: BackfillKind,
    /// A promote: the staged backfill whose outputs it publishes.
    pub source_backfill: Option<i64>,
    /// Only these tasks (`None`: every task).
    pub tasks: Option<Vec<String>>,
    /// Stop dispatching after this many failed or rejected intervals.
    pub max_failures: Option<u32>,
    /// The first backfill of a cascade: `all` or `changed`.
    pub cascade: Option<String>,
    /// A downstream backfill of a cascade: the cascade's first backfill.
    pub cascade_of: Option<i64>,
    /// `create --sample N`: the N asked for.
    pub sample: Option<u32>,
    /// What its DAG computes (JSON, see `project::Dag::definition`).
    pub definition: Option<String>,
    /// `create --batch-size N` (`None`: the DAG's `batch_size`).
    pub batch_size: Option<u32>,
    /// The project it belongs to (its name, see `session::belonging`).
    pub project: Option<String>,
    /// The warehouses its DAG writes, as the project names them (JSON: name to location).
    pub warehouses: Option<String>,
    /// A promote that publishes all its staged outputs in one warehouse transaction, or none.
    pub atomic: bool,
    /// `create --wait-ready`: how long an interval may wait for its sources, in milliseconds
    /// (`None`: each task's own `wait`).
    pub wait_ready: Option<i64>,
    /// `create --require-ready`: an interval whose sources were not ready fails the backfill's
    /// exit code.
    pub require_ready: bool,
}

/// A backfill row.
#[derive(Debug, Clone)]
pub struct Backfill {
    pub id: i64,
    pub dag_id: String,
    pub from_arg: String,
    pub to_arg: String,
    pub range_start: i64,
    pub range_end: i64,
    pub reprocess: Reprocess,
    pub max_active_runs: u32,
    pub run_backwards: bool,
    pub allow_drift: bool,
    pub conf: String,
    pub state: BackfillState,
    pub owner_pid: Option<i64>,
    /// When the owner's process started (clock ticks since its host's boot); `None` when
    /// recorded by an earlier version.
    pub owner_start: Option<i64>,
    pub owner_host: Option<String>,
    pub heartbeat_at: Option<i64>,
    pub cancel_requested: bool,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub epoch: i64,
    /// The plan is still being written (a crash during planning; `resume` finishes it).
    pub planning: bool,
    pub kind: BackfillKind,
    pub source_backfill: Option<i64>,
    pub tasks: Option<Vec<String>>,
    pub max_failures: Option<u32>,
    pub cascade: Option<String>,
    pub cascade_of: Option<i64>,
    pub sample: Option<u32>,
    /// What its DAG computed when it was created or last resumed (JSON, see
    /// `project::Dag::definition`); `None` for a backfill recorded before it was kept.
    pub definition: Option<String>,
    /// `create --batch-size N`, which `resume` and `join` keep (`None`: the DAG's).
    pub batch_size: Option<u32>,
    /// The project it belongs to; `None` for a backfill recorded before it was kept (anyone's).
    pub project: Option<String>,
    /// The warehouses its DAG wrote (JSON: name to location), as its project named them.
    pub warehouses: Option<String>,
    /// `promote --atomic`: every staged output in one warehouse transaction, or none.
    pub atomic: bool,
    /// `create --wait-ready` in milliseconds, which `resume` and `join` keep.
    pub wait_ready: Option<i64>,
    /// `create --require-ready`, which `resume` and `join` keep.
    pub require_ready: bool,
}

impl Backfill {
    pub fn owner_alive(&self, ctx: &LeaseCtx) -> bool {
        ctx.owner_alive(
            self.state,
            (self.owner_pid, self.owner_start),
            self.owner_host.as_deref(),
            self.heartbeat_at,
        )
    }

    /// Its `--conf`, as recorded.
    pub fn conf_json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.conf).map_err(|e| {
            Error::Invalid(format!(
                "backfill {} has an unreadable conf in the manifest: {e}",
                self.id
            ))
        })
    }
}

pub(crate) const COLUMNS: &str = "id, dag_id, from_arg, to_arg, range_start, range_end, reprocess_behavior, max_active_runs, run_backwards, allow_drift, conf, state, owner_pid, owner_host, heartbeat_at, cancel_requested, created_at, finished_at, epoch, planning, kind, source_backfill, tasks, max_failures, cascade, cascade_of, sample, definition, batch_size, project, warehouses, owner_start, atomic, wait_ready, require_ready";

pub(crate) fn from_row(r: &Row<'_>) -> super::db::Result<Backfill> {
    let reprocess: String = r.get(6)?;
    Ok(Backfill {
        id: r.get(0)?,
        dag_id: r.get(1)?,
        from_arg: r.get(2)?,
        to_arg: r.get(3)?,
        range_start: r.get(4)?,
        range_end: r.get(5)?,
        reprocess: reprocess.parse().map_err(|e: String| {
            rusqlite::Error::FromSqlConversionFailure(
                6,
                rusqlite::types::Type::Text,
                Box::new(std::io::Error::other(e)),
            )
        })?,
        max_active_runs: r.get(7)?,
        run_backwards: r.get(8)?,
        allow_drift: r.get(9)?,
        conf: r.get(10)?,
        state: r.get(11)?,
        owner_pid: r.get(12)?,
        owner_host: r.get(13)?,
        heartbeat_at: r.get(14)?,
        cancel_requested: r.get(15)?,
        created_at: r.get(16)?,
        finished_at: r.get(17)?,
        epoch: r.get(18)?,
        planning: r.get(19)?,
        kind: r.get(20)?,
        source_backfill: r.get(21)?,
        tasks: r
            .get::<_, Option<String>>(22)?
            .and_then(|t| serde_json::from_str(&t).ok()),
        max_failures: r.get(23)?,
        cascade: r.get(24)?,
        cascade_of: r.get(25)?,
        sample: r.get(26)?,
        definition: r.get(27)?,
        batch_size: r.get(28)?,
        project: r.get(29)?,
        warehouses: r.get(30)?,
        owner_start: r.get(31)?,
        atomic: r.get(32)?,
        wait_ready: r.get(33)?,
        require_ready: r.get(34)?,
    })
}

pub(crate) fn get(conn: &Conn, id: i64) -> Result<Option<Backfill>> {
    Ok(conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM backfills WHERE id = $1"))?
        .query_row([id], from_row)
        .optional()?)
}

/// The id of the newest backfill, or of the newest of `kind`; `None` when there is none.
pub(crate) fn latest(conn: &Conn, kind: Option<BackfillKind>) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT MAX(id) FROM backfills WHERE kind = $1 OR $1 IS NULL")?
        .query_row([kind], |r| r.get(0))?)
}

/// Proof, inside one manifest transaction, that an owner's epoch was current and its backfill
/// running when it was checked. The owner's writes take it, so none can skip the check; one
/// check serves every write of the transaction (writes are serialized, so the epoch cannot
/// change under it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    owner: Owner,
}

impl Fenced {
    pub fn owner(&self) -> Owner {
        self.owner
    }

    pub fn backfill_id(&self) -> i64 {
        self.owner.backfill_id
    }
}

/// Checks, inside the caller's transaction, that `owner` may still act: its epoch is current
/// and the backfill is running (for a worker: its own epoch, and the worker is running).
pub fn fence(conn: &Conn, owner: Owner) -> Result<Fenced> {
    // Workers are remembered under negative keys, apart from backfills.
    let (key, sql) = match owner.worker {
        None => (
            owner.backfill_id,
            "SELECT epoch, state FROM backfills WHERE id = $1",
        ),
        Some(w) => (-w, "SELECT epoch, state FROM workers WHERE id = $1"),
    };
    let row: Option<(i64, BackfillState)> = match conn.fenced(key) {
        Some(known) => Some(known),
        None => {
            let row = conn
                .prepare_cached(sql)?
                .query_row([key.abs()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some(row) = row {
                conn.remember_fence(key, row);
            }
            row
        }
    };
    match row {
        Some((epoch, BackfillState::Running)) if epoch == owner.epoch => Ok(Fenced { owner }),
        _ => Err(Error::Fenced {
            backfill_id: owner.backfill_id,
        }),
    }
}

/// Records a new backfill owned by this process, its plan still to be written.
pub fn insert(conn: &Conn, b: &NewBackfill, ctx: &LeaseCtx) -> Result<Owner> {
    // An id above every one given, also to backfills that `forget` removed.
    let (id, new_id) = super::forgets::new_id(conn, "backfills");
    let backfill_id: i64 = conn.query_row(
        &format!("INSERT INTO backfills ({id}dag_id, from_arg, to_arg, range_start, range_end, reprocess_behavior,
            max_active_runs, run_backwards, allow_drift, conf, state, owner_pid, owner_host,
            heartbeat_at, created_at, epoch, planning, kind, source_backfill, tasks, max_failures,
            cascade, cascade_of, sample, definition, batch_size, project, warehouses, owner_start, atomic,
            wait_ready, require_ready)
         VALUES ({new_id}$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, 0, TRUE, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29)
         RETURNING id"),
        params![
            b.dag_id,
            b.from_arg,
            b.to_arg,
            b.range_start,
            b.range_end,
            b.reprocess.as_str(),
            b.max_active_runs,
            b.run_backwards,
            b.allow_drift,
            b.conf,
            BackfillState::Running,
            ctx.pid,
            ctx.host,
            ctx.now_ms,
            b.kind,
            b.source_backfill,
            b.tasks
                .as_ref()
                .map(|t| serde_json::Value::from(t.clone()).to_string()),
            b.max_failures,
            b.cascade,
            b.cascade_of,
            b.sample,
            b.definition,
            b.batch_size,
            b.project,
            b.warehouses,
            ctx.start,
            b.atomic,
            b.wait_ready,
            b.require_ready
        ],
        |r| r.get(0),
    )?;
    Ok(Owner::of(backfill_id, 0))
}

/// The projects whose backfills of `dag_id` the manifest holds (those recorded with one), the
/// oldest first.
pub(crate) fn dag_projects(conn: &Conn, dag_id: &str) -> Result<Vec<DagProject>> {
    let rows = conn
        .prepare_cached(
            "SELECT project, MIN(id), MAX(id), COUNT(*), MAX(CAST(warehouses AS TEXT)) FROM backfills
             WHERE dag_id = $1 AND project IS NOT NULL GROUP BY project ORDER BY MIN(id)",
        )?
        .query_map([dag_id], |r| {
            Ok(DagProject {
                project: r.get(0)?,
                first: r.get(1)?,
                last: r.get(2)?,
                backfills: r.get(3)?,
                warehouses: r.get(4)?,
            })
        })?
        .collect::<super::db::Result<Vec<_>>>()?;
    Ok(rows)
}

/// A project with backfills of a DAG in the manifest (see [`dag_projects`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DagProject {
    pub project: String,
    /// Its first and last backfill of the DAG, and how many it has.
    pub first: i64,
    pub last: i64,
    pub backfills: i64,
    /// The warehouses its latest-named backfill recorded (JSON).
    pub warehouses: Option<String>,
}

/// Records what the backfill's DAG computes now, for its owner.
pub(crate) fn record_definition(conn: &Conn, owner: Owner, definition: &str) -> Result<()> {
    let owner = fence(conn, owner)?.owner();
    conn.execute(
        "UPDATE backfills SET definition = $2 WHERE id = $1",
        params![owner.backfill_id, definition],
    )?;
    Ok(())
}

/// Records that the plan is complete.
pub(crate) fn planned(conn: &Conn, owner: Owner) -> Result<()> {
    let owner = fence(conn, owner)?.owner();
    conn.execute(
        "UPDATE backfills SET planning = FALSE WHERE id = $1",
        [owner.backfill_id],
    )?;
    Ok(())
}

/// What the owner of a running backfill learns from its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    Carry,
    /// `backfill cancel` asked it to stop.
    CancelRequested,
    /// For a worker: the backfill it helps is no longer running.
    Ended,
}

/// Refreshes the heartbeat of a backfill's owner (not a worker's: see
/// [`super::workers::heartbeat`]) and reads what the owner must do.
pub(crate) fn heartbeat(conn: &Conn, fenced: Fenced, now_ms: i64) -> Result<Heartbeat> {
    let owner = fenced.owner();
    conn.prepare_cached("UPDATE backfills SET heartbeat_at = $2 WHERE id = $1")?
        .execute(params![owner.backfill_id, now_ms])?;
    let cancel: bool = conn
        .prepare_cached("SELECT cancel_requested FROM backfills WHERE id = $1")?
        .query_row([owner.backfill_id], |r| r.get(0))?;
    Ok(if cancel {
        Heartbeat::CancelRequested
    } else {
        Heartbeat::Carry
    })
}

/// Records the end of a backfill by its owner and releases whatever leases it still holds: its
/// creation plus the time since when this process created it, else now but never before its
/// creation.
pub(crate) fn finish(conn: &Conn, fenced: Fenced, state: BackfillState, end: End) -> Result<()> {
    let owner = fenced.owner();
    conn.execute(
        &format!(
            "UPDATE backfills SET state = $2, finished_at = {}, heartbeat_at = $3 WHERE id = $1",
            super::db::ended("created_at", "$3", "$4")
        ),
        params![owner.backfill_id, state, end.now_ms, end.elapsed_ms],
    )?;
    // A run still in progress holds a try that could not be stopped: its lease stays, so that
    // its interval is not run again until the try is gone.
    conn.execute(
        "DELETE FROM leases WHERE backfill_id = $1 AND (run_id IS NULL OR run_id NOT IN
           (SELECT id FROM runs WHERE backfill_id = $1 AND state IN ('queued', 'running')))",
        [owner.backfill_id],
    )?;
    Ok(())
}

/// Asks the process running a backfill to stop (it polls the flag with its heartbeat, and so do
/// its workers).
pub(crate) fn request_cancel(conn: &Conn, backfill_id: i64) -> Result<()> {
    conn.execute(
        "UPDATE backfills SET cancel_requested = TRUE WHERE id = $1",
        [backfill_id],
    )?;
    Ok(())
}

/// Takes the ownership of a backfill whose owner is gone away from it: a new epoch, so that
/// the old owner, should it wake up, is refused everything. With `me`, this process becomes
/// the owner and the backfill runs again; without, the backfill ends as `cancelled`. Returns
/// the new [`Owner`], or `None` when the backfill's owner is alive after all (nothing changed).
pub(crate) fn take_ownership(
    conn: &Conn,
    backfill_id: i64,
    ctx: &LeaseCtx,
    me: bool,
) -> Result<Option<Owner>> {
    let Some(b) = get(conn, backfill_id)? else {
        return Ok(None);
    };
    if b.owner_alive(ctx) {
        return Ok(None);
    }
    let epoch = b.epoch + 1;
    tracing::info!(
        backfill = backfill_id,
        epoch,
        owner_pid = b.owner_pid,
        owner_host = b.owner_host.as_deref().unwrap_or("?"),
        me,
        "taking ownership from a gone owner"
    );
    if me {
        conn.execute(
            "UPDATE backfills SET state = $2, epoch = $3, owner_pid = $4, owner_host = $5,
                heartbeat_at = $6, cancel_requested = FALSE, finished_at = NULL,
                runs_before = (SELECT COALESCE(MAX(id), 0) FROM runs), owner_start = $7
             WHERE id = $1",
            params![
                backfill_id,
                BackfillState::Running,
                epoch,
                ctx.pid,
                ctx.host,
                ctx.now_ms,
                ctx.start
            ],
        )?;
    } else {
        // Only a running backfill changes state; a finished one keeps it.
        conn.execute(
            &format!(
                "UPDATE backfills SET epoch = $2,
                    state = CASE WHEN state = 'running' THEN 'cancelled' ELSE state END,
                    finished_at = CASE WHEN state = 'running' THEN {} ELSE finished_at END
                 WHERE id = $1",
                super::db::ended("created_at", "$3", "NULL")
            ),
            params![backfill_id, epoch, ctx.now_ms],
        )?;
    }
    Ok(Some(Owner::of(backfill_id, epoch)))
}

/// The running promote backfill of staged backfill `staged`, if any.
pub(crate) fn promoting(conn: &Conn, staged: i64) -> Result<Option<i64>> {
    Ok(conn
        .query_row(
            "SELECT id FROM backfills WHERE kind = 'promote' AND source_backfill = $1
             AND state = 'running' LIMIT 1",
            [staged],
            |r| r.get(0),
        )
        .optional()?)
}

/// Once no output of staged backfill `id` awaits promotion, it is complete.
pub(crate) fn settle_staged(conn: &Conn, id: i64) -> Result<()> {
    conn.execute(
        "UPDATE backfills SET state = 'completed'
         WHERE id = $1 AND state = 'staged' AND NOT EXISTS (
             SELECT 1 FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE r.backfill_id = $1 AND t.staged = 'staged')",
        [id],
    )?;
    Ok(())
}

/// The first project other than `ours` with backfills of the DAG, of those the manifest holds.
pub(crate) fn other_project<'a>(ours: &str, found: &'a [DagProject]) -> Option<&'a DagProject> {
    found.iter().find(|p| p.project != ours)
}
