//! `promote --atomic` and `create --atomic` on the shop's fixture warehouse (SQLite): every
//! staged interval is published in one warehouse transaction, or none is. Readers see the old
//! rows until the commit; a rejection, a refusal by the target or a kill at any point publishes
//! all or nothing, and `resume` finishes what was decided.

use std::time::Duration;

use crate::gate::{shop, wh, wh_rows};
use crate::staging::{day_is_exact, published};
use crate::support::{Project, signal, stopped, wait_until};

const DAYS: [&str; 4] = ["2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"];

/// The shop with 09-01..09-04 published (backfill 1), then its source corrected on every day
/// (one cent more on each day's first order) and the range staged again (backfill 2). Returns
/// the rows published by backfill 1.
fn staged_shop() -> (Project, Vec<String>) {
    let p = shop();
    p.create("orders_fact", DAYS[0], DAYS[3], &[]).code(0);
    let before = published(&p);
    wh(&p)
        .execute_batch(
            "UPDATE raw_orders SET amount_cents = amount_cents + 1 WHERE order_id IN
               (SELECT MIN(order_id) FROM raw_orders GROUP BY date(order_ts))",
        )
        .unwrap();
    p.create(
        "orders_fact",
        DAYS[0],
        DAYS[3],
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    (p, before)
}

/// The staged outputs of backfill 2 by state.
fn staged_states(p: &Project) -> Vec<Vec<String>> {
    p.rows(
        "SELECT staged, COUNT(*) FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE r.backfill_id = 2 GROUP BY staged",
    )
}

fn rows(cells: &[&[&str]]) -> Vec<Vec<String>> {
    cells
        .iter()
        .map(|r| r.iter().map(ToString::to_string).collect())
        .collect()
}

/// After a promote that published all four days: each day exact, one publishing try per
/// staged output, nothing decided left, no audit file left.
fn all_published(p: &Project, what: &str) {
    for day in DAYS {
        assert!(day_is_exact(p, day), "{what}: {day}");
    }
    assert_eq!(
        p.rows(
            "SELECT promoted_from, COUNT(*) FROM task_tries
             WHERE promoted_from IS NOT NULL AND state = 'succeeded' AND verdict = 'published'
             GROUP BY promoted_from ORDER BY promoted_from"
        ),
        rows(&[&["5", "1"], &["6", "1"], &["7", "1"], &["8", "1"]]),
        "{what}: one publishing try per staged output"
    );
    assert_eq!(staged_states(p), rows(&[&["promoted", "4"]]), "{what}");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        0,
        "{what}"
    );
    // Each day's rows were replaced once: one kept version per day, of backfill 1's rows.
    assert_eq!(
        wh_rows(
            p,
            "SELECT COUNT(*), COUNT(DISTINCT interval_start) FROM _backfill_versions"
        ),
        ["Integer(4)|Integer(4)"],
        "{what}"
    );
    assert_eq!(
        std::fs::read_dir(p.path(".backfill/audit"))
            .unwrap()
            .count(),
        0,
        "{what}: nothing left behind"
    );
}

