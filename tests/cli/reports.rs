//! The manifest's views for people (docs/manifest.md, "Querying the manifest"): on either engine
//! their columns are the documented ones, they hold what the runs did, and every query the guide
//! shows runs on them and answers what it says.

use crate::gate::{shop, wh};
use crate::support::Project;

/// The guide's section on querying the manifest, to the next heading of its level.
fn section() -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/manifest.md"),
    )
    .unwrap();
    let start = text
        .find("\n## Querying the manifest\n")
        .expect("the section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// The views of the section's table, each with its columns in order.
fn documented(section: &str) -> Vec<(String, Vec<String>)> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `report_"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let view = format!("report_{}", cells[0].trim_end_matches('`'));
            let columns = cells[2]
                .trim_end_matches(" |")
                .split(", ")
                .map(|c| c.trim_matches('`').to_string())
                .collect();
            (view, columns)
        })
        .collect()
}

/// The section's `sql` blocks.
fn queries(section: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line == "```sql" {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push(body.join("\n"));
        }
    }
    blocks
}

/// The rows of `sql`, with PostgreSQL's times shown in UTC.
fn rows(p: &Project, sql: &str) -> Vec<Vec<String>> {
    match p.manifest_db() {
        Some(_) => p.rows(&format!("SET TimeZone = 'UTC';\n{sql}")),
        None => p.rows(sql),
    }
}

/// The columns of a view, in order, as the engine reports them.
fn columns(p: &Project, view: &str) -> Vec<String> {
    let sql = match p.manifest_db() {
        Some(_) => format!(
            "SELECT column_name FROM information_schema.columns
             WHERE table_schema = 'backfill_manifest' AND table_name = '{view}'
             ORDER BY ordinal_position"
        ),
        None => format!("SELECT name FROM pragma_table_info('{view}') ORDER BY cid"),
    };
    p.rows(&sql).into_iter().map(|r| r[0].clone()).collect()
}

/// An instant as the views show it on SQLite (`2026-09-02T00:00:00Z`), whichever engine showed it.
fn instant(shown: &str) -> String {
    match shown.strip_suffix("+00") {
        Some(t) => format!("{}Z", t.replace(' ', "T")),
        None => shown.to_string(),
    }
}

