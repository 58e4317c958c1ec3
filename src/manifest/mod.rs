//! The run manifest: a SQLite database (WAL) that records backfills, plans, runs, task tries and
//! leases. Schema changes are `migrations/NNNN_*.sql`, applied in order through
//! `PRAGMA user_version`. Writes go through the one [`writer::Writer`] thread of a process;
//! the functions here take a connection so that the writer (and tests) can run them.

pub mod lease;
pub mod queries;
pub mod writer;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rusqlite::{Connection, OptionalExtension, params};

use crate::interval::DataInterval;
use crate::plan::{Action, PlanRow, Prior, Reprocess, RunState};
use lease::LeaseCtx;

/// `(user_version after applying, SQL)`, in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_init.sql")),
    (2, include_str!("../../migrations/0002_publication.sql")),
];

/// Opens the manifest for writing, creating it and applying migrations as needed.
pub fn open(path: &Path) -> anyhow::Result<Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the manifest folder {}", dir.display()))?;
    }
    let setup = || -> anyhow::Result<Connection> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", Durability::default().pragma())?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrate(&conn)?;
        Ok(conn)
    };
    // Two processes creating the manifest at once both try to switch it to WAL; SQLite then
    // reports busy at once, without its busy handler (lock escalation deadlock). Retry.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match setup() {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(
                    5 + u64::from(std::process::id() % 20),
                ));
            }
            result => {
                return result
                    .with_context(|| format!("cannot open the manifest {}", path.display()));
            }
        }
    }
}

fn is_busy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<rusqlite::Error>().is_some_and(|e| {
            matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            )
        })
    })
}

/// How hard a commit of the manifest's writer tries to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// WAL with `synchronous=NORMAL`: a commit survives the process dying (`kill -9`, a crash);
    /// an OS crash or power cut may lose the last commits, never the manifest's consistency.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is fsynced and survives a power cut too.
    Full,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// Opens the manifest for the writer thread, with the project's durability.
pub fn open_writer(path: &Path, durability: Durability) -> anyhow::Result<Connection> {
    let conn = open(path)?;
    conn.pragma_update(None, "synchronous", durability.pragma())?;
    Ok(conn)
}

/// Opens an existing manifest for reading; `None` when there is none yet (nothing recorded).
pub fn open_existing(path: &Path) -> anyhow::Result<Option<Connection>> {
    if !path.exists() {
        return Ok(None);
    }
    open(path).map(Some)
}

fn migrate(conn: &Connection) -> anyhow::Result<()> {
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current == latest {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Another process may have migrated while we waited for the lock.
        let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if current > latest {
            bail!(
                "the manifest has schema version {current}, newer than this backfill understands ({latest}); upgrade backfill"
            );
        }
        for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            conn.execute_batch(sql)
                .with_context(|| format!("migration {version} failed"))?;
            conn.pragma_update(None, "user_version", version)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl BackfillState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl FromStr for BackfillState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "running" => Ok(Self::Running),
            "completed" => Ok(Self::Completed),
            "failed" => Ok(Self::Failed),
            "cancelled" => Ok(Self::Cancelled),
            other => Err(format!("unknown backfill state `{other}`")),
        }
    }
}

impl fmt::Display for BackfillState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backfill request as recorded.
#[derive(Debug, Clone)]
pub struct NewBackfill {
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
}

