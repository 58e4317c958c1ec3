//! The built-in SQLite warehouse: fixture creation from init files, the audit tables of SQL
//! tasks, the measures the gate needs, fingerprints, and the publish transaction.
//!
//! Write-audit-publish: a try's rows go into an audit table (`CREATE TABLE ... AS SELECT`); the
//! gate reads the audit table; publishing deletes exactly the target rows whose partition column
//! lies in the interval, inserts the audited rows and drops the audit table, in one transaction.
//! Interval values are always bound as parameters, never spliced into SQL; the names that are
//! spliced (tables, columns) were checked to be plain identifiers when the DAG was loaded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, Statement};

use crate::interval::DataInterval;
use crate::project::{Gate, SourceCount, SqlTask, Warehouse};

/// The bind parameters a SQL task may use.
pub const PARAMS: &[&str] = &[
    ":data_interval_start",
    ":data_interval_end",
    ":ds",
    ":next_ds",
    ":ds_nodash",
];

/// Values of the bind parameters for one interval.
#[derive(Debug, Clone)]
pub struct Binds {
    /// `YYYY-MM-DD HH:MM:SS` in UTC: SQLite's own format, comparable with `datetime()`.
    pub data_interval_start: String,
    pub data_interval_end: String,
    /// Local dates (DAG timezone) of the interval start and end.
    pub ds: String,
    pub next_ds: String,
    pub ds_nodash: String,
}

impl Binds {
    pub fn new(interval: DataInterval, tz: chrono_tz::Tz) -> Self {
        let sqlite = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
        let ds = interval.ds(tz);
        Self {
            data_interval_start: sqlite(interval.start),
            data_interval_end: sqlite(interval.end),
            ds_nodash: ds.replace('-', ""),
            next_ds: interval
                .end
                .with_timezone(&tz)
                .format("%Y-%m-%d")
                .to_string(),
            ds,
        }
    }

    fn value(&self, name: &str) -> Option<&str> {
        Some(match name {
            ":data_interval_start" => &self.data_interval_start,
            ":data_interval_end" => &self.data_interval_end,
            ":ds" => &self.ds,
            ":next_ds" => &self.next_ds,
            ":ds_nodash" => &self.ds_nodash,
            _ => return None,
        })
    }

    /// Binds every parameter of `stmt`; an unknown name is an error.
    pub fn bind(&self, stmt: &mut Statement<'_>) -> anyhow::Result<()> {
        for i in 1..=stmt.parameter_count() {
            let name = stmt.parameter_name(i).unwrap_or("?").to_string();
            let value = self.value(&name).ok_or_else(|| {
                anyhow!("unknown bind parameter `{name}`; use {}", PARAMS.join(", "))
            })?;
            stmt.raw_bind_parameter(i, value)?;
        }
        Ok(())
    }
}

/// Quotes an identifier for SQLite.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Whether a value of the partition column lies in the interval: a `YYYY-MM-DD` date is compared
/// with the interval's local dates, unix seconds and timestamps with its UTC instants. NULL
/// never lies in an interval.
pub fn in_interval(column: &str) -> String {
    let c = quote(column);
    format!(
        "COALESCE(CASE \
           WHEN typeof({c}) = 'text' AND length({c}) = 10 THEN {c} >= :ds AND {c} < :next_ds \
           WHEN typeof({c}) IN ('integer', 'real') THEN datetime({c}, 'unixepoch') >= :data_interval_start AND datetime({c}, 'unixepoch') < :data_interval_end \
           ELSE datetime({c}) >= :data_interval_start AND datetime({c}) < :data_interval_end END, 0)"
    )
}

