//! The warehouse's own record of publishes: the partition's row lock and the booking in
//! `backfill.partitions` and `backfill.publishes`, from which a publish whose reply was lost, or
//! whose owner died, is settled.

use super::*;
use crate::warehouse::backend::Booked;

/// Asks the manifest whether this publish may still commit: [`Error::Refused`] when not.
pub(super) fn ask(allowed: &Allowed<'_>) -> std::result::Result<(), Failure> {
    match allowed() {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Refused.into()),
        Err(why) => Err(Error::Message(format!("cannot read the manifest: {why}")).into()),
    }
}

/// Runs `make` when `there` (one boolean) says false. Several processes may run it at once: one
/// at a time, under the advisory lock `lock`, and only the first. One that found it needed
/// before another ran it looks again under the lock: its statements, even those that change
/// nothing (`ADD COLUMN IF NOT EXISTS`, `CREATE INDEX IF NOT EXISTS`), would wait for the locks
/// of every try that the tables the first one made already serve.
pub(super) fn create_once(
    c: &mut Conn,
    lock: i64,
    there: &str,
    make: &str,
) -> std::result::Result<(), Failure> {
    if c.wait(c.client.query_one(there, &[]))?.get::<_, bool>(0) {
        return Ok(());
    }
    c.wait(
        c.client
            .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({lock})")),
    )?;
    let made = (|| -> std::result::Result<(), tokio_postgres::Error> {
        if !c.wait(c.client.query_one(there, &[]))?.get::<_, bool>(0) {
            c.wait(c.client.batch_execute(make))?;
        }
        c.wait(c.client.batch_execute("COMMIT"))
    })();
    if let Err(e) = made {
        let _ = c.wait(c.client.batch_execute("ROLLBACK"));
        return Err(e.into());
    }
    Ok(())
}

/// Creates the bookkeeping tables when they do not exist (once per connection).
pub(super) fn book(c: &mut Conn) -> std::result::Result<(), Failure> {
    if c.booked {
        return Ok(());
    }
    const THERE: &str = "SELECT to_regclass('backfill.partitions') IS NOT NULL AND to_regclass('backfill.versions') IS NOT NULL \
         AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('backfill.publishes') \
           AND attname = 'judged' AND NOT attisdropped)";
    create_once(
        c,
        7262150318,
        THERE,
        "CREATE SCHEMA IF NOT EXISTS backfill; \
                     CREATE TABLE IF NOT EXISTS backfill.partitions ( \
                       target text NOT NULL, partition_start timestamptz NOT NULL, \
                       manifest text NOT NULL, try_id bigint NOT NULL, \
                       published_at timestamptz NOT NULL DEFAULT now(), \
                       PRIMARY KEY (target, partition_start)); \
                     CREATE TABLE IF NOT EXISTS backfill.publishes ( \
                       manifest text NOT NULL, try_id bigint NOT NULL, target text NOT NULL, \
                       partition_start timestamptz NOT NULL, partition_end timestamptz NOT NULL, \
                       rows bigint NOT NULL, fingerprint text, \
                       published_at timestamptz NOT NULL DEFAULT now(), \
                       PRIMARY KEY (manifest, try_id)); \
                     CREATE TABLE IF NOT EXISTS backfill.versions ( \
                       manifest text NOT NULL, target text NOT NULL, \
                       interval_start timestamptz NOT NULL, interval_end timestamptz NOT NULL, \
                       replaced_by bigint NOT NULL, version_of bigint, rows bigint NOT NULL, \
                       kept_at timestamptz NOT NULL DEFAULT now(), \
                       PRIMARY KEY (manifest, target, replaced_by)); \
                     CREATE INDEX IF NOT EXISTS versions_by_interval \
                       ON backfill.versions (manifest, target, interval_start, replaced_by); \
                     ALTER TABLE backfill.publishes ADD COLUMN IF NOT EXISTS judged text;",
    )?;
    c.booked = true;
    Ok(())
}

/// Takes the partition's row lock in `backfill.partitions` and books the publish in
/// `backfill.publishes`, in one statement of the publish transaction: a recoverer that holds the
/// same row lock sees the booking exactly when the publish committed.
pub(super) fn lock_and_book(
    c: &mut Conn,
    target: &str,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
    rows: i64,
    fingerprint: &str,
) -> std::result::Result<(), Failure> {
    let params = ["$1", "$2", "$3", "$4", "$5"].map(String::from);
    let stmt = prepared(
        c,
        &format!(
            "WITH {} SELECT 1",
            lock_and_book_ctes(&params, ["$6", "$7"], "lock")
        ),
        &[
            Type::TEXT,
            Type::TIMESTAMPTZ,
            Type::TEXT,
            Type::INT8,
            Type::TIMESTAMPTZ,
            Type::INT8,
            Type::TEXT,
        ],
    )?;
    c.wait(c.client.execute(
        &stmt,
        &[
            &target,
            &interval.start,
            &manifest,
            &try_id,
            &interval.end,
            &rows,
            &fingerprint,
        ],
    ))?;
    Ok(())
}

