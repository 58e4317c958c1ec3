//! The data the read commands and the dry run print: human tables, or JSON documents with
//! `--output json`, always on stdout. Every column has its heading; a column empty in every row
//! is left out; tables longer than [`TABLE_LIMIT`] rows show their first and last halves with
//! a line of their own saying how many rows were left out.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use super::Labeler;
use super::out::{self, plural};
use crate::exit::Error;
use crate::interval::Rfc3339;
use crate::manifest::queries::{BackfillDetail, BackfillSummary, RunHistory};
use crate::plan::{Action, PlanRow};
use crate::project::{Dag, TaskKind};
use crate::state::BackfillState;
use crate::warehouse::versions::Storage;

pub use out::json as print_json;

/// Rows of a human table beyond which only the first and last half of this are shown.
pub const TABLE_LIMIT: usize = 200;

/// A table being built: headings and rows of cells.
pub struct Grid {
    headings: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Rows added with [`Grid::row_at`] that will not be printed.
    left_out: usize,
    /// Which columns have content in a row left out.
    filled: Vec<bool>,
}

/// Whether a cell counts as content (a column whose every cell is empty is left out).
fn has_content(cell: &str) -> bool {
    !cell.is_empty() && cell != "-"
}

impl Grid {
    pub fn new(headings: Vec<&'static str>) -> Self {
        let filled = vec![false; headings.len()];
        Self {
            headings,
            rows: Vec::new(),
            left_out: 0,
            filled,
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds row `index` of a table of `total` rows, formatting its `cells` only if it will be
    /// printed: a long table prints its first and last rows, and formatting the rest would
    /// cost more than reading them. For a row left out, `filled` says which of its cells have
    /// content, so that which columns are shown does not depend on which rows are.
    pub fn row_at(
        &mut self,
        index: usize,
        total: usize,
        cells: impl FnOnce() -> Vec<String>,
        filled: impl FnOnce() -> Vec<bool>,
    ) {
        let half = TABLE_LIMIT / 2;
        if total <= TABLE_LIMIT || index < half || index >= total - half {
            self.rows.push(cells());
        } else {
            self.left_out += 1;
            for (column, f) in self.filled.iter_mut().zip(filled()) {
                *column |= f;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len() + self.left_out
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table as text, columns that are empty in every row left out.
    pub fn render(&self) -> String {
        let keep: Vec<usize> = (0..self.headings.len())
            .filter(|&i| {
                self.filled[i]
                    || self
                        .rows
                        .iter()
                        .any(|r| r.get(i).is_some_and(|c| has_content(c)))
            })
            .collect();
        let table = |rows: &[Vec<String>]| {
            let mut t = Table::new();
            t.load_style(UTF8_FULL_CONDENSED);
            t.set_header(keep.iter().map(|&i| self.headings[i]).collect::<Vec<_>>());
            for r in rows {
                t.add_row(
                    keep.iter()
                        .map(|&i| r.get(i).cloned().unwrap_or_default())
                        .collect::<Vec<_>>(),
                );
            }
            t.to_string()
        };
        if self.len() <= TABLE_LIMIT {
            return table(&self.rows);
        }
        let half = TABLE_LIMIT / 2;
        let left_out = self.len() - TABLE_LIMIT;
        format!(
            "{}\n… {} left out; --output json lists every row\n{}",
            table(&self.rows[..half]),
            plural(i64::try_from(left_out).unwrap_or(i64::MAX), "row", "rows"),
            table(&self.rows[self.rows.len() - half..])
        )
    }

    /// Prints the table on stdout.
    pub fn print(&self) -> Result<(), Error> {
        out::data(&self.render())
    }
}

fn duration_ms(ms: Option<i64>) -> String {
    ms.map(|ms| format!("{:.2}s", ms as f64 / 1000.0))
        .unwrap_or_default()
}

fn or_empty<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

#[derive(Serialize)]
struct PlanDoc<'a> {
    dag_id: &'a str,
    schedule: &'a str,
    timezone: &'a str,
    reprocess_behavior: &'a str,
    run_backwards: bool,
    max_active_runs: u32,
    to_run: usize,
    to_skip: usize,
    /// `null` without history for every task.
    estimate_seconds: Option<f64>,
    /// How many tries the estimate comes from.
    estimate_tries: i64,
    intervals: PlanItems<'a>,
}

/// The plan's intervals, serialized one by one without building strings first: a plan may
/// hold a million intervals.
struct PlanItems<'a>(&'a [PlanRow]);

#[derive(Serialize)]
struct PlanItem {
    start: Rfc3339,
    end: Rfc3339,
    action: &'static str,
    reason: Option<&'static str>,
}

impl Serialize for PlanItems<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|r| PlanItem {
            start: Rfc3339(r.interval.start),
            end: Rfc3339(r.interval.end),
            action: match r.action {
                Action::Run => "run",
                Action::Skip(_) => "skip",
            },
            reason: match r.action {
                Action::Run => None,
                Action::Skip(reason) => Some(reason.as_str()),
            },
        }))
    }
}

