//! Cascades across DAGs: `upstream`, `create --cascade all|changed`, and the note that names
//! stale downstream DAGs.

use crate::support::Project;

/// An hourly DAG in Berlin whose hours append their start to `hours.txt`; an hour fails when a
/// file `fail-START` exists, and reports the content of `fp-START` (or `same`) as its
/// fingerprint.
const HOURLY: &str = r#"
schedule = "@hourly"
timezone = "Europe/Berlin"
max_active_runs = 4
[[tasks]]
id = "collect"
command = '''test ! -e "fail-{{ data_interval_start }}" && echo {{ data_interval_start }} >> hours.txt && printf '{"fingerprint": "%s"}' "$(cat "fp-{{ data_interval_start }}" 2>/dev/null || echo same)" > "$BACKFILL_RESULT"'''
"#;

/// A daily DAG downstream of it: each day counts the hours that ran inside it, so far.
const DAILY: &str = r#"
schedule = "@daily"
timezone = "Europe/Berlin"
upstream = ["hourly"]
[[tasks]]
id = "count"
command = '''mkdir -p days && awk -v lo="$BACKFILL_DATA_INTERVAL_START" -v hi="$BACKFILL_DATA_INTERVAL_END" '$1 >= lo && $1 < hi' hours.txt | sort -u | wc -l | tr -d ' ' > days/{{ ds }}'''
"#;

fn project() -> Project {
    Project::new().dag("hourly", HOURLY).dag("daily", DAILY)
}

fn hourly(p: &Project, from: &str, to: &str, extra: &[&str]) -> crate::support::Out {
    p.create("hourly", from, to, extra)
}

/// `(day, action, reason)` of a backfill's plan.
fn plan(p: &Project, backfill: i64) -> Vec<[String; 3]> {
    p.rows(&format!(
        "SELECT {}, action, COALESCE(reason, '') FROM plan
         WHERE backfill_id = {backfill} ORDER BY ord",
        p.day_of("interval_start + 7200")
    ))
    .into_iter()
    .map(|r| [r[0].clone(), r[1].clone(), r[2].clone()])
    .collect()
}

#[test]
fn each_day_runs_after_its_23_24_or_25_hours() {
    let p = project();
    for (from, to, days) in [
        (
            "2026-03-28",
            "2026-03-30",
            [
                ("2026-03-28", "24"),
                ("2026-03-29", "23"),
                ("2026-03-30", "24"),
            ],
        ),
        (
            "2026-10-24",
            "2026-10-26",
            [
                ("2026-10-24", "24"),
                ("2026-10-25", "25"),
                ("2026-10-26", "24"),
            ],
        ),
    ] {
        hourly(&p, from, to, &["--cascade", "all"])
            .code(0)
            .stderr_has("of daily: 3 intervals, 3 to run, 0 skipped");
        for (day, hours) in days {
            assert_eq!(p.read(&format!("days/{day}")).trim(), hours, "{day}");
        }
    }
    // One backfill per DAG, the daily ones naming the cascade's first.
    assert_eq!(
        p.rows("SELECT id, dag_id, COALESCE(cascade, ''), COALESCE(cascade_of, 0), state FROM backfills ORDER BY id"),
        [
            ["1", "hourly", "all", "0", "completed"],
            ["2", "daily", "", "1", "completed"],
            ["3", "hourly", "all", "0", "completed"],
            ["4", "daily", "", "3", "completed"],
        ]
    );
    // `show` of the first groups the cascade by DAG.
    p.run(&["show", "1"])
        .code(0)
        .stdout_has("backfill 1 of hourly: completed (cascade all)")
        .stdout_has("cascade: DAG `daily`, backfill 2");
    let doc = p.run(&["show", "1", "--output", "json"]).json();
    assert_eq!(doc["cascade_backfills"][0]["dag_id"], "daily");
    assert_eq!(doc["cascade_backfills"][0]["intervals"]["succeeded"], 3);
}

#[test]
fn a_failed_hour_skips_its_day_and_only_its_day() {
    let p = project();
    p.write("fail-2026-03-29T05:00:00Z", "");
    hourly(&p, "2026-03-28", "2026-03-30", &["--cascade", "all"])
        .code(3)
        .stderr_has("failed 2026-03-29 07:00");
    assert_eq!(
        plan(&p, 2),
        [
            ["2026-03-28", "run", ""],
            ["2026-03-29", "skip", "upstream not successful"],
            ["2026-03-30", "run", ""],
        ]
        .map(|r| r.map(String::from))
    );
    assert!(!p.path("days/2026-03-29").exists(), "the day never ran");
    assert_eq!(p.read("days/2026-03-30").trim(), "24");
}

