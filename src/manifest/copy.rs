//! `backfill manifest copy --to URL`: a SQLite manifest's whole history, copied into an empty
//! PostgreSQL manifest in one transaction, with its identity (so that a PostgreSQL warehouse's
//! bookkeeping of publishes and kept versions still names it) and its ids (so that `show 7`
//! shows the same backfill on both).

use std::path::Path;

use rusqlite::types::Value;

use super::postgres::{self, Session};
use super::{Error, Result};

/// The tables copied, each before those that refer to it, with the order that keeps every
/// reference pointing backwards.
const TABLES: &[(&str, &str)] = &[
    ("backfills", "id"),
    ("plan", "backfill_id, ord"),
    ("workers", "id"),
    ("runs", "id"),
    ("task_tries", "id"),
    ("leases", "dag_id, interval_start"),
    ("published", "dag_id, task_id, interval_start"),
    ("pool_slots", "try_id"),
];

/// Parameters per statement (PostgreSQL takes at most 65535).
const PARAMS_PER_STATEMENT: usize = 4096;

/// Rows copied, by table (in [`TABLES`] order).
pub type Copied = Vec<(&'static str, usize)>;

/// Why a copy cannot start: said to the user as bad input (nothing was written).
#[derive(Debug)]
pub struct Refused(pub String);

/// Copies the SQLite manifest `from` (already open, at this binary's schema) into the
/// PostgreSQL manifest `to` (a location from [`super::location`]).
pub fn to_postgres(
    from: &rusqlite::Connection,
    to: &Path,
) -> Result<std::result::Result<Copied, Refused>> {
    let shown = to.to_string_lossy().into_owned();
    let s = postgres::open(&super::url_of(to), &shown)?;
    let at = |e: super::db::Error| Error::from(e).at(to);
    let held = count(&s, "SELECT COUNT(*) FROM backfills").map_err(at)?;
    if held > 0 {
        return Ok(Err(Refused(format!(
            "the manifest {shown} already holds {held} backfill{}; copy into one that holds none (a new database, or one whose schema `{}` was dropped)",
            if held == 1 { "" } else { "s" },
            postgres::SCHEMA
        ))));
    }
    s.begin(&format!("copy-{:x}", std::process::id()), 1)
        .map_err(|e| at(e.into()))?;
    let result = (|| -> super::db::Result<Copied> {
        let mut copied = Vec::new();
        for &(table, order) in TABLES {
            copied.push((table, copy_table(from, &s, table, order)?));
        }
        let identity: String = from.query_row("SELECT id FROM identity", [], |r| r.get(0))?;
        s.execute("DELETE FROM identity", &[])?;
        s.execute(
            "INSERT INTO identity (id) VALUES (?1)",
            &[Value::Text(identity)],
        )?;
        for table in ["backfills", "workers", "runs", "task_tries"] {
            s.query(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{}.{table}', 'id'), COALESCE(MAX(id), 0) + 1, false) FROM {table}",
                    postgres::SCHEMA
                ),
                &[],
            )?;
        }
        Ok(copied)
    })();
    match result {
        Ok(copied) => {
            s.commit().map_err(|e| at(e.into()))?;
            Ok(Ok(copied))
        }
        Err(e) => {
            s.rollback();
            Err(at(e))
        }
    }
}

fn count(s: &Session, sql: &str) -> super::db::Result<i64> {
    Ok(match s.query(sql, &[])?.first().and_then(|r| r.first()) {
        Some(Value::Integer(n)) => *n,
        _ => 0,
    })
}

/// Copies one table's rows, many to a statement; returns how many.
fn copy_table(
    from: &rusqlite::Connection,
    to: &Session,
    table: &str,
    order: &str,
) -> super::db::Result<usize> {
    let mut stmt = from.prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let per_statement = (PARAMS_PER_STATEMENT / columns.len()).max(1);
    let mut rows = stmt.query([])?;
    let mut pending: Vec<Value> = Vec::new();
    let mut n = 0;
    let flush = |pending: &mut Vec<Value>| -> super::db::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        to.insert_many(
            &format!("INSERT INTO {table} ({})", columns.join(", ")),
            "",
            columns.len(),
            pending,
        )?;
        pending.clear();
        Ok(())
    };
    while let Some(r) = rows.next()? {
        for i in 0..columns.len() {
            pending.push(r.get::<_, Value>(i)?);
        }
        n += 1;
        if n % per_statement == 0 {
            flush(&mut pending)?;
        }
    }
    flush(&mut pending)?;
    Ok(n)
}
