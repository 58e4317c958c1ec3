//! What the SQLite manifest and the SQLite warehouse share: opening a database that this user
//! may read but not write.
//!
//! A WAL database is read through its `-shm` file, which SQLite creates next to it. When the
//! folder is not writable and no writer has the database open (so neither `-wal` nor `-shm`
//! exists), a plain read-only open fails with "attempt to write a readonly database". The
//! database file is then complete on its own (a writer checkpoints when it closes), and it is
//! opened `immutable`: SQLite reads it without the shared memory and without locks.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// Opens `path` for reading only. Never creates or writes anything, next to it either.
pub fn open_read_only(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    // The open itself is lazy: the first read is what needs the `-shm` file.
    match conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())) {
        Ok(()) => Ok(conn),
        Err(e) if needs_immutable(&e, path) => {
            drop(conn);
            Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
        }
        Err(e) => Err(e),
    }
}

/// A read that failed for want of a `-shm` file this user may create, with no writer active.
fn needs_immutable(e: &rusqlite::Error, path: &Path) -> bool {
    let readonly = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    );
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    readonly && !Path::new(&wal).exists()
}

/// `file:PATH?immutable=1`, with the characters a URI gives a meaning escaped.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_escape_what_sqlite_would_read_as_syntax() {
        assert_eq!(
            immutable_uri(Path::new("/a b/m?#%.db")),
            "file:/a%20b/m%3F%23%25.db?immutable=1"
        );
    }
}
