//! The dry run's and `dags validate`'s checks: every statement prepared against the server as
//! it will run, writing nothing.

use super::*;

/// Checks a SQL task against the server before anything runs: the target and its partition
/// column exist, every statement prepares exactly as it will run, the query's columns fit the
/// target, and a table-wide unique key has an index to check it with. Writes nothing.
pub(crate) fn check(task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
    let wh = &task.warehouse;
    let mut c = conn::take(wh)
        .map_err(|e| problem("sql")(format!("warehouse `{}` ({}): {e}", wh.name, wh.location())))?;
    crate::fault::point("warehouse-check");
    // A server that stops answering (a network that hangs) does not hold the checks up for
    // ever: past three connection attempts' time they are cancelled, and the connection is
    // given up when the cancel goes unanswered too (see `pg::conn::GIVE_UP_AFTER_CANCEL`).
    let bound = c.attempt_bound() * 3;
    let cancel = c.canceller();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = finished.recv_timeout(bound) == Err(std::sync::mpsc::RecvTimeoutError::Timeout);
        if late {
            cancel();
        }
        late
    });
    let result = check_on(&mut c, task, gate);
    let _ = done.send(());
    let late = watchdog.join().unwrap_or(false);
    conn::give(c);
    result.map_err(|p| {
        if late {
            TaskProblem {
                message: format!(
                    "warehouse `{}` ({}) did not answer the checks within {}: {}",
                    wh.name,
                    wh.location(),
                    humantime::format_duration(bound),
                    p.message
                ),
                ..p
            }
        } else {
            p
        }
    })
}

/// The checks of [`check`], on `c`, in order: the target, the task's query, the columns it must
/// return, the gate's source queries, its rules, and the index a key looked up in the whole
/// table needs. The first that fails says why.
pub(super) fn check_on(
    c: &mut Conn,
    task: &SqlTask,
    gate: Option<&Gate>,
) -> std::result::Result<(), TaskProblem> {
    let columns = check_target(c, task)?;
    let out = check_query(c, task, &columns)?;
    check_returns_keys(task, gate, &out)?;
    check_source_queries(c, gate)?;
    if let Some(g) = gate.filter(|g| !g.rules.is_empty()) {
        check_rules(c, task, g, &columns, &out)?;
    }
    if let Some(g) =
        gate.filter(|g| (g.unique_key_table || task.write.is_merge()) && !g.unique_key.is_empty())
    {
        check_key_index(c, task, g)?;
    }
    Ok(())
}

/// A problem of the task at key `key`, from its message.
fn problem(key: &'static str) -> impl Fn(String) -> TaskProblem {
    move |message: String| TaskProblem {
        key,
        offset: None,
        rule: None,
        message,
    }
}

/// A problem at key `key` that the server of warehouse `wh` reported.
fn server(wh: &Warehouse, key: &'static str) -> impl Fn(tokio_postgres::Error) -> TaskProblem {
    move |e: tokio_postgres::Error| {
        problem(key)(format!(
            "warehouse `{}` ({}): {}",
            wh.name,
            wh.location(),
            describe(&e)
        ))
    }
}

/// The target exists and its partition column is a date, timestamp or timestamptz: the
/// target's columns, with their types.
fn check_target(
    c: &Conn,
    task: &SqlTask,
) -> std::result::Result<Vec<(String, String)>, TaskProblem> {
    let wh = &task.warehouse;
    let columns = target_columns(c, &task.target).map_err(server(wh, "target"))?;
    if columns.is_empty() {
        return Err(problem("target")(format!(
            "target table `{}` does not exist in warehouse `{}`; create it (schema-qualified names such as analytics.orders_fact work)",
            task.target, wh.name
        )));
    }
    match columns.iter().find(|(n, _)| *n == task.partition_column) {
        None => Err(problem("target")(format!(
            "target table `{}` has no column `{}` (partition_column)",
            task.target, task.partition_column
        ))),
        Some((_, ty)) if ColumnType::of(ty).is_none() => Err(problem("target")(format!(
            "partition_column `{}` of table `{}` is {ty}; it must be date, timestamp or timestamptz",
            task.partition_column, task.target
        ))),
        Some(_) => Ok(columns),
    }
}

/// The task's query prepares as it will run, the target has each of its columns, and its
/// insert into the target prepares too (so that a column whose type does not fit the
/// target's is found now; preparing changes nothing): the query's columns.
fn check_query(
    c: &Conn,
    task: &SqlTask,
    columns: &[(String, String)],
) -> std::result::Result<Vec<String>, TaskProblem> {
    let query = Statement::new("sql", &task.sql, 1)?;
    let subquery = wrapped(&query.sql);
    let lead = task.sql.len() - task.sql.trim_start().len();
    let stmt = c
        .wait(c.client.prepare_typed(&subquery, &query.types()))
        .map_err(|e| {
            not_prepared(
                "sql",
                &e,
                strip(&task.sql),
                &query.sql,
                WRAPPED_BEFORE.len(),
                lead,
            )
        })?;
    let out: Vec<String> = stmt
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let have: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
    for col in &out {
        if !have.contains(&col.as_str()) {
            return Err(problem("sql")(format!(
                "the query returns column `{col}`, which target table `{}` does not have (it has: {})",
                task.target,
                have.join(", ")
            )));
        }
    }
    c.wait(c.client.prepare_typed(
        &format!(
            "INSERT INTO {} ({list}) SELECT {list} FROM ({}) w",
            quote_name(&task.target),
            wrapped(&query.sql),
            list = quoted_list(&out),
        ),
        &query.types(),
    ))
    .map_err(|e| {
        problem("sql")(format!(
            "the query's rows do not fit target table `{}`: {}",
            task.target,
            describe(&e)
        ))
    })?;
    Ok(out)
}

