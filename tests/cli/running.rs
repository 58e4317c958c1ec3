//! Running backfills: order, bounded concurrency, task order, retries, the task environment,
//! result files, logs, depends_on_past, and the read commands.

use crate::support::{Project, day, day_unix};

fn ordered_dag() -> &'static str {
    r#"
schedule = "@daily"
[[tasks]]
id = "record"
command = "echo {{ ds }} >> order.txt"
"#
}

#[test]
fn forward_order_starts_oldest_first_and_backwards_newest_first() {
    let p = Project::new().dag("d", ordered_dag());
    p.run(&[
        "create",
        "--dag",
        "d",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-05",
        "--max-active-runs",
        "1",
    ])
    .code(0);
    assert_eq!(
        p.read("order.txt"),
        "2026-01-01\n2026-01-02\n2026-01-03\n2026-01-04\n2026-01-05\n"
    );
    std::fs::remove_file(p.path("order.txt")).unwrap();
    p.run(&[
        "create",
        "--dag",
        "d",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-05",
        "--max-active-runs",
        "1",
        "--run-backwards",
        "--reprocess-behavior",
        "completed",
    ])
    .code(0);
    assert_eq!(
        p.read("order.txt"),
        "2026-01-05\n2026-01-04\n2026-01-03\n2026-01-02\n2026-01-01\n"
    );
}

#[test]
fn at_most_max_active_runs_intervals_overlap_and_that_many_do() {
    // Each task counts the tries running at once under a lock, and waits (up to 20 s) until
    // three have been seen together, so that the peak does not depend on timing.
    let p = Project::new().dag(
        "d",
        r#"
schedule = "@daily"
[[tasks]]
id = "slow"
command = '''
count() { ( flock 8; n=$(( $(cat running 2>/dev/null || echo 0) + $1 )); echo $n > running; echo $n >> seen ) 8> lock; }
count 1
for i in $(seq 400); do grep -qx 3 seen && break; sleep 0.05; done
count -1
'''
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "d",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-09",
        "--max-active-runs",
        "3",
    ])
    .code(0);
    let seen: Vec<i64> = p
        .read("seen")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 18, "9 starts and 9 ends");
    assert_eq!(
        seen.iter().max(),
        Some(&3),
        "exactly 3 intervals overlap at the peak"
    );
    assert_eq!(seen.last(), Some(&0));
}

#[test]
fn tasks_run_in_depends_on_order_with_the_environment_and_templates() {
    let p = Project::new().dag(
        "env",
        r#"
schedule = "@daily"
timezone = "Europe/Berlin"

[[tasks]]
id = "second"
depends_on = ["first"]
command = ["sh", "-c", "echo second >> order.txt; env | grep ^BACKFILL_ | sort > env-second.txt"]

[[tasks]]
id = "first"
command = ["sh", "-c", "echo first >> order.txt; echo $0 > args.txt", "{{ ds }}|{{ ds_nodash }}|{{ data_interval_start }}|{{ data_interval_end }}|{{ dag_id }}|{{ task_id }}|{{ try_number }}|{{ conf.region }}"]
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "env",
        "--from",
        "2026-03-29",
        "--to",
        "2026-03-29",
        "--conf",
        r#"{"region": "eu"}"#,
    ])
    .code(0);
    assert_eq!(p.read("order.txt"), "first\nsecond\n");
    // The local day 2026-03-29 in Berlin is the 23-hour day.
    assert_eq!(
        p.read("args.txt"),
        "2026-03-29|20260329|2026-03-28T23:00:00Z|2026-03-29T22:00:00Z|env|first|1|eu\n"
    );
    let env = p.read("env-second.txt");
    let run_id = p.rows("SELECT id FROM runs")[0][0].clone();
    for line in [
        "BACKFILL_DAG_ID=env".to_string(),
        "BACKFILL_TASK_ID=second".to_string(),
        format!("BACKFILL_RUN_ID={run_id}"),
        "BACKFILL_TRY_NUMBER=1".to_string(),
        "BACKFILL_DATA_INTERVAL_START=2026-03-28T23:00:00Z".to_string(),
        "BACKFILL_DATA_INTERVAL_END=2026-03-29T22:00:00Z".to_string(),
        "BACKFILL_DS=2026-03-29".to_string(),
        r#"BACKFILL_CONF={"region":"eu"}"#.to_string(),
    ] {
        assert!(env.lines().any(|l| l == line), "missing {line} in\n{env}");
    }
    assert!(env.contains("BACKFILL_RESULT="));
}

