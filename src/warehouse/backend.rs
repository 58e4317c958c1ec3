//! The seam between a SQL try and its warehouse: what write-audit-publish needs, whatever
//! database holds the tables.
//!
//! A try [`Backend::write`]s the interval's output where readers cannot see it yet and measures
//! it; the result is a [`Pending`] output that the gate judges (a pure function, see
//! [`crate::gate`]). The runner records its decision in the manifest, then the pending output is
//! [`Pending::publish`]ed, in one transaction that asks the manifest whether this publish is
//! still allowed, or dropped. On SQLite the pending output is an audit file (see
//! [`super::audit`]); on PostgreSQL it is the try's own open transaction (see
//! [`super::postgres`]).

use std::path::{Path, PathBuf};

use super::partition::Repr;
use super::{AuditFile, AuditMeasures, Binds, Cancel, Error, Result, TaskProblem, audit, publish};
use crate::interval::DataInterval;
use crate::project::{Gate, SqlTask, Warehouse};

/// Whether a warehouse is in the manifest's own database (see [`Backend::shares_manifest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// In a database of its own: a publish is recorded in the manifest after it commits.
    Apart,
    /// In the manifest's database, its user allowed to write the manifest's record of a
    /// publish: the publish's transaction records it.
    Shared,
    /// In the manifest's database, but its user may not write the manifest's record: as
    /// [`Sharing::Apart`], which the run says (see [`Sharing::warning`]).
    SharedReadOnly,
}

impl Sharing {
    /// What a run says of warehouse `name` before its first try, when it says anything.
    pub(crate) fn warning(self, name: &str) -> Option<String> {
        (self == Self::SharedReadOnly).then(|| format!(
            "warehouse `{name}` is in the manifest's database, but its user may not write the manifest's tables (backfill_manifest.task_tries and .published: SELECT, INSERT, UPDATE; EXECUTE on backfill_manifest.publish_refused): its publishes are recorded in the manifest after they commit, as with any other warehouse"
        ))
    }
}

/// Where a try's work runs and where its output waits for the gate (see [`Backend::holding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Computed in this process into an audit file, and published from it after the gate: a
    /// crash is settled from the file, so the intent to publish is recorded once the output is
    /// measured and judged.
    AuditFile,
    /// Computed by the warehouse's server inside the try's own transaction, which publishes it
    /// and books the publish: a crash is settled from that booking, so the intent may be
    /// recorded before the output is measured; the try waits for the server on a thread of its
    /// own.
    OwnTransaction,
}

/// How a publish that its owner left unfinished is settled (see [`Backend::settle`]).
#[derive(Debug)]
pub(crate) enum Settlement {
    /// The publish was the owner's own transaction, which booked it: it committed (what it
    /// booked), or the server rolled it back when the owner's connection ended (`None`).
    Booked(Option<Booked>),
    /// The warehouse books nothing: the publish is finished from the try's audit file, in a
    /// transaction that asks the manifest whether it still stands.
    FromAudit,
}

/// What a warehouse that books its publishes booked of one: its rows and fingerprint, and the
/// try's judged record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Booked {
    pub rows: i64,
    pub fingerprint: Option<String>,
    /// The try's judged record as JSON (see [`PublishAs::judged`]).
    pub judged: Option<String>,
}

/// What one try writes.
pub(crate) struct Write<'a> {
    pub task: &'a SqlTask,
    pub gate: Option<&'a Gate>,
    pub binds: &'a Binds,
    pub tz: chrono_tz::Tz,
    /// The partition column's representation when known (SQLite; `None` elsewhere).
    pub repr: Option<Repr>,
    /// Where a backend that keeps the output in a file keeps it (SQLite's audit file).
    pub audit_path: &'a Path,
    /// The try, and the manifest that records it: a backend that books its publishes in the
    /// warehouse itself names them by both.
    pub try_id: i64,
    pub manifest: &'a str,
    /// Keep the output for `backfill promote` rather than publish it.
    pub stage: bool,
    /// Only measure (`backfill verify`): the output is never published, so nothing is kept for
    /// rollback and no bookkeeping is created.
    pub measure_only: bool,
    /// The manifest's lease timeout: a warehouse that holds a try's work in an open
    /// transaction lets the server end that transaction once it has been idle for twice this
    /// (at least 5 s), so that an owner frozen mid-try cannot hold the partition's rows locked
    /// past its takeover.
    pub lease_timeout: std::time::Duration,
}

