//! The guarantees under fault injection: kills and freezes at the worst moments, failing
//! writes, interrupted commands, leftovers of dead processes. Each test makes its timing window
//! deterministic with a fault point (`BACKFILL_FAULT`) or by waiting for a condition.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{
    Out, Project, THREE_DAYS, alive, pg_manifest, signal, stopped, wait_stale, wait_until,
};

/// A task that holds a per-interval lock while it runs (another try of the same interval at
/// the same time is recorded in overlaps.txt) and logs its start and end.
fn locked_dag(secs: &str, extra: &str) -> String {
    format!(
        r#"
schedule = "@daily"
{extra}
[[tasks]]
id = "work"
command = '''
mkdir -p locks
exec 9> "locks/{{{{ ds }}}}"
if ! flock -n 9; then echo "{{{{ ds }}}}" >> overlaps.txt; exit 1; fi
echo "start {{{{ ds }}}} $BACKFILL_RUN_ID" >> events.txt
sleep {secs}
echo "end {{{{ ds }}}} $BACKFILL_RUN_ID" >> events.txt
'''
"#
    )
}

fn starts(p: &Project) -> Vec<String> {
    let mut s: Vec<String> = p
        .read("events.txt")
        .lines()
        .filter(|l| l.starts_with("start"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        .collect();
    s.sort();
    s
}

fn latest_states(p: &Project, backfill: i64) -> Vec<String> {
    p.rows(&format!(
        "SELECT r.state FROM runs r JOIN (SELECT MAX(id) id FROM runs WHERE backfill_id = {backfill}
         GROUP BY interval_start) m ON m.id = r.id ORDER BY r.interval_start"
    ))
    .into_iter()
    .map(|r| r[0].clone())
    .collect()
}

#[test]
fn a_kill_right_after_a_try_is_spawned_never_lets_that_try_run() {
    let p = Project::new().dag("c", &locked_dag("0.3", ""));
    let crashed = p.run_with(THREE_DAYS, &[("BACKFILL_FAULT", "after-spawn")]);
    assert_eq!(crashed.code, -1, "aborted: {}", crashed.stderr);
    // The try's process exists, but its group was never recorded: it must never start work.
    // On PostgreSQL a run's first process is spawned before the run is recorded (the run, the
    // try and the group are recorded in one statement): nothing is recorded yet.
    let first = p.rows("SELECT state, pgid FROM task_tries");
    if pg_manifest() {
        assert_eq!(first, Vec::<Vec<String>>::new());
    } else {
        assert_eq!(first, [["running", "NULL"]]);
    }
    p.run(&["resume", "1"]).code(0);
    assert_eq!(latest_states(&p, 1), vec!["succeeded"; 3]);
    assert_eq!(
        starts(&p),
        ["2026-01-01", "2026-01-02", "2026-01-03"],
        "each interval started once: the first spawn never ran"
    );
    assert_eq!(p.read("overlaps.txt"), "");
    if pg_manifest() {
        assert_eq!(
            p.rows("SELECT state, COUNT(*) FROM task_tries GROUP BY state"),
            [["succeeded", "3"]]
        );
    } else {
        assert_eq!(
            p.rows("SELECT state, error FROM task_tries WHERE id = 1"),
            [["cancelled", "abandoned: the process of backfill 1 is gone"]]
        );
    }
}

/// What an owner taken over says as it stops: why, and that another process goes on with its
/// intervals (not that it should be resumed).
fn says_it_was_taken_over(out: &Out) {
    out.code(130)
        .stderr_has("another backfill took the intervals over")
        .stderr_has("backfill 1 of c: taken over — ")
        .stderr_has("another process took its intervals over and goes on with them (`backfill ")
        .stderr_has(" list` shows it)");
    assert!(!out.stderr.contains("continue with"), "{}", out.stderr);
}

#[test]
fn an_owner_frozen_before_letting_a_try_go_is_taken_over_without_overlap() {
    let p = Project::new().dag("c", &locked_dag("0.3", ""));
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    let frozen = p.spawn_with(
        "frozen",
        THREE_DAYS,
        &[("BACKFILL_FAULT", "before-release:stop")],
    );
    wait_until("the owner to freeze", Duration::from_secs(20), || {
        stopped(frozen.id())
    });
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE pgid IS NOT NULL"),
        1
    );
    wait_stale(&p, 1, 1500);
    let mut taker = THREE_DAYS.to_vec();
    taker.extend(["--reprocess-behavior", "failed"]);
    p.run(&taker).code(0);
    signal(&frozen, Signal::SIGCONT);
    says_it_was_taken_over(&p.wait("frozen", frozen));
    assert_eq!(starts(&p), ["2026-01-01", "2026-01-02", "2026-01-03"]);
    assert_eq!(p.read("overlaps.txt"), "");
    assert_eq!(
        p.rows("SELECT state FROM backfills ORDER BY id"),
        [["cancelled"], ["completed"]]
    );
    assert_eq!(latest_states(&p, 2), vec!["succeeded"; 3]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn resuming_the_same_backfill_fences_its_frozen_owner() {
    let p = Project::new().dag("c", &locked_dag("1", "max_active_runs = 1"));
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    let frozen = p.spawn("frozen", THREE_DAYS);
    wait_until("the first interval to run", Duration::from_secs(20), || {
        p.has_manifest()
            && p.count(
                "SELECT COUNT(*) FROM task_tries WHERE state = 'running' AND pgid IS NOT NULL",
            ) == 1
    });
    // Freeze it right after a heartbeat commit, outside any manifest transaction.
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    signal(&frozen, Signal::SIGSTOP);
    wait_stale(&p, 1, 1500);
    let resumer = p.spawn("resumer", &["resume", "1"]);
    let resumer_pid = resumer.id();
    wait_until(
        "the resume to own the backfill",
        Duration::from_secs(20),
        || p.count("SELECT owner_pid FROM backfills WHERE id = 1") == i64::from(resumer_pid),
    );
    signal(&frozen, Signal::SIGCONT);
    says_it_was_taken_over(&p.wait("frozen", frozen));
    p.wait("resumer", resumer).code(0);
    assert_eq!(p.read("overlaps.txt"), "", "never two copies at once");
    assert_eq!(
        p.rows("SELECT state, epoch FROM backfills"),
        [["completed", "1"]]
    );
    assert_eq!(latest_states(&p, 1), vec!["succeeded"; 3]);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3,
        "each interval succeeded exactly once"
    );
}

/// Days whose task records its pid and waits; the first day's task ends at once, once the
/// others are running.
const SLOW_BUT_FIRST: &str = r#"
schedule = "@daily"
max_active_runs = 3
grace_period = "500ms"
[[tasks]]
id = "t"
command = '''
if [ "{{ ds }}" = 2026-01-01 ]; then
  for i in $(seq 200); do [ "$(wc -l < pids.txt 2>/dev/null)" -ge 2 ] && exit 0; sleep 0.05; done
  exit 0
fi
echo $$ >> pids.txt
sleep 30
'''
"#;

fn pids(p: &Project) -> Vec<i32> {
    p.read("pids.txt")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn a_failing_manifest_write_stops_every_running_try_before_exiting() {
    let p = Project::new().dag("s", SLOW_BUT_FIRST);
    let out = p.run_with(
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
        &[("BACKFILL_FAULT", "record-end:fail")],
    );
    out.code(1).stderr_has("disk I/O error (injected)");
    let pids = pids(&p);
    assert_eq!(pids.len(), 2, "both slow tries were running");
    for pid in pids {
        assert!(!alive(pid), "try process {pid} outlived its backfill");
    }
}

#[test]
fn sighup_stops_a_backfill_as_sigterm_does() {
    let p = Project::new().dag("s", SLOW_BUT_FIRST);
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-03",
        ],
    );
    wait_until("two tries running", Duration::from_secs(20), || {
        pids(&p).len() == 2
    });
    signal(&child, Signal::SIGHUP);
    p.wait("run", child)
        .code(130)
        .stderr_has("hung up (SIGHUP)")
        .stderr_has(&p.hint("resume 1"));
    for pid in pids(&p) {
        assert!(!alive(pid), "try process {pid} outlived its backfill");
    }
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
}

