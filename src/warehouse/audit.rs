//! Audit files: each SQL try computes its rows into a table of its own small SQLite database,
//! attached to the warehouse connection as `audit`. Writing it takes no lock on the warehouse
//! (only a read snapshot), so tries audit in parallel; the same snapshot gives the source count,
//! so the two compare the same moment.
//!
//! The file is created in the audit folder next to the manifest and locked (`flock`) by the
//! process that uses it for as long as it does. A file whose lock is free belongs to a process
//! that died: [`sweep`] removes it unless the manifest still needs it to finish a publish.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use rusqlite::Connection;
use rusqlite::types::ValueRef;

use super::partition::{self, Classes, Repr};
use super::{Binds, Error, Result, quote, retry_busy, source_count_query, wrapped_query};
use crate::project::{Gate, SqlTask, WritePattern};

/// The table of an audit file that holds the try's rows.
pub(crate) const TABLE: &str = "audit.rows";

/// An audit file, locked by this process while it exists (unless it was found locked by a
/// frozen process and is only read, to finish that process's publish).
#[derive(Debug)]
pub struct AuditFile {
    pub path: PathBuf,
    lock: Option<File>,
}

impl AuditFile {
    /// Creates `dir/name` (which must not exist) and locks it. The file is created and locked
    /// under a name that carries this process's id (`.NAME.PID.new`), then renamed: a sweep
    /// never sees it unlocked under its final name, and removes a `.new` file only once its
    /// process is gone.
    pub fn create(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(name);
        let io = |source: std::io::Error| {
            let what = format!("audit file {}", path.display());
            match crate::environment::Fault::of_io(&source, &what, &path) {
                Some(fault) => Error::Environment(fault),
                None => Error::Audit {
                    path: path.clone(),
                    source,
                },
            }
        };
        crate::process::private_dir(dir).map_err(io)?;
        let fresh = dir.join(format!(".{name}.{}.new", std::process::id()));
        let lock = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&fresh)
            .map_err(io)?;
        let locked = lock
            .try_lock()
            .map_err(|e| io(std::io::Error::other(e.to_string())))
            .and_then(|()| std::fs::rename(&fresh, &path).map_err(io));
        if let Err(e) = locked {
            let _ = std::fs::remove_file(&fresh);
            return Err(e);
        }
        Ok(Self {
            path,
            lock: Some(lock),
        })
    }

    /// Opens an existing audit file left by a process that died, locking it; `None` when there
    /// is no such file or a live process holds it.
    pub(crate) fn adopt(path: &Path) -> Option<Self> {
        let lock = File::options().write(true).open(path).ok()?;
        lock.try_lock().ok()?;
        Some(Self {
            path: path.to_path_buf(),
            lock: Some(lock),
        })
    }

    /// An existing audit file, to finish the publish of an owner that was taken over: locked
    /// when its owner is dead, only read when the owner is frozen and still holds it. `None`
    /// when it does not exist.
    pub(crate) fn existing(path: &Path) -> Option<Self> {
        if !path.is_file() {
            return None;
        }
        Some(Self::adopt(path).unwrap_or_else(|| Self {
            path: path.to_path_buf(),
            lock: None,
        }))
    }

    /// Attaches the file to a warehouse connection as `batch` (a batch's rows, see
    /// [`write_batch`]), as [`AuditFile::attach`] does as `audit`.
    pub(crate) fn attach_batch(&self, conn: &Connection) -> Result<()> {
        self.attach_as(conn, "batch")
    }

    /// Attaches the file to a warehouse connection as `audit`, as a scratch database: no
    /// journal, no syncs (a crash before the publish intent throws it away; after it, the
    /// publish checks the recorded fingerprint first).
    pub fn attach(&self, conn: &Connection) -> Result<()> {
        self.attach_as(conn, "audit")
    }

    fn attach_as(&self, conn: &Connection, schema: &'static str) -> Result<()> {
        // `mode=rw`: a file that is gone (removed by whoever finished its publish) is an error,
        // never silently created empty.
        conn.execute(
            &format!("ATTACH DATABASE ?1 AS {schema}"),
            [uri(&self.path)],
        )
        .map_err(|e| {
            // Why it could not be opened is in errno now, and nowhere later.
            let errno = crate::environment::last_errno();
            let what = format!("{schema} file {}", self.path.display());
            match crate::environment::Fault::of_sqlite_errno(&e, &what, &self.path, errno) {
                Some(fault) => Error::Environment(fault),
                None => Error::Sql(e),
            }
        })?;
        // Private to this process: no other connection ever opens it while it is attached, so
        // it is locked once (no lock calls per transaction) and its page cache stays valid.
        conn.execute_batch(&format!(
            "PRAGMA {schema}.journal_mode = OFF; PRAGMA {schema}.synchronous = OFF; \
             PRAGMA {schema}.locking_mode = EXCLUSIVE;"
        ))?;
        Ok(())
    }

    /// Lets go of the file without removing it: whoever finishes its publish (or the sweep, once
    /// the manifest no longer needs it) removes it.
    pub(crate) fn keep(self) {
        drop(self.lock);
    }

    /// Removes the file; the lock goes with it.
    pub(crate) fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.lock);
    }
}

