//! The PostgreSQL warehouse: write-audit-publish in one transaction per try.
//!
//! A try opens a REPEATABLE READ transaction, deletes the interval's rows of the target (a range
//! on the partition column that its index serves), inserts the query's rows and measures them
//! in the same statement, then counts the source: all from one snapshot, and nothing is visible
//! to readers until the commit. The gate judges; the runner records its decision in the
//! manifest; the publish then, still in the same transaction, takes the row lock of the
//! partition in `backfill.partitions`, asks the manifest whether this try may still publish,
//! books the publish in `backfill.publishes` (the manifest and try ids) and commits. A rejected
//! or stopped try rolls back; a crash before the commit is rolled back by the server. Whether a
//! publish committed is known after any crash from `backfill.publishes`, read under the same
//! row lock so that "not committed" stays true once said (see [`settle_publish`]).
//!
//! Interval values are always bound, typed (`timestamptz`, `date`, `text`); the names spliced
//! into statements (target, columns) are quoted identifiers checked when the DAG was loaded.

pub mod conn;
pub mod params;
pub mod versions;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use tokio_postgres::error::{ErrorPosition, SqlState};
use tokio_postgres::types::{ToSql, Type};

use self::conn::Conn;
use self::params::{Param, positional_from};
use super::backend::{Allowed, Backend, InManifest, Pending, PublishAs, Write};
use super::partition::Repr;
use super::{AuditMeasures, Binds, Cancel, Error, Result, TaskProblem, strip};
use crate::gate::SHOWN;
use crate::interval::DataInterval;
use crate::project::{Gate, SourceCount, SqlTask, Warehouse};

/// How many times a try's transaction is redone after a serialization failure or a deadlock
/// that the server reported.
const RETRIES: u32 = 5;

/// The PostgreSQL backend.
pub struct Postgres;

/// A PostgreSQL error as a person reads it: the server's message, detail, hint and SQLSTATE,
/// or what failed on the way to the server.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{}: {}", db.severity(), db.message());
        if let Some(d) = db.detail() {
            let _ = write!(s, "; {d}");
        }
        if let Some(h) = db.hint() {
            let _ = write!(s, " (hint: {h})");
        }
        let _ = write!(s, " [SQLSTATE {}]", db.code().code());
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(s, ": {cause}");
        source = cause.source();
    }
    s
}

/// Turns a driver error into the warehouse's, naming the warehouse.
fn pg(w: &Warehouse) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |e| {
        if e.code() == Some(&SqlState::QUERY_CANCELED) && !is_statement_timeout(&e) {
            return Error::Cancelled;
        }
        Error::Message(describe(&e)).at(w)
    }
}

fn is_statement_timeout(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| d.message().contains("statement timeout"))
}

/// Whether the server asks for the transaction to be run again.
fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// `name` quoted for PostgreSQL; `schema.table` quoted part by part.
pub fn quote_name(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// A column's name quoted for PostgreSQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The fingerprint of the rows of `from`, as SQL, given their [`row_hash`] (a try's statement
/// computes the same in its one pass over its output): the row count and the exact sum of a
/// 64-bit hash of each row, so that the order of the rows does not matter (summed as `int8`,
/// which PostgreSQL adds up in 128 bits: no overflow, and several times faster than a
/// `numeric` sum).
fn fingerprint_sql(row_hash: &str, from: &str) -> String {
    format!("(SELECT count(*)::text || ':' || coalesce(sum({row_hash}), 0)::text FROM {from})")
}

/// The 64-bit hash of one row over its columns, by name and type (as `format_type` or the
/// protocol names it), which fingerprints sum: each column's value hashed with a seed of its
/// own (its place), combined by `#` (xor). Integers, booleans, `uuid`s and timestamps are
/// hashed as the values they are, which is several times cheaper than hashing the row's text;
/// a `timestamptz` (or an array or a range of them) as UTC wall time, so that it does not
/// depend on the session's `TimeZone`;
/// every other type by its text (the output settings are pinned for every connection, see
/// [`conn::connect`]); a `NULL` as its seed.
fn row_hash(columns: &[(String, String)]) -> String {
    if columns.is_empty() {
        return "0::int8".into();
    }
    let hashed: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(seed, (name, ty))| {
            let c = quote_ident(name);
            let base = ty.split('(').next().unwrap_or(ty).trim();
            let element = ty.strip_suffix("[]").unwrap_or_default();
            let h = match base {
                // Arrays of timestamptz by the text of their elements in UTC, in order.
                _ if is_timestamptz(element) || element == "timestamptz" => format!(
                    "hashtextextended((SELECT array_agg(e AT TIME ZONE 'UTC' ORDER BY i) \
                     FROM unnest({c}) WITH ORDINALITY AS u(e, i))::text, {seed})"
                ),
                // A range of instants by its bounds in UTC.
                "tstzrange" => format!(
                    "hashtextextended(CASE WHEN isempty({c}) THEN 'empty' ELSE concat_ws(',', \
                     lower_inc({c}), upper_inc({c}), lower({c}) AT TIME ZONE 'UTC', \
                     upper({c}) AT TIME ZONE 'UTC') END, {seed})"
                ),
                _ if is_timestamptz(ty) || ty == "timestamptz" => {
                    format!("timestamp_hash_extended({c} AT TIME ZONE 'UTC', {seed})")
                }
                "timestamp" | "timestamp without time zone" => {
                    format!("timestamp_hash_extended({c}, {seed})")
                }
                "bigint" | "int8" => format!("hashint8extended({c}, {seed})"),
                "integer" | "int4" | "smallint" | "int2" | "boolean" | "bool" => {
                    format!("hashint4extended({c}::int4, {seed})")
                }
                "uuid" => format!("uuid_hash_extended({c}, {seed})"),
                // A day as its number (days since 2000-01-01: every date has one, where a
                // timestamp ends in year 294276), `infinity` and `-infinity` by their text.
                "date" => format!(
                    "CASE WHEN isfinite({c}) THEN hashint4extended({c} - date '2000-01-01', {seed}) \
                     ELSE hashtextextended({c}::text, {seed}) END"
                ),
                _ => format!("hashtextextended({c}::text COLLATE \"C\", {seed})"),
            };
            format!("coalesce({h}, {seed})")
        })
        .collect();
    format!("({})", hashed.join(" # "))
}

/// Whether a type, as `format_type` names it, is `timestamptz`.
fn is_timestamptz(formatted: &str) -> bool {
    formatted == "timestamp with time zone"
        || formatted.starts_with("timestamp(") && formatted.ends_with("with time zone")
}

/// What a partition column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// Local dates of the DAG's time zone.
    Date,
    /// Timestamps without time zone, in UTC (as SQLite's text timestamps).
    Timestamp,
    Timestamptz,
}

impl ColumnType {
    fn of(formatted: &str) -> Option<Self> {
        Some(match formatted {
            "date" => Self::Date,
            "timestamp without time zone" => Self::Timestamp,
            "timestamp with time zone" => Self::Timestamptz,
            _ => return None,
        })
    }

    fn pg_type(self) -> Type {
        match self {
            Self::Date => Type::DATE,
            Self::Timestamp => Type::TIMESTAMP,
            Self::Timestamptz => Type::TIMESTAMPTZ,
        }
    }

    /// `[lo, hi)` of the interval as values of this column.
    fn bounds(self, interval: DataInterval, tz: chrono_tz::Tz) -> Result<[Value; 2]> {
        Ok(match self {
            Self::Date => {
                let day = |t: DateTime<Utc>| t.with_timezone(&tz).date_naive();
                let (lo, hi) = (day(interval.start), day(interval.end));
                let midnight =
                    |t: DateTime<Utc>| t.with_timezone(&tz).time() == chrono::NaiveTime::MIN;
                if lo == hi || !midnight(interval.start) || !midnight(interval.end) {
                    return Err(Error::Message(format!(
                        "the partition column is a date, and interval {interval} is not whole days of the DAG's time zone: replacing its days would delete other intervals' rows; use a timestamp column for intervals shorter than a day"
                    )));
                }
                [Value::Date(lo), Value::Date(hi)]
            }
            Self::Timestamp => [
                Value::Naive(interval.start.naive_utc()),
                Value::Naive(interval.end.naive_utc()),
            ],
            Self::Timestamptz => [Value::At(interval.start), Value::At(interval.end)],
        })
    }
}

/// A bound value.
#[derive(Debug, Clone)]
enum Value {
    Int(i64),
    At(DateTime<Utc>),
    Naive(NaiveDateTime),
    Date(NaiveDate),
    Text(String),
}

impl Value {
    fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Self::Int(v) => v,
            Self::At(v) => v,
            Self::Naive(v) => v,
            Self::Date(v) => v,
            Self::Text(v) => v,
        }
    }

    fn of(p: Param, b: &Binds, tz: chrono_tz::Tz) -> Self {
        let day = |t: DateTime<Utc>| t.with_timezone(&tz).date_naive();
        match p {
            Param::DataIntervalStart => Self::At(b.interval.start),
            Param::DataIntervalEnd => Self::At(b.interval.end),
            Param::Ds => Self::Date(day(b.interval.start)),
            Param::NextDs => Self::Date(day(b.interval.end)),
            Param::DsNodash => Self::Text(b.ds_nodash.clone()),
        }
    }
}

/// A task's statement rewritten with positional parameters from `$first`, with their types.
struct Statement {
    sql: String,
    params: Vec<Param>,
}

impl Statement {
    fn new(key: &'static str, sql: &str, first: usize) -> std::result::Result<Self, TaskProblem> {
        let p = positional_from(strip(sql), first).map_err(|e| TaskProblem {
            key,
            offset: Some(e.offset + (sql.len() - sql.trim_start().len())),
            message: format!("key `{key}`: {}", e.message),
        })?;
        Ok(Self {
            sql: p.sql,
            params: p.params,
        })
    }

    fn types(&self) -> Vec<Type> {
        self.params
            .iter()
            .map(|p| match p.pg_type() {
                "timestamptz" => Type::TIMESTAMPTZ,
                "date" => Type::DATE,
                _ => Type::TEXT,
            })
            .collect()
    }

    fn values(&self, b: &Binds, tz: chrono_tz::Tz) -> Vec<Value> {
        self.params.iter().map(|p| Value::of(*p, b, tz)).collect()
    }
}

