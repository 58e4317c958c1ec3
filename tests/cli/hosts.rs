//! Several hosts sharing one project: each host a PID and a UTS namespace of its own on this
//! machine (`unshare`), with a host name, so that its processes cannot see or signal another
//! host's (as containers that share a project folder, or machines). An owner on another host is
//! judged by its lease alone: when it dies or freezes, another host takes its backfill over once
//! the lease has expired, and a frozen owner that comes back finds itself fenced and stops.
//!
//! Ignored on a machine where namespaces cannot be made (not root; `tests/parts`), a failure
//! under CI.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::parts::{Part, UNSHARE};
use crate::support::{
    NOW, Out, Project, THREE_DAYS, alive, day_unix, now_ms, stopped, wait_stale, wait_until,
    wait_within,
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

/// A backfill command running on a host of its own; the host dies when this is dropped.
pub(crate) struct Host {
    name: &'static str,
    unshare: Option<Child>,
    /// Its PID namespace (`pid:[N]`), which every process of the host shares.
    ns: String,
}

impl Host {
    /// Runs `backfill -C PROJECT ARGS` on host `name`; its output goes to `{name}.out`/`.err`.
    pub(crate) fn start(p: &Project, name: &'static str, args: &[&str]) -> Self {
        Self::spawn(p, name, UNSHARE, "hostname \"$0\" && \"$@\"", args)
    }

    /// Like [`Host::start`], the name set through `/proc` (`hostname` refuses some names).
    fn start_proc_name(p: &Project, name: &'static str, args: &[&str]) -> Self {
        Self::spawn(
            p,
            name,
            UNSHARE,
            "printf %s \"$0\" > /proc/sys/kernel/hostname && \"$@\"",
            args,
        )
    }

    /// Like [`Host::start`], with more environment (`BACKFILL_FAULT`).
    fn start_env(p: &Project, name: &'static str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_env(p, name, UNSHARE, "hostname \"$0\" && \"$@\"", args, env)
    }

    /// Like [`Host::start`], in a PID namespace of its own but with this machine's host name
    /// (as a container with `--network host`); its backfill is process `pid` there, which no
    /// process of this test's namespace is (see [`free_pid`]).
    fn start_sharing_the_name(p: &Project, label: &'static str, args: &[&str], pid: i32) -> Self {
        let script = format!("echo {} > /proc/sys/kernel/ns_last_pid && \"$@\"", pid - 1);
        Self::spawn(
            p,
            label,
            &["--pid", "--fork", "--kill-child", "--mount-proc"],
            &script,
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
        Self::spawn_env(p, name, unshare, script, args, &[])
    }

    fn spawn_env(
        p: &Project,
        name: &'static str,
        unshare: &[&str],
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        // Tests that need namespaces are ignored where they cannot be made (`tests/parts`);
        // one that runs all the same (CI) fails here, saying why.
        static PROGRAM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        let program = PROGRAM.get_or_init(|| Part::Namespaces.find());
        let program = program.as_ref().unwrap_or_else(|why| panic!("{why}"));
        let file = |ext: &str| File::create(p.path(&format!("{name}.{ext}"))).unwrap();
        let mut command = Command::new(program);
        command
            .args(unshare)
            .args(["sh", "-c", script, name])
            .arg(env!("CARGO_BIN_EXE_backfill"))
            .arg("-C")
            .arg(p.path(""))
            .args(args)
            .env("BACKFILL_NOW", NOW)
            .env_remove("BACKFILL_MANIFEST");
        if let Some(db) = p.manifest_db() {
            command.env("BACKFILL_MANIFEST", crate::pg::shared().url(db));
        }
        let unshare = command
            .envs(env.iter().copied())
            .env_remove("COLUMNS")
            .stdin(Stdio::null())
            .stdout(file("out"))
            .stderr(file("err"))
            .spawn()
            .expect("spawn unshare");
        // The namespace's first process is unshare's child (unless a short command already
        // ended, and the host with it).
        let pid = unshare.id();
        let mut init = 0;
        wait_until("the host to start", Duration::from_secs(10), || {
            init = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            init != 0 || !alive(pid as i32)
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
    pub(crate) fn die(mut self) {
        let pids = self.processes();
        self.kill();
        wait_until(
            "the host's processes to die",
            Duration::from_secs(10),
            || !pids.iter().any(|&p| alive(p)),
        );
    }

    /// Every process of the host stops where it is (SIGSTOP), new ones included.
    pub(crate) fn freeze(&self) {
        wait_until("the host to freeze", Duration::from_secs(10), || {
            let pids = self.processes();
            for &pid in &pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            }
            pids.iter().all(|&pid| frozen(pid))
        });
    }

    pub(crate) fn thaw(&self) {
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

    pub(crate) fn wait(mut self, p: &Project, limit: Duration) -> Out {
        let unshare = self
            .unshare
            .take()
            .expect("a host runs until it is waited for");
        wait_within(p, self.name, unshare, limit)
    }
}

/// Whether a process that was sent SIGSTOP runs no more of its own code: each of its threads
/// is stopped, or a zombie (a child that exited just before its parent stopped), or in the
/// kernel (`D`), which it leaves only to stop. A thread that started a try with `vfork` waits
/// there until the child `exec`s, and the child may be stopped before it does: that thread
/// never shows `T`. A process gone meanwhile runs nothing either.
fn frozen(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |s| {
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            matches!(state, Some("T" | "t" | "Z" | "X" | "D"))
        })
    })
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

/// Host A's three tries were cancelled and host B ran each interval once, to success, owning
/// the backfill in its second epoch.
fn taken_over_by_host_b(p: &Project) {
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {} FROM task_tries ORDER BY id",
            p.before("host", '#')
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
            p.before("owner_host", '#')
        )),
        [["completed", "hostb", "1"]]
    );
}

