//! Recovery: what happens to a backfill whose owner is gone (killed, crashed, frozen past its
//! lease timeout). One module, three steps, never acting inside a manifest transaction:
//!
//! 1. **claim** (one manifest transaction): bump the dead owner's epoch, so that should it wake
//!    up it is refused everything, and read what it left: tries whose process group is
//!    recorded, audit files, publishes it had decided on;
//! 2. **act** (outside any transaction): kill the recorded process groups on this host and wait
//!    until they are gone; finish the decided publishes from their audit files (the warehouse
//!    transaction asks the manifest again, so two recoverers never publish twice over a newer
//!    output); remove audit files nobody needs;
//! 3. **record** (one manifest transaction): the killed tries and their runs as `cancelled`,
//!    finished publishes as published, runs whose every task had succeeded as `succeeded`; then
//!    release the leases.
//!
//! A try whose group could not be proven gone (it survived SIGKILL) keeps its run and lease: its
//! interval stays in flight rather than being run a second time, and a warning says so. A try on
//! another host cannot be checked from here; it counts as stopped once its owner's lease has
//! expired, which the claim requires (an owner stops its own tries when it cannot renew its
//! lease, and a thawed one is fenced at its next heartbeat).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use crate::clock::now_ms;
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::manifest::leases::{self, LeaseCtx};
use crate::manifest::publishes::PendingPublish;
use crate::manifest::runs::UnfinishedTry;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Owner, Reads, Store, TryRecord};
use crate::project::{Dag, Project, SqlTask, TaskKind};
use crate::state::TryState;
use crate::warehouse::{self, AuditFile, Repr, Settlement, partition};

/// How long a killed group may take to disappear before it counts as unstoppable.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What a claim found for one dead owner.
#[derive(Debug, Clone)]
struct Claim {
    owner: Owner,
    tries: Vec<UnfinishedTry>,
    publishes: Vec<PendingPublish>,
    /// Its runs still in progress when it was claimed: the only ones this claim may end.
    runs: Vec<i64>,
    /// A `promote --atomic`: its publishes are finished together.
    atomic: bool,
}

/// How the act step left each thing it touched.
#[derive(Debug, Default)]
struct Acted {
    /// Tries whose process is gone (or never started).
    stopped: Vec<i64>,
    /// Runs whose try could not be proven gone, and why.
    blocked: Vec<(i64, String)>,
    /// Publishes finished: try id -> rows.
    published: HashMap<i64, i64>,
    /// What PostgreSQL bookings say of publishes finished: a PostgreSQL try records its
    /// intent before it has measured and judged its output.
    booked: HashMap<i64, warehouse::Booked>,
    /// Publishes not needed any more (superseded or already finished).
    dropped: Vec<(i64, String)>,
    /// Publishes that could not be finished: try id -> why.
    failed: Vec<(i64, String)>,
    /// Runs of publishes left for a later recovery: their warehouse is locked by a process that
    /// gets nowhere (see [`warehouse::busy`]). They stay in progress, their intents pending.
    left: Vec<i64>,
}

/// What recovery did, for the caller to report.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub warnings: Vec<String>,
    pub owners: Vec<i64>,
}

/// The DAGs of the project by id, for finishing publishes of any of them.
pub(crate) struct Dags(HashMap<String, Dag>);

impl Dags {
    pub(crate) fn of(project: &Project) -> Self {
        Self(
            project
                .load_all()
                .0
                .into_iter()
                .map(|d| (d.id.clone(), d))
                .collect(),
        )
    }

    fn sql_task(&self, dag_id: &str, task_id: &str) -> Option<(&SqlTask, chrono_tz::Tz)> {
        let dag = self.0.get(dag_id)?;
        let task = dag.tasks.iter().find(|t| t.id == task_id)?;
        match &task.kind {
            TaskKind::Sql(sql) => Some((sql, dag.tz)),
            TaskKind::Command(_) => None,
        }
    }
}

fn claim_owner(
    conn: &dyn Store,
    backfill_id: i64,
    ctx: &LeaseCtx,
    me: bool,
) -> manifest::Result<Option<Claim>> {
    let Some(owner) = conn.take_ownership(backfill_id, ctx, me)? else {
        return Ok(None);
    };
    // Its workers that are gone too: their runs are settled with the owner's. A live worker's
    // runs are its own to finish (it stops once the backfill no longer runs, or goes on under
    // the new owner).
    conn.take_gone_workers(backfill_id, ctx)?;
    claim_of(conn, owner).map(Some)
}

