//! One module per subcommand. Each validates its input completely before it writes anything.

mod cancel;
mod create;
mod dags;
mod docs;
mod init;
mod read;
mod resume;
mod staging;
mod verify;

use crate::cli::{Cli, Command, Output};
use crate::exit::Error;
use crate::session::Global;

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