/// Host A running the three days, frozen right after a heartbeat commit (outside any manifest
/// transaction): its lease still fresh.
fn frozen_owner_on_host_a(p: &Project) -> Host {
    let a = Host::start(p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(p, "start").len() == 3,
    );
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    a.freeze();
    a
}

/// A process id no process of this namespace has now: the pid of an owner in a namespace of
/// its own that this namespace must not judge by its pid. (Ids are given again once they wrap,
/// so a fixed one may be any process of a busy machine.)
fn free_pid() -> i32 {
    (20_000..32_000)
        .rev()
        .find(|&n| !alive(n))
        .expect("a free process id")
}

fn project() -> Project {
    let p = Project::new().dag("c", DAG);
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    p
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_host_that_dies_is_taken_over_by_another_after_its_lease_and_nothing_stays_in_flight() {
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
            p.before("owner_host", '#')
        )),
        [["hosta"]]
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT DISTINCT {} FROM task_tries",
            p.before("host", '#')
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
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_frozen_host_is_taken_over_and_once_thawed_stops_recording_no_success() {
    let p = project();
    let a = frozen_owner_on_host_a(&p);
    wait_stale(&p, 1, 2000);
    let b = Host::start(&p, "hostb", &["resume", "1"]);
    wait_until(
        "host B to own the backfill",
        Duration::from_secs(20),
        || {
            p.rows(&format!(
                "SELECT {} FROM backfills WHERE id = 1",
                p.before("owner_host", '#')
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
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn resume_wait_waits_out_a_frozen_hosts_lease_then_takes_the_backfill_over() {
    let p = project();
    let a = frozen_owner_on_host_a(&p);
    // Without --wait, a lease still held is refused at once, as before.
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(30))
        .code(2)
        .stderr_has("backfill 1 is still running (pid ");
    // With it, host C says how long it waits, waits the lease out, and takes over.
    let c = Host::start(&p, "hostc", &["resume", "1", "--wait"]);
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
    a.thaw();
    a.wait(&p, Duration::from_secs(20)).code(130);
    std::fs::write(p.path("release"), "").unwrap();
    c.wait(&p, Duration::from_secs(60))
        .code(0)
        .stderr_has("backfill 1's owner (pid ")
        .stderr_has("host hosta) holds its lease for ")
        .stderr_has("more unless it beats again: waiting for it to expire");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3,
        "each interval succeeded exactly once"
    );
    assert_eq!(
        events(&p, "end"),
        on("hostc", "end"),
        "host A finished nothing"
    );
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_from_another_host_asks_the_owner_through_the_manifest_and_waits_for_it() {
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
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_pool_slot_of_a_host_that_died_goes_to_another_host_after_the_lease() {
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
            p.before("host", '#')
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
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_host_name_shared_by_two_pid_namespaces_names_two_hosts() {
    let p = project();
    let pid = free_pid();
    let a = Host::start_sharing_the_name(&p, "a", THREE_DAYS, pid);
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
            p.before("owner_host", '#')
        )),
        [[pid.to_string(), here.clone()]]
    );
    // From this namespace, with the same host name: alive by its lease, whatever process `pid`
    // is here (none, when it was chosen).
    let resume = p.spawn("resume", &["resume", "1"]);
    wait_within(&p, "resume", resume, Duration::from_secs(20))
        .code(2)
        .stderr_has(&format!(
            "backfill 1 is still running (pid {pid}, host {here})"
        ));
    a.die();
    assert_eq!(events(&p, "end"), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Owners frozen or dead at each step, takeovers racing, legacy host rows, names with `#`:
// each test states the promise it checks.

const ONE_DAY: &[&str] = &[
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-01",
];

/// A command task with a gate and a `publish` command that notes its start, waits for a file
/// `go-HOST` of its own host, then writes its host's name into `published-DS`.
const PUBLISHING: &str = r#"
schedule = "@daily"
grace_period = "500ms"
[[tasks]]
id = "work"
command = '''printf '{"rows": 1}' > "$BACKFILL_RESULT"'''
publish = '''
echo "publish-start {{ ds }} $(hostname)" >> events.txt
while [ ! -f "go-$(hostname)" ]; do sleep 0.01; done
echo "publish-sleep {{ ds }} $(hostname)" >> events.txt
sleep 1
hostname > "published-{{ ds }}"
echo "publish-end {{ ds }} $(hostname)" >> events.txt
'''
[tasks.gate]
"#;

/// The owner process alone frozen on another host while its try's `publish` command waits:
/// README says "its publish is refused all the same". The try's publish command, started before
/// the freeze, runs on (nothing here can stop it); it publishes before the taker does, and the
/// taker publishes after it: the last output is the taker's. Once thawed, the old owner exits 130
/// and records no success.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn an_owner_frozen_alone_during_its_publish_command_records_no_success() {
    let p = Project::new().dag("c", PUBLISHING);
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    let a = Host::start(&p, "hosta", ONE_DAY);
    wait_until("host A to publish", Duration::from_secs(20), || {
        events(&p, "publish-start").len() == 1
    });
    // Stop only host A's backfill (the process recorded as owner, pid inside its namespace: the
    // only process of the host whose command line names `backfill`).
    let owner: Vec<i32> = a
        .processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split('\0')
                    .next()
                    .is_some_and(|x| x.ends_with("/backfill"))
            })
        })
        .collect();
    assert_eq!(owner.len(), 1, "{owner:?}");
    kill(Pid::from_raw(owner[0]), Signal::SIGSTOP).unwrap();
    wait_stale(&p, 1, 2000);
    // The old try's publish goes on while its owner is frozen.
    std::fs::write(p.path("go-hosta"), "").unwrap();
    wait_until("host A's publish to end", Duration::from_secs(10), || {
        events(&p, "publish-end").len() == 1
    });
    std::fs::write(p.path("go-hostb"), "").unwrap();
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(p.read("published-2026-01-01"), "hostb\n");
    kill(Pid::from_raw(owner[0]), Signal::SIGCONT).unwrap();
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {} FROM task_tries ORDER BY id",
            p.before("host", '#')
        )),
        [["cancelled", "hosta"], ["succeeded", "hostb"]]
    );
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {}, epoch FROM backfills",
            p.before("owner_host", '#')
        )),
        [["completed", "hostb", "1"]]
    );
}

