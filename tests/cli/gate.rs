//! The publication gate against the fixture warehouse of `examples/shop`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use rusqlite::Connection;

use crate::support::{Out, Project, wait_until};

/// The example's warehouse, created once from its init files (for every test process, in the
/// target's folder for tests, named by its init files' contents) and copied into each test.
fn template_warehouse() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
        let init = vec![shop.join("schema.sql"), shop.join("seed.sql")];
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        for f in &init {
            std::fs::read(f).unwrap().hash(&mut hash);
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let template = dir.join(format!("shop-warehouse-{:016x}.db", hash.finish()));
        if template.exists() {
            return template;
        }
        // Made aside, then renamed into place: a test process racing this one makes the same.
        let aside = tempfile::tempdir_in(dir).unwrap();
        let w = backfill::project::Warehouse {
            name: "shop".into(),
            kind: backfill::project::WarehouseKind::Sqlite,
            path: aside.path().join("warehouse.db"),
            init,
            busy_timeout: backfill::project::DEFAULT_BUSY_TIMEOUT,
            keep_versions: backfill::project::DEFAULT_KEEP_VERSIONS,
        };
        let conn = backfill::warehouse::open(&w).unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode = DELETE")
            .unwrap();
        drop(conn);
        std::fs::rename(&w.path, &template).unwrap();
        template
    })
}

/// A copy of `examples/shop` with its warehouse already created.
pub(crate) fn shop() -> Project {
    let p = Project::new();
    let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
    for file in [
        "backfill.toml",
        "schema.sql",
        "seed.sql",
        "dags/daily_orders.toml",
        "dags/orders_fact.toml",
    ] {
        p.write(file, &std::fs::read_to_string(shop.join(file)).unwrap());
    }
    std::fs::copy(template_warehouse(), p.path("warehouse.db")).unwrap();
    p
}

/// A copy of all of `examples/shop` (every DAG) in the folder `rel` of `p`, with its warehouse
/// already created: `rel = "examples/shop"` makes `p` stand for this repository's folder.
pub(crate) fn whole_shop(p: &Project, rel: &str) -> PathBuf {
    let dir = p.path(rel);
    crate::support::copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop"),
        &dir,
    );
    std::fs::copy(template_warehouse(), dir.join("warehouse.db")).unwrap();
    dir
}

pub(crate) fn wh(p: &Project) -> Connection {
    let c = Connection::open(p.path("warehouse.db")).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c
}

/// Every row of a warehouse query as one string, in order.
pub(crate) fn wh_rows(p: &Project, sql: &str) -> Vec<String> {
    let c = wh(p);
    let mut stmt = c.prepare(sql).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        Ok((0..n)
            .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
            .collect::<Vec<_>>()
            .join("|"))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

pub(crate) fn wh_count(p: &Project, sql: &str) -> i64 {
    wh(p).query_row(sql, [], |r| r.get(0)).unwrap()
}

fn create(p: &Project, dag: &str, from: &str, to: &str, extra: &[&str]) -> Out {
    p.create(dag, from, to, extra)
}

/// The daily_orders partition of a day, straight from the raw orders.
const EXPECTED_SEPTEMBER: &str =
    "SELECT date(order_ts), region, COUNT(*), SUM(amount_cents) FROM raw_orders
     WHERE order_ts >= '2026-09-01' AND order_ts < '2026-10-01' GROUP BY 1, 2 ORDER BY 1, 2";
const PUBLISHED_SEPTEMBER: &str = "SELECT day, region, orders, revenue_cents FROM daily_orders
     WHERE day BETWEEN '2026-09-01' AND '2026-09-30' ORDER BY 1, 2";

/// Replaces `old` by `new` in a DAG file (`new` must differ).
pub(crate) fn edit_dag(p: &Project, dag: &str, old: &str, new: &str) {
    let file = format!("dags/{dag}.toml");
    let text = p.read(&file);
    assert!(text.contains(old), "{old:?} not in {file}");
    p.write(&file, &text.replacen(old, new, 1));
}

#[test]
fn a_double_run_publishes_identical_partitions_and_records_both_tries() {
    let p = shop();
    create(
        &p,
        "daily_orders",
        "2026-09-01",
        "2026-09-30",
        &["--max-active-runs", "4"],
    )
    .code(0)
    .stderr_has("30 succeeded");
    let first = wh_rows(&p, PUBLISHED_SEPTEMBER);
    // Four intervals published into one table at once, and every partition landed intact.
    assert_eq!(first, wh_rows(&p, EXPECTED_SEPTEMBER));
    assert_eq!(first.len(), 150);
    create(
        &p,
        "daily_orders",
        "2026-09-01",
        "2026-09-30",
        &[
            "--max-active-runs",
            "4",
            "--reprocess-behavior",
            "completed",
        ],
    )
    .code(0);
    assert_eq!(
        wh_rows(&p, PUBLISHED_SEPTEMBER),
        first,
        "identical row for row"
    );
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) - COUNT(DISTINCT day || region) FROM daily_orders"
        ),
        0,
        "no duplicates"
    );
    // Two published tries per interval with equal counts and fingerprints.
    let per_interval = p.rows(
        "SELECT r.interval_start, COUNT(*), COUNT(DISTINCT t.rows), COUNT(DISTINCT t.fingerprint), MIN(t.rows)
         FROM task_tries t JOIN runs r ON r.id = t.run_id
         WHERE t.verdict = 'published' GROUP BY r.interval_start",
    );
    assert_eq!(per_interval.len(), 30);
    assert!(
        per_interval.iter().all(|r| r[1..] == ["2", "1", "1", "5"]),
        "{per_interval:?}"
    );
    // The published table points at the second backfill's tries.
    assert_eq!(
        p.count(
            "SELECT COUNT(*) FROM published p JOIN task_tries t ON t.id = p.try_id
             JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 2"
        ),
        30
    );
    // No audit table is left behind.
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '_backfill_audit%'"
        ),
        0
    );
}

