//! What the machine may refuse a run: file descriptors and memory. The limits are set on the
//! binary as `prlimit` sets them (`setrlimit` in the child, before it `exec`s): a limit on open
//! files too low for the run is refused before anything is written, a soft one is raised for
//! the run, and an open that still hits the limit names it; and a process that runs out of
//! address space ends within seconds, whatever it was doing, and `resume` finishes its
//! backfill.

use std::os::unix::process::CommandExt;
use std::process::Child;
use std::time::Duration;

use nix::sys::resource::{Resource, setrlimit};

use crate::support::{Out, Project, THREE_DAYS, wait_within};

/// Longest a limited run may take: each ends in well under a second, or hangs for ever.
const BOUND: Duration = Duration::from_secs(30);

/// Starts the binary as [`Project::spawn_with`] does, with `limit` (soft, hard) on `resource`.
fn spawn_limited(
    p: &Project,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    (resource, soft, hard): (Resource, u64, u64),
) -> Child {
    let mut c = p.command(args);
    c.envs(env.iter().copied())
        .stdout(std::fs::File::create(p.path(&format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(p.path(&format!("{name}.err"))).unwrap());
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || setrlimit(resource, soft, hard).map_err(std::io::Error::from));
    }
    c.spawn().expect("spawn backfill")
}

/// Runs the binary to its end under `limit`; fails the test when it has not ended in [`BOUND`].
fn run_limited(
    p: &Project,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: (Resource, u64, u64),
) -> Out {
    let child = spawn_limited(p, name, args, env, limit);
    wait_within(p, name, child, BOUND)
}

/// Open files: soft and hard limit `n`, as `prlimit --nofile=N`.
fn files(n: u64) -> (Resource, u64, u64) {
    (Resource::RLIMIT_NOFILE, n, n)
}

/// A project whose DAG `c` writes the open-files limit its task sees (`ulimit -n`), and whose
/// SQL DAG `s` computes into warehouse `w`, created from `init.sql` on first use.
fn project() -> Project {
    let p = Project::new().dag(
        "c",
        r#"schedule = "@daily"
[[tasks]]
id = "t"
command = "mkdir -p seen && ulimit -n > seen/{{ ds }}"
"#,
    );
    p.write(
        "backfill.toml",
        "lease_timeout = \"30s\"\n[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write(
        "init.sql",
        "CREATE TABLE events (day TEXT NOT NULL, n INTEGER NOT NULL);
         INSERT INTO events VALUES ('2026-01-01', 1), ('2026-01-02', 2), ('2026-01-03', 3);
         CREATE TABLE daily (day TEXT NOT NULL, n INTEGER NOT NULL);",
    );
    p.dag(
        "s",
        r#"schedule = "@daily"
[[tasks]]
id = "sum"
warehouse = "w"
target = "daily"
partition_column = "day"
sql = """
SELECT day, SUM(n) AS n FROM events
WHERE day >= date(:data_interval_start) AND day < date(:data_interval_end) GROUP BY day
"""
"#,
    )
}

#[test]
fn an_open_files_limit_too_low_for_the_run_is_refused_before_anything_is_written() {
    let p = project();
    let mut four = THREE_DAYS.to_vec();
    four.extend(["--max-active-runs", "4"]);
    let refused = run_limited(&p, "low", &four, &[], files(10));
    refused
        .code(2)
        .stderr_has("the open-files limit of this process is 10 (`ulimit -n`), and a run of 4 intervals at a time needs at least 48: raise it, e.g. `ulimit -n 1024`")
        .stderr_has("nothing was written");
    assert!(!refused.stderr.contains("panicked"), "{}", refused.stderr);
    assert!(!p.has_manifest(), "no manifest was written");
    // Nor the warehouse a SQL DAG would have created from its init files.
    let sql = [
        "create",
        "--dag",
        "s",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
    ];
    run_limited(&p, "low-sql", &sql, &[], files(10)).code(2);
    assert!(!p.path("w.db").exists(), "no warehouse was created");
    assert!(!p.has_manifest());

    // With a manifest and a backfill in it: no new backfill, and none left running.
    p.run(THREE_DAYS).code(0);
    let again = run_limited(
        &p,
        "again",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-04",
            "--to",
            "2026-01-05",
        ],
        &[],
        files(10),
    );
    again
        .code(2)
        .stderr_has("the open-files limit of this process is 10");
    assert_eq!(
        p.rows("SELECT id, state FROM backfills"),
        [["1", "completed"]]
    );
    // A limit that leaves room for fewer intervals at a time says how many fit.
    run_limited(&p, "some", &four, &[], files(30))
        .code(2)
        .stderr_has("or run fewer at a time (--max-active-runs 1 fits)");
    // A descriptor limit too low even to start the async runtime is refused as well.
    run_limited(&p, "lowest", THREE_DAYS, &[], files(4))
        .code(2)
        .stderr_has("cannot start the async runtime: Too many open files (os error 24) (this process reached its open-files limit of 4 (`ulimit -n`)");
    assert_eq!(p.count("SELECT COUNT(*) FROM backfills"), 1);
}

