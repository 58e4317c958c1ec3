//! Staged backfills: `promote` publishes their outputs, `discard` drops them, `diff` compares
//! them with what is published; `rollback` puts back what publishes replaced. Promotes and
//! rollbacks are backfills of their own kind, run by the same runner as any backfill: leases,
//! heartbeats, fencing, cancel, resume and the crash-safe publish all apply.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Rfc3339, expand_nonempty, resolve_args};
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Backfill, NewBackfill, Reads, runs};
use crate::project::{Dag, Project, TaskKind};
use crate::recovery::{self, Dags};
use crate::report::diff::DiffRow;
use crate::report::out::Sink;
use crate::report::out::hint;
use crate::runner::Mode;
use crate::session::launch::{request_over, run_every};
use crate::session::staged::{settle_staged, staged_outputs};
use crate::session::tasks::check_tasks;
use crate::session::{Global, find_backfill, note, warn};
use crate::state::{BackfillKind, BackfillState, StagedState};

/// A staged backfill as found: its project, manifest path and read-only manifest, the backfill
/// and its DAG.
type StagedBackfill = (Project, PathBuf, Box<dyn Reads>, Backfill, Dag);

/// The staged backfill `id` for `verb`: a `create --stage` backfill that is not running.
fn staged_backfill(g: &Global, id: i64, verb: &str) -> Result<StagedBackfill, Error> {
    let (project, path, conn, b) = find_backfill(g, id)?;
    crate::session::belonging::check_backfill(&project, &path, &b, verb)?;
    if b.kind != BackfillKind::Stage {
        return Err(Error::Usage(format!(
            "backfill {id} is a `{}` backfill, not a staged one: `backfill {verb}` takes the id of a `backfill create --stage` backfill",
            b.kind
        )));
    }
    if b.state == BackfillState::Running {
        return Err(Error::Usage(format!(
            "backfill {id} is still staging; wait for it to end (or, if its process is gone, continue it with `{}`), then {verb} it",
            hint(&format!("resume {id}"))
        )));
    }
    let dag = project.dag(&b.dag_id)?;
    Ok((project, path, conn, b, dag))
}

/// The staged outputs that `--interval` selects (all without it). A WHEN that selects no
/// staged output of the backfill is an error.
fn select(
    all: Vec<runs::Staged>,
    whens: &[String],
    dag: &Dag,
    id: i64,
) -> Result<Vec<runs::Staged>, Error> {
    if whens.is_empty() {
        return Ok(all);
    }
    let now = clock::now()?;
    let mut bounds = Vec::new();
    for w in whens {
        let (lo, hi) = resolve_args(w, w, now, dag.tz)?.unix_start_bounds();
        if !all
            .iter()
            .any(|s| (lo..=hi).contains(&s.interval.start.timestamp()))
        {
            return Err(Error::Usage(format!(
                "--interval {w} selects no staged interval of backfill {id}; `{}` lists them",
                hint(&format!("show {id}"))
            )));
        }
        bounds.push((lo, hi));
    }
    Ok(all
        .into_iter()
        .filter(|s| {
            let start = s.interval.start.timestamp();
            bounds.iter().any(|(lo, hi)| (*lo..=*hi).contains(&start))
        })
        .collect())
}

