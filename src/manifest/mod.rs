//! The run manifest: a SQLite database (WAL) by default, or a PostgreSQL database that several
//! hosts share (see [`postgres`]), that records backfills, plans, runs, task tries, leases and
//! publications. SQLite's schema changes are `migrations/NNNN_*.sql`, applied in order through
//! `PRAGMA user_version`; PostgreSQL's are in `migrations/postgres/`. Writes go through the one [`writer::Writer`] thread of a process; the
//! functions of the submodules take a connection and only read and write the manifest: no
//! process is killed and no warehouse is touched from here (see `recovery`).

pub mod backfills;
pub(crate) mod cascades;
pub mod copy;
pub mod db;
pub mod forgets;
pub mod leases;
pub mod ours;
pub mod plans;
pub mod pools;
pub mod postgres;
pub mod publishes;
pub mod queries;
mod reader;
pub mod readiness;
pub(crate) mod record;
pub mod runs;
pub(crate) mod staged;
pub(crate) mod status;
pub(crate) mod store;
pub(crate) mod workers;
pub mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

pub use backfills::{Backfill, NewBackfill, Owner};
pub(crate) use publishes::Publication;
pub use reader::Reader;
pub(crate) use reader::close_readers;
pub use runs::TryRecord;
pub use store::{Ownership, Planning, Publishing, Reads, Running, Staging, Store};

/// The backfills whose runs do not say what an interval's partition was computed from: staged
/// runs publish nothing, rollbacks put back what earlier runs computed, and a `--tasks` run ran
/// only some tasks. Planning (`already exists`), `--reprocess-behavior changed` and cascades
/// look at the other runs.
pub(crate) const NOT_COMPUTING: &str =
    "(SELECT id FROM backfills WHERE kind IN ('stage', 'rollback') OR tasks IS NOT NULL)";

/// `(user_version after applying, SQL)`, in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_init.sql")),
    (2, include_str!("../../migrations/0002_publication.sql")),
    (3, include_str!("../../migrations/0003_fencing.sql")),
    (
        4,
        include_str!("../../migrations/0004_stage_and_changes.sql"),
    ),
    (
        5,
        include_str!("../../migrations/0005_guard_rails_and_pools.sql"),
    ),
    (6, include_str!("../../migrations/0006_sample.sql")),
    (7, include_str!("../../migrations/0007_identity.sql")),
    (8, include_str!("../../migrations/0008_workers.sql")),
    (9, include_str!("../../migrations/0009_definition.sql")),
    (10, include_str!("../../migrations/0010_batch_size.sql")),
    (11, include_str!("../../migrations/0011_batch_holder.sql")),
    (12, include_str!("../../migrations/0012_project.sql")),
    (13, include_str!("../../migrations/0013_owner_start.sql")),
    (14, include_str!("../../migrations/0014_merge.sql")),
    (15, include_str!("../../migrations/0015_atomic.sql")),
    (16, include_str!("../../migrations/0016_reports.sql")),
    (17, include_str!("../../migrations/0017_forgets.sql")),
    (18, include_str!("../../migrations/0018_pool_rates.sql")),
    (19, include_str!("../../migrations/0019_readiness.sql")),
    (20, include_str!("../../migrations/0020_booleans.sql")),
];

/// CHECK constraints a migration widens (SQLite cannot alter one): `(version, table, old, new)`.
/// Every row that satisfied the old constraint satisfies the new one, so the stored table text
/// is replaced as SQLite documents for such changes (`writable_schema`, then a new schema
/// version).
const WIDENED_CHECKS: &[(i64, &str, &str, &str)] = &[
    (
        4,
        "backfills",
        "CHECK (reprocess_behavior IN ('none', 'failed', 'completed'))",
        "CHECK (reprocess_behavior IN ('none', 'failed', 'completed', 'changed'))",
    ),
    (
        4,
        "backfills",
        "CHECK (state IN ('running', 'completed', 'failed', 'cancelled'))",
        "CHECK (state IN ('running', 'completed', 'failed', 'cancelled', 'staged'))",
    ),
];