fn orders_fact_is_exact(p: &Project, days: &[&str]) {
    for day in days {
        let published = wh_count(
            p,
            &format!("SELECT COUNT(*) FROM orders_fact WHERE order_day = '{day}'"),
        );
        let raw = wh_count(
            p,
            &format!("SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '{day}'"),
        );
        assert_eq!(published, raw, "exactly one copy of {day}");
    }
    assert_eq!(
        wh_count(
            p,
            "SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM orders_fact"
        ),
        0
    );
}

#[test]
fn a_crash_right_after_the_publish_commit_is_repaired_without_recomputing() {
    let p = shop();
    let crashed = p
        .command(&[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-03",
            "--max-active-runs",
            "1",
        ])
        .env("BACKFILL_FAULT", "after-publish")
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None, "the process died of a signal");
    // The warehouse has the partition; the manifest only knows the intent.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE"),
        1
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 0);
    p.run(&["resume", "1"]).code(0);
    orders_fact_is_exact(&p, &["2026-09-01", "2026-09-02", "2026-09-03"]);
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 3);
    // The crashed try was completed, not recomputed: one try, one run for 2026-09-01.
    assert_eq!(
        p.rows("SELECT r.state, COUNT(t.id) FROM runs r JOIN task_tries t ON t.run_id = r.id GROUP BY r.id ORDER BY r.id"),
        [["succeeded", "1"], ["succeeded", "1"], ["succeeded", "1"]]
    );
}

#[test]
fn a_crash_before_the_publish_is_repaired_from_the_audit_table() {
    let p = shop();
    let crashed = p
        .command(&[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-02",
            "--max-active-runs",
            "1",
        ])
        .env("BACKFILL_FAULT", "before-publish")
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None);
    assert_eq!(
        wh_count(&p, "SELECT COUNT(*) FROM orders_fact"),
        0,
        "nothing published yet"
    );
    let audit = p.rows("SELECT audit_path FROM task_tries WHERE publishing = TRUE");
    assert_eq!(audit.len(), 1);
    let audit_file = PathBuf::from(&audit[0][0]);
    assert!(
        audit_file.starts_with(p.path(".backfill/audit")),
        "{audit_file:?}"
    );
    assert!(audit_file.exists(), "the audited rows wait in their file");
    p.run(&["resume", "1"]).code(0);
    orders_fact_is_exact(&p, &["2026-09-01", "2026-09-02"]);
    assert!(!audit_file.exists(), "the audit file went with the publish");
    assert_eq!(
        std::fs::read_dir(p.path(".backfill/audit"))
            .unwrap()
            .count(),
        0,
        "no audit file is left"
    );
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '_backfill_audit%'"
        ),
        0,
        "the warehouse holds no table of backfill's"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries"),
        2,
        "nothing was recomputed"
    );
}

