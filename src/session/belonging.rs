//! Which project a backfill belongs to, so that a manifest shared by two projects never mixes
//! their records.
//!
//! Two projects that share one manifest (a team's `BACKFILL_MANIFEST`, a `manifest` path two
//! `backfill.toml` name) and have a DAG of the same id would read each other's runs: the second
//! would skip the first's intervals as `already exists` while its own warehouse lacks them, and
//! its `resume` (or a recovery) would finish the first's publishes into its own warehouse. So
//! every backfill records the project it belongs to and the warehouses its DAG writes, and a
//! project refuses (exit 2, naming both) to plan a DAG whose backfills in the manifest are
//! another project's, and to resume, join, cancel, promote or discard another's backfill.
//!
//! **A project is its name**: `project = "NAME"` in `backfill.toml`, else the name of its
//! folder (as Docker Compose names a project; SQLMesh's `project` serves the same end, several
//! repositories sharing one state database). Several hosts legitimately run one project from
//! checkouts in different places, sharing a PostgreSQL manifest; so the identity is what its
//! checkouts share, not where they are:
//! - a folder's *path* differs between checkouts, hosts and containers, and moving the project
//!   would make it another;
//! - an id the project generated on first use would differ between checkouts that ran before
//!   it was committed (they would refuse each other), could not be written in a read-only
//!   checkout, and says nothing to a person reading the refusal;
//! - a warehouse's identity seen from one host is not reliably what another sees (a SQLite
//!   file's path differs between checkouts and mounts; a PostgreSQL server's identity changes
//!   with `pg_upgrade` or a move, and a restored copy keeps a stored id), and a command DAG has
//!   no warehouse. The warehouses are recorded with each backfill and named in refusals, so
//!   that the operator sees where each project writes, but they do not decide.
//!
//! The name is written in the files every checkout shares, or follows the folder's name, which
//! clones share by default; checkouts in folders of different names (a CI runner's, a release
//! folder) set `project`, as the refusal says. A backfill recorded before the name was kept
//! (`NULL`) is anyone's.

use std::collections::BTreeMap;
use std::path::Path;

use crate::exit::Error;
use crate::manifest::backfills::DagProject;
use crate::manifest::{Backfill, Reads};
use crate::project::{Dag, Project, TaskKind};

/// The warehouses `dag`'s SQL tasks write, as `project` declares them: JSON, each name with its
/// location (a SQLite file's path, a PostgreSQL URL without its password). `None` for a DAG of
/// command tasks only.
pub(crate) fn warehouses_of(dag: &Dag) -> Option<String> {
    let found: BTreeMap<&str, String> = dag
        .tasks
        .iter()
        .filter_map(|t| match &t.kind {
            TaskKind::Sql(sql) => Some((sql.warehouse.name.as_str(), sql.warehouse.location())),
            TaskKind::Command(_) => None,
        })
        .collect();
    (!found.is_empty()).then(|| serde_json::to_string(&found).unwrap_or_default())
}

/// `warehouse shop: /srv/a/warehouse.db`: the warehouses recorded as JSON, for a message;
/// `None` when there are none.
fn writing(warehouses: Option<&str>) -> Option<String> {
    let found: BTreeMap<String, String> = warehouses
        .and_then(|w| serde_json::from_str(w).ok())
        .unwrap_or_default();
    if found.is_empty() {
        return None;
    }
    let each: Vec<String> = found.iter().map(|(n, l)| format!("{n}: {l}")).collect();
    Some(format!(
        "warehouse{} {}",
        if found.len() == 1 { "" } else { "s" },
        each.join(", ")
    ))
}

/// `` `name` (note; note) ``: a project named in a message, with what is known of it.
fn named(name: &str, notes: impl IntoIterator<Item = Option<String>>) -> String {
    let notes: Vec<String> = notes.into_iter().flatten().collect();
    if notes.is_empty() {
        format!("`{name}`")
    } else {
        format!("`{name}` ({})", notes.join("; "))
    }
}

/// This project, for a message: its name, where the name comes from when backfill.toml does
/// not give it, and the warehouses `dag` writes.
fn this_one(project: &Project, dag: Option<&Dag>) -> String {
    let warehouses = dag.and_then(warehouses_of);
    named(
        &project.name,
        [
            (!project.named)
                .then(|| "its folder's name: backfill.toml sets no `project`".to_string()),
            writing(warehouses.as_deref()),
        ],
    )
}

