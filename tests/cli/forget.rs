//! `backfill forget`: a DAG's history removed over a range or whole, with what its warehouse
//! keeps for it and its log files, so that the next backfill runs those intervals again; the
//! removal recorded, asked for, refused while a backfill of the DAG is in the way, finished by
//! the next `forget` when it was killed half way, and no id given twice afterwards.

use std::process::{Command, Stdio};

use crate::gate::{shop, wh, wh_count};
use crate::support::{NOW, Project};

/// Sept 1-5 of `daily_orders` published, then Sept 4-5 again from a changed source: two
/// versions kept (the first content of the 4th and the 5th).
fn shop_with_versions() -> Project {
    let p = shop();
    p.create("daily_orders", "2026-09-01", "2026-09-05", &[])
        .code(0);
    wh(&p)
        .execute_batch(
            "UPDATE raw_orders SET amount_cents = amount_cents + 1
             WHERE order_ts >= '2026-09-04' AND order_ts < '2026-09-06'",
        )
        .unwrap();
    p.create(
        "daily_orders",
        "2026-09-04",
        "2026-09-05",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(versions(&p), 2);
    p
}

fn versions(p: &Project) -> i64 {
    wh_count(
        p,
        "SELECT count(*) FROM _backfill_versions WHERE target = 'daily_orders'",
    )
}

fn has_table(p: &Project, name: &str) -> bool {
    wh_count(
        p,
        &format!("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = '{name}'"),
    ) == 1
}

/// The interval starts of the log files of `daily_orders`' task, sorted (the run id in a
/// file's name depends on the order the runs started in).
fn logs(p: &Project) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(p.path(".backfill/logs/daily_orders/aggregate"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.split('.').next().unwrap_or_default().to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `(backfill, interval day)` of every run, by backfill and interval (a backfill's runs
/// start several at a time, in any order).
fn runs(p: &Project) -> Vec<Vec<String>> {
    p.rows(&format!(
        "SELECT backfill_id, {} FROM runs ORDER BY backfill_id, interval_start",
        p.day_of("interval_start")
    ))
}

const FORGET_4_5: &[&str] = &[
    "forget",
    "--dag",
    "daily_orders",
    "--from",
    "2026-09-04",
    "--to",
    "2026-09-05",
];

#[test]
fn a_forgotten_range_is_run_again_by_the_next_backfill_and_the_rest_stays() {
    let p = shop_with_versions();
    let before = wh(&p)
        .query_row(
            "SELECT group_concat(day || region || orders, ',') FROM daily_orders",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    let dry = p.run(&[FORGET_4_5, &["--dry-run"]].concat());
    dry.code(0);
    assert_eq!(
        dry.stdout,
        "forget DAG daily_orders, intervals from 2026-09-04 to 2026-09-05:
  backfills       1 (2)
  backfills kept  1 (1): their intervals outside the range stay
  runs            4
  tries           4
  published       2: no longer recorded; the rows stay in the target
  kept versions   2
"
    );
    assert!(
        dry.stderr.contains("a dry run: nothing was forgotten"),
        "{}",
        dry.stderr
    );
    assert_eq!(versions(&p), 2, "a dry run removes nothing");
    assert_eq!(p.count("SELECT count(*) FROM runs"), 7);

    let out = p.run(&[FORGET_4_5, &["--yes"]].concat());
    out.code(0);
    assert!(
        out.stderr.contains(
            "forgot 1 backfill, 4 runs and 4 tries of DAG daily_orders (2 partitions no longer recorded as published, 2 kept versions removed from its warehouses), recorded as forget 1"
        ),
        "{}",
        out.stderr
    );
    // The manifest keeps Sept 1-3 of backfill 1; backfill 2 had only the 4th and 5th.
    assert_eq!(
        runs(&p),
        [
            ["1", "2026-09-01"],
            ["1", "2026-09-02"],
            ["1", "2026-09-03"]
        ]
    );
    assert_eq!(p.count("SELECT count(*) FROM backfills"), 1);
    assert_eq!(
        p.count("SELECT count(*) FROM plan WHERE backfill_id = 1"),
        3
    );
    assert_eq!(p.count("SELECT count(*) FROM published"), 3);
    assert_eq!(
        p.rows(
            "SELECT id, dag_id, from_arg, to_arg, state, backfills, runs, tries, published, versions, last_backfill, last_run, last_try FROM forgets"
        ),
        [[
            "1",
            "daily_orders",
            "2026-09-04",
            "2026-09-05",
            "done",
            "1",
            "4",
            "4",
            "2",
            "2",
            "2",
            "7",
            "7"
        ]]
    );
    // The warehouse: the rows stay, the versions and the empty kept table go.
    assert_eq!(versions(&p), 0);
    assert!(!has_table(&p, "_backfill_kept_daily_orders"));
    let after = wh(&p)
        .query_row(
            "SELECT group_concat(day || region || orders, ',') FROM daily_orders",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    assert_eq!(after, before, "the target's rows are not touched");
    // The logs of the removed runs go, the others stay.
    assert_eq!(
        logs(&p),
        ["20260901T000000Z", "20260902T000000Z", "20260903T000000Z"]
    );

    // The next backfill of Sept 1-5 runs the 4th and 5th again, with new ids.
    let again = p.create("daily_orders", "2026-09-01", "2026-09-05", &["-q"]);
    again.code(0);
    assert_eq!(
        runs(&p),
        [
            ["1", "2026-09-01"],
            ["1", "2026-09-02"],
            ["1", "2026-09-03"],
            ["3", "2026-09-04"],
            ["3", "2026-09-05"]
        ]
    );
    let new_runs = p.rows("SELECT id FROM runs WHERE backfill_id = 3 ORDER BY id");
    assert_eq!(new_runs, [["8"], ["9"]], "no run id is given twice");
    assert!(p.count("SELECT min(t.id) FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 3") > 7);
    // runs names the removal.
    let history = p.run(&["runs", "--dag", "daily_orders"]);
    history.code(0);
    assert!(
        history.stderr.contains(
            "note: forget 1 removed 4 runs of DAG daily_orders (--from 2026-09-04 --to 2026-09-05) at "
        ),
        "{}",
        history.stderr
    );
}

#[test]
fn forgetting_a_whole_dag_leaves_the_other_dags_and_gives_no_id_twice() {
    let p = shop_with_versions();
    p.create("orders_fact", "2026-09-01", "2026-09-02", &["-q"])
        .code(0);
    let other = p.rows("SELECT id, backfill_id FROM runs WHERE dag_id = 'orders_fact' ORDER BY id");
    let out = p.run(&["forget", "--dag", "daily_orders", "--yes", "-q"]);
    out.code(0);
    assert_eq!(out.stdout, "", "-q prints nothing on success");
    assert_eq!(out.stderr, "");
    assert_eq!(
        p.rows("SELECT id, dag_id FROM backfills ORDER BY id"),
        [["3", "orders_fact"]]
    );
    assert_eq!(
        p.rows("SELECT id, backfill_id FROM runs WHERE dag_id = 'orders_fact' ORDER BY id"),
        other
    );
    assert_eq!(
        p.count("SELECT count(*) FROM published WHERE dag_id = 'daily_orders'"),
        0
    );
    assert_eq!(versions(&p), 0);
    assert!(logs(&p).is_empty(), "{:?}", logs(&p));
    assert!(p.path(".backfill/logs/orders_fact").exists());
    assert_eq!(
        p.rows(
            "SELECT coalesce(from_arg, '-'), coalesce(to_arg, '-'), coalesce(range_start, -1), coalesce(range_end, -1) FROM forgets"
        ),
        [["-", "-", "-1", "-1"]],
        "a removal of every interval has no range"
    );
    // The backfill ids 1 and 2 are not given again.
    p.create("daily_orders", "2026-09-01", "2026-09-01", &["-q"])
        .code(0);
    assert_eq!(
        p.rows("SELECT id FROM backfills ORDER BY id"),
        [["3"], ["4"]]
    );
    // A second forget of what is gone removes nothing, and says so.
    let empty = p.run(&[FORGET_4_5, &["--yes"]].concat());
    empty.code(0);
    assert!(
        empty.stderr.contains("nothing to forget"),
        "{}",
        empty.stderr
    );
    assert_eq!(p.count("SELECT count(*) FROM forgets"), 1);
}

#[test]
fn forget_asks_on_a_terminal_and_needs_yes_elsewhere() {
    let p = shop();
    p.create("daily_orders", "2026-09-01", "2026-09-02", &["-q"])
        .code(0);
    // No terminal, no --yes: refused before anything is read or written.
    let out = p.run(&["forget", "--dag", "daily_orders"]);
    out.code(2);
    assert_eq!(out.stdout, "");
    assert_eq!(
        out.stderr,
        "error: forget removes the history of DAG daily_orders for good: add --yes to go on (--dry-run shows what it would remove, and writes nothing)\n"
    );
    assert_eq!(p.count("SELECT count(*) FROM runs"), 2);

    // On a terminal it asks; anything but yes removes nothing.
    let (code, screen) = answered(&p, "n\n");
    assert_eq!(code, 0, "{screen}");
    assert!(
        screen.contains(
            "Forget this history of DAG daily_orders? It cannot be undone. [y/N] nothing was forgotten"
        ),
        "{screen}"
    );
    assert_eq!(p.count("SELECT count(*) FROM runs"), 2);
    let (code, screen) = answered(&p, "y\n");
    assert_eq!(code, 0, "{screen}");
    assert!(screen.contains("note: forgot 1 backfill"), "{screen}");
    assert_eq!(p.count("SELECT count(*) FROM runs"), 0);

    // The dry run's JSON. The rows of the 1st stayed in the target, and the new publish kept
    // them as a version.
    p.create("daily_orders", "2026-09-01", "2026-09-01", &["-q"])
        .code(0);
    let json = p.run(&[
        "forget",
        "--dag",
        "daily_orders",
        "--dry-run",
        "--output",
        "json",
    ]);
    json.code(0);
    assert_eq!(
        json.json(),
        serde_json::json!({
            "dag": "daily_orders", "from": null, "to": null, "dry_run": true, "forget_id": null,
            "backfills": [2], "backfills_kept": [], "runs": 1, "tries": 1, "published": 1,
            "kept_versions": 1
        })
    );
}

/// `forget --dag daily_orders` in a pty of 80 columns, `input` typed into it.
fn answered(p: &Project, input: &str) -> (i32, String) {
    let line = format!(
        "stty cols 80 rows 40; exec {} -C {} forget --dag daily_orders",
        env!("CARGO_BIN_EXE_backfill"),
        p.path("").display()
    );
    let mut child = Command::new(crate::parts::Part::Script.require())
        .envs(p.manifest_env())
        .args(["-qec", &line, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env("TERM", "xterm")
        .env("BACKFILL_NOW", NOW)
        .env_remove("COLUMNS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run script");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n"),
    )
}

#[test]
fn forget_waits_for_a_backfill_that_runs_or_holds_staged_outputs() {
    let p = shop();
    // A backfill killed in the middle is still recorded as running.
    let killed = p.run_with(
        crate::identity::THREE_DAYS,
        &[("BACKFILL_FAULT", "after-publish@2")],
    );
    assert_ne!(killed.code, 0);
    let out = p.run(&["forget", "--dag", "daily_orders", "--yes"]);
    out.code(2);
    assert!(
        out.stderr.contains(&format!(
            "backfill 1 of DAG daily_orders is recorded as running: forget once it has ended (`{}` continues it, `{}` stops it); nothing was forgotten",
            p.hint("resume 1"),
            p.hint("cancel 1")
        )),
        "{}",
        out.stderr
    );
    p.run(&["cancel", "1"]).code(0);
    p.run(&["forget", "--dag", "daily_orders", "--yes", "-q"])
        .code(0);
    assert_eq!(p.count("SELECT count(*) FROM backfills"), 0);

    // Staged outputs wait for their promote or discard.
    p.create(
        "daily_orders",
        "2026-09-01",
        "2026-09-01",
        &["--stage", "-q"],
    )
    .code(0);
    let out = p.run(&["forget", "--dag", "daily_orders", "--yes"]);
    out.code(2);
    assert!(
        out.stderr.contains(&format!(
            "backfill 2 of DAG daily_orders holds staged outputs of this range: promote or discard them first (`{}`)",
            p.hint("discard 2")
        )),
        "{}",
        out.stderr
    );
    assert_eq!(p.count("SELECT count(*) FROM backfills"), 1);
    p.run(&["discard", "2"]).code(0);
    p.run(&["forget", "--dag", "daily_orders", "--yes", "-q"])
        .code(0);
    assert_eq!(p.count("SELECT count(*) FROM backfills"), 0);

    // A DAG that neither the project nor the manifest has is a typo.
    p.run(&["forget", "--dag", "daily_order", "--yes"])
        .code(2)
        .stderr_has("unknown DAG `daily_order`; known DAGs: daily_orders, orders_fact");

    // A range needs the DAG, whose time zone reads it.
    let out = p.run(&[
        "forget",
        "--dag",
        "gone",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-02",
        "--yes",
    ]);
    out.code(2);
    assert!(
        out.stderr.contains("DAG `gone` is not in this project"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_forget_killed_after_its_manifest_transaction_is_finished_by_the_next_forget() {
    let p = shop_with_versions();
    let killed = p.run_with(
        &[FORGET_4_5, &["--yes"]].concat(),
        &[("BACKFILL_FAULT", "forget-recorded")],
    );
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    // The manifest forgot; the warehouse still keeps the versions.
    assert_eq!(p.count("SELECT count(*) FROM runs"), 3);
    assert_eq!(
        p.rows("SELECT state, coalesce(versions, -1) FROM forgets"),
        [["cleaning", "-1"]]
    );
    assert_eq!(versions(&p), 2);
    assert_eq!(logs(&p).len(), 7);
    // The next forget, of anything, finishes it first.
    let out = p.run(&[FORGET_4_5, &["--yes"]].concat());
    out.code(0);
    assert!(
        out.stderr.contains(
            "finishing forget 1 of DAG daily_orders, which stopped before its warehouse clean-up"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("note: nothing to forget"),
        "{}",
        out.stderr
    );
    assert_eq!(
        p.count("SELECT count(*) FROM forgets"),
        1,
        "an empty removal is not recorded"
    );
    assert_eq!(
        p.rows("SELECT id, state, versions FROM forgets ORDER BY id")[0],
        ["1", "done", "2"]
    );
    assert_eq!(versions(&p), 0);
    assert_eq!(logs(&p).len(), 3);
}

#[test]
fn create_and_show_say_when_a_published_partition_is_no_longer_in_the_target() {
    let p = shop();
    p.create("daily_orders", "2026-09-01", "2026-09-05", &["-q"])
        .code(0);
    // Nothing changed: nothing said.
    let quiet = p.create("daily_orders", "2026-09-01", "2026-09-05", &["--dry-run"]);
    quiet.code(0);
    assert!(!quiet.stderr.contains("warning"), "{}", quiet.stderr);
    // Two days emptied by hand, one with a row added.
    wh(&p)
        .execute_batch(
            "DELETE FROM daily_orders WHERE day IN ('2026-09-02', '2026-09-04');
             INSERT INTO daily_orders VALUES ('2026-09-05', 'xx', 1, 1);",
        )
        .unwrap();
    let said = format!(
        "warning: 3 partitions of DAG daily_orders recorded as published no longer hold the rows that were published: 2026-09-02 (5 rows published, 0 now), 2026-09-04 (5 rows published, 0 now), 2026-09-05 (5 rows published, 6 now); --reprocess-behavior none skips them as already existing, and `{}` computes them again",
        p.hint("create --dag daily_orders --from 2026-09-02 --to 2026-09-05 --reprocess-behavior completed")
    );
    let dry = p.create("daily_orders", "2026-09-01", "2026-09-05", &["--dry-run"]);
    dry.code(0);
    assert!(dry.stderr.contains(&said), "{}", dry.stderr);
    let run = p.create("daily_orders", "2026-09-01", "2026-09-05", &[]);
    run.code(0);
    assert!(run.stderr.contains(&said), "{}", run.stderr);
    let shown = p.run(&["show", "1"]);
    shown.code(0);
    assert!(
        shown.stderr.contains(
            "a rerun with --reprocess-behavior none or failed skips them as already existing"
        ),
        "{}",
        shown.stderr
    );
    // `completed` computes them again, and says nothing of them.
    let fixed = p.create(
        "daily_orders",
        "2026-09-02",
        "2026-09-05",
        &["--reprocess-behavior", "completed"],
    );
    fixed.code(0);
    assert!(!fixed.stderr.contains("no longer hold"), "{}", fixed.stderr);
    assert_eq!(
        wh_count(
            &p,
            "SELECT count(*) FROM daily_orders WHERE day BETWEEN '2026-09-01' AND '2026-09-05'"
        ),
        25
    );
    let after = p.create("daily_orders", "2026-09-01", "2026-09-05", &["--dry-run"]);
    assert!(!after.stderr.contains("warning"), "{}", after.stderr);
}

#[test]
fn a_warehouse_that_cannot_be_read_leaves_the_removal_for_the_next_forget_of_the_same_range() {
    let p = shop_with_versions();
    let good = std::fs::read(p.path("warehouse.db")).unwrap();
    std::fs::write(p.path("warehouse.db"), "not a database").unwrap();
    let out = p.run(&[FORGET_4_5, &["--yes"]].concat());
    out.code(1);
    assert!(
        out.stderr.contains(&format!(
            "forget 1 removed DAG daily_orders's history from the manifest, but not yet what its warehouse keeps: run `{}` again to finish",
            p.hint("forget --dag daily_orders --from 2026-09-04 --to 2026-09-05 --yes")
        )),
        "{}",
        out.stderr
    );
    assert_eq!(
        p.rows("SELECT state FROM forgets"),
        [["cleaning"]],
        "the manifest's part is done, the warehouse's waits"
    );
    std::fs::write(p.path("warehouse.db"), good).unwrap();
    let again = p.run(&[FORGET_4_5, &["--yes"]].concat());
    again.code(0);
    assert!(
        again.stderr.contains("finishing forget 1"),
        "{}",
        again.stderr
    );
    assert_eq!(p.rows("SELECT state FROM forgets"), [["done"]]);
    assert_eq!(versions(&p), 0);
    assert_eq!(
        p.count("SELECT count(*) FROM runs"),
        3,
        "the rest of the history stays"
    );
}
