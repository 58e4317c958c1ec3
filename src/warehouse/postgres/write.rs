//! A try's transaction: the partition's delete, the output's insert and its measures in one
//! round trip, and the open transaction that the gate's verdict publishes or rolls back.

use super::*;

/// The try's transaction up to the gate, in one round trip and one snapshot: delete the
/// interval's rows of the target (moving them to the kept table when versions are kept), then,
/// in a statement of its own so that a key of the target is free again before it is inserted,
/// insert the query's rows and measure them and the source; then check the target's deferred
/// constraints, so that the gate hears of a violation before it judges, not the commit after.
///
/// A merge task (`write = "merge"`) writes its output to a temporary table shaped like the
/// target instead, measured the same, and merges it into the partition in the same round trip
/// (see [`super::merge`]): its counts go with the measures for the gate.
///
/// With `refused` (the target's constraint refused the output in an earlier pass, with this
/// message), and for a try that is only measured, the output goes to a temporary table shaped
/// like the target instead, and the target is neither changed nor locked: the measures are the
/// same, and `refused` goes with them for the gate.
///
/// With `batch`, the rows are the interval's share of a batch's table (see [`super::batch`])
/// instead of the task's query, and the source's measures are what the batch's snapshot gave.
pub(super) fn write_measure(
    c: &mut Conn,
    w: &Write<'_>,
    cancel: &Cancel,
    refused: Option<&str>,
    batch: Option<&FromBatch<'_>>,
) -> std::result::Result<(AuditMeasures, Written), Failure> {
    // Measured apart from the target: nothing is deleted, locked or booked.
    let apart = w.measure_only || refused.is_some();
    if !apart {
        book(c)?;
    }
    let (out, mut params) = Output::of(c, w, batch, apart)?;
    let sources = source_measures(w, batch, &mut params)?;
    let replaces = out.staged.is_none() && !apart;
    let kept = if replaces && w.task.keep_versions > 0 {
        Some(versions::ensure_kept(c, w.manifest, &w.task.target)?)
    } else {
        None
    };
    let change = if !replaces {
        Change::Apart
    } else if let Some(merging) = out.merging_from(&out.scratch, Some(DELETE_GUARD)) {
        // Into the target, from the temporary table, in this transaction.
        Change::Merge(merging)
    } else {
        Change::Replace(delete_sql(c, &out, kept.as_deref())?)
    };
    let measuring = Measuring::new(w, &out, &change, sources, params);
    if cancel.is_set() {
        return Err(Error::Cancelled.into());
    }
    let wrote = match &change {
        Change::Merge(merging) => merge_in_try(c, w, &out, merging, kept.as_deref(), &measuring)?,
        Change::Apart => write_apart(c, &out, &measuring)?,
        Change::Replace(delete) => replace_in_try(c, w, delete, kept.as_deref(), &measuring)?,
    };
    crate::fault::point("before-source-count");
    let mut m = measures(w, &out, refused, &wrote)?;
    if let Some(g) = w.gate.filter(|g| !g.rules.is_empty()) {
        m.found = run_rules(c, w, g, &out, &measuring.params, m.rows, wrote.row.get(9))?;
    }
    if wrote.moved.is_some() {
        c.has_versions = Some(true);
    }
    Ok((
        m,
        Written {
            moved: wrote.moved,
            columns: out.columns,
        },
    ))
}

/// What a try writes and where: the rows of its query (or of its share of a batch), their
/// columns as the target's types hold them, and the table that receives them.
struct Output<'a> {
    task: &'a SqlTask,
    /// `write = "merge"`: the key, and whether the partition's keys the output lacks stay.
    merge: Option<(&'a [String], bool)>,
    /// The rows' query (see [`output_query`]).
    query: String,
    /// The query's columns; as the target's types hold them; quoted, in a list.
    columns: Vec<String>,
    typed: Vec<(String, String)>,
    list: String,
    /// The target and its partition column, quoted.
    table: String,
    pc: String,
    /// The table of a staged output, and the temporary table of one measured apart or merged.
    staged: Option<String>,
    scratch: String,
    /// Measured apart from the target.
    apart: bool,
}

