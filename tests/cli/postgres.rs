//! SQL tasks on a PostgreSQL warehouse: the real binary against a real server that the tests
//! start themselves (see `tests/pg`), ignored on a machine without the server binaries (a
//! failure under CI).
//!
//! The suite runs twice (see `main.rs`): as `postgres`, against a target without a key, and as
//! `postgres_keyed`, against the same target with `PRIMARY KEY (order_id)`, the common case in
//! production, where a partition's rows must be gone before its new rows go in.

use std::time::Duration;

use crate::pg;
use crate::support::{Project, wait_until};

/// A project whose warehouse `dw` is a fresh database of the shared cluster, with
/// `raw.orders` (three days of orders) and the target `analytics.orders_fact`.
struct Pg {
    p: Project,
    db: String,
    cluster: &'static pg::Cluster,
}

/// Whether this is the suite's run against a keyed target.
fn keyed() -> bool {
    module_path!().ends_with("_keyed")
}

/// [`SCHEMA_BASE`], with the target's primary key in the keyed run.
fn schema() -> String {
    if keyed() {
        format!("{SCHEMA_BASE}ALTER TABLE analytics.orders_fact ADD PRIMARY KEY (order_id);\n")
    } else {
        SCHEMA_BASE.to_string()
    }
}

const SCHEMA_BASE: &str = "
CREATE SCHEMA raw;
CREATE SCHEMA analytics;
CREATE TABLE raw.orders (order_id int PRIMARY KEY, order_ts timestamptz NOT NULL, region text NOT NULL, amount numeric NOT NULL);
CREATE TABLE analytics.orders_fact (order_id int NOT NULL, day date NOT NULL, region text NOT NULL, amount numeric NOT NULL);
CREATE INDEX orders_fact_day ON analytics.orders_fact (day);
CREATE INDEX orders_fact_order ON analytics.orders_fact (order_id);
INSERT INTO raw.orders
SELECT n, timestamptz '2026-01-01 00:00:00+00' + (n % 3) * interval '1 day' + (n % 60) * interval '1 minute',
       CASE WHEN n % 2 = 0 THEN 'eu' ELSE 'us' END, n * 1.5
FROM generate_series(1, 30) AS n;
";

/// The task's DAG; `extra` goes at the end of the task's table.
fn dag(sql: &str, gate: &str, extra: &str) -> String {
    format!(
        r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "fact"
warehouse = "dw"
target = "analytics.orders_fact"
partition_column = "day"
sql = """
{sql}
"""
{extra}
[tasks.gate]
{gate}
"#
    )
}

const QUERY: &str = "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount
FROM raw.orders -- :not_a_param in a comment
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
  AND region <> 'x:ds' AND :ds::date = (order_ts AT TIME ZONE 'UTC')::date";

const GATE: &str = r#"source_count = "SELECT count(*) FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end"
unique_key = ["order_id"]"#;

impl Drop for Pg {
    fn drop(&mut self) {
        pg::Cluster::drop_shared_db(std::mem::take(&mut self.db));
    }
}

impl Pg {
    /// `None` (the test returns) when this machine has no PostgreSQL server and this is not CI.
    fn new() -> Self {
        Self::with_dag(&dag(QUERY, GATE, ""))
    }

    fn with_dag(dag_toml: &str) -> Self {
        Self::set_up(dag_toml, false)
    }

    /// The manifest in the warehouse's own database.
    fn one_database() -> Self {
        Self::set_up(&dag(QUERY, GATE, ""), true)
    }

    fn set_up(dag_toml: &str, one_database: bool) -> Self {
        let cluster = pg::shared();
        let db = cluster.create_db();
        cluster.psql(&db, &schema());
        let p = Project::new();
        let p = if one_database { p.manifest_in(&db) } else { p };
        p.write(
            "backfill.toml",
            &format!(
                "lease_timeout = \"30s\"\n\n[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}?sslmode=disable\"\n",
                cluster.url(&db)
            ),
        );
        p.write("dags/orders.toml", dag_toml);
        Self { p, db, cluster }
    }

    fn psql(&self, sql: &str) -> String {
        self.cluster.psql(&self.db, sql)
    }

    /// The target's rows, one line each, in order.
    fn fact(&self) -> String {
        self.psql(
            "SELECT order_id, day, region, amount FROM analytics.orders_fact ORDER BY order_id",
        )
    }

    /// What the target should hold for the days `days` of January (1-based), from the source.
    fn expected(&self, days: &[u32]) -> String {
        let list = days
            .iter()
            .map(|d| format!("date '2026-01-{d:02}'"))
            .collect::<Vec<_>>()
            .join(", ");
        self.psql(&format!(
            "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date, region, amount FROM raw.orders \
             WHERE (order_ts AT TIME ZONE 'UTC')::date IN ({list}) ORDER BY order_id"
        ))
    }

    /// Waits until the server has ended the sessions of processes that are gone (killed, or
    /// exited a moment ago: the server learns of the closed connection a little later, later
    /// still on a busy machine) that were inside a transaction (it rolls their transactions
    /// back). Nothing may stay open: a session still in a transaction after 20 s fails.
    fn wait_for_killed_sessions(&self) {
        wait_until(
            "the killed process's session to end",
            Duration::from_secs(20),
            || self.open_transactions() == "0",
        );
    }

    /// Sessions of this database other than psql's own that are inside a transaction.
    fn open_transactions(&self) -> String {
        self.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
            self.db
        ))
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_backfill_publishes_exactly_the_source_and_a_rerun_replaces_it() {
    let t = Pg::new();
    // A row that the first backfill must replace, and one of another day that it must keep.
    t.psql("INSERT INTO analytics.orders_fact VALUES (999, '2026-01-02', 'eu', 1), (998, '2026-01-05', 'eu', 7)");
    let out = t.p.create("orders", "2026-01-01", "2026-01-03", &[]);
    out.code(0);
    let mut expected = t.expected(&[1, 2, 3]);
    expected.push_str("\n998|2026-01-05|eu|7");
    assert_eq!(t.fact(), expected);
    // Each publish is booked in the warehouse with its try.
    assert_eq!(
        t.psql("SELECT partition_start::date, rows FROM backfill.publishes ORDER BY 1"),
        "2026-01-01|10\n2026-01-02|10\n2026-01-03|10"
    );
    // The manifest records the rows and the source count the gate compared.
    let runs =
        t.p.rows("SELECT rows, source_rows, state FROM task_tries ORDER BY id");
    assert_eq!(runs.len(), 3);
    for r in &runs {
        assert_eq!(r, &["10", "10", "succeeded"]);
    }
    // A rerun replaces: nothing is counted twice. With -q, a success says nothing.
    let quiet = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "completed", "-q"],
    );
    quiet.code(0);
    assert_eq!((quiet.stdout.as_str(), quiet.stderr.as_str()), ("", ""));
    assert_eq!(t.fact(), expected);
    t.wait_for_killed_sessions();
}

