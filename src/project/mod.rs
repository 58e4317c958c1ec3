//! A project: found like cargo finds `Cargo.toml`, its `backfill.toml` (manifest, logs, lease
//! timeout, durability, warehouses) and its DAG files, loaded all at once.
//!
//! Every configuration error names the file, the line and column, the key, and what to do, and
//! loading reports every error of every file rather than stopping at the first. Rules that span
//! files live here: DAG ids are unique, and a table has one producer.

mod dag;
mod diagnostics;
mod load;
mod raw;
mod task;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) use dag::{
    CommandSpec, Dag, Notify, Ready, ReadyCheck, Task, TaskKind, batchable, definition_changes,
    missing_conf,
};
pub use dag::{Gate, Literal, Rule, RuleKind, Severity, SourceCount, SqlTask, WritePattern};
pub(crate) use diagnostics::{ConfigError, StringAt};

use diagnostics::{FileErrors, line_col, parse_duration};
use load::DagFile;
use raw::{RawProject, RawWarehouse};

/// How hard a commit of the manifest's writer tries to reach the disk (`durability` in
/// `backfill.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// WAL with `synchronous=NORMAL`: a commit survives the process dying (`kill -9`, a crash);
    /// an OS crash or power cut may lose the last commits, never the manifest's consistency.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is fsynced and survives a power cut too.
    Full,
}

pub(crate) const PROJECT_FILE: &str = "backfill.toml";
pub(crate) const DAGS_DIR: &str = "dags";

pub(crate) use crate::clock::HEARTBEAT;
pub(crate) use crate::pg::url::redact_url;
/// The shortest `lease_timeout`: several heartbeats, so that a live backfill is never judged
/// dead because one heartbeat was late.
pub(crate) const MIN_LEASE_TIMEOUT: Duration = Duration::from_secs(1);
/// `lease_timeout` when `backfill.toml` does not set it.
pub(crate) const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error(
        "no {PROJECT_FILE} in {} or any parent directory; run inside a project or pass -C DIR",
        .0.display()
    )]
    NotFound(PathBuf),
    #[error("{}", join_errors(.0))]
    Config(Vec<ConfigError>),
    #[error("unknown DAG `{id}`; {}", known_hint(.known, .broken))]
    UnknownDag {
        id: String,
        known: Vec<String>,
        /// DAG files that do not load (their DAGs are not among `known`).
        broken: usize,
    },
}

fn join_errors(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn known_hint(known: &[String], broken: &usize) -> String {
    let broken = match broken {
        0 => String::new(),
        n => format!(
            "; {} in {DAGS_DIR}/ {} errors: `backfill dags validate` lists them",
            crate::words::plural(i64::try_from(*n).unwrap_or(i64::MAX), "file", "files"),
            if *n == 1 { "has" } else { "have" }
        ),
    };
    if known.is_empty() && broken.is_empty() {
        format!("the project has no DAG files in {DAGS_DIR}/")
    } else if known.is_empty() {
        format!("no DAG file loads{broken}")
    } else {
        format!("known DAGs: {}{broken}", known.join(", "))
    }
}

/// A loaded project: its root, settings and DAG files.
#[derive(Debug, Clone)]
pub(crate) struct Project {
    pub root: PathBuf,
    /// The project's name, which a shared manifest records with its backfills: `project` in
    /// `backfill.toml`, else the name of its folder (see `session::belonging`).
    pub name: String,
    /// Whether `backfill.toml` names it (`project`), rather than its folder.
    pub named: bool,
    pub manifest_path: PathBuf,
    pub logs_dir: PathBuf,
    /// A lease whose owner has not sent a heartbeat for this long is stale; at least
    /// [`MIN_LEASE_TIMEOUT`].
    pub lease_timeout: Duration,
    /// Warehouses by name.
    pub warehouses: BTreeMap<String, Warehouse>,
    /// How the manifest's commits reach the disk.
    pub durability: Durability,
    /// The `[notify]` commands (a DAG's own override them key by key).
    pub notify: Notify,
    /// `[pools]`: the most tries of a pool's tasks running at once, across every backfill of
    /// the manifest.
    pub pools: BTreeMap<String, u32>,
    /// `[pools]`' `rate`s: the most tries of a pool's tasks that start in any period, across
    /// every backfill, process and host of the manifest.
    pub pool_rates: BTreeMap<String, Rate>,
}

/// A pool's `rate = "N/PERIOD"`: at most `starts` tries start in any window of `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub starts: u32,
    pub per: Duration,
}

