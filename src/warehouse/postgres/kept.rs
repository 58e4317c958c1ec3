//! Kept versions of replaced partitions: their record at publish, their fingerprints, and
//! `rollback`, which puts one back.

use super::*;

/// Inside a publish transaction, once the partition's old rows were moved aside (or deleted):
/// records them as a version of the interval, or carries the version they replaced when they
/// were exactly the new rows, and drops the versions beyond `keep_versions`.
pub(super) fn finish_versions(
    c: &mut Conn,
    manifest: &str,
    p: &PublishAs<'_>,
    written: &Written,
    try_id: i64,
    fingerprint: &str,
) -> std::result::Result<(), Failure> {
    let Some(k) = p.keep else {
        return Ok(());
    };
    if k.keep == 0 && written.moved.is_none() && !has_versions(c, manifest)? {
        return Ok(());
    }
    let kept_fingerprint = match (k.same_content, written.moved) {
        (true, Some(_)) => kept_fingerprint(c, manifest, &p.task.target, &written.columns, try_id)?,
        _ => None,
    };
    versions::record(
        c,
        manifest,
        &p.task.target,
        p.interval,
        k,
        written.moved,
        kept_fingerprint.as_deref(),
        fingerprint,
    )
}

/// Whether the warehouse keeps versions for this manifest at all (looked up once per
/// connection): with `keep_versions = 0`, versions kept before are dropped by the next publish
/// of their interval, and a warehouse that has none is not asked each time.
pub(super) fn has_versions(c: &mut Conn, manifest: &str) -> std::result::Result<bool, Failure> {
    if let Some(known) = c.has_versions {
        return Ok(known);
    }
    let found: bool = c
        .wait(c.client.query_one(
            "SELECT EXISTS (SELECT 1 FROM backfill.versions WHERE manifest = $1)",
            &[&manifest],
        ))?
        .get(0);
    c.has_versions = Some(found);
    Ok(found)
}

/// The fingerprint of the rows the try moved to the kept table, over the query's columns
/// `list`; `None` when the kept table lacks one of them.
pub(super) fn kept_fingerprint(
    c: &Conn,
    manifest: &str,
    target: &str,
    columns: &[String],
    try_id: i64,
) -> std::result::Result<Option<String>, Failure> {
    let kept = versions::kept_table(manifest, target);
    let have = target_columns(c, &kept)?;
    let mut typed = Vec::new();
    for col in columns {
        match have.iter().find(|(n, _)| n == col) {
            Some((n, t)) => typed.push((n.clone(), t.clone())),
            None => return Ok(None),
        }
    }
    let list = row_hash(&typed);
    let list = list.as_str();
    let row = c.wait(c.client.query_one(
        &format!(
            "SELECT {}",
            fingerprint_sql(
                list,
                &format!("(SELECT * FROM {kept} WHERE _replaced_by = $1) k")
            )
        ),
        &[&try_id],
    ))?;
    Ok(Some(format!("pg:{}", row.get::<_, String>(0))))
}

/// The version kept for the publish of try `key`, with the fingerprint of its rows over the
/// query's columns (what the partition holds once it is put back).
pub(crate) fn kept_version(
    task: &SqlTask,
    manifest: &str,
    key: i64,
) -> Result<Option<(crate::warehouse::versions::Version, String)>> {
    let wh = &task.warehouse;
    let mut c = conn::take_at(wh)?;
    let result = (|| {
        let Some(v) = versions::find(&c, manifest, &task.target, key)? else {
            return Ok(None);
        };
        let columns = query_columns(&mut c, task)?;
        let fingerprint = kept_fingerprint(&c, manifest, &task.target, &columns, key)?
            .unwrap_or_else(|| "-".into());
        Ok(Some((v, fingerprint)))
    })();
    conn::give(c);
    result.map_err(|e: Failure| e.at(wh))
}

