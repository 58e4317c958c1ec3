//! `backfill cancel ID`: stop a backfill. A live owner process is asked through the manifest
//! and stops within about a second; for a dead one, its leftovers are killed, its runs recorded
//! as cancelled and its leases released here.

use std::time::{Duration, Instant};

use super::{Global, find_backfill, repair};
use crate::exit::{self, Error};
use crate::manifest::{self, BackfillState, lease::LeaseCtx, writer::Writer};

/// How long to wait for a live owner to stop before reporting that it was asked.
const WAIT: Duration = Duration::from_secs(60);

pub fn run(g: &Global, id: i64) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    if backfill.state != BackfillState::Running {
        eprintln!(
            "backfill {id} is already {}; nothing to cancel",
            backfill.state
        );
        return Ok(exit::OK);
    }
    let writer = Writer::spawn(manifest::open_writer(&manifest_path, project.durability)?)?;
    let ctx = LeaseCtx::new(project.lease_timeout);
    if backfill.owner_alive(&ctx) {
        writer.call_blocking(move |c| manifest::request_cancel(c, id))?;
        eprintln!(
            "asked backfill {id} (pid {}) to stop…",
            backfill.owner_pid.unwrap_or_default()
        );
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            let Some(now) = manifest::get_backfill(&conn, id)? else {
                break;
            };
            if now.state != BackfillState::Running {
                eprintln!("backfill {id} stopped: {}", now.state);
                return Ok(exit::OK);
            }
            if !now.owner_alive(&LeaseCtx::new(project.lease_timeout)) {
                break;
            }
        }
    }
    // The owner is gone (or never answered): clean up on its behalf.
    let ctx = LeaseCtx::new(project.lease_timeout);
    let dag = project.dag(&backfill.dag_id).ok();
    writer.call_blocking(move |c| {
        if let Some(b) = manifest::get_backfill(c, id)?
            && b.state == BackfillState::Running
            && !b.owner_alive(&ctx)
        {
            if let Some(dag) = &dag {
                repair::publishes(c, dag, id)?;
            }
            manifest::abandon_runs(c, id, &ctx)?;
            manifest::finish_backfill(c, id, BackfillState::Cancelled, ctx.now_ms)?;
        }
        Ok(())
    })?;
    drop(writer);
    let state = manifest::get_backfill(&conn, id)?.map(|b| b.state);
    match state {
        Some(BackfillState::Running) => {
            eprintln!(
                "backfill {id} was asked to stop but is still running after {}s",
                WAIT.as_secs()
            );
            Ok(exit::INTERNAL)
        }
        _ => {
            eprintln!(
                "backfill {id} cancelled; its process was gone, so its leases were released here; `backfill resume {id}` continues it"
            );
            Ok(exit::OK)
        }
    }
}
