//! `create --stage`, `diff`, `promote`, `discard` and `rollback` on the shop's fixture
//! warehouse: the published table never changes before a promote; a promote publishes each
//! partition once, also after a `kill -9`; a rollback puts back the exact previous rows.

use crate::gate::{shop, wh, wh_count, wh_rows};
use crate::support::Project;

fn run(p: &Project, args: &[&str]) -> crate::support::Out {
    p.run(args)
}

fn create(p: &Project, from: &str, to: &str, extra: &[&str]) -> crate::support::Out {
    p.create("orders_fact", from, to, extra)
}

/// Every published row of `orders_fact`, in order.
pub(crate) fn published(p: &Project) -> Vec<String> {
    wh_rows(p, "SELECT * FROM orders_fact ORDER BY order_id")
}

/// `orders_fact` for one day, and what the raw orders say it must hold.
pub(crate) fn day_is_exact(p: &Project, day: &str) -> bool {
    wh_rows(
        p,
        &format!(
            "SELECT order_id, order_day, order_ts, region, amount_cents FROM orders_fact
             WHERE order_day = '{day}' ORDER BY order_id"
        ),
    ) == wh_rows(
        p,
        &format!(
            "SELECT order_id, date(order_ts), order_ts, region, amount_cents FROM raw_orders
             WHERE date(order_ts) = '{day}' ORDER BY order_id"
        ),
    )
}