/// A copy of `examples/shop` whose warehouse is created on first use.
fn shop() -> Project {
    let p = Project::new();
    let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
    for file in [
        "backfill.toml",
        "schema.sql",
        "seed.sql",
        "dags/daily_orders.toml",
        "dags/orders_fact.toml",
    ] {
        p.write(file, &std::fs::read_to_string(shop.join(file)).unwrap());
    }
    p
}

fn audit_files(p: &Project) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(p.path(".backfill/audit"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

const FACT_TWO_DAYS: &[&str] = &[
    "create",
    "--dag",
    "orders_fact",
    "--from",
    "2026-09-01",
    "--to",
    "2026-09-02",
    "--max-active-runs",
    "1",
];

#[test]
fn an_audit_file_left_by_a_crash_before_the_publish_intent_is_removed() {
    let p = shop();
    let crashed = p.run_with(FACT_TWO_DAYS, &[("BACKFILL_FAULT", "after-audit")]);
    assert_eq!(crashed.code, -1, "aborted: {}", crashed.stderr);
    assert_eq!(audit_files(&p), ["try-1.db"], "the dead try's audit file");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        0
    );
    p.run(&["resume", "1"]).code(0);
    assert_eq!(audit_files(&p), Vec::<String>::new(), "nothing left behind");
    let wh = rusqlite::Connection::open(p.path("warehouse.db")).unwrap();
    let (rows, leftovers): (i64, i64) = wh
        .query_row(
            "SELECT (SELECT COUNT(*) FROM orders_fact),
                    (SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '_backfill_audit%')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let source: i64 = wh
        .query_row(
            "SELECT COUNT(*) FROM raw_orders WHERE order_ts >= '2026-09-01' AND order_ts < '2026-09-03'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!((rows, leftovers), (source, 0));
}

#[test]
fn a_failed_publish_removes_its_audit_file() {
    let p = shop();
    let mut args = FACT_TWO_DAYS.to_vec();
    args[6] = "2026-09-01";
    p.run_with(&args, &[("BACKFILL_FAULT", "publish:fail")])
        .code(3)
        .stderr_has("publish failed: disk I/O error (injected)");
    assert_eq!(audit_files(&p), Vec::<String>::new());
    assert_eq!(
        p.rows("SELECT state, publishing FROM task_tries"),
        [["failed", "0"]]
    );
    let wh = rusqlite::Connection::open(p.path("warehouse.db")).unwrap();
    let n: i64 = wh
        .query_row("SELECT COUNT(*) FROM orders_fact", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0, "nothing was published");
}

#[test]
fn ctrl_c_during_verify_stops_its_tasks_and_leaves_no_file() {
    let p = Project::new().dag(
        "slow",
        r#"
schedule = "@daily"
grace_period = "500ms"
[[tasks]]
id = "t"
command = '''echo $$ >> pids.txt; sleep 30'''
"#,
    );
    let child = p.spawn(
        "verify",
        &[
            "verify",
            "--dag",
            "slow",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    wait_until("the task to run", Duration::from_secs(20), || {
        pids(&p).len() == 1
    });
    signal(&child, Signal::SIGINT);
    p.wait("verify", child)
        .code(130)
        .stderr_has("verify interrupted");
    assert!(!alive(pids(&p)[0]), "the task outlived verify");

    // A SQL task interrupted in the middle of its query.
    p.write(
        "backfill.toml",
        "lease_timeout = \"30s\"\n[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write("init.sql", "CREATE TABLE t (day TEXT, n INTEGER);");
    p.write(
        "dags/slow.toml",
        r#"
schedule = "@daily"
[[tasks]]
id = "t"
warehouse = "w"
target = "t"
partition_column = "day"
sql = """
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000000000)
SELECT :ds AS day, COUNT(*) AS n FROM c
"""
"#,
    );
    let child = p.spawn(
        "verify",
        &[
            "verify",
            "--dag",
            "slow",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    wait_until("the audit file", Duration::from_secs(20), || {
        audit_files(&p).iter().any(|f| f.starts_with("verify-"))
    });
    signal(&child, Signal::SIGINT);
    p.wait("verify", child).code(130);
    assert_eq!(audit_files(&p), Vec::<String>::new());
}

#[test]
fn a_gate_does_not_trust_a_negative_source_count() {
    let p = Project::new().dag(
        "g",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 1000000}' > "$BACKFILL_RESULT"'''
publish = "touch published"
[tasks.gate]
source_count = "echo -1"
tolerance = 0
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "g",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(3)
    .stderr_has("source_count gave -1; a row count cannot be negative");
    assert!(
        !p.path("published").exists(),
        "the publish command never ran"
    );
    assert_eq!(
        p.rows("SELECT state, verdict FROM task_tries"),
        [["failed", "NULL"]]
    );
    p.write(
        "dags/g.toml",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": -5}' > "$BACKFILL_RESULT"'''
publish = "touch published"
[tasks.gate]
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "g",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
        "--reprocess-behavior",
        "failed",
    ])
    .code(3)
    .stderr_has("the task reported -5 rows; a row count cannot be negative");
    assert!(!p.path("published").exists());
}

#[test]
fn a_sql_task_ending_in_a_comment_runs_as_it_was_checked() {
    let p = Project::new().dag(
        "s",
        r#"
schedule = "@daily"
[[tasks]]
id = "t"
warehouse = "w"
target = "t"
partition_column = "day"
sql = """
SELECT :ds AS day, 1 AS n -- one row per day
"""
"#,
    );
    p.write(
        "backfill.toml",
        "[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write("init.sql", "CREATE TABLE t (day TEXT, n INTEGER);");
    p.run(&[
        "create",
        "--dag",
        "s",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    let wh = rusqlite::Connection::open(p.path("w.db")).unwrap();
    let days: Vec<String> = wh
        .prepare("SELECT day FROM t ORDER BY day")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(days, ["2026-01-01", "2026-01-02"]);
}

#[test]
fn logs_are_private_and_never_written_through_a_symlink() {
    let p = Project::new().dag(
        "l",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"echo secret\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "l",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(0);
    let log = p.path(".backfill/logs/l/t/20260101T000000Z.run1.try1.log");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "secret\n");
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&log), 0o600, "readable by its owner only");
    assert_eq!(mode(&p.path(".backfill/logs/l/t")), 0o700);
    // A symlink planted where the next log will be is not followed.
    p.write("victim", "untouched\n");
    let next = p.path(".backfill/logs/l/t/20260102T000000Z.run2.try1.log");
    std::os::unix::fs::symlink(p.path("victim"), &next).unwrap();
    p.run(&[
        "create",
        "--dag",
        "l",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    assert_eq!(p.read("victim"), "untouched\n");
}

#[test]
fn read_commands_work_on_a_manifest_they_cannot_write() {
    let p = Project::new().sqlite().dag(
        "r",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "r",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
    ])
    .code(0);
    // The command checkpointed its WAL: the database file alone is a complete copy.
    let copy = tempfile::tempdir().unwrap();
    let alone = copy.path().join("manifest.db");
    std::fs::copy(p.manifest_path(), &alone).unwrap();
    let m = alone.to_str().unwrap();
    let list = p.run(&["--manifest", m, "list", "--output", "json"]);
    list.code(0);
    assert_eq!(list.json()[0]["intervals"]["succeeded"], 3);
    // Read-only: as another user when running as root, else by permissions.
    std::fs::set_permissions(copy.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(&alone, std::fs::Permissions::from_mode(0o444)).unwrap();
    let as_root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid() == 0
    };
    for args in [
        vec!["list"],
        vec!["show", "1"],
        vec!["runs", "--dag", "r"],
        vec![
            "create",
            "--dag",
            "r",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--dry-run",
        ],
    ] {
        let mut full = vec!["--manifest", m];
        full.extend(args.iter().copied());
        let mut c = p.command(&full);
        if as_root {
            use std::os::unix::process::CommandExt;
            c.uid(65534).gid(65534);
        }
        let out = c.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::set_permissions(copy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn errors_name_the_database_they_are_about() {
    let p = Project::new().sqlite().dag(
        "r",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.write(".backfill/manifest.db", &"not a database ".repeat(100));
    let out = p.run(&["list"]);
    out.code(1).stderr_has(&format!(
        "manifest {}: file is not a database",
        p.manifest_path().display()
    ));
}

#[test]
fn leftovers_of_a_killed_warehouse_creation_are_removed() {
    let p = shop();
    p.write("warehouse.db.init-999999.tmp", "half a warehouse");
    p.write("warehouse.db.init-999999.tmp-journal", "its journal");
    p.run(&[
        "create",
        "--dag",
        "daily_orders",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-01",
    ])
    .code(0);
    assert!(!p.path("warehouse.db.init-999999.tmp").exists());
    assert!(!p.path("warehouse.db.init-999999.tmp-journal").exists());
    assert!(p.path("warehouse.db").exists());
}

#[test]
fn a_large_plan_never_holds_the_manifest_long_enough_to_starve_a_heartbeat() {
    let p = Project::new().dag("c", &locked_dag("30", "")).dag(
        "minutely",
        "schedule = \"* * * * *\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let owner = p.spawn(
        "owner",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    wait_until("the owner to run", Duration::from_secs(20), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") == 1
    });
    // 200,000 intervals, all in the future (planned as `not yet complete`), so that the plan is
    // large and nothing runs.
    let big = p.spawn(
        "big",
        &[
            "create",
            "--dag",
            "minutely",
            "--from",
            "2026-12-01",
            "--to",
            "2027-04-18T21:19",
        ],
    );
    let mut worst = 0i64;
    let mut last = p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let mut since = std::time::Instant::now();
    while big_running(&p) {
        let beat = p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
        if beat != last {
            last = beat;
            since = std::time::Instant::now();
        }
        worst = worst.max(since.elapsed().as_millis() as i64);
        std::thread::sleep(Duration::from_millis(20));
    }
    let big = p.wait("big", big);
    big.code(0);
    eprintln!("worst heartbeat gap while planning: {worst} ms");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM plan WHERE backfill_id = 2"),
        200_000
    );
    assert!(
        worst < 2_000,
        "the owner's heartbeat stalled for {worst} ms while the plan was written"
    );
    p.run(&["cancel", "1"]).code(0);
    p.wait("owner", owner).code(130);
}

fn big_running(p: &Project) -> bool {
    p.count("SELECT COUNT(*) FROM backfills WHERE id = 2") == 0
        || p.count("SELECT planning FROM backfills WHERE id = 2") == 1
}

#[test]
fn an_owner_that_goes_silent_after_another_backfill_recovered_leases_keeps_its_interval() {
    let p = Project::new().dag("c", &locked_dag("2", ""));
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    let one_day = [
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ];
    let a = p.spawn("a", &one_day);
    wait_until("A's try to run", Duration::from_secs(20), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM task_tries WHERE pgid IS NOT NULL") == 1
    });
    // B has recovered stale leases (there were none) and stops before planning.
    let mut b_args = one_day.to_vec();
    b_args.extend(["--reprocess-behavior", "failed"]);
    let b = p.spawn_with(
        "b",
        &b_args,
        &[("BACKFILL_FAULT", "after-release-stale:stop")],
    );
    wait_until("B to stop before planning", Duration::from_secs(20), || {
        stopped(b.id())
    });
    // Now A goes silent, and B plans: A was never claimed, so its lease still counts.
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    signal(&a, Signal::SIGSTOP);
    wait_stale(&p, 1, 1500);
    signal(&b, Signal::SIGCONT);
    p.wait("b", b).code(0);
    signal(&a, Signal::SIGCONT);
    p.wait("a", a).code(0);
    assert_eq!(p.read("overlaps.txt"), "");
    assert_eq!(starts(&p), ["2026-01-01"], "the interval ran once");
    assert_eq!(
        p.rows("SELECT action, reason FROM plan WHERE backfill_id = 2"),
        [["skip", "in flight"]]
    );
}

#[test]
fn a_recoverer_superseded_by_a_newer_claim_settles_only_what_it_did() {
    let p = Project::new().dag("c", &locked_dag("1", ""));
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    let two_days = [
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    let crashed = p.run_with(&two_days, &[("BACKFILL_FAULT", "after-spawn@2")]);
    assert_eq!(crashed.code, -1, "{}", crashed.stderr);
    // `cancel` claims the dead backfill, acts, and stops before it records.
    let cancel = p.spawn_with(
        "cancel",
        &["cancel", "1"],
        &[("BACKFILL_FAULT", "before-record:stop")],
    );
    wait_until(
        "cancel to stop before recording",
        Duration::from_secs(20),
        || stopped(cancel.id()),
    );
    // Meanwhile `resume` claims it again and runs it.
    let resume = p.spawn("resume", &["resume", "1"]);
    wait_until(
        "the resumed interval to run",
        Duration::from_secs(20),
        || {
            p.count("SELECT epoch FROM backfills WHERE id = 1") == 2
                && p.count("SELECT COUNT(*) FROM runs WHERE backfill_id = 1 AND state = 'running'")
                    >= 1
        },
    );
    signal(&cancel, Signal::SIGCONT);
    p.wait("cancel", cancel).code(0);
    p.wait("resume", resume).code(0);
    assert_eq!(p.read("overlaps.txt"), "");
    assert_eq!(p.rows("SELECT state FROM backfills"), [["completed"]]);
    assert_eq!(latest_states(&p, 1), ["succeeded", "succeeded"]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}
