//! `create --sample N`: which intervals rehearse a range, what a sampled backfill records, and
//! its bad input.

use crate::support::Project;

/// A daily DAG whose task fails on 2026-03-11.
const FLAKY: &str = r#"schedule = "@daily"
[[tasks]]
id = "load"
command = "test {{ ds }} != 2026-03-11"
"#;

fn plan(p: &Project, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "create",
        "--dag",
        "flaky",
        "--from",
        "2026-03-01",
        "--to",
        "2026-03-31",
        "--dry-run",
        "--output",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = p.run(&args);
    out.code(0);
    out.json()["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{} {} {}",
                &i["start"].as_str().unwrap()[..10],
                i["action"].as_str().unwrap(),
                i["reason"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

#[test]
fn a_sample_prefers_the_interval_whose_latest_run_failed() {
    let p = Project::new().dag("flaky", FLAKY);
    p.create("flaky", "2026-03-01", "2026-03-31", &["-q"])
        .code(3);
    assert_eq!(
        plan(&p, &["--sample", "3", "--reprocess-behavior", "completed"]),
        [
            "2026-03-01 run sample: first",
            "2026-03-11 run sample: latest run failed",
            "2026-03-31 run sample: last",
        ]
    );
    // Without history the same range spreads.
    let fresh = Project::new().dag("flaky", FLAKY);
    assert_eq!(
        plan(&fresh, &["--sample", "3"]),
        [
            "2026-03-01 run sample: first",
            "2026-03-16 run sample: spread",
            "2026-03-31 run sample: last",
        ]
    );
}

#[test]
fn a_staged_sample_does_not_count_as_a_run_of_the_range_and_a_plain_one_does() {
    // A stage holds back a command task's `publish` command, which runs after its gate.
    let p = Project::new().dag(
        "flaky",
        r#"schedule = "@daily"
[[tasks]]
id = "load"
command = '''test {{ ds }} != 2026-03-11 && printf '{"rows": 1}' > "$BACKFILL_RESULT"'''
publish = "touch published-{{ ds }}"
[tasks.gate]
source_count = "echo 1"
"#,
    );
    let staged = p.create(
        "flaky",
        "2026-03-01",
        "2026-03-31",
        &["--sample", "2", "--stage", "-q"],
    );
    staged.code(0);
    assert_eq!(staged.stdout, "1\n");
    // Nothing of the range counts as run: every interval is planned again.
    let again = plan(&p, &[]);
    assert_eq!(again.iter().filter(|r| r.contains(" run ")).count(), 31);
    p.create(
        "flaky",
        "2026-03-01",
        "2026-03-31",
        &["--sample", "2", "-q"],
    )
    .code(0);
    let after = plan(&p, &[]);
    assert_eq!(after[0], "2026-03-01 skip already exists");
    assert_eq!(after[30], "2026-03-31 skip already exists");
    assert_eq!(after.iter().filter(|r| r.contains(" run ")).count(), 29);
    let list = p.run(&["list", "--output", "json"]);
    let samples: Vec<String> = list
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|b| format!("{} {}", b["id"], b["sample"]))
        .collect();
    assert_eq!(samples, ["1 2", "2 2"]);
    p.run(&["show", "2"])
        .code(0)
        .stdout_has("sample of 2 intervals");
}

#[test]
fn bad_or_odd_samples() {
    let p = Project::new().dag("flaky", FLAKY).dag(
        "chained",
        "schedule = \"@daily\"\ndepends_on_past = true\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.create("flaky", "2026-03-01", "2026-03-02", &["--sample", "0"])
        .code(2)
        .stderr_has("--sample");
    p.create("chained", "2026-03-01", "2026-03-31", &["--sample", "3"])
        .code(2)
        .stderr_has("--sample cannot be used with DAG `chained`: it sets depends_on_past = true");
    assert!(!p.has_manifest(), "nothing written");
    // A sample as large as the range runs all of it, and says so.
    let out = p.create(
        "flaky",
        "2026-03-01",
        "2026-03-05",
        &["--sample", "5", "--dry-run"],
    );
    out.code(0).stderr_has(
        "--sample 5: the range has no more than 5 complete intervals, so all of them run",
    );
    // --tasks and --max-failures apply to a sample as to any backfill.
    assert_eq!(
        plan(
            &p,
            &["--sample", "2", "--tasks", "load", "--max-failures", "1"]
        ),
        [
            "2026-03-01 run sample: first",
            "2026-03-31 run sample: last"
        ]
    );
}
