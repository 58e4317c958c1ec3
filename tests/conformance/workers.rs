//! Workers: processes that join a running backfill, each fenced by its own epoch; a gone one
//! is taken away and its runs recovered with the owner's.

use backfill::manifest::backfills::{Heartbeat, Owner};
use backfill::manifest::leases::LeaseCtx;
use backfill::plan::RunState;
use backfill::state::{BackfillState, TryState};
use serde_json::json;

use crate::support::*;

fn join(m: &Engine, backfill_id: i64, max_active_runs: u32, ctx: &LeaseCtx) -> Owner {
    let c = ctx.clone();
    m.ok(move |s| s.join_backfill(backfill_id, max_active_runs, &c))
}

/// A worker joins with its own record (its process, a heartbeat, epoch 0), beats apart from
/// the owner and hears of a cancel or of its backfill's end; it runs the backfill's intervals
/// as its own runs on its host; its end is its own (the backfill's leases stay); once ended it
/// may write nothing more.
pub fn a_worker_joins_beats_runs_and_ends(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    let owner_beat = m.read().backfill(1).unwrap().unwrap().heartbeat_at;
    assert!(!m.read().has_workers(1).unwrap());
    let ctx = remote();
    let (worker, span) = m.timed(|| join(m, 1, 3, &ctx));
    assert_eq!(
        worker,
        Owner {
            backfill_id: 1,
            epoch: 0,
            worker: Some(1)
        }
    );
    assert!(m.read().has_workers(1).unwrap());
    let ws = m.read().workers(1).unwrap();
    assert_eq!(ws.len(), 1);
    let w = &ws[0];
    assert_eq!((w.id, w.backfill_id, w.epoch), (1, 1, 0));
    assert_eq!(
        (w.pid, w.start, w.host.as_deref()),
        (Some(9_999), Some(1), Some(ELSEWHERE))
    );
    assert_eq!(
        (w.state, w.max_active_runs, w.finished_at),
        (BackfillState::Running, 3, None)
    );
    m.assert_now(w.started_at, ctx.now_ms, span);
    assert_eq!(w.heartbeat_at, Some(w.started_at));
    assert!(w.alive(&other()));
    assert!(!w.alive(&expired(&other())));
    assert!(m.read().workers(2).unwrap().is_empty());

    // Its heartbeat is its own.
    let now = backfill::clock::now_ms() + 10;
    let (beat, span) = m.timed(|| m.ok(move |s| s.heartbeat(worker, now)));
    assert_eq!(beat, Heartbeat::Carry);
    m.assert_now(
        m.read().workers(1).unwrap()[0].heartbeat_at.unwrap(),
        now,
        span,
    );
    assert_eq!(
        m.read().backfill(1).unwrap().unwrap().heartbeat_at,
        owner_beat
    );

    // Its runs: the backfill's, marked as its, on its host.
    let (run, t) = start_run(m, worker, "d", 1, "t");
    assert_eq!(
        m.int(&format!("SELECT worker FROM runs WHERE id = {run}")),
        1
    );
    assert_eq!(
        m.read().interval_tries(1, start(1)).unwrap()[0]
            .host
            .as_deref(),
        Some(ELSEWHERE)
    );
    assert_eq!(
        m.read().runs_in_progress(worker).unwrap(),
        [run],
        "a worker's own runs"
    );
    assert!(
        m.read().runs_in_progress(owner).unwrap().is_empty(),
        "a live worker's runs are its own to finish"
    );
    assert_eq!(
        m.read().worker_starts_in_flight(1).unwrap(),
        [start(1)].into_iter().collect()
    );
    // Its publish: consented to the worker at its epoch, not to the backfill's owner.
    let intent = record(TryState::Succeeded);
    assert!(m.ok(move |s| s.record_publish_intent(s.fence(worker)?, t, None, &intent)));
    let r = m.read();
    assert!(r.may_publish(t, Some(worker), true).unwrap());
    assert!(
        !r.may_publish(t, Some(Owner { epoch: 1, ..worker }), true)
            .unwrap()
    );
    assert!(
        !r.may_publish(
            t,
            Some(Owner {
                worker: Some(2),
                ..worker
            }),
            true
        )
        .unwrap()
    );
    assert!(!r.may_publish(t, Some(owner), true).unwrap());
    assert!(r.may_publish(t, None, true).unwrap());
    end_run(
        m,
        worker,
        (run, t),
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    assert!(m.read().worker_starts_in_flight(1).unwrap().is_empty());

    m.ok(|s| s.request_cancel(1));
    assert_eq!(
        m.ok(move |s| s.heartbeat(worker, backfill::clock::now_ms())),
        Heartbeat::CancelRequested
    );

    // Its end: its own, the backfill's leases stay.
    let (_, span) = m
        .timed(|| m.ok(move |s| s.finish_backfill(worker, BackfillState::Completed, after(6_000))));
    let w = &m.read().workers(1).unwrap()[0];
    assert_eq!(w.state, BackfillState::Completed);
    m.assert_now(w.finished_at.unwrap(), w.heartbeat_at.unwrap(), span);
    assert_eq!(
        m.read().backfill(1).unwrap().unwrap().state,
        BackfillState::Running
    );
    assert!(m.read().holds_lease(1, "d", start(0)).unwrap());
    assert_fenced(
        m.write(move |s| s.heartbeat(worker, backfill::clock::now_ms())),
        1,
    );
    assert!(
        m.read().has_workers(1).unwrap(),
        "a backfill that ever had a worker"
    );

    // What `show` says of its workers.
    let show = serde_json::to_value(m.read().show_backfill(1).unwrap().unwrap().workers).unwrap();
    let w = &m.read().workers(1).unwrap()[0];
    assert_eq!(
        show,
        json!([{
            "id": 1, "host": ELSEWHERE, "pid": 9_999, "state": "completed", "alive": false,
            "max_active_runs": 3, "started_at": rfc_ms(w.started_at),
            "finished_at": rfc_ms(w.finished_at.unwrap()), "runs": 1
        }])
    );
}

/// A worker hears that the backfill it helps has ended.
pub fn a_worker_hears_that_its_backfill_ended(m: &Engine) {
    let owner = planned(m, request("d"), 1, &alive());
    let worker = join(m, 1, 1, &other());
    m.ok(move |s| s.finish_backfill(owner, BackfillState::Completed, after(3_000)));
    assert_eq!(
        m.ok(move |s| s.heartbeat(worker, backfill::clock::now_ms())),
        Heartbeat::Ended
    );
}

/// A gone worker is taken away (a new epoch, cancelled); live and ended ones are left; the
/// gone worker is fenced out; its runs are recovered with the owner's, and its own claim
/// finds them too.
pub fn a_gone_worker_is_taken_away_and_fenced(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    let gone = join(m, 1, 1, &dead());
    let live = join(m, 1, 1, &other());
    let ended = join(m, 1, 1, &remote());
    m.ok(move |s| s.finish_backfill(ended, BackfillState::Failed, after(3_000)));
    let (gone_run, gone_try) = start_run(m, gone, "d", 0, "t");
    let (live_run, _) = start_run(m, live, "d", 1, "t");
    let judge = other();
    let c = judge.clone();
    let (taken, span) = m.timed(|| m.ok(move |s| s.take_gone_workers(1, &c)));
    assert_eq!(
        taken,
        [Owner {
            backfill_id: 1,
            epoch: 1,
            worker: Some(1)
        }]
    );
    let ws = m.read().workers(1).unwrap();
    let states: Vec<_> = ws.iter().map(|w| (w.id, w.state, w.epoch)).collect();
    assert_eq!(
        states,
        [
            (1, BackfillState::Cancelled, 1),
            (2, BackfillState::Running, 0),
            (3, BackfillState::Failed, 0),
        ]
    );
    m.assert_now(
        ws[0].finished_at.unwrap(),
        judge.now_ms.max(ws[0].started_at),
        span,
    );
    assert_fenced(
        m.write(move |s| s.heartbeat(gone, backfill::clock::now_ms())),
        1,
    );
    assert_fenced(
        m.write(move |s| s.set_try_audit(s.fence(gone)?, gone_try, "/x")),
        1,
    );
    let c = judge.clone();
    assert!(m.ok(move |s| s.take_gone_workers(1, &c)).is_empty(), "once");
    // Its runs: its claim's, and the owner's (a worker no longer running); the live worker's
    // are its own.
    assert_eq!(m.read().runs_in_progress(taken[0]).unwrap(), [gone_run]);
    assert_eq!(m.read().runs_in_progress(owner).unwrap(), [gone_run]);
    assert_eq!(m.read().runs_in_progress(live).unwrap(), [live_run]);
    let tries: Vec<i64> = m
        .read()
        .unfinished_tries(taken[0])
        .unwrap()
        .iter()
        .map(|u| u.try_id)
        .collect();
    assert_eq!(tries, [gone_try]);
    assert_eq!(
        m.read().worker_starts_in_flight(1).unwrap(),
        [start(1)].into_iter().collect(),
        "the live worker's run"
    );
}
