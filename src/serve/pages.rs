//! The status page's HTML: server-rendered by minijinja templates embedded in the binary, HTML
//! auto-escaping on (every value from the manifest or a DAG file is text, never markup), strict
//! undefined values (a template that names a missing value fails, it does not print nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;
use serde_json::{Value, json};

use super::{App, Unreadable};
use crate::interval::from_unix;
use crate::manifest::leases::LeaseCtx;
use crate::manifest::queries::{BackfillSummary, IntervalDetail, RunHistory};
use crate::manifest::status::LeaseView;
use crate::report::Labeler;
use crate::report::cells::{Cell, tally};

/// Backfills on one page of the list.
const BACKFILLS_PER_PAGE: usize = 50;
/// Cells on one page of a backfill.
pub(crate) const CELLS_PER_PAGE: usize = 2_000;
/// Interval starts on one page of a DAG's calendar.
const DAG_STARTS_PER_PAGE: i64 = 500;
/// The most of a try's log a page shows: its end.
const LOG_TAIL: u64 = 4_096;

/// The templates.
pub(super) struct Pages {
    env: Environment<'static>,
    /// The manifest every page names (a URL without its password).
    manifest: String,
}

impl Pages {
    pub(crate) fn new(manifest: String) -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        for (name, source) in [
            ("layout.html", include_str!("templates/layout.html")),
            ("backfills.html", include_str!("templates/backfills.html")),
            ("backfill.html", include_str!("templates/backfill.html")),
            ("interval.html", include_str!("templates/interval.html")),
            ("dag.html", include_str!("templates/dag.html")),
            ("pools.html", include_str!("templates/pools.html")),
            ("message.html", include_str!("templates/message.html")),
        ] {
            env.add_template(name, source)
                .expect("the embedded templates parse (tested)");
        }
        Self { env, manifest }
    }

    /// A page: `template` rendered with `ctx` and the page's common values. Its footer says when
    /// it was read: `judged_at`, the manifest's clock at which the page judged owners and
    /// heartbeats (unix milliseconds), so that the time agrees with the ages shown; a page that
    /// judged none says when it was made.
    fn render(
        &self,
        status: StatusCode,
        template: &str,
        mut ctx: Value,
        live: bool,
        judged_at: Option<i64>,
    ) -> Response {
        if let Value::Object(m) = &mut ctx {
            m.insert("live".into(), json!(live));
            m.insert("manifest".into(), json!(self.manifest));
            m.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
            let read_at = judged_at.unwrap_or_else(crate::clock::now_ms);
            m.insert("now".into(), json!(at_ms(read_at)));
        }
        let rendered = self
            .env
            .get_template(template)
            .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(&ctx))));
        match rendered {
            Ok(html) => (
                status,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                html,
            )
                .into_response(),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("cannot render the page: {e:#}"),
            )
                .into_response(),
        }
    }

    /// A page that says one thing: an error, a missing backfill.
    pub(crate) fn message(&self, status: StatusCode, title: &str, text: &str) -> Response {
        self.render(
            status,
            "message.html",
            json!({ "title": title, "text": text, "code": status.as_u16() }),
            false,
            None,
        )
    }

    /// The page that says there is no such backfill (404).
    fn no_backfill(&self, id: i64) -> Response {
        self.message(
            StatusCode::NOT_FOUND,
            "No such backfill",
            &format!("The manifest has no backfill {id}."),
        )
    }

    /// The page that says the manifest cannot be read; it reloads itself until it can.
    fn unreadable(&self, why: &str) -> Response {
        self.render(
            StatusCode::SERVICE_UNAVAILABLE,
            "message.html",
            json!({
                "title": "Cannot read the manifest",
                "text": format!("{why}. This page tries again every few seconds."),
                "code": 503,
            }),
            true,
            None,
        )
    }
}

/// Milliseconds since the epoch as RFC 3339.
fn at_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(crate::interval::rfc3339)
        .unwrap_or_default()
}

