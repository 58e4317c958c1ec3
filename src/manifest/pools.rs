//! Pool slots: at most a pool's size of its tasks' tries run at once, across every backfill and
//! process sharing the manifest. A slot is a row, taken in a manifest transaction, held by a
//! running try and given back when the try ends. A slot whose try's process (its backfill's
//! owner, or the worker that runs it) is gone (judged
//! as its leases are: not running, no heartbeat within the lease timeout, or a dead process on
//! this host) or whose try ended is free: the next taker removes it.

use rusqlite::params;

use super::db::Conn;

use super::Result;
use super::backfills::Fenced;
use super::leases::LeaseCtx;
use crate::state::BackfillState;

/// What asking for a slot gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    Taken,
    /// Every slot is held; the try is recorded as waiting.
    Full,
    /// A slot is free, but the pool's rate allows no start for `wait_ms` (at the manifest's
    /// clock); the try is recorded as waiting, and holds no slot.
    Rate {
        wait_ms: i64,
    },
    /// Slots are held by tries whose owner is gone but whose process groups (on this host) may
    /// still run: they must be killed before their slots are free, or the pool would run more
    /// than its size.
    Kill(Vec<crate::liveness::Group>),
}

/// How long a start of a pool with a rate is kept (milliseconds), its period if longer.
const KEEP_STARTS_MS: i64 = 3_600_000;

/// A pool's size and its rate: at most `rate.0` starts in any `rate.1` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub size: u32,
    pub rate: Option<(u32, i64)>,
}

/// Takes a slot of `pool` for try `try_id` if one is free and its rate allows a start now;
/// records that the try waits for the pool (`pool`, or `pool (rate)`) when not.
pub(crate) fn take(
    conn: &Conn,
    f: Fenced,
    pool: &str,
    limits: Limits,
    try_id: i64,
    ctx: &LeaseCtx,
) -> Result<Take> {
    let survivors = free_dead(conn, pool, ctx)?;
    let held: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM pool_slots WHERE pool = $1")?
        .query_row([pool], |r| r.get(0))?;
    let waits = |what: String| -> Result<()> {
        conn.prepare_cached(
            "UPDATE task_tries SET waiting_for = $2 WHERE id = $1
               AND (waiting_for IS NULL OR waiting_for <> $2)",
        )?
        .execute(params![try_id, what])?;
        Ok(())
    };
    if held >= i64::from(limits.size) {
        waits(pool.to_string())?;
        return Ok(if survivors.is_empty() {
            Take::Full
        } else {
            Take::Kill(survivors)
        });
    }
    if let Some((starts, per_ms)) = limits.rate {
        // Counted at the manifest's clock as the start is recorded (under the writers' lock,
        // not when the request was made or its transaction began), which every host shares
        // on PostgreSQL.
        let now = conn.clock_now_ms()?;
        // Starts are kept an hour at least, for whoever looks into how a pool was used.
        conn.prepare_cached("DELETE FROM pool_starts WHERE pool = $1 AND at <= $2")?
            .execute(params![pool, now - per_ms.max(KEEP_STARTS_MS)])?;
        let recent: i64 = conn
            .prepare_cached("SELECT COUNT(*) FROM pool_starts WHERE pool = $1 AND at > $2")?
            .query_row(params![pool, now - per_ms], |r| r.get(0))?;
        if recent >= i64::from(starts) {
            // The window has room again once its oldest starts beyond the rate leave it.
            let oldest: i64 = conn
                .prepare_cached(
                    "SELECT at FROM pool_starts WHERE pool = $1 AND at > $2
                     ORDER BY at LIMIT 1 OFFSET $3",
                )?
                .query_row(
                    params![pool, now - per_ms, recent - i64::from(starts)],
                    |r| r.get(0),
                )?;
            waits(format!("{pool} (rate)"))?;
            return Ok(Take::Rate {
                wait_ms: (oldest + per_ms - now).max(1),
            });
        }
        conn.prepare_cached("INSERT INTO pool_starts (pool, at, try_id) VALUES ($1, $2, $3)")?
            .execute(params![pool, now, try_id])?;
    }
    conn.prepare_cached(
        "INSERT INTO pool_slots (try_id, pool, backfill_id, taken_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (try_id) DO UPDATE SET pool = excluded.pool,
            backfill_id = excluded.backfill_id, taken_at = excluded.taken_at",
    )?
    .execute(params![try_id, pool, f.owner().backfill_id, ctx.now_ms])?;
    conn.prepare_cached("UPDATE task_tries SET waiting_for = NULL WHERE id = $1")?
        .execute([try_id])?;
    Ok(Take::Taken)
}