/// What the query's wrapper puts before it.
const WRAPPED_BEFORE: &str = "SELECT * FROM (\n";

/// A task's rewritten query as a subquery on lines of its own, so that a trailing comment
/// cannot swallow the closing parenthesis.
fn wrapped(sql: &str) -> String {
    format!("{WRAPPED_BEFORE}{sql}\n) q")
}

/// The catalog's view of a target table: its columns in order, with their types.
fn target_columns(
    c: &Conn,
    target: &str,
) -> std::result::Result<Vec<(String, String)>, tokio_postgres::Error> {
    // A domain's column by its base type (a domain over a domain, once more): what its values
    // are, and how a fingerprint hashes them.
    let rows = c.wait(c.client.query(
        "SELECT a.attname::text, CASE WHEN t.typtype = 'd' THEN \
           CASE WHEN b.typtype = 'd' THEN format_type(b.typbasetype, b.typtypmod) \
           ELSE format_type(t.typbasetype, t.typtypmod) END \
         ELSE format_type(a.atttypid, a.atttypmod) END \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_type b ON b.oid = t.typbasetype \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
         AND NOT a.attisdropped ORDER BY a.attnum",
        &[&quote_name(target)],
    ))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// [`target_columns`], looked up once per connection (a table that does not exist is asked
/// again).
pub(super) fn cached_columns(
    c: &mut Conn,
    table: &str,
) -> std::result::Result<Vec<(String, String)>, tokio_postgres::Error> {
    if let Some(cols) = c.columns.get(table) {
        return Ok(cols.clone());
    }
    let cols = target_columns(c, table)?;
    if !cols.is_empty() {
        c.columns.insert(table.to_string(), cols.clone());
    }
    Ok(cols)
}

impl Backend for Postgres {
    fn prepare(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        _window: DataInterval,
        _tz: chrono_tz::Tz,
    ) -> std::result::Result<Option<Repr>, TaskProblem> {
        check(task, gate)?;
        Ok(None)
    }

    fn check(&self, task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
        check(task, gate)
    }

    fn reachable(&self, w: &Warehouse) -> Result<()> {
        let c = conn::take(w).map_err(|e| Error::Message(e).at(w))?;
        conn::give(c);
        Ok(())
    }

    fn write(&self, w: &Write<'_>, cancel: &Cancel) -> Result<Box<dyn Pending>> {
        let wh = &w.task.warehouse;
        let mut c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
        cancel.on_set(c.canceller())?;
        let mut attempt = 0;
        // The target's constraint refused the output: it is measured apart from the target.
        let mut refused: Option<String> = None;
        loop {
            match write_measure(&mut c, w, cancel, refused.as_deref()) {
                Ok((measures, written)) => {
                    return Ok(Box::new(Open {
                        conn: Some(c),
                        measures,
                        written,
                        manifest: w.manifest.to_string(),
                        try_id: w.try_id,
                        staged: w.stage.then(|| staged_table(w.manifest, w.try_id)),
                    }));
                }
                Err(e) => {
                    let _ = c.wait(c.client.batch_execute("ROLLBACK"));
                    match e {
                        // Once: the pass apart from the target meets no constraint of it.
                        Failure::Pg(e)
                            if is_constraint(&e)
                                && refused.is_none()
                                && !w.stage
                                && !w.measure_only =>
                        {
                            tracing::info!(warehouse = %wh.name, target = %w.task.target, "{}; measuring the output apart from the target for the gate", describe(&e));
                            refused = Some(constraint_message(&e));
                        }
                        Failure::Pg(e) if is_retryable(&e) && attempt < RETRIES => {
                            attempt += 1;
                            tracing::info!(warehouse = %wh.name, target = %w.task.target, attempt, "{}; running the transaction again", describe(&e));
                            std::thread::sleep(std::time::Duration::from_millis(20 << attempt));
                        }
                        Failure::Pg(e) => {
                            conn::give(c);
                            return Err(pg(wh)(e));
                        }
                        Failure::Other(e) => {
                            conn::give(c);
                            return Err(e.at(wh));
                        }
                    }
                }
            }
        }
    }

    fn sweep(&self, _: &Warehouse) {
        // A try's work is its transaction, which the server rolls back when its connection
        // ends: a crash leaves nothing in the warehouse but staged tables, which recovery
        // sweeps with the manifest's knowledge (see `sweep_staged`).
    }

    fn staged(
        &self,
        _: &SqlTask,
        location: &str,
        manifest: &str,
        try_id: i64,
    ) -> Option<Box<dyn Pending>> {
        is_staged_table(location).then(|| staged(location, manifest, try_id))
    }

    fn drop_staged(
        &self,
        task: &SqlTask,
        location: &str,
        _: &Path,
    ) -> std::result::Result<(), String> {
        drop_staged(&task.warehouse, location).map_err(|e| {
            format!("cannot drop the discarded staged table {location} (the next recovery drops it): {e}")
        })
    }

    fn look(
        &self,
        task: &SqlTask,
        gate: &Gate,
        binds: &Binds,
        tz: chrono_tz::Tz,
    ) -> Result<(Option<i64>, Option<String>)> {
        look(task, Some(gate), binds, tz)
    }

    fn kept_version(
        &self,
        task: &SqlTask,
        manifest: &str,
        key: i64,
    ) -> Result<Option<(crate::warehouse::versions::Version, String)>> {
        kept_version(task, manifest, key)
    }

    fn roll_back(&self, r: &super::backend::RollBack<'_>, allowed: &Allowed<'_>) -> Result<i64> {
        roll_back(r, allowed)
    }

    fn writes_in_its_publish(&self) -> bool {
        true
    }

    fn works_in_this_process(&self) -> bool {
        false
    }

    fn storage(&self, task: &SqlTask, manifest: &str) -> crate::warehouse::versions::Storage {
        storage(task, manifest).unwrap_or_else(|_| crate::warehouse::versions::Storage {
            target: task.target.clone(),
            ..Default::default()
        })
    }

    fn published(
        &self,
        task: &SqlTask,
        _: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<(i64, String)> {
        published(task, interval, tz, location)
    }

    fn diff_keys(
        &self,
        task: &SqlTask,
        key: &[String],
        _: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<Option<super::diff::KeyDiff>> {
        diff_keys(task, key, interval, tz, location)
    }
}

enum Failure {
    Pg(tokio_postgres::Error),
    Other(Error),
}

impl Failure {
    /// The warehouse's error, naming the warehouse.
    fn at(self, w: &Warehouse) -> Error {
        match self {
            Self::Pg(e) => pg(w)(e),
            Self::Other(e) => e.at(w),
        }
    }
}

/// Asks the manifest whether this publish may still commit: [`Error::Refused`] when not.
fn ask(allowed: &Allowed<'_>) -> std::result::Result<(), Failure> {
    match allowed() {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Refused.into()),
        Err(why) => Err(Error::Message(format!("cannot read the manifest: {why}")).into()),
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Pg(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Self::Other(e)
    }
}

/// Creates the bookkeeping tables when they do not exist (once per connection).
fn book(c: &mut Conn) -> std::result::Result<(), Failure> {
    if c.booked {
        return Ok(());
    }
    let there: bool = c
        .wait(c.client.query_one(
            "SELECT to_regclass('backfill.partitions') IS NOT NULL AND to_regclass('backfill.versions') IS NOT NULL \
             AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('backfill.publishes') \
               AND attname = 'judged' AND NOT attisdropped)",
            &[],
        ))?
        .get(0);
    if !there {
        // Several processes may create them at once: one at a time.
        c.wait(c.client.batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(7262150318); \
             CREATE SCHEMA IF NOT EXISTS backfill; \
             CREATE TABLE IF NOT EXISTS backfill.partitions ( \
               target text NOT NULL, partition_start timestamptz NOT NULL, \
               manifest text NOT NULL, try_id bigint NOT NULL, \
               published_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (target, partition_start)); \
             CREATE TABLE IF NOT EXISTS backfill.publishes ( \
               manifest text NOT NULL, try_id bigint NOT NULL, target text NOT NULL, \
               partition_start timestamptz NOT NULL, partition_end timestamptz NOT NULL, \
               rows bigint NOT NULL, fingerprint text, \
               published_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (manifest, try_id)); \
             CREATE TABLE IF NOT EXISTS backfill.versions ( \
               manifest text NOT NULL, target text NOT NULL, \
               interval_start timestamptz NOT NULL, interval_end timestamptz NOT NULL, \
               replaced_by bigint NOT NULL, version_of bigint, rows bigint NOT NULL, \
               kept_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (manifest, target, replaced_by)); \
             CREATE INDEX IF NOT EXISTS versions_by_interval \
               ON backfill.versions (manifest, target, interval_start, replaced_by); \
             ALTER TABLE backfill.publishes ADD COLUMN IF NOT EXISTS judged text; \
             COMMIT;",
        ))?;
    }
    c.booked = true;
    Ok(())
}

/// Prepares `sql` once per connection.
fn prepared(
    c: &mut Conn,
    sql: &str,
    types: &[Type],
) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
    if let Some(s) = c.prepared.get(sql) {
        return Ok(s.clone());
    }
    let s = c.wait(c.client.prepare_typed(sql, types))?;
    c.prepared.insert(sql.to_string(), s.clone());
    Ok(s)
}

/// The type of a target's partition column, looked up once per connection.
fn partition_type(c: &mut Conn, task: &SqlTask) -> std::result::Result<ColumnType, Failure> {
    let columns = cached_columns(c, &task.target)?;
    let ty = columns
        .iter()
        .find(|(n, _)| *n == task.partition_column)
        .and_then(|(_, t)| ColumnType::of(t))
        .ok_or_else(|| {
            Error::Message(format!(
                "target table `{}` has no date, timestamp or timestamptz column `{}` (partition_column)",
                task.target, task.partition_column
            ))
        })?;
    Ok(ty)
}

/// The try's transaction up to the gate, in one round trip and one snapshot: delete the
/// interval's rows of the target (moving them to the kept table when versions are kept), then,
/// in a statement of its own so that a key of the target is free again before it is inserted,
/// insert the query's rows and measure them and the source; then check the target's deferred
/// constraints, so that the gate hears of a violation before it judges, not the commit after.
///
/// With `refused` (the target's constraint refused the output in an earlier pass, with this
/// message), and for a try that is only measured, the output goes to a temporary table shaped
/// like the target instead, and the target is neither changed nor locked: the measures are the
/// same, and `refused` goes with them for the gate.
fn write_measure(
    c: &mut Conn,
    w: &Write<'_>,
    cancel: &Cancel,
    refused: Option<&str>,
) -> std::result::Result<(AuditMeasures, Written), Failure> {
    let task = w.task;
    // Measured apart from the target: nothing is deleted, locked or booked.
    let apart = w.measure_only || refused.is_some();
    if !apart {
        book(c)?;
    }
    let ty = partition_type(c, task)?;
    let query = Statement::new("sql", &task.sql, 3).map_err(|p| Error::Message(p.message))?;
    let subquery = wrapped(&query.sql);
    let mut shape_types = vec![Type::TEXT, Type::TEXT];
    shape_types.extend(query.types());
    let shape = prepared(c, &subquery, &shape_types)?;
    let out: Vec<String> = shape
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let [lo, hi] = ty.bounds(w.binds.interval, w.tz)?;
    let table = quote_name(&task.target);
    let pc = quote_ident(&task.partition_column);
    // A staged output goes to a table of its own, a measured one to a temporary table; the
    // target is not touched.
    let staged = w.stage.then(|| staged_table(w.manifest, w.try_id));
    let dest = match &staged {
        Some(name) => name.as_str(),
        None if apart => SCRATCH,
        None => &table,
    };
    let list = out
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    // The output's rows are hashed as the target's types hold them (what `RETURNING` gives, and
    // what verify, promote and kept versions hash later), not as the query's types.
    let target_types = cached_columns(c, &task.target)?;
    let typed: Vec<(String, String)> = out
        .iter()
        .map(|n| {
            let ty = target_types
                .iter()
                .find(|(t, _)| t == n)
                .map_or_else(|| "text".to_string(), |(_, ty)| ty.clone());
            (n.clone(), ty)
        })
        .collect();
    let outside = format!("(NOT ({pc} >= $1 AND {pc} < $2) OR {pc} IS NULL)");
    let keys = w
        .gate
        .map(|g| {
            g.unique_key
                .iter()
                .map(|k| quote_ident(k))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|k| !k.is_empty());
    let duplicates = match (w.gate, &keys) {
        (Some(g), Some(k)) => duplicates_sql(&g.unique_key, k, &typed),
        _ => "NULL::int8".to_string(),
    };
    let elsewhere = match (w.gate, &keys) {
        (Some(g), Some(k)) if g.unique_key_table => format!(
            "(SELECT concat_ws(' ', ({tk})::text, 'in partition', t.{pc}::text) FROM {table} t \
             WHERE ({tk}) IN (SELECT {k} FROM ins) AND NOT (t.{pc} >= $1 AND t.{pc} < $2) LIMIT 1)",
            tk = g
                .unique_key
                .iter()
                .map(|c| format!("t.{}", quote_ident(c)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        _ => "NULL::text".to_string(),
    };
    let col_type = ty.pg_type();
    let mut types = vec![col_type.clone(), col_type];
    types.extend(query.types());
    let mut values = vec![lo, hi];
    values.extend(query.values(w.binds, w.tz));
    let [source_count, source_fingerprint] =
        source_queries(w.gate, w.binds, w.tz, &mut types, &mut values)?;
    let replaces = staged.is_none() && !apart;
    let kept = if replaces && task.keep_versions > 0 {
        Some(versions::ensure_kept(c, w.manifest, &task.target)?)
    } else {
        None
    };
    let mark = try_mark(w.try_id);
    // The partition's rows go first, in a statement of their own: the parts of one statement
    // all see its snapshot, so an insert beside the delete would meet the very keys it removes.
    let delete = match &kept {
        _ if !replaces => None,
        Some(kept) => {
            let cols = versions::shared_columns(c, kept, &task.target)?.join(", ");
            Some(format!(
                "WITH d AS (DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 AND {DELETE_GUARD} RETURNING *) \
                 INSERT INTO {kept} ({cols}, _replaced_by) SELECT {cols}, $4 FROM d"
            ))
        }
        None => Some(format!(
            "DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 AND {DELETE_GUARD}"
        )),
    };
    // A try that will publish takes the partition's row lock and books its publish in the same
    // statement (see `lock_and_book`): a rejected or rolled-back try leaves neither.
    let booking = if replaces {
        let first = types.len() + 1;
        types.extend([
            Type::TEXT,
            Type::TIMESTAMPTZ,
            Type::TEXT,
            Type::INT8,
            Type::TIMESTAMPTZ,
        ]);
        values.extend([
            Value::Text(task.target.clone()),
            Value::At(w.binds.interval.start),
            Value::Text(w.manifest.to_string()),
            Value::Int(w.try_id),
            Value::At(w.binds.interval.end),
        ]);
        let params = [0, 1, 2, 3, 4].map(|i| format!("${}", first + i));
        format!(
            ",\n{}",
            lock_and_book_ctes(
                &params,
                ["m.n", "'pg:' || m.n::text || ':' || m.h::text"],
                "lock, m"
            )
        )
    } else {
        String::new()
    };
    types.push(Type::TEXT);
    values.push(Value::Text(mark.clone()));
    let guard = in_try_guard(types.len());
    let statement = format!(
        "WITH ins AS (\n  INSERT INTO {dest} ({list})\n  SELECT {list} FROM (\n{}\n) q\n  RETURNING {list}\n),\n\
         m AS (SELECT count(*) AS n, count(*) FILTER (WHERE {outside}) AS outside, \
           coalesce(sum({hash}), 0) AS h FROM ins){booking}\n\
         SELECT m.n, m.outside, \
         CASE WHEN m.outside > 0 THEN (SELECT array_agg(v) FROM (SELECT DISTINCT coalesce({pc}::text, 'NULL') AS v FROM ins WHERE {outside} ORDER BY 1 LIMIT {more}) o) END, \
         m.n::text || ':' || m.h::text, {duplicates}, {elsewhere}, {source_count}, {source_fingerprint}, {guard} FROM m",
        query.sql,
        more = SHOWN + 1,
        hash = row_hash(&typed),
    );
    if cancel.is_set() {
        return Err(Error::Cancelled.into());
    }
    let begin = begin_sql(idle_ms(w), &mark);
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
    let (row, moved) = match &delete {
        None => {
            let create = match &staged {
                Some(name) => format!("CREATE TABLE {name}"),
                None => format!("CREATE TEMPORARY TABLE {SCRATCH} ON COMMIT DROP"),
            };
            c.wait(c.client.batch_execute(&format!(
                "{begin}; {create} AS SELECT {list} FROM {table} WITH NO DATA"
            )))?;
            // The table is new in every try: its statement is not kept prepared.
            let measure = c.wait(c.client.prepare_typed(&statement, &types))?;
            (c.wait(c.client.query_one(&measure, &refs))?, None)
        }
        Some(delete) => {
            // Prepared outside the transaction; then its BEGIN and the statements go in one
            // round trip, in order. Should the BEGIN fail, the statements run outside a
            // transaction, where the delete's guard matches no row and the measure's fails it
            // (see `begin_sql`): nothing is committed.
            let measure = prepared(c, &statement, &types)?;
            let delete = prepared(
                c,
                delete,
                &[types[0].clone(), types[1].clone(), Type::TEXT, Type::INT8],
            )?;
            let delete_params: [&(dyn ToSql + Sync); 4] =
                [values[0].sql(), values[1].sql(), &mark, &w.try_id];
            c.wait(async {
                let (began, deleted, row, checked) = tokio::join!(
                    c.client.batch_execute(&begin),
                    c.client.execute(&delete, &delete_params),
                    c.client.query_one(&measure, &refs),
                    c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
                );
                began?;
                let deleted = deleted?;
                let row = row?;
                checked?;
                Ok::<_, tokio_postgres::Error>((
                    row,
                    kept.is_some()
                        .then(|| i64::try_from(deleted).unwrap_or(i64::MAX)),
                ))
            })?
        }
    };
    crate::fault::point("before-source-count");
    let rows: i64 = row.get(0);
    let fingerprint: String = row.get(3);
    let source = counted(w.gate, row.get(6))?;
    let m = AuditMeasures {
        rows,
        outside: row.get(1),
        outside_values: row.get::<_, Option<Vec<String>>>(2).unwrap_or_default(),
        duplicate_keys: keys
            .is_some()
            .then(|| row.get::<_, Option<i64>>(4).unwrap_or(0)),
        fingerprint: format!("pg:{fingerprint}"),
        repr: None,
        mixed: None,
        source,
        source_fingerprint: row.get(7),
        elsewhere: row.get(5),
        constraint: refused.map(str::to_string),
    };
    if moved.is_some() {
        c.has_versions = Some(true);
    }
    Ok((
        m,
        Written {
            moved,
            columns: out,
        },
    ))
}

/// The temporary table that an output measured apart from the target goes to (gone with its
/// transaction).
const SCRATCH: &str = "pg_temp.backfill_output";

/// The condition of a try's delete that holds only inside the transaction that [`begin_sql`]
/// began with the try's mark, bound as `$3`: outside it, the delete matches no row.
const DELETE_GUARD: &str = "current_setting('backfill.in_try', true) = $3";

/// Whether the target refused a try's rows by one of its constraints (a key, a unique index, an
/// exclusion, a check, a foreign key: SQLSTATE class 23), rather than the try failing: the
/// gate then judges the output, measured apart from the target.
fn is_constraint(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| c.code().starts_with("23"))
}

/// What a constraint violation says, as the gate records it: the message, its detail, and the
/// constraint's table.
fn constraint_message(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return describe(e);
    };
    let mut s = db.message().to_string();
    if let Some(d) = db.detail() {
        let _ = write!(s, "; {d}");
    }
    if let (Some(schema), Some(table)) = (db.schema(), db.table()) {
        let _ = write!(s, " (table {schema}.{table})");
    }
    s
}

/// The `idle_in_transaction_session_timeout` of a try's session: twice the lease timeout, at
/// least 5 s, so that the server ends the transaction of an owner frozen past its takeover.
fn idle_ms(w: &Write<'_>) -> u128 {
    (w.lease_timeout * 2)
        .max(std::time::Duration::from_secs(5))
        .as_millis()
        // The server's limit for the setting (about 24 days).
        .min(i32::MAX as u128)
}

/// A value that nobody can know in advance, which marks one try's transaction.
fn try_mark(try_id: i64) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(try_id);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

/// Begins a try's transaction. Plans are made for each try's values and the table as it is
/// now: a plan cached while the target was empty would scan it whole once it has grown. The
/// transaction is marked with `mark` (`SET LOCAL`, gone when it ends) for [`in_try_guard`].
fn begin_sql(idle_ms: u128, mark: &str) -> String {
    format!(
        "SET idle_in_transaction_session_timeout = {idle_ms}; SET plan_cache_mode = force_custom_plan; \
         BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL backfill.in_try = '{mark}'"
    )
}

/// A column of a try's statement that fails the statement (so that it commits nothing) unless
/// it runs inside the transaction that [`begin_sql`] began with the try's mark, bound as
/// parameter `$param`: a query that sets the setting itself cannot know the mark.
fn in_try_guard(param: usize) -> String {
    format!(
        "CASE WHEN current_setting('backfill.in_try', true) = ${param} THEN NULL::int \
         ELSE ('backfill: the statement is outside its try''s transaction (' \
         || coalesce(current_setting('backfill.in_try', true), 'unset') || ')')::int END"
    )
}

/// How many values of the unique key (`quoted`, the key's columns quoted and joined) occur
/// more than once in the output `ins`, as SQL. Counting the groups is a hash aggregate of every
/// row, several times slower than sorting the keys once; so when the key's types sort as
/// `GROUP BY` compares them (by `typed`, the output's types), the rows and the distinct keys
/// are counted first, and the groups only when the two differ (a duplicate, or a `NULL` key
/// which `count(DISTINCT)` leaves out): the same number, at the cost of a sort when there is
/// none. Text sorts so only as a key's one column (its own collation); inside a row (several
/// columns) it might compare by another, so such keys are only grouped.
fn duplicates_sql(key: &[String], quoted: &str, typed: &[(String, String)]) -> String {
    let exact = format!(
        "(SELECT count(*) FROM (SELECT 1 FROM ins GROUP BY {quoted} HAVING count(*) > 1) d)"
    );
    let sorts = key.iter().all(|k| {
        typed.iter().any(|(name, ty)| {
            let base = ty.split('(').next().unwrap_or(ty).trim();
            let text = matches!(
                base,
                "text" | "character varying" | "varchar" | "character" | "bpchar"
            );
            name == k
                && (text && key.len() == 1
                    || matches!(
                        base,
                        "bigint"
                            | "integer"
                            | "smallint"
                            | "int8"
                            | "int4"
                            | "int2"
                            | "uuid"
                            | "date"
                            | "timestamp"
                            | "timestamp with time zone"
                            | "timestamp without time zone"
                            | "numeric"
                            | "boolean"
                    ))
        })
    });
    if !sorts {
        return exact;
    }
    // One column's key as itself, several as a row (whose NULL fields compare equal, as GROUP
    // BY groups them).
    format!(
        "(SELECT CASE WHEN count(*) = count(DISTINCT ({quoted})) THEN 0::int8 ELSE {exact} END FROM ins)"
    )
}

/// What a try's transaction did besides its output.
struct Written {
    /// Rows of the partition moved to the kept table, when versions are kept.
    moved: Option<i64>,
    /// The query's columns.
    columns: Vec<String>,
}

/// The gate's `source_count` and `source_fingerprint` queries as scalar subqueries (`NULL` for
/// one that is not a query), their parameters numbered after those in `types` and bound from
/// `binds` into `values`: part of a try's statement, or of a look at the source.
fn source_queries(
    gate: Option<&Gate>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    types: &mut Vec<Type>,
    values: &mut Vec<Value>,
) -> std::result::Result<[String; 2], Failure> {
    let mut one = |key: &'static str, spec: Option<&SourceCount>, count: bool| {
        let Some(SourceCount::Sql(sql)) = spec else {
            return Ok(if count { "NULL::int8" } else { "NULL::text" }.to_string());
        };
        let s = Statement::new(key, sql, types.len() + 1).map_err(|p| Error::Message(p.message))?;
        types.extend(s.types());
        values.extend(s.values(binds, tz));
        Ok::<_, Failure>(if count {
            format!("(SELECT s.c::int8 FROM (\n{}\n) AS s(c))", s.sql)
        } else {
            format!(
                "(SELECT coalesce(s.c::text, 'NULL') FROM (\n{}\n) AS s(c))",
                s.sql
            )
        })
    };
    Ok([
        one(
            "gate.source_count",
            gate.and_then(|g| g.source_count.as_ref()),
            true,
        )?,
        one(
            "gate.source_fingerprint",
            gate.and_then(|g| g.source_fingerprint.as_ref()),
            false,
        )?,
    ])
}

/// The source count a [`source_queries`] subquery gave: a `source_count` query must give one.
fn counted(gate: Option<&Gate>, found: Option<i64>) -> std::result::Result<Option<i64>, Failure> {
    match (found, gate.and_then(|g| g.source_count.as_ref())) {
        (None, Some(SourceCount::Sql(_))) => Err(Error::Message(
            "gate.source_count returned no row, or NULL; it must return one integer".into(),
        )
        .into()),
        _ => Ok(found),
    }
}

/// The gate's source queries now, from one snapshot.
pub fn look(
    task: &SqlTask,
    gate: Option<&Gate>,
    binds: &Binds,
    tz: chrono_tz::Tz,
) -> Result<(Option<i64>, Option<String>)> {
    let wh = &task.warehouse;
    let mut c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let seen = c
        .wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        )
        .map_err(Failure::from)
        .and_then(|()| {
            let (mut types, mut values) = (Vec::new(), Vec::new());
            let [count, value] = source_queries(gate, binds, tz, &mut types, &mut values)?;
            let stmt = prepared(&mut c, &format!("SELECT {count}, {value}"), &types)?;
            let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
            let row = c.wait(c.client.query_one(&stmt, &refs))?;
            Ok((counted(gate, row.get(0))?, row.get(1)))
        });
    let _ = c.wait(c.client.batch_execute("ROLLBACK"));
    conn::give(c);
    seen.map_err(|e| e.at(wh))
}

/// A try's open transaction: its output written, measured, not yet visible.
struct Open {
    conn: Option<Conn>,
    measures: AuditMeasures,
    written: Written,
    manifest: String,
    try_id: i64,
    /// The table a staged try writes to, in place of the target.
    staged: Option<String>,
}

impl Open {
    fn end(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            conn::give(c);
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.end();
    }
}

impl Pending for Open {
    fn measures(&self) -> &AuditMeasures {
        &self.measures
    }

    fn file(&self) -> Option<&Path> {
        None
    }

    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        _waiting: &mut dyn FnMut(),
    ) -> Result<i64> {
        let wh = &p.task.warehouse;
        if let Some(why) = &self.measures.constraint {
            // Measured apart from the target, which it never entered: the gate rejects it.
            return Err(Error::Constraint(why.clone()));
        }
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::Message("the try's transaction is gone".into()).at(wh));
        };
        if crate::fault::point("publish") {
            self.end();
            return Err(Error::Message("connection lost (injected)".into()).at(wh));
        }
        let ready = (|| -> std::result::Result<(), Failure> {
            finish_versions(
                c,
                &self.manifest,
                p,
                &self.written,
                self.try_id,
                &self.measures.fingerprint,
            )?;
            // The statement that wrote the rows took the partition's row lock and booked the
            // publish: the manifest is asked under that lock.
            ask(allowed)?;
            crate::fault::point("before-commit");
            Ok(())
        })();
        if let Err(e) = ready {
            // Nothing was sent to commit: nothing committed.
            self.end();
            return Err(e.at(wh));
        }
        // The judged record goes with the booking, in the commit's round trip, and so does
        // the manifest's record of the publish when the manifest is in this database. A failed
        // statement aborts the transaction, whose COMMIT then rolls back without an error: so
        // the statements' own answers decide too.
        // (Prepared first: a statement to parse would go to the server after the COMMIT.)
        let update = prepared(
            c,
            "UPDATE backfill.publishes SET judged = $3 WHERE manifest = $1 AND try_id = $2",
            &[Type::TEXT, Type::INT8, Type::TEXT],
        );
        let record = match &p.in_manifest {
            Some(_) => {
                prepared(c, crate::manifest::publishes::IN_PUBLISH, &IN_PUBLISH_TYPES).map(Some)
            }
            None => Ok(None),
        };
        let (update, record) = match (update, record) {
            (Ok(u), Ok(r)) => (u, r),
            (Err(e), _) | (_, Err(e)) => {
                self.end();
                return Err(pg(wh)(e));
            }
        };
        let params: [&(dyn ToSql + Sync); 3] = [&self.manifest, &self.try_id, &p.judged];
        let in_manifest = p
            .in_manifest
            .map(|m| InPublishValues::of(m, self.try_id, self.measures.rows, p.interval));
        let (judged, recorded, committed) = c.wait(async {
            tokio::join!(
                c.client.execute(&update, &params),
                async {
                    match (&record, &in_manifest) {
                        (Some(r), Some(v)) => c.client.execute(r, &v.params()).await.map(Some),
                        _ => Ok(None),
                    }
                },
                c.client.batch_execute("COMMIT")
            )
        });
        // The manifest no longer records the try as running (its owner was recovered): the
        // transaction rolled back, the warehouse's rows with it.
        let refused =
            matches!(&recorded, Err(e) if committed.is_ok() && refused_by_manifest(e, self.try_id));
        let committed = match (judged, recorded, committed) {
            (Ok(_), Ok(_), Ok(())) => Ok(()),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
        };
        // A commit that failed may have happened with its reply lost (the booking says, and
        // with it the manifest's record, when that went with it).
        let result = if refused {
            Err(Error::Refused.into())
        } else {
            settled(
                c,
                committed,
                p.task,
                p.interval,
                &self.manifest,
                self.try_id,
            )
        };
        if let Some(c) = self.conn.take() {
            conn::give(c);
        }
        result
            .map(|()| self.measures.rows)
            .map_err(|e: Failure| e.at(wh))
    }

    fn remove(mut self: Box<Self>) {
        self.end();
    }

    fn keep(mut self: Box<Self>) {
        self.end();
    }

    fn stage(mut self: Box<Self>) -> std::result::Result<PathBuf, String> {
        let (Some(c), Some(table)) = (self.conn.take(), self.staged.clone()) else {
            self.end();
            return Err("this try wrote to the target, not to a staged table".into());
        };
        // Committed like any table of the database: a crash of the machine keeps it.
        let committed = c.wait(c.client.batch_execute("COMMIT"));
        conn::give(c);
        committed
            .map(|()| PathBuf::from(table))
            .map_err(|e| format!("cannot keep the staged output: {}", describe(&e)))
    }
}