/// A duration for people: `950 ms`, `4.0 s`, `3 min 20 s`, `2 h 5 min`.
fn took(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// `?page=` of the paged views (from 1).
#[derive(serde::Deserialize, Default)]
pub(super) struct Paging {
    page: Option<u32>,
}

/// A query the page does not take (a page that is not a number, a key given twice): 400.
fn bad_query(app: &App, takes: &str) -> Response {
    app.pages.message(
        StatusCode::BAD_REQUEST,
        "Not a query of this page",
        &format!("This page takes {takes}."),
    )
}

/// Page numbers around `page` of `pages`, for the pager.
fn pager(page: usize, pages: usize) -> Value {
    json!({
        "page": page,
        "pages": pages,
        "previous": (page > 1).then(|| page - 1),
        "next": (page < pages).then(|| page + 1),
    })
}

/// What the list says of a backfill, judged by `ctx` (the lease rule at the manifest's clock),
/// which counts the age of its heartbeat.
fn backfill_row(
    b: &BackfillSummary,
    labels: &Labeler,
    eta: Option<f64>,
    hosts: &[String],
    ctx: &LeaseCtx,
) -> Value {
    let c = &b.intervals;
    let (from, to) = crate::report::list::range_labels(b, labels);
    let done = c.succeeded + c.failed + c.rejected + c.cancelled + c.skipped;
    // Segments of the progress bar, in percent of the plan.
    let total = c.total.max(1) as f64;
    let mut x = 0.0;
    let mut bar = Vec::new();
    for (state, n) in [
        ("succeeded", c.succeeded),
        ("rejected", c.rejected),
        ("failed", c.failed),
        ("cancelled", c.cancelled),
        ("skipped", c.skipped),
        ("running", c.running),
    ] {
        if n > 0 {
            let w = n as f64 * 100.0 / total;
            bar.push(json!({ "state": state, "x": format!("{x:.2}"), "w": format!("{w:.2}") }));
            x += w;
        }
    }
    json!({
        "id": b.id,
        "dag": b.dag_id,
        "from": from,
        "to": to,
        "state": crate::report::list::state_text(b),
        "raw_state": b.state.to_string(),
        "total": c.total,
        "done": done,
        "succeeded": c.succeeded,
        "rejected": c.rejected,
        "failed": c.failed,
        "cancelled": c.cancelled,
        "skipped": c.skipped,
        "running": c.running,
        "pending": c.pending,
        "bar": bar,
        "eta": eta.map(|s| took((s * 1000.0) as i64)),
        "hosts": hosts,
        "heartbeat_age": b.heartbeat_at.filter(|_| b.state == crate::state::BackfillState::Running)
            .map(|h| took(ctx.heartbeat_age_ms(h))),
        "created_at": b.created_at,
        "finished_at": b.finished_at,
        "reprocess": b.reprocess_behavior,
        "max_active_runs": b.max_active_runs,
    })
}

/// How long the rest of a running backfill will take, from its DAG's history.
fn eta(
    conn: &dyn crate::manifest::Reads,
    project: Option<&crate::project::Project>,
    b: &BackfillSummary,
) -> crate::manifest::Result<Option<f64>> {
    if b.state != crate::state::BackfillState::Running {
        return Ok(None);
    }
    let (Some(project), left) = (project, b.intervals.pending + b.intervals.running) else {
        return Ok(None);
    };
    let Ok(dag) = project.dag(&b.dag_id) else {
        return Ok(None);
    };
    let history = crate::estimate::history(conn, &dag)?;
    let e = crate::estimate::estimate(
        &dag,
        &history,
        usize::try_from(left).unwrap_or(0),
        b.max_active_runs,
        (&project.pools, &project.pool_rates),
    );
    Ok(e.seconds)
}

/// `?dag=`, `?state=` and `?page=` of the list.
#[derive(serde::Deserialize, Default)]
pub(super) struct ListFilter {
    dag: Option<String>,
    state: Option<String>,
    page: Option<u32>,
}

/// A page of the list as read.
struct ListPage {
    /// Its backfills, as [`backfill_row`] says them.
    rows: Vec<Value>,
    /// Every DAG the manifest has a backfill of, for the filter.
    dags: BTreeSet<String>,
    /// The backfills the filter keeps, on every page.
    count: usize,
    /// The page shown (from 1), of `pages`.
    page: usize,
    pages: usize,
    /// The manifest's clock at which its owners were judged; `None` without a manifest.
    judged_at: Option<i64>,
}

impl ListPage {
    /// The list of a manifest that does not exist yet.
    fn empty() -> Self {
        Self {
            rows: Vec::new(),
            dags: BTreeSet::new(),
            count: 0,
            page: 1,
            pages: 1,
            judged_at: None,
        }
    }
}

/// Reads page `asked` of the backfills of `dag` in `state` (each when given), newest first.
/// Filtered and paged by what the backfills table says; then only the page's backfills have
/// their intervals counted and their owners judged.
fn read_list_page(
    conn: &dyn crate::manifest::Reads,
    project: Option<&crate::project::Project>,
    dag: Option<&str>,
    state: Option<&str>,
    asked: Option<u32>,
) -> crate::manifest::Result<ListPage> {
    let heads = conn.backfill_heads()?;
    let dags: BTreeSet<String> = heads.iter().map(|h| h.1.clone()).collect();
    let ids: Vec<i64> = heads
        .into_iter()
        .rev()
        .filter(|h| dag.is_none_or(|d| d == h.1))
        .filter(|h| state.is_none_or(|s| s == h.2.to_string()))
        .map(|h| h.0)
        .collect();
    let count = ids.len();
    let pages = count.div_ceil(BACKFILLS_PER_PAGE).max(1);
    let page = (asked.unwrap_or(1) as usize).clamp(1, pages);
    let mut backfills: Vec<BackfillSummary> = Vec::new();
    for id in ids
        .into_iter()
        .skip((page - 1) * BACKFILLS_PER_PAGE)
        .take(BACKFILLS_PER_PAGE)
    {
        backfills.extend(conn.backfill_summary(id)?);
    }
    let ctx = crate::reads::lease_ctx(project, conn)?;
    crate::reads::judge_owners(&mut backfills, &ctx);
    let mut rows = Vec::with_capacity(backfills.len());
    let mut labels: BTreeMap<String, Labeler> = BTreeMap::new();
    for b in &backfills {
        let l = *labels
            .entry(b.dag_id.clone())
            .or_insert_with(|| Labeler::of(project.and_then(|p| p.dag(&b.dag_id).ok()).as_ref()));
        let hosts = running_hosts(conn, b)?;
        rows.push(backfill_row(b, &l, eta(conn, project, b)?, &hosts, &ctx));
    }
    Ok(ListPage {
        rows,
        dags,
        count,
        page,
        pages,
        judged_at: Some(ctx.now_ms),
    })
}

/// The hosts a running backfill runs on, by their names: its owner's, then its workers'.
/// None when it is not running.
fn running_hosts(
    conn: &dyn crate::manifest::Reads,
    b: &BackfillSummary,
) -> crate::manifest::Result<Vec<String>> {
    let mut hosts: Vec<String> = Vec::new();
    if b.state != crate::state::BackfillState::Running {
        return Ok(hosts);
    }
    if let Some(h) = &b.owner_host {
        hosts.push(crate::liveness::host_name(h).to_string());
    }
    for w in conn.workers(b.id)? {
        if let Some(h) = w.host.as_deref() {
            let h = crate::liveness::host_name(h).to_string();
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
    }
    Ok(hosts)
}

/// `/`: the backfills, newest first, filtered by DAG and state.
pub(super) async fn backfills(
    State(app): State<Arc<App>>,
    f: Result<Query<ListFilter>, QueryRejection>,
) -> Response {
    let Ok(Query(f)) = f else {
        return bad_query(
            &app,
            "dag=DAG, state=STATE and page=N (a page number from 1)",
        );
    };
    let dag = f.dag.clone().filter(|d| !d.is_empty());
    let state = f.state.clone().filter(|s| !s.is_empty());
    let read = app
        .read(move |conn, project| {
            read_list_page(conn, project, dag.as_deref(), state.as_deref(), f.page)
        })
        .await;
    let list = match read {
        Ok(Some(found)) => found,
        Ok(None) => ListPage::empty(),
        Err(Unreadable(why)) => return app.pages.unreadable(&why),
    };
    let live = list.rows.iter().any(|r| r["raw_state"] == "running");
    app.pages.render(
        StatusCode::OK,
        "backfills.html",
        json!({
            "title": "Backfills",
            "rows": list.rows,
            "count": list.count,
            "dags": list.dags,
            "states": ["running", "completed", "failed", "cancelled"],
            "dag": f.dag.unwrap_or_default(),
            "state": f.state.unwrap_or_default(),
            "pager": pager(list.page, list.pages),
        }),
        live,
        list.judged_at,
    )
}

/// A cell of a backfill's grid; `kept`, the rows published for a rejected or failed interval,
/// which stay.
fn cell(i: &IntervalDetail, labels: &Labeler, kept: Option<i64>) -> Value {
    let c = Cell::of(i);
    let label = labels.label(i.start.0);
    let mut title = format!("{label}: {}", c.words());
    // A failure's error says why (its reasons may be an earlier task's warnings).
    let waiting = match &i.state {
        Some(s @ crate::state::IntervalState::WaitingForSources(_)) => Some(s.to_string()),
        _ => None,
    };
    let why = match c {
        Cell::Failed => i.error.as_deref().or(i.reasons.as_deref()),
        // Not ready: what its check answered.
        Cell::Skipped if !i.ready.is_empty() => i.error.as_deref().or(i.reason.as_deref()),
        Cell::Pending if waiting.is_some() => waiting.as_deref(),
        _ => i
            .reason
            .as_deref()
            .or(i.reasons.as_deref())
            .or(i.error.as_deref()),
    };
    if let Some(r) = why {
        title.push_str(" · ");
        title.push_str(&r.chars().take(200).collect::<String>());
    }
    let kept = kept.filter(|_| matches!(c, Cell::Rejected | Cell::Failed));
    if let Some(rows) = kept {
        title.push_str(&format!(" · {}", still_published(rows)));
    }
    let start = crate::interval::rfc3339(i.start.0);
    json!({
        "start": start,
        "label": label,
        "state": c.name(),
        "words": c.words(),
        "title": title,
        "why": why,
        "kept": kept.map(still_published),
    })
}

/// What stays published of a rejected or failed interval.
fn still_published(rows: i64) -> String {
    format!(
        "{} stay published",
        crate::report::out::plural(rows, "row", "rows")
    )
}

/// A backfill's cells in rows of a natural group (a week of days, a day of hours, a year of
/// months, else ten), each row headed by the label of its first interval.
fn grid_rows(cells: &[Value], intervals: &[&IntervalDetail]) -> Vec<Value> {
    cells
        .chunks(crate::report::cells::natural_group(intervals))
        .map(|row| json!({ "label": row[0]["label"], "cells": row }))
        .collect()
}

/// `/backfills/ID`: one cell per interval, a page of them at a time.
pub(super) async fn backfill(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    p: Result<Query<Paging>, QueryRejection>,
) -> Response {
    let Ok(Query(p)) = p else {
        return bad_query(&app, "page=N (a page number from 1)");
    };
    let Ok(id) = id.parse::<i64>() else {
        return app.pages.message(
            StatusCode::BAD_REQUEST,
            "Not a backfill id",
            &format!("`{id}` is not a backfill id (a number)."),
        );
    };
    let asked = i64::from(p.page.unwrap_or(1).max(1));
    let read = app
        .read(move |conn, project| {
            // Only the page's intervals are read; the counts are of the whole backfill.
            let per_page = CELLS_PER_PAGE as i64;
            let page_of = |page: i64| {
                crate::reads::shown_page(conn, project, id, (page - 1) * per_page, per_page)
            };
            let Some(mut s) = page_of(asked)? else {
                return Ok(None);
            };
            let total = s.detail.backfill.intervals.total.max(0);
            let pages = ((total + per_page - 1) / per_page).max(1);
            let mut page = asked;
            if asked > pages {
                page = pages;
                s = match page_of(page)? {
                    Some(s) => s,
                    None => return Ok(None),
                };
            }
            let e = eta(conn, project, &s.detail.backfill)?;
            // What the page's rejected and failed intervals left published.
            let starts = s
                .detail
                .interval_details
                .iter()
                .map(|i| i.start.0.timestamp());
            let kept = match (starts.clone().min(), starts.max()) {
                (Some(lo), Some(hi)) => conn.published_starts(&s.detail.backfill.dag_id, lo, hi)?,
                _ => Vec::new(),
            };
            Ok(Some((s, e, page, pages, kept)))
        })
        .await;
    let (shown, eta, page, pages, kept) = match read {
        Ok(Some(Some(found))) => found,
        Ok(_) => return app.pages.no_backfill(id),
        Err(Unreadable(why)) => return app.pages.unreadable(&why),
    };
    let labels = Labeler::of(shown.dag.as_ref());
    let d = &shown.detail;
    let mut intervals: Vec<&IntervalDetail> = d.interval_details.iter().collect();
    intervals.sort_by_key(|i| i.start.0);
    let kept: std::collections::HashMap<i64, i64> = kept.into_iter().collect();
    let cells: Vec<Value> = intervals
        .iter()
        .map(|i| cell(i, &labels, kept.get(&i.start.0.timestamp()).copied()))
        .collect();
    let went_wrong: Vec<&Value> = cells
        .iter()
        .filter(|c| matches!(c["state"].as_str(), Some("rejected" | "failed")))
        .collect();
    let legend: Vec<Value> = tally(d.interval_details.iter())
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| json!({ "state": c.name(), "words": c.words(), "count": n }))
        .collect();
    let workers: Vec<Value> = d
        .workers
        .iter()
        .map(|w| {
            json!({
                "id": w.id, "host": w.host, "pid": w.pid, "state": w.state,
                "alive": w.alive, "runs": w.runs, "max_active_runs": w.max_active_runs,
                "started_at": w.started_at,
            })
        })
        .collect();
    let hosts: Vec<String> = d
        .backfill
        .owner_host
        .iter()
        .map(|h| crate::liveness::host_name(h).to_string())
        .collect();
    let live = d.backfill.state == crate::state::BackfillState::Running;
    let members: Vec<Value> = shown
        .members
        .iter()
        .map(|m| json!({ "id": m.backfill.id, "dag": m.backfill.dag_id, "state": m.backfill.state.to_string() }))
        .collect();
    app.pages.render(
        StatusCode::OK,
        "backfill.html",
        json!({
            "title": format!("Backfill {id} of {}", d.backfill.dag_id),
            "b": backfill_row(&d.backfill, &labels, eta, &hosts, &shown.ctx),
            "batch_size": d.backfill.batch_size,
            "run_backwards": d.backfill.run_backwards,
            "cells": cells,
            "rows": grid_rows(&cells, &intervals),
            "went_wrong": went_wrong,
            "legend": legend,
            "workers": workers,
            "members": members,
            "pager": pager(
                usize::try_from(page).unwrap_or(1),
                usize::try_from(pages).unwrap_or(1)
            ),
        }),
        live,
        Some(shown.ctx.now_ms),
    )
}

/// The end of a try's log, when it is a file of this project's log folder on this host. The
/// manifest names the file, and another host may write the manifest: nothing outside the log
/// folder (`logs`, canonical) is read, nor anything but a regular file (a FIFO would block the
/// read for ever).
fn log_tail(logs: &std::path::Path, path: &str) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::path::Path::new(path).canonicalize().ok()?;
    if !path.starts_with(logs) || !std::fs::metadata(&path).ok()?.is_file() {
        return None;
    }
    // Without blocking, should it have become a FIFO meanwhile.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let len = meta.len();
    let from = len.saturating_sub(LOG_TAIL);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    f.take(LOG_TAIL).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Some(if from > 0 {
        // From the first whole line.
        text.split_once('\n')
            .map_or(text.clone(), |(_, rest)| rest.to_string())
    } else {
        text
    })
}