/// A SQL DAG on a SQLite warehouse whose one task copies `src` for the day into `t`.
fn sqlite_project() -> Project {
    let p = Project::new().dag(
        "c",
        r#"
schedule = "@daily"
[[tasks]]
id = "copy"
warehouse = "w"
target = "t"
partition_column = "day"
sql = "SELECT day, v FROM src WHERE day = :ds"
"#,
    );
    p.write(
        "backfill.toml",
        "lease_timeout = \"2s\"\n[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write(
        "init.sql",
        "CREATE TABLE src (day TEXT, v INTEGER);\nINSERT INTO src VALUES ('2026-01-01', 1);\nCREATE TABLE t (day TEXT, v INTEGER);\nCREATE INDEX t_day ON t (day);\n",
    );
    p
}

fn warehouse_rows(p: &Project) -> Vec<(String, i64)> {
    let wh = rusqlite::Connection::open(p.path("w.db")).unwrap();
    let mut stmt = wh.prepare("SELECT day, v FROM t ORDER BY day, v").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn set_source(p: &Project, v: i64) {
    let wh = rusqlite::Connection::open(p.path("w.db")).unwrap();
    wh.busy_timeout(Duration::from_secs(10)).unwrap();
    wh.execute("UPDATE src SET v = ?1", [v]).unwrap();
}

fn audit_files(p: &Project) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(p.path(".backfill/audit"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".db"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until a process of `host` is stopped (it froze itself at a fault point).
fn wait_self_frozen(host: &Host) {
    wait_until(
        "the owner to freeze itself",
        Duration::from_secs(20),
        || host.processes().iter().any(|&pid| stopped(pid as u32)),
    );
}

/// An owner on another host freezes itself (alone) at `point`, after its SQL try's publish
/// intent was recorded; the taker finishes that publish (from the audit file, or records the
/// one that committed) and removes the file; the thawed owner's publish is refused, it exits
/// 130, and the warehouse holds one copy of the day: the decided output.
fn sqlite_owner_frozen_at(point: &str) {
    let p = sqlite_project();
    let fault = format!("{point}:stop");
    let a = Host::start_env(&p, "hosta", ONE_DAY, &[("BACKFILL_FAULT", &fault)]);
    wait_self_frozen(&a);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        1
    );
    wait_stale(&p, 1, 2000);
    set_source(&p, 2);
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(warehouse_rows(&p), [("2026-01-01".to_string(), 1)]);
    a.thaw();
    let out = a.wait(&p, Duration::from_secs(20));
    out.code(130);
    assert_eq!(
        warehouse_rows(&p),
        [("2026-01-01".to_string(), 1)],
        "one copy of the day, published once"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        1
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM task_tries"), 1);
    assert_eq!(audit_files(&p), Vec::<String>::new());
    assert_eq!(
        p.rows(&format!(
            "SELECT state, {}, epoch FROM backfills",
            p.before("owner_host", '#')
        )),
        [["completed", "hostb", "1"]]
    );
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn sqlite_owner_frozen_before_publish_is_refused_after_the_takeover() {
    sqlite_owner_frozen_at("before-publish");
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn sqlite_owner_frozen_at_publish_is_refused_after_the_takeover() {
    sqlite_owner_frozen_at("publish");
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn sqlite_owner_frozen_after_publish_records_nothing_after_the_takeover() {
    sqlite_owner_frozen_at("after-publish");
}

/// The same, frozen after its audit and before any publish intent (`after-audit`): the taker
/// reruns the day with the newer source; the thawed owner must not publish its older rows.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn sqlite_owner_frozen_after_audit_publishes_nothing_after_the_takeover() {
    let p = sqlite_project();
    let a = Host::start_env(
        &p,
        "hosta",
        ONE_DAY,
        &[("BACKFILL_FAULT", "after-audit:stop")],
    );
    wait_self_frozen(&a);
    wait_stale(&p, 1, 2000);
    set_source(&p, 2);
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(warehouse_rows(&p), [("2026-01-01".to_string(), 2)]);
    a.thaw();
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(
        warehouse_rows(&p),
        [("2026-01-01".to_string(), 2)],
        "the stale try published nothing"
    );
    assert_eq!(
        p.rows("SELECT state FROM task_tries ORDER BY id"),
        [["cancelled"], ["succeeded"]]
    );
    assert_eq!(audit_files(&p), Vec::<String>::new(), "no audit file left");
}

/// README: "`show` names the host that ran each interval" (always in JSON). A SQL task's try
/// run on another host.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn show_names_the_host_of_a_sql_try_run_on_another_host() {
    let p = sqlite_project();
    Host::start(&p, "hostb", ONE_DAY)
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(warehouse_rows(&p), [("2026-01-01".to_string(), 1)]);
    assert_eq!(
        p.rows(&format!(
            "SELECT {} FROM backfills",
            p.before("owner_host", '#')
        )),
        [["hostb"]]
    );
    let json = p.run(&["--output", "json", "show", "1"]).json();
    let table = p.run(&["show", "1"]);
    assert_eq!(
        json["interval_details"][0]["host"],
        "hostb",
        "{:#}\n{}",
        json["interval_details"][0],
        p.rows("SELECT id, host FROM task_tries")
            .iter()
            .map(|r| r.join(" "))
            .collect::<Vec<_>>()
            .join("; ")
    );
    table.code(0).stdout_has(" hostb ");
}

/// Two hosts resume the same dead owner at once, and a third creates the same range: one
/// takes the backfill over, and no interval is run twice by the takers.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn two_hosts_racing_to_take_over_one_dead_owner_run_each_interval_once() {
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    wait_stale(&p, 1, 2000);
    let b = Host::start(&p, "hostb", &["resume", "1"]);
    let c = Host::start(&p, "hostc", &["resume", "1"]);
    let d = Host::start(&p, "hostd", THREE_DAYS);
    let (b, c, d) = (
        b.wait(&p, Duration::from_secs(60)),
        c.wait(&p, Duration::from_secs(60)),
        d.wait(&p, Duration::from_secs(60)),
    );
    let codes = [b.code, c.code, d.code];
    assert!(
        codes.iter().all(|c| [0, 2].contains(c)),
        "{codes:?}\n{}\n{}\n{}",
        b.stderr,
        c.stderr,
        d.stderr
    );
    let taken: Vec<String> = events(&p, "end");
    let mut days: Vec<&str> = taken.iter().map(|e| e.split(' ').nth(1).unwrap()).collect();
    days.sort();
    assert_eq!(
        days,
        ["2026-01-01", "2026-01-02", "2026-01-03"],
        "each interval ran to its end exactly once: {taken:?}"
    );
    assert_eq!(
        events(&p, "start").len(),
        6,
        "three tries of host A, three of the takers"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// A host name may hold `#` (Linux allows any byte but NUL): messages and `show` must name it
/// whole, not cut at the first `#`.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_host_name_with_a_hash_is_shown_whole() {
    let p = project();
    let a = Host::start_proc_name(&p, "etl#2", THREE_DAYS);
    wait_until(
        "host etl#2 to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    assert_eq!(events(&p, "start"), on("etl#2", "start"));
    let show = p.run(&["--output", "json", "show", "1"]).json();
    let shown = show["interval_details"][0]["host"].clone();
    let cancel = p.run(&["cancel", "1"]);
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(shown, "etl#2", "show names the host");
    cancel.code(0).stderr_has(" on host etl#2) to stop");
}

/// A manifest written by an older version records plain host names. One that is not this
/// host's name is another host, judged by its lease alone, whatever its pid names here (pid 1
/// is alive in every namespace); one that is this host's name is this host, judged by its pid.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn legacy_plain_host_names_are_judged_as_the_readme_says() {
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    // As an older version would have written it: plain host names, pid 1.
    p.exec(
        "UPDATE backfills SET owner_host = 'hosta', owner_pid = 1;
         UPDATE task_tries SET host = 'hosta';",
    );
    wait_stale(&p, 1, 2000);
    let out = p.run(&["resume", "1"]);
    out.code(0);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3
    );
    // This host's plain name with a dead pid and a fresh heartbeat: it may have been written
    // in a container sharing the name, so its lease decides: still running.
    let here = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let now = now_ms();
    p.exec(&format!(
        "UPDATE backfills SET state = 'running', owner_host = '{here}', owner_pid = 999999,
                heartbeat_at = {now}"
    ));
    p.run(&["resume", "1"])
        .code(2)
        .stderr_has("is still running");
    // And with a live pid (this test), it is alive: refused.
    let (now, me) = (now_ms(), std::process::id());
    p.exec(&format!(
        "UPDATE backfills SET state = 'running', owner_host = '{here}', owner_pid = {me},
                heartbeat_at = {now} + 60000"
    ));
    p.run(&["resume", "1"])
        .code(2)
        .stderr_has("is still running");
}

/// While the owner's heartbeat is fresh, nothing on another host takes it over, even with its
/// processes invisible and the owner frozen for less than the lease; `--dry-run` says
/// `in flight`. Once the lease expired, the dry run predicts `run` and a `create` runs them.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn no_takeover_while_the_lease_is_fresh_and_dry_run_predicts_across_hosts() {
    let p = project();
    p.write("backfill.toml", "lease_timeout = \"3s\"\n");
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    let dry = |p: &Project| {
        let j = p
            .run(&[
                "--output",
                "json",
                "create",
                "--dag",
                "c",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-03",
                "--reprocess-behavior",
                "failed",
                "--dry-run",
            ])
            .json();
        j["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| format!("{} {}", i["action"], i["reason"]))
            .collect::<Vec<_>>()
    };
    assert_eq!(dry(&p), vec!["\"skip\" \"in flight\""; 3]);
    // Frozen for less than the lease: still alive, from this host and from host B.
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    a.freeze();
    std::thread::sleep(Duration::from_millis(1500));
    p.run(&["resume", "1"])
        .code(2)
        .stderr_has("is still running");
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(20))
        .code(2);
    assert_eq!(dry(&p), vec!["\"skip\" \"in flight\""; 3]);
    a.thaw();
    // The owner goes on; then dies.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        p.rows("SELECT state, epoch FROM backfills"),
        [["running", "0"]],
        "no takeover of a live owner"
    );
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    wait_stale(&p, 1, 3000);
    assert_eq!(
        dry(&p),
        vec!["\"run\" null"; 3],
        "a gone owner would be recovered first\n{}\n{:?}",
        p.dump(),
        events(&p, "")
    );
    let mut failed = THREE_DAYS.to_vec();
    failed.extend(["--reprocess-behavior", "failed"]);
    Host::start(&p, "hostb", &failed)
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(events(&p, "end"), on("hostb", "end"));
}

/// A pool of one slot shared by two DAGs on two live hosts: host B's try waits for host A's,
/// whose owner is alive on another host; never two at once.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_pool_slot_of_a_live_owner_on_another_host_is_not_taken() {
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
    let a = Host::start(&p, "hosta", ONE_DAY);
    wait_until("host A's try to run", Duration::from_secs(20), || {
        events(&p, "start").len() == 1
    });
    let b = Host::start(
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
    );
    // Well past the lease timeout: host A is alive and keeps its slot.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(events(&p, "start"), ["start 2026-01-01 hosta"]);
    std::fs::write(p.path("release"), "").unwrap();
    a.wait(&p, Duration::from_secs(30)).code(0);
    b.wait(&p, Duration::from_secs(30)).code(0);
    assert_eq!(
        events(&p, "end"),
        ["end 2026-01-01 hosta", "end 2026-01-02 hostb"]
    );
}

