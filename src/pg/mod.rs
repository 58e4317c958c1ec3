//! The PostgreSQL driver layer that the manifest and the warehouses share: connections (the URL
//! as libpq reads it, TLS, timeouts; see [`conn`]), errors classified by SQLSTATE and worded
//! for a person (see [`error`]), quoting of names, and which database a session is in. A
//! leaf: it imports nothing else of the crate, and knows nothing of its users (as
//! `sqlx-postgres` under sqlx).

pub(crate) mod conn;
pub(crate) mod error;
pub(crate) mod url;

pub(crate) use error::{Error, Kind, Resource};

use std::fmt::Write as _;

/// How many prepared statements a connection keeps, by text: past that, the cache starts afresh
/// (the statements are closed), so that a long run with ever new statement texts cannot grow
/// the client and the server session without bound. The program's own statements and a DAG's
/// tasks are a few dozen.
pub(crate) const PREPARED_KEPT: usize = 256;

/// Keeps `value` under `key` in a connection's cache of prepared statements, which starts afresh
/// when it holds [`PREPARED_KEPT`] already.
pub(crate) fn keep_prepared<V>(
    cache: &mut std::collections::HashMap<String, V>,
    key: &str,
    value: V,
) {
    if cache.len() >= PREPARED_KEPT && !cache.contains_key(key) {
        cache.clear();
    }
    cache.insert(key.to_string(), value);
}

/// A PostgreSQL error as a person reads it: the server's message, detail, hint and SQLSTATE,
/// or what failed on the way to the server.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{}: {}", db.severity(), db.message());
        if let Some(d) = db.detail() {
            let _ = write!(s, "; {d}");
        }
        if let Some(h) = db.hint() {
            let _ = write!(s, " (hint: {h})");
        }
        let _ = write!(s, " [SQLSTATE {}]", db.code().code());
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(s, ": {cause}");
        source = cause.source();
    }
    s
}

/// `name` quoted for PostgreSQL; `schema.table` quoted part by part.
pub(crate) fn quote_name(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// A column's name quoted for PostgreSQL.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Which database a session is in: its server instance (the time it started) and the
/// database's oid. The same on every connection to one database, whatever URL names it.
pub(crate) const DATABASE_KEY: &str = "SELECT CAST(extract(epoch FROM pg_postmaster_start_time()) AS text) || '/' || \
     CAST((SELECT oid FROM pg_database WHERE datname = current_database()) AS text)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prepared_statements_kept_never_exceed_the_bound() {
        let mut cache = std::collections::HashMap::new();
        for i in 0..PREPARED_KEPT * 3 {
            keep_prepared(&mut cache, &format!("SELECT {i}"), i);
            assert!(cache.len() <= PREPARED_KEPT, "{} kept", cache.len());
            assert_eq!(
                cache.get(&format!("SELECT {i}")),
                Some(&i),
                "the newest is kept"
            );
        }
        // One kept already is replaced, not a reason to start afresh.
        let before = cache.len();
        keep_prepared(&mut cache, &format!("SELECT {}", PREPARED_KEPT * 3 - 1), 0);
        assert_eq!(cache.len(), before);
    }
}