/// What `claimed` (an owner or a worker just claimed) left to recover.
fn claim_of(conn: &dyn Reads, claimed: Owner) -> manifest::Result<Claim> {
    Ok(Claim {
        owner: claimed,
        tries: conn.unfinished_tries(claimed)?,
        publishes: conn.pending_publishes(claimed)?,
        runs: conn.runs_in_progress(claimed)?,
        atomic: conn
            .backfill(claimed.backfill_id)?
            .is_some_and(|b| b.atomic),
    })
}

/// Recovers the workers of backfill `backfill_id` that are gone (their lease expired): their
/// tries stopped and ended, their runs ended, so that their intervals can be run again; the
/// backfill's owner calls it. Returns how many were recovered.
pub(crate) fn recover_workers(
    writer: &Writer,
    dags: &Dags,
    backfill_id: i64,
    ctx: &LeaseCtx,
) -> Result<Report, Error> {
    let c = ctx.clone();
    let claims = writer.call_blocking(move |conn| {
        conn.take_gone_workers(backfill_id, &c)?
            .into_iter()
            .map(|claimed| claim_of(conn, claimed))
            .collect::<manifest::Result<Vec<_>>>()
    })?;
    if claims.is_empty() {
        return Ok(Report::default());
    }
    recover(writer, dags, claims, ctx, true)
}

/// Releases the stale leases of a DAG: recovers every dead owner that holds one. Run before
/// planning, so that the plan sees them free.
pub(crate) fn release_stale(
    writer: &Writer,
    dags: &Dags,
    dag_id: &str,
    ctx: &LeaseCtx,
    except: Option<i64>,
) -> Result<Report, Error> {
    let (dag, c) = (dag_id.to_string(), ctx.clone());
    let claims = writer.call_blocking(move |conn| {
        let stale = conn.stale_leases(&dag, &c)?;
        let owners: HashSet<i64> = stale
            .iter()
            .map(|s| s.1)
            .filter(|o| Some(*o) != except)
            .collect();
        let mut owners: Vec<i64> = owners.into_iter().collect();
        owners.sort_unstable();
        let mut claims = Vec::new();
        for id in owners {
            if let Some(claim) = claim_owner(conn, id, &c, false)? {
                claims.push(claim);
            }
        }
        Ok(claims)
    })?;
    recover(writer, dags, claims, ctx, false)
}

/// A backfill this process took ownership of, with what its old owner left still to recover.
pub(crate) struct TakenOver {
    pub owner: Owner,
    claim: Claim,
}

/// Makes this process the owner of a backfill whose owner is gone (a new epoch, in one
/// transaction). `None` when the owner is alive. The caller starts its heartbeat, then calls
/// [`finish_takeover`].
pub(crate) fn take_over(
    writer: &Writer,
    backfill_id: i64,
    ctx: &LeaseCtx,
) -> Result<Option<TakenOver>, Error> {
    let c = ctx.clone();
    let claim = writer.call_blocking(move |conn| claim_owner(conn, backfill_id, &c, true))?;
    Ok(claim.map(|claim| TakenOver {
        owner: claim.owner,
        claim,
    }))
}

/// Like [`take_over`], for `worker`, a live worker of the backfill (`backfill join`) whose
/// owner is gone: only while the worker's own lease holds (a worker taken over itself is
/// [`manifest::Error::Fenced`]), the backfill runs and nobody asked to cancel it, all judged in
/// the same transaction as the claim, so that a backfill cancelled or ended meanwhile is not run
/// again. Of two workers that both find the owner gone, the first claim gives the backfill a
/// live owner again, and the second finds it alive (`None`).
pub(crate) fn take_over_running(
    writer: &Writer,
    worker: Owner,
    ctx: &LeaseCtx,
) -> Result<Option<TakenOver>, Error> {
    let (backfill_id, c) = (worker.backfill_id, ctx.clone());
    let claim = writer.call_blocking(move |conn| {
        conn.fence(worker)?;
        match conn.backfill(backfill_id)? {
            Some(b) if b.state == crate::state::BackfillState::Running && !b.cancel_requested => {
                claim_owner(conn, backfill_id, &c, true)
            }
            _ => Ok(None),
        }
    })?;
    Ok(claim.map(|claim| TakenOver {
        owner: claim.owner,
        claim,
    }))
}

/// Recovers what the old owner of a backfill taken over left.
pub(crate) fn finish_takeover(
    writer: &Writer,
    dags: &Dags,
    taken: TakenOver,
    ctx: &LeaseCtx,
) -> Result<Report, Error> {
    recover(writer, dags, vec![taken.claim], ctx, true)
}

/// Ends a backfill whose owner is gone as `cancelled`, after recovering what it left, and
/// releases its leases. `false` when the owner is alive.
pub(crate) fn cancel_dead(
    writer: &Writer,
    dags: &Dags,
    backfill_id: i64,
    ctx: &LeaseCtx,
) -> Result<Option<Report>, Error> {
    let c = ctx.clone();
    let claim = writer.call_blocking(move |conn| claim_owner(conn, backfill_id, &c, false))?;
    let Some(claim) = claim else {
        return Ok(None);
    };
    recover(writer, dags, vec![claim], ctx, false).map(Some)
}