/// `/backfills/ID/intervals/START`: the interval's tries in this backfill, and its runs in
/// every backfill of the manifest.
pub(super) async fn interval(
    State(app): State<Arc<App>>,
    Path((id, start)): Path<(String, String)>,
) -> Response {
    let (Ok(id), Ok(at)) = (id.parse::<i64>(), DateTime::parse_from_rfc3339(&start)) else {
        return app.pages.message(
            StatusCode::BAD_REQUEST,
            "Not an interval",
            &format!(
                "`{id}/intervals/{start}` names no interval: give a backfill id and an interval's start in RFC 3339, such as /backfills/7/intervals/2026-09-01T00:00:00Z."
            ),
        );
    };
    let at = at.with_timezone(&Utc);
    let unix = at.timestamp();
    let read = app
        .read(move |conn, project| {
            let Some(b) = conn.backfill(id)? else {
                return Ok(None);
            };
            let tries = conn.interval_tries(id, unix)?;
            let history = conn.run_history(&b.dag_id, unix, unix)?;
            let dag = project.and_then(|p| p.dag(&b.dag_id).ok());
            // The logs' ends, read here, off the threads that answer requests.
            let logs = project.and_then(|p| p.logs_dir.canonicalize().ok());
            let tails: Vec<Option<String>> = tries
                .iter()
                .map(|t| log_tail(logs.as_deref()?, t.log.as_deref()?))
                .collect();
            Ok(Some((b.dag_id, tries, tails, history, dag)))
        })
        .await;
    let (dag_id, tries, tails, history, dag) = match read {
        Ok(Some(Some(found))) => found,
        Ok(_) => return app.pages.no_backfill(id),
        Err(Unreadable(why)) => return app.pages.unreadable(&why),
    };
    let labels = Labeler::of(dag.as_ref());
    let tries: Vec<Value> = tries
        .iter()
        .zip(tails)
        .map(|(t, tail)| {
            json!({
                "run_id": t.run_id, "run_state": t.run_state.to_string(), "task": t.task,
                "try_number": t.try_number, "state": t.state.to_string(), "host": t.host.as_deref().map(crate::liveness::host_name),
                "started_at": t.started_at, "duration": t.duration_ms.map(took),
                "rows": t.rows, "changes": t.changes, "source_rows": t.source_rows, "previous_rows": t.previous_rows,
                "verdict": t.verdict, "reasons": t.reasons, "error": t.error,
                "batch": t.batch, "log": t.log, "log_tail": tail,
            })
        })
        .collect();
    let runs: Vec<Value> = history
        .iter()
        .map(|r: &RunHistory| {
            json!({
                "run_id": r.run_id, "backfill_id": r.backfill_id, "state": r.state.to_string(),
                "cell": Cell::of_run(Some(r.state), r.verdict.map(|v| v.verdict), r.warned).name(),
                "started_at": r.started_at, "duration": r.duration_ms.map(took), "tries": r.tries,
                "rows": crate::report::grid::rows_cell(r.rows, r.rejected_rows),
                "verdict": r.verdict, "reasons": r.reasons, "error": r.error,
            })
        })
        .collect();
    app.pages.render(
        StatusCode::OK,
        "interval.html",
        json!({
            "title": format!("{} · backfill {id}", labels.label(at)),
            "id": id,
            "dag": dag_id,
            "label": labels.label(at),
            "start": crate::interval::rfc3339(at),
            "tries": tries,
            "runs": runs,
        }),
        false,
        None,
    )
}

