//! Which rows of a table lie in an interval, as a range on the bare partition column that an
//! index on it can serve.
//!
//! A partition column holds one representation, decided once per task before a backfill
//! starts from the column's values (and, for an empty table, its declared type):
//!
//! - `YYYY-MM-DD` dates: a row lies in the interval when `:ds <= value < :next_ds` (the local
//!   dates of the interval's start and end);
//! - timestamps as text, `YYYY-MM-DD HH:MM:SS` or `YYYY-MM-DDTHH:MM:SS` (optionally with
//!   fractional seconds or a `Z`), in UTC: inside `[data_interval_start, data_interval_end)`;
//! - unix seconds (integers or reals): inside the same instants.
//!
//! NULL lies in no interval. The bounds are values of the column's own representation, so the
//! predicate is `col >= ?1 AND col < ?2` (with a cheap check of the text's shape).

use std::fmt;

use rusqlite::Connection;
use rusqlite::types::Value;

use super::{Result, quote};
use crate::interval::DataInterval;
use crate::project::SqlTask;

/// The representation of a partition column's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Repr {
    /// `YYYY-MM-DD` text.
    Date,
    /// Timestamp text with this separator between date and time (`' '` or `'T'`).
    Timestamp(char),
    /// Unix seconds.
    UnixSeconds,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Date => f.write_str("YYYY-MM-DD dates"),
            Self::Timestamp(' ') => f.write_str("timestamps like `YYYY-MM-DD HH:MM:SS`"),
            Self::Timestamp(_) => f.write_str("timestamps like `YYYY-MM-DDTHH:MM:SS`"),
            Self::UnixSeconds => f.write_str("unix seconds"),
        }
    }
}

/// A SQL expression naming the representation class of `column`: `date`, `ts `, `tsT`, `unix`,
/// `null` or `other`.
pub(crate) fn class_sql(column: &str) -> String {
    let c = quote(column);
    format!(
        "CASE typeof({c}) \
           WHEN 'integer' THEN 'unix' WHEN 'real' THEN 'unix' WHEN 'null' THEN 'null' \
           WHEN 'text' THEN CASE \
             WHEN length({c}) = 10 AND {c} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]' THEN 'date' \
             WHEN length({c}) >= 19 AND substr({c}, 11, 1) IN (' ', 'T') \
               AND {c} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]?[0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' \
               AND (length({c}) = 19 OR substr({c}, 20, 1) IN ('.', 'Z')) \
             THEN 'ts' || substr({c}, 11, 1) \
             ELSE 'other' END \
           ELSE 'other' END"
    )
}

impl Repr {
    /// Every representation a partition column may hold.
    pub(crate) const ALL: [Repr; 4] = [
        Repr::Date,
        Repr::Timestamp(' '),
        Repr::Timestamp('T'),
        Repr::UnixSeconds,
    ];

    /// `repr`, or, when it is not known, every representation: whatever selects an interval's
    /// rows then covers each one's range.
    pub(crate) fn known_or_all(repr: Option<Repr>) -> Vec<Repr> {
        repr.map_or_else(|| Self::ALL.to_vec(), |r| vec![r])
    }

    /// The representation of a class name from [`class_sql`].
    pub(crate) fn from_class(class: &str) -> Option<Self> {
        match class {
            "date" => Some(Self::Date),
            "ts " => Some(Self::Timestamp(' ')),
            "tsT" => Some(Self::Timestamp('T')),
            "unix" => Some(Self::UnixSeconds),
            _ => None,
        }
    }

    /// The representation a declared column type implies, for a table without rows.
    pub(crate) fn from_declared(declared: &str) -> Option<Self> {
        let t = declared.to_ascii_uppercase();
        if t == "DATE" {
            Some(Self::Date)
        } else if t.contains("DATETIME") || t.contains("TIMESTAMP") {
            Some(Self::Timestamp(' '))
        } else if t.contains("INT") {
            Some(Self::UnixSeconds)
        } else {
            None
        }
    }

    /// `[lo, hi)` of the interval in this representation.
    pub(crate) fn bounds(self, interval: DataInterval, tz: chrono_tz::Tz) -> (Value, Value) {
        match self {
            Self::Date => {
                let date = |t: chrono::DateTime<chrono::Utc>| {
                    Value::Text(t.with_timezone(&tz).format("%Y-%m-%d").to_string())
                };
                (date(interval.start), date(interval.end))
            }
            Self::Timestamp(sep) => {
                let ts = |t: chrono::DateTime<chrono::Utc>| {
                    Value::Text(t.format(&format!("%Y-%m-%d{sep}%H:%M:%S")).to_string())
                };
                (ts(interval.start), ts(interval.end))
            }
            Self::UnixSeconds => (
                Value::Integer(interval.start.timestamp()),
                Value::Integer(interval.end.timestamp()),
            ),
        }
    }

