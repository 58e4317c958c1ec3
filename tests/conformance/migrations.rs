//! Upgrades: a manifest of every earlier schema version opens at the latest and keeps every row
//! and value it held; the released first version's file too.

use std::path::{Path, PathBuf};

use backfill::manifest::{self, Error};
use backfill::plan::Reprocess;
use backfill::state::{BackfillKind, BackfillState};
use rusqlite::types::Value;
use serde_json::json;

use crate::support::*;

/// What the first schema holds, written in the SQL both engines take: a finished backfill with
/// a plan (a run and a skip), a failed run and its try; a running backfill with a lease.
fn seed() -> String {
    let (s0, s1, s2, s5) = (start(0), start(1), start(2), start(5));
    format!(
        "INSERT INTO backfills (dag_id, from_arg, to_arg, range_start, range_end,
             reprocess_behavior, max_active_runs, run_backwards, allow_drift, conf, state,
             owner_pid, owner_host, heartbeat_at, cancel_requested, created_at, finished_at)
         VALUES ('daily', '2026-01-01', '2026-01-02', {s0}, {s2}, 'failed', 2, 1, 1, '{{\"k\": 1}}',
                 'completed', 123, 'old-host', 1000, 0, 900, 1100);
         INSERT INTO backfills (dag_id, from_arg, to_arg, range_start, range_end,
             reprocess_behavior, max_active_runs, run_backwards, state, owner_pid, owner_host,
             heartbeat_at, created_at)
         VALUES ('daily', 'a', 'b', {s5}, {s5} + 86400, 'none', 1, 0, 'running', 124, 'old-host',
                 1200, 1150);
         INSERT INTO plan (backfill_id, ord, interval_start, interval_end, action, reason)
         VALUES (1, 0, {s1}, {s2}, 'run', NULL), (1, 1, {s0}, {s1}, 'skip', 'already exists');
         INSERT INTO runs (backfill_id, dag_id, interval_start, interval_end, state, started_at,
             ended_at, error)
         VALUES (1, 'daily', {s1}, {s2}, 'failed', 950, 990, 'boom');
         INSERT INTO task_tries (run_id, task_id, try_number, state, started_at, ended_at, pgid,
             host, exit_code, error, log_path, rows, partitions, inputs, fingerprint, source_rows,
             previous_rows, verdict, reasons)
         VALUES (1, 't', 1, 'rejected', 951, 989, 77, 'old-host', 2, 'exit code 2', '/logs/x', 3,
                 '[\"p\"]', '[{{\"i\": 1}}]', 'fp', 4, 5, 'rejected', 'rows: 3 < 4');
         INSERT INTO leases (dag_id, interval_start, backfill_id, run_id, pid, host, heartbeat_at)
         VALUES ('daily', {s5}, 2, NULL, 124, 'old-host', 1200);"
    )
}

/// The first schema's columns of each table, and the order that reads them.
const FIRST: &[(&str, &str, &str)] = &[
    (
        "backfills",
        "id, dag_id, from_arg, to_arg, range_start, range_end, reprocess_behavior, max_active_runs, run_backwards, allow_drift, conf, state, owner_pid, owner_host, heartbeat_at, cancel_requested, created_at, finished_at",
        "id",
    ),
    (
        "plan",
        "backfill_id, ord, interval_start, interval_end, action, reason",
        "backfill_id, ord",
    ),
    (
        "runs",
        "id, backfill_id, dag_id, interval_start, interval_end, state, started_at, ended_at, error",
        "id",
    ),
    (
        "task_tries",
        "id, run_id, task_id, try_number, state, started_at, ended_at, pgid, host, exit_code, error, log_path, rows, partitions, inputs, fingerprint, source_rows, previous_rows, verdict, reasons",
        "id",
    ),
    (
        "leases",
        "dag_id, interval_start, backfill_id, run_id, pid, host, heartbeat_at",
        "dag_id, interval_start",
    ),
];

/// The first schema's tables as `read` gives them.
fn first_tables(read: impl Fn(&str) -> Vec<Vec<Value>>) -> Vec<Vec<Vec<Value>>> {
    FIRST
        .iter()
        .map(|(table, columns, order)| {
            read(&format!("SELECT {columns} FROM {table} ORDER BY {order}"))
        })
        .collect()
}

