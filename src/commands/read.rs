//! `list`, `show` and `runs`: read the manifest (read-only); never create or change it. Their
//! tables and JSON documents go to stdout.

use std::path::PathBuf;

use crate::clock;
use crate::exit::{self, Error};
use crate::interval::resolve_args;
use crate::manifest::leases::LeaseCtx;
use crate::manifest::queries::{BackfillDetail, BackfillSummary};
use crate::manifest::{self, Reads};
use crate::project::Project;
use crate::report::out::Sink;
use crate::report::{self, Labeler};
use crate::session::{Global, note, unknown_backfill, warn};

/// The manifest to read: `None` when the project's own has not been created yet (nothing was
/// recorded). A `--manifest` path that does not exist is an error.
fn open(g: &Global, project: Option<&Project>) -> Result<(PathBuf, Option<Box<dyn Reads>>), Error> {
    let path = g.manifest_path(project)?;
    // A file named on purpose must exist; a PostgreSQL database without a manifest yet has
    // recorded nothing, as the project's own file before its first backfill.
    let conn = if g.manifest.is_some() && !manifest::is_url(&path) {
        Some(manifest::open_read_only(&path)?)
    } else {
        manifest::open_if_exists(&path)?
    };
    Ok((path, conn))
}

/// How a read judges leases and owners: with the project's lease timeout, from this host, at
/// the manifest's clock (the database's on PostgreSQL, read once here), as `resume` does.
pub(super) fn lease_ctx(
    project: Option<&Project>,
    conn: &dyn Reads,
) -> crate::manifest::Result<LeaseCtx> {
    let timeout = project.map_or(crate::project::DEFAULT_LEASE_TIMEOUT, |p| p.lease_timeout);
    LeaseCtx::new(timeout, &crate::process::LOCAL).at_manifest(conn)
}

/// Says whether each running backfill's owner is alive.
pub(super) fn judge_owners(list: &mut [BackfillSummary], ctx: &LeaseCtx) {
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
pub(super) fn backfills(
    conn: &dyn Reads,
    project: Option<&Project>,
    dag: Option<&str>,
    active: bool,
) -> crate::manifest::Result<Vec<BackfillSummary>> {
    let mut rows = conn.list_backfills(dag, active)?;
    judge_owners(&mut rows, &lease_ctx(project, conn)?);
    Ok(rows)
}

pub fn list(g: &Global, dag: Option<&str>, active: bool) -> Result<u8, Error> {
    let project = g.project().ok();
    let (path, conn) = open(g, project.as_ref())?;
    let rows = match &conn {
        Some(conn) => backfills(&**conn, project.as_ref(), dag, active).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    let what = match (dag, active) {
        (Some(d), true) => format!("no active backfills of DAG {d}"),
        (Some(d), false) => format!("no backfills of DAG {d}"),
        (None, true) => "no active backfills".to_string(),
        (None, false) => "no backfills yet".to_string(),
    };
    // Each DAG's file is read once, whatever the number of its backfills.
    let mut by_dag: std::collections::HashMap<&str, Labeler> = std::collections::HashMap::new();
    for b in &rows {
        by_dag.entry(b.dag_id.as_str()).or_insert_with(|| {
            Labeler::of(
                project
                    .as_ref()
                    .and_then(|p| p.dag(&b.dag_id).ok())
                    .as_ref(),
            )
        });
    }
    let labels = |dag: &str| {
        by_dag
            .get(dag)
            .cloned()
            .unwrap_or_else(|| Labeler::of(None))
    };
    report::list::write(&mut Sink::std(g.json, g.verbose), &rows, &labels, &what)?;
    Ok(exit::OK)
}

/// A backfill as `show` reads it: its detail (owners and workers judged, hosts named; with
/// `json`, a cascade's members inside it), the members of its cascade for people, and its DAG
/// when the project has it. `None` when the manifest has no such backfill.
pub(super) struct Shown {
    pub detail: BackfillDetail,
    pub members: Vec<BackfillDetail>,
    pub dag: Option<crate::project::Dag>,
    /// The manifest's clock when it was read (unix milliseconds), at which its owners and
    /// workers were judged.
    pub at_ms: i64,
}

pub(super) fn shown(
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
pub(super) fn shown_page(
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
                members.push(d);
            }
        }
    }
    judge_workers(&mut detail, &ctx, conn)?;
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
        at_ms: ctx.now_ms,
    }))
}

