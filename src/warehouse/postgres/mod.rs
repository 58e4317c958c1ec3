//! The PostgreSQL warehouse: write-audit-publish in one transaction per try.
//!
//! A try opens a REPEATABLE READ transaction, deletes the interval's rows of the target (a range
//! on the partition column that its index serves), then, in a statement of its own sent in the
//! same round trip, inserts the query's rows, measures them and counts the source: all from one
//! snapshot, and nothing is visible to readers until the commit. The gate judges; the runner
//! records its decision in the manifest; the publish then, still in the same transaction, takes
//! the row lock of the partition in `backfill.partitions`, asks the manifest whether this try
//! may still publish, books the publish in `backfill.publishes` (the manifest and try ids) and
//! commits. A rejected or stopped try rolls back; a crash before the commit is rolled back by
//! the server. Whether a publish committed is known after any crash from `backfill.publishes`,
//! read under the same row lock so that "not committed" stays true once said (see
//! [`settle_publish`]).
//!
//! Interval values are always bound, typed (`timestamptz`, `date`, `text`); the names spliced
//! into statements (target, columns) are quoted identifiers checked when the DAG was loaded.
//!
//! This file holds the [`Backend`] implementation; the rest, by what it does: `write` (a try's
//! transaction), `bookkeeping` (bookings and settling), `one_database` (a warehouse in the
//! manifest's database), `staging` (staged outputs and promote), `kept` (kept versions and
//! rollback; `versions` their tables), `merge` (`write = "merge"`: a try's, a promote's and a
//! rollback's merge by key), `compare` (published rows and diffs), `checks` (the dry
//! run), `sql` (names, values, statements, catalog), `fingerprint`, `errors`, `conn`
//! (connections) and `params` (the task's bind parameters).

mod batch;
mod bookkeeping;
mod checks;
mod compare;
pub(crate) mod conn;
mod errors;
mod fingerprint;
mod kept;
mod merge;
mod one_database;
pub(crate) use crate::params;
mod rules;
mod sql;
mod staging;
pub(crate) mod versions;
mod write;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use tokio_postgres::error::{ErrorPosition, SqlState};
use tokio_postgres::types::{ToSql, Type};

use self::conn::Conn;
use self::params::{Param, positional_from};
use super::backend::{Allowed, Backend, InManifest, Pending, PublishAs, Write};
use super::partition::Repr;
use super::{AuditMeasures, Binds, Cancel, Error, Result, TaskProblem, strip};
use crate::gate::SHOWN;
use crate::interval::DataInterval;
use crate::project::{Gate, SourceCount, SqlTask, Warehouse, WritePattern};

pub(crate) use self::bookkeeping::{prune_bookings, settle_publish};
pub(crate) use self::one_database::shares_database;
pub(crate) use self::staging::{
    is_staged_table, promote_group, staged, staged_table, sweep_staged,
};
use self::{
    bookkeeping::*, checks::*, compare::*, errors::*, fingerprint::*, kept::*, one_database::*,
    rules::*, sql::*, staging::*, write::*,
};
use crate::pg::{DATABASE_KEY, describe, quote_ident, quote_name};

/// How many times a try's transaction is redone after a serialization failure or a deadlock
/// that the server reported.
const RETRIES: u32 = 5;

/// The PostgreSQL backend.
pub(crate) struct Postgres;

impl Backend for Postgres {
    fn prepare(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        _window: DataInterval,
        _tz: chrono_tz::Tz,
    ) -> std::result::Result<Option<Repr>, TaskProblem> {
        check(task, gate)?;
        Ok(None)
    }

    fn check(&self, task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
        check(task, gate)
    }

    fn reachable(&self, w: &Warehouse) -> Result<()> {
        let c = conn::take_at(w)?;
        conn::give(c);
        Ok(())
    }

    fn write(&self, w: &Write<'_>, cancel: &Cancel) -> Result<Box<dyn Pending>> {
        write_try(w, cancel, None)
    }

    fn write_batch(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
        _: &Path,
        cancel: &Cancel,
    ) -> Result<Box<dyn super::backend::Batched>> {
        batch::write_batch(task, gate, intervals, tz, cancel)
    }

    fn sweep(&self, w: &Warehouse) {
        // A try's work is its transaction, which the server rolls back when its connection
        // ends: a crash leaves nothing in the warehouse but staged tables, which recovery
        // sweeps with the manifest's knowledge (see `sweep_staged`), and the tables of the
        // batches it was computing, which nobody needs once their lock is free.
        if let Err(e) = batch::sweep(w) {
            tracing::warn!(warehouse = %w.name, "cannot look for batch tables left by a crash: {e}");
        }
    }

    fn sweep_left(
        &self,
        w: &Warehouse,
        manifest: &str,
        keep: &dyn Fn(i64) -> bool,
        below: i64,
    ) -> Result<usize> {
        let removed = sweep_staged(w, manifest, keep)?;
        if let Err(e) = prune_bookings(w, manifest, below) {
            tracing::warn!(warehouse = %w.name, "cannot prune old bookings of publishes: {e}");
        }
        Ok(removed)
    }

