//! `manifest copy`: a SQLite manifest's whole record copied into an empty PostgreSQL manifest
//! keeps every row and value, its identity and its ids, and reads the same on both engines.

use std::collections::BTreeSet;
use std::path::Path;

use backfill::liveness::Group;
use backfill::manifest::copy::{self, Refused};
use backfill::manifest::pools::Limits;
use backfill::manifest::publishes::Publication;
use backfill::manifest::readiness::Asked;
use backfill::manifest::{self, Durability, NewBackfill, Reads};
use backfill::plan::{Action, PlanRow, RunState, SkipReason};
use backfill::state::{BackfillKind, BackfillState, ReadyState, StagedState, TryState, Verdict};

use crate::support::*;

/// The tables of the record, each with the order that reads it.
const TABLES: &[(&str, &str)] = &[
    ("backfills", "id"),
    ("plan", "backfill_id, ord"),
    ("workers", "id"),
    ("runs", "id"),
    ("task_tries", "id"),
    ("leases", "dag_id, interval_start"),
    ("published", "dag_id, task_id, interval_start"),
    ("pool_slots", "try_id"),
    ("forgets", "id"),
    ("pool_starts", "pool, at, try_id"),
    ("readiness", "backfill_id, interval_start, task_id"),
    ("identity", "id"),
];