impl Rate {
    /// Reads `100/min`, `5/s`, `1000/hour`, `30/10s`, `2/1m30s`.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let how = "write it as starts per period, such as \"100/min\", \"5/s\", \"1000/hour\" or \"30/10s\"";
        let Some((n, period)) = text.split_once('/') else {
            return Err(format!("`{text}` is not a rate: {how}"));
        };
        let starts = match n.trim().parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(format!(
                    "`{text}`: the number of starts must be a whole number of at least 1; {how}"
                ));
            }
        };
        let period = period.trim();
        let per = match period {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other)
                .map_err(|_| format!("`{text}`: `{other}` is not a period; {how}"))?,
        };
        if per < Duration::from_millis(100) || per > Duration::from_secs(86_400) {
            return Err(format!(
                "`{text}`: the period must be from 100ms to a day; {how}"
            ));
        }
        Ok(Rate { starts, per })
    }

    /// The period in milliseconds.
    pub fn per_ms(&self) -> i64 {
        i64::try_from(self.per.as_millis()).unwrap_or(i64::MAX)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            self.starts,
            humantime::format_duration(self.per)
        )
    }
}

/// A warehouse declared in `backfill.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warehouse {
    pub name: String,
    /// Which database holds its tables.
    pub kind: WarehouseKind,
    /// A SQLite warehouse's database file (empty for other kinds).
    pub path: PathBuf,
    /// SQL files run once, in order, in one transaction, when the database file does not exist.
    pub init: Vec<PathBuf>,
    /// How long a statement waits for another process's write lock before backfill's own
    /// retry loop takes over (`busy_timeout`, default 5s).
    pub busy_timeout: Duration,
    /// How many partitions replaced by publishes are kept per task and interval, for
    /// `backfill rollback` (`keep_versions`, default 1; 0 keeps none).
    pub keep_versions: u32,
}

/// Which database holds a warehouse's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarehouseKind {
    /// A SQLite database file, created from the warehouse's init files when it is missing.
    Sqlite,
    /// A PostgreSQL database.
    Postgres(PgUrl),
}

/// A PostgreSQL connection URL, with the environment variables it named already put in. It may
/// hold a password: it is shown only through [`PgUrl::redacted`].
///
/// A URL that names a variable that is not set is kept as written, with the error: only a
/// command that connects to the warehouse needs it (`list`, `show` and the other reads of the
/// manifest, or a DAG of another warehouse, do not), and that command reports it.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl {
    url: String,
    unresolved: Option<String>,
}

impl PgUrl {
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            unresolved: None,
        }
    }

    /// A URL as written (`${NAME}` not put in) and why it could not be: `file:line:col: ...`.
    pub(crate) fn unresolved(written: String, why: String) -> Self {
        Self {
            url: written,
            unresolved: Some(why),
        }
    }

    /// The URL itself, to connect with; `Err` says why there is none.
    pub(crate) fn secret(&self) -> Result<&str, &str> {
        match &self.unresolved {
            None => Ok(&self.url),
            Some(why) => Err(why),
        }
    }

    /// The URL without its password (in the user part or a `password` parameter).
    pub(crate) fn redacted(&self) -> String {
        redact_url(&self.url)
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Warehouse {
    /// Where the warehouse is, for messages: its file, or its URL without the password.
    pub(crate) fn location(&self) -> String {
        match &self.kind {
            WarehouseKind::Sqlite => self.path.display().to_string(),
            WarehouseKind::Postgres(url) => url.redacted(),
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self.kind, WarehouseKind::Postgres(_))
    }
}

/// The largest pool.
pub(crate) const MAX_POOL_SIZE: u32 = 10_000;

/// The default `keep_versions` of a warehouse.
pub const DEFAULT_KEEP_VERSIONS: u32 = 1;
/// The most versions a warehouse or task may keep.
pub(crate) const MAX_KEEP_VERSIONS: u32 = 100;

/// The default `busy_timeout` of a warehouse.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The name of the project folder `root`, as it was reached (`..` and `.` taken away, no
/// symbolic link followed).
fn folder_name(root: &Path) -> String {
    let mut plain = PathBuf::new();
    for c in root.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                plain.pop();
            }
            other => plain.push(other),
        }
    }
    plain
        .file_name()
        .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned())
}

