//! Whether a database is a manifest, before anything is written to it.
//!
//! A SQLite manifest is marked as this program's with SQLite's `application_id` (set when it is
//! created or migrated, in the migration's transaction) beside the schema version it keeps in
//! `user_version`. A database that is not one (a warehouse passed as `--manifest`, another
//! program's file in place of `manifest.db`) is refused and left as it was: installing the
//! manifest's tables into it would change it, and numbering would start again at 1. A manifest
//! of this program that predates the mark is known by its schema version and its tables, and
//! marked when it is migrated.
//!
//! An empty file (0 bytes) is a new manifest, unless the project's history says a manifest
//! was there: its logs or audit folders hold files. A manifest emptied by a full disk, a bad
//! restore or a `> manifest.db` would otherwise make `create` start over and run every interval
//! again. The project hands its history in ([`set_history`]); the manifest's own `audit` folder
//! beside it counts too.
//!
//! A PostgreSQL manifest is the schema `backfill_manifest` with its `schema_version` table;
//! a schema of that name that holds tables but no `schema_version` is another's, and refused
//! likewise (see [`super::postgres`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::{Error, Result};

/// SQLite's `application_id` of a manifest: `bkfl` in ASCII.
pub const APPLICATION_ID: i32 = 0x626b_666c;

/// The tables of the first schema, which every manifest of this program holds.
const FIRST_TABLES: [&str; 5] = ["backfills", "plan", "runs", "task_tries", "leases"];

/// At most this many tables are named when a database is refused.
const NAMED: usize = 5;

/// What a SQLite database holds, as far as the manifest is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing: no table, no schema version, no mark (a new or an empty file).
    Empty,
    /// A manifest of this program; `marked` once it carries the mark.
    Ours { marked: bool },
}

/// What the database at `path`, opened as `conn` (nothing written yet), holds; a database that
/// is not a manifest is [`Error::NotAManifest`].
pub(crate) fn inspect(conn: &Connection, path: &Path) -> Result<Found> {
    let id: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let tables = tables(conn)?;
    if id == APPLICATION_ID {
        return Ok(Found::Ours { marked: true });
    }
    let refused = |why: String| Error::NotAManifest {
        path: path.to_path_buf(),
        why: format!(
            "{why}; give the manifest's own path (--manifest, BACKFILL_MANIFEST or `manifest` in backfill.toml)"
        ),
    };
    if id != 0 {
        return Err(refused(format!(
            "it is marked as another program's file (application_id {id:#x}){}",
            match tables.is_empty() {
                true => String::new(),
                false => format!(" and {}", holds(&tables)),
            }
        )));
    }
    if tables.is_empty() && version == 0 {
        return Ok(Found::Empty);
    }
    if version >= 1 && FIRST_TABLES.iter().all(|t| tables.iter().any(|n| n == t)) {
        return Ok(Found::Ours { marked: false });
    }
    Err(refused(if tables.is_empty() {
        format!("it holds no table but has the schema version {version}")
    } else {
        holds(&tables)
    }))
}

/// `it holds the tables a, b, ...`: what a refused database holds, the first few by name.
pub(crate) fn holds(tables: &[String]) -> String {
    let shown: Vec<&str> = tables.iter().take(NAMED).map(String::as_str).collect();
    let more = tables.len().saturating_sub(NAMED);
    format!(
        "it holds the table{} {}{}",
        if tables.len() == 1 { "" } else { "s" },
        shown.join(", "),
        if more > 0 {
            format!(", ... ({} in all)", tables.len())
        } else {
            String::new()
        }
    )
}

/// The tables and views of a SQLite database (SQLite's own left out), in the order they were
/// made.
fn tables(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')
         AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid",
    )?;
    let names = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(names)
}

/// The folders of the project whose files say that it recorded backfills before (its logs).
static HISTORY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Sets the folders of the project's history (see the module's documentation).
pub(crate) fn set_history(folders: Vec<PathBuf>) {
    if let Ok(mut h) = HISTORY.lock() {
        *h = folders;
    }
}

