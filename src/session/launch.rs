//! Launching a backfill: check every task, recover what dead owners left on the DAG's leases,
//! write the backfill and its plan with leases in bounded chunks, then run it through the
//! dispatcher. Every kind of backfill (create, stage, promote, rollback, a cascade's
//! downstream DAGs) goes through [`launch`]; `resume` writes what is left of its plan with
//! [`write_plan`].

use std::collections::{HashMap, HashSet};

use super::beat::Beating;
use super::execute::{Execution, execute};
use super::tasks::upstream_dags;
use super::{Global, note, warn};
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Range};
use crate::manifest::leases::{Judge, LeaseCtx};
use crate::manifest::writer::Writer;
use crate::manifest::{self, NewBackfill, Owner};
use crate::plan::{self, Action, PlanRow, Planner, Prior, Reprocess, SkipReason};
use crate::project::Dag;
use crate::recovery::{self, Dags};
use crate::state::BackfillKind;
use crate::warehouse::Repr;

/// Intervals planned and leased per manifest transaction: small enough that other backfills'
/// heartbeats never wait long for the write lock.
pub(crate) const PLAN_CHUNK: usize = 5_000;

/// The plan a dry run prints for one DAG, and its estimate.
pub(crate) fn dry_plan(
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    dag: &Dag,
    intervals: &[DataInterval],
    options: plan::Options,
    changed: &HashSet<i64>,
    max_active_runs: u32,
) -> Result<(Vec<PlanRow>, crate::estimate::Estimate), Error> {
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
    let conn = manifest::open_if_exists(manifest_path)?;
    if let Some(conn) = &conn {
        super::belonging::check_dag(project, manifest_path, &**conn, dag)?;
    }
    let (prior, before) = match &conn {
        Some(conn) => {
            let before = conn
                .state_before(&dag.id, intervals[0].start.timestamp())
                .map_err(|e| e.at(manifest_path))?;
            let mut prior = conn
                .priors(&dag.id, intervals, &ctx, Judge::Predict)
                .map_err(|e| e.at(manifest_path))?;
            mark_changed(&mut prior, intervals, changed);
            (prior, before)
        }
        None => (vec![Prior::default(); intervals.len()], None),
    };
    let rows = plan::plan(intervals, &prior, before, options);
    let history = match &conn {
        Some(conn) => crate::estimate::history(&**conn, dag).map_err(|e| e.at(manifest_path))?,
        None => Default::default(),
    };
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    let estimate = crate::estimate::estimate(
        dag,
        &history,
        to_run,
        max_active_runs,
        (&project.pools, &project.pool_rates),
    );
    Ok((rows, estimate))
}

/// The request of a backfill that runs every one of `intervals` (ascending, not empty) of
/// `dag`, whatever ran before: a promote, a rollback, a cascade's downstream backfill. Its range
/// is the intervals it was given; callers set what else differs.
pub(crate) fn request_over(
    dag: &Dag,
    intervals: &[DataInterval],
    kind: BackfillKind,
    conf: String,
    max_active_runs: u32,
) -> NewBackfill {
    let labels = crate::report::Labeler::new(dag);
    let (first, last) = (intervals[0], intervals[intervals.len() - 1]);
    NewBackfill {
        dag_id: dag.id.clone(),
        from_arg: labels.when(first.start),
        to_arg: labels.when(last.start),
        range_start: first.start.timestamp(),
        range_end: last.start.timestamp() + 1,
        reprocess: Reprocess::Completed,
        max_active_runs,
        run_backwards: false,
        allow_drift: false,
        conf,
        kind,
        source_backfill: None,
        tasks: None,
        max_failures: None,
        cascade: None,
        cascade_of: None,
        sample: None,
        definition: None,
        batch_size: None,
        project: None,
        warehouses: None,
        atomic: false,
        wait_ready: None,
        require_ready: false,
    }
}

/// The plan options of such a backfill: every interval runs, oldest first.
pub(crate) fn run_every(depends_on_past: bool) -> Result<plan::Options, Error> {
    Ok(plan::Options {
        reprocess: Reprocess::Completed,
        run_backwards: false,
        depends_on_past,
        now: clock::now()?,
    })
}

/// A backfill to write and run.
pub(crate) struct Launch<'a> {
    pub dag: Dag,
    pub conf: serde_json::Value,
    /// Its intervals, ascending.
    pub intervals: Vec<DataInterval>,
    pub request: NewBackfill,
    pub options: plan::Options,
    /// Intervals whose source changed (`--reprocess-behavior changed`).
    pub changed: &'a HashSet<i64>,
    /// A cascade's intervals skipped for their upstream.
    pub upstream: &'a HashMap<i64, SkipReason>,
    pub reprs: HashMap<String, Option<Repr>>,
    pub mode: crate::runner::Mode,
}

