//! `create --cascade`: after the backfill of a DAG, one backfill per DAG downstream of it, one
//! DAG after the other, each planned from what its upstream backfills of the cascade did. A
//! downstream backfill is an ordinary backfill (leases, heartbeat, gate, `resume`, `cancel`)
//! that names the cascade's first backfill (`cascade_of`); `resume` of any of them continues
//! the cascade.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;

use super::create::{Launch, check_tasks, launch, request_over, run_every};
use super::{Global, note};
use crate::cascade::{self, Mode};
use crate::cli::CreateArgs;
use crate::exit::{self, Error};
use crate::interval::DataInterval;
use crate::manifest::{self, Backfill, NewBackfill, backfills};
use crate::plan::SkipReason;
use crate::project::{Dag, Project, ProjectError};
use crate::state::{BackfillKind, BackfillState};

/// The worse of two exit codes: interrupted, then internal error, then failed, then success.
pub(super) fn worst(a: u8, b: u8) -> u8 {
    let rank = |c: u8| match c {
        exit::INTERRUPTED => 3,
        exit::INTERNAL => 2,
        exit::FAILED => 1,
        _ => 0,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// Every DAG of the project, for a cascade: every DAG file must load, as a broken one could
/// be downstream.
pub(super) fn all_dags(project: &Project) -> Result<Vec<Dag>, Error> {
    let (dags, errors) = project.load_all();
    if !errors.is_empty() {
        return Err(Error::Project(ProjectError::Config(errors)));
    }
    Ok(dags)
}

/// The backfills of a cascade after its first, oldest first.
fn members(conn: &Connection, root: i64) -> Result<Vec<Backfill>, Error> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {} FROM backfills WHERE cascade_of = ?1 ORDER BY id",
            backfills::COLUMNS
        ))
        .map_err(|e| Error::Manifest(e.into()))?;
    let rows = stmt
        .query_map([root], backfills::from_row)
        .map_err(|e| Error::Manifest(e.into()))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(|e| Error::Manifest(e.into()))
}

/// How many planned intervals of backfill `id` have not ended (not started, or cancelled):
/// a cascade goes on past it only once it has none.
fn unfinished(conn: &Connection, id: i64) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM plan p WHERE p.backfill_id = ?1 AND p.action = 'run'
           AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.backfill_id = p.backfill_id
                             AND r.interval_start = p.interval_start
                             AND r.state IN ('succeeded', 'failed', 'rejected'))",
        [id],
        |r| r.get(0),
    )
}

/// The intervals of downstream DAG `d` that the cascade plans, from what its upstream
/// backfills (`backfill_of`, by DAG) did, with the ones skipped for their upstream.
pub(super) fn plan_member(
    conn: &Connection,
    project: &Project,
    dags: &[Dag],
    d: &Dag,
    backfill_of: &HashMap<String, i64>,
    mode: Mode,
) -> Result<(Vec<DataInterval>, HashMap<i64, SkipReason>), Error> {
    let sql = |e: rusqlite::Error| Error::Manifest(manifest::Error::from(e));
    let mut upstream = Vec::new();
    for (u, _) in &d.upstream {
        if let Some(b) = backfill_of.get(u) {
            upstream.extend(cascade::upstream_outcomes(conn, u, *b).map_err(sql)?);
        }
    }
    let touched: Vec<DataInterval> = upstream
        .iter()
        .filter(|u| u.touched)
        .map(|u| u.interval)
        .collect();
    let intervals = cascade::overlapping(d, &touched).map_err(Error::Usage)?;
    // Upstream DAGs the cascade does not run count too: an interval another backfill runs, or
    // whose latest run failed, is not there to read.
    let outside: Vec<&String> = d
        .upstream
        .iter()
        .map(|(u, _)| u)
        .filter(|u| !backfill_of.contains_key(*u))
        .collect();
    if !outside.is_empty() && !intervals.is_empty() {
        let ctx = crate::manifest::leases::LeaseCtx::new(project.lease_timeout);
        for u in outside {
            if let Some(up) = dags.iter().find(|x| &x.id == u) {
                upstream.extend(
                    cascade::outside_outcomes(conn, up, &intervals, &ctx)
                        .map_err(|e| Error::Internal(format!("cascade over `{u}`: {e}")))?,
                );
            }
        }
    }
    let skips =
        cascade::decide(
            &intervals,
            &upstream,
            mode,
            &mut |i, u| match cascade::last_success(conn, &d.id, i.start.timestamp())? {
                None => Ok(true),
                Some(since) => {
                    cascade::changed_since(conn, &u.dag, u.interval.start.timestamp(), since)
                }
            },
        )
        .map_err(sql)?;
    Ok((intervals, skips))
}

/// The backfill of each DAG of the cascade of `root` so far, by DAG.
pub(super) fn backfills_of(
    conn: &Connection,
    root: i64,
    root_dag: &str,
) -> Result<(HashMap<String, i64>, Vec<Backfill>), Error> {
    let done = members(conn, root)?;
    let mut map: HashMap<String, i64> = HashMap::from([(root_dag.to_string(), root)]);
    for m in &done {
        map.insert(m.dag_id.clone(), m.id);
    }
    Ok((map, done))
}

