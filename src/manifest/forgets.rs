//! `backfill forget`: a DAG's history removed from the manifest, over a range of interval
//! starts or all of it, and the removal recorded in `forgets`.
//!
//! One transaction removes the runs of the range, their tries, what they published, the plan
//! rows of the range, and the backfills left with nothing, and records the removal as
//! `cleaning`: the warehouse still keeps versions and bookings of the removed tries, which the
//! command removes next and then records the removal `done`. A removal left `cleaning` (the
//! command was killed, or the warehouse could not be reached) is finished by the next
//! `forget`; what it leaves meanwhile names tries no longer recorded, which nothing reads.
//!
//! The ids a manifest gave are never given again: a removal records the largest ones then,
//! and on SQLite (which gives a new row the largest id of its table plus one) new backfills,
//! runs and tries take an id above them ([`new_id`]). PostgreSQL's sequences never go back.

use super::db::Conn;
use super::{Error, Result};
use rusqlite::params;

/// The runs of the DAG whose interval starts within the range (unix seconds, both bounds
/// included).
const RUNS: &str = "SELECT id FROM runs WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3";

/// What a removal takes away, counted before it does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Backfills removed whole: every run and plan row of theirs is in the range.
    pub backfills: Vec<i64>,
    /// Backfills that keep runs or plan rows outside the range.
    pub kept_backfills: Vec<i64>,
    pub runs: i64,
    pub tries: i64,
    /// Published partitions (a task's interval) no longer recorded as published.
    pub published: i64,
    /// Backfills of the DAG recorded as running: a removal waits for them to end.
    pub running: Vec<i64>,
    /// Backfills with outputs of the range still staged (`create --stage`, not yet promoted
    /// or discarded): a removal waits for them to be promoted or discarded.
    pub staged: Vec<i64>,
    /// Backfills, ended or not, with work of the range still in flight: a run queued or
    /// running, a try running or publishing, a lease held, a worker running (a try that could
    /// not be stopped, another host's worker still stopping). A removal waits for them.
    pub in_flight: Vec<i64>,
    /// Running backfills of a cascade that one of the removed backfills belongs to (its root
    /// or a member): a removal waits for the cascade to end.
    pub cascades: Vec<i64>,
}

impl Scope {
    /// Whether nothing of the DAG's range is recorded.
    pub fn is_empty(&self) -> bool {
        self.backfills.is_empty() && self.runs == 0 && self.published == 0
    }
}

/// A removal, as `forgets` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forget {
    pub id: i64,
    pub dag_id: String,
    /// `--from` and `--to` as typed, when a range was given.
    pub args: Option<(String, String)>,
    /// The range of interval starts (unix seconds, both included); `None`: all of them.
    pub range: Option<(i64, i64)>,
    pub done: bool,
    pub backfills: i64,
    pub runs: i64,
    pub tries: i64,
    pub published: i64,
    /// Kept versions removed from the warehouses, once they were.
    pub versions: Option<i64>,
    /// The largest try id when the removal was made: the warehouse keeps nothing of a try
    /// above it for the removal to remove.
    pub last_try: i64,
    /// The largest run id then: log files of runs above it belong to later runs.
    pub last_run: i64,
    pub created_at: i64,
}

fn bounds(range: Option<(i64, i64)>) -> (i64, i64) {
    range.unwrap_or((i64::MIN, i64::MAX))
}