/// A `file:` URI for SQLite that opens an existing file for reading and writing only.
pub(crate) fn uri(path: &Path) -> String {
    let mut out = String::from("file:");
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => {
                out.push(char::from(*b));
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out.push_str("?mode=rw");
    out
}

/// An error met writing the audit or batch file at `path` (`what` names its kind) on a
/// warehouse connection, as an environment fault of that file when it is one (a full disk is
/// the file's, not the warehouse's); otherwise as it was.
pub(crate) fn fault_of(e: Error, what: &str, path: &Path) -> Error {
    let fault = match &e {
        Error::Sql(source) | Error::Db { source, .. } => crate::environment::Fault::of_sqlite(
            source,
            &format!("{what} {}", path.display()),
            path,
        ),
        _ => None,
    };
    fault.map_or(e, Error::Environment)
}

/// Detaches the audit file from a connection, if attached.
pub(crate) fn detach(conn: &Connection) {
    let _ = conn.execute_batch("DETACH DATABASE audit");
}

/// Detaches a batch file from a connection, if attached.
pub(crate) fn detach_batch(conn: &Connection) {
    let _ = conn.execute_batch("DETACH DATABASE batch");
}

/// The name of a new batch file of this process.
pub(crate) fn batch_file() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("batch-{}-{n}.db", std::process::id())
}

/// What the gate needs to know about a try's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditMeasures {
    pub rows: i64,
    /// Rows whose partition value lies outside the interval (NULL included), or is not of the
    /// column's representation.
    pub outside: i64,
    /// A few distinct partition values outside the interval, for the gate's message (see
    /// [`crate::gate::Measures::outside_values`]).
    pub outside_values: Vec<String>,
    pub duplicate_keys: Option<i64>,
    pub fingerprint: String,
    /// The representation of the output's partition values (`None` when it has no rows).
    pub repr: Option<Repr>,
    /// The output mixes representations: why.
    pub mixed: Option<String>,
    pub source: Option<i64>,
    /// What the gate's `source_fingerprint` query gave, from the same snapshot.
    pub source_fingerprint: Option<String>,
    /// With `unique_key_scope = "table"`: a key of the output that another partition of the
    /// target holds, and that partition, as a message shows them.
    pub elsewhere: Option<String>,
    /// The target's own constraint refused the output (a primary key, a unique constraint or
    /// index, a check): the database's message. The output was then measured apart from the
    /// target, whose partition is untouched.
    pub constraint: Option<String>,
    /// What each rule on the output's values found (all but a command task's checks).
    pub found: Vec<crate::gate::Found>,
    /// With `write = "merge"`: what the merge would do to the partition.
    pub merge: Option<crate::gate::Merge>,
}

/// Computes the task's rows for the interval into the attached audit file, then measures them
/// and counts the source, all from one read snapshot of the warehouse. `repr` is the partition
/// column's representation, when known; otherwise the output's decides.
pub(crate) fn write_and_measure(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    repr: Option<Repr>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    cancel: Option<&AtomicBool>,
) -> Result<AuditMeasures> {
    retry_busy(&task.warehouse, cancel, || {
        in_transaction(conn, || {
            let mut stmt = conn.prepare(&format!(
                "CREATE TABLE {TABLE} AS {}",
                wrapped_query(&task.sql)
            ))?;
            binds.bind(&mut stmt)?;
            // A stop whose interrupt came while no statement ran was ignored by SQLite (an
            // interrupt reaches only the statements running then): the flag says so.
            if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst)) {
                return Err(Error::Cancelled);
            }
            stmt.raw_execute()?;
            drop(stmt);
            // The tests freeze here and change the source: the count must not see it.
            crate::fault::point("before-source-count");
            let looked = look(conn, gate, binds)?;
            judge_measures(conn, task, gate, repr, binds, tz, looked)
        })
    })
}

