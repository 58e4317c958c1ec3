//! `dags validate` against the warehouses: every SQL task's statements are prepared against its
//! warehouse (created from its init files when its file does not exist, as a dry run does), and
//! each problem is reported at the `file:line:col` of the key it is about.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::TaskProblem;
use crate::project::{ConfigError, Dag, Task, TaskKind};

/// The `file:line:col` of the key a problem of `task` is about, when known.
pub(crate) fn location(task: &Task, problem: &TaskProblem) -> Option<String> {
    let at = &task.locations;
    match problem.key {
        "target" => at.target.clone(),
        "gate.source_count" => at.source_count.clone(),
        "gate.source_fingerprint" => at.source_fingerprint.clone(),
        "gate.rules" => problem
            .rule
            .and_then(|i| at.rules.get(i))
            .map(crate::project::StringAt::start),
        _ => at
            .sql
            .as_ref()
            .map(|sql| problem.offset.map_or_else(|| sql.start(), |o| sql.at(o))),
    }
}

/// Every problem of every SQL task of `dags` against its warehouse, one per task, in the order
/// of the DAGs and their tasks. A warehouse that cannot be opened is one problem, at the first
/// task that uses it.
pub(crate) fn sql_tasks(dags: &[Dag]) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let mut warehouses = HashMap::new();
    for dag in dags {
        for task in &dag.tasks {
            let TaskKind::Sql(sql) = &task.kind else {
                continue;
            };
            let backend = super::backend_of(&sql.warehouse);
            let problem = match warehouses.entry(sql.warehouse.name.clone()) {
                Entry::Occupied(o) => match o.get() {
                    // The warehouse could not be opened: said once, at its first task.
                    false => continue,
                    true => backend.check(sql, task.gate.as_ref()),
                },
                Entry::Vacant(v) => {
                    // What a killed command left in the warehouse goes first.
                    backend.sweep(&sql.warehouse);
                    match backend.reachable(&sql.warehouse) {
                        Err(e) => {
                            v.insert(false);
                            errors.push(ConfigError {
                                location: task.locations.id.clone(),
                                message: format!("task `{}`: {e}", task.id),
                            });
                            continue;
                        }
                        Ok(()) => {
                            v.insert(true);
                            backend.check(sql, task.gate.as_ref())
                        }
                    }
                }
            };
            let Err(problem) = problem else {
                if dag.batch_size > 1
                    && let Some(why) = super::batch_problem(task)
                {
                    errors.push(ConfigError {
                        location: task
                            .locations
                            .sql
                            .as_ref()
                            .map_or_else(|| dag.file.clone(), |s| s.start()),
                        message: format!(
                            "`batch_size = {}` cannot be used: {why}; remove `batch_size`",
                            dag.batch_size
                        ),
                    });
                }
                continue;
            };
            errors.push(ConfigError {
                location: location(task, &problem).unwrap_or_else(|| dag.file.clone()),
                message: format!("task `{}`: {}", task.id, problem.message),
            });
        }
    }
    errors
}
