//! `backfill join ID`: another process, here on another host (a PID and UTS namespace of its
//! own, see `hosts`), helps run a live backfill. Together they never run more than the
//! backfill's max_active_runs; each interval runs once; a worker that dies or freezes is
//! recovered by the owner, whose runs of its intervals replace the worker's, and a frozen
//! worker that comes back records nothing.

use std::time::Duration;

use crate::hosts::{Host, name_of};
use crate::support::{Project, wait_until};

/// Eight days, at most four at once. A try fails at once when `fail-HOST` of its host exists;
/// else it counts the tries running at once (under a lock on a shared file) and notes the peak;
/// it waits, before it ends, for `release-HOST` of its host (on host A, after the fourth day:
/// `release-hosta-later`); it notes its start and end with its host's name.
const DAG: &str = r#"
schedule = "@daily"
max_active_runs = 4
grace_period = "500ms"
[[tasks]]
id = "work"
command = '''
if [ -f "fail-$(hostname)" ]; then exit 1; fi
exec 8>> running.lock
flock 8; n=$(( $(cat running 2>/dev/null || echo 0) + 1 )); echo $n > running; echo $n >> peaks; flock -u 8
echo "start {{ ds }} $(hostname)" >> events.txt
gate="release-$(hostname)"
if [ "$(hostname)" = hosta ] && [ "{{ ds }}" \> 2026-01-04 ]; then gate="$gate-later"; fi
while [ ! -f "$gate" ]; do sleep 0.05; done
sleep 0.2
flock 8; echo $(( $(cat running) - 1 )) > running; flock -u 8
echo "end {{ ds }} $(hostname)" >> events.txt
'''
"#;

const EIGHT_DAYS: &[&str] = &[
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-08",
];

/// Sixteen days of DAG `c` (also the batches' tests').
pub(crate) const SIXTEEN_DAYS: &[&str] = &[
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-16",
];

fn project() -> Project {
    let p = Project::new().dag("c", DAG);
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    p
}

/// The noted events `what` (`start`, `end`) as `(day, host)`, sorted.
fn events(p: &Project, what: &str) -> Vec<(String, String)> {
    let mut e: Vec<(String, String)> = std::fs::read_to_string(p.path("events.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            (w.next()? == what).then(|| (w.next().unwrap().into(), w.next().unwrap().into()))
        })
        .collect();
    e.sort();
    e
}

fn days() -> Vec<String> {
    (1..=8).map(|d| format!("2026-01-0{d}")).collect()
}

