//! Batches on PostgreSQL: the task's query runs once over a batch's whole range into an
//! unlogged table of the `backfill` schema, each row with the index of the interval its
//! partition value falls in (-1 for none), and the gate's source queries run for each interval
//! in the same REPEATABLE READ snapshot. Each interval's try then writes its share from that
//! table as it would write the query's rows (see [`write_measure`]): the same delete, insert,
//! measures, booking and open transaction that the gate's verdict publishes or rolls back.
//!
//! The connection that made the table holds a session advisory lock named by it until the batch
//! is dropped, which drops the table: a table whose lock is free belongs to a process that
//! died, and [`sweep`] drops it.

use super::*;
use crate::warehouse::backend::Batched;

/// The batch table's column that holds each row's interval.
pub(super) const PART: &str = "backfill batch part";

/// The prefix of batch tables in the `backfill` schema.
const PREFIX: &str = "batch_";

/// A computed batch: its table and the connection that holds it.
struct PgBatch {
    holder: Option<Conn>,
    warehouse: Warehouse,
    table: String,
    lock: i64,
    columns: Vec<String>,
    looked: Vec<(Option<i64>, Option<String>)>,
}

/// The advisory lock key of a batch table (FNV-1a of its name).
fn lock_of(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}

pub(super) fn write_batch(
    task: &SqlTask,
    gate: Option<&Gate>,
    intervals: &[DataInterval],
    tz: chrono_tz::Tz,
    cancel: &Cancel,
) -> Result<Box<dyn Batched>> {
    let wh = &task.warehouse;
    let Some(span) = DataInterval::span(intervals) else {
        return Err(Error::Message("a batch of no intervals".into()));
    };
    let mut c = conn::take_at(wh)?;
    cancel.on_set(c.canceller())?;
    let name = format!(
        "{PREFIX}{}",
        try_mark(i64::from(std::process::id()) ^ span.start.timestamp())
    );
    let table = format!("backfill.{}", quote_ident(&name));
    let lock = lock_of(&name);
    let whole = Binds::new(span, tz);
    let computed = compute(
        &mut c, task, gate, intervals, &whole, tz, &table, lock, cancel,
    );
    match computed {
        Ok((columns, looked)) => Ok(Box::new(PgBatch {
            holder: Some(c),
            warehouse: wh.clone(),
            table,
            lock,
            columns,
            looked,
        })),
        Err(e) => {
            let _ = c.wait(c.client.batch_execute(&format!(
                "ROLLBACK; DROP TABLE IF EXISTS {table}; SELECT pg_advisory_unlock({lock})"
            )));
            conn::give(c);
            Err(e.at(wh))
        }
    }
}

