//! The raw structs that mirror `backfill.toml` and `dags/*.toml`, read from the parsed TOML
//! tree with every key's position kept. Reading never stops at the first mistake: a syntax
//! error, an unknown key or a value of the wrong type is reported, the key is left out, and the
//! rest of the file is still read, so that one run lists every error of the file.

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::diagnostics::{FileErrors, syntax_error, unknown_key};

type Value<'i> = Spanned<DeValue<'i>>;

pub(crate) const PROJECT_KEYS: &[&str] = &[
    "project",
    "manifest",
    "logs",
    "lease_timeout",
    "durability",
    "warehouse",
    "notify",
    "pools",
];
pub(crate) const WAREHOUSE_KEYS: &[&str] = &[
    "kind",
    "path",
    "url",
    "init",
    "busy_timeout",
    "keep_versions",
];
pub(crate) const DAG_KEYS: &[&str] = &[
    "id",
    "description",
    "schedule",
    "timezone",
    "max_active_runs",
    "batch_size",
    "retries",
    "retry_delay",
    "timeout",
    "grace_period",
    "depends_on_past",
    "notify",
    "upstream",
    "tasks",
];
pub(crate) const TASK_KEYS: &[&str] = &[
    "id",
    "depends_on",
    "command",
    "warehouse",
    "target",
    "partition_column",
    "sql",
    "gate",
    "publish",
    "cleanup",
    "retries",
    "retry_delay",
    "timeout",
    "grace_period",
    "keep_versions",
    "pool",
    "write",
    "on_missing",
    "ready",
];
pub(crate) const READY_KEYS: &[&str] = &["sql", "command", "wait", "every"];
pub(crate) const GATE_KEYS: &[&str] = &[
    "unique_key",
    "unique_key_scope",
    "max_changed",
    "source_count",
    "source_fingerprint",
    "tolerance",
    "allow_empty",
    "not_null",
    "accepted_values",
    "range",
    "history",
    "checks",
];
pub(crate) const CHECK_KEYS: &[&str] = &["name", "sql", "command", "severity"];
pub(crate) const HISTORY_KEYS: &[&str] = &["partitions", "tolerance"];
pub(crate) const RANGE_KEYS: &[&str] = &["min", "max", "allow_non_finite"];
pub(crate) const NOTIFY_KEYS: &[&str] = &[
    "on_failure",
    "on_success",
    "on_not_ready",
    "on_finish",
    "timeout",
];

/// A `[notify]` table (in `backfill.toml`, or a DAG file's to override it).
#[derive(Debug, Default)]
pub(crate) struct RawNotify {
    pub(crate) on_failure: Option<Spanned<RawCommand>>,
    pub(crate) on_success: Option<Spanned<RawCommand>>,
    pub(crate) on_not_ready: Option<Spanned<RawCommand>>,
    pub(crate) on_finish: Option<Spanned<RawCommand>>,
    pub(crate) timeout: Option<Spanned<String>>,
}

impl RawNotify {
    fn read(table: &DeTable<'_>, errs: &mut FileErrors<'_>) -> Option<Self> {
        let n = get(table, "notify")?;
        match n.get_ref() {
            DeValue::Table(t) => {
                unknown_keys(t, "[notify]", NOTIFY_KEYS, errs);
                Some(Self {
                    on_failure: command(t, "on_failure", errs),
                    on_success: command(t, "on_success", errs),
                    on_not_ready: command(t, "on_not_ready", errs),
                    on_finish: command(t, "on_finish", errs),
                    timeout: string(t, "timeout", "\"30s\"", errs),
                })
            }
            other => {
                errs.at(
                    n,
                    format!(
                        "key `notify` must be a [notify] table, not {}",
                        a_type(other)
                    ),
                );
                None
            }
        }
    }
}

/// `backfill.toml`.
#[derive(Debug, Default)]
pub(crate) struct RawProject {
    /// The project's name (default: its folder's).
    pub(crate) project: Option<Spanned<String>>,
    pub(crate) manifest: Option<Spanned<String>>,
    pub(crate) logs: Option<Spanned<String>>,
    pub(crate) lease_timeout: Option<Spanned<String>>,
    pub(crate) durability: Option<Spanned<String>>,
    pub(crate) warehouses: Vec<RawWarehouse>,
    pub(crate) notify: Option<RawNotify>,
    /// `[pools]`: each pool.
    pub(crate) pools: Vec<RawPool>,
}