/// A slot's try: its id, state, process group (pgid, leader start) and host, and the state,
/// pid, host, heartbeat and start of the process that runs it (its backfill's owner, or its
/// worker).
type Holder = (
    i64,
    String,
    Option<i64>,
    Option<i64>,
    Option<String>,
    BackfillState,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// Removes the slots of `pool` held by tries that ended, or by tries whose backfill's owner is
/// gone and whose process group is gone too (on another host, a gone owner's try counts as
/// stopped: see [`LeaseCtx::group_may_run`]). Returns the process groups of gone owners' tries
/// that still run here: the caller kills them, then asks again.
fn free_dead(conn: &Conn, pool: &str, ctx: &LeaseCtx) -> Result<Vec<crate::liveness::Group>> {
    let holders: Vec<Holder> = conn
        .prepare_cached(
            "SELECT s.try_id, t.state, t.pgid, t.pgid_start, t.host,
                    CASE WHEN w.id IS NULL THEN b.state ELSE w.state END,
                    CASE WHEN w.id IS NULL THEN b.owner_pid ELSE w.pid END,
                    CASE WHEN w.id IS NULL THEN b.owner_host ELSE w.host END,
                    CASE WHEN w.id IS NULL THEN b.heartbeat_at ELSE w.heartbeat_at END,
                    CASE WHEN w.id IS NULL THEN b.owner_start ELSE w.start END
             FROM pool_slots s JOIN backfills b ON b.id = s.backfill_id
             LEFT JOIN task_tries t ON t.id = s.try_id
             LEFT JOIN runs r ON r.id = t.run_id
             LEFT JOIN workers w ON w.id = r.worker
             WHERE s.pool = $1",
        )?
        .query_map([pool], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        })?
        .collect::<super::db::Result<_>>()?;
    let mut survivors = Vec::new();
    for (try_id, try_state, pgid, leader_start, try_host, state, pid, host, heartbeat, start) in
        holders
    {
        let free = if try_state != "running" {
            true
        } else if ctx.owner_alive(state, (pid, start), host.as_deref(), heartbeat) {
            false
        } else {
            let gone = match pgid {
                None => true,
                Some(pgid) => {
                    let group = crate::liveness::Group { pgid, leader_start };
                    if ctx.group_may_run(try_host.as_deref(), group) {
                        survivors.push(group);
                        false
                    } else {
                        true
                    }
                }
            };
            if gone {
                // Its process is dead, or was never let go (it waits at its gate): the try is
                // cancelled, so that its owner, should it only be frozen and wake up, cannot
                // start it, or another step of it, beside the slot's next holder. (A decided
                // publish is left to recovery: it reads no source.)
                conn.prepare_cached(&format!(
                    "UPDATE task_tries SET state = 'cancelled', ended_at = {},
                        error = 'its backfill''s owner was gone; its pool slot was given to another try'
                     WHERE id = $1 AND state = 'running' AND publishing = FALSE",
                    super::db::ended("started_at", "$2", "NULL")
                ))?
                .execute(params![try_id, ctx.now_ms])?;
            }
            gone
        };
        if free {
            conn.prepare_cached("DELETE FROM pool_slots WHERE try_id = $1")?
                .execute([try_id])?;
        }
    }
    Ok(survivors)
}

/// Whether try `try_id` holds a slot of a pool.
pub(crate) fn holds(conn: &Conn, try_id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM pool_slots WHERE try_id = $1)")?
        .query_row([try_id], |r| r.get(0))?)
}