/// Walks the DAGs a cascade of `root` runs, in order, as far as a plan can tell before they
/// run: each downstream DAG over the intervals that overlap those its upstreams go on with
/// (`root_intervals` for `root`; for another DAG, what `each` returns for it). A DAG that
/// overlaps nothing is left out.
pub(super) fn walk_chain(
    project: &Project,
    root: &str,
    root_intervals: Vec<DataInterval>,
    mut each: impl FnMut(&Dag, &[DataInterval]) -> Result<Vec<DataInterval>, Error>,
) -> Result<(), Error> {
    let mut planned: HashMap<String, Vec<DataInterval>> =
        HashMap::from([(root.to_string(), root_intervals)]);
    for d in cascade::downstream(&all_dags(project)?, root) {
        let ups: Vec<DataInterval> = d
            .upstream
            .iter()
            .filter_map(|(u, _)| planned.get(u))
            .flatten()
            .copied()
            .collect();
        let ivs = cascade::overlapping(d, &ups).map_err(Error::Usage)?;
        if ivs.is_empty() {
            continue;
        }
        let next = each(d, &ivs)?;
        planned.insert(d.id.clone(), next);
    }
    Ok(())
}

/// Checks, before anything runs, every DAG a cascade of `root` over `intervals` would run:
/// each loads, and each task renders and prepares over the intervals it would get.
pub(super) fn check_chain(
    project: &Project,
    root: &Dag,
    intervals: &[DataInterval],
    conf: &serde_json::Value,
) -> Result<(), Error> {
    walk_chain(project, &root.id, intervals.to_vec(), |d, ivs| {
        check_tasks(d, conf, ivs)?;
        Ok(ivs.to_vec())
    })
}

/// Runs the cascade's downstream DAGs that have not run yet (and resumes an interrupted one),
/// after its first backfill `root` ended. Goes past a backfill only once every interval it
/// planned has ended; stops at an interruption.
pub(super) fn continue_cascade(
    g: &Global,
    project: &Project,
    root: i64,
    root_dag: &str,
    mode: Mode,
) -> Result<u8, Error> {
    let dags = all_dags(project)?;
    let chain = cascade::downstream(&dags, root_dag);
    let path = g.manifest_path(Some(project))?;
    let at = |e: rusqlite::Error| Error::Manifest(manifest::Error::from(e).at(&path));
    let conn = manifest::open_read_only(&path)?;
    let Some(first) = backfills::get(&conn, root).map_err(|e| e.at(&path))? else {
        return Err(Error::Internal(format!("cascade backfill {root} vanished")));
    };
    let done = members(&conn, root)?;
    drop(conn);
    let mut backfill_of: HashMap<String, i64> = HashMap::from([(root_dag.to_string(), root)]);
    let mut code = exit::OK;
    for &d in &chain {
        if let Some(child) = done.iter().rev().find(|c| c.dag_id == d.id) {
            backfill_of.insert(d.id.clone(), child.id);
            if matches!(
                child.state,
                BackfillState::Running | BackfillState::Cancelled
            ) {
                let c = super::resume::resume_one(g, child.id)?;
                code = worst(code, c);
                if c == exit::INTERRUPTED {
                    return Ok(code);
                }
            }
            continue;
        }
        let conn = manifest::open_read_only(&path)?;
        // An upstream backfill with intervals still to run (stopped by --max-failures, say):
        // the downstream DAGs wait for it.
        for (u, _) in &d.upstream {
            let Some(b) = backfill_of.get(u) else {
                continue;
            };
            let left = unfinished(&conn, *b).map_err(at)?;
            if left > 0 {
                note(
                    g,
                    &format!(
                        "cascade: DAG `{}` waits for backfill {b} of `{u}`, which has {} left; `{}` continues it, then the cascade",
                        d.id,
                        crate::report::out::plural(left, "interval", "intervals"),
                        crate::report::out::hint(&format!("resume {b}"))
                    ),
                );
                return Ok(code);
            }
        }
        let (intervals, skips) = plan_member(&conn, project, &dags, d, &backfill_of, mode)?;
        drop(conn);
        if intervals.is_empty() {
            note(
                g,
                &format!(
                    "cascade: no interval of DAG `{}` overlaps what its upstream backfills ran",
                    d.id
                ),
            );
            continue;
        }
        let conf = first.conf_json()?;
        let reprs = check_tasks(d, &conf, &intervals)?;
        let request = NewBackfill {
            allow_drift: first.allow_drift,
            max_failures: first.max_failures,
            cascade_of: Some(root),
            ..request_over(
                d,
                &intervals,
                BackfillKind::Run,
                first.conf.clone(),
                d.max_active_runs.unwrap_or(first.max_active_runs),
            )
        };
        let options = run_every(d.depends_on_past)?;
        let (c, id) = launch(
            g,
            project,
            Launch {
                dag: d.clone(),
                conf,
                intervals,
                request,
                options,
                changed: &HashSet::new(),
                upstream: &skips,
                reprs,
                mode: crate::runner::Mode::Run,
            },
        )?;
        if let Some(id) = id {
            backfill_of.insert(d.id.clone(), id);
        }
        code = worst(code, c);
        if c == exit::INTERRUPTED {
            return Ok(code);
        }
    }
    Ok(code)
}

/// After a backfill without `--cascade`: names the DAGs downstream of it, whose partitions
/// may now be stale, and the command that would cascade.
pub(super) fn name_stale_downstream(g: &Global, project: &Project, dag: &str, args: &CreateArgs) {
    let (dags, _) = project.load_all();
    let below: Vec<String> = cascade::downstream(&dags, dag)
        .iter()
        .map(|d| format!("`{}`", d.id))
        .collect();
    if below.is_empty() {
        return;
    }
    let command = crate::report::out::hint(&format!(
        "create --dag {dag} --from {} --to {} --reprocess-behavior completed --cascade changed",
        crate::report::out::shell_word(&args.from),
        crate::report::out::shell_word(&args.to)
    ));
    note(
        g,
        &format!(
            "{} downstream of `{dag}` may now be stale over this range; `{command}` backfills {} where what {} read changed",
            below.join(", "),
            if below.len() == 1 { "it" } else { "them" },
            if below.len() == 1 { "it" } else { "they" },
        ),
    );
}
