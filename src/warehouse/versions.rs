//! Kept versions, for `backfill rollback`: a SQL publish keeps the rows it replaces, per task and
//! interval, for the task's last `keep_versions` publishes. They live in the warehouse itself,
//! written in the publish transaction, so that a partition and its kept predecessor always
//! agree:
//!
//! - `_backfill_versions` (one per warehouse): one row per kept version: the target table, the
//!   interval, the try whose publish replaced the rows (`replaced_by`), the try that had
//!   published them (`version_of`, NULL when they predate the manifest), and their count;
//! - `_backfill_kept_TARGET` (one per target): the rows, with the `_replaced_by` try. A merge
//!   under `unique_key_scope = "table"` also moves rows into its partition from others: those
//!   rows, as they were where they came from, are kept under the negative of the try
//!   (`_replaced_by = -try`), so that a rollback moves them back rather than deleting them. They
//!   are not the partition's: its version's count and fingerprint leave them out.
//!
//! A publish that is redone (recovery finishing a publish that had committed) finds its version
//! kept already and keeps nothing twice.

use rusqlite::{Connection, OptionalExtension, params};

use super::partition::Repr;
use super::{Result, quote, table_columns};
use crate::interval::DataInterval;
use crate::project::SqlTask;

/// The table of kept versions.
pub(crate) const META: &str = "_backfill_versions";

/// The table that keeps the replaced rows of `target`.
pub(crate) fn kept_table(target: &str) -> String {
    format!("_backfill_kept_{target}")
}

/// What a publish keeps: the rows it replaces, as the version replaced by `by_try`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    /// The try whose publish replaces the partition.
    pub by_try: i64,
    /// The try whose output the partition holds now (from the manifest), if any.
    pub version_of: Option<i64>,
    /// How many versions of the interval to keep, this one included (0: none, and the ones
    /// kept before go).
    pub keep: u32,
    /// The manifest says the partition holds rows with the fingerprint of those being
    /// published. Checked in the transaction: a partition that holds exactly the new rows is
    /// not kept (it would push a real version out for a copy of itself); the version its
    /// rows replaced moves to this publish instead.
    pub same_content: bool,
}

/// One kept version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    pub replaced_by: i64,
    pub version_of: Option<i64>,
    pub rows: i64,
}

fn ensure_meta(conn: &Connection) -> Result<()> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS main.{META} (
             target         TEXT    NOT NULL,
             interval_start INTEGER NOT NULL,
             interval_end   INTEGER NOT NULL,
             replaced_by    INTEGER NOT NULL,
             version_of     INTEGER,
             rows           INTEGER NOT NULL,
             kept_at        INTEGER NOT NULL,
             PRIMARY KEY (target, replaced_by)
         ) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS main.{META}_by_interval
             ON {META} (target, interval_start, replaced_by);"
    ))?;
    Ok(())
}

fn has_table(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM main.sqlite_schema WHERE type = 'table' AND name = ?1")?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The columns that can be kept and put back: those of the kept table that the target still
/// has.
fn shared_columns(conn: &Connection, target: &str) -> Result<Vec<String>> {
    let kept = table_columns(conn, "main", &kept_table(target))?;
    let now = table_columns(conn, "main", target)?;
    Ok(kept
        .into_iter()
        .filter(|c| c != "_replaced_by" && now.contains(c))
        .map(|c| quote(&c))
        .collect())
}

/// The predicates that select the interval's rows of the target: one per representation when
/// it is not known.
fn ranges(repr: Option<Repr>) -> Vec<Repr> {
    Repr::known_or_all(repr)
}

/// Inside the publish transaction, before the partition is replaced: keeps its rows as the
/// version replaced by `k.by_try`, then drops the versions of the interval beyond the newest
/// `k.keep`. Returns the rows kept.
#[expect(
    clippy::too_many_arguments,
    reason = "the publish transaction's parts, as `save` takes them, and where its audited rows are"
)]
pub(crate) fn keep(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    k: Keep,
    audited: Option<(&str, &str)>,
    now_ms: i64,
) -> Result<i64> {
    if let (true, Some(of)) = (k.same_content, k.version_of)
        && k.keep > 0
        && holds_the_new_rows(conn, task, repr, interval, tz, audited)?
    {
        // A republish of the same rows (a resumed interval, a rerun of an unchanged source):
        // what can be put back is still what the current content replaced.
        carry(conn, &task.target, of, k.by_try)?;
        trim(conn, &task.target, interval.start.timestamp(), k.keep)?;
        return Ok(0);
    }
    let rows = save(conn, task, repr, interval, tz, k, now_ms)?;
    trim(conn, &task.target, interval.start.timestamp(), k.keep)?;
    Ok(rows)
}

