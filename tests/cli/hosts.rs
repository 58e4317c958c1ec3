//! Several hosts sharing one project: each host a PID and a UTS namespace of its own on this
//! machine (`unshare`), with a host name, so that its processes cannot see or signal another
//! host's (as containers that share a project folder, or machines). An owner on another host is
//! judged by its lease alone: when it dies or freezes, another host takes its backfill over once
//! the lease has expired, and a frozen owner that comes back finds itself fenced and stops.
//!
//! Skipped loudly on a machine where namespaces cannot be made (not root); a failure under CI.

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{
    NOW, Out, Project, THREE_DAYS, alive, stopped, wait_stale, wait_until, wait_within,
};

/// Three days whose task holds a lock per interval (another try of the same interval waits for
/// it), notes its start and end with its host's name, and ends once `release` exists.
const DAG: &str = r#"
schedule = "@daily"
max_active_runs = 3
grace_period = "500ms"
[[tasks]]
id = "work"
command = '''
mkdir -p locks
exec 9> "locks/{{ ds }}"
flock -w 60 9 || exit 1
echo "start {{ ds }} $(hostname)" >> events.txt
while [ ! -f release ]; do sleep 0.05; done
echo "end {{ ds }} $(hostname)" >> events.txt
'''
"#;

const UNSHARE: &[&str] = &["--pid", "--fork", "--kill-child", "--mount-proc", "--uts"];

/// Whether hosts can be simulated here; says loudly why not, and fails under CI.
fn available(test: &str) -> bool {
    let made = Command::new("unshare")
        .args(UNSHARE)
        .arg("true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if made {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: `unshare {}` fails here: run the tests as root (CI must)",
        UNSHARE.join(" ")
    );
    eprintln!(
        "SKIPPED {test}: `unshare {}` fails here (it needs root)",
        UNSHARE.join(" ")
    );
    false
}

/// A backfill command running on a host of its own; the host dies when this is dropped.
struct Host {
    name: &'static str,
    unshare: Option<Child>,
    /// Its PID namespace (`pid:[N]`), which every process of the host shares.
    ns: String,
}

impl Host {
    /// Runs `backfill -C PROJECT ARGS` on host `name`; its output goes to `{name}.out`/`.err`.
    fn start(p: &Project, name: &'static str, args: &[&str]) -> Self {
        Self::spawn(p, name, UNSHARE, "hostname \"$0\" && \"$@\"", args)
    }

    /// Like [`Host::start`], in a PID namespace of its own but with this machine's host name
    /// (as a container with `--network host`); its backfill is process 1200 there, which no
    /// process of this test's namespace is.
    fn start_sharing_the_name(p: &Project, label: &'static str, args: &[&str]) -> Self {
        Self::spawn(
            p,
            label,
            &["--pid", "--fork", "--kill-child", "--mount-proc"],
            "echo 1199 > /proc/sys/kernel/ns_last_pid && \"$@\"",
            args,
        )
    }

    fn spawn(
        p: &Project,
        name: &'static str,
        unshare: &[&str],
        script: &str,
        args: &[&str],
    ) -> Self {
        let file = |ext: &str| File::create(p.path(&format!("{name}.{ext}"))).unwrap();
        let unshare = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c", script, name])
            .arg(env!("CARGO_BIN_EXE_backfill"))
            .arg("-C")
            .arg(p.path(""))
            .args(args)
            .env("BACKFILL_NOW", NOW)
            .env_remove("COLUMNS")
            .stdin(Stdio::null())
            .stdout(file("out"))
            .stderr(file("err"))
            .spawn()
            .expect("spawn unshare");
        // The namespace's first process is unshare's child.
        let pid = unshare.id();
        let mut init = 0;
        wait_until("the host to start", Duration::from_secs(10), || {
            init = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            init != 0
        });
        let ns = std::fs::read_link(format!("/proc/{init}/ns/pid"))
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        Self {
            name,
            unshare: Some(unshare),
            ns,
        }
    }

