//! The manifest in a PostgreSQL database, for several hosts sharing one record.
//!
//! The tables live in the schema `backfill_manifest`, created and migrated on first use
//! (`migrations/postgres/NNNN_*.sql`, the version in `backfill_manifest.schema_version`); a
//! binary older than the schema refuses it. Values cross as SQLite's five types (see
//! `manifest::db`), so the schema keeps flags and times as `bigint`.
//!
//! The writer of each process runs its batch of jobs in one transaction that first locks the
//! one row of `manifest_lock`: the writers of every host take turns, as SQLite's `BEGIN
//! IMMEDIATE` makes the processes of one machine take turns, so every check a job makes (an
//! owner's epoch, a lease) still holds when it commits. A session that stops talking inside a
//! transaction (a frozen host) is ended by the server after [`idle_in_transaction`] (a fifth
//! of the lease timeout, at most [`IDLE_IN_TRANSACTION`]), which frees the lock for the others
//! well before their heartbeats give up. "Now" is the database's clock.

mod deferrals;
mod schema;
mod session;
mod state;
mod timeouts;
mod transaction;
mod values;

pub use schema::{open, open_read_only};
pub use session::Session;
pub use timeouts::{
    IDLE_IN_TRANSACTION, PATIENCE, idle_in_transaction, patience, set_lease_timeout, set_patience,
};

use crate::pg::error::{Error as PgError, Kind};

/// The schema that holds the manifest's tables.
pub const SCHEMA: &str = "backfill_manifest";

/// `(version after applying, SQL)`, in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_manifest.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_workers.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_one_database.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_definition.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_batch_size.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/postgres/0006_batch_holder.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/postgres/0007_project.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/postgres/0008_owner_start.sql"),
    ),
    (
        9,
        include_str!("../../../migrations/postgres/0009_merge.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/postgres/0010_atomic.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/postgres/0011_reports.sql"),
    ),
];

/// A failure of this side, not the server's.
fn failure(message: String) -> PgError {
    PgError::new(Kind::Other, message)
}

/// A connection lost, or a server silent for too long.
fn lost(message: String) -> PgError {
    PgError::new(Kind::Disconnected, message)
}

/// The schema version this binary makes and knows.
fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}
