//! The command line (clap definitions only). Commands turn these into validated requests.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "backfill",
    version,
    about = "Reprocess a range of partitions of a batch pipeline, safely.",
    long_about = "Reprocess a range of partitions of a batch pipeline, safely: every interval runs \
                  once, with bounded concurrency, retries and timeouts; its output is audited by \
                  a gate before it replaces the published partition; every outcome is recorded \
                  in a run manifest (SQLite, or PostgreSQL shared by several hosts); a crash or \
                  Ctrl-C can be resumed."
)]
pub struct Cli {
    /// The project folder (holding backfill.toml); default: the nearest ancestor that has one.
    #[arg(short = 'C', long = "project", global = true, value_name = "DIR")]
    pub project: Option<PathBuf>,

    /// The run manifest: a SQLite file, or a PostgreSQL URL that several hosts share; default:
    /// `manifest` in backfill.toml, else .backfill/manifest.db.
    #[arg(
        long,
        global = true,
        value_name = "PATH|URL",
        env = "BACKFILL_MANIFEST",
        // A URL's password must not reach `--help`.
        hide_env_values = true
    )]
    pub manifest: Option<PathBuf>,

    /// `json` prints one JSON document on stdout; messages for humans go to stderr.
    #[arg(long, global = true, value_enum, default_value_t = Output::Human)]
    pub output: Output,

    /// Print more: -v each interval as it starts, -vv also diagnostics (as BACKFILL_LOG=debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Print nothing on success; on failure, only the failures and how to rerun them.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// How diagnostics (BACKFILL_LOG, -vv) are written on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Shells that `backfill completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// What `--from` and `--to` accept, shown after the options of the commands that take them.
const CREATE_HELP: &str = "Examples:
  backfill create --dag daily_orders --from 2026-09-01 --to 2026-09-30
  backfill create --dag daily_orders --from 2026-09-01 --to 2026-09-30 --dry-run
  backfill create --dag daily_orders --from today-7d --to yesterday --reprocess-behavior failed -q
  backfill create --dag hourly_events --from 2026-10-25T00:00 --to 2026-10-25T23:00 --max-active-runs 4
  backfill create --dag export --from 2026-09-01 --to 2026-09-07 --conf '{\"region\": \"eu\"}'
  backfill create --dag daily_orders --from 2026-09-01 --to 2026-09-30 --stage
  backfill create --dag daily_orders --from 2026-09-01 --to 2026-10-31 --cascade changed --reprocess-behavior completed

WHEN is a date (2026-09-01), a wall-clock time (2026-09-01T06:00), an RFC 3339 instant \
(2026-09-01T06:00:00Z), or relative: today, yesterday, today-7d, now, now-6h. Dates and times \
without an offset are in the DAG's timezone; a date as --to covers its whole day.

Exit codes: 0 every interval succeeded or nothing to do, 1 internal error, 2 bad input \
(nothing written), 3 an interval failed or was rejected, 130 interrupted (backfill resume ID).";

const WHEN_HELP: &str = "WHEN is a date (2026-09-01), a wall-clock time (2026-09-01T06:00), an RFC 3339 instant \
(2026-09-01T06:00:00Z), or relative: today, yesterday, today-7d, now, now-6h. Dates and times \
without an offset are in the DAG's timezone; a date as --to covers its whole day.";

const SERVE_HELP: &str = "Examples:
  backfill serve                      # http://127.0.0.1:8460/
  BACKFILL_SERVE_TOKEN=s3cret backfill serve --listen 0.0.0.0:8460

Pages: / (backfills), /backfills/ID (one cell per interval), /dags/DAG (its partitions over \
time), /pools (slots and leases). JSON: /api/backfills and /api/backfills/ID, the documents of \
list and show --output json. Prometheus metrics: /metrics. The server only reads the manifest.";

const FORGET_HELP: &str = "Examples:
  backfill forget --dag daily_orders --dry-run
  backfill forget --dag daily_orders --from 2026-09-01 --to 2026-09-30 --yes

WHEN is read as by create --from and --to, in the DAG's timezone. The removal is recorded in \
the manifest's `forgets` table. A backfill of the DAG that is running, or holds staged outputs \
of the range, must end first.";

const INTERVAL_HELP: &str = "Examples:
  backfill diff 7
  backfill promote 7 --interval 2026-09-03 --interval 2026-09-04
  backfill discard latest

ID is a backfill id, or `latest`: the newest backfill made by `create --stage`.

