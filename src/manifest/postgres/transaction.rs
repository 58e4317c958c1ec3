//! The writer's transaction on PostgreSQL: begun with the writers' lock in one round trip,
//! committed with its deferred statements in another (or the two in one), rolled back, and
//! asked afterwards whether it committed.

use std::collections::HashMap;

use super::session::Session;
use super::{failure, latest};
use crate::pg::error::Result as PgResult;

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
    pub(super) fn end_tx(&self) {
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
