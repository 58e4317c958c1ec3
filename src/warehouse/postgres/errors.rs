//! PostgreSQL errors as the warehouse reports them: a person's reading of a driver error,
//! the warehouse's error naming the warehouse, and classification by SQLSTATE (retry, a
//! constraint of the target).

use super::*;

/// Turns a driver error into the warehouse's, naming the warehouse, in the server's words. A
/// statement the server cancelled on its own (`statement_timeout`, an administrator's
/// `pg_cancel_backend`) is a failure like any other; one this process cancelled (a try's timeout,
/// a stop) is told apart by the runner, which asked for it, not by the error's words.
pub(super) fn pg(w: &Warehouse) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |e| match crate::pg::error::resource(&e) {
        Some(r) => Error::Environment(fault(w, r, &describe(&e))),
        None => Error::Message(describe(&e)).at(w),
    }
}

/// The environment fault of a warehouse whose server is out of `r` (see
/// [`crate::environment`]), in the server's words.
pub(super) fn fault(
    w: &Warehouse,
    r: crate::pg::Resource,
    words: &str,
) -> crate::environment::Fault {
    use crate::pg::Resource as R;
    let (what, fix) = match r {
        R::DiskFull => ("its server's disk is full", "free space on the server"),
        R::OutOfMemory => (
            "its server is out of memory",
            "free memory on the server, or lower --max-active-runs",
        ),
        R::TooManyConnections => (
            "its server takes no more connections",
            "lower --max-active-runs, or raise the server's max_connections (or the role's or database's connection limit)",
        ),
        R::Exhausted => (
            "its server is out of a resource",
            "see the server's message, and raise that limit",
        ),
        R::ShuttingDown => (
            "its server is shutting down or starting",
            "wait until the server accepts connections",
        ),
        R::Unreachable => (
            "its server cannot be reached",
            "check that the server runs and that this host reaches it",
        ),
    };
    let fault = crate::environment::Fault::new(
        format!(
            "warehouse `{}` ({}): {what} ({words})",
            w.name,
            w.location()
        ),
        fix,
    );
    // A restart, a dropped connection or a full set of connections may pass in a moment: a
    // try with retries left is retried; a full disk or memory on the server does not.
    match r {
        R::Unreachable | R::ShuttingDown | R::TooManyConnections => fault.passing(),
        R::DiskFull | R::OutOfMemory | R::Exhausted => fault,
    }
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
