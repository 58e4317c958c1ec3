//! `--reprocess-behavior changed` and `backfill stale`: rerun only the intervals whose source
//! changed since they were published.

use crate::gate::{shop, wh, wh_count};
use crate::support::Project;

fn september(p: &Project, dag: &str, extra: &[&str]) -> crate::support::Out {
    p.create(dag, "2026-09-01", "2026-09-30", extra)
}

/// `(start, action, reason)` of every row of a backfill's plan, in order.
fn plan(p: &Project, backfill: i64) -> Vec<(String, String, String)> {
    p.rows(&format!(
        "SELECT interval_start, action, COALESCE(reason, '') FROM plan
         WHERE backfill_id = {backfill} ORDER BY ord"
    ))
    .into_iter()
    .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
    .collect()
}

fn unix(day: &str) -> String {
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp()
        .to_string()
}

#[test]
fn late_rows_in_one_day_rerun_that_day_and_only_that_day() {
    let p = shop();
    september(&p, "orders_fact", &[]).code(0);
    let late_day = "SELECT COUNT(*) FROM orders_fact WHERE order_day = '2026-09-18'";
    let before = wh_count(&p, late_day);
    // Nothing changed yet: nothing is stale, and `changed` reruns nothing.
    let stale = p.run(&[
        "stale",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
        "--output",
        "json",
    ]);
    stale.code(0);
    assert_eq!(stale.json(), serde_json::json!([]));
    // Two orders arrive late for 2026-09-18.
    wh(&p)
        .execute_batch(
            "INSERT INTO raw_orders (order_ts, region, amount_cents) VALUES
               ('2026-09-18 09:00:00', 'north', 1250), ('2026-09-18 23:59:59', 'south', 990);",
        )
        .unwrap();
    let stale = p.run(&[
        "stale",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
        "--output",
        "json",
    ]);
    stale.code(0);
    let doc = stale.json();
    assert_eq!(doc.as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc[0]["interval"]["start"], "2026-09-18T00:00:00Z");
    assert_eq!(doc[0]["task"], "load");
    assert_eq!(doc[0]["recorded"]["source_rows"], before);
    assert_eq!(doc[0]["now"]["source_rows"], before + 2);
    // The human table says the same, on stdout.
    p.run(&[
        "stale",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
    ])
    .code(0)
    .stdout_has(&format!("source_count {before} -> {}", before + 2));

    let dry = september(
        &p,
        "orders_fact",
        &[
            "--reprocess-behavior",
            "changed",
            "--dry-run",
            "--output",
            "json",
        ],
    );
    dry.code(0);
    let runs: Vec<String> = dry.json()["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["action"] == "run")
        .map(|i| i["start"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(runs, ["2026-09-18T00:00:00Z"]);

    september(&p, "orders_fact", &["--reprocess-behavior", "changed"])
        .code(0)
        .stderr_has("completed — 1 succeeded, 0 failed, 0 rejected, 0 cancelled, 29 skipped");
    let planned = plan(&p, 2);
    assert_eq!(planned.len(), 30);
    for (start, action, reason) in &planned {
        if *start == unix("2026-09-18") {
            assert_eq!((action.as_str(), reason.as_str()), ("run", ""));
        } else {
            assert_eq!(
                (action.as_str(), reason.as_str()),
                ("skip", "source unchanged")
            );
        }
    }
    assert_eq!(
        wh_count(&p, late_day),
        before + 2,
        "the late orders are published"
    );
    assert_eq!(
        wh_count(&p, "SELECT COUNT(*) FROM orders_fact"),
        wh_count(
            &p,
            "SELECT COUNT(*) FROM raw_orders WHERE order_ts >= '2026-09-01' AND order_ts < '2026-10-01'"
        ),
        "the month equals its source, nothing counted twice"
    );
    // Published again, the day is not stale any more.
    let stale = p.run(&[
        "stale",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
        "--output",
        "json",
    ]);
    assert_eq!(stale.json(), serde_json::json!([]));
}

const WATCHED: &str = r#"
schedule = "@daily"

[[tasks]]
id = "load"
command = "test ! -e fail-{{ ds }} && echo '{\"rows\": 1}' > $BACKFILL_RESULT"
[tasks.gate]
source_fingerprint = "cat source/{{ ds }} 2>/dev/null || echo none"

[[tasks]]
id = "notes"
depends_on = ["load"]
command = "true"
"#;

#[test]
fn a_command_fingerprint_decides_and_failed_intervals_run_as_with_failed() {
    let p = Project::new().dag("watched", WATCHED);
    for day in ["2026-01-01", "2026-01-02", "2026-01-03"] {
        p.write(&format!("source/{day}"), "v1\n");
    }
    p.write("fail-2026-01-03", "");
    let three = |extra: &[&str]| {
        let mut args = vec![
            "create",
            "--dag",
            "watched",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ];
        args.extend_from_slice(extra);
        p.run(&args)
    };
    three(&[]).code(3);
    assert_eq!(
        p.rows("SELECT source_fingerprint FROM task_tries WHERE task_id = 'load' AND state = 'succeeded' ORDER BY id"),
        [["v1"], ["v1"]]
    );
    std::fs::remove_file(p.path("fail-2026-01-03")).unwrap();
    p.write("source/2026-01-02", "v2\n");
    // `notes` cannot tell: the warning says so; `load` can.
    let out = three(&["--reprocess-behavior", "changed"]);
    out.code(0)
        .stderr_has("`notes` has no gate `source_count` or `source_fingerprint`: only the sources of `load` are compared")
        .stderr_has("completed — 2 succeeded, 0 failed, 0 rejected, 0 cancelled, 1 skipped");
    let planned = plan(&p, 2);
    assert_eq!(
        planned
            .iter()
            .map(|(_, a, r)| format!("{a} {r}").trim().to_string())
            .collect::<Vec<_>>(),
        ["skip source unchanged", "run", "run"],
        "01-02 changed, 01-03 had failed"
    );
    // A DAG whose tasks cannot tell reruns only what failed, and says why.
    let blind = Project::new().dag(
        "blind",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    blind
        .run(&[
            "create",
            "--dag",
            "blind",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ])
        .code(0);
    blind
        .run(&[
            "create",
            "--dag",
            "blind",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--reprocess-behavior",
            "changed",
        ])
        .code(0)
        .stderr_has("no task of DAG `blind` has a gate `source_count` or `source_fingerprint`")
        .stderr_has("2 skipped");
}

/// A command task whose output counts the lines of `source.txt`; while its first try runs,
/// one line arrives late, as late data would.
const LATE_WHILE_RUNNING: &str = r#"
schedule = "@daily"
[[tasks]]
id = "copy"
command = '''
n=$(wc -l < source.txt)
if [ ! -f arrived ]; then echo late >> source.txt; touch arrived; fi
printf '{"rows": %d}' "$n" > "$BACKFILL_RESULT"
'''
[tasks.gate]
source_count = "wc -l < source.txt"
source_fingerprint = "cksum < source.txt"
tolerance = 0.05
"#;

#[test]
fn late_data_that_arrives_while_a_command_task_runs_is_not_recorded_as_seen() {
    let p = Project::new().dag("late", LATE_WHILE_RUNNING);
    p.write("source.txt", &"row\n".repeat(100));
    let stale = || {
        p.run(&[
            "stale",
            "--dag",
            "late",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
            "--output",
            "json",
        ])
        .json()
    };
    let published = || {
        p.rows("SELECT p.rows, t.source_rows FROM published p JOIN task_tries t ON t.id = p.try_id")
    };
    let first = p.create("late", "2026-01-01", "2026-01-01", &[]);
    // What is recorded of a published try never hides the late line: either nothing was
    // published from the moving source, or the recorded source predates the line.
    assert!(
        published().is_empty() || stale() != serde_json::json!([]),
        "published {:?} with the late line unseen by `stale`",
        published()
    );
    first
        .code(3)
        .stderr_has("the source changed while the task ran (source_count 100 -> 101");
    // `changed` reruns it; the source holds still this time.
    p.create(
        "late",
        "2026-01-01",
        "2026-01-01",
        &["--reprocess-behavior", "changed"],
    )
    .code(0);
    assert_eq!(published(), [["101", "101"]]);
    assert_eq!(stale(), serde_json::json!([]));
}

#[test]
fn a_dag_that_cannot_see_late_rows_is_warned_about_also_with_q() {
    let p = Project::new()
        .dag("counted", COUNTED)
        .dag(
            "blind",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag("watched", WATCHED);
    let range = ["--from", "2026-01-01", "--to", "2026-01-02"];
    for dag in ["counted", "blind", "watched"] {
        p.create(dag, range[1], range[3], &["-q"]).code(0);
    }
    let counted = "warning: DAG `counted` watches its source only through the gate `source_count` of `load` (dags/counted.toml:8:16), which sees a late or removed row only when it changes that count";
    let blind = "warning: no task of DAG `blind` has a gate `source_count` or `source_fingerprint`, so nothing can tell whether a source changed: late or corrected rows go unnoticed";
    for (dag, warning) in [("counted", counted), ("blind", blind)] {
        // A nightly `-q` run says it, so that cron mails it.
        p.create(
            dag,
            range[1],
            range[3],
            &["-q", "--reprocess-behavior", "changed"],
        )
        .code(0)
        .stderr_has(warning);
        let mut stale = vec!["-q", "stale", "--dag", dag];
        stale.extend_from_slice(&range);
        p.run(&stale).code(0).stderr_has(warning);
    }
    // A `source_fingerprint` sees every row: nothing to warn about.
    let quiet = p.create(
        "watched",
        range[1],
        range[3],
        &["-q", "--reprocess-behavior", "changed"],
    );
    quiet.code(0);
    assert_eq!(quiet.stderr, "");
    // `dags validate` warns where the count is written, and still passes.
    let valid = p.run(&["dags", "validate"]);
    valid.code(0).stderr_has(
        "warning: dags/counted.toml:8:16: task `load`: `--reprocess-behavior changed` and `backfill stale` see this source only through `source_count`",
    );
    assert!(!valid.stderr.contains("blind"), "{}", valid.stderr);
    let json = p.run(&["--output", "json", "dags", "validate"]);
    json.code(0);
    let doc = json.json();
    assert_eq!(doc["valid"], true);
    assert_eq!(doc["warnings"][0]["location"], "dags/counted.toml:8:16");
    assert_eq!(doc["warnings"].as_array().unwrap().len(), 1);
}

/// The shop's DAGs see a late order and a corrected amount: `stale` lists those days, a
/// `changed` rerun publishes them, and the monthly summary over them is then stale in turn.
#[test]
fn the_example_dags_see_a_late_order_and_a_corrected_amount() {
    let p = shop();
    let shop = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
    p.write(
        "dags/monthly_revenue.toml",
        &std::fs::read_to_string(shop.join("dags/monthly_revenue.toml")).unwrap(),
    );
    let valid = p.run(&["dags", "validate"]);
    valid.code(0);
    assert!(!valid.stderr.contains("warning"), "{}", valid.stderr);
    p.create(
        "daily_orders",
        "2026-09-01",
        "2026-09-30",
        &["--cascade", "all", "-q"],
    )
    .code(0);
    september(&p, "orders_fact", &["-q"]).code(0);
    // One late order on 2026-09-18, and a corrected amount of an order of 2026-09-14.
    wh(&p)
        .execute_batch(
            "INSERT INTO raw_orders (order_ts, region, amount_cents) VALUES ('2026-09-18 09:00:00', 'eu', 1250);
             UPDATE raw_orders SET amount_cents = amount_cents + 1 WHERE order_id = 2560000;",
        )
        .unwrap();
    let stale = |dag: &str| -> Vec<String> {
        let out = p.run(&[
            "stale",
            "--dag",
            dag,
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-30",
            "--output",
            "json",
        ]);
        out.code(0);
        assert_eq!(out.stderr, "", "no warning for {dag}");
        out.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["interval"]["start"].as_str().unwrap()[..10].to_string())
            .collect()
    };
    assert_eq!(stale("daily_orders"), ["2026-09-14", "2026-09-18"]);
    assert_eq!(stale("orders_fact"), ["2026-09-14", "2026-09-18"]);
    assert_eq!(stale("monthly_revenue"), Vec::<String>::new());
    september(&p, "daily_orders", &["--reprocess-behavior", "changed"])
        .code(0)
        .stderr_has("2 succeeded, 0 failed, 0 rejected, 0 cancelled, 28 skipped");
    let published = |sql: &str| wh_count(&p, sql);
    assert_eq!(
        published("SELECT SUM(orders) FROM daily_orders WHERE day = '2026-09-18'"),
        published("SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '2026-09-18'"),
        "the late order is published"
    );
    // What the month summed changed under it.
    assert_eq!(stale("monthly_revenue"), ["2026-09-01"]);
}

/// A DAG whose only source measure is a count: the gate passes, but `changed` and `stale` see
/// a late row only when it changes the count, and a corrected row never.
const COUNTED: &str = r#"
schedule = "@daily"

[[tasks]]
id = "load"
command = "echo '{\"rows\": 1}' > $BACKFILL_RESULT"
[tasks.gate]
source_count = "echo 1"
"#;

/// `stale` compares the sources of published intervals: an interval whose latest run was
/// rejected is left out, and it says so, with the command that runs them.
#[test]
fn stale_says_which_intervals_it_leaves_out_and_why() {
    let p = shop();
    p.create("orders_fact", "2026-09-01", "2026-09-10", &[])
        .code(0);
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) IN ('2026-09-03', '2026-09-07') AND order_id % 10 = 0",
        )
        .unwrap();
    p.create(
        "orders_fact",
        "2026-09-03",
        "2026-09-03",
        &["--reprocess-behavior", "completed"],
    )
    .code(3);
    p.create(
        "orders_fact",
        "2026-09-07",
        "2026-09-07",
        &["--reprocess-behavior", "completed"],
    )
    .code(3);
    let stale = |quiet: &[&str]| {
        let mut args = quiet.to_vec();
        args.extend([
            "stale",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-10",
        ]);
        p.run(&args)
    };
    let out = stale(&[]);
    out.code(0)
        .stderr_has("(8 published intervals looked at)")
        .stderr_has(&format!(
            "left out: 2 intervals whose latest run did not publish (2 rejected); stale compares the sources of published intervals; run them with `{}`",
            p.hint("create --dag orders_fact --from 2026-09-01 --to 2026-09-10 --reprocess-behavior failed")
        ));
    // Quiet: no notes.
    let quiet = stale(&["-q"]);
    quiet.code(0);
    assert!(!quiet.stderr.contains("left out"), "{}", quiet.stderr);
}