/// How to publish a pending output.
pub(crate) struct PublishAs<'a> {
    pub task: &'a SqlTask,
    pub interval: DataInterval,
    pub tz: chrono_tz::Tz,
    pub repr: Option<Repr>,
    /// Publish an explicit empty partition instead of the output.
    pub empty: bool,
    /// The fingerprint the gate saw, checked again before a staged output is published.
    pub expect_fingerprint: Option<&'a str>,
    /// Keep the rows being replaced, for rollback.
    pub keep: Option<super::versions::Keep>,
    /// With `unique_key_scope = "table"`: the key, checked again against the other partitions
    /// when a staged output is promoted.
    pub table_keys: Option<&'a [String]>,
    /// The try's judged record (source rows and fingerprint, verdict, reasons, the rows
    /// compared with) as JSON: a warehouse that books its publishes keeps it with the booking,
    /// for the recovery of a publish that committed before the manifest recorded it.
    pub judged: Option<&'a str>,
    /// The manifest's record of this publish, committed in the publish's own transaction:
    /// given only when the warehouse is in the manifest's own database (PostgreSQL, see
    /// [`super::postgres::shares_database`]).
    pub in_manifest: Option<&'a InManifest>,
    /// What the gate judged that a merge does: the publish must do exactly that.
    pub planned: Option<crate::gate::Merge>,
}

/// The manifest's record of a try's publish, written by the publish's own transaction when the
/// warehouse is in the manifest's database. The runner, which sees both, gives the statement
/// and its values; the warehouse runs it as the last statement before its commit, with the
/// parameters `$1` try id, `$2` rows published, `$3` fingerprint, `$4` source rows, `$5` rows
/// compared with, `$6` verdict, `$7` reasons, `$8` source fingerprint, `$9` DAG, `$10` task,
/// `$11` and `$12` the interval's start and end (Unix seconds), `$13` the staged try promoted.
pub(crate) struct InManifest {
    pub statement: &'static str,
    /// The SQLSTATE the statement raises when the try may no longer publish.
    pub refused: &'static str,
    pub fingerprint: Option<String>,
    pub source_rows: Option<i64>,
    pub previous_rows: Option<i64>,
    pub verdict: Option<String>,
    pub reasons: Option<String>,
    pub source_fingerprint: Option<String>,
    pub dag_id: String,
    pub task_id: String,
    pub promoted_from: Option<i64>,
    /// A merge's rows inserted, updated, deleted and unchanged.
    pub merged: [Option<i64>; 4],
}

/// A rollback of one task's interval.
pub(crate) struct RollBack<'a> {
    pub task: &'a SqlTask,
    pub repr: Option<Repr>,
    pub interval: DataInterval,
    pub tz: chrono_tz::Tz,
    /// The publish whose replaced rows go back.
    pub key: i64,
    pub manifest: &'a str,
    pub try_id: i64,
    pub fingerprint: &'a str,
    /// The manifest's record of the rollback, committed with it (see [`PublishAs::in_manifest`]).
    pub in_manifest: Option<&'a InManifest>,
}

pub(crate) use super::Allowed;

/// A written, measured output that nobody reads yet.
pub(crate) trait Pending: Send {
    fn measures(&self) -> &AuditMeasures;

    /// The file that holds the output, recorded with the decision to publish so that a
    /// recoverer can finish the publish; `None` when the warehouse itself knows after a crash
    /// whether the publish committed.
    fn file(&self) -> Option<&Path>;

