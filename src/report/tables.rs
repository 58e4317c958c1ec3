//! Tables for humans (stderr) and JSON documents (stdout) for the read commands and the plan.

use std::io::{BufWriter, Write};

use chrono_tz::Tz;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use super::label;
use crate::interval::{Rfc3339, rfc3339};
use crate::manifest::queries::{BackfillDetail, BackfillSummary, RunHistory};
use crate::plan::{Action, PlanRow};
use crate::project::{Dag, TaskKind};

/// Writes one JSON document and a newline to stdout.
pub fn print_json<T: Serialize + ?Sized>(value: &T) {
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let _ = serde_json::to_writer(&mut out, value);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

pub fn print_table(table: &Table) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{table}");
}

fn table(header: Vec<&str>) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(header);
    t
}

fn duration_ms(ms: Option<i64>) -> String {
    ms.map(|ms| format!("{:.2}s", ms as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
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

/// Rows of a human table beyond which only the first and last half of this are shown.
const TABLE_LIMIT: usize = 200;

/// The row indices a human table shows: all of them, or the first and last `TABLE_LIMIT / 2`;
/// and, when rows are left out, before which index and how many. `--output json` lists all.
fn shown_rows(len: usize) -> (Vec<usize>, Option<(usize, usize)>) {
    if len <= TABLE_LIMIT {
        return ((0..len).collect(), None);
    }
    let half = TABLE_LIMIT / 2;
    let shown = (0..half).chain(len - half..len).collect();
    (shown, Some((len - half, len - TABLE_LIMIT)))
}

/// Adds the row that says how many rows were left out, just before index `gap.0`.
fn gap_row(t: &mut Table, gap: Option<(usize, usize)>, i: usize) {
    if let Some((before, left_out)) = gap
        && before == i
    {
        t.add_row(vec![
            "…".to_string(),
            format!("{left_out} more rows; --output json lists all"),
        ]);
    }
}

pub fn print_plan(
    dag: &Dag,
    rows: &[PlanRow],
    reprocess: &str,
    run_backwards: bool,
    max_active_runs: u32,
    json: bool,
) {
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    let to_skip = rows.len() - to_run;
    if json {
        print_json(&PlanDoc {
            dag_id: &dag.id,
            schedule: dag.schedule.expr(),
            timezone: dag.tz.name(),
            reprocess_behavior: reprocess,
            run_backwards,
            max_active_runs,
            to_run,
            to_skip,
            intervals: PlanItems(rows),
        });
        return;
    }
    let mut t = table(vec![
        "#",
        "interval",
        "start (UTC)",
        "end (UTC)",
        "action",
        "reason",
    ]);
    let (shown, gap) = shown_rows(rows.len());
    for i in shown {
        gap_row(&mut t, gap, i);
        let r = &rows[i];
        let (action, reason) = match r.action {
            Action::Run => ("run", String::new()),
            Action::Skip(reason) => ("skip", reason.to_string()),
        };
        t.add_row(vec![
            (i + 1).to_string(),
            label(r.interval.start, dag.tz),
            rfc3339(r.interval.start),
            rfc3339(r.interval.end),
            action.to_string(),
            reason,
        ]);
    }
    print_table(&t);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "plan for {} ({} in {}): {} to run, {} to skip; --reprocess-behavior {reprocess}, --max-active-runs {max_active_runs}{} (dry run: nothing written)",
        dag.id,
        dag.schedule.expr(),
        dag.tz.name(),
        to_run,
        to_skip,
        if run_backwards { ", newest first" } else { "" }
    );
}

pub fn print_list(list: &[BackfillSummary], json: bool) {
    if json {
        print_json(list);
        return;
    }
    if list.is_empty() {
        eprintln!("no backfills yet");
        return;
    }
    let mut t = table(vec![
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
        t.add_row(vec![
            b.id.to_string(),
            b.dag_id.clone(),
            b.state.clone(),
            b.from.clone(),
            b.to.clone(),
            b.reprocess_behavior.clone(),
            c.planned.to_string(),
            c.skipped.to_string(),
            c.succeeded.to_string(),
            (c.failed + c.rejected).to_string(),
            b.created_at.clone(),
        ]);
    }
    print_table(&t);
}

pub fn print_show(detail: &BackfillDetail, tz: Option<Tz>, json: bool) {
    if json {
        print_json(detail);
        return;
    }
    let b = &detail.backfill;
    let c = &b.intervals;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "backfill {} of {}: {} · --from {} --to {} · reprocess {} · max active runs {}{}\n\
         created {}{} · {} intervals: {} to run ({} succeeded, {} failed, {} rejected, {} cancelled, {} running, {} not started), {} skipped",
        b.id,
        b.dag_id,
        b.state,
        b.from,
        b.to,
        b.reprocess_behavior,
        b.max_active_runs,
        if b.run_backwards { " · backwards" } else { "" },
        b.created_at,
        b.finished_at
            .as_ref()
            .map(|f| format!(" · finished {f}"))
            .unwrap_or_default(),
        c.total,
        c.planned,
        c.succeeded,
        c.failed,
        c.rejected,
        c.cancelled,
        c.running,
        c.pending,
        c.skipped,
    );
    drop(err);
    let mut t = table(vec![
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
    let (shown, gap) = shown_rows(detail.interval_details.len());
    for index in shown {
        gap_row(&mut t, gap, index);
        let i = &detail.interval_details[index];
        let shown_start = match tz {
            Some(tz) => label(i.start.0, tz),
            None => i.start.to_string(),
        };
        t.add_row(vec![
            (i.ord + 1).to_string(),
            shown_start,
            i.action.clone(),
            i.reason.clone().unwrap_or_default(),
            or_dash(i.state.as_ref()),
            i.attempts.to_string(),
            i.tries.to_string(),
            or_dash(i.rows),
            or_dash(i.verdict.as_ref()),
            i.reasons.clone().unwrap_or_default(),
            duration_ms(i.duration_ms),
            i.error.clone().unwrap_or_default(),
        ]);
    }
    print_table(&t);
}

pub fn print_runs(runs: &[RunHistory], json: bool) {
    if json {
        print_json(runs);
        return;
    }
    if runs.is_empty() {
        eprintln!("no runs recorded");
        return;
    }
    let mut t = table(vec![
        "interval start",
        "run",
        "backfill",
        "state",
        "started",
        "duration",
        "tries",
        "rows",
        "error",
    ]);
    let (shown, gap) = shown_rows(runs.len());
    for index in shown {
        gap_row(&mut t, gap, index);
        let r = &runs[index];
        t.add_row(vec![
            r.start.clone(),
            r.run_id.to_string(),
            r.backfill_id.to_string(),
            r.state.clone(),
            r.started_at.clone(),
            duration_ms(r.duration_ms),
            r.tries.to_string(),
            or_dash(r.rows),
            match (&r.verdict, &r.reasons) {
                (Some(v), Some(why)) => format!("{v}: {why}"),
                (Some(v), None) => v.clone(),
                _ => "-".into(),
            },
            r.error.clone().unwrap_or_default(),
        ]);
    }
    print_table(&t);
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

pub fn print_dags(dags: &[Dag], json: bool) {
    if json {
        let docs: Vec<DagDoc<'_>> = dags
            .iter()
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
            .collect();
        print_json(&docs);
        return;
    }
    if dags.is_empty() {
        eprintln!("no DAGs: add TOML files to dags/");
        return;
    }
    let mut t = table(vec!["dag", "schedule", "timezone", "tasks", "file"]);
    for d in dags {
        t.add_row(vec![
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
    print_table(&t);
}
