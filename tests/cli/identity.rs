//! The wrong file and the wrong project: a database that is not a manifest is refused and left
//! as it was, an emptied manifest is refused where the project has a history, and an old
//! manifest of this program is still taken (and marked).

use std::path::Path;

use rusqlite::Connection;

use crate::gate::shop;
use crate::support::{Out, Project};

/// `create --dag daily_orders` over the first three days of September 2026.
pub(crate) const THREE_DAYS: &[&str] = &[
    "create",
    "--dag",
    "daily_orders",
    "--from",
    "2026-09-01",
    "--to",
    "2026-09-03",
];

/// The `application_id` that marks a manifest (`bkfl`).
const MARK: i32 = 0x626b_666c;

/// Every table of a SQLite database with its rows, its schema version and its mark: equal
/// dumps mean a database left as it was.
fn dump(path: &Path) -> String {
    let c = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut out = String::new();
    for pragma in ["user_version", "application_id", "journal_mode"] {
        let v: rusqlite::types::Value = c.pragma_query_value(None, pragma, |r| r.get(0)).unwrap();
        out.push_str(&format!("{pragma} = {v:?}\n"));
    }
    let tables: Vec<(String, String)> = c
        .prepare("SELECT name, sql FROM sqlite_schema ORDER BY name")
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (name, sql) in tables {
        out.push_str(&format!("{sql}\n"));
        if sql.starts_with("CREATE TABLE") {
            let mut stmt = c.prepare(&format!("SELECT * FROM \"{name}\"")).unwrap();
            let n = stmt.column_count();
            let mut rows = stmt.query([]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                let values: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                    .collect();
                out.push_str(&format!("  {}\n", values.join(" | ")));
            }
        }
    }
    out
}

fn application_id(path: &Path) -> i32 {
    Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .unwrap()
}

/// `backfill --manifest MANIFEST ARGS` in project `p`.
fn on(p: &Project, manifest: &Path, args: &[&str]) -> Out {
    let mut all = vec!["--manifest", manifest.to_str().unwrap()];
    all.extend_from_slice(args);
    p.run(&all)
}

#[test]
fn a_warehouse_given_as_the_manifest_is_refused_and_left_as_it_was() {
    let p = shop().sqlite();
    p.run(THREE_DAYS).code(0);
    let warehouse = p.path("warehouse.db");
    let (bytes, before) = (std::fs::read(&warehouse).unwrap(), dump(&warehouse));
    let refused = format!(
        "error: {} is not a backfill manifest: it holds the tables raw_orders, daily_orders, orders_fact, monthly_revenue; give the manifest's own path (--manifest, BACKFILL_MANIFEST or `manifest` in backfill.toml)\n",
        warehouse.display()
    );
    for args in [THREE_DAYS, &["list"], &["show", "1"], &["resume", "1"]] {
        let out = on(&p, &warehouse, args);
        out.code(2);
        assert_eq!(out.stderr, refused, "{args:?}");
    }
    assert_eq!(dump(&warehouse), before, "its tables and rows as before");
    assert_eq!(
        std::fs::read(&warehouse).unwrap(),
        bytes,
        "not a byte changed"
    );
    // The project's own manifest is still the one that recorded the backfill.
    p.run(&["show", "1"]).code(0).stdout_has("2026-09-03");
}

#[test]
fn a_foreign_database_in_place_of_the_manifest_is_refused_and_left_as_it_was() {
    let p = shop().sqlite();
    std::fs::create_dir_all(p.path(".backfill")).unwrap();
    let manifest = p.manifest_path();
    // Another program's database, and one that another program marked as its own.
    for (setup, holds) in [
        (
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('keep me');",
            "it holds the table notes",
        ),
        (
            "PRAGMA application_id = 1196444487; CREATE TABLE gpkg_contents (x);",
            "it is marked as another program's file (application_id 0x47504b47) and it holds the table gpkg_contents",
        ),
    ] {
        let _ = std::fs::remove_file(&manifest);
        Connection::open(&manifest)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
        let before = dump(&manifest);
        for args in [THREE_DAYS, &["list"]] {
            p.run(args).code(2).stderr_has(&format!(
                "error: {} is not a backfill manifest: {holds}; give the manifest's own path",
                manifest.display()
            ));
        }
        assert_eq!(dump(&manifest), before, "left as it was");
        assert!(
            !p.path(".backfill/logs").exists(),
            "nothing ran: no interval's log"
        );
    }
}

