//! Staged outputs (tables of their own in the `backfill` schema), their promote into the
//! target, and their cleanup.

use super::*;

/// The table that holds the staged output of try `try_id` of a manifest: in the schema of the
/// bookkeeping tables, named by a hash of the manifest's name and the try, so that backfills of
/// several manifests staging into one database never meet.
pub(crate) fn staged_table(manifest: &str, try_id: i64) -> String {
    // FNV-1a: the same on every machine and every build.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in manifest.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("backfill.staged_{:08x}_{try_id}", h >> 32)
}

/// The prefix of every staged table of a manifest.
pub(super) fn staged_prefix(manifest: &str) -> String {
    staged_table(manifest, 0)
        .trim_start_matches("backfill.")
        .trim_end_matches('0')
        .to_string()
}

/// Whether `location` (as recorded for a staged try) names a staged table.
pub(crate) fn is_staged_table(location: &str) -> bool {
    location
        .strip_prefix("backfill.staged_")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// A staged output, reopened to promote it.
pub(crate) struct Staged {
    pub(super) table: String,
    pub(super) manifest: String,
    pub(super) try_id: i64,
    pub(super) measures: AuditMeasures,
}

/// Reopens the staged output in `table` for try `try_id` (the promoting try) of `manifest`.
pub(crate) fn staged(table: &str, manifest: &str, try_id: i64) -> Box<dyn Pending> {
    Box::new(Staged {
        table: table.to_string(),
        manifest: manifest.to_string(),
        try_id,
        measures: AuditMeasures::default(),
    })
}

impl Pending for Staged {
    fn measures(&self) -> &AuditMeasures {
        &self.measures
    }

    fn file(&self) -> Option<&Path> {
        None
    }

    /// Promotes: in one transaction, the interval's rows of the target are replaced by the
    /// staged rows (merged into them, for a merge task), whose fingerprint must still be the
    /// one the gate saw; the staged table goes with the same commit.
    fn publish(
        &mut self,
        p: &PublishAs<'_>,
        allowed: &Allowed<'_>,
        _waiting: &mut dyn FnMut(),
    ) -> Result<i64> {
        let wh = &p.task.warehouse;
        if !is_staged_table(&self.table) {
            return Err(Error::Message(format!("`{}` is not a staged table", self.table)).at(wh));
        }
        let mut c = conn::take_at(wh)?;
        if crate::fault::point("publish") {
            conn::give(c);
            return Err(Error::Message("connection lost (injected)".into()).at(wh));
        }
        let result = promote_in(
            &mut c,
            p,
            &self.table,
            &self.manifest,
            self.try_id,
            allowed,
            Transaction::Own,
        );
        if result.is_err() {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
        }
        conn::give(c);
        // What a merge did, for the promoting try's record.
        result
            .map(|(rows, merged)| {
                self.measures.merge = merged;
                rows
            })
            .map_err(|e| e.at(wh))
    }

    fn plan_merge(&mut self, p: &PublishAs<'_>) -> Result<Option<crate::gate::Merge>> {
        let WritePattern::Merge { key, keep_missing } = &p.task.write else {
            return Ok(None);
        };
        let wh = &p.task.warehouse;
        let c = conn::take_at(wh)?;
        let planned = (|| -> std::result::Result<crate::gate::Merge, Failure> {
            let (schema, name) = self
                .table
                .split_once('.')
                .unwrap_or(("backfill", &self.table));
            let typed = target_columns(&c, &format!("{schema}.{name}"))?;
            if typed.is_empty() {
                return Err(Error::Message(format!(
                    "the staged output {} is gone; stage the interval again",
                    self.table
                ))
                .into());
            }
            let ty = target_columns(&c, &p.task.target)?
                .iter()
                .find(|(n, _)| *n == p.task.partition_column)
                .and_then(|(_, t)| ColumnType::of(t))
                .ok_or_else(|| {
                    Error::Message(format!(
                        "target table `{}` has no date, timestamp or timestamptz column `{}`",
                        p.task.target, p.task.partition_column
                    ))
                })?;
            let [lo, hi] = ty.bounds(p.interval, p.tz)?;
            let m = merge::Merging {
                table: quote_name(&p.task.target),
                source: format!("{}.{}", quote_ident(schema), quote_ident(name)),
                columns: &typed,
                key,
                partition_column: &p.task.partition_column,
                keep_missing: *keep_missing,
                guard: None,
            };
            let row = c.wait(c.client.query_one(&m.plan(), &[lo.sql(), hi.sql()]))?;
            Ok(crate::gate::Merge::counted(
                row.get(0),
                row.get(1),
                row.get(2),
                row.get(3),
                *keep_missing,
            ))
        })();
        conn::give(c);
        planned.map(Some).map_err(|e| e.at(wh))
    }

    fn member(&mut self) -> Option<crate::warehouse::backend::Member<'_>> {
        Some(crate::warehouse::backend::Member::Staged {
            table: &self.table,
            manifest: &self.manifest,
            try_id: self.try_id,
            merged: &mut self.measures.merge,
        })
    }

    fn remove(self: Box<Self>) {}

    fn keep(self: Box<Self>) {}

    fn stage(self: Box<Self>) -> Result<PathBuf> {
        Ok(PathBuf::from(&self.table))
    }
}

