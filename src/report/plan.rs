//! The plan of `create --dry-run`: one row per interval (run, or skip with its reason), a line
//! that sums it up and the estimate of its wall time; with `--output json` one document with
//! every interval. A cascade's dry run prints the plan of each DAG in the order they run.

use serde::Serialize;

use super::Labeler;
use super::grid::Grid;
use super::out::{Sink, plural};
use crate::exit::Error;
use crate::interval::Rfc3339;
use crate::plan::{Action, PlanRow};
use crate::project::Dag;

#[derive(Serialize)]
struct PlanDoc<'a> {
    dag_id: &'a str,
    schedule: &'a str,
    timezone: &'a str,
    reprocess_behavior: &'a str,
    run_backwards: bool,
    max_active_runs: u32,
    /// Left out when intervals run one query each.
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_size: Option<u32>,
    to_run: usize,
    to_skip: usize,
    /// `null` without history for every task.
    estimate_seconds: Option<f64>,
    /// How many tries the estimate comes from.
    estimate_tries: i64,
    /// The least time the slowest pool rate gives the plan, known without history: `{"pool",
    /// "rate", "seconds"}`; left out when no task's pool has a rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    estimate_rate: Option<serde_json::Value>,
    /// The gate's rules on values of each task that has some, as the dry run lists them.
    rules: std::collections::BTreeMap<&'a str, Vec<String>>,
    intervals: PlanItems<'a>,
}

/// The rules of each task of `dag` that has some.
fn rules(dag: &Dag) -> std::collections::BTreeMap<&str, Vec<String>> {
    dag.tasks
        .iter()
        .filter_map(|t| {
            let rules = t.gate.as_ref()?.described_rules();
            (!rules.is_empty()).then_some((t.id.as_str(), rules))
        })
        .collect()
}

/// The plan's intervals, serialized one by one without building strings first: a plan may
/// hold a million intervals.
struct PlanItems<'a>(
    &'a [PlanRow],
    Option<&'a std::collections::HashMap<i64, &'static str>>,
    Option<std::collections::HashMap<i64, usize>>,
);

/// With `batch_size` above 1: the batch (numbered from 1, in the order they run) of each
/// interval that runs, by start, as the runner groups them (see [`crate::plan::batches`]).
fn batch_numbers(
    dag: &Dag,
    rows: &[PlanRow],
    run_backwards: bool,
) -> Option<std::collections::HashMap<i64, usize>> {
    if dag.batch_size < 2 {
        return None;
    }
    let mut runs: Vec<crate::interval::DataInterval> = rows
        .iter()
        .filter(|r| r.action == Action::Run)
        .map(|r| r.interval)
        .collect();
    runs.sort();
    if run_backwards {
        runs.reverse();
    }
    let mut numbers = std::collections::HashMap::new();
    for (n, range) in crate::plan::batches(&runs, dag.batch_size)
        .into_iter()
        .enumerate()
    {
        for i in &runs[range] {
            numbers.insert(i.start.timestamp(), n + 1);
        }
    }
    Some(numbers)
}

#[derive(Serialize)]
struct PlanItem {
    start: Rfc3339,
    end: Rfc3339,
    action: &'static str,
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<usize>,
}

impl Serialize for PlanItems<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|r| {
            PlanItem {
                start: Rfc3339(r.interval.start),
                end: Rfc3339(r.interval.end),
                action: match r.action {
                    Action::Run => "run",
                    Action::Skip(_) => "skip",
                },
                reason: match r.action {
                    Action::Run => self
                        .1
                        .and_then(|why| why.get(&r.interval.start.timestamp()).copied()),
                    Action::Skip(reason) => Some(reason.as_str()),
                },
                batch: self
                    .2
                    .as_ref()
                    .and_then(|b| b.get(&r.interval.start.timestamp()).copied()),
            }
        }))
    }
}

/// How a plan was asked for.
pub(crate) struct PlanOptions<'a> {
    pub reprocess: &'a str,
    pub run_backwards: bool,
    pub max_active_runs: u32,
    /// The wall time the manifest's history predicts.
    pub estimate: &'a crate::estimate::Estimate,
    /// `--sample`: why each interval that runs was picked, by start (unix seconds).
    pub sampled: Option<&'a std::collections::HashMap<i64, &'static str>>,
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
        batch_size: (dag.batch_size > 1).then_some(dag.batch_size),
        to_run,
        to_skip: rows.len() - to_run,
        estimate_seconds: o.estimate.seconds.map(|s| (s * 10.0).round() / 10.0),
        estimate_tries: o.estimate.tries,
        estimate_rate: o.estimate.rate.as_ref().map(|(pool, rate, seconds)| {
            serde_json::json!({"pool": pool, "rate": rate.to_string(), "seconds": seconds})
        }),
        rules: rules(dag),
        intervals: PlanItems(rows, o.sampled, batch_numbers(dag, rows, o.run_backwards)),
    }
}

