//! `/metrics`: the manifest's figures in Prometheus' text exposition format (version 0.0.4),
//! read at each scrape. A manifest that cannot be read still answers, with
//! `backfill_manifest_up 0`, so that an alert can say so.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{App, Unreadable};
use crate::manifest::status::Figures;

/// A label value, escaped as the format asks (backslash, double quote, line feed).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// One metric family: its help, type and samples (`labels`, value).
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// What a scrape read of the manifest.
#[derive(Default)]
pub(super) struct Scrape {
    figures: Figures,
    /// How old the oldest heartbeat of a running backfill is (milliseconds), by the lease rule
    /// at the manifest's clock, which wrote the heartbeats; `None` when none runs.
    oldest_heartbeat_age_ms: Option<i64>,
    /// `(dag, intervals)` waiting for their sources in backfills whose owner runs, by the lease
    /// rule: a killed backfill's intervals wait for no one until it is resumed.
    waiting_for_sources: Vec<(String, i64)>,
}

/// Reads the figures of a scrape, and judges the age of the oldest heartbeat as leases are
/// judged (see [`crate::reads::lease_ctx`]).
fn scrape(
    conn: &dyn crate::manifest::Reads,
    project: Option<&crate::project::Project>,
) -> crate::manifest::Result<Scrape> {
    let figures = conn.figures()?;
    let ctx = crate::reads::lease_ctx(project, conn)?;
    let mut waiting: BTreeMap<String, i64> = BTreeMap::new();
    for w in &figures.waiting_for_sources {
        if ctx.owner_alive(
            crate::state::BackfillState::Running,
            (w.owner_pid, w.owner_start),
            w.owner_host.as_deref(),
            w.heartbeat_at,
        ) {
            *waiting.entry(w.dag_id.clone()).or_default() += w.intervals;
        }
    }
    Ok(Scrape {
        oldest_heartbeat_age_ms: figures.oldest_heartbeat_ms.map(|h| ctx.heartbeat_age_ms(h)),
        waiting_for_sources: waiting.into_iter().collect(),
        figures,
    })
}