/// Measures the rows of the attached audit file and runs the gate's rules on them.
fn judge_measures(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    repr: Option<Repr>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    looked: Looked,
) -> Result<AuditMeasures> {
    let mut m = measure(conn, task, gate, repr, binds, tz, looked.source)?;
    m.source_fingerprint = looked.source_fingerprint;
    if let Some(g) = gate.filter(|g| !g.rules.is_empty()) {
        let mut engine = SqliteRules {
            conn,
            binds,
            output: format!("SELECT * FROM {TABLE}"),
        };
        m.found = super::rules::run(&mut engine, g, m.rows, &shown_columns(task, g), None)?;
    }
    Ok(m)
}

/// Runs the gate's `source_count` and `source_fingerprint` queries for one interval, in the
/// connection's snapshot.
pub(crate) fn look(conn: &Connection, gate: Option<&Gate>, binds: &Binds) -> Result<Looked> {
    let source = match gate.and_then(|g| g.source_count.as_ref()) {
        Some(crate::project::SourceCount::Sql(q)) => Some(source_count(conn, q, binds)?),
        _ => None,
    };
    let source_fingerprint = match gate.and_then(|g| g.source_fingerprint.as_ref()) {
        Some(crate::project::SourceCount::Sql(q)) => Some(source_value(conn, q, binds)?),
        _ => None,
    };
    Ok(Looked {
        source,
        source_fingerprint,
    })
}

/// What the gate's source queries gave one interval, from the read snapshot of its rows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Looked {
    pub source: Option<i64>,
    pub source_fingerprint: Option<String>,
}

/// The table of a batch file (attached as `batch`) that holds a batch's rows, and its column
/// that says which interval of the batch each row belongs to: its index, or -1 for a row that
/// belongs to none (its partition value lies outside the batch, is NULL or of no known
/// representation), which fails the batch (see [`stray_rows`]).
const BATCH_ROWS: &str = "batch.rows";
const PART: &str = "backfill batch part";
const PART_FUNCTION: &str = "backfill_batch_part";

/// Computes the task's rows for a batch of consecutive intervals with one query (bound to the
/// batch's whole range, `whole`) into the attached batch file, assigns each row to its interval
/// by its partition value (as [`measure`] counts a row inside an interval), and runs the gate's
/// source queries for each interval (`parts`), all from one read snapshot of the warehouse.
pub(crate) fn write_batch(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    whole: &Binds,
    parts: &[Binds],
    tz: chrono_tz::Tz,
    cancel: Option<&AtomicBool>,
) -> Result<Vec<Looked>> {
    let bounds: Vec<[(rusqlite::types::Value, rusqlite::types::Value); 4]> = parts
        .iter()
        .map(|b| Repr::ALL.map(|r| r.bounds(b.interval, tz)))
        .collect();
    let last = std::sync::atomic::AtomicUsize::new(0);
    conn.create_scalar_function(
        PART_FUNCTION,
        1,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8
            | rusqlite::functions::FunctionFlags::SQLITE_DETERMINISTIC,
        move |ctx| {
            let v = ctx.get_raw(0);
            let partition::Class::Of(of) = partition::classify(v) else {
                return Ok(-1i64);
            };
            let Some(i) = Repr::ALL.iter().position(|x| *x == of) else {
                return Ok(-1);
            };
            // Rows come mostly in runs of one interval: the last one found is tried first.
            let inside = |k: usize| of.contains(v, &bounds[k][i].0, &bounds[k][i].1);
            let hint = last.load(std::sync::atomic::Ordering::Relaxed);
            if hint < bounds.len() && inside(hint) {
                return Ok(hint as i64);
            }
            match (0..bounds.len()).find(|&k| inside(k)) {
                Some(k) => {
                    last.store(k, std::sync::atomic::Ordering::Relaxed);
                    Ok(k as i64)
                }
                None => Ok(-1),
            }
        },
    )?;
    let looked = retry_busy(&task.warehouse, cancel, || {
        in_transaction(conn, || {
            let mut stmt = conn.prepare(&format!(
                "CREATE TABLE {BATCH_ROWS} AS SELECT q.*, {PART_FUNCTION}(q.{column}) AS {part} FROM ({query}) AS q",
                column = quote(&task.partition_column),
                part = quote(PART),
                query = wrapped_query(&task.sql),
            ))?;
            whole.bind(&mut stmt)?;
            if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst)) {
                return Err(Error::Cancelled);
            }
            stmt.raw_execute()?;
            drop(stmt);
            conn.execute_batch(&format!(
                "CREATE INDEX batch.rows_part ON rows ({})",
                quote(PART)
            ))?;
            let strays: i64 = conn.query_row(
                &format!(
                    "SELECT COUNT(*) FROM {BATCH_ROWS} WHERE {} = -1",
                    quote(PART)
                ),
                [],
                |r| r.get(0),
            )?;
            if strays > 0 {
                return Err(Error::Message(stray_rows(strays, &task.partition_column)));
            }
            let looked = parts
                .iter()
                .map(|binds| look(conn, gate, binds))
                .collect::<Result<Vec<_>>>()?;
            Ok(looked)
        })
    });
    let _ = conn.remove_function(PART_FUNCTION, 1);
    looked
}

