//! `backfill forget --dag ID [--from WHEN --to WHEN]`: removes a DAG's history, over a range
//! or all of it, so that it can start again: from the manifest its backfills, runs, tries and
//! published records (one transaction, recorded in `forgets`), then from each SQL task's
//! warehouse the versions kept for `rollback` and the bookkeeping of their publishes, and the
//! log files of the removed runs. The data in the targets stays: forget removes what was
//! recorded about it, not the rows.
//!
//! A dry run counts and writes nothing. Otherwise it asks on a terminal, and elsewhere needs
//! `--yes`. A removal killed after its manifest transaction is recorded `cleaning`, and the
//! next `forget` (of any DAG) finishes its warehouse and log clean-up first.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use crate::exit::{self, Error};
use crate::manifest;
use crate::manifest::forgets::{Busy, Forget, Scope};
use crate::manifest::writer::Writer;
use crate::project::{Dag, Project, TaskKind};
use crate::report::out::{hint, plural, say};
use crate::session::{Global, note, warn};

/// What the command was asked.
pub(crate) struct Ask<'a> {
    pub dag_id: &'a str,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub dry_run: bool,
    pub yes: bool,
}

pub(crate) fn run(g: &Global, ask: &Ask<'_>) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(ask.dag_id).ok();
    let range = match (ask.from, ask.to, &dag) {
        (Some(from), Some(to), Some(dag)) => Some(
            crate::interval::resolve_args(from, to, crate::clock::now()?, dag.tz)?
                .unix_start_bounds(),
        ),
        (Some(_), Some(_), None) => {
            return Err(Error::Usage(format!(
                "DAG `{}` is not in this project, so its time zone, which --from and --to are read in, is unknown: forget all of its history (without --from and --to)",
                ask.dag_id
            )));
        }
        _ => None,
    };
    // Without a terminal to ask on, --yes is needed: refused before anything is read.
    let ask_first = !ask.dry_run && !ask.yes;
    if ask_first && (!std::io::stdin().is_terminal() || !std::io::stderr().is_terminal()) {
        return Err(Error::Usage(format!(
            "forget removes the history of DAG {} for good: add --yes to go on (--dry-run shows what it would remove, and writes nothing)",
            ask.dag_id
        )));
    }
    let path = g.manifest_path(Some(&project))?;
    let Some(conn) = manifest::open_if_exists(&path)? else {
        note(
            g,
            &format!(
                "nothing to forget: the manifest {} records nothing yet",
                path.display()
            ),
        );
        return Ok(exit::OK);
    };
    let at = |e: manifest::Error| e.at(&path);
    // Another project's backfills of a DAG of the same id are not this project's to remove.
    let found = conn.dag_projects(ask.dag_id).map_err(at)?;
    match &dag {
        Some(dag) => crate::session::belonging::check_dag(&project, &path, &*conn, dag)?,
        None => {
            if let Some(theirs) = crate::session::belonging::other_project(&project.name, &found) {
                return Err(Error::Usage(format!(
                    "the manifest {} holds backfills of DAG `{}` by project `{}`, not this one (`{}`): forget it from that project",
                    path.display(),
                    ask.dag_id,
                    theirs.project,
                    project.name
                )));
            }
        }
    }
    let unfinished = conn.unfinished_forgets().map_err(at)?;
    let scope = conn.forget_scope(ask.dag_id, range).map_err(at)?;
    // A DAG that neither the project nor the manifest has is a typo: said as `create` says it.
    if dag.is_none()
        && found.is_empty()
        && scope.is_empty()
        && let Err(unknown) = project.dag(ask.dag_id)
    {
        return Err(unknown.into());
    }
    let identity = conn.identity().map_err(at)?;
    if let Some(busy) = scope.busy() {
        return Err(Error::Usage(busy_words(ask.dag_id, &busy)));
    }
    let versions = kept(g, dag.as_ref(), &identity, range);
    if !g.json && (ask.dry_run || !g.quiet) {
        what(ask, &scope, versions).write()?;
    }
    if dag.is_none() && ask.dry_run {
        warn(
            g,
            &format!(
                "DAG `{}` is not in this project: the versions its SQL tasks kept in their warehouses cannot be found, and stay there",
                ask.dag_id
            ),
        );
    }
    if ask.dry_run {
        if g.json {
            crate::report::out::json(&what(ask, &scope, versions).json(None))?;
        }
        if !unfinished.is_empty() {
            note(
                g,
                &format!(
                    "{} stopped before its warehouse clean-up, which the next forget finishes first",
                    plural_ids(
                        "forget",
                        "forgets",
                        &unfinished.iter().map(|f| f.id).collect::<Vec<_>>()
                    )
                ),
            );
        }
        note(g, "a dry run: nothing was forgotten");
        return Ok(exit::OK);
    }
    let nothing = scope.is_empty() && versions == Some(0);
    if ask_first && !nothing && !confirmed(ask.dag_id)? {
        say("nothing was forgotten");
        return Ok(exit::OK);
    }
    drop(conn);
    let writer = Writer::open(&path, project.durability)?;
    let result = forget(
        g,
        &project,
        &writer,
        ask,
        (range, scope, versions),
        &identity,
    );
    writer.close();
    result
}