    /// Publishes: the rows inserted. `allowed` runs inside the transaction; when it says no,
    /// nothing changes and the result is [`Error::Refused`]. `waiting` is called when another
    /// writer holds a lock the publish waits for.
    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        waiting: &mut dyn FnMut(),
    ) -> Result<i64>;

    /// What merging this output into its partition as the partition is now would do
    /// (`write = "merge"`), counted without writing: a staged output is judged again by
    /// `max_changed` when it is promoted. `None` when the task replaces its partition.
    fn plan_merge(&mut self, p: &PublishAs<'_>) -> Result<Option<crate::gate::Merge>> {
        let _ = p;
        Ok(None)
    }

    /// What the last publish's merge did (`write = "merge"`), when it was not judged before
    /// (a staged output, merged into the partition as it is when it is promoted).
    fn merged(&self) -> Option<crate::gate::Merge> {
        None
    }

    /// Itself, as a publish of several outputs at once takes it ([`super::publish_group`]); `None`
    /// when its warehouse publishes outputs one at a time only.
    fn member(&mut self) -> Option<Member<'_>> {
        None
    }

    /// Done with it: after a publish, after a rejection, or to give it up.
    fn remove(self: Box<Self>);

    /// Leaves what the output is kept in for whoever finishes or settles its publish (an audit
    /// file whose publish intent is recorded); a transaction is rolled back.
    fn keep(self: Box<Self>);

    /// Keeps the output for `backfill promote`, durably: where it is kept.
    fn stage(self: Box<Self>) -> Result<PathBuf>;
}

/// A pending output, as a publish of several at once ([`super::publish_group`]) takes it.
pub(crate) enum Member<'a> {
    /// SQLite: its audit file.
    Audited(&'a mut Audited),
    /// PostgreSQL: a staged table, promoted as `try_id` of `manifest`; `merged` is set to what
    /// its merge did.
    Staged {
        table: &'a str,
        manifest: &'a str,
        try_id: i64,
        merged: &'a mut Option<crate::gate::Merge>,
    },
}

/// A batch's rows, computed by one query for several consecutive intervals (see
/// [`Backend::write_batch`]), from which each interval takes its share.
pub(crate) trait Batched: Send + Sync {
    /// Writes and measures the share of the batch's interval `k` as [`Backend::write`] writes
    /// and measures an interval's own output: a pending output of its own, judged, published
    /// or dropped on its own.
    fn share(&self, w: &Write<'_>, k: usize, cancel: &Cancel) -> Result<Box<dyn Pending>>;
}

/// What a kind of warehouse does for SQL tasks.
pub(crate) trait Backend: Sync {
    /// Checks a task before anything runs (its statements prepare exactly as they will run,
    /// its columns fit the target) and decides the partition column's representation over the
    /// backfill's window, where the warehouse needs one.
    fn prepare(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        window: DataInterval,
        tz: chrono_tz::Tz,
    ) -> std::result::Result<Option<Repr>, TaskProblem>;

