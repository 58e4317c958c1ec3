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

/// The exposition of `f`, read at `now_ms`, with the project's pool sizes.
pub(super) fn exposition(
    f: Option<&Figures>,
    now_ms: i64,
    sizes: &BTreeMap<String, u32>,
) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "backfill_manifest_up",
        "gauge",
        "Whether the manifest could be read (1) or not (0) at this scrape.",
        &[(String::new(), if f.is_some() { 1.0 } else { 0.0 })],
    );
    let Some(f) = f else {
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
            f.oldest_heartbeat_ms
                .map_or(0.0, |h| ((now_ms - h).max(0) as f64) / 1000.0),
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
        "End (unix seconds) of the latest interval of each DAG that a task published.",
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
    out
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    // Ages are counted on the manifest's clock (the database's on PostgreSQL), which wrote the
    // heartbeats.
    let read = app
        .read(|conn, _| Ok((conn.figures()?, conn.clock_ms(crate::clock::now_ms())?)))
        .await;
    let (figures, now_ms) = match read {
        Ok(Some((f, now_ms))) => (Some(f), now_ms),
        Ok(None) => (Some(Figures::default()), crate::clock::now_ms()),
        Err(Unreadable(why)) => {
            tracing::warn!("/metrics: {why}");
            (None, crate::clock::now_ms())
        }
    };
    let sizes = app
        .project
        .as_ref()
        .map(|p| p.pools.clone())
        .unwrap_or_default();
    let body = exposition(figures.as_ref(), now_ms, &sizes);
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
        let text = exposition(None, 0, &BTreeMap::new());
        assert!(text.ends_with("backfill_manifest_up 0\n"), "{text}");
    }
}