/// A calendar cell of a DAG.
#[derive(Serialize)]
struct DayCell {
    start: String,
    label: String,
    state: &'static str,
    title: String,
    /// The backfill of the interval's latest run.
    backfill: Option<i64>,
    /// Its latest run was rejected or failed and an earlier run's rows stay published.
    kept: bool,
}

/// A page of a DAG's calendar as the manifest has it.
struct DagPage {
    /// The runs of the page's interval starts, by start, then attempt.
    history: Vec<RunHistory>,
    /// The page's published starts, with the rows published.
    published: BTreeMap<i64, i64>,
    /// The DAG, when the project has it.
    dag: Option<crate::project::Dag>,
    /// Whether older starts are left for the next page.
    more: bool,
    /// The oldest and the newest start of the page (unix seconds).
    lo: i64,
    hi: i64,
}

/// Reads a page of `dag_id`'s calendar: [`DAG_STARTS_PER_PAGE`] of its interval starts that
/// ran, newest first from the `skip`-th; `None` when there are none.
fn read_dag_page(
    conn: &dyn crate::manifest::Reads,
    project: Option<&crate::project::Project>,
    dag_id: &str,
    skip: i64,
) -> crate::manifest::Result<Option<DagPage>> {
    let starts = conn.dag_starts(dag_id, DAG_STARTS_PER_PAGE + 1, skip)?;
    let more = starts.len() > usize::try_from(DAG_STARTS_PER_PAGE).unwrap_or(0);
    let starts = &starts[..starts.len().min(DAG_STARTS_PER_PAGE as usize)];
    let (Some(&hi), Some(&lo)) = (starts.first(), starts.last()) else {
        return Ok(None);
    };
    Ok(Some(DagPage {
        history: conn.run_history(dag_id, lo, hi)?,
        published: conn.published_starts(dag_id, lo, hi)?.into_iter().collect(),
        dag: project.and_then(|p| p.dag(dag_id).ok()),
        more,
        lo,
        hi,
    }))
}