pub fn show(g: &Global, id: i64, grid: bool) -> Result<u8, Error> {
    if grid && g.json {
        return Err(Error::Usage(
            "show --grid draws cells for people; --output json has every interval: give one of them"
                .into(),
        ));
    }
    let project = g.project().ok();
    let (path, conn) = open(g, project.as_ref())?;
    let Some(conn) = conn else {
        return Err(unknown_backfill(id, &path));
    };
    let Some(Shown {
        detail,
        members,
        dag,
        ..
    }) = shown(&*conn, project.as_ref(), id, g.json).map_err(|e| e.at(&path))?
    else {
        return Err(unknown_backfill(id, &path));
    };
    let mut out = Sink::std(g.json, g.verbose);
    if grid {
        let fit = crate::report::out::Fit::stdout(false);
        let colour = console::Term::stdout().features().colors_supported()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        report::cells::write(
            &mut out,
            &detail,
            &Labeler::of(dag.as_ref()),
            fit.width,
            colour,
        )?;
        for m in &members {
            let member_dag = project
                .as_ref()
                .and_then(|p| p.dag(&m.backfill.dag_id).ok());
            out.line("")?;
            report::cells::write(
                &mut out,
                m,
                &Labeler::of(member_dag.as_ref()),
                fit.width,
                colour,
            )?;
        }
        return Ok(exit::OK);
    }
    let kept = dag.as_ref().map(|d| kept_versions(d, &path));
    report::show::write(
        &mut out,
        &detail,
        kept.as_deref(),
        &Labeler::of(dag.as_ref()),
    )?;
    if g.json {
        return Ok(exit::OK);
    }
    for m in &members {
        let member_dag = project
            .as_ref()
            .and_then(|p| p.dag(&m.backfill.dag_id).ok());
        out.line(&format!(
            "\ncascade: DAG `{}`, backfill {}",
            m.backfill.dag_id, m.backfill.id
        ))?;
        report::show::write(&mut out, m, None, &Labeler::of(member_dag.as_ref()))?;
    }
    Ok(exit::OK)
}

/// The hosts of a backfill's tries by their names. A table shows them only when a try ran on
/// another host than this one (the column is left out when every cell is empty); JSON always
/// does.
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
pub(super) fn kept_versions(
    dag: &crate::project::Dag,
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

pub fn runs(g: &Global, dag_id: &str, from: Option<&str>, to: Option<&str>) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id).ok();
    let (lo, hi) = match (from, to) {
        (Some(from), Some(to)) => {
            let dag = project.dag(dag_id)?;
            // The interval starts `create` would run for the same --from and --to.
            resolve_args(from, to, clock::now()?, dag.tz)?.unix_start_bounds()
        }
        _ => (i64::MIN, i64::MAX),
    };
    let (path, conn) = open(g, Some(&project))?;
    let rows = match conn {
        Some(conn) => conn.run_history(dag_id, lo, hi).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    let what = match (from, to) {
        (Some(f), Some(t)) => format!("no runs of DAG {dag_id} between --from {f} and --to {t}"),
        _ => format!("no runs of DAG {dag_id}"),
    };
    report::runs::write(
        &mut Sink::std(g.json, g.verbose),
        &rows,
        &Labeler::of(dag.as_ref()),
        &what,
    )?;
    Ok(exit::OK)
}

/// `backfill stale`: the intervals whose latest run succeeded and whose source changed since,
/// by the tasks' gate `source_count` and `source_fingerprint`. Runs nothing, writes nothing.
pub fn stale(
    g: &Global,
    dag_id: &str,
    from: &str,
    to: &str,
    conf: Option<&str>,
) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id)?;
    let conf = crate::session::launch::parse_conf(conf)?;
    let (lo, hi) = resolve_args(from, to, clock::now()?, dag.tz)?.unix_start_bounds();
    let (watching, blind) = crate::probe::watchers(&dag);
    if let Some(spot) = crate::probe::blind_spot(&dag) {
        warn(g, &spot.warning(&dag));
    } else if !blind.is_empty() {
        note(g, &crate::probe::partly_blind(&watching, &blind));
    }
    let (path, conn) = open(g, Some(&project))?;
    let recorded = match &conn {
        Some(conn) if !watching.is_empty() => conn
            .recorded_sources(dag_id, lo, hi)
            .map_err(|e| e.at(&path))?,
        _ => Default::default(),
    };
    // Intervals whose latest run did not publish have no source to compare with: said, with
    // how to run them.
    let unsettled = match &conn {
        Some(conn) => conn.unsettled(dag_id, lo, hi).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    if !unsettled.is_empty() {
        let total: i64 = unsettled.iter().map(|(_, n)| n).sum();
        let states: Vec<String> = unsettled
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect();
        note(
            g,
            &format!(
                "left out: {} whose latest run did not publish ({}); stale compares the sources of published intervals; run them with `{}`",
                crate::report::out::plural(total, "interval", "intervals"),
                states.join(", "),
                crate::words::hint(&format!(
                    "create --dag {dag_id} --from {} --to {} --reprocess-behavior failed",
                    crate::words::shell_word(from),
                    crate::words::shell_word(to)
                ))
            ),
        );
    }
    let stale = crate::probe::survey(&project.root, &dag, &conf, &recorded);
    let what = format!(
        "no interval of DAG {dag_id} between --from {from} and --to {to} has a changed source ({} looked at)",
        crate::report::out::plural(
            i64::try_from(recorded.len()).unwrap_or(i64::MAX),
            "published interval",
            "published intervals"
        )
    );
    report::stale::write(
        &mut Sink::std(g.json, g.verbose),
        &stale,
        &Labeler::of(Some(&dag)),
        &what,
    )?;
    Ok(exit::OK)
}
