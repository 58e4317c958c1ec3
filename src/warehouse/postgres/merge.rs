//! The merge of a PostgreSQL warehouse (`write = "merge"`): rows matched to the partition's by
//! the gate's `unique_key`, so that only what differs is written.
//!
//! A try writes its output to a temporary table (see `write::scratch_table`) (measured as any output), then,
//! in the same transaction and the same round trip, merges it into the target in statements
//! of their own, each seeing what the one before it did: the partition's keys the output no
//! longer has are deleted (first, so that a unique constraint of the target is free again),
//! the rows whose values differ are updated (only the columns the query returns: a surrogate
//! id or a `first_seen_at` the query leaves out survives), and the new keys are inserted. What
//! the statements did is what the gate judges, and the transaction it publishes: the counts
//! are exact by construction. A row whose values are all equal is not written at all, so an
//! unchanged rerun leaves the target's tuples alone.
//!
//! The same statements merge a staged output at promote, and a kept version back at rollback
//! (every column the version kept). Keys are matched with `=`: a `NULL` in the key matches
//! nothing (the gate rejects an output that has one). Values are compared null-safely with
//! `IS DISTINCT FROM`, by their text for the types whose equality is not identity (a
//! `numeric` 1.0 equals 1.00; a `json` has no equality): what a fingerprint hashes is what is
//! compared.

use futures_util::future::join_all;

use super::*;
use crate::gate::Merge;

/// How a merge reads its rows and writes the target. Statements built from it take the
/// partition's bounds as `$1` and `$2`.
pub(super) struct Merging<'a> {
    /// The target, quoted.
    pub(super) table: String,
    /// The rows to merge, read as `o`: a table's name, or a query in parentheses.
    pub(super) source: String,
    /// The columns the merge writes, with their types as the target holds them.
    pub(super) columns: &'a [(String, String)],
    pub(super) key: &'a [String],
    pub(super) partition_column: &'a str,
    /// `on_missing = "keep"`: keys of the partition that the source lacks stay.
    pub(super) keep_missing: bool,
    /// A condition each writing statement adds (the try's guard), if any.
    pub(super) guard: Option<&'a str>,
}

