//! Loading what a task does: a command (argv or shell) or SQL (its warehouse, target and
//! statements), and its `[gate]`, the audit its output passes before it is published; every
//! error with its line.

use std::collections::BTreeMap;

use toml::Spanned;

use super::dag::*;
use super::diagnostics::FileErrors;
use super::raw::{RawCommand, RawGate, RawTask};
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
        (Some(c), None) => {
            for (key, value) in [
                ("warehouse", &t.warehouse),
                ("target", &t.target),
                ("partition_column", &t.partition_column),
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
            (!sql_keys && t.partition_column.is_none()).then_some(TaskKind::Command(spec))
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
            // PostgreSQL targets may name their schema: checked again once the warehouse is known.
            let target = field(&t.target, "target", false);
            let partition_column = field(&t.partition_column, "partition_column", true);
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
            }
            if sql.get_ref().trim().is_empty() {
                errs.at(
                    sql,
                    "key `sql` is empty; write the SELECT whose rows fill the interval's partition",
                );
            }
            let warehouse = match (&t.warehouse, warehouse) {
                (Some(w), Some(name)) => match warehouses.get(&name) {
                    Some(warehouse) => Some(warehouse),
                    None => {
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
                        None
                    }
                },
                _ => None,
            };
            if sql.get_ref().trim().is_empty() {
                return None;
            }
            let keep = match &t.keep_versions {
                None => None,
                Some(k) => Some(keep_versions(k, errs)?),
            };
            let warehouse = warehouse?.clone();
            let (target, at) = (target?, t.target.as_ref()?);
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
    ok.then(|| Gate {
        unique_key: raw.unique_key.iter().map(|k| k.get_ref().clone()).collect(),
        unique_key_table,
        source_count,
        source_fingerprint,
        tolerance,
        allow_empty: raw.allow_empty.unwrap_or(false),
    })
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
