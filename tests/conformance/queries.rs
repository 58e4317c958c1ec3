//! The read models of `list`, `show`, `runs`, the status page and `/metrics`, and what
//! cascades read: each exactly what was recorded.

use backfill::manifest::NewBackfill;
use backfill::manifest::backfills::Owner;
use backfill::manifest::runs::Start;
use backfill::plan::{Action, RunState};
use backfill::state::{BackfillState, TryState, Verdict};
use serde_json::json;

use crate::support::*;

/// Day `d`'s run with its first try of `task` logged at `dir/run<run id>.log` (a file that
/// exists, so the read models show it).
fn start_logged(m: &Engine, owner: Owner, d: i64, task: &str, dir: &str) -> (i64, i64, String) {
    let (task, prefix) = (task.to_string(), format!("{dir}/run"));
    let started = m
        .step(move |s| {
            s.start_run_and_try(
                s.fence(owner)?,
                "d",
                day(d),
                backfill::clock::now_ms(),
                TIMEOUT_MS,
                &task,
                1,
                (&prefix, ".log"),
                None,
            )
        })
        .unwrap();
    let (Start::Run(run), Some(t)) = started else {
        panic!("{started:?}")
    };
    let log = format!("{dir}/run{run}.log");
    std::fs::write(&log, "boom\n").unwrap();
    (run, t, log)
}

/// A read model as JSON.
fn js<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