/// A pool of `[pools]`: `name = SLOTS`, or `name = { slots = SLOTS, rate = "N/PERIOD" }`.
#[derive(Debug)]
pub(crate) struct RawPool {
    pub(crate) name: Spanned<String>,
    pub(crate) slots: Spanned<i128>,
    pub(crate) rate: Option<Spanned<String>>,
}

/// A `[warehouse.NAME]` table.
#[derive(Debug)]
pub(crate) struct RawWarehouse {
    /// The name, spanned at `NAME` in the table header.
    pub(crate) name: Spanned<String>,
    /// `sqlite` (the default) or `postgres`.
    pub(crate) kind: Option<Spanned<String>>,
    pub(crate) path: Option<Spanned<String>>,
    /// A PostgreSQL warehouse's connection URL.
    pub(crate) url: Option<Spanned<String>>,
    pub(crate) init: Vec<Spanned<String>>,
    pub(crate) busy_timeout: Option<Spanned<String>>,
    pub(crate) keep_versions: Option<Spanned<i128>>,
}

/// A DAG file.
#[derive(Debug, Default)]
pub(crate) struct RawDag {
    pub(crate) id: Option<Spanned<String>>,
    pub(crate) description: Option<Spanned<String>>,
    pub(crate) schedule: Option<Spanned<String>>,
    pub(crate) timezone: Option<Spanned<String>>,
    pub(crate) max_active_runs: Option<Spanned<i128>>,
    pub(crate) batch_size: Option<Spanned<i128>>,
    pub(crate) retries: Option<Spanned<i128>>,
    pub(crate) retry_delay: Option<Spanned<String>>,
    pub(crate) timeout: Option<Spanned<String>>,
    pub(crate) grace_period: Option<Spanned<String>>,
    pub(crate) depends_on_past: Option<bool>,
    pub(crate) notify: Option<RawNotify>,
    pub(crate) upstream: Vec<Spanned<String>>,
    pub(crate) tasks: Vec<RawTask>,
}

/// A `[[tasks]]` table.
#[derive(Debug)]
pub(crate) struct RawTask {
    /// Byte offset of the table (its `[[tasks]]` header).
    pub(crate) at: usize,
    pub(crate) id: Option<Spanned<String>>,
    pub(crate) depends_on: Vec<Spanned<String>>,
    pub(crate) command: Option<Spanned<RawCommand>>,
    pub(crate) warehouse: Option<Spanned<String>>,
    pub(crate) target: Option<Spanned<String>>,
    pub(crate) partition_column: Option<Spanned<String>>,
    pub(crate) sql: Option<Spanned<String>>,
    pub(crate) gate: Option<Spanned<RawGate>>,
    pub(crate) publish: Option<Spanned<RawCommand>>,
    pub(crate) cleanup: Option<Spanned<RawCommand>>,
    pub(crate) retries: Option<Spanned<i128>>,
    pub(crate) retry_delay: Option<Spanned<String>>,
    pub(crate) timeout: Option<Spanned<String>>,
    pub(crate) grace_period: Option<Spanned<String>>,
    pub(crate) keep_versions: Option<Spanned<i128>>,
    pub(crate) pool: Option<Spanned<String>>,
    /// `replace` (the default) or `merge`.
    pub(crate) write: Option<Spanned<String>>,
    /// With `write = "merge"`: `delete` (the default) or `keep`.
    pub(crate) on_missing: Option<Spanned<String>>,
    pub(crate) ready: Option<Spanned<RawReady>>,
}

/// A `[tasks.ready]` table: how to ask whether an interval's sources are ready.
#[derive(Debug)]
pub(crate) struct RawReady {
    pub(crate) sql: Option<Spanned<String>>,
    pub(crate) command: Option<Spanned<RawCommand>>,
    pub(crate) wait: Option<Spanned<String>>,
    pub(crate) every: Option<Spanned<String>>,
}

