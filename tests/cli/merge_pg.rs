//! `write = "merge"` on a PostgreSQL warehouse: the real binary against a real server that the
//! tests start themselves (see `tests/pg`), ignored on a machine without the server binaries (a
//! failure under CI).
//!
//! The target has a surrogate key (`sid bigserial PRIMARY KEY`), the business key as a unique
//! constraint (`id`), and a column the query never returns (`first_seen_at DEFAULT now()`):
//! what a merge must leave alone.

use std::time::Duration;

use crate::pg;
use crate::support::{Project, wait_until};

const SCHEMA: &str = "
CREATE SCHEMA raw;
CREATE SCHEMA dw;
CREATE TABLE raw.customers (id int PRIMARY KEY, day date NOT NULL, name text NOT NULL, score numeric);
CREATE TABLE dw.customers (sid bigserial PRIMARY KEY, id int NOT NULL UNIQUE, day date NOT NULL,
  name text NOT NULL, score numeric, first_seen_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX customers_day ON dw.customers (day);
INSERT INTO raw.customers VALUES
  (1, '2026-01-01', 'ann', 1.5), (2, '2026-01-01', 'bob', 2), (3, '2026-01-01', 'cy', NULL),
  (4, '2026-01-02', 'dee', 4), (5, '2026-01-02', 'eve', 5);
";

const QUERY: &str = "SELECT id, day, name, score FROM raw.customers WHERE day = :ds::date";

/// The gate every test starts from: the business key, and no drift check in the way of rows
/// that come and go.
const GATE: &str = "unique_key = [\"id\"]\ntolerance = 1.0";

/// The DAG `customers`: a merge task whose task table ends with `extra`, with `gate`.
fn dag(gate: &str, extra: &str) -> String {
    format!(
        r#"schedule = "@daily"
retries = 0

[[tasks]]
id = "dim"
warehouse = "dw"
target = "dw.customers"
partition_column = "day"
write = "merge"
sql = "{QUERY}"
{extra}
[tasks.gate]
{gate}
"#
    )
}

/// A project whose warehouse `dw` is a fresh database of the shared cluster.
struct Mg {
    p: Project,
    db: String,
    cluster: &'static pg::Cluster,
}

impl Mg {
    fn new(dag_toml: &str) -> Self {
        Self::set_up(dag_toml, false)
    }

    /// With the manifest in the warehouse's own database.
    fn one_database(dag_toml: &str) -> Self {
        Self::set_up(dag_toml, true)
    }

    fn set_up(dag_toml: &str, one_database: bool) -> Self {
        let cluster = pg::shared();
        let db = cluster.create_db();
        cluster.psql(&db, SCHEMA);
        let p = Project::new();
        let p = if one_database { p.manifest_in(&db) } else { p };
        p.write(
            "backfill.toml",
            &format!(
                "lease_timeout = \"30s\"\n\n[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}?sslmode=disable\"\n",
                cluster.url(&db)
            ),
        );
        p.write("dags/customers.toml", dag_toml);
        Self { p, db, cluster }
    }

    fn psql(&self, sql: &str) -> String {
        self.cluster.psql(&self.db, sql)
    }

    /// The target's rows, one line each: `sid|id|day|name|score`.
    fn rows(&self) -> String {
        self.psql("SELECT sid, id, day, name, score FROM dw.customers ORDER BY id")
    }

    /// When each row of the target was first seen.
    fn first_seen(&self) -> String {
        self.psql("SELECT id, first_seen_at FROM dw.customers ORDER BY id")
    }

    /// `create` of the days `from` to `to` of January 2026.
    fn run(&self, from: u32, to: u32, extra: &[&str]) -> crate::support::Out {
        self.p.create(
            "customers",
            &format!("2026-01-{from:02}"),
            &format!("2026-01-{to:02}"),
            extra,
        )
    }

    /// `rollback` of the day `day` of January 2026.
    fn rollback(&self, day: u32) -> crate::support::Out {
        let day = format!("2026-01-{day:02}");
        self.p.run(&[
            "rollback",
            "--dag",
            "customers",
            "--from",
            &day,
            "--to",
            &day,
        ])
    }

    /// [`Mg::run`] of partitions already published.
    fn rerun(&self, from: u32, to: u32) -> crate::support::Out {
        self.run(from, to, &["--reprocess-behavior", "completed"])
    }

    /// Per try, in order: state, rows, then the rows inserted, updated, deleted and unchanged.
    fn tries(&self) -> Vec<Vec<String>> {
        self.p.rows(
            "SELECT state, rows, rows_inserted, rows_updated, rows_deleted, rows_unchanged \
             FROM task_tries ORDER BY id",
        )
    }

    /// The last try's [`Mg::tries`] row.
    fn last_try(&self) -> Vec<String> {
        self.tries().pop().expect("a try")
    }

    /// The target's tuples inserted, updated and deleted so far, as the server counts them,
    /// once every session of the binary has ended (a session reports its counts as it ends).
    fn writes(&self) -> String {
        wait_until(
            "the sessions of the binary to end",
            Duration::from_secs(20),
            || {
                self.psql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                ) == "0"
            },
        );
        self.psql(
            "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables \
             WHERE relid = 'dw.customers'::regclass",
        )
    }
}

