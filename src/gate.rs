//! The publication gate, as a pure function: what was measured about a try's output -> publish,
//! publish an explicit empty partition, or reject with a reason.
//!
//! Checks, in order; the first failure rejects:
//! 1. every output row lies inside the interval (`row outside interval`);
//! 2. the `unique_key` columns are unique in the output (and, with `unique_key_scope =
//!    "table"`, held by no other partition); then the rules on values of severity `error`
//!    (`not_null`, `accepted_values`, `range`, the checks); then the target's own constraints
//!    (a primary key, a unique constraint or index, a check) accept the output (`target
//!    constraint`): a rule the gate was given is named before a constraint, on every engine;
//! 3. the source has rows but the output has none (`zero rows while source has data`);
//! 4. source and output are both empty: published as an explicit empty partition with
//!    `allow_empty = true`, rejected otherwise;
//! 5. |output - source| / source > tolerance;
//! 6. |output - published| / published > tolerance against the currently published try, unless
//!    `--allow-drift`.
//!
//! The numbers come from tasks and commands and are not trusted: a negative count is not a
//! verdict but a failed try, and the arithmetic cannot overflow.

use crate::words::{plural, thousands};
use std::fmt;

/// What was measured about one try's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measures {
    pub rows: i64,
    /// Rows whose partition column lies outside the interval (SQL tasks).
    pub outside: Option<i64>,
    /// Distinct partition values outside the interval as messages show them (`NULL`, `'x'`),
    /// in the order found: up to [`SHOWN`], and one more when there are others.
    pub outside_values: Vec<String>,
    /// Values of the unique key that occur more than once (SQL tasks with `unique_key`).
    pub duplicate_keys: Option<i64>,
    /// Source rows of the interval, when the gate has a `source_count`.
    pub source: Option<i64>,
    /// Rows of the currently published try of this task and interval.
    pub published: Option<i64>,
    /// Why the output's partition values are not of one representation (SQL tasks).
    pub mixed: Option<String>,
    /// A key of the output that another partition of the target already holds, and where
    /// (`unique_key_scope = "table"`).
    pub elsewhere: Option<String>,
    /// The target's own constraint refused the output: the database's message (SQL tasks).
    pub constraint: Option<String>,
    /// What each rule on the output's values found.
    pub found: Vec<Found>,
    /// With `history`: the rows of the task's published partitions before this interval,
    /// newest first, as many as asked when there are that many.
    pub history: Option<Vec<i64>>,
    /// With `write = "merge"`: what the merge would do to the partition. `rows` is then the
    /// partition's rows after it (the output's, and with `on_missing = "keep"` the kept ones).
    pub merge: Option<Merge>,
}

/// What a merge does to a partition, row by row: measured before the gate judges it, and
/// recorded with the try once it published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Merge {
    /// Output rows whose key the target did not hold.
    pub inserted: i64,
    /// Output rows whose key the target held with other values (or in another partition, with
    /// `unique_key_scope = "table"`: the row moves).
    pub updated: i64,
    /// Keys of the partition that the output no longer has, deleted.
    pub deleted: i64,
    /// Output rows equal to the target's: not written.
    pub unchanged: i64,
    /// Keys of the partition that the output no longer has, kept (`on_missing = "keep"`).
    pub kept: i64,
    /// Of `updated`, rows that another partition held (`unique_key_scope = "table"`): the
    /// merge moves them into this one.
    pub moved: i64,
    /// Output rows with a `NULL` in the key, which no merge can match (the gate rejects them).
    pub null_keys: i64,
}

impl Merge {
    /// What a merge of `rows` output rows would do, counted: `inserted` of them have a key the
    /// target lacks, `unchanged` equal the target's row, the rest are updated; `missing` keys of
    /// the partition the output lacks are deleted (or kept, with `keep_missing`).
    pub(crate) fn counted(
        rows: i64,
        inserted: i64,
        unchanged: i64,
        missing: i64,
        keep_missing: bool,
    ) -> Self {
        let (deleted, kept) = if keep_missing {
            (0, missing)
        } else {
            (missing, 0)
        };
        Self {
            inserted,
            updated: rows - inserted - unchanged,
            deleted,
            unchanged,
            kept,
            moved: 0,
            null_keys: 0,
        }
    }

    /// Rows inserted, updated or deleted.
    pub(crate) fn changed(&self) -> i64 {
        self.inserted
            .saturating_add(self.updated)
            .saturating_add(self.deleted)
    }

    /// The partition's rows before the merge.
    pub(crate) fn before(&self) -> i64 {
        (self.unchanged + self.updated - self.moved + self.deleted + self.kept).max(0)
    }