#[test]
fn a_missing_conf_key_is_an_error_before_anything_is_written() {
    let p = Project::new().dag(
        "env",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"echo {{ conf.region }}\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "env",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(2)
    .stderr_has("error: dags/env.toml:4:11: task `a`: template uses `conf.region`, which --conf does not give; pass it with --conf '{\"region\": ...}'");
    assert!(!p.manifest_path().exists());
}

#[test]
fn the_result_file_and_log_path_are_recorded_per_try() {
    let p = Project::new().dag(
        "r",
        r#"
schedule = "@daily"
[[tasks]]
id = "load"
command = '''echo "loading {{ ds }}"; printf '{"rows": 42, "partitions": ["ds={{ ds }}"], "inputs": ["raw/{{ ds }}"], "fingerprint": "abc"}' > "$BACKFILL_RESULT"'''
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "r",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    let rows =
        p.rows("SELECT state, rows, partitions, inputs, fingerprint, log_path FROM task_tries");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0][..5],
        [
            "succeeded",
            "42",
            r#"["ds=2026-01-02"]"#,
            r#"["raw/2026-01-02"]"#,
            "abc"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&rows[0][5]).unwrap(),
        "loading 2026-01-02\n"
    );
    let show = p.run(&["show", "1", "--output", "json"]);
    show.code(0);
    assert_eq!(show.json()["interval_details"][0]["rows"], 42);
}

#[test]
fn a_failing_task_is_retried_then_fails_the_interval_with_exit_3_and_its_log_tail() {
    let p = Project::new().dag(
        "f",
        r#"
schedule = "@daily"
retries = 2
retry_delay = "10ms"
[[tasks]]
id = "flaky"
command = '''n=$(cat tries-{{ ds }} 2>/dev/null || echo 0); echo $((n+1)) > tries-{{ ds }}; echo "boom on try {{ try_number }}"; [ "{{ ds }}" != 2026-01-02 ] || [ $n -ge 1 ]'''
[[tasks]]
id = "after"
depends_on = ["flaky"]
command = "echo after {{ ds }} >> after.txt"
"#,
    );
    // 2026-01-02 fails once and succeeds on the retry; 2026-01-03 never fails.
    p.run(&[
        "create",
        "--dag",
        "f",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-03",
    ])
    .code(0);
    assert_eq!(p.read("tries-2026-01-02"), "2\n");
    assert_eq!(p.read("after.txt").lines().count(), 2);

    let p = Project::new().dag(
        "f",
        r#"
schedule = "@daily"
retries = 2
retry_delay = "10ms"
[[tasks]]
id = "broken"
command = "echo 'boom on try {{ try_number }}'; exit 7"
[[tasks]]
id = "after"
depends_on = ["broken"]
command = "touch after-ran"
"#,
    );
    let out = p.run(&[
        "create",
        "--dag",
        "f",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-02",
    ]);
    out.code(3)
        .stderr_has("try 3 of task `broken` for 2026-01-02 failed: exit code 7 (no retries left)")
        .stderr_has("| boom on try 3")
        .stderr_has("--reprocess-behavior failed");
    let tries = p.rows("SELECT try_number, state, exit_code, error FROM task_tries ORDER BY id");
    assert_eq!(
        tries,
        [
            ["1", "failed", "7", "exit code 7"],
            ["2", "failed", "7", "exit code 7"],
            ["3", "failed", "7", "exit code 7"],
        ]
    );
    assert!(
        !p.path("after-ran").exists(),
        "a task after a failed one does not run"
    );
    assert_eq!(
        p.rows("SELECT state, error FROM runs"),
        [["failed", "task `broken` failed: exit code 7"]]
    );
    assert_eq!(p.rows("SELECT state FROM backfills"), [["failed"]]);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM leases"),
        0,
        "leases are released"
    );
}

#[test]
fn depends_on_past_skips_intervals_after_a_failure() {
    let p = Project::new().dag(
        "p",
        r#"
schedule = "@daily"
depends_on_past = true
max_active_runs = 4
[[tasks]]
id = "t"
command = '''echo {{ ds }} >> ran.txt; [ "{{ ds }}" != 2026-01-03 ]'''
"#,
    );
    let out = p.run(&[
        "create",
        "--dag",
        "p",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-05",
        "--output",
        "json",
    ]);
    out.code(3);
    assert_eq!(p.read("ran.txt"), "2026-01-01\n2026-01-02\n2026-01-03\n");
    let plan = p.rows("SELECT interval_start, action, COALESCE(reason, '') FROM plan ORDER BY ord");
    let expect =
        |d: u32, a: &str, r: &str| vec![day_unix(d).to_string(), a.to_string(), r.to_string()];
    assert_eq!(
        plan,
        [
            expect(1, "run", ""),
            expect(2, "run", ""),
            expect(3, "run", ""),
            expect(4, "skip", "previous interval not successful"),
            expect(5, "skip", "previous interval not successful"),
        ]
    );
    // A later backfill judges the first interval on the one before it.
    let out = p.run(&[
        "create",
        "--dag",
        "p",
        "--from",
        "2026-01-04",
        "--to",
        "2026-01-05",
        "--dry-run",
        "--output",
        "json",
    ]);
    let doc = out.json();
    assert_eq!(
        doc["intervals"][0]["reason"],
        "previous interval not successful"
    );
}

