//! `backfill join ID`: this process helps run a live backfill's remaining intervals beside its
//! owner, on this host or another that shares the manifest.
//!
//! A worker claims each interval in the commit that starts its run (the interval's lease names
//! the run, so no two processes start it), and that commit counts the backfill's runs in flight
//! against its `max_active_runs`, across every process. The worker holds a lease of its own;
//! once it is gone (killed, frozen past its lease, cut off), the owner recovers its runs and
//! runs their intervals again (see [`refill`]). A worker stops when the backfill stops running:
//! cancelled, finished, or taken over and ended.

use std::sync::Arc;
use std::time::Instant;

use super::Global;
use super::execute::{Execution, execute};
use super::find_backfill;
use crate::exit::{self, Error};
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Owner};
use crate::project::Project;
use crate::recovery::{self, Dags};
use crate::runner::{Left, Refill, Stats};
use crate::state::BackfillState;

/// Joins backfill `id` as a worker, with at most `max_active_runs` (default: the backfill's)
/// of its intervals in flight in this process.
pub fn join(g: &Global, id: i64, max_active_runs: Option<u32>) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL).at_manifest(&*conn)?;
    joinable(&backfill, &ctx)?;
    let dag = match (&backfill.tasks, backfill.kind) {
        (Some(tasks), crate::state::BackfillKind::Run | crate::state::BackfillKind::Stage) => {
            super::launch::only_tasks(project.dag(&backfill.dag_id)?, tasks)?
        }
        _ => project.dag(&backfill.dag_id)?,
    };
    if dag.depends_on_past {
        return Err(Error::Usage(format!(
            "backfill {id}: DAG `{}` has depends_on_past = true, so its intervals run one at a time, in order; another process cannot help it",
            dag.id
        )));
    }
    let mut intervals = conn
        .unfinished_intervals(id)
        .map_err(|e| e.at(&manifest_path))?;
    drop(conn);
    let conf = backfill.conf_json()?;
    let mut window = intervals.clone();
    window.sort_unstable();
    let reprs = super::launch::check_tasks(&dag, &conf, &window)?;
    let max = max_active_runs.unwrap_or(backfill.max_active_runs);
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
        eprintln!(
            "joined backfill {id} of {} as worker {}: {} left to run, at most {max} at once here",
            dag.id,
            owner.worker.unwrap_or_default(),
            crate::report::out::plural(intervals.len() as i64, "interval", "intervals")
        );
    }
    let upstream = super::launch::upstream_dags(&project, &dag, backfill.cascade_of.is_some());
    execute(
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
        },
        writer,
    )
}

/// Whether a backfill can be joined: running, its owner alive.
fn joinable(b: &manifest::Backfill, ctx: &LeaseCtx) -> Result<(), Error> {
    let id = b.id;
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

/// For the owner of backfill `owner`: what is left once its own queue ran dry. Nothing, unless
/// workers joined it; then the gone workers are recovered, their intervals leased again and
/// returned to run, and while a live worker still runs an interval the owner waits for it
/// (the backfill's outcome is judged on every interval's end).
pub fn refill(project: &Project, dag_id: &str, writer: &Writer, owner: Owner) -> Refill {
    let dags = Arc::new(Dags::of(project));
    let (writer, dag_id) = (writer.clone(), dag_id.to_string());
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
    let id = owner.backfill_id;
    Arc::new(move |more| {
        if !writer.call_blocking(move |c| c.has_workers(id))? {
            return Ok(Left::Done);
        }
        let report = recovery::recover_workers(&writer, &dags, id, &ctx.refreshed())?;
        for w in &report.warnings {
            tracing::warn!(backfill = id, "{w}");
        }
        let (dag_id, c) = (dag_id.clone(), ctx.refreshed());
        let (free, waiting) = writer.call_blocking(move |conn| {
            let free = if more {
                recovery::lease_remaining(conn, owner, &dag_id, &c)?
            } else {
                Vec::new()
            };
            Ok((free, !conn.worker_starts_in_flight(id)?.is_empty()))
        })?;
        Ok(if !free.is_empty() {
            Left::Run(free)
        } else if waiting {
            Left::Wait
        } else {
            Left::Done
        })
    })
}

/// How a worker ended: its state and exit code (its own intervals: the backfill's outcome is
/// its owner's to judge), recorded and said.
pub(super) fn finish_worker(
    g: &Global,
    writer: &Writer,
    owner: Owner,
    stats: Stats,
    stopped: bool,
    began: Instant,
) -> Result<(u8, BackfillState, String), Error> {
    let (mut state, mut code) = if stopped {
        (BackfillState::Cancelled, exit::INTERRUPTED)
    } else if stats.failed + stats.rejected > 0 {
        (BackfillState::Failed, exit::FAILED)
    } else {
        (BackfillState::Completed, exit::OK)
    };
    let recorded =
        writer.call_blocking(move |c| c.finish_backfill(owner, state, crate::clock::now_ms()));
    match recorded {
        Ok(()) => {}
        // Its lease was taken away (frozen or cut off): the owner recovered its runs.
        Err(manifest::Error::Fenced { .. }) => {
            (state, code) = (BackfillState::Cancelled, exit::INTERRUPTED);
        }
        Err(e) => return Err(e.into()),
    }
    let summary = serde_json::json!({
        "backfill_id": owner.backfill_id,
        "worker": owner.worker,
        "host": crate::liveness::Host::name(&crate::process::LOCAL),
        "state": state.as_str(),
        "exit_code": code,
        "intervals": {
            "succeeded": stats.succeeded,
            "failed": stats.failed,
            "rejected": stats.rejected,
            "cancelled": stats.cancelled,
        },
        "elapsed_seconds": began.elapsed().as_secs_f64(),
    });
    if g.json {
        match crate::report::out::json(&summary) {
            Ok(()) | Err(Error::ClosedPipe) => {}
            Err(e) => return Err(e),
        }
    } else if !g.quiet {
        let ran = stats.succeeded + stats.failed + stats.rejected + stats.cancelled;
        eprintln!(
            "worker {} of backfill {} {}: ran {} here ({} succeeded, {} failed, {} rejected, {} cancelled); `{}` tells how the backfill goes",
            owner.worker.unwrap_or_default(),
            owner.backfill_id,
            state.as_str(),
            crate::report::out::plural(ran as i64, "interval", "intervals"),
            stats.succeeded,
            stats.failed,
            stats.rejected,
            stats.cancelled,
            crate::report::out::hint(&format!("show {}", owner.backfill_id))
        );
    }
    Ok((code, state, summary.to_string()))
}