/// What to do about a manifest two projects share, `theirs` being the other's name.
fn fix(theirs: &str, what: &str) -> String {
    format!(
        "{what}; give each project a manifest of its own (`manifest` in backfill.toml, or BACKFILL_MANIFEST); or, if both folders hold one project (its checkouts on several hosts), give them one name: `project = \"{theirs}\"` in the backfill.toml of each"
    )
}

/// Refuses backfill `b` when it belongs to another project (exit 2, naming both); `command` is
/// what was asked of it (`resume`, `join`, ...).
pub(crate) fn check_backfill(
    project: &Project,
    manifest: &Path,
    b: &Backfill,
    command: &str,
) -> Result<(), Error> {
    let Some(theirs) = b.project.as_deref().filter(|p| *p != project.name) else {
        return Ok(());
    };
    let dag = project.dag(&b.dag_id).ok();
    Err(Error::Usage(format!(
        "backfill {} belongs to project {}, not to this one, {}: two projects share the manifest {}. {}",
        b.id,
        named(theirs, [writing(b.warehouses.as_deref())]),
        this_one(project, dag.as_ref()),
        manifest.display(),
        fix(
            theirs,
            &format!(
                "Run `backfill {command} {}` from that project's folder",
                b.id
            )
        )
    )))
}

pub(crate) use crate::manifest::backfills::other_project;

/// The refusal to plan `dag` where the manifest at `manifest` holds `theirs`, another
/// project's backfills of it.
pub(crate) fn dag_refused(
    project: &Project,
    manifest: &Path,
    dag: &Dag,
    theirs: &DagProject,
) -> Error {
    let backfills = if theirs.backfills == 1 {
        format!("backfill {}", theirs.first)
    } else {
        format!(
            "{} backfills, {} to {}",
            theirs.backfills, theirs.first, theirs.last
        )
    };
    Error::Usage(format!(
        "DAG `{}` in the manifest {} belongs to project {}, not to this one, {}: what its runs there recorded (the intervals that `already exist`, those in flight) is not this project's. {}",
        dag.id,
        manifest.display(),
        named(
            &theirs.project,
            [Some(backfills), writing(theirs.warehouses.as_deref())]
        ),
        this_one(project, Some(dag)),
        fix(&theirs.project, "Rename this project's DAG (its `id`)")
    ))
}

/// Refuses to plan `dag` where the manifest holds another project's backfills of it (exit 2,
/// naming both).
pub(crate) fn check_dag(
    project: &Project,
    manifest: &Path,
    reads: &dyn Reads,
    dag: &Dag,
) -> Result<(), Error> {
    let found = reads
        .dag_projects(&dag.id)
        .map_err(|e| Error::Manifest(e.at(manifest)))?;
    match other_project(&project.name, &found) {
        Some(theirs) => Err(dag_refused(project, manifest, dag, theirs)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warehouses_read_as_their_names_and_locations() {
        assert_eq!(writing(None), None);
        assert_eq!(writing(Some("{}")), None);
        assert_eq!(
            named("alpha", [writing(Some(r#"{"shop":"/a/warehouse.db"}"#))]),
            "`alpha` (warehouse shop: /a/warehouse.db)"
        );
        assert_eq!(
            named(
                "beta",
                [
                    Some("backfill 1".into()),
                    writing(Some(r#"{"a":"x.db","b":"postgresql://db/b"}"#))
                ]
            ),
            "`beta` (backfill 1; warehouses a: x.db, b: postgresql://db/b)"
        );
        assert_eq!(named("gamma", [None]), "`gamma`");
    }

    #[test]
    fn another_project_is_one_of_another_name() {
        let p = |name: &str, first| DagProject {
            project: name.into(),
            first,
            last: first,
            backfills: 1,
            warehouses: None,
        };
        let found = [p("alpha", 1), p("beta", 2)];
        assert_eq!(other_project("alpha", &found), Some(&found[1]));
        assert_eq!(other_project("beta", &found), Some(&found[0]));
        assert_eq!(other_project("alpha", &found[..1]), None);
        assert_eq!(other_project("alpha", &[]), None);
    }
}