/// A `[tasks.gate]` table.
#[derive(Debug)]
pub(crate) struct RawGate {
    pub(crate) unique_key: Vec<Spanned<String>>,
    /// `partition` (the default) or `table`.
    pub(crate) unique_key_scope: Option<Spanned<String>>,
    /// With `write = "merge"`: the largest fraction of the partition's rows a merge may change.
    pub(crate) max_changed: Option<Spanned<f64>>,
    pub(crate) source_count: Option<Spanned<RawCommand>>,
    pub(crate) source_fingerprint: Option<Spanned<RawCommand>>,
    pub(crate) tolerance: Option<Spanned<f64>>,
    pub(crate) allow_empty: Option<bool>,
    pub(crate) not_null: Vec<Spanned<String>>,
    /// `accepted_values = { column = [values] }`.
    pub(crate) accepted_values: Vec<(Spanned<String>, Vec<Spanned<RawLiteral>>)>,
    /// `range = { column = { min = .., max = .. } }`.
    pub(crate) range: Vec<RawRange>,
    pub(crate) history: Option<RawHistory>,
    pub(crate) checks: Vec<RawCheck>,
}

/// A value of `accepted_values` or a bound of `range`.
#[derive(Debug, Clone)]
pub(crate) enum RawLiteral {
    Int(i128),
    Float(f64),
    Text(String),
}

#[derive(Debug)]
pub(crate) struct RawRange {
    pub(crate) column: Spanned<String>,
    pub(crate) min: Option<Spanned<RawLiteral>>,
    pub(crate) max: Option<Spanned<RawLiteral>>,
    pub(crate) allow_non_finite: Option<bool>,
}

#[derive(Debug)]
pub(crate) struct RawHistory {
    /// Where `history` is written.
    pub(crate) at: std::ops::Range<usize>,
    pub(crate) partitions: Option<Spanned<i128>>,
    pub(crate) tolerance: Option<Spanned<f64>>,
}

/// A `[[tasks.gate.checks]]` table.
#[derive(Debug)]
pub(crate) struct RawCheck {
    /// Where the table starts.
    pub(crate) at: std::ops::Range<usize>,
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) sql: Option<Spanned<String>>,
    pub(crate) command: Option<Spanned<RawCommand>>,
    pub(crate) severity: Option<Spanned<String>>,
}

/// A command as written: an array of strings or one string.
#[derive(Debug, Clone)]
pub(crate) enum RawCommand {
    Argv(Vec<Spanned<String>>),
    Shell(String),
}

/// Parses a file into its table of keys; `None` after reporting every syntax error.
fn parse<'i>(text: &'i str, errs: &mut FileErrors<'_>) -> Option<DeTable<'i>> {
    let (table, errors) = DeTable::parse_recoverable(text);
    if errors.is_empty() {
        return Some(table.into_inner());
    }
    for e in &errors {
        syntax_error(errs, e);
    }
    None
}

