//! `backfill join ID`: another process, here on another host (a PID and UTS namespace of its
//! own, see `hosts`), helps run a live backfill. Together they never run more than the
//! backfill's max_active_runs; each interval runs once; a worker that dies or freezes is
//! recovered by the owner, whose runs of its intervals replace the worker's, and a frozen
//! worker that comes back records nothing.

use std::time::Duration;

use crate::hosts::Host;
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
            "SELECT date(interval_start), COUNT(*) FROM report_runs
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
            p.before("t.host", '#')
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

/// Host A owns the backfill (`create`, in project `p`) and host B holds two days; host A ends
/// its six, waits for host B's, and dies; its lease has expired on return. Returns host B and
/// host A's owner as it was recorded (`pid N, host hosta`).
fn owner_dies_beside_a_running_worker(p: &Project, create: &[&str]) -> (Host, String) {
    let (a, b) = owner_and_worker_of(p, create);
    let owner = format!(
        "pid {}, host hosta",
        p.count("SELECT owner_pid FROM backfills WHERE id = 1")
    );
    each_host_holds_two(p);
    // Host A ends its two, waits for host B's, and dies.
    release(p, "hosta");
    // Recorded, not only ended: a try's end is noted before its run's end is recorded.
    wait_until("host A to record six days", Duration::from_secs(30), || {
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'") == 6
    });
    a.die();
    // Its lease expired, or host B, finding it so, took the backfill over already.
    wait_until("host A's lease to expire", Duration::from_secs(20), || {
        let row = p.rows("SELECT heartbeat_at, epoch FROM backfills WHERE id = 1");
        let (beat, epoch): (i64, i64) = (row[0][0].parse().unwrap(), row[0][1].parse().unwrap());
        epoch > 0 || crate::support::now_ms() - beat > 2000
    });
    (b, owner)
}

/// The project with DAG `d` downstream of `c`: `create --cascade all` of `c` backfills `d` after
/// it, which a worker of `c`'s backfill neither checked nor was asked to run.
fn cascade_project() -> Project {
    let p = project();
    p.write(
        "dags/d.toml",
        "schedule = \"@daily\"\nupstream = [\"c\"]\n[[tasks]]\nid = \"after\"\ncommand = \"true\"\n",
    );
    p
}