/// The cells of a page of the calendar, in time order: the latest run of each start, and the
/// schedule's intervals in the page's span that never ran, when the DAG is known.
fn day_cells(page: &DagPage, labels: &Labeler) -> Vec<DayCell> {
    // The latest run of each start (the history is by start, then attempt).
    let mut latest: BTreeMap<i64, &RunHistory> = BTreeMap::new();
    for r in &page.history {
        latest.insert(r.start.0.timestamp(), r);
    }
    let mut starts: Vec<i64> = latest.keys().copied().collect();
    if let Some(d) = &page.dag {
        let never: Vec<i64> = d
            .schedule
            .fire_times(from_unix(page.lo), from_unix(page.hi))
            .take(10_000)
            .map(|t| t.timestamp())
            .filter(|t| !latest.contains_key(t))
            .collect();
        starts.extend(never);
        starts.sort_unstable();
    }
    starts
        .iter()
        .map(|s| day_cell(*s, latest.get(s).copied(), page.published.get(s), labels))
        .collect()
}

/// The cell of the interval that starts at `start`: its latest run (`None`: it never ran), and
/// the rows it published, if it is published.
fn day_cell(
    start: i64,
    latest: Option<&RunHistory>,
    published: Option<&i64>,
    labels: &Labeler,
) -> DayCell {
    let start = from_unix(start);
    let label = labels.label(start);
    let Some(r) = latest else {
        return DayCell {
            start: crate::interval::rfc3339(start),
            title: format!("{label}: never run"),
            label,
            state: "never",
            backfill: None,
            kept: false,
        };
    };
    let c = Cell::of_run(Some(r.state), r.verdict.map(|v| v.verdict), r.warned);
    let mut title = format!("{label}: {}", c.words());
    if let Some(rows) = published {
        title.push_str(&format!(" · published, {rows} rows"));
    }
    if let Some(why) = r.reasons.as_deref().or(r.error.as_deref()) {
        title.push_str(" · ");
        title.push_str(&why.chars().take(200).collect::<String>());
    }
    title.push_str(&format!(" · backfill {}", r.backfill_id));
    DayCell {
        start: crate::interval::rfc3339(start),
        label,
        state: c.name(),
        title,
        backfill: Some(r.backfill_id),
        kept: published.is_some() && matches!(c, Cell::Rejected | Cell::Failed),
    }
}