/// The CTEs `lock` (the partition's row in `backfill.partitions`, created or updated, so locked)
/// and `book` (the publish in `backfill.publishes`), given the SQL of the target, interval start,
/// manifest, try id and interval end, of the rows and fingerprint, and what `book` reads from.
pub(super) fn lock_and_book_ctes(params: &[String; 5], measured: [&str; 2], from: &str) -> String {
    let [target, start, manifest, try_id, end] = params;
    let [rows, fingerprint] = measured;
    format!(
        "lock AS (INSERT INTO backfill.partitions AS p (target, partition_start, manifest, try_id) \
           VALUES ({target}, {start}, {manifest}, {try_id}) ON CONFLICT (target, partition_start) DO UPDATE \
           SET manifest = EXCLUDED.manifest, try_id = EXCLUDED.try_id, published_at = now() RETURNING 1),\n\
         book AS (INSERT INTO backfill.publishes (manifest, try_id, target, partition_start, partition_end, rows, fingerprint) \
           SELECT {manifest}, {try_id}, {target}, {start}, {end}, {rows}, {fingerprint} FROM {from} RETURNING 1)"
    )
}

/// How a publish's `COMMIT` went: when it failed (the connection went, say), it may have
/// committed with its reply lost, and the booking says which, once the server has ended the
/// transaction either way (see [`settle_publish`]).
pub(super) fn settled(
    c: &Conn,
    committed: std::result::Result<(), tokio_postgres::Error>,
    task: &SqlTask,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
) -> std::result::Result<(), Failure> {
    match committed {
        Ok(()) => Ok(()),
        Err(e) => {
            // A statement before the COMMIT failed (its transaction is open, aborted, holding
            // the partition's row until it ends), or the COMMIT did.
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            match settle_publish(task, interval, manifest, try_id) {
                Ok(Some(_)) => Ok(()),
                _ => Err(e.into()),
            }
        }
    }
}

/// Whether the warehouse has its bookkeeping table of publishes: known without asking once this
/// connection has booked (see [`book`]).
pub(super) fn has_bookings(c: &Conn) -> std::result::Result<bool, tokio_postgres::Error> {
    if c.booked {
        return Ok(true);
    }
    Ok(c.wait(
        c.client
            .query_one("SELECT to_regclass('backfill.publishes') IS NOT NULL", &[]),
    )?
    .get(0))
}

/// After a crash: whether the publish of try `try_id` (recorded by manifest `manifest`)
/// committed, as it was booked. Judged under the partition's row lock, which a publish holds
/// from before it asks the manifest until it commits: an owner frozen in between is waited
/// for, and one that has not got there yet will be refused by the manifest.
pub(crate) fn settle_publish(
    task: &SqlTask,
    interval: DataInterval,
    manifest: &str,
    try_id: i64,
) -> Result<Option<Booked>> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let result = (|| -> std::result::Result<Option<Booked>, tokio_postgres::Error> {
        if !has_bookings(&c)? {
            return Ok(None);
        }
        // An owner that is publishing holds the partition's row (one it created, not yet
        // committed, or one it updated) until it commits or the server rolls it back; a frozen
        // owner's session is ended by the server once idle past twice the lease timeout. Both
        // statements wait for that, so "not committed" stays true once said.
        c.wait(
            c.client
                .batch_execute("BEGIN; SET LOCAL lock_timeout = '10min'"),
        )?;
        c.wait(c.client.execute(
            "INSERT INTO backfill.partitions (target, partition_start, manifest, try_id) \
             VALUES ($1, $2, '', 0) ON CONFLICT (target, partition_start) DO NOTHING",
            &[&task.target, &interval.start],
        ))?;
        c.wait(c.client.query(
            "SELECT 1 FROM backfill.partitions WHERE target = $1 AND partition_start = $2 FOR UPDATE",
            &[&task.target, &interval.start],
        ))?;
        let row = c.wait(c.client.query_opt(
            "SELECT rows, fingerprint, judged FROM backfill.publishes WHERE manifest = $1 AND try_id = $2 \
             AND target = $3 AND partition_start = $4",
            &[&manifest, &try_id, &task.target, &interval.start],
        ))?;
        c.wait(c.client.batch_execute("COMMIT"))?;
        Ok(row.map(|r| Booked {
            rows: r.get(0),
            fingerprint: r.get(1),
            judged: r.get(2),
        }))
    })();
    match result {
        Ok(found) => {
            conn::give(c);
            Ok(found)
        }
        Err(e) => {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            Err(pg(wh)(e))
        }
    }
}

/// How long a booking stays in `backfill.publishes` once its try's outcome is recorded: it is
/// needed only until then, and kept a while longer for whoever looks into a recovery.
pub(super) const KEEP_BOOKINGS: &str = "7 days";

/// Deletes this manifest's bookings older than [`KEEP_BOOKINGS`] of tries below `below` (all
/// recorded as ended, see `first_unfinished_try`), so that `backfill.publishes` does not grow
/// without end.
pub(crate) fn prune_bookings(w: &Warehouse, manifest: &str, below: i64) -> Result<u64> {
    let c = conn::take_at(w)?;
    let result = (|| -> std::result::Result<u64, tokio_postgres::Error> {
        if !has_bookings(&c)? {
            return Ok(0);
        }
        c.wait(c.client.execute(
            &format!(
                "DELETE FROM backfill.publishes WHERE manifest = $1 AND try_id < $2 \
                 AND published_at < now() - interval '{KEEP_BOOKINGS}'"
            ),
            &[&manifest, &below],
        ))
    })();
    conn::give(c);
    result.map_err(pg(w))
}