/// A worker of a cascade's backfill cannot take its gone owner's place (`resume` goes on with
/// the cascade): it says so within the lease timeout and leaves the backfill to `resume`.
fn the_worker_leaves_it_to_resume(p: &Project, owner: &str) {
    wait_until(
        "host B to say that its owner is gone",
        Duration::from_secs(2),
        || {
            p.read("hostb.err")
                .contains("is gone, and worker 1 cannot take its place")
        },
    );
    // (The hosts name the project as `-C DIR/`.)
    assert!(
        p.read("hostb.err").contains(&format!(
            "backfill 1's owner ({owner}) is gone, and worker 1 cannot take its place (it is a cascade's backfill: `resume` goes on with the DAGs downstream): it starts no more intervals, ends its runs in flight and stops; `{}/ resume 1` runs the rest",
            p.hint("").trim_end()
        )),
        "{}",
        p.read("hostb.err")
    );
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn when_the_owner_dies_resume_takes_its_place_and_leaves_a_live_worker_its_runs() {
    let p = cascade_project();
    let (b, owner) =
        owner_dies_beside_a_running_worker(&p, &[EIGHT_DAYS, &["--cascade", "all"]].concat());
    the_worker_leaves_it_to_resume(&p, &owner);
    let c = Host::start(&p, "hostc", &["resume", "1"]);
    wait_until(
        "host C to own the backfill",
        Duration::from_secs(20),
        || {
            p.rows(&format!(
                "SELECT {} FROM backfills WHERE id = 1",
                p.before("owner_host", '#')
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
    // Host B ended its runs and stopped, as it said: resumable, its own runs succeeded.
    b.wait(&p, Duration::from_secs(60)).code(130).stderr_has(&format!(
        "worker 1 of backfill 1 cancelled: ran 2 intervals here (2 succeeded, 0 failed, 0 rejected, 0 cancelled); its owner is gone: `{}/ resume 1` runs the rest",
        p.hint("").trim_end()
    ));
    let started = events(&p, "start");
    assert_eq!(
        started.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        days(),
        "each day started once"
    );
    assert_eq!(events(&p, "end"), started);
    assert_eq!(
        p.rows(
            "SELECT date(interval_start), COUNT(*) FROM report_runs
             WHERE state = 'succeeded' AND backfill_id = 1 GROUP BY interval_start ORDER BY interval_start"
        ),
        days()
            .into_iter()
            .map(|d| vec![d, "1".to_string()])
            .collect::<Vec<_>>()
    );
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["workers"][0]["runs"], 2);
    // The resume went on with the cascade.
    assert_eq!(
        p.rows("SELECT id, dag_id, state FROM backfills ORDER BY id"),
        [["1", "c", "completed"], ["2", "d", "completed"]]
    );
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn when_the_owner_dies_beside_a_running_worker_the_worker_takes_its_place_and_keeps_its_runs() {
    let p = project();
    let (b, owner) = owner_dies_beside_a_running_worker(&p, EIGHT_DAYS);
    // Within the lease timeout of its expiry, host B owns the backfill, in a new epoch.
    wait_until("host B to own the backfill", Duration::from_secs(2), || {
        p.rows(&format!(
            "SELECT {}, epoch FROM backfills WHERE id = 1",
            p.before("owner_host", '#')
        )) == [["hostb", "1"]]
    });
    // Its two runs go on, as a worker's: not stopped, not run again.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE worker = 1 AND state = 'running'"),
        2
    );
    // The backfill has one owner: resume from elsewhere is refused.
    p.run(&["resume", "1"])
        .code(2)
        .stderr_has("backfill 1 is still running (pid ");
    release(&p, "hostb");
    let out = b.wait(&p, Duration::from_secs(60));
    out.code(0)
        .stderr_has(&format!(
            "backfill 1's owner ({owner}) is gone: worker 1 takes the backfill over and finishes it"
        ))
        .stderr_has("worker 1 goes on with backfill 1 of c as its owner: 0 intervals left to run")
        .stderr_has("backfill 1 of c: completed — 8 succeeded, 0 failed, 0 rejected, 0 cancelled, 0 skipped in ");
    let started = events(&p, "start");
    assert_eq!(
        started.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        days(),
        "each day started once"
    );
    assert_eq!(events(&p, "end"), started);
    each_day_succeeded_once(&p);
    assert_eq!(
        p.rows(&format!(
            "SELECT state, epoch, {} FROM backfills",
            p.before("owner_host", '#')
        )),
        [["completed", "1", "hostb"]]
    );
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["workers"][0]["state"], "completed");
    assert_eq!(show["workers"][0]["runs"], 2);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_worker_that_took_the_backfill_over_and_is_cancelled_records_it_cancelled() {
    let p = project();
    let (b, _) = owner_dies_beside_a_running_worker(&p, EIGHT_DAYS);
    wait_until("host B to own the backfill", Duration::from_secs(2), || {
        p.rows(&format!(
            "SELECT {} FROM backfills WHERE id = 1",
            p.before("owner_host", '#')
        )) == [["hostb"]]
    });
    // Cancelled while its runs in flight end: it stops them and, as the owner, records the end.
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 stopped: cancelled");
    b.wait(&p, Duration::from_secs(20))
        .code(130)
        .stderr_has("cancelled by `backfill cancel`")
        .stderr_has("worker 1 goes on with backfill 1 of c as its owner: 0 intervals left to run");
    assert_eq!(
        p.rows("SELECT state, epoch FROM backfills"),
        [["cancelled", "1"]]
    );
    assert_eq!(p.rows("SELECT state FROM workers"), [["cancelled"]]);
    assert_eq!(
        p.rows("SELECT state, COUNT(*) FROM runs GROUP BY state ORDER BY state"),
        [["cancelled", "2"], ["succeeded", "6"]]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    assert_eq!(events(&p, "end").len(), 6, "host B ended nothing");
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
    let p = cascade_project();
    let (b, owner) =
        owner_dies_beside_a_running_worker(&p, &[EIGHT_DAYS, &["--cascade", "all"]].concat());
    the_worker_leaves_it_to_resume(&p, &owner);
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
                 AND {} = '{day}'",
                p.day_of("interval_start")
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

/// A try notes its start and end and waits for `release` before it ends (for a minute at
/// most, so that none outlives a test that failed).
const ONE_AT_A_TIME: &str = r#"
schedule = "@daily"
grace_period = "500ms"
[[tasks]]
id = "work"
command = '''
echo "start {{ ds }}" >> events.txt
n=0
while [ ! -f release ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
echo "end {{ ds }}" >> events.txt
'''
"#;

/// The noted events, in the order they happened.
fn noted(p: &Project) -> Vec<String> {
    std::fs::read_to_string(p.path("events.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A process of a test, killed when dropped: a test that fails leaves none behind.
struct Killed(Option<std::process::Child>);

impl Killed {
    fn take(mut self) -> std::process::Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A worker joined beside an owner that holds the backfill's only place with a slow day; the
/// owner is killed (SIGKILL): its try goes on, orphaned, and its run holds the place. Returns
/// the worker and the owner's pid.
fn owner_killed_holding_the_only_place(p: &Project) -> (Killed, u32) {
    let owner = Killed(Some(p.spawn(
        "owner",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--max-active-runs",
            "1",
        ],
    )));
    wait_until(
        "the owner to start its first day",
        Duration::from_secs(20),
        || noted(p).len() == 1,
    );
    let worker = Killed(Some(
        p.spawn("worker", &["join", "latest", "--max-active-runs", "2"]),
    ));
    wait_until("the worker to join", Duration::from_secs(20), || {
        p.count("SELECT COUNT(*) FROM workers WHERE state = 'running'") == 1
    });
    let pid = owner.0.as_ref().map(std::process::Child::id).unwrap();
    // SIGKILL, and reaped.
    drop(owner);
    (worker, pid)
}

#[test]
fn a_worker_takes_over_an_owner_killed_holding_the_only_place_and_finishes_the_backfill() {
    let p = Project::new().dag("c", ONE_AT_A_TIME);
    p.write("backfill.toml", "lease_timeout = \"3s\"\n");
    let (worker, owner_pid) = owner_killed_holding_the_only_place(&p);
    let worker_pid = worker.0.as_ref().map(|w| w.id().to_string()).unwrap();
    // The dead owner's try is killed, its run recorded cancelled: the place is free again.
    wait_until(
        "the worker to take the backfill over",
        Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM runs WHERE state = 'cancelled'") == 1,
    );
    std::fs::write(p.path("release"), "").unwrap();
    let out = crate::support::wait_within(&p, "worker", worker.take(), Duration::from_secs(60));
    out.code(0);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "note: latest: backfill 1",
            "joined backfill 1 of c as worker 1: 2 intervals left to run, at most 2 at once here",
            &format!(
                "backfill 1's owner (pid {owner_pid}, host {}) is gone: worker 1 takes the backfill over and finishes it",
                this_host()
            ),
            "worker 1 goes on with backfill 1 of c as its owner: 3 intervals left to run",
        ],
        "{}",
        out.stderr
    );
    assert!(
        lines[lines.len() - 1].starts_with(
            "backfill 1 of c: completed — 3 succeeded, 0 failed, 0 rejected, 0 cancelled, 0 skipped in "
        ),
        "{}",
        out.stderr
    );
    // The owner's first day was started, killed before it ended, and run again: each day ended
    // once, in order, one at a time.
    assert_eq!(
        noted(&p),
        [
            "start 2026-01-01",
            "start 2026-01-01",
            "end 2026-01-01",
            "start 2026-01-02",
            "end 2026-01-02",
            "start 2026-01-03",
            "end 2026-01-03"
        ]
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT {}, r.state, t.state, COALESCE(t.error, ''), COALESCE(r.worker, 0)
             FROM runs r JOIN task_tries t ON t.run_id = r.id ORDER BY r.id",
            p.day_of("r.interval_start")
        )),
        [
            [
                "2026-01-01",
                "cancelled",
                "cancelled",
                "abandoned: the process of backfill 1 is gone",
                "0"
            ],
            ["2026-01-01", "succeeded", "succeeded", "", "0"],
            ["2026-01-02", "succeeded", "succeeded", "", "0"],
            ["2026-01-03", "succeeded", "succeeded", "", "0"]
        ]
    );
    // It owns the backfill in a new epoch and judged it; its end as a worker is recorded too.
    assert_eq!(
        p.rows("SELECT state, epoch, owner_pid FROM backfills"),
        [["completed", "1", worker_pid.as_str()]]
    );
    assert_eq!(p.rows("SELECT state FROM workers"), [["completed"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["intervals"]["succeeded"], 3);
    assert_eq!(show["intervals"]["cancelled"], 0);
    assert_eq!(show["workers"][0]["runs"], 0);
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn of_two_workers_that_find_the_owner_gone_one_takes_the_backfill_over_and_the_other_helps_it() {
    let p = project();
    let (a, b) = owner_and_worker(&p);
    let c = Host::start(&p, "hostc", &["join", "1"]);
    wait_until("host C to join", Duration::from_secs(20), || {
        p.count("SELECT COUNT(*) FROM workers WHERE state = 'running'") == 2
    });
    // Host A dies holding every place, its four tries with it.
    a.die();
    wait_until(
        "a worker to take the backfill over and recover host A's days",
        Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM runs WHERE state = 'cancelled'") == 4,
    );
    release(&p, "hostb");
    release(&p, "hostc");
    let outs = [
        ("hostb", b.wait(&p, Duration::from_secs(60))),
        ("hostc", c.wait(&p, Duration::from_secs(60))),
    ];
    for (_, out) in &outs {
        out.code(0);
    }
    // Exactly one took it over (the manifest's first claim); the other went on as a worker.
    let took: Vec<&str> = outs
        .iter()
        .filter(|(_, out)| {
            out.stderr
                .contains("takes the backfill over and finishes it")
        })
        .map(|(host, _)| *host)
        .collect();
    assert_eq!(took.len(), 1, "{outs:?}");
    assert_eq!(
        p.rows(&format!(
            "SELECT state, epoch, {} FROM backfills",
            p.before("owner_host", '#')
        )),
        [["completed", "1", took[0]]]
    );
    assert_eq!(
        p.rows("SELECT state FROM workers ORDER BY id"),
        [["completed"], ["completed"]]
    );
    // Host A's four days were recovered as cancelled; every day then succeeded once, elsewhere.
    assert_eq!(
        p.rows(
            "SELECT date(interval_start), state, error FROM report_tries
             WHERE run_id IN (SELECT run_id FROM report_runs WHERE state = 'cancelled')
             ORDER BY interval_start"
        ),
        (1..=4)
            .map(|d| {
                vec![
                    format!("2026-01-0{d}"),
                    "cancelled".to_string(),
                    "abandoned: the process of backfill 1 is gone".to_string(),
                ]
            })
            .collect::<Vec<_>>()
    );
    each_day_succeeded_once(&p);
    let ended = events(&p, "end");
    assert_eq!(
        ended.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        days(),
        "each day ended once"
    );
    assert!(ended.iter().all(|e| e.1 != "hosta"), "{ended:?}");
    let show = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(show["state"], "completed");
    assert_eq!(show["intervals"]["succeeded"], 8);
}
