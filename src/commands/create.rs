//! `backfill create`: validate everything, recover what dead owners left on the DAG's leases,
//! write the plan and lease its intervals in bounded chunks, then run them (or, with
//! `--dry-run`, print the plan and write nothing). A staged backfill's id is printed on stdout,
//! for the commands that review it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::cli::CreateArgs;
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, expand_nonempty, resolve_args};
use crate::manifest::NewBackfill;
use crate::plan::{self, Action, PlanRow, Reprocess, SkipReason};
use crate::project::{Dag, Project};
use crate::report::out::Sink;
use crate::report::plan::{self as plan_view, PlanOptions};
use crate::session::Global;
use crate::session::launch::{
    Launch, dry_plan, launch, parse_conf, sample_of, source_changes, unix_range,
};
use crate::session::tasks::{check_tasks, only_tasks};
use crate::state::BackfillKind;

pub(crate) fn run(g: &Global, mut args: CreateArgs) -> Result<u8, Error> {
    let project = g.project()?;
    let atomic = std::mem::take(&mut args.atomic);
    let dag = checked_dag(&project, &mut args, atomic)?;
    if (args.wait_ready.is_some() || args.require_ready)
        && !dag.tasks.iter().any(|t| t.ready.is_some())
    {
        crate::session::note(
            g,
            &format!(
                "--wait-ready and --require-ready change nothing here: no task this backfill of DAG `{}` runs asks whether its sources are ready ([tasks.ready] in {})",
                dag.id, dag.file
            ),
        );
    }
    let prepared = prepare(g, &project, &dag, &args)?;
    warn_unlike_published(g, &project, &dag, &prepared);
    if args.dry_run {
        return dry_run(g, &project, dag, &args, &prepared);
    }
    let request = request(&dag, &args, &prepared);
    let cascade = args.cascade.map(|c| c.mode());
    if cascade.is_some() {
        // Every DAG the cascade will run is checked now, not after the first one ran.
        crate::session::chain::check_chain(&project, &dag, &prepared.intervals, &prepared.conf)?;
    }
    let root_dag_id = dag.id.clone();
    let Prepared {
        conf,
        intervals,
        options,
        changed,
        reprs,
        manifest_path,
        ..
    } = prepared;
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
    if let (true, Some(id)) = (atomic, id) {
        return promote_staged(g, id, code, args.allow_drift);
    }
    if let (true, false, Some(id)) = (args.stage, g.json, id) {
        // The handle `diff`, `promote` and `discard` need, as data: `id=$(backfill create
        // ... --stage -q)`. (With --output json, the summary carries it.)
        crate::report::out::data(&id.to_string())?;
    }
    match (cascade, id) {
        (Some(mode), Some(root)) if code != exit::INTERRUPTED => {
            let rest =
                crate::session::cascade::continue_cascade(g, &project, root, &root_dag_id, mode)?;
            Ok(crate::session::chain::worst(code, rest))
        }
        // Downstream DAGs may be stale only when this backfill published something.
        (None, Some(id)) if !args.stage && published_any(&manifest_path, id) => {
            crate::session::cascade::name_stale_downstream(
                g,
                &project,
                &root_dag_id,
                &args.from,
                &args.to,
            );
            Ok(code)
        }
        _ => Ok(code),
    }
}

/// The DAG `create` runs, with `--tasks` and `--batch-size` applied, once the options are
/// known to fit it (`--atomic` with a DAG that publishes all at once, `--run-backwards` with one
/// that does not depend on its past). `--atomic` stages the range first.
fn checked_dag(project: &Project, args: &mut CreateArgs, atomic: bool) -> Result<Dag, Error> {
    let mut dag = only_tasks(project.dag(&args.dag)?, &args.tasks)?;
    if atomic {
        if args.cascade.is_some() {
            return Err(Error::Usage(
                "--atomic cannot be used with --cascade: each DAG of a cascade publishes on its own; drop one of them".into(),
            ));
        }
        crate::commands::staging::atomic_refusal(&dag, "create --atomic")?;
    }
    // Staged first; published at once below.
    args.stage |= atomic;
    if args.stage {
        stage_refusal(&dag)?;
    }
    if let Some(n) = args.batch_size {
        if n > 1
            && let Err(why) =
                crate::project::batchable(&dag.tasks, dag.depends_on_past, !dag.upstream.is_empty())
        {
            return Err(Error::Usage(format!(
                "--batch-size {n} cannot be used with DAG `{}` ({}): {why}; drop --batch-size",
                dag.id, dag.file
            )));
        }
        dag.batch_size = n;
    }
    if args.run_backwards && dag.depends_on_past {
        return Err(Error::Usage(format!(
            "--run-backwards cannot be used with DAG `{}`: it sets depends_on_past = true in {}, so each interval needs the one before it; drop --run-backwards",
            dag.id, dag.file
        )));
    }
    Ok(dag)
}

