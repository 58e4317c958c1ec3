//! While a backfill's SQL tries run their statements, signals, `backfill cancel`, timeouts
//! with retries and their delays, pools, `depends_on` chains and notify hooks must all still be
//! served (SQLite here; on PostgreSQL, whose backfills run on one async worker, in
//! `postgres.rs`).

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{Project, signal, wait_until};

/// A SQLite project whose DAG `slow` has two SQL tasks in a chain, the first a query that runs
/// for minutes in a pool of 2, with an `on_finish` hook; `extra` goes in the DAG's header.
fn slow_sqlite(extra: &str) -> Project {
    let p = Project::new();
    p.write(
        "backfill.toml",
        "lease_timeout = \"30s\"\n[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n\n[pools]\np = 2\n",
    );
    p.write(
        "init.sql",
        "CREATE TABLE t (day TEXT, n INTEGER); CREATE TABLE t2 (day TEXT, n INTEGER);",
    );
    p.write(
        "dags/slow.toml",
        &format!(
            r#"
schedule = "@daily"
max_active_runs = 2
{extra}

[notify]
on_finish = "echo $BACKFILL_STATE $BACKFILL_EXIT_CODE > hook.out"

[[tasks]]
id = "slow"
warehouse = "w"
target = "t"
partition_column = "day"
pool = "p"
sql = """
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000000000)
SELECT :ds AS day, COUNT(*) AS n FROM c
"""

[[tasks]]
id = "after"
depends_on = ["slow"]
warehouse = "w"
target = "t2"
partition_column = "day"
sql = "SELECT day, n FROM t WHERE day = :ds"
"#
        ),
    );
    p
}

const TWO_DAYS: [&str; 7] = [
    "create",
    "--dag",
    "slow",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-02",
];

fn two_running(p: &Project) {
    wait_until("two SQL tries running", Duration::from_secs(30), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'running'") == 2
    });
}

#[test]
fn sqlite_sql_only_dag_timeouts_and_retry_delays_fire_while_statements_run() {
    let p = slow_sqlite("retries = 1\nretry_delay = \"1s\"\ntimeout = \"2s\"");
    let started = Instant::now();
    let out = crate::support::wait_within(
        &p,
        "run",
        p.spawn("run", &TWO_DAYS),
        Duration::from_secs(60),
    );
    out.code(3);
    // Two tries of 2 s and a delay of 1 s, both days at once.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE task_id = 'slow'"),
        4,
        "{:?}",
        p.rows("SELECT task_id, try_number, state, error FROM task_tries")
    );
    assert!(
        p.read("hook.out").starts_with("failed 3"),
        "{}",
        p.read("hook.out")
    );
}

#[test]
fn sqlite_sql_only_dag_stops_on_ctrl_c_within_seconds() {
    let p = slow_sqlite("");
    let child = p.spawn("run", &TWO_DAYS);
    two_running(&p);
    let started = Instant::now();
    signal(&child, Signal::SIGINT);
    let out = crate::support::wait_within(&p, "run", child, Duration::from_secs(20));
    out.code(130).stderr_has("interrupted (SIGINT)");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(p.read("hook.out").contains("130"), "{}", p.read("hook.out"));
}

#[test]
fn sqlite_sql_only_dag_stops_on_backfill_cancel_within_seconds() {
    let p = slow_sqlite("");
    let child = p.spawn("run", &TWO_DAYS);
    two_running(&p);
    let started = Instant::now();
    p.run(&["cancel", "1"]).code(0);
    let out = crate::support::wait_within(&p, "run", child, Duration::from_secs(20));
    out.code(130).stderr_has("cancelled by `backfill cancel`");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}