    /// `column` lies in `[?lo, ?hi)` (parameters numbered `lo` and `lo + 1`), in this
    /// representation: a range the column's index serves.
    pub(crate) fn predicate(self, column: &str, lo: usize) -> String {
        let c = quote(column);
        let hi = lo + 1;
        match self {
            Self::Date => format!("{c} >= ?{lo} AND {c} < ?{hi} AND length({c}) = 10"),
            Self::Timestamp(sep) => {
                format!("{c} >= ?{lo} AND {c} < ?{hi} AND substr({c}, 11, 1) = '{sep}'")
            }
            Self::UnixSeconds => format!("{c} >= ?{lo} AND {c} < ?{hi}"),
        }
    }
}

/// What one value of a partition column is, as [`class_sql`] says for a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Of(Repr),
    Null,
    Other,
}

fn digits(b: &[u8]) -> bool {
    b.iter().all(u8::is_ascii_digit)
}

/// The class of one value: the same rules as [`class_sql`], without SQL.
pub(crate) fn classify(v: rusqlite::types::ValueRef<'_>) -> Class {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Integer(_) | ValueRef::Real(_) => Class::Of(Repr::UnixSeconds),
        ValueRef::Null => Class::Null,
        ValueRef::Blob(_) => Class::Other,
        ValueRef::Text(t) => {
            let date = |b: &[u8]| {
                b.len() >= 10
                    && digits(&b[0..4])
                    && b[4] == b'-'
                    && digits(&b[5..7])
                    && b[7] == b'-'
                    && digits(&b[8..10])
            };
            if t.len() == 10 && date(t) {
                return Class::Of(Repr::Date);
            }
            let time = t.len() >= 19
                && date(t)
                && digits(&t[11..13])
                && t[13] == b':'
                && digits(&t[14..16])
                && t[16] == b':'
                && digits(&t[17..19])
                && (t.len() == 19 || matches!(t[19], b'.' | b'Z'));
            match (time, t.get(10)) {
                (true, Some(b' ')) => Class::Of(Repr::Timestamp(' ')),
                (true, Some(b'T')) => Class::Of(Repr::Timestamp('T')),
                _ => Class::Other,
            }
        }
    }
}

impl Repr {
    /// Whether a value of this representation lies in `[lo, hi)` (bounds from
    /// [`Repr::bounds`]), as [`Repr::predicate`] judges it in SQL.
    pub(crate) fn contains(self, v: rusqlite::types::ValueRef<'_>, lo: &Value, hi: &Value) -> bool {
        use rusqlite::types::ValueRef;
        match (self, v, lo, hi) {
            (Self::UnixSeconds, ValueRef::Integer(x), Value::Integer(l), Value::Integer(h)) => {
                x >= *l && x < *h
            }
            (Self::UnixSeconds, ValueRef::Real(x), Value::Integer(l), Value::Integer(h)) => {
                x >= *l as f64 && x < *h as f64
            }
            (
                Self::Date | Self::Timestamp(_),
                ValueRef::Text(t),
                Value::Text(l),
                Value::Text(h),
            ) => classify(v) == Class::Of(self) && t >= l.as_bytes() && t < h.as_bytes(),
            _ => false,
        }
    }
}

/// The representations found among some values, by class.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Classes {
    pub reprs: Vec<Repr>,
    /// Values in no supported representation (text like `2026/09/01`, offsets, blobs).
    pub other: Option<String>,
}

impl Classes {
    /// Adds the class of one value (`example` names it should it be of no representation).
    pub(crate) fn add_class(&mut self, class: Class, example: impl FnOnce() -> String) {
        match class {
            Class::Of(r) if !self.reprs.contains(&r) => self.reprs.push(r),
            Class::Of(_) | Class::Null => {}
            Class::Other => {
                if self.other.is_none() {
                    self.other = Some(example());
                }
            }
        }
    }

    fn add(&mut self, class: &str, example: Option<String>) {
        match Repr::from_class(class) {
            Some(r) if !self.reprs.contains(&r) => self.reprs.push(r),
            Some(_) => {}
            None if class == "null" => {}
            None => {
                if self.other.is_none() {
                    self.other = Some(example.unwrap_or_default());
                }
            }
        }
    }
}