impl<'a> Output<'a> {
    /// The output of try `w`, and the parameters of its statement so far: the interval's
    /// bounds as values of the partition column (`$1` and `$2`), then the query's.
    fn of(
        c: &mut Conn,
        w: &Write<'a>,
        batch: Option<&FromBatch<'_>>,
        apart: bool,
    ) -> std::result::Result<(Self, Params), Failure> {
        let task = w.task;
        let merge = match &task.write {
            WritePattern::Merge { key, keep_missing } => Some((key.as_slice(), *keep_missing)),
            WritePattern::Replace => None,
        };
        let ty = partition_type(c, task)?;
        let query = output_query(w, batch)?;
        let columns = query_columns(c, &query)?;
        let [lo, hi] = ty.bounds(w.binds.interval, w.tz)?;
        let list = columns
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        // The output's rows are hashed as the target's types hold them (what `RETURNING` gives,
        // and what verify, promote and kept versions hash later), not as the query's types.
        let target_types = cached_columns(c, &task.target)?;
        let typed = merge::typed(&target_types, &columns);
        let col_type = ty.pg_type();
        let mut params = Params {
            types: vec![col_type.clone(), col_type],
            values: vec![lo, hi],
        };
        params.types.extend(query.types);
        params.values.extend(query.values);
        let out = Self {
            task,
            merge,
            query: query.sql,
            scratch: scratch_table(&task.target, &typed),
            columns,
            typed,
            list,
            table: quote_name(&task.target),
            pc: quote_ident(&task.partition_column),
            staged: w.stage.then(|| staged_table(w.manifest, w.try_id)),
            apart,
        };
        Ok((out, params))
    }

    /// Where the rows go. A staged output goes to a table of its own, a measured one to a
    /// temporary table; the target is not touched. A merge's output goes to the temporary table
    /// too, to be merged into the target from there.
    fn dest(&self) -> &str {
        match &self.staged {
            Some(name) => name.as_str(),
            None if self.apart || self.merge.is_some() => self.scratch.as_str(),
            None => &self.table,
        }
    }

    /// A merge of the output, read from `source` (see `super::merge`).
    fn merging_from(
        &self,
        source: &str,
        guard: Option<&'static str>,
    ) -> Option<merge::Merging<'_>> {
        self.merge.map(|(key, keep_missing)| merge::Merging {
            table: self.table.clone(),
            source: source.to_string(),
            columns: &self.typed,
            key,
            partition_column: &self.task.partition_column,
            keep_missing,
            guard,
        })
    }
}

/// The parameters of a try's statement, their types and values in order.
struct Params {
    types: Vec<Type>,
    values: Vec<Value>,
}

impl Params {
    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values.iter().map(Value::sql).collect()
    }

    /// The values with their types, for the statements that are not kept prepared.
    fn typed_refs(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        self.values
            .iter()
            .map(Value::sql)
            .zip(self.types.iter().cloned())
            .collect()
    }
}

/// The rows a try writes, with the types and values of their parameters from `$3` on.
struct Query {
    sql: String,
    types: Vec<Type>,
    values: Vec<Value>,
}

/// The task's query; with `batch`, the interval's share of the batch's table instead.
fn output_query(
    w: &Write<'_>,
    batch: Option<&FromBatch<'_>>,
) -> std::result::Result<Query, Failure> {
    Ok(match batch {
        None => {
            let query =
                Statement::new("sql", &w.task.sql, 3).map_err(|p| Error::Message(p.message))?;
            let (types, values) = (query.types(), query.values(w.binds, w.tz));
            Query {
                sql: query.sql,
                types,
                values,
            }
        }
        Some(b) => Query {
            sql: format!(
                "SELECT {} FROM {} WHERE {} IN ($3, -1)",
                b.columns
                    .iter()
                    .map(|c| quote_ident(c))
                    .collect::<Vec<_>>()
                    .join(", "),
                b.table,
                quote_ident(super::batch::PART)
            ),
            types: vec![Type::INT8],
            values: vec![Value::Int(b.k)],
        },
    })
}

/// The columns of `query`, as the server prepares it.
fn query_columns(c: &mut Conn, query: &Query) -> std::result::Result<Vec<String>, Failure> {
    let mut shape_types = vec![Type::TEXT, Type::TEXT];
    shape_types.extend(query.types.iter().cloned());
    let shape = prepared(c, &wrapped(&query.sql), &shape_types)?;
    Ok(shape
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect())
}

/// The source's measures as SQL of the try's statement: the gate's source queries, their
/// parameters added to `params`; for a batch's share, what the batch's snapshot gave.
fn source_measures(
    w: &Write<'_>,
    batch: Option<&FromBatch<'_>>,
    params: &mut Params,
) -> std::result::Result<[String; 2], Failure> {
    let Some(b) = batch else {
        return source_queries(w.gate, w.binds, w.tz, &mut params.types, &mut params.values);
    };
    Ok([
        b.source
            .map_or_else(|| "NULL::int8".to_string(), |n| format!("{n}::int8")),
        match &b.source_fingerprint {
            None => "NULL::text".to_string(),
            Some(fp) => {
                params.types.push(Type::TEXT);
                params.values.push(Value::Text(fp.clone()));
                format!("${}::text", params.types.len())
            }
        },
    ])
}

/// What a try's transaction does to the target.
enum Change<'a> {
    /// Nothing: the output is staged, or measured apart, in a table of its own.
    Apart,
    /// The output, written to the temporary table, is merged into the partition from there.
    Merge(merge::Merging<'a>),
    /// The partition's rows are deleted by this statement (see [`delete_sql`]), then the output
    /// is inserted.
    Replace(String),
}