impl RawProject {
    /// Reads `backfill.toml`; `None` when it is not valid TOML.
    pub(crate) fn read(text: &str, errs: &mut FileErrors<'_>) -> Option<Self> {
        let table = parse(text, errs)?;
        unknown_keys(&table, "", PROJECT_KEYS, errs);
        let mut warehouses = Vec::new();
        if let Some(w) = get(&table, "warehouse") {
            match w.get_ref() {
                DeValue::Table(all) => {
                    for (name, value) in all {
                        let name = Spanned::new(name.span(), name.get_ref().to_string());
                        match value.get_ref() {
                            DeValue::Table(t) => {
                                let header = format!("[warehouse.{}]", name.get_ref());
                                unknown_keys(t, &header, WAREHOUSE_KEYS, errs);
                                warehouses.push(RawWarehouse {
                                    kind: string(t, "kind", "\"postgres\"", errs),
                                    path: string(t, "path", "\"warehouse.db\"", errs),
                                    url: string(
                                        t,
                                        "url",
                                        "\"postgresql://etl@db.internal/analytics\"",
                                        errs,
                                    ),
                                    init: strings(t, "init", "[\"schema.sql\"]", errs),
                                    busy_timeout: string(t, "busy_timeout", "\"5s\"", errs),
                                    keep_versions: integer(t, "keep_versions", "1", errs),
                                    name,
                                });
                            }
                            other => errs.at(
                                value,
                                format!(
                                    "[warehouse] holds one table per warehouse, such as [warehouse.shop] with path = \"warehouse.db\"; `{}` is {}",
                                    name.get_ref(),
                                    a_type(other)
                                ),
                            ),
                        }
                    }
                }
                other => errs.at(
                    w,
                    format!(
                        "key `warehouse` must be tables such as [warehouse.shop], not {}",
                        a_type(other)
                    ),
                ),
            }
        }
        // The table keeps keys sorted by name; messages follow the file.
        warehouses.sort_by_key(|w| w.name.span().start);
        let mut pools = Vec::new();
        if let Some(p) = get(&table, "pools") {
            match p.get_ref() {
                DeValue::Table(all) => {
                    for (name, value) in all {
                        let name_at = Spanned::new(name.span(), name.get_ref().to_string());
                        if let DeValue::Table(t) = value.get_ref() {
                            let key = format!("pools.{}", name.get_ref());
                            unknown_keys(t, &key, &["slots", "rate"], errs);
                            let slots = integer(t, "slots", "4", errs);
                            let rate = string(t, "rate", "\"100/min\"", errs);
                            match slots {
                                Some(slots) => pools.push(RawPool {
                                    name: name_at,
                                    slots,
                                    rate,
                                }),
                                None if get(t, "slots").is_none() => errs.at(
                                    value,
                                    format!(
                                        "pool `{}` needs `slots`, how many of its tries may run at once: {} = {{ slots = 4, rate = \"100/min\" }}",
                                        name.get_ref(),
                                        name.get_ref()
                                    ),
                                ),
                                None => {}
                            }
                        } else if let DeValue::Integer(_) = value.get_ref() {
                            if let Some(slots) = integer(all, name.get_ref(), "2", errs) {
                                pools.push(RawPool {
                                    name: name_at,
                                    slots,
                                    rate: None,
                                });
                            }
                        } else {
                            errs.at(
                                value,
                                format!(
                                    "pool `{n}` must be its number of slots ({n} = 2) or a table ({n} = {{ slots = 4, rate = \"100/min\" }}), not {}",
                                    a_type(value.get_ref()),
                                    n = name.get_ref()
                                ),
                            );
                        }
                    }
                }
                other => errs.at(
                    p,
                    format!(
                        "key `pools` must be a [pools] table of sizes such as source_api = 2, not {}",
                        a_type(other)
                    ),
                ),
            }
        }
        pools.sort_by_key(|p| p.name.span().start);
        Some(Self {
            project: string(&table, "project", "\"shop\"", errs),
            manifest: string(&table, "manifest", "\".backfill/manifest.db\"", errs),
            logs: string(&table, "logs", "\".backfill/logs\"", errs),
            lease_timeout: string(&table, "lease_timeout", "\"30s\"", errs),
            durability: string(&table, "durability", "\"normal\"", errs),
            notify: RawNotify::read(&table, errs),
            warehouses,
            pools,
        })
    }
}

impl RawDag {
    /// Reads a DAG file; `None` when it is not valid TOML.
    pub(crate) fn read(text: &str, errs: &mut FileErrors<'_>) -> Option<Self> {
        let table = parse(text, errs)?;
        unknown_keys(&table, "", DAG_KEYS, errs);
        let mut tasks = Vec::new();
        if let Some(value) = get(&table, "tasks") {
            match value.get_ref() {
                DeValue::Array(items) => {
                    for item in items {
                        match item.get_ref() {
                            DeValue::Table(t) => tasks.push(RawTask::read(item, t, errs)),
                            other => errs.at(
                                item,
                                format!(
                                    "each task is a [[tasks]] table with an `id`, not {}",
                                    a_type(other)
                                ),
                            ),
                        }
                    }
                }
                other => errs.at(
                    value,
                    format!(
                        "key `tasks` must be [[tasks]] tables (double brackets), not {}",
                        a_type(other)
                    ),
                ),
            }
        }
        Some(Self {
            id: string(&table, "id", "\"daily_orders\"", errs),
            description: string(&table, "description", "\"What the DAG does\"", errs),
            schedule: string(&table, "schedule", "\"@daily\"", errs),
            timezone: string(&table, "timezone", "\"Europe/Berlin\"", errs),
            max_active_runs: integer(&table, "max_active_runs", "4", errs),
            batch_size: integer(&table, "batch_size", "30", errs),
            retries: integer(&table, "retries", "2", errs),
            retry_delay: string(&table, "retry_delay", "\"30s\"", errs),
            timeout: string(&table, "timeout", "\"1h\"", errs),
            grace_period: string(&table, "grace_period", "\"10s\"", errs),
            depends_on_past: boolean(&table, "depends_on_past", errs),
            notify: RawNotify::read(&table, errs),
            upstream: strings(&table, "upstream", "[\"daily_orders\"]", errs),
            tasks,
        })
    }
}

