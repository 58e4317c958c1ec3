//! Finds and loads a project: `backfill.toml` and `dags/*.toml`, validated.
//!
//! Every configuration error names the file, the line and column, the key, and what to do.
//! A loaded [`Dag`] is fully checked: schedule, timezone, durations, the task graph (unknown
//! dependencies, cycles) and the template names used by commands.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;
use toml::Spanned;

use crate::manifest::Durability;
use crate::schedule::Schedule;
use crate::task::template;

pub const PROJECT_FILE: &str = "backfill.toml";
pub const DAGS_DIR: &str = "dags";

/// A configuration problem with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// `path:line:col`, or just the path when the position is unknown.
    pub location: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error(
        "no {PROJECT_FILE} in {} or any parent directory; run inside a project or pass -C DIR",
        .0.display()
    )]
    NotFound(PathBuf),
    #[error("{}", join_errors(.0))]
    Config(Vec<ConfigError>),
    #[error("unknown DAG `{id}`; {}", known_hint(.known))]
    UnknownDag { id: String, known: Vec<String> },
}

fn join_errors(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn known_hint(known: &[String]) -> String {
    if known.is_empty() {
        format!("the project has no DAG files in {DAGS_DIR}/")
    } else {
        format!("known DAGs: {}", known.join(", "))
    }
}

/// A loaded project: its root, settings and DAG files.
#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
    pub manifest_path: PathBuf,
    pub logs_dir: PathBuf,
    /// A lease whose owner has not sent a heartbeat for this long is stale.
    pub lease_timeout: Duration,
    /// SQLite warehouses by name.
    pub warehouses: BTreeMap<String, Warehouse>,
    /// How the manifest's commits reach the disk.
    pub durability: Durability,
}

/// A SQLite warehouse declared in `backfill.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warehouse {
    pub name: String,
    pub path: PathBuf,
    /// SQL files run once, in order, in one transaction, when the database file does not exist.
    pub init: Vec<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    manifest: Option<String>,
    logs: Option<String>,
    lease_timeout: Option<Spanned<String>>,
    durability: Option<Spanned<String>>,
    #[serde(default)]
    warehouse: BTreeMap<String, Spanned<RawWarehouse>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWarehouse {
    path: String,
    #[serde(default)]
    init: Vec<String>,
}

impl Project {
    /// Finds the project: `dir` itself when given (`-C`), else the nearest ancestor of the
    /// current directory holding `backfill.toml`.
    pub fn discover(dir: Option<&Path>) -> Result<Self, ProjectError> {
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
        Self::load(root)
    }

    fn load(root: PathBuf) -> Result<Self, ProjectError> {
        let path = root.join(PROJECT_FILE);
        let shown = PROJECT_FILE.to_string();
        let text = read(&path, &shown)?;
        let raw: RawProject = toml::from_str(&text)
            .map_err(|e| ProjectError::Config(vec![toml_error(&shown, &text, &e)]))?;
        let lease_timeout = match &raw.lease_timeout {
            Some(s) => parse_duration(s, &shown, &text, "lease_timeout")
                .map_err(|e| ProjectError::Config(vec![e]))?,
            None => Duration::from_secs(30),
        };
        let mut warehouses = BTreeMap::new();
        let mut errors = Vec::new();
        let durability = match raw.durability.as_ref().map(|d| (d, d.get_ref().as_str())) {
            None | Some((_, "normal")) => Durability::Normal,
            Some((_, "full")) => Durability::Full,
            Some((d, other)) => {
                errors.push(ConfigError {
                    location: location(&shown, &text, d.span().start),
                    message: format!(
                        "key `durability`: `{other}` is neither \"normal\" (survives kill -9) nor \"full\" (also survives a power cut)"
                    ),
                });
                Durability::Normal
            }
        };
        for (name, w) in &raw.warehouse {
            if !sql_identifier(name) {
                errors.push(ConfigError {
                    location: location(&shown, &text, w.span().start),
                    message: format!(
                        "invalid warehouse name `{name}`: use letters, digits and `_`, starting with a letter or `_`"
                    ),
                });
            }
            let init: Vec<PathBuf> = w.get_ref().init.iter().map(|f| root.join(f)).collect();
            for (file, full) in w.get_ref().init.iter().zip(&init) {
                if !full.is_file() {
                    errors.push(ConfigError {
                        location: location(&shown, &text, w.span().start),
                        message: format!(
                            "warehouse `{name}`: init file `{file}` does not exist (paths are relative to the project folder)"
                        ),
                    });
                }
            }
            warehouses.insert(
                name.clone(),
                Warehouse {
                    name: name.clone(),
                    path: root.join(&w.get_ref().path),
                    init,
                },
            );
        }
        if !errors.is_empty() {
            return Err(ProjectError::Config(errors));
        }
        Ok(Self {
            manifest_path: root.join(raw.manifest.as_deref().unwrap_or(".backfill/manifest.db")),
            logs_dir: root.join(raw.logs.as_deref().unwrap_or(".backfill/logs")),
            lease_timeout,
            warehouses,
            durability,
            root,
        })
    }

