//! The manifest read as `list`, `show` and the status page show it: backfills whose owners and
//! workers are judged alive by the project's lease rule ([`LeaseCtx`]) at the manifest's clock
//! (the database's on PostgreSQL, read once per read), with their hosts named. The commands and
//! the page read through here so that they say the same of the same manifest.
//!
//! Read-only: a read is handed a [`Reads`] handle, and the warehouse is only measured (the
//! storage of kept versions), never created or changed.

use std::time::Duration;

use crate::manifest::Reads;
use crate::manifest::leases::LeaseCtx;
use crate::manifest::queries::{BackfillDetail, BackfillSummary};
use crate::project::{Dag, Project};

/// The lease timeout leases are judged with: the project's, or the default without a project.
pub(crate) fn lease_timeout(project: Option<&Project>) -> Duration {
    project.map_or(crate::project::DEFAULT_LEASE_TIMEOUT, |p| p.lease_timeout)
}

/// How a read judges leases and owners: with the project's lease timeout, from this host, at
/// the manifest's clock (the database's on PostgreSQL, read once here), as `resume` does.
pub(crate) fn lease_ctx(
    project: Option<&Project>,
    conn: &dyn Reads,
) -> crate::manifest::Result<LeaseCtx> {
    LeaseCtx::new(lease_timeout(project), &crate::process::LOCAL).at_manifest(conn)
}

/// Says whether each running backfill's owner is alive.
pub(crate) fn judge_owners(list: &mut [BackfillSummary], ctx: &LeaseCtx) {
    for b in list {
        let host = b.owner_host.clone();
        b.owner_alive = ctx.owner_alive(
            b.state,
            (b.owner_pid, b.owner_start),
            host.as_deref(),
            b.heartbeat_at,
        );
    }
}

/// The backfills of `list`, with whether each owner is alive.
pub(crate) fn backfills(
    conn: &dyn Reads,
    project: Option<&Project>,
    dag: Option<&str>,
    active: bool,
) -> crate::manifest::Result<Vec<BackfillSummary>> {
    let mut rows = conn.list_backfills(dag, active)?;
    judge_owners(&mut rows, &lease_ctx(project, conn)?);
    Ok(rows)
}

/// A backfill as `show` reads it: its detail (owners and workers judged, hosts named; with
/// `json`, a cascade's members inside it), the members of its cascade for people, and its DAG
/// when the project has it. `None` when the manifest has no such backfill.
pub(crate) struct Shown {
    pub detail: BackfillDetail,
    pub members: Vec<BackfillDetail>,
    pub dag: Option<Dag>,
    /// How its owners and workers were judged: the lease rule at the manifest's clock when it
    /// was read, at which a page counts the age of its heartbeat too.
    pub ctx: LeaseCtx,
}

/// The backfill `id` as `show` reads it (see [`Shown`]); `json` for `--output json`.
pub(crate) fn shown(
    conn: &dyn Reads,
    project: Option<&Project>,
    id: i64,
    json: bool,
) -> crate::manifest::Result<Option<Shown>> {
    shown_with(
        conn,
        project,
        id,
        json,
        &|c, id| c.show_backfill(id),
        &|c, id| c.show_backfill(id),
    )
}

/// Like [`shown`] for people, with `limit` of the backfill's intervals in time order from the
/// `offset`-th, and its cascade's members with their counts only: a page of the status page.
pub(crate) fn shown_page(
    conn: &dyn Reads,
    project: Option<&Project>,
    id: i64,
    offset: i64,
    limit: i64,
) -> crate::manifest::Result<Option<Shown>> {
    shown_with(
        conn,
        project,
        id,
        false,
        &|c, id| c.show_backfill_page(id, offset, limit),
        &|c, id| c.show_backfill_page(id, 0, 0),
    )
}

/// How a backfill's detail is read: whole, or a page of its intervals.
type Fetch<'a> = &'a dyn Fn(&dyn Reads, i64) -> crate::manifest::Result<Option<BackfillDetail>>;

fn shown_with(
    conn: &dyn Reads,
    project: Option<&Project>,
    id: i64,
    json: bool,
    backfill: Fetch<'_>,
    member: Fetch<'_>,
) -> crate::manifest::Result<Option<Shown>> {
    let Some(mut detail) = backfill(conn, id)? else {
        return Ok(None);
    };
    let ctx = lease_ctx(project, conn)?;
    judge_owners(std::slice::from_mut(&mut detail.backfill), &ctx);
    // Labels in the DAG's timezone while the DAG is in the project; UTC otherwise.
    let dag = project.and_then(|p| p.dag(&detail.backfill.dag_id).ok());
    // A cascade's first backfill shows the whole cascade, grouped by DAG.
    let mut members = Vec::new();
    if detail.backfill.cascade.is_some() {
        let ids = conn.cascade_members(id)?;
        for m in ids.iter().map(|b| b.id) {
            if let Some(mut d) = member(conn, m)? {
                judge_owners(std::slice::from_mut(&mut d.backfill), &ctx);
                no_wait_without_a_process(&mut d);
                members.push(d);
            }
        }
    }
    judge_workers(&mut detail, &ctx, conn)?;
    no_wait_without_a_process(&mut detail);
    name_hosts(&mut detail, json);
    for m in &mut members {
        name_hosts(m, json);
    }
    // JSON carries the cascade's members inside the one document; people get a table each.
    if json && detail.backfill.cascade.is_some() {
        detail.cascade_backfills = Some(std::mem::take(&mut members));
    }
    Ok(Some(Shown {
        detail,
        members,
        dag,
        ctx,
    }))
}

