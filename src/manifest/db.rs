//! The manifest's connection, whichever engine holds it: a SQLite file or a PostgreSQL
//! database. The submodules of `manifest` write their SQL once, in the dialect both engines
//! take (`ON CONFLICT` upserts, `RETURNING`, flags compared with TRUE and FALSE), and run it
//! through [`Conn`], whose statements and rows have the shape of rusqlite's. Parameters are
//! `$N`, as PostgreSQL numbers them: the text goes to either engine as it is written, rewritten
//! by nothing. SQLite reads `$N` as a named parameter, numbered by where it first appears, so
//! values are bound to it by the number in its name ([`bind_numbered`]), not by position.
//! Values cross the seam as SQLite's five types, so the manifest's own types convert the same
//! way on both engines; the PostgreSQL side converts them to the column's own type (`boolean`,
//! `json`) as it binds (see `postgres::values`).
//!
//! A failure is this layer's own [`Error`]: SQLite's error, PostgreSQL's (see
//! [`crate::pg::Error`], classified by SQLSTATE), or a query that returned no row.

use rusqlite::types::{FromSql, FromSqlError, ToSql, ToSqlOutput, Value, ValueRef};

use super::postgres::Session;

/// A connection to the manifest.
pub enum Conn {
    Sqlite(rusqlite::Connection),
    Pg(Box<Session>),
}

/// A failure of a statement on either engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite's error, or a value that does not convert to the type asked for (values are
    /// SQLite's types on both engines).
    #[error(transparent)]
    Sqlite(rusqlite::Error),
    #[error(transparent)]
    Postgres(#[from] crate::pg::Error),
    /// A query expected to return a row returned none.
    #[error("a row the manifest should hold is missing")]
    NoRows,
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::QueryReturnedNoRows => Self::NoRows,
            e => Self::Sqlite(e),
        }
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// [`rusqlite::OptionalExtension`] for this layer's results: no row is `None`.
pub(crate) trait Optional<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> Optional<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A statement's parameters: rusqlite's `params![...]`, an array of values, or `[]`.
pub(crate) trait Params: rusqlite::Params {
    /// Each value, owned (for PostgreSQL, whose statements may be deferred).
    fn values(&self) -> Result<Vec<Value>>;
    /// Each value, borrowed (for SQLite, which binds them at once).
    fn each(&self) -> Vec<&dyn ToSql>;
}

fn owned(v: &dyn ToSql) -> Result<Value> {
    Ok(match v.to_sql()? {
        ToSqlOutput::Borrowed(r) => owned_ref(r),
        ToSqlOutput::Owned(v) => v,
        other => {
            return Err(Error::Sqlite(rusqlite::Error::ToSqlConversionFailure(
                format!("a value the manifest cannot hold: {other:?}").into(),
            )));
        }
    })
}

fn owned_ref(r: ValueRef<'_>) -> Value {
    match r {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<Value>> {
        self.iter().map(|v| owned(*v)).collect()
    }
    fn each(&self) -> Vec<&dyn ToSql> {
        self.to_vec()
    }
}

impl Params for [&(dyn ToSql + Send + Sync); 0] {
    fn values(&self) -> Result<Vec<Value>> {
        Ok(Vec::new())
    }
    fn each(&self) -> Vec<&dyn ToSql> {
        Vec::new()
    }
}

macro_rules! array_params {
    ($($n:literal)+) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Result<Vec<Value>> {
                self.iter().map(|v| owned(v)).collect()
            }
            fn each(&self) -> Vec<&dyn ToSql> {
                self.iter().map(|v| v as &dyn ToSql).collect()
            }
        }
    )+};
}
array_params!(1 2 3 4);

/// An index into a row's columns (a `usize`, as rusqlite's `get` takes).
pub(crate) trait Idx {
    fn idx(self) -> usize;
}

impl Idx for usize {
    fn idx(self) -> usize {
        self
    }
}

/// One row of a result.
#[derive(Clone, Copy)]
pub(crate) enum Row<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Pg(&'a [Value]),
}