/// CHECK constraints that SQLite's migration 4 widens (as `manifest::WIDENED_CHECKS` does):
/// a file released at version 4 or later had them widened.
const WIDENED: &[(&str, &str)] = &[
    (
        "CHECK (reprocess_behavior IN ('none', 'failed', 'completed'))",
        "CHECK (reprocess_behavior IN ('none', 'failed', 'completed', 'changed'))",
    ),
    (
        "CHECK (state IN ('running', 'completed', 'failed', 'cancelled'))",
        "CHECK (state IN ('running', 'completed', 'failed', 'cancelled', 'staged'))",
    ),
];

/// A SQLite manifest of schema `version`, as the release of that version left it: its
/// migrations applied in order, each setting `user_version`.
fn sqlite_at(path: &Path, version: i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "synchronous", "OFF").unwrap();
    conn.execute_batch("BEGIN").unwrap();
    for (v, sql) in manifest::MIGRATIONS.iter().filter(|m| m.0 <= version) {
        conn.execute_batch(sql).unwrap();
        if *v == 4 {
            let schema: i64 = conn
                .pragma_query_value(None, "schema_version", |r| r.get(0))
                .unwrap();
            conn.pragma_update(None, "writable_schema", true).unwrap();
            for (old, new) in WIDENED {
                let changed = conn
                    .execute(
                        "UPDATE sqlite_schema SET sql = replace(sql, ?1, ?2)
                         WHERE type = 'table' AND name = 'backfills'",
                        [old, new],
                    )
                    .unwrap();
                assert_eq!(changed, 1);
            }
            conn.pragma_update(None, "schema_version", schema + 1)
                .unwrap();
            conn.pragma_update(None, "writable_schema", false).unwrap();
        }
        conn.pragma_update(None, "user_version", v).unwrap();
    }
    conn.execute_batch(&seed()).unwrap();
    conn.execute_batch("COMMIT").unwrap();
}

/// A PostgreSQL manifest of schema `version` in database `db`, as the release of that version
/// made it: the schema, its version table, its migrations in order.
fn postgres_at(db: &str, version: i64) {
    let mut sql = format!(
        "CREATE SCHEMA {0}; SET search_path = {0}, pg_catalog;
         CREATE TABLE schema_version (version bigint NOT NULL);\n",
        manifest::postgres::SCHEMA
    );
    for (_, migration) in manifest::postgres::MIGRATIONS
        .iter()
        .filter(|m| m.0 <= version)
    {
        sql.push_str(migration);
        sql.push('\n');
    }
    sql.push_str(&format!("INSERT INTO schema_version VALUES ({version});\n"));
    sql.push_str(&seed());
    crate::pg::shared().psql(db, &sql);
}

fn latest(kind: Kind) -> i64 {
    match kind {
        Kind::Sqlite => manifest::MIGRATIONS.last().unwrap().0,
        Kind::Postgres => manifest::postgres::MIGRATIONS.last().unwrap().0,
    }
}

/// A manifest of every earlier schema version opens at the latest: what it held is kept, row
/// for row and value for value; what later versions added reads as the defaults of a backfill
/// recorded before them; reads see it as the program does; and it takes new records, numbered
/// after the old ones. Before the upgrade a read-only open says it is outdated.
pub fn every_earlier_schema_upgrades_and_keeps_its_rows(kind: Kind) {
    for version in 1..latest(kind) {
        let (location, dir) = match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("manifest.db");
                sqlite_at(&path, version);
                (path, Some(dir))
            }
            Kind::Postgres => {
                let db = crate::pg::shared().create_db();
                postgres_at(&db, version);
                (PathBuf::from(crate::pg::shared().url(&db)), None)
            }
        };
        let before = first_tables(|sql| raw(kind, &location, sql));
        match manifest::open_read_only(&location) {
            Err(Error::Outdated { found, known, .. }) => {
                assert_eq!((found, known), (version, latest(kind)))
            }
            other => panic!("version {version}: {:?}", other.map(|_| ())),
        }
        let m = Engine::open(kind, location, dir);
        assert_eq!(m.schema_version(), latest(kind), "from version {version}");
        if kind == Kind::Sqlite {
            assert_eq!(
                m.int("PRAGMA application_id"),
                i64::from(manifest::ours::APPLICATION_ID),
                "marked as a manifest"
            );
        }
        assert_eq!(
            first_tables(|sql| m.rows(sql)),
            before,
            "from version {version}"
        );
        upgraded_reads(&m, version);
    }
}

