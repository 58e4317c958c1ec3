//! The merge of a SQLite warehouse (`write = "merge"`): an interval's rows matched to the
//! target's by the gate's `unique_key`, so that only what differs is written.
//!
//! Before the gate, [`plan`] counts what the merge would do from the audit snapshot (rows to
//! insert, update, delete, leave, keep); the gate judges those counts. The publish then
//! [`apply`]s it inside its transaction, under the warehouse's write lock, in three statements:
//! the partition's keys the output no longer has are deleted (first, so that a unique
//! constraint of the target is free again), the rows whose values differ are updated (only the
//! columns the query returns: a surrogate id or a `first_seen_at` the query leaves out
//! survives), and the new keys are inserted. What it did must be what the gate judged: a
//! difference (the target changed in between) fails the publish, which commits nothing.
//!
//! Keys are matched with `=`: a `NULL` in the key matches nothing, and the gate rejects an
//! output that has one. Values are compared with `IS`, so that `NULL` equals `NULL`. The target
//! needs an index that starts with the key's columns (the dry run says so), the audit file gets
//! one of its own.

use rusqlite::Connection;

use super::partition::Repr;
use super::{Result, quote};
use crate::gate::Merge;
use crate::interval::DataInterval;

/// Where a merge reads from and writes to.
pub(crate) struct Merging<'a> {
    /// The target, as `main."name"`.
    pub target: String,
    /// The rows to merge (`audit.rows`, or a kept version's rows).
    pub source: &'a str,
    /// The columns the source has, which the merge writes.
    pub columns: &'a [String],
    pub key: &'a [String],
    pub partition_column: &'a str,
    /// The partition's representations (all of them when not known) and their bounds.
    pub bounds: Vec<(Repr, (rusqlite::types::Value, rusqlite::types::Value))>,
    /// `on_missing = "keep"`: keys of the partition that the source lacks stay.
    pub keep_missing: bool,
}

impl<'a> Merging<'a> {
    pub(crate) fn new(
        target: &str,
        source: &'a str,
        columns: &'a [String],
        key: &'a [String],
        partition_column: &'a str,
        (repr, interval, tz): (Option<Repr>, DataInterval, chrono_tz::Tz),
        keep_missing: bool,
    ) -> Self {
        Merging {
            target: format!("main.{}", quote(target)),
            source,
            columns,
            key,
            partition_column,
            bounds: Repr::known_or_all(repr)
                .into_iter()
                .map(|r| (r, r.bounds(interval, tz)))
                .collect(),
            keep_missing,
        }
    }

    /// `t` is in the interval's partition (its bounds are parameters 1 and up).
    fn in_partition(&self, t: &str) -> String {
        let column = format!("{t}.{}", quote(self.partition_column));
        let each: Vec<String> = self
            .bounds
            .iter()
            .enumerate()
            .map(|(i, (r, _))| {
                format!(
                    "({})",
                    r.predicate(self.partition_column, 2 * i + 1)
                        .replace(&quote(self.partition_column), &column)
                )
            })
            .collect();
        format!("({})", each.join(" OR "))
    }

    /// The target's name, unquoted.
    pub(crate) fn target_name(&self) -> &str {
        self.target
            .strip_prefix("main.")
            .unwrap_or(&self.target)
            .trim_matches('"')
    }

    /// `SELECT {select}` of the target's rows (as `t`) outside the interval's partition whose
    /// key the source has: the rows the merge moves into it (bounds as parameters 1 and up).
    pub(crate) fn moved_rows(&self, select: &str) -> String {
        format!(
            "SELECT {select} FROM {s} AS o JOIN {t} AS t ON {matches} WHERE NOT {partition}",
            s = self.source,
            t = self.target,
            matches = self.matches("t", "o"),
            partition = self.in_partition("t"),
        )
    }

    pub(super) fn params(&self) -> Vec<&dyn rusqlite::ToSql> {
        self.bounds
            .iter()
            .flat_map(|(_, (lo, hi))| [lo as &dyn rusqlite::ToSql, hi])
            .collect()
    }

    /// Rows `t` and `o` have the same key.
    fn matches(&self, t: &str, o: &str) -> String {
        each(self.key, " AND ", |c| format!("{t}.{c} = {o}.{c}"))
    }

    /// Rows `t` and `o` hold the same values in every column the source has.
    fn same(&self, t: &str, o: &str) -> String {
        each(self.columns, " AND ", |c| format!("{t}.{c} IS {o}.{c}"))
    }

    /// The source has a `NULL` in its key.
    fn null_key(&self, o: &str) -> String {
        each(self.key, " OR ", |c| format!("{o}.{c} IS NULL"))
    }
}

/// `term` of each column (quoted), joined by `by`.
fn each(columns: &[String], by: &str, term: impl Fn(&str) -> String) -> String {
    columns
        .iter()
        .map(|c| term(&quote(c)))
        .collect::<Vec<_>>()
        .join(by)
}

/// An index on the source's key, for the lookups of the partition's rows in it.
pub(crate) fn index_source(conn: &Connection, m: &Merging<'_>) -> Result<()> {
    let Some((schema, table)) = m.source.split_once('.') else {
        return Ok(());
    };
    let key = m
        .key
        .iter()
        .map(|k| quote(k))
        .collect::<Vec<_>>()
        .join(", ");
    // Named after its table: several sources of one schema (a group's) each have their own.
    let index = quote(&format!("backfill_merge_key_{}", table.trim_matches('"')));
    conn.execute_batch(&format!(
        "CREATE INDEX IF NOT EXISTS {schema}.{index} ON {table} ({key})"
    ))?;
    Ok(())
}