#[test]
fn an_atomic_promote_publishes_every_interval_at_its_one_commit() {
    let (p, before) = staged_shop();
    // Frozen inside its transaction, every day written, nothing committed: a reader sees the
    // old rows of every day.
    let frozen = p.spawn_with(
        "promote",
        &["promote", "2", "--atomic"],
        &[("BACKFILL_FAULT", "before-commit:stop")],
    );
    wait_until("the promote to freeze", Duration::from_secs(30), || {
        stopped(frozen.id())
    });
    assert_eq!(
        published(&p),
        before,
        "readers see the old rows until the commit"
    );
    signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let out = p.wait("promote", frozen);
    out.code(0);
    all_published(&p, "promote --atomic");
    assert_eq!(
        p.rows("SELECT kind, atomic, state, source_backfill FROM backfills WHERE id = 3"),
        rows(&[&["promote", "1", "completed", "2"]])
    );
    let log = std::fs::read_dir(p.path(".backfill/logs/orders_fact/load"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .find(|l| l.contains("promoting"))
        .unwrap();
    assert!(
        log.contains("in one transaction with 3 other outputs"),
        "{log}"
    );
    p.run(&["list"])
        .code(0)
        .stdout_has("completed (atomic promote of 2)");
    // Promoting again finds nothing left.
    p.run(&["promote", "2", "--atomic"])
        .code(0)
        .stderr_has("nothing to promote");
}

#[test]
fn a_rejected_interval_publishes_none_and_the_outputs_stay_staged() {
    let p = shop();
    p.create("orders_fact", DAYS[0], DAYS[3], &[]).code(0);
    let before = published(&p);
    // A tenth of 09-03's orders go (drift beyond the gate's 2%), every day's amounts change;
    // staged with --allow-drift, judged again without it when promoted.
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-03' AND order_id % 10 = 0;
             UPDATE raw_orders SET amount_cents = amount_cents + 1 WHERE order_id IN
               (SELECT MIN(order_id) FROM raw_orders GROUP BY date(order_ts));",
        )
        .unwrap();
    p.create(
        "orders_fact",
        DAYS[0],
        DAYS[3],
        &[
            "--stage",
            "--reprocess-behavior",
            "completed",
            "--allow-drift",
        ],
    )
    .code(0);
    let out = p.run(&["promote", "2", "--atomic"]);
    out.code(3);
    assert_eq!(published(&p), before, "nothing published");
    assert_eq!(staged_states(&p), rows(&[&["staged", "4"]]));
    assert_eq!(
        p.rows(
            "SELECT r.interval_start, r.state, t.state,
                    CASE WHEN t.error LIKE 'not published: task `load`, 2026-09-03%all or none'
                         THEN 'all or none' ELSE '-' END
             FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE r.backfill_id = 3 ORDER BY r.interval_start"
        ),
        rows(&[
            &["1788220800", "failed", "failed", "all or none"],
            &["1788307200", "failed", "failed", "all or none"],
            &["1788393600", "rejected", "rejected", "-"],
            &["1788480000", "failed", "failed", "all or none"],
        ])
    );
    // Every run of the refused promote ended with it: `resume` has nothing of it to publish.
    p.run(&["resume", "3"])
        .code(3)
        .stderr_has("0 intervals left to run");
    assert_eq!(
        published(&p),
        before,
        "resume publishes none of a refused promote"
    );
    assert_eq!(staged_states(&p), rows(&[&["staged", "4"]]));
    // Reviewed and accepted: all four publish, at once.
    p.run(&["promote", "2", "--atomic", "--allow-drift"])
        .code(0);
    for day in DAYS {
        assert!(day_is_exact(&p, day), "{day}");
    }
    assert_eq!(staged_states(&p), rows(&[&["promoted", "4"]]));
}

#[test]
fn a_refusal_by_the_target_inside_the_transaction_undoes_the_days_before_it() {
    let (p, before) = staged_shop();
    // The target refuses 09-03's rows: 09-01 and 09-02 are written by then, in the same
    // transaction.
    wh(&p)
        .execute_batch(
            "CREATE TRIGGER no_0903 BEFORE INSERT ON orders_fact WHEN NEW.order_day = '2026-09-03'
             BEGIN SELECT RAISE(ABORT, 'closed for audit'); END;",
        )
        .unwrap();
    let out = p.run(&["promote", "2", "--atomic"]);
    out.code(3).stderr_has("closed for audit");
    assert_eq!(published(&p), before, "09-01 and 09-02 were rolled back");
    assert_eq!(staged_states(&p), rows(&[&["staged", "4"]]));
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        0
    );
    assert_eq!(
        std::fs::read_dir(p.path(".backfill/audit"))
            .unwrap()
            .count(),
        4,
        "the staged outputs are kept"
    );
    wh(&p).execute_batch("DROP TRIGGER no_0903").unwrap();
    p.run(&["promote", "2", "--atomic"]).code(0);
    for day in DAYS {
        assert!(day_is_exact(&p, day), "{day}");
    }
}

#[test]
fn an_atomic_promote_killed_at_any_point_publishes_all_or_nothing_and_resume_finishes_it() {
    for (fault, committed) in [
        ("before-intent", false),
        ("before-publish", false),
        ("before-commit", false),
        ("after-publish", true),
    ] {
        let (p, before) = staged_shop();
        let killed = p
            .command(&["promote", "2", "--atomic"])
            .env("BACKFILL_FAULT", fault)
            .output()
            .unwrap();
        assert_eq!(killed.status.code(), None, "{fault}: died of a signal");
        if committed {
            for day in DAYS {
                assert!(day_is_exact(&p, day), "{fault}: {day}");
            }
        } else {
            assert_eq!(published(&p), before, "{fault}: nothing published yet");
        }
        // The recovery finishes the decided publishes in one transaction too: a second
        // commit into the warehouse would be killed.
        p.run_with(&["resume", "3"], &[("BACKFILL_FAULT", "before-commit@2")])
            .code(0);
        all_published(&p, fault);
    }
}

#[test]
fn an_atomic_promote_commits_into_the_warehouse_once() {
    let (p, _) = staged_shop();
    // A second commit into the warehouse would kill the process.
    p.run_with(
        &["promote", "2", "--atomic"],
        &[("BACKFILL_FAULT", "before-commit@2")],
    )
    .code(0);
    all_published(&p, "one commit");
}

