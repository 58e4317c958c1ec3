//! `create --cascade`: after the backfill of a DAG, one backfill per DAG downstream of it, one
//! DAG after the other, each planned from what its upstream backfills of the cascade did. A
//! downstream backfill is an ordinary backfill (leases, heartbeat, gate, `resume`, `cancel`)
//! that names the cascade's first backfill (`cascade_of`); `resume` of any of them continues
//! the cascade.

use std::collections::{HashMap, HashSet};

use super::chain::{all_dags, plan_member, worst};
use super::launch::{Launch, launch, request_over, run_every};
use super::tasks::check_tasks;
use super::{Global, note};
use crate::cascade::{self, Mode};
use crate::exit::{self, Error};
use crate::manifest::{self, NewBackfill};
use crate::project::Project;
use crate::state::{BackfillKind, BackfillState};

/// Runs the cascade's downstream DAGs that have not run yet (and resumes an interrupted one),
/// after its first backfill `root` ended. Goes past a backfill only once every interval it
/// planned has ended; stops at an interruption.
pub(crate) fn continue_cascade(
    g: &Global,
    project: &Project,
    root: i64,
    root_dag: &str,
    mode: Mode,
) -> Result<u8, Error> {
    let dags = all_dags(project)?;
    let chain = cascade::downstream(&dags, root_dag);
    let path = g.manifest_path(Some(project))?;
    let conn = manifest::open_read_only(&path)?;
    let Some(first) = conn.backfill(root).map_err(|e| e.at(&path))? else {
        return Err(Error::Internal(format!("cascade backfill {root} vanished")));
    };
    let done = conn.cascade_members(root).map_err(|e| e.at(&path))?;
    drop(conn);
    let mut backfill_of: HashMap<String, i64> = HashMap::from([(root_dag.to_string(), root)]);
    let mut code = exit::OK;
    for &d in &chain {
        if let Some(child) = done.iter().rev().find(|c| c.dag_id == d.id) {
            backfill_of.insert(d.id.clone(), child.id);
            if matches!(
                child.state,
                BackfillState::Running | BackfillState::Cancelled
            ) {
                let c = super::resume::resume_one(g, child.id)?;
                code = worst(code, c);
                if c == exit::INTERRUPTED {
                    return Ok(code);
                }
            }
            continue;
        }
        let conn = manifest::open_read_only(&path)?;
        // An upstream backfill with intervals still to run (stopped by --max-failures, say):
        // the downstream DAGs wait for it.
        for (u, _) in &d.upstream {
            let Some(b) = backfill_of.get(u) else {
                continue;
            };
            let left = conn.unfinished_count(*b).map_err(|e| e.at(&path))?;
            if left > 0 {
                note(
                    g,
                    &format!(
                        "cascade: DAG `{}` waits for backfill {b} of `{u}`, which has {} left; `{}` continues it, then the cascade",
                        d.id,
                        crate::report::out::plural(left, "interval", "intervals"),
                        crate::report::out::hint(&format!("resume {b}"))
                    ),
                );
                return Ok(code);
            }
        }
        let (intervals, skips) = plan_member(&*conn, project, &dags, d, &backfill_of, mode)?;
        drop(conn);
        if intervals.is_empty() {
            note(
                g,
                &format!(
                    "cascade: nothing to run for DAG `{}`: none of its intervals reads what its upstream backfills ran, and those over upstream outputs that already stood have run before",
                    d.id
                ),
            );
            continue;
        }
        let conf = first.conf_json()?;
        let reprs = check_tasks(d, &conf, &intervals)?;
        let request = NewBackfill {
            allow_drift: first.allow_drift,
            max_failures: first.max_failures,
            cascade_of: Some(root),
            ..request_over(
                d,
                &intervals,
                BackfillKind::Run,
                first.conf.clone(),
                d.max_active_runs.unwrap_or(first.max_active_runs),
            )
        };
        let options = run_every(d.depends_on_past)?;
        let (c, id) = launch(
            g,
            project,
            Launch {
                dag: d.clone(),
                conf,
                intervals,
                request,
                options,
                changed: &HashSet::new(),
                upstream: &skips,
                reprs,
                mode: crate::runner::Mode::Run,
            },
        )?;
        if let Some(id) = id {
            backfill_of.insert(d.id.clone(), id);
        }
        code = worst(code, c);
        if c == exit::INTERRUPTED {
            return Ok(code);
        }
    }
    Ok(code)
}

/// After a backfill without `--cascade`: names the DAGs downstream of it, whose partitions
/// may now be stale, and the command that would cascade.
/// `from` and `to` are the range as the user typed it.
pub(crate) fn name_stale_downstream(
    g: &Global,
    project: &Project,
    dag: &str,
    from: &str,
    to: &str,
) {
    let (dags, _) = project.load_all();
    let below: Vec<String> = cascade::downstream(&dags, dag)
        .iter()
        .map(|d| format!("`{}`", d.id))
        .collect();
    if below.is_empty() {
        return;
    }
    let command = crate::report::out::hint(&format!(
        "create --dag {dag} --from {} --to {} --reprocess-behavior completed --cascade changed",
        crate::words::shell_word(from),
        crate::words::shell_word(to)
    ));
    note(
        g,
        &format!(
            "{} downstream of `{dag}` may now be stale over this range; `{command}` backfills {} where what {} read changed",
            below.join(", "),
            if below.len() == 1 { "it" } else { "them" },
            if below.len() == 1 { "it" } else { "they" },
        ),
    );
}