/// Rolls the interval back to the version kept for the publish of `key` (merged back by key
/// for a merge task, see [`merge::back`]), in one transaction that the manifest must allow, booked like a publish (as try `try_id`), and recorded in the
/// manifest by that transaction when the manifest is in this database.
pub(crate) fn roll_back(
    r: &crate::warehouse::backend::RollBack<'_>,
    allowed: &Allowed<'_>,
) -> Result<i64> {
    let crate::warehouse::backend::RollBack {
        task,
        interval,
        tz,
        key,
        manifest,
        try_id,
        fingerprint,
        ..
    } = *r;
    let wh = &task.warehouse;
    let mut c = conn::take_at(wh)?;
    let result = (|| -> std::result::Result<i64, Failure> {
        book(&mut c)?;
        let ty = partition_type_now(&c, task)?;
        let [lo, hi] = ty.bounds(interval, tz)?;
        let pc = quote_ident(&task.partition_column);
        c.wait(
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ"),
        )?;
        if versions::find(&c, manifest, &task.target, key)?.is_none() {
            return Err(Error::Message(format!(
                "the version kept for try {key} is gone from {}",
                task.target
            ))
            .into());
        }
        let rows = match &task.write {
            // Merged back by key: the rows another table references stay while the version
            // holds them too.
            WritePattern::Merge { key: by, .. } => {
                merge::back(&mut c, manifest, task, by, ([&lo, &hi], ty.pg_type()), key)?
            }
            WritePattern::Replace => {
                c.wait(c.client.execute(
                    &format!(
                        "DELETE FROM {} WHERE {pc} >= $1 AND {pc} < $2",
                        quote_name(&task.target)
                    ),
                    &[lo.sql(), hi.sql()],
                ))?;
                versions::restore(&mut c, manifest, &task.target, key)?
            }
        };
        lock_and_book(
            &mut c,
            &task.target,
            interval,
            manifest,
            try_id,
            rows,
            fingerprint,
        )?;
        ask(allowed)?;
        if let Some(m) = r.in_manifest {
            InPublishValues::of(m, try_id, rows, interval).run(&mut c)?;
        }
        let committed = c.wait(c.client.batch_execute("COMMIT"));
        settled(&c, committed, task, interval, manifest, try_id).map(|()| rows)
    })();
    if result.is_err() {
        let _ = c.wait(c.client.batch_execute("ROLLBACK"));
    }
    conn::give(c);
    result.map_err(|e| e.at(wh))
}

/// What the kept versions of a task's target cost: versions, rows, and bytes of the kept table
/// with its index (all of it belongs to this manifest and target).
pub(crate) fn storage(
    task: &SqlTask,
    manifest: &str,
) -> Result<crate::warehouse::versions::Storage> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let kept = versions::kept_table(manifest, &task.target);
    let row = c.wait(c.client.query_one(
        "SELECT CASE WHEN to_regclass('backfill.versions') IS NULL THEN 0 ELSE \
           (SELECT count(*) FROM backfill.versions WHERE manifest = $1 AND target = $2) END, \
         CASE WHEN to_regclass('backfill.versions') IS NULL THEN 0 ELSE \
           (SELECT coalesce(sum(rows), 0)::int8 FROM backfill.versions WHERE manifest = $1 AND target = $2) END, \
         coalesce(pg_total_relation_size(to_regclass($3)), 0)",
        &[&manifest, &task.target, &kept],
    ));
    conn::give(c);
    let row = row.map_err(pg(wh))?;
    Ok(crate::warehouse::versions::Storage {
        target: task.target.clone(),
        versions: row.get(0),
        rows: row.get(1),
        bytes: row.get(2),
    })
}

