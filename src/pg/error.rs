//! PostgreSQL errors as the layers above act on them: what the failure means (its [`Kind`], by
//! SQLSTATE and by the driver's own state, never by the words of a message) and how a person
//! reads it.

use std::error::Error as _;

use tokio_postgres::error::SqlState;

/// What a failure means to the code that met it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The connection is gone (the server restarted or ended the session, the network dropped):
    /// an open transaction did not commit, and a new connection may succeed.
    Disconnected,
    /// The server asks for the transaction to run again (a serialization failure, a deadlock).
    Retryable,
    /// The statement was cancelled: by a cancel request or by `statement_timeout` (one SQLSTATE,
    /// 57014; the caller knows whether it asked for a cancel).
    Cancelled,
    /// The role may not do this (42501).
    PermissionDenied,
    /// A constraint of the table refused the rows (SQLSTATE class 23).
    Constraint,
    /// Anything else: a failure of the statement itself.
    Other,
}

/// The kind of a driver error.
pub(crate) fn kind(e: &tokio_postgres::Error) -> Kind {
    if e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()) {
        return Kind::Disconnected;
    }
    let Some(code) = e.code() else {
        return Kind::Other;
    };
    match code {
        c if [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
        ]
        .contains(c) =>
        {
            Kind::Disconnected
        }
        c if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            Kind::Retryable
        }
        c if *c == SqlState::QUERY_CANCELED => Kind::Cancelled,
        c if *c == SqlState::INSUFFICIENT_PRIVILEGE => Kind::PermissionDenied,
        c if c.code().starts_with("23") => Kind::Constraint,
        _ => Kind::Other,
    }
}

/// What a failure says about the server, or the way to it, rather than about the statement:
/// the server is out of a resource (SQLSTATE class 53), shutting down or starting (57P01 to
/// 57P03), or the connection failed or is gone (class 08, a closed connection). Another try
/// would meet it too; the layers above stop rather than fail the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resource {
    /// 53100 `disk_full`.
    DiskFull,
    /// 53200 `out_of_memory`.
    OutOfMemory,
    /// 53300 `too_many_connections`.
    TooManyConnections,
    /// Another of class 53 (53400 `configuration_limit_exceeded`).
    Exhausted,
    /// Shutting down, crashed, or not accepting connections yet (57P01, 57P02, 57P03).
    ShuttingDown,
    /// The connection could not be made or is gone (class 08, a closed connection, a
    /// network error).
    Unreachable,
}

/// The [`Resource`] a driver error is about, if it is about one.
pub(crate) fn resource(e: &tokio_postgres::Error) -> Option<Resource> {
    if let Some(code) = e.code() {
        let code = code.code();
        return match code {
            "53100" => Some(Resource::DiskFull),
            "53200" => Some(Resource::OutOfMemory),
            "53300" => Some(Resource::TooManyConnections),
            c if c.starts_with("53") => Some(Resource::Exhausted),
            "57P01" | "57P02" | "57P03" => Some(Resource::ShuttingDown),
            c if c.starts_with("08") => Some(Resource::Unreachable),
            _ => None,
        };
    }
    (e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()))
        .then_some(Resource::Unreachable)
}

/// A failure on a PostgreSQL session: its kind, its SQLSTATE when the server sent one, and what
/// a person reads (see [`super::describe`]).
#[derive(Debug, Clone)]
pub struct Error {
    kind: Kind,
    message: String,
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A failure met by the code above the driver (a reply it cannot use).
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    pub(crate) fn is_disconnected(&self) -> bool {
        self.kind == Kind::Disconnected
    }
}

impl From<&tokio_postgres::Error> for Error {
    fn from(e: &tokio_postgres::Error) -> Self {
        Self {
            kind: kind(e),
            message: super::describe(e),
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::from(&e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
