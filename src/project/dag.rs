//! The validated model of a DAG: [`Dag`], [`Task`] and their parts, as `load` builds them from
//! a DAG file, with what a command needs of them (templates, `conf` keys).

use std::collections::HashSet;
use std::time::Duration;

use chrono_tz::Tz;

use super::Warehouse;
use super::diagnostics::{ConfigError, StringAt};
pub(crate) use crate::gate::History;
pub use crate::gate::Severity;
use crate::schedule::Schedule;
use crate::task::template;

/// A validated DAG.
#[derive(Debug, Clone)]
pub(crate) struct Dag {
    pub id: String,
    /// The file, relative to the project root.
    pub file: String,
    pub description: Option<String>,
    pub schedule: Schedule,
    pub tz: Tz,
    pub max_active_runs: Option<u32>,
    /// At most this many consecutive planned intervals run as one query (`batch_size`,
    /// default 1; see [`crate::plan::batches`]).
    pub batch_size: u32,
    pub depends_on_past: bool,
    /// Commands run when a backfill of this DAG ends; each key overrides the project's.
    pub notify: Notify,
    /// Tasks in an order that respects `depends_on`.
    pub tasks: Vec<Task>,
    /// DAGs of the project whose output this one reads: an interval of this DAG depends on
    /// every interval of each that overlaps it in time. Each with where it is written.
    pub upstream: Vec<(String, String)>,
}

/// Whether a DAG of `tasks` may run its intervals in batches (`batch_size` above 1): why not
/// otherwise, as a message says it (the caller says how to fix it). `upstream`: the DAG reads
/// what other DAGs publish.
pub(crate) fn batchable(
    tasks: &[Task],
    depends_on_past: bool,
    upstream: bool,
) -> Result<(), String> {
    if depends_on_past {
        return Err(
            "it sets `depends_on_past = true`, so each interval runs after the one before it"
                .into(),
        );
    }
    if upstream {
        // A batch reads every interval's input at once, before each interval's own check
        // that its upstream intervals stand (and are not being rerun) when it starts.
        return Err("it reads what its `upstream` DAGs publish, which each interval checks when it starts, after a batch would have read it".into());
    }
    if let Some(t) = tasks.iter().find(|t| t.ready.is_some()) {
        // A batch's command computes all its intervals at once: an interval whose sources are
        // not ready would hold the others back, or split the batch.
        return Err(format!(
            "task `{}` asks whether each interval's sources are ready ([tasks.ready]), and a batch computes its intervals at once",
            t.id
        ));
    }
    // A batch runs its intervals one after the other, so it holds at most one slot of a pool,
    // as one interval would.
    if tasks.len() != 1 {
        return Err(format!(
            "batches run DAGs of one task so far, and this one has {} tasks",
            tasks.len()
        ));
    }
    Ok(())
}

/// The `[notify]` commands: run when a `create` or `resume` ends, with the JSON summary on
/// stdin. Not templated: they read `BACKFILL_ID`, `BACKFILL_DAG`, `BACKFILL_STATE` and
/// `BACKFILL_EXIT_CODE` from their environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Notify {
    /// When an interval failed or was rejected, or the backfill hit an internal error.
    pub on_failure: Option<CommandSpec>,
    /// When every planned interval succeeded.
    pub on_success: Option<CommandSpec>,
    /// When the sources of one or more intervals were not ready (`[tasks.ready]`).
    pub on_not_ready: Option<CommandSpec>,
    /// Whenever it ends, also when it is interrupted.
    pub on_finish: Option<CommandSpec>,
    /// How long each may take (default 30s).
    pub timeout: Option<Duration>,
}