/// Rows of the calendar: a month of days (`daily`), or a day of shorter intervals.
fn calendar_rows(cells: &[DayCell], daily: bool) -> Vec<Value> {
    let mut rows: Vec<Value> = Vec::new();
    let mut current: Option<(String, Vec<&DayCell>)> = None;
    for c in cells {
        let key = if daily {
            c.label.get(..7).unwrap_or(&c.label).to_string()
        } else {
            c.label.get(..10).unwrap_or(&c.label).to_string()
        };
        match &mut current {
            Some((k, v)) if *k == key => v.push(c),
            _ => {
                if let Some((k, v)) = current.take() {
                    rows.push(json!({ "label": k, "cells": v }));
                }
                current = Some((key, vec![c]));
            }
        }
    }
    if let Some((k, v)) = current {
        rows.push(json!({ "label": k, "cells": v }));
    }
    rows
}

/// The calendar's legend: each state its cells are in, with its words and how many they are.
fn calendar_legend(cells: &[DayCell]) -> Vec<Value> {
    let mut legend: BTreeMap<&str, usize> = BTreeMap::new();
    for c in cells {
        *legend.entry(c.state).or_default() += 1;
    }
    let words = |s: &str| {
        Cell::ALL
            .iter()
            .find(|c| c.name() == s)
            .map_or("never run", |c| c.words())
    };
    legend
        .into_iter()
        .map(|(s, n)| json!({ "state": s, "words": words(s), "count": n }))
        .collect()
}

