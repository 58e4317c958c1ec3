//! Pool slots: at most a pool's size of its tasks' tries run at once, across every backfill and
//! process sharing the manifest. A slot is a row, taken in a manifest transaction, held by a
//! running try and given back when the try ends. A slot whose backfill's owner is gone (judged
//! as its leases are: not running, no heartbeat within the lease timeout, or a dead process on
//! this host) or whose try ended is free: the next taker removes it.

use rusqlite::{Connection, params};

use super::Result;
use super::backfills::Fenced;
use super::leases::LeaseCtx;
use crate::state::BackfillState;

/// Takes a slot of `pool` (of `size`) for try `try_id` if one is free; records that the try
/// waits for the pool when none is.
pub fn take(
    conn: &Connection,
    f: Fenced,
    pool: &str,
    size: u32,
    try_id: i64,
    ctx: &LeaseCtx,
) -> Result<bool> {
    free_dead(conn, pool, ctx)?;
    let held: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM pool_slots WHERE pool = ?1")?
        .query_row([pool], |r| r.get(0))?;
    if held >= i64::from(size) {
        conn.prepare_cached(
            "UPDATE task_tries SET waiting_for = ?2 WHERE id = ?1 AND waiting_for IS NULL",
        )?
        .execute(params![try_id, pool])?;
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT OR REPLACE INTO pool_slots (try_id, pool, backfill_id, taken_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![try_id, pool, f.owner().backfill_id, ctx.now_ms])?;
    conn.prepare_cached("UPDATE task_tries SET waiting_for = NULL WHERE id = ?1")?
        .execute([try_id])?;
    Ok(true)
}

/// Gives a try's slot back (nothing when it holds none).
pub fn give_back(conn: &Connection, try_id: i64) -> Result<()> {
    conn.prepare_cached("DELETE FROM pool_slots WHERE try_id = ?1")?
        .execute([try_id])?;
    conn.prepare_cached(
        "UPDATE task_tries SET waiting_for = NULL WHERE id = ?1 AND waiting_for IS NOT NULL",
    )?
    .execute([try_id])?;
    Ok(())
}

/// A slot's try: its id and state, and its backfill's state, owner pid, host and heartbeat.
type Holder = (
    i64,
    String,
    BackfillState,
    Option<i64>,
    Option<String>,
    Option<i64>,
);

/// Removes the slots of `pool` held by tries that ended or by backfills whose owner is gone.
fn free_dead(conn: &Connection, pool: &str, ctx: &LeaseCtx) -> Result<()> {
    let holders: Vec<Holder> = conn
        .prepare_cached(
            "SELECT s.try_id, t.state, b.state, b.owner_pid, b.owner_host, b.heartbeat_at
             FROM pool_slots s JOIN backfills b ON b.id = s.backfill_id
             LEFT JOIN task_tries t ON t.id = s.try_id
             WHERE s.pool = ?1",
        )?
        .query_map([pool], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (try_id, try_state, state, pid, host, heartbeat) in holders {
        if try_state != "running" || !ctx.owner_alive(state, pid, host.as_deref(), heartbeat) {
            conn.prepare_cached("DELETE FROM pool_slots WHERE try_id = ?1")?
                .execute([try_id])?;
        }
    }
    Ok(())
}