/// How long a manifest statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// What can go wrong with the manifest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A SQLite error not yet attributed to a file (see [`Error::at`]).
    #[error("{}", crate::limits::sqlite(.0))]
    Sql(#[from] rusqlite::Error),
    /// A PostgreSQL error not yet attributed to a database (see [`Error::at`]).
    #[error("{0}")]
    Pg(#[from] crate::pg::Error),
    #[error("manifest {}: {}", path.display(), crate::limits::sqlite(source))]
    Db {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("manifest {}: cannot create its folder: {}", path.display(), crate::limits::io(source))]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "manifest {}: schema version {found} is newer than this backfill understands ({known}); upgrade backfill",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error(
        "manifest {}: schema version {found} is older than this backfill's ({known}) and the file cannot be written to upgrade it; run a writing command (create, resume) as a user who can write it",
        path.display()
    )]
    Outdated {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error(
        "manifest {}: this user cannot write it ({why}); commands that only read it (list, show, runs, diff, create --dry-run) work, the others must run as a user who may write the file and its folder",
        path.display()
    )]
    ReadOnly { path: PathBuf, why: String },
    /// A PostgreSQL role that may read the manifest but not write it (as [`Error::ReadOnly`]
    /// for a file).
    #[error(
        "manifest {location}: {why}; commands that only read it (list, show, runs, diff, create --dry-run) work, the others must run as a role that may write its schema `backfill_manifest` (or create it, the first time)"
    )]
    ReadOnlyRole { location: String, why: String },
    #[error("manifest {}: {}; nothing has been recorded there yet", path.display(), if is_url(path) { "no manifest in that database" } else { "no such file" })]
    Missing { path: PathBuf },
    /// A database that is not a manifest (see [`ours`]); nothing was written to it.
    #[error("{} is not a backfill manifest: {why}", path.display())]
    NotAManifest { path: PathBuf, why: String },
    /// An empty manifest file where the project's history says a manifest was (see [`ours`]).
    #[error(
        "manifest {}: the file is empty (0 bytes), but this project recorded backfills before ({} holds what they left): the manifest that recorded them was emptied or lost. Restore it from a backup; or, to start a new record knowingly (every interval then runs again), remove the empty file",
        path.display(),
        history.display()
    )]
    Emptied { path: PathBuf, history: PathBuf },
    /// Another process took this backfill over (a newer epoch): this one must stop.
    #[error("backfill {backfill_id} was taken over by another process")]
    Fenced { backfill_id: i64 },
    #[error("manifest {location}: {message}")]
    Postgres { location: String, message: String },
    /// A manifest URL that cannot be taken (bad input: nothing was tried).
    #[error("manifest {location}: {message}")]
    BadUrl { location: String, message: String },
    #[error("manifest: {0}")]
    Invalid(String),
    #[error("the manifest writer has stopped")]
    WriterGone,
}

impl Error {
    /// Names the manifest file in a SQLite error.
    pub(crate) fn at(self, path: &Path) -> Self {
        match self {
            Self::Pg(source) => Self::Postgres {
                location: path.display().to_string(),
                message: source.to_string(),
            },
            Self::Sql(source) => Self::Db {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        }
    }

    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    /// Whether the PostgreSQL server refused a statement on a connection that still works (bad
    /// data, a constraint), rather than the connection or the file failing.
    pub(crate) fn is_statement_error(&self) -> bool {
        matches!(self, Self::Pg(e) if !e.is_disconnected())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<db::Error> for Error {
    fn from(e: db::Error) -> Self {
        match e {
            db::Error::Sqlite(e) => Self::Sql(e),
            db::Error::Postgres(e) => Self::Pg(e),
            db::Error::NoRows => Self::Invalid(db::Error::NoRows.to_string()),
        }
    }
}

use crate::pg::url::url_of;
pub(crate) use crate::pg::url::{is_url, location, not_a_location};
pub use crate::project::Durability;

/// The `synchronous` setting of a durability.
fn synchronous(d: Durability) -> &'static str {
    match d {
        Durability::Normal => "NORMAL",
        Durability::Full => "FULL",
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn is_read_only(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::PermissionDenied)
    )
}

/// Plans a statement once, whatever values are bound to it later (SQLite's query planner
/// stability guarantee). Without it, a statement that the planner compared with a partial
/// index's condition is planned again every time new values are bound: the manifest's
/// reads before each publish spent a tenth of a PostgreSQL backfill's client time re-preparing.
fn stable_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Opens the manifest for writing, creating it and applying migrations as needed.
pub fn open(path: &Path, durability: Durability) -> Result<db::Conn> {
    if is_url(path) {
        let shown = path.to_string_lossy();
        let session = postgres::open(&url_of(path), &shown)?;
        return Ok(db::Conn::Pg(Box::new(session)));
    }
    open_sqlite(path, durability).map(db::Conn::Sqlite)
}

/// [`open`] for a SQLite file.
pub fn open_sqlite(path: &Path, durability: Durability) -> Result<Connection> {
    if let Some(dir) = path.parent() {
        crate::process::folders::make_dir(dir, 0o777).map_err(|source| Error::Folder {
            path: path.to_path_buf(),
            source,
        })?;
    }
    let setup = || -> Result<Connection> {
        // Whether the file was there, empty, before this process opened (and so made) it.
        let emptied = std::fs::metadata(path).is_ok_and(|m| m.len() == 0);
        let conn = Connection::open(path)?;
        let found = ours::inspect(&conn, path)?;
        if emptied && found == ours::Found::Empty && ours::refuse_emptied(path)? {
            // Another process was creating it: look again at what it made.
            drop(conn);
            return open_sqlite(path, durability);
        }
        if let Some(why) = cannot_write(&conn, path) {
            return Err(Error::ReadOnly {
                path: path.to_path_buf(),
                why,
            });
        }
        conn.busy_timeout(BUSY_TIMEOUT)?;
        stable_plans(&conn)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", synchronous(durability))?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrate(&conn, path)?;
        Ok(conn)
    };
    // Two processes creating the manifest at once both try to switch it to WAL; SQLite then
    // reports busy at once, without its busy handler (lock escalation deadlock). Retry.
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match setup() {
            Err(Error::Sql(e)) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(
                    5 + u64::from(std::process::id() % 20),
                ));
            }
            Err(Error::Sql(source)) if is_read_only(&source) => {
                return Err(Error::ReadOnly {
                    path: path.to_path_buf(),
                    why: source.to_string(),
                });
            }
            result => return result.map_err(|e| e.at(path)),
        }
    }
}

