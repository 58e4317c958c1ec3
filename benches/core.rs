//! Benchmarks of the pure and storage hot spots: schedule expansion, planning against a large
//! manifest, and the gate over an audit table. Run with `cargo bench`; the whole-process figures
//! (orchestration overhead, `show`, dry runs) come from `examples/bench/overhead.sh`.

use std::hint::black_box;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use criterion::{Criterion, criterion_group, criterion_main};

use backfill::gate::{self, Measures, Rules};
use backfill::interval::{DataInterval, MAX_INTERVALS, Range, expand};
use backfill::manifest::leases::{self, LeaseCtx};
use backfill::manifest::{self, Durability, NewBackfill, backfills, plans, runs};
use backfill::plan::{self, Action, Options, Reprocess, RunState};
use backfill::project::{Gate, Literal, Rule, RuleKind, Severity, SqlTask, Warehouse};
use backfill::schedule::Schedule;
use backfill::warehouse::{self, Binds};

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn ten_years() -> Range {
    Range {
        start: utc("2016-01-01T00:00:00Z"),
        end_exclusive: utc("2026-01-01T00:00:00Z"),
    }
}

fn schedules(c: &mut Criterion) {
    let mut g = c.benchmark_group("expand");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    let berlin: Tz = "Europe/Berlin".parse().unwrap();
    for (name, expr, tz) in [
        ("hourly_utc_10y", "@hourly", Tz::UTC),
        ("hourly_berlin_10y", "@hourly", berlin),
        ("daily_berlin_10y", "@daily", berlin),
        ("weekdays_0315_berlin_10y", "15 3 * * 1-5", berlin),
    ] {
        let s = Schedule::parse(expr, tz).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| black_box(expand(&s, ten_years(), MAX_INTERVALS).unwrap()).len())
        });
    }
    g.finish();
}

/// A manifest holding a succeeded run for every hourly interval of ten years.
fn large_manifest(dir: &std::path::Path, intervals: &[DataInterval]) -> manifest::db::Conn {
    let conn = manifest::open(&dir.join("manifest.db"), Durability::Normal).unwrap();
    let ctx = LeaseCtx::new(Duration::from_secs(30), &backfill::process::LOCAL);
    conn.execute_batch("BEGIN").unwrap();
    let rows: Vec<plan::PlanRow> = intervals
        .iter()
        .map(|i| plan::PlanRow {
            interval: *i,
            action: Action::Run,
        })
        .collect();
    let request = NewBackfill {
        dag_id: "hourly".into(),
        from_arg: "2016-01-01".into(),
        to_arg: "2025-12-31".into(),
        range_start: 0,
        range_end: 0,
        reprocess: Reprocess::None,
        max_active_runs: 8,
        run_backwards: false,
        allow_drift: false,
        conf: "{}".into(),
        kind: backfill::state::BackfillKind::Run,
        source_backfill: None,
        tasks: None,
        cascade: None,
        cascade_of: None,
        sample: None,
        definition: None,
        batch_size: None,
        max_failures: None,
        project: None,
        warehouses: None,
        atomic: false,
        wait_ready: None,
        require_ready: false,
    };
    let owner = backfills::insert(&conn, &request, &ctx).unwrap();
    let owner = backfills::fence(&conn, owner).unwrap();
    let ordered: Vec<(i64, plan::PlanRow)> = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| (i as i64, r))
        .collect();
    plans::insert_chunk(&conn, owner, "hourly", &ordered, &ctx).unwrap();
    for i in intervals {
        let runs::Start::Run(run) = runs::start_run(&conn, owner, "hourly", *i, 0, 30_000).unwrap()
        else {
            panic!("the run of {i:?} did not start");
        };
        let end = backfill::clock::End {
            now_ms: 1,
            elapsed_ms: None,
        };
        runs::finish_run(&conn, owner, run, RunState::Succeeded, None, end).unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    conn
}