/// Why a batch whose output has rows of none of its intervals fails (it is then split, so that
/// the gate judges the interval whose own query makes them).
pub(crate) fn stray_rows(n: i64, column: &str) -> String {
    format!(
        "{n} {} of the batch's output {} in none of its intervals (`{column}` outside the batch, NULL or not a date or timestamp)",
        if n == 1 { "row" } else { "rows" },
        if n == 1 { "lies" } else { "lie" }
    )
}

/// Copies interval `k`'s share of the attached batch file (its rows, and the rows of no
/// interval) into the attached audit file, then measures and judges it as
/// [`write_and_measure`] does, with what the batch's snapshot gave its source queries.
#[expect(
    clippy::too_many_arguments,
    reason = "the try's parts as `write_and_measure` takes them, and its share of the batch"
)]
pub(crate) fn write_share(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    repr: Option<Repr>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    k: usize,
    looked: Looked,
) -> Result<AuditMeasures> {
    in_transaction(conn, || {
        let columns = {
            let stmt = conn.prepare(&format!("SELECT * FROM {BATCH_ROWS}"))?;
            stmt.column_names()
                .filter(|c| *c != PART)
                .map(quote)
                .collect::<Vec<_>>()
                .join(", ")
        };
        conn.execute(
            &format!(
                "CREATE TABLE {TABLE} AS SELECT {columns} FROM {BATCH_ROWS} WHERE {part} IN (?1, -1)",
                part = quote(PART)
            ),
            [k as i64],
        )?;
        judge_measures(conn, task, gate, repr, binds, tz, looked)
    })
}

