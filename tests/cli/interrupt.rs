//! Crashes, signals, timeouts, cancellation and concurrent backfills.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{Project, alive, day_unix, signal, wait_stale, wait_until};

/// A task that takes `secs`, holds a per-interval lock while it runs (an overlap with another
/// try of the same interval is recorded in overlaps.txt) and logs its start and end.
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
fn kill_9_then_resume_finishes_every_interval_without_overlap() {
    let p = Project::new().dag("c", &locked_dag("0.4", ""));
    let child = p.spawn(
        "first",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-06",
            "--max-active-runs",
            "2",
        ],
    );
    wait_until(
        "two intervals done and two running",
        Duration::from_secs(20),
        || {
            p.has_manifest()
                && p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'") >= 2
                && p.count(
                    "SELECT COUNT(*) FROM task_tries WHERE state = 'running' AND pgid IS NOT NULL",
                ) >= 1
        },
    );
    signal(&child, Signal::SIGKILL);
    p.wait("first", child);
    // The backfill looks alive in the manifest, but its process is gone: resume takes over.
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("resuming backfill 1");
    assert_eq!(latest_states(&p, 1), vec!["succeeded"; 6]);
    let cancelled = p.count("SELECT COUNT(*) FROM runs WHERE state = 'cancelled'");
    assert!(cancelled >= 1, "the killed attempts stay in history");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs"),
        6 + cancelled,
        "one new run per interrupted interval"
    );
    assert!(
        p.rows("SELECT error FROM runs WHERE state = 'cancelled'")
            .iter()
            .all(|r| r[0].contains("abandoned"))
    );
    assert_eq!(
        p.read("overlaps.txt"),
        "",
        "no interval ran twice at the same time"
    );
    assert_eq!(p.rows("SELECT state FROM backfills"), [["completed"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn resume_refuses_while_the_owner_is_alive() {
    let p = Project::new().dag("c", &locked_dag("5", ""));
    let child = p.spawn(
        "first",
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
    wait_until("the interval to run", Duration::from_secs(20), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") == 1
    });
    let before = p.count("SELECT COUNT(*) FROM runs");
    p.run(&["resume", "1"])
        .code(2)
        .stderr_has("backfill 1 is still running (pid");
    assert_eq!(p.count("SELECT COUNT(*) FROM runs"), before);
    p.run(&["cancel", "1"]).code(0);
    p.wait("first", child).code(130);
}

#[test]
fn overlapping_backfills_started_together_never_run_an_interval_twice() {
    let p = Project::new().dag("c", &locked_dag("0.3", ""));
    let a = p.spawn(
        "a",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-06",
            "--max-active-runs",
            "2",
            "--output",
            "json",
        ],
    );
    let b = p.spawn(
        "b",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-04",
            "--to",
            "2026-01-09",
            "--max-active-runs",
            "2",
            "--output",
            "json",
        ],
    );
    let (a, b) = (p.wait("a", a), p.wait("b", b));
    a.code(0);
    b.code(0);
    assert_eq!(p.read("overlaps.txt"), "");
    // Every interval of the union ran exactly once.
    let runs = p.rows(
        "SELECT interval_start, COUNT(*) FROM runs GROUP BY interval_start ORDER BY interval_start",
    );
    let want: Vec<Vec<String>> = (1..=9)
        .map(|d| vec![day_unix(d).to_string(), "1".to_string()])
        .collect();
    assert_eq!(runs, want);
    // Whichever planned second found the shared days in flight.
    let in_flight = p.rows(
        "SELECT backfill_id, interval_start FROM plan WHERE reason = 'in flight' ORDER BY interval_start",
    );
    let shared: Vec<String> = (4..=6).map(|d| day_unix(d).to_string()).collect();
    assert_eq!(
        in_flight.iter().map(|r| r[1].clone()).collect::<Vec<_>>(),
        shared
    );
    assert!(in_flight.iter().all(|r| r[0] == in_flight[0][0]));
}

/// A task that leaves a grandchild which ignores SIGTERM, recording both pids.
const STUBBORN: &str = r#"
schedule = "@daily"
grace_period = "500ms"
[[tasks]]
id = "stubborn"
command = '''
if [ -f go ]; then exit 0; fi
sh -c 'trap "" TERM; exec sleep 60' &
echo $! >> pids.txt
echo $$ >> pids.txt
wait
'''
"#;

fn pids(p: &Project) -> Vec<i32> {
    p.read("pids.txt")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[test]
fn ctrl_c_exits_130_leaves_no_process_and_resume_completes() {
    let p = Project::new().dag("s", STUBBORN);
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-04",
            "--max-active-runs",
            "2",
        ],
    );
    wait_until(
        "two tasks with grandchildren",
        Duration::from_secs(20),
        || pids(&p).len() >= 4,
    );
    signal(&child, Signal::SIGINT);
    let out = p.wait("run", child);
    out.code(130)
        .stderr_has("interrupted (SIGINT)")
        .stderr_has(&p.hint("resume 1"));
    for pid in pids(&p) {
        assert!(!alive(pid), "process {pid} of the backfill is still alive");
    }
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(
        p.rows("SELECT DISTINCT state FROM runs"),
        [["cancelled"]],
        "the interrupted runs are recorded cancelled"
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    p.write("go", "");
    p.run(&["resume", "1"]).code(0);
    assert_eq!(latest_states(&p, 1), vec!["succeeded"; 4]);
}

#[test]
fn a_second_ctrl_c_kills_at_once() {
    // The task itself ignores SIGTERM: only SIGKILL after the 60 s grace period, or a second
    // Ctrl-C, stops it.
    let p = Project::new().dag(
        "s",
        r#"
schedule = "@daily"
grace_period = "60s"
[[tasks]]
id = "deaf"
command = '''trap "" TERM; echo $$ >> pids.txt; sleep 60 & echo $! >> pids.txt; wait; wait'''
"#,
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    wait_until("the task and its child", Duration::from_secs(20), || {
        pids(&p).len() >= 2
    });
    signal(&child, Signal::SIGINT);
    wait_until(
        "the first Ctrl-C to be handled",
        Duration::from_secs(20),
        || p.read("run.err").contains("interrupted (SIGINT)"),
    );
    let started = std::time::Instant::now();
    signal(&child, Signal::SIGINT);
    p.wait("run", child)
        .code(130)
        .stderr_has("killing running tasks now");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "did not wait for the 60 s grace period"
    );
    for pid in pids(&p) {
        assert!(!alive(pid));
    }
}

#[test]
fn a_timeout_kills_the_task_and_its_grandchild_and_is_retried() {
    let p = Project::new().dag(
        "t",
        r#"
schedule = "@daily"
timeout = "300ms"
grace_period = "200ms"
retries = 1
retry_delay = "10ms"
[[tasks]]
id = "hang"
command = '''sh -c 'trap "" TERM; exec sleep 60' & echo $! >> pids.txt; echo $$ >> pids.txt; wait'''
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "t",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(3)
    .stderr_has("timed out after 300ms");
    assert_eq!(
        p.rows("SELECT try_number, state, error FROM task_tries ORDER BY id"),
        [
            ["1", "failed", "timed out after 300ms"],
            ["2", "failed", "timed out after 300ms"]
        ]
    );
    let pids = pids(&p);
    assert_eq!(pids.len(), 4);
    for pid in pids {
        assert!(!alive(pid), "process {pid} survived the timeout");
    }
}

#[test]
fn cancel_stops_a_backfill_running_in_another_process() {
    let p = Project::new().dag("c", &locked_dag("30", ""));
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--max-active-runs",
            "3",
        ],
    );
    wait_until("three intervals running", Duration::from_secs(20), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") == 3
    });
    let started = std::time::Instant::now();
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 stopped: cancelled");
    assert!(started.elapsed() < Duration::from_secs(5));
    p.wait("run", child)
        .code(130)
        .stderr_has("cancelled by `backfill cancel`");
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(p.rows("SELECT DISTINCT state FROM runs"), [["cancelled"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("already cancelled");
}

#[test]
fn cancel_of_a_dead_backfill_marks_it_cancelled_and_releases_its_leases() {
    let p = Project::new().dag("c", &locked_dag("30", ""));
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-04",
            "--max-active-runs",
            "2",
        ],
    );
    wait_until("two intervals running", Duration::from_secs(20), || {
        p.has_manifest()
            && p.count(
                "SELECT COUNT(*) FROM task_tries WHERE state = 'running' AND pgid IS NOT NULL",
            ) == 2
    });
    signal(&child, Signal::SIGKILL);
    p.wait("run", child);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 4);
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("its process was gone");
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    assert_eq!(p.rows("SELECT DISTINCT state FROM runs"), [["cancelled"]]);
    // The orphaned `sleep 30` processes were killed: a new backfill can lock the days at once.
    p.write("dags/c.toml", &locked_dag("0", ""));
    p.run(&[
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
        "--reprocess-behavior",
        "failed",
    ])
    .code(0);
    assert_eq!(p.read("overlaps.txt"), "");
}