/// Recovers what dead owners left on the DAG's leases, writes the backfill and its plan, then
/// runs it: the exit code, and the backfill's id once it was written.
pub(crate) fn launch(
    g: &Global,
    project: &crate::project::Project,
    l: Launch<'_>,
) -> Result<(u8, Option<i64>), Error> {
    let Launch {
        dag,
        conf,
        intervals,
        request,
        options,
        changed,
        upstream,
        reprs,
        mode,
    } = l;
    let manifest_path = g.manifest_path(Some(project))?;
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
    let request = manifest::NewBackfill {
        definition: Some(super::tasks::definition_json(&dag)),
        project: Some(project.name.clone()),
        warehouses: super::belonging::warehouses_of(&dag),
        ..request
    };
    let max_active_runs = request.max_active_runs;
    let allow_drift = request.allow_drift;
    let max_failures = request.max_failures;
    let ready = super::execute::Readiness::recorded(request.wait_ready, request.require_ready);
    let tasks = request.tasks.clone();
    let upstream_dags = upstream_dags(project, &dag, request.cascade_of.is_some());
    crate::limits::room_for_runs(max_active_runs, None)?;
    let writer = Writer::open(&manifest_path, project.durability)?;
    let dags = Dags::of(project);
    let mut created = None;
    let result = (|| {
        // Another project's backfills of the DAG are neither recovered nor planned over.
        let found = {
            let dag_id = dag.id.clone();
            writer.call_blocking(move |c| c.dag_projects(&dag_id))?
        };
        if let Some(theirs) = super::belonging::other_project(&project.name, &found) {
            return Err(super::belonging::dag_refused(
                project,
                &manifest_path,
                &dag,
                theirs,
            ));
        }
        let report = recovery::release_stale(&writer, &dags, &dag.id, &ctx, None)?;
        for w in &report.warnings {
            warn(g, w);
        }
        crate::fault::point("after-release-stale");
        let first = ctx.refreshed();
        created = Some(crate::clock::Mark::now());
        // Looked at again in the transaction that records the backfill: another project's may
        // have been recorded since.
        let name = project.name.clone();
        let inserted = writer.call_blocking(move |c| {
            let found = c.dag_projects(&request.dag_id)?;
            match super::belonging::other_project(&name, &found) {
                Some(theirs) => Ok(Err(theirs.clone())),
                None => Ok(Ok(c.insert_backfill(&request, &first)?)),
            }
        })?;
        let owner = inserted.map_err(|theirs| {
            super::belonging::dag_refused(project, &manifest_path, &dag, &theirs)
        })?;
        crate::crash::running(owner.backfill_id);
        let beat = Beating::start(&writer, owner);
        let planned = write_plan(
            &writer,
            owner,
            &dag,
            &intervals,
            options,
            Marks {
                already: &HashSet::new(),
                changed,
                upstream,
            },
            &ctx,
        )?;
        drop(beat);
        crate::fault::point("after-plan");
        Ok::<_, Error>((owner, planned))
    })();
    let (owner, planned) = match result {
        Ok(v) => v,
        Err(e) => {
            writer.close();
            return taken_over(e).map(|code| (code, None));
        }
    };
    let to_run = planned.to_run;
    if !g.quiet && !g.json {
        crate::report::out::say(&format!(
            "backfill {} of {}: {}, {} to run, {} skipped, up to {max_active_runs} at a time{}",
            owner.backfill_id,
            dag.id,
            crate::report::out::plural(planned.total as i64, "interval", "intervals"),
            to_run.len(),
            planned.total - to_run.len(),
            if dag.batch_size > 1 && !dag.depends_on_past {
                format!(" (batches of up to {} intervals)", dag.batch_size)
            } else {
                String::new()
            }
        ));
    }
    let code = execute(
        g,
        project,
        Execution {
            owner,
            dag,
            conf,
            max_active_runs,
            intervals: to_run,
            allow_drift,
            reprs,
            max_failures,
            tasks,
            mode,
            upstream: upstream_dags,
            created,
            ready,
        },
        writer,
    )?;
    Ok((code, Some(owner.backfill_id)))
}

/// A backfill taken over by another process while this one recovered or planned ends here as
/// interrupted (130); any other error stays what it is.
pub(crate) fn taken_over(e: Error) -> Result<u8, Error> {
    match e {
        Error::Manifest(manifest::Error::Fenced { backfill_id }) => {
            crate::report::out::say(&format!(
                "backfill {backfill_id} was taken over by another process while it was being prepared; `{}` tells what it did",
                crate::report::out::hint(&format!("show {backfill_id}"))
            ));
            Ok(exit::INTERRUPTED)
        }
        other => Err(other),
    }
}

