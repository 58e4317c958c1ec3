//! `write = "merge"` on a SQLite warehouse: a dimension with a surrogate id, a column the query
//! does not write, and a table of orders whose foreign key references it. Every write to the
//! target is counted by triggers, so that "nothing written" is seen, not assumed.

use crate::gate::{wh, wh_count, wh_rows};
use crate::support::Project;

const SCHEMA: &str = "
CREATE TABLE src (customer_id INTEGER, signup_day TEXT, name TEXT);
CREATE TABLE customers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    customer_id INTEGER NOT NULL UNIQUE,
    signup_day TEXT NOT NULL,
    name TEXT,
    first_seen_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX customers_day ON customers (signup_day);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers (customer_id));
CREATE TABLE writes (op TEXT, customer_id INTEGER);
CREATE TRIGGER customers_i AFTER INSERT ON customers BEGIN INSERT INTO writes VALUES ('insert', NEW.customer_id); END;
CREATE TRIGGER customers_u AFTER UPDATE ON customers BEGIN INSERT INTO writes VALUES ('update', NEW.customer_id); END;
CREATE TRIGGER customers_d AFTER DELETE ON customers BEGIN INSERT INTO writes VALUES ('delete', OLD.customer_id); END;
INSERT INTO src VALUES (1, '2026-09-01', 'ada'), (2, '2026-09-01', 'bob'), (3, '2026-09-01', 'cy'),
                       (4, '2026-09-02', 'dee'), (5, '2026-09-02', 'eve');
";

/// The DAG, with `task` and `gate` lines added to the task's and the gate's tables.
fn dag(task: &str, gate: &str) -> String {
    format!(
        r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "customers"
warehouse = "shop"
target = "customers"
partition_column = "signup_day"
write = "merge"
sql = "SELECT customer_id, signup_day, name FROM src WHERE signup_day >= :ds AND signup_day < :next_ds"
{task}
[tasks.gate]
unique_key = ["customer_id"]
{gate}
"#
    )
}

fn project(task: &str, gate: &str) -> Project {
    let p = Project::new();
    p.write(
        "backfill.toml",
        "lease_timeout = \"30s\"\n\n[warehouse.shop]\npath = \"warehouse.db\"\ninit = [\"schema.sql\"]\n",
    );
    p.write("schema.sql", SCHEMA);
    p.write("dags/customers.toml", &dag(task, gate));
    p
}

fn exec(p: &Project, sql: &str) {
    wh(p).execute_batch(sql).unwrap();
}

/// The target's rows: surrogate id, key, day, name, and whether first_seen_at is the one noted.
fn customers(p: &Project) -> Vec<String> {
    wh_rows(
        p,
        "SELECT id, customer_id, signup_day, name FROM customers ORDER BY customer_id",
    )
}

/// The writes to the target since the last look, and forgets them.
fn writes(p: &Project) -> Vec<String> {
    let seen = wh_rows(
        p,
        "SELECT op, customer_id FROM writes ORDER BY op, customer_id",
    );
    exec(p, "DELETE FROM writes");
    seen
}

/// The counts each try of a day recorded: state, rows, inserted, updated, deleted, unchanged.
fn counts(p: &Project, day: &str) -> Vec<Vec<String>> {
    p.rows(&format!(
        "SELECT state, rows, rows_inserted, rows_updated, rows_deleted, rows_unchanged
         FROM report_tries WHERE date(interval_start) = '{day}' ORDER BY try_id"
    ))
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(ToString::to_string).collect()
}

/// `rollback` of the day `day` of September 2026.
fn rollback(p: &Project, day: u32) -> crate::support::Out {
    let day = format!("2026-09-{day:02}");
    p.run(&[
        "rollback",
        "--dag",
        "customers",
        "--from",
        &day,
        "--to",
        &day,
    ])
}

fn rerun(p: &Project, from: &str, to: &str, extra: &[&str]) -> crate::support::Out {
    let mut args = vec!["--reprocess-behavior", "completed", "--allow-drift"];
    args.extend_from_slice(extra);
    p.create("customers", from, to, &args)
}

