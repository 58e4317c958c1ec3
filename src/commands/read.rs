//! `list`, `show` and `runs`: read the manifest (read-only); never create or change it. Their
//! tables and JSON documents go to stdout.

use std::path::PathBuf;

use crate::clock;
use crate::exit::{self, Error};
use crate::interval::resolve_args;
use crate::manifest::{self, Reads};
use crate::project::Project;
use crate::reads::{Shown, backfills, kept_versions, shown};
use crate::report::out::Sink;
use crate::report::{self, Labeler};
use crate::session::{Global, note, unknown_backfill, warn};

/// The manifest to read: `None` when the project's own has not been created yet (nothing was
/// recorded). A `--manifest` path that does not exist is an error.
fn open(g: &Global, project: Option<&Project>) -> Result<(PathBuf, Option<Box<dyn Reads>>), Error> {
    let path = g.manifest_path(project)?;
    // A file named on purpose must exist; a PostgreSQL database without a manifest yet has
    // recorded nothing, as the project's own file before its first backfill.
    let conn = if g.manifest.is_some() && !manifest::is_url(&path) {
        Some(manifest::open_read_only(&path)?)
    } else {
        manifest::open_if_exists(&path)?
    };
    Ok((path, conn))
}

pub(crate) fn list(g: &Global, dag: Option<&str>, active: bool) -> Result<u8, Error> {
    let project = g.project().ok();
    let (path, conn) = open(g, project.as_ref())?;
    let rows = match &conn {
        Some(conn) => backfills(&**conn, project.as_ref(), dag, active).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    let what = match (dag, active) {
        (Some(d), true) => format!("no active backfills of DAG {d}"),
        (Some(d), false) => format!("no backfills of DAG {d}"),
        (None, true) => "no active backfills".to_string(),
        (None, false) => "no backfills yet".to_string(),
    };
    // Each DAG's file is read once, whatever the number of its backfills.
    let mut by_dag: std::collections::HashMap<&str, Labeler> = std::collections::HashMap::new();
    for b in &rows {
        by_dag.entry(b.dag_id.as_str()).or_insert_with(|| {
            Labeler::of(
                project
                    .as_ref()
                    .and_then(|p| p.dag(&b.dag_id).ok())
                    .as_ref(),
            )
        });
    }
    let labels = |dag: &str| {
        by_dag
            .get(dag)
            .cloned()
            .unwrap_or_else(|| Labeler::of(None))
    };
    report::list::write(&mut Sink::std(g.json, g.verbose), &rows, &labels, &what)?;
    Ok(exit::OK)
}

pub(crate) fn show(g: &Global, id: i64, grid: bool) -> Result<u8, Error> {
    if grid && g.json {
        return Err(Error::Usage(
            "show --grid draws cells for people; --output json has every interval: give one of them"
                .into(),
        ));
    }
    let project = g.project().ok();
    let (path, conn) = open(g, project.as_ref())?;
    let Some(conn) = conn else {
        return Err(unknown_backfill(id, &path));
    };
    let Some(Shown {
        detail,
        members,
        dag,
        ..
    }) = shown(&*conn, project.as_ref(), id, g.json).map_err(|e| e.at(&path))?
    else {
        return Err(unknown_backfill(id, &path));
    };
    let mut out = Sink::std(g.json, g.verbose);
    if grid {
        let fit = crate::report::out::Fit::stdout(false);
        let colour = console::Term::stdout().features().colors_supported()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        report::cells::write(
            &mut out,
            &detail,
            &Labeler::of(dag.as_ref()),
            fit.width,
            colour,
        )?;
        for m in &members {
            let member_dag = project
                .as_ref()
                .and_then(|p| p.dag(&m.backfill.dag_id).ok());
            out.line("")?;
            report::cells::write(
                &mut out,
                m,
                &Labeler::of(member_dag.as_ref()),
                fit.width,
                colour,
            )?;
        }
        warn_unlike(g, project.as_ref(), dag.as_ref(), &*conn, id);
        return Ok(exit::OK);
    }
    let kept = dag.as_ref().map(|d| kept_versions(d, &path));
    report::show::write(
        &mut out,
        &detail,
        kept.as_deref(),
        &Labeler::of(dag.as_ref()),
    )?;
    if g.json {
        return Ok(exit::OK);
    }
    for m in &members {
        let member_dag = project
            .as_ref()
            .and_then(|p| p.dag(&m.backfill.dag_id).ok());
        out.line(&format!(
            "\ncascade: DAG `{}`, backfill {}",
            m.backfill.dag_id, m.backfill.id
        ))?;
        report::show::write(&mut out, m, None, &Labeler::of(member_dag.as_ref()))?;
    }
    warn_unlike(g, project.as_ref(), dag.as_ref(), &*conn, id);
    Ok(exit::OK)
}

/// The partitions of the backfill's range recorded as published whose target no longer holds
/// the rows that were published (truncated, changed by hand), as a warning. Nothing when the
/// DAG is gone from the project or a warehouse cannot be read.
fn warn_unlike(
    g: &Global,
    project: Option<&Project>,
    dag: Option<&crate::project::Dag>,
    conn: &dyn Reads,
    id: i64,
) {
    let (Some(project), Some(dag), Ok(Some(b))) = (project, dag, conn.backfill(id)) else {
        return;
    };
    let bounds = (b.range_start, b.range_end.saturating_sub(1));
    let unlike = crate::reads::unlike_published(project, dag, conn, bounds, &Default::default());
    let skipper = "a rerun with --reprocess-behavior none or failed";
    if let Some(words) = unlike
        .ok()
        .and_then(|u| crate::report::unlike::words(dag, &u, skipper))
    {
        warn(g, &words);
    }
}

pub(crate) fn runs(
    g: &Global,
    dag_id: &str,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id).ok();
    let (lo, hi) = match (from, to) {
        (Some(from), Some(to)) => {
            let dag = project.dag(dag_id)?;
            // The interval starts `create` would run for the same --from and --to.
            resolve_args(from, to, clock::now()?, dag.tz)?.unix_start_bounds()
        }
        _ => (i64::MIN, i64::MAX),
    };
    let (path, conn) = open(g, Some(&project))?;
    let rows = match &conn {
        Some(conn) => conn.run_history(dag_id, lo, hi).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    let what = match (from, to) {
        (Some(f), Some(t)) => format!("no runs of DAG {dag_id} between --from {f} and --to {t}"),
        _ => format!("no runs of DAG {dag_id}"),
    };
    report::runs::write(
        &mut Sink::std(g.json, g.verbose),
        &rows,
        &Labeler::of(dag.as_ref()),
        &what,
    )?;
    // What `forget` removed is not shown, and said to be gone.
    if let Some(conn) = &conn {
        for f in conn.forgets_of(dag_id).map_err(|e| e.at(&path))? {
            let when = chrono::DateTime::from_timestamp_millis(f.created_at)
                .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default();
            let range = match &f.args {
                Some((from, to)) => format!("--from {from} --to {to}"),
                None => "every interval".into(),
            };
            note(
                g,
                &format!(
                    "forget {} removed {} of DAG {dag_id} ({range}) at {when}",
                    f.id,
                    crate::report::out::plural(f.runs, "run", "runs")
                ),
            );
        }
    }
    Ok(exit::OK)
}

/// `backfill stale`: the intervals whose latest run succeeded and whose source changed since,
/// by the tasks' gate `source_count` and `source_fingerprint`. Runs nothing, writes nothing.
pub(crate) fn stale(
    g: &Global,
    dag_id: &str,
    from: &str,
    to: &str,
    conf: Option<&str>,
) -> Result<u8, Error> {
    let project = g.project()?;
    let dag = project.dag(dag_id)?;
    let conf = crate::session::launch::parse_conf(conf)?;
    let (lo, hi) = resolve_args(from, to, clock::now()?, dag.tz)?.unix_start_bounds();
    let (watching, blind) = crate::probe::watchers(&dag);
    if let Some(spot) = crate::probe::blind_spot(&dag) {
        warn(g, &spot.warning(&dag));
    } else if !blind.is_empty() {
        note(g, &crate::probe::partly_blind(&watching, &blind));
    }
    let (path, conn) = open(g, Some(&project))?;
    let recorded = match &conn {
        Some(conn) if !watching.is_empty() => conn
            .recorded_sources(dag_id, lo, hi)
            .map_err(|e| e.at(&path))?,
        _ => Default::default(),
    };
    // Intervals whose latest run did not publish have no source to compare with: said, with
    // how to run them.
    let unsettled = match &conn {
        Some(conn) => conn.unsettled(dag_id, lo, hi).map_err(|e| e.at(&path))?,
        None => Vec::new(),
    };
    if !unsettled.is_empty() {
        let total: i64 = unsettled.iter().map(|(_, n)| n).sum();
        let states: Vec<String> = unsettled
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect();
        note(
            g,
            &format!(
                "left out: {} whose latest run did not publish ({}); stale compares the sources of published intervals; run them with `{}`",
                crate::report::out::plural(total, "interval", "intervals"),
                states.join(", "),
                crate::words::hint(&format!(
                    "create --dag {dag_id} --from {} --to {} --reprocess-behavior failed",
                    crate::words::shell_word(from),
                    crate::words::shell_word(to)
                ))
            ),
        );
    }
    let stale = crate::probe::survey(&project.root, &dag, &conf, &recorded);
    let what = format!(
        "no interval of DAG {dag_id} between --from {from} and --to {to} has a changed source ({} looked at)",
        crate::report::out::plural(
            i64::try_from(recorded.len()).unwrap_or(i64::MAX),
            "published interval",
            "published intervals"
        )
    );
    report::stale::write(
        &mut Sink::std(g.json, g.verbose),
        &stale,
        &Labeler::of(Some(&dag)),
        &what,
    )?;
    Ok(exit::OK)
}
