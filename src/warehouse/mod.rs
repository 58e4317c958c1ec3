//! The built-in SQLite warehouse: fixture creation from init files, the bind parameters of SQL
//! tasks, pre-flight checks, audit files, partition predicates and the publish transaction.
//!
//! Write-audit-publish: a try's rows are computed into a table of its own audit file (a small
//! SQLite database attached to the warehouse connection), together with the gate's measures and
//! the source count, all from one read snapshot of the warehouse and without its write lock.
//! Publishing deletes exactly the target rows of the interval (a range on the partition column
//! that its index serves) and inserts the audited rows, in one short transaction; publishes of
//! one process queue on a lock rather than retrying. Interval values are always bound as
//! parameters, never spliced into SQL; the names that are spliced (tables, columns) were checked
//! to be plain identifiers when the DAG was loaded.

pub mod audit;
pub(crate) mod backend;
pub(crate) mod busy;
pub(crate) mod diff;
pub(crate) mod init;
pub(crate) mod merge;
pub(crate) mod partition;
pub(crate) mod pool;
pub(crate) mod postgres;
pub(crate) mod publish;
pub mod rules;
pub(crate) mod validate;
pub(crate) mod versions;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Statement};

use crate::interval::DataInterval;
use crate::project::{Gate, SourceCount, SqlTask, Warehouse, WarehouseKind};

pub use audit::{AuditFile, AuditMeasures};
pub(crate) use backend::{Booked, Holding, Settlement, Sharing};
pub(crate) use busy::{retry_busy, retry_busy_noting};
pub use partition::Repr;

/// The backend of a warehouse (here, where both engines are in view: neither imports the other).
pub(crate) fn backend_of(w: &Warehouse) -> &'static dyn backend::Backend {
    match w.kind {
        WarehouseKind::Sqlite => &backend::Sqlite,
        WarehouseKind::Postgres(_) => &postgres::Postgres,
    }
}

/// Whether the manifest still allows a publish; asked inside the publish transaction.
pub(crate) type Allowed<'a> = dyn Fn() -> std::result::Result<bool, AskError> + 'a;

/// Why the manifest could not say whether a publish may happen: its own error, kept whole
/// (the warehouse never looks into the manifest).
pub(crate) type AskError = Box<dyn std::error::Error + Send + Sync>;