#[test]
fn a_merge_keeps_what_the_query_does_not_write_and_writes_only_what_changed() {
    let p = project("", "");
    p.create("customers", "2026-09-01", "2026-09-02", &[])
        .code(0);
    assert_eq!(
        customers(&p),
        [
            "Integer(1)|Integer(1)|Text(\"2026-09-01\")|Text(\"ada\")",
            "Integer(2)|Integer(2)|Text(\"2026-09-01\")|Text(\"bob\")",
            "Integer(3)|Integer(3)|Text(\"2026-09-01\")|Text(\"cy\")",
            "Integer(4)|Integer(4)|Text(\"2026-09-02\")|Text(\"dee\")",
            "Integer(5)|Integer(5)|Text(\"2026-09-02\")|Text(\"eve\")",
        ]
    );
    let first_seen = wh_rows(
        &p,
        "SELECT first_seen_at FROM customers ORDER BY customer_id",
    );
    assert_eq!(writes(&p).len(), 5);
    assert_eq!(
        counts(&p, "2026-09-01"),
        [row(&["succeeded", "3", "3", "0", "0", "0"])]
    );

    // An unchanged rerun writes no row at all, twice.
    for _ in 0..2 {
        rerun(&p, "2026-09-01", "2026-09-02", &[]).code(0);
        assert_eq!(writes(&p), Vec::<String>::new());
    }
    assert_eq!(
        counts(&p, "2026-09-01").last().unwrap(),
        &row(&["succeeded", "3", "0", "0", "0", "3"])
    );

    // A renamed customer is updated in place: its id and first_seen_at stay; a new one gets the
    // next id; one gone from the source is deleted.
    exec(
        &p,
        "UPDATE src SET name = 'bobby' WHERE customer_id = 2;
         DELETE FROM src WHERE customer_id = 3;
         INSERT INTO src VALUES (6, '2026-09-01', 'fay');",
    );
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
    assert_eq!(
        writes(&p),
        ["delete|3", "insert|6", "update|2"].map(|w| {
            let (op, id) = w.split_once('|').unwrap();
            format!("Text(\"{op}\")|Integer({id})")
        })
    );
    assert_eq!(
        customers(&p),
        [
            "Integer(1)|Integer(1)|Text(\"2026-09-01\")|Text(\"ada\")",
            "Integer(2)|Integer(2)|Text(\"2026-09-01\")|Text(\"bobby\")",
            "Integer(4)|Integer(4)|Text(\"2026-09-02\")|Text(\"dee\")",
            "Integer(5)|Integer(5)|Text(\"2026-09-02\")|Text(\"eve\")",
            "Integer(6)|Integer(6)|Text(\"2026-09-01\")|Text(\"fay\")",
        ]
    );
    let kept: Vec<String> = first_seen
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        wh_rows(
            &p,
            "SELECT first_seen_at FROM customers WHERE customer_id <> 6 ORDER BY customer_id"
        ),
        kept
    );
    assert_eq!(
        counts(&p, "2026-09-01").last().unwrap(),
        &row(&["succeeded", "3", "1", "1", "1", "1"])
    );
    // What show, runs and their JSON say of it.
    p.run(&["show", "4"]).code(0).stdout_has("+1 ~1 -1 =1");
    p.run(&["runs", "--dag", "customers"])
        .code(0)
        .stdout_has("+0 ~0 -0 =3");
    let json = p.run(&["show", "4", "--output", "json"]).json();
    assert_eq!(
        json["interval_details"][0]["changes"],
        serde_json::json!({"inserted": 1, "updated": 1, "deleted": 1, "unchanged": 1})
    );
}

#[test]
fn a_key_gone_from_the_source_is_deleted_unless_on_missing_keeps_it() {
    for (task, kept) in [("", false), ("on_missing = \"keep\"", true)] {
        let p = project(task, "");
        p.create("customers", "2026-09-01", "2026-09-01", &[])
            .code(0);
        exec(&p, "DELETE FROM src WHERE customer_id = 1");
        rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
        let left = wh_count(&p, "SELECT count(*) FROM customers WHERE customer_id = 1");
        assert_eq!(left, i64::from(kept), "{task}");
        // The partition after the merge is what the gate judged, and what is recorded.
        let expected = if kept {
            ["succeeded", "3", "0", "0", "0", "2"]
        } else {
            ["succeeded", "2", "0", "0", "1", "2"]
        };
        assert_eq!(
            counts(&p, "2026-09-01").last().unwrap(),
            &row(&expected),
            "{task}"
        );
        // What drift compares the next rerun with: the partition, not the change set.
        assert_eq!(
            p.rows("SELECT rows FROM published"),
            [row(&[expected[1]])],
            "{task}"
        );
        p.create(
            "customers",
            "2026-09-01",
            "2026-09-01",
            &["--reprocess-behavior", "completed"],
        )
        .code(0);
    }
}

