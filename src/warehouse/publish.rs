//! The publish transaction: delete exactly the target rows of the interval and insert the
//! audited rows, in one short transaction. Publishes of one process into one warehouse queue on
//! a lock (no busy retries between them); another process's write lock is waited for by
//! SQLite's busy handler, then while its holder gets somewhere (see [`super::busy`]). Inside the transaction, once the warehouse's write lock is held, the
//! caller's check asks the manifest whether this publish is still allowed: a frozen owner that
//! was taken over, or a publish that a recoverer already finished, is refused, so a stale
//! output never overwrites a newer one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use rusqlite::Connection;

use super::audit::{self, AuditFile};
use super::partition::{Repr, delete_partition};
use super::{Allowed, AskError, Error, Result, quote, retry_busy_noting, table_columns};
use crate::interval::DataInterval;
use crate::project::{SqlTask, Warehouse, WritePattern};

/// One lock per warehouse file: the publishes of this process take turns.
static LOCKS: LazyLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = LazyLock::new(Mutex::default);

fn lock_for(w: &Warehouse) -> Arc<Mutex<()>> {
    let mut locks = LOCKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(w.path.clone()).or_default().clone()
}

/// What to publish.
pub(crate) struct Publish<'a> {
    pub task: &'a SqlTask,
    pub interval: DataInterval,
    pub tz: chrono_tz::Tz,
    /// The partition column's representation; `None` when the table and output are empty and
    /// its declared type says nothing (every representation's range is then cleared).
    pub repr: Option<Repr>,
    /// The audited rows; `None` publishes an explicit empty partition.
    pub audit: Option<&'a AuditFile>,
    /// The fingerprint the gate saw, checked again before a recovered publish.
    pub expect_fingerprint: Option<&'a str>,
    /// Keep the rows being replaced, for rollback (see [`super::versions`]).
    pub keep: Option<super::versions::Keep>,
    /// What the gate judged that a merge does: a merge that does otherwise (the target
    /// changed since) fails, and nothing is published.
    pub planned: Option<crate::gate::Merge>,
    /// What the merge did, once it did it.
    pub merged: std::cell::Cell<Option<crate::gate::Merge>>,
    /// The temporary table that holds the audited rows, when they were copied out of the audit
    /// file (a publish of a group, see [`publish_group`]); `None`: the attached audit file's.
    pub rows_in: Option<String>,
}

impl Publish<'_> {
    /// The schema and table that hold the audited rows.
    fn rows_at(&self) -> (&str, &str) {
        match &self.rows_in {
            Some(table) => ("temp", table),
            None => ("audit", "rows"),
        }
    }

    /// Called when another process holds the warehouse's write lock past the busy timeout.
    fn note_wait(&self, waits: &mut u32) {
        *waits += 1;
        if *waits == 1 {
            tracing::info!(warehouse = %self.task.warehouse.name, target = %self.task.target, "the warehouse is locked by another writer; waiting");
        }
    }
}

/// Publishes into the warehouse: returns the rows inserted. `allowed` runs inside the
/// transaction, after the write lock is taken; when it says no, nothing changes and the result
/// is [`Error::Refused`]. Redoing a publish gives the same result.
pub(crate) fn publish(conn: &Connection, p: &Publish<'_>, allowed: &Allowed<'_>) -> Result<i64> {
    publish_noting(conn, p, allowed, &mut || {})
}

/// [`publish`], calling `waiting` each time another process's write lock was not released
/// within the busy timeout (the publish keeps waiting).
pub(crate) fn publish_noting(
    conn: &Connection,
    p: &Publish<'_>,
    allowed: &Allowed<'_>,
    waiting: &mut dyn FnMut(),
) -> Result<i64> {
    let w = &p.task.warehouse;
    if let Some(a) = p.audit {
        a.attach(conn)?;
    }
    let result = (|| {
        if let (Some(_), Some(expected)) = (p.audit, p.expect_fingerprint) {
            let (_, found) = audit::fingerprint(conn, audit::TABLE)?;
            if found != expected {
                return Err(Error::Message(format!(
                    "the audit file's rows (fingerprint {found}) are not the audited ones ({expected}); it was damaged"
                )));
            }
        }
        let lock = lock_for(w);
        let _turn = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut waits = 0;
        let mut noted = || {
            p.note_wait(&mut waits);
            waiting();
        };
        retry_busy_noting(w, None, &mut noted, || transaction(conn, p, allowed))
    })();
    if p.audit.is_some() {
        audit::detach(conn);
    }
    result.map_err(|e| e.at(w))
}