/// Inside a publish transaction, once the partition's old rows were moved aside (or deleted):
/// records them as a version of the interval, or carries the version they replaced when they
/// were exactly the new rows, and drops the versions beyond `keep_versions`.
fn finish_versions(
    c: &mut Conn,
    manifest: &str,
    p: &PublishAs<'_>,
    written: &Written,
    try_id: i64,
    fingerprint: &str,
) -> std::result::Result<(), Failure> {
    let Some(k) = p.keep else {
        return Ok(());
    };
    if k.keep == 0 && written.moved.is_none() && !has_versions(c, manifest)? {
        return Ok(());
    }
    let kept_fingerprint = match (k.same_content, written.moved) {
        (true, Some(_)) => kept_fingerprint(c, manifest, &p.task.target, &written.columns, try_id)?,
        _ => None,
    };
    versions::record(
        c,
        manifest,
        &p.task.target,
        p.interval,
        k,
        written.moved,
        kept_fingerprint.as_deref(),
        fingerprint,
    )
}

/// The types of [`crate::manifest::publishes::IN_PUBLISH`]'s parameters.
const IN_PUBLISH_TYPES: [Type; 13] = [
    Type::INT8,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::INT8,
];

/// The values of [`crate::manifest::publishes::IN_PUBLISH`]'s parameters, owned.
struct InPublishValues<'a> {
    try_id: i64,
    rows: i64,
    m: &'a InManifest,
    start: i64,
    end: i64,
}