#[test]
fn a_key_that_other_rows_reference_is_never_deleted_and_its_row_still_updates() {
    let p = project("", "");
    p.create("customers", "2026-09-01", "2026-09-01", &[])
        .code(0);
    exec(&p, "INSERT INTO orders VALUES (10, 1), (11, 2)");
    // Referenced keys that are kept or updated merge.
    exec(&p, "UPDATE src SET name = 'ada2' WHERE customer_id = 1");
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
    assert_eq!(
        wh_rows(&p, "SELECT name FROM customers WHERE customer_id = 1"),
        ["Text(\"ada2\")"]
    );
    // A referenced key gone from the source: rejected with the constraint's words and what
    // references it; nothing is published.
    exec(
        &p,
        "DELETE FROM src WHERE customer_id = 2; DELETE FROM writes",
    );
    let before = customers(&p);
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(3).stderr_has(
        "rejected: target constraint violated: FOREIGN KEY constraint failed: a key the merge deletes is still referenced by orders.customer_id",
    );
    assert_eq!(customers(&p), before);
    assert_eq!(writes(&p), Vec::<String>::new());
    assert_eq!(
        counts(&p, "2026-09-01").last().unwrap(),
        &row(&["rejected", "2", "NULL", "NULL", "NULL", "NULL"])
    );
    // A replace of the same partition would delete every row: refused the same way.
    let text = p
        .read("dags/customers.toml")
        .replace("write = \"merge\"\n", "");
    p.write("dags/customers.toml", &text);
    exec(&p, "INSERT INTO src VALUES (2, '2026-09-01', 'bob')");
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(3).stderr_has(
        "FOREIGN KEY constraint failed: a row of the partition, which a replace deletes whole (write = \"merge\" deletes only the keys the output no longer has), is still referenced by orders.customer_id",
    );
    assert_eq!(customers(&p), before);
}

#[test]
fn a_key_published_in_another_partition_is_rejected_per_partition_and_moved_per_table() {
    for scope in ["partition", "table"] {
        let p = project("", &format!("unique_key_scope = \"{scope}\""));
        p.create("customers", "2026-09-01", "2026-09-02", &[])
            .code(0);
        // Customer 4 moves from the 2nd to the 1st.
        exec(
            &p,
            "UPDATE src SET signup_day = '2026-09-01' WHERE customer_id = 4",
        );
        let out = rerun(&p, "2026-09-01", "2026-09-01", &[]);
        if scope == "partition" {
            out.code(3).stderr_has(
                "unique_key violated across partitions: key (4) in partition '2026-09-02', and this output puts it in this interval's partition; a merge would update the row of the other partition",
            );
            assert_eq!(
                wh_rows(&p, "SELECT signup_day FROM customers WHERE customer_id = 4"),
                ["Text(\"2026-09-02\")"]
            );
        } else {
            out.code(0);
            // The same row (its id) now in the 1st's partition.
            assert_eq!(
                wh_rows(
                    &p,
                    "SELECT id, signup_day FROM customers WHERE customer_id = 4"
                ),
                ["Integer(4)|Text(\"2026-09-01\")"]
            );
            assert_eq!(
                counts(&p, "2026-09-01").last().unwrap(),
                &row(&["succeeded", "4", "0", "1", "0", "3"])
            );
            // A rollback of the 1st moves the row back where it came from, as it was there
            // (its id too): it is not lost with the 1st's version.
            let rolled = rollback(&p, 1);
            rolled.code(0);
            assert_eq!(
                wh_rows(
                    &p,
                    "SELECT id, signup_day, name FROM customers WHERE customer_id = 4"
                ),
                ["Integer(4)|Text(\"2026-09-02\")|Text(\"dee\")"]
            );
            assert_eq!(customers(&p).len(), 5);
            // The rollback's try publishes the 1st's own rows: 3.
            assert_eq!(
                p.rows(
                    "SELECT t.rows FROM task_tries t JOIN runs r ON r.id = t.run_id
                     JOIN backfills b ON b.id = r.backfill_id WHERE b.kind = 'rollback'"
                ),
                [["3"]]
            );
            assert_eq!(
                wh_count(&p, "SELECT count(*) FROM _backfill_kept_customers"),
                0,
                "the version and the moved row's copy went with the rollback"
            );
        }
    }
}