/// A backfill row.
#[derive(Debug, Clone)]
pub struct Backfill {
    pub id: i64,
    pub dag_id: String,
    pub from_arg: String,
    pub to_arg: String,
    pub reprocess: Reprocess,
    pub max_active_runs: u32,
    pub run_backwards: bool,
    pub allow_drift: bool,
    pub conf: String,
    pub state: BackfillState,
    pub owner_pid: Option<i64>,
    pub owner_host: Option<String>,
    pub heartbeat_at: Option<i64>,
    pub cancel_requested: bool,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

impl Backfill {
    pub fn owner_alive(&self, ctx: &LeaseCtx) -> bool {
        ctx.owner_alive(
            self.state.as_str(),
            self.owner_pid,
            self.owner_host.as_deref(),
            self.heartbeat_at,
        )
    }
}

pub const BACKFILL_COLUMNS: &str = "id, dag_id, from_arg, to_arg, reprocess_behavior, max_active_runs, run_backwards, allow_drift, conf, state, owner_pid, owner_host, heartbeat_at, cancel_requested, created_at, finished_at";

pub fn backfill_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Backfill> {
    let parse_err = |i: usize, e: String| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            Box::new(std::io::Error::other(e)),
        )
    };
    let reprocess: String = r.get(4)?;
    let state: String = r.get(9)?;
    Ok(Backfill {
        id: r.get(0)?,
        dag_id: r.get(1)?,
        from_arg: r.get(2)?,
        to_arg: r.get(3)?,
        reprocess: reprocess.parse().map_err(|e| parse_err(4, e))?,
        max_active_runs: r.get(5)?,
        run_backwards: r.get(6)?,
        allow_drift: r.get(7)?,
        conf: r.get(8)?,
        state: state.parse().map_err(|e| parse_err(9, e))?,
        owner_pid: r.get(10)?,
        owner_host: r.get(11)?,
        heartbeat_at: r.get(12)?,
        cancel_requested: r.get(13)?,
        created_at: r.get(14)?,
        finished_at: r.get(15)?,
    })
}

pub fn get_backfill(conn: &Connection, id: i64) -> anyhow::Result<Option<Backfill>> {
    Ok(conn
        .query_row(
            &format!("SELECT {BACKFILL_COLUMNS} FROM backfills WHERE id = ?1"),
            [id],
            backfill_from_row,
        )
        .optional()?)
}

/// What the manifest knows about each interval, for planning. Stale leases count as free.
pub fn priors(
    conn: &Connection,
    dag_id: &str,
    intervals: &[DataInterval],
    ctx: &LeaseCtx,
) -> anyhow::Result<(Vec<Prior>, Option<RunState>)> {
    let (Some(first), Some(last)) = (intervals.first(), intervals.last()) else {
        return Ok((Vec::new(), None));
    };
    let (lo, hi) = (first.start.timestamp(), last.start.timestamp());
    let mut latest: HashMap<i64, RunState> = HashMap::new();
    let mut stmt = conn.prepare_cached(
        "SELECT r.interval_start, r.state FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs
               WHERE dag_id = ?1 AND interval_start BETWEEN ?2 AND ?3
               GROUP BY interval_start) m ON r.id = m.id",
    )?;
    let mut rows = stmt.query(params![dag_id, lo, hi])?;
    while let Some(row) = rows.next()? {
        let state: String = row.get(1)?;
        latest.insert(row.get(0)?, state.parse().map_err(anyhow::Error::msg)?);
    }
    let in_flight = live_leases(conn, dag_id, lo, hi, ctx)?;
    let prior = intervals
        .iter()
        .map(|i| {
            let start = i.start.timestamp();
            Prior {
                latest: latest.get(&start).copied(),
                in_flight: in_flight.contains(&start),
            }
        })
        .collect();
    let before: Option<(i64, String)> = conn
        .query_row(
            "SELECT interval_end, state FROM runs
             WHERE dag_id = ?1 AND interval_start < ?2
             ORDER BY interval_start DESC, id DESC LIMIT 1",
            params![dag_id, lo],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let before = match before {
        Some((end, state)) if end == lo => Some(state.parse().map_err(anyhow::Error::msg)?),
        _ => None,
    };
    Ok((prior, before))
}

/// Whether the owner in columns `at..at + 4` of a row (state, pid, host, heartbeat) is alive.
fn owner_alive_at(ctx: &LeaseCtx, r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<bool> {
    let state: String = r.get(at)?;
    let host: Option<String> = r.get(at + 2)?;
    Ok(ctx.owner_alive(&state, r.get(at + 1)?, host.as_deref(), r.get(at + 3)?))
}

/// Interval starts in `[lo, hi]` leased by a live backfill.
fn live_leases(
    conn: &Connection,
    dag_id: &str,
    lo: i64,
    hi: i64,
    ctx: &LeaseCtx,
) -> anyhow::Result<HashSet<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.interval_start, b.state, b.owner_pid, b.owner_host, b.heartbeat_at
         FROM leases l JOIN backfills b ON b.id = l.backfill_id
         WHERE l.dag_id = ?1 AND l.interval_start BETWEEN ?2 AND ?3",
    )?;
    let mut rows = stmt.query(params![dag_id, lo, hi])?;
    let mut live = HashSet::new();
    while let Some(r) = rows.next()? {
        if owner_alive_at(ctx, r, 1)? {
            live.insert(r.get(0)?);
        }
    }
    Ok(live)
}

