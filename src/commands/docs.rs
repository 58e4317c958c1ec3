//! `backfill completions SHELL` and `backfill man`: generated from the command line's own
//! definition, so they never fall behind it. The bash script also completes `--dag` with the
//! DAG ids of the project (the names of its `dags/*.toml` files), found as `backfill` finds
//! it: `-C DIR` on the command line, else the nearest folder upwards holding `backfill.toml`.

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

pub(crate) fn completions(shell: Shell) -> Result<u8, Error> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "backfill", &mut buf);
    if shell == clap_complete::Shell::Bash {
        buf = bash_with_dags(&String::from_utf8_lossy(&buf)).into_bytes();
    }
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(&buf)
        .map_err(write_error)?;
    Ok(exit::OK)
}

/// A bash function that prints the DAG ids of the project the command line being completed
/// names (`-C DIR`, `--project DIR`), else of the nearest folder upwards holding
/// `backfill.toml`: the names of its `dags/*.toml` files.
const BASH_DAGS: &str = r#"# The DAG ids for `--dag`: the names of dags/*.toml of the project that -C or --project
# names on the command line, else of the nearest folder upwards that holds backfill.toml.
_backfill_dags() {
    local dir="" up i f
    for (( i = 1; i < COMP_CWORD; i++ )); do
        case "${COMP_WORDS[i]}" in
            -C|--project)
                dir="${COMP_WORDS[i+1]}"
                [[ "$dir" == "=" ]] && dir="${COMP_WORDS[i+2]}"
                ;;
        esac
    done
    if [[ -n "$dir" ]]; then
        [[ "$dir" == "~" || "$dir" == "~/"* ]] && dir="$HOME${dir:1}"
    else
        up="$PWD"
        while [[ ! -f "$up/backfill.toml" ]]; do
            [[ -z "$up" ]] && return 0
            up="${up%/*}"
        done
        dir="${up:-/}"
    fi
    for f in "$dir"/dags/*.toml; do
        [[ -f "$f" ]] || continue
        f="${f##*/}"
        printf '%s\n' "${f%.toml}"
    done
}

"#;

/// What clap's bash script completes an option's value with when it knows nothing better.
const BASH_FILES: &str = r#"COMPREPLY=($(compgen -f "${cur}"))"#;

/// clap's bash script, with `--dag` completing the project's DAG ids rather than file names.
fn bash_with_dags(script: &str) -> String {
    let mut out = String::with_capacity(script.len() + BASH_DAGS.len());
    out.push_str(BASH_DAGS);
    let mut after_dag = false;
    for line in script.lines() {
        if after_dag && line.trim() == BASH_FILES {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(indent);
            out.push_str(r#"COMPREPLY=($(compgen -W "$(_backfill_dags)" -- "${cur}"))"#);
        } else {
            out.push_str(line);
        }
        out.push('\n');
        after_dag = line.trim() == "--dag)";
    }
    out
}

/// The manual page of `cmd`, its synopsis with each option's value (`-C DIR`, which
/// clap_mangen leaves out).
fn page(cmd: clap::Command) -> std::io::Result<String> {
    let mut cmd = cmd;
    cmd.build();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let mut out = String::with_capacity(text.len() + 256);
    let mut synopsis = false;
    for line in text.lines() {
        if synopsis {
            out.push_str(&with_values(line, &cmd));
        } else {
            out.push_str(line);
        }
        out.push('\n');
        synopsis = line == ".SH SYNOPSIS";
    }
    Ok(out)
}

/// The synopsis line `line` with the value of each option of `cmd` that takes one after its
/// name (`[\fB\-\-manifest\fR \fIPATH\fR]`).
fn with_values(line: &str, cmd: &clap::Command) -> String {
    let mut line = line.to_string();
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if !arg.get_num_args().is_some_and(|n| n.takes_values()) || arg.is_positional() {
            continue;
        }
        let choices: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_string())
            .collect();
        // A choice of a few words reads better than its name (`text|json`, not `OUTPUT`).
        let value = match arg.get_value_names().and_then(|v| v.first()) {
            _ if !choices.is_empty() => choices.join("|"),
            Some(name) => name.to_string(),
            None => arg.get_id().as_str().to_uppercase(),
        };
        // As roff writes them: a backslash doubled, a hyphen as `\-`.
        let value = value.replace('\\', "\\\\").replace('-', "\\-");
        let name = match (arg.get_long(), arg.get_short()) {
            (Some(long), _) => format!("\\fB\\-\\-{}\\fR", long.replace('-', "\\-")),
            (None, Some(short)) => format!("\\fB\\-{short} \\fR"),
            (None, None) => continue,
        };
        for end in ["]", ">"] {
            let at = format!("{name}{end}");
            if line.contains(&at) {
                line = line.replacen(&at, &format!("{name} \\fI{value}\\fR{end}"), 1);
                break;
            }
        }
    }
    line
}

/// Writes the manual page of `cmd` and of each of its subcommands into `dir` (`backfill.1`,
/// `backfill-create.1`, ...), as `clap_mangen::generate_to` does.
fn write_pages(cmd: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir)?;
    }
    let name = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string();
    std::fs::write(dir.join(format!("{name}.1")), page(cmd)?)
}

pub(crate) fn man(g: &super::Global, dir: Option<&std::path::Path>) -> Result<u8, Error> {
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let mut cmd = Cli::command().disable_help_subcommand(true);
        cmd.build();
        write_pages(cmd, dir).map_err(|e| {
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
    let text = page(Cli::command()).map_err(|e| Error::io("cannot render the manual page", e))?;
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(write_error)?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dag_option_of_the_bash_script_completes_dag_ids() {
        let mut buf = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "backfill",
            &mut buf,
        );
        let script = bash_with_dags(&String::from_utf8(buf).unwrap());
        let lines: Vec<&str> = script.lines().map(str::trim).collect();
        let dag_cases: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == "--dag)").collect();
        // create, list, runs, stale, rollback, verify, forget.
        assert_eq!(dag_cases.len(), 7, "{script}");
        for i in dag_cases {
            assert_eq!(
                lines[i + 1],
                r#"COMPREPLY=($(compgen -W "$(_backfill_dags)" -- "${cur}"))"#
            );
        }
        assert_eq!(script.matches("_backfill_dags()").count(), 1);
    }
}