/// The first folder of the project's history that holds a file, for the manifest at `path`:
/// those [`set_history`] named, and the `audit` folder beside the manifest.
pub(crate) fn history(path: &Path) -> Option<PathBuf> {
    let mut folders = HISTORY.lock().map(|h| h.clone()).unwrap_or_default();
    if let Some(dir) = path.parent() {
        folders.push(dir.join("audit"));
    }
    folders.into_iter().find(|f| holds_a_file(f, 4))
}

/// Whether `dir` (or a folder in it, `depth` levels down) holds a file; stops at the first.
fn holds_a_file(dir: &Path, depth: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| match e.file_type() {
        Ok(t) if t.is_dir() => depth > 0 && holds_a_file(&e.path(), depth - 1),
        Ok(_) => true,
        Err(_) => false,
    })
}

/// How long an empty manifest is watched for a process that creates it at this moment (it
/// writes the file's first page right after making it) before it is judged emptied.
const CREATING: Duration = Duration::from_secs(1);

/// Refuses the empty manifest at `path` when the project's history says a manifest was there
/// ([`Error::Emptied`]), unless another process fills it within [`CREATING`]: it is creating
/// it. `Ok(true)`: it was filled meanwhile, to be looked at again.
pub(crate) fn refuse_emptied(path: &Path) -> Result<bool> {
    let Some(history) = history(path) else {
        return Ok(false);
    };
    let deadline = Instant::now() + CREATING;
    while Instant::now() < deadline {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::Emptied {
        path: path.to_path_buf(),
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(sql: &str) -> (tempfile::TempDir, PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(sql).unwrap();
        (dir, path, conn)
    }

    #[test]
    fn a_database_is_told_by_its_mark_its_version_and_its_tables() {
        let (_d, path, conn) = db("");
        assert_eq!(inspect(&conn, &path).unwrap(), Found::Empty);
        let (_d, path, conn) = db("PRAGMA application_id = 1651205740");
        assert_eq!(inspect(&conn, &path).unwrap(), Found::Ours { marked: true });
        let first: String = FIRST_TABLES
            .iter()
            .map(|t| format!("CREATE TABLE {t} (x);"))
            .collect();
        let (_d, path, conn) = db(&format!("{first} PRAGMA user_version = 3"));
        assert_eq!(
            inspect(&conn, &path).unwrap(),
            Found::Ours { marked: false }
        );
        // The tables alone, without a version, are not enough.
        let (_d, path, conn) = db(&first);
        let err = inspect(&conn, &path).unwrap_err().to_string();
        assert!(
            err.contains("it holds the tables backfills, plan, runs, task_tries, leases;"),
            "{err}"
        );
        let (_d, path, conn) = db(
            "CREATE TABLE raw_orders (x); CREATE TABLE daily_orders (x); CREATE VIEW v AS SELECT 1;
             CREATE TABLE a (x); CREATE TABLE b (x); CREATE TABLE c (x)",
        );
        assert_eq!(
            inspect(&conn, &path).unwrap_err().to_string(),
            format!(
                "{} is not a backfill manifest: it holds the tables raw_orders, daily_orders, v, a, b, ... (6 in all); give the manifest's own path (--manifest, BACKFILL_MANIFEST or `manifest` in backfill.toml)",
                path.display()
            )
        );
        let (_d, path, conn) = db("PRAGMA application_id = 7");
        let err = inspect(&conn, &path).unwrap_err().to_string();
        assert!(
            err.contains("another program's file (application_id 0x7);"),
            "{err}"
        );
    }

    #[test]
    fn history_is_a_file_in_the_folders_given_or_the_audit_folder() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join(".backfill/manifest.db");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(logs.join("dag/task")).unwrap();
        set_history(vec![logs.clone()]);
        assert_eq!(history(&manifest), None, "empty folders are no history");
        std::fs::write(logs.join("dag/task/1.log"), "x").unwrap();
        assert_eq!(history(&manifest), Some(logs.clone()));
        std::fs::remove_dir_all(&logs).unwrap();
        std::fs::create_dir_all(dir.path().join(".backfill/audit")).unwrap();
        std::fs::write(dir.path().join(".backfill/audit/t.db"), "x").unwrap();
        assert_eq!(history(&manifest), Some(dir.path().join(".backfill/audit")));
        set_history(Vec::new());
    }
}
