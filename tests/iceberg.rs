//! The lake-table example (`examples/iceberg`) end to end: a copy of the example in a temporary
//! folder, the real binary, and pyiceberg in a virtual environment.
//!
//! The Python comes from `BACKFILL_PYTHON` (a `python` whose environment has the example's
//! `requirements.txt` installed; `.ci/run` sets it), else from `target/iceberg-venv`. It is
//! looked for when the tests run, since the build cannot watch a folder of `target/` that may
//! not exist yet, so this binary has a harness of its own (libtest-mimic, `harness = false`)
//! that can ignore a test as it runs: without that Python, the tests that need it are counted
//! as ignored, with why, except under CI (`CI=true`) or with `--include-ignored`, where they
//! fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Trial};
use serde_json::Value;

/// The instant the binary believes it is: every interval of January 2026 is complete.
const NOW: &str = "2026-11-29T12:00:00Z";

fn main() {
    let args = Arguments::from_args();
    // Without the Python, a test that needs it is ignored, unless it must run: under CI, or
    // with --include-ignored.
    let may_ignore = !(args.include_ignored || ci());
    let with_python = |name: &str, test: fn(&Path)| {
        Trial::ignorable_test(name, move || match python() {
            Ok(python) => {
                test(python);
                Ok(Completion::Completed)
            }
            Err(why) if may_ignore => Ok(Completion::ignored_with(why)),
            Err(why) => Err(why.as_str().into()),
        })
    };
    let tests = vec![
        with_python(
            "seven_days_are_published_to_main_with_no_branch_left",
            seven_days_are_published_to_main_with_no_branch_left,
        ),
        with_python(
            "a_double_run_four_at_once_retries_its_commit_conflicts_and_keeps_the_rows",
            a_double_run_four_at_once_retries_its_commit_conflicts_and_keeps_the_rows,
        ),
        with_python(
            "a_rerun_after_a_day_of_raw_events_vanished_is_rejected_and_main_stays",
            a_rerun_after_a_day_of_raw_events_vanished_is_rejected_and_main_stays,
        ),
        with_python(
            "stage_keeps_main_then_promote_moves_it_and_discard_drops_the_branches",
            stage_keeps_main_then_promote_moves_it_and_discard_drops_the_branches,
        ),
        with_python(
            "kill_9_before_the_publish_commits_leaves_the_old_main_and_resume_finishes",
            |python| kill_during_publish(python, "before-commit"),
        ),
        with_python(
            "kill_9_after_the_publish_commits_leaves_the_new_main_and_resume_finishes",
            |python| kill_during_publish(python, "after-commit"),
        ),
        Trial::test(
            "cleanup_runs_for_rejected_and_discarded_outputs_and_staged_tries_know_it",
            || {
                cleanup_runs_for_rejected_and_discarded_outputs_and_staged_tries_know_it();
                Ok(())
            },
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The Python of the example's virtual environment, or what is missing and how to make it;
/// looked for once.
fn python() -> &'static Result<PathBuf, String> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let candidate = match std::env::var_os("BACKFILL_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/iceberg-venv/bin/python"),
        };
        let import = Command::new(&candidate)
            .args(["-c", "import pyiceberg.catalog.sql, pyarrow"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let why = match import {
            Ok(out) if out.status.success() => return Ok(candidate),
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let last = stderr.lines().last().unwrap_or("").trim().to_string();
                format!("{} cannot import pyiceberg and pyarrow ({last})", candidate.display())
            }
            Err(_) => format!("no Python at {}", candidate.display()),
        };
        Err(format!(
            "{why}: make the example's environment with `python3 -m venv target/iceberg-venv && target/iceberg-venv/bin/pip install -r examples/iceberg/requirements.txt`, or set BACKFILL_PYTHON to the python of one"
        ))
    })
}

/// A copy of `examples/iceberg` (without any catalog, lake or manifest of a local run).
struct Lake {
    dir: tempfile::TempDir,
    path_env: String,
}

