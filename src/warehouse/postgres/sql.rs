//! What statements are made of: quoted names, typed values, the task's query with its
//! parameters, and the target's columns and partition type as the catalog gives them.

use super::*;

/// Whether a type, as `format_type` names it, is `timestamptz`.
pub(super) fn is_timestamptz(formatted: &str) -> bool {
    formatted == "timestamp with time zone"
        || formatted.starts_with("timestamp(") && formatted.ends_with("with time zone")
}

/// What a partition column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnType {
    /// Local dates of the DAG's time zone.
    Date,
    /// Timestamps without time zone, in UTC (as SQLite's text timestamps).
    Timestamp,
    Timestamptz,
}

impl ColumnType {
    pub(super) fn of(formatted: &str) -> Option<Self> {
        Some(match formatted {
            "date" => Self::Date,
            "timestamp without time zone" => Self::Timestamp,
            "timestamp with time zone" => Self::Timestamptz,
            _ => return None,
        })
    }

    pub(super) fn pg_type(self) -> Type {
        match self {
            Self::Date => Type::DATE,
            Self::Timestamp => Type::TIMESTAMP,
            Self::Timestamptz => Type::TIMESTAMPTZ,
        }
    }

    /// `[lo, hi)` of the interval as values of this column.
    pub(super) fn bounds(self, interval: DataInterval, tz: chrono_tz::Tz) -> Result<[Value; 2]> {
        Ok(match self {
            Self::Date => {
                let day = |t: DateTime<Utc>| t.with_timezone(&tz).date_naive();
                let (lo, hi) = (day(interval.start), day(interval.end));
                let midnight =
                    |t: DateTime<Utc>| t.with_timezone(&tz).time() == chrono::NaiveTime::MIN;
                if lo == hi || !midnight(interval.start) || !midnight(interval.end) {
                    return Err(Error::Message(format!(
                        "the partition column is a date, and interval {interval} is not whole days of the DAG's time zone: replacing its days would delete other intervals' rows; use a timestamp column for intervals shorter than a day"
                    )));
                }
                [Value::Date(lo), Value::Date(hi)]
            }
            Self::Timestamp => [
                Value::Naive(interval.start.naive_utc()),
                Value::Naive(interval.end.naive_utc()),
            ],
            Self::Timestamptz => [Value::At(interval.start), Value::At(interval.end)],
        })
    }
}

/// A bound value.
#[derive(Debug, Clone)]
pub(super) enum Value {
    Int(i64),
    At(DateTime<Utc>),
    Naive(NaiveDateTime),
    Date(NaiveDate),
    Text(String),
}

impl Value {
    pub(super) fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Self::Int(v) => v,
            Self::At(v) => v,
            Self::Naive(v) => v,
            Self::Date(v) => v,
            Self::Text(v) => v,
        }
    }

    pub(super) fn of(p: Param, b: &Binds, tz: chrono_tz::Tz) -> Self {
        let day = |t: DateTime<Utc>| t.with_timezone(&tz).date_naive();
        match p {
            Param::DataIntervalStart => Self::At(b.interval.start),
            Param::DataIntervalEnd => Self::At(b.interval.end),
            Param::Ds => Self::Date(day(b.interval.start)),
            Param::NextDs => Self::Date(day(b.interval.end)),
            Param::DsNodash => Self::Text(b.ds_nodash.clone()),
        }
    }
}

/// A task's statement rewritten with positional parameters from `$first`, with their types.
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) params: Vec<Param>,
}

impl Statement {
    pub(super) fn new(
        key: &'static str,
        sql: &str,
        first: usize,
    ) -> std::result::Result<Self, TaskProblem> {
        let p = positional_from(strip(sql), first).map_err(|e| TaskProblem {
            key,
            offset: Some(e.offset + (sql.len() - sql.trim_start().len())),
            rule: None,
            message: format!("key `{key}`: {}", e.message),
        })?;
        Ok(Self {
            sql: p.sql,
            params: p.params,
        })
    }

