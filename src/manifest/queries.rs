//! Read queries behind `list`, `show` and `runs`. Each is a fixed number of indexed queries
//! whatever the number of intervals (no query per row).

use std::collections::HashMap;

use rusqlite::params;

use super::db::Conn;
use serde::Serialize;

use super::Result;
use super::backfills::{self, Backfill};
use crate::interval::{DataInterval, Rfc3339, from_unix, rfc3339};
use crate::plan::Reprocess;
use crate::state::{
    BackfillKind, BackfillState, IntervalState, PlanAction, RunState, ShownVerdict, TryState,
    Verdict,
};

pub(super) fn ms_to_rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(rfc3339)
        .unwrap_or_default()
}

/// What a task's gate gives for an interval's source.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Seen {
    pub source_rows: Option<i64>,
    pub source_fingerprint: Option<String>,
}

/// What the tries of an interval's latest run recorded, when that run succeeded: its interval
/// and, per task, what the gate saw of the source.
pub(crate) type Recorded = std::collections::BTreeMap<
    i64,
    (
        crate::interval::DataInterval,
        std::collections::HashMap<String, Seen>,
    ),
>;

/// What the merges of a run's succeeded tries did to their partitions (`write = "merge"`): rows
/// inserted, updated, deleted, and left unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub inserted: i64,
    pub updated: i64,
    pub deleted: i64,
    pub unchanged: i64,
}

impl Changes {
    /// Adds a try's recorded counts (read as the four columns `rows_inserted` ..
    /// `rows_unchanged` from `at`), when it recorded them.
    pub(super) fn add(
        total: &mut Option<Changes>,
        r: &super::db::Row<'_>,
        at: usize,
    ) -> super::db::Result<()> {
        let counts: [Option<i64>; 4] = [r.get(at)?, r.get(at + 1)?, r.get(at + 2)?, r.get(at + 3)?];
        if let [Some(i), Some(u), Some(d), Some(n)] = counts {
            let t = total.get_or_insert_with(Changes::default);
            t.inserted += i;
            t.updated += u;
            t.deleted += d;
            t.unchanged += n;
        }
        Ok(())
    }

    /// `+3 ~2 -1 =194`, as tables show it.
    pub(crate) fn short(&self) -> String {
        crate::gate::Merge {
            inserted: self.inserted,
            updated: self.updated,
            deleted: self.deleted,
            unchanged: self.unchanged,
            ..crate::gate::Merge::default()
        }
        .short()
    }
}

/// A log path, when its file exists: a try that printed nothing leaves none.
fn existing(log: Option<String>) -> Option<String> {
    log.filter(|p| std::path::Path::new(p).exists())
}

/// One backfill with counts of its intervals by outcome.
#[derive(Debug, Clone, Serialize)]
pub struct BackfillSummary {
    pub id: i64,
    pub dag_id: String,
    pub state: BackfillState,
    /// The first and last interval start of the plan (`None` before any plan row exists).
    pub from: Option<Rfc3339>,
    pub to: Option<Rfc3339>,
    /// `--from` and `--to` as typed (`today-7d`).
    pub from_arg: String,
    pub to_arg: String,
    pub reprocess_behavior: Reprocess,
    pub max_active_runs: u32,
    /// `create --batch-size N` (left out when none was given: the DAG's `batch_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    pub run_backwards: bool,
    pub allow_drift: bool,
    pub conf: serde_json::Value,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub owner_pid: Option<i64>,
    pub owner_host: Option<String>,
    /// Whether the process running it is alive (false for a backfill that is not running).
    pub owner_alive: bool,
    /// The owner's last heartbeat (unix milliseconds), to judge `owner_alive`.
    #[serde(skip)]
    pub heartbeat_at: Option<i64>,
    /// When the owner's process started, to judge `owner_alive`.
    #[serde(skip)]
    pub owner_start: Option<i64>,
    pub intervals: Counts,
    pub kind: BackfillKind,
    /// A promote: the staged backfill whose outputs it publishes.
    pub source_backfill: Option<i64>,
    /// `promote --atomic`: every output in one warehouse transaction, or none (left out when
    /// not).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub atomic: bool,
    /// The tasks it ran (`None`: every task).
    pub tasks: Option<Vec<String>>,
    /// `--max-failures`.
    pub max_failures: Option<u32>,
    /// The first backfill of a cascade: `all` or `changed`.
    pub cascade: Option<String>,
    /// A downstream backfill of a cascade: the cascade's first backfill.
    /// `create --sample N`: the N asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<u32>,
    pub cascade_of: Option<i64>,
}

/// Interval counts: how many were planned to run or skipped, and the latest outcome of each
/// interval this backfill ran.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub total: i64,
    pub planned: i64,
    pub skipped: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub rejected: i64,
    pub cancelled: i64,
    pub running: i64,
    pub pending: i64,
    /// The first and last interval start of the plan (unix seconds).
    #[serde(skip)]
    pub span: Option<(i64, i64)>,
}

