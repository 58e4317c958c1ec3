//! Runs and tries: a run starts only under its backfill's lease and within its bounds; a try's
//! record round-trips; ends are recorded once and free the interval; what a gone owner left
//! is ended once.

use backfill::liveness::Group;
use backfill::manifest::NewBackfill;
use backfill::manifest::backfills::Owner;
use backfill::manifest::runs::{Early, Start};
use backfill::manifest::{Error, TryRecord};
use backfill::plan::RunState;
use backfill::state::{BackfillState, StagedState, TryState, Verdict};
use rusqlite::types::Value;
use serde_json::json;

use crate::support::*;

/// A run and its first try start in one write: the run is the interval's under the lease
/// (which now names it), the try runs on its owner's host with its log path around the run's
/// id, and every reader sees them in progress. The interval cannot be started again while it
/// runs.
pub fn a_run_and_its_first_try_start_under_the_lease(m: &Engine) {
    let owner = planned(m, request("d"), 2, &alive());
    let now = backfill::clock::now_ms() + 100;
    let (started, span) = m.timed(|| {
        m.step(move |s| {
            s.start_run_and_try(
                s.fence(owner)?,
                "d",
                day(0),
                now,
                TIMEOUT_MS,
                "t",
                1,
                LOG,
                None,
            )
        })
        .unwrap()
    });
    let (Start::Run(run), Some(t)) = started else {
        panic!("not started: {started:?}");
    };
    m.assert_now(run_started(m, run), now, span);
    assert_eq!(try_started(m, t), run_started(m, run));
    assert_eq!(
        m.rows(&format!(
            "SELECT r.backfill_id, r.dag_id, r.interval_start, r.interval_end, r.state, r.ended_at,
                    r.error, r.worker, l.run_id
             FROM runs r JOIN leases l ON l.dag_id = r.dag_id AND l.interval_start = r.interval_start
             WHERE r.id = {run}"
        )),
        [vec![
            Value::Integer(1),
            Value::Text("d".into()),
            Value::Integer(start(0)),
            Value::Integer(start(1)),
            Value::Text("running".into()),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Integer(run),
        ]]
    );
    let r = m.read();
    let tries = serde_json::to_value(r.interval_tries(1, start(0)).unwrap()).unwrap();
    assert_eq!(
        tries,
        json!([{
            "run_id": run, "run_state": "running", "try_id": t, "task": "t", "try_number": 1,
            "state": "running", "host": HERE, "started_at": rfc_ms(try_started(m, t)),
            "duration_ms": null, "rows": null, "changes": null, "source_rows": null,
            "previous_rows": null, "verdict": null, "reasons": null, "error": null,
            "log": format!("/logs/run{run}.try1.log"), "batch": null
        }])
    );
    assert!(r.interval_tries(1, start(1)).unwrap().is_empty());
    assert!(r.try_holds_lease(t).unwrap());
    assert!(r.run_in_progress(run).unwrap());
    assert!(!r.run_in_progress(run + 1).unwrap());
    assert_eq!(
        r.starts_in_progress(1).unwrap(),
        std::collections::HashSet::from([start(0)])
    );
    assert_eq!(r.runs_in_progress(owner).unwrap(), [run]);
    let unfinished = r.unfinished_tries(owner).unwrap();
    assert_eq!(unfinished.len(), 1);
    let u = &unfinished[0];
    assert_eq!(
        (u.try_id, u.run_id, u.dag_id.as_str(), u.interval_start),
        (t, run, "d", start(0))
    );
    assert_eq!(
        (
            u.group,
            u.host.as_deref(),
            u.audit_path.as_deref(),
            u.publishing
        ),
        (None, Some(HERE), None, false)
    );
    assert_eq!(r.first_unfinished_try().unwrap(), t);
    assert!(
        r.keeping_staged_tables().unwrap().contains(&t),
        "a running try's"
    );
    assert!(!r.any_succeeded(1).unwrap());
    let f = r.figures().unwrap();
    assert_eq!(f.tries_running, 1);
    assert_eq!(f.intervals, [("d".to_string(), RunState::Running, 1)]);
    let show = r.show_backfill(1).unwrap().unwrap();
    assert_eq!(
        show.interval_details[0]
            .state
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("running")
    );
    assert_eq!(
        (
            show.interval_details[0].attempts,
            show.interval_details[0].tries
        ),
        (1, 1)
    );
    assert_eq!(show.interval_details[0].host.as_deref(), Some(HERE));
    assert_eq!(show.interval_details[1].state, None);
    assert_eq!(show.backfill.intervals.running, 1);
    assert_eq!(show.backfill.intervals.pending, 1);

    // Not again while it runs.
    assert_eq!(try_start(m, owner, "d", 0, "t"), (Start::Lost, None));
    assert_eq!(m.int("SELECT COUNT(*) FROM runs"), 1);
}

