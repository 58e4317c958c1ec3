//! The gate's rules on the values of a try's output (`not_null`, `accepted_values`, `range`
//! and the SQL checks), as SQL that SQLite and PostgreSQL run over the table `output`: the
//! try's audited rows, in the try's own transaction and snapshot.
//!
//! The built-in rules are counted in one statement (or, on PostgreSQL, in the statement that
//! writes the rows); only a rule that found some reads a few of its rows. Each check runs once:
//! one statement gives its count and its first rows, inside a savepoint that is rolled back as
//! soon as the answer is read, so that nothing a check executes (a function with side effects
//! of its own) survives into the publish. What a check may be at all (one read-only query) is
//! known before anything runs (see [`crate::query`]). The engine (see [`Engine`]) says what
//! `output` is (the audit file's table on SQLite, the interval's rows just written on
//! PostgreSQL) and how a check's bind parameters are bound.

use super::quote;
use crate::gate::{Found, SAMPLES};
use crate::project::{Gate, Literal, Rule, RuleKind};
use crate::query::Dialect;

/// What the rules need of a warehouse connection inside a try's transaction. A statement is
/// `WITH output AS (the try's rows)` followed by a body: more common table expressions
/// (`, name AS (...)`) and a `SELECT`, or a `SELECT` alone (` SELECT ...`).
pub trait Engine {
    type Error: From<super::Error>;
    /// The SQL the engine speaks: how a rule is written for it.
    fn dialect(&self) -> Dialect;
    /// A check's query as this engine binds its parameters (the named ones of SQL tasks), for
    /// the next statement run.
    fn check(&mut self, sql: &str) -> Result<String, Self::Error>;
    /// The rows of the statement of `body` (see above); every value of its columns is text or
    /// `NULL`.
    fn texts(&mut self, body: &str) -> Result<Vec<Vec<Option<String>>>, Self::Error>;
    /// [`Engine::texts`] inside a savepoint that is rolled back once the rows are read, also
    /// when the statement fails: whatever the statement executed is undone.
    fn texts_undone(&mut self, body: &str) -> Result<Vec<Vec<Option<String>>>, Self::Error>;
    /// The names of the columns the statement of `body` returns (prepared, never run).
    fn columns(&mut self, body: &str) -> Result<Vec<String>, Self::Error>;
}

/// The name of the SQLite function that reads a value as a number (see [`sqlite_number`]):
/// registered on every connection to a SQLite warehouse.
pub(crate) const NUMBER_FUNCTION: &str = "backfill_number";

/// A SQLite value as a number, for a `range` with numeric bounds: an integer or a real as it
/// is, a text that is a number (`'1000'`, `' 2.5 '`) as that number, and `NULL` for anything
/// else (a text that is not a number, a blob), which no numeric range holds. An infinite real
/// is `NULL` too, unless `non_finite` (the rule's `allow_non_finite`).
pub(crate) fn sqlite_number(
    v: rusqlite::types::ValueRef<'_>,
    non_finite: bool,
) -> Option<rusqlite::types::Value> {
    use rusqlite::types::{Value, ValueRef};
    let real = |f: f64| (f.is_finite() || (non_finite && !f.is_nan())).then_some(Value::Real(f));
    match v {
        ValueRef::Integer(i) => Some(Value::Integer(i)),
        ValueRef::Real(f) => real(f),
        ValueRef::Text(t) => {
            let t = std::str::from_utf8(t).ok()?.trim();
            // Digits, a sign, a point and an exponent only: Rust would read `inf` and `NaN`.
            let numeric = !t.is_empty()
                && t.bytes().any(|b| b.is_ascii_digit())
                && t.bytes()
                    .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            if !numeric {
                return None;
            }
            match t.parse::<i64>() {
                Ok(i) => Some(Value::Integer(i)),
                Err(_) => t.parse::<f64>().ok().and_then(real),
            }
        }
        ValueRef::Null | ValueRef::Blob(_) => None,
    }
}

/// Registers [`NUMBER_FUNCTION`] on a SQLite connection: `backfill_number(v)`, and
/// `backfill_number(v, 1)` that lets infinities through.
pub(crate) fn register_number(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    let flags = FunctionFlags::SQLITE_UTF8
        | FunctionFlags::SQLITE_DETERMINISTIC
        | FunctionFlags::SQLITE_INNOCUOUS;
    for args in [1, 2] {
        conn.create_scalar_function(NUMBER_FUNCTION, args, flags, move |ctx| {
            let non_finite = args == 2 && ctx.get::<i64>(1).unwrap_or(0) != 0;
            Ok(sqlite_number(ctx.get_raw(0), non_finite))
        })?;
    }
    Ok(())
}