impl Notify {
    /// These settings, each key that is not set taken from `base`.
    pub(crate) fn over(&self, base: &Notify) -> Notify {
        Notify {
            on_failure: self.on_failure.clone().or_else(|| base.on_failure.clone()),
            on_success: self.on_success.clone().or_else(|| base.on_success.clone()),
            on_not_ready: self
                .on_not_ready
                .clone()
                .or_else(|| base.on_not_ready.clone()),
            on_finish: self.on_finish.clone().or_else(|| base.on_finish.clone()),
            timeout: self.timeout.or(base.timeout),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub id: String,
    pub depends_on: Vec<String>,
    pub kind: TaskKind,
    /// Checks that decide whether a try's output is published.
    pub gate: Option<Gate>,
    /// For command tasks: runs only after the gate passed.
    pub publish: Option<CommandSpec>,
    /// For command tasks: runs after a try whose output will not be published (rejected,
    /// failed, cancelled) and for a staged output that `backfill discard` drops.
    pub cleanup: Option<CommandSpec>,
    pub retries: u32,
    pub retry_delay: Duration,
    pub timeout: Option<Duration>,
    /// How long a task may take to stop after SIGTERM before it gets SIGKILL.
    pub grace_period: Duration,
    /// The `[pools]` pool whose slots its tries take.
    pub pool: Option<String>,
    /// `[tasks.ready]`: asked before an interval starts, whether its sources are there.
    pub ready: Option<Ready>,
    /// Where the task's keys are written, for messages about them.
    pub locations: TaskLocations,
}

/// A task's `[tasks.ready]`: how to ask whether an interval's sources are ready, and how long
/// to keep asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ready {
    pub check: ReadyCheck,
    /// How long an interval may wait for its sources (0: a source not ready is not waited
    /// for).
    pub wait: Duration,
    /// How often to ask again while it waits.
    pub every: Duration,
}

/// How readiness is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadyCheck {
    /// One read-only query of the task's warehouse: one value, true or a number other than 0
    /// when ready.
    Sql(String),
    /// A command: exit 0 when ready, 1 when not; any other end is an error.
    Command(CommandSpec),
}

/// Where a task's keys are written in its DAG file, each as `file:line:col` of the value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskLocations {
    /// The task's `id`.
    pub id: String,
    /// `command`, for a command task.
    pub command: Option<String>,
    /// `publish`, when the task has one.
    pub publish: Option<String>,
    /// `cleanup`, when the task has one.
    pub cleanup: Option<String>,
    /// `gate.source_count`, when the gate has one (a command, or a query of a SQL task).
    pub source_count: Option<String>,
    /// `gate.source_fingerprint`, when the gate has one.
    pub source_fingerprint: Option<String>,
    /// `target`, for a SQL task.
    pub target: Option<String>,
    /// `sql`, for a SQL task: places inside the query too.
    pub sql: Option<StringAt>,
    /// `pool`, when the task has one.
    pub pool: Option<String>,
    /// `[tasks.ready]`, when the task has it: its `sql` or `command`.
    pub ready: Option<String>,
    /// Each rule of the gate, in the order of `Gate::rules`: where it is written (a check's
    /// `sql`, with places inside it, or its `command`; a built-in rule's column name).
    pub rules: Vec<StringAt>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per task of a loaded DAG, never in bulk"
)]
pub(crate) enum TaskKind {
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
    /// Partitions replaced by publishes kept per interval, for rollback: the task's
    /// `keep_versions`, else its warehouse's.
    pub keep_versions: u32,
    /// How the output becomes the partition (`write`).
    pub write: WritePattern,
}

/// How a SQL task's output becomes its partition: the task's `write`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WritePattern {
    /// The interval's rows are deleted and the output inserted (`write = "replace"`).
    #[default]
    Replace,
    /// By the gate's `unique_key` (`write = "merge"`): keys the target does not hold are
    /// inserted, those whose other columns differ are updated (only the columns the query
    /// returns), identical rows are not written, and the partition's keys that the output no
    /// longer has are deleted, unless `keep_missing` (`on_missing = "keep"`, the upsert of a
    /// change set). `key` is the gate's `unique_key`.
    Merge {
        key: Vec<String>,
        keep_missing: bool,
    },
}