impl<'a> InPublishValues<'a> {
    fn of(m: &'a InManifest, try_id: i64, rows: i64, interval: DataInterval) -> Self {
        Self {
            try_id,
            rows,
            m,
            start: interval.start.timestamp(),
            end: interval.end.timestamp(),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        let r = &self.m.record;
        [
            &self.try_id,
            &self.rows,
            &r.fingerprint,
            &r.source_rows,
            &r.previous_rows,
            &r.verdict,
            &r.reasons,
            &r.source_fingerprint,
            &self.m.dag_id,
            &self.m.task_id,
            &self.start,
            &self.end,
            &r.promoted_from,
        ]
    }

    /// Runs the statement inside the publish's transaction (not pipelined with its commit);
    /// a try that may no longer publish is [`Error::Refused`].
    fn run(&self, c: &mut Conn) -> std::result::Result<(), Failure> {
        let stmt = prepared(c, crate::manifest::publishes::IN_PUBLISH, &IN_PUBLISH_TYPES)?;
        match c.wait(c.client.execute(&stmt, &self.params())) {
            Ok(_) => Ok(()),
            Err(e) if refused_by_manifest(&e, self.try_id) => Err(Error::Refused.into()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether the manifest's record of a publish failed because the try may no longer publish:
/// `publish_refused`, or a serialization failure (recovery ended the try after the publish's
/// snapshot was taken). Says so in the diagnostics.
fn refused_by_manifest(e: &tokio_postgres::Error, try_id: i64) -> bool {
    let refused = e.code().is_some_and(|code| {
        code.code() == crate::manifest::publishes::PUBLISH_REFUSED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    });
    if refused {
        tracing::info!(try_id, "publish refused by the manifest: {}", describe(e));
    }
    refused
}

/// Which database a session is in: its server instance (the time it started) and the
/// database's oid. The same on every connection to one database, whatever URL names it.
pub const DATABASE_KEY: &str = "SELECT CAST(extract(epoch FROM pg_postmaster_start_time()) AS text) || '/' || \
     CAST((SELECT oid FROM pg_database WHERE datname = current_database()) AS text)";

/// Whether warehouse `w` is in the manifest's own database (`manifest_key`, see
/// [`crate::manifest::database_key`]) and its user may write the manifest's record of a
/// publish: then a publish and that record commit in one transaction. Asked once per run
/// (see `runner::sql_try::one_database`), which also says once when it may not.
pub fn shares_database(w: &Warehouse, manifest_key: &str) -> bool {
    // Looked up by oid in the catalogs, which anyone may read: a user without access to the
    // manifest's schema gets "no", not an error. (A privilege function given several
    // privileges says whether any is held: each is asked alone.)
    let sql = format!(
        "WITH s AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'backfill_manifest'), \
              t AS (SELECT c.oid, c.relname FROM pg_catalog.pg_class c JOIN s ON c.relnamespace = s.oid \
                    WHERE c.relname IN ('task_tries', 'published') AND c.relkind = 'r'), \
              f AS (SELECT p.oid FROM pg_catalog.pg_proc p JOIN s ON p.pronamespace = s.oid \
                    WHERE p.proname = 'publish_refused') \
         SELECT ({DATABASE_KEY}) = $1, \
                coalesce((SELECT has_schema_privilege(oid, 'USAGE') FROM s), false) \
                AND (SELECT count(*) = 2 AND bool_and(has_table_privilege(oid, 'SELECT') \
                       AND has_table_privilege(oid, 'UPDATE') \
                       AND (relname <> 'published' OR has_table_privilege(oid, 'INSERT'))) FROM t) \
                AND (SELECT count(*) = 1 AND bool_and(has_function_privilege(oid, 'EXECUTE')) FROM f)"
    );
    let found = conn::take(w).and_then(|c| {
        let row = c.wait(c.client.query_one(&sql, &[&manifest_key]));
        match row {
            Ok(row) => {
                conn::give(c);
                Ok((row.get::<_, bool>(0), row.get::<_, Option<bool>>(1)))
            }
            Err(e) => Err(describe(&e)),
        }
    });
    match found {
        Ok((same, may_write)) => {
            let may_write = may_write == Some(true);
            if same && !may_write {
                eprintln!(
                    "warning: warehouse `{}` is in the manifest's database, but its user may not write the manifest's tables (backfill_manifest.task_tries and .published: SELECT, INSERT, UPDATE; EXECUTE on backfill_manifest.publish_refused): its publishes are recorded in the manifest after they commit, as with any other warehouse",
                    w.name
                );
            }
            same && may_write
        }
        Err(e) => {
            // The try meets the problem itself; recording after the commit is always safe.
            tracing::warn!(warehouse = %w.name, "cannot tell whether the warehouse is in the manifest's database: {e}");
            false
        }
    }
}

/// Takes the partition's row lock in `backfill.partitions` and books the publish in
/// `backfill.publishes`, in one statement of the publish transaction: a recoverer that holds the
/// same row lock sees the booking exactly when the publish committed.
fn lock_and_book(
    c: &mut Conn,
    target: &str,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
    rows: i64,
    fingerprint: &str,
) -> std::result::Result<(), Failure> {
    let params = ["$1", "$2", "$3", "$4", "$5"].map(String::from);
    let stmt = prepared(
        c,
        &format!(
            "WITH {} SELECT 1",
            lock_and_book_ctes(&params, ["$6", "$7"], "lock")
        ),
        &[
            Type::TEXT,
            Type::TIMESTAMPTZ,
            Type::TEXT,
            Type::INT8,
            Type::TIMESTAMPTZ,
            Type::INT8,
            Type::TEXT,
        ],
    )?;
    c.wait(c.client.execute(
        &stmt,
        &[
            &target,
            &interval.start,
            &manifest,
            &try_id,
            &interval.end,
            &rows,
            &fingerprint,
        ],
    ))?;
    Ok(())
}

/// The CTEs `lock` (the partition's row in `backfill.partitions`, created or updated, so locked)
/// and `book` (the publish in `backfill.publishes`), given the SQL of the target, interval start,
/// manifest, try id and interval end, of the rows and fingerprint, and what `book` reads from.
fn lock_and_book_ctes(params: &[String; 5], measured: [&str; 2], from: &str) -> String {
    let [target, start, manifest, try_id, end] = params;
    let [rows, fingerprint] = measured;
    format!(
        "lock AS (INSERT INTO backfill.partitions AS p (target, partition_start, manifest, try_id) \
           VALUES ({target}, {start}, {manifest}, {try_id}) ON CONFLICT (target, partition_start) DO UPDATE \
           SET manifest = EXCLUDED.manifest, try_id = EXCLUDED.try_id, published_at = now() RETURNING 1),\n\
         book AS (INSERT INTO backfill.publishes (manifest, try_id, target, partition_start, partition_end, rows, fingerprint) \
           SELECT {manifest}, {try_id}, {target}, {start}, {end}, {rows}, {fingerprint} FROM {from} RETURNING 1)"
    )
}

/// Whether the warehouse keeps versions for this manifest at all (looked up once per
/// connection): with `keep_versions = 0`, versions kept before are dropped by the next publish
/// of their interval, and a warehouse that has none is not asked each time.
fn has_versions(c: &mut Conn, manifest: &str) -> std::result::Result<bool, Failure> {
    if let Some(known) = c.has_versions {
        return Ok(known);
    }
    let found: bool = c
        .wait(c.client.query_one(
            "SELECT EXISTS (SELECT 1 FROM backfill.versions WHERE manifest = $1)",
            &[&manifest],
        ))?
        .get(0);
    c.has_versions = Some(found);
    Ok(found)
}

/// The fingerprint of the rows the try moved to the kept table, over the query's columns
/// `list`; `None` when the kept table lacks one of them.
fn kept_fingerprint(
    c: &Conn,
    manifest: &str,
    target: &str,
    columns: &[String],
    try_id: i64,
) -> std::result::Result<Option<String>, Failure> {
    let kept = versions::kept_table(manifest, target);
    let have = target_columns(c, &kept)?;
    let mut typed = Vec::new();
    for col in columns {
        match have.iter().find(|(n, _)| n == col) {
            Some((n, t)) => typed.push((n.clone(), t.clone())),
            None => return Ok(None),
        }
    }
    let list = row_hash(&typed);
    let list = list.as_str();
    let row = c.wait(c.client.query_one(
        &format!(
            "SELECT {}",
            fingerprint_sql(
                list,
                &format!("(SELECT * FROM {kept} WHERE _replaced_by = $1) k")
            )
        ),
        &[&try_id],
    ))?;
    Ok(Some(format!("pg:{}", row.get::<_, String>(0))))
}

/// How a publish's `COMMIT` went: when it failed (the connection went, say), it may have
/// committed with its reply lost, and the booking says which, once the server has ended the
/// transaction either way (see [`settle_publish`]).
fn settled(
    c: &Conn,
    committed: std::result::Result<(), tokio_postgres::Error>,
    task: &SqlTask,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
) -> std::result::Result<(), Failure> {
    match committed {
        Ok(()) => Ok(()),
        Err(e) => {
            // A statement before the COMMIT failed (its transaction is open, aborted, holding
            // the partition's row until it ends), or the COMMIT did.
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            match settle_publish(task, interval, manifest, try_id) {
                Ok(Some(_)) => Ok(()),
                _ => Err(e.into()),
            }
        }
    }
}

/// Whether the warehouse has its bookkeeping table of publishes: known without asking once this
/// connection has booked (see [`book`]).
fn has_bookings(c: &Conn) -> std::result::Result<bool, tokio_postgres::Error> {
    if c.booked {
        return Ok(true);
    }
    Ok(c.wait(
        c.client
            .query_one("SELECT to_regclass('backfill.publishes') IS NOT NULL", &[]),
    )?
    .get(0))
}

/// A publish that committed, as the warehouse booked it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booked {
    pub rows: i64,
    pub fingerprint: Option<String>,
    /// The try's judged record as JSON (see [`PublishAs::judged`]).
    pub judged: Option<String>,
}

/// After a crash: whether the publish of try `try_id` (recorded by manifest `manifest`)
/// committed, as it was booked. Judged under the partition's row lock, which a publish holds
/// from before it asks the manifest until it commits: an owner frozen in between is waited
/// for, and one that has not got there yet will be refused by the manifest.
pub fn settle_publish(
    task: &SqlTask,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
) -> Result<Option<Booked>> {
    let wh = &task.warehouse;
    let c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let result = (|| -> std::result::Result<Option<Booked>, tokio_postgres::Error> {
        if !has_bookings(&c)? {
            return Ok(None);
        }
        // An owner that is publishing holds the partition's row (one it created, not yet
        // committed, or one it updated) until it commits or the server rolls it back; a frozen
        // owner's session is ended by the server once idle past twice the lease timeout. Both
        // statements wait for that, so "not committed" stays true once said.
        c.wait(
            c.client
                .batch_execute("BEGIN; SET LOCAL lock_timeout = '10min'"),
        )?;
        c.wait(c.client.execute(
            "INSERT INTO backfill.partitions (target, partition_start, manifest, try_id) \
             VALUES ($1, $2, '', 0) ON CONFLICT (target, partition_start) DO NOTHING",
            &[&task.target, &interval.start],
        ))?;
        c.wait(c.client.query(
            "SELECT 1 FROM backfill.partitions WHERE target = $1 AND partition_start = $2 FOR UPDATE",
            &[&task.target, &interval.start],
        ))?;
        let row = c.wait(c.client.query_opt(
            "SELECT rows, fingerprint, judged FROM backfill.publishes WHERE manifest = $1 AND try_id = $2 \
             AND target = $3 AND partition_start = $4",
            &[&manifest, &try_id, &task.target, &interval.start],
        ))?;
        c.wait(c.client.batch_execute("COMMIT"))?;
        Ok(row.map(|r| Booked {
            rows: r.get(0),
            fingerprint: r.get(1),
            judged: r.get(2),
        }))
    })();
    match result {
        Ok(found) => {
            conn::give(c);
            Ok(found)
        }
        Err(e) => {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            Err(pg(wh)(e))
        }
    }
}

/// Checks a SQL task against the server before anything runs: the target and its partition
/// column exist, every statement prepares exactly as it will run, the query's columns fit the
/// target, and a table-wide unique key has an index to check it with. Writes nothing.
pub fn check(task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
    let wh = &task.warehouse;
    let problem = |key: &'static str| {
        move |message: String| TaskProblem {
            key,
            offset: None,
            message,
        }
    };
    let mut c = conn::take(wh)
        .map_err(|e| problem("sql")(format!("warehouse `{}` ({}): {e}", wh.name, wh.location())))?;
    let result = check_on(&mut c, task, gate);
    conn::give(c);
    result
}

fn check_on(
    c: &mut Conn,
    task: &SqlTask,
    gate: Option<&Gate>,
) -> std::result::Result<(), TaskProblem> {
    let wh = &task.warehouse;
    let problem = |key: &'static str| {
        move |message: String| TaskProblem {
            key,
            offset: None,
            message,
        }
    };
    let server = |key: &'static str| {
        move |e: tokio_postgres::Error| {
            problem(key)(format!(
                "warehouse `{}` ({}): {}",
                wh.name,
                wh.location(),
                describe(&e)
            ))
        }
    };
    let columns = target_columns(c, &task.target).map_err(server("target"))?;
    if columns.is_empty() {
        return Err(problem("target")(format!(
            "target table `{}` does not exist in warehouse `{}`; create it (schema-qualified names such as analytics.orders_fact work)",
            task.target, wh.name
        )));
    }
    match columns.iter().find(|(n, _)| *n == task.partition_column) {
        None => {
            return Err(problem("target")(format!(
                "target table `{}` has no column `{}` (partition_column)",
                task.target, task.partition_column
            )));
        }
        Some((_, ty)) if ColumnType::of(ty).is_none() => {
            return Err(problem("target")(format!(
                "partition_column `{}` of table `{}` is {ty}; it must be date, timestamp or timestamptz",
                task.partition_column, task.target
            )));
        }
        Some(_) => {}
    }
    let query = Statement::new("sql", &task.sql, 1)?;
    let subquery = wrapped(&query.sql);
    let lead = task.sql.len() - task.sql.trim_start().len();
    let stmt = c
        .wait(c.client.prepare_typed(&subquery, &query.types()))
        .map_err(|e| {
            not_prepared(
                "sql",
                &e,
                strip(&task.sql),
                &query.sql,
                WRAPPED_BEFORE.len(),
                lead,
            )
        })?;
    let out: Vec<String> = stmt
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let have: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
    for col in &out {
        if !have.contains(&col.as_str()) {
            return Err(problem("sql")(format!(
                "the query returns column `{col}`, which target table `{}` does not have (it has: {})",
                task.target,
                have.join(", ")
            )));
        }
    }
    // The insert itself, so that a column whose type does not fit the target's is found now;
    // preparing changes nothing.
    let list = out
        .iter()
        .map(|col| quote_ident(col))
        .collect::<Vec<_>>()
        .join(", ");
    c.wait(c.client.prepare_typed(
        &format!(
            "INSERT INTO {} ({list}) SELECT {list} FROM ({}) w",
            quote_name(&task.target),
            wrapped(&query.sql)
        ),
        &query.types(),
    ))
    .map_err(|e| TaskProblem {
        key: "sql",
        offset: None,
        message: format!(
            "the query's rows do not fit target table `{}`: {}",
            task.target,
            describe(&e)
        ),
    })?;
    let mut needed = vec![&task.partition_column];
    if let Some(g) = gate {
        needed.extend(g.unique_key.iter());
    }
    for col in needed {
        if !out.contains(col) {
            return Err(problem("sql")(format!(
                "the query must return column `{col}` (partition_column or unique_key); it returns: {}",
                out.join(", ")
            )));
        }
    }
    let queries = gate.into_iter().flat_map(|g| {
        [
            ("gate.source_count", &g.source_count),
            ("gate.source_fingerprint", &g.source_fingerprint),
        ]
    });
    for (key, query) in queries {
        let Some(SourceCount::Sql(sql)) = query else {
            continue;
        };
        let s = Statement::new(key, sql, 1)?;
        let stmt = c
            .wait(c.client.prepare_typed(&s.sql, &s.types()))
            .map_err(|e| {
                not_prepared(
                    key,
                    &e,
                    strip(sql),
                    &s.sql,
                    0,
                    sql.len() - sql.trim_start().len(),
                )
            })?;
        if stmt.columns().len() != 1 {
            return Err(problem(key)(format!(
                "key `{key}` must return exactly one column"
            )));
        }
    }
    if let Some(g) = gate.filter(|g| g.unique_key_table && !g.unique_key.is_empty()) {
        let indexed: bool = c
            .wait(c.client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass($1) \
                 AND (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(i.indkey[0:cardinality($2::text[]) - 1]) WITH ORDINALITY k(attnum, n) \
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) @> $2::text[] \
                 AND i.indnatts >= cardinality($2::text[]))",
                &[&quote_name(&task.target), &g.unique_key],
            ))
            .map_err(server("gate.unique_key"))?
            .get(0);
        if !indexed {
            return Err(problem("gate.unique_key")(format!(
                "unique_key_scope = \"table\" looks the output's keys up in the whole table; create an index for it: CREATE INDEX ON {} ({})",
                task.target,
                g.unique_key.join(", ")
            )));
        }
    }
    Ok(())
}