/// Where what a warehouse has to say while it works goes (see [`on_notice`]).
static NOTICES: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Hands what a warehouse has to say while it works (that a write waits for another
/// process's lock, which can last minutes) to `say`, once per process: the warehouse never
/// writes to the terminal itself. Unless it is called, notices are dropped.
pub(crate) fn on_notice(say: fn(&str)) {
    let _ = NOTICES.set(say);
}

/// Says `text` through the process's [`on_notice`].
fn notice(text: String) {
    if let Some(say) = NOTICES.get() {
        say(&text);
    }
}

/// Closes every idle warehouse connection of this process, of both engines.
pub(crate) fn close_all() {
    pool::close_all();
    postgres::conn::close_all();
}

/// Publishes pending outputs of one warehouse in one transaction (`promote --atomic`): all of
/// them, or none. `group` pairs each output with how to publish it. `allowed` is asked inside
/// the transaction, as for one publish. Returns each one's rows, in order; what a merge did is
/// each output's [`backend::Pending::merged`].
pub(crate) fn publish_group(
    group: &mut [(
        &mut (dyn backend::Pending + 'static),
        backend::PublishAs<'_>,
    )],
    allowed: &backend::Allowed<'_>,
    waiting: &mut dyn FnMut(),
) -> Result<Vec<i64>> {
    let mut audited = Vec::new();
    let mut staged = Vec::new();
    for (output, p) in group.iter_mut() {
        match output.member() {
            Some(backend::Member::Audited(a)) => audited.push((a, &*p)),
            Some(m @ backend::Member::Staged { .. }) => staged.push((m, &*p)),
            None => {
                return Err(Error::Message(format!(
                    "the output of `{}` for {} cannot be published together with others",
                    p.task.target, p.interval
                )));
            }
        }
    }
    if !staged.is_empty() {
        if !audited.is_empty() {
            return Err(Error::Message(
                "the outputs are in more than one warehouse: one transaction cannot publish them all".into(),
            ));
        }
        return postgres::promote_group(&mut staged, allowed);
    }
    let Some((_, first)) = audited.first() else {
        return Ok(Vec::new());
    };
    let w = first.task.warehouse.clone();
    if let Some((_, p)) = audited
        .iter()
        .find(|(_, p)| p.task.warehouse.path != w.path)
    {
        return Err(Error::Message(format!(
            "`{}` is in warehouse `{}`, not `{}`: one transaction cannot publish them all",
            p.task.target, p.task.warehouse.name, w.name
        )));
    }
    let conn = pool::take(&w)?;
    if crate::fault::point("publish") {
        return Err(Error::Message("disk I/O error (injected)".into()));
    }
    let mut publishes: Vec<publish::Publish<'_>> =
        audited.iter().map(|(a, p)| a.publish_as(p)).collect();
    let rows = publish::publish_group(&conn, &mut publishes, allowed, waiting)
        .map_err(|e| e.at_file(&w))?;
    let merged: Vec<_> = publishes.iter().map(|p| p.merged.get()).collect();
    drop(publishes);
    for ((a, _), m) in audited.iter_mut().zip(merged) {
        a.merged = m;
    }
    Ok(rows)
}

/// What can go wrong in a warehouse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("warehouse `{name}` ({location}): {}", crate::limits::sqlite(source))]
    Db {
        name: String,
        location: String,
        source: rusqlite::Error,
    },
    #[error("warehouse `{name}` ({location}): {message}")]
    Other {
        name: String,
        /// Its file, or its URL without the password.
        location: String,
        message: String,
    },
    #[error("{}", crate::limits::sqlite(.0))]
    Sql(#[from] rusqlite::Error),
    #[error("{0}")]
    Message(String),
    /// The manifest could not say whether a publish may happen.
    #[error("cannot ask the manifest: {0}")]
    Ask(AskError),
    #[error("audit file {}: {}", path.display(), crate::limits::io(source))]
    Audit {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cancelled while the warehouse was locked")]
    Cancelled,
    /// Another process held the warehouse's write lock and got nowhere for
    /// [`busy::PATIENCE`]: a fault of the environment (a frozen owner, a stray transaction),
    /// not of the try. `holder` is the process, when this host can name it.
    #[error(
        "warehouse `{name}` ({}) is locked: {}; gave up after waiting {}",
        path.display(),
        locked_holder(*holder, *stopped),
        humantime::format_duration(*waited)
    )]
    LockedBy {
        name: String,
        path: PathBuf,
        holder: Option<i32>,
        stopped: bool,
        waited: Duration,
    },
    /// The manifest no longer lets this try publish (it was fenced or already published).
    #[error("the manifest no longer allows this publish (taken over or already published)")]
    Refused,
    /// A constraint of the target (a key, a unique index, a check) refused the output: the
    /// database's words. Nothing was published; the try is rejected, not failed, since running
    /// it again gives the same rows.
    #[error("{}: {}", crate::gate::REFUSED_BY_TARGET, .0)]
    Constraint(String),
    /// The machine or the warehouse's server failed, not the task: a full disk, no descriptors
    /// or memory left, a file this user may not write, a server out of reach (see
    /// [`crate::environment`]). The runner stops the backfill on it rather than failing the
    /// interval.
    #[error("{0}")]
    Environment(crate::environment::Fault),
}

impl Error {
    /// Says which output of a group (`promote --atomic`) a refusal or failure is about.
    pub(crate) fn of(self, what: &str) -> Self {
        match self {
            Self::Message(m) => Self::Message(format!("{what}: {m}")),
            Self::Constraint(m) => Self::Constraint(format!("{what}: {m}")),
            other => other,
        }
    }

    /// Names the warehouse in an error that does not say which database it is about.
    pub(crate) fn at(self, w: &Warehouse) -> Self {
        match self {
            Self::Sql(source) => Self::Db {
                name: w.name.clone(),
                location: w.location(),
                source,
            },
            Self::Message(message) => Self::Other {
                name: w.name.clone(),
                location: w.location(),
                message,
            },
            other => other,
        }
    }

    /// The environment fault this error is, if it is one: a fault found where it happened, or
    /// a warehouse whose write lock a process that gets nowhere held past the wait's bound.
    pub(crate) fn environment(&self) -> Option<crate::environment::Fault> {
        match self {
            Self::Environment(f) => Some(f.clone()),
            Self::LockedBy {
                holder, stopped, ..
            } => Some(crate::environment::Fault::new(
                self.to_string(),
                match (holder, stopped) {
                    (Some(pid), true) => {
                        format!("let process {pid} go on (`kill -CONT {pid}`) or end it")
                    }
                    (Some(pid), false) => format!(
                        "end process {pid}, or let it end the transaction that holds the lock"
                    ),
                    (None, _) => {
                        "end the process that holds the warehouse's write lock".to_string()
                    }
                },
            )),
            _ => None,
        }
    }

    /// Names the warehouse in an error and tells an environment fault of its file apart: a
    /// SQLite error met on `w`'s own file (opening it, publishing into it).
    pub(crate) fn at_file(self, w: &Warehouse) -> Self {
        let fault = match &self {
            Self::Sql(e) | Self::Db { source: e, .. } if !w.is_postgres() => {
                crate::environment::Fault::of_sqlite(
                    e,
                    &format!("warehouse `{}` ({})", w.name, w.location()),
                    &w.path,
                )
            }
            _ => None,
        };
        match fault {
            Some(f) => Self::Environment(f),
            None => self.at(w),
        }
    }

    pub(crate) fn is_busy(&self) -> bool {
        let sqlite = match self {
            Self::Sql(e) | Self::Db { source: e, .. } => e,
            _ => return false,
        };
        matches!(
            sqlite.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        )
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Who holds a lock, and how to let a stopped holder go on, for [`Error::LockedBy`].
fn locked_holder(holder: Option<i32>, stopped: bool) -> String {
    match (holder, stopped) {
        (Some(pid), true) => format!(
            "its write lock is held by process {pid}, which is stopped: `kill -CONT {pid}` lets it go on (or end it)"
        ),
        (Some(pid), false) => format!(
            "its write lock is held by process {pid}, which did nothing with it for {}",
            humantime::format_duration(busy::PATIENCE)
        ),
        (None, _) => {
            "its write lock is held by a process this one cannot name (another PID namespace or host)".to_string()
        }
    }
}

/// Bytes of a warehouse file mapped into memory for reading.
const MMAP_SIZE: i64 = 1 << 30;

/// The bind parameters a SQL task may use.
pub(crate) const PARAMS: &[&str] = &[
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
    pub interval: DataInterval,
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
            interval,
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
    pub(crate) fn bind(&self, stmt: &mut Statement<'_>) -> Result<()> {
        for i in 1..=stmt.parameter_count() {
            let name = stmt.parameter_name(i).unwrap_or("?").to_string();
            let value = self.value(&name).ok_or_else(|| {
                Error::Message(format!(
                    "unknown bind parameter `{name}`; use {}",
                    PARAMS.join(", ")
                ))
            })?;
            stmt.raw_bind_parameter(i, value)?;
        }
        Ok(())
    }
}

/// Quotes an identifier for SQLite.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Opens a warehouse, creating it from its init files first when the file does not exist.
pub fn open(w: &Warehouse) -> Result<Connection> {
    init::ensure(w)?;
    let setup = || -> Result<Connection> {
        let conn = Connection::open(&w.path).map_err(|e| {
            // Why it could not be opened is in errno now, and nowhere later.
            let errno = crate::environment::last_errno();
            let what = format!("warehouse `{}` ({})", w.name, w.location());
            match crate::environment::Fault::of_sqlite_errno(&e, &what, &w.path, errno) {
                Some(fault) => Error::Environment(fault),
                None => Error::Sql(e),
            }
        })?;
        conn.busy_timeout(w.busy_timeout)?;
        retry_busy(w, None, || {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(Into::into)
        })?;
        // Pages are read through a memory map rather than one read call each: connections of
        // a backfill reread the source after every publish of another connection.
        conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
        // The target's foreign keys hold, as on PostgreSQL: a publish that would delete a row
        // another table references is refused (SQLite leaves them unchecked by default).
        conn.pragma_update(None, "foreign_keys", "ON")?;
        rules::register_number(&conn)?;
        Ok(conn)
    };
    setup().map_err(|e| e.at_file(w))
}

/// Opens the warehouse to read it (created from its init files first if it does not exist):
/// enough to prepare a task's statements and look at its partition column, and possible for a
/// user who may read the warehouse but not write it.
pub(crate) fn open_to_read(w: &Warehouse) -> Result<Connection> {
    init::ensure(w)?;
    let conn = crate::sqlite::open_read_only(&w.path).map_err(|e| Error::from(e).at(w))?;
    conn.busy_timeout(w.busy_timeout)
        .map_err(|e| Error::from(e).at(w))?;
    rules::register_number(&conn).map_err(|e| Error::from(e).at(w))?;
    Ok(conn)
}

/// The parameters of a SQL task's query that name its interval rather than bound it (`:ds`,
/// `:next_ds`, `:ds_nodash`), as its warehouse reads the query: a batch binds them once for all
/// its intervals, so a query that labels its rows with one cannot run in batches.
pub(crate) fn labels(task: &SqlTask) -> Result<Vec<&'static str>, String> {
    const LABELS: [&str; 3] = ["ds", "next_ds", "ds_nodash"];
    let named: Vec<String> = match &task.warehouse.kind {
        crate::project::WarehouseKind::Sqlite => {
            let conn = open_to_read(&task.warehouse).map_err(|e| e.to_string())?;
            let stmt = conn
                .prepare(&wrapped_query(&task.sql))
                .map_err(|e| Error::from(e).to_string())?;
            (1..=stmt.parameter_count())
                .filter_map(|i| stmt.parameter_name(i))
                .map(|n| n.trim_start_matches([':', '@', '$']).to_string())
                .collect()
        }
        crate::project::WarehouseKind::Postgres(_) => {
            crate::params::positional_from(strip(&task.sql), 1)
                .map_err(|e| e.message)?
                .params
                .iter()
                .map(|p| p.name().to_string())
                .collect()
        }
    };
    Ok(LABELS
        .into_iter()
        .filter(|l| named.iter().any(|n| n == l))
        .collect())
}

/// Why `task` of a DAG of batches cannot run in batches (see [`labels`]), if it cannot.
pub(crate) fn batch_problem(task: &crate::project::Task) -> Option<String> {
    let crate::project::TaskKind::Sql(sql) = &task.kind else {
        return None;
    };
    match labels(sql) {
        Ok(labels) => labels.first().map(|label| {
            format!(
                "task `{}`'s query uses `:{label}`, which a batch binds once for all its intervals, so rows labelled with it would all land in one interval; compute `{}` from the rows themselves (and filter with :data_interval_start and :data_interval_end)",
                task.id, sql.partition_column
            )
        }),
        Err(e) => Some(format!(
            "task `{}`'s query cannot be read for its parameters: {e}",
            task.id
        )),
    }
}

/// A SQL task's query as it runs: wrapped as a subquery on lines of its own, so that a trailing
/// `-- comment` or `;` cannot swallow the closing parenthesis.
pub(crate) fn wrapped_query(sql: &str) -> String {
    format!("{WRAPPED_BEFORE}{}\n)", strip(sql))
}

/// What [`wrapped_query`] puts before the task's query.
const WRAPPED_BEFORE: &str = "SELECT * FROM (\n";

/// A statement's text without surrounding blanks and trailing semicolons.
pub(crate) fn strip(sql: &str) -> &str {
    sql.trim()
        .trim_end_matches(|c: char| c == ';' || c.is_whitespace())
}

/// What [`check_task_keys`] found wrong, with the key it is about and, when SQLite points at a
/// token of a query that does not prepare, that token's byte offset in the key's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskProblem {
    /// `sql`, `target`, `gate.source_count` or `gate.source_fingerprint`.
    pub key: &'static str,
    pub offset: Option<usize>,
    pub message: String,
    /// A problem of a rule of the gate (key `gate.rules`): its place in `Gate::rules`.
    pub rule: Option<usize>,
}

/// Checks a SQL task against its warehouse before anything runs: the statements that will run
/// prepare (exactly as they will run), use only known bind parameters, and produce columns that
/// the target table has; each problem says which key it is about.
pub(crate) fn check_task_keys(
    conn: &Connection,
    task: &SqlTask,
    gate: Option<&Gate>,
) -> Result<(), TaskProblem> {
    let problem = |key: &'static str| {
        move |message: String| TaskProblem {
            key,
            offset: None,
            rule: None,
            message,
        }
    };
    let stmt = conn
        .prepare(&wrapped_query(&task.sql))
        .map_err(|e| not_prepared("sql", &e, &task.sql, WRAPPED_BEFORE.len()))?;
    check_params(&stmt, "sql").map_err(problem("sql"))?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    drop(stmt);
    let target_columns =
        table_columns(conn, "main", &task.target).map_err(|e| problem("target")(e.to_string()))?;
    if target_columns.is_empty() {
        let how = if task.warehouse.init.is_empty() {
            "create it in the warehouse (CREATE TABLE with the partition column and the query's columns)"
        } else {
            "create it in the warehouse's init files"
        };
        return Err(problem("target")(format!(
            "target table `{}` does not exist in warehouse `{}`; {how}",
            task.target, task.warehouse.name
        )));
    }
    if !target_columns.contains(&task.partition_column) {
        return Err(problem("target")(format!(
            "target table `{}` has no column `{}` (partition_column)",
            task.target, task.partition_column
        )));
    }
    for c in &columns {
        if !target_columns.contains(c) {
            return Err(problem("sql")(format!(
                "the query returns column `{c}`, which target table `{}` does not have (it has: {})",
                task.target,
                target_columns.join(", ")
            )));
        }
    }
    let mut needed = vec![&task.partition_column];
    if let Some(g) = gate {
        needed.extend(g.unique_key.iter());
    }
    for c in needed {
        if !columns.contains(c) {
            return Err(problem("sql")(format!(
                "the query must return column `{c}` (partition_column or unique_key); it returns: {}",
                columns.join(", ")
            )));
        }
    }
    if let Some(g) =
        gate.filter(|g| (g.unique_key_table || task.write.is_merge()) && !g.unique_key.is_empty())
        && !has_index_on(conn, &task.target, &g.unique_key)
            .map_err(|e| problem("gate.unique_key")(e.to_string()))?
    {
        return Err(problem("gate.unique_key")(format!(
            "{} looks the output's keys up in the whole table; create an index for it in the warehouse: CREATE INDEX {}_{} ON {} ({});",
            if task.write.is_merge() {
                "write = \"merge\""
            } else {
                "unique_key_scope = \"table\""
            },
            task.target,
            g.unique_key.join("_"),
            task.target,
            g.unique_key.join(", ")
        )));
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
        let stmt = conn
            .prepare(&source_count_query(sql))
            .map_err(|e| not_prepared(key, &e, sql, 0))?;
        check_params(&stmt, key).map_err(problem(key))?;
        if stmt.column_count() != 1 {
            return Err(problem(key)(format!(
                "key `{key}` must return exactly one column"
            )));
        }
    }
    if let Some(g) = gate.filter(|g| !g.rules.is_empty()) {
        // `output` as the try will have it: the query's rows.
        let binds = Binds::new(crate::interval::DataInterval::EPOCH_DAY, chrono_tz::UTC);
        let mut engine = audit::SqliteRules {
            conn,
            binds: &binds,
            output: wrapped_query(&task.sql),
        };
        // SQLite's own words, without the generated statement they would quote.
        let describe = |e: &Error| match e {
            Error::Sql(rusqlite::Error::SqlInputError { msg, .. }) => msg.clone(),
            other => other.to_string(),
        };
        rules::check(&mut engine, &g.rules, &columns, describe)
            .map_err(|(i, message)| rule_problem(i, message))?;
    }
    Ok(())
}