/// `manifest`: a PostgreSQL URL (`${NAME}` puts an environment variable in, to keep a password
/// out of the file), else a path relative to the project.
fn manifest_location(raw: &RawProject, root: &Path, errs: &mut FileErrors<'_>) -> PathBuf {
    if let Some(v) = &raw.manifest
        && let Some(why) = load::expand_env(v.get_ref())
            .ok()
            .and_then(|value| crate::pg::url::not_a_location(&value))
    {
        errs.at(v, format!("key `manifest`: {why}"));
    }
    let url = match &raw.manifest {
        Some(v) if v.get_ref().contains("${") || crate::pg::url::is_url(Path::new(v.get_ref())) => {
            match load::expand_env(v.get_ref()) {
                Ok(url) if crate::pg::url::is_url(Path::new(&url)) => {
                    Some(crate::pg::url::location(&url))
                }
                Ok(other) if other.trim().is_empty() => {
                    errs.at(v, "key `manifest`: the environment variable it names is empty; set it to a PostgreSQL URL or a path".to_string());
                    None
                }
                Ok(other) => Some(root.join(other)),
                Err(why) => {
                    errs.at(v, format!("key `manifest`: {why}"));
                    None
                }
            }
        }
        _ => None,
    };
    match url {
        Some(location) => location,
        None => project_path(
            root,
            "manifest",
            &raw.manifest,
            ".backfill/manifest.db",
            errs,
        ),
    }
}

/// A path of `backfill.toml` at `key`, relative to the project: `default` when the key is left
/// out, or empty (which is an error).
fn project_path(
    root: &Path,
    key: &str,
    value: &Option<toml::Spanned<String>>,
    default: &str,
    errs: &mut FileErrors<'_>,
) -> PathBuf {
    match value {
        Some(v) if v.get_ref().trim().is_empty() => {
            errs.at(
                v,
                format!("key `{key}` is empty; leave it out for \"{default}\""),
            );
            root.join(default)
        }
        Some(v) => root.join(v.get_ref()),
        None => root.join(default),
    }
}

/// The project's name, and whether `project` gives it (else it is its folder's).
fn project_name(raw: &RawProject, root: &Path, errs: &mut FileErrors<'_>) -> (String, bool) {
    let folder = folder_name(root);
    match &raw.project {
        Some(v) if v.get_ref().trim().is_empty() => {
            errs.at(
                v,
                format!(
                    "key `project` is empty; name the project (\"shop\"), or leave the key out to name it after its folder (`{folder}`)"
                ),
            );
            (folder, false)
        }
        Some(v) => (v.get_ref().trim().to_string(), true),
        None => (folder, false),
    }
}

/// `lease_timeout`: at least [`MIN_LEASE_TIMEOUT`]; the default otherwise.
fn lease_timeout(raw: &RawProject, errs: &mut FileErrors<'_>) -> Duration {
    let Some(v) = &raw.lease_timeout else {
        return DEFAULT_LEASE_TIMEOUT;
    };
    match parse_duration(v.get_ref()) {
        Ok(d) if d < MIN_LEASE_TIMEOUT => {
            errs.at(
                v,
                format!(
                    "key `lease_timeout`: `{}` is too short; a running backfill writes a heartbeat every {}, and a shorter timeout would judge a live one dead; use at least \"{}\" (the default is \"{}\")",
                    v.get_ref(),
                    humantime::format_duration(HEARTBEAT),
                    humantime::format_duration(MIN_LEASE_TIMEOUT),
                    humantime::format_duration(DEFAULT_LEASE_TIMEOUT),
                ),
            );
            DEFAULT_LEASE_TIMEOUT
        }
        Ok(d) => d,
        Err(e) => {
            errs.at(v, format!("key `lease_timeout`: {e}"));
            DEFAULT_LEASE_TIMEOUT
        }
    }
}

