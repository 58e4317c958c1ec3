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
    ("forgets", "id"),
    ("pool_starts", "pool, at, try_id"),
    ("readiness", "backfill_id, interval_start, task_id"),
];

/// Parameters per statement (PostgreSQL takes at most 65535).
const PARAMS_PER_STATEMENT: usize = 4096;

/// Rows copied, by table (in [`TABLES`] order).
pub(crate) type Copied = Vec<(&'static str, usize)>;

/// Why a copy cannot start: said to the user as bad input (nothing was written).
#[derive(Debug)]
pub struct Refused(pub String);

/// Copies the SQLite manifest `from` (already open, at this binary's schema) into the
/// PostgreSQL manifest `to` (a location from [`super::location`]).
///
/// The copy is one transaction of the writers' lock, and the target is checked empty (every
/// table of the record) under that lock, so that a backfill started meanwhile from another host
/// is never mixed in. The source is read in one snapshot. A connection lost during the `COMMIT`
/// is settled as the writer settles it: by the transaction's token, read again on a new
/// connection, so that a copy that committed is never reported as failed.
pub fn to_postgres(
    from: &rusqlite::Connection,
    to: &Path,
) -> Result<std::result::Result<Copied, Refused>> {
    let shown = to.to_string_lossy().into_owned();
    let s = postgres::open(&super::url_of(to), &shown)?;
    let at = |e: super::db::Error| Error::from(e).at(to);
    let writer = format!("copy-{:x}-{:x}", std::process::id(), crate::clock::now_ms());
    let token = 1;
    s.begin(&writer, token).map_err(|e| at(e.into()))?;
    // One snapshot of the source for every table.
    if let Err(e) = from.execute_batch("BEGIN") {
        s.rollback();
        return Err(at(e.into()));
    }
    let result = (|| -> super::db::Result<std::result::Result<Copied, Refused>> {
        for &(table, _) in TABLES {
            let held = count(&s, &format!("SELECT COUNT(*) FROM {table}"))?;
            if held > 0 {
                return Ok(Err(Refused(format!(
                    "the manifest {shown} already holds a record ({held} row{} in {table}); copy into one that holds none (a new database, or one whose schema `{}` was dropped)",
                    if held == 1 { "" } else { "s" },
                    postgres::SCHEMA
                ))));
            }
        }
        let mut copied = Vec::new();
        for &(table, order) in TABLES {
            copied.push((table, copy_table(from, &s, table, order)?));
        }
        let identity: String = from.query_row("SELECT id FROM identity", [], |r| r.get(0))?;
        s.execute("DELETE FROM identity", &[])?;
        s.execute(
            "INSERT INTO identity (id) VALUES ($1)",
            &[Value::Text(identity)],
        )?;
        // Above every id the SQLite manifest gave, also those of rows `forget` removed.
        for table in ["backfills", "workers", "runs", "task_tries", "forgets"] {
            let largest = match table {
                "forgets" => "COALESCE((SELECT MAX(id) FROM forgets), 0)".to_string(),
                _ => super::forgets::largest_id(table, "GREATEST"),
            };
            s.query(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{}.{table}', 'id'), {largest} + 1, false)",
                    postgres::SCHEMA
                ),
                &[],
            )?;
        }
        Ok(Ok(copied))
    })();
    let _ = from.execute_batch("COMMIT");
    match result {
        Ok(Ok(copied)) => {
            crate::fault::point("copy-commit");
            match s.commit() {
                Ok(()) => Ok(Ok(copied)),
                Err(e) if s.is_broken() => {
                    // Did it commit? The token says, on a new connection.
                    match s.committed(&writer, token) {
                        Ok(true) => {
                            tracing::warn!(manifest = %shown, "the connection was lost during the copy's commit, which happened: {e}");
                            Ok(Ok(copied))
                        }
                        Ok(false) => Err(at(e.into())),
                        Err(e2) => Err(Error::Invalid(format!(
                            "{shown}: the connection was lost during the copy's commit ({e}), and whether it committed cannot be told ({e2}): run the copy again, which refuses if it did"
                        ))),
                    }
                }
                Err(e) => Err(at(e.into())),
            }
        }
        Ok(Err(refused)) => {
            s.rollback();
            Ok(Err(refused))
        }
        Err(e) => {
            s.rollback();
            Err(at(e))
        }
    }
}

/// A count, which must come back as one integer.
fn count(s: &Session, sql: &str) -> super::db::Result<i64> {
    match s.query(sql, &[])?.first().and_then(|r| r.first()) {
        Some(Value::Integer(n)) => Ok(*n),
        other => Err(super::db::Error::Postgres(crate::pg::Error::new(
            crate::pg::Kind::Other,
            format!("`{sql}` gave {other:?}, not a count"),
        ))),
    }
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
            &format!(
                "INSERT INTO {table} ({})",
                columns
                    .iter()
                    .map(|c| crate::pg::quote_ident(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
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