/// Finishes, for a dead owner backfill, the publishes it had decided on. It runs before the
/// owner's unfinished runs are abandoned, so a run whose every task was published is recorded
/// as succeeded rather than cancelled. The manifest does not know warehouses: the caller does.
pub type FinishPublishes<'a> = &'a dyn Fn(&Connection, i64) -> anyhow::Result<()>;

/// Releases every stale lease of `dag_id`: finishes its dead owner's publishes, kills the
/// process groups it left running on this host, records its runs and tries as cancelled, fences
/// it, and deletes the lease.
pub fn repair_stale_leases(
    conn: &Connection,
    dag_id: &str,
    ctx: &LeaseCtx,
    finish_publishes: FinishPublishes<'_>,
) -> anyhow::Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.interval_start, l.backfill_id, b.state, b.owner_pid, b.owner_host, b.heartbeat_at
         FROM leases l JOIN backfills b ON b.id = l.backfill_id WHERE l.dag_id = ?1",
    )?;
    let mut stale: Vec<(i64, i64)> = Vec::new();
    let mut rows = stmt.query([dag_id])?;
    while let Some(r) = rows.next()? {
        if !owner_alive_at(ctx, r, 2)? {
            stale.push((r.get(0)?, r.get(1)?));
        }
    }
    drop(rows);
    let owners: HashSet<i64> = stale.iter().map(|s| s.1).collect();
    for owner in owners {
        finish_publishes(conn, owner)?;
        abandon_runs(conn, owner, ctx)?;
        // Fence it: should the silent owner wake up, its heartbeat tells it to stop.
        conn.execute(
            "UPDATE backfills SET state = 'cancelled', finished_at = ?2
             WHERE id = ?1 AND state = 'running'",
            params![owner, ctx.now_ms],
        )?;
    }
    for (start, owner) in stale {
        conn.execute(
            "DELETE FROM leases WHERE dag_id = ?1 AND interval_start = ?2 AND backfill_id = ?3",
            params![dag_id, start, owner],
        )?;
    }
    Ok(())
}

/// Marks the unfinished runs and tries of a backfill whose process is gone as cancelled, after
/// killing the process groups it left running on this host.
pub fn abandon_runs(conn: &Connection, backfill_id: i64, ctx: &LeaseCtx) -> anyhow::Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT t.pgid FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE r.backfill_id = ?1 AND t.state = 'running' AND t.pgid IS NOT NULL AND t.host = ?2",
    )?;
    let groups: Vec<i64> = stmt
        .query_map(params![backfill_id, ctx.host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for pgid in groups {
        lease::kill_orphan_group(pgid, Duration::from_secs(5));
    }
    let why = format!("abandoned: the process of backfill {backfill_id} is gone");
    conn.execute(
        "UPDATE task_tries SET state = 'cancelled', ended_at = ?2, error = ?3
         WHERE state = 'running' AND publishing = 0 AND run_id IN
           (SELECT id FROM runs WHERE backfill_id = ?1 AND state IN ('queued', 'running'))",
        params![backfill_id, ctx.now_ms, why],
    )?;
    conn.execute(
        "UPDATE runs SET state = 'cancelled', ended_at = ?2, error = ?3
         WHERE backfill_id = ?1 AND state IN ('queued', 'running')",
        params![backfill_id, ctx.now_ms, why],
    )?;
    Ok(())
}

/// Records a new backfill owned by this process and its plan.
pub fn insert_backfill(
    conn: &Connection,
    b: &NewBackfill,
    plan: &[PlanRow],
    ctx: &LeaseCtx,
) -> anyhow::Result<i64> {
    conn.execute(
        "INSERT INTO backfills (dag_id, from_arg, to_arg, range_start, range_end, reprocess_behavior,
            max_active_runs, run_backwards, allow_drift, conf, state, owner_pid, owner_host,
            heartbeat_at, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running', ?11, ?12, ?13, ?13)",
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
            ctx.pid,
            ctx.host,
            ctx.now_ms
        ],
    )?;
    let id = conn.last_insert_rowid();
    let mut insert = conn.prepare_cached(
        "INSERT INTO plan (backfill_id, ord, interval_start, interval_end, action, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (ord, row) in plan.iter().enumerate() {
        let (action, reason) = match row.action {
            Action::Run => ("run", None),
            Action::Skip(r) => ("skip", Some(r.as_str())),
        };
        insert.execute(params![
            id,
            i64::try_from(ord)?,
            row.interval.start.timestamp(),
            row.interval.end.timestamp(),
            action,
            reason
        ])?;
    }
    Ok(id)
}

