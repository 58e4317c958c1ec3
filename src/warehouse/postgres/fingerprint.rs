//! Order-independent fingerprints of rows, computed by the server.

use super::*;

/// The fingerprint of the rows of `from`, as SQL, given their [`row_hash`] (a try's statement
/// computes the same in its one pass over its output): the row count and the exact sum of a
/// 64-bit hash of each row, so that the order of the rows does not matter (summed as `int8`,
/// which PostgreSQL adds up in 128 bits: no overflow, and several times faster than a
/// `numeric` sum).
pub(super) fn fingerprint_sql(row_hash: &str, from: &str) -> String {
    format!("(SELECT count(*)::text || ':' || coalesce(sum({row_hash}), 0)::text FROM {from})")
}

/// The 64-bit hash of one row over its columns, by name and type (as `format_type` or the
/// protocol names it), which fingerprints sum: each column's value hashed with a seed of its
/// own (its place), combined by `#` (xor). Integers, booleans, `uuid`s and timestamps are
/// hashed as the values they are, which is several times cheaper than hashing the row's text;
/// a `timestamptz` (or an array or a range of them) as UTC wall time, so that it does not
/// depend on the session's `TimeZone`;
/// every other type by its text (the output settings are pinned for every connection, see
/// [`conn::connect`]); a `NULL` as its seed.
pub(super) fn row_hash(columns: &[(String, String)]) -> String {
    if columns.is_empty() {
        return "0::int8".into();
    }
    let hashed: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(seed, (name, ty))| {
            let c = quote_ident(name);
            let base = ty.split('(').next().unwrap_or(ty).trim();
            let element = ty.strip_suffix("[]").unwrap_or_default();
            let h = match base {
                // Arrays of timestamptz by the text of their elements in UTC, in order.
                _ if is_timestamptz(element) || element == "timestamptz" => format!(
                    "hashtextextended((SELECT array_agg(e AT TIME ZONE 'UTC' ORDER BY i) \
                     FROM unnest({c}) WITH ORDINALITY AS u(e, i))::text, {seed})"
                ),
                // A range of instants by its bounds in UTC.
                "tstzrange" => format!(
                    "hashtextextended(CASE WHEN isempty({c}) THEN 'empty' ELSE concat_ws(',', \
                     lower_inc({c}), upper_inc({c}), lower({c}) AT TIME ZONE 'UTC', \
                     upper({c}) AT TIME ZONE 'UTC') END, {seed})"
                ),
                _ if is_timestamptz(ty) || ty == "timestamptz" => {
                    format!("timestamp_hash_extended({c} AT TIME ZONE 'UTC', {seed})")
                }
                "timestamp" | "timestamp without time zone" => {
                    format!("timestamp_hash_extended({c}, {seed})")
                }
                "bigint" | "int8" => format!("hashint8extended({c}, {seed})"),
                "integer" | "int4" | "smallint" | "int2" | "boolean" | "bool" => {
                    format!("hashint4extended({c}::int4, {seed})")
                }
                "uuid" => format!("uuid_hash_extended({c}, {seed})"),
                // A day as its number (days since 2000-01-01: every date has one, where a
                // timestamp ends in year 294276), `infinity` and `-infinity` by their text.
                "date" => format!(
                    "CASE WHEN isfinite({c}) THEN hashint4extended({c} - date '2000-01-01', {seed}) \
                     ELSE hashtextextended({c}::text, {seed}) END"
                ),
                _ => format!("hashtextextended({c}::text COLLATE \"C\", {seed})"),
            };
            format!("coalesce({h}, {seed})")
        })
        .collect();
    format!("({})", hashed.join(" # "))
}