/// `durability`: "normal" (the default) or "full".
fn durability(raw: &RawProject, errs: &mut FileErrors<'_>) -> Durability {
    match raw.durability.as_ref().map(|d| (d, d.get_ref().as_str())) {
        None | Some((_, "normal")) => Durability::Normal,
        Some((_, "full")) => Durability::Full,
        Some((d, other)) => {
            errs.at(
                d,
                format!(
                    "key `durability`: `{other}` is neither \"normal\" (survives kill -9) nor \"full\" (also survives a power cut)"
                ),
            );
            Durability::Normal
        }
    }
}

/// The `[warehouse.NAME]` tables, by name; one whose kind or location is wrong is left out, its
/// error said.
fn warehouses(
    raw: &RawProject,
    root: &Path,
    errs: &mut FileErrors<'_>,
) -> BTreeMap<String, Warehouse> {
    let mut warehouses: BTreeMap<String, Warehouse> = BTreeMap::new();
    for w in &raw.warehouses {
        if let Some(warehouse) = warehouse(w, root, &warehouses, errs) {
            warehouses.insert(warehouse.name.clone(), warehouse);
        }
    }
    warehouses
}

/// A `[warehouse.NAME]` table, given the warehouses before it (`known`).
fn warehouse(
    w: &RawWarehouse,
    root: &Path,
    known: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<Warehouse> {
    let name = w.name.get_ref();
    if !sql_identifier(name) {
        errs.at(
            &w.name,
            format!(
                "invalid warehouse name `{name}`: use letters, digits and `_`, starting with a letter or `_`"
            ),
        );
    }
    match warehouse_kind(w, errs)? {
        WarehouseKind::Postgres(url) => Some(postgres_warehouse(w, url, errs)),
        WarehouseKind::Sqlite => sqlite_warehouse(w, root, known, errs),
    }
}

/// A warehouse's `kind`, with a PostgreSQL warehouse's `url`; `None` when either is wrong.
fn warehouse_kind(w: &RawWarehouse, errs: &mut FileErrors<'_>) -> Option<WarehouseKind> {
    let name = w.name.get_ref();
    match w.kind.as_ref().map(|k| (k, k.get_ref().as_str())) {
        None | Some((_, "sqlite")) => Some(WarehouseKind::Sqlite),
        Some((_, "postgres" | "postgresql")) => match &w.url {
            Some(u) => postgres_url(u, name, errs).map(WarehouseKind::Postgres),
            None => {
                errs.at(
                    &w.name,
                    format!("warehouse `{name}` of kind \"postgres\" needs `url`, such as url = \"postgresql://etl@db.internal/analytics\" or url = \"${{ANALYTICS_PG_URL}}\""),
                );
                None
            }
        },
        Some((k, other)) => {
            errs.at(
                k,
                format!("warehouse `{name}`: key `kind` is \"sqlite\" (the default) or \"postgres\", not `{other}`"),
            );
            None
        }
    }
}

/// The `url` `u` of PostgreSQL warehouse `name`, its environment variables put in: kept as
/// written, with why, when one is not set or what they give is no PostgreSQL URL (only a
/// command that connects to the warehouse needs it); `None` when it is wrong as written.
fn postgres_url(u: &toml::Spanned<String>, name: &str, errs: &mut FileErrors<'_>) -> Option<PgUrl> {
    match load::expand_env(u.get_ref()) {
        Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Some(PgUrl::new(url))
        }
        // What a variable gave is judged where the warehouse is used, as a variable that is
        // not set is.
        Ok(_) if u.get_ref().contains("${") => Some(PgUrl::unresolved(
            u.get_ref().clone(),
            format!(
                "{}: warehouse `{name}`: key `url`: the environment variables it names do not make a PostgreSQL URL such as \"postgresql://etl@db.internal:5432/analytics\"; set them to one",
                errs.location(u.span().start)
            ),
        )),
        Ok(_) => {
            errs.at(
                u,
                format!("warehouse `{name}`: key `url` must be a PostgreSQL URL such as \"postgresql://etl@db.internal:5432/analytics\""),
            );
            None
        }
        Err(load::EnvError::Unset(why)) => Some(PgUrl::unresolved(
            u.get_ref().clone(),
            format!(
                "{}: warehouse `{name}`: key `url`: {why}",
                errs.location(u.span().start)
            ),
        )),
        Err(why) => {
            errs.at(u, format!("warehouse `{name}`: key `url`: {why}"));
            None
        }
    }
}

