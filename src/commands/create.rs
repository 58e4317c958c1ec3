//! `backfill create`: validate everything, recover what dead owners left on the DAG's leases,
//! write the plan and lease its intervals in bounded chunks, then run them (or, with
//! `--dry-run`, print the plan and write nothing).

use std::collections::{HashMap, HashSet};

use super::beat::Beating;
use super::execute::{Execution, execute};
use super::{Global, note, warn};
use crate::cli::CreateArgs;
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Range, expand_nonempty, resolve_args};
use crate::manifest::leases::{Judge, LeaseCtx};
use crate::manifest::writer::Writer;
use crate::manifest::{self, NewBackfill, Owner, backfills, plans};
use crate::plan::{self, Action, PlanRow, Planner, Prior, Reprocess, SkipReason};
use crate::project::{
    self, CommandSpec, ConfigError, Dag, Gate, ProjectError, SourceCount, TaskKind,
};
use crate::recovery::{self, Dags};
use crate::report::tables;
use crate::state::BackfillKind;
use crate::task::{command, template};
use crate::warehouse::{self, Repr};

/// Intervals planned and leased per manifest transaction: small enough that other backfills'
/// heartbeats never wait long for the write lock.
pub const PLAN_CHUNK: usize = 5_000;

pub fn run(g: &Global, args: CreateArgs) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = only_tasks(project.dag(&args.dag)?, &args.tasks)?;
    // `--tasks` as recorded: each once, in the DAG's order.
    let only: Option<Vec<String>> =
        (!args.tasks.is_empty()).then(|| dag.tasks.iter().map(|t| t.id.clone()).collect());
    if args.run_backwards && dag.depends_on_past {
        return Err(Error::Usage(format!(
            "--run-backwards cannot be used with DAG `{}`: it sets depends_on_past = true in {}, so each interval needs the one before it; drop --run-backwards",
            dag.id, dag.file
        )));
    }
    let conf = parse_conf(args.conf.as_deref())?;
    let now = clock::now()?;
    let range = resolve_args(&args.from, &args.to, now, dag.tz)?;
    let intervals = expand_nonempty(&dag.schedule, range, &args.from, &args.to)?;
    let reprs = check_tasks(&dag, &conf, &intervals)?;
    let reprocess = Reprocess::from(args.reprocess_behavior);
    let max_active_runs = args.max_active_runs.or(dag.max_active_runs).unwrap_or(1);
    let options = plan::Options {
        reprocess,
        run_backwards: args.run_backwards,
        depends_on_past: dag.depends_on_past,
        now,
    };
    let manifest_path = g.manifest_path(Some(&project))?;
    let changed = match reprocess {
        Reprocess::Changed => source_changes(g, &project, &dag, &conf, &intervals, &manifest_path)?,
        _ => HashSet::new(),
    };

    if args.dry_run {
        let (rows, estimate) = dry_plan(
            &project,
            &manifest_path,
            &dag,
            &intervals,
            options,
            &changed,
            max_active_runs,
        )?;
        let root = (dag, rows, estimate, max_active_runs, reprocess);
        let Some(mode) = args.cascade.map(|c| c.mode()) else {
            let (dag, rows, estimate, max_active_runs, reprocess) = root;
            tables::print_plan(
                &dag,
                &rows,
                &tables::PlanOptions {
                    reprocess: reprocess.as_str(),
                    run_backwards: args.run_backwards,
                    max_active_runs,
                    estimate: &estimate,
                },
                g.json,
            )?;
            return Ok(exit::OK);
        };
        // The whole chain: each downstream DAG over what its upstream plans run.
        let runs = |rows: &[PlanRow]| -> Vec<DataInterval> {
            rows.iter()
                .filter(|r| r.action == Action::Run)
                .map(|r| r.interval)
                .collect()
        };
        let root_runs = runs(&root.1);
        let mut all = vec![root];
        super::cascade::walk_chain(&project, &all[0].0.id.clone(), root_runs, |d, ivs| {
            let opts = plan::Options {
                reprocess: Reprocess::Completed,
                run_backwards: false,
                depends_on_past: d.depends_on_past,
                now,
            };
            let max = d.max_active_runs.unwrap_or(max_active_runs);
            check_tasks(d, &conf, ivs)?;
            let (rows, estimate) =
                dry_plan(&project, &manifest_path, d, ivs, opts, &HashSet::new(), max)?;
            let to_run = runs(&rows);
            all.push((d.clone(), rows, estimate, max, Reprocess::Completed));
            Ok(to_run)
        })?;
        tables::print_cascade_plan(
            &all.iter()
                .map(|(d, rows, estimate, max, reprocess)| {
                    (
                        d,
                        rows.as_slice(),
                        tables::PlanOptions {
                            reprocess: reprocess.as_str(),
                            run_backwards: args.run_backwards && d.id == all[0].0.id,
                            max_active_runs: *max,
                            estimate,
                        },
                    )
                })
                .collect::<Vec<_>>(),
            mode,
            g.json,
        )?;
        return Ok(exit::OK);
    }

    let (range_start, range_end) = unix_range(range);
    let request = NewBackfill {
        dag_id: dag.id.clone(),
        from_arg: args.from.clone(),
        to_arg: args.to.clone(),
        range_start,
        range_end,
        reprocess,
        max_active_runs,
        run_backwards: args.run_backwards,
        allow_drift: args.allow_drift,
        conf: conf.to_string(),
        kind: if args.stage {
            BackfillKind::Stage
        } else {
            BackfillKind::Run
        },
        source_backfill: None,
        tasks: only,
        cascade: None,
        cascade_of: None,
        max_failures: args.max_failures,
    };
    let cascade = args.cascade.map(|c| c.mode());
    if cascade.is_some() {
        // Every DAG the cascade will run is checked now, not after the first one ran.
        super::cascade::check_chain(&project, &dag, &intervals, &conf)?;
    }
    let root_dag_id = dag.id.clone();
    let (code, id) = launch(
        g,
        &project,
        Launch {
            dag,
            conf,
            intervals,
            request: NewBackfill {
                cascade: cascade.map(|m| m.as_str().to_string()),
                ..request
            },
            options,
            changed: &changed,
            upstream: &HashMap::new(),
            reprs,
            mode: if args.stage {
                crate::runner::Mode::Stage
            } else {
                crate::runner::Mode::Run
            },
        },
    )?;
    match (cascade, id) {
        (Some(mode), Some(root)) if code != exit::INTERRUPTED => {
            let rest = super::cascade::continue_cascade(g, &project, root, &root_dag_id, mode)?;
            Ok(super::cascade::worst(code, rest))
        }
        (None, Some(_)) if !args.stage => {
            super::cascade::name_stale_downstream(g, &project, &root_dag_id, &args);
            Ok(code)
        }
        _ => Ok(code),
    }
}

