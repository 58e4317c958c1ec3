//! `backfill init [DIR]`: starts a project with a `backfill.toml` and a working example DAG;
//! refuses to overwrite anything.

use std::path::Path;

use crate::exit::{self, Error};
use crate::report::out;
use crate::session::Global;

pub(crate) const PROJECT: &str = r#"# backfill.toml: the project's settings. Every key is optional.
# project = "NAME"                     # its name in a shared manifest (default: the folder's name)
# manifest = ".backfill/manifest.db"   # the run manifest (SQLite)
# logs = ".backfill/logs"              # one log file per task try
# lease_timeout = "30s"                # a backfill silent for this long is considered gone
#
# A SQLite warehouse for SQL tasks, created from SQL files when its file does not exist:
# [warehouse.shop]
# path = "warehouse.db"
# init = ["schema.sql"]
#
# Commands run when a create or resume ends (JSON summary on stdin):
# [notify]
# on_failure = "mail -s 'backfill failed' you@example.com"
"#;

pub(crate) const EXAMPLE_DAG: &str = r#"# An example DAG: one file per day under out/, replaced atomically (write, then rename).
# Try it:  backfill create --dag example --from yesterday --to yesterday
description = "Writes out/DAY.txt for each day."
schedule = "@daily"
timezone = "UTC"
max_active_runs = 2
retries = 1
retry_delay = "5s"

[[tasks]]
id = "hello"
command = '''
mkdir -p out
printf 'hello from %s\n' {{ ds }} > out/{{ ds }}.tmp
mv out/{{ ds }}.tmp out/{{ ds }}.txt
printf '{"rows": 1, "fingerprint": "%s"}' {{ ds }} > "$BACKFILL_RESULT"
'''
"#;

/// What a project keeps out of version control: what `backfill` writes as it runs.
pub(crate) const GITIGNORE: &str =
    "# What backfill writes as it runs: the manifest, the tries' logs and audit files.
/.backfill/
# The example DAG's output.
/out/
";

pub(crate) fn run(g: &Global, dir: Option<&Path>) -> Result<u8, Error> {
    let dir = dir.unwrap_or_else(|| Path::new("."));
    let project = dir.join(crate::project::PROJECT_FILE);
    let dag = dir.join(crate::project::DAGS_DIR).join("example.toml");
    for path in [&project, &dag] {
        if path.exists() {
            return Err(Error::Usage(format!(
                "{} exists already; `backfill init` only starts a new project and never overwrites (remove it, or pick another folder)",
                path.display()
            )));
        }
    }
    let write = |path: &Path, text: &str| -> Result<(), Error> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("cannot create {}", parent.display()), e))?;
        }
        std::fs::write(path, text)
            .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
    };
    write(&project, PROJECT)?;
    write(&dag, EXAMPLE_DAG)?;
    let mut wrote = vec![project.display().to_string(), dag.display().to_string()];
    // A folder that has a .gitignore keeps its own.
    let ignore = dir.join(".gitignore");
    if !ignore.exists() {
        write(&ignore, GITIGNORE)?;
        wrote.push(ignore.display().to_string());
    }
    let next = format!(
        "backfill -C {} create --dag example --from yesterday --to yesterday",
        out::shell_word(&dir.display().to_string())
    );
    if g.json {
        out::json(&serde_json::json!({
            "wrote": wrote,
            "next": next,
        }))?;
    } else if !g.quiet {
        out::note(&format!("wrote {}; try: {next}", wrote.join(", ")));
    }
    Ok(exit::OK)
}
