//! Read-only manifest connections kept for reuse within a process: the runner asks the
//! manifest before every publish and reads what is published before every verdict.

use std::path::{Path, PathBuf};

use super::{Result, db::Conn, open_read_conn};

/// Read-only manifest connections kept for reuse within a process (asked before every
/// publish).
static READERS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<PathBuf, Vec<Conn>>>,
> = std::sync::LazyLock::new(Default::default);

/// A read-only manifest connection that returns to the process's pool when dropped. It offers
/// the manifest's [`Reads`](super::Reads) only: nothing can write through it.
///
/// ```no_run
/// # fn f(r: &backfill::manifest::Reader) -> backfill::manifest::Result<()> {
/// let running = r.backfill(1)?.is_some(); // a read
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(r: &backfill::manifest::Reader) -> backfill::manifest::Result<()> {
/// r.request_cancel(1)?; // a write: not offered
/// # Ok(()) }
/// ```
pub struct Reader {
    conn: Option<Conn>,
    path: PathBuf,
}

impl Reader {
    /// An idle read-only connection to the manifest at `path`, else a new one.
    pub fn take(path: &Path) -> Result<Self> {
        let idle = READERS
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(path).and_then(Vec::pop));
        let conn = match idle {
            Some(c) => c,
            None => open_read_conn(path)?,
        };
        Ok(Self {
            conn: Some(conn),
            path: path.to_path_buf(),
        })
    }
}

impl Reader {
    /// Closes the connection rather than keeping it for reuse: after a failure, the next
    /// reader opens a new one.
    pub fn discard(mut self) {
        drop(self.conn.take());
    }
}

impl std::ops::Deref for Reader {
    type Target = dyn super::Reads;
    fn deref(&self) -> &(dyn super::Reads + 'static) {
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let (Some(conn), Ok(mut pool)) = (self.conn.take(), READERS.lock()) {
            let idle = pool.entry(std::mem::take(&mut self.path)).or_default();
            if idle.len() < 8 {
                idle.push(conn);
            }
        }
    }
}

/// Closes the process's idle read-only manifest connections.
pub fn close_readers() {
    let idle: Vec<Conn> = READERS
        .lock()
        .map(|mut p| p.drain().flat_map(|(_, v)| v).collect())
        .unwrap_or_default();
    drop(idle);
}