impl Row<'_> {
    pub(crate) fn get<I: Idx, T: FromSql>(&self, i: I) -> Result<T> {
        let i = i.idx();
        match self {
            Row::Sqlite(r) => Ok(r.get(i)?),
            Row::Pg(values) => {
                let v = values
                    .get(i)
                    .ok_or(rusqlite::Error::InvalidColumnIndex(i))?;
                let r = ValueRef::from(v);
                T::column_result(r).map_err(|e| {
                    Error::Sqlite(match e {
                        FromSqlError::InvalidType => {
                            rusqlite::Error::InvalidColumnType(i, format!("#{i}"), r.data_type())
                        }
                        FromSqlError::OutOfRange(n) => {
                            rusqlite::Error::IntegralValueOutOfRange(i, n)
                        }
                        FromSqlError::Other(e) => {
                            rusqlite::Error::FromSqlConversionFailure(i, r.data_type(), e)
                        }
                        other => rusqlite::Error::FromSqlConversionFailure(
                            i,
                            r.data_type(),
                            Box::new(other),
                        ),
                    })
                })
            }
        }
    }
}

/// The answer of a job's statement, now or later. On PostgreSQL, inside the writer's
/// transaction, a statement whose answer the rest of its job does not need is deferred: the
/// writer sends the deferred statements of its batch together, in one round trip, and decodes
/// each answer then (see `manifest::writer`).
#[must_use]
pub enum Step<R> {
    Done(R),
    Later(Deferred<R>),
}

/// A deferred statement: its ticket, what makes its rows into the job's answer, and what reads
/// that answer again from the committed record should the rows be lost with a connection after
/// the server committed.
pub struct Deferred<R> {
    ticket: usize,
    decode: Decode<R>,
    recover: Recover<R>,
}

/// Makes a deferred statement's rows into its job's answer.
pub(crate) type Decode<R> = Box<dyn FnOnce(Vec<Vec<Value>>) -> super::Result<R> + Send>;

/// Reads a deferred statement's answer from what its committed transaction recorded.
pub(crate) type Recover<R> = Box<dyn FnOnce(&Conn) -> super::Result<R> + Send>;

impl<R: Send + 'static> Step<R> {
    /// The answer made into another by `f`, now or once the statement is answered.
    pub(crate) fn map<S>(
        self,
        f: impl FnOnce(R) -> super::Result<S> + Send + 'static,
    ) -> super::Result<Step<S>> {
        Ok(match self {
            Step::Done(r) => Step::Done(f(r)?),
            Step::Later(d) => {
                // Whichever of the two makes the answer uses `f`.
                let f = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
                let g = f.clone();
                Step::Later(Deferred {
                    ticket: d.ticket,
                    decode: Box::new(move |rows| (d.decode)(rows).and_then(|r| once(&f, r))),
                    recover: Box::new(move |c| (d.recover)(c).and_then(|r| once(&g, r))),
                })
            }
        })
    }

    /// The answer, waiting for it when the statement was deferred.
    pub fn now(self, conn: &dyn Answers) -> super::Result<R> {
        self.settle(conn).0
    }

    /// The answer, and what reads it again should it be lost (see [`Deferred`]).
    pub(crate) fn settle(self, conn: &dyn Answers) -> (super::Result<R>, Option<Recover<R>>) {
        match self {
            Step::Done(r) => (Ok(r), None),
            Step::Later(d) => {
                let answer = match conn.answer(d.ticket) {
                    Ok(rows) => (d.decode)(rows),
                    Err(e) => Err(e.into()),
                };
                (answer, Some(d.recover))
            }
        }
    }
}

/// Applies `f`, which only one of a deferred statement's decode and recover may use.
fn once<R, S>(
    f: &std::sync::Mutex<Option<impl FnOnce(R) -> super::Result<S>>>,
    r: R,
) -> super::Result<S> {
    match f.lock().ok().and_then(|mut f| f.take()) {
        Some(f) => f(r),
        None => Err(super::Error::Invalid(
            "a deferred statement's answer was made twice".into(),
        )),
    }
}

/// Where the answers of deferred statements come from.
pub trait Answers {
    /// The rows of the deferred statement `ticket` (sent first, if it was not).
    fn answer(&self, ticket: usize) -> Result<Vec<Vec<Value>>>;
}

impl Answers for Conn {
    fn answer(&self, ticket: usize) -> Result<Vec<Vec<Value>>> {
        match self {
            Conn::Pg(s) => Ok(s.take_answer(ticket)?),
            Conn::Sqlite(_) => Err(Error::NoRows),
        }
    }
}