impl Counts {
    fn add_state(&mut self, state: RunState, n: i64) {
        match state {
            RunState::Succeeded => self.succeeded += n,
            RunState::Failed => self.failed += n,
            RunState::Rejected => self.rejected += n,
            RunState::Cancelled => self.cancelled += n,
            RunState::Queued | RunState::Running => self.running += n,
        }
    }

    fn finish(&mut self) {
        let started = self.succeeded + self.failed + self.rejected + self.cancelled + self.running;
        self.pending = (self.planned - started).max(0);
    }
}

fn summary(b: Backfill, counts: Counts) -> BackfillSummary {
    BackfillSummary {
        id: b.id,
        dag_id: b.dag_id,
        state: b.state,
        from: counts.span.map(|s| Rfc3339(from_unix(s.0))),
        to: counts.span.map(|s| Rfc3339(from_unix(s.1))),
        from_arg: b.from_arg,
        to_arg: b.to_arg,
        reprocess_behavior: b.reprocess,
        max_active_runs: b.max_active_runs,
        batch_size: b.batch_size,
        run_backwards: b.run_backwards,
        allow_drift: b.allow_drift,
        conf: serde_json::from_str(&b.conf).unwrap_or(serde_json::Value::Null),
        created_at: ms_to_rfc3339(b.created_at),
        finished_at: b.finished_at.map(ms_to_rfc3339),
        owner_pid: b.owner_pid,
        owner_host: b.owner_host,
        owner_alive: false,
        heartbeat_at: b.heartbeat_at,
        owner_start: b.owner_start,
        intervals: counts,
        kind: b.kind,
        source_backfill: b.source_backfill,
        atomic: b.atomic,
        tasks: b.tasks,
        max_failures: b.max_failures,
        cascade: b.cascade,
        cascade_of: b.cascade_of,
        sample: b.sample,
    }
}

/// Backfills, newest last, optionally of one DAG and/or only the running ones.
pub(crate) fn list(
    conn: &Conn,
    dag_id: Option<&str>,
    active_only: bool,
) -> Result<Vec<BackfillSummary>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {} FROM backfills
         WHERE (dag_id = $1 OR $1 IS NULL) AND ($2 = 0 OR state = 'running') ORDER BY id",
        backfills::COLUMNS
    ))?;
    let backfills: Vec<Backfill> = stmt
        .query_map(params![dag_id, active_only], backfills::from_row)?
        .collect::<super::db::Result<_>>()?;
    let mut counts = counts(conn, None)?;
    Ok(backfills
        .into_iter()
        .map(|b| {
            let c = counts.remove(&b.id).unwrap_or_default();
            summary(b, c)
        })
        .collect())
}

/// A failed or rejected interval, for the summary at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct FailedInterval {
    pub start: Rfc3339,
    pub state: RunState,
    /// The task whose try failed or was rejected.
    pub task: Option<String>,
    pub error: Option<String>,
    pub log: Option<String>,
    /// The last lines of that log, filled in by the session for the summary (never stored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
}

/// How a backfill stands: its counts, skips by reason, and the intervals whose latest run
/// failed or was rejected. Its size does not grow with the number of intervals that went well.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub backfill: BackfillSummary,
    pub skipped: std::collections::BTreeMap<String, i64>,
    pub failed: Vec<FailedInterval>,
    /// Intervals whose latest run published with the gate's warnings (at most
    /// [`WARNED_SHOWN`]).
    pub warned: Vec<WarnedInterval>,
    /// How many intervals' latest runs published with the gate's warnings, all of them.
    pub warned_count: i64,
}

/// An interval whose output was published with the gate's warnings.
#[derive(Debug, Clone, Serialize)]
pub struct WarnedInterval {
    pub start: Rfc3339,
    pub task: String,
    /// The try's reasons: `warning: ...; warning: ...`.
    pub warnings: String,
}

/// How many warned intervals a backfill's outcome lists.
pub(crate) const WARNED_SHOWN: i64 = 100;