#[test]
fn max_changed_rejects_a_merge_that_would_change_too_much_of_the_partition() {
    let p = project("", "max_changed = 0.5");
    p.create("customers", "2026-09-01", "2026-09-01", &[])
        .code(0);
    exec(
        &p,
        "UPDATE src SET name = name || '!' WHERE customer_id IN (1, 2)",
    );
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(3).stderr_has(
        "max_changed: the merge would change 2 of the partition's 3 rows (0 inserted, 2 updated, 0 deleted), 66.7% (at most 50.0%)",
    );
    assert_eq!(
        wh_rows(&p, "SELECT name FROM customers ORDER BY customer_id"),
        ["Text(\"ada\")", "Text(\"bob\")", "Text(\"cy\")"]
    );
    exec(&p, "UPDATE src SET name = 'ada' WHERE customer_id = 1");
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
}

#[test]
fn rollback_after_merges_puts_back_what_they_updated_and_deleted_and_removes_what_they_inserted() {
    let p = project("keep_versions = 2", "");
    p.create("customers", "2026-09-01", "2026-09-01", &[])
        .code(0);
    let published = customers(&p);
    let first_seen = wh_rows(
        &p,
        "SELECT first_seen_at FROM customers ORDER BY customer_id",
    );
    exec(
        &p,
        "INSERT INTO orders VALUES (10, 1);
         UPDATE src SET name = 'ADA' WHERE customer_id = 1;
         DELETE FROM src WHERE customer_id = 3;
         INSERT INTO src VALUES (7, '2026-09-01', 'gus');",
    );
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
    assert_eq!(
        wh_count(
            &p,
            "SELECT count(*) FROM customers WHERE customer_id IN (3, 7)"
        ),
        1
    );
    rollback(&p, 1).code(0);
    // Every row as it was, ids and first_seen_at included; the referenced key was never
    // deleted (its order still points at it).
    assert_eq!(customers(&p), published);
    assert_eq!(
        wh_rows(
            &p,
            "SELECT first_seen_at FROM customers ORDER BY customer_id"
        ),
        first_seen
    );
    assert_eq!(
        wh_count(&p, "SELECT count(*) FROM orders WHERE customer_id = 1"),
        1
    );
}

#[test]
fn a_staged_merge_is_promoted_as_a_merge() {
    let p = project("", "");
    p.create("customers", "2026-09-01", "2026-09-01", &[])
        .code(0);
    exec(
        &p,
        "INSERT INTO orders VALUES (10, 2);
         UPDATE src SET name = 'cyd' WHERE customer_id = 3;
         DELETE FROM writes;",
    );
    rerun(&p, "2026-09-01", "2026-09-01", &["--stage"]).code(0);
    assert_eq!(writes(&p), Vec::<String>::new());
    p.run(&["promote", "2"]).code(0);
    assert_eq!(
        writes(&p),
        ["Text(\"update\")|Integer(3)"],
        "only the changed row is written"
    );
    // The promote records what its merge did to the partition as it was then.
    assert_eq!(
        p.rows(
            "SELECT t.rows_inserted, t.rows_updated, t.rows_deleted, t.rows_unchanged
             FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 3"
        ),
        [row(&["0", "1", "0", "2"])]
    );
    assert_eq!(
        wh_rows(&p, "SELECT id, name FROM customers ORDER BY customer_id"),
        [
            "Integer(1)|Text(\"ada\")",
            "Integer(2)|Text(\"bob\")",
            "Integer(3)|Text(\"cyd\")"
        ]
    );
}

