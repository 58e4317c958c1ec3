//! `backfill runs --dag ID`: every run recorded for the DAG's intervals, by interval then
//! attempt, with its gate verdict and error; with `--output json` the runs as recorded.

use super::Labeler;
use super::grid::{Grid, duration_ms, error_cell, has_content, rows_cell};
use super::out::Sink;
use crate::exit::Error;
use crate::manifest::queries::RunHistory;

/// `what` is what was asked, for the note when no run matches.
pub(crate) fn write(
    out: &mut Sink<'_>,
    runs: &[RunHistory],
    labels: &Labeler,
    what: &str,
) -> Result<(), Error> {
    if out.json {
        return out.json(runs);
    }
    if runs.is_empty() {
        out.note(what);
        return Ok(());
    }
    let mut t = Grid::new(vec![
        "interval", "run", "backfill", "state", "started", "duration", "tries", "rows", "changes",
        "verdict", "error",
    ])
    .droppable(&[
        "tries", "duration", "changes", "started", "backfill", "verdict", "run", "rows",
    ]);
    for (k, r) in runs.iter().enumerate() {
        t.row_at(
            k,
            runs.len(),
            || {
                vec![
                    labels.label(r.start.0),
                    r.run_id.to_string(),
                    r.backfill_id.to_string(),
                    r.state.to_string(),
                    r.started_at.clone(),
                    duration_ms(r.duration_ms),
                    r.tries.to_string(),
                    rows_cell(r.rows, r.rejected_rows),
                    r.changes.map(|c| c.short()).unwrap_or_default(),
                    match (&r.verdict, &r.reasons) {
                        // The state says it was rejected.
                        (Some(v), Some(why))
                            if r.state == crate::state::RunState::Rejected
                                && v.verdict == crate::state::Verdict::Rejected =>
                        {
                            why.clone()
                        }
                        (Some(v), Some(why)) => format!("{v}: {why}"),
                        (Some(v), None) => v.to_string(),
                        _ => String::new(),
                    },
                    error_cell(r.error.as_deref(), r.reasons.as_deref()),
                ]
            },
            || {
                let text = |v: &Option<String>| v.as_deref().is_some_and(has_content);
                vec![
                    true,
                    true,
                    true,
                    true,
                    has_content(&r.started_at),
                    r.duration_ms.is_some(),
                    true,
                    r.rows.or(r.rejected_rows).is_some(),
                    r.changes.is_some(),
                    r.verdict.is_some(),
                    text(&r.error),
                ]
            },
        );
    }
    out.text(&t.render(out.fit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{self, FAILED, REJECTED, at, sink, widest};
    use crate::report::out::Fit;

    fn history() -> Vec<RunHistory> {
        let run =
            |d: u32, state: &str, rows, verdict: Option<&str>, error: Option<&str>| RunHistory {
                run_id: i64::from(d),
                backfill_id: 1,
                start: at(d),
                end: at(d + 1),
                state: state.parse().expect("a run state"),
                started_at: format!("2026-02-01T09:3{d}:00Z"),
                duration_ms: Some(1250),
                tries: 1,
                rows,
                rejected_rows: (state == "rejected").then_some(5),
                warned: false,
                changes: None,
                verdict: verdict.map(|v| crate::state::ShownVerdict {
                    verdict: v.parse().expect("a verdict"),
                    staged: None,
                }),
                reasons: error.filter(|_| state == "rejected").map(|_| {
                    "row count 5 differs from the source count 10 by 50.0% (tolerance 0.0%)".into()
                }),
                error: error.map(String::from),
            };
        vec![
            run(1, "succeeded", Some(10), Some("published"), None),
            run(2, "rejected", None, Some("rejected"), Some(REJECTED)),
            run(3, "failed", None, None, Some(FAILED)),
        ]
    }

    fn render(fit: Fit) -> String {
        let (mut out, data, notes) = sink(false, fit);
        write(&mut out, &history(), &fixtures::labels(), "no runs").unwrap();
        assert_eq!(notes.text(), "");
        data.text()
    }

    #[test]
    fn runs_in_full_without_a_width() {
        insta::assert_snapshot!("runs", render(Fit::default()));
    }

    #[test]
    fn runs_fit_a_narrow_terminal_and_cut_long_cells_unless_verbose() {
        for width in [120, 100, 80] {
            for full in [false, true] {
                let text = render(Fit {
                    width: Some(width),
                    full,
                });
                assert!(widest(&text) <= usize::from(width), "{width}:\n{text}");
                assert_eq!(text.contains("0.0%)"), full, "{width}:\n{text}");
            }
        }
        insta::assert_snapshot!(
            "runs_120",
            render(Fit {
                width: Some(120),
                full: false
            })
        );
    }

    #[test]
    fn json_lists_every_run_whole_and_no_runs_is_a_note() {
        let (mut out, data, _) = sink(
            true,
            Fit {
                width: Some(40),
                full: false,
            },
        );
        write(&mut out, &history(), &fixtures::labels(), "no runs").unwrap();
        let doc: serde_json::Value = serde_json::from_str(&data.text()).unwrap();
        assert_eq!(doc[1]["error"], REJECTED);
        let (mut out, data, notes) = sink(false, Fit::default());
        write(&mut out, &[], &fixtures::labels(), "no runs of DAG sales").unwrap();
        assert_eq!(
            (data.text(), notes.text()),
            (String::new(), "no runs of DAG sales\n".into())
        );
    }
}
