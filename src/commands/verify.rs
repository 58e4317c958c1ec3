//! `backfill verify`: computes every task of every interval twice, without publishing and
//! without touching the manifest, and compares row counts and order-independent fingerprints.
//! SQL tasks are computed into audit tables; command tasks are run with `BACKFILL_VERIFY=1` and
//! compared on the fingerprint of their result file. The two computations of an interval are at
//! least 1.1 s apart, so a task that writes the current time (even with one-second resolution)
//! is caught.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use super::Global;
use super::create::{check_tasks, parse_conf};
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Rfc3339, expand_nonempty, resolve_args};
use crate::project::{Dag, Project, Task, TaskKind};
use crate::report::{label, tables};
use crate::task::command::{self, Ended, Stop};
use crate::task::template::IntervalValues;
use crate::warehouse::{self, Binds};

/// Least time between the two computations of an interval.
const GAP: Duration = Duration::from_millis(1100);

/// One computation of one task for one interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Computed {
    rows: Option<i64>,
    fingerprint: Option<String>,
}

#[derive(Debug, Serialize)]
struct Check {
    start: Rfc3339,
    end: Rfc3339,
    task_id: String,
    first: Result<Computed, String>,
    second: Result<Computed, String>,
    deterministic: bool,
}

pub fn run(
    g: &Global,
    dag_id: &str,
    from: &str,
    to: &str,
    conf: Option<&str>,
) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id)?;
    let conf = parse_conf(conf)?;
    let now = clock::now()?;
    let range = resolve_args(from, to, now, dag.tz)?;
    let intervals: Vec<DataInterval> = expand_nonempty(&dag.schedule, range, from, to)?
        .into_iter()
        .filter(|i| i.end <= now)
        .collect();
    let Some(first) = intervals.first() else {
        return Err(Error::Usage(format!(
            "no complete interval between --from {from} and --to {to}; verify needs intervals that have ended"
        )));
    };
    check_tasks(&dag, &conf, *first)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(e.into()))?;
    let started = Instant::now();
    let pass = |n: u32| -> Vec<Result<Computed, String>> {
        let mut out = Vec::new();
        for interval in &intervals {
            for task in &dag.tasks {
                out.push(runtime.block_on(compute(&project, &dag, task, *interval, &conf, n)));
            }
        }
        out
    };
    let first_pass = pass(1);
    if let Some(rest) = GAP.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    let second_pass = pass(2);
    let mut checks = Vec::new();
    let mut results = first_pass.into_iter().zip(second_pass);
    for interval in &intervals {
        for task in &dag.tasks {
            let Some((a, b)) = results.next() else { break };
            let deterministic =
                matches!((&a, &b), (Ok(x), Ok(y)) if x == y && x.fingerprint.is_some());
            checks.push(Check {
                start: Rfc3339(interval.start),
                end: Rfc3339(interval.end),
                task_id: task.id.clone(),
                first: a,
                second: b,
                deterministic,
            });
        }
    }
    let bad: Vec<&Check> = checks.iter().filter(|c| !c.deterministic).collect();
    if g.json {
        tables::print_json(&checks);
    } else {
        print_checks(&dag, &checks);
    }
    for c in &bad {
        let why = match (&c.first, &c.second) {
            (Err(e), _) | (_, Err(e)) => format!("it failed: {e}"),
            (Ok(a), _) if a.fingerprint.is_none() => {
                "it reports no fingerprint; write {\"fingerprint\": ...} to $BACKFILL_RESULT"
                    .to_string()
            }
            (Ok(a), Ok(b)) => format!(
                "two computations differ: {} rows ({}) vs {} rows ({})",
                a.rows.unwrap_or(0),
                a.fingerprint.as_deref().unwrap_or("-"),
                b.rows.unwrap_or(0),
                b.fingerprint.as_deref().unwrap_or("-")
            ),
        };
        eprintln!(
            "task `{}` is not deterministic for interval {}: {why}",
            c.task_id, c.start
        );
    }
    eprintln!(
        "verified {} task intervals of {}: {} deterministic, {} not",
        checks.len(),
        dag.id,
        checks.len() - bad.len(),
        bad.len()
    );
    Ok(if bad.is_empty() {
        exit::OK
    } else {
        exit::FAILED
    })
}