/// Interval starts `s` with `start <= s < end` in whole unix seconds, for the manifest: the
/// same bounds every command resolves a range to.
pub(crate) fn unix_range(range: Range) -> (i64, i64) {
    let (first, last) = range.unix_start_bounds();
    (first, last.saturating_add(1))
}

/// The plan as written.
pub(crate) struct Planned {
    pub total: usize,
    /// The intervals to run, in execution order.
    pub to_run: Vec<DataInterval>,
}

/// What is known of intervals before they are planned: those that already have a plan row
/// (from an interrupted planning), and those whose source changed (`changed`).
#[derive(Clone, Copy)]
pub(crate) struct Marks<'a> {
    pub already: &'a HashSet<i64>,
    pub changed: &'a HashSet<i64>,
    /// A cascade's downstream intervals skipped for their upstream, by start.
    pub upstream: &'a HashMap<i64, SkipReason>,
}

/// Plans `intervals` (ascending) and writes the plan with its leases in chunks of
/// [`PLAN_CHUNK`], one transaction each, then records the plan as complete. Intervals whose
/// start is in `already` have a plan row from an earlier, interrupted planning and are left out.
pub(crate) fn write_plan(
    writer: &Writer,
    owner: Owner,
    dag: &Dag,
    intervals: &[DataInterval],
    options: plan::Options,
    marks: Marks<'_>,
    ctx: &LeaseCtx,
) -> Result<Planned, Error> {
    let Marks {
        already,
        changed,
        upstream,
    } = marks;
    let total = intervals.len();
    let todo: Vec<(usize, DataInterval)> = intervals
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, i)| !already.contains(&i.start.timestamp()))
        .collect();
    let mut planner: Option<Planner> = None;
    let mut to_run: Vec<(usize, DataInterval)> = Vec::new();
    for chunk in todo.chunks(PLAN_CHUNK) {
        let (dag_id, ctx) = (dag.id.clone(), ctx.refreshed());
        let chunk_intervals: Vec<DataInterval> = chunk.iter().map(|(_, i)| *i).collect();
        let ords: Vec<usize> = chunk
            .iter()
            .map(|(index, _)| plan::ord(*index, total, options.run_backwards))
            .collect();
        let carried = planner.take();
        let chunk_upstream: HashMap<i64, SkipReason> = chunk_intervals
            .iter()
            .filter_map(|i| {
                let s = i.start.timestamp();
                upstream.get(&s).map(|r| (s, *r))
            })
            .collect();
        let chunk_changed: HashSet<i64> = chunk_intervals
            .iter()
            .map(|i| i.start.timestamp())
            .filter(|s| changed.contains(s))
            .collect();
        let (rows, carried) = writer.call_blocking(move |c| {
            let mut p = match carried.clone() {
                Some(p) => p,
                None => Planner::new(
                    c.state_before(&dag_id, chunk_intervals[0].start.timestamp())?,
                    options,
                ),
            };
            let mut prior = c.priors(&dag_id, &chunk_intervals, &ctx, Judge::Strict)?;
            mark_changed(&mut prior, &chunk_intervals, &chunk_changed);
            let rows: Vec<(i64, PlanRow)> = chunk_intervals
                .iter()
                .zip(prior)
                .zip(ords.iter().copied())
                .map(|((interval, prior), ord)| {
                    (
                        i64::try_from(ord).unwrap_or(i64::MAX),
                        PlanRow {
                            interval: *interval,
                            action: p.next_forced(
                                interval,
                                prior,
                                chunk_upstream.get(&interval.start.timestamp()).copied(),
                            ),
                        },
                    )
                })
                .collect();
            c.insert_plan_chunk(c.fence(owner)?, &dag_id, &rows, &ctx)?;
            Ok((rows, p))
        })?;
        planner = Some(carried);
        crate::fault::point("plan-chunk");
        to_run.extend(
            rows.iter()
                .filter(|(_, r)| r.action == Action::Run)
                .map(|(ord, r)| (usize::try_from(*ord).unwrap_or(usize::MAX), r.interval)),
        );
    }
    writer.call_blocking(move |c| c.mark_planned(owner))?;
    to_run.sort_unstable_by_key(|(ord, _)| *ord);
    tracing::info!(
        backfill = owner.backfill_id,
        dag = %dag.id,
        intervals = total,
        to_run = to_run.len(),
        "planned and leased"
    );
    Ok(Planned {
        total,
        to_run: to_run.into_iter().map(|(_, i)| i).collect(),
    })
}