#[test]
fn an_emptied_manifest_is_refused_where_the_project_has_a_history() {
    let p = shop().sqlite();
    p.run(THREE_DAYS).code(0);
    // A disk that filled up, a bad restore, a `> manifest.db`.
    std::fs::write(p.manifest_path(), "").unwrap();
    let refused = format!(
        "error: manifest {}: the file is empty (0 bytes), but this project recorded backfills before ({} holds what they left): the manifest that recorded them was emptied or lost. Restore it from a backup; or, to start a new record knowingly (every interval then runs again), remove the empty file\n",
        p.manifest_path().display(),
        p.path(".backfill/logs").display()
    );
    for args in [THREE_DAYS, &["list"], &["show", "1"]] {
        let out = p.run(args);
        out.code(2);
        assert_eq!(out.stderr, refused, "{args:?}");
    }
    assert_eq!(
        std::fs::metadata(p.manifest_path()).unwrap().len(),
        0,
        "left as it was"
    );
    // Removed knowingly, a new record starts and every interval runs again.
    std::fs::remove_file(p.manifest_path()).unwrap();
    p.run(THREE_DAYS).code(0).stderr_has("3 to run, 0 skipped");
    assert_eq!(application_id(&p.manifest_path()), MARK);
    // An empty file with no history is a new manifest (`touch manifest.db`).
    let q = shop().sqlite();
    std::fs::create_dir_all(q.path(".backfill")).unwrap();
    std::fs::write(q.manifest_path(), "").unwrap();
    q.run(&["list"]).code(0).stderr_has("no backfills yet");
    q.run(THREE_DAYS).code(0).stderr_has("3 to run, 0 skipped");
}