#[test]
fn a_zero_row_rerun_is_rejected_and_an_empty_source_needs_allow_empty() {
    let p = shop();
    create(&p, "daily_orders", "2026-09-18", "2026-09-18", &[]).code(0);
    let day = "SELECT * FROM daily_orders WHERE day = '2026-09-18' ORDER BY region";
    let before = wh_rows(&p, day);
    assert_eq!(before.len(), 5);

    // A wrong date format: the filter matches nothing although the orders exist.
    let good = "WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end\nGROUP BY";
    let wrong = "WHERE order_ts >= :ds_nodash AND order_ts < :next_ds\nGROUP BY";
    edit_dag(&p, "daily_orders", good, wrong);
    create(
        &p,
        "daily_orders",
        "2026-09-18",
        "2026-09-18",
        &["--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has("rejected: zero rows while source has data (5 source rows)");
    assert_eq!(
        wh_rows(&p, day),
        before,
        "the published partition is intact"
    );
    let rejected = p.rows(
        "SELECT state, rows, source_rows, previous_rows, verdict, reasons FROM task_tries ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(
        rejected,
        [[
            "rejected",
            "0",
            "5",
            "5",
            "rejected",
            "zero rows while source has data (5 source rows)"
        ]]
    );
    edit_dag(&p, "daily_orders", wrong, good);

    // The source really is empty now: rejected unless empty partitions are allowed.
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE order_ts >= '2026-09-18' AND order_ts < '2026-09-19'",
        )
        .unwrap();
    create(
        &p,
        "daily_orders",
        "2026-09-18",
        "2026-09-18",
        &["--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has("zero rows and an empty source; set allow_empty = true");
    assert_eq!(wh_rows(&p, day), before);

    edit_dag(
        &p,
        "daily_orders",
        "tolerance = 0.02",
        "tolerance = 0.02\nallow_empty = true",
    );
    create(
        &p,
        "daily_orders",
        "2026-09-18",
        "2026-09-18",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(
        wh_rows(&p, day),
        Vec::<String>::new(),
        "the partition was deleted explicitly"
    );
    assert_eq!(
        p.rows("SELECT rows FROM published"),
        [["0"]],
        "a published empty partition"
    );
    let show = p.run(&["show", "4", "--output", "json"]).json();
    assert_eq!(show["interval_details"][0]["verdict"], "published empty");
    assert_eq!(show["interval_details"][0]["reasons"], "empty source");
    assert_eq!(show["interval_details"][0]["rows"], 0);
}

#[test]
fn drift_against_the_published_partition_is_rejected_unless_allowed() {
    let p = shop();
    create(&p, "orders_fact", "2026-09-10", "2026-09-10", &[]).code(0);
    let published = wh_count(
        &p,
        "SELECT COUNT(*) FROM orders_fact WHERE order_day = '2026-09-10'",
    );
    // Delete 5% of the day's raw orders.
    wh(&p)
        .execute_batch(
            "DELETE FROM raw_orders WHERE order_ts >= '2026-09-10' AND order_ts < '2026-09-11' AND order_id % 20 = 0",
        )
        .unwrap();
    let source = wh_count(
        &p,
        "SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '2026-09-10'",
    );
    assert!(source < published * 96 / 100);
    let out = create(
        &p,
        "orders_fact",
        "2026-09-10",
        "2026-09-10",
        &["--reprocess-behavior", "completed"],
    );
    out.code(3)
        .stderr_has(&format!(
            "drift: row count {source} differs from the published {published}"
        ))
        .stderr_has("--reprocess-behavior failed`; 1 interval was rejected for drift (against what is published, or the task's history): if that change is expected, add --allow-drift");
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM orders_fact WHERE order_day = '2026-09-10'"
        ),
        published,
        "the published partition is intact"
    );
    // The source check passed: the output matches the source exactly.
    assert_eq!(
        p.rows("SELECT rows, source_rows, previous_rows FROM task_tries ORDER BY id DESC LIMIT 1"),
        [[
            source.to_string(),
            source.to_string(),
            published.to_string()
        ]]
    );
    let runs = p.run(&["runs", "--dag", "orders_fact"]);
    runs.code(0)
        .stdout_has(" rejected ")
        .stdout_has(" drift: row count ");
    create(
        &p,
        "orders_fact",
        "2026-09-10",
        "2026-09-10",
        &["--reprocess-behavior", "completed", "--allow-drift"],
    )
    .code(0);
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM orders_fact WHERE order_day = '2026-09-10'"
        ),
        source
    );
}

