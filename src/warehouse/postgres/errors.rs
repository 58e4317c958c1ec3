//! PostgreSQL errors as the warehouse reports them: a person's reading of a driver error,
//! the warehouse's error naming the warehouse, and classification by SQLSTATE (retry, a
//! constraint of the target).

use super::*;

/// Turns a driver error into the warehouse's, naming the warehouse, in the server's words. A
/// statement the server cancelled on its own (`statement_timeout`, an administrator's
/// `pg_cancel_backend`) is a failure like any other; one this process cancelled (a try's timeout,
/// a stop) is told apart by the runner, which asked for it, not by the error's words.
pub(super) fn pg(w: &Warehouse) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |e| Error::Message(describe(&e)).at(w)
}

/// Whether the server asks for the transaction to be run again.
pub(super) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    crate::pg::error::kind(e) == crate::pg::Kind::Retryable
}

pub(super) enum Failure {
    Pg(tokio_postgres::Error),
    Other(Error),
}

impl Failure {
    /// The warehouse's error, naming the warehouse.
    pub(super) fn at(self, w: &Warehouse) -> Error {
        match self {
            Self::Pg(e) => pg(w)(e),
            Self::Other(e) => e.at(w),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Pg(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Self::Other(e)
    }
}

/// Whether the target refused a try's rows by one of its constraints (a key, a unique index, an
/// exclusion, a check, a foreign key: SQLSTATE class 23), rather than the try failing: the
/// gate then judges the output, measured apart from the target.
pub(super) fn is_constraint(e: &tokio_postgres::Error) -> bool {
    crate::pg::error::kind(e) == crate::pg::Kind::Constraint
}

/// What a constraint violation says, as the gate records it: the message, its detail, and the
/// constraint's table.
pub(super) fn constraint_message(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return describe(e);
    };
    let mut s = db.message().to_string();
    if let Some(d) = db.detail() {
        let _ = write!(s, "; {d}");
    }
    if let (Some(schema), Some(table)) = (db.schema(), db.table()) {
        let _ = write!(s, " (table {schema}.{table})");
    }
    s
}
