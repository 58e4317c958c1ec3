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

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rusqlite::types::Value;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

use super::{Error, Result};
use crate::pg::conn::{Conn, connect_with};
use crate::pg::error::{Error as PgError, Kind, Result as PgResult};

/// The schema that holds the manifest's tables.
pub const SCHEMA: &str = "backfill_manifest";

/// `(version after applying, SQL)`, in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../migrations/postgres/0001_manifest.sql"),
    ),
    (
        2,
        include_str!("../../migrations/postgres/0002_workers.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres/0003_one_database.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_definition.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_batch_size.sql"),
    ),
    (
        6,
        include_str!("../../migrations/postgres/0006_batch_holder.sql"),
    ),
    (
        7,
        include_str!("../../migrations/postgres/0007_project.sql"),
    ),
    (
        8,
        include_str!("../../migrations/postgres/0008_owner_start.sql"),
    ),
    (9, include_str!("../../migrations/postgres/0009_merge.sql")),
    (
        10,
        include_str!("../../migrations/postgres/0010_atomic.sql"),
    ),
    (
        11,
        include_str!("../../migrations/postgres/0011_reports.sql"),
    ),
];

/// The longest the server lets a manifest session sit idle inside a transaction before it ends
/// the session (and rolls its transaction back): a frozen host holds the writers' lock no
/// longer than this, nor than a fifth of the lease timeout (see [`idle_in_transaction`]).
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// The idle-in-transaction timeout of this process's manifest sessions, in milliseconds (see
/// [`set_lease_timeout`]).
static IDLE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(IDLE_IN_TRANSACTION.as_millis() as u64);