#[test]
fn a_soft_open_files_limit_below_the_hard_one_is_raised_for_the_run_and_kept_for_its_tasks() {
    let p = project();
    let mut four = THREE_DAYS.to_vec();
    four.extend(["--max-active-runs", "4"]);
    let out = run_limited(
        &p,
        "raised",
        &four,
        &[],
        (Resource::RLIMIT_NOFILE, 16, 4096),
    );
    out.code(0);
    // Each task sees the limit the process was started with, not the one it raised itself to.
    for day in ["2026-01-01", "2026-01-02", "2026-01-03"] {
        assert_eq!(p.read(&format!("seen/{day}")).trim(), "16", "{day}");
    }
}

#[test]
fn an_open_that_fails_at_the_open_files_limit_names_the_limit() {
    let p = project();
    // Startup passes (a run of one interval at a time needs 30); then every descriptor left
    // is taken, as by a leak: the opens that follow fail.
    let sql = [
        "create",
        "--dag",
        "s",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ];
    let out = run_limited(
        &p,
        "sql",
        &sql,
        &[("BACKFILL_FAULT", "after-audit:files")],
        files(64),
    );
    // SQLite's "unable to open database" (the audit file, attached for the publish), named.
    // The audit file, attached for the publish: an environment fault that stops the run.
    out.code(1)
        .stderr_has("this process has no file descriptors left (its limit is 64)")
        .stderr_has("raise the limit (`ulimit -n`");
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let two = [
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    let out = run_limited(
        &p,
        "command",
        &two,
        &[("BACKFILL_FAULT", "after-spawn:files")],
        files(64),
    );
    // The next try's pipes: the run stops, naming the limit.
    out.code(1)
        .stderr_has(
            "cannot start `sh`: this process has no file descriptors left (its limit is 64)",
        )
        .stderr_has("raise the limit (`ulimit -n`");
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

/// Address space: `mib` MiB, soft and hard, as `prlimit --as=BYTES`.
fn address_space(mib: u64) -> (Resource, u64, u64) {
    (Resource::RLIMIT_AS, mib << 20, mib << 20)
}

/// The least address space (MiB) in which the binary starts at all (`--version`): its code,
/// its libraries and its first allocations.
fn least_to_start(p: &Project) -> u64 {
    let (mut low, mut high) = (1, 4096);
    while low < high {
        let mid = (low + high) / 2;
        let out = run_limited(p, "version", &["--version"], &[], address_space(mid));
        if out.code == 0 {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

#[test]
fn a_process_out_of_address_space_ends_at_once_and_resume_finishes_its_backfill() {
    let dag = r#"schedule = "@daily"
[[tasks]]
id = "t"
command = "true"
"#;
    let least = least_to_start(&Project::new());
    // From the least that starts, where the threads and the first connections are refused one
    // after another (1 MiB apart), to where a run mostly completes (8 MiB apart).
    let sizes = (least..least + 24).chain((least + 24..=least + 160).step_by(8));
    let four = [
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
        "--max-active-runs",
        "4",
    ];
    let mut ended = Vec::new();
    for mib in sizes {
        let p = Project::new().dag("c", dag);
        let out = run_limited(&p, "limited", &four, &[], address_space(mib));
        // A panic goes through the hook (an internal error, then abort), never on unwinding.
        assert!(
            !out.stderr.contains("panicked"),
            "{mib} MiB: a panic unwound\n{}",
            out.stderr
        );
        ended.push(format!("{mib}:{}", out.code));
        if !p.has_manifest() || p.count("SELECT COUNT(*) FROM backfills") == 0 {
            // Ended before the backfill was written: nothing to take up.
            assert_ne!(out.code, 0, "{mib} MiB\n{}", out.stderr);
            continue;
        }
        if out.code != 0 {
            p.run(&["resume", "1"]).code(0);
        }
        assert_eq!(
            p.rows(
                "SELECT date(interval_start), COUNT(*) FROM report_runs WHERE state = 'succeeded'
                 GROUP BY interval_start ORDER BY interval_start"
            ),
            [
                ["2026-01-01", "1"],
                ["2026-01-02", "1"],
                ["2026-01-03", "1"],
                ["2026-01-04", "1"],
            ],
            "{mib} MiB: each interval succeeded once\n{}",
            out.stderr
        );
        assert_eq!(
            p.rows("SELECT state FROM backfills"),
            [["completed"]],
            "{mib} MiB"
        );
        assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0, "{mib} MiB");
    }
    eprintln!(
        "sizes (MiB) and exit codes (-1: a signal): {}",
        ended.join(" ")
    );
}
