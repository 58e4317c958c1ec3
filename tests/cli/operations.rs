//! What cron, CI and a terminal expect: data on stdout and messages on stderr, a closed pipe,
//! quiet success and loud failure, JSON errors, alerts, diagnostics, one way to write an
//! interval, tables that read well, honest states, getting started.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{Project, alive, signal, wait_until, wait_within};

/// A DAG whose 2026-01-02 fails (its task exits 1 unless `fixed` exists).
const FLAKY: &str = r#"
schedule = "@daily"
[[tasks]]
id = "load"
command = '''if [ {{ ds }} = 2026-01-02 ] && [ ! -f fixed ]; then echo "no data for {{ ds }}" >&2; exit 1; fi'''
"#;

fn three_days(dag: &str) -> Vec<&str> {
    vec![
        "create",
        "--dag",
        dag,
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
    ]
}

#[test]
fn tables_and_documents_go_to_stdout_and_progress_to_stderr() {
    let p = Project::new().dag(
        "ok",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let created = p.run(&three_days("ok"));
    created.code(0);
    assert_eq!(
        created.stdout, "",
        "create prints its progress and summary on stderr"
    );
    created
        .stderr_has("succeeded  2026-01-01")
        .stderr_has("backfill 1 of ok: completed");
    for args in [
        vec!["show", "1"],
        vec!["list"],
        vec!["runs", "--dag", "ok"],
        vec!["dags"],
        vec![
            "create",
            "--dag",
            "ok",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--dry-run",
        ],
    ] {
        let out = p.run(&args);
        out.code(0);
        assert!(
            !out.stdout.is_empty(),
            "{args:?} prints its table on stdout"
        );
        assert_eq!(out.stderr, "", "{args:?} prints nothing else");
    }
    let valid = p.run(&["dags", "validate"]);
    valid.code(0);
    assert_eq!(valid.stdout, "");
    assert_eq!(valid.stderr, "1 DAG file OK\n");
    let quiet = p.run(&["-q", "dags", "validate"]);
    assert_eq!(
        (quiet.code, quiet.stdout.as_str(), quiet.stderr.as_str()),
        (0, "", "")
    );
    let json = p.run(&["dags", "validate", "--output", "json"]);
    assert_eq!(json.json()["valid"], true);
    assert_eq!(json.stderr, "");
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let p = Project::new().dag(
        "ok",
        "schedule = \"@hourly\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "ok",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    for args in [
        vec!["show", "1"],
        vec!["runs", "--dag", "ok"],
        vec!["show", "1", "--output", "json"],
    ] {
        // The reading end is closed before the command writes: every write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = p
            .command(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "",
            "{args:?} ends quietly"
        );
    }
}

#[test]
fn quiet_success_says_nothing_and_a_failure_says_what_and_how_to_rerun() {
    let p = Project::new().dag(
        "ok",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let mut quiet = vec!["-q"];
    quiet.extend(three_days("ok"));
    let out = p.run(&quiet);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (0, "", "")
    );

    let p = Project::new().dag("flaky", FLAKY);
    let mut quiet = vec!["-q"];
    quiet.extend(three_days("flaky"));
    let out = p.run(&quiet);
    out.code(3);
    assert_eq!(out.stdout, "");
    let log = p.path(".backfill/logs/flaky/load/20260102T000000Z.run2.try1.log");
    let expected = format!(
        "failed 2026-01-02: task `load` failed: exit code 1\n  log: {}\n  | no data for 2026-01-02\n\
         backfill 1 of flaky: failed — 2 succeeded, 1 failed, 0 rejected, 0 cancelled, 0 skipped in ",
        log.display()
    );
    assert!(out.stderr.starts_with(&expected), "{}", out.stderr);
    // The hint is a complete command: run it as printed.
    let hint = out
        .stderr
        .split("rerun the failures with `")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .unwrap();
    assert_eq!(
        hint,
        format!(
            "backfill -C {} create --dag flaky --from 2026-01-02 --to 2026-01-02 --reprocess-behavior failed",
            p.path("").display().to_string().trim_end_matches('/')
        )
    );
    p.write("fixed", "");
    let words = shlex::split(hint).unwrap();
    let rerun = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
        .envs(p.manifest_env())
        .args(&words[1..])
        .env("BACKFILL_NOW", crate::support::NOW)
        .output()
        .unwrap();
    assert_eq!(
        rerun.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert_eq!(
        p.rows("SELECT backfill_id, state FROM runs ORDER BY id"),
        [
            ["1", "succeeded"],
            ["1", "failed"],
            ["1", "succeeded"],
            ["2", "succeeded"]
        ]
    );
}

#[test]
fn json_output_keeps_failures_on_stderr_and_errors_as_documents() {
    let p = Project::new().dag("flaky", FLAKY);
    let mut args = three_days("flaky");
    args.extend(["--output", "json"]);
    let out = p.run(&args);
    out.code(3);
    let doc = out.json();
    assert_eq!(doc["state"], "failed");
    assert_eq!(doc["failed"][0]["start"], "2026-01-02T00:00:00Z");
    assert_eq!(doc["failed"][0]["task"], "load");
    assert_eq!(
        doc["rerun"],
        format!(
            "backfill -C {} create --dag flaky --from 2026-01-02 --to 2026-01-02 --reprocess-behavior failed",
            p.path("").display().to_string().trim_end_matches('/')
        )
    );
    out.stderr_has("failed 2026-01-02: task `load` failed: exit code 1");

    let missing = p.run(&["show", "99", "--output", "json"]);
    missing.code(2);
    let doc = missing.json();
    assert_eq!(doc["exit_code"], 2);
    assert_eq!(doc["error"]["kind"], "usage");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("no backfill 99 in the manifest"),
        "{doc}"
    );
    let bad = p.run(&["create", "--dag", "flaky", "--output", "json"]);
    bad.code(2);
    assert_eq!(bad.json()["error"]["kind"], "usage");
    // Broken DAG files: the usable DAGs and the error document, for `dags` and `dags validate`.
    p.write("dags/broken.toml", "schedule = \"@daily\"\nretires = 1\n");
    for args in [&["dags"][..], &["dags", "validate"][..]] {
        let out = p.run(&[&["--output", "json"][..], args].concat());
        out.code(2);
        let doc = out.json();
        assert_eq!(doc["exit_code"], 2, "{doc}");
        assert_eq!(doc["error"]["kind"], "configuration", "{doc}");
    }
    let listed = p.run(&["--output", "json", "dags"]).json();
    assert_eq!(listed["dags"][0]["id"], "flaky");
    std::fs::remove_file(p.path("dags/flaky.toml")).unwrap();
    p.run(&["dags"]).code(2).stderr_has(&format!(
        "no usable DAGs: 2 errors in DAG files ({} lists them)",
        p.hint("dags validate")
    ));
}

#[test]
fn a_try_that_printed_nothing_is_said_to_have_no_log() {
    let p = Project::new().dag(
        "silent",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"exit 4\"\n",
    );
    let out = p.run(&[
        "create",
        "--dag",
        "silent",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ]);
    out.code(3)
        .stderr_has("log: none (the try printed nothing)");
    assert!(!out.stderr.contains(".log"), "{}", out.stderr);
    let show = p.run(&["show", "1", "--output", "json"]).json();
    assert_eq!(show["interval_details"][0]["log"], serde_json::Value::Null);
}

#[test]
fn notify_hooks_run_when_a_backfill_ends_and_never_change_its_exit_code() {
    let p = Project::new().dag("flaky", FLAKY);
    p.write(
        "backfill.toml",
        r#"
[notify]
on_failure = "echo \"$BACKFILL_ID $BACKFILL_DAG $BACKFILL_STATE $BACKFILL_EXIT_CODE\" > failure.txt; cat > summary.json"
on_success = ["sh", "-c", "echo success > success.txt"]
on_finish = "echo finished >> finish.txt; exit 4"
timeout = "5s"
"#,
    );
    let out = p.run(&three_days("flaky"));
    out.code(3)
        .stderr_has("warning: notify hook `on_finish` failed: exit code 4 (log: ");
    assert_eq!(p.read("failure.txt"), "1 flaky failed 3\n");
    let summary: serde_json::Value = serde_json::from_str(&p.read("summary.json")).unwrap();
    assert_eq!(summary["backfill_id"], 1);
    assert_eq!(summary["intervals"]["failed"], 1);
    assert_eq!(p.read("finish.txt"), "finished\n");
    assert!(!p.path("success.txt").exists());
    // A DAG's [notify] overrides the project's, key by key; a hook that hangs is killed.
    p.write("fixed", "");
    p.write(
        "dags/flaky.toml",
        &format!("{FLAKY}\n[notify]\non_success = \"sleep 30\"\ntimeout = \"200ms\"\n"),
    );
    let out = p.run(&[
        "create",
        "--dag",
        "flaky",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-02",
        "--reprocess-behavior",
        "failed",
    ]);
    out.code(0)
        .stderr_has("warning: notify hook `on_success` timed out after 200ms and was killed");
    assert_eq!(p.read("finish.txt"), "finished\nfinished\n");
}

/// A notify hook that records its pid, says whether it got SIGTERM, and otherwise waits ten
/// minutes without reading its stdin.
const DEAF_HOOK: &str =
    r#"trap 'echo TERM > hook.term; exit 0' TERM; echo $$ > hook.pid; sleep 600 & wait"#;

/// Every hourly interval fails: a month of them makes a JSON summary larger than a pipe holds.
const ALL_FAIL_HOURLY: &str =
    "schedule = \"@hourly\"\nmax_active_runs = 8\n[[tasks]]\nid = \"t\"\ncommand = [\"false\"]\n";

/// The hook's process is gone, and it got SIGTERM (before any SIGKILL).
#[track_caller]
fn hook_was_terminated(p: &Project) {
    assert_eq!(p.read("hook.term"), "TERM\n", "the hook got SIGTERM first");
    let pid: i32 = p.read("hook.pid").trim().parse().unwrap();
    wait_until("the hook to be gone", Duration::from_secs(10), || {
        !alive(pid)
    });
}

#[test]
fn a_notify_hook_that_does_not_read_a_large_summary_is_stopped_at_its_timeout() {
    let p = Project::new().dag("month", ALL_FAIL_HOURLY);
    p.write(
        "backfill.toml",
        &format!("[notify]\non_failure = '''{DEAF_HOOK}'''\ntimeout = \"5s\"\n"),
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "month",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-30",
            "--output",
            "json",
        ],
    );
    // The hook's own sleep lasts 600 s: a backfill blocked on its stdin would outlive 60 s. Its
    // timeout leaves the shell time enough to set its trap, however loaded the machine.
    let out = wait_within(&p, "run", child, Duration::from_secs(60));
    out.code(3)
        .stderr_has("warning: notify hook `on_failure` timed out after 5s");
    assert_eq!(out.json()["intervals"]["failed"], 720);
    assert!(
        out.stdout.len() > 64 * 1024,
        "the summary ({} bytes) must not fit in a pipe's buffer",
        out.stdout.len()
    );
    hook_was_terminated(&p);
}

