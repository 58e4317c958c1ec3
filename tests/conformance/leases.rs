//! Leases: an interval is held by one backfill at a time; whether a lease is held, stale or
//! free follows its owner's liveness (see `manifest::leases`); batches of one backfill's
//! processes do not overlap.

use std::collections::HashSet;

use backfill::manifest::leases::{Judge, Reserved};
use backfill::plan::{Prior, RunState};
use backfill::state::{BackfillState, TryState};

use crate::support::*;

fn starts(days: impl IntoIterator<Item = i64>) -> HashSet<i64> {
    days.into_iter().map(start).collect()
}

/// The leases a plan takes are its backfill's alone: another backfill sees them held (for
/// taking, while their owner runs; for a prediction, while it is alive), plans them in flight,
/// and cannot release them; their holder can.
pub fn a_lease_is_taken_once(m: &Engine) {
    let ctx = alive();
    let (a, span) = m.timed(|| {
        let c = ctx.clone();
        m.ok(move |s| s.insert_backfill(&request("d"), &c))
    });
    plan(m, a, "d", run_rows(0..3), &ctx);
    let judge = other();
    let r = m.read();
    for d in 0..3 {
        assert!(r.holds_lease(1, "d", start(d)).unwrap());
        assert!(!r.holds_lease(2, "d", start(d)).unwrap());
    }
    assert!(!r.holds_lease(1, "d", start(3)).unwrap());
    assert!(!r.holds_lease(1, "other", start(0)).unwrap());
    for judge_by in [Judge::Strict, Judge::Predict] {
        assert_eq!(
            r.held_leases("d", start(0), start(9), &judge, judge_by)
                .unwrap(),
            starts(0..3)
        );
    }
    assert_eq!(
        r.held_leases("d", start(1), start(1), &judge, Judge::Strict)
            .unwrap(),
        starts([1]),
        "both bounds are included"
    );
    assert!(
        r.held_leases("e", start(0), start(9), &judge, Judge::Strict)
            .unwrap()
            .is_empty()
    );
    assert!(r.stale_leases("d", &judge).unwrap().is_empty());
    let days: Vec<_> = (0..4).map(day).collect();
    let held = |in_flight| Prior {
        latest: None,
        in_flight,
        source_changed: false,
    };
    assert_eq!(
        r.priors("d", &days, &judge, Judge::Strict).unwrap(),
        [held(true), held(true), held(true), held(false)]
    );
    assert!(
        r.priors("d", &[], &judge, Judge::Strict)
            .unwrap()
            .is_empty()
    );

    // What the status page and /metrics say of them.
    let views = r.lease_views().unwrap();
    assert_eq!(views.len(), 1);
    let v = &views[0];
    assert_eq!((v.backfill_id, v.dag_id.as_str(), v.leases), (1, "d", 3));
    assert_eq!((v.first.to_string(), v.last.to_string()), (rfc(0), rfc(2)));
    assert_eq!(
        (v.owner_host.as_deref(), v.owner_pid),
        (Some(HERE), Some(LIVE_PID))
    );
    assert_eq!(
        (v.backfill_state, v.owner_start),
        (BackfillState::Running, Some(LIVE_START))
    );
    m.assert_now(v.heartbeat_ms.unwrap(), ctx.now_ms, span);
    assert_eq!(v.heartbeat_at, Some(rfc_ms(v.heartbeat_ms.unwrap())));
    assert_eq!(r.figures().unwrap().leases, 3);

    // Another backfill cannot release them; their holder releases one.
    insert(m, request("d"), &judge);
    m.ok(|s| s.release_lease(2, "d", start(0)));
    assert!(m.read().holds_lease(1, "d", start(0)).unwrap());
    m.ok(|s| s.release_lease(1, "d", start(0)));
    assert!(!m.read().holds_lease(1, "d", start(0)).unwrap());
    assert_eq!(
        m.read()
            .held_leases("d", start(0), start(9), &judge, Judge::Strict)
            .unwrap(),
        starts(1..3)
    );
    assert_eq!(m.read().figures().unwrap().leases, 2);
}