    /// Every process of this host, by its id outside.
    fn processes(&self) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                    .is_ok_and(|l| l.display().to_string() == self.ns)
            })
            .collect()
    }

    /// The host dies: every one of its processes at once (unshare's child, the namespace's
    /// first process, gets SIGKILL when unshare dies, and the kernel kills the rest).
    fn die(mut self) {
        let pids = self.processes();
        self.kill();
        wait_until(
            "the host's processes to die",
            Duration::from_secs(10),
            || !pids.iter().any(|&p| alive(p)),
        );
    }

    /// Every process of the host stops where it is (SIGSTOP), new ones included.
    fn freeze(&self) {
        wait_until("the host to freeze", Duration::from_secs(10), || {
            let pids = self.processes();
            for &pid in &pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            }
            pids.iter().all(|&pid| stopped(pid as u32))
        });
    }

    fn thaw(&self) {
        for pid in self.processes() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
    }

    fn kill(&mut self) {
        if let Some(mut unshare) = self.unshare.take() {
            let _ = kill(Pid::from_raw(unshare.id() as i32), Signal::SIGKILL);
            let _ = unshare.wait();
        }
    }

    fn wait(mut self, p: &Project, limit: Duration) -> Out {
        let unshare = self
            .unshare
            .take()
            .expect("a host runs until it is waited for");
        wait_within(p, self.name, unshare, limit)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // A test that failed half-way leaves no host behind (a task waiting for `release`).
        self.kill();
    }
}

fn events(p: &Project, what: &str) -> Vec<String> {
    let mut e: Vec<String> = std::fs::read_to_string(p.path("events.txt"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(what))
        .map(str::to_string)
        .collect();
    e.sort();
    e
}

fn on(host: &str, what: &str) -> Vec<String> {
    (1..=3)
        .map(|d| format!("{what} 2026-01-0{d} {host}"))
        .collect()
}

/// SQL for the host name of a recorded host (`NAME#PID-NAMESPACE`).
fn name_of(column: &str) -> String {
    format!(
        "CASE WHEN instr({column}, '#') > 0 THEN substr({column}, 1, instr({column}, '#') - 1) ELSE {column} END"
    )
}

/// Host A's three tries were cancelled and host B ran each interval once, to success, owning
/// the backfill in its second epoch.
fn taken_over_by_host_b(p: &Project) {
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {} FROM task_tries ORDER BY id",
            name_of("host")
        )),
        [
            ["cancelled", "hosta"],
            ["cancelled", "hosta"],
            ["cancelled", "hosta"],
            ["succeeded", "hostb"],
            ["succeeded", "hostb"],
            ["succeeded", "hostb"]
        ]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3,
        "each interval succeeded exactly once"
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {}, epoch FROM backfills",
            name_of("owner_host")
        )),
        [["completed", "hostb", "1"]]
    );
}

fn project() -> Project {
    let p = Project::new().dag("c", DAG);
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    p
}

#[test]
fn a_host_that_dies_is_taken_over_by_another_after_its_lease_and_nothing_stays_in_flight() {
    if !available("the hosts tests") {
        return;
    }
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT DISTINCT {} FROM backfills",
            name_of("owner_host")
        )),
        [["hosta"]]
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT DISTINCT {} FROM task_tries",
            name_of("host")
        )),
        [["hosta"]]
    );
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    wait_stale(&p, 1, 2000);
    // Host B cannot see host A's processes: it judges them by the lease alone.
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    // `show` here names the host that ran each interval: not this one.
    let show = p.run(&["show", "1"]);
    show.code(0).stdout_has(" host ");
    assert_eq!(show.stdout.matches(" hostb ").count(), 3, "{}", show.stdout);
    let json = p.run(&["--output", "json", "show", "1"]).json();
    assert_eq!(json["interval_details"][2]["host"], "hostb");
    let mut started = [on("hosta", "start"), on("hostb", "start")].concat();
    started.sort();
    assert_eq!(events(&p, "start"), started);
    assert_eq!(events(&p, "end"), on("hostb", "end"));
    taken_over_by_host_b(&p);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn a_frozen_host_is_taken_over_and_once_thawed_stops_recording_no_success() {
    if !available("the hosts tests") {
        return;
    }
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    // Freeze it right after a heartbeat commit, outside any manifest transaction.
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    a.freeze();
    wait_stale(&p, 1, 2000);
    let b = Host::start(&p, "hostb", &["resume", "1"]);
    wait_until(
        "host B to own the backfill",
        Duration::from_secs(20),
        || {
            p.rows(&format!(
                "SELECT {} FROM backfills WHERE id = 1",
                name_of("owner_host")
            )) == [["hostb"]]
        },
    );
    // Host A's frozen tries still hold their locks: host B's wait for them.
    a.thaw();
    a.wait(&p, Duration::from_secs(20))
        .code(130)
        .stderr_has("another backfill took the intervals over");
    wait_until(
        "host B to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 6,
    );
    std::fs::write(p.path("release"), "").unwrap();
    b.wait(&p, Duration::from_secs(60)).code(0);
    assert_eq!(
        events(&p, "end"),
        on("hostb", "end"),
        "host A finished nothing"
    );
    taken_over_by_host_b(&p);
}