#[test]
fn rows_outside_the_interval_are_rejected() {
    let p = shop();
    edit_dag(
        &p,
        "daily_orders",
        "AND order_ts < :data_interval_end\nGROUP BY",
        "AND order_ts < datetime(:data_interval_end, '+1 hour')\nGROUP BY",
    );
    create(&p, "daily_orders", "2026-09-18", "2026-09-18", &[])
        .code(3)
        .stderr_has(
            "rejected: row outside interval: 5 of 10 rows have a partition value outside the interval: '2026-09-19'",
        );
    assert_eq!(wh_count(&p, "SELECT COUNT(*) FROM daily_orders"), 0);
    assert_eq!(p.rows("SELECT state FROM runs"), [["rejected"]]);
}

#[test]
fn a_null_partition_value_is_shown_in_the_rejection() {
    let p = shop();
    // An unparseable timestamp makes date() NULL, which lies in no interval.
    edit_dag(
        &p,
        "daily_orders",
        "SELECT date(order_ts) AS day",
        "SELECT date(CASE region WHEN 'eu' THEN 'late: ' || order_ts ELSE order_ts END) AS day",
    );
    let reason =
        "row outside interval: 1 of 5 rows has a partition value outside the interval: NULL";
    create(&p, "daily_orders", "2026-09-18", "2026-09-18", &[])
        .code(3)
        .stderr_has(&format!("rejected: {reason}"));
    assert_eq!(p.rows("SELECT reasons FROM task_tries"), [[reason]]);
    assert_eq!(wh_count(&p, "SELECT COUNT(*) FROM daily_orders"), 0);
}

#[test]
fn duplicated_rows_are_rejected_on_the_unique_key() {
    let p = shop();
    edit_dag(
        &p,
        "daily_orders",
        "GROUP BY 1, 2\n\"\"\"",
        "GROUP BY 1, 2\nUNION ALL\nSELECT date(order_ts), region, 1, 1 FROM raw_orders\nWHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end AND region = 'eu'\n\"\"\"",
    );
    create(&p, "daily_orders", "2026-09-18", "2026-09-18", &[])
        .code(3)
        .stderr_has("rejected: unique_key violated");
    assert_eq!(wh_count(&p, "SELECT COUNT(*) FROM daily_orders"), 0);
}