/// A cascade's dry run: the plan of each DAG, the first one's then each downstream DAG's in the
/// order the cascade runs them. JSON: `{"cascade", "plans": [plan, ...]}`.
pub(crate) fn write_cascade(
    out: &mut Sink<'_>,
    plans: &[(&Dag, &[PlanRow], PlanOptions<'_>)],
    mode: crate::cascade::Mode,
) -> Result<(), Error> {
    if out.json {
        let docs: Vec<PlanDoc<'_>> = plans
            .iter()
            .map(|(dag, rows, o)| plan_doc(dag, rows, o))
            .collect();
        return out.json(&serde_json::json!({
            "cascade": mode.as_str(),
            "plans": docs,
        }));
    }
    for (k, (dag, rows, o)) in plans.iter().enumerate() {
        if k > 0 {
            let ups: Vec<String> = dag.upstream.iter().map(|(u, _)| format!("`{u}`")).collect();
            out.line(&format!(
                "\ncascade: DAG `{}` reads {}: each interval below runs after the upstream intervals it overlaps, if they all succeed{}",
                dag.id,
                ups.join(", "),
                match mode {
                    crate::cascade::Mode::All => "",
                    crate::cascade::Mode::Changed => " and the output of one of them changed",
                }
            ))?;
        }
        write(out, dag, rows, o)?;
    }
    Ok(())
}

/// One DAG's plan.
pub(crate) fn write(
    out: &mut Sink<'_>,
    dag: &Dag,
    rows: &[PlanRow],
    o: &PlanOptions<'_>,
) -> Result<(), Error> {
    if out.json {
        return out.json(&plan_doc(dag, rows, o));
    }
    let to_run = rows.iter().filter(|r| r.action == Action::Run).count();
    let to_skip = rows.len() - to_run;
    let labels = Labeler::new(dag);
    let batches = batch_numbers(dag, rows, o.run_backwards);
    let mut columns = vec!["#", "interval", "start (UTC)", "end (UTC)", "action"];
    if batches.is_some() {
        columns.push("batch");
    }
    columns.push("reason");
    let mut t = Grid::new(columns).droppable(&["start (UTC)", "end (UTC)", "#"]);
    for (i, r) in rows.iter().enumerate() {
        let (action, reason) = match r.action {
            Action::Run => (
                "run",
                o.sampled
                    .and_then(|why| why.get(&r.interval.start.timestamp()))
                    .map_or_else(String::new, |w| (*w).to_string()),
            ),
            Action::Skip(reason) => ("skip", reason.to_string()),
        };
        let mut row = vec![
            (i + 1).to_string(),
            labels.label(r.interval.start),
            Rfc3339(r.interval.start).to_string(),
            Rfc3339(r.interval.end).to_string(),
            action.to_string(),
        ];
        if let Some(b) = &batches {
            row.push(
                b.get(&r.interval.start.timestamp())
                    .map_or_else(String::new, ToString::to_string),
            );
        }
        row.push(reason);
        t.row(row);
    }
    out.text(&t.render(out.fit))?;
    out.line(&format!(
        "plan for {} ({} in {}): {} to run, {} to skip; --reprocess-behavior {}, --max-active-runs {}{}{} (dry run: nothing written)",
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
        match &batches {
            Some(b) => format!(
                ", --batch-size {} ({} of one query each)",
                dag.batch_size,
                plural(
                    i64::try_from(b.values().max().copied().unwrap_or(0)).unwrap_or(0),
                    "batch",
                    "batches"
                )
            ),
            None => String::new(),
        },
        if o.run_backwards {
            ", newest first"
        } else {
            ""
        }
    ))?;
    for task in &dag.tasks {
        let rules = task
            .gate
            .as_ref()
            .map(crate::project::Gate::described_rules)
            .unwrap_or_default();
        if !rules.is_empty() {
            out.line(&format!(
                "rules of task `{}`: {}",
                task.id,
                rules.join("; ")
            ))?;
        }
    }
    let e = o.estimate;
    let rate = match (&e.rate, to_run) {
        (Some((pool, rate, floor)), 1..) if *floor > 0.0 => format!(
            "; the rate of pool `{pool}` ({rate}) alone takes {}",
            about(*floor)
        ),
        _ => String::new(),
    };
    out.line(&match (e.seconds, to_run) {
        (_, 0) => "estimate: nothing to run".to_string(),
        (Some(s), _) => format!(
            "estimate: {} at up to {} at a time (median durations of {} recent successful tries){rate}",
            about(s),
            e.lanes,
            e.tries
        ),
        (None, _) => format!(
            "estimate: none yet ({} never succeeded; each task's median duration comes from its recent successful tries){rate}",
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
    let s = seconds.round().max(0.0) as u64;
    match s {
        0 => "under a second".to_string(),
        1..60 => format!("about {s}s"),
        60..3600 => format!("about {}m {}s", s / 60, s % 60),
        _ => format!("about {}h {}m", s / 3600, (s % 3600) / 60),
    }
}
