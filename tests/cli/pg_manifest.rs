//! The manifest in PostgreSQL: its schema and version, `manifest copy`, the database's clock,
//! and a server that restarts under a running backfill. (`BACKFILL_TEST_MANIFEST=postgres`
//! runs every other end-to-end test against it too.)

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pg;
use crate::support::{Project, day_unix, signal, stopped, wait_until, wait_within};

/// A task of a few hundred milliseconds that holds a lock per interval: a second try of an
/// interval while one runs is written to overlaps.txt.
pub(crate) const DAG: &str = r#"
schedule = "@daily"
max_active_runs = 2
[[tasks]]
id = "work"
command = '''
mkdir -p locks
exec 9> "locks/{{ ds }}"
if ! flock -n 9; then echo "{{ ds }}" >> overlaps.txt; exit 1; fi
while [ ! -f go ] && [ ! -f "go-{{ ds }}" ]; do sleep 0.05; done
sleep 0.2
'''
"#;

/// Deletes a manifest's whole record (its schema, lock and identity stay), ending with the
/// backfills, to which a `WHERE` may be added.
const EMPTY_BUT_BACKFILLS: &str = "DELETE FROM backfill_manifest.pool_slots;
    DELETE FROM backfill_manifest.published; DELETE FROM backfill_manifest.leases;
    DELETE FROM backfill_manifest.task_tries; DELETE FROM backfill_manifest.runs;
    DELETE FROM backfill_manifest.workers; DELETE FROM backfill_manifest.plan;
    DELETE FROM backfill_manifest.backfills";

pub(crate) fn create_args<'a>(url: &'a str, from: &'a str, to: &'a str) -> Vec<&'a str> {
    vec![
        "--manifest",
        url,
        "create",
        "--dag",
        "c",
        "--from",
        from,
        "--to",
        to,
    ]
}

/// A fresh database on the shared test cluster, and its URL.
fn manifest_database() -> (&'static pg::Cluster, String, String) {
    let cluster = pg::shared();
    let db = cluster.create_db();
    let url = cluster.url(&db);
    (cluster, db, url)
}

/// How many tries are running (0 before the manifest's schema exists).
fn running_tries(cluster: &pg::Cluster, db: &str) -> String {
    if cluster.psql(
        db,
        "SELECT to_regclass('backfill_manifest.task_tries') IS NULL",
    ) == "t"
    {
        return "0".into();
    }
    cluster.psql(
        db,
        "SELECT COUNT(*) FROM backfill_manifest.task_tries WHERE state = 'running'",
    )
}

/// An owner backfilling the first two days of 2026 of DAG `c` ([`DAG`], two at a time) on the
/// manifest at `url` of `cluster`'s database `db`, with the project's `lease_timeout` when given,
/// once both days' tries run (they wait for `go`).
fn owner_running_two_days(
    cluster: &pg::Cluster,
    db: &str,
    url: &str,
    lease_timeout: Option<&str>,
) -> (Project, std::process::Child) {
    let p = Project::new().dag("c", DAG);
    if let Some(lease) = lease_timeout {
        p.write("backfill.toml", &format!("lease_timeout = \"{lease}\"\n"));
    }
    let owner = p.spawn("owner", &create_args(url, "2026-01-01", "2026-01-02"));
    wait_until("two running tries", Duration::from_secs(30), || {
        running_tries(cluster, db) == "2"
    });
    (p, owner)
}

/// A session of the test's `psql` inside an open transaction (see [`wait_for_session`]).
const PSQL_IN_TRANSACTION: &str = "state = 'idle in transaction' AND application_name = 'psql'";

/// A session of the program waiting for a lock another holds (see [`wait_for_session`]).
const BACKFILL_WAITING_FOR_A_LOCK: &str =
    "wait_event_type = 'Lock' AND application_name = 'backfill'";

/// Waits until one session of database `db` is as `condition` says.
fn wait_for_session(cluster: &pg::Cluster, db: &str, what: &str, condition: &str) {
    wait_until(what, Duration::from_secs(30), || {
        cluster.psql(
            db,
            &format!(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND {condition}"
            ),
        ) == "1"
    });
}

/// Lets the first day's try of [`DAG`] end while another session holds the writers' lock, and
/// waits until the writer's transaction for its end waits for that lock.
fn end_first_day_behind_the_lock(cluster: &pg::Cluster, db: &str, p: &Project) {
    std::fs::write(p.path("go-2026-01-01"), "").unwrap();
    wait_for_session(
        cluster,
        db,
        "the writer to wait for the lock",
        BACKFILL_WAITING_FOR_A_LOCK,
    );
}

/// A new role of database `db` that may log in, use the manifest's schema and have `grants` on
/// all its tables: its name, and `url` with it as the user.
fn role_with(
    cluster: &pg::Cluster,
    db: &str,
    url: &str,
    name: &str,
    grants: &str,
) -> (String, String) {
    let role = format!("{name}_{db}");
    cluster.psql(
        db,
        &format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA backfill_manifest TO {role};
             GRANT {grants} ON ALL TABLES IN SCHEMA backfill_manifest TO {role}"
        ),
    );
    let url = url.replace("postgres@", &format!("{role}@"));
    (role, url)
}

