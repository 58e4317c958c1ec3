//! The human tables, compared whole against snapshots (`tests/cli/snapshots/`): every heading,
//! every column, the summary lines. Times that depend on the clock are replaced by
//! placeholders; everything else is exact. Then how they fit a terminal's width (`COLUMNS`, a
//! real pseudo-terminal) and what a terminal shows while a backfill runs.

use std::process::{Command, Stdio};

use crate::support::{NOW, Out, Project};

const GATED: &str = r#"
schedule = "@daily"
timezone = "Europe/Berlin"
[[tasks]]
id = "export"
command = '''
case {{ ds }} in
  2026-01-02) printf '{"rows": 5}' > "$BACKFILL_RESULT" ;;
  2026-01-03) echo "upstream missing" >&2; exit 2 ;;
  *) printf '{"rows": 10}' > "$BACKFILL_RESULT" ;;
esac
'''
[tasks.gate]
source_count = "echo 10"
"#;

fn project() -> Project {
    let p = Project::new().dag("sales", GATED);
    p.run(&[
        "create",
        "--dag",
        "sales",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
    ])
    .code(3);
    p
}

/// Replaces what depends on the clock or the folder: the project's path, the times at which
/// things happened (today's, unlike the intervals of 2026-01) and durations, each by a
/// placeholder of the same width so that the tables keep their shape.
fn settle(p: &Project, text: &str) -> String {
    let dir = p.path("").display().to_string();
    let text = text.replace(dir.trim_end_matches('/'), "[project]");
    let now = chrono::Utc::now();
    let days = [now, now - chrono::Duration::days(1)].map(|d| d.format("%Y-%m-%dT").to_string());
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(ch) = rest.chars().next() {
        if rest.len() >= 20 && days.iter().any(|d| rest.starts_with(d.as_str())) {
            out.push_str("YYYY-MM-DDTHH:MM:SSZ");
            rest = &rest[20..];
            continue;
        }
        // A duration such as `0.03s` after a space.
        if ch.is_ascii_digit() && (out.ends_with(' ') || out.ends_with('(')) {
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if rest[end..].starts_with('s') && rest[..end].contains('.') {
                out.push_str(&"9".repeat(end));
                out.push('s');
                rest = &rest[end + 1..];
                continue;
            }
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    out
}

fn stdout(p: &Project, out: Out) -> String {
    out.code(0);
    settle(p, &out.stdout)
}

#[test]
fn show_pins_every_column_of_every_interval() {
    let p = project();
    insta::assert_snapshot!("show", stdout(&p, p.run(&["show", "1"])));
}

#[test]
fn list_runs_and_dags_pin_their_tables() {
    let p = project();
    insta::assert_snapshot!("list", stdout(&p, p.run(&["list"])));
    insta::assert_snapshot!("runs", stdout(&p, p.run(&["runs", "--dag", "sales"])));
    insta::assert_snapshot!("dags", stdout(&p, p.run(&["dags"])));
}

#[test]
fn a_dry_run_pins_its_plan() {
    let p = project();
    // The estimate comes from recorded durations: 1.5 s per try.
    p.exec("UPDATE task_tries SET ended_at = started_at + 1500");
    let plan = p.run(&[
        "create",
        "--dag",
        "sales",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-05",
        "--reprocess-behavior",
        "failed",
        "--dry-run",
    ]);
    insta::assert_snapshot!("plan", stdout(&p, plan));
}

#[test]
fn the_end_of_a_run_pins_its_summary() {
    let p = Project::new().dag("sales", GATED);
    let out = p.run(&[
        "create",
        "--dag",
        "sales",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
    ]);
    out.code(3);
    insta::assert_snapshot!("summary", settle(&p, &out.stderr));
}

#[test]
fn a_long_table_says_how_many_rows_it_leaves_out_on_a_line_of_its_own() {
    let p = Project::new().dag(
        "hourly",
        "schedule = \"@hourly\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let plan = p.run(&[
        "create",
        "--dag",
        "hourly",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-09",
        "--dry-run",
    ]);
    let text = stdout(&p, plan);
    let gap: Vec<&str> = text.lines().filter(|l| l.starts_with('…')).collect();
    assert_eq!(gap, ["… 16 rows left out; --output json lists every row"]);
    assert!(text.contains("216 intervals to run"), "{text}");
}

/// The widest line of `text`, in characters.
fn widest(text: &str) -> usize {
    text.lines()
        .map(|l| l.trim_end_matches('\r').chars().count())
        .max()
        .unwrap_or(0)
}

#[test]
fn columns_fits_the_tables_and_verbose_keeps_every_word() {
    let p = project();
    let at = |cols: &str, extra: &[&str]| {
        let mut args = vec!["runs", "--dag", "sales"];
        args.extend_from_slice(extra);
        let out = p.run_with(&args, &[("COLUMNS", cols)]);
        out.code(0);
        out.stdout
    };
    let full = p.run(&["runs", "--dag", "sales"]).stdout;
    assert!(widest(&full) > 200, "a pipe keeps every character:\n{full}");
    for cols in [120, 100, 80] {
        let cut = at(&cols.to_string(), &[]);
        assert!(widest(&cut) <= cols, "COLUMNS={cols}:\n{cut}");
        assert!(cut.contains('…'), "long cells are cut:\n{cut}");
        let whole = at(&cols.to_string(), &["-v"]);
        assert!(widest(&whole) <= cols, "COLUMNS={cols} -v:\n{whole}");
        assert!(!whole.contains('…'), "-v keeps long cells whole:\n{whole}");
        assert!(whole.contains("0.0%)"), "{whole}");
    }
    // The JSON document is never cut.
    let json = p.run_with(
        &["runs", "--dag", "sales", "--output", "json"],
        &[("COLUMNS", "40")],
    );
    assert_eq!(
        json.json()[1]["error"],
        "task `export` rejected: row count 5 differs from the source count 10 by 50.0% (tolerance 0.0%)"
    );
}

/// Runs `backfill ARGS` in a pseudo-terminal `cols` columns wide (through util-linux `script`)
/// and returns its exit code and what the terminal received. A test that calls it is ignored
/// without `script` (`tests/parts`).
pub(crate) fn on_terminal(p: &Project, args: &[&str], cols: u16) -> (i32, String) {
    let mut words = vec![
        env!("CARGO_BIN_EXE_backfill").to_string(),
        "-C".to_string(),
        p.path("").display().to_string(),
    ];
    words.extend(args.iter().map(|a| a.to_string()));
    let line = words
        .iter()
        .map(|w| backfill::report::out::shell_word(w))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(crate::parts::Part::Script.require())
        .envs(p.manifest_env())
        .args([
            "-qec",
            &format!("stty cols {cols} rows 40; exec {line}"),
            "/dev/null",
        ])
        .env("SHELL", "/bin/sh")
        .env("TERM", "xterm")
        .env("BACKFILL_NOW", NOW)
        .env_remove("COLUMNS")
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n"),
    )
}

