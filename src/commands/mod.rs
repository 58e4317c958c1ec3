//! One module per subcommand. Each validates its input completely before it writes anything.

mod beat;
mod cancel;
mod cascade;
mod create;
mod dags;
mod docs;
mod execute;
mod init;
mod read;
mod resume;
pub mod staging;
mod verify;

use std::path::PathBuf;

use crate::cli::{Cli, Command, Output};
use crate::exit::Error;
use crate::project::Project;

/// Options that every command shares.
pub struct Global {
    pub project_dir: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
    pub verbose: bool,
}

impl Global {
    pub fn project(&self) -> Result<Project, Error> {
        Ok(Project::discover(self.project_dir.as_deref())?)
    }

    /// `--manifest`, else the project's manifest.
    pub fn manifest_path(&self, project: Option<&Project>) -> Result<PathBuf, Error> {
        match (&self.manifest, project) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(project)) => Ok(project.manifest_path.clone()),
            (None, None) => Ok(self.project()?.manifest_path),
        }
    }
}

/// Runs the command; returns the exit code.
pub fn run(cli: Cli) -> Result<u8, Error> {
    crate::report::out::set_invocation(cli.project.as_deref(), cli.manifest.as_deref());
    let g = Global {
        project_dir: cli.project,
        manifest: cli.manifest,
        json: cli.output == Output::Json,
        quiet: cli.quiet,
        verbose: cli.verbose > 0,
    };
    match cli.command {
        Command::Create(args) => create::run(&g, args),
        Command::Resume { id } => resume::run(&g, id),
        Command::Cancel { id, wait } => cancel::run(&g, id, wait),
        Command::List { dag, active } => read::list(&g, dag.as_deref(), active),
        Command::Show { id } => read::show(&g, id),
        Command::Runs { dag, from, to } => read::runs(&g, &dag, from.as_deref(), to.as_deref()),
        Command::Stale {
            dag,
            from,
            to,
            conf,
        } => read::stale(&g, &dag, &from, &to, conf.as_deref()),
        Command::Diff { id, intervals } => staging::diff(&g, id, &intervals),
        Command::Promote {
            id,
            intervals,
            allow_drift,
        } => staging::promote(&g, id, &intervals, allow_drift),
        Command::Discard { id, intervals } => staging::discard(&g, id, &intervals),
        Command::Rollback {
            dag,
            from,
            to,
            tasks,
            max_active_runs,
        } => staging::rollback(&g, &dag, &from, &to, &tasks, max_active_runs),
        Command::Verify {
            dag,
            from,
            to,
            conf,
        } => verify::run(&g, &dag, &from, &to, conf.as_deref()),
        Command::Dags { action } => dags::run(&g, action.is_some()),
        Command::Init { dir } => init::run(&g, dir.as_deref()),
        Command::Completions { shell } => docs::completions(shell),
        Command::Man { dir } => docs::man(&g, dir.as_deref()),
    }
}

/// A warning for the user, on stderr (also with `-q`: something needs attention).
fn warn(_g: &Global, text: &str) {
    eprintln!("warning: {text}");
}

/// Something worth knowing that is not a problem: left out by `-q`, so that a quiet success
/// stays silent.
fn note(g: &Global, text: &str) {
    if !g.quiet {
        eprintln!("note: {text}");
    }
}

/// The project, its manifest's path, a read-only connection and backfill `id`; exit 2 when the
/// manifest or the backfill does not exist.
fn find_backfill(
    g: &Global,
    id: i64,
) -> Result<
    (
        Project,
        PathBuf,
        rusqlite::Connection,
        crate::manifest::Backfill,
    ),
    Error,
> {
    let project = g.project()?;
    let path = g.manifest_path(Some(&project))?;
    let Some(conn) = crate::manifest::open_if_exists(&path)? else {
        return Err(unknown_backfill(id, &path));
    };
    let Some(backfill) = crate::manifest::backfills::get(&conn, id).map_err(|e| e.at(&path))?
    else {
        return Err(unknown_backfill(id, &path));
    };
    Ok((project, path, conn, backfill))
}

/// The error for a task name the DAG does not have (`what` is the option as typed).
fn unknown_task(dag: &crate::project::Dag, what: &str, name: &str) -> Error {
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
fn unknown_backfill(id: i64, manifest: &std::path::Path) -> Error {
    Error::Usage(format!(
        "no backfill {id} in the manifest {}; `{}` shows the backfills",
        manifest.display(),
        crate::report::out::hint("list")
    ))
}