/// Counts what removing `dag_id`'s history over `range` would take away.
pub(crate) fn scope(conn: &Conn, dag_id: &str, range: Option<(i64, i64)>) -> Result<Scope> {
    let (lo, hi) = bounds(range);
    let count = |sql: &str| -> Result<i64> {
        Ok(conn.query_row(sql, params![dag_id, lo, hi], |r| r.get(0))?)
    };
    let ids = |sql: &str| -> Result<Vec<i64>> {
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt.query_map(params![dag_id, lo, hi], |r| r.get(0))?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    };
    let runs = count(&format!("SELECT count(*) FROM ({RUNS}) r"))?;
    let tries = count(&format!(
        "SELECT count(*) FROM task_tries WHERE run_id IN ({RUNS})"
    ))?;
    let published = count(
        "SELECT count(*) FROM published WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3",
    )?;
    let touched = ids("SELECT id FROM backfills b WHERE dag_id = $1 AND (
             EXISTS (SELECT 1 FROM runs r WHERE r.backfill_id = b.id
                     AND r.interval_start BETWEEN $2 AND $3)
             OR EXISTS (SELECT 1 FROM plan p WHERE p.backfill_id = b.id
                        AND p.interval_start BETWEEN $2 AND $3)
             OR (NOT EXISTS (SELECT 1 FROM plan p WHERE p.backfill_id = b.id)
                 AND b.range_start <= $3 AND b.range_end > $2))
         ORDER BY id")?;
    let beyond = ids(
        "SELECT DISTINCT b.id FROM backfills b WHERE dag_id = $1 AND (
             EXISTS (SELECT 1 FROM runs r WHERE r.backfill_id = b.id
                     AND r.interval_start NOT BETWEEN $2 AND $3)
             OR EXISTS (SELECT 1 FROM plan p WHERE p.backfill_id = b.id
                        AND p.interval_start NOT BETWEEN $2 AND $3))
         ORDER BY b.id",
    )?;
    let (kept_backfills, backfills): (Vec<i64>, Vec<i64>) =
        touched.into_iter().partition(|id| beyond.contains(id));
    let running = {
        let mut stmt = conn.prepare(
            "SELECT id FROM backfills WHERE dag_id = $1 AND state = 'running' ORDER BY id",
        )?;
        let rows = stmt.query_map([dag_id], |r| r.get(0))?;
        rows.collect::<super::db::Result<Vec<i64>>>()?
    };
    let staged = ids(&format!(
        "SELECT DISTINCT r.backfill_id FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE r.id IN ({RUNS}) AND t.staged = 'staged' ORDER BY r.backfill_id"
    ))?;
    let in_flight = ids(&format!(
        "SELECT backfill_id FROM runs WHERE id IN ({RUNS}) AND state IN ('queued', 'running')
         UNION SELECT r.backfill_id FROM runs r JOIN task_tries t ON t.run_id = r.id
               WHERE r.id IN ({RUNS}) AND (t.state = 'running' OR t.publishing = TRUE)
         UNION SELECT backfill_id FROM leases WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
         UNION SELECT w.backfill_id FROM workers w JOIN backfills b ON b.id = w.backfill_id
               WHERE b.dag_id = $1 AND w.state = 'running'
         ORDER BY 1"
    ))?;
    let cascades = if backfills.is_empty() {
        Vec::new()
    } else {
        let list = backfills
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        // The removed backfills and the roots of their cascades.
        let roots = format!(
            "SELECT id FROM backfills WHERE id IN ({list})
             UNION SELECT cascade_of FROM backfills WHERE id IN ({list}) AND cascade_of IS NOT NULL"
        );
        let mut stmt = conn.prepare(&format!(
            "SELECT id FROM backfills WHERE state = 'running'
               AND (id IN ({roots}) OR cascade_of IN ({roots})) ORDER BY id"
        ))?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<super::db::Result<Vec<i64>>>()?
    };
    Ok(Scope {
        backfills,
        kept_backfills,
        runs,
        tries,
        published,
        running,
        staged,
        in_flight,
        cascades,
    })
}

/// The range a removal is asked for: `--from` and `--to` as typed, and the interval starts they
/// select (unix seconds, both included); neither for the whole history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Span<'a> {
    pub args: Option<(&'a str, &'a str)>,
    pub starts: Option<(i64, i64)>,
}

/// Why a removal did not happen: something of the range is still in use, by these backfills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Busy {
    Running(Vec<i64>),
    InFlight(Vec<i64>),
    Cascade(Vec<i64>),
    Staged(Vec<i64>),
}

