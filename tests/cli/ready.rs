//! `[tasks.ready]`: intervals that wait until their sources have landed, on the shop's
//! warehouse, whose orders of September 30 arrive late.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::gate::{shop, wh, wh_rows};
use crate::support::{Project, signal, wait_until};

/// The days of the range.
const FROM: &str = "2026-09-28";
const TO: &str = "2026-09-30";

/// The shop with a `loads` table that says which days' orders have landed (the 28th and 29th),
/// September 30's orders held back, a readiness check on `loads` that may wait `wait`, and an
/// `on_failure` hook that leaves `mailed` behind and an `on_not_ready` one that appends its
/// count and exit code to `not-ready`.
fn late_shop(wait: &str) -> Project {
    let p = shop();
    p.write(
        "backfill.toml",
        &format!(
            "{}\n[notify]\non_failure = \"touch mailed\"\non_not_ready = \"echo $BACKFILL_NOT_READY $BACKFILL_EXIT_CODE >> not-ready\"\n",
            p.read("backfill.toml")
        ),
    );
    p.write(
        "dags/daily_orders.toml",
        &format!(
            "{}\n[tasks.ready]\nsql = \"SELECT count(*) > 0 FROM loads WHERE day = :ds\"\nwait = \"{wait}\"\nevery = \"200ms\"\n",
            p.read("dags/daily_orders.toml")
        ),
    );
    // The warehouse exists once a first command opened it.
    p.run(&["dags"]).code(0);
    wh(&p)
        .execute_batch(
            "CREATE TABLE loads (day TEXT NOT NULL);
             INSERT INTO loads VALUES ('2026-09-28'), ('2026-09-29');
             CREATE TABLE late_orders AS SELECT * FROM raw_orders WHERE date(order_ts) = '2026-09-30';
             DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-30';",
        )
        .unwrap();
    p
}

/// September 30's orders land, and the load says so.
fn land(p: &Project) {
    wh(p)
        .execute_batch(
            "INSERT INTO raw_orders SELECT * FROM late_orders;
             INSERT INTO loads VALUES ('2026-09-30');",
        )
        .unwrap();
}

/// The start of a UTC day, in unix seconds.
fn unix(day: &str) -> i64 {
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp()
}

/// A day's published rows, and the source's as they should be published.
fn published(p: &Project, day: &str) -> (Vec<String>, Vec<String>) {
    (
        wh_rows(
            p,
            &format!(
                "SELECT day, region, orders, revenue_cents FROM daily_orders WHERE day = '{day}' ORDER BY region"
            ),
        ),
        wh_rows(
            p,
            &format!(
                "SELECT date(order_ts), region, COUNT(*), SUM(amount_cents) FROM raw_orders
                 WHERE date(order_ts) = '{day}' GROUP BY 1, 2 ORDER BY 2"
            ),
        ),
    )
}

/// Starts the nightly backfill of the three days (`-v`), and waits until September 30 waits
/// for its orders while the two days whose orders are there ran (holding no place meanwhile).
fn start_nightly(p: &Project) -> std::process::Child {
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            FROM,
            "--to",
            TO,
            "-v",
        ],
    );
    wait_for_waiting(p);
    wait_until(
        "the landed days to succeed",
        Duration::from_secs(30),
        || p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'") == 2,
    );
    child
}

/// Waits until the manifest says an interval waits for its sources.
fn wait_for_waiting(p: &Project) {
    wait_until(
        "an interval to wait for its sources",
        Duration::from_secs(30),
        || {
            p.has_manifest()
                && p.count("SELECT COUNT(*) FROM readiness WHERE state = 'waiting'") == 1
        },
    );
}

