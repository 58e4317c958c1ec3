//! What a query that a user wrote does, known by parsing it (the `sqlparser` crate, with the
//! dialect of its warehouse's engine) before anything runs: a SQL task's `sql`, its gate's
//! `source_count` and `source_fingerprint`, and each of its checks must be one read-only query.
//!
//! The program runs those queries inside statements of its own (the task's rows are inserted
//! from it, a check is a table expression beside `output`), in the try's transaction. A text
//! that is not one query could close the program's parenthesis and add statements of its own;
//! a data-modifying table expression (`WITH d AS (DELETE ...)`) would commit with the publish.
//! So a query is read as the engine would read it, and refused (by `dags validate` and every
//! command that loads the DAG) unless it is exactly one `SELECT`, `VALUES` or `TABLE` query,
//! with `WITH` as it likes, that:
//! - holds no `INSERT`, `UPDATE`, `DELETE` or `MERGE` at any depth;
//! - creates no table (`SELECT ... INTO`) and locks no row (`FOR UPDATE`, `FOR SHARE`);
//! - calls none of the engine's built-in functions whose effect no rollback undoes (a
//!   sequence's `nextval`, advisory locks, `dblink`, large objects on the server's files,
//!   ending other sessions, ...).
//!
//! What parsing cannot see is what a function the user defined does inside: that is why the
//! gate also runs each check inside a savepoint it rolls back once it has read the answer
//! (see `warehouse::rules`).

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, ObjectName, Query, Select, Spanned, Statement, TableFactor, Visit, Visitor,
};
use sqlparser::dialect::{PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Location;

/// The SQL a query is written in: its warehouse's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "SQLite",
            Self::Postgres => "PostgreSQL",
        }
    }
}

/// Why a query was refused, and where in its text (a byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub offset: usize,
    pub kind: Refused,
    pub message: String,
}

/// What a refused query is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It cannot be read as SQL of its dialect: the message is the parser's words.
    Unreadable,
    /// It can, and it does more than read: the message says what.
    Writes,
}

impl Refusal {
    fn writes(offset: usize, message: String) -> Self {
        Self {
            offset,
            kind: Refused::Writes,
            message,
        }
    }

    /// The refusal of the query of `what` (`key `sql``) in `dialect`, as an error says it.
    pub(crate) fn said(&self, what: &str, dialect: Dialect) -> String {
        match self.kind {
            Refused::Unreadable => format!(
                "{what} cannot be read as one {} query ({}); what a query does must be known before it runs, see docs/gate.md#what-a-query-may-do",
                dialect.name(),
                self.message
            ),
            Refused::Writes => format!(
                "{what} must be one read-only query (a SELECT, or WITH ... SELECT): {}; see docs/gate.md#what-a-query-may-do",
                self.message
            ),
        }
    }
}

/// Functions of PostgreSQL whose effect outlives a rollback, or reaches outside the
/// transaction: by name, or by a name's beginning (`dblink_`).
const POSTGRES_LASTING: &[(&str, &str)] = &[
    ("nextval", "advances a sequence, which no rollback undoes"),
    ("setval", "sets a sequence, which no rollback undoes"),
    ("pg_advisory_", "takes an advisory lock"),
    ("pg_try_advisory_", "takes an advisory lock"),
    ("dblink", "runs statements over another connection"),
    ("lo_", "changes a large object or a file of the server"),
    ("lowrite", "changes a large object"),
    ("pg_file_", "changes a file of the server"),
    ("pg_terminate_backend", "ends another session"),
    ("pg_cancel_backend", "cancels another session's statement"),
    ("pg_reload_conf", "reloads the server's configuration"),
    ("pg_rotate_logfile", "rotates the server's log"),
    ("pg_switch_wal", "switches the server's WAL file"),
    ("pg_create_", "creates a replication slot or restore point"),
    ("pg_drop_replication_slot", "drops a replication slot"),
    ("pg_replication_slot_advance", "advances a replication slot"),
    ("pg_logical_emit_message", "writes to the WAL"),
    ("pg_stat_reset", "resets the server's statistics"),
    ("pg_promote", "promotes a standby"),
    ("pg_backup_", "starts or stops a backup"),
    ("pg_start_backup", "starts a backup"),
    ("pg_stop_backup", "stops a backup"),
    ("pg_wal_replay_", "pauses or resumes a standby"),
    ("pg_import_system_collations", "creates collations"),
    ("pg_notify", "sends a notification"),
    ("set_config", "changes a setting of the session"),
];

