//! Pools: at most a pool's size of tries hold its slots at once, across backfills; a slot is
//! freed when its try ended, or its owner is gone and its process group with it.

use backfill::manifest::pools::{Limits, Take};
use backfill::plan::RunState;
use backfill::state::TryState;
use rusqlite::types::Value;

use crate::support::*;

/// Slots are taken up to the pool's size, across backfills; a try that finds none free is
/// recorded as waiting for the pool (and `show` says so) until it takes one; the slot of a try
/// that ended is freed by the next taker; other pools are counted apart.
pub fn pool_slots_are_taken_up_to_the_size_and_freed_when_their_try_ends(m: &Engine) {
    let a = planned(m, request("d"), 3, &alive());
    let b = planned_days(m, request("e"), [0], &other());
    let (ra, ta) = start_run(m, a, "d", 0, "t");
    let (_, ta1) = start_run(m, a, "d", 1, "t");
    let (_, ta2) = start_run(m, a, "d", 2, "t");
    let (_, tb) = start_run(m, b, "e", 0, "u");
    let take_at =
        |who, t: i64, pool: &'static str, size: u32, c: backfill::manifest::leases::LeaseCtx| {
            m.ok(move |s| s.take_pool_slot(s.fence(who)?, pool, Limits { size, rate: None }, t, &c))
        };
    let take = |who, t, pool, size| take_at(who, t, pool, size, other());
    let now = other();
    let (taken, span) = m.timed(|| take_at(a, ta, "p", 2, now.clone()));
    assert_eq!(taken, Take::Taken);
    assert_eq!(take(b, tb, "p", 2), Take::Taken);
    assert_eq!(take(a, ta1, "p", 2), Take::Full);
    assert_eq!(take(a, ta2, "q", 1), Take::Taken, "another pool");
    let r = m.read();
    assert!(r.holds_pool_slot(ta).unwrap() && r.holds_pool_slot(tb).unwrap());
    assert!(r.holds_pool_slot(ta2).unwrap());
    assert!(!r.holds_pool_slot(ta1).unwrap());
    assert_eq!(
        m.rows(&format!(
            "SELECT waiting_for FROM task_tries WHERE id = {ta1}"
        )),
        [vec![Value::Text("p".into())]]
    );
    let show = r.show_backfill(1).unwrap().unwrap();
    assert_eq!(
        show.interval_details[1]
            .state
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("waiting for pool p")
    );
    let slots: Vec<_> = r
        .pool_slots()
        .unwrap()
        .into_iter()
        .map(|s| {
            (
                s.pool,
                s.backfill_id,
                s.try_id,
                s.dag_id,
                s.interval_start.to_string(),
                s.task,
                s.host,
            )
        })
        .collect();
    let here = Some(HERE.to_string());
    assert_eq!(
        slots,
        [
            (
                "p".into(),
                1,
                ta,
                "d".into(),
                rfc(0),
                "t".into(),
                here.clone()
            ),
            (
                "p".into(),
                2,
                tb,
                "e".into(),
                rfc(0),
                "u".into(),
                here.clone()
            ),
            (
                "q".into(),
                1,
                ta2,
                "d".into(),
                rfc(2),
                "t".into(),
                here.clone()
            ),
        ]
    );
    let first = &r.pool_slots().unwrap()[0];
    let taken_at = m.int(&format!(
        "SELECT taken_at FROM pool_slots WHERE try_id = {ta}"
    ));
    m.assert_now(taken_at, now.now_ms, span);
    assert_eq!(first.taken_at, rfc_ms(taken_at));
    assert_eq!(
        r.figures().unwrap().pool_slots,
        [("p".to_string(), 2), ("q".to_string(), 1)]
    );

    // The first try ends: its slot goes to the waiting try, which waits no more.
    end_run(
        m,
        a,
        (ra, ta),
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    assert!(
        r.holds_pool_slot(ta).unwrap(),
        "until the next taker frees it"
    );
    assert_eq!(take(a, ta1, "p", 2), Take::Taken);
    assert!(!r.holds_pool_slot(ta).unwrap());
    assert_eq!(
        m.rows(&format!(
            "SELECT waiting_for FROM task_tries WHERE id = {ta1}"
        )),
        [vec![Value::Null]]
    );
    assert_eq!(
        r.show_backfill(1).unwrap().unwrap().interval_details[1]
            .state
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("running")
    );
    // Full again: the next try waits.
    assert_eq!(take(a, ta2, "p", 2), Take::Full);
    assert_eq!(m.int("SELECT COUNT(*) FROM pool_slots WHERE pool = 'p'"), 2);
}

