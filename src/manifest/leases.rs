//! Leases: who may run an interval.
//!
//! A lease names its owner backfill; the owner row carries pid, process start, host, heartbeat
//! and epoch. An owner is alive while it is `running`, has sent a heartbeat within the lease
//! timeout, and — when it runs on this host — its process exists; an owner on another host
//! (another machine, or a container with a host name and process ids of its own) is judged by
//! its lease alone. An owner of this host whose very process (its pid and start) runs, not
//! stopped, is alive whatever its heartbeat's age: this host's wall clock may have jumped, its
//! process did not die (a stopped one is judged by its heartbeat, so that a frozen owner is
//! taken over once its lease expired). A lease whose owner is not alive is stale:
//! its owner must be recovered (claimed with a new epoch, its processes killed, its runs
//! recorded; see `recovery`) before anyone else takes the lease. So a lease is only ever
//! replaced when its owner is no longer `running` and its run is finished.

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::params;
use rusqlite::types::Value;

use super::db::Optional;

use super::db::Conn;

use super::Result;
use crate::interval::DataInterval;
use crate::liveness::{Group, Host};
use crate::state::BackfillState;

use crate::clock::now_ms;

/// How a backfill's leases stand, as the status page shows them (see [`LeaseCtx::health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LeaseHealth {
    /// The backfill is not running.
    Ended,
    /// No heartbeat within the lease timeout: another process may take its intervals over.
    Expired,
    /// Its process, on this host, has ended; its heartbeat has not expired yet.
    Gone,
    /// Alive, its heartbeat older than half the lease timeout.
    Expiring,
    /// Alive, its heartbeat recent.
    Fresh,
}

/// Everything needed to judge liveness and to stamp new leases.
#[derive(Debug, Clone)]
pub struct LeaseCtx {
    pub now_ms: i64,
    pub host: String,
    pub pid: i64,
    /// When this process started (clock ticks since boot), recorded with its pid.
    pub start: Option<i64>,
    pub timeout_ms: i64,
    /// A heartbeat this process watched stay as it was for a whole lease timeout, on its own
    /// monotonic clock: stale, whatever its time says (a clock set back makes a heartbeat look
    /// newer than it is).
    pub silent: Option<i64>,
    /// What is alive on this host.
    pub here: &'static dyn Host,
}

impl LeaseCtx {
    pub fn new(timeout: Duration, here: &'static dyn Host) -> Self {
        let pid = i64::from(std::process::id());
        Self {
            now_ms: now_ms(),
            host: here.name(),
            pid,
            start: here.start_of(pid),
            timeout_ms: i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
            silent: None,
            here,
        }
    }

    /// This context at the manifest's clock (see [`super::Reads::clock_ms`]).
    pub(crate) fn at_manifest(mut self, store: &dyn super::Reads) -> Result<Self> {
        self.now_ms = store.clock_ms(self.now_ms)?;
        Ok(self)
    }

    /// The same context at the current time.
    pub fn refreshed(&self) -> Self {
        Self {
            now_ms: now_ms(),
            ..self.clone()
        }
    }

    /// Whether a backfill with this owner information (its process's pid and start, its host,
    /// its last heartbeat) is alive.
    pub(crate) fn owner_alive(
        &self,
        state: BackfillState,
        (pid, start): (Option<i64>, Option<i64>),
        host: Option<&str>,
        heartbeat_ms: Option<i64>,
    ) -> bool {
        if state != BackfillState::Running {
            return false;
        }
        let fresh = self.fresh(heartbeat_ms);
        // Its pid is looked at only when it was recorded in this very PID namespace: an owner
        // recorded by its host name alone (an earlier version) may have run in a container
        // that shares the name, so it is judged by its lease alone.
        if host != Some(self.host.as_str()) {
            return fresh;
        }
        let Some(pid) = pid.filter(|&p| self.here.pid_alive(p)) else {
            return false;
        };
        // The very process that recorded itself (not a later one given its pid), running: alive,
        // whatever this host's wall clock says of its heartbeat.
        fresh
            || start.is_some_and(|s| self.here.start_of(pid) == Some(s) && !self.here.stopped(pid))
    }