/// A run does not start where its backfill holds no lease (another's interval, or one not
/// planned), once a cancel was asked, past `--max-failures`, nor beyond `max_active_runs`
/// across the backfill's processes; nothing is recorded then.
pub fn a_start_is_refused_when_lost_busy_halted_or_cancelled(m: &Engine) {
    let one = NewBackfill {
        max_active_runs: 1,
        ..request("d")
    };
    let a = planned(m, one, 3, &alive());
    let c = other();
    let worker = m.ok(move |s| s.join_backfill(1, 1, &c));
    start_run(m, a, "d", 0, "t");
    assert_eq!(try_start(m, a, "d", 1, "t"), (Start::Busy, None));
    assert_eq!(try_start(m, worker, "d", 1, "t"), (Start::Busy, None));
    assert_eq!(
        try_start(m, a, "d", 7, "t"),
        (Start::Lost, None),
        "not leased"
    );
    // Another backfill's interval.
    let b = planned_days(m, request("d"), [5], &alive());
    assert_eq!(try_start(m, a, "d", 5, "t"), (Start::Lost, None));
    // Past --max-failures.
    let limited = NewBackfill {
        max_failures: Some(1),
        ..request("e")
    };
    let h = planned(m, limited, 3, &dead());
    let first = start_run(m, h, "e", 0, "t");
    end_run(m, h, first, RunState::Failed, record(TryState::Failed));
    assert_eq!(try_start(m, h, "e", 1, "t"), (Start::Halted, None));
    // Its failures count from when its owner took it: a new owner starts afresh.
    let c = other();
    let taken = m
        .ok(move |s| s.take_ownership(h.backfill_id, &c, true))
        .unwrap();
    assert_fenced(
        m.step(move |s| {
            let now = backfill::clock::now_ms();
            s.start_run_and_try(s.fence(h)?, "e", day(1), now, TIMEOUT_MS, "t", 1, LOG, None)
        }),
        h.backfill_id,
    );
    let again = start_run(m, taken, "e", 1, "t");
    end_run(m, taken, again, RunState::Failed, record(TryState::Failed));
    assert_eq!(try_start(m, taken, "e", 2, "t"), (Start::Halted, None));
    // Cancelled.
    m.ok(move |s| s.request_cancel(b.backfill_id));
    assert_eq!(try_start(m, b, "d", 5, "t"), (Start::Lost, None));
    assert_eq!(m.int("SELECT COUNT(*) FROM runs"), 3);
    assert_eq!(m.int("SELECT COUNT(*) FROM task_tries"), 3);
}

