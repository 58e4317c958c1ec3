//! `backfill diff`: what a staged output would change in the published partition, by the
//! task's unique key: keys added, keys removed, and keys whose other columns changed. The staged
//! file is attached read-only; nothing is written.

use std::path::Path;

use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde::Serialize;

use super::partition::Repr;
use super::{Result, quote, table_columns};
use crate::interval::DataInterval;
use crate::project::SqlTask;

/// How many example keys of each kind are shown.
pub(crate) const EXAMPLES: usize = 5;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct KeyDiff {
    pub added: i64,
    pub removed: i64,
    pub changed: i64,
    pub examples: Examples,
}

/// Up to [`EXAMPLES`] keys of each kind, smallest first: a value for a one-column key, an
/// array for a key of several columns.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Examples {
    pub added: Vec<serde_json::Value>,
    pub removed: Vec<serde_json::Value>,
    pub changed: Vec<serde_json::Value>,
}

/// Compares the staged rows in `staged` with the interval's published rows of the target.
pub(crate) fn keys(
    conn: &Connection,
    task: &SqlTask,
    key: &[String],
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &Path,
) -> Result<KeyDiff> {
    conn.execute(
        "ATTACH DATABASE ?1 AS staged",
        [super::audit::uri(staged).replace("?mode=rw", "?mode=ro")],
    )?;
    let result = compare(conn, task, key, repr, interval, tz);
    let _ = conn.execute_batch("DETACH DATABASE staged");
    result
}

fn compare(
    conn: &Connection,
    task: &SqlTask,
    key: &[String],
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<KeyDiff> {
    let target = table_columns(conn, "main", &task.target)?;
    let columns: Vec<String> = table_columns(conn, "staged", "rows")?
        .into_iter()
        .filter(|c| target.contains(c))
        .map(|c| quote(&c))
        .collect();
    let cols = columns.join(", ");
    let k = key.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ");
    let (predicates, binds) = ranges(task, repr, interval, tz);
    let with = format!(
        "WITH p AS (SELECT {cols} FROM main.{} WHERE {predicates}), s AS (SELECT {cols} FROM staged.rows)",
        quote(&task.target),
    );
    let sets = [
        format!("SELECT {k} FROM s EXCEPT SELECT {k} FROM p"),
        format!("SELECT {k} FROM p EXCEPT SELECT {k} FROM s"),
        format!(
            "SELECT {k} FROM (SELECT * FROM s EXCEPT SELECT * FROM p) INTERSECT SELECT {k} FROM p"
        ),
    ];
    let mut out = KeyDiff::default();
    for (n, set) in sets.iter().enumerate() {
        let params = rusqlite::params_from_iter(binds.iter());
        let count: i64 = conn.query_row(
            &format!("{with} SELECT COUNT(*) FROM ({set})"),
            params,
            |r| r.get(0),
        )?;
        let order = (1..=key.len())
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mut stmt = conn.prepare(&format!(
            "{with} SELECT * FROM ({set}) ORDER BY {order} LIMIT {EXAMPLES}"
        ))?;
        let mut rows = stmt.query(rusqlite::params_from_iter(binds.iter()))?;
        let mut examples = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(key.len());
            for i in 0..key.len() {
                values.push(json(row.get_ref(i)?));
            }
            examples.push(if values.len() == 1 {
                values.remove(0)
            } else {
                serde_json::Value::Array(values)
            });
        }
        match n {
            0 => (out.added, out.examples.added) = (count, examples),
            1 => (out.removed, out.examples.removed) = (count, examples),
            _ => (out.changed, out.examples.changed) = (count, examples),
        }
    }
    Ok(out)
}

fn json(v: ValueRef<'_>) -> serde_json::Value {
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => format!(
            "x'{}'",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        )
        .into(),
    }
}

/// The rows the target holds for the interval now, and their fingerprint over the query's
/// columns: what is published, whatever the manifest recorded (the table may have been changed
/// by hand since).
pub(crate) fn published(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<(i64, String)> {
    let target = table_columns(conn, "main", &task.target)?;
    let columns = super::query_columns_over(conn, task, &target)?;
    let (predicates, binds) = ranges(task, repr, interval, tz);
    let mut stmt = conn.prepare(&format!(
        "SELECT {columns} FROM main.{} WHERE {predicates}",
        quote(&task.target),
    ))?;
    super::audit::fingerprint_rows(&mut stmt, rusqlite::params_from_iter(binds.iter()))
}

/// How many rows the target holds in each interval now.
pub(crate) fn partition_rows(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    intervals: &[DataInterval],
    tz: chrono_tz::Tz,
) -> Result<Vec<i64>> {
    intervals
        .iter()
        .map(|&interval| {
            let (predicates, binds) = ranges(task, repr, interval, tz);
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM main.{} WHERE {predicates}",
                    quote(&task.target),
                ))?
                .query_row(rusqlite::params_from_iter(binds.iter()), |r| r.get(0))?)
        })
        .collect()
}

/// The predicate that selects the interval's rows of the target, with its parameters: one
/// range per representation when it is not known.
fn ranges(
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> (String, Vec<rusqlite::types::Value>) {
    let reprs = Repr::known_or_all(repr);
    let mut binds = Vec::new();
    let mut predicates = Vec::new();
    for (i, r) in reprs.iter().enumerate() {
        let (lo, hi) = r.bounds(interval, tz);
        predicates.push(format!(
            "({})",
            r.predicate(&task.partition_column, 2 * i + 1)
        ));
        binds.push(lo);
        binds.push(hi);
    }
    (predicates.join(" OR "), binds)
}