/// The plan a dry run prints for one DAG, and its estimate.
fn dry_plan(
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    dag: &Dag,
    intervals: &[DataInterval],
    options: plan::Options,
    changed: &HashSet<i64>,
    max_active_runs: u32,
) -> Result<(Vec<PlanRow>, crate::estimate::Estimate), Error> {
    let ctx = LeaseCtx::new(project.lease_timeout);
    let conn = manifest::open_if_exists(manifest_path)?;
    let (prior, before) = match &conn {
        Some(conn) => {
            let before = plans::state_before(conn, &dag.id, intervals[0].start.timestamp())
                .map_err(|e| e.at(manifest_path))?;
            let mut prior = plans::priors(conn, &dag.id, intervals, &ctx, Judge::Predict)
                .map_err(|e| e.at(manifest_path))?;
            mark_changed(&mut prior, intervals, changed);
            (prior, before)
        }
        None => (vec![Prior::default(); intervals.len()], None),
    };
    let rows = plan::plan(intervals, &prior, before, options);
    let history = match &conn {
        Some(conn) => crate::estimate::history(conn, dag)
            .map_err(|e| Error::Manifest(manifest::Error::from(e).at(manifest_path)))?,
        None => Default::default(),
    };
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    let estimate =
        crate::estimate::estimate(dag, &history, to_run, max_active_runs, &project.pools);
    Ok((rows, estimate))
}

/// The request of a backfill that runs every one of `intervals` (ascending, not empty) of
/// `dag`, whatever ran before: a promote, a rollback, a cascade's downstream backfill. Its range
/// is the intervals it was given; callers set what else differs.
pub(super) fn request_over(
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
    }
}