/// A SQLite target with a key: a rerun replaces its partitions, and an output that its key
/// refuses (a duplicate the gate's `unique_key` does not name) is rejected in the database's
/// words, as on PostgreSQL, not retried, and the published partition stays.
#[test]
fn a_keyed_target_reruns_and_rejects_what_its_key_refuses() {
    let p = shop();
    wh(&p)
        .execute_batch("CREATE UNIQUE INDEX daily_orders_once ON daily_orders (day, region)")
        .unwrap();
    create(&p, "daily_orders", "2026-09-18", "2026-09-19", &[]).code(0);
    create(
        &p,
        "daily_orders",
        "2026-09-18",
        "2026-09-19",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let published = wh_rows(&p, PUBLISHED_SEPTEMBER);
    assert_eq!(published.len(), 10);
    edit_dag(
        &p,
        "daily_orders",
        "unique_key = [\"day\", \"region\"]\n",
        "",
    );
    edit_dag(&p, "daily_orders", "tolerance = 0.02", "tolerance = 0.5");
    // The example's check that reconciles each region's orders with the source would name the
    // duplicate first: this test is about the target's own key.
    let text = p.read("dags/daily_orders.toml");
    let checks = text
        .find("[[tasks.gate.checks]]")
        .expect("the example's check");
    p.write("dags/daily_orders.toml", &text[..checks]);
    edit_dag(
        &p,
        "daily_orders",
        "GROUP BY 1, 2\n\"\"\"",
        "GROUP BY 1, 2\nUNION ALL\nSELECT date(order_ts), region, 1, 1 FROM raw_orders\nWHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end AND region = 'eu'\nGROUP BY 1, 2\n\"\"\"",
    );
    create(
        &p,
        "daily_orders",
        "2026-09-18",
        "2026-09-18",
        &["--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has(
        "rejected: target constraint violated: UNIQUE constraint failed: daily_orders.day, daily_orders.region",
    );
    assert_eq!(wh_rows(&p, PUBLISHED_SEPTEMBER), published);
    assert_eq!(
        p.rows(
            "SELECT t.try_number, t.state, t.verdict FROM task_tries t JOIN runs r ON r.id = t.run_id \
             WHERE r.backfill_id = 3"
        ),
        [["1", "rejected", "rejected"]].map(|r| r.map(String::from).to_vec())
    );
}

#[test]
fn verify_passes_on_daily_orders_and_catches_the_current_time() {
    let p = shop();
    let out = p.run(&[
        "verify",
        "--dag",
        "daily_orders",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-02",
        "--output",
        "json",
    ]);
    out.code(0).stderr_has("2 deterministic, 0 not");
    let checks = out.json();
    assert_eq!(checks.as_array().unwrap().len(), 2);
    assert_eq!(checks[0]["first"], checks[0]["second"]);
    assert_eq!(checks[0]["first"]["rows"], 5);
    assert_eq!(checks[0]["first"]["error"], serde_json::Value::Null);
    assert_eq!(checks[0]["result"], "deterministic");
    assert!(!p.manifest_path().exists(), "verify records nothing");
    assert_eq!(
        wh_count(&p, "SELECT COUNT(*) FROM daily_orders"),
        0,
        "and publishes nothing"
    );

    wh(&p)
        .execute_batch("ALTER TABLE daily_orders ADD COLUMN loaded_at TEXT")
        .unwrap();
    edit_dag(
        &p,
        "daily_orders",
        "SUM(amount_cents) AS revenue_cents",
        "SUM(amount_cents) AS revenue_cents, CURRENT_TIMESTAMP AS loaded_at",
    );
    p.run(&[
        "verify",
        "--dag",
        "daily_orders",
        "--from",
        "2026-09-01",
        "--to",
        "2026-09-01",
    ])
    .code(3)
    .stderr_has(
        "task `aggregate` is not deterministic for interval 2026-09-01: two computations differ",
    );
}

#[test]
fn a_day_that_failed_before_is_the_only_one_rerun_and_the_rest_stay_untouched() {
    let p = shop();
    edit_dag(
        &p,
        "daily_orders",
        "[[tasks]]\nid = \"aggregate\"",
        "[[tasks]]\nid = \"source_ready\"\nretries = 0\ncommand = '''if [ -f \"late-{{ ds }}\" ]; then rm \"late-{{ ds }}\"; exit 1; fi'''\n\n[[tasks]]\nid = \"aggregate\"\ndepends_on = [\"source_ready\"]",
    );
    p.write("late-2026-09-18", "");
    create(
        &p,
        "daily_orders",
        "2026-09-01",
        "2026-09-30",
        &["--max-active-runs", "4"],
    )
    .code(3)
    .stderr_has("29 succeeded, 1 failed");
    let before = p.rows("SELECT interval_start, try_id FROM published ORDER BY interval_start");
    assert_eq!(before.len(), 29);
    let out = create(
        &p,
        "daily_orders",
        "2026-09-01",
        "2026-09-30",
        &[
            "--reprocess-behavior",
            "failed",
            "--max-active-runs",
            "3",
            "--run-backwards",
            "--output",
            "json",
        ],
    );
    out.code(0);
    let summary = out.json();
    assert_eq!(summary["intervals"]["succeeded"], 1);
    assert_eq!(summary["skipped"]["already exists"], 29);
    let after = p.rows("SELECT interval_start, try_id FROM published ORDER BY interval_start");
    assert_eq!(after.len(), 30);
    let sept_18 = chrono::DateTime::parse_from_rfc3339("2026-09-18T00:00:00Z")
        .unwrap()
        .timestamp()
        .to_string();
    let untouched: Vec<_> = after.iter().filter(|r| r[0] != sept_18).cloned().collect();
    assert_eq!(
        untouched, before,
        "the other 29 published tries are unchanged"
    );
    assert_eq!(
        wh_rows(&p, PUBLISHED_SEPTEMBER),
        wh_rows(&p, EXPECTED_SEPTEMBER)
    );
}

#[test]
fn a_locked_warehouse_is_waited_for_not_failed() {
    let p = shop();
    // A busy timeout far shorter than the lock is held: SQLite gives up waiting by itself, and
    // backfill's own retry loop must keep waiting rather than fail the try.
    let toml = p.read("backfill.toml").replace(
        "init = [\"schema.sql\", \"seed.sql\"]",
        "init = [\"schema.sql\", \"seed.sql\"]\nbusy_timeout = \"50ms\"",
    );
    p.write("backfill.toml", &toml);
    let holder = wh(&p);
    // As after any earlier use: readers go on while another process writes.
    holder
        .execute_batch("PRAGMA journal_mode = WAL; BEGIN IMMEDIATE")
        .unwrap();
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-02",
        ],
    );
    let logs = p.path(".backfill/logs/daily_orders/aggregate");
    wait_until(
        "a publish to wait past its busy timeout",
        Duration::from_secs(20),
        || {
            std::fs::read_dir(&logs).is_ok_and(|d| {
                d.filter_map(Result::ok).any(|e| {
                    std::fs::read_to_string(e.path()).is_ok_and(|l| {
                        l.contains("the warehouse is locked by another writer; waiting")
                    })
                })
            })
        },
    );
    // Audits take no write lock: both days are audited and wait to publish.
    wait_until(
        "both days to wait to publish",
        Duration::from_secs(20),
        || p.count("SELECT COUNT(*) FROM task_tries WHERE publishing = TRUE") == 2,
    );
    holder.execute_batch("COMMIT").unwrap();
    p.wait("run", child).code(0);
    assert_eq!(
        p.rows("SELECT DISTINCT state, try_number FROM task_tries"),
        [["succeeded", "1"]],
        "no try failed while the warehouse was locked"
    );
}