impl Merging<'_> {
    /// Rows `t` and `o` have the same key.
    fn matches(&self) -> String {
        self.key
            .iter()
            .map(|k| format!("t.{c} = o.{c}", c = quote_ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `t` is in the interval's partition.
    fn in_partition(&self) -> String {
        let pc = quote_ident(self.partition_column);
        format!("t.{pc} >= $1 AND t.{pc} < $2")
    }

    /// Row `alias` of the target has the key of `o` and is in the interval's partition.
    fn in_partition_as(&self, alias: &str) -> String {
        let pc = quote_ident(self.partition_column);
        let key = self
            .key
            .iter()
            .map(|k| format!("{alias}.{c} = o.{c}", c = quote_ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        format!("{key} AND {alias}.{pc} >= $1 AND {alias}.{pc} < $2")
    }

    /// The columns besides the key's: the ones an update writes.
    fn values(&self) -> Vec<&(String, String)> {
        self.columns
            .iter()
            .filter(|(n, _)| !self.key.contains(n))
            .collect()
    }

    /// `t` and `o` differ in a column besides the key's (`None` when there is none), as a
    /// row comparison that takes `NULL` for a value.
    fn differ(&self) -> Option<String> {
        let values = self.values();
        if values.is_empty() {
            return None;
        }
        let side = |alias: &str| {
            values
                .iter()
                .map(|(n, ty)| compared(&format!("{alias}.{}", quote_ident(n)), ty))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Some(format!(
            "ROW({}) IS DISTINCT FROM ROW({})",
            side("t"),
            side("o")
        ))
    }

    fn guarded(&self) -> String {
        self.guard.map(|g| format!(" AND {g}")).unwrap_or_default()
    }

    /// Deletes the partition's rows whose key the source lacks; answers how many.
    pub(super) fn delete(&self) -> String {
        format!(
            "WITH d AS (DELETE FROM {t} AS t WHERE {partition} AND NOT EXISTS \
             (SELECT 1 FROM {s} AS o WHERE {matches}){guard} RETURNING 1) SELECT count(*) FROM d",
            t = self.table,
            s = self.source,
            partition = self.in_partition(),
            matches = self.matches(),
            guard = self.guarded(),
        )
    }

    /// How many of the partition's rows have a key the source lacks (kept with `keep_missing`).
    pub(super) fn missing(&self) -> String {
        format!(
            "SELECT count(*) FROM {t} AS t WHERE {partition} AND NOT EXISTS \
             (SELECT 1 FROM {s} AS o WHERE {matches})",
            t = self.table,
            s = self.source,
            partition = self.in_partition(),
            matches = self.matches(),
        )
    }

    /// Deletes the missing keys, or counts them when they stay.
    pub(super) fn delete_or_count(&self) -> String {
        if self.keep_missing {
            self.missing()
        } else {
            self.delete()
        }
    }

    /// Updates the rows whose key the source has and whose values differ, then inserts the
    /// source's rows whose key the target does not hold, in one statement; answers how many
    /// it updated and inserted. The source's keys are matched with the partition's rows first
    /// (one hash join over both, where probing the key's index once per row of the source
    /// cost twice as much), and only those the partition lacks are looked up in the whole
    /// table: a row another partition holds moves (with `unique_key_scope = "table"`), a key
    /// no row holds is inserted. The updates and the insert touch different rows.
    pub(super) fn upsert(&self) -> String {
        let (t, s) = (&self.table, &self.source);
        let (matches, partition, guard) = (self.matches(), self.in_partition(), self.guarded());
        let list = |alias: &str| {
            self.columns
                .iter()
                .map(|(n, _)| format!("{alias}{}", quote_ident(n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let absent = format!(
            "absent AS MATERIALIZED (SELECT * FROM {s} AS o WHERE NOT EXISTS \
             (SELECT 1 FROM {t} AS t WHERE {matches} AND {partition}))"
        );
        let insert = format!(
            "ins AS (INSERT INTO {t} ({cols}) SELECT {from} FROM absent AS o WHERE NOT EXISTS \
             (SELECT 1 FROM {t} AS t WHERE {matches}){guard} RETURNING 1)",
            cols = list(""),
            from = list("o."),
        );
        let Some(differ) = self.differ() else {
            return format!("WITH {absent}, {insert} SELECT 0::int8, (SELECT count(*) FROM ins)");
        };
        let set = self
            .values()
            .iter()
            .map(|(n, _)| format!("{c} = o.{c}", c = quote_ident(n)))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "WITH {absent}, \
             here AS (UPDATE {t} AS t SET {set} FROM {s} AS o \
               WHERE {matches} AND {partition} AND {differ}{guard} RETURNING 1), \
             moved AS (UPDATE {t} AS t SET {set} FROM absent AS o \
               WHERE {matches} AND NOT ({partition}) AND {differ}{guard} RETURNING 1), \
             {insert} \
             SELECT (SELECT count(*) FROM here) + (SELECT count(*) FROM moved), \
               (SELECT count(*) FROM ins)"
        )
    }

    /// What the merge would do, counted without writing: the source's rows, those whose key the
    /// target lacks, those equal to the target's row, and the partition's keys the source
    /// lacks (bounds `$1`, `$2`).
    pub(super) fn plan(&self) -> String {
        let (t, s) = (&self.table, &self.source);
        let same = self
            .differ()
            .map(|d| format!(" AND NOT ({d})"))
            .unwrap_or_default();
        format!(
            "SELECT (SELECT count(*) FROM {s} AS o), \
             (SELECT count(*) FROM {s} AS o WHERE NOT EXISTS (SELECT 1 FROM {t} AS t WHERE {matches})), \
             (SELECT count(*) FROM {s} AS o WHERE EXISTS (SELECT 1 FROM {t} AS t WHERE {matches}{same})), \
             ({missing})",
            matches = self.matches(),
            missing = self.missing(),
        )
    }

    /// The statements that merge, in the order they must run: delete (or count the missing
    /// keys), then update and insert.
    pub(super) fn statements(&self) -> Vec<String> {
        vec![self.delete_or_count(), self.upsert()]
    }

    /// A key of the source that a partition of the target other than the interval's holds,
    /// with that partition, as SQL (`NULL` when there is none).
    fn elsewhere(&self) -> String {
        let keys = |alias: &str| {
            self.key
                .iter()
                .map(|k| format!("{alias}.{}", quote_ident(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // Only the keys the partition lacks are looked up in the rest of the table.
        format!(
            "(SELECT concat_ws(' ', ({tk})::text, 'in partition', t.{pc}::text) FROM {s} AS o \
             JOIN {t} AS t ON {matches} WHERE NOT EXISTS (SELECT 1 FROM {t} AS p WHERE {inside}) \
             AND NOT ({partition}) LIMIT 1)",
            tk = keys("t"),
            pc = quote_ident(self.partition_column),
            t = self.table,
            s = self.source,
            matches = self.matches(),
            inside = self.in_partition_as("p"),
            partition = self.in_partition(),
        )
    }

    /// What a merge of the source would do, counted without writing, as an `int8[]` of SQL:
    /// the source's rows with a `NULL` in the key and, with `moved`, those whose key another
    /// partition holds; with `plan`, also the rows to insert, the rows left as they are and
    /// the partition's keys the source lacks. Read by [`Counted::of`].
    pub(super) fn counted(&self, moved: bool, plan: bool) -> String {
        let (t, s, matches) = (&self.table, &self.source, self.matches());
        let null_key = self
            .key
            .iter()
            .map(|k| format!("o.{} IS NULL", quote_ident(k)))
            .collect::<Vec<_>>()
            .join(" OR ");
        let mut parts = vec![
            format!("(SELECT count(*) FROM {s} AS o WHERE {null_key})"),
            if moved {
                // A key the partition holds is not looked up in the rest of the table.
                format!(
                    "(SELECT count(*) FROM {s} AS o WHERE NOT EXISTS (SELECT 1 FROM {t} AS p \
                     WHERE {inside}) AND EXISTS (SELECT 1 FROM {t} AS t \
                     WHERE {matches} AND NOT ({partition})))",
                    inside = self.in_partition_as("p"),
                    partition = self.in_partition()
                )
            } else {
                "0".to_string()
            },
        ];
        if plan {
            let same = self
                .differ()
                .map_or_else(String::new, |d| format!(" AND NOT ({d})"));
            parts.extend([
                format!(
                    "(SELECT count(*) FROM {s} AS o WHERE NOT EXISTS (SELECT 1 FROM {t} AS t WHERE {matches}))"
                ),
                format!(
                    "(SELECT count(*) FROM {s} AS o WHERE EXISTS (SELECT 1 FROM {t} AS t WHERE {matches}{same}))"
                ),
                format!("({})", self.missing()),
            ]);
        }
        format!("ARRAY[{}]::int8[]", parts.join(", "))
    }
}

/// A column as a merge compares it: itself when its type's equality is identity, a text
/// byte by byte (whatever the column's collation), any other by its text (what a fingerprint
/// hashes), so that a row counts as unchanged only when it is.
fn compared(column: &str, ty: &str) -> String {
    if ty.ends_with("[]") {
        return format!("{column}::text");
    }
    match ty.split('(').next().unwrap_or(ty).trim() {
        "bigint"
        | "integer"
        | "smallint"
        | "boolean"
        | "uuid"
        | "bytea"
        | "date"
        | "timestamp"
        | "timestamp with time zone"
        | "timestamp without time zone" => column.to_string(),
        "text" | "character varying" | "character" => format!("{column} COLLATE \"C\""),
        _ => format!("{column}::text"),
    }
}

/// What [`Merging::counted`] gave.
pub(super) struct Counted {
    pub(super) null_keys: i64,
    pub(super) moved: i64,
    /// Rows to insert, rows left as they are, partition keys the source lacks.
    pub(super) plan: Option<[i64; 3]>,
}

impl Counted {
    pub(super) fn of(values: &[i64]) -> Self {
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        Counted {
            null_keys: at(0),
            moved: at(1),
            plan: (values.len() >= 5).then(|| [at(2), at(3), at(4)]),
        }
    }

    /// The merge that the plan counted, of a source of `rows` rows.
    pub(super) fn planned(&self, rows: i64, keep_missing: bool) -> Option<Merge> {
        let [inserted, unchanged, missing] = self.plan?;
        Some(self.merge(
            rows,
            inserted,
            rows - inserted - unchanged,
            missing,
            keep_missing,
        ))
    }

    /// The merge of a source of `rows` rows that inserted, updated and deleted (or, with
    /// `keep_missing`, kept) so many.
    pub(super) fn merge(
        &self,
        rows: i64,
        inserted: i64,
        updated: i64,
        missing: i64,
        keep_missing: bool,
    ) -> Merge {
        let (deleted, kept) = if keep_missing {
            (0, missing)
        } else {
            (missing, 0)
        };
        Merge {
            inserted,
            updated,
            deleted,
            unchanged: rows - inserted - updated,
            kept,
            moved: self.moved,
            null_keys: self.null_keys,
        }
    }
}

/// The statement that copies the partition's rows (with the guard, if any) to the kept table
/// `kept` as the version replaced by the try bound as `$try_param`, and the rows of other
/// partitions whose key the source has (those the merge moves in), as they are there, under
/// the negative of the try: a rollback moves them back. Answers how many of the partition's
/// rows it kept. `cols` are the columns both tables have, quoted.
pub(super) fn keep(m: &Merging<'_>, kept: &str, cols: &[String], try_param: usize) -> String {
    let list = cols.join(", ");
    let from_t = cols
        .iter()
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH k AS (INSERT INTO {kept} ({list}, _replaced_by) SELECT {from_t}, ${try_param} \
         FROM {table} AS t WHERE {partition}{guard} RETURNING 1), \
         mv AS (INSERT INTO {kept} ({list}, _replaced_by) SELECT {from_t}, -(${try_param}::int8) \
         FROM {source} AS o JOIN {table} AS t ON {matches} WHERE NOT ({partition}){guard} RETURNING 1) \
         SELECT count(*) FROM k",
        table = m.table,
        source = m.source,
        partition = m.in_partition(),
        matches = m.matches(),
        guard = m.guarded(),
    )
}

/// What the merge statements of [`Merging::statements`] answered: rows deleted (or missing
/// keys kept), updated, inserted.
pub(super) fn done(answers: &[i64]) -> [i64; 3] {
    let at = |i: usize| answers.get(i).copied().unwrap_or(0);
    [at(0), at(1), at(2)]
}

/// Runs `statements` in order, pipelined (sent together, one round trip), each with the
/// same parameters; answers their numbers, in order. The first failure, in the order sent, is
/// the answer: the statements after it fail only because it aborted the transaction.
///
/// Unnamed statements: they read a table that is new in every try (or a staged one), whose
/// prepared statements would be of no use after it.
pub(super) async fn counts(
    client: &tokio_postgres::Client,
    statements: &[String],
    params: &[(&(dyn ToSql + Sync), Type)],
) -> std::result::Result<Vec<i64>, tokio_postgres::Error> {
    // Polled in order: the statements are sent in this order.
    let answers = join_all(statements.iter().map(|s| client.query_typed_one(s, params))).await;
    let mut all = Vec::new();
    for row in answers {
        let row = row?;
        all.extend((0..row.len()).map(|i| row.get::<_, i64>(i)));
    }
    Ok(all)
}

/// A merge try's transaction up to the gate, in one round trip, in order: `begin` (which
/// begins the transaction and creates the temporary table), the statement that writes the
/// output there and measures it (`measure`, with its parameters), then `keep` (which copies the
/// partition's rows to the kept table, when versions are kept) and the merge's statements, then
/// the check of the target's deferred constraints, so that a key the merge deletes while
/// another table references it refuses the output before the gate judges it. Should the BEGIN
/// fail, every statement fails or matches no row (they are guarded, see `begin_sql`): nothing
/// is committed. Returns the measure's row, the rows kept, and what the merge did (see
/// [`done`]).
pub(super) fn in_try(
    c: &Conn,
    (create, begin): (&str, &str),
    (measure, params): (&str, &[(&(dyn ToSql + Sync), Type)]),
    keep: Option<String>,
    m: &Merging<'_>,
    merge_params: &[(&(dyn ToSql + Sync), Type)],
) -> std::result::Result<(tokio_postgres::Row, Option<i64>, [i64; 3]), tokio_postgres::Error> {
    let kept = keep.is_some();
    let statements: Vec<String> = keep.into_iter().chain(m.statements()).collect();
    c.wait(async {
        let (created, began, row, answers, checked) = tokio::join!(
            // A message of its own: outside the try's transaction.
            c.client.batch_execute(create),
            c.client.batch_execute(begin),
            c.client.query_typed_one(measure, params),
            counts(&c.client, &statements, merge_params),
            c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        );
        created?;
        began?;
        let row = row?;
        let answers = answers?;
        checked?;
        let (kept_rows, merged) = if kept {
            (answers.first().copied(), &answers[1..])
        } else {
            (None, &answers[..])
        };
        Ok((row, kept_rows, done(merged)))
    })
}

/// Inside a rollback's transaction: merges the version kept for the publish of `replaced_by`
/// back into the task's partition by `key` (bounds `lo`, `hi` of type `ty`), every column the
/// kept table shares with the target: the partition's keys the version lacks are deleted (the
/// rows the merges since inserted), the rows whose values differ are updated back, the kept
/// rows whose keys are gone are inserted again; then the target's deferred constraints are
/// checked. Forgets the version. Returns its rows.
pub(super) fn back(
    c: &mut Conn,
    manifest: &str,
    task: &SqlTask,
    key: &[String],
    ([lo, hi], ty): ([&Value; 2], Type),
    replaced_by: i64,
) -> std::result::Result<i64, Failure> {
    let target = &task.target;
    let kept = versions::kept_table(manifest, target);
    let now = cached_columns(c, target)?;
    let names: Vec<String> = cached_columns(c, &kept)?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n != "_replaced_by" && now.iter().any(|(t, _)| t == n))
        .collect();
    if names.is_empty() {
        return Err(Error::Message(format!("the versions kept for {target} are gone")).into());
    }
    let columns = typed(&now, &names);
    let list = names
        .iter()
        .map(|n| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ");
    let m = Merging {
        table: quote_name(target),
        // The partition's rows, and those the merge had moved in from other partitions (as
        // they were there): the merge back moves them back.
        source: format!("(SELECT {list} FROM {kept} WHERE _replaced_by IN ($3, -($3::int8)))"),
        columns: &columns,
        key,
        partition_column: &task.partition_column,
        keep_missing: false,
        guard: None,
    };
    let mut statements = m.statements();
    statements.push(format!(
        "SELECT count(*) FROM {kept} WHERE _replaced_by = $3"
    ));
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (lo.sql(), ty.clone()),
        (hi.sql(), ty),
        (&replaced_by, Type::INT8),
    ];
    let answers = c.wait(async {
        let (answers, checked) = tokio::join!(
            counts(&c.client, &statements, &params),
            c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        );
        let answers = answers?;
        checked.map(|()| answers)
    })?;
    versions::drop_version(c, manifest, target, replaced_by)?;
    Ok(answers.last().copied().unwrap_or(0))
}

/// Inside a promote's transaction: merges the staged output (the source of `m`) into the
/// partition, in one round trip, in order: first what the staged rows are (their fingerprint,
/// by `row_hash`; their keys that another partition holds: with `table_scope` rows the merge
/// moves, without it a refusal that names the key and its partition), then `keep` (which
/// copies the partition's rows to the kept table, when versions are kept) and the merge's
/// statements, then the check of the target's deferred constraints. The statements take the
/// partition's bounds `lo` and `hi` (of type `ty`) and the promoting try as `$3`. Returns the
/// rows kept, the staged rows' fingerprint and what the merge did.
pub(super) fn promote(
    c: &Conn,
    m: &Merging<'_>,
    table_scope: bool,
    keep: Option<String>,
    ([lo, hi], ty, try_id): ([&Value; 2], Type, i64),
    row_hash: &str,
) -> std::result::Result<(Option<i64>, String, Merge), Failure> {
    let first = format!(
        "SELECT {}, {}, {}",
        m.counted(table_scope, false),
        fingerprint_sql(row_hash, &format!("{} AS o", m.source)),
        if table_scope {
            "NULL::text".to_string()
        } else {
            m.elsewhere()
        }
    );
    let kept = keep.is_some();
    let statements: Vec<String> = keep.into_iter().chain(m.statements()).collect();
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (lo.sql(), ty.clone()),
        (hi.sql(), ty),
        (&try_id, Type::INT8),
    ];
    let (row, answers) = c.wait(async {
        let (row, answers, checked) = tokio::join!(
            c.client.query_typed_one(&first, &params),
            counts(&c.client, &statements, &params),
            c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        );
        let row = row?;
        let answers = answers?;
        checked.map(|()| (row, answers))
    })?;
    if let Some(found) = row.get::<_, Option<String>>(2) {
        return Err(Error::Message(format!(
            "unique_key violated across partitions: key {found}, and the staged output puts it in this interval's partition; a merge would update the row of the other partition, so nothing was promoted. If the record moved, set unique_key_scope = \"table\" to move it, and promote again"
        ))
        .into());
    }
    let fingerprint: String = row.get(1);
    let rows: i64 = fingerprint
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let (kept_rows, merged) = if kept {
        (answers.first().copied(), &answers[1..])
    } else {
        (None, &answers[..])
    };
    let [missing, updated, inserted] = done(merged);
    let counted = Counted::of(&row.get::<_, Vec<i64>>(0));
    Ok((
        kept_rows,
        fingerprint,
        counted.merge(rows, inserted, updated, missing, m.keep_missing),
    ))
}

/// The columns `wanted`, in order, with their types in the target (`target`, as
/// [`target_columns`] gives them; text for one it lacks).
pub(super) fn typed(target: &[(String, String)], wanted: &[String]) -> Vec<(String, String)> {
    wanted
        .iter()
        .map(|n| {
            let ty = target
                .iter()
                .find(|(t, _)| t == n)
                .map_or_else(|| "text".to_string(), |(_, ty)| ty.clone());
            (n.clone(), ty)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merging<'a>(columns: &'a [(String, String)], key: &'a [String]) -> Merging<'a> {
        Merging {
            table: "\"t\"".into(),
            source: "src".into(),
            columns,
            key,
            partition_column: "day",
            keep_missing: false,
            guard: Some("g"),
        }
    }

    fn cols(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn values_are_compared_by_text_unless_their_equality_is_identity() {
        let c = cols(&[
            ("id", "integer"),
            ("day", "date"),
            ("amount", "numeric(10,2)"),
            ("doc", "json"),
            ("name", "character varying(20)"),
            ("tags", "integer[]"),
        ]);
        let key = vec!["id".to_string()];
        assert_eq!(
            merging(&c, &key).differ().unwrap(),
            "ROW(t.\"day\", t.\"amount\"::text, t.\"doc\"::text, t.\"name\" COLLATE \"C\", t.\"tags\"::text) \
             IS DISTINCT FROM ROW(o.\"day\", o.\"amount\"::text, o.\"doc\"::text, o.\"name\" COLLATE \"C\", o.\"tags\"::text)"
        );
    }

    #[test]
    fn a_source_of_keys_alone_updates_nothing() {
        let c = cols(&[("id", "integer")]);
        let key = vec!["id".to_string()];
        let m = merging(&c, &key);
        assert!(m.differ().is_none());
        assert_eq!(m.statements().len(), 2);
        assert!(
            m.upsert()
                .contains("SELECT 0::int8, (SELECT count(*) FROM ins)")
        );
        assert_eq!(done(&[1, 0, 2]), [1, 0, 2]);
        // Every row of the source that the target holds is then unchanged.
        assert!(
            m.counted(false, true)
                .contains("WHERE t.\"id\" = o.\"id\"))")
        );
    }

    #[test]
    fn counts_add_up_to_the_source() {
        let counted = Counted::of(&[0, 1, 2, 5, 3]);
        let m = counted.planned(10, false).unwrap();
        assert_eq!(
            (
                m.inserted,
                m.updated,
                m.deleted,
                m.unchanged,
                m.kept,
                m.moved
            ),
            (2, 3, 3, 5, 0, 1)
        );
        let kept = counted.planned(10, true).unwrap();
        assert_eq!((kept.deleted, kept.kept), (0, 3));
        assert!(Counted::of(&[0, 0]).planned(10, false).is_none());
    }
}