/// The smallest order ids of a day.
fn first_orders(p: &Project, day: &str, n: usize) -> Vec<i64> {
    let c = wh(p);
    let mut stmt = c
        .prepare(&format!(
            "SELECT order_id FROM raw_orders WHERE date(order_ts) = '{day}' ORDER BY order_id LIMIT {n}"
        ))
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Changes the raw orders of three days: 3 amounts on 09-03, 2 orders gone on 09-04, 1 new
/// order on 09-05. Returns the ids changed, removed, and the new one.
fn change_the_source(p: &Project) -> (Vec<i64>, Vec<i64>, i64) {
    let changed = first_orders(p, "2026-09-03", 3);
    let removed = first_orders(p, "2026-09-04", 2);
    let c = wh(p);
    c.execute_batch(&format!(
        "UPDATE raw_orders SET amount_cents = amount_cents + 1 WHERE order_id IN ({});
         DELETE FROM raw_orders WHERE order_id IN ({});
         INSERT INTO raw_orders (order_ts, region, amount_cents) VALUES ('2026-09-05 12:00:00', 'north', 777);",
        join(&changed),
        join(&removed)
    ))
    .unwrap();
    let added = c.last_insert_rowid();
    (changed, removed, added)
}

fn join(ids: &[i64]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_staged_backfill_is_reviewed_then_promoted_or_discarded() {
    let p = shop();
    create(&p, "2026-09-01", "2026-09-05", &[]).code(0);
    let (changed, removed, added) = change_the_source(&p);
    let before = published(&p);

    // Staging computes and audits everything and publishes nothing.
    create(
        &p,
        "2026-09-01",
        "2026-09-05",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0)
    .stderr_has("backfill 2 of orders_fact: staged — 5 succeeded");
    assert_eq!(published(&p), before, "the published table is untouched");
    assert_eq!(
        p.rows(
            "SELECT r.state, t.verdict, t.staged FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE r.backfill_id = 2 ORDER BY r.interval_start"
        ),
        vec![vec!["succeeded", "staged", "staged"]; 5]
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM published WHERE try_id > 5"),
        0
    );
    let show = run(&p, &["show", "2", "--output", "json"]);
    assert_eq!(show.json()["state"], "staged");
    assert_eq!(show.json()["kind"], "stage");
    run(&p, &["list"])
        .code(0)
        .stdout_has(&format!("staged (awaits `{}`)", p.hint("promote 2")));
    // A staged run is not a publish: a plain create still sees the intervals as published by
    // backfill 1 (nothing to do), not as staged.
    create(
        &p,
        "2026-09-01",
        "2026-09-05",
        &["--dry-run", "--output", "json"],
    )
    .code(0)
    .json()["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .for_each(|i| assert_eq!(i["reason"], "already exists", "{i}"));

    // The diff names the exact keys.
    let diff = run(&p, &["diff", "2", "--output", "json"]);
    diff.code(0);
    let doc = diff.json();
    let rows = doc.as_array().unwrap();
    assert_eq!(rows.len(), 5);
    let at = |day: &str| {
        rows.iter()
            .find(|r| r["interval"]["start"] == format!("{day}T00:00:00Z"))
            .unwrap()
            .clone()
    };
    let unchanged = at("2026-09-01");
    assert_eq!(unchanged["same_fingerprint"], true);
    assert_eq!(unchanged["change_pct"], 0.0);
    assert_eq!(unchanged["keys"]["added"], 0);
    assert_eq!(unchanged["keys"]["removed"], 0);
    assert_eq!(unchanged["keys"]["changed"], 0);
    let d3 = at("2026-09-03");
    assert_eq!(d3["task"], "load");
    assert_eq!(d3["same_fingerprint"], false);
    assert_eq!(d3["published_rows"], d3["staged_rows"]);
    assert_eq!(d3["keys"]["changed"], 3);
    assert_eq!(
        d3["keys"]["examples"]["changed"],
        serde_json::json!(changed)
    );
    assert_eq!(d3["keys"]["added"], 0);
    let d4 = at("2026-09-04");
    assert_eq!(d4["keys"]["removed"], 2);
    assert_eq!(
        d4["keys"]["examples"]["removed"],
        serde_json::json!(removed)
    );
    assert_eq!(
        d4["staged_rows"].as_i64().unwrap(),
        d4["published_rows"].as_i64().unwrap() - 2
    );
    let d5 = at("2026-09-05");
    assert_eq!(d5["keys"]["added"], 1);
    assert_eq!(d5["keys"]["examples"]["added"], serde_json::json!([added]));
    // The table says the same for humans, with the example keys.
    run(&p, &["diff", "2", "--interval", "2026-09-04"])
        .code(0)
        .stdout_has(&format!("2026-09-04 load: removed {}", join(&removed)));

    // Promote two days: those two are published exactly, the others are not touched.
    run(
        &p,
        &[
            "promote",
            "2",
            "--interval",
            "2026-09-03",
            "--interval",
            "2026-09-04",
        ],
    )
    .code(0)
    .stderr_has("backfill 3 of orders_fact: 2 intervals, 2 to run, 0 skipped");
    assert!(day_is_exact(&p, "2026-09-03"));
    assert!(day_is_exact(&p, "2026-09-04"));
    assert!(
        !day_is_exact(&p, "2026-09-05"),
        "09-05 is still the old one"
    );
    assert_eq!(
        p.rows(
            "SELECT t.verdict, s.staged, p.try_id = t.id FROM task_tries t
             JOIN task_tries s ON s.id = t.promoted_from
             JOIN runs r ON r.id = t.run_id
             JOIN published p ON p.interval_start = r.interval_start AND p.task_id = t.task_id
             WHERE r.backfill_id = 3 ORDER BY r.interval_start"
        ),
        vec![vec!["published", "promoted", "1"]; 2],
        "each promote try links to its staged try and is what is published"
    );
    // Promoting the same days again is harmless.
    let again = run(&p, &["promote", "2", "--interval", "2026-09-03"]);
    again
        .code(0)
        .stderr_has("nothing to promote: no output of backfill 2 in those intervals awaits promotion (1 promoted, 0 discarded)");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM backfills"),
        3,
        "no new backfill"
    );
    // An interval with no staged output is an error, and nothing is written.
    run(&p, &["promote", "2", "--interval", "2026-10-01"])
        .code(2)
        .stderr_has("--interval 2026-10-01 selects no staged interval of backfill 2");

    // Discard the rest: recorded, the files go, and the staged backfill is complete.
    let after_promote = published(&p);
    run(&p, &["discard", "2"])
        .code(0)
        .stderr_has("discarded 3 staged outputs of backfill 2");
    assert_eq!(published(&p), after_promote);
    assert_eq!(
        p.rows(
            "SELECT staged, COUNT(*) FROM task_tries WHERE staged IS NOT NULL GROUP BY 1 ORDER BY 1"
        ),
        [["discarded", "3"], ["promoted", "2"]]
    );
    assert_eq!(
        std::fs::read_dir(p.path(".backfill/audit"))
            .unwrap()
            .count(),
        0,
        "no staged file is left"
    );
    assert_eq!(
        p.rows("SELECT state FROM backfills WHERE id = 2"),
        [["completed"]]
    );
    run(&p, &["promote", "2"])
        .code(0)
        .stderr_has("nothing to promote");
}

#[test]
fn a_promote_killed_in_the_middle_publishes_each_partition_once() {
    for (fault, finish) in [("after-publish", "promote"), ("before-publish", "resume")] {
        let p = shop();
        create(&p, "2026-09-01", "2026-09-04", &[]).code(0);
        change_the_source(&p);
        create(
            &p,
            "2026-09-01",
            "2026-09-04",
            &["--stage", "--reprocess-behavior", "completed"],
        )
        .code(0);
        let killed = p
            .command(&["promote", "2"])
            .env("BACKFILL_FAULT", fault)
            .output()
            .unwrap();
        assert_eq!(killed.status.code(), None, "{fault}: died of a signal");
        match finish {
            "promote" => run(&p, &["promote", "2"]).code(0),
            _ => run(&p, &["resume", "3"]).code(0),
        };
        for day in ["2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"] {
            assert!(day_is_exact(&p, day), "{fault}: {day}");
        }
        assert_eq!(
            p.rows(
                "SELECT promoted_from, COUNT(*) FROM task_tries
                 WHERE promoted_from IS NOT NULL AND state = 'succeeded' AND verdict = 'published'
                 GROUP BY promoted_from ORDER BY promoted_from"
            ),
            [["5", "1"], ["6", "1"], ["7", "1"], ["8", "1"]]
                .iter()
                .map(|r| r.iter().map(ToString::to_string).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
            "{fault}: one publishing try per staged output"
        );
        assert_eq!(
            p.count("SELECT COUNT(*) FROM task_tries WHERE staged = 'promoted'"),
            4
        );
        // Each changed partition was replaced once: one kept version per changed day, of
        // backfill 1's rows (09-01 and 09-02 were published again unchanged: nothing to keep).
        // Backfill 1's tries ran at once, so their ids are read, not assumed.
        let first_try = |start: i64| {
            p.count(&format!(
                "SELECT t.id FROM task_tries t JOIN runs r ON r.id = t.run_id
                 WHERE r.backfill_id = 1 AND r.interval_start = {start}"
            ))
        };
        assert_eq!(
            wh_rows(
                &p,
                "SELECT interval_start, version_of FROM _backfill_versions ORDER BY 1"
            ),
            [1_788_393_600, 1_788_480_000]
                .map(|start| format!("Integer({start})|Integer({})", first_try(start))),
            "{fault}"
        );
        assert_eq!(
            std::fs::read_dir(p.path(".backfill/audit"))
                .unwrap()
                .count(),
            0,
            "{fault}: nothing left behind"
        );
    }
}

#[test]
fn rollback_restores_the_exact_previous_rows() {
    let p = shop();
    create(&p, "2026-09-01", "2026-09-03", &[]).code(0);
    let day = |d: &str| {
        wh_rows(
            &p,
            &format!("SELECT * FROM orders_fact WHERE order_day = '{d}' ORDER BY order_id"),
        )
    };
    let first = day("2026-09-02");
    // A bad rerun: 09-02's amounts are doubled at the source, and published.
    wh(&p)
        .execute_batch(
            "UPDATE raw_orders SET amount_cents = amount_cents * 2 WHERE date(order_ts) = '2026-09-02'",
        )
        .unwrap();
    create(
        &p,
        "2026-09-02",
        "2026-09-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_ne!(day("2026-09-02"), first);
    run(&p, &["show", "2"])
        .code(0)
        .stdout_has("kept for rollback in `orders_fact`: 1 version,");
    let untouched = (day("2026-09-01"), day("2026-09-03"));

    // The rollback of 09-01..09-03: 09-02 goes back; 09-01 and 09-03 were published once and
    // have nothing to go back to, so they are reported and left alone.
    run(
        &p,
        &[
            "rollback",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-03",
        ],
    )
    .code(3)
    .stderr_has("for 2026-09-01 failed: no earlier version is kept")
    .stderr_has("for 2026-09-03 failed: no earlier version is kept")
    .stderr_has("failed 2026-09-01: as written above; log: ")
    .stderr_has("failed 2026-09-03: as written above; log: ")
    .stderr_has("backfill 3 of orders_fact: failed — 1 succeeded, 2 failed");
    let doc = p.run(&["show", "3", "--output", "json"]).json();
    assert_eq!(doc["kind"], "rollback");
    assert_eq!(doc["state"], "failed");
    // A failed rollback is not a failed run of the interval: a plain create still sees each
    // interval as published.
    let dry = create(
        &p,
        "2026-09-01",
        "2026-09-03",
        &[
            "--reprocess-behavior",
            "failed",
            "--dry-run",
            "--output",
            "json",
        ],
    );
    assert_eq!(dry.json()["to_run"], 0);
    assert_eq!(day("2026-09-02"), first, "the exact previous rows");
    assert_eq!((day("2026-09-01"), day("2026-09-03")), untouched);
    // The manifest says what the warehouse holds: the rollback put back backfill 1's rows.
    let first_try = p.rows(
        "SELECT t.id FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE r.backfill_id = 1 AND r.interval_start = 1788307200",
    )[0][0]
        .clone();
    assert_eq!(
        p.rows(
            "SELECT t.verdict, t.restored_from, p.rows, t.previous_rows FROM published p
             JOIN task_tries t ON t.id = p.try_id WHERE p.interval_start = 1788307200"
        ),
        [[
            "rolled back".to_string(),
            first_try,
            first.len().to_string(),
            first.len().to_string()
        ]]
    );
    run(
        &p,
        &[
            "runs",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-02",
            "--to",
            "2026-09-02",
        ],
    )
    .code(0)
    .stdout_has("rolled back");
    assert_eq!(
        wh_count(&p, "SELECT COUNT(*) FROM _backfill_versions"),
        0,
        "the version put back is the partition again"
    );
    // Nothing older is kept (keep_versions = 1): a second rollback is an error, changes nothing.
    run(
        &p,
        &[
            "rollback",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-02",
            "--to",
            "2026-09-02",
        ],
    )
    .code(3)
    .stderr_has("for 2026-09-02 failed: no earlier version is kept")
    .stderr_has("failed 2026-09-02: as written above; log: ");
    assert_eq!(day("2026-09-02"), first);
    assert_eq!(
        p.rows("SELECT t.verdict FROM published p JOIN task_tries t ON t.id = p.try_id WHERE p.interval_start = 1788307200"),
        [["rolled back"]],
        "the failed rollback changed nothing"
    );
}

#[test]
fn keep_versions_decides_how_far_back_a_rollback_goes() {
    let p = shop();
    let toml = p.read("dags/orders_fact.toml").replace(
        "partition_column = \"order_day\"",
        "partition_column = \"order_day\"\nkeep_versions = 2",
    );
    p.write("dags/orders_fact.toml", &toml);
    let day = || {
        wh_rows(
            &p,
            "SELECT * FROM orders_fact WHERE order_day = '2026-09-02' ORDER BY order_id",
        )
    };
    let mut versions = Vec::new();
    for factor in [1, 2, 3] {
        wh(&p)
            .execute(
                "UPDATE raw_orders SET amount_cents = amount_cents * ?1 WHERE date(order_ts) = '2026-09-02'",
                [factor],
            )
            .unwrap();
        create(
            &p,
            "2026-09-02",
            "2026-09-02",
            &["--reprocess-behavior", "completed"],
        )
        .code(0);
        versions.push(day());
    }
    // Three publishes, two kept versions: back twice, then no further.
    let back = || {
        p.run(&[
            "rollback",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-02",
            "--to",
            "2026-09-02",
        ])
    };
    back().code(0);
    assert_eq!(day(), versions[1]);
    back().code(0);
    assert_eq!(day(), versions[0]);
    back().code(3);
    assert_eq!(day(), versions[0]);

    // keep_versions = 0 keeps nothing, and drops what was kept.
    let p = shop();
    let toml = p.read("backfill.toml").replace(
        "init = [\"schema.sql\", \"seed.sql\"]",
        "init = [\"schema.sql\", \"seed.sql\"]\nkeep_versions = 0",
    );
    p.write("backfill.toml", &toml);
    create(&p, "2026-09-02", "2026-09-02", &[]).code(0);
    create(
        &p,
        "2026-09-02",
        "2026-09-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM sqlite_schema WHERE name LIKE '_backfill_kept%'"
        ),
        0
    );
}

#[test]
fn a_staged_command_task_publishes_only_when_promoted() {
    let p = Project::new().dag(
        "cmd",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 2, "fingerprint": "f-{{ ds }}"}' > "$BACKFILL_RESULT"'''
publish = '''cp "$BACKFILL_RESULT" "published-{{ ds }}-run{{ run_id }}"'''
[tasks.gate]
source_count = "echo 2"
"#,
    );
    p.create("cmd", "2026-01-01", "2026-01-02", &["--stage"])
        .code(0);
    let published = || {
        let mut v: Vec<String> = std::fs::read_dir(p.path("."))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("published-"))
            .collect();
        v.sort();
        v
    };
    assert!(published().is_empty(), "publish waits for promote");
    let diff = p.run(&["diff", "1", "--output", "json"]);
    assert_eq!(diff.json()[0]["staged_rows"], 2);
    assert_eq!(diff.json()[0]["published_rows"], serde_json::Value::Null);
    assert_eq!(diff.json()[0]["keys"], serde_json::Value::Null);
    p.run(&["promote", "1"]).code(0);
    // `publish` ran as for the staged try: its run id, its result file.
    assert_eq!(
        published(),
        ["published-2026-01-01-run1", "published-2026-01-02-run2"]
    );
    assert_eq!(
        p.read("published-2026-01-02-run2"),
        r#"{"rows": 2, "fingerprint": "f-2026-01-02"}"#
    );
    assert_eq!(
        p.rows("SELECT task_id, rows, fingerprint FROM published ORDER BY interval_start"),
        [
            ["export", "2", "f-2026-01-01"],
            ["export", "2", "f-2026-01-02"]
        ]
    );
}

#[test]
fn resume_of_a_killed_staging_continues_staging() {
    let p = shop();
    create(&p, "2026-09-01", "2026-09-04", &[]).code(0);
    change_the_source(&p);
    let before = published(&p);
    let killed = p
        .command(&[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-04",
            "--stage",
            "--reprocess-behavior",
            "completed",
            "--max-active-runs",
            "1",
        ])
        .env("BACKFILL_FAULT", "after-audit@2")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None);
    run(&p, &["resume", "2"])
        .code(0)
        .stderr_has("backfill 2 of orders_fact: staged — 4 succeeded");
    assert_eq!(
        published(&p),
        before,
        "resuming a staging publishes nothing"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE staged = 'staged'"),
        4
    );
    // The staged files survived the crash and are found again.
    run(&p, &["promote", "2"]).code(0);
    for day in ["2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"] {
        assert!(day_is_exact(&p, day), "{day}");
    }
}

