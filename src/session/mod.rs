//! A backfill from launch to outcome: checking its tasks, recovering what dead owners left,
//! planning and leasing in chunks, heartbeats, the dispatcher that runs its intervals and
//! watches signals, and cascades to downstream DAGs. The commands that start or continue a
//! backfill (create, resume, promote, rollback) are thin layers over [`launch`] and
//! [`resume`].

mod beat;
pub(crate) mod belonging;
pub(crate) mod cascade;
pub(crate) mod chain;
mod execute;
pub(crate) mod join;
pub(crate) mod launch;
pub(crate) mod outcome;
pub(crate) mod resume;
pub(crate) mod staged;
mod succession;
pub(crate) mod tasks;
mod worker;

use std::path::PathBuf;

use crate::exit::Error;
use crate::project::Project;

/// Options that every command shares.
pub(crate) struct Global {
    pub project_dir: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
    pub verbose: bool,
}

impl Global {
    pub(crate) fn project(&self) -> Result<Project, Error> {
        let project = Project::discover(self.project_dir.as_deref())?;
        // Its folders are made only while it is there (a project removed mid-run is not made
        // again by the logs of the tries that follow).
        crate::process::folders::set_project_root(&project.root);
        // The audit files of a manifest in PostgreSQL go to the project's own folder.
        crate::warehouse::set_state_dir(project.root.join(".backfill"));
        // A manifest in PostgreSQL silent for longer than a lease is given up on, and a session
        // of it frozen inside a transaction is ended well within half a lease.
        crate::manifest::postgres::set_lease_timeout(project.lease_timeout);
        // Logs of earlier runs say a manifest was there: an empty one is then refused.
        crate::manifest::ours::set_history(vec![project.logs_dir.clone()]);
        Ok(project)
    }

    /// `--manifest`, else the project's manifest.
    pub(crate) fn manifest_path(&self, project: Option<&Project>) -> Result<PathBuf, Error> {
        match (&self.manifest, project) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(project)) => Ok(project.manifest_path.clone()),
            (None, None) => Ok(self.project()?.manifest_path),
        }
    }
}

/// A warning for the user, on stderr (also with `-q`: something needs attention).
pub(crate) fn warn(_g: &Global, text: &str) {
    crate::report::out::say(&format!("warning: {text}"));
}

/// Something worth knowing that is not a problem: left out by `-q`, so that a quiet success
/// stays silent.
pub(crate) fn note(g: &Global, text: &str) {
    if !g.quiet {
        crate::report::out::say(&format!("note: {text}"));
    }
}

/// The project, its manifest's path, a read-only connection and backfill `id`; exit 2 when the
/// manifest or the backfill does not exist.
pub(crate) fn find_backfill(
    g: &Global,
    id: i64,
) -> Result<
    (
        Project,
        PathBuf,
        Box<dyn crate::manifest::Reads>,
        crate::manifest::Backfill,
    ),
    Error,
> {
    let project = g.project()?;
    let path = g.manifest_path(Some(&project))?;
    let Some(conn) = crate::manifest::open_if_exists(&path)? else {
        return Err(unknown_backfill(id, &path));
    };
    let Some(backfill) = conn.backfill(id).map_err(|e| e.at(&path))? else {
        return Err(unknown_backfill(id, &path));
    };
    Ok((project, path, conn, backfill))
}

/// The error for a task name the DAG does not have (`what` is the option as typed).
pub(crate) fn unknown_task(dag: &crate::project::Dag, what: &str, name: &str) -> Error {
    Error::Usage(format!(
        "{what}: DAG `{}` has no task `{name}` (its tasks: {})",
        dag.id,
        dag.tasks
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The error for a backfill id the manifest does not have.
pub(crate) fn unknown_backfill(id: i64, manifest: &std::path::Path) -> Error {
    Error::Usage(format!(
        "no backfill {id} in the manifest {}; `{}` shows the backfills",
        manifest.display(),
        crate::report::out::hint("list")
    ))
}