/// A backfill none of whose processes runs (killed while its intervals waited for their
/// sources) waits for nothing: the intervals the manifest records as waiting show as not
/// started, as `/metrics` counts them, until `resume` asks again.
fn no_wait_without_a_process(detail: &mut BackfillDetail) {
    if detail.backfill.owner_alive || detail.workers.iter().any(|w| w.alive) {
        return;
    }
    for d in &mut detail.interval_details {
        if matches!(
            d.state,
            Some(crate::state::IntervalState::WaitingForSources(_))
        ) {
            d.state = None;
            for r in &mut d.ready {
                r.left_ms = None;
            }
        }
    }
}

/// Whether each worker of a backfill is alive, judged as owners are.
fn judge_workers(
    detail: &mut BackfillDetail,
    ctx: &LeaseCtx,
    conn: &dyn Reads,
) -> crate::manifest::Result<()> {
    if detail.workers.is_empty() {
        return Ok(());
    }
    let workers = conn.workers(detail.backfill.id)?;
    for s in &mut detail.workers {
        s.alive = workers.iter().any(|w| w.id == s.id && w.alive(ctx));
    }
    Ok(())
}

/// The hosts of a backfill's workers and tries by their names. A table shows the tries' only
/// when a try ran on another host than this one (the column is left out when every cell is
/// empty); JSON always does.
fn name_hosts(detail: &mut BackfillDetail, json: bool) {
    let here = crate::liveness::Host::name(&crate::process::LOCAL);
    let elsewhere = detail
        .interval_details
        .iter()
        .any(|i| crate::liveness::elsewhere(i.host.as_deref(), &here).is_some());
    for w in &mut detail.workers {
        w.host = w
            .host
            .take()
            .map(|h| crate::liveness::host_name(&h).to_string());
    }
    for i in &mut detail.interval_details {
        i.host = i
            .host
            .take()
            .filter(|_| json || elsewhere)
            .map(|h| crate::liveness::host_name(&h).to_string());
    }
}

/// What the kept versions of each SQL target of the DAG cost, read without creating or
/// changing a warehouse (one that does not exist keeps nothing).
pub(crate) fn kept_versions(
    dag: &Dag,
    manifest_path: &std::path::Path,
) -> Vec<crate::warehouse::versions::Storage> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for task in &dag.tasks {
        let crate::project::TaskKind::Sql(sql) = &task.kind else {
            continue;
        };
        if !seen.insert((sql.warehouse.name.clone(), sql.target.clone())) {
            continue;
        }
        let manifest = crate::manifest::identity(manifest_path).unwrap_or_default();
        out.push(crate::warehouse::backend_of(&sql.warehouse).storage(sql, &manifest));
    }
    out
}

/// A published partition whose target no longer holds as many rows as were published: rows
/// deleted or added behind the manifest's back (a truncated table, a fix by hand, a restore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unlike {
    pub task_id: String,
    pub interval: crate::interval::DataInterval,
    pub published: i64,
    pub now: i64,
}

/// The partitions of the DAG's SQL tasks that replace their partition (`write = "replace"`;
/// a merge's partition may hold rows it did not write) recorded as published with a start
/// between `lo` and `hi`, whose target holds another number of rows now (none when the
/// manifest holds another project's backfills of the DAG). A warehouse that
/// cannot be read is left out: what this says is a warning, and the run that follows reports
/// such a warehouse itself.
pub(crate) fn unlike_published(
    project: &Project,
    dag: &Dag,
    conn: &dyn crate::manifest::Reads,
    (lo, hi): (i64, i64),
    reprs: &std::collections::HashMap<String, Option<crate::warehouse::Repr>>,
) -> crate::manifest::Result<Vec<Unlike>> {
    // Another project's records of a DAG of the same id are not about this project's
    // warehouses.
    let found = conn.dag_projects(&dag.id)?;
    if crate::manifest::backfills::other_project(&project.name, &found).is_some() {
        return Ok(Vec::new());
    }
    let recorded = conn.published_partitions(&dag.id, lo, hi)?;
    let mut out = Vec::new();
    for task in &dag.tasks {
        let crate::project::TaskKind::Sql(sql) = &task.kind else {
            continue;
        };
        if sql.write != crate::project::WritePattern::Replace {
            continue;
        }
        let mine: Vec<_> = recorded.iter().filter(|r| r.task_id == task.id).collect();
        if mine.is_empty() {
            continue;
        }
        let intervals: Vec<_> = mine.iter().map(|r| r.interval).collect();
        let repr = reprs.get(&task.id).copied().flatten();
        let counted = crate::warehouse::backend_of(&sql.warehouse)
            .partition_rows(sql, repr, &intervals, dag.tz);
        let Ok(now) = counted else {
            tracing::debug!(task = %task.id, "the target's partitions could not be counted");
            continue;
        };
        for (r, now) in mine.into_iter().zip(now) {
            if r.rows != now {
                out.push(Unlike {
                    task_id: task.id.clone(),
                    interval: r.interval,
                    published: r.rows,
                    now,
                });
            }
        }
    }
    Ok(out)
}
