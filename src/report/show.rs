//! `backfill show ID`: two lines about the backfill, then each interval of its plan (action and
//! skip reason, the state of its latest run, attempts, tries, rows, gate verdict and reasons,
//! duration, the host that ran it when tries ran on several, error), then what the kept versions of its DAG's SQL targets cost. With
//! `--output json`, the backfill, its intervals and the kept versions as one document.

use super::Labeler;
use super::grid::{Grid, duration_ms, error_cell, has_content, or_empty, rows_cell};
use super::list::{range_labels, state_text};
use super::out::{Sink, plural};
use crate::exit::Error;
use crate::manifest::queries::{BackfillDetail, BackfillSummary};
use crate::state::BackfillState;
use crate::warehouse::versions::Storage;

/// The document of `show --output json`: the backfill, and what the kept versions of its DAG's
/// SQL targets cost (for rollback) when the project is at hand.
#[derive(serde::Serialize)]
struct Show<'a> {
    #[serde(flatten)]
    detail: &'a BackfillDetail,
    #[serde(skip_serializing_if = "Option::is_none")]
    kept_versions: Option<&'a [Storage]>,
}

pub(crate) fn write(
    out: &mut Sink<'_>,
    detail: &BackfillDetail,
    kept_versions: Option<&[Storage]>,
    labels: &Labeler,
) -> Result<(), Error> {
    if out.json {
        return out.json(&Show {
            detail,
            kept_versions,
        });
    }
    let warned = detail
        .interval_details
        .iter()
        .filter(|i| super::cells::Cell::of(i) == super::cells::Cell::Warned)
        .count();
    write_heading(out, &detail.backfill, labels, warned)?;
    out.text(&intervals(detail, labels).render(out.fit))?;
    write_workers(out, detail)?;
    write_kept(out, kept_versions.unwrap_or_default())
}

/// ` (N with warnings)` after a count of succeeded intervals, when N is not 0.
pub(crate) fn with_warnings(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} with warnings)")
    }
}

/// The backfill's two lines: what it is, and how its intervals stand.
/// `warned`: how many of the succeeded intervals were published with the gate's warnings.
fn write_heading(
    out: &mut Sink<'_>,
    b: &BackfillSummary,
    labels: &Labeler,
    warned: usize,
) -> Result<(), Error> {
    let c = &b.intervals;
    let (from, to) = range_labels(b, labels);
    let typed = if (from.as_str(), to.as_str()) == (b.from_arg.as_str(), b.to_arg.as_str()) {
        String::new()
    } else {
        format!(" (--from {} --to {})", b.from_arg, b.to_arg)
    };
    out.line(&format!(
        "backfill {} of {}: {} · {} to {}{} · reprocess {} · max active runs {}{}",
        b.id,
        b.dag_id,
        state_text(b),
        from,
        to,
        typed,
        b.reprocess_behavior,
        b.max_active_runs,
        b.batch_size
            .filter(|n| *n > 1)
            .map(|n| format!(" · batch size {n}"))
            .unwrap_or_default()
            + if b.run_backwards { " · backwards" } else { "" }
            + &b.tasks
                .as_ref()
                .map(|t| format!(" · only tasks {}", t.join(", ")))
                .unwrap_or_default(),
    ))?;
    out.line(&format!(
        "created {}{} · {}: {} to run ({} succeeded{}, {} failed, {} rejected, {} cancelled, {} running, {} not started), {} skipped",
        b.created_at,
        b.finished_at
            .as_ref()
            .map(|f| format!(" · finished {f}"))
            .unwrap_or_default(),
        plural(c.total, "interval", "intervals"),
        c.planned,
        c.succeeded,
        with_warnings(warned),
        c.failed,
        c.rejected,
        c.cancelled,
        c.running,
        c.pending,
        c.skipped,
    ))?;
    Ok(())
}

/// The table of the backfill's intervals.
fn intervals(detail: &BackfillDetail, labels: &Labeler) -> Grid {
    let mut t = Grid::new(vec![
        "#",
        "interval",
        "action",
        "reason",
        "state",
        "attempts",
        "tries",
        "rows",
        "changes",
        "verdict",
        "gate reasons",
        "duration",
        "host",
        "error",
    ])
    .droppable(&[
        "action", "attempts", "tries", "host", "duration", "#", "changes", "verdict", "reason",
        "rows",
    ]);
    let total = detail.interval_details.len();
    for (k, i) in detail.interval_details.iter().enumerate() {
        t.row_at(
            k,
            total,
            || {
                vec![
                    (i.ord + 1).to_string(),
                    labels.label(i.start.0),
                    i.action.to_string(),
                    i.reason.clone().unwrap_or_default(),
                    or_empty(i.state.as_ref()),
                    i.attempts.to_string(),
                    i.tries.to_string(),
                    rows_cell(i.rows, i.rejected_rows),
                    i.changes.map(|c| c.short()).unwrap_or_default(),
                    or_empty(i.verdict.as_ref()),
                    i.reasons.clone().unwrap_or_default(),
                    duration_ms(i.duration_ms),
                    i.host.clone().unwrap_or_default(),
                    error_cell(i.error.as_deref(), i.reasons.as_deref()),
                ]
            },
            || {
                let text = |v: &Option<String>| v.as_deref().is_some_and(has_content);
                vec![
                    true,
                    true,
                    true,
                    text(&i.reason),
                    i.state.is_some(),
                    true,
                    true,
                    i.rows.or(i.rejected_rows).is_some(),
                    i.changes.is_some(),
                    i.verdict.is_some(),
                    text(&i.reasons),
                    i.duration_ms.is_some(),
                    text(&i.host),
                    text(&i.error),
                ]
            },
        );
    }
    t
}