/// A statement of key `key` the server would not prepare: its message, and where it points in
/// the task's text when the rewrite did not move that place (no parameter before it).
fn not_prepared(
    key: &'static str,
    e: &tokio_postgres::Error,
    original: &str,
    rewritten: &str,
    before: usize,
    lead: usize,
) -> TaskProblem {
    let offset = e.as_db_error().and_then(|db| match db.position() {
        Some(ErrorPosition::Original(p)) => {
            // A character position, 1-based, in the statement sent.
            let chars = usize::try_from(*p).ok()?.checked_sub(1)?;
            let sent = format!("{}{rewritten}", &WRAPPED_BEFORE[..before]);
            let byte = sent.char_indices().nth(chars).map(|(b, _)| b)?;
            let at = byte.checked_sub(before)?;
            (rewritten.get(..at)? == original.get(..at)?).then_some(at + lead)
        }
        _ => None,
    });
    TaskProblem {
        key,
        offset,
        message: format!("key `{key}` does not prepare: {}", describe(e)),
    }
}

/// The table that holds the staged output of try `try_id` of a manifest: in the schema of the
/// bookkeeping tables, named by a hash of the manifest's name and the try, so that backfills of
/// several manifests staging into one database never meet.
pub fn staged_table(manifest: &str, try_id: i64) -> String {
    // FNV-1a: the same on every machine and every build.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in manifest.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("backfill.staged_{:08x}_{try_id}", h >> 32)
}

