//! Plans, and what planning reads of earlier runs.

use std::collections::{BTreeMap, HashMap, HashSet};

use backfill::manifest::NewBackfill;
use backfill::manifest::queries::Seen;
use backfill::plan::{Action, PlanRow, Prior, RunState, SkipReason};
use backfill::state::{BackfillKind, PlanAction, TryState, Verdict};

use crate::support::*;

/// A plan written in chunks reads back row by row in its order (a backwards plan: newest
/// first), by start where a reader asks so, and leases exactly the intervals it runs; skips
/// decided later are recorded, and `skip_planned` also lets the lease go.
pub fn a_plan_is_written_in_chunks_and_read_back_in_order(m: &Engine) {
    let ctx = alive();
    let req = NewBackfill {
        run_backwards: true,
        ..request("d")
    };
    let owner = insert(m, req, &ctx);
    let row = |ord: i64, d: i64, action| {
        (
            ord,
            PlanRow {
                interval: day(d),
                action,
            },
        )
    };
    let first = vec![
        row(0, 5, Action::Run),
        row(1, 4, Action::Run),
        row(2, 3, Action::Skip(SkipReason::AlreadyExists)),
    ];
    let second = vec![
        row(3, 2, Action::Run),
        row(4, 1, Action::Skip(SkipReason::NotYetComplete)),
        row(5, 0, Action::Run),
    ];
    plan(m, owner, "d", first, &ctx);
    assert!(m.read().backfill(1).unwrap().unwrap().planning);
    plan(m, owner, "d", second, &ctx);
    m.ok(move |s| s.mark_planned(owner));

    let r = m.read();
    assert_eq!(
        r.planned_starts(1).unwrap(),
        (0..6).map(start).collect::<HashSet<_>>()
    );
    assert!(r.planned_starts(2).unwrap().is_empty());
    let leased: Vec<i64> = (0..6)
        .filter(|&d| r.holds_lease(1, "d", start(d)).unwrap())
        .collect();
    assert_eq!(leased, [0, 2, 4, 5], "the intervals it runs");
    assert_eq!(
        r.unfinished_intervals(1).unwrap(),
        [day(5), day(4), day(2), day(0)]
    );
    assert_eq!(r.unfinished_count(1).unwrap(), 4);
    let outcomes: Vec<_> = r
        .plan_outcomes(1)
        .unwrap()
        .into_iter()
        .map(|o| (o.start, o.end, o.action, o.state))
        .collect();
    use Action::*;
    assert_eq!(
        outcomes,
        [
            (start(0), start(1), Run, None),
            (start(1), start(2), Skip(SkipReason::NotYetComplete), None),
            (start(2), start(3), Run, None),
            (start(3), start(4), Skip(SkipReason::AlreadyExists), None),
            (start(4), start(5), Run, None),
            (start(5), start(6), Run, None),
        ]
    );
    let details = |d: &backfill::manifest::queries::BackfillDetail| {
        d.interval_details
            .iter()
            .map(|i| (i.ord, i.start.to_string(), i.action, i.reason.clone()))
            .collect::<Vec<_>>()
    };
    let show = r.show_backfill(1).unwrap().unwrap();
    let skip = |why: &str| Some(why.to_string());
    assert_eq!(
        details(&show),
        [
            (0, rfc(5), PlanAction::Run, None),
            (1, rfc(4), PlanAction::Run, None),
            (2, rfc(3), PlanAction::Skip, skip("already exists")),
            (3, rfc(2), PlanAction::Run, None),
            (4, rfc(1), PlanAction::Skip, skip("not yet complete")),
            (5, rfc(0), PlanAction::Run, None),
        ]
    );
    // A page of a backwards plan is in time order; its counts are the whole plan's.
    let page = r.show_backfill_page(1, 1, 3).unwrap().unwrap();
    assert_eq!(
        details(&page),
        [
            (4, rfc(1), PlanAction::Skip, skip("not yet complete")),
            (3, rfc(2), PlanAction::Run, None),
            (2, rfc(3), PlanAction::Skip, skip("already exists")),
        ]
    );
    let c = &page.backfill.intervals;
    assert_eq!((c.total, c.planned, c.skipped, c.pending), (6, 4, 2, 4));
    let past = r.show_backfill_page(1, 6, 3).unwrap().unwrap();
    assert!(past.interval_details.is_empty());
    assert_eq!(past.backfill.intervals.total, 6);
    assert!(r.show_backfill_page(2, 0, 3).unwrap().is_none());

    // Skips decided while running.
    let f = owner;
    m.ok(move |s| {
        s.skip_planned(
            s.fence(f)?,
            "d",
            start(2),
            SkipReason::PreviousNotSuccessful,
        )
    });
    m.ok(|s| s.mark_skipped(1, start(0), SkipReason::InFlight));
    let r = m.read();
    assert!(
        !r.holds_lease(1, "d", start(2)).unwrap(),
        "skip_planned lets the lease go"
    );
    assert!(
        r.holds_lease(1, "d", start(0)).unwrap(),
        "mark_skipped keeps it"
    );
    assert_eq!(r.unfinished_intervals(1).unwrap(), [day(5), day(4)]);
    let outcome = r.outcome(1).unwrap().unwrap();
    assert_eq!(
        outcome.skipped,
        BTreeMap::from([
            ("already exists".to_string(), 1),
            ("in flight".to_string(), 1),
            ("not yet complete".to_string(), 1),
            ("previous interval not successful".to_string(), 1),
        ])
    );
    assert_eq!(
        r.plan_outcomes(1).unwrap()[0].action,
        Skip(SkipReason::InFlight)
    );
    let fenced = owner;
    assert_fenced(
        m.write(move |s| {
            s.skip_planned(
                s.fence(backfill::manifest::backfills::Owner::of(
                    fenced.backfill_id,
                    5,
                ))?,
                "d",
                start(4),
                SkipReason::InFlight,
            )
        }),
        1,
    );
}