#[test]
fn a_new_manifest_is_marked_and_an_old_one_is_marked_when_it_is_upgraded() {
    let p = Project::new().sqlite().dag(
        "daily",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    std::fs::create_dir_all(p.path(".backfill")).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifest-v1.db");
    assert_eq!(application_id(&fixture), 0, "written before the mark");
    std::fs::copy(&fixture, p.manifest_path()).unwrap();
    p.run(&["show", "1"]).code(0);
    assert_eq!(application_id(&p.manifest_path()), MARK);
    p.create("daily", "2026-01-04", "2026-01-04", &[]).code(0);
    assert_eq!(application_id(&p.manifest_path()), MARK);
    assert_eq!(p.count("SELECT COUNT(*) FROM backfills"), 2);
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_schema_of_the_manifests_name_that_is_not_one_is_refused_and_left_as_it_was() {
    let cluster = crate::pg::shared();
    let db = cluster.create_db();
    let url = cluster.url(&db);
    cluster.psql(
        &db,
        "CREATE SCHEMA backfill_manifest;
         CREATE TABLE backfill_manifest.notes (id int, body text);
         INSERT INTO backfill_manifest.notes VALUES (1, 'keep me');",
    );
    let tables = "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = 'backfill_manifest'";
    let p = Project::new().dag(
        "daily",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let create = [
        "--manifest",
        &url,
        "create",
        "--dag",
        "daily",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    for args in [&create[..], &["--manifest", &url, "list"]] {
        p.run(args).code(2).stderr_has(
            "is not a backfill manifest: its schema `backfill_manifest` has no `schema_version` table, and it holds the table notes; give the manifest's own database, or rename that schema",
        );
    }
    assert_eq!(cluster.psql(&db, tables), "notes", "nothing installed");
    assert_eq!(
        cluster.psql(&db, "SELECT body FROM backfill_manifest.notes"),
        "keep me"
    );
    // An empty schema of that name is the manifest's to make.
    cluster.psql(&db, "DROP TABLE backfill_manifest.notes");
    p.run(&create).code(0);
    assert_eq!(
        cluster.psql(&db, "SELECT COUNT(*) FROM backfill_manifest.backfills"),
        "1"
    );
}

/// Where `p`'s manifest is, as `--manifest` takes it: its file, or its database's URL.
fn manifest_of(p: &Project) -> String {
    match p.manifest_db() {
        Some(db) => crate::pg::shared().url(db),
        None => p.manifest_path().display().to_string(),
    }
}

/// A project's name when backfill.toml does not give one: its folder's.
fn folder_name(p: &Project) -> String {
    p.path("backfill.toml")
        .parent()
        .and_then(Path::file_name)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn two_projects_sharing_a_manifest_refuse_each_others_backfills_naming_both() {
    let (alpha, beta) = (shop(), shop());
    let (a, b) = (folder_name(&alpha), folder_name(&beta));
    let shared = manifest_of(&alpha);
    alpha.run(THREE_DAYS).code(0);
    alpha
        .create(
            "daily_orders",
            "2026-09-04",
            "2026-09-04",
            &["--stage", "-q"],
        )
        .code(0);
    let before = alpha.dump();
    let beta_warehouse = std::fs::read(beta.path("warehouse.db")).unwrap();
    let on_shared = |p: &Project, args: &[&str]| {
        let mut all = vec!["--manifest", shared.as_str()];
        all.extend_from_slice(args);
        p.run(&all)
    };
    let theirs = |project: &str, p: &Project, notes: &str| {
        format!(
            "`{project}` ({notes}warehouse shop: {})",
            p.path("warehouse.db").display()
        )
    };
    let ours = |project: &str, p: &Project| {
        format!(
            "`{project}` (its folder's name: backfill.toml sets no `project`; warehouse shop: {})",
            p.path("warehouse.db").display()
        )
    };
    // Planning over the other project's runs: what `already exists` is not in this warehouse.
    let dag_refused = format!(
        "error: DAG `daily_orders` in the manifest {shared} belongs to project {}, not to this one, {}: what its runs there recorded (the intervals that `already exist`, those in flight) is not this project's. Rename this project's DAG (its `id`); give each project a manifest of its own (`manifest` in backfill.toml, or BACKFILL_MANIFEST); or, if both folders hold one project (its checkouts on several hosts), give them one name: `project = \"{a}\"` in the backfill.toml of each\n",
        theirs(&a, &alpha, "2 backfills, 1 to 2; "),
        ours(&b, &beta)
    );
    for args in [
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-05",
        ][..],
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-05",
            "--dry-run",
        ],
        &[
            "rollback",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-01",
        ],
    ] {
        let out = on_shared(&beta, args);
        out.code(2);
        assert_eq!(out.stderr, dag_refused, "{args:?}");
    }
    // The other project's backfills: neither resumed, joined, cancelled, promoted nor
    // discarded here.
    for (verb, id) in [
        ("resume", "1"),
        ("join", "1"),
        ("cancel", "1"),
        ("promote", "2"),
        ("discard", "2"),
    ] {
        let out = on_shared(&beta, &[verb, id]);
        out.code(2);
        assert_eq!(
            out.stderr,
            format!(
                "error: backfill {id} belongs to project {}, not to this one, {}: two projects share the manifest {shared}. Run `backfill {verb} {id}` from that project's folder; give each project a manifest of its own (`manifest` in backfill.toml, or BACKFILL_MANIFEST); or, if both folders hold one project (its checkouts on several hosts), give them one name: `project = \"{a}\"` in the backfill.toml of each\n",
                theirs(&a, &alpha, ""),
                ours(&b, &beta)
            ),
            "{verb}"
        );
    }
    assert_eq!(alpha.dump(), before, "nothing written to the manifest");
    assert_eq!(
        std::fs::read(beta.path("warehouse.db")).unwrap(),
        beta_warehouse,
        "nor to the second project's warehouse"
    );
    // A DAG the other project never ran is this one's; and then the other refuses it in turn.
    on_shared(
        &beta,
        &[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-01",
        ],
    )
    .code(0);
    let out = alpha.create("orders_fact", "2026-09-01", "2026-09-02", &[]);
    out.code(2).stderr_has(&format!(
        "error: DAG `orders_fact` in the manifest {shared} belongs to project {}, not to this one, {}",
        theirs(&b, &beta, "backfill 3; "),
        ours(&a, &alpha)
    ));
    // Named alike (one project, two checkouts), they share it.
    beta.write(
        "backfill.toml",
        &format!("project = \"{a}\"\n{}", beta.read("backfill.toml")),
    );
    on_shared(&beta, &["resume", "1"]).code(0);
}

/// A copy of a project of DAG `c` (a command task) in folder `name` of `parent`, with
/// `backfill.toml` holding `toml`.
fn checkout(parent: &Path, name: &str, toml: &str) -> std::path::PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("dags")).unwrap();
    std::fs::write(dir.join("backfill.toml"), toml).unwrap();
    std::fs::write(
        dir.join("dags/c.toml"),
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"echo {{ ds }} >> ../done.txt\"\n",
    )
    .unwrap();
    dir
}

/// `backfill -C dir ARGS` on the manifest at `url`.
fn on_host(dir: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
        .arg("-C")
        .arg(dir)
        .args(["--manifest", url])
        .args(args)
        .env("BACKFILL_NOW", crate::support::NOW)
        .env_remove("BACKFILL_MANIFEST")
        .envs(env.iter().copied())
        .output()
        .expect("run backfill");
    Out::of(&out)
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn one_project_checked_out_on_two_hosts_shares_a_postgresql_manifest() {
    let cluster = crate::pg::shared();
    let db = cluster.create_db();
    let url = cluster.url(&db);
    // Two checkouts of one project, in different places: the same folder name, or, in a folder
    // of another name, the project named in backfill.toml.
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cron = checkout(one.path(), "etl", "");
    let ci = checkout(two.path(), "etl", "");
    let runner = checkout(two.path(), "build-7", "project = \"etl\"\n");
    fn days<'a>(from: &'a str, to: &'a str) -> Vec<&'a str> {
        vec!["create", "--dag", "c", "--from", from, "--to", to]
    }
    on_host(&cron, &url, &days("2026-01-01", "2026-01-02"), &[]).code(0);
    // The second checkout skips what the first did, and runs the rest.
    on_host(&ci, &url, &days("2026-01-01", "2026-01-04"), &[])
        .code(0)
        .stderr_has("4 intervals, 2 to run, 2 skipped");
    // A backfill whose owner died on one host is resumed from another.
    on_host(
        &ci,
        &url,
        &days("2026-01-05", "2026-01-06"),
        &[("BACKFILL_FAULT", "after-plan:abort")],
    );
    on_host(&runner, &url, &["resume", "3"], &[])
        .code(0)
        .stderr_has("resuming backfill 3 of c: 2 intervals left to run");
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT string_agg(DISTINCT project, ',') FROM backfill_manifest.backfills"
        ),
        "etl"
    );
    // A checkout in a folder of another name that does not name the project is another.
    let stray = checkout(two.path(), "build-8", "");
    on_host(&stray, &url, &days("2026-01-01", "2026-01-07"), &[])
        .code(2)
        .stderr_has("belongs to project `etl` (3 backfills, 1 to 3), not to this one, `build-8` (its folder's name: backfill.toml sets no `project`)");
}

