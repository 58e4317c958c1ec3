//! `backfill dags`: the project's DAGs (id, schedule, timezone, tasks in run order, file); with
//! `--output json` one document per DAG.

use serde::Serialize;

use super::grid::Grid;
use super::out::Sink;
use crate::exit::Error;
use crate::project::{Dag, TaskKind};

#[derive(Serialize)]
struct DagDoc<'a> {
    id: &'a str,
    file: &'a str,
    schedule: &'a str,
    timezone: &'a str,
    max_active_runs: Option<u32>,
    depends_on_past: bool,
    tasks: Vec<TaskDoc<'a>>,
}

#[derive(Serialize)]
struct TaskDoc<'a> {
    id: &'a str,
    kind: &'static str,
    depends_on: &'a [String],
}

/// The DAGs as JSON documents.
pub(crate) fn dag_docs(dags: &[Dag]) -> serde_json::Value {
    serde_json::to_value(dag_doc_list(dags)).unwrap_or(serde_json::Value::Null)
}

fn dag_doc_list(dags: &[Dag]) -> Vec<DagDoc<'_>> {
    dags.iter()
        .map(|d| DagDoc {
            id: &d.id,
            file: &d.file,
            schedule: d.schedule.expr(),
            timezone: d.tz.name(),
            max_active_runs: d.max_active_runs,
            depends_on_past: d.depends_on_past,
            tasks: d
                .tasks
                .iter()
                .map(|t| TaskDoc {
                    id: &t.id,
                    kind: match t.kind {
                        TaskKind::Command(_) => "command",
                        TaskKind::Sql(_) => "sql",
                    },
                    depends_on: &t.depends_on,
                })
                .collect(),
        })
        .collect()
}

pub(crate) fn write(out: &mut Sink<'_>, dags: &[Dag]) -> Result<(), Error> {
    if out.json {
        return out.json(&dag_doc_list(dags));
    }
    if dags.is_empty() {
        out.note("no DAGs: add TOML files to dags/");
        return Ok(());
    }
    let mut t = Grid::new(vec!["dag", "schedule", "timezone", "tasks", "file"]);
    for d in dags {
        t.row(vec![
            d.id.clone(),
            d.schedule.expr().to_string(),
            d.tz.name().to_string(),
            d.tasks
                .iter()
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>()
                .join(" → "),
            d.file.clone(),
        ]);
    }
    out.text(&t.render(out.fit))
}