/// Marks the intervals whose source changed, for `--reprocess-behavior changed`.
fn mark_changed(prior: &mut [Prior], intervals: &[DataInterval], changed: &HashSet<i64>) {
    for (p, i) in prior.iter_mut().zip(intervals) {
        p.source_changed = changed.contains(&i.start.timestamp());
    }
}

/// For `--reprocess-behavior changed`: the starts of the intervals (of those whose latest run
/// succeeded) whose source changed since, by the tasks' gate `source_count` and
/// `source_fingerprint`. Says which tasks cannot tell.
pub(crate) fn source_changes(
    g: &Global,
    project: &crate::project::Project,
    dag: &Dag,
    conf: &serde_json::Value,
    intervals: &[DataInterval],
    manifest_path: &std::path::Path,
) -> Result<HashSet<i64>, Error> {
    let (watching, blind) = crate::probe::watchers(dag);
    // A cron job with `-q` must still hear that it can miss late data.
    if let Some(spot) = crate::probe::blind_spot(dag) {
        warn(g, &spot.warning(dag));
    } else if !blind.is_empty() {
        note(g, &crate::probe::partly_blind(&watching, &blind));
    }
    if watching.is_empty() {
        return Ok(HashSet::new());
    }
    let Some(conn) = manifest::open_if_exists(manifest_path)? else {
        return Ok(HashSet::new());
    };
    let (Some(first), Some(last)) = (intervals.first(), intervals.last()) else {
        return Ok(HashSet::new());
    };
    let recorded = conn
        .recorded_sources(&dag.id, first.start.timestamp(), last.start.timestamp())
        .map_err(|e| e.at(manifest_path))?;
    drop(conn);
    let stale = crate::probe::survey(&project.root, dag, conf, &recorded);
    for s in stale.iter().filter(|s| s.now.is_none()) {
        warn(
            g,
            &format!(
                "task `{}` at {}: {}; the interval runs again",
                s.task, s.interval.start, s.why
            ),
        );
    }
    Ok(stale
        .iter()
        .map(|s| s.interval.start.0.timestamp())
        .collect())
}

/// `--conf` must be a JSON object.
pub(crate) fn parse_conf(conf: Option<&str>) -> Result<serde_json::Value, Error> {
    let Some(text) = conf else {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err(Error::Usage(format!(
            "--conf must be a JSON object such as '{{\"region\": \"eu\"}}', got `{text}`"
        ))),
        Err(e) => Err(Error::Usage(format!(
            "--conf is not valid JSON ({e}); pass an object such as '{{\"region\": \"eu\"}}'"
        ))),
    }
}

/// A sample: its intervals (ascending) and why each was picked, by start.
pub(crate) type Sampled = (Vec<DataInterval>, HashMap<i64, &'static str>);

/// The intervals a `--sample N` backfill runs, picked from `intervals` (ascending) by
/// [`crate::sample::pick`] over those already complete, with why each was picked (by start);
/// `None` when the range has no more than N complete intervals, which then all run.
pub(crate) fn sample_of(
    manifest: Option<&dyn crate::manifest::Reads>,
    manifest_path: &std::path::Path,
    dag: &Dag,
    intervals: &[DataInterval],
    n: u32,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<Sampled>, Error> {
    let complete: Vec<DataInterval> = intervals.iter().copied().filter(|i| i.end <= now).collect();
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if complete.len() <= n {
        return Ok(None);
    }
    // The history: intervals whose latest run failed or was rejected are worth a rehearsal.
    let unsuccessful: HashSet<i64> = match (manifest, complete.first(), complete.last()) {
        (Some(m), Some(first), Some(last)) => m
            .latest_runs(&dag.id, first.start.timestamp(), last.start.timestamp())
            .map_err(|e| e.at(manifest_path))?
            .into_iter()
            .filter(|(_, (state, _, _))| {
                matches!(
                    state,
                    crate::plan::RunState::Failed | crate::plan::RunState::Rejected
                )
            })
            .map(|(start, _)| start)
            .collect(),
        _ => HashSet::new(),
    };
    let picked = crate::sample::pick(&complete, n, dag.tz, &unsuccessful);
    let why = picked
        .iter()
        .map(|(&i, r)| (complete[i].start.timestamp(), r.as_str()))
        .collect();
    Ok(Some((picked.keys().map(|&i| complete[i]).collect(), why)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `--conf` is any string a user can type: it parses into an object or is refused with
        /// a message, never a panic.
        #[test]
        fn conf_never_panics(text in any::<String>(), json in "[{}\\[\\]\":,0-9a-zé ]{0,40}") {
            for t in [text, json] {
                match parse_conf(Some(&t)) {
                    Ok(v) => prop_assert!(v.is_object()),
                    Err(e) => prop_assert!(e.to_string().contains("--conf")),
                }
            }
        }
    }
}