pub(crate) fn outcome(conn: &Conn, id: i64) -> Result<Option<Outcome>> {
    let Some(backfill) = list_one(conn, id)? else {
        return Ok(None);
    };
    let mut stmt = conn.prepare(
        "SELECT COALESCE(reason, ''), COUNT(*) FROM plan
         WHERE backfill_id = $1 AND action = 'skip' GROUP BY reason",
    )?;
    let skipped = stmt
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT r.interval_start, r.state, r.error,
                (SELECT t.log_path FROM task_tries t WHERE t.run_id = r.id AND t.state != 'succeeded'
                 ORDER BY t.id DESC LIMIT 1),
                (SELECT t.task_id FROM task_tries t WHERE t.run_id = r.id AND t.state != 'succeeded'
                 ORDER BY t.id DESC LIMIT 1)
         FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs WHERE backfill_id = $1 GROUP BY interval_start) m
           ON m.id = r.id
         WHERE r.state IN ('failed', 'rejected') ORDER BY r.interval_start",
    )?;
    let failed = stmt
        .query_map([id], |r| {
            Ok(FailedInterval {
                start: Rfc3339(from_unix(r.get(0)?)),
                state: r.get(1)?,
                task: r.get(4)?,
                error: r.get(2)?,
                log: existing(r.get(3)?),
                log_tail: None,
            })
        })?
        .collect::<super::db::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT r.interval_start, t.task_id, t.reasons
         FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs WHERE backfill_id = $1 GROUP BY interval_start) m
           ON m.id = r.id
         JOIN task_tries t ON t.run_id = r.id
         WHERE r.state = 'succeeded' AND t.state = 'succeeded' AND t.reasons LIKE '%warning: %'
           AND COALESCE(t.verdict, '') <> 'staged'
         ORDER BY r.interval_start, t.id LIMIT $2",
    )?;
    let warned = stmt
        .query_map(rusqlite::params![id, WARNED_SHOWN], |r| {
            Ok(WarnedInterval {
                start: Rfc3339(from_unix(r.get(0)?)),
                task: r.get(1)?,
                warnings: r.get(2)?,
            })
        })?
        .collect::<super::db::Result<_>>()?;
    let warned_count = conn.query_row(
        "SELECT COUNT(DISTINCT r.interval_start)
         FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs WHERE backfill_id = $1 GROUP BY interval_start) m
           ON m.id = r.id
         JOIN task_tries t ON t.run_id = r.id
         WHERE r.state = 'succeeded' AND t.state = 'succeeded' AND t.reasons LIKE '%warning: %'
           AND COALESCE(t.verdict, '') <> 'staged'",
        [id],
        |r| r.get(0),
    )?;
    Ok(Some(Outcome {
        backfill,
        skipped,
        failed,
        warned,
        warned_count,
    }))
}

/// One interval of a backfill, as `show` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalDetail {
    pub ord: i64,
    pub start: Rfc3339,
    pub end: Rfc3339,
    pub action: PlanAction,
    pub reason: Option<String>,
    /// State of this backfill's latest run of the interval.
    pub state: Option<IntervalState>,
    /// Runs of this interval by this backfill (a resume adds one).
    pub attempts: i64,
    /// Task tries of the latest run.
    pub tries: i64,
    /// Rows reported by the latest run's tasks.
    pub rows: Option<i64>,
    /// Rows the latest run's rejected tries computed (published nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_rows: Option<i64>,
    /// Whether a try of the latest run published with the gate's warnings.
    #[serde(skip)]
    pub warned: bool,
    /// What the latest run's merges did (`write = "merge"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    pub verdict: Option<ShownVerdict>,
    /// Why the gate rejected the output, or `empty source` for an explicit empty partition.
    pub reasons: Option<String>,
    pub duration_ms: Option<i64>,
    pub error: Option<String>,
    /// Log of the latest run's last failed try.
    pub log: Option<String>,
    /// The host of the latest run's last try, as recorded (see [`crate::liveness::identity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The batch (`START/END`) whose one query or command computed the latest run's output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// What its readiness checks answered before its run (`[tasks.ready]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<ReadyDetail>,
}

/// What one task's readiness check answered for an interval of a backfill.
#[derive(Debug, Clone, Serialize)]
pub struct ReadyDetail {
    pub task: String,
    pub state: crate::state::ReadyState,
    pub asks: i64,
    pub answer: Option<String>,
    /// How long the interval waited for it (milliseconds).
    pub waited_ms: i64,
    /// How long it may still wait, while `waiting` (milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_ms: Option<i64>,
}