/// Leases `intervals` for `backfill_id`. The caller has checked (in this transaction) that no
/// live lease exists on them; stale ones are replaced.
pub fn take_leases(
    conn: &Connection,
    backfill_id: i64,
    dag_id: &str,
    intervals: impl Iterator<Item = DataInterval>,
    ctx: &LeaseCtx,
) -> anyhow::Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT OR REPLACE INTO leases (dag_id, interval_start, backfill_id, run_id, pid, host, heartbeat_at)
         VALUES (?1, ?2, ?3, NULL, ?4, ?5, ?6)",
    )?;
    for i in intervals {
        stmt.execute(params![
            dag_id,
            i.start.timestamp(),
            backfill_id,
            ctx.pid,
            ctx.host,
            ctx.now_ms
        ])?;
    }
    Ok(())
}

/// Whether `backfill_id` still holds the lease of an interval (a taker may have fenced it).
pub fn holds_lease(
    conn: &Connection,
    backfill_id: i64,
    dag_id: &str,
    interval_start: i64,
) -> anyhow::Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM leases WHERE dag_id = ?1 AND interval_start = ?2 AND backfill_id = ?3",
        )?
        .query_row(params![dag_id, interval_start, backfill_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Whether a run is still in progress (not abandoned by a taker).
pub fn run_in_progress(conn: &Connection, run_id: i64) -> anyhow::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT state FROM runs WHERE id = ?1")?
        .query_row([run_id], |r| r.get::<_, String>(0))
        .optional()?
        .is_some_and(|s| s == "running" || s == "queued"))
}

/// Records that an interval's run started; returns the run id.
pub fn start_run(
    conn: &Connection,
    backfill_id: i64,
    dag_id: &str,
    interval: DataInterval,
    now_ms: i64,
) -> anyhow::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO runs (backfill_id, dag_id, interval_start, interval_end, state, started_at)
         VALUES (?1, ?2, ?3, ?4, 'running', ?5)",
    )?
    .execute(params![
        backfill_id,
        dag_id,
        interval.start.timestamp(),
        interval.end.timestamp(),
        now_ms
    ])?;
    Ok(conn.last_insert_rowid())
}

/// Records a finished run and releases its lease.
pub fn finish_run(
    conn: &Connection,
    run_id: i64,
    state: RunState,
    error: Option<&str>,
    now_ms: i64,
) -> anyhow::Result<()> {
    // Only a run still in progress: a run that a taker recorded as abandoned stays so.
    conn.prepare_cached(
        "UPDATE runs SET state = ?2, ended_at = ?3, error = ?4
         WHERE id = ?1 AND state IN ('queued', 'running')",
    )?
    .execute(params![run_id, state.as_str(), now_ms, error])?;
    // By primary key: the lease of this run's interval, if this run's backfill holds it.
    conn.prepare_cached(
        "DELETE FROM leases WHERE (dag_id, interval_start, backfill_id) IN
           (SELECT dag_id, interval_start, backfill_id FROM runs WHERE id = ?1)",
    )?
    .execute([run_id])?;
    Ok(())
}