/// A problem of the gate's rule `i`.
pub(crate) fn rule_problem(i: usize, message: String) -> TaskProblem {
    TaskProblem {
        key: "gate.rules",
        offset: None,
        message,
        rule: Some(i),
    }
}

/// Whether an index of `table` starts with the columns `key` (in any order), so that a key is
/// looked up without scanning the table.
fn has_index_on(conn: &Connection, table: &str, key: &[String]) -> Result<bool> {
    let mut list = conn.prepare(&format!("PRAGMA main.index_list({})", quote(table)))?;
    let names: Vec<String> = list
        .query_map([], |r| r.get(1))?
        .collect::<rusqlite::Result<_>>()?;
    for name in names {
        let mut info = conn.prepare(&format!("PRAGMA main.index_info({})", quote(&name)))?;
        let cols: Vec<Option<String>> = info
            .query_map([], |r| r.get(2))?
            .collect::<rusqlite::Result<_>>()?;
        let lead: Vec<&str> = cols
            .iter()
            .take(key.len())
            .flatten()
            .map(String::as_str)
            .collect();
        if lead.len() == key.len() && key.iter().all(|k| lead.contains(&k.as_str())) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A query of key `key` that does not prepare: SQLite's message without the statement it
/// repeats, and the offset in `sql` of the token it points at (`before` is how many bytes
/// precede the stripped query in the statement that was prepared).
fn not_prepared(key: &'static str, e: &rusqlite::Error, sql: &str, before: usize) -> TaskProblem {
    let (message, offset) = match e {
        rusqlite::Error::SqlInputError { msg, offset, .. } => {
            let lead = sql.len() - sql.trim_start().len();
            let at = usize::try_from(*offset)
                .ok()
                .and_then(|o| o.checked_sub(before))
                .map(|o| (o + lead).min(sql.trim_end().len()));
            (msg.clone(), at)
        }
        other => (other.to_string(), None),
    };
    TaskProblem {
        key,
        offset,
        rule: None,
        message: format!("key `{key}` does not prepare: {message}"),
    }
}

/// The source count query as it runs.
pub(crate) fn source_count_query(sql: &str) -> String {
    format!("{}\n", strip(sql))
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

/// Column names of a table in schema `schema` (empty when there is no such table).
/// The query's columns as a select list over a table that has the columns `have`: a column it
/// lacks (added to the target since) reads as NULL, never as a name that SQLite would take for
/// a string.
pub(crate) fn query_columns_over(
    conn: &Connection,
    task: &SqlTask,
    have: &[String],
) -> Result<String> {
    Ok(conn
        .prepare(&wrapped_query(&task.sql))?
        .column_names()
        .map(|c| {
            if have.iter().any(|h| h == c) {
                quote(c)
            } else {
                format!("NULL AS {}", quote(c))
            }
        })
        .collect::<Vec<_>>()
        .join(", "))
}

pub(crate) fn table_columns(conn: &Connection, schema: &str, table: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(&format!(
        "PRAGMA {}.table_info({})",
        quote(schema),
        quote(table)
    ))?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(names)
}

/// The declared type of a column, upper-cased (empty when none was declared).
pub(crate) fn declared_type(conn: &Connection, table: &str, column: &str) -> Result<String> {
    let mut stmt = conn.prepare(&format!("PRAGMA main.table_info({})", quote(table)))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        if r.get::<_, String>(1)? == column {
            return Ok(r.get::<_, String>(2)?.to_ascii_uppercase());
        }
    }
    Ok(String::new())
}

/// Decides the representation of a SQL task's partition column before a backfill starts, from
/// its values in the backfill's window (served by the column's index), else from the ends of the
/// column, else from its declared type. `None` when the table is empty and its type says
/// nothing: the first output decides. A column that mixes representations is an error.
pub(crate) fn decide_repr(
    conn: &Connection,
    task: &SqlTask,
    window: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<Option<Repr>, String> {
    let table = format!("main.{}", quote(&task.target));
    let column = &task.partition_column;
    let mixed = |c: &partition::Classes| {
        format!(
            "partition_column `{column}` of table `{}` {}; a partition column must hold one representation, so that the rows of an interval are one range of its index",
            task.target,
            partition::describe_mix(c)
        )
    };
    let in_window =
        partition::classes(conn, &table, column, Some((window, tz))).map_err(|e| e.to_string())?;
    if in_window.other.is_some() || in_window.reprs.len() > 1 {
        return Err(mixed(&in_window));
    }
    if let [one] = in_window.reprs.as_slice() {
        return Ok(Some(*one));
    }
    let ends = partition::endpoint_classes(conn, &table, column).map_err(|e| e.to_string())?;
    if ends.other.is_some() || ends.reprs.len() > 1 {
        return Err(mixed(&ends));
    }
    if let [one] = ends.reprs.as_slice() {
        return Ok(Some(*one));
    }
    let declared = declared_type(conn, &task.target, column).map_err(|e| e.to_string())?;
    Ok(Repr::from_declared(&declared))
}

/// A cancel flag shared with a blocking warehouse step, and how to interrupt the statement the
/// step is running (SQLite's interrupt handle, PostgreSQL's cancel request), which the step
/// installs once it has a connection.
#[derive(Clone, Default)]
pub(crate) struct Cancel {
    flag: Arc<AtomicBool>,
    interrupt: Arc<Mutex<Option<Interrupter>>>,
}

/// Interrupts the statement a step is running.
pub(crate) type Interrupter = Box<dyn Fn() + Send>;

impl Cancel {
    /// Sets the flag and interrupts the running statement, if one was installed.
    pub(crate) fn set(&self) {
        self.flag.store(true, Ordering::Relaxed);
        if let Ok(slot) = self.interrupt.lock()
            && let Some(interrupt) = slot.as_ref()
        {
            interrupt();
        }
    }

    pub(crate) fn flag(&self) -> &AtomicBool {
        &self.flag
    }

    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Installs how to interrupt the step's statements; when the flag is already set, the
    /// step is told so (an error), so that it does not start a statement nobody interrupts.
    pub(crate) fn on_set(&self, interrupt: Interrupter) -> Result<()> {
        if let Ok(mut slot) = self.interrupt.lock() {
            *slot = Some(interrupt);
        }
        if self.is_set() {
            return Err(Error::Cancelled);
        }
        Ok(())
    }
}

/// The project's folder of state (`.backfill`), for the audit files of a manifest that is not a
/// file.
static STATE_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Sets where the audit files of a PostgreSQL manifest go: the project's `.backfill` folder.
pub(crate) fn set_state_dir(dir: PathBuf) {
    let _ = STATE_DIR.set(dir);
}

/// The folder of audit files: next to a manifest file; in the project's `.backfill` folder for
/// a manifest in PostgreSQL (each host keeps the audit files of the tries it ran).
pub(crate) fn audit_dir(manifest: &Path) -> PathBuf {
    if crate::pg::url::is_url(manifest) {
        return STATE_DIR
            .get()
            .cloned()
            .unwrap_or_else(|| PathBuf::from(".backfill"))
            .join("audit");
    }
    manifest
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("audit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_comment_does_not_swallow_the_wrapper() {
        let conn = Connection::open_in_memory().unwrap();
        let sql = "SELECT 1 AS x -- one row\n;";
        let mut stmt = conn.prepare(&wrapped_query(sql)).unwrap();
        let n: i64 = stmt.query_row([], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn unknown_bind_parameters_are_errors() {
        let conn = Connection::open_in_memory().unwrap();
        let mut stmt = conn.prepare("SELECT :ds, :dss").unwrap();
        let t = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        let interval = DataInterval::new(t("2026-09-01T00:00:00Z"), t("2026-09-02T00:00:00Z"));
        let err = Binds::new(interval, chrono_tz::Tz::UTC)
            .bind(&mut stmt)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown bind parameter `:dss`"), "{err}");
    }
}