#[test]
fn list_show_runs_and_dags_read_the_manifest() {
    let p = Project::new().dag("d", ordered_dag());
    let out = p.run(&[
        "create",
        "--dag",
        "d",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
        "--output",
        "json",
    ]);
    out.code(0);
    let summary = out.json();
    assert_eq!(summary["backfill_id"], 1);
    assert_eq!(summary["state"], "completed");
    assert_eq!(summary["intervals"]["succeeded"], 3);

    let list = p.run(&["list", "--output", "json"]).json();
    assert_eq!(list[0]["id"], 1);
    assert_eq!(list[0]["dag_id"], "d");
    assert_eq!(list[0]["state"], "completed");
    assert_eq!(
        p.run(&["list", "--active", "--output", "json"]).json(),
        serde_json::json!([])
    );

    let show = p.run(&["show", "1", "--output", "json"]).json();
    let intervals = show["interval_details"].as_array().unwrap();
    assert_eq!(intervals.len(), 3);
    assert_eq!(intervals[0]["start"], day(1));
    assert_eq!(intervals[0]["state"], "succeeded");
    assert_eq!(intervals[0]["attempts"], 1);
    assert_eq!(intervals[0]["tries"], 1);
    p.run(&["show", "1"])
        .code(0)
        .stdout_has("backfill 1 of d: completed");

    let runs = p
        .run(&[
            "runs",
            "--dag",
            "d",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-03",
            "--output",
            "json",
        ])
        .json();
    let starts: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["start"].as_str().unwrap())
        .collect();
    assert_eq!(starts, [day(2), day(3)]);

    let dags = p.run(&["dags", "--output", "json"]).json();
    assert_eq!(dags[0]["id"], "d");
    assert_eq!(dags[0]["schedule"], "@daily");
    assert_eq!(dags[0]["tasks"][0]["id"], "record");
    p.run(&["dags", "validate"])
        .code(0)
        .stderr_has("1 DAG file OK");
}