fn peak(p: &Project) -> i64 {
    std::fs::read_to_string(p.path("peaks"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// Lets the tries of `host` end (on host A, those of the first four days and the later ones).
fn release(p: &Project, host: &str) {
    std::fs::write(p.path(&format!("release-{host}")), "").unwrap();
    std::fs::write(p.path(&format!("release-{host}-later")), "").unwrap();
}

/// Host A's first four days end; it then holds two places of the four (its later days wait),
/// and host B the two others. Returns host B's days.
fn each_host_holds_two(p: &Project) -> Vec<String> {
    std::fs::write(p.path("release-hosta"), "").unwrap();
    wait_until(
        "each host to hold two days",
        Duration::from_secs(30),
        || {
            let started = events(p, "start");
            started.iter().filter(|e| e.1 == "hostb").count() == 2
                && started.iter().filter(|e| e.1 == "hosta").count() == 6
        },
    );
    events(p, "start")
        .into_iter()
        .filter(|e| e.1 == "hostb")
        .map(|e| e.0)
        .collect()
}

/// Each day ended succeeded exactly once, in backfill 1, and nothing is left leased.
fn each_day_succeeded_once(p: &Project) {
    assert_eq!(
        p.rows(
            "SELECT date(interval_start, 'unixepoch'), COUNT(*) FROM runs
             WHERE state = 'succeeded' AND backfill_id = 1 GROUP BY interval_start ORDER BY interval_start"
        ),
        days()
            .into_iter()
            .map(|d| vec![d, "1".to_string()])
            .collect::<Vec<_>>()
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// Host A owns the backfill and runs four days at once; host B joins once they run.
fn owner_and_worker(p: &Project) -> (Host, Host) {
    owner_and_worker_of(p, EIGHT_DAYS)
}

fn owner_and_worker_of(p: &Project, create: &[&str]) -> (Host, Host) {
    let a = Host::start(p, "hosta", create);
    wait_until("host A to run four days", Duration::from_secs(20), || {
        events(p, "start").len() == 4
    });
    let b = Host::start(p, "hostb", &["join", "1"]);
    wait_until("host B to join", Duration::from_secs(20), || {
        p.count("SELECT COUNT(*) FROM workers WHERE state = 'running'") == 1
    });
    (a, b)
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn two_hosts_joined_on_one_backfill_never_exceed_its_max_active_runs_together() {
    let p = project();
    let (a, b) = owner_and_worker(&p);
    // Four run on host A: host B finds no room, and starts nothing.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(events(&p, "start").len(), 4);
    release(&p, "hosta");
    release(&p, "hostb");
    a.wait(&p, Duration::from_secs(60)).code(0);
    b.wait(&p, Duration::from_secs(60))
        .code(0)
        .stderr_has("joined backfill 1 of c as worker 1:");
    assert!(
        peak(&p) <= 4,
        "more than max_active_runs at once: {}",
        peak(&p)
    );
    let started = events(&p, "start");
    assert_eq!(
        started.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        days(),
        "each day started once"
    );
    assert_eq!(events(&p, "end"), started);
    let on_b = started.iter().filter(|e| e.1 == "hostb").count();
    assert!(on_b >= 1, "host B ran nothing: {started:?}");
    each_day_succeeded_once(&p);
    // The manifest says which process ran each run, and `show` which host ran each interval.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE worker = 1"),
        on_b as i64
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT DISTINCT {} FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.worker = 1",
            name_of("t.host")
        )),
        [["hostb"]]
    );
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["workers"][0]["host"], "hostb");
    assert_eq!(show["workers"][0]["state"], "completed");
    assert_eq!(show["workers"][0]["runs"], on_b);
    let hosts = show["interval_details"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["host"] == "hostb")
        .count();
    assert_eq!(hosts, on_b);
}

/// Host B's worker runs two days and dies (`die`) or freezes past its lease (`!die`); host A,
/// the owner, recovers them once the lease expired and runs them itself. A frozen worker that
/// is thawed finds itself fenced and records nothing.
fn a_worker_lost(die: bool) {
    let p = project();
    let (a, b) = owner_and_worker(&p);
    let lost = each_host_holds_two(&p);
    release(&p, "hosta");
    if die {
        b.die();
        a.wait(&p, Duration::from_secs(60)).code(0);
    } else {
        b.freeze();
        a.wait(&p, Duration::from_secs(60)).code(0);
        b.thaw();
        b.wait(&p, Duration::from_secs(20))
            .code(130)
            .stderr_has("worker 1 was taken over: its intervals went back to backfill 1");
    }
    // Host B's days were started there, then run again on host A, and ended only there.
    for day in &lost {
        assert_eq!(
            events(&p, "start")
                .iter()
                .filter(|e| &e.0 == day)
                .map(|e| e.1.as_str())
                .collect::<Vec<_>>(),
            ["hosta", "hostb"]
        );
    }
    assert_eq!(
        events(&p, "end")
            .iter()
            .map(|e| (e.0.as_str(), e.1.as_str()))
            .collect::<Vec<_>>(),
        days()
            .iter()
            .map(|d| (d.as_str(), "hosta"))
            .collect::<Vec<_>>(),
        "host B ended nothing"
    );
    assert!(
        peak(&p) <= 4,
        "more than max_active_runs at once: {}",
        peak(&p)
    );
    each_day_succeeded_once(&p);
    assert_eq!(
        p.rows(
            "SELECT r.state, t.state, w.state, w.epoch FROM runs r
             JOIN task_tries t ON t.run_id = r.id JOIN workers w ON w.id = r.worker"
        ),
        [
            ["cancelled", "cancelled", "cancelled", "1"],
            ["cancelled", "cancelled", "cancelled", "1"]
        ]
    );
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["intervals"]["succeeded"], 8);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_worker_that_dies_is_recovered_by_the_owner_which_runs_its_days_again() {
    a_worker_lost(true);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_frozen_worker_is_recovered_by_the_owner_and_once_thawed_records_nothing() {
    a_worker_lost(false);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_stops_the_owner_and_its_workers_and_waits_for_both() {
    let p = project();
    let (a, b) = owner_and_worker(&p);
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 stopped: cancelled");
    assert_eq!(
        p.rows("SELECT state FROM workers"),
        [["cancelled"]],
        "cancel waited for the worker too"
    );
    a.wait(&p, Duration::from_secs(20)).code(130);
    b.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(events(&p, "end"), Vec::new());
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn join_refuses_what_it_cannot_help_and_records_no_worker() {
    let p = Project::new()
        .dag(
            "c",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "d",
            "schedule = \"@daily\"\ndepends_on_past = true\n[[tasks]]\nid = \"t\"\ncommand = \"while [ ! -f go ]; do sleep 0.05; done\"\n",
        );
    p.run(&["join", "1"])
        .code(2)
        .stderr_has("no backfill 1 in the manifest");
    let one_day = |dag: &'static str| {
        [
            "create",
            "--dag",
            dag,
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ]
    };
    p.run(&one_day("c")).code(0);
    p.run(&["join", "1"]).code(2).stderr_has(
        "backfill 1 is not running (it is completed); only a running backfill can be joined",
    );
    let owner = p.spawn("owner", &one_day("d"));
    wait_until("backfill 2 to run", Duration::from_secs(20), || {
        p.count("SELECT COUNT(*) FROM runs WHERE backfill_id = 2") == 1
    });
    p.run(&["join", "2"])
        .code(2)
        .stderr_has("DAG `d` has depends_on_past = true");
    std::fs::write(p.path("go"), "").unwrap();
    p.wait("owner", owner).code(0);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM workers"),
        0,
        "a refused join records no worker"
    );
}

/// Host A owns the backfill and host B holds two days; host A ends its six, waits for host B's,
/// and dies; its lease has expired on return.
fn owner_dies_beside_a_running_worker() -> (Project, Host) {
    let p = project();
    let (a, b) = owner_and_worker(&p);
    each_host_holds_two(&p);
    // Host A ends its two, waits for host B's, and dies.
    release(&p, "hosta");
    // Recorded, not only ended: a try's end is noted before its run's end is recorded.
    wait_until("host A to record six days", Duration::from_secs(30), || {
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'") == 6
    });
    a.die();
    crate::support::wait_stale(&p, 1, 2000);
    (p, b)
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn when_the_owner_dies_resume_takes_its_place_and_leaves_a_live_worker_its_runs() {
    let (p, b) = owner_dies_beside_a_running_worker();
    let c = Host::start(&p, "hostc", &["resume", "1"]);
    wait_until(
        "host C to own the backfill",
        Duration::from_secs(20),
        || {
            p.rows(&format!(
                "SELECT {} FROM backfills WHERE id = 1",
                name_of("owner_host")
            )) == [["hostc"]]
        },
    );
    // Host B's two runs were left to it: still running, its tries never stopped.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE worker = 1 AND state = 'running'"),
        2
    );
    release(&p, "hostb");
    c.wait(&p, Duration::from_secs(60)).code(0);
    b.wait(&p, Duration::from_secs(60)).code(0);
    let started = events(&p, "start");
    assert_eq!(
        started.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        days(),
        "each day started once"
    );
    assert_eq!(events(&p, "end"), started);
    each_day_succeeded_once(&p);
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["workers"][0]["runs"], 2);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn max_failures_counts_the_failures_of_every_process_of_the_backfill() {
    let p = project();
    let (a, b) = owner_and_worker_of(&p, &[SIXTEEN_DAYS, &["--max-failures", "1"]].concat());
    // Host B's tries fail: its first failure stops the whole backfill, host A included.
    std::fs::write(p.path("fail-hostb"), "").unwrap();
    release(&p, "hosta");
    a.wait(&p, Duration::from_secs(60))
        .code(3)
        .stderr_has("not started");
    b.wait(&p, Duration::from_secs(60)).code(3);
    let failed = p.count("SELECT COUNT(*) FROM runs WHERE state = 'failed' AND worker = 1");
    assert!(failed >= 1);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'failed'"),
        failed
    );
    let ran = p.count("SELECT COUNT(*) FROM runs");
    assert!(
        ran < 16,
        "host A went on after host B's failure: {ran} runs"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state NOT IN ('succeeded', 'failed')"),
        0,
        "every run that started ended"
    );
    assert_eq!(p.rows("SELECT state FROM backfills"), [["failed"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_of_a_gone_owner_waits_for_its_live_worker_to_stop() {
    let (p, b) = owner_dies_beside_a_running_worker();
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 cancelled; its process on host hosta sent no heartbeat");
    // When cancel returns, the worker has stopped and recorded its runs' end.
    assert_eq!(p.rows("SELECT state FROM workers"), [["cancelled"]]);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state IN ('queued', 'running')"),
        0
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    b.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(events(&p, "end").len(), 6, "host B ended nothing");
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn the_owner_recovers_a_frozen_worker_while_it_still_has_days_to_run() {
    let p = project();
    let (a, b) = owner_and_worker_of(&p, SIXTEEN_DAYS);
    let lost = each_host_holds_two(&p);
    // Four places held, two of them by a worker that froze: the owner, its own two days
    // waiting, recovers the worker once its lease expired, long before its queue runs dry.
    b.freeze();
    wait_until(
        "the owner to recover the frozen worker",
        Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM runs WHERE worker = 1 AND state = 'cancelled'") == 2,
    );
    assert!(
        p.count("SELECT COUNT(*) FROM runs") < 16,
        "recovered only once the owner's queue ran dry"
    );
    release(&p, "hosta");
    a.wait(&p, Duration::from_secs(60)).code(0);
    b.thaw();
    b.wait(&p, Duration::from_secs(20)).code(130);
    for day in &lost {
        assert_eq!(
            p.count(&format!(
                "SELECT COUNT(*) FROM runs WHERE state = 'succeeded' AND worker IS NULL
                 AND date(interval_start, 'unixepoch') = '{day}'"
            )),
            1
        );
    }
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        16
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// Host name of this machine, as the DAG's tasks see it.
fn this_host() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_join_whose_dag_differs_from_the_backfills_is_refused_and_resume_records_the_change() {
    let p = project();
    let owner = p.spawn("owner", EIGHT_DAYS);
    wait_until(
        "the owner to run four days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 4,
    );
    let changed = DAG.replace("sleep 0.2", "sleep 0.3");
    p.write("dags/c.toml", &changed);
    let out = p.run(&["join", "1"]);
    out.code(2).stderr_has(
        "backfill 1: DAG `c` in dags/c.toml is not the definition the backfill runs (tasks.work.command changed); join from a checkout with the backfill's definition",
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM workers"),
        0,
        "a refused join recorded nothing"
    );
    // The owner dies; resume runs the definition it finds, says so, and records it.
    let mut owner = owner;
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::fs::write(p.path(&format!("release-{}", this_host())), "").unwrap();
    let resumed = p.run(&["resume", "1"]);
    resumed.code(0).stderr_has(
        "warning: DAG `c` in dags/c.toml changed since backfill 1 last ran (tasks.work.command changed): the rest of it runs this definition",
    );
    let recorded = p.rows("SELECT definition FROM backfills WHERE id = 1");
    assert!(
        recorded[0][0].contains("sleep 0.3"),
        "the new definition is recorded: {recorded:?}"
    );
    // A comment alone is no change: the same definition, nothing said.
    p.write("dags/c.toml", &format!("# reviewed\n{changed}"));
    let again = p.run(&[
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-09",
        "--to",
        "2026-01-09",
    ]);
    again.code(0);
    assert_eq!(
        p.rows("SELECT definition FROM backfills WHERE id = 2"),
        recorded,
        "the same DAG, the same recorded definition"
    );
}
