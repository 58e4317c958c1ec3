//! A cascade's chain as the manifest knows it: which backfill runs each DAG of the cascade so
//! far, which intervals of a downstream DAG it plans (and which it skips for their upstream),
//! and the walk of the chain that checks every DAG before the first runs.
//!
//! A downstream DAG's intervals are planned over the upstream intervals the cascade acted on,
//! and also over those it left because their output already stands (`already exists`) where
//! the downstream interval has no successful run: nothing of it is published, and without
//! this no cascade over the range would ever compute it (September's days done, a cascade
//! over September and October ran only October's month).

use std::collections::{HashMap, HashSet};

use super::tasks::check_tasks;
use crate::cascade::{self, Mode};
use crate::exit::{self, Error};
use crate::interval::DataInterval;
use crate::manifest::{Backfill, Reads};
use crate::plan::SkipReason;
use crate::project::{Dag, Project, ProjectError};

/// The worse of two exit codes: interrupted, then internal error, then failed, then success.
pub(crate) fn worst(a: u8, b: u8) -> u8 {
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
pub(crate) fn all_dags(project: &Project) -> Result<Vec<Dag>, Error> {
    let (dags, errors) = project.load_all();
    if !errors.is_empty() {
        return Err(Error::Project(ProjectError::Config(errors)));
    }
    Ok(dags)
}

/// The intervals of downstream DAG `d` that the cascade plans, from what its upstream
/// backfills (`backfill_of`, by DAG) did, with the ones skipped for their upstream.
pub(crate) fn plan_member(
    conn: &dyn Reads,
    project: &Project,
    dags: &[Dag],
    d: &Dag,
    backfill_of: &HashMap<String, i64>,
    mode: Mode,
) -> Result<(Vec<DataInterval>, HashMap<i64, SkipReason>), Error> {
    let mut upstream = Vec::new();
    let mut known: HashMap<&str, HashSet<i64>> = HashMap::new();
    for (u, _) in &d.upstream {
        if let Some(b) = backfill_of.get(u) {
            let outcomes = cascade::upstream_outcomes(conn, u, *b)?;
            known.insert(
                u.as_str(),
                outcomes
                    .iter()
                    .map(|o| o.interval.start.timestamp())
                    .collect(),
            );
            upstream.extend(outcomes);
        }
    }
    let touched: Vec<DataInterval> = upstream
        .iter()
        .filter(|u| u.touched)
        .map(|u| u.interval)
        .collect();
    let standing: Vec<DataInterval> = upstream
        .iter()
        .filter(|u| !u.touched && u.succeeded)
        .map(|u| u.interval)
        .collect();
    let intervals = downstream_intervals(Some(conn), d, &touched, &standing)?;
    // Every upstream interval a downstream one overlaps counts, not only those the cascade
    // planned: one another backfill runs, or whose latest run failed, is not there to read,
    // whether its DAG is in the cascade or not.
    if !intervals.is_empty() {
        let ctx =
            crate::manifest::leases::LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
        let none = HashSet::new();
        for (u, _) in &d.upstream {
            if let Some(up) = dags.iter().find(|x| &x.id == u) {
                let known = known.get(u.as_str()).unwrap_or(&none);
                upstream.extend(
                    cascade::outside_outcomes(conn, up, &intervals, &ctx, known)
                        .map_err(|e| Error::Internal(format!("cascade over `{u}`: {e}")))?,
                );
            }
        }
    }
    let skips = cascade::decide(&intervals, &upstream, mode, &mut |i, u| match conn
        .last_success(&d.id, i.start.timestamp())?
    {
        None => Ok(true),
        Some(since) => cascade::changed_since(conn, &u.dag, u.interval.start.timestamp(), since),
    })
    .map_err(Error::Manifest)?;
    Ok((intervals, skips))
}

/// The intervals of downstream DAG `d` a cascade plans, ascending: those overlapping an upstream
/// interval the cascade acted on (`touched`), and those overlapping an upstream interval whose
/// output it left standing (`standing`) that have no successful run of their own in the
/// manifest (`None`: nothing was recorded).
pub(crate) fn downstream_intervals(
    conn: Option<&dyn Reads>,
    d: &Dag,
    touched: &[DataInterval],
    standing: &[DataInterval],
) -> Result<Vec<DataInterval>, Error> {
    let mut intervals = cascade::overlapping(d, touched).map_err(Error::Usage)?;
    if standing.is_empty() {
        return Ok(intervals);
    }
    let planned: std::collections::HashSet<i64> =
        intervals.iter().map(|i| i.start.timestamp()).collect();
    for i in cascade::overlapping(d, standing).map_err(Error::Usage)? {
        let start = i.start.timestamp();
        if planned.contains(&start) {
            continue;
        }
        let published = match conn {
            Some(conn) => conn
                .last_success(&d.id, start)
                .map_err(Error::Manifest)?
                .is_some(),
            None => false,
        };
        if !published {
            intervals.push(i);
        }
    }
    intervals.sort_unstable();
    Ok(intervals)
}

/// The backfill of each DAG of the cascade of `root` so far, by DAG.
pub(crate) fn backfills_of(
    conn: &dyn Reads,
    root: i64,
    root_dag: &str,
) -> Result<(HashMap<String, i64>, Vec<Backfill>), Error> {
    let done = conn.cascade_members(root)?;
    let mut map: HashMap<String, i64> = HashMap::from([(root_dag.to_string(), root)]);
    for m in &done {
        map.insert(m.dag_id.clone(), m.id);
    }
    Ok((map, done))
}

/// Walks the DAGs a cascade of `root` runs, in order, as far as a plan can tell before they
/// run: each downstream DAG over the intervals that overlap those its upstreams go on with
/// (`root_intervals` for `root`; for another DAG, what `each` returns for it), and over
/// `root_standing`, the root's intervals whose output stands, where it has no successful run
/// in the manifest `conn`. A DAG that overlaps nothing is left out.
pub(crate) fn walk_chain(
    project: &Project,
    conn: Option<&dyn Reads>,
    root: &str,
    root_intervals: Vec<DataInterval>,
    root_standing: Vec<DataInterval>,
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
        let standing: &[DataInterval] = if d.upstream.iter().any(|(u, _)| u == root) {
            &root_standing
        } else {
            &[]
        };
        let ivs = downstream_intervals(conn, d, &ups, standing)?;
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
pub(crate) fn check_chain(
    project: &Project,
    root: &Dag,
    intervals: &[DataInterval],
    conf: &serde_json::Value,
) -> Result<(), Error> {
    walk_chain(
        project,
        None,
        &root.id,
        intervals.to_vec(),
        Vec::new(),
        |d, ivs| {
            check_tasks(d, conf, ivs)?;
            Ok(ivs.to_vec())
        },
    )
}
