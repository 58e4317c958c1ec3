//! The writer's transaction on PostgreSQL: begun with the writers' lock in one round trip,
//! committed with its deferred statements in another (or the two in one), rolled back, and
//! asked afterwards whether it committed.

use std::collections::{BTreeSet, HashMap};

use rusqlite::types::Value;
use tokio_postgres::types::ToSql;

use super::deferrals::Rows;
use super::session::Session;
use super::state::{Fence, State};
use super::values::{Param, params_of, refs, values_of};
use super::{failure, latest, lost};
use crate::pg::error::{Error as PgError, Result as PgResult};

/// The writers' lock and the schema's version, the two statements of every writer's `BEGIN`
/// round trip (see [`Session::begin`]), `$1` the writer and `$2` its token. The lock is a
/// statement of its own: the reads after it must see what the writer before committed.
const LOCK_AND_TOKEN: &str = "WITH lock AS (SELECT 1 FROM manifest_lock FOR UPDATE)
    INSERT INTO manifest_commits (writer, token, at)
    SELECT $1, $2, CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) FROM lock
    ON CONFLICT (writer) DO UPDATE SET token = excluded.token, at = excluded.at
    RETURNING at";
const SCHEMA_VERSION: &str = "SELECT 'schema', max(version) FROM schema_version";

impl Session {
    /// Starts the writer's transaction: takes the writers' lock, records `token` as this
    /// writer's latest commit (see [`Session::committed`]) and reads the clock, in one round
    /// trip.
    pub(crate) fn begin(&self, writer: &str, token: i64) -> PgResult<()> {
        self.begin_after("", writer, token)
    }

    /// Commits the writer's transaction and starts the next one (see [`Session::begin`]) in
    /// one round trip: for a writer whose next jobs are already waiting. On an error, whether
    /// the commit happened is for [`Session::committed`] to say; no transaction is open then.
    pub(crate) fn commit_and_begin(&self, writer: &str, token: i64) -> PgResult<()> {
        // The failure may be the new transaction's (then rolled back), not the commit's.
        self.begin_after("COMMIT; ", writer, token)
    }

    /// [`Session::begin`], its statements after `before`.
    fn begin_after(&self, before: &str, writer: &str, token: i64) -> PgResult<()> {
        if before.is_empty() {
            // After a commit in the same round trip, the answers of its deferred statements are
            // kept for the writer to take.
            self.deferred.borrow_mut().forget_answers();
            self.prepare_begin()?;
        }
        self.transition(State::begin);
        let sql = begin_sql(
            before,
            writer,
            token,
            self.link.borrow().begin_prepared.get(),
            &self.fenced_before.borrow(),
        );
        // The deferred statements of the transaction it commits go first.
        let begun = self.flush_then(Some(&sql)).and_then(|messages| {
            // A deferred statement failed: the commit before was a rollback, and the
            // transaction begun after it ends here too.
            if let Some(e) = self.deferred_failure() {
                return Err(e);
            }
            read_begun(&messages)
        });
        match begun {
            Ok((now, read)) => {
                self.transition(|s| s.begun(now, read));
                Ok(())
            }
            Err(e) => {
                // The transaction may be open (and aborted, or holding the lock): it ends here.
                self.rollback();
                Err(e)
            }
        }
    }

    /// Prepares the two statements every transaction begins with, once per connection: they
    /// are sent as `EXECUTE` in the same query string, so that they are not parsed and planned
    /// again each time (planning them took twice as long as running them), and a failure still
    /// ends the statements after it. Prepared outside a transaction, by the first begin; should
    /// that fail, the connection is made again (a statement prepared before the failure would
    /// make the next attempt fail on its name).
    fn prepare_begin(&self) -> PgResult<()> {
        if self.link.borrow().begin_prepared.get() {
            return Ok(());
        }
        let prepare = format!(
            "PREPARE backfill_lock(text, bigint) AS {LOCK_AND_TOKEN};
             PREPARE backfill_schema AS {SCHEMA_VERSION}"
        );
        if let Err(e) =
            self.with(|link| self.answer(&link.conn, link.conn.client.batch_execute(&prepare)))
        {
            self.transition(State::lose);
            return Err(e);
        }
        // On the connection it was prepared on (made again by `with`, should it have been
        // lost).
        self.link.borrow().begin_prepared.set(true);
        Ok(())
    }