/// `/dags/DAG`: the DAG's partitions over time, newest page first: the latest run of each
/// interval, whether it is published, and the intervals of its schedule that never ran.
pub(super) async fn dag(
    State(app): State<Arc<App>>,
    Path(dag_id): Path<String>,
    p: Result<Query<Paging>, QueryRejection>,
) -> Response {
    let Ok(Query(p)) = p else {
        return bad_query(&app, "page=N (a page number from 1)");
    };
    // A u32 page: its offset fits an i64, and the next page number a u64.
    let page = u64::from(p.page.unwrap_or(1).max(1));
    let skip = i64::from(p.page.unwrap_or(1).max(1) - 1) * DAG_STARTS_PER_PAGE;
    let id = dag_id.clone();
    let read = app
        .read(move |conn, project| read_dag_page(conn, project, &id, skip))
        .await;
    let found = match read {
        Ok(Some(Some(found))) => found,
        Ok(_) => {
            return app.pages.message(
                StatusCode::NOT_FOUND,
                "No runs of this DAG",
                &format!(
                    "The manifest has no run of DAG `{dag_id}`{}.",
                    if page > 1 { " on this page" } else { "" }
                ),
            );
        }
        Err(Unreadable(why)) => return app.pages.unreadable(&why),
    };
    let dag = found.dag.as_ref();
    let cells = day_cells(&found, &Labeler::of(dag));
    let daily = dag.is_none_or(|d| d.schedule.at_most_daily());
    app.pages.render(
        StatusCode::OK,
        "dag.html",
        json!({
            "title": format!("DAG {dag_id}"),
            "dag": dag_id,
            "description": dag.and_then(|d| d.description.clone()),
            "schedule": dag.map(|d| d.schedule.expr().to_string()),
            "rows": calendar_rows(&cells, daily),
            "legend": calendar_legend(&cells),
            "kept": cells.iter().any(|c| c.kept),
            "known": dag.is_some(),
            "pager": json!({
                "page": page,
                "previous": (page > 1).then(|| page - 1),
                "next": found.more.then_some(page + 1),
            }),
        }),
        false,
        None,
    )
}