/// What planning, cascades and `stale` read of earlier runs: an interval's latest run counts
/// only when its backfill computed it (not a staged, rollback or `--tasks` backfill), the
/// interval before one is the one that ends where it starts, and a succeeded run's tries say
/// what they saw of the source.
pub fn planning_reads_what_earlier_runs_computed(m: &Engine) {
    let ctx = alive();
    let t = |rows, source_rows, fp: &str| {
        let mut rec = record(TryState::Succeeded);
        rec.rows = Some(rows);
        rec.source_rows = Some(source_rows);
        rec.source_fingerprint = Some(fp.to_string());
        rec.fingerprint = Some(format!("out-{fp}"));
        rec
    };
    // 1 (run): day 0 succeeded, day 1 failed.
    let a = planned(m, request("d"), 2, &ctx);
    let a0 = start_run(m, a, "d", 0, "t");
    end_run(m, a, a0, RunState::Succeeded, t(10, 100, "f0"));
    let a1 = start_run(m, a, "d", 1, "t");
    end_run(m, a, a1, RunState::Failed, record(TryState::Failed));
    // 2 (stage): day 1 succeeded; 3 (--tasks): day 0 failed; neither computed the interval.
    let stage = NewBackfill {
        kind: BackfillKind::Stage,
        ..request("d")
    };
    let s = planned_days(m, stage, [1], &ctx);
    let s1 = start_run(m, s, "d", 1, "t");
    let mut staged = t(11, 101, "f1");
    staged.verdict = Some(Verdict::Staged);
    end_run(m, s, s1, RunState::Succeeded, staged);
    let partial = NewBackfill {
        tasks: Some(vec!["t".into()]),
        ..request("d")
    };
    let p = planned_days(m, partial, [0], &ctx);
    let p0 = start_run(m, p, "d", 0, "t");
    end_run(m, p, p0, RunState::Failed, record(TryState::Failed));
    // 4 (run): day 2 rejected; day 0 succeeded again.
    let b = planned_days(m, request("d"), [2, 0], &ctx);
    let b2 = start_run(m, b, "d", 2, "t");
    end_run(m, b, b2, RunState::Rejected, record(TryState::Rejected));
    let b0 = start_run(m, b, "d", 0, "t");
    end_run(m, b, b0, RunState::Succeeded, t(12, 102, "f2"));

    let r = m.read();
    let judge = other();
    let prior = |latest| Prior {
        latest,
        in_flight: false,
        source_changed: false,
    };
    let days: Vec<_> = (0..4).map(day).collect();
    assert_eq!(
        r.priors(
            "d",
            &days,
            &judge,
            backfill::manifest::leases::Judge::Strict
        )
        .unwrap(),
        [
            prior(Some(RunState::Succeeded)),
            prior(Some(RunState::Failed)),
            prior(Some(RunState::Rejected)),
            prior(None),
        ]
    );
    assert_eq!(
        r.state_before("d", start(1)).unwrap(),
        Some(RunState::Succeeded)
    );
    assert_eq!(
        r.state_before("d", start(3)).unwrap(),
        Some(RunState::Rejected)
    );
    assert_eq!(r.state_before("d", start(0)).unwrap(), None);
    assert_eq!(
        r.state_before("d", start(3) + 60).unwrap(),
        None,
        "a gap before it"
    );
    assert_eq!(
        r.latest_runs("d", start(0), start(3)).unwrap(),
        HashMap::from([
            (start(0), (RunState::Succeeded, 4, run_started(m, b0.0))),
            (start(1), (RunState::Failed, 1, run_started(m, a1.0))),
            (start(2), (RunState::Rejected, 4, run_started(m, b2.0))),
        ])
    );
    assert_eq!(
        r.latest_computing_state("d", start(1)).unwrap(),
        Some(RunState::Failed)
    );
    assert_eq!(r.latest_computing_state("d", start(3)).unwrap(), None);
    assert_eq!(
        r.last_success("d", start(0)).unwrap(),
        Some(run_started(m, b0.0))
    );
    assert_eq!(
        r.last_success("d", start(1)).unwrap(),
        None,
        "a staged run computes nothing"
    );
    assert_eq!(
        r.unsettled("d", start(0), start(3)).unwrap(),
        [("failed".to_string(), 1), ("rejected".to_string(), 1)]
    );
    assert!(r.unsettled("d", start(0), start(0)).unwrap().is_empty());
    let recorded = r.recorded_sources("d", start(0), start(3)).unwrap();
    assert_eq!(recorded.len(), 1);
    let (interval, seen) = &recorded[&start(0)];
    assert_eq!(*interval, day(0));
    assert_eq!(
        *seen,
        HashMap::from([(
            "t".to_string(),
            Seen {
                source_rows: Some(102),
                source_fingerprint: Some("f2".into()),
            }
        )])
    );
    // An interval's succeeded tries, in the order they were made, staged ones left out.
    let ended = |t: i64| Some(try_started(m, t) + TRY_MS + t);
    assert_eq!(
        r.succeeded_tries("d", start(0)).unwrap(),
        [
            ("t".to_string(), Some("out-f0".to_string()), ended(a0.1)),
            ("t".to_string(), Some("out-f2".to_string()), ended(b0.1)),
        ]
    );
    assert!(r.succeeded_tries("d", start(1)).unwrap().is_empty());
    // How long the task's successful tries took, newest first (ends measured: exact).
    assert_eq!(
        r.recent_durations_ms("d", "t", 10).unwrap(),
        [TRY_MS + b0.1, TRY_MS + s1.1, TRY_MS + a0.1]
    );
    assert_eq!(r.recent_durations_ms("d", "t", 1).unwrap(), [TRY_MS + b0.1]);
    assert!(r.recent_durations_ms("d", "other", 10).unwrap().is_empty());
    assert!(r.any_succeeded(1).unwrap());
    assert!(!r.any_succeeded(3).unwrap());
}

