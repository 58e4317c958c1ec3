//! A wall clock that is set back or ahead, before or while a backfill runs (libfaketime,
//! preloaded into the process under test): nothing ends before it started, a live owner of this
//! host is never taken for gone, and `resume --wait` waits no longer than the lease timeout.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::parts::Part;
use crate::support::{Project, signal, wait_until, wait_within};

/// Four days, each of whose tries waits for the file `go` in the project's folder.
const DAG: &str = r#"
schedule = "@daily"
max_active_runs = 4

[[tasks]]
id = "t"
command = "while [ ! -e go ]; do sleep 0.02; done"
"#;

const FOUR_DAYS: &[&str] = &[
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-04",
];

fn project(max_active_runs: u32, lease: &str) -> Project {
    let p = Project::new().dag(
        "c",
        &DAG.replace(
            "max_active_runs = 4",
            &format!("max_active_runs = {max_active_runs}"),
        ),
    );
    p.write("backfill.toml", &format!("lease_timeout = \"{lease}\"\n"));
    p
}

/// The environment of a process whose wall clock libfaketime sets: `FAKETIME` is an offset
/// (`+1h`) or, with `file`, the file that holds it, read again at every look at the clock (a
/// clock that jumps while the process runs). The monotonic clock stays the machine's, as a
/// clock set back or ahead leaves it.
fn faked(clock: Clock<'_>) -> Vec<(&'static str, String)> {
    let lib = Part::Faketime.require();
    let mut env = vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ];
    match clock {
        Clock::Offset(offset) => env.push(("FAKETIME", offset.to_string())),
        Clock::File(file) => {
            env.push(("FAKETIME_TIMESTAMP_FILE", file.display().to_string()));
            env.push(("FAKETIME_NO_CACHE", "1".to_string()));
        }
    }
    env
}

enum Clock<'a> {
    Offset(&'a str),
    File(&'a std::path::Path),
}

fn with<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn running_tries(p: &Project) -> i64 {
    p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'running'")
}

/// Unix seconds on a clock faked by `env`, as a process started with it reads it.
fn faked_now(env: &[(&str, &str)]) -> i64 {
    let out = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
#[cfg_attr(
    missing = "faketime",
    ignore = "no libfaketime: sudo apt-get install libfaketime"
)]
fn a_clock_set_back_while_a_backfill_runs_never_makes_anything_end_before_it_started() {
    // Two days at a time: the first two start before the clock is set back and end after; the
    // last two start and end after.
    let p = project(2, "30s");
    let file = p.path("faketime");
    std::fs::write(&file, "+0\n").unwrap();
    let env = faked(Clock::File(&file));
    let env = with(&env);
    let mut owner = p.spawn_with("owner", FOUR_DAYS, &env);
    crate::support::wait_while_running(
        &p,
        "owner",
        &mut owner,
        "two running tries",
        Duration::from_secs(30),
        &|| String::new(),
        || p.has_manifest() && running_tries(&p) == 2,
    );
    let running = Instant::now();
    std::fs::write(&file, "-1h\n").unwrap();
    let real = crate::support::now_ms() / 1000;
    assert!(
        faked_now(&env) < real - 3000,
        "libfaketime did not set the clock back"
    );
    // The first two days run for a while across the jump: their durations are measured.
    let lasted = Duration::from_millis(1500);
    wait_until("the first days to run a while", lasted * 2, || {
        running.elapsed() >= lasted
    });
    std::fs::write(p.path("go"), "").unwrap();
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(0).stderr_has("4 succeeded");
    if p.manifest_db().is_none() {
        // The owner's own clock was set back (a PostgreSQL manifest records the database's).
        assert!(
            p.count("SELECT MAX(started_at) - MIN(started_at) FROM runs") > 3_000_000,
            "the last runs did not start an hour earlier than the first"
        );
    }
    // Every end at or after its start, as recorded, and as `show` and `runs` say.
    for table in ["runs", "task_tries"] {
        assert_eq!(
            p.count(&format!(
                "SELECT COUNT(*) FROM {table} WHERE ended_at IS NULL OR ended_at < started_at
                   OR ended_at - started_at > 60000"
            )),
            0,
            "{table}: {:?}",
            p.rows(&format!("SELECT id, started_at, ended_at FROM {table}"))
        );
    }
    assert_eq!(
        p.count(
            "SELECT COUNT(*) FROM backfills WHERE finished_at < created_at
               OR finished_at - created_at > 60000"
        ),
        0,
        "{:?}",
        p.rows("SELECT created_at, finished_at FROM backfills")
    );
    let show = p.run(&["show", "1", "--output", "json"]);
    let show = show.code(0).json();
    let created = chrono::DateTime::parse_from_rfc3339(show["created_at"].as_str().unwrap());
    let finished = chrono::DateTime::parse_from_rfc3339(show["finished_at"].as_str().unwrap());
    assert!(finished.unwrap() >= created.unwrap(), "{show}");
    let durations: Vec<i64> = show["interval_details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["duration_ms"].as_i64().unwrap())
        .collect();
    assert_eq!(durations.len(), 4);
    assert!(
        durations.iter().all(|d| (0..60_000).contains(d)),
        "{durations:?}"
    );
    // Measured, not cut to nothing: the first two ran at least as long as this waited.
    assert!(durations[..2].iter().all(|&d| d >= 1500), "{durations:?}");
    let runs = p.run(&["runs", "--dag", "c", "--output", "json"]);
    let runs = runs.code(0).json();
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .all(|r| (0..60_000).contains(&r["duration_ms"].as_i64().unwrap())),
        "{runs}"
    );
    let table = p.run(&["show", "1"]);
    assert!(
        !table.code(0).stdout.contains("┆ -"),
        "a negative duration:\n{}",
        table.stdout
    );
}