/// An owner of an older version (plain host names) on host `name` is killed with `kill -9`;
/// its tries run on. This version, on the same host, resumes it: the legacy rule makes the
/// recorded plain name this host, so the tries are killed before their intervals run again.
fn legacy_owner_resumed_on_its_own_host(name: &'static str) {
    let p = project();
    let script = r#"printf %s "$0" > /proc/sys/kernel/hostname || exit 97
cd "$3" || exit 98
"$@" &
pid=$!
while [ "$(grep -c '^start' events.txt 2>/dev/null)" != 3 ]; do sleep 0.05; done
kill -9 $pid
touch killed
while [ ! -f legacy ]; do sleep 0.05; done
exec "$1" "$2" "$3" resume 1
"#;
    let h = Host::spawn_env(&p, name, UNSHARE, script, THREE_DAYS, &[]);
    wait_until(
        "the old owner to be killed",
        Duration::from_secs(20),
        || p.path("killed").exists(),
    );
    // As the older version recorded it: the host name alone.
    p.exec(&format!(
        "UPDATE backfills SET owner_host = '{name}'; UPDATE task_tries SET host = '{name}';"
    ));
    wait_stale(&p, 1, 2000);
    std::fs::write(p.path("legacy"), "").unwrap();
    // The resume's tries hold the interval locks once the old tries are gone.
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(p.path("release"), "").unwrap();
    let out = h.wait(&p, Duration::from_secs(90));
    out.code(0);
    assert_eq!(
        events(&p, "end"),
        on(name, "end"),
        "each interval ended once: the old tries were killed\n{}",
        out.stderr
    );
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn legacy_owner_resumed_on_its_own_host_kills_its_tries() {
    legacy_owner_resumed_on_its_own_host("etl-2");
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn legacy_owner_on_a_host_whose_name_has_a_hash_resumed_on_its_own_host_kills_its_tries() {
    legacy_owner_resumed_on_its_own_host("etl#2");
}

/// `cancel` from another host while the owner's whole host is frozen: asked through the
/// manifest; once the lease expired, the owner is gone and the backfill ends `cancelled`; the
/// thawed owner exits 130, finishing nothing.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_from_another_host_of_a_frozen_host() {
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    let beat = || p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let last = beat();
    wait_until("a heartbeat", Duration::from_secs(10), || beat() != last);
    a.freeze();
    let cancel = Host::start(&p, "hostb", &["cancel", "1", "--wait", "10s"])
        .wait(&p, Duration::from_secs(30));
    let after_cancel = p.rows("SELECT state, epoch FROM backfills");
    // Thawed, its tries still wait for `release`: its owner, fenced at its next heartbeat,
    // stops them. (Had they nothing left to wait for, they could finish in that heartbeat.)
    a.thaw();
    let a = a.wait(&p, Duration::from_secs(20));
    std::fs::write(p.path("release"), "").unwrap();
    cancel.code(0);
    a.code(130);
    assert_eq!(
        events(&p, "end"),
        Vec::<String>::new(),
        "the thawed host finished nothing\ncancel: {}\nhost A: {}",
        cancel.stderr,
        a.stderr
    );
    assert_eq!(
        after_cancel[0][0], "cancelled",
        "cancel ended the backfill once the lease expired\n{}",
        cancel.stderr
    );
    assert_eq!(
        p.rows("SELECT DISTINCT state FROM task_tries"),
        [["cancelled"]]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// `cancel` from another host of a host that died (lease expired): recovers it, ends it
/// `cancelled`, and a third host's `resume` runs every interval once.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_from_another_host_of_a_dead_host_then_resume_from_a_third() {
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    a.die();
    wait_stale(&p, 1, 2000);
    Host::start(&p, "hostb", &["cancel", "1"])
        .wait(&p, Duration::from_secs(30))
        .code(0);
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
    std::fs::write(p.path("release"), "").unwrap();
    Host::start(&p, "hostc", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    assert_eq!(events(&p, "end"), on("hostc", "end"));
}

/// An owner that froze alone while planning (`after-plan`) on another host: the taker
/// finishes the plan and runs every interval once; the thawed owner exits 130.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn an_owner_frozen_while_planning_is_taken_over_from_another_host() {
    let p = project();
    std::fs::write(p.path("release"), "").unwrap();
    let a = Host::start_env(
        &p,
        "hosta",
        THREE_DAYS,
        &[("BACKFILL_FAULT", "after-plan:stop")],
    );
    wait_self_frozen(&a);
    wait_stale(&p, 1, 2000);
    Host::start(&p, "hostb", &["resume", "1"])
        .wait(&p, Duration::from_secs(60))
        .code(0);
    a.thaw();
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(events(&p, "end"), on("hostb", "end"));
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        3
    );
}

/// The legacy rule against a live owner: an older version in a container sharing this
/// machine's host name (`--network host`) records the plain host name and its own pid, and
/// beats. This version takes the plain name as this host, looks the pid up in its own PID
/// namespace (none there), and takes the live owner over while its heartbeat is fresh (the bug
/// the PID-namespace identity fixed, back for every manifest row of an older version, as
/// during a rolling upgrade).
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn legacy_row_of_a_live_owner_sharing_the_host_name_is_not_taken_over_while_fresh() {
    let p = project();
    let a = Host::start_sharing_the_name(&p, "a", THREE_DAYS, free_pid());
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    let here = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // As the older version wrote it (host A still beats every 250 ms).
    p.exec(&format!(
        "UPDATE backfills SET owner_host = '{here}'; UPDATE task_tries SET host = '{here}';"
    ));
    let mut resume = p.spawn("resume", &["resume", "1"]);
    let epoch = || p.count("SELECT epoch FROM backfills WHERE id = 1");
    let mut taken = false;
    for _ in 0..100 {
        if resume.try_wait().unwrap().is_some() {
            break;
        }
        if epoch() != 0 {
            taken = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(Pid::from_raw(resume.id() as i32), Signal::SIGINT);
    let out = wait_within(&p, "resume", resume, Duration::from_secs(20));
    a.die();
    std::fs::write(p.path("release"), "").unwrap();
    assert!(
        !taken,
        "a live owner with a fresh heartbeat was taken over (epoch {})\n{}",
        epoch(),
        out.stderr
    );
    out.code(2);
}

/// A task that holds a lock per interval (a second try of an interval while one runs is written
/// to overlaps.txt) and ends 200 ms after `release` exists.
const OVERLAP_DAG: &str = r#"
schedule = "@daily"
[[tasks]]
id = "work"
command = '''
mkdir -p locks
exec 9> "locks/{{ ds }}"
if ! flock -n 9; then echo "{{ ds }}" >> overlaps.txt; exit 1; fi
echo "start {{ ds }} $(hostname)" >> events.txt
while [ ! -f release ]; do sleep 0.05; done
sleep 0.2
'''
"#;

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn two_hosts_backfilling_overlapping_ranges_at_once_run_each_interval_once() {
    let p = Project::new().dag("c", OVERLAP_DAG);
    let range = |from: &'static str, to: &'static str| {
        [
            "create",
            "--dag",
            "c",
            "--from",
            from,
            "--to",
            to,
            "--max-active-runs",
            "2",
        ]
    };
    let a = Host::start(&p, "hosta", &range("2026-01-01", "2026-01-06"));
    let b = Host::start(&p, "hostb", &range("2026-01-04", "2026-01-09"));
    // Both plan while the shared days are in flight, then the work goes on.
    wait_until("both hosts to plan", Duration::from_secs(30), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM backfills WHERE planning = FALSE") == 2
    });
    std::fs::write(p.path("release"), "").unwrap();
    a.wait(&p, Duration::from_secs(60)).code(0);
    b.wait(&p, Duration::from_secs(60)).code(0);
    assert_eq!(p.read("overlaps.txt"), "");
    // Every interval of the union ran exactly once, and succeeded.
    assert_eq!(
        p.rows(
            "SELECT interval_start, COUNT(*), SUM(CASE WHEN state = 'succeeded' THEN 1 ELSE 0 END)
             FROM runs GROUP BY interval_start ORDER BY interval_start"
        ),
        (1..=9)
            .map(|d| vec![day_unix(d).to_string(), "1".to_string(), "1".to_string()])
            .collect::<Vec<_>>()
    );
    assert_eq!(events(&p, "start").len(), 9);
    // Whichever planned second found the shared days in flight on the other host.
    let in_flight = p.rows(
        "SELECT backfill_id, interval_start FROM plan WHERE reason = 'in flight' ORDER BY interval_start",
    );
    assert_eq!(
        in_flight.iter().map(|r| r[1].clone()).collect::<Vec<_>>(),
        (4..=6).map(|d| day_unix(d).to_string()).collect::<Vec<_>>()
    );
    assert!(in_flight.iter().all(|r| r[0] == in_flight[0][0]));
}

#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn cancel_of_an_owner_frozen_on_another_host_says_its_lease_expired() {
    let p = project();
    let a = Host::start(&p, "hosta", THREE_DAYS);
    wait_until(
        "host A to run the three days",
        Duration::from_secs(20),
        || events(&p, "start").len() == 3,
    );
    a.freeze();
    wait_stale(&p, 1, 2000);
    p.run(&["cancel", "1"])
        .code(0)
        .stderr_has("backfill 1 cancelled; its process on host hosta sent no heartbeat within the lease timeout, so its leases were released here");
    a.thaw();
    a.wait(&p, Duration::from_secs(20)).code(130);
    assert_eq!(events(&p, "end"), Vec::<String>::new());
    assert_eq!(p.rows("SELECT state FROM backfills"), [["cancelled"]]);
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

/// A pool's rate holds across hosts: two hosts' backfills start at most 3 tries of pool `api`
/// in any second, counted at the manifest's clock, and between them use the rate.
#[test]
#[cfg_attr(
    missing = "namespaces",
    ignore = "no PID and UTS namespaces: `unshare --pid --fork --kill-child --mount-proc --uts` needs root"
)]
fn a_pools_rate_holds_across_two_hosts_and_is_used() {
    let p = Project::new()
        .dag("a", &crate::guard_rails::pooled("a"))
        .dag("b", &crate::guard_rails::pooled("b"));
    p.write(
        "backfill.toml",
        "lease_timeout = \"2s\"\n\n[pools]\napi = { slots = 10, rate = \"3/1s\" }\n",
    );
    let a = Host::start(&p, "hosta", &crate::guard_rails::six_days("a"));
    let b = Host::start(&p, "hostb", &crate::guard_rails::six_days("b"));
    a.wait(&p, Duration::from_secs(60)).code(0);
    b.wait(&p, Duration::from_secs(60)).code(0);
    let starts = crate::guard_rails::rate_kept(&p, "api", 3, 1000);
    assert_eq!(starts.len(), 12, "{starts:?}");
    let span = starts[11] - starts[0];
    assert!((3000..8000).contains(&span), "{span} ms: {starts:?}");
    assert_eq!(
        p.rows(&format!(
            "SELECT {} AS h, COUNT(*) FROM task_tries GROUP BY h ORDER BY h",
            p.before("host", '#')
        )),
        [["hosta", "6"], ["hostb", "6"]]
    );
}
