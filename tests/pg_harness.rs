//! The tests' own harness: the throwaway PostgreSQL clusters of `tests/pg` that the Postgres
//! tests run against, and the parts of the machine that some tests need (`tests/parts`).
//!
//! Without server binaries (`PG_BIN`, or Debian's `postgresql` package) the cluster tests are
//! ignored, and say why, except under CI (`CI=true`), where they fail.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use parts::Part;

#[path = "parts/mod.rs"]
mod parts;
#[path = "pg/mod.rs"]
mod pg;

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_shared_cluster_gives_fresh_empty_databases() {
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
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_dropped_database_goes_even_with_a_session_in_it() {
    let cluster = pg::shared();
    let db = cluster.create_db();
    let _held = cluster.session(&db);
    let exists = format!("SELECT count(*) FROM pg_database WHERE datname = '{db}'");
    assert_eq!(cluster.psql("postgres", &exists), "1");
    pg::Cluster::drop_shared_db(db.clone());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cluster.psql("postgres", &exists) != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "{db} is still there a minute after its drop"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn psql_round_trips_and_says_why_it_fails() {
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
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn data_survives_kill_9_and_a_stop() {
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

/// A test that runs without the server binaries (under `CI=true`, with `--include-ignored`)
/// fails and names what is missing: this test binary, run again with an empty `PG_BIN`.
#[test]
fn a_test_run_without_the_server_binaries_fails_and_names_them() {
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_shared_cluster_gives_fresh_empty_databases",
            "--include-ignored",
            "--test-threads",
            "1",
        ])
        .env("PG_BIN", empty.path())
        .env_remove("NEXTEST")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("1 failed"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "no initdb, pg_ctl nor postgres in PG_BIN={}: set PG_BIN to the folder",
            empty.path().display()
        )),
        "{stdout}"
    );
}

/// Whether this build set `cfg(missing = "...")` for `part` (`build.rs`).
fn built_without(part: Part) -> bool {
    match part {
        Part::Postgres => cfg!(missing = "postgres"),
        Part::Chromium => cfg!(missing = "chromium"),
        Part::Chromedriver => cfg!(missing = "chromedriver"),
        Part::Promtool => cfg!(missing = "promtool"),
        Part::Namespaces => cfg!(missing = "namespaces"),
        Part::Script => cfg!(missing = "script"),
        Part::Man => cfg!(missing = "man"),
        Part::Python3 => cfg!(missing = "python3"),
        Part::Nobody => cfg!(missing = "nobody"),
        Part::Tmpfs => cfg!(missing = "tmpfs"),
        Part::Faketime => cfg!(missing = "faketime"),
    }
}

/// The tests this build ignores are those whose parts are missing here, and none under CI. A
/// part installed or removed since the build where `build.rs` does not watch (a folder added to
/// `PATH` since, say) fails this test until the next build looks again.
#[test]
fn the_build_ignores_the_tests_of_exactly_the_parts_missing_here() {
    let missing_here: Vec<&str> = Part::ALL
        .into_iter()
        .filter(|part| !parts::ci() && part.find().is_err())
        .map(Part::name)
        .collect();
    let built_without: Vec<&str> = Part::ALL
        .into_iter()
        .filter(|part| built_without(*part))
        .map(Part::name)
        .collect();
    assert_eq!(
        built_without, missing_here,
        "the tests were built for another machine than this one: `touch build.rs` and build again"
    );
}

#[test]
fn a_program_is_an_executable_file_in_an_absolute_folder_of_path() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for folder in [&a, &b] {
        std::fs::create_dir(folder).unwrap();
    }
    let write = |file: &Path, mode: u32| {
        std::fs::write(file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    write(&a.join("tool"), 0o644);
    write(&b.join("tool"), 0o755);
    std::fs::create_dir(a.join("dir")).unwrap();
    let path = std::env::join_paths([&a, &b]).unwrap();
    assert_eq!(parts::program_in("tool", &path), Some(b.join("tool")));
    assert_eq!(parts::program_in("dir", &path), None);
    assert_eq!(parts::program_in("nothing", &path), None);
    // A relative folder is not looked in: the tests and the build script run elsewhere.
    let relative = std::env::join_paths([Path::new("b")]).unwrap();
    assert_eq!(parts::program_in("true", &relative), None);
}

#[test]
fn postgresql_is_found_in_pg_bin_or_the_newest_complete_debian_folder_and_what_is_missing_is_named()
{
    let dir = tempfile::tempdir().unwrap();
    let bin = |version: &str, programs: &[&str]| {
        let bin = dir.path().join(format!("lib/{version}/bin"));
        std::fs::create_dir_all(&bin).unwrap();
        for program in programs {
            std::fs::write(bin.join(program), "").unwrap();
        }
        bin
    };
    let debian = dir.path().join("lib");
    let missing = format!(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in {}/*/bin and no PG_BIN:",
        debian.display()
    );
    assert!(
        parts::postgres_in(None, &debian)
            .unwrap_err()
            .starts_with(&missing)
    );
    assert!(
        parts::postgres_in(None, &dir.path().join("nowhere"))
            .unwrap_err()
            .starts_with("no PostgreSQL server binaries (initdb, pg_ctl, postgres) in ")
    );
    let v9 = bin("9.6", &parts::SERVER);
    let v15 = bin("15", &parts::SERVER);
    bin("16", &["initdb", "pg_ctl"]);
    bin("main", &parts::SERVER);
    assert_eq!(parts::postgres_in(None, &debian), Ok(v15.clone()));

    // PG_BIN is taken as it is, and what it lacks is named.
    assert_eq!(parts::postgres_in(Some(v9.as_os_str()), &debian), Ok(v9));
    let v16 = dir.path().join("lib/16/bin");
    assert_eq!(
        parts::postgres_in(Some(v16.as_os_str()), &debian).unwrap_err(),
        format!(
            "no postgres in PG_BIN={}: set PG_BIN to the folder of PostgreSQL's initdb, pg_ctl and postgres, or unset it to use Debian's (`sudo apt-get install postgresql`)",
            v16.display()
        )
    );
    let empty = dir.path().join("empty");
    assert!(
        parts::postgres_in(Some(empty.as_os_str()), &debian)
            .unwrap_err()
            .starts_with(&format!(
                "no initdb, pg_ctl nor postgres in PG_BIN={}:",
                empty.display()
            ))
    );
}