#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn a_terminal_gets_tables_as_wide_as_it_is() {
    let p = project();
    for command in [&["runs", "--dag", "sales"][..], &["show", "1"]] {
        let (code, text) = on_terminal(&p, command, 100);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains('┌'), "{text}");
        assert!(widest(&text) <= 100, "{command:?}:\n{text}");
    }
}

/// `text` without its colour and cursor codes (`ESC [ ... letter`).
pub(crate) fn strip_codes(text: &str) -> String {
    let mut plain = String::new();
    let mut code = false;
    for c in text.chars() {
        match (code, c) {
            (false, '\x1b') => code = true,
            (true, c) if c.is_ascii_alphabetic() => code = false,
            (false, c) => plain.push(c),
            _ => {}
        }
    }
    plain
}

/// The lines a terminal shows of `text` (what `script` recorded): split at newlines and at
/// carriage returns (a bar redrawn), colour and cursor codes taken out.
fn screen_lines(text: &str) -> Vec<String> {
    strip_codes(text)
        .split(['\n', '\r'])
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn create_writes_no_line_wider_than_its_terminal_and_each_reason_once() {
    let p = Project::new().dag("sales", GATED).dag("slow", SLOW);
    for (n, cols) in [60u16, 80, 100].into_iter().enumerate() {
        let dag = if n == 1 { "slow" } else { "sales" };
        let (code, text) = on_terminal(
            &p,
            &[
                "create",
                "--dag",
                dag,
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-04",
                "--reprocess-behavior",
                "completed",
            ],
            cols,
        );
        assert_eq!(code, 3, "{text}");
        let lines = screen_lines(&text);
        // A line may be wider only as one word that must not be cut (a path, a command between
        // backquotes): the terminal folds it, and it is still whole when copied.
        let one_word = |l: &str| {
            let outside: String = l.trim().split('`').step_by(2).collect();
            !outside.contains(' ')
        };
        for line in lines.iter().filter(|l| !one_word(l)) {
            assert!(
                line.chars().count() <= usize::from(cols),
                "{cols} columns: {line:?} in\n{}",
                lines.join("\n")
            );
        }
        // Cut at words: the start line and the summary's last line, joined again, read whole.
        let joined = lines.join(" ").replace("   ", " ").replace("  ", " ");
        assert!(
            joined.contains(&format!(
                "backfill {} of {dag}: 4 intervals, 4 to run, 0 skipped, up to",
                n + 1
            )),
            "{joined}"
        );
        assert!(joined.contains("1 failed,"), "{joined}");
        // The failed try's reason: above the bar, then named in the summary.
        let reason = if dag == "sales" {
            "row count 5 differs from the source count 10"
        } else {
            "upstream missing"
        };
        assert_eq!(joined.matches(reason).count(), 1, "{cols}: {joined}");
    }
}

const SLOW: &str = r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''
sleep 0.3
case {{ ds }} in
  2026-01-03) echo "upstream missing" >&2; exit 2 ;;
