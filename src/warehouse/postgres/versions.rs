//! Kept versions on PostgreSQL, for `backfill rollback`: the rows a publish replaces are moved,
//! in the try's own transaction, into a table of the warehouse's `backfill` schema (one per
//! manifest and target: `backfill.kept_…`, the target's columns and `_replaced_by`), and
//! `backfill.versions` lists them. A rejected or stopped try rolls the move back with
//! everything else; a rollback puts a version back and forgets it in one transaction.

use super::conn::Conn;
use super::{Failure, cached_columns, quote_ident, quote_name};
use crate::warehouse::Error;
use crate::warehouse::versions::{Keep, Version};

/// A stable short hash of a name (FNV-1a): table names the same on every machine.
pub(super) fn short_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h >> 32)
}

/// The table that keeps the replaced rows of `target` for a manifest.
pub(crate) fn kept_table(manifest: &str, target: &str) -> String {
    format!(
        "backfill.kept_{}_{}",
        short_hash(manifest),
        short_hash(target)
    )
}

/// Creates the kept table of a target when it does not exist (once per connection), outside
/// any try's transaction: several processes may create it at once.
pub(super) fn ensure_kept(c: &mut Conn, manifest: &str, target: &str) -> Result<String, Failure> {
    let kept = kept_table(manifest, target);
    if c.kept.contains(&kept) {
        return Ok(kept);
    }
    // The name is the manifest's and the target's hashes: nothing to quote.
    super::bookkeeping::create_once(
        c,
        7262150319,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{kept}') \
             AND attname = '_replaced_by' AND NOT attisdropped)"
        ),
        &format!(
            "CREATE TABLE IF NOT EXISTS {kept} (LIKE {t}); \
             ALTER TABLE {kept} ADD COLUMN IF NOT EXISTS _replaced_by bigint; \
             CREATE INDEX IF NOT EXISTS {idx} ON {kept} (_replaced_by);",
            t = quote_name(target),
            idx = quote_ident(&format!("{}_by_try", kept.trim_start_matches("backfill."))),
        ),
    )?;
    c.kept.insert(kept.clone());
    Ok(kept)
}

/// The columns both the kept table and the target have, quoted.
pub(super) fn shared_columns(
    c: &mut Conn,
    kept: &str,
    target: &str,
) -> Result<Vec<String>, Failure> {
    // Both looked up once per connection: every try that keeps a version asks.
    let now = cached_columns(c, target)?;
    Ok(cached_columns(c, kept)?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n != "_replaced_by" && now.iter().any(|(t, _)| t == n))
        .map(|n| quote_ident(&n))
        .collect())
}