/// Runs `f` in a transaction of `conn`: committed when it succeeds, rolled back otherwise.
fn in_transaction<T>(conn: &Connection, f: impl FnOnce() -> Result<T>) -> Result<T> {
    conn.execute_batch("BEGIN")?;
    match f() {
        Ok(v) => {
            conn.execute_batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Runs a `source_count` query: one integer.
pub(crate) fn source_count(conn: &Connection, sql: &str, binds: &Binds) -> Result<i64> {
    let mut stmt = conn.prepare(&source_count_query(sql))?;
    binds.bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    match rows.next()? {
        Some(row) => match row.get_ref(0)? {
            ValueRef::Integer(n) => Ok(n),
            ValueRef::Null => Err(Error::Message(
                "gate.source_count returned NULL; it must return one integer".into(),
            )),
            other => Err(Error::Message(format!(
                "gate.source_count returned {}, not an integer",
                describe(other)
            ))),
        },
        None => Err(Error::Message(
            "gate.source_count returned no row; it must return one integer".into(),
        )),
    }
}

/// Runs a `source_fingerprint` query: its one value, as text (NULL as `NULL`, a blob in hex).
pub(crate) fn source_value(conn: &Connection, sql: &str, binds: &Binds) -> Result<String> {
    let mut stmt = conn.prepare(&source_count_query(sql))?;
    binds.bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    match rows.next()? {
        Some(row) => Ok(match row.get_ref(0)? {
            ValueRef::Null => "NULL".into(),
            ValueRef::Integer(i) => i.to_string(),
            ValueRef::Real(f) => f.to_string(),
            ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
            ValueRef::Blob(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
        }),
        None => Err(Error::Message(
            "gate.source_fingerprint returned no row; it must return one value".into(),
        )),
    }
}

fn describe(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => format!("'{}'", String::from_utf8_lossy(t)),
        ValueRef::Blob(_) => "a blob".into(),
    }
}

/// Measures the audited rows: count, fingerprint, the representation of their partition values
/// and how many lie outside the interval, in one pass; then duplicate keys.
pub fn measure(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    repr: Option<Repr>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    source: Option<i64>,
) -> Result<AuditMeasures> {
    let scan = Scan::of(conn, task, gate, binds, tz)?;
    let (repr, mixed) = representation(repr, &scan.found, task);
    let inside = match repr {
        Some(r) if mixed.is_none() => Repr::ALL
            .iter()
            .position(|x| *x == r)
            .map_or(0, |i| scan.inside[i]),
        _ => 0,
    };
    let duplicate_keys = duplicate_keys(conn, gate, scan.key_collision)?;
    let rows = scan.rows;
    let outside = rows - inside;
    let mut outside_values = scan.outside_values;
    if outside == 0 {
        outside_values.clear();
    }
    let merge =
        match (&task.write, gate) {
            (WritePattern::Merge { keep_missing, .. }, Some(g)) if mixed.is_none() => Some(
                merge_plan(conn, task, g, (repr, binds.interval, tz), *keep_missing)?,
            ),
            _ => None,
        };
    let elsewhere = match (gate, repr) {
        (Some(g), Some(r)) if task.write.looks_elsewhere(g) && rows > 0 => {
            key_elsewhere(conn, task, &g.unique_key, r, binds, tz)?
        }
        _ => None,
    };
    Ok(AuditMeasures {
        rows,
        outside,
        outside_values,
        duplicate_keys,
        fingerprint: scan.fingerprint,
        repr,
        mixed,
        source,
        source_fingerprint: None,
        elsewhere,
        constraint: None,
        found: Vec::new(),
        merge,
    })
}

/// What one pass over the audited rows found.
#[derive(Default)]
struct Scan {
    rows: i64,
    fingerprint: String,
    /// The rows inside the interval, by representation (in the order of [`Repr::ALL`]).
    inside: [i64; 4],
    /// Values outside the interval of their own representation: when the output holds one
    /// representation (else the gate rejects it as mixed), those of the rows counted outside.
    outside_values: Vec<String>,
    /// The representations of the partition values.
    found: Classes,
    /// Two rows' keys hashed alike: only then does SQL count the duplicates exactly.
    key_collision: bool,
}

impl Scan {
    /// Reads the audited rows once: hashes them, hashes their keys, and places their
    /// partition values inside or outside the interval.
    fn of(
        conn: &Connection,
        task: &SqlTask,
        gate: Option<&Gate>,
        binds: &Binds,
        tz: chrono_tz::Tz,
    ) -> Result<Self> {
        let bounds = Repr::ALL.map(|r| r.bounds(binds.interval, tz));
        let mut scan = Self::default();
        let mut stmt = conn.prepare(&format!("SELECT * FROM {TABLE}"))?;
        let column = stmt
            .column_names()
            .position(|c| c == task.partition_column)
            .ok_or_else(|| {
                Error::Message(format!(
                    "the output has no column `{}`",
                    task.partition_column
                ))
            })?;
        let names: Vec<String> = stmt.column_names().map(String::from).collect();
        let key: Vec<usize> = gate
            .map(|g| {
                g.unique_key
                    .iter()
                    .filter_map(|k| names.iter().position(|c| c == k))
                    .collect()
            })
            .unwrap_or_default();
        // Keys are hashed on the way; only when two hashes meet does SQL count exactly.
        let mut keys: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut hasher = Fingerprint::default();
        let n = stmt.column_count();
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            hasher.add_row(r, n)?;
            if !key.is_empty() && !scan.key_collision {
                scan.key_collision = !keys.insert(key_hash(r, &key)?);
            }
            scan.place(r.get_ref(column)?, &bounds);
        }
        drop(rows);
        drop(stmt);
        (scan.rows, scan.fingerprint) = hasher.finish();
        Ok(scan)
    }

    /// Counts partition value `v` inside the interval (`bounds`, by representation) when it
    /// lies there in its own representation; else shows it among the values outside.
    fn place(
        &mut self,
        v: ValueRef<'_>,
        bounds: &[(rusqlite::types::Value, rusqlite::types::Value); 4],
    ) {
        let class = partition::classify(v);
        self.found.add_class(class, || partition::show(v));
        if let partition::Class::Of(of) = class
            && let Some(i) = Repr::ALL.iter().position(|x| *x == of)
            && of.contains(v, &bounds[i].0, &bounds[i].1)
        {
            self.inside[i] += 1;
        } else if self.outside_values.len() <= crate::gate::SHOWN {
            let shown = partition::show_short(v);
            if !self.outside_values.contains(&shown) {
                self.outside_values.push(shown);
            }
        }
    }
}

/// The hash of row `r`'s key (its columns `key`), as GROUP BY compares: 1 and 1.0 are one key.
fn key_hash(r: &rusqlite::Row<'_>, key: &[usize]) -> Result<u64> {
    let mut h = Fnv::new();
    for &i in key {
        match r.get_ref(i)? {
            ValueRef::Real(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                hash_value(&mut h, ValueRef::Integer(f as i64));
            }
            v => hash_value(&mut h, v),
        }
    }
    Ok(h.0)
}

/// The representation of the output's partition values (`repr`, the partition column's, when
/// known), and why the output mixes representations when it does.
fn representation(
    repr: Option<Repr>,
    found: &Classes,
    task: &SqlTask,
) -> (Option<Repr>, Option<String>) {
    match (repr, found.reprs.as_slice(), &found.other) {
        (_, _, Some(_)) => (repr, Some(partition::describe_mix(found))),
        (Some(r), [], None) => (Some(r), None),
        (None, [], None) => (None, None),
        (Some(r), [one], None) if *one == r => (Some(r), None),
        (None, [one], None) => (Some(*one), None),
        (Some(r), _, None) => (
            Some(r),
            Some(format!(
                "{}, while the target's `{}` holds {r}",
                partition::describe_mix(found),
                task.partition_column
            )),
        ),
        (None, _, None) => (None, Some(partition::describe_mix(found))),
    }
}

/// How many values of the gate's unique key occur more than once: none when no two keys'
/// hashes met (`collision`), else counted by SQL.
fn duplicate_keys(conn: &Connection, gate: Option<&Gate>, collision: bool) -> Result<Option<i64>> {
    Ok(match gate {
        Some(g) if !g.unique_key.is_empty() && !collision => Some(0),
        Some(g) if !g.unique_key.is_empty() => {
            let key = g
                .unique_key
                .iter()
                .map(|k| quote(k))
                .collect::<Vec<_>>()
                .join(", ");
            Some(conn.query_row(
                &format!(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM {TABLE} GROUP BY {key} HAVING COUNT(*) > 1)"
                ),
                [],
                |r| r.get(0),
            )?)
        }
        _ => None,
    })
}

/// What a merge of the audited rows into the target's partition would do (`write = "merge"`),
/// by the gate's key.
fn merge_plan(
    conn: &Connection,
    task: &SqlTask,
    g: &Gate,
    partition: (Option<Repr>, crate::interval::DataInterval, chrono_tz::Tz),
    keep_missing: bool,
) -> Result<crate::gate::Merge> {
    let columns = super::table_columns(conn, "audit", "rows")?;
    let m = super::merge::Merging::new(
        &task.target,
        TABLE,
        &columns,
        &g.unique_key,
        &task.partition_column,
        partition,
        keep_missing,
    );
    super::merge::index_source(conn, &m)?;
    let mut plan = super::merge::plan(conn, &m)?;
    if g.unique_key_table {
        plan.moved = super::merge::moved(conn, &m)?;
    }
    Ok(plan)
}

/// The rules of the SQLite warehouse: `output` is the audit file's table, and a check binds
/// the interval's named parameters itself.
pub struct SqliteRules<'a> {
    pub conn: &'a Connection,
    pub binds: &'a Binds,
    /// What `output` is: the audited rows (or, for `dags validate`, a query of the same shape).
    pub output: String,
}