    pub(super) fn types(&self) -> Vec<Type> {
        self.params
            .iter()
            .map(|p| match p.pg_type() {
                "timestamptz" => Type::TIMESTAMPTZ,
                "date" => Type::DATE,
                _ => Type::TEXT,
            })
            .collect()
    }

    pub(super) fn values(&self, b: &Binds, tz: chrono_tz::Tz) -> Vec<Value> {
        self.params.iter().map(|p| Value::of(*p, b, tz)).collect()
    }
}

/// What the query's wrapper puts before it.
pub(super) const WRAPPED_BEFORE: &str = "SELECT * FROM (\n";

/// A task's rewritten query as a subquery on lines of its own, so that a trailing comment
/// cannot swallow the closing parenthesis.
pub(super) fn wrapped(sql: &str) -> String {
    format!("{WRAPPED_BEFORE}{sql}\n) q")
}

/// The catalog's view of a target table: its columns in order, with their types.
pub(super) fn target_columns(
    c: &Conn,
    target: &str,
) -> std::result::Result<Vec<(String, String)>, tokio_postgres::Error> {
    // A domain's column by its base type (a domain over a domain, once more): what its values
    // are, and how a fingerprint hashes them.
    let rows = c.wait(c.client.query(
        "SELECT a.attname::text, CASE WHEN t.typtype = 'd' THEN \
           CASE WHEN b.typtype = 'd' THEN format_type(b.typbasetype, b.typtypmod) \
           ELSE format_type(t.typbasetype, t.typtypmod) END \
         ELSE format_type(a.atttypid, a.atttypmod) END \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_type b ON b.oid = t.typbasetype \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
         AND NOT a.attisdropped ORDER BY a.attnum",
        &[&quote_name(target)],
    ))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// [`target_columns`], looked up once per connection (a table that does not exist is asked
/// again).
pub(super) fn cached_columns(
    c: &mut Conn,
    table: &str,
) -> std::result::Result<Vec<(String, String)>, tokio_postgres::Error> {
    if let Some(cols) = c.columns.get(table) {
        return Ok(cols.clone());
    }
    let cols = target_columns(c, table)?;
    if !cols.is_empty() {
        c.columns.insert(table.to_string(), cols.clone());
    }
    Ok(cols)
}

/// Prepares `sql` once per connection.
pub(super) fn prepared(
    c: &mut Conn,
    sql: &str,
    types: &[Type],
) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
    if let Some(s) = c.prepared.get(sql) {
        return Ok(s.clone());
    }
    let s = c.wait(c.client.prepare_typed(sql, types))?;
    crate::pg::keep_prepared(&mut c.prepared, sql, s.clone());
    Ok(s)
}

/// The type of a target's partition column, looked up once per connection.
pub(super) fn partition_type(
    c: &mut Conn,
    task: &SqlTask,
) -> std::result::Result<ColumnType, Failure> {
    partition_of(&cached_columns(c, &task.target)?, task)
}

/// [`partition_type`] as the target is now, read afresh (not from the connection's cache).
pub(super) fn partition_type_now(
    c: &Conn,
    task: &SqlTask,
) -> std::result::Result<ColumnType, Failure> {
    partition_of(&target_columns(c, &task.target)?, task)
}

/// The type of the partition column among the target's `columns`.
fn partition_of(
    columns: &[(String, String)],
    task: &SqlTask,
) -> std::result::Result<ColumnType, Failure> {
    columns
        .iter()
        .find(|(n, _)| *n == task.partition_column)
        .and_then(|(_, t)| ColumnType::of(t))
        .ok_or_else(|| {
            Error::Message(format!(
                "target table `{}` has no date, timestamp or timestamptz column `{}` (partition_column)",
                task.target, task.partition_column
            ))
            .into()
        })
}