#[test]
fn cascade_changed_after_a_no_op_upstream_rerun_runs_no_downstream_interval() {
    let p = project();
    hourly(&p, "2026-03-28", "2026-03-30", &["--cascade", "all"]).code(0);
    let day_runs = || p.count("SELECT COUNT(*) FROM runs WHERE dag_id = 'daily'");
    assert_eq!(day_runs(), 3);
    // Every hour again, with the same output: no day runs.
    hourly(
        &p,
        "2026-03-28",
        "2026-03-30",
        &["--reprocess-behavior", "completed", "--cascade", "changed"],
    )
    .code(0);
    assert_eq!(day_runs(), 3);
    assert_eq!(
        plan(&p, 4),
        [
            ["2026-03-28", "skip", "upstream unchanged"],
            ["2026-03-29", "skip", "upstream unchanged"],
            ["2026-03-30", "skip", "upstream unchanged"],
        ]
        .map(|r| r.map(String::from))
    );
    // One hour's output changes: its day, and only its day, runs.
    p.write("fp-2026-03-30T10:00:00Z", "v2");
    hourly(
        &p,
        "2026-03-28",
        "2026-03-30",
        &["--reprocess-behavior", "completed", "--cascade", "changed"],
    )
    .code(0);
    assert_eq!(
        plan(&p, 6),
        [
            ["2026-03-28", "skip", "upstream unchanged"],
            ["2026-03-29", "skip", "upstream unchanged"],
            ["2026-03-30", "run", ""],
        ]
        .map(|r| r.map(String::from))
    );
    assert_eq!(day_runs(), 4);
}

#[test]
fn resume_continues_a_cascade_killed_between_two_dags() {
    let p = project();
    // Killed when the daily backfill was about to be written, after the hours completed.
    let killed = p
        .command(&[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28",
            "--to",
            "2026-03-28",
            "--cascade",
            "all",
        ])
        .env("BACKFILL_FAULT", "after-release-stale@2")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None);
    assert_eq!(
        p.rows("SELECT dag_id, state FROM backfills"),
        [["hourly", "completed"]]
    );
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("of daily: 1 interval, 1 to run, 0 skipped");
    assert_eq!(p.read("days/2026-03-28").trim(), "24");
}

#[test]
fn a_dry_run_shows_the_whole_chain_and_a_plain_backfill_names_what_may_be_stale() {
    let p = project();
    let dry = hourly(
        &p,
        "2026-03-29",
        "2026-03-29",
        &["--cascade", "all", "--dry-run", "--output", "json"],
    );
    dry.code(0);
    let doc = dry.json();
    assert_eq!(doc["cascade"], "all");
    assert_eq!(doc["plans"][0]["dag_id"], "hourly");
    assert_eq!(doc["plans"][0]["to_run"], 23);
    assert_eq!(doc["plans"][1]["dag_id"], "daily");
    assert_eq!(doc["plans"][1]["intervals"].as_array().unwrap().len(), 1);
    assert!(!p.has_manifest(), "a dry run writes nothing");
    hourly(&p, "2026-03-29", "2026-03-29", &[])
        .code(0)
        .stderr_has(&format!(
            "note: `daily` downstream of `hourly` may now be stale over this range; `{}` backfills it where what it read changed",
            p.hint("create --dag hourly --from 2026-03-29 --to 2026-03-29 --reprocess-behavior completed --cascade changed")
        ));
    // Run again, everything is skipped as already there: nothing downstream can be stale.
    let again = hourly(&p, "2026-03-29", "2026-03-29", &[]);
    again.code(0);
    assert!(
        !again.stderr.contains("may now be stale"),
        "{}",
        again.stderr
    );
}

#[test]
fn unknown_upstreams_and_cycles_are_validation_errors() {
    let p = Project::new()
        .dag("a", "schedule = \"@daily\"\nupstream = [\"b\"]\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n")
        .dag("b", "schedule = \"@daily\"\nupstream = [\"a\", \"nope\"]\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n");
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("dags/a.toml:2:13: `upstream`: a cycle: a -> b -> a; a DAG cannot depend on its own output")
        .stderr_has("dags/b.toml:2:13: `upstream`: a cycle: b -> a -> b")
        .stderr_has("dags/b.toml:2:18: `upstream`: unknown DAG `nope` (DAGs of the project: a, b)");
}

