//! A project folder, or its manifest's file, removed while a backfill runs: the backfill stops
//! starting intervals, makes none of the project's folders again, and ends with exit 1 saying
//! what went and what its intervals came to.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::gate::shop;
use crate::support::{Out, Project, stopped, wait_until};

/// A backfill of `p` started in the background, its output in `out` (outside the project,
/// which the test removes).
fn spawn_outside(p: &Project, out: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    p.command(args)
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(out.join("stdout")).unwrap())
        .stderr(std::fs::File::create(out.join("stderr")).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn backfill")
}

/// Waits for the background run to end (killing it and failing after 60 s: a hang detector).
fn wait_outside(mut child: Child, out: &Path) -> Out {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "backfill still running after 60 s\n{}",
                std::fs::read_to_string(out.join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(out.join("stdout")).unwrap_or_default(),
        stderr: std::fs::read_to_string(out.join("stderr")).unwrap_or_default(),
    }
}

/// Whether `condition` comes true within 10 s (a run that does not bring it about fails the
/// test's assertions after, once the tasks it waits for were let go).
fn comes_true(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A DAG whose task says it started (in `out`) and waits for `out/go`.
fn waiting_dag(out: &Path) -> String {
    format!(
        "schedule = \"@daily\"\n[[tasks]]\nid = \"work\"\ncommand = '''touch {o}/started-{{{{ ds }}}}; while [ ! -f {o}/go ]; do sleep 0.05; done'''\n",
        o = out.display()
    )
}

/// What the end says of the manifest: on a SQLite manifest in the project, removed with it; on
/// a PostgreSQL one, kept, and the backfill resumable.
fn end_of(p: &Project, root: &Path) -> String {
    match p.manifest_db() {
        Some(_) => format!(
            "error: the project folder {} was removed (or moved) while this command ran. Backfill 1 stopped starting intervals",
            root.display()
        ),
        None => format!(
            "error: the project folder {root} was removed (or moved) while this command ran, and its manifest {root}/.backfill/manifest.db with it: what the manifest recorded is lost with the file. Backfill 1 stopped starting intervals",
            root = root.display()
        ),
    }
}

#[test]
fn a_project_removed_while_its_command_dag_runs_is_not_made_again_and_the_run_ends_with_exit_1() {
    let outside = tempfile::tempdir().unwrap();
    let out: PathBuf = outside.path().to_path_buf();
    let p = Project::new().dag("c", &waiting_dag(&out));
    let toml = p.path("backfill.toml");
    let root = toml.parent().unwrap();
    let child = spawn_outside(
        &p,
        &out,
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
        &[],
    );
    wait_until("the first day's task", Duration::from_secs(30), || {
        out.join("started-2026-01-01").exists()
    });
    std::fs::remove_dir_all(root).unwrap();
    // The run notices before the task ends.
    let noticed = comes_true(|| {
        std::fs::read_to_string(out.join("stderr"))
            .unwrap_or_default()
            .contains("stopping: no new intervals")
    });
    std::fs::write(out.join("go"), "").unwrap();
    let end = wait_outside(child, &out);
    assert!(noticed, "the run went on:\n{}", end.stderr);
    end.code(1)
        .stderr_has(&end_of(&p, root))
        .stderr_has("(0 of 3 succeeded, 0 failed, 1 stopped, 2 not started)");
    assert!(!root.exists(), "the project's folders are not made again");
    assert!(
        !out.join("started-2026-01-02").exists(),
        "no interval started after"
    );
    if p.manifest_db().is_some() {
        // The record is kept: the backfill was stopped and is resumable.
        assert_eq!(
            p.rows("SELECT state FROM backfills WHERE id = 1"),
            [["cancelled"]]
        );
    }
}

#[test]
fn a_project_removed_while_its_sql_dag_publishes_is_not_made_again_and_the_run_ends_with_exit_1() {
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path();
    let p = shop();
    let toml = p.path("backfill.toml");
    let root = toml.parent().unwrap();
    // The owner freezes itself before the first publish: its audit file is in the project.
    let child = spawn_outside(
        &p,
        out,
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-08-01",
            "--to",
            "2026-09-30",
            "--max-active-runs",
            "1",
        ],
        &[("BACKFILL_FAULT", "before-publish@1:stop")],
    );
    wait_until("the owner to freeze", Duration::from_secs(30), || {
        stopped(child.id())
    });
    std::fs::remove_dir_all(root).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let end = wait_outside(child, out);
    end.code(1).stderr_has(&end_of(&p, root));
    assert!(
        !root.exists(),
        "neither the logs nor the audit folder is made again"
    );
}

#[test]
fn a_manifest_file_removed_while_a_backfill_runs_ends_it_with_exit_1() {
    let outside = tempfile::tempdir().unwrap();
    let out: PathBuf = outside.path().to_path_buf();
    let p = Project::new().sqlite().dag("c", &waiting_dag(&out));
    let child = spawn_outside(
        &p,
        &out,
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
        &[],
    );
    wait_until("the first day's task", Duration::from_secs(30), || {
        out.join("started-2026-01-01").exists()
    });
    for f in ["manifest.db", "manifest.db-wal", "manifest.db-shm"] {
        let _ = std::fs::remove_file(p.path(&format!(".backfill/{f}")));
    }
    let noticed = comes_true(|| {
        std::fs::read_to_string(out.join("stderr"))
            .unwrap_or_default()
            .contains("stopping: no new intervals")
    });
    std::fs::write(out.join("go"), "").unwrap();
    let end = wait_outside(child, &out);
    assert!(noticed, "the run went on:\n{}", end.stderr);
    end.code(1).stderr_has(&format!(
        "error: the manifest {} was removed while this command ran: what it recorded is lost with the file. Backfill 1 stopped starting intervals (0 of 3 succeeded, 0 failed, 1 stopped, 2 not started); restore the manifest from a backup to keep its history",
        p.manifest_path().display()
    ));
    assert!(!p.manifest_path().exists(), "no manifest made in its place");
}
