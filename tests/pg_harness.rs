//! The throwaway PostgreSQL clusters of `tests/pg` that the Postgres tests run against.
//!
//! Without server binaries (`PG_BIN`, or Debian's `postgresql` package) the tests are skipped with
//! a message on stderr, except under CI (`CI=true`), where that is a failure.

#[path = "pg/mod.rs"]
mod pg;

const WHAT: &str = "the PostgreSQL harness's tests";

#[test]
fn a_shared_cluster_gives_fresh_empty_databases() {
    if !pg::available(WHAT) {
        return;
    }
    let cluster = pg::shared();
    let first = cluster.create_db();
    let second = cluster.create_db();
    assert_ne!(first, second);
    assert_eq!(
        cluster.url(&first),
        format!("postgresql://postgres@127.0.0.1:{}/{first}", cluster.port())
    );
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(cluster.psql(&first, tables), "0");
    assert_eq!(cluster.psql(&second, tables), "0");

    // What one database gets, the other does not see.
    cluster.psql(
        &first,
        "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2);",
    );
    assert_eq!(cluster.psql(&first, tables), "1");
    assert_eq!(cluster.psql(&second, tables), "0");
    assert_eq!(
        cluster.psql(&first, "SELECT x, x * 10 FROM t ORDER BY x"),
        "1|10\n2|20"
    );
    assert!(cluster.create_db_url().starts_with(&cluster.url("t")));
}

#[test]
fn psql_round_trips_and_says_why_it_fails() {
    if !pg::available(WHAT) {
        return;
    }
    let cluster = pg::shared();
    let db = cluster.create_db();
    assert_eq!(cluster.psql(&db, "SELECT 1"), "1");
    assert_eq!(cluster.psql(&db, "SELECT current_user"), "postgres");
    assert_eq!(cluster.psql(&db, "SHOW server_encoding"), "UTF8");
    assert_eq!(cluster.psql(&db, "SHOW fsync"), "off");

    let failure = std::panic::catch_unwind(|| cluster.psql(&db, "SELECT * FROM missing"))
        .expect_err("a failing statement panics");
    let message = failure.downcast_ref::<String>().expect("a panic message");
    assert!(
        message.contains("relation \"missing\" does not exist"),
        "{message}"
    );
}

#[test]
fn data_survives_kill_9_and_a_stop() {
    if !pg::available(WHAT) {
        return;
    }
    let cluster = pg::Cluster::start();
    assert!(cluster.is_running());
    assert!(cluster.data_dir().join("postmaster.pid").is_file());
    let port = cluster.port();
    let db = cluster.create_db();
    cluster.psql(
        &db,
        "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2), (3);",
    );

    cluster.kill9();
    assert!(!cluster.is_running());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens after kill9"
    );
    cluster.start_again();
    assert_eq!(cluster.port(), port);
    assert_eq!(cluster.psql(&db, "SELECT sum(x) FROM t"), "6");

    cluster.psql(&db, "INSERT INTO t VALUES (4)");
    cluster.restart();
    assert_eq!(cluster.psql(&db, "SELECT sum(x) FROM t"), "10");

    cluster.stop();
    assert!(!cluster.is_running());
    cluster.start_again();
    assert_eq!(cluster.psql(&db, "SELECT count(*) FROM t"), "4");
}

/// A skipped test says so in plain `cargo test` output, which shows nothing a passing test
/// printed with `eprintln!`: this test binary, run again as `cargo test` runs it (output
/// captured) on a machine without server binaries, must print the skip and how to install them.
#[test]
fn a_skip_is_seen_in_plain_cargo_test_output() {
    if std::env::var_os("BACKFILL_HARNESS_INNER").is_some() {
        return;
    }
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_shared_cluster_gives_fresh_empty_databases",
            "--test-threads",
            "1",
        ])
        .env("PG_BIN", empty.path())
        .env("BACKFILL_HARNESS_INNER", "1")
        .env_remove("CI")
        .env_remove("NEXTEST")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "*** SKIPPED {WHAT}: no PostgreSQL server binaries in PG_BIN={}",
            empty.path().display()
        )),
        "the skip is not in the output:\n{stdout}\n{stderr}"
    );
}