/// The cron case: the nightly rerun starts before September 30's orders land. The day waits
/// (holding no place: the other days run meanwhile), `show` says so, and once the orders land
/// it runs and publishes; nothing is rejected and no failure is mailed.
#[test]
fn a_late_source_is_waited_for_then_published_and_nothing_is_mailed() {
    let p = late_shop("1m");
    let child = start_nightly(&p);
    let shown = p.run(&["show", "latest"]);
    shown.code(0).stdout_has("waiting for sources (");
    let json = p.run(&["show", "latest", "--output", "json"]).json();
    let day30 = &json["interval_details"][2];
    assert_eq!(day30["ready"][0]["task"], "aggregate");
    assert_eq!(day30["ready"][0]["state"], "waiting");
    assert_eq!(day30["ready"][0]["answer"], "0");
    assert!(
        day30["ready"][0]["left_ms"].as_i64().unwrap() > 30_000,
        "{day30}"
    );
    // The status page and the metrics see the wait too.
    let s = crate::serve::Server::start(&p, "serve", &[]);
    let page = s.get("/backfills/1");
    assert!(
        page.body
            .contains("2026-09-30: not started · waiting for sources ("),
        "{}",
        page.body
    );
    let m = s.get("/metrics").body;
    assert!(
        m.contains("backfill_intervals_waiting_for_sources{dag=\"daily_orders\"} 1"),
        "{m}"
    );
    drop(s);

    land(&p);
    let out = crate::support::wait_within(&p, "run", child, Duration::from_secs(60));
    out.code(0)
        .stderr_has("waiting    2026-09-30 task `aggregate` for its sources (")
        .stderr_has("succeeded  2026-09-30");
    for day in ["2026-09-28", "2026-09-29", "2026-09-30"] {
        let (got, want) = published(&p, day);
        assert!(!want.is_empty());
        assert_eq!(got, want, "{day}");
    }
    assert!(!p.path("mailed").exists(), "no failure was mailed");
    assert!(!p.path("not-ready").exists());
    let row = |day: &str, asked_again: &str| {
        [
            unix(day).to_string(),
            "ready".into(),
            asked_again.into(),
            "1".into(),
        ]
    };
    assert_eq!(
        p.rows(
            "SELECT interval_start, state, CASE WHEN asks > 1 THEN 'again' ELSE 'once' END, answer
             FROM readiness ORDER BY interval_start"
        ),
        [
            row("2026-09-28", "once"),
            row("2026-09-29", "once"),
            row("2026-09-30", "again")
        ]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state <> 'succeeded'"),
        0,
        "one run a day, each succeeded"
    );
}

/// A source that never lands: the day is recorded `not ready` with what the check answered,
/// the backfill completes with exit 0 (4 with `--require-ready`), nothing of the day is
/// written, and the next backfill runs it once its source is there.
#[test]
fn a_source_that_never_lands_is_not_ready_and_the_next_backfill_runs_it() {
    let p = late_shop("1s");
    p.create("daily_orders", FROM, TO, &[])
        .code(0)
        .stderr_has("skipped    2026-09-30 (not ready)")
        .stderr_has("not ready");
    assert!(!p.path("mailed").exists());
    assert_eq!(p.read("not-ready"), "1 0\n");
    assert_eq!(published(&p, "2026-09-30").0, Vec::<String>::new());
    assert_eq!(
        p.rows("SELECT action, COALESCE(reason, '-') FROM plan ORDER BY interval_start"),
        [["run", "-"], ["run", "-"], ["skip", "not ready"]]
    );
    let json = p.run(&["show", "1", "--output", "json"]).json();
    let day30 = &json["interval_details"][2];
    assert_eq!(day30["reason"], "not ready");
    let said = day30["error"].as_str().unwrap();
    assert!(
        said.starts_with("task `aggregate` not ready after ") && said.ends_with(" asks over 1s: 0"),
        "{said}"
    );
    assert_eq!(day30["ready"][0]["state"], "not ready");
    // The view for people says the same.
    assert_eq!(
        p.rows(
            "SELECT dag_id, task_id, state, answer,
                    CASE WHEN asks > 1 AND waited_s >= 1 AND waited_s < 30 THEN 'waited' ELSE 'no' END
             FROM report_readiness WHERE backfill_id = 1 ORDER BY interval_start"
        ),
        [
            ["daily_orders", "aggregate", "ready", "1", "no"],
            ["daily_orders", "aggregate", "ready", "1", "no"],
            ["daily_orders", "aggregate", "not ready", "0", "waited"]
        ]
    );
    let s = crate::serve::Server::start(&p, "serve", &[]);
    let page = s.get("/backfills/1").body;
    assert!(
        page.contains("2026-09-30: skipped · task `aggregate` not ready after "),
        "{page}"
    );
    let m = s.get("/metrics").body;
    assert!(
        m.contains("backfill_not_ready_total{dag=\"daily_orders\"} 1"),
        "{m}"
    );
    assert!(
        !m.contains("backfill_intervals_waiting_for_sources{"),
        "{m}"
    );
    drop(s);

    // Asked once (`--wait-ready 0s`), still not there: exit 4 with --require-ready.
    p.create(
        "daily_orders",
        FROM,
        TO,
        &["--wait-ready", "0s", "--require-ready", "-q"],
    )
    .code(4)
    // What a quiet cron job mails.
    .stderr_has("backfill 2 of daily_orders: completed — 0 succeeded, 0 failed, 0 rejected, 0 cancelled, 3 skipped in ")
    .stderr_has("; 1 interval not ready (`backfill ");
    assert_eq!(
        p.rows("SELECT asks FROM readiness WHERE backfill_id = 2"),
        vec![vec!["1".to_string()]]
    );
    assert_eq!(p.read("not-ready"), "1 0\n1 4\n");

    // Once the orders landed, the next nightly run (reprocess none) runs that day only.
    land(&p);
    p.create("daily_orders", FROM, TO, &["--require-ready"])
        .code(0)
        .stderr_has("1 to run, 2 skipped");
    let (got, want) = published(&p, "2026-09-30");
    assert!(!want.is_empty());
    assert_eq!(got, want);
    assert_eq!(p.read("not-ready"), "1 0\n1 4\n", "all ready: no hook");
    assert!(!p.path("mailed").exists());
}