/// The classes of `column` in `table` (schema-qualified as given) among rows whose value lies
/// in the window `[lo, hi)` of any representation (so that the index on the column serves it),
/// or among all rows when `window` is `None`.
pub(crate) fn classes(
    conn: &Connection,
    table: &str,
    column: &str,
    window: Option<(DataInterval, chrono_tz::Tz)>,
) -> Result<Classes> {
    let c = quote(column);
    let class = class_sql(column);
    let mut out = Classes::default();
    match window {
        Some((w, tz)) => {
            // Text ranges (dates and timestamps share a prefix) and numeric ranges, each
            // served by the index; a day of slack on each side covers any timezone.
            let lo_day = w.start - chrono::Duration::days(1);
            let hi_day = w.end + chrono::Duration::days(2);
            let text = Repr::Date.bounds(DataInterval::new(lo_day, hi_day), tz);
            let unix = Repr::UnixSeconds.bounds(DataInterval::new(lo_day, hi_day), tz);
            let sql = format!(
                "SELECT {class}, MIN({c}) FROM {table} WHERE ({c} >= ?1 AND {c} < ?2) OR ({c} >= ?3 AND {c} < ?4) GROUP BY 1"
            );
            let mut stmt = conn.prepare(&sql)?;
            let mut rows = stmt.query(rusqlite::params![text.0, text.1, unix.0, unix.1])?;
            while let Some(r) = rows.next()? {
                let class: String = r.get(0)?;
                out.add(&class, example(r.get_ref(1)?));
            }
        }
        None => {
            let sql = format!("SELECT {class}, MIN({c}) FROM {table} GROUP BY 1");
            let mut stmt = conn.prepare(&sql)?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let class: String = r.get(0)?;
                out.add(&class, example(r.get_ref(1)?));
            }
        }
    }
    Ok(out)
}

/// The representations at the two ends of the column (its smallest and largest non-NULL
/// values: two index lookups when the column is indexed).
pub(crate) fn endpoint_classes(conn: &Connection, table: &str, column: &str) -> Result<Classes> {
    let c = quote(column);
    let class = class_sql(column);
    let mut out = Classes::default();
    for order in ["ASC", "DESC"] {
        let sql = format!(
            "SELECT {class}, {c} FROM {table} WHERE {c} IS NOT NULL ORDER BY {c} {order} LIMIT 1"
        );
        let mut stmt = conn.prepare(&sql)?;
        let mut rows = stmt.query([])?;
        if let Some(r) = rows.next()? {
            let class: String = r.get(0)?;
            out.add(&class, example(r.get_ref(1)?));
        }
    }
    Ok(out)
}

/// A value as the messages show it.
pub(crate) fn show(v: rusqlite::types::ValueRef<'_>) -> String {
    example(v).unwrap_or_default()
}

/// A value as a short message shows it: text longer than 40 characters is cut, with `...`.
pub(crate) fn show_short(v: rusqlite::types::ValueRef<'_>) -> String {
    const LONGEST: usize = 40;
    match v {
        rusqlite::types::ValueRef::Text(t) if t.len() > LONGEST => {
            let text = String::from_utf8_lossy(t);
            let cut: String = text.chars().take(LONGEST).collect();
            if cut.len() < text.len() {
                format!("'{cut}...'")
            } else {
                format!("'{text}'")
            }
        }
        _ => show(v),
    }
}

fn example(v: rusqlite::types::ValueRef<'_>) -> Option<String> {
    use rusqlite::types::ValueRef;
    Some(match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => format!("'{}'", String::from_utf8_lossy(t)),
        ValueRef::Blob(_) => "a blob".into(),
    })
}