/// How a plan was asked for.
pub struct PlanOptions<'a> {
    pub reprocess: &'a str,
    pub run_backwards: bool,
    pub max_active_runs: u32,
    /// The wall time the manifest's history predicts.
    pub estimate: &'a crate::estimate::Estimate,
}

/// A cascade's dry run: the plan of each DAG, the first one's then each downstream DAG's in the
/// order the cascade runs them. JSON: `{"cascade", "plans": [plan, ...]}`.
pub fn print_cascade_plan(
    plans: &[(&Dag, &[PlanRow], PlanOptions<'_>)],
    mode: crate::cascade::Mode,
    json: bool,
) -> Result<(), Error> {
    if json {
        let docs: Vec<PlanDoc<'_>> = plans
            .iter()
            .map(|(dag, rows, o)| plan_doc(dag, rows, o))
            .collect();
        return out::json(&serde_json::json!({
            "cascade": mode.as_str(),
            "plans": docs,
        }));
    }
    for (k, (dag, rows, o)) in plans.iter().enumerate() {
        if k > 0 {
            let ups: Vec<String> = dag.upstream.iter().map(|(u, _)| format!("`{u}`")).collect();
            out::data(&format!(
                "\ncascade: DAG `{}` reads {}: each interval below runs after the upstream intervals it overlaps, if they all succeed{}",
                dag.id,
                ups.join(", "),
                match mode {
                    crate::cascade::Mode::All => "",
                    crate::cascade::Mode::Changed => " and the output of one of them changed",
                }
            ))?;
        }
        print_plan(dag, rows, o, false)?;
    }
    Ok(())
}

fn plan_doc<'a>(dag: &'a Dag, rows: &'a [PlanRow], o: &PlanOptions<'a>) -> PlanDoc<'a> {
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    PlanDoc {
        dag_id: &dag.id,
        schedule: dag.schedule.expr(),
        timezone: dag.tz.name(),
        reprocess_behavior: o.reprocess,
        run_backwards: o.run_backwards,
        max_active_runs: o.max_active_runs,
        to_run,
        to_skip: rows.len() - to_run,
        estimate_seconds: o.estimate.seconds.map(|s| (s * 10.0).round() / 10.0),
        estimate_tries: o.estimate.tries,
        intervals: PlanItems(rows),
    }
}