/// The query's columns, quoted, in a list.
fn quoted_list(out: &[String]) -> String {
    out.iter()
        .map(|col| quote_ident(col))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The query's columns `out` have the partition column and the gate's unique key.
fn check_returns_keys(
    task: &SqlTask,
    gate: Option<&Gate>,
    out: &[String],
) -> std::result::Result<(), TaskProblem> {
    let mut needed = vec![&task.partition_column];
    if let Some(g) = gate {
        needed.extend(g.unique_key.iter());
    }
    for col in needed {
        if !out.contains(col) {
            return Err(problem("sql")(format!(
                "the query must return column `{col}` (partition_column or unique_key); it returns: {}",
                out.join(", ")
            )));
        }
    }
    Ok(())
}

/// The gate's `source_count` and `source_fingerprint` queries prepare, and return one column.
fn check_source_queries(c: &Conn, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
    let queries = gate.into_iter().flat_map(|g| {
        [
            ("gate.source_count", &g.source_count),
            ("gate.source_fingerprint", &g.source_fingerprint),
        ]
    });
    for (key, query) in queries {
        let Some(SourceCount::Sql(sql)) = query else {
            continue;
        };
        let s = Statement::new(key, sql, 1)?;
        let stmt = c
            .wait(c.client.prepare_typed(&s.sql, &s.types()))
            .map_err(|e| {
                not_prepared(
                    key,
                    &e,
                    strip(sql),
                    &s.sql,
                    0,
                    sql.len() - sql.trim_start().len(),
                )
            })?;
        if stmt.columns().len() != 1 {
            return Err(problem(key)(format!(
                "key `{key}` must return exactly one column"
            )));
        }
    }
    Ok(())
}

/// The gate's rules prepare over `output` as the try will have it: the interval's rows of the
/// target (of `columns`), the query's columns (`out`).
fn check_rules(
    c: &mut Conn,
    task: &SqlTask,
    g: &Gate,
    columns: &[(String, String)],
    out: &[String],
) -> std::result::Result<(), TaskProblem> {
    let pc = quote_ident(&task.partition_column);
    let ty = columns
        .iter()
        .find(|(n, _)| *n == task.partition_column)
        .and_then(|(_, ty)| ColumnType::of(ty))
        .map_or(Type::TIMESTAMPTZ, ColumnType::pg_type);
    let binds = Binds::new(DataInterval::EPOCH_DAY, chrono_tz::UTC);
    let mut engine = PgRules::new(
        c,
        format!(
            "SELECT {list} FROM {} WHERE {pc} >= $1 AND {pc} < $2",
            quote_name(&task.target),
            list = quoted_list(out),
        ),
        [Value::Int(0), Value::Int(0)],
        ty,
        &binds,
        chrono_tz::UTC,
        false,
    );
    let describe = |f: &Failure| match f {
        Failure::Pg(e) => describe(e),
        Failure::Other(e) => e.to_string(),
    };
    crate::warehouse::rules::check(&mut engine, &g.rules, out, describe)
        .map_err(|(i, message)| crate::warehouse::rule_problem(i, message))
}

/// The target has an index that serves the gate's unique key, which a merge or a table-wide
/// key (`unique_key_scope = "table"`) looks the output's keys up in the whole table with.
fn check_key_index(c: &Conn, task: &SqlTask, g: &Gate) -> std::result::Result<(), TaskProblem> {
    let indexed: bool = c
        .wait(c.client.query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass($1) \
             AND (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(i.indkey[0:cardinality($2::text[]) - 1]) WITH ORDINALITY k(attnum, n) \
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) @> $2::text[] \
             AND i.indnatts >= cardinality($2::text[]))",
            &[&quote_name(&task.target), &g.unique_key],
        ))
        .map_err(server(&task.warehouse, "gate.unique_key"))?
        .get(0);
    if indexed {
        return Ok(());
    }
    Err(problem("gate.unique_key")(format!(
        "{} looks the output's keys up in the whole table; create an index for it: CREATE INDEX ON {} ({})",
        if task.write.is_merge() {
            "write = \"merge\""
        } else {
            "unique_key_scope = \"table\""
        },
        task.target,
        g.unique_key.join(", ")
    )))
}

/// A statement of key `key` the server would not prepare: its message, and where it points in
/// the task's text when the rewrite did not move that place (no parameter before it).
pub(super) fn not_prepared(
    key: &'static str,
    e: &tokio_postgres::Error,
    original: &str,
    rewritten: &str,
    before: usize,
    lead: usize,
) -> TaskProblem {
    let offset = e.as_db_error().and_then(|db| match db.position() {
        Some(ErrorPosition::Original(p)) => {
            // A character position, 1-based, in the statement sent.
            let chars = usize::try_from(*p).ok()?.checked_sub(1)?;
            let sent = format!("{}{rewritten}", &WRAPPED_BEFORE[..before]);
            let byte = sent.char_indices().nth(chars).map(|(b, _)| b)?;
            let at = byte.checked_sub(before)?;
            (rewritten.get(..at)? == original.get(..at)?).then_some(at + lead)
        }
        _ => None,
    });
    TaskProblem {
        key,
        offset,
        rule: None,
        message: format!("key `{key}` does not prepare: {}", describe(e)),
    }
}
