//! The gate's rules on the values of a try's output (`not_null`, `accepted_values`, `range`
//! and the SQL checks), as SQL that SQLite and PostgreSQL run alike over the table `output`:
//! the try's audited rows, in the try's own transaction and snapshot.
//!
//! One statement counts the violations of every rule; only a rule that found some reads a few
//! of its rows, so a clean output costs one statement. The engine (see [`Engine`]) says what
//! `output` is (the audit file's table on SQLite, the interval's rows just written on
//! PostgreSQL) and how a check's bind parameters are bound.

use super::quote;
use crate::gate::{Found, SAMPLES};
use crate::project::{Gate, Literal, Rule, RuleKind};

/// What the rules need of a warehouse connection inside a try's transaction. A statement is
/// `WITH output AS (the try's rows)` followed by a body: more common table expressions
/// (`, name AS (...)`) and a `SELECT`, or a `SELECT` alone (` SELECT ...`).
pub trait Engine {
    type Error: From<super::Error>;
    /// A check's query as this engine binds its parameters (the named ones of SQL tasks), for
    /// the next statement run.
    fn check(&mut self, sql: &str) -> Result<String, Self::Error>;
    /// The rows of the statement of `body` (see above); every value of its columns is text or
    /// `NULL`.
    fn texts(&mut self, body: &str) -> Result<Vec<Vec<Option<String>>>, Self::Error>;
    /// The names of the columns the statement of `body` returns.
    fn columns(&mut self, body: &str) -> Result<Vec<String>, Self::Error>;
}