/// Why this user cannot write the manifest at `path`, just opened as `conn`; `None` when it
/// can. SQLite opens a file it may not write read-only without a word, and a WAL manifest whose
/// `-wal` and `-shm` files are left (every run leaves them) is then read through them: only the
/// first write would fail. Asked of the system (`access`), never by opening a file: closing a
/// descriptor of a file lets go of every lock this process holds on it, SQLite's too.
fn cannot_write(conn: &Connection, path: &Path) -> Option<String> {
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Some(match crate::sqlite::writable(path) {
            Err(e) => e.to_string(),
            Ok(()) => "attempt to write a readonly database".to_string(),
        });
    }
    for suffix in ["-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = PathBuf::from(file);
        match crate::sqlite::writable(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                let name = file.file_name().unwrap_or(file.as_os_str());
                return Some(format!("{}: {e}", name.to_string_lossy()));
            }
            _ => {}
        }
    }
    None
}

/// Opens an existing manifest for reading only: never creates, migrates or writes it, so it
/// works on a manifest the user may read but not write.
pub fn open_read_only(path: &Path) -> Result<Box<dyn Reads>> {
    Ok(Box::new(open_read_conn(path)?))
}

/// [`open_read_only`], as the connection the readers of this process pool.
fn open_read_conn(path: &Path) -> Result<db::Conn> {
    if is_url(path) {
        let shown = path.to_string_lossy();
        return postgres::open_read_only(&url_of(path), &shown).map(|s| db::Conn::Pg(Box::new(s)));
    }
    open_sqlite_read_only(path).map(db::Conn::Sqlite)
}

fn open_sqlite_read_only(path: &Path) -> Result<Connection> {
    if !path.exists() {
        return Err(Error::Missing {
            path: path.to_path_buf(),
        });
    }
    if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        // Empty: nothing recorded, unless the project's history says a manifest was there.
        return Err(match ours::history(path) {
            Some(history) => Error::Emptied {
                path: path.to_path_buf(),
                history,
            },
            None => Error::Missing {
                path: path.to_path_buf(),
            },
        });
    }
    let open = || -> Result<Connection> {
        let conn = crate::sqlite::open_read_only(path)?;
        if ours::inspect(&conn, path)? == ours::Found::Empty {
            return Err(Error::Missing {
                path: path.to_path_buf(),
            });
        }
        conn.busy_timeout(BUSY_TIMEOUT)?;
        stable_plans(&conn)?;
        // Reading a large backfill touches most pages once: map them rather than copy each
        // into the page cache.
        conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.last().map_or(0, |m| m.0);
        if version > known {
            return Err(Error::TooNew {
                path: path.to_path_buf(),
                found: version,
                known,
            });
        }
        if version < known {
            return Err(Error::Outdated {
                path: path.to_path_buf(),
                found: version,
                known,
            });
        }
        Ok(conn)
    };
    open().map_err(|e| e.at(path))
}

/// What names the manifest at `path` in records others keep about it: made once, when the
/// manifest was created (or upgraded to this schema), and never the same for two manifests.
pub fn identity(path: &Path) -> Result<String> {
    static KNOWN: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<PathBuf, String>>,
    > = std::sync::LazyLock::new(Default::default);
    if let Ok(known) = KNOWN.lock()
        && let Some(id) = known.get(path)
    {
        return Ok(id.clone());
    }
    let id = open_read_only(path)?.identity().map_err(|e| e.at(path))?;
    if let Ok(mut known) = KNOWN.lock() {
        known.insert(path.to_path_buf(), id.clone());
    }
    Ok(id)
}

