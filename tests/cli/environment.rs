//! When the machine fails, not the task: a full disk (the warehouse's, the audit folder's, the
//! log folder's), a folder this user may not write, too few file descriptors. The backfill stops
//! (exit 1, the cause and the fix), the intervals in flight are recorded `cancelled` as after
//! Ctrl-C, none `failed`, and `resume` finishes them once the cause is gone. The full disks are
//! small tmpfs file systems (root), filled by the test.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::gate::shop;
use crate::support::{Out, Project};

/// A tmpfs of `size` mounted at a folder for as long as it lives: unmounted when dropped, also
/// when the test panics (so declare it after the project, which removes the folder).
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        crate::parts::Part::Tmpfs.require();
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs at {}", dir.display());
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The filler that takes this file system's space.
    fn filler(&self) -> PathBuf {
        self.dir.join(".filler")
    }

    /// Takes every byte of the file system but `leave` (a multiple of its 4 KiB pages).
    fn fill(&self, leave: u64) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.filler()).unwrap();
        let page = vec![0u8; 4096];
        while f.write_all(&page).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
    }

    /// Gives the space back.
    fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a process of the test that has not ended): detached now, gone with it.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// The daily_orders partitions of September as published, and as computed straight from the
/// raw orders.
fn september(warehouse: &Path) -> (Vec<String>, Vec<String>) {
    let c = rusqlite::Connection::open(warehouse).unwrap();
    let rows = |sql: &str| -> Vec<String> {
        let mut stmt = c.prepare(sql).unwrap();
        stmt.query_map([], |r| {
            Ok(format!(
                "{}|{}|{}|{}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    (
        rows(
            "SELECT day, region, orders, revenue_cents FROM daily_orders
             WHERE day BETWEEN '2026-09-01' AND '2026-09-30' ORDER BY 1, 2",
        ),
        rows(
            "SELECT date(order_ts), region, COUNT(*), SUM(amount_cents) FROM raw_orders
             WHERE order_ts >= '2026-09-01' AND order_ts < '2026-10-01' GROUP BY 1, 2 ORDER BY 1, 2",
        ),
    )
}

/// `create` of daily_orders over September, four intervals at a time, with a JSON summary.
const SEPTEMBER: &[&str] = &[
    "--output",
    "json",
    "create",
    "--dag",
    "daily_orders",
    "--from",
    "2026-09-01",
    "--to",
    "2026-09-30",
    "--max-active-runs",
    "4",
];

/// What a backfill stopped by an environment fault left in the manifest: the runs that did not
/// succeed are all `cancelled`, each with an error that `cause` accepts, and so are their tries;
/// none failed. Returns how many intervals succeeded.
#[track_caller]
fn interrupted_only(p: &Project, task: &str, cause: &dyn Fn(&str) -> bool) -> usize {
    let runs = p.rows("SELECT state, error FROM runs WHERE state <> 'succeeded' ORDER BY id");
    assert!(!runs.is_empty(), "no run was interrupted");
    for run in &runs {
        let error = run[1]
            .strip_prefix(&format!("interrupted during task `{task}`: "))
            .unwrap_or_else(|| panic!("run {run:?}"));
        assert!(run[0] == "cancelled" && cause(error), "run {run:?}");
    }
    let tries =
        p.rows("SELECT state, error FROM task_tries WHERE state <> 'succeeded' ORDER BY id");
    for t in &tries {
        let error = t[1]
            .strip_prefix("interrupted: ")
            .unwrap_or_else(|| panic!("try {t:?}"));
        assert!(t[0] == "cancelled" && cause(error), "try {t:?}");
    }
    assert_eq!(runs.len(), tries.len(), "{runs:?}\n{tries:?}");
    let succeeded = p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'");
    usize::try_from(succeeded).unwrap()
}

/// The summary of a backfill stopped by `cause`: exit 1, the cause and the fix on its last line
/// and in `stopped_by`.
#[track_caller]
fn stopped_by(p: &Project, out: &Out, cause: &str, fix: &str) {
    out.code(1);
    let doc = out.json();
    assert_eq!(doc["state"], "cancelled", "{}", out.stdout);
    assert_eq!(doc["exit_code"], 1);
    assert_eq!(doc["intervals"]["failed"], 0, "{}", out.stdout);
    assert_eq!(doc["stopped_by"]["cause"], cause, "{}", out.stdout);
    assert_eq!(doc["stopped_by"]["fix"], fix, "{}", out.stdout);
    let last = out.stderr.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(&format!(
            "; stopped: {cause}; {fix}, then `{}`",
            p.hint("resume 1")
        )),
        "{}",
        out.stderr
    );
}

#[test]
#[cfg_attr(
    missing = "tmpfs",
    ignore = "`mount -t tmpfs` fails here: it needs root (and util-linux's mount)"
)]
fn a_full_warehouse_disk_stops_the_backfill_and_resume_finishes_it_once_there_is_space() {
    let p = shop();
    // The warehouse in a folder of its own, on a file system with a little room to spare.
    let disk = Tmpfs::mount(&p.path("wh"), "64m");
    std::fs::copy(p.path("warehouse.db"), p.path("wh/warehouse.db")).unwrap();
    std::fs::remove_file(p.path("warehouse.db")).unwrap();
    let toml = p.read("backfill.toml");
    p.write(
        "backfill.toml",
        &toml.replace("path = \"warehouse.db\"", "path = \"wh/warehouse.db\""),
    );
    let warehouse = p.path("wh/warehouse.db");
    // Room for the warehouse's shared memory (32 KiB) and its first pages of log, not for a
    // month of publishes.
    disk.fill(48 * 1024);
    let out = p.run(SEPTEMBER);
    let dir = p.path("wh");
    let cause = format!(
        "warehouse `shop` ({}): the disk of {} is full",
        warehouse.display(),
        dir.display()
    );
    stopped_by(&p, &out, &cause, "free space on it");
    assert!(!out.stderr.contains("publish failed"), "{}", out.stderr);
    let succeeded = interrupted_only(&p, "aggregate", &|e| e == cause);
    assert!(succeeded < 30, "{succeeded}");
    // Nothing was published half: every published day holds what the manifest says.
    let published = p.count("SELECT COUNT(*) FROM published WHERE dag_id = 'daily_orders'");
    assert_eq!(usize::try_from(published).unwrap(), succeeded);
    disk.free();
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("30 succeeded, 0 failed");
    let (published, expected) = september(&warehouse);
    assert_eq!(published.len(), 150);
    assert_eq!(published, expected);
}

#[test]
#[cfg_attr(
    missing = "tmpfs",
    ignore = "`mount -t tmpfs` fails here: it needs root (and util-linux's mount)"
)]
fn a_full_audit_folder_names_the_audit_file_stops_the_backfill_and_breaks_no_connection() {
    let p = shop();
    let dir = p.path(".backfill/audit");
    let disk = Tmpfs::mount(&dir, "1m");
    // No room left in the audit folder; the warehouse's own disk has plenty.
    disk.fill(0);
    let out = p.run(SEPTEMBER);
    let named = |e: &str| {
        e.strip_prefix(&format!("audit file {}/try-", dir.display()))
            .and_then(|rest| rest.split_once(".db: "))
            .is_some_and(|(n, rest)| {
                n.parse::<i64>().is_ok() && rest == format!("the disk of {} is full", dir.display())
            })
    };
    out.code(1);
    let cause = out.json()["stopped_by"]["cause"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(named(&cause), "{}", out.stdout);
    stopped_by(&p, &out, &cause, "free space on it");
    // The warehouse's disk had room: it is not named, and no connection was left with a file
    // it cannot read.
    for broken in [
        "warehouse `shop`",
        "database or disk is full",
        "not a database",
        "malformed",
        "already in use",
    ] {
        assert!(!out.stderr.contains(broken), "{broken}: {}", out.stderr);
    }
    assert_eq!(interrupted_only(&p, "aggregate", &named), 0);
    // `verify` stops the same way rather than call the task not deterministic.
    let verify = p.run(&[
        "verify",
        "--dag",
        "daily_orders",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-02",
    ]);
    verify.code(1).stderr_has(&format!(
        "the disk of {} is full; free space on it",
        dir.display()
    ));
    assert!(
        !verify.stderr.contains("not deterministic"),
        "{}",
        verify.stderr
    );
    disk.free();
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("30 succeeded, 0 failed");
    let (published, expected) = september(&p.path("warehouse.db"));
    assert_eq!(published, expected);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[cfg_attr(
    missing = "tmpfs",
    ignore = "`mount -t tmpfs` fails here: it needs root (and util-linux's mount)"
)]
fn a_try_publishing_after_an_audit_file_was_torn_by_a_full_disk_gets_a_clean_connection() {
    let p = shop();
    let dir = p.path(".backfill/audit");
    let disk = Tmpfs::mount(&dir, "1m");
    // Two tries audit at once, each into a file of two pages, with two pages left: the first
    // to commit takes them, the other's commit finds none and leaves its file unreadable (its
    // connection then cannot detach it). The first publishes after its intent's commit, slowed
    // to well after the other failed, on a connection of the pool.
    disk.fill(2 * 4096);
    let out = p.run_with(
        &[
            "--output",
            "json",
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-30",
            "--max-active-runs",
            "2",
        ],
        &[("BACKFILL_FAULT", "slow-commit:300ms")],
    );
    out.code(1);
    for broken in [
        "malformed",
        "not a database",
        "already in use",
        "publish failed",
    ] {
        assert!(!out.stderr.contains(broken), "{broken}: {}", out.stderr);
    }
    let audit_full = |e: &str| {
        e.starts_with(&format!("audit file {}/try-", dir.display()))
            && e.ends_with(&format!(".db: the disk of {} is full", dir.display()))
    };
    // (Both commits may, rarely, find the pages taken half way: then neither publishes.)
    assert!(interrupted_only(&p, "aggregate", &audit_full) <= 1);
    disk.free();
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("30 succeeded, 0 failed");
    let (published, expected) = september(&p.path("warehouse.db"));
    assert_eq!(published, expected);
}

/// A DAG of one command that prints a line per interval, at most four at a time.
const PRINTS: &str = r#"
schedule = "@daily"
max_active_runs = 4
[[tasks]]
id = "say"
command = "echo computing {{ ds }}"
"#;

/// `create` of DAG `c` over the first ten days of 2026, with a JSON summary.
const TEN_DAYS: &[&str] = &[
    "--output",
    "json",
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-10",
];

/// Each day's log of DAG `c` says what it computed.
#[track_caller]
fn every_log_written(p: &Project) {
    let logs = p.rows(
        "SELECT r.interval_start, t.log_path FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE t.state = 'succeeded' ORDER BY r.interval_start",
    );
    assert_eq!(logs.len(), 10, "{logs:?}");
    for (day, log) in (1..=10).zip(&logs) {
        assert_eq!(
            std::fs::read_to_string(&log[1]).unwrap_or_default(),
            format!("computing 2026-01-{day:02}\n"),
            "{log:?}"
        );
    }
}

#[test]
#[cfg_attr(
    missing = "tmpfs",
    ignore = "`mount -t tmpfs` fails here: it needs root (and util-linux's mount)"
)]
fn a_full_log_folder_stops_the_backfill_and_says_the_log_could_not_be_written() {
    let p = Project::new().dag("c", PRINTS);
    let logs = p.path(".backfill/logs");
    let disk = Tmpfs::mount(&logs, "256k");
    disk.fill(0);
    let out = p.run(TEN_DAYS);
    let folder = logs.join("c/say");
    let named = |e: &str| {
        e.strip_prefix(&format!("the log {}/", folder.display()))
            .and_then(|rest| rest.split_once(".log: "))
            .is_some_and(|(_, rest)| rest == format!("the disk of {} is full", folder.display()))
    };
    out.code(1);
    let cause = out.json()["stopped_by"]["cause"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(named(&cause), "{}", out.stdout);
    stopped_by(&p, &out, &cause, "free space on it");
    assert!(!out.stderr.contains("printed nothing"), "{}", out.stderr);
    // The command exited 0, but what it printed is lost: it runs again.
    assert_eq!(interrupted_only(&p, "say", &named), 0);
    disk.free();
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("10 succeeded, 0 failed");
    every_log_written(&p);
}

#[test]
fn an_audit_folder_this_user_may_not_write_stops_the_backfill() {
    let p = shop();
    // As root, who may write any folder, the backfill runs as `nobody`, who owns the project
    // but not its audit folder; as anyone else, the folder is made read-only.
    let as_root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p.path("backfill.toml")).unwrap().uid() == 0
    };
    let audit = p.path(".backfill/audit");
    std::fs::create_dir_all(&audit).unwrap();
    if as_root {
        for entry in walk(&p.path("")) {
            std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
        }
        std::os::unix::fs::chown(&audit, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&audit, std::fs::Permissions::from_mode(0o755)).unwrap();
    } else {
        std::fs::set_permissions(&audit, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    let run = |args: &[&str]| {
        let mut c = p.command(args);
        if as_root {
            c.uid(65534).gid(65534);
        }
        Out::of(&c.output().unwrap())
    };
    let out = run(SEPTEMBER);
    let named = |e: &str| {
        e.strip_prefix(&format!("audit file {}/try-", audit.display()))
            .and_then(|rest| rest.split_once(".db: "))
            .is_some_and(|(n, rest)| {
                n.parse::<i64>().is_ok()
                    && rest == format!("this user may not write {}", audit.display())
            })
    };
    out.code(1);
    let cause = out.json()["stopped_by"]["cause"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(named(&cause), "{}\n{}", out.stdout, out.stderr);
    stopped_by(
        &p,
        &out,
        &cause,
        "give this user write access to it, or run backfill as its owner",
    );
    assert_eq!(interrupted_only(&p, "aggregate", &named), 0);
    if as_root {
        std::os::unix::fs::chown(&audit, Some(65534), Some(65534)).unwrap();
    } else {
        std::fs::set_permissions(&audit, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    run(&["resume", "1"])
        .code(0)
        .stderr_has("30 succeeded, 0 failed");
    let (published, expected) = september(&p.path("warehouse.db"));
    assert_eq!(published, expected);
}

/// Every file and folder under `dir`, `dir` included, and the folders above it in the
/// temporary folder opened to every user (a test's folder is private to its owner).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut above = dir.to_path_buf();
    while above.pop() && above.starts_with(std::env::temp_dir()) && above != std::env::temp_dir() {
        std::fs::set_permissions(&above, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            let children: Vec<PathBuf> = std::fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            out.extend(children);
        }
        i += 1;
    }
    out
}

/// `create ARGS` with at most `limit` file descriptors open at once.
fn with_open_files(p: &Project, args: &[&str], limit: u64, fault: &str) -> Out {
    let mut c = p.command(args);
    c.env("BACKFILL_FAULT", fault);
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, limit)
                .map_err(std::io::Error::from)
        });
    }
    Out::of(&c.output().unwrap())
}