/// A try's [`Mg::tries`] row.
fn row(state: &str, rows: i64, [i, u, d, n]: [i64; 4]) -> Vec<String> {
    [state.to_string(), rows.to_string()]
        .into_iter()
        .chain([i, u, d, n].map(|v| v.to_string()))
        .collect()
}

/// A rejected try's [`Mg::tries`] row: a merge that did not happen records no counts.
fn rejected(rows: i64) -> Vec<String> {
    ["rejected".to_string(), rows.to_string()]
        .into_iter()
        .chain(["NULL"; 4].map(String::from))
        .collect()
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_merge_writes_only_what_differs_and_surrogate_ids_survive_reruns() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 2, &[]).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|1.5\n2|2|2026-01-01|bob|2\n3|3|2026-01-01|cy|\n\
         4|4|2026-01-02|dee|4\n5|5|2026-01-02|eve|5"
    );
    assert_eq!(
        t.tries(),
        [
            row("succeeded", 3, [3, 0, 0, 0]),
            row("succeeded", 2, [2, 0, 0, 0])
        ]
    );
    let seen = t.first_seen();
    // Rerun 1: bob's name changes, cy's score becomes known, ann leaves, fay arrives.
    t.psql(
        "UPDATE raw.customers SET name = 'Bob' WHERE id = 2; \
         UPDATE raw.customers SET score = 3 WHERE id = 3; \
         DELETE FROM raw.customers WHERE id = 1; \
         INSERT INTO raw.customers VALUES (6, '2026-01-01', 'fay', 6)",
    );
    t.rerun(1, 2).code(0);
    assert_eq!(
        t.rows(),
        "2|2|2026-01-01|Bob|2\n3|3|2026-01-01|cy|3\n4|4|2026-01-02|dee|4\n\
         5|5|2026-01-02|eve|5\n6|6|2026-01-01|fay|6",
        "the surrogate ids of the rows that stay are theirs; the new key takes the next one"
    );
    assert_eq!(
        t.tries()[2..],
        [
            row("succeeded", 3, [1, 2, 1, 0]),
            row("succeeded", 2, [0, 0, 0, 2])
        ]
    );
    // Rerun 2: the same number written with another scale is another value (what a
    // fingerprint hashes), so it is updated; nothing else moves.
    t.psql("UPDATE raw.customers SET score = 2.0 WHERE id = 2");
    t.rerun(1, 2).code(0);
    assert_eq!(
        t.tries()[4..],
        [
            row("succeeded", 3, [0, 1, 0, 2]),
            row("succeeded", 2, [0, 0, 0, 2])
        ]
    );
    // Rerun 3: unchanged.
    t.rerun(1, 2).code(0);
    assert_eq!(
        t.tries()[6..],
        [
            row("succeeded", 3, [0, 0, 0, 3]),
            row("succeeded", 2, [0, 0, 0, 2])
        ]
    );
    assert_eq!(
        t.rows(),
        "2|2|2026-01-01|Bob|2.0\n3|3|2026-01-01|cy|3\n4|4|2026-01-02|dee|4\n\
         5|5|2026-01-02|eve|5\n6|6|2026-01-01|fay|6"
    );
    // Three reruns on, the rows that were there first still have the time they were first
    // seen; only fay's is new.
    let now = t.first_seen();
    let without = |text: &str, id: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with(&format!("{id}|")))
            .map(String::from)
            .collect()
    };
    assert_eq!(without(&now, "6"), without(&seen, "1"));
    // The verdicts of the publishes are booked with their counts, for a recovery to find.
    assert_eq!(
        t.psql(
            "SELECT judged::json -> 'merged' FROM backfill.publishes ORDER BY try_id DESC LIMIT 2"
        ),
        "[0,0,0,2]\n[0,0,0,3]"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_unchanged_rerun_writes_no_row_of_the_target() {
    // Kept versions too: their copy goes to a table of their own.
    let t = Mg::new(&dag(GATE, "keep_versions = 2"));
    t.run(1, 2, &[]).code(0);
    assert_eq!(t.writes(), "5|0|0");
    t.rerun(1, 2).code(0);
    assert_eq!(t.writes(), "5|0|0", "an unchanged rerun writes nothing");
    assert_eq!(t.last_try(), row("succeeded", 2, [0, 0, 0, 2]));
    // One changed row is one tuple updated, and only that.
    t.psql("UPDATE raw.customers SET name = 'Eve' WHERE id = 5");
    t.rerun(1, 2).code(0);
    assert_eq!(t.writes(), "5|1|0");
    t.rerun(1, 2).code(0);
    assert_eq!(t.writes(), "5|1|0");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_deleted_key_that_another_table_references_is_rejected_and_nothing_published() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 1, &[]).code(0);
    // Orders reference customers 1 (checked at once) and 2 (checked at commit).
    t.psql(
        "CREATE TABLE dw.orders (order_id int PRIMARY KEY, customer_id int REFERENCES dw.customers (id));
         CREATE TABLE dw.invoices (invoice_id int PRIMARY KEY, customer_id int
           REFERENCES dw.customers (id) DEFERRABLE INITIALLY DEFERRED);
         INSERT INTO dw.orders VALUES (10, 1);
         INSERT INTO dw.invoices VALUES (20, 2);",
    );
    let before = t.rows();
    // Customer 1 leaves the source: the merge would delete a key an order references.
    t.psql("DELETE FROM raw.customers WHERE id = 1");
    t.rerun(1, 1).code(3).stderr_has(
        "target constraint violated: update or delete on table \"customers\" violates foreign key constraint \"orders_customer_id_fkey\" on table \"orders\"",
    );
    assert_eq!(t.rows(), before, "nothing was published");
    assert_eq!(t.last_try(), rejected(2));
    // Customer 2 leaves instead: its invoice's constraint, deferred, refuses it all the same.
    t.psql("INSERT INTO raw.customers VALUES (1, '2026-01-01', 'ann', 1.5); DELETE FROM raw.customers WHERE id = 2");
    t.rerun(1, 1).code(3).stderr_has(
        "violates foreign key constraint \"invoices_customer_id_fkey\" on table \"invoices\"",
    );
    assert_eq!(t.rows(), before);
    assert_eq!(t.last_try(), rejected(2));
    // Both stay, one of them changed; customer 3, whom nothing references, leaves.
    t.psql(
        "INSERT INTO raw.customers VALUES (2, '2026-01-01', 'Bob', 2); \
         UPDATE raw.customers SET score = 9 WHERE id = 1; DELETE FROM raw.customers WHERE id = 3",
    );
    t.rerun(1, 1).code(0);
    assert_eq!(t.rows(), "1|1|2026-01-01|ann|9\n2|2|2026-01-01|Bob|2");
    assert_eq!(t.last_try(), row("succeeded", 2, [0, 2, 1, 0]));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_key_that_drops_out_is_deleted_or_kept_with_on_missing_keep() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 1, &[]).code(0);
    t.psql("DELETE FROM raw.customers WHERE id = 2");
    t.rerun(1, 1).code(0);
    assert_eq!(t.rows(), "1|1|2026-01-01|ann|1.5\n3|3|2026-01-01|cy|");
    assert_eq!(t.last_try(), row("succeeded", 2, [0, 0, 1, 2]));
    // A change set: the source now holds only what changed.
    t.p.write("dags/customers.toml", &dag(GATE, "on_missing = \"keep\""));
    t.psql(
        "DELETE FROM raw.customers WHERE id = 1; UPDATE raw.customers SET name = 'Cy' WHERE id = 3; \
         INSERT INTO raw.customers VALUES (7, '2026-01-01', 'gus', 7)",
    );
    t.rerun(1, 1).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|1.5\n3|3|2026-01-01|Cy|\n4|7|2026-01-01|gus|7",
        "ann, whom the change set lacks, stays"
    );
    // The partition holds three rows after it: the output's two and the one kept.
    assert_eq!(t.last_try(), row("succeeded", 3, [1, 1, 0, 0]));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_key_moved_across_partitions_is_rejected_by_partition_scope_and_moved_by_table_scope() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 2, &[]).code(0);
    let before = t.rows();
    // The source moves customer 4 from Jan 2 to Jan 1.
    t.psql("UPDATE raw.customers SET day = '2026-01-01' WHERE id = 4");
    t.rerun(1, 1)
        .code(3)
        .stderr_has("rejected 2026-01-01")
        .stderr_has("unique_key violated across partitions: key 4 in partition 2026-01-02, and this output puts it in this interval's partition")
        .stderr_has("set unique_key_scope = \"table\" to move it");
    assert_eq!(t.rows(), before);
    assert_eq!(t.last_try(), rejected(4));
    // With the table's scope the row moves: it keeps its surrogate id, and counts as updated.
    t.p.write(
        "dags/customers.toml",
        &dag(&format!("{GATE}\nunique_key_scope = \"table\""), ""),
    );
    t.rerun(1, 1).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|1.5\n2|2|2026-01-01|bob|2\n3|3|2026-01-01|cy|\n\
         4|4|2026-01-01|dee|4\n5|5|2026-01-02|eve|5"
    );
    assert_eq!(t.last_try(), row("succeeded", 4, [0, 1, 0, 3]));
    // A rollback of Jan 1 moves the row back where it came from, as it was there: it is not
    // lost with Jan 1's version; the rollback publishes Jan 1's own 3 rows.
    t.rollback(1).code(0);
    assert_eq!(t.rows(), before, "rolled back, dee back on Jan 2");
    assert_eq!(t.tries().last().unwrap()[..2], ["succeeded", "3"]);
    // Jan 1's version went, with its copy of the moved row (Jan 2 was published once: it
    // has none).
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "0");
    let kept = t.psql(
        "SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'kept\\_%'",
    );
    assert_eq!(t.psql(&format!("SELECT count(*) FROM {kept}")), "0");
    t.rerun(1, 1).code(0);
    // Day 2 holds only eve now, as its rerun finds.
    t.rerun(2, 2).code(0);
    assert_eq!(t.last_try(), row("succeeded", 1, [0, 0, 0, 1]));
    // A merge looks its keys up in the whole table, whatever the scope: without an index that
    // starts with the key, the dry run says which to create.
    t.psql("ALTER TABLE dw.customers DROP CONSTRAINT customers_id_key");
    t.run(1, 1, &["--dry-run"]).code(2).stderr_has(
        "write = \"merge\" looks the output's keys up in the whole table; create an index for it: CREATE INDEX ON dw.customers (id)",
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn rollback_of_a_merge_puts_back_what_it_updated_or_deleted_and_removes_what_it_inserted() {
    let t = Mg::new(&dag(GATE, "keep_versions = 2"));
    t.run(1, 1, &[]).code(0);
    let first = t.rows();
    let seen = t.first_seen();
    // An order references customer 1, which both versions hold.
    t.psql(
        "CREATE TABLE dw.orders (order_id int PRIMARY KEY, customer_id int REFERENCES dw.customers (id));
         INSERT INTO dw.orders VALUES (10, 1);",
    );
    t.psql(
        "UPDATE raw.customers SET name = 'Ann' WHERE id = 1; DELETE FROM raw.customers WHERE id = 2; \
         INSERT INTO raw.customers VALUES (6, '2026-01-01', 'fay', 6)",
    );
    t.rerun(1, 1).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|Ann|1.5\n3|3|2026-01-01|cy|\n4|6|2026-01-01|fay|6"
    );
    assert_eq!(t.last_try(), row("succeeded", 3, [1, 1, 1, 1]));
    assert_eq!(
        t.psql("SELECT rows FROM backfill.versions"),
        "3",
        "the partition as it was"
    );
    t.rollback(1).code(0);
    // Bob is back with his surrogate id and the time he was first seen, Ann is ann again,
    // fay is gone; the order's customer never left.
    assert_eq!(t.rows(), first);
    assert_eq!(t.first_seen(), seen);
    assert_eq!(t.psql("SELECT count(*) FROM backfill.versions"), "0");
    assert_eq!(t.psql("SELECT customer_id FROM dw.orders"), "1");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_staged_merge_is_promoted_by_merging_and_records_what_the_promote_did() {
    let t = Mg::new(&dag(GATE, "keep_versions = 1"));
    t.run(1, 1, &[]).code(0);
    let first = t.rows();
    t.psql(
        "UPDATE raw.customers SET name = 'Bob' WHERE id = 2; DELETE FROM raw.customers WHERE id = 3; \
         INSERT INTO raw.customers VALUES (6, '2026-01-01', 'fay', 6)",
    );
    t.run(1, 1, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    assert_eq!(t.rows(), first, "staging publishes nothing");
    // The staged try says what its merge would do.
    assert_eq!(t.last_try(), row("succeeded", 3, [1, 1, 1, 1]));
    let writes = t.writes();
    t.p.run(&["promote", "latest"]).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|1.5\n2|2|2026-01-01|Bob|2\n4|6|2026-01-01|fay|6",
        "merged: ann and Bob keep their surrogate ids"
    );
    assert_eq!(
        t.p.rows(
            "SELECT promoted_from, state, rows_inserted, rows_updated, rows_deleted, rows_unchanged \
             FROM task_tries ORDER BY id DESC LIMIT 1"
        ),
        [["2", "succeeded", "1", "1", "1", "1"]]
    );
    // One row inserted, one updated, one deleted: ann was not written.
    let count = |w: &str| -> Vec<i64> { w.split('|').map(|n| n.parse().unwrap()).collect() };
    let (was, now) = (count(&writes), count(&t.writes()));
    assert_eq!(
        [now[0] - was[0], now[1] - was[1], now[2] - was[2]],
        [1, 1, 1]
    );
    assert_eq!(
        t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'staged\\_%'"),
        "0"
    );
    // The promote kept the partition it changed: a rollback puts it back.
    t.rollback(1).code(0);
    assert_eq!(t.rows(), first);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_promote_refuses_a_staged_key_that_another_partition_took_since_it_was_staged() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 1, &[]).code(0);
    // Customer 4 moves to Jan 1 and is staged there, while no partition holds it.
    t.psql("UPDATE raw.customers SET day = '2026-01-01' WHERE id = 4");
    t.run(1, 1, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    assert_eq!(t.last_try(), row("succeeded", 4, [1, 0, 0, 3]));
    // Then Jan 2 gets it.
    t.psql("INSERT INTO dw.customers (id, day, name, score) VALUES (4, '2026-01-02', 'dee', 4)");
    let before = t.rows();
    t.p.run(&["promote", "latest"]).code(3).stderr_has("unique_key violated across partitions: key 4 in partition 2026-01-02, and the staged output puts it in this interval's partition; a merge would update the row of the other partition, so nothing was promoted");
    assert_eq!(t.rows(), before);
    assert_eq!(
        t.p.rows("SELECT staged FROM task_tries WHERE id = 2"),
        [["staged"]],
        "still staged, for a promote once the key is settled"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_output_with_a_null_key_is_rejected_whether_the_target_takes_it_or_not() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 1, &[]).code(0);
    let before = t.rows();
    t.p.write(
        "dags/customers.toml",
        &dag(GATE, "").replace("SELECT id,", "SELECT NULLIF(id, 2) AS id,"),
    );
    // The target's NOT NULL refuses the row: the output is measured apart, and the gate says
    // why in its own words; so it does when the target would take the row.
    for _ in 0..2 {
        t.rerun(1, 1).code(3).stderr_has(
            "unique_key violated: 1 row has a NULL in the key; a merge matches rows by their key and cannot match it",
        );
        assert_eq!(t.rows(), before);
        assert_eq!(t.last_try(), rejected(3));
        t.psql("ALTER TABLE dw.customers ALTER COLUMN id DROP NOT NULL");
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn max_changed_rejects_a_merge_that_would_change_too_much() {
    let t = Mg::new(&dag(&format!("{GATE}\nmax_changed = 0.4"), ""));
    t.run(1, 1, &[]).code(0);
    let before = t.rows();
    // Two of three rows changed (67%): more than 40%.
    t.psql("UPDATE raw.customers SET score = 0 WHERE id IN (1, 2)");
    t.rerun(1, 1).code(3).stderr_has(
        "max_changed: the merge would change 2 of the partition's 3 rows (0 inserted, 2 updated, 0 deleted), 66.7% (at most 40.0%)",
    );
    assert_eq!(t.rows(), before);
    assert_eq!(t.last_try(), rejected(3));
    // One of three (33%) is within it.
    t.psql("UPDATE raw.customers SET score = 2 WHERE id = 2");
    t.rerun(1, 1).code(0);
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|0\n2|2|2026-01-01|bob|2\n3|3|2026-01-01|cy|"
    );
    assert_eq!(t.last_try(), row("succeeded", 3, [0, 1, 0, 2]));
    // Staged within it (ann back to 1.5: one row), then the two others are published changed,
    // one at a time: promoted now, the staged output would change all three.
    t.psql("UPDATE raw.customers SET score = 1.5 WHERE id = 1");
    t.run(1, 1, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    let staged = t.p.rows("SELECT max(backfill_id) FROM runs")[0][0].clone();
    t.psql("UPDATE raw.customers SET score = 0 WHERE id = 1; UPDATE raw.customers SET name = 'bob2' WHERE id = 2");
    t.rerun(1, 1).code(0);
    t.psql("UPDATE raw.customers SET name = 'cy2' WHERE id = 3");
    t.rerun(1, 1).code(0);
    let published = t.rows();
    for atomic in [false, true] {
        let mut args = vec!["promote", staged.as_str()];
        if atomic {
            args.push("--atomic");
        }
        t.p.run(&args).code(3).stderr_has(
            "max_changed: the merge would change 3 of the partition's 3 rows (0 inserted, 3 updated, 0 deleted), 100.0% (at most 40.0%)",
        );
        assert_eq!(t.rows(), published, "atomic: {atomic}");
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn with_the_manifest_in_its_database_a_merge_and_its_promote_record_their_counts() {
    let t = Mg::one_database(&dag(GATE, ""));
    t.run(1, 2, &[]).code(0);
    t.psql(
        "UPDATE raw.customers SET name = 'Bob' WHERE id = 2; DELETE FROM raw.customers WHERE id = 3",
    );
    t.rerun(1, 2).code(0);
    let log =
        t.p.rows("SELECT log_path FROM task_tries ORDER BY id DESC LIMIT 1")[0][0].clone();
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("recorded in the manifest in the same transaction"),
        "the publish recorded itself"
    );
    assert_eq!(
        t.tries(),
        [
            row("succeeded", 3, [3, 0, 0, 0]),
            row("succeeded", 2, [2, 0, 0, 0]),
            row("succeeded", 2, [0, 1, 1, 1]),
            row("succeeded", 2, [0, 0, 0, 2]),
        ]
    );
    assert_eq!(
        t.rows(),
        "1|1|2026-01-01|ann|1.5\n2|2|2026-01-01|Bob|2\n4|4|2026-01-02|dee|4\n5|5|2026-01-02|eve|5"
    );
    // A promote's merge records what it did, in its own transaction too.
    t.psql("INSERT INTO raw.customers VALUES (6, '2026-01-02', 'fay', 6)");
    t.run(2, 2, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    t.p.run(&["promote", "latest"]).code(0);
    assert_eq!(
        t.p.rows(
            "SELECT promoted_from IS NOT NULL, rows, rows_inserted, rows_updated, rows_deleted, \
             rows_unchanged FROM task_tries ORDER BY id DESC LIMIT 1"
        ),
        [["1", "3", "1", "0", "0", "2"]]
    );
    assert_eq!(
        t.psql("SELECT sid, id, name FROM dw.customers WHERE day = '2026-01-02' ORDER BY id"),
        "4|4|dee\n5|5|eve\n6|6|fay"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_merge_killed_at_any_point_of_its_try_is_finished_by_resume_writing_each_row_once() {
    for point in [
        "after-audit",
        "before-source-count",
        "before-publish",
        "before-commit",
        "after-publish",
    ] {
        let t = Mg::new(&dag(GATE, ""));
        t.run(1, 1, &[]).code(0);
        let sids = t.psql("SELECT id, sid FROM dw.customers ORDER BY id");
        t.psql(
            "UPDATE raw.customers SET name = 'bobby' WHERE id = 2;
             DELETE FROM raw.customers WHERE id = 3;
             INSERT INTO raw.customers VALUES (6, '2026-01-01', 'fay', 6);",
        );
        // Committed writes only: a trigger's rows go with its transaction (the server's
        // counters also count the writes of a transaction the kill rolled back).
        t.psql(
            "CREATE TABLE dw.writes (op text, id int);
             CREATE FUNCTION dw.note() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO dw.writes VALUES (lower(TG_OP), CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END);
               RETURN NULL;
             END $$;
             CREATE TRIGGER noted AFTER INSERT OR UPDATE OR DELETE ON dw.customers
               FOR EACH ROW EXECUTE FUNCTION dw.note();",
        );
        let crashed = t.p.run_with(
            &[
                "create",
                "--dag",
                "customers",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-01",
                "--reprocess-behavior",
                "completed",
            ],
            &[("BACKFILL_FAULT", point)],
        );
        assert_ne!(crashed.code, 0, "{point}: {}", crashed.stderr);
        t.p.run(&["resume", "2"]).code(0);
        // One insert, one update, one delete, whatever was redone.
        assert_eq!(
            t.psql("SELECT op, id FROM dw.writes ORDER BY op, id"),
            "delete|3\ninsert|6\nupdate|2",
            "{point}"
        );
        // The kept rows keep their surrogate ids.
        let kept: Vec<&str> = sids.lines().filter(|l| !l.starts_with("3|")).collect();
        assert_eq!(
            t.psql("SELECT id, sid FROM dw.customers WHERE id <> 6 ORDER BY id"),
            kept.join("\n"),
            "{point}"
        );
        assert_eq!(
            t.psql("SELECT id, name FROM dw.customers ORDER BY id"),
            "1|ann\n2|bobby\n6|fay",
            "{point}"
        );
        assert_eq!(
            t.p.rows(
                "SELECT t.rows_inserted, t.rows_updated, t.rows_deleted, t.rows_unchanged
                 FROM task_tries t JOIN runs r ON r.id = t.run_id
                 WHERE r.backfill_id = 2 AND t.state = 'succeeded'"
            ),
            [["1", "1", "1", "1"]],
            "{point}"
        );
        assert_eq!(
            t.p.count(
                "SELECT count(*) FROM task_tries WHERE publishing = TRUE OR state = 'running'"
            ),
            0,
            "{point}"
        );
    }
}

/// The writes of a DAG `dag(GATE, "")` made to replace its partitions instead.
fn replacing(dag_toml: &str) -> String {
    dag_toml.replace("write = \"merge\"\n", "")
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_atomic_promote_killed_at_any_point_publishes_both_days_or_neither_and_resume_finishes_it() {
    for write in ["merge", "replace"] {
        for point in [
            "before-intent",
            "before-publish",
            "before-commit",
            "after-publish",
        ] {
            let what = format!("{write}, killed at {point}");
            let toml = dag(GATE, "");
            let t = Mg::new(&if write == "merge" {
                toml
            } else {
                replacing(&toml)
            });
            t.run(1, 2, &[]).code(0);
            let before = t.rows();
            t.psql(
                "UPDATE raw.customers SET name = 'bobby' WHERE id = 2;
                 DELETE FROM raw.customers WHERE id = 5;
                 INSERT INTO raw.customers VALUES (6, '2026-01-02', 'fay', 6);",
            );
            t.run(1, 2, &["--stage", "--reprocess-behavior", "completed"])
                .code(0);
            let killed =
                t.p.run_with(&["promote", "2", "--atomic"], &[("BACKFILL_FAULT", point)]);
            assert_eq!(
                killed.code, -1,
                "{what}: died of a signal: {}",
                killed.stderr
            );
            if point == "after-publish" {
                assert_ne!(t.rows(), before, "{what}: committed");
            } else {
                assert_eq!(t.rows(), before, "{what}: the server rolled both days back");
            }
            t.p.run(&["resume", "3"]).code(0);
            assert_eq!(
                t.psql("SELECT id, day, name FROM dw.customers ORDER BY id"),
                "1|2026-01-01|ann\n2|2026-01-01|bobby\n3|2026-01-01|cy\n4|2026-01-02|dee\n6|2026-01-02|fay",
                "{what}"
            );
            if write == "merge" {
                // Updated in place: bobby keeps bob's surrogate id.
                assert_eq!(
                    t.psql("SELECT sid FROM dw.customers WHERE id = 2"),
                    "2",
                    "{what}"
                );
            }
            assert_eq!(
                t.p.rows(
                    "SELECT t.promoted_from, t.state FROM task_tries t JOIN runs r ON r.id = t.run_id
                     WHERE r.backfill_id = 3 AND t.state = 'succeeded' ORDER BY t.promoted_from"
                ),
                [["3", "succeeded"], ["4", "succeeded"]],
                "{what}"
            );
            assert_eq!(
                t.p.count(
                    "SELECT count(*) FROM task_tries WHERE publishing = TRUE OR state = 'running'"
                ),
                0,
                "{what}"
            );
            assert_eq!(
                t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'staged\\_%'"),
                "0",
                "{what}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_referenced_key_on_one_day_keeps_an_atomic_promote_from_publishing_either_day() {
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 2, &[]).code(0);
    t.psql(
        "CREATE TABLE dw.orders (order_id int PRIMARY KEY, customer_id int REFERENCES dw.customers (id));
         INSERT INTO dw.orders VALUES (100, 5);",
    );
    let before = t.rows();
    t.psql(
        "UPDATE raw.customers SET name = 'bobby' WHERE id = 2;
         DELETE FROM raw.customers WHERE id = 5;",
    );
    t.run(1, 2, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    t.p.run(&["promote", "2", "--atomic"])
        .code(3)
        .stderr_has("orders");
    assert_eq!(t.rows(), before, "neither day published");
    assert_eq!(
        t.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'staged\\_%'"),
        "2",
        "both staged outputs kept"
    );
    t.psql("DELETE FROM dw.orders");
    t.p.run(&["promote", "2", "--atomic"]).code(0);
    assert_eq!(
        t.psql("SELECT id, name FROM dw.customers ORDER BY id"),
        "1|ann\n2|bobby\n3|cy\n4|dee"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn readers_see_the_old_days_until_an_atomic_promote_commits() {
    use crate::support::{signal, stopped};
    let t = Mg::new(&dag(GATE, ""));
    t.run(1, 2, &[]).code(0);
    let before = t.rows();
    t.psql(
        "UPDATE raw.customers SET name = 'bobby' WHERE id = 2;
         UPDATE raw.customers SET name = 'evie' WHERE id = 5;",
    );
    t.run(1, 2, &["--stage", "--reprocess-behavior", "completed"])
        .code(0);
    // Frozen with both days written in its transaction, not committed.
    let frozen = t.p.spawn_with(
        "promote",
        &["promote", "2", "--atomic"],
        &[("BACKFILL_FAULT", "before-commit:stop")],
    );
    wait_until("the promote to freeze", Duration::from_secs(30), || {
        stopped(frozen.id())
    });
    assert_eq!(t.rows(), before, "a reader sees both old days");
    signal(&frozen, nix::sys::signal::Signal::SIGCONT);
    t.p.wait("promote", frozen).code(0);
    assert_eq!(
        t.psql("SELECT id, name FROM dw.customers ORDER BY id"),
        "1|ann\n2|bobby\n3|cy\n4|dee\n5|evie"
    );
}
