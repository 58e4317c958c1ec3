//! Published partitions read back: their rows and fingerprint, and the key-by-key difference
//! with a staged output.

use super::*;

/// The rows the target holds for the interval now, with their fingerprint over the columns
/// `cols` (those of the staged output), whatever the manifest recorded.
pub(crate) fn published(
    task: &SqlTask,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> Result<(i64, String)> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let result = (|| -> std::result::Result<(i64, String), Failure> {
        let (list, fp, lo, hi) = shape(&c, task, interval, tz, staged)?;
        let row = c.wait(c.client.query_one(
            &format!(
                "WITH p AS (SELECT {list} FROM {} WHERE {pc} >= $1 AND {pc} < $2) SELECT {}",
                quote_name(&task.target),
                fingerprint_sql(&fp, "p"),
                pc = quote_ident(&task.partition_column),
            ),
            &[lo.sql(), hi.sql()],
        ))?;
        let fingerprint: String = row.get(0);
        let rows = fingerprint
            .split(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok((rows, format!("pg:{fingerprint}")))
    })();
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// How many rows the target holds in each interval now.
pub(crate) fn partition_rows(
    task: &SqlTask,
    intervals: &[DataInterval],
    tz: chrono_tz::Tz,
) -> Result<Vec<i64>> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let result = (|| -> std::result::Result<Vec<i64>, Failure> {
        let ty = partition_type_now(&c, task)?;
        let sql = format!(
            "SELECT count(*) FROM {} WHERE {pc} >= $1 AND {pc} < $2",
            quote_name(&task.target),
            pc = quote_ident(&task.partition_column),
        );
        let mut rows = Vec::with_capacity(intervals.len());
        for &interval in intervals {
            let [lo, hi] = ty.bounds(interval, tz)?;
            rows.push(
                c.wait(c.client.query_one(&sql, &[lo.sql(), hi.sql()]))?
                    .get(0),
            );
        }
        Ok(rows)
    })();
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// The staged table's columns as a select list, and the interval's bounds on the partition
/// column.
pub(super) fn shape(
    c: &Conn,
    task: &SqlTask,
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> std::result::Result<(String, String, Value, Value), Failure> {
    let cols = target_columns(c, staged)?;
    if cols.is_empty() {
        return Err(Error::Message(format!(
            "the staged output {staged} is gone; stage the interval again"
        ))
        .into());
    }
    let ty = partition_type_now(c, task)?;
    let [lo, hi] = ty.bounds(interval, tz)?;
    let list = cols
        .iter()
        .map(|(n, _)| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ");
    let fp = row_hash(&cols);
    Ok((list, fp, lo, hi))
}

/// What promoting the staged output in `staged` would change in the interval's published rows,
/// by the unique key `key`: computed in the server.
pub(crate) fn diff_keys(
    task: &SqlTask,
    key: &[String],
    interval: DataInterval,
    tz: chrono_tz::Tz,
    staged: &str,
) -> Result<Option<crate::warehouse::diff::KeyDiff>> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let result = (|| -> std::result::Result<Option<crate::warehouse::diff::KeyDiff>, Failure> {
        if target_columns(&c, staged)?.is_empty() {
            return Ok(None);
        }
        let (list, _, lo, hi) = shape(&c, task, interval, tz, staged)?;
        let k = key
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let with = format!(
            "WITH p AS (SELECT {list} FROM {} WHERE {pc} >= $1 AND {pc} < $2), s AS (SELECT {list} FROM {staged})",
            quote_name(&task.target),
            pc = quote_ident(&task.partition_column),
        );
        let sets = [
            format!("SELECT {k} FROM s EXCEPT SELECT {k} FROM p"),
            format!("SELECT {k} FROM p EXCEPT SELECT {k} FROM s"),
            format!(
                // Rows compared by their text, as fingerprints compare them: a type without
                // an equality operator (json) compares too.
                "SELECT {k} FROM (SELECT {k}, ROW(s.*)::text FROM s EXCEPT SELECT {k}, ROW(p.*)::text FROM p) x \
                 INTERSECT SELECT {k} FROM p"
            ),
        ];
        let order = (1..=key.len())
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = crate::warehouse::diff::KeyDiff::default();
        for (n, set) in sets.iter().enumerate() {
            let count: i64 = c
                .wait(c.client.query_one(
                    &format!("{with} SELECT count(*) FROM ({set}) d"),
                    &[lo.sql(), hi.sql()],
                ))?
                .get(0);
            let rows = c.wait(c.client.query(
                &format!(
                    "{with} SELECT to_jsonb(d)::text FROM (SELECT * FROM ({set}) e ORDER BY {order} LIMIT {}) d",
                    crate::warehouse::diff::EXAMPLES
                ),
                &[lo.sql(), hi.sql()],
            ))?;
            let examples = rows
                .iter()
                .map(|r| {
                    let doc: String = r.get(0);
                    let values: Vec<serde_json::Value> = match serde_json::from_str::<
                        serde_json::Map<String, serde_json::Value>,
                    >(&doc)
                    {
                        Ok(m) => key
                            .iter()
                            .map(|k| m.get(k).cloned().unwrap_or(serde_json::Value::Null))
                            .collect(),
                        Err(_) => Vec::new(),
                    };
                    match values.as_slice() {
                        [one] => one.clone(),
                        _ => serde_json::Value::Array(values),
                    }
                })
                .collect();
            match n {
                0 => (out.added, out.examples.added) = (count, examples),
                1 => (out.removed, out.examples.removed) = (count, examples),
                _ => (out.changed, out.examples.changed) = (count, examples),
            }
        }
        Ok(Some(out))
    })();
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// The task's query's columns.
pub(super) fn query_columns(
    c: &mut Conn,
    task: &SqlTask,
) -> std::result::Result<Vec<String>, Failure> {
    let query = Statement::new("sql", &task.sql, 1).map_err(|p| Error::Message(p.message))?;
    let subquery = wrapped(&query.sql);
    let shape = prepared(c, &subquery, &query.types())?;
    Ok(shape
        .columns()
        .iter()
        .map(|col| col.name().to_string())
        .collect())
}