/// Why a column's representation cannot be decided.
pub(crate) fn describe_mix(classes: &Classes) -> String {
    match &classes.other {
        Some(example) => format!(
            "holds {example}, which is none of YYYY-MM-DD dates, UTC timestamps (`YYYY-MM-DD HH:MM:SS`, `YYYY-MM-DDTHH:MM:SS[Z]`) or unix seconds"
        ),
        None => format!(
            "mixes {}",
            classes
                .reprs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    }
}

/// The statement that deletes the interval's rows, for `EXPLAIN QUERY PLAN` and for use.
pub(crate) fn delete_sql(task: &SqlTask, repr: Repr) -> String {
    format!(
        "DELETE FROM main.{} WHERE {}",
        quote(&task.target),
        repr.predicate(&task.partition_column, 1)
    )
}

/// Deletes the target rows of the interval. Without a known representation, every
/// representation's range.
pub(crate) fn delete_partition(
    conn: &Connection,
    task: &SqlTask,
    repr: Option<Repr>,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<()> {
    let reprs = Repr::known_or_all(repr);
    for r in reprs {
        let (lo, hi) = r.bounds(interval, tz);
        conn.prepare_cached(&delete_sql(task, r))?
            .execute(rusqlite::params![lo, hi])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: &str) -> DataInterval {
        let t = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        DataInterval::new(
            t(&format!("{d}T00:00:00Z")),
            t(&format!("{d}T00:00:00Z")) + chrono::Duration::days(1),
        )
    }

    /// Values inside `2026-09-01` (UTC) in each representation, as the old per-value rules
    /// judged them.
    #[test]
    fn each_representation_selects_exactly_the_interval() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (p)").unwrap();
        let cases: &[(Repr, &[&str], &[&str])] = &[
            (
                Repr::Date,
                &["'2026-09-01'"],
                &["'2026-08-31'", "'2026-09-02'", "NULL"],
            ),
            (
                Repr::Timestamp(' '),
                &[
                    "'2026-09-01 00:00:00'",
                    "'2026-09-01 23:59:59'",
                    "'2026-09-01 23:59:59.999'",
                    "'2026-09-01 00:00:00Z'",
                ],
                &[
                    "'2026-08-31 23:59:59'",
                    "'2026-09-02 00:00:00'",
                    "'2026-09-02 00:00:00.5'",
                    "NULL",
                ],
            ),
            (
                Repr::Timestamp('T'),
                &["'2026-09-01T00:00:00Z'", "'2026-09-01T12:00:00.5Z'"],
                &["'2026-09-02T00:00:00Z'", "'2026-08-31T23:59:59Z'"],
            ),
            (
                Repr::UnixSeconds,
                &["1788220800", "1788307199", "1788220800.5"],
                &["1788307200", "1788220799", "NULL"],
            ),
        ];
        for (repr, inside, outside) in cases {
            conn.execute_batch("DELETE FROM t").unwrap();
            for v in inside.iter().chain(outside.iter()) {
                conn.execute_batch(&format!("INSERT INTO t VALUES ({v})"))
                    .unwrap();
            }
            let (lo, hi) = repr.bounds(day("2026-09-01"), chrono_tz::Tz::UTC);
            let n: i64 = conn
                .query_row(
                    &format!("SELECT COUNT(*) FROM t WHERE {}", repr.predicate("p", 1)),
                    rusqlite::params![lo, hi],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n as usize, inside.len(), "{repr:?}");
        }
    }

    #[test]
    fn classes_tell_representations_apart() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (p); INSERT INTO t VALUES ('2026-09-01'), ('2026-09-01 05:00:00'), \
             (1788220800), (NULL), ('2026-09-01T05:00:00+02:00');",
        )
        .unwrap();
        let got = classes(&conn, "t", "p", None).unwrap();
        assert_eq!(
            got.reprs,
            [Repr::Date, Repr::Timestamp(' '), Repr::UnixSeconds]
        );
        assert_eq!(got.other.as_deref(), Some("'2026-09-01T05:00:00+02:00'"));
        assert_eq!(Repr::from_declared("date"), Some(Repr::Date));
        assert_eq!(Repr::from_declared("BIGINT"), Some(Repr::UnixSeconds));
        assert_eq!(Repr::from_declared("TEXT"), None);
    }

    proptest::proptest! {
        /// The Rust classification and range check agree with the SQL ones for any value.
        #[test]
        fn rust_and_sql_agree(
            text in "(20[0-9]{2}-[01][0-9]-[0-3][0-9]([ T][0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,3})?Z?)?|[0-9 :TZ.+-]{0,22})",
            int in proptest::prelude::any::<i32>(),
        ) {
            let conn = Connection::open_in_memory().unwrap();
            let window = day("2026-09-01");
            for value in [rusqlite::types::Value::Text(text.clone()), rusqlite::types::Value::Integer(1_788_220_800 + i64::from(int % 200_000))] {
                let sql_class: String = conn
                    .query_row(&format!("SELECT {} FROM (SELECT ?1 AS p)", class_sql("p")), [&value], |r| r.get(0))
                    .unwrap();
                let rust = classify((&value).into());
                proptest::prop_assert_eq!(Repr::from_class(&sql_class), match rust { Class::Of(r) => Some(r), _ => None }, "{:?}", value);
                for repr in [Repr::Date, Repr::Timestamp(' '), Repr::Timestamp('T'), Repr::UnixSeconds] {
                    let (lo, hi) = repr.bounds(window, chrono_tz::Tz::UTC);
                    let in_sql: bool = conn
                        .query_row(&format!("SELECT {} FROM (SELECT ?3 AS p)", repr.predicate("p", 1)), rusqlite::params![lo, hi, value], |r| r.get::<_, Option<bool>>(0))
                        .unwrap()
                        .unwrap_or(false);
                    proptest::prop_assert_eq!(repr.contains((&value).into(), &lo, &hi), in_sql, "{:?} {:?}", repr, value);
                }
            }
        }
    }

    #[test]
    fn the_predicate_uses_the_index() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (p TEXT, x); CREATE INDEX t_p ON t (p);")
            .unwrap();
        let plan: String = conn
            .query_row(
                &format!(
                    "EXPLAIN QUERY PLAN DELETE FROM t WHERE {}",
                    Repr::Date.predicate("p", 1)
                ),
                rusqlite::params!["2026-09-01", "2026-09-02"],
                |r| r.get(3),
            )
            .unwrap();
        assert!(plan.contains("USING INDEX t_p (p>? AND p<?)"), "{plan}");
    }
}
