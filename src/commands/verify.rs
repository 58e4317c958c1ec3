//! `backfill verify`: computes every task of every interval twice, without publishing and
//! without touching the manifest, and compares row counts and order-independent fingerprints.
//! SQL tasks are computed into audit files that are removed right after; command tasks are run
//! with `BACKFILL_VERIFY=1` (never their `publish` command) and compared on the fingerprint of
//! their result file. The two computations of an interval are at least 1.1 s apart, so a task
//! that writes the current time (even with one-second resolution) is caught. A SQL task's
//! output is also judged by the gate's rules on values: one that a rule would reject is
//! reported, and fails the verify, as a difference does.
//!
//! Ctrl-C, SIGTERM or SIGHUP stop it as they stop a backfill: running tasks get SIGTERM (then
//! SIGKILL after their grace period), audit files are removed, and it exits 130.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Rfc3339, expand_nonempty, resolve_args};
use crate::process::{self, Ended, Stop};
use crate::project::{Dag, Project, Task, TaskKind};
use crate::report::Labeler;
use crate::report::grid::Grid;
use crate::report::out::Sink;
use crate::runner::{Step, blocking_step};
use crate::session::Global;
use crate::session::launch::parse_conf;
use crate::session::tasks::check_tasks;
use crate::task::command;
use crate::task::template::IntervalValues;
use crate::warehouse::{self, Binds, Repr, backend};

/// Least time between the two computations of an interval.
const GAP: Duration = Duration::from_millis(1100);

/// One computation of one task for one interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Computed {
    rows: Option<i64>,
    fingerprint: Option<String>,
    /// Why the computation failed.
    error: Option<String>,
    /// The gate's rules that this output breaks (those that would reject it), in their words.
    broken: Vec<String>,
}

impl Computed {
    fn failed(error: String) -> Self {
        Self {
            rows: None,
            fingerprint: None,
            error: Some(error),
            broken: Vec::new(),
        }
    }
}

/// What `verify` concluded about one task and interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Deterministic,
    NotDeterministic,
    /// The task reports no fingerprint: nothing to compare.
    Unverifiable,
    /// A computation failed.
    Failed,
    /// An output breaks a rule of the gate that would reject it.
    Rejected,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Deterministic => "deterministic",
            Self::NotDeterministic => "NOT deterministic",
            Self::Unverifiable => "unverifiable",
            Self::Failed => "failed",
            Self::Rejected => "would be rejected",
        }
    }
}

#[derive(Debug, Serialize)]
struct Check {
    start: Rfc3339,
    end: Rfc3339,
    task_id: String,
    first: Computed,
    second: Computed,
    result: Verdict,
}

pub(crate) fn run(
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
    if intervals.is_empty() {
        return Err(Error::Usage(format!(
            "no complete interval between --from {from} and --to {to}; verify needs intervals that have ended"
        )));
    }
    let reprs = check_tasks(&dag, &conf, &intervals)?;
    let audit_dir = warehouse::audit_dir(&g.manifest_path(Some(&project))?);
    // Verify files that a killed verify left behind (their lock is free) go first.
    warehouse::audit::sweep(&audit_dir, &|t| t.is_some());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let (checks, stopped, fault) = runtime.block_on(async {
        let (stop_tx, stop) = watch::channel(Stop::Run);
        let signals = tokio::spawn(watch_signals(stop_tx));
        let verifier = Verifier {
            project: &project,
            dag: &dag,
            conf: &conf,
            reprs: &reprs,
            audit_dir: &audit_dir,
            fault: std::sync::Mutex::new(None),
        };
        let started = Instant::now();
        let first = verifier.pass(&intervals, 1, stop.clone()).await;
        if let Some(rest) = GAP.checked_sub(started.elapsed()) {
            let mut s = stop.clone();
            tokio::select! {
                () = tokio::time::sleep(rest) => {}
                _ = s.wait_for(|s| *s != Stop::Run) => {}
            }
        }
        let second = verifier.pass(&intervals, 2, stop.clone()).await;
        signals.abort();
        let stopped = *stop.borrow() != Stop::Run;
        let fault = verifier.fault.lock().ok().and_then(|mut f| f.take());
        (judge(&dag, &intervals, first, second), stopped, fault)
    });
    // Stopped by a full disk, or no descriptors or memory: nothing to conclude about the task.
    if let Some(fault) = fault {
        return Err(Error::Environment(fault));
    }
    if stopped {
        crate::report::out::say(
            "verify interrupted; its tasks were stopped and its audit files removed",
        );
        return Ok(exit::INTERRUPTED);
    }
    let mut out = Sink::std(g.json, g.verbose);
    if g.json {
        out.json(&checks)?;
    } else {
        print_checks(&mut out, &dag, &checks)?;
    }
    let mut bad = 0;
    for c in &checks {
        let why = match c.result {
            Verdict::Deterministic => continue,
            Verdict::Unverifiable => {
                if !g.quiet {
                    crate::report::out::say(&format!(
                        "task `{}` for {} is unverifiable: it reports no fingerprint; write {{\"fingerprint\": ...}} to $BACKFILL_RESULT",
                        c.task_id,
                        Labeler::new(&dag).label(c.start.0)
                    ));
                }
                continue;
            }
            Verdict::Failed => format!(
                "a computation failed: {}",
                c.first
                    .error
                    .as_deref()
                    .or(c.second.error.as_deref())
                    .unwrap_or("-")
            ),
            Verdict::Rejected => {
                bad += 1;
                let broken = if c.first.broken.is_empty() {
                    &c.second.broken
                } else {
                    &c.first.broken
                };
                crate::report::out::say(&format!(
                    "task `{}` for interval {} would be rejected by its gate: {}",
                    c.task_id,
                    Labeler::new(&dag).label(c.start.0),
                    broken.join("; ")
                ));
                continue;
            }
            Verdict::NotDeterministic => format!(
                "two computations differ: {} rows ({}) vs {} rows ({})",
                c.first.rows.unwrap_or(0),
                c.first.fingerprint.as_deref().unwrap_or("-"),
                c.second.rows.unwrap_or(0),
                c.second.fingerprint.as_deref().unwrap_or("-")
            ),
        };
        bad += 1;
        crate::report::out::say(&format!(
            "task `{}` is not deterministic for interval {}: {why}",
            c.task_id,
            Labeler::new(&dag).label(c.start.0)
        ));
    }
    if !g.quiet {
        let count = |v: Verdict| checks.iter().filter(|c| c.result == v).count();
        let (unverifiable, rejected) = (count(Verdict::Unverifiable), count(Verdict::Rejected));
        let rejected_words = if rejected > 0 {
            format!(", {rejected} would be rejected")
        } else {
            String::new()
        };
        crate::report::out::say(&format!(
            "verified {} of {}: {} deterministic, {} not, {unverifiable} unverifiable{rejected_words}",
            crate::words::plural(
                i64::try_from(checks.len()).unwrap_or(i64::MAX),
                "task interval",
                "task intervals"
            ),
            dag.id,
            checks.len() - bad - unverifiable,
            bad - rejected,
        ));
    }
    Ok(if bad == 0 { exit::OK } else { exit::FAILED })
}