/// A line for each worker that joined the backfill.
fn write_workers(out: &mut Sink<'_>, detail: &BackfillDetail) -> Result<(), Error> {
    for w in &detail.workers {
        let state = match (w.state, w.alive) {
            (BackfillState::Running, false) => {
                "gone (no heartbeat within the lease timeout)".to_string()
            }
            (state, _) => state.to_string(),
        };
        out.line(&format!(
            "worker {} (backfill join): host {} pid {} · {state} · ran {} · at most {} at once · joined {}{}",
            w.id,
            w.host.as_deref().unwrap_or("?"),
            w.pid.map_or("?".to_string(), |p| p.to_string()),
            plural(w.runs, "interval", "intervals"),
            w.max_active_runs,
            w.started_at,
            w.finished_at
                .as_ref()
                .map(|f| format!(" · ended {f}"))
                .unwrap_or_default(),
        ))?;
    }
    Ok(())
}

/// What the tasks' targets keep for rollback.
fn write_kept(out: &mut Sink<'_>, kept_versions: &[Storage]) -> Result<(), Error> {
    for k in kept_versions.iter().filter(|k| k.versions > 0) {
        out.line(&format!(
            "kept for rollback in `{}`: {}, {}, {}",
            k.target,
            plural(k.versions, "version", "versions"),
            plural(k.rows, "row", "rows"),
            human_bytes(k.bytes)
        ))?;
    }
    Ok(())
}

/// A size in bytes for people: `3.2 MiB`.
fn human_bytes(n: i64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::queries::IntervalDetail;
    use crate::report::fixtures::{self, FAILED, REJECTED, at, sink, widest};
    use crate::report::out::Fit;

    fn detail() -> BackfillDetail {
        let interval = |d: u32, state: &str, rows, verdict: Option<&str>, error: Option<&str>| {
            IntervalDetail {
                ord: i64::from(d) - 1,
                start: at(d),
                end: at(d + 1),
                action: crate::state::PlanAction::Run,
                reason: None,
                state: Some(crate::state::IntervalState::Run(
                    state.parse().expect("a run state"),
                )),
                attempts: 1,
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
                duration_ms: Some(1250),
                ready: Vec::new(),
                error: error.map(String::from),
                log: None,
                host: None,
                batch: None,
            }
        };
        BackfillDetail {
            workers: Vec::new(),
            backfill: fixtures::backfill(),
            interval_details: vec![
                interval(1, "succeeded", Some(10), Some("published"), None),
                interval(2, "rejected", None, Some("rejected"), Some(REJECTED)),
                interval(3, "failed", None, None, Some(FAILED)),
                interval(4, "succeeded", Some(10), Some("published"), None),
            ],
            cascade_backfills: None,
        }
    }

    fn kept() -> Vec<Storage> {
        vec![Storage {
            target: "orders_fact".into(),
            versions: 2,
            rows: 1200,
            bytes: 3_355_443,
        }]
    }

    fn render(fit: Fit) -> String {
        let (mut out, data, _) = sink(false, fit);
        write(&mut out, &detail(), Some(&kept()), &fixtures::labels()).unwrap();
        data.text()
    }

    #[test]
    fn show_in_full_without_a_width() {
        insta::assert_snapshot!("show", render(Fit::default()));
    }

    #[test]
    fn show_fits_its_lines_and_its_table_to_the_width() {
        for width in [120, 100, 80] {
            let text = render(Fit {
                width: Some(width),
                full: false,
            });
            assert!(widest(&text) <= usize::from(width), "{text}");
        }
        insta::assert_snapshot!(
            "show_120",
            render(Fit {
                width: Some(120),
                full: false
            })
        );
    }

    #[test]
    fn show_names_the_host_of_each_interval_when_it_is_given() {
        assert!(
            !render(Fit::default()).contains("host"),
            "no column without hosts"
        );
        let mut d = detail();
        for (i, host) in d
            .interval_details
            .iter_mut()
            .zip(["etl-1", "etl-2", "etl-1", "etl-2"])
        {
            i.host = Some(host.into());
        }
        let (mut out, data, _) = sink(false, Fit::default());
        write(&mut out, &d, None, &fixtures::labels()).unwrap();
        let text = data.text();
        let row = |n: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("│ {n} ")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(text.lines().any(|l| l.contains(" host ")), "{text}");
        assert!(
            row("1").contains("etl-1") && row("2").contains("etl-2"),
            "{text}"
        );
    }

    #[test]
    fn show_json_has_the_kept_versions() {
        let (mut out, data, _) = sink(true, Fit::default());
        write(&mut out, &detail(), Some(&kept()), &fixtures::labels()).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&data.text()).unwrap();
        assert_eq!(doc["kept_versions"][0]["target"], "orders_fact");
        assert_eq!(doc["interval_details"][1]["error"], REJECTED);
    }
}