/// The distinct intervals of some staged outputs, ascending.
fn intervals_of(staged: &[&runs::Staged]) -> Vec<DataInterval> {
    let mut v: Vec<DataInterval> = staged.iter().map(|s| s.interval).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `backfill promote ID`: a backfill of kind `promote` that publishes the staged outputs,
/// through the gate and the crash-safe publish.
pub(crate) fn promote(
    g: &Global,
    id: i64,
    whens: &[String],
    allow_drift: bool,
    atomic: bool,
) -> Result<u8, Error> {
    let (project, path, conn, source, dag) = staged_backfill(g, id, "promote")?;
    let all = conn.staged_outputs(id).map_err(|e| e.at(&path))?;
    drop(conn);
    let chosen = select(all, whens, &dag, id)?;
    let waiting: Vec<&runs::Staged> = chosen
        .iter()
        .filter(|s| s.state == StagedState::Staged)
        .collect();
    if waiting.is_empty() {
        return nothing_left(g, id, &chosen, "promote");
    }
    if let Some(s) = waiting
        .iter()
        .find(|s| !dag.tasks.iter().any(|t| t.id == s.task_id))
    {
        return Err(Error::Usage(format!(
            "backfill {id} staged an output of task `{}`, which DAG `{}` no longer has; restore the task in {} to promote it, or drop it with `{}`",
            s.task_id,
            dag.id,
            dag.file,
            hint(&format!("discard {id}"))
        )));
    }
    if atomic {
        // The tasks it publishes: those with a staged output.
        let mut staged_tasks = dag.clone();
        staged_tasks
            .tasks
            .retain(|t| waiting.iter().any(|s| s.task_id == t.id));
        atomic_refusal(&staged_tasks, "promote --atomic")?;
    }
    let conf = source.conf_json()?;
    let intervals = intervals_of(&waiting);
    let reprs = check_tasks(&dag, &conf, &intervals)?;
    // A promote killed halfway: its decided publishes are finished first, so that what is
    // read next as staged is what awaits promotion now. (Each promote try claims its output
    // again when it starts, under the interval's lease.)
    let writer = Writer::open(&path, project.durability)?;
    let recovered = recovery::release_stale(
        &writer,
        &Dags::of(&project),
        &dag.id,
        &LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL),
        None,
    );
    writer.close();
    for w in &recovered?.warnings {
        warn(g, w);
    }
    let starts: HashSet<i64> = intervals.iter().map(|i| i.start.timestamp()).collect();
    let mut outputs = staged_outputs(&path, id)?;
    outputs.retain(|(start, _), _| starts.contains(start));
    crate::fault::point("promote-read-staged");
    let intervals: Vec<DataInterval> = intervals
        .into_iter()
        .filter(|i| outputs.keys().any(|(s, _)| *s == i.start.timestamp()))
        .collect();
    if intervals.is_empty() {
        settle_staged(&path, &project, id)?;
        let all = manifest::open_read_only(&path)?
            .staged_outputs(id)
            .map_err(|e| e.at(&path))?;
        let chosen = select(all, whens, &dag, id)?;
        return nothing_left(g, id, &chosen, "promote");
    }
    let request = NewBackfill {
        allow_drift,
        atomic,
        source_backfill: Some(id),
        ..request_over(
            &dag,
            &intervals,
            BackfillKind::Promote,
            source.conf.clone(),
            source.max_active_runs,
        )
    };
    let options = run_every(dag.depends_on_past)?;
    let (code, _) = crate::session::launch::launch(
        g,
        &project,
        crate::session::launch::Launch {
            dag,
            conf,
            intervals,
            request,
            options,
            changed: &HashSet::new(),
            upstream: &HashMap::new(),
            reprs,
            mode: if atomic {
                Mode::PromoteAtomic(outputs)
            } else {
                Mode::Promote(outputs)
            },
        },
    )?;
    settle_staged(&path, &project, id)?;
    Ok(code)
}

/// Why the tasks of `dag` cannot be published in one transaction (`verb`: the command asked):
/// a command task's publish commands cannot share it, nor can tasks of several warehouses.
pub(crate) fn atomic_refusal(dag: &Dag, verb: &str) -> Result<(), Error> {
    let mut first: Option<(&str, &crate::project::Warehouse)> = None;
    for task in &dag.tasks {
        match &task.kind {
            TaskKind::Command(_) => {
                return Err(Error::Usage(format!(
                    "`{verb}` publishes in one warehouse transaction, and task `{}` of DAG `{}` is a command task, whose publish cannot share one; promote without --atomic, or leave the task out (`--tasks`)",
                    task.id, dag.id
                )));
            }
            TaskKind::Sql(sql) => match first {
                None => first = Some((&task.id, &sql.warehouse)),
                Some((other, w)) if w.name != sql.warehouse.name => {
                    return Err(Error::Usage(format!(
                        "`{verb}` publishes in one warehouse transaction, and DAG `{}` writes two warehouses: task `{other}` writes `{}`, task `{}` writes `{}`; promote without --atomic",
                        dag.id, w.name, task.id, sql.warehouse.name
                    )));
                }
                Some(_) => {}
            },
        }
    }
    Ok(())
}

