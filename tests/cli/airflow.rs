//! Where `backfill` deliberately differs from Airflow 3 (the README's table), checked through
//! the binary: each row's `backfill` behaviour, and the two Airflow defects it does not share.

use std::time::Duration;

use crate::support::{Project, wait_until};

fn dag(schedule: &str, timezone: &str, extra: &str) -> String {
    format!(
        "schedule = \"{schedule}\"\ntimezone = \"{timezone}\"\n{extra}\n[[tasks]]\nid = \"t\"\ncommand = \"printf '%s\\\\n' {{{{ ds }}}} >> ds.txt\"\n"
    )
}

/// The `(start, end)` of every interval of a dry run's plan, and the plan's document.
fn plan(
    p: &Project,
    dag: &str,
    from: &str,
    to: &str,
) -> (Vec<(String, String)>, serde_json::Value) {
    let out = p.run(&[
        "create",
        "--dag",
        dag,
        "--from",
        from,
        "--to",
        to,
        "--dry-run",
        "--output",
        "json",
    ]);
    out.code(0);
    let doc = out.json();
    let intervals = doc["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["start"].as_str().unwrap().to_string(),
                i["end"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (intervals, doc)
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn the_differences_from_airflow_hold() {
    let p = Project::new()
        .dag("hourly", &dag("@hourly", "Europe/Berlin", ""))
        .dag("daily", &dag("@daily", "Europe/Berlin", ""))
        .dag("half_past_two", &dag("30 2 * * *", "Europe/Berlin", ""))
        .dag("weekdays", &dag("0 6 * * 1-5", "UTC", ""))
        .dag("lord_howe", &dag("@daily", "Australia/Lord_Howe", ""))
        .dag("chained", &dag("@daily", "UTC", "depends_on_past = true"));

    // A date-only --to is the whole local day: 24 hours of an hourly DAG.
    let (hours, doc) = plan(&p, "hourly", "2026-09-30", "2026-09-30");
    assert_eq!(hours.len(), 24);
    assert_eq!(hours[0].0, "2026-09-29T22:00:00Z");
    assert_eq!(hours[23].0, "2026-09-30T21:00:00Z");
    // The default --max-active-runs is the DAG's, else 1 (not 10).
    assert_eq!(doc["max_active_runs"], 1);

    // `ds` is the local date: Berlin's 2026-03-29 starts at 2026-03-28T23:00Z.
    let (days, _) = plan(&p, "daily", "2026-03-29", "2026-03-29");
    assert_eq!(
        days,
        pairs(&[("2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z")])
    );
    p.run(&[
        "create",
        "--dag",
        "daily",
        "--from",
        "2026-03-29",
        "--to",
        "2026-03-29",
    ])
    .code(0);
    assert_eq!(p.read("ds.txt"), "2026-03-29\n");

    // A fire time in the DST gap moves to the gap's end (03:00 = 01:00Z), and a --from on the
    // fire time before the gap keeps that first interval.
    let (gap, _) = plan(&p, "half_past_two", "2026-03-28T02:30", "2026-03-30");
    assert_eq!(
        gap,
        pairs(&[
            ("2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z"),
            ("2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"),
            ("2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"),
        ])
    );
    // A fire time in the repeated hour fires once, at its first occurrence (02:30+02:00).
    let (fold, _) = plan(&p, "half_past_two", "2026-10-24", "2026-10-26");
    assert_eq!(
        fold,
        pairs(&[
            ("2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z"),
            ("2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"),
            ("2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"),
        ])
    );

    // Cron schedules get [fire, next fire): Friday's interval ends on Monday.
    let (friday, _) = plan(&p, "weekdays", "2026-09-04", "2026-09-04");
    assert_eq!(
        friday,
        pairs(&[("2026-09-04T06:00:00Z", "2026-09-07T06:00:00Z")])
    );

    // Lord Howe's 30-minute change does not stop planning.
    let (howe, _) = plan(&p, "lord_howe", "2026-10-03", "2026-10-05");
    assert_eq!(
        howe,
        pairs(&[
            ("2026-10-02T13:30:00Z", "2026-10-03T13:30:00Z"),
            ("2026-10-03T13:30:00Z", "2026-10-04T13:00:00Z"),
            ("2026-10-04T13:00:00Z", "2026-10-05T13:00:00Z"),
        ])
    );

    // `none` with depends_on_past is accepted and runs in order.
    p.run(&[
        "create",
        "--dag",
        "chained",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
    ])
    .code(0)
    .stderr_has("completed — 3 succeeded");
}

#[test]
fn several_backfills_of_one_dag_run_at_once_on_overlapping_ranges() {
    let p = Project::new().dag(
        "daily",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = '''\nif [ {{ ds }} = 2026-01-01 ]; then while [ ! -f release ]; do sleep 0.02; done; fi\necho {{ ds }} >> ran.txt\n'''\n",
    );
    let first = p.spawn(
        "first",
        &[
            "create",
            "--dag",
            "daily",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    );
    wait_until("2026-01-01 to run", Duration::from_secs(10), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") == 1
    });
    // While the first still runs, a second backfill of an overlapping range is accepted: it
    // skips the intervals the first holds (both of its range) and runs the rest.
    p.run(&[
        "create",
        "--dag",
        "daily",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
    ])
    .code(0)
    .stderr_has("backfill 2 of daily: 4 intervals, ");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 2 AND reason = 'in flight'"),
        2
    );
    p.write("release", "");
    p.wait("first", first).code(0);
    let mut ran: Vec<String> = p.read("ran.txt").lines().map(String::from).collect();
    ran.sort();
    assert_eq!(
        ran,
        ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"],
        "every interval ran exactly once"
    );
}