/// Promotes several staged outputs of one warehouse in one transaction (`promote --atomic`):
/// all of them, or none. Each is promoted as [`Staged::publish`] would; the manifest is asked
/// once, last. Returns each one's rows, in order; what each merge did is in its member.
pub(crate) fn promote_group(
    group: &mut [(crate::warehouse::backend::Member<'_>, &PublishAs<'_>)],
    allowed: &Allowed<'_>,
) -> Result<Vec<i64>> {
    use crate::warehouse::backend::Member;
    // Only staged tables: (table, manifest, try id, what its merge did).
    let mut staged = Vec::with_capacity(group.len());
    for (m, p) in group.iter_mut() {
        match m {
            Member::Staged {
                table,
                manifest,
                try_id,
                merged,
            } => staged.push(((*table, *manifest, *try_id, &mut **merged), &**p)),
            Member::Audited(_) => {
                return Err(Error::Message(
                    "an audit file cannot be promoted into PostgreSQL".into(),
                ));
            }
        }
    }
    let group = &mut staged;
    let Some((_, first)) = group.first() else {
        return Ok(Vec::new());
    };
    let wh = first.task.warehouse.clone();
    if let Some(((table, ..), _)) = group.iter().find(|((t, ..), _)| !is_staged_table(t)) {
        return Err(Error::Message(format!("`{table}` is not a staged table")).at(&wh));
    }
    let mut c = conn::take_at(&wh)?;
    if crate::fault::point("publish") {
        conn::give(c);
        return Err(Error::Message("connection lost (injected)".into()).at(&wh));
    }
    // The manifest is asked once every member's partition is locked and booked: a recoverer
    // that settles any member then waits for this transaction to end.
    let not_yet = || -> std::result::Result<bool, crate::warehouse::AskError> { Ok(true) };
    let result = (|| -> std::result::Result<Vec<i64>, Failure> {
        book(&mut c)?;
        for ((_, manifest, ..), p) in group.iter() {
            if p.keep.is_some_and(|k| k.keep > 0) {
                versions::ensure_kept(&mut c, manifest, &p.task.target)?;
            }
        }
        c.wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ"),
        )?;
        let mut rows = Vec::with_capacity(group.len());
        for ((table, manifest, try_id, merged), p) in group.iter_mut() {
            let what = format!("`{}` for {}", p.task.target, p.interval);
            let (n, done) = promote_in(
                &mut c,
                p,
                table,
                manifest,
                *try_id,
                &not_yet,
                Transaction::Group,
            )
            .map_err(|e| match e {
                Failure::Other(e) => Failure::Other(e.of(&what)),
                e => e,
            })?;
            **merged = done;
            rows.push(n);
        }
        ask(allowed)?;
        crate::fault::point("before-commit");
        let committed = c.wait(c.client.batch_execute("COMMIT"));
        let ((_, manifest, try_id, _), p) = &group[0];
        settled(&c, committed, p.task, p.interval, manifest, *try_id)?;
        Ok(rows)
    })();
    if result.is_err() {
        let _ = c.wait(c.client.batch_execute("ROLLBACK"));
    }
    conn::give(c);
    result.map_err(|e| e.at(&wh))
}

/// Whose transaction a promote runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transaction {
    /// Its own: the promote begins it and commits.
    Own,
    /// A group's (`promote --atomic`): open already, and the caller commits.
    Group,
}

