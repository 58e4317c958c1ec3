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
use crate::manifest::queries::{Counts, FailedInterval, Outcome, WarnedInterval};

/// The document `create` and `resume` print with `--output json`.
#[derive(Debug, Serialize)]
pub(crate) struct Summary<'a> {
    pub backfill_id: i64,
    pub dag_id: &'a str,
    pub state: &'a str,
    pub exit_code: u8,
    pub intervals: &'a Counts,
    pub skipped: &'a std::collections::BTreeMap<String, i64>,
    pub failed: &'a [FailedInterval],
    /// Intervals published with the gate's warnings (a `warn` rule, too little history).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub warned: &'a [WarnedInterval],
    /// How many intervals were published with warnings (`warned` lists the first of them).
    #[serde(skip)]
    pub warned_count: i64,
    pub elapsed_seconds: f64,
    /// The command that reruns the failed and rejected intervals, when there are any.
    pub rerun: Option<String>,
    /// Another process took the backfill over while this one ran it: that one goes on with it
    /// (or has finished it), so there is nothing here to resume.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub taken_over: bool,
    /// The environment fault that stopped the backfill (a full disk, no descriptors or
    /// memory, see [`crate::environment`]): its cause and fix. The backfill is resumable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<&'a crate::environment::Fault>,
}

/// What a rerun hint needs to know about the command that ran.
pub(crate) struct Rerun<'a> {
    pub conf: &'a serde_json::Value,
    pub allow_drift: bool,
    /// `--tasks` of the backfill.
    pub tasks: Option<&'a [String]>,
}

/// The complete command that reruns exactly the failed and rejected intervals of a backfill.
pub(crate) fn rerun_command(
    outcome: &Outcome,
    labels: &Labeler,
    how: &Rerun<'_>,
) -> Option<String> {
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
pub(crate) fn summary<'a>(
    outcome: &'a Outcome,
    exit_code: u8,
    elapsed: Duration,
    rerun: Option<String>,
) -> Summary<'a> {
    Summary {
        backfill_id: outcome.backfill.id,
        dag_id: &outcome.backfill.dag_id,
        state: outcome.backfill.state.as_str(),
        exit_code,
        intervals: &outcome.backfill.intervals,
        skipped: &outcome.skipped,
        failed: &outcome.failed,
        warned: &outcome.warned,
        warned_count: outcome.warned_count,
        elapsed_seconds: elapsed.as_secs_f64(),
        rerun,
        taken_over: false,
        stopped_by: None,
    }
}

/// The labels of the intervals published with warnings, each once, in order.
fn warned_days(warned: &[WarnedInterval], labels: &Labeler) -> Vec<String> {
    let mut days: Vec<String> = warned.iter().map(|w| labels.label(w.start.0)).collect();
    days.dedup();
    days
}

