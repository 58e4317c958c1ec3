//! `dags` lists the project's DAGs; `dags validate` checks every file and prepares every SQL
//! task against its warehouse, reports every error of every file (each with
//! `file:line:column`), and exits 2 on any. It also warns, without failing, about gates that
//! `--reprocess-behavior changed` cannot rely on to see late data.

use crate::exit::{self, Error};
use crate::report::{self, out};
use crate::session::Global;

pub(crate) fn run(g: &Global, validate: bool) -> Result<u8, Error> {
    let project = g.project()?;
    let (dags, mut errors) = project.load_all();
    if validate {
        errors.extend(crate::warehouse::validate::sql_tasks(&dags));
    }
    for e in &errors {
        out::note(&format!("error: {e}"));
    }
    if validate {
        let warnings: Vec<(String, String)> = dags
            .iter()
            .filter_map(crate::probe::blind_spot)
            .flat_map(|spot| spot.validate_warnings())
            .collect();
        for (location, message) in &warnings {
            out::note(&format!("warning: {location}: {message}"));
        }
        if g.json {
            let listed: Vec<serde_json::Value> = errors
                .iter()
                .map(|e| serde_json::json!({"location": e.location, "message": e.message}))
                .collect();
            let mut doc = serde_json::json!({
                "valid": errors.is_empty(),
                "dags": dags.len(),
                "errors": listed,
                "warnings": warnings
                    .iter()
                    .map(|(location, message)| serde_json::json!({"location": location, "message": message}))
                    .collect::<Vec<_>>(),
                "exit_code": if errors.is_empty() { exit::OK } else { exit::USAGE },
            });
            if !errors.is_empty() {
                doc["error"] = error_doc(errors.len());
            }
            out::json(&doc)?;
        }
        let files = project.dag_files().len();
        if errors.is_empty() {
            if !g.quiet && !g.json {
                out::note(&format!(
                    "{} OK",
                    out::plural(i64::try_from(files).unwrap_or(0), "DAG file", "DAG files")
                ));
            }
            return Ok(exit::OK);
        }
        out::note(&format!(
            "{} in DAG files",
            out::plural(i64::try_from(errors.len()).unwrap_or(0), "error", "errors")
        ));
        return Ok(exit::USAGE);
    }
    if g.json && !errors.is_empty() {
        // The usable DAGs, and the error document every failing command prints.
        let mut doc = serde_json::json!({
            "dags": report::dags::dag_docs(&dags),
            "exit_code": exit::USAGE,
        });
        doc["error"] = error_doc(errors.len());
        out::json(&doc)?;
        return Ok(exit::USAGE);
    }
    if !g.json && dags.is_empty() && !errors.is_empty() {
        out::note(&format!(
            "no usable DAGs: {} ({} lists them)",
            out::plural(
                i64::try_from(errors.len()).unwrap_or(0),
                "error in DAG files",
                "errors in DAG files"
            ),
            out::hint("dags validate")
        ));
        return Ok(exit::USAGE);
    }
    report::dags::write(&mut out::Sink::std(g.json, g.verbose), &dags)?;
    Ok(if errors.is_empty() {
        exit::OK
    } else {
        exit::USAGE
    })
}

fn error_doc(errors: usize) -> serde_json::Value {
    serde_json::json!({
        "kind": "configuration",
        "message": format!(
            "{} in DAG files",
            out::plural(i64::try_from(errors).unwrap_or(0), "error", "errors")
        ),
    })
}