#[test]
fn hourly_berlin_on_the_fall_back_day_plans_25_intervals() {
    let p = Project::new().dag(
        "h",
        "schedule = \"@hourly\"\ntimezone = \"Europe/Berlin\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let doc = p
        .run(&[
            "create",
            "--dag",
            "h",
            "--from",
            "2026-10-25",
            "--to",
            "2026-10-25",
            "--dry-run",
            "--output",
            "json",
        ])
        .json();
    let intervals = doc["intervals"].as_array().unwrap();
    assert_eq!(intervals.len(), 25);
    assert_eq!(intervals[0]["start"], "2026-10-24T22:00:00Z");
    assert_eq!(intervals[24]["end"], "2026-10-25T23:00:00Z");
}

#[test]
fn relative_ranges_use_the_clock_and_future_intervals_are_not_yet_complete() {
    let p = Project::new().dag("d", ordered_dag());
    // BACKFILL_NOW is 2026-11-29T12:00Z: today's interval has not ended yet.
    let doc = p
        .run(&[
            "create",
            "--dag",
            "d",
            "--from",
            "today-2d",
            "--to",
            "today",
            "--dry-run",
            "--output",
            "json",
        ])
        .json();
    let plan: Vec<(&str, &str)> = doc["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["start"].as_str().unwrap(),
                i["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        plan,
        [
            ("2026-11-27T00:00:00Z", ""),
            ("2026-11-28T00:00:00Z", ""),
            ("2026-11-29T00:00:00Z", "not yet complete"),
        ]
    );
}

#[test]
fn logs_keep_stdout_and_stderr_in_order_and_silent_tries_leave_no_file() {
    let p = Project::new().dag(
        "l",
        r#"
schedule = "@daily"
[[tasks]]
id = "talk"
command = '''if [ "{{ ds }}" = 2026-01-01 ]; then echo one; echo two >&2; echo three; fi'''
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "l",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    let logs = p.rows("SELECT log_path FROM task_tries ORDER BY id");
    assert_eq!(
        std::fs::read_to_string(&logs[0][0]).unwrap(),
        "one\ntwo\nthree\n"
    );
    assert!(
        !std::path::Path::new(&logs[1][0]).exists(),
        "a silent try has no log file"
    );
}

/// What a quiet cron job mails when an interval fails: the interval, the error, the end of its
/// log, and a last line with the DAG and the counts.
#[test]
fn a_quiet_failure_says_the_end_of_the_log_and_the_dag_and_counts() {
    let p = Project::new().dag(
        "nightly",
        r#"schedule = "@daily"
[[tasks]]
id = "load"
command = "if [ {{ ds }} = 2026-03-02 ]; then echo connecting; echo 'ERROR: relation sales does not exist' >&2; exit 1; fi"
"#,
    );
    let out = p.create("nightly", "2026-03-01", "2026-03-03", &["-q"]);
    out.code(3);
    assert_eq!(out.stdout, "");
    let tail = "  | connecting\n  | ERROR: relation sales does not exist\n";
    assert!(
        out.stderr
            .contains("failed 2026-03-02: task `load` failed: exit code 1\n  log: ")
            && out.stderr.contains(tail),
        "{}",
        out.stderr
    );
    let last = out.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("backfill 1 of nightly: failed — 2 succeeded, 1 failed, 0 rejected"),
        "{last}"
    );
}

#[test]
fn one_at_a_time_means_one_run_at_a_time_in_the_manifest() {
    // An interval that succeeded gives its slot back once its end is queued for the manifest,
    // so the next one starts while that end commits; the manifest still never holds two
    // running runs at `--max-active-runs 1`: each run starts after the one before ended.
    let p = Project::new().dag("d", ordered_dag());
    p.run(&[
        "create",
        "--dag",
        "d",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-20",
        "--max-active-runs",
        "1",
    ])
    .code(0);
    assert_eq!(
        p.count("SELECT count(*) FROM runs WHERE state = 'succeeded'"),
        20
    );
    assert!(
        most_running_at_once(&p) <= 1,
        "{:?}",
        p.rows("SELECT started_at, ended_at FROM runs ORDER BY id")
    );
}

/// The most runs of `p` that the manifest shows running at one instant (a run ending at the
/// millisecond another starts does not overlap it).
fn most_running_at_once(p: &Project) -> usize {
    let runs = p.rows("SELECT started_at, ended_at FROM runs ORDER BY id");
    let spans: Vec<(i64, i64)> = runs
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
        .collect();
    spans
        .iter()
        .map(|&(s, _)| spans.iter().filter(|&&(a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn slow_manifest_commits_never_show_more_running_runs_than_max_active_runs() {
    // Every manifest commit takes 30 ms, so that ends freed early are still queued while the
    // next intervals start and their tasks end; two tasks per interval, so that a task's end
    // (not the run's) is recorded without freeing anything.
    let p = Project::new().dag(
        "d",
        r#"
schedule = "@daily"
[[tasks]]
id = "first"
command = "true"
[[tasks]]
id = "second"
depends_on = ["first"]
command = "echo {{ ds }} >> order.txt"
"#,
    );
    let out = p.run_with(
        &[
            "create",
            "--dag",
            "d",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-12",
            "--max-active-runs",
            "2",
        ],
        &[("BACKFILL_FAULT", "slow-commit:30ms")],
    );
    out.code(0);
    assert_eq!(
        p.count("SELECT count(*) FROM runs WHERE state = 'succeeded'"),
        12
    );
    assert_eq!(p.read("order.txt").lines().count(), 12);
    assert!(
        most_running_at_once(&p) <= 2,
        "{:?}",
        p.rows("SELECT interval_start, started_at, ended_at FROM runs ORDER BY id")
    );
}

#[test]
fn a_failure_after_successes_freed_early_stops_at_max_failures_one() {
    // Day 1 succeeds (its slot is freed while its end commits slowly), day 2 fails: with
    // `--max-failures 1` and one run at a time, day 3 never starts.
    let p = Project::new().dag(
        "d",
        r#"
schedule = "@daily"
retries = 0
[[tasks]]
id = "t"
command = "echo {{ ds }} >> order.txt; [ {{ ds }} != 2026-01-02 ]"
"#,
    );
    let out = p.run_with(
        &[
            "create",
            "--dag",
            "d",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-06",
            "--max-active-runs",
            "1",
            "--max-failures",
            "1",
        ],
        &[("BACKFILL_FAULT", "slow-commit:30ms")],
    );
    out.code(3);
    assert_eq!(p.read("order.txt"), "2026-01-01\n2026-01-02\n");
    assert_eq!(
        p.rows("SELECT state FROM runs ORDER BY interval_start"),
        vec![vec!["succeeded".to_string()], vec!["failed".to_string()]]
    );
    assert!(most_running_at_once(&p) <= 1);
}