/// Writes the summary: JSON as data with `--output json`, else a table and a line as notes
/// (nothing on success with `-q`). Failures are always listed as notes, with the command that
/// reruns them.
pub(crate) fn write(
    out: &mut Sink<'_>,
    s: &Summary<'_>,
    labels: &Labeler,
    quiet: bool,
    written: &std::collections::HashSet<i64>,
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
        let warned = warned_days(s.warned, labels);
        for (name, n) in [
            ("succeeded", c.succeeded),
            ("  with warnings", s.warned_count),
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
        if !warned.is_empty() {
            out.note(&format!(
                "published with warnings: {}{} (`{}` shows them)",
                warned.join(", "),
                if s.warned_count > i64::try_from(warned.len()).unwrap_or(i64::MAX) {
                    ", ..."
                } else {
                    ""
                },
                hint(&format!("show {}", s.backfill_id))
            ));
        }
    }
    // A failure written as it happened, with its reason (and its log's end), is only named
    // here, with its log; one of an earlier process, or of a quiet run, in full.
    for f in s.failed {
        if !json && !quiet && written.contains(&f.start.0.timestamp()) {
            out.note(&format!(
                "{} {}: as written above; log: {}",
                f.state,
                labels.label(f.start.0),
                f.log.as_deref().unwrap_or("none (the try printed nothing)")
            ));
            continue;
        }
        let mut text = format!(
            "{} {}: {}{}",
            f.state,
            labels.label(f.start.0),
            f.error.as_deref().unwrap_or("-"),
            f.log.as_ref().map_or_else(
                || "\n  log: none (the try printed nothing)".to_string(),
                |l| format!("\n  log: {l}")
            )
        );
        // The end of the log, as the progress lines show it: a mail from a quiet cron job then
        // says why without a second look.
        for line in f.log_tail.iter().flat_map(|t| t.lines()) {
            text.push_str("\n  | ");
            text.push_str(line);
        }
        out.note(&text);
    }
    let next = match (s.exit_code, &s.rerun) {
        (_, _) if let Some(fault) = s.stopped_by => format!(
            "; stopped: {}; {}, then `{}`",
            fault.cause,
            fault.fix,
            hint(&format!("resume {}", s.backfill_id))
        ),
        (exit::INTERRUPTED, _) if s.taken_over => format!(
            "; another process took its intervals over and goes on with them (`{}` shows it)",
            hint("list")
        ),
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
        (exit::NOT_READY, _) => {
            let n = s
                .skipped
                .get(crate::plan::SkipReason::NotReady.as_str())
                .copied()
                .unwrap_or(0);
            format!(
                "; {} not ready (`{}` says what each check answered): the next backfill over the range runs {}",
                plural(n, "interval", "intervals"),
                hint(&format!("show {}", s.backfill_id)),
                if n == 1 {
                    "it once its sources are there"
                } else {
                    "them once their sources are there"
                }
            )
        }
        _ => String::new(),
    };
    // A rerun of an interval rejected for drift is rejected again unless the change is wanted.
    let drifted = s
        .failed
        .iter()
        .filter(|f| {
            f.error.as_deref().is_some_and(|e| {
                [crate::gate::DRIFT, crate::gate::HISTORY]
                    .iter()
                    .any(|why| e.contains(&format!(" rejected: {why}")))
            })
        })
        .count();
    let next = match &s.rerun {
        Some(rerun) if drifted > 0 && !rerun.contains("--allow-drift") => format!(
            "{next}; {} rejected for drift (against what is published, or the task's history): if that change is expected, add --allow-drift",
            if drifted == 1 {
                "1 interval was".to_string()
            } else {
                format!("{drifted} intervals were")
            }
        ),
        _ => next,
    };
    // The last line names the DAG and the counts whenever something needs attention, with JSON
    // on stdout too: it is what a cron job mails.
    if (!json && !quiet) || s.exit_code != exit::OK {
        out.note(&format!(
            "backfill {} of {}: {} — {} succeeded{}, {} failed, {} rejected, {} cancelled, {} skipped in {:.1}s{next}",
            s.backfill_id,
            s.dag_id,
            if s.taken_over { "taken over" } else { s.state },
            c.succeeded,
            super::show::with_warnings(usize::try_from(s.warned_count).unwrap_or(0)),
            c.failed,
            c.rejected,
            c.cancelled,
            c.skipped,
            s.elapsed_seconds
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{self, FAILED, REJECTED, Shared};
    use crate::report::out::Fit;

    /// The outcome of a run of January 1 to 5 in the manifest: the 2nd rejected, the 3rd failed,
    /// the 4th cancelled, the 5th skipped while running.
    fn outcome() -> Outcome {
        let mut backfill = fixtures::backfill();
        backfill.intervals.total = 5;
        backfill.intervals.planned = 4;
        backfill.intervals.skipped = 1;
        backfill.intervals.succeeded = 1;
        backfill.intervals.cancelled = 1;
        Outcome {
            backfill,
            skipped: [("previous interval not successful".to_string(), 1)]
                .into_iter()
                .collect(),
            failed: vec![
                FailedInterval {
                    start: fixtures::at(2),
                    state: crate::state::RunState::Rejected,
                    task: Some("export".into()),
                    error: Some(REJECTED.into()),
                    log: None,
                    log_tail: None,
                },
                FailedInterval {
                    start: fixtures::at(3),
                    state: crate::state::RunState::Failed,
                    task: Some("export".into()),
                    error: Some(FAILED.into()),
                    log: Some("[logs]/try2.log".into()),
                    log_tail: Some("connecting\nERROR: relation \"sales\" does not exist".into()),
                },
            ],
            warned: Vec::new(),
            warned_count: 0,
        }
    }

    fn summary_text(code: u8, json: bool, quiet: bool) -> (String, String) {
        summary_of(&outcome(), code, json, quiet)
    }

    fn summary_of(outcome: &Outcome, code: u8, json: bool, quiet: bool) -> (String, String) {
        summary_written(
            outcome,
            code,
            json,
            quiet,
            &std::collections::HashSet::new(),
        )
    }

    fn summary_written(
        outcome: &Outcome,
        code: u8,
        json: bool,
        quiet: bool,
        written: &std::collections::HashSet<i64>,
    ) -> (String, String) {
        let labels = fixtures::labels();
        let rerun = rerun_command(
            outcome,
            &labels,
            &Rerun {
                conf: &serde_json::json!({"region": "eu"}),
                allow_drift: false,
                tasks: None,
            },
        );
        let s = summary(outcome, code, Duration::from_millis(65_400), rerun);
        let (data, notes) = (Shared::default(), Shared::default());
        let mut out = Sink::new(data.clone(), notes.clone(), json, Fit::default());
        write(&mut out, &s, &labels, quiet, written).unwrap();
        (data.text(), notes.text())
    }

    #[test]
    fn a_failure_written_as_it_happened_is_only_named_in_the_summary() {
        let written = [fixtures::at(2).0.timestamp()].into_iter().collect();
        let (_, notes) = summary_written(&outcome(), exit::FAILED, false, false, &written);
        // The rejection was written above with its reason: named, with its log.
        assert!(
            notes.contains(
                "rejected 2026-01-02: as written above; log: none (the try printed nothing)\n"
            ),
            "{notes}"
        );
        assert_eq!(notes.matches(REJECTED).count(), 0, "{notes}");
        // The failure was not (an earlier process's, say): in full.
        assert!(
            notes.contains("failed 2026-01-03: task `export` failed: exit code 2\n  log: [logs]/try2.log\n  | connecting\n"),
            "{notes}"
        );
        // Quiet, nothing was written above: in full.
        let (_, quiet) = summary_written(&outcome(), exit::FAILED, false, true, &written);
        assert_eq!(quiet.matches(REJECTED).count(), 1, "{quiet}");
    }

    #[test]
    fn the_summary_counts_lists_the_failures_and_says_how_to_go_on() {
        let (data, notes) = summary_text(exit::INTERRUPTED, false, false);
        assert_eq!(data, "");
        insta::assert_snapshot!("summary", notes);
        let (_, failed) = summary_text(exit::FAILED, false, false);
        assert!(
            failed.ends_with(
                "in 65.4s; rerun the failures with `backfill create --dag sales --from 2026-01-02 --to 2026-01-03 --reprocess-behavior failed --conf '{\"region\":\"eu\"}'`\n"
            ),
            "{failed}"
        );
    }

    #[test]
    fn a_quiet_or_json_summary_still_lists_the_failures() {
        let (data, notes) = summary_text(exit::FAILED, true, false);
        let doc: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(doc["exit_code"], 3);
        assert_eq!(doc["failed"].as_array().map(Vec::len), Some(2));
        assert!(!notes.contains('┌'), "no table with --output json: {notes}");
        assert!(notes.contains(
            "failed 2026-01-03: task `export` failed: exit code 2\n  log: [logs]/try2.log\n  | connecting\n  | ERROR: relation \"sales\" does not exist\n"
        ));
        // The same last line as without JSON: the DAG, its counts and the rerun.
        assert!(
            notes.contains(
                "backfill 1 of sales: failed — 1 succeeded, 1 failed, 1 rejected, 1 cancelled, 1 skipped in 65.4s; rerun the failures with `backfill create"
            ),
            "{notes}"
        );
        let (data, notes) = summary_text(exit::FAILED, false, true);
        assert_eq!(data, "");
        assert!(!notes.contains('┌'), "no table with -q: {notes}");
        assert!(notes.contains("rejected 2026-01-02: task `export` rejected"));
    }

    #[test]
    fn a_backfill_stopped_by_its_environment_says_the_cause_and_the_fix() {
        let mut outcome = outcome();
        outcome.failed.clear();
        outcome.backfill.state = crate::state::BackfillState::Cancelled;
        let fault = crate::environment::Fault::new(
            "audit file /p/.backfill/audit/try-7.db: the disk of /p/.backfill/audit is full",
            "free space on it",
        );
        let labels = fixtures::labels();
        for json in [false, true] {
            let mut s = summary(&outcome, exit::INTERNAL, Duration::from_millis(1500), None);
            s.stopped_by = Some(&fault);
            let (data, notes) = (Shared::default(), Shared::default());
            let mut out = Sink::new(data.clone(), notes.clone(), json, Fit::default());
            write(
                &mut out,
                &s,
                &labels,
                true,
                &std::collections::HashSet::new(),
            )
            .unwrap();
            assert!(
                notes.text().ends_with(
                    "cancelled — 1 succeeded, 1 failed, 1 rejected, 1 cancelled, 1 skipped in 1.5s; stopped: audit file /p/.backfill/audit/try-7.db: the disk of /p/.backfill/audit is full; free space on it, then `backfill resume 1`\n"
                ),
                "{}",
                notes.text()
            );
            if json {
                let doc: serde_json::Value = serde_json::from_str(&data.text()).unwrap();
                assert_eq!(doc["exit_code"], 1);
                assert_eq!(
                    doc["stopped_by"],
                    serde_json::json!({"cause": fault.cause, "fix": fault.fix})
                );
            }
        }
    }

    #[test]
    fn a_quiet_success_says_nothing() {
        let mut outcome = outcome();
        outcome.failed.clear();
        outcome.skipped.clear();
        outcome.backfill.state = crate::state::BackfillState::Completed;
        outcome.backfill.intervals = crate::manifest::queries::Counts {
            total: 5,
            planned: 5,
            succeeded: 5,
            ..Default::default()
        };
        assert_eq!(
            summary_of(&outcome, exit::OK, false, true),
            (String::new(), String::new())
        );
        let (_, notes) = summary_of(&outcome, exit::OK, false, false);
        assert!(
            notes.ends_with(
                "completed — 5 succeeded, 0 failed, 0 rejected, 0 cancelled, 0 skipped in 65.4s\n"
            ),
            "{notes}"
        );
    }
}