impl Lake {
    fn new(python: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/iceberg");
        copy_tree(&example, dir.path());
        // The DAG runs `python3`: the virtual environment's comes first.
        let bin = python.parent().expect("python's folder");
        let path_env = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Self { dir, path_env }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_backfill"));
        cmd.arg("-C")
            .arg(self.path())
            .args(args)
            .env("BACKFILL_NOW", NOW)
            .env("PATH", &self.path_env)
            .env_remove("BACKFILL_FAULT")
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `backfill -C LAKE ARGS` to its end.
    fn backfill(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let out = self.command(args, env).output().expect("run backfill");
        Run::from(out)
    }

    /// Starts `backfill -C LAKE ARGS` in the background.
    fn spawn(&self, args: &[&str], env: &[(&str, &str)]) -> Child {
        self.command(args, env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn backfill")
    }

    /// Runs one of the example's scripts with the virtual environment's Python.
    fn script(&self, args: &[&str]) -> String {
        let out = Command::new("python3")
            .args(args)
            .current_dir(self.path())
            .env("PATH", &self.path_env)
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "python3 {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the lake holds: the refs of analytics.events_clean and, per day, the raw events,
    /// the rows on `main` and its distinct ids.
    fn inspect(&self, from: &str, to: &str) -> State {
        let text = self.script(&["scripts/inspect_lake.py", "--from", from, "--to", to]);
        let v: Value = serde_json::from_str(&text).expect("inspect_lake.py prints JSON");
        let refs = v["refs"]
            .as_object()
            .expect("refs")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i64().expect("snapshot id")))
            .collect();
        let days = v["days"]
            .as_object()
            .expect("days")
            .iter()
            .map(|(k, d)| {
                let n = |key: &str| d[key].as_i64().expect("a count");
                (
                    k.clone(),
                    Day {
                        raw: n("raw"),
                        main: n("main"),
                        distinct: n("main_distinct_ids"),
                        same_ids: d["same_ids"].as_bool().expect("same_ids"),
                    },
                )
            })
            .collect();
        State {
            refs,
            main: v["main"].as_i64().expect("main"),
            days,
        }
    }

    /// Every line of the tries' logs that contains `needle`.
    fn log_lines(&self, needle: &str) -> Vec<String> {
        let dir = self.path().join(".backfill/logs/events_clean/clean");
        let mut lines = Vec::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            lines.extend(
                text.lines()
                    .filter(|l| l.contains(needle))
                    .map(str::to_string),
            );
        }
        lines
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read the example").flatten() {
        let name = entry.file_name();
        let skip = ["catalog.db", "lake", ".backfill", "__pycache__"];
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().expect("file type").is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

struct Run {
    code: i32,
    text: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Self {
            code: out.status.code().unwrap_or(-1),
            text: format!(
                "--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}

impl Run {
    #[track_caller]
    fn code(&self, expected: i32) -> &Self {
        assert_eq!(self.code, expected, "exit code\n{}", self.text);
        self
    }

    #[track_caller]
    fn has(&self, needle: &str) -> &Self {
        assert!(
            self.text.contains(needle),
            "lacks {needle:?}:\n{}",
            self.text
        );
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Day {
    raw: i64,
    main: i64,
    distinct: i64,
    same_ids: bool,
}

#[derive(Debug, Clone)]
struct State {
    refs: BTreeMap<String, i64>,
    main: i64,
    days: BTreeMap<String, Day>,
}

impl State {
    /// `main` holds exactly the raw events of each day, no id twice, and no branch is left.
    #[track_caller]
    fn published_exactly(&self) {
        for (day, d) in &self.days {
            assert!(
                d.raw > 1000 && d.main == d.raw && d.distinct == d.main && d.same_ids,
                "{day}: {d:?}"
            );
        }
        self.only_main();
    }

    #[track_caller]
    fn only_main(&self) {
        let names: Vec<&str> = self.refs.keys().map(String::as_str).collect();
        assert_eq!(names, ["main"], "refs left: {:?}", self.refs);
    }

    fn branches(&self, prefix: &str) -> Vec<String> {
        self.refs
            .keys()
            .filter(|r| r.starts_with(prefix))
            .cloned()
            .collect()
    }
}

/// The one command block of the lake chapter (`docs/lake.md`) that contains `needle`.
fn block_with(needle: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/lake.md"))
        .expect("the lake chapter");
    let found: Vec<&str> = text
        .split("```sh\n")
        .skip(1)
        .map(|b| &b[..b.find("```").expect("a closed block")])
        .filter(|b| b.contains(needle))
        .collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    found[0].to_string()
}

/// The lake chapter's first block as pasted, from a folder whose `examples/iceberg` is a copy
/// of the example. Its first two lines make the virtual environment that `.ci/run` makes in
/// `target/iceberg-venv` (or that BACKFILL_PYTHON names): the rest runs with that
/// environment's `bin` first on the PATH, as `activate` puts it, and `backfill` on the PATH.
fn seven_days_are_published_to_main_with_no_branch_left(python: &Path) {
    let lake = Lake::new(python);
    let block = block_with("backfill -C examples/iceberg create");
    let (setup, rest) = block.split_at(block.find("backfill ").expect("the backfill line"));
    assert_eq!(
        setup,
        "python3 -m venv .venv && . .venv/bin/activate\npip install -r examples/iceberg/requirements.txt\n"
    );
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(root.path().join("examples")).unwrap();
    std::os::unix::fs::symlink(lake.path(), root.path().join("examples/iceberg")).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_backfill")).parent().unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -eo pipefail\n{rest}"))
        .current_dir(root.path())
        .env("PATH", format!("{}:{}", lake.path_env, bin.display()))
        .env("BACKFILL_NOW", NOW)
        .env_remove("BACKFILL_MANIFEST")
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    Run::from(out).code(0).has("7 succeeded");
    let state = lake.inspect("2026-01-01", "2026-01-07");
    assert_eq!(state.days.len(), 7);
    state.published_exactly();
}

fn a_double_run_four_at_once_retries_its_commit_conflicts_and_keeps_the_rows(python: &Path) {
    let lake = Lake::new(python);
    let range = ["--from", "2026-01-01", "--to", "2026-01-04"];
    let mut states = Vec::new();
    for (i, extra) in [&[][..], &["--reprocess-behavior", "completed"][..]]
        .iter()
        .enumerate()
    {
        let conflicts_before = lake.log_lines("commit conflict").len();
        // The four publishes read `main` before any of them commits: the catalog takes one
        // commit and refuses the three others, which must reload and retry.
        let barrier = format!("{}/barrier{i}:4", lake.path().display());
        let mut args = vec!["create", "--dag", "events_clean", "--max-active-runs", "4"];
        args.extend(range);
        args.extend(extra.iter());
        lake.backfill(&args, &[("LAKE_TEST_PUBLISH_BARRIER", &barrier)])
            .code(0)
            .has("4 succeeded");
        let conflicts = lake.log_lines("commit conflict").len() - conflicts_before;
        assert!(
            conflicts >= 3,
            "run {}: {conflicts} commit conflicts retried, expected at least 3",
            i + 1
        );
        let state = lake.inspect("2026-01-01", "2026-01-04");
        state.published_exactly();
        states.push(state);
    }
    assert_eq!(states[0].days, states[1].days);
    assert_ne!(
        states[0].main, states[1].main,
        "the second run published anew"
    );
}

fn a_rerun_after_a_day_of_raw_events_vanished_is_rejected_and_main_stays(python: &Path) {
    let lake = Lake::new(python);
    lake.backfill(
        &[
            "create",
            "--dag",
            "events_clean",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-02",
        ],
        &[],
    )
    .code(0);
    let before = lake.inspect("2026-01-02", "2026-01-02");
    before.published_exactly();
    lake.script(&["scripts/vanish.py", "2026-01-02"]);
    lake.backfill(
        &[
            "create",
            "--dag",
            "events_clean",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-02",
            "--reprocess-behavior",
            "completed",
        ],
        &[],
    )
    .code(3)
    .has("rejected")
    .has("zero rows");
    let after = lake.inspect("2026-01-02", "2026-01-02");
    assert_eq!(after.main, before.main, "main moved");
    after.only_main();
    let day = &after.days["2026-01-02"];
    assert_eq!(day.raw, 0);
    assert_eq!(day.main, before.days["2026-01-02"].main);
    assert_eq!(
        lake.log_lines("rejected: removed audit-20260102-run").len(),
        1
    );
}

fn stage_keeps_main_then_promote_moves_it_and_discard_drops_the_branches(python: &Path) {
    let lake = Lake::new(python);
    let published = lake.inspect("2026-01-01", "2026-01-03");
    lake.backfill(
        &[
            "create",
            "--dag",
            "events_clean",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-03",
            "--stage",
        ],
        &[],
    )
    .code(0);
    let staged = lake.inspect("2026-01-01", "2026-01-03");
    assert_eq!(staged.main, published.main, "--stage moved main");
    assert_eq!(staged.days, published.days);
    assert_eq!(staged.branches("staged-").len(), 2, "{:?}", staged.refs);
    assert_eq!(staged.refs.len(), 3, "{:?}", staged.refs);

    lake.backfill(&["diff", "1"], &[]).code(0).has("2026-01-02");
    lake.backfill(&["promote", "1", "--interval", "2026-01-02"], &[])
        .code(0);
    let promoted = lake.inspect("2026-01-01", "2026-01-03");
    assert_ne!(promoted.main, published.main, "promote did not move main");
    let day2 = &promoted.days["2026-01-02"];
    assert!(day2.main == day2.raw && day2.same_ids, "{day2:?}");
    assert_eq!(promoted.days["2026-01-03"].main, 0);
    assert_eq!(
        promoted.branches("staged-"),
        staged
            .branches("staged-20260103")
            .into_iter()
            .collect::<Vec<_>>()
    );

    lake.backfill(&["discard", "1"], &[])
        .code(0)
        .has("discarded 1 staged output");
    let discarded = lake.inspect("2026-01-01", "2026-01-03");
    discarded.only_main();
    assert_eq!(discarded.main, promoted.main);
    assert_eq!(discarded.days, promoted.days);
}

/// Kills `backfill` and its publish with SIGKILL where the publish of 2026-01-02 paused
/// (`before-commit` or `after-commit`); `main` must be the snapshot it was, and `resume`
/// must finish the backfill with no branch left.
fn kill_during_publish(python: &Path, point: &str) {
    let lake = Lake::new(python);
    let marker = lake.path().join("paused");
    let pause = format!("2026-01-02:{point}:{}", marker.display());
    let mut owner = lake.spawn(
        &[
            "create",
            "--dag",
            "events_clean",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-02",
        ],
        &[("LAKE_TEST_PAUSE", &pause)],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        assert!(
            owner.try_wait().expect("wait").is_none(),
            "backfill ended before the publish paused"
        );
        assert!(Instant::now() < deadline, "the publish never paused");
        std::thread::sleep(Duration::from_millis(50));
    }
    let at_pause = lake.inspect("2026-01-02", "2026-01-02");
    let publish_pid: i32 = std::fs::read_to_string(&marker)
        .expect("marker")
        .trim()
        .parse()
        .expect("a pid");
    owner.kill().expect("kill -9 backfill");
    let _ = owner.wait();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(publish_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the publish");

    let killed = lake.inspect("2026-01-02", "2026-01-02");
    assert_eq!(killed.main, at_pause.main, "main changed after the kill");
    let day2 = &killed.days["2026-01-02"];
    match point {
        // The old snapshot: the day is not on main, its audit branch is left.
        "before-commit" => {
            assert_eq!(day2.main, 0, "{day2:?}");
            assert_eq!(killed.branches("audit-20260102-run").len(), 1);
        }
        // The new one: main moved to the audited snapshot and the branch went with the commit.
        _ => {
            assert!(day2.main == day2.raw && day2.same_ids, "{day2:?}");
            killed.only_main();
        }
    }
    lake.backfill(&["resume", "1"], &[])
        .code(0)
        .has("1 succeeded");
    lake.inspect("2026-01-02", "2026-01-02").published_exactly();
}

/// What the lake relies on in `backfill` itself, checked without Python: `cleanup` runs with
/// `BACKFILL_CLEANUP` after a rejected try and for a discarded staged output, and a staged try
/// sees `BACKFILL_STAGE`.
fn cleanup_runs_for_rejected_and_discarded_outputs_and_staged_tries_know_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("dags")).unwrap();
    std::fs::write(dir.path().join("backfill.toml"), "").unwrap();
    std::fs::write(
        dir.path().join("dags/hooks.toml"),
        r#"schedule = "@daily"

[[tasks]]
id = "out"
command = 'echo "{{ ds }} stage=${BACKFILL_STAGE:-}" >> written; printf "{\"rows\": %s}" "$(cat rows)" > "$BACKFILL_RESULT"'
publish = 'echo "{{ ds }} run {{ run_id }}" >> published'
cleanup = 'echo "{{ ds }} run {{ run_id }} $BACKFILL_CLEANUP" >> cleaned'

[tasks.gate]
source_count = "echo 5"
"#,
    )
    .unwrap();
    let run = |args: &[&str]| {
        Run::from(
            Command::new(env!("CARGO_BIN_EXE_backfill"))
                .arg("-C")
                .arg(dir.path())
                .args(args)
                .env("BACKFILL_NOW", NOW)
                .output()
                .expect("run backfill"),
        )
    };
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let create = |from: &str, extra: &[&str]| {
        let mut args = vec!["create", "--dag", "hooks", "--from", from, "--to", from];
        args.extend(extra);
        run(&args)
    };

    std::fs::write(dir.path().join("rows"), "5").unwrap();
    create("2026-01-01", &[]).code(0);
    assert_eq!(read("published"), "2026-01-01 run 1\n");
    assert_eq!(read("cleaned"), "", "a published try is not cleaned up");

    // The gate rejects 4 rows against a source of 5: cleanup, and no publish.
    std::fs::write(dir.path().join("rows"), "4").unwrap();
    create("2026-01-02", &[]).code(3).has("rejected");
    assert_eq!(read("cleaned"), "2026-01-02 run 2 rejected\n");
    assert_eq!(read("published"), "2026-01-01 run 1\n");

    std::fs::write(dir.path().join("rows"), "5").unwrap();
    create("2026-01-03", &["--stage"]).code(0);
    assert!(
        read("written").ends_with("2026-01-03 stage=1\n"),
        "{}",
        read("written")
    );
    run(&["discard", "3"])
        .code(0)
        .has("discarded 1 staged output");
    assert_eq!(
        read("cleaned"),
        "2026-01-02 run 2 rejected\n2026-01-03 run 3 discarded\n"
    );
    assert!(read("written").starts_with("2026-01-01 stage=\n"));
}