/// Acts on the claims, then records what happened.
fn recover(
    writer: &Writer,
    dags: &Dags,
    claims: Vec<Claim>,
    ctx: &LeaseCtx,
    keep_owner: bool,
) -> Result<Report, Error> {
    let mut report = Report::default();
    let mut acted = Vec::new();
    // A warehouse found locked by a process that gets nowhere: publishes are left for later
    // from then on (each would wait as long again), and the recovery ends with it once what it
    // did is recorded.
    let mut locked = None;
    for claim in &claims {
        tracing::info!(
            backfill = claim.owner.backfill_id,
            epoch = claim.owner.epoch,
            tries = claim.tries.len(),
            publishes = claim.publishes.len(),
            "recovering what a gone owner left"
        );
        let a = act(writer.path(), dags, claim, ctx, &mut locked);
        for (_, why) in &a.blocked {
            report.warnings.push(why.clone());
        }
        for (try_id, why) in &a.failed {
            report.warnings.push(format!(
                "try {try_id}: the publish it had decided on could not be finished: {why}"
            ));
        }
        report.owners.push(claim.owner.backfill_id);
        acted.push(a);
    }
    let task_counts: HashMap<String, usize> = dags
        .0
        .iter()
        .map(|(id, d)| (id.clone(), d.tasks.len()))
        .collect();
    crate::fault::point("before-record");
    let claims_for_record = claims.clone();
    let now = now_ms();
    writer.call_blocking(move |conn| {
        for (claim, a) in claims_for_record.iter().zip(&acted) {
            record(conn, claim, a, &task_counts, keep_owner, now)?;
        }
        Ok(())
    })?;
    if let Some(e) = locked {
        return Err(Error::Warehouse(e));
    }
    sweep_audits(writer)?;
    sweep_staged_tables(writer, dags)?;
    Ok(report)
}

/// Removes from the project's warehouses what tries of this manifest that died left there
/// and nobody needs (see [`warehouse::backend::Backend::sweep_left`]): the staged tables of
/// tries killed after staging and before recording it, and the old bookings of publishes whose
/// tries are recorded as ended. A warehouse that cannot be reached is skipped (the next
/// recovery tries again).
pub(crate) fn sweep_staged_tables(writer: &Writer, dags: &Dags) -> Result<usize, Error> {
    let mut warehouses: Vec<&crate::project::Warehouse> = Vec::new();
    for dag in dags.0.values() {
        for task in &dag.tasks {
            if let TaskKind::Sql(sql) = &task.kind
                && !warehouses.iter().any(|w| w.name == sql.warehouse.name)
            {
                warehouses.push(&sql.warehouse);
            }
        }
    }
    if warehouses.is_empty() {
        return Ok(0);
    }
    let (keep, below) =
        writer.call_blocking(|c| Ok((c.keeping_staged_tables()?, c.first_unfinished_try()?)))?;
    let manifest = manifest::identity(writer.path())?;
    let mut removed = 0;
    for w in warehouses {
        match warehouse::backend_of(w).sweep_left(w, &manifest, &|t| keep.contains(&t), below) {
            Ok(n) => removed += n,
            Err(e) => tracing::warn!("cannot look for staged tables nobody needs: {e}"),
        }
    }
    if removed > 0 {
        tracing::info!(removed, "dropped staged tables left by tries that died");
    }
    Ok(removed)
}