/// `backfill forget`: removes what the warehouse keeps for manifest `manifest` of the
/// target's intervals starting within `range` (unix seconds, both included; `None`: every
/// interval) and published by its tries up to `last_try`: the kept versions, the bookings of
/// their publishes and the partitions' claims, in one transaction; then the kept table, once
/// it keeps nothing. With `dry`, only counts the versions. Returns how many versions went (or
/// would).
pub(crate) fn forget(
    task: &SqlTask,
    manifest: &str,
    range: Option<(i64, i64)>,
    last_try: i64,
    dry: bool,
) -> Result<i64> {
    let wh = &task.warehouse;
    let c = conn::take_at(wh)?;
    let (lo, hi) = range.unwrap_or((i64::MIN, i64::MAX));
    let kept = versions::kept_table(manifest, &task.target);
    let within = |column: &str| {
        format!(
            "manifest = $1 AND target = $2 AND extract(epoch FROM {column})::int8 BETWEEN $3 AND $4"
        )
    };
    let result = (|| -> std::result::Result<i64, tokio_postgres::Error> {
        let there: bool = c
            .wait(
                c.client
                    .query_one("SELECT to_regclass('backfill.versions') IS NOT NULL", &[]),
            )?
            .get(0);
        if !there {
            return Ok(0);
        }
        let doomed: Vec<i64> = c
            .wait(c.client.query(
                &format!(
                    "SELECT replaced_by FROM backfill.versions WHERE {} AND replaced_by <= $5",
                    within("interval_start")
                ),
                &[&manifest, &task.target, &lo, &hi, &last_try],
            ))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let count = i64::try_from(doomed.len()).unwrap_or(i64::MAX);
        if dry {
            return Ok(count);
        }
        c.wait(c.client.batch_execute("BEGIN"))?;
        let done = (|| -> std::result::Result<(), tokio_postgres::Error> {
            let has_kept: bool = c
                .wait(
                    c.client
                        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&kept]),
                )?
                .get(0);
            if has_kept {
                c.wait(c.client.execute(
                    &format!(
                        "DELETE FROM {kept} WHERE _replaced_by = ANY($1) OR -_replaced_by = ANY($1)"
                    ),
                    &[&doomed],
                ))?;
            }
            c.wait(c.client.execute(
                &format!(
                    "DELETE FROM backfill.versions WHERE {} AND replaced_by <= $5",
                    within("interval_start")
                ),
                &[&manifest, &task.target, &lo, &hi, &last_try],
            ))?;
            for table in ["backfill.publishes", "backfill.partitions"] {
                c.wait(c.client.execute(
                    &format!(
                        "DELETE FROM {table} WHERE {} AND try_id <= $5",
                        within("partition_start")
                    ),
                    &[&manifest, &task.target, &lo, &hi, &last_try],
                ))?;
            }
            let left: bool = c
                .wait(c.client.query_one(
                    "SELECT EXISTS (SELECT 1 FROM backfill.versions WHERE manifest = $1 AND target = $2)",
                    &[&manifest, &task.target],
                ))?
                .get(0);
            if has_kept && !left {
                // Dropped only once it holds nothing: a publish that moved rows into it and
                // has not committed yet is waited for (the lock), and its rows keep it.
                c.wait(c.client.batch_execute(&format!(
                    "SELECT pg_advisory_xact_lock(7262150319); LOCK TABLE {kept} IN ACCESS EXCLUSIVE MODE"
                )))?;
                let empty: bool = c
                    .wait(c.client.query_one(
                        &format!(
                            "SELECT NOT EXISTS (SELECT 1 FROM {kept}) AND NOT EXISTS \
                             (SELECT 1 FROM backfill.versions WHERE manifest = $1 AND target = $2)"
                        ),
                        &[&manifest, &task.target],
                    ))?
                    .get(0);
                if empty {
                    c.wait(c.client.batch_execute(&format!("DROP TABLE {kept}")))?;
                }
            }
            c.wait(c.client.batch_execute("COMMIT"))
        })();
        if done.is_err() {
            let _ = c.wait(c.client.batch_execute("ROLLBACK"));
        }
        done.map(|()| count)
    })();
    conn::give(c);
    result.map_err(pg(wh))
}