    /// How a backfill's leases stand (see [`LeaseHealth`]), judged as its owner is judged
    /// ([`LeaseCtx::owner_alive`]): from its state, its owner's process (pid and start) and
    /// host, and its last heartbeat.
    pub(crate) fn health(
        &self,
        state: BackfillState,
        owner: (Option<i64>, Option<i64>),
        host: Option<&str>,
        heartbeat_ms: Option<i64>,
    ) -> LeaseHealth {
        if state != BackfillState::Running {
            return LeaseHealth::Ended;
        }
        if !self.owner_alive(state, owner, host, heartbeat_ms) {
            return if self.fresh(heartbeat_ms) {
                LeaseHealth::Gone
            } else {
                LeaseHealth::Expired
            };
        }
        match heartbeat_ms {
            Some(h) if self.heartbeat_age_ms(h) > self.timeout_ms / 2 => LeaseHealth::Expiring,
            _ => LeaseHealth::Fresh,
        }
    }

    /// How old a heartbeat is at this context's "now" (milliseconds): what [`LeaseCtx::fresh`]
    /// and [`LeaseCtx::health`] judge, and what a page shows. A heartbeat from this clock's
    /// future (another host's clock ahead of it, on SQLite) is 0 ms old.
    pub(crate) fn heartbeat_age_ms(&self, heartbeat_ms: i64) -> i64 {
        self.now_ms.saturating_sub(heartbeat_ms).max(0)
    }

    /// Whether a heartbeat is within the lease timeout of this context's "now" (and not one
    /// watched stay silent, see [`LeaseCtx::silent`]).
    pub(crate) fn fresh(&self, heartbeat_ms: Option<i64>) -> bool {
        heartbeat_ms.is_some_and(|hb| {
            Some(hb) != self.silent && self.heartbeat_age_ms(hb) < self.timeout_ms
        })
    }

    /// This context, with `heartbeat` watched silent for a lease timeout (see
    /// [`LeaseCtx::silent`]).
    pub fn with_silent(&self, heartbeat: Option<i64>) -> Self {
        Self {
            silent: heartbeat,
            ..self.clone()
        }
    }

    pub(crate) fn is_here(&self, host: Option<&str>) -> bool {
        host.is_some_and(|h| crate::liveness::same_host(h, &self.host))
    }

    /// Whether a try's recorded process group may still be running once its owner is gone:
    /// when it is on this host, while a member is alive. A try on another host cannot be
    /// looked at from here; it is judged by its owner's lease, as its owner is: once that has
    /// expired the try counts as stopped, because an owner that could not renew its lease stops
    /// its tries itself (see `session::execute::keep_alive`), and one that comes back after a
    /// freeze finds itself fenced at its next heartbeat and stops them then, publishing nothing.
    pub(crate) fn group_may_run(&self, host: Option<&str>, group: Group) -> bool {
        self.is_here(host) && self.here.group_alive(group)
    }
}

/// How strictly [`held`] judges a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judge {
    /// For taking leases: a lease is held while its owner is `running` (even silent: a silent
    /// owner is freed only by being claimed and recovered, never by being overwritten) or while
    /// its run is unfinished (a claim whose recovery is not recorded yet, or a try that could
    /// not be stopped).
    Strict,
    /// For a dry run's prediction: a lease is held while its owner is alive, or its run's try
    /// may still be running; a gone owner would be recovered first.
    Predict,
}