/// Publishes 2026-09-03 of `orders_fact` again after changing its amounts by `by`.
fn republish(p: &Project, by: i64) {
    wh(p)
        .execute(
            "UPDATE raw_orders SET amount_cents = amount_cents + ?1 WHERE date(order_ts) = '2026-09-03'",
            [by],
        )
        .unwrap();
    create(
        p,
        "2026-09-03",
        "2026-09-03",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
}

fn rollback_03(p: &Project) -> crate::support::Out {
    p.run(&[
        "rollback",
        "--dag",
        "orders_fact",
        "--from",
        "2026-09-03",
        "--to",
        "2026-09-03",
    ])
}

fn day_03(p: &Project) -> Vec<String> {
    wh_rows(
        p,
        "SELECT * FROM orders_fact WHERE order_day = '2026-09-03' ORDER BY order_id",
    )
}

#[test]
fn rollback_after_a_rollback_and_a_republish_still_reaches_the_older_versions() {
    let p = shop();
    let toml = p.read("dags/orders_fact.toml").replace(
        "partition_column = \"order_day\"",
        "partition_column = \"order_day\"\nkeep_versions = 3",
    );
    p.write("dags/orders_fact.toml", &toml);
    create(&p, "2026-09-03", "2026-09-03", &[]).code(0);
    let v1 = day_03(&p);
    republish(&p, 1);
    let v2 = day_03(&p);
    republish(&p, 1);
    rollback_03(&p).code(0);
    assert_eq!(day_03(&p), v2);
    republish(&p, 1);
    rollback_03(&p).code(0);
    assert_eq!(day_03(&p), v2, "the rollback's content is v2");
    rollback_03(&p).code(0);
    assert_eq!(day_03(&p), v1, "and before v2 came v1");
}

#[test]
fn a_killed_rollback_is_finished_by_the_next_rollback_and_not_redone() {
    let p = shop();
    let toml = p.read("dags/orders_fact.toml").replace(
        "partition_column = \"order_day\"",
        "partition_column = \"order_day\"\nkeep_versions = 2",
    );
    p.write("dags/orders_fact.toml", &toml);
    create(&p, "2026-09-03", "2026-09-03", &[]).code(0);
    let v1 = day_03(&p);
    republish(&p, 1);
    // A column is added to the target since the version was kept: the restored rows have
    // NULL there, and the manifest must agree with the warehouse all the same.
    wh(&p)
        .execute_batch("ALTER TABLE orders_fact ADD COLUMN note TEXT")
        .unwrap();
    let toml = p
        .read("dags/orders_fact.toml")
        .replace("SELECT order_id,", "SELECT 'x' AS note, order_id,");
    p.write("dags/orders_fact.toml", &toml);
    republish(&p, 1);
    let killed = p
        .command(&[
            "rollback",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-03",
            "--to",
            "2026-09-03",
        ])
        .env("BACKFILL_FAULT", "after-publish")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None);
    // The warehouse holds the restored rows; the manifest only knows the intent.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        1
    );
    // The next rollback first finishes the killed one (the process is gone), then rolls back
    // one version further: the kept v1 replaced by the second publish.
    rollback_03(&p).code(0);
    assert_eq!(
        p.rows("SELECT t.verdict, t.state FROM task_tries t JOIN runs r ON r.id = t.run_id JOIN backfills b ON b.id = r.backfill_id WHERE b.kind = 'rollback' ORDER BY t.id"),
        [["rolled back", "succeeded"], ["rolled back", "succeeded"]]
    );
    let restored: Vec<String> = day_03(&p);
    assert_eq!(restored.len(), v1.len());
    assert_eq!(
        wh_rows(
            &p,
            "SELECT order_id, amount_cents FROM orders_fact WHERE order_day = '2026-09-03' ORDER BY order_id"
        ),
        {
            let c = wh(&p);
            let mut s = c.prepare("SELECT order_id, amount_cents - 2 FROM raw_orders WHERE date(order_ts) = '2026-09-03' ORDER BY order_id").unwrap();
            let v: Vec<String> = s
                .query_map([], |r| {
                    Ok(format!(
                        "{:?}|{:?}",
                        r.get::<_, rusqlite::types::Value>(0)?,
                        r.get::<_, rusqlite::types::Value>(1)?
                    ))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            v
        },
        "the first publish's rows: one rollback finished by recovery, then one more done"
    );
}

/// A command DAG whose `publish` appends each publish to `publishes.log`.
const LOGGED: &str = r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 2, "fingerprint": "f-{{ ds }}"}' > "$BACKFILL_RESULT"'''
publish = '''echo "{{ ds }}" >> publishes.log'''
[tasks.gate]
source_count = "echo 2"
"#;

