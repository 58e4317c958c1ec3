//! `manifest copy --to URL`: a team that started on one machine moves its manifest into
//! PostgreSQL without losing the record. The SQLite file is read, never changed (beyond the
//! upgrade of an older schema); the copy commits whole or not at all.

use std::path::Path;

use crate::exit::{self, Error};
use crate::manifest::{self, Reads, db::Conn, leases::LeaseCtx};
use crate::report::out::plural;
use crate::session::{Global, note};

pub(crate) fn copy(g: &Global, to: &str) -> Result<u8, Error> {
    let project = g.project().ok();
    let from = g.manifest_path(project.as_ref())?;
    if manifest::is_url(&from) {
        return Err(Error::Usage(format!(
            "the manifest {} is in PostgreSQL already; `manifest copy` reads a SQLite manifest: name it with --manifest PATH",
            from.display()
        )));
    }
    if !manifest::is_url(Path::new(to)) {
        return Err(Error::Usage(format!(
            "--to: `{}` is not a PostgreSQL URL; write it like postgresql://etl@db.internal/backfill",
            crate::project::redact_url(to)
        )));
    }
    if !from.exists() {
        return Err(Error::Usage(format!(
            "no manifest at {}: nothing to copy",
            from.display()
        )));
    }
    let to = manifest::location(to);
    // Opened for writing: a manifest of an older schema is upgraded first.
    let conn = Conn::Sqlite(manifest::open_sqlite(&from, manifest::Durability::Normal)?);
    let timeout = project
        .as_ref()
        .map_or(crate::project::DEFAULT_LEASE_TIMEOUT, |p| p.lease_timeout);
    let ctx = LeaseCtx::new(timeout, &crate::process::LOCAL);
    for b in conn.list_backfills(None, true).map_err(|e| e.at(&from))? {
        if ctx.owner_alive(
            b.state,
            (b.owner_pid, b.owner_start),
            b.owner_host.as_deref(),
            b.heartbeat_at,
        ) {
            return Err(Error::Usage(format!(
                "backfill {} is running (pid {}); copy once it has ended, or stop it with `{}`",
                b.id,
                b.owner_pid.unwrap_or_default(),
                crate::report::out::hint(&format!("cancel {}", b.id))
            )));
        }
    }
    let Conn::Sqlite(sqlite) = &conn else {
        unreachable!("opened as SQLite above")
    };
    let copied = match manifest::copy::to_postgres(sqlite, &to)? {
        Ok(copied) => copied,
        Err(manifest::copy::Refused(why)) => return Err(Error::Usage(why)),
    };
    let get = |t: &str| copied.iter().find(|c| c.0 == t).map_or(0, |c| c.1);
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    if g.json {
        let rows: serde_json::Map<String, serde_json::Value> = copied
            .iter()
            .map(|(t, n)| ((*t).to_string(), serde_json::Value::from(*n)))
            .collect();
        crate::report::out::json(&serde_json::json!({
            "from": from.display().to_string(),
            "to": to.display().to_string(),
            "rows": rows,
        }))?;
    }
    note(
        g,
        &format!(
            "copied {}, {} and {} from {} into {}; use it with manifest = \"{}\" in backfill.toml, --manifest or BACKFILL_MANIFEST (the SQLite file is unchanged)",
            plural(count(get("backfills")), "backfill", "backfills"),
            plural(count(get("runs")), "run", "runs"),
            plural(count(get("task_tries")), "try", "tries"),
            from.display(),
            to.display(),
            to.display()
        ),
    );
    Ok(exit::OK)
}