/// A PostgreSQL warehouse at `url`: it has no key of a SQLite warehouse's.
fn postgres_warehouse(w: &RawWarehouse, url: PgUrl, errs: &mut FileErrors<'_>) -> Warehouse {
    let name = w.name.get_ref();
    for (key, given) in [
        ("path", w.path.is_some()),
        ("busy_timeout", w.busy_timeout.is_some()),
        ("init", !w.init.is_empty()),
    ] {
        if given {
            errs.at(
                &w.name,
                format!("warehouse `{name}`: key `{key}` is for SQLite warehouses; a PostgreSQL warehouse has only `url` and `keep_versions`"),
            );
        }
    }
    Warehouse {
        name: name.clone(),
        kind: WarehouseKind::Postgres(url),
        path: PathBuf::new(),
        init: Vec::new(),
        busy_timeout: DEFAULT_BUSY_TIMEOUT,
        keep_versions: warehouse_keep_versions(w, errs),
    }
}

/// A SQLite warehouse: its file (its own, not one of the warehouses `known` before it), its
/// init files, its `busy_timeout`; `None` without a file.
fn sqlite_warehouse(
    w: &RawWarehouse,
    root: &Path,
    known: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<Warehouse> {
    let name = w.name.get_ref();
    if let Some(u) = &w.url {
        errs.at(
            u,
            format!("warehouse `{name}`: key `url` needs kind = \"postgres\"; a SQLite warehouse has `path`"),
        );
    }
    let path = match &w.path {
        Some(p) if !p.get_ref().trim().is_empty() => root.join(p.get_ref()),
        Some(p) => {
            errs.at(
                p,
                format!("warehouse `{name}`: key `path` is empty; name the SQLite database file, such as path = \"warehouse.db\""),
            );
            return None;
        }
        None => {
            errs.at(
                &w.name,
                format!("warehouse `{name}` needs `path`, its SQLite database file, such as path = \"warehouse.db\""),
            );
            return None;
        }
    };
    if let Some(other) = known
        .values()
        .find(|o| o.path.components().eq(path.components()))
        && let Some(p) = &w.path
    {
        errs.at(
            p,
            format!(
                "warehouse `{name}` uses the same file as warehouse `{}`; give each warehouse its own file",
                other.name
            ),
        );
    }
    let mut init = Vec::new();
    for file in &w.init {
        let full = root.join(file.get_ref());
        if !full.is_file() {
            errs.at(
                file,
                format!(
                    "warehouse `{name}`: init file `{}` does not exist (paths are relative to the project folder)",
                    file.get_ref()
                ),
            );
        }
        init.push(full);
    }
    let busy_timeout = match &w.busy_timeout {
        None => DEFAULT_BUSY_TIMEOUT,
        Some(b) => match diagnostics::parse_duration(b.get_ref()) {
            Ok(d) => d,
            Err(why) => {
                errs.at(b, format!("warehouse `{name}`: key `busy_timeout`: {why}"));
                DEFAULT_BUSY_TIMEOUT
            }
        },
    };
    Some(Warehouse {
        name: name.clone(),
        kind: WarehouseKind::Sqlite,
        path,
        init,
        busy_timeout,
        keep_versions: warehouse_keep_versions(w, errs),
    })
}

/// A warehouse's `keep_versions`: [`DEFAULT_KEEP_VERSIONS`] when left out or wrong.
fn warehouse_keep_versions(w: &RawWarehouse, errs: &mut FileErrors<'_>) -> u32 {
    match &w.keep_versions {
        None => DEFAULT_KEEP_VERSIONS,
        Some(k) => task::keep_versions(k, errs).unwrap_or(DEFAULT_KEEP_VERSIONS),
    }
}

/// `[pools]`: each pool's size, from 1 to [`MAX_POOL_SIZE`], and the rates of those that have
/// one.
fn pools(
    raw: &RawProject,
    errs: &mut FileErrors<'_>,
) -> (BTreeMap<String, u32>, BTreeMap<String, Rate>) {
    let mut pools = BTreeMap::new();
    let mut rates = BTreeMap::new();
    for pool in &raw.pools {
        let (name, size) = (&pool.name, &pool.slots);
        if let Some(rate) = &pool.rate {
            match Rate::parse(rate.get_ref()) {
                Ok(r) => {
                    rates.insert(name.get_ref().clone(), r);
                }
                Err(why) => errs.at(rate, format!("pool `{}`: rate {why}", name.get_ref())),
            }
        }
        if !sql_identifier(name.get_ref()) {
            errs.at(
                name,
                format!(
                    "invalid pool name `{}`: use letters, digits and `_`, starting with a letter or `_`",
                    name.get_ref()
                ),
            );
        }
        match u32::try_from(*size.get_ref()) {
            Ok(n) if (1..=MAX_POOL_SIZE).contains(&n) => {
                pools.insert(name.get_ref().clone(), n);
            }
            _ => errs.at(
                size,
                format!(
                    "pool `{}`: its size is how many tries may run at once, a whole number from 1 to {MAX_POOL_SIZE}",
                    name.get_ref()
                ),
            ),
        }
    }
    (pools, rates)
}

impl Project {
    /// Finds the project: `dir` itself when given (`-C`), else the nearest ancestor of the
    /// current directory holding `backfill.toml`.
    pub(crate) fn discover(dir: Option<&Path>) -> Result<Self, ProjectError> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let root = match dir {
            Some(d) => {
                let d = cwd.join(d);
                if !d.join(PROJECT_FILE).is_file() {
                    return Err(ProjectError::NotFound(d));
                }
                d
            }
            None => cwd
                .ancestors()
                .find(|a| a.join(PROJECT_FILE).is_file())
                .map(Path::to_path_buf)
                .ok_or_else(|| ProjectError::NotFound(cwd.clone()))?,
        };
        let text = std::fs::read_to_string(root.join(PROJECT_FILE)).map_err(|e| {
            ProjectError::Config(vec![ConfigError {
                location: PROJECT_FILE.to_string(),
                message: format!("cannot read the file: {e}"),
            }])
        })?;
        Self::parse(root, &text).map_err(ProjectError::Config)
    }

    /// Validates the text of `backfill.toml` of the project in `root`; every error at once.
    pub(crate) fn parse(root: PathBuf, text: &str) -> Result<Self, Vec<ConfigError>> {
        let mut errs = FileErrors::new(PROJECT_FILE, text);
        let Some(raw) = RawProject::read(text, &mut errs) else {
            return Err(errs.into_errors());
        };
        let manifest_path = manifest_location(&raw, &root, &mut errs);
        let logs_dir = project_path(&root, "logs", &raw.logs, ".backfill/logs", &mut errs);
        let (name, named) = project_name(&raw, &root, &mut errs);
        let lease_timeout = lease_timeout(&raw, &mut errs);
        let durability = durability(&raw, &mut errs);
        let warehouses = warehouses(&raw, &root, &mut errs);
        let notify = load::notify(raw.notify.as_ref(), &mut errs);
        let (pools, pool_rates) = pools(&raw, &mut errs);
        if !errs.is_empty() {
            return Err(errs.into_errors());
        }
        Ok(Self {
            name,
            named,
            manifest_path,
            logs_dir,
            lease_timeout,
            warehouses,
            durability,
            notify,
            pools,
            pool_rates,
            root,
        })
    }

    /// Paths of every DAG file, sorted.
    pub(crate) fn dag_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.root.join(DAGS_DIR))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    }

    /// Loads every DAG file and applies the rules between files: a DAG id is used once, and a
    /// table has one producer.
    fn load_files(&self) -> Vec<DagFile> {
        let mut files: Vec<DagFile> = self
            .dag_files()
            .iter()
            .map(|path| Dag::load(path, &self.display_path(path), &self.warehouses))
            .collect();
        let mut seen: HashMap<String, String> = HashMap::new();
        for f in &mut files {
            let Ok(dag) = &f.dag else { continue };
            match seen.get(&dag.id) {
                Some(other) => {
                    f.dag = Err(vec![ConfigError {
                        location: f.file.clone(),
                        message: format!(
                            "DAG id `{}` is already used by {other}; ids must be unique",
                            dag.id
                        ),
                    }]);
                }
                None => {
                    seen.insert(dag.id.clone(), f.file.clone());
                }
            }
        }
        one_producer_per_table(&mut files);
        self.known_pools(&mut files);
        known_upstreams(&mut files);
        files
    }

    /// Loads every DAG file. Returns the valid DAGs and every error found.
    pub(crate) fn load_all(&self) -> (Vec<Dag>, Vec<ConfigError>) {
        let mut dags = Vec::new();
        let mut errors = Vec::new();
        for f in self.load_files() {
            match f.dag {
                Ok(dag) => dags.push(dag),
                Err(mut e) => errors.append(&mut e),
            }
        }
        (dags, errors)
    }

    /// Loads one DAG by id. A broken file of another DAG does not prevent it, unless the two
    /// publish into one table.
    pub(crate) fn dag(&self, id: &str) -> Result<Dag, ProjectError> {
        let mut broken = None;
        let mut known = Vec::new();
        let mut unloadable = 0;
        for f in self.load_files() {
            let stem_matches = Path::new(&f.file).file_stem().is_some_and(|s| s == id);
            match f.dag {
                Ok(dag) if dag.id == id => return Ok(dag),
                Ok(dag) => known.push(dag.id),
                // The DAG may be the one whose file is broken: report that file's errors.
                Err(errors) if broken.is_none() && (f.id == id || stem_matches) => {
                    broken = Some(errors);
                }
                Err(_) => unloadable += 1,
            }
        }
        match broken {
            Some(errors) => Err(ProjectError::Config(errors)),
            None => Err(ProjectError::UnknownDag {
                id: id.to_string(),
                known,
                broken: unloadable,
            }),
        }
    }

    /// A path relative to the project root, for messages.
    pub(crate) fn display_path(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}