/// Interval starts of `dag_id` in `[lo, hi]` whose lease is held, as `judge` says.
pub(crate) fn held(
    conn: &Conn,
    dag_id: &str,
    lo: i64,
    hi: i64,
    ctx: &LeaseCtx,
    judge: Judge,
) -> Result<HashSet<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.interval_start, b.state, b.owner_pid, b.owner_host, b.heartbeat_at,
                r.state, t.pgid, t.pgid_start, t.host, b.owner_start
         FROM leases l JOIN backfills b ON b.id = l.backfill_id
         LEFT JOIN runs r ON r.id = l.run_id
         LEFT JOIN task_tries t ON t.run_id = l.run_id AND t.state = 'running' AND t.pgid IS NOT NULL
         WHERE l.dag_id = $1 AND l.interval_start BETWEEN $2 AND $3",
    )?;
    let mut rows = stmt.query(params![dag_id, lo, hi])?;
    let mut held = HashSet::new();
    while let Some(r) = rows.next()? {
        let state: BackfillState = r.get(1)?;
        let run: Option<crate::state::RunState> = r.get(5)?;
        let unfinished_run = run.is_some_and(|s| !s.is_finished());
        let yes = match judge {
            Judge::Strict => state == BackfillState::Running || unfinished_run,
            Judge::Predict => {
                let host: Option<String> = r.get(3)?;
                let try_host: Option<String> = r.get(8)?;
                let group = r.get::<_, Option<i64>>(6)?.map(|pgid| Group {
                    pgid,
                    leader_start: r.get(7).ok().flatten(),
                });
                ctx.owner_alive(state, (r.get(2)?, r.get(9)?), host.as_deref(), r.get(4)?)
                    || group.is_some_and(|g| ctx.group_may_run(try_host.as_deref(), g))
            }
        };
        if yes {
            held.insert(r.get(0)?);
        }
    }
    Ok(held)
}

/// The leases of `dag_id` whose owner is gone: `(interval_start, owner backfill)`. Their owners
/// are to be recovered (a lease whose run's try is still running after that stays live, see
/// [`live`]).
pub(crate) fn stale(conn: &Conn, dag_id: &str, ctx: &LeaseCtx) -> Result<Vec<(i64, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.interval_start, l.backfill_id, b.state, b.owner_pid, b.owner_host, b.heartbeat_at,
                b.owner_start
         FROM leases l JOIN backfills b ON b.id = l.backfill_id WHERE l.dag_id = $1",
    )?;
    let mut rows = stmt.query([dag_id])?;
    let mut stale = Vec::new();
    while let Some(r) = rows.next()? {
        let host: Option<String> = r.get(4)?;
        if !ctx.owner_alive(
            r.get(2)?,
            (r.get(3)?, r.get(6)?),
            host.as_deref(),
            r.get(5)?,
        ) {
            stale.push((r.get(0)?, r.get(1)?));
        }
    }
    Ok(stale)
}

/// Leases `intervals` for `backfill_id`. The caller has checked (in this transaction, with
/// [`Judge::Strict`]) that no other backfill holds them; a lease of a finished or recovered
/// backfill is replaced.
pub(crate) fn take(
    conn: &Conn,
    backfill_id: i64,
    dag_id: &str,
    intervals: impl Iterator<Item = DataInterval>,
    ctx: &LeaseCtx,
) -> Result<()> {
    const UPSERT: &str =
        "ON CONFLICT (dag_id, interval_start) DO UPDATE SET backfill_id = excluded.backfill_id,
            run_id = NULL, batch_holder = NULL, pid = excluded.pid, host = excluded.host,
            heartbeat_at = excluded.heartbeat_at";
    let Some(pg) = conn.postgres() else {
        // One prepared row at a time, with no copy of the values.
        let mut stmt = conn.prepare_cached(&format!(
            "INSERT INTO leases (dag_id, interval_start, backfill_id, pid, host, heartbeat_at)
             VALUES ($1, $2, $3, $4, $5, $6) {UPSERT}"
        ))?;
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
        return Ok(());
    };
    let mut values = Vec::new();
    for i in intervals {
        values.extend([
            Value::Text(dag_id.to_string()),
            Value::Integer(i.start.timestamp()),
            Value::Integer(backfill_id),
            Value::Integer(ctx.pid),
            Value::Text(ctx.host.clone()),
            Value::Integer(ctx.now_ms),
        ]);
    }
    pg.insert_many(
        "INSERT INTO leases (dag_id, interval_start, backfill_id, pid, host, heartbeat_at)",
        UPSERT,
        6,
        &values,
    )?;
    Ok(())
}