/// Whether the partition holds exactly the rows about to be published: those of the audited
/// table `audited` (schema, table: same columns, count and fingerprint), or none for an empty
/// publish. `false` when that cannot be told (the partition column's representation is
/// unknown).
fn holds_the_new_rows(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    audited: Option<(&str, &str)>,
) -> Result<bool> {
    let Some(repr) = repr else {
        return Ok(false);
    };
    let Some((schema, table)) = audited else {
        return partition_is_empty(conn, task, Some(repr), interval, tz);
    };
    let columns = table_columns(conn, schema, table)?;
    let target = table_columns(conn, "main", &task.target)?;
    if columns.is_empty()
        || columns.len() != target.len()
        || !columns.iter().all(|c| target.contains(c))
    {
        return Ok(false);
    }
    let list = columns
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ");
    let (lo, hi) = repr.bounds(interval, tz);
    let mut stmt = conn.prepare(&format!(
        "SELECT {list} FROM main.{} WHERE {}",
        quote(&task.target),
        repr.predicate(&task.partition_column, 1)
    ))?;
    let now = super::audit::fingerprint_rows(&mut stmt, params![lo, hi])?;
    let mut stmt = conn.prepare(&format!(
        "SELECT {list} FROM {}.{}",
        quote(schema),
        quote(table)
    ))?;
    let new = super::audit::fingerprint_rows(&mut stmt, [])?;
    Ok(now == new)
}

/// Inside a merge's publish transaction, before the merge, once the partition's version was
/// kept (see [`keep`]): keeps the rows of other partitions that the merge moves into this one
/// (their keys are in `source`), as they are there, under `-by_try`. Nothing when no version
/// is kept for `by_try`, or when the rows were moved already (a publish being redone).
pub(crate) fn keep_moved(
    conn: &Connection,
    m: &super::merge::Merging<'_>,
    by_try: i64,
) -> Result<()> {
    let target = m.target_name();
    if find(conn, target, by_try)?.is_none() {
        return Ok(());
    }
    let kept = kept_table(target);
    let columns = shared_columns(conn, target)?;
    let list = columns
        .iter()
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.execute(
        &format!(
            "INSERT INTO main.{} (_replaced_by, {}) {}",
            quote(&kept),
            columns.join(", "),
            m.moved_rows(&format!("-{by_try}, {list}"))
        ),
        m.params().as_slice(),
    )?;
    Ok(())
}

/// The version replaced by the publish of `from` becomes the one replaced by `to` (nothing
/// when none is kept, or it moved already: a publish being redone).
fn carry(conn: &Connection, target: &str, from: i64, to: i64) -> Result<()> {
    if !has_table(conn, META)? || find(conn, target, from)?.is_none() {
        return Ok(());
    }
    conn.prepare_cached(&format!(
        "UPDATE main.{META} SET replaced_by = ?3 WHERE target = ?1 AND replaced_by = ?2"
    ))?
    .execute(params![target, from, to])?;
    let kept = kept_table(target);
    if has_table(conn, &kept)? {
        conn.execute(
            &format!(
                "UPDATE main.{} SET _replaced_by = CASE WHEN _replaced_by < 0 THEN -?2 ELSE ?2 END
                 WHERE _replaced_by IN (?1, -?1)",
                quote(&kept)
            ),
            params![from, to],
        )?;
    }
    Ok(())
}