/// Functions of SQLite with an effect outside the query.
const SQLITE_LASTING: &[(&str, &str)] = &[("load_extension", "loads code into the connection")];

/// `Ok` when `sql` is one read-only query in `dialect` (see the module's doc).
pub(crate) fn read_only(sql: &str, dialect: Dialect) -> Result<(), Refusal> {
    let statements = match dialect {
        Dialect::Sqlite => Parser::parse_sql(&SQLiteDialect {}, sql),
        Dialect::Postgres => Parser::parse_sql(&PostgreSqlDialect {}, sql),
    }
    .map_err(|e| unreadable(sql, &e.to_string()))?;
    let first = match statements.as_slice() {
        [] => {
            return Err(Refusal::writes(0, "it holds no statement".into()));
        }
        [one] => one,
        [_, second, ..] => {
            return Err(Refusal::writes(
                offset_of(sql, second.span().start),
                format!("it holds {} statements", statements.len()),
            ));
        }
    };
    if !matches!(first, Statement::Query(_)) {
        return Err(Refusal::writes(
            offset_of(sql, first.span().start),
            format!("`{}` is a statement, not a query", keyword(first)),
        ));
    }
    let mut look = Look {
        dialect,
        depth: 0,
        found: None,
    };
    let _ = first.visit(&mut look);
    match look.found {
        None => Ok(()),
        Some((at, message)) => Err(Refusal::writes(offset_of(sql, at), message)),
    }
}

/// A parser's error as a refusal: its words, at the place it names.
fn unreadable(sql: &str, error: &str) -> Refusal {
    let (words, offset) = match error.rsplit_once(" at Line: ") {
        Some((words, at)) => {
            let mut parts = at.split(", Column: ");
            let line = parts.next().and_then(|l| l.trim().parse().ok());
            let column = parts.next().and_then(|c| c.trim().parse().ok());
            match (line, column) {
                (Some(line), Some(column)) => (words, offset_of(sql, Location { line, column })),
                _ => (error, 0),
            }
        }
        None => (error, 0),
    };
    let words = words
        .strip_prefix("sql parser error: ")
        .unwrap_or(words)
        .trim();
    Refusal {
        offset,
        kind: Refused::Unreadable,
        message: words.to_string(),
    }
}