impl ReadyDetail {
    /// `task `load` not ready after 7 asks over 2h: no file yet`.
    pub(crate) fn said(&self) -> String {
        let over = crate::words::duration_short(std::time::Duration::from_millis(
            u64::try_from(self.waited_ms).unwrap_or(0),
        ));
        let asks = crate::words::plural(self.asks, "ask", "asks");
        let answer = self
            .answer
            .as_deref()
            .map_or(String::new(), |a| format!(": {a}"));
        format!(
            "task `{}` {} after {asks} over {over}{answer}",
            self.task, self.state
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BackfillDetail {
    #[serde(flatten)]
    pub backfill: BackfillSummary,
    pub interval_details: Vec<IntervalDetail>,
    /// The first backfill of a cascade: its downstream backfills, in the order they ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cascade_backfills: Option<Vec<BackfillDetail>>,
    /// The processes that joined it (`backfill join`), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerSummary>,
}

/// A worker of a backfill, as `show` says it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerSummary {
    pub id: i64,
    pub host: Option<String>,
    pub pid: Option<i64>,
    pub state: BackfillState,
    /// Running, with a heartbeat within the lease timeout (judged by the caller).
    pub alive: bool,
    pub max_active_runs: u32,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// Intervals whose runs it started.
    pub runs: i64,
}

impl WorkerSummary {
    pub(crate) fn of(w: &super::workers::Worker, alive: bool, runs: i64) -> Self {
        Self {
            id: w.id,
            host: w.host.clone(),
            pid: w.pid,
            state: w.state,
            alive,
            max_active_runs: w.max_active_runs,
            started_at: ms_to_rfc3339(w.started_at),
            finished_at: w.finished_at.map(ms_to_rfc3339),
            runs,
        }
    }
}

/// The latest run of an interval in a backfill, and how many runs it had.
struct LatestRun {
    interval_start: i64,
    run_id: i64,
    state: RunState,
    started: i64,
    ended: Option<i64>,
    error: Option<String>,
    attempts: i64,
}

/// The tries of one run, aggregated.
#[derive(Default)]
struct TryAgg {
    run_id: i64,
    tries: i64,
    rows: Option<i64>,
    rejected_rows: Option<i64>,
    warned: bool,
    changes: Option<Changes>,
    verdict: Option<ShownVerdict>,
    reasons: Option<String>,
    log: Option<String>,
    error: Option<String>,
    /// The ids of the tries `verdict` and `error` come from: the latest of each wins.
    verdict_try: i64,
    error_try: i64,
    /// The pool a running try waits for.
    waiting_for: Option<String>,
    /// The host of the latest try, and that try's id.
    host: Option<String>,
    host_try: i64,
    batch: Option<String>,
}

/// A try's verdict as the reads show it, with what became of a staged output.
pub(super) fn shown_verdict(
    verdict: Verdict,
    staged: Option<crate::state::StagedState>,
) -> ShownVerdict {
    ShownVerdict { verdict, staged }
}

/// A backfill and every interval of its plan; `None` when there is no such backfill.
///
/// Three ordered range scans whatever the size, merged here: the backfill's runs in
/// `(interval_start, id)` index order, their tries in `run_id` index order, and the plan by
/// primary key. No per-row lookups and no sorts.
pub(crate) fn show(conn: &Conn, id: i64) -> Result<Option<BackfillDetail>> {
    show_part(conn, id, None)
}

/// A backfill with the intervals of one page of its plan in time order (`limit` from the
/// `offset`-th), and the counts of all of them: the same range scans, bounded by the page's
/// span, so that a page costs what it shows, not what the backfill holds.
pub(crate) fn show_page(
    conn: &Conn,
    id: i64,
    offset: i64,
    limit: i64,
) -> Result<Option<BackfillDetail>> {
    show_part(conn, id, Some((offset, limit)))
}

fn show_part(conn: &Conn, id: i64, page: Option<(i64, i64)>) -> Result<Option<BackfillDetail>> {
    let Some(b) = backfills::get(conn, id)? else {
        return Ok(None);
    };
    // The plan's rows first: their span bounds the runs read next.
    let plan = plan_rows(conn, id, page, b.run_backwards)?;
    let starts = plan.iter().map(|p| p.1);
    // No plan row (a page past the end): no run either.
    let (lo, hi) = starts.clone().min().zip(starts.max()).unwrap_or((1, 0));
    let latest = latest_runs(conn, id, lo, hi)?;
    let mut run_ids: Vec<i64> = latest.iter().map(|r| r.run_id).collect();
    run_ids.sort_unstable();
    let tries = try_aggs(conn, &run_ids)?;
    let mut out = interval_details(plan, &latest, &tries);
    add_readiness(conn, id, (lo, hi), b.state, &mut out)?;
    let counts = if page.is_some() {
        counts(conn, Some(id))?.remove(&id).unwrap_or_default()
    } else {
        // The counts come from what was just read, not from another pass over the runs.
        counts_of(&out, &latest)
    };
    Ok(Some(BackfillDetail {
        backfill: summary(b, counts),
        interval_details: out,
        cascade_backfills: None,
        workers: worker_summaries(conn, id)?,
    }))
}

/// A plan row: order, interval start and end, action and reason.
type PlanRead = (i64, i64, i64, PlanAction, Option<String>);

/// The plan rows of backfill `id`, or of a page of it (`(offset, limit)`). The plan's order is
/// the run order: by start, or backwards by start. A page is in time order, and holds the plan
/// rows whose starts lie in its span.
fn plan_rows(
    conn: &Conn,
    id: i64,
    page: Option<(i64, i64)>,
    run_backwards: bool,
) -> Result<Vec<PlanRead>> {
    let (plan_sql, limit, offset) = match page {
        None => ("ORDER BY ord LIMIT $2 OFFSET $3", i64::MAX, 0),
        Some((offset, limit)) if run_backwards => {
            ("ORDER BY ord DESC LIMIT $2 OFFSET $3", limit, offset)
        }
        Some((offset, limit)) => ("ORDER BY ord LIMIT $2 OFFSET $3", limit, offset),
    };
    Ok(conn
        .prepare(&format!(
            "SELECT ord, interval_start, interval_end, action, reason FROM plan
             WHERE backfill_id = $1 {plan_sql}"
        ))?
        .query_map(params![id, limit, offset], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<super::db::Result<_>>()?)
}

/// The latest run of each interval of backfill `id` whose start is in `[lo, hi]`, with how many
/// runs it had, by start: one ordered range scan.
fn latest_runs(conn: &Conn, id: i64, lo: i64, hi: i64) -> Result<Vec<LatestRun>> {
    let mut latest: Vec<LatestRun> = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT interval_start, id, state, started_at, ended_at, error FROM runs
         WHERE backfill_id = $1 AND interval_start BETWEEN $2 AND $3 ORDER BY interval_start, id",
    )?;
    let mut rows = stmt.query(params![id, lo, hi])?;
    while let Some(r) = rows.next()? {
        let interval_start: i64 = r.get(0)?;
        let run = LatestRun {
            interval_start,
            run_id: r.get(1)?,
            state: r.get(2)?,
            started: r.get(3)?,
            ended: r.get(4)?,
            error: r.get(5)?,
            attempts: 1,
        };
        match latest.last_mut() {
            Some(prev) if prev.interval_start == interval_start => {
                *prev = LatestRun {
                    attempts: prev.attempts + 1,
                    ..run
                };
            }
            _ => latest.push(run),
        }
    }
    Ok(latest)
}

/// Adds a try's `n` rows to a run's: to those it published when it succeeded, to those it
/// computed and did not publish when it was rejected.
fn add_rows(state: TryState, n: i64, rows: &mut Option<i64>, rejected: &mut Option<i64>) {
    let to = match state {
        TryState::Succeeded => rows,
        TryState::Rejected => rejected,
        _ => return,
    };
    *to = Some(to.unwrap_or(0) + n);
}

/// Whether a try in `state` with `verdict` and `reasons` published with the gate's warnings.
fn published_warned(state: TryState, verdict: Option<Verdict>, reasons: Option<String>) -> bool {
    state == TryState::Succeeded
        && verdict != Some(Verdict::Staged)
        && reasons.is_some_and(|r| crate::gate::has_warnings(&r))
}

/// The tries of each run of `run_ids` (sorted), aggregated, by run: one ordered range scan.
fn try_aggs(conn: &Conn, run_ids: &[i64]) -> Result<Vec<TryAgg>> {
    let mut tries: Vec<TryAgg> = Vec::with_capacity(run_ids.len());
    let (Some(lo), Some(hi)) = (run_ids.first(), run_ids.last()) else {
        return Ok(tries);
    };
    let mut stmt = conn.prepare(
        "SELECT run_id, state, rows, verdict, reasons, log_path, error, id, waiting_for, staged,
                host, batch, rows_inserted, rows_updated, rows_deleted, rows_unchanged
         FROM task_tries WHERE run_id BETWEEN $1 AND $2 ORDER BY run_id",
    )?;
    let mut rows = stmt.query([lo, hi])?;
    while let Some(r) = rows.next()? {
        let run_id: i64 = r.get(0)?;
        if run_ids.binary_search(&run_id).is_err() {
            continue;
        }
        if tries.last().is_none_or(|t| t.run_id != run_id) {
            tries.push(TryAgg {
                run_id,
                ..TryAgg::default()
            });
        }
        if let Some(agg) = tries.last_mut() {
            agg.add(&r)?;
        }
    }
    Ok(tries)
}

impl TryAgg {
    /// Adds one try of the run, read as [`try_aggs`] selects it.
    fn add(&mut self, r: &super::db::Row<'_>) -> super::db::Result<()> {
        self.tries += 1;
        let state: TryState = r.get(1)?;
        let succeeded = state == TryState::Succeeded;
        if state == TryState::Running
            && let Some(pool) = r.get::<_, Option<String>>(8)?
        {
            self.waiting_for = Some(pool);
        }
        if let Some(n) = r.get::<_, Option<i64>>(2)? {
            add_rows(state, n, &mut self.rows, &mut self.rejected_rows);
        }
        self.warned |= published_warned(state, r.get(3)?, r.get(4)?);
        if succeeded {
            Changes::add(&mut self.changes, r, 12)?;
        }
        // The index yields a run's tries by task, not in the order they ran.
        let try_id: i64 = r.get(7)?;
        if try_id > self.verdict_try
            && let Some(v) = r.get::<_, Option<Verdict>>(3)?
        {
            self.verdict = Some(shown_verdict(v, r.get(9)?));
            self.reasons = r.get(4)?;
            self.verdict_try = try_id;
        }
        if try_id > self.host_try {
            self.host = r.get(10)?;
            self.host_try = try_id;
        }
        if self.batch.is_none() {
            self.batch = r.get(11)?;
        }
        if !succeeded && try_id > self.error_try {
            self.log = r.get(5)?;
            self.error = r.get(6)?;
            self.error_try = try_id;
        }
        Ok(())
    }
}

/// Adds what the backfill's readiness checks answered to its intervals (by start, within
/// `span`): an interval with no run whose sources are awaited shows as waiting while the
/// backfill runs, and one skipped as `not ready` says what the check answered.
fn add_readiness(
    conn: &Conn,
    id: i64,
    (lo, hi): (i64, i64),
    state: BackfillState,
    out: &mut [IntervalDetail],
) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT interval_start, task_id, state, asks, answer, first_asked_at, last_asked_at, deadline
         FROM readiness WHERE backfill_id = $1 AND interval_start BETWEEN $2 AND $3
         ORDER BY interval_start, first_asked_at",
    )?;
    let mut rows = stmt.query(rusqlite::params![id, lo, hi])?;
    let now = crate::clock::now_ms();
    // The plan's order may run backwards.
    let at: HashMap<i64, usize> = out
        .iter()
        .enumerate()
        .map(|(i, d)| (d.start.0.timestamp(), i))
        .collect();
    while let Some(r) = rows.next()? {
        let start: i64 = r.get(0)?;
        let Some(&i) = at.get(&start) else {
            continue;
        };
        let d = &mut out[i];
        let ready_state: crate::state::ReadyState = r.get(2)?;
        let (first, last, deadline): (i64, i64, i64) = (r.get(5)?, r.get(6)?, r.get(7)?);
        // Past its deadline (and a minute for the last ask), a wait no process records any
        // more: its process is gone, until the backfill is resumed.
        let waiting = ready_state == crate::state::ReadyState::Waiting
            && state == BackfillState::Running
            && d.state.is_none()
            && now <= deadline + 60_000;
        let detail = ReadyDetail {
            task: r.get(1)?,
            state: ready_state,
            asks: r.get(3)?,
            answer: r.get(4)?,
            waited_ms: last - first,
            left_ms: waiting.then(|| (deadline - now).max(0)),
        };
        if let Some(left) = detail.left_ms {
            d.state = Some(IntervalState::WaitingForSources(left));
        }
        if ready_state == crate::state::ReadyState::NotReady {
            d.error = Some(detail.said());
        }
        d.ready.push(detail);
    }
    Ok(())
}