#[test]
fn create_atomic_stages_then_publishes_the_range_at_once() {
    let p = shop();
    p.create("orders_fact", DAYS[0], DAYS[3], &["--atomic"])
        .code(0);
    for day in DAYS {
        assert!(day_is_exact(&p, day), "{day}");
    }
    assert_eq!(
        p.rows("SELECT id, kind, atomic, state FROM backfills ORDER BY id"),
        rows(&[
            &["1", "stage", "0", "completed"],
            &["2", "promote", "1", "completed"]
        ])
    );
    // A range with an interval that does not stage publishes nothing.
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE date(order_ts) = '2026-09-02' AND order_id % 10 = 0;
             UPDATE raw_orders SET amount_cents = amount_cents + 1 WHERE order_id IN
               (SELECT MIN(order_id) FROM raw_orders GROUP BY date(order_ts));",
        )
        .unwrap();
    let before = published(&p);
    p.create(
        "orders_fact",
        DAYS[0],
        DAYS[3],
        &["--atomic", "--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has("nothing published: not every interval of backfill 3 was staged");
    assert_eq!(published(&p), before);
    assert_eq!(p.count("SELECT COUNT(*) FROM backfills"), 3);
}

#[test]
fn atomic_refuses_command_tasks_and_a_second_flag_before_writing_anything() {
    let p = shop();
    p.write(
        "dags/exported.toml",
        r#"schedule = "@daily"

[[tasks]]
id = "export"
command = '''printf '{"rows": 2, "fingerprint": "f-{{ ds }}"}' > "$BACKFILL_RESULT"'''
publish = '''cp "$BACKFILL_RESULT" "published-{{ ds }}"'''
[tasks.gate]
source_count = "echo 2"
"#,
    );
    p.create("exported", DAYS[0], DAYS[1], &["--atomic"])
        .code(2)
        .stderr_has("task `export` of DAG `exported` is a command task");
    assert_eq!(p.dump(), "no manifest", "nothing written");
    p.create("exported", DAYS[0], DAYS[1], &["--stage"]).code(0);
    let manifest = p.dump();
    p.run(&["promote", "1", "--atomic"])
        .code(2)
        .stderr_has("is a command task, whose publish cannot share one");
    assert_eq!(p.dump(), manifest, "nothing written");
    p.create("orders_fact", DAYS[0], DAYS[1], &["--atomic", "--stage"])
        .code(2);
}

#[test]
fn the_guide_s_atomic_lines_work_as_pasted() {
    let p = Project::new();
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    let bin = p.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_backfill"), bin.join("backfill")).unwrap();
    let block = crate::support::block_with("--to 2026-09-30 --atomic");
    let out = std::process::Command::new("/bin/sh")
        .args(["-e", "-c", &block])
        .current_dir(p.path("."))
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env_remove("BACKFILL_MANIFEST")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // September published twice, at once each time: the second promote replaced every day.
    let manifest = rusqlite::Connection::open(shop.join(".backfill/manifest.db")).unwrap();
    let backfills: Vec<(String, i64, String)> = manifest
        .prepare("SELECT kind, atomic, state FROM backfills ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let row = |k: &str, a: i64| (k.to_string(), a, "completed".to_string());
    assert_eq!(
        backfills,
        [
            row("stage", 0),
            row("promote", 1),
            row("stage", 0),
            row("promote", 1)
        ]
    );
    let published: i64 = manifest
        .query_row(
            "SELECT COUNT(*) FROM published p JOIN task_tries t ON t.id = p.try_id
             JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 4",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(published, 30);
}

#[test]
fn an_atomic_promote_of_a_two_task_dag_publishes_both_tasks_of_every_day_in_one_commit() {
    let p = crate::staging::two_tasks();
    p.create("two", DAYS[0], DAYS[2], &[]).code(0);
    crate::staging::bump_03(&p, 1);
    p.create(
        "two",
        DAYS[0],
        DAYS[2],
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    p.run_with(
        &["promote", "2", "--atomic"],
        &[("BACKFILL_FAULT", "before-commit@2")],
    )
    .code(0);
    for day in &DAYS[..3] {
        assert!(day_is_exact(&p, day), "{day}");
    }
    // Each day's run ended with both its tasks' tries, and every staged output is promoted.
    assert_eq!(
        p.rows(
            "SELECT r.state, COUNT(*) FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE r.backfill_id = 3 AND t.state = 'succeeded' GROUP BY r.id, r.state ORDER BY r.id"
        ),
        rows(&[&["succeeded", "2"], &["succeeded", "2"], &["succeeded", "2"]])
    );
    assert_eq!(staged_states(&p), rows(&[&["promoted", "6"]]));
}
