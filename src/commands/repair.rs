//! Repairs publishes that a dead process decided on but may not have finished. A try whose gate
//! passed records its intent (and its audit table) before it touches the warehouse; after a
//! crash the publish is redone from the audit table (it replaces the partition, so redoing is
//! harmless), or, if the audit table is gone, the publish had committed and is only recorded.
//! Nothing is recomputed. A try that a newer publish superseded is dropped instead.

use rusqlite::Connection;

use crate::manifest::{self, TryRecord, lease::now_ms};
use crate::project::{Dag, TaskKind};
use crate::warehouse::{self, Binds};

/// Repairs the pending publishes of `backfill_id`, then records as succeeded its runs whose every
/// task has succeeded. Runs inside a manifest transaction.
pub fn publishes(conn: &Connection, dag: &Dag, backfill_id: i64) -> anyhow::Result<()> {
    for p in manifest::pending_publishes(conn, backfill_id)? {
        let Some(task) = dag.tasks.iter().find(|t| t.id == p.task_id) else {
            continue;
        };
        let TaskKind::Sql(sql) = &task.kind else {
            continue;
        };
        let wh = warehouse::open(&sql.warehouse)?;
        let audit = p.audit_table.clone().unwrap_or_default();
        let start = p.interval.start.timestamp();
        let newer = manifest::published(conn, &dag.id, &task.id, start)?
            .filter(|(try_id, _)| *try_id > p.try_id);
        if let Some((newer, _)) = newer {
            warehouse::drop_audit(&wh, &audit)?;
            let record = TryRecord {
                state: "cancelled".into(),
                error: Some(format!(
                    "interrupted while publishing; superseded by try {newer}"
                )),
                ..p.record.clone()
            };
            manifest::finish_try(conn, p.try_id, &record, now_ms())?;
            continue;
        }
        let rows = if warehouse::table_exists(&wh, &audit)? {
            let binds = Binds::new(p.interval, dag.tz);
            warehouse::publish(&wh, sql, Some(&audit), &binds, None)?
        } else {
            p.record.rows.unwrap_or(0)
        };
        let record = TryRecord {
            rows: Some(rows),
            ..p.record.clone()
        };
        let now = now_ms();
        manifest::finish_try(conn, p.try_id, &record, now)?;
        let publication = manifest::Publication {
            try_id: p.try_id,
            dag_id: &dag.id,
            task_id: &task.id,
            interval: p.interval,
            rows,
            fingerprint: record.fingerprint.as_deref(),
        };
        manifest::mark_published(conn, &publication, now)?;
    }
    manifest::complete_finished_runs(conn, backfill_id, dag.tasks.len(), now_ms())
}
