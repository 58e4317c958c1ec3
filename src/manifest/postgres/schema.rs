//! The manifest's schema on PostgreSQL: made and migrated on first use, refused when it is
//! newer than this binary or another program's, and the role's right to write it.

use std::time::Instant;

use rusqlite::types::Value;

use super::session::Session;
use super::state::State;
use super::timeouts::patience;
use super::{MIGRATIONS, SCHEMA, latest};
use crate::manifest::{Error, Result};
use crate::pg::error::{Error as PgError, Result as PgResult};

/// Whether this session's role may write the manifest (the writers' lock and the records),
/// asked before anything is written: a role that may only read gets the same answer as a
/// SQLite file the user cannot write.
fn may_write(s: &Session) -> PgResult<bool> {
    let rows = s.query(
        // One privilege a call: a list of them asks whether the role has any.
        "SELECT bool_and(has_table_privilege('backfill_manifest.' || t, p))
         FROM (VALUES ('manifest_lock', 'UPDATE'),
                      ('manifest_commits', 'INSERT'), ('manifest_commits', 'UPDATE'),
                      ('backfills', 'INSERT'), ('backfills', 'UPDATE'),
                      ('runs', 'INSERT'), ('runs', 'UPDATE'),
                      ('task_tries', 'INSERT'), ('task_tries', 'UPDATE')) AS needed (t, p)",
        &[],
    )?;
    Ok(matches!(
        rows.first().and_then(|r| r.first()),
        Some(Value::Integer(1))
    ))
}

/// The error for a role that may not write the manifest.
fn read_only_role(shown: &str, what: &str) -> Error {
    Error::ReadOnlyRole {
        location: shown.to_string(),
        why: what.to_string(),
    }
}

/// The schema version of the manifest's database; `None` when it has none yet.
fn version(s: &Session) -> PgResult<Option<i64>> {
    let exists = s.query(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = 'schema_version'",
        &[Value::Text(SCHEMA.to_string())],
    )?;
    if exists.is_empty() {
        return Ok(None);
    }
    let rows = s.query("SELECT max(version) FROM schema_version", &[])?;
    Ok(match rows.first().and_then(|r| r.first()) {
        Some(Value::Integer(v)) => Some(*v),
        _ => None,
    })
}

/// Refuses a schema `backfill_manifest` that holds tables but no `schema_version`: another's,
/// which the manifest's tables would be installed into (see [`crate::manifest::ours`]).
fn refuse_foreign(s: &Session, shown: &str) -> Result<()> {
    let at = |e: PgError| Error::Pg(e).at(std::path::Path::new(shown));
    let rows = s
        .query(
            "SELECT c.relname FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
               AND c.relname <> 'schema_version' ORDER BY c.oid",
            &[Value::Text(SCHEMA.to_string())],
        )
        .map_err(at)?;
    let tables: Vec<String> = rows
        .into_iter()
        .filter_map(|r| match r.into_iter().next() {
            Some(Value::Text(t)) => Some(t),
            _ => None,
        })
        .collect();
    if tables.is_empty() {
        return Ok(());
    }
    Err(Error::NotAManifest {
        path: shown.into(),
        why: format!(
            "its schema `{SCHEMA}` has no `schema_version` table, and {}; give the manifest's own database, or rename that schema (`ALTER SCHEMA {SCHEMA} RENAME TO ...`) to let a manifest be made here",
            crate::manifest::ours::holds(&tables)
        ),
    })
}

