//! The example project of the README, run as the README runs it.

use std::path::Path;

use crate::support::{Project, copy_dir};

#[test]
fn the_quickstart_backfills_september_and_a_second_run_has_nothing_to_do() {
    let p = Project::new();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart"),
        &p.path(""),
    );
    let args = [
        "create",
        "--dag",
        "daily_report",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
    ];
    p.run(&args)
        .code(0)
        .stderr_has("backfill 1 of daily_report: completed — 30 succeeded");
    for day in 1..=30 {
        let part = p.read(&format!("out/report/ds=2026-09-{day:02}/part.csv"));
        assert_eq!(part.lines().count(), 3, "three regions on 2026-09-{day:02}");
    }
    assert_eq!(
        p.count("SELECT SUM(rows) FROM task_tries WHERE task_id = 'report'"),
        90
    );
    let before = p.read("out/report/ds=2026-09-15/part.csv");
    p.run(&args).code(0).stderr_has("30 skipped");
    p.run(&[&args[..], &["--reprocess-behavior", "completed"]].concat())
        .code(0)
        .stderr_has("30 succeeded");
    assert_eq!(
        p.read("out/report/ds=2026-09-15/part.csv"),
        before,
        "reruns are idempotent"
    );
}

#[test]
fn the_shop_example_creates_its_warehouse_and_publishes_september() {
    let p = Project::new();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop"),
        &p.path(""),
    );
    p.run(&[
        "create",
        "--dag",
        "daily_orders",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-30",
    ])
    .code(0)
    .stderr_has("backfill 1 of daily_orders: completed — 30 succeeded");
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 30);
    let wh = rusqlite::Connection::open(p.path("warehouse.db")).unwrap();
    let (rows, days): (i64, i64) = wh
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT day) FROM daily_orders",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((rows, days), (150, 30), "five regions on each of 30 days");
    p.run(&["show", "1"]).code(0).stdout_has("published");
}