pub fn print_plan(
    dag: &Dag,
    rows: &[PlanRow],
    o: &PlanOptions<'_>,
    json: bool,
) -> Result<(), Error> {
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    let to_skip = rows.len() - to_run;
    if json {
        return out::json(&plan_doc(dag, rows, o));
    }
    let labels = Labeler::new(dag);
    let mut t = Grid::new(vec![
        "#",
        "interval",
        "start (UTC)",
        "end (UTC)",
        "action",
        "reason",
    ]);
    for (i, r) in rows.iter().enumerate() {
        let (action, reason) = match r.action {
            Action::Run => ("run", String::new()),
            Action::Skip(reason) => ("skip", reason.to_string()),
        };
        t.row(vec![
            (i + 1).to_string(),
            labels.label(r.interval.start),
            Rfc3339(r.interval.start).to_string(),
            Rfc3339(r.interval.end).to_string(),
            action.to_string(),
            reason,
        ]);
    }
    t.print()?;
    out::data(&format!(
        "plan for {} ({} in {}): {} to run, {} to skip; --reprocess-behavior {}, --max-active-runs {}{} (dry run: nothing written)",
        dag.id,
        dag.schedule.expr(),
        dag.tz.name(),
        plural(
            i64::try_from(to_run).unwrap_or(i64::MAX),
            "interval",
            "intervals"
        ),
        to_skip,
        o.reprocess,
        o.max_active_runs,
        if o.run_backwards {
            ", newest first"
        } else {
            ""
        }
    ))?;
    let e = o.estimate;
    out::data(&match (e.seconds, to_run) {
        (_, 0) => "estimate: nothing to run".to_string(),
        (Some(s), _) => format!(
            "estimate: {} at up to {} at a time (median durations of {} recent successful tries)",
            about(s),
            e.lanes,
            e.tries
        ),
        (None, _) => format!(
            "estimate: none yet ({} never succeeded; each task's median duration comes from its recent successful tries)",
            e.unknown
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// A duration in seconds for people, rounded to what an estimate can say: `40s`, `3m 20s`,
/// `2h 5m`.
fn about(seconds: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let s = seconds.round().max(0.0) as u64;
    match s {
        0 => "under a second".to_string(),
        1..60 => format!("about {s}s"),
        60..3600 => format!("about {}m {}s", s / 60, s % 60),
        _ => format!("about {}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// A backfill's state as a person should read it: a running backfill whose owner is gone says
/// so, and how to continue it.
pub fn state_text(b: &BackfillSummary) -> String {
    if b.state == BackfillState::Running && !b.owner_alive {
        format!(
            "running (owner gone: {})",
            out::hint(&format!("resume {}", b.id))
        )
    } else if b.state == BackfillState::Staged {
        format!(
            "staged (awaits `{}`)",
            out::hint(&format!("promote {}", b.id))
        )
    } else {
        match (b.kind.as_str(), b.source_backfill) {
            ("promote", Some(source)) => format!("{} (promote of {source})", b.state),
            ("run", _) => match (&b.cascade, b.cascade_of) {
                (Some(mode), _) => format!("{} (cascade {mode})", b.state),
                (None, Some(root)) => format!("{} (cascade of {root})", b.state),
                _ => b.state.to_string(),
            },
            (kind, _) => format!("{} ({kind})", b.state),
        }
    }
}

/// `what` is what was asked, for the message when nothing matches (`no active backfills`).
/// A backfill's first and last interval, for humans: labels in its DAG's timezone, or the
/// `--from` and `--to` as typed before anything was planned.
fn range_labels(b: &BackfillSummary, labels: &Labeler) -> (String, String) {
    match (b.from, b.to) {
        (Some(from), Some(to)) => (labels.label(from.0), labels.label(to.0)),
        _ => (b.from_arg.clone(), b.to_arg.clone()),
    }
}

pub fn print_list(
    list: &[BackfillSummary],
    labels: &dyn Fn(&str) -> Labeler,
    json: bool,
    what: &str,
) -> Result<(), Error> {
    if json {
        return out::json(list);
    }
    if list.is_empty() {
        out::note(what);
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
    ]);
    for b in list {
        let c = &b.intervals;
        let (from, to) = range_labels(b, &labels(&b.dag_id));
        t.row(vec![
            b.id.to_string(),
            b.dag_id.clone(),
            state_text(b),
            from,
            to,
            b.reprocess_behavior.clone(),
            c.planned.to_string(),
            c.skipped.to_string(),
            c.succeeded.to_string(),
            (c.failed + c.rejected).to_string(),
            b.created_at.clone(),
        ]);
    }
    t.print()
}

pub fn print_show(
    detail: &BackfillDetail,
    kept_versions: Option<&[Storage]>,
    labels: &Labeler,
    json: bool,
) -> Result<(), Error> {
    if json {
        /// The document of `show --output json`: the backfill, and what the kept versions of
        /// its DAG's SQL targets cost (for rollback) when the project is at hand.
        #[derive(serde::Serialize)]
        struct Show<'a> {
            #[serde(flatten)]
            detail: &'a BackfillDetail,
            #[serde(skip_serializing_if = "Option::is_none")]
            kept_versions: Option<&'a [Storage]>,
        }
        return out::json(&Show {
            detail,
            kept_versions,
        });
    }
    let b = &detail.backfill;
    let c = &b.intervals;
    let (from, to) = range_labels(b, labels);
    let typed = if (from.as_str(), to.as_str()) == (b.from_arg.as_str(), b.to_arg.as_str()) {
        String::new()
    } else {
        format!(" (--from {} --to {})", b.from_arg, b.to_arg)
    };
    out::data(&format!(
        "backfill {} of {}: {} · {} to {}{} · reprocess {} · max active runs {}{}\n\
         created {}{} · {}: {} to run ({} succeeded, {} failed, {} rejected, {} cancelled, {} running, {} not started), {} skipped",
        b.id,
        b.dag_id,
        state_text(b),
        from,
        to,
        typed,
        b.reprocess_behavior,
        b.max_active_runs,
        if b.run_backwards { " · backwards" } else { "" }.to_string()
            + &b.tasks
                .as_ref()
                .map(|t| format!(" · only tasks {}", t.join(", ")))
                .unwrap_or_default(),
        b.created_at,
        b.finished_at
            .as_ref()
            .map(|f| format!(" · finished {f}"))
            .unwrap_or_default(),
        plural(c.total, "interval", "intervals"),
        c.planned,
        c.succeeded,
        c.failed,
        c.rejected,
        c.cancelled,
        c.running,
        c.pending,
        c.skipped,
    ))?;
    let mut t = Grid::new(vec![
        "#",
        "interval",
        "action",
        "reason",
        "state",
        "attempts",
        "tries",
        "rows",
        "verdict",
        "gate reasons",
        "duration",
        "error",
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
                    i.action.clone(),
                    i.reason.clone().unwrap_or_default(),
                    or_empty(i.state.as_ref()),
                    i.attempts.to_string(),
                    i.tries.to_string(),
                    or_empty(i.rows),
                    or_empty(i.verdict.as_ref()),
                    i.reasons.clone().unwrap_or_default(),
                    duration_ms(i.duration_ms),
                    i.error.clone().unwrap_or_default(),
                ]
            },
            || {
                let text = |v: &Option<String>| v.as_deref().is_some_and(has_content);
                vec![
                    true,
                    true,
                    has_content(&i.action),
                    text(&i.reason),
                    text(&i.state),
                    true,
                    true,
                    i.rows.is_some(),
                    text(&i.verdict),
                    text(&i.reasons),
                    i.duration_ms.is_some(),
                    text(&i.error),
                ]
            },
        );
    }
    t.print()?;
    for k in kept_versions
        .unwrap_or_default()
        .iter()
        .filter(|k| k.versions > 0)
    {
        out::data(&format!(
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
    #[allow(clippy::cast_precision_loss)]
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

/// `backfill stale`: each task of each interval whose source changed.
pub fn print_stale(
    stale: &[crate::probe::Stale],
    labels: &Labeler,
    json: bool,
    what: &str,
) -> Result<(), Error> {
    if json {
        return out::json(stale);
    }
    if stale.is_empty() {
        out::note(what);
        return Ok(());
    }
    let seen = |s: Option<&crate::probe::Seen>| {
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
    t.print()
}

pub fn print_runs(
    runs: &[RunHistory],
    labels: &Labeler,
    json: bool,
    what: &str,
) -> Result<(), Error> {
    if json {
        return out::json(runs);
    }
    if runs.is_empty() {
        out::note(what);
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
                    r.state.to_string(),
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
                    true,
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
    t.print()
}

#[derive(Serialize)]
struct DagDoc<'a> {
    id: &'a str,
    file: &'a str,
    schedule: &'a str,
    timezone: &'a str,
    max_active_runs: Option<u32>,
    depends_on_past: bool,
    tasks: Vec<TaskDoc<'a>>,
}

#[derive(Serialize)]
struct TaskDoc<'a> {
    id: &'a str,
    kind: &'static str,
    depends_on: &'a [String],
}

/// The DAGs as JSON documents.
pub fn dag_docs(dags: &[Dag]) -> serde_json::Value {
    serde_json::to_value(dag_doc_list(dags)).unwrap_or(serde_json::Value::Null)
}

fn dag_doc_list(dags: &[Dag]) -> Vec<DagDoc<'_>> {
    dags.iter()
        .map(|d| DagDoc {
            id: &d.id,
            file: &d.file,
            schedule: d.schedule.expr(),
            timezone: d.tz.name(),
            max_active_runs: d.max_active_runs,
            depends_on_past: d.depends_on_past,
            tasks: d
                .tasks
                .iter()
                .map(|t| TaskDoc {
                    id: &t.id,
                    kind: match t.kind {
                        TaskKind::Command(_) => "command",
                        TaskKind::Sql(_) => "sql",
                    },
                    depends_on: &t.depends_on,
                })
                .collect(),
        })
        .collect()
}

pub fn print_dags(dags: &[Dag], json: bool) -> Result<(), Error> {
    if json {
        return out::json(&dag_doc_list(dags));
    }
    if dags.is_empty() {
        out::note("no DAGs: add TOML files to dags/");
        return Ok(());
    }
    let mut t = Grid::new(vec!["dag", "schedule", "timezone", "tasks", "file"]);
    for d in dags {
        t.row(vec![
            d.id.clone(),
            d.schedule.expr().to_string(),
            d.tz.name().to_string(),
            d.tasks
                .iter()
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>()
                .join(" → "),
            d.file.clone(),
        ]);
    }
    t.print()
}

/// One row of `backfill diff`.
#[derive(Debug, serde::Serialize)]
pub struct DiffRow {
    pub interval: crate::interval::IntervalDoc,
    pub task: String,
    pub published_rows: Option<i64>,
    pub staged_rows: Option<i64>,
    pub change_pct: Option<f64>,
    pub same_fingerprint: Option<bool>,
    pub keys: Option<crate::warehouse::diff::KeyDiff>,
}

/// `backfill diff`: per staged interval and task, the published and staged rows, the change,
/// whether the fingerprints agree, and the keys; then the example keys.
pub fn print_diff(rows: &[DiffRow], labels: &Labeler, json: bool, id: i64) -> Result<(), Error> {
    if json {
        return out::json(rows);
    }
    if rows.is_empty() {
        out::note(&format!(
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
    t.print()?;
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
            out::data(&format!(
                "{} {}: {}",
                labels.label(r.interval.start.0),
                r.task,
                parts.join(" · ")
            ))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_columns_are_left_out_and_long_tables_say_what_they_skip() {
        let mut g = Grid::new(vec!["a", "empty", "b"]);
        for i in 0..3 {
            g.row(vec![i.to_string(), String::new(), "-".repeat(i)]);
        }
        let text = g.render();
        assert!(!text.contains("empty"), "{text}");
        assert!(text.contains(" b "), "{text}");
        let mut long = Grid::new(vec!["n"]);
        for i in 0..250 {
            long.row(vec![i.to_string()]);
        }
        let text = long.render();
        assert!(text.contains("\n… 50 rows left out; --output json lists every row\n"));
        assert!(text.contains(" 99 ") && text.contains(" 150 ") && !text.contains(" 120 "));
    }

    #[test]
    fn rows_left_out_are_not_formatted_but_still_decide_the_columns() {
        let cells = |i: usize| {
            vec![
                i.to_string(),
                if i == 120 { "x".into() } else { String::new() },
            ]
        };
        let mut eager = Grid::new(vec!["n", "rare"]);
        let mut lazy = Grid::new(vec!["n", "rare"]);
        let mut formatted = 0;
        for i in 0..250 {
            eager.row(cells(i));
            lazy.row_at(
                i,
                250,
                || {
                    formatted += 1;
                    cells(i)
                },
                || vec![true, i == 120],
            );
        }
        assert_eq!(formatted, TABLE_LIMIT);
        assert_eq!(lazy.len(), 250);
        assert_eq!(lazy.render(), eager.render());
        assert!(lazy.render().contains("rare"), "row 120 fills the column");
    }
}