    /// Ends the transaction on this side: its deferred statements not sent are dropped, and
    /// the answers of those sent are kept until the next transaction begins.
    pub(super) fn end_tx(&self) {
        self.deferred.borrow_mut().drop_unsent();
        self.transition(State::end);
    }

    /// Commits the writer's transaction, its deferred statements sent first in the same round
    /// trip. When one of them failed, nothing was committed (the server ends a transaction
    /// that holds a failure with a rollback, which it reports for `COMMIT`): that failure is
    /// the error.
    pub(crate) fn commit(&self) -> PgResult<()> {
        let r = self.flush_then(Some("COMMIT")).map(|_| ());
        let r = match self.deferred_failure() {
            Some(e) if r.is_ok() => Err(e),
            _ => r,
        };
        self.end_tx();
        r
    }

    pub(crate) fn rollback(&self) {
        if !self.is_broken() {
            let _ = self
                .with(|link| self.answer(&link.conn, link.conn.client.batch_execute("ROLLBACK")));
        }
        self.end_tx();
    }

    /// Whether the transaction that recorded `token` for `writer` committed (asked after the
    /// connection was lost during its `COMMIT`).
    pub(crate) fn committed(&self, writer: &str, token: i64) -> PgResult<bool> {
        // Under the writers' lock: a commit still under way (slow, or waiting for a standby)
        // holds it, and is seen once it is done, never read as "not committed" meanwhile. The
        // writer's name is made by this program (hex and dashes): nothing from outside. Rolled
        // back: it wrote nothing, and so waits for no standby.
        let sql = format!(
            "BEGIN; SELECT 1 FROM manifest_lock FOR UPDATE; SELECT token FROM manifest_commits WHERE writer = '{writer}'; ROLLBACK"
        );
        let found = self.with(|link| self.answer(&link.conn, link.conn.client.simple_query(&sql)));
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

    /// Whether a statement asked for now may be deferred (see [`Session::defer`]): inside the
    /// writer's transaction.
    pub(crate) fn defers(&self) -> bool {
        self.in_tx()
    }

    /// Queues `sql` to be sent with the transaction's other deferred statements, in one round
    /// trip, when the writer asks for their answers ([`Session::flush`]) or before any statement
    /// that is not deferred; returns the ticket of its answer ([`Session::take_answer`]). The
    /// server runs the statements in the order they were asked for, and once one fails, every
    /// later one of the transaction fails too.
    pub(crate) fn defer(&self, sql: &str, values: Vec<Value>) -> usize {
        self.deferred.borrow_mut().push(sql, values)
    }

    /// Sends the deferred statements not sent yet, together, and waits for their answers
    /// (pipelined: one round trip, however many). A connection lost or silent meanwhile marks
    /// the session as such, and every statement unanswered has that error.
    pub(crate) fn flush(&self) -> PgResult<()> {
        if !self.deferred.borrow().has_unsent() {
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
    pub(super) fn flush_then(
        &self,
        last: Option<&str>,
    ) -> PgResult<Vec<tokio_postgres::SimpleQueryMessage>> {
        let unsent = self.deferred.borrow_mut().take_unsent();
        for u in &unsent {
            self.written(&u.sql);
        }
        let mut answered: Vec<PgResult<Rows>> = Vec::new();
        let sent = self.with(|link| {
            let conn = &link.conn;
            let statements = unsent
                .iter()
                .map(|u| self.statement(link, &u.sql))
                .collect::<PgResult<Vec<_>>>()?;
            let params: Vec<Vec<Param<'_>>> = unsent.iter().map(|u| params_of(&u.values)).collect();
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
            answered = rows
                .into_iter()
                .zip(&unsent)
                .map(|(r, u)| {
                    // The server's error (a value this side could not send never reached it).
                    let by_server = r.as_ref().is_err_and(|e| e.code().is_some());
                    let rows = r.map_err(|e| PgError::from(&e));
                    // The server's refusals, not this side's failures to read a row: the
                    // first (in the order sent) is why the transaction cannot commit.
                    if let Err(e) = &rows
                        && by_server
                    {
                        self.deferred.borrow_mut().refuse(u.ticket, e);
                    }
                    rows.and_then(|rows| values_of(&rows))
                })
                .collect();
            if last.is_some()
                && !unsent.is_empty()
                && messages.is_ok()
                && crate::fault::point("manifest-answers-lost")
            {
                // The server committed, and the connection is lost before the answers arrive.
                self.transition(State::lose);
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
        self.deferred
            .borrow_mut()
            .answered(&unsent, answered, sent.as_ref().err());
        sent
    }

    /// The server's refusal of one of the transaction's deferred statements, the first in the
    /// order they were sent.
    pub(super) fn deferred_failure(&self) -> Option<PgError> {
        self.deferred.borrow().refusal()
    }

    /// Whether the last commit did not happen because the server refused one of its deferred
    /// statements (asked once): then one of the jobs is to blame, and the others run again.
    pub(crate) fn refused_commit(&self) -> bool {
        self.deferred.borrow_mut().take_refusal()
    }

    /// The answer of a deferred statement (see [`Session::defer`]), once: sent first if it was
    /// not.
    pub(crate) fn take_answer(&self, ticket: usize) -> PgResult<Rows> {
        // A failure to send is each statement's answer.
        let _ = self.flush();
        self.deferred.borrow_mut().take_answer(ticket)
    }
}

/// The query string that begins a writer's transaction, after `before` (a `COMMIT`, or
/// nothing): `BEGIN`, the writers' lock with `writer`'s `token` (as `EXECUTE` when `prepared`),
/// the schema's version, and the fences read before (`fenced_before`: backfills' ids, workers'
/// negated) read again under the new lock, in the same round trip: an owner's first write of
/// the transaction then needs no read of its own.
fn begin_sql(
    before: &str,
    writer: &str,
    token: i64,
    prepared: bool,
    fenced_before: &BTreeSet<i64>,
) -> String {
    let (backfills, workers): (Vec<i64>, Vec<i64>) = fenced_before.iter().partition(|k| **k > 0);
    let list = |ids: &[i64]| {
        ids.iter()
            .map(|k| k.abs().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Every value is made here (hex and numbers): nothing from outside is spliced in.
    let mut sql = if prepared {
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
    sql
}

/// What the `BEGIN` round trip read (see [`begin_sql`]): the transaction's clock, and the
/// fences read again. Refused when the lock's row is missing, or when the schema is no longer
/// this binary's.
fn read_begun(
    messages: &[tokio_postgres::SimpleQueryMessage],
) -> PgResult<(i64, HashMap<i64, Fence>)> {
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
            if schema > latest() {
                "newer"
            } else {
                "different"
            }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_begins_with_the_lock_the_schema_and_the_fences_read_before() {
        let before = BTreeSet::from([-3, 1, 2]);
        assert_eq!(
            begin_sql("COMMIT; ", "ab-1", 5, true, &before),
            "COMMIT; BEGIN; EXECUTE backfill_lock('ab-1', 5); EXECUTE backfill_schema; \
             SELECT id, epoch, state FROM backfills WHERE id IN (1, 2); \
             SELECT -id, epoch, state FROM workers WHERE id IN (3)"
        );
        assert_eq!(
            begin_sql("", "ab-1", 5, true, &BTreeSet::new()),
            "BEGIN; EXECUTE backfill_lock('ab-1', 5); EXECUTE backfill_schema"
        );
    }

    #[test]
    fn a_transaction_begun_before_its_statements_were_prepared_spells_them_out() {
        let sql = begin_sql("COMMIT; ", "ab-1", 5, false, &BTreeSet::from([4]));
        assert!(
            sql.starts_with("COMMIT; BEGIN; WITH lock AS (SELECT 1 FROM manifest_lock FOR UPDATE)"),
            "{sql}"
        );
        assert!(sql.contains("SELECT 'ab-1', 5, CAST("), "{sql}");
        assert!(!sql.contains('$') && !sql.contains("EXECUTE"), "{sql}");
        assert!(
            sql.ends_with(&format!(
                "RETURNING at; {SCHEMA_VERSION}; SELECT id, epoch, state FROM backfills WHERE id IN (4)"
            )),
            "{sql}"
        );
    }
}