impl RawTask {
    fn read(item: &Value<'_>, t: &DeTable<'_>, errs: &mut FileErrors<'_>) -> Self {
        unknown_keys(t, "[[tasks]]", TASK_KEYS, errs);
        let gate = get(t, "gate").and_then(|g| match g.get_ref() {
            DeValue::Table(gt) => {
                unknown_keys(gt, "[tasks.gate]", GATE_KEYS, errs);
                let gate = RawGate {
                    unique_key: strings(gt, "unique_key", "[\"day\", \"region\"]", errs),
                    unique_key_scope: string(gt, "unique_key_scope", "\"table\"", errs),
                    max_changed: number(gt, "max_changed", "0.2", errs),
                    source_count: command(gt, "source_count", errs),
                    source_fingerprint: command(gt, "source_fingerprint", errs),
                    tolerance: number(gt, "tolerance", "0.02", errs),
                    allow_empty: boolean(gt, "allow_empty", errs),
                    not_null: strings(gt, "not_null", "[\"order_id\", \"region\"]", errs),
                    accepted_values: accepted_values(gt, errs),
                    range: ranges(gt, errs),
                    history: history(gt, errs),
                    checks: checks(gt, errs),
                };
                Some(Spanned::new(g.span(), gate))
            }
            other => {
                errs.at(
                    g,
                    format!(
                        "key `gate` must be a [tasks.gate] table, not {}",
                        a_type(other)
                    ),
                );
                None
            }
        });
        let ready = table(t, "ready", "[tasks.ready]", errs).map(|(value, rt)| {
            unknown_keys(rt, "[tasks.ready]", READY_KEYS, errs);
            Spanned::new(
                value.span(),
                RawReady {
                    sql: string(
                        rt,
                        "sql",
                        "\"SELECT count(*) > 0 FROM raw.loads WHERE day = :ds\"",
                        errs,
                    ),
                    command: command(rt, "command", errs),
                    wait: string(rt, "wait", "\"2h\"", errs),
                    every: string(rt, "every", "\"5m\"", errs),
                },
            )
        });
        Self {
            at: item.span().start,
            id: string(t, "id", "\"extract\"", errs),
            depends_on: strings(t, "depends_on", "[\"extract\"]", errs),
            command: command(t, "command", errs),
            warehouse: string(t, "warehouse", "\"shop\"", errs),
            target: string(t, "target", "\"daily_orders\"", errs),
            partition_column: string(t, "partition_column", "\"day\"", errs),
            sql: string(t, "sql", "\"SELECT ...\"", errs),
            gate,
            publish: command(t, "publish", errs),
            cleanup: command(t, "cleanup", errs),
            retries: integer(t, "retries", "2", errs),
            retry_delay: string(t, "retry_delay", "\"30s\"", errs),
            timeout: string(t, "timeout", "\"1h\"", errs),
            grace_period: string(t, "grace_period", "\"10s\"", errs),
            keep_versions: integer(t, "keep_versions", "1", errs),
            pool: string(t, "pool", "\"source_api\"", errs),
            write: string(t, "write", "\"merge\"", errs),
            on_missing: string(t, "on_missing", "\"keep\"", errs),
            ready,
        }
    }
}

/// Reports every key of `table` that is not in `known`, at the key.
fn unknown_keys(table: &DeTable<'_>, name: &str, known: &[&str], errs: &mut FileErrors<'_>) {
    for key in table.keys() {
        if !known.contains(&key.get_ref().as_ref()) {
            errs.at(key, unknown_key(key.get_ref(), name, known));
        }
    }
}

/// A table of `key`, or `None` (reported) when it is something else.
fn table<'t, 'i>(
    table: &'t DeTable<'i>,
    key: &str,
    example: &str,
    errs: &mut FileErrors<'_>,
) -> Option<(&'t Value<'i>, &'t DeTable<'i>)> {
    let value = get(table, key)?;
    match value.get_ref() {
        DeValue::Table(t) => Some((value, t)),
        _ => {
            wrong_type(errs, key, &format!("a table such as {example}"), value);
            None
        }
    }
}