/// A plan chunk far larger than one statement's parameters (PostgreSQL writes it in several)
/// is written whole, in its order, with every lease.
pub fn a_large_plan_chunk_is_written_whole(m: &Engine) {
    const N: i64 = 5_000;
    let ctx = alive();
    let owner = insert(m, request("d"), &ctx);
    let rows: Vec<(i64, PlanRow)> = (0..N)
        .map(|i| {
            let action = if i % 7 == 3 {
                Action::Skip(SkipReason::AlreadyExists)
            } else {
                Action::Run
            };
            (
                i,
                PlanRow {
                    interval: day(N - 1 - i),
                    action,
                },
            )
        })
        .collect();
    let skipped = rows.iter().filter(|(_, r)| r.action != Action::Run).count() as i64;
    plan(m, owner, "d", rows, &ctx);
    let r = m.read();
    assert_eq!(r.planned_starts(1).unwrap().len() as i64, N);
    let unfinished = r.unfinished_intervals(1).unwrap();
    assert_eq!(unfinished.len() as i64, N - skipped);
    assert_eq!(unfinished[0], day(N - 1));
    assert_eq!(*unfinished.last().unwrap(), day(0));
    assert!(
        unfinished.windows(2).all(|w| w[0].start > w[1].start),
        "in plan order"
    );
    assert_eq!(r.figures().unwrap().leases, N - skipped);
    let c = &r.backfill_summary(1).unwrap().unwrap().intervals;
    assert_eq!((c.total, c.planned, c.skipped), (N, N - skipped, skipped));
    assert_eq!(c.span, Some((start(0), start(N - 1))));
    let outcomes = r.plan_outcomes(1).unwrap();
    assert_eq!(outcomes.len() as i64, N);
    assert!(
        outcomes.windows(2).all(|w| w[0].start < w[1].start),
        "by start"
    );
}

