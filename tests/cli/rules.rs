//! The gate's rules on values (`not_null`, `accepted_values`, `range`, SQL checks, `history`)
//! against the fixture warehouse of `examples/shop` (SQLite); the same rules on a PostgreSQL
//! warehouse are in `postgres.rs`.

use crate::gate::{edit_dag, shop, wh, wh_count};
use crate::support::Project;

/// The gate of `orders_fact` as the example has it, to add rules after.
const GATE_END: &str = "tolerance = 0.02\n";

/// `orders_fact` with `rules` added to its gate.
fn with_rules(rules: &str) -> Project {
    let p = shop();
    add_rules(&p, rules);
    p
}

/// Replaces the example's own rules of `orders_fact` with `rules`.
fn add_rules(p: &Project, rules: &str) {
    let text = p.read("dags/orders_fact.toml");
    let end = text.find(GATE_END).expect("the example's gate") + GATE_END.len();
    p.write("dags/orders_fact.toml", &format!("{}{rules}", &text[..end]));
}

/// The published partition of a day, every column.
fn partition(p: &Project, day: &str) -> Vec<(i64, String, String, i64)> {
    let c = wh(p);
    let mut stmt = c
        .prepare(
            "SELECT order_id, order_ts, region, amount_cents FROM orders_fact WHERE order_day = ?1 ORDER BY order_id",
        )
        .unwrap();
    stmt.query_map([day], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The first order ids of a day's raw orders that `condition` picks, as samples show them.
fn sample_ids(p: &Project, day: &str, condition: &str, shown: &str) -> String {
    let c = wh(p);
    let mut stmt = c
        .prepare(&format!(
            "SELECT order_id, {shown} FROM raw_orders WHERE date(order_ts) = ?1 AND {condition} ORDER BY order_id LIMIT 5"
        ))
        .unwrap();
    let rows: Vec<String> = stmt
        .query_map([day], |r| {
            let id: i64 = r.get(0)?;
            let v: rusqlite::types::Value = r.get(1)?;
            Ok(match v {
                rusqlite::types::Value::Null => format!("(order_id {id})"),
                rusqlite::types::Value::Integer(n) => format!("(order_id {id}, {shown} {n})"),
                rusqlite::types::Value::Text(t) => format!("(order_id {id}, {shown} {t})"),
                other => panic!("{other:?}"),
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows.join(", ")
}

fn thousands(n: i64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn day_count(p: &Project, day: &str, condition: &str) -> i64 {
    wh_count(
        p,
        &format!("SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '{day}' AND {condition}"),
    )
}

const RULES: &str = r#"not_null = ["region"]
accepted_values = { region = ["eu", "us", "apac", "latam", "mea"] }
range = { amount_cents = { min = 500, max = 25499 } }

[[tasks.gate.checks]]
name = "each order on its own day"
sql = "SELECT order_id, order_day FROM output WHERE order_ts < :data_interval_start OR order_ts >= :data_interval_end"
"#;

#[test]
fn each_rule_rejects_with_its_rows_and_the_published_partition_stays() {
    let p = with_rules(RULES);
    p.create("orders_fact", "2026-09-01", "2026-09-02", &[])
        .code(0);
    let day = "2026-09-02";
    let published = partition(&p, day);
    let rows = day_count(&p, day, "1");
    let rerun = |p: &Project| {
        p.create(
            "orders_fact",
            day,
            day,
            &["--reprocess-behavior", "completed"],
        )
    };
    let rejected = |p: &Project, reason: &str| {
        let out = rerun(p);
        out.code(3)
            .stderr_has(&format!("task `load` rejected: {reason}"));
        assert_eq!(partition(p, day), published, "the partition is untouched");
        assert_eq!(
            p.rows("SELECT state, verdict, reasons FROM task_tries ORDER BY id DESC LIMIT 1"),
            [["rejected", "rejected", reason]]
        );
    };

    // A value outside the accepted ones: the rule, the column, how many, and the first five.
    wh(&p)
        .execute_batch(
            "UPDATE raw_orders SET region = 'EU' WHERE date(order_ts) = '2026-09-02' AND region = 'eu'",
        )
        .unwrap();
    let eu = day_count(&p, day, "region = 'EU'");
    assert!(eu > 5);
    rejected(
        &p,
        &format!(
            "accepted_values violated: region is not one of 'eu', 'us', 'apac', 'latam', 'mea' in {eu} of {} rows, e.g. {} ...",
            thousands(rows),
            sample_ids(&p, day, "region = 'EU'", "region")
        ),
    );
    wh(&p)
        .execute_batch("UPDATE raw_orders SET region = 'eu' WHERE region = 'EU'")
        .unwrap();

    // A value out of range, below and above; one violation shows its one row.
    wh(&p)
        .execute_batch(
            "UPDATE raw_orders SET amount_cents = -amount_cents WHERE order_id = (SELECT MIN(order_id) FROM raw_orders WHERE date(order_ts) = '2026-09-02')",
        )
        .unwrap();
    rejected(
        &p,
        &format!(
            "range violated: amount_cents is outside 500 to 25499 in 1 of {} rows, e.g. {}",
            thousands(rows),
            sample_ids(&p, day, "amount_cents < 0", "amount_cents")
        ),
    );
    wh(&p)
        .execute_batch("UPDATE raw_orders SET amount_cents = -amount_cents WHERE amount_cents < 0")
        .unwrap();

    // A NULL where there must be none (the query lost the region of one region's orders), and
    // the SQL check's rows in the same rejection: every rule that fails is named.
    edit_dag(
        &p,
        "orders_fact",
        "order_ts, region, amount_cents",
        "datetime(order_ts, '-1 day') AS order_ts, NULLIF(region, 'mea') AS region, amount_cents",
    );
    let mea = day_count(&p, day, "region = 'mea'");
    let ts = {
        let c = wh(&p);
        let mut stmt = c
            .prepare("SELECT order_id FROM raw_orders WHERE date(order_ts) = '2026-09-02' ORDER BY order_id LIMIT 5")
            .unwrap();
        stmt.query_map([], |r| r.get::<_, i64>(0))
            .unwrap()
            .map(|id| format!("(order_id {}, order_day {day})", id.unwrap()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    rejected(
        &p,
        &format!(
            "not_null violated: region is NULL in {mea} of {} rows, e.g. {} ...; check \"each order on its own day\" failed: {} violations, e.g. {ts} ...",
            thousands(rows),
            sample_ids(&p, day, "region = 'mea'", "NULL"),
            thousands(rows),
        ),
    );
}

#[test]
fn a_warn_check_publishes_and_its_warning_is_recorded_said_and_summed_up() {
    let p = with_rules(
        r#"
[[tasks.gate.checks]]
name = "large orders"
sql = "SELECT order_id, amount_cents FROM output WHERE amount_cents > 25480 ORDER BY order_id"
severity = "warn"
"#,
    );
    let day = "2026-09-03";
    let large = day_count(&p, day, "amount_cents > 25480");
    assert!((1..=5).contains(&large), "{large}");
    let warning = format!(
        "check \"large orders\" failed: {large} {}, e.g. {}",
        if large == 1 {
            "violation"
        } else {
            "violations"
        },
        sample_ids(&p, day, "amount_cents > 25480", "amount_cents")
    );
    let out = p.create("orders_fact", day, day, &[]);
    out.code(0)
        .stderr_has(&format!("warning    {day} task `load`: {warning}"));
    // Published all the same, exactly the source.
    assert_eq!(
        wh_count(
            &p,
            &format!("SELECT COUNT(*) FROM orders_fact WHERE order_day = '{day}'")
        ),
        day_count(&p, day, "1")
    );
    let recorded = format!("warning: {warning}");
    assert_eq!(
        p.rows("SELECT state, verdict, reasons FROM task_tries"),
        [["succeeded", "published", recorded.as_str()]]
    );
    // In `show`, and in the summary (what notify hooks read on stdin).
    let show = p.run(&["show", "1", "--output", "json"]);
    show.code(0);
    assert_eq!(
        show.json()["interval_details"][0]["reasons"],
        recorded.as_str()
    );
    let out = p.create(
        "orders_fact",
        day,
        day,
        &["--reprocess-behavior", "completed", "--output", "json"],
    );
    let doc = out.code(0).json();
    assert_eq!(doc["warned"][0]["task"], "load");
    assert_eq!(doc["warned"][0]["warnings"], recorded.as_str());
    // Counted and named in the summary, marked in `show`, its grid and /metrics (the day before
    // has large orders too).
    let out = p.create(
        "orders_fact",
        "2026-09-02",
        day,
        &["--reprocess-behavior", "completed"],
    );
    out.code(0)
        .stderr_has("published with warnings: 2026-09-02, 2026-09-03 (`backfill -C ")
        .stderr_has(" show 3` shows them)")
        .stderr_has("— 2 succeeded (2 with warnings), 0 failed");
    let table: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("with warnings ┆ 2"))
        .collect();
    assert_eq!(table.len(), 1, "{}", out.stderr);
    p.run(&["show", "3"])
        .code(0)
        .stdout_has("(2 succeeded (2 with warnings), 0 failed");
    p.run(&["show", "3", "--grid"])
        .code(0)
        .stdout_has("2026-09-02  WW\n")
        .stdout_has("W published with warnings 2");
    let s = crate::serve::Server::start(&p, "warned", &[]);
    let page = s.get("/backfills/3");
    assert!(
        page.body
            .contains(r#"data-interval="2026-09-03T00:00:00Z" data-state="warned""#),
        "{}",
        page.body
    );
    let metrics = s.get("/metrics");
    // One warning in each of the three runs of 09-03, and in the one of 09-02.
    let line = "backfill_warnings_total{dag=\"orders_fact\",rule=\"check:large orders\"} 4";
    assert!(
        metrics.body.lines().any(|l| l == line),
        "no `{line}` in\n{}",
        metrics.body
    );
    drop(s);
    // A quiet run says nothing of it.
    let quiet = p.create(
        "orders_fact",
        day,
        day,
        &["--reprocess-behavior", "completed", "-q"],
    );
    quiet.code(0);
    assert_eq!(quiet.stderr, "");
}

#[test]
fn history_rejects_a_half_loaded_source_that_the_source_count_agrees_with() {
    let p = with_rules("history = { partitions = 3, tolerance = 0.5 }\n");
    // The first partitions have less history than asked: noted with their tries (not said on
    // stderr, where a new table would fill the screen), and judged against what there is.
    let out = p.create(
        "orders_fact",
        "2026-09-01",
        "2026-09-04",
        &["--max-active-runs", "1"],
    );
    out.code(0);
    assert!(!out.stderr.contains("history"), "{}", out.stderr);
    assert_eq!(
        p.rows("SELECT reasons FROM task_tries ORDER BY id"),
        [
            ["note: history: no published partition before this one (3 asked); not judged"],
            ["note: history: judged against only 1 published partition before this one (3 asked)"],
            ["note: history: judged against only 2 published partitions before this one (3 asked)"],
            ["NULL"],
        ]
    );
    // Day 5's source is loaded by a third: its own count agrees, so only history sees it.
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-05' AND order_id % 5 <> 0",
        )
        .unwrap();
    let rows = day_count(&p, "2026-09-05", "1");
    let mut before: Vec<i64> = ["2026-09-02", "2026-09-03", "2026-09-04"]
        .iter()
        .map(|d| day_count(&p, d, "1"))
        .collect();
    before.sort_unstable();
    let median = before[1];
    let diff = (median - rows) as f64 / median as f64 * 100.0;
    let out = p.create("orders_fact", "2026-09-05", "2026-09-05", &[]);
    out.code(3).stderr_has(&format!(
        "history: row count {} differs from {}, the median of the last 3 published partitions, by {diff:.1}% (tolerance 50.0%); rerun with --allow-drift to accept",
        thousands(rows),
        thousands(median)
    ));
    assert_eq!(partition(&p, "2026-09-05").len(), 0, "nothing published");
    // Accepted when asked.
    p.create(
        "orders_fact",
        "2026-09-05",
        "2026-09-05",
        &["--reprocess-behavior", "failed", "--allow-drift"],
    )
    .code(0);
    assert_eq!(partition(&p, "2026-09-05").len() as i64, rows);
}

#[test]
fn a_check_that_errors_while_it_runs_fails_the_try_and_is_retried() {
    let p = with_rules(
        r#"
[[tasks.gate.checks]]
name = "overflows"
sql = "SELECT order_id FROM output WHERE abs(-9223372036854775807 - 1 + order_id * 0) > 0"
"#,
    );
    edit_dag(
        &p,
        "orders_fact",
        "max_active_runs = 4\n",
        "max_active_runs = 4\nretries = 1\nretry_delay = \"0s\"\n",
    );
    let out = p.create("orders_fact", "2026-09-01", "2026-09-01", &[]);
    out.code(3).stderr_has("integer overflow");
    assert_eq!(
        p.rows("SELECT state FROM task_tries ORDER BY id"),
        [["failed"], ["failed"]],
        "never passed, and tried again"
    );
    assert_eq!(partition(&p, "2026-09-01").len(), 0);
}

#[test]
fn dags_validate_names_a_check_that_does_not_prepare_by_file_and_line() {
    let p = with_rules(
        r#"
[[tasks.gate.checks]]
name = "typo"
sql = """
SELECT order_id
FORM output WHERE amount_cents < 0
"""
"#,
    );
    let line = p
        .read("dags/orders_fact.toml")
        .lines()
        .position(|l| l == "name = \"typo\"")
        .unwrap()
        + 2;
    // Read as SQLite reads it before anything runs: the parser's words, at the word it stopped
    // at (`FORM` is taken for an alias).
    let out = p.run(&["dags", "validate"]);
    out.code(2).stderr_has(&format!(
        "dags/orders_fact.toml:{}:6: check \"typo\" of task `load` cannot be read as one SQLite query (Expected: end of statement, found: output); what a query does must be known before it runs, see docs/gate.md#what-a-query-may-do",
        line + 2
    ));
    // The backfill refuses it too, before anything is written.
    p.create("orders_fact", "2026-09-01", "2026-09-01", &[])
        .code(2)
        .stderr_has("check \"typo\" of task `load` cannot be read as one SQLite query");
    assert!(!p.has_manifest() || p.count("SELECT COUNT(*) FROM runs") == 0);

    // A check is a table expression of its own: a column it does not find in its own tables is
    // an error, never a column of the output's row around it.
    let p = with_rules(
        "[[tasks.gate.checks]]\nname = \"unbound\"\nsql = \"SELECT order_id FROM raw_orders WHERE order_day IS NULL\"\n",
    );
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("check \"unbound\" does not prepare: no such column: order_day");
    // A rule on a column the output does not have.
    let p = with_rules("not_null = [\"regoin\"]\n");
    p.run(&["dags", "validate"]).code(2).stderr_has(
        "task `load`: rule `not_null`: the output has no column `regoin` (it has: order_id, order_day, order_ts, region, amount_cents)",
    );
}

#[test]
fn rules_written_wrong_are_named_at_their_line() {
    let cases: &[(&str, &str)] = &[
        (
            "[[tasks.gate.checks]]\nname = \"x\"\nsql = \"SELECT 1\"\nseverity = \"fatal\"\n",
            ":4:12: key `severity` is \"error\" (reject the try, the default) or \"warn\" (record and publish), not `fatal`",
        ),
        (
            "range = { amount_cents = {} }\n",
            ":1:11: key `range`: `amount_cents` has neither `min` nor `max`",
        ),
        (
            "range = { amount_cents = { min = 10, max = 1 } }\n",
            ":1:11: key `range`: `amount_cents` has `min` above `max`; no value could pass",
        ),
        (
            "accepted_values = { region = [] }\n",
            ":1:21: key `accepted_values`: `region` lists no value",
        ),
        (
            "history = { partitions = 0, tolerance = 0.5 }\n",
            ":1:26: key `partitions` of `history` must be a whole number from 1 to 1000",
        ),
        (
            "history = { partitions = 7 }\n",
            ":1:11: key `history` needs `tolerance`",
        ),
        (
            "[[tasks.gate.checks]]\nsql = \"SELECT 1\"\n",
            ":1:1: check 1 of task `load` has no `name`",
        ),
        (
            "[[tasks.gate.checks]]\nname = \"x\"\ncommand = \"echo 0\"\n",
            ":3:11: check 1 of task `load`: a SQL task's check is a `sql` query over the table `output` whose rows are the violations, not a `command`",
        ),
        (
            "not_null = [\"order id\"]\n",
            ":1:13: key `not_null`: `order id` is not a plain SQL column name",
        ),
    ];
    for (rules, expected) in cases {
        let p = with_rules(rules);
        let first = p.read("dags/orders_fact.toml").lines().count() - rules.lines().count() + 1;
        let (at, message) = expected.split_once(": ").unwrap();
        let (line, col) = at.trim_start_matches(':').split_once(':').unwrap();
        let line: usize = line.parse::<usize>().unwrap() + first - 1;
        let out = p.run(&["dags", "validate"]);
        out.code(2)
            .stderr_has(&format!("dags/orders_fact.toml:{line}:{col}: {message}"));
        assert!(!p.has_manifest(), "nothing written for {rules}");
    }
}

#[test]
fn a_command_tasks_check_counts_violations_and_rejects() {
    let p = Project::new().dag(
        "export",
        r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "export"
command = "echo '{\"rows\": 10}' > $BACKFILL_RESULT"

[tasks.gate]
history = { partitions = 2, tolerance = 0.5 }

[[tasks.gate.checks]]
name = "no orphans"
command = "cat orphans-{{ ds }} 2>/dev/null || echo 0"
"#,
    );
    p.create("export", "2026-01-01", "2026-01-01", &[]).code(0);
    p.write("orphans-2026-01-02", "3\n");
    p.create("export", "2026-01-02", "2026-01-02", &[])
        .code(3)
        .stderr_has("task `export` rejected: check \"no orphans\" failed: 3 violations");
    p.write("orphans-2026-01-02", "many\n");
    p.create(
        "export",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "failed"],
    )
    .code(3)
    .stderr_has("check \"no orphans\": its command printed `many`, not the number of violations");
    // A rule on values needs rows in a table.
    let p = Project::new().dag(
        "export",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"export\"\ncommand = \"true\"\n[tasks.gate]\nnot_null = [\"id\"]\n",
    );
    p.run(&["dags", "validate"]).code(2).stderr_has(
        "dags/export.toml:6:13: task `export`: `not_null` needs a SQL task (its rows are audited in a table); for a command task, write a [[tasks.gate.checks]] with a `command` that prints the number of violations",
    );
}

#[test]
fn a_staged_output_that_a_rule_rejects_is_never_staged_and_verify_reports_it() {
    let p = with_rules("range = { amount_cents = { max = 20000 } }\n");
    let above = day_count(&p, "2026-09-01", "amount_cents > 20000");
    assert!(above > 0);
    p.create("orders_fact", "2026-09-01", "2026-09-01", &["--stage"])
        .code(3)
        .stderr_has("range violated: amount_cents is above 20000");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE staged IS NOT NULL"),
        0
    );
    p.run(&["promote", "1"])
        .code(0)
        .stderr_has("nothing to promote");
    assert_eq!(partition(&p, "2026-09-01").len(), 0);
    let out = p.run(&[
        "verify",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-01",
    ]);
    out.code(3)
        .stdout_has("would be rejected")
        .stderr_has("task `load` for interval 2026-09-01 would be rejected by its gate: range violated: amount_cents is above 20000 in ")
        .stderr_has("1 would be rejected");
}

#[test]
fn a_gate_of_checks_alone_counts_once_and_an_empty_partition_still_publishes() {
    let p = with_rules(
        r#"allow_empty = true

[[tasks.gate.checks]]
name = "no free orders"
sql = "SELECT order_id FROM output WHERE amount_cents = 0"
"#,
    );
    // Without a source count, an empty output is an empty source.
    let text = p.read("dags/orders_fact.toml");
    let open = "source_count = \"\"\"";
    let start = text.find(open).unwrap();
    let end = text[start + open.len()..].find("\"\"\"\n").unwrap() + start + open.len() + 4;
    p.write(
        "dags/orders_fact.toml",
        &format!("{}{}", &text[..start], &text[end..]),
    );
    wh(&p)
        .execute_batch("DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-02'")
        .unwrap();
    p.create("orders_fact", "2026-09-01", "2026-09-02", &[])
        .code(0);
    assert_eq!(
        p.rows("SELECT t.rows, t.verdict FROM task_tries t JOIN runs r ON r.id = t.run_id ORDER BY r.interval_start"),
        [
            [
                day_count(&p, "2026-09-01", "1").to_string().as_str(),
                "published"
            ],
            ["0", "published empty"]
        ]
    );
}

/// A check, `source_count`, `source_fingerprint` and the task's `sql` are each one read-only
/// query of SQLite: what writes or holds more than one statement is refused by `dags validate`
/// and `create` at its place (exit 2), before anything runs or is recorded.
#[test]
fn a_query_that_writes_is_refused_before_anything_runs() {
    let p = shop();
    let raw = wh_count(&p, "SELECT COUNT(*) FROM raw_orders");
    let fact = p.read("dags/orders_fact.toml");
    let check = |sql: &str| {
        format!("[[tasks.gate.checks]]\nname = \"hostile\"\nseverity = \"warn\"\nsql = \"{sql}\"\n")
    };
    let cases: [(String, &str); 5] = [
        (
            format!("{fact}{}", check("DELETE FROM raw_orders RETURNING *")),
            "check \"hostile\" of task `load` must be one read-only query (a SELECT, or WITH ... SELECT): `DELETE` is a statement, not a query",
        ),
        (
            format!(
                "{fact}{}",
                check("SELECT 1 WHERE 0), evil AS (SELECT 1), pad AS (SELECT 1")
            ),
            "check \"hostile\" of task `load` cannot be read as one SQLite query (Expected: end of statement, found: ))",
        ),
        (
            format!("{fact}{}", check("SELECT 1; DELETE FROM raw_orders")),
            "check \"hostile\" of task `load` must be one read-only query (a SELECT, or WITH ... SELECT): it holds 2 statements",
        ),
        (
            fact.replacen(
                "source_count = \"\"\"\n",
                "source_count = \"\"\"\nWITH d AS (DELETE FROM raw_orders RETURNING *)\n",
                1,
            ),
            "key `source_count` must be one read-only query (a SELECT, or WITH ... SELECT): `DELETE` inside it writes to the warehouse",
        ),
        (
            fact.replacen(
                "sql = \"\"\"\nSELECT order_id, date(order_ts) AS order_day, order_ts, region, amount_cents\nFROM raw_orders\n",
                "sql = \"\"\"\nUPDATE raw_orders SET region = 'x'\n",
                1,
            ),
            "key `sql` must be one read-only query (a SELECT, or WITH ... SELECT): `UPDATE` is a statement, not a query",
        ),
    ];
    for (toml, said) in cases {
        p.write("dags/orders_fact.toml", &toml);
        p.run(&["dags", "validate"])
            .code(2)
            .stderr_has(said)
            .stderr_has("error: dags/orders_fact.toml:");
        p.create("orders_fact", "2026-09-01", "2026-09-01", &[])
            .code(2)
            .stderr_has(said);
        assert!(!p.has_manifest(), "{said}: nothing recorded");
        assert_eq!(wh_count(&p, "SELECT COUNT(*) FROM raw_orders"), raw);
        assert_eq!(
            wh_count(&p, "SELECT COUNT(*) FROM raw_orders WHERE region = 'x'"),
            0
        );
    }
    // The place is the statement's: `DELETE` in the source_count's second line.
    p.write(
        "dags/orders_fact.toml",
        &fact.replacen(
            "source_count = \"\"\"\n",
            "source_count = \"\"\"\nWITH d AS (DELETE FROM raw_orders RETURNING *)\n",
            1,
        ),
    );
    let line = fact
        .lines()
        .position(|l| l.starts_with("source_count"))
        .unwrap()
        + 2;
    p.run(&["dags", "validate"]).code(2).stderr_has(&format!(
        "error: dags/orders_fact.toml:{line}:12: key `source_count` must be one read-only query"
    ));
}

/// A `range` with numeric bounds compares numbers, also where the query gives them as text
/// (SQLite would compare a TEXT column with a number as text: '900' > '30000'), and a value
/// outside it is shown as it is stored.
#[test]
fn a_numeric_range_compares_numbers_stored_as_text_as_numbers() {
    let p = shop();
    edit_dag(
        &p,
        "orders_fact",
        "SELECT order_id, date(order_ts) AS order_day, order_ts, region, amount_cents",
        "SELECT order_id, date(order_ts) AS order_day, order_ts, region, CAST(amount_cents AS TEXT) AS amount_cents",
    );
    let max = wh_count(&p, "SELECT MAX(amount_cents) FROM raw_orders");
    let under = wh_count(
        &p,
        "SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '2026-09-01' AND amount_cents < 10000",
    );
    assert!(
        under > 0 && max >= 10000,
        "the day has amounts of 4 and 5 digits"
    );
    add_rules(
        &p,
        &format!("range = {{ amount_cents = {{ min = 1, max = {max} }} }}\n"),
    );
    p.create("orders_fact", "2026-09-01", "2026-09-01", &[])
        .code(0);
    assert_eq!(
        partition(&p, "2026-09-01").len() as i64,
        day_count(&p, "2026-09-01", "1")
    );
    // One order above the bound, one below, and one that is no number at all.
    let ids: Vec<i64> = {
        let c = wh(&p);
        let mut stmt = c
            .prepare("SELECT order_id FROM raw_orders WHERE date(order_ts) = '2026-09-02' ORDER BY order_id LIMIT 3")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    wh(&p)
        .execute_batch(&format!(
            "UPDATE raw_orders SET amount_cents = {} WHERE order_id = {};
             UPDATE raw_orders SET amount_cents = 0 WHERE order_id = {};
             UPDATE raw_orders SET amount_cents = 'n/a' WHERE order_id = {};",
            max * 10,
            ids[0],
            ids[1],
            ids[2]
        ))
        .unwrap();
    p.create("orders_fact", "2026-09-02", "2026-09-02", &[])
        .code(3)
        .stderr_has(&format!(
            "range violated: amount_cents is outside 1 to {max} in 3 of {} rows, e.g. (order_id {}, amount_cents {}), (order_id {}, amount_cents 0), (order_id {}, amount_cents n/a)",
            thousands(day_count(&p, "2026-09-02", "1")),
            ids[0],
            max * 10,
            ids[1],
            ids[2]
        ));
    assert_eq!(partition(&p, "2026-09-02").len(), 0, "nothing published");
}

/// `history` judges nothing when the median of the published partitions is 0 rows, and says
/// so with the try, as it does when there are fewer partitions than asked.
#[test]
fn history_says_when_the_median_it_would_judge_against_is_zero() {
    let p = with_rules("history = { partitions = 2, tolerance = 0.5 }\nallow_empty = true\n");
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) IN ('2026-09-01', '2026-09-02')",
        )
        .unwrap();
    p.create(
        "orders_fact",
        "2026-09-01",
        "2026-09-03",
        &["--max-active-runs", "1"],
    )
    .code(0);
    assert_eq!(
        p.rows("SELECT verdict, reasons FROM task_tries ORDER BY id"),
        [
            [
                "published empty",
                "empty source; note: history: no published partition before this one (2 asked); not judged"
            ],
            [
                "published empty",
                "empty source; note: history: the median of only 1 published partition before this one (2 asked) is 0 rows; not judged"
            ],
            [
                "published",
                "note: history: the median of the last 2 published partitions is 0 rows; not judged"
            ],
        ]
    );
}