/// What the command says it removes (or removed).
fn what<'a>(ask: &Ask<'a>, scope: &'a Scope, versions: Option<i64>) -> What<'a> {
    What {
        dag_id: ask.dag_id,
        from: ask.from,
        to: ask.to,
        scope,
        versions,
    }
}

/// Removes the range, once the removals an earlier forget left half done are finished.
/// `scope` and `versions` are what the range held when the command counted it (the manifest
/// and the kept versions), counted again only if finishing those removals may have changed it.
fn forget(
    g: &Global,
    project: &Project,
    writer: &Writer,
    ask: &Ask<'_>,
    (range, scope, versions): (Option<(i64, i64)>, Scope, Option<i64>),
    identity: &str,
) -> Result<u8, Error> {
    let at = |e: manifest::Error| e.at(writer.path());
    let reads = manifest::open_read_only(writer.path())?;
    let mut finished = false;
    // Removals that an earlier forget left half done are finished first, each once its DAG
    // is not in use; one that cannot be finished now stays for the next forget.
    for f in reads.unfinished_forgets().map_err(at)? {
        let busy = reads.forget_scope(&f.dag_id, f.range).map_err(at)?.busy();
        if let Some(busy) = busy {
            warn(
                g,
                &format!(
                    "forget {} of DAG {} stopped before its warehouse clean-up, which waits: {}",
                    f.id,
                    f.dag_id,
                    busy_words(&f.dag_id, &busy)
                ),
            );
            continue;
        }
        note(
            g,
            &format!(
                "finishing forget {} of DAG {}, which stopped before its warehouse clean-up",
                f.id, f.dag_id
            ),
        );
        finished = true;
        if let Err(e) = clean(g, project, writer, &f, identity) {
            warn(g, &e.to_string());
        }
    }
    // What is left once they are: a range that the manifest and the warehouses no longer
    // hold is not recorded as a removal.
    let (scope, versions) = if finished {
        let dag = project.dag(ask.dag_id).ok();
        (
            reads.forget_scope(ask.dag_id, range).map_err(at)?,
            kept(g, dag.as_ref(), identity, range),
        )
    } else {
        (scope, versions)
    };
    drop(reads);
    if scope.is_empty() && versions == Some(0) {
        if g.json {
            crate::report::out::json(&what(ask, &scope, Some(0)).json(Some(None)))?;
        }
        note(g, "nothing to forget");
        return Ok(exit::OK);
    }
    let dag_id = ask.dag_id.to_string();
    let args = ask
        .from
        .zip(ask.to)
        .map(|(f, t)| (f.to_string(), t.to_string()));
    let host = crate::liveness::Host::name(&crate::process::LOCAL);
    let pid = i64::from(std::process::id());
    let now = crate::clock::now_ms();
    let forgot = writer.call_blocking(move |c| {
        let args = args.as_ref().map(|(f, t)| (f.as_str(), t.as_str()));
        let span = crate::manifest::forgets::Span {
            args,
            starts: range,
        };
        c.forget(&dag_id, span, (&host, pid), now)
    })?;
    let f = match forgot {
        Ok(f) => f,
        Err(busy) => return Err(Error::Usage(busy_words(ask.dag_id, &busy))),
    };
    crate::fault::point("forget-recorded");
    let versions = clean(g, project, writer, &f, identity)?;
    if g.json {
        crate::report::out::json(&what(ask, &scope, Some(versions)).json(Some(Some(f.id))))?;
    }
    note(
        g,
        &format!(
            "forgot {}, {} and {} of DAG {} ({} no longer recorded as published, {} removed from its warehouses), recorded as forget {}: its next backfill runs these intervals",
            plural(f.backfills, "backfill", "backfills"),
            plural(f.runs, "run", "runs"),
            plural(f.tries, "try", "tries"),
            ask.dag_id,
            plural(f.published, "partition", "partitions"),
            plural(versions, "kept version", "kept versions"),
            f.id
        ),
    );
    Ok(exit::OK)
}