/// Every row of `sql` on a manifest of `kind` at `location`, opened by nothing of the program.
fn raw(kind: Kind, location: &Path, sql: &str) -> Vec<Vec<Value>> {
    match kind {
        Kind::Sqlite => sqlite_rows(location, sql),
        Kind::Postgres => {
            let shown = location.to_string_lossy().into_owned();
            manifest::postgres::Session::connect(&shown, &shown, true)
                .unwrap()
                .query(sql, &[])
                .unwrap()
        }
    }
}

/// What the program reads of the seeded record once upgraded, and that it writes on.
fn upgraded_reads(m: &Engine, version: i64) {
    let r = m.read();
    assert!(!r.identity().unwrap().is_empty());
    let b = r.backfill(1).unwrap().unwrap();
    assert_eq!(
        (
            b.dag_id.as_str(),
            b.from_arg.as_str(),
            b.to_arg.as_str(),
            b.range_start,
            b.range_end
        ),
        ("daily", "2026-01-01", "2026-01-02", start(0), start(2))
    );
    assert_eq!(
        (
            b.reprocess,
            b.max_active_runs,
            b.run_backwards,
            b.allow_drift,
            b.conf.as_str()
        ),
        (Reprocess::Failed, 2, true, true, r#"{"k": 1}"#)
    );
    assert_eq!(
        (
            b.state,
            b.owner_pid,
            b.owner_host.as_deref(),
            b.heartbeat_at,
            b.cancel_requested
        ),
        (
            BackfillState::Completed,
            Some(123),
            Some("old-host"),
            Some(1000),
            false
        )
    );
    assert_eq!((b.created_at, b.finished_at), (900, Some(1100)));
    // What later versions added: a backfill recorded before them.
    assert_eq!(
        (b.epoch, b.planning, b.kind, b.source_backfill),
        (0, false, BackfillKind::Run, None)
    );
    assert_eq!(
        (&b.tasks, b.max_failures, &b.cascade, b.cascade_of),
        (&None, None, &None, None)
    );
    assert_eq!(
        (b.sample, &b.definition, b.batch_size, &b.project),
        (None, &None, None, &None)
    );
    assert_eq!(
        (&b.warehouses, b.owner_start, b.atomic),
        (&None, None, false)
    );
    assert!(!r.has_workers(1).unwrap());

    let show = serde_json::to_value(r.show_backfill(1).unwrap().unwrap().interval_details).unwrap();
    assert_eq!(
        show,
        json!([
            {"ord": 0, "start": rfc(1), "end": rfc(2), "action": "run", "reason": null,
             "state": "failed", "attempts": 1, "tries": 1, "rows": null, "rejected_rows": 3,
             "verdict": "rejected",
             "reasons": "rows: 3 < 4", "duration_ms": 40, "error": "boom", "log": null,
             "host": "old-host"},
            {"ord": 1, "start": rfc(0), "end": rfc(1), "action": "skip",
             "reason": "already exists", "state": null, "attempts": 0, "tries": 0, "rows": null,
             "verdict": null, "reasons": null, "duration_ms": null, "error": null, "log": null}
        ]),
        "from version {version}"
    );
    let tries = serde_json::to_value(r.interval_tries(1, start(1)).unwrap()).unwrap();
    assert_eq!(
        tries,
        json!([{
            "run_id": 1, "run_state": "failed", "try_id": 1, "task": "t", "try_number": 1,
            "state": "rejected", "host": "old-host", "started_at": rfc_ms(951),
            "duration_ms": 38, "rows": 3, "changes": null, "source_rows": 4,
            "previous_rows": 5, "verdict": "rejected", "reasons": "rows: 3 < 4",
            "error": "exit code 2", "log": "/logs/x", "batch": null
        }])
    );
    let judge = other();
    assert!(r.holds_lease(2, "daily", start(5)).unwrap());
    assert_eq!(r.stale_leases("daily", &judge).unwrap(), [(start(5), 2)]);
    assert_eq!(
        r.state_before("daily", start(2)).unwrap(),
        Some(backfill::plan::RunState::Failed)
    );

    // It records on, numbered after what it held.
    let owner = planned_days(m, request("daily"), [3], &alive());
    assert_eq!(owner.backfill_id, 3);
    let (run, t) = start_run(m, owner, "daily", 3, "t");
    assert_eq!((run, t), (2, 2));
    // The old owner is recovered as any gone owner.
    let c = judge.clone();
    assert!(m.ok(move |s| s.take_ownership(2, &c, false)).is_some());
}

/// The SQLite file the first release wrote (`tests/fixtures/manifest-v1.db`) opens at the
/// latest schema with every row it held.
#[test]
fn the_first_releases_sqlite_file_upgrades() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest.db");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifest-v1.db");
    std::fs::copy(&fixture, &path).unwrap();
    let before = first_tables(|sql| sqlite_rows(&path, sql));
    assert_eq!(before[0].len(), 1);
    assert_eq!(before[2].len(), 3);
    let m = Engine::open(Kind::Sqlite, path, Some(dir));
    assert_eq!(m.schema_version(), latest(Kind::Sqlite));
    assert_eq!(first_tables(|sql| m.rows(sql)), before);
    let show = m.read().show_backfill(1).unwrap().unwrap();
    let c = &show.backfill.intervals;
    assert_eq!((c.total, c.succeeded, c.failed, c.pending), (3, 2, 1, 0));
    assert_eq!(show.backfill.state, BackfillState::Failed);
    assert_eq!(
        show.interval_details[1].error.as_deref(),
        Some("task `t` failed: exit code 1")
    );
}

