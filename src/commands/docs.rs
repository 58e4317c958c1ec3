//! `backfill completions SHELL` and `backfill man`: generated from the command line's own
//! definition, so they never fall behind it.

use clap::CommandFactory;

use crate::cli::{Cli, Shell};
use crate::exit::{self, Error};

fn write_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Error::ClosedPipe
    } else {
        Error::io("cannot write to stdout", e)
    }
}

pub fn completions(shell: Shell) -> Result<u8, Error> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "backfill", &mut buf);
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(&buf)
        .map_err(write_error)?;
    Ok(exit::OK)
}

pub fn man(g: &super::Global, dir: Option<&std::path::Path>) -> Result<u8, Error> {
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        clap_mangen::generate_to(Cli::command(), dir).map_err(|e| {
            Error::io(
                format!("cannot write manual pages into {}", dir.display()),
                e,
            )
        })?;
        if !g.quiet {
            crate::report::out::note(&format!(
                "wrote backfill.1 and a page per subcommand (backfill-create.1, ...) into {}",
                dir.display()
            ));
        }
        return Ok(exit::OK);
    }
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut buf)
        .map_err(|e| Error::io("cannot render the manual page", e))?;
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(&buf)
        .map_err(write_error)?;
    Ok(exit::OK)
}