/// The gate counts the values of a unique key that occur more than once as `GROUP BY` groups
/// them (two `NULL`s are one value, and so are two rows with the same `NULL` field), whichever
/// way the statement counts: by sorting the keys first (an integer, a date, a text alone) or by
/// grouping alone (a text among several columns, a `float8`).
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn duplicate_keys_are_counted_as_group_by_counts_them_null_keys_included() {
    let keyed = |key: &str, rows: &str| {
        format!(
            r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "keyed"
warehouse = "dw"
target = "analytics.keyed"
partition_column = "day"
sql = "SELECT k::int AS k, j::text AS j, f::float8 AS f, :ds::date AS day FROM (VALUES {rows}) v(k, j, f)"
[tasks.gate]
unique_key = [{key}]
"#
        )
    };
    let t = Pg::with_dag(&keyed(r#""k""#, "(1, 'a', 1.5)"));
    t.psql("CREATE TABLE analytics.keyed (k int, j text, f float8, day date NOT NULL)");
    let once = |n: i64| match n {
        1 => Some("1 key value occurs more than once"),
        2 => Some("2 key values occur more than once"),
        _ => None,
    };
    let cases = [
        // (key, rows, how many key values occur more than once)
        (
            r#""k""#,
            "(1, 'a', 1.5), (2, 'a', 1.5), (NULL, 'a', 1.5)",
            0,
        ),
        (
            r#""k""#,
            "(1, 'a', 1.5), (1, 'b', 1.5), (NULL, 'a', 1.5), (NULL, 'b', 1.5), (2, 'a', 1.5)",
            2,
        ),
        (r#""k""#, "(NULL, 'a', 1.5), (NULL, 'b', 1.5)", 1),
        (
            r#""k", "day""#,
            "(1, 'a', 1.5), (2, 'a', 1.5), (NULL, 'a', 1.5)",
            0,
        ),
        (
            r#""k", "day""#,
            "(1, 'a', 1.5), (NULL, 'a', 1.5), (NULL, 'b', 1.5)",
            1,
        ),
        (r#""j""#, "(1, 'a', 1.5), (1, 'b', 1.5), (1, NULL, 1.5)", 0),
        (
            r#""j""#,
            "(1, 'a', 1.5), (2, 'a', 1.5), (1, NULL, 1.5), (2, NULL, 1.5)",
            2,
        ),
        (
            r#""k", "j""#,
            "(1, NULL, 1.5), (2, NULL, 1.5), (NULL, 'a', 1.5), (1, 'a', 1.5)",
            0,
        ),
        (
            r#""k", "j""#,
            "(1, 'a', 1.5), (1, 'b', 1.5), (NULL, 'a', 1.5), (NULL, 'a', 1.5), (2, NULL, 1.5), (2, NULL, 1.5)",
            2,
        ),
        (r#""f""#, "(1, 'a', 1.5), (1, 'a', 2.5), (1, 'a', NULL)", 0),
        (
            r#""f""#,
            "(1, 'a', 1.5), (1, 'a', 1.5), (1, 'a', NULL), (1, 'a', NULL)",
            2,
        ),
    ];
    for (key, rows, duplicated) in cases {
        t.p.write("dags/orders.toml", &keyed(key, rows));
        t.psql("TRUNCATE analytics.keyed");
        let out = t.p.create(
            "orders",
            "2026-01-01",
            "2026-01-01",
            &["--reprocess-behavior", "completed", "--allow-drift"],
        );
        let published = t.psql("SELECT count(*) FROM analytics.keyed");
        match once(duplicated) {
            None => {
                out.code(0);
                assert_eq!(
                    published,
                    rows.matches("), (").count().saturating_add(1).to_string(),
                    "{key}: {rows}"
                );
            }
            Some(message) => {
                out.code(3).stderr_has(message);
                assert_eq!(published, "0", "{key}: {rows}");
            }
        }
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_gate_rejects_in_the_transaction_and_readers_keep_the_old_partition() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    let before = t.fact();
    // Day 2's source vanishes: the rerun's output is empty while the source count says so
    // too, and the published partition had rows: a zero-row rerun is rejected.
    t.psql("DELETE FROM raw.orders WHERE order_ts >= '2026-01-02' AND order_ts < '2026-01-03'");
    let out = t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    );
    out.code(3).stderr_has("rejected");
    assert_eq!(t.fact(), before, "the rejected try changed nothing");
    assert_eq!(
        t.p.rows("SELECT state FROM task_tries ORDER BY id DESC LIMIT 1"),
        vec![vec!["rejected".to_string()]]
    );
    // Duplicated keys are rejected too, and never reach the table.
    t.psql("INSERT INTO raw.orders SELECT order_id + 100, order_ts, region, amount FROM raw.orders WHERE order_ts < '2026-01-02'");
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(
            &QUERY.replace("SELECT order_id,", "SELECT order_id % 100 AS order_id,"),
            GATE,
            "",
        ),
    )
    .unwrap();
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--reprocess-behavior", "completed"],
    );
    out.code(3).stderr_has("unique_key violated");
    assert_eq!(t.fact(), before);
    // Rows outside the interval are rejected, naming their partition values.
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(
            &QUERY.replace(
                "(order_ts AT TIME ZONE 'UTC')::date AS day",
                "(order_ts AT TIME ZONE 'UTC')::date + 1 AS day",
            ),
            GATE,
            "",
        ),
    )
    .unwrap();
    t.p.create(
        "orders",
        "2026-01-03",
        "2026-01-03",
        &["--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has("row outside interval: 10 of 10 rows have a partition value outside the interval: 2026-01-04");
    assert_eq!(t.fact(), before);
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_kill_at_any_step_of_a_try_leaves_old_or_new_and_resume_finishes() {
    let t = Pg::new();
    kill_at_any_step(&t);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_a_kill_at_any_step_leaves_old_or_new_and_resume_finishes() {
    let t = Pg::one_database();
    kill_at_any_step(&t);
}

fn kill_at_any_step(t: &Pg) {
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    let mut old = t.fact();
    // New source values: a rerun changes every amount.
    t.psql("UPDATE raw.orders SET amount = amount + 1000");
    for (i, point) in [
        "after-audit",
        "before-publish",
        "before-commit",
        "after-publish",
    ]
    .iter()
    .enumerate()
    {
        let out = t.p.run_with(
            &[
                "create",
                "--dag",
                "orders",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--reprocess-behavior",
                "completed",
            ],
            &[("BACKFILL_FAULT", point)],
        );
        assert_ne!(out.code, 0, "{point}: the process was killed");
        let now = t.fact();
        // Day 1 holds either all old or all new rows: never a mix.
        let day1 = |s: &str| {
            s.lines()
                .filter(|l| l.contains("|2026-01-01|"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let new = t.expected(&[1, 2]);
        assert!(
            day1(&now) == day1(&old) || day1(&now) == day1(&new),
            "{point}: day 1 is a mix:\n{now}"
        );
        if *point == "after-publish" {
            assert_eq!(day1(&now), day1(&new), "{point}: the commit happened");
        } else {
            assert_eq!(day1(&now), day1(&old), "{point}: nothing committed");
        }
        // The server rolled back the killed transaction.
        t.wait_for_killed_sessions();
        let id = (i + 2).to_string();
        t.p.run(&["resume", &id]).code(0);
        let expected = t.expected(&[1, 2]);
        let mut expected: Vec<&str> = expected.lines().collect();
        expected.extend(old.lines().filter(|l| l.contains("|2026-01-03|")));
        let id_of = |l: &&str| l.split('|').next().and_then(|n| n.parse::<i64>().ok());
        expected.sort_by_key(id_of);
        assert_eq!(
            t.fact(),
            expected.join("\n"),
            "{point}: resume finished the backfill"
        );
        // Exactly one succeeded try per interval of this backfill, and a publish that
        // committed before the kill is recorded once, not redone.
        succeeded_once_each(t, &id, 2, point);
        old = t.fact();
        t.psql("UPDATE raw.orders SET amount = amount + 1");
    }
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_timeout_cancels_the_statement_on_the_server() {
    let slow = "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount
FROM raw.orders, pg_sleep(60)
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end";
    let t = Pg::with_dag(&dag(slow, GATE, "timeout = \"1s\"\n"));
    let started = std::time::Instant::now();
    let out = t.p.create("orders", "2026-01-01", "2026-01-02", &[]);
    out.code(3).stderr_has("timed out");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "did not wait for pg_sleep(60)"
    );
    // The server stopped the statement: no session of this database still runs it.
    wait_until(
        "the statement to stop on the server",
        Duration::from_secs(10),
        || {
            t.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()",
            t.db
        )) == "0"
        },
    );
    assert_eq!(t.fact(), "");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn bad_tasks_are_found_by_the_dry_run_against_the_server() {
    let t = Pg::with_dag(&dag(
        &QUERY.replace("region, amount", "region, amount, nope"),
        GATE,
        "",
    ));
    let out =
        t.p.create("orders", "2026-01-01", "2026-01-02", &["--dry-run"]);
    out.code(2).stderr_has("nope");
    let out = t.p.run(&["dags", "validate"]);
    out.code(2).stderr_has("orders.toml:").stderr_has("nope");
    // An unknown parameter is named, with where it is.
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(&QUERY.replace(":ds::date", ":dss::date"), GATE, ""),
    )
    .unwrap();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(2)
        .stderr_has("unknown bind parameter `:dss`");
    // Nothing was written: no bookkeeping schema, no manifest run.
    assert_eq!(
        t.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'backfill'"),
        "0"
    );
    assert!(!t.p.has_manifest(), "a refused backfill recorded nothing");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_unreachable_server_is_named_without_its_password() {
    let p = Project::new();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    p.write(
        "backfill.toml",
        &format!("[warehouse.dw]\nkind = \"postgres\"\nurl = \"postgresql://etl:hunter2@127.0.0.1:{port}/x?sslmode=disable&connect_timeout=2\"\n"),
    );
    p.write("dags/orders.toml", &dag(QUERY, GATE, ""));
    let out = p.create("orders", "2026-01-01", "2026-01-02", &[]);
    out.code(2)
        .stderr_has("warehouse `dw`")
        .stderr_has(&format!("postgresql://etl@127.0.0.1:{port}/x"))
        .stderr_has("cannot connect");
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    // The URL may name an environment variable; an unset one is an error at its line.
    p.write(
        "backfill.toml",
        "[warehouse.dw]\nkind = \"postgres\"\nurl = \"${BACKFILL_TEST_UNSET_URL}\"\n",
    );
    p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(2)
        .stderr_has("backfill.toml:3")
        .stderr_has("BACKFILL_TEST_UNSET_URL");
    assert!(!p.has_manifest(), "a refused backfill recorded nothing");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_key_moved_across_partitions_is_rejected_with_table_scope() {
    let gate = format!("{GATE}\nunique_key_scope = \"table\"");
    let t = Pg::with_dag(&dag(QUERY, &gate, ""));
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    // The source corrects order 3's date from Jan 1 to Jan 2.
    t.psql("UPDATE raw.orders SET order_ts = order_ts + interval '1 day' WHERE order_id = 3");
    let out = t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    );
    out.code(3)
        .stderr_has("unique_key violated across partitions: key 3 in partition 2026-01-01")
        .stderr_has("rerun the old partition first");
    // Rerunning the old partition first, then the new one, publishes.
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "completed", "--allow-drift"],
    )
    .code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    // Without an index that starts with the key, the dry run says which to create (a primary
    // key's index serves as well as any).
    t.psql("DROP INDEX analytics.orders_fact_order");
    if keyed() {
        t.p.create("orders", "2026-01-01", "2026-01-02", &["--dry-run"])
            .code(0);
        t.psql("ALTER TABLE analytics.orders_fact DROP CONSTRAINT orders_fact_pkey");
    }
    t.p.create("orders", "2026-01-01", "2026-01-02", &["--dry-run"])
        .code(2)
        .stderr_has("CREATE INDEX ON analytics.orders_fact (order_id)");
}

/// Every kind of key a target can have holds the partitions' rows while each path replaces
/// them: a try's publish, a rerun, verify (which computes beside the published rows), stage and
/// promote, rollback. The delete of a partition and the insert of its new rows are statements of
/// their own, so that the insert never meets the keys the delete removes.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn every_kind_of_key_holds_across_rerun_verify_promote_and_rollback() {
    if keyed() {
        // The test replaces the target's key with each kind in turn: once is enough.
        return;
    }
    for (kind, ddl) in [
        (
            "primary key",
            "ALTER TABLE analytics.orders_fact ADD PRIMARY KEY (order_id)",
        ),
        (
            "unique constraint",
            "ALTER TABLE analytics.orders_fact ADD CONSTRAINT orders_fact_once UNIQUE (order_id)",
        ),
        (
            "unique index",
            "CREATE UNIQUE INDEX orders_fact_once ON analytics.orders_fact (order_id)",
        ),
        (
            "deferrable constraint, initially deferred",
            "ALTER TABLE analytics.orders_fact ADD CONSTRAINT orders_fact_once UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED",
        ),
        (
            "deferrable constraint, initially immediate",
            "ALTER TABLE analytics.orders_fact ADD CONSTRAINT orders_fact_once UNIQUE (order_id) DEFERRABLE",
        ),
        (
            "primary key over the partition column and the key",
            "ALTER TABLE analytics.orders_fact ADD PRIMARY KEY (day, order_id)",
        ),
    ] {
        let t = Pg::new();
        t.psql(ddl);
        let ok = |args: &[&str]| {
            let out = t.p.run(args);
            assert_eq!(out.code, 0, "{kind}: {args:?}: {}", out.stderr);
        };
        fn over_range<'a>(command: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
            let range = [
                "--dag",
                "orders",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-03",
            ];
            [&[command][..], &range, extra].concat()
        }
        ok(&over_range("create", &[]));
        let first = t.fact();
        assert_eq!(first, t.expected(&[1, 2, 3]), "{kind}");
        // A rerun of a changed source replaces every published row by its new version.
        t.psql("UPDATE raw.orders SET amount = amount * 2");
        ok(&over_range(
            "create",
            &["--reprocess-behavior", "completed", "--allow-drift"],
        ));
        let second = t.fact();
        assert_eq!(second, t.expected(&[1, 2, 3]), "{kind}");
        assert_ne!(second, first, "{kind}");
        // Verify computes each interval twice beside the published rows, and changes nothing.
        ok(&over_range("verify", &[]));
        assert_eq!(t.fact(), second, "{kind}");
        // A staged output is promoted over the published one.
        t.psql("UPDATE raw.orders SET amount = amount + 1");
        ok(&over_range(
            "create",
            &["--stage", "--reprocess-behavior", "completed"],
        ));
        assert_eq!(t.fact(), second, "{kind}: staging publishes nothing");
        ok(&["promote", "3"]);
        assert_eq!(t.fact(), t.expected(&[1, 2, 3]), "{kind}");
        // Rollback puts the version the promote replaced back.
        ok(&over_range("rollback", &[]));
        assert_eq!(t.fact(), second, "{kind}");
        assert_eq!(
            t.p.rows("SELECT state, count(*) FROM task_tries GROUP BY state ORDER BY state"),
            [["succeeded", "15"]].map(|r| r.map(String::from).to_vec()),
            "{kind}"
        );
        t.wait_for_killed_sessions();
    }
}

/// A gate without `unique_key`: the target's own key is what refuses a duplicate.
const COUNT_GATE: &str = r#"source_count = "SELECT count(*) FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end"
tolerance = 0.5"#;

/// The DAG's query from now on gives order 4 twice on day 2 (with [`COUNT_GATE`]).
fn order_4_twice_on_day_2(t: &Pg) {
    let twice = format!(
        "{QUERY}\nUNION ALL SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date, region, amount FROM raw.orders \
         WHERE order_id = 4 AND :ds = '2026-01-02'"
    );
    std::fs::write(t.p.path("dags/orders.toml"), dag(&twice, COUNT_GATE, "")).unwrap();
}

/// A kill while an output the target's key refused is measured apart (in its temporary table)
/// leaves the published partition and nothing else behind, and `resume` rejects the interval
/// as the uninterrupted try would have.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_kill_while_a_refused_output_is_measured_apart_keeps_the_partition() {
    let gate = COUNT_GATE;
    let t = Pg::with_dag(&dag(QUERY, gate, ""));
    if !keyed() {
        t.psql("ALTER TABLE analytics.orders_fact ADD PRIMARY KEY (order_id)");
    }
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    let published = t.fact();
    order_4_twice_on_day_2(&t);
    // The first pass fails on the key before its fault point: the first hit is the pass apart.
    let out = t.p.run_with(
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-02",
            "--reprocess-behavior",
            "completed",
        ],
        &[("BACKFILL_FAULT", "before-source-count")],
    );
    assert_eq!(out.code, -1, "aborted: {}", out.stderr);
    t.wait_for_killed_sessions();
    assert_eq!(t.fact(), published);
    t.p.run(&["resume", "2"])
        .code(3)
        .stderr_has("target constraint violated: duplicate key value violates unique constraint");
    assert_eq!(t.fact(), published);
    assert_eq!(
        t.psql(
            "SELECT count(*) FROM backfill.publishes WHERE partition_start::date = '2026-01-02'"
        ),
        "1",
        "only the first backfill's publish of day 2"
    );
    t.wait_for_killed_sessions();
}

/// An output that the target's own key refuses (a duplicate that the gate's `unique_key` does
/// not name) is rejected with the database's words, and the published partition stays; with a
/// deferred constraint too, whose violation would otherwise surface only at the commit.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_output_the_targets_key_refuses_is_rejected_and_the_partition_kept() {
    if keyed() {
        // The test gives the target each kind of key itself: once is enough.
        return;
    }
    let gate = COUNT_GATE;
    for ddl in [
        "ALTER TABLE analytics.orders_fact ADD PRIMARY KEY (order_id)",
        "ALTER TABLE analytics.orders_fact ADD CONSTRAINT orders_fact_once UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED",
    ] {
        let t = Pg::with_dag(&dag(QUERY, gate, ""));
        t.psql(ddl);
        t.p.create("orders", "2026-01-01", "2026-01-03", &[])
            .code(0);
        let published = t.fact();
        order_4_twice_on_day_2(&t);
        let out = t.p.create(
            "orders",
            "2026-01-01",
            "2026-01-03",
            &["--reprocess-behavior", "completed"],
        );
        out.code(3)
            .stderr_has(
                "target constraint violated: duplicate key value violates unique constraint",
            )
            .stderr_has("Key (order_id)=(4) already exists")
            .stderr_has("(table analytics.orders_fact)");
        assert_eq!(t.fact(), published, "{ddl}");
        assert_eq!(
            t.p.rows(
                "SELECT t.state, t.rows, t.verdict FROM task_tries t \
                 JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 2 ORDER BY r.interval_start"
            ),
            [
                ["succeeded", "10", "published"],
                ["rejected", "11", "rejected"],
                ["succeeded", "10", "published"],
            ]
            .map(|r| r.map(String::from).to_vec()),
            "{ddl}"
        );
        // A staged output is promoted only while the target's key accepts it: here another
        // writer moved order 4 to another partition after the stage.
        std::fs::write(t.p.path("dags/orders.toml"), dag(QUERY, gate, "")).unwrap();
        t.p.create(
            "orders",
            "2026-01-02",
            "2026-01-02",
            &["--stage", "--reprocess-behavior", "completed"],
        )
        .code(0);
        t.psql("UPDATE analytics.orders_fact SET day = '2026-01-05' WHERE order_id = 4");
        let before = t.fact();
        let out = t.p.run(&["promote", "3"]);
        out.code(3)
            .stderr_has(
                "target constraint violated: duplicate key value violates unique constraint",
            )
            .stderr_has("Key (order_id)=(4) already exists")
            .stderr_has("nothing was promoted");
        assert_eq!(t.fact(), before, "{ddl}");
        t.wait_for_killed_sessions();
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_server_restart_fails_running_tries_and_retries_finish_exactly() {
    let own = pg::Cluster::start();
    let db = own.create_db();
    own.psql(&db, &schema());
    let p = Project::new();
    p.write(
        "backfill.toml",
        &format!(
            "[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}?sslmode=disable&connect_timeout=2\"\n",
            own.url(&db)
        ),
    );
    let slow = QUERY.replace("FROM raw.orders", "FROM raw.orders, pg_sleep(0.3)");
    p.write(
        "dags/orders.toml",
        &dag(&slow, GATE, "retries = 20\nretry_delay = \"500ms\"\n"),
    );
    let child = p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
    );
    wait_until("the first publish", Duration::from_secs(60), || {
        own.psql(&db, "SELECT to_regclass('backfill.publishes') IS NOT NULL") == "t"
            && own.psql(&db, "SELECT count(*) FROM backfill.publishes") != "0"
    });
    own.restart();
    let out = p.wait("run", child);
    out.code(0);
    let fact = own.psql(
        &db,
        "SELECT count(*), count(DISTINCT order_id) FROM analytics.orders_fact",
    );
    assert_eq!(fact, "30|30");
    assert_eq!(
        own.psql(&db, "SELECT count(*) FROM backfill.publishes"),
        p.rows("SELECT count(*) FROM task_tries WHERE state = 'succeeded'")[0][0]
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_server_that_goes_away_interrupts_the_backfill_and_resume_finishes_it() {
    // Without retries, a warehouse whose server stops is an environment fault, not the
    // interval's failure: the try is interrupted, the backfill stops, and `resume` runs it once
    // the server is back.
    let own = pg::Cluster::start();
    let db = own.create_db();
    own.psql(&db, &schema());
    let p = Project::new();
    p.write(
        "backfill.toml",
        &format!(
            "[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}?sslmode=disable&connect_timeout=2\"\n",
            own.url(&db)
        ),
    );
    let slow = QUERY.replace("FROM raw.orders", "FROM raw.orders, pg_sleep(0.3)");
    p.write("dags/orders.toml", &dag(&slow, GATE, ""));
    let child = p.spawn(
        "run",
        &[
            "--output",
            "json",
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
    );
    wait_until("the first publish", Duration::from_secs(60), || {
        own.psql(&db, "SELECT to_regclass('backfill.publishes') IS NOT NULL") == "t"
            && own.psql(&db, "SELECT count(*) FROM backfill.publishes") != "0"
    });
    own.stop();
    let out = p.wait("run", child);
    out.code(1);
    let doc = out.json();
    let cause = doc["stopped_by"]["cause"].as_str().unwrap_or_default();
    assert!(
        cause.starts_with("warehouse `dw` (") && cause.contains(": its server "),
        "{}",
        out.stdout
    );
    assert_eq!(doc["intervals"]["failed"], 0, "{}", out.stdout);
    let not_done = p.rows("SELECT state, error FROM task_tries WHERE state <> 'succeeded'");
    assert!(!not_done.is_empty());
    for t in &not_done {
        assert!(
            t[0] == "cancelled" && t[1].starts_with("interrupted: warehouse `dw` ("),
            "{not_done:?}"
        );
    }
    own.start_again();
    p.run(&["resume", "1"]).code(0);
    let fact = own.psql(
        &db,
        "SELECT count(*), count(DISTINCT order_id) FROM analytics.orders_fact",
    );
    assert_eq!(fact, "30|30");
}

/// The staged tables in the warehouse.
fn staged_tables(t: &Pg) -> String {
    t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'staged\\_%'")
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn stage_diff_promote_and_discard_keep_the_output_in_the_warehouse() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    let before = t.fact();
    // Day 1's source changes: order 3's amount, order 6 removed, order 31 added.
    t.psql(
        "UPDATE raw.orders SET amount = amount + 5 WHERE order_id = 3; \
         DELETE FROM raw.orders WHERE order_id = 6; \
         INSERT INTO raw.orders VALUES (31, '2026-01-01 23:00:00+00', 'eu', 2)",
    );
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--stage", "--reprocess-behavior", "completed"],
    );
    out.code(0);
    assert_eq!(t.fact(), before, "staging publishes nothing");
    assert_eq!(staged_tables(&t), "2");
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    let doc = diff.json();
    let day = |d: &str| {
        doc.as_array()
            .unwrap()
            .iter()
            .find(|r| r["interval"]["start"] == format!("{d}T00:00:00Z"))
            .unwrap()
            .clone()
    };
    let d1 = day("2026-01-01");
    assert_eq!(d1["published_rows"], 10);
    assert_eq!(d1["staged_rows"], 10);
    assert_eq!(d1["same_fingerprint"], false);
    assert_eq!(d1["keys"]["added"], 1);
    assert_eq!(d1["keys"]["removed"], 1);
    assert_eq!(d1["keys"]["changed"], 1);
    assert_eq!(d1["keys"]["examples"]["added"], serde_json::json!([31]));
    assert_eq!(d1["keys"]["examples"]["removed"], serde_json::json!([6]));
    assert_eq!(d1["keys"]["examples"]["changed"], serde_json::json!([3]));
    let d2 = day("2026-01-02");
    assert_eq!(d2["keys"]["added"], 0);
    assert_eq!(d2["same_fingerprint"], true);
    assert_eq!(d2["keys"]["changed"], 0);
    // Promote publishes what was staged, and the staged tables go with the same commits.
    t.p.run(&["promote", "2"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(staged_tables(&t), "0");
    // A discarded output goes too, and the target keeps what it had.
    t.psql("UPDATE raw.orders SET amount = amount + 1 WHERE order_id = 2");
    t.p.create(
        "orders",
        "2026-01-03",
        "2026-01-03",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(staged_tables(&t), "1");
    let published = t.fact();
    t.p.run(&["discard", "4"]).code(0);
    assert_eq!(staged_tables(&t), "0");
    assert_eq!(t.fact(), published);
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_try_killed_after_staging_leaves_no_table_behind() {
    let t = Pg::new();
    // Killed after the staged table committed, before the manifest recorded the stage.
    let out = t.p.run_with(
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
            "--stage",
        ],
        &[("BACKFILL_FAULT", "after-stage")],
    );
    assert_ne!(out.code, 0);
    assert_eq!(
        staged_tables(&t),
        "1",
        "the table committed before the kill"
    );
    // The next command recovers the dead owner and drops what nobody needs.
    t.p.run(&["resume", "1"]).code(0);
    let kept =
        t.p.rows("SELECT count(*) FROM task_tries WHERE staged = 'staged'")[0][0].clone();
    assert_eq!(
        staged_tables(&t),
        kept,
        "only the staged outputs the manifest knows stay"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn verify_computes_twice_without_publishing() {
    let t = Pg::new();
    t.p.run(&[
        "verify",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    assert_eq!(t.fact(), "", "verify publishes nothing");
    // A query that is not deterministic is caught.
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(
            &QUERY.replace(
                "region, amount",
                "region, amount + random()::int::numeric AS amount",
            ),
            GATE,
            "",
        ),
    )
    .unwrap();
    let out = t.p.run(&[
        "verify",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ]);
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert_eq!(t.fact(), "");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn forget_removes_the_kept_versions_and_the_bookkeeping_and_leaves_the_rows() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    t.psql("UPDATE raw.orders SET amount = amount * 2");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let rows = t.fact();
    let kept = t.psql(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'kept_%'",
    );
    assert_eq!(kept, "1");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "2");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.partitions"), "2");
    let dry =
        t.p.run(&["forget", "--dag", "orders", "--dry-run", "--output", "json"]);
    dry.code(0);
    assert_eq!(dry.json()["kept_versions"], 2);
    // The 1st only: its version, its claim and its bookings go; the 2nd's stay.
    t.p.run(&[
        "forget",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
        "--yes",
        "-q",
    ])
    .code(0);
    assert_eq!(
        t.psql("SELECT count(*), min(interval_start)::date FROM backfill.versions"),
        "1|2026-01-02"
    );
    assert_eq!(
        t.psql("SELECT count(*), min(partition_start)::date FROM backfill.partitions"),
        "1|2026-01-02"
    );
    assert_eq!(
        t.psql("SELECT count(DISTINCT partition_start) FROM backfill.publishes"),
        "1"
    );
    // All of it: the kept table goes with its last version.
    t.p.run(&["forget", "--dag", "orders", "--yes", "-q"])
        .code(0);
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "0");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.partitions"), "0");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.publishes"), "0");
    assert_eq!(
        t.psql(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'kept_%'"
        ),
        "0"
    );
    assert_eq!(t.fact(), rows, "the target's rows stay");
    // The next backfill runs both days again, and keeps what they replace.
    t.p.create("orders", "2026-01-01", "2026-01-02", &["-q"])
        .code(0);
    assert_eq!(t.psql("SELECT count(*) FROM backfill.partitions"), "2");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn rollback_puts_the_replaced_rows_back() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    let first = t.fact();
    // A first backfill replaced nothing: there is nothing to put back.
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "0");
    t.psql("UPDATE raw.orders SET amount = amount * 2");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let second = t.fact();
    assert_ne!(first, second);
    assert_eq!(
        t.psql("SELECT count(*), sum(rows) FROM backfill.versions"),
        "2|20"
    );
    let shown = t.p.run(&["show", "2", "--output", "json"]);
    shown.code(0);
    let kept = &shown.json()["kept_versions"][0];
    assert_eq!(kept["target"], "analytics.orders_fact");
    assert_eq!(
        (kept["versions"].as_i64(), kept["rows"].as_i64()),
        (Some(2), Some(20))
    );
    assert!(kept["bytes"].as_i64().unwrap() > 0, "{kept}");
    // A rerun of an unchanged source keeps no copy of itself: keep_versions = 1 still holds
    // the first content.
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(
        t.psql("SELECT count(*), sum(rows) FROM backfill.versions"),
        "2|20"
    );
    t.p.run(&[
        "rollback",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    assert_eq!(t.fact(), first, "the first content is back");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "0");
    // Nothing older is kept: a second rollback fails and changes nothing.
    t.p.run(&[
        "rollback",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(3)
    .stderr_has("no earlier version is kept");
    assert_eq!(t.fact(), first);
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_interval_predicates_are_served_by_the_partition_index() {
    // A cluster of its own, so that its log holds only this test's plans.
    let own = pg::Cluster::start();
    let db = own.create_db();
    own.psql(&db, &schema());
    // Every statement's plan goes to the server's log; sequential scans cost so much that the
    // planner takes one only where no index can serve the predicate.
    own.psql(
        &db,
        &format!(
            "ALTER DATABASE \"{db}\" SET session_preload_libraries = 'auto_explain';
             ALTER DATABASE \"{db}\" SET auto_explain.log_min_duration = 0;
             ALTER DATABASE \"{db}\" SET auto_explain.log_nested_statements = on;
             ALTER DATABASE \"{db}\" SET enable_seqscan = off;"
        ),
    );
    let p = Project::new();
    p.write(
        "backfill.toml",
        &format!(
            "[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}?sslmode=disable\"\n",
            own.url(&db)
        ),
    );
    p.write("dags/orders.toml", &dag(QUERY, GATE, ""));
    p.create("orders", "2026-01-01", "2026-01-02", &[]).code(0);
    p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let log = std::fs::read_to_string(own.log_file()).unwrap();
    // Each plan of a statement that deletes an interval's rows of the target.
    let deletes: Vec<&str> = log
        .split("LOG:  duration:")
        .filter(|plan| plan.contains("Delete on orders_fact"))
        .collect();
    assert_eq!(deletes.len(), 4, "one delete per try:\n{log}");
    for plan in deletes {
        assert!(
            plan.contains("Index Scan using orders_fact_day")
                || plan.contains("Bitmap Index Scan on orders_fact_day"),
            "the interval's rows are not found through the index on day:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan on orders_fact"), "{plan}");
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn changed_and_stale_compare_the_source_fingerprint_again() {
    let gate = format!(
        "{GATE}\nsource_fingerprint = \"SELECT count(*) || '/' || coalesce(sum(amount), 0) FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end\""
    );
    let t = Pg::with_dag(&dag(QUERY, &gate, ""));
    t.p.create("orders", "2026-01-01", "2026-01-03", &[])
        .code(0);
    let stale = |t: &Pg| {
        let out = t.p.run(&[
            "stale",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--output",
            "json",
        ]);
        out.code(0);
        out.json()
    };
    assert_eq!(stale(&t), serde_json::json!([]));
    // A corrected amount on day 2: the count stays, the fingerprint moves.
    t.psql("UPDATE raw.orders SET amount = amount + 1 WHERE order_id = 4");
    let doc = stale(&t);
    assert_eq!(doc.as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc[0]["interval"]["start"], "2026-01-02T00:00:00Z");
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "changed", "--output", "json"],
    );
    out.code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(
        t.psql("SELECT partition_start::date FROM backfill.publishes ORDER BY published_at DESC LIMIT 1"),
        "2026-01-02"
    );
    assert_eq!(
        t.psql("SELECT count(*) FROM backfill.publishes"),
        "4",
        "only day 2 ran again"
    );
    assert_eq!(stale(&t), serde_json::json!([]));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_serialization_failure_runs_the_transaction_again() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    t.psql("UPDATE raw.orders SET amount = amount + 1");
    // Another session holds day 1's rows locked, and commits a change to them after the try's
    // snapshot was taken: the try's delete fails with a serialization failure.
    let psql = pg::bin_dir().map_or("psql".into(), |b| b.join("psql"));
    let mut holder = std::process::Command::new(psql)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &t.cluster.url(&t.db), "-c"])
        .arg("BEGIN; UPDATE analytics.orders_fact SET region = region WHERE day = '2026-01-01'; SELECT pg_sleep(2); COMMIT;")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the other session to hold the rows",
        Duration::from_secs(20),
        || {
            t.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(2)%' AND state = 'active' AND pid <> pg_backend_pid()",
            t.db
        )) == "1"
        },
    );
    let out = t.p.run_with(
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
            "--reprocess-behavior",
            "completed",
        ],
        &[("BACKFILL_LOG", "backfill=info")],
    );
    assert!(holder.wait().unwrap().success());
    out.code(0)
        .stderr_has("could not serialize access")
        .stderr_has("running the transaction again");
    assert_eq!(t.fact(), t.expected(&[1]));
    // One try, not a failure and a retry of the task.
    assert_eq!(
        t.p.rows("SELECT try_number, state FROM task_tries ORDER BY id DESC LIMIT 1"),
        vec![vec!["1".to_string(), "succeeded".to_string()]]
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn two_dags_write_two_tables_at_once_and_two_promotes_race() {
    let t = Pg::new();
    t.psql("CREATE TABLE analytics.orders_copy (LIKE analytics.orders_fact INCLUDING INDEXES)");
    t.p.write(
        "dags/copy.toml",
        &dag(QUERY, GATE, "").replace("analytics.orders_fact", "analytics.orders_copy"),
    );
    let a = t.p.spawn(
        "a",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--max-active-runs",
            "3",
        ],
    );
    let b = t.p.spawn(
        "b",
        &[
            "create",
            "--dag",
            "copy",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--max-active-runs",
            "3",
        ],
    );
    t.p.wait("a", a).code(0);
    t.p.wait("b", b).code(0);
    let expected = t.expected(&[1, 2, 3]);
    assert_eq!(t.fact(), expected);
    assert_eq!(
        t.psql("SELECT order_id, day, region, amount FROM analytics.orders_copy ORDER BY order_id"),
        expected
    );
    // Two processes promote one staged backfill at once: each interval is published once.
    t.psql("UPDATE raw.orders SET amount = amount + 3");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    let id = t.p.rows("SELECT max(id) FROM backfills")[0][0].clone();
    let before = t.psql("SELECT count(*) FROM backfill.publishes");
    let x = t.p.spawn("x", &["promote", &id]);
    let y = t.p.spawn("y", &["promote", &id]);
    let (x, y) = (t.p.wait("x", x), t.p.wait("y", y));
    assert!(x.code == 0 || y.code == 0, "{}\n{}", x.stderr, y.stderr);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    let after: i64 = t
        .psql("SELECT count(*) FROM backfill.publishes")
        .parse()
        .unwrap();
    assert_eq!(
        after - before.parse::<i64>().unwrap(),
        3,
        "each interval promoted once"
    );
    assert_eq!(staged_tables(&t), "0");
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn ctrl_c_cancels_the_statement_on_the_server() {
    let slow = "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount
FROM raw.orders, pg_sleep(60)
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end";
    let t = Pg::with_dag(&dag(slow, GATE, ""));
    let running = |t: &Pg| {
        t.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()",
            t.db
        ))
    };
    let child = t.p.spawn("run", &DAY_1);
    // The try's statement, not the check that prepares it at launch (before the backfill
    // listens for signals): a try is recorded as running first.
    wait_until(
        "the statement to run on the server",
        Duration::from_secs(30),
        || {
            t.p.has_manifest()
                && t.p
                    .rows("SELECT count(*) FROM task_tries WHERE state = 'running'")[0][0]
                    == "1"
                && running(&t) == "1"
        },
    );
    crate::support::signal(&child, nix::sys::signal::Signal::SIGINT);
    let out = t.p.wait("run", child);
    out.code(130);
    wait_until(
        "the statement to stop on the server",
        Duration::from_secs(10),
        || running(&t) == "0",
    );
    assert_eq!(t.fact(), "");
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_frozen_mid_try_does_not_hold_the_partition_past_its_takeover() {
    let t = Pg::new();
    // Frozen with its output written, its transaction open and day 1's rows locked.
    let frozen = freeze_day_1(&t, "before-publish");
    // Its session sits idle in its transaction: the server ends it after twice the lease
    // timeout, at least 5 s (idle_in_transaction_session_timeout), whether or not anyone can
    // kill the frozen process (one on another host cannot), and the rows are free again.
    assert_eq!(t.open_transactions(), "1");
    wait_until(
        "the server to end the frozen owner's transaction",
        Duration::from_secs(20),
        || t.open_transactions() == "0",
    );
    crate::support::wait_stale(&t.p, 1, 1500);
    let started = std::time::Instant::now();
    t.p.run(&["resume", "1"]).code(0);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(t.fact(), t.expected(&[1]));
    // Thawed, the old owner publishes nothing and records no success.
    crate::support::signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let out = t.p.wait("frozen", frozen);
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.p.rows("SELECT count(*) FROM task_tries WHERE state = 'succeeded'")[0][0],
        "1"
    );
    assert_eq!(t.psql("SELECT count(*) FROM backfill.publishes"), "1");
    t.wait_for_killed_sessions();
}

/// Lets leases expire after 1 s, and starts a backfill of day 1 that freezes itself (SIGSTOP)
/// at fault point `point`; returns once it is frozen.
fn freeze_day_1(t: &Pg, point: &str) -> std::process::Child {
    set_lease_timeout(t, "1s");
    let fault = format!("{point}:stop");
    let frozen =
        t.p.spawn_with("frozen", &DAY_1, &[("BACKFILL_FAULT", fault.as_str())]);
    wait_until("the owner to freeze", Duration::from_secs(30), || {
        crate::support::stopped(frozen.id())
    });
    frozen
}

/// Each of the `intervals` intervals of backfill `id` has exactly one succeeded try.
fn succeeded_once_each(t: &Pg, id: &str, intervals: usize, context: &str) {
    let succeeded = t.p.rows(&format!(
        "SELECT r.interval_start, count(*) FROM task_tries tt JOIN runs r ON r.id = tt.run_id \
         WHERE r.backfill_id = {id} AND tt.state = 'succeeded' GROUP BY 1 ORDER BY 1"
    ));
    assert_eq!(succeeded.len(), intervals, "{context}: {succeeded:?}");
    assert!(
        succeeded.iter().all(|r| r[1] == "1"),
        "{context}: {succeeded:?}"
    );
    // Each succeeded try is recorded with the rows and fingerprint that the warehouse booked
    // in its publish transaction, also when recovery finished its record after a kill.
    let manifest = t.p.rows("SELECT id FROM identity")[0][0].clone();
    for try_ in t.p.rows(&format!(
        "SELECT tt.id, tt.rows, tt.fingerprint FROM task_tries tt JOIN runs r ON r.id = tt.run_id \
         WHERE r.backfill_id = {id} AND tt.state = 'succeeded' ORDER BY 1"
    )) {
        let booked = t.psql(&format!(
            "SELECT rows || ' ' || fingerprint FROM backfill.publishes WHERE manifest = '{manifest}' AND try_id = {}",
            try_[0]
        ));
        assert_eq!(
            format!("{} {}", try_[1], try_[2]),
            booked,
            "{context}: try {} is recorded as booked",
            try_[0]
        );
    }
}

/// The id of the newest backfill of the manifest, `0` when there is none.
fn latest_backfill(t: &Pg) -> String {
    if !t.p.has_manifest() {
        return "0".into();
    }
    t.p.rows("SELECT coalesce(max(id), 0) FROM backfills")[0][0].clone()
}

/// Kills at random moments and at every fault point of a try, then `resume`: after each
/// iteration every partition equals the source, each interval succeeded once in the backfill,
/// and the server holds no open transaction and no staged table. `CHAOS_ITERATIONS` and
/// `CHAOS_SEED` run more (the default is a few, for `cargo test`).
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn random_kills_leave_every_partition_exact() {
    let slow = QUERY.replace("FROM raw.orders", "FROM raw.orders, pg_sleep(0.02)");
    let t = Pg::with_dag(&dag(&slow, GATE, "").replace(
        "retries = 0",
        "retries = 2\nretry_delay = \"10ms\"\nmax_active_runs = 3",
    ));
    let iterations: u64 = std::env::var("CHAOS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261201);
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    const POINTS: &[&str] = &[
        "after-audit",
        "before-source-count",
        "before-publish",
        "before-commit",
        "after-publish",
        "before-record",
    ];
    for it in 0..iterations {
        t.psql("UPDATE raw.orders SET amount = amount + 1");
        let before = latest_backfill(&t);
        let args = [
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--reprocess-behavior",
            "completed",
        ];
        let how = next(3);
        let out = if how == 0 {
            // Killed at a random moment.
            let child = t.p.spawn("chaos", &args);
            std::thread::sleep(Duration::from_millis(next(400)));
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            t.p.wait("chaos", child)
        } else {
            // Crashed at a fault point, the N-th time it is reached.
            let point = format!(
                "{}@{}",
                POINTS[next(POINTS.len() as u64) as usize],
                1 + next(3)
            );
            t.p.run_with(&args, &[("BACKFILL_FAULT", point.as_str())])
        };
        let latest = || latest_backfill(&t);
        if out.code != 0 {
            wait_until(
                "the killed sessions to end",
                Duration::from_secs(20),
                || t.open_transactions() == "0",
            );
            if latest() == before {
                // Killed before the backfill was recorded: nothing to resume, run it again.
                t.p.run(&args).code(0);
            } else {
                t.p.run(&["resume", &latest()]).code(0);
            }
        }
        let id = latest();
        assert_eq!(
            t.fact(),
            t.expected(&[1, 2, 3]),
            "iteration {it} (how {how})"
        );
        succeeded_once_each(&t, &id, 3, &format!("iteration {it}"));
        t.wait_for_killed_sessions();
        assert_eq!(staged_tables(&t), "0");
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_manifest_made_again_at_the_same_path_is_a_new_manifest_to_the_warehouse() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    std::fs::remove_dir_all(t.p.path(".backfill")).unwrap();
    if t.p.manifest_db().is_some() {
        t.p.exec("DROP SCHEMA backfill_manifest CASCADE");
    }
    // Its tries are numbered from 1 again: the warehouse's bookkeeping must not mistake them
    // for the first manifest's.
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    assert_eq!(
        t.psql("SELECT count(DISTINCT manifest), count(*) FROM backfill.publishes"),
        "2|4"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn recovery_waits_for_an_owner_frozen_in_its_first_publish_of_a_partition() {
    let t = Pg::new();
    // Frozen after booking its first publish of day 1, before the commit: the partition's row
    // in backfill.partitions exists only in its open transaction.
    let frozen = freeze_day_1(&t, "before-commit");
    crate::support::wait_stale(&t.p, 1, 1500);
    let resume = t.p.spawn("resume", &["resume", "1"]);
    // The recoverer must not judge the publish while the owner can still commit it: thawed
    // now, the owner asks the manifest, is refused and rolls back.
    std::thread::sleep(Duration::from_millis(500));
    crate::support::signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let owner = t.p.wait("frozen", frozen);
    t.p.wait("resume", resume).code(0);
    assert_ne!(owner.code, 0, "{}", owner.stderr);
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.p.rows("SELECT count(*) FROM task_tries WHERE state = 'succeeded'")[0][0],
        "1"
    );
    // One publish is booked: the one the manifest records as succeeded.
    let booked = t.psql("SELECT try_id FROM backfill.publishes");
    let succeeded =
        t.p.rows("SELECT id FROM task_tries WHERE state = 'succeeded'")[0][0].clone();
    assert_eq!(booked, succeeded);
}

/// The tries of backfill `id`: interval day, state, publishing, in interval order.
fn tries_of(t: &Pg, id: u32) -> Vec<Vec<String>> {
    t.p.rows(&format!(
        "SELECT to_char(to_timestamp(r.interval_start) AT TIME ZONE 'UTC', 'DD'), tt.state, tt.publishing \
         FROM task_tries tt JOIN runs r ON r.id = tt.run_id WHERE r.backfill_id = {id} ORDER BY tt.id"
    ))
}

/// Day 1 of the target, one line per row.
fn day_1(rows: &str) -> Vec<&str> {
    rows.lines()
        .filter(|l| l.contains("|2026-01-01|"))
        .collect()
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_a_publish_and_its_record_commit_in_one_transaction() {
    let t = Pg::one_database();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    // The manifest's tables are in the warehouse's database, and the publish recorded itself.
    assert_eq!(
        t.psql("SELECT count(*) FROM backfill_manifest.published"),
        "2"
    );
    let log =
        t.p.rows("SELECT log_path FROM task_tries ORDER BY id LIMIT 1")[0][0].clone();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains(
            "into analytics.orders_fact, recorded in the manifest in the same transaction"
        ),
        "{log}"
    );
    let rerun = [
        "create",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--reprocess-behavior",
        "completed",
        "--max-active-runs",
        "1",
    ];
    // Killed right after day 1's publish committed, before the process wrote anything more: the
    // manifest already records that publish, and nothing is left to settle.
    t.psql("UPDATE raw.orders SET amount = amount + 1000");
    let out = t.p.run_with(&rerun, &[("BACKFILL_FAULT", "after-publish")]);
    assert_ne!(out.code, 0, "the process was killed");
    assert_eq!(day_1(&t.fact()), day_1(&t.expected(&[1])));
    assert_eq!(tries_of(&t, 2), [["01", "succeeded", "0"]]);
    assert_eq!(
        t.p.rows(
            "SELECT tt.rows, tt.source_rows, tt.verdict, p.rows, p.fingerprint = tt.fingerprint \
             FROM published p JOIN task_tries tt ON tt.id = p.try_id \
             JOIN runs r ON r.id = tt.run_id WHERE r.backfill_id = 2"
        ),
        [["10", "10", "published", "10", "1"]]
    );
    t.wait_for_killed_sessions();
    t.p.run(&["resume", "2"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    // Day 1 was not run again.
    assert_eq!(
        tries_of(&t, 2),
        [["01", "succeeded", "0"], ["02", "succeeded", "0"]]
    );
    // Killed just before the commit: neither the rows nor the manifest's record committed.
    let before = t.fact();
    t.psql("UPDATE raw.orders SET amount = amount + 1000");
    let out = t.p.run_with(&rerun, &[("BACKFILL_FAULT", "before-commit")]);
    assert_ne!(out.code, 0, "the process was killed");
    assert_eq!(t.fact(), before);
    assert_eq!(tries_of(&t, 3), [["01", "running", "0"]]);
    assert_eq!(
        t.p.rows("SELECT count(*) FROM published p JOIN task_tries tt ON tt.id = p.try_id JOIN runs r ON r.id = tt.run_id WHERE r.backfill_id = 3"),
        [["0"]]
    );
    t.wait_for_killed_sessions();
    t.p.run(&["resume", "3"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    assert_eq!(
        tries_of(&t, 3),
        [
            ["01", "cancelled", "0"],
            ["01", "succeeded", "0"],
            ["02", "succeeded", "0"]
        ]
    );
    succeeded_once_each(&t, "3", 2, "after the kill before the commit");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_a_promote_and_a_rollback_commit_with_their_records() {
    let t = Pg::one_database();
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    t.psql("UPDATE raw.orders SET amount = amount + 1000");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    // Killed right after the promote's commit: the manifest already says the staged output
    // was promoted and is published, before anything settles it.
    let out =
        t.p.run_with(&["promote", "2"], &[("BACKFILL_FAULT", "after-publish")]);
    assert_ne!(out.code, 0, "the process was killed");
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.p.rows("SELECT id, state, publishing, coalesce(staged, '-') FROM task_tries ORDER BY id"),
        [
            ["1", "succeeded", "0", "-"],
            ["2", "succeeded", "0", "promoted"],
            ["3", "succeeded", "0", "-"]
        ]
    );
    assert_eq!(t.p.rows("SELECT try_id FROM published"), [["3"]]);
    // Nothing is left to promote; the promote's own backfill is recovered as finished.
    t.wait_for_killed_sessions();
    t.p.run(&["resume", "3"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.p.rows("SELECT count(*) FROM task_tries WHERE state = 'succeeded'"),
        [["3"]]
    );
    // A rollback, killed right after its commit: the first content is back, and the manifest
    // records the rollback as the partition's publication already.
    t.psql("UPDATE raw.orders SET amount = amount - 1000");
    let first = t.expected(&[1]);
    let out = t.p.run_with(
        &[
            "rollback",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
        &[("BACKFILL_FAULT", "after-publish")],
    );
    assert_ne!(out.code, 0, "the process was killed");
    assert_eq!(t.fact(), first);
    assert_eq!(
        t.p.rows("SELECT state, publishing, verdict, restored_from FROM task_tries WHERE id = 4"),
        [["succeeded", "0", "rolled back", "1"]]
    );
    assert_eq!(t.p.rows("SELECT try_id FROM published"), [["4"]]);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_a_warehouse_user_who_may_not_write_it_records_after_the_commit()
 {
    let t = Pg::one_database();
    // The manifest's schema exists once a first backfill made it.
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    let role = format!("wh_{}", t.db);
    t.psql(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA raw, analytics TO {role}; \
         GRANT SELECT ON ALL TABLES IN SCHEMA raw TO {role}; \
         GRANT ALL ON ALL TABLES IN SCHEMA analytics TO {role}; \
         GRANT ALL ON SCHEMA backfill TO {role}; GRANT ALL ON ALL TABLES IN SCHEMA backfill TO {role}"
    ));
    let toml = t.p.read("backfill.toml");
    t.p.write(
        "backfill.toml",
        &toml.replace("postgresql://postgres@", &format!("postgresql://{role}@")),
    );
    // No access to the manifest's schema at all; then writes without reads (an UPDATE with a
    // WHERE needs SELECT too).
    for (day, grant) in [
        ("2026-01-02", None),
        (
            "2026-01-03",
            Some(format!(
                "GRANT USAGE ON SCHEMA backfill_manifest TO {role}; \
                 GRANT UPDATE ON backfill_manifest.task_tries TO {role}; \
                 GRANT INSERT, UPDATE ON backfill_manifest.published TO {role}"
            )),
        ),
    ] {
        if let Some(grant) = grant {
            t.psql(&grant);
        }
        let out = t.p.create("orders", day, day, &[]);
        let warning = "warning: warehouse `dw` is in the manifest's database, but its user may not write the manifest's tables";
        assert_eq!(
            out.stderr.matches(warning).count(),
            1,
            "{day}: {}",
            out.stderr
        );
        out.code(0);
        let log =
            t.p.rows("SELECT log_path FROM task_tries ORDER BY id DESC LIMIT 1")[0][0].clone();
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(
            log.contains("published 10 rows into analytics.orders_fact\n"),
            "{log}"
        );
    }
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(
        t.p.rows("SELECT state, publishing FROM task_tries ORDER BY id"),
        [["succeeded", "0"], ["succeeded", "0"], ["succeeded", "0"]]
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_an_owner_thawed_after_its_recovery_publishes_nothing() {
    // Frozen after the manifest allowed its publish (`before-commit`), its transaction open;
    // recovered meanwhile. Thawed, its commit carries the manifest's record of the try that
    // recovery ended: the server refuses it (the try's row changed after the transaction's
    // snapshot), and the rows roll back with it.
    let t = Pg::one_database();
    // The server ends the frozen session after twice the lease timeout: long enough to thaw it
    // first.
    set_lease_timeout(&t, "5s");
    let frozen = t.p.spawn_with(
        "frozen",
        &DAY_1,
        &[("BACKFILL_FAULT", "before-commit:stop")],
    );
    wait_until("the owner to freeze", Duration::from_secs(30), || {
        crate::support::stopped(frozen.id())
    });
    crate::support::wait_stale(&t.p, 1, 5200);
    let resume = t.p.spawn("resume", &["resume", "1"]);
    wait_until(
        "the recovery to end the frozen owner's try",
        Duration::from_secs(20),
        || t.p.rows("SELECT state FROM task_tries WHERE id = 1")[0][0] == "cancelled",
    );
    crate::support::signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let owner = t.p.wait("frozen", frozen);
    t.p.wait("resume", resume).code(0);
    assert_ne!(owner.code, 0, "{}", owner.stderr);
    let log = t.p.rows("SELECT log_path FROM task_tries WHERE id = 1")[0][0].clone();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("not published: another process took this interval over"),
        "{log}"
    );
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.p.rows("SELECT id, state FROM task_tries ORDER BY id"),
        [["1", "cancelled"], ["2", "succeeded"]]
    );
    assert_eq!(t.p.rows("SELECT try_id FROM published"), [["2"]]);
    assert_eq!(t.psql("SELECT try_id FROM backfill.publishes"), "2");
    // The thawed owner exits with its transaction refused; the server may see its connection
    // close a moment after the process is gone (under a loaded machine, after this check).
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_promoted_partition_can_be_rolled_back() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    let first = t.fact();
    t.psql("UPDATE raw.orders SET amount = amount + 7");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    t.p.run(&["promote", "2"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    t.p.run(&[
        "rollback",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    assert_eq!(t.fact(), first);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_date_partition_refuses_intervals_shorter_than_a_day() {
    let hourly = dag(QUERY, GATE, "").replace("schedule = \"@daily\"", "schedule = \"@hourly\"");
    let t = Pg::with_dag(&hourly);
    t.psql("INSERT INTO analytics.orders_fact VALUES (999, '2026-01-01', 'eu', 1)");
    let before = t.fact();
    t.p.create("orders", "2026-01-01T22:00", "2026-01-01T23:00", &[])
        .code(3)
        .stderr_has("not whole days");
    assert_eq!(t.fact(), before, "no day was replaced");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_dry_run_finds_a_column_whose_type_does_not_fit_and_verify_writes_nothing() {
    let t = Pg::with_dag(&dag(
        &QUERY.replace("SELECT order_id,", "SELECT :ds_nodash AS order_id,"),
        GATE,
        "",
    ));
    t.p.create("orders", "2026-01-01", "2026-01-02", &["--dry-run"])
        .code(2)
        .stderr_has("do not fit target table `analytics.orders_fact`")
        .stderr_has("column \"order_id\" is of type integer");
    std::fs::write(t.p.path("dags/orders.toml"), dag(QUERY, GATE, "")).unwrap();
    t.p.run(&[
        "verify",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    assert_eq!(
        t.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'backfill'"),
        "0",
        "verify creates no bookkeeping and keeps nothing"
    );
}

/// A project whose query also returns `expr` as a column that the target gains as `column`,
/// with day 1 published, then staged again after `change` to the source (backfill 2).
fn staged_with_extra_column(expr: &str, column: &str, change: &str) -> Pg {
    let query = QUERY.replace(
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount",
        &format!(
            "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount, {expr}"
        ),
    );
    let t = Pg::with_dag(&dag(&query, GATE, ""));
    t.psql(&format!(
        "ALTER TABLE analytics.orders_fact ADD COLUMN {column}"
    ));
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    if !change.is_empty() {
        t.psql(change);
    }
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    t
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn fingerprints_do_not_depend_on_the_session_time_zone() {
    let t = staged_with_extra_column("order_ts", "order_ts timestamptz", "");
    // The database's time zone changes between staging and promoting.
    t.psql(&format!(
        "ALTER DATABASE \"{}\" SET timezone = 'Asia/Tokyo'",
        t.db
    ));
    conn_reset(&t);
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    assert_eq!(diff.json()[0]["same_fingerprint"], true, "{}", diff.stdout);
    t.p.run(&["promote", "2"]).code(0);
}

/// Ends the sessions of the test's database but psql's own (new ones read new settings).
fn conn_reset(t: &Pg) {
    t.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) >= 0 FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
        t.db
    ));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn diff_compares_rows_whose_columns_have_no_equality_operator() {
    let t = staged_with_extra_column(
        "json_build_object('a', amount) AS doc",
        "doc json",
        "UPDATE raw.orders SET amount = amount + 1 WHERE order_id = 3",
    );
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    assert!(!diff.stderr.contains("warning"), "{}", diff.stderr);
    let d1 = &diff.json()[0];
    assert_eq!(d1["keys"]["changed"], 1, "{d1}");
    assert_eq!(d1["keys"]["examples"]["changed"], serde_json::json!([3]));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_task_reads_what_the_task_before_it_just_published() {
    // One process runs both tasks, one try at a time, on the same pooled connection: each try's
    // snapshot must be taken by its own statement (after the commit before it), so `daily`
    // sees the rows `fact` just published.
    let daily = r#"
[[tasks]]
id = "daily"
depends_on = ["fact"]
warehouse = "dw"
target = "analytics.daily_totals"
partition_column = "day"
sql = """
SELECT day, count(*) AS orders, sum(amount) AS amount FROM analytics.orders_fact
WHERE day = :ds GROUP BY day
"""
[tasks.gate]
source_count = "SELECT count(DISTINCT day) FROM analytics.orders_fact WHERE day = :ds"
unique_key = ["day"]
"#;
    let t = Pg::with_dag(&format!("{}{daily}", dag(QUERY, GATE, "")));
    t.psql("CREATE TABLE analytics.daily_totals (day date NOT NULL, orders bigint NOT NULL, amount numeric NOT NULL)");
    let totals =
        |t: &Pg| t.psql("SELECT day, orders, amount FROM analytics.daily_totals ORDER BY day");
    let from_source = |t: &Pg| {
        t.psql(
            "SELECT (order_ts AT TIME ZONE 'UTC')::date AS day, count(*), sum(amount) FROM raw.orders \
             GROUP BY 1 ORDER BY 1",
        )
    };
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--max-active-runs", "1"],
    )
    .code(0);
    assert_eq!(totals(&t), from_source(&t));
    // New source values: every rerun of `daily` must see its day's new `fact`.
    t.psql("UPDATE raw.orders SET amount = amount + 100");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &[
            "--max-active-runs",
            "1",
            "--reprocess-behavior",
            "completed",
        ],
    )
    .code(0);
    assert_eq!(totals(&t), from_source(&t));
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    t.wait_for_killed_sessions();
}

// ---------------------------------------------------------------------------------------------
// The fast path of a try: a slot freed as soon as a success is queued, the booking in the try's
// statement, the BEGIN sent with the statement, fingerprints by the target's types.
// ---------------------------------------------------------------------------------------------

/// A second task on a target of its own: its first try in the process finds the connection that
/// the first task's COMMIT began a transaction on, and the target's kept table not made yet.
const REJECTING_DAILY: &str = r#"
[[tasks]]
id = "daily"
depends_on = ["fact"]
warehouse = "dw"
target = "analytics.daily_totals"
partition_column = "day"
sql = """
SELECT day, count(*) AS orders FROM analytics.orders_fact WHERE day = :ds GROUP BY day
"""
[tasks.gate]
source_count = "SELECT 2"
"#;

/// `orders` with a second task, `daily`, whose gate rejects its output, and its target.
fn rejecting_daily() -> Pg {
    let t = Pg::with_dag(&format!("{}{REJECTING_DAILY}", dag(QUERY, GATE, "")));
    t.psql("CREATE TABLE analytics.daily_totals (day date NOT NULL, orders bigint NOT NULL)");
    t
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_rejected_try_on_a_connection_another_try_just_used_publishes_nothing() {
    // The try of `daily` runs on the connection `fact`'s try just used. Its target has no kept
    // table yet (`keep_versions` is 1 by default), and making it must not end the try's
    // transaction: the statement would run in autocommit, and the rows of a try the gate
    // rejects (1 row, source_count says 2) would be published, booking included, without the
    // manifest being asked.
    let t = rejecting_daily();
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--max-active-runs", "1"],
    );
    out.code(3).stderr_has("rejected");
    assert_eq!(
        t.p.rows("SELECT task_id, state FROM task_tries ORDER BY id"),
        vec![
            vec!["fact".to_string(), "succeeded".to_string()],
            vec!["daily".to_string(), "rejected".to_string()]
        ]
    );
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.psql("SELECT count(*) FROM analytics.daily_totals"),
        "0",
        "the rejected try's rows were published"
    );
    assert_eq!(
        t.psql("SELECT count(*) FROM backfill.publishes WHERE target = 'analytics.daily_totals'"),
        "0",
        "the rejected try left a booking"
    );
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_try_killed_before_its_gate_on_a_reused_connection_is_not_recovered_as_published() {
    // The same two tasks; the process is killed right after `daily`'s statement returned
    // (before its gate judged it). Nothing of a try the gate never passed may be published:
    // the server must roll it back, and recovery must find no booking and run it again (to be
    // rejected again), not record it as succeeded.
    let t = rejecting_daily();
    // The first hit is `fact`'s try, the second `daily`'s.
    let out = t.p.run_with(
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
            "--max-active-runs",
            "1",
        ],
        &[("BACKFILL_FAULT", "before-source-count@2")],
    );
    assert_ne!(out.code, 0, "the process was killed");
    t.wait_for_killed_sessions();
    // Checked together, so that the failure shows all of what went wrong.
    let mut wrong = Vec::new();
    let after_kill = t.psql("SELECT count(*) FROM analytics.daily_totals");
    if after_kill != "0" {
        wrong.push(format!(
            "after the kill, the target holds {after_kill} row(s) of a try the gate never judged"
        ));
    }
    let resumed = t.p.run(&["resume", "1"]);
    if resumed.code != 3 {
        wrong.push(format!(
            "resume exited {} (expected 3: daily is rejected again)",
            resumed.code
        ));
    }
    let daily = t.p.rows(
        "SELECT id, state, rows, fingerprint FROM task_tries WHERE task_id = 'daily' ORDER BY id",
    );
    if daily.iter().any(|r| r[1] == "succeeded") {
        wrong.push(format!(
            "a try the gate never passed is recorded as succeeded: {daily:?}"
        ));
    }
    let published =
        t.p.count("SELECT count(*) FROM published WHERE task_id = 'daily'");
    if published != 0 {
        wrong.push(format!(
            "the manifest records {published} publication(s) of daily"
        ));
    }
    let rows = t.psql("SELECT count(*) FROM analytics.daily_totals");
    if rows != "0" {
        wrong.push(format!("after resume, the target holds {rows} row(s)"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A project whose DAG `orders` has one task, `totals`, that writes `sql`'s rows into
/// `analytics.daily_totals`, made by `table`.
fn totals(sql: &str, table: &str) -> Pg {
    let t = Pg::with_dag(&totals_dag(sql));
    t.psql(table);
    t
}

/// Day 1 (or days 1 and 2) of `orders` succeeded; the tries' errors otherwise.
fn created(t: &Pg, to: &str) {
    let out = t.p.create("orders", "2026-01-01", to, &[]);
    assert_eq!(
        out.code,
        0,
        "{}\n{}",
        out.stderr,
        t.p.rows("SELECT error FROM task_tries").concat().join("\n")
    );
}

/// The DAG of [`totals`].
fn totals_dag(sql: &str) -> String {
    format!(
        r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "totals"
warehouse = "dw"
target = "analytics.daily_totals"
partition_column = "day"
sql = """
{sql}
"""
[tasks.gate]
unique_key = ["region"]
"#
    )
}

/// Publishes day 1, stages it again from the same source, and checks that `diff` finds the
/// same fingerprint and that `promote` publishes the staged output.
fn stage_same_rows_and_promote(table: &str, sql: &str) {
    let t = totals(sql, table);
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    let before = t.psql("SELECT * FROM analytics.daily_totals ORDER BY region");
    assert_ne!(before, "");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    let fingerprints =
        t.p.rows("SELECT id, fingerprint, staged FROM task_tries ORDER BY id");
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    let same = diff.json()[0]["same_fingerprint"] == true;
    let promote = t.p.run(&["promote", "2"]);
    assert!(
        same && promote.code == 0,
        "the same rows, staged, get another fingerprint (diff: {}; tries: {fingerprints:?}); \
         promote exited {}: {}",
        diff.stdout,
        promote.code,
        promote.stderr
    );
    assert_eq!(
        t.psql("SELECT * FROM analytics.daily_totals ORDER BY region"),
        before
    );
}

const CENTS_BY_REGION: &str = "SELECT (order_ts AT TIME ZONE 'UTC')::date AS day, region, sum((amount * 100)::bigint) AS cents
FROM raw.orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
GROUP BY 1, 2";

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_sum_of_bigints_into_a_bigint_column_has_one_fingerprint_staged_and_promoted() {
    // `sum(bigint)` is `numeric` in the query, `bigint` in the table: the try, diff and promote
    // must all hash the column as the table holds it.
    stage_same_rows_and_promote(
        "CREATE TABLE analytics.daily_totals (day date NOT NULL, region text NOT NULL, cents bigint NOT NULL)",
        CENTS_BY_REGION,
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_domain_column_has_one_fingerprint_staged_and_promoted() {
    // The query and the table agree on the type, a domain over bigint, which the protocol
    // names by its base type (`int8`) and `format_type` by the domain's name: every path must
    // hash it the same way.
    stage_same_rows_and_promote(
        "CREATE DOMAIN analytics.cents AS bigint CHECK (VALUE >= 0); \
         CREATE TABLE analytics.daily_totals (day date NOT NULL, region text NOT NULL, cents analytics.cents NOT NULL)",
        &CENTS_BY_REGION.replace(
            "sum((amount * 100)::bigint) AS cents",
            "sum((amount * 100)::bigint)::analytics.cents AS cents",
        ),
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_count_into_a_numeric_column_still_publishes() {
    // `count(*)` is `bigint` in the query, `numeric` in the table (an assignment cast): the try
    // must hash the stored `numeric`, not call an integer hash on it.
    let t = totals(
        "SELECT (order_ts AT TIME ZONE 'UTC')::date AS day, region, count(*) AS orders
FROM raw.orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
GROUP BY 1, 2",
        "CREATE TABLE analytics.daily_totals (day date NOT NULL, region text NOT NULL, orders numeric NOT NULL)",
    );
    created(&t, "2026-01-02");
    assert_eq!(
        t.psql("SELECT day, region, orders FROM analytics.daily_totals ORDER BY 1, 2"),
        "2026-01-01|eu|5\n2026-01-01|us|5\n2026-01-02|eu|5\n2026-01-02|us|5"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_timestamp_into_a_timestamptz_column_still_publishes() {
    // A `timestamp` (UTC wall time) into a `timestamptz` column (an implicit cast): the try must
    // hash the stored `timestamptz`, not call the `timestamp` hash on it.
    let t = totals(
        "SELECT (order_ts AT TIME ZONE 'UTC')::date AS day, region, max(order_ts AT TIME ZONE 'UTC') AS last_order
FROM raw.orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
GROUP BY 1, 2",
        "CREATE TABLE analytics.daily_totals (day date NOT NULL, region text NOT NULL, last_order timestamptz NOT NULL)",
    );
    created(&t, "2026-01-01");
    assert_eq!(t.psql("SELECT count(*) FROM analytics.daily_totals"), "2");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_pooled_connection_ended_by_the_server_is_replaced() {
    // Between day 1 and day 2 a command task has the server end every `backfill` session of the
    // database (as a restart or an administrator would) and waits until they are gone: day 2's
    // try must get a new connection, not fail on the dead one in the pool.
    let psql = pg::bin_dir()
        .map(|b| b.join("psql"))
        .filter(|p| p.is_file())
        .map_or_else(|| "psql".to_string(), |p| p.display().to_string());
    let t = Pg::new();
    let url = t.cluster.url(&t.db);
    let wait = format!(
        r#"
[[tasks]]
id = "wait"
depends_on = ["fact"]
timeout = "60s"
command = "until [ \"$({psql} '{url}?sslmode=disable' -Atc \"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'backfill'\")\" = 0 ]; do sleep 0.1; done"
"#
    );
    t.p.write(
        "dags/orders.toml",
        &format!("{}{wait}", dag(QUERY, GATE, "")),
    );
    set_lease_timeout(&t, "1s");
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--max-active-runs", "1"],
    );
    assert_eq!(
        out.code,
        0,
        "{}\n{:?}",
        out.stderr,
        t.p.rows("SELECT id, task_id, state, error FROM task_tries ORDER BY id")
    );
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn fingerprints_of_timestamptz_arrays_do_not_depend_on_the_session_time_zone() {
    // Like `fingerprints_do_not_depend_on_the_session_time_zone`, with the instants in an array,
    // whose text is written in the session's `TimeZone`: it must be hashed in UTC.
    let t = staged_with_extra_column("ARRAY[order_ts] AS seen", "seen timestamptz[]", "");
    t.psql(&format!(
        "ALTER DATABASE \"{}\" SET timezone = 'Asia/Tokyo'",
        t.db
    ));
    conn_reset(&t);
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    let same = diff.json()[0]["same_fingerprint"] == true;
    let promote = t.p.run(&["promote", "2"]);
    assert!(
        same && promote.code == 0,
        "diff: {}\npromote exited {}: {}",
        diff.stdout,
        promote.code,
        promote.stderr
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_commit_that_fails_publishes_nothing_and_the_next_try_runs() {
    // A deferred constraint fails day 2's COMMIT (sent with the next try's BEGIN in one round
    // trip): the server rolls the transaction back, booking included, so the settling finds no
    // booking and the try fails; day 1, before it, and day 3, after it on the same pooled
    // connection, publish in transactions of their own.
    let t = Pg::new();
    t.psql(
        "CREATE FUNCTION analytics.no_day_2() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.day = date '2026-01-02' THEN RAISE EXCEPTION 'day 2 refused at commit'; END IF; RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER no_day_2 AFTER INSERT ON analytics.orders_fact \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION analytics.no_day_2()",
    );
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--max-active-runs", "1"],
    );
    out.code(3).stderr_has("day 2 refused at commit");
    assert_eq!(t.fact(), t.expected(&[1, 3]));
    assert_eq!(
        t.psql("SELECT partition_start::date FROM backfill.publishes ORDER BY 1"),
        "2026-01-01\n2026-01-03"
    );
    assert_eq!(
        t.p.rows(
            "SELECT r.interval_start, t.state, t.publishing FROM task_tries t JOIN runs r ON r.id = t.run_id ORDER BY r.interval_start"
        )
        .iter()
        .map(|r| format!("{} {}", r[1], r[2]))
        .collect::<Vec<_>>(),
        vec!["succeeded 0", "failed 0", "succeeded 0"]
    );
    assert_eq!(t.p.count("SELECT count(*) FROM published"), 2);
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_publish_recovered_after_a_kill_keeps_its_source_fingerprint_and_gate_record() {
    // The intent is recorded before the try has measured anything, so a publish that committed
    // just before a kill is recorded by recovery from the booking: rows and fingerprint. What
    // `changed` and `stale` compare (the source fingerprint), and what the gate saw (source
    // rows, verdict), must not be lost with it: the source did not change, so nothing is stale.
    let gate = format!(
        "{GATE}\nsource_fingerprint = \"SELECT count(*) || '/' || coalesce(sum(amount), 0) FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end\""
    );
    let t = Pg::with_dag(&dag(QUERY, &gate, ""));
    let out = t.p.run_with(&DAY_1, &[("BACKFILL_FAULT", "after-publish")]);
    assert_ne!(out.code, 0, "the process was killed");
    t.p.run(&["resume", "1"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1]));
    succeeded_once_each(&t, "1", 1, "recovered");
    // The same source, published by a try that was not killed, for comparison.
    t.p.create("orders", "2026-01-02", "2026-01-02", &[])
        .code(0);
    let tries = t.p.rows(
        "SELECT r.interval_start, t.source_rows, t.source_fingerprint IS NOT NULL, t.verdict IS NOT NULL \
         FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE t.state = 'succeeded' ORDER BY 1",
    );
    let stale = t.p.run(&[
        "stale",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--output",
        "json",
    ]);
    stale.code(0);
    assert!(
        stale.json() == serde_json::json!([]) && tries[0][1..] == tries[1][1..],
        "stale: {}\nsucceeded tries (start, source rows, has source fingerprint, has verdict): {tries:?}",
        stale.stdout
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn old_bookings_of_ended_tries_are_pruned_and_recent_ones_kept() {
    // `backfill.publishes` is read only for tries the manifest has not recorded as ended; each
    // start of a backfill deletes this manifest's bookings of ended tries older than 7 days.
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    let manifest = t.p.rows("SELECT id FROM identity")[0][0].clone();
    // Try 1's booking made old, and an old one of another manifest, which stays.
    t.psql(&format!(
        "UPDATE backfill.publishes SET published_at = now() - interval '8 days' WHERE manifest = '{manifest}' AND try_id = 1;
         INSERT INTO backfill.publishes (manifest, try_id, target, partition_start, partition_end, rows, published_at)
         VALUES ('someone-else', 1, 'analytics.orders_fact', '2026-01-01', '2026-01-02', 1, now() - interval '30 days')"
    ));
    t.p.create("orders", "2026-01-03", "2026-01-03", &[])
        .code(0);
    assert_eq!(
        t.psql("SELECT manifest = 'someone-else', try_id FROM backfill.publishes ORDER BY 1, 2"),
        "f|2\nf|3\nt|1"
    );
}

// ---- The guarded BEGIN, the judged record sent with the commit, fingerprints by the target's
// types and the pool cleanup of PostgreSQL tries.

/// Like [`staged_with_extra_column`], with `setup` run before the target gains `column`.
fn staged_with_setup(expr: &str, setup: &str, column: &str) -> Pg {
    let query = QUERY.replace(
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount",
        &format!(
            "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount, {expr}"
        ),
    );
    let t = Pg::with_dag(&dag(&query, GATE, ""));
    t.psql(setup);
    t.psql(&format!(
        "ALTER TABLE analytics.orders_fact ADD COLUMN {column}"
    ));
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-01",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    t
}

/// The database's time zone changes after staging: `diff` must still find the same
/// fingerprint, and `promote` must publish (it checks the staged rows' fingerprint again).
fn same_fingerprint_in_another_time_zone(t: &Pg) {
    t.psql(&format!(
        "ALTER DATABASE \"{}\" SET timezone = 'Asia/Tokyo'",
        t.db
    ));
    conn_reset(t);
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    let same = diff.json()[0]["same_fingerprint"] == true;
    let promote = t.p.run(&["promote", "2"]);
    assert!(
        same && promote.code == 0,
        "the same rows get another fingerprint once the session's TimeZone changed\n\
         diff: {}\npromote exited {}: {}",
        diff.stdout,
        promote.code,
        promote.stderr
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn fingerprints_of_tstzrange_columns_do_not_depend_on_the_session_time_zone() {
    // A `tstzrange`'s text writes both bounds in the session's TimeZone: it must be hashed in
    // UTC.
    let t = staged_with_extra_column(
        "tstzrange(order_ts, order_ts + interval '1 hour') AS span",
        "span tstzrange",
        "",
    );
    same_fingerprint_in_another_time_zone(&t);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn fingerprints_of_a_domain_over_timestamptz_do_not_depend_on_the_session_time_zone() {
    // `format_type` names the column by its domain: it must be hashed as its base type, in UTC,
    // not by its text, which follows the session's TimeZone.
    let t = staged_with_setup(
        "order_ts AS seen",
        "CREATE DOMAIN analytics.instant AS timestamptz",
        "seen analytics.instant",
    );
    same_fingerprint_in_another_time_zone(&t);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_lease_timeout_of_two_weeks_still_runs_postgres_tries() {
    // The try's session gets idle_in_transaction_session_timeout = twice the lease timeout in
    // milliseconds, in the simple query that carries its BEGIN: past 2^31 - 1 ms (a lease
    // timeout of about 12.4 days) the server would refuse the SET and no try could run; the
    // setting is capped at the server's limit.
    let t = Pg::new();
    set_lease_timeout(&t, "14days");
    let out = t.p.create("orders", "2026-01-01", "2026-01-01", &[]);
    assert_eq!(
        out.code,
        0,
        "{}\n{:?}",
        out.stderr,
        t.p.rows("SELECT state, error FROM task_tries ORDER BY id")
    );
    assert_eq!(t.fact(), t.expected(&[1]));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_try_whose_begin_fails_commits_nothing_even_when_its_query_sets_the_guard() {
    // A query that itself sets `backfill.in_try` (at session level, as `set_config(..., false)`
    // does) must not pass the guard of a statement outside its try's transaction; with a lease
    // timeout of two weeks (whose SET once made the BEGIN fail), whatever happens, a try that
    // did not succeed leaves the partition and the bookings as they were.
    let query = QUERY.replace(
        "WHERE order_ts >= :data_interval_start",
        "WHERE public.sets_guard('on', false) = 'on' AND order_ts >= :data_interval_start",
    );
    let t = Pg::with_dag(&dag(&query, GATE, ""));
    t.psql(SETS_GUARD);
    t.psql("INSERT INTO analytics.orders_fact VALUES (999, '2026-01-01', 'eu', 1)");
    let before = t.fact();
    set_lease_timeout(&t, "14days");
    let out = t.p.create("orders", "2026-01-01", "2026-01-01", &[]);
    let tries = t.p.rows("SELECT state, error FROM task_tries ORDER BY id");
    let succeeded = tries.iter().any(|r| r[0] == "succeeded");
    let mut wrong = Vec::new();
    if !succeeded && t.fact() != before {
        wrong.push(format!(
            "the try did not succeed (exit {}: {tries:?}) but the partition was replaced:\n{}",
            out.code,
            t.fact()
        ));
    }
    let booked = t.psql("SELECT count(*) FROM backfill.publishes");
    if !succeeded && booked != "0" {
        wrong.push(format!("{booked} booking(s) of a try that did not succeed"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    t.wait_for_killed_sessions();
}

/// A function that sets backfill's own guard setting: what the parser cannot see, called from
/// a query it lets through.
const SETS_GUARD: &str = "CREATE FUNCTION public.sets_guard(v text, local boolean) RETURNS text LANGUAGE sql AS $$ SELECT set_config('backfill.in_try', v, local) $$";

/// The project's `orders` DAG with its task in pool `api` of one slot, a DAG `other` whose
/// command task takes the same pool, and leases that expire after 1 s.
fn pooled_pg(t: &Pg) {
    t.p.write("dags/orders.toml", &dag(QUERY, GATE, "pool = \"api\"\n"));
    t.p.write(
        "dags/other.toml",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\npool = \"api\"\ncommand = \"touch ran-other\"\n",
    );
    let toml = format!("{}\n[pools]\napi = 1\n", t.p.read("backfill.toml"));
    t.p.write("backfill.toml", &toml);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_publish_committed_before_its_slot_was_given_away_is_recorded_as_succeeded() {
    // The owner froze right after its PostgreSQL publish committed, before the manifest
    // recorded it. Its pool slot is given to another backfill's try. Thawed, the owner records
    // the publish: the partition holds its rows, so the manifest must say it succeeded, with
    // its gate record.
    let t = Pg::new();
    pooled_pg(&t);
    let frozen = freeze_day_1(&t, "after-publish");
    assert_eq!(t.fact(), t.expected(&[1]), "the publish committed");
    crate::support::wait_stale(&t.p, 1, 1500);
    t.p.create("other", "2026-01-01", "2026-01-01", &[]).code(0);
    assert!(t.p.path("ran-other").exists());
    crate::support::signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let owner = t.p.wait("frozen", frozen);
    assert_eq!(t.fact(), t.expected(&[1]));
    let tries = t.p.rows(
        "SELECT t.id, t.state, t.publishing, t.source_rows, t.verdict IS NOT NULL, coalesce(t.error, '') \
         FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.dag_id = 'orders' ORDER BY t.id",
    );
    let published =
        t.p.rows("SELECT try_id FROM published WHERE dag_id = 'orders'");
    assert!(
        tries.len() == 1
            && tries[0][1..5] == ["succeeded", "0", "10", "1"]
            && published == [[tries[0][0].clone()]],
        "the warehouse holds try 1's publish; the manifest says (id, state, publishing, source rows, \
         has verdict, error): {tries:?}, published: {published:?}; the owner exited {}: {}",
        owner.code,
        owner.stderr
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_frozen_after_its_manifest_allowed_the_commit_is_recorded_as_what_it_did() {
    // Frozen after the manifest allowed its publish (`before-commit`), its transaction open,
    // while its pool slot is given away. Thawed, it commits if the server has not ended its
    // idle transaction yet (twice a 5 s lease timeout), else its commit fails: either way the
    // manifest records what the warehouse holds (a consent given before the slot went cannot
    // be taken back; a publish not yet consented to is refused, see the test before).
    let t = Pg::new();
    pooled_pg(&t);
    set_lease_timeout(&t, "5s");
    let frozen = t.p.spawn_with(
        "frozen",
        &DAY_1,
        &[("BACKFILL_FAULT", "before-commit:stop")],
    );
    wait_until("the owner to freeze", Duration::from_secs(30), || {
        crate::support::stopped(frozen.id())
    });
    let frozen_at = std::time::Instant::now();
    crate::support::wait_stale(&t.p, 1, 5200);
    t.p.create("other", "2026-01-01", "2026-01-01", &[]).code(0);
    let _ = frozen_at;
    crate::support::signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    let owner = t.p.wait("frozen", frozen);
    let tries =
        t.p.rows("SELECT state, publishing FROM task_tries WHERE id = 1");
    let published =
        t.p.rows("SELECT try_id FROM published WHERE dag_id = 'orders'");
    let booked = t.psql("SELECT count(*) FROM backfill.publishes");
    let context = format!(
        "its try: {tries:?}, published: {published:?}, booked: {booked}; the owner exited {}: {}",
        owner.code, owner.stderr
    );
    if t.fact().is_empty() {
        assert_eq!(booked, "0", "{context}");
        assert!(published.is_empty(), "{context}");
        assert_ne!(tries[0][0], "succeeded", "{context}");
    } else {
        assert_eq!(t.fact(), t.expected(&[1]), "{context}");
        assert_eq!(booked, "1", "{context}");
        assert_eq!(tries, [["succeeded", "0"]], "{context}");
        assert_eq!(published, [["1"]], "{context}");
    }
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_killed_owner_whose_committed_publish_was_cancelled_by_the_pool_cleanup_is_recovered() {
    // Killed right after its publish committed; another backfill takes the pool's slot, and the
    // cleanup leaves the dead owner's try (publishing = TRUE) to recovery. `resume` settles it
    // from the booking: succeeded, with its gate record, and without an error.
    let t = Pg::new();
    pooled_pg(&t);
    set_lease_timeout(&t, "1s");
    let out = t.p.run_with(&DAY_1, &[("BACKFILL_FAULT", "after-publish")]);
    assert_ne!(out.code, 0, "the process was killed");
    t.p.create("other", "2026-01-01", "2026-01-01", &[]).code(0);
    assert_eq!(
        t.p.rows("SELECT state, publishing FROM task_tries WHERE id = 1"),
        [["running", "1"]],
        "the cleanup left the dead owner's publish to recovery"
    );
    t.p.run(&["resume", "1"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1]));
    let tries = t.p.rows(
        "SELECT state, publishing, source_rows, verdict IS NOT NULL, coalesce(error, 'none') FROM task_tries WHERE id = 1",
    );
    assert_eq!(
        tries,
        [["succeeded", "0", "10", "1", "none"]],
        "(state, publishing, source rows, has verdict, error)"
    );
    assert_eq!(
        t.p.rows("SELECT try_id FROM published WHERE dag_id = 'orders'"),
        [["1"]]
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_source_count_that_overwrites_the_guard_setting_fails_its_try_and_commits_nothing() {
    // The guard reads `backfill.in_try` after the statement's other columns: a source_count
    // that overwrites backfill's own setting makes the guard fail the try, safely: nothing is
    // committed, and the message says why.
    // A function of the user's hides the call from the parser that refuses `set_config`.
    let gate = GATE.replace(
        "SELECT count(*) FROM raw.orders WHERE",
        "SELECT count(*) FROM raw.orders WHERE public.sets_guard('off', true) = 'off' AND",
    );
    let t = Pg::with_dag(&dag(QUERY, &gate, ""));
    t.psql(SETS_GUARD);
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(3)
        .stderr_has("the statement is outside its try's transaction (off)");
    assert_eq!(t.fact(), "");
    assert_eq!(t.psql("SELECT count(*) FROM backfill.publishes"), "0");
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn every_committed_publish_books_its_judged_record() {
    // The judged record goes with the booking in the commit's round trip: each committed
    // publish of a backfill (and of a rerun on the same pooled connection) has it, and it
    // agrees with what the manifest recorded.
    let t = Pg::new();
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--max-active-runs", "1"],
    )
    .code(0);
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let booked = t.psql(
        "SELECT try_id || ' ' || coalesce((judged::json->>'source_rows'), 'none') || ' ' || coalesce((judged::json->>'previous_rows'), 'none') \
         FROM backfill.publishes ORDER BY try_id",
    );
    let recorded = t
        .p
        .rows("SELECT id, coalesce(CAST(source_rows AS TEXT), 'none'), coalesce(CAST(previous_rows AS TEXT), 'none') FROM task_tries ORDER BY id")
        .iter()
        .map(|r| r.join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(booked, recorded);
}

/// Sets the project's lease timeout.
fn set_lease_timeout(t: &Pg, timeout: &str) {
    let toml = t.p.read("backfill.toml").replace(
        "lease_timeout = \"30s\"",
        &format!("lease_timeout = \"{timeout}\""),
    );
    t.p.write("backfill.toml", &toml);
}

/// A backfill of day 1 of `orders`.
const DAY_1: [&str; 7] = [
    "create",
    "--dag",
    "orders",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-01",
];

/// Dates the target holds beside its partition column: the extremes `infinity` and
/// `-infinity`, `NULL`, a domain over `date` and an array of dates. Publish, `verify`, stage,
/// `diff`, promote and rollback must all fingerprint them alike.
const DATES_EXPR: &str = "CASE order_id % 4 WHEN 0 THEN 'infinity'::date WHEN 1 THEN '-infinity'::date WHEN 2 THEN NULL ELSE date '2026-03-01' + order_id END AS due, \
(date '2026-02-01' + order_id)::analytics.day_d AS billed, \
ARRAY[date '2026-01-01' + order_id, NULL, 'infinity'::date] AS seen";

fn dates_project() -> Pg {
    let query = QUERY.replace(
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount",
        &format!(
            "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount, {DATES_EXPR}"
        ),
    );
    let t = Pg::with_dag(&dag(&query, GATE, ""));
    t.psql(
        "CREATE DOMAIN analytics.day_d AS date CHECK (VALUE > date '2000-01-01'); \
         ALTER TABLE analytics.orders_fact ADD COLUMN due date, ADD COLUMN billed analytics.day_d, ADD COLUMN seen date[]",
    );
    t
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn date_columns_have_one_fingerprint_in_verify_stage_promote_and_rollback() {
    let t = dates_project();
    t.p.create("orders", "2026-01-01", "2026-01-02", &[])
        .code(0);
    let first = t.psql("SELECT * FROM analytics.orders_fact ORDER BY order_id");
    assert!(first.contains("infinity"), "{first}");
    // verify measures twice: the same rows, the same fingerprint.
    let v = t.p.run(&[
        "verify",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ]);
    assert_eq!(
        v.code, 0,
        "verify right after a publish: {}\n{}",
        v.stdout, v.stderr
    );
    // The same source staged again: diff finds the same fingerprint, promote accepts it.
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--stage", "--reprocess-behavior", "completed"],
    )
    .code(0);
    let diff = t.p.run(&["diff", "2", "--output", "json"]);
    diff.code(0);
    for d in diff.json().as_array().unwrap() {
        assert_eq!(d["same_fingerprint"], true, "{}", diff.stdout);
    }
    let promote = t.p.run(&["promote", "2"]);
    assert_eq!(promote.code, 0, "{}", promote.stderr);
    assert_eq!(
        t.psql("SELECT * FROM analytics.orders_fact ORDER BY order_id"),
        first
    );
    // A changed source replaces the dates; rollback puts the first ones back.
    t.psql("UPDATE raw.orders SET amount = amount + 1");
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_ne!(
        t.psql("SELECT * FROM analytics.orders_fact ORDER BY order_id"),
        first
    );
    let rb = t.p.run(&[
        "rollback",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ]);
    assert_eq!(rb.code, 0, "{}", rb.stderr);
    assert_eq!(
        t.psql("SELECT * FROM analytics.orders_fact ORDER BY order_id"),
        first
    );
    t.wait_for_killed_sessions();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_date_past_the_timestamp_range_still_publishes_and_verifies() {
    // `date` reaches 5874897 AD, `timestamp` only 294276 AD: a fingerprint that casts one to the
    // other fails on a date that the column holds and that its text hashed without trouble.
    let query = QUERY.replace(
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount",
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount, date '300000-01-01' AS valid_to",
    );
    let t = Pg::with_dag(&dag(&query, GATE, ""));
    t.psql("ALTER TABLE analytics.orders_fact ADD COLUMN valid_to date");
    let out = t.p.create("orders", "2026-01-01", "2026-01-01", &[]);
    assert_eq!(
        out.code,
        0,
        "a far-future date fails the try: {}\n{:?}",
        out.stderr,
        t.p.rows("SELECT error FROM task_tries")
    );
    assert_eq!(t.fact(), t.expected(&[1]));
    t.p.run(&[
        "verify",
        "--dag",
        "orders",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(0);
}

/// The gate's duplicate count equals `GROUP BY`'s for keys whose equality is not their bytes:
/// a case-insensitive (nondeterministic) collation, a domain over such a text, `numeric` at
/// different scales, `varchar(n)` and `char(n)`, arrays.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn duplicate_keys_follow_group_by_equality_for_collations_domains_and_scales() {
    let keyed = |key: &str, rows: &str| {
        format!(
            r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "keyed"
warehouse = "dw"
target = "analytics.keyed"
partition_column = "day"
sql = "SELECT t, ct, v, c, n, a, i, :ds::date AS day FROM (VALUES {rows}) v(t, ct, v, c, n, a, i)"
[tasks.gate]
unique_key = [{key}]
"#
        )
    };
    let t = Pg::with_dag(&keyed(r#""t""#, "('a', 'a', 'a', 'a', 1.0, ARRAY[1], 1)"));
    t.psql(
        "CREATE COLLATION analytics.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false); \
         CREATE DOMAIN analytics.ci_text AS text COLLATE analytics.ci; \
         CREATE TABLE analytics.keyed (t text COLLATE analytics.ci, ct analytics.ci_text, v varchar(5) COLLATE analytics.ci, \
           c char(3) COLLATE analytics.ci, n numeric(10, 3), a int[], i int, day date NOT NULL)",
    );
    let r = |t: &str, ct: &str, v: &str, c: &str, n: &str, a: &str, i: i32| {
        format!("('{t}', '{ct}', '{v}', '{c}', {n}, ARRAY[{a}]::int[], {i})")
    };
    let cases: Vec<(&str, String, i64)> = vec![
        // (key, rows, key values occurring more than once by GROUP BY)
        (
            r#""t""#,
            [
                r("a", "a", "a", "a", "1.0", "1", 1),
                r("A", "a", "a", "a", "1.0", "1", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""ct""#,
            [
                r("a", "x", "a", "a", "1.0", "1", 1),
                r("b", "X", "a", "a", "1.0", "1", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""v""#,
            [
                r("a", "a", "ab", "a", "1.0", "1", 1),
                r("b", "a", "AB", "a", "1.0", "1", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""c""#,
            [
                r("a", "a", "a", "q", "1.0", "1", 1),
                r("b", "a", "a", "Q ", "1.0", "1", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""n""#,
            [
                r("a", "a", "a", "a", "1.0", "1", 1),
                r("b", "a", "a", "a", "1.00", "1", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""n", "i""#,
            [
                r("a", "a", "a", "a", "1.0", "1", 1),
                r("b", "a", "a", "a", "1.00", "1", 1),
            ]
            .join(", "),
            1,
        ),
        (
            r#""a""#,
            [
                r("a", "a", "a", "a", "1.0", "1,2", 1),
                r("b", "a", "a", "a", "1.0", "1,2", 2),
            ]
            .join(", "),
            1,
        ),
        (
            r#""t", "i""#,
            [
                r("a", "a", "a", "a", "1.0", "1", 1),
                r("A", "a", "a", "a", "1.0", "1", 1),
            ]
            .join(", "),
            1,
        ),
        (
            r#""t""#,
            [
                r("a", "a", "a", "a", "1.0", "1", 1),
                r("b", "a", "a", "a", "1.0", "1", 2),
            ]
            .join(", "),
            0,
        ),
    ];
    for (key, rows, duplicated) in cases {
        t.p.write("dags/orders.toml", &keyed(key, &rows));
        t.psql("TRUNCATE analytics.keyed");
        let out = t.p.create(
            "orders",
            "2026-01-01",
            "2026-01-01",
            &["--reprocess-behavior", "completed", "--allow-drift"],
        );
        let published = t.psql("SELECT count(*) FROM analytics.keyed");
        if duplicated == 0 {
            assert_eq!(out.code, 0, "{key}: {rows}: {}", out.stderr);
            assert_eq!(published, "2", "{key}: {rows}");
        } else {
            assert_eq!(out.code, 3, "{key}: {rows}: {}", out.stderr);
            out.stderr_has("1 key value occurs more than once");
            assert_eq!(published, "0", "{key}: {rows}");
        }
    }
}

/// A DAG of SQL tasks only runs on one async worker: a `backfill cancel` of two tries in
/// flight at once (their statements waiting on the server) stops both statements and runs the
/// DAG's `on_finish` hook; timeouts with retries and retry delays fire while statements wait.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn one_worker_serves_cancel_timeouts_and_hooks_while_statements_wait() {
    let slow = "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount
FROM raw.orders, pg_sleep(60)
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end";
    let header = |extra: &str| {
        dag(slow, GATE, "").replace(
            "retries = 0\n",
            &format!(
                "max_active_runs = 2\n{extra}\n[notify]\non_finish = \"echo $BACKFILL_STATE $BACKFILL_EXIT_CODE > hook.out\"\n"
            ),
        )
    };
    let t = Pg::with_dag(&header("retries = 0"));
    let running = |t: &Pg| {
        t.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()",
            t.db
        ))
    };
    let mut child = t.p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    );
    crate::support::wait_while_running(
        &t.p,
        "run",
        &mut child,
        "two statements on the server",
        Duration::from_secs(30),
        &|| {
            format!(
                "tries: {:?}\nsessions:\n{}",
                t.p.rows("SELECT id, state, pgid FROM task_tries ORDER BY id"),
                t.psql(&format!(
                    "SELECT pid, state, wait_event_type, wait_event, xact_start IS NOT NULL, left(regexp_replace(query, '\\s+', ' ', 'g'), 120) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
                    t.db
                ))
            )
        },
        || {
            t.p.has_manifest()
                && t.p
                    .count("SELECT count(*) FROM task_tries WHERE state = 'running'")
                    == 2
                && running(&t) == "2"
        },
    );
    let started = std::time::Instant::now();
    t.p.run(&["cancel", "1"]).code(0);
    let out = crate::support::wait_within(&t.p, "run", child, Duration::from_secs(30));
    out.code(130);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    wait_until("the statements to stop", Duration::from_secs(10), || {
        running(&t) == "0"
    });
    assert!(
        t.p.read("hook.out").contains("130"),
        "{}",
        t.p.read("hook.out")
    );
    assert_eq!(t.fact(), "");

    // Timeouts, then a retry after its delay, for both days at once.
    t.p.write(
        "dags/orders.toml",
        &header("retries = 1\nretry_delay = \"1s\"\ntimeout = \"2s\""),
    );
    let started = std::time::Instant::now();
    let child = t.p.spawn(
        "run2",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-03",
            "--to",
            "2026-01-04",
        ],
    );
    let out = crate::support::wait_within(&t.p, "run2", child, Duration::from_secs(60));
    out.code(3);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        t.p.count("SELECT count(*) FROM task_tries"),
        6,
        "two cancelled tries, then two tries of each of two days"
    );
    assert!(
        t.p.read("hook.out").starts_with("failed 3"),
        "{}",
        t.p.read("hook.out")
    );
    wait_until("the statements to stop", Duration::from_secs(10), || {
        running(&t) == "0"
    });
    t.wait_for_killed_sessions();
}

/// A process that found the table of kept versions missing, then waited while another process
/// made it and began tries that move rows into it, does not wait for those tries: under the
/// lock it looks again, and changes nothing on a table that exists.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_kept_table_another_process_just_made_is_used_without_waiting_for_its_tries() {
    let t = Pg::new();
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(0);
    let kept = t.psql(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'kept\\_%'",
    );
    assert!(kept.starts_with("kept_"), "{kept}");
    t.psql(&format!("ALTER TABLE backfill.{kept} RENAME TO kept_aside"));
    t.psql("UPDATE raw.orders SET amount = amount + 1");
    let psql = pg::bin_dir().map_or("psql".into(), |b| b.join("psql"));
    let hold = |sql: &str| {
        std::process::Command::new(&psql)
            .args(["-X", "-q", &t.cluster.url(&t.db), "-c"])
            .arg(sql)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let active = |marker: &str| {
        t.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%{marker}%' AND state = 'active' AND pid <> pg_backend_pid()",
            t.db
        )) == "1"
    };
    // Another process holds the lock under which the table is made...
    let mut maker = hold("BEGIN; SELECT pg_advisory_xact_lock(7262150319); SELECT pg_sleep(600.1)");
    wait_until("the lock to be held", Duration::from_secs(20), || {
        active("pg_sleep(600.1)")
    });
    let mut child = t.p.spawn(
        "run",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
            "--reprocess-behavior",
            "completed",
        ],
    );
    crate::support::wait_while_running(
        &t.p,
        "run",
        &mut child,
        "backfill to wait for the lock",
        Duration::from_secs(30),
        &|| String::new(),
        || {
            t.psql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND wait_event = 'advisory'",
                t.db
            )) == "1"
        },
    );
    // ...makes it, and one of its tries moves rows into it and goes on.
    t.psql(&format!("ALTER TABLE backfill.kept_aside RENAME TO {kept}"));
    let mut try_ = hold(&format!(
        "BEGIN; LOCK TABLE backfill.{kept} IN ROW EXCLUSIVE MODE; SELECT pg_sleep(600.2)"
    ));
    wait_until("the try to hold the table", Duration::from_secs(20), || {
        active("pg_sleep(600.2)")
    });
    t.psql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(600.1)%' AND pid <> pg_backend_pid()",
        t.db
    ));
    let _ = maker.wait();
    let out = crate::support::wait_within(&t.p, "run", child, Duration::from_secs(60));
    t.psql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%pg_sleep(600.2)%' AND pid <> pg_backend_pid()",
        t.db
    ));
    let _ = try_.wait();
    out.code(0);
    assert_eq!(t.fact(), t.expected(&[1]));
    assert_eq!(
        t.psql("SELECT count(*) FROM backfill.versions"),
        "1",
        "the replaced rows were kept"
    );
}

/// The owner keeps its lease while its warehouse does not answer: a rejected try's rollback
/// waits on a blocking thread, never on the async worker where the heartbeat runs (a DAG of SQL
/// tasks has one).
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_rollback_waiting_on_a_frozen_server_session_does_not_stop_the_heartbeat() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use crate::support::{signal, stopped};

    let t = Pg::with_dag(&dag(QUERY, "source_count = \"SELECT 999\"", ""));
    let child = t.p.spawn_with(
        "frozen",
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
        &[("BACKFILL_FAULT", "after-audit:stop")],
    );
    wait_until(
        "the backfill to stop itself after its statement",
        Duration::from_secs(20),
        || stopped(child.id()),
    );
    let session: i32 = t
        .psql(&format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = '{}' AND application_name = 'backfill' AND state = 'idle in transaction'",
            t.db
        ))
        .parse()
        .expect("the try's session, idle in its transaction");
    // Thawed at the end, whatever happens: the cluster is shared.
    struct Thaw(i32);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
        }
    }
    kill(Pid::from_raw(session), Signal::SIGSTOP).unwrap();
    let thaw = Thaw(session);
    signal(&child, Signal::SIGCONT);
    // The gate rejects the output (the source count says 999); the rollback waits on the frozen
    // session while the heartbeat goes on.
    let beat = || t.p.count("SELECT heartbeat_at FROM backfills WHERE id = 1");
    let first = beat();
    wait_until(
        "heartbeats while the rollback waits",
        Duration::from_secs(20),
        || beat() >= first + 1000,
    );
    assert_eq!(
        t.p.rows("SELECT state FROM task_tries"),
        [["running"]],
        "the rollback still waits"
    );
    drop(thaw);
    t.p.wait("frozen", child).code(3).stderr_has("source count");
    assert_eq!(t.fact(), "", "the rejected output was rolled back");
    t.wait_for_killed_sessions();
}

/// The gate's rules of the PostgreSQL tests: the source holds `eu` and `us` orders of 1.5 to
/// 45.0; one check compares with the source, in the warehouse, with a bind parameter.
const RULES: &str = r#"not_null = ["region"]
accepted_values = { region = ["eu", "us"] }
range = { amount = { min = 0, max = 50 } }

[[tasks.gate.checks]]
name = "amounts as in the source"
sql = """
SELECT o.order_id, o.amount, r.amount FROM output o JOIN raw.orders r USING (order_id)
WHERE o.amount <> r.amount AND o.day = :ds ORDER BY o.order_id
"""

[[tasks.gate.checks]]
name = "big orders"
sql = "SELECT order_id, amount FROM output WHERE amount > 44 ORDER BY order_id"
severity = "warn"
"#;

/// Each rule on values rejects with its rows in the try's own transaction (the output read
/// back from the partition it just wrote), a `warn` publishes and is recorded, and readers
/// keep the old partition whenever a rule rejects.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_rules_on_values_judge_the_rows_the_transaction_wrote() {
    let gate = format!("{GATE}\n{RULES}");
    let t = Pg::with_dag(&dag(QUERY, &gate, ""));
    // Day 1 holds order 30 of 45.0: published, with the warning.
    let out = t.p.create("orders", "2026-01-01", "2026-01-03", &[]);
    out.code(0).stderr_has(
        "warning    2026-01-01 task `fact`: check \"big orders\" failed: 1 violation, e.g. (order_id 30, amount 45.0)",
    );
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(
        t.p.rows("SELECT verdict, reasons FROM task_tries ORDER BY id LIMIT 1"),
        [[
            "published",
            "warning: check \"big orders\" failed: 1 violation, e.g. (order_id 30, amount 45.0)"
        ]]
    );
    let before = t.fact();
    let rerun = |reason: &str| {
        let out = t.p.create(
            "orders",
            "2026-01-02",
            "2026-01-02",
            &["--reprocess-behavior", "completed"],
        );
        out.code(3)
            .stderr_has(&format!("task `fact` rejected: {reason}"));
        assert_eq!(t.fact(), before, "the partition is untouched");
        t.wait_for_killed_sessions();
    };
    // Day 2 is orders 1, 4, ..., 28.
    t.psql("UPDATE raw.orders SET region = 'mars' WHERE order_id IN (4, 7)");
    rerun(
        "accepted_values violated: region is not one of 'eu', 'us' in 2 of 10 rows, e.g. (order_id 4, region mars), (order_id 7, region mars)",
    );
    t.psql("UPDATE raw.orders SET region = 'eu' WHERE order_id = 4; UPDATE raw.orders SET region = 'us' WHERE order_id = 7");
    t.psql("UPDATE raw.orders SET amount = -1 WHERE order_id = 10");
    rerun(
        "range violated: amount is outside 0 to 50 in 1 of 10 rows, e.g. (order_id 10, amount -1)",
    );
    t.psql("UPDATE raw.orders SET amount = 15.0 WHERE order_id = 10");
    // A query that loses a region: the target allows it, the rule does not.
    t.psql("ALTER TABLE analytics.orders_fact ALTER region DROP NOT NULL");
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(
            &QUERY.replace(
                "region, amount",
                "CASE WHEN order_id = 13 THEN NULL ELSE region END AS region, amount",
            ),
            &gate,
            "",
        ),
    )
    .unwrap();
    rerun("not_null violated: region is NULL in 1 of 10 rows, e.g. (order_id 13)");
    // A query that rounds: the check that joins the source finds the odd orders' halves.
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(
            &QUERY.replace("region, amount", "region, round(amount) AS amount"),
            &gate,
            "",
        ),
    )
    .unwrap();
    rerun(
        "check \"amounts as in the source\" failed: 5 violations, e.g. (order_id 1, amount 2, amount 1.5), (order_id 7, amount 11, amount 10.5), (order_id 13, amount 20, amount 19.5), (order_id 19, amount 29, amount 28.5), (order_id 25, amount 38, amount 37.5)",
    );
    // Staged, the output goes to a table of its own: judged the same, never staged.
    let out = t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "completed", "--stage"],
    );
    out.code(3)
        .stderr_has("check \"amounts as in the source\" failed: 5 violations");
    assert_eq!(
        t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'staged%'"),
        "0"
    );
    // Back as it was, the same rerun publishes.
    std::fs::write(t.p.path("dags/orders.toml"), dag(QUERY, &gate, "")).unwrap();
    t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    assert_eq!(t.fact(), before);
}

/// `dags validate` prepares each rule against the server, as it will run: a check's mistake,
/// and a bound whose type does not fit its column, are named at their place; a check that
/// fails while it runs fails the try, which never publishes.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_rules_are_prepared_before_anything_runs_and_an_error_fails_the_try() {
    let bad = "\n[[tasks.gate.checks]]\nname = \"typo\"\nsql = \"SELECT order_id FROM output WHERE amont > 0\"\n";
    let toml = dag(QUERY, &format!("{GATE}\n{bad}"), "");
    let t = Pg::with_dag(&toml);
    let line = toml.lines().position(|l| l == "name = \"typo\"").unwrap() + 2;
    t.p.run(&["dags", "validate"]).code(2).stderr_has(&format!(
        "dags/orders.toml:{line}:7: task `fact`: check \"typo\" does not prepare: ERROR: column \"amont\" does not exist"
    ));
    let toml = dag(
        QUERY,
        &format!("{GATE}\nrange = {{ amount = {{ min = \"none\" }} }}\n"),
        "",
    );
    std::fs::write(t.p.path("dags/orders.toml"), &toml).unwrap();
    let line = toml
        .lines()
        .position(|l| l.starts_with("range = "))
        .unwrap()
        + 1;
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(2)
        .stderr_has(&format!("dags/orders.toml:{line}:11: task `fact`: rule `range` does not prepare: ERROR: invalid input syntax for type numeric: \"none\""));
    assert!(!t.p.has_manifest(), "a refused backfill recorded nothing");
    // Division by zero happens only when the check runs.
    let failing = "\n[[tasks.gate.checks]]\nname = \"divides\"\nsql = \"SELECT order_id FROM output WHERE 1 / (order_id - order_id) = 0\"\n";
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(QUERY, &format!("{GATE}\n{failing}"), ""),
    )
    .unwrap();
    t.p.create("orders", "2026-01-01", "2026-01-01", &[])
        .code(3)
        .stderr_has("division by zero");
    assert_eq!(t.p.rows("SELECT state FROM task_tries"), [["failed"]]);
    assert_eq!(t.fact(), "");
    t.wait_for_killed_sessions();
}

/// A check, `source_count`, `source_fingerprint` and the task's `sql` are each one read-only
/// query: what writes, or what could close the statement around it and add its own, is
/// refused by `dags validate` and `create` at its place (exit 2, nothing run, nothing
/// recorded), and the warehouse keeps every row.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_query_that_writes_is_refused_before_anything_runs() {
    let t = Pg::new();
    t.psql("CREATE TABLE raw.victim (id int); INSERT INTO raw.victim SELECT generate_series(1, 5)");
    let check = |sql: &str, severity: &str| {
        format!(
            "{GATE}\n[[tasks.gate.checks]]\nname = \"hostile\"\nseverity = \"{severity}\"\nsql = \"\"\"\n{sql}\n\"\"\"\n"
        )
    };
    let hostile: [(String, String, &str); 6] = [
        (
            QUERY.into(),
            check("DELETE FROM raw.victim RETURNING *", "warn"),
            "check \"hostile\" of task `fact` must be one read-only query (a SELECT, or WITH ... SELECT): `DELETE` is a statement, not a query",
        ),
        (
            QUERY.into(),
            check("UPDATE analytics.orders_fact SET region = 'hacked' WHERE day <> :ds RETURNING *", "warn"),
            "check \"hostile\" of task `fact` must be one read-only query (a SELECT, or WITH ... SELECT): `UPDATE` is a statement, not a query",
        ),
        (
            QUERY.into(),
            check("SELECT 1 WHERE false), evil AS (DELETE FROM raw.victim RETURNING 1), pad AS (SELECT 1", "error"),
            "check \"hostile\" of task `fact` cannot be read as one PostgreSQL query (Expected: end of statement, found: ))",
        ),
        (
            QUERY.into(),
            GATE.replace(
                "source_count = \"SELECT count(*) FROM raw.orders WHERE",
                "source_count = \"WITH d AS (DELETE FROM raw.victim RETURNING *) SELECT count(*) FROM raw.orders WHERE",
            ),
            "key `source_count` must be one read-only query (a SELECT, or WITH ... SELECT): `DELETE` inside it writes to the warehouse",
        ),
        (
            QUERY.into(),
            format!("{GATE}\nsource_fingerprint = \"SELECT count(*) FROM raw.victim; DELETE FROM raw.victim\""),
            "key `source_fingerprint` must be one read-only query (a SELECT, or WITH ... SELECT): it holds 2 statements",
        ),
        (
            format!("WITH gone AS (DELETE FROM raw.victim RETURNING id)\n{QUERY}"),
            GATE.into(),
            "key `sql` must be one read-only query (a SELECT, or WITH ... SELECT): `DELETE` inside it writes to the warehouse",
        ),
    ];
    for (query, gate, said) in hostile {
        let toml = dag(&query, &gate, "");
        std::fs::write(t.p.path("dags/orders.toml"), &toml).unwrap();
        let out = t.p.run(&["dags", "validate"]);
        out.code(2).stderr_has(said).stderr_has("dags/orders.toml:");
        t.p.create("orders", "2026-01-01", "2026-01-03", &[])
            .code(2)
            .stderr_has(said);
        assert!(!t.p.has_manifest(), "a refused backfill recorded nothing");
        assert_eq!(t.psql("SELECT count(*) FROM raw.victim"), "5", "{said}");
        assert_eq!(t.fact(), "", "{said}");
    }
    // Where the refusal points: the line and column of `DELETE` in the source_count.
    let toml = dag(
        QUERY,
        &GATE.replace(
            "source_count = \"SELECT count(*) FROM raw.orders WHERE",
            "source_count = \"WITH d AS (DELETE FROM raw.victim RETURNING *) SELECT count(*) FROM raw.orders WHERE",
        ),
        "",
    );
    std::fs::write(t.p.path("dags/orders.toml"), &toml).unwrap();
    let line = toml
        .lines()
        .position(|l| l.starts_with("source_count"))
        .unwrap()
        + 1;
    t.p.run(&["dags", "validate"]).code(2).stderr_has(&format!(
        "error: dags/orders.toml:{line}:28: key `source_count` must be one read-only query"
    ));
}

/// A rule the gate was given is named by the gate, as on SQLite, before the target's own
/// constraint that refuses the same rows; NaN and the infinities are outside a numeric range
/// unless the rule allows them.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_gate_names_its_own_rules_before_the_targets_constraints_and_nan_is_out_of_range() {
    let t = Pg::new();
    let write = |query: &str, rules: &str| {
        std::fs::write(
            t.p.path("dags/orders.toml"),
            dag(query, &format!("{GATE}\n{rules}"), ""),
        )
        .unwrap();
    };
    // The target's region is NOT NULL: the gate's not_null names the rows first.
    let nulls = QUERY.replace(
        "region, amount",
        "CASE WHEN order_id = 13 THEN NULL ELSE region END AS region, amount",
    );
    write(&nulls, "not_null = [\"region\"]\n");
    t.p.create("orders", "2026-01-02", "2026-01-02", &[])
        .code(3)
        .stderr_has("task `fact` rejected: not_null violated: region is NULL in 1 of 10 rows, e.g. (order_id 13)");
    assert_eq!(t.fact(), "");
    // Without the rule, the target's constraint is what refuses it.
    write(&nulls, "");
    t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "failed"],
    )
    .code(3)
    .stderr_has(
        "task `fact` rejected: target constraint violated: null value in column \"region\"",
    );
    // NaN sorts above every number in PostgreSQL: a `min` alone would let it through.
    let special = QUERY.replace(
        "region, amount",
        "region, CASE order_id WHEN 13 THEN 'NaN'::numeric WHEN 16 THEN 'Infinity'::numeric ELSE amount END AS amount",
    );
    write(&special, "range = { amount = { min = 0 } }\n");
    t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "failed"],
    )
    .code(3)
    .stderr_has("task `fact` rejected: range violated: amount is below 0 in 2 of 10 rows, e.g. (order_id 13, amount NaN), (order_id 16, amount Infinity)");
    assert_eq!(t.fact(), "");
    write(
        &special,
        "range = { amount = { min = 0, allow_non_finite = true } }\n",
    );
    t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "failed"],
    )
    .code(0);
    assert_eq!(
        t.psql(
            "SELECT amount FROM analytics.orders_fact WHERE order_id IN (13, 16) ORDER BY order_id"
        ),
        "NaN\nInfinity"
    );
    t.wait_for_killed_sessions();
}

/// What a check executes is undone before the publish, and a check runs once per try: a
/// function of the user's that deletes rows and counts its calls (a sequence, which no
/// rollback undoes) is let through by the parser, and neither a `warn` check that publishes
/// nor an `error` check that rejects leaves its delete behind.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_check_runs_once_and_nothing_it_executes_survives() {
    let t = Pg::new();
    t.psql(
        "CREATE TABLE raw.victim (id int); INSERT INTO raw.victim SELECT generate_series(1, 5);
         CREATE SEQUENCE public.calls;
         CREATE FUNCTION public.sneaky() RETURNS SETOF int LANGUAGE sql AS $$
           DELETE FROM raw.victim; UPDATE analytics.orders_fact SET region = 'hacked';
           SELECT nextval('public.calls')::int $$",
    );
    let check = |severity: &str| {
        format!(
            "{GATE}\n[[tasks.gate.checks]]\nname = \"sneaky\"\nseverity = \"{severity}\"\nsql = \"SELECT s AS call FROM public.sneaky() s\"\n"
        )
    };
    std::fs::write(t.p.path("dags/orders.toml"), dag(QUERY, &check("warn"), "")).unwrap();
    t.p.run(&["dags", "validate"]).code(0);
    let out = t.p.create("orders", "2026-01-01", "2026-01-03", &[]);
    out.code(0)
        .stderr_has("check \"sneaky\" failed: 1 violation, e.g. (call ");
    assert_eq!(
        t.fact(),
        t.expected(&[1, 2, 3]),
        "published as the query made it"
    );
    assert_eq!(t.psql("SELECT count(*) FROM raw.victim"), "5");
    assert_eq!(
        t.psql("SELECT last_value FROM public.calls"),
        "3",
        "one call a try, three tries"
    );
    // At `error`, the check's rows reject the rerun; the partition keeps its rows.
    std::fs::write(
        t.p.path("dags/orders.toml"),
        dag(QUERY, &check("error"), ""),
    )
    .unwrap();
    t.p.create(
        "orders",
        "2026-01-02",
        "2026-01-02",
        &["--reprocess-behavior", "completed"],
    )
    .code(3)
    .stderr_has("task `fact` rejected: check \"sneaky\" failed: 1 violation, e.g. (call 4)");
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(t.psql("SELECT count(*) FROM raw.victim"), "5");
    assert_eq!(t.psql("SELECT last_value FROM public.calls"), "4");
    t.wait_for_killed_sessions();
}

/// A batch's query over three days: only the range, as a batch binds it (`:ds` would be the
/// first day's). An order listed in `raw.dupes` is output twice (a duplicate key); `raw.bad`
/// makes the query fail on the day of the order it names (a division by zero).
const BATCH_QUERY: &str = "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date AS day, region,
       amount * (1 / CASE WHEN order_id IN (SELECT order_id FROM raw.bad) THEN 0 ELSE 1 END) AS amount
FROM raw.orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
UNION ALL
SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date, region, amount FROM raw.orders
WHERE order_id IN (SELECT order_id FROM raw.dupes)
  AND order_ts >= :data_interval_start AND order_ts < :data_interval_end";

fn batch_pg() -> Pg {
    let t = Pg::with_dag(
        &dag(BATCH_QUERY, GATE, "").replace("retries = 0\n", "retries = 0\nbatch_size = 3\n"),
    );
    t.psql("CREATE TABLE raw.dupes (order_id int); CREATE TABLE raw.bad (order_id int)");
    t
}

/// Every try log of the project, one after the other.
fn all_logs(t: &Pg) -> String {
    std::fs::read_dir(t.p.path(".backfill/logs/orders/fact"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect()
}

/// Batch tables left in the warehouse.
fn batch_tables(t: &Pg) -> String {
    t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'batch\\_%'")
}

fn latest_states(t: &Pg) -> Vec<String> {
    t.p.rows(
        "SELECT r.state FROM runs r JOIN (SELECT MAX(id) id FROM runs GROUP BY interval_start) m
         ON m.id = r.id ORDER BY r.interval_start",
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect()
}

/// One query for three days, and one verdict each: a day with a duplicate key is rejected alone
/// and keeps what it had, its neighbours publish; the batch's table is gone at the end.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_batch_publishes_each_day_on_its_own_and_a_poisoned_day_is_rejected_alone() {
    let t = batch_pg();
    // Newest first: the batch's rows still go to their own days.
    t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["-q", "--run-backwards"],
    )
    .code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(latest_states(&t), ["succeeded"; 3]);
    assert_eq!(batch_tables(&t), "0");
    let logs = all_logs(&t);
    assert_eq!(
        logs.matches("computed the batch of 3 intervals [2026-01-01T00:00:00Z, 2026-01-04T00:00:00Z) with one query").count(),
        1,
        "{logs}"
    );
    assert_eq!(logs.matches("took interval").count(), 3, "{logs}");
    // Order 4 is of 2026-01-02.
    t.psql("INSERT INTO raw.dupes VALUES (4); UPDATE raw.orders SET amount = amount + 1");
    let out = t.p.create(
        "orders",
        "2026-01-01",
        "2026-01-03",
        &["--reprocess-behavior", "completed"],
    );
    out.code(3);
    assert_eq!(latest_states(&t), ["succeeded", "rejected", "succeeded"]);
    let now = t.psql(
        "SELECT order_id, (order_ts AT TIME ZONE 'UTC')::date, region, amount - CASE WHEN (order_ts AT TIME ZONE 'UTC')::date = '2026-01-02' THEN 1 ELSE 0 END FROM raw.orders ORDER BY order_id",
    );
    assert_eq!(
        t.fact(),
        now,
        "days 1 and 3 have the new amounts, day 2 its old ones"
    );
    assert_eq!(batch_tables(&t), "0");
    t.wait_for_killed_sessions();
}

/// A query that fails on one day's data only: the batch is split, that day fails alone; and a
/// kill in the middle of a batch is resumed with each day published once, the batch's table
/// dropped by the recovery.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_failing_batch_is_split_and_a_killed_one_is_resumed_and_swept() {
    let t = batch_pg();
    // Order 5 is of 2026-01-03.
    t.psql("INSERT INTO raw.bad VALUES (5)");
    let out = t.p.create("orders", "2026-01-01", "2026-01-03", &[]);
    out.code(3);
    out.stderr_has("division by zero");
    assert_eq!(latest_states(&t), ["succeeded", "succeeded", "failed"]);
    // Split in [1, 2] and [3]: the first half was computed with one query.
    let logs = all_logs(&t);
    assert!(
        logs.contains("computed the batch of 2 intervals [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) with one query"),
        "{logs}"
    );
    assert_eq!(t.fact(), t.expected(&[1, 2]));
    assert_eq!(batch_tables(&t), "0");

    t.psql("DELETE FROM raw.bad");
    let crashed = t.p.run_with(
        &[
            "create",
            "--dag",
            "orders",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--reprocess-behavior",
            "completed",
        ],
        &[("BACKFILL_FAULT", "after-publish@2")],
    );
    assert_eq!(crashed.code, -1, "aborted: {}", crashed.stderr);
    t.wait_for_killed_sessions();
    assert_eq!(batch_tables(&t), "1", "the killed process's batch table");
    t.p.run(&["resume", "2", "-q"]).code(0);
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(latest_states(&t), ["succeeded"; 3]);
    assert_eq!(
        t.p.count(
            "SELECT COUNT(*) FROM task_tries t JOIN runs r ON r.id = t.run_id WHERE r.backfill_id = 2 AND t.state = 'succeeded'"
        ),
        3,
        "each day of the second backfill succeeded once"
    );
    assert_eq!(batch_tables(&t), "0");
}

/// `[tasks.ready]` asks the warehouse: a day without orders yet is not ready (PostgreSQL's
/// `false`), the days with orders run, and the next backfill runs the day once orders landed.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn readiness_is_asked_of_the_warehouse() {
    let t = Pg::with_dag(&format!(
        "{}\n[tasks.ready]\nsql = \"SELECT count(*) > 0 FROM raw.orders WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end\"\n",
        dag(QUERY, GATE, "")
    ));
    t.p.create("orders", "2026-01-01", "2026-01-04", &[])
        .code(0)
        .stderr_has("skipped    2026-01-04 (not ready)");
    assert_eq!(t.fact(), t.expected(&[1, 2, 3]));
    assert_eq!(
        t.p.rows("SELECT state, answer FROM readiness ORDER BY interval_start"),
        [
            ["ready", "true"],
            ["ready", "true"],
            ["ready", "true"],
            ["not ready", "false"]
        ]
    );
    t.psql("INSERT INTO raw.orders VALUES (31, '2026-01-04 10:00+00', 'eu', 7)");
    t.p.create("orders", "2026-01-01", "2026-01-04", &[])
        .code(0)
        .stderr_has("1 to run, 3 skipped");
    assert_eq!(t.fact(), t.expected(&[1, 2, 3, 4]));
}