/// The warehouse and log clean-up of removal `f`, then its record `done`: the kept versions
/// removed.
fn clean(
    g: &Global,
    project: &Project,
    writer: &Writer,
    f: &Forget,
    identity: &str,
) -> Result<i64, Error> {
    let mut versions = 0;
    match project.dag(&f.dag_id) {
        Ok(dag) => {
            for task in targets(&dag) {
                versions += crate::warehouse::backend_of(&task.warehouse)
                    .forget(&task, identity, f.range, f.last_try, false)
                    .map_err(|e| {
                        Error::Warehouse(crate::warehouse::Error::Message(format!(
                            "{e}; forget {} removed DAG {}'s history from the manifest, but not yet what its warehouse keeps: run `{}` again to finish",
                            f.id,
                            f.dag_id,
                            hint(&format!(
                                "forget --dag {}{} --yes",
                                f.dag_id,
                                f.args
                                    .as_ref()
                                    .map(|(from, to)| format!(" --from {from} --to {to}"))
                                    .unwrap_or_default()
                            ))
                        )))
                    })?;
            }
        }
        Err(_) => warn(
            g,
            &format!(
                "DAG `{}` is no longer in this project: what its SQL tasks kept in their warehouses stays there",
                f.dag_id
            ),
        ),
    }
    remove_logs(&project.logs_dir, f);
    let (id, now) = (f.id, crate::clock::now_ms());
    writer.call_blocking(move |c| c.finish_forget(id, versions, now))?;
    Ok(versions)
}

/// How many versions the DAG's SQL tasks keep in their warehouses for the range; `None` when
/// a warehouse cannot be read (said as a warning: the removal of the manifest's record does
/// not wait for it, and the next forget finishes the warehouse's part).
fn kept(g: &Global, dag: Option<&Dag>, identity: &str, range: Option<(i64, i64)>) -> Option<i64> {
    let mut versions = Some(0);
    for task in dag.map(targets).unwrap_or_default() {
        match crate::warehouse::backend_of(&task.warehouse).forget(
            &task,
            identity,
            range,
            i64::MAX,
            true,
        ) {
            Ok(n) => versions = versions.map(|v| v + n),
            Err(e) => {
                warn(
                    g,
                    &format!(
                        "the kept versions of `{}` cannot be counted: {e}",
                        task.target
                    ),
                );
                versions = None;
            }
        }
    }
    versions
}