/// The prefix of every staged table of a manifest.
fn staged_prefix(manifest: &str) -> String {
    staged_table(manifest, 0)
        .trim_start_matches("backfill.")
        .trim_end_matches('0')
        .to_string()
}

/// Whether `location` (as recorded for a staged try) names a staged table.
pub fn is_staged_table(location: &str) -> bool {
    location
        .strip_prefix("backfill.staged_")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// A staged output, reopened to promote it.
pub struct Staged {
    table: String,
    manifest: String,
    try_id: i64,
    measures: AuditMeasures,
}

/// Reopens the staged output in `table` for try `try_id` (the promoting try) of `manifest`.
pub fn staged(table: &str, manifest: &str, try_id: i64) -> Box<dyn Pending> {
    Box::new(Staged {
        table: table.to_string(),
        manifest: manifest.to_string(),
        try_id,
        measures: AuditMeasures::default(),
    })
}

impl Pending for Staged {
    fn measures(&self) -> &AuditMeasures {
        &self.measures
    }

    fn file(&self) -> Option<&Path> {
        None
    }

    /// Promotes: in one transaction, the interval's rows of the target are replaced by the
    /// staged rows, whose fingerprint must still be the one the gate saw; the staged table goes
    /// with the same commit.
    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        _waiting: &mut dyn FnMut(),
    ) -> Result<i64> {
        let wh = &p.task.warehouse;
        if !is_staged_table(&self.table) {
            return Err(Error::Message(format!("`{}` is not a staged table", self.table)).at(wh));
        }
        let mut c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
        if crate::fault::point("publish") {
            conn::give(c);
            return Err(Error::Message("connection lost (injected)".into()).at(wh));
        }
        let result = promote_in(&mut c, p, &self.table, &self.manifest, self.try_id, allowed);
        if result.is_err() {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
        }
        conn::give(c);
        result.map_err(|e| e.at(wh))
    }

    fn remove(self: Box<Self>) {}

    fn keep(self: Box<Self>) {}

    fn stage(self: Box<Self>) -> std::result::Result<PathBuf, String> {
        Ok(PathBuf::from(&self.table))
    }
}