#[test]
fn a_manifest_of_the_previous_schema_gains_the_project_and_its_backfills_are_anyones() {
    let (alpha, beta) = (shop().sqlite(), shop().sqlite());
    // A backfill whose owner died once it was planned.
    alpha.run_with(THREE_DAYS, &[("BACKFILL_FAULT", "after-plan:abort")]);
    // As the previous schema left it: no project recorded, no mark.
    alpha.exec(
        "DROP VIEW report_backfills; DROP VIEW report_runs; DROP VIEW report_tries; DROP VIEW report_published;
         ALTER TABLE backfills DROP COLUMN project; ALTER TABLE backfills DROP COLUMN warehouses;
         ALTER TABLE backfills DROP COLUMN owner_start; ALTER TABLE workers DROP COLUMN start;
         ALTER TABLE task_tries DROP COLUMN rows_inserted; ALTER TABLE task_tries DROP COLUMN rows_updated;
         ALTER TABLE task_tries DROP COLUMN rows_deleted; ALTER TABLE task_tries DROP COLUMN rows_unchanged;
         ALTER TABLE backfills DROP COLUMN atomic; DROP VIEW report_forgets; DROP TABLE forgets; DROP TABLE pool_starts;
         DROP VIEW report_readiness; DROP TABLE readiness; ALTER TABLE backfills DROP COLUMN wait_ready;
         ALTER TABLE backfills DROP COLUMN require_ready;
         PRAGMA user_version = 11; PRAGMA application_id = 0;",
    );
    let shared = alpha.manifest_path();
    // A backfill recorded before is anyone's: the second project may resume it.
    on(&beta, &shared, &["resume", "1"])
        .code(0)
        .stderr_has("3 succeeded");
    assert_eq!(
        alpha.count("PRAGMA user_version"),
        backfill::manifest::MIGRATIONS.last().unwrap().0
    );
    assert_eq!(application_id(&shared), MARK);
    assert_eq!(
        alpha.rows("SELECT id, project, warehouses FROM backfills"),
        [["1", "NULL", "NULL"]]
    );
    // The first backfill recorded with a project makes the DAG that project's.
    on(
        &beta,
        &shared,
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-04",
            "--to",
            "2026-09-04",
        ],
    )
    .code(0);
    assert_eq!(
        alpha.rows("SELECT id, project FROM backfills ORDER BY id"),
        [
            ["1".to_string(), "NULL".to_string()],
            ["2".to_string(), folder_name(&beta)]
        ]
    );
    alpha
        .create("daily_orders", "2026-09-05", "2026-09-05", &[])
        .code(2)
        .stderr_has(&format!(
            "belongs to project `{}` (backfill 2;",
            folder_name(&beta)
        ));
}

#[test]
fn a_manifest_whose_upgrade_fails_says_why_not_that_it_cannot_be_written() {
    let p = shop().sqlite();
    p.create("daily_orders", "2026-09-01", "2026-09-01", &[])
        .code(0);
    // Said to be older than the newest migration that makes a table, with that table already
    // there: the migration cannot run.
    let making = backfill::manifest::MIGRATIONS
        .iter()
        .rev()
        .find(|m| m.1.contains("CREATE TABLE"))
        .unwrap()
        .0;
    p.exec(&format!("PRAGMA user_version = {};", making - 1));
    p.run(&["list"]).code(1).stderr_has("already exists");
    assert!(!p.run(&["list"]).stderr.contains("cannot be written"));
}