#[test]
fn a_silent_owner_is_taken_over_and_stops_when_it_wakes() {
    let p = Project::new().dag("c", &locked_dag("2", ""));
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    let frozen = p.spawn(
        "frozen",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--max-active-runs",
            "1",
        ],
    );
    wait_until("the first interval to run", Duration::from_secs(20), || {
        p.has_manifest()
            && p.count(
                "SELECT COUNT(*) FROM task_tries WHERE state = 'running' AND pgid IS NOT NULL",
            ) == 1
    });
    // Alive but silent: no heartbeat for longer than the lease timeout. Freeze it right after a
    // heartbeat commit, so that it is not frozen inside a transaction holding SQLite's write lock
    // (which nobody can take from a frozen process).
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    signal(&frozen, Signal::SIGSTOP);
    wait_stale(&p, 1, 1500);
    p.write("dags/c.toml", &locked_dag("0.2", ""));
    let taker = p.run(&[
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--reprocess-behavior",
        "failed",
        "--output",
        "json",
    ]);
    taker.code(0);
    assert_eq!(
        taker.json()["intervals"]["succeeded"],
        2,
        "both intervals were taken over"
    );
    assert_eq!(
        p.read("overlaps.txt"),
        "",
        "the silent owner's task was killed first"
    );
    signal(&frozen, Signal::SIGCONT);
    p.wait("frozen", frozen)
        .code(130)
        .stderr_has("another backfill took the intervals over");
    // The woken owner overwrote nothing and started nothing.
    assert_eq!(
        p.rows("SELECT state FROM backfills ORDER BY id"),
        [["cancelled"], ["completed"]]
    );
    assert_eq!(
        p.rows("SELECT backfill_id, state FROM runs ORDER BY id"),
        [["1", "cancelled"], ["2", "succeeded"], ["2", "succeeded"]]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn cancel_that_waits_in_vain_says_so_and_exits_0() {
    // The task ignores SIGTERM and has a long grace period: the owner stops only after it.
    let p = Project::new().dag(
        "s",
        r#"
schedule = "@daily"
grace_period = "60s"
[[tasks]]
id = "deaf"
command = '''trap "" TERM; echo $$ >> pids.txt; sleep 60 & wait; wait'''
"#,
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    wait_until("the task to run", Duration::from_secs(20), || {
        pids(&p).len() == 1
    });
    p.run(&["cancel", "1", "--wait", "300ms"])
        .code(0)
        .stderr_has("backfill 1 was asked to stop and is still stopping after 300ms");
    signal(&child, Signal::SIGINT);
    p.wait("run", child).code(130);
}