#[test]
fn a_gated_command_task_publishes_only_after_its_gate_passed() {
    let p = Project::new().dag(
        "cmd",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 10, "fingerprint": "f"}' > "$BACKFILL_RESULT"'''
publish = "touch published-{{ ds }}"
[tasks.gate]
source_count = "cat source-{{ ds }}"
tolerance = 0.0
"#,
    );
    p.write("source-2026-01-01", "10\n");
    p.write("source-2026-01-02", "20\n");
    p.write("source-2026-01-03", "ten\n");
    let out = create(
        &p,
        "cmd",
        "2026-01-01",
        "2026-01-03",
        &["--max-active-runs", "1"],
    );
    out.code(3)
        .stderr_has("row count 10 differs from the source count 20 by 50.0%")
        .stderr_has("source_count command printed `ten`, not one integer");
    assert!(p.path("published-2026-01-01").exists());
    assert!(
        !p.path("published-2026-01-02").exists(),
        "no publish after a rejection"
    );
    assert!(!p.path("published-2026-01-03").exists());
    assert_eq!(
        p.rows("SELECT interval_start, rows FROM published"),
        [[crate::support::day_unix(1).to_string(), "10".to_string()]]
    );
    assert_eq!(
        p.rows("SELECT state FROM runs ORDER BY interval_start"),
        [["succeeded"], ["rejected"], ["failed"]]
    );
}

#[test]
fn sql_task_mistakes_are_exit_2_before_anything_is_written() {
    let p = shop();
    let cases = [
        (
            "warehouse = \"shop\"",
            "warehouse = \"shop2\"",
            "unknown warehouse `shop2`",
        ),
        (
            "AS revenue_cents",
            "AS revenue",
            "returns column `revenue`, which target table `daily_orders` does not have",
        ),
        (
            ":data_interval_end\nGROUP BY",
            ":end\nGROUP BY",
            "uses bind parameter `:end`",
        ),
        (
            "partition_column = \"day\"",
            "partition_column = \"day; DROP TABLE x\"",
            "is not a plain SQL name",
        ),
        (
            "unique_key = [\"day\", \"region\"]",
            "unique_key = [\"day\", \"city\"]",
            "must return column `city`",
        ),
    ];
    for (old, new, message) in cases {
        let original = p.read("dags/daily_orders.toml");
        edit_dag(&p, "daily_orders", old, new);
        create(&p, "daily_orders", "2026-09-01", "2026-09-01", &[])
            .code(2)
            .stderr_has(message);
        assert!(!p.manifest_path().exists(), "{message}: nothing written");
        p.write("dags/daily_orders.toml", &original);
    }
}

#[test]
fn a_manifest_of_the_previous_schema_is_upgraded() {
    let p = Project::new().sqlite().dag(
        "daily",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    std::fs::create_dir_all(p.path(".backfill")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifest-v1.db"),
        p.manifest_path(),
    )
    .unwrap();
    let show = p.run(&["show", "1", "--output", "json"]);
    show.code(0);
    let doc = show.json();
    assert_eq!(doc["state"], "failed");
    assert_eq!(doc["intervals"]["succeeded"], 2);
    assert_eq!(doc["intervals"]["failed"], 1);
    let version: i64 = p
        .db()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(
        version,
        backfill::manifest::MIGRATIONS.last().unwrap().0,
        "upgraded to the latest schema"
    );
    // The upgraded manifest keeps working: rerun the failure.
    create(
        &p,
        "daily",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "failed"],
    )
    .code(0)
    .stderr_has("1 succeeded");
    // Its widened constraints take the values of the new schema.
    create(
        &p,
        "daily",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "changed"],
    )
    .code(0);
    assert_eq!(
        p.rows("SELECT reprocess_behavior, kind FROM backfills ORDER BY id DESC LIMIT 1"),
        [["changed", "run"]]
    );
    assert_eq!(p.rows("PRAGMA integrity_check"), [["ok"]]);
}

