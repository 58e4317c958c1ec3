//! `backfill cancel ID`: stop a backfill. A live owner process is asked through the manifest
//! and stops within about a second; for a dead one, its leftovers are killed, its runs recorded
//! as cancelled and its leases released here.

use std::time::{Duration, Instant};

use crate::exit::{self, Error};
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Reads};
use crate::recovery::{self, Dags};
use crate::session::{Global, find_backfill, warn};
use crate::state::BackfillState;

pub(crate) fn run(g: &Global, id: i64, wait: Duration) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    // Recovering another project's backfill would finish its publishes into this project's
    // warehouses.
    crate::session::belonging::check_backfill(&project, &manifest_path, &backfill, "cancel")?;
    // A cascade runs one backfill at a time: cancelling any of its backfills stops the one
    // that runs, and with it the cascade.
    if backfill.state != BackfillState::Running
        && (backfill.cascade.is_some() || backfill.cascade_of.is_some())
    {
        let root = backfill.cascade_of.unwrap_or(id);
        let running = conn
            .running_member(root)
            .map_err(|e| e.at(&manifest_path))?;
        if let Some(member) = running {
            crate::report::out::say(&format!(
                "backfill {id} is {}; cancelling backfill {member} of its cascade",
                backfill.state
            ));
            drop(conn);
            return run(g, member, wait);
        }
    }
    if backfill.state != BackfillState::Running {
        crate::report::out::say(&format!(
            "backfill {id} is already {}; nothing to cancel",
            backfill.state
        ));
        document(g, id, backfill.state.as_str(), "nothing to cancel")?;
        return Ok(exit::OK);
    }
    let writer = Writer::open(&manifest_path, project.durability)?;
    let result = cancel(g, &project, &writer, &*conn, id, &backfill, wait);
    writer.close();
    result
}

fn cancel(
    g: &Global,
    project: &crate::project::Project,
    writer: &Writer,
    conn: &dyn Reads,
    id: i64,
    backfill: &manifest::Backfill,
    wait: Duration,
) -> Result<u8, Error> {
    let path = writer.path().to_path_buf();
    let ctx = || {
        LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL)
            .at_manifest(conn)
            .map_err(|e| e.at(&path))
    };
    if backfill.owner_alive(&ctx()?) {
        writer.call_blocking(move |c| c.request_cancel(id))?;
        let here = crate::liveness::Host::name(&crate::process::LOCAL);
        crate::report::out::say(&format!(
            "asked backfill {id} (pid {}{}) to stop…",
            backfill.owner_pid.unwrap_or_default(),
            crate::liveness::elsewhere(backfill.owner_host.as_deref(), &here)
                .map(|host| format!(" on host {host}"))
                .unwrap_or_default()
        ));
        let deadline = Instant::now()
            .checked_add(wait)
            .unwrap_or_else(Instant::now);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let Some(now) = conn.backfill(id).map_err(|e| e.at(&path))? else {
                break;
            };
            if now.state != BackfillState::Running {
                settle_workers(g, project, writer, conn, id, deadline)?;
                crate::report::out::say(&format!("backfill {id} stopped: {}", now.state));
                document(g, id, now.state.as_str(), "stopped by its process")?;
                return Ok(exit::OK);
            }
            if !now.owner_alive(&ctx()?) {
                break;
            }
            if Instant::now() >= deadline {
                crate::report::out::say(&format!(
                    "backfill {id} was asked to stop and is still stopping after {} (its tasks get SIGTERM, then SIGKILL after their grace_period); `{}` tells when it has",
                    humantime::format_duration(wait),
                    crate::report::out::hint(&format!("show {id}"))
                ));
                document(g, id, now.state.as_str(), "still stopping")?;
                return Ok(exit::OK);
            }
        }
    }
    // The owner is gone (or went away while asked): clean up on its behalf.
    let dags = Dags::of(project);
    match recovery::cancel_dead(
        writer,
        &dags,
        id,
        &LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL),
    )? {
        Some(report) => {
            for w in &report.warnings {
                warn(g, w);
            }
            let deadline = Instant::now()
                .checked_add(wait)
                .unwrap_or_else(Instant::now);
            settle_workers(g, project, writer, conn, id, deadline)?;
            // An owner on another host cannot be looked at from here: its lease expired.
            let here = crate::liveness::Host::name(&crate::process::LOCAL);
            let gone = match crate::liveness::elsewhere(backfill.owner_host.as_deref(), &here) {
                Some(host) => {
                    format!("its process on host {host} sent no heartbeat within the lease timeout")
                }
                None => "its process was gone".to_string(),
            };
            crate::report::out::say(&format!(
                "backfill {id} cancelled; {gone}, so its leases were released here; `{}` continues it",
                crate::report::out::hint(&format!("resume {id}"))
            ));
            document(g, id, "cancelled", &format!("cancelled here: {gone}"))?;
        }
        None => {
            crate::report::out::say(&format!(
                "backfill {id} is running again (resumed meanwhile); nothing done"
            ));
            document(g, id, "running", "resumed meanwhile: nothing done")?;
        }
    }
    Ok(exit::OK)
}

/// Once the backfill no longer runs, its workers (`backfill join`) stop at their next
/// heartbeat: waits for them until `deadline`, then recovers those that are gone (their runs
/// ended, their leases released).
fn settle_workers(
    g: &Global,
    project: &crate::project::Project,
    writer: &Writer,
    conn: &dyn Reads,
    id: i64,
    deadline: Instant,
) -> Result<(), Error> {
    let path = writer.path().to_path_buf();
    let ctx = || {
        LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL)
            .at_manifest(conn)
            .map_err(|e| e.at(&path))
    };
    loop {
        let c = ctx()?;
        let workers = conn.workers(id).map_err(|e| e.at(&path))?;
        if workers.is_empty() {
            return Ok(());
        }
        if !workers.iter().any(|w| w.alive(&c)) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = recovery::recover_workers(writer, &Dags::of(project), id, &ctx()?)?;
    for w in &report.warnings {
        warn(g, w);
    }
    Ok(())
}

/// With `--output json`: what `cancel` did, as one document on stdout.
fn document(g: &Global, id: i64, state: &str, what: &str) -> Result<(), Error> {
    if g.json {
        crate::report::out::json(&serde_json::json!({
            "backfill_id": id,
            "state": state,
            "result": what,
        }))?;
    }
    Ok(())
}