impl SqliteRules<'_> {
    fn statement(&self, body: &str) -> Result<rusqlite::Statement<'_>> {
        let mut stmt = self
            .conn
            .prepare(&format!("WITH output AS ({}){body}", self.output))?;
        self.binds.bind(&mut stmt)?;
        Ok(stmt)
    }
}

impl super::rules::Engine for SqliteRules<'_> {
    type Error = Error;

    fn dialect(&self) -> crate::query::Dialect {
        crate::query::Dialect::Sqlite
    }

    fn texts_undone(&mut self, body: &str) -> Result<Vec<Vec<Option<String>>>> {
        self.conn.execute_batch("SAVEPOINT backfill_check")?;
        let rows = self.texts(body);
        // Undone whatever the statement did, and the savepoint released, also after a failure.
        let undone = self
            .conn
            .execute_batch("ROLLBACK TO backfill_check; RELEASE backfill_check");
        let rows = rows?;
        undone?;
        Ok(rows)
    }

    fn check(&mut self, sql: &str) -> Result<String> {
        Ok(sql.to_string())
    }

    fn texts(&mut self, body: &str) -> Result<Vec<Vec<Option<String>>>> {
        let mut stmt = self.statement(body)?;
        let n = stmt.column_count();
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => None,
                    ValueRef::Integer(v) => Some(v.to_string()),
                    ValueRef::Real(v) => Some(v.to_string()),
                    ValueRef::Text(t) | ValueRef::Blob(t) => {
                        Some(String::from_utf8_lossy(t).into_owned())
                    }
                });
            }
            out.push(row);
        }
        Ok(out)
    }

    fn columns(&mut self, body: &str) -> Result<Vec<String>> {
        let stmt = self.statement(body)?;
        Ok(stmt.column_names().map(String::from).collect())
    }
}