fn print_checks(dag: &Dag, checks: &[Check]) {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "interval",
        "task",
        "rows",
        "fingerprint",
        "rows (again)",
        "fingerprint (again)",
        "result",
    ]);
    let show = |r: &Result<Computed, String>| match r {
        Ok(c) => (
            c.rows.map_or("-".into(), |n| n.to_string()),
            c.fingerprint.clone().unwrap_or_else(|| "-".into()),
        ),
        Err(_) => ("error".into(), "-".into()),
    };
    for c in checks {
        let (r1, f1) = show(&c.first);
        let (r2, f2) = show(&c.second);
        t.add_row(vec![
            label(c.start.0, dag.tz),
            c.task_id.clone(),
            r1,
            f1,
            r2,
            f2,
            if c.deterministic {
                "deterministic"
            } else {
                "NOT deterministic"
            }
            .to_string(),
        ]);
    }
    eprintln!("{t}");
}

/// Computes one task for one interval without publishing.
async fn compute(
    project: &Project,
    dag: &Dag,
    task: &Task,
    interval: DataInterval,
    conf: &serde_json::Value,
    pass: u32,
) -> Result<Computed, String> {
    match &task.kind {
        TaskKind::Sql(sql) => {
            let binds = Binds::new(interval, dag.tz);
            let audit = format!(
                "_backfill_verify_{}_{}_{}_{pass}",
                sql.target,
                std::process::id(),
                interval.start.timestamp()
            );
            let result = (|| {
                let conn = warehouse::open(&sql.warehouse)?;
                warehouse::write_audit(&conn, sql, &audit, &binds, None)?;
                let fingerprint = warehouse::fingerprint(&conn, &audit);
                warehouse::drop_audit(&conn, &audit)?;
                fingerprint
            })();
            result
                .map(|(rows, fingerprint)| Computed {
                    rows: Some(rows),
                    fingerprint: Some(fingerprint),
                })
                .map_err(|e| format!("{e:#}"))
        }
        TaskKind::Command(spec) => {
            let values = IntervalValues::new(interval, dag.tz);
            let ctx = values.context(&dag.id, &task.id, "verify", pass, conf);
            let argv = command::render(spec, &ctx)?;
            let dir = project
                .logs_dir
                .join(&dag.id)
                .join("verify")
                .join(interval.start.format("%Y%m%dT%H%M%SZ").to_string());
            let log = dir.join(format!("{}.pass{pass}.log", task.id));
            let result_path = dir.join(format!("{}.pass{pass}.result.json", task.id));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let _ = std::fs::remove_file(&result_path);
            let mut env = command::environment(&ctx, &conf.to_string(), &result_path);
            env.push(("BACKFILL_VERIFY".into(), "1".into()));
            let spawned = command::spawn(&argv, &env, &project.root, &log)
                .map_err(|e| format!("cannot start `{}`: {e}", argv[0]))?;
            let (_keep, mut stop) = watch::channel(Stop::Run);
            match command::supervise(spawned, task.timeout, task.grace_period, &mut stop).await {
                Ok(Ended::Exited(status)) if status.success() => {}
                Ok(Ended::Exited(status)) => return Err(command::describe_exit(status)),
                Ok(Ended::TimedOut) => return Err("timed out".into()),
                Ok(Ended::Cancelled) => return Err("cancelled".into()),
                Err(e) => return Err(e.to_string()),
            }
            let result = command::read_result(&result_path)?.unwrap_or_default();
            Ok(Computed {
                rows: result.rows,
                fingerprint: result.fingerprint,
            })
        }
    }
}