/// Two tasks publishing into one table would delete each other's partitions: every SQL task's
/// (warehouse, target) is unique across the project. Both DAGs of a conflict become unusable.
impl Project {
    /// A task's `pool` must be declared in `[pools]`: an unknown one makes its DAG unusable.
    fn known_pools(&self, files: &mut [DagFile]) {
        for f in files.iter_mut() {
            let Ok(dag) = &f.dag else { continue };
            let errors: Vec<ConfigError> = dag
                .tasks
                .iter()
                .filter_map(|t| {
                    let pool = t.pool.as_ref()?;
                    let location = t.locations.pool.clone().unwrap_or_else(|| f.file.clone());
                    if !self.pools.contains_key(pool) {
                        return Some(ConfigError {
                            location,
                            message: format!(
                                "task `{}`: unknown pool `{pool}`; declare it in backfill.toml as [pools] {pool} = 2 (known: {})",
                                t.id,
                                if self.pools.is_empty() {
                                    "none".to_string()
                                } else {
                                    self.pools.keys().cloned().collect::<Vec<_>>().join(", ")
                                }
                            ),
                        });
                    }
                    // A batch that fails runs again in halves: calls at the source that the
                    // pool's rate, one start a try, could not count.
                    (dag.batch_size > 1 && self.pool_rates.contains_key(pool)).then(|| ConfigError {
                        location,
                        message: format!(
                            "task `{}`: pool `{pool}` has a rate, and this DAG's batch_size = {} would run its intervals in batches, which a rate cannot bound (a batch that fails runs again in halves); remove batch_size, or the pool's rate",
                            t.id, dag.batch_size
                        ),
                    })
                })
                .collect();
            if !errors.is_empty() {
                f.dag = Err(errors);
            }
        }
    }
}