/// A readiness answer is one row per backfill, interval and task, written again at each ask;
/// `not ready` skips the interval in its plan (and releases its lease) in the same
/// transaction; `show` reads the answers, and the wait of an interval still awaited.
pub fn readiness_answers_are_kept_and_not_ready_skips_the_interval(m: &Engine) {
    use backfill::manifest::readiness::Asked;
    use backfill::state::ReadyState;
    let ctx = alive();
    let a = planned(m, request("d"), 3, &ctx);
    let ask = move |d: i64, state: ReadyState, asks: u32, answer: &str, waited_ms: i64| {
        let asked = Asked {
            dag_id: "d".into(),
            interval: day(d),
            task_id: "t".into(),
            state,
            asks,
            answer: Some(answer.to_string()),
            waited_ms,
            wait_ms: 600_000,
        };
        m.ok(move |s| s.note_readiness(s.fence(a)?, &asked))
    };
    assert!(ask(1, ReadyState::Waiting, 1, "0", 0));
    assert!(ask(1, ReadyState::Waiting, 2, "0", 300_000));
    assert!(ask(2, ReadyState::Waiting, 1, "no file", 0));
    assert!(ask(2, ReadyState::NotReady, 3, "still no file", 600_000));
    // Given up on: a later answer (another process's) changes nothing.
    assert!(!ask(2, ReadyState::Ready, 4, "1", 600_000));
    // Started (by another process of the backfill, say): not ready is not recorded, and the
    // interval stays as it is.
    let _run = start_run(m, a, "d", 0, "t");
    assert!(!ask(0, ReadyState::NotReady, 1, "0", 600_000));
    let shown = m
        .read()
        .show_backfill(a.backfill_id)
        .unwrap()
        .expect("backfill");
    let d = &shown.interval_details;
    assert!(d[0].ready.is_empty());
    assert_eq!(d[0].action, backfill::state::PlanAction::Run);
    let one = &d[1].ready[0];
    assert_eq!(
        (one.state, one.asks, one.answer.as_deref(), one.waited_ms),
        (ReadyState::Waiting, 2, Some("0"), 300_000)
    );
    // Its deadline is 10 minutes after its first ask: 5 minutes are left.
    let left = one.left_ms.expect("still awaited");
    assert!((295_000..=300_000).contains(&left), "{left}");
    assert_eq!(
        d[1].state,
        Some(backfill::state::IntervalState::WaitingForSources(left))
    );
    let two = &d[2];
    assert_eq!(
        (two.action, two.reason.as_deref()),
        (backfill::state::PlanAction::Skip, Some("not ready"))
    );
    assert_eq!(
        two.error.as_deref(),
        Some("task `t` not ready after 3 asks over 10m: still no file")
    );
    assert_eq!(two.ready[0].left_ms, None);
    assert_eq!(shown.backfill.intervals.skipped, 1);
    assert_eq!(two.ready[0].state, ReadyState::NotReady);
}
