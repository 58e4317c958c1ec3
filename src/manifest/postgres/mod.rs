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
//!
//! # A session's states
//!
//! A [`Session`] is always in one of five states (`state::State`), and its state changes only
//! by the transitions below, so that what it may do next is decided in one place, and a
//! combination that cannot happen (a transaction's clock outside a transaction, a session both
//! given up and usable) cannot be written down:
//!
//! | state | what it means | a statement asked for |
//! |---|---|---|
//! | `Idle` | outside a transaction, the connection not known to be lost | runs; on a lost connection, the connection is made again and the statement runs again, within the patience |
//! | `InTx(tx)` | inside the writer's transaction (or a migration's); `tx` holds its clock and the fences read under its lock | runs, or is deferred; on a lost connection, fails |
//! | `LostInTx(tx)` | the connection was lost, or went silent, inside the transaction | fails: nothing of the transaction reaches the server any more |
//! | `Lost` | outside a transaction, the connection lost or in no known state | makes the connection again first |
//! | `GaveUp { at }` | making the connection again was given up `at` | fails at once until the patience has passed since, then tries again |
//!
//! The transitions, and what makes each:
//!
//! - `begin`: `Idle` to `InTx` with no clock yet, as the writer's `BEGIN` (or a migration's)
//!   is sent; from `InTx` to a fresh `InTx` when a commit and the next `BEGIN` share a round
//!   trip. On a connection known to be lost, to `LostInTx` (the writer makes the connection
//!   again before it begins, so this only guards).
//! - `begun`: the `BEGIN` round trip answered: the transaction's clock and its fences.
//! - `lose`: `Idle` to `Lost`, `InTx` to `LostInTx`: a statement inside a transaction found the
//!   connection gone, a round trip got no answer within the patience (the connection is then in
//!   no known state, inside a transaction or not), the `PREPARE` of the `BEGIN` statements
//!   failed (a statement prepared before the failure would make the next attempt fail on its
//!   name), or a fault point lost the connection after a commit.
//! - `end`: `InTx` to `Idle`, `LostInTx` to `Lost`: committed or rolled back (a rollback sends
//!   nothing on a lost connection), or a migration done.
//! - `reconnected`: a new connection; `Lost`, `GaveUp`, and an `Idle` whose connection the
//!   driver saw close, to `Idle`.
//! - `give_up`: the connection could not be made again within the patience: `GaveUp`.
//!
//! Why these and no others:
//!
//! - A connection lost inside a transaction is not made again until the transaction has ended
//!   on this side: the server rolled back what it did, and a statement run on a new connection
//!   would commit alone, outside the writers' lock and without the writes before it. The
//!   writer rolls the transaction back on this side, and runs the whole batch again in a new
//!   one (see `manifest::writer`). Outside a transaction every statement is a read or commits
//!   alone, so running it again on a new connection is safe.
//! - A transaction's clock and fences live in the transaction's state: a fence is true only
//!   under the writers' lock, and "now" is the transaction's only inside it; neither can
//!   outlast it.
//! - A connection lost inside a transaction and one that went silent were two flags that were
//!   only ever read together: one state, `LostInTx` or `Lost`.
//! - `GaveUp` is a lost connection that is not tried again for a while: a process that lost its
//!   manifest ends without waiting the patience again for each record it would write.
//!
//! Beside the state, a session keeps what is not a state of the session: its connection with
//! what is prepared on it (replaced whole with it; whether the connection closed is asked of
//! the driver), when the server last answered (the patience counts from it), the fences read
//! in earlier transactions (read again at each `BEGIN`), and the deferred statements with their
//! answers (`deferrals::Deferrals`: an answer outlives its transaction, for the writer to
//! take after the commit).
//!
//! # Files
//!
//! `schema` makes, migrates and checks the schema; `session` is the connection and its
//! statements; `state` the session's states; `transaction` the writer's transaction (begin,
//! deferred statements sent, commit, rollback, whether a commit happened); `deferrals` the
//! queue of deferred statements; `timeouts` the patience and the idle-in-transaction timeout;
//! `values` the values that cross to PostgreSQL and back.

mod deferrals;
mod schema;
mod session;
mod state;
mod timeouts;
mod transaction;
mod values;

pub(crate) use schema::{open, open_read_only};
pub use session::Session;
pub(crate) use timeouts::{patience, set_lease_timeout, set_patience};

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
    (
        12,
        include_str!("../../../migrations/postgres/0012_forgets.sql"),
    ),
    (
        13,
        include_str!("../../../migrations/postgres/0013_pool_rates.sql"),
    ),
    (
        14,
        include_str!("../../../migrations/postgres/0014_readiness.sql"),
    ),
    (
        15,
        include_str!("../../../migrations/postgres/0015_native_types.sql"),
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

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;
    use crate::state::{
        BackfillKind, BackfillState, PlanAction, ReadyState, RunState, StagedState, TryState,
        Verdict,
    };

    /// `CHECK (column IN ('a', 'b'))` of the names given.
    fn check(column: &str, names: impl Iterator<Item = &'static str>) -> String {
        let list: Vec<String> = names.map(|n| format!("'{n}'")).collect();
        format!("CHECK ({column} IN ({}))", list.join(", "))
    }

    /// Every state the program records is one its PostgreSQL schema allows, and no other: each
    /// stored enum is a `CHECK` of the schema, value for value.
    #[test]
    fn the_schemas_checks_allow_exactly_the_states_the_program_records() {
        let schema: String = MIGRATIONS.iter().map(|m| m.1).collect();
        let wanted = [
            check("state", BackfillState::ALL.iter().map(|s| s.as_str())),
            check("kind", BackfillKind::ALL.iter().map(|s| s.as_str())),
            check("action", PlanAction::ALL.iter().map(|s| s.as_str())),
            check("state", RunState::ALL.iter().map(|s| s.as_str())),
            check("state", TryState::ALL.iter().map(|s| s.as_str())),
            check("staged", StagedState::ALL.iter().map(|s| s.as_str())),
            check("state", ReadyState::ALL.iter().map(|s| s.as_str())),
            check("verdict", Verdict::ALL.iter().map(|s| s.as_str())),
        ];
        for c in wanted {
            assert!(schema.contains(&c), "no {c} in the PostgreSQL schema");
        }
    }
}