/// Each interval's runs, as `(interval_start, runs, succeeded runs)`.
fn runs_per_interval(cluster: &pg::Cluster, db: &str) -> Vec<(i64, i64, i64)> {
    cluster
        .psql(
            db,
            "SELECT interval_start, COUNT(*), COUNT(*) FILTER (WHERE state = 'succeeded')
             FROM backfill_manifest.runs GROUP BY 1 ORDER BY 1",
        )
        .lines()
        .map(|l| {
            let v: Vec<i64> = l.split('|').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect()
}

/// Undoes the native types of the manifest's flags and documents (its schema's version 15), for
/// a test that makes an earlier version of a manifest by hand.
const BEFORE_NATIVE_TYPES: &str = "DROP VIEW backfill_manifest.report_backfills;
DROP INDEX backfill_manifest.task_tries_unfinished;
ALTER TABLE backfill_manifest.backfills
    ALTER COLUMN run_backwards TYPE bigint USING run_backwards::int,
    ALTER COLUMN allow_drift DROP DEFAULT,
    ALTER COLUMN allow_drift TYPE bigint USING allow_drift::int,
    ALTER COLUMN allow_drift SET DEFAULT 0,
    ALTER COLUMN cancel_requested DROP DEFAULT,
    ALTER COLUMN cancel_requested TYPE bigint USING cancel_requested::int,
    ALTER COLUMN cancel_requested SET DEFAULT 0,
    ALTER COLUMN planning DROP DEFAULT,
    ALTER COLUMN planning TYPE bigint USING planning::int,
    ALTER COLUMN planning SET DEFAULT 0,
    ALTER COLUMN conf DROP DEFAULT,
    ALTER COLUMN conf TYPE text,
    ALTER COLUMN conf SET DEFAULT '{}',
    ALTER COLUMN tasks TYPE text,
    ALTER COLUMN definition TYPE text;
ALTER TABLE backfill_manifest.task_tries
    DROP CONSTRAINT task_tries_verdict_check,
    ALTER COLUMN publishing DROP DEFAULT,
    ALTER COLUMN publishing TYPE bigint USING publishing::int,
    ALTER COLUMN publishing SET DEFAULT 0,
    ALTER COLUMN partitions TYPE text,
    ALTER COLUMN inputs TYPE text;
CREATE INDEX task_tries_unfinished ON backfill_manifest.task_tries (run_id)
    WHERE state = 'running' OR publishing = 1;";

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_postgresql_manifest_is_created_on_first_use_and_a_newer_schema_is_refused() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    // An empty database has recorded nothing yet, as a project's missing file.
    p.run(&["--manifest", &url, "list"])
        .code(0)
        .stderr_has("no backfills yet");
    p.run(&create_args(&url, "2026-01-01", "2026-01-03"))
        .code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        latest_schema()
    );
    assert_eq!(
        runs_per_interval(cluster, &db),
        (1..=3).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
    let list = p.run(&["--manifest", &url, "--output", "json", "list"]);
    assert_eq!(list.code(0).json()[0]["state"], "completed");
    // Nothing went to a file: the URL is not a path.
    assert!(!p.manifest_path().exists());
    assert!(!p.path("postgresql:").exists());
    // A manifest of the previous schema version (before backfills recorded their project)
    // gains the project: its backfills are anyone's, the new ones the project's.
    cluster.psql(&db, BEFORE_NATIVE_TYPES);
    cluster.psql(
        &db,
        "DROP VIEW backfill_manifest.report_runs,
           backfill_manifest.report_tries, backfill_manifest.report_published;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN project;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN warehouses;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN owner_start;
         ALTER TABLE backfill_manifest.workers DROP COLUMN start;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_inserted;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_updated;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_deleted;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_unchanged;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN atomic;
         DROP TABLE backfill_manifest.forgets CASCADE;
         DROP TABLE backfill_manifest.pool_starts;
         DROP TABLE backfill_manifest.readiness CASCADE;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN wait_ready;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN require_ready;
         UPDATE backfill_manifest.schema_version SET version = 6",
    );
    p.run(&create_args(&url, "2026-01-04", "2026-01-04"))
        .code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        latest_schema()
    );
    let folder = p.path("backfill.toml");
    let folder = folder.parent().and_then(|d| d.file_name()).unwrap();
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT id || ':' || COALESCE(project, 'NULL') FROM backfill_manifest.backfills ORDER BY id"
        ),
        format!("1:NULL\n2:{}", folder.to_string_lossy())
    );
    // A manifest of schema version 1 (before `backfill join`) is migrated on first use, its
    // history kept.
    cluster.psql(&db, BEFORE_NATIVE_TYPES);
    cluster.psql(
        &db,
        "DROP VIEW backfill_manifest.report_runs,
           backfill_manifest.report_tries, backfill_manifest.report_published;
         DROP INDEX backfill_manifest.runs_in_flight;
         DROP INDEX backfill_manifest.runs_failed;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN runs_before;
         ALTER TABLE backfill_manifest.runs DROP COLUMN worker;
         DROP TABLE backfill_manifest.workers;
         DROP FUNCTION backfill_manifest.publish_refused(bigint);
         ALTER TABLE backfill_manifest.backfills DROP COLUMN definition;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN batch_size;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN batch;
         ALTER TABLE backfill_manifest.leases DROP COLUMN batch_holder;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN project;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN warehouses;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN owner_start;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_inserted;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_updated;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_deleted;
         ALTER TABLE backfill_manifest.task_tries DROP COLUMN rows_unchanged;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN atomic;
         DROP TABLE backfill_manifest.forgets CASCADE;
         DROP TABLE backfill_manifest.pool_starts;
         DROP TABLE backfill_manifest.readiness CASCADE;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN wait_ready;
         ALTER TABLE backfill_manifest.backfills DROP COLUMN require_ready;
         UPDATE backfill_manifest.schema_version SET version = 1",
    );
    p.run(&create_args(&url, "2026-01-05", "2026-01-05"))
        .code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        latest_schema()
    );
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT COUNT(*) FROM backfill_manifest.runs WHERE state = 'succeeded' AND worker IS NULL"
        ),
        "5"
    );
    // A schema written by a newer backfill is refused, by every command, before anything else.
    cluster.psql(
        &db,
        "UPDATE backfill_manifest.schema_version SET version = 99",
    );
    for args in [
        vec!["--manifest", &url, "list"],
        create_args(&url, "2026-01-06", "2026-01-06"),
    ] {
        p.run(&args).code(1).stderr_has(&format!(
            "manifest {url}: schema version 99 is newer than this backfill understands ({}); upgrade backfill",
            latest_schema()
        ));
    }
    assert_eq!(
        cluster.psql(&db, "SELECT COUNT(*) FROM backfill_manifest.backfills"),
        "3"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn manifest_copy_moves_a_sqlite_history_with_its_ids_and_identity() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().sqlite().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    p.create("c", "2026-01-01", "2026-01-03", &[]).code(0);
    p.create(
        "c",
        "2026-01-02",
        "2026-01-05",
        &["--reprocess-behavior", "completed"],
    )
    .code(0);
    let sqlite_show = p.run(&["--output", "json", "show", "2"]);
    let sqlite_runs = p.run(&["runs", "--dag", "c"]);
    let before = p.dump();
    // Refused: a destination that is not a URL, and a source that is not a file.
    p.run(&["manifest", "copy", "--to", "/tmp/elsewhere.db"])
        .code(2)
        .stderr_has("--to: `/tmp/elsewhere.db` is not a PostgreSQL URL");
    p.run(&["--manifest", &url, "manifest", "copy", "--to", &url])
        .code(2)
        .stderr_has("is in PostgreSQL already");
    let copy = p.run(&["--output", "json", "manifest", "copy", "--to", &url]);
    copy.code(0).stderr_has(&format!(
        "copied 2 backfills, 7 runs and 7 tries from {} into {url}",
        p.manifest_path().display()
    ));
    let doc = copy.json();
    assert_eq!(doc["rows"]["backfills"], 2);
    assert_eq!(doc["rows"]["plan"], 7);
    assert_eq!(doc["rows"]["runs"], 7);
    assert_eq!(doc["rows"]["task_tries"], 7);
    assert_eq!(p.dump(), before, "the SQLite manifest is unchanged");
    // The same history, the same ids, the same identity.
    assert_eq!(
        p.run(&["--manifest", &url, "--output", "json", "show", "2"])
            .stdout,
        sqlite_show.stdout
    );
    assert_eq!(
        p.run(&["--manifest", &url, "runs", "--dag", "c"]).stdout,
        sqlite_runs.stdout
    );
    assert_eq!(
        cluster.psql(&db, "SELECT id FROM backfill_manifest.identity"),
        p.rows("SELECT id FROM identity")[0][0]
    );
    // Work goes on there: new ids follow the copied ones, and what succeeded is not run again.
    let next = p.run(&create_args(&url, "2026-01-01", "2026-01-06"));
    next.code(0)
        .stderr_has("backfill 3 of c: 6 intervals, 1 to run, 5 skipped");
    // A second copy would mix two histories.
    p.run(&["manifest", "copy", "--to", &url])
        .code(2)
        .stderr_has("already holds a record (3 rows in backfills); copy into one that holds none");
    // So would one that holds any row of a record, not only backfills.
    cluster.psql(&db, &format!("{EMPTY_BUT_BACKFILLS} WHERE id <> 3"));
    p.run(&["manifest", "copy", "--to", &url])
        .code(2)
        .stderr_has("already holds a record (1 row in backfills)");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_copy_whose_commit_reply_is_lost_after_it_committed_reports_success() {
    // A cluster of its own: its commits wait for a synchronous standby that never comes, for
    // the copy's session only. Such a commit is done locally and waits; ending the session
    // then leaves it committed while its client hears only that the connection closed.
    let own = pg::Cluster::start();
    let db = own.create_db();
    // Every other session (this test's psql too) commits without waiting; set first, while
    // commits do not wait yet.
    own.psql(
        "postgres",
        &format!("ALTER DATABASE {db} SET synchronous_commit = local"),
    );
    own.psql(
        "postgres",
        "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
    );
    own.psql("postgres", "SELECT pg_reload_conf()");
    let local = own.url(&db);
    let waiting = format!("{local}?options=-c%20synchronous_commit%3Don");
    let p = Project::new().sqlite().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    p.create("c", "2026-01-01", "2026-01-03", &[]).code(0);
    // The manifest's schema made first (its commits would wait too), and left empty.
    p.run(&[
        "--manifest",
        &local,
        "create",
        "--dag",
        "c",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(0);
    own.psql(&db, EMPTY_BUT_BACKFILLS);
    let copy = p.spawn("copy", &["manifest", "copy", "--to", &waiting]);
    wait_until("the copy's commit to wait", Duration::from_secs(30), || {
        own.psql(
            &db,
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        ) == "1"
    });
    own.psql(
        &db,
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
    );
    let out = wait_within(&p, "copy", copy, Duration::from_secs(60));
    out.code(0)
        .stderr_has("copied 1 backfill, 3 runs and 3 tries");
    assert_eq!(
        own.psql(&db, "SELECT COUNT(*) FROM backfill_manifest.runs"),
        "3"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_host_whose_clock_runs_ahead_takes_nothing_over_while_the_database_says_the_lease_is_fresh() {
    let (cluster, db, url) = manifest_database();
    let (p, owner) = owner_running_two_days(cluster, &db, &url, None);
    // Its clock two minutes ahead, past the lease timeout (30 s): by its own clock the owner's
    // heartbeat is stale; by the database's it is fresh.
    let skewed = [("BACKFILL_FAULT", "clock-skew:+120s")];
    std::fs::write(p.path("go-2026-01-03"), "").unwrap();
    p.run_with(&["--manifest", &url, "resume", "1"], &skewed)
        .code(2)
        .stderr_has("backfill 1 is still running");
    let overlapping = p.run_with(&create_args(&url, "2026-01-01", "2026-01-03"), &skewed);
    overlapping
        .code(0)
        .stderr_has("backfill 2 of c: 3 intervals, 1 to run, 2 skipped");
    std::fs::write(p.path("go"), "").unwrap();
    p.wait("owner", owner).code(0);
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT epoch, state FROM backfill_manifest.backfills ORDER BY id"
        ),
        "0|completed\n0|completed"
    );
    assert_eq!(
        runs_per_interval(cluster, &db),
        (1..=3).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
    assert_eq!(p.read("overlaps.txt"), "");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_database_restarting_under_a_backfill_is_a_reconnect_and_every_interval_runs_once() {
    let own = pg::Cluster::start();
    let db = own.create_db();
    let url = own.url(&db);
    let p = Project::new().dag("c", DAG);
    let run = p.spawn("run", &create_args(&url, "2026-01-01", "2026-01-06"));
    // Days 1 and 2 end; days 3 and 4 run while the server restarts.
    std::fs::write(p.path("go-2026-01-01"), "").unwrap();
    std::fs::write(p.path("go-2026-01-02"), "").unwrap();
    wait_until("days 3 and 4 to run", Duration::from_secs(20), || {
        running_tries(&own, &db) == "2"
    });
    own.restart();
    std::fs::write(p.path("go"), "").unwrap();
    let out = p.wait("run", run);
    out.code(0).stderr_has("6 succeeded");
    assert_eq!(
        runs_per_interval(&own, &db),
        (1..=6).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
    assert_eq!(p.read("overlaps.txt"), "");
    assert_eq!(
        own.psql(&db, "SELECT COUNT(*) FROM backfill_manifest.leases"),
        "0"
    );
}

/// A manifest writer of this process on the manifest at `url`, as a backfill opens it.
fn writer_on(url: &str) -> backfill::manifest::writer::Writer {
    backfill::manifest::writer::Writer::open(
        std::path::Path::new(url),
        backfill::manifest::Durability::Full,
    )
    .unwrap()
}

/// A job that reaches the writer while its batch runs commits with that batch, in the round trip
/// the writer sends anyway: one transaction (the writer's token counts them), at one clock.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_job_queued_while_the_writers_batch_runs_commits_in_the_same_transaction() {
    let (cluster, db, url) = manifest_database();
    let writer = writer_on(&url);
    let (queued_tx, queued) = std::sync::mpsc::channel();
    let handle = writer.clone();
    let first = writer
        .call_blocking(move |c| {
            // Queued from inside the first job: it is waiting before the batch commits.
            let _ = queued_tx.send(handle.submit(|c| c.clock_ms(0)));
            c.clock_ms(0)
        })
        .unwrap();
    let second = queued.recv().unwrap().blocking_recv().unwrap().unwrap();
    assert_eq!(first, second, "both jobs read their transaction's clock");
    assert_eq!(
        cluster.psql(&db, "SELECT token FROM backfill_manifest.manifest_commits"),
        "1"
    );
    writer.close();
}

/// A job that joined a batch while it ran and then failed is blamed alone: its error is its own,
/// and the job it joined runs again without it and commits, in the writer's second transaction.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_job_that_joined_a_running_batch_and_failed_fails_alone() {
    let (cluster, db, url) = manifest_database();
    let writer = writer_on(&url);
    let (queued_tx, queued) = std::sync::mpsc::channel();
    let handle = writer.clone();
    let mut runs = 0;
    let first = writer.call_blocking(move |c| {
        runs += 1;
        // Queued from inside its first run only: it joins that run's batch, and fails there.
        if runs == 1 {
            let _ = queued_tx.send(handle.submit(|_| -> backfill::manifest::Result<()> {
                Err(backfill::manifest::Error::Invalid(
                    "refused on purpose".into(),
                ))
            }));
        }
        Ok((runs, c.clock_ms(0)?))
    });
    let second = queued.recv().unwrap().blocking_recv().unwrap();
    assert!(
        second
            .as_ref()
            .is_err_and(|e| e.to_string().contains("refused on purpose")),
        "{second:?}"
    );
    assert_eq!(
        first.unwrap().0,
        2,
        "the first job ran again without the one to blame"
    );
    assert_eq!(
        cluster.psql(&db, "SELECT token FROM backfill_manifest.manifest_commits"),
        "2"
    );
    writer.close();
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_host_frozen_inside_a_manifest_transaction_holds_the_others_up_for_seconds_only() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG).dag("d", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    // A lease shorter than the server's 5 s for a session idle in a transaction: waiting for
    // the lock behind a frozen host is not taken for a manifest gone silent.
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    // Host A freezes in its third manifest transaction, holding the writers' lock.
    let a = p.spawn_with(
        "a",
        &create_args(&url, "2026-01-01", "2026-01-03"),
        &[("BACKFILL_FAULT", "manifest-transaction@3:stop")],
    );
    wait_until("host A to freeze", Duration::from_secs(20), || {
        stopped(a.id())
    });
    // Another backfill waits for the lock only until the server ends the frozen session.
    let mut args = create_args(&url, "2026-01-01", "2026-01-03");
    args[4] = "d";
    let b = p.spawn("b", &args);
    wait_within(&p, "b", b, Duration::from_secs(60))
        .code(0)
        .stderr_has("3 succeeded");
    // Thawed, host A finds its connection gone, connects again and runs its transaction anew.
    signal(&a, Signal::SIGCONT);
    wait_within(&p, "a", a, Duration::from_secs(60))
        .code(0)
        .stderr_has("3 succeeded");
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT dag_id, COUNT(*), COUNT(DISTINCT interval_start), COUNT(*) FILTER (WHERE state = 'succeeded')
             FROM backfill_manifest.runs GROUP BY dag_id ORDER BY dag_id"
        ),
        "c|3|3|3\nd|3|3|3"
    );
    assert_eq!(p.read("overlaps.txt"), "");
}

/// With the shortest lease (1 s), a running backfill's heartbeat gives up after half of it; a
/// host frozen holding the writers' lock must be ended by the server before that, or every
/// healthy peer stops.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_host_frozen_inside_a_manifest_transaction_does_not_stop_a_peer_under_the_shortest_lease() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG).dag("d", DAG);
    p.write("backfill.toml", "lease_timeout = \"1s\"\n");
    // B runs first, its two tries waiting for `go` while its heartbeat is written.
    let mut args = create_args(&url, "2026-01-01", "2026-01-02");
    args[4] = "d";
    let b = p.spawn("b", &args);
    wait_until("b's tries to run", Duration::from_secs(20), || {
        running_tries(cluster, &db) == "2"
    });
    // Host A freezes in its third manifest transaction, holding the writers' lock.
    let a = p.spawn_with(
        "a",
        &create_args(&url, "2026-01-03", "2026-01-03"),
        &[("BACKFILL_FAULT", "manifest-transaction@3:stop")],
    );
    wait_until("host A to freeze", Duration::from_secs(20), || {
        stopped(a.id())
    });
    std::fs::write(p.path("go"), "").unwrap();
    wait_within(&p, "b", b, Duration::from_secs(60))
        .code(0)
        .stderr_has("2 succeeded");
    signal(&a, Signal::SIGCONT);
    wait_within(&p, "a", a, Duration::from_secs(60))
        .code(0)
        .stderr_has("1 succeeded");
    assert_eq!(p.read("overlaps.txt"), "");
}

/// An owner frozen inside a manifest transaction for longer than its patience, and taken over
/// meanwhile: on waking, its session was ended by the server long ago. The transaction is tried
/// again on a new connection (the server never stopped answering), which finds the owner taken
/// over: exit 130, not "the connection was lost in every transaction tried" (exit 1).
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_frozen_mid_transaction_past_its_patience_finds_itself_taken_over() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG);
    // Its patience is the lease timeout, and never less than 10 s.
    p.write("backfill.toml", "lease_timeout = \"10s\"\n");
    // Its tries wait for `go`; it freezes in a later transaction (its heartbeat's, or a try's
    // start), once the backfill is recorded.
    let a = p.spawn_with(
        "a",
        &create_args(&url, "2026-01-01", "2026-01-03"),
        &[("BACKFILL_FAULT", "manifest-transaction@10:stop")],
    );
    wait_until("host A to freeze", Duration::from_secs(20), || {
        stopped(a.id())
    });
    let frozen = std::time::Instant::now();
    // Its lease expires: another process takes the backfill over and finishes it.
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&["--manifest", &url, "resume", "1", "--wait"])
        .code(0)
        .stderr_has("3 succeeded");
    // Frozen for longer than its patience, then thawed.
    std::thread::sleep(Duration::from_millis(10_500).saturating_sub(frozen.elapsed()));
    signal(&a, Signal::SIGCONT);
    let out = wait_within(&p, "a", a, Duration::from_secs(60));
    out.code(130).stderr_has("backfill 1 of c: taken over");
    assert!(
        !out.stderr.contains("lost in every transaction"),
        "{}",
        out.stderr
    );
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT COUNT(*), COUNT(DISTINCT interval_start) FROM backfill_manifest.runs WHERE state = 'succeeded'"
        ),
        "3|3"
    );
    assert_eq!(p.read("overlaps.txt"), "");
}

