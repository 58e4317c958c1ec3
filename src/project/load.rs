//! Loading a DAG file into the validated model of `dag`: ids, defaults, tasks (what each does,
//! a command or SQL, and its gate: see `task`), the task graph; every error of the file is
//! collected with its line.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use chrono_tz::Tz;
use toml::Spanned;

use super::Warehouse;
use super::diagnostics::{ConfigError, FileErrors, StringAt, parse_duration};
use super::raw::{RawCommand, RawDag, RawReady, RawTask};
use super::task::{command_spec, load_gate, task_kind};
use crate::schedule::Schedule;
use crate::suggest::closest;

use super::dag::*;

/// Reads a `[notify]` table.
pub(crate) fn notify(raw: Option<&super::raw::RawNotify>, errs: &mut FileErrors<'_>) -> Notify {
    let Some(raw) = raw else {
        return Notify::default();
    };
    let spec = |c: &Option<Spanned<RawCommand>>, key: &str, errs: &mut FileErrors<'_>| {
        let c = c.as_ref()?;
        match c.get_ref() {
            RawCommand::Argv(v) if v.first().is_none_or(|p| p.get_ref().trim().is_empty()) => {
                errs.at(
                    c,
                    format!("key `notify.{key}` names no program; write [\"prog\", \"arg\"] or a shell line"),
                );
                None
            }
            RawCommand::Argv(v) => Some(CommandSpec::Argv(
                v.iter().map(|a| a.get_ref().clone()).collect(),
            )),
            RawCommand::Shell(s) if s.trim().is_empty() => {
                errs.at(
                    c,
                    format!("key `notify.{key}` is empty; write a shell line"),
                );
                None
            }
            RawCommand::Shell(s) => Some(CommandSpec::Shell(s.clone())),
        }
    };
    let timeout =
        raw.timeout
            .as_ref()
            .and_then(|t| match super::diagnostics::parse_duration(t.get_ref()) {
                Ok(d) if d.is_zero() => {
                    errs.at(t, "key `notify.timeout` must be longer than 0s".to_string());
                    None
                }
                Ok(d) => Some(d),
                Err(why) => {
                    errs.at(t, format!("key `notify.timeout`: {why}"));
                    None
                }
            });
    Notify {
        on_failure: spec(&raw.on_failure, "on_failure", errs),
        on_success: spec(&raw.on_success, "on_success", errs),
        on_not_ready: spec(&raw.on_not_ready, "on_not_ready", errs),
        on_finish: spec(&raw.on_finish, "on_finish", errs),
        timeout,
    }
}

/// The longest a DAG id or task id may be.
const MAX_ID_LEN: usize = 100;
/// The most retries a task may have: tries are counted in a `u32`.
const MAX_RETRIES: u32 = 1000;

/// The largest `batch_size`: a batch's query and its per-interval audit stay one read snapshot.
pub(crate) const MAX_BATCH_SIZE: u32 = 1000;

const ID_RULE: &str = "start with a letter, digit or `_`, then use letters, digits, `_`, `-` and `.` only; at most 100 characters";

/// A DAG id or task id: a plain name that is safe as a folder name of the logs.
pub(crate) fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    id.len() <= MAX_ID_LEN
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// One DAG file, loaded: the id it declares (else its file stem) and the DAG or its errors.
#[derive(Debug)]
pub(crate) struct DagFile {
    /// The file, relative to the project root.
    pub(crate) file: String,
    pub(crate) id: String,
    pub(crate) dag: Result<Dag, Vec<ConfigError>>,
}

