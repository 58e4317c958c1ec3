//! `list`, `show` and `runs`: read the manifest; never create or change it.

use super::{Global, unknown_backfill};
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::resolve_args;
use crate::manifest::{self, queries};
use crate::report::tables;

pub fn list(g: &Global, dag: Option<&str>, active: bool) -> Result<u8, Error> {
    let path = g.manifest_path(None)?;
    let rows = match manifest::open_if_exists(&path)? {
        Some(conn) => queries::list(&conn, dag, active)?,
        None => Vec::new(),
    };
    tables::print_list(&rows, g.json);
    Ok(exit::OK)
}

pub fn show(g: &Global, id: i64) -> Result<u8, Error> {
    let path = g.manifest_path(None)?;
    let Some(conn) = manifest::open_if_exists(&path)? else {
        return Err(unknown_backfill(id, &path));
    };
    let Some(detail) = queries::show(&conn, id)? else {
        return Err(unknown_backfill(id, &path));
    };
    // Local labels when the DAG is still in the project; UTC otherwise.
    let tz = g
        .project()
        .ok()
        .and_then(|p| p.dag(&detail.backfill.dag_id).ok())
        .map(|d| d.tz);
    tables::print_show(&detail, tz, g.json);
    Ok(exit::OK)
}

pub fn runs(g: &Global, dag_id: &str, from: Option<&str>, to: Option<&str>) -> Result<u8, Error> {
    let project = g.project()?;
    let path = g.manifest_path(Some(&project))?;
    let (lo, hi) = match (from, to) {
        (Some(from), Some(to)) => {
            let dag = project.dag(dag_id)?;
            // The interval starts `create` would run for the same --from and --to.
            resolve_args(from, to, clock::now()?, dag.tz)?.unix_start_bounds()
        }
        _ => (i64::MIN, i64::MAX),
    };
    let rows = match manifest::open_if_exists(&path)? {
        Some(conn) => queries::runs(&conn, dag_id, lo, hi)?,
        None => Vec::new(),
    };
    tables::print_runs(&rows, g.json);
    Ok(exit::OK)
}