/// A kill -9 while intervals wait loses nothing: `resume` asks again and runs them, and the
/// days that ran before the kill are not run again.
#[test]
fn a_kill_while_intervals_wait_is_resumed_and_they_wait_again() {
    let p = late_shop("1m");
    let mut child = start_nightly(&p);
    let asked_first = "SELECT first_asked_at FROM readiness WHERE state = 'waiting'";
    let before = p.count(asked_first);
    signal(&child, Signal::SIGKILL);
    let _ = child.wait();
    // Killed, its intervals wait for no one: /metrics counts none waiting (the manifest still
    // records them as waiting, in a backfill recorded as running).
    let gauge = "backfill_intervals_waiting_for_sources{dag=\"daily_orders\"}";
    let metrics = || {
        let s = crate::serve::Server::start(&p, "serve", &[]);
        s.get("/metrics").body
    };
    assert_eq!(
        p.count("SELECT COUNT(*) FROM readiness WHERE state = 'waiting'"),
        1
    );
    let m = metrics();
    assert!(!m.contains(gauge), "{m}");
    // show says so too: not started, no time left to wait.
    let shown = p.run(&["show", "1"]);
    assert!(
        !shown.code(0).stdout.contains("waiting for sources"),
        "{}",
        shown.stdout
    );
    let json = p.run(&["show", "1", "--output", "json"]).json();
    let day30 = &json["interval_details"][2];
    assert_eq!(
        (
            &day30["state"],
            &day30["ready"][0]["state"],
            &day30["ready"][0]["left_ms"]
        ),
        (
            &serde_json::Value::Null,
            &serde_json::json!("waiting"),
            &serde_json::Value::Null
        ),
        "{day30}"
    );
    let resumed = p.spawn("resume", &["resume", "1"]);
    wait_until(
        "the resumed backfill to wait again",
        Duration::from_secs(30),
        || p.count(asked_first) > before,
    );
    let m = metrics();
    assert!(m.contains(&format!("{gauge} 1")), "{m}");
    p.run(&["show", "1"])
        .code(0)
        .stdout_has("waiting for sources (");
    land(&p);
    crate::support::wait_within(&p, "resume", resumed, Duration::from_secs(60)).code(0);
    for day in ["2026-09-28", "2026-09-29", "2026-09-30"] {
        let (got, want) = published(&p, day);
        assert_eq!(got, want, "{day}");
    }
    assert_eq!(
        p.rows("SELECT COUNT(*), COUNT(DISTINCT interval_start) FROM runs"),
        vec![vec!["3".to_string(), "3".to_string()]],
        "each day ran once"
    );
}