/// Inside the publish transaction, after the try's statement moved `moved` rows of the
/// partition to the kept table: records them as
/// a version (or, when the partition held exactly the new rows, carries the version they had
/// replaced over to this publish instead), then drops the interval's versions beyond the newest
/// `k.keep`.
#[expect(
    clippy::too_many_arguments,
    reason = "the publish's parts that the bookkeeping row names"
)]
pub(super) fn record(
    c: &Conn,
    manifest: &str,
    target: &str,
    interval: crate::interval::DataInterval,
    k: Keep,
    moved: Option<i64>,
    kept_fingerprint: Option<&str>,
    new_fingerprint: &str,
) -> Result<(), Failure> {
    let start = interval.start;
    let kept = kept_table(manifest, target);
    if let Some(moved) = moved {
        let same = k.same_content && kept_fingerprint == Some(new_fingerprint);
        match (same, k.version_of) {
            (true, Some(of)) => {
                // A republish of the same rows: the version to put back is still the one the
                // current content replaced.
                c.wait(c.client.execute(
                    &format!("DELETE FROM {kept} WHERE _replaced_by IN ($1, -($1::int8))"),
                    &[&k.by_try],
                ))?;
                c.wait(c.client.execute(
                    &format!(
                        "UPDATE {kept} SET _replaced_by = CASE WHEN _replaced_by < 0 THEN -($2::int8) ELSE $2 END \
                         WHERE _replaced_by IN ($1, -($1::int8))"
                    ),
                    &[&of, &k.by_try],
                ))?;
                c.wait(c.client.execute(
                    "UPDATE backfill.versions SET replaced_by = $4 \
                     WHERE manifest = $1 AND target = $2 AND replaced_by = $3",
                    &[&manifest, &target, &of, &k.by_try],
                ))?;
            }
            _ if moved == 0 && k.version_of.is_none() => {
                // Backfilled for the first time: nothing to put back (nor to move back: a
                // rollback finds no version).
                c.wait(c.client.execute(
                    &format!("DELETE FROM {kept} WHERE _replaced_by = -$1::int8"),
                    &[&k.by_try],
                ))?;
            }
            _ => {
                c.wait(c.client.execute(
                    "INSERT INTO backfill.versions (manifest, target, interval_start, interval_end, replaced_by, version_of, rows) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                    &[&manifest, &target, &start, &interval.end, &k.by_try, &k.version_of, &moved],
                ))?;
            }
        }
    }
    // The versions beyond the newest `keep` go (all of them with keep_versions = 0).
    let doomed: Vec<i64> = c
        .wait(c.client.query(
            "SELECT replaced_by FROM backfill.versions WHERE manifest = $1 AND target = $2 \
             AND interval_start = $3 ORDER BY replaced_by DESC OFFSET $4",
            &[&manifest, &target, &start, &i64::from(k.keep)],
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for by in doomed {
        drop_version(c, manifest, target, by)?;
    }
    Ok(())
}

/// Forgets the version kept for the publish of `by`: its rows and its record.
pub(super) fn drop_version(c: &Conn, manifest: &str, target: &str, by: i64) -> Result<(), Failure> {
    let kept = kept_table(manifest, target);
    let there: bool = c
        .wait(
            c.client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&kept]),
        )?
        .get(0);
    if there {
        c.wait(c.client.execute(
            &format!("DELETE FROM {kept} WHERE _replaced_by IN ($1, -($1::int8))"),
            &[&by],
        ))?;
    }
    c.wait(c.client.execute(
        "DELETE FROM backfill.versions WHERE manifest = $1 AND target = $2 AND replaced_by = $3",
        &[&manifest, &target, &by],
    ))?;
    Ok(())
}

/// The version that the publish of `replaced_by` replaced, if it is kept.
pub(super) fn find(
    c: &Conn,
    manifest: &str,
    target: &str,
    replaced_by: i64,
) -> Result<Option<Version>, Failure> {
    let booked: bool = c
        .wait(
            c.client
                .query_one("SELECT to_regclass('backfill.versions') IS NOT NULL", &[]),
        )?
        .get(0);
    if !booked {
        return Ok(None);
    }
    Ok(c.wait(c.client.query_opt(
        "SELECT replaced_by, version_of, rows FROM backfill.versions \
         WHERE manifest = $1 AND target = $2 AND replaced_by = $3",
        &[&manifest, &target, &replaced_by],
    ))?
    .map(|r| Version {
        replaced_by: r.get(0),
        version_of: r.get(1),
        rows: r.get(2),
    }))
}

/// Inside the rollback transaction, after the partition was cleared: puts the version back and
/// forgets it. Returns the rows put back.
pub(super) fn restore(
    c: &mut Conn,
    manifest: &str,
    target: &str,
    replaced_by: i64,
) -> Result<i64, Failure> {
    let kept = kept_table(manifest, target);
    let cols = shared_columns(c, &kept, target)?.join(", ");
    if cols.is_empty() {
        return Err(Error::Message(format!("the versions kept for {target} are gone")).into());
    }
    let rows = c.wait(c.client.execute(
        &format!(
            "INSERT INTO {t} ({cols}) SELECT {cols} FROM {kept} WHERE _replaced_by = $1",
            t = quote_name(target)
        ),
        &[&replaced_by],
    ))?;
    drop_version(c, manifest, target, replaced_by)?;
    Ok(i64::try_from(rows).unwrap_or(i64::MAX))
}
