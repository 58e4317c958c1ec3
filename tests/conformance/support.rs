//! What every behaviour of the suite is written against: an [`Engine`] (a manifest on SQLite or
//! PostgreSQL, its writer and a read-only handle), a host whose processes the suite decides
//! ([`FakeHost`]), and small builders of requests, intervals and records.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::Value;

use backfill::clock::End;
use backfill::interval::DataInterval;
use backfill::liveness::{Group, Host};
use backfill::manifest::backfills::Owner;
use backfill::manifest::db::Step;
use backfill::manifest::leases::LeaseCtx;
use backfill::manifest::writer::Writer;
use backfill::manifest::{self, Durability, NewBackfill, Reads, Store, TryRecord};
use backfill::plan::{Action, PlanRow, Reprocess};
use backfill::state::{BackfillKind, TryState};

/// The engine that holds a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// A manifest of its own for one test: written through the program's one writer thread (each
/// job in a committed transaction, as the program writes), read through a read-only handle (as
/// every command reads), and inspected as raw rows.
pub struct Engine {
    pub kind: Kind,
    /// The file, or the PostgreSQL URL.
    pub location: PathBuf,
    writer: Option<Writer>,
    reader: Box<dyn Reads>,
    /// Keeps the SQLite file's folder.
    _dir: Option<tempfile::TempDir>,
}

impl Engine {
    /// A new, empty manifest in a temporary folder.
    pub fn sqlite() -> Engine {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let location = dir.path().join("manifest.db");
        Self::open(Kind::Sqlite, location, Some(dir))
    }

    /// A new, empty manifest in a fresh database of the shared test cluster.
    pub fn postgres() -> Engine {
        let location = PathBuf::from(crate::pg::shared().create_db_url());
        Self::open(Kind::Postgres, location, None)
    }

    /// The manifest at `location` (created or upgraded as the program opens it for writing).
    pub fn open(kind: Kind, location: PathBuf, dir: Option<tempfile::TempDir>) -> Engine {
        let writer = Writer::open(&location, Durability::Normal)
            .unwrap_or_else(|e| panic!("open the manifest {}: {e}", location.display()));
        let reader = manifest::open_read_only(&location)
            .unwrap_or_else(|e| panic!("open the manifest {} to read: {e}", location.display()));
        Engine {
            kind,
            location,
            writer: Some(writer),
            reader,
            _dir: dir,
        }
    }

    pub fn is_postgres(&self) -> bool {
        self.kind == Kind::Postgres
    }

    pub fn writer(&self) -> &Writer {
        self.writer
            .as_ref()
            .expect("the writer is open until the engine is dropped")
    }

    /// Runs `f` as one job of the writer, committed before this returns.
    pub fn write<R, F>(&self, f: F) -> manifest::Result<R>
    where
        R: Send + 'static,
        F: FnMut(&dyn Store) -> manifest::Result<R> + Send + 'static,
    {
        self.writer().call_blocking(f)
    }

    /// [`Engine::write`], which must succeed.
    pub fn ok<R, F>(&self, f: F) -> R
    where
        R: Send + 'static,
        F: FnMut(&dyn Store) -> manifest::Result<R> + Send + 'static,
    {
        self.write(f)
            .unwrap_or_else(|e| panic!("a write failed: {e}"))
    }

    /// A job whose last statement may be deferred (PostgreSQL sends it with the commit), as
    /// the runner submits its starts and ends.
    pub fn step<R, F>(&self, f: F) -> manifest::Result<R>
    where
        R: Send + 'static,
        F: FnMut(&dyn Store) -> manifest::Result<Step<R>> + Send + 'static,
    {
        self.writer()
            .submit_step(f)
            .blocking_recv()
            .unwrap_or_else(|_| panic!("the writer dropped a job"))
    }

    /// The read-only handle every command reads through.
    pub fn read(&self) -> &dyn Reads {
        &*self.reader
    }

    /// The manifest's "now" (unix ms): this process's clock on SQLite, the database's on
    /// PostgreSQL.
    pub fn clock(&self) -> i64 {
        self.read()
            .clock_ms(backfill::clock::now_ms())
            .expect("the manifest's clock")
    }

    /// Runs `f` and returns what it gave with the span of the manifest's clock around it.
    pub fn timed<R>(&self, f: impl FnOnce() -> R) -> (R, Span) {
        let lo = self.clock();
        let r = f();
        let hi = self.clock();
        (r, Span { lo, hi })
    }