/// One value of a rule: a string, a whole number or a fraction.
fn literal(value: &Value<'_>, key: &str, errs: &mut FileErrors<'_>) -> Option<Spanned<RawLiteral>> {
    let literal = match value.get_ref() {
        DeValue::String(s) => RawLiteral::Text(s.to_string()),
        DeValue::Integer(i) => RawLiteral::Int(i128::from_str_radix(i.as_str(), i.radix()).ok()?),
        DeValue::Float(f) => RawLiteral::Float(f.as_str().parse().ok()?),
        other => {
            errs.at(
                value,
                format!(
                    "key `{key}`: a value is a string, a whole number or a fraction, not {}",
                    a_type(other)
                ),
            );
            return None;
        }
    };
    Some(Spanned::new(value.span(), literal))
}

/// `accepted_values = { column = ["a", "b"] }`.
fn accepted_values(
    gate: &DeTable<'_>,
    errs: &mut FileErrors<'_>,
) -> Vec<(Spanned<String>, Vec<Spanned<RawLiteral>>)> {
    const EXAMPLE: &str = "{ region = [\"eu\", \"us\"] }";
    let Some((_, t)) = table(gate, "accepted_values", EXAMPLE, errs) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (column, values) in t {
        let column = Spanned::new(column.span(), column.get_ref().to_string());
        let DeValue::Array(items) = values.get_ref() else {
            wrong_type(
                errs,
                "accepted_values",
                &format!("a table of columns and their values such as {EXAMPLE}"),
                values,
            );
            continue;
        };
        let literals: Vec<_> = items
            .into_iter()
            .filter_map(|v| literal(v, "accepted_values", errs))
            .collect();
        if literals.len() == items.len() {
            out.push((column, literals));
        }
    }
    out
}

/// `range = { column = { min = 0, max = 100 } }`.
fn ranges(gate: &DeTable<'_>, errs: &mut FileErrors<'_>) -> Vec<RawRange> {
    const EXAMPLE: &str = "{ amount = { min = 0, max = 100000 } }";
    let Some((_, t)) = table(gate, "range", EXAMPLE, errs) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (column, bounds) in t {
        let column = Spanned::new(column.span(), column.get_ref().to_string());
        let DeValue::Table(b) = bounds.get_ref() else {
            wrong_type(
                errs,
                "range",
                &format!("a table of columns and their bounds such as {EXAMPLE}"),
                bounds,
            );
            continue;
        };
        unknown_keys(b, "range", RANGE_KEYS, errs);
        let bound = |key: &str, errs: &mut FileErrors<'_>| {
            get(b, key).and_then(|v| literal(v, "range", errs))
        };
        out.push(RawRange {
            column,
            min: bound("min", errs),
            max: bound("max", errs),
            allow_non_finite: boolean(b, "allow_non_finite", errs),
        });
    }
    out
}

/// `history = { partitions = 7, tolerance = 0.5 }`.
fn history(gate: &DeTable<'_>, errs: &mut FileErrors<'_>) -> Option<RawHistory> {
    let (value, t) = table(gate, "history", "{ partitions = 7, tolerance = 0.5 }", errs)?;
    unknown_keys(t, "history", HISTORY_KEYS, errs);
    Some(RawHistory {
        at: value.span(),
        partitions: integer(t, "partitions", "7", errs),
        tolerance: number(t, "tolerance", "0.5", errs),
    })
}

/// `[[tasks.gate.checks]]`.
fn checks(gate: &DeTable<'_>, errs: &mut FileErrors<'_>) -> Vec<RawCheck> {
    const EXPECTED: &str =
        "an array of [[tasks.gate.checks]] tables, each with a `name` and its `sql`";
    let Some(value) = get(gate, "checks") else {
        return Vec::new();
    };
    let DeValue::Array(items) = value.get_ref() else {
        wrong_type(errs, "checks", EXPECTED, value);
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items {
        let DeValue::Table(t) = item.get_ref() else {
            wrong_type(errs, "checks", EXPECTED, item);
            continue;
        };
        unknown_keys(t, "[[tasks.gate.checks]]", CHECK_KEYS, errs);
        out.push(RawCheck {
            at: item.span(),
            name: string(t, "name", "\"no negative revenue\"", errs),
            sql: string(t, "sql", "\"SELECT * FROM output WHERE revenue < 0\"", errs),
            command: command(t, "command", errs),
            severity: string(t, "severity", "\"warn\"", errs),
        });
    }
    out
}

fn get<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t Value<'i>> {
    table.get_key_value(key).map(|(_, v)| v)
}

