//! A session with the manifest's database: its connection, made again when it is lost
//! outside a transaction, the statements prepared on it, and the deferred statements of the
//! writer's transaction.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use tokio_postgres::types::ToSql;

use super::deferrals::Deferrals;
use super::timeouts::{idle_in_transaction, patience};
use super::values::{params_of, refs, translate, values_of};
use super::{SCHEMA, failure, lost};
use crate::manifest::{Error, Result};
use crate::pg::conn::{Conn, connect_with};
use crate::pg::error::{Error as PgError, Result as PgResult};

/// A session with the manifest's database.
pub struct Session {
    pub(super) url: String,
    /// A reader's session: every transaction read-only, enforced by the server.
    pub(super) read_only: bool,
    /// Shown in messages: the URL without its password.
    pub(super) shown: String,
    pub(super) conn: RefCell<Option<Conn>>,
    pub(super) prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// The statements of the writer's `BEGIN` ([`LOCK_AND_TOKEN`], [`SCHEMA_VERSION`]) are
    /// prepared on this connection.
    pub(super) begin_prepared: Cell<bool>,
    /// Inside the writer's transaction: a lost connection must not be replaced mid-way.
    pub(super) in_tx: Cell<bool>,
    /// The transaction's "now", read when its lock was taken.
    pub(super) tx_now: Cell<Option<i64>>,
    /// The connection was lost inside a transaction.
    pub(super) broken: Cell<bool>,
    /// A round trip got no answer within [`patience`]: the connection is in no known state.
    pub(super) hung: Cell<bool>,
    /// When the server last answered.
    pub(super) last_answer: Cell<Instant>,
    /// When making the connection again was last given up: until [`patience`] has passed since,
    /// every call fails at once (a process that lost its manifest ends without waiting again
    /// for each record it would write).
    pub(super) gave_up: Cell<Option<Instant>>,
    /// Backfills' epochs and states read in the writer's transaction (see `Conn::fenced`).
    pub(super) fences: RefCell<HashMap<i64, (i64, crate::state::BackfillState)>>,
    /// The fences read in earlier transactions (keys as in `fences`): read again with the next
    /// transaction's lock, in the same round trip, since this writer's owner asks for them.
    pub(super) fenced_before: RefCell<std::collections::BTreeSet<i64>>,
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
            conn: RefCell::new(Some(conn)),
            prepared: RefCell::default(),
            begin_prepared: Cell::new(false),
            in_tx: Cell::new(false),
            tx_now: Cell::new(None),
            broken: Cell::new(false),
            hung: Cell::new(false),
            last_answer: Cell::new(Instant::now()),
            gave_up: Cell::new(None),
            fences: RefCell::default(),
            fenced_before: RefCell::default(),
            deferred: RefCell::default(),
        })
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// When a lost connection is given up: [`patience`] after the last answer, and not before
    /// one attempt to connect again.
    pub fn give_up_at(&self) -> Instant {
        self.last_answer.get() + patience()
    }

    /// Replaces a lost connection, trying again with a growing pause until [`patience`] has
    /// passed since the server last answered (at least once).
    pub fn reconnect(&self) -> PgResult<()> {
        let silent = || {
            format!(
                "the manifest has not answered for {}: giving up (a backfill's owner waits its lease timeout, lease_timeout)",
                humantime::format_duration(patience())
            )
        };
        if let Some(at) = self.gave_up.get()
            && at.elapsed() < patience()
        {
            return Err(lost(silent()));
        }
        let deadline = self.give_up_at();
        let mut pause = Duration::from_millis(50);
        loop {
            match open_conn(&self.url, self.read_only) {
                Ok(c) => {
                    *self.conn.borrow_mut() = Some(c);
                    self.prepared.borrow_mut().clear();
                    self.begin_prepared.set(false);
                    self.broken.set(false);
                    self.hung.set(false);
                    // Not an answer to a statement: a server that takes connections and answers
                    // nothing is still silent.
                    self.gave_up.set(None);
                    return Ok(());
                }
                Err(why) if Instant::now() >= deadline => {
                    self.gave_up.set(Some(Instant::now()));
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

    /// Whether the connection is gone (lost inside a transaction, or closed).
    pub fn is_broken(&self) -> bool {
        self.broken.get()
            || self.hung.get()
            || self.conn.borrow().as_ref().is_none_or(Conn::is_closed)
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
                self.hung.set(true);
                Err(lost(format!(
                    "the manifest did not answer within {}",
                    humantime::format_duration(patience())
                )))
            }
        }
    }

    /// Runs `f` on the connection; outside a transaction, a lost connection is replaced and `f`
    /// runs again (every statement run outside one is a read or commits alone).
    pub(super) fn with<T>(
        &self,
        mut f: impl FnMut(&Conn, &RefCell<HashMap<String, tokio_postgres::Statement>>) -> PgResult<T>,
    ) -> PgResult<T> {
        let started = Instant::now();
        if !self.in_tx.get()
            && self.gave_up.get().is_none()
            && self.last_answer.get().elapsed() > patience()
        {
            // Silence while nothing was asked is not silence: the patience counts from here.
            self.last_answer.set(started);
        }
        loop {
            if !self.in_tx.get() && self.is_broken() {
                self.reconnect()?;
            }
            let result = {
                let conn = self.conn.borrow();
                let conn = conn
                    .as_ref()
                    .ok_or_else(|| lost("the connection is closed".into()))?;
                f(conn, &self.prepared)
            };
            match result {
                Err(e) if e.is_disconnected() => {
                    if self.in_tx.get() {
                        self.broken.set(true);
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

    pub(super) fn statement(
        &self,
        conn: &Conn,
        prepared: &RefCell<HashMap<String, tokio_postgres::Statement>>,
        sql: &str,
    ) -> PgResult<tokio_postgres::Statement> {
        if let Some(s) = prepared.borrow().get(sql) {
            return Ok(s.clone());
        }
        let text = translate(sql);
        let s = self.answer(conn, conn.client.prepare(&text))?;
        crate::pg::keep_prepared(&mut prepared.borrow_mut(), sql, s.clone());
        Ok(s)
    }

    pub fn fenced(&self, backfill_id: i64) -> Option<(i64, crate::state::BackfillState)> {
        self.fences.borrow().get(&backfill_id).copied()
    }

    pub fn remember_fence(&self, backfill_id: i64, row: (i64, crate::state::BackfillState)) {
        if self.in_tx.get() {
            self.fences.borrow_mut().insert(backfill_id, row);
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
            self.fences.borrow_mut().clear();
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
        self.with(|conn, prepared| {
            let s = self.statement(conn, prepared, sql)?;
            let params = params_of(values);
            f(conn, &s, &refs(&params))
        })
    }

    pub fn execute(&self, sql: &str, values: &[Value]) -> PgResult<usize> {
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
    pub fn insert_many(
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
                        .map(|i| format!("?{i}"))
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

    pub fn batch(&self, sql: &str) -> PgResult<()> {
        self.flush()?;
        self.written(sql);
        self.with(|conn, _| self.answer(conn, conn.client.batch_execute(sql)))
    }

    /// The database's clock (unix milliseconds): the transaction's, read when its lock was
    /// taken, else now.
    pub fn now_ms(&self) -> PgResult<i64> {
        if let Some(now) = self.tx_now.get() {
            return Ok(now);
        }
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