/// Each plan row with its interval's latest run and that run's tries: merged in memory, by
/// binary search, without per-row lookups.
fn interval_details(
    plan: Vec<PlanRead>,
    latest: &[LatestRun],
    tries: &[TryAgg],
) -> Vec<IntervalDetail> {
    let mut out = Vec::with_capacity(plan.len());
    for (ord, start, end, action, reason) in plan {
        let run = latest
            .binary_search_by_key(&start, |l| l.interval_start)
            .ok()
            .map(|i| &latest[i]);
        let t = run.and_then(|run| {
            tries
                .binary_search_by_key(&run.run_id, |t| t.run_id)
                .ok()
                .map(|i| &tries[i])
        });
        out.push(IntervalDetail {
            ord,
            start: Rfc3339(from_unix(start)),
            end: Rfc3339(from_unix(end)),
            action,
            reason,
            state: run.map(|x| match t.and_then(|t| t.waiting_for.as_ref()) {
                Some(pool) if x.state == RunState::Running => {
                    IntervalState::WaitingForPool(pool.clone())
                }
                _ => IntervalState::Run(x.state),
            }),
            attempts: run.map_or(0, |x| x.attempts),
            tries: t.map_or(0, |t| t.tries),
            rows: t.and_then(|t| t.rows),
            rejected_rows: t.and_then(|t| t.rejected_rows),
            warned: t.is_some_and(|t| t.warned),
            changes: t.and_then(|t| t.changes),
            verdict: t.and_then(|t| t.verdict),
            reasons: t.and_then(|t| t.reasons.clone()),
            duration_ms: run.and_then(|x| x.ended.map(|e| e - x.started)),
            error: run
                .and_then(|x| x.error.clone())
                .or_else(|| t.and_then(|t| t.error.clone())),
            log: t.and_then(|t| existing(t.log.clone())),
            host: t.and_then(|t| t.host.clone()),
            batch: t.and_then(|t| t.batch.clone()),
            ready: Vec::new(),
        });
    }
    out
}