    /// Paths of every DAG file, sorted.
    pub fn dag_files(&self) -> Vec<PathBuf> {
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

    /// Loads every DAG file. Returns the valid DAGs and every error found.
    pub fn load_all(&self) -> (Vec<Dag>, Vec<ConfigError>) {
        let mut dags: Vec<Dag> = Vec::new();
        let mut errors = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for path in self.dag_files() {
            let shown = self.display_path(&path);
            match Dag::load(&path, &shown, &self.warehouses) {
                Ok(dag) => {
                    if let Some(other) = seen.get(&dag.id) {
                        errors.push(ConfigError {
                            location: shown.clone(),
                            message: format!(
                                "DAG id `{}` is already used by {other}; ids must be unique",
                                dag.id
                            ),
                        });
                    } else {
                        seen.insert(dag.id.clone(), shown);
                        dags.push(dag);
                    }
                }
                Err(mut e) => errors.append(&mut e),
            }
        }
        (dags, errors)
    }

    /// Loads one DAG by id. A broken file of another DAG does not prevent it.
    pub fn dag(&self, id: &str) -> Result<Dag, ProjectError> {
        let (mut dags, errors) = self.load_all();
        if let Some(i) = dags.iter().position(|d| d.id == id) {
            return Ok(dags.swap_remove(i));
        }
        // The DAG may be the one whose file is broken: report that file's errors.
        let own: Vec<ConfigError> = errors
            .iter()
            .filter(|e| {
                Path::new(e.location.split(':').next().unwrap_or(""))
                    .file_stem()
                    .is_some_and(|s| s == id)
            })
            .cloned()
            .collect();
        if !own.is_empty() {
            return Err(ProjectError::Config(own));
        }
        Err(ProjectError::UnknownDag {
            id: id.to_string(),
            known: dags.into_iter().map(|d| d.id).collect(),
        })
    }

    /// A path relative to the project root, for messages.
    pub fn display_path(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}

/// A validated DAG.
#[derive(Debug, Clone)]
pub struct Dag {
    pub id: String,
    /// The file, relative to the project root.
    pub file: String,
    pub description: Option<String>,
    pub schedule: Schedule,
    pub tz: Tz,
    pub max_active_runs: Option<u32>,
    pub depends_on_past: bool,
    /// Tasks in an order that respects `depends_on`.
    pub tasks: Vec<Task>,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub id: String,
    pub depends_on: Vec<String>,
    pub kind: TaskKind,
    /// Checks that decide whether a try's output is published.
    pub gate: Option<Gate>,
    /// For command tasks: runs only after the gate passed.
    pub publish: Option<CommandSpec>,
    pub retries: u32,
    pub retry_delay: Duration,
    pub timeout: Option<Duration>,
    /// How long a task may take to stop after SIGTERM before it gets SIGKILL.
    pub grace_period: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskKind {
    Command(CommandSpec),
    Sql(SqlTask),
}

/// A SQL task: a SELECT over a warehouse whose rows replace one partition of `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlTask {
    pub warehouse: Warehouse,
    pub target: String,
    pub partition_column: String,
    pub sql: String,
}

/// The publication gate of a task (`[tasks.gate]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub unique_key: Vec<String>,
    pub source_count: Option<SourceCount>,
    pub tolerance: f64,
    pub allow_empty: bool,
}

/// How to count the source rows of an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCount {
    /// A query in the task's warehouse, with the interval's bind parameters.
    Sql(String),
    /// A command that prints one integer.
    Command(CommandSpec),
}