/// The SQL tasks of a DAG, one per warehouse and target.
fn targets(dag: &Dag) -> Vec<crate::project::SqlTask> {
    let mut seen = std::collections::HashSet::new();
    dag.tasks
        .iter()
        .filter_map(|t| match &t.kind {
            TaskKind::Sql(sql) => Some(sql),
            TaskKind::Command(_) => None,
        })
        .filter(|sql| seen.insert((sql.warehouse.name.clone(), sql.target.clone())))
        .cloned()
        .collect()
}

/// Removes the log and result files of the removal's runs: in `logs/DAG/TASK/`, those of
/// intervals starting within its range, of runs up to its last run (a later run's files
/// belong to a backfill that started after it). A file that cannot be removed stays.
fn remove_logs(logs_dir: &Path, f: &Forget) {
    let Ok(tasks) = std::fs::read_dir(logs_dir.join(&f.dag_id)) else {
        return;
    };
    for task in tasks.flatten() {
        let Ok(files) = std::fs::read_dir(task.path()) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name();
            if log_of(&name.to_string_lossy(), f) {
                let _ = std::fs::remove_file(file.path());
            }
        }
        // The folders stay: a backfill of the DAG may be starting, and writes its logs there.
    }
}

/// Whether a file of `logs/DAG/TASK/` (`20260901T000000Z.run7.try1.log`, `.result.json`) is of
/// a run the removal took away, or is what a readiness check of an interval in its range said
/// (`20260901T000000Z.ready.log`: of no run, asked before its interval's run started).
fn log_of(name: &str, f: &Forget) -> bool {
    let mut parts = name.splitn(3, '.');
    let (Some(start), Some(run)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Ok(start) = chrono::NaiveDateTime::parse_from_str(start, "%Y%m%dT%H%M%SZ") else {
        return false;
    };
    let start = start.and_utc().timestamp();
    let (lo, hi) = f.range.unwrap_or((i64::MIN, i64::MAX));
    if !(lo..=hi).contains(&start) {
        return false;
    }
    if run == "ready" {
        return true;
    }
    run.strip_prefix("run")
        .and_then(|r| r.parse::<i64>().ok())
        .is_some_and(|run| run <= f.last_run)
}

/// `backfill 3` or `backfills 3 and 5`.
fn plural_ids(one: &str, many: &str, ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    match list.as_slice() {
        [only] => format!("{one} {only}"),
        [init @ .., last] => format!("{many} {} and {last}", init.join(", ")),
        [] => many.to_string(),
    }
}

fn busy_words(dag_id: &str, busy: &Busy) -> String {
    let (Busy::Running(ids) | Busy::InFlight(ids) | Busy::Cascade(ids) | Busy::Staged(ids)) = busy;
    let who = plural_ids("backfill", "backfills", ids);
    let one = ids.len() == 1;
    let is = if one { "is" } else { "are" };
    let first = ids.first().copied().unwrap_or_default();
    let why = match busy {
        Busy::Running(_) => format!(
            "{who} of DAG {dag_id} {is} recorded as running: forget once {} ended (`{}` continues it, `{}` stops it)",
            if one { "it has" } else { "they have" },
            hint(&format!("resume {first}")),
            hint(&format!("cancel {first}"))
        ),
        Busy::InFlight(_) => format!(
            "{who} of DAG {dag_id} {is} still at work on this range (a try not stopped yet, a worker still stopping): forget once `{}` shows nothing running",
            hint(&format!("show {first}"))
        ),
        Busy::Cascade(_) => format!(
            "{who} {is} running in a cascade with backfills of DAG {dag_id}: forget once it has ended (`{}` stops it)",
            hint(&format!("cancel {first}"))
        ),
        Busy::Staged(_) => format!(
            "{who} of DAG {dag_id} {} staged outputs of this range: promote or discard them first (`{}`)",
            if one { "holds" } else { "hold" },
            hint(&format!("discard {first}"))
        ),
    };
    format!("{why}; nothing was forgotten")
}

/// Asks on the terminal.
fn confirmed(dag_id: &str) -> Result<bool, Error> {
    let mut err = std::io::stderr();
    let _ = write!(
        err,
        "Forget this history of DAG {dag_id}? It cannot be undone. [y/N] "
    );
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Error::Io {
            context: "read the answer".into(),
            source: e,
        })?;
    Ok(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"))
}

/// What a removal takes away, as the command says it.
struct What<'a> {
    dag_id: &'a str,
    from: Option<&'a str>,
    to: Option<&'a str>,
    scope: &'a Scope,
    /// `None` when a warehouse could not be read.
    versions: Option<i64>,
}