/// Opens the manifest's database for writing: creates its schema or migrates it as needed.
///
/// A migration runs in one transaction from the lock to the commit, tracked as the writer's
/// are: a connection lost in it (a server restarting during a first open) ends the attempt,
/// which the server rolls back whole, and the next attempt starts afresh on a new connection,
/// reading the version again. No statement of it ever runs outside its transaction.
pub(crate) fn open(url: &str, shown: &str) -> Result<Session> {
    let s = Session::connect(url, shown, false)?;
    let at = |e: PgError| Error::Pg(e).at(std::path::Path::new(shown));
    let found = version(&s).map_err(at)?;
    if found.is_none() {
        refuse_foreign(&s, shown)?;
    }
    if found == Some(latest()) {
        if !may_write(&s).map_err(at)? {
            return Err(read_only_role(
                shown,
                "this role may read it but not write it",
            ));
        }
        prune_commits(&s);
        return Ok(s);
    }
    let deadline = Instant::now() + patience();
    loop {
        match migrate(&s, shown) {
            Ok(()) => break,
            Err(e) if s.is_broken() && Instant::now() < deadline => {
                tracing::warn!(manifest = %shown, "the connection was lost while the manifest's schema was made; starting again: {e}");
                s.reconnect().map_err(at)?;
            }
            Err(e) => return Err(e),
        }
    }
    if !may_write(&s).map_err(at)? {
        return Err(read_only_role(
            shown,
            "this role may read it but not write it",
        ));
    }
    prune_commits(&s);
    Ok(s)
}

/// One attempt at making the manifest's schema current, in one transaction.
fn migrate(s: &Session, shown: &str) -> Result<()> {
    let at = |e: PgError| {
        if e.kind() == crate::pg::Kind::PermissionDenied {
            read_only_role(
                shown,
                &format!("this role may not create or upgrade its schema ({e})"),
            )
        } else {
            Error::Pg(e).at(std::path::Path::new(shown))
        }
    };
    // The session is inside this transaction from its first statement: a connection lost in it
    // is not made again mid-way.
    s.transition(State::begin);
    let result = (|| {
        // Several processes may create it at once: one migrates, the others wait and find it
        // done. The lock is the transaction's, so a lost connection cannot leave it held.
        s.batch(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7330271161); CREATE SCHEMA IF NOT EXISTS {SCHEMA};
             CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version (version bigint NOT NULL)"
        ))
        .map_err(at)?;
        let current = match version(s).map_err(at)? {
            Some(v) => v,
            None => {
                // Made meanwhile by someone else than a backfill? Looked at under the lock.
                refuse_foreign(s, shown)?;
                0
            }
        };
        if current > latest() {
            return Err(Error::TooNew {
                path: shown.into(),
                found: current,
                known: latest(),
            });
        }
        for (v, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            s.batch(sql).map_err(|e| {
                if e.is_disconnected() || e.kind() == crate::pg::Kind::PermissionDenied {
                    at(e)
                } else {
                    Error::Invalid(format!("migration {v} of {shown} failed: {e}"))
                }
            })?;
            s.batch(&format!(
                "DELETE FROM schema_version; INSERT INTO schema_version VALUES ({v})"
            ))
            .map_err(at)?;
            crate::fault::point("manifest-migration");
        }
        s.batch("COMMIT").map_err(at)
    })();
    if result.is_err() {
        s.rollback();
    } else {
        s.end_tx();
    }
    result
}

/// Forgets the commit tokens of writers silent for a day: a writer asks for its own only right
/// after losing a connection.
fn prune_commits(s: &Session) {
    let _ = s.batch(
        "DELETE FROM manifest_commits
         WHERE at < CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) - 86400000",
    );
}

/// Opens the manifest's database for reading: its schema must be this binary's.
pub(crate) fn open_read_only(url: &str, shown: &str) -> Result<Session> {
    let s = Session::connect(url, shown, true)?;
    let path = std::path::PathBuf::from(shown);
    match version(&s).map_err(|e| Error::Pg(e).at(&path))? {
        None => {
            refuse_foreign(&s, shown)?;
            Err(Error::Missing { path })
        }
        Some(v) if v > latest() => Err(Error::TooNew {
            path,
            found: v,
            known: latest(),
        }),
        Some(v) if v < latest() => Err(Error::Outdated {
            path,
            found: v,
            known: latest(),
        }),
        Some(_) => Ok(s),
    }
}