/// Opens a warehouse, creating it from its init files first when the file does not exist.
pub fn open(w: &Warehouse) -> anyhow::Result<Connection> {
    init(w)?;
    let conn = Connection::open(&w.path)
        .with_context(|| format!("cannot open warehouse `{}` at {}", w.name, w.path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    retry_busy(None, || {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(Into::into)
    })?;
    Ok(conn)
}

/// Runs the init files once, in order, in one transaction, into a temporary file that is then
/// linked into place: two processes racing to create the warehouse cannot both seed it.
fn init(w: &Warehouse) -> anyhow::Result<()> {
    if w.path.exists() {
        return Ok(());
    }
    if let Some(dir) = w.path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = w
        .path
        .with_extension(format!("init-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> anyhow::Result<()> {
        let conn = Connection::open(&tmp)?;
        conn.execute_batch("BEGIN")?;
        for file in &w.init {
            let sql = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read init file {}", file.display()))?;
            conn.execute_batch(&sql).with_context(|| {
                format!(
                    "warehouse `{}`: init file {} failed",
                    w.name,
                    file.display()
                )
            })?;
        }
        conn.execute_batch("COMMIT")?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    match std::fs::hard_link(&tmp, &w.path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(anyhow!(e).context(format!("cannot create {}", w.path.display())));
        }
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

fn is_busy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<rusqlite::Error>().is_some_and(|e| {
            matches!(
                e.sqlite_error_code(),
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
            )
        })
    })
}

/// Runs `f` until it does not fail with SQLITE_BUSY: a warehouse locked by another writer is
/// waited for, never reported as a failure. Stops early when `cancel` is set.
pub fn retry_busy<R>(
    cancel: Option<&AtomicBool>,
    mut f: impl FnMut() -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let mut pause = Duration::from_millis(5);
    loop {
        match f() {
            Err(e) if is_busy(&e) => {
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return Err(e.context("cancelled while the warehouse was locked"));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Runs `f` in a `BEGIN IMMEDIATE` transaction, retried while the warehouse is locked.
fn write_transaction<R>(
    conn: &Connection,
    cancel: Option<&AtomicBool>,
    f: impl Fn(&Connection) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    retry_busy(cancel, || {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        match f(conn).and_then(|r| {
            conn.execute_batch("COMMIT")?;
            Ok(r)
        }) {
            Ok(r) => Ok(r),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    })
}

fn strip(sql: &str) -> &str {
    sql.trim().trim_end_matches(';').trim_end()
}

/// Checks a SQL task against its warehouse before anything runs: the statements prepare, use
/// only known bind parameters, and produce columns that the target table has.
pub fn check_task(conn: &Connection, task: &SqlTask, gate: Option<&Gate>) -> Result<(), String> {
    let stmt = conn
        .prepare(strip(&task.sql))
        .map_err(|e| format!("key `sql` does not prepare: {e}"))?;
    check_params(&stmt, "sql")?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    drop(stmt);
    let target_columns = table_columns(conn, &task.target).map_err(|e| e.to_string())?;
    if target_columns.is_empty() {
        return Err(format!(
            "target table `{}` does not exist in warehouse `{}`; create it in the warehouse's init files",
            task.target, task.warehouse.name
        ));
    }
    if !target_columns.contains(&task.partition_column) {
        return Err(format!(
            "target table `{}` has no column `{}` (partition_column)",
            task.target, task.partition_column
        ));
    }
    for c in &columns {
        if !target_columns.contains(c) {
            return Err(format!(
                "the query returns column `{c}`, which target table `{}` does not have (it has: {})",
                task.target,
                target_columns.join(", ")
            ));
        }
    }
    let mut needed = vec![&task.partition_column];
    if let Some(g) = gate {
        needed.extend(g.unique_key.iter());
    }
    for c in needed {
        if !columns.contains(c) {
            return Err(format!(
                "the query must return column `{c}` (partition_column or unique_key); it returns: {}",
                columns.join(", ")
            ));
        }
    }
    if let Some(Gate {
        source_count: Some(SourceCount::Sql(sql)),
        ..
    }) = gate
    {
        let stmt = conn
            .prepare(strip(sql))
            .map_err(|e| format!("key `gate.source_count` does not prepare: {e}"))?;
        check_params(&stmt, "gate.source_count")?;
        if stmt.column_count() != 1 {
            return Err("key `gate.source_count` must return exactly one column".into());
        }
    }
    Ok(())
}

fn check_params(stmt: &Statement<'_>, key: &str) -> Result<(), String> {
    for i in 1..=stmt.parameter_count() {
        match stmt.parameter_name(i) {
            Some(name) if PARAMS.contains(&name) => {}
            other => {
                return Err(format!(
                    "key `{key}` uses bind parameter `{}`; use named parameters {}",
                    other.unwrap_or("?"),
                    PARAMS.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn table_columns(conn: &Connection, table: &str) -> anyhow::Result<Vec<String>> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({})", quote(table)))?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<Result<_, _>>()?;
    Ok(names)
}

/// Whether a table exists.
pub fn table_exists(conn: &Connection, table: &str) -> anyhow::Result<bool> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |r| r.get::<_, i64>(0),
    )? > 0)
}

/// Computes the task's rows for the interval into the audit table `audit` (replacing it).
pub fn write_audit(
    conn: &Connection,
    task: &SqlTask,
    audit: &str,
    binds: &Binds,
    cancel: Option<&AtomicBool>,
) -> anyhow::Result<()> {
    write_transaction(conn, cancel, |c| {
        c.execute_batch(&format!("DROP TABLE IF EXISTS {}", quote(audit)))?;
        let mut stmt = c.prepare(&format!(
            "CREATE TABLE {} AS SELECT * FROM ({})",
            quote(audit),
            strip(&task.sql)
        ))?;
        binds.bind(&mut stmt)?;
        stmt.raw_execute()?;
        Ok(())
    })
}

/// What the gate needs to know about an audit table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditMeasures {
    pub rows: i64,
    pub outside: i64,
    pub duplicate_keys: Option<i64>,
    pub fingerprint: String,
}

pub fn measure(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
    audit: &str,
    binds: &Binds,
) -> anyhow::Result<AuditMeasures> {
    let (rows, fingerprint) = fingerprint(conn, audit)?;
    let mut stmt = conn.prepare(&format!(
        "SELECT COUNT(*) FROM {} WHERE NOT {}",
        quote(audit),
        in_interval(&task.partition_column)
    ))?;
    binds.bind(&mut stmt)?;
    let outside: i64 = first_value(&mut stmt)?.unwrap_or(0);
    let duplicate_keys = match gate {
        Some(g) if !g.unique_key.is_empty() => {
            let key = g
                .unique_key
                .iter()
                .map(|k| quote(k))
                .collect::<Vec<_>>()
                .join(", ");
            Some(conn.query_row(
                &format!(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM {} GROUP BY {key} HAVING COUNT(*) > 1)",
                    quote(audit)
                ),
                [],
                |r| r.get(0),
            )?)
        }
        _ => None,
    };
    Ok(AuditMeasures {
        rows,
        outside,
        duplicate_keys,
        fingerprint,
    })
}

/// Counts the source rows with the gate's SQL.
pub fn source_count(conn: &Connection, sql: &str, binds: &Binds) -> anyhow::Result<i64> {
    let mut stmt = conn.prepare(strip(sql))?;
    binds.bind(&mut stmt)?;
    first_value(&mut stmt)?.ok_or_else(|| anyhow!("gate.source_count returned no row or NULL"))
}

/// The first column of the first row of a statement whose parameters are already bound.
fn first_value(stmt: &mut Statement<'_>) -> anyhow::Result<Option<i64>> {
    let mut rows = stmt.raw_query();
    match rows.next()? {
        Some(row) => Ok(row.get(0)?),
        None => Ok(None),
    }
}

/// Row count and an order-independent fingerprint of a table: the wrapping sum of a 64-bit
/// FNV-1a hash of each row's typed values, in hex.
pub fn fingerprint(conn: &Connection, table: &str) -> anyhow::Result<(i64, String)> {
    let mut stmt = conn.prepare(&format!("SELECT * FROM {}", quote(table)))?;
    let n = stmt.column_count();
    let mut rows = stmt.query([])?;
    let (mut count, mut sum) = (0i64, 0u64);
    while let Some(r) = rows.next()? {
        let mut h = Fnv::new();
        for i in 0..n {
            match r.get_ref(i)? {
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
        sum = sum.wrapping_add(h.0);
        count += 1;
    }
    Ok((count, format!("{sum:016x}")))
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

/// Replaces the interval's partition of the target with the audited rows (none when `audit` is
/// `None`: an explicit empty partition) and drops the audit table, in one transaction. Redoing
/// it gives the same result, so an interrupted publish is simply redone.
pub fn publish(
    conn: &Connection,
    task: &SqlTask,
    audit: Option<&str>,
    binds: &Binds,
    cancel: Option<&AtomicBool>,
) -> anyhow::Result<i64> {
    write_transaction(conn, cancel, |c| {
        let mut delete = c.prepare(&format!(
            "DELETE FROM {} WHERE {}",
            quote(&task.target),
            in_interval(&task.partition_column)
        ))?;
        binds.bind(&mut delete)?;
        delete.raw_execute()?;
        let Some(audit) = audit else {
            return Ok(0);
        };
        let columns = table_columns(c, audit)?;
        if columns.is_empty() {
            bail!("audit table `{audit}` is missing");
        }
        let list = columns
            .iter()
            .map(|c| quote(c))
            .collect::<Vec<_>>()
            .join(", ");
        let inserted = c.execute(
            &format!(
                "INSERT INTO {} ({list}) SELECT {list} FROM {}",
                quote(&task.target),
                quote(audit)
            ),
            [],
        )?;
        c.execute_batch(&format!("DROP TABLE {}", quote(audit)))?;
        Ok(i64::try_from(inserted)?)
    })
}

/// Drops an audit table if it exists.
pub fn drop_audit(conn: &Connection, audit: &str) -> anyhow::Result<()> {
    retry_busy(None, || {
        conn.execute_batch(&format!("DROP TABLE IF EXISTS {}", quote(audit)))
            .map_err(Into::into)
    })
}

/// The audit table name of a try.
pub fn audit_table(task: &SqlTask, try_id: i64) -> String {
    format!("_backfill_audit_{}_{try_id}", task.target)
}

/// A cancel flag shared with a blocking SQL step, and the connection's interrupt handle.
#[derive(Clone, Default)]
pub struct Cancel(pub Arc<AtomicBool>);

impl Cancel {
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn flag(&self) -> &AtomicBool {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval() -> DataInterval {
        let t = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        DataInterval::new(t("2026-09-01T00:00:00Z"), t("2026-09-02T00:00:00Z"))
    }

    #[test]
    fn the_interval_predicate_handles_dates_timestamps_and_epochs() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (p)").unwrap();
        for v in [
            "'2026-09-01'",
            "'2026-09-02'",
            "'2026-08-31'",
            "'2026-09-01 23:59:59'",
            "'2026-09-02 00:00:00'",
            "'2026-09-01T12:00:00Z'",
            "1788220800",
            "NULL",
        ] {
            conn.execute_batch(&format!("INSERT INTO t VALUES ({v})"))
                .unwrap();
        }
        let binds = Binds::new(interval(), chrono_tz::Tz::UTC);
        let mut stmt = conn
            .prepare(&format!("SELECT p FROM t WHERE {}", in_interval("p")))
            .unwrap();
        binds.bind(&mut stmt).unwrap();
        let inside: Vec<String> = stmt
            .raw_query()
            .mapped(|r| Ok(format!("{:?}", r.get::<_, rusqlite::types::Value>(0)?)))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            inside,
            [
                "Text(\"2026-09-01\")",
                "Text(\"2026-09-01 23:59:59\")",
                "Text(\"2026-09-01T12:00:00Z\")",
                "Integer(1788220800)"
            ]
        );
    }

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
    fn unknown_bind_parameters_are_errors() {
        let conn = Connection::open_in_memory().unwrap();
        let mut stmt = conn.prepare("SELECT :ds, :dss").unwrap();
        let err = Binds::new(interval(), chrono_tz::Tz::UTC)
            .bind(&mut stmt)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown bind parameter `:dss`"), "{err}");
    }
}
