//! The writer's transactions, as every role's writes rely on them: a job's checks see what
//! was written before it in the same transaction, a failing job leaves no trace, and the
//! writers of several processes take turns, so that a claim is made once.

use backfill::manifest::backfills::Owner;
use backfill::manifest::runs::Start;
use backfill::manifest::writer::Writer;
use backfill::manifest::{Durability, Error};
use backfill::state::BackfillState;

use crate::support::*;

/// A fence checked earlier in a transaction does not outlive a takeover, or a worker's removal,
/// made later in the same transaction: the old owner is refused at once.
pub fn a_fence_is_checked_again_after_a_takeover_in_the_same_transaction(m: &Engine) {
    let old = planned(m, request("d"), 1, &dead());
    let c = dead();
    let worker = m.ok(move |s| s.join_backfill(1, 1, &c));
    let judge = other();
    let (fenced_after, worker_after) = m.ok(move |s| {
        s.fence(old)?;
        s.fence(worker)?;
        s.heartbeat(old, backfill::clock::now_ms())?;
        let taken = s.take_ownership(1, &judge, true)?;
        assert_eq!(taken, Some(Owner::of(1, 1)));
        let gone = s.take_gone_workers(1, &judge)?;
        assert_eq!(gone.len(), 1);
        Ok((
            s.fence(old).map(|_| ()).map_err(|e| e.is_fenced()),
            s.fence(worker).map(|_| ()).map_err(|e| e.is_fenced()),
        ))
    });
    assert_eq!(
        fenced_after,
        Err(true),
        "the old owner, in the takeover's transaction"
    );
    assert_eq!(
        worker_after,
        Err(true),
        "the gone worker, in the same transaction"
    );
    assert_eq!(m.read().backfill(1).unwrap().unwrap().epoch, 1);
}

/// Jobs queued together commit together, but a job that fails leaves nothing of what it wrote
/// and the others commit as if it had not run.
pub fn a_failing_job_rolls_back_alone(m: &Engine) {
    let owner = insert(m, request("d"), &alive());
    let stranger = Owner::of(1, 7);
    let w = m.writer();
    let first = w.submit(move |s| s.record_definition(owner, r#"{"v": "first"}"#));
    let failing = w.submit(move |s| {
        s.mark_planned(owner)?;
        s.record_definition(owner, r#"{"v": "failing"}"#)?;
        s.fence(stranger).map(|_| ())
    });
    let third = w.submit(move |s| s.heartbeat(owner, backfill::clock::now_ms()));
    assert!(first.blocking_recv().unwrap().is_ok());
    match failing.blocking_recv().unwrap() {
        Err(Error::Fenced { backfill_id: 1 }) => {}
        other => panic!("expected the job to be fenced out, got {other:?}"),
    }
    assert!(third.blocking_recv().unwrap().is_ok());
    let b = m.read().backfill(1).unwrap().unwrap();
    assert_eq!(b.definition.as_deref(), Some(r#"{"v": "first"}"#));
    assert!(b.planning, "the failed job's write is undone");
    assert_eq!(b.state, BackfillState::Running);
}

/// Several processes (each its own writer, as separate programs have) that start the same
/// intervals at once: each interval's run is started by exactly one of them; the others are
/// told it is not theirs.
pub fn an_interval_is_claimed_once_when_processes_race(m: &Engine) {
    const DAYS: i64 = 8;
    let many = backfill::manifest::NewBackfill {
        max_active_runs: 100,
        ..request("d")
    };
    let owner = planned(m, many, DAYS, &alive());
    let c = other();
    let worker = m.ok(move |s| s.join_backfill(1, 8, &c));
    let processes: Vec<(Writer, Owner)> = [owner, worker, owner, worker]
        .into_iter()
        .map(|who| (Writer::open(&m.location, Durability::Normal).unwrap(), who))
        .collect();
    let results: Vec<Vec<Start>> = std::thread::scope(|scope| {
        let handles: Vec<_> = processes
            .iter()
            .map(|(writer, who)| {
                let (writer, who) = (writer.clone(), *who);
                scope.spawn(move || {
                    (0..DAYS)
                        .map(|d| {
                            writer
                                .call_blocking(move |s| {
                                    let f = s.fence(who)?;
                                    let step = s.start_run_and_try(
                                        f,
                                        "d",
                                        day(d),
                                        backfill::clock::now_ms(),
                                        TIMEOUT_MS,
                                        "t",
                                        1,
                                        LOG,
                                        None,
                                    )?;
                                    Ok(step.now(s)?.0)
                                })
                                .unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (writer, _) in processes {
        writer.close();
    }
    for d in 0..DAYS as usize {
        let outcomes: Vec<Start> = results.iter().map(|r| r[d]).collect();
        let started = outcomes
            .iter()
            .filter(|s| matches!(s, Start::Run(_)))
            .count();
        let lost = outcomes.iter().filter(|s| **s == Start::Lost).count();
        assert_eq!((started, lost), (1, 3), "day {d}: {outcomes:?}");
    }
    assert_eq!(m.int("SELECT COUNT(*) FROM runs"), DAYS);
    assert_eq!(
        m.int("SELECT COUNT(DISTINCT interval_start) FROM runs"),
        DAYS
    );
    assert_eq!(m.int("SELECT COUNT(*) FROM task_tries"), DAYS);
}