/// The plan options of such a backfill: every interval runs, oldest first.
pub(super) fn run_every(depends_on_past: bool) -> Result<plan::Options, Error> {
    Ok(plan::Options {
        reprocess: Reprocess::Completed,
        run_backwards: false,
        depends_on_past,
        now: clock::now()?,
    })
}

/// A backfill to write and run.
pub(super) struct Launch<'a> {
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
pub(super) fn launch(
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
    let ctx = LeaseCtx::new(project.lease_timeout);
    let max_active_runs = request.max_active_runs;
    let allow_drift = request.allow_drift;
    let max_failures = request.max_failures;
    let tasks = request.tasks.clone();
    let writer = Writer::spawn(
        manifest::open(&manifest_path, project.durability)?,
        &manifest_path,
    )?;
    let dags = Dags::of(project);
    let result = (|| {
        let report = recovery::release_stale(&writer, &dags, &dag.id, &ctx, None)?;
        for w in &report.warnings {
            warn(g, w);
        }
        crate::fault::point("after-release-stale");
        let first = ctx.refreshed();
        let owner = writer.call_blocking(move |c| backfills::insert(c, &request, &first))?;
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
        eprintln!(
            "backfill {} of {}: {}, {} to run, {} skipped, up to {max_active_runs} at a time",
            owner.backfill_id,
            dag.id,
            crate::report::out::plural(planned.total as i64, "interval", "intervals"),
            to_run.len(),
            planned.total - to_run.len()
        );
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
        },
        writer,
    )?;
    Ok((code, Some(owner.backfill_id)))
}

/// `--tasks`: the DAG with only the named tasks, in their order; an unknown name is exit 2.
pub(super) fn only_tasks(mut dag: Dag, names: &[String]) -> Result<Dag, Error> {
    if names.is_empty() {
        return Ok(dag);
    }
    for n in names {
        if !dag.tasks.iter().any(|t| &t.id == n) {
            return Err(super::unknown_task(
                &dag,
                &format!("--tasks {}", names.join(",")),
                n,
            ));
        }
    }
    dag.tasks.retain(|t| names.contains(&t.id));
    Ok(dag)
}

/// A backfill taken over by another process while this one recovered or planned ends here as
/// interrupted (130); any other error stays what it is.
pub(super) fn taken_over(e: Error) -> Result<u8, Error> {
    match e {
        Error::Manifest(manifest::Error::Fenced { backfill_id }) => {
            eprintln!(
                "backfill {backfill_id} was taken over by another process while it was being prepared; `{}` tells what it did",
                crate::report::out::hint(&format!("show {backfill_id}"))
            );
            Ok(exit::INTERRUPTED)
        }
        other => Err(other),
    }
}

/// Interval starts `s` with `start <= s < end` in whole unix seconds, for the manifest: the
/// same bounds every command resolves a range to.
pub(super) fn unix_range(range: Range) -> (i64, i64) {
    let (first, last) = range.unix_start_bounds();
    (first, last.saturating_add(1))
}

/// The plan as written.
pub(super) struct Planned {
    pub total: usize,
    /// The intervals to run, in execution order.
    pub to_run: Vec<DataInterval>,
}

/// What is known of intervals before they are planned: those that already have a plan row
/// (from an interrupted planning), and those whose source changed (`changed`).
#[derive(Clone, Copy)]
pub(super) struct Marks<'a> {
    pub already: &'a HashSet<i64>,
    pub changed: &'a HashSet<i64>,
    /// A cascade's downstream intervals skipped for their upstream, by start.
    pub upstream: &'a HashMap<i64, SkipReason>,
}