/// Whether both bounds of a range (those given) are numbers: then values compare as numbers.
fn numeric(min: Option<&Literal>, max: Option<&Literal>) -> bool {
    [min, max]
        .into_iter()
        .flatten()
        .all(|l| matches!(l, Literal::Int(_) | Literal::Float(_)))
}

/// The condition a row of `output` violates a built-in rule under, in `dialect` (`None` for a
/// check). A range with numeric bounds compares numbers: on SQLite a number stored as text is
/// read as its number and a text that is not one is outside the range; on both engines NaN
/// and the infinities are outside it unless the rule allows them.
pub(crate) fn violation(kind: &RuleKind, dialect: Dialect) -> Option<String> {
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
        RuleKind::Range {
            column,
            min,
            max,
            allow_non_finite,
        } => {
            let c = quote(column);
            let mut out = Vec::new();
            let value = match (numeric(min.as_ref(), max.as_ref()), dialect) {
                (true, Dialect::Sqlite) => {
                    let n = if *allow_non_finite {
                        format!("{NUMBER_FUNCTION}({c}, 1)")
                    } else {
                        format!("{NUMBER_FUNCTION}({c})")
                    };
                    out.push(format!("{n} IS NULL"));
                    n
                }
                (true, Dialect::Postgres) => {
                    if !allow_non_finite {
                        out.push(format!(
                            "CAST({c} AS text) IN ('NaN', 'Infinity', '-Infinity')"
                        ));
                    }
                    c.clone()
                }
                (false, _) => c.clone(),
            };
            if let Some(min) = min {
                out.push(format!("{value} < {}", min.sql()));
            }
            if let Some(max) = max {
                out.push(format!("{value} > {}", max.sql()));
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
pub(crate) fn what(rule: &Rule) -> String {
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
        // A value that is not a (finite) number under numeric bounds is shown as it is stored
        // (`NaN`, `abc`) among the samples.
        RuleKind::Range {
            column, min, max, ..
        } => match (min, max) {
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
/// sees `output` and the warehouse, never a row of the statement around it. The query was
/// known to be one read-only query when its DAG was loaded ([`crate::query`]).
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

/// The body of the statement that counts the violations of the built-in `rules` (each has a
/// [`violation`]), one text column per rule in their order, in one row whatever the output
/// holds, in one pass over `output`: `None` without any.
pub(crate) fn counting(rules: &[&Rule], dialect: Dialect) -> Option<String> {
    let sums: Vec<String> = rules
        .iter()
        .filter_map(|r| violation(&r.kind, dialect))
        .enumerate()
        .map(|(i, cond)| format!("CAST({} AS text) AS backfill_rule_{i}", count_of(&cond)))
        .collect();
    (!sums.is_empty()).then(|| body(&[], &format!("SELECT {} FROM output", sums.join(", "))))
}

/// The rules of `gate` that a warehouse judges: all but a command task's checks.
pub(crate) fn judged_here(gate: &Gate) -> Vec<&Rule> {
    gate.rules
        .iter()
        .filter(|r| !matches!(r.kind, RuleKind::Command(_)))
        .collect()
}

/// How many rows violate each built-in rule of [`judged_here`], as aggregates over the
/// output's rows, in their order, for a statement that reads those rows anyway (PostgreSQL's
/// insert counts them as it writes them): `None` when there is none.
pub(crate) fn built_in_sums(gate: &Gate, dialect: Dialect) -> Option<String> {
    let sums: Vec<String> = judged_here(gate)
        .iter()
        .filter_map(|r| violation(&r.kind, dialect).map(|cond| count_of(&cond)))
        .collect();
    (!sums.is_empty()).then(|| sums.join(", "))
}

/// Runs the rules of `gate` that a warehouse judges (see [`judged_here`]) over the try's
/// `rows` rows; `counted` holds the counts of the built-in rules in their order when they were
/// counted already (see [`built_in_sums`]). A rule that found violations shows up to
/// [`SAMPLES`] of them, by the columns in `shown` (the unique key, or the partition column)
/// and its own column. Each check runs once (see the module's doc).
pub fn run<E: Engine>(
    e: &mut E,
    gate: &Gate,
    rows: i64,
    shown: &[String],
    counted: Option<&[i64]>,
) -> Result<Vec<Found>, E::Error> {
    let rules = judged_here(gate);
    let dialect = e.dialect();
    let built_in: Vec<&Rule> = rules
        .iter()
        .copied()
        .filter(|r| violation(&r.kind, dialect).is_some())
        .collect();
    let counts: Vec<Option<i64>> = match counted {
        Some(known) => known.iter().copied().map(Some).collect(),
        None => match counting(&built_in, dialect) {
            Some(statement) => e
                .texts(&statement)?
                .into_iter()
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|v| v.and_then(|v| v.parse::<i64>().ok()))
                .collect(),
            None => Vec::new(),
        },
    };
    let mut counts = counts.into_iter();
    let mut found = Vec::new();
    for rule in &rules {
        let no_count = || {
            super::Error::Message(format!(
                "the rule `{}` gave no count of its violations",
                rule.name
            ))
        };
        let (violations, samples, of_rows) = match &rule.kind {
            RuleKind::Sql(sql) => {
                let (violations, samples) = check_once(e, sql)?;
                (violations, samples, None)
            }
            _ => {
                let violations = counts.next().flatten().ok_or_else(no_count)?;
                let samples = if violations == 0 {
                    Vec::new()
                } else {
                    samples(e, rule, shown)?
                };
                (violations, samples, Some(rows))
            }
        };
        found.push(Found {
            what: what(rule),
            severity: rule.severity,
            violations,
            of_rows,
            samples,
        });
    }
    Ok(found)
}

/// The body that names a check's columns (prepared only, to learn them).
fn check_columns(check: &str) -> String {
    body(
        &[format!("backfill_check AS {}", subquery(check))],
        "SELECT * FROM backfill_check",
    )
}

/// Runs a check once, inside a savepoint rolled back once its answer is read: how many rows
/// it returned, and up to [`SAMPLES`] of them as its message shows them (`(day 2026-09-03,
/// amount -5)`).
fn check_once<E: Engine>(e: &mut E, sql: &str) -> Result<(i64, Vec<String>), E::Error> {
    let check = e.check(sql)?;
    let names = e.columns(&check_columns(&check))?;
    let check = e.check(sql)?;
    let statement = if names.is_empty() {
        // A query of no column (PostgreSQL allows one): its rows are counted, none shown.
        body(
            &[format!("backfill_check AS {}", subquery(&check))],
            "SELECT CAST(count(*) AS text) FROM backfill_check",
        )
    } else {
        // Its columns renamed by place: a check may return two columns of one name. The count
        // is taken over every row before the limit.
        let renamed: Vec<String> = (0..names.len()).map(|k| format!("k{k}")).collect();
        let cols = renamed
            .iter()
            .map(|n| format!("CAST({n} AS text)"))
            .collect::<Vec<_>>()
            .join(", ");
        body(
            &[format!(
                "backfill_check ({}) AS {}",
                renamed.join(", "),
                subquery(&check)
            )],
            &format!(
                "SELECT CAST(count(*) OVER () AS text), {cols} FROM backfill_check LIMIT {SAMPLES}"
            ),
        )
    };
    let rows = e.texts_undone(&statement)?;
    let violations = match rows.first() {
        None => 0,
        Some(row) => row
            .first()
            .cloned()
            .flatten()
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| {
                super::Error::Message("a check's rows could not be counted".to_string())
            })?,
    };
    let samples = rows
        .into_iter()
        .filter(|_| !names.is_empty())
        .map(|row| sample(&names, row.into_iter().skip(1)))
        .collect();
    Ok((violations, samples))
}

/// A violating row as a message shows it: `(order_id 7, day 2026-09-03)`.
fn sample(names: &[String], values: impl Iterator<Item = Option<String>>) -> String {
    let values: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n} {}", shown_value(v.as_deref())))
        .collect();
    format!("({})", values.join(", "))
}

/// Up to [`SAMPLES`] rows that violate a built-in rule, by the columns in `shown` and the
/// rule's own column.
fn samples<E: Engine>(e: &mut E, rule: &Rule, shown: &[String]) -> Result<Vec<String>, E::Error> {
    let Some(cond) = violation(&rule.kind, e.dialect()) else {
        return Ok(Vec::new());
    };
    let mut names: Vec<String> = shown.to_vec();
    if let Some(c) = rule
        .kind
        .column()
        .filter(|_| !matches!(rule.kind, RuleKind::NotNull(_)))
        && !names.iter().any(|n| n == c)
    {
        names.push(c.to_string());
    }
    if names.is_empty() {
        return Ok(Vec::new());
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
    Ok(e.texts(&statement)?
        .into_iter()
        .map(|row| sample(&names, row.into_iter()))
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
/// place in `rules`, with the engine's words (`describe`). Nothing is run.
pub(crate) fn check<E: Engine>(
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
        let prepared = match &rule.kind {
            RuleKind::Sql(sql) => e
                .check(sql)
                .and_then(|check| e.columns(&check_columns(&check)))
                .map(drop),
            RuleKind::Command(_) => Ok(()),
            _ => match counting(&[rule], e.dialect()) {
                Some(statement) => e.columns(&statement).map(drop),
                None => Ok(()),
            },
        };
        if let Err(err) = prepared {
            let what = match &rule.kind {
                RuleKind::Sql(_) => format!("check \"{}\" does not prepare", rule.name),
                _ => format!("rule `{}` does not prepare", rule.name),
            };
            return Err((i, format!("{what}: {}", describe(&err))));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of `values` (stored in a column of `decl` type) that violate `kind` on SQLite.
    fn violating(decl: &str, values: &[&str], kind: &RuleKind) -> Vec<String> {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        register_number(&conn).unwrap();
        conn.execute_batch(&format!("CREATE TABLE output (x {decl})"))
            .unwrap();
        for v in values {
            conn.execute_batch(&format!("INSERT INTO output VALUES ({v})"))
                .unwrap();
        }
        let cond = violation(kind, Dialect::Sqlite).unwrap();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT quote(x) FROM output WHERE {cond} ORDER BY rowid"
            ))
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn range(min: Option<Literal>, max: Option<Literal>, allow_non_finite: bool) -> RuleKind {
        RuleKind::Range {
            column: "x".into(),
            min,
            max,
            allow_non_finite,
        }
    }

    #[test]
    fn a_numeric_range_compares_numbers_stored_as_text_as_numbers_on_sqlite() {
        let kind = range(Some(Literal::Int(0)), Some(Literal::Int(200)), false);
        // A TEXT column compared with 200 as text would pass '1000' and refuse '99' and '5'.
        assert_eq!(
            violating(
                "TEXT",
                &[
                    "'1000'", "'99'", "'5'", "' 150 '", "'-1'", "'abc'", "NULL", "'2.5'"
                ],
                &kind
            ),
            ["'1000'", "'-1'", "'abc'"]
        );
        // Untyped values: numbers as numbers, and infinity is outside unless allowed.
        let values = ["1000", "99", "'7'", "1e999", "-1e999", "X'00'", "150.5"];
        assert_eq!(
            violating("", &values, &kind),
            ["1000", "9.0e+999", "-9.0e+999", "X'00'"]
        );
        let min_only = range(Some(Literal::Int(0)), None, false);
        assert_eq!(
            violating("", &values, &min_only),
            ["9.0e+999", "-9.0e+999", "X'00'"]
        );
        let allowed = range(Some(Literal::Int(0)), None, true);
        assert_eq!(violating("", &values, &allowed), ["-9.0e+999", "X'00'"]);
        // Text bounds compare as text, as they always did.
        let days = range(Some(Literal::Text("2026-01-01".into())), None, false);
        assert_eq!(
            violating("TEXT", &["'2025-12-31'", "'2026-01-02'"], &days),
            ["'2025-12-31'"]
        );
    }

    #[test]
    fn a_numeric_range_refuses_nan_and_infinities_on_postgresql_unless_allowed() {
        let kind = range(Some(Literal::Int(0)), None, false);
        assert_eq!(
            violation(&kind, Dialect::Postgres).unwrap(),
            "\"x\" IS NOT NULL AND (CAST(\"x\" AS text) IN ('NaN', 'Infinity', '-Infinity') OR \"x\" < 0)"
        );
        let allowed = range(Some(Literal::Int(0)), None, true);
        assert_eq!(
            violation(&allowed, Dialect::Postgres).unwrap(),
            "\"x\" IS NOT NULL AND (\"x\" < 0)"
        );
        assert_eq!(
            what(&Rule {
                name: "range".into(),
                kind,
                severity: crate::project::Severity::Error,
            }),
            "range violated: x is below 0"
        );
    }
}