/// Readiness that cannot work is refused before anything is written, at its file:line.
#[test]
fn bad_readiness_configuration_is_refused_at_its_line() {
    let p = Project::new();
    let cases = [
        (
            "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\nsql = \"SELECT 1\"\ncommand = \"true\"\n",
            "dags/a.toml:10:11: task `t`: [tasks.ready] asks with `sql` or with `command`, not both; remove one",
        ),
        (
            "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\nsql = \"SELECT 1\"\n",
            "dags/a.toml:9:7: task `t`: a command task has no warehouse to run `sql` on; ask with `command = [...]`",
        ),
        (
            "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\nwait = \"1h\"\n",
            "task `t`: [tasks.ready] needs `sql`",
        ),
        (
            "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\ncommand = \"true\"\nwait = \"1m\"\nevery = \"5m\"\n",
            "dags/a.toml:11:9: task `t`: `every = \"5m\"` is longer than `wait = \"1m\"`, so readiness would be asked once",
        ),
        (
            "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\ncommand = \"true\"\nwiat = \"1m\"\n",
            "dags/a.toml:10:1: unknown key `wiat` in [tasks.ready]; did you mean `wait`?",
        ),
        (
            "id = \"a\"\nschedule = \"@daily\"\nbatch_size = 7\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\ncommand = \"true\"\n",
            "dags/a.toml:3:14: key `batch_size` = 7 cannot be used here: task `t` asks whether each interval's sources are ready ([tasks.ready])",
        ),
    ];
    let cases = cases.into_iter().chain([(
        "id = \"a\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n\n[tasks.ready]\ncommand = \"true\"\nwait = \"1m\"\nevery = \"1ns\"\n",
        "dags/a.toml:11:9: task `t`: key `every` must be at least 100ms",
    )]);
    for (dag, said) in cases {
        p.write("dags/a.toml", dag);
        p.create("a", "2026-01-01", "2026-01-02", &[])
            .code(2)
            .stderr_has(said);
        assert!(!p.has_manifest(), "nothing written for {dag}");
    }
    // A query that writes is refused where it is written.
    let s = shop();
    s.write(
        "dags/daily_orders.toml",
        &format!(
            "{}\n[tasks.ready]\nsql = \"DELETE FROM raw_orders WHERE :ds = :ds\"\n",
            s.read("dags/daily_orders.toml")
        ),
    );
    s.create("daily_orders", FROM, TO, &[])
        .code(2)
        .stderr_has("key `sql` of [tasks.ready] must be one read-only query");
    // A query that does not prepare, or names an unknown parameter, is found before anything
    // runs, where it is written.
    for (sql, said) in [
        (
            "SELECT count(*) FROM loadz WHERE day = :ds",
            "no such table: loadz",
        ),
        ("SELECT :nope", "uses bind parameter `:nope`"),
        ("SELECT 1, 2", "must return exactly one column"),
    ] {
        let s = shop();
        s.write(
            "dags/daily_orders.toml",
            &format!(
                "{}\n[tasks.ready]\nsql = \"{sql}\"\n",
                s.read("dags/daily_orders.toml")
            ),
        );
        let line = s.read("dags/daily_orders.toml").lines().count();
        let out = s.create("daily_orders", FROM, TO, &[]);
        out.code(2)
            .stderr_has(&format!(
                "dags/daily_orders.toml:{line}:7: task `aggregate`: "
            ))
            .stderr_has(said);
        assert!(!s.has_manifest(), "nothing written for {sql}");
    }
}

/// A command check: exit 0 is ready, 1 not ready (its last line the answer), any other exit
/// an error that counts as not ready and is said once.
#[test]
fn a_command_check_answers_by_its_exit_code() {
    let p = Project::new().dag(
        "c",
        "id = \"c\"\nschedule = \"@daily\"\n\n[[tasks]]\nid = \"t\"\ncommand = \"echo {{ ds }} >> ran\"\n\n[tasks.ready]\ncommand = \"if [ -e landed/{{ ds }} ]; then echo here; elif [ {{ ds }} = 2026-01-03 ]; then echo broken; exit 7; else echo no file yet; exit 1; fi\"\nwait = \"1s\"\nevery = \"300ms\"\n",
    );
    std::fs::create_dir_all(p.path("landed")).unwrap();
    std::fs::write(p.path("landed/2026-01-01"), "").unwrap();
    p.create("c", "2026-01-01", "2026-01-03", &[])
        .code(0)
        .stderr_has("warning: 2026-01-03 task `t`: the readiness check failed (counted as not ready): exit code 7 (0 is ready, 1 not ready; see ");
    assert_eq!(p.read("ran"), "2026-01-01\n");
    let json = p.run(&["show", "1", "--output", "json"]).json();
    let d = &json["interval_details"];
    assert_eq!(d[0]["ready"][0]["answer"], "here");
    assert_eq!(d[1]["ready"][0]["answer"], "no file yet");
    assert_eq!(d[1]["reason"], "not ready");
    assert!(
        d[2]["ready"][0]["answer"]
            .as_str()
            .unwrap()
            .starts_with("the check failed: exit code 7"),
        "{}",
        d[2]
    );
    // What each interval's last ask said, beside the tries' logs, until `forget` takes the
    // intervals' history and them with it.
    let logs = p.path(".backfill/logs/c/t");
    let listed = || {
        let mut names: Vec<String> = std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".ready."))
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        listed(),
        [
            "20260101T000000Z.ready.log",
            "20260102T000000Z.ready.log",
            "20260103T000000Z.ready.log"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(logs.join("20260102T000000Z.ready.log")).unwrap(),
        "no file yet\n"
    );
    p.run(&[
        "forget",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--yes",
    ])
    .code(0);
    assert_eq!(listed(), ["20260103T000000Z.ready.log"]);
}