esac
'''
"#;

#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn a_terminal_shows_a_bar_and_only_the_failures_above_it() {
    let p = Project::new().dag("slow", SLOW);
    let create = ["create", "--dag", "slow", "--from", "2026-01-01"];
    let (code, text) = on_terminal(&p, &[&create[..], &["--to", "2026-01-04"]].concat(), 120);
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains("/4 intervals · "),
        "the bar is drawn:\n{text}"
    );
    assert!(
        text.contains("failed     2026-01-03 (") && text.contains("  | upstream missing"),
        "a failure is written above the bar:\n{text}"
    );
    assert!(
        !text.contains("succeeded  2026-01-0"),
        "no line per interval that went well:\n{text}"
    );
    assert!(
        text.contains("backfill 1 of slow: failed — 3 succeeded, 1 failed"),
        "{text}"
    );
    // -v adds the lines.
    let (_, verbose) = on_terminal(
        &p,
        &[&create[..], &["--to", "2026-01-05", "-v"]].concat(),
        120,
    );
    assert!(verbose.contains("started    2026-01-05 (run "), "{verbose}");
    assert!(verbose.contains("succeeded  2026-01-05 ("), "{verbose}");
}

#[test]
fn without_a_terminal_there_is_no_bar_and_a_line_per_interval() {
    let p = Project::new().dag("slow", SLOW);
    let out = p.create("slow", "2026-01-01", "2026-01-02", &[]);
    out.code(0);
    assert!(!out.stderr.contains("intervals ·"), "{}", out.stderr);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("succeeded  "))
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stderr);
}

/// `show` and `runs` in real terminals of 60, 80 and 120 columns (no `COLUMNS`): short cells
/// (dates, states, counts) never wrap, no line is wider than the terminal, and a column left out
/// for the width is named.
#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn tables_fit_the_terminal_and_never_wrap_dates_states_or_counts() {
    let p = crate::gate::shop();
    p.create("orders_fact", "2026-09-01", "2026-09-10", &[])
        .code(0);
    // Two days lose a tenth of their orders: their rerun is rejected with a long reason.
    crate::gate::wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) IN ('2026-09-03', '2026-09-07') AND order_id % 10 = 0",
        )
        .unwrap();
    p.create(
        "orders_fact",
        "2026-09-01",
        "2026-09-10",
        &["--reprocess-behavior", "completed"],
    )
    .code(3);
    let days: Vec<String> = (1..=10).map(|d| format!("2026-09-{d:02}")).collect();
    for cols in [60u16, 80, 120] {
        for args in [
            "show 2",
            "runs --dag orders_fact --from 2026-09-01 --to 2026-09-10",
        ] {
            let words: Vec<&str> = args.split(' ').collect();
            let (code, text) = on_terminal(&p, &words, cols);
            assert_eq!(code, 0, "{text}");
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines {
                assert!(
                    l.chars().count() <= usize::from(cols),
                    "`{args}` at {cols} columns: a line of {} characters:\n{text}",
                    l.chars().count()
                );
            }
            for day in &days {
                assert!(
                    lines.iter().any(|l| l.contains(day.as_str())),
                    "`{args}` at {cols} columns: {day} is not whole on a line:\n{text}"
                );
            }
            for state in ["succeeded", "rejected"] {
                assert!(
                    lines.iter().any(|l| l.contains(state)),
                    "`{args}` at {cols} columns: `{state}` is cut:\n{text}"
                );
            }
            assert!(
                !lines.iter().any(|l| l.contains("2026-09-")
                    && !l.contains("2026-09-0")
                    && !l.contains("2026-09-1")),
                "`{args}` at {cols} columns: a date is cut:\n{text}"
            );
            if cols == 60 && args.starts_with("show") {
                assert!(
                    text.contains("(left out for the width: action, attempts, tries"),
                    "the columns left out are named:\n{text}"
                );
            }
            if cols == 120 {
                assert!(
                    !text.contains("left out for the width") || args.starts_with("show"),
                    "{text}"
                );
            }
        }
    }
}