/// Each `upstream` names a DAG of the project, and no DAG is its own upstream through a chain.
fn known_upstreams(files: &mut [DagFile]) {
    let ids: HashMap<String, Vec<String>> = files
        .iter()
        .filter_map(|f| f.dag.as_ref().ok())
        .map(|d| {
            (
                d.id.clone(),
                d.upstream.iter().map(|u| u.0.clone()).collect(),
            )
        })
        .collect();
    let mut known: Vec<&String> = ids.keys().collect();
    known.sort();
    let known = known
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let mut verdicts: Vec<Option<Vec<ConfigError>>> = Vec::new();
    for f in files.iter() {
        let Ok(dag) = &f.dag else {
            verdicts.push(None);
            continue;
        };
        let mut errors = Vec::new();
        for (up, at) in &dag.upstream {
            if up == &dag.id {
                errors.push(ConfigError {
                    location: at.clone(),
                    message: format!("`upstream`: DAG `{up}` cannot be its own upstream"),
                });
            } else if !ids.contains_key(up) {
                errors.push(ConfigError {
                    location: at.clone(),
                    message: format!(
                        "`upstream`: unknown DAG `{up}` (DAGs of the project: {known})"
                    ),
                });
            } else if let Some(path) = cycle_through(&ids, up, &dag.id) {
                errors.push(ConfigError {
                    location: at.clone(),
                    message: format!(
                        "`upstream`: a cycle: {} -> {}; a DAG cannot depend on its own output",
                        dag.id,
                        path.join(" -> ")
                    ),
                });
            }
        }
        verdicts.push((!errors.is_empty()).then_some(errors));
    }
    for (f, v) in files.iter_mut().zip(verdicts) {
        if let Some(errors) = v {
            f.dag = Err(errors);
        }
    }
}

