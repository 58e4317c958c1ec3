//! The end of a `create` or `resume`: a table of interval counts and one line that says how to
//! go on, for people (stderr); one JSON document with `--output json` (stdout). A failed
//! backfill always lists its failures and the command that reruns them, with `-q` and
//! `--output json` too.

use std::time::Duration;

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use super::Labeler;
use super::out::{Sink, hint, plural, shell_word};
use crate::exit::{self, Error};
use crate::manifest::queries::{Counts, FailedInterval, Outcome};

/// The document `create` and `resume` print with `--output json`.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    pub backfill_id: i64,
    pub dag_id: &'a str,
    pub state: &'a str,
    pub exit_code: u8,
    pub intervals: &'a Counts,
    pub skipped: &'a std::collections::BTreeMap<String, i64>,
    pub failed: &'a [FailedInterval],
    pub elapsed_seconds: f64,
    /// The command that reruns the failed and rejected intervals, when there are any.
    pub rerun: Option<String>,
}

/// What a rerun hint needs to know about the command that ran.
pub struct Rerun<'a> {
    pub conf: &'a serde_json::Value,
    pub allow_drift: bool,
    /// `--tasks` of the backfill.
    pub tasks: Option<&'a [String]>,
}

/// The complete command that reruns exactly the failed and rejected intervals of a backfill.
pub fn rerun_command(outcome: &Outcome, labels: &Labeler, how: &Rerun<'_>) -> Option<String> {
    let first = outcome.failed.iter().map(|f| f.start.0).min()?;
    let last = outcome.failed.iter().map(|f| f.start.0).max()?;
    let mut words: Vec<String> = Vec::new();
    words.extend(
        [
            "create",
            "--dag",
            &shell_word(&outcome.backfill.dag_id),
            "--from",
            &shell_word(&labels.when(first)),
            "--to",
            &shell_word(&labels.when(last)),
            "--reprocess-behavior",
            "failed",
        ]
        .map(String::from),
    );
    if how.conf.as_object().is_some_and(|o| !o.is_empty()) {
        words.push("--conf".into());
        words.push(shell_word(&how.conf.to_string()));
    }
    if how.allow_drift {
        words.push("--allow-drift".into());
    }
    if let Some(tasks) = how.tasks {
        words.push("--tasks".into());
        words.push(shell_word(&tasks.join(",")));
    }
    Some(hint(&words.join(" ")))
}

/// Builds the summary of a finished (or stopped) backfill from its outcome in the manifest.
pub fn summary<'a>(
    outcome: &'a Outcome,
    exit_code: u8,
    elapsed: Duration,
    rerun: Option<String>,
) -> Summary<'a> {
    Summary {
        backfill_id: outcome.backfill.id,
        dag_id: &outcome.backfill.dag_id,
        state: &outcome.backfill.state,
        exit_code,
        intervals: &outcome.backfill.intervals,
        skipped: &outcome.skipped,
        failed: &outcome.failed,
        elapsed_seconds: elapsed.as_secs_f64(),
        rerun,
    }
}

/// Writes the summary: JSON as data with `--output json`, else a table and a line as notes
/// (nothing on success with `-q`). Failures are always listed as notes, with the command that
/// reruns them.
pub fn write(
    out: &mut Sink<'_>,
    s: &Summary<'_>,
    labels: &Labeler,
    quiet: bool,
) -> Result<(), Error> {
    let json = out.json;
    if json {
        out.json(s)?;
    }
    let c = s.intervals;
    if !json && !quiet {
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED);
        if let Some(width) = out.fit.width {
            table.set_content_arrangement(ContentArrangement::Dynamic);
            table.set_width(width);
        }
        table.set_header(vec!["intervals", "count"]);
        for (name, n) in [
            ("succeeded", c.succeeded),
            ("failed", c.failed),
            ("rejected", c.rejected),
            ("cancelled", c.cancelled),
            ("not started", c.pending),
        ] {
            if n > 0 {
                table.add_row(vec![name.to_string(), n.to_string()]);
            }
        }
        for (reason, n) in s.skipped {
            table.add_row(vec![format!("skipped: {reason}"), n.to_string()]);
        }
        out.note(&table.to_string());
    }
    for f in s.failed {
        out.note(&format!(
            "{} {}: {}{}",
            f.state,
            labels.label(f.start.0),
            f.error.as_deref().unwrap_or("-"),
            f.log.as_ref().map_or_else(
                || "\n  log: none (the try printed nothing)".to_string(),
                |l| format!("\n  log: {l}")
            )
        ));
    }
    let next = match (s.exit_code, &s.rerun) {
        (exit::INTERRUPTED, _) => format!(
            "; continue with `{}`",
            hint(&format!("resume {}", s.backfill_id))
        ),
        (exit::FAILED, _) if c.pending > 0 => format!(
            "; {} not started: continue with `{}`{}",
            plural(c.pending, "interval", "intervals"),
            hint(&format!("resume {}", s.backfill_id)),
            s.rerun
                .as_ref()
                .map(|r| format!(", or rerun the failures with `{r}`"))
                .unwrap_or_default()
        ),
        (exit::FAILED, Some(rerun)) => format!("; rerun the failures with `{rerun}`"),
        _ => String::new(),
    };
    if !json && (!quiet || s.exit_code != exit::OK) {
        out.note(&format!(
            "backfill {} of {}: {} — {} succeeded, {} failed, {} rejected, {} cancelled, {} skipped in {:.1}s{next}",
            s.backfill_id,
            s.dag_id,
            s.state,
            c.succeeded,
            c.failed,
            c.rejected,
            c.cancelled,
            c.skipped,
            s.elapsed_seconds
        ));
    } else if json && !next.is_empty() {
        out.note(&format!("backfill {}: {}{next}", s.backfill_id, s.state));
    }
    Ok(())
}