/// A command: an argument vector run without a shell, or a line run by `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandSpec {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDag {
    id: Option<Spanned<String>>,
    description: Option<String>,
    schedule: Spanned<String>,
    timezone: Option<Spanned<String>>,
    max_active_runs: Option<Spanned<i64>>,
    retries: Option<Spanned<i64>>,
    retry_delay: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    grace_period: Option<Spanned<String>>,
    depends_on_past: Option<bool>,
    #[serde(default)]
    tasks: Vec<RawTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: Spanned<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
    command: Option<Spanned<RawCommand>>,
    warehouse: Option<Spanned<String>>,
    target: Option<Spanned<String>>,
    partition_column: Option<Spanned<String>>,
    sql: Option<Spanned<String>>,
    gate: Option<Spanned<RawGate>>,
    publish: Option<Spanned<RawCommand>>,
    retries: Option<Spanned<i64>>,
    retry_delay: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    grace_period: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    #[serde(default)]
    unique_key: Vec<Spanned<String>>,
    source_count: Option<Spanned<RawCommand>>,
    tolerance: Option<Spanned<f64>>,
    allow_empty: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawCommand {
    Argv(Vec<String>),
    Shell(String),
}

/// Collects errors for one file with positions.
struct FileErrors<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl<'a> FileErrors<'a> {
    fn at<T>(&mut self, spanned: &Spanned<T>, message: String) {
        self.errors.push(ConfigError {
            location: location(self.file, self.text, spanned.span().start),
            message,
        });
    }
}