    /// The partition's rows after the merge.
    pub(crate) fn after(&self) -> i64 {
        self.inserted + self.updated + self.unchanged + self.kept
    }

    /// `+3 ~2 -1 =194`: inserted, updated, deleted and unchanged, as logs and tables show them.
    pub(crate) fn short(&self) -> String {
        format!(
            "+{} ~{} -{} ={}",
            self.inserted, self.updated, self.deleted, self.unchanged
        )
    }
}

/// What a rule on the output's values found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The rule's words: `not_null violated: region is NULL`.
    pub what: String,
    pub severity: Severity,
    pub violations: i64,
    /// How the violations are counted: rows of the output (`Some(rows)`), or rows a check
    /// returned, or what its command counted (`None`).
    pub of_rows: Option<i64>,
    /// Up to [`SAMPLES`] rows that violate it, as messages show them.
    pub samples: Vec<String>,
}

/// How many violating rows a rule's message shows.
pub(crate) const SAMPLES: usize = 5;

impl Found {
    /// The rule's message: what, how many, and a few of the rows.
    pub(crate) fn message(&self) -> String {
        let n = thousands(self.violations);
        let count = match self.of_rows {
            Some(rows) => format!(
                "in {n} of {} {}",
                thousands(rows),
                if rows == 1 { "row" } else { "rows" }
            ),
            None => format!(
                "{n} {}",
                if self.violations == 1 {
                    "violation"
                } else {
                    "violations"
                }
            ),
        };
        let e_g = if self.samples.is_empty() {
            String::new()
        } else {
            let more = if i64::try_from(self.samples.len()).unwrap_or(i64::MAX) < self.violations {
                " ..."
            } else {
                ""
            };
            format!(", e.g. {}{more}", self.samples.join(", "))
        };
        format!("{} {count}{e_g}", self.what)
    }
}

/// What a violated rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Rejects the try (the default).
    Error,
    /// Recorded with the try, which still publishes.
    Warn,
}

/// How a rejection for drift against the published partition begins.
pub(crate) const DRIFT: &str = "drift: ";

/// How each of the gate's warnings begins in a try's reasons (`; ` between them).
pub(crate) const WARNING: &str = "warning: ";

/// Whether a published try's `reasons` hold a warning of the gate.
pub(crate) fn has_warnings(reasons: &str) -> bool {
    reasons.split("; ").any(|r| r.starts_with(WARNING))
}

/// How a rejection by `history` begins.
pub(crate) const HISTORY: &str = "history: ";

/// How many partition values outside the interval a rejection shows.
pub(crate) const SHOWN: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    pub tolerance: f64,
    pub allow_empty: bool,
    /// `--allow-drift`: neither the published partition nor the history rejects a count.
    pub allow_drift: bool,
    pub history: Option<History>,
    /// `max_changed` of a merge: the largest fraction of the partition's published rows it
    /// may change.
    pub max_changed: Option<f64>,
}

/// Why a merge that does `merge` breaks `max_changed = max`, if it does: it changes more than
/// that share of the rows the partition held (a partition that held none is not judged).
pub(crate) fn too_many_changes(merge: &Merge, max: f64) -> Option<String> {
    // A partition that holds no rows yet has nothing a merge could wrongly change.
    let before = merge.before();
    if before == 0 {
        return None;
    }
    let share = merge.changed() as f64 / before as f64;
    (share > max).then(|| {
        format!(
            "{MAX_CHANGED}the merge would change {} of the partition's {} ({} inserted, {} updated, {} deleted), {} (at most {}); rerun with a higher max_changed if that is meant",
            thousands(merge.changed()),
            plural(before, "row", "rows"),
            thousands(merge.inserted),
            thousands(merge.updated),
            thousands(merge.deleted),
            percent(share),
            percent(max)
        )
    })
}

/// How a rejection by `max_changed` begins.
pub(crate) const MAX_CHANGED: &str = "max_changed: ";

/// `history = { partitions = N, tolerance = F }`: a try's rows against the median of the
/// task's last `partitions` published partitions before its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct History {
    pub partitions: u32,
    pub tolerance: f64,
}

/// The median of some counts (`None` for none).
pub(crate) fn median(rows: &[i64]) -> Option<f64> {
    let mut sorted = rows.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2] as f64),
        _ => Some((sorted[n / 2 - 1] as f64 + sorted[n / 2] as f64) / 2.0),
    }
}

