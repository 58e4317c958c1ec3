//! What the processes of one backfill share at their ends: the owner's refill once its own
//! queue ran dry (its workers' intervals, recovered or waited for), a worker's wait for the
//! backfill's end once its own queue ran dry, and how a worker ends. `execute` runs them;
//! `join` starts the workers.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::Global;
use crate::exit::{self, Error};
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Owner};
use crate::project::Project;
use crate::recovery::{self, Dags};
use crate::runner::{Left, Refill, Stats};
use crate::state::BackfillState;

/// For the owner of backfill `owner`: what is left once its own queue ran dry. Nothing, unless
/// workers joined it; then the gone workers are recovered, their intervals leased again and
/// returned to run, and while a live worker still runs an interval the owner waits for it
/// (the backfill's outcome is judged on every interval's end).
pub(crate) fn refill(project: &Project, dag_id: &str, writer: &Writer, owner: Owner) -> Refill {
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

/// For a worker whose own queue ran dry: it waits while the backfill runs, so that it is there
/// to take the backfill over should the owner die before the last interval ended (see
/// `succession`), and ends with the backfill. Not once the backfill reached its
/// `--max-failures`: nothing more starts, and a batch of this worker cut short holds its
/// intervals for as long as the worker runs, which the owner would wait for. `lingering` says
/// whether it waits.
pub(crate) fn linger(path: PathBuf, backfill_id: i64, lingering: Arc<AtomicBool>) -> Refill {
    Arc::new(move |more| {
        let running = more && {
            let reader = manifest::Reader::take(&path)?;
            reader
                .backfill(backfill_id)?
                .is_some_and(|b| b.state == BackfillState::Running)
        };
        lingering.store(running, Ordering::Relaxed);
        Ok(if running { Left::Wait } else { Left::Done })
    })
}

/// How a worker ends, beside its own intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkerEnd {
    /// As workers do: its queue ran dry and the backfill ended, or it was stopped.
    Usual,
    /// Its owner is gone and it could not take its place: stopped, for `resume`.
    OwnerGone,
    /// It took the backfill over and goes on as its owner: its end is recorded, not said (the
    /// owner's summary tells every interval's).
    TookOver,
}

/// How a worker ended: its state and exit code (its own intervals: the backfill's outcome is
/// its owner's to judge), recorded and said.
pub(super) fn finish_worker(
    g: &Global,
    writer: &Writer,
    owner: Owner,
    stats: Stats,
    (stopped, end, fault): (bool, WorkerEnd, Option<&crate::environment::Fault>),
    began: Instant,
) -> Result<(u8, BackfillState, String), Error> {
    let stopped = stopped || end == WorkerEnd::OwnerGone;
    let (mut state, mut code) = if fault.is_some() {
        (BackfillState::Cancelled, exit::INTERNAL)
    } else if stopped {
        (BackfillState::Cancelled, exit::INTERRUPTED)
    } else if stats.failed + stats.rejected > 0 {
        (BackfillState::Failed, exit::FAILED)
    } else {
        (BackfillState::Completed, exit::OK)
    };
    let recorded =
        writer.call_blocking(move |c| c.finish_backfill(owner, state, crate::clock::End::now()));
    match recorded {
        Ok(()) => {}
        // Its lease was taken away (frozen or cut off): the owner recovered its runs.
        Err(manifest::Error::Fenced { .. }) => {
            (state, code) = (BackfillState::Cancelled, exit::INTERRUPTED);
        }
        Err(e) => return Err(e.into()),
    }
    if end == WorkerEnd::TookOver {
        return Ok((code, state, String::new()));
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
    let mut summary = summary;
    if let Some(f) = fault {
        summary["stopped_by"] = serde_json::json!(f);
    }
    if g.json {
        match crate::report::out::json(&summary) {
            Ok(()) | Err(Error::ClosedPipe) => {}
            Err(e) => return Err(e),
        }
    } else if !g.quiet {
        let ran = stats.succeeded + stats.failed + stats.rejected + stats.cancelled;
        let next = match end {
            _ if fault.is_some() => format!(
                "stopped: {}, then `{}` tells how the backfill goes",
                fault.map(ToString::to_string).unwrap_or_default(),
                crate::report::out::hint(&format!("show {}", owner.backfill_id))
            ),
            WorkerEnd::OwnerGone => format!(
                "its owner is gone: `{}` runs the rest",
                crate::report::out::hint(&format!("resume {}", owner.backfill_id))
            ),
            _ => format!(
                "`{}` tells how the backfill goes",
                crate::report::out::hint(&format!("show {}", owner.backfill_id))
            ),
        };
        crate::report::out::say(&format!(
            "worker {} of backfill {} {}: ran {} here ({} succeeded, {} failed, {} rejected, {} cancelled); {next}",
            owner.worker.unwrap_or_default(),
            owner.backfill_id,
            state.as_str(),
            crate::report::out::plural(ran as i64, "interval", "intervals"),
            stats.succeeded,
            stats.failed,
            stats.rejected,
            stats.cancelled,
        ));
    }
    Ok((code, state, summary.to_string()))
}