/// Promotes the staged table `staged` (see [`Staged::publish`]): the rows published, and what
/// the merge did for a merge task. In a [`Transaction::Group`], the caller's transaction is
/// open already, and the caller commits.
pub(super) fn promote_in(
    c: &mut Conn,
    p: &PublishAs<'_>,
    staged: &str,
    manifest: &str,
    try_id: i64,
    allowed: &Allowed<'_>,
    transaction: Transaction,
) -> std::result::Result<(i64, Option<crate::gate::Merge>), Failure> {
    book(c)?;
    let promoting = Promoting::of(c, p, staged, manifest, try_id)?;
    if transaction == Transaction::Own {
        c.wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ"),
        )?;
    }
    let promoted = match &p.task.write {
        WritePattern::Merge { key, keep_missing } => promoting.merge(c, p, key, *keep_missing)?,
        WritePattern::Replace => promoting.replace(c, p)?,
    };
    let merged = promoted.merged;
    published(
        c,
        p,
        (staged, &promoting.staged),
        (manifest, try_id, allowed, transaction),
        promoted.written,
        (promoted.rows, &promoted.fingerprint),
        merged,
    )
    .map(|rows| (rows, merged))
}

/// What a promote of a staged output into its target's partition is made of.
struct Promoting<'a> {
    task: &'a SqlTask,
    /// The staged table, quoted; its columns with their types, and their names.
    staged: String,
    typed: Vec<(String, String)>,
    cols: Vec<String>,
    /// The target and its partition column, quoted.
    table: String,
    pc: String,
    /// The partition column's type, and the interval's bounds as its values.
    ty: ColumnType,
    lo: Value,
    hi: Value,
    /// The kept table, when the rows being replaced are kept for rollback.
    kept: Option<String>,
    try_id: i64,
}

/// What a promote wrote into the target, before its end (see [`published`]).
struct Promoted {
    written: Written,
    rows: i64,
    fingerprint: String,
    merged: Option<crate::gate::Merge>,
}

impl<'a> Promoting<'a> {
    /// The staged table `staged` (which must still be there) and the target's partition of
    /// `p`; the kept table made ready when versions are kept.
    fn of(
        c: &mut Conn,
        p: &PublishAs<'a>,
        staged: &str,
        manifest: &str,
        try_id: i64,
    ) -> std::result::Result<Self, Failure> {
        let task = p.task;
        let (schema, name) = staged.split_once('.').unwrap_or(("backfill", staged));
        let typed: Vec<(String, String)> = target_columns(c, &format!("{schema}.{name}"))?;
        let cols: Vec<String> = typed.iter().map(|(n, _)| n.clone()).collect();
        if cols.is_empty() {
            return Err(Error::Message(format!(
                "the staged output {staged} is gone; stage the interval again"
            ))
            .into());
        }
        let columns = target_columns(c, &task.target)?;
        let Some(ty) = columns
            .iter()
            .find(|(n, _)| *n == task.partition_column)
            .and_then(|(_, t)| ColumnType::of(t))
        else {
            return Err(Error::Message(format!(
                "target table `{}` has no date, timestamp or timestamptz column `{}`",
                task.target, task.partition_column
            ))
            .into());
        };
        let [lo, hi] = ty.bounds(p.interval, p.tz)?;
        let staged = format!("{}.{}", quote_ident(schema), quote_ident(name));
        // The rows being replaced are kept for rollback, as by any publish.
        let kept = match p.keep {
            Some(k) if k.keep > 0 => Some(versions::ensure_kept(c, manifest, &task.target)?),
            _ => None,
        };
        Ok(Self {
            task,
            staged,
            typed,
            cols,
            table: quote_name(&task.target),
            pc: quote_ident(&task.partition_column),
            ty,
            lo,
            hi,
            kept,
            try_id,
        })
    }

    /// A merge task's promote: the staged rows merged into the partition by `key` (see
    /// [`merge::promote`]).
    fn merge(
        &self,
        c: &mut Conn,
        p: &PublishAs<'_>,
        key: &[String],
        keep_missing: bool,
    ) -> std::result::Result<Promoted, Failure> {
        let task = self.task;
        let merging = merge::Merging {
            table: self.table.clone(),
            source: self.staged.clone(),
            columns: &self.typed,
            key,
            partition_column: &task.partition_column,
            keep_missing,
            guard: None,
        };
        let keep = match &self.kept {
            Some(kept) => Some(merge::keep(
                &merging,
                kept,
                &versions::shared_columns(c, kept, &task.target)?,
                3,
            )),
            None => None,
        };
        let (moved, fingerprint, done) = merge::promote(
            c,
            &merging,
            p.table_keys.is_some(),
            keep,
            ([&self.lo, &self.hi], self.ty.pg_type(), self.try_id),
            &row_hash(&self.typed),
        )
        .map_err(refused_promote)?;
        Ok(Promoted {
            written: Written {
                moved,
                columns: self.cols.clone(),
            },
            rows: done.inserted + done.updated + done.unchanged,
            fingerprint: format!("pg:{fingerprint}"),
            merged: Some(done),
        })
    }