/// The slot of a try whose owner is gone is freed only once its process group is gone too:
/// while the group runs on this host the taker is told to kill it first (and waits); a try
/// whose group is gone is cancelled, saying why, and its slot goes to the taker.
pub fn a_gone_owners_slot_is_freed_once_its_group_is_gone(m: &Engine) {
    let gone = planned(m, request("d"), 2, &dead());
    let (_, g0) = start_run(m, gone, "d", 0, "t");
    let (_, g1) = start_run(m, gone, "d", 1, "t");
    for (t, group) in [(g0, LIVE_GROUP), (g1, DEAD_GROUP)] {
        assert!(
            m.step(move |s| s.set_try_group(s.fence(gone)?, t, group, HERE))
                .unwrap()
        );
    }
    let take_at =
        |who, t: i64, pool: &'static str, size: u32, c: backfill::manifest::leases::LeaseCtx| {
            m.ok(move |s| s.take_pool_slot(s.fence(who)?, pool, Limits { size, rate: None }, t, &c))
        };
    let take = |who, t, pool, size| take_at(who, t, pool, size, other());
    assert_eq!(take(gone, g0, "p", 1), Take::Taken);
    assert_eq!(take(gone, g1, "q", 1), Take::Taken);
    let live = planned_days(m, request("e"), [0, 1], &alive());
    let (_, l0) = start_run(m, live, "e", 0, "t");
    let (_, l1) = start_run(m, live, "e", 1, "t");
    assert_eq!(take(live, l0, "p", 1), Take::Kill(vec![LIVE_GROUP]));
    assert!(m.read().holds_pool_slot(g0).unwrap());
    assert_eq!(
        m.rows(&format!(
            "SELECT waiting_for FROM task_tries WHERE id = {l0}"
        )),
        [vec![Value::Text("p".into())]]
    );
    let now = other();
    let (taken, span) = m.timed(|| take_at(live, l1, "q", 1, now.clone()));
    assert_eq!(taken, Take::Taken);
    assert!(!m.read().holds_pool_slot(g1).unwrap());
    let row = m.rows(&format!(
        "SELECT state, error, ended_at FROM task_tries WHERE id = {g1}"
    ));
    assert_eq!(row[0][0], Value::Text("cancelled".into()));
    assert_eq!(
        row[0][1],
        Value::Text("its backfill's owner was gone; its pool slot was given to another try".into())
    );
    let Value::Integer(ended) = row[0][2] else {
        panic!("{row:?}")
    };
    m.assert_now(ended, now.now_ms.max(try_started(m, g1)), span);
    // The try whose group still runs here is left as it is, to be killed.
    assert_eq!(
        m.value(&format!("SELECT state FROM task_tries WHERE id = {g0}")),
        Value::Text("running".into())
    );
}

/// A pool's rate: at most its number of starts in any window of its period, counted at the
/// manifest's clock across backfills; a try refused by the rate holds no slot, is recorded as
/// waiting for `pool (rate)`, and is told how long until the window has room.
pub fn a_pools_rate_bounds_its_starts_in_any_window(m: &Engine) {
    let a = planned(m, request("d"), 3, &alive());
    let b = planned_days(m, request("e"), [0], &other());
    let (_, t0) = start_run(m, a, "d", 0, "t");
    let (_, t1) = start_run(m, a, "d", 1, "t");
    let (_, t2) = start_run(m, a, "d", 2, "t");
    let (_, tb) = start_run(m, b, "e", 0, "u");
    let per_ms = 400;
    let limits = Limits {
        size: 5,
        rate: Some((2, per_ms)),
    };
    let take = |who, t: i64| {
        let c = other();
        m.ok(move |s| s.take_pool_slot(s.fence(who)?, "r", limits, t, &c))
    };
    assert_eq!(take(a, t0), Take::Taken);
    assert_eq!(
        take(b, tb),
        Take::Taken,
        "another backfill's start counts too"
    );
    let Take::Rate { wait_ms } = take(a, t1) else {
        panic!("a third start within the period");
    };
    assert!((1..=per_ms).contains(&wait_ms), "{wait_ms}");
    let r = m.read();
    assert!(
        !r.holds_pool_slot(t1).unwrap(),
        "a try waiting for the rate holds no slot"
    );
    assert_eq!(
        m.rows(&format!(
            "SELECT waiting_for FROM task_tries WHERE id = {t1}"
        )),
        [vec![Value::Text("r (rate)".into())]]
    );
    let show = r.show_backfill(a.backfill_id).unwrap().unwrap();
    assert_eq!(
        show.interval_details[1]
            .state
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("waiting for pool r (rate)")
    );
    // Once the window has moved past the first two starts, two more may start, and no third.
    std::thread::sleep(std::time::Duration::from_millis(
        u64::try_from(per_ms).unwrap() + 100,
    ));
    assert_eq!(take(a, t1), Take::Taken);
    assert_eq!(
        m.rows(&format!(
            "SELECT waiting_for FROM task_tries WHERE id = {t1}"
        )),
        [vec![Value::Null]]
    );
    assert_eq!(take(a, t2), Take::Taken);
    assert!(matches!(take(b, tb), Take::Rate { .. }));
}