    /// What the manifest recorded as "now" for a write made during `span` that passed
    /// `passed`: exactly `passed` on SQLite (this host's clock, which only it writes), the
    /// database's clock during the write on PostgreSQL (every host's alike).
    #[track_caller]
    pub fn assert_now(&self, got: i64, passed: i64, span: Span) {
        match self.kind {
            Kind::Sqlite => assert_eq!(got, passed, "the time the caller passed"),
            Kind::Postgres => assert!(
                span.lo <= got && got <= span.hi,
                "{got} is not the database's clock during the write ({} to {})",
                span.lo,
                span.hi
            ),
        }
    }

    /// Every row of `sql`, as SQLite's values (PostgreSQL's flags and times are `bigint`s, so
    /// both engines give the same values for the same record).
    pub fn rows(&self, sql: &str) -> Vec<Vec<Value>> {
        match self.kind {
            Kind::Sqlite => sqlite_rows(&self.location, sql),
            Kind::Postgres => {
                let shown = self.location.to_string_lossy().into_owned();
                let s = manifest::postgres::Session::connect(&shown, &shown, true)
                    .unwrap_or_else(|e| panic!("connect to {shown}: {e}"));
                s.query(sql, &[])
                    .unwrap_or_else(|e| panic!("{sql} in {shown}: {e}"))
            }
        }
    }

    /// The one value of `sql`.
    pub fn value(&self, sql: &str) -> Value {
        let rows = self.rows(sql);
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        rows[0][0].clone()
    }

    /// The one integer of `sql`.
    pub fn int(&self, sql: &str) -> i64 {
        match self.value(sql) {
            Value::Integer(i) => i,
            other => panic!("{sql} gave {other:?}"),
        }
    }

    /// The schema version the manifest is at.
    pub fn schema_version(&self) -> i64 {
        match self.kind {
            Kind::Sqlite => self.int("PRAGMA user_version"),
            Kind::Postgres => self.int("SELECT max(version) FROM schema_version"),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            w.close();
        }
        if self.kind == Kind::Postgres
            && let Some(db) = self.location.to_str().and_then(|u| u.rsplit('/').next())
        {
            crate::pg::Cluster::drop_shared_db(db.to_string());
        }
    }
}

/// Every row of `sql` in the SQLite file at `path`, opened read-only.
pub fn sqlite_rows(path: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut stmt = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let width = stmt.column_count();
    let mut rows = stmt.query([]).unwrap();
    let mut out = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        out.push((0..width).map(|i| r.get::<_, Value>(i).unwrap()).collect());
    }
    out
}

/// The manifest's clock before and after a write.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub lo: i64,
    pub hi: i64,
}

/// This host's name, as the owners the suite records on it carry it.
pub const HERE: &str = "conformance-here";
/// Another host: its processes cannot be looked at from here, only its heartbeats.
pub const ELSEWHERE: &str = "conformance-elsewhere";
/// A process of this host that runs (started at [`LIVE_START`]).
pub const LIVE_PID: i64 = 4_100;
pub const LIVE_START: i64 = 777;
/// A second process of this host that runs.
pub const OTHER_LIVE_PID: i64 = 4_200;
/// A process id of this host that runs nothing.
pub const DEAD_PID: i64 = 4_300;
/// A process group of this host with a member alive; any other group is gone.
pub const LIVE_GROUP: Group = Group {
    pgid: 5_100,
    leader_start: Some(888),
};
pub const DEAD_GROUP: Group = Group {
    pgid: 5_200,
    leader_start: Some(999),
};

/// This host as the suite makes it: [`LIVE_PID`] and [`OTHER_LIVE_PID`] run, [`LIVE_GROUP`]
/// has a member alive, nothing else exists; nothing is stopped.
#[derive(Debug)]
pub struct FakeHost;

impl Host for FakeHost {
    fn name(&self) -> String {
        HERE.to_string()
    }
    fn pid_alive(&self, pid: i64) -> bool {
        pid == LIVE_PID || pid == OTHER_LIVE_PID
    }
    fn group_alive(&self, group: Group) -> bool {
        group == LIVE_GROUP
    }
    fn start_of(&self, pid: i64) -> Option<i64> {
        match pid {
            LIVE_PID => Some(LIVE_START),
            OTHER_LIVE_PID => Some(LIVE_START + 1),
            _ => None,
        }
    }
    fn stopped(&self, _: i64) -> bool {
        false
    }
}