/// A lease whose owner died is stale: held still for taking (a silent owner is freed only by
/// being recovered) but not in a prediction; once its owner is recovered (a takeover ends it),
/// another backfill takes it over, and the old owner holds nothing.
pub fn a_dead_owners_lease_is_stale_and_replaced_once_recovered(m: &Engine) {
    let a = insert(m, request("d"), &dead());
    plan(m, a, "d", run_rows(0..2), &dead());
    let judge = other();
    let r = m.read();
    assert_eq!(
        sorted(r.stale_leases("d", &judge).unwrap()),
        [(start(0), 1), (start(1), 1)]
    );
    assert_eq!(
        r.held_leases("d", start(0), start(1), &judge, Judge::Strict)
            .unwrap(),
        starts(0..2)
    );
    assert!(
        r.held_leases("d", start(0), start(1), &judge, Judge::Predict)
            .unwrap()
            .is_empty()
    );

    let c = judge.clone();
    assert!(m.ok(move |s| s.take_ownership(1, &c, false)).is_some());
    assert!(
        m.read()
            .held_leases("d", start(0), start(1), &judge, Judge::Strict)
            .unwrap()
            .is_empty()
    );
    assert_eq!(m.read().stale_leases("d", &judge).unwrap().len(), 2);

    let b = insert(m, request("d"), &judge);
    let c = judge.clone();
    m.ok(move |s| s.take_leases(b.backfill_id, "d", &mut [day(0), day(1)].into_iter(), &c));
    for d in 0..2 {
        assert!(m.read().holds_lease(2, "d", start(d)).unwrap());
        assert!(!m.read().holds_lease(1, "d", start(d)).unwrap());
    }
    assert!(m.read().stale_leases("d", &judge).unwrap().is_empty());
    let views = m.read().lease_views().unwrap();
    assert_eq!(
        views
            .iter()
            .map(|v| (v.backfill_id, v.leases))
            .collect::<Vec<_>>(),
        [(2, 2)]
    );
}

/// The lease of a run whose try may still run stays held after its owner died: for taking,
/// while the run is unfinished; for a prediction, while the try's process group runs here.
pub fn a_lease_whose_try_may_still_run_stays_held(m: &Engine) {
    let a = planned(m, request("d"), 3, &dead());
    let (_, t0) = start_run(m, a, "d", 0, "t");
    let (_, t1) = start_run(m, a, "d", 1, "t");
    for (t, group) in [(t0, LIVE_GROUP), (t1, DEAD_GROUP)] {
        assert!(
            m.step(move |s| s.set_try_group(s.fence(a)?, t, group, HERE))
                .unwrap()
        );
    }
    let judge = other();
    let c = judge.clone();
    m.ok(move |s| s.take_ownership(1, &c, false));
    let r = m.read();
    assert_eq!(
        r.held_leases("d", start(0), start(2), &judge, Judge::Strict)
            .unwrap(),
        starts(0..2),
        "the unfinished runs' intervals"
    );
    assert_eq!(
        r.held_leases("d", start(0), start(2), &judge, Judge::Predict)
            .unwrap(),
        starts([0]),
        "the interval whose try's group runs here"
    );
    assert_eq!(sorted(r.stale_leases("d", &judge).unwrap()).len(), 3);
}

/// An owner on another host is judged by its heartbeat: alive within the lease timeout; stale
/// once the timeout passed, or once watched silent for a whole timeout.
pub fn a_remote_lease_expires_with_its_heartbeat(m: &Engine) {
    planned(m, request("d"), 2, &remote());
    let judge = other();
    let r = m.read();
    let predicted = |ctx| {
        r.held_leases("d", start(0), start(1), ctx, Judge::Predict)
            .unwrap()
    };
    assert!(r.stale_leases("d", &judge).unwrap().is_empty());
    assert_eq!(predicted(&judge), starts(0..2));
    let late = expired(&judge);
    assert_eq!(
        sorted(r.stale_leases("d", &late).unwrap()),
        [(start(0), 1), (start(1), 1)]
    );
    assert!(predicted(&late).is_empty());
    assert_eq!(
        r.held_leases("d", start(0), start(1), &late, Judge::Strict)
            .unwrap(),
        starts(0..2),
        "its owner still runs, as far as the record says"
    );
    let heartbeat = r.backfill(1).unwrap().unwrap().heartbeat_at;
    let silent = judge.with_silent(heartbeat);
    assert_eq!(r.stale_leases("d", &silent).unwrap().len(), 2);
    assert!(predicted(&silent).is_empty());
}