#[test]
fn a_merge_needs_its_key_an_index_and_words_it_knows() {
    // Each mistake is named at its file and line (the DAG's line `at`, 1-based).
    let cases = [
        (
            "write = \"merge\"",
            "write = \"upsert\"",
            "key `write` is \"replace\" (delete the interval's rows, insert the output: the default) or \"merge\"",
        ),
        (
            "write = \"merge\"",
            "write = \"merge\"\non_missing = \"drop\"",
            "key `on_missing` is \"delete\" (the partition holds exactly the output's keys: the default) or \"keep\"",
        ),
        (
            "unique_key = [\"customer_id\"]",
            "unique_key = [\"customer_id\"]\nmax_changed = 1.5",
            "key `max_changed` must be a fraction from 0 to 1",
        ),
    ];
    for (from, to, expected) in cases {
        let p = project("", "");
        let text = p.read("dags/customers.toml").replace(from, to);
        p.write("dags/customers.toml", &text);
        let out = p.run(&["dags", "validate"]);
        out.code(2).stderr_has(expected);
        let wrong = to.lines().last().unwrap();
        let line = text.lines().position(|l| l == wrong).unwrap() + 1;
        out.stderr_has(&format!("dags/customers.toml:{line}:"));
    }
    // A merge without a key; `on_missing` and `max_changed` without a merge.
    let p = project("", "");
    let text = p.read("dags/customers.toml");
    p.write(
        "dags/customers.toml",
        &text.replace("unique_key = [\"customer_id\"]\n", ""),
    );
    p.run(&["dags", "validate"]).code(2).stderr_has(
        "task `customers`: `write = \"merge\"` matches the output's rows to the target's by a business key; give it as `unique_key = [\"customer_id\"]` in [tasks.gate]",
    );
    p.write(
        "dags/customers.toml",
        &text
            .replace("write = \"merge\"\n", "on_missing = \"keep\"\n")
            .replace("unique_key", "max_changed = 0.1\nunique_key"),
    );
    p.run(&["dags", "validate"])
        .code(2)
        .stderr_has("key `on_missing` says what a merge does with the partition's keys the output no longer has; it needs `write = \"merge\"`")
        .stderr_has("`max_changed` bounds what a merge changes; it needs `write = \"merge\"`");
    // The key must be indexed: each output key is looked up in the target.
    let p = project("", "");
    p.write(
        "schema.sql",
        &SCHEMA.replace(
            "customer_id INTEGER NOT NULL UNIQUE",
            "customer_id INTEGER NOT NULL",
        ),
    );
    p.run(&["dags", "validate"]).code(2).stderr_has(
        "write = \"merge\" looks the output's keys up in the whole table; create an index for it in the warehouse: CREATE INDEX customers_customer_id ON customers (customer_id);",
    );
    assert!(!p.path(".backfill/manifest.db").exists() || p.manifest_db().is_some());
}

#[test]
fn a_merge_killed_at_any_point_of_its_publish_is_finished_by_resume_and_writes_each_row_once() {
    for point in [
        "after-audit",
        "before-publish",
        "before-commit",
        "after-publish",
    ] {
        let p = project("", "");
        p.create("customers", "2026-09-01", "2026-09-01", &[])
            .code(0);
        exec(
            &p,
            "UPDATE src SET name = 'bobby' WHERE customer_id = 2;
             DELETE FROM src WHERE customer_id = 3;
             INSERT INTO src VALUES (6, '2026-09-01', 'fay');
             DELETE FROM writes;",
        );
        let crashed = p.run_with(
            &[
                "create",
                "--dag",
                "customers",
                "--from",
                "2026-09-01",
                "--to",
                "2026-09-01",
                "--reprocess-behavior",
                "completed",
            ],
            &[("BACKFILL_FAULT", point)],
        );
        assert_ne!(crashed.code, 0, "{point}: {}", crashed.stderr);
        p.run(&["resume", "2"]).code(0);
        assert_eq!(
            writes(&p),
            [
                "Text(\"delete\")|Integer(3)",
                "Text(\"insert\")|Integer(6)",
                "Text(\"update\")|Integer(2)"
            ],
            "{point}"
        );
        assert_eq!(
            wh_rows(
                &p,
                "SELECT id, customer_id, name FROM customers ORDER BY customer_id"
            ),
            [
                "Integer(1)|Integer(1)|Text(\"ada\")",
                "Integer(2)|Integer(2)|Text(\"bobby\")",
                "Integer(4)|Integer(6)|Text(\"fay\")"
            ],
            "{point}"
        );
        assert_eq!(
            p.rows(
                "SELECT t.state, t.rows_inserted, t.rows_updated, t.rows_deleted, t.rows_unchanged
                 FROM task_tries t JOIN runs r ON r.id = t.run_id
                 WHERE r.backfill_id = 2 AND t.state = 'succeeded'"
            ),
            [row(&["succeeded", "1", "1", "1", "1"])],
            "{point}"
        );
        assert_eq!(
            p.count("SELECT count(*) FROM task_tries WHERE publishing = TRUE OR state = 'running'"),
            0,
            "{point}"
        );
    }
}