/// Records that a try started; returns its id.
pub fn start_try(
    conn: &Connection,
    run_id: i64,
    task_id: &str,
    try_number: u32,
    log_path: &str,
    now_ms: i64,
) -> anyhow::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO task_tries (run_id, task_id, try_number, state, started_at, log_path)
         VALUES (?1, ?2, ?3, 'running', ?4, ?5)",
    )?
    .execute(params![run_id, task_id, try_number, now_ms, log_path])?;
    Ok(conn.last_insert_rowid())
}

/// Records the process group of a running try, so that it can be killed if we die.
pub fn set_try_group(conn: &Connection, try_id: i64, pgid: i64, host: &str) -> anyhow::Result<()> {
    conn.prepare_cached("UPDATE task_tries SET pgid = ?2, host = ?3 WHERE id = ?1")?
        .execute(params![try_id, pgid, host])?;
    Ok(())
}

/// What a finished try recorded.
#[derive(Debug, Clone, Default)]
pub struct TryRecord {
    pub state: String,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub rows: Option<i64>,
    pub partitions: Option<String>,
    pub inputs: Option<String>,
    pub fingerprint: Option<String>,
    /// Gate: source rows, rows of the published try compared with, verdict and reasons.
    pub source_rows: Option<i64>,
    pub previous_rows: Option<i64>,
    pub verdict: Option<String>,
    pub reasons: Option<String>,
}

pub fn finish_try(
    conn: &Connection,
    try_id: i64,
    rec: &TryRecord,
    now_ms: i64,
) -> anyhow::Result<()> {
    conn.prepare_cached(
        "UPDATE task_tries SET state = ?2, ended_at = ?3, exit_code = ?4, error = ?5, rows = ?6,
            partitions = ?7, inputs = ?8, fingerprint = ?9, source_rows = ?10, previous_rows = ?11,
            verdict = ?12, reasons = ?13, publishing = 0
         WHERE id = ?1 AND state = 'running'",
    )?
    .execute(params![
        try_id,
        rec.state,
        now_ms,
        rec.exit_code,
        rec.error,
        rec.rows,
        rec.partitions,
        rec.inputs,
        rec.fingerprint,
        rec.source_rows,
        rec.previous_rows,
        rec.verdict,
        rec.reasons
    ])?;
    Ok(())
}