impl What<'_> {
    fn range_words(&self) -> String {
        match (self.from, self.to) {
            (Some(from), Some(to)) => format!("intervals from {from} to {to}"),
            _ => "every interval".into(),
        }
    }

    fn write(&self) -> Result<(), Error> {
        let s = self.scope;
        let ids = |ids: &[i64]| {
            if ids.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    ids.iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        };
        let mut lines = vec![
            format!("forget DAG {}, {}:", self.dag_id, self.range_words()),
            format!(
                "  backfills       {}{}",
                s.backfills.len(),
                ids(&s.backfills)
            ),
        ];
        if !s.kept_backfills.is_empty() {
            lines.push(format!(
                "  backfills kept  {}{}: their intervals outside the range stay",
                s.kept_backfills.len(),
                ids(&s.kept_backfills)
            ));
        }
        lines.extend([
            format!("  runs            {}", s.runs),
            format!("  tries           {}", s.tries),
            format!(
                "  published       {}: no longer recorded; the rows stay in the target",
                s.published
            ),
            format!(
                "  kept versions   {}",
                self.versions.map_or_else(
                    || "unknown (a warehouse cannot be read)".into(),
                    |v| v.to_string()
                )
            ),
        ]);
        let mut sink = crate::report::out::Sink::std(false, false);
        for line in lines {
            sink.line(&line)?;
        }
        Ok(())
    }

    /// The JSON document: of a dry run (`forget` `None`), or of a removal, recorded as
    /// `Some(id)` (`Some(None)`: nothing was left to remove).
    fn json(&self, forget: Option<Option<i64>>) -> serde_json::Value {
        let s = self.scope;
        serde_json::json!({
            "dag": self.dag_id,
            "from": self.from,
            "to": self.to,
            "dry_run": forget.is_none(),
            "forget_id": forget.flatten(),
            "backfills": s.backfills,
            "backfills_kept": s.kept_backfills,
            "runs": s.runs,
            "tries": s.tries,
            "published": s.published,
            "kept_versions": self.versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removal(range: Option<(i64, i64)>, last_run: i64) -> Forget {
        Forget {
            id: 1,
            dag_id: "d".into(),
            args: None,
            range,
            done: false,
            backfills: 0,
            runs: 0,
            tries: 0,
            published: 0,
            versions: None,
            last_try: 0,
            last_run,
            created_at: 0,
        }
    }

    #[test]
    fn a_log_file_is_the_removals_when_its_interval_and_run_are() {
        // 2026-09-01T00:00:00Z is 1788220800.
        let sept = removal(Some((1_788_220_800, 1_788_307_199)), 7);
        assert!(log_of("20260901T000000Z.run7.try1.log", &sept));
        assert!(log_of("20260901T000000Z.run3.try2.result.json", &sept));
        // A run after the removal, a day outside its range, a file of another shape.
        assert!(!log_of("20260901T000000Z.run8.try1.log", &sept));
        assert!(!log_of("20260902T000000Z.run5.try1.log", &sept));
        assert!(!log_of("notes.txt", &sept));
        assert!(!log_of("20260901T000000Z.runx.try1.log", &sept));
        assert!(log_of("20200101T000000Z.run1.try1.log", &removal(None, 1)));
    }
}
