//! `backfill resume ID`: continue a backfill whose process is gone (crash, kill) or that was
//! interrupted or cancelled. Refuses while the owner process is alive.

use super::execute::{Execution, execute};
use super::{Global, find_backfill, repair, unknown_backfill};
use crate::exit::{self, Error};
use crate::manifest::{self, TakeOverRefused, lease::LeaseCtx, writer::Writer};

pub fn run(g: &Global, id: i64) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    drop(conn);
    let dag = project.dag(&backfill.dag_id)?;
    let conf: serde_json::Value = serde_json::from_str(&backfill.conf)
        .map_err(|e| Error::Internal(anyhow::anyhow!("backfill {id} has unreadable conf: {e}")))?;
    let writer = Writer::spawn(manifest::open_writer(&manifest_path, project.durability)?)?;
    let ctx = LeaseCtx::new(project.lease_timeout);
    let repair_dag = dag.clone();
    let taken = writer.call_blocking(move |c| {
        let finish = |c: &rusqlite::Connection, owner| repair::publishes(c, &repair_dag, owner);
        manifest::take_over(c, id, &ctx, &finish)
    })?;
    let (backfill, intervals) = match taken {
        Ok(t) => t,
        Err(TakeOverRefused::Unknown) => return Err(unknown_backfill(id, &manifest_path)),
        Err(TakeOverRefused::OwnerAlive { pid, host }) => {
            return Err(Error::Usage(format!(
                "backfill {id} is still running (pid {}, host {}); wait for it, or stop it with `backfill cancel {id}`",
                pid.map_or("?".to_string(), |p| p.to_string()),
                host.as_deref().unwrap_or("?")
            )));
        }
    };
    if !g.quiet && !g.json {
        eprintln!(
            "resuming backfill {id} of {}: {} intervals left to run",
            dag.id,
            intervals.len()
        );
    }
    let code = execute(
        g,
        &project,
        Execution {
            backfill_id: id,
            dag,
            conf,
            max_active_runs: backfill.max_active_runs,
            intervals,
            allow_drift: backfill.allow_drift,
        },
        writer,
    )?;
    Ok(if code == exit::OK { exit::OK } else { code })
}