#[test]
#[cfg_attr(
    missing = "faketime",
    ignore = "no libfaketime: sudo apt-get install libfaketime"
)]
fn a_create_whose_clock_is_an_hour_ahead_leaves_the_live_owner_of_this_host_alone() {
    let p = project(4, "2s");
    let mut owner = p.spawn("owner", FOUR_DAYS);
    crate::support::wait_while_running(
        &p,
        "owner",
        &mut owner,
        "four running tries",
        Duration::from_secs(30),
        &|| String::new(),
        || p.has_manifest() && running_tries(&p) == 4,
    );
    // By this process's clock the owner's last heartbeat is an hour old: its lease expired
    // long ago. Its process runs here: it is alive.
    let ahead = faked(Clock::Offset("+1h"));
    let second = p.run_with(FOUR_DAYS, &with(&ahead));
    second
        .code(0)
        .stderr_has("backfill 2 of c: 4 intervals, 0 to run, 4 skipped");
    assert_eq!(running_tries(&p), 4, "the owner's tries were stopped");
    std::fs::write(p.path("go"), "").unwrap();
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(0).stderr_has("4 succeeded");
    // Each day ran once, by the owner, and succeeded; the second create skipped them as in
    // flight, never as already existing.
    assert_eq!(
        p.rows("SELECT backfill_id, state, COUNT(*) FROM runs GROUP BY 1, 2"),
        [["1", "succeeded", "4"]]
    );
    assert_eq!(
        p.rows(
            "SELECT backfill_id, action, COALESCE(reason, '-'), COUNT(*) FROM plan
             GROUP BY 1, 2, 3 ORDER BY 1"
        ),
        [["1", "run", "-", "4"], ["2", "skip", "in flight", "4"]]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE state <> 'succeeded'"),
        0
    );
}

#[test]
#[cfg_attr(
    missing = "faketime",
    ignore = "no libfaketime: sudo apt-get install libfaketime"
)]
fn resume_wait_waits_no_longer_than_the_lease_timeout_for_a_heartbeat_from_the_future() {
    let p = project(4, "2s");
    let mut owner = p.spawn("owner", FOUR_DAYS);
    crate::support::wait_while_running(
        &p,
        "owner",
        &mut owner,
        "four running tries",
        Duration::from_secs(30),
        &|| String::new(),
        || p.has_manifest() && running_tries(&p) == 4,
    );
    // Frozen, with a heartbeat an hour ahead of the clock of the process that resumes it.
    signal(&owner, Signal::SIGSTOP);
    wait_until("the owner to stop", Duration::from_secs(10), || {
        crate::support::stopped(owner.id())
    });
    let behind = faked(Clock::Offset("-1h"));
    let began = Instant::now();
    let resume = p.spawn_with("resume", &["resume", "1", "--wait"], &with(&behind));
    wait_until(
        "resume to say how long the lease holds",
        Duration::from_secs(20),
        || p.read("resume.err").contains("more unless it beats again"),
    );
    let said = p.read("resume.err");
    let left = said
        .split("holds its lease for ")
        .nth(1)
        .and_then(|s| s.split(" more").next())
        .unwrap();
    let left = humantime::parse_duration(left).unwrap();
    assert!(left <= Duration::from_secs(2), "{said}");
    std::fs::write(p.path("go"), "").unwrap();
    let out = wait_within(&p, "resume", resume, Duration::from_secs(60));
    out.code(0).stderr_has("resuming backfill 1 of c");
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
    signal(&owner, Signal::SIGCONT);
    let thawed = p.wait("owner", owner);
    assert_eq!(thawed.code, 130, "{}", thawed.stderr);
    assert_eq!(
        p.rows(
            "SELECT date(interval_start), COUNT(*) FROM report_runs
             WHERE state = 'succeeded' GROUP BY 1 ORDER BY 1"
        ),
        (1..=4)
            .map(|d| vec![format!("2026-01-0{d}"), "1".to_string()])
            .collect::<Vec<_>>()
    );
}