/// Step 2 for one dead owner. Once a publish found its warehouse locked by a process that gets
/// nowhere (`locked`), the publishes are left for a later recovery.
fn act(
    manifest_path: &Path,
    dags: &Dags,
    claim: &Claim,
    ctx: &LeaseCtx,
    locked: &mut Option<warehouse::Error>,
) -> Acted {
    let mut acted = Acted::default();
    let backfill_id = claim.owner.backfill_id;
    for t in claim.tries.iter().filter(|t| !t.publishing) {
        let gone = match t.group {
            None => true,
            Some(group) if ctx.is_here(t.host.as_deref()) => {
                let gone = crate::process::kill_group(group, KILL_WAIT);
                tracing::info!(
                    backfill = backfill_id,
                    try_id = t.try_id,
                    pgid = group.pgid,
                    gone,
                    "killed the process group of a gone owner's try"
                );
                gone
            }
            Some(group) => {
                // On another host: nothing here can look at it or stop it. Its owner's lease
                // has expired (else there would be no claim): the owner stopped it when it could
                // not renew the lease, or will at its next heartbeat should it come back from a
                // freeze, and may publish nothing now (see `LeaseCtx::group_may_run`).
                tracing::info!(
                    backfill = backfill_id,
                    try_id = t.try_id,
                    pgid = group.pgid,
                    host = t.host.as_deref().unwrap_or_default(),
                    "a gone owner's try on another host counts as stopped: its owner's lease expired"
                );
                true
            }
        };
        if gone {
            if let Some(path) = &t.audit_path
                && let Some(file) = AuditFile::existing(Path::new(path))
            {
                file.remove();
            }
            acted.stopped.push(t.try_id);
        } else {
            let why = match &t.group {
                Some(g) => format!(
                    "try {} of backfill {backfill_id} (process group {}) survived SIGKILL for {}s; its interval stays in flight until it is gone",
                    t.try_id,
                    g.pgid,
                    KILL_WAIT.as_secs()
                ),
                _ => format!(
                    "try {} of backfill {backfill_id} could not be stopped",
                    t.try_id
                ),
            };
            tracing::warn!(backfill = backfill_id, try_id = t.try_id, "{why}");
            acted.blocked.push((t.run_id, why));
        }
    }
    if claim.atomic
        && claim.publishes.len() > 1
        && locked.is_none()
        && let Some(group) = finish_group(manifest_path, dags, &claim.publishes)
    {
        match group {
            Ok(finished) => {
                for (p, f) in claim.publishes.iter().zip(finished) {
                    take((&mut acted, backfill_id), p, Ok(f), locked);
                }
            }
            Err(Unfinished::Failed(why)) => {
                for p in &claim.publishes {
                    take(
                        (&mut acted, backfill_id),
                        p,
                        Err(Unfinished::Failed(why.clone())),
                        locked,
                    );
                }
            }
            Err(Unfinished::Locked(e)) => {
                acted.left.extend(claim.publishes.iter().map(|p| p.run_id));
                *locked = Some(e);
            }
        }
        return acted;
    }
    for p in &claim.publishes {
        if locked.is_some() {
            acted.left.push(p.run_id);
            continue;
        }
        take(
            (&mut acted, backfill_id),
            p,
            finish_publish(manifest_path, dags, p),
            locked,
        );
    }
    acted
}

/// Notes how finishing one decided publish went.
fn take(
    (acted, backfill_id): (&mut Acted, i64),
    p: &PendingPublish,
    result: Result<Finished, Unfinished>,
    locked: &mut Option<warehouse::Error>,
) {
    match result {
        Ok(Finished::Published(rows, booked)) => {
            if let Some(booked) = booked {
                acted.booked.insert(p.try_id, booked);
            }
            tracing::info!(
                backfill = backfill_id,
                try_id = p.try_id,
                rows,
                "finished the publish of a gone owner"
            );
            acted.published.insert(p.try_id, rows);
        }
        Ok(Finished::Dropped(why)) => acted.dropped.push((p.try_id, why)),
        Err(Unfinished::Failed(why)) => {
            tracing::warn!(backfill = backfill_id, try_id = p.try_id, "{why}");
            acted.failed.push((p.try_id, why));
        }
        Err(Unfinished::Locked(e)) => {
            tracing::warn!(backfill = backfill_id, try_id = p.try_id, "{e}");
            acted.left.push(p.run_id);
            *locked = Some(e);
        }
    }
}