/// The condition a row of `output` violates a built-in rule under (`None` for a check).
pub fn violation(kind: &RuleKind) -> Option<String> {
    let list = |values: &[Literal]| {
        values
            .iter()
            .map(Literal::sql)
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(match kind {
        RuleKind::NotNull(c) => format!("{} IS NULL", quote(c)),
        RuleKind::AcceptedValues(c, values) => {
            format!(
                "{c} IS NOT NULL AND {c} NOT IN ({})",
                list(values),
                c = quote(c)
            )
        }
        RuleKind::Range { column, min, max } => {
            let c = quote(column);
            let mut out = Vec::new();
            if let Some(min) = min {
                out.push(format!("{c} < {}", min.sql()));
            }
            if let Some(max) = max {
                out.push(format!("{c} > {}", max.sql()));
            }
            format!("{c} IS NOT NULL AND ({})", out.join(" OR "))
        }
        RuleKind::Sql(_) | RuleKind::Command(_) => return None,
    })
}

/// How many rows of `output` meet `cond`, as an aggregate.
fn count_of(cond: &str) -> String {
    format!("coalesce(sum(CASE WHEN {cond} THEN 1 ELSE 0 END), 0)")
}

/// What a rule says it found: `not_null violated: region is NULL`.
pub fn what(rule: &Rule) -> String {
    match &rule.kind {
        RuleKind::NotNull(c) => format!("not_null violated: {c} is NULL"),
        RuleKind::AcceptedValues(c, values) => {
            let mut shown: Vec<String> = values.iter().take(10).map(ToString::to_string).collect();
            if values.len() > 10 {
                shown.push("...".into());
            }
            format!(
                "accepted_values violated: {c} is not one of {}",
                shown.join(", ")
            )
        }
        RuleKind::Range { column, min, max } => match (min, max) {
            (Some(a), Some(b)) => format!("range violated: {column} is outside {a} to {b}"),
            (Some(a), None) => format!("range violated: {column} is below {a}"),
            (None, Some(b)) => format!("range violated: {column} is above {b}"),
            (None, None) => format!("range violated: {column}"),
        },
        RuleKind::Sql(_) | RuleKind::Command(_) => format!("check \"{}\" failed:", rule.name),
    }
}

/// A check's query as the body of a common table expression, on lines of its own (a trailing
/// comment cannot swallow the closing parenthesis). In a table expression of its own, the check
/// sees `output` and the warehouse, never a row of the statement around it.
fn subquery(sql: &str) -> String {
    format!("(\n{}\n)", super::strip(sql))
}

/// A statement's body: `ctes` (each `name AS (...)`) then `select`.
fn body(ctes: &[String], select: &str) -> String {
    let mut out = String::new();
    for cte in ctes {
        out.push_str(", ");
        out.push_str(cte);
    }
    out.push(' ');
    out.push_str(select);
    out
}

/// The body of the statement that counts every rule's violations, one text column per rule in
/// their order, in one row whatever the output holds: what the try runs, and what `dags
/// validate` prepares. The built-in rules are counted in one pass over `output`.
pub fn counting<E: Engine>(e: &mut E, rules: &[&Rule]) -> Result<Option<String>, E::Error> {
    let (mut ctes, mut sums, mut columns) = (Vec::new(), Vec::new(), Vec::new());
    for (i, rule) in rules.iter().enumerate() {
        match (&rule.kind, violation(&rule.kind)) {
            (_, Some(cond)) => {
                sums.push(format!(
                    "CAST({} AS text) AS backfill_rule_{i}",
                    count_of(&cond)
                ));
                columns.push(format!("b.backfill_rule_{i}"));
            }
            (RuleKind::Sql(sql), None) => {
                ctes.push(format!(
                    "backfill_check_{i} AS {}",
                    subquery(&e.check(sql)?)
                ));
                columns.push(format!(
                    "(SELECT CAST(count(*) AS text) FROM backfill_check_{i})"
                ));
            }
            (_, None) => {}
        }
    }
    if columns.is_empty() {
        return Ok(None);
    }
    let from = if sums.is_empty() {
        String::new()
    } else {
        format!(" FROM (SELECT {} FROM output) b", sums.join(", "))
    };
    Ok(Some(body(
        &ctes,
        &format!("SELECT {}{from}", columns.join(", ")),
    )))
}

/// The rules of `gate` that a warehouse judges: all but a command task's checks.
pub fn judged_here(gate: &Gate) -> Vec<&Rule> {
    gate.rules
        .iter()
        .filter(|r| !matches!(r.kind, RuleKind::Command(_)))
        .collect()
}

/// How many rows violate each built-in rule of [`judged_here`], as aggregates over the
/// output's rows, in their order, for a statement that reads those rows anyway (PostgreSQL's
/// insert counts them as it writes them): `None` when there is none.
pub fn built_in_sums(gate: &Gate) -> Option<String> {
    let sums: Vec<String> = judged_here(gate)
        .iter()
        .filter_map(|r| violation(&r.kind).map(|cond| count_of(&cond)))
        .collect();
    (!sums.is_empty()).then(|| sums.join(", "))
}

/// Runs the rules of `gate` that a warehouse judges (see [`judged_here`]) over the try's
/// `rows` rows; `counted` holds the counts of the built-in rules in their order when they were
/// counted already (see [`built_in_sums`]). A rule that found violations shows up to
/// [`SAMPLES`] of them, by the columns in `shown` (the unique key, or the partition column)
/// and its own column.
pub fn run<E: Engine>(
    e: &mut E,
    gate: &Gate,
    rows: i64,
    shown: &[String],
    counted: Option<&[i64]>,
) -> Result<Vec<Found>, E::Error> {
    let rules = judged_here(gate);
    let builtin = |r: &Rule| violation(&r.kind).is_some();
    let to_count: Vec<&Rule> = match counted {
        Some(_) => rules.iter().copied().filter(|r| !builtin(r)).collect(),
        None => rules.clone(),
    };
    let mut fresh = match counting(e, &to_count)? {
        Some(statement) => e.texts(&statement)?.into_iter().next().unwrap_or_default(),
        None => Vec::new(),
    }
    .into_iter();
    let mut known = counted.unwrap_or_default().iter();
    let mut found = Vec::new();
    for rule in &rules {
        let violations = if counted.is_some() && builtin(rule) {
            known.next().copied()
        } else {
            fresh.next().flatten().and_then(|v| v.parse::<i64>().ok())
        }
        .ok_or_else(|| {
            super::Error::Message(format!(
                "the rule `{}` gave no count of its violations",
                rule.name
            ))
        })?;
        let samples = if violations == 0 {
            Vec::new()
        } else {
            samples(e, rule, shown)?
        };
        found.push(Found {
            what: what(rule),
            severity: rule.severity,
            violations,
            of_rows: builtin(rule).then_some(rows),
            samples,
        });
    }
    Ok(found)
}

/// Up to [`SAMPLES`] rows that violate a rule, as its message shows them:
/// `(order_id 7, day 2026-09-03)`.
fn samples<E: Engine>(e: &mut E, rule: &Rule, shown: &[String]) -> Result<Vec<String>, E::Error> {
    let (names, statement) = match (&rule.kind, violation(&rule.kind)) {
        (kind, Some(cond)) => {
            let mut names: Vec<String> = shown.to_vec();
            if let Some(c) = kind
                .column()
                .filter(|_| !matches!(kind, RuleKind::NotNull(_)))
                && !names.iter().any(|n| n == c)
            {
                names.push(c.to_string());
            }
            let cols = names
                .iter()
                .map(|n| format!("CAST({} AS text)", quote(n)))
                .collect::<Vec<_>>()
                .join(", ");
            let order = shown
                .iter()
                .map(|n| quote(n))
                .collect::<Vec<_>>()
                .join(", ");
            let order = if order.is_empty() {
                String::new()
            } else {
                format!(" ORDER BY {order}")
            };
            let statement = body(
                &[],
                &format!("SELECT {cols} FROM output WHERE {cond}{order} LIMIT {SAMPLES}"),
            );
            (names, statement)
        }
        (RuleKind::Sql(sql), None) => {
            let check = e.check(sql)?;
            let names = e.columns(&body(
                &[format!("backfill_check AS {}", subquery(&check))],
                "SELECT * FROM backfill_check",
            ))?;
            // Its columns renamed by place: a check may return two columns of one name.
            let renamed: Vec<String> = (0..names.len()).map(|k| format!("k{k}")).collect();
            let check = e.check(sql)?;
            let cols = renamed
                .iter()
                .map(|n| format!("CAST({n} AS text)"))
                .collect::<Vec<_>>()
                .join(", ");
            let statement = body(
                &[format!(
                    "backfill_check ({}) AS {}",
                    renamed.join(", "),
                    subquery(&check)
                )],
                &format!("SELECT {cols} FROM backfill_check LIMIT {SAMPLES}"),
            );
            (names, statement)
        }
        (_, None) => return Ok(Vec::new()),
    };
    if names.is_empty() {
        return Ok(Vec::new());
    }
    Ok(e.texts(&statement)?
        .into_iter()
        .map(|row| {
            let values: Vec<String> = names
                .iter()
                .zip(row)
                .map(|(n, v)| format!("{n} {}", shown_value(v.as_deref())))
                .collect();
            format!("({})", values.join(", "))
        })
        .collect())
}

/// A value as a sample shows it: `NULL`, or its text cut at 40 characters.
fn shown_value(v: Option<&str>) -> String {
    match v {
        None => "NULL".into(),
        Some(t) if t.chars().count() > 40 => {
            format!("{}...", t.chars().take(40).collect::<String>())
        }
        Some(t) => t.to_string(),
    }
}

/// What `dags validate` and the dry run check of the rules, before anything runs: each
/// built-in rule's column is one of `columns` (what `output` holds), and each rule's statement
/// prepares as it will run (a check's syntax, its tables and columns, its bind parameters,
/// the type of a bound against its column). `Err` names the first rule that does not, by its
/// place in `rules`, with the engine's words (`describe`).
pub fn check<E: Engine>(
    e: &mut E,
    rules: &[Rule],
    columns: &[String],
    describe: impl Fn(&E::Error) -> String,
) -> Result<(), (usize, String)> {
    for (i, rule) in rules.iter().enumerate() {
        if let Some(c) = rule.kind.column()
            && !columns.iter().any(|have| have == c)
        {
            return Err((
                i,
                format!(
                    "rule `{}`: the output has no column `{c}` (it has: {})",
                    rule.name,
                    columns.join(", ")
                ),
            ));
        }
        let statement = counting(e, &[rule]).map_err(|err| (i, describe(&err)))?;
        if let Some(statement) = statement
            && let Err(err) = e.columns(&statement)
        {
            let what = match &rule.kind {
                RuleKind::Sql(_) => format!("check \"{}\" does not prepare", rule.name),
                _ => format!("rule `{}` does not prepare", rule.name),
            };
            return Err((i, format!("{what}: {}", describe(&err))));
        }
    }
    Ok(())
}