impl WritePattern {
    /// Whether the output's keys are looked up in the target's other partitions: a replace
    /// would hold a key twice if another partition has it, with `unique_key_scope = "table"`;
    /// a merge would update that partition's row without it (and moves the row with it).
    pub(crate) fn looks_elsewhere(&self, gate: &Gate) -> bool {
        match self {
            WritePattern::Replace => gate.unique_key_table,
            WritePattern::Merge { .. } => !gate.unique_key_table,
        }
    }

    pub(crate) fn is_merge(&self) -> bool {
        matches!(self, WritePattern::Merge { .. })
    }
}

/// The publication gate of a task (`[tasks.gate]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gate {
    pub unique_key: Vec<String>,
    /// `unique_key_scope = "table"`: the output's keys must not be in any other partition of
    /// the target either (a record the source moved across the partition boundary).
    pub unique_key_table: bool,
    /// With `write = "merge"`: the largest fraction of the partition's rows (as published) that
    /// a merge may insert, update or delete; more is rejected.
    pub max_changed: Option<f64>,
    pub source_count: Option<SourceCount>,
    /// What the source looks like now, as one value (a query or a command): recorded with each
    /// try and compared again by `--reprocess-behavior changed` and `backfill stale`.
    pub source_fingerprint: Option<SourceCount>,
    pub tolerance: f64,
    pub allow_empty: bool,
    /// Rules on the output's values, in the order written: `not_null`, `accepted_values` and
    /// `range` (by column name), then `[[tasks.gate.checks]]`.
    pub rules: Vec<Rule>,
    /// `history`: rows against the median of the task's last published partitions.
    pub history: Option<History>,
}

/// A rule on the values of a try's output.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// How messages name it: `not_null`, `accepted_values`, `range`, or a check's `name`.
    pub name: String,
    pub kind: RuleKind,
    pub severity: Severity,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind {
    /// The column holds no `NULL`.
    NotNull(String),
    /// Every value of the column that is not `NULL` is one of these.
    AcceptedValues(String, Vec<Literal>),
    /// Every value of the column that is not `NULL` lies within the bounds (both included).
    Range {
        column: String,
        min: Option<Literal>,
        max: Option<Literal>,
        /// With numeric bounds: NaN and the infinities pass (`allow_non_finite = true`);
        /// otherwise they are outside every range.
        allow_non_finite: bool,
    },
    /// A query in the task's warehouse over the table `output`: the rows it returns are
    /// violations.
    Sql(String),
    /// A command (command tasks) that prints the number of violations.
    Command(CommandSpec),
}

impl Rule {
    /// The rule as the dry run lists it: `not_null region`, `check "no refunds" (warn)`.
    pub(crate) fn describe(&self) -> String {
        let what = match &self.kind {
            RuleKind::NotNull(c) => format!("not_null {c}"),
            RuleKind::AcceptedValues(c, values) => format!(
                "accepted_values {c} in ({})",
                values
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            RuleKind::Range {
                column,
                min,
                max,
                allow_non_finite,
            } => {
                let range = match (min, max) {
                    (Some(a), Some(b)) => format!("range {column} from {a} to {b}"),
                    (Some(a), None) => format!("range {column} at least {a}"),
                    (None, Some(b)) => format!("range {column} at most {b}"),
                    (None, None) => format!("range {column}"),
                };
                if *allow_non_finite {
                    format!("{range}, NaN and infinities allowed")
                } else {
                    range
                }
            }
            RuleKind::Sql(_) => format!("check \"{}\"", self.name),
            RuleKind::Command(_) => format!("check \"{}\" (a command)", self.name),
        };
        match self.severity {
            Severity::Error => what,
            Severity::Warn => format!("{what} (warn)"),
        }
    }
}

impl Gate {
    /// The rules on values and the history, as the dry run lists them.
    pub(crate) fn described_rules(&self) -> Vec<String> {
        let mut out: Vec<String> = self.rules.iter().map(Rule::describe).collect();
        if let Some(h) = self.history {
            out.push(format!(
                "history: rows within {:.1}% of the median of the last {} published partitions",
                h.tolerance * 100.0,
                h.partitions
            ));
        }
        out
    }
}

impl RuleKind {
    /// The column a built-in rule is about.
    pub(crate) fn column(&self) -> Option<&str> {
        match self {
            Self::NotNull(c) | Self::AcceptedValues(c, _) | Self::Range { column: c, .. } => {
                Some(c)
            }
            Self::Sql(_) | Self::Command(_) => None,
        }
    }
}

/// A value written in a rule (`accepted_values`, `range`).
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Int(i64),
    Float(f64),
    Text(String),
}

