//! A session with the manifest's database: its connection, made again when it is lost
//! outside a transaction, the statements prepared on it, and the deferred statements of the
//! writer's transaction.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use tokio_postgres::types::ToSql;

use super::deferrals::Deferrals;
use super::state::{Fence, State};
use super::timeouts::{idle_in_transaction, patience};
use super::values::{params_of, refs, values_of};
use super::{SCHEMA, failure, lost};
use crate::manifest::{Error, Result};
use crate::pg::conn::{Conn, connect_with};
use crate::pg::error::{Error as PgError, Result as PgResult};

/// A connection and what is prepared on it: made again whole when the connection is replaced.
pub(super) struct Link {
    pub conn: Conn,
    /// Statements prepared on it, by their SQL.
    prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// The statements of the writer's `BEGIN` (see `transaction::LOCK_AND_TOKEN`) are
    /// prepared on it.
    pub begin_prepared: Cell<bool>,
}

impl Link {
    fn new(conn: Conn) -> Link {
        Link {
            conn,
            prepared: RefCell::default(),
            begin_prepared: Cell::new(false),
        }
    }
}

/// A session with the manifest's database.
pub struct Session {
    url: String,
    /// A reader's session: every transaction read-only, enforced by the server.
    read_only: bool,
    /// Shown in messages: the URL without its password.
    shown: String,
    /// The connection, and what is prepared on it.
    pub(super) link: RefCell<Link>,
    /// Inside a transaction or not, and whether the connection can be used (see
    /// [`State`]); changed only by its transitions.
    state: RefCell<State>,
    /// When the server last answered.
    last_answer: Cell<Instant>,
    /// The fences read in earlier transactions (keys as in `state::Tx::fences`): read again with
    /// the next transaction's lock, in the same round trip, since this writer's owner asks for
    /// them.
    pub(super) fenced_before: RefCell<BTreeSet<i64>>,
    /// Statements of the writer's transaction deferred (see [`Session::defer`]), their
    /// answers, and the first the server refused.
    pub(super) deferred: RefCell<Deferrals>,
}

impl Session {
    /// Connects to the manifest's database (not looking at its schema).
    pub fn connect(url: &str, shown: &str, read_only: bool) -> Result<Session> {
        if let Err(message) = crate::pg::conn::target(url) {
            return Err(Error::BadUrl {
                location: shown.to_string(),
                message,
            });
        }
        let conn = open_conn(url, read_only).map_err(|why| Error::Postgres {
            location: shown.to_string(),
            message: why,
        })?;
        Ok(Session {
            url: url.to_string(),
            read_only,
            shown: shown.to_string(),
            link: RefCell::new(Link::new(conn)),
            state: RefCell::new(State::Idle),
            last_answer: Cell::new(Instant::now()),
            fenced_before: RefCell::default(),
            deferred: RefCell::default(),
        })
    }

    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// When a lost connection is given up: [`patience`] after the last answer, and not before
    /// one attempt to connect again.
    pub(crate) fn give_up_at(&self) -> Instant {
        self.last_answer.get() + patience()
    }