/// The counts of a whole backfill, from its intervals and their latest runs as just read.
fn counts_of(out: &[IntervalDetail], latest: &[LatestRun]) -> Counts {
    let mut counts = Counts::default();
    for i in out {
        counts.total += 1;
        if i.action == PlanAction::Run {
            counts.planned += 1;
        } else {
            counts.skipped += 1;
        }
    }
    for run in latest {
        counts.add_state(run.state, 1);
    }
    let starts = out.iter().map(|i| i.start.0.timestamp());
    counts.span = starts.clone().min().zip(starts.max());
    counts.finish();
    counts
}

/// The workers of backfill `id`, each with how many intervals it started.
fn worker_summaries(conn: &Conn, id: i64) -> Result<Vec<WorkerSummary>> {
    let mut ran = HashMap::new();
    let mut stmt = conn.prepare_cached(
        "SELECT worker, COUNT(*) FROM runs WHERE backfill_id = $1 AND worker IS NOT NULL
         GROUP BY worker",
    )?;
    let mut rows = stmt.query([id])?;
    while let Some(r) = rows.next()? {
        ran.insert(r.get::<_, i64>(0)?, r.get::<_, i64>(1)?);
    }
    Ok(super::workers::of(conn, id)?
        .iter()
        .map(|w| WorkerSummary::of(w, false, ran.get(&w.id).copied().unwrap_or(0)))
        .collect())
}