#[test]
fn cancel_from_another_host_asks_the_owner_through_the_manifest_and_waits_for_it() {
    if !available("the hosts tests") {
        return;
    }
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    // Host B sees no process of host A: the owner is alive by its lease, and is asked.
    Host::start(&p, "hostb", &["cancel", "1"])
        .wait(&p, Duration::from_secs(30))
        .code(0)
        .stderr_has("asked backfill 1 (pid ")
        .stderr_has(" on host hosta) to stop")
        .stderr_has("backfill 1 stopped: cancelled");
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(events(&p, "end"), Vec::<String>::new());
    assert_eq!(
        p.rows("SELECT DISTINCT state FROM task_tries"),
        [["cancelled"]]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// A pool's slot held by a try of a host that died is given to another host's try once the
/// dead host's lease has expired, by a backfill of another DAG (which recovers nothing).
#[test]
fn a_pool_slot_of_a_host_that_died_goes_to_another_host_after_the_lease() {
    if !available("the hosts tests") {
        return;
    }
    let p = project();
    let pooled = DAG
        .replace("max_active_runs = 3\n", "")
        .replace("id = \"work\"\n", "id = \"work\"\npool = \"api\"\n");
    p.write("dags/c.toml", &pooled);
    p.write("dags/d.toml", &pooled);
    p.write(
        "backfill.toml",
        "lease_timeout = \"2s\"\n\n[pools]\napi = 1\n",
    );
    let a = Host::start(
        &p,
        "hosta",
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
    wait_until("host A's try to run", Duration::from_secs(20), || {
        events(&p, "start").len() == 1
    });
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    Host::start(
        &p,
        "hostb",
        &[
            "create",
            "--dag",
            "d",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-02",
        ],
    )
    .wait(&p, Duration::from_secs(60))
    .code(0);
    assert_eq!(events(&p, "end"), ["end 2026-01-02 hostb"]);
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {} FROM task_tries ORDER BY id",
            name_of("host")
        )),
        [["cancelled", "hosta"], ["succeeded", "hostb"]]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM pool_slots WHERE try_id = 1"),
        0,
        "host A's slot was given away"
    );
}

/// One host name, two PID namespaces (containers sharing the host name, as `--network host`
/// does): two hosts. Each judges the other by its lease, never by a process id that would name
/// another process, or none, in its own namespace.
#[test]
fn a_host_name_shared_by_two_pid_namespaces_names_two_hosts() {
    if !available("the hosts tests") {
        return;
    }
    let p = project();
    let a = Host::start_sharing_the_name(&p, "a", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    let here = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        p.rows(&format!(
            "SELECT owner_pid, {} FROM backfills",
            name_of("owner_host")
        )),
        [["1200".to_string(), here.clone()]]
    );
    // From this namespace, with the same host name: alive by its lease, whatever process 1200
    // is here (none).
    assert!(!alive(1200));
    let resume = p.spawn("resume", &["resume", "1"]);
    wait_within(&p, "resume", resume, Duration::from_secs(20))
        .code(2)
        .stderr_has(&format!(
            "backfill 1 is still running (pid 1200, host {here})"
        ));
    a.die();
    assert_eq!(events(&p, "end"), Vec::<String>::new());
}