/// The delete of the interval's rows of the target, which moves them to `kept` when versions
/// are kept, and matches no row outside the try's transaction ([`DELETE_GUARD`]). The
/// partition's rows go first, in a statement of their own: the parts of one statement all see
/// its snapshot, so an insert beside the delete would meet the very keys it removes.
fn delete_sql(
    c: &mut Conn,
    out: &Output<'_>,
    kept: Option<&str>,
) -> std::result::Result<String, Failure> {
    let (table, pc) = (&out.table, &out.pc);
    Ok(match kept {
        Some(kept) => {
            let cols = versions::shared_columns(c, kept, &out.task.target)?.join(", ");
            format!(
                "WITH d AS (DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 AND {DELETE_GUARD} RETURNING *) \
                 INSERT INTO {kept} ({cols}, _replaced_by) SELECT {cols}, $4 FROM d"
            )
        }
        None => format!("DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 AND {DELETE_GUARD}"),
    })
}

/// The statement that writes a try's output and measures it in the same pass, ready to send:
/// its parameters, the mark of the try's transaction, and the BEGIN that opens it.
struct Measuring {
    statement: String,
    params: Params,
    mark: String,
    begin: String,
}

impl Measuring {
    /// The statement: the output inserted into its table, then counted, hashed and checked
    /// against the gate (rows outside the interval, duplicate keys, keys in other partitions,
    /// the built-in rules, what a merge would do) beside the source's measures `sources`; for a
    /// try that changes the target, with the partition's lock and the publish's booking.
    fn new(
        w: &Write<'_>,
        out: &Output<'_>,
        change: &Change<'_>,
        [source_count, source_fingerprint]: [String; 2],
        mut params: Params,
    ) -> Self {
        let mark = try_mark(w.try_id);
        let (dest, list, pc) = (out.dest(), &out.list, &out.pc);
        let outside = format!("(NOT ({pc} >= $1 AND {pc} < $2) OR {pc} IS NULL)");
        let keys = w
            .gate
            .map(|g| {
                g.unique_key
                    .iter()
                    .map(|k| quote_ident(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|k| !k.is_empty());
        let duplicates = match (w.gate, &keys) {
            (Some(g), Some(k)) => duplicates_sql(&g.unique_key, k, &out.typed),
            _ => "NULL::int8".to_string(),
        };
        let elsewhere = elsewhere_sql(w, out, keys.is_some());
        let merge_counts = merge_counts_sql(w, out, change);
        // A try that will publish takes the partition's row lock and books its publish in the
        // same statement (see `lock_and_book`): a rejected or rolled-back try leaves neither.
        let booking = match change {
            Change::Apart => String::new(),
            Change::Merge(_) | Change::Replace(_) => booking_ctes(w, &mut params),
        };
        params.types.push(Type::TEXT);
        params.values.push(Value::Text(mark.clone()));
        let guard = in_try_guard(params.types.len());
        // The built-in rules on values are counted as the rows are written, in the same pass.
        let rule_counts = w
            .gate
            .and_then(|g| {
                crate::warehouse::rules::built_in_sums(g, crate::query::Dialect::Postgres)
            })
            .map_or_else(
                || "NULL::int8[]".to_string(),
                |s| format!("ARRAY[{s}]::int8[]"),
            );
        let statement = format!(
            "WITH ins AS (\n  INSERT INTO {dest} ({list})\n  SELECT {list} FROM (\n{}\n) q\n  RETURNING {list}\n),\n\
             m AS (SELECT count(*) AS n, count(*) FILTER (WHERE {outside}) AS outside, \
               coalesce(sum({hash}), 0) AS h, {rule_counts} AS rules FROM ins){booking}\n\
             SELECT m.n, m.outside, \
             CASE WHEN m.outside > 0 THEN (SELECT array_agg(v) FROM (SELECT DISTINCT coalesce({pc}::text, 'NULL') AS v FROM ins WHERE {outside} ORDER BY 1 LIMIT {more}) o) END, \
             m.n::text || ':' || m.h::text, {duplicates}, {elsewhere}, {source_count}, {source_fingerprint}, {guard}, m.rules, \
             {merge_counts} FROM m",
            out.query,
            more = SHOWN + 1,
            hash = row_hash(&out.typed),
        );
        Self {
            statement,
            params,
            begin: begin_sql(idle_ms(w), &mark),
            mark,
        }
    }
}

/// A key of the output (`ins`) that a partition of the target other than the interval's holds,
/// with that partition, as SQL; `NULL::text` unless the gate has a unique key that the task's
/// write looks for elsewhere. The output's keys that the partition holds are not looked up in
/// the rest of the table (one hash join with the partition, rather than a probe of the key's
/// index per row).
fn elsewhere_sql(w: &Write<'_>, out: &Output<'_>, keyed: bool) -> String {
    let (table, pc) = (&out.table, &out.pc);
    match w.gate {
        Some(g) if keyed && w.task.write.looks_elsewhere(g) => {
            let on = |a: &str, b: &str| {
                g.unique_key
                    .iter()
                    .map(|c| format!("{a}.{c} = {b}.{c}", c = quote_ident(c)))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            };
            format!(
                "(SELECT concat_ws(' ', ({tk})::text, 'in partition', t.{pc}::text) \
                 FROM ins o JOIN {table} t ON {ot} \
                 WHERE NOT EXISTS (SELECT 1 FROM {table} p WHERE {op} AND p.{pc} >= $1 AND p.{pc} < $2) \
                 AND NOT (t.{pc} >= $1 AND t.{pc} < $2) LIMIT 1)",
                tk = g
                    .unique_key
                    .iter()
                    .map(|c| format!("t.{}", quote_ident(c)))
                    .collect::<Vec<_>>()
                    .join(", "),
                ot = on("o", "t"),
                op = on("o", "p"),
            )
        }
        _ => "NULL::text".to_string(),
    }
}

/// What a merge of the output would do, counted by the statement that measures it (whose rows
/// are `ins`): all of it for an output that is staged or measured apart (nothing is merged),
/// only what the merge's own statements do not tell for one merged into the target, nothing
/// for one that is only measured (`verify`), nor for a task that does not merge.
fn merge_counts_sql(w: &Write<'_>, out: &Output<'_>, change: &Change<'_>) -> String {
    match out.merging_from("ins", None) {
        Some(m) if !w.measure_only => m.counted(
            w.gate.is_some_and(|g| g.unique_key_table),
            !matches!(change, Change::Merge(_)),
        ),
        _ => "NULL::int8[]".to_string(),
    }
}

/// The CTEs that take the partition's row lock and book the try's publish (see
/// [`lock_and_book_ctes`]), their parameters added to `params`.
fn booking_ctes(w: &Write<'_>, params: &mut Params) -> String {
    let first = params.types.len() + 1;
    params.types.extend([
        Type::TEXT,
        Type::TIMESTAMPTZ,
        Type::TEXT,
        Type::INT8,
        Type::TIMESTAMPTZ,
    ]);
    params.values.extend([
        Value::Text(w.task.target.clone()),
        Value::At(w.binds.interval.start),
        Value::Text(w.manifest.to_string()),
        Value::Int(w.try_id),
        Value::At(w.binds.interval.end),
    ]);
    let names = [0, 1, 2, 3, 4].map(|i| format!("${}", first + i));
    format!(
        ",\n{}",
        lock_and_book_ctes(
            &names,
            ["m.n", "'pg:' || m.n::text || ':' || m.h::text"],
            "lock, m"
        )
    )
}

/// What a try's transaction answered: the measuring statement's row, the rows of the partition
/// moved to the kept table, and, for a merge into the target, what the merge did.
struct Wrote {
    row: tokio_postgres::Row,
    moved: Option<i64>,
    merged: Option<[i64; 3]>,
}

/// A merge try's transaction (see [`merge::in_try`]): the output written to the temporary
/// table and measured, the partition's rows copied to `kept` when versions are kept, and the
/// output merged into the partition.
fn merge_in_try(
    c: &mut Conn,
    w: &Write<'_>,
    out: &Output<'_>,
    merging: &merge::Merging<'_>,
    kept: Option<&str>,
    m: &Measuring,
) -> std::result::Result<Wrote, Failure> {
    let keep = match kept {
        Some(kept) => Some(merge::keep(
            merging,
            kept,
            &versions::shared_columns(c, kept, &w.task.target)?,
            4,
        )),
        None => None,
    };
    let (types, values) = (&m.params.types, &m.params.values);
    let merge_params: [(&(dyn ToSql + Sync), Type); 4] = [
        (values[0].sql(), types[0].clone()),
        (values[1].sql(), types[1].clone()),
        (&m.mark, Type::TEXT),
        (&w.try_id, Type::INT8),
    ];
    let (row, moved, done) = merge::in_try(
        c,
        (
            &create_scratch(&out.scratch, &out.list, &out.table),
            &m.begin,
        ),
        (&m.statement, &m.params.typed_refs()),
        keep,
        merging,
        &merge_params,
    )?;
    Ok(Wrote {
        row,
        moved,
        merged: Some(done),
    })
}

/// The transaction of a try whose output is staged or measured apart: written to a table of
/// its own and measured, the target untouched.
fn write_apart(c: &Conn, out: &Output<'_>, m: &Measuring) -> std::result::Result<Wrote, Failure> {
    // A staged table is made inside the try's transaction; the scratch table outside it, in a
    // message of its own (the statements of one message share a transaction).
    let (first, then) = match &out.staged {
        Some(name) => (
            format!(
                "{begin}; CREATE TABLE {name} AS SELECT {list} FROM {table} WITH NO DATA",
                begin = m.begin,
                list = out.list,
                table = out.table,
            ),
            None,
        ),
        None => (
            create_scratch(&out.scratch, &out.list, &out.table),
            Some(m.begin.clone()),
        ),
    };
    let typed_refs = m.params.typed_refs();
    // A staged table is new in every try: its statement is not kept prepared, and goes in the
    // round trip that creates the table, after it.
    let row = c.wait(async {
        let (created, began, row) = tokio::join!(
            c.client.batch_execute(&first),
            async {
                match &then {
                    Some(begin) => c.client.batch_execute(begin).await,
                    None => Ok(()),
                }
            },
            c.client.query_typed_one(&m.statement, &typed_refs)
        );
        created?;
        began?;
        row
    })?;
    Ok(Wrote {
        row,
        moved: None,
        merged: None,
    })
}

/// The transaction of a try that replaces the partition: `delete` (see [`delete_sql`]), then
/// the statement that writes the output into the target and measures it, then the check of
/// the target's deferred constraints, so that the gate hears of a violation before it judges.
fn replace_in_try(
    c: &mut Conn,
    w: &Write<'_>,
    delete: &str,
    kept: Option<&str>,
    m: &Measuring,
) -> std::result::Result<Wrote, Failure> {
    // Prepared outside the transaction; then its BEGIN and the statements go in one round
    // trip, in order. Should the BEGIN fail, the statements run outside a transaction, where
    // the delete's guard matches no row and the measure's fails it (see `begin_sql`): nothing
    // is committed.
    let (types, values) = (&m.params.types, &m.params.values);
    let measure = prepared(c, &m.statement, types)?;
    let delete = prepared(
        c,
        delete,
        &[types[0].clone(), types[1].clone(), Type::TEXT, Type::INT8],
    )?;
    let delete_params: [&(dyn ToSql + Sync); 4] =
        [values[0].sql(), values[1].sql(), &m.mark, &w.try_id];
    let refs = m.params.refs();
    let (row, moved) = c.wait(async {
        let (began, deleted, row, checked) = tokio::join!(
            c.client.batch_execute(&m.begin),
            c.client.execute(&delete, &delete_params),
            c.client.query_one(&measure, &refs),
            c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        );
        began?;
        let deleted = deleted?;
        let row = row?;
        checked?;
        Ok::<_, tokio_postgres::Error>((
            row,
            kept.is_some()
                .then(|| i64::try_from(deleted).unwrap_or(i64::MAX)),
        ))
    })?;
    Ok(Wrote {
        row,
        moved,
        merged: None,
    })
}

/// The measures of a try's output, as its statement's row in `wrote` gives them.
fn measures(
    w: &Write<'_>,
    out: &Output<'_>,
    refused: Option<&str>,
    wrote: &Wrote,
) -> std::result::Result<AuditMeasures, Failure> {
    let row = &wrote.row;
    let rows: i64 = row.get(0);
    let fingerprint: String = row.get(3);
    let source = counted(w.gate, row.get(6))?;
    let keyed = w.gate.is_some_and(|g| !g.unique_key.is_empty());
    Ok(AuditMeasures {
        rows,
        outside: row.get(1),
        outside_values: row.get::<_, Option<Vec<String>>>(2).unwrap_or_default(),
        duplicate_keys: keyed.then(|| row.get::<_, Option<i64>>(4).unwrap_or(0)),
        fingerprint: format!("pg:{fingerprint}"),
        repr: None,
        mixed: None,
        source,
        source_fingerprint: row.get(7),
        elsewhere: row.get(5),
        constraint: refused.map(str::to_string),
        found: Vec::new(),
        merge: out.merge.and_then(|(_, keep_missing)| {
            let counted = merge::Counted::of(&row.get::<_, Option<Vec<i64>>>(10)?);
            match wrote.merged {
                Some([missing, updated, inserted]) => {
                    Some(counted.merge(rows, inserted, updated, missing, keep_missing))
                }
                None => counted.planned(rows, keep_missing),
            }
        }),
    })
}

/// The gate's rules on the output's values, over the interval's rows as this transaction
/// wrote them: what the delete removed is gone and only the output is there (rows outside the
/// interval are rejected first); the query's columns, as a staged or a temporary table holds
/// them too. `counted`: what the try's statement counted of the built-in rules.
fn run_rules(
    c: &mut Conn,
    w: &Write<'_>,
    g: &Gate,
    out: &Output<'_>,
    params: &Params,
    rows: i64,
    counted: Option<Vec<i64>>,
) -> std::result::Result<Vec<crate::gate::Found>, Failure> {
    let (dest, list, pc) = (out.dest(), &out.list, &out.pc);
    let mut engine = PgRules::new(
        c,
        format!("SELECT {list} FROM {dest} WHERE {pc} >= $1 AND {pc} < $2"),
        [params.values[0].clone(), params.values[1].clone()],
        params.types[0].clone(),
        w.binds,
        w.tz,
        dest == out.table,
    );
    let shown = crate::warehouse::audit::shown_columns(w.task, g);
    crate::warehouse::rules::run(&mut engine, g, rows, &shown, counted.as_deref())
}

/// An interval's share of a batch, to write as its try's output (see [`write_measure`]).
pub(super) struct FromBatch<'a> {
    /// The batch's table, quoted, and the query's columns it holds.
    pub table: &'a str,
    pub columns: &'a [String],
    /// The interval's index in the batch.
    pub k: i64,
    pub source: Option<i64>,
    pub source_fingerprint: Option<String>,
}

/// The temporary table that an output measured apart from the target, or merged into it, goes
/// to: one per target and shape (its columns and their types), made once per session and kept,
/// its rows gone when their transaction ends. Making it in every try cost more than the rest of
/// a merge's writes (catalog rows written and removed, WAL for them, a plan for every statement
/// that reads it).
pub(super) fn scratch_table(target: &str, typed: &[(String, String)]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (target, typed).hash(&mut h);
    format!("pg_temp.backfill_output_{:016x}", h.finish())
}

/// Makes [`scratch_table`] `name` shaped like `list` of `table`, unless this session has it:
/// outside any transaction, so that a try that rolls back does not take it along.
pub(super) fn create_scratch(name: &str, list: &str, table: &str) -> String {
    format!(
        "CREATE TEMPORARY TABLE IF NOT EXISTS {name} ON COMMIT DELETE ROWS \
         AS SELECT {list} FROM {table} WITH NO DATA"
    )
}

/// The condition of a try's delete that holds only inside the transaction that [`begin_sql`]
/// began with the try's mark, bound as `$3`: outside it, the delete matches no row.
pub(super) const DELETE_GUARD: &str = "current_setting('backfill.in_try', true) = $3";

/// The `idle_in_transaction_session_timeout` of a try's session: twice the lease timeout, at
/// least 5 s, so that the server ends the transaction of an owner frozen past its takeover.
pub(super) fn idle_ms(w: &Write<'_>) -> u128 {
    (w.lease_timeout * 2)
        .max(std::time::Duration::from_secs(5))
        .as_millis()
        // The server's limit for the setting (about 24 days).
        .min(i32::MAX as u128)
}

/// A value that nobody can know in advance, which marks one try's transaction.
pub(super) fn try_mark(try_id: i64) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(try_id);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

/// Begins a try's transaction. Plans are made for each try's values and the table as it is
/// now: a plan cached while the target was empty would scan it whole once it has grown. The
/// transaction is marked with `mark` (`SET LOCAL`, gone when it ends) for [`in_try_guard`].
pub(super) fn begin_sql(idle_ms: u128, mark: &str) -> String {
    format!(
        "SET idle_in_transaction_session_timeout = {idle_ms}; SET plan_cache_mode = force_custom_plan; \
         BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL backfill.in_try = '{mark}'"
    )
}

/// A column of a try's statement that fails the statement (so that it commits nothing) unless
/// it runs inside the transaction that [`begin_sql`] began with the try's mark, bound as
/// parameter `$param`: a query that sets the setting itself cannot know the mark.
pub(super) fn in_try_guard(param: usize) -> String {
    format!(
        "CASE WHEN current_setting('backfill.in_try', true) = ${param} THEN NULL::int \
         ELSE ('backfill: the statement is outside its try''s transaction (' \
         || coalesce(current_setting('backfill.in_try', true), 'unset') || ')')::int END"
    )
}

/// How many values of the unique key (`quoted`, the key's columns quoted and joined) occur
/// more than once in the output `ins`, as SQL. Counting the groups is a hash aggregate of every
/// row, several times slower than sorting the keys once; so when the key's types sort as
/// `GROUP BY` compares them (by `typed`, the output's types), the rows and the distinct keys
/// are counted first, and the groups only when the two differ (a duplicate, or a `NULL` key
/// which `count(DISTINCT)` leaves out): the same number, at the cost of a sort when there is
/// none. Text sorts so only as a key's one column (its own collation); inside a row (several
/// columns) it might compare by another, so such keys are only grouped.
pub(super) fn duplicates_sql(key: &[String], quoted: &str, typed: &[(String, String)]) -> String {
    let exact = format!(
        "(SELECT count(*) FROM (SELECT 1 FROM ins GROUP BY {quoted} HAVING count(*) > 1) d)"
    );
    let sorts = key.iter().all(|k| {
        typed.iter().any(|(name, ty)| {
            let base = ty.split('(').next().unwrap_or(ty).trim();
            let text = matches!(
                base,
                "text" | "character varying" | "varchar" | "character" | "bpchar"
            );
            name == k
                && (text && key.len() == 1
                    || matches!(
                        base,
                        "bigint"
                            | "integer"
                            | "smallint"
                            | "int8"
                            | "int4"
                            | "int2"
                            | "uuid"
                            | "date"
                            | "timestamp"
                            | "timestamp with time zone"
                            | "timestamp without time zone"
                            | "numeric"
                            | "boolean"
                    ))
        })
    });
    if !sorts {
        return exact;
    }
    // One column's key as itself, several as a row (whose NULL fields compare equal, as GROUP
    // BY groups them).
    format!(
        "(SELECT CASE WHEN count(*) = count(DISTINCT ({quoted})) THEN 0::int8 ELSE {exact} END FROM ins)"
    )
}

/// What a try's transaction did besides its output.
pub(super) struct Written {
    /// Rows of the partition moved to the kept table, when versions are kept.
    pub(super) moved: Option<i64>,
    /// The query's columns.
    pub(super) columns: Vec<String>,
}

/// The gate's `source_count` and `source_fingerprint` queries as scalar subqueries (`NULL` for
/// one that is not a query), their parameters numbered after those in `types` and bound from
/// `binds` into `values`: part of a try's statement, or of a look at the source.
pub(super) fn source_queries(
    gate: Option<&Gate>,
    binds: &Binds,
    tz: chrono_tz::Tz,
    types: &mut Vec<Type>,
    values: &mut Vec<Value>,
) -> std::result::Result<[String; 2], Failure> {
    let mut one = |key: &'static str, spec: Option<&SourceCount>, answer: Answer| {
        let Some(SourceCount::Sql(sql)) = spec else {
            return Ok(match answer {
                Answer::Count => "NULL::int8",
                Answer::Value => "NULL::text",
            }
            .to_string());
        };
        let s = Statement::new(key, sql, types.len() + 1).map_err(|p| Error::Message(p.message))?;
        types.extend(s.types());
        values.extend(s.values(binds, tz));
        Ok::<_, Failure>(match answer {
            Answer::Count => format!("(SELECT s.c::int8 FROM (\n{}\n) AS s(c))", s.sql),
            Answer::Value => format!(
                "(SELECT coalesce(s.c::text, 'NULL') FROM (\n{}\n) AS s(c))",
                s.sql
            ),
        })
    };
    Ok([
        one(
            "gate.source_count",
            gate.and_then(|g| g.source_count.as_ref()),
            Answer::Count,
        )?,
        one(
            "gate.source_fingerprint",
            gate.and_then(|g| g.source_fingerprint.as_ref()),
            Answer::Value,
        )?,
    ])
}

/// What a gate's source query answers, as a try's statement reads it.
#[derive(Clone, Copy)]
enum Answer {
    /// `source_count`: an integer.
    Count,
    /// `source_fingerprint`: one value of any type, as text (`NULL` spelled out).
    Value,
}

/// The source count a [`source_queries`] subquery gave: a `source_count` query must give one.
pub(super) fn counted(
    gate: Option<&Gate>,
    found: Option<i64>,
) -> std::result::Result<Option<i64>, Failure> {
    match (found, gate.and_then(|g| g.source_count.as_ref())) {
        (None, Some(SourceCount::Sql(_))) => Err(Error::Message(
            "gate.source_count returned no row, or NULL; it must return one integer".into(),
        )
        .into()),
        _ => Ok(found),
    }
}

/// The gate's source queries now, from one snapshot.
pub(crate) fn look(
    task: &SqlTask,
    gate: Option<&Gate>,
    binds: &Binds,
    tz: chrono_tz::Tz,
) -> Result<(Option<i64>, Option<String>)> {
    let wh = &task.warehouse;
    let mut c = conn::take_at(wh)?;
    let seen = c
        .wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        )
        .map_err(Failure::from)
        .and_then(|()| {
            let (mut types, mut values) = (Vec::new(), Vec::new());
            let [count, value] = source_queries(gate, binds, tz, &mut types, &mut values)?;
            let stmt = prepared(&mut c, &format!("SELECT {count}, {value}"), &types)?;
            let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(Value::sql).collect();
            let row = c.wait(c.client.query_one(&stmt, &refs))?;
            Ok((counted(gate, row.get(0))?, row.get(1)))
        });
    let _ = c.wait(c.client.batch_execute("ROLLBACK"));
    conn::give(c);
    seen.map_err(|e| e.at(wh))
}