pub(crate) fn list_one(conn: &Conn, id: i64) -> Result<Option<BackfillSummary>> {
    let Some(b) = backfills::get(conn, id)? else {
        return Ok(None);
    };
    let c = counts(conn, Some(id))?.remove(&id).unwrap_or_default();
    Ok(Some(summary(b, c)))
}

/// Interval counts of one backfill, or of all: the plan's actions, and the state of the latest
/// run of each interval.
fn counts(conn: &Conn, id: Option<i64>) -> Result<HashMap<i64, Counts>> {
    // A literal filter rather than `$1 IS NULL OR ...`, so that one backfill's counts use the
    // primary key and index.
    let only = |column: &str| id.map_or(String::new(), |id| format!("WHERE {column} = {id}"));
    let mut counts: HashMap<i64, Counts> = HashMap::new();
    let mut stmt = conn.prepare(&format!(
        "SELECT backfill_id, action, COUNT(*), MIN(interval_start), MAX(interval_start) FROM plan {}
         GROUP BY backfill_id, action",
        only("backfill_id")
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let c = counts.entry(r.get(0)?).or_default();
        let n: i64 = r.get(2)?;
        let (lo, hi): (i64, i64) = (r.get(3)?, r.get(4)?);
        c.span = Some(c.span.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
        c.total += n;
        if r.get::<_, PlanAction>(1)? == PlanAction::Run {
            c.planned += n;
        } else {
            c.skipped += n;
        }
    }
    let mut stmt = conn.prepare(&format!(
        "SELECT r.backfill_id, r.state, COUNT(*) FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs {} GROUP BY backfill_id, interval_start) m
           ON m.id = r.id
         GROUP BY r.backfill_id, r.state",
        only("backfill_id")
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let state: RunState = r.get(1)?;
        counts
            .entry(r.get(0)?)
            .or_default()
            .add_state(state, r.get(2)?);
    }
    for c in counts.values_mut() {
        c.finish();
    }
    Ok(counts)
}

/// One run in the history of a DAG.
#[derive(Debug, Clone, Serialize)]
pub struct RunHistory {
    pub run_id: i64,
    pub backfill_id: i64,
    pub start: Rfc3339,
    pub end: Rfc3339,
    pub state: RunState,
    pub started_at: String,
    pub duration_ms: Option<i64>,
    pub tries: i64,
    pub rows: Option<i64>,
    /// Rows the run's rejected tries computed (published nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_rows: Option<i64>,
    /// Whether a try of the run published with the gate's warnings.
    #[serde(skip)]
    pub warned: bool,
    /// What the run's merges did (`write = "merge"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// The gate verdict of the run's last gated try, and its reasons.
    pub verdict: Option<ShownVerdict>,
    pub reasons: Option<String>,
    pub error: Option<String>,
}

/// Every run of a DAG whose interval starts in `[lo, hi]`, by interval then attempt: the runs
/// in index order and their tries in `run_id` order, merged here.
pub(crate) fn runs(conn: &Conn, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<RunHistory>> {
    let mut stmt = conn.prepare(
        "SELECT id, backfill_id, interval_start, interval_end, state, started_at, ended_at, error
         FROM runs WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
         ORDER BY interval_start, id",
    )?;
    let mut out: Vec<RunHistory> = stmt
        .query_map(params![dag_id, lo, hi], |r| {
            let started: i64 = r.get(5)?;
            let ended: Option<i64> = r.get(6)?;
            Ok(RunHistory {
                run_id: r.get(0)?,
                backfill_id: r.get(1)?,
                start: Rfc3339(from_unix(r.get(2)?)),
                end: Rfc3339(from_unix(r.get(3)?)),
                state: r.get(4)?,
                started_at: ms_to_rfc3339(started),
                duration_ms: ended.map(|e| e - started),
                error: r.get(7)?,
                tries: 0,
                rows: None,
                rejected_rows: None,
                warned: false,
                changes: None,
                verdict: None,
                reasons: None,
            })
        })?
        .collect::<super::db::Result<_>>()?;
    let mut by_id: Vec<(i64, usize)> = out.iter().enumerate().map(|(i, r)| (r.run_id, i)).collect();
    by_id.sort_unstable();
    if let (Some(first), Some(last)) = (by_id.first(), by_id.last()) {
        let mut stmt = conn.prepare(
            "SELECT run_id, state, rows, verdict, reasons, id, staged, rows_inserted, rows_updated,
                    rows_deleted, rows_unchanged FROM task_tries
             WHERE run_id BETWEEN $1 AND $2 ORDER BY run_id",
        )?;
        // The index yields a run's tries by task, not in the order they ran: the verdict of
        // the latest gated try wins.
        let mut verdict_try = vec![0i64; out.len()];
        let mut rows = stmt.query([first.0, last.0])?;
        while let Some(r) = rows.next()? {
            let run_id: i64 = r.get(0)?;
            let Ok(i) = by_id.binary_search_by_key(&run_id, |x| x.0) else {
                continue;
            };
            let at = by_id[i].1;
            let run = &mut out[at];
            run.tries += 1;
            let state = r.get::<_, TryState>(1)?;
            if let Some(n) = r.get::<_, Option<i64>>(2)? {
                add_rows(state, n, &mut run.rows, &mut run.rejected_rows);
            }
            run.warned |= published_warned(state, r.get(3)?, r.get(4)?);
            if state == TryState::Succeeded {
                Changes::add(&mut run.changes, &r, 7)?;
            }
            let try_id: i64 = r.get(5)?;
            if try_id > verdict_try[at]
                && let Some(v) = r.get::<_, Option<Verdict>>(3)?
            {
                run.verdict = Some(shown_verdict(v, r.get(6)?));
                run.reasons = r.get(4)?;
                verdict_try[at] = try_id;
            }
        }
    }
    Ok(out)
}

/// What the succeeded tries of each interval's latest run recorded about the source, for the
/// intervals of a DAG starting in `[lo, hi]` whose latest run succeeded.
/// How many intervals of a DAG between two starts (unix seconds, both included) have a latest
/// run that did not succeed, by its state: what `stale` leaves out.
pub(crate) fn unsettled(conn: &Conn, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT r.state, COUNT(*)
         FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs
               WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
                 AND backfill_id NOT IN {}
               GROUP BY interval_start) m ON r.id = m.id
         WHERE r.state <> 'succeeded'
         GROUP BY r.state ORDER BY r.state",
        crate::manifest::NOT_COMPUTING
    ))?;
    let rows = stmt.query_map(params![dag_id, lo, hi], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}

pub(crate) fn recorded_sources(conn: &Conn, dag_id: &str, lo: i64, hi: i64) -> Result<Recorded> {
    let mut stmt = conn.prepare(&format!(
        "SELECT r.interval_start, r.interval_end, t.task_id, t.source_rows, t.source_fingerprint
         FROM runs r
         JOIN (SELECT MAX(id) AS id FROM runs
               WHERE dag_id = $1 AND interval_start BETWEEN $2 AND $3
                 AND backfill_id NOT IN {}
               GROUP BY interval_start) m ON r.id = m.id
         LEFT JOIN task_tries t ON t.run_id = r.id AND t.state = 'succeeded'
         WHERE r.state = 'succeeded'
         ORDER BY r.interval_start, t.id",
        crate::manifest::NOT_COMPUTING
    ))?;
    let mut rows = stmt.query(params![dag_id, lo, hi])?;
    let mut out = Recorded::new();
    while let Some(r) = rows.next()? {
        let (start, end): (i64, i64) = (r.get(0)?, r.get(1)?);
        let entry = out
            .entry(start)
            .or_insert_with(|| (DataInterval::from_unix(start, end), HashMap::new()));
        if let Some(task) = r.get::<_, Option<String>>(2)? {
            entry.1.insert(
                task,
                Seen {
                    source_rows: r.get(3)?,
                    source_fingerprint: r.get(4)?,
                },
            );
        }
    }
    Ok(out)
}

/// How long (ms) the latest `limit` successful tries of a task took, newest first.
pub(crate) fn recent_durations_ms(
    conn: &Conn,
    dag_id: &str,
    task_id: &str,
    limit: i64,
) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT t.ended_at - t.started_at FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE r.dag_id = $1 AND t.task_id = $2 AND t.state = 'succeeded' AND t.ended_at IS NOT NULL
         ORDER BY t.id DESC LIMIT $3",
    )?;
    let rows = stmt.query_map(rusqlite::params![dag_id, task_id, limit], |r| r.get(0))?;
    Ok(rows.collect::<super::db::Result<_>>()?)
}