/// A DAG of one command task whose readiness check is `check`, waiting `wait`, asked every
/// 200 ms; the task appends its day to `ran`.
fn checked(check: &str, wait: &str, extra: &str) -> Project {
    Project::new().dag(
        "c",
        &format!(
            "id = \"c\"\nschedule = \"@daily\"\n{extra}\n[[tasks]]\nid = \"t\"\ncommand = \"echo {{{{ ds }}}} >> ran\"\n\n[tasks.ready]\ncommand = \"{check}\"\nwait = \"{wait}\"\nevery = \"200ms\"\n"
        ),
    )
}

/// Ctrl-C while a check runs stops the check at once: the backfill ends interrupted, its
/// intervals stay planned (none is `not ready`), and `resume` asks again and runs them.
#[test]
fn a_stop_while_a_check_runs_stops_it_and_the_intervals_stay_planned() {
    let p = checked(
        "if [ -e go ]; then exit 0; fi; touch asked; sleep 1000",
        "1h",
        "max_active_runs = 2",
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    );
    wait_until("a check to run", Duration::from_secs(30), || {
        p.path("asked").exists()
    });
    let began = std::time::Instant::now();
    signal(&child, Signal::SIGINT);
    crate::support::wait_within(&p, "run", child, Duration::from_secs(30)).code(130);
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(
        p.rows("SELECT action, COALESCE(reason, '-') FROM plan ORDER BY interval_start"),
        [["run", "-"], ["run", "-"]]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM readiness WHERE state = 'not ready'"),
        0
    );
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&["resume", "1"]).code(0);
    let mut ran: Vec<String> = p.read("ran").lines().map(String::from).collect();
    ran.sort();
    assert_eq!(ran, ["2026-01-01", "2026-01-02"]);
}

/// `--max-failures` stops the intervals that wait for their sources too: they stay planned
/// for `resume`, not `not ready`.
#[test]
fn max_failures_stops_the_waiting_intervals_and_leaves_them_planned() {
    let p = Project::new().dag(
        "c",
        "id = \"c\"\nschedule = \"@daily\"\nmax_active_runs = 2\n\n[[tasks]]\nid = \"t\"\nretries = 0\ncommand = \"test {{ ds }} != 2026-01-01\"\n\n[tasks.ready]\ncommand = \"test {{ ds }} = 2026-01-01\"\nwait = \"1h\"\nevery = \"200ms\"\n",
    );
    p.create("c", "2026-01-01", "2026-01-03", &["--max-failures", "1"])
        .code(3)
        .stderr_has("2 intervals not started: continue with `");
    assert_eq!(
        p.rows("SELECT action, COALESCE(reason, '-') FROM plan ORDER BY interval_start"),
        [["run", "-"], ["run", "-"], ["run", "-"]]
    );
}

/// Intervals found ready start in the plan's order, backwards too; `--wait-ready` longer than
/// a year is refused.
#[test]
fn ready_intervals_start_in_the_plans_order() {
    let p = checked("true", "1m", "max_active_runs = 1");
    p.create("c", "2026-01-01", "2026-01-06", &["--run-backwards"])
        .code(0);
    assert_eq!(
        p.read("ran"),
        "2026-01-06\n2026-01-05\n2026-01-04\n2026-01-03\n2026-01-02\n2026-01-01\n"
    );
    p.create(
        "c",
        "2026-01-07",
        "2026-01-07",
        &["--wait-ready", "200000000000d"],
    )
    .code(2)
    .stderr_has("is longer than a year");
}

/// A check that hangs on one interval does not hold back the others, whose sources are there:
/// they run while it waits.
#[test]
fn a_check_that_hangs_on_one_interval_does_not_hold_the_others_back() {
    let p = checked(
        "if [ {{ ds }} = 2026-01-01 ]; then sleep 1000; fi",
        "1h",
        "max_active_runs = 2",
    );
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
        ],
    );
    wait_until("the other days to run", Duration::from_secs(20), || {
        p.path("ran").exists() && p.read("ran").lines().count() == 2
    });
    signal(&child, Signal::SIGINT);
    crate::support::wait_within(&p, "run", child, Duration::from_secs(30)).code(130);
    // The two ran at once, in either order.
    let mut ran: Vec<String> = p.read("ran").lines().map(String::from).collect();
    ran.sort();
    assert_eq!(ran, ["2026-01-02", "2026-01-03"]);
}
