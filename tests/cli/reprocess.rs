//! Airflow's reprocess scenario: 2026-01-05 succeeded, 2026-01-06 failed, 2026-01-07 in flight
//! (held by another backfill that is still running); a backfill of 2026-01-03..2026-01-09.

use std::process::Child;
use std::time::Duration;

use crate::support::{Project, day, day_unix, wait_until};

const DAG: &str = r#"
schedule = "@daily"

[[tasks]]
id = "work"
command = '''
if [ "{{ ds }}" = 2026-01-07 ]; then while [ ! -f release ]; do sleep 0.02; done; fi
echo "{{ ds }}" >> ran.txt
[ ! -f "fail-{{ ds }}" ]
'''
"#;

/// Builds the starting state; returns the project and the backfill holding 2026-01-07.
fn scenario() -> (Project, Child) {
    let p = Project::new().dag("daily", DAG);
    p.write("fail-2026-01-06", "");
    p.run(&[
        "create",
        "--dag",
        "daily",
        "--from",
        "2026-01-05",
        "--to",
        "2026-01-06",
    ])
    .code(3);
    std::fs::remove_file(p.path("fail-2026-01-06")).unwrap();
    let holder = p.spawn(
        "holder",
        &[
            "create",
            "--dag",
            "daily",
            "--from",
            "2026-01-07",
            "--to",
            "2026-01-07",
        ],
    );
    // Running, its process group recorded: the holder writes nothing more but heartbeats.
    wait_until("2026-01-07 to be running", Duration::from_secs(10), || {
        p.has_manifest()
            && p.count(&format!(
                "SELECT COUNT(*) FROM runs r JOIN task_tries t ON t.run_id = r.id
                 WHERE r.interval_start = {} AND r.state = 'running' AND t.pgid IS NOT NULL",
                day_unix(7)
            )) == 1
    });
    (p, holder)
}

fn release(p: &Project, holder: Child) {
    p.write("release", "");
    p.wait("holder", holder).code(0);
}

/// `(start, action, reason)` of each planned interval, in plan order.
fn plan_of(doc: &serde_json::Value) -> Vec<(String, String, String)> {
    doc["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["start"].as_str().unwrap().to_string(),
                i["action"].as_str().unwrap().to_string(),
                i["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn expected(behavior: &str) -> Vec<(String, String, String)> {
    let row = |d: u32, action: &str, reason: &str| (day(d), action.to_string(), reason.to_string());
    let five = match behavior {
        "completed" => row(5, "run", ""),
        _ => row(5, "skip", "already exists"),
    };
    let six = match behavior {
        "none" => row(6, "skip", "already exists"),
        _ => row(6, "run", ""),
    };
    vec![
        row(3, "run", ""),
        row(4, "run", ""),
        five,
        six,
        row(7, "skip", "in flight"),
        row(8, "run", ""),
        row(9, "run", ""),
    ]
}

#[test]
fn dry_run_plans_follow_the_reprocess_table() {
    let (p, holder) = scenario();
    for behavior in ["none", "failed", "completed"] {
        let before = p.dump();
        let out = p.run(&[
            "create",
            "--dag",
            "daily",
            "--from",
            "2026-01-03",
            "--to",
            "2026-01-09",
            "--reprocess-behavior",
            behavior,
            "--dry-run",
            "--output",
            "json",
        ]);
        out.code(0);
        let doc = out.json();
        assert_eq!(doc["dag_id"], "daily");
        assert_eq!(plan_of(&doc), expected(behavior), "{behavior}");
        assert_eq!(p.dump(), before, "a dry run writes nothing");
    }
    release(&p, holder);
}

#[test]
fn each_behavior_runs_exactly_the_intervals_of_the_table() {
    for (behavior, runs) in [("none", 4), ("failed", 5), ("completed", 6)] {
        let (p, holder) = scenario();
        std::fs::remove_file(p.path("ran.txt")).unwrap();
        let out = p.run(&[
            "create",
            "--dag",
            "daily",
            "--from",
            "2026-01-03",
            "--to",
            "2026-01-09",
            "--reprocess-behavior",
            behavior,
            "--output",
            "json",
        ]);
        out.code(0);
        let id = out.json()["backfill_id"].as_i64().unwrap();
        let ran: Vec<String> = p
            .rows(&format!(
                "SELECT interval_start FROM runs WHERE backfill_id = {id} ORDER BY interval_start"
            ))
            .into_iter()
            .map(|r| r[0].clone())
            .collect();
        let want: Vec<String> = expected(behavior)
            .iter()
            .filter(|r| r.1 == "run")
            .map(|r| {
                chrono::DateTime::parse_from_rfc3339(&r.0)
                    .unwrap()
                    .timestamp()
                    .to_string()
            })
            .collect();
        assert_eq!(ran.len(), runs, "{behavior}");
        assert_eq!(ran, want, "{behavior}");
        // The plan in the manifest records every skip with its reason.
        let reasons = p.rows(&format!(
            "SELECT interval_start, action, COALESCE(reason, '') FROM plan WHERE backfill_id = {id} ORDER BY ord"
        ));
        let got: Vec<(String, String, String)> = reasons
            .into_iter()
            .map(|r| {
                let t = chrono::DateTime::from_timestamp(r[0].parse().unwrap(), 0).unwrap();
                (
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    r[1].clone(),
                    r[2].clone(),
                )
            })
            .collect();
        assert_eq!(got, expected(behavior), "{behavior}");
        // The tasks ran once per planned interval and never for the one in flight.
        let mut lines: Vec<String> = p.read("ran.txt").lines().map(str::to_string).collect();
        lines.sort();
        assert_eq!(lines.len(), runs);
        assert!(!lines.contains(&"2026-01-07".to_string()));
        release(&p, holder);
    }
}
