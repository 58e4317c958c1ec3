//! Warehouse connections kept for reuse within a process: opening one parses the schema and
//! switches the journal mode, which costs more than a small partition's work. A connection goes
//! back to the pool only clean: no transaction open and no database attached (an audit or
//! batch file). One that cannot be made clean is closed: an audit file that a full disk left
//! half written cannot even be detached ("file is not a database"), and would fail every try
//! that took the connection after it.

use std::collections::HashMap;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

use rusqlite::Connection;

use super::{Result, open};
use crate::project::Warehouse;

/// Most idle connections kept per warehouse.
const KEEP: usize = 8;

static POOL: LazyLock<Mutex<HashMap<PathBuf, Vec<Connection>>>> = LazyLock::new(Mutex::default);

/// A warehouse connection that returns to the pool when dropped.
pub(crate) struct Pooled {
    conn: Option<Connection>,
    key: PathBuf,
}

/// A connection to `w`: an idle one, else a new one.
pub(crate) fn take(w: &Warehouse) -> Result<Pooled> {
    let idle = POOL
        .lock()
        .ok()
        .and_then(|mut p| p.get_mut(&w.path).and_then(Vec::pop));
    let conn = match idle {
        Some(c) => c,
        None => open(w)?,
    };
    Ok(Pooled {
        conn: Some(conn),
        key: w.path.clone(),
    })
}

impl Deref for Pooled {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !made_clean(&conn) {
            return;
        }
        if let Ok(mut pool) = POOL.lock() {
            let idle = pool.entry(std::mem::take(&mut self.key)).or_default();
            if idle.len() < KEEP {
                idle.push(conn);
            }
        }
    }
}

/// Rolls back what `conn` left open and detaches what it left attached: whether it is clean now
/// (no transaction, nothing attached).
fn made_clean(conn: &Connection) -> bool {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for name in attached(conn).unwrap_or_default() {
        let _ = conn.execute(&format!("DETACH DATABASE {}", super::quote(&name)), []);
    }
    conn.is_autocommit() && attached(conn).is_ok_and(|a| a.is_empty())
}

/// The databases attached to `conn` (besides `main` and `temp`).
fn attached(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut list = conn.prepare("PRAGMA database_list")?;
    let names = list
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(names
        .into_iter()
        .filter(|n| n != "main" && n != "temp")
        .collect())
}

/// Closes every idle connection: the last connection to a warehouse copies its WAL back into
/// the database file, so the file alone is complete once a command ends.
pub(crate) fn close_all() {
    let idle: Vec<Connection> = POOL
        .lock()
        .map(|mut p| p.drain().flat_map(|(_, v)| v).collect())
        .unwrap_or_default();
    drop(idle);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warehouse(dir: &std::path::Path) -> Warehouse {
        Warehouse {
            name: "w".into(),
            kind: crate::project::WarehouseKind::Sqlite,
            path: dir.join("w.db"),
            init: Vec::new(),
            busy_timeout: crate::project::DEFAULT_BUSY_TIMEOUT,
            keep_versions: crate::project::DEFAULT_KEEP_VERSIONS,
        }
    }

    #[test]
    fn a_connection_goes_back_only_with_nothing_attached_and_no_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let w = warehouse(dir.path());
        for (i, schema) in ["audit", "batch", "other"].into_iter().enumerate() {
            let file = dir.path().join(format!("{schema}.db"));
            {
                let conn = take(&w).unwrap();
                conn.execute(
                    &format!("ATTACH DATABASE ?1 AS {schema}"),
                    [file.display().to_string()],
                )
                .unwrap();
                conn.execute_batch(&format!(
                    "BEGIN; CREATE TABLE {schema}.t{i} (x); INSERT INTO {schema}.t{i} VALUES (1)"
                ))
                .unwrap();
            }
            let conn = take(&w).unwrap();
            assert!(
                conn.is_autocommit(),
                "{schema}: a transaction was left open"
            );
            assert_eq!(attached(&conn).unwrap(), Vec::<String>::new(), "{schema}");
        }
    }

    #[test]
    fn a_file_that_cannot_be_detached_leaves_the_connection_unclean() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&warehouse(dir.path())).unwrap();
        conn.execute(
            "ATTACH DATABASE ?1 AS audit",
            [dir.path().join("a.db").display().to_string()],
        )
        .unwrap();
        conn.execute_batch("CREATE TABLE audit.t (x); INSERT INTO audit.t VALUES (1), (2)")
            .unwrap();
        // A statement still reading the attached file: it cannot be detached now.
        let mut stmt = conn.prepare("SELECT x FROM audit.t").unwrap();
        let mut rows = stmt.query([]).unwrap();
        assert!(rows.next().unwrap().is_some());
        assert!(!made_clean(&conn));
        assert_eq!(attached(&conn).unwrap(), vec!["audit".to_string()]);
    }
}
