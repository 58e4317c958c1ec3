use std::process::ExitCode;

use clap::Parser;

use backfill::cli::{Cli, Output};
use backfill::exit::{self, Error};

/// Whether the command line asks for JSON output, read before clap has parsed it (for the
/// error document of a command line that does not parse).
fn json_requested() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--output=json")
        || args
            .windows(2)
            .any(|w| w[0] == "--output" && w[1] == "json")
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
        eprintln!("error: {e}");
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
                eprintln!("error: {line}");
            }
            if json {
                print_json_error(e.kind(), &e.to_string(), e.exit_code());
            }
            ExitCode::from(e.exit_code())
        }
    }
}