/// Whether `backfill_id` still holds the lease of an interval.
pub(crate) fn holds(
    conn: &Conn,
    backfill_id: i64,
    dag_id: &str,
    interval_start: i64,
) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM leases WHERE dag_id = $1 AND interval_start = $2 AND backfill_id = $3",
        )?
        .query_row(params![dag_id, interval_start, backfill_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Releases one lease if `backfill_id` holds it.
pub(crate) fn release(
    conn: &Conn,
    backfill_id: i64,
    dag_id: &str,
    interval_start: i64,
) -> Result<()> {
    conn.prepare_cached(
        "DELETE FROM leases WHERE dag_id = $1 AND interval_start = $2 AND backfill_id = $3",
    )?
    .execute(params![dag_id, interval_start, backfill_id])?;
    Ok(())
}

/// What a batch of one process of a backfill holds of the intervals it was formed of (see
/// [`reserve_batch`]), by start.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Now held by this process's batch, in the order given.
    pub held: Vec<i64>,
    /// Held by the batch of another live process of the backfill: not this process's to run.
    pub others: Vec<i64>,
    /// Not held by another, but after one that is or beyond what was wanted: left for a later
    /// batch.
    pub left: Vec<i64>,
}

/// Makes the batch of process `holder` of backfill `backfill_id` (0 its owner, else the id of
/// one of its workers) hold up to `want` of intervals `starts` of `dag_id` (consecutive, in the
/// order they run): those that the batch of no other live process of the backfill holds, from
/// the first such, up to the first that another holds after it. An interval is held by its
/// lease's `batch_holder`: 0 the owner, while it is alive as `ctx` judges a lease's owner
/// ([`LeaseCtx::owner_alive`]); else a worker's id, while that worker of the backfill is `running` (once it ended or
/// was recovered, its batches hold nothing). So that the processes of a backfill (`backfill
/// join`) do not compute the same interval's rows twice, each forms its batches of the
/// intervals this returns as held; which of them runs an interval is still decided by the
/// commit that starts its run.
pub(crate) fn reserve_batch(
    conn: &Conn,
    (backfill_id, holder): (i64, i64),
    dag_id: &str,
    starts: &[i64],
    want: usize,
    ctx: &LeaseCtx,
) -> Result<Reserved> {
    let (Some(&lo), Some(&hi)) = (starts.iter().min(), starts.iter().max()) else {
        return Ok(Reserved::default());
    };
    // The holds of this backfill's other processes: its workers' while they run, its owner's
    // while it is alive (judged as any lease's owner is).
    let mut holds: Vec<(i64, i64)> = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT l.interval_start, l.batch_holder FROM leases l
             WHERE l.backfill_id = $1 AND l.dag_id = $2
               AND l.interval_start >= $3 AND l.interval_start <= $4
               AND l.batch_holder IS NOT NULL AND l.batch_holder <> $5
               AND (l.batch_holder = 0 OR EXISTS (
                   SELECT 1 FROM workers w WHERE w.id = l.batch_holder
                     AND w.backfill_id = $1 AND w.state = 'running'))",
        )?;
        let mut rows = stmt.query(params![backfill_id, dag_id, lo, hi, holder])?;
        while let Some(r) = rows.next()? {
            holds.push((r.get(0)?, r.get(1)?));
        }
    }
    let owner_alive = if holds.iter().any(|&(_, by)| by == 0) {
        conn.prepare_cached(
            "SELECT state, owner_pid, owner_host, heartbeat_at, owner_start FROM backfills
             WHERE id = $1",
        )?
        .query_row([backfill_id], |r| {
            let host: Option<String> = r.get(2)?;
            Ok(ctx.owner_alive(
                r.get(0)?,
                (r.get(1)?, r.get(4)?),
                host.as_deref(),
                r.get(3)?,
            ))
        })
        .optional()?
        .unwrap_or(false)
    } else {
        false
    };
    let others: HashSet<i64> = holds
        .into_iter()
        .filter(|&(_, by)| by != 0 || owner_alive)
        .map(|(start, _)| start)
        .collect();
    let mut out = Reserved::default();
    // Taking until one that another holds comes after one taken: what is held is consecutive,
    // so that its span names it.
    let mut taking = true;
    for &start in starts {
        if others.contains(&start) {
            out.others.push(start);
            taking &= out.held.is_empty();
        } else if taking && out.held.len() < want {
            out.held.push(start);
        } else {
            out.left.push(start);
        }
    }
    if let (Some(&a), Some(&b)) = (out.held.iter().min(), out.held.iter().max()) {
        conn.prepare_cached(
            "UPDATE leases SET batch_holder = $1
             WHERE backfill_id = $2 AND dag_id = $3 AND interval_start >= $4 AND interval_start <= $5",
        )?
        .execute(params![holder, backfill_id, dag_id, a, b])?;
    }
    Ok(out)
}