impl Scope {
    /// Why the range cannot be removed now, if it cannot.
    pub fn busy(&self) -> Option<Busy> {
        if !self.running.is_empty() {
            Some(Busy::Running(self.running.clone()))
        } else if !self.in_flight.is_empty() {
            Some(Busy::InFlight(self.in_flight.clone()))
        } else if !self.cascades.is_empty() {
            Some(Busy::Cascade(self.cascades.clone()))
        } else if !self.staged.is_empty() {
            Some(Busy::Staged(self.staged.clone()))
        } else {
            None
        }
    }
}

/// Removes `dag_id`'s history over `range` and records the removal as `cleaning`, in the
/// caller's transaction (the writer's job): nothing when a backfill of the DAG runs or
/// holds staged outputs of the range, found in this same transaction.
pub(crate) fn forget(
    conn: &Conn,
    dag_id: &str,
    Span {
        args,
        starts: range,
    }: Span<'_>,
    (host, pid): (&str, i64),
    now_ms: i64,
) -> Result<std::result::Result<Forget, Busy>> {
    let s = scope(conn, dag_id, range)?;
    if let Some(busy) = s.busy() {
        return Ok(Err(busy));
    }
    let (lo, hi) = bounds(range);
    let greatest = if conn.is_postgres() {
        "greatest"
    } else {
        "max"
    };
    let last = |table: &str| -> Result<i64> {
        Ok(conn.query_row(
            &format!("SELECT {}", largest_id(table, greatest)),
            [],
            |r| r.get(0),
        )?)
    };
    let last_backfill = last("backfills")?;
    let last_run = last("runs")?;
    let last_try = last("task_tries")?;
    let last_worker = last("workers")?;
    let tries = format!("SELECT id FROM task_tries WHERE run_id IN ({RUNS})");
    let p = params![dag_id, lo, hi];
    conn.execute(
        &format!("DELETE FROM pool_slots WHERE try_id IN ({tries})"),
        p,
    )?;
    conn.execute(
        "DELETE FROM published WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3",
        p,
    )?;
    // A promote's try names the staged try it published; both are of the interval, so both go,
    // but a reference from outside the range must not keep a removed try.
    conn.execute(
        &format!(
            "UPDATE task_tries SET promoted_from = NULL
             WHERE promoted_from IN ({tries}) AND run_id NOT IN ({RUNS})"
        ),
        p,
    )?;
    conn.execute(
        &format!("DELETE FROM task_tries WHERE run_id IN ({RUNS})"),
        p,
    )?;
    conn.execute(
        "DELETE FROM leases WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3",
        p,
    )?;
    conn.execute(
        "DELETE FROM runs WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3",
        p,
    )?;
    conn.execute(
        "DELETE FROM plan WHERE interval_start BETWEEN $2 AND $3
           AND backfill_id IN (SELECT id FROM backfills WHERE dag_id = $1)",
        p,
    )?;
    conn.execute(
        "DELETE FROM readiness WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3",
        p,
    )?;
    for &id in &s.backfills {
        for sql in [
            "DELETE FROM pool_slots WHERE backfill_id = $1",
            "DELETE FROM leases WHERE backfill_id = $1",
            "UPDATE runs SET worker = NULL WHERE worker IN (SELECT id FROM workers WHERE backfill_id = $1)",
            "DELETE FROM workers WHERE backfill_id = $1",
            "DELETE FROM readiness WHERE backfill_id = $1",
            "UPDATE backfills SET source_backfill = NULL WHERE source_backfill = $1",
            "UPDATE backfills SET cascade_of = NULL WHERE cascade_of = $1",
            "DELETE FROM backfills WHERE id = $1",
        ] {
            conn.execute(sql, [id])?;
        }
    }
    let (range_start, range_end) = match range {
        Some((lo, hi)) => (Some(lo), Some(hi)),
        None => (None, None),
    };
    let counts = (
        i64::try_from(s.backfills.len()).unwrap_or(i64::MAX),
        s.runs,
        s.tries,
        s.published,
    );
    let id: i64 = conn.query_row(
        "INSERT INTO forgets (dag_id, range_start, range_end, state, backfills, runs, tries,
             published, last_backfill, last_run, last_try, host, pid, created_at, from_arg, to_arg,
             last_worker)
         VALUES ($1, $2, $3, 'cleaning', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         RETURNING id",
        params![
            dag_id,
            range_start,
            range_end,
            counts.0,
            counts.1,
            counts.2,
            counts.3,
            last_backfill,
            last_run,
            last_try,
            host,
            pid,
            now_ms,
            args.map(|a| a.0),
            args.map(|a| a.1),
            last_worker
        ],
        |r| r.get(0),
    )?;
    Ok(Ok(Forget {
        id,
        dag_id: dag_id.to_string(),
        args: args.map(|(f, t)| (f.to_string(), t.to_string())),
        range,
        done: false,
        backfills: counts.0,
        runs: counts.1,
        tries: counts.2,
        published: counts.3,
        versions: None,
        last_try,
        last_run,
        created_at: now_ms,
    }))
}

