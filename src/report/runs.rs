//! `backfill runs --dag ID`: every run recorded for the DAG's intervals, by interval then
//! attempt, with its gate verdict and error; with `--output json` the runs as recorded.

use super::Labeler;
use super::grid::{Grid, duration_ms, has_content, or_empty};
use super::out::Sink;
use crate::exit::Error;
use crate::manifest::queries::RunHistory;

/// `what` is what was asked, for the note when no run matches.
pub fn write(
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
        "interval", "run", "backfill", "state", "started", "duration", "tries", "rows", "verdict",
        "error",
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
                    r.state.clone(),
                    r.started_at.clone(),
                    duration_ms(r.duration_ms),
                    r.tries.to_string(),
                    or_empty(r.rows),
                    match (&r.verdict, &r.reasons) {
                        (Some(v), Some(why)) => format!("{v}: {why}"),
                        (Some(v), None) => v.clone(),
                        _ => String::new(),
                    },
                    r.error.clone().unwrap_or_default(),
                ]
            },
            || {
                let text = |v: &Option<String>| v.as_deref().is_some_and(has_content);
                vec![
                    true,
                    true,
                    true,
                    has_content(&r.state),
                    has_content(&r.started_at),
                    r.duration_ms.is_some(),
                    true,
                    r.rows.is_some(),
                    text(&r.verdict),
                    text(&r.error),
                ]
            },
        );
    }
    out.text(&t.render(out.fit))
}
