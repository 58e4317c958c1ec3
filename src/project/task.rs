//! Loading what a task does: a command (argv or shell) or SQL (its warehouse, target and
//! statements), and its `[gate]`, the audit its output passes before it is published; every
//! error with its line.

use std::collections::BTreeMap;

use toml::Spanned;

use super::dag::*;
use super::diagnostics::FileErrors;
use super::raw::{RawCheck, RawCommand, RawGate, RawHistory, RawLiteral, RawRange, RawTask};
use super::{Warehouse, sql_identifier};
use crate::task::template;

/// A command (array or shell line) whose templates use only known names.
pub(super) fn command_spec(
    c: &Spanned<RawCommand>,
    key: &str,
    errs: &mut FileErrors<'_>,
) -> Option<CommandSpec> {
    let mut ok = true;
    // Each mistake at its place in the string as written (`span` is the string's token).
    let mut check = |errs: &mut FileErrors<'_>, span: std::ops::Range<usize>, text: &str| {
        if let Err(found) = template::check(text) {
            let token = errs.text.get(span.clone()).unwrap_or_default();
            for e in found {
                let offset = span.start + super::diagnostics::token_offset(token, e.offset);
                errs.at_offset(offset, format!("key `{key}`: {}", e.message));
            }
            ok = false;
        }
    };
    let spec = match c.get_ref() {
        RawCommand::Argv(v) => {
            match v.first() {
                None => {
                    errs.at(
                        c,
                        format!(
                            "key `{key}` is an empty array; name a program, as in [\"prog\", \"arg\"]"
                        ),
                    );
                    return None;
                }
                Some(program) if program.get_ref().trim().is_empty() => {
                    errs.at(
                        program,
                        format!("key `{key}`: the program (the first element) is empty"),
                    );
                    return None;
                }
                Some(_) => {}
            }
            for arg in v {
                check(errs, arg.span(), arg.get_ref());
            }
            CommandSpec::Argv(v.iter().map(|a| a.get_ref().clone()).collect())
        }
        RawCommand::Shell(s) if s.trim().is_empty() => {
            errs.at(
                c,
                format!("key `{key}` is empty; write the command line to run"),
            );
            return None;
        }
        RawCommand::Shell(s) => {
            check(errs, c.span(), s);
            CommandSpec::Shell(s.clone())
        }
    };
    ok.then_some(spec)
}