/// Records the gate's decision to publish before the warehouse is touched: a crash between this
/// and [`mark_published`] is repaired by redoing the publish. Returns false, recording nothing,
/// when the try is no longer running (its backfill was fenced): it must not publish.
pub fn record_publish_intent(
    conn: &Connection,
    try_id: i64,
    audit_table: Option<&str>,
    rec: &TryRecord,
) -> anyhow::Result<bool> {
    conn.prepare_cached(
        "UPDATE task_tries SET publishing = 1, audit_table = ?2, rows = ?3, fingerprint = ?4,
            source_rows = ?5, previous_rows = ?6, verdict = ?7, reasons = ?8
         WHERE id = ?1 AND state = 'running'",
    )?
    .execute(params![
        try_id,
        audit_table,
        rec.rows,
        rec.fingerprint,
        rec.source_rows,
        rec.previous_rows,
        rec.verdict,
        rec.reasons
    ])
    .map(|changed| changed == 1)
    .map_err(Into::into)
}

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
pub fn mark_published(conn: &Connection, p: &Publication<'_>, now_ms: i64) -> anyhow::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO published
            (dag_id, task_id, interval_start, interval_end, try_id, rows, fingerprint, published_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
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

/// The currently published try of a task and interval: `(try_id, rows)`.
pub fn published(
    conn: &Connection,
    dag_id: &str,
    task_id: &str,
    interval_start: i64,
) -> anyhow::Result<Option<(i64, i64)>> {
    Ok(conn
        .prepare_cached(
            "SELECT try_id, rows FROM published
             WHERE dag_id = ?1 AND task_id = ?2 AND interval_start = ?3",
        )?
        .query_row(params![dag_id, task_id, interval_start], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?)
}

/// A try that decided to publish but may not have finished.
#[derive(Debug, Clone)]
pub struct PendingPublish {
    pub try_id: i64,
    pub task_id: String,
    pub interval: DataInterval,
    pub audit_table: Option<String>,
    pub record: TryRecord,
}

/// Tries of a backfill's runs that recorded a publish intent and never finished it.
pub fn pending_publishes(
    conn: &Connection,
    backfill_id: i64,
) -> anyhow::Result<Vec<PendingPublish>> {
    let mut stmt = conn.prepare(
        "SELECT t.id, t.task_id, r.interval_start, r.interval_end, t.audit_table, t.rows,
                t.fingerprint, t.source_rows, t.previous_rows, t.verdict, t.reasons
         FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE r.backfill_id = ?1 AND t.publishing = 1 ORDER BY t.id",
    )?;
    let rows = stmt.query_map([backfill_id], |r| {
        Ok(PendingPublish {
            try_id: r.get(0)?,
            task_id: r.get(1)?,
            interval: DataInterval::from_unix(r.get(2)?, r.get(3)?),
            audit_table: r.get(4)?,
            record: TryRecord {
                state: "succeeded".into(),
                rows: r.get(5)?,
                fingerprint: r.get(6)?,
                source_rows: r.get(7)?,
                previous_rows: r.get(8)?,
                verdict: r.get(9)?,
                reasons: r.get(10)?,
                ..TryRecord::default()
            },
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Marks the unfinished runs of a backfill whose every task has a succeeded try as succeeded
/// (a crash after the last publish, before the run was recorded) and releases their leases.
pub fn complete_finished_runs(
    conn: &Connection,
    backfill_id: i64,
    task_count: usize,
    now_ms: i64,
) -> anyhow::Result<()> {
    let done: Vec<i64> = conn
        .prepare(
            "SELECT r.id FROM runs r WHERE r.backfill_id = ?1 AND r.state IN ('queued', 'running')
               AND (SELECT COUNT(DISTINCT t.task_id) FROM task_tries t
                    WHERE t.run_id = r.id AND t.state = 'succeeded') = ?2",
        )?
        .query_map(params![backfill_id, i64::try_from(task_count)?], |r| {
            r.get(0)
        })?
        .collect::<Result<_, _>>()?;
    for run_id in done {
        finish_run(conn, run_id, RunState::Succeeded, None, now_ms)?;
    }
    Ok(())
}

/// Changes a planned interval to a skip (decided while running, e.g. `depends_on_past`).
pub fn skip_planned(
    conn: &Connection,
    backfill_id: i64,
    dag_id: &str,
    interval_start: i64,
    reason: &str,
) -> anyhow::Result<()> {
    conn.prepare_cached(
        "UPDATE plan SET action = 'skip', reason = ?3 WHERE backfill_id = ?1 AND interval_start = ?2",
    )?
    .execute(params![backfill_id, interval_start, reason])?;
    conn.prepare_cached(
        "DELETE FROM leases WHERE dag_id = ?1 AND interval_start = ?2 AND backfill_id = ?3",
    )?
    .execute(params![dag_id, interval_start, backfill_id])?;
    Ok(())
}

/// What the owner of a running backfill learns from its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    Carry,
    /// `backfill cancel` asked it to stop.
    CancelRequested,
    /// Another process judged it dead (silent past the lease timeout) and took its intervals
    /// over: it must stop and start nothing more.
    Fenced,
}

/// Refreshes the owner heartbeat and reads what the owner must do.
pub fn heartbeat(conn: &Connection, backfill_id: i64, now_ms: i64) -> anyhow::Result<Heartbeat> {
    conn.prepare_cached("UPDATE backfills SET heartbeat_at = ?2 WHERE id = ?1")?
        .execute(params![backfill_id, now_ms])?;
    let (cancel, state): (bool, String) = conn
        .prepare_cached("SELECT cancel_requested, state FROM backfills WHERE id = ?1")?
        .query_row([backfill_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(if state != "running" {
        Heartbeat::Fenced
    } else if cancel {
        Heartbeat::CancelRequested
    } else {
        Heartbeat::Carry
    })
}

/// Records the end of a backfill and releases whatever leases it still holds.
pub fn finish_backfill(
    conn: &Connection,
    backfill_id: i64,
    state: BackfillState,
    now_ms: i64,
) -> anyhow::Result<()> {
    conn.execute(
        "UPDATE backfills SET state = ?2, finished_at = ?3, heartbeat_at = ?3
         WHERE id = ?1 AND state = 'running'",
        params![backfill_id, state.as_str(), now_ms],
    )?;
    conn.execute("DELETE FROM leases WHERE backfill_id = ?1", [backfill_id])?;
    Ok(())
}

/// Why a backfill cannot be resumed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOverRefused {
    Unknown,
    OwnerAlive {
        pid: Option<i64>,
        host: Option<String>,
    },
}

/// Takes over a backfill whose process is gone (or that was cancelled) for this process: kills
/// what its dead process left running, records those runs as cancelled, makes this process the
/// owner, and leases the intervals still to run. Intervals that another live backfill holds
/// are skipped as `in flight`. Returns the intervals to run, in plan order.
pub fn take_over(
    conn: &Connection,
    backfill_id: i64,
    ctx: &LeaseCtx,
    finish_publishes: FinishPublishes<'_>,
) -> anyhow::Result<Result<(Backfill, Vec<DataInterval>), TakeOverRefused>> {
    let Some(b) = get_backfill(conn, backfill_id)? else {
        return Ok(Err(TakeOverRefused::Unknown));
    };
    if b.owner_alive(ctx) {
        return Ok(Err(TakeOverRefused::OwnerAlive {
            pid: b.owner_pid,
            host: b.owner_host,
        }));
    }
    finish_publishes(conn, backfill_id)?;
    abandon_runs(conn, backfill_id, ctx)?;
    conn.execute("DELETE FROM leases WHERE backfill_id = ?1", [backfill_id])?;
    repair_stale_leases(conn, &b.dag_id, ctx, finish_publishes)?;
    conn.execute(
        "UPDATE backfills SET state = 'running', owner_pid = ?2, owner_host = ?3, heartbeat_at = ?4,
            cancel_requested = 0, finished_at = NULL WHERE id = ?1",
        params![backfill_id, ctx.pid, ctx.host, ctx.now_ms],
    )?;
    let mut stmt = conn.prepare(
        "SELECT p.interval_start, p.interval_end FROM plan p
         WHERE p.backfill_id = ?1 AND p.action = 'run' AND NOT EXISTS (
            SELECT 1 FROM runs r WHERE r.backfill_id = p.backfill_id
              AND r.interval_start = p.interval_start
              AND r.state IN ('succeeded', 'failed', 'rejected'))
         ORDER BY p.ord",
    )?;
    let remaining: Vec<DataInterval> = stmt
        .query_map([backfill_id], |r| {
            Ok(DataInterval::from_unix(r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let (lo, hi) = remaining.iter().fold((i64::MAX, i64::MIN), |(lo, hi), i| {
        (lo.min(i.start.timestamp()), hi.max(i.start.timestamp()))
    });
    let busy = live_leases(conn, &b.dag_id, lo, hi, ctx)?;
    let mut free = Vec::with_capacity(remaining.len());
    for interval in remaining {
        let start = interval.start.timestamp();
        if busy.contains(&start) {
            skip_planned(
                conn,
                backfill_id,
                &b.dag_id,
                start,
                crate::plan::SkipReason::InFlight.as_str(),
            )?;
        } else {
            free.push(interval);
        }
    }
    take_leases(conn, backfill_id, &b.dag_id, free.iter().copied(), ctx)?;
    let b = get_backfill(conn, backfill_id)?.unwrap_or(b);
    Ok(Ok((b, free)))
}

/// Asks the process running a backfill to stop (it polls the flag with its heartbeat).
pub fn request_cancel(conn: &Connection, backfill_id: i64) -> anyhow::Result<()> {
    conn.execute(
        "UPDATE backfills SET cancel_requested = 1 WHERE id = ?1",
        [backfill_id],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_set_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/manifest.db");
        drop(open(&path).unwrap());
        let conn = open(&path).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.last().unwrap().0);
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn a_newer_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.db");
        let conn = open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = format!("{:#}", open(&path).unwrap_err());
        assert!(
            err.contains("newer than this backfill understands"),
            "{err}"
        );
    }
}