/// A prepared statement.
pub(crate) enum Stmt<'c> {
    Sqlite(rusqlite::CachedStatement<'c>),
    /// Run rarely: not kept among SQLite's cached statements.
    SqliteOnce(rusqlite::Statement<'c>),
    Pg(&'c Session, String),
}

/// The rows of a query, one at a time.
pub(crate) enum Rows<'s> {
    Sqlite(rusqlite::Rows<'s>),
    Pg(std::vec::IntoIter<Vec<Value>>, Option<Vec<Value>>),
}

impl Rows<'_> {
    pub(crate) fn next(&mut self) -> Result<Option<Row<'_>>> {
        match self {
            Rows::Sqlite(rows) => Ok(rows.next()?.map(Row::Sqlite)),
            Rows::Pg(rest, current) => {
                *current = rest.next();
                Ok(current.as_deref().map(Row::Pg))
            }
        }
    }
}

/// Binds `values` to SQLite's `stmt` by their numbers: `$N` takes the N-th value, wherever it
/// first appears in the text. The last value must be taken (as SQLite asks of `?N`): a
/// statement assembled from parts may leave out a value before it. Any other parameter (`?N`,
/// which SQLite would give a `$N`'s place, or `?`) is refused: PostgreSQL takes only `$N`.
fn bind_numbered(stmt: &mut rusqlite::Statement<'_>, values: &[&dyn ToSql]) -> Result<()> {
    let mut largest = 0;
    for i in 1..=stmt.parameter_count() {
        let name = stmt.parameter_name(i).unwrap_or("?");
        let n = name
            .strip_prefix('$')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                rusqlite::Error::InvalidParameterName(format!(
                    "{name}: the manifest's parameters are $1, $2, ..."
                ))
            })?;
        let value = values
            .get(n - 1)
            .ok_or(rusqlite::Error::InvalidParameterCount(values.len(), n))?;
        stmt.raw_bind_parameter(i, value)?;
        largest = largest.max(n);
    }
    if largest != values.len() {
        return Err(rusqlite::Error::InvalidParameterCount(values.len(), largest).into());
    }
    Ok(())
}

impl Stmt<'_> {
    pub(crate) fn execute<P: Params>(&mut self, p: P) -> Result<usize> {
        match self {
            Stmt::Sqlite(s) => {
                bind_numbered(s, &p.each())?;
                Ok(s.raw_execute()?)
            }
            Stmt::SqliteOnce(s) => {
                bind_numbered(s, &p.each())?;
                Ok(s.raw_execute()?)
            }
            Stmt::Pg(session, sql) => Ok(session.execute(sql, &p.values()?)?),
        }
    }

    pub(crate) fn query<P: Params>(&mut self, p: P) -> Result<Rows<'_>> {
        match self {
            Stmt::Sqlite(s) => {
                bind_numbered(s, &p.each())?;
                Ok(Rows::Sqlite(s.raw_query()))
            }
            Stmt::SqliteOnce(s) => {
                bind_numbered(s, &p.each())?;
                Ok(Rows::Sqlite(s.raw_query()))
            }
            Stmt::Pg(session, sql) => Ok(Rows::Pg(
                session.query(sql, &p.values()?)?.into_iter(),
                None,
            )),
        }
    }

    pub(crate) fn query_row<T, P: Params>(
        &mut self,
        p: P,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut rows = self.query(p)?;
        match rows.next()? {
            Some(r) => f(&r),
            None => Err(Error::NoRows),
        }
    }

    /// Every row, mapped by `f`.
    pub(crate) fn query_map<T, P: Params>(
        &mut self,
        p: P,
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut rows = self.query(p)?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(f(&r));
        }
        Ok(out.into_iter())
    }
}