/// A command task or a SQL task, never both.
pub(super) fn task_kind(
    t: &RawTask,
    id: &str,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<TaskKind> {
    match (&t.command, &t.sql) {
        (Some(c), None) => command_task(t, id, c, errs),
        (None, Some(sql)) => sql_task(t, id, sql, warehouses, errs),
        (Some(c), Some(_)) => {
            errs.at(
                c,
                format!("task `{id}` has both `command` and `sql`; a task is one or the other"),
            );
            None
        }
        (None, None) => {
            let message = format!(
                "task `{id}` has neither `command` nor `sql`; give it `command = [\"prog\", \"arg\"]`, `command = \"shell line\"`, or a SQL task's `warehouse`, `target`, `partition_column` and `sql`"
            );
            match &t.id {
                Some(i) => errs.at(i, message),
                None => errs.at_offset(t.at, message),
            }
            None
        }
    }
}

/// A command task: its `command`, and none of the keys of a SQL task.
fn command_task(
    t: &RawTask,
    id: &str,
    c: &Spanned<RawCommand>,
    errs: &mut FileErrors<'_>,
) -> Option<TaskKind> {
    for (key, value) in [
        ("warehouse", &t.warehouse),
        ("target", &t.target),
        ("partition_column", &t.partition_column),
        ("write", &t.write),
        ("on_missing", &t.on_missing),
    ] {
        if let Some(v) = value {
            errs.at(
                v,
                format!(
                    "task `{id}`: key `{key}` belongs to SQL tasks; a command task cannot have it"
                ),
            );
        }
    }
    let spec = command_spec(c, "command", errs)?;
    let sql_keys = t.warehouse.is_some() || t.target.is_some();
    let sql_keys = sql_keys || t.write.is_some() || t.on_missing.is_some();
    (!sql_keys && t.partition_column.is_none()).then_some(TaskKind::Command(spec))
}

/// A SQL task: its query `sql`, its warehouse (declared in `backfill.toml`), target and
/// partition column, how it writes, and how many versions it keeps.
fn sql_task(
    t: &RawTask,
    id: &str,
    sql: &Spanned<String>,
    warehouses: &BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<TaskKind> {
    let keys = SqlKeys::of(t, errs);
    if !keys.missing.is_empty() {
        errs.at(
            sql,
            format!(
                "SQL task `{id}` needs {}; see docs/sql-tasks.md",
                keys.missing
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if sql.get_ref().trim().is_empty() {
        errs.at(
            sql,
            "key `sql` is empty; write the SELECT whose rows fill the interval's partition",
        );
    }
    let warehouse = match (&t.warehouse, keys.warehouse) {
        (Some(w), Some(name)) => declared_warehouse(w, &name, warehouses, errs),
        _ => None,
    };
    if sql.get_ref().trim().is_empty() {
        return None;
    }
    let keep = match &t.keep_versions {
        None => None,
        Some(k) => Some(keep_versions(k, errs)?),
    };
    let write = write_pattern(t, errs)?;
    let warehouse = warehouse?.clone();
    let (target, at) = (keys.target?, t.target.as_ref()?);
    if !warehouse.is_postgres() && !sql_identifier(&target) {
        errs.at(
            at,
            format!(
                "key `target`: `{target}` names a schema; a SQLite warehouse's tables are plain names such as `{}`",
                target.rsplit('.').next().unwrap_or_default()
            ),
        );
        return None;
    }
    Some(TaskKind::Sql(SqlTask {
        keep_versions: keep.unwrap_or(warehouse.keep_versions),
        warehouse,
        target,
        partition_column: keys.partition_column?,
        sql: sql.get_ref().clone(),
        write,
    }))
}

/// A SQL task's `warehouse`, `target` and `partition_column`, each when given and well
/// written, and the keys it lacks.
struct SqlKeys {
    warehouse: Option<String>,
    target: Option<String>,
    partition_column: Option<String>,
    missing: Vec<&'static str>,
}

impl SqlKeys {
    /// The keys of task `t`: a partition column is a plain SQL name; a target is one too, or
    /// schema.table (checked again once the warehouse is known: only PostgreSQL has schemas).
    fn of(t: &RawTask, errs: &mut FileErrors<'_>) -> Self {
        let mut missing = Vec::new();
        let mut given = |v: &Option<Spanned<String>>, key: &'static str| {
            if v.is_none() {
                missing.push(key);
            }
            v.as_ref().map(|v| v.get_ref().clone())
        };
        let warehouse = given(&t.warehouse, "warehouse");
        let target = given(&t.target, "target");
        let partition_column = given(&t.partition_column, "partition_column").filter(|name| {
            if sql_identifier(name) {
                return true;
            }
            if let Some(at) = &t.partition_column {
                errs.at(
                    at,
                    format!(
                        "key `partition_column`: `{name}` is not a plain SQL name (letters, digits and `_`, starting with a letter or `_`)"
                    ),
                );
            }
            false
        });
        let target = target.filter(|name| {
            let qualified = name
                .split_once('.')
                .is_some_and(|(s, n)| sql_identifier(s) && sql_identifier(n));
            if !sql_identifier(name) && !qualified {
                if let Some(at) = &t.target {
                    errs.at(
                        at,
                        format!(
                            "key `target`: `{name}` is not a plain SQL name (letters, digits and `_`, starting with a letter or `_`), or schema.table on a PostgreSQL warehouse"
                        ),
                    );
                }
                return false;
            }
            true
        });
        Self {
            warehouse,
            target,
            partition_column,
            missing,
        }
    }
}

/// The warehouse `name` (written at `w`) that `backfill.toml` declares.
fn declared_warehouse<'w>(
    w: &Spanned<String>,
    name: &str,
    warehouses: &'w BTreeMap<String, Warehouse>,
    errs: &mut FileErrors<'_>,
) -> Option<&'w Warehouse> {
    let found = warehouses.get(name);
    if found.is_none() {
        let known: Vec<&str> = warehouses.keys().map(String::as_str).collect();
        errs.at(
            w,
            format!(
                "unknown warehouse `{name}`; declare it in backfill.toml as [warehouse.{name}] (known: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        );
    }
    found
}

/// The task's `write` and `on_missing`.
fn write_pattern(t: &RawTask, errs: &mut FileErrors<'_>) -> Option<WritePattern> {
    let merge = match &t.write {
        None => false,
        Some(w) => match w.get_ref().as_str() {
            "replace" => false,
            "merge" => true,
            other => {
                errs.at(
                    w,
                    format!(
                        "key `write` is \"replace\" (delete the interval's rows, insert the output: the default) or \"merge\" (by the gate's `unique_key`: insert, update and delete only the rows that differ), not `{other}`; see docs/sql-tasks.md#write-patterns"
                    ),
                );
                return None;
            }
        },
    };
    let keep_missing = match &t.on_missing {
        None => false,
        Some(m) if !merge => {
            errs.at(
                m,
                "key `on_missing` says what a merge does with the partition's keys the output no longer has; it needs `write = \"merge\"`, or remove it",
            );
            return None;
        }
        Some(m) => match m.get_ref().as_str() {
            "delete" => false,
            "keep" => true,
            other => {
                errs.at(
                    m,
                    format!(
                        "key `on_missing` is \"delete\" (the partition holds exactly the output's keys: the default) or \"keep\" (the output is a change set; keys it lacks stay), not `{other}`"
                    ),
                );
                return None;
            }
        },
    };
    Some(if merge {
        // The key is the gate's, set once the gate is loaded.
        WritePattern::Merge {
            key: Vec::new(),
            keep_missing,
        }
    } else {
        WritePattern::Replace
    })
}

pub(super) fn load_gate(
    task: &str,
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
                "task `{task}`: `unique_key` needs a SQL task (its rows are audited in a table); remove it or make the task a SQL task"
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
    let unique_key_table = match raw.unique_key_scope.as_ref() {
        None => false,
        Some(s) => match s.get_ref().as_str() {
            "partition" => false,
            "table" if raw.unique_key.is_empty() => {
                errs.at(
                    s,
                    "key `unique_key_scope` needs `unique_key`: the columns whose values must be unique",
                );
                ok = false;
                false
            }
            "table" => true,
            other => {
                errs.at(
                    s,
                    format!(
                        "key `unique_key_scope` is \"partition\" (keys unique within the interval's output, the default) or \"table\" (also not in any other partition of the target), not `{other}`"
                    ),
                );
                ok = false;
                false
            }
        },
    };
    let max_changed = match &raw.max_changed {
        None => None,
        Some(v) if (0.0..=1.0).contains(v.get_ref()) => Some(*v.get_ref()),
        Some(v) => {
            errs.at(
                v,
                "key `max_changed` must be a fraction from 0 to 1, such as 0.2 for at most 20% of the partition's rows",
            );
            ok = false;
            None
        }
    };
    let tolerance = match &raw.tolerance {
        None => 0.0,
        Some(v) if v.get_ref().is_finite() && *v.get_ref() >= 0.0 => *v.get_ref(),
        Some(v) => {
            errs.at(
                v,
                "key `tolerance` must be a fraction of at least 0, such as 0.02 for 2%",
            );
            ok = false;
            0.0
        }
    };
    let source_count = source_query(
        raw.source_count.as_ref(),
        "source_count",
        "a query that counts the source rows",
        is_sql,
        &mut ok,
        errs,
    );
    let source_fingerprint = source_query(
        raw.source_fingerprint.as_ref(),
        "source_fingerprint",
        "a query that returns one value that changes when the source does",
        is_sql,
        &mut ok,
        errs,
    );
    let rules = load_rules(task, g, is_sql, &mut ok, errs);
    let history = raw
        .history
        .as_ref()
        .and_then(|h| load_history(h, &mut ok, errs));
    ok.then(|| Gate {
        unique_key: raw.unique_key.iter().map(|k| k.get_ref().clone()).collect(),
        unique_key_table,
        max_changed,
        source_count,
        source_fingerprint,
        tolerance,
        allow_empty: raw.allow_empty.unwrap_or(false),
        rules,
        history,
    })
}

/// The most partitions `history` may look back over.
pub(crate) const MAX_HISTORY: u32 = 1000;

/// `history = { partitions = N, tolerance = F }`: both given, N from 1 to [`MAX_HISTORY`].
fn load_history(h: &RawHistory, ok: &mut bool, errs: &mut FileErrors<'_>) -> Option<History> {
    const EXAMPLE: &str = "history = { partitions = 7, tolerance = 0.5 }";
    let partitions = match &h.partitions {
        None => {
            errs.at_offset(
                h.at.start,
                format!("key `history` needs `partitions`, how many published partitions to compare with: {EXAMPLE}"),
            );
            None
        }
        Some(n) => match u32::try_from(*n.get_ref()) {
            Ok(n) if (1..=MAX_HISTORY).contains(&n) => Some(n),
            _ => {
                errs.at(
                    n,
                    format!("key `partitions` of `history` must be a whole number from 1 to {MAX_HISTORY}"),
                );
                None
            }
        },
    };
    let tolerance = match &h.tolerance {
        None => {
            errs.at_offset(
                h.at.start,
                format!("key `history` needs `tolerance`, the fraction the row count may differ from the median by: {EXAMPLE}"),
            );
            None
        }
        Some(t) if t.get_ref().is_finite() && *t.get_ref() >= 0.0 => Some(*t.get_ref()),
        Some(t) => {
            errs.at(
                t,
                "key `tolerance` of `history` must be a fraction of at least 0, such as 0.5 for 50%",
            );
            None
        }
    };
    match (partitions, tolerance) {
        (Some(partitions), Some(tolerance)) => Some(History {
            partitions,
            tolerance,
        }),
        _ => {
            *ok = false;
            None
        }
    }
}

/// A value of a rule as the model holds it.
fn literal(v: &Spanned<RawLiteral>, ok: &mut bool, errs: &mut FileErrors<'_>) -> Option<Literal> {
    match v.get_ref() {
        RawLiteral::Int(i) => match i64::try_from(*i) {
            Ok(i) => Some(Literal::Int(i)),
            Err(_) => {
                errs.at(v, "the number is too large for a 64-bit integer");
                *ok = false;
                None
            }
        },
        RawLiteral::Float(f) if f.is_finite() => Some(Literal::Float(*f)),
        RawLiteral::Float(_) => {
            errs.at(v, "a bound must be a finite number");
            *ok = false;
            None
        }
        RawLiteral::Text(t) => Some(Literal::Text(t.clone())),
    }
}

/// The rules on the output's values, in the order of [`Gate::rules`] (and of
/// [`rule_spans`]): `not_null`, `accepted_values` and `range` of a SQL task, then the checks.
fn load_rules(
    task: &str,
    g: &Spanned<RawGate>,
    is_sql: bool,
    ok: &mut bool,
    errs: &mut FileErrors<'_>,
) -> Vec<Rule> {
    let raw = g.get_ref();
    let mut load = RuleLoader {
        task,
        is_sql,
        ok,
        errs,
    };
    let mut rules = Vec::new();
    for c in &raw.not_null {
        if let Some(c) = load.column("not_null", c) {
            rules.push(Rule {
                name: "not_null".into(),
                kind: RuleKind::NotNull(c),
                severity: Severity::Error,
            });
        }
    }
    for (c, values) in &raw.accepted_values {
        rules.extend(load.accepted_values(c, values));
    }
    for r in &raw.range {
        rules.extend(load.range(r));
    }
    let mut names = std::collections::HashSet::new();
    for (i, c) in raw.checks.iter().enumerate() {
        rules.extend(load.check(i, c, &mut names));
    }
    rules
}

/// Loads the rules of task `task`'s gate, one at a time: a rule with an error is left out, and
/// clears `ok`.
struct RuleLoader<'a, 'e> {
    task: &'a str,
    is_sql: bool,
    ok: &'a mut bool,
    errs: &'a mut FileErrors<'e>,
}

impl RuleLoader<'_, '_> {
    /// The column `c` of a built-in rule `key`: a plain SQL name, in a SQL task.
    fn column(&mut self, key: &str, c: &Spanned<String>) -> Option<String> {
        if !self.is_sql {
            self.errs.at(
                c,
                format!(
                    "task `{}`: `{key}` needs a SQL task (its rows are audited in a table); for a command task, write a [[tasks.gate.checks]] with a `command` that prints the number of violations",
                    self.task
                ),
            );
            *self.ok = false;
            return None;
        }
        if !sql_identifier(c.get_ref()) {
            self.errs.at(
                c,
                format!(
                    "key `{key}`: `{}` is not a plain SQL column name",
                    c.get_ref()
                ),
            );
            *self.ok = false;
            return None;
        }
        Some(c.get_ref().clone())
    }

    /// `accepted_values` of column `c`: at least one value.
    fn accepted_values(
        &mut self,
        c: &Spanned<String>,
        values: &[Spanned<RawLiteral>],
    ) -> Option<Rule> {
        let col = self.column("accepted_values", c)?;
        if values.is_empty() {
            self.errs.at(
                c,
                format!("key `accepted_values`: `{col}` lists no value; write the values it may hold, such as {col} = [\"eu\", \"us\"]"),
            );
            *self.ok = false;
            return None;
        }
        let values: Vec<Literal> = values
            .iter()
            .filter_map(|v| literal(v, self.ok, self.errs))
            .collect();
        Some(Rule {
            name: "accepted_values".into(),
            kind: RuleKind::AcceptedValues(col, values),
            severity: Severity::Error,
        })
    }

    /// A `range`: a bound at least, numbers in order, and `allow_non_finite` only with numbers.
    fn range(&mut self, r: &RawRange) -> Option<Rule> {
        let col = self.column("range", &r.column)?;
        let min = r.min.as_ref().and_then(|v| literal(v, self.ok, self.errs));
        let max = r.max.as_ref().and_then(|v| literal(v, self.ok, self.errs));
        if r.min.is_none() && r.max.is_none() {
            self.errs.at(
                &r.column,
                format!("key `range`: `{col}` has neither `min` nor `max`; write at least one, such as {col} = {{ min = 0 }}"),
            );
            *self.ok = false;
            return None;
        }
        let number = |l: &Option<Literal>| match l {
            Some(Literal::Int(i)) => Some(*i as f64),
            Some(Literal::Float(f)) => Some(*f),
            _ => None,
        };
        // Numbers only: strings compare as the warehouse's collation says, not as bytes.
        let backwards = matches!((number(&min), number(&max)), (Some(a), Some(b)) if a > b);
        if backwards {
            self.errs.at(
                &r.column,
                format!("key `range`: `{col}` has `min` above `max`; no value could pass"),
            );
            *self.ok = false;
            return None;
        }
        let text_bound = [&min, &max]
            .into_iter()
            .any(|l| matches!(l, Some(Literal::Text(_))));
        if r.allow_non_finite == Some(true) && text_bound {
            self.errs.at(
                &r.column,
                format!("key `range`: `{col}` has a text bound, so `allow_non_finite` (NaN and infinities in a numeric range) does not apply; remove it"),
            );
            *self.ok = false;
            return None;
        }
        Some(Rule {
            name: "range".into(),
            kind: RuleKind::Range {
                column: col,
                min,
                max,
                allow_non_finite: r.allow_non_finite.unwrap_or(false),
            },
            severity: Severity::Error,
        })
    }

    /// Check `i` (from 0) of the task, `c`: a name of its own among `names`, a severity, and
    /// what it runs (a query in a SQL task, a command in a command task).
    fn check(
        &mut self,
        i: usize,
        c: &RawCheck,
        names: &mut std::collections::HashSet<String>,
    ) -> Option<Rule> {
        let which = format!("check {} of task `{}`", i + 1, self.task);
        let name = match &c.name {
            Some(n) if !n.get_ref().trim().is_empty() => {
                if !names.insert(n.get_ref().clone()) {
                    self.errs.at(
                        n,
                        format!("{which}: another check of the task is named `{}`; give each its own name", n.get_ref()),
                    );
                    *self.ok = false;
                }
                n.get_ref().clone()
            }
            _ => {
                self.errs.at_offset(
                    c.at.start,
                    format!("{which} has no `name`; name it as a rejection will, such as name = \"no negative revenue\""),
                );
                *self.ok = false;
                return None;
            }
        };
        let severity = match c.severity.as_ref().map(|s| (s, s.get_ref().as_str())) {
            None | Some((_, "error")) => Severity::Error,
            Some((_, "warn")) => Severity::Warn,
            Some((s, other)) => {
                self.errs.at(
                    s,
                    format!("key `severity` is \"error\" (reject the try, the default) or \"warn\" (record and publish), not `{other}`"),
                );
                *self.ok = false;
                return None;
            }
        };
        let kind = self.check_kind(&which, c)?;
        Some(Rule {
            name,
            kind,
            severity,
        })
    }

    /// What check `c` (`which`, for messages) runs: `sql` in a SQL task, `command` in a
    /// command task.
    fn check_kind(&mut self, which: &str, c: &RawCheck) -> Option<RuleKind> {
        let kind = match (&c.sql, &c.command, self.is_sql) {
            (Some(sql), None, true) if !sql.get_ref().trim().is_empty() => {
                Some(RuleKind::Sql(sql.get_ref().clone()))
            }
            (Some(sql), None, true) => {
                self.errs.at(sql, format!("{which}: `sql` is empty; write a query whose rows are the violations, such as SELECT * FROM output WHERE amount < 0"));
                None
            }
            (None, Some(cmd), false) => {
                command_spec(cmd, "command", self.errs).map(RuleKind::Command)
            }
            (Some(sql), _, false) => {
                self.errs.at(sql, format!("{which}: a command task's check is a `command` that prints the number of violations, not `sql`"));
                None
            }
            (_, Some(cmd), true) => {
                self.errs.at(cmd, format!("{which}: a SQL task's check is a `sql` query over the table `output` whose rows are the violations, not a `command`"));
                None
            }
            (None, None, sql) => {
                self.errs.at_offset(
                    c.at.start,
                    if sql {
                        format!("{which} has no `sql`; write a query over the table `output` whose rows are the violations")
                    } else {
                        format!("{which} has no `command`; write one that prints the number of violations")
                    },
                );
                None
            }
        };
        if kind.is_none() {
            *self.ok = false;
        }
        kind
    }
}

/// Where each rule of [`load_rules`] is written, in its order: a built-in rule's column, a
/// check's `sql` or `command` (or its table). Only meaningful when the gate loaded.
pub(super) fn rule_spans(raw: &RawGate) -> Vec<std::ops::Range<usize>> {
    let mut spans: Vec<_> = raw.not_null.iter().map(Spanned::span).collect();
    spans.extend(raw.accepted_values.iter().map(|(c, _)| c.span()));
    spans.extend(raw.range.iter().map(|r| r.column.span()));
    spans.extend(raw.checks.iter().map(|c| {
        c.sql
            .as_ref()
            .map(Spanned::span)
            .or_else(|| c.command.as_ref().map(Spanned::span))
            .unwrap_or_else(|| c.at.clone())
    }));
    spans
}

/// `source_count` or `source_fingerprint`: a SQL query string in a SQL task, a command in a
/// command task.
fn source_query(
    raw: Option<&Spanned<RawCommand>>,
    key: &str,
    what: &str,
    is_sql: bool,
    ok: &mut bool,
    errs: &mut FileErrors<'_>,
) -> Option<SourceCount> {
    let c = raw?;
    if !is_sql {
        let spec = command_spec(c, key, errs);
        *ok &= spec.is_some();
        return spec.map(SourceCount::Command);
    }
    match c.get_ref() {
        RawCommand::Shell(sql) if !sql.trim().is_empty() => Some(SourceCount::Sql(sql.clone())),
        RawCommand::Shell(_) => {
            errs.at(c, format!("key `{key}` is empty; write {what}"));
            *ok = false;
            None
        }
        RawCommand::Argv(_) => {
            errs.at(
                c,
                format!("key `{key}`: in a SQL task it is a SQL query string"),
            );
            *ok = false;
            None
        }
    }
}

/// `keep_versions`: a whole number from 0 to the maximum.
pub(crate) fn keep_versions(v: &Spanned<i128>, errs: &mut FileErrors<'_>) -> Option<u32> {
    match u32::try_from(*v.get_ref()) {
        Ok(n) if n <= crate::project::MAX_KEEP_VERSIONS => Some(n),
        _ => {
            errs.at(
                v,
                format!(
                    "key `keep_versions` must be a whole number from 0 (keep none) to {}",
                    crate::project::MAX_KEEP_VERSIONS
                ),
            );
            None
        }
    }
}

/// Each query of a SQL task (its `sql`, its gate's `source_count` and `source_fingerprint`,
/// and its checks) is one read-only query of its warehouse's engine (see [`crate::query`]);
/// each that is not is reported at the place in its string that says why.
pub(super) fn read_only_queries(
    t: &RawTask,
    id: &str,
    dialect: crate::query::Dialect,
    errs: &mut FileErrors<'_>,
) {
    let judge = |errs: &mut FileErrors<'_>, what: &str, span: std::ops::Range<usize>, sql: &str| {
        if let Err(refused) = crate::query::read_only(sql, dialect) {
            let token = errs.text.get(span.clone()).unwrap_or_default();
            let offset = span.start + super::diagnostics::token_offset(token, refused.offset);
            errs.at_offset(offset, refused.said(what, dialect));
        }
    };
    if let Some(sql) = &t.sql {
        judge(errs, "key `sql`", sql.span(), sql.get_ref());
    }
    if let Some(sql) = t.ready.as_ref().and_then(|r| r.get_ref().sql.as_ref()) {
        judge(
            errs,
            "key `sql` of [tasks.ready]",
            sql.span(),
            sql.get_ref(),
        );
    }
    let Some(gate) = &t.gate else {
        return;
    };
    let gate = gate.get_ref();
    for (key, raw) in [
        ("source_count", &gate.source_count),
        ("source_fingerprint", &gate.source_fingerprint),
    ] {
        if let Some(c) = raw
            && let RawCommand::Shell(sql) = c.get_ref()
        {
            judge(errs, &format!("key `{key}`"), c.span(), sql);
        }
    }
    for (i, check) in gate.checks.iter().enumerate() {
        if let Some(sql) = &check.sql {
            let what = match &check.name {
                Some(name) => format!("check \"{}\" of task `{id}`", name.get_ref()),
                None => format!("check {} of task `{id}`", i + 1),
            };
            judge(errs, &what, sql.span(), sql.get_ref());
        }
    }
}
