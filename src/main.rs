use std::process::ExitCode;

use clap::Parser;

use backfill::cli::{Cli, Output};
use backfill::exit::{self, Error};

/// Whether a command line that clap refused asked for JSON output, for the error document:
/// clap parses it again leniently, so that nothing reads the raw arguments by hand (they need
/// not be UTF-8).
fn json_requested() -> bool {
    use clap::CommandFactory;
    Cli::command()
        .ignore_errors(true)
        .try_get_matches()
        .ok()
        .and_then(|m| m.get_one::<Output>("output").copied())
        == Some(Output::Json)
}

/// On stdout with `--output json`: the error as a document a program can read.
fn print_json_error(kind: &str, message: &str, code: u8) {
    let doc = serde_json::json!({
        "error": {"kind": kind, "message": message},
        "exit_code": code,
    });
    println!("{doc}");
}

fn main() -> ExitCode {
    // Before anything else: a panic on any thread ends the process (see `crash`), SQLite's
    // error log says why a file could not be opened, and the open-files limit is as high as
    // the hard limit lets it be.
    backfill::crash::install();
    backfill::limits::watch_sqlite();
    backfill::limits::raise();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            if code == exit::USAGE && json_requested() {
                print_json_error("usage", e.to_string().trim(), code);
            }
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let json = cli.output == Output::Json;
    if let Err(e) = backfill::log::init(cli.verbose, cli.log_format) {
        backfill::report::out::say(&format!("error: {e}"));
        if json {
            print_json_error(e.kind(), &e.to_string(), e.exit_code());
        }
        return ExitCode::from(e.exit_code());
    }
    match backfill::commands::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(Error::ClosedPipe) => ExitCode::from(exit::OK),
        Err(e) => {
            for line in e.to_string().lines() {
                backfill::report::out::say(&format!("error: {line}"));
            }
            if json {
                print_json_error(e.kind(), &e.to_string(), e.exit_code());
            }
            ExitCode::from(e.exit_code())
        }
    }
}
