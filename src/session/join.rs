//! `backfill join ID`: this process helps run a live backfill's remaining intervals beside its
//! owner, on this host or another that shares the manifest.
//!
//! A worker claims each interval in the commit that starts its run (the interval's lease names
//! the run, so no two processes start it), and that commit counts the backfill's runs in flight
//! against its `max_active_runs`, across every process. The worker holds a lease of its own;
//! once it is gone (killed, frozen past its lease, cut off), the owner recovers its runs and
//! runs their intervals again (see `worker::refill`). A worker stops when the backfill stops
//! running: cancelled, finished, or taken over and ended; once its own queue ran dry it waits
//! for that (see `worker::linger`).
//!
//! The other way round, a worker watches its owner: when the owner is gone (by the manifest's
//! lease rule and clock, as `resume` judges it), the worker takes the whole backfill over and
//! finishes it as its owner, or, for a backfill `resume` must continue (a cascade's, or one
//! whose plan was still being written), says so, ends its runs in flight and exits 130 for
//! `resume`. The decision and its reasons are in `succession`.

use super::Global;
use super::execute::{Execution, execute};
use super::find_backfill;
use crate::exit::Error;
use crate::manifest;
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::state::BackfillState;

/// Joins backfill `id` as a worker, with at most `max_active_runs` (default: the backfill's)
/// of its intervals in flight in this process.
pub(crate) fn join(g: &Global, id: i64, max_active_runs: Option<u32>) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    super::belonging::check_backfill(&project, &manifest_path, &backfill, "join")?;
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL).at_manifest(&*conn)?;
    joinable(&backfill, &ctx)?;
    let mut dag = match (&backfill.tasks, backfill.kind) {
        (Some(tasks), crate::state::BackfillKind::Run | crate::state::BackfillKind::Stage) => {
            super::tasks::only_tasks(project.dag(&backfill.dag_id)?, tasks)?
        }
        _ => project.dag(&backfill.dag_id)?,
    };
    super::tasks::keep_batch_size(g, &mut dag, &backfill);
    if dag.depends_on_past {
        return Err(Error::Usage(format!(
            "backfill {id}: DAG `{}` has depends_on_past = true, so its intervals run one at a time, in order; another process cannot help it",
            dag.id
        )));
    }
    // A worker runs what the owner runs: the same definition of the DAG.
    match super::tasks::definition_changes(backfill.definition.as_deref(), &dag) {
        Some(changes) if !changes.is_empty() => {
            return Err(Error::Usage(format!(
                "backfill {id}: DAG `{}` in {} is not the definition the backfill runs ({}); join from a checkout with the backfill's definition, or let it finish and create a new backfill",
                dag.id,
                dag.file,
                changes.join(", ")
            )));
        }
        Some(_) => {}
        None => super::note(
            g,
            &format!(
                "backfill {id} recorded no definition of its DAG (it is older than that record): this worker cannot check that it runs the same one"
            ),
        ),
    }
    let mut intervals = conn
        .unfinished_intervals(id)
        .map_err(|e| e.at(&manifest_path))?;
    drop(conn);
    let conf = backfill.conf_json()?;
    let mut window = intervals.clone();
    window.sort_unstable();
    let max = max_active_runs.unwrap_or(backfill.max_active_runs);
    crate::limits::room_for_runs(max, Some("--max-active-runs"))?;
    let reprs = super::tasks::check_tasks(&dag, &conf, &window)?;
    let writer = Writer::open(&manifest_path, project.durability)?;
    let c = ctx.refreshed();
    let joined = writer.call_blocking(move |conn| {
        // Judged again in the commit that joins: the owner may have ended meanwhile.
        let Some(b) = conn.backfill(id)? else {
            return Ok(Err(format!("backfill {id} vanished from the manifest")));
        };
        let c = c.clone().at_manifest(conn)?;
        if let Err(why) = joinable(&b, &c) {
            return Ok(Err(why.to_string()));
        }
        // Intervals that runs in flight hold are not this worker's to start.
        let busy = conn.starts_in_progress(id)?;
        Ok(Ok((conn.join_backfill(id, max, &c)?, busy)))
    });
    let (owner, busy) = match joined {
        Ok(Ok(joined)) => joined,
        Ok(Err(why)) => {
            writer.close();
            return Err(Error::Usage(why));
        }
        Err(e) => {
            writer.close();
            return Err(e.into());
        }
    };
    intervals.retain(|i| !busy.contains(&i.start.timestamp()));
    if !g.quiet && !g.json {
        crate::report::out::say(&format!(
            "joined backfill {id} of {} as worker {}: {} left to run, at most {max} at once here",
            dag.id,
            owner.worker.unwrap_or_default(),
            crate::report::out::plural(intervals.len() as i64, "interval", "intervals")
        ));
    }
    let upstream = super::tasks::upstream_dags(&project, &dag, backfill.cascade_of.is_some());
    let code = execute(
        g,
        &project,
        Execution {
            owner,
            dag,
            conf,
            max_active_runs: max,
            intervals,
            allow_drift: backfill.allow_drift,
            reprs,
            max_failures: backfill.max_failures,
            tasks: backfill.tasks.clone(),
            mode: super::staged::mode_of(&backfill, &manifest_path)?,
            upstream,
            created: None,
            ready: super::execute::Readiness::of(&backfill),
        },
        writer,
    )?;
    // A promote's staged backfill is complete once nothing of it awaits promotion, as at the
    // end of the promote's owner (which this worker may have become).
    if let (crate::state::BackfillKind::Promote, Some(source)) =
        (backfill.kind, backfill.source_backfill)
    {
        super::staged::settle_staged(&manifest_path, &project, source)?;
    }
    Ok(code)
}

/// Whether a backfill can be joined: running, its owner alive.
fn joinable(b: &manifest::Backfill, ctx: &LeaseCtx) -> Result<(), Error> {
    let id = b.id;
    if b.atomic {
        return Err(Error::Usage(format!(
            "backfill {id} is a `promote --atomic`, which one process publishes in one transaction; it cannot be joined"
        )));
    }
    if b.state != BackfillState::Running {
        return Err(Error::Usage(format!(
            "backfill {id} is not running (it is {}); only a running backfill can be joined{}",
            b.state.as_str(),
            if b.state == BackfillState::Cancelled || b.state == BackfillState::Failed {
                format!(
                    "; `{}` runs what is left",
                    crate::report::out::hint(&format!("resume {id}"))
                )
            } else {
                String::new()
            }
        )));
    }
    if !b.owner_alive(ctx) {
        return Err(Error::Usage(format!(
            "the process of backfill {id} is gone; `{}` takes it over, and can then be joined",
            crate::report::out::hint(&format!("resume {id}"))
        )));
    }
    Ok(())
}