#[test]
fn a_promote_that_read_the_staged_outputs_before_another_one_published_them_publishes_nothing() {
    use nix::sys::signal::Signal;
    for second in ["promote", "discard"] {
        let p = Project::new().dag("cmd", LOGGED);
        p.create("cmd", "2026-01-01", "2026-01-02", &["--stage"])
            .code(0);
        // The first promote freezes right after reading what is staged.
        let first = p.spawn_with(
            "first",
            &["promote", "1"],
            &[("BACKFILL_FAULT", "promote-read-staged:stop")],
        );
        crate::support::wait_until(
            "the first promote to freeze",
            std::time::Duration::from_secs(20),
            || crate::support::stopped(first.id()),
        );
        p.run(&[second, "1"]).code(0);
        crate::support::signal(&first, Signal::SIGCONT);
        p.wait("first", first).code(0);
        let log = std::fs::read_to_string(p.path("publishes.log")).unwrap_or_default();
        match second {
            "promote" => assert_eq!(log, "2026-01-01\n2026-01-02\n", "each day published once"),
            _ => assert_eq!(log, "", "a discarded output is never published"),
        }
        assert_eq!(
            p.count("SELECT COUNT(*) FROM task_tries WHERE promoted_from IS NOT NULL AND state = 'succeeded'"),
            if second == "promote" { 2 } else { 0 }
        );
    }
}