pub static HOST: FakeHost = FakeHost;

/// The lease timeout of the suite's processes: long enough that no heartbeat of a test expires
/// unless the test lets it.
pub const TIMEOUT_MS: i64 = 600_000;

/// A process `pid` of `host`, now, as it records itself and judges others.
pub fn process(pid: i64, host: &str) -> LeaseCtx {
    LeaseCtx {
        now_ms: backfill::clock::now_ms(),
        host: host.to_string(),
        pid,
        start: if host == HERE {
            HOST.start_of(pid)
        } else {
            Some(1)
        },
        timeout_ms: TIMEOUT_MS,
        silent: None,
        here: &HOST,
    }
}

/// A process of this host that runs (an owner that stays alive).
pub fn alive() -> LeaseCtx {
    process(LIVE_PID, HERE)
}

/// A second process of this host that runs (one that judges, joins or takes over).
pub fn other() -> LeaseCtx {
    process(OTHER_LIVE_PID, HERE)
}

/// A process of this host that has died since it recorded itself.
pub fn dead() -> LeaseCtx {
    process(DEAD_PID, HERE)
}

/// A process of another host: judged by its heartbeat alone.
pub fn remote() -> LeaseCtx {
    process(9_999, ELSEWHERE)
}

/// `ctx` with a lease timeout of 1 ms, once that has passed since now: every heartbeat
/// recorded before is expired.
pub fn expired(ctx: &LeaseCtx) -> LeaseCtx {
    std::thread::sleep(Duration::from_millis(5));
    LeaseCtx {
        timeout_ms: 1,
        ..ctx.refreshed()
    }
}

/// 2026-01-01T00:00:00Z, the first interval's start.
pub const BASE: i64 = 1_767_225_600;
pub const DAY: i64 = 86_400;

/// The start of day `i` (unix seconds).
pub fn start(i: i64) -> i64 {
    BASE + i * DAY
}

/// Day `i` as an interval.
pub fn day(i: i64) -> DataInterval {
    DataInterval::from_unix(start(i), start(i + 1))
}

/// `2026-01-0Nt00:00:00Z` of day `i`, as the read models say an instant.
pub fn rfc(i: i64) -> String {
    backfill::interval::rfc3339(day(i).start)
}

/// An instant in unix milliseconds as the read models say it.
pub fn rfc_ms(ms: i64) -> String {
    backfill::interval::rfc3339(chrono::DateTime::from_timestamp_millis(ms).unwrap())
}

/// A request for DAG `dag` with nothing but what is required.
pub fn request(dag: &str) -> NewBackfill {
    NewBackfill {
        dag_id: dag.to_string(),
        from_arg: "2026-01-01".into(),
        to_arg: "2026-01-31".into(),
        range_start: start(0),
        range_end: start(31),
        reprocess: Reprocess::None,
        max_active_runs: 4,
        run_backwards: false,
        allow_drift: false,
        conf: "{}".into(),
        kind: BackfillKind::Run,
        source_backfill: None,
        tasks: None,
        max_failures: None,
        cascade: None,
        cascade_of: None,
        sample: None,
        definition: None,
        batch_size: None,
        project: None,
        warehouses: None,
        atomic: false,
        wait_ready: None,
        require_ready: false,
    }
}

/// Records backfill `req` for process `ctx`; returns its owner.
pub fn insert(m: &Engine, req: NewBackfill, ctx: &LeaseCtx) -> Owner {
    let ctx = ctx.refreshed();
    m.ok(move |s| s.insert_backfill(&req, &ctx))
}

/// Plan rows running days `days` (in that order).
pub fn run_rows(days: impl IntoIterator<Item = i64>) -> Vec<(i64, PlanRow)> {
    days.into_iter()
        .enumerate()
        .map(|(ord, d)| {
            (
                ord as i64,
                PlanRow {
                    interval: day(d),
                    action: Action::Run,
                },
            )
        })
        .collect()
}

/// Writes plan `rows` for `owner` (leasing the intervals it runs) in one chunk.
pub fn plan(m: &Engine, owner: Owner, dag: &str, rows: Vec<(i64, PlanRow)>, ctx: &LeaseCtx) {
    let (dag, ctx) = (dag.to_string(), ctx.refreshed());
    m.ok(move |s| s.insert_plan_chunk(s.fence(owner)?, &dag, &rows, &ctx));
}