/// What the merge would do, counted without writing (with the source's rows that have a `NULL`
/// in their key, which no merge can match).
pub(crate) fn plan(conn: &Connection, m: &Merging<'_>) -> Result<Merge> {
    let (t, s) = (&m.target, m.source);
    let sql = format!(
        "SELECT
           (SELECT count(*) FROM {s} o),
           (SELECT count(*) FROM {s} o WHERE NOT EXISTS (SELECT 1 FROM {t} t WHERE {matches})),
           (SELECT count(*) FROM {s} o WHERE EXISTS (SELECT 1 FROM {t} t WHERE {matches} AND {same})),
           (SELECT count(*) FROM {t} t WHERE {partition} AND NOT EXISTS (SELECT 1 FROM {s} o WHERE {matches})),
           (SELECT count(*) FROM {s} o WHERE {null_key})",
        matches = m.matches("t", "o"),
        same = m.same("t", "o"),
        partition = m.in_partition("t"),
        null_key = m.null_key("o"),
    );
    let (rows, inserted, unchanged, missing, null_keys): (i64, i64, i64, i64, i64) =
        conn.prepare(&sql)?.query_row(m.params().as_slice(), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
    Ok(Merge {
        null_keys,
        ..Merge::counted(rows, inserted, unchanged, missing, m.keep_missing)
    })
}

/// How many of the source's keys the target holds outside the interval's partition: the rows
/// a merge moves into it.
pub(crate) fn moved(conn: &Connection, m: &Merging<'_>) -> Result<i64> {
    let sql = format!(
        "SELECT count(*) FROM {s} o WHERE EXISTS (SELECT 1 FROM {t} t WHERE {matches} AND NOT {partition})",
        s = m.source,
        t = m.target,
        matches = m.matches("t", "o"),
        partition = m.in_partition("t"),
    );
    Ok(conn
        .prepare(&sql)?
        .query_row(m.params().as_slice(), |r| r.get(0))?)
}

/// What a merge's delete deletes, as a refusal by a foreign key says it.
pub(super) const MERGE_DELETES: &str = "a key the merge deletes";

/// What a replace's delete deletes.
pub(super) const REPLACE_DELETES: &str = "a row of the partition, which a replace deletes whole (write = \"merge\" deletes only the keys the output no longer has),";

/// A delete that a foreign key refused, with the tables and columns that reference the target
/// (SQLite's own words name none).
pub(super) fn referenced(
    conn: &Connection,
    target: &str,
    e: rusqlite::Error,
    deleted: &str,
) -> super::Error {
    let refused = refused_by_target(e);
    let super::Error::Constraint(why) = &refused else {
        return refused;
    };
    if !why.contains("FOREIGN KEY") {
        return refused;
    }
    let table = target.trim_start_matches("main.").trim_matches('"');
    let by: Vec<String> = conn
        .prepare(
            "SELECT s.name || '.' || f.\"from\" FROM sqlite_schema s, pragma_foreign_key_list(s.name) f \
             WHERE s.type = 'table' AND f.\"table\" = ?1 ORDER BY 1",
        )
        .and_then(|mut stmt| {
            stmt.query_map([table], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
        })
        .unwrap_or_default();
    if by.is_empty() {
        return refused;
    }
    super::Error::Constraint(format!(
        "{why}: {deleted} is still referenced by {}",
        by.join(", ")
    ))
}

/// Merges the source into the target, in the caller's transaction: returns what it did.
pub(crate) fn apply(conn: &Connection, m: &Merging<'_>) -> Result<Merge> {
    let (t, s) = (&m.target, m.source);
    let deleted = if m.keep_missing {
        0
    } else {
        let sql = format!(
            "DELETE FROM {t} AS t WHERE {partition} AND NOT EXISTS (SELECT 1 FROM {s} o WHERE {matches})",
            partition = m.in_partition("t"),
            matches = m.matches("t", "o"),
        );
        conn.prepare(&sql)?
            .execute(m.params().as_slice())
            .map_err(|e| referenced(conn, &m.target, e, MERGE_DELETES))?
    };
    let values: Vec<&String> = m.columns.iter().filter(|c| !m.key.contains(c)).collect();
    let updated = if values.is_empty() {
        0
    } else {
        let sql = format!(
            "UPDATE {t} AS t SET {set} FROM {s} AS o WHERE {matches} AND NOT ({same})",
            set = values
                .iter()
                .map(|c| format!("{c} = o.{c}", c = quote(c)))
                .collect::<Vec<_>>()
                .join(", "),
            matches = m.matches("t", "o"),
            same = m.same("t", "o"),
        );
        conn.execute(&sql, []).map_err(refused_by_target)?
    };
    let list = m
        .columns
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ");
    let inserted = conn
        .execute(
            &format!(
                "INSERT INTO {t} ({list}) SELECT {list} FROM {s} AS o \
                 WHERE NOT EXISTS (SELECT 1 FROM {t} AS t WHERE {matches})",
                matches = m.matches("t", "o"),
            ),
            [],
        )
        .map_err(refused_by_target)?;
    let rows: i64 = conn.query_row(&format!("SELECT count(*) FROM {s}"), [], |r| r.get(0))?;
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let (inserted, updated, deleted) = (count(inserted), count(updated), count(deleted));
    Ok(Merge {
        inserted,
        updated,
        deleted,
        unchanged: rows - inserted - updated,
        kept: 0,
        moved: 0,
        null_keys: 0,
    })
}

/// A constraint of the target that refused the audited rows (a primary key, a unique index, a
/// check, a `NOT NULL`) as [`super::Error::Constraint`]; any other error as it is.
pub(super) fn refused_by_target(e: rusqlite::Error) -> super::Error {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => super::Error::Constraint(match &e {
            rusqlite::Error::SqliteFailure(_, Some(message)) => message.clone(),
            _ => e.to_string(),
        }),
        _ => super::Error::Sql(e),
    }
}