#[test]
fn a_signal_while_a_notify_hook_runs_stops_it_and_exits_130() {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let p = Project::new().dag("flaky", FLAKY);
        p.write(
            "backfill.toml",
            &format!(
                "[notify]\non_failure = '''{DEAF_HOOK}'''\non_finish = \"touch finished\"\ntimeout = \"10m\"\n"
            ),
        );
        let child = p.spawn("run", &three_days("flaky"));
        wait_until("the hook to run", Duration::from_secs(30), || {
            !p.read("hook.pid").is_empty()
        });
        signal(&child, sig);
        // The hook would wait 600 s, and its timeout is 10 minutes.
        wait_within(&p, "run", child, Duration::from_secs(60))
            .code(130)
            .stderr_has("warning: notify hook `on_failure` was stopped by a signal");
        hook_was_terminated(&p);
        assert!(
            !p.path("finished").exists(),
            "no hook starts after the signal"
        );
    }
}

#[test]
fn diagnostics_explain_takeovers_through_tracing() {
    let p = Project::new().dag(
        "ok",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let out = p.run_with(&three_days("ok"), &[("BACKFILL_LOG", "debug")]);
    out.code(0)
        .stderr_has("planned and leased")
        .stderr_has("backfill=1");
    let mut args = vec!["--log-format", "json", "-vv"];
    args.extend(three_days("ok"));
    args.extend(["--reprocess-behavior", "completed"]);
    let out = p.run(&args);
    out.code(0);
    let events: Vec<serde_json::Value> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["fields"]["message"] == "planned and leased" && e["fields"]["backfill"] == 2),
        "{}",
        out.stderr
    );
    p.run_with(&["list"], &[("BACKFILL_LOG", "backfill=loud")])
        .code(2)
        .stderr_has("BACKFILL_LOG=backfill=loud is not a filter directive");
}