#[test]
fn the_views_for_people_have_the_documented_columns_and_the_guides_queries_answer() {
    let p = shop();
    // Three days published; then the second day's source emptied and its rerun refused.
    p.create("daily_orders", "2026-09-01", "2026-09-03", &[])
        .code(0);
    wh(&p)
        .execute_batch("DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-02'")
        .unwrap();
    let rerun = p.create(
        "daily_orders",
        "2026-09-02",
        "2026-09-02",
        &["--reprocess-behavior", "completed"],
    );
    rerun.code(3).stderr_has("rejected: zero rows");
    let published: Vec<i64> = ["2026-09-01", "2026-09-02", "2026-09-03"]
        .iter()
        .map(|d| {
            wh(&p)
                .query_row(
                    "SELECT COUNT(*) FROM daily_orders WHERE day = ?1",
                    [d],
                    |r| r.get(0),
                )
                .unwrap()
        })
        .collect();
    assert!(published.iter().all(|&n| n > 0), "{published:?}");

    let section = section();
    let views = documented(&section);
    assert_eq!(
        views.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        [
            "report_backfills",
            "report_runs",
            "report_tries",
            "report_published",
            "report_forgets",
            "report_readiness"
        ]
    );
    for (view, documented) in &views {
        assert_eq!(&columns(&p, view), documented, "the columns of {view}");
    }
    if p.manifest_db().is_some() {
        // Native values where the engine has them.
        assert_eq!(
            p.rows(
                "SELECT table_name || '.' || column_name || ' ' || data_type
                 FROM information_schema.columns
                 WHERE table_schema = 'backfill_manifest' AND table_name LIKE 'report\\_%'
                   AND column_name IN ('started_at', 'interval_start', 'duration_s', 'atomic', 'tasks', 'rows')
                 ORDER BY table_name, ordinal_position"
            )
            .concat(),
            [
                "report_backfills.atomic boolean",
                "report_backfills.tasks text",
                "report_backfills.duration_s double precision",
                "report_published.interval_start timestamp with time zone",
                "report_published.rows bigint",
                "report_readiness.interval_start timestamp with time zone",
                "report_runs.interval_start timestamp with time zone",
                "report_runs.started_at timestamp with time zone",
                "report_runs.duration_s double precision",
                "report_runs.rows bigint",
                "report_tries.interval_start timestamp with time zone",
                "report_tries.started_at timestamp with time zone",
                "report_tries.duration_s double precision",
                "report_tries.rows bigint",
            ]
            .map(String::from)
        );
    }

    // What the views hold.
    assert_eq!(
        rows(
            &p,
            "SELECT backfill_id, dag_id, kind, state, range_start, range_end, intervals_to_run,
                    runs_succeeded, runs_rejected, runs_in_flight, run_backwards, atomic,
                    duration_s >= 0
             FROM report_backfills ORDER BY backfill_id"
        )
        .into_iter()
        .map(|r| r.into_iter().map(|v| instant(&v)).collect::<Vec<_>>())
        .collect::<Vec<_>>(),
        [
            [
                "1",
                "daily_orders",
                "run",
                "completed",
                "2026-09-01T00:00:00Z",
                "2026-09-04T00:00:00Z",
                "3",
                "3",
                "0",
                "0",
                "0",
                "0",
                "1"
            ],
            [
                "2",
                "daily_orders",
                "run",
                "failed",
                "2026-09-02T00:00:00Z",
                "2026-09-03T00:00:00Z",
                "1",
                "0",
                "1",
                "0",
                "0",
                "0",
                "1"
            ]
        ]
    );
    let tries = rows(
        &p,
        "SELECT try_id, run_id, backfill_id, task_id, try_number, interval_start, interval_end,
                state, verdict, rows, started_at, ended_at, duration_s >= 0
         FROM report_tries ORDER BY backfill_id, interval_start, try_id",
    );
    assert_eq!(tries.len(), 4, "{tries:#?}");
    for (t, day) in tries.iter().zip(["01", "02", "03", "02"]) {
        assert_eq!(t[3..5], ["aggregate", "1"]);
        assert_eq!(instant(&t[5]), format!("2026-09-{day}T00:00:00Z"));
        // Event times carry milliseconds (PostgreSQL leaves out a fraction's trailing zeros).
        for at in &t[10..12] {
            let at = instant(at);
            assert!(
                at.len() >= 20 && at.len() <= 24 && at.ends_with('Z') && at[10..11] == *"T",
                "{at}"
            );
        }
        assert_eq!(t[12], "1");
    }
    assert_eq!(
        tries
            .iter()
            .map(|t| (t[2].as_str(), t[7].as_str(), t[8].as_str()))
            .collect::<Vec<_>>(),
        [
            ("1", "succeeded", "published"),
            ("1", "succeeded", "published"),
            ("1", "succeeded", "published"),
            ("2", "rejected", "rejected")
        ]
    );

    // The guide's queries, in its order, each answering what it says.
    let answers: Vec<Vec<Vec<String>>> = queries(&section).iter().map(|q| rows(&p, q)).collect();
    assert_eq!(answers.len(), 7);
    // How each backfill went, newest first.
    assert_eq!(
        answers[0]
            .iter()
            .map(|r| [r[0].as_str(), r[3].as_str()])
            .collect::<Vec<_>>(),
        [["2", "failed"], ["1", "completed"]]
    );
    // Every attempt at the second day: the first published, the rerun refused.
    assert_eq!(
        answers[1]
            .iter()
            .map(|r| [r[1].as_str(), r[2].as_str(), r[5].as_str(), r[6].as_str()])
            .collect::<Vec<_>>(),
        [
            ["1", "succeeded", "1", published[1].to_string().as_str()],
            ["2", "rejected", "1", "NULL"]
        ]
    );
    // The one interval whose latest attempt is refused.
    assert_eq!(answers[2].len(), 1, "{:?}", answers[2]);
    assert_eq!(
        [
            answers[2][0][0].as_str(),
            &instant(&answers[2][0][1]),
            &answers[2][0][2]
        ],
        ["daily_orders", "2026-09-02T00:00:00Z", "rejected"]
    );
    // The gate's refusal, with its words.
    assert_eq!(answers[3].len(), 1, "{:?}", answers[3]);
    assert!(
        answers[3][0][4].starts_with("zero rows and an empty source"),
        "{:?}",
        answers[3][0]
    );
    // The durations of the three succeeded tries.
    assert_eq!(answers[4].len(), 1);
    assert_eq!(answers[4][0][..3], ["daily_orders", "aggregate", "3"]);
    // What is published: the first backfill's three days, the second day's kept.
    assert_eq!(
        answers[5]
            .iter()
            .map(|r| (instant(&r[2]), r[3].clone(), r[4].clone()))
            .collect::<Vec<_>>(),
        (1..=3)
            .map(|d| (
                format!("2026-09-0{d}T00:00:00Z"),
                published[d - 1].to_string(),
                "1".to_string()
            ))
            .collect::<Vec<_>>()
    );
    // Every try ran on this host.
    assert_eq!(answers[6].len(), 1);
    assert_eq!(answers[6][0][1], "4");
    assert_eq!(
        answers[6][0][2],
        published.iter().sum::<i64>().to_string(),
        "the rows of the succeeded tries"
    );
}