#[test]
fn changed_reruns_only_what_changed_and_verify_judges_a_merge_task_as_any() {
    let p = project(
        "",
        "source_fingerprint = \"SELECT group_concat(name) FROM src WHERE signup_day >= :ds AND signup_day < :next_ds\"",
    );
    p.create("customers", "2026-09-01", "2026-09-02", &[])
        .code(0);
    exec(
        &p,
        "UPDATE src SET name = 'eva' WHERE customer_id = 5; DELETE FROM writes;",
    );
    p.create(
        "customers",
        "2026-09-01",
        "2026-09-02",
        &["--reprocess-behavior", "changed"],
    )
    .code(0)
    .stderr_has("1 succeeded")
    .stderr_has("1 skipped");
    assert_eq!(writes(&p), ["Text(\"update\")|Integer(5)"]);
    p.run(&[
        "verify",
        "--dag",
        "customers",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-02",
    ])
    .code(0)
    .stdout_has("deterministic");
    assert_eq!(writes(&p), Vec::<String>::new(), "verify writes nothing");
}

#[test]
fn an_atomic_promote_of_merges_publishes_both_days_or_neither() {
    let p = project("", "");
    p.create("customers", "2026-09-01", "2026-09-02", &[])
        .code(0);
    let before = customers(&p);
    exec(
        &p,
        "INSERT INTO orders VALUES (10, 4);
         UPDATE src SET name = 'bobby' WHERE customer_id = 2;
         DELETE FROM src WHERE customer_id = 4;",
    );
    writes(&p);
    rerun(&p, "2026-09-01", "2026-09-02", &["--stage"]).code(0);
    // 09-02 deletes a key that an order references: 09-01's update, made first in the same
    // transaction, is undone with it.
    p.run(&["promote", "2", "--atomic", "--allow-drift"])
        .code(3)
        .stderr_has("still referenced by orders.customer_id");
    assert_eq!(customers(&p), before, "neither day published");
    assert_eq!(writes(&p), Vec::<String>::new(), "no write committed");
    exec(&p, "DELETE FROM orders");
    p.run(&["promote", "2", "--atomic", "--allow-drift"])
        .code(0);
    assert_eq!(
        customers(&p),
        [
            "Integer(1)|Integer(1)|Text(\"2026-09-01\")|Text(\"ada\")",
            "Integer(2)|Integer(2)|Text(\"2026-09-01\")|Text(\"bobby\")",
            "Integer(3)|Integer(3)|Text(\"2026-09-01\")|Text(\"cy\")",
            "Integer(5)|Integer(5)|Text(\"2026-09-02\")|Text(\"eve\")",
        ],
        "merged in place: bobby keeps bob's surrogate id"
    );
    assert_eq!(
        writes(&p),
        ["Text(\"delete\")|Integer(4)", "Text(\"update\")|Integer(2)"]
    );
    assert_eq!(
        p.rows(
            "SELECT t.rows_inserted, t.rows_updated, t.rows_deleted, t.rows_unchanged
             FROM task_tries t JOIN runs r ON r.id = t.run_id
             WHERE r.backfill_id = 4 ORDER BY r.interval_start"
        ),
        [["0", "1", "0", "2"], ["0", "0", "1", "1"]]
    );
}

#[test]
fn a_promote_is_judged_by_max_changed_against_the_partition_as_it_is_then() {
    let p = project("", "max_changed = 0.5");
    p.create("customers", "2026-09-01", "2026-09-01", &[])
        .code(0);
    // Staged: one name of three changed, a third of the partition.
    exec(&p, "UPDATE src SET name = 'ada!' WHERE customer_id = 1");
    rerun(&p, "2026-09-01", "2026-09-01", &["--stage"]).code(0);
    // Meanwhile the other two are published changed, one at a time.
    exec(
        &p,
        "UPDATE src SET name = 'ada' WHERE customer_id = 1;
         UPDATE src SET name = 'bob2' WHERE customer_id = 2;",
    );
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
    exec(&p, "UPDATE src SET name = 'cy2' WHERE customer_id = 3");
    rerun(&p, "2026-09-01", "2026-09-01", &[]).code(0);
    let before = customers(&p);
    // Promoted now, the staged output would change all three.
    for atomic in [false, true] {
        let mut args = vec!["promote", "2"];
        if atomic {
            args.push("--atomic");
        }
        p.run(&args).code(3).stderr_has(
            "max_changed: the merge would change 3 of the partition's 3 rows (0 inserted, 3 updated, 0 deleted), 100.0% (at most 50.0%)",
        );
        assert_eq!(customers(&p), before, "atomic: {atomic}");
    }
    assert_eq!(
        p.rows(
            "SELECT t.staged FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 2"
        ),
        [["staged"]]
    );
}