/// The flags and documents a manifest keeps, upgraded from the version before they were
/// converted: `boolean` and `json` on PostgreSQL (a team's query reads `WHERE NOT
/// run_backwards` and `conf ->> 'k'`), their values kept, a try's verdict checked; the
/// program's statements compare flags with TRUE and FALSE, and the index of the tries not yet
/// finished still serves such a query on both engines.
pub fn flags_are_booleans_documents_json_and_the_unfinished_tries_index_serves(kind: Kind) {
    const FLAGS: &[(&str, &str)] = &[
        ("backfills", "allow_drift"),
        ("backfills", "atomic"),
        ("backfills", "cancel_requested"),
        ("backfills", "planning"),
        ("backfills", "require_ready"),
        ("backfills", "run_backwards"),
        ("task_tries", "publishing"),
    ];
    const DOCUMENTS: &[(&str, &str)] = &[
        ("backfills", "conf"),
        ("backfills", "definition"),
        ("backfills", "tasks"),
        ("backfills", "warehouses"),
        ("task_tries", "inputs"),
        ("task_tries", "partitions"),
    ];
    const UNFINISHED: &str = "SELECT id FROM task_tries
         WHERE run_id = 1 AND (state = 'running' OR publishing = TRUE)";
    let before = latest(kind) - 1;
    match kind {
        Kind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("manifest.db");
            sqlite_at(&path, before);
            let m = Engine::open(kind, path.clone(), Some(dir));
            let plan = sqlite_rows(&path, &format!("EXPLAIN QUERY PLAN {UNFINISHED}"));
            assert!(
                format!("{plan:?}").contains("USING INDEX task_tries_unfinished"),
                "{plan:?}"
            );
            assert_eq!(
                m.rows("SELECT run_backwards, allow_drift, planning FROM backfills ORDER BY id"),
                vec![
                    vec![Value::Integer(1), Value::Integer(1), Value::Integer(0)],
                    vec![Value::Integer(0), Value::Integer(0), Value::Integer(0)]
                ]
            );
        }
        Kind::Postgres => {
            let cluster = crate::pg::shared();
            let db = cluster.create_db();
            postgres_at(&db, before);
            // A document that is not JSON (as no release wrote, a hand-edited manifest might),
            // and a team's read-only role that reads the views.
            let reader = format!("reader_{db}");
            cluster.psql(
                &db,
                &format!(
                    "UPDATE backfill_manifest.backfills SET definition = 'not json' WHERE id = 2;
                     CREATE ROLE {reader};
                     GRANT USAGE ON SCHEMA backfill_manifest TO {reader};
                     GRANT SELECT ON backfill_manifest.report_backfills,
                                     backfill_manifest.report_runs TO {reader};"
                ),
            );
            let m = Engine::open(kind, PathBuf::from(cluster.url(&db)), None);
            // The view made again is granted again; the view for people keeps `tasks` as text.
            assert_eq!(
                cluster.psql(
                    &db,
                    &format!(
                        "SELECT has_table_privilege('{reader}', 'backfill_manifest.report_backfills', 'SELECT'),
                                has_table_privilege('{reader}', 'backfill_manifest.report_backfills', 'INSERT'),
                                (SELECT data_type FROM information_schema.columns
                                 WHERE table_name = 'report_backfills' AND column_name = 'tasks')"
                    )
                ),
                "t|f|text"
            );
            assert_eq!(
                cluster.psql(
                    &db,
                    "SELECT count(*) FROM pg_tables WHERE tablename = 'report_backfills_grants'"
                ),
                "0"
            );
            // It is kept as a JSON string; the other documents as they were written.
            assert_eq!(
                m.rows("SELECT id, definition, conf FROM backfills ORDER BY id"),
                vec![
                    vec![
                        Value::Integer(1),
                        Value::Null,
                        Value::Text(r#"{"k": 1}"#.into())
                    ],
                    vec![
                        Value::Integer(2),
                        Value::Text(r#""not json""#.into()),
                        Value::Text("{}".into())
                    ]
                ]
            );
            assert_eq!(
                m.rows("SELECT partitions, inputs FROM task_tries"),
                vec![vec![
                    Value::Text(r#"["p"]"#.into()),
                    Value::Text(r#"[{"i": 1}]"#.into())
                ]]
            );
            let types = cluster.psql(
                &db,
                "SELECT table_name || '.' || column_name || ' ' || data_type
                 FROM information_schema.columns
                 WHERE table_schema = 'backfill_manifest'
                   AND data_type IN ('boolean', 'json') AND table_name NOT LIKE 'report\\_%'
                 ORDER BY 1",
            );
            let mut want: Vec<String> = FLAGS
                .iter()
                .map(|(t, c)| format!("{t}.{c} boolean"))
                .chain(DOCUMENTS.iter().map(|(t, c)| format!("{t}.{c} json")))
                .collect();
            want.sort();
            assert_eq!(types.lines().collect::<Vec<_>>(), want);
            // A team's query, in PostgreSQL's own words; the values are the seed's.
            assert_eq!(
                cluster.psql(
                    &db,
                    "SELECT dag_id || ' ' || from_arg || ' ' || (conf ->> 'k')
                     FROM backfill_manifest.backfills
                     WHERE run_backwards AND allow_drift AND NOT planning AND NOT cancel_requested"
                ),
                "daily 2026-01-01 1"
            );
            let verdicts = cluster.psql(
                &db,
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE conname = 'task_tries_verdict_check'",
            );
            for v in [
                "'published'",
                "'published empty'",
                "'rejected'",
                "'staged'",
                "'rolled back'",
            ] {
                assert!(verdicts.contains(v), "{verdicts}");
            }
            let plan = cluster.psql(
                &db,
                &format!(
                    "SET search_path = backfill_manifest; SET enable_seqscan = off;
                     EXPLAIN {UNFINISHED}"
                ),
            );
            assert!(plan.contains("task_tries_unfinished"), "{plan}");
            // The program reads them as it always did.
            assert_eq!(
                m.rows("SELECT run_backwards, allow_drift, planning FROM backfills ORDER BY id"),
                vec![
                    vec![Value::Integer(1), Value::Integer(1), Value::Integer(0)],
                    vec![Value::Integer(0), Value::Integer(0), Value::Integer(0)]
                ]
            );
        }
    }
}