/// An owner frozen past its lease and taken over, thawed while the writers' lock is held: its
/// heartbeat cannot be written within half its lease, so it stops; once the manifest answers,
/// it says it was taken over (exit 130), not that the manifest failed (exit 1).
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_thawed_after_a_takeover_behind_the_writers_lock_says_it_was_taken_over() {
    let (cluster, db, url) = manifest_database();
    let (p, owner) = owner_running_two_days(cluster, &db, &url, Some("1s"));
    signal(&owner, Signal::SIGSTOP);
    // Another process takes it over and finishes it.
    std::fs::write(p.path("go"), "").unwrap();
    let resumed = p.run(&["--manifest", &url, "resume", "1", "--wait"]);
    resumed.code(0);
    let mut lock = cluster.session(&db);
    lock.send("BEGIN; SELECT 1 FROM backfill_manifest.manifest_lock FOR UPDATE;");
    wait_for_session(cluster, &db, "the lock to be held", PSQL_IN_TRANSACTION);
    signal(&owner, Signal::SIGCONT);
    wait_until(
        "the thawed owner to give up its heartbeat",
        Duration::from_secs(30),
        || p.read("owner.err").contains("cannot write the heartbeat"),
    );
    lock.send("ROLLBACK;");
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(130).stderr_has("backfill 1 of c: taken over");
    assert!(!out.stderr.contains("error: "), "{}", out.stderr);
    assert_eq!(
        cluster.psql(&db, "SELECT state FROM backfill_manifest.backfills"),
        "completed"
    );
    assert_eq!(p.read("overlaps.txt"), "");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_cut_off_from_the_manifest_stops_its_tries_before_its_lease_could_be_taken() {
    let own = pg::Cluster::start();
    let db = own.create_db();
    let url = own.url(&db);
    let (p, owner) = owner_running_two_days(&own, &db, &url, Some("4s"));
    // This project's tries only: other tests' tries of the same DAG run meanwhile, in folders
    // of their own.
    let folder = std::fs::canonicalize(p.path("")).unwrap();
    let tries_alive = || {
        std::process::Command::new("pgrep")
            .args(["-f", "locks/2026-01-0"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .any(|pid| {
                        std::fs::read_link(format!("/proc/{pid}/cwd"))
                            .is_ok_and(|cwd| cwd == folder)
                    })
            })
            .unwrap_or(false)
    };
    assert!(tries_alive(), "the tries run, in {}", folder.display());
    // The server stops answering, its connections open: the owner's heartbeat hangs.
    own.freeze();
    // Within half the lease timeout (2 s) and a heartbeat, its tries get SIGTERM, long before
    // the lease (4 s) could be judged expired by another host.
    let stopped_in_time = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        !tries_alive()
    });
    own.thaw();
    assert!(
        stopped_in_time,
        "the tries ran on while the manifest did not answer"
    );
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(1)
        .stderr_has("cannot write the heartbeat: manifest: the manifest did not answer within 2s (half the lease timeout): stopping")
        .stderr_has("cancelled  2026-01-01");
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&["--manifest", &url, "resume", "1"]).code(0);
    assert_eq!(
        runs_per_interval(&own, &db)
            .iter()
            .map(|r| (r.0, r.2))
            .collect::<Vec<_>>(),
        (1..=2).map(|d| (day_unix(d), 1)).collect::<Vec<_>>()
    );
    assert_eq!(p.read("overlaps.txt"), "");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_connection_lost_while_the_schema_is_made_leaves_no_half_and_the_open_starts_again() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    // Frozen inside the first open's transaction, its first migration applied.
    let child = p.spawn_with(
        "create",
        &create_args(&url, "2026-01-01", "2026-01-02"),
        &[("BACKFILL_FAULT", "manifest-migration@1:stop")],
    );
    wait_until(
        "the first open frozen mid-migration",
        Duration::from_secs(30),
        || stopped(child.id()),
    );
    // Its session ends under it (a server restarting, a network dropping the connection).
    cluster.psql(
        &db,
        &format!(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ),
    );
    signal(&child, Signal::SIGCONT);
    let out = wait_within(&p, "create", child, Duration::from_secs(60));
    out.code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        latest_schema()
    );
    // Nothing was made outside the schema (in autocommit, where the search path leads
    // elsewhere).
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relname IN ('backfills', 'runs', 'task_tries') AND n.nspname <> 'backfill_manifest'"
        ),
        "0"
    );
    assert_eq!(
        runs_per_interval(cluster, &db),
        (1..=2).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_running_backfill_stops_writing_once_a_newer_backfill_upgraded_the_schema() {
    let (cluster, db, url) = manifest_database();
    let (p, owner) = owner_running_two_days(cluster, &db, &url, Some("4s"));
    // What a newer binary's migration leaves: a higher version.
    cluster.psql(
        &db,
        "UPDATE backfill_manifest.schema_version SET version = 99",
    );
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(1).stderr_has(&format!(
        "the manifest's schema is now version 99, and this backfill knows version {}: a newer backfill changed it while this one ran, so this one writes nothing more",
        latest_schema()
    ));
    // It wrote nothing after the upgrade, not even its tries' ends: its runs are still in
    // progress, for the newer backfill to take up.
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT state, COUNT(*) FROM backfill_manifest.runs GROUP BY 1"
        ),
        "running|2"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_role_that_may_only_read_the_manifest_reads_it_and_is_refused_writes_as_bad_input() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&create_args(&url, "2026-01-01", "2026-01-02"))
        .code(0);
    let (role, reader) = role_with(cluster, &db, &url, "reader", "SELECT");
    p.run(&["--manifest", &reader, "list"]).code(0);
    p.run(&["--manifest", &reader, "show", "1"]).code(0);
    p.run(
        &[
            create_args(&reader, "2026-01-01", "2026-01-02"),
            vec!["--dry-run"],
        ]
        .concat(),
    )
    .code(0);
    // A write is refused before anything is written, as for a file the user cannot write.
    p.run(&create_args(&reader, "2026-01-03", "2026-01-03"))
        .code(2)
        .stderr_has("this role may read it but not write it; commands that only read it (list, show, runs, diff, create --dry-run) work");
    // Inserting without updating is not writing it either (each privilege is asked alone).
    cluster.psql(
        &db,
        &format!("GRANT INSERT ON ALL TABLES IN SCHEMA backfill_manifest TO {role}"),
    );
    p.run(&create_args(&reader, "2026-01-03", "2026-01-03"))
        .code(2)
        .stderr_has("this role may read it but not write it");
    assert_eq!(
        cluster.psql(&db, "SELECT COUNT(*) FROM backfill_manifest.backfills"),
        "1"
    );
    // Nor may it make the manifest in a database where it has none.
    let empty = cluster.create_db();
    cluster.psql(&empty, &format!("REVOKE CREATE ON SCHEMA public FROM PUBLIC; REVOKE CREATE ON DATABASE {empty} FROM PUBLIC"));
    let fresh = cluster
        .url(&empty)
        .replace("postgres@", &format!("{role}@"));
    p.run(&create_args(&fresh, "2026-01-01", "2026-01-01"))
        .code(2)
        .stderr_has("this role may not create or upgrade its schema");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_manifest_urls_password_reaches_no_output_file_log_or_hook() {
    let (_, db, url) = manifest_database();
    // The test server trusts every connection: the password is carried, never checked.
    let secret = url.replace("postgres@", "postgres:hunter2@");
    assert_ne!(secret, url);
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    p.write(
        "backfill.toml",
        "[notify]\non_finish = \"cat > hook-stdin.json\"\n",
    );
    let env = [("BACKFILL_MANIFEST", secret.as_str())];
    let mut seen = String::new();
    for args in [
        vec![
            "-vv",
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
        vec![
            "--output",
            "json",
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
            "--dry-run",
        ],
        vec!["--output", "json", "show", "1"],
        vec!["--output", "json", "list"],
        vec!["runs", "--dag", "c"],
        vec!["show", "99"],
        vec!["--help"],
        vec!["create", "--help"],
    ] {
        let out = p.run_with(&args, &env);
        seen.push_str(&out.stdout);
        seen.push_str(&out.stderr);
    }
    assert!(
        seen.contains(&format!("/{db}")),
        "the manifest is named: {seen}"
    );
    assert!(!seen.contains("hunter2"), "{seen}");
    // Nor any file the project holds: logs, audit files, the hook's input.
    let mut files = vec![p.path(".")];
    let mut read = 0;
    while let Some(f) = files.pop() {
        if f.is_dir() {
            files.extend(std::fs::read_dir(&f).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(bytes) = std::fs::read(&f) {
            read += 1;
            assert!(
                !String::from_utf8_lossy(&bytes).contains("hunter2"),
                "{} holds the password",
                f.display()
            );
        }
    }
    assert!(read > 3, "the project's files were read");
    assert!(p.path("hook-stdin.json").exists(), "the hook ran");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_deadlock_that_aborts_the_writers_transaction_runs_it_again_and_records_the_try() {
    let (cluster, db, url) = manifest_database();
    // The deadlock is found by whichever session has waited `deadlock_timeout` first: 3 s for
    // the program's sessions, far longer for the test's, so it is always the writer's.
    cluster.psql(
        "postgres",
        &format!("ALTER DATABASE {db} SET deadlock_timeout = '3s'"),
    );
    let p = Project::new().dag("c", DAG);
    let mut args = vec!["-vv"];
    args.extend(create_args(&url, "2026-01-01", "2026-01-02"));
    let owner = p.spawn("owner", &args);
    wait_until("two running tries", Duration::from_secs(30), || {
        running_tries(cluster, &db) == "2"
    });
    let run = cluster.psql(
        &db,
        &format!(
            "SELECT id FROM backfill_manifest.runs WHERE interval_start = {}",
            day_unix(1)
        ),
    );
    // Another session holds the first day's run row, as a reader locking it would.
    let mut other = cluster.session(&db);
    other.send(&format!(
        "SET deadlock_timeout = '600s'; BEGIN; SELECT 1 FROM backfill_manifest.runs WHERE id = {run} FOR UPDATE;"
    ));
    wait_for_session(
        cluster,
        &db,
        "the other session to hold the row",
        PSQL_IN_TRANSACTION,
    );
    let deadlocks = || {
        cluster.psql(
            &db,
            &format!("SELECT deadlocks FROM pg_stat_database WHERE datname = '{db}'"),
        )
    };
    let before = deadlocks();
    // The day's try ends: the writer, holding the writers' lock, waits for that row.
    std::fs::write(p.path("go-2026-01-01"), "").unwrap();
    wait_for_session(
        cluster,
        &db,
        "the writer to wait for the row",
        BACKFILL_WAITING_FOR_A_LOCK,
    );
    // Now the other session asks for the writers' lock: a deadlock, which the writer, waiting
    // longer, finds first and is aborted by.
    other.send("SELECT 1 FROM backfill_manifest.manifest_lock FOR UPDATE;");
    wait_until("the deadlock", Duration::from_secs(10), || {
        deadlocks() != before
    });
    other.send("ROLLBACK;");
    std::fs::write(p.path("go"), "").unwrap();
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(0)
        .stderr_has("the server asked for the manifest's transaction to run again");
    assert_eq!(
        runs_per_interval(cluster, &db),
        (1..=2).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
    drop(other);
}

/// The writer makes a lost connection again for as long as the server has been silent for its
/// patience (the lease timeout), counted from the server's last answer: a transaction that
/// waited most of that for the writers' lock, was answered, and then lost its connection is
/// still run again, rather than its writes given up as if the server had been silent all along.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_connection_lost_after_a_long_wait_for_the_writers_lock_is_made_again() {
    let (cluster, db, url) = manifest_database();
    // Patience 10 s: the writer gives up a connection lost after 10 s of silence.
    let (p, owner) = owner_running_two_days(cluster, &db, &url, Some("10s"));
    let day1 = day_unix(1);
    // One session holds the first day's run row, which its end updates; another holds the
    // writers' lock.
    let mut row = cluster.session(&db);
    row.send(&format!(
        "BEGIN; SELECT 1 FROM backfill_manifest.runs WHERE interval_start = {day1} FOR UPDATE;"
    ));
    wait_for_session(cluster, &db, "the row to be held", PSQL_IN_TRANSACTION);
    let mut lock = cluster.session(&db);
    lock.send("BEGIN; SELECT 1 FROM backfill_manifest.manifest_lock FOR UPDATE;");
    wait_until("the lock to be held", Duration::from_secs(30), || {
        cluster.psql(
            &db,
            &format!(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND {PSQL_IN_TRANSACTION}"
            ),
        ) == "2"
    });
    // The first day's try ends: the writer's transaction waits for the lock.
    end_first_day_behind_the_lock(cluster, &db, &p);
    let waiting_since = std::time::Instant::now();
    // 7 s later the lock is free and the server answers (within the 10 s a round trip may
    // take); the end then waits for the row.
    std::thread::sleep(Duration::from_secs(7));
    lock.send("ROLLBACK;");
    wait_for_session(
        cluster,
        &db,
        "the writer to wait for the row",
        BACKFILL_WAITING_FOR_A_LOCK,
    );
    // More than 10 s after the transaction began, but 3.5 s after the server's last answer,
    // its connection is lost.
    std::thread::sleep(Duration::from_millis(10_500).saturating_sub(waiting_since.elapsed()));
    assert_eq!(
        cluster.psql(
            &db,
            &format!(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{db}' AND {BACKFILL_WAITING_FOR_A_LOCK}"
            ),
        ),
        "1"
    );
    // The writer connects again and runs the transaction anew: its end waits for the row again.
    let again = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        cluster.psql(
            &db,
            &format!(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND {BACKFILL_WAITING_FOR_A_LOCK}"
            ),
        ) == "1"
    });
    row.send("ROLLBACK;");
    std::fs::write(p.path("go"), "").unwrap();
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    assert!(
        again,
        "the writer did not run its transaction again\n{}",
        p.read("owner.err")
    );
    assert!(
        !out.stderr
            .contains("the connection was lost in every transaction tried"),
        "the writer gave its transaction up:\n{}",
        out.stderr
    );
    // The heartbeat, behind the lock, was late by half the lease: the owner stopped its other
    // try and exits, resumable. The first day's end, made again, is recorded.
    out.code(1)
        .stderr_has("cannot write the heartbeat")
        .stderr_has("backfill 1 stays resumable");
    assert_eq!(
        runs_per_interval(cluster, &db),
        vec![(day1, 1, 1), (day_unix(2), 1, 0)]
    );
    p.run(&["--manifest", &url, "resume", "1"]).code(0);
    assert_eq!(
        runs_per_interval(cluster, &db),
        vec![(day1, 1, 1), (day_unix(2), 2, 1)]
    );
    assert_eq!(p.read("overlaps.txt"), "");
    drop((row, lock));
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn runs_a_dead_owner_left_are_ended_at_the_databases_time_not_the_resuming_hosts() {
    let (cluster, db, url) = manifest_database();
    let (p, mut owner) = owner_running_two_days(cluster, &db, &url, None);
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::fs::write(p.path("go"), "").unwrap();
    // The host that resumes runs ten minutes ahead.
    p.run_with(
        &["--manifest", &url, "resume", "1"],
        &[("BACKFILL_FAULT", "clock-skew:+600s")],
    )
    .code(0);
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT state, COUNT(*) FILTER (WHERE ended_at > CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) + 60000)
             FROM backfill_manifest.runs GROUP BY 1 ORDER BY 1"
        ),
        "cancelled|0\nsucceeded|0",
        "no run ended in the resuming host's future"
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_statement_refused_in_a_batch_sent_together_fails_its_own_job_and_the_others_commit() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag(
        "c",
        &DAG.replace("max_active_runs = 2", "max_active_runs = 3"),
    );
    let owner = p.spawn("owner", &create_args(&url, "2026-01-01", "2026-01-03"));
    wait_until("three running tries", Duration::from_secs(30), || {
        running_tries(cluster, &db) == "3"
    });
    // The database refuses the second day's end (as a constraint of its own would).
    cluster.psql(
        &db,
        &format!(
            "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'this database refuses the end of the run'; END $$;
             CREATE TRIGGER refuse BEFORE UPDATE OF state ON backfill_manifest.runs FOR EACH ROW
             WHEN (NEW.interval_start = {} AND NEW.state <> 'running') EXECUTE FUNCTION public.refuse()",
            day_unix(2)
        ),
    );
    // The writers' lock held, the first day's end waits for it in the writer's transaction;
    // the second's and the third's, in that order, wait in the writer's queue, and go to the
    // server together (one batch, their statements pipelined) once the lock is free: the
    // refused end first, the other after it in the same transaction.
    let mut other = cluster.session(&db);
    other.send("BEGIN; SELECT 1 FROM backfill_manifest.manifest_lock FOR UPDATE;");
    wait_for_session(cluster, &db, "the lock to be held", PSQL_IN_TRANSACTION);
    let ended = |d: u32| {
        std::process::Command::new("flock")
            .args(["-n", &format!("locks/2026-01-0{d}"), "true"])
            .current_dir(p.path("."))
            .status()
            .unwrap()
            .success()
    };
    end_first_day_behind_the_lock(cluster, &db, &p);
    for d in [2, 3] {
        std::fs::write(p.path(&format!("go-2026-01-0{d}")), "").unwrap();
        wait_until("the try to end", Duration::from_secs(30), || ended(d));
    }
    other.send("ROLLBACK;");
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(1)
        .stderr_has("this database refuses the end of the run");
    // The other days' ends committed; the second day's did not.
    let states = cluster.psql(
        &db,
        "SELECT interval_start, state FROM backfill_manifest.runs ORDER BY 1",
    );
    assert_eq!(
        states,
        format!(
            "{}|succeeded\n{}|running\n{}|succeeded",
            day_unix(1),
            day_unix(2),
            day_unix(3)
        )
    );
    drop(other);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn answers_lost_with_the_connection_after_a_commit_are_read_from_the_record() {
    let cluster = pg::shared();
    // The N-th batch whose statements went with its commit: the server committed, and the
    // connection is lost before their answers (runs' starts, tries' process groups and ends)
    // arrive. Each is read again from the record, and the backfill goes on. Eight days, two at
    // a time: however the writer batches their starts and ends, at least five commits carry
    // statements (four days gave as few as three when batches grew).
    for n in 1..=4 {
        let db = cluster.create_db();
        let url = cluster.url(&db);
        let p = Project::new().dag("c", DAG);
        std::fs::write(p.path("go"), "").unwrap();
        let fault = format!("manifest-answers-lost@{n}:fail");
        let mut args = vec!["-vv"];
        args.extend(create_args(&url, "2026-01-01", "2026-01-08"));
        let out = p.run_with(&args, &[("BACKFILL_FAULT", fault.as_str())]);
        out.code(0).stderr_has("lost during a commit that happened");
        assert_eq!(
            runs_per_interval(cluster, &db),
            (1..=8).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>(),
            "{fault}"
        );
        assert_eq!(
            cluster.psql(
                &db,
                "SELECT COUNT(*) FROM backfill_manifest.task_tries WHERE state <> 'succeeded' OR pgid IS NULL"
            ),
            "0",
            "{fault}"
        );
    }
}

/// A connection this program gives up is closed at the server too, even while tries wait at
/// their gates (forked before their start commits, they held copies of every descriptor): its
/// session, inside the next transaction and holding the writers' lock, would otherwise live on
/// until the server's timeout for a session idle in a transaction ended it, every writer of the
/// manifest waiting meanwhile.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_connection_given_up_with_tries_at_their_gates_ends_its_session_at_once() {
    let cluster = pg::shared();
    let noop = "schedule = \"@hourly\"\n[[tasks]]\nid = \"noop\"\ncommand = [\"true\"]\n";
    for n in [5, 14] {
        let db = cluster.create_db();
        let url = cluster.url(&db);
        let p = Project::new().dag("n", noop);
        // Commits slowed a little, so that the next jobs wait and each commit begins the next
        // transaction in its round trip; the n-th loses its answers with its connection.
        let fault = format!("slow-commit:5ms,manifest-answers-lost@{n}:fail");
        p.run_with(
            &[
                "--manifest",
                &url,
                "create",
                "--dag",
                "n",
                "--from",
                "2015-01-01T00:00:00Z",
                "--to",
                "2015-01-09T07:00:00Z",
                "--max-active-runs",
                "8",
            ],
            &[("BACKFILL_FAULT", fault.as_str())],
        )
        .code(0)
        .stderr_has("200 succeeded");
        assert_eq!(
            cluster.psql(
                &db,
                "SELECT COUNT(*), COUNT(DISTINCT interval_start), COUNT(*) FILTER (WHERE state = 'succeeded')
                 FROM backfill_manifest.runs"
            ),
            "200|200|200",
            "{fault}"
        );
        // The given-up session ended when its client closed it, not by the server's timeout.
        wait_until("the sessions to end", Duration::from_secs(30), || {
            cluster.psql(
                &db,
                &format!("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'backfill'"),
            ) == "0"
        });
        assert_eq!(
            cluster.psql(
                &db,
                &format!(
                    "SELECT sessions_fatal, sessions_abandoned > 0 FROM pg_stat_database WHERE datname = '{db}'"
                ),
            ),
            "0|t",
            "{fault}"
        );
    }
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_run_id_reserved_before_a_newer_run_of_its_interval_was_recorded_is_not_used() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag(
        "c",
        r#"
schedule = "@daily"
[[tasks]]
id = "work"
command = 'echo "{{ ds }} $BACKFILL_RUN_ID" >> ran.txt'
"#,
    );
    // The owner reserves run ids at its first start, then freezes with the second day's process
    // spawned under a reserved id, before anything of that day is recorded.
    let mut args = create_args(&url, "2026-01-01", "2026-01-03");
    args.extend(["--max-active-runs", "1"]);
    let frozen = p.spawn_with("frozen", &args, &[("BACKFILL_FAULT", "after-spawn@2:stop")]);
    wait_until("the owner to freeze", Duration::from_secs(20), || {
        stopped(frozen.id())
    });
    // Meanwhile a newer run of that day is recorded, as a process that joined the backfill
    // records one with the ids it reserved later. Recorded with the older id, the owner's run
    // would not be the day's latest.
    let newer = cluster.psql(
        &db,
        &format!(
            "INSERT INTO backfill_manifest.runs (id, backfill_id, dag_id, interval_start,
                 interval_end, state, started_at, ended_at)
             VALUES (nextval(pg_get_serial_sequence('backfill_manifest.runs', 'id')), 1, 'c',
                 {}, {}, 'failed', 0, 0) RETURNING id",
            day_unix(2),
            day_unix(3)
        ),
    );
    signal(&frozen, Signal::SIGCONT);
    p.wait("frozen", frozen).code(0);
    let runs = cluster.psql(
        &db,
        &format!(
            "SELECT id, state FROM backfill_manifest.runs WHERE interval_start = {}
             ORDER BY id",
            day_unix(2)
        ),
    );
    let runs: Vec<(i64, String)> = runs
        .lines()
        .map(|l| {
            let (id, state) = l.split_once('|').unwrap();
            (id.parse().unwrap(), state.to_string())
        })
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0], (newer.parse().unwrap(), "failed".to_string()));
    assert_eq!(
        runs[1].1, "succeeded",
        "the day's latest run is the owner's"
    );
    // Each day ran once, under the run id the manifest recorded for it: the process spawned
    // under the stale id never ran.
    let recorded = cluster.psql(
        &db,
        "SELECT to_char(to_timestamp(interval_start) AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' ' || id
         FROM backfill_manifest.runs WHERE state = 'succeeded' ORDER BY interval_start",
    );
    assert_eq!(p.read("ran.txt").trim_end(), recorded);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_role_that_may_write_the_tables_but_not_use_their_sequences_runs_backfills() {
    let (cluster, db, url) = manifest_database();
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&create_args(&url, "2026-01-01", "2026-01-01"))
        .code(0);
    // The tables' privileges and nothing on their sequences: inserts take the identity columns'
    // defaults, which need none, and no run id is reserved ahead.
    let (_, writer) = role_with(
        cluster,
        &db,
        &url,
        "writer",
        "SELECT, INSERT, UPDATE, DELETE",
    );
    p.run(&create_args(&writer, "2026-01-02", "2026-01-04"))
        .code(0);
    assert_eq!(
        runs_per_interval(cluster, &db),
        (1..=4).map(|d| (day_unix(d), 1, 1)).collect::<Vec<_>>()
    );
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT COUNT(*) FROM backfill_manifest.task_tries WHERE state <> 'succeeded' OR pgid IS NULL"
        ),
        "0"
    );
}