/// Nothing to promote or discard: said, exit 0 (promoting twice is harmless).
fn nothing_left(g: &Global, id: i64, chosen: &[runs::Staged], verb: &str) -> Result<u8, Error> {
    let count = |s: StagedState| chosen.iter().filter(|c| c.state == s).count() as i64;
    let (promoted, discarded) = (count(StagedState::Promoted), count(StagedState::Discarded));
    if g.json {
        crate::report::out::json(&serde_json::json!({
            "backfill_id": id,
            verb: 0,
            "already_promoted": promoted,
            "already_discarded": discarded,
        }))?;
    } else {
        note(
            g,
            &format!(
                "nothing to {verb}: no output of backfill {id}{} awaits promotion ({} promoted, {} discarded)",
                if chosen.is_empty() {
                    ""
                } else {
                    " in those intervals"
                },
                promoted,
                discarded
            ),
        );
    }
    Ok(exit::OK)
}

/// `backfill discard ID`: the staged outputs are dropped and recorded as discarded.
pub(crate) fn discard(g: &Global, id: i64, whens: &[String]) -> Result<u8, Error> {
    let (project, path, conn, staged, dag) = staged_backfill(g, id, "discard")?;
    let promoting = conn.promoting(id).map_err(|e| e.at(&path))?;
    if let Some(p) = promoting {
        return Err(Error::Usage(format!(
            "backfill {p} is promoting backfill {id}; wait for it to end (or stop it with `{}`), then discard",
            hint(&format!("cancel {p}"))
        )));
    }
    let all = conn.staged_outputs(id).map_err(|e| e.at(&path))?;
    drop(conn);
    let chosen = select(all, whens, &dag, id)?;
    let waiting: Vec<(i64, Option<String>)> = chosen
        .iter()
        .filter(|s| s.state == StagedState::Staged)
        .map(|s| (s.try_id, s.path.clone()))
        .collect();
    if waiting.is_empty() {
        return nothing_left(g, id, &chosen, "discard");
    }
    let tries: Vec<i64> = waiting.iter().map(|(t, _)| *t).collect();
    let writer = Writer::open(&path, project.durability)?;
    let discarded = writer.call_blocking(move |c| {
        let mut gone = Vec::new();
        for &t in &tries {
            if c.discard_staged(t)? {
                gone.push(t);
            }
        }
        Ok(gone)
    });
    writer.close();
    let gone = discarded?;
    let discarded = i64::try_from(gone.len()).unwrap_or(i64::MAX);
    let kept = waiting.len() - gone.len();
    if kept > 0 {
        let (is, was) = if kept == 1 {
            ("is", "was")
        } else {
            ("are", "were")
        };
        warn(
            g,
            &format!(
                "{} of backfill {id} {is} being promoted and {was} kept",
                crate::report::out::plural(kept as i64, "staged output", "staged outputs"),
            ),
        );
    }
    // The staged outputs go once the manifest no longer points at them; a command task's
    // result file stays with its logs.
    let audits = crate::warehouse::audit_dir(&path);
    for s in chosen.iter().filter(|s| gone.contains(&s.try_id)) {
        let Some(location) = s.path.as_deref() else {
            continue;
        };
        if let Some(TaskKind::Sql(sql)) = dag
            .tasks
            .iter()
            .find(|t| t.id == s.task_id)
            .map(|t| &t.kind)
        {
            if let Err(why) =
                crate::warehouse::backend_of(&sql.warehouse).drop_staged(sql, location, &audits)
            {
                warn(g, &why.to_string());
            }
        } else if Path::new(location).starts_with(&audits) {
            let _ = std::fs::remove_file(location);
        }
    }
    let dropped: Vec<&runs::Staged> = chosen.iter().filter(|s| gone.contains(&s.try_id)).collect();
    for problem in clean_up_discarded(&project, &dag, &staged, &dropped)? {
        warn(g, &problem);
    }
    settle_staged(&path, &project, id)?;
    if g.json {
        crate::report::out::json(&serde_json::json!({"backfill_id": id, "discarded": discarded}))?;
    } else {
        note(
            g,
            &format!(
                "discarded {} of backfill {id}",
                crate::report::out::plural(discarded, "staged output", "staged outputs")
            ),
        );
    }
    Ok(exit::OK)
}