    fn shares_manifest(&self, w: &Warehouse, manifest_key: &str) -> super::backend::Sharing {
        shares_database(w, manifest_key)
    }

    fn settle(
        &self,
        task: &SqlTask,
        interval: DataInterval,
        manifest: &str,
        try_id: i64,
    ) -> Result<super::backend::Settlement> {
        settle_publish(task, interval, manifest, try_id).map(super::backend::Settlement::Booked)
    }

    fn staged(
        &self,
        _: &SqlTask,
        location: &str,
        manifest: &str,
        try_id: i64,
    ) -> Option<Box<dyn Pending>> {
        is_staged_table(location).then(|| staged(location, manifest, try_id))
    }

    fn drop_staged(&self, task: &SqlTask, location: &str, _: &Path) -> Result<()> {
        drop_staged(&task.warehouse, location).map_err(|e| {
            Error::Message(format!("cannot drop the discarded staged table {location} (the next recovery drops it): {e}"))
        })
    }

    fn look(
        &self,
        task: &SqlTask,
        gate: &Gate,
        binds: &Binds,
        tz: chrono_tz::Tz,
    ) -> Result<(Option<i64>, Option<String>)> {
        look(task, Some(gate), binds, tz)
    }

    fn kept_version(
        &self,
        task: &SqlTask,
        manifest: &str,
        key: i64,
    ) -> Result<Option<(crate::warehouse::versions::Version, String)>> {
        kept_version(task, manifest, key)
    }

    fn roll_back(&self, r: &super::backend::RollBack<'_>, allowed: &Allowed<'_>) -> Result<i64> {
        roll_back(r, allowed)
    }

    fn holding(&self) -> super::backend::Holding {
        super::backend::Holding::OwnTransaction
    }

    fn partition_rows(
        &self,
        task: &SqlTask,
        _: Option<Repr>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
    ) -> Result<Vec<i64>> {
        compare::partition_rows(task, intervals, tz)
    }

    fn forget(
        &self,
        task: &SqlTask,
        manifest: &str,
        range: Option<(i64, i64)>,
        last_try: i64,
        dry: bool,
    ) -> Result<i64> {
        kept::forget(task, manifest, range, last_try, dry)
    }

    fn storage(&self, task: &SqlTask, manifest: &str) -> crate::warehouse::versions::Storage {
        storage(task, manifest).unwrap_or_else(|_| crate::warehouse::versions::Storage {
            target: task.target.clone(),
            ..Default::default()
        })
    }

    fn published(
        &self,
        task: &SqlTask,
        _: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<(i64, String)> {
        published(task, interval, tz, location)
    }

    fn diff_keys(
        &self,
        task: &SqlTask,
        key: &[String],
        _: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<Option<super::diff::KeyDiff>> {
        diff_keys(task, key, interval, tz, location)
    }
}

/// A try's transaction up to the gate (see [`write_measure`]), redone after a serialization
/// failure or a deadlock, and measured apart from the target when its constraint refused the
/// output; with `batch`, of the interval's share of a batch.
fn write_try(
    w: &Write<'_>,
    cancel: &Cancel,
    batch: Option<&FromBatch<'_>>,
) -> Result<Box<dyn Pending>> {
    let wh = &w.task.warehouse;
    let mut c = conn::take_at(wh)?;
    cancel.on_set(c.canceller())?;
    let mut attempt = 0;
    // The target's constraint refused the output: it is measured apart from the target.
    let mut refused: Option<String> = None;
    loop {
        match write_measure(&mut c, w, cancel, refused.as_deref(), batch) {
            Ok((measures, written)) => {
                return Ok(Box::new(Open {
                    conn: Some(c),
                    measures,
                    written,
                    manifest: w.manifest.to_string(),
                    try_id: w.try_id,
                    staged: w.stage.then(|| staged_table(w.manifest, w.try_id)),
                }));
            }
            Err(e) => {
                let _ = c.wait(c.client.batch_execute("ROLLBACK"));
                match e {
                    // Once: the pass apart from the target meets no constraint of it.
                    Failure::Pg(e)
                        if is_constraint(&e)
                            && refused.is_none()
                            && !w.stage
                            && !w.measure_only =>
                    {
                        tracing::info!(warehouse = %wh.name, target = %w.task.target, "{}; measuring the output apart from the target for the gate", describe(&e));
                        refused = Some(constraint_message(&e));
                    }
                    Failure::Pg(e) if is_retryable(&e) && attempt < RETRIES => {
                        attempt += 1;
                        tracing::info!(warehouse = %wh.name, target = %w.task.target, attempt, "{}; running the transaction again", describe(&e));
                        std::thread::sleep(std::time::Duration::from_millis(20 << attempt));
                    }
                    Failure::Pg(e) => {
                        conn::give(c);
                        return Err(pg(wh)(e));
                    }
                    Failure::Other(e) => {
                        conn::give(c);
                        return Err(e.at(wh));
                    }
                }
            }
        }
    }
}