impl Dag {
    /// Reads and validates one DAG file; `shown` is its path in messages.
    pub(crate) fn load(
        path: &Path,
        shown: &str,
        warehouses: &BTreeMap<String, Warehouse>,
    ) -> DagFile {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, shown, &stem, warehouses),
            Err(e) => DagFile {
                file: shown.to_string(),
                id: stem,
                dag: Err(vec![ConfigError {
                    location: shown.to_string(),
                    message: format!("cannot read the file: {e}"),
                }]),
            },
        }
    }

    /// Validates the text of a DAG file whose file name without `.toml` is `stem`.
    pub(crate) fn parse(
        text: &str,
        shown: &str,
        stem: &str,
        warehouses: &BTreeMap<String, Warehouse>,
    ) -> DagFile {
        let mut errs = FileErrors::new(shown, text);
        let Some(raw) = RawDag::read(text, &mut errs) else {
            return DagFile {
                file: shown.to_string(),
                id: stem.to_string(),
                dag: Err(errs.into_errors()),
            };
        };
        let id = raw
            .id
            .as_ref()
            .map_or_else(|| stem.to_string(), |s| s.get_ref().clone());
        let dag = Self::validate(raw, &id, warehouses, &mut errs);
        DagFile {
            file: shown.to_string(),
            id,
            dag: match dag {
                Some(dag) if errs.is_empty() => Ok(dag),
                _ => Err(errs.into_errors()),
            },
        }
    }

    fn validate(
        raw: RawDag,
        id: &str,
        warehouses: &BTreeMap<String, Warehouse>,
        errs: &mut FileErrors<'_>,
    ) -> Option<Self> {
        if !valid_id(id) {
            let message = format!("invalid DAG id `{id}`: {ID_RULE}");
            match &raw.id {
                Some(s) => errs.at(s, message),
                None => errs.in_file(format!(
                    "{message} (the id is the file name: rename the file or set `id`)"
                )),
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
        // Checked in UTC when the timezone is wrong, so that both mistakes are reported.
        let schedule = match &raw.schedule {
            None => {
                errs.in_file(
                    "missing key `schedule`; add one such as schedule = \"@daily\" or a 5-field cron such as schedule = \"15 3 * * 1-5\"",
                );
                None
            }
            Some(s) => match Schedule::parse(s.get_ref(), tz.unwrap_or(Tz::UTC)) {
                Ok(schedule) => Some(schedule),
                Err(e) => {
                    errs.at(s, format!("key `schedule`: {e}"));
                    None
                }
            },
        };
        let max_active_runs =
            raw.max_active_runs
                .as_ref()
                .and_then(|m| match u32::try_from(*m.get_ref()) {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        errs.at(
                            m,
                            format!(
                                "key `max_active_runs` must be a whole number from 1 to {}",
                                u32::MAX
                            ),
                        );
                        None
                    }
                });
        let batch_size = raw
            .batch_size
            .as_ref()
            .and_then(|b| match u32::try_from(*b.get_ref()) {
                Ok(n) if (1..=MAX_BATCH_SIZE).contains(&n) => Some(n),
                _ => {
                    errs.at(
                        b,
                        format!(
                            "key `batch_size` must be a whole number from 1 to {MAX_BATCH_SIZE}"
                        ),
                    );
                    None
                }
            });
        // A wrong default is reported once, here; the tasks then use the built-in default.
        let defaults = TaskDefaults {
            retries: raw
                .retries
                .as_ref()
                .and_then(|r| retries(r, errs))
                .unwrap_or(0),
            retry_delay: raw
                .retry_delay
                .as_ref()
                .and_then(|d| duration(d, "retry_delay", errs))
                .unwrap_or(Duration::from_secs(30)),
            timeout: raw.timeout.as_ref().and_then(|d| timeout(d, errs)),
            grace_period: raw
                .grace_period
                .as_ref()
                .and_then(|d| duration(d, "grace_period", errs))
                .unwrap_or(Duration::from_secs(10)),
        };
        if raw.tasks.is_empty() {
            errs.in_file("the DAG has no tasks; add at least one [[tasks]] table");
        }
        let tasks = load_tasks(&raw.tasks, &defaults, warehouses, errs);
        if let (Some(b), Some(n), Some(tasks)) = (&raw.batch_size, batch_size, &tasks)
            && n > 1
            && let Err(why) = super::dag::batchable(
                tasks,
                raw.depends_on_past.unwrap_or(false),
                !raw.upstream.is_empty(),
            )
        {
            errs.at(
                b,
                format!("key `batch_size` = {n} cannot be used here: {why}; remove `batch_size`"),
            );
        }
        let notify = notify(raw.notify.as_ref(), errs);
        Some(Self {
            id: id.to_string(),
            file: errs.file.to_string(),
            description: raw.description.map(Spanned::into_inner),
            schedule: schedule?,
            tz: tz?,
            max_active_runs,
            batch_size: batch_size.unwrap_or(1),
            depends_on_past: raw.depends_on_past.unwrap_or(false),
            notify,
            upstream: raw
                .upstream
                .iter()
                .map(|u| (u.get_ref().clone(), errs.location(u.span().start)))
                .collect(),
            tasks: tasks?,
        })
    }
}

