//! `backfill list`: one row per backfill with its state, range, behaviour and interval counts;
//! with `--output json` the backfills as they are recorded.

use super::Labeler;
use super::grid::Grid;
use super::out::{Sink, hint};
use crate::exit::Error;
use crate::manifest::queries::BackfillSummary;
use crate::state::{BackfillKind, BackfillState};

/// A backfill's state as a person should read it: a running backfill whose owner is gone says
/// so, and how to continue it.
pub(crate) fn state_text(b: &BackfillSummary) -> String {
    let text = kind_text(b);
    match b.sample {
        Some(n) => format!(
            "{text}, sample of {}",
            crate::words::plural(i64::from(n), "interval", "intervals")
        ),
        None => text,
    }
}

/// [`state_text`] without the sample.
fn kind_text(b: &BackfillSummary) -> String {
    if b.state == BackfillState::Running && !b.owner_alive {
        format!(
            "running (owner gone: {})",
            hint(&format!("resume {}", b.id))
        )
    } else if b.state == BackfillState::Staged {
        format!("staged (awaits `{}`)", hint(&format!("promote {}", b.id)))
    } else {
        match (b.kind, b.source_backfill) {
            (BackfillKind::Promote, Some(source)) if b.atomic => {
                format!("{} (atomic promote of {source})", b.state)
            }
            (BackfillKind::Promote, Some(source)) => {
                format!("{} (promote of {source})", b.state)
            }
            (BackfillKind::Run, _) => match (&b.cascade, b.cascade_of) {
                (Some(mode), _) => format!("{} (cascade {mode})", b.state),
                (None, Some(root)) => format!("{} (cascade of {root})", b.state),
                _ => b.state.to_string(),
            },
            (kind, _) => format!("{} ({kind})", b.state),
        }
    }
}

/// A backfill's first and last interval, for humans: labels in its DAG's timezone, or the
/// `--from` and `--to` as typed before anything was planned.
pub(crate) fn range_labels(b: &BackfillSummary, labels: &Labeler) -> (String, String) {
    match (b.from, b.to) {
        (Some(from), Some(to)) => (labels.label(from.0), labels.label(to.0)),
        _ => (b.from_arg.clone(), b.to_arg.clone()),
    }
}

/// `labels` gives each DAG's labeler; `what` is what was asked, for the note when nothing
/// matches (`no active backfills`).
pub(crate) fn write(
    out: &mut Sink<'_>,
    list: &[BackfillSummary],
    labels: &dyn Fn(&str) -> Labeler,
    what: &str,
) -> Result<(), Error> {
    if out.json {
        return out.json(list);
    }
    if list.is_empty() {
        out.note(what);
        return Ok(());
    }
    let mut t = Grid::new(vec![
        "id",
        "dag",
        "state",
        "from",
        "to",
        "reprocess",
        "run",
        "skip",
        "ok",
        "failed",
        "created",
    ])
    .droppable(&["reprocess", "created", "skip", "run"]);
    for b in list {
        let c = &b.intervals;
        let (from, to) = range_labels(b, &labels(&b.dag_id));
        t.row(vec![
            b.id.to_string(),
            b.dag_id.clone(),
            state_text(b),
            from,
            to,
            b.reprocess_behavior.to_string(),
            c.planned.to_string(),
            c.skipped.to_string(),
            c.succeeded.to_string(),
            (c.failed + c.rejected).to_string(),
            b.created_at.clone(),
        ]);
    }
    out.text(&t.render(out.fit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{self, sink, widest};
    use crate::report::out::Fit;

    fn backfills() -> Vec<BackfillSummary> {
        let mut running = fixtures::backfill();
        running.id = 2;
        running.state = BackfillState::Running;
        running.finished_at = None;
        running.from = None;
        running.to = None;
        running.from_arg = "today-7d".into();
        running.to_arg = "yesterday".into();
        running.reprocess_behavior = crate::plan::Reprocess::Failed;
        vec![fixtures::backfill(), running]
    }

    #[test]
    fn list_says_how_to_continue_a_backfill_whose_owner_is_gone() {
        let labels = |_: &str| fixtures::labels();
        let (mut out, data, _) = sink(false, Fit::default());
        write(&mut out, &backfills(), &labels, "no backfills yet").unwrap();
        insta::assert_snapshot!("list", data.text());
        let (mut out, data, _) = sink(
            false,
            Fit {
                width: Some(80),
                full: false,
            },
        );
        write(&mut out, &backfills(), &labels, "no backfills yet").unwrap();
        assert!(widest(&data.text()) <= 80, "{}", data.text());
    }
}