/// How long the server lets a session of this process sit idle inside a transaction: a peer
/// waits for the writers' lock behind a frozen process at most about that long.
pub fn idle_in_transaction() -> Duration {
    Duration::from_millis(IDLE_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Fits this process's manifest sessions to the project's lease timeout, before the first
/// connection: a session idle inside a transaction is ended after a fifth of the lease (at
/// most [`IDLE_IN_TRANSACTION`]), so that a peer that waits behind a frozen writer for the
/// writers' lock hears back within half its lease, the time after which its heartbeat gives
/// up; and the patience is the lease (see [`set_patience`]).
pub fn set_lease_timeout(lease: Duration) {
    let idle = (lease / 5).min(IDLE_IN_TRANSACTION);
    let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(100);
    IDLE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
    set_patience(lease);
}

/// How long the manifest may go without answering before this process gives up on it, when
/// nothing set it (see [`set_patience`]).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The patience of this process, in milliseconds (see [`set_patience`]).
static PATIENCE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(PATIENCE.as_millis() as u64);

/// How long the manifest may go without answering before this process gives up on it: each
/// round trip waits for its answer that long at most (a server or a network that hangs, not
/// only one that refuses), and a lost connection is made again for that long after the last
/// answer. A backfill's owner sets its lease timeout: a manifest silent for longer has let its
/// leases expire, so the owner stops and exits rather than hang (the backfill stays resumable).
/// Never less than twice [`IDLE_IN_TRANSACTION`]: waiting for the writers' lock behind a host
/// frozen inside a transaction (which the server ends after at most that long) is not silence,
/// and a server that restarts is waited for that long at least.
pub fn set_patience(d: Duration) {
    let d = d.max(IDLE_IN_TRANSACTION * 2);
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    PATIENCE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

pub fn patience() -> Duration {
    Duration::from_millis(PATIENCE_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// The writers' lock and the schema's version, the two statements of every writer's `BEGIN`
/// round trip (see [`Session::begin`]), `$1` the writer and `$2` its token. The lock is a
/// statement of its own: the reads after it must see what the writer before committed.
const LOCK_AND_TOKEN: &str = "WITH lock AS (SELECT 1 FROM manifest_lock FOR UPDATE)
    INSERT INTO manifest_commits (writer, token, at)
    SELECT $1, $2, CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) FROM lock
    ON CONFLICT (writer) DO UPDATE SET token = excluded.token, at = excluded.at
    RETURNING at";
const SCHEMA_VERSION: &str = "SELECT 'schema', max(version) FROM schema_version";

/// A session with the manifest's database.
pub struct Session {
    url: String,
    /// A reader's session: every transaction read-only, enforced by the server.
    read_only: bool,
    /// Shown in messages: the URL without its password.
    shown: String,
    conn: RefCell<Option<Conn>>,
    prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// The statements of the writer's `BEGIN` ([`LOCK_AND_TOKEN`], [`SCHEMA_VERSION`]) are
    /// prepared on this connection.
    begin_prepared: Cell<bool>,
    /// Inside the writer's transaction: a lost connection must not be replaced mid-way.
    in_tx: Cell<bool>,
    /// The transaction's "now", read when its lock was taken.
    tx_now: Cell<Option<i64>>,
    /// The connection was lost inside a transaction.
    broken: Cell<bool>,
    /// A round trip got no answer within [`patience`]: the connection is in no known state.
    hung: Cell<bool>,
    /// When the server last answered.
    last_answer: Cell<Instant>,
    /// When making the connection again was last given up: until [`patience`] has passed since,
    /// every call fails at once (a process that lost its manifest ends without waiting again
    /// for each record it would write).
    gave_up: Cell<Option<Instant>>,
    /// Backfills' epochs and states read in the writer's transaction (see `Conn::fenced`).
    fences: RefCell<HashMap<i64, (i64, crate::state::BackfillState)>>,
    /// The fences read in earlier transactions (keys as in `fences`): read again with the next
    /// transaction's lock, in the same round trip, since this writer's owner asks for them.
    fenced_before: RefCell<std::collections::BTreeSet<i64>>,
    /// Statements of the writer's transaction deferred (see [`Session::defer`]) and not sent
    /// yet, with their tickets.
    unsent: RefCell<Vec<(usize, String, Vec<Value>)>>,
    /// The deferred statements' answers not taken yet, by ticket.
    answers: RefCell<HashMap<usize, PgResult<Vec<Vec<Value>>>>>,
    /// The next deferred statement's ticket.
    tickets: Cell<usize>,
    /// The first of the transaction's deferred statements that the server refused, by ticket:
    /// the transaction cannot commit. Kept past its commit for the writer to ask
    /// ([`Session::refused_commit`]); the next transaction begun alone forgets it.
    refused: RefCell<Option<(usize, PgError)>>,
}

fn failure(message: String) -> PgError {
    PgError::new(Kind::Other, message)
}

fn lost(message: String) -> PgError {
    PgError::new(Kind::Disconnected, message)
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
            unsent: RefCell::default(),
            answers: RefCell::default(),
            tickets: Cell::new(0),
            refused: RefCell::default(),
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
    fn answer<T>(
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
    fn with<T>(
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

    fn statement(
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
    fn written(&self, sql: &str) {
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

    /// Whether a statement asked for now may be deferred (see [`Session::defer`]): inside the
    /// writer's transaction.
    pub fn defers(&self) -> bool {
        self.in_tx.get()
    }

    /// Queues `sql` to be sent with the transaction's other deferred statements, in one round
    /// trip, when the writer asks for their answers ([`Session::flush`]) or before any statement
    /// that is not deferred; returns the ticket of its answer ([`Session::take_answer`]). The
    /// server runs the statements in the order they were asked for, and once one fails, every
    /// later one of the transaction fails too.
    pub fn defer(&self, sql: &str, values: Vec<Value>) -> usize {
        let ticket = self.tickets.get();
        self.tickets.set(ticket.wrapping_add(1));
        self.unsent
            .borrow_mut()
            .push((ticket, sql.to_string(), values));
        ticket
    }

    /// Sends the deferred statements not sent yet, together, and waits for their answers
    /// (pipelined: one round trip, however many). A connection lost or silent meanwhile marks
    /// the session as such, and every statement unanswered has that error.
    pub fn flush(&self) -> PgResult<()> {
        if self.unsent.borrow().is_empty() {
            return Ok(());
        }
        match self.flush_then(None) {
            // The connection is gone: nothing more can be sent in this transaction.
            Err(e) if self.is_broken() => Err(e),
            _ => Ok(()),
        }
    }

    /// [`Session::flush`], and `last` (statements without parameters) sent after the deferred
    /// ones in the same round trip: its messages, or the failure of the round trip (a
    /// connection lost or silent, a statement that could not be prepared).
    fn flush_then(&self, last: Option<&str>) -> PgResult<Vec<tokio_postgres::SimpleQueryMessage>> {
        let unsent = std::mem::take(&mut *self.unsent.borrow_mut());
        for (_, sql, _) in &unsent {
            self.written(sql);
        }
        let mut answered: Vec<PgResult<Vec<Vec<Value>>>> = Vec::new();
        let sent = self.with(|conn, prepared| {
            let statements = unsent
                .iter()
                .map(|(_, sql, _)| self.statement(conn, prepared, sql))
                .collect::<PgResult<Vec<_>>>()?;
            let params: Vec<Vec<Param<'_>>> = unsent
                .iter()
                .map(|(_, _, values)| params_of(values))
                .collect();
            let refs: Vec<Vec<&(dyn ToSql + Sync)>> = params.iter().map(|p| refs(p)).collect();
            let queries = futures_util::future::join_all(
                statements
                    .iter()
                    .zip(&refs)
                    .map(|(s, refs)| conn.client.query(s, refs.as_slice())),
            );
            // Polled in order: the deferred statements are sent first.
            let then = async {
                match last {
                    Some(sql) => conn.client.simple_query(sql).await,
                    None => Ok(Vec::new()),
                }
            };
            let (rows, messages) = self.answer(conn, async {
                Ok(futures_util::future::join(queries, then).await)
            })?;
            let mut refused = self.refused.borrow_mut();
            answered = rows
                .into_iter()
                .zip(&unsent)
                .map(|(r, (ticket, _, _))| {
                    // The server's error (a value this side could not send never reached it).
                    let by_server = r.as_ref().is_err_and(|e| e.code().is_some());
                    let rows = r.map_err(|e| PgError::from(&e));
                    // The server's refusals, not this side's failures to read a row: the
                    // first (in the order sent) is why the transaction cannot commit.
                    if let Err(e) = &rows
                        && by_server
                        && refused.as_ref().is_none_or(|(t, _)| ticket < t)
                    {
                        *refused = Some((*ticket, e.clone()));
                    }
                    rows.and_then(|rows| values_of(&rows))
                })
                .collect();
            drop(refused);
            if last.is_some()
                && !unsent.is_empty()
                && messages.is_ok()
                && crate::fault::point("manifest-answers-lost")
            {
                // The server committed, and the connection is lost before the answers arrive.
                self.broken.set(true);
                let gone = lost("the connection was lost after the commit (injected)".into());
                answered = unsent.iter().map(|_| Err(gone.clone())).collect();
                return Err(gone);
            }
            // A connection lost part way is the session's failure (the answers that came before
            // are kept).
            if let Some(e) = answered
                .iter()
                .find_map(|r| r.as_ref().err().filter(|e| e.is_disconnected()))
            {
                return Err(e.clone());
            }
            messages.map_err(|e| PgError::from(&e))
        });
        // Each statement's answer; those that got none, the round trip's failure.
        let mut answered = answered.into_iter();
        let mut answers = self.answers.borrow_mut();
        for (ticket, _, _) in &unsent {
            let answer = answered.next().unwrap_or_else(|| match &sent {
                Err(e) => Err(e.clone()),
                Ok(_) => Err(failure("a deferred statement got no answer".into())),
            });
            answers.insert(*ticket, answer);
        }
        sent
    }

    /// The server's refusal of one of the transaction's deferred statements, the first in the
    /// order they were sent.
    fn deferred_failure(&self) -> Option<PgError> {
        self.refused.borrow().as_ref().map(|(_, e)| e.clone())
    }

    /// Whether the last commit did not happen because the server refused one of its deferred
    /// statements (asked once): then one of the jobs is to blame, and the others run again.
    pub fn refused_commit(&self) -> bool {
        self.refused.borrow_mut().take().is_some()
    }

    /// The answer of a deferred statement (see [`Session::defer`]), once: sent first if it was
    /// not.
    pub fn take_answer(&self, ticket: usize) -> PgResult<Vec<Vec<Value>>> {
        // A failure to send is each statement's answer.
        let _ = self.flush();
        self.answers
            .borrow_mut()
            .remove(&ticket)
            .unwrap_or_else(|| Err(failure("a deferred statement's answer is missing".into())))
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

    /// Starts the writer's transaction: takes the writers' lock, records `token` as this
    /// writer's latest commit (see [`Session::committed`]) and reads the clock, in one round
    /// trip.
    pub fn begin(&self, writer: &str, token: i64) -> PgResult<()> {
        self.begin_after("", writer, token)
    }

    /// Commits the writer's transaction and starts the next one (see [`Session::begin`]) in
    /// one round trip: for a writer whose next jobs are already waiting. On an error, whether
    /// the commit happened is for [`Session::committed`] to say; no transaction is open then.
    pub fn commit_and_begin(&self, writer: &str, token: i64) -> PgResult<()> {
        // The failure may be the new transaction's (then rolled back), not the commit's.
        self.begin_after("COMMIT; ", writer, token)
    }

    /// [`Session::begin`], its statements after `before`.
    fn begin_after(&self, before: &str, writer: &str, token: i64) -> PgResult<()> {
        if before.is_empty() {
            // After a commit in the same round trip, the answers of its deferred statements are
            // kept for the writer to take.
            self.answers.borrow_mut().clear();
            self.refused.borrow_mut().take();
        }
        // The two statements every transaction begins with are prepared once per connection
        // and sent as `EXECUTE` in the same query string, so that they are not parsed and
        // planned again each time (planning them took twice as long as running them), and a
        // failure still ends the statements after it. Prepared outside a transaction, by the
        // first begin; should that fail, the connection is made again (a statement prepared
        // before the failure would make the next attempt fail on its name).
        if !self.begin_prepared.get() && before.is_empty() {
            let prepare = format!(
                "PREPARE backfill_lock(text, bigint) AS {LOCK_AND_TOKEN};
                 PREPARE backfill_schema AS {SCHEMA_VERSION}"
            );
            if let Err(e) =
                self.with(|conn, _| self.answer(conn, conn.client.batch_execute(&prepare)))
            {
                self.broken.set(true);
                return Err(e);
            }
            self.begin_prepared.set(true);
        }
        self.in_tx.set(true);
        self.tx_now.set(None);
        self.fences.borrow_mut().clear();
        // The fences this writer read before are read again under the new lock, in the same
        // round trip: an owner's first write of the transaction then needs no read of its own.
        let (backfills, workers): (Vec<i64>, Vec<i64>) =
            self.fenced_before.borrow().iter().partition(|k| **k > 0);
        let list = |ids: &[i64]| {
            ids.iter()
                .map(|k| k.abs().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        // Every value is made here (hex and numbers): nothing from outside is spliced in.
        let mut sql = if self.begin_prepared.get() {
            format!(
                "{before}BEGIN; EXECUTE backfill_lock('{writer}', {token}); EXECUTE backfill_schema"
            )
        } else {
            let lock = LOCK_AND_TOKEN
                .replace("$1", &format!("'{writer}'"))
                .replace("$2", &token.to_string());
            format!("{before}BEGIN; {lock}; {SCHEMA_VERSION}")
        };
        if !backfills.is_empty() {
            sql.push_str(&format!(
                "; SELECT id, epoch, state FROM backfills WHERE id IN ({})",
                list(&backfills)
            ));
        }
        if !workers.is_empty() {
            sql.push_str(&format!(
                "; SELECT -id, epoch, state FROM workers WHERE id IN ({})",
                list(&workers)
            ));
        }
        // The deferred statements of the transaction it commits go first.
        let begun = self.flush_then(Some(&sql)).and_then(|messages| {
            // A deferred statement failed: the commit before was a rollback, and the
            // transaction begun after it ends here too.
            if let Some(e) = self.deferred_failure() {
                return Err(e);
            }
            let mut rows = messages.iter().filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            });
            // Without the lock's row the insert returns nothing, and the first row is the
            // schema's.
            let now = rows
                .next()
                .filter(|r| r.get(0) != Some("schema"))
                .and_then(|r| r.get(0).and_then(|v| v.parse::<i64>().ok()))
                .ok_or_else(|| {
                    failure(
                        "the manifest has no writers' lock row (manifest_lock); its schema is damaged"
                            .into(),
                    )
                })?;
            // A newer backfill may have upgraded the schema while this one ran: then this one
            // writes nothing more.
            let schema = rows
                .next()
                .and_then(|r| r.get(1).and_then(|v| v.parse::<i64>().ok()))
                .unwrap_or(0);
            if schema != latest() {
                return Err(failure(format!(
                    "the manifest's schema is now version {schema}, and this backfill knows version {}: a {} backfill changed it while this one ran, so this one writes nothing more; go on with the backfill of that version (`backfill resume`)",
                    latest(),
                    if schema > latest() { "newer" } else { "different" }
                )));
            }
            let mut read = HashMap::new();
            for r in rows {
                let key = r.get(0).and_then(|v| v.parse::<i64>().ok());
                let epoch = r.get(1).and_then(|v| v.parse::<i64>().ok());
                let state = r
                    .get(2)
                    .and_then(|v| v.parse::<crate::state::BackfillState>().ok());
                if let (Some(key), Some(epoch), Some(state)) = (key, epoch, state) {
                    read.insert(key, (epoch, state));
                }
            }
            Ok((now, read))
        });
        match begun {
            Ok((now, read)) => {
                self.tx_now.set(Some(now));
                *self.fences.borrow_mut() = read;
                Ok(())
            }
            Err(e) => {
                // The transaction may be open (and aborted, or holding the lock): it ends here.
                self.rollback();
                Err(e)
            }
        }
    }

    /// Ends the transaction on this side: its deferred statements not sent are dropped, and
    /// the answers of those sent are kept until the next transaction begins.
    fn end_tx(&self) {
        self.unsent.borrow_mut().clear();
        self.in_tx.set(false);
        self.tx_now.set(None);
        self.fences.borrow_mut().clear();
    }

    /// Commits the writer's transaction, its deferred statements sent first in the same round
    /// trip. When one of them failed, nothing was committed (the server ends a transaction
    /// that holds a failure with a rollback, which it reports for `COMMIT`): that failure is
    /// the error.
    pub fn commit(&self) -> PgResult<()> {
        let r = self.flush_then(Some("COMMIT")).map(|_| ());
        let r = match self.deferred_failure() {
            Some(e) if r.is_ok() => Err(e),
            _ => r,
        };
        self.end_tx();
        r
    }

    pub fn rollback(&self) {
        if !self.is_broken() {
            let _ = self.with(|conn, _| self.answer(conn, conn.client.batch_execute("ROLLBACK")));
        }
        self.end_tx();
    }

    /// Whether the transaction that recorded `token` for `writer` committed (asked after the
    /// connection was lost during its `COMMIT`).
    pub fn committed(&self, writer: &str, token: i64) -> PgResult<bool> {
        // Under the writers' lock: a commit still under way (slow, or waiting for a standby)
        // holds it, and is seen once it is done, never read as "not committed" meanwhile. The
        // writer's name is made by this program (hex and dashes): nothing from outside. Rolled
        // back: it wrote nothing, and so waits for no standby.
        let sql = format!(
            "BEGIN; SELECT 1 FROM manifest_lock FOR UPDATE; SELECT token FROM manifest_commits WHERE writer = '{writer}'; ROLLBACK"
        );
        let found = self.with(|conn, _| self.answer(conn, conn.client.simple_query(&sql)));
        if found.is_err() && !self.is_broken() {
            let _ = self.batch("ROLLBACK");
        }
        let rows: Vec<String> = found?
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        // The lock's row, then the token's, if this writer recorded one.
        Ok(rows.get(1).and_then(|t| t.parse::<i64>().ok()) == Some(token))
    }
}

/// A connection set up for the manifest: its schema first on the search path, a session that
/// sits idle inside a transaction ended by the server, and for a reader, transactions the
/// server keeps read-only.
fn open_conn(url: &str, read_only: bool) -> std::result::Result<Conn, String> {
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
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = ?1 AND tablename = 'schema_version'",
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
/// which the manifest's tables would be installed into (see [`super::ours`]).
fn refuse_foreign(s: &Session, shown: &str) -> Result<()> {
    let at = |e: PgError| Error::Pg(e).at(std::path::Path::new(shown));
    let rows = s
        .query(
            "SELECT c.relname FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = ?1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
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
            super::ours::holds(&tables)
        ),
    })
}

fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Opens the manifest's database for writing: creates its schema or migrates it as needed.
///
/// A migration runs in one transaction from the lock to the commit, tracked as the writer's
/// are: a connection lost in it (a server restarting during a first open) ends the attempt,
/// which the server rolls back whole, and the next attempt starts afresh on a new connection,
/// reading the version again. No statement of it ever runs outside its transaction.
pub fn open(url: &str, shown: &str) -> Result<Session> {
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
    s.in_tx.set(true);
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
pub fn open_read_only(url: &str, shown: &str) -> Result<Session> {
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

/// Rows as SQLite's values.
fn values_of(rows: &[tokio_postgres::Row]) -> PgResult<Vec<Vec<Value>>> {
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    r.try_get::<_, Read>(i)
                        .map(|c| c.0)
                        .map_err(|e| PgError::from(&e))
                })
                .collect()
        })
        .collect()
}

/// Values as a statement's parameters.
fn params_of(values: &[Value]) -> Vec<Param<'_>> {
    values.iter().map(Param).collect()
}

/// Parameters as the driver takes them.
fn refs<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// A value passed to PostgreSQL as the type the server asks for.
#[derive(Debug)]
struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let v = self.0;
        match (v, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Integer(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Integer(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            #[allow(clippy::cast_precision_loss)]
            (Value::Integer(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Value::Integer(i), t) if is_text(t) => i.to_string().as_str().to_sql(&Type::TEXT, out),
            (Value::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Value::Text(s), t) if is_text(t) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            (Value::Blob(b), &Type::BYTEA) => b.as_slice().to_sql(ty, out),
            (v, t) => Err(format!("cannot pass {:?} as PostgreSQL type {t}", v.data_type()).into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn is_text(t: &Type) -> bool {
    [
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::UNKNOWN,
    ]
    .contains(t)
}

/// A value read from PostgreSQL, as SQLite's type.
struct Read(Value);

impl<'a> FromSql<'a> for Read {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Read(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Blob(raw.to_vec()),
            ref t if is_text(t) => Value::Text(String::from_sql(&Type::TEXT, raw)?),
            ref t => return Err(format!("the manifest reads no PostgreSQL type {t}").into()),
        }))
    }

    fn from_sql_null(
        _: &Type,
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Read(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// `?N` parameters as `$N`, outside quoted text.
fn translate(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted && chars.peek().is_some_and(char::is_ascii_digit) => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_numbered_dollars_outside_quotes() {
        assert_eq!(
            translate("SELECT 1 FROM t WHERE a = ?1 AND b = '?2' AND c IN (?10, ?2)"),
            "SELECT 1 FROM t WHERE a = $1 AND b = '?2' AND c IN ($10, $2)"
        );
    }
}
