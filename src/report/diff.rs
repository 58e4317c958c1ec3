//! `backfill diff ID`: per staged interval and task, the published and staged rows, the change,
//! whether the fingerprints agree and the keys added, removed and changed; then a line of
//! example keys per interval and task.

use super::Labeler;
use super::grid::{Grid, or_empty};
use super::out::Sink;
use crate::exit::Error;

/// One row of `backfill diff`.
#[derive(Debug, serde::Serialize)]
pub(crate) struct DiffRow {
    pub interval: crate::interval::IntervalDoc,
    pub task: String,
    pub published_rows: Option<i64>,
    pub staged_rows: Option<i64>,
    pub change_pct: Option<f64>,
    pub same_fingerprint: Option<bool>,
    pub keys: Option<crate::warehouse::diff::KeyDiff>,
}

/// `id` is the staged backfill, for the note when nothing awaits promotion.
pub(crate) fn write(
    out: &mut Sink<'_>,
    rows: &[DiffRow],
    labels: &Labeler,
    id: i64,
) -> Result<(), Error> {
    if out.json {
        return out.json(rows);
    }
    if rows.is_empty() {
        out.note(&format!(
            "no output of backfill {id} awaits promotion: nothing to compare"
        ));
        return Ok(());
    }
    let mut t = Grid::new(vec![
        "interval",
        "task",
        "published",
        "staged",
        "change",
        "same fingerprint",
        "keys added",
        "removed",
        "changed",
    ]);
    let yes_no = |b: Option<bool>| b.map_or(String::new(), |b| if b { "yes" } else { "no" }.into());
    for r in rows {
        t.row(vec![
            labels.label(r.interval.start.0),
            r.task.clone(),
            or_empty(r.published_rows),
            or_empty(r.staged_rows),
            r.change_pct.map_or(String::new(), |p| format!("{p:+.1}%")),
            yes_no(r.same_fingerprint),
            or_empty(r.keys.as_ref().map(|k| k.added)),
            or_empty(r.keys.as_ref().map(|k| k.removed)),
            or_empty(r.keys.as_ref().map(|k| k.changed)),
        ]);
    }
    out.text(&t.render(out.fit))?;
    let show = |v: &[serde_json::Value]| {
        v.iter()
            .map(|k| match k {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in rows {
        let Some(k) = &r.keys else { continue };
        let mut parts = Vec::new();
        for (what, n, examples) in [
            ("added", k.added, &k.examples.added),
            ("removed", k.removed, &k.examples.removed),
            ("changed", k.changed, &k.examples.changed),
        ] {
            if n > 0 {
                let more = if n > examples.len() as i64 {
                    ", ..."
                } else {
                    ""
                };
                parts.push(format!("{what} {}{more}", show(examples)));
            }
        }
        if !parts.is_empty() {
            out.line(&format!(
                "{} {}: {}",
                labels.label(r.interval.start.0),
                r.task,
                parts.join(" · ")
            ))?;
        }
    }
    Ok(())
}