    /// Checks a task's statements against the warehouse ([`Backend::prepare`] without the
    /// representation), for `dags validate`.
    fn check(&self, task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem>;

    /// Whether the warehouse can be opened (created from its init files when it is SQLite's
    /// and missing).
    fn reachable(&self, w: &Warehouse) -> Result<()>;

    /// Writes and measures one interval's output. `cancel` interrupts it.
    fn write(&self, w: &Write<'_>, cancel: &Cancel) -> Result<Box<dyn Pending>>;

    /// Computes the rows of a batch of consecutive `intervals` (in any order) with one query
    /// over their whole range, and runs the gate's source queries for each from the same
    /// snapshot. `audit_dir` holds what the batch is kept in until every interval took its
    /// share. `cancel` interrupts it.
    fn write_batch(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
        audit_dir: &Path,
        cancel: &Cancel,
    ) -> Result<Box<dyn Batched>> {
        let _ = (task, gate, intervals, tz, audit_dir, cancel);
        Err(Error::Message(
            "this warehouse runs no batches; remove `batch_size`".into(),
        ))
    }

    /// Removes what crashed commands left in the warehouse that nobody needs.
    fn sweep(&self, w: &Warehouse);

    /// Removes what the tries of manifest `manifest` that died left in the warehouse, with
    /// the manifest's knowledge: the staged outputs `keep` does not claim, and the bookings of
    /// publishes by tries below `below` (all of them ended). How many staged outputs went.
    /// Nothing for a warehouse that keeps staged outputs in files (recovery sweeps those).
    fn sweep_left(
        &self,
        w: &Warehouse,
        manifest: &str,
        keep: &dyn Fn(i64) -> bool,
        below: i64,
    ) -> Result<usize> {
        let _ = (w, manifest, keep, below);
        Ok(0)
    }

    /// Whether the warehouse is in the manifest's own database, whose key is `manifest_key`
    /// (see `manifest::database_key`), where a publish and its record commit together.
    fn shares_manifest(&self, w: &Warehouse, manifest_key: &str) -> Sharing {
        let _ = (w, manifest_key);
        Sharing::Apart
    }

    /// How the publish of try `try_id` (of manifest `manifest`), which its owner left
    /// unfinished, is settled: by what the warehouse booked in the publish transaction, or,
    /// for a warehouse that books nothing, from the try's audit file.
    fn settle(
        &self,
        task: &SqlTask,
        interval: DataInterval,
        manifest: &str,
        try_id: i64,
    ) -> Result<Settlement> {
        let _ = (task, interval, manifest, try_id);
        Ok(Settlement::FromAudit)
    }

    /// The output staged at `location` (as [`Pending::stage`] said), reopened to promote it as
    /// try `try_id` of manifest `manifest`; `None` when it is gone.
    fn staged(
        &self,
        task: &SqlTask,
        location: &str,
        manifest: &str,
        try_id: i64,
    ) -> Option<Box<dyn Pending>>;

    /// Removes a discarded staged output.
    fn drop_staged(&self, task: &SqlTask, location: &str, audit_dir: &Path) -> Result<()>;

    /// The interval's rows of the target now and their fingerprint, over the columns of the
    /// staged output at `location`.
    fn published(
        &self,
        task: &SqlTask,
        repr: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<(i64, String)>;

    /// How many rows the target holds in each interval now (read only).
    fn partition_rows(
        &self,
        task: &SqlTask,
        repr: Option<Repr>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
    ) -> Result<Vec<i64>>;

    /// The gate's `source_count` and `source_fingerprint` queries now, from one snapshot.
    fn look(
        &self,
        task: &SqlTask,
        gate: &Gate,
        binds: &Binds,
        tz: chrono_tz::Tz,
    ) -> Result<(Option<i64>, Option<String>)>;

    /// The version kept for the publish of try `key` (of manifest `manifest`), with the
    /// fingerprint of its rows over the query's columns; `None` when none is kept.
    fn kept_version(
        &self,
        task: &SqlTask,
        manifest: &str,
        key: i64,
    ) -> Result<Option<(super::versions::Version, String)>>;

    /// Puts back the version kept for the publish of `key` in one transaction that `allowed`
    /// must allow, as try `try_id` (whose fingerprint is `fingerprint`): the rows put back.
    fn roll_back(&self, r: &RollBack<'_>, allowed: &Allowed<'_>) -> Result<i64>;

    /// What the kept versions of a task's target cost (read only; nothing when none exist).
    fn storage(&self, task: &SqlTask, manifest: &str) -> super::versions::Storage;

    /// `backfill forget`: removes what the warehouse keeps for manifest `manifest` of the
    /// target's intervals starting within `range` (unix seconds, both included; `None`: every
    /// interval) and published by its tries up to `last_try`: kept versions, and the
    /// bookkeeping of their publishes. The kept table goes once it keeps nothing. With `dry`,
    /// only counts. Returns how many kept versions went (or would).
    fn forget(
        &self,
        task: &SqlTask,
        manifest: &str,
        range: Option<(i64, i64)>,
        last_try: i64,
        dry: bool,
    ) -> Result<i64>;

    /// Where a try's work runs and where its output waits for the gate.
    fn holding(&self) -> Holding {
        Holding::AuditFile
    }

    /// What promoting the staged output at `location` would change, by the key `key`; `None`
    /// when the staged output is gone.
    fn diff_keys(
        &self,
        task: &SqlTask,
        key: &[String],
        repr: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<Option<super::diff::KeyDiff>>;
}

/// The SQLite warehouse: audit files attached to a connection (see [`super::audit`]).
pub(crate) struct Sqlite;

impl Backend for Sqlite {
    fn prepare(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        window: DataInterval,
        tz: chrono_tz::Tz,
    ) -> std::result::Result<Option<Repr>, TaskProblem> {
        let problem = |key| {
            move |message: String| TaskProblem {
                key,
                offset: None,
                message,
                rule: None,
            }
        };
        let conn =
            super::open_to_read(&task.warehouse).map_err(|e| problem("sql")(e.to_string()))?;
        super::check_task_keys(&conn, task, gate)?;
        super::decide_repr(&conn, task, window, tz).map_err(problem("target"))
    }

    fn check(&self, task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
        let conn = super::open(&task.warehouse).map_err(|e| TaskProblem {
            key: "sql",
            offset: None,
            message: e.to_string(),
            rule: None,
        })?;
        super::check_task_keys(&conn, task, gate)
    }

    fn reachable(&self, w: &Warehouse) -> Result<()> {
        super::open(w).map(drop)
    }

    fn write(&self, w: &Write<'_>, cancel: &Cancel) -> Result<Box<dyn Pending>> {
        audited(w, cancel, |conn| {
            audit::write_and_measure(
                conn,
                w.task,
                w.gate,
                w.repr,
                w.binds,
                w.tz,
                Some(cancel.flag()),
            )
        })
    }

    fn write_batch(
        &self,
        task: &SqlTask,
        gate: Option<&Gate>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
        audit_dir: &Path,
        cancel: &Cancel,
    ) -> Result<Box<dyn Batched>> {
        let Some(span) = DataInterval::span(intervals) else {
            return Err(Error::Message("a batch of no intervals".into()));
        };
        let whole = Binds::new(span, tz);
        let parts: Vec<Binds> = intervals.iter().map(|i| Binds::new(*i, tz)).collect();
        let file = AuditFile::create(audit_dir, &audit::batch_file())?;
        let looked = (|| -> Result<_> {
            let conn = super::pool::take(&task.warehouse)?;
            let handle = conn.get_interrupt_handle();
            cancel.on_set(Box::new(move || handle.interrupt()))?;
            let looked = file.attach_batch(&conn).and_then(|()| {
                audit::write_batch(&conn, task, gate, &whole, &parts, tz, Some(cancel.flag()))
            });
            audit::detach_batch(&conn);
            looked.map_err(|e| audit::fault_of(e, "batch file", &file.path))
        })();
        match looked {
            Ok(looked) => Ok(Box::new(SqliteBatch {
                file: Some(file),
                looked,
            })),
            Err(e) => {
                file.remove();
                Err(e.at(&task.warehouse))
            }
        }
    }

    fn sweep(&self, w: &Warehouse) {
        super::init::remove_abandoned(&w.path);
    }

    fn staged(&self, _: &SqlTask, location: &str, _: &str, _: i64) -> Option<Box<dyn Pending>> {
        AuditFile::existing(Path::new(location))
            .map(|file| Box::new(Audited::staged(file)) as Box<dyn Pending>)
    }

    fn drop_staged(&self, _: &SqlTask, location: &str, audit_dir: &Path) -> Result<()> {
        // Only files of the audit folder: a command task's result file stays with its logs.
        let file = Path::new(location);
        if file.starts_with(audit_dir) {
            let _ = std::fs::remove_file(file);
        }
        Ok(())
    }

    fn look(
        &self,
        task: &SqlTask,
        gate: &Gate,
        binds: &Binds,
        _: chrono_tz::Tz,
    ) -> Result<(Option<i64>, Option<String>)> {
        let conn = super::open_to_read(&task.warehouse)?;
        // One read snapshot for both.
        conn.execute_batch("BEGIN")?;
        let seen = audit::look(&conn, Some(gate), binds).map(|l| (l.source, l.source_fingerprint));
        let _ = conn.execute_batch("COMMIT");
        seen.map_err(|e| e.at(&task.warehouse))
    }

    fn kept_version(
        &self,
        task: &SqlTask,
        _: &str,
        key: i64,
    ) -> Result<Option<(super::versions::Version, String)>> {
        let conn = super::pool::take(&task.warehouse)?;
        match super::versions::find(&conn, &task.target, key)? {
            Some(v) => Ok(Some((v, super::versions::fingerprint(&conn, task, key)?.1))),
            None => Ok(None),
        }
    }

    fn roll_back(&self, r: &RollBack<'_>, allowed: &Allowed<'_>) -> Result<i64> {
        let conn = super::pool::take(&r.task.warehouse)?;
        publish::roll_back(&conn, r.task, r.repr, r.interval, r.tz, r.key, allowed)
    }

    fn partition_rows(
        &self,
        task: &SqlTask,
        repr: Option<Repr>,
        intervals: &[DataInterval],
        tz: chrono_tz::Tz,
    ) -> Result<Vec<i64>> {
        let conn = super::open_to_read(&task.warehouse)?;
        super::diff::partition_rows(&conn, task, repr, intervals, tz)
            .map_err(|e| e.at(&task.warehouse))
    }

    fn forget(
        &self,
        task: &SqlTask,
        _: &str,
        range: Option<(i64, i64)>,
        last_try: i64,
        dry: bool,
    ) -> Result<i64> {
        // A warehouse that does not exist keeps nothing, and is not created to say so.
        if !task.warehouse.path.exists() {
            return Ok(0);
        }
        let conn = super::pool::take(&task.warehouse)?;
        super::versions::forget(&conn, &task.target, range, last_try, dry)
            .map_err(|e| e.at(&task.warehouse))
    }

    fn storage(&self, task: &SqlTask, _: &str) -> super::versions::Storage {
        // Read without creating or changing a warehouse: one that does not exist keeps nothing.
        rusqlite::Connection::open_with_flags(
            &task.warehouse.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ok()
        .and_then(|conn| {
            let _ = conn.busy_timeout(std::time::Duration::from_secs(5));
            super::versions::storage(&conn, &task.target).ok()
        })
        .unwrap_or_else(|| super::versions::Storage {
            target: task.target.clone(),
            ..Default::default()
        })
    }

    fn published(
        &self,
        task: &SqlTask,
        repr: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        _: &str,
    ) -> Result<(i64, String)> {
        let conn = super::open_to_read(&task.warehouse)?;
        super::diff::published(&conn, task, repr, interval, tz).map_err(|e| e.at(&task.warehouse))
    }

    fn diff_keys(
        &self,
        task: &SqlTask,
        key: &[String],
        repr: Option<Repr>,
        interval: DataInterval,
        tz: chrono_tz::Tz,
        location: &str,
    ) -> Result<Option<super::diff::KeyDiff>> {
        let file = Path::new(location);
        if !file.is_file() {
            return Ok(None);
        }
        let conn = super::open_to_read(&task.warehouse)?;
        super::diff::keys(&conn, task, key, repr, interval, tz, file)
            .map(Some)
            .map_err(|e| e.at(&task.warehouse))
    }
}

/// A SQLite try's output: its audit file.
/// Writes a try's output into a new audit file at `w.audit_path` with `write`, on a warehouse
/// connection that has the file attached as `audit` and that `cancel` interrupts: the audited
/// output, or the error (the file removed).
fn audited(
    w: &Write<'_>,
    cancel: &Cancel,
    write: impl FnOnce(&rusqlite::Connection) -> Result<AuditMeasures>,
) -> Result<Box<dyn Pending>> {
    let dir = w.audit_path.parent().unwrap_or_else(|| Path::new("."));
    let name = w
        .audit_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = AuditFile::create(dir, &name)?;
    let measured = (|| -> Result<_> {
        let conn = super::pool::take(&w.task.warehouse)?;
        let handle = conn.get_interrupt_handle();
        cancel.on_set(Box::new(move || handle.interrupt()))?;
        // What fails for want of space, memory or descriptors here is the audit file's: the
        // warehouse is only read.
        let written = file.attach(&conn).and_then(|()| write(&conn));
        audit::detach(&conn);
        written.map_err(|e| audit::fault_of(e, "audit file", &file.path))
    })();
    match measured {
        Ok(measures) => Ok(Box::new(Audited {
            file,
            measures,
            merged: None,
        })),
        Err(e) => {
            file.remove();
            Err(e.at(&w.task.warehouse))
        }
    }
}

/// A batch on SQLite: its rows in a batch file of the audit folder, locked while this process
/// holds it and removed once dropped; what the source queries gave each interval.
struct SqliteBatch {
    file: Option<AuditFile>,
    looked: Vec<audit::Looked>,
}

impl Batched for SqliteBatch {
    fn share(&self, w: &Write<'_>, k: usize, cancel: &Cancel) -> Result<Box<dyn Pending>> {
        let (Some(batch), Some(looked)) = (&self.file, self.looked.get(k)) else {
            return Err(Error::Message(format!("the batch has no interval {k}")));
        };
        audited(w, cancel, |conn| {
            batch.attach_batch(conn)?;
            let m = audit::write_share(
                conn,
                w.task,
                w.gate,
                w.repr,
                w.binds,
                w.tz,
                k,
                looked.clone(),
            );
            audit::detach_batch(conn);
            m
        })
    }
}

impl Drop for SqliteBatch {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            file.remove();
        }
    }
}

pub(crate) struct Audited {
    pub file: AuditFile,
    pub measures: AuditMeasures,
    /// What the last publish's merge did.
    pub merged: Option<crate::gate::Merge>,
}

impl Audited {
    /// The SQLite publish of this audit file, as `p` asks for it.
    pub(crate) fn publish_as<'a>(&'a self, p: &PublishAs<'a>) -> publish::Publish<'a> {
        publish::Publish {
            task: p.task,
            interval: p.interval,
            tz: p.tz,
            repr: p.repr,
            audit: (!p.empty).then_some(&self.file),
            expect_fingerprint: p.expect_fingerprint,
            keep: p.keep,
            planned: p.planned,
            merged: std::cell::Cell::default(),
            rows_in: None,
        }
    }

    /// A staged output's file, to promote; its measures are the staged record's.
    pub(crate) fn staged(file: AuditFile) -> Self {
        Self {
            file,
            measures: AuditMeasures::default(),
            merged: None,
        }
    }
}

impl Pending for Audited {
    fn measures(&self) -> &AuditMeasures {
        &self.measures
    }

    fn file(&self) -> Option<&Path> {
        Some(&self.file.path)
    }

    fn merged(&self) -> Option<crate::gate::Merge> {
        self.merged
    }

    fn member(&mut self) -> Option<Member<'_>> {
        Some(Member::Audited(self))
    }

    fn plan_merge(&mut self, p: &PublishAs<'_>) -> Result<Option<crate::gate::Merge>> {
        let crate::project::WritePattern::Merge { key, keep_missing } = &p.task.write else {
            return Ok(None);
        };
        let conn = super::pool::take(&p.task.warehouse)?;
        self.file.attach(&conn)?;
        let planned = (|| {
            let columns = super::table_columns(&conn, "audit", "rows")?;
            let m = super::merge::Merging::new(
                &p.task.target,
                "\"audit\".\"rows\"",
                &columns,
                key,
                &p.task.partition_column,
                (p.repr, p.interval, p.tz),
                *keep_missing,
            );
            super::merge::index_source(&conn, &m)?;
            super::merge::plan(&conn, &m)
        })();
        audit::detach(&conn);
        planned.map(Some).map_err(|e| e.at(&p.task.warehouse))
    }

    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        waiting: &mut dyn FnMut(),
    ) -> Result<i64> {
        let conn = super::pool::take(&p.task.warehouse)?;
        if crate::fault::point("publish") {
            return Err(Error::Message("disk I/O error (injected)".into()));
        }
        let publish = self.publish_as(p);
        // The publish writes the warehouse: a full disk there is the warehouse's.
        let rows = publish::publish_noting(&conn, &publish, allowed, waiting)
            .map_err(|e| e.at_file(&p.task.warehouse))?;
        self.merged = publish.merged.get();
        Ok(rows)
    }

    fn remove(self: Box<Self>) {
        self.file.remove();
    }

    fn keep(self: Box<Self>) {
        self.file.keep();
    }

    fn stage(self: Box<Self>) -> Result<PathBuf> {
        let path = self.file.path.clone();
        if let Err(e) = std::fs::File::open(&path).and_then(|f| f.sync_all()) {
            self.file.remove();
            return Err(Error::Message(format!(
                "cannot keep the staged output {}: {e}",
                path.display()
            )));
        }
        self.file.keep();
        Ok(path)
    }
}
