//! The gate's rules on a PostgreSQL warehouse (see [`crate::warehouse::rules`]): `output` is
//! the interval's rows as the try's open transaction just wrote them (into the target, its
//! staged table or a temporary one), read through the same partition range the try's delete
//! used; a check's named parameters are bound after the range's two.

use super::*;
use crate::warehouse::rules::Engine;

pub(super) struct PgRules<'a> {
    pub(super) c: &'a mut Conn,
    /// `output`, a query over `$1` and `$2`, the partition's bounds.
    pub(super) output: String,
    pub(super) bounds: [Value; 2],
    pub(super) bound_type: Type,
    pub(super) binds: &'a Binds,
    pub(super) tz: chrono_tz::Tz,
    /// Whether the statements may be kept prepared: `output` names the same table in every
    /// try (a staged or temporary table is new each time).
    pub(super) keep: bool,
    /// The parameters of the checks in the statement being built.
    params: Vec<Param>,
}

impl<'a> PgRules<'a> {
    pub(super) fn new(
        c: &'a mut Conn,
        output: String,
        bounds: [Value; 2],
        bound_type: Type,
        binds: &'a Binds,
        tz: chrono_tz::Tz,
        keep: bool,
    ) -> Self {
        Self {
            c,
            output,
            bounds,
            bound_type,
            binds,
            tz,
            keep,
            params: Vec::new(),
        }
    }

    /// The values of the next statement's parameters: the partition's bounds, then the
    /// checks' (taken: the next statement starts without any).
    fn values(&mut self) -> Vec<Value> {
        let mut values: Vec<Value> = self.bounds.to_vec();
        values.extend(
            std::mem::take(&mut self.params)
                .into_iter()
                .map(|p| Value::of(p, self.binds, self.tz)),
        );
        values
    }

    /// The statement of `body` with `output` defined, and its parameters' values.
    fn statement(&mut self, body: &str) -> std::result::Result<tokio_postgres::Statement, Failure> {
        let sql = format!("WITH output AS ({}){body}", self.output);
        let mut types = vec![self.bound_type.clone(), self.bound_type.clone()];
        types.extend(self.params.iter().map(|p| match p.pg_type() {
            "timestamptz" => Type::TIMESTAMPTZ,
            "date" => Type::DATE,
            _ => Type::TEXT,
        }));
        Ok(if self.keep {
            prepared(self.c, &sql, &types)?
        } else {
            self.c.wait(self.c.client.prepare_typed(&sql, &types))?
        })
    }
}

impl Engine for PgRules<'_> {
    type Error = Failure;

    fn dialect(&self) -> crate::query::Dialect {
        crate::query::Dialect::Postgres
    }

    fn texts_undone(
        &mut self,
        body: &str,
    ) -> std::result::Result<Vec<Vec<Option<String>>>, Failure> {
        let stmt = self.statement(body)?;
        let values = self.values();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
        // The savepoint, the statement and the rollback to it in one round trip, in order:
        // after a statement that failed, the rollback makes the transaction usable again.
        let (began, rows, undone) = self.c.wait(async {
            Ok::<_, tokio_postgres::Error>(tokio::join!(
                self.c.client.batch_execute("SAVEPOINT backfill_check"),
                self.c.client.query(&stmt, &refs),
                self.c.client.batch_execute(
                    "ROLLBACK TO SAVEPOINT backfill_check; RELEASE SAVEPOINT backfill_check"
                ),
            ))
        })?;
        began?;
        let rows = rows?;
        undone?;
        Ok(texts_of(&rows))
    }

    fn check(&mut self, sql: &str) -> std::result::Result<String, Failure> {
        let p = positional_from(strip(sql), 3 + self.params.len())
            .map_err(|e| Error::Message(format!("a check's query: {}", e.message)))?;
        self.params.extend(p.params);
        Ok(p.sql)
    }

    fn texts(&mut self, body: &str) -> std::result::Result<Vec<Vec<Option<String>>>, Failure> {
        let stmt = self.statement(body)?;
        let values = self.values();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
        let rows = self.c.wait(self.c.client.query(&stmt, &refs))?;
        Ok(texts_of(&rows))
    }

    fn columns(&mut self, body: &str) -> std::result::Result<Vec<String>, Failure> {
        let stmt = self.statement(body)?;
        self.params.clear();
        Ok(stmt
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect())
    }
}

/// Rows whose every column is text or `NULL`, as [`Engine::texts`] gives them.
fn texts_of(rows: &[tokio_postgres::Row]) -> Vec<Vec<Option<String>>> {
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.get::<_, Option<String>>(i))
                .collect()
        })
        .collect()
}