    /// A replace task's promote: the partition's rows deleted (moved to the kept table when
    /// versions are kept), the staged rows' keys looked for in other partitions when the key
    /// is table-wide, then the staged rows inserted.
    fn replace(&self, c: &mut Conn, p: &PublishAs<'_>) -> std::result::Result<Promoted, Failure> {
        let moved = self.delete_partition(c)?;
        // Before the insert, which a key of the target would refuse with less to say.
        if let Some(keys) = p.table_keys.filter(|k| !k.is_empty())
            && let Some(found) =
                key_elsewhere(c, self.task, keys, &self.lo, &self.hi, &self.staged)?
        {
            return Err(Error::Message(format!(
                "unique_key violated across partitions: key {found}; the source moved that record out of its old partition, so rerun the old partition first, then promote again"
            ))
            .into());
        }
        let fingerprint = self.insert_staged(c)?;
        let rows: i64 = fingerprint
            .trim_start_matches("pg:")
            .split(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok(Promoted {
            written: Written {
                moved,
                columns: self.cols.clone(),
            },
            rows,
            fingerprint,
            merged: None,
        })
    }

    /// Deletes the interval's rows of the target, moving them to the kept table when versions
    /// are kept: how many moved then.
    fn delete_partition(&self, c: &mut Conn) -> std::result::Result<Option<i64>, Failure> {
        let (table, pc, lo, hi) = (&self.table, &self.pc, &self.lo, &self.hi);
        Ok(match &self.kept {
            Some(kept) => {
                let keep_cols = versions::shared_columns(c, kept, &self.task.target)?.join(", ");
                let n = c.wait(c.client.execute(
                    &format!(
                        "WITH d AS (DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2 RETURNING *) \
                         INSERT INTO {kept} ({keep_cols}, _replaced_by) SELECT {keep_cols}, $3::int8 FROM d"
                    ),
                    &[lo.sql(), hi.sql(), &self.try_id],
                ))?;
                Some(i64::try_from(n).unwrap_or(i64::MAX))
            }
            None => {
                c.wait(c.client.execute(
                    &format!("DELETE FROM {table} WHERE {pc} >= $1 AND {pc} < $2"),
                    &[lo.sql(), hi.sql()],
                ))?;
                None
            }
        })
    }

    /// Inserts the staged rows into the target and checks its deferred constraints: the
    /// fingerprint of the rows inserted.
    fn insert_staged(&self, c: &Conn) -> std::result::Result<String, Failure> {
        let (table, staged_q) = (&self.table, &self.staged);
        let list = self
            .cols
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let row = c
            .wait(c.client.query_one(
                &format!(
                    "WITH ins AS (INSERT INTO {table} ({list}) SELECT {list} FROM {staged_q} RETURNING *) \
                     SELECT {}",
                    fingerprint_sql(&row_hash(&self.typed), "ins")
                ),
                &[],
            ))
            .and_then(|row| {
                // A deferred constraint is checked now, before anything is booked.
                c.wait(c.client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE"))
                    .map(|()| row)
            })
            .map_err(|e| refused_promote(e.into()))?;
        Ok(format!("pg:{}", row.get::<_, String>(0)))
    }
}

/// The end of a promote, once the staged rows are in the target (`written`: what went to the
/// kept table), of `rows` rows and `fingerprint`: checks that they are the rows the gate
/// judged, records the version they replaced, books the publish (and records it in the
/// manifest, with what a merge did, when the manifest is in this database), drops the staged
/// table and commits (in a [`Transaction::Group`], the caller commits). Returns the rows
/// published.
fn published(
    c: &mut Conn,
    p: &PublishAs<'_>,
    (staged, staged_q): (&str, &str),
    (manifest, try_id, allowed, transaction): (&str, i64, &Allowed<'_>, Transaction),
    written: Written,
    (rows, fingerprint): (i64, &str),
    merged: Option<crate::gate::Merge>,
) -> std::result::Result<i64, Failure> {
    let task = p.task;
    if let Some(expected) = p.expect_fingerprint
        && expected != fingerprint
    {
        return Err(Error::Message(format!(
            "the staged output {staged} changed since it was staged (fingerprint {fingerprint}, staged {expected}); stage the interval again"
        ))
        .into());
    }
    finish_versions(c, manifest, p, &written, try_id, fingerprint)?;
    lock_and_book(
        c,
        &task.target,
        p.interval,
        manifest,
        try_id,
        rows,
        fingerprint,
    )?;
    ask(allowed)?;
    if let Some(m) = p.in_manifest {
        InPublishValues::of(m, try_id, rows, p.interval)
            .merged(merged.as_ref())
            .run(c)?;
    }
    if transaction == Transaction::Group {
        c.wait(c.client.batch_execute(&format!("DROP TABLE {staged_q}")))?;
        return Ok(rows);
    }
    let committed = c.wait(
        c.client
            .batch_execute(&format!("DROP TABLE {staged_q}; COMMIT")),
    );
    settled(c, committed, task, p.interval, manifest, try_id).map(|()| rows)
}

/// A promote's failure: a constraint of the target that refused the staged rows, said so.
fn refused_promote(e: Failure) -> Failure {
    match e {
        Failure::Pg(e) if is_constraint(&e) => Error::Message(format!(
            "{}: {}; nothing was promoted: stage the interval again once the conflicting rows are gone",
            crate::gate::REFUSED_BY_TARGET,
            constraint_message(&e)
        ))
        .into(),
        e => e,
    }
}

/// A key of the staged output that a partition of the target other than the interval's holds,
/// with that partition (`unique_key_scope = "table"`), looked up through the key's index.
pub(super) fn key_elsewhere(
    c: &Conn,
    task: &SqlTask,
    keys: &[String],
    lo: &Value,
    hi: &Value,
    staged: &str,
) -> std::result::Result<Option<String>, Failure> {
    let pc = quote_ident(&task.partition_column);
    let k = keys
        .iter()
        .map(|k| quote_ident(k))
        .collect::<Vec<_>>()
        .join(", ");
    let tk = keys
        .iter()
        .map(|k| format!("t.{}", quote_ident(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let row = c.wait(c.client.query_opt(
        &format!(
            "SELECT concat_ws(' ', ({tk})::text, 'in partition', t.{pc}::text) FROM {} t \
             WHERE ({tk}) IN (SELECT {k} FROM {staged}) AND NOT (t.{pc} >= $1 AND t.{pc} < $2) LIMIT 1",
            quote_name(&task.target)
        ),
        &[lo.sql(), hi.sql()],
    ))?;
    Ok(row.map(|r| r.get(0)))
}

/// Drops a staged table (a discarded output); a table that is gone already is not an error.
pub(crate) fn drop_staged(w: &Warehouse, table: &str) -> Result<()> {
    if !is_staged_table(table) {
        return Ok(());
    }
    let c = conn::take_at(w)?;
    let dropped = c.wait(
        c.client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}")),
    );
    conn::give(c);
    dropped.map_err(pg(w))
}

/// Drops the staged tables of manifest `manifest` whose try `keep` does not name: outputs of
/// tries that were killed between staging and recording it, or whose staging the manifest
/// settled otherwise. Returns how many went.
pub(crate) fn sweep_staged(
    w: &Warehouse,
    manifest: &str,
    keep: &dyn Fn(i64) -> bool,
) -> Result<usize> {
    let prefix = staged_prefix(manifest);
    sweep_tables(w, &prefix, |_, name| {
        let try_id = name
            .strip_prefix(&prefix)
            .and_then(|t| t.parse::<i64>().ok());
        Ok(try_id.is_some_and(|t| !keep(t)))
    })
}

/// Drops the tables of the `backfill` schema whose name starts with `prefix` and that `gone`
/// (asked on the same connection) says nobody needs: how many went.
pub(super) fn sweep_tables(
    w: &Warehouse,
    prefix: &str,
    mut gone: impl FnMut(&Conn, &str) -> std::result::Result<bool, tokio_postgres::Error>,
) -> Result<usize> {
    let c = conn::take_at(w)?;
    let found = c.wait(c.client.query(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'backfill' AND c.relkind = 'r' AND starts_with(c.relname::text, $1)",
        &[&prefix],
    ));
    let mut dropped = 0;
    let result = found.map_err(pg(w)).and_then(|rows| {
        for r in rows {
            let name: String = r.get(0);
            if gone(&c, &name).map_err(pg(w))? {
                c.wait(c.client.batch_execute(&format!(
                    "DROP TABLE IF EXISTS backfill.{}",
                    quote_ident(&name)
                )))
                .map_err(pg(w))?;
                dropped += 1;
            }
        }
        Ok(dropped)
    });
    conn::give(c);
    result
}