/// Runs the `cleanup` command of each discarded command-task output, rendered as for the staged
/// try (its run id and try number, `BACKFILL_RESULT` its result file), its output appended to
/// that try's log. Returns a warning for each cleanup that failed.
fn clean_up_discarded(
    project: &Project,
    dag: &Dag,
    staged: &Backfill,
    dropped: &[&runs::Staged],
) -> Result<Vec<String>, Error> {
    use crate::task::{cleanup, command, template::IntervalValues};
    let todo: Vec<_> = dropped
        .iter()
        .filter_map(|s| {
            let task = dag.tasks.iter().find(|t| t.id == s.task_id)?;
            match (&task.kind, &task.cleanup) {
                (TaskKind::Command(_), Some(spec)) => Some((*s, task, spec)),
                _ => None,
            }
        })
        .collect();
    if todo.is_empty() {
        return Ok(Vec::new());
    }
    let conf = staged.conf_json()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let mut problems = Vec::new();
    for (s, task, spec) in todo {
        let values = IntervalValues::new(s.interval, dag.tz);
        let run_id = s.run_id.to_string();
        let ctx = values.context(&dag.id, &task.id, &run_id, s.try_number, &conf);
        let (log, result) = command::try_paths(
            &project.logs_dir,
            &dag.id,
            s.interval.start,
            &task.id,
            s.run_id,
            s.try_number,
        );
        let result = s.path.as_deref().map_or(result, PathBuf::from);
        let env = command::environment(&ctx, &staged.conf, &result);
        let outcome = match command::render(spec, &ctx) {
            Ok(program) => runtime.block_on(cleanup::run(
                &program,
                &env,
                cleanup::Why::Discarded,
                &project.root,
                &log,
                task.timeout,
                task.grace_period,
            )),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            problems.push(format!(
                "task `{}`, try {}: the cleanup of the discarded output failed: {e} (log: {})",
                task.id,
                s.try_id,
                log.display()
            ));
        }
    }
    Ok(problems)
}