/// Finishes the decided publishes of a `promote --atomic` together, in one transaction of
/// their SQLite warehouse, when every one still has its audit file: its owner may have died
/// before its transaction committed, so readers must see all of them at once, or none. `None`
/// when they are finished one by one: a PostgreSQL warehouse's transaction committed or was
/// rolled back as a whole (its bookings say which), and an audit file that is gone means the
/// group committed (the files go only after its commit; each is then checked on its own). A
/// member whose task is no longer a SQL task of the project fails them all: none is published
/// without the others.
fn finish_group(
    manifest_path: &Path,
    dags: &Dags,
    group: &[PendingPublish],
) -> Option<Result<Vec<Finished>, Unfinished>> {
    let mut audits = Vec::with_capacity(group.len());
    for p in group {
        if p.audit_path.is_none() || p.record.restore_key.is_some() {
            return None;
        }
        audits.push(AuditFile::existing(Path::new(p.audit_path.as_deref()?))?);
    }
    let mut tasks = Vec::with_capacity(group.len());
    for p in group {
        let Some((task, tz)) = dags.sql_task(&p.dag_id, &p.task_id) else {
            return Some(Err(Unfinished::Failed(format!(
                "task `{}` of DAG `{}` is no longer a SQL task of the project: the promote's outputs, published all at once or not at all, are left unpublished",
                p.task_id, p.dag_id
            ))));
        };
        // Outputs held in their tries' own transactions were settled from the warehouse's
        // bookings: the server committed them together, or none.
        if warehouse::backend_of(&task.warehouse).holding() != warehouse::Holding::AuditFile {
            return None;
        }
        tasks.push((task, tz));
    }
    Some((|| {
        let reader = manifest::open_read_only(manifest_path).map_err(|e| e.to_string())?;
        let wh = warehouse::open(&tasks[0].0.warehouse)?;
        let mut publishes = Vec::with_capacity(group.len());
        for ((p, (task, tz)), audit) in group.iter().zip(&tasks).zip(&audits) {
            publishes.push(publish_of(&wh, reader.as_ref(), task, *tz, p, audit)?);
        }
        let allowed = || {
            for p in group {
                if !reader
                    .may_publish(p.try_id, None, true)
                    .map_err(warehouse::AskError::from)?
                {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        match warehouse::publish::publish_group(&wh, &mut publishes, &allowed, &mut || {}) {
            Ok(rows) => {
                drop(publishes);
                for a in audits {
                    a.remove();
                }
                Ok(rows
                    .into_iter()
                    .map(|r| Finished::Published(r, None))
                    .collect())
            }
            Err(warehouse::Error::Refused) => {
                drop(publishes);
                // Staged outputs: they stay staged, for the next `promote`.
                for a in audits {
                    a.keep();
                }
                Ok(group
                    .iter()
                    .map(|_| {
                        Finished::Dropped(
                            "superseded by a newer publish, or finished by another process".into(),
                        )
                    })
                    .collect())
            }
            Err(e) => Err(e.into()),
        }
    })())
}

/// Why a decided publish was not finished.
enum Unfinished {
    /// It cannot be: recorded as failed, with why.
    Failed(String),
    /// Not now: its warehouse is locked by a process that gets nowhere
    /// ([`warehouse::Error::LockedBy`]); it stays pending.
    Locked(warehouse::Error),
}

impl From<String> for Unfinished {
    fn from(why: String) -> Self {
        Self::Failed(why)
    }
}

impl From<warehouse::Error> for Unfinished {
    fn from(e: warehouse::Error) -> Self {
        match e {
            warehouse::Error::LockedBy { .. } => Self::Locked(e),
            other => Self::Failed(other.to_string()),
        }
    }
}

enum Finished {
    /// Rows, and what the warehouse booked, when it books its publishes.
    Published(i64, Option<warehouse::Booked>),
    Dropped(String),
}

/// Finishes one decided publish from its audit file. The publish transaction asks the
/// manifest whether the intent still stands, so a publish finished by someone else, or
/// superseded by a newer one, is not redone.
fn finish_publish(
    manifest_path: &Path,
    dags: &Dags,
    p: &PendingPublish,
) -> Result<Finished, Unfinished> {
    let Some((task, tz)) = dags.sql_task(&p.dag_id, &p.task_id) else {
        return Err(Unfinished::Failed(format!(
            "task `{}` of DAG `{}` is no longer a SQL task of the project",
            p.task_id, p.dag_id
        )));
    };
    let reader = manifest::open_read_only(manifest_path).map_err(|e| e.to_string())?;
    let manifest = manifest::identity(manifest_path).map_err(|e| e.to_string())?;
    let backend = warehouse::backend_of(&task.warehouse);
    match backend.settle(task, p.interval, &manifest, p.try_id) {
        Ok(Settlement::Booked(Some(booked))) => {
            return Ok(Finished::Published(booked.rows, Some(booked)));
        }
        Ok(Settlement::Booked(None)) => return Ok(Finished::Dropped(
            "the publish did not commit (the server rolled its transaction back); the interval runs again".into(),
        )),
        Err(e) => return Err(Unfinished::Failed(e.to_string())),
        Ok(Settlement::FromAudit) => {}
    }
    let wh = warehouse::open(&task.warehouse)?;
    if let Some(key) = p.record.restore_key {
        // A rollback: its transaction put the version back and dropped it, together. Judged
        // under the warehouse's write lock, which an owner frozen before its commit still
        // holds: "not committed" must stay true once said.
        let allowed = || {
            reader
                .may_publish(p.try_id, None, true)
                .map_err(warehouse::AskError::from)
        };
        return match warehouse::publish::rollback_committed(&wh, task, key, &allowed) {
            Ok(true) => Ok(Finished::Published(p.record.rows.unwrap_or(0), None)),
            Ok(false) => Err(Unfinished::Failed(
                "the rollback did not commit: the partition is as it was; roll it back again"
                    .into(),
            )),
            Err(warehouse::Error::Refused) => Ok(Finished::Dropped("already finished".into())),
            Err(e) => Err(e.into()),
        };
    }
    let audit = match (&p.audit_path, &p.audit_table) {
        (Some(path), _) => AuditFile::existing(Path::new(path)),
        (None, Some(table)) => legacy_audit(&wh, table, manifest_path, p.try_id)?,
        (None, None) => None,
    };
    let Some(audit) = audit else {
        // The audit file is removed only once the publish committed (or the intent was
        // settled): check that the partition holds the audited rows before recording it.
        if !reader
            .may_publish(p.try_id, None, true)
            .map_err(|e| e.to_string())?
        {
            return Ok(Finished::Dropped("already finished".into()));
        }
        return match published_matches(&wh, task, p, tz) {
            Ok(true) => Ok(Finished::Published(p.record.rows.unwrap_or(0), None)),
            Ok(false) => Err(Unfinished::Failed(
                "its audit file is gone and the partition does not hold the audited rows".into(),
            )),
            Err(e) => Err(e.into()),
        };
    };
    let allowed = || {
        reader
            .may_publish(p.try_id, None, true)
            .map_err(warehouse::AskError::from)
    };
    let publish = publish_of(&wh, reader.as_ref(), task, tz, p, &audit)?;
    let result = warehouse::publish::publish(&wh, &publish, &allowed);
    // A promote's file is the staged output's own: unless this publish put it in place, the
    // output stays staged (for the next `promote`), and so does its file.
    let promoting = p.record.promoted_from.is_some();
    match result {
        Ok(rows) => {
            audit.remove();
            Ok(Finished::Published(rows, None))
        }
        Err(warehouse::Error::Refused) => {
            if promoting {
                audit.keep();
            } else {
                audit.remove();
            }
            Ok(Finished::Dropped(
                "superseded by a newer publish, or finished by another process".into(),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// How to finish the decided publish `p` from its audit file: the rows being replaced are
/// kept as the version of the current publish's content.
fn publish_of<'a>(
    wh: &rusqlite::Connection,
    reader: &dyn Reads,
    task: &'a SqlTask,
    tz: chrono_tz::Tz,
    p: &'a PendingPublish,
    audit: &'a AuditFile,
) -> Result<warehouse::publish::Publish<'a>, Unfinished> {
    let current = reader
        .current_publication(&p.dag_id, &p.task_id, p.interval.start.timestamp())
        .map_err(|e| e.to_string())?;
    let version_of = current.as_ref().and_then(|c| c.content);
    let same_content = current.as_ref().is_some_and(|c| {
        c.fingerprint.is_some() && c.fingerprint.as_deref() == p.record.fingerprint.as_deref()
    });
    Ok(warehouse::publish::Publish {
        task,
        interval: p.interval,
        tz,
        repr: publish_repr(wh, task, audit),
        audit: Some(audit),
        expect_fingerprint: p.record.fingerprint.as_deref(),
        keep: Some(warehouse::versions::Keep {
            by_try: p.try_id,
            version_of,
            keep: task.keep_versions,
            same_content,
        }),
        // Redone after a commit, a merge finds nothing left to write: it is not held to the
        // counts its try recorded.
        planned: None,
        merged: std::cell::Cell::default(),
        rows_in: None,
    })
}

/// Whether the target's partition holds exactly the rows the gate audited (same count and
/// fingerprint over the query's columns).
fn published_matches(
    wh: &Connection,
    task: &SqlTask,
    p: &PendingPublish,
    tz: chrono_tz::Tz,
) -> warehouse::Result<bool> {
    let columns: Vec<String> = wh
        .prepare(&warehouse::wrapped_query(&task.sql))?
        .column_names()
        .map(warehouse::quote)
        .collect();
    let table = format!("main.{}", warehouse::quote(&task.target));
    let repr = partition::endpoint_classes(wh, &table, &task.partition_column)?;
    let [repr] = repr.reprs.as_slice() else {
        return Ok(p.record.rows == Some(0));
    };
    if let crate::project::WritePattern::Merge {
        keep_missing: true, ..
    } = &task.write
    {
        // The partition holds the output and the keys it lacked, which only the audit file
        // could tell apart; that file goes only once the publish committed.
        return Ok(true);
    }
    let (lo, hi) = repr.bounds(p.interval, tz);
    let mut stmt = wh.prepare(&format!(
        "SELECT {} FROM {table} WHERE {}",
        columns.join(", "),
        repr.predicate(&task.partition_column, 1)
    ))?;
    let (rows, fingerprint) =
        warehouse::audit::fingerprint_rows(&mut stmt, rusqlite::params![lo, hi])?;
    Ok(
        Some(rows) == p.record.rows
            && Some(fingerprint.as_str()) == p.record.fingerprint.as_deref(),
    )
}

/// A publish intent recorded by an older version kept its rows in a table of the warehouse:
/// copy them into an audit file.
fn legacy_audit(
    wh: &Connection,
    table: &str,
    manifest_path: &Path,
    try_id: i64,
) -> Result<Option<AuditFile>, String> {
    if warehouse::table_columns(wh, "main", table)
        .map_err(|e| e.to_string())?
        .is_empty()
    {
        return Ok(None);
    }
    let dir = warehouse::audit_dir(manifest_path);
    let file =
        AuditFile::create(&dir, &format!("legacy-{try_id}.db")).map_err(|e| e.to_string())?;
    let copy = || -> warehouse::Result<()> {
        file.attach(wh)?;
        wh.execute_batch(&format!(
            "CREATE TABLE audit.rows AS SELECT * FROM main.{}; DETACH DATABASE audit; DROP TABLE main.{};",
            warehouse::quote(table),
            warehouse::quote(table)
        ))?;
        Ok(())
    };
    copy().map_err(|e| e.to_string())?;
    Ok(Some(file))
}

/// The representation to publish an audit file with: the one its rows have, else the
/// target's, else the declared type's.
fn publish_repr(wh: &Connection, task: &SqlTask, audit: &AuditFile) -> Option<Repr> {
    let from_audit = (|| -> warehouse::Result<Option<Repr>> {
        audit.attach(wh)?;
        let classes = partition::classes(wh, warehouse::audit::TABLE, &task.partition_column, None);
        warehouse::audit::detach(wh);
        let classes = classes?;
        Ok(match classes.reprs.as_slice() {
            [one] => Some(*one),
            _ => None,
        })
    })();
    if let Ok(Some(r)) = from_audit {
        return Some(r);
    }
    let table = format!("main.{}", warehouse::quote(&task.target));
    if let Ok(c) = partition::endpoint_classes(wh, &table, &task.partition_column)
        && let [one] = c.reprs.as_slice()
    {
        return Some(*one);
    }
    warehouse::declared_type(wh, &task.target, &task.partition_column)
        .ok()
        .and_then(|t| Repr::from_declared(&t))
}

/// Step 3 for one dead owner. When another process claimed the backfill after this one (a newer
/// epoch), only what this claim itself did is recorded (the tries it stopped, the publishes it
/// finished); the runs and leases are the newer claimer's to settle.
fn record(
    conn: &dyn Store,
    claim: &Claim,
    a: &Acted,
    task_counts: &HashMap<String, usize>,
    keep_owner: bool,
    now: i64,
) -> manifest::Result<()> {
    let backfill_id = claim.owner.backfill_id;
    let (current, why) = match claim.owner.worker {
        None => (
            conn.backfill(backfill_id)?
                .is_some_and(|b| b.epoch == claim.owner.epoch),
            format!("abandoned: the process of backfill {backfill_id} is gone"),
        ),
        Some(w) => (
            conn.workers(backfill_id)?
                .iter()
                .any(|x| x.id == w && x.epoch == claim.owner.epoch),
            format!("abandoned: worker {w} of backfill {backfill_id} is gone"),
        ),
    };
    for try_id in &a.stopped {
        let mut rec = TryRecord::new(TryState::Cancelled);
        rec.error = Some(why.clone());
        conn.end_abandoned_try(*try_id, &rec, now)?;
    }
    for p in &claim.publishes {
        if let Some(rows) = a.published.get(&p.try_id) {
            let mut rec = p.record.clone();
            rec.state = TryState::Succeeded;
            rec.rows = Some(*rows);
            if let Some(booked) = a.booked.get(&p.try_id) {
                fill_from_booking(&mut rec, booked);
            }
            // Only the recoverer that finishes the try records its publication.
            if conn.end_abandoned_try(p.try_id, &rec, now)? {
                conn.mark_published(
                    &manifest::Publication {
                        try_id: p.try_id,
                        dag_id: &p.dag_id,
                        task_id: &p.task_id,
                        interval: p.interval,
                        rows: *rows,
                        fingerprint: rec.fingerprint.as_deref(),
                    },
                    now,
                )?;
                if let Some(staged) = p.record.promoted_from {
                    conn.set_staged(staged, crate::state::StagedState::Promoted)?;
                }
            }
        } else if let Some((_, reason)) = a.dropped.iter().find(|d| d.0 == p.try_id) {
            let mut rec = TryRecord::new(TryState::Cancelled);
            rec.error = Some(format!("interrupted while publishing; {reason}"));
            conn.end_abandoned_try(p.try_id, &rec, now)?;
        } else if let Some((_, reason)) = a.failed.iter().find(|d| d.0 == p.try_id) {
            let mut rec = TryRecord::new(TryState::Failed);
            rec.error = Some(format!(
                "interrupted while publishing, and the publish could not be finished: {reason}"
            ));
            conn.end_abandoned_try(p.try_id, &rec, now)?;
        }
    }
    if !current {
        tracing::info!(
            backfill = backfill_id,
            epoch = claim.owner.epoch,
            "claimed again meanwhile: leaving its runs and leases to the newer claim"
        );
        return Ok(());
    }
    // Runs whose try could not be stopped, or whose publish was left for later, stay in
    // progress, their leases held.
    let keep: Vec<i64> = a
        .blocked
        .iter()
        .map(|b| b.0)
        .chain(a.left.iter().copied())
        .collect();
    let counts = |dag: &str| task_counts.get(dag).copied();
    conn.end_abandoned_runs(&claim.runs, &counts, &keep, &why, now)?;
    // A worker's intervals stay the backfill's: their leases were released with their runs,
    // and the owner leases them again.
    if !keep_owner && claim.owner.worker.is_none() {
        // Leases of runs that could not be stopped stay, so their intervals stay in flight.
        conn.release_all_but_running(backfill_id)?;
    }
    Ok(())
}

/// Fills what a try's intent did not record (a PostgreSQL try records it before it measured)
/// from its booking: fingerprint, source rows and fingerprint, verdict, reasons, the rows it was
/// compared with.
fn fill_from_booking(rec: &mut TryRecord, booked: &warehouse::Booked) {
    if rec.fingerprint.is_none() {
        rec.fingerprint.clone_from(&booked.fingerprint);
    }
    if let Some(judged) = &booked.judged {
        rec.fill_judged(judged);
    }
}

/// Removes the audit files that no live process holds and no pending publish needs.
pub(crate) fn sweep_audits(writer: &Writer) -> Result<usize, Error> {
    let dir = warehouse::audit_dir(writer.path());
    if !dir.exists() {
        return Ok(0);
    }
    let pending: HashSet<i64> = writer.call_blocking(|c| c.needing_audit_files())?;
    let removed = warehouse::audit::sweep(&dir, &|t| t.is_some_and(|t| pending.contains(&t)));
    if removed > 0 {
        tracing::info!(removed, dir = %dir.display(), "removed audit files left by processes that died");
    }
    Ok(removed)
}

/// The intervals of a backfill's plan still to run, leased for its new owner; intervals that a
/// live lease of another backfill holds are recorded as skipped (`in flight`).
pub(crate) fn lease_remaining(
    conn: &dyn Store,
    owner: Owner,
    dag_id: &str,
    ctx: &LeaseCtx,
) -> manifest::Result<Vec<DataInterval>> {
    conn.fence(owner)?;
    let remaining = conn.unfinished_intervals(owner.backfill_id)?;
    let (lo, hi) = remaining.iter().fold((i64::MAX, i64::MIN), |(lo, hi), i| {
        (lo.min(i.start.timestamp()), hi.max(i.start.timestamp()))
    });
    let busy = conn.held_leases(dag_id, lo, hi, ctx, leases::Judge::Strict)?;
    // A run of a live worker of this backfill is that worker's to finish: its interval is
    // neither free nor skipped.
    let working = conn.worker_starts_in_flight(owner.backfill_id)?;
    // Any other run of this backfill still in progress after recovery holds a try that could
    // not be stopped: its interval stays in flight.
    let mut blocked = conn.starts_in_progress(owner.backfill_id)?;
    blocked.retain(|s| !working.contains(s));
    // An interval another backfill ran to success meanwhile already exists, as the reprocess
    // behaviour judges it: for `completed`, only when that run started after this backfill
    // was created (it is the reprocessing that was asked for).
    let latest = conn.latest_runs(dag_id, lo, hi)?;
    let backfill = conn.backfill(owner.backfill_id)?;
    let done_elsewhere = |start: i64| {
        latest.get(&start).is_some_and(|&(state, by, started_at)| {
            state == crate::state::RunState::Succeeded
                && by != owner.backfill_id
                && backfill.as_ref().is_some_and(|b| {
                    b.reprocess != crate::plan::Reprocess::Completed || started_at >= b.created_at
                })
        })
    };
    let mut free = Vec::with_capacity(remaining.len());
    for interval in remaining {
        let start = interval.start.timestamp();
        if working.contains(&start) {
            continue;
        }
        let mine = conn.holds_lease(owner.backfill_id, dag_id, start)?;
        if done_elsewhere(start) && !blocked.contains(&start) {
            conn.mark_skipped(
                owner.backfill_id,
                start,
                crate::plan::SkipReason::AlreadyExists,
            )?;
            conn.release_lease(owner.backfill_id, dag_id, start)?;
        } else if blocked.contains(&start) || (busy.contains(&start) && !mine) {
            conn.mark_skipped(owner.backfill_id, start, crate::plan::SkipReason::InFlight)?;
        } else {
            free.push(interval);
        }
    }
    conn.take_leases(owner.backfill_id, dag_id, &mut free.iter().copied(), ctx)?;
    Ok(free)
}
