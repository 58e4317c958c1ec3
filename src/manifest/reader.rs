//! Read-only manifest connections kept for reuse within a process: the runner asks the
//! manifest before every publish and reads what is published before every verdict.

use std::path::{Path, PathBuf};

use super::{Result, db::Conn, open_read_conn};

/// Read-only manifest connections kept for reuse within a process (asked before every
/// publish), each with the file it has open.
static READERS: std::sync::LazyLock<std::sync::Mutex<Idle>> =
    std::sync::LazyLock::new(Default::default);

/// The idle connections of each manifest.
type Idle = std::collections::HashMap<PathBuf, Vec<(Conn, File)>>;

/// The device and inode of a SQLite manifest's file when its connection was opened; `None` for
/// a PostgreSQL manifest (or no file).
type File = Option<(u64, u64)>;

/// The file at `path` now, for a SQLite manifest.
fn file_at(path: &Path) -> File {
    use std::os::unix::fs::MetadataExt;
    if super::is_url(path) {
        return None;
    }
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A read-only manifest connection that returns to the process's pool when dropped. It offers
/// the manifest's [`Reads`](super::Reads) only: nothing can write through it.
///
/// ```no_run
/// # fn f(r: &backfill::manifest::Reader) -> backfill::manifest::Result<()> {
/// let running = r.backfill(1)?.is_some(); // a read
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0599
/// # fn f(r: &backfill::manifest::Reader) -> backfill::manifest::Result<()> {
/// r.request_cancel(1)?; // a write: not offered
/// # Ok(()) }
/// ```
pub struct Reader {
    conn: Option<Conn>,
    path: PathBuf,
    file: File,
}

impl Reader {
    /// An idle read-only connection to the manifest at `path`, else a new one. An idle
    /// connection to a SQLite file that was replaced or removed since it was opened is closed
    /// instead: a long-lived reader (`serve`) follows the file.
    pub(crate) fn take(path: &Path) -> Result<Self> {
        let file = file_at(path);
        let mut stale = Vec::new();
        let idle = READERS.lock().ok().and_then(|mut p| {
            let idle = p.get_mut(path)?;
            while let Some((conn, opened)) = idle.pop() {
                if opened == file {
                    return Some(conn);
                }
                stale.push(conn);
            }
            None
        });
        drop(stale);
        let conn = match idle {
            Some(c) => c,
            None => open_read_conn(path)?,
        };
        Ok(Self {
            conn: Some(conn),
            path: path.to_path_buf(),
            file,
        })
    }
}

impl Reader {
    /// Closes the connection rather than keeping it for reuse: after a failure, the next
    /// reader opens a new one.
    pub(crate) fn discard(mut self) {
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
                idle.push((conn, self.file));
            }
        }
    }
}

/// Closes the process's idle read-only manifest connections.
pub(crate) fn close_readers() {
    let idle: Vec<(Conn, File)> = READERS
        .lock()
        .map(|mut p| p.drain().flat_map(|(_, v)| v).collect())
        .unwrap_or_default();
    drop(idle);
}