/// The columns a rule's sample rows are shown by: the unique key, or the partition column.
pub(crate) fn shown_columns(task: &SqlTask, gate: &Gate) -> Vec<String> {
    if gate.unique_key.is_empty() {
        vec![task.partition_column.clone()]
    } else {
        gate.unique_key.clone()
    }
}

/// A key of the audited rows that a partition of the target other than the interval's holds
/// (`unique_key_scope = "table"`), with that partition, as the gate's message shows them. Each
/// key is looked up through an index of the target that starts with the key's columns (the
/// dry run made sure there is one), never by scanning the table.
fn key_elsewhere(
    conn: &Connection,
    task: &SqlTask,
    key: &[String],
    repr: Repr,
    binds: &Binds,
    tz: chrono_tz::Tz,
) -> Result<Option<String>> {
    let cols = |prefix: &str| {
        key.iter()
            .map(|k| format!("{prefix}{}", quote(k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let shown = key
        .iter()
        .map(|k| format!("quote(t.{})", quote(k)))
        .collect::<Vec<_>>()
        .join(" || ', ' || ");
    let pc = format!("t.{}", quote(&task.partition_column));
    let sql = format!(
        "SELECT '(' || {shown} || ') in partition ' || quote({pc}) FROM main.{table} t \
         WHERE ({tcols}) IN (SELECT {acols} FROM {TABLE}) AND NOT ({range}) LIMIT 1",
        table = quote(&task.target),
        tcols = cols("t."),
        acols = cols(""),
        range = repr
            .predicate(&format!("t.{}", task.partition_column), 1)
            .replace(&format!("\"t.{}\"", task.partition_column), &pc),
    );
    let (lo, hi) = repr.bounds(binds.interval, tz);
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(rusqlite::params![lo, hi])?;
    Ok(match rows.next()? {
        Some(r) => Some(r.get(0)?),
        None => None,
    })
}

/// Row count and an order-independent fingerprint of a table: the wrapping sum of a 64-bit
/// FNV-1a hash of each row's typed values, in hex.
pub(crate) fn fingerprint(conn: &Connection, table: &str) -> Result<(i64, String)> {
    let mut stmt = conn.prepare(&format!("SELECT * FROM {table}"))?;
    fingerprint_rows(&mut stmt, [])
}

/// Row count and fingerprint of the rows of a statement.
pub(crate) fn fingerprint_rows(
    stmt: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
) -> Result<(i64, String)> {
    let n = stmt.column_count();
    let mut rows = stmt.query(params)?;
    let mut f = Fingerprint::default();
    while let Some(r) = rows.next()? {
        f.add_row(r, n)?;
    }
    Ok(f.finish())
}

/// The order-independent fingerprint of rows, built one row at a time.
#[derive(Default)]
struct Fingerprint {
    count: i64,
    sum: u64,
}

impl Fingerprint {
    fn add_row(&mut self, r: &rusqlite::Row<'_>, columns: usize) -> Result<()> {
        let mut h = Fnv::new();
        for i in 0..columns {
            hash_value(&mut h, r.get_ref(i)?);
        }
        self.sum = self.sum.wrapping_add(h.0);
        self.count += 1;
        Ok(())
    }

    fn finish(&self) -> (i64, String) {
        (self.count, format!("{:016x}", self.sum))
    }
}

/// Feeds one typed value to a hash.
fn hash_value(h: &mut Fnv, v: ValueRef<'_>) {
    match v {
        ValueRef::Null => h.write(&[0]),
        ValueRef::Integer(v) => {
            h.write(&[1]);
            h.write(&v.to_le_bytes());
        }
        ValueRef::Real(v) => {
            h.write(&[2]);
            h.write(&v.to_bits().to_le_bytes());
        }
        ValueRef::Text(t) => {
            h.write(&[3]);
            h.write(&(t.len() as u64).to_le_bytes());
            h.write(t);
        }
        ValueRef::Blob(b) => {
            h.write(&[4]);
            h.write(&(b.len() as u64).to_le_bytes());
            h.write(b);
        }
    }
}

/// 64-bit FNV-1a: tiny, stable across versions and platforms.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The audit file name of a try.
pub(crate) fn try_file(try_id: i64) -> String {
    format!("try-{try_id}.db")
}

/// The try an audit file belongs to, from its name.
pub(crate) fn try_of(name: &str) -> Option<i64> {
    name.strip_prefix("try-")?.strip_suffix(".db")?.parse().ok()
}

/// Removes the audit files of the folder that no live process holds and that `keep` does not
/// name (`keep` gets the try id of a try's file, `None` for other files such as a `verify`
/// pass's). Returns how many were removed.
pub(crate) fn sweep(dir: &Path, keep: &dyn Fn(Option<i64>) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(std::result::Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name
            .strip_suffix(".new")
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(_, pid)| pid.parse::<i64>().ok())
        {
            // A file still being created: its creator's, until that process is gone.
            if !crate::process::pid_alive(pid) {
                let _ = std::fs::remove_file(entry.path());
                removed += 1;
            }
            continue;
        }
        if !name.ends_with(".db") {
            // SQLite's side files of an attached audit database go with it.
            continue;
        }
        if keep(try_of(&name)) {
            continue;
        }
        if let Some(file) = AuditFile::adopt(&entry.path()) {
            for suffix in ["-journal", "-wal", "-shm"] {
                let _ = std::fs::remove_file(dir.join(format!("{name}{suffix}")));
            }
            file.remove();
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_row_order_and_see_every_value() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE a (x, y); INSERT INTO a VALUES (1, 'p'), (2, 'q'), (3, NULL);
             CREATE TABLE b (x, y); INSERT INTO b VALUES (3, NULL), (1, 'p'), (2, 'q');
             CREATE TABLE c (x, y); INSERT INTO c VALUES (1, 'p'), (2, 'q'), (3, 'r');",
        )
        .unwrap();
        let (na, fa) = fingerprint(&conn, "a").unwrap();
        let (nb, fb) = fingerprint(&conn, "b").unwrap();
        let (_, fc) = fingerprint(&conn, "c").unwrap();
        assert_eq!((na, &fa), (nb, &fb));
        assert_ne!(fa, fc);
    }

    #[test]
    fn a_removed_audit_file_is_never_created_again_empty() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a dir with spaces?#%");
        let file = AuditFile::create(&odd, &try_file(7)).unwrap();
        let conn = Connection::open_in_memory().unwrap();
        file.attach(&conn).unwrap();
        conn.execute_batch("CREATE TABLE audit.rows AS SELECT 1 AS x")
            .unwrap();
        detach(&conn);
        let path = file.path.clone();
        std::fs::remove_file(&path).unwrap();
        assert!(file.attach(&conn).is_err());
        assert!(!path.exists());
    }

    #[test]
    fn the_sweep_removes_only_unlocked_files_it_may() {
        let dir = tempfile::tempdir().unwrap();
        let held = AuditFile::create(dir.path(), &try_file(1)).unwrap();
        std::fs::write(dir.path().join(try_file(2)), "").unwrap();
        std::fs::write(dir.path().join(try_file(3)), "").unwrap();
        std::fs::write(dir.path().join("verify-99-1.db"), "").unwrap();
        let dead = format!(".{}.{}.new", try_file(4), i32::MAX);
        let creating = format!(".{}.{}.new", try_file(5), std::process::id());
        std::fs::write(dir.path().join(&dead), "").unwrap();
        std::fs::write(dir.path().join(&creating), "").unwrap();
        let removed = sweep(dir.path(), &|t| t == Some(3));
        assert_eq!(removed, 3);
        assert!(!dir.path().join(dead).exists(), "its creator is gone");
        assert!(dir.path().join(creating).exists(), "its creator is alive");
        assert!(held.path.exists(), "a file in use is kept");
        assert!(!dir.path().join(try_file(2)).exists());
        assert!(
            dir.path().join(try_file(3)).exists(),
            "a pending publish keeps its file"
        );
        assert!(!dir.path().join("verify-99-1.db").exists());
    }
}