impl Conn {
    pub(crate) fn prepare_cached(&self, sql: &str) -> Result<Stmt<'_>> {
        match self {
            Conn::Sqlite(c) => Ok(Stmt::Sqlite(c.prepare_cached(sql)?)),
            Conn::Pg(s) => Ok(Stmt::Pg(s, sql.to_string())),
        }
    }

    /// A statement run rarely: SQLite does not keep it among the cached ones.
    pub(crate) fn prepare(&self, sql: &str) -> Result<Stmt<'_>> {
        match self {
            Conn::Sqlite(c) => Ok(Stmt::SqliteOnce(c.prepare(sql)?)),
            Conn::Pg(_) => self.prepare_cached(sql),
        }
    }

    pub(crate) fn execute<P: Params>(&self, sql: &str, p: P) -> Result<usize> {
        match self {
            Conn::Sqlite(c) => {
                let mut s = c.prepare(sql)?;
                bind_numbered(&mut s, &p.each())?;
                Ok(s.raw_execute()?)
            }
            Conn::Pg(s) => Ok(s.execute(sql, &p.values()?)?),
        }
    }

    pub(crate) fn query_row<T, P: Params>(
        &self,
        sql: &str,
        p: P,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.prepare(sql)?.query_row(p, f)
    }

    /// Runs `sql`, or defers it (see [`Step`]): its rows are made into the answer by `decode`;
    /// `recover` reads the answer from the committed record instead, should the rows be lost.
    pub(crate) fn defer<R: Send + 'static>(
        &self,
        sql: &str,
        values: Vec<Value>,
        decode: impl FnOnce(Vec<Vec<Value>>) -> super::Result<R> + Send + 'static,
        recover: impl FnOnce(&Conn) -> super::Result<R> + Send + 'static,
    ) -> super::Result<Step<R>> {
        let rows = match self {
            Conn::Pg(s) if s.defers() => {
                return Ok(Step::Later(Deferred {
                    ticket: s.defer(sql, values),
                    decode: Box::new(decode),
                    recover: Box::new(recover),
                }));
            }
            Conn::Pg(s) => s.query(sql, &values).map_err(Error::from)?,
            Conn::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql).map_err(Error::from)?;
                let width = stmt.column_count();
                let each: Vec<&dyn ToSql> = values.iter().map(|v| v as &dyn ToSql).collect();
                bind_numbered(&mut stmt, &each)?;
                let mut rows = stmt.raw_query();
                let mut out = Vec::new();
                while let Some(r) = rows.next().map_err(Error::from)? {
                    out.push(
                        (0..width)
                            .map(|i| r.get_ref(i).map(owned_ref))
                            .collect::<rusqlite::Result<Vec<_>>>()
                            .map_err(Error::from)?,
                    );
                }
                out
            }
        };
        Ok(Step::Done(decode(rows)?))
    }

    /// Runs several statements without parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match self {
            Conn::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Conn::Pg(s) => Ok(s.batch(sql)?),
        }
    }

    /// "Now" for the manifest's records (unix milliseconds): the caller's clock on SQLite,
    /// which only this machine writes; the database's clock on PostgreSQL, so that hosts whose
    /// clocks disagree judge leases alike.
    pub(crate) fn now_ms(&self, local: i64) -> Result<i64> {
        match self {
            Conn::Sqlite(_) => Ok(local),
            Conn::Pg(s) => Ok(s.now_ms()?),
        }
    }

    /// The manifest's clock read now (unix milliseconds), not when its transaction began: this
    /// process's on SQLite, the database's on PostgreSQL.
    pub(crate) fn clock_now_ms(&self) -> Result<i64> {
        match self {
            Conn::Sqlite(_) => Ok(crate::clock::now_ms()),
            Conn::Pg(s) => Ok(s.clock_now_ms()?),
        }
    }

    /// `end` at the manifest's clock (see [`Conn::now_ms`]); the time since its start that it
    /// carries is the process's own.
    pub(crate) fn at_manifest(&self, end: crate::clock::End) -> Result<crate::clock::End> {
        Ok(crate::clock::End {
            now_ms: self.now_ms(end.now_ms)?,
            ..end
        })
    }

    /// A backfill's epoch and state as read earlier in this writer's transaction (PostgreSQL:
    /// a round trip saved; the writers' lock keeps every other writer out until it commits, and
    /// this transaction's own writes to `backfills` forget what was read).
    pub(crate) fn fenced(&self, backfill_id: i64) -> Option<(i64, crate::state::BackfillState)> {
        match self {
            Conn::Sqlite(_) => None,
            Conn::Pg(s) => s.fenced(backfill_id),
        }
    }

    pub(crate) fn remember_fence(&self, backfill_id: i64, row: (i64, crate::state::BackfillState)) {
        if let Conn::Pg(s) = self {
            s.remember_fence(backfill_id, row);
        }
    }

    /// The PostgreSQL session, when the manifest is in PostgreSQL.
    pub(crate) fn postgres(&self) -> Option<&Session> {
        match self {
            Conn::Pg(s) => Some(s),
            Conn::Sqlite(_) => None,
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Conn::Pg(_))
    }
}