/// A try's open transaction: its output written, measured, not yet visible.
pub(super) struct Open {
    pub(super) conn: Option<Conn>,
    pub(super) measures: AuditMeasures,
    pub(super) written: Written,
    pub(super) manifest: String,
    pub(super) try_id: i64,
    /// The table a staged try writes to, in place of the target.
    pub(super) staged: Option<String>,
}

impl Open {
    /// The partition's rows once this output is published: a merge's with the keys it keeps.
    fn rows_after(&self) -> i64 {
        self.measures
            .merge
            .map_or(self.measures.rows, |m| m.after())
    }

    pub(super) fn end(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
            conn::give(c);
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.end();
    }
}

impl Pending for Open {
    fn measures(&self) -> &AuditMeasures {
        &self.measures
    }

    fn file(&self) -> Option<&Path> {
        None
    }

    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        _waiting: &mut dyn FnMut(),
    ) -> Result<i64> {
        let wh = &p.task.warehouse;
        if let Some(why) = &self.measures.constraint {
            // Measured apart from the target, which it never entered: the gate rejects it.
            return Err(Error::Constraint(why.clone()));
        }
        let rows_after = self.rows_after();
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::Message("the try's transaction is gone".into()).at(wh));
        };
        if crate::fault::point("publish") {
            self.end();
            return Err(Error::Message("connection lost (injected)".into()).at(wh));
        }
        let ready = (|| -> std::result::Result<(), Failure> {
            finish_versions(
                c,
                &self.manifest,
                p,
                &self.written,
                self.try_id,
                &self.measures.fingerprint,
            )?;
            // The statement that wrote the rows took the partition's row lock and booked the
            // publish: the manifest is asked under that lock.
            ask(allowed)?;
            crate::fault::point("before-commit");
            Ok(())
        })();
        if let Err(e) = ready {
            // Nothing was sent to commit: nothing committed.
            self.end();
            return Err(e.at(wh));
        }
        // The judged record goes with the booking, in the commit's round trip, and so does
        // the manifest's record of the publish when the manifest is in this database. A failed
        // statement aborts the transaction, whose COMMIT then rolls back without an error: so
        // the statements' own answers decide too.
        // (Prepared first: a statement to parse would go to the server after the COMMIT.)
        let update = prepared(
            c,
            "UPDATE backfill.publishes SET judged = $3 WHERE manifest = $1 AND try_id = $2",
            &[Type::TEXT, Type::INT8, Type::TEXT],
        );
        let record = match &p.in_manifest {
            Some(m) => prepared(c, m.statement, &IN_PUBLISH_TYPES).map(Some),
            None => Ok(None),
        };
        let (update, record) = match (update, record) {
            (Ok(u), Ok(r)) => (u, r),
            (Err(e), _) | (_, Err(e)) => {
                self.end();
                return Err(pg(wh)(e));
            }
        };
        let params: [&(dyn ToSql + Sync); 3] = [&self.manifest, &self.try_id, &p.judged];
        let in_manifest = p
            .in_manifest
            .map(|m| InPublishValues::of(m, self.try_id, rows_after, p.interval));
        let (judged, recorded, committed) = c.wait(async {
            tokio::join!(
                c.client.execute(&update, &params),
                async {
                    match (&record, &in_manifest) {
                        (Some(r), Some(v)) => c.client.execute(r, &v.params()).await.map(Some),
                        _ => Ok(None),
                    }
                },
                c.client.batch_execute("COMMIT")
            )
        });
        // The manifest no longer records the try as running (its owner was recovered): the
        // transaction rolled back, the warehouse's rows with it.
        let refused = matches!((&recorded, p.in_manifest), (Err(e), Some(m))
            if committed.is_ok() && refused_by_manifest(e, m.refused, self.try_id));
        let committed = match (judged, recorded, committed) {
            (Ok(_), Ok(_), Ok(())) => Ok(()),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
        };
        // A commit that failed may have happened with its reply lost (the booking says, and
        // with it the manifest's record, when that went with it).
        let result = if refused {
            Err(Error::Refused.into())
        } else {
            settled(
                c,
                committed,
                p.task,
                p.interval,
                &self.manifest,
                self.try_id,
            )
        };
        if let Some(c) = self.conn.take() {
            conn::give(c);
        }
        result
            .map(|()| self.rows_after())
            .map_err(|e: Failure| e.at(wh))
    }

    fn remove(mut self: Box<Self>) {
        self.end();
    }

    fn keep(mut self: Box<Self>) {
        self.end();
    }

    fn stage(mut self: Box<Self>) -> Result<PathBuf> {
        let (Some(c), Some(table)) = (self.conn.take(), self.staged.clone()) else {
            self.end();
            return Err(Error::Message(
                "this try wrote to the target, not to a staged table".into(),
            ));
        };
        // Committed like any table of the database: a crash of the machine keeps it.
        let committed = c.wait(c.client.batch_execute("COMMIT"));
        conn::give(c);
        committed
            .map(|()| PathBuf::from(table))
            .map_err(|e| Error::Message(format!("cannot keep the staged output: {}", describe(&e))))
    }
}