/// Records that a removal's warehouse clean-up is done: `versions` kept versions went.
pub(crate) fn finish(conn: &Conn, id: i64, versions: i64, now_ms: i64) -> Result<()> {
    let changed = conn.execute(
        "UPDATE forgets SET state = 'done', versions = $2, finished_at = $3 WHERE id = $1",
        params![id, versions, now_ms],
    )?;
    if changed == 0 {
        return Err(Error::Invalid(format!("no removal {id} in the manifest")));
    }
    Ok(())
}

const COLUMNS: &str = "id, dag_id, range_start, range_end, state, backfills, runs, tries, published, versions, last_try, last_run, created_at, from_arg, to_arg";

fn from_row(r: &super::db::Row<'_>) -> super::db::Result<Forget> {
    let start: Option<i64> = r.get(2)?;
    let end: Option<i64> = r.get(3)?;
    let state: String = r.get(4)?;
    let from: Option<String> = r.get(13)?;
    let to: Option<String> = r.get(14)?;
    Ok(Forget {
        id: r.get(0)?,
        dag_id: r.get(1)?,
        args: from.zip(to),
        range: start.zip(end),
        done: state == "done",
        backfills: r.get(5)?,
        runs: r.get(6)?,
        tries: r.get(7)?,
        published: r.get(8)?,
        versions: r.get(9)?,
        last_try: r.get(10)?,
        last_run: r.get(11)?,
        created_at: r.get(12)?,
    })
}

/// The removals whose warehouse clean-up is not done, oldest first.
pub(crate) fn unfinished(conn: &Conn) -> Result<Vec<Forget>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM forgets WHERE state = 'cleaning' ORDER BY id"
    ))?;
    let rows = stmt.query_map([], from_row)?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// The removals of a DAG's history, oldest first.
pub(crate) fn of_dag(conn: &Conn, dag_id: &str) -> Result<Vec<Forget>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM forgets WHERE dag_id = $1 ORDER BY id"
    ))?;
    let rows = stmt.query_map([dag_id], from_row)?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

/// On SQLite, the column and the value that give a new row of `table` (`backfills`, `runs`,
/// `task_tries` or `workers`) an id above every id the manifest gave, removed ones included: to put
/// before an `INSERT`'s columns and its values. Nothing on PostgreSQL, whose sequences never
/// go back.
pub(crate) fn new_id(conn: &Conn, table: &str) -> (&'static str, String) {
    if conn.is_postgres() {
        return ("", String::new());
    }
    ("id, ", format!("{} + 1, ", largest_id(table, "max")))
}

/// The largest id `table` (`backfills`, `runs`, `task_tries` or `workers`) ever gave, rows that
/// `forget` removed included, as an SQL expression; `greatest` is the engine's maximum of two
/// values (`max` on SQLite, `greatest` on PostgreSQL).
pub(crate) fn largest_id(table: &str, greatest: &str) -> String {
    let column = match table {
        "backfills" => "last_backfill",
        "runs" => "last_run",
        "workers" => "last_worker",
        _ => "last_try",
    };
    format!(
        "{greatest}(coalesce((SELECT max(id) FROM {table}), 0),
                    coalesce((SELECT max({column}) FROM forgets), 0))"
    )
}