/// `list`, `show`, `runs`, an outcome, the status page's pages and `/metrics` read back what
/// was recorded, counted by each interval's latest run.
pub fn list_show_and_runs_read_what_was_recorded(m: &Engine) {
    let logs = tempfile::tempdir().unwrap();
    let logs = logs.path().display().to_string();
    let a = planned(m, request("d"), 4, &alive());
    // Day 0: two tasks succeeded (a merge; a warning); day 1 failed; day 2 rejected; day 3 not
    // started.
    let (r0, extract) = start_run(m, a, "d", 0, "extract");
    let mut rec = record(TryState::Succeeded);
    rec.rows = Some(10);
    (
        rec.rows_inserted,
        rec.rows_updated,
        rec.rows_deleted,
        rec.rows_unchanged,
    ) = (Some(1), Some(2), Some(3), Some(4));
    m.ok(move |s| s.finish_try(s.fence(a)?, extract, &rec, after(4_000)));
    let now = backfill::clock::now_ms();
    let load = m
        .ok(move |s| s.start_try(s.fence(a)?, r0, "load", 1, "/logs/load", now))
        .unwrap();
    let mut rec = record(TryState::Succeeded);
    rec.rows = Some(5);
    rec.verdict = Some(Verdict::Published);
    rec.reasons = Some("warning: few rows".into());
    rec.batch = Some("B".into());
    end_run(m, a, (r0, load), RunState::Succeeded, rec);
    let (r1, t1, log1) = start_logged(m, a, 1, "extract", &logs);
    let mut rec = record(TryState::Failed);
    rec.error = Some("boom".into());
    end_run(m, a, (r1, t1), RunState::Failed, rec);
    let (r2, t2) = start_run(m, a, "d", 2, "extract");
    let mut rec = record(TryState::Rejected);
    rec.verdict = Some(Verdict::Rejected);
    rec.reasons = Some("rows: 0 < 1".into());
    end_run(m, a, (r2, t2), RunState::Rejected, rec);
    // Another DAG's backfill, completed.
    let b = planned(m, request("e"), 1, &alive());
    let ids = start_run(m, b, "e", 0, "t");
    end_run(m, b, ids, RunState::Succeeded, record(TryState::Succeeded));
    m.ok(move |s| s.finish_backfill(b, BackfillState::Completed, after(60_000)));

    let r = m.read();
    let one = r.backfill(1).unwrap().unwrap();
    let two = r.backfill(2).unwrap().unwrap();
    let summary_a = json!({
        "id": 1, "dag_id": "d", "state": "running", "from": rfc(0), "to": rfc(3),
        "from_arg": "2026-01-01", "to_arg": "2026-01-31", "reprocess_behavior": "none",
        "max_active_runs": 4, "run_backwards": false, "allow_drift": false, "conf": {},
        "created_at": rfc_ms(one.created_at), "finished_at": null, "owner_pid": LIVE_PID,
        "owner_host": HERE, "owner_alive": false,
        "intervals": {"total": 4, "planned": 4, "skipped": 0, "succeeded": 1, "failed": 1,
                      "rejected": 1, "cancelled": 0, "running": 0, "pending": 1},
        "kind": "run", "source_backfill": null, "tasks": null, "max_failures": null,
        "cascade": null, "cascade_of": null
    });
    let summary_b = json!({
        "id": 2, "dag_id": "e", "state": "completed", "from": rfc(0), "to": rfc(0),
        "from_arg": "2026-01-01", "to_arg": "2026-01-31", "reprocess_behavior": "none",
        "max_active_runs": 4, "run_backwards": false, "allow_drift": false, "conf": {},
        "created_at": rfc_ms(two.created_at), "finished_at": rfc_ms(two.created_at + 60_000),
        "owner_pid": LIVE_PID, "owner_host": HERE, "owner_alive": false,
        "intervals": {"total": 1, "planned": 1, "skipped": 0, "succeeded": 1, "failed": 0,
                      "rejected": 0, "cancelled": 0, "running": 0, "pending": 0},
        "kind": "run", "source_backfill": null, "tasks": null, "max_failures": null,
        "cascade": null, "cascade_of": null
    });
    assert_eq!(
        js(r.list_backfills(None, false).unwrap()),
        json!([summary_a, summary_b])
    );
    assert_eq!(
        js(r.list_backfills(Some("e"), false).unwrap()),
        json!([summary_b])
    );
    assert_eq!(
        js(r.list_backfills(None, true).unwrap()),
        json!([summary_a])
    );
    assert_eq!(js(r.list_backfills(Some("e"), true).unwrap()), json!([]));
    assert_eq!(js(r.backfill_summary(1).unwrap()), summary_a);
    assert!(r.backfill_summary(3).unwrap().is_none());
    let a_summary = r.backfill_summary(1).unwrap().unwrap();
    assert_eq!(
        (a_summary.heartbeat_at, a_summary.owner_start),
        (one.heartbeat_at, Some(LIVE_START))
    );

    // The outcome: failed and rejected intervals with the task to blame, warnings.
    let outcome = r.outcome(1).unwrap().unwrap();
    assert_eq!(js(&outcome.backfill), summary_a);
    assert!(outcome.skipped.is_empty());
    assert_eq!(
        js(&outcome.failed),
        json!([
            {"start": rfc(1), "state": "failed", "task": "extract",
             "error": format!("run {r1}: failed"), "log": log1},
            {"start": rfc(2), "state": "rejected", "task": "extract",
             "error": format!("run {r2}: rejected"), "log": null}
        ])
    );
    assert_eq!(
        js(&outcome.warned),
        json!([{"start": rfc(0), "task": "load", "warnings": "warning: few rows"}])
    );
    assert!(r.outcome(3).unwrap().is_none());

    // `show`: every interval of the plan with its latest run.
    let show = r.show_backfill(1).unwrap().unwrap();
    assert_eq!(js(&show.backfill), summary_a);
    assert!(show.cascade_backfills.is_none() && show.workers.is_empty());
    assert_eq!(
        js(&show.interval_details),
        json!([
            {"ord": 0, "start": rfc(0), "end": rfc(1), "action": "run", "reason": null,
             "state": "succeeded", "attempts": 1, "tries": 2, "rows": 15,
             "changes": {"inserted": 1, "updated": 2, "deleted": 3, "unchanged": 4},
             "verdict": "published", "reasons": "warning: few rows", "duration_ms": RUN_MS + r0,
             "error": null, "log": null, "host": HERE, "batch": "B"},
            {"ord": 1, "start": rfc(1), "end": rfc(2), "action": "run", "reason": null,
             "state": "failed", "attempts": 1, "tries": 1, "rows": null, "verdict": null,
             "reasons": null, "duration_ms": RUN_MS + r1, "error": format!("run {r1}: failed"),
             "log": log1, "host": HERE},
            {"ord": 2, "start": rfc(2), "end": rfc(3), "action": "run", "reason": null,
             "state": "rejected", "attempts": 1, "tries": 1, "rows": null,
             "verdict": "rejected", "reasons": "rows: 0 < 1", "duration_ms": RUN_MS + r2,
             "error": format!("run {r2}: rejected"), "log": null, "host": HERE},
            {"ord": 3, "start": rfc(3), "end": rfc(4), "action": "run", "reason": null,
             "state": null, "attempts": 0, "tries": 0, "rows": null, "verdict": null,
             "reasons": null, "duration_ms": null, "error": null, "log": null}
        ])
    );
    assert!(r.show_backfill(3).unwrap().is_none());
    let page = r.show_backfill_page(1, 1, 2).unwrap().unwrap();
    assert_eq!(js(&page.interval_details), js(&show.interval_details[1..3]));
    assert_eq!(js(&page.backfill), summary_a);

    // `runs`: every run of a DAG between two starts.
    let started = |run| rfc_ms(run_started(m, run));
    assert_eq!(
        js(r.run_history("d", start(0), start(2)).unwrap()),
        json!([
            {"run_id": r0, "backfill_id": 1, "start": rfc(0), "end": rfc(1), "state": "succeeded",
             "started_at": started(r0), "duration_ms": RUN_MS + r0, "tries": 2, "rows": 15,
             "changes": {"inserted": 1, "updated": 2, "deleted": 3, "unchanged": 4},
             "verdict": "published", "reasons": "warning: few rows", "error": null},
            {"run_id": r1, "backfill_id": 1, "start": rfc(1), "end": rfc(2), "state": "failed",
             "started_at": started(r1), "duration_ms": RUN_MS + r1, "tries": 1, "rows": null,
             "verdict": null, "reasons": null, "error": format!("run {r1}: failed")},
            {"run_id": r2, "backfill_id": 1, "start": rfc(2), "end": rfc(3), "state": "rejected",
             "started_at": started(r2), "duration_ms": RUN_MS + r2, "tries": 1, "rows": null,
             "verdict": "rejected", "reasons": "rows: 0 < 1",
             "error": format!("run {r2}: rejected")}
        ])
    );
    assert_eq!(r.run_history("d", start(1), start(1)).unwrap().len(), 1);
    assert!(r.run_history("d", start(3), start(9)).unwrap().is_empty());

    // The status page and /metrics.
    assert_eq!(
        r.run_dags().unwrap(),
        [("d".to_string(), 3), ("e".to_string(), 1)]
    );
    assert_eq!(r.dag_starts("d", 2, 0).unwrap(), [start(2), start(1)]);
    assert_eq!(r.dag_starts("d", 2, 2).unwrap(), [start(0)]);
    assert!(r.dag_starts("x", 2, 0).unwrap().is_empty());
    assert_eq!(
        r.backfill_heads().unwrap(),
        [
            (1, "d".to_string(), BackfillState::Running),
            (2, "e".to_string(), BackfillState::Completed)
        ]
    );
    let f = r.figures().unwrap();
    let s = |x: &str| x.to_string();
    assert_eq!(
        f.intervals,
        [
            (s("d"), RunState::Failed, 1),
            (s("d"), RunState::Rejected, 1),
            (s("d"), RunState::Succeeded, 1),
            (s("e"), RunState::Succeeded, 1)
        ]
    );
    assert_eq!(
        f.backfills,
        [(BackfillState::Completed, 1), (BackfillState::Running, 1)]
    );
    assert_eq!(f.tries_running, 0);
    assert_eq!(f.oldest_heartbeat_ms, one.heartbeat_at);
    assert_eq!(f.rejections, [(s("d"), s("rows: 0 < 1"))]);
    assert_eq!(f.merged, [(s("d"), [1, 2, 3, 4])]);
    assert_eq!(f.leases, 1, "day 3's");
    assert!(f.pool_slots.is_empty());
    assert_eq!(f.warnings, [(s("d"), s("warning: few rows"))]);
    // Nothing was recorded as published: the end of each DAG's latest succeeded run, day 0 of
    // each (a task without a gate publishes as it succeeds).
    assert_eq!(f.last_published, [(s("d"), start(1)), (s("e"), start(1))]);
}

