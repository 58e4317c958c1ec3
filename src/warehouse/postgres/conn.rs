//! The warehouse's connections: a small pool per warehouse (a running try holds one connection;
//! idle ones are kept for the next try), each with what the warehouse learnt on it (prepared
//! statements, tables known to exist, columns), over the driver layer's connection
//! ([`crate::pg::conn`]).

use std::collections::{HashMap, HashSet};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, LazyLock, Mutex};

use crate::pg::conn::{ConnectError, connect_url};
use crate::project::{Warehouse, WarehouseKind};

/// Idle connections kept per warehouse.
const KEEP_IDLE: usize = 16;

/// One connection to a warehouse.
pub(crate) struct Conn {
    conn: crate::pg::conn::Conn,
    /// Statements prepared on this connection, by text.
    pub prepared: HashMap<String, tokio_postgres::Statement>,
    /// The bookkeeping tables are known to exist.
    pub booked: bool,
    /// Kept-version tables known to exist.
    pub kept: HashSet<String>,
    /// Whether this manifest keeps versions in the warehouse (looked up once).
    pub has_versions: Option<bool>,
    /// Tables' columns and their types (as `format_type` names them), by table.
    pub columns: HashMap<String, Vec<(String, String)>>,
    /// Whether the try that took this connection still holds it: set anew by each [`take`],
    /// cleared by [`give`], so that a canceller handed out earlier cancels nothing once the
    /// connection serves another try. A cancel holds the lock while it is sent, so `give`
    /// cannot pass it half way.
    lent: Arc<Mutex<bool>>,
}

impl Conn {
    /// How to cancel the statement this connection runs, for as long as the try that took it
    /// holds it (see [`crate::pg::conn::Conn::canceller`]): a try's timeout that fires after the
    /// connection went back to the pool must not cancel the next try's statement.
    pub(crate) fn canceller(&self) -> Box<dyn Fn() + Send> {
        while_lent(self.lent.clone(), self.conn.canceller())
    }
}

/// `cancel`, acting only while `lent` is set, and holding it meanwhile.
fn while_lent(lent: Arc<Mutex<bool>>, cancel: Box<dyn Fn() + Send>) -> Box<dyn Fn() + Send> {
    Box::new(move || {
        let held = lent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *held {
            cancel();
        }
    })
}

/// Ends the lending of `conn`: from here no canceller handed out for it acts, and a cancel it
/// had is forgotten.
fn end_lending(conn: &Conn) {
    *conn
        .lent
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
    conn.forget_cancel();
}

impl Deref for Conn {
    type Target = crate::pg::conn::Conn;

    fn deref(&self) -> &Self::Target {
        &self.conn
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.conn
    }
}

/// Opens a connection to a PostgreSQL warehouse.
pub(crate) fn connect(w: &Warehouse) -> Result<Conn, ConnectError> {
    let WarehouseKind::Postgres(url) = &w.kind else {
        return Err(format!("warehouse `{}` is not a PostgreSQL warehouse", w.name).into());
    };
    Ok(Conn {
        conn: connect_url(url.secret().map_err(str::to_string)?)?,
        prepared: HashMap::new(),
        booked: false,
        kept: HashSet::new(),
        has_versions: None,
        columns: HashMap::new(),
        lent: Arc::new(Mutex::new(true)),
    })
}

static IDLE: LazyLock<Mutex<HashMap<String, Vec<Conn>>>> = LazyLock::new(Mutex::default);

/// A connection from the warehouse's idle ones, or a new one, or why none can be made as the
/// warehouse's error (an environment fault when its server is out of reach or of resources).
pub(crate) fn take_at(w: &Warehouse) -> Result<Conn, super::Error> {
    take(w).map_err(|e| match e.resource {
        Some(r) => super::Error::Environment(super::errors::fault(w, r, &e.message)),
        None => super::Error::Message(e.message).at(w),
    })
}

/// A connection from the warehouse's idle ones, or a new one.
pub(crate) fn take(w: &Warehouse) -> Result<Conn, ConnectError> {
    if let WarehouseKind::Postgres(url) = &w.kind
        && let Ok(mut idle) = IDLE.lock()
        && let Ok(secret) = url.secret()
        && let Some(list) = idle.get_mut(secret)
    {
        while let Some(mut conn) = list.pop() {
            if !conn.is_closed() {
                conn.forget_cancel();
                conn.lent = Arc::new(Mutex::new(true));
                return Ok(conn);
            }
        }
    }
    connect(w)
}

/// Gives a connection back for the next try (a closed one is dropped).
pub(crate) fn give(conn: Conn) {
    end_lending(&conn);
    if conn.is_closed() {
        return;
    }
    if let Ok(mut idle) = IDLE.lock() {
        let list = idle.entry(conn.url().to_string()).or_default();
        if list.len() < KEEP_IDLE {
            list.push(conn);
        }
    }
}

/// Closes every idle connection.
pub(crate) fn close_all() {
    if let Ok(mut idle) = IDLE.lock() {
        idle.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canceller_cancels_nothing_once_its_connection_is_given_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let sent = Arc::new(AtomicUsize::new(0));
        let lent = Arc::new(Mutex::new(true));
        let s = sent.clone();
        let cancel = while_lent(
            lent.clone(),
            Box::new(move || {
                s.fetch_add(1, Ordering::SeqCst);
            }),
        );
        cancel();
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "while lent, a cancel is sent"
        );
        // What `give` does; the next `take` lends with a flag of its own.
        *lent.lock().unwrap() = false;
        cancel();
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "given back, nothing is cancelled"
        );
    }
}