struct TaskDefaults {
    retries: u32,
    retry_delay: Duration,
    timeout: Option<Duration>,
    grace_period: Duration,
}

/// Validates every task; the tasks in `depends_on` order when all of them are valid.
fn load_tasks(
    raw: &[RawTask],
    defaults: &TaskDefaults,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<Vec<Task>> {
    let mut seen: HashSet<&str> = HashSet::new();
    for t in raw {
        let Some(id) = &t.id else {
            errs.at_offset(
                t.at,
                "a [[tasks]] table needs an `id`; add one such as id = \"extract\"",
            );
            continue;
        };
        if !valid_id(id.get_ref()) {
            errs.at(id, format!("invalid task id `{}`: {ID_RULE}", id.get_ref()));
        }
        if !seen.insert(id.get_ref()) {
            errs.at(
                id,
                format!(
                    "task id `{}` is used twice; task ids must be unique",
                    id.get_ref()
                ),
            );
        }
    }
    let known: Vec<&str> = raw
        .iter()
        .filter_map(|t| t.id.as_ref().map(|i| i.get_ref().as_str()))
        .collect();
    let mut tasks = Vec::new();
    for t in raw {
        let name = t.id.as_ref().map_or("", |i| i.get_ref().as_str());
        for dep in &t.depends_on {
            if !seen.contains(dep.get_ref().as_str()) {
                let hint = match closest(dep.get_ref(), &known) {
                    Some(near) => format!("did you mean `{near}`? "),
                    None => String::new(),
                };
                errs.at(
                    dep,
                    format!(
                        "task `{name}` depends on unknown task `{}`; {hint}known tasks: {}",
                        dep.get_ref(),
                        known.join(", ")
                    ),
                );
            }
        }
        tasks.push(load_task(t, name, defaults, warehouses, errs));
    }
    let ids: Vec<&str> = raw
        .iter()
        .map(|t| t.id.as_ref().map_or("", |i| i.get_ref().as_str()))
        .collect();
    let deps: Vec<Vec<&str>> = raw
        .iter()
        .map(|t| t.depends_on.iter().map(|d| d.get_ref().as_str()).collect())
        .collect();
    match topo_order(&ids, &deps) {
        Ok(order) => {
            let mut tasks: Vec<Option<Task>> = tasks;
            order.into_iter().map(|i| tasks[i].take()).collect()
        }
        Err(cycle) => {
            let message = format!(
                "the tasks' depends_on form a cycle: {}; remove one of these edges",
                cycle.join(" -> ")
            );
            match raw
                .iter()
                .find_map(|t| t.id.as_ref().filter(|i| Some(i.get_ref()) == cycle.first()))
            {
                Some(span) => errs.at(span, message),
                None => errs.in_file(message),
            }
            None
        }
    }
}

/// One task, every key checked; `None` when any is wrong.
/// A merge needs its business key, and `max_changed` a merge.
fn merge_needs(
    t: &RawTask,
    id: &str,
    kind: &Option<TaskKind>,
    gate: Option<&Gate>,
    errs: &mut FileErrors<'_>,
) {
    // As written, so that a mistake in a key beside it does not hide this one.
    let merge = t.write.as_ref().is_some_and(|w| w.get_ref() == "merge");
    let keyed = gate.is_some_and(|g| !g.unique_key.is_empty());
    let sql = matches!(kind, Some(TaskKind::Sql(_)));
    if let (true, false, true, Some(w)) = (merge, keyed, sql, &t.write) {
        errs.at(
            w,
            format!(
                "task `{id}`: `write = \"merge\"` matches the output's rows to the target's by a business key; give it as `unique_key = [\"customer_id\"]` in [tasks.gate]"
            ),
        );
    }
    let max_changed = t
        .gate
        .as_ref()
        .and_then(|g| g.get_ref().max_changed.as_ref());
    if let (false, Some(m), true) = (merge, max_changed, t.sql.is_some()) {
        errs.at(
            m,
            format!(
                "task `{id}`: `max_changed` bounds what a merge changes; it needs `write = \"merge\"` (a replace rewrites the whole partition), or remove it"
            ),
        );
    }
}

fn load_task(
    t: &RawTask,
    id: &str,
    defaults: &TaskDefaults,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<Task> {
    let mut kind = task_kind(t, id, warehouses, errs);
    let is_sql = t.sql.is_some() && t.command.is_none();
    if let (false, Some(k)) = (is_sql, &t.keep_versions) {
        errs.at(
            k,
            format!(
                "task `{id}`: `keep_versions` keeps the partitions a SQL publish replaces; a command task has none, remove it"
            ),
        );
    }
    let gate = t.gate.as_ref().map(|g| load_gate(id, g, is_sql, errs));
    merge_needs(t, id, &kind, gate.as_ref().and_then(Option::as_ref), errs);
    if let (Some(TaskKind::Sql(sql)), Some(Some(g))) = (&mut kind, &gate)
        && let WritePattern::Merge { key, .. } = &mut sql.write
    {
        key.clone_from(&g.unique_key);
    }
    if let Some(TaskKind::Sql(sql)) = &kind {
        let dialect = if sql.warehouse.is_postgres() {
            crate::query::Dialect::Postgres
        } else {
            crate::query::Dialect::Sqlite
        };
        super::task::read_only_queries(t, id, dialect, errs);
    }
    let publish = match &t.publish {
        None => None,
        Some(p) if is_sql => {
            errs.at(
                p,
                "key `publish`: a SQL task publishes its audited rows itself; remove `publish`",
            );
            Some(None)
        }
        Some(p) if t.gate.is_none() => {
            // It would never run: a command task's `publish` runs once its gate passed.
            errs.at(
                p,
                "key `publish`: it runs once the task's gate passed, and this task has no `[tasks.gate]`; add one (the command then reports its rows: {\"rows\": N} in $BACKFILL_RESULT), or do the publishing in `command`",
            );
            Some(None)
        }
        Some(p) => Some(command_spec(p, "publish", errs)),
    };
    let cleanup = match &t.cleanup {
        None => None,
        Some(c) if is_sql => {
            errs.at(
                c,
                "key `cleanup`: a SQL task removes its own audit files; remove `cleanup`",
            );
            Some(None)
        }
        Some(c) => Some(command_spec(c, "cleanup", errs)),
    };
    let ready = t.ready.as_ref().map(|r| load_ready(r, id, is_sql, errs));
    // Each is `None` when the key is wrong (and reported).
    let retries = match &t.retries {
        None => Some(defaults.retries),
        Some(r) => retries(r, errs),
    };
    let retry_delay = match &t.retry_delay {
        None => Some(defaults.retry_delay),
        Some(d) => duration(d, "retry_delay", errs),
    };
    let timeout = match &t.timeout {
        None => Some(defaults.timeout),
        Some(d) => timeout(d, errs).map(Some),
    };
    let grace_period = match &t.grace_period {
        None => Some(defaults.grace_period),
        Some(d) => duration(d, "grace_period", errs),
    };
    let locations = TaskLocations {
        id: errs.location(t.id.as_ref()?.span().start),
        command: t
            .command
            .as_ref()
            .filter(|_| !is_sql)
            .map(|c| errs.location(c.span().start)),
        publish: t.publish.as_ref().map(|p| errs.location(p.span().start)),
        cleanup: t.cleanup.as_ref().map(|c| errs.location(c.span().start)),
        source_count: t
            .gate
            .as_ref()
            .and_then(|g| g.get_ref().source_count.as_ref())
            .map(|c| errs.location(c.span().start)),
        source_fingerprint: t
            .gate
            .as_ref()
            .and_then(|g| g.get_ref().source_fingerprint.as_ref())
            .map(|c| errs.location(c.span().start)),
        target: t
            .target
            .as_ref()
            .filter(|_| is_sql)
            .map(|c| errs.location(c.span().start)),
        sql: t
            .sql
            .as_ref()
            .filter(|_| is_sql)
            .map(|s| StringAt::new(errs, s.span())),
        pool: t.pool.as_ref().map(|p| errs.location(p.span().start)),
        ready: t.ready.as_ref().map(|r| {
            let r = r.get_ref();
            let at = r.sql.as_ref().map(Spanned::span);
            errs.location(
                at.or_else(|| r.command.as_ref().map(Spanned::span))
                    .map_or(0, |s| s.start),
            )
        }),
        rules: t
            .gate
            .as_ref()
            .map(|g| super::task::rule_spans(g.get_ref()))
            .unwrap_or_default()
            .into_iter()
            .map(|span| StringAt::new(errs, span))
            .collect(),
    };
    Some(Task {
        id: id.to_string(),
        depends_on: t.depends_on.iter().map(|d| d.get_ref().clone()).collect(),
        kind: kind?,
        gate: gate.map_or(Some(None), |g| g.map(Some))?,
        publish: publish.map_or(Some(None), |p| p.map(Some))?,
        cleanup: cleanup.map_or(Some(None), |c| c.map(Some))?,
        retries: retries?,
        retry_delay: retry_delay?,
        timeout: timeout?,
        grace_period: grace_period?,
        pool: t.pool.as_ref().map(|p| p.get_ref().clone()),
        ready: ready.map_or(Some(None), |r| r.map(Some))?,
        locations,
    })
}

/// How often readiness is asked again when `every` is not given: a minute, or the whole
/// `wait` when shorter.
const READY_EVERY: Duration = Duration::from_secs(60);

/// The least `every`.
const LEAST_EVERY: Duration = Duration::from_millis(100);

/// `[tasks.ready]`, every key checked; `None` when one is wrong (reported).
fn load_ready(
    r: &Spanned<RawReady>,
    id: &str,
    is_sql: bool,
    errs: &mut FileErrors<'_>,
) -> Option<Ready> {
    let raw = r.get_ref();
    let check = match (&raw.sql, &raw.command) {
        (Some(_), Some(c)) => {
            errs.at(
                c,
                format!(
                    "task `{id}`: [tasks.ready] asks with `sql` or with `command`, not both; remove one"
                ),
            );
            None
        }
        (None, None) => {
            errs.at(
                r,
                format!(
                    "task `{id}`: [tasks.ready] needs `sql` (one read-only query of the task's warehouse, true when ready) or `command` (exit 0 when ready, 1 when not)"
                ),
            );
            None
        }
        (Some(sql), None) if !is_sql => {
            errs.at(
                sql,
                format!(
                    "task `{id}`: a command task has no warehouse to run `sql` on; ask with `command = [...]` (exit 0 when ready, 1 when not)"
                ),
            );
            None
        }
        (Some(sql), None) if sql.get_ref().trim().is_empty() => {
            errs.at(
                sql,
                format!("task `{id}`: key `sql` of [tasks.ready] is empty; write a query such as SELECT count(*) > 0 FROM raw.loads WHERE day = :ds"),
            );
            None
        }
        (Some(sql), None) => Some(ReadyCheck::Sql(sql.get_ref().clone())),
        (None, Some(c)) => command_spec(c, "ready.command", errs).map(ReadyCheck::Command),
    };
    let wait = match &raw.wait {
        None => Some(Duration::ZERO),
        Some(w) => duration(w, "wait", errs),
    };
    let every = match &raw.every {
        None => wait.map(|w| {
            if w.is_zero() {
                READY_EVERY
            } else {
                w.min(READY_EVERY)
            }
        }),
        Some(e) => match duration(e, "every", errs) {
            Some(d) if d < LEAST_EVERY => {
                errs.at(
                    e,
                    format!(
                        "task `{id}`: key `every` must be at least 100ms (a source is not asked hundreds of times a second), such as \"5m\""
                    ),
                );
                None
            }
            d => d,
        },
    };
    if let (Some(w), Some(e), Some(at)) = (wait, every, &raw.every)
        && !w.is_zero()
        && w < e
    {
        errs.at(
            at,
            format!(
                "task `{id}`: `every = \"{}\"` is longer than `wait = \"{}\"`, so readiness would be asked once; ask more often than the wait, or wait longer",
                at.get_ref(),
                raw.wait.as_ref().map_or("", |w| w.get_ref())
            ),
        );
        return None;
    }
    Some(Ready {
        check: check?,
        wait: wait?,
        every: every?,
    })
}

/// Orders tasks so that each comes after its dependencies, keeping file order where free.
/// Unknown dependencies are ignored (they are reported elsewhere). On a cycle, returns the task
/// ids along one cycle, the first repeated at the end.
fn topo_order(ids: &[&str], deps: &[Vec<&str>]) -> Result<Vec<usize>, Vec<String>> {
    let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut done = vec![false; ids.len()];
    let mut order = Vec::with_capacity(ids.len());
    while order.len() < ids.len() {
        let ready = (0..ids.len()).find(|&i| {
            !done[i]
                && deps[i]
                    .iter()
                    .all(|d| index.get(d).is_none_or(|&j| done[j]))
        });
        match ready {
            Some(i) => {
                done[i] = true;
                order.push(i);
            }
            None => {
                // Every remaining task waits on another remaining one: walk until a repeat.
                let mut path: Vec<usize> = Vec::new();
                let mut at = (0..ids.len()).find(|&i| !done[i]).unwrap_or(0);
                while !path.contains(&at) {
                    path.push(at);
                    at = deps[at]
                        .iter()
                        .filter_map(|d| index.get(d).copied())
                        .find(|&j| !done[j])
                        .unwrap_or(at);
                }
                let start = path.iter().position(|&p| p == at).unwrap_or(0);
                let mut cycle: Vec<String> =
                    path[start..].iter().map(|&i| ids[i].to_string()).collect();
                cycle.push(ids[at].to_string());
                return Err(cycle);
            }
        }
    }
    Ok(order)
}

fn retries(v: &Spanned<i128>, errs: &mut FileErrors<'_>) -> Option<u32> {
    match u32::try_from(*v.get_ref()) {
        Ok(n) if n <= MAX_RETRIES => Some(n),
        _ => {
            errs.at(
                v,
                format!("key `retries` must be a whole number from 0 to {MAX_RETRIES}"),
            );
            None
        }
    }
}

fn duration(v: &Spanned<String>, key: &str, errs: &mut FileErrors<'_>) -> Option<Duration> {
    match parse_duration(v.get_ref()) {
        Ok(d) => Some(d),
        Err(e) => {
            errs.at(v, format!("key `{key}`: {e}"));
            None
        }
    }
}

/// A try's timeout: a duration longer than zero.
fn timeout(v: &Spanned<String>, errs: &mut FileErrors<'_>) -> Option<Duration> {
    let d = duration(v, "timeout", errs)?;
    if d.is_zero() {
        errs.at(
            v,
            "key `timeout` must be longer than 0s; leave it out for no timeout",
        );
        return None;
    }
    Some(d)
}

/// Why [`expand_env`] could not put the variables in.
#[derive(Debug)]
pub(crate) enum EnvError {
    /// A variable it names is not set (the message names it).
    Unset(String),
    /// The text is not written as `${NAME}` asks.
    Malformed(String),
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unset(m) | Self::Malformed(m) => f.write_str(m),
        }
    }
}

/// Puts the environment variables that `text` names as `${NAME}` in, so that secrets stay out
/// of files; `$$` is one `$`. A variable that is not set is an error that names it.
pub(crate) fn expand_env(text: &str) -> Result<String, EnvError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix("${") {
            let Some(end) = body.find('}') else {
                return Err(EnvError::Malformed(
                    "`${` without its closing `}`; write ${NAME}".into(),
                ));
            };
            let name = &body[..end];
            let plain = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !plain {
                return Err(EnvError::Malformed(format!(
                    "`${{{name}}}` is not an environment variable's name (letters, digits and `_`)"
                )));
            }
            match std::env::var(name) {
                Ok(value) => out.push_str(&value),
                Err(_) => {
                    return Err(EnvError::Unset(format!(
                        "environment variable `{name}` is not set; export it, or write the value here"
                    )));
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}
