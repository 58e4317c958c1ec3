//! Looking at an interval's source again, outside any try: `--reprocess-behavior changed` and
//! `backfill stale` compare what a task's gate `source_count` and `source_fingerprint` give now
//! with what they gave when the interval's latest run succeeded (recorded with its tries).
//!
//! A task whose gate has neither cannot tell and counts as unchanged. A task that has one but
//! whose recorded try lacks the value (it ran before the key was added) counts as changed:
//! rerunning is the only way to know.
//!
//! An interval runs again when any of its tasks sees a change, and only a `source_fingerprint`
//! can see every late, removed or corrected row: a `source_count` is the number of rows the
//! output should have, which a corrected row never changes and a new row in a group the output
//! already has (one row per region) does not either. [`blind_spot`] says when a DAG has no
//! fingerprint, so that a nightly `changed` cannot silently miss late data.

use std::path::Path;
use std::time::Duration;

use crate::interval::DataInterval;
pub(crate) use crate::manifest::queries::{Recorded, Seen};
use crate::project::{Dag, Gate, SourceCount, Task, TaskKind};
use crate::task::command;
use crate::task::template::IntervalValues;
use crate::warehouse::Binds;

/// How long a probe command may take when its task sets no `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The tasks of `dag` that can tell whether a source changed, and those that cannot.
pub(crate) fn watchers(dag: &Dag) -> (Vec<&Task>, Vec<&Task>) {
    dag.tasks
        .iter()
        .partition(|t| t.gate.as_ref().is_some_and(Gate::watches_source))
}

/// What `changed` and `stale` cannot see in a DAG whose tasks have no `source_fingerprint`.
#[derive(Debug, Clone)]
pub(crate) enum BlindSpot<'a> {
    /// No task has a `source_count` or a `source_fingerprint`: nothing can tell.
    Everything,
    /// These tasks watch their source through a `source_count` alone.
    CountsOnly(Vec<&'a Task>),
}

/// What `changed` and `stale` cannot see in `dag`'s sources: `None` when a task of it has a
/// `source_fingerprint`.
pub(crate) fn blind_spot(dag: &Dag) -> Option<BlindSpot<'_>> {
    let gates = || dag.tasks.iter().filter_map(|t| Some((t, t.gate.as_ref()?)));
    if gates().any(|(_, g)| g.source_fingerprint.is_some()) {
        return None;
    }
    let counted: Vec<&Task> = gates()
        .filter(|(_, g)| g.source_count.is_some())
        .map(|(t, _)| t)
        .collect();
    Some(if counted.is_empty() {
        BlindSpot::Everything
    } else {
        BlindSpot::CountsOnly(counted)
    })
}

impl BlindSpot<'_> {
    /// The warning of `changed` and `stale` for `dag`.
    pub(crate) fn warning(&self, dag: &Dag) -> String {
        match self {
            Self::Everything => format!(
                "no task of DAG `{}` has a gate `source_count` or `source_fingerprint`, so nothing can tell whether a source changed: late or corrected rows go unnoticed, intervals that succeeded count as unchanged and only failed ones run; give the task that reads the source a `source_fingerprint`",
                dag.id
            ),
            Self::CountsOnly(tasks) => format!(
                "DAG `{}` watches its source only through the gate `source_count` of {}, which {}; {}",
                dag.id,
                tasks
                    .iter()
                    .map(|t| format!(
                        "`{}` ({})",
                        t.id,
                        t.locations.source_count.as_deref().unwrap_or(&dag.file)
                    ))
                    .collect::<Vec<_>>()
                    .join(", "),
                COUNT_MISSES,
                FINGERPRINT_FIX
            ),
        }
    }

    /// The warnings of `dags validate` for `dag`, each with where it is written: only for a
    /// DAG that watches its source through counts alone (one that watches nothing makes no
    /// claim until `changed` or `stale` is asked).
    pub(crate) fn validate_warnings(&self) -> Vec<(String, String)> {
        let Self::CountsOnly(tasks) = self else {
            return Vec::new();
        };
        tasks
            .iter()
            .map(|t| {
                (
                    t.locations.source_count.clone().unwrap_or_default(),
                    format!(
                        "task `{}`: `--reprocess-behavior changed` and `backfill stale` see this source only through `source_count`, which {}; {}",
                        t.id, COUNT_MISSES, FINGERPRINT_FIX
                    ),
                )
            })
            .collect()
    }
}