fn judge(
    dag: &Dag,
    intervals: &[DataInterval],
    first: Vec<Computed>,
    second: Vec<Computed>,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut results = first.into_iter().zip(second);
    for interval in intervals {
        for task in &dag.tasks {
            let Some((a, b)) = results.next() else {
                return checks;
            };
            let result = if a.error.is_some() || b.error.is_some() {
                Verdict::Failed
            } else if a.fingerprint.is_some()
                && b.fingerprint.is_some()
                && (a.rows, &a.fingerprint) != (b.rows, &b.fingerprint)
            {
                Verdict::NotDeterministic
            } else if !a.broken.is_empty() || !b.broken.is_empty() {
                Verdict::Rejected
            } else if a.fingerprint.is_none() || b.fingerprint.is_none() {
                Verdict::Unverifiable
            } else {
                Verdict::Deterministic
            };
            checks.push(Check {
                start: Rfc3339(interval.start),
                end: Rfc3339(interval.end),
                task_id: task.id.clone(),
                first: a,
                second: b,
                result,
            });
        }
    }
    checks
}

fn print_checks(out: &mut Sink<'_>, dag: &Dag, checks: &[Check]) -> Result<(), Error> {
    let labels = Labeler::new(dag);
    let mut t = Grid::new(vec![
        "interval",
        "task",
        "rows",
        "fingerprint",
        "rows (again)",
        "fingerprint (again)",
        "result",
    ])
    .droppable(&["fingerprint (again)", "fingerprint", "rows (again)"]);
    let show = |c: &Computed| match &c.error {
        None => (
            c.rows.map_or(String::new(), |n| n.to_string()),
            c.fingerprint.clone().unwrap_or_default(),
        ),
        Some(_) => ("error".into(), String::new()),
    };
    for c in checks {
        let (r1, f1) = show(&c.first);
        let (r2, f2) = show(&c.second);
        t.row(vec![
            labels.label(c.start.0),
            c.task_id.clone(),
            r1,
            f1,
            r2,
            f2,
            c.result.as_str().to_string(),
        ]);
    }
    out.text(&t.render(out.fit))
}

/// First SIGINT, SIGTERM or SIGHUP: stop gracefully. A second one: kill now.
async fn watch_signals(stop: watch::Sender<Stop>) {
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    loop {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        let hard = *stop.borrow() != Stop::Run;
        let _ = stop.send(if hard { Stop::Kill } else { Stop::Graceful });
    }
}