/// Publishes several outputs into one warehouse in one transaction (`promote --atomic`): all
/// of them, or none. Each output's rows are first copied out of its audit file into a
/// temporary table (SQLite attaches no file inside a transaction, and at most ten at once), its
/// fingerprint checked; then one transaction publishes every one as [`publish`] would, asking
/// `allowed` once the write lock is held. Returns each one's rows, in order; what a merge did is
/// in its [`Publish::merged`].
pub(crate) fn publish_group(
    conn: &Connection,
    group: &mut [Publish<'_>],
    allowed: &Allowed<'_>,
    waiting: &mut dyn FnMut(),
) -> Result<Vec<i64>> {
    let Some(first) = group.first() else {
        return Ok(Vec::new());
    };
    let w = first.task.warehouse.clone();
    let copied = copy_out(conn, group);
    let result =
        copied.and_then(|()| {
            let lock = lock_for(&w);
            let _turn = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut waits = 0;
            let mut noted = || {
                group[0].note_wait(&mut waits);
                waiting();
            };
            // Asked once: the transaction holds the write lock from its first statement on.
            let asked = std::cell::Cell::new(false);
            let once = || -> std::result::Result<bool, AskError> {
                if asked.get() {
                    return Ok(true);
                }
                let may = allowed()?;
                asked.set(may);
                Ok(may)
            };
            retry_busy_noting(&w, None, &mut noted, || {
                asked.set(false);
                immediate(conn, || {
                    let mut rows = Vec::with_capacity(group.len());
                    for p in group.iter() {
                        p.merged.set(None);
                        rows.push(publish_in(conn, p, &once).map_err(|e| {
                            e.of(&format!("`{}` for {}", p.task.target, p.interval))
                        })?);
                    }
                    Ok(rows)
                })
            })
        });
    for p in group.iter() {
        if let Some(table) = &p.rows_in {
            let _ = conn.execute_batch(&format!("DROP TABLE IF EXISTS temp.{}", quote(table)));
        }
    }
    result.map_err(|e| e.at(&w))
}

/// Copies each audited output of a group into a temporary table of its own, named in its
/// [`Publish::rows_in`], checking its fingerprint on the way.
fn copy_out(conn: &Connection, group: &mut [Publish<'_>]) -> Result<()> {
    for (i, p) in group.iter_mut().enumerate() {
        let Some(a) = p.audit else {
            continue;
        };
        let table = format!("backfill_group_{i}");
        a.attach(conn)?;
        let copied = (|| {
            if let Some(expected) = p.expect_fingerprint {
                let (_, found) = audit::fingerprint(conn, audit::TABLE)?;
                if found != expected {
                    return Err(Error::Message(format!(
                        "the audit file {}'s rows (fingerprint {found}) are not the audited ones ({expected}); it was damaged",
                        a.path.display()
                    )));
                }
            }
            conn.execute_batch(&format!(
                "DROP TABLE IF EXISTS temp.{t}; CREATE TEMP TABLE {t} AS SELECT * FROM {};",
                audit::TABLE,
                t = quote(&table)
            ))?;
            Ok(())
        })();
        audit::detach(conn);
        copied?;
        p.rows_in = Some(table);
    }
    Ok(())
}

fn transaction(conn: &Connection, p: &Publish<'_>, allowed: &Allowed<'_>) -> Result<i64> {
    // The write lock first: the transaction reads (the kept versions) before it writes.
    immediate(conn, || publish_in(conn, p, allowed))
}

/// Replaces (or merges into) the interval's rows, inside a transaction that holds the write
/// lock.
fn publish_in(conn: &Connection, p: &Publish<'_>, allowed: &Allowed<'_>) -> Result<i64> {
    if let Some(k) = p.keep {
        super::versions::keep(
            conn,
            p.task,
            p.repr,
            p.interval,
            p.tz,
            k,
            p.audit.map(|_| p.rows_at()),
            crate::clock::now_ms(),
        )?;
    }
    if let WritePattern::Merge { key, keep_missing } = &p.task.write {
        ask(allowed)?;
        return merge(conn, p, key, *keep_missing);
    }
    delete_partition(conn, p.task, p.repr, p.interval, p.tz).map_err(|e| match e {
        Error::Sql(e) => {
            super::merge::referenced(conn, &p.task.target, e, super::merge::REPLACE_DELETES)
        }
        e => e,
    })?;
    ask(allowed)?;
    let inserted = match p.audit {
        None => 0,
        Some(_) => {
            let (schema, rows) = p.rows_at();
            let columns = table_columns(conn, schema, rows)?;
            if columns.is_empty() {
                return Err(Error::Message("the audit file has no rows table".into()));
            }
            let list = columns
                .iter()
                .map(|c| quote(c))
                .collect::<Vec<_>>()
                .join(", ");
            conn.execute(
                &format!(
                    "INSERT INTO main.{} ({list}) SELECT {list} FROM {}.{}",
                    quote(&p.task.target),
                    quote(schema),
                    quote(rows)
                ),
                [],
            )
            .map_err(super::merge::refused_by_target)?
        }
    };
    Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
}

/// The merge of a publish (`write = "merge"`), in its transaction: returns the partition's rows
/// that came from the output. An explicit empty partition deletes the partition's rows (unless
/// `keep_missing`).
fn merge(conn: &Connection, p: &Publish<'_>, key: &[String], keep_missing: bool) -> Result<i64> {
    let task = p.task;
    if p.audit.is_none() {
        if !keep_missing {
            delete_partition(conn, task, p.repr, p.interval, p.tz).map_err(|e| match e {
                Error::Sql(e) => {
                    super::merge::referenced(conn, &task.target, e, super::merge::MERGE_DELETES)
                }
                e => e,
            })?;
        }
        return Ok(0);
    }
    let (schema, rows) = p.rows_at();
    let columns = table_columns(conn, schema, rows)?;
    let source = format!("{}.{}", quote(schema), quote(rows));
    let m = super::merge::Merging::new(
        &task.target,
        &source,
        &columns,
        key,
        &task.partition_column,
        (p.repr, p.interval, p.tz),
        keep_missing,
    );
    super::merge::index_source(conn, &m)?;
    if let Some(k) = p.keep.filter(|k| k.keep > 0) {
        // What it moves in from other partitions (`unique_key_scope = "table"`) goes back
        // there on a rollback.
        super::versions::keep_moved(conn, &m, k.by_try)?;
    }
    let done = super::merge::apply(conn, &m)?;
    if let Some(planned) = p.planned {
        let counts = |m: &crate::gate::Merge| [m.inserted, m.updated, m.deleted];
        if counts(&planned) != counts(&done) {
            return Err(Error::Message(format!(
                "the merge would have done {} where the gate judged {}: the target changed since it was audited; nothing was published",
                done.short(),
                planned.short()
            )));
        }
    }
    p.merged.set(Some(done));
    Ok(done.inserted + done.updated + done.unchanged)
}

/// Runs `f` in a transaction that takes the write lock first; commits what it did, or rolls
/// it back on an error.
fn immediate<T>(conn: &Connection, f: impl FnOnce() -> Result<T>) -> Result<T> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match f() {
        Ok(v) => {
            crate::fault::point("before-commit");
            conn.execute_batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Whether the rollback that puts back the version kept for `key` committed, judged under the
/// warehouse's write lock: an owner frozen inside its rollback transaction holds that lock, so
/// the answer waits until that transaction committed or its process is gone, and a rollback
/// judged as not committed can never commit afterwards. `allowed` is asked under the lock as
/// for a publish: [`Error::Refused`] when the rollback was settled by another process.
pub(crate) fn rollback_committed(
    conn: &Connection,
    task: &SqlTask,
    key: i64,
    allowed: &Allowed<'_>,
) -> Result<bool> {
    let w = &task.warehouse;
    let lock = lock_for(w);
    let _turn = lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut waits = 0;
    let mut noted = || {
        waits += 1;
        if waits == 1 {
            tracing::info!(warehouse = %w.name, target = %task.target, "the warehouse is locked by another writer; waiting before judging an interrupted rollback");
        }
    };
    let once = || -> Result<bool> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let judged = (|| {
            ask(allowed)?;
            Ok(super::versions::find(conn, &task.target, key)?.is_none())
        })();
        let _ = conn.execute_batch("ROLLBACK");
        judged
    };
    retry_busy_noting(w, None, &mut noted, once).map_err(|e| e.at(w))
}

/// Asks the manifest, inside the transaction, whether this publish may still happen.
fn ask(allowed: &Allowed<'_>) -> Result<()> {
    match allowed() {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Refused),
        Err(e) => Err(Error::Ask(e)),
    }
}

/// The rollback transaction: replaces the interval's rows by the kept version that the publish
/// of `key` replaced, and forgets that version (its rows are the partition again). `allowed`
/// is asked as for a publish. Returns the rows put back.
pub(crate) fn roll_back(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    key: i64,
    allowed: &Allowed<'_>,
) -> Result<i64> {
    let w = &task.warehouse;
    let lock = lock_for(w);
    let _turn = lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let once = || -> Result<i64> {
        immediate(conn, || {
            if super::versions::find(conn, &task.target, key)?.is_none() {
                return Err(Error::Message(format!(
                    "the version kept for try {key} is gone from {}",
                    task.target
                )));
            }
            if let WritePattern::Merge { key: columns, .. } = &task.write {
                ask(allowed)?;
                return super::versions::restore_merging(
                    conn,
                    task,
                    columns,
                    (repr, interval, tz),
                    key,
                );
            }
            delete_partition(conn, task, repr, interval, tz)?;
            ask(allowed)?;
            super::versions::restore(conn, task, key)
        })
    };
    retry_busy_noting(w, None, &mut || {}, once).map_err(|e| e.at(w))
}