/// Releases every lease of backfill `backfill_id` but those of its runs still queued or
/// running (tries that could not be stopped keep their intervals in flight).
pub(crate) fn release_all_but_running(conn: &Conn, backfill_id: i64) -> Result<()> {
    conn.execute(
        "DELETE FROM leases WHERE backfill_id = $1 AND (run_id IS NULL OR run_id NOT IN
           (SELECT r.id FROM runs r WHERE r.backfill_id = $1 AND r.state IN ('queued', 'running')))",
        [backfill_id],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_judged_by_the_owners_rule_at_the_contexts_clock() {
        let ctx = LeaseCtx {
            now_ms: 1_000_000,
            host: "here".into(),
            pid: 1,
            start: None,
            timeout_ms: 30_000,
            silent: None,
            here: &crate::process::LOCAL,
        };
        let health = |state: BackfillState, host: &str, pid: i64, age: Option<i64>| {
            ctx.health(
                state,
                (Some(pid), None),
                Some(host),
                age.map(|a| ctx.now_ms - a),
            )
        };
        let running = BackfillState::Running;
        let me = i64::from(std::process::id());
        for (said, health) in [
            (
                LeaseHealth::Ended,
                health(BackfillState::Completed, "here", me, Some(0)),
            ),
            (
                LeaseHealth::Fresh,
                health(running, "elsewhere", 7, Some(1_000)),
            ),
            (
                LeaseHealth::Expiring,
                health(running, "elsewhere", 7, Some(20_000)),
            ),
            (
                LeaseHealth::Expired,
                health(running, "elsewhere", 7, Some(30_000)),
            ),
            (LeaseHealth::Expired, health(running, "elsewhere", 7, None)),
            (LeaseHealth::Fresh, health(running, "here", me, Some(1_000))),
            // A process of this host that has ended: its lease is stale before it expires.
            (
                LeaseHealth::Gone,
                health(running, "here", i64::from(i32::MAX), Some(1_000)),
            ),
            (
                LeaseHealth::Expired,
                health(running, "here", i64::from(i32::MAX), Some(40_000)),
            ),
        ] {
            assert_eq!(health, said);
        }
        assert_eq!(
            serde_json::to_value(LeaseHealth::Expiring).unwrap(),
            "expiring"
        );
    }

    #[test]
    fn a_heartbeat_is_as_old_as_the_contexts_clock_says_and_never_less_than_new() {
        let ctx = LeaseCtx::new(Duration::from_secs(30), &crate::process::LOCAL);
        let now = ctx.now_ms;
        assert_eq!(ctx.heartbeat_age_ms(now - 1_500), 1_500);
        assert_eq!(ctx.heartbeat_age_ms(now + 60_000), 0);
        assert_eq!(ctx.heartbeat_age_ms(i64::MIN), i64::MAX);
    }

    /// A manifest with backfill 1 of DAG `d` (its owner's heartbeat at 100,000 ms), worker 2
    /// running and worker 3 ended, and the leases of intervals 1 to 12 (starts 1..=12).
    fn leased() -> (tempfile::TempDir, Conn) {
        let dir = tempfile::tempdir().unwrap();
        let c =
            super::super::open_sqlite(&dir.path().join("m.db"), super::super::Durability::Normal)
                .unwrap();
        c.execute_batch(
            "INSERT INTO backfills (id, dag_id, from_arg, to_arg, range_start, range_end,
                 reprocess_behavior, max_active_runs, run_backwards, state, created_at, heartbeat_at)
             VALUES (1, 'd', 'a', 'b', 1, 13, 'none', 2, 0, 'running', 0, 100000);
             INSERT INTO workers (id, backfill_id, state, max_active_runs, started_at)
             VALUES (2, 1, 'running', 2, 0), (3, 1, 'completed', 2, 0);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 12)
             INSERT INTO leases (dag_id, interval_start, backfill_id, pid, host, heartbeat_at)
             SELECT 'd', i, 1, 1, 'h', 0 FROM n;",
        )
        .unwrap();
        (dir, Conn::Sqlite(c))
    }

    fn ctx(now_ms: i64) -> LeaseCtx {
        LeaseCtx {
            now_ms,
            host: "here".into(),
            pid: 1,
            start: None,
            timeout_ms: 30_000,
            silent: None,
            here: &crate::process::LOCAL,
        }
    }

    fn holders(c: &Conn) -> Vec<Option<i64>> {
        let Conn::Sqlite(s) = c else { unreachable!() };
        let mut stmt = s
            .prepare("SELECT batch_holder FROM leases ORDER BY interval_start")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_batch_holds_what_no_live_process_of_its_backfill_holds() {
        let (_dir, c) = leased();
        let now = ctx(110_000);
        // The owner takes 1 to 4 of 1 to 8; 5 to 8 go back to its queue.
        let r = reserve_batch(&c, (1, 0), "d", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &now).unwrap();
        assert_eq!(r.held, [1, 2, 3, 4]);
        assert_eq!(r.left, [5, 6, 7, 8]);
        assert!(r.others.is_empty());
        // Worker 2 finds them held and takes the four after; worker 3 has ended, so its hold
        // on 9 counts for nothing.
        let Conn::Sqlite(s) = &c else { unreachable!() };
        s.execute(
            "UPDATE leases SET batch_holder = 3 WHERE interval_start = 9",
            [],
        )
        .unwrap();
        let r = reserve_batch(&c, (1, 2), "d", &[2, 3, 4, 5, 6, 7, 8, 9], 4, &now).unwrap();
        assert_eq!(r.others, [2, 3, 4]);
        assert_eq!(r.held, [5, 6, 7, 8]);
        assert_eq!(r.left, [9]);
        // Newest first (`--run-backwards`): the owner stops at the first interval held by
        // another after the ones it took, and what lies beyond that waits.
        let r = reserve_batch(&c, (1, 0), "d", &[12, 11, 10, 9, 8, 7], 4, &now).unwrap();
        assert_eq!(r.held, [12, 11, 10, 9]);
        assert_eq!(r.others, [8, 7]);
        assert!(r.left.is_empty());
        let r = reserve_batch(&c, (1, 2), "d", &[10, 9, 8, 7, 6, 5, 4, 3], 8, &now).unwrap();
        assert_eq!(r.others, [10, 9, 4, 3]);
        assert_eq!(r.held, [8, 7, 6, 5]);
        assert!(r.left.is_empty());
        assert_eq!(holders(&c), [0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0].map(Some));
        // What is free beyond another's hold is left, so that what a batch holds is
        // consecutive.
        s.execute(
            "UPDATE leases SET batch_holder = NULL WHERE interval_start >= 9",
            [],
        )
        .unwrap();
        let r = reserve_batch(&c, (1, 0), "d", &[3, 4, 5, 6, 7, 8, 9, 10], 8, &now).unwrap();
        assert_eq!(r.held, [3, 4]);
        assert_eq!(r.others, [5, 6, 7, 8]);
        assert_eq!(r.left, [9, 10]);
        // Once the owner's heartbeat is older than the lease timeout, its holds count for
        // nothing: the live worker takes what it held.
        let late = ctx(140_001);
        let r = reserve_batch(&c, (1, 2), "d", &[1, 2, 3, 4], 4, &late).unwrap();
        assert_eq!(r.held, [1, 2, 3, 4]);
        // A lease taken again drops its holder.
        let at = |t: i64| chrono::DateTime::from_timestamp(t, 0).unwrap();
        let five = DataInterval {
            start: at(5),
            end: at(6),
        };
        take(&c, 1, "d", std::iter::once(five), &late).unwrap();
        assert_eq!(holders(&c)[4], None);
        assert_eq!(holders(&c)[5], Some(2));
    }

    #[test]
    fn liveness_rules() {
        let ctx = LeaseCtx {
            now_ms: 100_000,
            host: "here".into(),
            pid: 1,
            start: None,
            timeout_ms: 30_000,
            silent: None,
            here: &crate::process::LOCAL,
        };
        let me = i64::from(std::process::id());
        let running = BackfillState::Running;
        assert!(ctx.owner_alive(running, (Some(me), None), Some("here"), Some(90_000)));
        // Silent for longer than the timeout.
        assert!(!ctx.owner_alive(running, (Some(me), None), Some("here"), Some(60_000)));
        // Finished owners hold nothing.
        assert!(!ctx.owner_alive(
            BackfillState::Cancelled,
            (Some(me), None),
            Some("here"),
            Some(90_000)
        ));
        // A dead pid on this host.
        assert!(!ctx.owner_alive(
            running,
            (Some(i64::from(i32::MAX)), None),
            Some("here"),
            Some(90_000)
        ));
        // Another host: only the heartbeat can tell.
        assert!(ctx.owner_alive(
            running,
            (Some(i64::from(i32::MAX)), None),
            Some("there"),
            Some(90_000)
        ));
        // This very process (its pid and start), running: alive whatever its heartbeat's age
        // says (this host's clock jumped ahead); recorded without its start, or with another
        // start (its pid given to a later process), by its heartbeat.
        let started = crate::process::start_time(me);
        assert!(started.is_some());
        assert!(ctx.owner_alive(running, (Some(me), started), Some("here"), Some(0)));
        assert!(ctx.owner_alive(running, (Some(me), started), Some("here"), None));
        assert!(!ctx.owner_alive(running, (Some(me), None), Some("here"), Some(0)));
        let other = started.map(|s| s + 1);
        assert!(!ctx.owner_alive(running, (Some(me), other), Some("here"), Some(0)));
        // Stopped (SIGSTOP, a debugger): by its heartbeat, so that a frozen owner is taken over.
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = i64::from(child.id());
        let start = crate::process::start_time(pid);
        let stop = |sig| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        };
        stop(nix::sys::signal::Signal::SIGSTOP);
        let frozen = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            crate::liveness::is_stopped(pid)
        });
        let judged_frozen = ctx.owner_alive(running, (Some(pid), start), Some("here"), Some(0));
        let judged_frozen_fresh =
            ctx.owner_alive(running, (Some(pid), start), Some("here"), Some(90_000));
        stop(nix::sys::signal::Signal::SIGCONT);
        let thawed = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            !crate::liveness::is_stopped(pid)
        });
        let judged_thawed = ctx.owner_alive(running, (Some(pid), start), Some("here"), Some(0));
        let _ = child.kill();
        let _ = child.wait();
        assert!(frozen && thawed);
        assert!(!judged_frozen);
        assert!(judged_frozen_fresh);
        assert!(judged_thawed);
        // On another host, a start means nothing here.
        assert!(!ctx.owner_alive(running, (Some(me), started), Some("there"), Some(0)));
        // A try's group here runs while a member is alive; one on another host is judged by
        // its owner's lease alone.
        let gone = Group {
            pgid: i64::from(i32::MAX),
            leader_start: None,
        };
        let mine = Group {
            pgid: i64::from(nix::unistd::getpgrp().as_raw()),
            leader_start: None,
        };
        assert!(!ctx.group_may_run(Some("here"), gone));
        assert!(ctx.group_may_run(Some("here"), mine));
        assert!(!ctx.group_may_run(Some("there"), mine));
    }
}