fn planning(c: &mut Criterion) {
    let s = Schedule::parse("@hourly", Tz::UTC).unwrap();
    let intervals = expand(&s, ten_years(), MAX_INTERVALS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conn = large_manifest(dir.path(), &intervals);
    let ctx = LeaseCtx::new(Duration::from_secs(30), &backfill::process::LOCAL);
    let options = Options {
        reprocess: Reprocess::Failed,
        run_backwards: false,
        depends_on_past: false,
        now: utc("2026-11-29T00:00:00Z"),
    };
    let mut g = c.benchmark_group("plan");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("priors_87672_runs", |b| {
        b.iter(|| {
            black_box(
                plans::priors(&conn, "hourly", &intervals, &ctx, leases::Judge::Strict).unwrap(),
            )
        })
    });
    let prior = plans::priors(&conn, "hourly", &intervals, &ctx, leases::Judge::Strict).unwrap();
    let before = None;
    g.bench_function("plan_87672", |b| {
        b.iter(|| black_box(plan::plan(&intervals, &prior, before, options)).len())
    });
    g.finish();
}

fn gate_checks(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let w = Warehouse {
        name: "bench".into(),
        kind: backfill::project::WarehouseKind::Sqlite,
        path: dir.path().join("warehouse.db"),
        init: Vec::new(),
        busy_timeout: backfill::project::DEFAULT_BUSY_TIMEOUT,
        keep_versions: backfill::project::DEFAULT_KEEP_VERSIONS,
    };
    let conn = warehouse::open(&w).unwrap();
    // One day of orders, as in the shop example: 3,000 rows, in an attached audit file.
    let audit = warehouse::AuditFile::create(dir.path(), "try-1.db").unwrap();
    audit.attach(&conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE audit.rows AS
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 2999)
         SELECT i AS order_id, '2026-09-18' AS order_day,
                datetime('2026-09-18', '+' || (i * 28) || ' seconds') AS order_ts,
                'eu' AS region, i * 7 AS amount_cents
         FROM n",
    )
    .unwrap();
    let task = SqlTask {
        warehouse: w.clone(),
        target: "orders_fact".into(),
        partition_column: "order_day".into(),
        sql: String::new(),
        keep_versions: 1,
        write: Default::default(),
    };
    let g = Gate {
        unique_key: vec!["order_id".into()],
        unique_key_table: false,
        max_changed: None,
        source_count: None,
        source_fingerprint: None,
        tolerance: 0.02,
        allow_empty: false,
        rules: Vec::new(),
        history: None,
    };
    let binds = Binds::new(
        DataInterval::new(utc("2026-09-18T00:00:00Z"), utc("2026-09-19T00:00:00Z")),
        Tz::UTC,
    );
    let mut group = c.benchmark_group("gate");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("measure_3000_rows", |b| {
        b.iter(|| {
            black_box(
                warehouse::audit::measure(
                    &conn,
                    &task,
                    Some(&g),
                    Some(warehouse::Repr::Date),
                    &binds,
                    Tz::UTC,
                    None,
                )
                .unwrap(),
            )
        })
    });
    let measures = Measures {
        merge: None,
        rows: 3000,
        outside: Some(0),
        outside_values: Vec::new(),
        duplicate_keys: Some(0),
        source: Some(3000),
        published: Some(2990),
        mixed: None,
        elsewhere: None,
        constraint: None,
        found: Vec::new(),
        history: None,
    };
    let rules = Rules {
        max_changed: None,
        tolerance: 0.02,
        allow_empty: false,
        allow_drift: false,
        history: None,
    };
    group.bench_function("judge", |b| {
        b.iter(|| black_box(gate::judge(black_box(&measures), &rules)))
    });
    // The rules of the README's example on the same rows: one statement when all pass.
    let rule = |name: &str, kind: RuleKind| Rule {
        name: name.into(),
        kind,
        severity: Severity::Error,
    };
    let with_rules = Gate {
        rules: vec![
            rule("not_null", RuleKind::NotNull("order_id".into())),
            rule("not_null", RuleKind::NotNull("region".into())),
            rule(
                "accepted_values",
                RuleKind::AcceptedValues(
                    "region".into(),
                    ["eu", "us", "apac", "latam"]
                        .map(|v| Literal::Text(v.into()))
                        .to_vec(),
                ),
            ),
            rule(
                "range",
                RuleKind::Range {
                    column: "amount_cents".into(),
                    min: Some(Literal::Int(0)),
                    max: Some(Literal::Int(100_000)),
                    allow_non_finite: false,
                },
            ),
            rule(
                "no negative amounts",
                RuleKind::Sql("SELECT order_id FROM output WHERE amount_cents < 0".into()),
            ),
        ],
        ..g.clone()
    };
    group.bench_function("rules_3000_rows", |b| {
        b.iter(|| {
            let mut engine = warehouse::audit::SqliteRules {
                conn: &conn,
                binds: &binds,
                output: "SELECT * FROM audit.rows".into(),
            };
            black_box(
                warehouse::rules::run(
                    &mut engine,
                    &with_rules,
                    3000,
                    &["order_id".to_string()],
                    None,
                )
                .unwrap(),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, schedules, planning, gate_checks);
criterion_main!(benches);
