//! `forget`: a DAG's history over a range removed in one transaction and recorded; refused
//! while any of it is in use; the ids it held never given again.

use backfill::manifest::forgets::{Busy, Span};
use backfill::plan::RunState;
use backfill::state::{BackfillState, TryState};

use crate::support::*;

fn span(lo: i64, hi: i64) -> Span<'static> {
    Span {
        args: Some(("2026-01-02", "2026-01-03")),
        starts: Some((start(lo), start(hi))),
    }
}

/// Days 0-3 of DAG d run in one backfill; removing days 1-2 keeps the backfill with days 0
/// and 3, counts what went, and records it; the scope then reads empty.
pub fn a_range_is_removed_and_recorded(m: &Engine) {
    let ctx = alive();
    let a = planned(m, request("d"), 4, &ctx);
    for d in 0..4 {
        let run = start_run(m, a, "d", d, "t");
        end_run(m, a, run, RunState::Succeeded, record(TryState::Succeeded));
    }
    m.ok(move |s| s.finish_backfill(a, BackfillState::Completed, after(9_000)));
    let before = m
        .read()
        .forget_scope("d", Some((start(1), start(2))))
        .unwrap();
    assert_eq!(
        (
            before.backfills.clone(),
            before.kept_backfills.clone(),
            before.runs,
            before.tries
        ),
        (vec![], vec![a.backfill_id], 2, 2)
    );
    assert_eq!(before.busy(), None);
    let f = m
        .ok(move |s| s.forget("d", span(1, 2), ("host-a", 7), 1_000))
        .expect("nothing is in use");
    assert_eq!((f.backfills, f.runs, f.tries), (0, 2, 2));
    assert_eq!(f.args, Some(("2026-01-02".into(), "2026-01-03".into())));
    let r = m.read();
    assert!(
        r.forget_scope("d", Some((start(1), start(2))))
            .unwrap()
            .is_empty()
    );
    assert_eq!(r.forget_scope("d", None).unwrap().runs, 2);
    assert_eq!(r.unfinished_forgets().unwrap(), vec![f.clone()]);
    m.ok(move |s| s.finish_forget(f.id, 3, 2_000));
    assert!(m.read().unfinished_forgets().unwrap().is_empty());
    let done = m.read().forgets_of("d").unwrap();
    assert_eq!((done[0].done, done[0].versions), (true, Some(3)));
}

/// A backfill that ended with a run still in flight (a try that could not be stopped), or a
/// running cascade with a backfill to remove, keeps the range from being removed.
pub fn a_range_in_use_is_not_removed(m: &Engine) {
    let ctx = alive();
    let a = planned(m, request("d"), 2, &ctx);
    let (r0, t0) = start_run(m, a, "d", 0, "t");
    end_run(
        m,
        a,
        (r0, t0),
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    start_run(m, a, "d", 1, "t");
    m.ok(move |s| s.finish_backfill(a, BackfillState::Failed, after(9_000)));
    let busy = m.ok(move |s| s.forget("d", Span::default(), ("host-a", 7), 1_000));
    assert_eq!(busy, Err(Busy::InFlight(vec![a.backfill_id])));
    assert_eq!(
        m.read().forget_scope("d", None).unwrap().runs,
        2,
        "nothing went"
    );

    // A cascade of e over d, still running on e: d's backfill is its root.
    let b = planned(m, request("f"), 1, &ctx);
    m.ok(move |s| s.finish_backfill(b, BackfillState::Completed, after(9_000)));
    let member = backfill::manifest::NewBackfill {
        cascade_of: Some(b.backfill_id),
        ..request("e")
    };
    let c = planned(m, member, 1, &ctx);
    let busy = m.ok(move |s| s.forget("f", Span::default(), ("host-a", 7), 1_000));
    assert_eq!(busy, Err(Busy::Cascade(vec![c.backfill_id])));
}