#[test]
fn diff_reads_the_published_partition_from_the_warehouse() {
    let p = shop();
    create(&p, "2026-09-01", "2026-09-02", &[]).code(0);
    create(
        &p,
        "2026-09-01",
        "2026-09-02",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    // Someone deletes three orders of 2026-09-02 from the published table by hand.
    let gone = wh_rows(
        &p,
        "SELECT order_id FROM orders_fact WHERE order_day = '2026-09-02' ORDER BY order_id LIMIT 3",
    );
    wh(&p)
        .execute_batch(&format!(
            "DELETE FROM orders_fact WHERE order_id IN ({})",
            gone.iter()
                .map(|v| v.trim_start_matches("Integer(").trim_end_matches(')'))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .unwrap();
    let doc = p.run(&["diff", "2", "--output", "json"]).json();
    let d2 = &doc[1];
    assert_eq!(d2["interval"]["start"], "2026-09-02T00:00:00Z");
    assert_eq!(
        d2["published_rows"].as_i64().unwrap() + 3,
        d2["staged_rows"].as_i64().unwrap()
    );
    assert_eq!(d2["same_fingerprint"], false);
    assert_eq!(d2["keys"]["added"], 3);
    assert_eq!(doc[0]["same_fingerprint"], true);
}

#[test]
fn promote_refuses_an_output_of_a_task_the_dag_no_longer_has() {
    let p = shop();
    create(&p, "2026-09-01", "2026-09-01", &["--stage"]).code(0);
    let toml = p
        .read("dags/orders_fact.toml")
        .replace("id = \"load\"", "id = \"load_v2\"");
    p.write("dags/orders_fact.toml", &toml);
    p.run(&["promote", "1"]).code(2).stderr_has(
        "backfill 1 staged an output of task `load`, which DAG `orders_fact` no longer has",
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE staged = 'staged'"),
        1
    );
}

#[test]
fn a_rollback_that_never_committed_is_not_called_rolled_back_and_resume_does_it() {
    let p = shop();
    create(&p, "2026-09-03", "2026-09-03", &[]).code(0);
    republish(&p, 1);
    let before = day_03(&p);
    let killed = p
        .command(&[
            "rollback",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-03",
            "--to",
            "2026-09-03",
        ])
        .env("BACKFILL_FAULT", "before-publish")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None);
    assert_eq!(day_03(&p), before, "nothing was rolled back yet");
    // Recovery finds the version still kept: the killed try did not commit, and is not called
    // `rolled back`; resume then rolls back.
    p.run(&["resume", "3"]).code(0);
    assert_eq!(
        p.rows("SELECT id, state, COALESCE(verdict, '') FROM task_tries WHERE id >= 3 ORDER BY id"),
        [["3", "failed", ""], ["4", "succeeded", "rolled back"]]
    );
    assert_ne!(day_03(&p), before);
}

/// 2026-09-03 of `orders_fact`: its rows and the sum of their amounts.
fn sum_03(p: &Project) -> Vec<String> {
    wh_rows(
        p,
        "SELECT COUNT(*), SUM(amount_cents) FROM orders_fact WHERE order_day = '2026-09-03'",
    )
}

/// The shop with a lease timeout of 1s (a frozen owner is soon gone) and a warehouse busy
/// timeout of 100ms (a writer waiting for a frozen one says so at once).
fn quick_shop() -> Project {
    let p = shop();
    let toml = p.read("backfill.toml").replace(
        "init = [\"schema.sql\", \"seed.sql\"]",
        "init = [\"schema.sql\", \"seed.sql\"]\nbusy_timeout = \"100ms\"",
    );
    p.write("backfill.toml", &format!("lease_timeout = \"1s\"\n{toml}"));
    p
}

#[test]
fn a_rollback_frozen_before_its_commit_is_judged_only_once_it_committed() {
    use crate::support::{signal, stopped, wait_stale, wait_until};
    use nix::sys::signal::Signal;
    use std::time::Duration;
    for taker in ["cancel", "resume"] {
        let p = quick_shop();
        create(&p, "2026-09-03", "2026-09-03", &[]).code(0);
        let v1 = sum_03(&p);
        republish(&p, 1);
        // The rollback freezes inside its warehouse transaction: the manifest allowed it, the
        // kept version is put back, nothing is committed yet.
        let frozen = p.spawn_with(
            "frozen",
            &[
                "rollback",
                "--dag",
                "orders_fact",
                "--from",
                "2026-09-03",
                "--to",
                "2026-09-03",
            ],
            &[("BACKFILL_FAULT", "before-commit:stop")],
        );
        wait_until("the rollback to freeze", Duration::from_secs(20), || {
            stopped(frozen.id())
        });
        wait_stale(&p, 3, 1500);
        // The taker must not judge the rollback while its owner may still commit: it waits
        // for the warehouse's write lock.
        let mut recoverer = p.spawn_with("taker", &[taker, "3"], &[("BACKFILL_LOG", "info")]);
        wait_until(
            "the taker to end or to wait for the warehouse",
            Duration::from_secs(20),
            || {
                recoverer.try_wait().unwrap().is_some()
                    || p.read("taker.err").contains("locked by another writer")
            },
        );
        signal(&frozen, Signal::SIGCONT);
        p.wait("frozen", frozen);
        let out = p.wait("taker", recoverer);
        assert!(matches!(out.code, 0 | 130), "{taker}: {out:?}");
        assert_eq!(sum_03(&p), v1, "{taker}: the rollback committed");
        // The manifest says what the warehouse holds: the rollback's try is published.
        assert_eq!(
            p.rows(
                "SELECT t.state, t.verdict FROM report_published p JOIN report_tries t USING (try_id)
                 WHERE p.interval_start = '2026-09-03T00:00:00Z'"
            ),
            [["succeeded", "rolled back"]],
            "{taker}"
        );
        assert_eq!(
            p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
            0
        );
    }
}

/// The shop with one DAG `two` of two SQL tasks per day: `load` (orders_fact), then
/// `aggregate` (daily_orders).
pub(crate) fn two_tasks() -> Project {
    let p = shop();
    for f in ["dags/daily_orders.toml", "dags/orders_fact.toml"] {
        std::fs::remove_file(p.path(f)).unwrap();
    }
    p.write(
        "dags/two.toml",
        r#"
schedule = "@daily"
[[tasks]]
id = "load"
warehouse = "shop"
target = "orders_fact"
partition_column = "order_day"
sql = """
SELECT order_id, date(order_ts) AS order_day, order_ts, region, amount_cents
FROM raw_orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
"""
[tasks.gate]
unique_key = ["order_id"]

[[tasks]]
id = "aggregate"
depends_on = ["load"]
warehouse = "shop"
target = "daily_orders"
partition_column = "day"
sql = """
SELECT order_day AS day, region, COUNT(*) AS orders, SUM(amount_cents) AS revenue_cents
FROM orders_fact WHERE order_day >= :ds AND order_day < :next_ds GROUP BY 1, 2
"""
"#,
    );
    p
}

/// Adds `by` to the amounts of 2026-09-03's raw orders.
pub(crate) fn bump_03(p: &Project, by: i64) {
    wh(p)
        .execute(
            "UPDATE raw_orders SET amount_cents = amount_cents + ?1 WHERE date(order_ts) = '2026-09-03'",
            [by],
        )
        .unwrap();
}

/// `backfill ARGS` over 2026-09-03 of DAG `two`, killed at `fault`.
fn killed_two(p: &Project, extra: &[&str], fault: &str) {
    let mut args = vec![
        "create",
        "--dag",
        "two",
        "--from",
        "2026-09-03",
        "--to",
        "2026-09-03",
        "--reprocess-behavior",
        "completed",
    ];
    args.extend_from_slice(extra);
    let killed = p
        .command(&args)
        .env("BACKFILL_FAULT", fault)
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None, "killed at {fault}");
}

#[test]
fn a_crash_and_resume_of_a_two_task_dag_keeps_the_rollback_point() {
    let p = two_tasks();
    p.create("two", "2026-09-03", "2026-09-03", &[]).code(0);
    let before = sum_03(&p);
    bump_03(&p, 1);
    // Killed while task 2 runs: task 1 published already, keeping `before` as its version.
    killed_two(&p, &[], "after-audit@2");
    let after = sum_03(&p);
    assert_ne!(after, before);
    // The resume runs the interval again: task 1 publishes the same rows once more.
    p.run(&["resume", "2"]).code(0);
    assert_eq!(sum_03(&p), after);
    p.run(&[
        "rollback",
        "--dag",
        "two",
        "--from",
        "2026-09-03",
        "--to",
        "2026-09-03",
        "--task",
        "load",
    ])
    .code(0);
    assert_eq!(
        sum_03(&p),
        before,
        "the rollback puts back what was published before the backfill"
    );
}

#[test]
fn a_killed_and_resumed_staging_leaves_one_output_per_task_to_promote() {
    let p = two_tasks();
    p.create("two", "2026-09-03", "2026-09-03", &[]).code(0);
    bump_03(&p, 1);
    // Killed while task 2 stages: task 1's output is staged already.
    killed_two(&p, &["--stage"], "after-audit@2");
    // Late data, then the resume stages the whole interval again.
    bump_03(&p, 1);
    p.run(&["resume", "2"]).code(0);
    assert_eq!(
        p.rows(
            "SELECT t.task_id, COUNT(*) FROM task_tries t JOIN runs r ON r.id = t.run_id
             WHERE r.backfill_id = 2 AND t.staged = 'staged' GROUP BY t.task_id ORDER BY 1"
        ),
        [["aggregate", "1"], ["load", "1"]],
        "one output per task and interval awaits promotion"
    );
    p.run(&["promote", "2"]).code(0);
    assert!(day_is_exact(&p, "2026-09-03"));
    p.run(&["promote", "2"])
        .code(0)
        .stderr_has("nothing to promote");
    assert!(
        day_is_exact(&p, "2026-09-03"),
        "a second promote never publishes the superseded output"
    );
    assert_eq!(
        std::fs::read_dir(p.path(".backfill/audit"))
            .unwrap()
            .count(),
        0,
        "no staged file is left"
    );
}

/// `latest` names the newest backfill, and for `diff`, `promote` and `discard` the newest
/// staged one; `create --stage` prints its id on stdout, alone, also with `-q`.
#[test]
fn latest_names_the_newest_backfill_or_the_newest_staged_one() {
    let p = Project::new().dag(
        "export",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"write\"\ncommand = \"echo '{\\\"rows\\\": 1}' > $BACKFILL_RESULT\"\npublish = \"true\"\n[tasks.gate]\nsource_fingerprint = \"echo v1\"\n",
    );
    p.run(&["show", "latest"])
        .code(2)
        .stderr_has("`latest`: the manifest ")
        .stderr_has("has no backfill yet");
    let days = |extra: &[&str]| p.create("export", "2026-01-01", "2026-01-02", extra);
    let plain = days(&[]);
    plain.code(0);
    assert_eq!(
        plain.stdout, "",
        "a create that does not stage prints no data"
    );
    p.run(&["diff", "latest"])
        .code(2)
        .stderr_has("has no staged backfill (`backfill create --stage`) yet");
    let staged = days(&["--reprocess-behavior", "completed", "--stage", "-q"]);
    staged.code(0);
    assert_eq!(
        (staged.stdout.as_str(), staged.stderr.as_str()),
        ("2\n", "")
    );
    days(&["--reprocess-behavior", "completed"]).code(0);
    assert_eq!(
        p.run(&["--output", "json", "show", "latest"]).json()["id"],
        3
    );
    p.run(&["diff", "latest"])
        .code(0)
        .stderr_has("latest: backfill 2");
    p.run(&["discard", "latest"]).code(0);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE staged = 'discarded'"),
        2
    );
    // With --output json the summary carries the id: stdout holds one document.
    let json = days(&[
        "--reprocess-behavior",
        "completed",
        "--stage",
        "--output",
        "json",
    ]);
    assert_eq!(json.json()["backfill_id"], 4);
    for bad in ["0", "newest"] {
        p.run(&["show", bad]).code(2).stderr_has(
            "is not a backfill id; give a number as `backfill list` shows it, or `latest`",
        );
    }
}
