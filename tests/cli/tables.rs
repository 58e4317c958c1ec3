//! The human tables, compared whole against snapshots (`tests/cli/snapshots/`): every heading,
//! every column, the summary lines. Times that depend on the clock are replaced by
//! placeholders; everything else is exact.

use crate::support::{Out, Project};

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
    p.db()
        .execute_batch("UPDATE task_tries SET ended_at = started_at + 1500")
        .unwrap();
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