#[test]
fn intervals_are_written_one_way_in_the_dags_timezone() {
    let berlin = FLAKY.replace(
        "schedule = \"@daily\"",
        "schedule = \"@daily\"\ntimezone = \"Europe/Berlin\"",
    );
    let p = Project::new().dag("flaky", &berlin);
    let out = p.run(&three_days("flaky"));
    out.code(3)
        .stderr_has("failed     2026-01-02 (")
        .stderr_has("failed 2026-01-02: as written above; log: ")
        .stderr_has("--from 2026-01-02 --to 2026-01-02");
    p.run(&["runs", "--dag", "flaky"])
        .code(0)
        .stdout_has("│ 2026-01-02 ");
    // Hourly intervals carry the time, and the offset where a wall time repeats.
    let hourly = "schedule = \"@hourly\"\ntimezone = \"Europe/Berlin\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n";
    let p = Project::new().dag("h", hourly);
    let plan = p.run(&[
        "create",
        "--dag",
        "h",
        "--from",
        "2026-10-25T02:00",
        "--to",
        "2026-10-25T03:00",
        "--dry-run",
    ]);
    plan.code(0)
        .stdout_has("2026-10-25 02:00+02:00")
        .stdout_has("2026-10-25 02:00+01:00")
        .stdout_has("2026-10-25 03:00 ");
}