/// A row of the leases held: a backfill's leases, its owner, and how its heartbeat stands, by
/// the lease rule at the manifest's clock (`ctx`).
fn lease_row(l: &LeaseView, ctx: &LeaseCtx) -> Value {
    let health = ctx.health(
        l.backfill_state,
        (l.owner_pid, l.owner_start),
        l.owner_host.as_deref(),
        l.heartbeat_ms,
    );
    json!({
        "backfill_id": l.backfill_id, "dag": l.dag_id, "leases": l.leases,
        "first": l.first.to_string(), "last": l.last.to_string(),
        "host": l.owner_host.as_deref().map(crate::liveness::host_name), "pid": l.owner_pid,
        "heartbeat_age": l.heartbeat_ms.map(|h| took(ctx.heartbeat_age_ms(h))),
        "health": health, "state": l.backfill_state,
    })
}

/// `/pools`: the pools' slots in use and who holds them; the leases held and how fresh their
/// owners' heartbeats are.
pub(super) async fn pools(State(app): State<Arc<App>>) -> Response {
    let read = app
        .read(|conn, project| {
            Ok((
                conn.pool_slots()?,
                conn.lease_views()?,
                crate::reads::lease_ctx(project, conn)?,
            ))
        })
        .await;
    let (slots, leases, judged_at) = match read {
        Ok(Some((slots, leases, ctx))) => (
            slots,
            leases
                .iter()
                .map(|l| lease_row(l, &ctx))
                .collect::<Vec<_>>(),
            Some(ctx.now_ms),
        ),
        // No manifest yet: no lease to judge.
        Ok(None) => (Vec::new(), Vec::new(), None),
        Err(Unreadable(why)) => return app.pages.unreadable(&why),
    };
    let sizes: BTreeMap<String, u32> = app
        .project
        .as_ref()
        .map(|p| p.pools.clone())
        .unwrap_or_default();
    let mut pools: BTreeMap<String, (Option<u32>, Vec<Value>)> = sizes
        .iter()
        .map(|(k, v)| (k.clone(), (Some(*v), Vec::new())))
        .collect();
    for s in &slots {
        pools
            .entry(s.pool.clone())
            .or_insert((None, Vec::new()))
            .1
            .push(json!({
                "backfill_id": s.backfill_id, "try_id": s.try_id, "dag": s.dag_id,
                "interval": s.interval_start.to_string(), "task": s.task,
                "host": s.host.as_deref().map(crate::liveness::host_name), "taken_at": s.taken_at,
            }));
    }
    let rates = app
        .project
        .as_ref()
        .map(|p| p.pool_rates.clone())
        .unwrap_or_default();
    let pools: Vec<Value> = pools
        .into_iter()
        .map(|(name, (size, holders))| {
            let rate = rates.get(&name).map(|r| {
                format!(
                    "{} per {}",
                    crate::report::out::plural(i64::from(r.starts), "start", "starts"),
                    humantime::format_duration(r.per)
                )
            });
            json!({ "name": name, "size": size, "rate": rate, "used": holders.len(), "holders": holders })
        })
        .collect();
    let live = leases.iter().any(|l| l["state"] == "running");
    let timeout = crate::reads::lease_timeout(app.project.as_ref());
    app.pages.render(
        StatusCode::OK,
        "pools.html",
        json!({
            "title": "Pools and leases",
            "pools": pools,
            "leases": leases,
            "timeout": took(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        }),
        live,
        judged_at,
    )
}

/// A method other than GET or HEAD.
pub(super) async fn not_allowed(State(app): State<Arc<App>>) -> Response {
    let mut r = app.pages.message(
        StatusCode::METHOD_NOT_ALLOWED,
        "Read-only",
        "This server only reads: every address answers GET and HEAD.",
    );
    r.headers_mut().insert(
        header::ALLOW,
        axum::http::HeaderValue::from_static("GET, HEAD"),
    );
    r
}

/// Any other address.
pub(super) async fn not_found(State(app): State<Arc<App>>) -> Response {
    app.pages.message(
        StatusCode::NOT_FOUND,
        "Not found",
        "This server has no such page. The backfills are at /.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_escape() {
        let pages = Pages::new(String::new());
        let r = pages.message(StatusCode::NOT_FOUND, "<script>alert(1)</script>", "a & b");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(took(950), "950 ms");
        assert_eq!(took(4_012), "4.0 s");
        assert_eq!(took(200_000), "3 min 20 s");
        assert_eq!(took(7_500_000), "2 h 5 min");
    }
}