struct Verifier<'a> {
    project: &'a Project,
    dag: &'a Dag,
    conf: &'a serde_json::Value,
    reprs: &'a std::collections::HashMap<String, Option<Repr>>,
    audit_dir: &'a std::path::Path,
    /// The environment fault that stopped the passes (a full disk, no descriptors or memory):
    /// no computation starts after it.
    fault: std::sync::Mutex<Option<crate::environment::Fault>>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Verifier<'_> {
    async fn pass(
        &self,
        intervals: &[DataInterval],
        n: u32,
        stop: watch::Receiver<Stop>,
    ) -> Vec<Computed> {
        let mut out = Vec::new();
        for interval in intervals {
            for task in &self.dag.tasks {
                let faulted = self.fault.lock().is_ok_and(|f| f.is_some());
                if *stop.borrow() != Stop::Run || faulted {
                    out.push(Computed::failed("interrupted".into()));
                    continue;
                }
                out.push(self.compute(task, *interval, n, stop.clone()).await);
            }
        }
        out
    }

    /// Computes one task for one interval without publishing.
    async fn compute(
        &self,
        task: &Task,
        interval: DataInterval,
        pass: u32,
        mut stop: watch::Receiver<Stop>,
    ) -> Computed {
        match &task.kind {
            TaskKind::Sql(sql) => {
                let binds = Binds::new(interval, self.dag.tz);
                let name = format!(
                    "verify-{}-{}.db",
                    std::process::id(),
                    SEQ.fetch_add(1, Ordering::Relaxed)
                );
                let (dir, s, g) = (self.audit_dir.to_path_buf(), sql.clone(), task.gate.clone());
                let (repr, tz) = (self.reprs.get(&task.id).copied().flatten(), self.dag.tz);
                let step = blocking_step(task.timeout, &mut stop, move |cancel| {
                    // Written and measured as a try would, then dropped: never published.
                    let write = backend::Write {
                        task: &s,
                        gate: g.as_ref(),
                        binds: &binds,
                        tz,
                        repr,
                        audit_path: &dir.join(&name),
                        try_id: 0,
                        manifest: "verify",
                        stage: false,
                        measure_only: true,
                        lease_timeout: crate::project::DEFAULT_LEASE_TIMEOUT,
                    };
                    let output =
                        crate::warehouse::backend_of(&s.warehouse).write(&write, cancel)?;
                    let measures = output.measures().clone();
                    output.remove();
                    Ok(measures)
                })
                .await;
                match step {
                    Step::Done(Ok(m)) => Computed {
                        rows: Some(m.rows),
                        fingerprint: Some(m.fingerprint),
                        error: None,
                        broken: crate::gate::messages(&m.found, crate::gate::Severity::Error),
                    },
                    Step::Done(Err(e)) => {
                        if let (Some(fault), Ok(mut first)) = (e.environment(), self.fault.lock()) {
                            first.get_or_insert_with(|| fault.clone());
                        }
                        Computed::failed(e.to_string())
                    }
                    Step::TimedOut(_) => Computed::failed("timed out".into()),
                    Step::Cancelled(_) => Computed::failed("interrupted".into()),
                }
            }
            TaskKind::Command(spec) => {
                match self.command(task, spec, interval, pass, &mut stop).await {
                    Ok(c) => c,
                    Err(e) => Computed::failed(e),
                }
            }
        }
    }

    async fn command(
        &self,
        task: &Task,
        spec: &crate::project::CommandSpec,
        interval: DataInterval,
        pass: u32,
        stop: &mut watch::Receiver<Stop>,
    ) -> Result<Computed, String> {
        let values = IntervalValues::new(interval, self.dag.tz);
        let ctx = values.context(&self.dag.id, &task.id, "verify", pass, self.conf);
        let program = command::render(spec, &ctx)?;
        let dir = self
            .project
            .logs_dir
            .join(&self.dag.id)
            .join("verify")
            .join(interval.start.format("%Y%m%dT%H%M%SZ").to_string());
        let log = dir.join(format!("{}.pass{pass}.log", task.id));
        let result_path = dir.join(format!("{}.pass{pass}.result.json", task.id));
        process::private_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let _ = std::fs::remove_file(&result_path);
        let mut env = command::environment(&ctx, &self.conf.to_string(), &result_path);
        env.push(("BACKFILL_VERIFY".into(), "1".into()));
        let spawned = process::spawn(
            &program,
            &env,
            &self.project.root,
            process::Output::Log(log.clone()),
        )
        .await
        .map_err(|e| {
            format!(
                "cannot start `{}`: {}",
                program.name(),
                crate::limits::io(&e)
            )
        })?
        .release()
        .await
        .map_err(|e| {
            format!(
                "cannot start `{}`: {}",
                program.name(),
                crate::limits::io(&e)
            )
        })?;
        match process::supervise(spawned, task.timeout, task.grace_period, stop).await {
            Ok(Ended::Exited(status)) if status.success() => {}
            Ok(Ended::Exited(status)) => return Err(process::describe_exit(status)),
            Ok(Ended::TimedOut) => return Err("timed out".into()),
            Ok(Ended::Cancelled) => return Err("interrupted".into()),
            Err(e) => return Err(e.to_string()),
        }
        let result = command::read_result(&result_path)?.unwrap_or_default();
        Ok(Computed {
            rows: result.rows,
            fingerprint: result.fingerprint,
            error: None,
            broken: Vec::new(),
        })
    }
}