/// A cascade is its first backfill and the backfills made for it, oldest first; its running
/// member is the newest that runs; a member's unfinished intervals are those planned to run
/// that have not succeeded, failed or been rejected.
pub fn a_cascade_is_its_first_backfill_and_its_members(m: &Engine) {
    let root = planned(
        m,
        NewBackfill {
            cascade: Some("all".into()),
            ..request("up")
        },
        3,
        &alive(),
    );
    let member = |dag: &str| NewBackfill {
        cascade_of: Some(1),
        ..request(dag)
    };
    let m1 = planned(m, member("mid"), 1, &alive());
    insert(m, request("other"), &alive());
    let m2 = planned(m, member("down"), 1, &alive());
    let r = m.read();
    let members: Vec<_> = r
        .cascade_members(1)
        .unwrap()
        .into_iter()
        .map(|b| (b.id, b.dag_id, b.cascade_of))
        .collect();
    assert_eq!(
        members,
        [
            (2, "mid".to_string(), Some(1)),
            (4, "down".to_string(), Some(1))
        ]
    );
    assert!(r.cascade_members(2).unwrap().is_empty());
    assert_eq!(r.running_member(1).unwrap(), Some(4));
    m.ok(move |s| s.finish_backfill(m2, BackfillState::Completed, after(5_000)));
    assert_eq!(r.running_member(1).unwrap(), Some(2));
    m.ok(move |s| s.finish_backfill(m1, BackfillState::Failed, after(5_000)));
    assert_eq!(r.running_member(1).unwrap(), Some(1));

    // The first backfill's intervals: one succeeded, one failed, one cancelled.
    assert_eq!(r.unfinished_count(1).unwrap(), 3);
    for (d, state) in [
        (0, RunState::Succeeded),
        (1, RunState::Failed),
        (2, RunState::Cancelled),
    ] {
        let ids = start_run(m, root, "up", d, "t");
        let try_state = match state {
            RunState::Succeeded => TryState::Succeeded,
            RunState::Failed => TryState::Failed,
            _ => TryState::Cancelled,
        };
        end_run(m, root, ids, state, record(try_state));
    }
    assert_eq!(r.unfinished_count(1).unwrap(), 1, "the cancelled one");
    let outcomes: Vec<_> = r
        .plan_outcomes(1)
        .unwrap()
        .into_iter()
        .map(|o| (o.start, o.action, o.state))
        .collect();
    assert_eq!(
        outcomes,
        [
            (start(0), Action::Run, Some(RunState::Succeeded)),
            (start(1), Action::Run, Some(RunState::Failed)),
            (start(2), Action::Run, Some(RunState::Cancelled)),
        ]
    );
    m.ok(move |s| s.finish_backfill(root, BackfillState::Failed, after(5_000)));
    assert_eq!(r.running_member(1).unwrap(), None);
    assert!(r.unsettled("up", start(0), start(2)).unwrap().len() == 2);
}