impl Literal {
    /// The value as a SQL literal (SQLite and PostgreSQL read it alike).
    pub(crate) fn sql(&self) -> String {
        match self {
            Self::Int(i) => i.to_string(),
            Self::Float(f) => format!("{f:?}"),
            Self::Text(t) => format!("'{}'", t.replace('\'', "''")),
        }
    }
}

impl std::fmt::Display for Literal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Text(t) => write!(f, "'{t}'"),
        }
    }
}

/// How to look at the source of an interval (`source_count`, `source_fingerprint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCount {
    /// A query in the task's warehouse, with the interval's bind parameters.
    Sql(String),
    /// A command that prints one value (an integer for `source_count`).
    Command(CommandSpec),
}

impl Gate {
    /// Whether the gate can tell that an interval's source changed.
    pub(crate) fn watches_source(&self) -> bool {
        self.source_count.is_some() || self.source_fingerprint.is_some()
    }
}

/// A command: an argument vector run without a shell, or a line run by `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandSpec {
    Argv(Vec<String>),
    Shell(String),
}

impl CommandSpec {
    /// The templates of the command: each element of an array, or the shell line.
    pub(crate) fn templates(&self) -> Vec<&str> {
        match self {
            Self::Argv(v) => v.iter().map(String::as_str).collect(),
            Self::Shell(s) => vec![s.as_str()],
        }
    }
}

impl Task {
    /// The task's commands with the key that holds each and where it is written: `command`,
    /// `publish`, `cleanup` and a command `gate.source_count`.
    pub(crate) fn commands(&self) -> Vec<(&'static str, &CommandSpec, &str)> {
        let mut out = Vec::new();
        if let (TaskKind::Command(spec), Some(at)) = (&self.kind, &self.locations.command) {
            out.push(("command", spec, at.as_str()));
        }
        if let (Some(spec), Some(at)) = (&self.publish, &self.locations.publish) {
            out.push(("publish", spec, at.as_str()));
        }
        if let (Some(spec), Some(at)) = (&self.cleanup, &self.locations.cleanup) {
            out.push(("cleanup", spec, at.as_str()));
        }
        if let (
            Some(Gate {
                source_count: Some(SourceCount::Command(spec)),
                ..
            }),
            Some(at),
        ) = (&self.gate, &self.locations.source_count)
        {
            out.push(("source_count", spec, at.as_str()));
        }
        if let (
            Some(Gate {
                source_fingerprint: Some(SourceCount::Command(spec)),
                ..
            }),
            Some(at),
        ) = (&self.gate, &self.locations.source_fingerprint)
        {
            out.push(("source_fingerprint", spec, at.as_str()));
        }
        if let (
            Some(Ready {
                check: ReadyCheck::Command(spec),
                ..
            }),
            Some(at),
        ) = (&self.ready, &self.locations.ready)
        {
            out.push(("ready.command", spec, at.as_str()));
        }
        out
    }
}