/// A record with every field a try's end can carry; it names try `earlier` as the output it
/// promotes and the rows it put back.
fn full_record(earlier: i64) -> TryRecord {
    TryRecord {
        state: TryState::Succeeded,
        exit_code: Some(3),
        error: Some("warned".into()),
        rows: Some(120),
        partitions: Some(r#"["p=1"]"#.into()),
        inputs: Some(r#"{"src": 1}"#.into()),
        fingerprint: Some("fp-out".into()),
        source_rows: Some(130),
        previous_rows: Some(110),
        verdict: Some(Verdict::Published),
        reasons: Some("warning: rows grew".into()),
        source_fingerprint: Some("fp-src".into()),
        staged: None,
        staged_path: Some("/staged/x".into()),
        promoted_from: Some(earlier),
        restored_from: Some(earlier),
        restore_key: None,
        batch: Some("2026-01-01T00:00:00Z/2026-01-02T00:00:00Z".into()),
        rows_inserted: Some(4),
        rows_updated: Some(3),
        rows_deleted: Some(2),
        rows_unchanged: Some(111),
    }
}

/// A try records its process group and audit file while it runs and its holder keeps the
/// lease; its end records every field of its record, read back exactly; a later try of the
/// same run is its own row; a run's end frees the interval, after which no try starts in it
/// nor takes a process group.
pub fn a_try_records_every_field_of_its_end(m: &Engine) {
    let owner = planned(m, request("d"), 2, &alive());
    let (_, earlier) = start_run(m, owner, "d", 1, "extract");
    let (run, t) = start_run(m, owner, "d", 0, "extract");
    let group = Group {
        pgid: 31_337,
        leader_start: Some(42),
    };
    assert!(
        m.step(move |s| s.set_try_group(s.fence(owner)?, t, group, "host-b"))
            .unwrap()
    );
    m.ok(move |s| s.set_try_audit(s.fence(owner)?, t, "/audit/try.db"));
    let unfinished = m.read().unfinished_tries(owner).unwrap();
    let u = unfinished.iter().find(|u| u.try_id == t).unwrap();
    assert_eq!(
        (u.group, u.host.as_deref(), u.audit_path.as_deref()),
        (Some(group), Some("host-b"), Some("/audit/try.db"))
    );
    let rec = full_record(earlier);
    m.ok(move |s| s.finish_try(s.fence(owner)?, t, &rec, after(3_000)));
    let v = |s: &str| Value::Text(s.to_string());
    assert_eq!(
        m.rows(&format!(
            "SELECT state, ended_at - started_at, exit_code, error, rows, partitions, inputs,
                    fingerprint, source_rows, previous_rows, verdict, reasons, source_fingerprint,
                    staged, staged_path, promoted_from, restored_from, batch, publishing,
                    rows_inserted, rows_updated, rows_deleted, rows_unchanged, pgid, pgid_start,
                    host, audit_path, task_id, try_number, waiting_for
             FROM task_tries WHERE id = {t}"
        )),
        [vec![
            v("succeeded"),
            Value::Integer(3_000),
            Value::Integer(3),
            v("warned"),
            Value::Integer(120),
            v(r#"["p=1"]"#),
            v(r#"{"src": 1}"#),
            v("fp-out"),
            Value::Integer(130),
            Value::Integer(110),
            v("published"),
            v("warning: rows grew"),
            v("fp-src"),
            Value::Null,
            v("/staged/x"),
            Value::Integer(earlier),
            Value::Integer(earlier),
            v("2026-01-01T00:00:00Z/2026-01-02T00:00:00Z"),
            Value::Integer(0),
            Value::Integer(4),
            Value::Integer(3),
            Value::Integer(2),
            Value::Integer(111),
            Value::Integer(31_337),
            Value::Integer(42),
            v("host-b"),
            v("/audit/try.db"),
            v("extract"),
            Value::Integer(1),
            Value::Null,
        ]]
    );
    // The end is recorded once: a second end changes nothing, a group is no longer taken.
    let mut again = record(TryState::Failed);
    again.error = Some("late".into());
    m.ok(move |s| s.finish_try(s.fence(owner)?, t, &again, after(1)));
    assert!(
        !m.step(move |s| s.set_try_group(s.fence(owner)?, t, group, HERE))
            .unwrap()
    );
    assert_eq!(
        m.value(&format!("SELECT error FROM task_tries WHERE id = {t}")),
        v("warned")
    );

    // A second try of the run, then the run's end.
    let now = backfill::clock::now_ms();
    let second = m.ok(move |s| s.start_try(s.fence(owner)?, run, "load", 2, "/logs/load.log", now));
    let Some(t2) = second else {
        panic!("no second try")
    };
    assert_eq!(t2, t + 1);
    let tries = serde_json::to_value(m.read().interval_tries(1, start(0)).unwrap()).unwrap();
    assert_eq!(
        tries[0],
        json!({
            "run_id": run, "run_state": "running", "try_id": t, "task": "extract",
            "try_number": 1, "state": "succeeded", "host": "host-b",
            "started_at": rfc_ms(try_started(m, t)), "duration_ms": 3_000, "rows": 120,
            "changes": {"inserted": 4, "updated": 3, "deleted": 2, "unchanged": 111},
            "source_rows": 130, "previous_rows": 110, "verdict": "published",
            "reasons": "warning: rows grew", "error": "warned",
            "log": format!("/logs/run{run}.try1.log"),
            "batch": "2026-01-01T00:00:00Z/2026-01-02T00:00:00Z"
        })
    );
    assert_eq!(
        (
            tries[1]["try_id"].as_i64(),
            tries[1]["task"].as_str(),
            tries[1]["try_number"].as_i64()
        ),
        (Some(t2), Some("load"), Some(2))
    );
    assert_eq!(tries[1]["log"], "/logs/load.log");
    assert_eq!(
        tries[1]["host"], HERE,
        "a try runs on its run's owner's host"
    );
    assert_eq!(m.read().first_unfinished_try().unwrap(), earlier);
    m.ok(move |s| {
        s.finish_run(
            s.fence(owner)?,
            run,
            RunState::Failed,
            Some("load failed"),
            after(9_000),
        )
    });
    assert_eq!(
        m.rows(&format!(
            "SELECT state, ended_at - started_at, error FROM runs WHERE id = {run}"
        )),
        [vec![v("failed"), Value::Integer(9_000), v("load failed")]]
    );
    let r = m.read();
    assert!(!r.run_in_progress(run).unwrap());
    assert!(!r.holds_lease(1, "d", start(0)).unwrap());
    assert!(!r.try_holds_lease(t2).unwrap());
    assert_eq!(
        r.starts_in_progress(1).unwrap(),
        std::collections::HashSet::from([start(1)])
    );
    assert!(
        !m.step(move |s| s.set_try_group(s.fence(owner)?, t2, group, HERE))
            .unwrap()
    );
    let none = m.ok(move |s| s.start_try(s.fence(owner)?, run, "load", 3, "/logs/x", now));
    assert_eq!(none, None, "its run ended");
    // A try ends even once its lease is gone (recorded as it happened).
    m.ok(move |s| s.end_try(t2, &record(TryState::Cancelled), after(5_000)));
    assert_eq!(
        m.rows(&format!(
            "SELECT state, ended_at - started_at FROM task_tries WHERE id = {t2}"
        )),
        [vec![v("cancelled"), Value::Integer(5_000)]]
    );
    m.ok(move |s| s.end_try(t2, &record(TryState::Failed), after(1)));
    assert_eq!(
        m.value(&format!("SELECT state FROM task_tries WHERE id = {t2}")),
        v("cancelled")
    );
    assert_eq!(r.first_unfinished_try().unwrap(), earlier);
}

/// A try's end and its run's end are recorded together and free the interval; the run
/// history, the outcome and the counts say so.
pub fn a_try_and_its_run_end_together(m: &Engine) {
    let owner = planned(m, request("d"), 2, &alive());
    let ids = start_run(m, owner, "d", 0, "t");
    let mut rec = record(TryState::Failed);
    rec.error = Some("exit code 2".into());
    rec.exit_code = Some(2);
    end_run(m, owner, ids, RunState::Failed, rec);
    let (run, t) = ids;
    assert_eq!(
        m.rows(&format!(
            "SELECT r.state, r.error, r.ended_at - r.started_at, t.state, t.error, t.exit_code,
                    t.ended_at - t.started_at
             FROM runs r JOIN task_tries t ON t.run_id = r.id WHERE t.id = {t}"
        )),
        [vec![
            Value::Text("failed".into()),
            Value::Text(format!("run {run}: failed")),
            Value::Integer(RUN_MS + run),
            Value::Text("failed".into()),
            Value::Text("exit code 2".into()),
            Value::Integer(2),
            Value::Integer(TRY_MS + t),
        ]]
    );
    assert!(!m.read().holds_lease(1, "d", start(0)).unwrap());
    // Leased and started again: a second attempt at the interval.
    let c = alive();
    m.ok(move |s| s.take_leases(1, "d", &mut std::iter::once(day(0)), &c));
    let again = start_run(m, owner, "d", 0, "t");
    end_run(
        m,
        owner,
        again,
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    let history =
        serde_json::to_value(m.read().run_history("d", start(0), start(5)).unwrap()).unwrap();
    assert_eq!(
        history,
        json!([
            {"run_id": run, "backfill_id": 1, "start": rfc(0), "end": rfc(1), "state": "failed",
             "started_at": rfc_ms(run_started(m, run)), "duration_ms": RUN_MS + run, "tries": 1,
             "rows": null, "verdict": null, "reasons": null, "error": format!("run {run}: failed")},
            {"run_id": again.0, "backfill_id": 1, "start": rfc(0), "end": rfc(1),
             "state": "succeeded", "started_at": rfc_ms(run_started(m, again.0)),
             "duration_ms": RUN_MS + again.0, "tries": 1, "rows": null, "verdict": null,
             "reasons": null, "error": null}
        ])
    );
    let show = m.read().show_backfill(1).unwrap().unwrap();
    let d0 = &show.interval_details[0];
    assert_eq!(
        (
            d0.state.as_ref().map(ToString::to_string).as_deref(),
            d0.attempts,
            d0.tries
        ),
        (Some("succeeded"), 2, 1)
    );
    assert_eq!(d0.duration_ms, Some(RUN_MS + again.0));
    assert!(m.read().any_succeeded(1).unwrap());
    assert_eq!(m.read().unfinished_count(1).unwrap(), 1);
}

/// What a gone owner left is found and ended once, by whoever recovers it: its unfinished
/// tries (a decided publish keeps what its intent recorded), and its runs (succeeded when every
/// task succeeded, else cancelled; those held by a try that could not be stopped left running
/// with their leases).
pub fn what_a_gone_owner_left_is_ended_once(m: &Engine) {
    let gone = planned(m, request("d"), 4, &dead());
    let (r0, t0) = start_run(m, gone, "d", 0, "t");
    m.ok(move |s| s.finish_try(s.fence(gone)?, t0, &record(TryState::Succeeded), after(10)));
    let (r1, t1) = start_run(m, gone, "d", 1, "t");
    let (r2, t2) = start_run(m, gone, "d", 2, "t");
    let mut intent = record(TryState::Succeeded);
    intent.rows = Some(5);
    intent.fingerprint = Some("fp".into());
    intent.verdict = Some(Verdict::Published);
    let decided =
        m.ok(move |s| s.record_publish_intent(s.fence(gone)?, t2, Some("/a/t2.db"), &intent));
    assert!(decided);
    let (r3, t3) = start_run(m, gone, "d", 3, "t");
    let judge = other();
    let c = judge.clone();
    let claimed = m.ok(move |s| s.take_ownership(1, &c, false)).unwrap();
    assert_eq!(claimed, Owner::of(1, 1));
    let r = m.read();
    assert_eq!(
        sorted(r.runs_in_progress(claimed).unwrap()),
        [r0, r1, r2, r3]
    );
    let unfinished: Vec<_> = r
        .unfinished_tries(claimed)
        .unwrap()
        .into_iter()
        .map(|u| {
            (
                u.try_id,
                u.run_id,
                u.interval_start,
                u.publishing,
                u.audit_path,
            )
        })
        .collect();
    assert_eq!(
        unfinished,
        [
            (t1, r1, start(1), false, None),
            (t2, r2, start(2), true, Some("/a/t2.db".to_string())),
            (t3, r3, start(3), false, None),
        ]
    );

    // A killed try: ended once.
    let mut killed = record(TryState::Cancelled);
    killed.error = Some("its owner was gone".into());
    let now = backfill::clock::now_ms();
    let (ended, span) = m.timed(|| {
        let k = killed.clone();
        m.ok(move |s| s.end_abandoned_try(t1, &k, now))
    });
    assert!(ended);
    assert!(!m.ok(move |s| s.end_abandoned_try(t1, &killed, now)));
    let row = m.rows(&format!(
        "SELECT state, error, ended_at, publishing FROM task_tries WHERE id = {t1}"
    ));
    assert_eq!(row[0][0], Value::Text("cancelled".into()));
    assert_eq!(row[0][1], Value::Text("its owner was gone".into()));
    let Value::Integer(at) = row[0][2] else {
        panic!("no end: {row:?}")
    };
    m.assert_now(at, now.max(try_started(m, t1)), span);
    // A decided publish finished by the recoverer: what the intent recorded stays where the
    // end says nothing.
    let mut published = record(TryState::Succeeded);
    published.verdict = Some(Verdict::PublishedEmpty);
    published.source_rows = Some(9);
    assert!(m.ok(move |s| s.end_abandoned_try(t2, &published, now)));
    assert_eq!(
        m.rows(&format!(
            "SELECT state, rows, fingerprint, verdict, source_rows, publishing FROM task_tries WHERE id = {t2}"
        )),
        [vec![
            Value::Text("succeeded".into()),
            Value::Integer(5),
            Value::Text("fp".into()),
            Value::Text("published empty".into()),
            Value::Integer(9),
            Value::Integer(0),
        ]]
    );
    // The runs: 0 and 2 have every task succeeded; 1 did not; 3 is kept (its try runs on).
    let (runs, c) = ([r0, r1, r2, r3], "its owner was gone");
    m.ok(move |s| s.end_abandoned_runs(&runs, &|dag| (dag == "d").then_some(1), &[r3], c, now));
    let states = m.rows("SELECT id, state, error FROM runs ORDER BY id");
    let v = |s: &str| Value::Text(s.into());
    assert_eq!(
        states,
        [
            vec![Value::Integer(r0), v("succeeded"), Value::Null],
            vec![Value::Integer(r1), v("cancelled"), v("its owner was gone")],
            vec![Value::Integer(r2), v("succeeded"), Value::Null],
            vec![Value::Integer(r3), v("running"), Value::Null],
        ]
    );
    let held: Vec<i64> = (0..4)
        .filter(|&d| m.read().holds_lease(1, "d", start(d)).unwrap())
        .collect();
    assert_eq!(held, [3]);
    assert_eq!(m.read().runs_in_progress(claimed).unwrap(), [r3]);
    // A DAG whose tasks are unknown: nothing counts as done.
    m.ok(move |s| s.end_abandoned_runs(&[r3], &|_| None, &[], "unknown", now));
    assert_eq!(
        m.value(&format!("SELECT state FROM runs WHERE id = {r3}")),
        v("cancelled")
    );
    assert_eq!(
        m.read().backfill(1).unwrap().unwrap().state,
        BackfillState::Cancelled
    );
}

/// Run ids reserved ahead (PostgreSQL: the runs' own sequence, so a process can name a run
/// before its try's process starts) are recorded with their try's process group in the start;
/// an id reserved before a newer run of its interval was recorded is stale and records
/// nothing. SQLite reserves none and refuses a start with one.
pub fn run_ids_are_reserved_ahead_on_postgresql_only(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    let ids = m.ok(|s| s.reserve_run_ids(3));
    let early = |run_id| Early {
        run_id,
        group: LIVE_GROUP,
    };
    let start_early = |d: i64, run_id: i64| {
        m.step(move |s| {
            s.start_run_and_try(
                s.fence(owner)?,
                "d",
                day(d),
                backfill::clock::now_ms(),
                TIMEOUT_MS,
                "t",
                1,
                LOG,
                Some(early(run_id)),
            )
        })
    };
    if !m.is_postgres() {
        assert!(ids.is_empty());
        match start_early(0, 1) {
            Err(Error::Invalid(why)) => {
                assert!(
                    why.contains("run ids are reserved on a PostgreSQL manifest only"),
                    "{why}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(m.int("SELECT COUNT(*) FROM runs"), 0);
        return;
    }
    assert_eq!(ids.len(), 3);
    assert!(ids.windows(2).all(|w| w[1] > w[0]), "{ids:?}");
    let (started, t) = start_early(0, ids[0]).unwrap();
    assert_eq!(started, Start::Run(ids[0]));
    let t = t.unwrap();
    assert_eq!(
        m.rows(&format!(
            "SELECT pgid, pgid_start, log_path FROM task_tries WHERE id = {t}"
        )),
        [vec![
            Value::Integer(LIVE_GROUP.pgid),
            Value::Integer(LIVE_GROUP.leader_start.unwrap()),
            Value::Text(format!("/logs/run{}.try1.log", ids[0])),
        ]]
    );
    // A start without a reserved id takes a larger one; the older reserved id is stale there.
    let (later, ended) = start_run(m, owner, "d", 1, "t");
    assert!(later > ids[2]);
    end_run(
        m,
        owner,
        (later, ended),
        RunState::Failed,
        record(TryState::Failed),
    );
    let c = alive();
    m.ok(move |s| s.take_leases(1, "d", &mut std::iter::once(day(1)), &c));
    assert_eq!(start_early(1, ids[1]).unwrap(), (Start::Stale, None));
    // Elsewhere it is recorded as reserved.
    assert_eq!(start_early(2, ids[2]).unwrap().0, Start::Run(ids[2]));
    assert_eq!(m.int("SELECT COUNT(*) FROM runs"), 3);
}

/// Ends that carry a staged output supersede the interval's older staged outputs of the same
/// backfill and task (see `staging`); here: a try ends as staged through the combined end.
pub fn a_staged_end_goes_through_the_combined_end(m: &Engine) {
    let owner = planned(m, request("d"), 1, &alive());
    let ids = start_run(m, owner, "d", 0, "t");
    let mut rec = record(TryState::Succeeded);
    rec.staged = Some(StagedState::Staged);
    rec.staged_path = Some("/staged/1".into());
    end_run(m, owner, ids, RunState::Succeeded, rec);
    assert_eq!(
        m.rows(&format!(
            "SELECT staged, staged_path FROM task_tries WHERE id = {}",
            ids.1
        )),
        [vec![
            Value::Text("staged".into()),
            Value::Text("/staged/1".into())
        ]]
    );
    assert!(m.read().is_staged(ids.1).unwrap());
    assert!(!m.read().holds_lease(1, "d", start(0)).unwrap());
}

/// Text that the manifest is given: quotes, backslashes, `?1` and `$1` as the statements
/// write parameters, percent signs, every plane of Unicode, empty text, and a long value.
pub const TEXTS: &[&str] = &[
    "it's \"quoted\" \\ back\\slashed",
    "?1 ?2 $1 %s %% _ ;--",
    "ünïcødé 日本語 🦀 \u{7f} \t\r\n",
    "",
];

/// Every text and integer a try's record can carry reads back exactly as it was written,
/// whatever it holds, at the extremes of the integers.
pub fn values_round_trip_exactly(m: &Engine) {
    let long = "x".repeat(200_000);
    let owner = planned(m, request("d"), 1, &alive());
    let (_, t) = start_run(m, owner, "d", 0, "t");
    let mut texts: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
    texts.push(long);
    // Documents (a try's partitions and inputs, a backfill's conf and definition) are JSON,
    // holding any text, as the program writes them: spaced as written, a NUL escaped.
    let doc = |values: &[&str]| serde_json::to_string(values).unwrap();
    let partitions = doc(&[&texts[0], "nul \0 and \u{FFFF}", &texts[2]]);
    let inputs = format!("[ {} ,\n {{\"b\": 1, \"a\": [] }} ]", doc(&[&texts[1]]));
    let mut rec = record(TryState::Failed);
    rec.error = Some(texts.concat());
    rec.partitions = Some(partitions.clone());
    rec.inputs = Some(inputs.clone());
    rec.fingerprint = Some(texts[2].clone());
    rec.verdict = Some(Verdict::Rejected);
    rec.reasons = Some(texts[4].clone());
    rec.source_fingerprint = Some(texts[2].clone());
    rec.rows = Some(i64::MAX);
    rec.source_rows = Some(i64::MIN);
    rec.previous_rows = Some(0);
    rec.exit_code = Some(i32::MIN);
    rec.rows_inserted = Some(-1);
    let written = rec.clone();
    m.ok(move |s| s.finish_try(s.fence(owner)?, t, &written, after(3_000)));
    let v = |s: &str| Value::Text(s.to_string());
    assert_eq!(
        m.rows(&format!(
            "SELECT error, partitions, inputs, fingerprint, verdict, reasons, source_fingerprint,
                    rows, source_rows, previous_rows, exit_code, rows_inserted
             FROM task_tries WHERE id = {t}"
        )),
        [vec![
            v(&texts.concat()),
            v(&partitions),
            v(&inputs),
            v(&texts[2]),
            v("rejected"),
            v(&texts[4]),
            v(&texts[2]),
            Value::Integer(i64::MAX),
            Value::Integer(i64::MIN),
            Value::Integer(0),
            Value::Integer(i64::from(i32::MIN)),
            Value::Integer(-1),
        ]]
    );
    let tries = m.read().interval_tries(1, start(0)).unwrap();
    assert_eq!(tries[0].error.as_deref(), Some(texts.concat().as_str()));
    assert_eq!(tries[0].rows, Some(i64::MAX));
    // A backfill's own texts.
    let req = NewBackfill {
        from_arg: TEXTS[0].into(),
        to_arg: TEXTS[1].into(),
        conf: r#"{"q": "it's ?1 \"x\" 🦀"}"#.into(),
        definition: Some(doc(&[TEXTS[2]])),
        ..request("dag ?1 'quoted' 🦀")
    };
    let b = insert(m, req, &alive());
    let got = m.read().backfill(b.backfill_id).unwrap().unwrap();
    assert_eq!(
        (
            got.dag_id.as_str(),
            got.from_arg.as_str(),
            got.to_arg.as_str()
        ),
        ("dag ?1 'quoted' 🦀", TEXTS[0], TEXTS[1])
    );
    assert_eq!(got.conf, r#"{"q": "it's ?1 \"x\" 🦀"}"#);
    assert_eq!(got.definition, Some(doc(&[TEXTS[2]])));
    assert_eq!(m.read().latest_backfill(None).unwrap(), Some(b.backfill_id));
    assert_eq!(
        m.read()
            .list_backfills(Some("dag ?1 'quoted' 🦀"), false)
            .unwrap()
            .len(),
        1
    );
}

/// A NUL character is text like any other: what a task's result file says (its fingerprint,
/// say) is recorded and reads back as it was.
pub fn a_nul_character_round_trips(m: &Engine) {
    let owner = planned(m, request("d"), 1, &alive());
    let (_, t) = start_run(m, owner, "d", 0, "t");
    let mut rec = record(TryState::Succeeded);
    rec.fingerprint = Some("before\0after".into());
    m.write(move |s| s.finish_try(s.fence(owner)?, t, &rec, after(3_000)))
        .unwrap_or_else(|e| panic!("a fingerprint holding a NUL was not recorded: {e}"));
    assert_eq!(
        m.value(&format!(
            "SELECT fingerprint FROM task_tries WHERE id = {t}"
        )),
        Value::Text("before\0after".into())
    );
}