#[test]
fn a_gated_command_task_without_a_row_count_fails_with_a_clear_message() {
    let p = Project::new().dag(
        "cmd",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"export\"\ncommand = \"true\"\n[tasks.gate]\nallow_empty = true\n",
    );
    create(&p, "cmd", "2026-01-01", "2026-01-01", &[])
        .code(3)
        .stderr_has("task `export` has a gate but reported no row count; write {\"rows\": N} to $BACKFILL_RESULT");
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 0);
}

#[test]
fn verify_compares_the_fingerprints_that_command_tasks_report() {
    let p = Project::new()
        .dag(
            "steady",
            r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''[ "$BACKFILL_VERIFY" = 1 ] && printf '{"rows": 3, "fingerprint": "{{ ds }}"}' > "$BACKFILL_RESULT"'''
"#,
        )
        .dag(
            "clock",
            r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 3, "fingerprint": "%s"}' "$(date +%s%N)" > "$BACKFILL_RESULT"'''
"#,
        );
    p.run(&[
        "verify",
        "--dag",
        "steady",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0)
    .stderr_has("2 deterministic, 0 not");
    p.run(&[
        "verify",
        "--dag",
        "clock",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(3)
    .stderr_has(
        "task `export` is not deterministic for interval 2026-01-01: two computations differ",
    );
}

#[test]
fn taking_over_a_dead_owner_finishes_its_publish_before_abandoning_its_run() {
    let p = shop();
    create(&p, "orders_fact", "2026-09-05", "2026-09-05", &[]).code(0);
    let crashed = p
        .command(&[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-01",
        ])
        .env("BACKFILL_FAULT", "after-publish")
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None, "the process died of a signal");
    // Resuming the other backfill takes the dead one's stale lease over.
    p.run(&["resume", "1"]).code(0);
    assert_eq!(
        p.rows("SELECT backfill_id, state FROM runs ORDER BY id"),
        [["1", "succeeded"], ["2", "succeeded"]],
        "the crashed run was published, so it is recorded as succeeded"
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 2);
    orders_fact_is_exact(&p, &["2026-09-01", "2026-09-05"]);
}

#[test]
fn show_and_runs_give_the_verdict_of_the_latest_gated_try() {
    // `z_load` runs first and passes its gate; `a_report` runs after it and is rejected. The
    // run's verdict is the later one's, although `a_report` sorts first by name.
    let p = Project::new().dag(
        "two",
        r#"
schedule = "@daily"
[[tasks]]
id = "z_load"
command = "echo '{\"rows\": 5}' > $BACKFILL_RESULT"
[tasks.gate]
[[tasks]]
id = "a_report"
depends_on = ["z_load"]
command = "echo '{\"rows\": 0}' > $BACKFILL_RESULT"
[tasks.gate]
"#,
    );
    p.run(&[
        "create",
        "--dag",
        "two",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
        "-q",
    ])
    .code(3);
    let show = p.run(&["show", "1", "--output", "json"]).json();
    let detail = &show["interval_details"][0];
    let runs = p.run(&["runs", "--dag", "two", "--output", "json"]).json();
    for doc in [detail, &runs[0]] {
        assert_eq!(doc["verdict"], "rejected", "{doc}");
        assert_eq!(doc["tries"], 2);
        assert!(
            doc["reasons"]
                .as_str()
                .unwrap()
                .starts_with("zero rows and an empty source"),
            "{doc}"
        );
    }
}

#[test]
fn the_source_count_and_the_audit_see_the_same_moment() {
    // Frozen between writing the audit and counting the source, the try sees an order land in
    // the source; with one snapshot, the count misses it as the output does, and the exact
    // tolerance passes. (Counted later, the source would be one row ahead: rejected.)
    let p = shop();
    edit_dag(&p, "orders_fact", "tolerance = 0.02", "tolerance = 0");
    let day = "SELECT COUNT(*) FROM raw_orders
               WHERE order_ts >= '2026-09-10' AND order_ts < '2026-09-11'";
    let before = wh_count(&p, day);
    let child = p.spawn_with(
        "frozen",
        &[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-10",
            "--to",
            "2026-09-10",
        ],
        &[("BACKFILL_FAULT", "before-source-count:stop")],
    );
    wait_until("the try to freeze", Duration::from_secs(20), || {
        crate::support::stopped(child.id())
    });
    wh(&p)
        .execute(
            "INSERT INTO raw_orders (order_ts, region, amount_cents)
             VALUES ('2026-09-10 12:00:00', 'north', 100)",
            [],
        )
        .unwrap();
    crate::support::signal(&child, nix::sys::signal::Signal::SIGCONT);
    p.wait("frozen", child)
        .code(0)
        .stderr_has("completed — 1 succeeded");
    let recorded = p.rows("SELECT rows, source_rows, verdict FROM task_tries");
    assert_eq!(
        recorded,
        [[
            before.to_string(),
            before.to_string(),
            "published".to_string()
        ]]
    );
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) FROM orders_fact WHERE order_day = '2026-09-10'"
        ),
        before
    );
    assert_eq!(wh_count(&p, day), before + 1, "the order landed meanwhile");
}