/// `--stage` holds every output back until `promote`: a command task without a `publish`
/// command writes its output where readers find it, so nothing of it could wait (the run
/// would be recorded `staged` with nothing to promote).
fn stage_refusal(dag: &Dag) -> Result<(), Error> {
    let unheld = dag
        .tasks
        .iter()
        .find(|t| matches!(t.kind, crate::project::TaskKind::Command(_)) && t.publish.is_none());
    match unheld {
        Some(task) => Err(Error::Usage(format!(
            "--stage cannot hold back task `{}` of DAG `{}` ({}): a command task without a `publish` command writes its output where readers find it; give it a `publish` command that moves the output into place (docs/review.md), leave it out with --tasks, or run without --stage",
            task.id, dag.id, dag.file
        ))),
        None => Ok(()),
    }
}

/// What `create` knows before it plans: the run's configuration, its intervals (a sample's,
/// with why each was picked), the manifest, how many run at once, the tasks checked against
/// their warehouses, and how earlier runs are reprocessed.
struct Prepared {
    conf: serde_json::Value,
    /// `--tasks` as recorded: each once, in the DAG's order.
    only: Option<Vec<String>>,
    range: crate::interval::Range,
    intervals: Vec<DataInterval>,
    /// `--sample N`: N, and why each interval that runs was picked.
    sampled: Option<(u32, HashMap<i64, &'static str>)>,
    manifest_path: PathBuf,
    max_active_runs: u32,
    /// Each task's partition representation, decided by its warehouse.
    reprs: HashMap<String, Option<crate::warehouse::Repr>>,
    reprocess: Reprocess,
    options: plan::Options,
    /// With `--reprocess-behavior changed`: the intervals whose source changed.
    changed: HashSet<i64>,
}

fn prepare(g: &Global, project: &Project, dag: &Dag, args: &CreateArgs) -> Result<Prepared, Error> {
    let only: Option<Vec<String>> =
        (!args.tasks.is_empty()).then(|| dag.tasks.iter().map(|t| t.id.clone()).collect());
    let conf = parse_conf(args.conf.as_deref())?;
    let now = clock::now()?;
    let range = resolve_args(&args.from, &args.to, now, dag.tz)?;
    let intervals = expand_nonempty(&dag.schedule, range, &args.from, &args.to)?;
    let manifest_path = g.manifest_path(Some(project))?;
    let (intervals, sampled) = sample(g, dag, args, &manifest_path, intervals, now)?;
    let max_active_runs = args.max_active_runs.or(dag.max_active_runs).unwrap_or(1);
    if !args.dry_run {
        // Before a warehouse is created from its init files or the manifest is opened.
        crate::limits::room_for_runs(max_active_runs, Some("--max-active-runs"))?;
    }
    let reprs = check_tasks(dag, &conf, &intervals)?;
    // A batch that fails is split and its halves run again: calls at the source that a pool's
    // rate, counting one start a try, could not bound.
    let rated = |t: &crate::project::Task| {
        t.pool
            .as_ref()
            .filter(|p| project.pool_rates.contains_key(*p))
            .map(|p| {
                format!(
                    "task `{}` is in pool `{p}`, which has a rate, and a batch that fails is run again in halves, starts its rate could not count",
                    t.id
                )
            })
    };
    if dag.batch_size > 1
        && let Some(why) = dag
            .tasks
            .iter()
            .find_map(|t| crate::warehouse::batch_problem(t).or_else(|| rated(t)))
    {
        return Err(Error::Usage(match args.batch_size {
            Some(n) => format!(
                "--batch-size {n} cannot be used with DAG `{}` ({}): {why}; drop --batch-size",
                dag.id, dag.file
            ),
            None => format!(
                "{}: `batch_size = {}` cannot be used: {why}; remove `batch_size`",
                dag.file, dag.batch_size
            ),
        }));
    }
    let reprocess = Reprocess::from(args.reprocess_behavior);
    let options = plan::Options {
        reprocess,
        run_backwards: args.run_backwards,
        depends_on_past: dag.depends_on_past,
        now,
    };
    let changed = match reprocess {
        Reprocess::Changed => source_changes(g, project, dag, &conf, &intervals, &manifest_path)?,
        _ => HashSet::new(),
    };
    Ok(Prepared {
        conf,
        only,
        range,
        intervals,
        sampled,
        manifest_path,
        max_active_runs,
        reprs,
        reprocess,
        options,
        changed,
    })
}

/// Partitions recorded as published whose target holds another number of rows now (a table
/// truncated or changed by hand) are skipped as `already exists` by every behaviour but
/// `completed`: said before the run, with the command that computes them again. Nothing is
/// said when the manifest or a warehouse cannot be read: the run reports that itself.
fn warn_unlike_published(g: &Global, project: &Project, dag: &Dag, prepared: &Prepared) {
    if prepared.reprocess == Reprocess::Completed {
        return;
    }
    let Ok(Some(conn)) = crate::manifest::open_if_exists(&prepared.manifest_path) else {
        return;
    };
    let bounds = prepared.range.unix_start_bounds();
    let unlike = crate::reads::unlike_published(project, dag, &*conn, bounds, &prepared.reprs);
    let skipper = format!("--reprocess-behavior {}", prepared.reprocess.as_str());
    if let Some(words) = unlike
        .ok()
        .and_then(|u| crate::report::unlike::words(dag, &u, &skipper))
    {
        crate::session::warn(g, &words);
    }
}

/// `--sample N`: the intervals it rehearses, and why each was picked; all of them when the
/// range has no more than N.
fn sample(
    g: &Global,
    dag: &Dag,
    args: &CreateArgs,
    manifest_path: &std::path::Path,
    intervals: Vec<DataInterval>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Sampled, Error> {
    let Some(n) = args.sample else {
        return Ok((intervals, None));
    };
    if dag.depends_on_past {
        return Err(Error::Usage(format!(
            "--sample cannot be used with DAG `{}`: it sets depends_on_past = true in {}, so each interval needs the one before it and a sample would skip all but its first; run the range, or a shorter one",
            dag.id, dag.file
        )));
    }
    let manifest = crate::manifest::open_if_exists(manifest_path)?;
    match sample_of(manifest.as_deref(), manifest_path, dag, &intervals, n, now)? {
        Some((picked, why)) => Ok((picked, Some((n, why)))),
        None => {
            crate::session::note(
                g,
                &format!(
                    "--sample {n}: the range has no more than {n} complete intervals, so all of them run"
                ),
            );
            Ok((intervals, None))
        }
    }
}

/// The intervals a sample runs, with `--sample`'s N and why each was picked.
type Sampled = (Vec<DataInterval>, Option<(u32, HashMap<i64, &'static str>)>);

/// The backfill `create` records.
fn request(dag: &Dag, args: &CreateArgs, p: &Prepared) -> NewBackfill {
    let (range_start, range_end) = unix_range(p.range);
    NewBackfill {
        dag_id: dag.id.clone(),
        from_arg: args.from.clone(),
        to_arg: args.to.clone(),
        range_start,
        range_end,
        reprocess: p.reprocess,
        max_active_runs: p.max_active_runs,
        run_backwards: args.run_backwards,
        allow_drift: args.allow_drift,
        conf: p.conf.to_string(),
        kind: if args.stage {
            BackfillKind::Stage
        } else {
            BackfillKind::Run
        },
        source_backfill: None,
        tasks: p.only.clone(),
        cascade: None,
        cascade_of: None,
        max_failures: args.max_failures,
        sample: p.sampled.as_ref().map(|(n, _)| *n),
        definition: None,
        batch_size: args.batch_size,
        project: None,
        warehouses: None,
        atomic: false,
        wait_ready: args
            .wait_ready
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        require_ready: args.require_ready,
    }
}

/// `create --dry-run`: the plan, with its estimate, written and nothing else; with
/// `--cascade`, the plans of every DAG the cascade would run.
fn dry_run(
    g: &Global,
    project: &Project,
    dag: Dag,
    args: &CreateArgs,
    p: &Prepared,
) -> Result<u8, Error> {
    let (rows, estimate) = dry_plan(
        project,
        &p.manifest_path,
        &dag,
        &p.intervals,
        p.options,
        &p.changed,
        p.max_active_runs,
    )?;
    let sampled = p.sampled.as_ref().map(|(_, why)| why);
    let Some(mode) = args.cascade.map(|c| c.mode()) else {
        plan_view::write(
            &mut Sink::std(g.json, g.verbose),
            &dag,
            &rows,
            &PlanOptions {
                reprocess: p.reprocess.as_str(),
                run_backwards: args.run_backwards,
                max_active_runs: p.max_active_runs,
                estimate: &estimate,
                sampled,
            },
        )?;
        return Ok(exit::OK);
    };
    let all = chain_plans(project, (dag, rows, estimate), p)?;
    let root = all[0].0.id.clone();
    plan_view::write_cascade(
        &mut Sink::std(g.json, g.verbose),
        &all.iter()
            .map(|(d, rows, estimate, max, reprocess)| {
                (
                    d,
                    rows.as_slice(),
                    PlanOptions {
                        reprocess: reprocess.as_str(),
                        run_backwards: args.run_backwards && d.id == root,
                        max_active_runs: *max,
                        estimate,
                        sampled: sampled.filter(|_| d.id == root),
                    },
                )
            })
            .collect::<Vec<_>>(),
        mode,
    )?;
    Ok(exit::OK)
}

/// A DAG's dry-run plan: its rows, its estimate, how many run at once and how earlier runs
/// are reprocessed.
type DryPlan = (Dag, Vec<PlanRow>, crate::estimate::Estimate, u32, Reprocess);

/// The plans of the whole chain a cascade of the root would run: each downstream DAG over what
/// its upstream plans run, and over the root's intervals whose output stands.
fn chain_plans(
    project: &Project,
    (dag, rows, estimate): (Dag, Vec<PlanRow>, crate::estimate::Estimate),
    p: &Prepared,
) -> Result<Vec<DryPlan>, Error> {
    let runs = |rows: &[PlanRow]| -> Vec<DataInterval> {
        rows.iter()
            .filter(|r| r.action == Action::Run)
            .map(|r| r.interval)
            .collect()
    };
    let root_runs = runs(&rows);
    let conn = crate::manifest::open_if_exists(&p.manifest_path)?;
    let standing = standing(&dag, &rows, conn.as_deref(), &p.manifest_path)?;
    let root_id = dag.id.clone();
    let mut all = vec![(dag, rows, estimate, p.max_active_runs, p.reprocess)];
    crate::session::chain::walk_chain(
        project,
        conn.as_deref(),
        &root_id,
        root_runs,
        standing,
        |d, ivs| {
            let opts = plan::Options {
                reprocess: Reprocess::Completed,
                run_backwards: false,
                depends_on_past: d.depends_on_past,
                now: p.options.now,
            };
            let max = d.max_active_runs.unwrap_or(p.max_active_runs);
            check_tasks(d, &p.conf, ivs)?;
            let (rows, estimate) = dry_plan(
                project,
                &p.manifest_path,
                d,
                ivs,
                opts,
                &HashSet::new(),
                max,
            )?;
            let to_run = runs(&rows);
            all.push((d.clone(), rows, estimate, max, Reprocess::Completed));
            Ok(to_run)
        },
    )?;
    Ok(all)
}

/// The root's intervals whose output stands: downstream intervals over them that never
/// succeeded are planned too, as the cascade will.
fn standing(
    root: &Dag,
    rows: &[PlanRow],
    conn: Option<&dyn crate::manifest::Reads>,
    manifest_path: &std::path::Path,
) -> Result<Vec<DataInterval>, Error> {
    let mut standing = Vec::new();
    for r in rows {
        let stands = match (r.action, conn) {
            (Action::Skip(SkipReason::SourceUnchanged), _) => true,
            (Action::Skip(SkipReason::AlreadyExists), Some(c)) => {
                c.latest_computing_state(&root.id, r.interval.start.timestamp())
                    .map_err(|e| Error::Manifest(e.at(manifest_path)))?
                    == Some(crate::plan::RunState::Succeeded)
            }
            _ => false,
        };
        if stands {
            standing.push(r.interval);
        }
    }
    Ok(standing)
}

/// `create --atomic`, once its range is staged: every interval staged is published at once;
/// when an interval did not stage, nothing is published (the staged outputs wait for `promote
/// ID --atomic`).
fn promote_staged(g: &Global, id: i64, code: u8, allow_drift: bool) -> Result<u8, Error> {
    if code != exit::OK {
        crate::session::warn(
            g,
            &format!(
                "nothing published: not every interval of backfill {id} was staged (`{}` says why); `{}` publishes what was, all at once",
                crate::report::out::hint(&format!("show {id}")),
                crate::report::out::hint(&format!("promote {id} --atomic"))
            ),
        );
        return Ok(code);
    }
    crate::commands::staging::promote(g, id, &[], allow_drift, true)
}

/// Whether an interval of backfill `id` succeeded, as far as the manifest can be read (a
/// manifest that cannot be read says no: the note this decides is only a hint). One indexed
/// lookup: reading the backfill's whole outcome would map every page of a large manifest.
fn published_any(manifest_path: &std::path::Path, id: i64) -> bool {
    crate::manifest::open_read_only(manifest_path)
        .ok()
        .and_then(|m| m.any_succeeded(id).ok())
        .unwrap_or(false)
}