/// One error per `conf` key that a command template of `task` uses and `conf` (the `--conf`
/// object) does not give, at the command's `file:line:col`.
pub(crate) fn missing_conf(task: &Task, conf: &serde_json::Value) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for (_, spec, at) in task.commands() {
        let mut reported = HashSet::new();
        for text in spec.templates() {
            for path in template::conf_keys(text) {
                if conf_gives(conf, &path) || !reported.insert(path.clone()) {
                    continue;
                }
                let keys: Vec<&str> = path.split('.').collect();
                errors.push(ConfigError {
                    location: at.to_string(),
                    message: format!(
                        "task `{}`: template uses `conf.{}`, which --conf does not give; pass it with --conf '{}'",
                        task.id,
                        path,
                        conf_example(&keys)
                    ),
                });
            }
        }
    }
    errors
}

/// Whether `conf` gives a dotted path. A path that leads into a value that is not an object
/// counts as given: `conf.name.upper()` is a method call on `name`, not a key lookup.
fn conf_gives(conf: &serde_json::Value, path: &str) -> bool {
    let mut at = Some(conf);
    for (i, key) in path.split('.').enumerate() {
        match at {
            Some(serde_json::Value::Object(object)) => at = object.get(key),
            // `--conf` itself is always an object; anything else gives no key at all.
            Some(_) if i > 0 => return true,
            Some(_) | None => return false,
        }
    }
    at.is_some()
}

/// `{"a": {"b": ...}}` for the path `a.b`.
fn conf_example(keys: &[&str]) -> String {
    let mut out = String::from("...");
    for key in keys.iter().rev() {
        out = format!("{{{}: {out}}}", serde_json::Value::from(*key));
    }
    out
}

impl Dag {
    /// What the DAG computes, key by key, as recorded with each backfill so that a process that
    /// joins or resumes it can tell whether it runs the same definition: the schedule, the time
    /// zone, `depends_on_past`, and for each task what it runs and how its output is judged.
    /// Not how many run at once, where messages go, or a warehouse's URL (its password stays
    /// out of the manifest): a warehouse is named.
    pub(crate) fn definition(&self) -> std::collections::BTreeMap<String, String> {
        let mut d = std::collections::BTreeMap::new();
        d.insert("schedule".to_string(), self.schedule.expr().to_string());
        d.insert("timezone".to_string(), self.tz.name().to_string());
        d.insert(
            "depends_on_past".to_string(),
            self.depends_on_past.to_string(),
        );
        for t in &self.tasks {
            let mut put = |key: &str, value: String| {
                d.insert(format!("tasks.{}.{key}", t.id), value);
            };
            put("depends_on", t.depends_on.join(", "));
            match &t.kind {
                TaskKind::Command(c) => put("command", format!("{c:?}")),
                TaskKind::Sql(s) => {
                    put("warehouse", s.warehouse.name.clone());
                    put("target", s.target.clone());
                    put("partition_column", s.partition_column.clone());
                    put("sql", s.sql.clone());
                }
            }
            if let Some(g) = &t.gate {
                put("gate", format!("{g:?}"));
            }
            if let Some(p) = &t.publish {
                put("publish", format!("{p:?}"));
            }
            if let Some(c) = &t.cleanup {
                put("cleanup", format!("{c:?}"));
            }
            if let Some(r) = &t.ready {
                put("ready", format!("{:?}", r.check));
            }
        }
        d
    }
}

/// What differs between two definitions (see [`Dag::definition`]), one key each: changed,
/// added or removed.
pub(crate) fn definition_changes(
    recorded: &std::collections::BTreeMap<String, String>,
    now: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in recorded {
        match now.get(k) {
            None => out.push(format!("{k} removed")),
            Some(n) if n != v => out.push(format!("{k} changed")),
            Some(_) => {}
        }
    }
    for k in now.keys().filter(|k| !recorded.contains_key(*k)) {
        out.push(format!("{k} added"));
    }
    out
}