/// `release_all_but_running` lets go of every lease of a backfill except those of its runs
/// still in progress.
pub fn releasing_all_keeps_the_intervals_of_runs_in_flight(m: &Engine) {
    let a = planned(m, request("d"), 4, &alive());
    start_run(m, a, "d", 0, "t");
    let ids = start_run(m, a, "d", 1, "t");
    end_run(m, a, ids, RunState::Succeeded, record(TryState::Succeeded));
    assert!(
        !m.read().holds_lease(1, "d", start(1)).unwrap(),
        "released by its run's end"
    );
    m.ok(|s| s.release_all_but_running(1));
    let held: Vec<i64> = (0..4)
        .filter(|&d| m.read().holds_lease(1, "d", start(d)).unwrap())
        .collect();
    assert_eq!(held, [0]);
}

/// The processes of one backfill form batches that do not overlap: each takes, up to what it
/// wants, the intervals no other live process of the backfill holds, from the first such to the
/// first another holds after it; a process that ended holds nothing; leasing an interval again
/// drops its holder.
pub fn a_batch_holds_what_no_other_live_process_holds(m: &Engine) {
    let owner = planned(m, request("d"), 10, &alive());
    let c = other();
    let worker = m.ok(move |s| s.join_backfill(1, 2, &c));
    let reserve = |who, days: std::ops::Range<i64>, want: usize| {
        let starts: Vec<i64> = days.map(start).collect();
        let c = other();
        m.ok(move |s| s.reserve_batch(s.fence(who)?, "d", &starts, want, &c))
    };
    let ss = |days: &[i64]| days.iter().map(|&d| start(d)).collect::<Vec<_>>();
    assert_eq!(
        reserve(owner, 0..8, 4),
        Reserved {
            held: ss(&[0, 1, 2, 3]),
            others: vec![],
            left: ss(&[4, 5, 6, 7]),
        }
    );
    assert_eq!(
        reserve(worker, 1..9, 4),
        Reserved {
            held: ss(&[4, 5, 6, 7]),
            others: ss(&[1, 2, 3]),
            left: ss(&[8]),
        }
    );
    assert_eq!(m.read().worker_starts_in_flight(1).unwrap(), starts(4..8));
    // Backwards: the owner stops at the first interval another holds after those it took.
    let starts_back: Vec<i64> = (2..10).rev().map(start).collect();
    let c = other();
    let back = m.ok(move |s| s.reserve_batch(s.fence(owner)?, "d", &starts_back, 8, &c));
    assert_eq!(
        back,
        Reserved {
            held: ss(&[9, 8]),
            others: ss(&[7, 6, 5, 4]),
            left: ss(&[3, 2]),
        }
    );
    assert_eq!(reserve(owner, 0..0, 4), Reserved::default());
    // The worker ends: what its batches held is free for the owner.
    m.ok(move |s| s.finish_backfill(worker, BackfillState::Completed, after(10)));
    assert!(m.read().worker_starts_in_flight(1).unwrap().is_empty());
    assert_eq!(reserve(owner, 4..8, 8).held, ss(&[4, 5, 6, 7]));
    // A worker judges the owner's holds as any lease's owner: by its heartbeat, from another
    // host; once that expired, they count for nothing.
    let c = other();
    let second = m.ok(move |s| s.join_backfill(1, 2, &c));
    let first_four: Vec<i64> = (0..4).map(start).collect();
    let reserve_as = |ctx: backfill::manifest::leases::LeaseCtx| {
        let starts = first_four.clone();
        m.ok(move |s| s.reserve_batch(s.fence(second)?, "d", &starts, 4, &ctx))
    };
    assert_eq!(
        reserve_as(remote()),
        Reserved {
            held: vec![],
            others: ss(&[0, 1, 2, 3]),
            left: vec![],
        }
    );
    assert_eq!(reserve_as(expired(&remote())).held, ss(&[0, 1, 2, 3]));
    assert_eq!(m.read().worker_starts_in_flight(1).unwrap(), starts(0..4));
    // A lease taken again drops its holder.
    let c = other();
    m.ok(move |s| s.take_leases(1, "d", &mut std::iter::once(day(0)), &c));
    assert_eq!(m.read().worker_starts_in_flight(1).unwrap(), starts(1..4));
}
