use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = backfill::cli::Cli::parse();
    match backfill::commands::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