/// A record that fills every table and most columns: a running backfill with a worker, a plan
/// with a skip, runs that succeeded (published, with a full record), failed, and run (a pool
/// slot, a batch); a staged backfill and its promote; a backfill taken over; a rollback's
/// intent.
fn populate(m: &Engine) {
    let ctx = alive();
    let full = NewBackfill {
        project: Some("shop".into()),
        warehouses: Some(r#"{"w": "/w.db"}"#.into()),
        definition: Some(r#"{"t": 1}"#.into()),
        batch_size: Some(2),
        max_failures: Some(3),
        cascade: Some("all".into()),
        sample: Some(4),
        conf: r#"{"x": [1, 2]}"#.into(),
        reprocess: backfill::plan::Reprocess::Completed,
        wait_ready: Some(60_000),
        require_ready: true,
        ..request("d")
    };
    let a = insert(m, full, &ctx);
    let rows = vec![
        (
            0,
            PlanRow {
                interval: day(0),
                action: Action::Run,
            },
        ),
        (
            1,
            PlanRow {
                interval: day(1),
                action: Action::Run,
            },
        ),
        (
            2,
            PlanRow {
                interval: day(2),
                action: Action::Run,
            },
        ),
        (
            3,
            PlanRow {
                interval: day(3),
                action: Action::Run,
            },
        ),
        (
            4,
            PlanRow {
                interval: day(4),
                action: Action::Skip(SkipReason::NotYetComplete),
            },
        ),
    ];
    plan(m, a, "d", rows, &ctx);
    m.ok(move |s| s.mark_planned(a));
    // What readiness checks answered: day 0 ready, day 3 still awaited (its wait just ran
    // out, so that what is left of it reads the same whenever it is read).
    for (d, state, asks, answer, wait_ms) in [
        (0, ReadyState::Ready, 3, Some("1"), 60_000),
        (3, ReadyState::Waiting, 2, None, 1_500),
    ] {
        let asked = Asked {
            dag_id: "d".into(),
            interval: day(d),
            task_id: "t".into(),
            state,
            asks,
            answer: answer.map(String::from),
            waited_ms: 1_500,
            wait_ms,
        };
        m.ok(move |s| s.note_readiness(s.fence(a)?, &asked));
    }
    let c = remote();
    let w = m.ok(move |s| s.join_backfill(1, 2, &c));
    // Day 0: the owner's, published, every field recorded.
    let (r0, t0) = start_run(m, a, "d", 0, "t");
    m.step(move |s| {
        s.set_try_group(
            s.fence(a)?,
            t0,
            Group {
                pgid: 11,
                leader_start: Some(12),
            },
            HERE,
        )
    })
    .unwrap();
    m.ok(move |s| s.set_try_audit(s.fence(a)?, t0, "/audit/0.db"));
    let mut rec = record(TryState::Succeeded);
    rec.exit_code = Some(0);
    rec.rows = Some(42);
    rec.partitions = Some("[1]".into());
    rec.inputs = Some("{}".into());
    rec.fingerprint = Some("fp0".into());
    rec.source_rows = Some(43);
    rec.previous_rows = Some(41);
    rec.verdict = Some(Verdict::Published);
    rec.reasons = Some("warning: w".into());
    rec.source_fingerprint = Some("s0".into());
    rec.batch = Some("b".into());
    (
        rec.rows_inserted,
        rec.rows_updated,
        rec.rows_deleted,
        rec.rows_unchanged,
    ) = (Some(1), Some(2), Some(3), Some(36));
    let intent = rec.clone();
    assert!(m.ok(move |s| s.record_publish_intent(s.fence(a)?, t0, Some("/audit/0.db"), &intent)));
    m.ok(move |s| {
        s.mark_published(
            &Publication {
                try_id: t0,
                dag_id: "d",
                task_id: "t",
                interval: day(0),
                rows: 42,
                fingerprint: Some("fp0"),
            },
            backfill::clock::now_ms(),
        )
    });
    end_run(m, a, (r0, t0), RunState::Succeeded, rec);
    // Days 1 to 3: the worker's batch; day 1 runs with a pool slot; day 2 failed.
    let starts: Vec<i64> = (1..4).map(start).collect();
    let c = remote();
    m.ok(move |s| s.reserve_batch(s.fence(w)?, "d", &starts, 3, &c));
    let (_, t1) = start_run(m, w, "d", 1, "t");
    let c = remote();
    m.ok(move |s| {
        s.take_pool_slot(
            s.fence(w)?,
            "p",
            Limits {
                size: 1,
                rate: Some((5, 60_000)),
            },
            t1,
            &c,
        )
    });
    let (r2, t2) = start_run(m, w, "d", 2, "t");
    let mut failed = record(TryState::Failed);
    failed.error = Some("boom".into());
    failed.exit_code = Some(1);
    end_run(m, w, (r2, t2), RunState::Failed, failed);

    // A staged backfill and its promote.
    let s = planned(
        m,
        NewBackfill {
            kind: BackfillKind::Stage,
            ..request("e")
        },
        1,
        &ctx,
    );
    let (rs, ts) = start_run(m, s, "e", 0, "t");
    let mut staged = record(TryState::Succeeded);
    staged.staged = Some(StagedState::Staged);
    staged.staged_path = Some("/staged/e0".into());
    staged.verdict = Some(Verdict::Staged);
    end_run(m, s, (rs, ts), RunState::Succeeded, staged);
    m.ok(move |st| st.finish_backfill(s, BackfillState::Staged, after(9_000)));
    let promote = NewBackfill {
        kind: BackfillKind::Promote,
        source_backfill: Some(s.backfill_id),
        atomic: true,
        ..request("e")
    };
    let p = planned(m, promote, 1, &ctx);
    let (rp, tp) = start_run(m, p, "e", 0, "t");
    m.ok(move |st| st.set_promoted_from(tp, ts));
    let mut promoted = record(TryState::Succeeded);
    promoted.promoted_from = Some(ts);
    end_run(m, p, (rp, tp), RunState::Succeeded, promoted);
    assert!(m.ok(move |st| st.set_staged(ts, StagedState::Promoted)));
    m.ok(move |st| st.finish_backfill(p, BackfillState::Completed, after(8_000)));

    // A backfill whose owner died, taken over; a rollback that decided to publish.
    let gone = planned(m, request("f"), 2, &dead());
    start_run(m, gone, "f", 0, "t");
    let c = other();
    m.ok(move |st| st.take_ownership(gone.backfill_id, &c, false));
    let rollback = NewBackfill {
        kind: BackfillKind::Rollback,
        tasks: Some(vec!["t".into()]),
        ..request("d")
    };
    let back = planned_days(m, rollback, [5], &ctx);
    let (_, tb) = start_run(m, back, "d", 5, "t");
    let mut rec = record(TryState::Succeeded);
    rec.restored_from = Some(t0);
    rec.restore_key = Some(99);
    rec.verdict = Some(Verdict::RolledBack);
    assert!(m.ok(move |st| st.record_publish_intent(st.fence(back)?, tb, None, &rec)));

    // The newest backfill, of DAG z, forgotten: its ids are not given again.
    let z = planned_days(m, request("z"), [0], &ctx);
    let (rz, tz) = start_run(m, z, "z", 0, "t");
    end_run(
        m,
        z,
        (rz, tz),
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    m.ok(move |st| st.finish_backfill(z, BackfillState::Completed, after(7_000)));
    let forgot = m.ok(move |st| st.forget("z", Default::default(), ("host-a", 7), 1_000));
    let forgot = forgot.expect("nothing of z runs");
    m.ok(move |st| st.finish_forget(forgot.id, 0, 2_000));
}

/// The columns of a table of the record on each engine.
fn columns(m: &Engine, table: &str) -> BTreeSet<String> {
    let rows = match m.kind {
        Kind::Sqlite => m.rows(&format!("SELECT name FROM pragma_table_info('{table}')")),
        Kind::Postgres => m.rows(&format!(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = '{}' AND table_name = '{table}'",
            manifest::postgres::SCHEMA
        )),
    };
    rows.into_iter()
        .map(|r| match &r[0] {
            rusqlite::types::Value::Text(t) => t.clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// What every reader of the program says of a record, as text to compare.
fn read_models(r: &dyn Reads) -> Vec<String> {
    let mut out = vec![
        json(&r.list_backfills(None, false).unwrap()),
        json(&r.figures().unwrap()),
        json(&r.lease_views().unwrap()),
        json(&r.pool_slots().unwrap()),
        format!("{:?}", r.backfill_heads().unwrap()),
        format!("{:?}", r.run_dags().unwrap()),
        format!("{:?}", r.identity().unwrap()),
        format!(
            "{:?}",
            sorted(r.needing_audit_files().unwrap().into_iter().collect())
        ),
        format!(
            "{:?}",
            sorted(r.keeping_staged_tables().unwrap().into_iter().collect())
        ),
        format!("{:?}", r.first_unfinished_try().unwrap()),
    ];
    for (id, _, _) in r.backfill_heads().unwrap() {
        let b = r.backfill(id).unwrap().unwrap();
        out.push(format!("{b:?}"));
        let detail = r.show_backfill(id).unwrap().unwrap();
        out.push(json(&detail));
        let o = r.outcome(id).unwrap().unwrap();
        out.push(format!("{:?}", o.skipped));
        out.push(json(&o.failed));
        out.push(json(&o.warned));
        out.push(format!("{:?}", r.workers(id).unwrap()));
        out.push(format!("{:?}", r.staged_outputs(id).unwrap()));
        let owner = backfill::manifest::backfills::Owner::of(id, b.epoch);
        out.push(format!("{:?}", r.pending_publishes(owner).unwrap()));
        out.push(format!("{:?}", r.unfinished_tries(owner).unwrap()));
        out.push(format!("{:?}", sorted(r.runs_in_progress(owner).unwrap())));
        for d in 0..6 {
            out.push(json(&r.interval_tries(id, start(d)).unwrap()));
        }
    }
    for dag in ["d", "e", "f"] {
        out.push(json(&r.run_history(dag, start(0), start(9)).unwrap()));
        out.push(format!("{:?}", r.dag_projects(dag).unwrap()));
        out.push(format!(
            "{:?}",
            r.published_starts(dag, start(0), start(9)).unwrap()
        ));
        for d in 0..6 {
            out.push(format!(
                "{:?}",
                r.current_publication(dag, "t", start(d)).unwrap()
            ));
        }
    }
    out
}

/// A read model as JSON.
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

/// A SQLite manifest copied into an empty PostgreSQL manifest keeps every table's rows and
/// values (both engines holding the same columns), its identity and its ids; every reader says
/// the same of both; the PostgreSQL manifest numbers new records after the copied ones; a
/// second copy into it is refused, as it holds a record.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_sqlite_manifest_copied_to_postgresql_keeps_every_row_and_value() {
    let from = Engine::sqlite();
    populate(&from);
    let path = from.location.clone();
    let counts: Vec<i64> = TABLES
        .iter()
        .map(|(t, _)| from.int(&format!("SELECT COUNT(*) FROM {t}")))
        .collect();
    assert!(
        counts.iter().all(|&n| n > 0),
        "every table holds rows: {counts:?}"
    );

    let url = crate::pg::shared().create_db_url();
    let sqlite = manifest::open_sqlite(&path, Durability::Normal).unwrap();
    let copied = copy::to_postgres(&sqlite, Path::new(&url))
        .unwrap()
        .unwrap();
    let want: Vec<(&str, usize)> = TABLES[..TABLES.len() - 1]
        .iter()
        .zip(&counts)
        .map(|((t, _), n)| (*t, usize::try_from(*n).unwrap()))
        .collect();
    assert_eq!(copied, want);
    let to = Engine::open(Kind::Postgres, url.clone().into(), None);

    for (table, order) in TABLES {
        let (here, there) = (columns(&from, table), columns(&to, table));
        assert_eq!(
            here, there,
            "the columns of {table} on SQLite and on PostgreSQL"
        );
        let list = here.iter().cloned().collect::<Vec<_>>().join(", ");
        let sql = format!("SELECT {list} FROM {table} ORDER BY {order}");
        assert_eq!(to.rows(&sql), from.rows(&sql), "{table}");
    }
    let (a, b) = (read_models(from.read()), read_models(to.read()));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y);
    }

    // New records are numbered after the copied ones, and after the forgotten ones.
    let max = |t: &str| {
        let last = match t {
            "backfills" => "last_backfill",
            "runs" => "last_run",
            "task_tries" => "last_try",
            "workers" => "last_worker",
            _ => "0",
        };
        from.int(&format!(
            "SELECT max((SELECT MAX(id) FROM {t}), (SELECT MAX({last}) FROM forgets))"
        ))
    };
    assert!(
        max("backfills") > from.int("SELECT MAX(id) FROM backfills"),
        "the newest backfill was forgotten"
    );
    let owner = planned_days(&to, request("g"), [0], &alive());
    assert_eq!(owner.backfill_id, max("backfills") + 1);
    let (run, t) = start_run(&to, owner, "g", 0, "t");
    assert_eq!((run, t), (max("runs") + 1, max("task_tries") + 1));
    let c = other();
    let worker = to.ok(move |s| s.join_backfill(owner.backfill_id, 1, &c));
    assert_eq!(worker.worker, Some(max("workers") + 1));

    // A second copy into a manifest that holds a record is refused, and changes nothing.
    match copy::to_postgres(&sqlite, Path::new(&url)).unwrap() {
        Err(Refused(why)) => assert!(
            why.contains(&format!(
                "already holds a record ({} rows in backfills)",
                counts[0] + 1
            )),
            "{why}"
        ),
        Ok(c) => panic!("copied again: {c:?}"),
    }
    assert_eq!(to.int("SELECT COUNT(*) FROM backfills"), counts[0] + 1);
}