#[test]
fn cancel_of_a_cascade_stops_the_dag_that_runs_and_resume_finishes_it() {
    let slow_daily = DAILY.replace(
        "command = '''mkdir -p days",
        "command = '''while [ ! -e go ]; do sleep 0.05; done; mkdir -p days",
    );
    let p = Project::new()
        .dag("hourly", HOURLY)
        .dag("daily", &slow_daily);
    let child = p.spawn(
        "cascade",
        &[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28",
            "--to",
            "2026-03-28",
            "--cascade",
            "all",
        ],
    );
    crate::support::wait_until(
        "the daily backfill to run",
        std::time::Duration::from_secs(20),
        || {
            p.has_manifest()
                && p.count("SELECT COUNT(*) FROM runs WHERE dag_id = 'daily' AND state = 'running'")
                    == 1
        },
    );
    // Its first backfill completed: cancelling it stops the one that runs.
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 is completed; cancelling backfill 2 of its cascade");
    p.wait("cascade", child).code(130);
    assert_eq!(
        p.rows("SELECT id, state FROM backfills ORDER BY id"),
        [["1", "completed"], ["2", "cancelled"]]
    );
    p.write("go", "");
    p.run(&["resume", "1"]).code(0);
    assert_eq!(p.read("days/2026-03-28").trim(), "24");
    assert_eq!(
        p.rows("SELECT id, state FROM backfills ORDER BY id"),
        [["1", "completed"], ["2", "completed"]]
    );
}

#[test]
fn a_cascade_stopped_by_max_failures_waits_and_resume_runs_every_day() {
    let p = project();
    p.write("fail-2026-03-28T05:00:00Z", "");
    p.write("fail-2026-03-29T05:00:00Z", "");
    hourly(
        &p,
        "2026-03-28",
        "2026-03-30",
        &["--cascade", "all", "--max-failures", "2", "--max-active-runs", "1"],
    )
    .code(3)
    .stderr_has(&format!(
        "cascade: DAG `daily` waits for backfill 1 of `hourly`, which has 40 intervals left; `{}` continues it, then the cascade",
        p.hint("resume 1")
    ));
    assert_eq!(
        p.count("SELECT COUNT(*) FROM backfills"),
        1,
        "no day was planned"
    );
    for f in ["fail-2026-03-28T05:00:00Z", "fail-2026-03-29T05:00:00Z"] {
        std::fs::remove_file(p.path(f)).unwrap();
    }
    // The failed hours stay failed in backfill 1: their days are skipped, the third runs.
    p.run(&["resume", "1"]).code(3);
    assert_eq!(
        plan(&p, 2),
        [
            ["2026-03-28", "skip", "upstream not successful"],
            ["2026-03-29", "skip", "upstream not successful"],
            ["2026-03-30", "run", ""],
        ]
        .map(|r| r.map(String::from))
    );
}

#[test]
fn a_day_whose_hours_another_backfill_runs_does_not_run() {
    let slow = HOURLY.replace(
        "command = '''test",
        "command = '''while [ -e hold ]; do sleep 0.05; done; test",
    );
    let p = Project::new().dag("hourly", &slow).dag("daily", DAILY);
    p.write("hold", "");
    // The first eight hours are held by another backfill while the cascade plans.
    let other = p.spawn(
        "other",
        &[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28T00:00",
            "--to",
            "2026-03-28T07:00",
        ],
    );
    crate::support::wait_until(
        "the other backfill to hold its hours",
        std::time::Duration::from_secs(20),
        || p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") > 0,
    );
    let cascade = p.spawn(
        "cascade",
        &[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28",
            "--to",
            "2026-03-28",
            "--cascade",
            "all",
        ],
    );
    crate::support::wait_until(
        "the cascade to plan its hours",
        std::time::Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 2") == 24,
    );
    std::fs::remove_file(p.path("hold")).unwrap();
    p.wait("other", other).code(0);
    p.wait("cascade", cascade).code(0);
    assert_eq!(
        plan(&p, 3),
        [["2026-03-28", "skip", "upstream not successful"]].map(|r| r.map(String::from)),
        "eight of its hours were in flight elsewhere when the cascade ran"
    );
    assert!(!p.path("days/2026-03-28").exists());
}

#[test]
fn every_dag_of_a_cascade_is_checked_before_anything_runs() {
    let p = Project::new().dag("hourly", HOURLY).dag(
        "daily",
        &DAILY.replace("days/{{ ds }}", "days/{{ conf.region }}-{{ ds }}"),
    );
    hourly(&p, "2026-03-28", "2026-03-28", &["--cascade", "all"])
        .code(2)
        .stderr_has("conf.region");
    assert!(!p.has_manifest(), "nothing ran, nothing was written");
    hourly(
        &p,
        "2026-03-28",
        "2026-03-28",
        &["--cascade", "all", "--stage"],
    )
    .code(2)
    .stderr_has("--stage");
}