/// `backfill diff ID`: per staged interval and task, what promoting it would change.
pub(crate) fn diff(g: &Global, id: i64, whens: &[String]) -> Result<u8, Error> {
    let (_project, path, conn, source, dag) = staged_backfill(g, id, "diff")?;
    let all = conn.staged_outputs(id).map_err(|e| e.at(&path))?;
    let chosen = select(all, whens, &dag, id)?;
    let waiting: Vec<&runs::Staged> = chosen
        .iter()
        .filter(|s| s.state == StagedState::Staged)
        .collect();
    let conf = source.conf_json()?;
    let intervals = intervals_of(&waiting);
    let reprs = check_tasks(&dag, &conf, &intervals)?;
    let mut rows = Vec::new();
    for s in &waiting {
        let task = dag.tasks.iter().find(|t| t.id == s.task_id);
        let sql = match task.map(|t| &t.kind) {
            Some(TaskKind::Sql(sql)) => Some(sql),
            _ => None,
        };
        let wh_error = |e: crate::warehouse::Error| Error::Usage(e.to_string());
        let repr = reprs.get(&s.task_id).copied().flatten();
        let location = s.path.as_deref().unwrap_or_default();
        // `(rows, fingerprint)` of what is published. A SQL task's partition is read from the
        // warehouse: it may have been changed by hand since the manifest recorded its publish.
        let recorded = conn
            .published(&dag.id, &s.task_id, s.interval.start.timestamp())
            .map_err(|e| e.at(&path))?;
        let published: Option<(i64, Option<String>)> = match sql {
            Some(sql) => {
                let (rows, fingerprint) = crate::warehouse::backend_of(&sql.warehouse)
                    .published(sql, repr, s.interval, dag.tz, location)
                    .map_err(wh_error)?;
                (recorded.is_some() || rows > 0).then_some((rows, Some(fingerprint)))
            }
            None => recorded.map(|(_, rows, fingerprint)| (rows, fingerprint)),
        };
        let published_rows = published.as_ref().map(|p| p.0);
        let staged_rows = s.record.rows;
        let change_pct = match (published_rows, staged_rows) {
            (Some(0), Some(0)) => Some(0.0),
            (Some(p), Some(n)) if p != 0 => {
                #[expect(
                    clippy::cast_precision_loss,
                    reason = "a percentage for people: row counts far below 2^52"
                )]
                let pct = (n - p) as f64 * 100.0 / p as f64;
                Some((pct * 100.0).round() / 100.0)
            }
            _ => None,
        };
        let same_fingerprint = published
            .and_then(|p| p.1)
            .zip(s.record.fingerprint.clone())
            .map(|(a, b)| a == b);
        let unique_key = task
            .and_then(|t| t.gate.as_ref())
            .map(|g| &g.unique_key)
            .filter(|k| !k.is_empty());
        let keys = match (sql, unique_key) {
            (Some(sql), Some(key)) => {
                match crate::warehouse::backend_of(&sql.warehouse)
                    .diff_keys(sql, key, repr, s.interval, dag.tz, location)
                {
                    Ok(Some(keys)) => Some(keys),
                    Ok(None) => {
                        warn(
                            g,
                            &format!(
                                "the staged output of task `{}` at {} is gone; stage it again",
                                s.task_id,
                                crate::report::Labeler::new(&dag).label(s.interval.start)
                            ),
                        );
                        None
                    }
                    Err(e) => {
                        warn(
                            g,
                            &format!(
                                "task `{}` at {}: {e}",
                                s.task_id,
                                crate::report::Labeler::new(&dag).label(s.interval.start)
                            ),
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        rows.push(DiffRow {
            interval: crate::interval::IntervalDoc {
                start: Rfc3339(s.interval.start),
                end: Rfc3339(s.interval.end),
            },
            task: s.task_id.clone(),
            published_rows,
            staged_rows,
            change_pct,
            same_fingerprint,
            keys,
        });
    }
    crate::report::diff::write(
        &mut Sink::std(g.json, g.verbose),
        &rows,
        &crate::report::Labeler::new(&dag),
        id,
    )?;
    Ok(exit::OK)
}

/// `backfill rollback`: a backfill of kind `rollback` that puts back, per interval, the rows
/// that the current publish of each chosen SQL task replaced. An interval without a kept version
/// for a chosen task fails (exit 3) and is left untouched.
pub(crate) fn rollback(
    g: &Global,
    dag_id: &str,
    from: &str,
    to: &str,
    only: &[String],
    max_active_runs: Option<u32>,
) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id)?;
    let mut chosen: Vec<(&crate::project::Task, &crate::project::SqlTask)> = Vec::new();
    for t in only {
        match dag.tasks.iter().find(|x| &x.id == t) {
            None => {
                return Err(crate::session::unknown_task(
                    &dag,
                    &format!("--task {t}"),
                    t,
                ));
            }
            Some(task) => match &task.kind {
                TaskKind::Sql(sql) => chosen.push((task, sql)),
                TaskKind::Command(_) => {
                    return Err(Error::Usage(format!(
                        "--task {t}: task `{t}` of DAG `{}` is a command task; only SQL tasks keep the rows they replace",
                        dag.id
                    )));
                }
            },
        }
    }
    if only.is_empty() {
        chosen = dag
            .tasks
            .iter()
            .filter_map(|t| match &t.kind {
                TaskKind::Sql(sql) => Some((t, sql)),
                TaskKind::Command(_) => None,
            })
            .collect();
    }
    if chosen.is_empty() {
        return Err(Error::Usage(format!(
            "DAG `{}` has no SQL task: only SQL tasks keep the rows a publish replaces, so there is nothing to roll back",
            dag.id
        )));
    }
    let now = clock::now()?;
    let range = resolve_args(from, to, now, dag.tz)?;
    let intervals = expand_nonempty(&dag.schedule, range, from, to)?;
    let max_active_runs = max_active_runs.or(dag.max_active_runs).unwrap_or(1);
    crate::limits::room_for_runs(max_active_runs, Some("--max-active-runs"))?;
    let window = DataInterval::new(intervals[0].start, intervals[intervals.len() - 1].end);
    let mut reprs = HashMap::new();
    for (task, sql) in &chosen {
        let problem = |e: String| Error::Usage(format!("{}: task `{}`: {e}", dag.file, task.id));
        let repr = crate::warehouse::backend_of(&sql.warehouse)
            .prepare(sql, task.gate.as_ref(), window, dag.tz)
            .map_err(|p| problem(p.message))?;
        reprs.insert(task.id.clone(), repr);
    }
    let (range_start, range_end) = crate::session::launch::unix_range(range);
    let tasks = (!only.is_empty()).then(|| only.to_vec());
    let request = NewBackfill {
        from_arg: from.to_string(),
        to_arg: to.to_string(),
        range_start,
        range_end,
        tasks: tasks.clone(),
        ..request_over(
            &dag,
            &intervals,
            BackfillKind::Rollback,
            "{}".into(),
            max_active_runs,
        )
    };
    let options = run_every(dag.depends_on_past)?;
    let (code, _) = crate::session::launch::launch(
        g,
        &project,
        crate::session::launch::Launch {
            dag,
            conf: serde_json::json!({}),
            intervals,
            request,
            options,
            changed: &HashSet::new(),
            upstream: &HashMap::new(),
            reprs,
            mode: Mode::Rollback(tasks),
        },
    )?;
    Ok(code)
}
