//! What a backfill runs, as its owner and its workers (`join`, `resume`) see it alike: the
//! DAG's tasks that `--tasks` names, each task checked before anything is written, and the DAGs
//! upstream of a cascade's member.

use std::collections::HashMap;

use crate::exit::Error;
use crate::interval::DataInterval;
use crate::project::{
    self, CommandSpec, ConfigError, Dag, Gate, ProjectError, SourceCount, TaskKind,
};
use crate::task::{command, template};
use crate::warehouse::Repr;

/// `--tasks`: the DAG with only the named tasks, in their order; an unknown name is exit 2.
pub(crate) fn only_tasks(mut dag: Dag, names: &[String]) -> Result<Dag, Error> {
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

/// Checks every task before anything is written: each command (and `publish` and
/// `source_count` command) renders for the first interval, so that a template using a `conf`
/// key that was not given fails now; each SQL task prepares exactly what it will run against
/// its warehouse (created from its init files if needed), and its partition column's
/// representation is decided over the range. Returns those representations by task.
pub(crate) fn check_tasks(
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
        for rule in task.gate.iter().flat_map(|g| &g.rules) {
            if let project::RuleKind::Command(c) = &rule.kind {
                commands.push(c);
            }
        }
        match &task.kind {
            TaskKind::Command(spec) => commands.push(spec),
            TaskKind::Sql(sql) => {
                let backend = crate::warehouse::backend_of(&sql.warehouse);
                // What a killed command left in the warehouse goes first.
                backend.sweep(&sql.warehouse);
                let repr = backend
                    .prepare(sql, task.gate.as_ref(), window, dag.tz)
                    .map_err(|p| match crate::warehouse::validate::location(task, &p) {
                        Some(at) => {
                            Error::Usage(format!("{at}: task `{}`: {}", task.id, p.message))
                        }
                        None => problem(p.message),
                    })?;
                reprs.insert(task.id.clone(), repr);
                if let Some(project::Ready {
                    check: project::ReadyCheck::Sql(ready),
                    ..
                }) = &task.ready
                {
                    check_ready_sql(dag, task, sql, ready)?;
                }
            }
        }
        if let Some(project::Ready {
            check: project::ReadyCheck::Command(c),
            ..
        }) = &task.ready
        {
            commands.push(c);
        }
        for spec in commands {
            command::render(spec, &ctx).map_err(problem)?;
        }
    }
    Ok(reprs)
}

/// A task's readiness query prepares in its warehouse, with known parameters and one column,
/// as the gate's source queries do; a problem is said at the query's place in the DAG file.
fn check_ready_sql(
    dag: &Dag,
    task: &project::Task,
    sql: &project::SqlTask,
    ready: &str,
) -> Result<(), Error> {
    let gate = Gate {
        source_fingerprint: Some(SourceCount::Sql(ready.to_string())),
        ..Gate::default()
    };
    let Err(p) = crate::warehouse::backend_of(&sql.warehouse).check(sql, Some(&gate)) else {
        return Ok(());
    };
    let message = p
        .message
        .replace(
            "key `gate.source_fingerprint`",
            "key `sql` of [tasks.ready]",
        )
        .replace("gate.source_fingerprint", "[tasks.ready] sql");
    let at = match (p.key, &task.locations.ready) {
        ("gate.source_fingerprint", Some(at)) => at.clone(),
        _ => dag.file.clone(),
    };
    Err(Error::Usage(format!("{at}: task `{}`: {message}", task.id)))
}

/// The DAGs whose intervals the intervals of `dag` read, when it is a downstream DAG of a
/// cascade: each of its intervals starts only while they can be read (see
/// [`crate::runner::RunSpec::upstream`]). Empty for any other backfill.
pub(crate) fn upstream_dags(
    project: &crate::project::Project,
    dag: &Dag,
    in_cascade: bool,
) -> Vec<Dag> {
    if !in_cascade || dag.upstream.is_empty() {
        return Vec::new();
    }
    project
        .load_all()
        .0
        .into_iter()
        .filter(|d| dag.upstream.iter().any(|(u, _)| u == &d.id))
        .collect()
}

/// What `dag` computes, as recorded with a backfill (see [`Dag::definition`]).
pub(crate) fn definition_json(dag: &Dag) -> String {
    serde_json::to_string(&dag.definition()).unwrap_or_default()
}

/// What differs between the definition recorded with a backfill and `dag` now: `None` when the
/// backfill recorded none (it is older than the record), else the changed keys (empty: none).
pub(crate) fn definition_changes(recorded: Option<&str>, dag: &Dag) -> Option<Vec<String>> {
    let recorded: std::collections::BTreeMap<String, String> =
        serde_json::from_str(recorded?).ok()?;
    Some(project::definition_changes(&recorded, &dag.definition()))
}

/// Gives `dag` the `--batch-size` its backfill was created with; unless the DAG can no longer
/// run batches (it changed since), and then its intervals run one query each, and a note says
/// why.
pub(crate) fn keep_batch_size(
    g: &super::Global,
    dag: &mut Dag,
    backfill: &crate::manifest::Backfill,
) {
    if let Some(n) = backfill.batch_size {
        dag.batch_size = n;
    }
    if dag.batch_size < 2 {
        return;
    }
    let why = crate::project::batchable(&dag.tasks, dag.depends_on_past, !dag.upstream.is_empty())
        .err()
        .or_else(|| dag.tasks.iter().find_map(crate::warehouse::batch_problem));
    if let Some(why) = why {
        super::note(
            g,
            &format!(
                "backfill {} runs in batches of {}, which DAG `{}` ({}) no longer allows ({why}): its intervals run one query each",
                backfill.id, dag.batch_size, dag.id, dag.file
            ),
        );
        dag.batch_size = 1;
    }
}