/// A manifest of the version before its flags were `boolean` (made by that release's
/// migrations, with one backfill recorded), upgraded by a `create` that is killed (`kill -9`)
/// once the conversion ran but before it committed: the manifest is still the earlier version,
/// whole, and the next command converts it, keeping what it held.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_upgrade_to_boolean_flags_killed_before_its_commit_leaves_the_earlier_version_and_is_done_again()
 {
    let (cluster, db, url) = manifest_database();
    let before = backfill::manifest::postgres::MIGRATIONS
        .iter()
        .position(|m| m.1.contains("TYPE boolean USING run_backwards"))
        .expect("the migration that makes flags boolean");
    let mut sql =
        "CREATE SCHEMA backfill_manifest; SET search_path = backfill_manifest, pg_catalog;
         CREATE TABLE schema_version (version bigint NOT NULL);\n"
            .to_string();
    for (_, migration) in &backfill::manifest::postgres::MIGRATIONS[..before] {
        sql.push_str(migration);
        sql.push('\n');
    }
    let old = backfill::manifest::postgres::MIGRATIONS[before - 1].0;
    sql.push_str(&format!(
        "INSERT INTO schema_version VALUES ({old});
         INSERT INTO backfills (dag_id, from_arg, to_arg, range_start, range_end,
             reprocess_behavior, max_active_runs, run_backwards, allow_drift, state, owner_pid,
             owner_host, heartbeat_at, created_at, finished_at)
         VALUES ('c', '2025-12-01', '2025-12-02', {}, {}, 'none', 2, 1, 1, 'completed', 1, 'h',
                 1000, 900, 1100);",
        day_unix(1) - 31 * 86_400,
        day_unix(1) - 30 * 86_400
    ));
    cluster.psql(&db, &sql);
    let types = || {
        cluster.psql(
            &db,
            "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY column_name)
             FROM information_schema.columns
             WHERE table_schema = 'backfill_manifest' AND table_name = 'backfills'
               AND column_name IN ('run_backwards', 'allow_drift', 'planning')",
        )
    };
    assert_eq!(
        types(),
        "allow_drift bigint, planning bigint, run_backwards bigint"
    );
    let p = Project::new().dag("c", DAG);
    std::fs::write(p.path("go"), "").unwrap();
    let mut child = p.spawn_with(
        "create",
        &create_args(&url, "2026-01-01", "2026-01-02"),
        &[("BACKFILL_FAULT", "manifest-migration@1:stop")],
    );
    wait_until(
        "the upgrade frozen after its conversion",
        Duration::from_secs(30),
        || stopped(child.id()),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        "the killed process's session to end",
        Duration::from_secs(30),
        || {
            cluster.psql(
                &db,
                &format!(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
                ),
            ) == "0"
        },
    );
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        old.to_string()
    );
    assert_eq!(
        types(),
        "allow_drift bigint, planning bigint, run_backwards bigint"
    );
    // The next command converts it, and what it held reads as it was written.
    p.run(&create_args(&url, "2026-01-01", "2026-01-02"))
        .code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT version FROM backfill_manifest.schema_version"),
        latest_schema()
    );
    assert_eq!(
        types(),
        "allow_drift boolean, planning boolean, run_backwards boolean"
    );
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT id, run_backwards, allow_drift, planning FROM backfill_manifest.backfills ORDER BY id"
        ),
        "1|t|t|f\n2|f|f|f"
    );
    let shown: serde_json::Value = serde_json::from_str(
        &p.run(&["--manifest", &url, "show", "1", "--output", "json"])
            .code(0)
            .stdout,
    )
    .unwrap();
    assert_eq!(
        (
            &shown["run_backwards"],
            &shown["allow_drift"],
            &shown["state"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(true),
            &serde_json::json!("completed")
        )
    );
}

/// The schema version of a PostgreSQL manifest this build makes: its last migration's.
fn latest_schema() -> String {
    backfill::manifest::postgres::MIGRATIONS
        .last()
        .unwrap()
        .0
        .to_string()
}
