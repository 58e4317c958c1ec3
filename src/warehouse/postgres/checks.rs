//! The dry run's and `dags validate`'s checks: every statement prepared against the server as
//! it will run, writing nothing.

use super::*;

/// Checks a SQL task against the server before anything runs: the target and its partition
/// column exist, every statement prepares exactly as it will run, the query's columns fit the
/// target, and a table-wide unique key has an index to check it with. Writes nothing.
pub fn check(task: &SqlTask, gate: Option<&Gate>) -> std::result::Result<(), TaskProblem> {
    let wh = &task.warehouse;
    let problem = |key: &'static str| {
        move |message: String| TaskProblem {
            key,
            offset: None,
            rule: None,
            message,
        }
    };
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

pub(super) fn check_on(
    c: &mut Conn,
    task: &SqlTask,
    gate: Option<&Gate>,
) -> std::result::Result<(), TaskProblem> {
    let wh = &task.warehouse;
    let problem = |key: &'static str| {
        move |message: String| TaskProblem {
            key,
            offset: None,
            rule: None,
            message,
        }
    };
    let server = |key: &'static str| {
        move |e: tokio_postgres::Error| {
            problem(key)(format!(
                "warehouse `{}` ({}): {}",
                wh.name,
                wh.location(),
                describe(&e)
            ))
        }
    };
    let columns = target_columns(c, &task.target).map_err(server("target"))?;
    if columns.is_empty() {
        return Err(problem("target")(format!(
            "target table `{}` does not exist in warehouse `{}`; create it (schema-qualified names such as analytics.orders_fact work)",
            task.target, wh.name
        )));
    }
    match columns.iter().find(|(n, _)| *n == task.partition_column) {
        None => {
            return Err(problem("target")(format!(
                "target table `{}` has no column `{}` (partition_column)",
                task.target, task.partition_column
            )));
        }
        Some((_, ty)) if ColumnType::of(ty).is_none() => {
            return Err(problem("target")(format!(
                "partition_column `{}` of table `{}` is {ty}; it must be date, timestamp or timestamptz",
                task.partition_column, task.target
            )));
        }
        Some(_) => {}
    }
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
    // The insert itself, so that a column whose type does not fit the target's is found now;
    // preparing changes nothing.
    let list = out
        .iter()
        .map(|col| quote_ident(col))
        .collect::<Vec<_>>()
        .join(", ");
    c.wait(c.client.prepare_typed(
        &format!(
            "INSERT INTO {} ({list}) SELECT {list} FROM ({}) w",
            quote_name(&task.target),
            wrapped(&query.sql)
        ),
        &query.types(),
    ))
    .map_err(|e| TaskProblem {
        key: "sql",
        offset: None,
        rule: None,
        message: format!(
            "the query's rows do not fit target table `{}`: {}",
            task.target,
            describe(&e)
        ),
    })?;
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
    if let Some(g) = gate.filter(|g| !g.rules.is_empty()) {
        // `output` as the try will have it: the interval's rows of the target, the query's
        // columns.
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
                quote_name(&task.target)
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
        crate::warehouse::rules::check(&mut engine, &g.rules, &out, describe)
            .map_err(|(i, message)| crate::warehouse::rule_problem(i, message))?;
    }
    if let Some(g) =
        gate.filter(|g| (g.unique_key_table || task.write.is_merge()) && !g.unique_key.is_empty())
    {
        let indexed: bool = c
            .wait(c.client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass($1) \
                 AND (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(i.indkey[0:cardinality($2::text[]) - 1]) WITH ORDINALITY k(attnum, n) \
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) @> $2::text[] \
                 AND i.indnatts >= cardinality($2::text[]))",
                &[&quote_name(&task.target), &g.unique_key],
            ))
            .map_err(server("gate.unique_key"))?
            .get(0);
        if !indexed {
            return Err(problem("gate.unique_key")(format!(
                "{} looks the output's keys up in the whole table; create an index for it: CREATE INDEX ON {} ({})",
                if task.write.is_merge() {
                    "write = \"merge\""
                } else {
                    "unique_key_scope = \"table\""
                },
                task.target,
                g.unique_key.join(", ")
            )));
        }
    }
    Ok(())
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