/// A gate's `source_count` command answers on stdout; what it says on stderr (progress, as
/// `bq` or a Python script prints it) goes to the try's log and is not read as its count.
#[test]
fn a_source_count_command_that_talks_on_stderr_is_read_from_stdout() {
    let p = Project::new().dag(
        "cmd",
        r#"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 5}' > "$BACKFILL_RESULT"'''
[tasks.gate]
source_count = "echo 'counting the source...' >&2; echo 5"
tolerance = 0.0
"#,
    );
    create(&p, "cmd", "2026-01-01", "2026-01-01", &["-q"]).code(0);
    assert_eq!(p.rows("SELECT source_rows FROM task_tries"), [["5"]]);
    let log = p.rows("SELECT log_path FROM task_tries")[0][0].clone();
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("counting the source..."),
        "the count's stderr is in the try's log {log}"
    );
}

#[test]
fn a_key_moved_across_partitions_is_rejected_with_table_scope_on_sqlite() {
    let p = shop();
    edit_dag(
        &p,
        "orders_fact",
        "unique_key = [\"order_id\"]",
        "unique_key = [\"order_id\"]\nunique_key_scope = \"table\"",
    );
    // Without an index that starts with the key, the dry run says which one to create.
    create(
        &p,
        "orders_fact",
        "2026-09-01",
        "2026-09-02",
        &["--dry-run"],
    )
    .code(2)
    .stderr_has("CREATE INDEX orders_fact_order_id ON orders_fact (order_id);");
    wh(&p)
        .execute_batch("CREATE INDEX orders_fact_order_id ON orders_fact (order_id)")
        .unwrap();
    create(&p, "orders_fact", "2026-09-01", "2026-09-02", &[]).code(0);
    let day = |d: &str| {
        wh_count(
            &p,
            &format!("SELECT COUNT(*) FROM orders_fact WHERE order_day = '{d}'"),
        )
    };
    let (first, second) = (day("2026-09-01"), day("2026-09-02"));
    // The source corrects an order of Sep 1 to Sep 2.
    let moved: i64 = wh(&p)
        .query_row(
            "SELECT MIN(order_id) FROM raw_orders WHERE order_ts >= '2026-09-01' AND order_ts < '2026-09-02'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    wh(&p)
        .execute(
            "UPDATE raw_orders SET order_ts = '2026-09-02 12:00:00' WHERE order_id = ?1",
            [moved],
        )
        .unwrap();
    let out = create(
        &p,
        "orders_fact",
        "2026-09-02",
        "2026-09-02",
        &["--reprocess-behavior", "completed", "--allow-drift"],
    );
    out.code(3).stderr_has(&format!(
        "unique_key violated across partitions: key ({moved}) in partition '2026-09-01'"
    ));
    assert_eq!((day("2026-09-01"), day("2026-09-02")), (first, second));
    // The old partition first, then the new one: one range, one interval at a time.
    create(
        &p,
        "orders_fact",
        "2026-09-01",
        "2026-09-02",
        &[
            "--reprocess-behavior",
            "completed",
            "--allow-drift",
            "--max-active-runs",
            "1",
        ],
    )
    .code(0);
    assert_eq!(
        (day("2026-09-01"), day("2026-09-02")),
        (first - 1, second + 1)
    );
    assert_eq!(
        wh_count(
            &p,
            "SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM orders_fact"
        ),
        0
    );
}