/// The summary of a backfill stopped for want of file descriptors: how many intervals
/// succeeded.
#[track_caller]
fn out_of_descriptors(p: &Project, out: &Out, limit: u64, task: &str) -> usize {
    // Met opening a file (its errno said so), or a file that opened on a second look, once
    // other tries had let theirs go.
    let named = |e: &str| {
        e.ends_with(&format!(
            ": this process has no file descriptors left (its limit is {limit})"
        )) || e.ends_with(&format!(
            ": could not be opened, though it opens now: this process likely ran out of file descriptors (its limit is {limit})"
        ))
    };
    out.code(1);
    let cause = out.json()["stopped_by"]["cause"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(named(&cause), "{}\n{}", out.stdout, out.stderr);
    stopped_by(
        p,
        out,
        &cause,
        "raise the limit (`ulimit -n`, or LimitNOFILE= for a systemd service), or lower --max-active-runs",
    );
    interrupted_only(p, task, &named)
}

#[test]
fn too_few_file_descriptors_stop_the_backfill_and_name_the_limit() {
    // Enough to start the backfill; then, as the second try is about to start (one at a time:
    // no try ends meanwhile to give descriptors back), every descriptor left is taken, as by a
    // leak: it cannot start.
    let p = Project::new().dag("c", PRINTS);
    let one_at_a_time = [TEN_DAYS, &["--max-active-runs", "1"]].concat();
    let out = with_open_files(&p, &one_at_a_time, 64, "before-spawn@2:files");
    assert!(out_of_descriptors(&p, &out, 64, "say") < 10);
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("10 succeeded, 0 failed");
    every_log_written(&p);
    // SQL tries: the warehouse, the audit files and the manifest's readers.
    let p = shop();
    let out = with_open_files(&p, SEPTEMBER, 64, "after-audit@1:files");
    assert!(out_of_descriptors(&p, &out, 64, "aggregate") < 30);
    p.run(&["resume", "1"])
        .code(0)
        .stderr_has("30 succeeded, 0 failed");
    let (published, expected) = september(&p.path("warehouse.db"));
    assert_eq!(published, expected);
}