/// The exposition of what a scrape read (`None`: the manifest could not be read), with the
/// project's pool sizes.
pub(super) fn exposition(read: Option<&Scrape>, sizes: &BTreeMap<String, u32>) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "backfill_manifest_up",
        "gauge",
        "Whether the manifest could be read (1) or not (0) at this scrape.",
        &[(String::new(), if read.is_some() { 1.0 } else { 0.0 })],
    );
    let Some(Scrape {
        figures: f,
        oldest_heartbeat_age_ms,
        waiting_for_sources,
    }) = read
    else {
        return out;
    };
    let n = |v: i64| v as f64;
    family(
        &mut out,
        "backfill_backfills",
        "gauge",
        "Backfills in the manifest by state.",
        &f.backfills
            .iter()
            .map(|(s, c)| (format!("state=\"{}\"", label(s.as_str())), n(*c)))
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_intervals",
        "gauge",
        "Intervals of each DAG by the state of their latest run.",
        &f.intervals
            .iter()
            .map(|(d, s, c)| {
                (
                    format!("dag=\"{}\",state=\"{}\"", label(d), label(s.as_str())),
                    n(*c),
                )
            })
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_intervals_waiting_for_sources",
        "gauge",
        "Intervals waiting for their sources ([tasks.ready]) in backfills whose process runs, by DAG.",
        &waiting_for_sources
            .iter()
            .map(|(d, c)| (format!("dag=\"{}\"", label(d)), n(*c)))
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_not_ready_total",
        "counter",
        "Intervals not run because their sources were not ready when their wait ran out, by DAG.",
        &f.not_ready
            .iter()
            .map(|(d, c)| (format!("dag=\"{}\"", label(d)), n(*c)))
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_tries_running",
        "gauge",
        "Task tries running now, on every host.",
        &[(String::new(), n(f.tries_running))],
    );
    family(
        &mut out,
        "backfill_oldest_heartbeat_age_seconds",
        "gauge",
        "Seconds since the oldest heartbeat of a running backfill (0 when none runs).",
        &[(
            String::new(),
            oldest_heartbeat_age_ms.map_or(0.0, |age| age as f64 / 1000.0),
        )],
    );
    family(
        &mut out,
        "backfill_leases",
        "gauge",
        "Intervals leased by a backfill now.",
        &[(String::new(), n(f.leases))],
    );
    let mut used: BTreeMap<&str, i64> = sizes.keys().map(|k| (k.as_str(), 0)).collect();
    for (pool, c) in &f.pool_slots {
        used.insert(pool, *c);
    }
    family(
        &mut out,
        "backfill_pool_slots_used",
        "gauge",
        "Slots of each pool held by running tries.",
        &used
            .iter()
            .map(|(p, c)| (format!("pool=\"{}\"", label(p)), n(*c)))
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_pool_slots",
        "gauge",
        "Slots of each pool, as backfill.toml declares them.",
        &sizes
            .iter()
            .map(|(p, c)| (format!("pool=\"{}\"", label(p)), f64::from(*c)))
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_last_published_interval_end_seconds",
        "gauge",
        "End (unix seconds) of the latest interval of each DAG that its tasks published (a task without a gate publishes as it succeeds).",
        &f.last_published
            .iter()
            .map(|(d, end)| (format!("dag=\"{}\"", label(d)), n(*end)))
            .collect::<Vec<_>>(),
    );
    let mut by_rule: BTreeMap<(&str, String), i64> = BTreeMap::new();
    for (dag, reasons) in &f.rejections {
        for rule in crate::gate::rules_named(reasons) {
            *by_rule.entry((dag.as_str(), rule)).or_default() += 1;
        }
    }
    let kinds = ["inserted", "updated", "deleted", "unchanged"];
    family(
        &mut out,
        "backfill_merged_rows_total",
        "counter",
        "Rows the merges of each DAG's published tries inserted, updated, deleted and left unchanged (write = \"merge\").",
        &f.merged
            .iter()
            .flat_map(|(d, counts)| {
                kinds
                    .iter()
                    .zip(counts)
                    .map(move |(k, c)| (format!("dag=\"{}\",change=\"{k}\"", label(d)), n(*c)))
            })
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "backfill_rejections_total",
        "counter",
        "Task tries the gate rejected, by DAG and by the rule that rejected them.",
        &by_rule
            .iter()
            .map(|((d, r), c)| (format!("dag=\"{}\",rule=\"{}\"", label(d), label(r)), n(*c)))
            .collect::<Vec<_>>(),
    );
    let mut warned: BTreeMap<(&str, String), i64> = BTreeMap::new();
    for (dag, reasons) in &f.warnings {
        let warnings = reasons
            .split("; ")
            .filter_map(|r| r.strip_prefix(crate::gate::WARNING));
        for warning in warnings {
            for rule in crate::gate::rules_named(warning).into_iter().take(1) {
                *warned.entry((dag.as_str(), rule)).or_default() += 1;
            }
        }
    }
    family(
        &mut out,
        "backfill_warnings_total",
        "counter",
        "Warnings the gate published tries with, by DAG and by the rule that warned.",
        &warned
            .iter()
            .map(|((d, r), c)| (format!("dag=\"{}\",rule=\"{}\"", label(d), label(r)), n(*c)))
            .collect::<Vec<_>>(),
    );
    out
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let read = match app.read(scrape).await {
        Ok(Some(read)) => Some(read),
        // No manifest yet: nothing recorded, nothing to judge.
        Ok(None) => Some(Scrape::default()),
        Err(Unreadable(why)) => {
            tracing::warn!("/metrics: {why}");
            None
        }
    };
    let sizes = app
        .project
        .as_ref()
        .map(|p| p.pools.clone())
        .unwrap_or_default();
    let body = exposition(read.as_ref(), &sizes);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn an_unreadable_manifest_says_so() {
        let text = exposition(None, &BTreeMap::new());
        assert!(text.ends_with("backfill_manifest_up 0\n"), "{text}");
    }
}