/// The chain `from -> ... -> to` of upstream links, if `to` is upstream of `from`.
fn cycle_through(ids: &HashMap<String, Vec<String>>, from: &str, to: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = std::collections::HashSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last()?.clone();
        if last == to {
            return Some(path);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for next in ids.get(&last).into_iter().flatten() {
            let mut p = path.clone();
            p.push(next.clone());
            stack.push(p);
        }
    }
    None
}

fn one_producer_per_table(files: &mut [DagFile]) {
    struct Producer {
        file: usize,
        task: String,
        at: String,
    }
    let mut producers: HashMap<(String, String), Producer> = HashMap::new();
    let mut conflicts: Vec<(usize, ConfigError)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let Ok(dag) = &f.dag else { continue };
        let mut sql: Vec<(&Task, &SqlTask, &str)> = dag
            .tasks
            .iter()
            .filter_map(|t| match &t.kind {
                TaskKind::Sql(s) => Some((t, s, t.locations.target.as_deref().unwrap_or(&f.file))),
                TaskKind::Command(_) => None,
            })
            .collect();
        // In file order, so that "first" means first in the file.
        sql.sort_by_key(|(_, _, at)| line_col(at));
        for (task, s, at) in sql {
            let key = (s.warehouse.name.clone(), table_key(s));
            let Some(first) = producers.get(&key) else {
                producers.insert(
                    key,
                    Producer {
                        file: i,
                        task: task.id.clone(),
                        at: at.to_string(),
                    },
                );
                continue;
            };
            conflicts.push((
                i,
                ConfigError {
                    location: at.to_string(),
                    message: format!(
                        "table `{}` of warehouse `{}` is already the target of task `{}` in {}; a table has one producer",
                        s.target, s.warehouse.name, first.task, first.at
                    ),
                },
            ));
            if first.file != i {
                conflicts.push((
                    first.file,
                    ConfigError {
                        location: first.at.clone(),
                        message: format!(
                            "table `{}` of warehouse `{}` is also the target of task `{}` in {}; a table has one producer",
                            s.target, s.warehouse.name, task.id, at
                        ),
                    },
                ));
            }
        }
    }
    for (i, e) in conflicts {
        match &mut files[i].dag {
            Err(errors) => errors.push(e),
            ok @ Ok(_) => *ok = Err(vec![e]),
        }
    }
}

/// The table a SQL task writes, as its warehouse names it: SQLite's names are case-insensitive;
/// PostgreSQL's are quoted as written (so case counts), and an unqualified one is in `public`
/// (the default `search_path`), so that `dup` and `public.dup` are one table.
fn table_key(s: &SqlTask) -> String {
    if s.warehouse.is_postgres() {
        if s.target.contains('.') {
            s.target.clone()
        } else {
            format!("public.{}", s.target)
        }
    } else {
        s.target.to_ascii_lowercase()
    }
}

/// A name that may be spliced into SQL: letters, digits and `_`, not starting with a digit.
pub(crate) fn sql_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