/// Plans `intervals` (ascending) and writes the plan with its leases in chunks of
/// [`PLAN_CHUNK`], one transaction each, then records the plan as complete. Intervals whose
/// start is in `already` have a plan row from an earlier, interrupted planning and are left out.
pub(super) fn write_plan(
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
        let mut carried = planner.take();
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
            let mut p = match carried.take() {
                Some(p) => p,
                None => Planner::new(
                    plans::state_before(c, &dag_id, chunk_intervals[0].start.timestamp())?,
                    options,
                ),
            };
            let mut prior = plans::priors(c, &dag_id, &chunk_intervals, &ctx, Judge::Strict)?;
            mark_changed(&mut prior, &chunk_intervals, &chunk_changed);
            let rows: Vec<(i64, PlanRow)> = chunk_intervals
                .iter()
                .zip(prior)
                .zip(ords)
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
            plans::insert_chunk(c, backfills::fence(c, owner)?, &dag_id, &rows, &ctx)?;
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
    writer.call_blocking(move |c| backfills::planned(c, owner))?;
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
pub(super) fn source_changes(
    g: &Global,
    project: &crate::project::Project,
    dag: &Dag,
    conf: &serde_json::Value,
    intervals: &[DataInterval],
    manifest_path: &std::path::Path,
) -> Result<HashSet<i64>, Error> {
    let (watching, blind) = crate::probe::watchers(dag);
    if watching.is_empty() {
        note(
            g,
            &format!(
                "no task of DAG `{}` has a gate `source_count` or `source_fingerprint`, so nothing can tell whether a source changed: intervals that succeeded count as unchanged, and only failed ones run",
                dag.id
            ),
        );
        return Ok(HashSet::new());
    }
    if !blind.is_empty() {
        let names: Vec<String> = blind.iter().map(|t| format!("`{}`", t.id)).collect();
        note(
            g,
            &format!(
                "{} {} no gate `source_count` or `source_fingerprint`: only the sources of {} are compared",
                names.join(", "),
                if names.len() == 1 { "has" } else { "have" },
                watching
                    .iter()
                    .map(|t| format!("`{}`", t.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let Some(conn) = manifest::open_if_exists(manifest_path)? else {
        return Ok(HashSet::new());
    };
    let (Some(first), Some(last)) = (intervals.first(), intervals.last()) else {
        return Ok(HashSet::new());
    };
    let recorded = manifest::queries::recorded_sources(
        &conn,
        &dag.id,
        first.start.timestamp(),
        last.start.timestamp(),
    )
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
pub(super) fn parse_conf(conf: Option<&str>) -> Result<serde_json::Value, Error> {
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

/// Checks every task before anything is written: each command (and `publish` and
/// `source_count` command) renders for the first interval, so that a template using a `conf`
/// key that was not given fails now; each SQL task prepares exactly what it will run against
/// its warehouse (created from its init files if needed), and its partition column's
/// representation is decided over the range. Returns those representations by task.
pub(super) fn check_tasks(
    dag: &Dag,
    conf: &serde_json::Value,
    intervals: &[DataInterval],
) -> Result<HashMap<String, Option<Repr>>, Error> {
    let (Some(first), Some(last)) = (intervals.first(), intervals.last()) else {
        return Ok(HashMap::new());
    };
    let window = DataInterval::new(first.start, last.end);
    // Every `conf` key a template needs and --conf does not give, each at its command.
    let missing: Vec<ConfigError> = dag
        .tasks
        .iter()
        .flat_map(|t| project::missing_conf(t, conf))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Project(ProjectError::Config(missing)));
    }
    let values = template::IntervalValues::new(*first, dag.tz);
    let mut reprs = HashMap::new();
    for task in &dag.tasks {
        let problem = |e: String| Error::Usage(format!("{}: task `{}`: {e}", dag.file, task.id));
        let ctx = values.context(&dag.id, &task.id, "0", 1, conf);
        let mut commands: Vec<&CommandSpec> = task.publish.iter().collect();
        if let Some(Gate {
            source_count: Some(SourceCount::Command(c)),
            ..
        }) = &task.gate
        {
            commands.push(c);
        }
        match &task.kind {
            TaskKind::Command(spec) => commands.push(spec),
            TaskKind::Sql(sql) => {
                // What a killed creation of the warehouse left goes first.
                warehouse::init::remove_abandoned(&sql.warehouse.path);
                let conn =
                    warehouse::open_to_read(&sql.warehouse).map_err(|e| problem(e.to_string()))?;
                warehouse::check_task(&conn, sql, task.gate.as_ref()).map_err(problem)?;
                let repr = warehouse::decide_repr(&conn, sql, window, dag.tz).map_err(problem)?;
                reprs.insert(task.id.clone(), repr);
            }
        }
        for spec in commands {
            command::render(spec, &ctx).map_err(problem)?;
        }
    }
    Ok(reprs)
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