impl Dag {
    fn load(
        path: &Path,
        shown: &str,
        warehouses: &BTreeMap<String, Warehouse>,
    ) -> Result<Self, Vec<ConfigError>> {
        let text = read(path, shown).map_err(|e| match e {
            ProjectError::Config(v) => v,
            other => vec![ConfigError {
                location: shown.to_string(),
                message: other.to_string(),
            }],
        })?;
        let raw: RawDag = toml::from_str(&text).map_err(|e| vec![toml_error(shown, &text, &e)])?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut errs = FileErrors {
            file: shown,
            text: &text,
            errors: Vec::new(),
        };
        let id = raw.id.as_ref().map(|s| s.get_ref().clone()).unwrap_or(stem);
        if !valid_id(&id) {
            let message =
                format!("invalid DAG id `{id}`: use letters, digits, `_`, `-` and `.` only");
            match &raw.id {
                Some(s) => errs.at(s, message),
                None => errs.errors.push(ConfigError {
                    location: shown.to_string(),
                    message,
                }),
            }
        }

        let tz = match &raw.timezone {
            None => Some(Tz::UTC),
            Some(s) => match s.get_ref().parse::<Tz>() {
                Ok(tz) => Some(tz),
                Err(_) => {
                    errs.at(
                        s,
                        format!(
                            "unknown timezone `{}` in key `timezone`; use an IANA name such as `UTC` or `Europe/Berlin`",
                            s.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        let schedule = tz.and_then(|tz| match Schedule::parse(raw.schedule.get_ref(), tz) {
            Ok(s) => Some(s),
            Err(e) => {
                errs.at(&raw.schedule, format!("key `schedule`: {e}"));
                None
            }
        });
        let max_active_runs =
            raw.max_active_runs
                .as_ref()
                .and_then(|m| match u32::try_from(*m.get_ref()) {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        errs.at(
                            m,
                            "key `max_active_runs` must be a whole number of at least 1".into(),
                        );
                        None
                    }
                });
        let defaults = TaskDefaults {
            retries: count(&raw.retries, "retries", &mut errs).unwrap_or(0),
            retry_delay: duration(&raw.retry_delay, "retry_delay", &mut errs)
                .unwrap_or(Duration::from_secs(30)),
            timeout: duration(&raw.timeout, "timeout", &mut errs),
            grace_period: duration(&raw.grace_period, "grace_period", &mut errs)
                .unwrap_or(Duration::from_secs(10)),
        };
        if raw.tasks.is_empty() {
            errs.errors.push(ConfigError {
                location: shown.to_string(),
                message: "the DAG has no tasks; add at least one [[tasks]] table".into(),
            });
        }
        let tasks = load_tasks(&raw.tasks, &defaults, warehouses, &mut errs);

        match (errs.errors.is_empty(), schedule, tz) {
            (true, Some(schedule), Some(tz)) => Ok(Self {
                id,
                file: shown.to_string(),
                description: raw.description,
                schedule,
                tz,
                max_active_runs,
                depends_on_past: raw.depends_on_past.unwrap_or(false),
                tasks,
            }),
            _ => Err(errs.errors),
        }
    }
}

struct TaskDefaults {
    retries: u32,
    retry_delay: Duration,
    timeout: Option<Duration>,
    grace_period: Duration,
}

fn load_tasks(
    raw: &[RawTask],
    defaults: &TaskDefaults,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, t) in raw.iter().enumerate() {
        let id = t.id.get_ref();
        if !valid_id(id) {
            errs.at(
                &t.id,
                format!("invalid task id `{id}`: use letters, digits, `_`, `-` and `.` only"),
            );
        }
        if ids.insert(id, i).is_some() {
            errs.at(
                &t.id,
                format!("task id `{id}` is used twice; task ids must be unique"),
            );
        }
    }
    for t in raw {
        for dep in &t.depends_on {
            if !ids.contains_key(dep.get_ref().as_str()) {
                let known: Vec<&str> = raw.iter().map(|t| t.id.get_ref().as_str()).collect();
                errs.at(
                    dep,
                    format!(
                        "task `{}` depends on unknown task `{}`; known tasks: {}",
                        t.id.get_ref(),
                        dep.get_ref(),
                        known.join(", ")
                    ),
                );
            }
        }
        let Some(kind) = task_kind(t, warehouses, errs) else {
            continue;
        };
        let gate = t
            .gate
            .as_ref()
            .and_then(|g| load_gate(t, g, matches!(kind, TaskKind::Sql(_)), errs));
        let publish = match (&t.publish, &kind) {
            (None, _) => None,
            (Some(p), TaskKind::Sql(_)) => {
                errs.at(
                    p,
                    "key `publish`: a SQL task publishes its audited rows itself; remove `publish`"
                        .into(),
                );
                None
            }
            (Some(p), TaskKind::Command(_)) => command_spec(p, "publish", errs),
        };
        tasks.push(Task {
            id: t.id.get_ref().clone(),
            depends_on: t.depends_on.iter().map(|d| d.get_ref().clone()).collect(),
            kind,
            gate,
            publish,
            retries: count(&t.retries, "retries", errs).unwrap_or(defaults.retries),
            retry_delay: duration(&t.retry_delay, "retry_delay", errs)
                .unwrap_or(defaults.retry_delay),
            timeout: duration(&t.timeout, "timeout", errs).or(defaults.timeout),
            grace_period: duration(&t.grace_period, "grace_period", errs)
                .unwrap_or(defaults.grace_period),
        });
    }
    if !errs.errors.is_empty() {
        return tasks;
    }
    match topo_order(&tasks) {
        Ok(order) => order.into_iter().map(|i| tasks[i].clone()).collect(),
        Err(cycle) => {
            let first = raw
                .iter()
                .find(|t| t.id.get_ref() == &cycle[0])
                .map(|t| &t.id);
            let message = format!(
                "the tasks' depends_on form a cycle: {}; remove one of these edges",
                cycle.join(" -> ")
            );
            match first {
                Some(span) => errs.at(span, message),
                None => errs.errors.push(ConfigError {
                    location: errs.file.to_string(),
                    message,
                }),
            }
            tasks
        }
    }
}

/// A command (array or shell line) whose templates use only known names.
fn command_spec(
    c: &Spanned<RawCommand>,
    key: &str,
    errs: &mut FileErrors<'_>,
) -> Option<CommandSpec> {
    let spec = match c.get_ref() {
        RawCommand::Argv(v) if v.is_empty() => {
            errs.at(c, format!("key `{key}` is an empty array; name a program"));
            return None;
        }
        RawCommand::Argv(v) => CommandSpec::Argv(v.clone()),
        RawCommand::Shell(s) => CommandSpec::Shell(s.clone()),
    };
    let texts: Vec<&str> = match &spec {
        CommandSpec::Argv(v) => v.iter().map(String::as_str).collect(),
        CommandSpec::Shell(s) => vec![s.as_str()],
    };
    let mut ok = true;
    for text in texts {
        if let Err(e) = template::check(text) {
            errs.at(c, format!("key `{key}`: {e}"));
            ok = false;
        }
    }
    ok.then_some(spec)
}

/// A command task or a SQL task, never both.
fn task_kind(
    t: &RawTask,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<TaskKind> {
    let id = t.id.get_ref();
    match (&t.command, &t.sql) {
        (Some(c), None) => {
            for (key, present) in [
                ("warehouse", t.warehouse.is_some()),
                ("target", t.target.is_some()),
                ("partition_column", t.partition_column.is_some()),
            ] {
                if present {
                    errs.at(
                        c,
                        format!("task `{id}`: key `{key}` belongs to SQL tasks; a command task cannot have it"),
                    );
                }
            }
            command_spec(c, "command", errs).map(TaskKind::Command)
        }
        (None, Some(sql)) => {
            let mut missing = Vec::new();
            let mut field = |v: &Option<Spanned<String>>, key: &'static str, ident: bool| match v {
                None => {
                    missing.push(key);
                    None
                }
                Some(v) if ident && !sql_identifier(v.get_ref()) => {
                    errs.at(
                        v,
                        format!(
                            "key `{key}`: `{}` is not a plain SQL name (letters, digits and `_`, starting with a letter or `_`)",
                            v.get_ref()
                        ),
                    );
                    None
                }
                Some(v) => Some(v.get_ref().clone()),
            };
            let warehouse = field(&t.warehouse, "warehouse", false);
            let target = field(&t.target, "target", true);
            let partition_column = field(&t.partition_column, "partition_column", true);
            if !missing.is_empty() {
                errs.at(
                    sql,
                    format!(
                        "SQL task `{id}` needs {}; see the README's SQL tasks section",
                        missing
                            .iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                return None;
            }
            let name = warehouse?;
            let Some(warehouse) = warehouses.get(&name) else {
                let known: Vec<&str> = warehouses.keys().map(String::as_str).collect();
                if let Some(w) = &t.warehouse {
                    errs.at(
                        w,
                        format!(
                            "unknown warehouse `{name}`; declare it in backfill.toml as [warehouse.{name}] (known: {})",
                            if known.is_empty() { "none".to_string() } else { known.join(", ") }
                        ),
                    );
                }
                return None;
            };
            Some(TaskKind::Sql(SqlTask {
                warehouse: warehouse.clone(),
                target: target?,
                partition_column: partition_column?,
                sql: sql.get_ref().clone(),
            }))
        }
        (Some(c), Some(_)) => {
            errs.at(
                c,
                format!("task `{id}` has both `command` and `sql`; a task is one or the other"),
            );
            None
        }
        (None, None) => {
            errs.at(
                &t.id,
                format!(
                    "task `{id}` has neither `command` nor `sql`; give it `command = [\"prog\", \"arg\"]`, `command = \"shell line\"`, or a SQL task's `warehouse`, `target`, `partition_column` and `sql`"
                ),
            );
            None
        }
    }
}

fn load_gate(
    t: &RawTask,
    g: &Spanned<RawGate>,
    is_sql: bool,
    errs: &mut FileErrors<'_>,
) -> Option<Gate> {
    let raw = g.get_ref();
    let mut ok = true;
    if !raw.unique_key.is_empty() && !is_sql {
        errs.at(
            g,
            format!(
                "task `{}`: `unique_key` needs a SQL task (its rows are audited in a table); remove it or make the task a SQL task",
                t.id.get_ref()
            ),
        );
        ok = false;
    }
    for k in &raw.unique_key {
        if !sql_identifier(k.get_ref()) {
            errs.at(
                k,
                format!(
                    "key `unique_key`: `{}` is not a plain SQL column name",
                    k.get_ref()
                ),
            );
            ok = false;
        }
    }
    let tolerance = match &raw.tolerance {
        None => 0.0,
        Some(v) if v.get_ref().is_finite() && *v.get_ref() >= 0.0 => *v.get_ref(),
        Some(v) => {
            errs.at(
                v,
                "key `tolerance` must be a fraction of at least 0, such as 0.02 for 2%".into(),
            );
            ok = false;
            0.0
        }
    };
    let source_count = match &raw.source_count {
        None => None,
        Some(c) if is_sql => match c.get_ref() {
            RawCommand::Shell(sql) => Some(SourceCount::Sql(sql.clone())),
            RawCommand::Argv(_) => {
                errs.at(
                    c,
                    "key `source_count`: in a SQL task it is a SQL query string".into(),
                );
                ok = false;
                None
            }
        },
        Some(c) => match command_spec(c, "source_count", errs) {
            Some(spec) => Some(SourceCount::Command(spec)),
            None => {
                ok = false;
                None
            }
        },
    };
    ok.then(|| Gate {
        unique_key: raw.unique_key.iter().map(|k| k.get_ref().clone()).collect(),
        source_count,
        tolerance,
        allow_empty: raw.allow_empty.unwrap_or(false),
    })
}

/// A name that may be spliced into SQL: letters, digits and `_`, not starting with a digit.
pub fn sql_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Orders tasks so that each comes after its dependencies, keeping file order where free.
/// On a cycle, returns the task ids along one cycle, the first repeated at the end.
fn topo_order(tasks: &[Task]) -> Result<Vec<usize>, Vec<String>> {
    let index: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    let mut done = vec![false; tasks.len()];
    let mut order = Vec::with_capacity(tasks.len());
    while order.len() < tasks.len() {
        let ready = (0..tasks.len()).find(|&i| {
            !done[i]
                && tasks[i]
                    .depends_on
                    .iter()
                    .all(|d| index.get(d.as_str()).is_none_or(|&j| done[j]))
        });
        match ready {
            Some(i) => {
                done[i] = true;
                order.push(i);
            }
            None => {
                // Every remaining task waits on another remaining one: walk until a repeat.
                let mut path: Vec<usize> = Vec::new();
                let mut at = (0..tasks.len()).find(|&i| !done[i]).unwrap_or(0);
                while !path.contains(&at) {
                    path.push(at);
                    at = tasks[at]
                        .depends_on
                        .iter()
                        .filter_map(|d| index.get(d.as_str()).copied())
                        .find(|&j| !done[j])
                        .unwrap_or(at);
                }
                let start = path.iter().position(|&p| p == at).unwrap_or(0);
                let mut cycle: Vec<String> =
                    path[start..].iter().map(|&i| tasks[i].id.clone()).collect();
                cycle.push(tasks[at].id.clone());
                return Err(cycle);
            }
        }
    }
    Ok(order)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn count(value: &Option<Spanned<i64>>, key: &str, errs: &mut FileErrors<'_>) -> Option<u32> {
    let v = value.as_ref()?;
    match u32::try_from(*v.get_ref()) {
        Ok(n) => Some(n),
        Err(_) => {
            errs.at(
                v,
                format!("key `{key}` must be a whole number of at least 0"),
            );
            None
        }
    }
}

fn duration(
    value: &Option<Spanned<String>>,
    key: &str,
    errs: &mut FileErrors<'_>,
) -> Option<Duration> {
    let v = value.as_ref()?;
    match parse_duration(v, errs.file, errs.text, key) {
        Ok(d) => Some(d),
        Err(e) => {
            errs.errors.push(e);
            None
        }
    }
}

fn parse_duration(
    v: &Spanned<String>,
    file: &str,
    text: &str,
    key: &str,
) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v.get_ref()).map_err(|e| ConfigError {
        location: location(file, text, v.span().start),
        message: format!(
            "key `{key}`: cannot read `{}` as a duration ({e}); write it like \"30s\", \"5m\" or \"1h 30m\"",
            v.get_ref()
        ),
    })
}

fn read(path: &Path, shown: &str) -> Result<String, ProjectError> {
    std::fs::read_to_string(path).map_err(|e| {
        ProjectError::Config(vec![ConfigError {
            location: shown.to_string(),
            message: format!("cannot read the file: {e}"),
        }])
    })
}

fn toml_error(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let location = match e.span() {
        Some(span) => location(file, text, span.start),
        None => file.to_string(),
    };
    let mut message = e.message().trim().replace('\n', " ");
    if message.starts_with("unknown field") {
        message.push_str("; remove or rename the key");
    }
    ConfigError { location, message }
}

/// `file:line:col` of a byte offset (1-based).
fn location(file: &str, text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{file}:{line}:{col}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Dag, Vec<ConfigError>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.toml");
        std::fs::write(&path, text).unwrap();
        Dag::load(&path, "dags/demo.toml", &BTreeMap::new())
    }

    fn first_error(text: &str) -> String {
        load(text).unwrap_err()[0].to_string()
    }

    #[test]
    fn a_full_dag_loads_with_defaults_and_overrides() {
        let dag = load(
            r#"
schedule = "@daily"
timezone = "Europe/Berlin"
max_active_runs = 4
retries = 2
retry_delay = "5s"
timeout = "10m"

[[tasks]]
id = "load"
depends_on = ["extract"]
command = "echo {{ ds }}"
retries = 0

[[tasks]]
id = "extract"
command = ["echo", "{{ data_interval_start }}", "{{ conf.region }}"]
"#,
        )
        .unwrap();
        assert_eq!(dag.id, "demo");
        assert_eq!(dag.max_active_runs, Some(4));
        let ids: Vec<_> = dag.tasks.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["extract", "load"]);
        assert_eq!(dag.tasks[0].retries, 2);
        assert_eq!(dag.tasks[1].retries, 0);
        assert_eq!(dag.tasks[0].retry_delay, Duration::from_secs(5));
        assert_eq!(dag.tasks[0].timeout, Some(Duration::from_secs(600)));
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let base = "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n";
        assert_eq!(
            first_error(&format!("{base}retires = 3\n")),
            "dags/demo.toml:5:1: unknown field `retires`, expected one of `id`, `depends_on`, `command`, `warehouse`, `target`, `partition_column`, `sql`, `gate`, `publish`, `retries`, `retry_delay`, `timeout`, `grace_period`; remove or rename the key"
        );
        assert!(first_error("schedule = \"@daily\"\ntimezone = \"Mars/Olympus\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n")
            .starts_with("dags/demo.toml:2:12: unknown timezone `Mars/Olympus`"));
        assert!(
            first_error("schedule = \"0 25 * * *\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n")
                .starts_with("dags/demo.toml:1:12: key `schedule`: invalid schedule `0 25 * * *`")
        );
        assert!(
            first_error("[[tasks]]\nid = \"a\"\ncommand = \"true\"\n")
                .contains("missing field `schedule`")
        );
        assert_eq!(
            first_error(&format!("{base}depends_on = [\"b\"]\n")),
            "dags/demo.toml:5:15: task `a` depends on unknown task `b`; known tasks: a"
        );
        assert!(
            first_error(&format!("{base}timeout = \"soon\"\n")).starts_with(
                "dags/demo.toml:5:11: key `timeout`: cannot read `soon` as a duration"
            )
        );
        assert!(
            first_error(
                "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"echo {{ dss }}\"\n"
            )
            .contains("unknown template variable `dss`")
        );
    }

    #[test]
    fn a_dependency_cycle_is_reported_with_its_path() {
        let err = first_error(
            "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\ndepends_on = [\"b\"]\n[[tasks]]\nid = \"b\"\ncommand = \"true\"\ndepends_on = [\"a\"]\n",
        );
        assert_eq!(
            err,
            "dags/demo.toml:3:6: the tasks' depends_on form a cycle: a -> b -> a; remove one of these edges"
        );
    }
}