/// How far (milliseconds) the wall clock may disagree with the monotonic time since a start
/// before an end counts as measured across a jump of the clock: starts on PostgreSQL are the
/// database's clock when their transaction began, a little before the process marked them.
const CLOCK_JUMP_MS: i64 = 1000;

/// The end of a row that started at column `started`, as SQL, from `now` and `elapsed` (the
/// milliseconds since the start on the monotonic clock of the process that recorded it, or
/// NULL): `now`, never before the start; but when `now` and the start plus `elapsed` disagree by
/// more than [`CLOCK_JUMP_MS`], the clock jumped while it ran, and the start plus `elapsed` is
/// its end (see [`crate::clock::End`]).
pub(crate) fn ended(started: &str, now: &str, elapsed: &str) -> String {
    let (now, elapsed) = (
        format!("CAST({now} AS bigint)"),
        format!("CAST({elapsed} AS bigint)"),
    );
    format!(
        "CASE WHEN {elapsed} IS NOT NULL AND abs({now} - ({started} + {elapsed})) > {CLOCK_JUMP_MS}
                THEN {started} + {elapsed}
              WHEN {now} < {started} THEN {started} ELSE {now} END"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite() -> Conn {
        Conn::Sqlite(rusqlite::Connection::open_in_memory().unwrap())
    }

    /// `$N` takes the N-th value wherever it first appears and however often, as PostgreSQL
    /// reads the same text.
    #[test]
    fn numbered_parameters_take_their_values_by_number_not_by_place() {
        let c = sqlite();
        let got: (String, i64, String, i64) = c
            .query_row(
                "SELECT $3, $1, $2, $1 + 1",
                rusqlite::params![5, "b", "c"],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(got, ("c".into(), 5, "b".into(), 6));
        c.execute_batch("CREATE TABLE t (a, b)").unwrap();
        c.execute(
            "INSERT INTO t (b, a) VALUES ($2, $1)",
            rusqlite::params![1, 2],
        )
        .unwrap();
        let row: (i64, i64) = c
            .query_row("SELECT a, b FROM t", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!(row, (1, 2));
    }

    /// A value too few, a value too many (past the last the text takes), or a parameter of
    /// another kind than `$N` is an error, never a value bound to the wrong place.
    #[test]
    fn parameters_and_values_that_do_not_match_are_refused() {
        let c = sqlite();
        let one = |sql: &str, p: &[&dyn ToSql]| c.query_row(sql, p, |r| r.get::<_, i64>(0));
        assert!(one("SELECT $2", &[&1]).is_err());
        assert!(one("SELECT $1", &[&1, &2]).is_err());
        assert_eq!(one("SELECT $2", &[&1, &2]).unwrap(), 2, "$1 left out");
        assert!(one("SELECT :a", &[&1]).is_err());
        assert!(one("SELECT ?1", &[&1]).is_err());
        assert!(one("SELECT ?", &[&1]).is_err());
    }

    /// No statement of the manifest's names a parameter `?N`: SQLite would give a `?N` that
    /// follows a `$N` the `$N`'s place (which no binding can see), and PostgreSQL refuses it.
    /// (`mod.rs` runs SQLite's own migrations through rusqlite, not through [`Conn`].)
    #[test]
    fn the_manifests_statements_name_no_question_mark_parameter() {
        fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let path = e.path();
                if path.is_dir() {
                    files(&path, out);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    out.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/manifest");
        let mut all = Vec::new();
        files(&root, &mut all);
        assert!(all.len() > 20, "{all:?}");
        for path in all {
            if path == root.join("mod.rs") || path == root.join("db.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let bytes = text.as_bytes();
            for (at, pair) in bytes.windows(2).enumerate() {
                assert!(
                    !(pair[0] == b'?' && pair[1].is_ascii_digit()),
                    "{}: `?N` at byte {at}; the manifest's parameters are $1, $2, ...",
                    path.display()
                );
            }
        }
    }
}