/// `the last 7 published partitions`, or how few there were.
fn history_words(found: usize, asked: u32) -> String {
    if found >= asked as usize {
        format!(
            "the last {}",
            plural(
                i64::from(asked),
                "published partition",
                "published partitions"
            )
        )
    } else {
        format!(
            "only {} before this one ({asked} asked)",
            plural(found as i64, "published partition", "published partitions")
        )
    }
}

/// What is recorded with a try that publishes and said as it happens: each `warn` rule that
/// found violations.
pub(crate) fn warnings(m: &Measures) -> Vec<String> {
    messages(&m.found, Severity::Warn)
}

/// The messages of the rules of `severity` that found violations.
pub(crate) fn messages(found: &[Found], severity: Severity) -> Vec<String> {
    found
        .iter()
        .filter(|f| f.severity == severity && f.violations > 0)
        .map(Found::message)
        .collect()
}

/// What is recorded with a try that publishes without being said: the history, when there
/// was less of it than asked (the first partitions of a new table have none), or when its
/// median is 0 rows (nothing to measure a difference against).
pub(crate) fn notes(m: &Measures, r: &Rules) -> Vec<String> {
    match (r.history, &m.history) {
        (Some(h), Some(rows)) if !r.allow_drift => {
            if rows.is_empty() {
                vec![format!(
                    "history: no published partition before this one ({} asked); not judged",
                    h.partitions
                )]
            } else if median(rows).is_some_and(|mid| mid <= 0.0) {
                vec![format!(
                    "history: the median of {} is 0 rows; not judged",
                    history_words(rows.len(), h.partitions)
                )]
            } else if rows.len() < h.partitions as usize {
                vec![format!(
                    "history: judged against {}",
                    history_words(rows.len(), h.partitions)
                )]
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Publish,
    /// Delete the partition and record a published empty partition.
    PublishEmpty,
    Reject(String),
}

impl Verdict {
    /// The verdict as the manifest records it.
    pub(crate) fn recorded(&self) -> crate::state::Verdict {
        match self {
            Self::Publish => crate::state::Verdict::Published,
            Self::PublishEmpty => crate::state::Verdict::PublishedEmpty,
            Self::Reject(_) => crate::state::Verdict::Rejected,
        }
    }

    /// The verdict's words.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Publish => "published",
            Self::PublishEmpty => "published empty",
            Self::Reject(_) => "rejected",
        }
    }

    /// The reason recorded with the verdict.
    pub(crate) fn reason(&self) -> Option<&str> {
        match self {
            Self::Publish => None,
            Self::PublishEmpty => Some("empty source"),
            Self::Reject(r) => Some(r),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{}: {r}", self.as_str()),
            None => f.write_str(self.as_str()),
        }
    }
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// Relative difference of `a` against a positive `base`, without overflow.
fn relative(a: i64, base: i64) -> f64 {
    (i128::from(a) - i128::from(base)).abs() as f64 / base as f64
}

/// `: v1, v2, v3` (and `, ...` when there are others), or nothing without values.
fn shown(values: &[String]) -> String {
    if values.is_empty() {
        return String::new();
    }
    let more = if values.len() > SHOWN { ", ..." } else { "" };
    format!(": {}{more}", values[..values.len().min(SHOWN)].join(", "))
}

/// The counts a task or command reported, checked before any verdict: `Err` says why the try
/// failed.
pub(crate) fn check_counts(m: &Measures) -> Result<(), String> {
    if m.rows < 0 {
        return Err(format!(
            "the task reported {} rows; a row count cannot be negative",
            m.rows
        ));
    }
    if let Some(source) = m.source.filter(|s| *s < 0) {
        return Err(format!(
            "source_count gave {source}; a row count cannot be negative"
        ));
    }
    Ok(())
}

/// The verdict on a try's output; `Err` when its counts cannot be trusted (a failed try, see
/// [`check_counts`]).
pub fn judge(m: &Measures, r: &Rules) -> Result<Verdict, String> {
    check_counts(m)?;
    Ok(verdict(m, r))
}

/// The rejection of an output that a constraint of the target refused (`why`, the database's
/// words): judged with the other checks where the output is written into the target before the
/// gate (PostgreSQL), and when the publish meets it where it is not (SQLite).
pub(crate) fn refused_by_target(why: &str) -> Verdict {
    Verdict::Reject(format!("{REFUSED_BY_TARGET}: {why}"))
}

/// How a rejection by a constraint of the target begins.
pub(crate) const REFUSED_BY_TARGET: &str = "target constraint violated";

/// The rules a rejection's reasons name, one for each reason (`/metrics` counts rejections by
/// rule): `partition_column`, `unique_key`, `target_constraint`, `source_count`, `zero_rows`,
/// `drift`, `history`, a rule on values by its kind (`not_null`, `accepted_values`, `range`), a
/// check as `check:NAME`, else `other`.
pub(crate) fn rules_named(reasons: &str) -> Vec<String> {
    let named = |reason: &str| -> String {
        let reason = reason.trim();
        if reason.starts_with("row outside interval") {
            "partition_column".into()
        } else if reason.starts_with("unique_key violated") {
            "unique_key".into()
        } else if reason.starts_with(REFUSED_BY_TARGET) {
            "target_constraint".into()
        } else if reason.starts_with(DRIFT) {
            "drift".into()
        } else if reason.starts_with(HISTORY) {
            "history".into()
        } else if reason.starts_with(MAX_CHANGED) {
            "max_changed".into()
        } else if reason.starts_with("zero rows") {
            "zero_rows".into()
        } else if reason.starts_with("row count") || reason.contains("while the source is empty") {
            "source_count".into()
        } else if let Some(rest) = reason.strip_prefix("check \"") {
            // `check "NAME" failed: ...`, where NAME may hold a quote.
            let name = rest.find("\" failed").map_or_else(
                || rest.split('"').next().unwrap_or_default(),
                |end| &rest[..end],
            );
            format!("check:{name}")
        } else if let Some((kind, _)) = reason.split_once(" violated")
            && !kind.is_empty()
            && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            kind.to_string()
        } else {
            "other".into()
        }
    };
    // Reasons of rules on values are joined by "; "; the others are one reason each.
    let first = named(reasons);
    if first == "other"
        || ["not_null", "accepted_values", "range"].contains(&first.as_str())
        || first.starts_with("check:")
    {
        reasons.split("; ").map(named).collect()
    } else {
        vec![first]
    }
}

fn verdict(m: &Measures, r: &Rules) -> Verdict {
    if let Some(why) = &m.mixed {
        return Verdict::Reject(format!("row outside interval: {why}"));
    }
    if let Some(n) = m.outside.filter(|n| *n > 0) {
        return Verdict::Reject(format!(
            "row outside interval: {n} of {} {} a partition value outside the interval{}",
            plural(m.rows, "row", "rows"),
            if n == 1 { "has" } else { "have" },
            shown(&m.outside_values)
        ));
    }
    if let Some(n) = m.duplicate_keys.filter(|n| *n > 0) {
        return Verdict::Reject(format!(
            "unique_key violated: {} more than once",
            if n == 1 {
                "1 key value occurs".to_string()
            } else {
                format!("{n} key values occur")
            }
        ));
    }
    if let Some(n) = m.merge.map(|g| g.null_keys).filter(|n| *n > 0) {
        return Verdict::Reject(format!(
            "unique_key violated: {} a NULL in the key; a merge matches rows by their key and cannot match {}",
            if n == 1 {
                "1 row has".to_string()
            } else {
                format!("{} rows have", thousands(n))
            },
            if n == 1 { "it" } else { "them" }
        ));
    }
    if let Some(found) = &m.elsewhere {
        return Verdict::Reject(if m.merge.is_some() {
            format!(
                "unique_key violated across partitions: key {found}, and this output puts it in this interval's partition; a merge would update the row of the other partition. If the record moved, set unique_key_scope = \"table\" to move it; otherwise the key is not unique at the target's grain"
            )
        } else {
            format!(
                "unique_key violated across partitions: key {found}; the source moved that record out of its old partition, so rerun the old partition first, then this one"
            )
        });
    }
    // The gate's own rules are named before the target's constraints, on every engine: a
    // `not_null` that the target's NOT NULL would also refuse is said as the rule's violation.
    let broken = messages(&m.found, Severity::Error);
    if !broken.is_empty() {
        return Verdict::Reject(broken.join("; "));
    }
    if let Some(why) = &m.constraint {
        return refused_by_target(why);
    }
    if let (Some(max), Some(merge)) = (r.max_changed, m.merge)
        && let Some(why) = too_many_changes(&merge, max)
    {
        return Verdict::Reject(why);
    }
    match m.source {
        Some(source) if source > 0 && m.rows == 0 => {
            return Verdict::Reject(format!(
                "zero rows while source has data ({})",
                plural(source, "source row", "source rows")
            ));
        }
        Some(0) | None if m.rows == 0 => {
            return if r.allow_empty {
                Verdict::PublishEmpty
            } else {
                Verdict::Reject(
                    "zero rows and an empty source; set allow_empty = true in [tasks.gate] to publish an empty partition"
                        .to_string(),
                )
            };
        }
        Some(0) => {
            return Verdict::Reject(format!(
                "{} while the source is empty",
                plural(m.rows, "row", "rows")
            ));
        }
        Some(source) => {
            let diff = relative(m.rows, source);
            if diff > r.tolerance {
                return Verdict::Reject(format!(
                    "row count {} differs from the source count {source} by {} (tolerance {})",
                    m.rows,
                    percent(diff),
                    percent(r.tolerance)
                ));
            }
        }
        None => {}
    }
    if !r.allow_drift
        && let Some(published) = m.published.filter(|p| *p > 0)
    {
        let diff = relative(m.rows, published);
        if diff > r.tolerance {
            return Verdict::Reject(format!(
                "{DRIFT}row count {} differs from the published {published} by {} (tolerance {}); rerun with --allow-drift to accept",
                m.rows,
                percent(diff),
                percent(r.tolerance)
            ));
        }
    }
    if !r.allow_drift
        && let (Some(h), Some(rows)) = (r.history, &m.history)
        && let Some(mid) = median(rows).filter(|mid| *mid > 0.0)
    {
        let diff = (m.rows as f64 - mid).abs() / mid;
        if diff > h.tolerance {
            return Verdict::Reject(format!(
                "{HISTORY}row count {} differs from {}, the median of {}, by {} (tolerance {}); rerun with --allow-drift to accept",
                thousands(m.rows),
                thousands(mid.round() as i64),
                history_words(rows.len(), h.partitions),
                percent(diff),
                percent(h.tolerance)
            ));
        }
    }
    Verdict::Publish
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_name_their_rules() {
        assert_eq!(
            rules_named("unique_key violated: 1 key value occurs more than once"),
            ["unique_key"]
        );
        assert_eq!(
            rules_named(
                "not_null violated: region is NULL in 2 of 10 rows, e.g. 3; range violated: amount is above 5 in 1 of 10 rows"
            ),
            ["not_null", "range"]
        );
        assert_eq!(
            rules_named("check \"no_refunds\" failed: 3 violations"),
            ["check:no_refunds"]
        );
        assert_eq!(
            rules_named(&format!("{DRIFT}row count 5 differs")),
            ["drift"]
        );
        assert_eq!(
            rules_named("row count 9 differs from the source count 10 by 10.0% (tolerance 0.0%)"),
            ["source_count"]
        );
        assert_eq!(
            rules_named("zero rows while source has data (3 source rows)"),
            ["zero_rows"]
        );
        assert_eq!(rules_named("something new"), ["other"]);
        // A check's name is free text: a quote in it stays in the name.
        assert_eq!(
            rules_named("check \"say \"no\"\" failed: 1 violation"),
            ["check:say \"no\""]
        );
    }

    const RULES: Rules = Rules {
        tolerance: 0.02,
        allow_empty: false,
        allow_drift: false,
        history: None,
        max_changed: None,
    };

    fn m(rows: i64) -> Measures {
        Measures {
            rows,
            outside: Some(0),
            outside_values: Vec::new(),
            duplicate_keys: Some(0),
            source: Some(rows),
            published: None,
            mixed: None,
            elsewhere: None,
            constraint: None,
            found: Vec::new(),
            history: None,
            merge: None,
        }
    }

    fn judged(m: &Measures, r: &Rules) -> Verdict {
        judge(m, r).unwrap()
    }

    fn reason(v: Verdict) -> String {
        match v {
            Verdict::Reject(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn a_clean_output_is_published() {
        assert_eq!(judged(&m(100), &RULES), Verdict::Publish);
        assert_eq!(
            judged(
                &Measures {
                    published: Some(101),
                    ..m(100)
                },
                &RULES
            ),
            Verdict::Publish
        );
    }

    #[test]
    fn checks_run_in_order_and_the_first_failure_rejects() {
        // Everything wrong at once: the boundary check wins.
        let all_wrong = Measures {
            rows: 0,
            outside: Some(3),
            outside_values: Vec::new(),
            duplicate_keys: Some(2),
            source: Some(50),
            published: Some(100),
            mixed: None,
            elsewhere: None,
            constraint: Some("duplicate key value violates unique constraint \"t_pkey\"".into()),
            found: Vec::new(),
            history: None,
            merge: None,
        };
        assert!(reason(judged(&all_wrong, &RULES)).starts_with("row outside interval: 3"));
        let dupes = Measures {
            outside: Some(0),
            ..all_wrong
        };
        assert!(reason(judged(&dupes, &RULES)).starts_with("unique_key violated: 2"));
        // The target's own constraint is judged after the gate's unique_key, which names the
        // duplicates in the gate's terms, and before the counts.
        let refused = Measures {
            duplicate_keys: Some(0),
            ..dupes
        };
        assert_eq!(
            reason(judged(&refused, &RULES)),
            "target constraint violated: duplicate key value violates unique constraint \"t_pkey\""
        );
        // A rule the gate was given is named before the target's constraint that refuses the
        // same rows (PostgreSQL writes into the target before the gate, SQLite does not).
        let null_region = Found {
            what: "not_null violated: region is NULL".into(),
            severity: Severity::Error,
            violations: 1,
            of_rows: Some(5),
            samples: vec!["(day 2026-09-01)".into()],
        };
        let named = Measures {
            found: vec![null_region],
            constraint: Some("null value in column \"region\" violates not-null constraint".into()),
            ..refused.clone()
        };
        assert_eq!(
            reason(judged(&named, &RULES)),
            "not_null violated: region is NULL in 1 of 5 rows, e.g. (day 2026-09-01)"
        );
        let zero = Measures {
            constraint: None,
            ..refused
        };
        assert_eq!(
            reason(judged(&zero, &RULES)),
            "zero rows while source has data (50 source rows)"
        );
    }

    #[test]
    fn a_rejection_shows_a_few_values_outside_the_interval() {
        let outside = |n: i64, values: &[&str]| {
            reason(judged(
                &Measures {
                    outside: Some(n),
                    outside_values: values.iter().map(ToString::to_string).collect(),
                    ..m(6)
                },
                &RULES,
            ))
        };
        assert_eq!(
            outside(1, &["NULL"]),
            "row outside interval: 1 of 6 rows has a partition value outside the interval: NULL"
        );
        assert_eq!(
            outside(4, &["NULL", "'2026-09-02'", "'x'"]),
            "row outside interval: 4 of 6 rows have a partition value outside the interval: NULL, '2026-09-02', 'x'"
        );
        // A fourth value says that there are more than those shown.
        assert_eq!(
            outside(5, &["NULL", "'2026-09-02'", "'x'", "'y'"]),
            "row outside interval: 5 of 6 rows have a partition value outside the interval: NULL, '2026-09-02', 'x', ..."
        );
        assert_eq!(
            outside(2, &[]),
            "row outside interval: 2 of 6 rows have a partition value outside the interval"
        );
    }

    #[test]
    fn empty_source_and_output_needs_allow_empty() {
        let empty = Measures {
            source: Some(0),
            ..m(0)
        };
        assert!(reason(judged(&empty, &RULES)).contains("set allow_empty = true"));
        let rules = Rules {
            allow_empty: true,
            ..RULES
        };
        assert_eq!(judged(&empty, &rules), Verdict::PublishEmpty);
        assert_eq!(Verdict::PublishEmpty.reason(), Some("empty source"));
        // Without a source count, zero rows is treated the same way.
        let unknown = Measures {
            source: None,
            ..m(0)
        };
        assert_eq!(judged(&unknown, &rules), Verdict::PublishEmpty);
        assert!(matches!(judged(&unknown, &RULES), Verdict::Reject(_)));
    }

    #[test]
    fn rows_from_an_empty_source_are_rejected() {
        let v = judged(
            &Measures {
                source: Some(0),
                ..m(5)
            },
            &RULES,
        );
        assert_eq!(reason(v), "5 rows while the source is empty");
    }

    #[test]
    fn source_tolerance() {
        let within = Measures {
            source: Some(100),
            ..m(98)
        };
        assert_eq!(judged(&within, &RULES), Verdict::Publish);
        let beyond = Measures {
            source: Some(100),
            ..m(97)
        };
        assert_eq!(
            reason(judged(&beyond, &RULES)),
            "row count 97 differs from the source count 100 by 3.0% (tolerance 2.0%)"
        );
    }

    #[test]
    fn drift_against_the_published_try_unless_allowed() {
        let drifted = Measures {
            published: Some(100),
            ..m(95)
        };
        assert!(reason(judged(&drifted, &RULES)).starts_with(
            "drift: row count 95 differs from the published 100 by 5.0% (tolerance 2.0%)"
        ));
        let rules = Rules {
            allow_drift: true,
            ..RULES
        };
        assert_eq!(judged(&drifted, &rules), Verdict::Publish);
        // An empty published partition does not make late data drift.
        let after_empty = Measures {
            published: Some(0),
            ..m(95)
        };
        assert_eq!(judged(&after_empty, &RULES), Verdict::Publish);
    }

    #[test]
    fn checks_without_measures_are_skipped() {
        let command_task = Measures {
            rows: 10,
            outside: None,
            outside_values: Vec::new(),
            duplicate_keys: None,
            source: None,
            published: None,
            mixed: None,
            elsewhere: None,
            constraint: None,
            found: Vec::new(),
            history: None,
            merge: None,
        };
        assert_eq!(judged(&command_task, &RULES), Verdict::Publish);
    }

    fn merged(inserted: i64, updated: i64, deleted: i64, unchanged: i64) -> Merge {
        Merge {
            inserted,
            updated,
            deleted,
            unchanged,
            ..Merge::default()
        }
    }

    #[test]
    fn max_changed_bounds_what_a_merge_changes_of_the_published_partition() {
        let rules = Rules {
            max_changed: Some(0.2),
            ..RULES
        };
        // 100 rows before: 10 updated, 5 deleted, 5 inserted is 20%, allowed.
        let within = Measures {
            merge: Some(merged(5, 10, 5, 85)),
            ..m(100)
        };
        assert_eq!(judged(&within, &rules), Verdict::Publish);
        let beyond = Measures {
            merge: Some(merged(5, 11, 5, 84)),
            ..m(100)
        };
        assert_eq!(
            reason(judged(&beyond, &rules)),
            "max_changed: the merge would change 21 of the partition's 100 rows (5 inserted, 11 updated, 5 deleted), 21.0% (at most 20.0%); rerun with a higher max_changed if that is meant"
        );
        assert_eq!(
            rules_named(&reason(judged(&beyond, &rules))),
            ["max_changed"]
        );
        // A partition that held nothing is not judged; without max_changed nothing is.
        let first = Measures {
            merge: Some(merged(100, 0, 0, 0)),
            ..m(100)
        };
        assert_eq!(judged(&first, &rules), Verdict::Publish);
        assert_eq!(judged(&beyond, &RULES), Verdict::Publish);
        // Rows moved in from another partition were not the partition's before.
        let moved = Measures {
            merge: Some(Merge {
                moved: 10,
                ..merged(0, 10, 0, 10)
            }),
            ..m(20)
        };
        assert!(reason(judged(&moved, &rules)).contains("10 of the partition's 10 rows"));
    }

    #[test]
    fn a_merge_rejects_null_keys_and_keys_of_other_partitions_in_its_own_words() {
        let nulls = Measures {
            merge: Some(Merge {
                null_keys: 2,
                ..merged(2, 0, 0, 8)
            }),
            ..m(10)
        };
        assert_eq!(
            reason(judged(&nulls, &RULES)),
            "unique_key violated: 2 rows have a NULL in the key; a merge matches rows by their key and cannot match them"
        );
        let elsewhere = Measures {
            elsewhere: Some("(7) in partition '2026-09-01'".into()),
            merge: Some(merged(0, 1, 0, 9)),
            ..m(10)
        };
        let why = reason(judged(&elsewhere, &RULES));
        assert!(
            why.starts_with("unique_key violated across partitions: key (7) in partition '2026-09-01', and this output puts it in this interval's partition; a merge would update the row of the other partition"),
            "{why}"
        );
        assert_eq!(rules_named(&why), ["unique_key"]);
    }

    #[test]
    fn a_merge_counts_the_partition_after_it() {
        let m = merged(1, 2, 3, 4);
        assert_eq!((m.changed(), m.before(), m.after()), (6, 9, 7));
        let kept = Merge { kept: 5, ..m };
        assert_eq!((kept.before(), kept.after()), (14, 12));
        assert_eq!(m.short(), "+1 ~2 -3 =4");
    }

    fn found(severity: Severity, violations: i64, samples: &[&str]) -> Found {
        Found {
            what: "not_null violated: region is NULL".into(),
            severity,
            violations,
            of_rows: Some(2004),
            samples: samples.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_broken_rule_rejects_after_the_structural_checks_and_names_every_broken_rule() {
        let broken = Measures {
            found: vec![
                found(Severity::Error, 12, &["(order_id 7)", "(order_id 9)"]),
                Found {
                    what: "check \"no refunds\" failed:".into(),
                    of_rows: None,
                    ..found(Severity::Error, 1, &["(order_id 3, amount -5)"])
                },
                found(Severity::Warn, 3, &[]),
                found(Severity::Error, 0, &[]),
            ],
            ..m(2004)
        };
        assert_eq!(
            reason(judged(&broken, &RULES)),
            "not_null violated: region is NULL in 12 of 2,004 rows, e.g. (order_id 7), (order_id 9) ...; check \"no refunds\" failed: 1 violation, e.g. (order_id 3, amount -5)"
        );
        // Rows outside the interval come first: the rules read the interval's rows.
        let outside = Measures {
            outside: Some(1),
            ..broken.clone()
        };
        assert!(reason(judged(&outside, &RULES)).starts_with("row outside interval"));
        // A warning publishes, and is what is recorded.
        let warned = Measures {
            found: vec![found(Severity::Warn, 1, &["(order_id 7)"])],
            ..m(2004)
        };
        assert_eq!(judged(&warned, &RULES), Verdict::Publish);
        assert_eq!(
            warnings(&warned),
            ["not_null violated: region is NULL in 1 of 2,004 rows, e.g. (order_id 7)"]
        );
        assert!(warnings(&broken).len() == 1 && warnings(&m(1)).is_empty());
    }

    #[test]
    fn history_compares_with_the_median_and_says_when_there_is_too_little() {
        let rules = Rules {
            tolerance: 1.0,
            history: Some(History {
                partitions: 4,
                tolerance: 0.5,
            }),
            ..RULES
        };
        let with = |rows: i64, history: &[i64]| Measures {
            source: None,
            history: Some(history.to_vec()),
            ..m(rows)
        };
        // The median of 100, 1000, 1100, 1200 is 1050: a third of it is rejected.
        assert_eq!(
            reason(judged(&with(350, &[1200, 100, 1000, 1100]), &rules)),
            "history: row count 350 differs from 1,050, the median of the last 4 published partitions, by 66.7% (tolerance 50.0%); rerun with --allow-drift to accept"
        );
        assert_eq!(
            judged(&with(600, &[1200, 100, 1000, 1100]), &rules),
            Verdict::Publish
        );
        assert!(notes(&with(600, &[1200, 100, 1000, 1100]), &rules).is_empty());
        // Fewer than asked: judged against those, and noted.
        assert_eq!(
            reason(judged(&with(10, &[100, 300, 200]), &rules)),
            "history: row count 10 differs from 200, the median of only 3 published partitions before this one (4 asked), by 95.0% (tolerance 50.0%); rerun with --allow-drift to accept"
        );
        assert_eq!(
            notes(&with(200, &[100, 300, 200]), &rules),
            ["history: judged against only 3 published partitions before this one (4 asked)"]
        );
        assert_eq!(
            notes(&with(200, &[]), &rules),
            ["history: no published partition before this one (4 asked); not judged"]
        );
        assert_eq!(judged(&with(10, &[]), &rules), Verdict::Publish);
        // A median of zero (empty partitions) judges nothing, and says so; --allow-drift
        // waives it.
        assert_eq!(judged(&with(10, &[0, 0, 5]), &rules), Verdict::Publish);
        assert_eq!(
            notes(&with(10, &[0, 0, 5]), &rules),
            [
                "history: the median of only 3 published partitions before this one (4 asked) is 0 rows; not judged"
            ]
        );
        assert_eq!(
            notes(&with(10, &[0, 0, 0, 7]), &rules),
            ["history: the median of the last 4 published partitions is 0 rows; not judged"]
        );
        let allowed = Rules {
            allow_drift: true,
            ..rules
        };
        assert_eq!(judged(&with(1, &[1000; 4]), &allowed), Verdict::Publish);
        assert!(notes(&with(1, &[]), &allowed).is_empty());
    }

    #[test]
    fn untrusted_counts_fail_the_try_instead_of_deciding() {
        let negative_source = Measures {
            source: Some(-1),
            ..m(1_000_000)
        };
        assert_eq!(
            judge(
                &negative_source,
                &Rules {
                    tolerance: 0.0,
                    ..RULES
                }
            ),
            Err("source_count gave -1; a row count cannot be negative".to_string())
        );
        let negative_rows = Measures {
            rows: -5,
            source: None,
            ..m(0)
        };
        assert_eq!(
            judge(&negative_rows, &RULES),
            Err("the task reported -5 rows; a row count cannot be negative".to_string())
        );
        // Extreme values compare without overflow.
        let extreme = Measures {
            rows: i64::MAX,
            source: Some(1),
            published: None,
            ..m(0)
        };
        assert!(
            reason(judged(&extreme, &RULES)).starts_with("row count 9223372036854775807 differs")
        );
        let drift = Measures {
            rows: 0,
            source: None,
            published: Some(i64::MAX),
            ..m(0)
        };
        assert!(matches!(
            judged(
                &drift,
                &Rules {
                    allow_empty: true,
                    ..RULES
                }
            ),
            Verdict::PublishEmpty
        ));
        let mixed = Measures {
            mixed: Some("mixes YYYY-MM-DD dates and unix seconds".into()),
            ..m(10)
        };
        assert_eq!(
            reason(judged(&mixed, &RULES)),
            "row outside interval: mixes YYYY-MM-DD dates and unix seconds"
        );
    }
}