/// A backfill of `dag` for `ctx` whose plan runs days `0..days`, complete.
pub fn planned(m: &Engine, req: NewBackfill, days: i64, ctx: &LeaseCtx) -> Owner {
    planned_days(m, req, 0..days, ctx)
}

/// A backfill of `dag` for `ctx` whose plan runs `days` in that order, complete.
pub fn planned_days(
    m: &Engine,
    req: NewBackfill,
    days: impl IntoIterator<Item = i64>,
    ctx: &LeaseCtx,
) -> Owner {
    let dag = req.dag_id.clone();
    let owner = insert(m, req, ctx);
    plan(m, owner, &dag, run_rows(days), ctx);
    m.ok(move |s| s.mark_planned(owner));
    owner
}

/// The log path the suite gives a run's first try: `log-` + the run's id + `.log`.
pub const LOG: (&str, &str) = ("/logs/run", ".try1.log");

/// What starting day `d`'s run and its first try of `task` gave.
pub fn try_start(
    m: &Engine,
    owner: Owner,
    dag: &str,
    d: i64,
    task: &str,
) -> (backfill::manifest::runs::Start, Option<i64>) {
    let (dag, task) = (dag.to_string(), task.to_string());
    m.step(move |s| {
        s.start_run_and_try(
            s.fence(owner)?,
            &dag,
            day(d),
            backfill::clock::now_ms(),
            TIMEOUT_MS,
            &task,
            1,
            LOG,
            None,
        )
    })
    .unwrap_or_else(|e| panic!("start day {d}: {e}"))
}

/// Starts day `d`'s run and its first try of `task`, which must start: `(run, try)`.
pub fn start_run(m: &Engine, owner: Owner, dag: &str, d: i64, task: &str) -> (i64, i64) {
    match try_start(m, owner, dag, d, task) {
        (backfill::manifest::runs::Start::Run(run), Some(t)) => (run, t),
        other => panic!("day {d} did not start: {other:?}"),
    }
}

/// A record of a try that ended in `state` and says nothing more.
pub fn record(state: TryState) -> TryRecord {
    TryRecord::new(state)
}

/// An end measured by this process as `elapsed` ms after the start, with a wall clock that
/// disagrees by more than a second: the manifest records the start plus `elapsed`, on both
/// engines, whatever their clocks say.
pub fn after(elapsed: i64) -> End {
    End {
        now_ms: backfill::clock::now_ms(),
        elapsed_ms: Some(elapsed),
    }
}

/// How long after its start [`end_run`] ends a try (plus the try's id) and its run (plus the
/// run's id), as measured by this process: exact on both engines (see [`after`]).
pub const TRY_MS: i64 = 10_000;
pub const RUN_MS: i64 = 20_000;

/// Ends try `t` and its run `run` in `state` (the try succeeded exactly when the run did).
pub fn end_run(
    m: &Engine,
    owner: Owner,
    (run, t): (i64, i64),
    state: backfill::state::RunState,
    rec: TryRecord,
) {
    let error =
        (state != backfill::state::RunState::Succeeded).then(|| format!("run {run}: {state}"));
    m.step(move |s| {
        s.finish_try_and_run(
            s.fence(owner)?,
            t,
            &rec,
            run,
            state,
            error.as_deref(),
            (after(TRY_MS + t), after(RUN_MS + run)),
        )
    })
    .unwrap_or_else(|e| panic!("end run {run}: {e}"));
}

/// The `started_at` of run `run`.
pub fn run_started(m: &Engine, run: i64) -> i64 {
    m.int(&format!("SELECT started_at FROM runs WHERE id = {run}"))
}

/// The `started_at` of try `t`.
pub fn try_started(m: &Engine, t: i64) -> i64 {
    m.int(&format!("SELECT started_at FROM task_tries WHERE id = {t}"))
}

/// `r` is the refusal of a write by an owner that lost its claim on backfill `backfill_id`.
#[track_caller]
pub fn assert_fenced<T: std::fmt::Debug>(r: manifest::Result<T>, backfill_id: i64) {
    match r {
        Err(manifest::Error::Fenced { backfill_id: b }) => assert_eq!(b, backfill_id),
        other => panic!("expected the write to be fenced out, got {other:?}"),
    }
}

/// `v` in order, for answers whose order no one promised.
pub fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}