    /// Replaces a lost connection, trying again with a growing pause until [`patience`] has
    /// passed since the server last answered (at least once).
    pub(crate) fn reconnect(&self) -> PgResult<()> {
        let silent = || {
            format!(
                "the manifest has not answered for {}: giving up (a backfill's owner waits its lease timeout, lease_timeout)",
                humantime::format_duration(patience())
            )
        };
        if self.state.borrow().refuses_reconnecting(patience()) {
            return Err(lost(silent()));
        }
        let deadline = self.give_up_at();
        let mut pause = Duration::from_millis(50);
        loop {
            match open_conn(&self.url, self.read_only) {
                Ok(c) => {
                    *self.link.borrow_mut() = Link::new(c);
                    // Not an answer to a statement (`last_answer` stays): a server that takes
                    // connections and answers nothing is still silent.
                    self.transition(State::reconnected);
                    return Ok(());
                }
                Err(why) if Instant::now() >= deadline => {
                    self.transition(|s| s.give_up(Instant::now()));
                    return Err(lost(format!("{}; last: {why}", silent())));
                }
                Err(why) => {
                    tracing::warn!(manifest = %self.shown, "cannot reach the manifest, trying again: {why}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Whether the connection is gone (lost, silent, or closed).
    pub(crate) fn is_broken(&self) -> bool {
        self.state.borrow().is_lost() || self.link.borrow().conn.is_closed()
    }

    /// Inside a transaction (its connection lost or not).
    pub(super) fn in_tx(&self) -> bool {
        self.state.borrow().in_tx()
    }

    /// Moves the session's state by one of its transitions (see [`State`]): the only way it
    /// changes.
    pub(super) fn transition<T>(&self, transition: impl FnOnce(&mut State) -> T) -> T {
        transition(&mut self.state.borrow_mut())
    }

    /// Waits for the server's answer to `f`, for [`patience`] at most.
    pub(super) fn answer<T>(
        &self,
        conn: &Conn,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> PgResult<T> {
        match conn.wait_within(f, patience()) {
            Some(Ok(v)) => {
                self.last_answer.set(Instant::now());
                Ok(v)
            }
            Some(Err(e)) => Err(PgError::from(&e)),
            None => {
                // The connection is in no known state.
                self.transition(State::lose);
                Err(lost(format!(
                    "the manifest did not answer within {}",
                    humantime::format_duration(patience())
                )))
            }
        }
    }

    /// Runs `f` on the connection; outside a transaction, a lost connection is replaced and `f`
    /// runs again (every statement run outside one is a read or commits alone).
    pub(super) fn with<T>(&self, mut f: impl FnMut(&Link) -> PgResult<T>) -> PgResult<T> {
        let started = Instant::now();
        if self.state.borrow().asks_afresh() && self.last_answer.get().elapsed() > patience() {
            // Silence while nothing was asked is not silence: the patience counts from here.
            self.last_answer.set(started);
        }
        loop {
            if !self.in_tx() && self.is_broken() {
                self.reconnect()?;
            }
            let result = f(&self.link.borrow());
            match result {
                Err(e) if e.is_disconnected() => {
                    if self.in_tx() {
                        self.transition(State::lose);
                        return Err(e);
                    }
                    // Tried again within the patience only: a server that takes connections
                    // and never answers must not be tried for ever.
                    if started.elapsed() >= patience() {
                        return Err(e);
                    }
                    tracing::warn!(manifest = %self.shown, "lost the manifest's connection, connecting again: {e}");
                    self.reconnect()?;
                }
                other => return other,
            }
        }
    }

    /// `sql` prepared on `link`'s connection (once: kept while the connection lasts).
    pub(super) fn statement(&self, link: &Link, sql: &str) -> PgResult<tokio_postgres::Statement> {
        if let Some(s) = link.prepared.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = self.answer(&link.conn, link.conn.client.prepare(sql))?;
        crate::pg::keep_prepared(&mut link.prepared.borrow_mut(), sql, s.clone());
        Ok(s)
    }

    pub(crate) fn fenced(&self, backfill_id: i64) -> Option<Fence> {
        self.state
            .borrow()
            .tx()
            .and_then(|tx| tx.fences.get(&backfill_id).copied())
    }

    pub(crate) fn remember_fence(&self, backfill_id: i64, row: Fence) {
        if self.transition(|s| s.remember(backfill_id, row)) {
            let mut before = self.fenced_before.borrow_mut();
            // A handful at most (an owner, a cascade's members); bounded all the same.
            if before.len() < 16 {
                before.insert(backfill_id);
            }
        }
    }

    /// Forgets the fences read when `sql` may change a backfill.
    pub(super) fn written(&self, sql: &str) {
        // Statements that only read them (a run's start joins `backfills`) keep what was read.
        const WRITES: [&str; 6] = [
            "UPDATE backfills",
            "INSERT INTO backfills",
            "DELETE FROM backfills",
            "UPDATE workers",
            "INSERT INTO workers",
            "DELETE FROM workers",
        ];
        if !sql.contains("backfills") && !sql.contains("workers") {
            return;
        }
        let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        if WRITES.iter().any(|w| flat.contains(w)) {
            self.transition(State::forget_fences);
        }
    }

    /// Runs the prepared `sql` with `values` through `f`.
    fn run<T>(
        &self,
        sql: &str,
        values: &[Value],
        f: impl Fn(&Conn, &tokio_postgres::Statement, &[&(dyn ToSql + Sync)]) -> PgResult<T>,
    ) -> PgResult<T> {
        // What was deferred is sent first: the server runs the transaction's statements in the
        // order they were asked for.
        self.flush()?;
        self.written(sql);
        self.with(|link| {
            let s = self.statement(link, sql)?;
            let params = params_of(values);
            f(&link.conn, &s, &refs(&params))
        })
    }

    pub(crate) fn execute(&self, sql: &str, values: &[Value]) -> PgResult<usize> {
        let n = self.run(sql, values, |conn, s, refs| {
            self.answer(conn, conn.client.execute(s, refs))
        })?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub fn query(&self, sql: &str, values: &[Value]) -> PgResult<Vec<Vec<Value>>> {
        let rows = self.run(sql, values, |conn, s, refs| {
            self.answer(conn, conn.client.query(s, refs))
        })?;
        values_of(&rows)
    }

    /// Inserts rows of `width` values each (`values`, row after row), many rows to a statement
    /// (each statement is a round trip): `head` is `INSERT INTO t (columns)`, `tail` what
    /// follows the values (an `ON CONFLICT` clause, or nothing).
    pub(crate) fn insert_many(
        &self,
        head: &str,
        tail: &str,
        width: usize,
        values: &[Value],
    ) -> PgResult<()> {
        let rows_per_statement = (4096 / width).max(1);
        for chunk in values.chunks(rows_per_statement * width) {
            let tuples: Vec<String> = (0..chunk.len() / width)
                .map(|r| {
                    let cells: Vec<String> = (r * width + 1..=(r + 1) * width)
                        .map(|i| format!("${i}"))
                        .collect();
                    format!("({})", cells.join(", "))
                })
                .collect();
            self.execute(
                &format!("{head} VALUES {} {tail}", tuples.join(", ")),
                chunk,
            )?;
        }
        Ok(())
    }

    pub(crate) fn batch(&self, sql: &str) -> PgResult<()> {
        self.flush()?;
        self.written(sql);
        self.with(|link| self.answer(&link.conn, link.conn.client.batch_execute(sql)))
    }

    /// The database's clock (unix milliseconds): the transaction's, read when its lock was
    /// taken, else now.
    pub(crate) fn now_ms(&self) -> PgResult<i64> {
        if let Some(now) = self.state.borrow().tx().and_then(|tx| tx.now) {
            return Ok(now);
        }
        self.clock_now_ms()
    }

    /// The database's clock as this statement reads it, not the transaction's start.
    pub(crate) fn clock_now_ms(&self) -> PgResult<i64> {
        let rows = self.query(
            "SELECT CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint)",
            &[],
        )?;
        match rows.first().and_then(|r| r.first()) {
            Some(Value::Integer(now)) => Ok(*now),
            _ => Err(failure("the database did not tell its clock".into())),
        }
    }
}

/// A connection set up for the manifest: its schema first on the search path, a session that
/// sits idle inside a transaction ended by the server, and for a reader, transactions the
/// server keeps read-only.
pub(super) fn open_conn(url: &str, read_only: bool) -> std::result::Result<Conn, String> {
    Ok(connect_with(
        url,
        &format!(
            "SET search_path = {SCHEMA}, pg_catalog; SET idle_in_transaction_session_timeout = {}{}",
            idle_in_transaction().as_millis(),
            if read_only {
                "; SET default_transaction_read_only = on"
            } else {
                ""
            }
        ),
    )?)
}