/// Which database holds the manifest at `path`: `None` for a SQLite file; for PostgreSQL, the
/// server instance (its start time) and the database's oid, so that a warehouse can tell
/// whether it shares the manifest's database whatever URL names it (see
/// `warehouse::backend::Backend::shares_manifest`). Asked once per run, before its first try.
pub fn database_key(path: &Path) -> Result<Option<String>> {
    if !is_url(path) {
        return Ok(None);
    }
    Reader::take(path)?.database_key().map_err(|e| e.at(path))
}

/// Opens the manifest for reading when it exists; `None` when nothing was recorded yet. A
/// manifest of an older schema is upgraded first when it can be written.
pub(crate) fn open_if_exists(path: &Path) -> Result<Option<Box<dyn Reads>>> {
    match open_read_only(path) {
        Ok(c) => Ok(Some(c)),
        Err(Error::Missing { .. }) => Ok(None),
        Err(outdated @ Error::Outdated { .. }) => {
            // Upgrading needs write access; without it, say what to do. Any other failure (a
            // migration that failed) is said as it is.
            match open(path, Durability::Normal) {
                Ok(writer) => drop(writer),
                Err(Error::ReadOnly { .. }) => return Err(outdated),
                Err(e) => return Err(e),
            }
            open_read_only(path).map(Some)
        }
        Err(e) => Err(e),
    }
}

/// Brings the manifest to this binary's schema and marks it as a manifest (see [`ours`]), in
/// one transaction.
fn migrate(conn: &Connection, path: &Path) -> Result<()> {
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let marked = |conn: &Connection| -> Result<bool> {
        let id: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
        Ok(id == ours::APPLICATION_ID)
    };
    if current == latest && marked(conn)? {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Another process may have migrated while we waited for the lock; and what the file
        // holds is looked at again under the lock.
        ours::inspect(conn, path)?;
        let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if current > latest {
            return Err(Error::TooNew {
                path: path.to_path_buf(),
                found: current,
                known: latest,
            });
        }
        if !marked(conn)? {
            conn.pragma_update(None, "application_id", ours::APPLICATION_ID)?;
        }
        for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            conn.execute_batch(sql)
                .map_err(Error::from)
                .and_then(|()| widen_checks(conn, *version))
                .map_err(|e| {
                    Error::Invalid(format!(
                        "migration {version} of {} failed: {e}",
                        path.display()
                    ))
                })?;
            conn.pragma_update(None, "user_version", version)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(())
}

/// Widens the CHECK constraints of [`WIDENED_CHECKS`] for `version`, inside the migration's
/// transaction. Fails when a table's text does not hold the old constraint.
fn widen_checks(conn: &Connection, version: i64) -> Result<()> {
    let changes: Vec<_> = WIDENED_CHECKS.iter().filter(|c| c.0 == version).collect();
    if changes.is_empty() {
        return Ok(());
    }
    let schema_version: i64 = conn.pragma_query_value(None, "schema_version", |r| r.get(0))?;
    conn.pragma_update(None, "writable_schema", true)?;
    let result = (|| {
        for (_, table, old, new) in &changes {
            let changed = conn.execute(
                "UPDATE sqlite_schema SET sql = replace(sql, ?2, ?3)
                 WHERE type = 'table' AND name = ?1 AND instr(sql, ?2) > 0",
                rusqlite::params![table, old, new],
            )?;
            if changed != 1 {
                return Err(Error::Invalid(format!(
                    "table {table} does not hold `{old}`"
                )));
            }
        }
        Ok(conn.pragma_update(None, "schema_version", schema_version + 1)?)
    })();
    conn.pragma_update(None, "writable_schema", false)?;
    result
}

/// Copies the WAL back into the database file, so that `manifest.db` alone is a complete copy
/// once the command ends.
pub(crate) fn checkpoint(conn: &Connection) -> Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_set_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/manifest.db");
        drop(open_sqlite(&path, Durability::Normal).unwrap());
        let conn = open_sqlite(&path, Durability::Normal).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.last().unwrap().0);
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn a_newer_manifest_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.db");
        let conn = open_sqlite(&path, Durability::Normal).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = open_sqlite(&path, Durability::Normal)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "manifest {}: schema version 99 is newer than this backfill understands ({}); upgrade backfill",
                path.display(),
                MIGRATIONS.last().unwrap().0
            )
        );
        let err = open_read_only(&path).err().unwrap().to_string();
        assert!(err.contains("schema version 99"), "{err}");
    }

    #[test]
    fn sqlite_errors_name_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.db");
        std::fs::write(
            &path,
            "this is not a database, not even close to one............",
        )
        .unwrap();
        let err = open_sqlite(&path, Durability::Normal)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("manifest {}: ", path.display())),
            "{err}"
        );
    }
}
