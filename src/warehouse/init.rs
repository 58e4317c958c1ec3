//! Fixture warehouses: when a warehouse's file does not exist, its init files run once, in
//! order, in one transaction, into a temporary file that is then linked into place, so that two
//! processes racing to create it cannot both seed it. The temporary file is locked (`flock`)
//! while it is written; one whose lock is free was left by a process that died, and is removed
//! by the next process that creates the warehouse.

use std::fs::File;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::{Error, Result};
use crate::project::Warehouse;

/// Creates the warehouse from its init files if its file does not exist.
pub(crate) fn ensure(w: &Warehouse) -> Result<()> {
    if w.path.exists() {
        return Ok(());
    }
    let fail = |message: String| Error::Other {
        name: w.name.clone(),
        location: w.location(),
        message,
    };
    if let Some(dir) = w.path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create its folder: {e}")))?;
    }
    remove_abandoned(&w.path);
    let tmp = temp_path(&w.path, std::process::id());
    let lock = File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&tmp)
        .map_err(|e| fail(format!("cannot create {}: {e}", tmp.display())))?;
    lock.lock()
        .map_err(|e| fail(format!("cannot lock {}: {e}", tmp.display())))?;
    let result = seed(w, &tmp);
    let linked = result.and_then(|()| match std::fs::hard_link(&tmp, &w.path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(fail(format!("cannot create the file: {e}"))),
    });
    remove_with_sidecars(&tmp);
    drop(lock);
    linked
}

fn seed(w: &Warehouse, tmp: &Path) -> Result<()> {
    let conn = Connection::open(tmp).map_err(|e| Error::Sql(e).at(w))?;
    conn.execute_batch("BEGIN")
        .map_err(|e| Error::Sql(e).at(w))?;
    for file in &w.init {
        let sql = std::fs::read_to_string(file).map_err(|e| Error::Other {
            name: w.name.clone(),
            location: w.location(),
            message: format!("cannot read init file {}: {e}", file.display()),
        })?;
        conn.execute_batch(&sql).map_err(|e| Error::Other {
            name: w.name.clone(),
            location: w.location(),
            message: format!("init file {} failed: {e}", file.display()),
        })?;
    }
    conn.execute_batch("COMMIT")
        .map_err(|e| Error::Sql(e).at(w))?;
    Ok(())
}

/// `warehouse.init-PID.tmp` next to the warehouse.
fn temp_path(path: &Path, pid: u32) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}.init-{pid}.tmp"))
}

/// Removes a file and SQLite's journal, WAL and shared-memory files next to it.
fn remove_with_sidecars(path: &Path) {
    let _ = std::fs::remove_file(path);
    for suffix in ["-journal", "-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(side));
    }
}

/// Removes the temporary files of warehouse creations whose process died (their lock is free).
pub(crate) fn remove_abandoned(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.init-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return;
    };
    for entry in entries.filter_map(std::result::Result::ok) {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if !file_name.starts_with(&prefix) || !file_name.ends_with(".tmp") {
            continue;
        }
        let tmp = entry.path();
        let Ok(f) = File::options().write(true).open(&tmp) else {
            continue;
        };
        if f.try_lock().is_ok() {
            remove_with_sidecars(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_of_a_dead_creation_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let wh = dir.path().join("w.db");
        let dead = temp_path(&wh, 1);
        std::fs::write(&dead, "partial").unwrap();
        let mut journal = dead.as_os_str().to_owned();
        journal.push("-journal");
        std::fs::write(&journal, "journal").unwrap();
        let live = temp_path(&wh, 2);
        let held = File::create(&live).unwrap();
        held.lock().unwrap();
        remove_abandoned(&wh);
        assert!(!dead.exists());
        assert!(!PathBuf::from(journal).exists());
        assert!(live.exists(), "a creation in progress is left alone");
    }
}