/// [`keep`] without the retention: keeps the partition's rows as the version replaced by
/// `k.by_try` (nothing when `k.keep` is 0).
pub(crate) fn save(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    k: Keep,
    now_ms: i64,
) -> Result<i64> {
    let start = interval.start.timestamp();
    if k.keep == 0 {
        return Ok(0);
    }
    if k.version_of.is_none() && partition_is_empty(conn, task, repr, interval, tz)? {
        // A partition backfilled for the first time: there is nothing to put back, and a
        // rollback must not empty it.
        return Ok(0);
    }
    // Created once: a publish that keeps a version only asks whether they exist.
    if !has_table(conn, META)? {
        ensure_meta(conn)?;
    }
    let kept = kept_table(&task.target);
    if !has_table(conn, &kept)? {
        conn.execute_batch(&format!(
            "CREATE TABLE main.{q} AS SELECT CAST(NULL AS INTEGER) AS _replaced_by, * FROM main.{t} WHERE 0;
             CREATE INDEX main.{i} ON {q} (_replaced_by);",
            q = quote(&kept),
            t = quote(&task.target),
            i = quote(&format!("{kept}_by_try")),
        ))?;
    }
    let already = conn
        .prepare_cached(&format!(
            "SELECT rows FROM main.{META} WHERE target = ?1 AND replaced_by = ?2"
        ))?
        .query_row(params![task.target, k.by_try], |r| r.get::<_, i64>(0))
        .optional()?;
    if let Some(rows) = already {
        // This publish committed before and is being redone: its version is kept.
        return Ok(rows);
    }
    let columns = shared_columns(conn, &task.target)?.join(", ");
    let mut rows = 0;
    for r in ranges(repr) {
        let (lo, hi) = r.bounds(interval, tz);
        rows += conn.execute(
            &format!(
                "INSERT INTO main.{} (_replaced_by, {columns}) SELECT ?3, {columns} FROM main.{} WHERE {}",
                quote(&kept),
                quote(&task.target),
                r.predicate(&task.partition_column, 1)
            ),
            params![lo, hi, k.by_try],
        )?;
    }
    let rows = i64::try_from(rows).unwrap_or(i64::MAX);
    conn.prepare_cached(&format!(
        "INSERT INTO main.{META} (target, interval_start, interval_end, replaced_by, version_of, rows, kept_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    ))?
    .execute(params![
        task.target,
        start,
        interval.end.timestamp(),
        k.by_try,
        k.version_of,
        rows,
        now_ms
    ])?;
    Ok(rows)
}

/// Whether the target holds no row of the interval (a range its index serves).
fn partition_is_empty(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<bool> {
    for r in ranges(repr) {
        let (lo, hi) = r.bounds(interval, tz);
        let found = conn
            .prepare_cached(&format!(
                "SELECT 1 FROM main.{} WHERE {} LIMIT 1",
                quote(&task.target),
                r.predicate(&task.partition_column, 1)
            ))?
            .query_row(params![lo, hi], |_| Ok(()))
            .optional()?;
        if found.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Drops the versions of an interval beyond the newest `keep`.
pub(crate) fn trim(conn: &Connection, target: &str, start: i64, keep: u32) -> Result<()> {
    if !has_table(conn, META)? {
        return Ok(());
    }
    let doomed: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT replaced_by FROM main.{META} WHERE target = ?1 AND interval_start = ?2
             ORDER BY replaced_by DESC LIMIT -1 OFFSET ?3"
        ))?
        .query_map(params![target, start, keep], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for by in doomed {
        drop_version(conn, target, by)?;
    }
    Ok(())
}

/// `backfill forget`: removes the versions of `target` kept for the publishes of tries up to
/// `last_try` over the intervals starting within `range` (unix seconds, both included; `None`:
/// every interval), in one transaction, and the kept table once it keeps nothing. With `dry`,
/// only counts them. Returns how many versions went (or would).
pub(crate) fn forget(
    conn: &Connection,
    target: &str,
    range: Option<(i64, i64)>,
    last_try: i64,
    dry: bool,
) -> Result<i64> {
    if !has_table(conn, META)? {
        return Ok(0);
    }
    let (lo, hi) = range.unwrap_or((i64::MIN, i64::MAX));
    let doomed: Vec<i64> = conn
        .prepare(&format!(
            "SELECT replaced_by FROM main.{META} WHERE target = ?1
               AND interval_start BETWEEN ?2 AND ?3 AND replaced_by <= ?4"
        ))?
        .query_map(params![target, lo, hi, last_try], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let count = i64::try_from(doomed.len()).unwrap_or(i64::MAX);
    if dry {
        return Ok(count);
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let done = (|| -> Result<()> {
        for &by in &doomed {
            drop_version(conn, target, by)?;
        }
        let kept = kept_table(target);
        let left: i64 = conn.query_row(
            &format!("SELECT count(*) FROM main.{META} WHERE target = ?1"),
            [target],
            |r| r.get(0),
        )?;
        if left == 0 && has_table(conn, &kept)? {
            conn.execute_batch(&format!("DROP TABLE main.{}", quote(&kept)))?;
        }
        Ok(())
    })();
    match done {
        Ok(()) => {
            conn.execute_batch("COMMIT")?;
            Ok(count)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn drop_version(conn: &Connection, target: &str, replaced_by: i64) -> Result<()> {
    let kept = kept_table(target);
    if has_table(conn, &kept)? {
        conn.execute(
            &format!(
                "DELETE FROM main.{} WHERE _replaced_by IN (?1, -?1)",
                quote(&kept)
            ),
            [replaced_by],
        )?;
    }
    conn.prepare_cached(&format!(
        "DELETE FROM main.{META} WHERE target = ?1 AND replaced_by = ?2"
    ))?
    .execute(params![target, replaced_by])?;
    Ok(())
}

/// The version that the publish of `replaced_by` replaced, if it was kept.
pub(crate) fn find(conn: &Connection, target: &str, replaced_by: i64) -> Result<Option<Version>> {
    if !has_table(conn, META)? {
        return Ok(None);
    }
    Ok(conn
        .prepare_cached(&format!(
            "SELECT replaced_by, version_of, rows FROM main.{META}
             WHERE target = ?1 AND replaced_by = ?2"
        ))?
        .query_row(params![target, replaced_by], |r| {
            Ok(Version {
                replaced_by: r.get(0)?,
                version_of: r.get(1)?,
                rows: r.get(2)?,
            })
        })
        .optional()?)
}

/// The order-independent fingerprint of a kept version's rows, over the query's columns: what
/// the partition will hold once it is put back.
pub(crate) fn fingerprint(
    conn: &Connection,
    task: &SqlTask,
    replaced_by: i64,
) -> Result<(i64, String)> {
    // What the partition holds once the version is put back: the kept columns, and NULL for
    // a column added to the target since.
    let kept = table_columns(conn, "main", &kept_table(&task.target))?;
    let columns = super::query_columns_over(conn, task, &kept)?;
    let mut stmt = conn.prepare(&format!(
        "SELECT {columns} FROM main.{} WHERE _replaced_by = ?1",
        quote(&kept_table(&task.target))
    ))?;
    super::audit::fingerprint_rows(&mut stmt, [replaced_by])
}

/// Inside the rollback transaction, after the partition was cleared: puts the version back and
/// forgets it (its rows are the partition again). Returns the rows put back.
pub(crate) fn restore(conn: &Connection, task: &SqlTask, replaced_by: i64) -> Result<i64> {
    let kept = kept_table(&task.target);
    let mut rows = 0;
    if has_table(conn, &kept)? {
        let columns = shared_columns(conn, &task.target)?.join(", ");
        rows = conn.execute(
            &format!(
                "INSERT INTO main.{} ({columns}) SELECT {columns} FROM main.{} WHERE _replaced_by = ?1",
                quote(&task.target),
                quote(&kept)
            ),
            [replaced_by],
        )?;
    }
    drop_version(conn, &task.target, replaced_by)?;
    Ok(i64::try_from(rows).unwrap_or(i64::MAX))
}

/// [`restore`] for a merge (`write = "merge"`): the kept rows are merged back by `key` rather
/// than the partition deleted and refilled, so that rows another table references stay as
/// long as the version holds them too. Rows the merges since inserted are deleted, those they
/// updated or deleted are put back, every column as it was kept.
pub(crate) fn restore_merging(
    conn: &Connection,
    task: &SqlTask,
    key: &[String],
    (repr, interval, tz): (Option<Repr>, DataInterval, chrono_tz::Tz),
    replaced_by: i64,
) -> Result<i64> {
    let kept = kept_table(&task.target);
    let source = "temp.backfill_restore";
    let columns: Vec<String> = if has_table(conn, &kept)? {
        let now = table_columns(conn, "main", &task.target)?;
        table_columns(conn, "main", &kept)?
            .into_iter()
            .filter(|c| c != "_replaced_by" && now.contains(c))
            .collect()
    } else {
        Vec::new()
    };
    let rows = if columns.is_empty() {
        // Nothing was kept: the version is an empty partition.
        super::partition::delete_partition(conn, task, repr, interval, tz)?;
        0
    } else {
        let list = columns
            .iter()
            .map(|c| quote(c))
            .collect::<Vec<_>>()
            .join(", ");
        conn.execute(&format!("DROP TABLE IF EXISTS {source}"), [])?;
        // The partition's rows, and those the merge moved in from other partitions (as they
        // were there): the merge back moves them back.
        conn.execute(
            &format!(
                "CREATE TABLE {source} AS SELECT {list} FROM main.{} WHERE _replaced_by IN (?1, -?1)",
                quote(&kept)
            ),
            [replaced_by],
        )?;
        let moved: i64 = conn.query_row(
            &format!(
                "SELECT count(*) FROM main.{} WHERE _replaced_by = -?1",
                quote(&kept)
            ),
            [replaced_by],
            |r| r.get(0),
        )?;
        let m = super::merge::Merging::new(
            &task.target,
            source,
            &columns,
            key,
            &task.partition_column,
            (repr, interval, tz),
            false,
        );
        super::merge::index_source(conn, &m)?;
        let done = super::merge::apply(conn, &m);
        conn.execute(&format!("DROP TABLE IF EXISTS {source}"), [])?;
        let done = done?;
        done.inserted + done.updated + done.unchanged - moved
    };
    drop_version(conn, &task.target, replaced_by)?;
    Ok(rows)
}

/// What the kept versions of a target cost: versions, rows, and bytes on disk (both tables and
/// their indexes, as `dbstat` counts them).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Storage {
    pub target: String,
    pub versions: i64,
    pub rows: i64,
    pub bytes: i64,
}

pub(crate) fn storage(conn: &Connection, target: &str) -> Result<Storage> {
    let mut s = Storage {
        target: target.to_string(),
        ..Storage::default()
    };
    if !has_table(conn, META)? {
        return Ok(s);
    }
    (s.versions, s.rows) = conn.query_row(
        &format!("SELECT COUNT(*), COALESCE(SUM(rows), 0) FROM main.{META} WHERE target = ?1"),
        [target],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let kept = kept_table(target);
    s.bytes = conn
        .query_row(
            "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat('main')
             WHERE name = ?1 OR name = ?2",
            params![kept, format!("{kept}_by_try")],
            |r| r.get(0),
        )
        .unwrap_or(0);
    Ok(s)
}