/// The note for a DAG where some tasks cannot tell, while another has a `source_fingerprint`:
/// a change the watching tasks see reruns the whole interval.
pub(crate) fn partly_blind(watching: &[&Task], blind: &[&Task]) -> String {
    let names = |tasks: &[&Task]| {
        tasks
            .iter()
            .map(|t| format!("`{}`", t.id))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{} {} no gate `source_count` or `source_fingerprint`: only the sources of {} are compared",
        names(blind),
        if blind.len() == 1 { "has" } else { "have" },
        names(watching)
    )
}

/// What a count alone misses.
const COUNT_MISSES: &str = "sees a late or removed row only when it changes that count (a count of groups, such as `COUNT(DISTINCT region)`, does not change when a row arrives) and never sees a corrected row";

/// What to do about it.
const FINGERPRINT_FIX: &str = "add a gate `source_fingerprint` that changes with every row, such as `SELECT COUNT(*) || '/' || SUM(amount) FROM ...` over the rows the task reads";

/// Why the source differs from what was recorded, or `None` when it does not.
pub(crate) fn changed(gate: &Gate, recorded: &Seen, now: &Seen) -> Option<String> {
    let mut why = Vec::new();
    if gate.source_count.is_some() && recorded.source_rows != now.source_rows {
        why.push(format!(
            "source_count {} -> {}",
            show(recorded.source_rows.map(|n| n.to_string())),
            show(now.source_rows.map(|n| n.to_string()))
        ));
    }
    if gate.source_fingerprint.is_some() && recorded.source_fingerprint != now.source_fingerprint {
        why.push(format!(
            "source_fingerprint {} -> {}",
            show(recorded.source_fingerprint.clone()),
            show(now.source_fingerprint.clone())
        ));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

fn show(v: Option<String>) -> String {
    v.unwrap_or_else(|| "not recorded".into())
}

/// A task of an interval whose source is not what its latest successful run saw.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Stale {
    pub interval: crate::interval::IntervalDoc,
    pub task: String,
    pub recorded: Seen,
    /// `None` when the source could not be looked at.
    pub now: Option<Seen>,
    pub why: String,
}

/// Looks at the source of every recorded interval for each task that can tell, and returns
/// those whose source changed (or could not be looked at: rerunning is the way to know).
pub(crate) fn survey(
    root: &Path,
    dag: &Dag,
    conf: &serde_json::Value,
    recorded: &Recorded,
) -> Vec<Stale> {
    let (watching, _) = watchers(dag);
    let mut stale = Vec::new();
    for (interval, tasks) in recorded.values() {
        for task in &watching {
            let Some(gate) = &task.gate else { continue };
            let before = tasks.get(&task.id).cloned().unwrap_or_default();
            let (now, why) = match look(root, dag, task, *interval, conf) {
                Ok(now) => match changed(gate, &before, &now) {
                    Some(why) => (Some(now), why),
                    None => continue,
                },
                Err(e) => (None, format!("cannot look at the source: {e}")),
            };
            tracing::info!(dag = %dag.id, task = %task.id, interval = %interval, %why, "source changed");
            stale.push(Stale {
                interval: crate::interval::IntervalDoc::of(*interval),
                task: task.id.clone(),
                recorded: before,
                now,
                why,
            });
        }
    }
    stale
}

/// Evaluates a task's `source_count` and `source_fingerprint` for an interval now.
pub(crate) fn look(
    root: &Path,
    dag: &Dag,
    task: &Task,
    interval: DataInterval,
    conf: &serde_json::Value,
) -> Result<Seen, String> {
    let Some(gate) = &task.gate else {
        return Ok(Seen::default());
    };
    match &task.kind {
        TaskKind::Sql(sql) => {
            let binds = Binds::new(interval, dag.tz);
            let (source_rows, source_fingerprint) = crate::warehouse::backend_of(&sql.warehouse)
                .look(sql, gate, &binds, dag.tz)
                .map_err(|e| e.to_string())?;
            Ok(Seen {
                source_rows,
                source_fingerprint,
            })
        }
        TaskKind::Command(_) => {
            let run = |key: &str, spec: &Option<SourceCount>| -> Result<Option<String>, String> {
                match spec {
                    Some(SourceCount::Command(c)) => {
                        run_command(root, dag, task, c, interval, conf, key).map(Some)
                    }
                    _ => Ok(None),
                }
            };
            let rows = run("source_count", &gate.source_count)?
                .map(|text| {
                    text.parse::<i64>().map_err(|_| {
                        format!(
                            "source_count command printed `{}`, not one integer",
                            text.chars().take(200).collect::<String>()
                        )
                    })
                })
                .transpose()?;
            Ok(Seen {
                source_rows: rows,
                source_fingerprint: run("source_fingerprint", &gate.source_fingerprint)?,
            })
        }
    }
}

/// Runs a probe command with the interval's environment in the project folder; returns what
/// it printed on stdout, trimmed. Stopped after the task's timeout like a try: SIGTERM to its
/// process group, SIGKILL after the task's grace period.
fn run_command(
    root: &Path,
    dag: &Dag,
    task: &Task,
    spec: &crate::project::CommandSpec,
    interval: DataInterval,
    conf: &serde_json::Value,
    key: &str,
) -> Result<String, String> {
    use crate::process::{self, Ended, Input, Output};
    let values = IntervalValues::new(interval, dag.tz);
    let ctx = values.context(&dag.id, &task.id, "0", 0, conf);
    let program = command::render(spec, &ctx).map_err(|e| format!("{key}: {e}"))?;
    let env = command::environment(&ctx, &conf.to_string(), Path::new("/dev/null"));
    let timeout = task.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("{key} command: cannot start the async runtime: {e}"))?;
    // Nothing stops a probe but its timeout.
    let (_no_stop, mut stop) = tokio::sync::watch::channel(process::Stop::Run);
    let finished = runtime.block_on(async {
        let spawned = process::start(process::Command {
            program: &program,
            env: &env,
            cwd: root,
            input: Input::Null,
            output: Output::Capture,
        })
        .await
        .map_err(|e| {
            format!(
                "{key} command: cannot start `{}`: {}",
                program.name(),
                crate::limits::io(&e)
            )
        })?;
        process::finish(spawned, Some(timeout), task.grace_period, &mut stop)
            .await
            .map_err(|e| format!("{key} command: {e}"))
    })?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_string();
    match finished.ended {
        Ended::Exited(status) if status.success() => Ok(text(&finished.stdout)),
        Ended::Exited(status) => Err(format!(
            "{key} command failed ({}): {}",
            process::describe_exit(status),
            text(&finished.stderr).chars().take(300).collect::<String>()
        )),
        Ended::TimedOut | Ended::Cancelled => Err(format!(
            "{key} command timed out after {}",
            humantime::format_duration(timeout)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(count: bool, fingerprint: bool) -> Gate {
        Gate {
            unique_key: Vec::new(),
            unique_key_table: false,
            max_changed: None,
            source_count: count.then(|| SourceCount::Sql("SELECT 1".into())),
            source_fingerprint: fingerprint.then(|| SourceCount::Sql("SELECT 1".into())),
            tolerance: 0.0,
            allow_empty: false,
            rules: Vec::new(),
            history: None,
        }
    }

    fn seen(rows: Option<i64>, fp: Option<&str>) -> Seen {
        Seen {
            source_rows: rows,
            source_fingerprint: fp.map(String::from),
        }
    }

    #[test]
    fn only_what_the_gate_watches_is_compared() {
        let before = seen(Some(10), Some("a"));
        assert_eq!(changed(&gate(true, true), &before, &before), None);
        assert_eq!(
            changed(&gate(true, false), &before, &seen(Some(11), Some("b"))).as_deref(),
            Some("source_count 10 -> 11")
        );
        assert_eq!(
            changed(&gate(false, true), &before, &seen(Some(11), Some("b"))).as_deref(),
            Some("source_fingerprint a -> b")
        );
        assert_eq!(
            changed(&gate(false, true), &before, &seen(Some(11), Some("a"))),
            None
        );
        // A value that was never recorded cannot be shown to be unchanged.
        assert_eq!(
            changed(&gate(true, false), &seen(None, None), &seen(Some(3), None)).as_deref(),
            Some("source_count not recorded -> 3")
        );
    }
}
