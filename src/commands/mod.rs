//! One module per subcommand. Each validates its input completely before it writes anything.

mod cancel;
mod create;
mod dags;
mod docs;
mod forget;
mod init;
mod manifest;
mod read;
mod resume;
mod serve;
mod staging;
mod verify;

use crate::cli::{BackfillRef, Cli, Command, Output};
use crate::exit::Error;
use crate::session::{Global, note};
use crate::state::BackfillKind;

/// Which backfill `latest` names for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Latest {
    /// The newest backfill of any kind (`show`, `resume`, `cancel`).
    Any,
    /// The newest backfill made by `create --stage` (`diff`, `promote`, `discard`).
    Staged,
}

/// The id that `r` names. `latest` is read from the manifest; none there is exit 2.
fn backfill_id(g: &Global, r: BackfillRef, latest: Latest) -> Result<i64, Error> {
    let BackfillRef::Id(id) = r else {
        let path = g.manifest_path(None)?;
        let kind = (latest == Latest::Staged).then_some(BackfillKind::Stage);
        let found = match crate::manifest::open_if_exists(&path)? {
            Some(conn) => conn.latest_backfill(kind).map_err(|e| e.at(&path))?,
            None => None,
        };
        let Some(id) = found else {
            return Err(Error::Usage(format!(
                "`latest`: the manifest {} has no {} yet; `{}` shows the backfills",
                path.display(),
                match latest {
                    Latest::Any => "backfill",
                    Latest::Staged => "staged backfill (`backfill create --stage`)",
                },
                crate::report::out::hint("list")
            )));
        };
        note(g, &format!("latest: backfill {id}"));
        return Ok(id);
    };
    Ok(id)
}

/// Runs the command; returns the exit code.
pub fn run(cli: Cli) -> Result<u8, Error> {
    crate::limits::claim_signal_pipe()?;
    // What a warehouse says while it works goes to stderr (a closed one is not an error).
    crate::warehouse::on_notice(|text| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{text}");
    });
    if let Some(why) = cli
        .manifest
        .as_deref()
        .and_then(|m| crate::manifest::not_a_location(&m.to_string_lossy()))
    {
        return Err(Error::Usage(format!(
            "--manifest (or BACKFILL_MANIFEST): {why}"
        )));
    }
    // A URL stands as its location without the password (see `manifest::location`), in hints
    // too.
    let manifest = cli.manifest.map(|m| match m.to_str() {
        Some(url) if crate::manifest::is_url(&m) => crate::manifest::location(url),
        _ => m,
    });
    // A manifest named by BACKFILL_MANIFEST stays out of hints: the environment holds it.
    let given = std::env::args_os().any(|a| {
        a.to_str()
            .is_some_and(|a| a == "--manifest" || a.starts_with("--manifest="))
    });
    crate::report::out::set_invocation(
        cli.project.as_deref(),
        manifest.as_deref().filter(|_| given),
    );
    let g = Global {
        project_dir: cli.project,
        manifest,
        json: cli.output == Output::Json,
        quiet: cli.quiet,
        verbose: cli.verbose > 0,
    };
    match cli.command {
        Command::Create(args) => create::run(&g, args),
        Command::Resume { id, wait } => resume::run(&g, backfill_id(&g, id, Latest::Any)?, wait),
        Command::Join {
            id,
            max_active_runs,
        } => crate::session::join::join(&g, backfill_id(&g, id, Latest::Any)?, max_active_runs),
        Command::Cancel { id, wait } => cancel::run(&g, backfill_id(&g, id, Latest::Any)?, wait),
        Command::List { dag, active } => read::list(&g, dag.as_deref(), active),
        Command::Show { id, grid } => read::show(&g, backfill_id(&g, id, Latest::Any)?, grid),
        Command::Serve { listen, token } => serve::run(&g, &listen, token),
        Command::Runs { dag, from, to } => read::runs(&g, &dag, from.as_deref(), to.as_deref()),
        Command::Stale {
            dag,
            from,
            to,
            conf,
        } => read::stale(&g, &dag, &from, &to, conf.as_deref()),
        Command::Diff { id, intervals } => {
            staging::diff(&g, backfill_id(&g, id, Latest::Staged)?, &intervals)
        }
        Command::Promote {
            id,
            intervals,
            allow_drift,
            atomic,
        } => staging::promote(
            &g,
            backfill_id(&g, id, Latest::Staged)?,
            &intervals,
            allow_drift,
            atomic,
        ),
        Command::Discard { id, intervals } => {
            staging::discard(&g, backfill_id(&g, id, Latest::Staged)?, &intervals)
        }
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
        Command::Forget {
            dag,
            from,
            to,
            dry_run,
            yes,
        } => forget::run(
            &g,
            &forget::Ask {
                dag_id: &dag,
                from: from.as_deref(),
                to: to.as_deref(),
                dry_run,
                yes,
            },
        ),
        Command::Dags { action } => dags::run(&g, action.is_some()),
        Command::Manifest {
            action: crate::cli::ManifestAction::Copy { to },
        } => manifest::copy(&g, &to),
        Command::Init { dir } => init::run(&g, dir.as_deref()),
        Command::Completions { shell } => docs::completions(shell),
        Command::Man { dir } => docs::man(&g, dir.as_deref()),
    }
}
