//! `dags` lists the project's DAGs; `dags validate` checks every file and exits 2 on any error.

use super::Global;
use crate::exit::{self, Error};
use crate::report::tables;

pub fn run(g: &Global, validate: bool) -> Result<u8, Error> {
    let project = g.project()?;
    let (dags, errors) = project.load_all();
    for e in &errors {
        eprintln!("error: {e}");
    }
    if validate {
        if errors.is_empty() {
            eprintln!("{} DAG files OK", dags.len());
            if g.json {
                tables::print_json(
                    &serde_json::json!({"valid": true, "dags": dags.len(), "errors": []}),
                );
            }
            return Ok(exit::OK);
        }
        if g.json {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            tables::print_json(
                &serde_json::json!({"valid": false, "dags": dags.len(), "errors": errors}),
            );
        }
        eprintln!("{} error(s) in DAG files", errors.len());
        return Ok(exit::USAGE);
    }
    tables::print_dags(&dags, g.json);
    Ok(if errors.is_empty() {
        exit::OK
    } else {
        exit::USAGE
    })
}