WHEN is read as by create --from and --to, in the DAG's timezone: a date selects the intervals \
starting on that day, a time or instant the interval starting then.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Plan and run a backfill of a DAG over a range of intervals.
    #[command(after_help = CREATE_HELP)]
    Create(CreateArgs),
    /// Continue an interrupted backfill (crash, Ctrl-C, kill, cancel).
    Resume {
        /// The backfill id, or `latest` (the newest backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// When its owner still holds its lease (a host that died or froze, seen from another
        /// host), wait for the lease to expire by the manifest's clock, then take it over: at
        /// most the lease timeout after the owner's last heartbeat.
        #[arg(long)]
        wait: bool,
    },
    /// Help run a live backfill's remaining intervals from this process (this host or
    /// another that shares the manifest); its max_active_runs bounds all its processes.
    Join {
        /// The backfill id, or `latest` (the newest backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// Most intervals in flight at once in this process; default: the backfill's
        /// max_active_runs.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_active_runs: Option<u32>,
    },
    /// Stop a backfill, also one running in another process.
    Cancel {
        /// The backfill id, or `latest` (the newest backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// How long to wait for a live owner to stop (it stops within about a second, plus
        /// its tasks' grace periods).
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_wait)]
        wait: std::time::Duration,
    },
    /// List backfills.
    List {
        /// Only backfills of this DAG.
        #[arg(long)]
        dag: Option<String>,
        /// Only running backfills.
        #[arg(long)]
        active: bool,
    },
    /// Show a backfill's intervals: action, state, attempts, rows, verdict, duration.
    Show {
        /// The backfill id, or `latest` (the newest backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// Draw one cell per interval, coloured by state and verdict, wrapped to the width.
        #[arg(long, conflicts_with = "output")]
        grid: bool,
    },
    /// The manifest's run history of a DAG, per interval.
    #[command(after_help = WHEN_HELP)]
    Runs {
        #[arg(long)]
        dag: String,
        #[arg(long, value_name = "WHEN", requires = "to")]
        from: Option<String>,
        #[arg(long, value_name = "WHEN", requires = "from")]
        to: Option<String>,
    },
    /// List the published intervals whose source changed since they ran (by each task's gate
    /// `source_count` and `source_fingerprint`); runs nothing.
    #[command(after_help = WHEN_HELP)]
    Stale {
        #[arg(long)]
        dag: String,
        #[arg(long, value_name = "WHEN")]
        from: String,
        #[arg(long, value_name = "WHEN")]
        to: String,
        /// A JSON object available to the commands as `conf` and BACKFILL_CONF.
        #[arg(long, value_name = "JSON")]
        conf: Option<String>,
    },
    /// Compare what a staged backfill (`create --stage`) computed with what is published: rows,
    /// change, fingerprints, and for SQL tasks with a unique_key the keys added, removed and
    /// changed.
    #[command(after_help = INTERVAL_HELP)]
    Diff {
        /// The staged backfill's id, or `latest` (the newest `create --stage` backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// Only the staged intervals starting within WHEN (repeatable).
        #[arg(long = "interval", value_name = "WHEN")]
        intervals: Vec<String>,
    },
    /// Publish the outputs of a staged backfill (`create --stage`), judged again by the gate
    /// against what is published now.
    #[command(after_help = INTERVAL_HELP)]
    Promote {
        /// The staged backfill's id, or `latest` (the newest `create --stage` backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// Only the staged intervals starting within WHEN (repeatable).
        #[arg(long = "interval", value_name = "WHEN")]
        intervals: Vec<String>,
        /// Skip the gate's drift check against the published partition.
        #[arg(long)]
        allow_drift: bool,
        /// Publish every staged interval in one warehouse transaction: all of them, or none
        /// (readers see the old rows until the commit). SQL tasks of one warehouse only.
        #[arg(long)]
        atomic: bool,
    },
    /// Drop the outputs of a staged backfill without publishing them.
    #[command(after_help = INTERVAL_HELP)]
    Discard {
        /// The staged backfill's id, or `latest` (the newest `create --stage` backfill).
        #[arg(value_name = "ID", value_parser = parse_backfill)]
        id: BackfillRef,
        /// Only the staged intervals starting within WHEN (repeatable).
        #[arg(long = "interval", value_name = "WHEN")]
        intervals: Vec<String>,
    },
    /// Put back, per interval, the rows that the current publish of each SQL task replaced
    /// (kept for the last `keep_versions` publishes).
    #[command(after_help = WHEN_HELP)]
    Rollback {
        #[arg(long)]
        dag: String,
        #[arg(long, value_name = "WHEN")]
        from: String,
        #[arg(long, value_name = "WHEN")]
        to: String,
        /// Only this SQL task (repeatable); default: every SQL task of the DAG.
        #[arg(long = "task", value_name = "TASK")]
        tasks: Vec<String>,
        /// Most intervals in flight at once; default: the DAG's max_active_runs, else 1.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_active_runs: Option<u32>,
    },
    /// Remove a DAG's history, over a range or all of it, so that it starts again: its
    /// backfills, runs, tries and published records in the manifest, the versions its SQL
    /// tasks kept in their warehouses, and its log files. The rows in its targets stay.
    #[command(after_help = FORGET_HELP)]
    Forget {
        #[arg(long)]
        dag: String,
        /// Only the intervals from WHEN (with --to); default: all of them.
        #[arg(long, value_name = "WHEN", requires = "to")]
        from: Option<String>,
        #[arg(long, value_name = "WHEN", requires = "from")]
        to: Option<String>,
        /// Say what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask (needed where there is no terminal to ask on).
        #[arg(long)]
        yes: bool,
    },
    /// Check that tasks are deterministic: compute each interval twice without publishing and
    /// compare row counts and fingerprints.
    #[command(after_help = WHEN_HELP)]
    Verify {
        #[arg(long)]
        dag: String,
        #[arg(long, value_name = "WHEN")]
        from: String,
        #[arg(long, value_name = "WHEN")]
        to: String,
        /// A JSON object available to tasks as `conf` and BACKFILL_CONF.
        #[arg(long, value_name = "JSON")]
        conf: Option<String>,
    },
    /// Serve a read-only status page of the manifest's backfills, their JSON documents and
    /// Prometheus metrics over HTTP, until Ctrl-C.
    #[command(after_help = SERVE_HELP)]
    Serve {
        /// The address to listen on; another than loopback needs --token.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8460")]
        listen: String,
        /// A secret every request must carry (`Authorization: Bearer TOKEN`, or `?token=TOKEN`
        /// once in a browser, which then keeps it in a cookie).
        #[arg(
            long,
            value_name = "TOKEN",
            env = "BACKFILL_SERVE_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
    },
    /// List the project's DAGs, or validate every DAG file.
    Dags {
        #[command(subcommand)]
        action: Option<DagsAction>,
    },
    /// The run manifest itself: `manifest copy --to URL` moves a SQLite manifest's history into
    /// PostgreSQL, for several hosts to share.
    Manifest {
        #[command(subcommand)]
        action: ManifestAction,
    },
    /// Start a project: write backfill.toml and a working dags/example.toml into DIR.
    Init {
        /// The folder (created if needed); default: the current one.
        dir: Option<PathBuf>,
    },
    /// Print a shell completion script: `backfill completions bash > ~/.local/share/bash-completion/completions/backfill`.
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the manual page (roff): `backfill man > backfill.1; man ./backfill.1`; with
    /// `--dir`, write it and one page per subcommand (`backfill-create.1`, ...) into DIR.
    Man {
        /// Write every page into this folder (created if needed) instead of printing one.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ManifestAction {
    /// Copy this SQLite manifest's whole history (ids and identity kept) into an empty
    /// PostgreSQL manifest; the SQLite file is left as it was.
    Copy {
        /// The PostgreSQL manifest: postgresql://USER@HOST/DB (a password through PGPASSWORD's
        /// equivalent in the URL or ~/.pgpass).
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DagsAction {
    /// Check every DAG file; exit 2 on any error.
    Validate,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The DAG to backfill.
    #[arg(long)]
    pub dag: String,
    /// First interval: the first one starting at or after WHEN.
    #[arg(long, value_name = "WHEN")]
    pub from: String,
    /// Last interval: the last one starting at or before WHEN (a date covers its whole day).
    #[arg(long, value_name = "WHEN")]
    pub to: String,
    /// Which intervals that already ran are run again.
    #[arg(long, value_enum, default_value_t = ReprocessArg::None)]
    pub reprocess_behavior: ReprocessArg,
    /// Most intervals in flight at once; default: the DAG's max_active_runs, else 1.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_active_runs: Option<u32>,
    /// Run the newest interval first.
    #[arg(long)]
    pub run_backwards: bool,
    /// Compute up to N consecutive intervals with one query, each still judged, published and
    /// recorded on its own; default: the DAG's batch_size, else 1.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch_size: Option<u32>,
    /// A JSON object available to tasks as `conf` and BACKFILL_CONF.
    #[arg(long, value_name = "JSON")]
    pub conf: Option<String>,
    /// Print the plan and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Skip the gate's drift check against the published partition.
    #[arg(long)]
    pub allow_drift: bool,
    /// Compute and audit every interval but publish nothing: keep the outputs for `backfill
    /// diff` and `backfill promote` (or `backfill discard`).
    #[arg(long)]
    pub stage: bool,
    /// Stage every interval, then publish them all in one warehouse transaction, or none
    /// (`--stage` then `promote --atomic`). SQL tasks of one warehouse only.
    #[arg(long, conflicts_with = "stage")]
    pub atomic: bool,
    /// Stop starting intervals once N failed or were rejected; the running ones finish, the
    /// rest stay planned for `backfill resume`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failures: Option<u32>,
    /// How long an interval may wait for its sources (`[tasks.ready]`), for every task: overrides
    /// each task's `wait` (0s: ask once). Kept by `resume`.
    #[arg(long, value_name = "DURATION", value_parser = parse_wait_ready)]
    pub wait_ready: Option<std::time::Duration>,
    /// Exit with code 4 when the sources of an interval were not ready, so it did not run
    /// (without it, such an interval is recorded `not ready` and the exit code is 0).
    #[arg(long)]
    pub require_ready: bool,
    /// Run only these tasks of each interval (comma-separated); the tasks they depend on count
    /// as done.
    #[arg(long, value_name = "TASK,...", value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Also backfill every DAG downstream of this one (its `upstream`, transitively), one DAG
    /// after the other: `all` runs each downstream interval whose upstream intervals
    /// succeeded, `changed` only those whose upstream output changed.
    #[arg(long, value_enum, value_name = "WHICH", conflicts_with = "stage")]
    pub cascade: Option<CascadeArg>,
    /// Rehearse on N representative intervals of the range instead of all of them: the first
    /// and the last, one whose latest run failed, one across a DST change, the rest spread
    /// evenly (with a weekend day, a weekday and a month end where the calendar has them). The
    /// dry run says why each was picked.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CascadeArg {
    /// Every downstream interval whose upstream intervals succeeded.
    All,
    /// Only downstream intervals whose upstream output changed.
    Changed,
}

impl CascadeArg {
    pub(crate) fn mode(self) -> crate::cascade::Mode {
        match self {
            Self::All => crate::cascade::Mode::All,
            Self::Changed => crate::cascade::Mode::Changed,
        }
    }
}

/// A backfill as a command names it: its id, or `latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillRef {
    Id(i64),
    /// The newest backfill (for `diff`, `promote` and `discard`, the newest staged one).
    Latest,
}

/// `7` or `latest`.
fn parse_backfill(text: &str) -> Result<BackfillRef, String> {
    if text == "latest" {
        return Ok(BackfillRef::Latest);
    }
    match text.parse::<i64>() {
        Ok(id) if id > 0 => Ok(BackfillRef::Id(id)),
        _ => Err(format!(
            "`{text}` is not a backfill id; give a number as `backfill list` shows it, or `latest`"
        )),
    }
}

/// A duration such as `30s`, `2m` or `500ms`.
fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("cannot read `{text}` as a duration ({e}); write it like 30s or 2m"))
}

/// `--wait-ready`: a duration of at most a year, as a DAG file's `wait`.
fn parse_wait_ready(text: &str) -> Result<std::time::Duration, String> {
    const YEAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
    match parse_wait(text)? {
        d if d > YEAR => Err(format!(
            "`{text}` is longer than a year; write a wait such as 2h"
        )),
        d => Ok(d),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReprocessArg {
    /// Only intervals that never ran.
    None,
    /// Also intervals whose latest run failed, was rejected or cancelled.
    Failed,
    /// Every interval, including succeeded ones.
    Completed,
    /// As `failed`, and also succeeded intervals whose source changed since they ran.
    Changed,
}

impl From<ReprocessArg> for crate::plan::Reprocess {
    fn from(r: ReprocessArg) -> Self {
        match r {
            ReprocessArg::None => Self::None,
            ReprocessArg::Failed => Self::Failed,
            ReprocessArg::Completed => Self::Completed,
            ReprocessArg::Changed => Self::Changed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
