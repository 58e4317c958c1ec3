//! Warehouse connections kept for reuse within a process: opening one parses the schema and
//! switches the journal mode, which costs more than a small partition's work. A connection goes
//! back to the pool with no transaction open and no audit file attached.

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
pub struct Pooled {
    conn: Option<Connection>,
    key: PathBuf,
}

/// A connection to `w`: an idle one, else a new one.
pub fn take(w: &Warehouse) -> Result<Pooled> {
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
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            return;
        }
        let _ = conn.execute_batch("DETACH DATABASE audit");
        if let Ok(mut pool) = POOL.lock() {
            let idle = pool.entry(std::mem::take(&mut self.key)).or_default();
            if idle.len() < KEEP {
                idle.push(conn);
            }
        }
    }
}

/// Closes every idle connection: the last connection to a warehouse copies its WAL back into
/// the database file, so the file alone is complete once a command ends.
pub fn close_all() {
    let idle: Vec<Connection> = POOL
        .lock()
        .map(|mut p| p.drain().flat_map(|(_, v)| v).collect())
        .unwrap_or_default();
    drop(idle);
}