#[test]
fn a_cascade_over_too_many_downstream_intervals_is_refused() {
    let p = Project::new()
        .dag("daily", "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n")
        .dag(
            "minutely",
            "schedule = \"* * * * *\"\nupstream = [\"daily\"]\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        );
    p.create("daily", "2024-01-01", "2025-12-31", &["--cascade", "all"])
        .code(2)
        .stderr_has("DAG `minutely` has more than 1000000 intervals");
    assert!(!p.has_manifest());
}

#[test]
fn a_downstream_plan_finished_by_resume_keeps_its_upstream_skips() {
    // Every day fails, so every minute of the downstream DAG is skipped; its plan (5,760
    // minutes, two chunks) is cut after the first chunk.
    let p = Project::new()
        .dag(
            "d",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"false\"\n",
        )
        .dag(
            "m",
            "schedule = \"* * * * *\"\nupstream = [\"d\"]\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        );
    let killed = p
        .command(&[
            "create",
            "--dag",
            "d",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-04",
            "--cascade",
            "all",
        ])
        .env("BACKFILL_FAULT", "plan-chunk@2")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 2"),
        5000
    );
    p.run(&["resume", "1"]).code(3);
    assert_eq!(
        p.rows("SELECT action, reason, COUNT(*) FROM plan WHERE backfill_id = 2 GROUP BY 1, 2"),
        [["skip", "upstream not successful", "5760"]]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM runs WHERE dag_id = 'm'"), 0);
}

#[test]
fn an_upstream_dag_outside_the_cascade_counts_too() {
    // A diamond: `a` feeds `b` and `c`, both feed the monthly `d`; the cascade starts at `b`.
    let cmd = |id: &str, ups: &str| {
        format!(
            "schedule = \"@daily\"\nupstream = [{ups}]\n[[tasks]]\nid = \"t\"\ncommand = \"test ! -e fail-{id}-{{{{ ds }}}} && touch {id}-{{{{ ds }}}}\"\n"
        )
    };
    let p = Project::new()
        .dag("a", &cmd("a", ""))
        .dag("b", &cmd("b", "\"a\""))
        .dag("c", &cmd("c", "\"a\""))
        .dag(
            "d",
            "schedule = \"@monthly\"\nupstream = [\"b\", \"c\"]\n[[tasks]]\nid = \"t\"\ncommand = \"touch d-{{ ds }}\"\n",
        );
    p.write("fail-c-2026-09-10", "");
    p.create("c", "2026-09-01", "2026-09-30", &[]).code(3);
    p.create("b", "2026-09-01", "2026-09-30", &["--cascade", "all"])
        .code(0);
    assert!(
        !p.path("d-2026-09-01").exists(),
        "September reads c's failed 09-10"
    );
    assert_eq!(
        p.rows("SELECT action, reason FROM plan WHERE backfill_id = 3"),
        [["skip", "upstream not successful"]]
    );
    // Once c's day is fixed, the month runs.
    std::fs::remove_file(p.path("fail-c-2026-09-10")).unwrap();
    p.create(
        "c",
        "2026-09-10",
        "2026-09-10",
        &["--reprocess-behavior", "failed"],
    )
    .code(0);
    p.create(
        "b",
        "2026-09-01",
        "2026-09-30",
        &["--reprocess-behavior", "completed", "--cascade", "all"],
    )
    .code(0);
    assert!(p.path("d-2026-09-01").exists());
}

#[test]
fn a_day_does_not_start_while_another_backfill_reruns_one_of_its_hours() {
    use nix::sys::signal::Signal;
    let slow = HOURLY.replace(
        "command = '''test",
        "command = '''while [ -e hold ]; do sleep 0.05; done; test",
    );
    let p = Project::new().dag("hourly", &slow).dag("daily", DAILY);
    // The cascade runs its hours, plans its day (every hour succeeded), then freezes.
    let cascade = p.spawn_with(
        "cascade",
        &[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28",
            "--to",
            "2026-03-28",
            "--cascade",
            "all",
        ],
        &[("BACKFILL_FAULT", "after-plan@2:stop")],
    );
    crate::support::wait_until(
        "the cascade to plan its day and freeze",
        std::time::Duration::from_secs(30),
        || crate::support::stopped(cascade.id()),
    );
    assert_eq!(
        plan(&p, 2),
        [["2026-03-28", "run", ""]].map(|r| r.map(String::from))
    );
    // Meanwhile another backfill reruns one of the day's hours.
    p.write("hold", "");
    let other = p.spawn(
        "other",
        &[
            "create",
            "--dag",
            "hourly",
            "--from",
            "2026-03-28T05:00",
            "--to",
            "2026-03-28T05:00",
            "--reprocess-behavior",
            "completed",
        ],
    );
    crate::support::wait_until(
        "the other backfill to run the hour",
        std::time::Duration::from_secs(20),
        || {
            p.count(
                "SELECT COUNT(*) FROM runs r JOIN task_tries t ON t.run_id = r.id
                 WHERE r.backfill_id = 3 AND t.state = 'running' AND t.pgid IS NOT NULL",
            ) == 1
        },
    );
    crate::support::signal(&cascade, Signal::SIGCONT);
    let out = p.wait("cascade", cascade);
    std::fs::remove_file(p.path("hold")).unwrap();
    p.wait("other", other).code(0);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        plan(&p, 2),
        [["2026-03-28", "skip", "upstream not successful"]].map(|r| r.map(String::from)),
        "one of its hours was running elsewhere when the day was to start"
    );
    assert!(!p.path("days/2026-03-28").exists());
}

#[test]
fn a_failed_upstream_interval_the_cascade_did_not_run_skips_its_downstream_interval() {
    let p = crate::gate::shop();
    p.write(
        "dags/monthly_revenue.toml",
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/shop/dags/monthly_revenue.toml"),
        )
        .unwrap(),
    );
    p.create("daily_orders", "2026-09-01", "2026-09-30", &[])
        .code(0);
    // 2026-09-10's source is emptied: its latest run is rejected.
    crate::gate::wh(&p)
        .execute_batch("DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-10'")
        .unwrap();
    p.create(
        "daily_orders",
        "2026-09-10",
        "2026-09-10",
        &["--reprocess-behavior", "completed"],
    )
    .code(3);
    // A cascade over another day of September.
    let out = p.create(
        "daily_orders",
        "2026-09-15",
        "2026-09-15",
        &["--reprocess-behavior", "completed", "--cascade", "all"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        p.rows(
            "SELECT b.dag_id, p.action, COALESCE(p.reason, '') FROM plan p
             JOIN backfills b ON b.id = p.backfill_id WHERE b.id = 4"
        ),
        [["monthly_revenue", "skip", "upstream not successful"]],
        "September reads 2026-09-10, whose latest run was rejected"
    );
    assert_eq!(
        crate::gate::wh_count(&p, "SELECT COUNT(*) FROM monthly_revenue"),
        0
    );
}

/// September's days published by a plain backfill, then a cascade over September and October:
/// September's month never ran, so the cascade computes it too, and the dry run says so. Run
/// again, the cascade has nothing left to compute downstream.
#[test]
fn a_cascade_computes_the_downstream_intervals_over_days_already_done() {
    let p = crate::gate::shop();
    let shop = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
    p.write(
        "dags/monthly_revenue.toml",
        &std::fs::read_to_string(shop.join("dags/monthly_revenue.toml")).unwrap(),
    );
    p.create("daily_orders", "2026-09-01", "2026-09-30", &["-q"])
        .code(0);
    let two_months = |extra: &[&str]| {
        let mut args = vec!["--cascade", "all"];
        args.extend_from_slice(extra);
        p.create("daily_orders", "2026-09-01", "2026-10-31", &args)
    };
    let dry = two_months(&["--dry-run", "--output", "json"]);
    dry.code(0);
    let months: Vec<(String, String)> = dry.json()["plans"][1]["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["start"].as_str().unwrap()[..10].to_string(),
                i["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        months,
        [
            ("2026-09-01".to_string(), "run".to_string()),
            ("2026-10-01".to_string(), "run".to_string())
        ]
    );
    two_months(&[])
        .code(0)
        .stderr_has("of daily_orders: 61 intervals, 31 to run, 30 skipped")
        .stderr_has("of monthly_revenue: 2 intervals, 2 to run, 0 skipped");
    for (month, from, to) in [
        ("2026-09-01", "2026-09-01", "2026-10-01"),
        ("2026-10-01", "2026-10-01", "2026-11-01"),
    ] {
        assert_eq!(
            crate::gate::wh_count(
                &p,
                &format!("SELECT SUM(orders) FROM monthly_revenue WHERE month = '{month}'")
            ),
            crate::gate::wh_count(
                &p,
                &format!(
                    "SELECT COUNT(*) FROM raw_orders WHERE order_ts >= '{from}' AND order_ts < '{to}'"
                )
            ),
            "{month} counts its orders"
        );
    }
    two_months(&[])
        .code(0)
        .stderr_has("cascade: nothing to run for DAG `monthly_revenue`");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM backfills WHERE dag_id = 'monthly_revenue'"),
        1
    );
}
