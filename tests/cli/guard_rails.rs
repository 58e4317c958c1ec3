//! Guard rails for large backfills: `--max-failures`, `--tasks`, and the dry run's estimate.

use crate::support::Project;

const TWO_TASKS: &str = r#"
schedule = "@daily"
[[tasks]]
id = "load"
command = "test ! -e fail-{{ ds }} && touch load-{{ ds }}"
[[tasks]]
id = "report"
depends_on = ["load"]
command = "touch report-{{ ds }}"
"#;

/// `(interval start day, state)` of every run, in order.
fn runs(p: &Project) -> Vec<(String, String)> {
    p.rows("SELECT date(interval_start), state FROM report_runs ORDER BY interval_start, run_id")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect()
}

#[test]
fn max_failures_stops_after_the_second_failure_and_resume_finishes() {
    let p = Project::new().dag("d", TWO_TASKS);
    for day in ["2026-01-02", "2026-01-04", "2026-01-05"] {
        p.write(&format!("fail-{day}"), "");
    }
    let out = p.create(
        "d",
        "2026-01-01",
        "2026-01-08",
        &["--max-failures", "2", "--max-active-runs", "1"],
    );
    out.code(3)
        .stderr_has(
            "2 intervals failed (--max-failures 2): no new intervals; the running ones finish",
        )
        .stderr_has(
            "backfill 1 of d: failed — 2 succeeded, 2 failed, 0 rejected, 0 cancelled, 0 skipped in",
        )
        .stderr_has(&format!(
            "4 intervals not started: continue with `{}`",
            p.hint("resume 1")
        ));
    assert_eq!(
        runs(&p),
        [
            ("2026-01-01", "succeeded"),
            ("2026-01-02", "failed"),
            ("2026-01-03", "succeeded"),
            ("2026-01-04", "failed"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert!(
        !p.path("load-2026-01-05").exists(),
        "nothing after the second failure"
    );
    let show = p.run(&["show", "1", "--output", "json"]);
    assert_eq!(show.json()["state"], "failed");
    assert_eq!(show.json()["max_failures"], 2);
    assert_eq!(show.json()["intervals"]["pending"], 4);

    // Resume continues with the same limit, counted afresh: 01-05 fails (one), the rest run.
    let out = p.run(&["resume", "1"]);
    out.code(3);
    let all = runs(&p);
    assert_eq!(all.len(), 8, "{all:?}");
    assert_eq!(all[4], ("2026-01-05".to_string(), "failed".to_string()));
    for (day, state) in &all[5..] {
        assert_eq!(state, "succeeded", "{day}");
    }
    assert_eq!(
        p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 1"),
        8
    );
}

#[test]
fn tasks_runs_only_the_named_tasks_and_is_recorded() {
    let p = Project::new().dag("d", TWO_TASKS);
    p.create("d", "2026-01-01", "2026-01-02", &["--tasks", "report"])
        .code(0);
    assert!(p.path("report-2026-01-01").exists());
    assert!(
        !p.path("load-2026-01-01").exists(),
        "load is not run: it counts as done"
    );
    assert_eq!(
        p.rows("SELECT DISTINCT task_id FROM task_tries"),
        [["report"]]
    );
    let show = p.run(&["show", "1", "--output", "json"]);
    assert_eq!(show.json()["tasks"], serde_json::json!(["report"]));
    p.run(&["show", "1"])
        .code(0)
        .stdout_has("only tasks report");
    // A failure's rerun command keeps --tasks.
    p.write("fail-2026-01-03", "");
    let out = p.create("d", "2026-01-03", "2026-01-03", &["--tasks", "load"]);
    out.code(3)
        .stderr_has("--reprocess-behavior failed --tasks load`");
    // An unknown task is bad input: exit 2, nothing written.
    let before = p.count("SELECT COUNT(*) FROM backfills");
    p.create("d", "2026-01-04", "2026-01-04", &["--tasks", "load,nope"])
        .code(2)
        .stderr_has("--tasks load,nope: DAG `d` has no task `nope` (its tasks: load, report)");
    assert_eq!(p.count("SELECT COUNT(*) FROM backfills"), before);
}

/// A task in pool `api` that records how many tasks of the pool run at once.
pub(crate) fn pooled(name: &str) -> String {
    format!(
        r#"
schedule = "@daily"
max_active_runs = 4
[[tasks]]
id = "fetch"
pool = "api"
command = "mkdir -p running && touch running/{name}-{{{{ ds }}}} && ls running | wc -l >> seen && sleep 0.3 && rm running/{name}-{{{{ ds }}}}"
"#
    )
}

/// `create` of DAG `dag` (a [`pooled`] one) over six days.
pub(crate) fn six_days(dag: &'static str) -> [&'static str; 7] {
    [
        "create",
        "--dag",
        dag,
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-06",
    ]
}

/// Two processes, each a backfill of six days of a [`pooled`] DAG (`a`, `b`) under the pools of
/// `pools` (`backfill.toml`); waits until `show` says `waiting` of one of their tries, then for
/// both to succeed.
fn two_pooled_backfills(pools: &str, waiting: &str) -> Project {
    let p = Project::new().dag("a", &pooled("a")).dag("b", &pooled("b"));
    p.write("backfill.toml", pools);
    let a = p.spawn("a", &six_days("a"));
    let b = p.spawn("b", &six_days("b"));
    crate::support::wait_until(
        &format!("show to say `{waiting}`"),
        std::time::Duration::from_secs(20),
        || {
            p.has_manifest()
                && ["1", "2"]
                    .iter()
                    .any(|id| p.run(&["show", id]).stdout.contains(waiting))
        },
    );
    p.wait("a", a).code(0);
    p.wait("b", b).code(0);
    p
}

#[test]
fn two_backfills_in_two_processes_share_a_pool_of_two() {
    // With 8 intervals wanting to run and 2 slots, tries wait, and `show` says so.
    let p = two_pooled_backfills("[pools]\napi = 2\n", "waiting for pool api");
    let seen: Vec<u32> = p
        .read("seen")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 12, "every interval ran once");
    assert_eq!(
        seen.iter().max(),
        Some(&2),
        "never more than 2 at once: {seen:?}"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        12
    );
}

/// The starts of pool `pool` as the manifest recorded them (milliseconds at its clock),
/// checked: no window of `per_ms` holds more than `n` of them. Returns them in order.
pub(crate) fn rate_kept(p: &Project, pool: &str, n: usize, per_ms: i64) -> Vec<i64> {
    let starts: Vec<i64> = p
        .rows(&format!(
            "SELECT at FROM pool_starts WHERE pool = '{pool}' ORDER BY at"
        ))
        .into_iter()
        .map(|r| r[0].parse().unwrap())
        .collect();
    for w in starts.windows(n + 1) {
        assert!(
            w[n] - w[0] >= per_ms,
            "{} starts within {} ms: {w:?} (all: {starts:?})",
            n + 1,
            w[n] - w[0]
        );
    }
    starts
}

#[test]
fn a_pools_rate_bounds_the_starts_of_two_backfills_in_two_processes() {
    // 12 starts at 3 a second: tries wait for the rate, and `show` says so.
    let p = two_pooled_backfills(
        "[pools]\napi = { slots = 10, rate = \"3/1s\" }\n",
        "waiting for pool api (rate)",
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        12
    );
    let starts = rate_kept(&p, "api", 3, 1000);
    assert_eq!(starts.len(), 12, "{starts:?}");
    // The rate is used, not starved: 4 windows of starts, the last 3 s after the first (a
    // try that waits asks again as the window makes room, at most a second later).
    let span = starts[11] - starts[0];
    assert!((3000..8000).contains(&span), "{span} ms: {starts:?}");
}

#[test]
fn an_unknown_pool_or_a_bad_size_is_a_validation_error() {
    let p = Project::new().dag("a", &pooled("a"));
    p.write("backfill.toml", "[pools]\nother = 0\n");
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("backfill.toml:2:9: pool `other`: its size is how many tries may run at once, a whole number from 1 to 10000");
    p.write("backfill.toml", "[pools]\nother = 2\n");
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("dags/a.toml:6:8: task `fetch`: unknown pool `api`; declare it in backfill.toml as [pools] api = 2 (known: other)");
    // Rates: a period that is none, a pool without slots, a misspelt key; nothing written.
    p.write(
        "backfill.toml",
        "[pools]\napi = { slots = 2, rate = \"3/fortnight\" }\nweb = { rate = \"1/s\" }\nx = { slots = 1, rat = \"1/s\" }\n",
    );
    let out = p.create("a", "2026-01-01", "2026-01-01", &[]);
    out.code(2)
        .stderr_has("backfill.toml:2:27: pool `api`: rate `3/fortnight`: `fortnight` is not a period; write it as starts per period, such as \"100/min\", \"5/s\", \"1000/hour\" or \"30/10s\"")
        .stderr_has("backfill.toml:3:7: pool `web` needs `slots`, how many of its tries may run at once: web = { slots = 4, rate = \"100/min\" }")
        .stderr_has("backfill.toml:4:18: unknown key `rat` in pools.x; did you mean `rate`?");
    assert!(!p.has_manifest());
    // A pool with a rate takes no batches: said where the DAG names the pool.
    p.write(
        "backfill.toml",
        "[pools]\napi = { slots = 2, rate = \"2/s\" }\n",
    );
    p.write(
        "dags/a.toml",
        &pooled("a").replace("max_active_runs = 4", "max_active_runs = 4\nbatch_size = 3"),
    );
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("dags/a.toml:7:8: task `fetch`: pool `api` has a rate, and this DAG's batch_size = 3 would run its intervals in batches");
    p.write("dags/a.toml", &pooled("a"));
    p.write("backfill.toml", "[pools]\napi = \"x\"\n");
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("backfill.toml:2:7: pool `api` must be its number of slots (api = 2) or a table (api = { slots = 4, rate = \"100/min\" }), not a string");
}

#[test]
fn the_dry_run_estimates_the_wall_time_from_the_history() {
    let p = Project::new().dag("d", TWO_TASKS);
    p.write("backfill.toml", "[pools]\nreports = 1\n");
    let dry = |extra: &[&str]| {
        let mut args = vec![
            "create",
            "--dag",
            "d",
            "--from",
            "2026-02-01",
            "--to",
            "2026-02-12",
            "--dry-run",
        ];
        args.extend_from_slice(extra);
        p.run(&args)
    };
    // No history: no estimate, and it says why.
    let doc = dry(&["--output", "json"]).json();
    assert_eq!(doc["estimate_seconds"], serde_json::Value::Null);
    assert_eq!(doc["estimate_tries"], 0);
    dry(&[]).code(0).stdout_has(
        "estimate: none yet (`load`, `report` never succeeded; each task's median duration comes from its recent successful tries)",
    );
    p.create("d", "2026-01-01", "2026-01-05", &[]).code(0);
    // Durations as history records them: load 2 s, report 1 s (five tries each).
    p.exec(
        "UPDATE task_tries SET ended_at = started_at + CASE task_id WHEN 'load' THEN 2000 ELSE 1000 END",
    );
    // 12 intervals of 3 s, 4 at a time: 9 s.
    let doc = dry(&["--max-active-runs", "4", "--output", "json"]).json();
    assert_eq!(doc["estimate_seconds"], 9.0);
    assert_eq!(doc["estimate_tries"], 10);
    dry(&["--max-active-runs", "4"]).code(0).stdout_has(
        "estimate: about 9s at up to 4 at a time (median durations of 10 recent successful tries)",
    );
    // `report` in a pool of one: its 12 tries take 12 s one after the other.
    let dag = TWO_TASKS.replace(
        "command = \"touch report-{{ ds }}\"",
        "command = \"touch report-{{ ds }}\"\npool = \"reports\"",
    );
    p.write("dags/d.toml", &dag);
    let doc = dry(&["--max-active-runs", "4", "--output", "json"]).json();
    assert_eq!(doc["estimate_seconds"], 12.0);
    // A rate of 2 starts a minute: the 12 tries of `report` start over 6 minutes, the last 5
    // minutes after the first.
    p.write(
        "backfill.toml",
        "[pools]\nreports = { slots = 1, rate = \"2/min\" }\n",
    );
    let doc = dry(&["--max-active-runs", "4", "--output", "json"]).json();
    assert_eq!(doc["estimate_seconds"], 300.0);
    assert_eq!(
        doc["estimate_rate"],
        serde_json::json!({"pool": "reports", "rate": "2/1m", "seconds": 300.0})
    );
    dry(&["--max-active-runs", "4"]).code(0).stdout_has(
        "estimate: about 5m 0s at up to 4 at a time (median durations of 10 recent successful tries); the rate of pool `reports` (2/1m) alone takes about 5m 0s",
    );
}

#[test]
fn a_pool_slot_of_a_killed_backfill_is_free_only_once_its_task_is_dead() {
    let p = Project::new()
        .dag(
            "a",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\npool = \"api\"\ncommand = \"echo $$ > a.pid; exec sleep 60\"\n",
        )
        .dag(
            "b",
            // Whether a's task is alive (a zombie has exited: it only waits to be reaped).
            r#"schedule = "@daily"
[[tasks]]
id = "t"
pool = "api"
command = '''s=$(awk '{print $3}' /proc/$(cat a.pid)/stat 2>/dev/null); if [ -n "$s" ] && [ "$s" != Z ]; then touch overlapped; fi'''
"#,
        );
    p.write("backfill.toml", "[pools]\napi = 1\n");
    let mut a = p.spawn(
        "a",
        &[
            "create",
            "--dag",
            "a",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    crate::support::wait_until(
        "a's task to run",
        std::time::Duration::from_secs(20),
        || p.path("a.pid").exists(),
    );
    // The owner dies; its task lives on, holding the pool's only slot.
    a.kill().unwrap();
    a.wait().unwrap();
    let orphan: i32 = p.read("a.pid").trim().parse().unwrap();
    assert!(crate::support::alive(orphan));
    p.create("b", "2026-01-01", "2026-01-01", &[]).code(0);
    assert!(
        !p.path("overlapped").exists(),
        "b ran while a's task still ran"
    );
    assert!(
        !crate::support::alive(orphan),
        "a's task was killed to free its slot"
    );
}

#[test]
fn depends_on_past_holds_after_a_resume_and_tasks_runs_do_not_count_as_done() {
    let p = Project::new().dag(
        "d",
        "schedule = \"@daily\"\ndepends_on_past = true\n[[tasks]]\nid = \"t\"\ncommand = \"test ! -e fail-{{ ds }}\"\n[[tasks]]\nid = \"u\"\ncommand = \"touch u-{{ ds }}\"\n",
    );
    p.write("fail-2026-01-03", "");
    p.create("d", "2026-01-01", "2026-01-06", &["--max-failures", "1"])
        .code(3);
    p.run(&["resume", "1"]).code(3);
    assert_eq!(
        runs(&p),
        [
            ("2026-01-01", "succeeded"),
            ("2026-01-02", "succeeded"),
            ("2026-01-03", "failed"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "after the failed day, no later day runs, also after resume"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 1 AND reason = 'previous interval not successful'"),
        3
    );
    // A run of only `u` is not a run of the interval: a plain create still runs it.
    let q = Project::new().dag("d", TWO_TASKS);
    q.create(
        "d",
        "2026-01-01",
        "2026-01-01",
        &["--tasks", "report,report"],
    )
    .code(0);
    assert_eq!(
        q.run(&["show", "1", "--output", "json"]).json()["tasks"],
        serde_json::json!(["report"])
    );
    q.create("d", "2026-01-01", "2026-01-01", &[])
        .code(0)
        .stderr_has("1 interval, 1 to run, 0 skipped");
    assert!(q.path("load-2026-01-01").exists());
}

#[test]
fn a_frozen_holder_whose_slot_was_given_away_never_starts_its_try() {
    use nix::sys::signal::Signal;
    let p = Project::new()
        .dag(
            "px",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\npool = \"api\"\ncommand = \"touch ran-px\"\n",
        )
        .dag(
            "py",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\npool = \"api\"\ncommand = \"touch ran-py\"\n",
        );
    p.write(
        "backfill.toml",
        "lease_timeout = \"1s\"\n[pools]\napi = 1\n",
    );
    // px's owner freezes with its try spawned but not yet let go (no process group recorded).
    let px = p.spawn_with(
        "px",
        &[
            "create",
            "--dag",
            "px",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
        &[("BACKFILL_FAULT", "after-spawn:stop")],
    );
    crate::support::wait_until("px to freeze", std::time::Duration::from_secs(20), || {
        crate::support::stopped(px.id())
    });
    crate::support::wait_stale(&p, 1, 1500);
    p.create("py", "2026-01-01", "2026-01-01", &[]).code(0);
    assert!(p.path("ran-py").exists());
    crate::support::signal(&px, Signal::SIGCONT);
    let _ = p.wait("px", px);
    assert!(
        !p.path("ran-px").exists(),
        "the woken owner's try never ran: its slot was given away"
    );
    assert_eq!(
        p.rows("SELECT state FROM task_tries WHERE id = 1"),
        [["cancelled"]]
    );
}

/// A try held back by its pool's rate holds no slot and stops waiting at `cancel`: the backfill
/// ends interrupted at once, the waiting try recorded as stopped in the pool, and `resume`
/// runs it.
#[test]
fn a_try_waiting_for_the_rate_stops_at_cancel_and_resume_runs_it() {
    let p = Project::new().dag("a", &pooled("a"));
    p.write(
        "backfill.toml",
        "[pools]\napi = { slots = 4, rate = \"1/1h\" }\n",
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "a",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    );
    crate::support::wait_until(
        "a try to wait for the rate",
        std::time::Duration::from_secs(20),
        || {
            p.has_manifest()
                && p.run(&["show", "1"])
                    .stdout
                    .contains("waiting for pool api (rate)")
        },
    );
    // One started and ended; the other waits, holding no slot.
    crate::support::wait_until(
        "the first try to end",
        std::time::Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'succeeded'") == 1,
    );
    assert_eq!(
        p.count(
            "SELECT COUNT(*) FROM pool_slots s JOIN task_tries t ON t.id = s.try_id
             WHERE t.state = 'running'"
        ),
        0
    );
    let began = std::time::Instant::now();
    p.run(&["cancel", "1"]).code(0);
    crate::support::wait_within(&p, "run", child, std::time::Duration::from_secs(30)).code(130);
    assert!(began.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(
        // Which of the two days started first is the dispatcher's to decide.
        p.rows("SELECT state, error FROM task_tries ORDER BY state DESC"),
        [
            ["succeeded", "NULL"],
            ["cancelled", "stopped while waiting for a slot of its pool"]
        ]
    );
    // An hour later (the start leaves the window), `resume` runs the rest.
    p.exec("UPDATE pool_starts SET at = at - 3600000");
    p.run(&["resume", "1"]).code(0);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        2
    );
}
