//! `backfill stale`: each task of each interval whose source changed since it was published,
//! with what was recorded and what the source says now.

use super::Labeler;
use super::grid::Grid;
use super::out::Sink;
use crate::exit::Error;
use crate::probe::{Seen, Stale};

/// `what` is what was asked, for the note when no source changed.
pub(crate) fn write(
    out: &mut Sink<'_>,
    stale: &[Stale],
    labels: &Labeler,
    what: &str,
) -> Result<(), Error> {
    if out.json {
        return out.json(stale);
    }
    if stale.is_empty() {
        out.note(what);
        return Ok(());
    }
    let seen = |s: Option<&Seen>| {
        s.map(|s| {
            let mut parts = Vec::new();
            if let Some(n) = s.source_rows {
                parts.push(format!("{n} rows"));
            }
            if let Some(f) = &s.source_fingerprint {
                parts.push(format!("fingerprint {f}"));
            }
            parts.join(", ")
        })
        .unwrap_or_default()
    };
    let mut t = Grid::new(vec!["interval", "task", "recorded", "now", "why"]);
    for s in stale {
        t.row(vec![
            labels.label(s.interval.start.0),
            s.task.clone(),
            seen(Some(&s.recorded)),
            seen(s.now.as_ref()),
            s.why.clone(),
        ]);
    }
    out.text(&t.render(out.fit))
}