/// Makes the batch's table and runs the source queries: the query's columns, and what each
/// interval's source queries gave.
#[expect(
    clippy::too_many_arguments,
    clippy::type_complexity,
    reason = "the batch's connection, task, gate, intervals and cancel as write_batch has them, and the columns and source answers it returns"
)]
fn compute(
    c: &mut Conn,
    task: &SqlTask,
    gate: Option<&Gate>,
    intervals: &[DataInterval],
    whole: &Binds,
    tz: chrono_tz::Tz,
    table: &str,
    lock: i64,
    cancel: &Cancel,
) -> std::result::Result<(Vec<String>, Vec<(Option<i64>, Option<String>)>), Failure> {
    book(c)?;
    let ty = partition_type(c, task)?;
    let query = Statement::new("sql", &task.sql, 1).map_err(|p| Error::Message(p.message))?;
    let types = query.types();
    let values = query.values(whole, tz);
    let shape = prepared(c, &wrapped(&query.sql), &types)?;
    let columns: Vec<String> = shape
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let list = columns
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let pc = quote_ident(&task.partition_column);
    let cast = match ty {
        ColumnType::Date => "date",
        ColumnType::Timestamp => "timestamp",
        ColumnType::Timestamptz => "timestamptz",
    };
    // A batch's intervals meet end to start: their starts and the last end are the thresholds
    // of `width_bucket`, which finds a row's interval by binary search. Its bucket (1 for the
    // earliest) maps to the interval's index in the batch; a row before, after or NULL to -1.
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by_key(|&k| intervals[k].start);
    let mut thresholds = Vec::with_capacity(intervals.len() + 1);
    for (n, &k) in order.iter().enumerate() {
        let [lo, hi] = ty.bounds(intervals[k], tz)?;
        thresholds.push(literal(&lo, cast));
        if n + 1 == order.len() {
            thresholds.push(literal(&hi, cast));
        }
    }
    let indexes = order
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let cases = format!(
        "coalesce((ARRAY[{indexes}]::int8[])[width_bucket(CAST(q.{pc} AS {cast}), ARRAY[{}]::{cast}[])], -1)",
        thresholds.join(", ")
    );
    let part = quote_ident(PART);
    if cancel.is_set() {
        return Err(Error::Cancelled.into());
    }
    // The table is shaped as the target holds the query's columns (no parameters in a
    // CREATE TABLE AS), then filled in the batch's snapshot.
    c.wait(
        c.client
            .batch_execute(&format!("SELECT pg_advisory_lock({lock})")),
    )?;
    c.wait(c.client.batch_execute(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; \
         CREATE UNLOGGED TABLE {table} AS SELECT {list} FROM {target} WITH NO DATA; \
         ALTER TABLE {table} ADD COLUMN {part} int8",
        target = quote_name(&task.target),
    )))?;
    let insert = format!(
        "INSERT INTO {table} ({list}, {part}) SELECT {list}, {cases} FROM (\n{}\n) q",
        query.sql
    );
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
    let statement = c.wait(c.client.prepare_typed(&insert, &types))?;
    c.wait(c.client.execute(&statement, &refs))?;
    c.wait(
        c.client
            .batch_execute(&format!("CREATE INDEX ON {table} ({part})")),
    )?;
    let strays: i64 = c
        .wait(c.client.query_one(
            &format!("SELECT count(*) FROM {table} WHERE {part} = -1"),
            &[],
        ))?
        .get(0);
    if strays > 0 {
        return Err(Error::Message(crate::warehouse::audit::stray_rows(
            strays,
            &task.partition_column,
        ))
        .into());
    }
    let mut looked = Vec::with_capacity(intervals.len());
    for interval in intervals {
        let binds = Binds::new(*interval, tz);
        let (mut types, mut values) = (Vec::new(), Vec::new());
        let [count, fingerprint] = source_queries(gate, &binds, tz, &mut types, &mut values)?;
        let row = if types.is_empty() {
            c.wait(
                c.client
                    .query_one(&format!("SELECT {count}, {fingerprint}"), &[]),
            )?
        } else {
            let s = prepared(c, &format!("SELECT {count}, {fingerprint}"), &types)?;
            let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
            c.wait(c.client.query_one(&s, &refs))?
        };
        looked.push((counted(gate, row.get(0))?, row.get(1)));
    }
    c.wait(c.client.batch_execute("COMMIT"))?;
    Ok((columns, looked))
}

/// A bound as a SQL literal of type `cast` (values this program made, never a user's text).
fn literal(v: &Value, cast: &str) -> String {
    let text = match v {
        Value::Date(d) => d.to_string(),
        Value::Naive(t) => t.format("%Y-%m-%d %H:%M:%S%.f").to_string(),
        Value::At(t) => t.to_rfc3339(),
        Value::Int(n) => n.to_string(),
        Value::Text(t) => t.replace('\'', "''"),
    };
    format!("'{text}'::{cast}")
}

impl Batched for PgBatch {
    fn share(&self, w: &Write<'_>, k: usize, cancel: &Cancel) -> Result<Box<dyn Pending>> {
        let Some((source, source_fingerprint)) = self.looked.get(k).cloned() else {
            return Err(Error::Message(format!("the batch has no interval {k}")));
        };
        let from = FromBatch {
            table: &self.table,
            columns: &self.columns,
            k: i64::try_from(k).unwrap_or(i64::MAX),
            source,
            source_fingerprint,
        };
        write_try(w, cancel, Some(&from))
    }
}

impl Drop for PgBatch {
    fn drop(&mut self) {
        if let Some(c) = self.holder.take() {
            let dropped = c.wait(c.client.batch_execute(&format!(
                "DROP TABLE IF EXISTS {}; SELECT pg_advisory_unlock({})",
                self.table, self.lock
            )));
            if let Err(e) = dropped {
                tracing::warn!(warehouse = %self.warehouse.name, table = %self.table, "cannot drop a batch's table (the next recovery drops it): {}", describe(&e));
            }
            conn::give(c);
        }
    }
}

/// Drops the batch tables of processes that died (their lock is free): how many.
pub(super) fn sweep(w: &Warehouse) -> Result<usize> {
    sweep_tables(w, PREFIX, |c, name| {
        let lock = lock_of(name);
        let free: bool = c
            .wait(
                c.client
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&lock]),
            )?
            .get(0);
        if free {
            // Let go at once: the table is dropped next, and a new batch's name is new.
            c.wait(
                c.client
                    .query_one("SELECT pg_advisory_unlock($1)", &[&lock]),
            )?;
        }
        Ok(free)
    })
}