/// The byte offset in `sql` of a parser's location (line and column from 1, in characters);
/// 0 for an unknown location.
fn offset_of(sql: &str, at: Location) -> usize {
    if at.line == 0 {
        return 0;
    }
    let mut line = 1;
    let mut column = 1;
    for (i, c) in sql.char_indices() {
        if line == at.line && column == at.column {
            return i;
        }
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    sql.len()
}

/// A statement's first words, as a refusal names it: `DELETE`, `CREATE TABLE`.
fn keyword(s: &Statement) -> String {
    let text = s.to_string();
    let mut words = text.split_whitespace();
    let first = words.next().unwrap_or_default().to_ascii_uppercase();
    match first.as_str() {
        "CREATE" | "DROP" | "ALTER" | "TRUNCATE" => match words.next() {
            Some(second) => format!("{first} {}", second.to_ascii_uppercase()),
            None => first,
        },
        _ => first,
    }
}

/// The last part of a function's name, as the engine finds it: unquoted, in lower case.
fn function_name(name: &ObjectName) -> String {
    name.0
        .last()
        .map(|part| part.to_string())
        .unwrap_or_default()
        .trim_matches('"')
        .to_ascii_lowercase()
}

/// Walks a query and keeps the first thing in it that does more than read.
struct Look {
    dialect: Dialect,
    /// Statements entered: the query itself is the first.
    depth: usize,
    found: Option<(Location, String)>,
}

impl Look {
    fn refuse(&mut self, at: Location, message: String) -> ControlFlow<()> {
        self.found.get_or_insert((at, message));
        ControlFlow::Break(())
    }

    fn function(&mut self, name: &ObjectName, at: Location) -> ControlFlow<()> {
        let called = function_name(name);
        let lasting = match self.dialect {
            Dialect::Postgres => POSTGRES_LASTING,
            Dialect::Sqlite => SQLITE_LASTING,
        };
        let hit = lasting.iter().find(|(n, _)| {
            if n.ends_with('_') {
                called.starts_with(n)
            } else {
                called == *n || (*n == "dblink" && called.starts_with("dblink_"))
            }
        });
        match hit {
            Some((_, what)) => self.refuse(at, format!("`{called}()` {what}")),
            None => ControlFlow::Continue(()),
        }
    }
}

impl Visitor for Look {
    type Break = ();

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        self.depth += 1;
        if self.depth > 1 {
            return self.refuse(
                s.span().start,
                format!("`{}` inside it writes to the warehouse", keyword(s)),
            );
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        if let Some(lock) = q.locks.first() {
            return self.refuse(
                q.span().start,
                format!("`{lock}` locks the rows it reads, as a write would"),
            );
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, s: &Select) -> ControlFlow<()> {
        if let Some(into) = &s.into {
            return self.refuse(
                s.span().start,
                format!("`SELECT ... {into}` creates a table"),
            );
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        match e {
            Expr::Function(f) => self.function(&f.name, e.span().start),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        match t {
            TableFactor::Table {
                name,
                args: Some(_),
                ..
            }
            | TableFactor::Function { name, .. } => self.function(name, t.span().start),
            _ => ControlFlow::Continue(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(sql: &str, dialect: Dialect) -> Refusal {
        read_only(sql, dialect).expect_err(sql)
    }

    #[test]
    fn queries_that_only_read_pass_on_both_engines() {
        for sql in [
            "SELECT * FROM output WHERE amount < 0",
            "SELECT day, count(*) FROM raw_orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end GROUP BY 1",
            "WITH a AS (SELECT 1 AS x) SELECT x FROM a UNION ALL SELECT 2",
            "SELECT count(*) FROM raw_orders WHERE day = :ds;",
            "-- a comment\nSELECT 1 -- and another\n",
            "VALUES (1, 2)",
            "SELECT o.region, sum(o.amount) FROM output o JOIN regions r ON r.id = o.region WHERE EXISTS (SELECT 1 FROM regions) GROUP BY o.region HAVING sum(o.amount) > 0",
        ] {
            for d in [Dialect::Sqlite, Dialect::Postgres] {
                assert_eq!(read_only(sql, d), Ok(()), "{sql} ({d:?})");
            }
        }
        for sql in [
            "SELECT :ds::date AS day, coalesce(sum(amount_cents), 0)::bigint FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end",
            "SELECT count(*) FILTER (WHERE amount < 0) FROM output",
            "SELECT DISTINCT ON (region) region, amount FROM output ORDER BY region, amount DESC",
            "SELECT * FROM generate_series(1, 3) g",
            "SELECT md5(string_agg(x::text, ',' ORDER BY x)) FROM output",
            "SELECT pg_sleep(0)",
            "SELECT $$a dollar $ quoted$$ AS t",
        ] {
            assert_eq!(read_only(sql, Dialect::Postgres), Ok(()), "{sql}");
        }
    }

    #[test]
    fn a_data_modifying_statement_is_refused_where_it_is_written() {
        let sql = "WITH d AS (DELETE FROM raw.victim RETURNING *) SELECT count(*) FROM d";
        let r = refused(sql, Dialect::Postgres);
        assert_eq!(&sql[r.offset..r.offset + 6], "DELETE", "{r:?}");
        assert!(
            r.message
                .starts_with("`DELETE` inside it writes to the warehouse"),
            "{}",
            r.message
        );
        for sql in [
            "DELETE FROM raw.victim RETURNING *",
            "UPDATE public.t SET v = 'hacked' WHERE day <> :ds RETURNING *",
            "INSERT INTO t SELECT * FROM output RETURNING *",
            "WITH i AS (INSERT INTO t VALUES (1) RETURNING 1) SELECT * FROM i",
            "WITH u AS (UPDATE t SET v = 1 RETURNING *) SELECT * FROM u",
            "SELECT * FROM (WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d) x",
            "DROP TABLE t",
            "CREATE TABLE t AS SELECT 1",
            "TRUNCATE t",
            "COPY t TO PROGRAM 'sh'",
            "EXPLAIN ANALYZE DELETE FROM t",
            "SET ROLE postgres",
        ] {
            let r = refused(sql, Dialect::Postgres);
            assert!(
                r.message.contains("writes to the warehouse")
                    || r.message.contains("is a statement, not a query")
                    || r.kind == Refused::Unreadable,
                "{sql}: {r:?}"
            );
        }
        let r = refused("DELETE FROM t", Dialect::Sqlite);
        assert_eq!(r.message, "`DELETE` is a statement, not a query");
        let r = refused("UPDATE t SET v = 1", Dialect::Sqlite);
        assert_eq!(r.offset, 0);
        assert_eq!(r.message, "`UPDATE` is a statement, not a query");
    }

    #[test]
    fn text_that_closes_the_wrapper_is_not_one_query() {
        let sql =
            "SELECT 1 WHERE false), evil AS (DELETE FROM raw.victim RETURNING 1), pad AS (SELECT 1";
        for d in [Dialect::Sqlite, Dialect::Postgres] {
            let r = refused(sql, d);
            assert_eq!(r.kind, Refused::Unreadable, "{r:?}");
            assert_eq!(&sql[r.offset..r.offset + 1], ")", "{r:?}");
        }
        let r = refused("SELECT 1; DELETE FROM t", Dialect::Sqlite);
        assert_eq!(
            (r.offset, r.message.as_str()),
            (10, "it holds 2 statements")
        );
        let r = refused("SELECT 1 /* never closed", Dialect::Postgres);
        assert_eq!(r.kind, Refused::Unreadable, "{r:?}");
        assert_eq!(
            r.said("key `sql`", Dialect::Postgres),
            "key `sql` cannot be read as one PostgreSQL query (Unexpected EOF while in a multi-line comment); what a query does must be known before it runs, see docs/gate.md#what-a-query-may-do"
        );
        assert_eq!(
            refused("  ", Dialect::Sqlite).message,
            "it holds no statement"
        );
    }

    #[test]
    fn tables_made_rows_locked_and_lasting_functions_are_refused() {
        let r = refused("SELECT * INTO copy_of FROM output", Dialect::Postgres);
        assert!(
            r.message
                .starts_with("`SELECT ... INTO copy_of` creates a table"),
            "{r:?}"
        );
        let r = refused("SELECT * FROM raw.orders FOR UPDATE", Dialect::Postgres);
        assert!(
            r.message.starts_with("`FOR UPDATE` locks the rows"),
            "{r:?}"
        );
        let sql = "SELECT id, nextval('ids') FROM output";
        let r = refused(sql, Dialect::Postgres);
        assert_eq!(&sql[r.offset..r.offset + 7], "nextval", "{r:?}");
        assert_eq!(
            r.message,
            "`nextval()` advances a sequence, which no rollback undoes"
        );
        for sql in [
            "SELECT pg_catalog.setval('ids', 1)",
            "SELECT \"pg_advisory_lock\"(1)",
            "SELECT * FROM dblink('host=x', 'DELETE FROM t') AS t(x int)",
            "SELECT dblink_exec('host=x', 'DELETE FROM t')",
            "SELECT lo_export(1, '/tmp/x')",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
            "SELECT set_config('backfill.in_try', 'x', true)",
            "SELECT 1 WHERE EXISTS (SELECT nextval('s'))",
        ] {
            let r = refused(sql, Dialect::Postgres);
            assert!(r.message.starts_with('`'), "{sql}: {r:?}");
        }
        assert!(read_only("SELECT load_extension('x')", Dialect::Sqlite).is_err());
        // Only calls count: a column may carry such a name.
        assert_eq!(
            read_only("SELECT nextval FROM output", Dialect::Postgres),
            Ok(())
        );
    }
}