fn promote_in(
    c: &mut Conn,
    p: &PublishAs<'_>,
    staged: &str,
    manifest: &str,
    try_id: i64,
    allowed: &Allowed<'_>,
) -> std::result::Result<i64, Failure> {
    let task = p.task;
    book(c)?;
    let (schema, name) = staged.split_once('.').unwrap_or(("backfill", staged));
    let typed: Vec<(String, String)> = target_columns(c, &format!("{schema}.{name}"))?;
    let cols: Vec<String> = typed.iter().map(|(n, _)| n.clone()).collect();
    if cols.is_empty() {
        return Err(Error::Message(format!(
            "the staged output {staged} is gone; stage the interval again"
        ))
        .into());
    }
    let columns = target_columns(c, &task.target)?;
    let Some(ty) = columns
        .iter()
        .find(|(n, _)| *n == task.partition_column)
        .and_then(|(_, t)| ColumnType::of(t))
    else {
        return Err(Error::Message(format!(
            "target table `{}` has no date, timestamp or timestamptz column `{}`",
            task.target, task.partition_column
        ))
        .into());
    };
    let [lo, hi] = ty.bounds(p.interval, p.tz)?;
    let (table, pc) = (
        quote_name(&task.target),
        quote_ident(&task.partition_column),
    );
    let list = cols
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let staged_q = format!("{}.{}", quote_ident(schema), quote_ident(name));
    // The rows being replaced are kept for rollback, as by any publish.
    let kept = match p.keep {
        Some(k) if k.keep > 0 => Some(versions::ensure_kept(c, manifest, &task.target)?),
        _ => None,
    };
    c.wait(
        c.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ"),
    )?;
    let moved = match &kept {
        Some(kept) => {
            let keep_cols = versions::shared_columns(c, kept, &task.target)?.join(", ");
            let n = c.wait(c.client.execute(
                &format!(
                    "WITH d AS (DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 RETURNING *) \
                     INSERT INTO {kept} ({keep_cols}, _replaced_by) SELECT {keep_cols}, $3::int8 FROM d"
                ),
                &[lo.sql(), hi.sql(), &try_id],
            ))?;
            Some(i64::try_from(n).unwrap_or(i64::MAX))
        }
        None => {
            c.wait(c.client.execute(
                &format!("DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2"),
                &[lo.sql(), hi.sql()],
            ))?;
            None
        }
    };
    // Before the insert, which a key of the target would refuse with less to say.
    if let Some(keys) = p.table_keys.filter(|k| !k.is_empty())
        && let Some(found) = key_elsewhere(c, task, keys, &lo, &hi, &staged_q)?
    {
        return Err(Error::Message(format!(
            "unique_key violated across partitions: key {found}; the source moved that record out of its old partition, so rerun the old partition first, then promote again"
        ))
        .into());
    }
    let row = c
        .wait(c.client.query_one(
            &format!(
                "WITH ins AS (INSERT INTO {table} ({list}) SELECT {list} FROM {staged_q} RETURNING *) \
                 SELECT {}",
                fingerprint_sql(&row_hash(&typed), "ins")
            ),
            &[],
        ))
        .and_then(|row| {
            // A deferred constraint is checked now, before anything is booked.
            c.wait(c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE"))
                .map(|()| row)
        })
        .map_err(|e| -> Failure {
            if is_constraint(&e) {
                Error::Message(format!(
                    "{}: {}; nothing was promoted: stage the interval again once the conflicting rows are gone",
                    crate::gate::REFUSED_BY_TARGET,
                    constraint_message(&e)
                ))
                .into()
            } else {
                e.into()
            }
        })?;
    let fingerprint = format!("pg:{}", row.get::<_, String>(0));
    let rows: i64 = fingerprint
        .trim_start_matches("pg:")
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if let Some(expected) = p.expect_fingerprint
        && expected != fingerprint
    {
        return Err(Error::Message(format!(
            "the staged output {staged} changed since it was staged (fingerprint {fingerprint}, staged {expected}); stage the interval again"
        ))
        .into());
    }
    let written = Written {
        moved,
        columns: cols,
    };
    finish_versions(c, manifest, p, &written, try_id, &fingerprint)?;
    lock_and_book(
        c,
        &task.target,
        p.interval,
        manifest,
        try_id,
        rows,
        &fingerprint,
    )?;
    ask(allowed)?;
    if let Some(m) = p.in_manifest {
        InPublishValues::of(m, try_id, rows, p.interval).run(c)?;
    }
    let committed = c.wait(
        c.client
            .batch_execute(&format!("DROP TABLE {staged_q}; COMMIT")),
    );
    settled(c, committed, task, p.interval, manifest, try_id).map(|()| rows)
}

/// A key of the staged output that a partition of the target other than the interval's holds,
/// with that partition (`unique_key_scope = "table"`), looked up through the key's index.
fn key_elsewhere(
    c: &Conn,
    task: &SqlTask,
    keys: &[String],
    lo: &Value,
    hi: &Value,
    staged: &str,
) -> std::result::Result<Option<String>, Failure> {
    let pc = quote_ident(&task.partition_column);
    let k = keys
        .iter()
        .map(|k| quote_ident(k))
        .collect::<Vec<_>>()
        .join(", ");
    let tk = keys
        .iter()
        .map(|k| format!("t.{}", quote_ident(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let row = c.wait(c.client.query_opt(
        &format!(
            "SELECT concat_ws(' ', ({tk})::text, 'in partition', t.{pc}::text) FROM {} t \
             WHERE ({tk}) IN (SELECT {k} FROM {staged}) AND NOT (t.{pc} >= $1 AND t.{pc} < $2) LIMIT 1",
            quote_name(&task.target)
        ),
        &[lo.sql(), hi.sql()],
    ))?;
    Ok(row.map(|r| r.get(0)))
}

/// Drops a staged table (a discarded output); a table that is gone already is not an error.
pub fn drop_staged(w: &Warehouse, table: &str) -> Result<()> {
    if !is_staged_table(table) {
        return Ok(());
    }
    let c = conn::take(w).map_err(|e| Error::Message(e).at(w))?;
    let dropped = c.wait(
        c.client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}")),
    );
    conn::give(c);
    dropped.map_err(pg(w))
}

/// Drops the staged tables of manifest `manifest` whose try `keep` does not name: outputs of
/// tries that were killed between staging and recording it, or whose staging the manifest
/// settled otherwise. Returns how many went.
pub fn sweep_staged(w: &Warehouse, manifest: &str, keep: &dyn Fn(i64) -> bool) -> Result<usize> {
    let c = conn::take(w).map_err(|e| Error::Message(e).at(w))?;
    let prefix = staged_prefix(manifest);
    let found = c.wait(c.client.query(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'backfill' AND c.relkind = 'r' AND starts_with(c.relname::text, $1)",
        &[&prefix],
    ));
    let mut gone = 0;
    let result = found.map_err(pg(w)).and_then(|rows| {
        for r in rows {
            let name: String = r.get(0);
            let Some(try_id) = name
                .strip_prefix(&prefix)
                .and_then(|t| t.parse::<i64>().ok())
            else {
                continue;
            };
            if !keep(try_id) {
                c.wait(c.client.batch_execute(&format!(
                    "DROP TABLE IF EXISTS backfill.{}",
                    quote_ident(&name)
                )))
                .map_err(pg(w))?;
                gone += 1;
            }
        }
        Ok(gone)
    });
    conn::give(c);
    result
}

/// How long a booking stays in `backfill.publishes` once its try's outcome is recorded: it is
/// needed only until then, and kept a while longer for whoever looks into a recovery.
const KEEP_BOOKINGS: &str = "7 days";

/// Deletes this manifest's bookings older than [`KEEP_BOOKINGS`] of tries below `below` (all
/// recorded as ended, see `first_unfinished_try`), so that `backfill.publishes` does not grow
/// without end.
pub fn prune_bookings(w: &Warehouse, manifest: &str, below: i64) -> Result<u64> {
    let c = conn::take(w).map_err(|e| Error::Message(e).at(w))?;
    let result = (|| -> std::result::Result<u64, tokio_postgres::Error> {
        if !has_bookings(&c)? {
            return Ok(0);
        }
        c.wait(c.client.execute(
            &format!(
                "DELETE FROM backfill.publishes WHERE manifest = $1 AND try_id < $2 \
                 AND published_at < now() - interval '{KEEP_BOOKINGS}'"
            ),
            &[&manifest, &below],
        ))
    })();
    conn::give(c);
    result.map_err(pg(w))
}

/// The rows the target holds for the interval now, with their fingerprint over the columns
/// `cols` (those of the staged output), whatever the manifest recorded.
pub fn published(
    task: &SqlTask,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> Result<(i64, String)> {
    let wh = &task.warehouse;
    let c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let result = (|| -> std::result::Result<(i64, String), Failure> {
        let (list, fp, lo, hi) = shape(&c, task, interval, tz, staged)?;
        let row = c.wait(c.client.query_one(
            &format!(
                "WITH p AS (SELECT {list} FROM {} WHERE {pc} >= $1 AND {pc} < $2) SELECT {}",
                quote_name(&task.target),
                fingerprint_sql(&fp, "p"),
                pc = quote_ident(&task.partition_column),
            ),
            &[lo.sql(), hi.sql()],
        ))?;
        let fingerprint: String = row.get(0);
        let rows = fingerprint
            .split(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok((rows, format!("pg:{fingerprint}")))
    })();
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// The staged table's columns as a select list, and the interval's bounds on the partition
/// column.
fn shape(
    c: &Conn,
    task: &SqlTask,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> std::result::Result<(String, String, Value, Value), Failure> {
    let cols = target_columns(c, staged)?;
    if cols.is_empty() {
        return Err(Error::Message(format!(
            "the staged output {staged} is gone; stage the interval again"
        ))
        .into());
    }
    let target = target_columns(c, &task.target)?;
    let ty = target
        .iter()
        .find(|(n, _)| *n == task.partition_column)
        .and_then(|(_, t)| ColumnType::of(t))
        .ok_or_else(|| {
            Error::Message(format!(
                "target table `{}` has no partition column `{}`",
                task.target, task.partition_column
            ))
        })?;
    let [lo, hi] = ty.bounds(interval, tz)?;
    let list = cols
        .iter()
        .map(|(n, _)| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ");
    let fp = row_hash(&cols);
    Ok((list, fp, lo, hi))
}

/// What promoting the staged output in `staged` would change in the interval's published rows,
/// by the unique key `key`: computed in the server.
pub fn diff_keys(
    task: &SqlTask,
    key: &[String],
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> Result<Option<super::diff::KeyDiff>> {
    let wh = &task.warehouse;
    let c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let result = (|| -> std::result::Result<Option<super::diff::KeyDiff>, Failure> {
        if target_columns(&c, staged)?.is_empty() {
            return Ok(None);
        }
        let (list, _, lo, hi) = shape(&c, task, interval, tz, staged)?;
        let k = key
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let with = format!(
            "WITH p AS (SELECT {list} FROM {} WHERE {pc} >= $1 AND {pc} < $2), s AS (SELECT {list} FROM {staged})",
            quote_name(&task.target),
            pc = quote_ident(&task.partition_column),
        );
        let sets = [
            format!("SELECT {k} FROM s EXCEPT SELECT {k} FROM p"),
            format!("SELECT {k} FROM p EXCEPT SELECT {k} FROM s"),
            format!(
                // Rows compared by their text, as fingerprints compare them: a type without
                // an equality operator (json) compares too.
                "SELECT {k} FROM (SELECT {k}, ROW(s.*)::text FROM s EXCEPT SELECT {k}, ROW(p.*)::text FROM p) x \
                 INTERSECT SELECT {k} FROM p"
            ),
        ];
        let order = (1..=key.len())
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = super::diff::KeyDiff::default();
        for (n, set) in sets.iter().enumerate() {
            let count: i64 = c
                .wait(c.client.query_one(
                    &format!("{with} SELECT count(*) FROM ({set}) d"),
                    &[lo.sql(), hi.sql()],
                ))?
                .get(0);
            let rows = c.wait(c.client.query(
                &format!(
                    "{with} SELECT to_jsonb(d)::text FROM (SELECT * FROM ({set}) e ORDER BY {order} LIMIT {}) d",
                    super::diff::EXAMPLES
                ),
                &[lo.sql(), hi.sql()],
            ))?;
            let examples = rows
                .iter()
                .map(|r| {
                    let doc: String = r.get(0);
                    let values: Vec<serde_json::Value> = match serde_json::from_str::<
                        serde_json::Map<String, serde_json::Value>,
                    >(&doc)
                    {
                        Ok(m) => key
                            .iter()
                            .map(|k| m.get(k).cloned().unwrap_or(serde_json::Value::Null))
                            .collect(),
                        Err(_) => Vec::new(),
                    };
                    match values.as_slice() {
                        [one] => one.clone(),
                        _ => serde_json::Value::Array(values),
                    }
                })
                .collect();
            match n {
                0 => (out.added, out.examples.added) = (count, examples),
                1 => (out.removed, out.examples.removed) = (count, examples),
                _ => (out.changed, out.examples.changed) = (count, examples),
            }
        }
        Ok(Some(out))
    })();
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// The task's query's columns.
fn query_columns(c: &mut Conn, task: &SqlTask) -> std::result::Result<Vec<String>, Failure> {
    let query = Statement::new("sql", &task.sql, 1).map_err(|p| Error::Message(p.message))?;
    let subquery = wrapped(&query.sql);
    let shape = prepared(c, &subquery, &query.types())?;
    Ok(shape
        .columns()
        .iter()
        .map(|col| col.name().to_string())
        .collect())
}

/// The version kept for the publish of try `key`, with the fingerprint of its rows over the
/// query's columns (what the partition holds once it is put back).
pub fn kept_version(
    task: &SqlTask,
    manifest: &str,
    key: i64,
) -> Result<Option<(crate::warehouse::versions::Version, String)>> {
    let wh = &task.warehouse;
    let mut c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let result = (|| {
        let Some(v) = versions::find(&c, manifest, &task.target, key)? else {
            return Ok(None);
        };
        let columns = query_columns(&mut c, task)?;
        let fingerprint = kept_fingerprint(&c, manifest, &task.target, &columns, key)?
            .unwrap_or_else(|| "-".into());
        Ok(Some((v, fingerprint)))
    })();
    conn::give(c);
    result.map_err(|e: Failure| e.at(wh))
}

/// Rolls the interval back to the version kept for the publish of `key`, in one transaction
/// that the manifest must allow, booked like a publish (as try `try_id`), and recorded in the
/// manifest by that transaction when the manifest is in this database.
pub fn roll_back(r: &super::backend::RollBack<'_>, allowed: &Allowed<'_>) -> Result<i64> {
    let super::backend::RollBack {
        task,
        interval,
        tz,
        key,
        manifest,
        try_id,
        fingerprint,
        ..
    } = *r;
    let wh = &task.warehouse;
    let mut c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let result = (|| -> std::result::Result<i64, Failure> {
        book(&mut c)?;
        let columns = target_columns(&c, &task.target)?;
        let ty = columns
            .iter()
            .find(|(n, _)| *n == task.partition_column)
            .and_then(|(_, t)| ColumnType::of(t))
            .ok_or_else(|| {
                Error::Message(format!(
                    "target table `{}` has no partition column `{}`",
                    task.target, task.partition_column
                ))
            })?;
        let [lo, hi] = ty.bounds(interval, tz)?;
        let pc = quote_ident(&task.partition_column);
        c.wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ"),
        )?;
        if versions::find(&c, manifest, &task.target, key)?.is_none() {
            return Err(Error::Message(format!(
                "the version kept for try {key} is gone from {}",
                task.target
            ))
            .into());
        }
        c.wait(c.client.execute(
            &format!(
                "DELETE FROM {} WHERE {pc} >= $1 AND {pc} < $2",
                quote_name(&task.target)
            ),
            &[lo.sql(), hi.sql()],
        ))?;
        let rows = versions::restore(&mut c, manifest, &task.target, key)?;
        lock_and_book(
            &mut c,
            &task.target,
            interval,
            manifest,
            try_id,
            rows,
            fingerprint,
        )?;
        ask(allowed)?;
        if let Some(m) = r.in_manifest {
            InPublishValues::of(m, try_id, rows, interval).run(&mut c)?;
        }
        let committed = c.wait(c.client.batch_execute("COMMIT"));
        settled(&c, committed, task, interval, manifest, try_id).map(|()| rows)
    })();
    if result.is_err() {
        let _ = c.wait(c.client.batch_execute("ROLLBACK"));
    }
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// What the kept versions of a task's target cost: versions, rows, and bytes of the kept table
/// with its index (all of it belongs to this manifest and target).
pub fn storage(task: &SqlTask, manifest: &str) -> Result<crate::warehouse::versions::Storage> {
    let wh = &task.warehouse;
    let c = conn::take(wh).map_err(|e| Error::Message(e).at(wh))?;
    let kept = versions::kept_table(manifest, &task.target);
    let row = c.wait(c.client.query_one(
        "SELECT CASE WHEN to_regclass('backfill.versions') IS NULL THEN 0 ELSE \
           (SELECT count(*) FROM backfill.versions WHERE manifest = $1 AND target = $2) END, \
         CASE WHEN to_regclass('backfill.versions') IS NULL THEN 0 ELSE \
           (SELECT coalesce(sum(rows), 0)::int8 FROM backfill.versions WHERE manifest = $1 AND target = $2) END, \
         coalesce(pg_total_relation_size(to_regclass($3)), 0)",
        &[&manifest, &task.target, &kept],
    ));
    conn::give(c);
    let row = row.map_err(pg(wh))?;
    Ok(crate::warehouse::versions::Storage {
        target: task.target.clone(),
        versions: row.get(0),
        rows: row.get(1),
        bytes: row.get(2),
    })
}
