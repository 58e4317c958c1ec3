//! `backfill create`: validate everything, plan against the manifest and lease the intervals in
//! one transaction, then run them (or, with `--dry-run`, print the plan and write nothing).

use super::execute::{Execution, execute};
use super::{Global, repair};
use crate::cli::CreateArgs;
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, expand_nonempty, resolve_args};
use crate::manifest::{self, NewBackfill, lease::LeaseCtx, writer::Writer};
use crate::plan::{self, Action, Prior, Reprocess};
use crate::project::{CommandSpec, Dag, Gate, SourceCount, TaskKind};
use crate::report::tables;
use crate::task::{command, template};
use crate::warehouse;

pub fn run(g: &Global, args: CreateArgs) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(&args.dag)?;
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
    check_tasks(&dag, &conf, intervals[0])?;
    let reprocess = Reprocess::from(args.reprocess_behavior);
    let max_active_runs = args.max_active_runs.or(dag.max_active_runs).unwrap_or(1);
    let options = plan::Options {
        reprocess,
        run_backwards: args.run_backwards,
        depends_on_past: dag.depends_on_past,
        now,
    };
    let manifest_path = g.manifest_path(Some(&project))?;
    let ctx = LeaseCtx::new(project.lease_timeout);

    if args.dry_run {
        let (prior, before) = match manifest::open_existing(&manifest_path)? {
            Some(conn) => manifest::priors(&conn, &dag.id, &intervals, &ctx)?,
            None => (vec![Prior::default(); intervals.len()], None),
        };
        let rows = plan::plan(&intervals, &prior, before, options);
        tables::print_plan(
            &dag,
            &rows,
            reprocess.as_str(),
            args.run_backwards,
            max_active_runs,
            g.json,
        );
        return Ok(exit::OK);
    }

    let request = NewBackfill {
        dag_id: dag.id.clone(),
        from_arg: args.from.clone(),
        to_arg: args.to.clone(),
        range_start: range.start.timestamp(),
        range_end: range.end_exclusive.timestamp(),
        reprocess,
        max_active_runs,
        run_backwards: args.run_backwards,
        allow_drift: args.allow_drift,
        conf: conf.to_string(),
    };
    let writer = Writer::spawn(manifest::open_writer(&manifest_path, project.durability)?)?;
    let dag_id = dag.id.clone();
    let repair_dag = dag.clone();
    let (backfill_id, rows) = writer.call_blocking(move |c| {
        let finish = |c: &rusqlite::Connection, owner| repair::publishes(c, &repair_dag, owner);
        manifest::repair_stale_leases(c, &dag_id, &ctx, &finish)?;
        let (prior, before) = manifest::priors(c, &dag_id, &intervals, &ctx)?;
        let rows = plan::plan(&intervals, &prior, before, options);
        let id = manifest::insert_backfill(c, &request, &rows, &ctx)?;
        let to_run = rows
            .iter()
            .filter(|r| r.action == Action::Run)
            .map(|r| r.interval);
        manifest::take_leases(c, id, &dag_id, to_run, &ctx)?;
        Ok((id, rows))
    })?;
    let to_run: Vec<DataInterval> = rows
        .iter()
        .filter(|r| r.action == Action::Run)
        .map(|r| r.interval)
        .collect();
    let planned = rows.len();
    drop(rows);
    if !g.quiet && !g.json {
        eprintln!(
            "backfill {backfill_id} of {}: {} intervals, {} to run, {} skipped, up to {max_active_runs} at a time",
            dag.id,
            planned,
            to_run.len(),
            planned - to_run.len()
        );
    }
    execute(
        g,
        &project,
        Execution {
            backfill_id,
            dag,
            conf,
            max_active_runs,
            intervals: to_run,
            allow_drift: args.allow_drift,
        },
        writer,
    )
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
/// key that was not given fails now; each SQL task prepares against its warehouse (created from
/// its init files if needed) with known bind parameters and columns the target has.
pub(super) fn check_tasks(
    dag: &Dag,
    conf: &serde_json::Value,
    first: DataInterval,
) -> Result<(), Error> {
    let values = template::IntervalValues::new(first, dag.tz);
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
                let conn =
                    warehouse::open(&sql.warehouse).map_err(|e| problem(format!("{e:#}")))?;
                warehouse::check_task(&conn, sql, task.gate.as_ref()).map_err(problem)?;
            }
        }
        for spec in commands {
            command::render(spec, &ctx)
                .map_err(|e| problem(format!("{e}; pass the missing value with --conf")))?;
        }
    }
    Ok(())
}