#[test]
fn a_backfill_whose_owner_died_says_so() {
    let p = Project::new().dag(
        "slow",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"test -e resumed || sleep 30\"\n",
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "slow",
            "--from",
            "yesterday",
            "--to",
            "yesterday",
        ],
    );
    wait_until("the try to run", Duration::from_secs(20), || {
        p.has_manifest() && p.count("SELECT COUNT(*) FROM task_tries WHERE pgid IS NOT NULL") == 1
    });
    let live = p.run(&["list", "--output", "json"]).json();
    assert_eq!(live[0]["owner_alive"], true);
    // The range is what was planned, whatever words chose it.
    assert_eq!(
        (&live[0]["from"], &live[0]["to"], &live[0]["from_arg"]),
        (
            &serde_json::json!("2026-11-28T00:00:00Z"),
            &serde_json::json!("2026-11-28T00:00:00Z"),
            &serde_json::json!("yesterday")
        )
    );
    signal(&child, Signal::SIGKILL);
    p.wait("run", child);
    let gone = format!("running (owner gone: {})", p.hint("resume 1"));
    p.run(&["list"]).code(0).stdout_has(&gone);
    p.run(&["show", "1"])
        .code(0)
        .stdout_has(&gone)
        .stdout_has("2026-11-28 to 2026-11-28 (--from yesterday --to yesterday)");
    assert_eq!(
        p.run(&["list", "--output", "json"]).json()[0]["owner_alive"],
        false
    );
    // The hint works as pasted, wherever it is pasted.
    p.write("resumed", "");
    let words = shlex::split(&p.hint("resume 1")).unwrap();
    let pasted = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
        .envs(p.manifest_env())
        .args(&words[1..])
        .current_dir("/")
        .env("BACKFILL_NOW", crate::support::NOW)
        .output()
        .unwrap();
    assert_eq!(pasted.status.code(), Some(0), "{pasted:?}");
    let cancel = p.run(&["--output", "json", "cancel", "1"]);
    cancel.code(0);
    assert_eq!(
        cancel.json(),
        serde_json::json!({"backfill_id": 1, "state": "completed", "result": "nothing to cancel"})
    );
    // Empty results say what was asked.
    let none = p.run(&["list", "--active"]);
    assert_eq!(
        (none.stdout.as_str(), none.stderr.as_str()),
        ("", "no active backfills\n")
    );
    p.run(&["list", "--dag", "nope"])
        .code(0)
        .stderr_has("no backfills of DAG nope");
    p.run(&["--manifest", "/nonexistent/manifest.db", "list"])
        .code(2)
        .stderr_has("manifest /nonexistent/manifest.db: no such file");
}

#[test]
fn verify_calls_a_task_without_a_fingerprint_unverifiable_and_never_publishes() {
    let p = Project::new().dag(
        "v",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 1}' > "$BACKFILL_RESULT"'''
publish = "touch published"
[tasks.gate]
[[tasks]]
id = "sum"
depends_on = ["export"]
command = '''printf '{"rows": 1, "fingerprint": "{{ ds }}"}' > "$BACKFILL_RESULT"'''
"#,
    );
    let out = p.run(&[
        "verify",
        "--dag",
        "v",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ]);
    out.code(0)
        .stdout_has("unverifiable")
        .stdout_has("deterministic")
        .stderr_has("task `export` for 2026-01-01 is unverifiable")
        .stderr_has("1 deterministic, 0 not, 1 unverifiable");
    assert!(!p.path("published").exists(), "verify never runs publish");
}