/// "a string", "an integer", ... for messages.
fn a_type(value: &DeValue<'_>) -> &'static str {
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a fraction",
        DeValue::Boolean(_) => "true or false",
        DeValue::Datetime(_) => "a date",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

fn wrong_type(errs: &mut FileErrors<'_>, key: &str, expected: &str, value: &Value<'_>) {
    errs.at(
        value,
        format!(
            "key `{key}` must be {expected}, not {}",
            a_type(value.get_ref())
        ),
    );
}

fn string(
    table: &DeTable<'_>,
    key: &str,
    example: &str,
    errs: &mut FileErrors<'_>,
) -> Option<Spanned<String>> {
    let value = get(table, key)?;
    match value.get_ref() {
        DeValue::String(s) => Some(Spanned::new(value.span(), s.to_string())),
        _ => {
            wrong_type(errs, key, &format!("a string such as {example}"), value);
            None
        }
    }
}

/// An integer of any size TOML allows (range checks belong to the caller, in its words).
fn integer(
    table: &DeTable<'_>,
    key: &str,
    example: &str,
    errs: &mut FileErrors<'_>,
) -> Option<Spanned<i128>> {
    let value = get(table, key)?;
    match value.get_ref() {
        DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => Some(Spanned::new(value.span(), n)),
            Err(_) => {
                errs.at(
                    value,
                    format!("key `{key}`: the number is too large; write a whole number such as {example}"),
                );
                None
            }
        },
        _ => {
            wrong_type(
                errs,
                key,
                &format!("a whole number such as {example}"),
                value,
            );
            None
        }
    }
}

/// A number, whole or not.
fn number(
    table: &DeTable<'_>,
    key: &str,
    example: &str,
    errs: &mut FileErrors<'_>,
) -> Option<Spanned<f64>> {
    let value = get(table, key)?;
    let parsed = match value.get_ref() {
        DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
        DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
            .ok()
            .map(|n| n as f64),
        _ => {
            wrong_type(errs, key, &format!("a number such as {example}"), value);
            return None;
        }
    };
    if parsed.is_none() {
        errs.at(
            value,
            format!("key `{key}`: cannot read the number; write one such as {example}"),
        );
    }
    parsed.map(|n| Spanned::new(value.span(), n))
}

fn boolean(table: &DeTable<'_>, key: &str, errs: &mut FileErrors<'_>) -> Option<bool> {
    let value = get(table, key)?;
    match value.get_ref() {
        DeValue::Boolean(b) => Some(*b),
        _ => {
            wrong_type(errs, key, "true or false", value);
            None
        }
    }
}

/// An array of strings; a wrong element is reported and left out.
fn strings(
    table: &DeTable<'_>,
    key: &str,
    example: &str,
    errs: &mut FileErrors<'_>,
) -> Vec<Spanned<String>> {
    let Some(value) = get(table, key) else {
        return Vec::new();
    };
    let DeValue::Array(items) = value.get_ref() else {
        wrong_type(
            errs,
            key,
            &format!("an array of strings such as {example}"),
            value,
        );
        return Vec::new();
    };
    string_items(items, key, errs)
}

fn string_items(
    items: &toml::de::DeArray<'_>,
    key: &str,
    errs: &mut FileErrors<'_>,
) -> Vec<Spanned<String>> {
    items
        .into_iter()
        .filter_map(|item| match item.get_ref() {
            DeValue::String(s) => Some(Spanned::new(item.span(), s.to_string())),
            other => {
                errs.at(
                    item,
                    format!(
                        "key `{key}`: every element must be a string (in double quotes), not {}",
                        a_type(other)
                    ),
                );
                None
            }
        })
        .collect()
}

/// A command: `["prog", "arg"]` (no shell) or `"shell line"`.
fn command(
    table: &DeTable<'_>,
    key: &str,
    errs: &mut FileErrors<'_>,
) -> Option<Spanned<RawCommand>> {
    let value = get(table, key)?;
    let command = match value.get_ref() {
        DeValue::String(s) => RawCommand::Shell(s.to_string()),
        DeValue::Array(items) => {
            let before = items.len();
            let argv = string_items(items, key, errs);
            if argv.len() != before {
                return None;
            }
            RawCommand::Argv(argv)
        }
        _ => {
            wrong_type(
                errs,
                key,
                "an array such as [\"prog\", \"arg\"] or a shell line such as \"prog arg\"",
                value,
            );
            return None;
        }
    };
    Some(Spanned::new(value.span(), command))
}