#[test]
fn terminals_without_cursor_control_get_plain_lines() {
    // `script` gives the command a terminal; TERM=dumb says it cannot redraw a bar.
    let p = Project::new().dag(
        "ok",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let command = format!(
        "{} -C {} create --dag ok --from 2026-01-01 --to 2026-01-02",
        env!("CARGO_BIN_EXE_backfill"),
        p.path("").display()
    );
    let out = std::process::Command::new("script")
        .envs(p.manifest_env())
        .args(["-qec", &command, "/dev/null"])
        .env("TERM", "dumb")
        .env("BACKFILL_NOW", crate::support::NOW)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("succeeded  2026-01-01"), "{text}");
    assert!(text.contains("succeeded  2026-01-02"), "{text}");
}

#[test]
fn init_starts_a_working_project_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pipelines");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
            .args(args)
            .env("BACKFILL_NOW", crate::support::NOW)
            .output()
            .unwrap()
    };
    let out = run(&["init", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(root.join("backfill.toml").is_file());
    let out = run(&[
        "-C",
        root.to_str().unwrap(),
        "create",
        "--dag",
        "example",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("out/2026-01-02.txt")).unwrap(),
        "hello from 2026-01-02\n"
    );
    let other = dir.path().join("other");
    let doc: serde_json::Value =
        serde_json::from_slice(&run(&["--output", "json", "init", other.to_str().unwrap()]).stdout)
            .unwrap();
    assert_eq!(doc["wrote"].as_array().map(Vec::len), Some(3), "{doc}");
    // What runs write stays out of git; a folder's own .gitignore is kept.
    assert_eq!(
        std::fs::read_to_string(root.join(".gitignore")).unwrap(),
        "# What backfill writes as it runs: the manifest, the tries' logs and audit files.\n/.backfill/\n# The example DAG's output.\n/out/\n"
    );
    let kept = dir.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join(".gitignore"), "mine\n").unwrap();
    assert_eq!(
        run(&["init", kept.to_str().unwrap()]).status.code(),
        Some(0)
    );
    assert_eq!(
        std::fs::read_to_string(kept.join(".gitignore")).unwrap(),
        "mine\n"
    );
    let again = run(&["init", root.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("backfill.toml exists already"));
}

/// A manifest URL taken from the environment names the variable in `--help`, never its value:
/// the password in it must not reach a terminal, a log or a CI transcript.
#[test]
fn help_does_not_print_the_manifest_urls_password() {
    for args in [&["--help"][..], &["create", "--help"], &["list", "--help"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
            .args(args)
            .env(
                "BACKFILL_MANIFEST",
                "postgresql://etl:hunter2@db.internal/x",
            )
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("[env: BACKFILL_MANIFEST"), "{args:?}: {help}");
        assert!(!help.contains("hunter2"), "{args:?}: {help}");
        assert!(!help.contains("db.internal"), "{args:?}: {help}");
    }
}

#[test]
fn completions_man_page_and_examples_in_help() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run(&["completions", "bash"]).contains("_backfill()"));
    assert!(run(&["completions", "zsh"]).contains("#compdef backfill"));
    assert!(run(&["completions", "fish"]).contains("complete -c backfill"));
    let man = run(&["man"]);
    assert!(man.contains(".TH backfill"), "{man}");
    // The synopsis names each option's value.
    assert!(
        man.contains(r"[\fB\-C\fR|\fB\-\-project\fR \fIDIR\fR] [\fB\-\-manifest\fR \fIPATH|URL\fR] [\fB\-\-output\fR \fIhuman|json\fR]"),
        "{man}"
    );
    let pages = tempfile::tempdir().unwrap();
    run(&["man", "--dir", pages.path().to_str().unwrap()]);
    let create = std::fs::read_to_string(pages.path().join("backfill-create.1")).unwrap();
    assert!(create.contains("reprocess\\-behavior"), "{create}");
    assert!(
        create.contains(r"<\fB\-\-dag\fR \fIDAG\fR> <\fB\-\-from\fR \fIWHEN\fR>"),
        "{create}"
    );
    assert!(
        create.contains(r"[\fB\-\-reprocess\-behavior\fR \fInone|failed|completed|changed\fR]"),
        "{create}"
    );
    let help = run(&["create", "--help"]);
    assert!(
        help.contains(
            "Examples:\n  backfill create --dag daily_orders --from 2026-09-01 --to 2026-09-30"
        ),
        "{help}"
    );
}
